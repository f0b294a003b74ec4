/* Training within a byte budget: the units of recomputation a budgeted
 * graph records (module calls), which of their arrays it drops when the
 * budget's limit refuses an allocation, and their recomputation for backward.
 *
 * A unit is one module call at the first level below the module the user
 * called (a block of a transformer, a layer of a Sequential), or a call of
 * a module marked NDM_RECOMPUTE_ALWAYS. Its nodes are consecutive in the
 * recording order. Dropping a unit releases the graph's views of every
 * storage that only the graph's views of the unit (and of the nodes that
 * read its results) hold: nothing a caller still holds is ever dropped.
 * Recomputing it runs the module's forward pass again on the same inputs
 * with the same random states, recording in a mode that matches each
 * recorded operation with the node it made the first time and gives the
 * node's dropped views the new arrays: the kernels, their inputs and so
 * their results are the same, so backward reads the same bits.
 *
 * Which unit goes first follows DTR (Kirisame et al.): the smallest
 * cost / (bytes × staleness), with cost the unit's measured forward time,
 * bytes what it made, staleness the logical time since it was last used. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd.h"
#include "dispatch.h"
#include "inner.h"
#include "ndm/autograd.h"
#include "ndm/scope.h"

#define UNIT_INPUTS 4

typedef struct unit {
    uint64_t first, last;        /* node orders, inclusive (last 0 while open) */
    ndm__ag_replay_fn fn;
    uint64_t module;
    int kind, n;
    ndm__ag_node *src[UNIT_INPUTS]; /* input i was made by this node, or */
    ndm_array kept[UNIT_INPUTS];    /* a view of it the graph keeps (or null) */
    ndm_rng *rngs;               /* the state of each random draw, in order */
    size_t nrng, caprng;
    uint64_t cost_ns, bytes, last_use;
    int busy;                    /* held by a rule or a recomputation running */
    bool always, dropped, broken; /* broken: it cannot be recomputed */
} unit;

typedef struct replay {
    unit *u;
    uint64_t cursor;             /* the order of the node expected next */
    size_t rng_k;
    bool diverged;
    ndm__storage **made;         /* storages given to dropped views */
    size_t nmade, capmade;
} replay;

struct ndm__ag_budget {
    ndm_manager owner;
    uint32_t owner_slot;
    uint64_t bytes;
    unit *units;
    size_t nunits, capunits;
    uint64_t clock;
    bool evicting;
    ndm_grad_budget_stats stats;
    uint32_t held[2 * 64 + 2];   /* units held by the running rule */
    int nheld;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void ndm__ag_budget_free(ndm__ag_budget *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nunits; i++)
        free(b->units[i].rngs);
    free(b->units);
    free(b);
}

/* The budgeted graph this thread records into or recomputes for. */
static ndm__ag_graph *budget_graph(void)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    if (!t->ctx || !ndm_manager_valid(t->ctx_mgr))
        return NULL;
    ndm__ag_graph *g = t->ctx;
    return g->budget ? g : NULL;
}

static unit *unit_of(ndm__ag_graph *g, uint32_t u)
{
    return u ? &g->budget->units[u - 1] : NULL;
}

/* ---- recording the units --------------------------------------------------- */

