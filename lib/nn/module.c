/* Modules: layers whose parameters live in a model manager, run by
 * ndm_forward inside a scope so that temporaries (views of the parameters
 * included) never touch the model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../manager/object.h"
#include "../manager/thread.h"
#include "../ops/dispatch.h"
#include "../ops/fused.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

#define NAME_MAX_LEN 64

typedef enum kind {
    LINEAR,
    CONV2D,
    MAX_POOL2D,
    RELU,
    GELU,
    FLATTEN,
    DROPOUT,
    EMBEDDING,
    BATCH_NORM,
    LAYER_NORM,
    SEQUENTIAL,
} kind;

/* Named arrays of a module: its parameters, or its whole state (parameters
 * and buffers, in the order of PyTorch's state_dict). */
typedef struct named_list {
    int n;
    ndm_array *a;
    char (*names)[NAME_MAX_LEN];
} named_list;

typedef struct module {
    kind k;
    ndm_array weight, bias;
    ndm_array running_mean, running_var, batches; /* batch norm's buffers */
    int64_t in, out, kh, kw;
    int norm_nd;                  /* layer norm: normalized axes; batch norm: 1 or 2 */
    int64_t norm_shape[8];
    double eps, momentum;
    ndm_conv2d_opts conv;
    ndm_pool2d_opts pool;
    int start_axis;
    double p;
    ndm_rng rng;
    bool training;
    int nchildren;
    ndm_module *children;
    /* parameters of this module and its children, with names */
    named_list params;
    /* parameters and buffers, for checkpoints */
    named_list state;
} module;

static void module_destroy(void *p)
{
    module *m = p;
    free(m->children);
    free(m->params.a);
    free(m->params.names);
    free(m->state.a);
    free(m->state.names);
    free(m);
}

static const ndm__object_type module_type = {
    .name = "module",
    .ended = "freed",
    .destroy = module_destroy,
    .later = true,
};

static module *get(ndm_module h, const char *api, ndm__site site)
{
    return ndm__object_get(h.id, &module_type, api, site);
}

static module *alloc_module(kind k, const char *api, ndm__site site)
{
    module *m = ndm__calloc(1, sizeof *m, NDM__INJ_OBJECT);
    if (m)
        m->k = k;
    else
        ndm__fail(NDM_E_OOM, api, site, "no memory for a module");
    return m;
}

/* Register a built module; on failure it is freed (its arrays stay in the
 * model until it closes). */
static ndm_module finish(module *m, ndm_manager model, ndm__site site, const char *api)
{
    uint64_t id = ndm__object_new(&module_type, model, m, site, api);
    if (!id) {
        module_destroy(m);
        return (ndm_module){0};
    }
    return (ndm_module){id};
}

static bool list_add(named_list *l, const char *name, ndm_array a)
{
    ndm_array *p = ndm__realloc(l->a, (size_t)(l->n + 1) * sizeof *p, NDM__INJ_OBJECT);
    if (!p)
        return false;
    l->a = p;
    char(*n)[NAME_MAX_LEN] = ndm__realloc(l->names, (size_t)(l->n + 1) * sizeof *n, NDM__INJ_OBJECT);
    if (!n)
        return false;
    l->names = n;
    snprintf(l->names[l->n], NAME_MAX_LEN, "%s", name);
    l->a[l->n++] = a;
    return true;
}

/* A parameter is part of the state too (checkpoints save both). */
static bool add_param(module *m, const char *name, ndm_array a)
{
    return list_add(&m->params, name, a) && list_add(&m->state, name, a);
}

/* Built with gradients paused on this thread (ndm_no_grad_begin): an
 * inference model, whose parameters get no gradient arrays. */
static bool grads_wanted(void)
{
    return !ndm__ag_paused();
}

