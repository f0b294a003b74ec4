/* The dynamic batcher: a bounded queue of waiting requests, one worker
 * thread that joins them into batches, one manager per batch. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../manager/object.h"
#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/serve.h"
#include "nn.h"

#define API "ndm_batcher_predict"
#define MSG_MAX 512
/* The largest estimate per row: rows * estimate never overflows. */
#define EST_MAX (UINT64_MAX / (UINT64_C(1) << 32))

/* QUEUED -> RUNNING -> DELIVERING -> DONE; RUNNING -> ABANDONED when the
 * caller's deadline passes first (the worker then frees the request). */
typedef enum rstate { R_QUEUED, R_RUNNING, R_DELIVERING, R_DONE, R_ABANDONED } rstate;

/* One request: made by its caller, who waits on `done`; the worker owns it
 * while it runs, and frees it if its caller gave up meanwhile. */
typedef struct req {
    struct req *prev, *next;   /* the queue, or a batch's list while it runs */
    /* 1 once the outcome is in (stored under mu, with release): the caller
     * reads it without mu, so that callers woken one after another do not
     * queue on the lock the worker holds while it answers the rest */
    _Atomic uint32_t done;
    rstate state;
    ndm_array input;
    ndm_manager out;
    ndm__site site;
    int64_t rows;
    uint64_t enqueued_ns;
    ndm_array answer;
    ndm_status st;
    char msg[MSG_MAX];
    /* the signature: requests of one batch share it */
    ndm_dtype dtype;
    ndm_device device;
    size_t row_bytes;          /* the input's bytes per row */
    int ndim;
    int64_t shape[];           /* the input's shape (shape[0]: its rows) */
} req;

typedef struct batcher {
    pthread_mutex_t mu;
    pthread_cond_t work;       /* the worker waits here for requests */
    _Atomic int refs;          /* the handle, the worker, each caller inside */
    ndm_predictor pred;
    ndm_manager model, mgr;
    ndm_device mdev;
    int64_t max_batch, max_queue;
    uint64_t max_delay_ns;
    uint64_t row_bytes_given, row_bytes_seen; /* admission's estimates */
    unsigned flags;
    pthread_t worker;
    bool started, closed;
    bool run_now;              /* the last batch left requests of another signature
                                  behind, or went back to the queue: no wait */
    req *head, *tail;          /* the queue, oldest first (under mu) */
    int64_t queued_rows;
    int64_t full_rows;         /* the rows that make the awaited batch full */
    ndm_batcher_stats s;       /* under mu; queue_depth is the queue's length */
} batcher;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static struct timespec abs_time(uint64_t ns)
{
    return (struct timespec){(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
}

/* A condition variable that waits on the monotonic clock. */
static bool cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return false;
    bool ok = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0 && pthread_cond_init(cv, &a) == 0;
    pthread_condattr_destroy(&a);
    return ok;
}

/* ---- lifetime ---------------------------------------------------------------------- */

static void unref(batcher *b)
{
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        pthread_cond_destroy(&b->work);
        pthread_mutex_destroy(&b->mu);
        free(b);
    }
}

static void free_req(req *r) { free(r); }

/* Wait until *w is no longer 0, or until `deadline` (CLOCK_MONOTONIC ns; 0:
 * none); a wake-up may come early, and the caller looks again. */
static void futex_wait_set(_Atomic uint32_t *w, uint64_t deadline)
{
    struct timespec ts = abs_time(deadline);
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_BITSET_PRIVATE, 0u, deadline ? &ts : NULL, NULL,
            FUTEX_BITSET_MATCH_ANY);
}

/* Wake the waiter of *w. Its caller may already have seen the store and
 * freed the request: the kernel only hashes the address, and a waiter a
 * later request puts there looks at its own word again. */
static void futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void unlink_req(batcher *b, req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        b->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        b->tail = r->prev;
    r->prev = r->next = NULL;
    b->s.queue_depth--;
    b->queued_rows -= r->rows;
}