int ndm__ag_unit_begin(ndm__ag_replay_fn fn, uint64_t module, int kind, int mode, int n,
                       const ndm_array *in)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    int depth = t->depth++;
    if (mode == NDM_RECOMPUTE_KEEP)
        t->keep++;
    int token = mode == NDM_RECOMPUTE_KEEP ? -1 : 0;
    if (t->replay) /* the nodes exist: nothing to record */
        return token;
    ndm__ag_graph *g = budget_graph();
    if (!g || !ndm__ag_on())
        return token;
    ndm__ag_budget *b = g->budget;
    unit *open = t->unit;
    if (open) {
        /* inside a unit already: an ALWAYS module makes it one to drop */
        if (mode == NDM_RECOMPUTE_ALWAYS)
            open->always = true;
        return token;
    }
    if (mode == NDM_RECOMPUTE_KEEP || t->keep || (depth != 1 && mode != NDM_RECOMPUTE_ALWAYS) ||
        n > UNIT_INPUTS)
        return token;
    if (b->nunits == b->capunits) {
        size_t c = b->capunits ? 2 * b->capunits : 64;
        unit *u = ndm__realloc(b->units, c * sizeof *u, NDM__INJ_NODE);
        if (!u)
            return token;
        b->units = u;
        b->capunits = c;
    }
    unit *u = &b->units[b->nunits];
    memset(u, 0, sizeof *u);
    u->first = g->next_order + 1;
    u->fn = fn;
    u->module = module;
    u->kind = kind;
    u->n = n;
    u->always = mode == NDM_RECOMPUTE_ALWAYS;
    t->pause++;
    for (int i = 0; i < n; i++) {
        ndm__array *r = ndm__array_peek(in[i]);
        if (!r)
            continue;
        u->src[i] = ndm__ag_graph_find(g, in[i].id);
        if (!u->src[i]) {
            u->kept[i] = ndm__array_view(ndm__array_site(r), "autograd", g->mgr, r, r->dtype,
                                         r->ndim, r->shape, r->strides, r->offset, NULL);
            if (!u->kept[i].id)
                u->broken = true;
        }
    }
    t->pause--;
    b->nunits++;
    t->unit = u;
    u->cost_ns = now_ns();
    return (int)b->nunits;
}

void ndm__ag_unit_end(int token, ndm_array y)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    t->depth--;
    if (token < 0) {
        t->keep--;
        return;
    }
    if (token == 0)
        return;
    ndm__ag_graph *g = budget_graph();
    t->unit = NULL;
    if (!g || (size_t)token > g->budget->nunits)
        return;
    ndm__ag_budget *b = g->budget;
    unit *u = &b->units[token - 1];
    u->cost_ns = now_ns() - u->cost_ns + 1;
    u->last = g->next_order;
    u->last_use = ++b->clock;
    if (!y.id || u->last < u->first)
        u->broken = true; /* a failed call or no node: nothing to drop */
    b->stats.units++;
}

void ndm__ag_budget_node(ndm__ag_graph *g, ndm__ag_node *nd)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    unit *u = t->unit;
    nd->pinned = t->keep > 0;
    if (!u)
        return;
    nd->unit = (uint32_t)(u - g->budget->units) + 1;
    ndm__array *r = ndm__array_peek(nd->saved_out);
    if (r)
        u->bytes += r->storage->nbytes;
}

ndm_rng *ndm__ag_budget_rng(ndm_rng *rng, ndm_rng *local)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    replay *rp = t->replay;
    if (rp) {
        if (rp->rng_k >= rp->u->nrng) {
            rp->diverged = true;
            return rng;
        }
        *local = rp->u->rngs[rp->rng_k++];
        return local;
    }
    unit *u = t->unit;
    if (!u)
        return rng; /* (draws in no_grad regions of a unit too: its recomputation makes them) */
    if (u->nrng == u->caprng) {
        size_t c = u->caprng ? 2 * u->caprng : 4;
        ndm_rng *r = ndm__realloc(u->rngs, c * sizeof *r, NDM__INJ_NODE);
        if (!r) {
            u->broken = true;
            return rng;
        }
        u->rngs = r;
        u->caprng = c;
    }
    u->rngs[u->nrng++] = *rng;
    return rng;
}

/* ---- dropping ----------------------------------------------------------------- */

typedef struct slot_ref {
    ndm__storage *s;
    ndm_array *h;
} slot_ref;

static int by_storage(const void *a, const void *b)
{
    const slot_ref *x = a, *y = b;
    return x->s < y->s ? -1 : x->s > y->s;
}

