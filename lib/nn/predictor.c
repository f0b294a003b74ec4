/* Predictors: a model capped for serving, and one request manager per
 * prediction, so a request leaves nothing behind in the model. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../manager/object.h"
#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "ndm/plan.h"
#include "nn.h"

/* A request shape served from a device graph: its static input (in the
 * predictor's manager), its answer (in the graph's manager) and the graph.
 * `lock` is held by the request using it; one that finds it taken runs
 * uncaptured. */
#define GRAPH_MAX_RANK 8
typedef struct pgraph {
    uint64_t sig;
    ndm_dtype dtype;
    int ndim;
    int64_t shape[GRAPH_MAX_RANK];
    bool used, dead; /* dead: its step cannot be captured; it runs uncaptured */
    int runs;        /* planned, uncaptured runs so far */
    pthread_mutex_t lock;
    ndm_array x, y;
    ndm_graph g;
} pgraph;

typedef struct predictor {
    ndm_manager model;
    ndm_manager mgr;
    ndm_module net;
    /* device graphs (ndm_predictor_use_graphs): NULL when off */
    pthread_mutex_t glock; /* the slots' claims */
    pgraph *graphs;
    int ngraphs;
    ndm_plan plan;
    _Atomic int64_t launched, uncaptured, captured;
} predictor;

static void pred_destroy(void *ptr)
{
    predictor *p = ptr;
    if (p->graphs) {
        for (int i = 0; i < p->ngraphs; i++)
            pthread_mutex_destroy(&p->graphs[i].lock);
        free(p->graphs);
        pthread_mutex_destroy(&p->glock);
    }
    free(p);
}

static const ndm__object_type pred_type = {
    .name = "predictor",
    .ended = "freed",
    .destroy = pred_destroy,
    .later = true,
};

/* A net built with gradients holds a gradient array beside each parameter,
 * which serving never touches: say so, with the way to build it without. */
static void warn_gradients(ndm_module net, const ndm__site *site)
{
    int n = ndm_module_parameters(net, NULL, 0);
    if (n <= 0)
        return;
    ndm_array *params = calloc((size_t)n, sizeof *params);
    if (!params)
        return;
    n = ndm_module_parameters(net, params, n);
    int with = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        if (ndm_array_requires_grad(params[i])) {
            with++;
            bytes += ndm_array_nbytes(params[i]);
        }
    free(params);
    if (with) {
        char where[256];
        ndm__warn("ndm_predictor_new: %d of the net's %d parameters carry gradient arrays "
                  "(%llu bytes) that serving never uses: build the net between "
                  "ndm_no_grad_begin() and ndm_no_grad_end() (at %s)",
                  with, n, (unsigned long long)bytes, ndm__site_str(*site, where, sizeof where));
    }
}

NDM_API ndm_predictor ndm_predictor_new_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_predictor_new";
    model = ndm__resolve_manager(model, api, site);
    if (!model.id)
        return (ndm_predictor){0};
    /* The cap below protects the net only if its parameters live in model. */
    if (ndm__module_check_owner(net, model, api, site) < 0)
        return (ndm_predictor){0};
    warn_gradients(net, &site);
    predictor *p = ndm__calloc(1, sizeof *p, NDM__INJ_OBJECT);
    if (!p) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a predictor");
        return (ndm_predictor){0};
    }
    p->model = model;
    p->net = net;
    p->mgr = ndm_manager_new_at(NDM__SITE_ARGS(site), model, "predictor");
    ndm_status st = p->mgr.id ? ndm_module_set_training(net, false) : ndm_last_status();
    if (st < 0) {
        free(p);
        return (ndm_predictor){0};
    }
    uint64_t id = ndm__object_new(&pred_type, model, p, site, api);
    if (!id) {
        free(p);
        return (ndm_predictor){0};
    }
    /* from here the model takes nothing new: a request's stray array fails at its line */
    if (ndm_manager_cap(model, NDM_CAP_ARRAYS | NDM_CAP_CHILDREN) < 0)
        return (ndm_predictor){0};
    return (ndm_predictor){id};
}

/* One request: net on input in a request manager under `parent` (the
 * innermost scope while the net runs), the answer moved to dst. */
/* `serving`: the caller is one of many serving threads, whose kernels run
 * on their own thread rather than split across the compute pool. */
