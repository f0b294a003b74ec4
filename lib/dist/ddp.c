/* Data-parallel training: gradients are views of communication buckets,
 * so backward accumulates straight into them; each bucket goes to the
 * communication thread as soon as backward has finished its gradients
 * (on a CUDA device: to NCCL, queued on the stream behind backward), and
 * on the CPU the step of the buckets that are in runs while the last is out. */
#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group.h"
#include "ndm/array.h"
#include "ndm/autograd.h"
#include "ndm/elementwise.h"
#include "ndm/manager.h"
#include "ndm/stream.h"
#include "ndm/view.h"
#include "../base/convert_scalar.h"
#include "../manager/object.h"
#include "../nn/nn.h"
#include "../ops/autograd.h"

#define DEFAULT_BUCKET_BYTES ((int64_t)25 << 20)

typedef struct bucket {
    ndm_array buf;     /* numel gradients, then one failure flag */
    ndm_dtype dtype;
    int first, count;  /* parameters first .. first+count-1 of the bucket order */
    int64_t numel;
    int pending;       /* its parameters whose gradient is not in yet */
    bool posted;
    ndm__dist_job job; /* its all-reduce on the communication thread */
} bucket;

typedef struct ddp {
    ndm_manager model, mgr;  /* mgr: "ddp" under model, holding the buckets */
    ndm_module net;
    ndm_optimizer opt;
    int np, nb;
    ndm_array *params;       /* in bucket order: the net's parameters reversed */
    ndm_array *grads;        /* their gradients: views of the buckets, in mgr */
    ndm_array *orig;         /* the gradient arrays they replace, given back at the close */
    int *bucket_of;
    int64_t *offset;         /* element offset in the bucket */
    bool *ready;
    bucket *b;
    /* the step per bucket (stepwise): the last bucket's failure flag goes
     * out alone just before the bucket, so that the step of the others can
     * run while the last is on the wire, once no rank failed */
    bool stepwise;
    int *oidx;               /* each parameter's index in the optimizer */
    ndm__dist_job status_job;
    bool status_out;         /* posted this step, or all-reduced in place */
    int next_post;           /* buckets are posted in order, the same on every rank */
    bool in_step;            /* backward ran, step not yet */
    ndm_status failed;       /* this rank's failure this step */
    char msg[400];
    ndm_device dev;          /* the parameters' device: the CPU or one CUDA device */
    /* CUDA: each bucket's reduced flag lands in flags[k] (f32, in mgr), so
     * that the step reads them all in one copy; `posted` is recorded on the
     * stream behind the last bucket's all-reduce */
    ndm_array flags;
    ndm_event done;
} ddp;

static ndm_status wait_cuda(ddp *d, ndm__dist_group *g, const char *api, ndm__site site);

/* dst = src's values, two arrays of the same dtype and shape on d's device. */
static void copy_values(ddp *d, ndm_array dst, ndm_array src)
{
    ndm__view v, o;
    if (!ndm__view_peek(dst, &v) || !ndm__view_peek(src, &o))
        return;
    if (d->dev.type == NDM_DEVICE_CPU)
        memcpy(v.t.data, o.t.data, o.nbytes);
    else
        (void)!ndm_copy_into(dst, src); /* queued in stream order */
}

static void ddp_destroy(void *p)
{
    ddp *d = p;
    /* buckets still out (a caller bug, dist.h): waited for; those that do
     * not come back in time stay with the group (ndm__dist_drain) */
    if (d->in_step) {
        ndm__dist_group *g = ndm__dist_group_get("ndm_ddp_close", NDM__NO_SITE);
        if (g && d->dev.type == NDM_DEVICE_CUDA)
            (void)wait_cuda(d, g, "ndm_ddp_close", NDM__NO_SITE);
        else if (g)
            (void)ndm__dist_drain(g, "ndm_ddp_close", NDM__NO_SITE);
    }
    /* the parameters that outlive the wrapper get their own gradient arrays
     * back, with the values of the views */
    for (int i = 0; d->orig && i < d->np; i++) {
        if (!d->orig[i].id || !ndm_array_valid(d->params[i]))
            continue;
        copy_values(d, d->orig[i], d->grads[i]);
        if (ndm_array_valid(d->orig[i]))
            (void)ndm__ag_set_grad(d->params[i], d->orig[i]);
    }
    /* the buckets are arrays of the model's "ddp" manager: gone with it, or
     * closed here when the wrapper goes first */
    if (d->mgr.id && ndm_manager_valid(d->mgr))
        (void)!ndm_manager_close(d->mgr);
    free(d->params);
    free(d->grads);
    free(d->orig);
    free(d->bucket_of);
    free(d->offset);
    free(d->ready);
    free(d->b);
    free(d->oidx);
    free(d);
}

