/* The private backend interface: a table of kernels per device type.
 * Dispatchers in lib/ops/ validate, apply the output rule and allocate; kernels
 * see raw pointers, shapes and strides only, never handles or managers. */
#ifndef NDM_BACKEND_H
#define NDM_BACKEND_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ndm/device.h"
#include "ndm/dtype.h"
#include "ndm/status.h"

#include "../base/compiler.h"
#include "../base/segment.h"

/* The layout of ndm__backend, ndm__host_api and the family tables: a module
 * built against another value is refused when loaded. */
#define NDM__BACKEND_ABI 6

/* A kernel's view of an array: `data` points at the first element; strides
 * count elements and may be 0 (broadcast) or negative (flipped views). */
typedef struct ndm__tensor {
    void *data;
    ndm_dtype dtype;
    int ndim;
    const int64_t *shape;
    const int64_t *strides;
} ndm__tensor;

/* What a backend tells of one of its devices. */
typedef struct ndm__device_props {
    char name[128];        /* the GPU's or the CPU's model name */
    uint64_t memory_bytes; /* total memory of the device; 0 when unknown */
    int cc_major;          /* CUDA compute capability; 0.0 elsewhere */
    int cc_minor;
    char features[128];    /* CPU: instruction-set extensions in use, "" elsewhere */
} ndm__device_props;

/* The families of operations, as supports() is asked about them. */
typedef enum ndm__op_family {
    NDM__OPS_CORE,   /* copy, fill, iota: the table's required members */
    NDM__OPS_EW,
    NDM__OPS_REDUCE,
    NDM__OPS_LINALG,
    NDM__OPS_INDEX,
    NDM__OPS_NN,
    NDM__OPS_RANDOM,
} ndm__op_family;

/* Operand layouts of a call, as bits: a backend may run some only. */
#define NDM__LAYOUT_STRIDED 1u   /* an operand is not one dense run */
#define NDM__LAYOUT_BROADCAST 2u /* an input has a stride 0 over a longer axis */
#define NDM__LAYOUT_EMPTY 4u     /* no element */

/* One case a dispatcher is about to run: `op` is the family's operation
 * (its enum value; 0 for a core member, which `name` tells apart), dtypes
 * are the operands' (the output first; an elementwise case carries its
 * inputs' only, asked before the result's is known). */
#define NDM__OP_MAX_OPERANDS 4
typedef struct ndm__op_case {
    ndm__op_family family;
    int op;
    const char *name;
    unsigned layout;
    int ndtypes;
    ndm_dtype dtypes[NDM__OP_MAX_OPERANDS];
} ndm__op_case;

/* Test hooks of a backend, reached through its table (a module exports
 * nothing else). NULL members: the backend has no such hook. */
typedef struct ndm__backend_test {
    /* Mark a device as failed (as an asynchronous fault would) or clear that
     * mark; a real fault cannot be cleared. */
    void (*set_sticky)(int device, bool on);
    /* Launch work that faults asynchronously: the launch reports success, and
     * the device is lost to this process. */
    ndm_status (*fault)(int device);
    /* The backend's copy and fill plans run by a host loop on host memory, so
     * the CPU checks conversions and index math without the device. */
    ndm_status (*copy_on_host)(const ndm__tensor *dst, const ndm__tensor *src);
    ndm_status (*fill_on_host)(const ndm__tensor *dst, double value);
    /* Hold back the work of a stream (the stream table's value; NULL: the
     * default) so that events recorded on it stay pending until released
     * (on == false). Only where the device can be told so (a stand-in). */
    void (*stream_hold)(int device, void *stream, bool on);
    /* Calls into the device runtime's allocator (cudaMalloc, cudaFree, their
     * Async and host forms) made since the module loaded from anywhere but
     * its segment source, which alone may call them; the file of the last
     * one into where (n bytes). Only where the runtime can count them (a
     * stand-in); NULL elsewhere. */
    long (*runtime_alloc_calls)(char *where, size_t n);
} ndm__backend_test;

/* Streams and events of a backend whose devices run work asynchronously.
 * Streams and events are the backend's own values; NULL names the device's
 * default stream. A backend without this table (the CPU) does its work
 * before its calls return: its streams and events are always complete. */
