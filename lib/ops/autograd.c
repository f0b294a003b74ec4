/* Autograd: per-thread recording of operations into a graph owned by a
 * manager, and reverse-mode accumulation into parameters' gradients. */
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "dispatch.h"
#include "ndm/autograd.h"
#include "ndm/elementwise.h"
#include "ndm/reduce.h"

_Thread_local ndm__ag_thread ndm__ag_tls NDM__TLS_MODEL;

/* A parameter's record: its gradient array (in the parameter's manager). */
typedef struct param_info {
    ndm_array grad;
} param_info;

typedef ndm__ag_graph graph;

static void graph_free(void *p)
{
    graph *g = p;
    for (size_t i = 0; i < g->nall; i++)
        free(g->all[i]);
    free(g->all);
    free(g->keys);
    free(g->vals);
    ndm__ag_budget_free(g->budget);
    free(g);
}

static size_t hash_id(uint64_t id) { return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17); }

static ndm__ag_node *graph_find(graph *g, uint64_t id)
{
    if (!g->cap)
        return NULL;
    for (size_t i = hash_id(id) & (g->cap - 1);; i = (i + 1) & (g->cap - 1)) {
        if (!g->keys[i])
            return NULL;
        if (g->keys[i] == id)
            return g->vals[i];
    }
}

/* Map id to nd in the table (grown as needed); false when out of memory. */
static bool table_put(graph *g, uint64_t id, ndm__ag_node *nd)
{
    if ((g->count + 1) * 2 > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 256;
        uint64_t *k = ndm__calloc(cap, sizeof *k, NDM__INJ_NODE);
        ndm__ag_node **v = ndm__calloc(cap, sizeof *v, NDM__INJ_NODE);
        if (!k || !v) {
            free(k);
            free(v);
            return false;
        }
        for (size_t i = 0; i < g->cap; i++) {
            if (!g->keys[i])
                continue;
            size_t j = hash_id(g->keys[i]) & (cap - 1);
            while (k[j])
                j = (j + 1) & (cap - 1);
            k[j] = g->keys[i];
            v[j] = g->vals[i];
        }
        free(g->keys);
        free(g->vals);
        g->keys = k;
        g->vals = v;
        g->cap = cap;
    }
    size_t i = hash_id(id) & (g->cap - 1);
    while (g->keys[i] && g->keys[i] != id)
        i = (i + 1) & (g->cap - 1);
    if (!g->keys[i])
        g->count++;
    g->keys[i] = id;
    g->vals[i] = nd;
    return true;
}

static bool graph_put(graph *g, uint64_t id, ndm__ag_node *nd)
{
    if (g->nall == g->capall) {
        size_t c = g->capall ? g->capall * 2 : 256;
        ndm__ag_node **a = ndm__realloc(g->all, c * sizeof *a, NDM__INJ_NODE);
        if (!a)
            return false;
        g->all = a;
        g->capall = c;
    }
    if (!table_put(g, id, nd))
        return false;
    g->all[g->nall++] = nd;
    return true;
}

ndm__ag_node *ndm__ag_graph_find(graph *g, uint64_t id) { return graph_find(g, id); }

bool ndm__ag_graph_alias(graph *g, uint64_t id, ndm__ag_node *nd) { return table_put(g, id, nd); }

/* This thread's graph: the one it records into, or the last one it used. */
static graph *current_graph(void)
{
    ndm__ag_thread *t = &ndm__ag_tls;
    if (!t->ctx)
        return NULL;
    /* the graph dies with its manager (an owned resource): check the
     * manager's handle before touching the graph */
    if (!ndm_manager_valid(t->ctx_mgr)) {
        t->ctx = NULL;
        t->ctx_mgr = NDM_NULL_MANAGER;
        t->graph = NDM_NULL_MANAGER;
        return NULL;
    }
    return t->ctx;
}

static param_info *param_of(const ndm__array *r)
{
    param_info *pi = r->ext;
    return pi && ndm_array_valid(pi->grad) ? pi : NULL;
}

/* ---- parameters ----------------------------------------------------------- */

