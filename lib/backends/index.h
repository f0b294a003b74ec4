/* The index family of the backend table: copies that move data for concat,
 * stack and tile, index checks, take, gather, scatter_add, one_hot, pad,
 * cumsum, cumprod, the positions of nonzero entries, the triangles of
 * matrices (tril, triu) and a stable sort along an axis (sort, topk). */
#ifndef NDM_BACKEND_INDEX_H
#define NDM_BACKEND_INDEX_H

#include "backend.h"
#include "ndm/index.h"

/* Dispatchers check shapes, dtypes and index ranges before calling; kernels
 * trust them. Index tensors are u8, i32 or i64. Strides may be negative or
 * 0 on inputs; a destination's elements never overlap each other or an
 * input's. Every member is required. */
struct ndm__backend_index {
    /* dst = src converted to dst's dtype over dst's shape, like the core copy;
     * meant for large operands (the CPU's fast table runs it in parallel). */
    ndm_status (*copy)(int device, const ndm__tensor *dst, const ndm__tensor *src);
    /* *pos = flat C-order position of the first element of idx outside
     * [lo, hi) and *value its value, or *pos = -1 when there is none. */
    ndm_status (*find_outside)(int device, const ndm__tensor *idx, int64_t lo, int64_t hi,
                               int64_t *pos, int64_t *value);
    /* numpy take: dst has shape src[:axis] + idx.shape + src[axis+1:];
     * indices lie in [-n, n) for n = src.shape[axis]. */
    ndm_status (*take)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                       const ndm__tensor *idx);
    /* dst[c] = src[c with c[axis] = idx[c]]: idx has dst's shape, src too
     * except along axis; both may carry 0 strides (broadcast). Indices lie in
     * [-n, n) for n = src.shape[axis]. */
    ndm_status (*gather)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                         const ndm__tensor *idx);
    /* dst[c with c[axis] = idx[c]] += src[c] for every c of idx's shape, in
     * C order for repeated targets. src has idx's shape and dst's dtype; idx
     * has dst's shape except along axis; idx and src may carry 0 strides. */
    ndm_status (*scatter_add)(int device, const ndm__tensor *dst, int axis, const ndm__tensor *idx,
                              const ndm__tensor *src);
    /* dst has shape idx.shape + [classes]: 1 where the last coordinate equals
     * the index (in [0, classes)), 0 elsewhere. */
    ndm_status (*one_hot)(int device, const ndm__tensor *dst, const ndm__tensor *idx);
    /* dst = src with before[d] leading entries on axis d (and the rest of
     * dst's size after it) made by `mode`; `value` is the constant. Axes
     * that EDGE or REFLECT pad are not empty. */
    ndm_status (*pad)(int device, const ndm__tensor *dst, const ndm__tensor *src,
                      const int64_t *before, ndm_pad_mode mode, double value);
    /* Running sums along axis. dst is i64 for bool and integer sources and
     * src's dtype for floats; floats accumulate in their dtype, f16 and bf16
     * in f32. */
    ndm_status (*cumsum)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis);
    /* Running products along axis, with cumsum's dtypes: integers multiply
     * in int64 (wrapping), floats in their dtype, f16 and bf16 in f32. */
    ndm_status (*cumprod)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis);
    /* The C-order positions of src's nonzero entries (NaN counts, -0.0 does
     * not). dst NULL: *count = how many there are. Otherwise dst is a
     * contiguous 1-d i64 tensor of exactly that many entries, which get the
     * positions in increasing order; *count is not written. src may carry
     * 0 strides (a broadcast mask). */
    ndm_status (*nonzero)(int device, const ndm__tensor *dst, const ndm__tensor *src,
                          int64_t *count);
    /* dst = src over the last two axes (rows i, columns j) where j - i <= k
     * (upper false: tril) or j - i >= k (upper true: triu), zero (all bits
     * clear) elsewhere. dst and src have one shape and one dtype, rank >= 2;
     * src may carry 0 strides (a broadcast one). */
    ndm_status (*tri)(int device, const ndm__tensor *dst, const ndm__tensor *src, int64_t k,
                      bool upper);
    /* A stable sort of each line of src along axis: the first m entries of
     * the sorted line (m = the axis' extent in values or indices, at most
     * src's) go to values (src's dtype) and indices (i64, positions along
     * the axis), either of which may be NULL. The order is that of
     * ndm__sort_key (index_scalar.h): NaN above every number, -0.0 equal to
     * 0.0; descending reverses the keys, and equal keys keep their order
     * in both directions. The outputs have src's shape but along axis. */
    ndm_status (*sort)(int device, const ndm__tensor *values, const ndm__tensor *indices,
                       const ndm__tensor *src, int axis, bool descending);
};

extern const struct ndm__backend_index ndm__cpu_index;
extern const struct ndm__backend_index ndm__cpu_ref_index;

#endif
