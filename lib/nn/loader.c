/* The batch loader: seeded shuffling, one manager per batch under the
 * trainer, loader state owned by the trainer, and worker threads that
 * prepare batches ahead. Loaders are objects of the owned-object table, so
 * a closed one is reported, never read. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ndm/data.h"
#include "ndm/stream.h"
#include "../io/io.h"
#include "../manager/object.h"
#include "../manager/reclaim.h"

#define KNOWN_FLAGS                                                                         \
    (NDM_LOADER_SHUFFLE | NDM_LOADER_DROP_LAST | NDM_LOADER_KEEP_BATCHES |                  \
     NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64)

#define MAX_WORKERS 64
#define MAX_PREFETCH 1024

/* A batch prepared ahead. The fetch that schedules it fills in what it is
 * and makes its manager, then queues it; a worker takes it (RUNNING) and
 * leaves it READY or FAILED; the fetch that reaches it hands it out or
 * makes it again. The state and the counters below are under the loader's
 * lock; the other fields belong to whoever moved the state last. */
enum { JOB_FREE, JOB_QUEUED, JOB_RUNNING, JOB_READY, JOB_FAILED };

typedef struct job {
    int state;
    int64_t epoch, index, step;
    int64_t first, count;      /* positions in the epoch's order (rows: a copy of them) */
    int64_t *rows;             /* the batch's rows when shuffled, else NULL */
    ndm__site site;            /* the line of the fetch that scheduled it */
    ndm_manager bm;            /* "batch-<step>" */
    ndm_array bx, by;          /* a CPU trainer's batch, made by the worker */
    void *hx, *hy;             /* a device trainer's batch, gathered on the host */
    size_t hx_cap, hy_cap;
} job;

typedef struct loader {
    ndm_manager trainer;
    ndm_dataset data;
    int64_t n, batch_size, nbatches;
    int64_t shards, shard;     /* this loader's part of each global batch (data.h) */
    uint64_t seed;
    unsigned flags;
    int64_t epoch, index, step;
    int64_t *order;            /* the shuffled order of order_epoch (NULL: no shuffle) */
    int64_t order_epoch;
    ndm_manager current;       /* the batch the next fetch closes */
    void *stage;               /* pageable staging of device batches, kept between batches */
    size_t stage_cap;
    ndm_stream copy;           /* a device trainer's copy stream (owned by the trainer) */
    bool copy_made;
    bool device;               /* the trainer is not on the CPU */
    /* Workers (none when nworkers is 0). Jobs are numbered from 0 since the
     * last reset; job k is in slot k % depth. Handed out < next <= take
     * <= issued: workers take jobs in order. */
    int nworkers, started, depth;
    pthread_t *threads;
    job *jobs;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint64_t next, take, issued;
    int running;
    bool stop;
    int64_t ahead_epoch, ahead_index, ahead_step; /* the next job's batch */
} loader;

/* ---- lifetime -------------------------------------------------------------------------- */

/* Close the batch the next fetch would close. */
static void drop_current(loader *ld, ndm__site site)
{
    if (ld->current.id) {
        (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), ld->current);
        ld->current = NDM_NULL_MANAGER;
    }
}

static job *slot_of(loader *ld, uint64_t k) { return &ld->jobs[k % (uint64_t)ld->depth]; }

/* Close the managers of the jobs not handed out (a worker is done with
 * each: none runs) and start numbering again. */
static void close_prepared(loader *ld, ndm__site site)
{
    for (uint64_t k = ld->next; k < ld->issued; k++) {
        job *j = slot_of(ld, k);
        (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), j->bm);
        j->bm = NDM_NULL_MANAGER;
        j->bx = j->by = NDM_NULL_ARRAY;
        j->state = JOB_FREE;
    }
    pthread_mutex_lock(&ld->mu);
    ld->next = ld->take = ld->issued = 0;
    pthread_mutex_unlock(&ld->mu);
}

/* Forget every batch prepared ahead: no worker takes another, the running
 * ones are waited for, and their managers closed; scheduling starts again
 * at the consumer's batch. */
static void drain(loader *ld, ndm__site site)
{
    if (!ld->nworkers)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->take = ld->issued;
    while (ld->running)
        pthread_cond_wait(&ld->done, &ld->mu);
    pthread_mutex_unlock(&ld->mu);
    close_prepared(ld, site);
    ld->ahead_epoch = ld->epoch;
    ld->ahead_index = ld->index;
    ld->ahead_step = ld->step;
}

/* Stop and join the workers, then close what they prepared. */
static void workers_stop(loader *ld, ndm__site site)
{
    if (!ld->started)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_broadcast(&ld->work);
    pthread_cond_broadcast(&ld->done); /* (a fetch waiting on another thread gives up) */
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->started; i++)
        pthread_join(ld->threads[i], NULL);
    ld->started = 0;
    close_prepared(ld, site);
}