NDM_API ndm_status ndm_requires_grad_at(NDM_SITE_PARAMS, ndm_array param)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__array_get(param, __func__, site);
    if (!r)
        return ndm_last_status();
    if (param_of(r))
        return NDM_OK;
    if (!ndm_dtype_is_float(r->dtype)) {
        char desc[160];
        return ndm__fail(NDM_E_DTYPE, __func__, site,
                         "only float arrays have gradients; %s is not one",
                         ndm__array_desc(r, desc, sizeof desc));
    }
    param_info *pi = ndm__malloc(sizeof *pi, NDM__INJ_NODE);
    if (!pi)
        return ndm__fail(NDM_E_OOM, __func__, site, "no memory for a parameter record");
    ndm__array *gr;
    ndm_manager m = ndm__manager_handle_of(ndm__manager_slot(r->mgr));
    ndm_array grad = ndm__array_new_on(site, __func__, m, r->storage->device, r->dtype, r->ndim,
                                       r->shape, &gr);
    if (!grad.id) {
        free(pi);
        return ndm_last_status();
    }
    const ndm__backend *b = ndm__backend_of(gr->storage->device, __func__, site);
    ndm__tensor t = ndm__tensor_of(gr);
    ndm_status st = b ? b->fill(gr->storage->device.index, &t, 0.0) : NDM_E_UNSUPPORTED;
    if (st < 0) {
        ndm__discard(grad);
        free(pi);
        return b ? ndm__fail(st, __func__, site, "cannot zero the gradient") : st;
    }
    pi->grad = grad;
    /* the record frees ext when the parameter is released */
    r->ext = pi;
    return NDM_OK;
}

NDM_API bool ndm_array_requires_grad(ndm_array a)
{
    ndm__array *r = ndm__array_peek(a);
    return r && param_of(r);
}

NDM_API ndm_array ndm_grad_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array param)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__array_get_prop(param, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    param_info *pi = param_of(r);
    if (!pi) {
        char desc[160];
        ndm__fail(NDM_E_INVALID, __func__, site, "%s is not a parameter (ndm_requires_grad)",
                  ndm__array_desc(r, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    return ndm_alias_to_at(NDM__SITE_ARGS(site), out, pi->grad);
}

NDM_API ndm_status ndm_zero_grad(size_t n, const ndm_array *params)
{
    if (n && !params)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "params is NULL with n = %zu", n);
    for (size_t i = 0; i < n; i++) {
        ndm__array *r = ndm__array_get(params[i], __func__, NDM__NO_SITE);
        if (!r)
            return ndm_last_status();
        param_info *pi = param_of(r);
        if (!pi) {
            char desc[160];
            return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                             "params[%zu] (%s) is not a parameter", i,
                             ndm__array_desc(r, desc, sizeof desc));
        }
        ndm__array *gr = ndm__array_peek(pi->grad);
        const ndm__backend *b = ndm__backend_of(gr->storage->device, __func__, NDM__NO_SITE);
        if (!b)
            return ndm_last_status();
        ndm__tensor t = ndm__tensor_of(gr);
        ndm_status st = b->fill(gr->storage->device.index, &t, 0.0);
        if (st < 0)
            return ndm__fail(st, __func__, NDM__NO_SITE, "cannot zero a gradient");
    }
    return NDM_OK;
}

/* ---- recording ------------------------------------------------------------------ */

NDM_API ndm_status ndm_grad_begin_at(NDM_SITE_PARAMS, ndm_manager owner)
{
    ndm__site site = NDM__SITE;
    ndm__ag_thread *t = &ndm__ag_tls;
    if (t->graph.id && ndm_manager_valid(t->graph))
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "this thread is already recording (call ndm_grad_end first)");
    ndm_manager gm = ndm_manager_new_at(NDM__SITE_ARGS(site), owner, "graph");
    if (!gm.id)
        return ndm_last_status();
    graph *g = ndm__calloc(1, sizeof *g, NDM__INJ_NODE);
    if (!g) {
        (void)!ndm_manager_close(gm);
        return ndm__fail(NDM_E_OOM, __func__, site, "no memory for a graph");
    }
    g->mgr = gm;
    ndm_status st = ndm_manager_own_at(NDM__SITE_ARGS(site), gm, g, graph_free, "autograd graph");
    if (st < 0) {
        free(g);
        (void)!ndm_manager_close(gm);
        return st;
    }
    t->graph = gm;
    t->ctx = g;
    t->ctx_mgr = gm;
    t->budget = false;
    t->unit = NULL;
    return NDM_OK;
}

