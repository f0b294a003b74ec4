/* ndm managers: the tree that owns every array.
 *
 *   system                 created on first use, never closed
 *   ├── model              parameters, optimizer state (long-lived, capped)
 *   │   └── trainer
 *   │       └── batch      one step's inputs, activations, graph
 *   └── detached           arrays taken out of the tree, still counted
 *
 * Ownership. Every array is owned by exactly one manager. Closing a manager
 * frees, in this order: its child managers (newest first, each closed the
 * same way), then its arrays (newest first), then its owned resources and
 * on-close hooks (newest first). Closing something already closed returns
 * NDM_ALREADY and changes nothing; any other use of a closed manager is
 * NDM_E_CLOSED. `system` and `detached` cannot be closed (NDM_E_ROOT).
 * Where a manager is expected, NDM_CURRENT_SCOPE stands for the innermost
 * scope of the calling thread, and a null manager is NDM_E_NULL (base.h).
 *
 * The output rule. An operation attaches its output to the manager of its
 * first array input, with two overrides, strongest first:
 *   1. an output manager the caller names (the `_to` variants, and the
 *      manager argument of every factory);
 *   2. the innermost scope active on the calling thread (see scope.h).
 *
 * Moves. ndm_attach steals an array, ndm_ret gives it to its manager's parent,
 * ndm_detach moves it under `detached` (the caller must release it), and
 * ndm_temp_attach lends it: when the borrower closes, the array goes back to
 * its lender (even a capped one), or is released if the lender is gone.
 * Lending a borrowed array again chains the loans: each borrower's close
 * gives it one step back (a lender that is gone passes it to the one
 * before); ndm_attach, ndm_ret and ndm_detach end the chain. Lending to
 * system or detached, which never close, is refused (NDM_E_ROOT). A refused
 * move (target closed, capped or over its byte limit) changes nothing.
 *
 * Hooks and ancestors. A manager's close marks it closing (no new arrays
 * or children), closes its children (each child's arrays, then its hooks),
 * then releases its own arrays, then runs its own hooks. So a child's
 * on-close hook may still release or move (ndm_attach...) the arrays of
 * its closing ancestors, but not put anything into them; a manager's own
 * hooks find its arrays released (NDM_E_CLOSED).
 *
 * Checks come before allocation: an array whose manager is closed, capped or
 * over its limit is refused before any memory is taken.
 *
 * Thread rules: managers are thread-safe. Many threads may create and close
 * children of one shared manager and read its arrays at the same time.
 * A manager may be closed (or an array released) while another thread's
 * operation on its arrays or modules runs: an operation that started before
 * the close (a kernel call, a module's forward, a predictor request) finishes
 * on memory that stays valid until it returns, and one that starts after it
 * fails with NDM_E_CLOSED. The memory goes back once every thread that was
 * inside an operation when the close ran has left it (deferred, epoch-based
 * reclamation); the close itself does not wait, and the manager's counts
 * drop at once. This is what makes hot-swapping a served model safe: load
 * the new model, publish its predictor, close the old model. Pointers from
 * ndm_array_data() are the caller's: they are not protected. A close may race with creations in the manager, views of its
 * arrays and moves into or out of it: each of those either completes before
 * the close drains the manager (the close then releases what it made) or
 * fails with NDM_E_CLOSED, changing nothing; none leaves an array in a
 * closed manager.
 */
#ifndef NDM_MANAGER_H
#define NDM_MANAGER_H

#include "base.h"
#include "device.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The root manager (on the CPU). Created on first use; never closed, and
 *  never fails. */
NDM_API ndm_manager ndm_system(void);
/** The node that holds detached arrays (a child of system, never closed;
 *  never fails). */
NDM_API ndm_manager ndm_detached(void);

/** A new child of `parent` on the parent's device, named `name` (copied;
 *  NULL or "" gives "manager"). Names are kept to their first 47 bytes: a
 *  longer one is cut, without an error, and the cut name is what
 *  ndm_manager_name, paths, dumps and reports show (a multi-byte character
 *  cut in two shows as U+FFFD in JSON). Returns the null handle on failure:
 *  parent stale (NDM_E_CLOSED), null (NDM_E_NULL), capped for children
 *  (NDM_E_CAPPED). */
#define ndm_manager_new(parent, name) ndm_manager_new_at(NDM_HERE, (parent), (name))
/** ndm_manager_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_manager ndm_manager_new_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name);

/** Like ndm_manager_new, on another device (NDM_E_DEVICE when it does not
 *  exist, NDM_E_UNSUPPORTED without its backend). */
#define ndm_manager_new_on(parent, name, device)                                \
    ndm_manager_new_on_at(NDM_HERE, (parent), (name), (device))
