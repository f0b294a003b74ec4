/* ndm data: in-memory datasets and a batch loader.
 *
 * A dataset is two arrays whose first axis indexes examples: inputs [n, ...]
 * and labels [n, ...] (labels may be the null handle). The dataset does not
 * own them: they belong to whatever manager made them (typically `data` or
 * a model's sibling), and they must outlive the loaders that read them; a
 * loader that finds them released fails with NDM_E_CLOSED.
 *
 * A loader deals a dataset out in batches, epoch after epoch. Its state is
 * a resource owned by the trainer manager it was made for, so closing the
 * trainer frees it (the handle then reports NDM_E_CLOSED). Each batch gets a
 * fresh manager, "batch-<n>", a child of the trainer, holding contiguous
 * copies of the selected rows; fetching the next batch closes it, unless
 * the caller kept it (NDM_LOADER_KEEP_BATCHES, or ndm_loader_keep for one
 * batch): a kept batch stays a child of the trainer until the caller closes
 * its manager, or the trainer closes.
 *
 *     ndm_loader ld = ndm_loader_new(trainer, ds, &(ndm_loader_options){
 *         .batch_size = 64, .seed = 1, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS});
 *     ndm_batch b;
 *     int rc;
 *     while ((rc = ndm_loader_next(ld, &b)) > 0) {
 *         ... b.inputs, b.labels: owned by b.manager ...
 *     }                                  // rc == 0: the epoch is over
 *
 * Shuffling. With NDM_LOADER_SHUFFLE the order of epoch e is a Fisher-Yates
 * shuffle of 0..n-1 driven by splitmix64: the generator's state starts at
 * seed ^ mix(e + 1), where mix is splitmix64's output function; for i from
 * n-1 down to 1, j is the next 64-bit output reduced to [0, i] without bias
 * (outputs below 2^64 mod (i+1) are drawn again, then j = output mod (i+1)),
 * and items i and j are swapped. The order depends only on (seed, epoch, n),
 * so a run can be resumed at any epoch with ndm_loader_set_epoch.
 *
 * Sharding. With num_shards = S > 1 (one loader per data-parallel rank,
 * all with the same seed), the epoch's order is cut into global batches of
 * S * batch_size examples; batch k of shard s is the s-th run of
 * batch_size examples of global batch k, so the S shards of batch k hold
 * exactly the examples one unsharded loader with batch size S * batch_size
 * would put in its batch k. Every example goes to exactly one shard each
 * epoch, and every shard has the same number of batches (collectives stay
 * matched). A short last global batch of r examples is kept unless
 * NDM_LOADER_DROP_LAST, and then split as evenly as possible: shard s gets
 * positions [s*r/S, (s+1)*r/S) of it, so shards differ by one example at
 * most and, when r < S, some shards get an empty batch (size 0). With
 * NDM_LOADER_DROP_LAST that global batch is dropped on every shard.
 *
 * Workers. With workers = W > 0 the loader starts W threads of its own
 * (never the compute pool's: kernels they run go inline) that prepare up
 * to `prefetch` batches ahead of the consumer (0: 2 * W). Each fetch
 * creates, on the calling thread and in order, the managers "batch-<step>"
 * of the batches it schedules ahead (children of the trainer, made at the
 * fetch's line) and, for a CPU trainer, their arrays, so the tree and its
 * counts never depend on the workers' timing; a worker then gathers the
 * rows: into those arrays, or, for a GPU trainer, into host memory of the
 * loader's, and the fetch that hands the batch out makes its device arrays
 * and uploads them as above, on the consumer's thread and streams.
 * Batches come out in exactly the
 * order, with exactly the contents, of the loader without workers, for any
 * W, across epochs and ndm_loader_set_epoch. A batch that could not be
 * prepared (the trainer's byte limit, a dataset released meanwhile) is
 * made by the fetch that reaches it, on its own thread, after it closed
 * the batches prepared beyond it (they are prepared again afterwards), so
 * the fetch returns the status and message the loader without workers
 * returns in that state, and the next fetch tries the same batch again.
 * Batches prepared ahead are children of the trainer: they count against
 * its limits, appear in dumps and in ndm_report_since as "batch-<step>"
 * managers (`prefetch` of them, steady, never growing), and are closed,
 * their threads joined, by ndm_loader_close, ndm_loader_set_epoch or the
 * trainer's close: stopping early leaves nothing behind.
 *
 * Thread rules: a loader is used by one thread at a time. Closing its
 * trainer while another thread fetches from it is a caller bug, though the
 * loader's memory stays valid until that fetch returns (what it returns is
 * unspecified); fetches that start after the close fail with NDM_E_CLOSED.
 */