static const ndm__object_type ddp_type = {
    .name = "data-parallel wrapper",
    .ended = "closed",
    .destroy = ddp_destroy,
};

static ddp *lookup(ndm_ddp h, const char *api, ndm__site site)
{
    return ndm__object_get(h.id, &ddp_type, api, site);
}

NDM_API ndm_status ndm_ddp_close(ndm_ddp h)
{
    return ndm__object_free(h.id, &ddp_type, __func__, NDM__NO_SITE);
}

NDM_API int ndm_ddp_buckets(ndm_ddp h)
{
    ddp *d = lookup(h, __func__, NDM__NO_SITE);
    return d ? d->nb : ndm_last_status();
}

/* The step per bucket, when the optimizer steps exactly the net's
 * parameters (each once) and there are buckets to overlap: else the whole
 * step after the last bucket. */
static ndm_status plan_steps(ddp *d, const char *api, ndm__site site)
{
    if (d->nb < 2 || ndm__optimizer_count(d->opt) != d->np)
        return NDM_OK;
    d->oidx = malloc((size_t)d->np * sizeof *d->oidx);
    bool *seen = calloc((size_t)d->np, sizeof *seen);
    if (!d->oidx || !seen) {
        free(seen);
        return ndm__fail(NDM_E_OOM, api, site, "no memory for the bucket plan");
    }
    bool ok = true;
    for (int i = 0; i < d->np && ok; i++) {
        int k = ndm__optimizer_find(d->opt, d->params[i]);
        ok = k >= 0 && !seen[k];
        if (ok) {
            seen[k] = true;
            d->oidx[i] = k;
        }
    }
    free(seen);
    d->stepwise = ok;
    return NDM_OK;
}

/* On a CUDA device: the array the buckets' flags are gathered in and the
 * event that marks the end of a step's all-reduces, both in "ddp". */
static ndm_status plan_cuda(ddp *d, const char *api, ndm__site site)
{
    int64_t nb = d->nb ? d->nb : 1;
    d->flags = ndm__array_make(site, api, d->mgr, NULL, NDM_F32, 1, &nb, NULL);
    if (!d->flags.id)
        return ndm_last_status();
    return ndm_event_new(d->mgr, &d->done);
}

/* Lay out the buckets: parameters in reverse order (backward finishes the
 * last layers first), a new bucket when the dtype changes or the next
 * gradient would pass the size. */
