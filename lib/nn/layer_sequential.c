/* Sequential: children run in order, their names "0", "1", ... as in
 * PyTorch's nn.Sequential; a child with a fused ReLU form followed by a ReLU
 * runs both in one pass. */
#include "../ops/autograd.h"
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
            ndm_array prev = y;
            y = ndm__module_forward_relu(c, y, api, site);
            if (NDM__UNLIKELY(ndm__ag_tls.budget) && prev.id != x.id && y.id)
                (void)!ndm_array_release(prev);
            i++;
            continue;
        }
        ndm_array prev = y;
        y = ndm__module_forward(c, y, api, site);
        /* under a byte budget a layer's input goes once the next layer has
         * it, so that the graph alone holds it and may drop it */
        if (NDM__UNLIKELY(ndm__ag_tls.budget) && prev.id != x.id && y.id)
            (void)!ndm_array_release(prev);
    }
    return y;
}

static const ndm__module_type sequential_type = {
    .name = "Sequential",
    .forward = seq_forward,
    .describe = ndm__module_describe_children,
};

NDM_API ndm_module ndm_sequential_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                     const ndm_module *modules)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    return ndm__module_numbered(&sequential_type, model, n, modules, "ndm_sequential", site);
}
