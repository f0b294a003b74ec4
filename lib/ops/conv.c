/* conv2d, max_pool2d and avg_pool2d: geometry, defaults and dtype checks
 * here; the arithmetic in the backend's nn family. f16 and bf16 go through
 * f32 temporaries. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../backends/nn.h"
#include "linalg_temp.h"

/* Output size along one axis, or -1 with the error recorded. */
static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                        const char *what, const char *api, ndm__site site)
{
    int64_t span, padded;
    if (__builtin_mul_overflow(dil, k - 1, &span) || __builtin_add_overflow(span, 1, &span) ||
        __builtin_mul_overflow(pad, 2, &padded) || __builtin_add_overflow(padded, in, &padded)) {
        ndm__fail(NDM_E_OVERFLOW, api, site, "%s: the padded size or the window overflows", what);
        return -1;
    }
    if (padded < span) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "%s: a window of %" PRId64 " does not fit in %" PRId64 " (%" PRId64
                  " with padding)",
                  what, span, in, padded);
        return -1;
    }
    return (padded - span) / stride + 1;
}

/* The nn family of a device, or NULL with the error recorded. */
static const struct ndm__backend_nn *family(ndm__array *r, const char *api, ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(r->storage->device, api, site);
    if (b && !b->nn) {
        char name[32];
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "no convolution or pooling on device %s",
                  ndm_device_str(r->storage->device, name, sizeof name));
        return NULL;
    }
    return b ? b->nn : NULL;
}

static bool same_device(ndm__array *a, ndm__array *b, const char *api, ndm__site site)
{
    if (ndm_device_eq(a->storage->device, b->storage->device))
        return true;
    char d1[32], d2[32];
    ndm__fail(NDM_E_DEVICE, api, site, "operands on different devices (%s and %s)",
              ndm_device_str(a->storage->device, d1, sizeof d1),
              ndm_device_str(b->storage->device, d2, sizeof d2));
    return false;
}

/* Input `r` in the compute dtype: itself, or a converted temporary. */
static ndm__array *as_compute(ndm__site site, const char *api, ndm_manager out, ndm__array *r,
                              ndm_dtype cdt, ndm_array *tmp)
{
    *tmp = NDM_NULL_ARRAY;
    return r->dtype == cdt ? r : ndm__temp_copy(site, api, out, r, cdt, tmp);
}

static void release_temps(ndm_array *t, int n)
{
    for (int i = 0; i < n; i++)
        if (t[i].id)
            ndm__discard(t[i]);
}