static bool push_ref(slot_ref **v, size_t *n, size_t *cap, ndm_array *h)
{
    ndm__array *r = ndm__array_peek(*h);
    if (!r)
        return true;
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        slot_ref *p = ndm__realloc(*v, c * sizeof *p, NDM__INJ_SCRATCH);
        if (!p)
            return false;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = (slot_ref){r->storage, h};
    return true;
}

/* Drop what unit u alone holds; the bytes freed. */
static uint64_t drop_unit(ndm__ag_graph *g, unit *u)
{
    if (u->busy || u->broken || !u->last)
        return 0;
    slot_ref *v = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    for (uint64_t o = u->first; o <= u->last && ok; o++) {
        ndm__ag_node *nd = g->all[o - 1];
        ok = push_ref(&v, &n, &cap, &nd->saved_out);
        for (int i = 0; i < nd->n && ok; i++)
            ok = push_ref(&v, &n, &cap, &nd->in[i]);
    }
    /* the nodes after it that read its results */
    for (size_t k = u->last; k < g->nall && ok; k++) {
        ndm__ag_node *nd = g->all[k];
        for (int i = 0; i < nd->n && ok; i++)
            if (nd->prod[i] && nd->prod[i]->order >= u->first && nd->prod[i]->order <= u->last)
                ok = push_ref(&v, &n, &cap, &nd->in[i]);
    }
    uint64_t freed = 0;
    if (ok && n) {
        qsort(v, n, sizeof *v, by_storage);
        for (size_t i = 0, j; i < n; i = j) {
            for (j = i + 1; j < n && v[j].s == v[i].s; j++)
                ;
            ndm__storage *s = v[i].s;
            uint32_t refs = atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT;
            if (refs != j - i)
                continue; /* someone else holds a view: it stays */
            /* handles of pinned nodes count among the views, so a storage
             * one of them reads never gets here */
            uint64_t bytes = s->nbytes;
            for (size_t k = i; k < j; k++) {
                ndm__discard(*v[k].h);
                *v[k].h = NDM_NULL_ARRAY;
            }
            freed += bytes;
        }
    }
    free(v);
    if (freed) {
        u->dropped = true;
        g->budget->stats.dropped_bytes += freed;
        g->budget->stats.drops++;
    }
    return freed;
}

/* Drop units, the cheapest to lose first, until `need` bytes are free;
 * the bytes freed. */
static uint64_t drop_for(ndm__ag_graph *g, uint64_t need)
{
    ndm__ag_budget *b = g->budget;
    if (b->evicting)
        return 0;
    b->evicting = true;
    uint64_t freed = 0;
    /* units dropped nothing from in this pass are skipped */
    unsigned char *tried = ndm__calloc(b->nunits ? b->nunits : 1, 1, NDM__INJ_SCRATCH);
    while (freed < need && tried) {
        unit *best = NULL;
        double best_h = 0;
        for (size_t i = 0; i < b->nunits; i++) {
            unit *u = &b->units[i];
            if (tried[i] || u->busy || u->broken || !u->last || u->dropped || !u->bytes)
                continue;
            double stale = (double)(b->clock - u->last_use) + 1.0;
            double h = (double)u->cost_ns / ((double)u->bytes * stale);
            if (!best || h < best_h) {
                best = u;
                best_h = h;
            }
        }
        if (!best)
            break;
        tried[best - b->units] = 1;
        freed += drop_unit(g, best);
    }
    free(tried);
    b->evicting = false;
    return freed;
}

/* Under the budget's limit a creation did not fit: drop what can be
 * recomputed. */
static int64_t relieve(const ndm__quota_miss *miss, const char *api, const ndm__site *site)
{
    ndm__ag_graph *g = budget_graph();
    if (!g || g->budget->owner_slot != miss->slot || g->budget->evicting)
        return 0;
    int64_t over = miss->used + miss->bytes - (int64_t)miss->limit;
    uint64_t freed = drop_for(g, over > 0 ? (uint64_t)over : 1);
    if (freed)
        return (int64_t)freed;
    char path[512];
    ndm__manager_path(miss->slot, path, sizeof path);
    return ndm__fail(NDM_E_QUOTA, api, *site,
                     "%s needs %" PRId64 " bytes more with %" PRId64
                     " held that autograd cannot drop (its inputs, the step's live arrays and "
                     "what backward still needs): %" PRId64 " bytes, over the budget of %" PRIu64
                     " bytes of '%s'",
                     api, miss->bytes, miss->used, miss->used + miss->bytes, miss->limit, path);
}