#ifndef NDM_DATA_H
#define NDM_DATA_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Inputs and labels with examples along the first axis. */
typedef struct ndm_dataset {
    ndm_array inputs; /**< [n, ...]: example i is inputs[i] */
    ndm_array labels; /**< [n, ...]; may be the null handle */
} ndm_dataset;

/** Load an IDX image file and an IDX label file (plain or gzip), as the
 *  MNIST family ships them, into manager `m`. The first axes must agree
 *  (NDM_E_SHAPE). NDM_OK with *out's two arrays owned by `m` (the caller
 *  releases them with ndm_dataset_release(), or closing m does); on failure
 *  *out is zeroed and nothing is left in `m`: NDM_E_INVALID for a NULL out,
 *  or the errors of ndm_idx_load(). */
#define ndm_dataset_load_idx(m, images_path, labels_path, out)                  \
    ndm_dataset_load_idx_at(NDM_HERE, (m), (images_path), (labels_path), (out))
/** ndm_dataset_load_idx() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_dataset_load_idx_at(NDM_SITE_PARAMS, ndm_manager m,
                                                         const char *images_path,
                                                         const char *labels_path,
                                                         ndm_dataset *out);

/** Number of examples (the inputs' first axis), or -1 with an error:
 *  NDM_E_NULL / NDM_E_CLOSED for the inputs, NDM_E_SHAPE for 0-d inputs. */
NDM_API int64_t ndm_dataset_size(ndm_dataset d);

/** Release both arrays and zero *d. NDM_OK (NDM_ALREADY when neither was
 *  live), NDM_E_INVALID for a NULL d, or a release's error. */
#define ndm_dataset_release(d) ndm_dataset_release_at(NDM_HERE, (d))
/** ndm_dataset_release() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_dataset_release_at(NDM_SITE_PARAMS, ndm_dataset *d);

/** A loader handle: generational like arrays and managers, so a loader
 *  freed by its trainer's close is reported, never read. It is not an array
 *  or manager handle (NDM_AUTO refuses it): a loader dies with its trainer,
 *  or earlier with ndm_loader_close. */
typedef struct ndm_loader {
    uint64_t id; /**< Slot and generation; 0 is the null loader. Opaque. */
} ndm_loader;

enum {
    /** Reshuffle every epoch (see above); otherwise examples come in order. */
    NDM_LOADER_SHUFFLE = 1u << 0,
    /** Drop the last batch of an epoch when it is short. */
    NDM_LOADER_DROP_LAST = 1u << 1,
    /** Keep every batch: fetching does not close the previous batch's
     *  manager; the caller closes it (or the trainer's close does). */
    NDM_LOADER_KEEP_BATCHES = 1u << 2,
    /** Inputs must be u8 (images); batch inputs are f32 in [0, 1], x / 255. */
    NDM_LOADER_SCALE_INPUTS = 1u << 3,
    /** Labels must be bool or integers; batch labels are i64. */
    NDM_LOADER_LABELS_I64 = 1u << 4,
};

/** How a loader deals batches. */
typedef struct ndm_loader_options {
    int64_t batch_size; /**< examples per batch, >= 1 (per shard when sharded) */
    uint64_t seed;      /**< the shuffle's seed */
    unsigned flags;     /**< NDM_LOADER_* */
    int64_t num_shards; /**< loaders that share the epoch (data-parallel ranks); 0 or 1: one */
    int64_t shard;      /**< which of them this one is, 0 .. num_shards-1 */
    int workers;        /**< threads preparing batches ahead, 0 .. 64 (0: none, the fetch makes them) */
    int prefetch;       /**< batches prepared ahead at most, 0 .. 1024 (0: 2 * workers); needs workers */
} ndm_loader_options;

