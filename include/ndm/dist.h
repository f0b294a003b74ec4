/* ndm dist: a process group over MPI, collectives on arrays in place, and
 * data-parallel training.
 *
 * One process group per process: ndm_dist_init() joins the job that
 * mpirun/srun started (it initialises MPI unless the program already did)
 * and every rank keeps its own manager tree. Collectives work on arrays in
 * place; all-gather and reduce-scatter make their result in a named
 * manager. CPU arrays go over MPI. CUDA arrays go over NCCL, which the
 * CUDA module (libndm-cuda.so) links when NCCL was found at build time
 * (libndm itself links no CUDA library): the first collective on a CUDA
 * array of device cuda:N makes this rank's NCCL communicator for cuda:N
 * (rank 0 makes NCCL's unique id, MPI broadcasts it, every rank joins; a
 * failure on any rank is the same error on every rank and none keeps a
 * communicator), later ones reuse it, and ndm_dist_finalize() frees it.
 * Every rank must then pass a CUDA array of the same device index (the
 * agreement below checks the device as a whole): give each rank its own GPU
 * with CUDA_VISIBLE_DEVICES, as NCCL wants one GPU per rank. The transfer
 * is queued on the calling thread's current stream of that device, in order
 * with the work before and after it there (ndm_stream_set_current); the
 * call returns once it is queued. The dtypes, the operations and their
 * rules are the CPU path's: bool travels as a byte reduced with max (sum
 * and max are both "or"), and the mean is the sum divided on the device,
 * integers truncated. A CUDA module without NCCL makes a collective on a
 * CUDA array NDM_E_UNSUPPORTED on every rank, saying so (and so a
 * data-parallel wrapper of a model on a CUDA device). Without
 * MPI in the build every function here answers NDM_E_UNSUPPORTED with a
 * message (ndm_dist_available() says which build this is).
 *
 * Agreement before communication. Every collective first exchanges one
 * small fixed record per rank (point-to-point messages, ceil(log2 size)
 * rounds): the rank's status, the operation, dtype, shape and device of its
 * array. Then every rank checks the same records, so every rank gives the
 * same answer:
 *   - a rank that arrives with an error (ndm_dist_check(), or a failed
 *     data-parallel step) makes the collective fail on every rank with that
 *     rank's status and message, prefixed "rank N: " (the messages go in a
 *     second exchange, made only then);
 *   - a dtype mismatch is NDM_E_DTYPE, a shape mismatch NDM_E_SHAPE, another
 *     operation or root NDM_E_INVALID, a device mismatch NDM_E_DEVICE, each
 *     naming the lowest rank that differs from rank 0 and both values;
 *   no data moves and the arrays are unchanged.
 * An all-reduce of up to 16 KiB in a group of up to 4 ranks sends its data
 * with the agreement record and every rank sums the ranks' data in rank
 * order (the same bits on every rank), so the call costs one round of
 * messages; any other collective agrees first, then calls MPI.
 * Waits are bounded: the agreement is driven with nonblocking calls and a
 * test loop; a rank that does not take part within NDM_DIST_TIMEOUT_S
 * seconds (default 300; ndm_dist_set_timeout() overrides it) makes the call
 * fail with NDM_E_TIMEOUT. Once every rank has agreed, every rank is
 * present, and the data moves with MPI's own blocking collective
 * (MPI_Allreduce, MPI_Bcast, ...) or NCCL's, at their speed: a rank that
 * dies in that transfer is then mpirun's business, as in any MPI program
 * (mpirun ends the job). After a timeout the group is broken: MPI may
 * still use the abandoned operation's buffers, so the group keeps them (a
 * view of any array, in its "dist" manager under system) and every later
 * collective fails with NDM_E_TIMEOUT; ndm_dist_finalize() waits once more, up to ten
 * timeouts, for the abandoned operations before it finalizes MPI.
 *
 * Data-parallel steps agree once, in ndm_ddp_new(), on the bucket layout;
 * then each step's buckets go straight to MPI_Allreduce on one
 * communication thread per process (started by the first bucket, ended by
 * ndm_dist_finalize()), while backward goes on; the thread waits, asleep,
 * until every rank has reached the bucket, so that MPI's call does not
 * spin on a core backward wants while a rank is late (once ndm_ddp_step()
 * waits, it yields the core between polls instead); each bucket carries a
 * failure flag, and the messages are exchanged only when a flag is set.
 * By choice, when the process has no core for the thread besides its
 * compute threads (NDM_NUM_THREADS, or one per core of its affinity mask;
 * an unbound mask counts as shared by the node's ranks), the thread runs
 * the buckets only while ndm_ddp_step() (or another collective) waits for
 * them: sharing the core with backward would cost the step more than the
 * all-reduce, as MPI spins while a peer computes. When the optimizer steps
 * exactly the wrapper's parameters and there are several buckets, the last
 * bucket's flag goes out alone before it, and once it says that no rank
 * failed, ndm_ddp_step() takes the optimizer step of the other buckets
 * while the last (the first layer's gradients, the last that backward
 * makes) is on the wire; the result has the bits of the whole step.
 * ndm_ddp_step() waits for the buckets, bounded by the same timeout; after
 * a timeout the group keeps (views of) the buckets still in flight or not
 * yet started and lets them run when the late ranks come, so closing the
 * model then is safe.
 *
 * Data-parallel steps on a CUDA device (the model's parameters all on one
 * device, cuda:N, the same N on every rank) use no thread: the buckets are
 * arrays on that device, and ndm_ddp_backward() queues each bucket's NCCL
 * all-reduce (a sum: backward was seeded with 1/size) on the calling
 * thread's current stream of the device as soon as backward has queued
 * the kernels that write its gradients, so stream order puts the transfer
 * after them and NCCL runs on the GPU while the host queues the rest of
 * backward. Each bucket's failure flag is written on the device (a
 * one-element fill) before its all-reduce, and the reduced flag is copied
 * into a small f32 array of flags (one per bucket, in "ddp"), which
 * ndm_ddp_step() reads in one device-to-host copy once the stream has
 * passed the last all-reduce (an event recorded there, polled up to the
 * group's timeout: then NDM_E_TIMEOUT, and the group breaks, keeping views
 * of the buckets, as on the CPU; NCCL's queued work cannot be cancelled,
 * so a rank that never comes leaves it waiting on the GPU). A rank that
 * fails during backward still queues every remaining bucket, its flag
 * set, so NCCL never waits for a rank that left; the messages then go over
 * MPI as on the CPU. Call ndm_ddp_backward() and ndm_ddp_step() from the
 * same thread; the optimizer's step runs on that thread's current stream,
 * after the wait.
 *
 * Thread rules: MPI is initialised with MPI_THREAD_SERIALIZED: collectives
 * must be called by one thread at a time, in the same order on every rank.
 * The communication thread is the only other thread ndm lets into MPI; a
 * collective called while buckets are in flight waits for them first. A
 * program that initialised MPI itself with less than MPI_THREAD_SERIALIZED
 * gets no communication thread: each bucket is then all-reduced inside
 * ndm_ddp_backward(), without overlap and without the bound on the wait.
 */