NDM_API ndm_array ndm_conv2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x, ndm_array w,
                                   const ndm_array *bias, const ndm_conv2d_opts *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    char d1[160], d2[160];
    ndm__array *rx = ndm__array_get_prop(x, api, site);
    if (!rx)
        return NDM_NULL_ARRAY;
    ndm__array *rw = ndm__array_get_prop(w, api, site);
    if (!rw)
        return NDM_NULL_ARRAY;
    ndm__array *rb = NULL;
    if (bias && !(rb = ndm__array_get_prop(*bias, api, site)))
        return NDM_NULL_ARRAY;
    out = ndm__output_manager(out, rx, api, site);
    if (!out.id)
        return NDM_NULL_ARRAY;
    if (!same_device(rx, rw, api, site) || (rb && !same_device(rx, rb, api, site)))
        return NDM_NULL_ARRAY;
    if (!ndm_dtype_is_float(rx->dtype) || rw->dtype != rx->dtype ||
        (rb && rb->dtype != rx->dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site,
                  "input, weight and bias must share one float dtype (got %s, %s%s%s)",
                  ndm_dtype_short(rx->dtype), ndm_dtype_short(rw->dtype), rb ? ", " : "",
                  rb ? ndm_dtype_short(rb->dtype) : "");
        return NDM_NULL_ARRAY;
    }
    if (rx->ndim != 4 || rw->ndim != 4) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "input (N, C, H, W) and weight (O, C/groups, KH, KW) must be 4-d, got %s and %s",
                  ndm__array_desc(rx, d1, sizeof d1), ndm__array_desc(rw, d2, sizeof d2));
        return NDM_NULL_ARRAY;
    }
    ndm_conv2d_opts o = opts ? *opts : (ndm_conv2d_opts){{0, 0}, {0, 0}, {0, 0}, 0};
    ndm__conv2d_geom g;
    for (int i = 0; i < 2; i++) {
        if (o.stride[i] < 0 || o.dilation[i] < 0 || o.padding[i] < 0) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "stride, dilation and padding must be >= 0 (axis %d: %" PRId64 ", %" PRId64
                      ", %" PRId64 ")",
                      i, o.stride[i], o.dilation[i], o.padding[i]);
            return NDM_NULL_ARRAY;
        }
        g.stride[i] = o.stride[i] ? o.stride[i] : 1;
        g.dilation[i] = o.dilation[i] ? o.dilation[i] : 1;
        g.padding[i] = o.padding[i];
    }
    if (o.groups < 0) {
        ndm__fail(NDM_E_INVALID, api, site, "groups must be >= 1 (got %" PRId64 ")", o.groups);
        return NDM_NULL_ARRAY;
    }
    g.groups = o.groups ? o.groups : 1;
    int64_t N = rx->shape[0], C = rx->shape[1], O = rw->shape[0];
    if (C % g.groups || O % g.groups || rw->shape[1] != C / g.groups) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "input %s and weight %s do not match with %" PRId64
                  " groups: C and O must divide by groups and weight.shape[1] equal C/groups",
                  ndm__array_desc(rx, d1, sizeof d1), ndm__array_desc(rw, d2, sizeof d2),
                  g.groups);
        return NDM_NULL_ARRAY;
    }
    if (rw->shape[2] == 0 || rw->shape[3] == 0) {
        ndm__fail(NDM_E_SHAPE, api, site, "weight %s has an empty kernel",
                  ndm__array_desc(rw, d1, sizeof d1));
        return NDM_NULL_ARRAY;
    }
    if (rb && (rb->ndim != 1 || rb->shape[0] != O)) {
        ndm__fail(NDM_E_SHAPE, api, site, "bias %s must be 1-d of size %" PRId64 " (O)",
                  ndm__array_desc(rb, d1, sizeof d1), O);
        return NDM_NULL_ARRAY;
    }
    int64_t oh = out_size(rx->shape[2], rw->shape[2], g.stride[0], g.padding[0], g.dilation[0],
                          "height", api, site);
    if (oh < 0)
        return NDM_NULL_ARRAY;
    int64_t ow = out_size(rx->shape[3], rw->shape[3], g.stride[1], g.padding[1], g.dilation[1],
                          "width", api, site);
    if (ow < 0)
        return NDM_NULL_ARRAY;
    int64_t yshape[4] = {N, O, oh, ow};
    if (ndm__shape_check(4, yshape, rx->dtype, NULL, NULL, api, site) < 0)
        return NDM_NULL_ARRAY;
    const struct ndm__backend_nn *fam = family(rx, api, site);
    if (!fam)
        return NDM_NULL_ARRAY;
    ndm_dtype cdt = rx->dtype == NDM_F64 ? NDM_F64 : NDM_F32;
    ndm__array *ry;
    ndm_array res = ndm__array_new_on(site, api, out, rx->storage->device, rx->dtype, 4, yshape, &ry);
    if (!res.id)
        return res;
    /* temporaries: x, w, bias in the compute dtype, y in it, workspace */
    ndm_array t[5] = {NDM_NULL_ARRAY, NDM_NULL_ARRAY, NDM_NULL_ARRAY, NDM_NULL_ARRAY,
                      NDM_NULL_ARRAY};
    ndm__array *ex, *ew, *eb = NULL, *ey = ry;
    int dev = rx->storage->device.index;
    ndm_status st = NDM_OK;
    if (!(ex = as_compute(site, api, out, rx, cdt, &t[0])) ||
        !(ew = as_compute(site, api, out, rw, cdt, &t[1])) ||
        (rb && !(eb = as_compute(site, api, out, rb, cdt, &t[2]))))
        goto fail;
    if (cdt != rx->dtype &&
        !(t[3] = ndm__array_new_on(site, api, out, rx->storage->device, cdt, 4, yshape, &ey)).id)
        goto fail;
    ndm__tensor ty = ndm__tensor_of(ey), tx = ndm__tensor_of(ex), tw = ndm__tensor_of(ew);
    ndm__tensor tb = eb ? ndm__tensor_of(eb) : (ndm__tensor){0};
    size_t wsb = fam->conv2d_workspace(dev, &ty, &tx, &tw, &g);
    void *ws = NULL;
    if (wsb) {
        ndm__array *rws;
        int64_t n = (int64_t)wsb;
        if (!(t[4] = ndm__array_new_on(site, api, out, rx->storage->device, NDM_U8, 1, &n, &rws)).id)
            goto fail;
        ws = ndm__array_ptr(rws);
    }
    st = fam->conv2d(dev, &ty, &tx, &tw, eb ? &tb : NULL, &g, ws);
    if (st >= 0 && ey != ry) {
        ndm__tensor dst = ndm__tensor_of(ry);
        const ndm__backend *be = ndm__backend_of(rx->storage->device, api, site);
        st = be ? be->copy(dev, &dst, &ty) : NDM_E_UNSUPPORTED;
    }
    if (st < 0) {
        ndm__fail(st, api, site, "convolution of %s with %s failed: %s",
                  ndm__array_desc(rx, d1, sizeof d1), ndm__array_desc(rw, d2, sizeof d2),
                  ndm_status_str(st));
        goto fail;
    }
    release_temps(t, 5);
    return res;
