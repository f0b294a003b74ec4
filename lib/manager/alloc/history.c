/* Allocator history and traces: a ring of events per device, the call frames
 * they carry, the snapshot (PyTorch's pickle or JSON) and the replay trace. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../base/checked.h"
#include "../../base/text.h"
#include "pool.h"

atomic_int ndm__instrumented; /* bit 0: history, bit 1: trace */

enum { INSTR_HISTORY = 1, INSTR_TRACE = 2 };

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Microseconds to add to now_us() for Unix time, as snapshots write it. */
static int64_t epoch_offset_us(void)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    return (int64_t)rt.tv_sec * 1000000 + rt.tv_nsec / 1000 - now_us();
}

/* ---- call frames ----------------------------------------------------------------- */

/* Deep enough for a user's call into nested modules (two frames a level:
 * ndm_forward and the module's name), its backward and an optimizer step;
 * deeper frames are counted, not kept. The first INLINE_FRAMES live in the
 * thread's static TLS, which a library loaded with dlopen (Python's ctypes)
 * must keep small; a deeper stack moves, once per thread, to the heap (and
 * is freed when the thread exits). */
enum { INLINE_FRAMES = 8, MAX_CALL_FRAMES = 32 };

static _Thread_local ndm__call_frame call_frames[INLINE_FRAMES];
static _Thread_local ndm__call_frame *deep_frames; /* MAX_CALL_FRAMES, or NULL */
static _Thread_local int call_depth;
static pthread_key_t deep_key;
static pthread_once_t deep_once = PTHREAD_ONCE_INIT;
static bool deep_key_ok;

static void deep_free(void *p) { free(p); }
static void deep_key_make(void) { deep_key_ok = pthread_key_create(&deep_key, deep_free) == 0; }

/* The thread's stack and how many frames it holds. */
static ndm__call_frame *frames_of(int *cap)
{
    *cap = deep_frames ? MAX_CALL_FRAMES : INLINE_FRAMES;
    return deep_frames ? deep_frames : call_frames;
}

/* Move the stack to the heap (history is on and the stack is deep: rare).
 * With no memory it stays inline, and deeper frames are counted only. */
static void grow_frames(void)
{
    pthread_once(&deep_once, deep_key_make);
    ndm__call_frame *d = deep_key_ok ? malloc(MAX_CALL_FRAMES * sizeof *d) : NULL;
    if (!d)
        return;
    if (pthread_setspecific(deep_key, d) != 0) {
        free(d);
        return;
    }
    memcpy(d, call_frames, sizeof call_frames);
    deep_frames = d;
}

int ndm__frame_push_slow(const ndm__call_frame *f)
{
    int cap;
    if (call_depth == INLINE_FRAMES && !deep_frames)
        grow_frames();
    ndm__call_frame *st = frames_of(&cap);
    if (call_depth < cap)
        st[call_depth] = *f;
    call_depth++;
    return 1;
}

void ndm__frame_pop_slow(void)
{
    if (call_depth > 0)
        call_depth--;
}

int ndm__frames_current(const ndm__call_frame **out)
{
    int cap;
    *out = frames_of(&cap);
    return call_depth < cap ? call_depth : cap;
}

static bool same_site(const char *f1, int l1, const char *f2, int l2)
{
    return l1 == l2 && f1 && f2 && (f1 == f2 || !strcmp(f1, f2));
}

