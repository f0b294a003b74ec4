/* ndm plans: planned managers, whose steps are served from one arena.
 *
 * A training loop or a server makes the same arrays in the same order step
 * after step. A plan cache, owned by a long-lived manager (the model, a
 * predictor), learns each step's pattern once and serves the later steps
 * of the same pattern from one block at precomputed offsets:
 *
 *     ndm_plan plan = ndm_plan_new(model, 4);
 *     for (each batch) {
 *         ndm_manager batch = ndm_manager_new_planned(trainer, "batch", plan, rows);
 *         ... forward, backward, optimizer step ...
 *         (void)ndm_manager_close(batch);
 *     }
 *
 * The signature is the caller's key for the step's shapes (the batch's
 * rows, say: the loader's last short batch gets its own plan). The first
 * manager with a new signature records: its storage (arrays and the kernel
 * scratch charged to it) comes from the caching allocator while the sizes
 * and the order of creations and releases are noted. When its last block
 * is freed, the offsets are computed (greedy by size over the lifetimes,
 * blocks whose lifetimes do not overlap sharing memory) and the plan is
 * cached. A later manager with that signature takes one arena (the block a
 * finished step gave back, or one allocation) and serves each creation
 * whose size is the next planned one at its offset, with no allocator call.
 * Kernel scratch, which the pool's threads take in an order that varies, is
 * planned per gap between two creations: the scratch taken there, on any
 * thread, is stacked in one planned block the size of the most the
 * recorded step had live there; a step whose scratch did not fit gives the
 * plan room for it (a few times at most). Children of a planned manager (scopes, an
 * autograd graph) are part of its step.
 *
 * Anything else falls back to the caching allocator for that array, counted
 * (ndm_plan_get_stats): another size, another order, an allocation from a
 * thread other than the one that opened the manager, scratch that does not
 * fit its gap's block, or a planned block
 * whose memory another array of the step still holds (kept past its planned
 * release, moved to another manager). Values never depend on the plan. An
 * array of the step that outlives its manager keeps its memory: the arena
 * stays allocated until its last block is freed.
 *
 * What the tree sees does not change: arrays of a planned manager are
 * charged, limited, dumped and reported as any other; allocator statistics
 * and snapshots see the arena as one allocated block (tagged with the
 * owner) and the fallbacks as ordinary blocks.
 *
 * Memory: a plan keeps, per cached signature, the arena its last finished
 * step gave back (so a loop of steps calls the allocator once); these
 * arenas go back when their signature is evicted (least recently used,
 * beyond max_plans), or the plan or its owner closes.
 *
 * Thread rules: plans are thread-safe; a planned manager is an ordinary,
 * thread-safe manager whose creations on the thread that opened it are
 * the planned ones. Its blocks may be freed on any thread.
 */
#ifndef NDM_PLAN_H
#define NDM_PLAN_H

#include <stdint.h>

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A plan cache (opaque; 0 is the null handle). */
typedef struct ndm_plan {
    uint64_t id; /**< Slot and generation; 0 is the null handle. Opaque. */
} ndm_plan;

/** The null plan handle: what a failed ndm_plan_new returns. */
#define NDM_NULL_PLAN NDM_LITERAL_(ndm_plan, 0)

/** What a plan cache did (ndm_plan_get_stats). */
typedef struct ndm_plan_stats {
    int64_t plans;           /**< signatures cached now */
    int64_t recorded;        /**< plans computed from a recorded step */
    int64_t replayed;        /**< planned managers opened on a cached plan */
    int64_t evicted;         /**< plans dropped by the LRU bound */
    int64_t hits;            /**< allocations served from an arena */
    int64_t fallbacks;       /**< allocations of planned managers served by the caching allocator */
    int64_t arena_bytes;     /**< bytes of the arenas allocated now (in use or kept) */
    int64_t arena_allocs;    /**< arenas taken from the allocator */
    int64_t replanned;       /**< plans whose scratch blocks grew after a step that found them short */
} ndm_plan_stats;

/** One cached plan (ndm_plan_get_entry). */
typedef struct ndm_plan_entry {
    int64_t blocks;          /**< planned allocations of a step */
    int64_t arena_bytes;     /**< the arena a step takes */
    int64_t max_live_bytes;  /**< most bytes live at once in the recorded step */
    int64_t total_bytes;     /**< bytes of all the step's allocations */
} ndm_plan_entry;

