/* Strided iteration for the CUDA kernels: operands that share a shape are
 * coalesced on the host, and a kernel turns each flat index into element
 * offsets of up to NDM__CU_MAX_OPS operands. */
#ifndef NDM_CUDA_ITER_CUH
#define NDM_CUDA_ITER_CUH

#include <stdlib.h>
#include <string.h>

#include "common.cuh"

/* Host side: size-1 axes are dropped and axes that every operand walks as one
 * are merged, so most operations become one flat loop. The kernel decomposes
 * each flat index over at most NDM__CU_DIMS axes (the geometry is passed by
 * value); a deeper iteration runs one launch per index of its outer axes. */

#define NDM__CU_DIMS 10
#define NDM__CU_MAX_OPS 4

typedef struct ndm__cu_geom {
    int ndim;
    int64_t shape[NDM__CU_DIMS];
    int64_t stride[NDM__CU_MAX_OPS][NDM__CU_DIMS]; /* in elements, per operand */
} ndm__cu_geom;

/* Coalesce (ndim, shape, strides of nops operands) into out arrays of at
 * least ndim entries; returns the new rank. */
static inline int ndm__cu_coalesce(int ndim, const int64_t *shape, int nops,
                                   const int64_t *const *strides, int64_t *oshape,
                                   int64_t *const *ostr)
{
    int r = 0; /* built innermost first, reversed at the end */
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] == 1)
            continue;
        bool merge = r > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = strides[k][i] == oshape[r - 1] * ostr[k][r - 1];
        if (merge) {
            oshape[r - 1] *= shape[i];
            continue;
        }
        oshape[r] = shape[i];
        for (int k = 0; k < nops; k++)
            ostr[k][r] = strides[k][i];
        r++;
    }
    for (int a = 0, b = r - 1; a < b; a++, b--) {
        int64_t t = oshape[a];
        oshape[a] = oshape[b];
        oshape[b] = t;
        for (int k = 0; k < nops; k++) {
            t = ostr[k][a];
            ostr[k][a] = ostr[k][b];
            ostr[k][b] = t;
        }
    }
    return r;
}

/* Run launch(geom, ptrs, n) over a strided iteration of nops operands
 * (1..NDM__CU_MAX_OPS; element sizes esize, data pointers data) that share
 * `shape`: ptrs[k] is operand k's pointer for this launch, n its element
 * count. Nothing runs for an empty shape. */
template <class F>
static ndm_status ndm__cu_run_strided(int ndim, const int64_t *shape, int nops,
                                      char *const *data, const int64_t *const *strides,
                                      const size_t *esize, F launch)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    if (n == 0)
        return NDM_OK;
    /* shape, the operands' strides and the outer odometer, ndim each */
    enum { SLOTS = NDM__CU_MAX_OPS + 2 };
    int64_t small[SLOTS * 16];
    int64_t *buf = ndim <= 16 ? small
                              : (int64_t *)malloc(SLOTS * (size_t)ndim * sizeof(int64_t));
    if (!buf)
        return ndm__cuda_fail(NDM_E_OOM, "no memory for a rank-%d iteration", ndim);
    int cap = ndim <= 16 ? 16 : ndim;
    int64_t *cs = buf, *cst[NDM__CU_MAX_OPS];
    for (int k = 0; k < NDM__CU_MAX_OPS; k++)
        cst[k] = buf + (1 + k) * cap;
    int r = ndm__cu_coalesce(ndim, shape, nops, strides, cs, cst);
    ndm__cu_geom g;
    memset(&g, 0, sizeof g);
    int outer = r > NDM__CU_DIMS ? r - NDM__CU_DIMS : 0;
    g.ndim = r - outer;
    int64_t inner_n = 1;
    for (int i = 0; i < g.ndim; i++) {
        g.shape[i] = cs[outer + i];
        inner_n *= g.shape[i];
        for (int k = 0; k < nops; k++)
            g.stride[k][i] = cst[k][outer + i];
    }
    int64_t *idx = buf + (SLOTS - 1) * cap;
    for (int i = 0; i < outer; i++)
        idx[i] = 0;
    ndm_status st = NDM_OK;
    for (;;) {
        char *p[NDM__CU_MAX_OPS] = {NULL, NULL, NULL, NULL};
        for (int k = 0; k < nops; k++)
            p[k] = data[k];
        for (int i = 0; i < outer; i++)
            for (int k = 0; k < nops; k++)
                p[k] += idx[i] * cst[k][i] * (int64_t)esize[k];
        st = launch(g, p, inner_n);
        if (st < 0)
            break;
        int i = outer - 1;
        while (i >= 0 && ++idx[i] == cs[i])
            idx[i--] = 0;
        if (i < 0)
            break;
    }
    if (buf != small)
        free(buf);
    return st;
}

/* The flat index of the grid-stride loop in I (uint32_t when n < 2^31, so no
 * step overflows; int64_t otherwise). */
#define NDM__CU_LOOP(I, i, n)                                                   \
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < (I)(n);      \
         i += (I)gridDim.x * (I)blockDim.x)

/* The element offsets of the first NOPS operands at flat index i over g. */
template <int NOPS, class I>
__host__ __device__ __forceinline__ void ndm__cu_offsets(const ndm__cu_geom &g, I i,
                                                         int64_t *off)
{
    for (int k = 0; k < NOPS; k++)
        off[k] = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
        I len = (I)g.shape[d];
        I c = i % len;
        i /= len;
        for (int k = 0; k < NOPS; k++)
            off[k] += (int64_t)c * g.stride[k][d];
    }
}

#endif
