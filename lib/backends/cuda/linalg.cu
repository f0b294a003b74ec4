/* The CUDA linear algebra family: batched matmul through cuBLAS for f32 and
 * f64 (transposed operands as gemm's transpose flags), a tiled kernel for i64. */
#include <limits.h>
#include <mutex>

#include "../linalg.h"
#include "iter.cuh"
#include "linalg.cuh"

/* ---- the cuBLAS handles ------------------------------------------------------ */

typedef struct ndm__cuda_blas_slot {
    std::mutex lock;
    cublasHandle_t h;
    cudaStream_t stream; /* the stream the handle is set to */
    bool made;
} ndm__cuda_blas_slot;

static ndm__cuda_blas_slot blas_slots[NDM__CUDA_MAX_DEVICES];

/* The handles go with the module: its destructors run before the CUDA
 * runtime's, which the module depends on. A failure here has nobody to
 * report to. */
static struct ndm__cuda_blas_reaper {
    ~ndm__cuda_blas_reaper()
    {
        for (int i = 0; i < NDM__CUDA_MAX_DEVICES; i++) {
            if (!blas_slots[i].made)
                continue;
            if (cudaSetDevice(i) == cudaSuccess)
                (void)cublasDestroy(blas_slots[i].h);
            (void)cudaGetLastError();
            blas_slots[i].made = false;
        }
    }
} blas_reaper;

ndm_status ndm__cuda_blas_check(int device, cublasStatus_t e, const char *what)
{
    if (e == CUBLAS_STATUS_SUCCESS)
        return NDM_OK;
    ndm_status st = e == CUBLAS_STATUS_ALLOC_FAILED ? NDM_E_OOM : NDM_E_DEVICE;
    return ndm__cuda_fail(st, "cuda:%d: %s failed: %s (%s)", device, what,
                          cublasGetStatusString(e), cublasGetStatusName(e));
}

#define NDM__BLAS_TRY(dev, call)                                                \
    do {                                                                        \
        cublasStatus_t e_ = (call);                                             \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                        \
            return ndm__cuda_blas_check((dev), e_, #call);                      \
    } while (0)

ndm_status ndm__cuda_blas(int device, cudaStream_t s, cublasHandle_t *out)
{
    ndm__cuda_blas_slot *b = &blas_slots[device];
    std::lock_guard<std::mutex> g(b->lock);
    if (!b->made) {
        cublasHandle_t h;
        NDM__BLAS_TRY(device, cublasCreate(&h));
        /* Default math: no TF32 and no reduced-precision reductions, so an
         * f32 product is computed in f32 as on the CPU. */
        cublasStatus_t e = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
        if (e == CUBLAS_STATUS_SUCCESS)
            e = cublasSetStream(h, s);
        if (e != CUBLAS_STATUS_SUCCESS) {
            (void)cublasDestroy(h);
            return ndm__cuda_blas_check(device, e, "setting up the cuBLAS handle");
        }
        b->h = h;
        b->stream = s;
        b->made = true;
    } else if (b->stream != s) {
        NDM__BLAS_TRY(device, cublasSetStream(b->h, s));
        b->stream = s;
    }
    *out = b->h;
    return NDM_OK;
}

ndm_status ndm__cuda_gemm_rm(int device, cublasHandle_t h, ndm_dtype dt, bool ta, bool tb,
                             int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                             int64_t sa, const void *b, int64_t ldb, int64_t sb, double beta,
                             void *c, int64_t ldc, int64_t sc, int64_t batch)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX || batch > INT_MAX)
        return ndm__cuda_fail(NDM_E_UNSUPPORTED,
                              "cuda:%d: a matrix product of %lld x %lld x %lld (leading "
                              "dimensions %lld, %lld, %lld; %lld matrices) is past cuBLAS's "
                              "32-bit sizes",
                              device, (long long)m, (long long)n, (long long)k, (long long)lda,
                              (long long)ldb, (long long)ldc, (long long)batch);
    /* cuBLAS is column-major: a row-major C is a column-major C^T, and
     * C^T = op(B)^T op(A)^T, where each row-major operand read as
     * column-major already is its own transpose. */
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int M = (int)n, N = (int)m, K = (int)k;
    if (dt == NDM_F32) {
        const float one = 1.0f, bf = (float)beta;
        if (batch == 1)
            NDM__BLAS_TRY(device, cublasSgemm(h, opa, opb, M, N, K, &one, (const float *)b,
                                              (int)ldb, (const float *)a, (int)lda, &bf,
                                              (float *)c, (int)ldc));
        else
            NDM__BLAS_TRY(device, cublasSgemmStridedBatched(
                                      h, opa, opb, M, N, K, &one, (const float *)b, (int)ldb,
                                      (long long)sb, (const float *)a, (int)lda, (long long)sa,
                                      &bf, (float *)c, (int)ldc, (long long)sc, (int)batch));
    } else {
        const double one = 1.0;
        if (batch == 1)
            NDM__BLAS_TRY(device, cublasDgemm(h, opa, opb, M, N, K, &one, (const double *)b,
                                              (int)ldb, (const double *)a, (int)lda, &beta,
                                              (double *)c, (int)ldc));
        else
            NDM__BLAS_TRY(device, cublasDgemmStridedBatched(
                                      h, opa, opb, M, N, K, &one, (const double *)b, (int)ldb,
                                      (long long)sb, (const double *)a, (int)lda, (long long)sa,
                                      &beta, (double *)c, (int)ldc, (long long)sc, (int)batch));
    }
    return NDM_OK;
}

