/* ModuleList: children "0", "1", ... as in PyTorch's nn.ModuleList, with no
 * forward pass of its own: the user module that holds it runs them (with
 * the inputs it chooses, a mask for instance). */
#include <stdio.h>

#include "module.h"
#include "nn.h"

static ndm_array list_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)x;
    ndm__fail(NDM_E_INVALID, api, site,
              "a ModuleList has no forward pass: run its modules (ndm_module_get_child(list, "
              "\"0\"), ...) from the module that holds it (it has %d)",
              m->nchildren);
    return NDM_NULL_ARRAY;
}

static size_t list_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    len = ndm__module_put(buf, n, len, "ModuleList(");
    for (int i = 0; i < m->nchildren; i++) {
        const ndm__module *c = ndm__module_of(m->children[i], "ndm_module_describe", NDM__NO_SITE);
        if (i)
            len = ndm__module_put(buf, n, len, ", ");
        if (c)
            len = ndm__module_describe_into(c, buf, n, len);
    }
    return ndm__module_put(buf, n, len, ")");
}

static const ndm__module_type list_type = {
    .name = "ModuleList",
    .forward = list_forward,
    .describe = list_describe,
};

NDM_API ndm_module ndm_module_list_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                      const ndm_module *modules)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_list";
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
    ndm__module *m = ndm__module_new(&list_type, model, api, site);
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