#ifndef NDM_DIST_H
#define NDM_DIST_H

#include <stdio.h>

#include "base.h"
#include "data.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How a collective combines the ranks' values. */
typedef enum ndm_dist_op {
    /** The sum (bool: logical or). f16/bf16 add in f32 and round once per
     *  step of MPI's (NCCL's) reduction, so results may depend on the rank
     *  count's reduction order, as with any MPI or NCCL sum of floats. */
    NDM_DIST_SUM = 0,
    /** The sum divided by the group size (integers: truncated toward zero,
     *  as C's division; bool is NDM_E_DTYPE). */
    NDM_DIST_MEAN = 1,
    /** The element-wise maximum (bool: logical or). */
    NDM_DIST_MAX = 2,
} ndm_dist_op;

/* ---- the process group ------------------------------------------------------------ */

/** Was ndm built with MPI? (false: every other function answers NDM_E_UNSUPPORTED.) */
NDM_API bool ndm_dist_available(void);
/** Join the job: initialise MPI (MPI_THREAD_SERIALIZED) unless the program
 *  did, and read rank, size and local rank (the rank among the processes of
 *  this machine, from MPI_Comm_split_type; OMPI_COMM_WORLD_LOCAL_RANK
 *  agrees). Again is NDM_ALREADY. NDM_E_UNSUPPORTED without MPI,
 *  NDM_E_CONFIG for a bad NDM_DIST_TIMEOUT_S, NDM_E_IO when MPI fails. */