/** A plan cache owned by `owner` (closed with it), keeping up to max_plans
 *  signatures (1..1024). Returns the null handle on failure: owner null
 *  (NDM_E_NULL), stale or closing (NDM_E_CLOSED), system or detached
 *  (NDM_E_ROOT), max_plans out of range (NDM_E_INVALID), NDM_E_OOM. */
#define ndm_plan_new(owner, max_plans) ndm_plan_new_at(NDM_HERE, (owner), (max_plans))
/** ndm_plan_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_plan ndm_plan_new_at(NDM_SITE_PARAMS, ndm_manager owner, int max_plans);

/** Close a plan cache before its owner: its kept arenas go back; managers
 *  open on it finish their steps. NDM_OK, NDM_ALREADY when closed (by its
 *  owner's close too), NDM_E_NULL, NDM_E_INVALID for a handle that is no
 *  plan's. */
#define ndm_plan_close(plan) ndm_plan_close_at(NDM_HERE, (plan))
/** ndm_plan_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_plan_close_at(NDM_SITE_PARAMS, ndm_plan plan);

/** A child of `parent` (on parent's device) in planned mode under `plan`,
 *  for one step of shape signature `signature` (see above); close it as any
 *  manager. Returns the null handle on failure, as ndm_manager_new, and for
 *  a null plan (NDM_E_NULL), one closed or of a closed owner (NDM_E_CLOSED),
 *  a handle that is no plan's (NDM_E_INVALID). */
#define ndm_manager_new_planned(parent, name, plan, signature)                  \
    ndm_manager_new_planned_at(NDM_HERE, (parent), (name), (plan), (signature))
/** ndm_manager_new_planned() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_manager ndm_manager_new_planned_at(NDM_SITE_PARAMS, ndm_manager parent,
                                               const char *name, ndm_plan plan,
                                               uint64_t signature);

/** Fill *out with what `plan` did so far (steps still running count once
 *  their last block is freed). NDM_OK, NDM_E_NULL, NDM_E_CLOSED,
 *  NDM_E_INVALID (also for a NULL out). */
#define ndm_plan_get_stats(plan, out) ndm_plan_get_stats_at(NDM_HERE, (plan), (out))
/** ndm_plan_get_stats() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_plan_get_stats_at(NDM_SITE_PARAMS, ndm_plan plan,
                                                       ndm_plan_stats *out);

/** Fill *out with the cached plan of `signature` on `plan`. NDM_OK; NDM_ALREADY
 *  (positive, *out zeroed) when none is cached; as ndm_plan_get_stats
 *  otherwise. */
#define ndm_plan_get_entry(plan, signature, out)                                \
    ndm_plan_get_entry_at(NDM_HERE, (plan), (signature), (out))
/** ndm_plan_get_entry() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_plan_get_entry_at(NDM_SITE_PARAMS, ndm_plan plan,
                                                       uint64_t signature,
                                                       ndm_plan_entry *out);

/* ---- device graphs over planned managers ---------------------------------------------
 *
 * A step of fixed shape on a CUDA device launches the same kernels on the
 * same memory every time. ndm_graph_capture records one such step as a
 * device graph (a CUDA graph) whose memory is its plan's arena, and
 * ndm_graph_launch runs the whole step again with one call, no kernel
 * launched one by one and no allocator call:
 *
 *     // the first step of the signature, run as usual, records the plan
 *     ndm_manager s = ndm_manager_new_planned(trainer, "batch", plan, rows);
 *     st = step(s, &io);                        // reads io.x, io.y
 *     (void)ndm_manager_close(s);
 *     ndm_graph g = ndm_graph_capture(trainer, "batch", plan, rows, step, &io);
 *     for (each batch) {
 *         ... write the batch into io.x, io.y (in place) ...
 *         st = ndm_graph_launch(g);             // io.loss holds this step's loss
 *     }
 *     (void)ndm_graph_close(g);
 *
 * Capture opens a planned manager (`step`, a child of parent) on the plan
 * cached for `signature`, makes the calling thread's work on the device
 * go to a capturing stream, calls fn(step, ud), and ends the capture. fn
 * runs as the step would, except that nothing runs on the device: kernels
 * and copies between device memory are recorded, and a call that needs
 * the device's results or memory the graph would not own cannot be
 * captured, so it fails with NDM_E_UNSUPPORTED ("cannot be captured"), and
 * so does the capture: a copy to or from host memory, a wait for the
 * device (ndm_sync, reading a value), an allocation on the device that the
 * plan's arena does not serve (the step differing from the recorded one,
 * an array made in a manager other than the step or its children).
 * Shapes outside the captured set are simply run uncaptured.
 *
 * What fn reads from outside the step (parameters, the inputs it is given
 * through ud) is read again, from the same memory, by each launch: write
 * new inputs into those arrays in place, and keep them alive as long as the
 * graph. What fn makes in `step` (its outputs, the autograd graph) stays
 * there, in the arena, as long as the graph: each launch overwrites it in
 * place. In-place updates (an optimizer's step) repeat with each launch.
 *
 * The graph is owned by its step manager (ndm_graph_manager): closing it,
 * ndm_graph_close, or closing any manager above it destroys the graph and
 * gives the arena back to the plan. Launches run on the calling thread's
 * current stream of the device, in order with the work around them; the
 * host does not wait (read an output, or ndm_sync, to wait). Results are
 * bit-identical to running the step eagerly.
 *
 * Thread rules: capture on one thread (the device's work of that thread
 * only is captured). Launches are thread-safe; two threads launching one
 * graph run its steps one after the other on their streams (both write the
 * same arena: order them, or use one graph per thread). */

