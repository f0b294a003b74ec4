/* Predictors: a model capped for serving, and one request manager per
 * prediction, so a request leaves nothing behind in the model. */
#include <stdlib.h>

#include "../manager/object.h"
#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

typedef struct predictor {
    ndm_manager model;
    ndm_manager mgr;
    ndm_module net;
} predictor;

static void pred_destroy(void *p) { free(p); }

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
    return run_request(p, p->mgr, dst, input, &rx, NULL, true, api, site);
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
