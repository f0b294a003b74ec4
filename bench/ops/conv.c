/* Benchmark section: conv2d forward and its two gradients on a
 * Fashion-MNIST-sized batch (128x1x28x28, 32 filters 3x3, padding 1, bias)
 * in GFLOP/s, each against the GEMM it unfolds to run directly by the
 * provider: 32 x 9 @ 9 x 100352 (forward), 9 x 32 @ 32 x 100352 (input
 * gradient), 32 x 100352 @ 100352 x 9 (weight gradient). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ndm/ndm.h"
#include "sections.h"

enum { FORWARD, GRAD_INPUT, GRAD_WEIGHT };

/* One pass: the forward (x, w, bias), or a gradient from dy. */
static ndm_array conv_pass(int which, ndm_array x, ndm_array w, ndm_array b, ndm_array dy)
{
    const ndm_conv2d_opts *o = NDM_CONV2D(.padding = {1, 1});
    switch (which) {
    case GRAD_INPUT:
        return ndm_conv2d_backward_input(dy, w, o, NDM_SHAPE(128, 1, 28, 28));
    case GRAD_WEIGHT:
        return ndm_conv2d_backward_weight(dy, x, o, NDM_SHAPE(32, 1, 3, 3));
    default:
        return ndm_conv2d_bias(x, w, b, o);
    }
}

static double time_pass(int which, ndm_array x, ndm_array w, ndm_array b, ndm_array dy,
                        int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++) {
        ndm_array y = conv_pass(which, x, w, b, dy);
        if (!y.id || ndm_array_release(y) < 0) {
            fprintf(stderr, "convolution pass %d failed: %s\n", which, ndm_last_error());
            exit(1);
        }
    }
    return (bench_now() - t0) / calls;
}

/* The unfolded GEMM of a pass; false without a provider. */
static bool anchor_pass(int which, int gm, int gk, int gn, const float *w, const float *col,
                        const float *dy, float *out)
{
    switch (which) {
    case GRAD_INPUT: /* col (gk x gn) = W^T (gk x gm) @ dy (gm x gn) */
        return bench_sgemm(true, false, gk, gn, gm, w, gk, dy, gn, out, gn);
    case GRAD_WEIGHT: /* dW (gm x gk) = dy (gm x gn) @ col^T (gn x gk) */
        return bench_sgemm(false, true, gm, gk, gn, dy, gn, col, gn, out, gk);
    default:
        return bench_sgemm(false, false, gm, gn, gk, w, gk, col, gn, out, gn);
    }
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
    /* the gradients start from a grad_out like the forward's result */
    size_t ny = (size_t)N * O * H * W;
    float *hdy = malloc(ny * sizeof(float)), *gd = malloc(ny * sizeof(float));
    if (!hdy || !gd)
        exit(1);
    for (size_t i = 0; i < ny; i++)
        hdy[i] = gd[i] = (float)((i * 2246822519u) % 2000) * 1e-3f - 1.0f;
    ndm_array dy = ndm_from_buffer(m, NDM_F32, hdy, NDM_SHAPE(N, O, H, W));
    if (!dy.id)
        exit(1);
    bool have_gemm = bench_sgemm(false, false, gm, gn, gk, ga, gk, gb, gn, gc, gn);
    int samples = r->o.quick ? 5 : 9;
    int calls[3];
    double tc[3][16], tg[3][16];
    for (int which = 0; which < 3; which++) {
        double est = time_pass(which, x, w, b, dy, 1);
        calls[which] = est >= 0.02 ? 1 : (int)(0.02 / est) + 1;
    }
    /* ndm's pass and the provider's alternate (ABAB...), so that a change of
     * load or bandwidth hits both; the ratio is the median of the pairs' */
    for (int i = 0; i < samples; i++)
        for (int which = 0; which < 3; which++) {
            tc[which][i] = time_pass(which, x, w, b, dy, calls[which]);
            double t0 = bench_now();
            for (int j = 0; have_gemm && j < calls[which]; j++)
                anchor_pass(which, gm, gk, gn, ga, gb, gd, gc);
            tg[which][i] = (bench_now() - t0) / calls[which];
        }
    /* dx: ndm_conv2d_backward_input; dw: ndm_conv2d_backward_weight */
    static const char *const names[] = {"conv2d_f32_128x1x28x28_32x3x3_gflops",
                                        "conv2d_dx_f32_128x1x28x28_32x3x3_gflops",
                                        "conv2d_dw_f32_128x1x28x28_32x3x3_gflops"};
    double flop = 2.0 * N * O * H * W * (double)(C * K * K);
    for (int which = 0; which < 3; which++) {
        char shape[64], what[160];
        if (which == FORWARD)
            snprintf(shape, sizeof shape, "%dx%d @ %dx%d", gm, gk, gk, gn);
        else if (which == GRAD_INPUT)
            snprintf(shape, sizeof shape, "%dx%d @ %dx%d, A transposed", gk, gm, gm, gn);
        else
            snprintf(shape, sizeof shape, "%dx%d @ %dx%d, B transposed", gm, gn, gn, gk);
        snprintf(what, sizeof what, "the unfolded GEMM (%s), direct %s sgemm", shape,
                 ndm_gemm_provider());
        bench_pairs p = bench_pair_stats(tc[which], tg[which], samples, true);
        if (have_gemm)
            bench_add_pairs(r, names[which], flop / p.fig_t * 1e-9, "GFLOP/s", what,
                            flop / p.anchor_t * 1e-9, p);
        else
            bench_add(r, names[which], flop / p.fig_t * 1e-9, "GFLOP/s", "", 0);
    }
    free(ga), free(gb), free(gc), free(gd), free(hx), free(hw), free(hdy);
    if (ndm_manager_close(m) < 0)
        exit(1);
}
