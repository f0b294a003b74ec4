/* Checks shared by the array, view, debug and status suites: element values
 * read back as doubles through decoders written here (not the library's),
 * expected casts, and text captured from FILE-writing functions. */
#ifndef NDM_TEST_ARRAY_CHECK_H
#define NDM_TEST_ARRAY_CHECK_H

#include <math.h>
#include <stdlib.h>

#include "helpers.h"

/* A status compared with the expected one; names both and the last error. */
#define assert_st(expr, want)                                                   \
    do {                                                                        \
        ndm_status got_ = (expr);                                               \
        ndm_status want_ = (want);                                              \
        if (got_ != want_)                                                      \
            fail_msg("%s returned %s, expected %s (last error: %s)", #expr,     \
                     ndm_status_name(got_), ndm_status_name(want_), ndm_last_error()); \
    } while (0)

/* A call that must fail: null handle back, the thread's status set. */
#define assert_fails(expr, want)                                                \
    do {                                                                        \
        ndm_clear_error();                                                      \
        ndm_array fa_ = (expr);                                                 \
        if (fa_.id)                                                             \
            fail_msg("%s succeeded; expected %s", #expr, ndm_status_name(want)); \
        if (ndm_last_status() != (want))                                        \
            fail_msg("%s failed with %s, expected %s (%s)", #expr,              \
                     ndm_status_name(ndm_last_status()), ndm_status_name(want),  \
                     ndm_last_error());                                          \
    } while (0)

static const ndm_dtype check_all_dtypes[NDM_DTYPE_COUNT] = {
    NDM_BOOL, NDM_U8, NDM_I32, NDM_I64, NDM_F16, NDM_BF16, NDM_F32, NDM_F64,
};

/* IEEE binary16 bits to a double, by the definition of the format. */
static inline double check_f16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

/* bfloat16 bits: the upper half of a binary32. */
static inline double check_bf16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
    double v;
    if (exp == 0xff)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -133);
    else
        v = ldexp(128 + man, exp - 134);
    return sign ? -v : v;
}

/* Round a double once to a binary format with `mant` fraction bits, minimum
 * normal exponent `emin` and largest finite value `max` (ties to even). */
static inline double check_round_to(double v, int mant, int emin, double max)
{
    if (!isfinite(v) || v == 0)
        return v;
    int e;
    frexp(fabs(v), &e);
    e -= 1; /* v = 1.x * 2^e */
    if (e < emin)
        e = emin;
    double q = ldexp(1.0, e - mant);
    double r = nearbyint(v / q) * q;
    /* Halfway above the largest finite value rounds to infinity. */
    double limit = max + ldexp(1.0, e - mant - 1);
    if (fabs(v) >= limit || fabs(r) > max)
        return copysign(INFINITY, v);
    return r;
}

/* The value an element of `dt` holds after storing `v` (ndm's cast rules:
 * float to integer saturates and truncates, NaN gives 0; bool is v != 0). */
static inline double check_cast(double v, ndm_dtype dt)
{
    switch (dt) {
    case NDM_BOOL:
        return v != 0;
    case NDM_U8:
        if (isnan(v) || v <= 0)
            return 0;
        return v >= 255 ? 255 : trunc(v);
    case NDM_I32:
        if (isnan(v))
            return 0;
        return v >= 2147483647.0   ? 2147483647.0
               : v <= -2147483648.0 ? -2147483648.0
                                    : trunc(v) + 0.0; /* no negative zero */
    case NDM_I64:
        if (isnan(v))
            return 0;
        return v >= 9223372036854775807.0 ? 9223372036854775807.0
               : v <= -9223372036854775808.0 ? -9223372036854775808.0
                                             : trunc(v) + 0.0;
    case NDM_F16:
        return check_round_to(v, 10, -14, 65504.0);
    case NDM_BF16:
        return check_round_to(v, 7, -126, ldexp(255.0, 120));
    case NDM_F32:
        return (float)v;
    default:
        return v;
    }
}

/* Element i of a C-ordered host buffer of dtype dt, as a double. */
static inline double check_elem(const void *buf, ndm_dtype dt, size_t i)
{
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8:
        return ((const uint8_t *)buf)[i];
    case NDM_I32:
        return ((const int32_t *)buf)[i];
    case NDM_I64:
        return (double)((const int64_t *)buf)[i];
    case NDM_F16:
        return check_f16_value(((const uint16_t *)buf)[i]);
    case NDM_BF16:
        return check_bf16_value(((const uint16_t *)buf)[i]);
    case NDM_F32:
        return ((const float *)buf)[i];
    default:
        return ((const double *)buf)[i];
    }
}

