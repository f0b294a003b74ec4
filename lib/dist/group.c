/* The process group over MPI and the collectives on arrays: every call
 * agrees on what it does across ranks first (a small bounded exchange),
 * then moves the data with MPI's tuned blocking collectives. */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "group.h"
#include "ndm/array.h"
#include "ndm/elementwise.h"
#include "ndm/manager.h"
#include "ndm/view.h"
#include "../base/convert_scalar.h"
#include "../ops/inner.h"

static ndm__dist_group group;
static bool joined;

/* ---- the group ---------------------------------------------------------------------- */

NDM_API bool ndm_dist_available(void) { return true; }

ndm__dist_group *ndm__dist_group_get(const char *api, ndm__site site)
{
    if (!joined) {
        ndm__fail(NDM_E_INVALID, api, site, "not part of a process group: call ndm_dist_init first");
        return NULL;
    }
    if (group.broken) {
        ndm__fail(NDM_E_TIMEOUT, api, site,
                  "the process group is broken: an earlier collective timed out after %g s",
                  group.timeout_s);
        return NULL;
    }
    return &group;
}

static ndm_status timeout_from_env(double *out)
{
    const char *s = getenv("NDM_DIST_TIMEOUT_S");
    *out = 300.0;
    if (!s || !*s)
        return NDM_OK;
    char *end;
    double v = strtod(s, &end);
    if (*end || !(v > 0) || !isfinite(v))
        return ndm__fail(NDM_E_CONFIG, "ndm_dist_init", NDM__NO_SITE,
                         "NDM_DIST_TIMEOUT_S=\"%s\": want a number of seconds > 0", s);
    *out = v;
    return NDM_OK;
}

NDM_API ndm_status ndm_dist_init(void)
{
    if (joined)
        return NDM_ALREADY;
    double timeout;
    ndm_status st = timeout_from_env(&timeout);
    if (st < 0)
        return st;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    memset(&group, 0, sizeof group);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return ndm__fail(NDM_E_IO, __func__, NDM__NO_SITE, "MPI_Init_thread failed");
        group.we_initialised = true;
    }
    /* a program that initialised MPI may have asked for less: the
     * communication thread then stays off */
    MPI_Query_thread(&provided);
    group.threads_ok = provided >= MPI_THREAD_SERIALIZED;
    /* our own communicator: the program's MPI traffic cannot match ours */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &group.comm) != MPI_SUCCESS)
        return ndm__fail(NDM_E_IO, __func__, NDM__NO_SITE, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(group.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(group.comm, &group.rank);
    MPI_Comm_size(group.comm, &group.size);
    MPI_Comm local;
    if (MPI_Comm_split_type(group.comm, MPI_COMM_TYPE_SHARED, group.rank, MPI_INFO_NULL, &local) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(local, &group.local_rank);
        MPI_Comm_size(local, &group.local_size);
        MPI_Comm_free(&local);
    } else {
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        group.local_rank = lr ? atoi(lr) : 0;
        group.local_size = ls ? atoi(ls) : 1;
    }
    if (group.local_size < 1)
        group.local_size = 1;
    group.timeout_s = timeout;
    pthread_mutex_init(&group.mu, NULL);
    pthread_cond_init(&group.work, NULL);
    pthread_cond_init(&group.idle, NULL);
    joined = true;
    return NDM_OK;
}

NDM_API ndm_status ndm_dist_finalize(void)
{
    if (!joined)
        return NDM_ALREADY;
    if (group.worker) {
        /* its jobs first (no other thread may be in MPI meanwhile): after
         * a timeout the late ranks get ten timeouts to come */
        double t = group.timeout_s;
        group.timeout_s = group.broken ? 10 * t : t;
        ndm_status st = ndm__dist_drain(&group, __func__, NDM__NO_SITE);
        group.timeout_s = t;
        if (st == NDM_E_TIMEOUT)
            return ndm__fail(NDM_E_TIMEOUT, __func__, NDM__NO_SITE,
                             "the communication thread is still inside MPI after %g s: MPI is "
                             "left unfinalized", group.broken ? 10 * t : t);
        pthread_mutex_lock(&group.mu);
        group.stop = true;
        pthread_cond_signal(&group.work);
        pthread_mutex_unlock(&group.mu);
        pthread_join(group.thread, NULL);
        group.worker = false;
    }
    if (group.broken) {
        /* the abandoned operations may finish once the late ranks come:
         * they get ten timeouts to do so */
        double deadline = MPI_Wtime() + 10 * group.timeout_s;
        int done = 0;
        while (!done && MPI_Wtime() < deadline) {
            MPI_Testall(group.nabandoned, group.abandoned, &done, MPI_STATUSES_IGNORE);
            if (!done)
                sched_yield();
        }
        if (!done)
            return ndm__fail(NDM_E_TIMEOUT, __func__, NDM__NO_SITE,
                             "%d abandoned operation(s) did not finish in %g s: MPI is left "
                             "unfinalized", group.nabandoned, 10 * group.timeout_s);
        free(group.abandoned);
        group.abandoned = NULL;
        for (int i = 0; i < group.nkept; i++)
            free(group.kept[i]);
        free(group.kept);
        group.kept = NULL;
        if (group.keep.id)
            (void)!ndm_manager_close(group.keep);
        group.broken = false;
    }
    ndm__nccl_free_all(&group);
    free(group.recs);
    group.recs = NULL;
    pthread_cond_destroy(&group.idle);
    pthread_cond_destroy(&group.work);
    pthread_mutex_destroy(&group.mu);
    MPI_Comm_free(&group.comm);
    joined = false;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (group.we_initialised && !finalized)
        MPI_Finalize();
    return NDM_OK;
}

NDM_API int ndm_dist_rank(void) { return joined ? group.rank : 0; }
NDM_API int ndm_dist_size(void) { return joined ? group.size : 1; }
NDM_API int ndm_dist_local_rank(void) { return joined ? group.local_rank : 0; }

NDM_API ndm_status ndm_dist_set_timeout(double seconds)
{
    if (!(seconds > 0) || !isfinite(seconds))
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "timeout %g: want a number of seconds > 0", seconds);
    if (!joined)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "not part of a process group: call ndm_dist_init first");
    group.timeout_s = seconds;
    return NDM_OK;
}

/* ---- bounded waits ---------------------------------------------------------------------- */

void ndm__dist_keep(ndm__dist_group *g, const ndm_array *keep, int nkeep)
{
    if (nkeep && !g->keep.id)
        g->keep = ndm_manager_new(ndm_system(), "dist");
    for (int i = 0; i < nkeep && g->keep.id; i++)
        (void)ndm_alias_to(g->keep, keep[i]);
    g->broken = true;
}

