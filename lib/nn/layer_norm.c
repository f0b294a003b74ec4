/* BatchNorm1d/2d, LayerNorm and RMSNorm, as PyTorch's: batch norm
 * normalises each channel over the batch (running statistics as buffers of
 * the state), layer norm each sample over its trailing axes, RMS norm each
 * sample by the root mean square of its last axis (a function and a layer). */
#include <math.h>
#include <string.h>

#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "module.h"

#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

/* Affine norms' weight (ones) and bias (zeros) of `shape`, registered as
 * parameters. */
static bool affine_params(ndm__module *m, ndm__site site, ndm_manager model, int nd,
                          const int64_t *shape, ndm_array *weight, ndm_array *bias)
{
    *weight = ndm__nn_filled(site, model, NDM_F32, nd, shape, 1.0, true);
    if (!weight->id || !ndm__module_add_param(m, "weight", *weight))
        return false;
    *bias = ndm__nn_filled(site, model, NDM_F32, nd, shape, 0.0, true);
    return bias->id && ndm__module_add_param(m, "bias", *bias);
}

/* ---- BatchNorm --------------------------------------------------------------------- */

typedef struct batch_norm {
    int spatial; /* 1 or 2 */
    int64_t features;
    double eps, momentum;
    ndm_array weight, bias;
    ndm_array running_mean, running_var, batches;
} batch_norm;

/* a (C) seen as (1, C, 1, ...) for an input of rank nd. */
static ndm_array per_channel(ndm__site site, ndm_array a, int nd)
{
    int64_t shape[8] = {1, -1, 1, 1, 1, 1, 1, 1};
    return ndm_reshape_to_at(AT, a, nd, shape);
}

/* (x - mean) / sqrt(var + eps), then weight and bias per channel when affine. */
static ndm_array bn_normalise(const batch_norm *b, ndm__site site, ndm_array d, ndm_array var,
                              int nd)
{
    ndm_array y = ndm_mul_to_at(AT, d, ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, var, b->eps)));
    if (b->weight.id)
        y = ndm_add_to_at(AT, ndm_mul_to_at(AT, y, per_channel(site, b->weight, nd)),
                          per_channel(site, b->bias, nd));
    return y;
}

/* running = (1 - momentum) running + momentum batch (the variance unbiased),
 * in place and without gradients. */
static ndm_status bn_update(batch_norm *b, ndm__site site, ndm_array mean, ndm_array var,
                            int64_t count)
{
    ndm_no_grad_begin();
    ndm_array bm = ndm_reshape_to_at(AT, mean, 1, (int64_t[]){-1});
    ndm_array bv = ndm_mul_scalar_to_at(AT, ndm_reshape_to_at(AT, var, 1, (int64_t[]){-1}),
                                        b->momentum * (double)count / (double)(count - 1));
    ndm_status st = bm.id && bv.id ? NDM_OK : ndm_last_status();
    if (st == NDM_OK)
        st = ndm_mul_scalar_inplace_at(NDM__SITE_ARGS(site), b->running_mean, 1 - b->momentum);
    if (st == NDM_OK)
        st = ndm_add_inplace_at(NDM__SITE_ARGS(site), b->running_mean,
                                ndm_mul_scalar_to_at(AT, bm, b->momentum));
    if (st == NDM_OK)
        st = ndm_mul_scalar_inplace_at(NDM__SITE_ARGS(site), b->running_var, 1 - b->momentum);
    if (st == NDM_OK)
        st = ndm_add_inplace_at(NDM__SITE_ARGS(site), b->running_var, bv);
    if (st == NDM_OK)
        st = ndm_add_scalar_inplace_at(NDM__SITE_ARGS(site), b->batches, 1);
    ndm_no_grad_end();
    return st;
}

/* The batch's statistics in training (the running ones updated: PyTorch's
 * momentum and unbiased variance), the running ones in evaluation. */
static ndm_array bn_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    batch_norm *b = m->data;
    int nd = ndm_array_ndim(x);
    if (nd < 0)
        return NDM_NULL_ARRAY;
    int64_t shape[8];
    bool rank_ok = b->spatial == 2 ? nd == 4 : nd == 2 || nd == 3;
    if (!rank_ok || ndm_array_shape(x, shape, 8) < 0 || shape[1] != b->features) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "BatchNorm%dd(%lld) takes (N, %lld%s), not a rank-%d input%s", b->spatial,
                  (long long)b->features, (long long)b->features,
                  b->spatial == 2 ? ", H, W" : "[, L]", nd,
                  rank_ok ? " with another channel count" : "");
        return NDM_NULL_ARRAY;
    }
    if (!m->training)
        return bn_normalise(b, site, ndm_sub_to_at(AT, x, per_channel(site, b->running_mean, nd)),
                            per_channel(site, b->running_var, nd), nd);
    int axes[3] = {0, 2, 3};
    int nax = nd - 1;
    int64_t count = shape[0];
    for (int i = 2; i < nd; i++)
        count *= shape[i];
    if (count < 2) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "batch norm in training needs more than one value per channel");
        return NDM_NULL_ARRAY;
    }
    ndm_array mean = ndm_mean_to_at(AT, x, true, nax, axes);
    ndm_array d = ndm_sub_to_at(AT, x, mean);
    ndm_array var = ndm_mean_to_at(AT, ndm_mul_to_at(AT, d, d), true, nax, axes);
    if (bn_update(b, site, mean, var, count) < 0)
        return NDM_NULL_ARRAY;
    return bn_normalise(b, site, d, var, nd);
}

