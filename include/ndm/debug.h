/* ndm observability: per-manager statistics, the debug dump, leak hunting.
 *
 * Counters are exact. Per manager: live arrays, arrays created in it,
 * released from it, moved in and out, live and peak bytes per device, owned
 * resources and live children. Storage shared by several views counts once:
 * its bytes are charged to the manager of one of its views (the first,
 * until that manager holds no view of it any more, when the charge moves to
 * the manager of a remaining view).
 *
 * ndm_debug_dump prints the subtree, one line per manager, with the change
 * since the previous dump of that manager. Its format is part of the API:
 *
 *   ndm dump: system/model (arrays, bytes; [change since the previous dump])
 *   model      cpu     arrays 2 [+2]  bytes 4096 [+4096]  created 2  released 0  peak 4096
 *     trainer  cpu     arrays 0 [=]  bytes 0 [=]  created 0  released 0  peak 0
 *
 * Names are indented two spaces per level and padded to the widest; the
 * device column is six wide; a manager's first dump shows [new] in place of
 * the change. When closed children created or released arrays, their
 * numbers follow the manager's own: "created 0 (+120 in closed children)
 * released 0 (+120 in closed children)" (a close folds a child's lifetime
 * counts, its own closed children's included, into its parent, so a
 * subtree's totals keep them). Optional fields follow: bytes on other
 * devices ("cuda:0 bytes N peak N"), "resources N", "lent N" (its arrays
 * that another manager borrows, ndm_temp_attach), "borrowed N" (arrays
 * here on loan from another manager), "shared N" (arrays here whose storage
 * another manager's array also views; its bytes count once, where charged),
 * "capped(arrays,children)", "scope"; "moved in N" and "moved out N" follow
 * the released count when not 0 (so that more released than created reads
 * as arrays that came from elsewhere).
 *
 * Repeated siblings fold: children of one name and device made at one line
 * (the managers of a request loop) print as one line, "500 × request", with
 * their sums and "made at FILE:LINE (FUNC)"; their children fold the same
 * way, and the change is against the same managers' sums at the previous
 * dump. The leak report folds them too ("1000 × manager system/app/request
 * created at ..."), their arrays summed by creation site.
 *
 * Leak hunting: m0 = ndm_mark(model); ... ndm_report_since(model, m0, stderr)
 * lists the arrays of the subtree created after the mark and still alive,
 * grouped by creation site. With NDM_LEAK_REPORT=1 in the environment every
 * live manager is listed with its path and creation site at exit, and its
 * live arrays grouped by creation site with a count and bytes.
 *
 * Thread rules: all functions are thread-safe; figures read while other
 * threads work are a consistent snapshot of each manager, not of the tree.
 */
#ifndef NDM_DEBUG_H
#define NDM_DEBUG_H

#include <stdio.h>

#include "base.h"
#include "device.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Counters of one manager, or of its subtree (NDM_STATS_SUBTREE). */
typedef struct ndm_stats {
    uint64_t live_arrays;  /**< arrays owned now */
    uint64_t created;      /**< arrays created in it (subtree: closed children's too) */
    uint64_t released;     /**< arrays released from it (explicitly or by a close;
                               subtree: closed children's too) */
    uint64_t moved_in;     /**< arrays attached to it from elsewhere */
    uint64_t moved_out;    /**< arrays it gave away */
    uint64_t live_bytes;   /**< storage bytes charged to it on the device asked */
    uint64_t peak_bytes;   /**< highest live_bytes (per manager; for a subtree, the sum) */
    uint64_t resources;    /**< owned resources and on-close hooks */
    uint64_t children;     /**< live child managers (subtree: all descendants) */
} ndm_stats;

enum {
    NDM_STATS_SUBTREE = 1u << 0, /**< add up the whole subtree */
};

/** Fill *out for `m` on `device` (flags: NDM_STATS_SUBTREE). NDM_E_INVALID
 *  for other flag bits, NDM_E_DEVICE for a device this process cannot use
 *  (cuda:0 without a GPU). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_stats(ndm_manager m, ndm_device device, unsigned flags,
                                                   ndm_stats *out);

/** Print the subtree of `m` (format above) to f. Returns NDM_OK. Owner:
 *  nothing is made; f stays the caller's (written and flushed, not
 *  closed). Errors: NDM_E_INVALID for a NULL f, NDM_E_NULL/NDM_E_CLOSED/
 *  NDM_E_INVALID for the handle (status.h). */
