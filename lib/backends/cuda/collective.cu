/* Collectives between processes on CUDA arrays, over NCCL: the module's
 * ndm__backend_collective table, which the process group bootstraps.
 * Without NCCL (NDM_HAVE_NCCL 0) the file is empty and the slot NULL. */
#include <new>
#include <type_traits>

#include "common.cuh"
#include "iter.cuh"

#if NDM_HAVE_NCCL
#include <nccl.h>

/* A communicator and the device it was made on: every call enters that
 * device and queues on the thread's current stream there. */
struct ndm__cuda_comm {
    ncclComm_t nc;
    int device;
};

static ndm_status nccl_fail(const char *what, ncclResult_t rc)
{
    /* an unhandled CUDA error inside NCCL is the device's; the rest is usage
     * or the system (network, another rank gone) */
    return ndm__cuda_fail(NDM_E_DEVICE, "%s failed: %s (NCCL error %d)", what,
                          ncclGetErrorString(rc), (int)rc);
}

/* NCCL's element type for a dtype: bool as one byte (reduced with max). */
static bool nccl_type(ndm_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8: *out = ncclUint8; return true;
    case NDM_I32: *out = ncclInt32; return true;
    case NDM_I64: *out = ncclInt64; return true;
    case NDM_F16: *out = ncclFloat16; return true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case NDM_BF16: *out = ncclBfloat16; return true;
#else
    case NDM_BF16: break;
#endif
    case NDM_F32: *out = ncclFloat32; return true;
    case NDM_F64: *out = ncclFloat64; return true;
    }
    return false;
}

/* What a collective runs with: its communicator, NCCL's type for the dtype
 * and the device's current stream. */
typedef struct coll_call {
    ndm__cuda_comm *c;
    ncclDataType_t t;
    cudaStream_t s;
} coll_call;

static ndm_status enter(void *comm, ndm_dtype dt, coll_call *k)
{
    k->c = (ndm__cuda_comm *)comm;
    if (!nccl_type(dt, &k->t))
        return ndm__cuda_fail(NDM_E_UNSUPPORTED, "NCCL %d.%d cannot move elements of dtype %s",
                              NCCL_MAJOR, NCCL_MINOR, dt == NDM_BF16 ? "bf16" : "?");
    return ndm__cuda_enter(k->c->device, &k->s);
}

static ncclRedOp_t nccl_op(ndm_dtype dt, ndm__coll_op op)
{
    return dt == NDM_BOOL || op == NDM__COLL_MAX ? ncclMax : ncclSum;
}

/* ---- the mean: the sum divided by the group size, on the device ---------- */

/* As the CPU path divides (lib/dist): integers truncate, f16 and bf16 go
 * through f32, f32 divides by a float, f64 by a double. */
template <class D> struct ndm__cu_divisor {
    typedef decltype(D::ld(typename D::T())) V;
    typedef typename std::conditional<std::is_floating_point<V>::value, V, int64_t>::type type;
};

template <class D>
__global__ void ndm__k_coll_divide(typename D::T *p, int64_t n, int size)
{
    typedef typename ndm__cu_divisor<D>::type Q;
    NDM__CU_LOOP(int64_t, i, n)
    p[i] = D::st((Q)D::ld(p[i]) / (Q)size);
}

static ndm_status divide(int device, cudaStream_t s, void *p, size_t n, ndm_dtype dt, int size)
{
    if (n == 0 || size == 1)
        return NDM_OK;
    switch (dt) {
#define X(E)                                                                    \
    case E:                                                                     \
        NDM__LAUNCH(ndm__cuda_blocks((int64_t)n), NDM__CUDA_THREADS, 0, s,      \
                    ndm__k_coll_divide<ndm__cu_dt<E>>)(                         \
            (ndm__cu_dt<E>::T *)p, (int64_t)n, size);                           \
        NDM__CUDA_LAUNCHED(device, "ndm__k_coll_divide");                       \
        return NDM_OK;
        NDM__CU_DTYPES(X)
#undef X
    }
    return ndm__cuda_fail(NDM_E_DTYPE, "dtype %d has no mean", (int)dt);
}

/* ---- the table ------------------------------------------------------------ */

