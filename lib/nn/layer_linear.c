/* Linear: y = x W^T + b, PyTorch's nn.Linear, with W (out, in) Kaiming-uniform
 * and b (out) zeros; followed by a ReLU in a Sequential it runs fused. */
#include "../ops/inner.h"
#include "module.h"

typedef struct linear {
    int64_t in, out;
    ndm_array weight, bias;
} linear;

/* An integer or bool input is refused, as PyTorch's nn.Linear refuses it:
 * promoting it silently would hide a missing conversion (of labels, of raw
 * pixels). A stale or null x is left to ndm__linear's message. */
static bool float_input(ndm_array x, const char *api, ndm__site site)
{
    if (!ndm_array_valid(x) || ndm_dtype_is_float(ndm_array_dtype(x)))
        return true;
    ndm__fail(NDM_E_DTYPE, api, site,
              "Linear takes a float input, got %s (convert it first: ndm_astype)",
              ndm_dtype_short(ndm_array_dtype(x)));
    return false;
}

static ndm_array linear_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    const linear *l = m->data;
    if (!float_input(x, api, site))
        return NDM_NULL_ARRAY;
    return ndm__linear(site, api, x, l->weight, l->bias, false);
}

static ndm_array linear_forward_relu(ndm__module *m, ndm_array x, const char *api,
                                     ndm__site site)
{
    const linear *l = m->data;
    if (!float_input(x, api, site))
        return NDM_NULL_ARRAY;
    return ndm__linear(site, api, x, l->weight, l->bias, true);
}

static size_t linear_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const linear *l = m->data;
    return ndm__module_put(buf, n, len, "Linear(%lld, %lld%s)", (long long)l->in,
                           (long long)l->out, l->bias.id ? "" : ", bias=false");
}

static void linear_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    linear *l = m->data;
    ndm__rebind(&l->weight, old, now);
    ndm__rebind(&l->bias, old, now);
}

static const ndm__module_type linear_type = {
    .name = "Linear",
    .size = sizeof(linear),
    .forward = linear_forward,
    .forward_relu = linear_forward_relu,
    .describe = linear_describe,
    .rebind = linear_rebind,
};

NDM_API ndm_module ndm_linear_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in, int64_t out,
                                 bool bias, ndm_rng *rng)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_linear";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if (in < 1 || out < 1 || !rng) {
        ndm__fail(NDM_E_INVALID, api, site, "sizes must be >= 1 and rng given (in %lld, out %lld)",
                  (long long)in, (long long)out);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&linear_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    linear *l = m->data;
    l->in = in;
    l->out = out;
    l->weight = ndm__nn_param(site, model, 2, (int64_t[]){out, in}, rng, true);
    if (!l->weight.id || !ndm__module_add_param(m, "weight", l->weight))
        return ndm__module_abandon(m, api, site);
    if (bias) {
        l->bias = ndm__nn_param(site, model, 1, &out, rng, false);
        if (!l->bias.id || !ndm__module_add_param(m, "bias", l->bias))
            return ndm__module_abandon(m, api, site);
    }
    return ndm__module_finish(m, model, api, site);
}