/* ---- recomputing -------------------------------------------------------------------- */

static ndm_status recompute(ndm__ag_graph *g, unit *u, const char *api, ndm__site site);

/* Node nd's result resident again (its unit recomputed if it was dropped). */
static ndm_status resident(ndm__ag_graph *g, ndm__ag_node *nd, const char *api, ndm__site site)
{
    if (nd->saved_out.id)
        return NDM_OK;
    unit *u = unit_of(g, nd->unit);
    ndm_status st = u ? recompute(g, u, api, site) : NDM_E_INTERNAL;
    if (st == NDM_OK && !nd->saved_out.id)
        st = NDM_E_INTERNAL;
    return st < 0 && ndm_last_status() == NDM_OK
               ? ndm__fail(st, api, site, "a dropped intermediate could not be recomputed")
               : st;
}

static bool made_push(replay *rp, ndm_array h)
{
    ndm__array *r = ndm__array_peek(h);
    if (!r)
        return false;
    if (rp->nmade == rp->capmade) {
        size_t c = rp->capmade ? 2 * rp->capmade : 32;
        ndm__storage **p = ndm__realloc(rp->made, c * sizeof *p, NDM__INJ_SCRATCH);
        if (!p)
            return true; /* the count only misses it */
        rp->made = p;
        rp->capmade = c;
    }
    rp->made[rp->nmade++] = r->storage;
    return true;
}

void ndm__ag_replay_record(ndm__ag_graph *g, ndm__ag_op op, ndm_array out, int n,
                           const ndm_array *in)
{
    replay *rp = ndm__ag_tls.replay;
    if (rp->diverged)
        return;
    if (rp->cursor > rp->u->last || rp->cursor > g->nall) {
        rp->diverged = true;
        return;
    }
    ndm__ag_node *e = g->all[rp->cursor - 1];
    if (e->op != op || e->n != n) {
        rp->diverged = true;
        return;
    }
    rp->cursor++;
    ndm__ag_tls.pause++;
    for (int i = 0; i < n; i++) {
        ndm__array *r = ndm__array_peek(in[i]);
        if (e->in[i].id || !r)
            continue;
        e->in[i] = ndm__array_view(ndm__array_site(r), "autograd", g->mgr, r, r->dtype, r->ndim,
                                   r->shape, r->strides, r->offset, NULL);
        if (!e->in[i].id)
            rp->diverged = true;
    }
    ndm__array *ro = ndm__array_peek(out);
    if (!e->saved_out.id && ro) {
        e->saved_out = ndm__array_view(ndm__array_site(ro), "autograd", g->mgr, ro, ro->dtype,
                                       ro->ndim, ro->shape, ro->strides, ro->offset, NULL);
        if (!made_push(rp, e->saved_out))
            rp->diverged = true;
    }
    ndm__ag_tls.pause--;
    /* later operations of the recomputation on it are recorded too */
    if (!ndm__ag_graph_alias(g, out.id, e))
        rp->diverged = true;
}

static int by_ptr(const void *a, const void *b)
{
    const void *x = *(void *const *)a, *y = *(void *const *)b;
    return x < y ? -1 : x > y;
}

