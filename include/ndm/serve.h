/* ndm serving: a dynamic batcher over a predictor.
 *
 * Callers submit small requests (an input whose first axis holds its rows,
 * one or a few) from their own threads and wait; one worker thread gathers
 * what is queued into batches of up to max_batch rows, waiting at most
 * max_delay_us after the oldest request for company, runs one forward pass
 * per batch and hands each caller its own rows:
 *
 *     ndm_predictor pr = ndm_predictor_load(model, net, "net.safetensors");
 *     ndm_batcher b = ndm_batcher_new(pr, &(ndm_batcher_options){
 *         .max_batch = 64, .max_delay_us = 200});
 *     ...                                   // on each serving thread:
 *     ndm_array y = ndm_batcher_predict_to(req, b, x, 5000);   // 5 ms deadline
 *     ...
 *     ndm_batcher_close(b);                 // or the model's close
 *
 * Ownership. The batcher belongs to the predictor's model manager (it dies
 * with it, or earlier with ndm_batcher_close()). Its manager "batcher", a
 * child of the predictor's manager, holds one manager per batch ("batch":
 * the joined inputs, the forward's temporaries, the batch's output), closed
 * once the answers are out. An answer is a fresh array owned by the
 * caller's manager (the `_to` manager, else the caller's innermost scope,
 * else the input's manager), on the model's device, with exactly the rows
 * ndm_predict() gives for the same input: a copy of its rows of the batch's
 * output, or with NDM_BATCHER_LOAN a view of them (no copy; the view keeps
 * the batch's output storage alive, charged to the caller, until it is
 * released). The input stays the caller's; it is read while the caller
 * waits and never after the call returns.
 *
 * Batches. A batch holds requests of one signature only (dtype, device and
 * every axis after the first): requests of other signatures wait in the
 * queue, in order, and form batches of their own. A batch whose forward
 * pass fails is run again one request at a time, so that one poisoned input
 * fails its own request only; a batch that runs out of memory or over a
 * limit is split instead (see admission).
 *
 * Admission. Before a batch runs, its bytes are estimated (per row: the
 * given row_bytes, else twice the input's bytes, raised by what batches
 * were seen to need: the peak bytes of a batch's manager and of its
 * forward pass, per row, the largest seen) and compared with the room
 * under every byte limit over the batcher's
 * manager on the model's device (ndm_manager_set_limit() on it, the
 * predictor's manager or the model). A batch that would not fit is cut to
 * the oldest requests that do, the others waiting for the next batch; a
 * request that would not fit even alone is refused with NDM_E_QUOTA. A
 * batch that fails with NDM_E_QUOTA or NDM_E_OOM nonetheless raises the
 * estimate above what it used and goes back to the queue, in its place,
 * to run smaller; a single request that fails so gets that error.
 *
 * Answers. Every request accepted gets exactly one outcome: its answer, or
 * one error: NDM_E_BUSY (the queue was full: refused at once, nothing
 * queued), NDM_E_TIMEOUT (its deadline passed before its answer was out:
 * it is taken out of the queue, or its answer is dropped when its batch
 * ends), NDM_E_CLOSED (the batcher was closed, or the model or the
 * predictor's manager closed, with the request queued or running), the
 * forward pass's error, NDM_E_QUOTA / NDM_E_OOM, or the refusal of the
 * caller's manager to take the answer (closed, capped, over its limit).
 * The error is the caller's thread's last error, its message naming the
 * caller's line, and it is logged once, when the caller's call returns it
 * (the worker's own attempts, a failed batch before its requests run alone,
 * are not logged).
 *
 * Thread rules: any number of threads may submit at once; a request blocks
 * its caller until its outcome. ndm_batcher_close() and the model's close
 * may run on any thread but the worker's (inside a module's forward pass),
 * while requests are queued or running: they wait for the running batch to
 * end. Statistics may be read at any time.
 */
#ifndef NDM_SERVE_H
#define NDM_SERVE_H

#include "base.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A batcher handle, owned by its predictor's model manager. */
typedef struct ndm_batcher {
    uint64_t id; /**< Slot and generation; 0 is the null batcher. Opaque. */
} ndm_batcher;

enum {
    /** Answers are views of the batch's output rows (zero-copy loans that
     *  keep the whole output's storage alive until released) instead of
     *  copies of them. */
    NDM_BATCHER_LOAN = 1u << 0,
};

/** How a batcher forms batches; zero members take their defaults. */
typedef struct ndm_batcher_options {
    int64_t max_batch;    /**< the most rows in one forward pass (0: 32) */
    int64_t max_delay_us; /**< how long the oldest queued request waits for more
                               before its batch runs, in microseconds (0: no
                               wait: a batch takes what is queued when the
                               worker is free) */
    int64_t max_queue;    /**< the most requests waiting; one more is refused
                               with NDM_E_BUSY (0: 8 * max_batch) */
    int64_t row_bytes;    /**< admission's first estimate of the bytes a row
                               needs on the model's device (0: twice the
                               input's), raised by what batches use */
    unsigned flags;       /**< NDM_BATCHER_LOAN, or 0 for copies */
} ndm_batcher_options;

