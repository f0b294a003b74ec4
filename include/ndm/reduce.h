/* ndm reductions over any set of axes, and softmax.
 *
 * A reduction combines the elements of `a` along some of its axes. Axes are
 * passed last, as an (n, const int *axes) pair written by a literal macro, so
 * they go through any macro:
 *
 *     ndm_sum(a, false, NDM_AXES(0, 2))      reduce axes 0 and 2
 *     ndm_sum(a, true, NDM_AXES(-1))         the last axis, kept with size 1
 *     ndm_sum(a, false, NDM_ALL_AXES_LIST)   every axis: a 0-d result
 *     ndm_sum(a, false, NDM_NO_AXES)         no axis: the elements, in the result dtype
 *
 * Negative axes count from the end; an axis out of range or given twice is
 * NDM_E_AXIS. With keepdim the reduced axes stay as size 1, so the result
 * broadcasts against `a`.
 *
 * Result dtypes and accuracy:
 *  - sum and prod of bool and integers accumulate in int64 (wrapping on
 *    overflow, as numpy) and return int64; of floats they return the input
 *    dtype.
 *  - Every float reduction accumulates in f64, whatever the input precision
 *    (f16, bf16 and f32 included), and rounds once at the end; contiguous f64
 *    sums add blocks of 16 lanes pairwise. Results may differ in the last bits
 *    with the number of threads (NDM_NUM_THREADS), never between two runs
 *    with the same count.
 *  - mean, var, std and logsumexp of bool and integers return f32 (f64
 *    accumulation); of floats, the input dtype.
 *  - max and min keep the dtype; argmax and argmin return int64; all and any
 *    return bool ("!= 0", so NaN counts as true).
 *  - NaN propagates through max, min (as numpy.max, not numpy.nanmax) and
 *    logsumexp; argmax/argmin return the index of the first NaN.
 *
 * Empty reductions (no element along the reduced axes): sum gives 0, prod 1,
 * all true, any false, logsumexp -inf, mean, var and std NaN (as numpy);
 * max, min, argmax and argmin have no identity and fail with NDM_E_SHAPE
 * (unless the result itself is empty).
 *
 * Ownership: every function returns a fresh array attached by the output
 * rule (the `_to` variant's manager, else the innermost scope of this thread,
 * else the manager of `a`), or the null handle on failure, with the reason
 * in ndm_last_error(). A null `a` propagates: the result is null and the
 * first error is kept. Inputs and outputs must be on the same device.
 *
 * Thread rules: as for arrays; kernels split large reductions over the
 * thread pool (NDM_NUM_THREADS).
 */
#ifndef NDM_REDUCE_H
#define NDM_REDUCE_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"
#include "view.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Axis lists: NDM_AXES(0, -1) expands to `2, (const int[]){0, -1}`. */
#define NDM_AXES(...)                                                           \
    NDM_LIST_COUNT_(int, __VA_ARGS__), NDM_LIST_(int, __VA_ARGS__)
/** Every axis (n = -1). */
#define NDM_ALL_AXES_LIST (-1), (const int *)0
/** No axis (numpy's axis=()): the result has the input's shape. */
#define NDM_NO_AXES 0, (const int *)0

/** @name Reductions and softmax
 *  Each returns a new array attached by the output rule (the `_to` form: to
 *  m), which the caller releases or its manager's close does, or the null
 *  handle. Common errors: NDM_E_AXIS (axis out of range or repeated,
 *  n < -1), NDM_E_INVALID (n > 0 with axes NULL), NDM_E_CLOSED for a stale
 *  input, the output manager's NDM_E_CLOSED/NDM_E_CAPPED/NDM_E_QUOTA,
 *  NDM_E_OOM. */
/** @{ */

/** Sum. */
#define ndm_sum(a, keepdim, ...)                                                \
    ndm_sum_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_sum() with the result attached to m instead of by the output rule. */
#define ndm_sum_to(m, a, keepdim, ...) ndm_sum_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_sum_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sum_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                int naxes, const int *axes);

/** Product. */
#define ndm_prod(a, keepdim, ...)                                               \
    ndm_prod_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_prod() with the result attached to m instead of by the output rule. */
#define ndm_prod_to(m, a, keepdim, ...) ndm_prod_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_prod_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_prod_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                 int naxes, const int *axes);

/** Arithmetic mean (NaN for an empty reduction). */
#define ndm_mean(a, keepdim, ...)                                               \
    ndm_mean_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_mean() with the result attached to m instead of by the output rule. */
#define ndm_mean_to(m, a, keepdim, ...) ndm_mean_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_mean_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_mean_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                 int naxes, const int *axes);

/** Variance: sum((x - mean)^2) / (n - ddof), computed in two passes over
 *  the data (the mean first). ddof 0 is the population variance, 1 the
 *  unbiased sample variance; n - ddof <= 0 gives inf or NaN as numpy does.
 *  ddof < 0 is NDM_E_INVALID. */
#define ndm_var(a, ddof, keepdim, ...)                                          \
    ndm_var_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (ddof), (keepdim), __VA_ARGS__)
