/* conv2d, max_pool2d and avg_pool2d and their gradients: geometry, defaults
 * and dtype checks here; the arithmetic in the backend's nn family. f16 and
 * bf16 go through f32 temporaries. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ndm/conv.h"
#include "autograd.h"
#include "../backends/nn.h"
#include "linalg_temp.h"
#include "supports.h"

/* Output size along one axis, or -1 with the error recorded. */
static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                        const char *what, const char *api, ndm__site site)
{
    int64_t span, padded;
    if (ndm__ckd_mul_i64(&span, dil, k - 1) || ndm__ckd_add_i64(&span, span, 1) ||
        ndm__ckd_mul_i64(&padded, pad, 2) || ndm__ckd_add_i64(&padded, padded, in)) {
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

/* Does the backend of r's device decline `op` (in the computation dtype
 * call_start picks for r)? The error is recorded then. */
static bool declines(const ndm__array *r, const char *op, const char *api, ndm__site site)
{
    return NDM__DEVICE_DECLINES(r->storage->device, api, site, NDM__OPS_NN, 0, op,
                                ndm__layout_of(r), 1,
                                {r->dtype == NDM_F64 ? NDM_F64 : NDM_F32});
}

/* The nn kernels for a 4-d result of shape yshape in rx's dtype on rx's
 * device, or NULL (the failure recorded) when that shape does not fit or
 * the backend declines `op`. */
static const struct ndm__backend_nn *result_family(ndm__array *rx, const int64_t *yshape,
                                                   const char *op, const char *api,
                                                   ndm__site site)
{
    if (ndm__shape_check(4, yshape, rx->dtype, NULL, NULL, api, site) < 0)
        return NULL;
    const struct ndm__backend_nn *fam = family(rx, api, site);
    return fam && !declines(rx, op, api, site) ? fam : NULL;
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

/* "f32[2,3,5,5]" for a shape that is not an array yet, as ndm__array_desc
 * writes arrays. */
static const char *shape_desc(ndm_dtype dt, const int64_t *shape, char *buf, size_t n)
{
    snprintf(buf, n, "%s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "]", ndm_dtype_short(dt),
             shape[0], shape[1], shape[2], shape[3]);
    return buf;
}

/* Convolution options with every default resolved; false with the error
 * recorded. */
static bool conv_geometry(const ndm_conv2d_opts *opts, ndm__conv2d_geom *g, const char *api,
                          ndm__site site)
{
    ndm_conv2d_opts o = opts ? *opts : (ndm_conv2d_opts){{0, 0}, {0, 0}, {0, 0}, 0};
    for (int i = 0; i < 2; i++) {
        if (o.stride[i] < 0 || o.dilation[i] < 0 || o.padding[i] < 0) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "stride, dilation and padding must be >= 0 (axis %d: %" PRId64 ", %" PRId64
                      ", %" PRId64 ")",
                      i, o.stride[i], o.dilation[i], o.padding[i]);
            return false;
        }
        g->stride[i] = o.stride[i] ? o.stride[i] : 1;
        g->dilation[i] = o.dilation[i] ? o.dilation[i] : 1;
        g->padding[i] = o.padding[i];
    }
    if (o.groups < 0) {
        ndm__fail(NDM_E_INVALID, api, site, "groups must be >= 1 (got %" PRId64 ")", o.groups);
        return false;
    }
    g->groups = o.groups ? o.groups : 1;
    return true;
}

/* The output shape y (N, O, OH, OW) of input shape x (N, C, H, W) and weight
 * shape w (O, C/groups, KH, KW) of dtype dt; false with the error recorded. */
static bool conv_output_shape(const int64_t *x, const int64_t *w, ndm_dtype dt,
                              const ndm__conv2d_geom *g, int64_t *y, const char *api,
                              ndm__site site)
{
    char xd[160], wd[160];
    if (x[1] % g->groups || w[0] % g->groups || w[1] != x[1] / g->groups) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "input %s and weight %s do not match with %" PRId64
                  " groups: C and O must divide by groups and weight.shape[1] equal C/groups",
                  shape_desc(dt, x, xd, sizeof xd), shape_desc(dt, w, wd, sizeof wd), g->groups);
        return false;
    }
    if (w[2] == 0 || w[3] == 0) {
        ndm__fail(NDM_E_SHAPE, api, site, "weight %s has an empty kernel",
                  shape_desc(dt, w, wd, sizeof wd));
        return false;
    }
    y[0] = x[0];
    y[1] = w[0];
    for (int i = 0; i < 2; i++) {
        y[2 + i] = out_size(x[2 + i], w[2 + i], g->stride[i], g->padding[i], g->dilation[i],
                            i ? "width" : "height", api, site);
        if (y[2 + i] < 0)
            return false;
    }
    return true;
}