/* Give r its outcome and wake its caller (mu held). The answer, if any,
 * is already the caller's. */
static void finish_quiet_locked(batcher *b, req *r, ndm_array answer, ndm_status st,
                                const char *msg)
{
    r->answer = answer;
    r->st = st;
    if (st < 0 && msg != r->msg)
        snprintf(r->msg, sizeof r->msg, "%s", msg && msg[0] ? msg : ndm_status_str(st));
    else if (st < 0 && !r->msg[0])
        snprintf(r->msg, sizeof r->msg, "%s", ndm_status_str(st));
    r->state = R_DONE;
    if (answer.id)
        b->s.answered++;
    else
        b->s.failed++;
    atomic_store_explicit(&r->done, 1, memory_order_release);
}

/* finish_quiet_locked(), and its caller woken. */
static void finish_locked(batcher *b, req *r, ndm_array answer, ndm_status st, const char *msg)
{
    finish_quiet_locked(b, r, answer, st, msg);
    futex_wake(&r->done); /* (r is no longer the worker's to read) */
}

/* Fail every queued request with NDM_E_CLOSED (mu held). */
static void fail_queue_locked(batcher *b, const char *why)
{
    while (b->head) {
        req *r = b->head;
        unlink_req(b, r);
        char msg[MSG_MAX];
        snprintf(msg, sizeof msg, API ": %s with the request queued", why);
        finish_locked(b, r, NDM_NULL_ARRAY, NDM_E_CLOSED, msg);
    }
}

/* The batcher's close (ndm_batcher_close or its model's): no new requests,
 * the queued ones refused, the running batch left to end, then the worker
 * joined and the batcher's manager closed. */
static void batcher_retire(void *p)
{
    batcher *b = p;
    pthread_mutex_lock(&b->mu);
    b->closed = true;
    fail_queue_locked(b, ndm__manager_gone(b->model) ? "the predictor's model was closed"
                                                       : "the batcher was closed");
    pthread_cond_broadcast(&b->work);
    bool join = b->started && !pthread_equal(pthread_self(), b->worker);
    pthread_mutex_unlock(&b->mu);
    if (join)
        pthread_join(b->worker, NULL);
    else if (b->started)
        pthread_detach(b->worker);
    (void)!ndm_manager_close(b->mgr);
}

/* The batcher's manager closed (its own close, the predictor's manager's,
 * the model's): the batcher can run nothing more, so its queue is answered
 * now and the worker leaves; the handle stays until ndm_batcher_close or
 * the model's close. Holds a reference of its own. */
static int manager_closed(void *p)
{
    batcher *b = p;
    pthread_mutex_lock(&b->mu);
    if (!b->closed)
        fail_queue_locked(b, ndm__manager_gone(b->model) ? "the predictor's model was closed"
                                                           : "the batcher's manager was closed");
    b->closed = true;
    pthread_cond_broadcast(&b->work);
    pthread_mutex_unlock(&b->mu);
    unref(b);
    return 0;
}

/* (later, once no call that looked the handle up is still inside) */
static void batcher_destroy(void *p) { unref(p); }

static const ndm__object_type batcher_type = {
    .name = "batcher",
    .ended = "closed",
    .destroy = batcher_destroy,
    .later = true,
    .retire = batcher_retire,
};

/* The live batcher behind h with a reference taken (the caller unrefs), or
 * NULL with the error recorded. */
