/* Allocator trace replay on a simulated device, shared by bench/alloc and
 * bench/alloc_replay: load a trace (text, or gzip when zlib is there), replay
 * it through one configuration, find the smallest limit that completes it. */
#ifndef NDM_BENCH_REPLAY_H
#define NDM_BENCH_REPLAY_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if NDM_BENCH_HAVE_ZLIB
#include <zlib.h>
#endif
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "manager/alloc/pool.h"

typedef struct rp_event {
    uint32_t id;   /* dense index of the allocation */
    uint8_t free;
    uint64_t size; /* requested bytes */
} rp_event;

typedef struct rp_trace {
    rp_event *ev;
    size_t n, cap;
    uint32_t ids;       /* allocations */
    uint64_t peak_live; /* highest sum of live requested bytes: the lower bound */
    char name[128];
} rp_trace;

typedef struct rp_result {
    bool ok;
    uint64_t peak_reserved, peak_allocated, maps, unmaps, retries;
    double p50_ns, p99_ns;
} rp_result;

/* ---- loading ---------------------------------------------------------------- */

typedef struct rp_idmap {
    uint64_t *key;
    uint32_t *val;
    size_t cap, n;
} rp_idmap;

static inline size_t rp_hash(uint64_t k, size_t cap)
{
    return (size_t)(k * 0x9e3779b97f4a7c15ull) & (cap - 1);
}

static inline void rp_idmap_grow(rp_idmap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    uint64_t *key = calloc(cap, sizeof *key);
    uint32_t *val = calloc(cap, sizeof *val);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i])
            continue;
        size_t h = rp_hash(m->key[i], cap);
        while (key[h])
            h = (h + 1) & (cap - 1);
        key[h] = m->key[i];
        val[h] = m->val[i];
    }
    free(m->key);
    free(m->val);
    m->key = key;
    m->val = val;
    m->cap = cap;
}

/* The dense index of trace id k; `insert` adds it. UINT32_MAX: unknown. */
static inline uint32_t rp_idmap_get(rp_idmap *m, uint64_t k, bool insert, uint32_t next)
{
    if (insert && 2 * (m->n + 1) > m->cap)
        rp_idmap_grow(m);
    if (!m->cap)
        return UINT32_MAX;
    size_t h = rp_hash(k, m->cap);
    while (m->key[h] && m->key[h] != k)
        h = (h + 1) & (m->cap - 1);
    if (m->key[h])
        return m->val[h];
    if (!insert)
        return UINT32_MAX;
    m->key[h] = k;
    m->val[h] = next;
    m->n++;
    return next;
}

static inline void rp_push(rp_trace *t, rp_event e)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
    }
    t->ev[t->n++] = e;
}

/* Load a trace written by ndm_memory_record_trace ("seq t_us thread device
 * op id size" lines). Frees of allocations made before the trace started are
 * dropped. Returns 0, or -1 with a message on stderr. */
static inline int rp_load(const char *path, rp_trace *t)
{
    memset(t, 0, sizeof *t);
    const char *base = strrchr(path, '/');
    snprintf(t->name, sizeof t->name, "%.100s", base ? base + 1 : path);
    char *dot = strstr(t->name, ".trace");
    if (dot)
        *dot = '\0';
#if NDM_BENCH_HAVE_ZLIB
    gzFile f = gzopen(path, "rb");
#define RP_GETS(buf, n, f) gzgets(f, buf, n)
#define RP_CLOSE(f) gzclose(f)
#else
    FILE *f = fopen(path, "r");
#define RP_GETS(buf, n, f) fgets(buf, n, f)
#define RP_CLOSE(f) fclose(f)
#endif
    if (!f) {
        fprintf(stderr, "cannot open trace %s\n", path);
        return -1;
    }
    rp_idmap ids = {0};
    uint64_t *sizes = NULL;
    size_t sizes_cap = 0;
    uint64_t live = 0;
    char line[256];
    while (RP_GETS(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        uint64_t seq, id, size;
        int64_t us;
        int thread;
        char dev[32], op;
        if (sscanf(line, "%" SCNu64 " %" SCNd64 " %d %31s %c %" SCNu64 " %" SCNu64, &seq, &us,
                   &thread, dev, &op, &id, &size) != 7 || (op != 'a' && op != 'f')) {
            fprintf(stderr, "%s: malformed line: %s", path, line);
            RP_CLOSE(f);
            return -1;
        }
        if (op == 'a') {
            uint32_t k = rp_idmap_get(&ids, id, true, t->ids);
            if (k != t->ids)
                continue; /* an id allocated twice: keep the first */
            t->ids++;
            if (k >= sizes_cap) {
                sizes_cap = sizes_cap ? 2 * sizes_cap : 4096;
                sizes = realloc(sizes, sizes_cap * sizeof *sizes);
            }
            sizes[k] = size;
            rp_push(t, (rp_event){k, 0, size});
            live += size;
            if (live > t->peak_live)
                t->peak_live = live;
        } else {
            uint32_t k = rp_idmap_get(&ids, id, false, 0);
            if (k == UINT32_MAX)
                continue;
            rp_push(t, (rp_event){k, 1, sizes[k]});
            live -= sizes[k];
        }
    }
    RP_CLOSE(f);
#undef RP_GETS
#undef RP_CLOSE
    free(ids.key);
    free(ids.val);
    free(sizes);
    return 0;
}

/* ---- timing ------------------------------------------------------------------- */

static inline uint64_t rp_ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* Nanoseconds per tick, measured once. */
static inline double rp_ns_per_tick(void)
{
    static double v;
    if (v)
        return v;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t t0 = rp_ticks();
    do
        clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < 2e7);
    uint64_t t1 = rp_ticks();
    v = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)(t1 - t0);
    return v;
}