/* A parameter: an array of `shape` in the model with a gradient. */
static ndm_array make_param(ndm__site site, const char *api, ndm_manager model, int ndim,
                            const int64_t *shape, ndm_rng *rng, bool kaiming)
{
    ndm_array a = kaiming ? ndm_empty_at(NDM__SITE_ARGS(site), model, NDM_F32, ndim, shape)
                          : ndm_zeros_at(NDM__SITE_ARGS(site), model, NDM_F32, ndim, shape);
    if (!a.id)
        return a;
    if ((kaiming && ndm_init_kaiming_uniform_inplace_at(NDM__SITE_ARGS(site), a, rng) < 0) ||
        (grads_wanted() && ndm_requires_grad_at(NDM__SITE_ARGS(site), a) < 0)) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    (void)api;
    return a;
}

/* ---- initialisation ------------------------------------------------------------- */

static ndm_status fans(ndm_array a, const char *api, ndm__site site, double *fan_in,
                       double *fan_out)
{
    int nd = ndm_array_ndim(a);
    int64_t shape[16];
    if (nd < 1 || nd > 16 || ndm_array_shape(a, shape, 16) < 0)
        return ndm__fail(nd < 0 ? ndm_last_status() : NDM_E_SHAPE, api, site,
                         "initialisation needs an array of rank 1 to 16");
    double rf = 1;
    for (int i = 2; i < nd; i++)
        rf *= (double)shape[i];
    *fan_in = nd > 1 ? (double)shape[1] * rf : (double)shape[0];
    *fan_out = (double)shape[0] * rf;
    if (*fan_in <= 0)
        return ndm__fail(NDM_E_SHAPE, api, site, "fan-in is 0");
    return NDM_OK;
}

NDM_API ndm_status ndm_init_kaiming_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng)
{
    ndm__site site = NDM__SITE;
    double fi = 0, fo = 0;
    ndm_status st = fans(a, "ndm_init_kaiming_uniform_", site, &fi, &fo);
    if (st < 0)
        return st;
    double b = sqrt(2.0) * sqrt(3.0 / fi);
    return ndm_uniform_inplace_at(NDM__SITE_ARGS(site), a, rng, -b, b);
}

NDM_API ndm_status ndm_init_xavier_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng)
{
    ndm__site site = NDM__SITE;
    double fi = 0, fo = 0;
    ndm_status st = fans(a, "ndm_init_xavier_uniform_", site, &fi, &fo);
    if (st < 0)
        return st;
    double b = sqrt(6.0 / (fi + fo));
    return ndm_uniform_inplace_at(NDM__SITE_ARGS(site), a, rng, -b, b);
}

/* ---- constructors ------------------------------------------------------------------ */

static bool check_model(ndm_manager model, const char *api, ndm__site site)
{
    return ndm__manager_get(model, api, site) != NULL;
}

/* A constructor's failure: m is freed, and the error set if none was. */
static ndm_module abandon(module *m, const char *api, ndm__site site)
{
    if (ndm_last_status() == NDM_OK)
        ndm__fail(NDM_E_OOM, api, site, "no memory");
    module_destroy(m);
    return (ndm_module){0};
}

/* A layer's parameters: its weight of shape wshape (Kaiming-uniform) and,
 * with `bias`, m->out zeros; then the module is registered. */
static ndm_module with_params(module *m, ndm__site site, const char *api, ndm_manager model,
                              int wnd, const int64_t *wshape, bool bias, ndm_rng *rng)
{
    m->weight = make_param(site, api, model, wnd, wshape, rng, true);
    if (!m->weight.id || !add_param(m, "weight", m->weight))
        return abandon(m, api, site);
    if (bias) {
        m->bias = make_param(site, api, model, 1, &m->out, rng, false);
        if (!m->bias.id || !add_param(m, "bias", m->bias))
            return abandon(m, api, site);
    }
    return finish(m, model, site, api);
}

NDM_API ndm_module ndm_linear_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in, int64_t out,
                                 bool bias, ndm_rng *rng)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_linear";
    if (!check_model(model, api, site))
        return (ndm_module){0};
    if (in < 1 || out < 1 || !rng) {
        ndm__fail(NDM_E_INVALID, api, site, "sizes must be >= 1 and rng given (in %lld, out %lld)",
                  (long long)in, (long long)out);
        return (ndm_module){0};
    }
    module *m = alloc_module(LINEAR, api, site);
    if (!m)
        return (ndm_module){0};
    m->in = in;
    m->out = out;
    return with_params(m, site, api, model, 2, (int64_t[]){out, in}, bias, rng);
}