/** ndm_manager_new_on() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_manager ndm_manager_new_on_at(NDM_SITE_PARAMS, ndm_manager parent,
                                          const char *name, ndm_device device);

/** Close a manager and everything it owns (order above). NDM_OK, or
 *  NDM_ALREADY if it was closed or is being closed, NDM_E_ROOT for
 *  system/detached, NDM_E_HOOK when a hook failed (the close still
 *  completed). A close that meets a child being closed by another thread
 *  waits for that close to end. A hook (or an owned resource's free_fn) may
 *  close an ancestor of its manager: the ancestor's close runs at once and
 *  completes, taking the closing manager out of the tree without waiting
 *  for it; that manager's close then finishes its remaining hooks as usual.
 *  A hook that closes its own manager gets NDM_ALREADY. */
#define ndm_manager_close(m) ndm_manager_close_at(NDM_HERE, (m))
/** ndm_manager_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_close_at(NDM_SITE_PARAMS, ndm_manager m);

/** What a cap refuses. */
enum {
    NDM_CAP_ARRAYS = 1u << 0,   /* new arrays and arrays moved in */
    NDM_CAP_CHILDREN = 1u << 1, /* new child managers */
};

/** Cap a manager: it refuses what `flags` names, reporting the refused
 *  array's creation site. In-place updates of its arrays still work, and
 *  borrowed arrays can still come back. NDM_OK; NDM_E_INVALID for unknown
 *  flag bits, NDM_E_ROOT for system/detached. */
NDM_API NDM_NODISCARD ndm_status ndm_manager_cap(ndm_manager m, unsigned flags);
/** Lift the caps named by `flags`. Errors as for ndm_manager_cap(). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_uncap(ndm_manager m, unsigned flags);
/** The manager's current cap flags (0 when stale or null; never fails, sets
 *  no error). */
NDM_API unsigned ndm_manager_caps(ndm_manager m);

/** Limit the bytes that the subtree of `m` holds on `device`. A request that
 *  would exceed it fails with NDM_E_QUOTA; other requests go on. 0 removes
 *  the limit. Setting a limit below the current use is allowed: it refuses
 *  new bytes until enough are freed. NDM_E_DEVICE for a device that this
 *  process cannot use (cuda:0 without a GPU).
 *  Views: storage shared by views is charged to one manager that owns a
 *  view of it; when that manager's last view goes, the charge moves to the
 *  manager of another view. So a view made into a manager under a limit, of
 *  storage charged outside that limit, is refused with NDM_E_QUOTA unless the
 *  storage's whole size fits under the limit then (even a view of no
 *  elements). When a charge moves, it goes to the newest view's manager that
 *  still has room under its limits; only when none has does a limit take it
 *  regardless (the storage is alive and must be counted somewhere). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_set_limit(ndm_manager m, ndm_device device,
                                                       uint64_t bytes);
/** The limit on `device` (0 = none), or 0 with NDM_E_NULL / NDM_E_CLOSED
 *  set for a null or stale m. */
NDM_API uint64_t ndm_manager_limit(ndm_manager m, ndm_device device);

/** Make `m` own another resource: free_fn(ptr) runs when `m` closes (newest
 *  first, after the arrays). `name` (copied, may be NULL) shows in reports.
 *  On failure free_fn is NOT called; the caller still owns ptr. NDM_OK;
 *  NDM_E_INVALID for a NULL free_fn, NDM_E_CLOSED for a closed or closing
 *  m, NDM_E_ROOT for system/detached, NDM_E_OOM. */
#define ndm_manager_own(m, ptr, free_fn, name)                                  \
    ndm_manager_own_at(NDM_HERE, (m), (ptr), (free_fn), (name))
/** ndm_manager_own() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_own_at(NDM_SITE_PARAMS, ndm_manager m, void *ptr,
                                                    void (*free_fn)(void *ptr), const char *name);

/** Run fn(ud) when `m` closes (same order as owned resources). A non-zero
 *  return is reported through the log callback and makes the close return
 *  NDM_E_HOOK; the close still completes. */
typedef int (*ndm_close_fn)(void *ud);
/** Register fn(ud) to run when `m` closes (see ndm_close_fn). NDM_OK;
 *  NDM_E_INVALID for a NULL fn, NDM_E_CLOSED for a closed or closing m,
 *  NDM_E_ROOT for system/detached, NDM_E_OOM; nothing is registered then. */
#define ndm_manager_on_close(m, fn, ud) ndm_manager_on_close_at(NDM_HERE, (m), (fn), (ud))
/** ndm_manager_on_close() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_on_close_at(NDM_SITE_PARAMS, ndm_manager m,
                                                         ndm_close_fn fn, void *ud);

/** Re-parent `child`: it goes, with its whole subtree, arrays, hooks and
 *  counts, under `new_parent` as its newest child, so that closing its old
 *  parent no longer closes it and closing new_parent does; paths, dumps and
 *  ndm_manager_parent show the new place. The child keeps its device (a
 *  child may be on another device than its parent, as ndm_manager_new_on
 *  makes them). Its bytes leave the byte limits over the old place and are
 *  charged to those over the new one. Returns NDM_OK (also when new_parent
 *  is already its parent). Owner: new_parent owns child from then on; on
 *  failure nothing changes. Errors: NDM_E_NULL / NDM_E_CLOSED for either
 *  handle, NDM_E_CLOSED when either is closing, NDM_E_ROOT for system or
 *  detached as the child and detached as the new parent, NDM_E_INVALID
 *  when new_parent is child or below it (a cycle) or child is a scope (it
 *  ends where it began), NDM_E_CAPPED for a new parent capped with
 *  NDM_CAP_CHILDREN, NDM_E_QUOTA when the subtree's bytes do not fit a
 *  limit over new_parent, NDM_E_OOM. A close racing with the move either
 *  happens first (the move is refused, or finds the child gone with its old
 *  parent) or after it, on the tree as the move left it. */