static ndm_status plan(ddp *d, int64_t cap_bytes, const char *api, ndm__site site)
{
    d->b = calloc((size_t)d->np, sizeof *d->b);
    if (!d->b)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for the bucket plan");
    int nb = 0;
    int64_t bytes = 0;
    for (int i = 0; i < d->np; i++) {
        ndm__view r;
        (void)!ndm__view_peek(d->params[i], &r); /* checked live by the caller */
        int64_t n = r.numel;
        int64_t sz = (int64_t)r.nbytes;
        bucket *cur = nb ? &d->b[nb - 1] : NULL;
        if (!cur || cur->dtype != r.t.dtype || (bytes + sz > cap_bytes && cur->count)) {
            cur = &d->b[nb++];
            cur->dtype = r.t.dtype;
            cur->first = i;
            bytes = 0;
        }
        d->bucket_of[i] = nb - 1;
        d->offset[i] = cur->numel;
        cur->numel += n;
        cur->count++;
        bytes += sz;
    }
    d->nb = nb;
    for (int k = 0; k < nb; k++) {
        if (d->b[k].numel + 1 > INT32_MAX)
            return ndm__fail(NDM_E_OVERFLOW, api, site,
                             "bucket %d holds %" PRId64 " elements: MPI counts stop at 2^31-1", k,
                             d->b[k].numel);
        int64_t len = d->b[k].numel + 1;
        d->b[k].buf = ndm__array_make(site, api, d->mgr, NULL, d->b[k].dtype, 1, &len, NULL);
        if (!d->b[k].buf.id)
            return ndm_last_status();
    }
    /* every gradient becomes a view of its place in the bucket, holding
     * what the gradient held */
    for (int i = 0; i < d->np; i++) {
        ndm__view pv;
        (void)!ndm__view_peek(d->params[i], &pv);
        const ndm__tensor *p = &pv.t;
        int64_t small[8];
        int64_t *strides = p->ndim <= 8 ? small : malloc((size_t)p->ndim * sizeof *strides);
        if (!strides)
            return ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        int64_t step = 1;
        for (int k = p->ndim - 1; k >= 0; k--) {
            strides[k] = step;
            step *= p->shape[k];
        }
        ndm_array v = ndm__array_strided_view(site, api, d->mgr, d->b[d->bucket_of[i]].buf,
                                              p->dtype, p->ndim, p->shape, strides, d->offset[i]);
        if (strides != small)
            free(strides);
        if (!v.id)
            return ndm_last_status();
        copy_values(d, v, d->grads[i]);
        d->orig[i] = ndm__ag_set_grad(d->params[i], v);
        d->grads[i] = v;
    }
    /* on a CUDA device the step waits for the stream, then steps whole */
    if (d->dev.type == NDM_DEVICE_CUDA)
        return plan_cuda(d, api, site);
    return plan_steps(d, api, site);
}

