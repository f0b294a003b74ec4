/* The sections of bench/ops, one per operation family; each adds its
 * figures (with the anchors it measures in the same run) to the report. */
#ifndef NDM_BENCH_OPS_SECTIONS_H
#define NDM_BENCH_OPS_SECTIONS_H

#include <stdbool.h>

#include "../bench.h"

/* add, mul, relu on 64M floats against a STREAM triad loop, on 1 and 2
 * threads, and the overhead of one small operation. */
void bench_ops_elementwise(bench_report *r);
/* Reductions: sum over 64M floats (GB/s) against a plain read loop. */
void bench_ops_reduce(bench_report *r);
/* matmul f32 against a direct call of the GEMM provider and against peak. */
void bench_ops_linalg(bench_report *r);
/* The f32 FMA peak in GFLOP/s of `threads` threads running at once (peak.c),
 * measured with the widest vectors this CPU has; *isa names them. */
double bench_fma_peak(int threads, const char **isa);
/* C = op(A) @ op(B) in f32 through the build's GEMM provider, row-major,
 * op(X) = X^T when its flag is set: the anchor of the linalg and conv
 * sections (linalg.c). False when the build has no provider. */
bool bench_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
                 int ldb, float *c, int ldc);

/* conv2d and its input and weight gradients on a Fashion-MNIST-sized batch,
 * each against the GEMM it unfolds to. */
void bench_ops_conv(bench_report *r);

/* RMSNorm and causal attention as composed, against a fused loop and
 * against their matmuls alone (attention.c). */
void bench_ops_attention(bench_report *r);

#endif
