/* Scopes: a per-thread stack of scope managers that catches temporaries,
 * moving kept results out when a scope ends. Dead entries (a scope closed by
 * any other path) are skipped and pruned, so out-of-order ends stay safe. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "reclaim.h"
#include "thread.h"

/* The stack lives in the thread's state (thread.h): scope_inline until it
 * outgrows it, then on the heap. */
static bool push(ndm_manager m)
{
    ndm__thread *t = ndm__thread_get();
    if (!t)
        return false;
    if (t->scope_depth == t->scope_cap) {
        int cap = t->scope_cap * 2;
        ndm_manager *p = ndm__malloc((size_t)cap * sizeof *p, NDM__INJ_LIST);
        if (!p)
            return false;
        memcpy(p, t->scopes, (size_t)t->scope_depth * sizeof *p);
        if (t->scopes != t->scope_inline)
            free(t->scopes);
        t->scopes = p;
        t->scope_cap = cap;
    }
    t->scopes[t->scope_depth++] = m;
    return true;
}

static void shrink_if_empty(ndm__thread *t)
{
    if (t->scope_depth == 0 && t->scopes != t->scope_inline) {
        free(t->scopes);
        t->scopes = t->scope_inline;
        t->scope_cap = NDM__SCOPES_INLINE;
    }
}

/* Remove entry i, keeping the order of the rest. */
static void remove_at(ndm__thread *t, int i)
{
    memmove(&t->scopes[i], &t->scopes[i + 1], (size_t)(t->scope_depth - i - 1) * sizeof *t->scopes);
    t->scope_depth--;
    shrink_if_empty(t);
}

ndm_manager ndm__scope_innermost(void)
{
    ndm__thread *t = ndm__tls;
    if (!t)
        return NDM_NULL_MANAGER;
    while (t->scope_depth > 0) {
        ndm_manager top = t->scopes[t->scope_depth - 1];
        ndm__manager *m = ndm__manager_peek(top);
        if (NDM__LIKELY(m && !(atomic_load_explicit(&m->state, memory_order_relaxed) &
                               NDM__M_CLOSING)))
            return top;
        t->scope_depth--; /* closed behind our back: prune */
        shrink_if_empty(t);
    }
    return NDM_NULL_MANAGER;
}

ndm_manager ndm__current_scope(const char *api, ndm__site where)
{
    /* The scope stack's own handle, not one made from the record: a scope
     * that closes meanwhile (its parent's close on another thread) then
     * reads as closed, where a handle made from its record after the close
     * would carry the next generation and read as never issued. */
    ndm_manager s = ndm__scope_innermost();
    if (!s.id)
        ndm__fail(NDM_E_NULL, api, where, "NDM_CURRENT_SCOPE: no scope is active on this thread");
    return s;
}

NDM_API ndm_manager ndm_scope_current(void) { return ndm__scope_innermost(); }

NDM_API bool ndm_manager_is_scope(ndm_manager h)
{
    ndm__manager *m = ndm__manager_peek(h);
    return m && (atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_SCOPE);
}

NDM_API ndm_manager ndm_scope_begin_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name)
{
    ndm__site site = NDM__SITE;
    ndm__manager *p = ndm__manager_get(parent, __func__, site);
    if (!p)
        return NDM_NULL_MANAGER;
    parent = ndm__manager_resolved(parent, __func__, site);
    ndm_manager s = ndm__manager_new_ex(site, __func__, parent, name ? name : "scope",
                                        ndm__manager_device_of(p),
                                        NDM__M_SCOPE);
    if (!s.id)
        return s;
    if (!push(s)) {
        ndm_status cs = ndm_manager_close_at(ndm_file_, ndm_line_, ndm_func_, s);
        (void)cs;
        ndm__fail(NDM_E_OOM, __func__, site, "no memory to push the scope");
        return NDM_NULL_MANAGER;
    }
    return s;
}

/* Where arrays kept by scope `s` go: the next live scope below it on this
 * thread's stack, or its parent when it has none (or is not on this stack). */
static ndm_manager keep_target(ndm__manager *s, ndm_manager sh)
{
    ndm__thread *t = ndm__tls;
    int i = t ? t->scope_depth - 1 : -1;
    while (i >= 0 && t->scopes[i].id != sh.id)
        i--;
    for (int j = i - 1; i >= 0 && j >= 0; j--) {
        ndm__manager *e = ndm__manager_peek(t->scopes[j]);
        if (e && !(atomic_load_explicit(&e->state, memory_order_relaxed) & NDM__M_CLOSING))
            return t->scopes[j];
    }
    return ndm__manager_handle(s->parent, s->parent_gen);
}

