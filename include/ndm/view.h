/* ndm views: arrays that share storage with their input, and copies.
 *
 * Every function returns a fresh handle attached by the output rule (the
 * manager named by the `_to` variant of each macro, else the innermost scope of this thread, else the
 * manager of the input). A view never copies data; ndm_reshape copies only
 * when the input's strides cannot express the new shape, as numpy does.
 * ndm_alias returns a second handle on the same view: release one and the
 * other stays valid.
 *
 * Null input handles propagate: the result is the null handle and the first
 * error is kept.
 *
 * Thread rules: as for arrays.
 */
#ifndef NDM_VIEW_H
#define NDM_VIEW_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @name Views and copies
 *  Each returns a new handle attached by the output rule (the `_to` form: to
 *  m), which the caller releases or its manager's close does, or the null
 *  handle: NDM_E_NULL / NDM_E_CLOSED (a or m), NDM_E_AXIS (axis out of range
 *  or repeated), NDM_E_SHAPE (a shape that does not fit), NDM_E_OVERFLOW,
 *  NDM_E_CAPPED / NDM_E_QUOTA (the output manager), NDM_E_OOM (copies and
 *  handle records). A view keeps the storage alive after `a` is released. */
/** @{ */

/** A second handle on the same view of `a`. */
#define ndm_alias(a) ndm_alias_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_alias() with the result attached to m instead of by the output rule. */
#define ndm_alias_to(m, a) ndm_alias_to_at(NDM_HERE, (m), (a))
/** ndm_alias_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_alias_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);

/** New shape with the same number of elements; one entry may be -1
 *  (inferred). A view when the strides allow, else a C-ordered copy. */
#define ndm_reshape(a, ...) ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), __VA_ARGS__)
/** ndm_reshape() with the result attached to m instead of by the output rule. */
#define ndm_reshape_to(m, a, ...) ndm_reshape_to_at(NDM_HERE, (m), (a), __VA_ARGS__)
/** ndm_reshape_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_reshape_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ndim,
                                    const int64_t *shape);

/** Reverse the axes. */
#define ndm_transpose(a) ndm_permute_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), 0, NULL)
/** ndm_transpose() with the result attached to m instead of by the output rule. */
#define ndm_transpose_to(m, a) ndm_permute_to_at(NDM_HERE, (m), (a), 0, NULL)
/** Axes in the order `axes` (a permutation of 0..ndim-1, negatives allowed);
 *  n == 0 with axes NULL reverses them. */
#define ndm_permute(a, n, axes) ndm_permute_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (n), (axes))
/** ndm_permute() with the result attached to m instead of by the output rule. */
#define ndm_permute_to(m, a, n, axes) ndm_permute_to_at(NDM_HERE, (m), (a), (n), (axes))
/** ndm_permute_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_permute_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                    const int *axes);
/** Swap two axes. */
#define ndm_swapaxes(a, a1, a2) ndm_swapaxes_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (a1), (a2))
/** ndm_swapaxes() with the result attached to m instead of by the output rule. */
#define ndm_swapaxes_to(m, a, a1, a2) ndm_swapaxes_to_at(NDM_HERE, (m), (a), (a1), (a2))
/** ndm_swapaxes_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_swapaxes_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis1,
                                     int axis2);

/** Python slicing a[start:stop:step] along `axis`: negative indices count
 *  from the end, bounds clamp, step may be negative but not 0. Use
 *  NDM_END for an open bound. */
#define NDM_END INT64_MAX
/** a[start:stop:step] along `axis`, a view (see NDM_END). A step of 0 is
 *  NDM_E_INVALID. */
#define ndm_slice(a, axis, start, stop, step)                                   \
    ndm_slice_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (start), (stop), (step))
/** ndm_slice() with the result attached to m instead of by the output rule. */
#define ndm_slice_to(m, a, axis, start, stop, step)                             \
    ndm_slice_to_at(NDM_HERE, (m), (a), (axis), (start), (stop), (step))
/** ndm_slice_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_slice_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                  int64_t start, int64_t stop, int64_t step);
/** a[..., index, ...] along `axis`: the axis is removed (negative index
 *  counts from the end; out of range is NDM_E_INVALID). */
#define ndm_select(a, axis, index) ndm_select_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis), (index))
/** ndm_select() with the result attached to m instead of by the output rule. */
#define ndm_select_to(m, a, axis, index) ndm_select_to_at(NDM_HERE, (m), (a), (axis), (index))
/** ndm_select_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   int64_t index);

/** Remove size-1 axis `axis`, or every size-1 axis with NDM_ALL_AXES.
 *  Squeezing an axis whose size is not 1 is NDM_E_SHAPE. */
#define NDM_ALL_AXES INT32_MIN
/** Remove size-1 axis `axis` (NDM_ALL_AXES: every size-1 axis), a view;
 *  NDM_E_SHAPE when that axis's size is not 1. */
#define ndm_squeeze(a, axis) ndm_squeeze_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_squeeze() with the result attached to m instead of by the output rule. */
#define ndm_squeeze_to(m, a, axis) ndm_squeeze_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_squeeze_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_squeeze_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);
/** Insert a size-1 axis at position `axis` of the result (-1 = last). */
#define ndm_unsqueeze(a, axis) ndm_unsqueeze_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (axis))
/** ndm_unsqueeze() with the result attached to m instead of by the output rule. */
#define ndm_unsqueeze_to(m, a, axis) ndm_unsqueeze_to_at(NDM_HERE, (m), (a), (axis))
/** ndm_unsqueeze_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_unsqueeze_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis);

/** Broadcast to `shape` without copying (stride 0 on new or size-1 axes;
 *  -1 keeps a size). numpy's broadcast rules; NDM_E_SHAPE otherwise. */
#define ndm_expand(a, ...) ndm_expand_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), __VA_ARGS__)
/** ndm_expand() with the result attached to m instead of by the output rule. */
#define ndm_expand_to(m, a, ...) ndm_expand_to_at(NDM_HERE, (m), (a), __VA_ARGS__)
/** ndm_expand_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_expand_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ndim,
                                   const int64_t *shape);

/** A C-contiguous array with the contents of `a`: an alias of `a` when it
 *  already is contiguous, else a copy. */
#define ndm_contiguous(a) ndm_contiguous_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_contiguous() with the result attached to m instead of by the output rule. */
#define ndm_contiguous_to(m, a) ndm_contiguous_to_at(NDM_HERE, (m), (a))
/** ndm_contiguous_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_contiguous_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** Always a fresh C-contiguous copy. */
#define ndm_copy(a) ndm_copy_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_copy() with the result attached to m instead of by the output rule. */
#define ndm_copy_to(m, a) ndm_copy_to_at(NDM_HERE, (m), (a))
/** ndm_copy_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_copy_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
