/* Checked arithmetic on element counts, strides, offsets and byte sizes: the
 * one place size products are formed. Self-contained (no ndm type), a leaf. */
#ifndef NDM_CHECKED_H
#define NDM_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Each helper stores the result in *r and returns true when it overflowed
 * (C23's ckd_add / ckd_mul convention); on overflow *r is unspecified. */

#if defined(__GNUC__)
static inline bool ndm__ckd_add_i64(int64_t *r, int64_t a, int64_t b)
{
    return __builtin_add_overflow(a, b, r);
}
static inline bool ndm__ckd_mul_i64(int64_t *r, int64_t a, int64_t b)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline bool ndm__ckd_mul_u64(uint64_t *r, uint64_t a, uint64_t b)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline bool ndm__ckd_add_size(size_t *r, size_t a, size_t b)
{
    return __builtin_add_overflow(a, b, r);
}
static inline bool ndm__ckd_mul_size(size_t *r, size_t a, size_t b)
{
    return __builtin_mul_overflow(a, b, r);
}
#else
static inline bool ndm__ckd_add_i64(int64_t *r, int64_t a, int64_t b)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b))
        return true;
    *r = a + b;
    return false;
}
static inline bool ndm__ckd_mul_i64(int64_t *r, int64_t a, int64_t b)
{
    if (a == 0 || b == 0) {
        *r = 0;
        return false;
    }
    if ((a == -1 && b == INT64_MIN) || (b == -1 && a == INT64_MIN))
        return true;
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : b < INT64_MAX / a))
        return true;
    *r = a * b;
    return false;
}
static inline bool ndm__ckd_mul_u64(uint64_t *r, uint64_t a, uint64_t b)
{
    *r = a * b;
    return a && *r / a != b;
}
static inline bool ndm__ckd_add_size(size_t *r, size_t a, size_t b)
{
    *r = a + b;
    return *r < a;
}
static inline bool ndm__ckd_mul_size(size_t *r, size_t a, size_t b)
{
    *r = a * b;
    return a && *r / a != b;
}
#endif

/* The extent of a shape: the product of its non-zero sizes. C-contiguous
 * strides are partial products of it, so an array's strides fit exactly
 * when its extent does, empty or not. True when a size is negative or the
 * extent times elem_bytes (>= 1) passes INT64_MAX; else *extent and *numel
 * (0 when a size is 0, else the extent) are set. */
static inline bool ndm__ckd_extent(int ndim, const int64_t *shape, int64_t elem_bytes,
                                   int64_t *extent, int64_t *numel)
{
    int64_t n = 1, bytes;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        int64_t e = shape[i];
        if (e < 0)
            return true;
        empty |= e == 0;
        if (ndm__ckd_mul_i64(&n, n, e ? e : 1))
            return true;
    }
    if (ndm__ckd_mul_i64(&bytes, n, elem_bytes))
        return true;
    *extent = n;
    *numel = empty ? 0 : n;
    return false;
}

/* base + idx * stride, as an element offset moves along an axis; true when
 * it overflows. */
static inline bool ndm__ckd_offset(int64_t *r, int64_t base, int64_t idx, int64_t stride)
{
    int64_t t;
    return ndm__ckd_mul_i64(&t, idx, stride) || ndm__ckd_add_i64(r, base, t);
}

#endif