/* Validate `keep` for manager m: live arrays owned by m. */
static ndm_status check_keep(ndm__manager *m, size_t n, const ndm_array *keep, uint32_t *slots,
                             const char *api, ndm__site site)
{
    if (n && !keep)
        return ndm__fail(NDM_E_INVALID, api, site, "keep is NULL with n = %zu", n);
    for (size_t i = 0; i < n; i++) {
        ndm__array *r = ndm__array_get(keep[i], api, site);
        if (!r)
            return ndm_last_status();
        if (r->mgr != m->self) {
            char desc[160], made[256], owner[512], path[512];
            ndm__manager_path(r->mgr, owner, sizeof owner);
            ndm__manager_path(m->self, path, sizeof path);
            return ndm__fail(NDM_E_NOT_OWNER, api, site,
                             "keep[%zu] (array %s created at %s) is owned by '%s', not by '%s'", i,
                             ndm__array_desc(r, desc, sizeof desc),
                             ndm__site_str(ndm__array_site(r), made, sizeof made), owner, path);
        }
        slots[i] = r->self;
    }
    return NDM_OK;
}

/* Check that the target accepts the keeps before anything moves: it is open,
 * uncapped, and its limits have room for the storages whose charge would
 * follow (those whose every view in the scope is kept). */
static ndm_status check_target(ndm__manager *s, ndm_manager target, size_t n,
                               const uint32_t *slots, const char *api, ndm__site site)
{
    ndm__manager *t = ndm__manager_get(target, api, site);
    if (!t)
        return ndm_last_status();
    unsigned ts = atomic_load_explicit(&t->state, memory_order_acquire);
    char path[512];
    if (ts & NDM__M_CLOSING) {
        ndm__manager_path(t->self, path, sizeof path);
        return ndm__fail(NDM_E_CLOSED, api, site, "target manager '%s' is closing", path);
    }
    if (ts & NDM__M_CAP_ARRAYS) {
        ndm__manager_path(t->self, path, sizeof path);
        return ndm__fail(NDM_E_CAPPED, api, site, "target manager '%s' is capped", path);
    }
    int64_t need[NDM__MAX_DEVICES] = {0};
    for (size_t i = 0; i < n; i++) {
        ndm__storage *st = ndm__array_slot(slots[i])->storage;
        bool seen = false;
        uint32_t kept_views = 0;
        for (size_t j = 0; j < n; j++) {
            if (ndm__array_slot(slots[j])->storage != st)
                continue;
            if (j < i)
                seen = true;
            kept_views++;
        }
        if (!seen && st->charged == s->self && ndm__storage_charged_views(st) == kept_views)
            need[ndm__device_slot(st->device)] += (int64_t)st->nbytes;
    }
    for (int d = 0; d < NDM__MAX_DEVICES; d++)
        if (need[d] && ndm__charge_check(s, t, d, need[d], api, site) < 0)
            return ndm_last_status();
    return NDM_OK;
}

/* Move the kept arrays out. The target was checked first; if another thread
 * changes it meanwhile and a move fails, move back the ones already moved and
 * take back the counts, so that nothing has changed. */
static ndm_status move_keeps(ndm__manager *s, ndm_manager target, size_t n, const uint32_t *slots,
                             const char *api, ndm__site site)
{
    ndm_status chk = check_target(s, target, n, slots, api, site);
    if (chk < 0)
        return chk;
    for (size_t i = 0; i < n; i++) {
        ndm__array *r = ndm__array_slot(slots[i]);
        ndm_status st = ndm__array_attach(r, target, api, site);
        if (st == NDM_OK)
            continue;
        char why[768];
        snprintf(why, sizeof why, "%s", ndm_last_error()); /* the rollback may fail too */
        ndm__manager *t = ndm__manager_peek(target);
        for (size_t j = 0; j < i; j++) {
            ndm_status back = ndm__array_attach(ndm__array_slot(slots[j]),
                                                ndm__manager_handle_of(s), api, site);
            (void)back; /* s is open and uncapped for its own arrays: cannot fail */
        }
        if (t && i) {
            ndm__mlock_take(s);
            s->moved_in -= i;
            s->moved_out -= i;
            ndm__mlock_drop(s);
            ndm__mlock_take(t);
            t->moved_in -= i;
            t->moved_out -= i;
            ndm__mlock_drop(t);
        }
        ndm_clear_error();
        return ndm__fail(st, NULL, NDM__NO_SITE, "%s", why);
    }
    return NDM_OK;
}