ndm__rstr *ndm__hist_context(uint32_t manager, const ndm__alloc_tag *tag)
{
    const ndm__call_frame *cf;
    int nc = ndm__frames_current(&cf);
    ndm__frame fr[2 * MAX_CALL_FRAMES + 2];
    unsigned n = 0;
    /* Innermost first, PyTorch's order. Each frame is a function and the
     * line running in it: the public function that allocated (its own lines
     * are not tracked: "??", as PyTorch writes an unknown file), then each
     * enclosing public function at the place in the library it runs, then
     * the user's function at the line that called into ndm. An inner call
     * that was given the same site as its enclosing frame ran inside that
     * frame's body; one given another site came from user code called back
     * from inside it (a callback), which gets its own frame. */
    const char *file = tag->file, *func = tag->func;
    int line = tag->line;
    if (tag->api)
        fr[n++] = (ndm__frame){tag->api, "?\?", 0};
    for (int k = nc - 1; k >= 0; k--) {
        const ndm__call_frame *e = &cf[k];
        if (file && !same_site(file, line, e->file, e->line))
            fr[n++] = (ndm__frame){func ? func : "", file, line};
        fr[n++] = (ndm__frame){e->api, e->body_file, e->body_line};
        file = e->file;
        func = e->func;
        line = e->line;
    }
    if (file)
        fr[n++] = (ndm__frame){func ? func : "", file, line};

    ndm__rstr *path = manager ? ndm__describe_manager(manager) : NULL;
    const char *ps = path ? path->s : "";
    size_t len = strlen(ps);
    size_t at = sizeof(ndm__rstr) + len + 1;
    at = (at + alignof(ndm__frame) - 1) / alignof(ndm__frame) * alignof(ndm__frame);
    ndm__rstr *r = malloc(at + n * sizeof(ndm__frame));
    if (r) {
        atomic_init(&r->refs, 1);
        memcpy(r->s, ps, len + 1);
        ndm__frame *dst = (ndm__frame *)((char *)r + at);
        memcpy(dst, fr, n * sizeof *fr);
        r->frames = dst;
        r->nframes = n;
    }
    ndm__rstr_unref(path);
    return r;
}

/* ---- the ring ---------------------------------------------------------------- */

typedef ndm__hist_entry hev;

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
        ndm__rstr_unref(h->ring[i].ctx);
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

void ndm__hist_record(ndm__pool *p, int action, uintptr_t addr, size_t size, ndm__rstr *ctx)
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
        ndm__rstr_unref(e->ctx);
    }
    /* Times increase even if the clock stalls between two events. */
    int64_t t = now_us();
    if (t <= h->last_us)
        t = h->last_us + 1;
    h->last_us = t;
    *e = (hev){(uint8_t)action, addr, size, t, ctx ? ndm__rstr_ref(ctx) : NULL};
}

ndm_status ndm__hist_copy(ndm__pool *p, ndm__hist_entry **out, size_t *n)
{
    struct ndm__history *h = p->hist;
    *out = NULL;
    *n = 0;
    if (!h || !h->n)
        return NDM_OK;
    hev *c = malloc(h->n * sizeof *c);
    if (!c)
        return NDM_E_OOM;
    size_t start = h->n < h->cap ? 0 : h->next;
    for (size_t k = 0; k < h->n; k++) {
        c[k] = h->ring[(start + k) % h->cap];
        if (c[k].ctx)
            ndm__rstr_ref(c[k].ctx);
    }
    *out = c;
    *n = h->n;
    return NDM_OK;
}

void ndm__hist_copy_free(ndm__hist_entry *e, size_t n)
{
    for (size_t i = 0; e && i < n; i++)
        ndm__rstr_unref(e[i].ctx);
    free(e);
}

/* ---- one writer, two encodings ------------------------------------------------------
 * The snapshot is written once as a tree of dicts, lists and scalars; the
 * emitter encodes it as JSON or as a pickle of protocol 2 restricted to the
 * opcodes PyTorch's web viewer decodes (its own unpickler): PROTO,
 * EMPTY_DICT/EMPTY_LIST with MARK and SETITEMS/APPENDS (in batches of 1000,
 * as Python writes them, so no reader meets one huge batch), BININT1, BININT,
 * LONG1, BINFLOAT, SHORT_BINUNICODE/BINUNICODE, NONE, NEWTRUE/NEWFALSE, STOP.
 * No memo: no value is shared. */

/* EM_DEPTH: more levels than the writers below ever nest (a fixed shape) */
enum { EM_DEPTH = 16, EM_BATCH = 1000 };