NDM_API NDM_NODISCARD ndm_status ndm_dist_init(void);
/** Leave the job (collective): finalize MPI when ndm_dist_init()
 *  initialised it. NDM_ALREADY when not joined; NDM_E_TIMEOUT when the group
 *  broke and its abandoned operations did not finish (MPI is then left
 *  unfinalized). */
NDM_API ndm_status ndm_dist_finalize(void);
/** This process's rank, 0 .. size-1 (0 when not joined); never fails. */
NDM_API int ndm_dist_rank(void);
/** The number of processes (1 when not joined); never fails. */
NDM_API int ndm_dist_size(void);
/** This process's rank among those on its machine (0 when not joined);
 *  never fails. */
NDM_API int ndm_dist_local_rank(void);
/** Set the bound on every wait, in seconds (> 0; NDM_E_INVALID otherwise). */
NDM_API NDM_NODISCARD ndm_status ndm_dist_set_timeout(double seconds);

/* ---- collectives (every rank calls each, in the same order) ------------------------ */

/** A barrier that carries a status: NDM_OK when every rank passed NDM_OK;
 *  otherwise every rank gets the status of the lowest failing rank and a
 *  message "rank N: <that rank's last error>" (the caller's own failure
 *  included). Use it where one rank may fail alone, so that all stop.
 *  Its own errors: NDM_E_INVALID when not joined, NDM_E_TIMEOUT,
 *  NDM_E_UNSUPPORTED without MPI. */
#define ndm_dist_check(local) ndm_dist_check_at(NDM_HERE, (local))
/** ndm_dist_check() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_dist_check_at(NDM_SITE_PARAMS, ndm_status local);
/** ndm_dist_check(NDM_OK). */
#define ndm_dist_barrier() ndm_dist_check_at(NDM_HERE, NDM_OK)

/** Combine `a` across ranks, in place: every rank ends with the result.
 *  `a` may be any dtype and layout (a strided view is staged through a
 *  contiguous copy). NDM_OK, or the agreement errors above, NDM_E_INVALID
 *  (an unknown op), NDM_E_DTYPE (the mean of bool), NDM_E_TIMEOUT, the
 *  handle's errors; on error `a` is unchanged, except after NDM_E_TIMEOUT. */
#define ndm_all_reduce_(a, op) ndm_all_reduce_inplace_at(NDM_HERE, (a), (op))
/** ndm_all_reduce_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_all_reduce_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                           ndm_dist_op op);
/** Copy root's `a` into every rank's `a` (same dtype and shape on every
 *  rank). NDM_E_INVALID for a root outside 0 .. size-1 or roots that differ. */