/* ---- layouts ------------------------------------------------------------------ */

bool ndm__cuda_gemm_layout(int64_t r, int64_t s, int64_t rs, int64_t cs, bool *trans, int64_t *ld)
{
    int64_t s1 = s > 1 ? s : 1, r1 = r > 1 ? r : 1;
    if ((cs == 1 || s == 1) && (r == 1 || rs >= s1)) {
        *trans = false;
        *ld = r == 1 ? s1 : rs;
        return true;
    }
    if ((rs == 1 || r == 1) && (s == 1 || cs >= r1)) {
        *trans = true;
        *ld = s == 1 ? r1 : cs;
        return true;
    }
    return false;
}

/* An operand as gemm will read it: maybe a dense copy of the original. */
typedef struct mm_operand {
    const ndm__tensor *t; /* the caller's */
    char *data;
    int64_t strides[NDM__CU_DIMS + 2];
    bool copied;
} mm_operand;

/* A C-contiguous copy of x into scratch, keeping its 0-stride batch axes
 * at 0 (a broadcast batch is copied once). */
static ndm_status mm_dense(int device, cudaStream_t s, const ndm__tensor *x, mm_operand *o)
{
    int nd = x->ndim;
    int64_t shape[NDM__CU_DIMS + 2];
    size_t es = ndm__cuda_host->dtype_size(x->dtype);
    int64_t count = 1;
    for (int i = nd - 1; i >= 0; i--) {
        bool bcast = i < nd - 2 && x->strides[i] == 0;
        shape[i] = bcast ? 1 : x->shape[i];
        o->strides[i] = bcast ? 0 : count;
        count *= shape[i];
    }
    void *p = NULL;
    ndm_status st = ndm__cu_scratch_get(device, s, (size_t)count * es, &p, "a dense operand copy");
    if (st < 0)
        return st;
    int64_t dstr[NDM__CU_DIMS + 2], run = 1;
    for (int i = nd - 1; i >= 0; i--) {
        dstr[i] = run;
        run *= shape[i];
    }
    ndm__tensor dst = {p, x->dtype, nd, shape, dstr};
    ndm__tensor src = {x->data, x->dtype, nd, shape, x->strides};
    st = ndm__cuda_backend.copy(device, &dst, &src);
    if (st < 0) {
        (void)ndm__cu_scratch_put(device, s, p);
        return st;
    }
    o->data = (char *)p;
    o->copied = true;
    return NDM_OK;
}

/* ---- the i64 kernel ----------------------------------------------------------- */

#define NDM__MM_TILE 16
#ifdef NDM__CUDA_HOST_EXEC
#define NDM__MM_GRID_CAP 4
#else
#define NDM__MM_GRID_CAP 1024
#endif

/* One 16 x 16 tile of C per block and step, over tiles of A and B in shared
 * memory; products wrap (unsigned arithmetic). Operands are read through
 * their strides: no layout needs a copy. */