NDM_API ndm_module ndm_conv2d_module_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in_ch,
                                        int64_t out_ch, int64_t kh, int64_t kw, bool bias,
                                        ndm_rng *rng, const ndm_conv2d_opts *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_conv2d_module";
    if (!check_model(model, api, site))
        return (ndm_module){0};
    int64_t groups = opts && opts->groups ? opts->groups : 1;
    if (in_ch < 1 || out_ch < 1 || kh < 1 || kw < 1 || !rng || in_ch % groups ||
        out_ch % groups) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "channels and kernel sizes must be >= 1, divisible by groups, and rng given");
        return (ndm_module){0};
    }
    module *m = alloc_module(CONV2D, api, site);
    if (!m)
        return (ndm_module){0};
    m->in = in_ch;
    m->out = out_ch;
    m->kh = kh;
    m->kw = kw;
    if (opts)
        m->conv = *opts;
    return with_params(m, site, api, model, 4, (int64_t[]){out_ch, in_ch / groups, kh, kw}, bias,
                       rng);
}

/* A module without parameters: a copy of `proto`. */
static ndm_module simple(ndm__site site, const char *api, ndm_manager model, module proto)
{
    if (!check_model(model, api, site))
        return (ndm_module){0};
    module *m = alloc_module(proto.k, api, site);
    if (!m)
        return (ndm_module){0};
    *m = proto;
    return finish(m, model, site, api);
}

NDM_API ndm_module ndm_max_pool2d_module_at(NDM_SITE_PARAMS, ndm_manager model,
                                            const ndm_pool2d_opts *opts)
{
    ndm__site site = NDM__SITE;
    if (!opts || opts->kernel[0] < 1 || opts->kernel[1] < 1) {
        ndm__fail(NDM_E_INVALID, "ndm_max_pool2d_module", site, "a kernel size >= 1 is required");
        return (ndm_module){0};
    }
    return simple(site, "ndm_max_pool2d_module", model, (module){.k = MAX_POOL2D, .pool = *opts});
}

NDM_API ndm_module ndm_relu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    return simple(NDM__SITE, "ndm_relu_module", model, (module){.k = RELU});
}

NDM_API ndm_module ndm_gelu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    return simple(NDM__SITE, "ndm_gelu_module", model, (module){.k = GELU});
}

NDM_API ndm_module ndm_flatten_module_at(NDM_SITE_PARAMS, ndm_manager model, int start_axis)
{
    return simple(NDM__SITE, "ndm_flatten_module", model,
                  (module){.k = FLATTEN, .start_axis = start_axis});
}

NDM_API ndm_module ndm_dropout_module_at(NDM_SITE_PARAMS, ndm_manager model, double p,
                                         uint64_t seed)
{
    ndm__site site = NDM__SITE;
    if (!(p >= 0 && p < 1)) {
        ndm__fail(NDM_E_INVALID, "ndm_dropout_module", site, "p must be in [0, 1) (got %g)", p);
        return (ndm_module){0};
    }
    return simple(site, "ndm_dropout_module", model,
                  (module){.k = DROPOUT, .p = p, .rng = ndm_rng_new(seed), .training = true});
}

NDM_API ndm_module ndm_embedding_at(NDM_SITE_PARAMS, ndm_manager model, int64_t num, int64_t dim,
                                    ndm_rng *rng)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_embedding";
    if (!check_model(model, api, site))
        return (ndm_module){0};
    if (num < 1 || dim < 1 || !rng) {
        ndm__fail(NDM_E_INVALID, api, site, "sizes must be >= 1 and rng given");
        return (ndm_module){0};
    }
    module *m = alloc_module(EMBEDDING, api, site);
    if (!m)
        return (ndm_module){0};
    m->in = num;
    m->out = dim;
    m->weight = ndm_empty_at(NDM__SITE_ARGS(site), model, NDM_F32, 2, (int64_t[]){num, dim});
    if (!m->weight.id || ndm_normal_inplace_at(NDM__SITE_ARGS(site), m->weight, rng, 0, 1) < 0 ||
        (grads_wanted() && ndm_requires_grad_at(NDM__SITE_ARGS(site), m->weight) < 0) ||
        !add_param(m, "weight", m->weight))
        return abandon(m, api, site);
    return finish(m, model, site, api);
}

