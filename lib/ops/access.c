/* Array accessors and transfers between arrays and host buffers. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

/* The failure is written out of line: an accessor's check stays a few
 * instructions with no frame. */
static NDM__COLD void refused(ndm_array h, const char *api)
{
    ndm__site none = NDM__NO_SITE;
    ndm__array_lookup_failed(h, api, &none, false);
}

#define GET_AS(peek, h, fail_value)                                              \
    ndm__array *r = peek(h);                                                    \
    if (NDM__UNLIKELY(!r)) {                                                    \
        refused((h), __func__);                                                 \
        return fail_value;                                                      \
    }
/* An array whose memory is read (marked for deferred reclamation when
 * another thread's), or one whose description only is. */
#define GET(h, fail_value) GET_AS(ndm__array_peek, h, fail_value)
#define GET_META(h, fail_value) GET_AS(ndm__array_peek_meta, h, fail_value)

NDM_API bool ndm_array_valid(ndm_array a) { return ndm__array_peek_meta(a) != NULL; }

NDM_API int ndm_array_ndim(ndm_array a)
{
    GET_META(a, -1);
    return r->ndim;
}

NDM_API int64_t ndm_array_dim(ndm_array a, int axis)
{
    GET_META(a, -1);
    int ax;
    if (ndm__axis(axis, r->ndim, false, &ax, __func__, NDM__NO_SITE) < 0)
        return -1;
    return r->shape[ax];
}

/* The ndim entries of v (sizes or strides, `what`) into out, which has
 * room for cap; returns ndim. */
static int copy_dims(int64_t *out, int cap, int ndim, const int64_t *v, const char *what,
                     const char *api)
{
    if (cap < ndim || (ndim && !out))
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE, "room for %d %s given, rank is %d",
                         cap, what, ndim);
    if (ndim)
        memcpy(out, v, (size_t)ndim * sizeof *out);
    return ndim;
}

NDM_API int ndm_array_shape(ndm_array a, int64_t *out, int cap)
{
    GET_META(a, ndm_last_status());
    return copy_dims(out, cap, r->ndim, r->shape, "sizes", __func__);
}

NDM_API int ndm_array_strides(ndm_array a, int64_t *out, int cap)
{
    GET_META(a, ndm_last_status());
    return copy_dims(out, cap, r->ndim, r->strides, "strides", __func__);
}

NDM_API int64_t ndm_array_offset(ndm_array a)
{
    GET_META(a, -1);
    return r->offset;
}

NDM_API int64_t ndm_array_size(ndm_array a)
{
    GET_META(a, -1);
    return ndm__numel(r->ndim, r->shape);
}

NDM_API size_t ndm_array_nbytes(ndm_array a)
{
    GET_META(a, 0);
    return (size_t)ndm__numel(r->ndim, r->shape) * ndm_dtype_size(r->dtype);
}

NDM_API ndm_dtype ndm_array_dtype(ndm_array a)
{
    GET_META(a, NDM_F32);
    return r->dtype;
}

NDM_API ndm_device ndm_array_device(ndm_array a)
{
    GET_META(a, NDM_CPU);
    return r->storage->device;
}

NDM_API ndm_manager ndm_array_manager(ndm_array a)
{
    GET_META(a, NDM_NULL_MANAGER);
    return ndm__manager_handle_of(ndm__manager_slot(r->mgr));
}

NDM_API bool ndm_array_is_contiguous(ndm_array a)
{
    GET_META(a, false);
    return ndm__is_contiguous(r->ndim, r->shape, r->strides);
}

NDM_API bool ndm_array_shares_storage(ndm_array a, ndm_array b)
{
    ndm__array *x = ndm__array_get(a, __func__, NDM__NO_SITE);
    ndm__array *y = x ? ndm__array_get(b, __func__, NDM__NO_SITE) : NULL;
    return x && y && x->storage == y->storage;
}

static NDM__COLD void *data_refused(ndm_array a)
{
    ndm__array *r = ndm__array_get(a, "ndm_array_data", NDM__NO_SITE);
    if (!r)
        return NULL;
    char name[32];
    ndm__fail(NDM_E_DEVICE, "ndm_array_data", NDM__NO_SITE,
              "the array lives on %s; copy it out with ndm_array_copy_out",
              ndm_device_str(r->storage->device, name, sizeof name));
    return NULL;
}

NDM_API void *ndm_array_data(ndm_array a)
{
    /* No frame on the common path: the failures are written elsewhere. */
    ndm__array *r = ndm__array_peek(a);
    if (NDM__LIKELY(r && r->storage->device.type == NDM_DEVICE_CPU))
        return ndm__array_ptr(r);
    return data_refused(a);
}

/* Move the elements of r in C order to or from a host buffer: the one
 * transfer path (inner.c). */
static ndm_status transfer(ndm__array *r, void *host, size_t nbytes, bool out, const char *api,
                           ndm__site site)
{
    ndm__view v;
    ndm__view_fill(r, &v);
    return out ? ndm__view_to_host(&v, host, nbytes, api, site)
               : ndm__view_from_host(&v, host, nbytes, api, site);
}

/* The transfers name the caller's site, so their lookup is the checked one
 * (the site is built on the failure path only). */
#define GET_AT(h, fail_value)                                                    \
    ndm__array *r = ndm__array_get((h), __func__, NDM__SITE);                   \
    if (NDM__UNLIKELY(!r))                                                      \
        return fail_value;

NDM_API ndm_status ndm_array_copy_out_at(NDM_SITE_PARAMS, ndm_array a, void *dst, size_t nbytes)
{
    NDM__OP_GUARD();
    GET_AT(a, ndm_last_status());
    return transfer(r, dst, nbytes, true, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_array_copy_in_at(NDM_SITE_PARAMS, ndm_array a, const void *src,
                                        size_t nbytes)
{
    NDM__OP_GUARD();
    GET_AT(a, ndm_last_status());
    return transfer(r, (void *)src, nbytes, false, __func__, NDM__SITE);
}

/* The single element of r converted to `as` (f64 or i64) into *out. */
static ndm_status item(ndm__array *r, ndm_dtype as, void *out, const char *api, ndm__site site)
{
    if (!out)
        return ndm__fail(NDM_E_INVALID, api, site, "out is NULL");
    int64_t n = ndm__numel(r->ndim, r->shape);
    if (n != 1) {
        char desc[160];
        return ndm__fail(NDM_E_SHAPE, api, site, "item() needs exactly one element; %s has %" PRId64,
                         ndm__array_desc(r, desc, sizeof desc), n);
    }
    unsigned char raw[8];
    ndm_status st = transfer(r, raw, ndm_dtype_size(r->dtype), true, api, site);
    if (st < 0)
        return st;
    ndm__tensor src = {raw, r->dtype, 0, NULL, NULL};
    ndm__tensor dst = {out, as, 0, NULL, NULL};
    return ndm__cpu_backend.copy(0, &dst, &src);
}

NDM_API ndm_status ndm_item_at(NDM_SITE_PARAMS, ndm_array a, double *out)
{
    NDM__OP_GUARD();
    GET_AT(a, ndm_last_status());
    return item(r, NDM_F64, out, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_item_i64_at(NDM_SITE_PARAMS, ndm_array a, int64_t *out)
{
    NDM__OP_GUARD();
    GET_AT(a, ndm_last_status());
    return item(r, NDM_I64, out, __func__, NDM__SITE);
}