/* Runs on ndm_loader_close and when the trainer closes (after its children,
 * the batches, are closed). */
static void loader_retire(void *p)
{
    drop_current(p, NDM__NO_SITE);
    workers_stop(p, NDM__NO_SITE);
}

/* Frees a loader whose workers are joined (or were never started). */
static void loader_free(loader *ld)
{
    if (ld->jobs) {
        for (int i = 0; i < ld->depth; i++) {
            free(ld->jobs[i].rows);
            free(ld->jobs[i].hx);
            free(ld->jobs[i].hy);
        }
        free(ld->jobs);
        pthread_cond_destroy(&ld->work);
        pthread_cond_destroy(&ld->done);
        pthread_mutex_destroy(&ld->mu);
    }
    free(ld->threads);
    free(ld->order);
    free(ld->stage);
    free(ld);
}

/* (later, once no ndm_loader_next that looked it up is running) */
static void loader_destroy(void *p) { loader_free(p); }

static const ndm__object_type loader_type = {
    .name = "loader",
    .ended = "closed",
    .destroy = loader_destroy,
    .later = true,
    .retire = loader_retire,
};

static loader *lookup(ndm_loader h, const char *api, ndm__site site)
{
    return ndm__object_get(h.id, &loader_type, api, site);
}

NDM_API bool ndm_loader_valid(ndm_loader h)
{
    return ndm__object_valid(h.id, &loader_type);
}

NDM_API ndm_status ndm_loader_close_at(NDM_SITE_PARAMS, ndm_loader h)
{
    ndm__site site = NDM__SITE;
    /* The current batch dies with this call's site in its record. */
    loader *ld = ndm__object_valid(h.id, &loader_type) ? lookup(h, __func__, site) : NULL;
    if (ld) {
        drop_current(ld, site);
        workers_stop(ld, site);
        /* (when the trainer closes, the stream goes with it) */
        if (ld->copy_made)
            (void)!ndm_stream_release(ld->copy);
    }
    return ndm__object_free(h.id, &loader_type, __func__, site);
}

static ndm_status start_workers(loader *ld, int workers, int prefetch, const char *api,
                                ndm__site site);

