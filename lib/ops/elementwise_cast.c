/* Casts: ndm_astype (a new array of another dtype) and ndm_copy_into
 * (broadcast and convert into an existing array). */
#include "autograd.h"
#include "elementwise.h"

NDM_API ndm_array ndm_astype_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_dtype dtype)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_astype";
    ndm__array *r = ndm__array_get_prop(a, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (!ndm_dtype_valid(dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site, "invalid dtype %d", (int)dtype);
        return NDM_NULL_ARRAY;
    }
    ndm_device dev = r->storage->device;
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b || NDM__BACKEND_DECLINES(b, dev, api, site, NDM__OPS_CORE, 0, "copy",
                                    ndm__layout_of(r), 2, {dtype, r->dtype}))
        return NDM_NULL_ARRAY;
    ndm_manager m = ndm__output_manager(out, r, api, site);
    ndm__array *o;
    ndm_array h;
    if (!m.id || !(h = ndm__array_new_on(site, api, m, dev, dtype, r->ndim, r->shape, &o)).id)
        return NDM_NULL_ARRAY;
    ndm__tensor to = ndm__ew_tensor(o), ta = ndm__ew_tensor(r);
    ndm_status st = b->copy(dev.index, &to, &ta);
    if (st < 0) {
        ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st));
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(dtype))
        ndm__ag_record(NDM__AG_CAST, h, 1, &a, NULL);
    return h;
}

NDM_API ndm_status ndm_copy_into_at(NDM_SITE_PARAMS, ndm_array dst, ndm_array src)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_copy_into";
    ndm__array *d = ndm__array_get_prop(dst, api, site);
    if (!d)
        return ndm__ew_lookup_failed(dst);
    ndm__array *s = ndm__array_get_prop(src, api, site);
    if (!s)
        return ndm__ew_lookup_failed(src);
    ndm_status st = ndm__ew_same_device(d, s, api, &site);
    if (st < 0 || (st = ndm__ew_check_writable(d, api, &site)) < 0)
        return st;
    int lead = d->ndim - s->ndim;
    bool ok = lead >= 0;
    for (int j = 0; ok && j < s->ndim; j++)
        ok = s->shape[j] == d->shape[lead + j] || s->shape[j] == 1;
    if (!ok) {
        char d1[160], d2[160];
        return ndm__fail(NDM_E_SHAPE, api, site, "cannot broadcast %s into %s",
                         ndm__array_desc(s, d1, sizeof d1), ndm__array_desc(d, d2, sizeof d2));
    }
    ndm_device dev = d->storage->device;
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b || NDM__BACKEND_DECLINES(b, dev, api, site, NDM__OPS_CORE, 0, "copy",
                                    ndm__layout_of(d) | ndm__layout_of(s), 2,
                                    {d->dtype, s->dtype}))
        return ndm_last_status();
    ndm__ew_dims dims;
    if (!ndm__ew_dims_get(&dims, d->ndim, api, &site))
        return NDM_E_OOM;
    ndm__broadcast_strides(s, d->ndim, d->shape, dims.s0);
    ndm__tensor td = ndm__ew_tensor(d);
    ndm__tensor ts = {ndm__ew_ptr(s), s->dtype, d->ndim, d->shape, dims.s0};
    ndm__ew_scratch scratch;
    if ((st = ndm__ew_unalias(d, s, &ts, &scratch, api, &site)) >= 0 &&
        !(ts.data == td.data && s->dtype == d->dtype)) { /* copying onto itself */
        st = b->copy(dev.index, &td, &ts);
        if (st < 0)
            ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st));
    }
    ndm__ew_scratch_free(&scratch);
    ndm__ew_dims_put(&dims);
    return st < 0 ? st : NDM_OK;
}