/** A loader over `data` whose state belongs to `trainer` (it must be a CPU
 *  dataset; the trainer's device is where batches are made: for a GPU
 *  trainer each batch is gathered into pinned host memory (pageable memory
 *  the loader keeps where the device has none) and copied to the device on
 *  a second stream that the loader makes in the trainer, so the copy runs
 *  beside the work still queued on the thread's current stream; the batch
 *  has arrived when ndm_loader_next() returns, and its memory is not reused
 *  before the current stream's work on it is done). Errors:
 *  NDM_E_INVALID (batch size < 1, unknown flags, workers or prefetch out
 *  of range, prefetch without workers), NDM_E_OOM (a worker thread that
 *  cannot be started), NDM_E_SHAPE (a rank-0
 *  array, first axes that differ), NDM_E_DTYPE (the conversion asked for
 *  does not apply), NDM_E_DEVICE (data off the CPU), and the trainer's
 *  refusals. The options come last so a compound literal can be passed.
 *  Returns the loader, owned by the trainer (ndm_loader_close() frees it
 *  earlier), or the null loader. */
#define ndm_loader_new(trainer, data, ...)                                      \
    ndm_loader_new_at(NDM_HERE, (trainer), (data), __VA_ARGS__)
/** ndm_loader_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_loader ndm_loader_new_at(NDM_SITE_PARAMS, ndm_manager trainer, ndm_dataset data,
                                     const ndm_loader_options *opts);

/** One batch. Its arrays belong to `manager`. */
typedef struct ndm_batch {
    ndm_manager manager; /**< "batch-<step>", a child of the trainer */
    ndm_array inputs;    /**< [size, ...] */
    ndm_array labels;    /**< [size, ...]; null when the dataset has none */
    int64_t size;        /**< examples in the batch */
    int64_t epoch;       /**< the epoch it belongs to, from 0 */
    int64_t index;       /**< the batch's number in its epoch, from 0 */
    int64_t step;        /**< batches this loader made before it, over all epochs */
} ndm_batch;

/** Close the previous batch (unless kept) and fetch the next. Returns 1 with
 *  *out filled, 0 when the epoch is over (*out zeroed; the next call starts
 *  the next epoch), or a negative ndm_status (*out zeroed). Epochs count up
 *  to INT64_MAX, never wrapping: the end of epoch INT64_MAX is
 *  NDM_E_OVERFLOW, and that call changes nothing (its current batch stays
 *  open). */
#define ndm_loader_next(l, out) ndm_loader_next_at(NDM_HERE, (l), (out))
/** ndm_loader_next() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD int ndm_loader_next_at(NDM_SITE_PARAMS, ndm_loader l, ndm_batch *out);

/** Keep the current batch: the next fetch leaves its manager open and the
 *  caller closes it. NDM_E_INVALID when there is no current batch. */
NDM_API NDM_NODISCARD ndm_status ndm_loader_keep(ndm_loader l);

/** Start epoch `epoch` (>= 0, NDM_E_INVALID otherwise; INT64_MAX is the
 *  last, see ndm_loader_next()) from its first batch; the current batch is
 *  closed unless kept, and batches prepared ahead are closed. */
NDM_API NDM_NODISCARD ndm_status ndm_loader_set_epoch(ndm_loader l, int64_t epoch);

/** The number of batches per epoch, or -1 with an error (NDM_E_NULL, NDM_E_CLOSED for a
 *  loader freed, NDM_E_INVALID for a handle that is not a loader). */
NDM_API int64_t ndm_loader_batches(ndm_loader l);

/** Is this a live loader? (false for null and freed ones; never fails) */
NDM_API bool ndm_loader_valid(ndm_loader l);

/** Free the loader now (its current batch is closed unless kept; batches
 *  prepared ahead are closed and the worker threads joined). The small
 *  record that the trainer owns stays until the trainer closes. NDM_OK;
 *  NDM_ALREADY for a loader already freed; NDM_E_NULL for the null loader,
 *  NDM_E_INVALID for a handle that is not a loader. */
#define ndm_loader_close(l) ndm_loader_close_at(NDM_HERE, (l))
/** ndm_loader_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_loader_close_at(NDM_SITE_PARAMS, ndm_loader l);

#ifdef __cplusplus
}
#endif

#endif
