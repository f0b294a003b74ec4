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
 *  arrays. 0 when `m` is not a live manager (the error is recorded). */
NDM_API ndm_seq ndm_mark(ndm_manager m);
/** List the arrays of the subtree of `m` created after `mark` and still
 *  alive, grouped by creation site, largest group first. Writes nothing
 *  but a header line when there are none. NDM_OK, or NDM_E_INVALID for a
 *  NULL f. */
NDM_API ndm_status ndm_report_since(ndm_manager m, ndm_seq mark, FILE *f);
/** How many arrays of the subtree were created after `mark` and are alive
 *  (negative status on error). */
NDM_API int64_t ndm_count_since(ndm_manager m, ndm_seq mark);

/** Print every live manager under system (except the built-in nodes
 *  themselves) with path and creation site, oldest first (repeated siblings
 *  folded, see above), each followed by its live arrays grouped by creation
 *  site, largest group first:
 *    ndm leak report: 1 live manager, 320 live arrays
 *      manager system/leaky created at main.c:10 (main)
 *      320 arrays, 7680 bytes, created at main.c:12 (main) in system/leaky
 *  or "ndm leak report: nothing alive". Returns the number of live arrays.
 *  This is what NDM_LEAK_REPORT=1 prints at exit. */
NDM_API int64_t ndm_leak_report(FILE *f);

#ifdef __cplusplus
}
#endif

#endif
