/* The CUDA module's matrix products, shared by matmul (linalg.cu) and the
 * convolutions (nn.cu): the per-device cuBLAS handle and a row-major GEMM. */
#ifndef NDM_CUDA_LINALG_CUH
#define NDM_CUDA_LINALG_CUH

#include <cublas_v2.h>

#include "common.cuh"

/* The cuBLAS handle of `device`, created on first use and bound to the
 * device's stream `s`; destroyed when the module unloads. Math mode is
 * CUBLAS_DEFAULT_MATH: f32 products stay f32 (never TF32). */
ndm_status ndm__cuda_blas(int device, cudaStream_t s, cublasHandle_t *out);

/* Report a failed cuBLAS call `what` on `device` (NDM_E_OOM for an
 * allocation failure, NDM_E_DEVICE otherwise). */
ndm_status ndm__cuda_blas_check(int device, cublasStatus_t e, const char *what);

/* C = op(A) @ op(B) (+ beta * C) for `batch` matrices, every matrix in
 * row-major storage: C is m x n with row stride ldc, op(A) m x k stored as A
 * (or as A's transpose when ta) with row stride lda, and so for B. The batch
 * strides sa, sb (0 allowed) and sc count elements. dt: NDM_F32 or NDM_F64. */
ndm_status ndm__cuda_gemm_rm(int device, cublasHandle_t h, ndm_dtype dt, bool ta, bool tb,
                             int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                             int64_t sa, const void *b, int64_t ldb, int64_t sb, double beta,
                             void *c, int64_t ldc, int64_t sc, int64_t batch);

/* How gemm reads an r x s matrix of strides (rs, cs): row-major with row
 * stride *ld, or (*trans) as the row-major storage of its transpose. False
 * when it can do neither (a step on both axes, a negative or 0 stride). */
bool ndm__cuda_gemm_layout(int64_t r, int64_t s, int64_t rs, int64_t cs, bool *trans, int64_t *ld);

#endif
