/* Host execution's NCCL (test-only): communicators between processes on one
 * machine through a POSIX shared-memory segment, collectives by copy. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <new>

#include "hx.h"
#include "nccl.h"
#include "../../lib/base/convert_scalar.h"

using namespace ndm__hx;

/* Each rank's slot: a collective moves buffers through it in pieces. */
static const size_t SLOT = (size_t)1 << 20;

/* The segment's start: who has come, and the barrier. Plain integers used
 * only through atomic builtins, which are address-free across processes. */
struct seg_head {
    int32_t nranks;   /* set by the first rank in; the others must agree */
    int32_t joined;   /* ranks that have mapped the segment */
    int32_t aborted;  /* a rank gave up waiting: the others stop too */
    uint32_t count;   /* ranks at the barrier */
    uint32_t gen;     /* barriers completed */
};
static const size_t HEAD = 64;

struct ndm__hx_nccl_comm {
    seg_head *h;
    char *slots;
    size_t map_bytes;
    int nranks, rank, device;
};

static double timeout_s()
{
    const char *s = getenv("NDM_HX_NCCL_TIMEOUT_S");
    double v = s && *s ? atof(s) : 0;
    return v > 0 ? v : 60.0;
}

static double now_s()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Wait until *p reaches at least `want` (or moves off `from`, for the
 * barrier), bounded: false, with the segment marked aborted, on a timeout
 * or when another rank gave up. The core is offered to others while
 * waiting: ranks may share cores. */
template <class Done> static bool wait_for(seg_head *h, Done done)
{
    double deadline = 0;
    for (unsigned spins = 0; !done(); spins++) {
        if (__atomic_load_n(&h->aborted, __ATOMIC_ACQUIRE))
            return false;
        if (spins < 256) {
            sched_yield();
            continue;
        }
        double t = now_s();
        if (!deadline) {
            deadline = t + timeout_s();
        } else if (t > deadline) {
            __atomic_store_n(&h->aborted, 1, __ATOMIC_RELEASE);
            return false;
        }
        struct timespec nap = {0, 50000};
        nanosleep(&nap, nullptr);
    }
    return true;
}

/* A sense-reversing barrier over the segment. */
static bool barrier(ndm__hx_nccl_comm *c)
{
    seg_head *h = c->h;
    uint32_t g = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&h->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)c->nranks) {
        __atomic_store_n(&h->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->gen, g + 1, __ATOMIC_RELEASE);
        return true;
    }
    return wait_for(h, [&] { return __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) != g; });
}

static char *slot(ndm__hx_nccl_comm *c, int r) { return c->slots + (size_t)r * SLOT; }

/* ---- ids and communicators ------------------------------------------------ */

extern "C" const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (a rank did not come in time, or "
                                 "shared memory failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    uint64_t r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&r, sizeof r, 1, f) != 1) {
        if (f)
            fclose(f);
        return ncclSystemError;
    }
    fclose(f);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/ndm-hx-nccl-%ld-%016llx", (long)getpid(),
             (unsigned long long)r);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    if (!out || nranks < 1 || rank < 0 || rank >= nranks || id.internal[0] != '/' ||
        !memchr(id.internal, 0, sizeof id.internal))
        return ncclInvalidArgument;
    *out = nullptr;
    size_t bytes = HEAD + (size_t)nranks * SLOT;
    int fd = shm_open(id.internal, O_CREAT | O_RDWR, 0600);
    if (fd < 0)
        return ncclSystemError;
    /* grow only: a rank that comes later must not cut what others mapped */
    struct stat st;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < bytes && ftruncate(fd, (off_t)bytes) != 0)) {
        close(fd);
        shm_unlink(id.internal);
        return ncclSystemError;
    }
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(id.internal);
        return ncclSystemError;
    }
    ndm__hx_nccl_comm *c = new (std::nothrow) ndm__hx_nccl_comm;
    if (!c) {
        munmap(p, bytes);
        return ncclSystemError;
    }
    c->h = (seg_head *)p;
    c->slots = (char *)p + HEAD;
    c->map_bytes = bytes;
    c->nranks = nranks;
    c->rank = rank;
    c->device = current_device();
    int32_t zero = 0;
    if (!__atomic_compare_exchange_n(&c->h->nranks, &zero, nranks, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE) &&
        zero != nranks) {
        __atomic_store_n(&c->h->aborted, 1, __ATOMIC_RELEASE);
        munmap(p, bytes);
        delete c;
        return ncclInvalidUsage;
    }
    __atomic_add_fetch(&c->h->joined, 1, __ATOMIC_ACQ_REL);
    seg_head *h = c->h;
    bool met = wait_for(h, [&] { return __atomic_load_n(&h->joined, __ATOMIC_ACQUIRE) >= nranks; });
    /* every rank has it mapped (or one gave up): the name is no longer needed */
    if (rank == 0 || !met)
        shm_unlink(id.internal);
    if (!met) {
        munmap(p, bytes);
        delete c;
        return ncclSystemError;
    }
    *out = c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclInvalidArgument;
    munmap(c->h, c->map_bytes);
    delete c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t c, int *count)
{
    if (!c || !count)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank)
{
    if (!c || !rank)
        return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

/* ---- element types and reductions --------------------------------------- */

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    }
    return 0;
}

