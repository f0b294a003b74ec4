/* Benchmark section: ndm_matmul (f32, n x n) against a direct call of the
 * same GEMM provider with the same threads, and against the machine's peak
 * (an FMA loop on as many threads, measured first in the same run).
 * main measures it a second time without OPENBLAS_CORETYPE and
 * OPENBLAS_L2_SIZE (blas_env.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../lib/backends/cpu/gemm.h"
#include "../blas_env.h"
#include "ndm/ndm.h"
#include "sections.h"

#if NDM_HAVE_OPENBLAS
#include <cblas.h>
#elif NDM_HAVE_BLIS
#include <blis.h>
#endif

bool bench_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
                 int ldb, float *c, int ldc)
{
#if NDM_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return true;
#elif NDM_HAVE_BLIS
    float one = 1.0f, zero = 0.0f;
    bli_sgemm(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m,
              n, k, &one, (float *)a, lda, 1, (float *)b, ldb, 1, &zero, c, ldc, 1);
    return true;
#else
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc;
    return false;
#endif
}

/* C = A @ B, n x n, through the provider; false when there is none. */
static bool direct_sgemm(int n, const float *a, const float *b, float *c)
{
    return bench_sgemm(false, false, n, n, n, a, n, b, n, c, n);
}

/* OpenBLAS's idle threads keep yielding on the cores for about 0.1 s after
 * a product (until their timeout of 2^28 cycles), and CFS gives a thread
 * that yields in a loop its full share of a core: a sample of ndm's pool
 * started in that window runs on about one core. ndm's idle workers stay
 * awake for at most a millisecond. So every sample of either side starts a
 * quarter of a second after the last one, with the other side's threads
 * asleep: each side is timed from its own idle state. */
static void settle(void)
{
    struct timespec t = {0, 250000000};
    nanosleep(&t, NULL);
}

static double time_ndm(ndm_array a, ndm_array b, int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++) {
        ndm_array c = ndm_matmul(a, b);
        if (!c.id || ndm_array_release(c) < 0) {
            fprintf(stderr, "ndm_matmul failed: %s\n", ndm_last_error());
            exit(1);
        }
    }
    return (bench_now() - t0) / calls;
}

static double time_direct(int n, const float *a, const float *b, float *c, int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++)
        direct_sgemm(n, a, b, c);
    return (bench_now() - t0) / calls;
}

static void measure(bench_report *r, double peak)
{
    static const int sizes[] = {256, 512, 1024, 2048, 4096};
    bool quick = r->o.quick;
    int count = quick ? 4 : 5, threads = bench_blas_threads();
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-linalg");
    for (int s = 0; s < count; s++) {
        int n = sizes[s];
        size_t nn = (size_t)n * (size_t)n;
        float *ha = malloc(nn * sizeof(float)), *hb = malloc(nn * sizeof(float));
        float *hc = malloc(nn * sizeof(float));
        if (!ha || !hb || !hc)
            exit(1);
        for (size_t i = 0; i < nn; i++) {
            ha[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            hb[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
            hc[i] = 0;
        }
        ndm_array a = ndm_from_buffer(m, NDM_F32, ha, NDM_SHAPE(n, n));
        ndm_array b = ndm_from_buffer(m, NDM_F32, hb, NDM_SHAPE(n, n));
        if (!a.id || !b.id)
            exit(1);
        bool have_direct = direct_sgemm(n, ha, hb, hc);
        /* warm up both, then size the calls per sample to about 0.1 s */
        double est = time_ndm(a, b, 1);
        if (have_direct)
            est = time_direct(n, ha, hb, hc, 1);
        int calls = est >= 0.1 ? 1 : (int)(0.1 / est) + 1;
        int samples = n >= 4096 ? 3 : quick ? 5 : 7;
        double tn[8], td[8];
        for (int i = 0; i < samples; i++) {
            settle();
            td[i] = have_direct ? time_direct(n, ha, hb, hc, calls) : 0;
            settle();
            tn[i] = time_ndm(a, b, calls);
        }
        double flop = 2.0 * (double)n * (double)n * (double)n;
        bench_pairs p = bench_pair_stats(tn, td, samples, true);
        double g_ndm = flop / p.fig_t * 1e-9;
        double g_dir = have_direct ? flop / p.anchor_t * 1e-9 : 0;
        char name[96], what[160];
        snprintf(name, sizeof name, "matmul_f32_n%d_gflops", n);
        snprintf(what, sizeof what, "direct %s sgemm, %d threads", ndm_gemm_provider(), threads);
        if (have_direct)
            bench_add_pairs(r, name, g_ndm, "GFLOP/s", what, g_dir, p);
        else
            bench_add(r, name, g_ndm, "GFLOP/s", "", 0);
        snprintf(name, sizeof name, "matmul_f32_n%d_vs_peak", n);
        snprintf(what, sizeof what, "f32 FMA loop peak, %d threads (measured)", threads);
        bench_add(r, name, g_ndm, "GFLOP/s", what, peak);
        /* a spot check that both computed the same product */
        ndm_array c = ndm_matmul(a, b);
        const float *pc = ndm_array_data(c);
        if (have_direct && pc)
            for (size_t i = 0; i < nn; i += nn / 7 + 1) {
                double d = (double)pc[i] - (double)hc[i];
                if (d > 1e-3 || d < -1e-3) {
                    fprintf(stderr, "matmul n=%d: ndm and the provider differ at %zu\n", n, i);
                    exit(1);
                }
            }
        if (ndm_array_release(c) < 0 || ndm_array_release(a) < 0 || ndm_array_release(b) < 0)
            exit(1);
        free(ha), free(hb), free(hc);
    }
    if (ndm_manager_close(m) < 0)
        exit(1);
}

/* ndm's own blocked GEMM threaded by ndm's pool (the provider left out)
 * against the provider called directly with its own threads: the other way
 * to keep all CPU work on one pool. */
static void own_kernel(bench_report *r)
{
    static const int sizes[] = {256, 512, 1024};
    int count = r->o.quick ? 2 : 3, threads = bench_blas_threads();
    for (int s = 0; s < count; s++) {
        int n = sizes[s];
        size_t nn = (size_t)n * (size_t)n;
        float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float));
        float *c = malloc(nn * sizeof(float));
        if (!a || !b || !c)
            exit(1);
        for (size_t i = 0; i < nn; i++) {
            a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        }
        if (!direct_sgemm(n, a, b, c)) {
            free(a), free(b), free(c);
            return;
        }
        double t0 = bench_now();
        ndm__cpu_gemm(NDM_F32, n, n, n, a, n, 1, b, n, 1, c, n, 1, NDM__GEMM_NO_PROVIDER);
        double est = bench_now() - t0;
        int calls = est >= 0.1 ? 1 : (int)(0.1 / est) + 1;
        int samples = r->o.quick ? 5 : 7;
        double tn[8], td[8];
        for (int i = 0; i < samples; i++) {
            settle();
            t0 = bench_now();
            for (int j = 0; j < calls; j++)
                ndm__cpu_gemm(NDM_F32, n, n, n, a, n, 1, b, n, 1, c, n, 1,
                              NDM__GEMM_NO_PROVIDER);
            tn[i] = (bench_now() - t0) / calls;
            settle();
            td[i] = time_direct(n, a, b, c, calls);
        }
        double flop = 2.0 * (double)n * (double)n * (double)n;
        bench_pairs p = bench_pair_stats(tn, td, samples, true);
        char name[96], what[160];
        snprintf(name, sizeof name, "gemm_ndm_kernel_f32_n%d_gflops", n);
        snprintf(what, sizeof what, "direct %s sgemm, %d threads", ndm_gemm_provider(), threads);
        bench_add_pairs(r, name, flop / p.fig_t * 1e-9, "GFLOP/s", what, flop / p.anchor_t * 1e-9,
                        p);
        free(a), free(b), free(c);
    }
}