static batcher *acquire(ndm_batcher h, const char *api, ndm__site site)
{
    NDM__OP_GUARD();
    batcher *b = ndm__object_get(h.id, &batcher_type, api, site);
    if (b)
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

/* ---- admission ----------------------------------------------------------------------- */

/* The bytes still free under every limit over the batcher's manager on the
 * model's device (UINT64_MAX when there is none). */
static uint64_t headroom(const batcher *b)
{
    uint64_t room = UINT64_MAX;
    for (ndm_manager m = b->mgr; m.id; m = ndm_manager_parent(m)) {
        uint64_t lim = ndm_manager_limit(m, b->mdev);
        ndm_stats st;
        if (!lim)
            continue;
        if (ndm_manager_stats(m, b->mdev, NDM_STATS_SUBTREE, &st) != NDM_OK)
            return 0;
        uint64_t left = lim > st.live_bytes ? lim - st.live_bytes : 0;
        if (left < room)
            room = left;
    }
    ndm_clear_error(); /* (a stale manager on the way up: the batch will say) */
    return room;
}

/* Bytes a row of r is estimated to need (mu held). */
static uint64_t row_estimate(const batcher *b, const req *r)
{
    /* given or not, what the batches were seen to need raises it */
    uint64_t first = b->row_bytes_given ? b->row_bytes_given : 2 * (uint64_t)r->row_bytes;
    uint64_t est = b->row_bytes_seen > first ? b->row_bytes_seen : first;
    return est ? est : 1;
}

static bool same_signature(const req *a, const req *r)
{
    if (a->dtype != r->dtype || !ndm_device_eq(a->device, r->device) || a->ndim != r->ndim)
        return false;
    for (int i = 1; i < a->ndim; i++)
        if (a->shape[i] != r->shape[i])
            return false;
    return true;
}

/* Take the next batch out of the queue (mu held): the oldest request and
 * the queued ones of its signature after it, up to max_batch rows and the
 * room under the limits. A request that could not fit alone is refused.
 * Returns the batch's first request (linked by next), its rows in *rows. */
static req *form_batch(batcher *b, uint64_t room, int64_t *rows, int *count)
{
    req *first = NULL, *last = NULL;
    *rows = 0;
    *count = 0;
    b->run_now = false;
    for (req *r = b->head, *next; r; r = next) {
        next = r->next;
        /* (those left behind have waited with it: no new wait for them) */
        if (first && !same_signature(first, r)) {
            b->run_now = true;
            continue;
        }
        if (*rows + r->rows > b->max_batch)
            break;
        uint64_t est = row_estimate(b, r);
        uint64_t need = (uint64_t)(*rows + r->rows) * est;
        if (need > room) {
            if (first) {
                b->s.splits++;
                break;
            }
            char msg[MSG_MAX];
            snprintf(msg, sizeof msg,
                     API ": the request's %" PRId64 " rows need about %" PRIu64
                         " bytes (%" PRIu64 " per row, estimated), more than the %" PRIu64
                         " bytes left under the limits over the batcher's manager",
                     r->rows, need, est, room == UINT64_MAX ? 0 : room);
            unlink_req(b, r);
            finish_locked(b, r, NDM_NULL_ARRAY, NDM_E_QUOTA, msg);
            continue;
        }
        unlink_req(b, r);
        r->state = R_RUNNING;
        if (last)
            last->next = r;
        else
            first = r;
        last = r;
        *rows += r->rows;
        (*count)++;
    }
    return first;
}

/* Put a batch back at the head of the queue, in its order (mu held); those
 * whose callers gave up are freed, and after a close they are refused. */
static void requeue_locked(batcher *b, req *list)
{
    req *keep[2] = {NULL, NULL}; /* head and tail of what goes back */
    for (req *r = list, *next; r; r = next) {
        next = r->next;
        r->next = r->prev = NULL;
        if (r->state == R_ABANDONED) {
            free_req(r);
            continue;
        }
        if (b->closed) {
            finish_locked(b, r, NDM_NULL_ARRAY, NDM_E_CLOSED,
                          API ": the batcher was closed with the request queued");
            continue;
        }
        r->state = R_QUEUED;
        r->prev = keep[1];
        if (keep[1])
            keep[1]->next = r;
        else
            keep[0] = r;
        keep[1] = r;
        b->s.queue_depth++;
        b->queued_rows += r->rows;
    }
    if (!keep[0])
        return;
    b->run_now = true;
    keep[1]->next = b->head;
    if (b->head)
        b->head->prev = keep[1];
    else
        b->tail = keep[1];
    b->head = keep[0];
}

/* ---- the worker ------------------------------------------------------------------------- */

/* Hand each request of list its outcome: r->answer (a fresh array in the
 * batch manager bm) moved to its caller's manager, or r->st and r->msg.
 * The moves come first, then bm closes, then the callers wake: a caller
 * finds its batch gone. A caller whose deadline passes meanwhile still
 * gets its answer (R_DELIVERING); one that gave up before is dropped. */
static void deliver_all(batcher *b, req *list, ndm_manager bm)
{
    pthread_mutex_lock(&b->mu);
    for (req *r = list; r; r = r->next) {
        if (r->state == R_ABANDONED)
            continue; /* (its answer dies with the batch) */
        if (r->answer.id && ndm_attach_at(NDM__SITE_ARGS(r->site), r->answer, r->out) < 0) {
            r->st = ndm_last_status();
            snprintf(r->msg, sizeof r->msg, "%s", ndm_last_error());
            r->answer = NDM_NULL_ARRAY;
        }
        r->state = R_DELIVERING;
    }
    pthread_mutex_unlock(&b->mu);
    if (bm.id)
        (void)!ndm_manager_close(bm);
    /* The callers wake once the lock is free: woken under it, each would
     * wait for it again to queue its next request. */
    _Atomic uint32_t *wake[64];
    int nwake = 0;
    pthread_mutex_lock(&b->mu);
    for (req *r = list, *next; r; r = next) {
        next = r->next;
        if (r->state == R_ABANDONED) {
            free_req(r);
        } else if (nwake < 64) {
            finish_quiet_locked(b, r, r->answer, r->answer.id ? NDM_OK : r->st, r->msg);
            wake[nwake++] = &r->done;
        } else {
            finish_locked(b, r, r->answer, r->answer.id ? NDM_OK : r->st, r->msg);
        }
    }
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < nwake; i++)
        futex_wake(wake[i]); /* (only the address: see futex_wake) */
}