#define ndm_debug_dump(m, f) ndm_debug_dump_at(NDM_HERE, (m), (f))
/** ndm_debug_dump() with an explicit call site (the macro passes NDM_HERE).
 *  Returns NDM_OK. Owner: f stays the caller's. Errors: NDM_E_INVALID,
 *  NDM_E_NULL, NDM_E_CLOSED as for ndm_debug_dump(). */
NDM_API ndm_status ndm_debug_dump_at(NDM_SITE_PARAMS, ndm_manager m, FILE *f);
/** Most sites ndm_debug_dump_why() explains. */
#define NDM_DUMP_WHY_MAX 64
/** ndm_debug_dump(), then why the biggest are alive: ndm_why_alive() of the
 *  newest live array of each of the `top` creation sites of the subtree
 *  holding the most bytes, biggest first (what NDM_LEAK_REPORT=why adds to
 *  the exit report, for a subtree and at a moment the caller picks; a
 *  call, not a setting, so that the dump's format stays what tests and
 *  tools pin). `top` from 1 to NDM_DUMP_WHY_MAX. Returns NDM_OK. Owner:
 *  nothing is made; f stays the caller's. Errors: NDM_E_INVALID for `top`
 *  out of range or a NULL f, and the handle's as for ndm_debug_dump(). */
#define ndm_debug_dump_why(m, f, top) ndm_debug_dump_why_at(NDM_HERE, (m), (f), (top))
/** ndm_debug_dump_why() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_status ndm_debug_dump_why_at(NDM_SITE_PARAMS, ndm_manager m, FILE *f, int top);
/** The subtree as one JSON object, then a newline, to f:
 *  {"name":..,"path":..,"device":..,"scope":bool,"capped":[..],"live_arrays":..,"created":..,
 *   "released":..,"closed_created":..,"closed_released":..,"moved_in":..,"moved_out":..,
 *   "resources":..,"lent":..,"borrowed":..,"shared":..,
 *   "bytes":{"cpu":{"live":..,"peak":..},..},"children":[..]}
 *  (closed_*: by closed children, as in the text dump). Returns NDM_OK.
 *  Owner: f stays the caller's. Errors: NDM_E_INVALID, NDM_E_NULL,
 *  NDM_E_CLOSED as for ndm_debug_dump(). */
#define ndm_debug_dump_json(m, f) ndm_debug_dump_json_at(NDM_HERE, (m), (f))
/** ndm_debug_dump_json() with an explicit call site (the macro passes
 *  NDM_HERE). Returns NDM_OK. Owner: f stays the caller's. Errors:
 *  NDM_E_INVALID, NDM_E_NULL, NDM_E_CLOSED as for ndm_debug_dump(). */
NDM_API ndm_status ndm_debug_dump_json_at(NDM_SITE_PARAMS, ndm_manager m, FILE *f);

/** A point in the sequence of array creations (process wide). */
typedef uint64_t ndm_seq;
/** Start a new point in the sequence and return it: every array created
 *  from now on carries it or a later one, every array made before an
 *  earlier one, so ndm_report_since(m, mark) lists exactly what came after.
 *  The sequence is process wide (`m` is only checked) and counts marks, not
 *  arrays. 0 when `m` is not a live manager (NDM_E_NULL, NDM_E_CLOSED
 *  recorded as the last error). */
NDM_API ndm_seq ndm_mark(ndm_manager m);
/** List the arrays of the subtree of `m` created after `mark` and still
 *  alive, grouped by creation site, largest group first. Writes nothing
 *  but a header line when there are none. NDM_OK, or NDM_E_INVALID for a
 *  NULL f. */
NDM_API ndm_status ndm_report_since(ndm_manager m, ndm_seq mark, FILE *f);
/** How many arrays of the subtree were created after `mark` and are alive,
 *  or a negative status: NDM_E_NULL, NDM_E_CLOSED for `m`. */