NDM_API ndm_loader ndm_loader_new_at(NDM_SITE_PARAMS, ndm_manager trainer, ndm_dataset data,
                                     const ndm_loader_options *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    if (!opts) {
        ndm__fail(NDM_E_INVALID, api, site, "opts is NULL");
        return (ndm_loader){0};
    }
    if (opts->num_shards < 0 || opts->shard < 0 ||
        opts->shard >= (opts->num_shards > 1 ? opts->num_shards : 1)) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "shard %" PRId64 " of %" PRId64 ": the shard must be in 0 .. num_shards-1",
                  opts->shard, opts->num_shards);
        return (ndm_loader){0};
    }
    if (opts->batch_size < 1 || (opts->flags & ~(unsigned)KNOWN_FLAGS)) {
        ndm__fail(NDM_E_INVALID, api, site, "%s", opts->batch_size < 1
                                                      ? "the batch size must be at least 1"
                                                      : "unknown loader flags");
        return (ndm_loader){0};
    }
    if (opts->workers < 0 || opts->workers > MAX_WORKERS || opts->prefetch < 0 ||
        opts->prefetch > MAX_PREFETCH || (opts->prefetch && !opts->workers)) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "%d workers, prefetch %d: workers go from 0 to %d, prefetch from 0 to %d, "
                  "and prefetch needs workers",
                  opts->workers, opts->prefetch, MAX_WORKERS, MAX_PREFETCH);
        return (ndm_loader){0};
    }
    if (!ndm__require_manager(trainer, api, site))
        return (ndm_loader){0};
    ndm__view xv, yv;
    if (!ndm__view_input(data.inputs, &xv, api, site))
        return (ndm_loader){0};
    const ndm__tensor *x = &xv.t, *y = NULL;
    if (data.labels.id && !ndm__view_of(data.labels, &yv, api, site))
        return (ndm_loader){0};
    if (data.labels.id)
        y = &yv.t;
    char a[160], b[160];
    if (x->ndim < 1 || (y && (y->ndim < 1 || y->shape[0] != x->shape[0]))) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "inputs %s and labels %s: both need a first axis, of the same size",
                  ndm__view_desc(&xv, a, sizeof a), y ? ndm__view_desc(&yv, b, sizeof b) : "none");
        return (ndm_loader){0};
    }
    if (xv.device.type != NDM_DEVICE_CPU || (y && yv.device.type != NDM_DEVICE_CPU)) {
        ndm__fail(NDM_E_DEVICE, api, site, "a dataset must live on the CPU");
        return (ndm_loader){0};
    }
    if ((opts->flags & NDM_LOADER_SCALE_INPUTS) && x->dtype != NDM_U8) {
        ndm__fail(NDM_E_DTYPE, api, site,
                  "NDM_LOADER_SCALE_INPUTS scales u8 images; the inputs are %s",
                  ndm__view_desc(&xv, a, sizeof a));
        return (ndm_loader){0};
    }
    if (opts->flags & NDM_LOADER_LABELS_I64) {
        if (!y) {
            ndm__fail(NDM_E_INVALID, api, site, "NDM_LOADER_LABELS_I64 given without labels");
            return (ndm_loader){0};
        }
        if (ndm_dtype_is_float(y->dtype)) {
            ndm__fail(NDM_E_DTYPE, api, site,
                      "NDM_LOADER_LABELS_I64 converts integer labels; the labels are %s",
                      ndm__view_desc(&yv, b, sizeof b));
            return (ndm_loader){0};
        }
    }
    loader *ld = calloc(1, sizeof *ld);
    if (!ld) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a loader");
        return (ndm_loader){0};
    }
    ld->trainer = trainer;
    ld->data = data;
    ld->n = x->shape[0];
    ld->batch_size = opts->batch_size;
    ld->seed = opts->seed;
    ld->flags = opts->flags;
    ld->shards = opts->num_shards > 1 ? opts->num_shards : 1;
    ld->shard = opts->shard;
    if (ld->batch_size > INT64_MAX / ld->shards) {
        free(ld);
        ndm__fail(NDM_E_OVERFLOW, api, site, "batch size %" PRId64 " times %" PRId64 " shards",
                  opts->batch_size, opts->num_shards);
        return (ndm_loader){0};
    }
    int64_t global = ld->batch_size * ld->shards;
    ld->nbatches = ld->n / global;
    if (!(ld->flags & NDM_LOADER_DROP_LAST) && ld->n % global)
        ld->nbatches++;
    ld->order_epoch = -1;
    if ((ld->flags & NDM_LOADER_SHUFFLE) &&
        !(ld->order = malloc((size_t)(ld->n ? ld->n : 1) * sizeof *ld->order))) {
        free(ld);
        ndm__fail(NDM_E_OOM, api, site, "no memory for the order of %" PRId64 " examples",
                  x->shape[0]);
        return (ndm_loader){0};
    }
    ld->device = ndm_manager_device(trainer).type != NDM_DEVICE_CPU;
    if (opts->workers && start_workers(ld, opts->workers, opts->prefetch, api, site) < 0) {
        workers_stop(ld, site);
        loader_free(ld);
        return (ndm_loader){0};
    }
    uint64_t id = ndm__object_new(&loader_type, trainer, ld, site, api);
    if (!id) {
        workers_stop(ld, site);
        loader_free(ld);
        return (ndm_loader){0};
    }
    return (ndm_loader){id};
}