/* Break the group, keeping n requests MPI may still complete and a view of
 * each of the nkeep arrays they may still read or write. */
static void abandon(ndm__dist_group *g, MPI_Request *reqs, int n, const ndm_array *keep,
                    int nkeep)
{
    MPI_Request *kept = realloc(g->abandoned, (size_t)(g->nabandoned + n) * sizeof *kept);
    if (kept) {
        memcpy(kept + g->nabandoned, reqs, (size_t)n * sizeof *reqs);
        g->abandoned = kept;
        g->nabandoned += n;
    }
    ndm__dist_keep(g, keep, nkeep);
}

ndm_status ndm__dist_wait(ndm__dist_group *g, MPI_Request *reqs, int n, const ndm_array *keep,
                          int nkeep, const char *api, ndm__site site)
{
    double deadline = 0;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return ndm__fail(NDM_E_IO, api, site, "MPI_Testall failed");
        if (done)
            return NDM_OK;
        /* OpenMPI's nonblocking collectives advance inside MPI_Test; the
         * clock is read, and the core offered to others, once in a while */
        if ((spins & 63) != 63)
            continue;
        double now = MPI_Wtime();
        if (!deadline)
            deadline = now + g->timeout_s;
        else if (now > deadline)
            break;
        sched_yield();
    }
    abandon(g, reqs, n, keep, nkeep);
    return ndm__fail(NDM_E_TIMEOUT, api, site,
                     "rank %d waited %g s (NDM_DIST_TIMEOUT_S) for the other ranks: one of them "
                     "is not taking part (dead, stuck, or calling collectives in another order)",
                     g->rank, g->timeout_s);
}

/* ---- the worker thread ------------------------------------------------------------------ */

/* Data-parallel buckets go through one thread that calls the blocking
 * MPI_Allreduce, as PyTorch's ProcessGroupMPI and Horovod do: OpenMPI moves
 * a nonblocking collective only inside MPI calls, so nothing would move
 * while backward computes; a thread in the blocking call moves it all the
 * time, with OpenMPI's tuned algorithms. */
#define TAG_READY 4000

/* Set while the main thread waits in ndm__dist_drain: backward is over,
 * and the core is the worker's. */
static atomic_bool draining;

/* Return once every rank's worker has come to this job (a dissemination
 * barrier of empty messages), sleeping between polls while backward runs:
 * MPI's blocking collectives spin while they wait for a late rank, on a
 * core that this rank's backward wants. Once the main thread only waits,
 * a sleep would only add a wake-up to every bucket left: the worker then
 * offers the core (sched_yield) instead. The main thread bounds the wait,
 * not this. */
static void worker_ready(ndm__dist_group *g)
{
    for (int k = 0, dist = 1; dist < g->size; k++, dist *= 2) {
        MPI_Request req[2];
        char none = 0;
        MPI_Irecv(NULL, 0, MPI_BYTE, (g->rank - dist + g->size) % g->size, TAG_READY + k, g->comm,
                  &req[0]);
        MPI_Isend(&none, 0, MPI_BYTE, (g->rank + dist) % g->size, TAG_READY + k, g->comm, &req[1]);
        for (int done = 0;;) {
            if (MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || done)
                break;
            if (atomic_load_explicit(&draining, memory_order_relaxed))
                sched_yield();
            else
                nanosleep(&(struct timespec){0, 20000}, NULL);
        }
    }
}

static void *worker_main(void *arg)
{
    ndm__dist_group *g = arg;
#ifdef PR_SET_TIMERSLACK
    /* the ready barrier's 20 us sleeps last 80 us under Linux's default
     * 50 us slack; about 30 us without */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && (!g->head || (g->defer && g->head->seq > g->want)))
            pthread_cond_wait(&g->work, &g->mu);
        if (!g->head)
            break;
        ndm__dist_job *j = g->head;
        g->head = j->next;
        if (!g->head)
            g->tail = NULL;
        g->current = j;
        void *p = j->p;
        int count = j->count;
        MPI_Datatype type = j->type;
        MPI_Op op = j->op;
        bool owned = j->owned;
        pthread_mutex_unlock(&g->mu);
        /* the caller's j is not read again: after a timeout it may be gone */
        worker_ready(g);
        int rc = MPI_Allreduce(MPI_IN_PLACE, p, count, type, op, g->comm);
        if (owned)
            free(j);
        pthread_mutex_lock(&g->mu);
        g->current = NULL;
        if (rc != MPI_SUCCESS && !g->failed_rc)
            g->failed_rc = rc;
        g->done++;
        /* the waiter, once the job it waits for is done (not every job:
         * each wake-up takes the core from the next job) */
        if (g->want && g->done >= g->want)
            pthread_cond_signal(&g->idle);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Is there a core for the worker besides the compute threads? The cores
 * this process may run on, shared by the node's ranks when unbound (a mask
 * of every online core), against the pool's threads plus the worker. */
static bool spare_core(const ndm__dist_group *g)
{
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return true;
    long cores = CPU_COUNT(&set), online = sysconf(_SC_NPROCESSORS_ONLN);
    long want = ndm__compute_threads() + 1L;
    if (cores >= online)
        want *= g->local_size;
    return cores >= want;
#else
    (void)g;
    return true;
#endif
}

ndm_status ndm__dist_post(ndm__dist_group *g, ndm__dist_job *j, const char *api, ndm__site site)
{
    if (!g->worker) {
        if (!g->threads_ok)
            return NDM_E_UNSUPPORTED;
        /* Without a core of its own the worker would take turns with
         * backward on its core: OpenMPI's all-reduce spins while it waits
         * for a peer that is itself computing, and the step pays for the
         * spinning on top of the all-reduce. It then runs the jobs only
         * while this thread waits for them. */
        g->defer = !spare_core(g);
        g->want = 0;
        if (pthread_create(&g->thread, NULL, worker_main, g))
            return ndm__fail(NDM_E_OOM, api, site, "cannot start the communication thread");
        g->worker = true;
    }
    j->next = NULL;
    pthread_mutex_lock(&g->mu);
    if (g->tail)
        g->tail->next = j;
    else
        g->head = j;
    g->tail = j;
    j->seq = ++g->posted;
    pthread_cond_signal(&g->work);
    pthread_mutex_unlock(&g->mu);
    return NDM_OK;
}