NDM_API ndm_ddp ndm_ddp_new_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net,
                               ndm_optimizer opt, const ndm_ddp_options *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    ndm__dist_group *g = ndm__dist_group_get(api, site);
    if (!g)
        return (ndm_ddp){0};
    ndm_status local = NDM_OK;
    int64_t cap = opts && opts->bucket_bytes ? opts->bucket_bytes : DEFAULT_BUCKET_BYTES;
    if (cap < 0)
        local = ndm__fail(NDM_E_INVALID, api, site, "bucket_bytes %" PRId64 " is negative", cap);
    if (local == NDM_OK)
        local = ndm__module_check_owner(net, model, api, site);
    if (local == NDM_OK && ndm__object_owner(opt.id).id != model.id)
        local = ndm_optimizer_lr(opt) < 0
                    ? ndm_last_status()
                    : ndm__fail(NDM_E_NOT_OWNER, api, site,
                                "the optimizer belongs to another manager than the model");
    int np = local == NDM_OK ? ndm_module_parameters(net, NULL, 0) : 0;
    int ns = local == NDM_OK ? ndm_module_named_state(net, NULL, NULL, 0) : 0;
    if (np < 0 || ns < 0)
        local = ndm_last_status();
    ddp *d = NULL;
    ndm_array *state = NULL;
    if (local == NDM_OK) {
        d = calloc(1, sizeof *d);
        state = malloc((size_t)(ns ? ns : 1) * sizeof *state);
        if (d) {
            size_t n = (size_t)(np ? np : 1);
            d->params = malloc(n * sizeof *d->params);
            d->grads = malloc(n * sizeof *d->grads);
            d->orig = calloc(n, sizeof *d->orig);
            d->bucket_of = malloc(n * sizeof *d->bucket_of);
            d->offset = malloc(n * sizeof *d->offset);
            d->ready = calloc(n, sizeof *d->ready);
        }
        if (!d || !state || !d->params || !d->grads || !d->orig || !d->bucket_of || !d->offset ||
            !d->ready)
            local = ndm__fail(NDM_E_OOM, api, site, "no memory for a data-parallel wrapper");
    }
    if (local == NDM_OK) {
        d->model = model;
        d->net = net;
        d->opt = opt;
        d->np = np;
        ndm_array *tmp = malloc((size_t)(np ? np : 1) * sizeof *tmp);
        if (!tmp || ndm_module_parameters(net, tmp, np) != np ||
            ndm_module_named_state(net, NULL, state, ns) != ns) {
            local = tmp ? ndm_last_status() : ndm__fail(NDM_E_OOM, api, site, "no memory");
        } else {
            /* the buckets live where the parameters do: all on one device */
            d->dev = np ? ndm_array_device(tmp[0]) : ndm_manager_device(model);
            for (int i = 0; i < np; i++) {
                d->params[i] = tmp[np - 1 - i];
                d->grads[i] = ndm__ag_grad_of(d->params[i]);
                ndm_device pd = ndm_array_device(d->params[i]);
                if ((pd.type != d->dev.type || pd.index != d->dev.index) && local == NDM_OK) {
                    char a[32], b[32];
                    ndm_device_str(d->dev, a, sizeof a);
                    ndm_device_str(pd, b, sizeof b);
                    local = ndm__fail(NDM_E_DEVICE, api, site,
                                      "parameter 0 is on %s and parameter %d on %s: the "
                                      "gradient buckets need every parameter on one device",
                                      a, np - 1 - i, b);
                }
                if (!d->grads[i].id && local == NDM_OK)
                    local = ndm__fail(NDM_E_INVALID, api, site,
                                      "parameter %d has no gradient (made without gradients?)",
                                      np - 1 - i);
            }
        }
        free(tmp);
    }
    /* on a GPU the buckets go over NCCL: a build or module without it is
     * told now, on every rank */
    if (local == NDM_OK && d->dev.type == NDM_DEVICE_CUDA && !ndm__nccl_table(api, site))
        local = ndm_last_status();
    if (local == NDM_OK) {
        d->mgr = ndm_manager_new_on_at(NDM__SITE_ARGS(site), model, "ddp", d->dev);
        if (!d->mgr.id)
            local = ndm_last_status();
        else
            local = plan(d, cap, api, site);
    }
    /* every rank has the same parameter count, and the first parameter on
     * the same kind of device, or none goes on */
    ndm__view fv;
    ndm__view *first =
        local == NDM_OK && d->np && ndm__view_peek(d->params[d->np - 1], &fv) ? &fv : NULL;
    ndm_status st = ndm__dist_agree(g, NDM__DIST_DDP_NEW, local == NDM_OK ? ns : -1, first, local,
                                    NULL, api, site);
    /* rank 0's parameters and buffers everywhere (each checks dtype and shape) */
    for (int i = 0; i < ns && st == NDM_OK; i++)
        st = ndm_broadcast_inplace_at(NDM__SITE_ARGS(site), state[i], 0);
    free(state);
    /* the communicator of the device, made now by every rank together when
     * no collective made it before */
    if (st == NDM_OK && d->dev.type == NDM_DEVICE_CUDA) {
        const ndm__backend_collective *t;
        void *comm;
        st = ndm__nccl_comm(g, d->dev.index, &t, &comm, api, site);
    }
    uint64_t id = 0;
    if (st == NDM_OK && !(id = ndm__object_new(&ddp_type, model, d, site, api)))
        st = ndm_last_status();
    if (st < 0) {
        if (d)
            ddp_destroy(d);
        return (ndm_ddp){0};
    }
    return (ndm_ddp){id};
}

/* ---- a step ------------------------------------------------------------------------------- */

static void set_flag(bucket *b, bool failed)
{
    ndm__view r;
    if (!ndm__view_peek(b->buf, &r))
        return;
    char *p = r.t.data;
    float v = failed ? 1.0f : 0.0f;
    switch (b->dtype) {
    case NDM_F16: ((uint16_t *)p)[b->numel] = ndm__f32_to_f16(v); break;
    case NDM_BF16: ((uint16_t *)p)[b->numel] = ndm__f32_to_bf16(v); break;
    case NDM_F32: ((float *)p)[b->numel] = v; break;
    case NDM_F64: ((double *)p)[b->numel] = v; break;
    default: break; /* parameters are float */
    }
}