/* An array of the model filled with `value`, with no gradient (a buffer) or
 * with one (a parameter, unless gradients are paused). */
static ndm_array filled(ndm__site site, ndm_manager model, ndm_dtype dt, int nd,
                        const int64_t *shape, double value, bool param)
{
    ndm_array a = ndm_full_at(NDM__SITE_ARGS(site), model, dt, value, nd, shape);
    if (a.id && param && grads_wanted() && ndm_requires_grad_at(NDM__SITE_ARGS(site), a) < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

NDM_API ndm_module ndm_batch_norm_at(NDM_SITE_PARAMS, ndm_manager model, int spatial,
                                     int64_t features, double eps, double momentum, bool affine)
{
    ndm__site site = NDM__SITE;
    const char *api = spatial == 2 ? "ndm_batch_norm2d" : "ndm_batch_norm1d";
    if (!check_model(model, api, site))
        return (ndm_module){0};
    if ((spatial != 1 && spatial != 2) || features < 1 || !(eps > 0) || !isfinite(eps) ||
        !(momentum >= 0 && momentum <= 1)) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "features must be >= 1, eps > 0 and momentum in [0, 1] (got %lld, %g, %g)",
                  (long long)features, eps, momentum);
        return (ndm_module){0};
    }
    module *m = alloc_module(BATCH_NORM, api, site);
    if (!m)
        return (ndm_module){0};
    m->norm_nd = spatial;
    m->out = features;
    m->eps = eps;
    m->momentum = momentum;
    if (affine) {
        m->weight = filled(site, model, NDM_F32, 1, &features, 1.0, true);
        if (!m->weight.id || !add_param(m, "weight", m->weight))
            return abandon(m, api, site);
        m->bias = filled(site, model, NDM_F32, 1, &features, 0.0, true);
        if (!m->bias.id || !add_param(m, "bias", m->bias))
            return abandon(m, api, site);
    }
    m->running_mean = filled(site, model, NDM_F32, 1, &features, 0.0, false);
    if (!m->running_mean.id || !list_add(&m->state, "running_mean", m->running_mean))
        return abandon(m, api, site);
    m->running_var = filled(site, model, NDM_F32, 1, &features, 1.0, false);
    if (!m->running_var.id || !list_add(&m->state, "running_var", m->running_var))
        return abandon(m, api, site);
    m->batches = filled(site, model, NDM_I64, 0, NULL, 0.0, false);
    if (!m->batches.id || !list_add(&m->state, "num_batches_tracked", m->batches))
        return abandon(m, api, site);
    m->training = true;
    return finish(m, model, site, api);
}

NDM_API ndm_module ndm_layer_norm_at(NDM_SITE_PARAMS, ndm_manager model, int ndim,
                                     const int64_t *shape, double eps, bool affine)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_layer_norm";
    if (!check_model(model, api, site))
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
    module *m = alloc_module(LAYER_NORM, api, site);
    if (!m)
        return (ndm_module){0};
    m->norm_nd = ndim;
    memcpy(m->norm_shape, shape, (size_t)ndim * sizeof *shape);
    m->eps = eps;
    if (affine) {
        m->weight = filled(site, model, NDM_F32, ndim, shape, 1.0, true);
        if (!m->weight.id || !add_param(m, "weight", m->weight))
            return abandon(m, api, site);
        m->bias = filled(site, model, NDM_F32, ndim, shape, 0.0, true);
        if (!m->bias.id || !add_param(m, "bias", m->bias))
            return abandon(m, api, site);
    }
    return finish(m, model, site, api);
}