ndm_status ndm__dist_wait_job(ndm__dist_group *g, uint64_t seq, const char *api, ndm__site site)
{
    if (!g->worker)
        return NDM_OK;
    pthread_mutex_lock(&g->mu);
    if (g->done < seq) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        double s = floor(g->timeout_s);
        dl.tv_sec += (time_t)s;
        dl.tv_nsec += (long)((g->timeout_s - s) * 1e9);
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        g->want = seq;
        pthread_cond_signal(&g->work);
        atomic_store_explicit(&draining, true, memory_order_relaxed);
        while (g->done < seq && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&g->idle, &g->mu, &dl);
        atomic_store_explicit(&draining, false, memory_order_relaxed);
        g->want = 0;
    }
    bool late = g->done < seq;
    /* broken: the jobs left run whenever their ranks come, not only
     * while this thread waits */
    if (late && g->defer) {
        g->defer = false;
        pthread_cond_signal(&g->work);
    }
    /* after a timeout: the arrays the worker may still write, kept below */
    int nkeep = 0;
    ndm_array *keep = NULL;
    if (late && !g->broken) { /* once: a later drain finds copies and views made */
        int n = g->current ? 1 : 0;
        for (ndm__dist_job *j = g->head; j; j = j->next)
            n++;
        keep = malloc((size_t)n * sizeof *keep);
        if (g->current && keep)
            keep[nkeep++] = g->current->buf;
        /* the jobs not started run still (late ranks meet them), from
         * copies of the group's own: the caller's may be gone by then */
        ndm__dist_job **link = &g->head;
        g->tail = NULL;
        while (*link) {
            ndm__dist_job *j = *link, *c = j->owned ? j : malloc(sizeof *c);
            if (!c) { /* dropped: no memory to keep it */
                *link = j->next;
                g->posted--;
                continue;
            }
            if (c != j) {
                *c = *j;
                c->owned = true;
            }
            *link = c;
            if (keep)
                keep[nkeep++] = c->buf;
            g->tail = c;
            link = &c->next;
        }
    }
    int failed = g->failed_rc;
    g->failed_rc = 0;
    pthread_mutex_unlock(&g->mu);
    if (late) {
        ndm__dist_keep(g, keep, nkeep);
        free(keep);
        return ndm__fail(NDM_E_TIMEOUT, api, site,
                         "rank %d waited %g s (NDM_DIST_TIMEOUT_S) for the other ranks' "
                         "gradients: one of them is not taking part (dead, stuck, or calling "
                         "collectives in another order)",
                         g->rank, g->timeout_s);
    }
    if (failed)
        return ndm__fail(NDM_E_IO, api, site, "MPI_Allreduce failed (MPI error %d)", failed);
    return NDM_OK;
}

ndm_status ndm__dist_drain(ndm__dist_group *g, const char *api, ndm__site site)
{
    return ndm__dist_wait_job(g, g->posted, api, site);
}

/* ---- agreement ------------------------------------------------------------------------------ */

#define REC_DIMS 8
#define REC_MSG 400

/* What every rank tells the others about a collective: small and of fixed
 * size, so that agreeing costs about one short message per round. The
 * ranks' messages go in a second exchange, only when one of them failed. */
typedef struct rec {
    int32_t status, kind, dtype, ndim;
    int32_t dev_type, dev_index, has_array;
    int32_t carried;     /* bytes of data sent with the record to every other rank */
    int64_t arg, numel;
    uint64_t shape_hash; /* every dimension, also those past REC_DIMS */
    int64_t shape[REC_DIMS];
} rec;

static const char *kind_name(int k)
{
    static const char *names[] = {"?", "ndm_dist_check", "ndm_all_reduce_", "ndm_broadcast_",
                                  "ndm_all_gather_to", "ndm_reduce_scatter_to",
                                  "ndm_dist_debug_dump", "ndm_dist_leak_report", "ndm_ddp_new",
                                  "ndm_ddp_step"};
    return k > 0 && k < (int)(sizeof names / sizeof *names) ? names[k] : names[0];
}