/* Copy the elements of `a` out (C order) and convert them to doubles; the
 * caller frees the result. Fails the test when the copy fails. */
static inline double *check_read(ndm_array a, int64_t *count)
{
    int64_t n = ndm_array_size(a);
    if (n < 0)
        fail_msg("size of the array: %s", ndm_last_error());
    ndm_dtype dt = ndm_array_dtype(a);
    size_t nbytes = ndm_array_nbytes(a);
    void *raw = malloc(nbytes ? nbytes : 1);
    double *vals = malloc(n ? (size_t)n * sizeof *vals : 1);
    assert_non_null(raw);
    assert_non_null(vals);
    ndm_status st = ndm_array_copy_out(a, raw, nbytes);
    if (st != NDM_OK) {
        free(raw);
        free(vals);
        fail_msg("copy_out failed: %s", ndm_last_error());
    }
    for (int64_t i = 0; i < n; i++)
        vals[i] = check_elem(raw, dt, (size_t)i);
    free(raw);
    if (count)
        *count = n;
    return vals;
}

static inline bool check_same(double a, double b)
{
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b)) || (a == b && a != 0);
}

/* The elements of `a` in C order must equal want[0..n) exactly (NaN equals
 * NaN). */
#define assert_values(a, want, n) check_values_at((a), (want), (n), __FILE__, __LINE__)
static inline void check_values_at(ndm_array a, const double *want, int64_t n, const char *file,
                                   int line)
{
    int64_t got_n;
    double *got = check_read(a, &got_n);
    if (got_n != n) {
        free(got);
        print_error("%lld elements, expected %lld\n", (long long)got_n, (long long)n);
        _fail(file, line);
    }
    for (int64_t i = 0; i < n; i++) {
        if (!check_same(got[i], want[i])) {
            double g = got[i];
            free(got);
            print_error("element %lld is %.17g, expected %.17g\n", (long long)i, g, want[i]);
            _fail(file, line);
        }
    }
    free(got);
}

/* The shape of `a` must be want[0..ndim). */
#define assert_shape(a, ...) check_shape_at((a), NDM_SHAPE(__VA_ARGS__), __FILE__, __LINE__)
#define assert_shape0(a) check_shape_at((a), 0, NULL, __FILE__, __LINE__)
static inline void check_shape_at(ndm_array a, int ndim, const int64_t *want, const char *file,
                                  int line)
{
    int64_t got[32];
    int nd = ndm_array_shape(a, got, 32);
    if (nd != ndim) {
        print_error("rank %d, expected %d (%s)\n", nd, ndim, ndm_last_error());
        _fail(file, line);
    }
    for (int i = 0; i < ndim; i++) {
        if (got[i] != want[i]) {
            print_error("axis %d has size %lld, expected %lld\n", i, (long long)got[i],
                        (long long)want[i]);
            _fail(file, line);
        }
    }
}

/* The strides of `a` must be want[0..ndim). */
#define assert_strides(a, ...) check_strides_at((a), NDM_SHAPE(__VA_ARGS__), __FILE__, __LINE__)
static inline void check_strides_at(ndm_array a, int ndim, const int64_t *want, const char *file,
                                    int line)
{
    int64_t got[32];
    int nd = ndm_array_strides(a, got, 32);
    if (nd != ndim) {
        print_error("rank %d, expected %d (%s)\n", nd, ndim, ndm_last_error());
        _fail(file, line);
    }
    for (int i = 0; i < ndim; i++) {
        if (got[i] != want[i]) {
            print_error("axis %d has stride %lld, expected %lld\n", i, (long long)got[i],
                        (long long)want[i]);
            _fail(file, line);
        }
    }
}

/* Text written to a FILE by a function under test. */
typedef struct check_capture {
    FILE *f;
    char *text;
    size_t len;
} check_capture;

static inline FILE *check_capture_open(check_capture *c)
{
    c->text = NULL;
    c->len = 0;
    c->f = open_memstream(&c->text, &c->len);
    assert_non_null(c->f);
    return c->f;
}

/* Closes the stream; the caller frees c->text. */
static inline const char *check_capture_close(check_capture *c)
{
    fclose(c->f);
    c->f = NULL;
    return c->text;
}

/* Bytes that the subtree of m holds now on the CPU. */
static inline uint64_t check_live_bytes(ndm_manager m, unsigned flags)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, flags, &st) != NDM_OK)
        fail_msg("stats: %s", ndm_last_error());
    return st.live_bytes;
}

/* Release an array that the test owns and must still be live. */
#define release_ok(a) assert_ok(ndm_array_release(a))
#define close_ok(m) assert_ok(ndm_manager_close(m))

#endif