static void pop_entry(ndm_manager sh)
{
    ndm__thread *t = ndm__tls;
    for (int i = t ? t->scope_depth - 1 : -1; i >= 0; i--)
        if (t->scopes[i].id == sh.id) {
            remove_at(t, i);
            return;
        }
}

NDM_API ndm_status ndm_scope_end_at(NDM_SITE_PARAMS, ndm_manager sh, size_t n,
                                    const ndm_array *keep)
{
    ndm__site site = NDM__SITE;
    ndm__manager *s = ndm__manager_peek(sh);
    if (!s) {
        /* Only a manager handle that was issued is an ended scope; anything
         * else (an array handle, a forged one) is refused, so that NDM_SCOPED
         * and its callers never take a bad handle for an ended scope. */
        if (sh.id == 0 || sh.id == NDM__CURRENT_SCOPE_ID || sh.id == NDM__OUTPUT_RULE_ID) {
            if (!(s = ndm__manager_lookup_failed(sh, __func__, &site)))
                return ndm_last_status();
            sh = ndm__manager_handle_of(s);
        } else if (!ndm__manager_issued(sh)) {
            return ndm__fail(NDM_E_INVALID, __func__, site,
                             "not a manager handle (id 0x%016" PRIx64 ")", sh.id);
        } else {
            pop_entry(sh);
            return NDM_ALREADY;
        }
    }
    unsigned st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (!(st & NDM__M_LIVE)) {
        /* closed since the lookup (its parent's close, on another thread) */
        pop_entry(sh);
        return NDM_ALREADY;
    }
    if (!(st & NDM__M_SCOPE))
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "manager '%s' is not a scope (use ndm_manager_close)", s->name);
    if (st & NDM__M_CLOSING)
        return NDM_ALREADY;
    uint32_t inline_slots[16];
    uint32_t *slots = n <= 16 ? inline_slots : ndm__malloc(n * sizeof *slots, NDM__INJ_SCRATCH);
    if (!slots)
        return ndm__fail(NDM_E_OOM, __func__, site, "no memory for %zu kept arrays", n);
    ndm_status rc = check_keep(s, n, keep, slots, __func__, site);
    if (rc == NDM_OK && n)
        rc = move_keeps(s, keep_target(s, sh), n, slots, __func__, site);
    if (slots != inline_slots)
        free(slots);
    if (rc < 0)
        return rc;
    pop_entry(sh);
    rc = ndm_manager_close_at(ndm_file_, ndm_line_, ndm_func_, sh);
    return rc == NDM_ALREADY ? NDM_OK : rc;
}

NDM_API ndm_status ndm_scope_release_all_but_at(NDM_SITE_PARAMS, ndm_manager sh, size_t n,
                                                const ndm_array *keep)
{
    ndm__site site = NDM__SITE;
    ndm__manager *s = ndm__manager_get(sh, __func__, site);
    if (!s)
        return ndm_last_status();
    uint32_t inline_slots[16];
    uint32_t *slots = n <= 16 ? inline_slots : ndm__malloc(n * sizeof *slots, NDM__INJ_SCRATCH);
    if (!slots)
        return ndm__fail(NDM_E_OOM, __func__, site, "no memory for %zu kept arrays", n);
    ndm_status rc = check_keep(s, n, keep, slots, __func__, site);
    ndm__thread_get(); /* (a thread that kills arrays counts: see ndm__multi) */
    if (rc == NDM_OK)
        ndm__manager_release_except(s, slots, n, site);
    if (slots != inline_slots)
        free(slots);
    ndm__reclaim_maybe();
    return rc;
}

NDM_API ndm_status ndm_scope_move_out_at(NDM_SITE_PARAMS, ndm_array a)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__array_get(a, __func__, site);
    if (!r)
        return ndm_last_status();
    ndm__manager *s = ndm__manager_slot(r->mgr);
    if (!(atomic_load_explicit(&s->state, memory_order_relaxed) & NDM__M_SCOPE)) {
        char path[512];
        ndm__manager_path(s->self, path, sizeof path);
        return ndm__fail(NDM_E_NOT_OWNER, __func__, site,
                         "the array is owned by '%s', which is not a scope", path);
    }
    ndm_manager sh = ndm__manager_handle_of(s);
    return ndm__array_attach(r, keep_target(s, sh), __func__, site);
}