/* Every request of list fails with st and msg (bm closed meanwhile). */
static void fail_all(batcher *b, req *list, ndm_manager bm, ndm_status st, const char *msg)
{
    for (req *r = list; r; r = r->next) {
        r->answer = NDM_NULL_ARRAY;
        r->st = st < 0 ? st : NDM_E_INTERNAL;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    deliver_all(b, list, bm);
}

static void run_batch(batcher *b, req *list, int count, int64_t rows, uint64_t room);

/* Each request of a failed batch alone, so that one bad input fails its
 * own request only. */
static void run_alone(batcher *b, req *list, uint64_t room)
{
    for (req *r = list, *next; r; r = next) {
        next = r->next;
        r->next = NULL;
        run_batch(b, r, 1, r->rows, room);
    }
}

/* One forward pass over the requests of list, in a batch manager. */
static void run_batch(batcher *b, req *list, int count, int64_t rows, uint64_t room)
{
    ndm__site site = list->site;
    char msg[MSG_MAX];
    ndm_clear_error();
    ndm_manager bm = ndm_manager_new_at(NDM__SITE_ARGS(site), b->mgr, "batch");
    if (!bm.id) {
        snprintf(msg, sizeof msg, "%s", ndm_last_error());
        fail_all(b, list, NDM_NULL_MANAGER, ndm_last_status(), msg);
        return;
    }
    /* one request: its input as it is; more: joined along the first axis */
    ndm_array x = list->input;
    if (count > 1) {
        ndm_array stack[64], *in = count <= 64 ? stack : malloc((size_t)count * sizeof *in);
        if (!in) {
            fail_all(b, list, bm, NDM_E_OOM, API ": no memory to join a batch's inputs");
            return;
        }
        int i = 0;
        for (req *r = list; r; r = r->next)
            in[i++] = r->input;
        x = ndm_concat_to_at(NDM__SITE_ARGS(site), bm, 0, count, in);
        if (in != stack)
            free(in);
    }
    uint64_t inner = 0;
    ndm_array y =
        x.id ? ndm__predict_under(b->pred, bm, bm, x, &inner, API, site) : NDM_NULL_ARRAY;
    if (!y.id) {
        ndm_status st = ndm_last_status();
        snprintf(msg, sizeof msg, "%s", ndm_last_error());
        (void)!ndm_manager_close(bm);
        bool gone = ndm__manager_gone(b->mgr);
        if ((st == NDM_E_QUOTA || st == NDM_E_OOM) && count > 1 && !gone && room != UINT64_MAX) {
            /* too big after all: above what it used (so that fewer rows
             * fit), and back in the queue */
            pthread_mutex_lock(&b->mu);
            uint64_t per = room / (uint64_t)rows + 1;
            uint64_t twice = 2 * row_estimate(b, list);
            per = per > twice ? per : twice;
            b->row_bytes_seen = per < EST_MAX ? per : EST_MAX;
            b->s.row_bytes = b->row_bytes_seen;
            b->s.splits++;
            requeue_locked(b, list);
            pthread_mutex_unlock(&b->mu);
            return;
        }
        /* (a closed input, a poisoned one, memory short without a limit
         * to plan by: each request alone says which) */
        if (count > 1 && !gone) {
            pthread_mutex_lock(&b->mu);
            b->s.isolated++;
            pthread_mutex_unlock(&b->mu);
            run_alone(b, list, room);
            return;
        }
        fail_all(b, list, NDM_NULL_MANAGER, st, msg);
        return;
    }
    /* what a row needed at most: the forward's peak and the batch's (its
     * joined input, its output, the answers), over its rows */
    int64_t at = 0;
    for (req *r = list; r; r = r->next) {
        ndm_array a = ndm_slice_to_at(NDM__SITE_ARGS(r->site), bm, y, 0, at, at + r->rows, 1);
        if (a.id && !(b->flags & NDM_BATCHER_LOAN)) {
            ndm_array c = ndm_copy_to_at(NDM__SITE_ARGS(r->site), bm, a);
            (void)!ndm_array_release(a);
            a = c;
        }
        at += r->rows;
        r->answer = a;
        r->st = a.id ? NDM_OK : ndm_last_status();
        if (!a.id)
            snprintf(r->msg, sizeof r->msg, "%s", ndm_last_error());
    }
    ndm_stats peak;
    uint64_t outer =
        ndm_manager_stats(bm, b->mdev, NDM_STATS_SUBTREE, &peak) == NDM_OK ? peak.peak_bytes : 0;
    uint64_t per = (inner + outer + (uint64_t)rows - 1) / (uint64_t)rows;
    pthread_mutex_lock(&b->mu);
    if (per > b->row_bytes_seen)
        b->row_bytes_seen = per < EST_MAX ? per : EST_MAX;
    b->s.row_bytes = b->row_bytes_given > b->row_bytes_seen ? b->row_bytes_given
                                                             : b->row_bytes_seen;
    b->s.batches++;
    b->s.rows += (uint64_t)rows;
    if ((uint64_t)rows > b->s.largest_batch)
        b->s.largest_batch = (uint64_t)rows;
    pthread_mutex_unlock(&b->mu);
    deliver_all(b, list, bm);
}

static void *worker_main(void *p)
{
    batcher *b = p;
    /* every failure here reads as the request's, at its caller's line,
     * and is logged once, when its caller's call returns it */
    NDM__ENTRY(API);
    ndm__quiet_state q;
    ndm__quiet_begin(&q);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->closed && !b->head) {
            b->run_now = false;
            pthread_cond_wait(&b->work, &b->mu);
        }
        if (b->closed)
            break;
        pthread_mutex_unlock(&b->mu);
        uint64_t room = headroom(b);
        pthread_mutex_lock(&b->mu);
        if (b->closed)
            break;
        if (!b->head)
            continue;
        /* The oldest waits up to max_delay for a full batch: max_batch
         * rows, or as many as admission lets in (none: it is refused now). */
        int64_t full = b->max_batch;
        uint64_t est = row_estimate(b, b->head);
        if (room != UINT64_MAX && room / est < (uint64_t)full)
            full = (int64_t)(room / est);
        uint64_t until = b->head->enqueued_ns + b->max_delay_ns;
        b->full_rows = full;
        while (!b->closed && b->head && !b->run_now && b->queued_rows < full &&
               now_ns() < until) {
            struct timespec ts = abs_time(until);
            pthread_cond_timedwait(&b->work, &b->mu, &ts);
        }
        b->full_rows = b->max_batch;
        if (b->closed)
            break;
        if (!b->head)
            continue;
        int64_t rows;
        int count;
        req *list = form_batch(b, room, &rows, &count);
        if (!list)
            continue;
        pthread_mutex_unlock(&b->mu);
        run_batch(b, list, count, rows, room);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    unref(b);
    ndm__quiet_end(&q);
    return NULL;
}