static ndm_array run_request(const predictor *p, ndm_manager parent, ndm_manager dst,
                             ndm_array input, const ndm__view *rx, uint64_t *peak,
                             bool serving, const char *api, ndm__site site)
{
    /* The request is the innermost scope while the net runs: every array
     * the forward pass makes lands in it, and ending it frees them all;
     * only the answer moves out. One manager per request, not a request
     * and a forward scope inside it. A serving thread keeps its request
     * manager open between requests under the predictor (parked), so a
     * request takes no lock that the other serving threads take; a batch's
     * request (under its batch manager, which closes after it) is made fresh. */
    bool park = parent.id == p->mgr.id;
    ndm_manager req = park ? ndm__scope_reuse(site, parent, "request")
                           : ndm_scope_begin_at(NDM__SITE_ARGS(site), parent, "request");
    if (!req.id)
        return NDM_NULL_ARRAY;
    if (serving)
        ndm__compute_serving();
    /* An input on another device than the model's (a CPU request for a GPU
     * model) is copied there inside the request, so it dies with it. */
    ndm_device mdev = ndm_manager_device(p->model);
    ndm_array x = input;
    if (!ndm_device_eq(rx->device, mdev))
        x = ndm_to_to_at(NDM__SITE_ARGS(site), req, input, mdev);
    ndm_no_grad_begin();
    ndm_array y = x.id ? ndm__module_run(p->net, x, api, site) : NDM_NULL_ARRAY;
    ndm_no_grad_end();
    if (y.id && ndm_attach_at(NDM__SITE_ARGS(site), y, dst) < 0)
        y = NDM_NULL_ARRAY;
    /* The model closed under the request (its close closes the request
     * too): whatever the forward pass then met, that is the reason. */
    if (!y.id && ndm__manager_gone(req))
        ndm__fail(NDM_E_CLOSED, api, site, "%s",
                  ndm__manager_gone(p->model)
                      ? "the predictor's model was closed while the request ran"
                      : "the request's manager was closed while it ran");
    ndm_stats rs;
    if (peak)
        *peak = ndm_manager_stats(req, mdev, NDM_STATS_SUBTREE, &rs) == NDM_OK ? rs.peak_bytes : 0;
    ndm_status cs = park ? ndm__scope_park(site, parent, req)
                         : ndm_scope_end_at(NDM__SITE_ARGS(site), req, 0, NULL);
    (void)cs;
    return y;
}

/* ---- device graphs ------------------------------------------------------------------ */

typedef struct graph_ctx {
    const predictor *p;
    pgraph *pg;
    const char *api;
    ndm__site site;
} graph_ctx;

/* The request's step (as an eager planned run and as the capture): the net
 * on the static input, in a scope of the step; the answer kept there. */
static ndm_status graph_step(ndm_manager step, void *ud)
{
    graph_ctx *c = ud;
    ndm_manager sc = ndm_scope_begin_at(NDM__SITE_ARGS(c->site), step, "forward");
    if (!sc.id)
        return ndm_last_status();
    ndm_no_grad_begin();
    ndm_array y = ndm__module_run(c->p->net, c->pg->x, c->api, c->site);
    ndm_no_grad_end();
    ndm_status st = y.id ? NDM_OK : ndm_last_status();
    ndm_status es = ndm_scope_end_at(NDM__SITE_ARGS(c->site), sc, y.id ? 1 : 0, &y);
    c->pg->y = y;
    return st < 0 ? st : es;
}

static uint64_t shape_sig(ndm_dtype dt, int ndim, const int64_t *shape)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)dt;
    h = (h ^ (uint64_t)ndim) * 1099511628211ull;
    for (int i = 0; i < ndim; i++)
        h = (h ^ (uint64_t)shape[i]) * 1099511628211ull;
    return h;
}

/* The slot of the input's shape, locked; NULL when the shape has none (the
 * slots are taken by other shapes), its step cannot be captured, or another
 * request holds it: the request then runs uncaptured. */
