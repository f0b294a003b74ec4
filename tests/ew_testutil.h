/* Helpers shared by the elementwise and cast suites: a seeded generator,
 * host buffers of any dtype, random arrays, and the conversion oracle,
 * written here independently of the library's kernels. */
#ifndef NDM_TEST_EW_UTIL_H
#define NDM_TEST_EW_UTIL_H

#include <math.h>
#include <stdlib.h>

#include "dtype_host.h"
#include "helpers.h"

/* splitmix64: small, seedable, good enough for test data. */
typedef struct rng {
    uint64_t s;
} rng;
static inline uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double rng_unif(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(rng_next(r) >> 11) * 0x1p-53);
}

static inline bool is_float_dt(ndm_dtype t)
{
    return t == NDM_F16 || t == NDM_BF16 || t == NDM_F32 || t == NDM_F64;
}

/* The value of element i of a host buffer as int64 (floats truncated, for
 * integer dtypes exact); host_get (dtype_host.h) gives it as a double. */
static inline int64_t host_geti(const void *buf, ndm_dtype t, int64_t i)
{
    switch (t) {
    case NDM_BOOL:
    case NDM_U8: return ((const uint8_t *)buf)[i];
    case NDM_I32: return ((const int32_t *)buf)[i];
    case NDM_I64: return ((const int64_t *)buf)[i];
    default: return (int64_t)host_get(buf, t, i);
    }
}

/* The test's own conversion of a double to dtype t, following the rules the
 * header documents: floats round to nearest even (through f32 for f16 and
 * bf16), float to integer truncates and saturates with NaN giving 0,
 * anything to bool is != 0. */
static inline int64_t sat_int(double v, double lo, double hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)
        return hi >= 9.2e18 ? INT64_MAX : (int64_t)hi;
    return (int64_t)v;
}
static inline void host_set(void *buf, ndm_dtype t, int64_t i, double v)
{
    switch (t) {
    case NDM_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    case NDM_U8: ((uint8_t *)buf)[i] = (uint8_t)sat_int(v, 0, 255); break;
    case NDM_I32: ((int32_t *)buf)[i] = (int32_t)sat_int(v, -2147483648.0, 2147483647.0); break;
    case NDM_I64:
        ((int64_t *)buf)[i] = sat_int(v, -9223372036854775808.0, 9223372036854775808.0);
        break;
    case NDM_F16: ((uint16_t *)buf)[i] = ndm_f32_to_f16((float)v); break;
    case NDM_BF16: ((uint16_t *)buf)[i] = ndm_f32_to_bf16((float)v); break;
    case NDM_F32: ((float *)buf)[i] = (float)v; break;
    case NDM_F64: ((double *)buf)[i] = v; break;
    }
}
/* v rounded to dtype t and read back (float dtypes only). */
static inline double round_to(ndm_dtype t, double v)
{
    unsigned char tmp[8];
    host_set(tmp, t, 0, v);
    return host_get(tmp, t, 0);
}

/* A random value suited to dtype t: small integers, or floats in [-8, 8],
 * with NaN, infinities and signed zeros sprinkled in when `specials`. */
static inline double rand_value(rng *r, ndm_dtype t, bool specials)
{
    if (specials && is_float_dt(t)) {
        uint64_t k = rng_next(r) % 40;
        if (k == 0)
            return NAN;
        if (k == 1)
            return INFINITY;
        if (k == 2)
            return -INFINITY;
        if (k == 3)
            return -0.0;
        if (k == 4)
            return 0.0;
    }
    switch (t) {
    case NDM_BOOL: return (double)(rng_next(r) & 1);
    case NDM_U8: return (double)(rng_next(r) % 256);
    case NDM_I32: return (double)((int64_t)(rng_next(r) % 2001) - 1000);
    case NDM_I64: return (double)((int64_t)(rng_next(r) % 200001) - 100000);
    default: return round_to(t, rng_unif(r, -8, 8));
    }
}

/* An array of random values in C order. */
static inline ndm_array rand_array(ndm_manager m, ndm_dtype t, int nd, const int64_t *shape,
                                   rng *r, bool specials)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    void *buf = malloc((size_t)(n ? n : 1) * ndm_dtype_size(t));
    for (int64_t i = 0; i < n; i++)
        host_set(buf, t, i, rand_value(r, t, specials));
    ndm_array a = ndm_from_buffer_at(__FILE__, __LINE__, __func__, m, t, buf, nd, shape);
    free(buf);
    return a;
}

/* Every element of a in C order into a new host buffer of its dtype. */
static inline void *read_all(ndm_array a, int64_t *n)
{
    *n = ndm_array_size(a);
    size_t bytes = ndm_array_nbytes(a);
    void *buf = malloc(bytes ? bytes : 1);
    if (ndm_array_copy_out(a, buf, bytes) != NDM_OK)
        fail_msg("copy_out failed: %s", ndm_last_error());
    return buf;
}

/* Flat index into an input of shape (k, ishape) for flat index i of the
 * broadcast shape (nd, oshape). */
static inline int64_t bcast_index(int64_t i, int nd, const int64_t *oshape, int k,
                                  const int64_t *ishape)
{
    int64_t idx = 0, stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t c = i % oshape[d];
        i /= oshape[d];
        int j = d - (nd - k);
        if (j >= 0) {
            if (ishape[j] != 1)
                idx += c * stride;
            stride *= ishape[j];
        }
    }
    return idx;
}

/* Promotion, written out by hand (dtype.h's rules): rows and columns in
 * enum order bool, u8, i32, i64, f16, bf16, f32, f64. */
static const ndm_dtype promo[8][8] = {
    {NDM_BOOL, NDM_U8, NDM_I32, NDM_I64, NDM_F16, NDM_BF16, NDM_F32, NDM_F64},
    {NDM_U8, NDM_U8, NDM_I32, NDM_I64, NDM_F16, NDM_BF16, NDM_F32, NDM_F64},
    {NDM_I32, NDM_I32, NDM_I32, NDM_I64, NDM_F16, NDM_BF16, NDM_F32, NDM_F64},
    {NDM_I64, NDM_I64, NDM_I64, NDM_I64, NDM_F16, NDM_BF16, NDM_F32, NDM_F64},
    {NDM_F16, NDM_F16, NDM_F16, NDM_F16, NDM_F16, NDM_F32, NDM_F32, NDM_F64},
    {NDM_BF16, NDM_BF16, NDM_BF16, NDM_BF16, NDM_F32, NDM_BF16, NDM_F32, NDM_F64},
    {NDM_F32, NDM_F32, NDM_F32, NDM_F32, NDM_F32, NDM_F32, NDM_F32, NDM_F64},
    {NDM_F64, NDM_F64, NDM_F64, NDM_F64, NDM_F64, NDM_F64, NDM_F64, NDM_F64},
};

/* Release a handle the test made (failing the test if that fails). */
#define REL(a) assert_ok(ndm_array_release(a))

#endif
