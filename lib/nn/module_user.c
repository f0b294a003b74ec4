/* User-defined modules: an ndm_module_type the user fills (a forward
 * callback over the inputs, describe and destroy) behind the internal
 * module table, and the registration of their parameters, buffers and
 * children by name. What every module shares stays in module.c. */
#include <stdio.h>
#include <string.h>

#include "../manager/object.h"
#include "../ops/inner.h"
#include "module.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

typedef struct user_module {
    ndm_module_type t; /* the user's, copied; t.name points at name */
    char name[64];
    void *ud;
} user_module;

/* Did the callback hand back one of its inputs or one of the module's
 * arrays? Those are not the pass's to move: the caller gets an alias. */
static bool borrowed(const ndm__module *m, ndm_array y, int n, const ndm_array *x)
{
    for (int i = 0; i < n; i++)
        if (x[i].id == y.id)
            return true;
    for (int i = 0; i < m->state.n; i++)
        if (m->state.a[i].id == y.id)
            return true;
    return false;
}

static ndm_array user_forward_n(ndm__module *m, int n, const ndm_array *x, const char *api,
                                ndm__site site)
{
    user_module *u = m->data;
    uint64_t fails = ndm__fail_count();
    ndm_array y = u->t.forward(m->self, n, x, u->ud);
    if (!y.id) {
        /* The callback's own failure (an operation at its line) stays as
         * it is; a bare null says nothing, so say which module. */
        if (ndm__fail_count() == fails)
            ndm__fail(NDM_E_INVALID, api, site,
                      "the forward callback of %s%s%s%s returned the null array without an "
                      "error",
                      u->name, m->qname[0] ? " '" : "", m->qname, m->qname[0] ? "'" : "");
        return NDM_NULL_ARRAY;
    }
    if (borrowed(m, y, n, x))
        y = ndm_alias_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, y);
    return y;
}

static ndm_array user_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    return user_forward_n(m, 1, &x, api, site);
}

/* The user's describe, or "Name(child=..., ...)". */
static size_t user_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const user_module *u = m->data;
    if (u->t.describe) {
        char none[1];
        int k = u->t.describe(m->self, len < n ? buf + len : none, len < n ? n - len : 0, u->ud);
        if (len >= n && n)
            buf[n - 1] = '\0';
        return len + (k > 0 ? (size_t)k : 0);
    }
    len = ndm__module_put(buf, n, len, "%s", u->name);
    for (int i = 0; i < m->nchildren; i++) {
        const ndm__module *c = ndm__module_of(m->children[i], "ndm_module_describe", NDM__NO_SITE);
        len = ndm__module_put(buf, n, len, "%s%s=", i ? ", " : "(", m->child_names[i]);
        if (c)
            len = ndm__module_describe_into(c, buf, n, len);
    }
    return m->nchildren ? ndm__module_put(buf, n, len, ")") : len;
}

static void user_destroy(ndm__module *m)
{
    user_module *u = m->data;
    if (u->t.destroy)
        u->t.destroy(u->ud);
}

static const ndm__module_type user_type = {
    .name = "Module",
    .size = sizeof(user_module),
    .forward = user_forward,
    .forward_n = user_forward_n,
    .describe = user_describe,
    .destroy = user_destroy,
};

NDM_API ndm_module ndm_module_new_at(NDM_SITE_PARAMS, ndm_manager model,
                                     const ndm_module_type *type, void *user_data)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_new";
    if (!type || !type->forward) {
        ndm__fail(NDM_E_INVALID, api, site, "%s", type ? "the module type has no forward callback"
                                                       : "the module type is NULL");
        if (type && type->destroy)
            type->destroy(user_data);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&user_type, model, api, site);
    if (!m) {
        if (type->destroy)
            type->destroy(user_data);
        return (ndm_module){0};
    }
    user_module *u = m->data;
    u->t = *type;
    snprintf(u->name, sizeof u->name, "%s", type->name && *type->name ? type->name : "Module");
    u->t.name = u->name;
    u->ud = user_data;
    m->class_name = u->name;
    /* (on failure the record's destroy gives user_data to type->destroy) */
    return ndm__module_finish(m, model, api, site);
}

/* The user module behind h for a registration: live, made by
 * ndm_module_new, and not yet a child of another. */
static ndm__module *user_of(ndm_module h, const char *api, ndm__site site)
{
    ndm__module *m = ndm__module_of(h, api, site);
    if (!m)
        return NULL;
    if (m->type != &user_type) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "a %s holds what its constructor made: register into a module of "
                  "ndm_module_new",
                  m->class_name);
        return NULL;
    }
    if (m->in_parent) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "the module is registered in another already (as '%s'): register its "
                  "parameters, buffers and children before registering it",
                  m->qname);
        return NULL;
    }
    return m;
}

