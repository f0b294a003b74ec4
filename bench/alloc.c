/* The allocator against its anchors, measured in the same run: cached
 * alloc+free from 64 B to 64 MiB against glibc malloc/free, the array path,
 * a loop that allocates, writes and frees 64 MiB, fragmentation on the
 * replay traces against PyTorch's policy, and cudaMalloc when a GPU is there.
 *
 *   alloc [--json] [--quick] */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ndm/ndm.h"
#include "replay.h"
#if NDM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#ifndef NDM_TRACE_DIR
#define NDM_TRACE_DIR "bench/traces"
#endif

static void *volatile sink;

/* ns per alloc+free pair through the entry points array storage uses. */
static double ndm_pair_ns(ndm_device dev, size_t size, int iters)
{
    static const ndm__alloc_tag tag = {0, __FILE__, "bench", 0, NULL, false};
    ndm__block b;
    for (int i = 0; i < 64; i++) { /* warm: the block is cached */
        if (ndm__alloc(dev, size, &tag, &b) != NDM_OK) {
            fprintf(stderr, "ndm__alloc(%zu): %s\n", size, ndm_last_error());
            exit(1);
        }
        ndm__free(dev, &b);
    }
    double t = bench_now();
    for (int i = 0; i < iters; i++) {
        (void)ndm__alloc(dev, size, &tag, &b);
        sink = b.ptr;
        ndm__free(dev, &b);
    }
    return (bench_now() - t) / iters * 1e9;
}

static double malloc_pair_ns(size_t size, int iters)
{
    for (int i = 0; i < 64; i++) {
        void *p = malloc(size);
        sink = p;
        free(p);
    }
    double t = bench_now();
    for (int i = 0; i < iters; i++) {
        void *p = malloc(size);
        sink = p;
        free(p);
    }
    return (bench_now() - t) / iters * 1e9;
}

/* The per-array path: ndm_empty of 16 floats and its release. */
static double array_pair_ns(ndm_manager m, int iters)
{
    for (int i = 0; i < 64; i++)
        (void)!ndm_array_release(ndm_empty(m, NDM_F32, NDM_SHAPE(16)));
    double t = bench_now();
    for (int i = 0; i < iters; i++) {
        ndm_array a = ndm_empty(m, NDM_F32, NDM_SHAPE(16));
        (void)!ndm_array_release(a);
    }
    return (bench_now() - t) / iters * 1e9;
}

/* ns per array of a manager that makes 1000 arrays of 16 floats and closes. */
static double manager_1000_ns(int rounds)
{
    ndm_manager top = ndm_manager_new(ndm_system(), "bench");
    double t = bench_now();
    for (int r = 0; r < rounds; r++) {
        ndm_manager m = ndm_manager_new(top, "batch");
        for (int i = 0; i < 1000; i++)
            (void)ndm_empty(m, NDM_F32, NDM_SHAPE(16));
        (void)!ndm_manager_close(m);
    }
    double ns = (bench_now() - t) / rounds / 1000 * 1e9;
    (void)!ndm_manager_close(top);
    return ns;
}

static double malloc_1000_ns(int rounds)
{
    void *p[1000];
    double t = bench_now();
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 1000; i++)
            p[i] = malloc(64);
        sink = p[999];
        for (int i = 999; i >= 0; i--)
            free(p[i]);
    }
    return (bench_now() - t) / rounds / 1000 * 1e9;
}

/* GB/s of a loop that allocates 64 MiB, writes all of it and frees it. */
static double write_loop_gbps(bool use_ndm, int iters)
{
    const size_t n = (size_t)64 << 20;
    static const ndm__alloc_tag tag = {0, __FILE__, "bench", 0, NULL, false};
    if (use_ndm) { /* the first pass faults the segment in; later ones reuse it */
        ndm__block b;
        if (ndm__alloc(NDM_CPU, n, &tag, &b) == NDM_OK) {
            memset(b.ptr, 0, n);
            ndm__free(NDM_CPU, &b);
        }
    }
    double t = bench_now();
    for (int i = 0; i < iters; i++) {
        ndm__block b = {0};
        void *p;
        if (use_ndm) {
            if (ndm__alloc(NDM_CPU, n, &tag, &b) != NDM_OK) {
                fprintf(stderr, "ndm__alloc: %s\n", ndm_last_error());
                exit(1);
            }
            p = b.ptr;
        } else {
            p = malloc(n);
        }
        memset(p, i & 0xff, n);
        /* The writes are used: without this the compiler may drop a memset
         * into memory freed right after. */
        __asm__ volatile("" : : "r"(p) : "memory");
        sink = p;
        if (use_ndm)
            ndm__free(NDM_CPU, &b);
        else
            free(p);
    }
    return (double)n * iters / (bench_now() - t) / 1e9;
}

