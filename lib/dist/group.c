/* The process group over MPI and the collectives on arrays: every call
 * agrees on what it does across ranks first, then moves data with
 * nonblocking MPI and a bounded test loop. */
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "group.h"
#include "ndm/array.h"
#include "ndm/elementwise.h"
#include "ndm/manager.h"
#include "ndm/view.h"
#include "../base/convert_scalar.h"
#include "../ops/dispatch.h"

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
        MPI_Comm_free(&local);
    } else {
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        group.local_rank = lr ? atoi(lr) : 0;
    }
    group.timeout_s = timeout;
    joined = true;
    return NDM_OK;
}

NDM_API ndm_status ndm_dist_finalize(void)
{
    if (!joined)
        return NDM_ALREADY;
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
    MPI_Request *kept = realloc(g->abandoned, (size_t)(g->nabandoned + n) * sizeof *kept);
    if (kept) {
        memcpy(kept + g->nabandoned, reqs, (size_t)n * sizeof *reqs);
        g->abandoned = kept;
        g->nabandoned += n;
    }
    if (nkeep) {
        if (!g->keep.id)
            g->keep = ndm_manager_new(ndm_system(), "dist");
        for (int i = 0; i < nkeep && g->keep.id; i++)
            (void)ndm_alias_to(g->keep, keep[i]);
    }
    g->broken = true;
    return ndm__fail(NDM_E_TIMEOUT, api, site,
                     "rank %d waited %g s (NDM_DIST_TIMEOUT_S) for the other ranks: one of them "
                     "is not taking part (dead, stuck, or calling collectives in another order)",
                     g->rank, g->timeout_s);
}

/* ---- agreement ------------------------------------------------------------------------------ */

#define REC_DIMS 8
#define REC_MSG 400

