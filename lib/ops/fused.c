/* Fused operations of the training step and of inference: validation, the
 * output rule and the fallback to the composed operations around the
 * backend's kernels. */
#include <stdint.h>

#include "../backends/linalg.h"
#include "autograd.h"
#include "elementwise.h"
#include "fused.h"
#include "supports.h"

static bool same_layout(const ndm__array *a, const ndm__array *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    ndm_device da = a->storage->device, db = b->storage->device;
    return da.type == db.type && da.index == db.index;
}

static bool fusable_dtype(ndm_dtype t)
{
    return t == NDM_F32 || t == NDM_F64;
}

ndm_array ndm__relu_grad(ndm_array hg, ndm_array hx)
{
    NDM__OP_GUARD();
    static const char api[] = "ndm_backward";
    ndm__site site = {__FILE__, __func__, __LINE__};
    /* A lookup that fails here is repeated, and reported, by the fallback. */
    ndm__array *g = ndm__array_peek(hg);
    ndm__array *x = g ? ndm__array_peek(hx) : NULL;
    int64_t n = -1;
    const ndm__backend_ew *ew = NULL;
    int index = 0;
    if (x && !ndm__ag_on() && fusable_dtype(g->dtype) && same_layout(g, x) &&
        (n = ndm__ew_c_count(g)) >= 0 && ndm__ew_c_count(x) == n) {
        const ndm__backend *b = ndm__backend_for(g->storage->device.type);
        index = g->storage->device.index;
        ew = b && b->ew && b->ew->relu_grad_flat &&
                     NDM__BACKEND_RUNS(b, g->storage->device, NDM__OPS_EW, 0, "relu_grad_flat", 0,
                                       2, {g->dtype, x->dtype})
                 ? b->ew
                 : NULL;
    }
    if (!ew)
        return ndm_mul(hg, ndm_astype(ndm_gt_scalar(hx, 0.0), ndm_array_dtype(hg)));
    ndm__manager *m = ndm__output_record(NDM_OUTPUT_RULE, g, api, &site);
    ndm__array *o;
    ndm_array h;
    if (!m || !(h = ndm__array_new_in(&site, api, m, g->storage->device, g->dtype, g->ndim,
                                      g->shape, &o))
                   .id)
        return NDM_NULL_ARRAY;
    ndm_status st = ew->relu_grad_flat(index, g->dtype, ndm__ew_ptr(o), ndm__ew_ptr(g),
                                       ndm__ew_ptr(x), n);
    if (st < 0) {
        ndm__discard(h);
        return ndm_mul(hg, ndm_astype(ndm_gt_scalar(hx, 0.0), ndm_array_dtype(hg)));
    }
    return h;
}

/* The array of a handle when it has w's layout (C-contiguous, so no
 * broadcast view is ever written). */
static ndm__array *member(ndm_array h, const ndm__array *w, int64_t n)
{
    ndm__array *r = ndm__array_peek(h);
    return r && same_layout(r, w) && ndm__ew_c_count(r) == n ? r : NULL;
}

/* Do the bytes of a and b overlap? */
static bool overlap(const ndm__array *a, const ndm__array *b, int64_t n)
{
    uintptr_t pa = (uintptr_t)ndm__ew_ptr(a), pb = (uintptr_t)ndm__ew_ptr(b);
    size_t bytes = (size_t)n * ndm__ew_esize(a->dtype);
    return pa < pb + bytes && pb < pa + bytes;
}

