/* Per-element index math written once for the CPU kernels (C) and the CUDA
 * kernels (nvcc, host and device code): where a padded coordinate reads,
 * the order of a sort, which entries a triangle keeps. */
#ifndef NDM_BACKENDS_INDEX_SCALAR_H
#define NDM_BACKENDS_INDEX_SCALAR_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../base/convert_scalar.h"
#include "ndm/index.h"

#ifdef __CUDACC__
#define NDM__SCALAR static __host__ __device__ __forceinline__
#else
#define NDM__SCALAR static inline
#endif

/* Source position of padded coordinate x on an axis of size n (n > 0 for
 * EDGE and REFLECT); -1 for the constant. */
NDM__SCALAR int64_t ndm__pad_source(int64_t x, int64_t n, ndm_pad_mode mode)
{
    if (x >= 0 && x < n)
        return x;
    if (mode == NDM_PAD_CONSTANT)
        return -1;
    if (mode == NDM_PAD_EDGE || n == 1)
        return x < 0 ? 0 : n - 1;
    int64_t p = 2 * (n - 1);
    int64_t m = x % p;
    if (m < 0)
        m += p;
    return m < n ? m : p - m;
}

/* ---- sort keys ------------------------------------------------------------
 * Every dtype's values map to unsigned 64-bit keys whose order is the
 * sort's: integers (exact, as int64) and floats (as double: exact for
 * every float dtype) by value, -0.0 equal to 0.0, every NaN above +inf.
 * A descending sort sorts the complemented keys. Ties are broken by the
 * position, so any correct sort of (key, position) pairs is stable. */
NDM__SCALAR uint64_t ndm__sort_key_i64(int64_t v)
{
    return (uint64_t)v ^ (UINT64_C(1) << 63);
}
NDM__SCALAR uint64_t ndm__sort_key_f64(double v)
{
    if (v != v)
        return ~UINT64_C(0);
    if (v == 0)
        v = 0.0;
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b >> 63 ? ~b : b | (UINT64_C(1) << 63);
}
/* The key of the element at p, of dtype t. */
NDM__SCALAR uint64_t ndm__sort_key(const void *p, ndm_dtype t)
{
    switch (t) {
    case NDM_BOOL:
    case NDM_U8: return ndm__sort_key_i64(*(const uint8_t *)p);
    case NDM_I32: return ndm__sort_key_i64(*(const int32_t *)p);
    case NDM_I64: return ndm__sort_key_i64(*(const int64_t *)p);
    case NDM_F16: return ndm__sort_key_f64((double)ndm__f16_to_f32(*(const uint16_t *)p));
    case NDM_BF16: return ndm__sort_key_f64((double)ndm__bf16_to_f32(*(const uint16_t *)p));
    case NDM_F32: return ndm__sort_key_f64((double)*(const float *)p);
    default: return ndm__sort_key_f64(*(const double *)p);
    }
}

/* A (key, position) pair of a sort; pairs order by key, then position. */
typedef struct ndm__sort_pair {
    uint64_t key;
    int64_t pos;
} ndm__sort_pair;
NDM__SCALAR bool ndm__sort_before(ndm__sort_pair a, ndm__sort_pair b)
{
    return a.key < b.key || (a.key == b.key && a.pos < b.pos);
}

/* Keep (row i, column j) in tril (upper false) or triu with offset k. */
NDM__SCALAR bool ndm__tri_keeps(int64_t i, int64_t j, int64_t k, bool upper)
{
    return upper ? j - i >= k : j - i <= k;
}

#undef NDM__SCALAR

#endif
