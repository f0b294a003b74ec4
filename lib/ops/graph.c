/* Device graphs over planned managers: a step captured once on a capturing
 * stream, its memory the plan's arena, launched again as one graph. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "dispatch.h"
#include "stream_hook.h"
#include "../manager/alloc/alloc.h"
#include "../manager/plan.h"
#include "ndm/plan.h"
#include "ndm/stream.h"

#define MAX_GRAPHS 4096

typedef struct graph_rec {
    uint32_t slot, gen;
    ndm_manager step;
    ndm_device dev;
    const ndm__backend_graphs *fns;
    void *exec;
    uint64_t sig;
    int64_t nodes, launches, arena_bytes; /* launches: under table_lock */
} graph_rec;

/* One lock for the table: a launch holds it while it queues the graph, so
 * the step's close (which destroys the graph) waits for it. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static graph_rec *slots[MAX_GRAPHS];
static uint32_t gens[MAX_GRAPHS];

/* The graph of handle g, table_lock held on success; NULL with the error. */
static graph_rec *graph_lock(ndm_graph g, const char *api, ndm__site site)
{
    if (!g.id) {
        ndm__fail(NDM_E_NULL, api, site, "null graph handle");
        return NULL;
    }
    uint32_t slot = (uint32_t)g.id, gen = (uint32_t)(g.id >> 32);
    if (!slot || slot >= MAX_GRAPHS || !gen) {
        ndm__fail(NDM_E_INVALID, api, site, "not a graph handle (id 0x%016" PRIx64 ")", g.id);
        return NULL;
    }
    pthread_mutex_lock(&table_lock);
    graph_rec *r = slots[slot];
    if (r && r->gen == gen)
        return r;
    bool issued = gen <= gens[slot];
    pthread_mutex_unlock(&table_lock);
    if (issued)
        ndm__fail(NDM_E_CLOSED, api, site,
                  "the graph was closed (by ndm_graph_close or its manager's close)");
    else
        ndm__fail(NDM_E_INVALID, api, site, "not a graph handle (id 0x%016" PRIx64 ")", g.id);
    return NULL;
}

/* The step manager's close: its arrays are gone, so is the graph. */
static int graph_closed(void *ud)
{
    graph_rec *r = ud;
    pthread_mutex_lock(&table_lock);
    if (slots[r->slot] == r)
        slots[r->slot] = NULL;
    pthread_mutex_unlock(&table_lock);
    r->fns->destroy(r->dev.index, r->exec);
    free(r);
    return 0;
}

/* The calling thread's current stream on dev, as the backend names it. */
static uintptr_t current_stream(ndm_device dev)
{
    ndm_stream s = ndm_stream_current(dev);
    ndm_device d;
    uintptr_t v = 0;
    if (!s.id || ndm__stream_value(s, &d, &v) < 0)
        return 0;
    return v;
}

static void close_quietly(ndm_manager m, ndm__site site)
{
    ndm_status st = ndm_manager_close_at(NDM__SITE_ARGS(site), m);
    (void)st;
}

NDM_API ndm_graph ndm_graph_capture_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name,
                                       ndm_plan plan, uint64_t signature, ndm_step_fn fn,
                                       void *ud)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_graph_capture";
    if (!fn) {
        ndm__fail(NDM_E_INVALID, api, site, "fn is NULL");
        return NDM_NULL_GRAPH;
    }
    if (!ndm__manager_get(parent, api, site))
        return NDM_NULL_GRAPH;
    ndm_device dev = ndm_manager_device(parent);
    const ndm__backend *b = ndm__backend_for(dev.type);
    char dname[32];
    ndm_device_str(dev, dname, sizeof dname);
    if (!b || !b->graphs || !b->streams) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site,
                  "%s has no device graphs (CUDA devices do): run the step uncaptured", dname);
        return NDM_NULL_GRAPH;
    }
    int cached = ndm__plan_cached(plan, signature, dev, api, site);
    if (cached < 0)
        return NDM_NULL_GRAPH;
    if (!cached) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "no plan of signature %" PRIu64 " on %s is cached: run one step of it in "
                  "ndm_manager_new_planned first (the capture replays that step's memory)",
                  signature, dname);
        return NDM_NULL_GRAPH;
    }
    graph_rec *r = calloc(1, sizeof *r);
    if (!r) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a graph");
        return NDM_NULL_GRAPH;
    }
    ndm_manager step = ndm_manager_new_planned_at(NDM__SITE_ARGS(site), parent, name, plan,
                                                  signature);
    if (!step.id) {
        free(r);
        return NDM_NULL_GRAPH;
    }
    size_t arena = 0;
    if (ndm__plan_capture(step, true, &arena) < 0) {
        close_quietly(step, site);
        free(r);
        ndm__fail(NDM_E_UNSUPPORTED, api, site,
                  "the step of signature %" PRIu64 " cannot be captured: it got no arena "
                  "(out of memory, or a step with no memory to plan)",
                  signature);
        return NDM_NULL_GRAPH;
    }
    uintptr_t restore = current_stream(dev);
    void *cap = NULL;
    ndm_status st = b->graphs->capture_begin(dev.index, &cap);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", ndm_last_error());
        close_quietly(step, site);
        free(r);
        ndm__fail(st, api, site, "the capture could not begin: %s", why);
        return NDM_NULL_GRAPH;
    }
    ndm__alloc_set_capturing(dev, true);
    ndm_status fst = fn(step, ud);
    ndm__alloc_set_capturing(dev, false);
    (void)ndm__plan_capture(step, false, NULL);
    char why[768];
    snprintf(why, sizeof why, "%s", fst < 0 ? ndm_last_error() : "");
    void *exec = NULL;
    size_t nodes = 0;
    st = b->graphs->capture_end(dev.index, cap, (void *)restore, &exec, &nodes);
    if (fst < 0 || st < 0) {
        if (fst >= 0)
            snprintf(why, sizeof why, "%s", ndm_last_error());
        if (exec)
            b->graphs->destroy(dev.index, exec);
        close_quietly(step, site);
        free(r);
        ndm__fail(fst < 0 ? fst : st, api, site, "the step could not be captured: %s", why);
        return NDM_NULL_GRAPH;
    }
    r->step = step;
    r->dev = dev;
    r->fns = b->graphs;
    r->exec = exec;
    r->sig = signature;
    r->nodes = (int64_t)nodes;
    r->arena_bytes = (int64_t)arena;
    pthread_mutex_lock(&table_lock);
    uint32_t slot = 0;
    for (uint32_t i = 1; i < MAX_GRAPHS && !slot; i++)
        if (!slots[i] && gens[i] < UINT32_MAX)
            slot = i;
    if (slot) {
        slots[slot] = r;
        r->slot = slot;
        r->gen = ++gens[slot];
    }
    pthread_mutex_unlock(&table_lock);
    if (!slot) {
        b->graphs->destroy(dev.index, exec);
        close_quietly(step, site);
        free(r);
        ndm__fail(NDM_E_OOM, api, site, "%d graphs are open already", MAX_GRAPHS - 1);
        return NDM_NULL_GRAPH;
    }
    ndm_graph g = {(uint64_t)r->gen << 32 | slot};
    if (ndm_manager_on_close_at(NDM__SITE_ARGS(site), step, graph_closed, r) < 0) {
        pthread_mutex_lock(&table_lock);
        slots[slot] = NULL;
        pthread_mutex_unlock(&table_lock);
        b->graphs->destroy(dev.index, exec);
        close_quietly(step, site);
        free(r);
        return NDM_NULL_GRAPH;
    }
    return g;
}

