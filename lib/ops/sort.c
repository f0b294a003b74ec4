/* Sorting along an axis: sort, argsort and topk, one stable kernel of the
 * index family behind all three. A sort's values are a gather of its
 * input by the sorted positions, and are recorded so: the gradient
 * scatters back to where each value came from. */
#include <inttypes.h>

#include "autograd.h"
#include "index_ops.h"
#include "supports.h"

/* Sort a along axis; keep the first `keep` entries of each sorted line
 * (-1: all). *values (a's dtype) and *indices (i64) are made when their
 * pointer is not NULL; both null on failure, nothing left allocated. */
static ndm_status sort_core(ndm__site site, const char *api, ndm_manager out, ndm_array a,
                            int axis, int64_t keep, bool descending, ndm_array *values,
                            ndm_array *indices)
{
    if (values)
        *values = NDM_NULL_ARRAY;
    if (indices)
        *indices = NDM_NULL_ARRAY;
    ndm__array *r = ndm__input(a, &out, api, site);
    int ax;
    if (!r || ndm__axis(axis, r->ndim, false, &ax, api, site) < 0)
        return ndm_last_status();
    int64_t n = r->shape[ax];
    if (keep > n) {
        char d[160];
        return ndm__fail(NDM_E_INVALID, api, site,
                         "k = %" PRId64 " is larger than axis %d of %s (size %" PRId64 ")", keep,
                         ax, ndm__array_desc(r, d, sizeof d), n);
    }
    if (keep < 0)
        keep = n;
    ndm_device dev = r->storage->device;
    const struct ndm__backend_index *f = ndm__index_family(dev, api, site);
    if (!f || NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, "sort", ndm__layout_of(r),
                                   2, {r->dtype, NDM_I64}))
        return ndm_last_status();
    bool grad = values && ndm_dtype_is_float(r->dtype) && NDM__UNLIKELY(ndm__ag_on());
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, (size_t)r->ndim, api, site);
    if (!shape)
        return ndm_last_status();
    for (int d = 0; d < r->ndim; d++)
        shape[d] = d == ax ? keep : r->shape[d];
    ndm__array *ov = NULL, *oi = NULL;
    ndm_array v = NDM_NULL_ARRAY, ix = NDM_NULL_ARRAY;
    ndm_status st = NDM_OK;
    if (values)
        v = ndm__array_new_on(site, api, out, dev, r->dtype, r->ndim, shape, &ov);
    if ((!values || v.id) && (indices || grad))
        ix = ndm__array_new_on(site, api, out, dev, NDM_I64, r->ndim, shape, &oi);
    ndm__scratch_put(&sc);
    if ((values && !v.id) || ((indices || grad) && !ix.id)) {
        st = ndm_last_status();
        goto fail;
    }
    ndm__tensor src = ndm__tensor_of(r), tv, ti;
    if (ov)
        tv = ndm__tensor_of(ov);
    if (oi)
        ti = ndm__tensor_of(oi);
    NDM__WITH_OP_CONTEXT(out, api, site,
                         st = f->sort(dev.index, ov ? &tv : NULL, oi ? &ti : NULL, &src, ax,
                                      descending));
    if (st < 0) {
        ndm__fail(st, api, site, "sort kernel failed: %s", ndm_status_str(st));
        goto fail;
    }
    if (grad) {
        ndm__ag_params agp = {.i = {ax}};
        ndm__ag_record(NDM__AG_GATHER, v, 2, ((ndm_array[]){a, ix}), &agp);
    }
    if (values)
        *values = v;
    if (indices)
        *indices = ix;
    else if (ix.id)
        ndm__discard(ix);
    return NDM_OK;
fail:
    if (v.id)
        ndm__discard(v);
    if (ix.id)
        ndm__discard(ix);
    return st;
}

NDM_API ndm_array ndm_sort_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                 bool descending)
{
    NDM__OP_GUARD();
    ndm_array v;
    (void)sort_core(NDM__SITE, __func__, out, a, axis, -1, descending, &v, NULL);
    return v;
}

NDM_API ndm_array ndm_argsort_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                    bool descending)
{
    NDM__OP_GUARD();
    ndm_array ix;
    (void)sort_core(NDM__SITE, __func__, out, a, axis, -1, descending, NULL, &ix);
    return ix;
}

NDM_API ndm_status ndm_topk_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int64_t k,
                                  int axis, bool largest, ndm_array *values, ndm_array *indices)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    if (values)
        *values = NDM_NULL_ARRAY;
    if (indices)
        *indices = NDM_NULL_ARRAY;
    if (!values && !indices)
        return ndm__fail(NDM_E_INVALID, __func__, site, "values and indices are both NULL");
    if (k < 0)
        return ndm__fail(NDM_E_INVALID, __func__, site, "k must be >= 0 (got %" PRId64 ")", k);
    return sort_core(site, __func__, out, a, axis, k, largest, values, indices);
}