template <class T> static T combine(T a, T b, ncclRedOp_t op)
{
    switch (op) {
    case ncclSum: return (T)(a + b);
    case ncclProd: return (T)(a * b);
    case ncclMax: return b > a || b != b ? b : a;
    case ncclMin: return b < a || b != b ? b : a;
    case ncclAvg: break;
    }
    return a;
}

/* dst[i] = slot 0 op slot 1 op ... in rank order, for the n elements at
 * element offset `at` of every slot; f16 and bf16 round after each step. */
template <class T>
static void reduce_typed(ndm__hx_nccl_comm *c, void *dst, size_t at, size_t n, ncclRedOp_t op)
{
    T *d = (T *)dst;
    for (size_t i = 0; i < n; i++) {
        T acc = ((const T *)slot(c, 0))[at + i];
        for (int r = 1; r < c->nranks; r++)
            acc = combine(acc, ((const T *)slot(c, r))[at + i], op);
        d[i] = acc;
    }
}

template <bool BF>
static void reduce_half(ndm__hx_nccl_comm *c, void *dst, size_t at, size_t n, ncclRedOp_t op)
{
    uint16_t *d = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = ((const uint16_t *)slot(c, 0))[at + i];
        float acc = BF ? ndm__bf16_to_f32(h) : ndm__f16_to_f32(h);
        for (int r = 1; r < c->nranks; r++) {
            uint16_t x = ((const uint16_t *)slot(c, r))[at + i];
            acc = combine(acc, BF ? ndm__bf16_to_f32(x) : ndm__f16_to_f32(x), op);
            acc = BF ? ndm__bf16_to_f32(ndm__f32_to_bf16(acc))
                     : ndm__f16_to_f32(ndm__f32_to_f16(acc));
        }
        d[i] = BF ? ndm__f32_to_bf16(acc) : ndm__f32_to_f16(acc);
    }
}

static void reduce_slots(ndm__hx_nccl_comm *c, void *dst, size_t at, size_t n, ncclDataType_t t,
                         ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8: reduce_typed<int8_t>(c, dst, at, n, op); break;
    case ncclUint8: reduce_typed<uint8_t>(c, dst, at, n, op); break;
    case ncclInt32: reduce_typed<int32_t>(c, dst, at, n, op); break;
    case ncclUint32: reduce_typed<uint32_t>(c, dst, at, n, op); break;
    case ncclInt64: reduce_typed<int64_t>(c, dst, at, n, op); break;
    case ncclUint64: reduce_typed<uint64_t>(c, dst, at, n, op); break;
    case ncclFloat16: reduce_half<false>(c, dst, at, n, op); break;
    case ncclBfloat16: reduce_half<true>(c, dst, at, n, op); break;
    case ncclFloat32: reduce_typed<float>(c, dst, at, n, op); break;
    case ncclFloat64: reduce_typed<double>(c, dst, at, n, op); break;
    }
}