static size_t bn_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const batch_norm *b = m->data;
    return ndm__module_put(buf, n, len, "BatchNorm%dd(%lld)", b->spatial,
                           (long long)b->features);
}

static void bn_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    batch_norm *l = m->data;
    ndm__rebind(&l->weight, old, now);
    ndm__rebind(&l->bias, old, now);
}

static const ndm__module_type batch_norm_type = {
    .name = "BatchNorm",
    .size = sizeof(batch_norm),
    .forward = bn_forward,
    .describe = bn_describe,
    .rebind = bn_rebind,
};

NDM_API ndm_module ndm_batch_norm_at(NDM_SITE_PARAMS, ndm_manager model, int spatial,
                                     int64_t features, double eps, double momentum, bool affine)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = spatial == 2 ? "ndm_batch_norm2d" : "ndm_batch_norm1d";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if ((spatial != 1 && spatial != 2) || features < 1 || !(eps > 0) || !isfinite(eps) ||
        !(momentum >= 0 && momentum <= 1)) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "features must be >= 1, eps > 0 and momentum in [0, 1] (got %lld, %g, %g)",
                  (long long)features, eps, momentum);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&batch_norm_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    batch_norm *b = m->data;
    *b = (batch_norm){.spatial = spatial, .features = features, .eps = eps, .momentum = momentum};
    if (affine && !affine_params(m, site, model, 1, &features, &b->weight, &b->bias))
        return ndm__module_abandon(m, api, site);
    b->running_mean = ndm__nn_filled(site, model, NDM_F32, 1, &features, 0.0, false);
    if (!b->running_mean.id || !ndm__module_add_buffer(m, "running_mean", b->running_mean))
        return ndm__module_abandon(m, api, site);
    b->running_var = ndm__nn_filled(site, model, NDM_F32, 1, &features, 1.0, false);
    if (!b->running_var.id || !ndm__module_add_buffer(m, "running_var", b->running_var))
        return ndm__module_abandon(m, api, site);
    b->batches = ndm__nn_filled(site, model, NDM_I64, 0, NULL, 0.0, false);
    if (!b->batches.id || !ndm__module_add_buffer(m, "num_batches_tracked", b->batches))
        return ndm__module_abandon(m, api, site);
    return ndm__module_finish(m, model, api, site);
}

/* ---- LayerNorm --------------------------------------------------------------------- */

typedef struct layer_norm {
    int nd; /* normalized trailing axes */
    int64_t shape[8];
    double eps;
    ndm_array weight, bias;
} layer_norm;

/* Normalise over the last nd axes (biased variance); an input of any rank. */
static ndm_array ln_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    const layer_norm *l = m->data;
    int nd = ndm_array_ndim(x);
    if (nd < 0)
        return NDM_NULL_ARRAY;
    bool ok = nd >= l->nd;
    for (int i = 0; ok && i < l->nd; i++)
        ok = ndm_array_dim(x, nd - l->nd + i) == l->shape[i];
    if (!ok) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "LayerNorm over %d trailing axes of sizes starting %lld does not fit a "
                  "rank-%d input",
                  l->nd, (long long)l->shape[0], nd);
        return NDM_NULL_ARRAY;
    }
    int axes[8];
    for (int i = 0; i < l->nd; i++)
        axes[i] = nd - l->nd + i;
    ndm_array mean = ndm_mean_to_at(AT, x, true, l->nd, axes);
    ndm_array d = ndm_sub_to_at(AT, x, mean);
    ndm_array var = ndm_mean_to_at(AT, ndm_mul_to_at(AT, d, d), true, l->nd, axes);
    ndm_array y = ndm_mul_to_at(AT, d, ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, var, l->eps)));
    if (l->weight.id)
        y = ndm_add_to_at(AT, ndm_mul_to_at(AT, y, l->weight), l->bias);
    return y;
}

static size_t ln_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const layer_norm *l = m->data;
    len = ndm__module_put(buf, n, len, "LayerNorm(");
    for (int i = 0; i < l->nd; i++)
        len = ndm__module_put(buf, n, len, i ? ", %lld" : "%lld", (long long)l->shape[i]);
    return ndm__module_put(buf, n, len, ")");
}

static void ln_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    layer_norm *l = m->data;
    ndm__rebind(&l->weight, old, now);
    ndm__rebind(&l->bias, old, now);
}

static const ndm__module_type layer_norm_type = {
    .name = "LayerNorm",
    .size = sizeof(layer_norm),
    .forward = ln_forward,
    .describe = ln_describe,
    .rebind = ln_rebind,
};

