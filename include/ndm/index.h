/* ndm shape and indexing operations: concat, stack, split, take, gather,
 * scatter_add, one_hot, pad, flip, tile, repeat, cumsum, cumprod, nonzero,
 * masked_select, indexing by several index arrays (ndm_index), the
 * triangles of matrices (tril, triu, tri) and sorting (sort, argsort,
 * topk).
 *
 * Ownership. Every function that returns a handle returns a fresh one,
 * attached by the output rule: the `_to` variant's manager, else the
 * innermost scope of this thread, else the manager of the first array input.
 * Outputs live on the inputs' device. ndm_flip and ndm_split return views
 * that share storage with their input; everything else returns a new
 * C-contiguous array. ndm_scatter_add_ writes into its first input and
 * returns a status; it creates nothing.
 *
 * Errors. A null input handle makes the result null and keeps the first
 * error; a stale one is NDM_E_CLOSED. Everything (handles, axes, shapes,
 * dtypes, devices, index ranges, size overflow, the output manager) is
 * checked before any memory is taken, so a failed call allocates nothing and
 * an in-place call that fails leaves its input untouched.
 *
 * Axes may be negative (counted from the end). Index arrays may be u8, i32 or
 * i64 (NDM_E_DTYPE otherwise). ndm_take, ndm_gather, ndm_scatter_add and
 * ndm_index accept negative indices, counted from the end of the axis as
 * in Python; an index outside [-n, n) is NDM_E_INVALID and the message
 * names it and its position. ndm_one_hot accepts [0, num_classes) only.
 *
 * Lists of arrays and of sizes come last, so literals work in the macros:
 *     ndm_concat(0, NDM_ARRAYS(a, b, c))
 *     ndm_pad(x, NDM_PAD_CONSTANT, 0.0, NDM_SHAPE(1, 1, 2, 2))
 *
 * Thread rules: as for arrays. Large copies use the CPU thread pool.
 */
#ifndef NDM_INDEX_H
#define NDM_INDEX_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** An array list literal: NDM_ARRAYS(a, b) expands to
 *  `2, (const ndm_array[]){a, b}`, the (n, arrays) pair concat and stack take. */
#define NDM_ARRAYS(...)                                                         \
    NDM_LIST_COUNT_(ndm_array, __VA_ARGS__), NDM_LIST_(ndm_array, __VA_ARGS__)

/** @name Shape and indexing operations
 *  Each returns a new handle attached by the output rule (the `_to` form:
 *  to m), which the caller releases or its manager's close does, or the null
 *  handle with nothing allocated; ndm_split and ndm_split_indices fill outs
 *  and return a status, ndm_scatter_add_ writes in place. Errors are checked
 *  before any allocation: those named per function, NDM_E_AXIS, NDM_E_DTYPE
 *  (index arrays), NDM_E_DEVICE, NDM_E_OVERFLOW, the handles' NDM_E_NULL /
 *  NDM_E_CLOSED, the output manager's NDM_E_CAPPED / NDM_E_QUOTA, NDM_E_OOM. */
/** @{ */

/** Join n >= 1 arrays along an existing axis. All have the same rank (>= 1)
 *  and the same sizes except along `axis`, and live on one device. The
 *  result's dtype is ndm_result_type over the inputs; each is converted.
 *  NDM_E_SHAPE (sizes or ranks differ), NDM_E_AXIS, NDM_E_DEVICE,
 *  NDM_E_INVALID (n < 1 or arrays NULL). */
#define ndm_concat(axis, ...) ndm_concat_to_at(NDM_HERE, NDM_OUTPUT_RULE, (axis), __VA_ARGS__)
/** ndm_concat() with the result attached to m instead of by the output rule. */
#define ndm_concat_to(m, axis, ...) ndm_concat_to_at(NDM_HERE, (m), (axis), __VA_ARGS__)
/** ndm_concat_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_concat_to_at(NDM_SITE_PARAMS, ndm_manager out, int axis, int n,
                                   const ndm_array *arrays);

/** Join n >= 1 arrays of one shape along a new axis, which has index `axis`
 *  in the result (in [-ndim-1, ndim]). dtypes combine as in ndm_concat. */