NDM_API int64_t ndm_count_since(ndm_manager m, ndm_seq mark);

/** Print every live manager under system (except the built-in nodes
 *  themselves) with path and creation site, oldest first (repeated siblings
 *  folded, see above), each followed by its live arrays grouped by creation
 *  site, largest group first:
 *    ndm leak report: 1 live manager, 320 live arrays
 *      manager system/leaky created at main.c:10 (main)
 *      320 arrays, 7680 bytes, created at main.c:12 (main) in system/leaky
 *  or "ndm leak report: nothing alive". Returns the number of live arrays
 *  (with a NULL f, only counts them); never fails. This is what
 *  NDM_LEAK_REPORT=1 prints at exit. */
NDM_API int64_t ndm_leak_report(FILE *f);

/** Why is `a` alive: print its retention path to f. The managers that own it
 *  (root first, each with the line that opened it, so a scope or request
 *  never closed is named where it was opened) and, when a move brought it
 *  there, which move and its line (ndm_attach, ndm_attach_all, ndm_ret,
 *  ndm_detach, ndm_temp_attach, a scope's end); its storage, the manager
 *  charged with it and, for a slice or view, how many bytes it pins beyond
 *  its own elements; and every other view that keeps the storage alive,
 *  each with its manager, creation line and role: the array that made the
 *  storage (a slice keeps its base's bytes), an alias in another manager, a
 *  value an autograd graph saved (in a manager named "graph"), a DLPack
 *  export not yet deleted (lent by its manager), a borrowed view (and the
 *  manager it goes back to). For example:
 *    why alive: f32[10], made at app.c:9 (main)
 *      owned by system/stats
 *        'system'
 *          'stats' opened at app.c:5 (main)
 *      storage: 4.0 MiB, charged to system/batch; this array's elements are
 *      40 bytes, so it pins 4.0 MiB more
 *      1 other view holds the storage (it lives until every one is released):
 *        f32[1024,1024], the array that made the storage, in system/batch, made at app.c:7 (main)
 *  NDM_LEAK_REPORT=why prints the exit report and then this for one array
 *  of each of the three creation lines holding the most bytes.
 *  Returns NDM_OK. Owner: nothing is made; the text goes to the caller's f.
 *  Errors: NDM_E_INVALID for a NULL f or a forged handle, NDM_E_CLOSED for a
 *  released array, NDM_E_NULL for a null handle, NDM_E_OOM when the list of
 *  views cannot be copied. */
#define ndm_why_alive(a, f) ndm_why_alive_at(NDM_HERE, (a), (f))
/** ndm_why_alive() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_why_alive_at(NDM_SITE_PARAMS, ndm_array a, FILE *f);
/** ndm_why_alive() as one JSON object and a newline:
 *  {"array":VIEW,"owners":[..],"storage":{"bytes":..,"wrapped":bool,"charged":..,
 *   "pinned_beyond_elements":..},"held_by":[VIEW,..]} where VIEW is
 *  {"array":"f32[10]","manager":path,"made":{"file":..,"func":..,"line":..},
 *   "element_bytes":..,"role":"self"|"home"|"view"|"autograd"|"dlpack_export"|"borrowed",
 *   "moved":{"by":"ndm_attach","at":SITE} (only when moved), "lender":path|null}; an owner chain deeper than 16 keeps its root and its
 *  innermost 15, with one "... N more managers" entry between. Returns,
 *  owner and errors as for ndm_why_alive(). */
#define ndm_why_alive_json(a, f) ndm_why_alive_json_at(NDM_HERE, (a), (f))
/** ndm_why_alive_json() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_why_alive_json_at(NDM_SITE_PARAMS, ndm_array a, FILE *f);

/** A growth tracker: it samples a manager's subtree once per step and tells a
 *  leak from a cache warming up. A handle, generational like arrays: the
 *  tracker belongs to a manager and dies with it (or with ndm_growth_free). */
typedef struct ndm_growth {
    uint64_t id; /**< Slot and generation; 0 is the null tracker. Opaque. */
} ndm_growth;

