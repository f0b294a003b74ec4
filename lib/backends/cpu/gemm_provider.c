/* The glue to the build's GEMM provider (OpenBLAS, BLIS, or none): which
 * products it takes, and how its API is called with ndm's strides. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "gemm.h"
#include "gemm_provider.h"
#include "ndm/config.h"

#if NDM_HAVE_OPENBLAS
#include <cblas.h>
#elif NDM_HAVE_BLIS
#include <blis.h>
#endif

#if NDM_HAVE_OPENBLAS || NDM_HAVE_BLIS
/* Copy an r x c matrix into a fresh row-major buffer: kernel scratch from
 * ndm's allocator (NULL with the failure recorded), given back with
 * scratch_give. */
static void *copy_dense(size_t es, int64_t r, int64_t c, const void *src, int64_t rs, int64_t cs)
{
    void *p;
    if (ndm__scratch_alloc(NDM_DEVICE_CPU, 0, (size_t)(r * c) * es, &p) < 0)
        return NULL;
    char *d = p;
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++)
            memcpy(d + (size_t)(i * c + j) * es, (const char *)src + (i * rs + j * cs) * (int64_t)es,
                   es);
    return d;
}

static void scratch_give(void *p) { ndm__scratch_free(NDM_DEVICE_CPU, 0, p); }
#endif

#if NDM_HAVE_OPENBLAS
/* How a row-major BLAS reads an r x c matrix with strides (rs, cs): 1 as is,
 * 2 transposed, 0 not at all. *ld gets the leading dimension. Sizes of 1
 * leave their stride free. */
static int blas_layout(int64_t r, int64_t c, int64_t rs, int64_t cs, int64_t *ld)
{
    int64_t lr = r > 1 ? r : 1, lc = c > 1 ? c : 1;
    if ((cs == 1 || c == 1) && (r == 1 || rs >= lc)) {
        *ld = r == 1 ? lc : rs;
        return *ld <= INT_MAX ? 1 : 0;
    }
    if ((rs == 1 || r == 1) && (c == 1 || cs >= lr)) {
        *ld = c == 1 ? lr : cs;
        return *ld <= INT_MAX ? 2 : 0;
    }
    return 0;
}

/* OpenBLAS runs a product on the calling thread when m * n * k is at most
 * 65536 * GEMM_MULTITHREAD_THRESHOLD (4 unless its build changed it), and
 * on its own thread pool above that: a pool that spins (sched_yield) after
 * each product on the cores ndm's pool works on, and whose size the
 * library may not change. Cut into tiles below that bound, the provider ran
 * slower than ndm's kernel on every shape of a training step we measured;
 * so products between that bound and PROVIDER_OWN_POOL_MNK go to ndm's
 * kernel on ndm's pool, and only larger ones, where the provider's speed
 * pays for its pool, to the provider whole. */
#define PROVIDER_ONE_THREAD_MNK 262144.0
#define PROVIDER_OWN_POOL_MNK 67108864.0

static bool provider_takes(int64_t m, int64_t n, int64_t k)
{
    double mnk = (double)m * (double)n * (double)k;
    return mnk <= PROVIDER_ONE_THREAD_MNK || mnk > PROVIDER_OWN_POOL_MNK;
}

/* 1 when OpenBLAS did the product, 0 when it cannot take these operands,
 * or a negative status. */
int ndm__gemm_provider_run(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                           void *c, int64_t rsc, int64_t csc, bool acc)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return 0;
    int64_t ldc;
    if (blas_layout(m, n, rsc, csc, &ldc) != 1)
        return 0;
    size_t es = ndm_dtype_size(dt);
    void *ta = NULL, *tb = NULL;
    int64_t lda = 0, ldb = 0;
    int la = blas_layout(m, k, rsa, csa, &lda), lb = blas_layout(k, n, rsb, csb, &ldb);
    /* A layout the provider cannot read is copied when the product is big
     * enough for the copy (O(mk)) to be small beside it (O(mnk)). */
    if ((!la || !lb) && (double)m * (double)n * (double)k < 2.0e6)
        return 0;
    if (!la) {
        ta = copy_dense(es, m, k, a, rsa, csa);
        if (!ta)
            return ndm_last_status();
        a = ta;
        la = 1;
        lda = k > 1 ? k : 1;
    }
    if (!lb) {
        tb = copy_dense(es, k, n, b, rsb, csb);
        if (!tb) {
            scratch_give(ta);
            return ndm_last_status();
        }
        b = tb;
        lb = 1;
        ldb = n > 1 ? n : 1;
    }
    enum CBLAS_TRANSPOSE ta_ = la == 1 ? CblasNoTrans : CblasTrans;
    enum CBLAS_TRANSPOSE tb_ = lb == 1 ? CblasNoTrans : CblasTrans;
    if (dt == NDM_F32)
        cblas_sgemm(CblasRowMajor, ta_, tb_, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b,
                    (int)ldb, acc ? 1.0f : 0.0f, c, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta_, tb_, (int)m, (int)n, (int)k, 1.0, a, (int)lda, b,
                    (int)ldb, acc ? 1.0 : 0.0, c, (int)ldc);
    scratch_give(ta);
    scratch_give(tb);
    return 1;
}
#elif NDM_HAVE_BLIS
/* BLIS reads any positive strides (general stride); sizes of 1 get a
 * stride that satisfies its checks. Zero and negative strides are copied. */
static bool blis_strides(int64_t r, int64_t c, int64_t *rs, int64_t *cs)
{
    if (r == 1)
        *rs = c > 1 ? c * (*cs > 0 ? *cs : 1) : 1;
    if (c == 1)
        *cs = 1;
    return *rs > 0 && *cs > 0;
}

int ndm__gemm_provider_run(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                           void *c, int64_t rsc, int64_t csc, bool acc)
{
    if (!blis_strides(m, n, &rsc, &csc))
        return 0;
    size_t es = ndm_dtype_size(dt);
    void *ta = NULL, *tb = NULL;
    if (!blis_strides(m, k, &rsa, &csa)) {
        ta = copy_dense(es, m, k, a, rsa, csa);
        if (!ta)
            return ndm_last_status();
        a = ta;
        rsa = k;
        csa = 1;
        blis_strides(m, k, &rsa, &csa);
    }
    if (!blis_strides(k, n, &rsb, &csb)) {
        tb = copy_dense(es, k, n, b, rsb, csb);
        if (!tb) {
            scratch_give(ta);
            return ndm_last_status();
        }
        b = tb;
        rsb = n;
        csb = 1;
        blis_strides(k, n, &rsb, &csb);
    }
    if (dt == NDM_F32) {
        float one = 1.0f, beta = acc ? 1.0f : 0.0f;
        bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (float *)a, rsa, csa,
                  (float *)b, rsb, csb, &beta, c, rsc, csc);
    } else {
        double one = 1.0, beta = acc ? 1.0 : 0.0;
        bli_dgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (double *)a, rsa, csa,
                  (double *)b, rsb, csb, &beta, c, rsc, csc);
    }
    scratch_give(ta);
    scratch_give(tb);
    return 1;
}

/* BLIS runs on the calling thread unless its user asks for more. */
static bool provider_takes(int64_t m, int64_t n, int64_t k)
{
    (void)m, (void)n, (void)k;
    return true;
}
#endif

bool ndm__gemm_uses_provider(int64_t m, int64_t n, int64_t k)
{
#if NDM_HAVE_OPENBLAS || NDM_HAVE_BLIS
    return provider_takes(m, n, k);
#else
    (void)m, (void)n, (void)k;
    return false;
#endif
}
