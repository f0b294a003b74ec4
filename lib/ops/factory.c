/* Factories: arrays made from nothing, from values or from host buffers. */
#include <inttypes.h>
#include <math.h>

#include "dispatch.h"
#include "../manager/create.h"

void ndm__discard(ndm_array a)
{
    ndm__array *r = ndm__array_peek(a);
    if (r)
        (void)ndm__array_release(r, NDM__NO_SITE, NULL);
}

ndm_manager ndm__factory_manager(ndm_manager m, const char *api, ndm__site where)
{
    if (m.id && m.id != NDM__CURRENT_SCOPE_ID && m.id != NDM__OUTPUT_RULE_ID)
        return m;
    if (m.id == NDM__CURRENT_SCOPE_ID)
        return ndm__current_scope(api, where);
    /* the reserved values and the null handle: resolved or refused there */
    ndm__manager *r = ndm__manager_lookup_failed(m, api, &where);
    return r ? ndm__manager_handle_of(r) : NDM_NULL_MANAGER;
}

/* The record of a factory's manager: the one given, NDM_CURRENT_SCOPE
 * resolved; NULL with the error recorded. *gen: the generation of its handle. */
static ndm__manager *factory_record_slow(ndm_manager m, const char *api, const ndm__site *site,
                                         uint32_t *gen)
{
    m = ndm__factory_manager(m, api, *site);
    *gen = ndm__id_gen(m.id);
    return m.id ? ndm__manager_get(m, api, *site) : NULL;
}

/* A new uninitialised array from a factory. The manager is looked up and
 * the array made inline (see create.h): a small array is made in about as
 * many instructions as the calls would otherwise cost. */
static NDM__ALWAYS_INLINE ndm_array make(const ndm__site *site, const char *api, ndm_manager m,
                                         ndm_dtype dtype, int ndim, const int64_t *shape,
                                         ndm__array **out)
{
    ndm__manager *r = ndm__manager_peek(m);
    uint32_t gen = ndm__id_gen(m.id);
    if (NDM__UNLIKELY(!r) && !(r = factory_record_slow(m, api, site, &gen)))
        return NDM_NULL_ARRAY;
    return ndm__array_new_inline(site, api, r, gen, ndm__manager_device_of(r), dtype, ndim, shape,
                                 out);
}

/* The backend that runs `what` on r, or NULL when there is none or it
 * declines r's case (either has said why). */
static const ndm__backend *factory_backend(ndm__array *r, const char *what, const char *api,
                                           ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(r->storage->device, api, site);
    if (b && NDM__BACKEND_DECLINES(b, r->storage->device, api, site, NDM__OPS_CORE, 0, what,
                                   ndm__layout_of(r), 1, {r->dtype}))
        return NULL;
    return b;
}

/* a once the backend filled it with status st: a failure discards it (a
 * backend that declined, b NULL, has said why). */
static ndm_array filled(ndm_array a, ndm_status st, const ndm__backend *b, const char *api,
                        ndm__site site)
{
    if (st >= 0)
        return a;
    if (b)
        ndm__fail(st, api, site, "fill failed: %s", ndm_status_str(st));
    ndm__discard(a);
    return NDM_NULL_ARRAY;
}

static ndm_array make_filled(ndm__site site, const char *api, ndm_manager m, ndm_dtype dtype,
                             int ndim, const int64_t *shape, double value)
{
    ndm__array *r;
    ndm_array a = make(&site, api, m, dtype, ndim, shape, &r);
    if (!a.id)
        return a;
    const ndm__backend *b = factory_backend(r, "fill", api, site);
    ndm__tensor t = ndm__tensor_of(r);
    ndm_status st = b ? b->fill(r->storage->device.index, &t, value) : NDM_E_UNSUPPORTED;
    return filled(a, st, b, api, site);
}

NDM_API ndm_array ndm_empty_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                               const int64_t *shape)
{
    ndm__site site = NDM__SITE;
    return make(&site, __func__, m, dtype, ndim, shape, NULL);
}

NDM_API ndm_array ndm_zeros_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                               const int64_t *shape)
{
    return make_filled(NDM__SITE, __func__, m, dtype, ndim, shape, 0.0);
}

NDM_API ndm_array ndm_ones_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                              const int64_t *shape)
{
    return make_filled(NDM__SITE, __func__, m, dtype, ndim, shape, 1.0);
}

