/* Benchmark section: conv2d forward on a Fashion-MNIST-sized batch
 * (128x1x28x28, 32 filters 3x3, padding 1, bias) in GFLOP/s, against the
 * GEMM the convolution unfolds to (32 x 9 @ 9 x 100352) run directly by the
 * provider. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ndm/ndm.h"
#include "sections.h"

#if NDM_HAVE_OPENBLAS
#include <cblas.h>
#elif NDM_HAVE_BLIS
#include <blis.h>
#endif

static bool unfolded_gemm(int m, int n, int k, const float *a, const float *b, float *c)
{
#if NDM_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    return true;
#elif NDM_HAVE_BLIS
    float one = 1.0f, zero = 0.0f;
    bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (float *)a, k, 1, (float *)b,
              n, 1, &zero, c, n, 1);
    return true;
#else
    (void)m, (void)n, (void)k, (void)a, (void)b, (void)c;
    return false;
#endif
}

static double time_conv(ndm_array x, ndm_array w, ndm_array b, int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++) {
        ndm_array y = ndm_conv2d_bias(x, w, b, NDM_CONV2D(.padding = {1, 1}));
        if (!y.id || ndm_array_release(y) < 0) {
            fprintf(stderr, "ndm_conv2d failed: %s\n", ndm_last_error());
            exit(1);
        }
    }
    return (bench_now() - t0) / calls;
}

void bench_ops_conv(bench_report *r)
{
    const int N = 128, C = 1, H = 28, W = 28, O = 32, K = 3;
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-conv");
    size_t nx = (size_t)N * C * H * W, nw = (size_t)O * C * K * K;
    float *hx = malloc(nx * sizeof(float)), *hw = malloc(nw * sizeof(float));
    if (!hx || !hw)
        exit(1);
    for (size_t i = 0; i < nx; i++)
        hx[i] = (float)((i * 2654435761u) % 256) / 255.0f; /* pixel-like values */
    for (size_t i = 0; i < nw; i++)
        hw[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    ndm_array x = ndm_from_buffer(m, NDM_F32, hx, NDM_SHAPE(N, C, H, W));
    ndm_array w = ndm_from_buffer(m, NDM_F32, hw, NDM_SHAPE(O, C, K, K));
    ndm_array b = ndm_full(m, NDM_F32, 0.1, NDM_SHAPE(O));
    /* the unfolded problem: (O x C*K*K) @ (C*K*K x N*H*W) */
    int gm = O, gk = C * K * K, gn = N * H * W;
    float *ga = malloc((size_t)gm * gk * sizeof(float)), *gb = malloc((size_t)gk * gn * sizeof(float));
    float *gc = malloc((size_t)gm * gn * sizeof(float));
    if (!x.id || !w.id || !b.id || !ga || !gb || !gc)
        exit(1);
    for (size_t i = 0; i < (size_t)gm * gk; i++)
        ga[i] = hw[i % nw];
    for (size_t i = 0; i < (size_t)gk * gn; i++)
        gb[i] = hx[i % nx];
    bool have_gemm = unfolded_gemm(gm, gn, gk, ga, gb, gc);
    double est = time_conv(x, w, b, 1);
    int calls = est >= 0.02 ? 1 : (int)(0.02 / est) + 1;
    int samples = r->o.quick ? 5 : 9;
    double tc[16], tg[16];
    for (int i = 0; i < samples; i++) {
        double t0 = bench_now();
        for (int j = 0; have_gemm && j < calls; j++)
            unfolded_gemm(gm, gn, gk, ga, gb, gc);
        tg[i] = (bench_now() - t0) / calls;
        tc[i] = time_conv(x, w, b, calls);
    }
    double flop = 2.0 * N * O * H * W * (double)(C * K * K);
    char what[160];
    snprintf(what, sizeof what, "the unfolded GEMM (%dx%d @ %dx%d), direct %s sgemm", gm, gk, gk,
             gn, ndm_gemm_provider());
    bench_add(r, "conv2d_f32_128x1x28x28_32x3x3_gflops", flop / bench_median(tc, samples) * 1e-9,
              "GFLOP/s", have_gemm ? what : "", have_gemm ? flop / bench_median(tg, samples) * 1e-9 : 0);
    free(ga), free(gb), free(gc), free(hx), free(hw);
    if (ndm_manager_close(m) < 0)
        exit(1);
}