/* ---- shuffling --------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *state)
{
    *state += UINT64_C(0x9E3779B97F4A7C15);
    return mix64(*state);
}

/* The documented order of an epoch (data.h). */
static void shuffle(int64_t *order, int64_t n, uint64_t seed, int64_t epoch)
{
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    uint64_t state = seed ^ mix64((uint64_t)epoch + 1);
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t bound = (uint64_t)i + 1;
        uint64_t threshold = (0 - bound) % bound;
        uint64_t r;
        do
            r = splitmix64(&state);
        while (r < threshold);
        int64_t j = (int64_t)(r % bound);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* ---- batches ------------------------------------------------------------------------------ */

/* u8 to f32 in [0, 1]. Blocks of a fixed length let the compiler vectorise
 * at -O2, where loops of unknown length stay scalar. Dividing (rather than
 * multiplying by 1/255) gives the correctly rounded x / 255. */
static void scale_u8(float *restrict f, const uint8_t *restrict u, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            f[i + k] = (float)u[i + k] / 255.0f;
    for (; i < n; i++)
        f[i] = (float)u[i] / 255.0f;
}

/* Copy rows order[0..count) of src (a CPU array) into dst, C-ordered, as
 * dst_dtype; with `scale`, u8 becomes f32 divided by 255. */
static ndm_status gather(const ndm__tensor *src, const int64_t *rows, int64_t first,
                         int64_t count, char *dst, ndm_dtype dst_dtype, bool scale,
                         const char *api, ndm__site where)
{
    int rank = src->ndim - 1;
    const int64_t *shape = src->shape + 1, *strides = src->strides + 1;
    int64_t per_row = ndm__shape_numel(rank, shape);
    size_t sisz = ndm_dtype_size(src->dtype), disz = ndm_dtype_size(dst_dtype);
    bool contiguous = ndm__is_contiguous(rank, shape, strides);
    const char *base = src->data;
    int64_t cs_small[8], *cs = cs_small;
    if (!contiguous || (dst_dtype != src->dtype && !scale)) {
        if (rank > 8 && !(cs = malloc((size_t)rank * sizeof *cs)))
            return ndm__fail(NDM_E_OOM, api, where, "no memory for strides");
        ndm__contiguous_strides(rank, shape, cs);
    }
    ndm_status st = NDM_OK;
    for (int64_t k = 0; k < count && st == NDM_OK; k++) {
        int64_t row = rows ? rows[first + k] : first + k;
        const char *s = base + row * src->strides[0] * (int64_t)sisz;
        char *d = dst + k * per_row * (int64_t)disz;
        if (contiguous && dst_dtype == src->dtype) {
            memcpy(d, s, (size_t)per_row * sisz);
        } else if (contiguous && scale) {
            scale_u8((float *)d, (const uint8_t *)s, per_row);
        } else {
            ndm__tensor td = {d, dst_dtype, rank, shape, cs};
            ndm__tensor ts = {(void *)s, src->dtype, rank, shape, strides};
            st = ndm__host_copy(&td, &ts, api, where);
            if (st == NDM_OK && scale)
                for (int64_t i = 0; i < per_row; i++)
                    ((float *)d)[i] /= 255.0f;
        }
    }
    if (cs != cs_small)
        free(cs);
    return st;
}

/* The host buffer a device batch of `bytes` is gathered into: the loader's,
 * grown when a batch needs more, so steady-state training allocates none. */
static void *stage_buffer(loader *ld, size_t bytes, const char *api, ndm__site site)
{
    if (bytes > ld->stage_cap) {
        void *p = realloc(ld->stage, bytes);
        if (!p) {
            ndm__fail(NDM_E_OOM, api, site, "no memory to stage a batch of %zu bytes", bytes);
            return NULL;
        }
        ld->stage = p;
        ld->stage_cap = bytes;
    }
    return ld->stage;
}

/* Gather rows of src into device array r in the loader's host buffer, then
 * upload them by the one transfer path (staged through the device's pinned
 * pool), on the calling thread's current stream (the loader's copy stream,
 * see ndm_loader_next_at); it returns when the bytes have arrived. */
static ndm_status gather_to_device(loader *ld, const ndm__view *r, const ndm__tensor *src,
                                   const int64_t *rows, int64_t first, int64_t count,
                                   ndm_dtype dtype, bool scale, const char *api, ndm__site site)
{
    char *stage = stage_buffer(ld, r->nbytes ? r->nbytes : 1, api, site);
    if (!stage)
        return ndm_last_status();
    ndm_status st = gather(src, rows, first, count, stage, dtype, scale, api, site);
    if (st == NDM_OK)
        st = ndm__range_from_host(r, 0, stage, r->nbytes, api, site);
    return st;
}

/* A batch array in manager bm, uninitialised: `count` rows shaped as src's,
 * of dtype; *r is its view. */
static ndm_array alloc_part(ndm__site site, const char *api, ndm_manager bm,
                            const ndm__tensor *src, int64_t count, ndm_dtype dtype, ndm__view *r)
{
    int64_t small[8], *shape = small;
    if (src->ndim > 8 && !(shape = malloc((size_t)src->ndim * sizeof *shape))) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        return NDM_NULL_ARRAY;
    }
    memcpy(shape, src->shape, (size_t)src->ndim * sizeof *shape);
    shape[0] = count;
    ndm_array a = ndm__array_make(site, api, bm, NULL, dtype, src->ndim, shape, r);
    if (shape != small)
        free(shape);
    return a;
}

/* A batch array in manager bm: rows of src, converted; device batches are
 * gathered on the host, then uploaded, or uploaded from `pre` when a worker
 * has gathered them already. */