fail:
    release_temps(t, 5);
    ndm__discard(res);
    return NDM_NULL_ARRAY;
}

static ndm_array pool_impl(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                           bool max, bool count_include_pad, const ndm_pool2d_opts *opts)
{
    char d1[160];
    ndm__array *rx = ndm__array_get_prop(x, api, site);
    if (!rx)
        return NDM_NULL_ARRAY;
    out = ndm__output_manager(out, rx, api, site);
    if (!out.id)
        return NDM_NULL_ARRAY;
    if (!ndm_dtype_is_float(rx->dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site, "pooling needs a float dtype (got %s)",
                  ndm_dtype_short(rx->dtype));
        return NDM_NULL_ARRAY;
    }
    if (rx->ndim != 4) {
        ndm__fail(NDM_E_SHAPE, api, site, "input must be 4-d (N, C, H, W), got %s",
                  ndm__array_desc(rx, d1, sizeof d1));
        return NDM_NULL_ARRAY;
    }
    if (!opts) {
        ndm__fail(NDM_E_INVALID, api, site, "pooling needs options with a kernel size");
        return NDM_NULL_ARRAY;
    }
    ndm__pool2d_geom g = {.max = max, .count_include_pad = count_include_pad};
    int64_t osz[2];
    for (int i = 0; i < 2; i++) {
        int64_t k = opts->kernel[i], s = opts->stride[i], p = opts->padding[i];
        if (k < 1 || s < 0 || p < 0 || p > k / 2) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "axis %d: kernel %" PRId64 " must be >= 1, stride %" PRId64
                      " >= 0 and padding %" PRId64 " between 0 and half the kernel",
                      i, k, s, p);
            return NDM_NULL_ARRAY;
        }
        g.kernel[i] = k;
        g.stride[i] = s ? s : k;
        g.padding[i] = p;
        osz[i] = out_size(rx->shape[2 + i], k, g.stride[i], p, 1, i ? "width" : "height", api,
                          site);
        if (osz[i] < 0)
            return NDM_NULL_ARRAY;
    }
    int64_t yshape[4] = {rx->shape[0], rx->shape[1], osz[0], osz[1]};
    if (ndm__shape_check(4, yshape, rx->dtype, NULL, NULL, api, site) < 0)
        return NDM_NULL_ARRAY;
    const struct ndm__backend_nn *fam = family(rx, api, site);
    if (!fam)
        return NDM_NULL_ARRAY;
    ndm_dtype cdt = rx->dtype == NDM_F64 ? NDM_F64 : NDM_F32;
    ndm__array *ry, *ex, *ey;
    ndm_array res = ndm__array_new_on(site, api, out, rx->storage->device, rx->dtype, 4, yshape, &ry);
    if (!res.id)
        return res;
    ndm_array t[2] = {NDM_NULL_ARRAY, NDM_NULL_ARRAY};
    int dev = rx->storage->device.index;
    ey = ry;
    if (!(ex = as_compute(site, api, out, rx, cdt, &t[0])))
        goto fail;
    if (cdt != rx->dtype &&
        !(t[1] = ndm__array_new_on(site, api, out, rx->storage->device, cdt, 4, yshape, &ey)).id)
        goto fail;
    ndm__tensor ty = ndm__tensor_of(ey), tx = ndm__tensor_of(ex);
    ndm_status st = fam->pool2d(dev, &ty, &tx, &g);
    if (st >= 0 && ey != ry) {
        ndm__tensor dst = ndm__tensor_of(ry);
        const ndm__backend *be = ndm__backend_of(rx->storage->device, api, site);
        st = be ? be->copy(dev, &dst, &ty) : NDM_E_UNSUPPORTED;
    }
    if (st < 0) {
        ndm__fail(st, api, site, "pooling of %s failed: %s", ndm__array_desc(rx, d1, sizeof d1),
                  ndm_status_str(st));
        goto fail;
    }
    release_temps(t, 2);
    return res;
fail:
    release_temps(t, 2);
    ndm__discard(res);
    return NDM_NULL_ARRAY;
}

NDM_API ndm_array ndm_max_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       const ndm_pool2d_opts *opts)
{
    return pool_impl(NDM__SITE, __func__, out, x, true, false, opts);
}

NDM_API ndm_array ndm_avg_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       bool count_include_pad, const ndm_pool2d_opts *opts)
{
    return pool_impl(NDM__SITE, __func__, out, x, false, count_include_pad, opts);
}
