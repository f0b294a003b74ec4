/* ndm-serve's models: a checkpoint loaded into a fresh model manager, the
 * current one swapped atomically, a replaced one closed by its last request. */
#include <stdlib.h>
#include <string.h>

#include "fashion_net.h"
#include "serve.h"

static pthread_mutex_t current_lock = PTHREAD_MUTEX_INITIALIZER;
static serve_model *current;
static atomic_long retired;

/* Every open model (the current one and those replaced but still
 * answering), for the metrics. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static serve_model *open_models;

/* Reloads: one at a time, with the options main set. */
static pthread_mutex_t reload_lock = PTHREAD_MUTEX_INITIALIZER;
static const serve_options *reload_opts;
static ndm_device reload_dev;
static uint64_t generation;

static void unload(serve_model *m)
{
    pthread_mutex_lock(&open_lock);
    for (serve_model **p = &open_models; *p; p = &(*p)->next_open)
        if (*p == m) {
            *p = m->next_open;
            break;
        }
    pthread_mutex_unlock(&open_lock);
    /* the close waits for nothing: a request still inside the forward pass
     * finishes on memory the library keeps until it leaves (and closing
     * the model closes its batcher and predictor with it) */
    if (ndm_manager_close(m->model) < 0)
        fprintf(stderr, "ndm-serve: closing the model of %s: %s\n", m->path, ndm_last_error());
    free(m);
}

serve_model *serve_model_load(const serve_options *o, ndm_device dev, const char *path,
                              uint64_t gen, char *why, size_t n)
{
    serve_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(why, n, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->generation = gen;
    atomic_init(&m->refs, 1);
    m->model = ndm_manager_new_on(ndm_system(), "model", dev);
    if (!m->model.id) {
        snprintf(why, n, "cannot make the model's manager: %s", ndm_last_error());
        free(m);
        return NULL;
    }
    /* the architecture, from the file's metadata (a mapping that dies with
     * the manager that reads it) */
    ndm_manager peek = ndm_manager_new_on(m->model, "peek", NDM_CPU);
    const ndm_named_arrays *w = peek.id ? ndm_safetensors_load(peek, path, NDM_LOAD_MMAP) : NULL;
    if (!w) {
        snprintf(why, n, "cannot read %s: %s", path, ndm_last_error());
        unload(m);
        return NULL;
    }
    const char *meta = ndm_named_arrays_meta(w, "arch");
    char arch[32];
    snprintf(arch, sizeof arch, "%s", meta ? meta : "mlp");
    if (ndm_manager_close(peek) < 0 || (strcmp(arch, "mlp") && strcmp(arch, "cnn"))) {
        snprintf(why, n, "%s: unknown architecture '%s' (ndm-serve knows the Fashion mlp and cnn)",
                 path, arch);
        unload(m);
        return NULL;
    }
    m->cnn = !strcmp(arch, "cnn");
    /* built without gradient arrays, then one call reads the weights and
     * makes the predictor, which caps the model */
    ndm_rng rng = ndm_rng_new(0);
    ndm_no_grad_begin();
    ndm_module net = fashion_net(m->model, arch, &rng);
    ndm_no_grad_end();
    m->pred = net.id ? ndm_predictor_load(m->model, net, path) : (ndm_predictor){0};
    if (!m->pred.id) {
        snprintf(why, n, "%s is not a %s checkpoint of ndm-fashion train: %s", path, arch,
                 ndm_last_error());
        unload(m);
        return NULL;
    }
    if (o->batch > 0) {
        m->batcher = ndm_batcher_new(m->pred, &(ndm_batcher_options){
                                                  .max_batch = o->batch,
                                                  .max_delay_us = o->max_delay_us,
                                                  .max_queue = o->queue});
        /* a batch may use what its requests may: a request that would not
         * fit alone is refused with NDM_E_QUOTA */
        ndm_manager bm = m->batcher.id ? ndm_batcher_manager(m->batcher) : (ndm_manager){0};
        if (!bm.id || (o->request_limit > 0 &&
                       ndm_manager_set_limit(bm, dev, (uint64_t)(o->request_limit * o->batch)) < 0)) {
            snprintf(why, n, "cannot start the batcher: %s", ndm_last_error());
            unload(m);
            return NULL;
        }
    }
    pthread_mutex_lock(&open_lock);
    m->next_open = open_models;
    open_models = m;
    pthread_mutex_unlock(&open_lock);
    return m;
}

void serve_models_stats(ndm_device dev, ndm_stats *sum)
{
    *sum = (ndm_stats){0};
    pthread_mutex_lock(&open_lock);
    for (serve_model *m = open_models; m; m = m->next_open) {
        ndm_stats st;
        if (ndm_manager_stats(m->model, dev, NDM_STATS_SUBTREE, &st) == NDM_OK) {
            sum->live_arrays += st.live_arrays;
            sum->live_bytes += st.live_bytes;
        }
    }
    pthread_mutex_unlock(&open_lock);
}

serve_model *serve_model_get(void)
{
    pthread_mutex_lock(&current_lock);
    serve_model *m = current;
    if (m)
        atomic_fetch_add(&m->refs, 1);
    pthread_mutex_unlock(&current_lock);
    return m;
}

void serve_model_put(serve_model *m)
{
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        unload(m);
        atomic_fetch_sub(&retired, 1);
    }
}

void serve_model_swap(serve_model *m)
{
    pthread_mutex_lock(&current_lock);
    serve_model *old = current;
    current = m;
    pthread_mutex_unlock(&current_lock);
    if (old) {
        atomic_fetch_add(&retired, 1);
        serve_model_put(old); /* the current slot's hold */
    }
}

long serve_models_retired(void) { return atomic_load(&retired); }

void serve_reload_setup(const serve_options *o, ndm_device dev)
{
    reload_opts = o;
    reload_dev = dev;
    generation = 1;
}

int serve_reload(const char *path, char *why, size_t n)
{
    pthread_mutex_lock(&reload_lock);
    serve_model *m = serve_model_load(reload_opts, reload_dev,
                                      path ? path : reload_opts->model_path, generation + 1, why,
                                      n);
    if (m) {
        generation++;
        serve_model_swap(m);
    }
    pthread_mutex_unlock(&reload_lock);
    serve_metrics_reload(m != NULL);
    return m ? 0 : -1;
}