static void shape_str(const rec *r, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "%s [", ndm_dtype_name((ndm_dtype)r->dtype));
    for (int i = 0; i < r->ndim && i < REC_DIMS && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %" PRId64 : "%" PRId64, r->shape[i]);
    /* the record holds the first dimensions only */
    if (r->ndim > REC_DIMS && o < n)
        o += (size_t)snprintf(buf + o, n - o, ", ... (%d dims, %" PRId64 " elements)", r->ndim,
                              r->numel);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

/* Keep a block MPI may still read or write after a timeout, until the finalize. */
static void keep_block(ndm__dist_group *g, void *p)
{
    void **k = realloc(g->kept, (size_t)(g->nkept + 1) * sizeof *k);
    if (k) {
        k[g->nkept++] = p;
        g->kept = k;
    }
}

/* Every rank's block of `sz` bytes, in rank order, into out (size blocks;
 * ours is out[rank]), by point-to-point messages in ceil(log2 size) rounds
 * (Bruck's all-gather): OpenMPI's nonblocking collectives cost several
 * times more than the messages themselves. tmp is size blocks of scratch.
 * On a timeout both out and tmp are the group's to keep. Completes only
 * once every rank has sent its block, so every rank is then present. */
static ndm_status exchange(ndm__dist_group *g, char *out, char *tmp, size_t sz, int tag,
                           const char *api, ndm__site site)
{
    int n = g->size, me = g->rank;
    memcpy(tmp, out + (size_t)me * sz, sz);
    for (int k = 0, dist = 1; dist < n; k++, dist *= 2) {
        int c = dist < n - dist ? dist : n - dist;
        MPI_Request req[2];
        if (MPI_Irecv(tmp + (size_t)dist * sz, (int)((size_t)c * sz), MPI_BYTE, (me + dist) % n,
                      tag + k, g->comm, &req[0]) != MPI_SUCCESS ||
            MPI_Isend(tmp, (int)((size_t)c * sz), MPI_BYTE, (me - dist + n) % n, tag + k, g->comm,
                      &req[1]) != MPI_SUCCESS)
            return ndm__fail(NDM_E_IO, api, site, "MPI_Isend/MPI_Irecv failed");
        ndm_status st = ndm__dist_wait(g, req, 2, NULL, 0, api, site);
        if (st < 0)
            return st;
    }
    /* tmp[j] is rank (me + j) % n's block */
    for (int j = 0; j < n; j++)
        if ((me + j) % n != me)
            memcpy(out + (size_t)((me + j) % n) * sz, tmp + (size_t)j * sz, sz);
    return NDM_OK;
}

#define TAG_RECORDS 1000
#define TAG_MESSAGES 2000

/* The ranks' messages, when the records say one failed: a second exchange
 * every rank makes, as every rank saw the same records. */
static ndm_status failure(ndm__dist_group *g, const rec *all, ndm_status local, const char *msg,
                          const char *api, ndm__site site)
{
    size_t n = (size_t)g->size;
    char *msgs = calloc(2 * n, REC_MSG);
    if (!msgs)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d messages", g->size);
    if (local < 0)
        snprintf(msgs + (size_t)g->rank * REC_MSG, REC_MSG, "%s", msg ? msg : ndm_last_error());
    ndm_status st = exchange(g, msgs, msgs + n * REC_MSG, REC_MSG, TAG_MESSAGES, api, site);
    if (st < 0) {
        keep_block(g, msgs);
        return st;
    }
    for (int r = 0; r < g->size; r++)
        if (all[r].status < 0) {
            char *m = msgs + (size_t)r * REC_MSG;
            m[REC_MSG - 1] = 0;
            st = ndm__fail((ndm_status)all[r].status, api, site, "rank %d: %s", r,
                           m[0] ? m : ndm_status_str((ndm_status)all[r].status));
            break;
        }
    free(msgs);
    return st;
}

/* Small all-reduces in small groups send their data with the record to
 * every other rank and reduce locally once the records agree: one round of
 * messages instead of the agreement's and then MPI's. Past CARRY_BYTES,
 * MPI's all-reduce moves less than everyone's data to everyone, and the
 * agreement is a small part of its time. */
#define CARRY_BYTES (16 << 10)
#define CARRY_RANKS 4
#define TAG_CARRY 8192

/* The agreement of ndm__dist_agree; when `carry` is not NULL, its `bytes`
 * go to every other rank alongside the record (bytes <= CARRY_BYTES, and
 * size <= CARRY_RANKS), and *carried says on return whether every rank did
 * so with records that agree: then rank r's data is at carried_data(g, r)
 * for r != rank. Every rank receives whatever was sent to it, agreeing or
 * not, so that nothing is left to match a later receive. `keep` is the
 * array carry lies in, kept by the group when a wait times out. */
static ndm_status agree(ndm__dist_group *g, ndm__dist_kind kind, int64_t arg, const ndm__view *a,
                        ndm_status local, const char *msg, const void *carry, int bytes,
                        ndm_array keep, bool *carried, const char *api, ndm__site site);

/* Up to 4 KiB go in two pieces of at most 2 KiB: the shared-memory
 * transport sends a message of up to 4 KiB with its header at once, and
 * a longer one only once its receive is matched (a round trip more). Two
 * ranks send the first piece in the record's message. A rank's slot holds
 * room for its record, then its data; the second piece lands past room
 * for a whole message. */
#define CARRY_PIECE 2048
#define CARRY_SLOT (sizeof(rec) + CARRY_BYTES + CARRY_PIECE)

static int carry_pieces(int bytes)
{
    return bytes <= 0 ? 0 : bytes > CARRY_PIECE && bytes <= 2 * CARRY_PIECE ? 2 : 1;
}

/* The first piece of `bytes` that goes in a message of its own: 1 when the
 * first rides with a pair's record (up to 4 KiB: the message stays eager). */
static int carry_alone(ndm__dist_group *g, int bytes)
{
    return g->size == 2 && bytes > 0 && bytes <= 2 * CARRY_PIECE;
}

static char *carried_data(ndm__dist_group *g, int r)
{
    return (char *)g->recs + 2 * (size_t)g->size * sizeof(rec) + (size_t)r * CARRY_SLOT +
           sizeof(rec);
}

/* Two ranks' records, each with the first `first` bytes of its carried
 * data in the same message; the receive has room for any. */
static ndm_status exchange_pair(ndm__dist_group *g, rec *all, const void *carry, int first,
                                const char *api, ndm__site site)
{
    int peer = 1 - g->rank;
    char *out = carried_data(g, g->rank) - sizeof(rec), *in = carried_data(g, peer) - sizeof(rec);
    memcpy(out, &all[g->rank], sizeof(rec));
    if (first)
        memcpy(out + sizeof(rec), carry, (size_t)first);
    MPI_Request req[2];
    if (MPI_Irecv(in, (int)(sizeof(rec) + CARRY_BYTES), MPI_BYTE, peer, TAG_RECORDS, g->comm,
                  &req[0]) != MPI_SUCCESS ||
        MPI_Isend(out, (int)sizeof(rec) + first, MPI_BYTE, peer, TAG_RECORDS, g->comm,
                  &req[1]) != MPI_SUCCESS)
        return ndm__fail(NDM_E_IO, api, site, "MPI_Isend/MPI_Irecv failed");
    ndm_status st = ndm__dist_wait(g, req, 2, NULL, 0, api, site);
    if (st == NDM_OK)
        memcpy(&all[peer], in, sizeof(rec));
    return st;
}

/* Post the receive of piece i of what rank r carries. */
static int carry_recv(ndm__dist_group *g, int r, int i, int tag, MPI_Request *req)
{
    return MPI_Irecv(carried_data(g, r) + (i ? CARRY_BYTES : 0), i ? CARRY_PIECE : CARRY_BYTES,
                     MPI_BYTE, r, tag + i, g->comm, req);
}

ndm_status ndm__dist_agree(ndm__dist_group *g, ndm__dist_kind kind, int64_t arg,
                           const ndm__view *a, ndm_status local, const char *msg,
                           const char *api, ndm__site site)
{
    return agree(g, kind, arg, a, local, msg, NULL, 0, NDM_NULL_ARRAY, NULL, api, site);
}

static ndm_status agree(ndm__dist_group *g, ndm__dist_kind kind, int64_t arg, const ndm__view *a,
                        ndm_status local, const char *msg, const void *carry, int bytes,
                        ndm_array keep, bool *carried, const char *api, ndm__site site)
{
    if (carried)
        *carried = false;
    /* the data-parallel worker may be inside MPI: it finishes first */
    ndm_status st = ndm__dist_drain(g, api, site);
    if (st < 0)
        return st;
    /* records, scratch and room for carried data, made once; a timeout
     * hands them to the kept blocks */
    size_t carry_room = g->size <= CARRY_RANKS ? (size_t)g->size * CARRY_SLOT : 0;
    if (!g->recs && !(g->recs = calloc(1, 2 * (size_t)g->size * sizeof(rec) + carry_room)))
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d agreement records", g->size);
    rec *all = g->recs, *mine = all + g->rank;
    memset(mine, 0, sizeof *mine);
    mine->status = local < 0 ? local : NDM_OK;
    mine->kind = kind;
    mine->arg = arg;
    if (a) {
        mine->has_array = 1;
        mine->dtype = a->t.dtype;
        mine->ndim = a->t.ndim;
        mine->dev_type = a->device.type;
        mine->dev_index = a->device.index;
        mine->numel = a->numel;
        uint64_t h = 1469598103934665603u; /* FNV-1a over the dimensions */
        for (int i = 0; i < a->t.ndim; i++) {
            if (i < REC_DIMS)
                mine->shape[i] = a->t.shape[i];
            h = (h ^ (uint64_t)a->t.shape[i]) * 1099511628211u;
        }
        mine->shape_hash = h;
    }
    /* a receive posted for carried data that does not come is cancelled;
     * a tag of this agreement's own keeps it from matching a later one's */
    static unsigned seq;
    int tag = TAG_CARRY + 2 * (int)(seq++ % 1024);
    MPI_Request req[4 * CARRY_RANKS], recv[2 * CARRY_RANKS];
    bool all_carried;
    int nreq = 0;
    if (carry && (g->size > CARRY_RANKS || bytes <= 0 || bytes > CARRY_BYTES))
        carry = NULL; /* the caller's mistake: agree without */
    if (carry)
        mine->carried = bytes;
    int mine_pieces = carry ? carry_pieces(bytes) : 0, alone = carry_alone(g, carry ? bytes : 0);
    for (int i = 0; i < 2 * CARRY_RANKS; i++)
        recv[i] = MPI_REQUEST_NULL;
    if (carry) {
        /* the receives first, for the others carry too when all goes well:
         * the data then moves with the records */
        for (int r = 0; r < g->size; r++)
            for (int i = alone; i < mine_pieces; i++) {
                if (r != g->rank && carry_recv(g, r, i, tag, &recv[2 * r + i]) != MPI_SUCCESS) {
                    abandon(g, recv, 2 * r + i, NULL, 0);
                    return ndm__fail(NDM_E_IO, api, site, "MPI_Irecv failed");
                }
            }
        for (int r = 0; r < g->size; r++)
            for (int i = alone; i < mine_pieces && r != g->rank; i++) {
                int off = i * CARRY_PIECE, n = mine_pieces == 1 ? bytes : i ? bytes - CARRY_PIECE
                                                                            : CARRY_PIECE;
                req[nreq++] = recv[2 * r + i];
                if (MPI_Isend((const char *)carry + off, n, MPI_BYTE, r, tag + i, g->comm,
                              &req[nreq++]) != MPI_SUCCESS) {
                    abandon(g, req, nreq - 1, &keep, keep.id != 0);
                    return ndm__fail(NDM_E_IO, api, site, "MPI_Isend failed");
                }
            }
    }
    if (g->size == 2)
        st = exchange_pair(g, all, carry, !alone ? 0 : mine_pieces == 1 ? bytes : CARRY_PIECE, api,
                           site);
    else
        st = exchange(g, (char *)all, (char *)(all + g->size), sizeof *all, TAG_RECORDS, api, site);
    if (st < 0) {
        /* a late rank may carry nothing: the receives must not wait for it */
        for (int r = 0; r < g->size; r++)
            for (int i = alone; i < mine_pieces && r != g->rank; i++)
                MPI_Cancel(&recv[2 * r + i]);
        if (nreq)
            abandon(g, req, nreq, &keep, keep.id != 0);
        keep_block(g, g->recs);
        g->recs = NULL;
        return st;
    }
    /* whatever the records say, every piece sent is received, and a receive
     * posted for a piece that was not sent is cancelled */
    for (int r = 0; r < g->size; r++) {
        int n = all[r].carried, sent = carry_pieces(n);
        if (r == g->rank)
            continue;
        if (n > CARRY_BYTES || (sent && !carry_room)) {
            /* a rank of another build: nothing can be trusted */
            abandon(g, req, nreq, &keep, keep.id != 0);
            return ndm__fail(NDM_E_IO, api, site, "rank %d sent %d bytes that cannot be received",
                             r, n);
        }
        /* pieces lo .. sent-1 came in messages of their own; alone ..
         * mine_pieces-1 were awaited so */
        int lo = carry_alone(g, n);
        for (int i = 0; i < 2; i++) {
            bool awaited = i >= alone && i < mine_pieces, came = i >= lo && i < sent;
            if (awaited && !came)
                MPI_Cancel(&recv[2 * r + i]);
            else if (came && !awaited && carry_recv(g, r, i, tag, &req[nreq++]) != MPI_SUCCESS) {
                abandon(g, req, nreq - 1, &keep, keep.id != 0);
                return ndm__fail(NDM_E_IO, api, site, "MPI_Irecv failed");
            }
        }
    }
    if (nreq && (st = ndm__dist_wait(g, req, nreq, &keep, keep.id != 0, api, site)) < 0) {
        keep_block(g, g->recs);
        g->recs = NULL;
        return st;
    }
    all_carried = true;
    for (int r = 0; r < g->size; r++) {
        all_carried &= all[r].carried > 0 && all[r].carried == bytes;
        if (r != g->rank && carry_pieces(all[r].carried) == 2) /* the second piece in place */
            memmove(carried_data(g, r) + CARRY_PIECE, carried_data(g, r) + CARRY_BYTES,
                    (size_t)(all[r].carried - CARRY_PIECE));
    }
    for (int r = 0; r < g->size; r++)
        if (all[r].status < 0)
            return failure(g, all, local, msg, api, site);
    const rec *z = &all[0];
    for (int r = 1; r < g->size && st == NDM_OK; r++) {
        const rec *o = &all[r];
        char s0[200], s1[200];
        if (o->kind != z->kind) {
            st = ndm__fail(NDM_E_INVALID, api, site, "rank 0 calls %s and rank %d calls %s",
                           kind_name(z->kind), r, kind_name(o->kind));
        } else if (o->arg != z->arg) {
            st = ndm__fail(NDM_E_INVALID, api, site,
                           "%s: rank 0 passes %" PRId64 " and rank %d passes %" PRId64
                           " (root, operation or count)",
                           kind_name(z->kind), z->arg, r, o->arg);
        } else if (!z->has_array || !o->has_array) {
            continue;
        } else if (o->dev_type != z->dev_type || o->dev_index != z->dev_index) {
            st = ndm__fail(NDM_E_DEVICE, api, site,
                           "%s: rank 0's array is on %s:%d and rank %d's on %s:%d",
                           kind_name(z->kind), z->dev_type ? "cuda" : "cpu", z->dev_index, r,
                           o->dev_type ? "cuda" : "cpu", o->dev_index);
        } else if (o->dtype != z->dtype) {
            shape_str(z, s0, sizeof s0);
            shape_str(o, s1, sizeof s1);
            st = ndm__fail(NDM_E_DTYPE, api, site, "%s: rank 0 has %s and rank %d has %s",
                           kind_name(z->kind), s0, r, s1);
        } else if (o->ndim != z->ndim || o->numel != z->numel || o->shape_hash != z->shape_hash ||
                   memcmp(o->shape, z->shape, sizeof z->shape)) {
            shape_str(z, s0, sizeof s0);
            shape_str(o, s1, sizeof s1);
            st = ndm__fail(NDM_E_SHAPE, api, site, "%s: rank 0 has %s and rank %d has %s",
                           kind_name(z->kind), s0, r, s1);
        }
    }
    if (carried)
        *carried = st == NDM_OK && all_carried;
    return st;
}

NDM_API ndm_status ndm_dist_check_at(NDM_SITE_PARAMS, ndm_status local)
{
    ndm__site site = NDM__SITE;
    ndm__dist_group *g = ndm__dist_group_get(__func__, site);
    if (!g)
        return ndm_last_status();
    return ndm__dist_agree(g, NDM__DIST_CHECK, 0, NULL, local, NULL, __func__, site);
}

/* ---- dtypes and operations ---------------------------------------------------------------- */

static void half_op(void *in, void *inout, int *len, MPI_Datatype *dt, bool bf, bool max)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        float x = bf ? ndm__bf16_to_f32(a[i]) : ndm__f16_to_f32(a[i]);
        float y = bf ? ndm__bf16_to_f32(b[i]) : ndm__f16_to_f32(b[i]);
        float z = max ? (x > y || x != x ? x : y) : x + y;
        b[i] = bf ? ndm__f32_to_bf16(z) : ndm__f32_to_f16(z);
    }
}
static void f16_sum(void *in, void *io, int *n, MPI_Datatype *t) { half_op(in, io, n, t, false, false); }
static void f16_max(void *in, void *io, int *n, MPI_Datatype *t) { half_op(in, io, n, t, false, true); }
static void bf16_sum(void *in, void *io, int *n, MPI_Datatype *t) { half_op(in, io, n, t, true, false); }
static void bf16_max(void *in, void *io, int *n, MPI_Datatype *t) { half_op(in, io, n, t, true, true); }