#define ndm_manager_move(child, new_parent) ndm_manager_move_at(NDM_HERE, (child), (new_parent))
/** ndm_manager_move() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_manager_move_at(NDM_SITE_PARAMS, ndm_manager child,
                                                     ndm_manager new_parent);

/** Is this a live manager? (false for null and stale handles; never fails,
 *  sets no error) */
NDM_API bool ndm_manager_valid(ndm_manager m);
/** The parent (null for system, or with NDM_E_NULL / NDM_E_CLOSED for a
 *  null or stale handle): the parent itself, not a new manager to close. */
NDM_API ndm_manager ndm_manager_parent(ndm_manager m);
/** The manager's device (the CPU for a null or stale handle, with
 *  NDM_E_NULL / NDM_E_CLOSED set). */
NDM_API ndm_device ndm_manager_device(ndm_manager m);
/** Copies the name into buf (NUL-terminated, truncated to n); returns the
 *  length of the name as kept (47 bytes at most), or a negative status
 *  (NDM_E_NULL, NDM_E_CLOSED). */
NDM_API int ndm_manager_name(ndm_manager m, char *buf, size_t n);
/** Copies the path ("system/model/trainer/batch-17") into buf like
 *  ndm_manager_name; returns its length; errors as for ndm_manager_name(). */
NDM_API int ndm_manager_path(ndm_manager m, char *buf, size_t n);

/** Steal `a` into `m`. The array keeps its handle. Refused (nothing changes)
 *  when m is closed (NDM_E_CLOSED), capped (NDM_E_CAPPED) or over its limit
 *  (NDM_E_QUOTA). Attaching to its current manager is NDM_OK. */
#define ndm_attach(a, m) ndm_attach_at(NDM_HERE, (a), (m))
/** ndm_attach() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_attach_at(NDM_SITE_PARAMS, ndm_array a, ndm_manager m);
/** Steal a list of n arrays into `m`, all or none, as n ndm_attach calls
 *  that either all succeed or all are refused; the list comes last, so a
 *  literal works: ndm_attach_all(m, NDM_ARRAYS(a, b, c)). Returns NDM_OK
 *  when every array is m's (duplicates in the list move once; an array
 *  already in m stays, and a borrowed array's loan ends, as with
 *  ndm_attach). Owner: m owns every listed array on success; on failure
 *  each array stays with its manager, every counter, charge and loan
 *  unchanged; the list itself stays the caller's. Errors: NDM_E_NULL,
 *  NDM_E_INVALID (forged) or NDM_E_CLOSED (stale, or released by a close
 *  meanwhile) for an entry, the message naming its index and the array;
 *  NDM_E_CLOSED (m closed or closing), NDM_E_CAPPED, NDM_E_QUOTA (the
 *  set's bytes do not fit a limit over m), NDM_E_OOM; NDM_E_INVALID for a
 *  NULL list with n > 0. A close of a source manager or of m on another
 *  thread makes the call either move every array before the close drains
 *  them, or refuse. */
#define ndm_attach_all(m, ...) ndm_attach_all_at(NDM_HERE, (m), __VA_ARGS__)
/** ndm_attach_all() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_attach_all_at(NDM_SITE_PARAMS, ndm_manager m, size_t n,
                                                   const ndm_array *arrays);
/** Move `a` to its manager's parent. NDM_E_ROOT when the owner is system
 *  or detached. */
#define ndm_ret(a) ndm_ret_at(NDM_HERE, (a))
/** ndm_ret() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_ret_at(NDM_SITE_PARAMS, ndm_array a);
/** Move `a` under the `detached` node; the caller must release it. NDM_OK;
 *  NDM_E_NULL / NDM_E_CLOSED for the handle, NDM_E_OOM. */
#define ndm_detach(a) ndm_detach_at(NDM_HERE, (a))
/** ndm_detach() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_detach_at(NDM_SITE_PARAMS, ndm_array a);
/** Lend `a` to `m`; it returns to its current manager when m closes (see
 *  the chains above). NDM_E_ROOT for system or detached. */
#define ndm_temp_attach(a, m) ndm_temp_attach_at(NDM_HERE, (a), (m))
/** ndm_temp_attach() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_temp_attach_at(NDM_SITE_PARAMS, ndm_array a, ndm_manager m);

#ifdef __cplusplus
}
#endif

#endif