__global__ void ndm__k_matmul_i64(ndm__cu_geom g, int64_t nbatch, int64_t m, int64_t n,
                                  int64_t k, int64_t *c, int64_t rsc, int64_t csc,
                                  const int64_t *a, int64_t rsa, int64_t csa, const int64_t *b,
                                  int64_t rsb, int64_t csb)
{
    __shared__ uint64_t ta[NDM__MM_TILE][NDM__MM_TILE + 1];
    __shared__ uint64_t tb[NDM__MM_TILE][NDM__MM_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t bz = blockIdx.z; bz < nbatch; bz += gridDim.z) {
        int64_t off[3];
        ndm__cu_offsets<3, int64_t>(g, bz, off);
        for (int64_t r0 = (int64_t)blockIdx.y * NDM__MM_TILE; r0 < m;
             r0 += (int64_t)gridDim.y * NDM__MM_TILE)
            for (int64_t c0 = (int64_t)blockIdx.x * NDM__MM_TILE; c0 < n;
                 c0 += (int64_t)gridDim.x * NDM__MM_TILE) {
                int64_t row = r0 + ty, col = c0 + tx;
                uint64_t acc = 0;
                for (int64_t k0 = 0; k0 < k; k0 += NDM__MM_TILE) {
                    ta[ty][tx] = row < m && k0 + tx < k
                                     ? (uint64_t)a[off[1] + row * rsa + (k0 + tx) * csa]
                                     : 0;
                    tb[ty][tx] = k0 + ty < k && col < n
                                     ? (uint64_t)b[off[2] + (k0 + ty) * rsb + col * csb]
                                     : 0;
                    __syncthreads();
                    for (int kk = 0; kk < NDM__MM_TILE; kk++)
                        acc += ta[ty][kk] * tb[kk][tx];
                    __syncthreads();
                }
                if (row < m && col < n)
                    c[off[0] + row * rsc + col * csc] = (int64_t)acc;
            }
    }
}

static unsigned mm_cap(int64_t v)
{
    return (unsigned)(v < 1 ? 1 : v > NDM__MM_GRID_CAP ? NDM__MM_GRID_CAP : v);
}

static ndm_status matmul_i64(int device, cudaStream_t s, const ndm__tensor *c,
                             const ndm__tensor *a, const ndm__tensor *b, int64_t m, int64_t n,
                             int64_t k)
{
    int nd = c->ndim, nb = nd - 2;
    char *data[3] = {(char *)c->data, (char *)a->data, (char *)b->data};
    const int64_t *strides[3] = {c->strides, a->strides, b->strides};
    size_t es[3] = {8, 8, 8};
    const int64_t *sc = c->strides + nb, *sa = a->strides + nb, *sb = b->strides + nb;
    return ndm__cu_run_strided(nb, c->shape, 3, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p,
                                   int64_t batches) -> ndm_status {
        dim3 grid(mm_cap((n + NDM__MM_TILE - 1) / NDM__MM_TILE),
                  mm_cap((m + NDM__MM_TILE - 1) / NDM__MM_TILE), mm_cap(batches));
        dim3 block(NDM__MM_TILE, NDM__MM_TILE);
        NDM__LAUNCH(grid, block, 0, s, ndm__k_matmul_i64)(
            g, batches, m, n, k, (int64_t *)p[0], sc[0], sc[1], (const int64_t *)p[1], sa[0],
            sa[1], (const int64_t *)p[2], sb[0], sb[1]);
        NDM__CUDA_LAUNCHED(device, "the i64 matmul kernel");
        return NDM_OK;
    });
}

/* ---- matmul -------------------------------------------------------------------- */

/* c = a @ b through cuBLAS, every operand readable by gemm (copied if not):
 * the batch axes collapse as far as the three operands' strides allow; the
 * innermost remaining one is gemm's strided batch, any outer ones a loop. */
