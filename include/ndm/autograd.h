/* ndm autograd: reverse-mode gradients, recorded per thread.
 *
 *     ndm_requires_grad(w);              // once, while building the model
 *     ...
 *     ndm_grad_begin(batch);             // record this thread's operations
 *     ndm_array loss = ...;              // operations on w (and on recorded results) are recorded
 *     ndm_backward(loss);                // d loss / d w is added to w's gradient
 *     ndm_grad_end();
 *     ... optimizer step, ndm_zero_grad(w) ...
 *     ndm_manager_close(batch);          // the graph goes with the batch
 *
 * Ownership. A parameter's gradient is an array of its shape and dtype,
 * made once (zeroed) by ndm_requires_grad in the parameter's manager, never
 * reallocated: backward adds into it in place, so a capped model manager
 * stays capped. The graph (one node per recorded operation, plus handles
 * that keep its inputs alive) lives in a child manager of the manager given
 * to ndm_grad_begin, so closing that manager frees the graph, whatever
 * scopes were used during the step.
 *
 * What is recorded: while recording is on (and not paused by
 * ndm_no_grad_begin), every operation with an input that needs a gradient —
 * a parameter, or the result of a recorded operation — adds a node. In-place
 * operations are not recorded: writing into an array the graph depends on
 * during a step gives wrong gradients (optimizers update parameters after
 * ndm_grad_end). Operations without a gradient (comparisons, argmax, integer
 * results, random numbers) make results that need none.
 *
 * Thread rules: recording is per thread. Backward adds into the parameters'
 * shared gradient arrays: run one backward per parameter set at a time.
 */
#ifndef NDM_AUTOGRAD_H
#define NDM_AUTOGRAD_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Make `param` a parameter: it gets a zeroed gradient array of its shape
 *  and dtype in its manager (once; again is NDM_OK). The manager must accept
 *  the array (call this before capping a model). Float dtypes only
 *  (NDM_E_DTYPE). */
#define ndm_requires_grad(param) ndm_requires_grad_at(NDM_HERE, (param))
/** ndm_requires_grad() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_requires_grad_at(NDM_SITE_PARAMS, ndm_array param);
/** Is `a` a parameter? (false for a null or stale handle; never fails) */
NDM_API bool ndm_array_requires_grad(ndm_array a);
/** A fresh handle on the gradient of parameter `param`, attached by the
 *  output rule (the `_to` manager, else the innermost scope, else the
 *  parameter's manager — refused when that one is capped: name a manager).
 *  NDM_E_INVALID when `param` is not a parameter. */
#define ndm_grad(param) ndm_grad_to_at(NDM_HERE, NDM_OUTPUT_RULE, (param))
/** ndm_grad() with the result attached to m instead of by the output rule. */
#define ndm_grad_to(m, param) ndm_grad_to_at(NDM_HERE, (m), (param))
/** ndm_grad_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_grad_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array param);
/** Set the gradient of each parameter to zero. NDM_E_INVALID when params is
 *  NULL with n > 0 or one is not a parameter (those before it are zeroed). */
NDM_API NDM_NODISCARD ndm_status ndm_zero_grad(size_t n, const ndm_array *params);

/** Start recording this thread's operations into a new graph under `owner`
 *  (a child manager named "graph"). NDM_E_INVALID when this thread already
 *  records (end it first). */
#define ndm_grad_begin(owner) ndm_grad_begin_at(NDM_HERE, (owner))
/** ndm_grad_begin() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_grad_begin_at(NDM_SITE_PARAMS, ndm_manager owner);
/** Stop recording. The graph stays until its owner closes, so backward may
 *  also run after this. NDM_OK, or NDM_ALREADY when this thread does not
 *  record; never fails. */
NDM_API ndm_status ndm_grad_end(void);
/** Is this thread recording (and not paused)? Never fails. */
NDM_API bool ndm_grad_recording(void);
/** Pause recording on this thread (nests); inference code can run inside.
 *  Never fails. */
NDM_API void ndm_no_grad_begin(void);
/** End one ndm_no_grad_begin(); without one open it does nothing (never
 *  fails). */
NDM_API void ndm_no_grad_end(void);