NDM_API ndm_status ndm_grad_end(void)
{
    if (!ndm__ag_tls.graph.id)
        return NDM_ALREADY;
    /* keep ctx: backward may still run on the graph */
    ndm__ag_tls.graph = NDM_NULL_MANAGER;
    ndm__ag_tls.budget = false;
    ndm__ag_tls.unit = NULL;
    return NDM_OK;
}

NDM_API bool ndm_grad_recording(void)
{
    return ndm__ag_on() && current_graph() != NULL;
}

NDM_API void ndm_no_grad_begin(void)
{
    ndm__ag_tls.pause++;
}

NDM_API void ndm_no_grad_end(void)
{
    if (ndm__ag_tls.pause > 0)
        ndm__ag_tls.pause--;
}

bool ndm__ag_paused(void)
{
    return ndm__ag_tls.pause != 0;
}

void ndm__ag_record(ndm__ag_op op, ndm_array out, int n, const ndm_array *in,
                    const ndm__ag_params *p)
{
    graph *g = current_graph();
    ndm__ag_thread *t = &ndm__ag_tls;
    if (!g || !t->graph.id)
        return;
    /* does any input need a gradient? */
    bool any = false;
    for (int i = 0; i < n && !any; i++) {
        ndm__array *r = ndm__array_peek(in[i]);
        any = r && (param_of(r) || graph_find(g, in[i].id));
    }
    if (!any)
        return;
    if (NDM__UNLIKELY(t->replay != NULL)) {
        ndm__ag_replay_record(g, op, out, n, in);
        return;
    }
    ndm__array *ro = ndm__array_peek(out);
    if (!ro)
        return;
    size_t bytes = sizeof(ndm__ag_node) + (size_t)n * (2 * sizeof(ndm_array) + sizeof(void *) + 1);
    ndm__ag_node *nd = ndm__calloc(1, bytes, NDM__INJ_NODE);
    if (!nd) {
        g->failed = true;
        return;
    }
    /* The views the graph keeps carry the line of the operation that made
     * `out` (the user's), so a dump or ndm_why_alive names what saved them. */
    ndm__site record_site = ndm__array_site(ro);
    nd->op = op;
    nd->n = n;
    nd->order = ++g->next_order;
    nd->out = out;
    nd->in = (ndm_array *)(nd + 1);
    nd->leaf = nd->in + n;
    nd->prod = (ndm__ag_node **)(nd->leaf + n);
    nd->needs = (unsigned char *)(nd->prod + n);
    if (p)
        nd->p = *p;
    /* the graph keeps handles on the inputs and the result, so backward can
     * read them whatever the caller releases meanwhile */
    t->pause++;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        ndm__array *r = ndm__array_peek(in[i]);
        if (!r)
            continue;
        param_info *pi = param_of(r);
        ndm__ag_node *pr = graph_find(g, in[i].id);
        nd->prod[i] = pr;
        nd->leaf[i] = pr ? NDM_NULL_ARRAY : pi ? pi->grad : NDM_NULL_ARRAY;
        nd->needs[i] = pr || pi;
        nd->in[i] = ndm__array_view(record_site, "autograd", g->mgr, r, r->dtype, r->ndim, r->shape,
                                    r->strides, r->offset, NULL);
        ok = nd->in[i].id != 0;
    }
    if (ok) {
        nd->saved_out = ndm__array_view(record_site, "autograd", g->mgr, ro, ro->dtype, ro->ndim,
                                        ro->shape, ro->strides, ro->offset, NULL);
        ok = nd->saved_out.id && graph_put(g, out.id, nd);
    }
    t->pause--;
    if (!ok) {
        /* the handles already made stay in the graph manager until it closes */
        free(nd);
        g->failed = true;
        return;
    }
    if (NDM__UNLIKELY(g->budget != NULL))
        ndm__ag_budget_node(g, nd);
}