#define ndm_stack(axis, ...) ndm_stack_to_at(NDM_HERE, NDM_OUTPUT_RULE, (axis), __VA_ARGS__)
/** ndm_stack() with the result attached to m instead of by the output rule. */
#define ndm_stack_to(m, axis, ...) ndm_stack_to_at(NDM_HERE, (m), (axis), __VA_ARGS__)
/** ndm_stack_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_stack_to_at(NDM_SITE_PARAMS, ndm_manager out, int axis, int n,
                                  const ndm_array *arrays);

/** Split `a` along `axis` into `sections` equal views, written to
 *  outs[0..sections). The axis size must divide evenly (NDM_E_SHAPE) and
 *  sections must be >= 1 (NDM_E_INVALID). All or nothing: on failure every
 *  outs entry is the null handle and nothing was created; the status says
 *  why (a null input returns the first error's status). */
#define ndm_split(a, axis, sections, outs)                                      \
    ndm_split_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (sections), (outs))
/** ndm_split() with the result attached to m instead of by the output rule. */
#define ndm_split_to(m, a, axis, sections, outs)                                \
    ndm_split_to_at(NDM_HERE, (m), (a), (axis), (sections), (outs))
/** ndm_split_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_split_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                                 int axis, int64_t sections, ndm_array *outs);

/** Split `a` along `axis` before each of the n indices into n + 1 views,
 *  written to outs[0..n]: a[:i0], a[i0:i1], ..., a[i(n-1):]. Negative
 *  indices count from the end; after that they must lie in [0, size] and
 *  not decrease (NDM_E_INVALID naming the index), so pieces may be empty
 *  but never overlap. All or nothing, as ndm_split. */
#define ndm_split_indices(a, axis, outs, ...)                                   \
    ndm_split_indices_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (outs), __VA_ARGS__)
/** ndm_split_indices() with the result attached to m instead of by the output rule. */
#define ndm_split_indices_to(m, a, axis, outs, ...)                             \
    ndm_split_indices_to_at(NDM_HERE, (m), (a), (axis), (outs), __VA_ARGS__)
/** ndm_split_indices_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_split_indices_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                         ndm_array a, int axis, ndm_array *outs,
                                                         int n, const int64_t *indices);

/** numpy's take (PyTorch's index_select when indices is 1-d): the entries
 *  `indices` picks along `axis`. The result has shape
 *  a.shape[:axis] + indices.shape + a.shape[axis+1:]; 0-d indices remove the
 *  axis, 2-d indices into axis 0 of a table are an embedding lookup. */
#define ndm_take(a, axis, indices)                                              \
    ndm_take_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (indices))
/** ndm_take() with the result attached to m instead of by the output rule. */
#define ndm_take_to(m, a, axis, indices) ndm_take_to_at(NDM_HERE, (m), (a), (axis), (indices))
/** ndm_take_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_take_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                 ndm_array indices);
/** ndm_take with a 1-d index array (NDM_E_SHAPE otherwise). */
#define ndm_index_select(a, axis, indices)                                      \
    ndm_index_select_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (indices))
/** ndm_index_select() with the result attached to m instead of by the output rule. */
#define ndm_index_select_to(m, a, axis, indices)                                \
    ndm_index_select_to_at(NDM_HERE, (m), (a), (axis), (indices))
/** ndm_index_select_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_index_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                         ndm_array indices);

/** numpy's take_along_axis (PyTorch's gather, with broadcasting):
 *  out[..., k, ...] = a[..., indices[..., k, ...], ...] along `axis`.
 *  indices has a's rank; its other axes broadcast against a's. The result
 *  has the broadcast shape with indices' size along `axis`. */
#define ndm_gather(a, axis, indices)                                            \
    ndm_gather_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (indices))