static pgraph *graph_slot(predictor *p, const ndm__view *rx)
{
    if (rx->t.ndim > GRAPH_MAX_RANK)
        return NULL;
    uint64_t sig = shape_sig(rx->t.dtype, rx->t.ndim, rx->t.shape);
    pgraph *pg = NULL;
    pthread_mutex_lock(&p->glock);
    for (int i = 0; i < p->ngraphs && !pg; i++) {
        pgraph *q = &p->graphs[i];
        if (!q->used) {
            q->used = true;
            q->sig = sig;
            q->dtype = rx->t.dtype;
            q->ndim = rx->t.ndim;
            memcpy(q->shape, rx->t.shape, sizeof *q->shape * (size_t)rx->t.ndim);
            pg = q;
        } else if (q->sig == sig && q->dtype == rx->t.dtype && q->ndim == rx->t.ndim &&
                   !memcmp(q->shape, rx->t.shape, sizeof *q->shape * (size_t)rx->t.ndim)) {
            pg = q;
        }
    }
    pthread_mutex_unlock(&p->glock);
    if (!pg || pthread_mutex_trylock(&pg->lock) != 0)
        return NULL;
    if (pg->dead) {
        pthread_mutex_unlock(&pg->lock);
        return NULL;
    }
    return pg;
}

/* A request on the graph of its shape (slot pg, locked): the first runs
 * planned (recording the plan), the second captures, every later one
 * launches; the answer is copied into dst. The null handle with the error,
 * or (*retry) when the request should run uncaptured instead. */
static ndm_array graph_request(predictor *p, pgraph *pg, ndm_manager dst, ndm_array input,
                               bool *retry, const char *api, ndm__site site)
{
    *retry = false;
    if (!pg->x.id) {
        pg->x = ndm__array_make(site, api, p->mgr, NULL, pg->dtype, pg->ndim, pg->shape, NULL);
        if (!pg->x.id) {
            *retry = true;
            return NDM_NULL_ARRAY;
        }
    }
    if (ndm_copy_into_at(NDM__SITE_ARGS(site), pg->x, input) < 0)
        return NDM_NULL_ARRAY;
    graph_ctx c = {p, pg, api, site};
    if (!pg->g.id && pg->runs == 0) {
        ndm_manager step =
            ndm_manager_new_planned_at(NDM__SITE_ARGS(site), p->mgr, "request", p->plan, pg->sig);
        if (!step.id)
            return NDM_NULL_ARRAY;
        ndm_status st = graph_step(step, &c);
        ndm_array y = st < 0 ? NDM_NULL_ARRAY : ndm_copy_to_at(NDM__SITE_ARGS(site), dst, pg->y);
        ndm_status cs = ndm_manager_close_at(NDM__SITE_ARGS(site), step);
        (void)cs;
        pg->y = NDM_NULL_ARRAY;
        pg->runs++;
        atomic_fetch_add_explicit(&p->uncaptured, 1, memory_order_relaxed);
        return y;
    }
    if (!pg->g.id) {
        ndm__quiet_state q;
        ndm__quiet_begin(&q);
        pg->g = ndm_graph_capture_at(NDM__SITE_ARGS(site), p->mgr, "request", p->plan, pg->sig,
                                     graph_step, &c);
        ndm__quiet_end(&q);
        if (!pg->g.id) {
            /* (a net with a call that cannot be captured: served uncaptured) */
            pg->dead = true;
            *retry = true;
            return NDM_NULL_ARRAY;
        }
        atomic_fetch_add_explicit(&p->captured, 1, memory_order_relaxed);
    }
    if (ndm_graph_launch_at(NDM__SITE_ARGS(site), pg->g) < 0)
        return NDM_NULL_ARRAY;
    atomic_fetch_add_explicit(&p->launched, 1, memory_order_relaxed);
    return ndm_copy_to_at(NDM__SITE_ARGS(site), dst, pg->y);
}

/* A request of ndm_predict: on its shape's graph when the predictor uses
 * graphs and one serves it, else as any request. */
static ndm_array predict_request(predictor *p, ndm_manager parent, ndm_manager dst,
                                 ndm_array input, const ndm__view *rx, const char *api,
                                 ndm__site site)
{
    if (p->graphs && ndm_device_eq(rx->device, ndm_manager_device(p->model))) {
        pgraph *pg = graph_slot(p, rx);
        if (pg) {
            bool retry;
            ndm_array y = graph_request(p, pg, dst, input, &retry, api, site);
            pthread_mutex_unlock(&pg->lock);
            if (!retry)
                return y;
            ndm_clear_error();
        }
    }
    return run_request(p, parent, dst, input, rx, NULL, true, api, site);
}