NDM_API ndm_module ndm_sequential_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                     const ndm_module *modules)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_sequential";
    if (!check_model(model, api, site))
        return (ndm_module){0};
    if (n < 0 || (n && !modules)) {
        ndm__fail(NDM_E_INVALID, api, site, "invalid module list (n = %d)", n);
        return (ndm_module){0};
    }
    for (int i = 0; i < n; i++) {
        /* (a null module from a constructor that failed keeps its error) */
        if (ndm__module_check_owner(modules[i], model, api, site) < 0)
            return (ndm_module){0};
    }
    module *m = alloc_module(SEQUENTIAL, api, site);
    if (!m)
        return (ndm_module){0};
    if (!(m->children = ndm__malloc((size_t)(n ? n : 1) * sizeof *m->children, NDM__INJ_OBJECT))) {
        free(m);
        ndm__fail(NDM_E_OOM, api, site, "no memory for a module");
        return (ndm_module){0};
    }
    m->nchildren = n;
    if (n)
        memcpy(m->children, modules, (size_t)n * sizeof *modules);
    for (int i = 0; i < n; i++) {
        module *c = get(modules[i], api, site);
        for (int pass = 0; pass < 2; pass++) {
            named_list *from = pass ? &c->state : &c->params, *to = pass ? &m->state : &m->params;
            for (int k = 0; k < from->n; k++) {
                char name[NAME_MAX_LEN];
                snprintf(name, sizeof name, "%d.%s", i, from->names[k]);
                if (!list_add(to, name, from->a[k])) {
                    module_destroy(m);
                    ndm__fail(NDM_E_OOM, api, site, "no memory");
                    return (ndm_module){0};
                }
            }
        }
    }
    return finish(m, model, site, api);
}

/* ---- forward ------------------------------------------------------------------------ */

/* The layers' operations are given the caller's site, so that a failure
 * inside a forward pass names the user's line, not this file. */
#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

/* a (C) seen as (1, C, 1, ...) for an input of rank nd. */
static ndm_array per_channel(ndm__site site, ndm_array a, int nd)
{
    int64_t shape[8] = {1, -1, 1, 1, 1, 1, 1, 1};
    return ndm_reshape_to_at(AT, a, nd, shape);
}

/* Batch norm: normalise each channel (axis 1) over every other axis, with
 * the batch's statistics in training (and the running ones updated in place:
 * PyTorch's momentum and unbiased variance), with the running ones in
 * evaluation. */
static ndm_array batch_norm(module *m, ndm_array x, const char *api, ndm__site site)
{
    int nd = ndm_array_ndim(x);
    if (nd < 0)
        return NDM_NULL_ARRAY;
    int64_t shape[8];
    bool rank_ok = m->norm_nd == 2 ? nd == 4 : nd == 2 || nd == 3;
    if (!rank_ok || ndm_array_shape(x, shape, 8) < 0 || shape[1] != m->out) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "BatchNorm%dd(%lld) takes (N, %lld%s), not a rank-%d input%s", m->norm_nd,
                  (long long)m->out, (long long)m->out,
                  m->norm_nd == 2 ? ", H, W" : "[, L]", nd,
                  rank_ok ? " with another channel count" : "");
        return NDM_NULL_ARRAY;
    }
    int axes[3] = {0, 2, 3};
    int nax = nd - 1;
    ndm_array mean, var;
    if (m->training) {
        int64_t count = shape[0];
        for (int i = 2; i < nd; i++)
            count *= shape[i];
        if (count < 2) {
            ndm__fail(NDM_E_SHAPE, api, site,
                      "batch norm in training needs more than one value per channel");
            return NDM_NULL_ARRAY;
        }
        mean = ndm_mean_to_at(AT, x, true, nax, axes);
        ndm_array d = ndm_sub_to_at(AT, x, mean);
        var = ndm_mean_to_at(AT, ndm_mul_to_at(AT, d, d), true, nax, axes);
        /* running = (1 - momentum) running + momentum batch (variance unbiased) */
        ndm_no_grad_begin();
        ndm_array bm = ndm_reshape_to_at(AT, mean, 1, (int64_t[]){-1});
        ndm_array bv = ndm_mul_scalar_to_at(AT, ndm_reshape_to_at(AT, var, 1, (int64_t[]){-1}),
                                            m->momentum * (double)count / (double)(count - 1));
        ndm_status st = bm.id && bv.id ? NDM_OK : ndm_last_status();
        if (st == NDM_OK)
            st = ndm_mul_scalar_inplace_at(NDM__SITE_ARGS(site), m->running_mean, 1 - m->momentum);
        if (st == NDM_OK)
            st = ndm_add_inplace_at(NDM__SITE_ARGS(site), m->running_mean,
                                    ndm_mul_scalar_to_at(AT, bm, m->momentum));
        if (st == NDM_OK)
            st = ndm_mul_scalar_inplace_at(NDM__SITE_ARGS(site), m->running_var, 1 - m->momentum);
        if (st == NDM_OK)
            st = ndm_add_inplace_at(NDM__SITE_ARGS(site), m->running_var, bv);
        if (st == NDM_OK)
            st = ndm_add_scalar_inplace_at(NDM__SITE_ARGS(site), m->batches, 1);
        ndm_no_grad_end();
        if (st < 0)
            return NDM_NULL_ARRAY;
        ndm_array y = ndm_mul_to_at(AT, d, ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, var, m->eps)));
        if (m->weight.id)
            y = ndm_add_to_at(AT, ndm_mul_to_at(AT, y, per_channel(site, m->weight, nd)),
                              per_channel(site, m->bias, nd));
        return y;
    }
    mean = per_channel(site, m->running_mean, nd);
    var = per_channel(site, m->running_var, nd);
    ndm_array y = ndm_mul_to_at(AT, ndm_sub_to_at(AT, x, mean),
                                ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, var, m->eps)));
    if (m->weight.id)
        y = ndm_add_to_at(AT, ndm_mul_to_at(AT, y, per_channel(site, m->weight, nd)),
                          per_channel(site, m->bias, nd));
    return y;
}