/* What a dispatcher holds around the kernel: the result, the array the
 * kernel writes (the result, or an f32 stand-in for f16 and bf16), and the
 * library temporaries to release before returning. */
typedef struct call {
    ndm__site site;
    const char *api;
    ndm_manager out;
    ndm_device dev;
    ndm_dtype cdt;
    ndm_array res;
    ndm__array *rres, *eres;
    ndm_array temps[5];
    int ntemps;
} call;

static call call_start(ndm__site site, const char *api, ndm_manager out, ndm__array *first)
{
    call c = {.site = site, .api = api, .out = out, .dev = first->storage->device};
    c.cdt = first->dtype == NDM_F64 ? NDM_F64 : NDM_F32;
    return c;
}

/* The result (dtype dt, 4-d shape) and, for f16 and bf16, its stand-in. */
static bool call_result(call *c, ndm_dtype dt, const int64_t *shape)
{
    c->res = ndm__array_new_on(c->site, c->api, c->out, c->dev, dt, 4, shape, &c->rres);
    if (!c->res.id)
        return false;
    c->eres = c->rres;
    if (dt == c->cdt)
        return true;
    ndm_array t = ndm__array_new_on(c->site, c->api, c->out, c->dev, c->cdt, 4, shape, &c->eres);
    if (!t.id)
        return false;
    c->temps[c->ntemps++] = t;
    return true;
}

/* Input r in the compute dtype, or NULL with the error recorded. */
static ndm__array *call_input(call *c, ndm__array *r)
{
    ndm_array t;
    ndm__array *e = as_compute(c->site, c->api, c->out, r, c->cdt, &t);
    if (t.id)
        c->temps[c->ntemps++] = t;
    return e;
}

/* `bytes` of scratch into *ws (NULL for none); false with the error recorded. */
static bool call_workspace(call *c, size_t bytes, void **ws)
{
    *ws = NULL;
    if (!bytes)
        return true;
    ndm__array *r;
    int64_t n = (int64_t)bytes;
    ndm_array t = ndm__array_new_on(c->site, c->api, c->out, c->dev, NDM_U8, 1, &n, &r);
    if (!t.id)
        return false;
    c->temps[c->ntemps++] = t;
    *ws = ndm__array_ptr(r);
    return true;
}

/* After the kernel (st its status; ok false when a step before it failed):
 * the stand-in converted into the result, temporaries released. Returns the
 * result, or the null handle with the error recorded: "<what> failed", or,
 * with operands, "<what> of <of> with <with> failed". */
static ndm_array call_end(call *c, bool ok, ndm_status st, const char *what, ndm__array *of,
                          ndm__array *with)
{
    if (ok && st >= 0 && c->eres != c->rres) {
        ndm__tensor dst = ndm__tensor_of(c->rres), src = ndm__tensor_of(c->eres);
        const ndm__backend *be = ndm__backend_of(c->dev, c->api, c->site);
        st = be ? be->copy(c->dev.index, &dst, &src) : NDM_E_UNSUPPORTED;
    }
    if (ok && st < 0) {
        char d1[160], d2[160];
        ndm__fail(st, c->api, c->site, "%s%s%s%s%s failed: %s", what, of ? " of " : "",
                  of ? ndm__array_desc(of, d1, sizeof d1) : "", with ? " with " : "",
                  with ? ndm__array_desc(with, d2, sizeof d2) : "", ndm_status_str(st));
    }
    release_temps(c->temps, c->ntemps);
    if (ok && st >= 0)
        return c->res;
    if (c->res.id)
        ndm__discard(c->res);
    return NDM_NULL_ARRAY;
}

