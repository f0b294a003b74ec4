/* Host execution's cuBLAS: GEMMs on the CPU GEMM provider (OpenBLAS's cblas)
 * or a plain loop, queued on the handle's stream like any device work (test-only). */
#include <stdio.h>

#include "cublas_v2.h"
#include "hx.h"

#ifdef NDM_HX_CBLAS
#include <cblas.h>
#endif

struct ndm__hx_cublas {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
    int device = 0;
};

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (!h)
        return CUBLAS_STATUS_INVALID_VALUE;
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (ndm__hx::check_alive(d) != cudaSuccess)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new ndm__hx_cublas;
    (*h)->device = d;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s)
        return CUBLAS_STATUS_INVALID_VALUE;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = h->math;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetPointerMode(cublasHandle_t h, cublasPointerMode_t *mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = h->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes)
{
    (void)workspace, (void)bytes;
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

struct status_text {
    cublasStatus_t s;
    const char *name, *text;
};
static const status_text status_texts[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "license error"},
};

extern "C" const char *cublasGetStatusName(cublasStatus_t s)
{
    for (const status_text &t : status_texts)
        if (t.s == s)
            return t.name;
    return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    for (const status_text &t : status_texts)
        if (t.s == s)
            return t.text;
    return "unknown error";
}

namespace {

/* C = alpha op(A) op(B) + beta C, column-major; beta == 0 never reads C. */
template <class T>
void gemm_loop(bool ta, bool tb, int m, int n, int k, T alpha, const T *A, int lda, const T *B,
               int ldb, T beta, T *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            T acc = 0;
            for (int p = 0; p < k; p++) {
                T a = ta ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
                T b = tb ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
                acc += a * b;
            }
            T &c = C[(size_t)j * ldc + i];
            c = beta == (T)0 ? alpha * acc : alpha * acc + beta * c;
        }
}

void gemm1(bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef NDM_HX_CBLAS
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    gemm_loop(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void gemm1(bool ta, bool tb, int m, int n, int k, double alpha, const double *A, int lda,
           const double *B, int ldb, double beta, double *C, int ldc)
{
#ifdef NDM_HX_CBLAS
    cblas_dgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    gemm_loop(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* Whether a batch of column-major matrices (rows x cols, leading dimension
 * ld, batch stride s) lies in device memory. */
bool operand_on_device(const void *p, size_t es, int rows, int cols, int ld, long long s, int batch)
{
    if (!rows || !cols)
        return true;
    long long span = ((long long)(cols - 1) * ld + rows) * (long long)es;
    long long lo = 0, hi = span;
    long long last = (long long)(batch - 1) * s * (long long)es;
    if (last < 0)
        lo = last;
    else
        hi += last;
    return ndm__hx::is_device_range((const char *)p + lo, (size_t)(hi - lo));
}

template <class T>
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t opa, cublasOperation_t opb, int m, int n,
                    int k, const T *alpha, const T *A, int lda, long long sa, const T *B, int ldb,
                    long long sb, const T *beta, T *C, int ldc, long long sc, int batch)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((opa != CUBLAS_OP_N && opa != CUBLAS_OP_T && opa != CUBLAS_OP_C) ||
        (opb != CUBLAS_OP_N && opb != CUBLAS_OP_T && opb != CUBLAS_OP_C))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N; /* real: C is T */
    int ar = ta ? k : m, br = tb ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ar > 1 ? ar : 1) ||
        ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n || !batch)
        return CUBLAS_STATUS_SUCCESS;
    bool dev_scalars = h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
    T a = dev_scalars ? T(0) : *alpha, b = dev_scalars ? T(0) : *beta;
    int d = ndm__hx::stream_device(h->stream);
    /* A GPU faults on a host pointer after the call returns: the context
     * breaks, as it would there. */
    if ((k && (!operand_on_device(A, sizeof(T), ar, ta ? m : k, lda, sa, batch) ||
               !operand_on_device(B, sizeof(T), br, tb ? k : n, ldb, sb, batch))) ||
        !operand_on_device(C, sizeof(T), m, n, ldc, sc, batch)) {
        ndm__hx::break_device(d, "a cuBLAS GEMM operand is not in device memory");
        return CUBLAS_STATUS_SUCCESS;
    }
    cudaError_t e = ndm__hx::submit(h->stream, [=] {
        T al = dev_scalars ? *alpha : a, be = dev_scalars ? *beta : b;
        for (int i = 0; i < batch; i++)
            gemm1(ta, tb, m, n, k, al, A + i * sa, lda, B + i * sb, ldb, be, C + i * sc, ldc);
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta,
                                      cublasOperation_t tb, int m, int n, int k,
                                      const float *alpha, const float *A, int lda, const float *B,
                                      int ldb, const float *beta, float *C, int ldc)
{
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

extern "C" cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta,
                                      cublasOperation_t tb, int m, int n, int k,
                                      const double *alpha, const double *A, int lda,
                                      const double *B, int ldb, const double *beta, double *C,
                                      int ldc)
{
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

extern "C" cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
    long long sb, const float *beta, float *C, int ldc, long long sc, int batch)
{
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}

extern "C" cublasStatus_t cublasDgemmStridedBatched(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const double *alpha, const double *A, int lda, long long sa, const double *B, int ldb,
    long long sb, const double *beta, double *C, int ldc, long long sc, int batch)
{
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}

/* f32 and f64 only: the types must agree and the compute type match them. */
static int ex_kind(cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t c)
{
    if (at != bt || bt != ct)
        return -1;
    if (at == CUDA_R_32F && (c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
                             c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_FAST_16F ||
                             c == CUBLAS_COMPUTE_32F_FAST_16BF))
        return 32;
    if (at == CUDA_R_64F && (c == CUBLAS_COMPUTE_64F || c == CUBLAS_COMPUTE_64F_PEDANTIC))
        return 64;
    return -1;
}

extern "C" cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    switch (ex_kind(at, bt, ct, compute)) {
    case 32:
        return gemm(h, ta, tb, m, n, k, (const float *)alpha, (const float *)A, lda, sa,
                    (const float *)B, ldb, sb, (const float *)beta, (float *)C, ldc, sc, batch);
    case 64:
        return gemm(h, ta, tb, m, n, k, (const double *)alpha, (const double *)A, lda, sa,
                    (const double *)B, ldb, sb, (const double *)beta, (double *)C, ldc, sc, batch);
    }
    return h ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_NOT_INITIALIZED;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                                       cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType at, int lda,
                                       const void *B, cudaDataType bt, int ldb, const void *beta,
                                       void *C, cudaDataType ct, int ldc,
                                       cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0,
                                      beta, C, ct, ldc, 0, 1, compute, algo);
}