/* Layer norm: normalise over the last norm_nd axes (biased variance). */
static ndm_array layer_norm(module *m, ndm_array x, const char *api, ndm__site site)
{
    /* the record's own shape: an input of any rank */
    const ndm__array *r = ndm__array_get_prop(x, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int nd = r->ndim;
    const int64_t *shape = r->shape;
    bool ok = nd >= m->norm_nd;
    for (int i = 0; ok && i < m->norm_nd; i++)
        ok = shape[nd - m->norm_nd + i] == m->norm_shape[i];
    if (!ok) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "LayerNorm over %d trailing axes of sizes starting %lld does not fit a "
                  "rank-%d input",
                  m->norm_nd, (long long)m->norm_shape[0], nd);
        return NDM_NULL_ARRAY;
    }
    int axes[8];
    for (int i = 0; i < m->norm_nd; i++)
        axes[i] = nd - m->norm_nd + i;
    ndm_array mean = ndm_mean_to_at(AT, x, true, m->norm_nd, axes);
    ndm_array d = ndm_sub_to_at(AT, x, mean);
    ndm_array var = ndm_mean_to_at(AT, ndm_mul_to_at(AT, d, d), true, m->norm_nd, axes);
    ndm_array y = ndm_mul_to_at(AT, d, ndm_rsqrt_to_at(AT, ndm_add_scalar_to_at(AT, var, m->eps)));
    if (m->weight.id)
        y = ndm_add_to_at(AT, ndm_mul_to_at(AT, y, m->weight), m->bias);
    return y;
}

