/* Allocator history and traces: a ring of events per device, the snapshot
 * JSON that memviz reads, and the allocator-independent trace for replay. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../base/checked.h"
#include "pool.h"

atomic_int ndm__instrumented; /* bit 0: history, bit 1: trace */

enum { INSTR_HISTORY = 1, INSTR_TRACE = 2 };

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- the ring ---------------------------------------------------------------- */

typedef struct hev {
    uint8_t action;
    uintptr_t addr;
    size_t size;
    int64_t time_us;
    ndm__rstr *path;
    const char *file, *func;
    int line;
} hev;

struct ndm__history {
    hev *ring;
    size_t cap, n, next;
    int64_t last_us;
};

static atomic_size_t history_max;

bool ndm__hist_recording(void)
{
    return atomic_load_explicit(&ndm__instrumented, memory_order_relaxed) & INSTR_HISTORY;
}

void ndm__hist_set(bool on, size_t max_entries)
{
    atomic_store(&history_max, on ? max_entries : 0);
    if (on)
        atomic_fetch_or(&ndm__instrumented, INSTR_HISTORY);
    else
        atomic_fetch_and(&ndm__instrumented, ~INSTR_HISTORY);
}

size_t ndm__hist_max(void) { return atomic_load(&history_max); }

void ndm__hist_free(struct ndm__history *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n; i++)
        ndm__rstr_unref(h->ring[i].path);
    free(h->ring);
    free(h);
}

void ndm__hist_drop(ndm__pool *p)
{
    ndm__hist_free(p->hist);
    p->hist = NULL;
}

bool ndm__hist_bytes(size_t max_entries, size_t *bytes)
{
    return !ndm__ckd_mul_size(bytes, max_entries, sizeof(hev)) &&
           !ndm__ckd_add_size(bytes, *bytes, sizeof(struct ndm__history));
}

struct ndm__history *ndm__hist_new(size_t max_entries)
{
    size_t ring_bytes;
    if (!max_entries || ndm__ckd_mul_size(&ring_bytes, max_entries, sizeof(hev)))
        return NULL;
    struct ndm__history *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->ring = malloc(ring_bytes);
    if (!h->ring) {
        free(h);
        return NULL;
    }
    h->cap = max_entries;
    return h;
}

void ndm__hist_install(ndm__pool *p, struct ndm__history *h)
{
    ndm__hist_drop(p);
    p->hist = h;
    /* Every event must pass the shared path while recording. */
    ndm__pool_refresh(p);
}

void ndm__hist_enable(ndm__pool *p, size_t max_entries)
{
    ndm__hist_install(p, max_entries ? ndm__hist_new(max_entries) : NULL);
}

void ndm__hist_record(ndm__pool *p, int action, uintptr_t addr, size_t size, ndm__rstr *path,
                      const char *file, const char *func, int line)
{
    struct ndm__history *h = p->hist;
    if (!h)
        return;
    hev *e;
    if (h->n < h->cap) {
        e = &h->ring[h->n++];
    } else {
        e = &h->ring[h->next];
        h->next = (h->next + 1) % h->cap;
        ndm__rstr_unref(e->path);
    }
    /* Times increase even if the clock stalls between two events. */
    int64_t t = now_us();
    if (t <= h->last_us)
        t = h->last_us + 1;
    h->last_us = t;
    *e = (hev){(uint8_t)action, addr, size, t, path ? ndm__rstr_ref(path) : NULL, file, func, line};
}