#define ndm_broadcast_(a, root) ndm_broadcast_inplace_at(NDM_HERE, (a), (root))
/** ndm_broadcast_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_broadcast_inplace_at(NDM_SITE_PARAMS, ndm_array a, int root);
/** Every rank's `a` (same dtype and shape, rank >= 1) concatenated along
 *  the first axis in rank order: a new array of shape (size * a.shape[0],
 *  ...) on a's device in `out` (a manager, whatever its device;
 *  NDM_OUTPUT_RULE: a's manager or the innermost scope), the caller's to
 *  release, or the null handle with the error: the agreement errors above
 *  (NDM_E_DTYPE, NDM_E_SHAPE, NDM_E_DEVICE), NDM_E_SHAPE for a 0-d `a`,
 *  NDM_E_TIMEOUT, the handle's and the output manager's errors. */
#define ndm_all_gather_to(out, a) ndm_all_gather_to_at(NDM_HERE, (out), (a))
/** ndm_all_gather_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_all_gather_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** Combine every rank's `a` (same dtype and shape, first axis divisible by
 *  the size: NDM_E_SHAPE otherwise) and give rank r the r-th of `size`
 *  equal parts along the first axis: a new array owned by `out` (as for
 *  ndm_all_gather_to()), or the null handle with the error: errors as for
 *  ndm_all_gather_to() and ndm_all_reduce_(). */
#define ndm_reduce_scatter_to(out, a, op) ndm_reduce_scatter_to_at(NDM_HERE, (out), (a), (op))
/** ndm_reduce_scatter_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_reduce_scatter_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                           ndm_dist_op op);

/* ---- job-wide reports ---------------------------------------------------------------- */

/** Every rank's ndm_debug_dump() of its `m` (each rank names its own
 *  manager, usually the same path), printed by rank 0 in rank order, each
 *  line's manager path prefixed "rankN/": "ndm dump: rank1/system/model".
 *  Other ranks print nothing. A collective: NDM_OK, or a rank's dump error
 *  on every rank, or NDM_E_TIMEOUT. f may be NULL on ranks other than 0. */
NDM_API NDM_NODISCARD ndm_status ndm_dist_debug_dump(ndm_manager m, FILE *f);
/** Every rank's ndm_leak_report(), printed by rank 0, paths prefixed
 *  "rankN/" ("manager rank1/system/leaky created at ..."). Returns the live
 *  arrays of the whole job (the same on every rank), or a negative status:
 *  NDM_E_INVALID when not joined, NDM_E_TIMEOUT, NDM_E_UNSUPPORTED. */
NDM_API int64_t ndm_dist_leak_report(FILE *f);

/* ---- data-parallel training ------------------------------------------------------------ */

/** A data-parallel wrapper, owned by its model manager (freed when it
 *  closes, or by ndm_ddp_close()). */
typedef struct ndm_ddp {
    uint64_t id; /**< Slot and generation; 0 is the null wrapper. Opaque. */
} ndm_ddp;

/** Options of ndm_ddp_new(); zero fields take the defaults. */
typedef struct ndm_ddp_options {
    /** Bytes per gradient bucket; 0: 25 MiB (DistributedDataParallel's
     *  default). A parameter larger than this gets a bucket of its own. */
    int64_t bucket_bytes;
} ndm_ddp_options;

/** Wrap `net` and its optimizer `opt` (both owned by `model`) for
 *  data-parallel training. Collective: broadcasts every parameter and
 *  buffer of net from rank 0, then makes the gradient buckets: one array
 *  per bucket (its gradients and a failure flag) in "ddp", a child manager
 *  of `model` on the parameters' device (the CPU, or one CUDA device, with
 *  the flags array too: see above), made once and reused by every step, so
 *  they show in ndm_debug_dump (call it before capping the model's
 *  children). Each
 *  parameter's gradient becomes a view of its bucket (in "ddp", holding
 *  the gradient's values), so backward accumulates straight into the
 *  buckets: gradient handles taken with ndm_grad_to() before this call,
 *  and graphs recorded before it, keep the former gradient array, which
 *  ndm_ddp_close() gives back to the parameter with the views' values. Buckets
 *  follow the parameters in reverse order, where backward produces their
 *  gradients first, and group parameters of one dtype. Closing the model
 *  or the wrapper between ndm_ddp_backward() and ndm_ddp_step() is a
 *  caller bug: MPI may still be writing the buckets. Returns the
 *  wrapper, owned by `model`, or the null wrapper: NDM_E_NOT_OWNER (net or
 *  opt of another manager), NDM_E_DEVICE (parameters on several devices,
 *  or on another device than rank 0's), NDM_E_UNSUPPORTED (a model on a
 *  CUDA device and a CUDA module without NCCL), the agreement errors (the
 *  ranks' parameter lists differ), and `model`'s refusals. */
