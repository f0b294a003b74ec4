/* Private interface of ndm's small-product kernels (small_gemm.c): products
 * with a few rows of C, read where A and B lie, and a linear layer's forward. */
#ifndef NDM_CPU_SMALL_GEMM_H
#define NDM_CPU_SMALL_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "../backend.h"

/* Products with at most this many rows of C take the small path. */
#define NDM__GEMM_SMALL_M 4

/* Dot-form products over a B of this many bytes or more alternate their
 * direction (ndm__gemm_small_next_reversed). */
#define NDM__GEMM_SMALL_ALTERNATE_BYTES ((int64_t)64 * 1024)

/* What is done to each C value as it is written, in this order:
 * v = (acc ? C : bias ? bias[i * sbias] : 0) + (A @ B)[i][j];
 * v += cbias[j * scbias] when cbias; v = v < 0 ? 0 : v when relu.
 * Each step rounds as the separate operation would (matmul, then add,
 * then relu), so fusing changes no bit of the result. */
typedef struct ndm__gemm_epi {
    bool acc;
    const void *bias; /* per row of C, or NULL */
    int64_t sbias;
    const void *cbias; /* per column of C (a linear layer's bias), or NULL */
    int64_t scbias;
    bool relu;
} ndm__gemm_epi;

/* C (m x n) = A (m x k) @ B (k x n) with the epilogue e, when m <=
 * NDM__GEMM_SMALL_M, the dtype is f32 or f64, k >= 1 and the layout is one
 * the kernels read directly (A's rows and B's columns contiguous, or B's
 * and C's rows contiguous); false, touching nothing, otherwise. Runs on the
 * thread pool when n * k is large. */
bool ndm__gemm_small(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, int64_t rsa,
                     int64_t csa, const void *b, int64_t rsb, int64_t csb, void *c, int64_t rsc,
                     int64_t csc, const ndm__gemm_epi *e);

/* Whether the calling thread's next dot-form product (B's columns
 * contiguous) over the B at b runs its groups of columns last to first.
 * Successive products over a B of 64 KiB or more alternate the direction,
 * per thread, so that the rows the last one read last, still in L2, come
 * first; the values are the same bits either way. */
bool ndm__gemm_small_next_reversed(const void *b);

/* The CPU backend's linear slot (linalg.h): y = x @ w^T + b, then relu. */
ndm_status ndm__cpu_linear(int device, const ndm__tensor *y, const ndm__tensor *x,
                           const ndm__tensor *w, const ndm__tensor *b, bool relu);

#endif
