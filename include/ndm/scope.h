/* ndm scopes: catching temporaries.
 *
 * ndm_scope_begin(parent, name) makes a child manager of `parent` and pushes
 * it as the calling thread's innermost scope. Until the scope ends, every
 * operation's output on this thread attaches to it (library temporaries
 * included) unless the caller names an output manager; factories name
 * theirs, NDM_CURRENT_SCOPE (base.h) being the innermost scope. ndm_scope_end
 * releases everything the scope holds except the `keep` arrays, which move
 * to the enclosing scope of this thread, or to `parent` when there is none.
 *
 *     ndm_manager s = ndm_scope_begin(batch, "loss");
 *     ndm_array t = ndm_mul(x, w);            // temporaries land in s
 *     ndm_array loss = ndm_sum(t, ...);
 *     if (ndm_scope_end(s, 1, &loss) < 0) ...  // loss moves to batch
 *
 * Scopes may end out of order: a function that forgot to end its scope does
 * not corrupt its caller's. A scope closed by any other means (its parent
 * closing, ndm_manager_close) simply leaves the stack.
 *
 * NDM_AUTO on a manager, scope or array variable closes, ends or releases it
 * when the block exits by any path (GCC and Clang):
 *
 *     NDM_AUTO ndm_manager req = ndm_manager_new(predictor, "request");
 *
 * Thread rules: the scope stack is per thread; a scope's manager is an
 * ordinary, thread-safe manager.
 */