static ndm_array run(module *m, ndm_array x, const char *api, ndm__site site)
{
    switch (m->k) {
    case LINEAR:
        return ndm__linear(site, api, x, m->weight, m->bias, false);
    case CONV2D:
        return ndm_conv2d_to_at(AT, x, m->weight, m->bias.id ? &m->bias : NULL, &m->conv);
    case MAX_POOL2D:
        return ndm_max_pool2d_to_at(AT, x, &m->pool);
    case RELU:
        return ndm_relu_to_at(AT, x);
    case GELU:
        return ndm_gelu_to_at(AT, x);
    case FLATTEN: {
        const ndm__array *r = ndm__array_get_prop(x, api, site);
        int ax;
        if (!r || ndm__axis(m->start_axis, r->ndim, false, &ax, api, site) < 0)
            return NDM_NULL_ARRAY;
        /* the kept sizes and -1: on the heap for an input of high rank */
        int64_t small[16], *shape = ax < 16 ? small : malloc((size_t)(ax + 1) * sizeof *shape);
        if (!shape) {
            ndm__fail(NDM_E_OOM, api, site,
                      "no memory for the shape of Flatten(%d) of a rank-%d input",
                      m->start_axis, r->ndim);
            return NDM_NULL_ARRAY;
        }
        memcpy(shape, r->shape, (size_t)ax * sizeof *shape);
        shape[ax] = -1;
        ndm_array y = ndm_reshape_to_at(AT, x, ax + 1, shape);
        if (shape != small)
            free(shape);
        return y;
    }
    case DROPOUT: {
        if (!m->training || m->p == 0)
            return ndm_alias_to_at(AT, x);
        /* the record's own shape: an input of any rank */
        const ndm__array *r = ndm__array_get_prop(x, api, site);
        if (!r)
            return NDM_NULL_ARRAY;
        ndm_array keep = ndm_bernoulli_at(NDM__SITE_ARGS(site), NDM_CURRENT_SCOPE, &m->rng,
                                          r->dtype, 1.0 - m->p, r->ndim, r->shape);
        return ndm_mul_to_at(AT, x, ndm_mul_scalar_to_at(AT, keep, 1.0 / (1.0 - m->p)));
    }
    case EMBEDDING:
        return ndm_take_to_at(AT, m->weight, 0, x);
    case BATCH_NORM:
        return batch_norm(m, x, api, site);
    case LAYER_NORM:
        return layer_norm(m, x, api, site);
    case SEQUENTIAL: {
        ndm_array y = x;
        for (int i = 0; i < m->nchildren && y.id; i++) {
            module *c = get(m->children[i], api, site);
            module *next = c && c->k == LINEAR && i + 1 < m->nchildren
                               ? get(m->children[i + 1], api, site)
                               : NULL;
            if (next && next->k == RELU) {
                /* a linear layer and its relu in one pass */
                y = ndm__linear(site, api, y, c->weight, c->bias, true);
                i++;
                continue;
            }
            y = c ? run(c, y, api, site) : NDM_NULL_ARRAY;
        }
        return m->nchildren ? y : ndm_alias_to_at(AT, x);
    }
    }
    return NDM_NULL_ARRAY;
}

#undef AT

NDM_API ndm_array ndm_forward_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module mh, ndm_array x)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_forward";
    NDM__CALL_FRAME(api, site);
    module *m = get(mh, api, site);
    ndm__array *rx = m ? ndm__array_get_prop(x, api, site) : NULL;
    if (!rx)
        return NDM_NULL_ARRAY;
    ndm_manager dst = ndm__output_manager(out, rx, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    /* Every intermediate (views of the parameters too) lands in this scope,
     * so nothing reaches the model; the result moves to dst. */
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "forward");
    if (!s.id)
        return NDM_NULL_ARRAY;
    ndm_array y = run(m, x, api, site);
    ndm_status st = ndm_scope_end_at(NDM__SITE_ARGS(site), s, y.id ? 1 : 0, &y);
    return y.id && st == NDM_OK ? y : NDM_NULL_ARRAY;
}

ndm_array ndm__module_run(ndm_module mh, ndm_array x, const char *api, ndm__site site)
{
    NDM__OP_GUARD();
    module *m = get(mh, api, site);
    return m ? run(m, x, api, site) : NDM_NULL_ARRAY;
}

NDM_API ndm_status ndm_module_set_training(ndm_module mh, bool training)
{
    module *m = get(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) {
        ndm_status st = ndm_module_set_training(m->children[i], training);
        if (st < 0)
            return st;
    }
    return NDM_OK;
}

