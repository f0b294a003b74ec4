/* Scope endings that build on operations: ndm_scope_finish returns its
 * result through an alias when the result lives elsewhere, which is an op. */
#include "../manager/core.h"
#include "dispatch.h"

NDM_API ndm_array ndm_scope_finish_at(NDM_SITE_PARAMS, ndm_manager scope, ndm_array result)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__array_peek(result);
    ndm__manager *s = ndm__manager_peek(scope);
    /* Not a scope (system, a plain manager): refused before an alias is
     * made in it, where nothing would end it. */
    if (s && !(atomic_load_explicit(&s->state, memory_order_relaxed) & NDM__M_SCOPE)) {
        ndm__fail(NDM_E_INVALID, __func__, site,
                  "manager '%s' is not a scope (use ndm_manager_close)", s->name);
        return NDM_NULL_ARRAY;
    }
    /* A result owned elsewhere (the expression returned one of its inputs)
     * is returned as a fresh alias made in the scope and kept like any
     * result: every handle that comes out is the caller's to release, and
     * the input's own handle is left to its owner. */
    bool aliased = false;
    if (r && s && r->mgr != s->self) {
        result = ndm_alias_to_at(NDM__SITE_ARGS(site), scope, result);
        if (!result.id) {
            ndm_status es = ndm_scope_end_at(NDM__SITE_ARGS(site), scope, 0, NULL);
            (void)es; /* the alias's failure is the error to report */
            return NDM_NULL_ARRAY;
        }
        r = ndm__array_peek(result);
        aliased = true;
    }
    if (!r && result.id)
        ndm__array_lookup_failed(result, __func__, &site, true); /* a stale result */
    bool keep = r && s;
    ndm_status st = ndm_scope_end_at(NDM__SITE_ARGS(site), scope, keep ? 1 : 0, &result);
    if (st < 0) {
        if (aliased) {
            ndm_status rs = ndm_array_release_at(NDM__SITE_ARGS(site), result);
            (void)rs; /* the end's failure is the error to report */
        }
        return NDM_NULL_ARRAY;
    }
    if (st == NDM_ALREADY) {
        /* ended before: nothing to keep, and a null result needs its why */
        ndm__fail(NDM_E_CLOSED, __func__, site, "the scope was already ended");
        return NDM_NULL_ARRAY;
    }
    return keep ? result : NDM_NULL_ARRAY;
}

NDM_API ndm_array ndm_scoped_at(NDM_SITE_PARAMS, ndm_manager parent, ndm_scoped_fn fn, void *ud)
{
    ndm__site site = NDM__SITE;
    if (!fn) {
        ndm__fail(NDM_E_INVALID, __func__, site, "fn is NULL");
        return NDM_NULL_ARRAY;
    }
    ndm_manager s = ndm_scope_begin_at(ndm_file_, ndm_line_, ndm_func_, parent, "scoped");
    if (!s.id)
        return NDM_NULL_ARRAY;
    ndm_array result = fn(ud);
    return ndm_scope_finish_at(ndm_file_, ndm_line_, ndm_func_, s, result);
}