static bool flag_set(const bucket *b)
{
    ndm__view r;
    if (!ndm__view_peek(b->buf, &r))
        return false;
    const char *p = r.t.data;
    switch (b->dtype) {
    case NDM_F16: return ndm__f16_to_f32(((const uint16_t *)p)[b->numel]) != 0;
    case NDM_BF16: return ndm__bf16_to_f32(((const uint16_t *)p)[b->numel]) != 0;
    case NDM_F32: return ((const float *)p)[b->numel] != 0;
    case NDM_F64: return ((const double *)p)[b->numel] != 0;
    default: return false;
    }
}

static void note_failure(ddp *d, ndm_status st);

/* ---- buckets on a CUDA device ------------------------------------------------------------- */

/* One element of the device array r at element offset `at`, as a kernel sees it. */
static ndm__tensor element(const ndm__view *r, int64_t at, const int64_t *one)
{
    return (ndm__tensor){(char *)r->t.data + at * (int64_t)ndm_dtype_size(r->t.dtype),
                         r->t.dtype, 1, one, one};
}

/* Queue bucket k on the calling thread's current stream, behind the
 * kernels that wrote its gradients: its flag (a one-element fill), NCCL's
 * sum over the bucket and flag, and the reduced flag's copy into flags[k].
 * No thread: NCCL runs on the device while the host queues the rest of
 * backward. Every call is queued even after a failure, so that NCCL
 * meets the same all-reduces on every rank. */
static void post_cuda(ddp *d, bucket *b)
{
    static const int64_t one[1] = {1};
    const char *api = "ndm_ddp_backward";
    ndm__dist_group *g = ndm__dist_group_get(api, NDM__NO_SITE);
    if (!g)
        return; /* broken: the step says so */
    const ndm__backend_collective *coll = ndm__collectives(NDM_DEVICE_CUDA, NULL);
    void *comm = g->nccl[d->dev.index];
    ndm__view r, f;
    if (!coll || !comm || !ndm__view_peek(b->buf, &r) || !ndm__view_peek(d->flags, &f)) {
        note_failure(d, ndm__fail(NDM_E_CLOSED, api, NDM__NO_SITE,
                                  "the bucket's communicator or arrays are gone (the process "
                                  "group finalized, or the buckets released)"));
        return;
    }
    ndm__tensor flag = element(&r, b->numel, one), slot = element(&f, b - d->b, one);
    ndm_status st = ndm__device_fill(d->dev, &flag, d->failed < 0 ? 1.0 : 0.0, api, NDM__NO_SITE);
    if (st < 0)
        note_failure(d, st);
    st = coll->all_reduce(comm, r.t.data, (size_t)(b->numel + 1), b->dtype, NDM__COLL_SUM);
    if (st < 0)
        note_failure(d, ndm__fail(st, api, NDM__NO_SITE, "%s", ndm_last_error()));
    st = ndm__device_copy(d->dev, &slot, &flag, api, NDM__NO_SITE);
    if (st < 0)
        note_failure(d, st);
}

/* After the last bucket: the point of the stream the step waits for. */
static void mark_posted_cuda(ddp *d)
{
    ndm_stream s = ndm_stream_current(d->dev);
    ndm_status st = s.id ? ndm_event_record(d->done, s) : ndm_last_status();
    if (st < 0)
        note_failure(d, st);
}

/* Wait, bounded by the group's timeout, until the stream has passed the
 * step's last all-reduce. The module has no way to cancel NCCL's work: on
 * a timeout the group breaks and keeps views of the buckets and flags, so
 * that their memory outlives whatever NCCL may still write. */
static ndm_status wait_cuda(ddp *d, ndm__dist_group *g, const char *api, ndm__site site)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spins = 0;; spins++) {
        bool done = false;
        ndm_status st = ndm_event_query(d->done, &done);
        if (st < 0)
            return ndm__fail(st, api, site, "waiting for the gradient buckets: %s",
                             ndm_last_error());
        if (done)
            return NDM_OK;
        /* NCCL is quick once every rank is there: poll often at first,
         * then offer the core */
        if (spins < 256) {
            sched_yield();
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) * 1e-9;
        if (waited > g->timeout_s)
            break;
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    for (int k = 0; k < d->nb; k++)
        ndm__dist_keep(g, &d->b[k].buf, 1);
    ndm__dist_keep(g, &d->flags, 1);
    return ndm__fail(NDM_E_TIMEOUT, api, site,
                     "rank %d waited %g s (NDM_DIST_TIMEOUT_S) for the other ranks' gradients "
                     "(NCCL): one of them is not taking part (dead, stuck, or calling "
                     "collectives in another order)",
                     g->rank, g->timeout_s);
}