static ndm_array make_part(ndm__site site, const char *api, loader *ld, ndm_manager bm,
                           const ndm__tensor *src, const int64_t *rows, int64_t first,
                           int64_t count, ndm_dtype dtype, bool scale, ndm_stream compute,
                           const void *pre)
{
    ndm__view r;
    ndm_array a = alloc_part(site, api, bm, src, count, dtype, &r);
    if (!a.id)
        return a;
    ndm_status st;
    if (r.device.type == NDM_DEVICE_CPU) {
        st = gather(src, rows, first, count, r.t.data, dtype, scale, api, site);
    } else {
        st = pre ? ndm__range_from_host(&r, 0, pre, r.nbytes, api, site)
                 : gather_to_device(ld, &r, src, rows, first, count, dtype, scale, api, site);
        /* the compute stream reads it: its free waits for that work */
        if (st == NDM_OK && compute.id)
            st = ndm_array_record_stream(a, compute);
    }
    if (st < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

/* Positions [*first, *first + *count) of the epoch's order make batch
 * `index` of this shard (data.h); one shard: the batch. */
static void batch_span(const loader *ld, int64_t index, int64_t *first, int64_t *count)
{
    int64_t global = ld->batch_size * ld->shards;
    int64_t gfirst = index * global;
    int64_t gcount = ld->n - gfirst < global ? ld->n - gfirst : global;
    if (gcount == global) {
        *first = gfirst + ld->shard * ld->batch_size;
        *count = ld->batch_size;
    } else {
        *first = gfirst + ld->shard * gcount / ld->shards;
        *count = gfirst + (ld->shard + 1) * gcount / ld->shards - *first;
    }
}

static void order_for(loader *ld, int64_t epoch)
{
    if ((ld->flags & NDM_LOADER_SHUFFLE) && ld->order_epoch != epoch) {
        shuffle(ld->order, ld->n, ld->seed, epoch);
        ld->order_epoch = epoch;
    }
}

/* The dataset's views: false with the lookup's error. */
static bool data_views(loader *ld, ndm__view *xv, ndm__view *yv, const ndm__tensor **y,
                       const char *api, ndm__site site)
{
    if (!ndm__view_of(ld->data.inputs, xv, api, site))
        return false;
    *y = NULL;
    if (ld->data.labels.id) {
        if (!ndm__view_of(ld->data.labels, yv, api, site))
            return false;
        *y = &yv->t;
    }
    return true;
}

static ndm_dtype inputs_dtype(const loader *ld, const ndm__tensor *x)
{
    return ld->flags & NDM_LOADER_SCALE_INPUTS ? NDM_F32 : x->dtype;
}

static ndm_dtype labels_dtype(const loader *ld, const ndm__tensor *y)
{
    return ld->flags & NDM_LOADER_LABELS_I64 ? NDM_I64 : y->dtype;
}

/* Fill batch manager bm with the batch's arrays, from the dataset or from
 * a worker's host gathering (pre_x, pre_y; device trainers only). On
 * failure bm is closed. */
static ndm_status fill(loader *ld, ndm_manager bm, const ndm__tensor *x, const ndm__tensor *y,
                       const int64_t *rows, int64_t first, int64_t count, const void *pre_x,
                       const void *pre_y, ndm_array *bx_out, ndm_array *by_out,
                       const char *api, ndm__site site)
{
    bool scale = ld->flags & NDM_LOADER_SCALE_INPUTS;
    /* A GPU batch is allocated on, and uploaded by, the loader's copy
     * stream: the upload does not queue behind the kernels of the step
     * before, which the compute stream may still be running (the copy
     * overlaps them); the host returns once the bytes have arrived, so the
     * compute stream reads them without an event, and each array is
     * recorded on the compute stream so its memory is not reused for the
     * next batch before the compute stream is done with it. */
    ndm_device dev = ndm_manager_device(bm);
    ndm_stream compute = {0};
    if (dev.type != NDM_DEVICE_CPU) {
        ndm_status st = NDM_OK;
        if (!ld->copy.id && (st = ndm_stream_new(ld->trainer, &ld->copy)) == NDM_OK)
            ld->copy_made = true;
        compute = st == NDM_OK ? ndm_stream_current(dev) : (ndm_stream){0};
        if (st == NDM_OK && !compute.id)
            st = ndm_last_status();
        if (st == NDM_OK && (st = ndm_stream_set_current(ld->copy)) < 0)
            compute = (ndm_stream){0};
        if (st < 0) {
            (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), bm);
            return st;
        }
    }
    ndm_array bx = make_part(site, api, ld, bm, x, rows, first, count, inputs_dtype(ld, x), scale,
                             compute, pre_x);
    ndm_array by = NDM_NULL_ARRAY;
    if (bx.id && y)
        by = make_part(site, api, ld, bm, y, rows, first, count, labels_dtype(ld, y), false,
                       compute, pre_y);
    if (compute.id)
        (void)!ndm_stream_set_current(compute); /* current a moment ago: it cannot have gone */
    if (!bx.id || (y && !by.id)) {
        ndm_status st = ndm_last_status();
        (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), bm);
        return st < 0 ? st : NDM_E_INTERNAL;
    }
    *bx_out = bx;
    *by_out = by;
    return NDM_OK;
}

/* The fetch's result: batch bm of `count` examples is the current one. */
static int hand_out(loader *ld, ndm_manager bm, ndm_array bx, ndm_array by, int64_t count,
                    ndm_batch *out)
{
    out->manager = bm;
    out->inputs = bx;
    out->labels = by;
    out->size = count;
    out->epoch = ld->epoch;
    out->index = ld->index;
    out->step = ld->step;
    if (!(ld->flags & NDM_LOADER_KEEP_BATCHES))
        ld->current = bm;
    ld->index++;
    ld->step++;
    return 1;
}

/* ---- workers ------------------------------------------------------------------------------ */