static ndm_array conv2d_impl(NDM_SITE_PARAMS, ndm_manager out, ndm_array x, ndm_array w,
                             const ndm_array *bias, const ndm_conv2d_opts *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_conv2d";
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
    ndm__conv2d_geom g;
    int64_t yshape[4];
    if (!conv_geometry(opts, &g, api, site) ||
        !conv_output_shape(rx->shape, rw->shape, rx->dtype, &g, yshape, api, site))
        return NDM_NULL_ARRAY;
    if (rb && (rb->ndim != 1 || rb->shape[0] != yshape[1])) {
        ndm__fail(NDM_E_SHAPE, api, site, "bias %s must be 1-d of size %" PRId64 " (O)",
                  ndm__array_desc(rb, d1, sizeof d1), yshape[1]);
        return NDM_NULL_ARRAY;
    }
    const struct ndm__backend_nn *fam = result_family(rx, yshape, "conv2d", api, site);
    if (!fam)
        return NDM_NULL_ARRAY;
    call c = call_start(site, api, out, rx);
    ndm__array *ex, *ew, *eb = NULL;
    void *ws = NULL;
    ndm_status st = NDM_OK;
    bool ok = call_result(&c, rx->dtype, yshape) && (ex = call_input(&c, rx)) &&
              (ew = call_input(&c, rw)) && (!rb || (eb = call_input(&c, rb)));
    if (ok) {
        ndm__tensor ty = ndm__tensor_of(c.eres), tx = ndm__tensor_of(ex),
                    tw = ndm__tensor_of(ew);
        ndm__tensor tb = eb ? ndm__tensor_of(eb) : (ndm__tensor){0};
        ok = call_workspace(&c, fam->conv2d_workspace(c.dev.index, &ty, &tx, &tw, &g), &ws);
        if (ok)
            NDM__WITH_OP_CONTEXT(c.out, c.api, c.site,
                                 st = fam->conv2d(c.dev.index, &ty, &tx, &tw, eb ? &tb : NULL,
                                                  &g, ws));
    }
    return call_end(&c, ok, st, "convolution", rx, rw);
}

/* A pooling operand (`name`, laid out as `layout`): a float dtype, 4-d. */
static bool pool_operand(ndm__array *r, const char *name, const char *layout, const char *api,
                         ndm__site site)
{
    if (!ndm_dtype_is_float(r->dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site, "pooling needs a float dtype (got %s)",
                  ndm_dtype_short(r->dtype));
        return false;
    }
    if (r->ndim != 4) {
        char d1[160];
        ndm__fail(NDM_E_SHAPE, api, site, "%s must be 4-d %s, got %s", name, layout,
                  ndm__array_desc(r, d1, sizeof d1));
        return false;
    }
    return true;
}

/* Pooling options resolved into g (whose max and count_include_pad are
 * set) and the output shape y of input shape x (4-d); false with the error
 * recorded. */
static bool pool_geometry(const ndm_pool2d_opts *opts, const int64_t *x, ndm__pool2d_geom *g,
                          int64_t *y, const char *api, ndm__site site)
{
    if (!opts) {
        ndm__fail(NDM_E_INVALID, api, site, "pooling needs options with a kernel size");
        return false;
    }
    y[0] = x[0];
    y[1] = x[1];
    for (int i = 0; i < 2; i++) {
        int64_t k = opts->kernel[i], s = opts->stride[i], p = opts->padding[i];
        if (k < 1 || s < 0 || p < 0 || p > k / 2) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "axis %d: kernel %" PRId64 " must be >= 1, stride %" PRId64
                      " >= 0 and padding %" PRId64 " between 0 and half the kernel",
                      i, k, s, p);
            return false;
        }
        g->kernel[i] = k;
        g->stride[i] = s ? s : k;
        g->padding[i] = p;
        y[2 + i] = out_size(x[2 + i], k, g->stride[i], p, 1, i ? "width" : "height", api, site);
        if (y[2 + i] < 0)
            return false;
    }
    return true;
}

NDM_API ndm_array ndm_conv2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x, ndm_array w,
                                   const ndm_array *bias, const ndm_conv2d_opts *opts)
{
    NDM__OP_GUARD();
    /* the temporaries (compute-dtype copies) are not recorded, the convolution is */
    bool paused = ndm__ag_pause();
    ndm_array res = conv2d_impl(ndm_file_, ndm_line_, ndm_func_, out, x, w, bias, opts);
    ndm__ag_resume(paused);
    if (NDM__UNLIKELY(ndm__ag_on()) && res.id) {
        ndm__ag_params agp = {.naxes = 0};
        if (opts) {
            const int64_t c[7] = {opts->stride[0],   opts->stride[1],   opts->padding[0],
                                  opts->padding[1],  opts->dilation[0], opts->dilation[1],
                                  opts->groups};
            for (int i = 0; i < 7; i++)
                agp.conv[i] = c[i];
        }
        ndm_array in[3] = {x, w, bias ? *bias : NDM_NULL_ARRAY};
        ndm__ag_record(NDM__AG_CONV2D, res, bias ? 3 : 2, in, &agp);
    }
    return res;
}