ndm_status ndm__optim_fused(ndm__optim_args *a, ndm_array hw, ndm_array hg, ndm_array hm,
                            ndm_array hv)
{
    NDM__OP_GUARD();
    ndm__array *w = ndm__array_peek(hw);
    if (!w || !fusable_dtype(w->dtype))
        return NDM_E_UNSUPPORTED;
    int64_t n = ndm__ew_c_count(w);
    const ndm__backend *b = ndm__backend_for(w->storage->device.type);
    if (n < 0 || !b || !b->ew || !b->ew->optim_flat ||
        !NDM__BACKEND_RUNS(b, w->storage->device, NDM__OPS_EW, 0, "optim_flat", 0, 1, {w->dtype}))
        return NDM_E_UNSUPPORTED;
    ndm__array *g = member(hg, w, n);
    ndm__array *m = hm.id ? member(hm, w, n) : NULL;
    ndm__array *v = hv.id ? member(hv, w, n) : NULL;
    if (!g || (hm.id && !m) || (hv.id && !v) || overlap(w, g, n) ||
        (m && (overlap(m, w, n) || overlap(m, g, n))) ||
        (v && (overlap(v, w, n) || overlap(v, g, n) || (m && overlap(v, m, n)))))
        return NDM_E_UNSUPPORTED;
    a->w = ndm__ew_ptr(w);
    a->g = ndm__ew_ptr(g);
    a->m = m ? ndm__ew_ptr(m) : NULL;
    a->v = v ? ndm__ew_ptr(v) : NULL;
    if (n == 0)
        return NDM_OK;
    return b->ew->optim_flat(w->storage->device.index, w->dtype, a, n) < 0 ? NDM_E_UNSUPPORTED
                                                                          : NDM_OK;
}

ndm_array ndm__linear(ndm__site site, const char *api, ndm_array hx, ndm_array hw, ndm_array hb,
                      bool relu)
{
    NDM__OP_GUARD();
    /* A lookup that fails here is repeated, and reported, by the fallback. */
    ndm__array *x = ndm__array_peek(hx), *w = x ? ndm__array_peek(hw) : NULL;
    ndm__array *b = hb.id && w ? ndm__array_peek(hb) : NULL;
    const ndm__backend *be = NULL;
    if (w && (b || !hb.id) && !ndm__ag_on() && fusable_dtype(x->dtype) && x->ndim == 2 &&
        w->ndim == 2 && w->dtype == x->dtype && x->shape[1] == w->shape[1] &&
        ndm_device_eq(x->storage->device, w->storage->device) &&
        (!b || (b->ndim == 1 && b->dtype == x->dtype && b->shape[0] == w->shape[0] &&
                ndm_device_eq(b->storage->device, x->storage->device)))) {
        be = ndm__backend_for(x->storage->device.type);
        if (be && !(be->linalg && be->linalg->linear &&
                    NDM__BACKEND_RUNS(be, x->storage->device, NDM__OPS_LINALG, 0, "linear", 0, 2,
                                      {x->dtype, w->dtype})))
            be = NULL;
    }
    if (be) {
        ndm__manager *m = ndm__output_record(NDM_OUTPUT_RULE, x, api, &site);
        if (!m)
            return NDM_NULL_ARRAY;
        ndm__array *o;
        int64_t shape[2] = {x->shape[0], w->shape[0]};
        ndm_array h = ndm__array_new_in(&site, api, m, x->storage->device, x->dtype, 2, shape, &o);
        if (!h.id)
            return NDM_NULL_ARRAY;
        ndm__tensor ty = ndm__tensor_of(o), tx = ndm__tensor_of(x), tw = ndm__tensor_of(w);
        ndm__tensor tb = b ? ndm__tensor_of(b) : (ndm__tensor){0};
        ndm_status st;
        NDM__WITH_OP_CONTEXT(ndm__manager_handle_of(m), api, site,
                             st = be->linalg->linear(x->storage->device.index, &ty, &tx, &tw,
                                                     b ? &tb : NULL, relu));
        if (st == NDM_OK)
            return h;
        ndm__discard(h);
        if (st != NDM_E_UNSUPPORTED) {
            ndm__fail(st, api, site, "linear layer's product failed: %s", ndm_status_str(st));
            return NDM_NULL_ARRAY;
        }
    }
    ndm_array y = ndm_matmul_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, hx,
                                   ndm_permute_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, hw, 0,
                                                     NULL));
    if (hb.id)
        y = ndm_add_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, y, hb);
    return relu ? ndm_relu_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, y) : y;
}