/* Gather rows of src into the growing host buffer *buf, as dtype. */
static bool gather_host(void **buf, size_t *cap, const ndm__tensor *src, const int64_t *rows,
                        int64_t first, int64_t count, ndm_dtype dtype, bool scale,
                        const char *api, ndm__site site)
{
    /* (no overflow: at most 8 bytes an element, of rows the dataset holds) */
    size_t bytes = (size_t)ndm__shape_numel(src->ndim - 1, src->shape + 1) * (size_t)count *
                   ndm_dtype_size(dtype);
    if (bytes > *cap || !*buf) {
        void *p = realloc(*buf, bytes ? bytes : 1);
        if (!p) {
            ndm__fail(NDM_E_OOM, api, site, "no memory to gather a batch of %zu bytes", bytes);
            return false;
        }
        *buf = p;
        *cap = bytes;
    }
    return gather(src, rows, first, count, *buf, dtype, scale, api, site) == NDM_OK;
}

/* Fill a CPU trainer's batch array a (made by the fetch that scheduled the
 * batch) with rows of src; false when a is gone (its manager was closed
 * meanwhile: the lookup keeps its memory while this writes it). */
static bool fill_part(ndm_array a, const ndm__tensor *src, const int64_t *rows, int64_t first,
                      int64_t count, ndm_dtype dtype, bool scale, const char *api,
                      ndm__site site)
{
    ndm__view v;
    return ndm__view_of(a, &v, api, site) &&
           gather(src, rows, first, count, v.t.data, dtype, scale, api, site) == NDM_OK;
}

/* A worker's part of job j: a CPU trainer's batch arrays filled; a device
 * trainer's rows gathered on the host. */
static bool run_job(loader *ld, job *j)
{
    NDM__OP_GUARD(); /* (the dataset's memory stays while this reads it) */
    const char *api = "ndm_loader_next";
    ndm__view xv, yv;
    const ndm__tensor *y;
    if (!data_views(ld, &xv, &yv, &y, api, j->site))
        return false;
    const ndm__tensor *x = &xv.t;
    const int64_t *rows = j->rows;
    int64_t first = rows ? 0 : j->first;
    bool scale = ld->flags & NDM_LOADER_SCALE_INPUTS;
    if (ld->device)
        return gather_host(&j->hx, &j->hx_cap, x, rows, first, j->count, inputs_dtype(ld, x),
                           scale, api, j->site) &&
               (!y || gather_host(&j->hy, &j->hy_cap, y, rows, first, j->count,
                                  labels_dtype(ld, y), false, api, j->site));
    return fill_part(j->bx, x, rows, first, j->count, inputs_dtype(ld, x), scale, api,
                     j->site) &&
           (!y || fill_part(j->by, y, rows, first, j->count, labels_dtype(ld, y), false, api,
                            j->site));
}

static void *worker_main(void *arg)
{
    loader *ld = arg;
    /* Its failures are not the user's: the fetch that reaches a failed
     * batch makes it again and reports what goes wrong then. */
    ndm__quiet_state q;
    ndm__quiet_begin(&q);
    ndm__compute_pool_avoid();
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->stop && ld->take == ld->issued)
            pthread_cond_wait(&ld->work, &ld->mu);
        if (ld->stop)
            break;
        job *j = slot_of(ld, ld->take++);
        j->state = JOB_RUNNING;
        ld->running++;
        pthread_mutex_unlock(&ld->mu);
        bool ok = run_job(ld, j);
        pthread_mutex_lock(&ld->mu);
        j->state = ok ? JOB_READY : JOB_FAILED;
        ld->running--;
        pthread_cond_broadcast(&ld->done);
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

static ndm_status start_workers(loader *ld, int workers, int prefetch, const char *api,
                                ndm__site site)
{
    ld->depth = prefetch ? prefetch : 2 * workers;
    ld->jobs = calloc((size_t)ld->depth, sizeof *ld->jobs);
    ld->threads = calloc((size_t)workers, sizeof *ld->threads);
    if (!ld->jobs || !ld->threads) {
        free(ld->jobs);
        ld->jobs = NULL;
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d loader workers", workers);
    }
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->work, NULL);
    pthread_cond_init(&ld->done, NULL);
    int64_t most = ld->batch_size < ld->n ? ld->batch_size : ld->n;
    for (int i = 0; i < ld->depth; i++)
        if ((ld->flags & NDM_LOADER_SHUFFLE) &&
            !(ld->jobs[i].rows = malloc((size_t)(most ? most : 1) * sizeof(int64_t))))
            return ndm__fail(NDM_E_OOM, api, site, "no memory for the rows of %d batches ahead",
                             ld->depth);
    ld->nworkers = workers;
    for (; ld->started < workers; ld->started++) {
        int rc = pthread_create(&ld->threads[ld->started], NULL, worker_main, ld);
        if (rc != 0)
            return ndm__fail(NDM_E_OOM, api, site, "cannot start loader worker %d of %d: %s",
                             ld->started + 1, workers, strerror(rc));
    }
    return NDM_OK;
}