/* Batch-1 inference's products: x (1 x k) @ W^T with W (n x k) row-major,
 * the layers of a 784-256-128-10 MLP, in microseconds per forward, against
 * the provider called directly on the same operands. */
static void batch1(bench_report *r)
{
    static const int dims[] = {784, 256, 128, 10};
    float *w[3], *x = calloc(1024, sizeof(float)), *y = calloc(1024, sizeof(float));
    if (!x || !y)
        exit(1);
    for (int l = 0; l < 3; l++) {
        size_t sz = (size_t)dims[l] * (size_t)dims[l + 1];
        w[l] = malloc(sz * sizeof(float));
        if (!w[l])
            exit(1);
        for (size_t i = 0; i < sz; i++)
            w[l][i] = (float)((i * 7919) % 1000) * 1e-4f - 0.05f;
    }
    for (int i = 0; i < 784; i++)
        x[i] = (float)(i % 10) * 0.1f;
    int calls = 2000, samples = r->o.quick ? 5 : 9;
    double tn[16], td[16];
    bool have = bench_sgemm(false, true, 1, dims[1], dims[0], x, dims[0], w[0], dims[0], y,
                            dims[1]);
    for (int i = 0; i < samples; i++) {
        double t0 = bench_now();
        for (int j = 0; j < calls; j++)
            for (int l = 0; l < 3; l++)
                ndm__cpu_gemm(NDM_F32, 1, dims[l + 1], dims[l], l ? y : x, 0, 1, w[l], 1,
                              dims[l], l ? y + 512 : y, 0, 1, 0);
        tn[i] = (bench_now() - t0) / calls;
        t0 = bench_now();
        for (int j = 0; have && j < calls; j++)
            for (int l = 0; l < 3; l++)
                bench_sgemm(false, true, 1, dims[l + 1], dims[l], l ? y : x, dims[l], w[l],
                            dims[l], l ? y + 512 : y, dims[l + 1]);
        td[i] = (bench_now() - t0) / calls;
    }
    bench_pairs p = bench_pair_stats(tn, td, samples, false);
    if (have)
        bench_add_pairs(r, "gemv_mlp_784_256_128_10_batch1_us", p.fig_t * 1e6, "us",
                        "the same products through the provider directly", p.anchor_t * 1e6, p);
    else
        bench_add(r, "gemv_mlp_784_256_128_10_batch1_us", p.fig_t * 1e6, "us", "", 0);
    for (int l = 0; l < 3; l++)
        free(w[l]);
    free(x), free(y);
}

/* The FMA peak on one thread and on the product's threads; returns the
 * latter, the anchor of the matmul figures. */
static double peak(bench_report *r)
{
    int threads = bench_blas_threads();
    const char *isa;
    settle();
    double one = bench_fma_peak(1, &isa), all = bench_fma_peak(threads, &isa);
    char name[96], what[160];
    snprintf(what, sizeof what, "peak: an %s f32 FMA loop on 1 and %d threads", isa, threads);
    bench_note(r, what);
    bench_add(r, "fma_peak_f32_1t_gflops", one, "GFLOP/s", "", 0);
    snprintf(name, sizeof name, "fma_peak_f32_%dt_gflops", threads);
    snprintf(what, sizeof what, "1-thread peak x %d", threads);
    bench_add(r, name, all, "GFLOP/s", what, one * threads);
    return all;
}

void bench_ops_linalg(bench_report *r)
{
    bench_blas_note(r, "linalg");
    measure(r, peak(r));
    own_kernel(r);
    batch1(r);
}