/** ndm_gather() with the result attached to m instead of by the output rule. */
#define ndm_gather_to(m, a, axis, indices) ndm_gather_to_at(NDM_HERE, (m), (a), (axis), (indices))
/** ndm_gather_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_gather_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   ndm_array indices);

/** The inverse of ndm_gather: a[..., indices[..., k, ...], ...] += src[..., k, ...]
 *  along `axis`; repeated indices accumulate (bool adds as "or"). indices
 *  has a's rank, and its other axes equal a's or are 1 (broadcast); src
 *  broadcasts to the shape of that iteration and is converted to a's dtype.
 *  ndm_scatter_add_ writes into `a` (a capped manager's arrays too);
 *  ndm_scatter_add returns an updated copy. */
#define ndm_scatter_add(a, axis, indices, src)                                  \
    ndm_scatter_add_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (indices), (src))
/** ndm_scatter_add() with the result attached to m instead of by the output rule. */
#define ndm_scatter_add_to(m, a, axis, indices, src)                            \
    ndm_scatter_add_to_at(NDM_HERE, (m), (a), (axis), (indices), (src))
/** ndm_scatter_add_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_scatter_add_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                        ndm_array indices, ndm_array src);
/** ndm_scatter_add() in place: adds into `a` and returns NDM_OK or the
 *  error (a unchanged then); creates nothing. */
#define ndm_scatter_add_(a, axis, indices, src)                                 \
    ndm_scatter_add_inplace_at(NDM_HERE, (a), (axis), (indices), (src))
/** ndm_scatter_add_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_scatter_add_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                            int axis, ndm_array indices,
                                                            ndm_array src);

/** indices.shape + [num_classes] of `dtype`: 1 where the last coordinate
 *  equals the index, 0 elsewhere. num_classes >= 1; every index must lie in
 *  [0, num_classes) (NDM_E_INVALID naming the first that does not). */
#define ndm_one_hot(indices, num_classes, dtype)                                \
    ndm_one_hot_to_at(NDM_HERE, NDM_OUTPUT_RULE, (indices), (num_classes), (dtype))
/** ndm_one_hot() with the result attached to m instead of by the output rule. */
#define ndm_one_hot_to(m, indices, num_classes, dtype)                          \
    ndm_one_hot_to_at(NDM_HERE, (m), (indices), (num_classes), (dtype))
/** ndm_one_hot_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_one_hot_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array indices,
                                    int64_t num_classes, ndm_dtype dtype);

/** What ndm_pad() fills the new border with. */
typedef enum ndm_pad_mode {
    NDM_PAD_CONSTANT = 0, /**< `value`, converted to the array's dtype */
    NDM_PAD_EDGE = 1,     /**< the nearest edge element */
    NDM_PAD_REFLECT = 2,  /**< mirrored about the edge element, not repeating it
                               (numpy's "reflect"); wide pads keep mirroring */
} ndm_pad_mode;

/** `a` grown by widths: n == 2 * ndim entries (before, after) per axis in
 *  order, or n == 2 for the same pair on every axis. Widths are >= 0. EDGE
 *  and REFLECT need a non-empty axis wherever they pad (NDM_E_SHAPE). */
#define ndm_pad(a, mode, value, ...)                                            \
    ndm_pad_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (mode), (value), __VA_ARGS__)
/** ndm_pad() with the result attached to m instead of by the output rule. */
#define ndm_pad_to(m, a, mode, value, ...)                                      \
    ndm_pad_to_at(NDM_HERE, (m), (a), (mode), (value), __VA_ARGS__)
/** ndm_pad_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_pad_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_pad_mode mode,
                                double value, int n, const int64_t *widths);

/** `a` reversed along `axis`, or along every axis with NDM_ALL_AXES: a view
 *  with a negative stride, no copy. */
#define ndm_flip(a, axis) ndm_flip_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_flip() with the result attached to m instead of by the output rule. */
#define ndm_flip_to(m, a, axis) ndm_flip_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_flip_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_flip_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);

/** numpy's tile: `a` repeated reps[i] times along each axis. With fewer reps
 *  than axes, leading reps are 1; with more, `a` gains leading size-1 axes.
 *  Reps are >= 0. */