/* What the fetch that schedules job j makes of it (quietly): the batch's
 * manager and, for a CPU trainer, its arrays, uninitialised (a device
 * trainer's are made when the batch is handed out). False, with nothing
 * left, when one cannot be made. */
static bool make_ahead(loader *ld, job *j, ndm__site site)
{
    const char *api = "ndm_loader_next";
    char name[48];
    snprintf(name, sizeof name, "batch-%" PRId64, j->step);
    j->bm = ndm_manager_new_at(NDM__SITE_ARGS(site), ld->trainer, name);
    j->bx = j->by = NDM_NULL_ARRAY;
    if (!j->bm.id)
        return false;
    if (ld->device)
        return true;
    ndm__view xv, yv, r;
    const ndm__tensor *y;
    if (data_views(ld, &xv, &yv, &y, api, site) &&
        (j->bx = alloc_part(site, api, j->bm, &xv.t, j->count, inputs_dtype(ld, &xv.t), &r)).id &&
        (!y || (j->by = alloc_part(site, api, j->bm, y, j->count, labels_dtype(ld, y), &r)).id))
        return true;
    (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), j->bm);
    j->bm = NDM_NULL_MANAGER;
    return false;
}

/* Queue batches ahead of the consumer until `depth` are prepared or being
 * prepared. Their managers and (CPU trainers) arrays are made here, in
 * order and at the fetch's line, so the tree and its counts read the same
 * whatever the workers' timing (the workers only write the arrays' bytes);
 * a batch that cannot be made ends the scheduling quietly: the fetch that
 * reaches it makes it and reports why not. */
static void schedule(loader *ld, ndm__site site)
{
    while (ld->nbatches && ld->issued - ld->next < (uint64_t)ld->depth) {
        if (ld->ahead_index >= ld->nbatches) {
            if (ld->ahead_epoch == INT64_MAX)
                return;
            ld->ahead_epoch++;
            ld->ahead_index = 0;
        }
        job *j = slot_of(ld, ld->issued);
        j->epoch = ld->ahead_epoch;
        j->index = ld->ahead_index;
        j->step = ld->ahead_step;
        batch_span(ld, j->index, &j->first, &j->count);
        ndm__quiet_state q;
        ndm__quiet_begin(&q);
        bool made = make_ahead(ld, j, site);
        ndm__quiet_end(&q);
        if (!made)
            return;
        if (j->rows) {
            order_for(ld, j->epoch);
            memcpy(j->rows, ld->order + j->first, (size_t)j->count * sizeof *j->rows);
        }
        j->site = site;
        pthread_mutex_lock(&ld->mu);
        j->state = JOB_QUEUED;
        ld->issued++;
        pthread_cond_signal(&ld->work);
        pthread_mutex_unlock(&ld->mu);
        ld->ahead_index++;
        ld->ahead_step++;
    }
}

/* The consumer's batch from the workers: 1 when handed out; 0 when the
 * fetch must make it itself (nothing prepared, or a worker failed: the
 * pipeline is drained then); negative when the loader was closed meanwhile
 * from another thread. */
static int take_prepared(loader *ld, ndm_batch *out, const char *api, ndm__site site)
{
    schedule(ld, site);
    if (ld->next == ld->issued)
        return 0;
    job *j = slot_of(ld, ld->next);
    pthread_mutex_lock(&ld->mu);
    while (!ld->stop && (j->state == JOB_QUEUED || j->state == JOB_RUNNING))
        pthread_cond_wait(&ld->done, &ld->mu);
    int state = j->state;
    bool stopped = ld->stop;
    pthread_mutex_unlock(&ld->mu);
    if (stopped)
        return ndm__fail(NDM_E_CLOSED, api, site,
                         "the loader was closed while this fetch waited for its batch");
    if (state == JOB_READY && j->epoch == ld->epoch && j->index == ld->index &&
        j->step == ld->step) {
        ndm_array bx = j->bx, by = j->by;
        /* The dataset is looked up as the fetch without workers does: one
         * released since the batch was prepared fails this fetch (below).
         * Quiet: a failure here is made again, and reported, below. */
        ndm__quiet_state q;
        ndm__quiet_begin(&q);
        ndm__view xv, yv;
        const ndm__tensor *y;
        ndm_status st = data_views(ld, &xv, &yv, &y, api, site) ? NDM_OK : ndm_last_status();
        if (st == NDM_OK && ld->device)
            st = fill(ld, j->bm, &xv.t, y, NULL, 0, j->count, j->hx, j->hy, &bx, &by, api, site);
        ndm__quiet_end(&q);
        if (st == NDM_OK) {
            ndm_manager bm = j->bm;
            j->bm = NDM_NULL_MANAGER;
            pthread_mutex_lock(&ld->mu);
            j->state = JOB_FREE;
            ld->next++;
            pthread_mutex_unlock(&ld->mu);
            int rc = hand_out(ld, bm, bx, by, j->count, out);
            schedule(ld, site);
            return rc;
        }
    }
    /* This batch is made again here, in the state the loader without
     * workers would make it in: nothing prepared beyond it. */
    drain(ld, site);
    return 0;
}