MPI_Datatype ndm__dist_mpi_type(ndm_dtype dt)
{
    switch (dt) {
    case NDM_BOOL: return MPI_C_BOOL;
    case NDM_U8: return MPI_UINT8_T;
    case NDM_I32: return MPI_INT32_T;
    case NDM_I64: return MPI_INT64_T;
    case NDM_F16:
    case NDM_BF16: return MPI_UINT16_T;
    case NDM_F32: return MPI_FLOAT;
    case NDM_F64: return MPI_DOUBLE;
    }
    return MPI_DATATYPE_NULL;
}

MPI_Op ndm__dist_mpi_op(ndm_dtype dt, ndm_dist_op op)
{
    /* made once, the first time a half type is reduced; freed by MPI_Finalize */
    static MPI_Op ops[4];
    if (dt == NDM_F16 || dt == NDM_BF16) {
        int k = (dt == NDM_BF16) * 2 + (op == NDM_DIST_MAX);
        if (ops[k] == 0 || ops[k] == MPI_OP_NULL) {
            MPI_User_function *fn[4] = {f16_sum, f16_max, bf16_sum, bf16_max};
            MPI_Op_create(fn[k], 1, &ops[k]);
        }
        return ops[k];
    }
    if (dt == NDM_BOOL)
        return MPI_LOR;
    return op == NDM_DIST_MAX ? MPI_MAX : MPI_SUM;
}