/* ---- collectives ------------------------------------------------------------ */

/* The checks every collective makes, and its stream's queued work done:
 * device memory only, as NCCL requires. */
static ncclResult_t begin(ncclComm_t c, const void *a, size_t an, const void *b, size_t bn,
                          ncclDataType_t t, cudaStream_t s)
{
    if (!c || !type_size(t))
        return ncclInvalidArgument;
    if ((an && !is_device_range(a, an)) || (bn && !is_device_range(b, bn)))
        return ncclInvalidArgument;
    if (__atomic_load_n(&c->h->aborted, __ATOMIC_ACQUIRE))
        return ncclSystemError;
    return cudaStreamSynchronize(s) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

extern "C" ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    size_t es = type_size(t);
    if (op == ncclAvg)
        return ncclInvalidArgument;
    ncclResult_t rc = begin(c, send, count * es, recv, count * es, t, s);
    if (rc != ncclSuccess)
        return rc;
    size_t per = SLOT / es;
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(slot(c, c->rank), (const char *)send + off * es, n * es);
        if (!barrier(c))
            return ncclSystemError;
        reduce_slots(c, (char *)recv + off * es, 0, n, t, op);
        if (!barrier(c))
            return ncclSystemError;
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      int root, ncclComm_t c, cudaStream_t s)
{
    size_t es = type_size(t);
    if (c && (root < 0 || root >= c->nranks))
        return ncclInvalidArgument;
    /* only the root's send buffer is read */
    bool is_root = c && c->rank == root;
    ncclResult_t rc = begin(c, send, is_root ? count * es : 0, recv, count * es, t, s);
    if (rc != ncclSuccess)
        return rc;
    size_t per = SLOT / es;
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        if (c->rank == root)
            memcpy(slot(c, root), (const char *)send + off * es, n * es);
        if (!barrier(c))
            return ncclSystemError;
        memmove((char *)recv + off * es, slot(c, root), n * es);
        if (!barrier(c))
            return ncclSystemError;
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      ncclComm_t c, cudaStream_t s)
{
    size_t es = type_size(t);
    size_t all = c ? count * es * (size_t)c->nranks : 0;
    ncclResult_t rc = begin(c, send, count * es, recv, all, t, s);
    if (rc != ncclSuccess)
        return rc;
    size_t per = SLOT / es;
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(slot(c, c->rank), (const char *)send + off * es, n * es);
        if (!barrier(c))
            return ncclSystemError;
        for (int r = 0; r < c->nranks; r++)
            memcpy((char *)recv + ((size_t)r * count + off) * es, slot(c, r), n * es);
        if (!barrier(c))
            return ncclSystemError;
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                          ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                          cudaStream_t s)
{
    size_t es = type_size(t);
    if (op == ncclAvg)
        return ncclInvalidArgument;
    size_t all = c ? count * es * (size_t)c->nranks : 0;
    ncclResult_t rc = begin(c, send, all, recv, count * es, t, s);
    if (rc != ncclSuccess)
        return rc;
    /* pieces over the whole send buffer; each rank reduces the part of a
     * piece that falls in its block [rank * count, (rank + 1) * count) */
    size_t total = count * (size_t)c->nranks, per = SLOT / es;
    size_t lo = (size_t)c->rank * count, hi = lo + count;
    for (size_t off = 0; off < total; off += per) {
        size_t n = total - off < per ? total - off : per;
        memcpy(slot(c, c->rank), (const char *)send + off * es, n * es);
        if (!barrier(c))
            return ncclSystemError;
        size_t a = off > lo ? off : lo, b = off + n < hi ? off + n : hi;
        if (a < b)
            reduce_slots(c, (char *)recv + (a - lo) * es, a - off, b - a, t, op);
        if (!barrier(c))
            return ncclSystemError;
    }
    return ncclSuccess;
}