/* ---- JSON ------------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_frames(FILE *f, const char *file, const char *func, int line)
{
    if (!file) {
        fputs("[]", f);
        return;
    }
    fputs("[{\"filename\": ", f);
    json_str(f, file);
    fprintf(f, ", \"line\": %d, \"name\": ", line);
    json_str(f, func ? func : "");
    fputs("}]", f);
}

static const char *action_name(int a)
{
    static const char *const names[] = {"alloc",         "free_requested", "free_completed",
                                        "segment_alloc", "segment_free",   "segment_map",
                                        "segment_unmap", "oom",            "snapshot"};
    return a >= 0 && a < (int)(sizeof names / sizeof *names) ? names[a] : "unknown";
}

static void hist_json(ndm__pool *p, FILE *f)
{
    struct ndm__history *h = p->hist;
    fputc('[', f);
    if (h) {
        size_t start = h->n < h->cap ? 0 : h->next;
        for (size_t k = 0; k < h->n; k++) {
            const hev *e = &h->ring[(start + k) % h->cap];
            fprintf(f, "%s\n    {\"action\": \"%s\", \"addr\": %" PRIuPTR ", \"size\": %zu, "
                       "\"stream\": 0, \"time_us\": %" PRId64 ", \"manager\": ",
                    k ? "," : "", action_name(e->action), e->addr, e->size, e->time_us);
            json_str(f, e->path ? e->path->s : "");
            fputs(", \"frames\": ", f);
            json_frames(f, e->file, e->func, e->line);
            fputc('}', f);
        }
    }
    fputs("\n  ]", f);
}

/* Paths of manager slots met in one snapshot, described once each. */
typedef struct path_cache {
    uint32_t *slot;
    ndm__rstr **path;
    size_t n, cap;
} path_cache;

static const char *path_for(path_cache *pc, uint32_t slot)
{
    if (!slot)
        return "";
    for (size_t i = 0; i < pc->n; i++)
        if (pc->slot[i] == slot)
            return pc->path[i] ? pc->path[i]->s : "";
    if (pc->n == pc->cap) {
        size_t cap = pc->cap ? 2 * pc->cap : 32;
        uint32_t *s = realloc(pc->slot, cap * sizeof *s);
        if (!s)
            return "";
        pc->slot = s;
        ndm__rstr **r = realloc(pc->path, cap * sizeof *r);
        if (!r)
            return "";
        pc->path = r;
        pc->cap = cap;
    }
    ndm__rstr *r = ndm__describe_manager(slot);
    pc->slot[pc->n] = slot;
    pc->path[pc->n] = r;
    pc->n++;
    return r ? r->s : "";
}

static void segments_json(ndm__pool *p, const ndm__snapshot *s, FILE *f, bool *first,
                          path_cache *pc)
{
    static const char *const states[] = {"inactive", "active_allocated", "inactive"};
    for (size_t i = 0; i < s->nsegs; i++) {
        const ndm__snap_seg *g = &s->segs[i];
        size_t allocated = 0, requested = 0;
        for (size_t k = 0; k < g->count; k++) {
            const ndm__snap_block *b = &s->blocks[g->first + k];
            if (b->state == NDM__B_ALLOCATED) {
                allocated += b->size;
                requested += b->requested;
            }
        }
        fprintf(f, "%s\n    {\"device\": ", *first ? "" : ",");
        *first = false;
        json_str(f, p->name);
        fprintf(f,
                ", \"address\": %" PRIuPTR ", \"total_size\": %zu, \"allocated_size\": %zu, "
                "\"active_size\": %zu, \"requested_size\": %zu, \"stream\": 0, "
                "\"segment_type\": \"%s\", \"segment_pool_id\": [0, 0], \"is_expandable\": false, "
                "\"frames\": [], \"blocks\": [",
                g->addr, g->size, allocated, allocated, requested,
                g->pool == NDM__POOL_SMALL ? "small" : "large");
        for (size_t k = 0; k < g->count; k++) {
            const ndm__snap_block *b = &s->blocks[g->first + k];
            fprintf(f, "%s\n      {\"address\": %" PRIuPTR ", \"size\": %zu, "
                       "\"requested_size\": %zu, \"state\": \"%s\", \"manager\": ",
                    k ? "," : "", b->addr, b->size, b->requested, states[b->state]);
            /* The owner now (arrays move between managers), else the one
             * that made it. */
            json_str(f, b->state != NDM__B_ALLOCATED ? ""
                        : b->mgr                   ? path_for(pc, b->mgr)
                        : b->path                  ? b->path->s
                                                   : "");
            fputs(", \"frames\": ", f);
            json_frames(f, b->file, b->func, b->line);
            fputc('}', f);
        }
        fputs("]}", f);
    }
}