static ndm_status recompute(ndm__ag_graph *g, unit *u, const char *api, ndm__site site)
{
    ndm__ag_budget *b = g->budget;
    if (u->broken)
        return ndm__fail(NDM_E_INTERNAL, api, site, "a dropped unit cannot be recomputed");
    ndm_array in[UNIT_INPUTS];
    u->busy++;
    ndm_status st = NDM_OK;
    for (int i = 0; i < u->n && st == NDM_OK; i++) {
        in[i] = u->kept[i];
        if (!u->src[i])
            continue;
        unit *su = unit_of(g, u->src[i]->unit);
        st = resident(g, u->src[i], api, site);
        if (su)
            su->busy++;
        in[i] = u->src[i]->saved_out;
        if (st == NDM_OK && !ndm__ag_graph_alias(g, in[i].id, u->src[i]))
            st = ndm__fail(NDM_E_OOM, api, site, "no memory to recompute");
    }
    ndm__ag_thread *t = &ndm__ag_tls;
    ndm__ag_thread saved = *t;
    replay rp = {.u = u, .cursor = u->first};
    if (st == NDM_OK) {
        t->graph = g->mgr;
        t->pause = 0;
        t->replay = &rp;
        t->unit = NULL;
        t->budget = true;
        t->depth = 1;
        t->keep = 0;
        /* a frame, so that a snapshot's stack marks what was recomputed */
        int pushed = ndm__frame_push("recompute", site.file, site.func, site.line, __FILE__, __LINE__);
        ndm_manager scope = ndm_scope_begin_at(NDM__SITE_ARGS(site), g->mgr, "recompute");
        ndm_array y = scope.id ? u->fn(u->module, u->kind, u->n, in) : NDM_NULL_ARRAY;
        bool ok = y.id != 0;
        if (scope.id)
            (void)!ndm_scope_end(scope, 0, NULL);
        ndm__frame_pop(&pushed);
        t->graph = saved.graph;
        t->pause = saved.pause;
        t->replay = saved.replay;
        t->unit = saved.unit;
        t->budget = saved.budget;
        t->depth = saved.depth;
        t->keep = saved.keep;
        if (!ok || rp.diverged || rp.cursor != u->last + 1)
            st = ndm__fail(ok ? NDM_E_INTERNAL : ndm_last_status() < 0 ? ndm_last_status()
                                                                        : NDM_E_INTERNAL,
                           api, site,
                           "recomputing a dropped intermediate %s",
                           ok ? "did not repeat the recorded operations" : "failed");
    }
    for (int i = 0; i < u->n; i++) {
        unit *su = u->src[i] ? unit_of(g, u->src[i]->unit) : NULL;
        if (su && su->busy)
            su->busy--;
    }
    u->busy--;
    if (rp.nmade) {
        qsort(rp.made, rp.nmade, sizeof *rp.made, by_ptr);
        uint64_t bytes = 0;
        for (size_t i = 0; i < rp.nmade; i++)
            if (!i || rp.made[i] != rp.made[i - 1])
                bytes += rp.made[i]->nbytes;
        b->stats.recomputed_bytes += bytes;
        ndm__manager_count_recomputed(g->mgr, bytes);
    }
    free(rp.made);
    b->stats.recomputations++;
    u->dropped = false;
    u->last_use = ++b->clock;
    return st;
}

/* ---- backward -------------------------------------------------------------------------- */

static void hold(ndm__ag_budget *b, ndm__ag_graph *g, uint32_t un)
{
    unit *u = unit_of(g, un);
    if (!u || b->nheld >= (int)(sizeof b->held / sizeof b->held[0]))
        return;
    u->busy++;
    u->last_use = ++b->clock;
    b->held[b->nheld++] = un;
}