void ndm__ag_record_reduce(ndm__ag_op op, ndm_array out, ndm_array in, int ndim, bool keepdim,
                           int naxes, const int *axes)
{
    ndm__ag_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = keepdim;
    if (naxes < 0 || ndim > NDM__AG_MAX_AXES) {
        p.naxes = -1;
    } else {
        p.naxes = naxes;
        for (int k = 0; k < naxes && k < NDM__AG_MAX_AXES; k++)
            p.axes[k] = axes[k] < 0 ? axes[k] + ndim : axes[k];
        if (naxes > NDM__AG_MAX_AXES)
            p.naxes = -1;
    }
    ndm__ag_record(op, out, 1, &in, &p);
}

/* ---- backward --------------------------------------------------------------------- */

static int by_order_desc(const void *a, const void *b)
{
    const ndm__ag_node *x = *(ndm__ag_node *const *)a, *y = *(ndm__ag_node *const *)b;
    return x->order < y->order ? 1 : x->order > y->order ? -1 : 0;
}

/* The nodes that `root` depends on, root included, latest first: a node's
 * producers were recorded before it, so this is a reverse topological order. */
static ndm__ag_node **reachable(ndm__ag_node *root, size_t *count)
{
    size_t cap = 64, n = 0, sp = 0, scap = 64;
    ndm__ag_node **out = ndm__malloc(cap * sizeof *out, NDM__INJ_SCRATCH);
    ndm__ag_node **stack = ndm__malloc(scap * sizeof *stack, NDM__INJ_SCRATCH);
    if (!out || !stack) {
        free(out);
        free(stack);
        return NULL;
    }
    stack[sp++] = root;
    root->seen = 1;
    while (sp) {
        ndm__ag_node *nd = stack[--sp];
        if (n == cap) {
            ndm__ag_node **o = ndm__realloc(out, (cap *= 2) * sizeof *o, NDM__INJ_SCRATCH);
            if (!o)
                goto oom;
            out = o;
        }
        out[n++] = nd;
        for (int i = 0; i < nd->n; i++) {
            ndm__ag_node *p = nd->prod[i];
            if (!p || p->seen)
                continue;
            p->seen = 1;
            if (sp == scap) {
                ndm__ag_node **s = ndm__realloc(stack, (scap *= 2) * sizeof *s, NDM__INJ_SCRATCH);
                if (!s)
                    goto oom;
                stack = s;
            }
            stack[sp++] = p;
        }
    }
    free(stack);
    qsort(out, n, sizeof *out, by_order_desc);
    *count = n;
    return out;
oom:
    for (size_t i = 0; i < n; i++)
        out[i]->seen = 0;
    for (size_t i = 0; i < sp; i++)
        stack[i]->seen = 0;
    free(out);
    free(stack);
    return NULL;
}

/* Add gradient gi (for input i of nd) to where it goes. */
static ndm_status deliver(ndm__ag_node *nd, int i, ndm_array gi, bool tidy, const char *api,
                          ndm__site site)
{
    ndm__array *in = ndm__array_peek(nd->in[i]);
    if (!in)
        return ndm__fail(NDM_E_INTERNAL, api, site, "a graph input was released");
    ndm_array s = ndm__ag_sum_to(gi, in->ndim, in->shape);
    if (s.id && ndm_array_dtype(s) != in->dtype)
        s = ndm_astype(s, in->dtype);
    if (!s.id)
        return ndm_last_status();
    if (nd->prod[i]) {
        ndm__ag_node *p = nd->prod[i];
        ndm_array old = p->g;
        /* under a budget each node's gradient is a handle of its own (one
         * goes once used), and the sum replaces its terms at once */
        p->g = p->g.id ? ndm_add(p->g, s) : tidy ? ndm_alias(s) : s;
        if (tidy && old.id && p->g.id && old.id != s.id)
            (void)!ndm_array_release(old);
        return p->g.id ? NDM_OK : ndm_last_status();
    }
    if (nd->leaf[i].id)
        return ndm_add_(nd->leaf[i], s);
    return NDM_OK;
}

