/* Private interface of the MPI process group: the agreement every
 * collective makes first, bounded waits, the data-parallel worker thread,
 * and MPI's names for dtypes. */
#ifndef NDM_DIST_GROUP_H
#define NDM_DIST_GROUP_H

#include <mpi.h>
#include <pthread.h>

#include "ndm/dist.h"
#include "../ops/inner.h"

/* What a collective is, in the agreement record: ranks that disagree fail. */
typedef enum ndm__dist_kind {
    NDM__DIST_CHECK = 1,
    NDM__DIST_ALL_REDUCE,
    NDM__DIST_BROADCAST,
    NDM__DIST_ALL_GATHER,
    NDM__DIST_REDUCE_SCATTER,
    NDM__DIST_DUMP,
    NDM__DIST_LEAKS,
    NDM__DIST_DDP_NEW,
    NDM__DIST_DDP_STEP,
} ndm__dist_kind;

/* One blocking all-reduce for the worker thread, in place; the caller
 * owns it and its buffer until ndm__dist_drain() has returned NDM_OK. */
typedef struct ndm__dist_job {
    void *p;
    int count;
    MPI_Datatype type;
    MPI_Op op;
    ndm_array buf;            /* the array p is in: kept by the group after a timeout */
    bool owned;               /* the group's copy, freed once run */
    struct ndm__dist_job *next;
    uint64_t seq;             /* its place among the posted jobs, set by ndm__dist_post() */
} ndm__dist_job;

/* The group, or NULL with NDM_E_UNSUPPORTED/NDM_E_INVALID (not joined) or
 * NDM_E_TIMEOUT (broken) recorded for `api`. */
typedef struct ndm__dist_group {
    MPI_Comm comm;
    int rank, size, local_rank;
    int local_size;           /* the ranks on this node */
    bool we_initialised;
    double timeout_s;
    bool broken;
    MPI_Request *abandoned;   /* the requests a timeout left behind */
    int nabandoned;
    ndm_manager keep;         /* "dist" under system: views of their buffers */
    void **kept;              /* and the group's own buffers they use */
    int nkept;
    void *recs;               /* the agreement's records and scratch, made once */
    /* the worker: one thread that runs posted jobs in order. posted is the
     * posting thread's own; the rest is under mu */
    bool threads_ok;          /* MPI grants MPI_THREAD_SERIALIZED or more */
    bool worker;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    ndm__dist_job *head, *tail;
    ndm__dist_job *current;   /* the job inside MPI now */
    uint64_t posted, done;
    /* no core of its own (defer): the worker runs a job only while the
     * posting thread waits for it (seq <= want), not against its compute */
    bool defer;
    uint64_t want;
    int failed_rc;            /* an MPI error in a job, told by the next drain */
    bool stop;
    /* NCCL communicators of the CUDA module, per device, made by the first
     * collective on a CUDA array of the device (every rank at once) */
    void *nccl[NDM__MAX_CUDA];
} ndm__dist_group;

ndm__dist_group *ndm__dist_group_get(const char *api, ndm__site site);

/* Exchange one record per rank (status, kind, arg, and a's dtype, shape
 * and device when r is not NULL) and check them: NDM_OK when every rank
 * agrees, and then every rank is present; else the same error on every
 * rank (dist.h). A local failure is told with `msg`, or this thread's last
 * error when msg is NULL. Waits for the worker's jobs first. */
ndm_status ndm__dist_agree(ndm__dist_group *g, ndm__dist_kind kind, int64_t arg,
                           const ndm__view *r, ndm_status local, const char *msg,
                           const char *api, ndm__site site);

/* Break the group (its timeout passed), keeping a view of each of the
 * `nkeep` arrays whose memory MPI or NCCL may still write, in the group's
 * own manager, so that the memory outlives the caller's handles. */
void ndm__dist_keep(ndm__dist_group *g, const ndm_array *keep, int nkeep);

/* Wait for n requests, bounded by the group's timeout. On a timeout the
 * group breaks, keeps the requests and a view of each of the `nkeep`
 * arrays whose memory MPI may still write, and NDM_E_TIMEOUT is returned. */
ndm_status ndm__dist_wait(ndm__dist_group *g, MPI_Request *reqs, int n, const ndm_array *keep,
                          int nkeep, const char *api, ndm__site site);

/* Hand a job to the worker thread (started on first use), which runs the
 * posted jobs one after another with MPI's blocking all-reduce. While jobs
 * are out, the calling thread makes no MPI call of its own (MPI is
 * initialised MPI_THREAD_SERIALIZED): ndm__dist_agree() drains first. */
ndm_status ndm__dist_post(ndm__dist_group *g, ndm__dist_job *j, const char *api, ndm__site site);
/* (NDM_E_UNSUPPORTED, with no message, when MPI grants too little
 * threading: the caller then runs the job itself.) */

/* Wait, bounded by the group's timeout, until the worker has run every
 * posted job. On a timeout the group breaks, keeps a view of every array
 * the worker may still write, takes copies of the jobs not started (the
 * caller's are not read after that; late ranks still meet them) and
 * returns NDM_E_TIMEOUT. */
ndm_status ndm__dist_drain(ndm__dist_group *g, const char *api, ndm__site site);
/* The same until the worker has run the job whose seq is `seq` and those
 * before it (jobs run in the order posted): the later ones may still run. */
ndm_status ndm__dist_wait_job(ndm__dist_group *g, uint64_t seq, const char *api, ndm__site site);

/* MPI's datatype and operation for a dtype and ndm_dist_op (MEAN: SUM, the
 * division is the caller's). f16 and bf16 use ops of ndm's own. */
MPI_Datatype ndm__dist_mpi_type(ndm_dtype dt);
MPI_Op ndm__dist_mpi_op(ndm_dtype dt, ndm_dist_op op);

/* Divide n elements at p of dtype dt by the group size, in place (MEAN). */
void ndm__dist_divide(void *p, int64_t n, ndm_dtype dt, int size);

/* ---- CUDA arrays (nccl.c) ---- */

/* The CUDA module's collectives, or NULL with NDM_E_UNSUPPORTED recorded
 * (no module, or one built without NCCL): a check each rank makes before
 * agreeing. */
const ndm__backend_collective *ndm__nccl_table(const char *api, ndm__site site);

/* The table and this rank's communicator on CUDA device `device`, made on
 * the first call for the device. Every rank calls it at once, after an
 * agreement on a CUDA array of that device index: making a communicator
 * is itself collective, and a failure on any rank is the same error on
 * every rank (none then holds one). */
ndm_status ndm__nccl_comm(ndm__dist_group *g, int device, const ndm__backend_collective **table,
                          void **comm, const char *api, ndm__site site);

/* Free every communicator (ndm_dist_finalize). */
void ndm__nccl_free_all(ndm__dist_group *g);

#endif
