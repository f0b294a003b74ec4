/* Replays allocator traces through each strategy on a simulated device and
 * reports fragmentation, the smallest device that completes the trace, and
 * allocation latency.
 *
 *   alloc_replay [--json] [--quick] [TRACE...]   (default: every trace in bench/traces)
 *
 * Per trace and strategy: peak reserved over peak live (live = the sum of
 * the requested sizes of the allocations alive at once, the lower bound any
 * allocator must reach), the smallest memory_limit_mb that completes the
 * trace (bisection) over peak live, and p50/p99 allocation latency against
 * glibc malloc replaying the same trace in the same run, and the segments
 * mapped against PyTorch's policy on the same trace. Then, for people, a
 * table comparing the three segment policies on each trace (PyTorch's,
 * the compact one, and expandable segments grown in place): peak reserved,
 * the share of it that is never live at once (1 - peak live / peak
 * reserved), and the replay's time per allocation. */
#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>

#include "bench.h"
#include "replay.h"

#ifndef NDM_TRACE_DIR
#define NDM_TRACE_DIR "bench/traces"
#endif

typedef struct strategy {
    const char *name;
    const char *conf;
    size_t capacity; /* of the simulated device for the unlimited run */
} strategy;

static const strategy strategies[] = {
    {"pytorch", "thread_cache:False,policy:pytorch", 0}, /* PyTorch's policy, exactly */
    {"ndm", "", 0},                 /* the default: compact segments, thread caches in front */
    {"ndm_pytorch_segments", "policy:pytorch", 0}, /* thread caches over PyTorch's segments */
    /* PyTorch's block policy in one range per pool that grows in place */
    {"expandable", "thread_cache:False,policy:pytorch,expandable_segments:True", 0},
    {"ndm_gc", "garbage_collection_threshold:0.8", 0},
    {"max_split", "max_split_size_mb:64", 0},
    {"preallocate", "strategy:preallocate", (size_t)16 << 30},
    /* one arena of the whole limit: only its smallest capacity is telling */
    {"arena", "strategy:preallocate,preallocate_fraction:1", (size_t)16 << 30},
    {"system", "strategy:system", 0},
};

/* glibc malloc on the same trace: the latency anchor (memory is not touched). */
static void malloc_latency(const rp_trace *t, double *p50, double *p99)
{
    void **ptr = calloc(t->ids ? t->ids : 1, sizeof *ptr);
    uint64_t *lat = malloc((t->ids ? t->ids : 1) * sizeof *lat);
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++) {
        const rp_event *e = &t->ev[i];
        if (e->free) {
            free(ptr[e->id]);
            ptr[e->id] = NULL;
            continue;
        }
        uint64_t a = rp_ticks();
        ptr[e->id] = malloc(e->size ? e->size : 1);
        lat[n++] = rp_ticks() - a;
    }
    for (uint32_t k = 0; k < t->ids; k++)
        free(ptr[k]);
    qsort(lat, n, sizeof *lat, rp_cmp_u64);
    double ns = rp_ns_per_tick();
    *p50 = n ? (double)lat[n / 2] * ns : 0;
    *p99 = n ? (double)lat[n * 99 / 100] * ns : 0;
    free(lat);
    free(ptr);
}

static int default_traces(char paths[][512], int max)
{
    DIR *d = opendir(NDM_TRACE_DIR);
    int n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (strstr(e->d_name, ".trace"))
            snprintf(paths[n++], 512, "%.250s/%.255s", NDM_TRACE_DIR, e->d_name);
    }
    closedir(d);
    /* a stable order */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(paths[j], paths[i]) < 0) {
                char tmp[512];
                memcpy(tmp, paths[i], 512);
                memcpy(paths[i], paths[j], 512);
                memcpy(paths[j], tmp, 512);
            }
    return n;
}

/* One row of the policy table. */
typedef struct policy_row {
    char trace[48];
    double live_mb, reserved_mb[3], p50_ns[3];
} policy_row;

/* The three segment policies, as the strategies above name them. */
static const char *const policy_names[3] = {"pytorch", "ndm", "expandable"};