typedef struct pair_ctx {
    size_t size;
    int iters;
    bool use_ndm;
} pair_ctx;

static double pair_run(void *c)
{
    pair_ctx *x = c;
    return x->use_ndm ? ndm_pair_ns(NDM_CPU, x->size, x->iters) : malloc_pair_ns(x->size, x->iters);
}

typedef struct write_ctx {
    bool use_ndm;
    int iters;
} write_ctx;

/* Seconds per byte written (the loop reports GB/s). */
static double write_run(void *c)
{
    write_ctx *x = c;
    return 1e-9 / write_loop_gbps(x->use_ndm, x->iters);
}

typedef struct array_ctx {
    ndm_manager m;
    int iters;
} array_ctx;

static double array_run(void *c)
{
    array_ctx *x = c;
    return array_pair_ns(x->m, x->iters);
}

static double manager_run(void *c) { return manager_1000_ns(*(int *)c); }
static double malloc_1000_run(void *c) { return malloc_1000_ns(*(int *)c); }

static void fragmentation(bench_report *rep)
{
    DIR *d = opendir(NDM_TRACE_DIR);
    if (!d) {
        bench_note(rep, "fragmentation: no traces found");
        return;
    }
    char names[16][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 16)
        if (strstr(e->d_name, ".trace"))
            snprintf(names[n++], 256, "%.255s", e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%.300s/%.255s", NDM_TRACE_DIR, names[i]);
        rp_trace t;
        if (rp_load(path, &t) < 0)
            continue;
        rp_result ours, theirs;
        rp_run(&t, "", 0, false, &ours);
        rp_run(&t, "thread_cache:False,policy:pytorch", 0, false, &theirs);
        double live = (double)t.peak_live;
        char fig[96];
        snprintf(fig, sizeof fig, "frag_%.40s_peak_reserved_over_live", t.name);
        bench_add(rep, fig, (double)ours.peak_reserved / live, "x",
                  "PyTorch policy, same trace", (double)theirs.peak_reserved / live);
        /* Under a limit: the smallest device each completes the trace on. A
         * preallocated arena of the whole limit packs best; its peak reserved
         * is that capacity. */
        uint64_t arena_mb = rp_min_capacity_mb(&t, "strategy:preallocate,preallocate_fraction:1",
                                               theirs.peak_reserved);
        uint64_t torch_mb =
            rp_min_capacity_mb(&t, "thread_cache:False,policy:pytorch", theirs.peak_reserved);
        snprintf(fig, sizeof fig, "frag_%.40s_arena_reserved_over_live", t.name);
        bench_add(rep, fig, (double)(arena_mb << 20) / live, "x",
                  "PyTorch policy at its smallest limit", (double)(torch_mb << 20) / live);
        free(t.ev);
    }
}

static void cuda_section(bench_report *rep, bool quick)
{
#if NDM_HAVE_CUDA
    if (ndm_cuda_device_count() < 1) {
        bench_note(rep, "CUDA: skipped (no GPU found)");
        return;
    }
    size_t sizes[] = {(size_t)1 << 20, (size_t)64 << 20};
    for (int k = 0; k < 2; k++) {
        int iters = quick ? 200 : 2000;
        double ours = ndm_pair_ns(NDM_CUDA(0), sizes[k], iters);
        cudaSetDevice(0);
        void *p;
        cudaMalloc(&p, sizes[k]);
        cudaFree(p);
        double t = bench_now();
        for (int i = 0; i < iters; i++) {
            cudaMalloc(&p, sizes[k]);
            cudaFree(p);
        }
        double theirs = (bench_now() - t) / iters * 1e9;
        char fig[96];
        snprintf(fig, sizeof fig, "cuda_alloc_free_%zuMiB_ns_vs_cudaMalloc", sizes[k] >> 20);
        bench_add(rep, fig, ours, "ns", "cudaMalloc+cudaFree", theirs);
    }
#else
    (void)quick;
    bench_note(rep, "CUDA: skipped (this build has no CUDA backend)");
#endif
}