ndm_status ndm__snapshot_write(FILE *f, ndm__pool **pools, int n)
{
    ndm__snapshot *snaps = calloc((size_t)(n ? n : 1), sizeof *snaps);
    if (!snaps)
        return NDM_E_OOM;
    ndm_status st = NDM_OK;
    for (int i = 0; i < n && st == NDM_OK; i++)
        st = ndm__pool_snapshot(pools[i], &snaps[i]);
    if (st == NDM_OK) {
        path_cache pc = {0};
        fputs("{\n  \"devices\": [", f);
        for (int i = 0; i < n; i++) {
            fputs(i ? ", " : "", f);
            json_str(f, pools[i]->name);
        }
        fputs("],\n  \"segments\": [", f);
        bool first = true;
        for (int i = 0; i < n; i++)
            segments_json(pools[i], &snaps[i], f, &first, &pc);
        fputs("\n  ],\n  \"device_traces\": [", f);
        for (int i = 0; i < n; i++) {
            fputs(i ? ",\n  " : "\n  ", f);
            ndm__pool_lock(pools[i]);
            hist_json(pools[i], f);
            ndm__pool_unlock(pools[i]);
        }
        fputs("\n  ],\n  \"allocator_settings\": {", f);
        for (int i = 0; i < n; i++) {
            ndm__settings s;
            char conf[512];
            ndm__pool_settings(pools[i], &s, conf, sizeof conf);
            if (i == 0) {
                ndm__settings_json(&s, f);
                fputs(", \"conf\": ", f);
                json_str(f, conf);
                fputs(", \"by_device\": {", f);
            }
            fputs(i ? ", " : "", f);
            json_str(f, pools[i]->name);
            fputs(": {", f);
            ndm__settings_json(&s, f);
            fputs(", \"conf\": ", f);
            json_str(f, conf);
            fputc('}', f);
        }
        if (n)
            fputc('}', f);
        fputs("}\n}\n", f);
        for (size_t i = 0; i < pc.n; i++)
            ndm__rstr_unref(pc.path[i]);
        free(pc.slot);
        free(pc.path);
    }
    for (int i = 0; i < n; i++)
        ndm__snapshot_free(&snaps[i]);
    free(snaps);
    return st;
}

/* ---- the replay trace ---------------------------------------------------------------- */

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_f;
static uint64_t trace_seq;
static uint64_t trace_ids; /* never reset: a free names an id of its own session */
static int64_t trace_t0;
static atomic_int trace_threads;
static _Thread_local int trace_tid;

ndm_status ndm__trace_start(const char *path, char *err, size_t n)
{
    FILE *f = NULL;
    if (path) {
        f = fopen(path, "w");
        if (!f) {
            snprintf(err, n, "cannot open '%s' for writing", path);
            return NDM_E_IO;
        }
        fputs("# ndm allocator trace v1\n# seq t_us thread device op id size\n", f);
    }
    pthread_mutex_lock(&trace_lock);
    FILE *old = trace_f;
    trace_f = f;
    trace_seq = 0;
    trace_t0 = now_us();
    if (f)
        atomic_fetch_or(&ndm__instrumented, INSTR_TRACE);
    else
        atomic_fetch_and(&ndm__instrumented, ~INSTR_TRACE);
    pthread_mutex_unlock(&trace_lock);
    if (old && fclose(old) != 0) {
        snprintf(err, n, "writing the trace failed");
        return NDM_E_IO;
    }
    return NDM_OK;
}

static void trace_line(ndm__pool *p, char op, uint64_t id, size_t size)
{
    if (!trace_tid)
        trace_tid = atomic_fetch_add(&trace_threads, 1) + 1;
    fprintf(trace_f, "%" PRIu64 " %" PRId64 " %d %s %c %" PRIu64 " %zu\n", ++trace_seq,
            now_us() - trace_t0, trace_tid, p->name, op, id, size);
}

void ndm__trace_alloc_record(ndm__pool *p, ndm__ablk *b, size_t nbytes)
{
    pthread_mutex_lock(&trace_lock);
    if (trace_f) {
        b->trace_id = ++trace_ids;
        trace_line(p, 'a', b->trace_id, nbytes);
    }
    pthread_mutex_unlock(&trace_lock);
}

void ndm__trace_free_record(ndm__pool *p, ndm__ablk *b)
{
    pthread_mutex_lock(&trace_lock);
    if (trace_f)
        trace_line(p, 'f', b->trace_id, b->requested);
    pthread_mutex_unlock(&trace_lock);
    b->trace_id = 0;
}