ndm_array ndm__ag_grad_of(ndm_array param)
{
    ndm__array *r = ndm__array_peek(param);
    param_info *pi = r ? param_of(r) : NULL;
    return pi ? pi->grad : NDM_NULL_ARRAY;
}

ndm_array ndm__ag_set_grad(ndm_array param, ndm_array grad)
{
    ndm__array *r = ndm__array_peek(param);
    /* the record itself: its gradient may be gone already */
    param_info *pi = r ? r->ext : NULL;
    if (!pi)
        return NDM_NULL_ARRAY;
    ndm_array old = pi->grad;
    pi->grad = grad;
    return old;
}

/* When each parameter's gradient is complete: after the last node, in
 * backward's order, that delivers to it. */
typedef struct ready_at {
    uint64_t grad;  /* the gradient array's handle */
    size_t k;       /* the position in the order after which it is complete */
} ready_at;

static int by_grad_then_k_desc(const void *a, const void *b)
{
    const ready_at *x = a, *y = b;
    if (x->grad != y->grad)
        return x->grad < y->grad ? -1 : 1;
    return x->k < y->k ? 1 : x->k > y->k ? -1 : 0;
}

static int by_k(const void *a, const void *b)
{
    const ready_at *x = a, *y = b;
    return x->k < y->k ? -1 : x->k > y->k ? 1 : 0;
}

/* The parameters' completion points, ordered by position; NULL with *n = 0
 * when there are none, NULL with *n = SIZE_MAX when out of memory. */
static ready_at *ready_points(ndm__ag_node **order, size_t count, size_t *n)
{
    size_t m = 0;
    for (size_t k = 0; k < count; k++)
        for (int i = 0; i < order[k]->n; i++)
            m += order[k]->needs[i] && order[k]->leaf[i].id;
    *n = 0;
    if (!m)
        return NULL;
    ready_at *r = ndm__malloc(m * sizeof *r, NDM__INJ_SCRATCH);
    if (!r) {
        *n = SIZE_MAX;
        return NULL;
    }
    m = 0;
    for (size_t k = 0; k < count; k++)
        for (int i = 0; i < order[k]->n; i++)
            if (order[k]->needs[i] && order[k]->leaf[i].id)
                r[m++] = (ready_at){order[k]->leaf[i].id, k};
    qsort(r, m, sizeof *r, by_grad_then_k_desc);
    size_t u = 0;
    for (size_t j = 0; j < m; j++)
        if (!u || r[u - 1].grad != r[j].grad)
            r[u++] = r[j];
    qsort(r, u, sizeof *r, by_k);
    *n = u;
    return r;
}

NDM_API ndm_status ndm_backward_with_at(NDM_SITE_PARAMS, ndm_array out, ndm_array grad)
{
    NDM__OP_GUARD();
    return ndm__ag_backward_hooked(grad.id ? "ndm_backward_with" : "ndm_backward", NDM__SITE, out,
                                   grad, NULL, NULL);
}

/* A product whose input 0 is an activation and whose input 1 is a
 * parameter, or a view of one made just before it (a linear layer's
 * transposed weight): the node whose completion finishes the weight's
 * gradient early (nd itself, or the view's node at k + 1), or NULL when
 * the node runs whole. */
static ndm__ag_node *weight_first(ndm__ag_node *nd, ndm__ag_node **order, size_t count, size_t k)
{
    if ((nd->op != NDM__AG_MATMUL && nd->op != NDM__AG_CONV2D) || nd->n < 2 || nd->n > 8 ||
        !nd->needs[0] || !nd->needs[1] || nd->leaf[0].id)
        return NULL;
    if (nd->leaf[1].id && !nd->prod[1])
        return nd;
    ndm__ag_node *v = nd->prod[1];
    if (v && v != nd->prod[0] && k + 1 < count && order[k + 1] == v && v->op == NDM__AG_PERMUTE &&
        v->n == 1 && v->needs[0] && v->leaf[0].id && !v->prod[0])
        return v;
    return NULL;
}

/* Run nd's rule for its inputs lo .. hi-1 and deliver their gradients
 * (gv: room for nd->n). The other inputs' needs are masked for the call,
 * which a partial run (nd->n <= 8, weight_first) asks for. */