typedef struct rec {
    int32_t status, kind, dtype, ndim;
    int32_t dev_type, dev_index, has_array, pad;
    int64_t arg, numel;
    int64_t shape[REC_DIMS];
    char msg[REC_MSG];
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
    for (int i = 0; i < r->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %" PRId64 : "%" PRId64,
                              i < REC_DIMS ? r->shape[i] : 0);
    if (r->ndim > REC_DIMS && o < n)
        o += (size_t)snprintf(buf + o, n - o, ", ... (%" PRId64 " elements)", r->numel);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

ndm_status ndm__dist_agree(ndm__dist_group *g, ndm__dist_kind kind, int64_t arg,
                           const ndm__array *a, ndm_status local, const char *msg,
                           const char *api, ndm__site site)
{
    /* one block for the ranks' records and ours: after a timeout MPI may
     * still read ours and write theirs, so the block is then kept */
    rec *all = calloc((size_t)g->size + 1, sizeof *all);
    if (!all)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for %d agreement records", g->size);
    rec *mine = all + g->size;
    mine->status = local < 0 ? local : NDM_OK;
    mine->kind = kind;
    mine->arg = arg;
    if (local < 0)
        snprintf(mine->msg, sizeof mine->msg, "%s", msg ? msg : ndm_last_error());
    if (a) {
        mine->has_array = 1;
        mine->dtype = a->dtype;
        mine->ndim = a->ndim;
        mine->dev_type = a->storage->device.type;
        mine->dev_index = a->storage->device.index;
        mine->numel = ndm__numel(a->ndim, a->shape);
        for (int i = 0; i < a->ndim && i < REC_DIMS; i++)
            mine->shape[i] = a->shape[i];
    }
    MPI_Request req;
    if (MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, g->comm,
                       &req) != MPI_SUCCESS) {
        free(all);
        return ndm__fail(NDM_E_IO, api, site, "MPI_Iallgather failed");
    }
    ndm_status st = ndm__dist_wait(g, &req, 1, NULL, 0, api, site);
    if (st < 0) {
        /* MPI may still use the records: they stay until the finalize */
        void **k = realloc(g->kept, (size_t)(g->nkept + 1) * sizeof *k);
        if (k) {
            k[g->nkept++] = all;
            g->kept = k;
        }
        return st;
    }
    for (int r = 0; r < g->size && st == NDM_OK; r++)
        if (all[r].status < 0) {
            all[r].msg[REC_MSG - 1] = 0;
            st = ndm__fail((ndm_status)all[r].status, api, site, "rank %d: %s", r,
                           all[r].msg[0] ? all[r].msg : ndm_status_str((ndm_status)all[r].status));
        }
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
        } else if (o->ndim != z->ndim || o->numel != z->numel ||
                   memcmp(o->shape, z->shape, sizeof z->shape)) {
            shape_str(z, s0, sizeof s0);
            shape_str(o, s1, sizeof s1);
            st = ndm__fail(NDM_E_SHAPE, api, site, "%s: rank 0 has %s and rank %d has %s",
                           kind_name(z->kind), s0, r, s1);
        }
    }
    free(all);
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
static ndm__array *collective_array(ndm_array a, const char *api, ndm__site site,
                                    ndm_status *local)
{
    ndm__array *r = ndm__array_get(a, api, site);
    if (!r) {
        *local = ndm_last_status();
        return NULL;
    }
    if (r->storage->device.type != NDM_DEVICE_CPU) {
        *local = ndm__fail(NDM_E_UNSUPPORTED, api, site,
                           "collectives on CUDA arrays go over NCCL, which needs operations on "
                           "CUDA arrays: not available in this build");
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

/* In-place all-reduce or broadcast over the contiguous array r. */
static ndm_status run_inplace(ndm__dist_group *g, ndm__array *r, ndm_array keep, bool bcast,
                              ndm_dist_op op, int root, const char *api, ndm__site site)
{
    int64_t n = ndm__numel(r->ndim, r->shape);
    char *p = ndm__array_ptr(r);
    size_t es = ndm_dtype_size(r->dtype);
    MPI_Datatype t = ndm__dist_mpi_type(r->dtype);
    MPI_Op mo = ndm__dist_mpi_op(r->dtype, op);
    for (int64_t off = 0; off < n; off += CHUNK) {
        int c = (int)(n - off < CHUNK ? n - off : CHUNK);
        MPI_Request req;
        int rc = bcast ? MPI_Ibcast(p + off * (int64_t)es, c, t, root, g->comm, &req)
                       : MPI_Iallreduce(MPI_IN_PLACE, p + off * (int64_t)es, c, t, mo, g->comm,
                                        &req);
        if (rc != MPI_SUCCESS)
            return ndm__fail(NDM_E_IO, api, site, "%s failed", bcast ? "MPI_Ibcast" : "MPI_Iallreduce");
        ndm_status st = ndm__dist_wait(g, &req, 1, &keep, 1, api, site);
        if (st < 0)
            return st;
    }
    if (!bcast && op == NDM_DIST_MEAN)
        ndm__dist_divide(p, n, r->dtype, g->size);
    return NDM_OK;
}

static ndm_status inplace_collective(ndm_array a, bool bcast, ndm_dist_op op, int root,
                                     ndm__dist_kind kind, const char *api, ndm__site site)
{
    ndm__dist_group *g = ndm__dist_group_get(api, site);
    if (!g)
        return ndm_last_status();
    ndm_status local = NDM_OK;
    ndm__array *r = collective_array(a, api, site, &local);
    if (r && !bcast)
        local = check_op(op, r->dtype, api, site);
    if (r && bcast && (root < 0 || root >= g->size))
        local = ndm__fail(NDM_E_INVALID, api, site, "root %d is not a rank of 0 .. %d", root,
                          g->size - 1);
    /* a strided view goes through a contiguous copy, made before agreeing
     * so that its failure is a local one the other ranks hear of */
    ndm_array tmp = NDM_NULL_ARRAY;
    if (local == NDM_OK && !ndm__is_contiguous(r->ndim, r->shape, r->strides)) {
        tmp = ndm_contiguous_to(NDM_OUTPUT_RULE, a);
        if (!tmp.id)
            local = ndm_last_status();
    }
    ndm_status st = ndm__dist_agree(g, kind, bcast ? root : (int64_t)op, local < 0 ? NULL : r,
                                    local, NULL, api, site);
    if (st == NDM_OK)
        st = tmp.id ? run_inplace(g, ndm__array_peek(tmp), tmp, bcast, op, root, api, site)
                    : run_inplace(g, r, a, bcast, op, root, api, site);
    if (st == NDM_OK && tmp.id)
        st = ndm_copy_into(a, tmp);
    if (tmp.id)
        (void)!ndm_array_release(tmp); /* after a timeout the group keeps its own view */
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
    ndm__array *r = collective_array(a, api, site, &local);
    if (r && scatter)
        local = check_op(op, r->dtype, api, site);
    if (r && local == NDM_OK && r->ndim < 1)
        local = ndm__fail(NDM_E_SHAPE, api, site, "a 0-d array has no first axis to %s along",
                          scatter ? "scatter" : "gather");
    if (r && local == NDM_OK && scatter && r->shape[0] % g->size)
        local = ndm__fail(NDM_E_SHAPE, api, site,
                          "the first axis (%" PRId64 ") is not divisible by the %d ranks",
                          r->shape[0], g->size);
    ndm_array src = NDM_NULL_ARRAY, res = NDM_NULL_ARRAY;
    if (local == NDM_OK && !ndm__is_contiguous(r->ndim, r->shape, r->strides)) {
        src = ndm_contiguous_to(NDM_OUTPUT_RULE, a);
        if (!src.id)
            local = ndm_last_status();
    }
    if (local == NDM_OK) {
        int64_t small[REC_DIMS], *shape = small;
        if (r->ndim > REC_DIMS && !(shape = malloc((size_t)r->ndim * sizeof *shape)))
            local = ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        if (local == NDM_OK) {
            memcpy(shape, r->shape, (size_t)r->ndim * sizeof *shape);
            if (shape[0] > INT64_MAX / g->size) {
                local = ndm__fail(NDM_E_OVERFLOW, api, site, "the gathered size overflows");
            } else {
                shape[0] = scatter ? shape[0] / g->size : shape[0] * g->size;
                /* checks come before allocation: a refused manager is a local failure */
                ndm_manager m = ndm__output_manager(out, r, api, site);
                res = m.id ? ndm__array_new(site, api, m, r->dtype, r->ndim, shape, NULL)
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
        ndm__array *s = src.id ? ndm__array_peek(src) : r;
        ndm__array *d = ndm__array_peek(res);
        int64_t n = ndm__numel(s->ndim, s->shape);
        int64_t part = scatter ? n / g->size : n;
        MPI_Datatype t = ndm__dist_mpi_type(r->dtype);
        MPI_Request req;
        int rc;
        if (part > INT32_MAX) {
            st = ndm__fail(NDM_E_OVERFLOW, api, site,
                           "%" PRId64 " elements per rank: MPI counts stop at 2^31-1", part);
        } else {
            if (scatter)
                rc = MPI_Ireduce_scatter_block(ndm__array_ptr(s), ndm__array_ptr(d), (int)part, t,
                                               ndm__dist_mpi_op(r->dtype, op), g->comm, &req);
            else
                rc = MPI_Iallgather(ndm__array_ptr(s), (int)part, t, ndm__array_ptr(d), (int)part,
                                    t, g->comm, &req);
            if (rc != MPI_SUCCESS)
                st = ndm__fail(NDM_E_IO, api, site, "%s failed",
                               scatter ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather");
            else {
                ndm_array keep[2] = {src.id ? src : a, res};
                st = ndm__dist_wait(g, &req, 1, keep, 2, api, site);
            }
        }
        if (st == NDM_OK && scatter && op == NDM_DIST_MEAN)
            ndm__dist_divide(ndm__array_ptr(d), part, r->dtype, g->size);
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