typedef struct emitter {
    FILE *f;
    bool pickle;
    int depth;
    size_t count[EM_DEPTH]; /* items (a key and its value: two) at each level */
    bool dict[EM_DEPTH];
    const char *cwd;        /* stripped from absolute file names */
    size_t cwd_len;
} emitter;

static void put_u32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

/* Before a value or key at the current level: JSON separators, pickle
 * batches. */
static void em_item(emitter *em)
{
    if (em->depth == 0)
        return;
    int d = em->depth - 1;
    size_t c = em->count[d]++;
    if (em->pickle) {
        /* Close a full batch: a dict's batch is EM_BATCH pairs. */
        size_t per = em->dict[d] ? 2 * EM_BATCH : EM_BATCH;
        if (c && c % per == 0) {
            fputc(em->dict[d] ? 'u' : 'e', em->f);
            fputc('(', em->f);
        }
        return;
    }
    /* One event or block a line; the top level's keys on lines of their own. */
    if (em->dict[d]) {
        if (c % 2)
            fputs(": ", em->f);
        else if (d == 0)
            fputs(c ? ",\n" : "\n", em->f);
        else if (c)
            fputs(", ", em->f);
    } else if (c) {
        fputs(d <= 2 ? ",\n" : ", ", em->f);
    }
}

static void em_open(emitter *em, bool dict)
{
    em_item(em);
    if (em->pickle) {
        fputc(dict ? '}' : ']', em->f);
        fputc('(', em->f);
    } else {
        fputc(dict ? '{' : '[', em->f);
    }
    em->dict[em->depth] = dict;
    em->count[em->depth] = 0;
    em->depth++;
}

static void em_close(emitter *em)
{
    em->depth--;
    bool dict = em->dict[em->depth];
    if (em->pickle)
        fputc(dict ? 'u' : 'e', em->f);
    else
        fputs(dict ? (em->depth == 0 ? "\n}" : "}") : "]", em->f);
}

static void em_str(emitter *em, const char *s)
{
    em_item(em);
    char buf[1024];
    /* pickle readers reject text that is not UTF-8: invalid bytes become U+FFFD */
    size_t n = ndm__utf8_clean(s ? s : "", buf, sizeof buf);
    if (em->pickle) {
        if (n < 256) {
            fputc(0x8c, em->f); /* SHORT_BINUNICODE */
            fputc((int)n, em->f);
        } else {
            fputc('X', em->f); /* BINUNICODE */
            put_u32(em->f, (uint32_t)n);
        }
        fwrite(buf, 1, n, em->f);
        return;
    }
    ndm__json_write_str(em->f, buf);
}

static void em_int(emitter *em, int64_t v)
{
    em_item(em);
    if (!em->pickle) {
        fprintf(em->f, "%" PRId64, v);
        return;
    }
    if (v >= 0 && v < 256) {
        fputc('K', em->f); /* BININT1 */
        fputc((int)v, em->f);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        fputc('J', em->f); /* BININT */
        put_u32(em->f, (uint32_t)(int32_t)v);
    } else {
        /* LONG1: little-endian two's complement, as few bytes as keep the sign. */
        unsigned char b[8];
        uint64_t u = (uint64_t)v;
        int n = 8;
        for (int i = 0; i < 8; i++)
            b[i] = (unsigned char)(u >> (8 * i));
        while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) ||
                         (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
            n--;
        fputc(0x8a, em->f);
        fputc(n, em->f);
        fwrite(b, 1, (size_t)n, em->f);
    }
}

