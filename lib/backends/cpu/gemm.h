/* Private interface of the CPU matrix-product kernels (gemm.c) and the small
 * helpers they share with the reduction and convolution kernels. */
#ifndef NDM_CPU_GEMM_H
#define NDM_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ndm/dtype.h"
#include "ndm/status.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NDM__CPU_X86 1
#else
#define NDM__CPU_X86 0
#endif

/* f16 and bf16 loads without a call per element. f16 subnormals are
 * exact: a 10-bit integer times 2^-24. */
static inline float ndm__cpu_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t bits;
    if (em >= 0x7c00u) {
        bits = 0x7f800000u | ((em & 0x3ffu) << 13);
    } else if (em >= 0x0400u) {
        bits = (em << 13) + ((uint32_t)(127 - 15) << 23);
    } else {
        float f = (float)em * 5.9604644775390625e-08f;
        memcpy(&bits, &f, sizeof bits);
    }
    bits |= sign;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float ndm__cpu_bf2f(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ndm__cpu_gemm flags. */
enum {
    NDM__GEMM_ACCUMULATE = 1u << 0, /* C += A @ B instead of C = A @ B */
    NDM__GEMM_NO_PROVIDER = 1u << 1, /* ndm's kernel only: safe inside a parallel region */
};

/* C (m x n) = A (m x k) @ B (k x n) for one matrix. Strides count elements:
 * A's and B's may be 0 or negative; C's must not alias A or B. dtype f32,
 * f64 or i64 (wrapping). The provider runs f32 and f64 when it can read the
 * layout (copies first otherwise) unless NDM__GEMM_NO_PROVIDER; ndm's
 * blocked kernel runs the rest on the thread pool (inline when called from a
 * pool thread). NDM_E_OOM when packing memory cannot be had. */
/* Profiling for bench/train: while on, the time spent in GEMM (the union of
 * the calls' intervals) accumulates; reading it does not stop it. Turning it
 * on resets it. */
void ndm__gemm_profile(bool on);
double ndm__gemm_profile_seconds(void);

ndm_status ndm__cpu_gemm(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                         int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                         void *c, int64_t rsc, int64_t csc, unsigned flags);
/* Whether a product of these sizes (f32 or f64, a layout the provider
 * reads, no NDM__GEMM_NO_PROVIDER) goes to the provider. With OpenBLAS:
 * those it runs on the calling thread (m * n * k <= 2^18) and those above
 * 2^26, where its own thread pool pays; the sizes between (a training
 * step's products) run ndm's kernel on ndm's pool, so that the provider's
 * threads neither take cores from that pool nor spin beside it. */
bool ndm__gemm_uses_provider(int64_t m, int64_t n, int64_t k);

/* The same with C = bias + A @ B: bias[i * sbias] starts row i (not with
 * NDM__GEMM_ACCUMULATE). ndm's kernel adds it as it writes C; the provider
 * path writes it into C first. */
ndm_status ndm__cpu_gemm_bias(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                              int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                              void *c, int64_t rsc, int64_t csc, const void *bias, int64_t sbias,
                              unsigned flags);

/* ndm's kernel with operands packed by the caller, on the calling thread:
 * a convolution packs its weights once per call and writes its unfolded
 * input straight into B's panels. A (m x k) packed by ndm__gemm_pack_a
 * into ndm__gemm_packed_a_bytes(dt, m, k) bytes, 64-byte aligned; the
 * layout depends only on dt, m and k. f32 and f64. */
size_t ndm__gemm_packed_a_bytes(ndm_dtype dt, int64_t m, int64_t k);
void ndm__gemm_pack_a(ndm_dtype dt, int64_t m, int64_t k, const void *a, int64_t rsa,
                      int64_t csa, void *dst);

/* Writes one panel of B: rows [p0, p0 + kc), columns [j0, j0 + cols)
 * (cols <= nr), as kc rows of nr values (row p at dst + (p - p0) * nr),
 * columns cols to nr - 1 zero. It may store up to nr values past the
 * panel's end: the driver leaves room, and panels are written in order. */
typedef void (*ndm__gemm_panel_fn)(void *ctx, void *dst, int64_t p0, int64_t kc, int64_t j0,
                                   int64_t cols, int nr);

/* A strided matrix as a panel source (ctx of ndm__gemm_matrix_panel). */
typedef struct ndm__gemm_matrix {
    const void *data;
    int64_t rs, cs;
    size_t es;
} ndm__gemm_matrix;
void ndm__gemm_matrix_panel(void *ctx, void *dst, int64_t p0, int64_t kc, int64_t j0,
                            int64_t cols, int nr);

/* C (m x n) = [bias +] A @ B, or C += A @ B with NDM__GEMM_ACCUMULATE (no
 * bias then): A packed as above, B's panels written by panel(ctx, ...)
 * as the product reaches them, each panel once per depth block. C's
 * strides as ndm__cpu_gemm's. NDM_E_OOM when the panel buffer cannot be
 * had (C is then partly written). */
ndm_status ndm__gemm_packed(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *ap,
                            ndm__gemm_panel_fn panel, void *ctx, void *c, int64_t rsc,
                            int64_t csc, const void *bias, int64_t sbias, unsigned flags);

#endif