static ndm_status run_inputs(ndm__ag_node *nd, int lo, int hi, ndm_array *gv, bool tidy,
                             const char *api, ndm__site site)
{
    unsigned char keep[8];
    bool part = lo > 0 || hi < nd->n;
    for (int i = 0; i < nd->n; i++) {
        gv[i] = NDM_NULL_ARRAY;
        if (part && (i < lo || i >= hi)) {
            keep[i] = nd->needs[i];
            nd->needs[i] = 0;
        }
    }
    ndm_status st = ndm__ag_rule(nd, nd->g, gv);
    for (int i = 0; part && i < nd->n; i++)
        if (i < lo || i >= hi)
            nd->needs[i] = keep[i];
    for (int i = lo; i < hi && st == NDM_OK; i++)
        if (nd->needs[i] && gv[i].id)
            st = deliver(nd, i, gv[i], tidy, api, site);
    return st;
}

/* run_inputs under a byte budget: the rule's temporaries live in a scope of
 * their own that keeps only the gradients delivered, and nd's gradient goes
 * once used, so that backward holds what it still needs and no more. */
static ndm_status run_tidy(ndm__ag_node *nd, ndm_array *gv, const char *api, ndm__site site)
{
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), ndm__ag_tls.ctx_mgr, "node");
    if (!s.id)
        return ndm_last_status();
    ndm_status st = run_inputs(nd, 0, nd->n, gv, true, api, site);
    ndm_array keep[64];
    size_t k = 0;
    bool g_delivered = false;
    for (int i = 0; i < nd->n && k < 64; i++) {
        ndm__ag_node *p = nd->prod[i];
        if (!p || !p->g.id)
            continue;
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++)
            dup = keep[j].id == p->g.id;
        if (!dup && ndm_array_manager(p->g).id == s.id)
            keep[k++] = p->g;
        g_delivered |= p->g.id == nd->g.id;
    }
    ndm_status se = ndm_scope_end_at(NDM__SITE_ARGS(site), s, k, keep);
    if (st == NDM_OK && se < 0)
        st = se;
    if (!g_delivered && nd->g.id) {
        (void)!ndm_array_release(nd->g);
        nd->g = NDM_NULL_ARRAY;
    }
    return st;
}