typedef struct ndm__backend_streams {
    /* a new stream on `device` (its work is not ordered with the default
     * stream's); release it when done */
    ndm_status (*stream_new)(int device, void **out);
    void (*stream_release)(int device, void *stream);
    /* wait for everything queued on the stream */
    ndm_status (*stream_sync)(int device, void *stream);
    /* *done: everything queued on the stream has run */
    ndm_status (*stream_query)(int device, void *stream, bool *done);
    /* the stream the calling thread's work on `device` goes to from now on */
    void (*stream_set_current)(int device, void *stream);
    ndm_status (*event_new)(int device, void **out);
    void (*event_release)(int device, void *event);
    /* mark the point the stream has reached now */
    ndm_status (*event_record)(int device, void *event, void *stream);
    /* *done: the stream has passed the point recorded (true if never recorded) */
    ndm_status (*event_query)(int device, void *event, bool *done);
    ndm_status (*event_sync)(int device, void *event);
    /* work queued on `stream` from now on waits for the event's point */
    ndm_status (*stream_wait_event)(int device, void *stream, void *event);
} ndm__backend_streams;

/* Collectives between processes on a backend's devices (NCCL on CUDA),
 * for the process group (lib/dist), which bootstraps them: rank 0 makes a
 * unique id, the group broadcasts its bytes, every rank makes its
 * communicator from them. Every member is required when the table is
 * given; a member may answer NDM_E_UNSUPPORTED with a message (a module
 * built without NCCL, a dtype the library cannot move). Work is queued on
 * the calling thread's current stream of the communicator's device, in
 * order with the kernels there; counts are elements. A bool travels as
 * one byte reduced with max (sum and max are both "any"). */
typedef enum ndm__coll_op {
    NDM__COLL_SUM,
    NDM__COLL_MAX,
    NDM__COLL_MEAN, /* sum, then divided by the group size on the device
                     * (integers truncate, as C's division) */
} ndm__coll_op;

#define NDM__COLL_ID_MAX 256 /* the largest id_bytes a group can bootstrap */

typedef struct ndm__backend_collective {
    size_t id_bytes; /* the size of a unique id, at most NDM__COLL_ID_MAX */
    /* rank 0's part of the bootstrap: a fresh id into id (id_bytes) */
    ndm_status (*unique_id)(void *id);
    /* this rank's communicator among `size` ranks on `device`: a call every
     * rank makes with the same id, which returns once all have come (or
     * fails); release it with comm_free */
    ndm_status (*comm_new)(const void *id, int size, int rank, int device, void **comm);
    void (*comm_free)(void *comm);
    /* in place over n elements at buf */
    ndm_status (*all_reduce)(void *comm, void *buf, size_t n, ndm_dtype dt, ndm__coll_op op);
    ndm_status (*broadcast)(void *comm, void *buf, size_t n, ndm_dtype dt, int root);
    /* recv (n * size elements) = every rank's send (n elements), in rank order */
    ndm_status (*all_gather)(void *comm, const void *send, void *recv, size_t n, ndm_dtype dt);
    /* recv (n elements) = the reduction of every rank's send[rank * n ...] */
    ndm_status (*reduce_scatter)(void *comm, const void *send, void *recv, size_t n,
                                 ndm_dtype dt, ndm__coll_op op);
} ndm__backend_collective;

/* Device graphs (CUDA graphs) of a backend with streams. Between
 * capture_begin and capture_end, the work the calling thread queues on
 * `device` goes to a private stream in capture (thread-local mode), where it
 * is recorded instead of run; launching the graph runs that work again, in
 * its order, on a stream. A call the device cannot capture (one that waits
 * for the device or the host, or allocates device or pinned memory) fails
 * while capturing with NDM_E_UNSUPPORTED ("cannot be captured"), never a
 * sticky device error, and the capture fails at its end. */
typedef struct ndm__backend_graphs {
    /* begin: *capture is the capturing stream, now the thread's current one
     * on `device` (the allocator's current stream is the caller's to set) */
    ndm_status (*capture_begin)(int device, void **capture);
    /* end the capture begun by this thread: the instantiated graph into
     * *graph and its node count into *nodes, or NULL and the error (an
     * invalidated capture: NDM_E_UNSUPPORTED); in every case the capture
     * stream is given back and `restore` (the stream table's value, NULL:
     * the default) is the thread's current stream again */
    ndm_status (*capture_end)(int device, void *capture, void *restore, void **graph,
                              size_t *nodes);
    /* queue the graph's work on `stream` (NULL: the default) */
    ndm_status (*launch)(int device, void *graph, void *stream);
    /* free the graph (a launch already queued still runs) */
    void (*destroy)(int device, void *graph);
} ndm__backend_graphs;

/* Operation families. Each is declared in its own header under lib/backends/
 * and filled by the backends that provide it. */
