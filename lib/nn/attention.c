/* Scaled dot-product attention, composed of matmul, the masks and softmax
 * and recorded as those parts; its temporaries live in a scope of the
 * output manager, so a step keeps only what backward needs. */
#include <math.h>

#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "module.h"

#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

/* q [..., L, E], k [..., S, E], v [..., S, Ev]: float, one dtype, their
 * batch axes broadcasting (matmul checks those); a mask, when given, bool
 * or that dtype (broadcasting to [..., L, S]: the where and add check it). */
static bool sdpa_inputs(ndm_array q, ndm_array k, ndm_array v, ndm_array mask, double scale,
                        const char *api, ndm__site site, int64_t *e)
{
    ndm__view vq, vk, vv, vm;
    char d1[160], d2[160], d3[160];
    if (!ndm__view_input(q, &vq, api, site) || !ndm__view_input(k, &vk, api, site) ||
        !ndm__view_input(v, &vv, api, site) || (mask.id && !ndm__view_input(mask, &vm, api, site)))
        return false;
    ndm_dtype t = vq.t.dtype;
    if (!ndm_dtype_is_float(t) || vk.t.dtype != t || vv.t.dtype != t ||
        (mask.id && vm.t.dtype != NDM_BOOL && vm.t.dtype != t)) {
        ndm__fail(NDM_E_DTYPE, api, site,
                  "q %s, k %s and v %s must share a float dtype, and a mask be bool or that "
                  "dtype",
                  ndm__view_desc(&vq, d1, sizeof d1), ndm__view_desc(&vk, d2, sizeof d2),
                  ndm__view_desc(&vv, d3, sizeof d3));
        return false;
    }
    int nq = vq.t.ndim, nk = vk.t.ndim, nv = vv.t.ndim;
    if (nq < 2 || nk < 2 || nv < 2 || vq.t.shape[nq - 1] != vk.t.shape[nk - 1] ||
        vk.t.shape[nk - 2] != vv.t.shape[nv - 2]) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "q %s, k %s and v %s must be [..., L, E], [..., S, E] and [..., S, Ev]",
                  ndm__view_desc(&vq, d1, sizeof d1), ndm__view_desc(&vk, d2, sizeof d2),
                  ndm__view_desc(&vv, d3, sizeof d3));
        return false;
    }
    if (!isfinite(scale)) {
        ndm__fail(NDM_E_INVALID, api, site, "scale must be finite (got %g)", scale);
        return false;
    }
    *e = vq.t.shape[nq - 1];
    return true;
}

NDM_API ndm_array ndm_sdpa_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array q, ndm_array k,
                                 ndm_array v, ndm_array mask, bool causal, double scale)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_sdpa";
    NDM__CALL_FRAME(api, site);
    int64_t e = 0;
    if (!sdpa_inputs(q, k, v, mask, scale, api, site, &e))
        return NDM_NULL_ARRAY;
    ndm_manager dst = ndm__output_for(out, q, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "sdpa");
    if (!s.id)
        return NDM_NULL_ARRAY;
    ndm_dtype t = ndm_array_dtype(q);
    double sc = scale != 0 ? scale : 1.0 / sqrt((double)e);
    /* the scale on q ([L, E]) rather than on the scores ([L, S]): one pass
     * over the larger array less */
    ndm_array scores = ndm_matmul_to_at(AT, ndm_mul_scalar_to_at(AT, q, sc),
                                        ndm_swapaxes_to_at(AT, k, -2, -1));
    int nd = ndm_array_ndim(scores);
    ndm_array ninf = ndm_full_at(NDM__SITE_ARGS(site), s, t, -INFINITY, 0, NULL);
    if (causal && scores.id) {
        /* position i sees j <= i, the top-left triangle as PyTorch's is_causal */
        ndm_array tri = ndm_tri_at(NDM__SITE_ARGS(site), s, NDM_BOOL, ndm_array_dim(scores, nd - 2),
                                   ndm_array_dim(scores, nd - 1), 0);
        scores = ndm_where_to_at(AT, tri, scores, ninf);
    }
    if (mask.id)
        scores = ndm_array_dtype(mask) == NDM_BOOL ? ndm_where_to_at(AT, mask, scores, ninf)
                                                   : ndm_add_to_at(AT, scores, mask);
    ndm_array y = ndm_matmul_to_at(AT, ndm_softmax_to_at(AT, scores, -1), v);
    if (ndm_scope_end_at(NDM__SITE_ARGS(site), s, y.id ? 1 : 0, &y) < 0)
        return NDM_NULL_ARRAY;
    return y;
}