/** A captured device graph (opaque; 0 is the null handle). */
typedef struct ndm_graph {
    uint64_t id; /**< Slot and generation; 0 is the null handle. Opaque. */
} ndm_graph;

/** The null graph handle: what a failed ndm_graph_capture returns. */
#define NDM_NULL_GRAPH NDM_LITERAL_(ndm_graph, 0)

/** One step, as ndm_graph_capture runs it: make its arrays in `step` (or
 *  its children, scopes included); return NDM_OK or the first failure. */
typedef ndm_status (*ndm_step_fn)(ndm_manager step, void *ud);

/** What a graph is (ndm_graph_get_info). */
typedef struct ndm_graph_info {
    uint64_t signature;  /**< the plan's signature it was captured under */
    int64_t nodes;       /**< kernels and copies recorded */
    int64_t launches;    /**< ndm_graph_launch calls that queued it */
    int64_t arena_bytes; /**< its memory: the plan's arena it holds */
} ndm_graph_info;

/** Capture fn(step, ud) as a device graph (see above) in a planned manager
 *  `name` under `parent`, on parent's device. Returns the graph, owned by
 *  its step manager, or the null handle: fn NULL or no plan of `signature`
 *  cached (run one step of it in ndm_manager_new_planned first)
 *  (NDM_E_INVALID); a device without graphs, the CPU included
 *  (NDM_E_UNSUPPORTED); a call in fn that cannot be captured
 *  (NDM_E_UNSUPPORTED, its message saying which) or fn's own failure (its
 *  status); errors of ndm_manager_new_planned. On failure nothing stays
 *  open and nothing ran on the device. */
#define ndm_graph_capture(parent, name, plan, signature, fn, ud)                    ndm_graph_capture_at(NDM_HERE, (parent), (name), (plan), (signature), (fn), (ud))
/** ndm_graph_capture() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_graph ndm_graph_capture_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name,
                                       ndm_plan plan, uint64_t signature, ndm_step_fn fn,
                                       void *ud);

/** Queue the captured step on the calling thread's current stream of its
 *  device. NDM_OK; NDM_E_NULL; NDM_E_CLOSED (the graph was closed, or its
 *  manager); NDM_E_INVALID (not a graph handle); NDM_E_DEVICE. */
#define ndm_graph_launch(g) ndm_graph_launch_at(NDM_HERE, (g))
/** ndm_graph_launch() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_graph_launch_at(NDM_SITE_PARAMS, ndm_graph g);

/** Close the graph's step manager (its arrays, then the graph; a launch
 *  already queued still runs on memory that stays valid until it has).
 *  NDM_OK; NDM_ALREADY when closed already; NDM_E_NULL; NDM_E_INVALID. */
#define ndm_graph_close(g) ndm_graph_close_at(NDM_HERE, (g))
/** ndm_graph_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_graph_close_at(NDM_SITE_PARAMS, ndm_graph g);

/** The step manager of g, which owns what fn made (the null handle, with
 *  the error of ndm_graph_launch, for a bad or closed graph). */
NDM_API ndm_manager ndm_graph_manager(ndm_graph g);

/** Fill *out with what g is. NDM_OK, or the errors of ndm_graph_launch
 *  (NDM_E_INVALID also for a NULL out). */
#define ndm_graph_get_info(g, out) ndm_graph_get_info_at(NDM_HERE, (g), (out))
/** ndm_graph_get_info() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_graph_get_info_at(NDM_SITE_PARAMS, ndm_graph g,
                                                       ndm_graph_info *out);

#ifdef __cplusplus
}
#endif

#endif