struct ndm__backend_ew;     /* elementwise and casts */
struct ndm__backend_reduce; /* reductions, softmax */
struct ndm__backend_linalg; /* matmul */
struct ndm__backend_index;  /* gather, scatter, concat, ... */
struct ndm__backend_nn;     /* conv, pooling */
struct ndm__backend_random; /* generators */

typedef struct ndm__backend {
    uint32_t abi;          /* NDM__BACKEND_ABI */
    const char *name;      /* "cpu", "cuda" */
    ndm_device_type type;  /* identity: never compare function pointers */

    /* required except for the CPU: devices of this type on this machine, 0
     * without a driver or a device (never an abort); asked often, so cached. */
    int (*device_count)(void);
    /* optional: what device `device` is; NDM_E_DEVICE for one that is not
     * there. Default: the name of the type and nothing else. */
    ndm_status (*device_props)(int device, ndm__device_props *out);
    /* required except for the CPU (whose source is the allocator's own): the
     * segment source of device `device`, NULL for one that is not there. */
    const ndm__segment_source *(*segment_source)(int device);
    /* optional: false when this backend declines case `c` on `device`; the
     * dispatcher then fails with NDM_E_UNSUPPORTED naming the op, its dtypes
     * and the device. Default (NULL): it runs whatever its families offer,
     * and the dispatcher pays one pointer test. */
    bool (*supports)(int device, const ndm__op_case *c);

    /* required: dst = src converted to dst's dtype, element by element over
     * dst's shape. src has the same shape; its strides may be 0. dst's
     * elements do not overlap each other or src's. Any dtype pair. */
    ndm_status (*copy)(int device, const ndm__tensor *dst, const ndm__tensor *src);
    /* required: every element of dst = value converted as copy would. */
    ndm_status (*fill)(int device, const ndm__tensor *dst, double value);
    /* required: 1-d dst[i] = start + i * step, computed in double, converted. */
    ndm_status (*iota)(int device, const ndm__tensor *dst, double start, double step);
    /* required: n contiguous bytes between host memory and this device. */
    ndm_status (*upload)(int device, void *dst, const void *src_host, size_t n);
    ndm_status (*download)(int device, void *dst_host, const void *src, size_t n);
    /* optional: wait for queued work. Default: none (synchronous backend). */
    ndm_status (*sync)(int device);
    /* optional: n contiguous bytes from `src` on device `src_device` to `dst` on
     * `device`, both devices of this backend; returns when the bytes have
     * arrived. Default: a bounce through host memory (download, upload). */
    ndm_status (*peer_copy)(int device, void *dst, int src_device, const void *src, size_t n);

    /* Families; NULL when the backend provides none (the dispatcher then
     * fails with NDM_E_UNSUPPORTED). */
    const struct ndm__backend_ew *ew;
    const struct ndm__backend_reduce *reduce;
    const struct ndm__backend_linalg *linalg;
    const struct ndm__backend_index *index;
    const struct ndm__backend_nn *nn;
    const struct ndm__backend_random *random;

    const ndm__backend_test *test; /* NULL: none */

    /* optional: streams and events (see ndm__backend_streams); NULL: none */
    const ndm__backend_streams *streams;
    /* optional: page-locked host memory for transfers, as a segment source
     * the allocator caches (event-guarded reuse through its events); NULL:
     * none (transfers use pageable memory) */
    const ndm__segment_source *(*pinned_source)(int device);
    /* optional: collectives between processes (ndm__backend_collective);
     * NULL: none (collectives on its arrays are NDM_E_UNSUPPORTED) */
    const ndm__backend_collective *collective;
    /* optional: device graphs (ndm__backend_graphs); NULL: none (capture is
     * NDM_E_UNSUPPORTED) */
    const ndm__backend_graphs *graphs;
} ndm__backend;

/* ---- modules ----------------------------------------------------------------
 *
 * A backend outside libndm (the CUDA backend, libndm-cuda.so) is a shared
 * module that links nothing of libndm: what it needs of the library comes in
 * this table, handed to its one exported entry point. */

typedef struct ndm__host_api {
    uint32_t abi; /* NDM__BACKEND_ABI of the library: first, in every version */
    /* Record a failure for the calling thread, as every ndm error is
     * recorded (ndm_last_status, ndm_last_error); returns st. */
    ndm_status (*vfail)(ndm_status st, const char *fmt, va_list ap);
    size_t (*dtype_size)(ndm_dtype t);
    bool (*dtype_valid)(ndm_dtype t);
    /* Kernel scratch (see ndm__scratch_alloc below): the module's only way
     * to take memory for a temporary. */
    ndm_status (*scratch_alloc)(ndm_device_type type, int device, size_t bytes, void **out);
    void (*scratch_free)(ndm_device_type type, int device, void *p);
} ndm__host_api;