/* ---- the API ----------------------------------------------------------------------------- */

NDM_API ndm_batcher ndm_batcher_new_at(NDM_SITE_PARAMS, ndm_predictor p,
                                       const ndm_batcher_options *opts)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_batcher_new";
    ndm_batcher_options o = opts ? *opts : (ndm_batcher_options){0};
    if (o.max_batch < 0 || o.max_delay_us < 0 || o.max_queue < 0 || o.row_bytes < 0 ||
        (o.flags & ~(unsigned)NDM_BATCHER_LOAN)) {
        ndm__fail(NDM_E_INVALID, api, site, "%s",
                  (o.flags & ~(unsigned)NDM_BATCHER_LOAN)
                      ? "unknown batcher flags"
                      : "max_batch, max_delay_us, max_queue and row_bytes must be >= 0");
        return (ndm_batcher){0};
    }
    if (o.max_delay_us > INT64_C(3600000000) || o.max_batch > INT64_C(1) << 24 ||
        o.max_queue > INT64_C(1) << 30) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "max_delay_us %" PRId64 " (at most an hour), max_batch %" PRId64
                  " (at most 2^24) or max_queue %" PRId64 " (at most 2^30) too large",
                  o.max_delay_us, o.max_batch, o.max_queue);
        return (ndm_batcher){0};
    }
    ndm_manager model = ndm__predictor_model(p, api, site);
    ndm_manager home = model.id ? ndm_predictor_manager(p) : NDM_NULL_MANAGER;
    if (!home.id)
        return (ndm_batcher){0};
    batcher *b = ndm__calloc(1, sizeof *b, NDM__INJ_OBJECT);
    if (!b) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a batcher");
        return (ndm_batcher){0};
    }
    b->pred = p;
    b->model = model;
    b->mdev = ndm_manager_device(model);
    b->max_batch = o.max_batch ? o.max_batch : 32;
    b->max_queue = o.max_queue ? o.max_queue : 8 * b->max_batch;
    b->full_rows = b->max_batch;
    b->max_delay_ns = (uint64_t)o.max_delay_us * 1000u;
    b->row_bytes_given = (uint64_t)o.row_bytes;
    b->flags = o.flags;
    b->s.row_bytes = b->row_bytes_given;
    atomic_init(&b->refs, 1);
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        free(b);
        ndm__fail(NDM_E_INTERNAL, api, site, "no mutex for a batcher");
        return (ndm_batcher){0};
    }
    if (!cond_init(&b->work)) {
        pthread_mutex_destroy(&b->mu);
        free(b);
        ndm__fail(NDM_E_INTERNAL, api, site, "no condition variable for a batcher");
        return (ndm_batcher){0};
    }
    b->mgr = ndm_manager_new_at(NDM__SITE_ARGS(site), home, "batcher");
    bool hooked = false;
    if (b->mgr.id) {
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed); /* the hook's */
        hooked = ndm_manager_on_close_at(NDM__SITE_ARGS(site), b->mgr, manager_closed, b) ==
                 NDM_OK;
        if (!hooked)
            atomic_fetch_sub_explicit(&b->refs, 1, memory_order_relaxed);
    }
    uint64_t id = hooked ? ndm__object_new(&batcher_type, model, b, site, api) : 0;
    if (!id) {
        (void)!ndm_manager_close(b->mgr);
        unref(b);
        return (ndm_batcher){0};
    }
    /* the worker holds its own reference: it may outlive the handle a moment */
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    pthread_mutex_lock(&b->mu);
    int rc = pthread_create(&b->worker, NULL, worker_main, b);
    b->started = rc == 0;
    pthread_mutex_unlock(&b->mu);
    if (rc != 0) {
        unref(b);
        (void)ndm__object_free(id, &batcher_type, api, site);
        ndm__fail(NDM_E_INTERNAL, api, site, "no thread for the batcher (error %d)", rc);
        return (ndm_batcher){0};
    }
    return (ndm_batcher){id};
}