/* ---- posting ------------------------------------------------------------------------------ */

/* Hand job j to the communication thread; without one (MPI_THREAD_SINGLE
 * or FUNNELED, or none could start) it runs now, from here, without
 * overlap. False when that all-reduce failed (noted as this rank's). */
static bool send(ddp *d, ndm__dist_group *g, ndm__dist_job *j)
{
    if (ndm__dist_post(g, j, "ndm_ddp_backward", NDM__NO_SITE) == NDM_OK ||
        MPI_Allreduce(MPI_IN_PLACE, j->p, j->count, j->type, j->op, g->comm) == MPI_SUCCESS)
        return true;
    note_failure(d, ndm__fail(NDM_E_IO, "ndm_ddp_backward", NDM__NO_SITE, "MPI_Allreduce failed"));
    return false;
}

static void post(ddp *d, bucket *b)
{
    if (d->dev.type == NDM_DEVICE_CUDA) {
        post_cuda(d, b);
        return;
    }
    ndm__dist_group *g = ndm__dist_group_get("ndm_ddp_backward", NDM__NO_SITE);
    /* stepwise, the last bucket's flag went out before it (post_status) */
    bool flag_out = d->stepwise && b == &d->b[d->nb - 1];
    if (!flag_out)
        set_flag(b, d->failed < 0);
    b->posted = true;
    if (!g)
        return; /* broken: the step says so */
    ndm__view r;
    b->job = (ndm__dist_job){ndm__view_peek(b->buf, &r) ? r.t.data : NULL, (int)(b->numel + !flag_out),
                             ndm__dist_mpi_type(b->dtype), ndm__dist_mpi_op(b->dtype, NDM_DIST_SUM),
                             b->buf, false, NULL, 0};
    (void)send(d, g, &b->job);
}

/* Every rank's status of the step (stepwise): the last bucket's failure
 * flag, all-reduced alone. */
static void post_status(ddp *d)
{
    ndm__dist_group *g = ndm__dist_group_get("ndm_ddp_backward", NDM__NO_SITE);
    bucket *b = &d->b[d->nb - 1];
    set_flag(b, d->failed < 0);
    if (!g)
        return; /* broken: the step says so */
    ndm__view r;
    if (!ndm__view_peek(b->buf, &r))
        return;
    char *p = (char *)r.t.data + b->numel * (int64_t)ndm_dtype_size(b->dtype);
    MPI_Datatype t = ndm__dist_mpi_type(b->dtype);
    MPI_Op op = ndm__dist_mpi_op(b->dtype, NDM_DIST_SUM);
    d->status_job = (ndm__dist_job){p, 1, t, op, b->buf, false, NULL, 0};
    d->status_out = send(d, g, &d->status_job);
}

/* Post every bucket whose gradients are all in, in order (the same order
 * on every rank). Stepwise, the last one waits for the end of backward
 * (`finishing`), behind the status: a rank may still fail before then. */
static void post_ready(ddp *d, bool finishing)
{
    while (d->next_post < d->nb && d->b[d->next_post].pending == 0) {
        if (d->stepwise && d->next_post == d->nb - 1) {
            if (!finishing)
                return;
            post_status(d);
        }
        post(d, &d->b[d->next_post++]);
    }
}

static void take(ddp *d, int i)
{
    if (d->ready[i])
        return;
    d->ready[i] = true;
    d->b[d->bucket_of[i]].pending--;
}

/* backward's report that a gradient is complete */
static void on_ready(void *ud, ndm_array grad)
{
    ddp *d = ud;
    for (int i = 0; i < d->np; i++)
        if (d->grads[i].id == grad.id) {
            take(d, i);
            post_ready(d, false);
            return;
        }
}