#define ndm_ddp_new(model, net, opt, opts) ndm_ddp_new_at(NDM_HERE, (model), (net), (opt), (opts))
/** ndm_ddp_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_ddp ndm_ddp_new_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net,
                               ndm_optimizer opt, const ndm_ddp_options *opts);
/** Backward from `loss` (as ndm_backward(), but seeded with 1/size, so that
 *  the buckets' sum is the ranks' mean), handing each bucket's
 *  all-reduce to the communication thread (on a CUDA device: queuing it
 *  for NCCL on the current stream) as soon as backward has produced all
 *  its gradients, while backward goes on. Call it on every rank every step,
 *  also when this rank's forward pass failed (loss null): the failure is
 *  then sent with the buckets and ends the step on every rank. A second
 *  call before ndm_ddp_step() is refused (NDM_E_INVALID) and does nothing
 *  else: its buckets are out already, and the step takes the first call's
 *  gradients on every rank. Returns this rank's backward status (the
 *  job's comes from ndm_ddp_step()). */
#define ndm_ddp_backward(d, loss) ndm_ddp_backward_at(NDM_HERE, (d), (loss))
/** ndm_ddp_backward() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_status ndm_ddp_backward_at(NDM_SITE_PARAMS, ndm_ddp d, ndm_array loss);
/** Wait for every bucket (bounded: NDM_E_TIMEOUT), which leaves the mean
 *  of the ranks' gradients in every parameter's gradient, take the optimizer
 *  step and zero the gradients. When any rank failed this step, no rank
 *  steps: every rank returns the lowest failing rank's status and message
 *  ("rank N: ...") and its gradients are zeroed, so the next step starts
 *  clean on every rank. */
#define ndm_ddp_step(d) ndm_ddp_step_at(NDM_HERE, (d))
/** ndm_ddp_step() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_ddp_step_at(NDM_SITE_PARAMS, ndm_ddp d);
/** The number of buckets of the wrapper, or a negative status (NDM_E_NULL, NDM_E_CLOSED
 *  for a wrapper freed, NDM_E_INVALID for a handle that is not one). */
NDM_API int ndm_ddp_buckets(ndm_ddp d);
/** Give each parameter its own gradient array back (with the values of
 *  its view), then free the wrapper and its buckets. NDM_OK; NDM_ALREADY
 *  when already freed; errors as for ndm_ddp_buckets(). */
NDM_API ndm_status ndm_ddp_close(ndm_ddp d);

/* ---- sharded loading ---------------------------------------------------------------------- */

/** ndm_loader_new() for this rank's shard: a loader whose epoch is the
 *  ranks' common epoch (same seed, the same shuffled order on every rank)
 *  cut into global batches of size * batch_size examples, of which this
 *  rank takes its part (ndm_loader_options.num_shards and .shard set from
 *  the group). See data.h for the split and drop_last. Not a collective. */
#define ndm_dist_loader_new(trainer, data, ...)                                 \
    ndm_dist_loader_new_at(NDM_HERE, (trainer), (data), __VA_ARGS__)
/** ndm_dist_loader_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_loader ndm_dist_loader_new_at(NDM_SITE_PARAMS, ndm_manager trainer, ndm_dataset data,
                                          const ndm_loader_options *opts);

#ifdef __cplusplus
}
#endif

#endif