static ndm_array pool_impl(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                           bool max, bool count_include_pad, const ndm_pool2d_opts *opts);

static ndm_array pool_recorded(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                               bool max, bool count_include_pad, const ndm_pool2d_opts *opts)
{
    bool paused = ndm__ag_pause();
    ndm_array res = pool_impl(site, api, out, x, max, count_include_pad, opts);
    ndm__ag_resume(paused);
    if (NDM__UNLIKELY(ndm__ag_on()) && res.id && opts) {
        ndm__ag_params agp = {.i = {count_include_pad}};
        const int64_t c[6] = {opts->kernel[0],  opts->kernel[1],  opts->stride[0],
                              opts->stride[1],  opts->padding[0], opts->padding[1]};
        for (int i = 0; i < 6; i++)
            agp.conv[i] = c[i];
        ndm__ag_record(max ? NDM__AG_MAX_POOL2D : NDM__AG_AVG_POOL2D, res, 1, &x, &agp);
    }
    return res;
}

static ndm_array pool_impl(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                           bool max, bool count_include_pad, const ndm_pool2d_opts *opts)
{
    ndm__array *rx = ndm__input(x, &out, api, site);
    if (!rx)
        return NDM_NULL_ARRAY;
    if (!pool_operand(rx, "input", "(N, C, H, W)", api, site))
        return NDM_NULL_ARRAY;
    ndm__pool2d_geom g = {.max = max, .count_include_pad = count_include_pad};
    int64_t yshape[4];
    if (!pool_geometry(opts, rx->shape, &g, yshape, api, site))
        return NDM_NULL_ARRAY;
    const struct ndm__backend_nn *fam = result_family(rx, yshape, "pool2d", api, site);
    if (!fam)
        return NDM_NULL_ARRAY;
    call c = call_start(site, api, out, rx);
    ndm__array *ex;
    ndm_status st = NDM_OK;
    bool ok = call_result(&c, rx->dtype, yshape) && (ex = call_input(&c, rx));
    if (ok) {
        ndm__tensor ty = ndm__tensor_of(c.eres), tx = ndm__tensor_of(ex);
        st = fam->pool2d(c.dev.index, &ty, &tx, &g);
    }
    return call_end(&c, ok, st, "pooling", rx, NULL);
}

NDM_API ndm_array ndm_max_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       const ndm_pool2d_opts *opts)
{
    NDM__OP_GUARD();
    return pool_recorded(NDM__SITE, __func__, out, x, true, false, opts);
}

NDM_API ndm_array ndm_avg_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       bool count_include_pad, const ndm_pool2d_opts *opts)
{
    NDM__OP_GUARD();
    return pool_recorded(NDM__SITE, __func__, out, x, false, count_include_pad, opts);
}

/* ---- gradients ------------------------------------------------------------------ */

/* A gradient kernel the device's nn family may lack; NULL fails the call. */
static bool grad_kernel(bool present, ndm__array *r, const char *api, ndm__site site)
{
    if (present)
        return true;
    char name[32];
    ndm__fail(NDM_E_UNSUPPORTED, api, site, "no gradient of this operation on device %s",
              ndm_device_str(r->storage->device, name, sizeof name));
    return false;
}

/* A shape the caller gives for a gradient's result: 4-d, sizes >= 0, not
 * overflowing. */
static bool given_shape(int ndim, const int64_t *shape, ndm_dtype dt, const char *what,
                        const char *api, ndm__site site)
{
    if (ndim != 4) {
        ndm__fail(NDM_E_SHAPE, api, site, "the %s shape must have 4 dims, got %d", what, ndim);
        return false;
    }
    return ndm__shape_check(4, shape, dt, NULL, NULL, api, site) >= 0;
}

/* grad_out must have `want`, the output shape of the forward of input
 * shape x (with weight shape w for a convolution, NULL for pooling). */
static bool grad_out_matches(ndm__array *rdy, const int64_t *want, const int64_t *x,
                             const int64_t *w, const char *api, ndm__site site)
{
    if (!memcmp(rdy->shape, want, 4 * sizeof *want))
        return true;
    char d1[160], d2[160], d3[160];
    ndm__fail(NDM_E_SHAPE, api, site,
              "grad_out %s is not the forward's output: input %s%s%s gives [%" PRId64
              ",%" PRId64 ",%" PRId64 ",%" PRId64 "]",
              ndm__array_desc(rdy, d1, sizeof d1), shape_desc(rdy->dtype, x, d2, sizeof d2),
              w ? " with weight " : "", w ? shape_desc(rdy->dtype, w, d3, sizeof d3) : "",
              want[0], want[1], want[2], want[3]);
    return false;
}

