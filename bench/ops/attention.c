/* Benchmark section: the blocks of a transformer. RMSNorm (ndm_rms_norm,
 * one fused kernel on the CPU) against a one-pass loop over the same memory
 * and against the same as separate operations; scaled dot-product
 * attention (ndm_sdpa, causal) against its two matmuls alone, the floor
 * of any softmax fusion, and against the matmuls with an unmasked softmax,
 * the floor of fusing the mask. Contenders are sampled alternately. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndm/ndm.h"
#include "sections.h"

typedef struct rms_ctx {
    ndm_manager m;
    ndm_array x, w;
    const float *xp, *wp;
    float *out;
    int64_t rows, cols;
} rms_ctx;

static void must(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "bench_ops_attention: %s: %s\n", what, ndm_last_error());
        exit(1);
    }
}

static double rms_composed(void *p)
{
    rms_ctx *c = p;
    double t0 = bench_now();
    ndm_manager s = ndm_scope_begin(c->m, "rms");
    must(ndm_rms_norm(c->x, c->w, 1e-6).id != 0, "ndm_rms_norm");
    must(ndm_scope_end(s, 0, NULL) == NDM_OK, "scope");
    return bench_now() - t0;
}

/* The same as four operations, as ndm_rms_norm composes it off the fused path. */
static double rms_parts(void *p)
{
    rms_ctx *c = p;
    double t0 = bench_now();
    ndm_manager s = ndm_scope_begin(c->m, "parts");
    ndm_array ms = ndm_mean(ndm_mul(c->x, c->x), true, NDM_AXES(-1));
    must(ndm_mul(ndm_mul(c->x, ndm_rsqrt(ndm_add_scalar(ms, 1e-6))), c->w).id != 0, "parts");
    must(ndm_scope_end(s, 0, NULL) == NDM_OK, "scope");
    return bench_now() - t0;
}

/* One pass per row: the sum of squares, then the scaled row (one thread,
 * what a fused CPU kernel does per row). */
static double rms_fused_loop(void *p)
{
    rms_ctx *c = p;
    double t0 = bench_now();
    for (int64_t r = 0; r < c->rows; r++) {
        const float *x = c->xp + r * c->cols;
        float *y = c->out + r * c->cols, ss = 0;
        for (int64_t j = 0; j < c->cols; j++)
            ss += x[j] * x[j];
        float k = 1.0f / sqrtf(ss / (float)c->cols + 1e-6f);
        for (int64_t j = 0; j < c->cols; j++)
            y[j] = x[j] * k * c->wp[j];
    }
    return bench_now() - t0;
}

typedef struct attn_ctx {
    ndm_manager m;
    ndm_array q, k, v, kt;
} attn_ctx;

static double attn_sdpa(void *p)
{
    attn_ctx *c = p;
    double t0 = bench_now();
    ndm_manager s = ndm_scope_begin(c->m, "sdpa");
    must(ndm_sdpa(c->q, c->k, c->v, NDM_NULL_ARRAY, true, 0).id != 0, "ndm_sdpa");
    must(ndm_scope_end(s, 0, NULL) == NDM_OK, "scope");
    return bench_now() - t0;
}

/* The two products alone: scores = q k^T, then scores v. */
static double attn_matmuls(void *p)
{
    attn_ctx *c = p;
    double t0 = bench_now();
    ndm_manager s = ndm_scope_begin(c->m, "matmuls");
    must(ndm_matmul(ndm_matmul(c->q, c->kt), c->v).id != 0, "ndm_matmul");
    must(ndm_scope_end(s, 0, NULL) == NDM_OK, "scope");
    return bench_now() - t0;
}

/* The products and an unmasked softmax between them: what is left of
 * sdpa when its masking is fused away (the most a fused mask could save). */
static double attn_matmuls_softmax(void *p)
{
    attn_ctx *c = p;
    double t0 = bench_now();
    ndm_manager s = ndm_scope_begin(c->m, "matmuls");
    must(ndm_matmul(ndm_softmax(ndm_matmul(c->q, c->kt), -1), c->v).id != 0, "ndm_matmul");
    must(ndm_scope_end(s, 0, NULL) == NDM_OK, "scope");
    return bench_now() - t0;
}

void bench_ops_attention(bench_report *r)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-attention");
    ndm_rng g = ndm_rng_new(1);
    int n = r->o.quick ? 5 : 15;
    double t[3][BENCH_MAXSAMPLES];
    /* RMSNorm of 4096 rows of 512 */
    rms_ctx rc = {.m = m, .rows = 4096, .cols = 512};
    rc.x = ndm_normal(m, &g, NDM_F32, 0.0, 1.0, NDM_SHAPE(rc.rows, rc.cols));
    rc.w = ndm_uniform(m, &g, NDM_F32, 0.5, 1.5, NDM_SHAPE(rc.cols));
    must(rc.x.id && rc.w.id, "inputs");
    rc.xp = ndm_array_data(rc.x), rc.wp = ndm_array_data(rc.w);
    rc.out = malloc((size_t)(rc.rows * rc.cols) * sizeof(float));
    must(rc.out != NULL, "malloc");
    bench_interleave(3, (bench_sample_fn[]){rms_composed, rms_fused_loop, rms_parts},
                     (void *[]){&rc, &rc, &rc}, n, t);
    bench_add_paired_time(r, "rms_norm_f32_4096x512_us", "us", 1e6,
                          "a fused one-pass loop over the rows, 1 thread", t[0], t[1], n);
    bench_add_paired_time(r, "rms_norm_f32_4096x512_us_vs_composed", "us", 1e6,
                          "the same as four operations (mul, mean, add+rsqrt, two muls)", t[0],
                          t[2], n);
    free(rc.out);
    /* causal attention, [batch 4, heads 8, seq 128, dim 64] */
    attn_ctx ac = {.m = m};
    ac.q = ndm_normal(m, &g, NDM_F32, 0.0, 1.0, NDM_SHAPE(4, 8, 128, 64));
    ac.k = ndm_normal(m, &g, NDM_F32, 0.0, 1.0, NDM_SHAPE(4, 8, 128, 64));
    ac.v = ndm_normal(m, &g, NDM_F32, 0.0, 1.0, NDM_SHAPE(4, 8, 128, 64));
    ac.kt = ndm_swapaxes(ac.k, -2, -1);
    must(ac.q.id && ac.k.id && ac.v.id && ac.kt.id, "inputs");
    bench_interleave(3, (bench_sample_fn[]){attn_sdpa, attn_matmuls, attn_matmuls_softmax},
                     (void *[]){&ac, &ac, &ac}, n, t);
    bench_add_paired_time(r, "sdpa_causal_f32_4x8x128x64_us", "us", 1e6,
                          "its two matmuls alone (q k^T, then by v)", t[0], t[1], n);
    bench_add_paired_time(r, "sdpa_causal_f32_4x8x128x64_us_vs_unmasked", "us", 1e6,
                          "the matmuls with an unmasked softmax between them", t[0], t[2], n);
    char note[200];
    snprintf(note, sizeof note,
             "attention: ndm_sdpa is composed of existing operations; "
             "median of %d alternating pairs",
             n);
    bench_note(r, note);
    must(ndm_manager_close(m) == NDM_OK, "close");
}