static ndm_status coll_unique_id(void *id)
{
    ncclUniqueId u;
    ncclResult_t rc = ncclGetUniqueId(&u);
    if (rc != ncclSuccess)
        return nccl_fail("ncclGetUniqueId", rc);
    memcpy(id, &u, sizeof u);
    return NDM_OK;
}

static ndm_status coll_comm_new(const void *id, int size, int rank, int device, void **out)
{
    *out = NULL;
    cudaStream_t s;
    ndm_status st = ndm__cuda_enter(device, &s); /* NCCL binds the current device */
    if (st < 0)
        return st;
    ndm__cuda_comm *c = new (std::nothrow) ndm__cuda_comm;
    if (!c)
        return ndm__cuda_fail(NDM_E_OOM, "no memory for a NCCL communicator");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t rc = ncclCommInitRank(&c->nc, size, u, rank);
    if (rc != ncclSuccess) {
        delete c;
        return nccl_fail("ncclCommInitRank", rc);
    }
    c->device = device;
    *out = c;
    return NDM_OK;
}

static void coll_comm_free(void *comm)
{
    ndm__cuda_comm *c = (ndm__cuda_comm *)comm;
    if (!c)
        return;
    /* its work first: destroying a communicator with work queued is NCCL's
     * undefined case */
    (void)cudaSetDevice(c->device);
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    (void)ncclCommDestroy(c->nc);
    delete c;
}

/* After a reduction queued on s: a mean is the sum divided on the device
 * by the communicator's size. */
static ndm_status finish(ndm__cuda_comm *c, cudaStream_t s, void *buf, size_t n, ndm_dtype dt,
                         ndm__coll_op op)
{
    if (op != NDM__COLL_MEAN)
        return NDM_OK;
    int size = 0;
    ncclResult_t rc = ncclCommCount(c->nc, &size);
    return rc == ncclSuccess ? divide(c->device, s, buf, n, dt, size)
                             : nccl_fail("ncclCommCount", rc);
}

static ndm_status coll_all_reduce(void *comm, void *buf, size_t n, ndm_dtype dt, ndm__coll_op op)
{
    coll_call k;
    ndm_status st = enter(comm, dt, &k);
    if (st < 0 || n == 0)
        return st;
    ncclResult_t rc = ncclAllReduce(buf, buf, n, k.t, nccl_op(dt, op), k.c->nc, k.s);
    return rc == ncclSuccess ? finish(k.c, k.s, buf, n, dt, op) : nccl_fail("ncclAllReduce", rc);
}

static ndm_status coll_broadcast(void *comm, void *buf, size_t n, ndm_dtype dt, int root)
{
    coll_call k;
    ndm_status st = enter(comm, dt, &k);
    if (st < 0 || n == 0)
        return st;
    ncclResult_t rc = ncclBroadcast(buf, buf, n, k.t, root, k.c->nc, k.s);
    return rc == ncclSuccess ? NDM_OK : nccl_fail("ncclBroadcast", rc);
}

static ndm_status coll_all_gather(void *comm, const void *send, void *recv, size_t n, ndm_dtype dt)
{
    coll_call k;
    ndm_status st = enter(comm, dt, &k);
    if (st < 0 || n == 0)
        return st;
    ncclResult_t rc = ncclAllGather(send, recv, n, k.t, k.c->nc, k.s);
    return rc == ncclSuccess ? NDM_OK : nccl_fail("ncclAllGather", rc);
}

static ndm_status coll_reduce_scatter(void *comm, const void *send, void *recv, size_t n,
                                      ndm_dtype dt, ndm__coll_op op)
{
    coll_call k;
    ndm_status st = enter(comm, dt, &k);
    if (st < 0 || n == 0)
        return st;
    ncclResult_t rc = ncclReduceScatter(send, recv, n, k.t, nccl_op(dt, op), k.c->nc, k.s);
    return rc == ncclSuccess ? finish(k.c, k.s, recv, n, dt, op)
                             : nccl_fail("ncclReduceScatter", rc);
}

extern "C" const ndm__backend_collective ndm__cuda_collective = {
    .id_bytes = sizeof(ncclUniqueId),
    .unique_id = coll_unique_id,
    .comm_new = coll_comm_new,
    .comm_free = coll_comm_free,
    .all_reduce = coll_all_reduce,
    .broadcast = coll_broadcast,
    .all_gather = coll_all_gather,
    .reduce_scatter = coll_reduce_scatter,
};

#endif
