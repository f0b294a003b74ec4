/* ModuleList: children "0", "1", ... as in PyTorch's nn.ModuleList, with no
 * forward pass of its own: the user module that holds it runs them (with
 * the inputs it chooses, a mask for instance). */
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

static const ndm__module_type list_type = {
    .name = "ModuleList",
    .forward = list_forward,
    .describe = ndm__module_describe_children,
};

NDM_API ndm_module ndm_module_list_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                      const ndm_module *modules)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    return ndm__module_numbered(&list_type, model, n, modules, "ndm_module_list", site);
}