void ndm__dist_divide(void *p, int64_t n, ndm_dtype dt, int size)
{
    switch (dt) {
    case NDM_U8:
        for (int64_t i = 0; i < n; i++)
            ((uint8_t *)p)[i] = (uint8_t)(((uint8_t *)p)[i] / size);
        break;
    case NDM_I32:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)p)[i] /= size;
        break;
    case NDM_I64:
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)p)[i] /= size;
        break;
    case NDM_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)p)[i] =
                ndm__f32_to_f16(ndm__f16_to_f32(((uint16_t *)p)[i]) / (float)size);
        break;
    case NDM_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)p)[i] =
                ndm__f32_to_bf16(ndm__bf16_to_f32(((uint16_t *)p)[i]) / (float)size);
        break;
    case NDM_F32:
        for (int64_t i = 0; i < n; i++)
            ((float *)p)[i] /= (float)size;
        break;
    case NDM_F64:
        for (int64_t i = 0; i < n; i++)
            ((double *)p)[i] /= size;
        break;
    case NDM_BOOL:
        break;
    }
}

/* ---- collectives ------------------------------------------------------------------------------ */

/* MPI counts are int: larger arrays go in pieces of at most 2^30 elements. */
#define CHUNK ((int64_t)1 << 30)

/* Checks shared by the collectives: the group, the array, the device, and
 * the op. Returns the array's record or NULL with the error; the other
 * ranks learn of a local error through the agreement. */
static ndm__view *collective_array(ndm_array a, ndm__view *r, const char *api, ndm__site site,
                                   ndm_status *local)
{
    if (!ndm__view_of(a, r, api, site)) {
        *local = ndm_last_status();
        return NULL;
    }
    /* CUDA arrays go over the module's NCCL: told now, before agreeing,
     * when this build or this module has none */
    if (r->device.type == NDM_DEVICE_CUDA && !ndm__nccl_table(api, site)) {
        *local = ndm_last_status();
        return NULL;
    }
    return r;
}

static ndm_status check_op(ndm_dist_op op, ndm_dtype dt, const char *api, ndm__site site)
{
    if (op != NDM_DIST_SUM && op != NDM_DIST_MEAN && op != NDM_DIST_MAX)
        return ndm__fail(NDM_E_INVALID, api, site, "unknown ndm_dist_op %d", (int)op);
    if (op == NDM_DIST_MEAN && dt == NDM_BOOL)
        return ndm__fail(NDM_E_DTYPE, api, site, "the mean of bool arrays is not defined");
    return NDM_OK;
}

static ndm__coll_op coll_op(ndm_dist_op op)
{
    return op == NDM_DIST_MAX    ? NDM__COLL_MAX
           : op == NDM_DIST_MEAN ? NDM__COLL_MEAN
                                 : NDM__COLL_SUM;
}

/* The same on a CUDA array: NCCL on the thread's current stream of the
 * array's device (the communicator made by the first such call). */