/* The entry point of a backend module: its table, or NULL when it cannot
 * serve this library (an ABI it was not built for; the failure recorded
 * through host->vfail when host->abi matches). Called once per process. */
typedef const ndm__backend *(*ndm__backend_entry)(const ndm__host_api *host);
#define NDM__CUDA_MODULE "libndm-cuda.so"
#define NDM__CUDA_ENTRY "ndm_backend_cuda_register"

/* ---- kernel scratch -----------------------------------------------------------
 *
 * Every temporary a kernel needs that grows with its operands (partial sums,
 * packed panels, dense copies, per-element indices) comes from ndm's caching
 * allocator through these calls, never from malloc or the device runtime: so
 * it is counted in ndm_memory_stats, in the limits of the operation's output
 * manager, on the allocator's pressure ladder (callbacks, retry, the OOM
 * message naming the managers holding memory) and in history and snapshots,
 * under the operation's public name and its caller's line. Bookkeeping sized
 * by the rank may stay on the stack (or malloc past a stack array).
 *
 * The charge goes to the calling thread's current operation context, which
 * the dispatcher of an operation whose kernels take scratch sets around the
 * kernel call (NDM__WITH_OP_CONTEXT, lib/ops/dispatch.h), and which the CPU
 * pool's workers take from the thread that submitted the job (today:
 * matmul, linear, the reductions, softmax, conv2d and its gradients, and the
 * index range check, whose few bytes name the operation but charge no
 * manager). Without one (a kernel the library calls for itself), scratch is
 * counted by the allocator only, charged to no manager. A charge is a
 * reservation in the limits over the manager while the block lives (the
 * manager's own live bytes count arrays only); history and snapshots tag
 * the block with the manager, the operation and its caller's line.
 *
 * ndm__scratch_alloc: `bytes` (0 allowed) on device (type, device), 64-byte
 * aligned, into *out. On failure *out is NULL and the failure is recorded
 * (NDM_E_OOM from the allocator, or NDM_E_QUOTA from the manager's limit,
 * naming the operation); return it as the kernel's status.
 * ndm__scratch_free: give it back (NULL is ignored), on the thread that took
 * it (its record is that thread's). On a device with streams, both belong to
 * the thread's current stream, the one the kernels between them were queued
 * on: the block serves that stream's requests again at once (its work runs
 * in order), and other streams only once the allocator's events say that
 * work has passed, so freeing after queuing needs no synchronisation. A
 * thread holds at most NDM__SCRATCH_LIVE blocks at a time. */
#define NDM__SCRATCH_LIVE 32
/* The calling thread's operation context: the dispatcher's, which begins
 * with the provider below (lib/ops fills both, since it knows managers;
 * backends only call through the provider and carry the context across
 * threads, as the CPU pool does). NULL: no operation is running here. */
struct ndm__op_context;
typedef struct ndm__scratch_provider {
    ndm_status (*alloc)(const struct ndm__op_context *c, ndm_device_type type, int device,
                        size_t bytes, void **out);
    void (*free)(const struct ndm__op_context *c, ndm_device_type type, int device, void *p);
} ndm__scratch_provider;
#ifndef __cplusplus
/* (lib/backends/scratch.c: through the current context's provider; a
 * module calls them through its host table) */
ndm_status ndm__scratch_alloc(ndm_device_type type, int device, size_t bytes, void **out);
void ndm__scratch_free(ndm_device_type type, int device, void *p);
/* The provider for kernels run outside an operation: installed once, when
 * the library is loaded, by the layer that fills contexts. */
void ndm__scratch_install(const ndm__scratch_provider *p);
extern _Thread_local const struct ndm__op_context *ndm__op_context_current NDM__TLS_MODEL;
#endif

/* The CPU has two tables with the same families: the fast kernels, and the
 * plain C reference kernels they are tested against (and the CUDA backend
 * too). Every family fills both; a fast table may point at reference
 * functions where nothing faster exists. */
extern const ndm__backend ndm__cpu_backend;
extern const ndm__backend ndm__cpu_ref_backend;

/* Test hook: route CPU dispatch to the reference table (process wide). */
void ndm__cpu_force_reference(bool on);

#endif