ndm_status ndm__ag_budget_before(ndm__ag_graph *g, ndm__ag_node *nd, const char *api,
                                 ndm__site site)
{
    ndm__ag_budget *b = g->budget;
    ndm_status st = NDM_OK;
    bool missing = !nd->saved_out.id;
    for (int i = 0; i < nd->n; i++)
        missing |= !nd->in[i].id && !nd->prod[i];
    /* the node's own unit first: its recomputation gives back its views */
    unit *u = unit_of(g, nd->unit);
    if (missing && u)
        st = recompute(g, u, api, site);
    else if (missing)
        st = ndm__fail(NDM_E_INTERNAL, api, site, "an intermediate was dropped outside a unit");
    hold(b, g, nd->unit);
    for (int i = 0; i < nd->n && st == NDM_OK; i++) {
        ndm__ag_node *p = nd->prod[i];
        if (!p)
            continue;
        if (p->unit != nd->unit)
            hold(b, g, p->unit);
        if (!nd->in[i].id) {
            st = resident(g, p, api, site);
            ndm__array *r = st == NDM_OK ? ndm__array_peek(p->saved_out) : NULL;
            if (r) {
                ndm__ag_tls.pause++;
                nd->in[i] = ndm__array_view(ndm__array_site(r), "autograd", g->mgr, r, r->dtype,
                                            r->ndim, r->shape, r->strides, r->offset, NULL);
                ndm__ag_tls.pause--;
                if (!nd->in[i].id)
                    st = ndm_last_status();
            }
        }
    }
    return st;
}

void ndm__ag_budget_after(ndm__ag_graph *g, ndm__ag_node *nd)
{
    ndm__ag_budget *b = g->budget;
    for (int i = 0; i < b->nheld; i++) {
        unit *u = unit_of(g, b->held[i]);
        if (u->busy)
            u->busy--;
    }
    b->nheld = 0;
    /* backward has passed the unit: nothing left in this pass reads it, so
     * it goes at once (another pass recomputes it) */
    unit *u = unit_of(g, nd->unit);
    if (u && nd->order == u->first)
        drop_unit(g, u);
}

void ndm__ag_budget_backward_begin(ndm__ag_graph *g)
{
    ndm__ag_budget *b = g->budget;
    b->nheld = 0;
    for (size_t i = 0; i < b->nunits; i++)
        if (b->units[i].always && !b->units[i].dropped)
            drop_unit(g, &b->units[i]);
}

/* ---- the public part ---------------------------------------------------------------------- */

NDM_API ndm_status ndm_grad_begin_budget_at(NDM_SITE_PARAMS, ndm_manager owner, uint64_t bytes)
{
    ndm__site site = NDM__SITE;
    ndm__manager *m = ndm__manager_get(owner, __func__, site);
    if (!m)
        return ndm_last_status();
    if (bytes == 0)
        return ndm__fail(NDM_E_INVALID, __func__, site, "a budget of 0 bytes");
    /* (before the limit is set: a refusal changes nothing) */
    if (ndm__ag_tls.graph.id && ndm_manager_valid(ndm__ag_tls.graph))
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "this thread is already recording (call ndm_grad_end first)");
    ndm__ag_budget *b = ndm__calloc(1, sizeof *b, NDM__INJ_NODE);
    if (!b)
        return ndm__fail(NDM_E_OOM, __func__, site, "no memory for a budget");
    ndm_status st = ndm_manager_set_limit(owner, ndm__manager_device_of(m), bytes);
    if (st == NDM_OK)
        st = ndm_grad_begin_at(NDM__SITE_ARGS(site), owner);
    if (st < 0) {
        free(b);
        return st;
    }
    static _Atomic int installed;
    if (!atomic_exchange(&installed, 1))
        atomic_store_explicit(&ndm__quota_relief, relieve, memory_order_release);
    ndm__ag_graph *g = ndm__ag_tls.ctx;
    b->owner = owner;
    b->owner_slot = m->self;
    b->bytes = bytes;
    b->stats.budget_bytes = bytes;
    g->budget = b;
    ndm__ag_tls.budget = true;
    ndm__ag_tls.depth = 0;
    ndm__ag_tls.keep = 0;
    ndm__ag_tls.unit = NULL;
    return NDM_OK;
}

NDM_API ndm_status ndm_grad_budget_get_stats(ndm_grad_budget_stats *out)
{
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "out is NULL");
    ndm__ag_graph *g = budget_graph();
    if (!g)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "this thread's graph has no budget (ndm_grad_begin_budget)");
    *out = g->budget->stats;
    return NDM_OK;
}