NDM_API int ndm_module_named_parameters(ndm_module mh, const char **names, ndm_array *out,
                                        int cap)
{
    module *m = get(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    for (int i = 0; i < m->params.n && i < cap; i++) {
        if (out)
            out[i] = m->params.a[i];
        if (names)
            names[i] = m->params.names[i];
    }
    return m->params.n;
}

NDM_API int ndm_module_named_state(ndm_module mh, const char **names, ndm_array *out, int cap)
{
    module *m = get(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    for (int i = 0; i < m->state.n && i < cap; i++) {
        if (out)
            out[i] = m->state.a[i];
        if (names)
            names[i] = m->state.names[i];
    }
    return m->state.n;
}

NDM_API int ndm_module_parameters(ndm_module mh, ndm_array *out, int cap)
{
    return ndm_module_named_parameters(mh, NULL, out, cap);
}

static size_t describe(module *m, char *buf, size_t n, size_t len)
{
#define PUT(...) (len += (size_t)snprintf(buf + (len < n ? len : n), len < n ? n - len : 0, __VA_ARGS__))
    switch (m->k) {
    case LINEAR:
        PUT("Linear(%lld, %lld%s)", (long long)m->in, (long long)m->out,
            m->bias.id ? "" : ", bias=false");
        break;
    case CONV2D:
        PUT("Conv2d(%lld, %lld, %lldx%lld)", (long long)m->in, (long long)m->out,
            (long long)m->kh, (long long)m->kw);
        break;
    case MAX_POOL2D:
        PUT("MaxPool2d(%lldx%lld)", (long long)m->pool.kernel[0], (long long)m->pool.kernel[1]);
        break;
    case RELU:
        PUT("ReLU");
        break;
    case GELU:
        PUT("GELU");
        break;
    case FLATTEN:
        PUT("Flatten(%d)", m->start_axis);
        break;
    case DROPOUT:
        PUT("Dropout(%g)", m->p);
        break;
    case EMBEDDING:
        PUT("Embedding(%lld, %lld)", (long long)m->in, (long long)m->out);
        break;
    case BATCH_NORM:
        PUT("BatchNorm%dd(%lld)", m->norm_nd, (long long)m->out);
        break;
    case LAYER_NORM:
        PUT("LayerNorm(");
        for (int i = 0; i < m->norm_nd; i++)
            PUT(i ? ", %lld" : "%lld", (long long)m->norm_shape[i]);
        PUT(")");
        break;
    case SEQUENTIAL:
        PUT("Sequential(");
        for (int i = 0; i < m->nchildren; i++) {
            module *c = get(m->children[i], "ndm_module_describe", NDM__NO_SITE);
            if (i)
                PUT(", ");
            if (c)
                len = describe(c, buf, n, len);
        }
        PUT(")");
        break;
    }
#undef PUT
    return len;
}

NDM_API int ndm_module_describe(ndm_module mh, char *buf, size_t n)
{
    module *m = get(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if (buf && n)
        buf[0] = '\0';
    char none[1];
    return (int)describe(m, buf ? buf : none, buf ? n : 0, 0);
}

bool ndm__module_valid(ndm_module m) { return ndm__object_valid(m.id, &module_type); }

ndm_status ndm__module_check_owner(ndm_module mh, ndm_manager model, const char *api,
                                   ndm__site site)
{
    module *m = get(mh, api, site);
    ndm__manager *mr = m ? ndm__manager_get(model, api, site) : NULL;
    if (!mr)
        return ndm_last_status();
    uint32_t want = mr->self;
    char path[512], other[512];
    ndm_manager owner = ndm__object_owner(mh.id);
    if (owner.id != ndm__manager_handle_of(mr).id) {
        ndm_manager_path(owner, other, sizeof other);
        ndm__manager_path(want, path, sizeof path);
        return ndm__fail(NDM_E_NOT_OWNER, api, site,
                         "the module belongs to '%s', not to the model '%s'", other, path);
    }
    for (int k = 0; k < m->state.n; k++) {
        ndm__array *r = ndm__array_get(m->state.a[k], api, site);
        if (!r)
            return ndm_last_status();
        if (r->mgr != want) {
            ndm__manager_path(r->mgr, other, sizeof other);
            ndm__manager_path(want, path, sizeof path);
            return ndm__fail(NDM_E_NOT_OWNER, api, site,
                             "parameter '%s' of the module lives in '%s', not in the model '%s'",
                             m->state.names[k], other, path);
        }
    }
    return NDM_OK;
}