NDM_API ndm_module ndm_layer_norm_at(NDM_SITE_PARAMS, ndm_manager model, int ndim,
                                     const int64_t *shape, double eps, bool affine)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_layer_norm";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    bool ok = ndim >= 1 && ndim <= 8 && shape && eps > 0 && isfinite(eps);
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] >= 1;
    if (!ok) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "the normalized shape needs 1 to 8 sizes >= 1, and eps > 0 (got %d axes, %g)",
                  ndim, eps);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&layer_norm_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    layer_norm *l = m->data;
    l->nd = ndim;
    memcpy(l->shape, shape, (size_t)ndim * sizeof *shape);
    l->eps = eps;
    if (affine && !affine_params(m, site, model, ndim, shape, &l->weight, &l->bias))
        return ndm__module_abandon(m, api, site);
    return ndm__module_finish(m, model, api, site);
}

/* ---- RMSNorm ----------------------------------------------------------------------- */

/* x / sqrt(mean(x^2 over the last axis) + eps) [* weight]: one fused
 * kernel where the device has it (lib/ops/norm.c), else composed and
 * recorded as its parts, the temporaries in a scope of the output manager. */
static ndm_array rms_norm(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                          ndm_array weight, double eps)
{
    NDM__CALL_FRAME(api, site);
    ndm__view vx, vw;
    char d1[160], d2[160];
    if (!ndm__view_input(x, &vx, api, site) ||
        (weight.id && !ndm__view_input(weight, &vw, api, site)))
        return NDM_NULL_ARRAY;
    if (!ndm_dtype_is_float(vx.t.dtype) || (weight.id && !ndm_dtype_is_float(vw.t.dtype))) {
        ndm__fail(NDM_E_DTYPE, api, site, "x %s and weight %s must have float dtypes",
                  ndm__view_desc(&vx, d1, sizeof d1),
                  weight.id ? ndm__view_desc(&vw, d2, sizeof d2) : "(none)");
        return NDM_NULL_ARRAY;
    }
    int nd = vx.t.ndim;
    if (nd < 1 || (weight.id && (vw.t.ndim != 1 || vw.t.shape[0] != vx.t.shape[nd - 1]))) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "x %s needs a last axis, and weight %s its size as its only axis",
                  ndm__view_desc(&vx, d1, sizeof d1),
                  weight.id ? ndm__view_desc(&vw, d2, sizeof d2) : "(none)");
        return NDM_NULL_ARRAY;
    }
    if (!(eps >= 0) || !isfinite(eps)) {
        ndm__fail(NDM_E_INVALID, api, site, "eps must be finite and >= 0 (got %g)", eps);
        return NDM_NULL_ARRAY;
    }
    ndm_manager dst = ndm__output_for(out, x, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    ndm_array fused;
    if (ndm__rms_norm_fused(site, api, dst, x, weight, eps, &fused))
        return fused;
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "rms_norm");
    if (!s.id)
        return NDM_NULL_ARRAY;
    int last = nd - 1;
    ndm_array ms = ndm_mean_to_at(AT, ndm_mul_to_at(AT, x, x), true, 1, &last);
    ndm_array y = ndm_mul_to_at(AT, x, ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, ms, eps)));
    if (weight.id)
        y = ndm_mul_to_at(AT, y, weight);
    if (ndm_scope_end_at(NDM__SITE_ARGS(site), s, y.id ? 1 : 0, &y) < 0)
        return NDM_NULL_ARRAY;
    return y;
}

NDM_API ndm_array ndm_rms_norm_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                     ndm_array weight, double eps)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return rms_norm(NDM__SITE, "ndm_rms_norm", out, x, weight, eps);
}

typedef struct rms_norm_layer {
    int64_t features;
    double eps;
    ndm_array weight;
} rms_norm_layer;

static ndm_array rms_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    const rms_norm_layer *l = m->data;
    return rms_norm(site, api, NDM_OUTPUT_RULE, x, l->weight, l->eps);
}

static size_t rms_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const rms_norm_layer *l = m->data;
    return ndm__module_put(buf, n, len, "RMSNorm(%lld)", (long long)l->features);
}

static void rms_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    rms_norm_layer *l = m->data;
    ndm__rebind(&l->weight, old, now);
}

static const ndm__module_type rms_norm_type = {
    .name = "RMSNorm",
    .size = sizeof(rms_norm_layer),
    .forward = rms_forward,
    .describe = rms_describe,
    .rebind = rms_rebind,
};

NDM_API ndm_module ndm_rms_norm_module_at(NDM_SITE_PARAMS, ndm_manager model, int64_t features,
                                          double eps, bool affine)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_rms_norm_module";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if (features < 1 || !(eps >= 0) || !isfinite(eps)) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "features must be >= 1 and eps finite and >= 0 (got %lld, %g)",
                  (long long)features, eps);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&rms_norm_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    rms_norm_layer *l = m->data;
    l->features = features;
    l->eps = eps;
    if (affine) {
        l->weight = ndm__nn_filled(site, model, NDM_F32, 1, &features, 1.0, true);
        if (!l->weight.id || !ndm__module_add_param(m, "weight", l->weight))
            return ndm__module_abandon(m, api, site);
    }
    return ndm__module_finish(m, model, api, site);
}