/* m may take `name` for one more entry. */
static bool name_free(const ndm__module *m, const char *name, const char *what, const char *api,
                      ndm__site site)
{
    if (!ndm__module_name_ok(name, what, api, site))
        return false;
    if (ndm__module_has_name(m, name)) {
        ndm__fail(NDM_E_INVALID, api, site, "the module holds '%s' already (a parameter, buffer "
                                            "or child of that name)",
                  name);
        return false;
    }
    return true;
}

/* a is a live array of m's model that m's tree does not hold yet. */
static bool array_ok(ndm_module h, const ndm__module *m, const char *name, ndm_array a,
                     const char *api, ndm__site site)
{
    ndm__view v;
    if (!ndm__view_input(a, &v, api, site))
        return false;
    ndm_manager owner = ndm__object_owner(h.id), am = ndm_array_manager(a);
    if (am.id != owner.id) {
        char want[512], got[512];
        ndm_manager_path(owner, want, sizeof want);
        ndm_manager_path(am, got, sizeof got);
        ndm__fail(NDM_E_NOT_OWNER, api, site,
                  "'%s' lives in '%s', not in the module's model '%s' (make it there, or move it "
                  "with ndm_attach)",
                  name, got, want);
        return false;
    }
    for (int i = 0; i < m->state.n; i++)
        if (m->state.a[i].id == a.id) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "the array given as '%s' is registered already as '%s': an array has one "
                      "name in a tree (to share a weight, register its own and tie them: "
                      "ndm_module_tie)",
                      name, m->state.names[i]);
            return false;
        }
    return true;
}

NDM_API ndm_status ndm_module_register_parameter_at(NDM_SITE_PARAMS, ndm_module h,
                                                    const char *name, ndm_array a)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_register_parameter";
    ndm__module *m = user_of(h, api, site);
    if (!m || !name_free(m, name, "parameter", api, site) || !array_ok(h, m, name, a, api, site))
        return ndm_last_status();
    if (!ndm_dtype_is_float(ndm_array_dtype(a)))
        return ndm__fail(NDM_E_DTYPE, api, site,
                         "the parameter '%s' is %s: parameters are float (register it as a "
                         "buffer)",
                         name, ndm_dtype_short(ndm_array_dtype(a)));
    if (!ndm__module_add_param(m, name, a))
        return ndm__fail(NDM_E_OOM, api, site, "no memory to register '%s'", name);
    /* Built with gradients (as the built-in layers are, unless paused). */
    if (ndm__nn_grads_wanted() && !ndm_array_requires_grad(a)) {
        ndm_status st = ndm_requires_grad_at(NDM__SITE_ARGS(site), a);
        if (st < 0) {
            ndm__module_drop_param(m);
            return st;
        }
    }
    return NDM_OK;
}

NDM_API ndm_status ndm_module_register_buffer_at(NDM_SITE_PARAMS, ndm_module h, const char *name,
                                                 ndm_array a)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_register_buffer";
    ndm__module *m = user_of(h, api, site);
    if (!m || !name_free(m, name, "buffer", api, site) || !array_ok(h, m, name, a, api, site))
        return ndm_last_status();
    if (!ndm__module_add_buffer(m, name, a))
        return ndm__fail(NDM_E_OOM, api, site, "no memory to register '%s'", name);
    return NDM_OK;
}

NDM_API ndm_status ndm_module_register_child_at(NDM_SITE_PARAMS, ndm_module h, const char *name,
                                                ndm_module child)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_register_child";
    ndm__module *m = user_of(h, api, site);
    if (!m || !name_free(m, name, "child", api, site))
        return ndm_last_status();
    /* (a module under itself is refused by the attach; a null child from a constructor that failed keeps its error) */
    if (ndm__module_check_owner(child, ndm__object_owner(h.id), api, site) < 0)
        return ndm_last_status();
    if (!ndm__module_attach_child(m, name, child, api, site))
        return ndm_last_status();
    return NDM_OK;
}

NDM_API void *ndm_module_user_data(ndm_module h)
{
    ndm__module *m = ndm__module_of(h, "ndm_module_user_data", NDM__NO_SITE);
    if (!m)
        return NULL;
    if (m->type != &user_type) {
        ndm__fail(NDM_E_INVALID, "ndm_module_user_data", NDM__NO_SITE,
                  "a %s has no user data (only modules of ndm_module_new do)", m->class_name);
        return NULL;
    }
    return ((user_module *)m->data)->ud;
}