/* A new request for input, or NULL with the error recorded. */
static req *make_request(batcher *b, ndm_array input, ndm_manager out, const char *api,
                         ndm__site site)
{
    ndm__view v;
    if (!ndm__view_input(input, &v, api, site))
        return NULL;
    char desc[128];
    if (v.t.ndim < 1 || v.t.shape[0] < 1 || v.t.shape[0] > b->max_batch) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "the input %s must have 1 to max_batch (%" PRId64 ") rows along a first axis",
                  ndm__view_desc(&v, desc, sizeof desc), b->max_batch);
        return NULL;
    }
    /* (a caller's manager that cannot take the answer now is refused now) */
    ndm_manager dst = ndm__output_for(out, input, api, site);
    if (!dst.id || !ndm__require_manager(dst, api, site))
        return NULL;
    req *r = ndm__calloc(1, sizeof *r + (size_t)v.t.ndim * sizeof(int64_t), NDM__INJ_OBJECT);
    if (!r) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a request");
        return NULL;
    }
    r->input = input;
    r->out = dst;
    r->site = site;
    r->rows = v.t.shape[0];
    r->dtype = v.t.dtype;
    r->device = v.device;
    r->row_bytes = v.nbytes / (size_t)r->rows;
    r->ndim = v.t.ndim;
    memcpy(r->shape, v.t.shape, (size_t)v.t.ndim * sizeof(int64_t));
    return r;
}