#define ndm_tile(a, ...) ndm_tile_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), __VA_ARGS__)
/** ndm_tile() with the result attached to m instead of by the output rule. */
#define ndm_tile_to(m, a, ...) ndm_tile_to_at(NDM_HERE, (m), (a), __VA_ARGS__)
/** ndm_tile_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_tile_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                 const int64_t *reps);

/** numpy's repeat along `axis`: each entry `repeats` (>= 0) times in a row. */
#define ndm_repeat(a, axis, repeats)                                            \
    ndm_repeat_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (repeats))
/** ndm_repeat() with the result attached to m instead of by the output rule. */
#define ndm_repeat_to(m, a, axis, repeats) ndm_repeat_to_at(NDM_HERE, (m), (a), (axis), (repeats))
/** ndm_repeat_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_repeat_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   int64_t repeats);
/** Entry i along `axis` repeated repeats[i] times; n equals the axis size,
 *  or n == 1 repeats every entry alike. */
#define ndm_repeat_each(a, axis, ...)                                           \
    ndm_repeat_each_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), __VA_ARGS__)
/** ndm_repeat_each() with the result attached to m instead of by the output rule. */
#define ndm_repeat_each_to(m, a, axis, ...)                                     \
    ndm_repeat_each_to_at(NDM_HERE, (m), (a), (axis), __VA_ARGS__)
/** ndm_repeat_each_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_repeat_each_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                        int n, const int64_t *repeats);

/** Running sums along `axis`. Returns a's shape: bool and integer inputs
 *  accumulate in int64 and give i64 (wrapping on overflow); floats give
 *  their own dtype, accumulating in it (f16 and bf16 in f32). Owner: the
 *  output rule's manager (a's unless a scope or the _to form names one),
 *  or m for the _to form. Errors: NDM_E_AXIS when axis is outside
 *  [-ndim, ndim), NDM_E_NULL / NDM_E_CLOSED for a null or stale handle,
 *  NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from the output manager. */
#define ndm_cumsum(a, axis) ndm_cumsum_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_cumsum() with the result attached to m instead of by the output rule. */
#define ndm_cumsum_to(m, a, axis) ndm_cumsum_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_cumsum_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_cumsum_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);

/** numpy's cumprod (PyTorch's cumprod) along `axis`. Returns the running
 *  products, a's shape: bool and integer inputs multiply in int64 and give
 *  i64 (wrapping on overflow); floats give their own dtype, multiplying in
 *  it (f16 and bf16 in f32). Owner: the output rule's manager (a's unless a
 *  scope or the _to form names one), or m for the _to form. Errors:
 *  NDM_E_AXIS when axis is outside [-ndim, ndim), NDM_E_NULL / NDM_E_CLOSED
 *  for a null or stale handle, NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from
 *  the output manager. The gradient is exact when the input holds zeros. */
#define ndm_cumprod(a, axis) ndm_cumprod_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_cumprod() with the result attached to m instead of by the output rule. */
#define ndm_cumprod_to(m, a, axis) ndm_cumprod_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_cumprod_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_cumprod_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);

/* The next three size their result by the data: they count first, and on a
 * device that count is read back to the host (the call waits for the
 * device's queue to reach it), as torch.nonzero and masked_select do. */

/** numpy's argwhere (torch.nonzero): Returns an i64 array of shape
 *  [count, ndim] holding, row by row in C order, the coordinates of a's
 *  nonzero entries (NaN counts as nonzero, -0.0 as zero); a 0-d `a` gives
 *  [count, 0]. Integer output: no gradient. Owner: the output rule's
 *  manager (a's), or m for the _to form. Errors: NDM_E_NULL / NDM_E_CLOSED
 *  for a null or stale handle, NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from
 *  the output manager, a device's NDM_E_UNSUPPORTED. */
#define ndm_nonzero(a) ndm_nonzero_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_nonzero() with the result attached to m instead of by the output rule. */
#define ndm_nonzero_to(m, a) ndm_nonzero_to_at(NDM_HERE, (m), (a))
/** ndm_nonzero_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_nonzero_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);

/** torch.masked_select (numpy's a[mask] with a bool mask): a and mask
 *  broadcast together, and the result is a's entries (broadcast) where
 *  the mask is true, in C order. Returns a new 1-d array of a's dtype.
 *  Its gradient scatters back into zeros of the broadcast shape and sums
 *  over the broadcast axes. Owner: the output rule's manager (a's), or m
 *  for the _to form. Errors: NDM_E_DTYPE when mask is not bool,
 *  NDM_E_SHAPE when the shapes do not broadcast, NDM_E_DEVICE when they
 *  live on different devices, NDM_E_NULL / NDM_E_CLOSED for a null or stale
 *  handle, NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from the output manager. */