static void start_step(ddp *d)
{
    d->in_step = true;
    d->failed = NDM_OK;
    d->msg[0] = 0;
    d->next_post = 0;
    d->status_out = false;
    for (int i = 0; i < d->np; i++)
        d->ready[i] = false;
    for (int k = 0; k < d->nb; k++) {
        d->b[k].pending = d->b[k].count;
        d->b[k].posted = false;
    }
}

static void note_failure(ddp *d, ndm_status st)
{
    if (d->failed < 0)
        return;
    d->failed = st < 0 ? st : NDM_E_INTERNAL;
    snprintf(d->msg, sizeof d->msg, "%s", ndm_last_error());
}

/* Post what backward left unposted: parameters it did not reach keep their
 * gradients (usually zeros), as DistributedDataParallel's
 * find_unused_parameters would. */
static void finish_posting(ddp *d)
{
    for (int i = 0; i < d->np; i++)
        take(d, i);
    post_ready(d, true);
    if (d->dev.type == NDM_DEVICE_CUDA)
        mark_posted_cuda(d);
}

NDM_API ndm_status ndm_ddp_backward_at(NDM_SITE_PARAMS, ndm_ddp h, ndm_array loss)
{
    ndm__site site = NDM__SITE;
    ddp *d = lookup(h, __func__, site);
    if (!d)
        return ndm_last_status();
    if (d->in_step)
        /* refused, and nothing else: the first backward's buckets are out
         * with clean flags, the other ranks step on them, and so can this
         * one (a failure noted now would reach no other rank) */
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "backward ran twice without ndm_ddp_step between (the second did "
                         "nothing: the step takes the first one's gradients)");
    start_step(d);
    ndm_status st;
    if (!loss.id) {
        st = ndm__fail_null(__func__, site, "loss");
        note_failure(d, st);
    } else {
        /* backward from 1/size instead of 1: the buckets' sum is then the
         * ranks' mean, with no pass over the gradients after it */
        ndm__dist_group *g = ndm__dist_group_get(__func__, site);
        ndm__view lv;
        ndm__view *lr = ndm__view_peek(loss, &lv) ? &lv : NULL;
        ndm_array seed = NDM_NULL_ARRAY;
        if (g && g->size > 1 && lr)
            seed = ndm_full_at(NDM__SITE_ARGS(site), ndm_array_manager(loss), lr->t.dtype,
                               1.0 / g->size, lr->t.ndim, lr->t.shape);
        if (g && g->size > 1 && lr && !seed.id)
            st = ndm_last_status();
        else
            st = ndm__ag_backward_hooked("ndm_ddp_backward", site, loss, seed, on_ready, d);
        if (seed.id)
            (void)!ndm_array_release(seed);
        if (st < 0)
            note_failure(d, st);
    }
    finish_posting(d);
    return st;
}

static bool buckets_live(const ddp *d, int k0, int n)
{
    for (int k = k0; k < k0 + n; k++)
        if (!ndm_array_valid(d->b[k].buf))
            return false;
    return true;
}

/* The optimizer step of buckets k0 .. k0+n-1, then their gradients zeroed
 * (`start`: the step's first part). */
static ndm_status step_buckets(ddp *d, int k0, int n, bool start)
{
    int first = d->b[k0].first, count = 0;
    for (int k = k0; k < k0 + n; k++)
        count += d->b[k].count;
    ndm_status st = ndm__optimizer_step_some(d->opt, d->oidx + first, count, start);
    if (st == NDM_OK)
        st = ndm_zero_grad((size_t)count, d->params + first);
    return st;
}

/* The step's end once every bucket is in: when any rank failed, every
 * rank learns who and why and none steps (the gradients are zeroed in
 * place, which leaves the step's error in place); else the optimizer step
 * over gradients that are the buckets' views and hold the mean already. */