int main(int argc, char **argv)
{
    static bench_report rep;
    rep.o = bench_parse(argc, argv);
    bool quick = rep.o.quick;
    int runs = quick ? 3 : 7;
    const char *conf = getenv("NDM_ALLOC_CONF");
    char settings[512];
    ndm_alloc_settings(NDM_CPU, settings, sizeof settings);
    char note[256];
    snprintf(note, sizeof note, "cpu allocator: %s%s", conf && *conf ? "NDM_ALLOC_CONF=" : "",
             conf && *conf ? conf : "defaults");
    bench_note(&rep, note);
    bench_note(&rep, "alloc+free target: <= 25 ns for sizes the thread cache holds (<= 1 MiB); "
                     "larger blocks take the shared pool's lock");

    bench_note(&rep, "each figure and its anchor are sampled turn about; ratio: median of "
                     "the pairs' ratios");
    static double t[2][BENCH_MAXSAMPLES];
    /* Cached alloc+free, 64 B to 64 MiB. */
    for (size_t size = 64; size <= ((size_t)64 << 20); size *= 4) {
        int iters = quick ? 20000 : 200000;
        int miters = size >= ((size_t)32 << 20) ? iters / 50 : iters;
        pair_ctx a = {size, iters, true}, b = {size, miters, false};
        bench_interleave(2, (bench_sample_fn[]){pair_run, pair_run}, (void *[]){&a, &b}, runs, t);
        char fig[96];
        if (size >= ((size_t)1 << 20))
            snprintf(fig, sizeof fig, "alloc_free_%zuMiB_ns_vs_malloc", size >> 20);
        else if (size >= 1024)
            snprintf(fig, sizeof fig, "alloc_free_%zuKiB_ns_vs_malloc", size >> 10);
        else
            snprintf(fig, sizeof fig, "alloc_free_%zuB_ns_vs_malloc", size);
        bench_add_paired_time(&rep, fig, "ns", 1, "glibc malloc+free, same size", t[0], t[1],
                              runs);
    }

    /* The array path: what a manager pays per array. */
    ndm_manager m = ndm_manager_new(ndm_system(), "bench");
    array_ctx arr = {m, quick ? 20000 : 200000};
    pair_ctx small = {64, quick ? 20000 : 200000, false};
    bench_interleave(2, (bench_sample_fn[]){array_run, pair_run}, (void *[]){&arr, &small}, runs,
                     t);
    bench_add_paired_time(&rep, "array_empty_release_16f_ns_vs_malloc", "ns", 1,
                          "glibc malloc+free of 64 B", t[0], t[1], runs);
    (void)!ndm_manager_close(m);

    /* The manager benchmark's shape: a sub-manager, 1000 arrays, close. */
    int rounds = quick ? 20 : 200;
    bench_interleave(2, (bench_sample_fn[]){manager_run, malloc_1000_run},
                     (void *[]){&rounds, &rounds}, runs, t);
    bench_add_paired_time(&rep, "manager_1000_arrays_16f_ns_per_array_vs_malloc", "ns", 1,
                          "1000 x malloc(64) then free", t[0], t[1], runs);

    /* 64 MiB allocated, written and freed each iteration. */
    write_ctx wo = {true, quick ? 10 : 40}, wm = {false, quick ? 2 : 5};
    int wruns = quick ? 3 : 5;
    bench_interleave(2, (bench_sample_fn[]){write_run, write_run}, (void *[]){&wo, &wm}, wruns, t);
    bench_add_paired_rate(&rep, "write_64MiB_loop_gbps_vs_malloc", "GB/s", 1e-9,
                          "the same loop through glibc malloc", 1, t[0], 1, t[1], wruns);
    /* The ceiling: writing a buffer that stays mapped. */
    {
        size_t n = (size_t)64 << 20;
        char *buf = malloc(n);
        memset(buf, 1, n);
        double v[5];
        for (int r = 0; r < 5; r++) {
            double t0 = bench_now();
            for (int i = 0; i < 8; i++) {
                memset(buf, i, n);
                __asm__ volatile("" : : "r"(buf) : "memory");
            }
            v[r] = (double)n * 8 / (bench_now() - t0) / 1e9;
        }
        free(buf);
        snprintf(note, sizeof note,
                 "memset into a reused 64 MiB buffer: %.1f GB/s (the loop's ceiling)",
                 bench_median(v, 5));
        bench_note(&rep, note);
    }

    fragmentation(&rep);
    cuda_section(&rep, quick);
    bench_print(&rep);
    return 0;
}