/** ndm_var() with the result attached to m instead of by the output rule. */
#define ndm_var_to(m, a, ddof, keepdim, ...)                                    \
    ndm_var_to_at(NDM_HERE, (m), (a), (ddof), (keepdim), __VA_ARGS__)
/** ndm_var_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_var_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ddof,
                                bool keepdim, int naxes, const int *axes);

/** Standard deviation: the square root of ndm_var. */
#define ndm_std(a, ddof, keepdim, ...)                                          \
    ndm_std_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (ddof), (keepdim), __VA_ARGS__)
/** ndm_std() with the result attached to m instead of by the output rule. */
#define ndm_std_to(m, a, ddof, keepdim, ...)                                    \
    ndm_std_to_at(NDM_HERE, (m), (a), (ddof), (keepdim), __VA_ARGS__)
/** ndm_std_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_std_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ddof,
                                bool keepdim, int naxes, const int *axes);

/** Largest element (NaN if any is NaN). NDM_E_SHAPE for an empty reduction. */
#define ndm_max(a, keepdim, ...)                                                \
    ndm_max_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_max() with the result attached to m instead of by the output rule. */
#define ndm_max_to(m, a, keepdim, ...) ndm_max_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_max_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_max_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                int naxes, const int *axes);

/** Smallest element (NaN if any is NaN). NDM_E_SHAPE for an empty reduction. */
#define ndm_min(a, keepdim, ...)                                                \
    ndm_min_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_min() with the result attached to m instead of by the output rule. */
#define ndm_min_to(m, a, keepdim, ...) ndm_min_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_min_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_min_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                int naxes, const int *axes);

/** True where every element is non-zero (true for an empty reduction). */
#define ndm_all(a, keepdim, ...)                                                \
    ndm_all_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_all() with the result attached to m instead of by the output rule. */
#define ndm_all_to(m, a, keepdim, ...) ndm_all_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_all_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_all_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                int naxes, const int *axes);

/** True where some element is non-zero (false for an empty reduction). */
#define ndm_any(a, keepdim, ...)                                                \
    ndm_any_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_any() with the result attached to m instead of by the output rule. */
#define ndm_any_to(m, a, keepdim, ...) ndm_any_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_any_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_any_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, bool keepdim,
                                int naxes, const int *axes);

/** log(sum(exp(x))), computed as max + log(sum(exp(x - max))) so that it
 *  neither overflows nor underflows; -inf for an empty reduction. */
#define ndm_logsumexp(a, keepdim, ...)                                          \
    ndm_logsumexp_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (keepdim), __VA_ARGS__)
/** ndm_logsumexp() with the result attached to m instead of by the output rule. */
#define ndm_logsumexp_to(m, a, keepdim, ...)                                    \
    ndm_logsumexp_to_at(NDM_HERE, (m), (a), (keepdim), __VA_ARGS__)
/** ndm_logsumexp_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_logsumexp_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                      bool keepdim, int naxes, const int *axes);

/** Index (int64) of the largest element along `axis`, or in the flattened
 *  array (C order) with axis NDM_ALL_AXES; the first one on ties, the first
 *  NaN if there is one. keepdim keeps the axis (every axis, flattened) with
 *  size 1. NDM_E_SHAPE for an empty reduction. */
#define ndm_argmax(a, axis, keepdim)                                            \
    ndm_argmax_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (keepdim))
/** ndm_argmax() with the result attached to m instead of by the output rule. */
#define ndm_argmax_to(m, a, axis, keepdim) ndm_argmax_to_at(NDM_HERE, (m), (a), (axis), (keepdim))
/** ndm_argmax_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_argmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   bool keepdim);
/** Index of the smallest element; as ndm_argmax. */
#define ndm_argmin(a, axis, keepdim)                                            \
    ndm_argmin_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (keepdim))
/** ndm_argmin() with the result attached to m instead of by the output rule. */
#define ndm_argmin_to(m, a, axis, keepdim) ndm_argmin_to_at(NDM_HERE, (m), (a), (axis), (keepdim))
/** ndm_argmin_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_argmin_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   bool keepdim);

/** exp(x - max) / sum(exp(x - max)) along `axis`: the input's shape, f32
 *  for bool and integer inputs, the input dtype for floats (computed in f64).
 *  A 0-d input takes axis 0 or -1. A slice whose max is +inf or NaN gives
 *  NaN; one that is all -inf gives NaN too (0/0), as PyTorch. */
#define ndm_softmax(a, axis) ndm_softmax_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_softmax() with the result attached to m instead of by the output rule. */
#define ndm_softmax_to(m, a, axis) ndm_softmax_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_softmax_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_softmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);

/** x - max - log(sum(exp(x - max))) along `axis`; as ndm_softmax. */
#define ndm_log_softmax(a, axis) ndm_log_softmax_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_log_softmax() with the result attached to m instead of by the output rule. */
#define ndm_log_softmax_to(m, a, axis) ndm_log_softmax_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_log_softmax_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_log_softmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
