/* Benchmark section: reductions. ndm_sum over 64M floats in GB/s, against a
 * plain read loop over the same memory on as many threads as ndm's pool. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ndm/ndm.h"
#include "sections.h"

/* ndm's pool size: NDM_NUM_THREADS, else every online core. */
static int pool_threads(void)
{
    const char *e = getenv("NDM_NUM_THREADS");
    if (e && atoi(e) >= 1)
        return atoi(e);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

typedef struct part {
    const uint64_t *p;
    size_t n;
    uint64_t out;
} part;

/* The anchor: read every word once, four independent chains. */
static void *read_part(void *arg)
{
    part *q = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= q->n; i += 4) {
        s0 += q->p[i];
        s1 += q->p[i + 1];
        s2 += q->p[i + 2];
        s3 += q->p[i + 3];
    }
    for (; i < q->n; i++)
        s0 += q->p[i];
    q->out = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

static volatile uint64_t sink;

static double read_loop(const void *data, size_t bytes, int threads)
{
    pthread_t t[64];
    part parts[64];
    threads = threads > 64 ? 64 : threads;
    size_t words = bytes / 8, per = (words + (size_t)threads - 1) / (size_t)threads;
    double t0 = bench_now();
    for (int i = 0; i < threads; i++) {
        size_t b = per * (size_t)i, e = b + per < words ? b + per : words;
        parts[i] = (part){(const uint64_t *)data + b, e > b ? e - b : 0, 0};
        if (i > 0)
            pthread_create(&t[i], NULL, read_part, &parts[i]);
    }
    read_part(&parts[0]);
    for (int i = 1; i < threads; i++)
        pthread_join(t[i], NULL);
    double dt = bench_now() - t0;
    for (int i = 0; i < threads; i++)
        sink ^= parts[i].out;
    return dt;
}

/* Seconds per ndm_sum of `a` over the axes given. */
static double time_sum(ndm_array a, int n, const int *axes)
{
    double t0 = bench_now();
    ndm_array s = ndm_sum(a, false, n, axes);
    double dt = bench_now() - t0;
    if (!s.id) {
        fprintf(stderr, "ndm_sum failed: %s\n", ndm_last_error());
        exit(1);
    }
    if (ndm_array_release(s) < 0)
        exit(1);
    return dt;
}

void bench_ops_reduce(bench_report *r)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-reduce");
    int threads = pool_threads();
    int64_t n = (int64_t)1 << 26;
    size_t bytes = (size_t)n * sizeof(float);
    ndm_array a = ndm_full(m, NDM_F32, 0.25, NDM_SHAPE(n));
    ndm_array sq = ndm_reshape(a, NDM_SHAPE(8192, 8192));
    if (!a.id || !sq.id) {
        fprintf(stderr, "bench_ops_reduce: %s\n", ndm_last_error());
        exit(1);
    }
    const void *data = ndm_array_data(a);
    int samples = r->o.quick ? 5 : 11;
    double tr[16], ts[16], trow[16], tcol[16];
    read_loop(data, bytes, threads);
    time_sum(a, NDM_ALL_AXES_LIST);
    /* interleaved so that a change of load on the machine hits both */
    for (int i = 0; i < samples; i++) {
        tr[i] = read_loop(data, bytes, threads);
        ts[i] = time_sum(a, NDM_ALL_AXES_LIST);
        trow[i] = time_sum(sq, NDM_AXES(1));
        tcol[i] = time_sum(sq, NDM_AXES(0));
    }
    double gb = (double)bytes * 1e-9;
    char what[160];
    snprintf(what, sizeof what, "plain read loop over the same memory, %d threads", threads);
    static const char *const names[] = {"sum_f32_64M_gbps", "sum_f32_8k_x_8k_axis1_gbps",
                                        "sum_f32_8k_x_8k_axis0_gbps"};
    double *figs[] = {ts, trow, tcol};
    for (int f = 0; f < 3; f++) {
        /* each sample's figure against the read loop measured just before it */
        bench_pairs p = bench_pair_stats(figs[f], tr, samples, true);
        bench_add_pairs(r, names[f], gb / p.fig_t, "GB/s", what, gb / p.anchor_t, p);
    }
    char note[200];
    snprintf(note, sizeof note, "reduce: %d pool threads; sums accumulate in f64; median of %d",
             threads, samples);
    bench_note(r, note);
    if (ndm_manager_close(m) < 0)
        exit(1);
}