/* Report a batch that could not be made: the failure's own message `m`
 * (recorded quietly), after the batch it was for. */
static NDM__COLD ndm_status batch_failed(loader *ld, ndm_status st, const char *m,
                                         const char *api, ndm__site site)
{
    char why[1024];
    size_t skip = strlen("ndm_loader_next: ");
    if (strncmp(m, "ndm_loader_next: ", skip) != 0)
        skip = 0;
    snprintf(why, sizeof why, "%s", m + skip);
    char *at = strstr(why, " [at ");
    for (char *p = at; p; p = strstr(p + 1, " [at "))
        at = p;
    if (at)
        *at = '\0';
    return ndm__fail(st, api, site,
                     "batch-%" PRId64 " (epoch %" PRId64 ", batch %" PRId64 ") not made: %s",
                     ld->step, ld->epoch, ld->index, why);
}

NDM_API int ndm_loader_next_at(NDM_SITE_PARAMS, ndm_loader h, ndm_batch *out)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    if (!out)
        return ndm__fail(NDM_E_INVALID, api, site, "out is NULL");
    memset(out, 0, sizeof *out);
    loader *ld = lookup(h, api, site);
    if (!ld)
        return ndm_last_status();
    /* refused before the current batch is closed: the call changes nothing */
    if (ld->index >= ld->nbatches && ld->epoch == INT64_MAX)
        return ndm__fail(NDM_E_OVERFLOW, api, site,
                         "epoch %" PRId64 " is over and is the last a loader counts", ld->epoch);
    drop_current(ld, site);
    if (ld->index >= ld->nbatches) {
        ld->epoch++;
        ld->index = 0;
        return 0;
    }
    if (ld->nworkers) {
        int rc = take_prepared(ld, out, api, site);
        if (rc != 0)
            return rc;
    }
    ndm__view xv, yv;
    const ndm__tensor *y;
    if (!data_views(ld, &xv, &yv, &y, api, site))
        return ndm_last_status();
    order_for(ld, ld->epoch);
    int64_t first, count;
    batch_span(ld, ld->index, &first, &count);
    char name[48];
    snprintf(name, sizeof name, "batch-%" PRId64, ld->step);
    ndm_manager bm = ndm_manager_new_at(NDM__SITE_ARGS(site), ld->trainer, name);
    if (!bm.id)
        return ndm_last_status();
    ndm_array bx, by;
    ndm__quiet_state q;
    ndm__quiet_begin(&q);
    ndm_status st = fill(ld, bm, &xv.t, y, ld->order, first, count, NULL, NULL, &bx, &by, api,
                         site);
    if (st < 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", ndm_last_error());
        ndm__quiet_end(&q);
        return batch_failed(ld, st, why, api, site);
    }
    ndm__quiet_end(&q);
    int rc = hand_out(ld, bm, bx, by, count, out);
    if (ld->nworkers) {
        ld->ahead_epoch = ld->epoch;
        ld->ahead_index = ld->index;
        ld->ahead_step = ld->step;
        schedule(ld, site);
    }
    return rc;
}

NDM_API ndm_status ndm_loader_keep(ndm_loader h)
{
    loader *ld = lookup(h, __func__, NDM__NO_SITE);
    if (!ld)
        return ndm_last_status();
    if (!ld->current.id)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "no current batch to keep (none fetched, or it is kept already)");
    ld->current = NDM_NULL_MANAGER;
    return NDM_OK;
}

NDM_API ndm_status ndm_loader_set_epoch(ndm_loader h, int64_t epoch)
{
    loader *ld = lookup(h, __func__, NDM__NO_SITE);
    if (!ld)
        return ndm_last_status();
    if (epoch < 0)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "epoch %" PRId64 " is negative",
                         epoch);
    drop_current(ld, NDM__NO_SITE);
    ld->epoch = epoch;
    ld->index = 0;
    drain(ld, NDM__NO_SITE); /* (the next fetch schedules the new epoch's batches) */
    return NDM_OK;
}

NDM_API int64_t ndm_loader_batches(ndm_loader h)
{
    loader *ld = lookup(h, __func__, NDM__NO_SITE);
    return ld ? ld->nbatches : -1;
}