ndm_status ndm__ag_backward_hooked(const char *api, ndm__site site, ndm_array out,
                                   ndm_array grad, ndm__ag_ready_fn ready, void *ud)
{
    NDM__CALL_FRAME(api, site);
    ndm__array *ro = ndm__array_get(out, api, site);
    if (!ro)
        return ndm_last_status();
    graph *g = current_graph();
    /* a failed recording first: the output it missed may be `out` itself */
    if (g && g->failed)
        return ndm__fail(NDM_E_OOM, api, site,
                         "the graph is incomplete: an operation could not be recorded (no memory)");
    ndm__ag_node *root = g ? graph_find(g, out.id) : NULL;
    if (!root) {
        char desc[160];
        return ndm__fail(NDM_E_INVALID, api, site,
                         "%s was not made by a recorded operation (start recording with "
                         "ndm_grad_begin before the forward pass; only operations on parameters "
                         "or recorded results are recorded)",
                         ndm__array_desc(ro, desc, sizeof desc));
    }
    ndm__array *rg = NULL;
    if (grad.id) {
        rg = ndm__array_get(grad, api, site);
        if (!rg)
            return ndm_last_status();
        if (rg->ndim != ro->ndim || memcmp(rg->shape, ro->shape, sizeof(int64_t) * ro->ndim)) {
            char d1[160], d2[160];
            return ndm__fail(NDM_E_SHAPE, api, site, "gradient %s does not match output %s",
                             ndm__array_desc(rg, d1, sizeof d1), ndm__array_desc(ro, d2, sizeof d2));
        }
    } else if (ndm__numel(ro->ndim, ro->shape) != 1) {
        char desc[160];
        return ndm__fail(NDM_E_SHAPE, api, site,
                         "%s has more than one element: pass its gradient (ndm_backward_with)",
                         ndm__array_desc(ro, desc, sizeof desc));
    }
    size_t count = 0;
    ndm__ag_node **order = reachable(root, &count);
    if (!order)
        return ndm__fail(NDM_E_OOM, api, site, "no memory to order the graph");
    size_t nready = 0, next_ready = 0;
    ready_at *points = ready ? ready_points(order, count, &nready) : NULL;
    if (nready == SIZE_MAX) {
        for (size_t k = 0; k < count; k++)
            order[k]->seen = 0;
        free(order);
        return ndm__fail(NDM_E_OOM, api, site, "no memory to order the graph");
    }
    ndm__ag_thread *t = &ndm__ag_tls;
    t->pause++;
    ndm_status st = NDM_OK;
    ndm_manager scope = ndm_scope_begin_at(NDM__SITE_ARGS(site), g->mgr, "backward");
    if (!scope.id) {
        st = ndm_last_status();
        goto done;
    }
    root->g = grad.id ? ndm_alias(grad) : ndm_ones(NDM_CURRENT_SCOPE, ro->dtype, ro->ndim, ro->shape);
    if (!root->g.id) {
        st = ndm_last_status();
        goto end;
    }
    if (NDM__UNLIKELY(g->budget != NULL))
        ndm__ag_budget_backward_begin(g);
    for (size_t k = 0; k < count && st == NDM_OK; k++) {
        ndm__ag_node *nd = order[k];
        for (; next_ready < nready && points[next_ready].k < k && st == NDM_OK; next_ready++)
            ready(ud, (ndm_array){points[next_ready].grad});
        if (!nd->g.id) {
            if (NDM__UNLIKELY(g->budget != NULL))
                ndm__ag_budget_after(g, nd);
            continue; /* nothing reached it */
        }
        /* under a budget, what the rule reads is made resident first */
        if (NDM__UNLIKELY(g->budget != NULL) && (st = ndm__ag_budget_before(g, nd, api, site)) < 0)
            break;
        ndm_array gi[64] = {{0}};
        ndm_array *gv = nd->n <= 64 ? gi : ndm__calloc((size_t)nd->n, sizeof *gv, NDM__INJ_SCRATCH);
        if (!gv) {
            st = ndm__fail(NDM_E_OOM, api, site, "no memory");
            break;
        }
        ndm__ag_node *view = ready && !g->budget ? weight_first(nd, order, count, k) : NULL;
        if (!view) {
            st = g->budget ? run_tidy(nd, gv, api, site) : run_inputs(nd, 0, nd->n, gv, false, api, site);
        } else {
            /* the weight's part first, then its view's node (next in the
             * order, and complete once this node has delivered to it):
             * the weight's gradient is reported before the input's
             * gradient is computed, so that communicating it overlaps
             * with that product */
            st = run_inputs(nd, 1, nd->n, gv, false, api, site);
            size_t upto = k;
            if (st == NDM_OK && view != nd) {
                ndm_array gview[1];
                st = run_inputs(view, 0, 1, gview, false, api, site);
                view->g = NDM_NULL_ARRAY; /* done: skipped when the loop comes to it */
                upto = k + 1;
            }
            for (; next_ready < nready && points[next_ready].k <= upto && st == NDM_OK;
                 next_ready++)
                ready(ud, (ndm_array){points[next_ready].grad});
            if (st == NDM_OK)
                st = run_inputs(nd, 0, 1, gv, false, api, site);
        }
        if (gv != gi)
            free(gv);
        if (NDM__UNLIKELY(g->budget != NULL))
            ndm__ag_budget_after(g, nd);
    }
    for (; next_ready < nready && st == NDM_OK; next_ready++)
        ready(ud, (ndm_array){points[next_ready].grad});
    if (st < 0 && ndm_last_status() == NDM_OK)
        ndm__fail(st, api, site, "backward failed");
end:
    (void)!ndm_scope_end(scope, 0, NULL);
done:
    for (size_t k = 0; k < count; k++) {
        order[k]->g = NDM_NULL_ARRAY;
        order[k]->seen = 0;
    }
    free(order);
    free(points);
    t->pause--;
    return st;
}
