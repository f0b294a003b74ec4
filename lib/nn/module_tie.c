/* Tied parameters (PyTorch's `head.weight = tok_emb.weight`): one array
 * under two names of a module tree, replacing the array that was there in
 * every module from the one that holds the name up to the root. */
#include <stdio.h>
#include <string.h>

#include "../manager/object.h"
#include "../ops/autograd.h"
#include "../ops/inner.h"
#include "module.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

static int find(const ndm__named_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->names[i], name))
            return i;
    return -1;
}

/* `name` is one of m's parameters: its index in m->params, or -1 with
 * NDM_E_INVALID (a buffer, or no such name: the message lists the
 * parameters). */
static int param_index(const ndm__module *m, const char *name, const char *api, ndm__site site)
{
    if (!name) {
        ndm__fail(NDM_E_INVALID, api, site, "a parameter name is NULL");
        return -1;
    }
    int i = find(&m->params, name);
    if (i >= 0)
        return i;
    if (find(&m->state, name) >= 0) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "'%s' is a buffer, not a parameter: only parameters are tied", name);
        return -1;
    }
    char list[400] = "";
    size_t len = 0;
    for (int k = 0; k < m->params.n && len < sizeof list; k++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", k ? ", " : "",
                                m->params.names[k]);
    ndm__fail(NDM_E_INVALID, api, site, "the %s%s%s%s holds no parameter named '%s' (it holds %s)",
              m->class_name, m->qname[0] ? " '" : "", m->qname, m->qname[0] ? "'" : "", name,
              m->params.n ? list : "none");
    return -1;
}

/* The module of m's tree that holds `name` ("head.weight": m's child head)
 * and the name's last part there ("weight"), or NULL. */
static ndm__module *holder(ndm__module *m, const char *name, const char **local,
                           const char *api, ndm__site site)
{
    const char *at = name;
    for (const char *dot; m && (dot = strchr(at, '.'));) {
        size_t k = (size_t)(dot - at);
        ndm__module *next = NULL;
        for (int i = 0; i < m->nchildren && !next; i++)
            if (strlen(m->child_names[i]) == k && !strncmp(m->child_names[i], at, k))
                next = ndm__module_of(m->children[i], api, site);
        m = next;
        at = dot + 1;
    }
    *local = at;
    return m;
}

/* a is live, in the model `owner` (a parameter moved out with ndm_attach
 * is not the module's to share). */
static bool in_model(ndm_array a, const char *name, ndm_manager owner, const char *api,
                     ndm__site site)
{
    ndm__view v;
    if (!ndm__view_input(a, &v, api, site))
        return false;
    ndm_manager am = ndm_array_manager(a);
    if (am.id == owner.id)
        return true;
    char want[512], got[512];
    ndm_manager_path(owner, want, sizeof want);
    ndm_manager_path(am, got, sizeof got);
    ndm__fail(NDM_E_NOT_OWNER, api, site,
              "the parameter '%s' lives in '%s', not in the module's model '%s': parameters of "
              "different models cannot be tied",
              name, got, want);
    return false;
}

/* a and b have one dtype, device and shape. */
static bool alike(ndm_array a, const char *an, ndm_array b, const char *bn, const char *api,
                  ndm__site site)
{
    ndm__view va, vb;
    if (!ndm__view_input(a, &va, api, site) || !ndm__view_input(b, &vb, api, site))
        return false;
    char da[160], db[160];
    ndm_status st = NDM_OK;
    if (va.t.dtype != vb.t.dtype)
        st = NDM_E_DTYPE;
    else if (!ndm_device_eq(va.device, vb.device))
        st = NDM_E_DEVICE;
    else if (va.t.ndim != vb.t.ndim ||
             memcmp(va.t.shape, vb.t.shape, (size_t)va.t.ndim * sizeof *va.t.shape))
        st = NDM_E_SHAPE;
    if (st == NDM_OK)
        return true;
    ndm__fail(st, api, site, "'%s' is %s and '%s' is %s: tied parameters have one dtype, device "
                             "and shape",
              an, ndm__view_desc(&va, da, sizeof da), bn, ndm__view_desc(&vb, db, sizeof db));
    return false;
}

NDM_API ndm_status ndm_module_tie_at(NDM_SITE_PARAMS, ndm_module h, const char *name,
                                     const char *to)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_tie";
    ndm__module *m = ndm__module_of(h, api, site);
    if (!m)
        return ndm_last_status();
    int ni = param_index(m, name, api, site);
    int ti = ni >= 0 ? param_index(m, to, api, site) : -1;
    if (ti < 0)
        return ndm_last_status();
    if (ni == ti)
        return ndm__fail(NDM_E_INVALID, api, site, "'%s' cannot be tied to itself", name);
    ndm_array old = m->params.a[ni], now = m->params.a[ti];
    if (old.id == now.id)
        return NDM_OK; /* tied already */
    ndm_manager owner = ndm__object_owner(h.id);
    if (!in_model(old, name, owner, api, site) || !in_model(now, to, owner, api, site) ||
        !alike(old, name, now, to, api, site))
        return ndm_last_status();
    const char *local;
    ndm__module *at = holder(m, name, &local, api, site);
    if (!at || find(&at->params, local) < 0)
        return ndm__fail(NDM_E_INVALID, api, site, "the module that holds '%s' is not found",
                         name);
    /* Nothing fails past here. The holder and every module above it list
     * the parameter under its name from there: its qualified name less
     * theirs ("blocks.3.attn" holds "blocks.3.attn.out.weight" as
     * "out.weight"). */
    if (at->type->rebind)
        at->type->rebind(at, old, now);
    char full[2 * NDM__MODULE_NAME_MAX];
    snprintf(full, sizeof full, "%s%s%s", at->qname, at->qname[0] ? "." : "", local);
    ndm__module *top = at;
    for (ndm__module *x = at; x;) {
        size_t q = strlen(x->qname);
        const char *rel = q ? full + q + 1 : full;
        for (int pass = 0; pass < 2; pass++) {
            ndm__named_list *l = pass ? &x->state : &x->params;
            int k = find(l, rel);
            if (k >= 0 && l->a[k].id == old.id)
                l->a[k] = now;
        }
        top = x;
        x = x->parent.id ? ndm__module_of(x->parent, api, site) : NULL;
    }
    /* recount: the holder's own tree may not hold `now` under another name */
    for (ndm__module *x = at; x; x = x->parent.id ? ndm__module_of(x->parent, api, site) : NULL) {
        bool twice = false;
        for (int i = 0; i < x->params.n && !twice; i++)
            twice = ndm__module_tied_to(&x->params, i) >= 0;
        x->tied = twice;
    }
    /* The array replaced goes with its gradient, unless the tree still
     * holds it under another name (it was tied itself). */
    for (int i = 0; i < top->state.n; i++)
        if (top->state.a[i].id == old.id)
            return NDM_OK;
    ndm_array grad = ndm__ag_grad_of(old);
    ndm_status st = ndm_array_release(old);
    ndm_status gs = grad.id ? ndm_array_release(grad) : NDM_OK;
    return st < 0 ? st : gs < 0 ? gs : NDM_OK;
}