NDM_API ndm_status ndm_predictor_use_graphs_at(NDM_SITE_PARAMS, ndm_predictor h, int max_shapes)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_predictor_use_graphs";
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    if (!p)
        return ndm_last_status();
    if (max_shapes < 1 || max_shapes > 64)
        return ndm__fail(NDM_E_INVALID, api, site, "max_shapes is %d, not 1..64", max_shapes);
    if (p->graphs)
        return ndm__fail(NDM_E_INVALID, api, site, "the predictor uses graphs already");
    ndm_device dev = ndm_manager_device(p->model);
    if (dev.type != NDM_DEVICE_CUDA) {
        char name[32];
        ndm_device_str(dev, name, sizeof name);
        return ndm__fail(NDM_E_UNSUPPORTED, api, site,
                         "the model is on %s, which has no device graphs (CUDA devices do)",
                         name);
    }
    pgraph *g = calloc((size_t)max_shapes, sizeof *g);
    if (!g)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d graphs", max_shapes);
    ndm_plan plan = ndm_plan_new_at(NDM__SITE_ARGS(site), p->mgr, max_shapes);
    if (!plan.id) {
        free(g);
        return ndm_last_status();
    }
    for (int i = 0; i < max_shapes; i++)
        pthread_mutex_init(&g[i].lock, NULL);
    pthread_mutex_init(&p->glock, NULL);
    p->plan = plan;
    p->ngraphs = max_shapes;
    p->graphs = g; /* (set last: requests read it without a lock) */
    return NDM_OK;
}

NDM_API ndm_status ndm_predictor_get_graph_stats_at(NDM_SITE_PARAMS, ndm_predictor h,
                                                    ndm_predictor_graph_stats *out)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_predictor_get_graph_stats";
    if (!out)
        return ndm__fail(NDM_E_INVALID, api, site, "out is NULL");
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    if (!p)
        return ndm_last_status();
    *out = (ndm_predictor_graph_stats){
        atomic_load(&p->captured), atomic_load(&p->launched), atomic_load(&p->uncaptured)};
    return NDM_OK;
}

NDM_API ndm_array ndm_predict_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_predictor h,
                                    ndm_array input)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_predict";
    NDM__CALL_FRAME(api, site);
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    ndm__view rx;
    if (!p || !ndm__view_input(input, &rx, api, site))
        return NDM_NULL_ARRAY;
    ndm_manager dst = ndm__output_for(out, input, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    return predict_request(p, p->mgr, dst, input, &rx, api, site);
}

NDM_API ndm_array ndm_predict_under_at(NDM_SITE_PARAMS, ndm_manager parent, ndm_predictor h,
                                       ndm_array input)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_predict_under";
    NDM__CALL_FRAME(api, site);
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    ndm__view rx;
    if (!p || !ndm__view_input(input, &rx, api, site))
        return NDM_NULL_ARRAY;
    if (parent.id == NDM_OUTPUT_RULE.id) {
        ndm__fail(NDM_E_INVALID, api, site, "the parent must be a manager, not NDM_OUTPUT_RULE");
        return NDM_NULL_ARRAY;
    }
    ndm_manager dst = ndm__output_for(parent, input, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    return run_request(p, dst, dst, input, &rx, NULL, true, api, site);
}

ndm_array ndm__predict_under(ndm_predictor h, ndm_manager parent, ndm_manager dst,
                             ndm_array input, uint64_t *peak, const char *api, ndm__site site)
{
    NDM__OP_GUARD();
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    ndm__view rx;
    if (!p || !ndm__view_input(input, &rx, api, site))
        return NDM_NULL_ARRAY;
    /* a batch, run by the batcher's worker, which may spread its kernels
     * over the compute pool */
    return run_request(p, parent, dst, input, &rx, peak, false, api, site);
}

ndm_manager ndm__predictor_model(ndm_predictor h, const char *api, ndm__site site)
{
    predictor *p = ndm__object_get(h.id, &pred_type, api, site);
    return p ? p->model : NDM_NULL_MANAGER;
}

NDM_API ndm_manager ndm_predictor_manager(ndm_predictor h)
{
    predictor *p = ndm__object_get(h.id, &pred_type, __func__, NDM__NO_SITE);
    return p ? p->mgr : NDM_NULL_MANAGER;
}

NDM_API ndm_predictor ndm_predictor_load_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net,
                                            const char *path)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    if (ndm_module_load_at(NDM__SITE_ARGS(site), net, path, NDM_CHECKPOINT_STRICT) < 0)
        return (ndm_predictor){0};
    return ndm_predictor_new_at(NDM__SITE_ARGS(site), model, net);
}