NDM_API void ndm_auto_cleanup(void *p)
{
    uint64_t id;
    memcpy(&id, p, sizeof id);
    if (!id)
        return;
    ndm_status st;
    if (id & NDM__KIND_MANAGER) {
        ndm_manager m = {id};
        if (ndm_manager_is_scope(m))
            st = ndm_scope_end_at(__FILE__, __LINE__, "NDM_AUTO", m, 0, NULL);
        else
            st = ndm_manager_close_at(__FILE__, __LINE__, "NDM_AUTO", m);
    } else if (!ndm__array_issued((ndm_array){id})) {
        /* (GCC refuses these at compile time; Clang compiles them) */
        ndm__warn("NDM_AUTO: handle 0x%016" PRIx64 " is not a manager, scope or array (a "
                  "module, optimizer, loader or predictor?): those die with the manager that "
                  "owns them; remove NDM_AUTO from its declaration", id);
        return;
    } else {
        st = ndm_array_release_at(__FILE__, __LINE__, "NDM_AUTO", (ndm_array){id});
    }
    if (st < 0)
        ndm__warn("NDM_AUTO cleanup failed: %s", ndm_last_error());
}

/* ---- scopes kept between uses ----------------------------------------------------
 * A server's request runs in a scope under the predictor; making and closing
 * a manager per request takes the tree lock twice, which every serving thread
 * shares. A parked scope stays open on its thread between requests: the next
 * request under the same parent takes it back with no tree lock, and its
 * arrays are released with its own lock, which its creator (this thread)
 * takes on the fast path. */

/* Close entry i's scope and clear the entry. */
static void unpark(ndm__thread *t, int i, ndm__site site)
{
    ndm_manager s = t->parked[i].scope;
    t->parked[i] = (ndm__parked_scope){0};
    if (s.id) {
        ndm_status cs = ndm_manager_close_at(NDM__SITE_ARGS(site), s);
        (void)cs; /* NDM_ALREADY when its parent's close took it */
    }
}

ndm_manager ndm__scope_reuse(ndm__site site, ndm_manager parent, const char *name)
{
    ndm__thread *t = ndm__thread_get();
    for (int i = 0; t && i < NDM__PARKED_SCOPES; i++) {
        if (t->parked[i].parent != parent.id)
            continue;
        ndm_manager s = t->parked[i].scope;
        ndm__manager *m = ndm__manager_peek(s);
        unsigned st = m ? atomic_load_explicit(&m->state, memory_order_relaxed) : 0;
        if ((st & NDM__M_LIVE) && !(st & NDM__M_CLOSING) && push(s)) {
            /* in use now: a nested request under the same parent makes its own */
            t->parked[i] = (ndm__parked_scope){0};
            return s;
        }
        unpark(t, i, site);
        break;
    }
    return ndm_scope_begin_at(NDM__SITE_ARGS(site), parent, name);
}

ndm_status ndm__scope_park(ndm__site site, ndm_manager parent, ndm_manager sh)
{
    ndm__thread *t = ndm__tls;
    ndm__manager *s = ndm__manager_peek(sh);
    unsigned st = s ? atomic_load_explicit(&s->state, memory_order_relaxed) : 0;
    /* Only a plain live scope with nothing below it is kept (the caller
     * made it on this thread with ndm__scope_reuse): anything else ends as a
     * scope ends. */
    if (!t || !(st & NDM__M_LIVE) || (st & (NDM__M_CLOSING | NDM__M_CAP_ARRAYS)) ||
        !(st & NDM__M_SCOPE) || __atomic_load_n(&s->first_child, __ATOMIC_RELAXED) != 0)
        return ndm_scope_end_at(NDM__SITE_ARGS(site), sh, 0, NULL);
    pop_entry(sh);
    ndm__manager_release_except(s, NULL, 0, site);
    ndm__reclaim_maybe();
    /* newest first: the last entry's scope, if any, is closed */
    int last = NDM__PARKED_SCOPES - 1;
    if (t->parked[last].parent)
        unpark(t, last, site);
    memmove(&t->parked[1], &t->parked[0], (size_t)last * sizeof t->parked[0]);
    t->parked[0] = (ndm__parked_scope){parent.id, sh};
    return NDM_OK;
}

void ndm__scope_unpark_all(ndm__thread *t)
{
    for (int i = 0; i < NDM__PARKED_SCOPES; i++)
        if (t->parked[i].parent)
            unpark(t, i, NDM__NO_SITE);
}