/** What a batcher has done; counts since it was made. */
typedef struct ndm_batcher_stats {
    uint64_t submitted;   /**< requests accepted into the queue */
    uint64_t answered;    /**< requests given their answer */
    uint64_t failed;      /**< accepted requests given an error other than a timeout */
    uint64_t timed_out;   /**< accepted requests whose deadline passed */
    uint64_t refused;     /**< requests refused at once (NDM_E_BUSY, bad input) */
    uint64_t batches;     /**< forward passes run */
    uint64_t rows;        /**< rows in those passes */
    double mean_batch;    /**< rows per pass (0 before the first) */
    uint64_t largest_batch; /**< the most rows in one pass */
    uint64_t splits;      /**< batches cut short or run again smaller by admission */
    uint64_t isolated;    /**< failed batches run again one request at a time */
    uint64_t queue_depth; /**< requests waiting now */
    uint64_t queue_peak;  /**< the most requests waiting at once */
    uint64_t in_flight;   /**< accepted requests without an outcome yet */
    uint64_t row_bytes;   /**< admission's estimate per row now (0: none yet) */
} ndm_batcher_stats;

/** A batcher over predictor p, with its worker thread started. opts may be
 *  NULL (every default), or a compound literal (the macro takes its commas). Returns the batcher, owned by p's model manager,
 *  or the null batcher: NDM_E_INVALID (a negative option, unknown flags),
 *  NDM_E_NULL / NDM_E_CLOSED for p, NDM_E_OOM, NDM_E_INTERNAL (no thread). */
#define ndm_batcher_new(p, ...) ndm_batcher_new_at(NDM_HERE, (p), __VA_ARGS__)
/** ndm_batcher_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_batcher ndm_batcher_new_at(NDM_SITE_PARAMS, ndm_predictor p,
                                       const ndm_batcher_options *opts);

/** Submit `input` (rank >= 1, 1 to max_batch rows along its first axis) and
 *  wait for its answer, at most timeout_us microseconds (0: no deadline).
 *  Returns a new array owned by the output rule's manager (see the header:
 *  NDM_OUTPUT_RULE is the innermost scope, else input's manager), the
 *  caller's to release, or the null handle: NDM_E_SHAPE (rank 0, no rows,
 *  more than max_batch), NDM_E_INVALID (a negative timeout), NDM_E_BUSY,
 *  NDM_E_TIMEOUT, NDM_E_CLOSED, NDM_E_QUOTA, NDM_E_OOM and the forward
 *  pass's errors (see Answers above). */
#define ndm_batcher_predict(b, input, timeout_us)                               \
    ndm_batcher_predict_to_at(NDM_HERE, NDM_OUTPUT_RULE, (b), (input), (timeout_us))
/** ndm_batcher_predict() with the answer attached to out. */
#define ndm_batcher_predict_to(out, b, input, timeout_us)                       \
    ndm_batcher_predict_to_at(NDM_HERE, (out), (b), (input), (timeout_us))
/** ndm_batcher_predict_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_batcher_predict_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_batcher b,
                                            ndm_array input, int64_t timeout_us);

/** Stop the batcher: queued requests get NDM_E_CLOSED, the running batch
 *  ends and its callers get their outcomes, then the worker exits and the
 *  batcher's manager closes. Returns NDM_OK, NDM_ALREADY for a batcher
 *  already closed (by this call or its model's close), NDM_E_INVALID for a
 *  forged handle or a call from the worker thread (a module's forward
 *  pass), NDM_E_NULL for the null batcher. */
#define ndm_batcher_close(b) ndm_batcher_close_at(NDM_HERE, (b))
/** ndm_batcher_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_status ndm_batcher_close_at(NDM_SITE_PARAMS, ndm_batcher b);

/** Fill *out with b's counts (a consistent snapshot). NDM_OK, or
 *  NDM_E_INVALID for a NULL out, NDM_E_NULL / NDM_E_CLOSED / NDM_E_INVALID
 *  for the handle. */
NDM_API NDM_NODISCARD ndm_status ndm_batcher_stats_get(ndm_batcher b, ndm_batcher_stats *out);

/** The batcher's manager (the parent of its batches; set a limit on it for
 *  admission): not the caller's to close. The null manager with NDM_E_NULL,
 *  NDM_E_CLOSED or NDM_E_INVALID for a bad handle. */
NDM_API ndm_manager ndm_batcher_manager(ndm_batcher b);

#ifdef __cplusplus
}
#endif

#endif