static ndm_status matmul_blas(int device, cudaStream_t s, const ndm__tensor *c,
                              const ndm__tensor *a, const ndm__tensor *b, int64_t m, int64_t n,
                              int64_t k)
{
    int nd = c->ndim, nb = nd - 2;
    if (nb > NDM__CU_DIMS)
        return ndm__cuda_fail(NDM_E_UNSUPPORTED, "cuda:%d: matmul of rank %d (at most %d)",
                              device, nd, NDM__CU_DIMS + 2);
    cublasHandle_t h;
    ndm_status st = ndm__cuda_blas(device, s, &h);
    if (st < 0)
        return st;
    mm_operand ops[3] = {{c, (char *)c->data, {0}, false},
                         {a, (char *)a->data, {0}, false},
                         {b, (char *)b->data, {0}, false}};
    bool tr[3];
    int64_t ld[3];
    for (int i = 0; i < 3 && st >= 0; i++) {
        const ndm__tensor *t = ops[i].t;
        int64_t r = t->shape[nd - 2], cols = t->shape[nd - 1];
        memcpy(ops[i].strides, t->strides, (size_t)nd * sizeof(int64_t));
        if (ndm__cuda_gemm_layout(r, cols, t->strides[nd - 2], t->strides[nd - 1], &tr[i], &ld[i]))
            continue;
        /* Any other layout goes through a dense copy (for c: computed there,
         * copied back at the end). */
        st = mm_dense(device, s, t, &ops[i]);
        if (st >= 0)
            (void)ndm__cuda_gemm_layout(r, cols, ops[i].strides[nd - 2],
                                        ops[i].strides[nd - 1], &tr[i], &ld[i]);
    }
    if (st >= 0) {
        size_t es = ndm__cuda_host->dtype_size(c->dtype);
        /* A transposed c: c^T = b^T a^T, with the roles of a and b swapped. */
        bool swap = tr[0];
        int ia = swap ? 2 : 1, ib = swap ? 1 : 2;
        bool ta = swap ? !tr[2] : tr[1], tb = swap ? !tr[1] : tr[2];
        int64_t M = swap ? n : m, N = swap ? m : n;
        int64_t oshape[NDM__CU_DIMS], ost[3][NDM__CU_DIMS];
        int64_t *ostr[3] = {ost[0], ost[1], ost[2]};
        const int64_t *istr[3] = {ops[0].strides, ops[ia].strides, ops[ib].strides};
        int r = ndm__cu_coalesce(nb, c->shape, 3, istr, oshape, ostr);
        int64_t inner = r ? oshape[r - 1] : 1;
        int64_t idx[NDM__CU_DIMS] = {0};
        for (;;) {
            int64_t off[3] = {0, 0, 0};
            for (int d = 0; d < r - 1; d++)
                for (int q = 0; q < 3; q++)
                    off[q] += idx[d] * ost[q][d];
            st = ndm__cuda_gemm_rm(device, h, c->dtype, ta, tb, M, N, k,
                                   ops[ia].data + off[1] * (int64_t)es, ld[ia],
                                   r ? ost[1][r - 1] : 0, ops[ib].data + off[2] * (int64_t)es,
                                   ld[ib], r ? ost[2][r - 1] : 0, 0.0,
                                   ops[0].data + off[0] * (int64_t)es, ld[0],
                                   r ? ost[0][r - 1] : 0, inner);
            if (st < 0)
                break;
            int d = r - 2;
            while (d >= 0 && ++idx[d] == oshape[d])
                idx[d--] = 0;
            if (d < 0)
                break;
        }
    }
    if (st >= 0 && ops[0].copied) {
        ndm__tensor src = {ops[0].data, c->dtype, nd, c->shape, ops[0].strides};
        st = ndm__cuda_backend.copy(device, c, &src);
    }
    for (int i = 0; i < 3; i++) {
        ndm_status fs = ops[i].copied ? ndm__cu_scratch_put(device, s, ops[i].data) : NDM_OK;
        if (st >= 0 && fs < 0)
            st = fs;
    }
    return st;
}

static ndm_status cuda_matmul(int device, const ndm__tensor *c, const ndm__tensor *a,
                              const ndm__tensor *b)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = c->ndim;
    int64_t m = c->shape[nd - 2], n = c->shape[nd - 1], k = a->shape[nd - 1];
    for (int i = 0; i < nd; i++)
        if (c->shape[i] == 0)
            return NDM_OK;
    if (k == 0)
        return ndm__cuda_backend.fill(device, c, 0.0);
    switch (c->dtype) {
    case NDM_F32:
    case NDM_F64:
        return matmul_blas(device, s, c, a, b, m, n, k);
    case NDM_I64:
        return matmul_i64(device, s, c, a, b, m, n, k);
    default:
        return ndm__cuda_fail(NDM_E_DTYPE, "cuda:%d: matmul in %d: f32, f64 or i64 only",
                              device, (int)c->dtype);
    }
}

extern "C" const struct ndm__backend_linalg ndm__cuda_linalg = {
    .matmul = cuda_matmul,
    .linear = NULL, /* a linear layer runs as matmul, add and relu here */
};