static void print_policies(const policy_row *rows, int n)
{
    printf("\nsegment policies: peak reserved MiB, waste = 1 - peak live / peak reserved, "
           "p50 ns per allocation\n");
    printf("%-18s %9s", "trace", "live MiB");
    static const char *const heads[3] = {"pytorch", "compact", "expandable"};
    for (int k = 0; k < 3; k++)
        printf(" | %-27s", heads[k]);
    printf("\n");
    for (int i = 0; i < n; i++) {
        const policy_row *r = &rows[i];
        printf("%-18.18s %9.1f", r->trace, r->live_mb);
        for (int k = 0; k < 3; k++) {
            double frag = r->reserved_mb[k] > 0 ? 1 - r->live_mb / r->reserved_mb[k] : 0;
            printf(" | %9.1f %6.1f%% %7.0f ns", r->reserved_mb[k], 100 * frag, r->p50_ns[k]);
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    static bench_report rep;
    rep.o = bench_parse(argc, argv);
    char paths[16][512];
    int np = 0;
    for (int i = 1; i < argc && np < 16; i++)
        if (argv[i][0] != '-')
            snprintf(paths[np++], 512, "%s", argv[i]);
    if (!np)
        np = default_traces(paths, 16);
    if (!np) {
        fprintf(stderr, "no traces given and none found in %s\n", NDM_TRACE_DIR);
        return 1;
    }
    bench_note(&rep, "simulated device: no memory behind the addresses; latency is the "
                     "allocator's own bookkeeping");
    int nstrat = (int)(sizeof strategies / sizeof *strategies);
    policy_row rows[16];
    memset(rows, 0, sizeof rows);
    for (int ti = 0; ti < np; ti++) {
        rp_trace t;
        if (rp_load(paths[ti], &t) < 0)
            return 1;
        double live_mb = (double)t.peak_live / (double)NDM__MB;
        double m50 = 0, m99 = 0;
        malloc_latency(&t, &m50, &m99);
        char note[256];
        snprintf(note, sizeof note, "%s: %zu events, %u allocations, peak live %.1f MiB", t.name,
                 t.n, t.ids, live_mb);
        bench_note(&rep, note);
        double pytorch_maps = 0;
        policy_row *row = &rows[ti];
        snprintf(row->trace, sizeof row->trace, "%.40s", t.name);
        row->live_mb = live_mb;
        for (int si = 0; si < nstrat; si++) {
            const strategy *s = &strategies[si];
            if (rep.o.quick && si >= 4 && strcmp(s->name, "system"))
                continue;
            rp_result r;
            if (rp_run(&t, s->conf, s->capacity, true, &r) < 0 || !r.ok) {
                fprintf(stderr, "%s / %s: replay failed\n", t.name, s->name);
                return 1;
            }
            /* Latency: the median of three timed replays. */
            double p50[3] = {r.p50_ns}, p99[3] = {r.p99_ns};
            for (int k = 1; k < 3; k++) {
                rp_result r2;
                rp_run(&t, s->conf, s->capacity, true, &r2);
                p50[k] = r2.p50_ns;
                p99[k] = r2.p99_ns;
            }
            char name[96];
            double reserved_mb = (double)r.peak_reserved / (double)NDM__MB;
            snprintf(name, sizeof name, "%.40s/%s/peak_reserved_over_live", t.name, s->name);
            bench_add(&rep, name, reserved_mb, "MiB", "peak live requested MiB", live_mb);
            uint64_t min_mb = rp_min_capacity_mb(&t, s->conf, r.peak_reserved);
            snprintf(name, sizeof name, "%.40s/%s/min_capacity_over_live", t.name, s->name);
            bench_add(&rep, name, (double)min_mb, "MiB", "peak live requested MiB", live_mb);
            snprintf(name, sizeof name, "%.40s/%s/alloc_p50_ns_vs_malloc", t.name, s->name);
            bench_add(&rep, name, bench_median(p50, 3), "ns", "glibc malloc p50, same trace", m50);
            snprintf(name, sizeof name, "%.40s/%s/alloc_p99_ns_vs_malloc", t.name, s->name);
            bench_add(&rep, name, bench_median(p99, 3), "ns", "glibc malloc p99, same trace", m99);
            for (int k = 0; k < 3; k++) {
                if (!strcmp(s->name, policy_names[k])) {
                    row->reserved_mb[k] = reserved_mb;
                    row->p50_ns[k] = bench_median(p50, 3);
                }
            }
            /* Segment maps: free on the simulated device, an mmap and fresh
             * pages on the CPU, a cudaMalloc on CUDA. */
            if (si == 0)
                pytorch_maps = (double)r.maps;
            snprintf(name, sizeof name, "%.40s/%s/segment_maps_vs_pytorch", t.name, s->name);
            bench_add(&rep, name, (double)r.maps, "maps", "pytorch's segment maps, same trace",
                      pytorch_maps);
        }
        free(t.ev);
    }
    bench_print(&rep);
    if (!rep.o.json)
        print_policies(rows, np);
    return 0;
}