/* grad_out and the other operand: one device, one float dtype, both 4-d. */
static bool grad_operands(ndm__array *rdy, ndm__array *r, const char *name, const char *layout,
                          const char *api, ndm__site site)
{
    char d1[160], d2[160];
    if (!same_device(rdy, r, api, site))
        return false;
    if (!ndm_dtype_is_float(rdy->dtype) || r->dtype != rdy->dtype) {
        ndm__fail(NDM_E_DTYPE, api, site, "grad_out and %s must share one float dtype (got %s, %s)",
                  name, ndm_dtype_short(rdy->dtype), ndm_dtype_short(r->dtype));
        return false;
    }
    if (rdy->ndim != 4 || r->ndim != 4) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "grad_out and %s %s must be 4-d, got %s and %s", name, layout,
                  ndm__array_desc(rdy, d1, sizeof d1), ndm__array_desc(r, d2, sizeof d2));
        return false;
    }
    return true;
}

/* Both convolution gradients: `other` is the weight for the input gradient
 * (`shape` the input's), the forward's input for the weight gradient
 * (`shape` the weight's). */
static ndm_array conv_backward(ndm__site site, const char *api, ndm_manager out,
                               ndm_array grad_out, ndm_array other, bool weight,
                               const ndm_conv2d_opts *opts, int ndim, const int64_t *shape)
{
    ndm__array *rdy = ndm__array_get_prop(grad_out, api, site);
    if (!rdy)
        return NDM_NULL_ARRAY;
    ndm__array *ro = ndm__array_get_prop(other, api, site);
    if (!ro)
        return NDM_NULL_ARRAY;
    out = ndm__output_manager(out, rdy, api, site);
    if (!out.id)
        return NDM_NULL_ARRAY;
    ndm__conv2d_geom g;
    int64_t yshape[4];
    if (!grad_operands(rdy, ro, weight ? "input" : "weight",
                       weight ? "(N, C, H, W)" : "(O, C/groups, KH, KW)", api, site) ||
        !given_shape(ndim, shape, rdy->dtype, weight ? "weight" : "input", api, site) ||
        !conv_geometry(opts, &g, api, site))
        return NDM_NULL_ARRAY;
    const int64_t *xshape = weight ? ro->shape : shape, *wshape = weight ? shape : ro->shape;
    if (!conv_output_shape(xshape, wshape, rdy->dtype, &g, yshape, api, site) ||
        !grad_out_matches(rdy, yshape, xshape, wshape, api, site))
        return NDM_NULL_ARRAY;
    const struct ndm__backend_nn *fam = family(rdy, api, site);
    if (!fam ||
        declines(rdy, weight ? "conv2d_backward_weight" : "conv2d_backward_input", api, site))
        return NDM_NULL_ARRAY;
    /* the two kernels take the same arguments: (result, dy, other) */
    size_t (*sizer)(int, const ndm__tensor *, const ndm__tensor *, const ndm__tensor *,
                    const ndm__conv2d_geom *) = weight ? fam->conv2d_backward_weight_workspace
                                                       : fam->conv2d_backward_input_workspace;
    ndm_status (*kernel)(int, const ndm__tensor *, const ndm__tensor *, const ndm__tensor *,
                         const ndm__conv2d_geom *, void *, size_t) =
        weight ? fam->conv2d_backward_weight : fam->conv2d_backward_input;
    if (!grad_kernel(kernel != NULL, rdy, api, site))
        return NDM_NULL_ARRAY;
    call c = call_start(site, api, out, rdy);
    ndm__array *edy, *eo;
    void *ws = NULL;
    size_t wsb = 0;
    ndm_status st = NDM_OK;
    bool ok = call_result(&c, rdy->dtype, shape) && (edy = call_input(&c, rdy)) &&
              (eo = call_input(&c, ro));
    if (ok) {
        ndm__tensor tres = ndm__tensor_of(c.eres), tdy = ndm__tensor_of(edy),
                    to = ndm__tensor_of(eo);
        wsb = sizer ? sizer(c.dev.index, &tres, &tdy, &to, &g) : 0;
        ok = call_workspace(&c, wsb, &ws);
        if (ok)
            NDM__WITH_OP_CONTEXT(c.out, c.api, c.site,
                                 st = kernel(c.dev.index, &tres, &tdy, &to, &g, ws, wsb));
    }
    return call_end(&c, ok, st,
                    weight ? "the weight gradient of the convolution"
                           : "the input gradient of the convolution",
                    NULL, NULL);
}

