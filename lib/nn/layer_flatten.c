/* Flatten: every axis from start_axis on merged into one, as PyTorch's
 * nn.Flatten(start_dim) (a view where the input's strides allow). */
#include <stdlib.h>

#include "module.h"

typedef struct flatten {
    int start_axis;
} flatten;

static ndm_array flatten_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    const flatten *f = m->data;
    int64_t small[16];
    int nd;
    int64_t *in = ndm__nn_shape(x, small, &nd, api, site);
    if (!in)
        return NDM_NULL_ARRAY;
    int ax = f->start_axis < 0 ? f->start_axis + nd : f->start_axis;
    ndm_array y = NDM_NULL_ARRAY;
    if (ax < 0 || ax >= nd) {
        ndm__fail(NDM_E_AXIS, api, site, "axis %d is out of range for rank %d", f->start_axis,
                  nd);
    } else {
        /* the kept sizes and -1, in place of the input's shape */
        in[ax] = -1;
        y = ndm_reshape_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, x, ax + 1, in);
    }
    if (in != small)
        free(in);
    return y;
}

static size_t flatten_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const flatten *f = m->data;
    return ndm__module_put(buf, n, len, "Flatten(%d)", f->start_axis);
}

static const ndm__module_type flatten_type = {
    .name = "Flatten",
    .size = sizeof(flatten),
    .forward = flatten_forward,
    .describe = flatten_describe,
};

NDM_API ndm_module ndm_flatten_module_at(NDM_SITE_PARAMS, ndm_manager model, int start_axis)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_flatten_module";
    ndm__module *m = ndm__module_new(&flatten_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    ((flatten *)m->data)->start_axis = start_axis;
    return ndm__module_finish(m, model, api, site);
}