static ndm_status run_inplace_cuda(ndm__dist_group *g, ndm__view *r, bool bcast, ndm_dist_op op,
                                   int root, const char *api, ndm__site site)
{
    const ndm__backend_collective *t;
    void *comm;
    ndm_status st = ndm__nccl_comm(g, r->device.index, &t, &comm, api, site);
    if (st < 0)
        return st;
    size_t n = (size_t)r->numel;
    void *p = r->t.data;
    st = bcast ? t->broadcast(comm, p, n, r->t.dtype, root)
               : t->all_reduce(comm, p, n, r->t.dtype, coll_op(op));
    /* the module's message, said of this call */
    return st < 0 ? ndm__fail(st, api, site, "%s", ndm_last_error()) : NDM_OK;
}

/* In-place all-reduce or broadcast over the contiguous array r. Every rank
 * has agreed and is present: MPI's blocking collective moves the data (a
 * rank that dies now is mpirun's to end, as with any MPI program). */
static ndm_status run_inplace(ndm__dist_group *g, ndm__view *r, bool bcast, ndm_dist_op op,
                              int root, const char *api, ndm__site site)
{
    if (r->device.type == NDM_DEVICE_CUDA)
        return run_inplace_cuda(g, r, bcast, op, root, api, site);
    int64_t n = r->numel;
    char *p = r->t.data;
    size_t es = ndm_dtype_size(r->t.dtype);
    MPI_Datatype t = ndm__dist_mpi_type(r->t.dtype);
    MPI_Op mo = ndm__dist_mpi_op(r->t.dtype, op);
    for (int64_t off = 0; off < n; off += CHUNK) {
        int c = (int)(n - off < CHUNK ? n - off : CHUNK);
        int rc = bcast ? MPI_Bcast(p + off * (int64_t)es, c, t, root, g->comm)
                       : MPI_Allreduce(MPI_IN_PLACE, p + off * (int64_t)es, c, t, mo, g->comm);
        if (rc != MPI_SUCCESS)
            return ndm__fail(NDM_E_IO, api, site, "%s failed", bcast ? "MPI_Bcast" : "MPI_Allreduce");
    }
    if (!bcast && op == NDM_DIST_MEAN)
        ndm__dist_divide(p, n, r->t.dtype, g->size);
    return NDM_OK;
}

/* acc = acc op x over n elements, as MPI's op for the dtype would (NaN
 * wins a max; integers wrap). */
static void combine(void *acc, const void *x, int64_t n, ndm_dtype dt, ndm_dist_op op)
{
    bool max = op == NDM_DIST_MAX;
#define COMBINE(T)                                                                      \
    do {                                                                                \
        T *p = acc;                                                                     \
        const T *q = x;                                                                 \
        if (max)                                                                        \
            for (int64_t i = 0; i < n; i++)                                             \
                p[i] = q[i] > p[i] || q[i] != q[i] ? q[i] : p[i];                       \
        else                                                                            \
            for (int64_t i = 0; i < n; i++)                                             \
                p[i] = (T)(p[i] + q[i]);                                                \
    } while (0)
    switch (dt) {
    case NDM_BOOL:
        for (int64_t i = 0; i < n; i++)
            ((bool *)acc)[i] = ((bool *)acc)[i] || ((const bool *)x)[i];
        break;
    case NDM_U8: COMBINE(uint8_t); break;
    case NDM_I32: COMBINE(uint32_t); break; /* wraps, as MPI's does */
    case NDM_I64: COMBINE(uint64_t); break;
    case NDM_F32: COMBINE(float); break;
    case NDM_F64: COMBINE(double); break;
    case NDM_F16:
    case NDM_BF16: {
        int len = (int)n;
        half_op((void *)x, acc, &len, NULL, dt == NDM_BF16, max);
        break;
    }
    }
#undef COMBINE
}

/* The all-reduce of data every rank carried with its record: every rank
 * folds the ranks' data in rank order, so all get the same bits. */
static void reduce_carried(ndm__dist_group *g, ndm__view *r, ndm_dist_op op)
{
    int64_t n = r->numel;
    size_t bytes = (size_t)n * ndm_dtype_size(r->t.dtype);
    char *mine = r->t.data;
    char *acc = g->rank == 0 ? mine : carried_data(g, 0);
    for (int k = 1; k < g->size; k++)
        combine(acc, k == g->rank ? mine : carried_data(g, k), n, r->t.dtype, op);
    if (acc != mine)
        memcpy(mine, acc, bytes);
    if (op == NDM_DIST_MEAN)
        ndm__dist_divide(mine, n, r->t.dtype, g->size);
}

static ndm_status inplace_collective(ndm_array a, bool bcast, ndm_dist_op op, int root,
                                     ndm__dist_kind kind, const char *api, ndm__site site)
{
    ndm__dist_group *g = ndm__dist_group_get(api, site);
    if (!g)
        return ndm_last_status();
    ndm_status local = NDM_OK;
    ndm__view rv, *r = collective_array(a, &rv, api, site, &local);
    if (r && !bcast)
        local = check_op(op, r->t.dtype, api, site);
    if (r && bcast && (root < 0 || root >= g->size))
        local = ndm__fail(NDM_E_INVALID, api, site, "root %d is not a rank of 0 .. %d", root,
                          g->size - 1);
    /* a strided view goes through a contiguous copy, made before agreeing
     * so that its failure is a local one the other ranks hear of */
    ndm_array tmp = NDM_NULL_ARRAY;
    if (local == NDM_OK && !ndm__is_contiguous(r->t.ndim, r->t.shape, r->t.strides)) {
        tmp = ndm_contiguous_to(NDM_OUTPUT_RULE, a);
        if (!tmp.id)
            local = ndm_last_status();
    }
    /* small CPU arrays: the data goes with the record (the host reads and
     * folds it; a CUDA array's memory is the device's, for NCCL) */
    int64_t bytes =
        local == NDM_OK ? r->numel * (int64_t)ndm_dtype_size(r->t.dtype) : 0;
    bool carry = !bcast && !tmp.id && g->size <= CARRY_RANKS && bytes > 0 &&
                 bytes <= CARRY_BYTES && r->device.type == NDM_DEVICE_CPU;
    bool carried = false;
    ndm__view tv;
    ndm_status st = agree(g, kind, bcast ? root : (int64_t)op, local < 0 ? NULL : r, local, NULL,
                          carry ? r->t.data : NULL, (int)bytes, a, &carried, api, site);
    if (st == NDM_OK && carried)
        reduce_carried(g, r, op);
    else if (st == NDM_OK)
        st = run_inplace(g, tmp.id && ndm__view_peek(tmp, &tv) ? &tv : r, bcast, op, root, api,
                         site);
    if (st == NDM_OK && tmp.id)
        st = ndm_copy_into(a, tmp);
    if (tmp.id)
        (void)!ndm_array_release(tmp);
    return st;
}

