/* Helpers shared by the CPU index kernels: coordinate scratch, an odometer,
 * index loads, and the reference kernels the fast ones fall back to. */
#ifndef NDM_CPU_INDEX_H
#define NDM_CPU_INDEX_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../index.h"
#include "../index_scalar.h"

/* Coordinates for any rank: on the stack up to 32 axes. */
typedef struct ndm__coords {
    int64_t small[32];
    int64_t *c;
} ndm__coords;

/* n zeroed entries, or NULL when memory is short. */
static inline int64_t *ndm__coords_get(ndm__coords *s, size_t n)
{
    if (n <= 32) {
        s->c = s->small;
        for (size_t i = 0; i < n; i++)
            s->c[i] = 0;
    } else {
        s->c = calloc(n, sizeof(int64_t));
    }
    return s->c;
}
static inline void ndm__coords_put(ndm__coords *s)
{
    if (s->c != s->small)
        free(s->c);
}

/* Advance C-order coordinates c over shape; false after the last one. */
static inline bool ndm__odo_next(int nd, const int64_t *shape, int64_t *c)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++c[d] < shape[d])
            return true;
        c[d] = 0;
    }
    return false;
}

static inline int64_t ndm__numel_t(const ndm__tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static inline bool ndm__contig_t(const ndm__tensor *t)
{
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0)
            return true;
        if (t->shape[d] != 1 && t->strides[d] != expect)
            return false;
        expect *= t->shape[d];
    }
    return true;
}

/* The index at element offset `off` of an index tensor (u8, i32 or i64). */
static inline int64_t ndm__idx_at(const ndm__tensor *t, int64_t off)
{
    switch (t->dtype) {
    case NDM_U8:
        return ((const uint8_t *)t->data)[off];
    case NDM_I32:
        return ((const int32_t *)t->data)[off];
    default:
        return ((const int64_t *)t->data)[off];
    }
}

/* Merge axes [from, to) of a tensor into one of size *n and stride *s when
 * its strides allow (size-1 axes are ignored); false otherwise. */
static inline bool ndm__merge_axes(const ndm__tensor *t, int from, int to, int64_t *n,
                                   int64_t *s)
{
    int64_t size = 1, stride = 0;
    bool any = false;
    for (int d = to - 1; d >= from; d--) {
        if (t->shape[d] == 1)
            continue;
        if (!any) {
            stride = t->strides[d];
            any = true;
        } else if (t->strides[d] != stride * size) {
            return false;
        }
        size *= t->shape[d];
    }
    *n = size;
    *s = stride;
    return true;
}

/* Is the element at p (of dtype t, es bytes) zero? A float's sign bit
 * alone is zero (-0.0); NaN is not. */
static inline bool ndm__cpu_is_zero(ndm_dtype t, const void *p, size_t es)
{
    switch (t) {
    case NDM_F16:
    case NDM_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (v & 0x7fffu) == 0;
    }
    case NDM_F32: {
        float v;
        memcpy(&v, p, 4);
        return v == 0;
    }
    case NDM_F64: {
        double v;
        memcpy(&v, p, 8);
        return v == 0;
    }
    default: {
        const unsigned char *b = (const unsigned char *)p;
        for (size_t i = 0; i < es; i++)
            if (b[i])
                return false;
        return true;
    }
    }
}

/* The core's converting copy (core.c). */
ndm_status ndm__cpu_copy(int device, const ndm__tensor *dst, const ndm__tensor *src);

/* Reference kernels (index_ref.c), also the fast table's general case. */
ndm_status ndm__ref_find_outside(int device, const ndm__tensor *idx, int64_t lo, int64_t hi,
                                 int64_t *pos, int64_t *value);
ndm_status ndm__ref_take(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                         const ndm__tensor *idx);
ndm_status ndm__ref_gather(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                           const ndm__tensor *idx);
ndm_status ndm__ref_scatter_add(int device, const ndm__tensor *dst, int axis,
                                const ndm__tensor *idx, const ndm__tensor *src);
ndm_status ndm__ref_one_hot(int device, const ndm__tensor *dst, const ndm__tensor *idx);
ndm_status ndm__ref_pad(int device, const ndm__tensor *dst, const ndm__tensor *src,
                        const int64_t *before, ndm_pad_mode mode, double value);
ndm_status ndm__ref_cumsum(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis);
ndm_status ndm__ref_cumprod(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis);
ndm_status ndm__ref_nonzero(int device, const ndm__tensor *dst, const ndm__tensor *src,
                            int64_t *count);
/* Triangles and the stable sort (sort.c), in both tables. */
ndm_status ndm__cpu_tri(int device, const ndm__tensor *dst, const ndm__tensor *src, int64_t k,
                        bool upper);
ndm_status ndm__cpu_sort(int device, const ndm__tensor *values, const ndm__tensor *indices,
                         const ndm__tensor *src, int axis, bool descending);

#endif
