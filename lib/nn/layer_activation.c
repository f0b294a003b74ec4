/* ReLU and GELU: elementwise activations without parameters (PyTorch's
 * nn.ReLU, and nn.GELU with the exact erf form). */
#include "module.h"

static ndm_array relu_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)m, (void)api;
    return ndm_relu_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, x);
}

const ndm__module_type ndm__module_relu = {
    .name = "ReLU",
    .forward = relu_forward,
    .describe = ndm__module_describe_name,
};

NDM_API ndm_module ndm_relu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    NDM__ENTRY(__func__);
    return ndm__module_plain(&ndm__module_relu, model, "ndm_relu_module", NDM__SITE);
}

static ndm_array gelu_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)m, (void)api;
    return ndm_gelu_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, x);
}

static const ndm__module_type gelu_type = {
    .name = "GELU",
    .forward = gelu_forward,
    .describe = ndm__module_describe_name,
};

NDM_API ndm_module ndm_gelu_module_at(NDM_SITE_PARAMS, ndm_manager model)
{
    NDM__ENTRY(__func__);
    return ndm__module_plain(&gelu_type, model, "ndm_gelu_module", NDM__SITE);
}