/** Start tracking `watched`'s subtree; the tracker belongs to `owner` (the
 *  model, or a manager of its own, so that it outlives the batches it
 *  watches; the built-in nodes own nothing: NDM_E_INVALID).
 *  Call ndm_growth_step() once per step (after the step's batch closed) and
 *  ndm_growth_report() when you want the classes.
 *  Returns the tracker. Owner: `owner` (it dies with it). Errors: a null
 *  handle with NDM_E_CLOSED / NDM_E_INVALID for a stale or forged manager,
 *  NDM_E_OOM without memory. */
#define ndm_growth_new(owner, watched) ndm_growth_new_at(NDM_HERE, (owner), (watched))
/** ndm_growth_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_growth ndm_growth_new_at(NDM_SITE_PARAMS, ndm_manager owner, ndm_manager watched);
/** Take one step's sample: per creation site, the live arrays of the subtree
 *  and their bytes; per opening site, its live managers and their bytes
 *  (a loop that names them batch-0, batch-1, ... opens them at one site).
 *  An array a move brought where it is counts under its creation line and
 *  that move's line together ("created at X, moved by ndm_attach at Y"). It walks every live array of the subtree (a debugging tool:
 *  time grows with the arrays alive). The last 32 steps are kept.
 *  Returns NDM_OK. Owner: the samples stay in the tracker. Errors:
 *  NDM_E_CLOSED when the tracker or the watched manager is gone,
 *  NDM_E_INVALID for a forged tracker. */
#define ndm_growth_step(g) ndm_growth_step_at(NDM_HERE, (g))
/** ndm_growth_step() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_growth_step_at(NDM_SITE_PARAMS, ndm_growth g);
/** Print each site still alive with its class over the newer half of the
 *  kept steps, leaks first:
 *    ndm growth: 12 steps of system/model, 3 sites alive, 1 growing (classes over the last 12 steps)
 *      leak     +1.00 array/step, +4096 bytes/step: 12 arrays, 49152 bytes, created at train.c:40 (main) in system/model
 *      cache    grew, then stopped: 8 arrays, 32768 bytes, created at cache.c:10 (get) in system/model/cache
 *      steady   2 arrays, 1024 bytes, created at model.c:5 (build) in system/model
 *  Classes: leak (more alive at the end of the window than at its middle:
 *  it grows; the slope is per step), cache (grew, then stayed flat over the
 *  newer half), periodic (up and down, no net growth), steady (the same
 *  count at every kept step), too few steps (fewer than 3). A site with
 *  nothing alive at the last step is left out (released). A manager opened
 *  every step and never closed reads as a leak at the line that opened it.
 *  Returns NDM_OK. Owner: the text goes to the caller's f. Errors:
 *  NDM_E_INVALID for a NULL f or a forged tracker, NDM_E_CLOSED for a freed
 *  one. */
#define ndm_growth_report(g, f) ndm_growth_report_at(NDM_HERE, (g), (f))
/** ndm_growth_report() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_growth_report_at(NDM_SITE_PARAMS, ndm_growth g, FILE *f);
/** How many sites ndm_growth_report() would call a leak now.
 *  Returns that count (0 for a clean run), or a negative status. Owner:
 *  nothing is made. Errors as for ndm_growth_step(). */
#define ndm_growth_leaks(g) ndm_growth_leaks_at(NDM_HERE, (g))
/** ndm_growth_leaks() with an explicit call site (the macro passes NDM_HERE). */
NDM_API int64_t ndm_growth_leaks_at(NDM_SITE_PARAMS, ndm_growth g);
/** Is this a live tracker? Returns true or false. Owner: nothing is made.
 *  Errors: none (false for null, stale and forged handles). */
NDM_API bool ndm_growth_valid(ndm_growth g);
/** Free the tracker now (else its owner's close does).
 *  Returns NDM_OK, or NDM_ALREADY when it was freed already. Owner: nothing
 *  remains. Errors: NDM_E_INVALID for a forged handle, NDM_E_NULL for null. */
#define ndm_growth_free(g) ndm_growth_free_at(NDM_HERE, (g))
/** ndm_growth_free() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_growth_free_at(NDM_SITE_PARAMS, ndm_growth g);

#ifdef __cplusplus
}
#endif

#endif