/* Queue r and wait for its outcome or its deadline (mu held on entry,
 * released on return). Returns whether r is the caller's again: done, or
 * taken out of the queue at its deadline (false: given up while it runs,
 * the worker frees it). */
static bool queue_and_wait(batcher *b, req *r, uint64_t deadline)
{
    bool was_empty = !b->head;
    r->prev = b->tail;
    if (b->tail)
        b->tail->next = r;
    else
        b->head = r;
    b->tail = r;
    b->s.queue_depth++;
    if (b->s.queue_depth > b->s.queue_peak)
        b->s.queue_peak = b->s.queue_depth;
    b->queued_rows += r->rows;
    b->s.submitted++;
    r->enqueued_ns = now_ns();
    if (was_empty || b->queued_rows >= b->full_rows)
        pthread_cond_signal(&b->work);
    for (;;) {
        /* (mu held) */
        if (atomic_load_explicit(&r->done, memory_order_relaxed))
            break;
        /* a request whose answer is on the way waits for it */
        bool timed = deadline && r->state != R_DELIVERING;
        if (timed && now_ns() >= deadline) {
            b->s.timed_out++;
            if (r->state == R_QUEUED) {
                unlink_req(b, r);
                break;
            }
            r->state = R_ABANDONED; /* running: the worker frees it */
            pthread_mutex_unlock(&b->mu);
            return false;
        }
        pthread_mutex_unlock(&b->mu);
        futex_wait_set(&r->done, timed ? deadline : 0);
        if (atomic_load_explicit(&r->done, memory_order_acquire))
            return true;
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return true;
}

NDM_API ndm_array ndm_batcher_predict_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_batcher h,
                                            ndm_array input, int64_t timeout_us)
{
    ndm__site site = NDM__SITE;
    const char *api = API;
    uint64_t t0 = now_ns();
    batcher *b = acquire(h, api, site);
    if (!b)
        return NDM_NULL_ARRAY;
    req *r = NULL;
    if (timeout_us < 0 || timeout_us > INT64_C(86400000000))
        ndm__fail(NDM_E_INVALID, api, site,
                  "the timeout must be 0 (none) to a day in microseconds (got %" PRId64 ")",
                  timeout_us);
    else
        r = make_request(b, input, out, api, site);
    if (!r) {
        pthread_mutex_lock(&b->mu);
        b->s.refused++;
        pthread_mutex_unlock(&b->mu);
        unref(b);
        return NDM_NULL_ARRAY;
    }
    uint64_t deadline = timeout_us ? t0 + (uint64_t)timeout_us * 1000u : 0;
    pthread_mutex_lock(&b->mu);
    if (b->closed || ndm__manager_gone(b->mgr) || b->s.queue_depth >= (uint64_t)b->max_queue) {
        bool busy = !b->closed && !ndm__manager_gone(b->mgr);
        b->s.refused++;
        int64_t depth = (int64_t)b->s.queue_depth;
        pthread_mutex_unlock(&b->mu);
        free_req(r);
        unref(b);
        if (busy)
            ndm__fail(NDM_E_BUSY, api, site,
                      "the queue is full (%" PRId64 " requests waiting, max_queue %" PRId64 ")",
                      depth, b->max_queue);
        else
            ndm__fail(NDM_E_CLOSED, api, site, "the batcher or its model was closed");
        return NDM_NULL_ARRAY;
    }
    bool mine = queue_and_wait(b, r, deadline);
    ndm_array answer = NDM_NULL_ARRAY;
    ndm_status st = NDM_E_TIMEOUT;
    char msg[MSG_MAX] = "";
    /* (done: the worker's last store came before `done`, with release) */
    if (mine && atomic_load_explicit(&r->done, memory_order_acquire)) {
        answer = r->answer;
        st = r->st;
        memcpy(msg, r->msg, sizeof msg);
    }
    if (mine)
        free_req(r);
    if (!answer.id) {
        if (st == NDM_E_TIMEOUT && !msg[0])
            ndm__fail(NDM_E_TIMEOUT, api, site,
                      "no answer within its deadline of %" PRId64 " us", timeout_us);
        else
            ndm__fail(st, NULL, NDM__NO_SITE, "%s", msg);
    }
    unref(b);
    return answer;
}