static void em_uint(emitter *em, uint64_t v)
{
    /* Addresses and sizes stay below 2^63 on every platform ndm runs on. */
    em_int(em, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

static void em_float(emitter *em, double v)
{
    em_item(em);
    if (!em->pickle) {
        /* Always a number with a point, so readers see a float. */
        char buf[40];
        snprintf(buf, sizeof buf, "%.17g", v);
        fprintf(em->f, "%s%s", buf, strpbrk(buf, ".en") ? "" : ".0");
        return;
    }
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    fputc('G', em->f); /* BINFLOAT, big-endian */
    for (int i = 7; i >= 0; i--)
        fputc((int)(unsigned char)(u >> (8 * i)), em->f);
}

static void em_bool(emitter *em, bool v)
{
    em_item(em);
    if (em->pickle)
        fputc(v ? 0x88 : 0x89, em->f);
    else
        fputs(v ? "true" : "false", em->f);
}

static void em_key(emitter *em, const char *k) { em_str(em, k); }

/* A file name relative to the source root: the compiler's "../lib/x.c"
 * (a build directory inside the tree) and absolute names under the working
 * directory lose their prefix. */
static const char *rel_file(const emitter *em, const char *f)
{
    if (!f)
        return "";
    if (em->cwd_len && !strncmp(f, em->cwd, em->cwd_len) && f[em->cwd_len] == '/')
        return f + em->cwd_len + 1;
    for (;;) {
        if (!strncmp(f, "./", 2))
            f += 2;
        else if (!strncmp(f, "../", 3))
            f += 3;
        else
            return f;
    }
}

/* A public function by the name users call: "ndm_ones", not its "_at" form. */
static void em_api_name(emitter *em, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    char buf[128];
    if (n > 3 && n < sizeof buf && !strncmp(name, "ndm_", 4) && !strcmp(name + n - 3, "_at")) {
        memcpy(buf, name, n - 3);
        buf[n - 3] = '\0';
        name = buf;
    }
    em_str(em, name);
}

static void em_frames(emitter *em, const ndm__rstr *ctx, const char *file, const char *func,
                      int line)
{
    em_open(em, false);
    if (ctx && ctx->nframes) {
        for (unsigned i = 0; i < ctx->nframes; i++) {
            const ndm__frame *fr = &ctx->frames[i];
            em_open(em, true);
            em_key(em, "filename");
            em_str(em, rel_file(em, fr->file));
            em_key(em, "line");
            em_int(em, fr->line);
            em_key(em, "name");
            em_api_name(em, fr->name);
            em_close(em);
        }
    } else if (file) {
        /* Recorded before history: the creation site is all there is. */
        em_open(em, true);
        em_key(em, "filename");
        em_str(em, rel_file(em, file));
        em_key(em, "line");
        em_int(em, line);
        em_key(em, "name");
        em_str(em, func ? func : "");
        em_close(em);
    }
    em_close(em);
}

/* The top-level manager of a path ("system/model/trainer" -> "model"):
 * PyTorch's viewer colours the timeline by this category. */
static void em_category(emitter *em, const char *path)
{
    const char *s = path && !strncmp(path, "system/", 7) ? path + 7 : NULL;
    if (!s || !*s) {
        em_str(em, "unknown");
        return;
    }
    char buf[128];
    size_t n = strcspn(s, "/");
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    em_str(em, buf);
}

static const char *action_name(int a)
{
    static const char *const names[] = {"alloc",         "free_requested", "free_completed",
                                        "segment_alloc", "segment_free",   "segment_map",
                                        "segment_unmap", "oom",            "snapshot"};
    return a >= 0 && a < (int)(sizeof names / sizeof *names) ? names[a] : "unknown";
}

static void em_trace(emitter *em, const ndm__snapshot *s, int64_t epoch)
{
    em_open(em, false);
    for (size_t k = 0; k < s->ntrace; k++) {
        const hev *e = &s->trace[k];
        const char *path = e->ctx ? e->ctx->s : "";
        em_open(em, true);
        em_key(em, "action");
        em_str(em, action_name(e->action));
        /* PyTorch writes an out-of-memory entry's free device bytes in
         * place of the address. */
        em_key(em, e->action == NDM__EV_OOM ? "device_free" : "addr");
        em_uint(em, e->addr);
        em_key(em, "size");
        em_uint(em, e->size);
        em_key(em, "stream");
        em_int(em, 0);
        em_key(em, "time_us");
        em_int(em, e->time_us + epoch);
        em_key(em, "frames");
        em_frames(em, e->ctx, NULL, NULL, 0);
        em_key(em, "user_metadata");
        em_str(em, path);
        em_key(em, "category");
        em_category(em, path);
        em_key(em, "manager");
        em_str(em, path);
        em_close(em);
    }
    em_close(em);
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

static void em_segments(emitter *em, int device, const char *name, const ndm__snapshot *s,
                        path_cache *pc)
{
    static const char *const states[] = {"inactive", "active_allocated", "inactive",
                                         "active_pending_free"};
    for (size_t i = 0; i < s->nsegs; i++) {
        const ndm__snap_seg *g = &s->segs[i];
        size_t allocated = 0, requested = 0, active = 0;
        for (size_t k = 0; k < g->count; k++) {
            const ndm__snap_block *b = &s->blocks[g->first + k];
            if (b->state == NDM__B_ALLOCATED) {
                allocated += b->size;
                requested += b->requested;
            }
            if (b->state == NDM__B_ALLOCATED || b->state == NDM__B_PENDING)
                active += b->size;
        }
        em_open(em, true);
        em_key(em, "device");
        em_int(em, device);
        em_key(em, "device_name");
        em_str(em, name);
        em_key(em, "address");
        em_uint(em, g->addr);
        em_key(em, "total_size");
        em_uint(em, g->size);
        em_key(em, "allocated_size");
        em_uint(em, allocated);
        em_key(em, "active_size");
        em_uint(em, active);
        em_key(em, "requested_size");
        em_uint(em, requested);
        em_key(em, "stream");
        em_int(em, 0);
        em_key(em, "segment_type");
        em_str(em, g->pool == NDM__POOL_SMALL ? "small" : "large");
        em_key(em, "segment_pool_id");
        em_open(em, false);
        em_int(em, 0);
        em_int(em, 0);
        em_close(em);
        em_key(em, "is_expandable");
        em_bool(em, g->expandable);
        em_key(em, "frames");
        em_frames(em, NULL, NULL, NULL, 0);
        em_key(em, "blocks");
        em_open(em, false);
        for (size_t k = 0; k < g->count; k++) {
            const ndm__snap_block *b = &s->blocks[g->first + k];
            bool live = b->state == NDM__B_ALLOCATED;
            /* The owner now (arrays move between managers), else the one
             * that made it. */
            const char *path = !live ? "" : b->mgr ? path_for(pc, b->mgr) : b->path ? b->path->s : "";
            em_open(em, true);
            em_key(em, "address");
            em_uint(em, b->addr);
            em_key(em, "size");
            em_uint(em, b->size);
            em_key(em, "requested_size");
            em_uint(em, b->requested);
            em_key(em, "state");
            em_str(em, states[b->state]);
            em_key(em, "frames");
            em_frames(em, b->path, b->file, b->func, b->line);
            em_key(em, "manager");
            em_str(em, path);
            em_key(em, "category");
            if (live)
                em_category(em, path);
            else
                em_str(em, "unknown");
            em_close(em);
        }
        em_close(em);
        em_close(em);
    }
}

static void em_ndm_settings(emitter *em, const ndm__settings *s, const char *conf)
{
    char div[160];
    ndm__divisions_str(s->divisions, div, sizeof div);
    em_open(em, true);
    em_key(em, "strategy");
    em_str(em, s->policy->name);
    em_key(em, "preallocate_fraction");
    em_float(em, s->preallocate_fraction);
    em_key(em, "memory_limit_mb");
    em_uint(em, s->memory_limit / NDM__MB);
    em_key(em, "max_split_size_mb");
    em_int(em, s->max_split_size == SIZE_MAX ? -1 : (int64_t)(s->max_split_size / NDM__MB));
    em_key(em, "max_non_split_rounding_mb");
    em_uint(em, s->max_non_split_rounding / NDM__MB);
    em_key(em, "large_segment_size_mb");
    em_uint(em, s->large_segment_size / NDM__MB);
    em_key(em, "roundup_power2_divisions");
    em_str(em, div);
    em_key(em, "garbage_collection_threshold");
    em_float(em, s->gc_threshold);
    em_key(em, "pressure_every_mb");
    em_uint(em, s->pressure_every / NDM__MB);
    em_key(em, "thread_cache");
    em_bool(em, s->thread_cache);
    em_key(em, "release_free_segments");
    em_bool(em, s->release_free_segments);
    em_key(em, "segment_refit");
    em_bool(em, s->segment_refit);
    em_key(em, "segment_round_kb");
    em_uint(em, s->segment_round >> 10);
    em_key(em, "conf");
    em_str(em, conf);
    em_close(em);
}

/* PyTorch's allocator_settings (the first device's), with ndm's own
 * settings of every device under "ndm". */
static void em_settings(emitter *em, ndm__pool **pools, const ndm__snapshot *snaps, int n)
{
    em_open(em, true);
    if (n) {
        const ndm__settings *s = &snaps[0].set;
        em_key(em, "PYTORCH_CUDA_ALLOC_CONF");
        em_str(em, snaps[0].conf);
        em_key(em, "max_split_size");
        em_int(em, s->max_split_size == SIZE_MAX ? -1 : (int64_t)s->max_split_size);
        em_key(em, "garbage_collection_threshold");
        em_float(em, s->gc_threshold);
        em_key(em, "expandable_segments");
        em_bool(em, false);
        em_key(em, "pinned_num_register_threads");
        em_int(em, 1);
        em_key(em, "release_lock_on_cudamalloc");
        em_bool(em, false);
        em_key(em, "pinned_use_cuda_host_register");
        em_bool(em, false);
        /* PyTorch's dict: the divisions of each power-of-two interval from
         * 1 MiB, keyed "1", "2", "4", ... */
        em_key(em, "roundup_power2_divisions");
        em_open(em, true);
        for (int i = 0; i < NDM__DIV_INTERVALS; i++) {
            char k[24];
            snprintf(k, sizeof k, "%llu", 1ULL << i);
            em_key(em, k);
            em_int(em, s->divisions[i]);
        }
        em_close(em);
    }
    em_key(em, "ndm");
    em_open(em, true);
    for (int i = 0; i < n; i++) {
        em_key(em, pools[i]->name);
        em_ndm_settings(em, &snaps[i].set, snaps[i].conf);
    }
    em_close(em);
    em_close(em);
}

ndm_status ndm__snapshot_write(FILE *f, ndm__pool **pools, int n, bool pickle)
{
    ndm__snapshot *snaps = calloc((size_t)(n ? n : 1), sizeof *snaps);
    if (!snaps)
        return NDM_E_OOM;
    ndm_status st = NDM_OK;
    for (int i = 0; i < n && st == NDM_OK; i++)
        st = ndm__pool_snapshot(pools[i], &snaps[i]);
    if (st == NDM_OK) {
        char cwd[1024];
        emitter em = {.f = f, .pickle = pickle};
        if (getcwd(cwd, sizeof cwd) && strcmp(cwd, "/")) {
            em.cwd = cwd;
            em.cwd_len = strlen(cwd);
        }
        int64_t epoch = epoch_offset_us();
        path_cache pc = {0};
        if (pickle) {
            fputc(0x80, f); /* PROTO 2 */
            fputc(2, f);
        }
        em_open(&em, true);
        em_key(&em, "segments");
        em_open(&em, false);
        for (int i = 0; i < n; i++)
            em_segments(&em, i, pools[i]->name, &snaps[i], &pc);
        em_close(&em);
        em_key(&em, "device_traces");
        em_open(&em, false);
        for (int i = 0; i < n; i++)
            em_trace(&em, &snaps[i], epoch);
        em_close(&em);
        em_key(&em, "allocator_settings");
        em_settings(&em, pools, snaps, n);
        em_key(&em, "external_annotations");
        em_open(&em, false);
        em_close(&em);
        /* ndm's own: the device of each index, as "cpu", "cuda:1". */
        em_key(&em, "devices");
        em_open(&em, false);
        for (int i = 0; i < n; i++)
            em_str(&em, pools[i]->name);
        em_close(&em);
        em_close(&em);
        fputs(pickle ? "." : "\n", f);
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
