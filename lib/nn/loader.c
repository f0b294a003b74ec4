/* The batch loader: seeded shuffling, one manager per batch under the
 * trainer, and loader state owned by the trainer. Loaders are objects of
 * the owned-object table, so a closed one is reported, never read. */
#include <inttypes.h>
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

/* Runs on ndm_loader_close and when the trainer closes (after its children,
 * the batches, are closed). */
static void loader_retire(void *p) { drop_current(p, NDM__NO_SITE); }

/* (later, once no ndm_loader_next that looked it up is running) */
static void loader_destroy(void *p)
{
    loader *ld = p;
    free(ld->order);
    free(ld->stage);
    free(ld);
}

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
        /* (when the trainer closes, the stream goes with it) */
        if (ld->copy_made)
            (void)!ndm_stream_release(ld->copy);
    }
    return ndm__object_free(h.id, &loader_type, __func__, site);
}

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
    uint64_t id = ndm__object_new(&loader_type, trainer, ld, site, api);
    if (!id) {
        free(ld->order);
        free(ld);
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

/* A batch array in manager bm: rows of src, converted; device batches are
 * gathered on the host, then uploaded. */
static ndm_array make_part(ndm__site site, const char *api, loader *ld, ndm_manager bm,
                           const ndm__tensor *src, const int64_t *rows, int64_t first,
                           int64_t count, ndm_dtype dtype, bool scale, ndm_stream compute)
{
    int64_t small[8], *shape = small;
    if (src->ndim > 8 && !(shape = malloc((size_t)src->ndim * sizeof *shape))) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        return NDM_NULL_ARRAY;
    }
    memcpy(shape, src->shape, (size_t)src->ndim * sizeof *shape);
    shape[0] = count;
    ndm__view r;
    ndm_array a = ndm__array_make(site, api, bm, NULL, dtype, src->ndim, shape, &r);
    if (shape != small)
        free(shape);
    if (!a.id)
        return a;
    ndm_status st;
    if (r.device.type == NDM_DEVICE_CPU) {
        st = gather(src, rows, first, count, r.t.data, dtype, scale, api, site);
    } else {
        st = gather_to_device(ld, &r, src, rows, first, count, dtype, scale, api, site);
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
    ndm__view xv, yv;
    if (!ndm__view_of(ld->data.inputs, &xv, api, site))
        return ndm_last_status();
    const ndm__tensor *x = &xv.t, *y = NULL;
    if (ld->data.labels.id) {
        if (!ndm__view_of(ld->data.labels, &yv, api, site))
            return ndm_last_status();
        y = &yv.t;
    }
    if ((ld->flags & NDM_LOADER_SHUFFLE) && ld->order_epoch != ld->epoch) {
        shuffle(ld->order, ld->n, ld->seed, ld->epoch);
        ld->order_epoch = ld->epoch;
    }
    /* this shard's run of its global batch (data.h); one shard: the batch */
    int64_t global = ld->batch_size * ld->shards;
    int64_t gfirst = ld->index * global;
    int64_t gcount = ld->n - gfirst < global ? ld->n - gfirst : global;
    int64_t first, count;
    if (gcount == global) {
        first = gfirst + ld->shard * ld->batch_size;
        count = ld->batch_size;
    } else {
        first = gfirst + ld->shard * gcount / ld->shards;
        count = gfirst + (ld->shard + 1) * gcount / ld->shards - first;
    }
    char name[48];
    snprintf(name, sizeof name, "batch-%" PRId64, ld->step);
    ndm_manager bm = ndm_manager_new_at(NDM__SITE_ARGS(site), ld->trainer, name);
    if (!bm.id)
        return ndm_last_status();
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
    ndm_array bx = make_part(site, api, ld, bm, x, ld->order, first, count,
                             scale ? NDM_F32 : x->dtype, scale, compute);
    ndm_array by = NDM_NULL_ARRAY;
    if (bx.id && y)
        by = make_part(site, api, ld, bm, y, ld->order, first, count,
                       ld->flags & NDM_LOADER_LABELS_I64 ? NDM_I64 : y->dtype, false, compute);
    if (compute.id)
        (void)!ndm_stream_set_current(compute); /* current a moment ago: it cannot have gone */
    if (!bx.id || (y && !by.id)) {
        ndm_status st = ndm_last_status();
        (void)!ndm_manager_close_at(NDM__SITE_ARGS(site), bm);
        return st < 0 ? st : NDM_E_INTERNAL;
    }
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
    return NDM_OK;
}

NDM_API int64_t ndm_loader_batches(ndm_loader h)
{
    loader *ld = lookup(h, __func__, NDM__NO_SITE);
    return ld ? ld->nbatches : -1;
}
