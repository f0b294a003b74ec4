/* Numeric helpers for the reduce, linalg and conv suites: seeded random
 * values, arrays of any dtype made from and read back into doubles, and
 * comparisons against float64 references computed in the tests. */
#ifndef NDM_TEST_CHECK_NUMERIC_H
#define NDM_TEST_CHECK_NUMERIC_H

#include <math.h>
#include <stdlib.h>

#include "dtype_host.h"
#include "helpers.h"

/* xorshift64*: a fresh seeded stream per test. */
typedef struct rng {
    uint64_t s;
} rng;

static inline rng rng_new(uint64_t seed) { return (rng){seed * 0x9E3779B97F4A7C15ull + 1}; }

static inline uint64_t rng_next(rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [lo, hi). */
static inline double rng_uniform(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Values that every dtype holds: integers in a small range for integer
 * dtypes, 0/1 for bool, uniform floats otherwise. */
static inline void rng_fill(rng *r, ndm_dtype t, double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        switch (t) {
        case NDM_BOOL: v[i] = (double)(rng_next(r) % 2); break;
        case NDM_U8: v[i] = (double)(rng_next(r) % 7); break;
        case NDM_I32:
        case NDM_I64: v[i] = (double)((int64_t)(rng_next(r) % 11) - 5); break;
        default: v[i] = rng_uniform(r, -2.0, 2.0); break;
        }
    }
}

/* Write v[0..n) as dtype t into buf (what a cast would store). */
static inline void to_dtype(ndm_dtype t, const double *v, int64_t n, void *buf)
{
    for (int64_t i = 0; i < n; i++) {
        switch (t) {
        case NDM_BOOL: ((uint8_t *)buf)[i] = v[i] != 0; break;
        case NDM_U8: ((uint8_t *)buf)[i] = (uint8_t)v[i]; break;
        case NDM_I32: ((int32_t *)buf)[i] = (int32_t)v[i]; break;
        case NDM_I64: ((int64_t *)buf)[i] = (int64_t)v[i]; break;
        case NDM_F16: ((uint16_t *)buf)[i] = ndm_f32_to_f16((float)v[i]); break;
        case NDM_BF16: ((uint16_t *)buf)[i] = ndm_f32_to_bf16((float)v[i]); break;
        case NDM_F32: ((float *)buf)[i] = (float)v[i]; break;
        case NDM_F64: ((double *)buf)[i] = v[i]; break;
        }
    }
}

/* An array of dtype t in m holding v (rounded to t; v is updated to the
 * stored values, so references see exactly what the array holds). */
static inline ndm_array make_array(ndm_manager m, ndm_dtype t, double *v, int ndim,
                                   const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    void *buf = malloc((size_t)(n ? n : 1) * 8);
    assert_non_null(buf);
    to_dtype(t, v, n, buf);
    for (int64_t i = 0; i < n; i++)
        v[i] = host_get(buf, t, i);
    ndm_array a = ndm_from_buffer_at(__FILE__, __LINE__, __func__, m, t, buf, ndim, shape);
    free(buf);
    assert_live(a);
    return a;
}

/* The elements of a in C order, as doubles (caller frees). */
static inline double *read_array(ndm_array a)
{
    int64_t n = ndm_array_size(a);
    assert_true(n >= 0);
    ndm_dtype t = ndm_array_dtype(a);
    void *buf = malloc((size_t)(n ? n : 1) * 8);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(buf);
    assert_non_null(v);
    assert_ok(ndm_array_copy_out(a, buf, ndm_array_nbytes(a)));
    for (int64_t i = 0; i < n; i++)
        v[i] = host_get(buf, t, i);
    free(buf);
    return v;
}

/* Relative tolerance for results rounded once to dtype t. */
static inline double dtype_rtol(ndm_dtype t)
{
    switch (t) {
    case NDM_F16: return 2e-3;
    case NDM_BF16: return 1.6e-2;
    case NDM_F32: return 2e-6;
    case NDM_F64: return 1e-12;
    default: return 0;
    }
}

/* Compare n values, failing with the first mismatch and `what`. */
#define assert_close_all(got, want, n, rtol, atol, what)                        \
    do {                                                                        \
        for (int64_t i_ = 0; i_ < (int64_t)(n); i_++)                           \
            if (!close_to((got)[i_], (want)[i_], (rtol), (atol)))           \
                fail_msg("%s: element %lld is %.17g, expected %.17g", (what),   \
                         (long long)i_, (got)[i_], (want)[i_]);                 \
    } while (0)

/* The call must fail with `status` and a message containing `needle`. */
#define assert_fails(expr, status, needle)                                      \
    do {                                                                        \
        ndm_clear_error();                                                      \
        ndm_array r_ = (expr);                                                  \
        if (r_.id)                                                              \
            fail_msg("%s succeeded, expected %s", #expr, ndm_status_name(status)); \
        if (ndm_last_status() != (status))                                      \
            fail_msg("%s failed with %s, expected %s: %s", #expr,               \
                     ndm_status_name(ndm_last_status()), ndm_status_name(status), \
                     ndm_last_error());                                         \
        assert_error_has(needle);                                               \
    } while (0)

static inline int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* The shape of a as a freshly allocated array (caller frees). */
static inline int64_t *shape_of(ndm_array a, int *ndim)
{
    *ndim = ndm_array_ndim(a);
    int64_t *s = malloc(sizeof(int64_t) * (size_t)(*ndim > 0 ? *ndim : 1));
    assert_non_null(s);
    assert_int_equal(ndm_array_shape(a, s, *ndim), *ndim);
    return s;
}

#define assert_shape(a, ...)                                                    \
    do {                                                                        \
        const int64_t want_[] = {__VA_ARGS__};                                  \
        int nd_;                                                                \
        int64_t *s_ = shape_of((a), &nd_);                                      \
        assert_int_equal(nd_, (int)(sizeof want_ / sizeof want_[0]));           \
        for (int k_ = 0; k_ < nd_; k_++)                                        \
            assert_int_equal(s_[k_], want_[k_]);                                \
        free(s_);                                                               \
    } while (0)

#define assert_rank0(a) assert_int_equal(ndm_array_ndim(a), 0)

static inline void release(ndm_array a) { assert_ok(ndm_array_release(a)); }

#endif