NDM_API ndm_status ndm_all_reduce_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_dist_op op)
{
    return inplace_collective(a, false, op, 0, NDM__DIST_ALL_REDUCE, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_broadcast_inplace_at(NDM_SITE_PARAMS, ndm_array a, int root)
{
    return inplace_collective(a, true, NDM_DIST_SUM, root, NDM__DIST_BROADCAST, __func__,
                              NDM__SITE);
}

/* All-gather (scatter false) or reduce-scatter into a new array in out. */
static ndm_array gather_scatter(ndm_manager out, ndm_array a, bool scatter, ndm_dist_op op,
                                const char *api, ndm__site site)
{
    ndm__dist_group *g = ndm__dist_group_get(api, site);
    if (!g)
        return NDM_NULL_ARRAY;
    ndm_status local = NDM_OK;
    ndm__view rv, *r = collective_array(a, &rv, api, site, &local);
    if (r && scatter)
        local = check_op(op, r->t.dtype, api, site);
    if (r && local == NDM_OK && r->t.ndim < 1)
        local = ndm__fail(NDM_E_SHAPE, api, site, "a 0-d array has no first axis to %s along",
                          scatter ? "scatter" : "gather");
    if (r && local == NDM_OK && scatter && r->t.shape[0] % g->size)
        local = ndm__fail(NDM_E_SHAPE, api, site,
                          "the first axis (%" PRId64 ") is not divisible by the %d ranks",
                          r->t.shape[0], g->size);
    ndm_array src = NDM_NULL_ARRAY, res = NDM_NULL_ARRAY;
    if (local == NDM_OK && !ndm__is_contiguous(r->t.ndim, r->t.shape, r->t.strides)) {
        src = ndm_contiguous_to(NDM_OUTPUT_RULE, a);
        if (!src.id)
            local = ndm_last_status();
    }
    if (local == NDM_OK) {
        int64_t small[REC_DIMS], *shape = small;
        if (r->t.ndim > REC_DIMS && !(shape = malloc((size_t)r->t.ndim * sizeof *shape)))
            local = ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        if (local == NDM_OK) {
            memcpy(shape, r->t.shape, (size_t)r->t.ndim * sizeof *shape);
            if (shape[0] > INT64_MAX / g->size) {
                local = ndm__fail(NDM_E_OVERFLOW, api, site, "the gathered size overflows");
            } else {
                shape[0] = scatter ? shape[0] / g->size : shape[0] * g->size;
                /* checks come before allocation: a refused manager is a local failure */
                ndm_manager m = ndm__output_for(out, a, api, site);
                /* on the input's device, whatever the manager's: the
                 * collective writes it where it reads */
                res = m.id ? ndm__array_make(site, api, m, &r->device, r->t.dtype, r->t.ndim,
                                             shape, NULL)
                           : NDM_NULL_ARRAY;
                if (!res.id)
                    local = ndm_last_status();
            }
            if (shape != small)
                free(shape);
        }
    }
    ndm_status st = ndm__dist_agree(g, scatter ? NDM__DIST_REDUCE_SCATTER : NDM__DIST_ALL_GATHER,
                                    scatter ? (int64_t)op : 0, local < 0 ? NULL : r, local, NULL,
                                    api, site);
    if (st == NDM_OK) {
        ndm__view sv, dv;
        ndm__view *s = src.id && ndm__view_peek(src, &sv) ? &sv : r;
        ndm__view *d = ndm__view_peek(res, &dv) ? &dv : NULL;
        int64_t n = s->numel;
        int64_t part = scatter ? n / g->size : n;
        MPI_Datatype t = ndm__dist_mpi_type(r->t.dtype);
        int rc;
        if (r->device.type == NDM_DEVICE_CUDA) {
            const ndm__backend_collective *ct;
            void *comm;
            st = ndm__nccl_comm(g, r->device.index, &ct, &comm, api, site);
            if (st == NDM_OK) {
                st = scatter ? ct->reduce_scatter(comm, s->t.data, d->t.data,
                                                  (size_t)part, r->t.dtype, coll_op(op))
                             : ct->all_gather(comm, s->t.data, d->t.data,
                                              (size_t)part, r->t.dtype);
                if (st < 0) /* the module's message, said of this call */
                    st = ndm__fail(st, api, site, "%s", ndm_last_error());
            }
        } else if (part > INT32_MAX) {
            st = ndm__fail(NDM_E_OVERFLOW, api, site,
                           "%" PRId64 " elements per rank: MPI counts stop at 2^31-1", part);
        } else {
            /* agreed and present: MPI's blocking collective, as in run_inplace */
            if (scatter)
                rc = MPI_Reduce_scatter_block(s->t.data, d->t.data, (int)part, t,
                                              ndm__dist_mpi_op(r->t.dtype, op), g->comm);
            else
                rc = MPI_Allgather(s->t.data, (int)part, t, d->t.data, (int)part,
                                   t, g->comm);
            if (rc != MPI_SUCCESS)
                st = ndm__fail(NDM_E_IO, api, site, "%s failed",
                               scatter ? "MPI_Reduce_scatter_block" : "MPI_Allgather");
        }
        if (st == NDM_OK && scatter && op == NDM_DIST_MEAN &&
            r->device.type != NDM_DEVICE_CUDA)
            ndm__dist_divide(d->t.data, part, r->t.dtype, g->size);
    }
    if (src.id)
        (void)!ndm_array_release(src);
    if (st < 0 && res.id) {
        ndm__discard(res);
        res = NDM_NULL_ARRAY;
    }
    return res;
}

NDM_API ndm_array ndm_all_gather_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    return gather_scatter(out, a, false, NDM_DIST_SUM, __func__, NDM__SITE);
}

NDM_API ndm_array ndm_reduce_scatter_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                           ndm_dist_op op)
{
    return gather_scatter(out, a, true, op, __func__, NDM__SITE);
}

/* ---- sharded loading ------------------------------------------------------------------------- */

NDM_API ndm_loader ndm_dist_loader_new_at(NDM_SITE_PARAMS, ndm_manager trainer, ndm_dataset data,
                                          const ndm_loader_options *opts)
{
    ndm__site site = NDM__SITE;
    ndm__dist_group *g = ndm__dist_group_get(__func__, site);
    if (!g)
        return (ndm_loader){0};
    if (!opts) {
        ndm__fail(NDM_E_INVALID, __func__, site, "opts is NULL");
        return (ndm_loader){0};
    }
    ndm_loader_options o = *opts;
    o.num_shards = g->size;
    o.shard = g->rank;
    return ndm_loader_new_at(NDM__SITE_ARGS(site), trainer, data, &o);
}