#ifndef NDM_SCOPE_H
#define NDM_SCOPE_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Begin a scope under `parent` (NDM_CURRENT_SCOPE: under the innermost
 *  scope; a null parent is NDM_E_NULL). Returns the scope's manager, a child
 *  of parent that ndm_scope_end() closes (or parent's close does), or the
 *  null handle: errors as for ndm_manager_new(), and NDM_E_OOM. */
#define ndm_scope_begin(parent, name) ndm_scope_begin_at(NDM_HERE, (parent), (name))
/** ndm_scope_begin() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_manager ndm_scope_begin_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name);

/** End a scope: move `keep[0..n)` out (see above), release the rest, close
 *  the scope and pop it. Every kept array must be owned by the scope
 *  (NDM_E_NOT_OWNER otherwise), and the target must accept them
 *  (NDM_E_CAPPED, NDM_E_QUOTA, NDM_E_CLOSED); on any error nothing changes
 *  and the scope stays active. NDM_ALREADY for an ended scope; NDM_E_INVALID
 *  for a handle that is not a manager's (an array handle, a forged one),
 *  which ends nothing. */
#define ndm_scope_end(scope, n, keep) ndm_scope_end_at(NDM_HERE, (scope), (n), (keep))
/** ndm_scope_end() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_scope_end_at(NDM_SITE_PARAMS, ndm_manager scope, size_t n,
                                                  const ndm_array *keep);

/** Release every array of the scope (or of any manager) except `keep`, which
 *  must be owned by it (NDM_E_NOT_OWNER, nothing changes). The scope stays. */
#define ndm_scope_release_all_but(scope, n, keep)                               \
    ndm_scope_release_all_but_at(NDM_HERE, (scope), (n), (keep))
/** ndm_scope_release_all_but() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_scope_release_all_but_at(NDM_SITE_PARAMS, ndm_manager scope,
                                                              size_t n, const ndm_array *keep);
/** Release every array of the scope (or manager); the scope stays. Returns
 *  NDM_OK or the error of ndm_scope_release_all_but(). */
#define ndm_scope_release_all(scope) ndm_scope_release_all_but_at(NDM_HERE, (scope), 0, NULL)

/** Move `a` out of its scope now, to where ndm_scope_end would move a kept
 *  array. NDM_E_NOT_OWNER when `a` is not owned by a scope. */
#define ndm_scope_move_out(a) ndm_scope_move_out_at(NDM_HERE, (a))
/** ndm_scope_move_out() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_scope_move_out_at(NDM_SITE_PARAMS, ndm_array a);

/** The innermost live scope of this thread (null if none; never fails):
 *  the scope itself, a child of its parent, not a new manager to close. */
NDM_API ndm_manager ndm_scope_current(void);
/** Is `m` a scope? (false for null and stale handles; never fails) */
NDM_API bool ndm_manager_is_scope(ndm_manager m);

/** Run fn(ud) inside a fresh scope under `parent` and move its result out
 *  (to the enclosing scope or `parent`); everything else fn created is
 *  released. Returns the result, or the null handle when fn returned it.
 *  When fn returns an array it did not make in the scope (one of its
 *  inputs), the result is a fresh alias of it, moved out the same way: the
 *  handle that comes back is always a new one for the caller to release
 *  (one disposal protocol), and the input's own handle stays its owner's. */
typedef ndm_array (*ndm_scoped_fn)(void *ud);
/** Run fn(ud) in a fresh scope under `parent` (see ndm_scoped_fn): returns
 *  the new handle of fn's result, the caller's to release, or the null
 *  handle (NDM_E_INVALID for a NULL fn; the scope's and the move's errors). */
#define ndm_scoped(parent, fn, ud) ndm_scoped_at(NDM_HERE, (parent), (fn), (ud))
/** ndm_scoped() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_scoped_at(NDM_SITE_PARAMS, ndm_manager parent, ndm_scoped_fn fn, void *ud);

/** The one-expression form (GCC/Clang statement expression):
 *  `ndm_array y = NDM_SCOPED(batch, ndm_relu(ndm_add(ndm_matmul(x, w), b)));`
 *  evaluates the expression inside a scope under `parent`, keeps its value and
 *  releases the temporaries; an expression that yields an existing array
 *  gives a fresh alias of it (see ndm_scoped). The value is a new handle,
 *  the caller's to release, or the null handle with the error recorded. */
#define NDM_SCOPED(parent, expr)                                                \
    __extension__({                                                             \
        ndm_manager ndm_s_ = ndm_scope_begin((parent), "scoped");               \
        ndm_array ndm_r_ = (expr);                                              \
        ndm_r_ = ndm_scope_finish_at(NDM_HERE, ndm_s_, ndm_r_);                 \
        ndm_r_;                                                                 \
    })
/** End `scope` keeping `result` (which may be null; one made outside the
 *  scope is kept as a fresh alias, as ndm_scoped does); returns the kept
 *  handle, the caller's to release, or the null handle when the scope could not be ended, with
 *  ndm_scope_end's errors, NDM_E_CLOSED for a scope already ended and
 *  NDM_E_INVALID for a manager that is not a scope (system included);
 *  nothing is created then. Used by NDM_SCOPED. */
NDM_API ndm_array ndm_scope_finish_at(NDM_SITE_PARAMS, ndm_manager scope, ndm_array result);

/** The cleanup behind NDM_AUTO: `handle` points to an ndm_manager or
 *  ndm_array variable, which it closes, ends (a scope) or releases; a null
 *  handle is left alone. It returns nothing: the errors of the close, end or
 *  release (NDM_E_HOOK, NDM_E_NOT_OWNER...) go to the log callback as
 *  warnings. */
NDM_API void ndm_auto_cleanup(void *handle);
/* NDM_AUTO: cleanup at block exit. The handle's kind is in its id, so one
 * function serves managers, scopes and arrays. Errors during cleanup go to
 * the log callback. Other handles (modules, optimizers, loaders, predictors)
 * die with their manager and are refused: with GCC at compile time (the
 * cleanup takes only a manager or array pointer), with Clang at run time. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__cplusplus)
/** @cond */
typedef union __attribute__((transparent_union)) ndm_auto_handle_ {
    ndm_array *array;
    ndm_manager *manager;
} ndm_auto_handle_;
static inline void ndm_auto_cleanup_checked_(ndm_auto_handle_ h) { ndm_auto_cleanup(h.array); }
/** @endcond */
/** Declares a manager, scope or array variable that is closed, ended or
 *  released when its block exits by any path (ndm_auto_cleanup()). */
/* __extension__: ISO C has no argument conversion to a union. */
#define NDM_AUTO __extension__ __attribute__((cleanup(ndm_auto_cleanup_checked_)))
#elif defined(__GNUC__) && !defined(__clang__) /* C++ */
} /* extern "C" */
struct ndm_auto_handle_ {
    ndm_auto_handle_(ndm_array *a) : p(a) {}
    ndm_auto_handle_(ndm_manager *m) : p(m) {}
    void *p;
};
static inline void ndm_auto_cleanup_checked_(ndm_auto_handle_ h) { ndm_auto_cleanup(h.p); }
extern "C" {
#define NDM_AUTO __attribute__((cleanup(ndm_auto_cleanup_checked_)))
#elif defined(__GNUC__)
#define NDM_AUTO __attribute__((cleanup(ndm_auto_cleanup)))
#endif

#ifdef __cplusplus
}
#endif

#endif