NDM_API ndm_array ndm_conv2d_backward_input_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                  ndm_array grad_out, ndm_array w,
                                                  const ndm_conv2d_opts *opts, int ndim,
                                                  const int64_t *input_shape)
{
    NDM__OP_GUARD();
    return conv_backward(NDM__SITE, __func__, out, grad_out, w, false, opts, ndim, input_shape);
}

NDM_API ndm_array ndm_conv2d_backward_weight_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                   ndm_array grad_out, ndm_array x,
                                                   const ndm_conv2d_opts *opts, int ndim,
                                                   const int64_t *weight_shape)
{
    NDM__OP_GUARD();
    return conv_backward(NDM__SITE, __func__, out, grad_out, x, true, opts, ndim, weight_shape);
}

/* Both pooling gradients: x is the forward's input for max pooling, NULL
 * for average pooling (input_shape gives its shape). */
static ndm_array pool_backward(ndm__site site, const char *api, ndm_manager out,
                               ndm_array grad_out, ndm_array x, bool max, bool count_include_pad,
                               const ndm_pool2d_opts *opts, int ndim, const int64_t *input_shape)
{
    ndm__array *rdy = ndm__array_get_prop(grad_out, api, site);
    if (!rdy)
        return NDM_NULL_ARRAY;
    ndm__array *rx = NULL;
    if (max && !(rx = ndm__array_get_prop(x, api, site)))
        return NDM_NULL_ARRAY;
    out = ndm__output_manager(out, rdy, api, site);
    if (!out.id)
        return NDM_NULL_ARRAY;
    if (rx) {
        if (!grad_operands(rdy, rx, "input", "(N, C, H, W)", api, site))
            return NDM_NULL_ARRAY;
        input_shape = rx->shape;
    } else {
        if (!pool_operand(rdy, "grad_out", "(N, C, OH, OW)", api, site) ||
            !given_shape(ndim, input_shape, rdy->dtype, "input", api, site))
            return NDM_NULL_ARRAY;
    }
    ndm__pool2d_geom g = {.max = max, .count_include_pad = count_include_pad};
    int64_t yshape[4];
    if (!pool_geometry(opts, input_shape, &g, yshape, api, site) ||
        !grad_out_matches(rdy, yshape, input_shape, NULL, api, site))
        return NDM_NULL_ARRAY;
    const struct ndm__backend_nn *fam = family(rdy, api, site);
    if (!fam || !grad_kernel(fam->pool2d_backward != NULL, rdy, api, site) ||
        declines(rdy, "pool2d_backward", api, site))
        return NDM_NULL_ARRAY;
    call c = call_start(site, api, out, rdy);
    ndm__array *edy, *ex = NULL;
    ndm_status st = NDM_OK;
    bool ok = call_result(&c, rdy->dtype, input_shape) && (edy = call_input(&c, rdy)) &&
              (!rx || (ex = call_input(&c, rx)));
    if (ok) {
        ndm__tensor tdx = ndm__tensor_of(c.eres), tdy = ndm__tensor_of(edy);
        ndm__tensor tx = ex ? ndm__tensor_of(ex) : (ndm__tensor){0};
        st = fam->pool2d_backward(c.dev.index, &tdx, &tdy, ex ? &tx : NULL, &g);
    }
    return call_end(&c, ok, st,
                    max ? "the gradient of max pooling" : "the gradient of average pooling", NULL,
                    NULL);
}

NDM_API ndm_array ndm_max_pool2d_backward_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                ndm_array grad_out, ndm_array x,
                                                const ndm_pool2d_opts *opts)
{
    NDM__OP_GUARD();
    return pool_backward(NDM__SITE, __func__, out, grad_out, x, true, false, opts, 0, NULL);
}

NDM_API ndm_array ndm_avg_pool2d_backward_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                ndm_array grad_out, bool count_include_pad,
                                                const ndm_pool2d_opts *opts, int ndim,
                                                const int64_t *input_shape)
{
    NDM__OP_GUARD();
    return pool_backward(NDM__SITE, __func__, out, grad_out, NDM_NULL_ARRAY, false,
                         count_include_pad, opts, ndim, input_shape);
}
