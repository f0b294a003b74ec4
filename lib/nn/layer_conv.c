/* Conv2d and MaxPool2d: PyTorch's nn.Conv2d (weight (out, in/groups, kh, kw)
 * Kaiming-uniform, bias (out) zeros) and nn.MaxPool2d over NCHW inputs. */
#include "module.h"

typedef struct conv2d {
    int64_t in, out, kh, kw;
    ndm_conv2d_opts opts;
    ndm_array weight, bias;
} conv2d;

#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

static ndm_array conv2d_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)api;
    conv2d *c = m->data;
    return ndm_conv2d_to_at(AT, x, c->weight, c->bias.id ? &c->bias : NULL, &c->opts);
}

static size_t conv2d_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const conv2d *c = m->data;
    return ndm__module_put(buf, n, len, "Conv2d(%lld, %lld, %lldx%lld)", (long long)c->in,
                           (long long)c->out, (long long)c->kh, (long long)c->kw);
}

static void conv2d_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    conv2d *l = m->data;
    ndm__rebind(&l->weight, old, now);
    ndm__rebind(&l->bias, old, now);
}

static const ndm__module_type conv2d_type = {
    .name = "Conv2d",
    .size = sizeof(conv2d),
    .forward = conv2d_forward,
    .describe = conv2d_describe,
    .rebind = conv2d_rebind,
};

NDM_API ndm_module ndm_conv2d_module_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in_ch,
                                        int64_t out_ch, int64_t kh, int64_t kw, bool bias,
                                        ndm_rng *rng, const ndm_conv2d_opts *opts)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_conv2d_module";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    int64_t groups = opts && opts->groups ? opts->groups : 1;
    if (in_ch < 1 || out_ch < 1 || kh < 1 || kw < 1 || !rng || in_ch % groups ||
        out_ch % groups) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "channels and kernel sizes must be >= 1, divisible by groups, and rng given");
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&conv2d_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    conv2d *c = m->data;
    *c = (conv2d){.in = in_ch, .out = out_ch, .kh = kh, .kw = kw};
    if (opts)
        c->opts = *opts;
    c->weight = ndm__nn_param(site, model, 4, (int64_t[]){out_ch, in_ch / groups, kh, kw}, rng,
                              true);
    if (!c->weight.id || !ndm__module_add_param(m, "weight", c->weight))
        return ndm__module_abandon(m, api, site);
    if (bias) {
        c->bias = ndm__nn_param(site, model, 1, &out_ch, rng, false);
        if (!c->bias.id || !ndm__module_add_param(m, "bias", c->bias))
            return ndm__module_abandon(m, api, site);
    }
    return ndm__module_finish(m, model, api, site);
}

/* ---- MaxPool2d --------------------------------------------------------------------- */

static ndm_array pool_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)api;
    const ndm_pool2d_opts *o = m->data;
    return ndm_max_pool2d_to_at(AT, x, o);
}

static size_t pool_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const ndm_pool2d_opts *o = m->data;
    return ndm__module_put(buf, n, len, "MaxPool2d(%lldx%lld)", (long long)o->kernel[0],
                           (long long)o->kernel[1]);
}

static const ndm__module_type max_pool2d_type = {
    .name = "MaxPool2d",
    .size = sizeof(ndm_pool2d_opts),
    .forward = pool_forward,
    .describe = pool_describe,
};

NDM_API ndm_module ndm_max_pool2d_module_at(NDM_SITE_PARAMS, ndm_manager model,
                                            const ndm_pool2d_opts *opts)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_max_pool2d_module";
    if (!opts || opts->kernel[0] < 1 || opts->kernel[1] < 1) {
        ndm__fail(NDM_E_INVALID, api, site, "a kernel size >= 1 is required");
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&max_pool2d_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    *(ndm_pool2d_opts *)m->data = *opts;
    return ndm__module_finish(m, model, api, site);
}