static inline int rp_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- replay --------------------------------------------------------------------- */

/* Replay t through a fresh pool configured by conf on a simulated device of
 * `capacity` bytes (0: unlimited). With `timing`, every allocation is timed. */
static inline int rp_run(const rp_trace *t, const char *conf, size_t capacity, bool timing,
                         rp_result *r)
{
    memset(r, 0, sizeof *r);
    ndm__settings s;
    char err[256];
    if (ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err) != NDM_OK) {
        fprintf(stderr, "settings '%s': %s\n", conf, err);
        return -1;
    }
    ndm__sim *sim = ndm__sim_new(capacity);
    /* reserve and commit, for configurations with expandable segments */
    ndm__sim_enable_expandable(sim, 0);
    ndm__pool *p = ndm__pool_new(ndm__sim_source(sim), NDM_CPU, "sim", false);
    (void)ndm__pool_configure(p, &s, conf);
    ndm__block *blk = calloc(t->ids ? t->ids : 1, sizeof *blk);
    uint64_t *lat = timing ? malloc((t->ids ? t->ids : 1) * sizeof *lat) : NULL;
    size_t nlat = 0;
    r->ok = true;
    for (size_t i = 0; i < t->n; i++) {
        const rp_event *e = &t->ev[i];
        if (e->free) {
            ndm__pool_free(p, &blk[e->id]);
            continue;
        }
        uint64_t t0 = timing ? rp_ticks() : 0;
        ndm_status st = ndm__pool_alloc(p, e->size, NULL, &blk[e->id]);
        if (timing)
            lat[nlat++] = rp_ticks() - t0;
        if (st != NDM_OK) {
            r->ok = false;
            break;
        }
    }
    ndm_memory_stats ms;
    ndm__pool_stats(p, &ms);
    r->peak_reserved = (uint64_t)ms.reserved_bytes[NDM_POOL_ALL].peak;
    r->peak_allocated = (uint64_t)ms.allocated_bytes[NDM_POOL_ALL].peak;
    r->maps = (uint64_t)ms.num_device_alloc;
    r->unmaps = (uint64_t)ms.num_device_free;
    r->retries = (uint64_t)ms.num_alloc_retries;
    for (uint32_t k = 0; k < t->ids; k++)
        if (blk[k].cookie)
            ndm__pool_free(p, &blk[k]);
    if (timing && nlat) {
        /* the cost of reading the counter twice, taken off every sample */
        uint64_t base[64];
        for (int k = 0; k < 64; k++) {
            uint64_t a = rp_ticks();
            base[k] = rp_ticks() - a;
        }
        qsort(base, 64, sizeof *base, rp_cmp_u64);
        qsort(lat, nlat, sizeof *lat, rp_cmp_u64);
        double ns = rp_ns_per_tick();
        double off = (double)base[32];
        double p50 = (double)lat[nlat / 2] - off, p99 = (double)lat[nlat * 99 / 100] - off;
        r->p50_ns = (p50 > 0 ? p50 : 0) * ns;
        r->p99_ns = (p99 > 0 ? p99 : 0) * ns;
    }
    free(lat);
    free(blk);
    ndm__pool_destroy(p);
    ndm__sim_destroy(sim);
    return 0;
}

/* The smallest memory_limit_mb (in MiB) under which conf completes t,
 * by bisection between the live peak and the unlimited peak reserved. */
static inline uint64_t rp_min_capacity_mb(const rp_trace *t, const char *conf,
                                          uint64_t unlimited_reserved)
{
    uint64_t lo = (t->peak_live + NDM__MB - 1) / NDM__MB;
    uint64_t hi = (unlimited_reserved + NDM__MB - 1) / NDM__MB;
    if (hi < lo)
        hi = lo;
    char buf[512];
    rp_result r;
    /* make sure hi completes (a limit changes the policy's choices) */
    for (;;) {
        snprintf(buf, sizeof buf, "%s%smemory_limit_mb:%" PRIu64, conf, *conf ? "," : "", hi);
        if (rp_run(t, buf, 0, false, &r) < 0)
            return 0;
        if (r.ok)
            break;
        hi = hi * 5 / 4 + 1;
    }
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        snprintf(buf, sizeof buf, "%s%smemory_limit_mb:%" PRIu64, conf, *conf ? "," : "", mid);
        if (rp_run(t, buf, 0, false, &r) < 0)
            return 0;
        if (r.ok)
            hi = mid;
        else
            lo = mid + 1;
    }
    return hi;
}

#endif