NDM_API ndm_array ndm_full_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double value,
                              int ndim, const int64_t *shape)
{
    return make_filled(NDM__SITE, __func__, m, dtype, ndim, shape, value);
}

NDM_API ndm_array ndm_scalar_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double value)
{
    return make_filled(NDM__SITE, __func__, m, dtype, 0, NULL, value);
}

static ndm_array make_iota(ndm__site site, const char *api, ndm_manager m, ndm_dtype dtype,
                           int64_t n, double start, double step, bool last_is, double last)
{
    ndm__array *r;
    ndm_array a = make(&site, api, m, dtype, 1, &n, &r);
    if (!a.id)
        return a;
    const ndm__backend *b = factory_backend(r, "iota", api, site);
    ndm__tensor t = ndm__tensor_of(r);
    ndm_status st = b ? b->iota(r->storage->device.index, &t, start, step) : NDM_E_UNSUPPORTED;
    if (st == NDM_OK && last_is && n > 1) {
        /* numpy sets the endpoint exactly rather than trusting start + i*step. */
        int64_t one = 1, stride = 1;
        ndm__tensor e = {(char *)t.data + (n - 1) * (int64_t)ndm_dtype_size(dtype), dtype, 1, &one,
                         &stride};
        st = b->fill(r->storage->device.index, &e, last);
    }
    return filled(a, st, b, api, site);
}

NDM_API ndm_array ndm_arange_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double start,
                                double stop, double step)
{
    ndm__site site = NDM__SITE;
    if (!isfinite(start) || !isfinite(stop) || !isfinite(step) || step == 0) {
        ndm__fail(NDM_E_INVALID, __func__, site,
                  "start, stop and step must be finite and step non-zero (got %g, %g, %g)", start,
                  stop, step);
        return NDM_NULL_ARRAY;
    }
    double len = ceil((stop - start) / step);
    if (!(len > 0))
        len = 0;
    if (len > 9.0e18) {
        ndm__fail(NDM_E_OVERFLOW, __func__, site, "arange of %g elements", len);
        return NDM_NULL_ARRAY;
    }
    return make_iota(site, __func__, m, dtype, (int64_t)len, start, step, false, 0);
}

NDM_API ndm_array ndm_linspace_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double start,
                                  double stop, int64_t num)
{
    ndm__site site = NDM__SITE;
    if (num < 0 || !isfinite(start) || !isfinite(stop)) {
        ndm__fail(NDM_E_INVALID, __func__, site,
                  "num must be >= 0 and the bounds finite (got num %" PRId64 ", %g, %g)", num,
                  start, stop);
        return NDM_NULL_ARRAY;
    }
    double step = num > 1 ? (stop - start) / (double)(num - 1) : 0.0;
    return make_iota(site, __func__, m, dtype, num, start, step, true, stop);
}

NDM_API ndm_array ndm_from_buffer_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype,
                                     const void *src, int ndim, const int64_t *shape)
{
    ndm__site site = NDM__SITE;
    /* checks before allocation: a missing source is refused like a bad shape */
    size_t want;
    if (ndm__shape_check(ndim, shape, dtype, NULL, &want, __func__, site) < 0)
        return NDM_NULL_ARRAY;
    if (want && !src) {
        ndm__fail(NDM_E_INVALID, __func__, site, "src is NULL");
        return NDM_NULL_ARRAY;
    }
    ndm__array *r;
    ndm_array a = make(&site, __func__, m, dtype, ndim, shape, &r);
    if (!a.id)
        return a;
    const ndm__backend *b = ndm__backend_of(r->storage->device, __func__, site);
    ndm_status st = b ? b->upload(r->storage->device.index, r->storage->data, src, want)
                      : NDM_E_UNSUPPORTED;
    if (st < 0) {
        if (b)
            ndm__fail(st, __func__, site, "upload failed: %s", ndm_status_str(st));
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

NDM_API ndm_array ndm_wrap_buffer_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, void *data,
                                     ndm_free_fn free_fn, void *ud, int ndim,
                                     const int64_t *shape)
{
    ndm__site site = NDM__SITE;
    m = ndm__factory_manager(m, __func__, site);
    if (!m.id)
        return NDM_NULL_ARRAY;
    return ndm__array_wrap(site, __func__, m, dtype, ndim, shape, data, free_fn, ud);
}