#define ndm_masked_select(a, mask)                                              \
    ndm_masked_select_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (mask))
/** ndm_masked_select() with the result attached to m instead of by the output rule. */
#define ndm_masked_select_to(m, a, mask) ndm_masked_select_to_at(NDM_HERE, (m), (a), (mask))
/** ndm_masked_select_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_masked_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                          ndm_array mask);

/** numpy's advanced indexing on the leading axes, x[i, j]:
 *      ndm_index(x, NDM_ARRAYS(i, j))
 *  n integer index arrays (u8, i32 or i64) index axes 0..n-1 of `a`; they
 *  broadcast together. Returns a new array of a's dtype with shape
 *  broadcast(index shapes) + a.shape[n:]. Negative indices count from the
 *  end as in numpy. Named beside ndm_take (one array, one axis) and
 *  ndm_gather (one array, a's rank): this is the subscript itself, and the
 *  list comes last, as ndm_concat's does, so NDM_ARRAYS reads like the
 *  brackets. The gradient scatter-adds into zeros of a's shape (repeated
 *  indices accumulate). Owner: the output rule's manager (a's), or m for
 *  the _to form. Errors: NDM_E_INVALID when n is outside [1, a's rank] or
 *  the list is NULL, or when an index lies outside [-size, size) of its
 *  axis (the message names the value, its position, the axis and which
 *  index array); NDM_E_DTYPE for an index array that is not u8, i32 or
 *  i64 (bool: use ndm_masked_select); NDM_E_SHAPE when the index shapes do
 *  not broadcast; NDM_E_DEVICE when an index array lives elsewhere;
 *  NDM_E_NULL / NDM_E_CLOSED for a null or stale handle; NDM_E_CAPPED /
 *  NDM_E_QUOTA / NDM_E_OOM from the output manager. */
#define ndm_index(a, ...) ndm_index_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), __VA_ARGS__)
/** ndm_index() with the result attached to m instead of by the output rule. */
#define ndm_index_to(m, a, ...) ndm_index_to_at(NDM_HERE, (m), (a), __VA_ARGS__)
/** ndm_index_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_index_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                  const ndm_array *indices);
/** numpy's tril (torch.tril): a copy of `a` (rank >= 2) with the entries
 *  above the k-th diagonal of its last two axes set to zero: entry
 *  [..., i, j] is kept where j - i <= k (k = 0: the main diagonal, k > 0
 *  above it, k < 0 below). Every batch axis in front is treated alike.
 *  Returns a new array of a's dtype and shape; the gradient is the same
 *  triangle of the incoming gradient. Owner: the output rule's manager
 *  (a's), or m for the _to form. Errors: NDM_E_SHAPE for a rank below 2,
 *  NDM_E_NULL / NDM_E_CLOSED for a null or stale handle, NDM_E_CAPPED /
 *  NDM_E_QUOTA / NDM_E_OOM from the output manager. */
#define ndm_tril(a, k) ndm_tril_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (k))
/** ndm_tril() with the result attached to m instead of by the output rule. */
#define ndm_tril_to(m, a, k) ndm_tril_to_at(NDM_HERE, (m), (a), (k))
/** ndm_tril_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_tril_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int64_t k);

/** numpy's triu (torch.triu): as ndm_tril, keeping the entries on and above
 *  the k-th diagonal (j - i >= k) and zeroing those below. Errors as for
 *  ndm_tril(). */