static ndm_status step_whole(ddp *d, ndm__dist_group *g, bool any_failed, const char *api,
                             ndm__site site)
{
    ndm_status st;
    if (any_failed || d->failed < 0) {
        st = ndm__dist_agree(g, NDM__DIST_DDP_STEP, 0, NULL, d->failed,
                             d->failed < 0 ? d->msg : NULL, api, site);
        if (st == NDM_OK) /* cannot happen: a flag was set */
            st = ndm__fail(NDM_E_INTERNAL, api, site, "a rank failed but none says so");
        (void)!ndm_optimizer_zero_grad(d->opt);
        return st;
    }
    st = ndm_optimizer_step(d->opt);
    if (st == NDM_OK)
        st = ndm_optimizer_zero_grad(d->opt);
    return st;
}

/* The step's end on a CUDA device: the wait for the stream, the flags in
 * one copy to the host, then as on the CPU. */
static ndm_status step_cuda(ddp *d, ndm__dist_group *g, const char *api, ndm__site site)
{
    ndm_status st = wait_cuda(d, g, api, site);
    d->in_step = false;
    if (st < 0)
        return st;
    if (!buckets_live(d, 0, d->nb))
        return ndm__fail(NDM_E_CLOSED, api, site, "a bucket was released");
    float small[64], *flags = d->nb <= 64 ? small : malloc((size_t)d->nb * sizeof *flags);
    if (!flags)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d flags", d->nb);
    if (d->nb)
        st = ndm_array_copy_out_at(NDM__SITE_ARGS(site), d->flags, flags,
                                   (size_t)d->nb * sizeof *flags);
    bool any_failed = false;
    for (int k = 0; k < d->nb && st == NDM_OK; k++)
        any_failed |= flags[k] != 0;
    if (flags != small)
        free(flags);
    if (st < 0)
        return st;
    return step_whole(d, g, any_failed, api, site);
}

NDM_API ndm_status ndm_ddp_step_at(NDM_SITE_PARAMS, ndm_ddp h)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    ddp *d = lookup(h, api, site);
    if (!d)
        return ndm_last_status();
    ndm__dist_group *g = ndm__dist_group_get(api, site);
    if (!g)
        return ndm_last_status();
    if (!d->in_step) {
        /* the others have posted their buckets: send ours, marked failed */
        start_step(d);
        note_failure(d, ndm__fail(NDM_E_INVALID, api, site,
                                  "ndm_ddp_step without ndm_ddp_backward before it"));
        finish_posting(d);
    }
    if (d->dev.type == NDM_DEVICE_CUDA)
        return step_cuda(d, g, api, site);
    /* bounded; on a timeout the group keeps the buckets MPI may still write */
    ndm_status st = NDM_OK, early = NDM_OK;
    bool stepped = false;
    if (d->stepwise && d->status_out && d->failed == NDM_OK) {
        /* the buckets before the last are in when the status is */
        st = ndm__dist_wait_job(g, d->status_job.seq, api, site);
        /* the flag only: the worker may be writing the rest of the bucket */
        if (st == NDM_OK && buckets_live(d, 0, d->nb) && !flag_set(&d->b[d->nb - 1])) {
            /* no rank failed: the step of these, while the last is out */
            early = step_buckets(d, 0, d->nb - 1, true);
            stepped = true;
        }
    }
    if (st == NDM_OK)
        st = ndm__dist_drain(g, api, site);
    d->in_step = false;
    if (st < 0)
        return st;
    if (stepped) {
        /* the optimizer's own failure is this rank's, as the whole step's */
        if (early < 0)
            return early;
        if (d->failed < 0) /* the last bucket's all-reduce, made here, failed */
            return ndm__fail(d->failed, api, site, "%s", d->msg);
        if (!buckets_live(d, d->nb - 1, 1))
            return ndm__fail(NDM_E_CLOSED, api, site, "a bucket was released");
        return step_buckets(d, d->nb - 1, 1, false);
    }
    if (!buckets_live(d, 0, d->nb))
        return ndm__fail(NDM_E_CLOSED, api, site, "a bucket was released");
    bool any_failed = false;
    for (int k = 0; k < d->nb; k++)
        any_failed |= flag_set(&d->b[k]);
    return step_whole(d, g, any_failed, api, site);
}