NDM_API ndm_status ndm_batcher_close_at(NDM_SITE_PARAMS, ndm_batcher h)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_batcher_close";
    if (ndm__object_valid(h.id, &batcher_type)) {
        batcher *b = acquire(h, api, site);
        if (b) {
            bool self = b->started && pthread_equal(pthread_self(), b->worker);
            unref(b);
            if (self)
                return ndm__fail(NDM_E_INVALID, api, site,
                                 "the batcher's own worker cannot close it (inside a forward "
                                 "pass)");
        }
    }
    return ndm__object_free(h.id, &batcher_type, api, site);
}

NDM_API ndm_status ndm_batcher_stats_get(ndm_batcher h, ndm_batcher_stats *out)
{
    const char *api = "ndm_batcher_stats_get";
    if (!out)
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE, "out is NULL");
    batcher *b = acquire(h, api, NDM__NO_SITE);
    if (!b)
        return ndm_last_status();
    pthread_mutex_lock(&b->mu);
    *out = b->s;
    pthread_mutex_unlock(&b->mu);
    out->mean_batch = out->batches ? (double)out->rows / (double)out->batches : 0.0;
    out->in_flight = out->submitted - out->answered - out->failed - out->timed_out;
    unref(b);
    return NDM_OK;
}

NDM_API ndm_manager ndm_batcher_manager(ndm_batcher h)
{
    batcher *b = acquire(h, __func__, NDM__NO_SITE);
    if (!b)
        return NDM_NULL_MANAGER;
    ndm_manager m = b->mgr;
    unref(b);
    return m;
}