#define ndm_triu(a, k) ndm_triu_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (k))
/** ndm_triu() with the result attached to m instead of by the output rule. */
#define ndm_triu_to(m, a, k) ndm_triu_to_at(NDM_HERE, (m), (a), (k))
/** ndm_triu_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_triu_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int64_t k);

/** numpy's tri: a new [rows, cols] array of `dtype` owned by m
 *  (NDM_CURRENT_SCOPE: this thread's innermost scope), 1 where j - i <= k
 *  and 0 elsewhere, made in one pass with no full-size temporary. The
 *  causal mask of attention is ndm_tri(m, NDM_BOOL, n, n, 0): position i
 *  sees positions j <= i. Errors: NDM_E_SHAPE for a negative size,
 *  NDM_E_DTYPE for an invalid dtype, and the factory errors of array.h. */
#define ndm_tri(m, dtype, rows, cols, k) ndm_tri_at(NDM_HERE, (m), (dtype), (rows), (cols), (k))
/** ndm_tri() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_tri_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int64_t rows,
                             int64_t cols, int64_t k);

/** A stable sort of a (rank >= 1) along `axis`, ascending, or descending
 *  when `descending` (torch.sort(a, axis, descending, stable=True); numpy's
 *  sort with kind="stable" ascending). Every dtype sorts by value: NaN
 *  sorts above +inf (last ascending, first descending, as PyTorch places
 *  it), -0.0 equals 0.0, and equal entries keep their order in either
 *  direction. Returns a new array of a's dtype and shape; for a float `a`
 *  the gradient goes back to the position each value came from. Owner: the
 *  output rule's manager (a's), or m for the _to form. Errors: NDM_E_AXIS
 *  when axis is outside [-ndim, ndim) (a rank-0 `a` has none), NDM_E_NULL /
 *  NDM_E_CLOSED for a null or stale handle, NDM_E_CAPPED / NDM_E_QUOTA /
 *  NDM_E_OOM from the output manager (the kernel's scratch too). */
#define ndm_sort(a, axis, descending)                                           \
    ndm_sort_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (descending))
/** ndm_sort() with the result attached to m instead of by the output rule. */
#define ndm_sort_to(m, a, axis, descending)                                     \
    ndm_sort_to_at(NDM_HERE, (m), (a), (axis), (descending))
/** ndm_sort_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sort_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                 bool descending);

/** The positions along `axis` that sort a as ndm_sort() does (numpy's
 *  argsort with kind="stable", torch.argsort(stable=True)): a new i64
 *  array of a's shape; ties keep their order. Integer output: no
 *  gradient. Errors as for ndm_sort(). */
#define ndm_argsort(a, axis, descending)                                        \
    ndm_argsort_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (descending))
/** ndm_argsort() with the result attached to m instead of by the output rule. */
#define ndm_argsort_to(m, a, axis, descending)                                  \
    ndm_argsort_to_at(NDM_HERE, (m), (a), (axis), (descending))
/** ndm_argsort_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_argsort_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                    bool descending);

/** torch.topk(a, k, axis, largest, sorted=True): the k largest entries of
 *  each line along `axis` (the k smallest when `largest` is false), in
 *  sorted order (largest first, or smallest first), into *values (a's
 *  dtype) and their positions along the axis into *indices (i64); the
 *  shape is a's with k along the axis. Either pointer may be NULL (that
 *  output is not made). Equal entries come in the order of their positions
 *  (PyTorch leaves it unspecified); NaN counts as the largest. The values'
 *  gradient (float `a`) goes back to their positions. Returns NDM_OK with
 *  fresh handles owned by the output rule's manager (a's), or m for the
 *  _to form; on failure both are null and nothing is allocated. Errors:
 *  NDM_E_INVALID when k < 0, k > the axis' size or both pointers are
 *  NULL, and those of ndm_sort(). */
#define ndm_topk(a, k, axis, largest, values, indices)                          \
    ndm_topk_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (k), (axis), (largest), (values), (indices))
/** ndm_topk() with the results attached to m instead of by the output rule. */
#define ndm_topk_to(m, a, k, axis, largest, values, indices)                    \
    ndm_topk_to_at(NDM_HERE, (m), (a), (k), (axis), (largest), (values), (indices))
/** ndm_topk_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_topk_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                                int64_t k, int axis, bool largest,
                                                ndm_array *values, ndm_array *indices);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
