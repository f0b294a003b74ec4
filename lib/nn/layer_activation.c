/* ReLU and GELU: elementwise activations without parameters (PyTorch's
 * nn.ReLU, and nn.GELU with the exact erf form). */
#include "module.h"

#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

static ndm_array relu_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)m, (void)api;
    return ndm_relu_to_at(AT, x);
}

static size_t relu_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    (void)m;
    return ndm__module_put(buf, n, len, "ReLU");
}

const ndm__module_type ndm__module_relu = {
    .name = "ReLU",
    .forward = relu_forward,
    .describe = relu_describe,
};

NDM_API ndm_module ndm_relu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    ndm__site site = NDM__SITE;
    ndm__module *m = ndm__module_new(&ndm__module_relu, model, "ndm_relu_module", site);
    return m ? ndm__module_finish(m, model, "ndm_relu_module", site) : (ndm_module){0};
}

static ndm_array gelu_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)m, (void)api;
    return ndm_gelu_to_at(AT, x);
}

static size_t gelu_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    (void)m;
    return ndm__module_put(buf, n, len, "GELU");
}

static const ndm__module_type gelu_type = {
    .name = "GELU",
    .forward = gelu_forward,
    .describe = gelu_describe,
};

NDM_API ndm_module ndm_gelu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    ndm__site site = NDM__SITE;
    ndm__module *m = ndm__module_new(&gelu_type, model, "ndm_gelu_module", site);
    return m ? ndm__module_finish(m, model, "ndm_gelu_module", site) : (ndm_module){0};
}