NDM_API ndm_status ndm_graph_launch_at(NDM_SITE_PARAMS, ndm_graph g)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    graph_rec *r = graph_lock(g, "ndm_graph_launch", site);
    if (!r)
        return ndm_last_status();
    uintptr_t stream = current_stream(r->dev);
    ndm_status st = r->fns->launch(r->dev.index, r->exec, (void *)stream);
    if (st == NDM_OK)
        st = ndm__plan_arena_record_stream(r->step, stream);
    if (st == NDM_OK)
        r->launches++;
    pthread_mutex_unlock(&table_lock);
    if (st < 0) {
        char why[768];
        snprintf(why, sizeof why, "%s", ndm_last_error());
        return ndm__fail(st, "ndm_graph_launch", site, "%s", why);
    }
    return NDM_OK;
}

NDM_API ndm_status ndm_graph_close_at(NDM_SITE_PARAMS, ndm_graph g)
{
    ndm__site site = NDM__SITE;
    uint32_t slot = (uint32_t)g.id, gen = (uint32_t)(g.id >> 32);
    if (!g.id)
        return ndm__fail(NDM_E_NULL, "ndm_graph_close", site, "null graph handle");
    if (!slot || slot >= MAX_GRAPHS || !gen)
        return ndm__fail(NDM_E_INVALID, "ndm_graph_close", site,
                         "not a graph handle (id 0x%016" PRIx64 ")", g.id);
    pthread_mutex_lock(&table_lock);
    graph_rec *r = slots[slot];
    bool live = r && r->gen == gen, issued = gen <= gens[slot];
    ndm_manager step = live ? r->step : NDM_NULL_MANAGER;
    pthread_mutex_unlock(&table_lock);
    if (!live) {
        if (issued)
            return NDM_ALREADY;
        return ndm__fail(NDM_E_INVALID, "ndm_graph_close", site,
                         "not a graph handle (id 0x%016" PRIx64 ")", g.id);
    }
    ndm_status st = ndm_manager_close_at(NDM__SITE_ARGS(site), step);
    return st == NDM_ALREADY ? NDM_OK : st;
}

NDM_API ndm_manager ndm_graph_manager(ndm_graph g)
{
    graph_rec *r = graph_lock(g, "ndm_graph_manager", NDM__NO_SITE);
    if (!r)
        return NDM_NULL_MANAGER;
    ndm_manager m = r->step;
    pthread_mutex_unlock(&table_lock);
    return m;
}

NDM_API ndm_status ndm_graph_get_info_at(NDM_SITE_PARAMS, ndm_graph g, ndm_graph_info *out)
{
    ndm__site site = NDM__SITE;
    if (!out)
        return ndm__fail(NDM_E_INVALID, "ndm_graph_get_info", site, "out is NULL");
    graph_rec *r = graph_lock(g, "ndm_graph_get_info", site);
    if (!r)
        return ndm_last_status();
    *out = (ndm_graph_info){r->sig, r->nodes, r->launches, r->arena_bytes};
    pthread_mutex_unlock(&table_lock);
    return NDM_OK;
}