/* ---- training within a byte budget -------------------------------------
 *
 *     ndm_grad_begin_budget(batch, 64 << 20); // record, with batch limited to 64 MiB
 *     ndm_array loss = ...;                    // what does not fit is dropped...
 *     ndm_backward(loss);                      // ...and recomputed here: the same bits
 *
 * Under a budget, autograd records each module call one level below the
 * module the user called (a transformer's block, a Sequential's layer) as
 * a unit it may recompute. When an array or kernel scratch under `owner`
 * would exceed the limit, it drops the arrays that only the graph holds
 * for such units, the one with the smallest cost / (bytes × staleness)
 * first (DTR's choice: cost the unit's forward time, staleness the
 * logical time since it was last used), until the request fits; backward
 * recomputes a dropped unit (its module's forward again, with the same
 * inputs and random states, so the same kernels make the same bits) when
 * it needs it, and drops it again once it has passed it. Losses and
 * gradients are bit-identical to the unbudgeted step. A request that does
 * not fit with everything droppable dropped fails with NDM_E_QUOTA and a
 * message naming the operation, what it needs and the budget. The bytes
 * recomputed show in the graph manager's ndm_debug_dump line
 * ("recomputed N"), and a snapshot's stacks show a "recompute" frame. */

/** A module's part in a budget (ndm_module_set_recompute). */
typedef enum ndm_recompute {
    NDM_RECOMPUTE_AUTO = 0, /**< a unit when one level below the call, dropped under pressure */
    NDM_RECOMPUTE_KEEP,     /**< never drop what its forward pass records (nor recompute it) */
    NDM_RECOMPUTE_ALWAYS,   /**< a unit wherever called; dropped before backward, recomputed there */
} ndm_recompute;

/** What a budgeted graph did so far (ndm_grad_budget_get_stats). */
typedef struct ndm_grad_budget_stats {
    uint64_t budget_bytes;     /**< the limit set on the owner */
    uint64_t units;            /**< units of recomputation recorded */
    uint64_t drops;            /**< times a unit's arrays were dropped */
    uint64_t dropped_bytes;    /**< bytes those drops freed */
    uint64_t recomputations;   /**< units recomputed */
    uint64_t recomputed_bytes; /**< bytes the recomputations made for the graph */
} ndm_grad_budget_stats;

/** ndm_grad_begin(owner) with a byte budget: sets `owner`'s limit on its
 *  device to `bytes` (ndm_manager_set_limit; it stays after the graph
 *  ends) and records as described above. NDM_E_INVALID for 0 bytes or
 *  when this thread already records; the errors of ndm_grad_begin. */
#define ndm_grad_begin_budget(owner, bytes) ndm_grad_begin_budget_at(NDM_HERE, (owner), (bytes))
/** ndm_grad_begin_budget() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_grad_begin_budget_at(NDM_SITE_PARAMS, ndm_manager owner,
                                                          uint64_t bytes);
/** Copy the statistics of this thread's budgeted graph (the one recorded
 *  or last used) into *out. NDM_E_INVALID when out is NULL or the graph
 *  has no budget. */
NDM_API NDM_NODISCARD ndm_status ndm_grad_budget_get_stats(ndm_grad_budget_stats *out);

/** Add d(loss)/d(param) to the gradient of every parameter `loss` depends
 *  on. `loss` must be the result of a recorded operation with one element
 *  (NDM_E_SHAPE otherwise); its graph may have ended. Temporaries are
 *  released before return. Backward may run several times on one graph:
 *  gradients add up. */
#define ndm_backward(loss) ndm_backward_with_at(NDM_HERE, (loss), NDM_NULL_ARRAY)
/** The same with an explicit gradient for `out` (of its shape), for outputs
 *  with more than one element. */
#define ndm_backward_with(out, grad) ndm_backward_with_at(NDM_HERE, (out), (grad))
/** ndm_backward() and ndm_backward_with() with an explicit call site (grad
 *  null: the loss form). NDM_OK, or NDM_E_SHAPE, NDM_E_INVALID (not a
 *  recorded result), NDM_E_OOM (also when the recording of the step failed). */
NDM_API NDM_NODISCARD ndm_status ndm_backward_with_at(NDM_SITE_PARAMS, ndm_array out,
                                                      ndm_array grad);

#ifdef __cplusplus
}
#endif

#endif
