/* Sequential: children run in order, their names "0", "1", ... as in
 * PyTorch's nn.Sequential; a child with a fused ReLU form followed by a ReLU
 * runs both in one pass. */
#include <stdio.h>

#include "module.h"
#include "nn.h"

static ndm_array seq_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    if (!m->nchildren)
        return ndm_alias_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, x);
    ndm_array y = x;
    for (int i = 0; i < m->nchildren && y.id; i++) {
        ndm__module *c = ndm__module_of(m->children[i], api, site);
        if (!c)
            return NDM_NULL_ARRAY;
        ndm__module *next = c->type->forward_relu && i + 1 < m->nchildren
                                ? ndm__module_of(m->children[i + 1], api, site)
                                : NULL;
        if (next && next->type == &ndm__module_relu) {
            y = ndm__module_forward_relu(c, y, api, site);
            i++;
            continue;
        }
        y = ndm__module_forward(c, y, api, site);
    }
    return y;
}

static size_t seq_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    len = ndm__module_put(buf, n, len, "Sequential(");
    for (int i = 0; i < m->nchildren; i++) {
        const ndm__module *c = ndm__module_of(m->children[i], "ndm_module_describe", NDM__NO_SITE);
        if (i)
            len = ndm__module_put(buf, n, len, ", ");
        if (c)
            len = ndm__module_describe_into(c, buf, n, len);
    }
    return ndm__module_put(buf, n, len, ")");
}

static const ndm__module_type sequential_type = {
    .name = "Sequential",
    .forward = seq_forward,
    .describe = seq_describe,
};

NDM_API ndm_module ndm_sequential_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                     const ndm_module *modules)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_sequential";
    if (!ndm__nn_model_ok(model, api, site))
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
    ndm__module *m = ndm__module_new(&sequential_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (!ndm__module_attach_child(m, name, modules[i], api, site))
            return ndm__module_abandon(m, api, site);
    }
    return ndm__module_finish(m, model, api, site);
}
