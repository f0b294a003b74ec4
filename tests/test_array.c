/* Arrays: every factory for every dtype, f16/bf16 and float-to-int casts,
 * shapes and their limits, accessors, release and stale handles, host
 * transfers, item, and numpy-exact printing. */
#include <float.h>
#include <limits.h>
#include <stdlib.h>

#include "array_check.h"

#define SHAPE23 NDM_SHAPE(2, 3)

/* ---- factories -------------------------------------------------------------- */

static void test_empty_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_empty(m, dt, SHAPE23);
        assert_live(a);
        assert_int_equal(ndm_array_dtype(a), dt);
        assert_int_equal(ndm_array_ndim(a), 2);
        assert_shape(a, 2, 3);
        assert_strides(a, 3, 1);
        assert_int_equal(ndm_array_size(a), 6);
        assert_int_equal(ndm_array_nbytes(a), 6 * ndm_dtype_size(dt));
        assert_int_equal(ndm_array_offset(a), 0);
        assert_true(ndm_array_is_contiguous(a));
        assert_int_equal(ndm_array_manager(a).id, m.id);
        assert_true(ndm_device_eq(ndm_array_device(a), NDM_CPU));
        /* Its memory is usable: what goes in comes back. */
        unsigned char in[48], out[48];
        for (size_t i = 0; i < sizeof in; i++)
            in[i] = dt == NDM_BOOL ? (unsigned char)(i & 1) : (unsigned char)(i * 37 + 11);
        size_t nb = ndm_array_nbytes(a);
        assert_ok(ndm_array_copy_in(a, in, nb));
        assert_ok(ndm_array_copy_out(a, out, nb));
        assert_memory_equal(in, out, nb);
        release_ok(a);
    }
}

static void check_filled(ndm_manager m, ndm_dtype dt, ndm_array a, double value)
{
    (void)m;
    assert_live(a);
    assert_int_equal(ndm_array_dtype(a), dt);
    assert_shape(a, 2, 3);
    double want[6];
    for (int i = 0; i < 6; i++)
        want[i] = check_cast(value, dt);
    assert_values(a, want, 6);
}

static void test_zeros_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_zeros(m, dt, SHAPE23);
        check_filled(m, dt, a, 0.0);
        /* Every byte is zero, not only every value. */
        unsigned char raw[48];
        assert_ok(ndm_array_copy_out(a, raw, ndm_array_nbytes(a)));
        for (size_t i = 0; i < ndm_array_nbytes(a); i++)
            assert_int_equal(raw[i], 0);
        release_ok(a);
    }
}

static void test_ones_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_ones(m, dt, SHAPE23);
        check_filled(m, dt, a, 1.0);
        release_ok(a);
    }
}

static void test_full_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    const double values[] = {2.5, -7.9, 300.7, 0.1, 65504.0, 1e15 + 0.5, -0.0};
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            ndm_array a = ndm_full(m, dt, values[v], SHAPE23);
            check_filled(m, dt, a, values[v]);
            release_ok(a);
        }
    }
}

static void test_full_f16_bf16_bits(void **state)
{
    ndm_manager m = ROOT(state);
    uint16_t raw[6];
    ndm_array h = ndm_full(m, NDM_F16, 0.1, SHAPE23);
    ndm_array b = ndm_full(m, NDM_BF16, 0.1, SHAPE23);
    assert_ok(ndm_array_copy_out(h, raw, sizeof raw));
    for (int i = 0; i < 6; i++)
        assert_int_equal(raw[i], 0x2e66);
    assert_ok(ndm_array_copy_out(b, raw, sizeof raw));
    for (int i = 0; i < 6; i++)
        assert_int_equal(raw[i], 0x3dcd);
    release_ok(h);
    release_ok(b);
}

static void test_scalar_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_scalar(m, dt, 3.75);
        assert_live(a);
        assert_int_equal(ndm_array_ndim(a), 0);
        assert_shape0(a);
        assert_int_equal(ndm_array_size(a), 1);
        assert_int_equal(ndm_array_nbytes(a), ndm_dtype_size(dt));
        double want = check_cast(3.75, dt);
        assert_values(a, &want, 1);
        double got;
        assert_ok(ndm_item(a, &got));
        assert_true(got == want);
        release_ok(a);
    }
}

static void test_arange_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_arange(m, dt, -2, 3, 1);
        assert_live(a);
        assert_int_equal(ndm_array_dtype(a), dt);
        assert_shape(a, 5);
        double want[5];
        for (int i = 0; i < 5; i++)
            want[i] = check_cast(-2 + i, dt);
        assert_values(a, want, 5);
        release_ok(a);
    }
}

/* numpy's length is ceil((stop - start) / step) computed in double. */
static void test_arange_numpy_length(void **state)
{
    ndm_manager m = ROOT(state);
    const struct {
        double start, stop, step;
        int64_t len;
    } cases[] = {
        {0, 10, 3, 4},     {0, 1, 0.1, 10}, {1, 2, 0.3, 4},   {1, 1.3, 0.1, 4},
        {0, 5.5, 1, 6},    {-3, 3, 1.5, 4}, {0.5, 0.5, 1, 0}, {3, 1, 1, 0},
        {1, 3, -1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ndm_array a = ndm_arange(m, NDM_F64, cases[c].start, cases[c].stop, cases[c].step);
        assert_live(a);
        assert_int_equal(ndm_array_ndim(a), 1);
        assert_int_equal(ndm_array_size(a), cases[c].len);
        double want[16];
        for (int64_t i = 0; i < cases[c].len; i++)
            want[i] = cases[c].start + (double)i * cases[c].step;
        assert_values(a, want, cases[c].len);
        release_ok(a);
    }
}

static void test_arange_negative_step(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_arange(m, NDM_I32, 10, 0, -3);
    assert_values(a, ((double[]){10, 7, 4, 1}), 4);
    ndm_array b = ndm_arange(m, NDM_F64, -1, -10, -2.5);
    assert_values(b, ((double[]){-1, -3.5, -6, -8.5}), 4);
    ndm_array c = ndm_arange(m, NDM_F32, 1, 0, -0.25);
    assert_values(c, ((double[]){1, 0.75, 0.5, 0.25}), 4);
    release_ok(a);
    release_ok(b);
    release_ok(c);
}

static void test_arange_invalid_arguments(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_arange(m, NDM_F32, 0, 10, 0), NDM_E_INVALID);
    assert_error_has("ndm_arange: ");
    assert_fails(ndm_arange(m, NDM_F32, NAN, 10, 1), NDM_E_INVALID);
    assert_fails(ndm_arange(m, NDM_F32, 0, INFINITY, 1), NDM_E_INVALID);
    assert_fails(ndm_arange(m, NDM_F32, 0, 10, NAN), NDM_E_INVALID);
    assert_fails(ndm_arange(m, NDM_F32, 0, 1e300, 1e-300), NDM_E_OVERFLOW);
    assert_int_equal(test_live_arrays(m), 0);
}

static void test_linspace_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_linspace(m, dt, -2, 2, 9);
        assert_live(a);
        assert_int_equal(ndm_array_dtype(a), dt);
        assert_shape(a, 9);
        double want[9];
        for (int i = 0; i < 9; i++)
            want[i] = check_cast(-2 + 0.5 * i, dt);
        assert_values(a, want, 9);
        release_ok(a);
    }
}

static void test_linspace_num_zero_and_one(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array z = ndm_linspace(m, NDM_F64, 2, 5, 0);
    assert_live(z);
    assert_shape(z, 0);
    ndm_array one = ndm_linspace(m, NDM_F64, 2, 5, 1);
    assert_shape(one, 1);
    assert_values(one, ((double[]){2}), 1);
    ndm_array two = ndm_linspace(m, NDM_F64, 2, 5, 2);
    assert_values(two, ((double[]){2, 5}), 2);
    release_ok(z);
    release_ok(one);
    release_ok(two);
}

/* numpy computes start + i*step and then sets the last element to stop. */
static void test_linspace_exact_endpoint(void **state)
{
    ndm_manager m = ROOT(state);
    const double start = -1.3, stop = 7.9;
    const int n = 11;
    double step = (stop - start) / (n - 1);
    /* The case is chosen so that the arithmetic misses the endpoint. */
    assert_true(start + (n - 1) * step != stop);
    double want[11];
    for (int i = 0; i < n; i++) {
        double offset = i * step; /* apart: clang contracts a*b+c within one expression */
        want[i] = start + offset;
    }
    want[n - 1] = stop;
    ndm_array a = ndm_linspace(m, NDM_F64, start, stop, n);
    assert_values(a, want, n);
    ndm_array d = ndm_linspace(m, NDM_F64, 1, 0, 5);
    assert_values(d, ((double[]){1, 0.75, 0.5, 0.25, 0}), 5);
    ndm_array i = ndm_linspace(m, NDM_I32, 0, 10, 4);
    assert_values(i, ((double[]){0, 3, 6, 10}), 4);
    release_ok(a);
    release_ok(d);
    release_ok(i);
}

static void test_linspace_invalid_arguments(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_linspace(m, NDM_F32, 0, 1, -1), NDM_E_INVALID);
    assert_fails(ndm_linspace(m, NDM_F32, NAN, 1, 3), NDM_E_INVALID);
    assert_fails(ndm_linspace(m, NDM_F32, 0, -INFINITY, 3), NDM_E_INVALID);
    assert_int_equal(test_live_arrays(m), 0);
}

static void test_from_buffer_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        unsigned char src[48], out[48];
        size_t nb = 6 * ndm_dtype_size(dt);
        for (size_t i = 0; i < nb; i++)
            src[i] = dt == NDM_BOOL ? (unsigned char)(i % 3 == 0) : (unsigned char)(i * 29 + 5);
        ndm_array a = ndm_from_buffer(m, dt, src, SHAPE23);
        assert_live(a);
        assert_int_equal(ndm_array_dtype(a), dt);
        assert_shape(a, 2, 3);
        /* A copy: later changes to the source do not reach the array. */
        unsigned char keep[48];
        memcpy(keep, src, nb);
        memset(src, 0xff, nb);
        assert_ok(ndm_array_copy_out(a, out, nb));
        assert_memory_equal(out, keep, nb);
        assert_true(ndm_array_data(a) != (void *)src);
        release_ok(a);
    }
}

static void test_from_buffer_values(void **state)
{
    ndm_manager m = ROOT(state);
    const int32_t iv[6] = {-3, 0, 7, INT32_MAX, INT32_MIN, 42};
    ndm_array a = ndm_from_buffer(m, NDM_I32, iv, SHAPE23);
    assert_values(a, ((double[]){-3, 0, 7, INT32_MAX, INT32_MIN, 42}), 6);
    const uint16_t hv[3] = {0x3c00, 0xc000, 0x0001};
    ndm_array h = ndm_from_buffer(m, NDM_F16, hv, NDM_SHAPE(3));
    assert_values(h, ((double[]){1.0, -2.0, ldexp(1, -24)}), 3);
    release_ok(a);
    release_ok(h);
}

static void test_from_buffer_null_source(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_from_buffer(m, NDM_F32, NULL, SHAPE23), NDM_E_INVALID);
    assert_error_has("src is NULL");
    assert_manager_empty(m);
    /* Nothing to read: NULL is fine for an empty array. */
    ndm_array e = ndm_from_buffer(m, NDM_F32, NULL, NDM_SHAPE(0, 4));
    assert_live(e);
    assert_int_equal(ndm_array_size(e), 0);
    release_ok(e);
}

typedef struct free_log {
    int calls;
    void *data;
    void *ud;
} free_log;

static void log_free(void *data, void *ud)
{
    free_log *log = ud;
    log->calls++;
    log->data = data;
    log->ud = ud;
}

static void test_wrap_buffer_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        unsigned char buf[48] = {0};
        free_log log = {0};
        ndm_array a = ndm_wrap_buffer(m, dt, buf, log_free, &log, SHAPE23);
        assert_live(a);
        assert_int_equal(ndm_array_dtype(a), dt);
        assert_shape(a, 2, 3);
        assert_ptr_equal(ndm_array_data(a), buf);
        /* No copy: writes through either side show on the other. */
        buf[0] = 1;
        unsigned char out[48];
        size_t nb = ndm_array_nbytes(a);
        assert_ok(ndm_array_copy_out(a, out, nb));
        assert_int_equal(out[0], 1);
        unsigned char in[48];
        memset(in, 0, sizeof in);
        in[nb - 1] = 1;
        assert_ok(ndm_array_copy_in(a, in, nb));
        assert_int_equal(buf[nb - 1], 1);
        assert_int_equal(log.calls, 0);
        release_ok(a);
        assert_int_equal(log.calls, 1);
        assert_ptr_equal(log.data, buf);
        assert_ptr_equal(log.ud, &log);
    }
}

static void test_wrap_buffer_free_after_last_view(void **state)
{
    ndm_manager m = ROOT(state);
    float buf[6] = {1, 2, 3, 4, 5, 6};
    free_log log = {0};
    ndm_array a = ndm_wrap_buffer(m, NDM_F32, buf, log_free, &log, SHAPE23);
    assert_live(a);
    ndm_array v = ndm_transpose(a);
    ndm_array b = ndm_alias(a);
    release_ok(a);
    assert_int_equal(log.calls, 0);
    release_ok(b);
    assert_int_equal(log.calls, 0);
    assert_values(v, ((double[]){1, 4, 2, 5, 3, 6}), 6);
    release_ok(v);
    assert_int_equal(log.calls, 1);
    assert_ptr_equal(log.data, buf);
    assert_st(ndm_array_release(v), NDM_ALREADY);
    assert_int_equal(log.calls, 1);
}

static void test_wrap_buffer_freed_by_close(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    double buf[4] = {0};
    free_log log = {0};
    ndm_array a = ndm_wrap_buffer(batch, NDM_F64, buf, log_free, &log, NDM_SHAPE(4));
    ndm_array b = ndm_alias(a);
    assert_live(b);
    close_ok(batch);
    assert_int_equal(log.calls, 1);
    assert_false(ndm_array_valid(a));
    assert_false(ndm_array_valid(b));
}

static void test_wrap_buffer_failure_keeps_buffer(void **state)
{
    ndm_manager m = ROOT(state);
    float buf[6];
    free_log log = {0};
    assert_fails(ndm_wrap_buffer(m, NDM_F32, buf, log_free, &log, NDM_SHAPE(2, -3)), NDM_E_SHAPE);
    assert_fails(ndm_wrap_buffer(m, (ndm_dtype)42, buf, log_free, &log, SHAPE23), NDM_E_DTYPE);
    assert_fails(ndm_wrap_buffer(NDM_NULL_MANAGER, NDM_F32, buf, log_free, &log, SHAPE23),
                 NDM_E_NULL);
    assert_fails(ndm_wrap_buffer(m, NDM_F32, NULL, log_free, &log, SHAPE23), NDM_E_INVALID);
    assert_fails(ndm_wrap_buffer(m, NDM_F32, buf, log_free, &log, NDM_SHAPE(INT64_MAX, 2)),
                 NDM_E_OVERFLOW);
    ndm_manager capped = ndm_manager_new(m, "capped");
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    assert_fails(ndm_wrap_buffer(capped, NDM_F32, buf, log_free, &log, SHAPE23), NDM_E_CAPPED);
    ndm_manager limited = ndm_manager_new(m, "limited");
    assert_ok(ndm_manager_set_limit(limited, NDM_CPU, 8));
    assert_fails(ndm_wrap_buffer(limited, NDM_F32, buf, log_free, &log, SHAPE23), NDM_E_QUOTA);
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    assert_fails(ndm_wrap_buffer(gone, NDM_F32, buf, log_free, &log, SHAPE23), NDM_E_CLOSED);
    close_ok(capped);
    close_ok(limited);
    assert_int_equal(log.calls, 0);
    assert_manager_empty(m);
}

static void test_wrap_buffer_counts_bytes(void **state)
{
    ndm_manager m = ROOT(state);
    double buf[5];
    ndm_array a = ndm_wrap_buffer(m, NDM_F64, buf, NULL, NULL, NDM_SHAPE(5));
    assert_live(a);
    assert_int_equal(check_live_bytes(m, 0), 40);
    release_ok(a);
    assert_int_equal(check_live_bytes(m, 0), 0);
}

/* ---- f16 and bf16 ------------------------------------------------------------ */

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_f16_round_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(ndm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(ndm_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(ndm_f32_to_f16(0.5f), 0x3800);
    assert_int_equal(ndm_f32_to_f16(0.1f), 0x2e66);
    assert_int_equal(ndm_f32_to_f16(1.0f / 3), 0x3555);
    assert_int_equal(ndm_f32_to_f16(-0.0f), 0x8000);
    /* Halfway between 1 and 1+2^-10: to the even one, 1. */
    assert_int_equal(ndm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    /* Halfway between 1+2^-10 (odd) and 1+2^-9: up. */
    assert_int_equal(ndm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    /* Just above halfway: up. */
    assert_int_equal(ndm_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* Just below halfway: down. */
    assert_int_equal(ndm_f32_to_f16(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00);
    /* A carry out of the mantissa moves the exponent: 2 - 2^-12 rounds to 2. */
    assert_int_equal(ndm_f32_to_f16(2.0f - 0x1p-12f), 0x4000);
}

static void test_f16_subnormals(void **state)
{
    (void)state;
    assert_int_equal(ndm_f32_to_f16(0x1p-24f), 0x0001);       /* smallest subnormal */
    assert_int_equal(ndm_f32_to_f16(1023 * 0x1p-24f), 0x03ff); /* largest subnormal */
    assert_int_equal(ndm_f32_to_f16(0x1p-14f), 0x0400);       /* smallest normal */
    assert_int_equal(ndm_f32_to_f16(0x1p-25f), 0x0000);       /* halfway to 0: even */
    assert_int_equal(ndm_f32_to_f16(0x1.8p-25f), 0x0001);     /* above halfway */
    assert_int_equal(ndm_f32_to_f16(3 * 0x1p-25f), 0x0002);   /* 1.5 ulp: to even 2 */
    assert_int_equal(ndm_f32_to_f16(5 * 0x1p-25f), 0x0002);   /* 2.5 ulp: to even 2 */
    assert_int_equal(ndm_f32_to_f16(-0x1p-24f), 0x8001);
    assert_int_equal(ndm_f32_to_f16(0x1p-30f), 0x0000);
    assert_int_equal(ndm_f32_to_f16(-0x1p-30f), 0x8000);
    /* The largest subnormal plus half an ulp rounds up into the normals. */
    assert_int_equal(ndm_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);
    assert_true(ndm_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(ndm_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(ndm_f16_to_f32(0x8001) == -0x1p-24f);
}

static void test_f16_inf_nan_overflow(void **state)
{
    (void)state;
    assert_int_equal(ndm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ndm_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(ndm_f32_to_f16(65520.0f), 0x7c00); /* halfway above max: inf */
    assert_int_equal(ndm_f32_to_f16(1e5f), 0x7c00);
    assert_int_equal(ndm_f32_to_f16(-1e5f), 0xfc00);
    assert_int_equal(ndm_f32_to_f16(FLT_MAX), 0x7c00);
    assert_int_equal(ndm_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(ndm_f32_to_f16(-INFINITY), 0xfc00);
    /* NaN stays NaN, also when its payload sits only in the low bits. */
    uint16_t n = ndm_f32_to_f16(NAN);
    assert_int_equal(n & 0x7c00, 0x7c00);
    assert_int_not_equal(n & 0x03ff, 0);
    uint16_t low = ndm_f32_to_f16(bits_to_f32(0x7f800001u));
    assert_int_equal(low & 0x7c00, 0x7c00);
    assert_int_not_equal(low & 0x03ff, 0);
    uint16_t neg = ndm_f32_to_f16(bits_to_f32(0xffc00000u));
    assert_int_equal(neg & 0x8000, 0x8000);
    assert_int_not_equal(neg & 0x03ff, 0);
    assert_true(ndm_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(ndm_f16_to_f32(0x7c00) == INFINITY);
    assert_true(ndm_f16_to_f32(0xfc00) == -INFINITY);
    assert_true(isnan(ndm_f16_to_f32(0x7e00)));
    assert_true(isnan(ndm_f16_to_f32(0x7c01)));
    float nz = ndm_f16_to_f32(0x8000);
    assert_true(nz == 0 && signbit(nz));
    assert_true(ndm_f16_to_f32(0x3555) == 0.333251953125f);
}

static void test_f16_every_value_round_trips(void **state)
{
    (void)state;
    /* Every half value converts to float exactly and back to the same bits;
     * the float agrees with the format's definition. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ndm_f16_to_f32((uint16_t)h);
        double want = check_f16_value((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(f));
            continue;
        }
        if ((double)f != want)
            fail_msg("f16 0x%04x gives %.9g, expected %.9g", h, f, want);
        assert_int_equal(ndm_f32_to_f16(f), h);
    }
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(ndm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ndm_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(ndm_f32_to_bf16(0.1f), 0x3dcd);
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80); /* tie, even: down */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82); /* tie, odd: up */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81); /* above: up */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x3f807fffu)), 0x3f80); /* below: down */
    assert_int_equal(ndm_f32_to_bf16(-0.0f), 0x8000);
    assert_true(ndm_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(ndm_bf16_to_f32(0x3dcd) == 0.10009765625f);
}

static void test_bf16_f32_extremes(void **state)
{
    (void)state;
    assert_int_equal(ndm_f32_to_bf16(FLT_MAX), 0x7f80);  /* rounds past the largest: inf */
    assert_int_equal(ndm_f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x7f7f0000u)), 0x7f7f); /* largest bf16 */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x7f7f8000u)), 0x7f80); /* tie, odd: inf */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x7f7e8000u)), 0x7f7e); /* tie, even: down */
    assert_int_equal(ndm_f32_to_bf16(FLT_MIN), 0x0080);
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x00000001u)), 0x0000); /* tiny: 0 */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x00008000u)), 0x0000); /* tie, even */
    assert_int_equal(ndm_f32_to_bf16(bits_to_f32(0x00018000u)), 0x0002); /* tie, odd: up */
    assert_int_equal(ndm_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(ndm_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(ndm_bf16_to_f32(0x7f7f) == bits_to_f32(0x7f7f0000u));
    assert_true(ndm_bf16_to_f32(0x0001) == 0x1p-133f);
    assert_true(ndm_bf16_to_f32(0xff80) == -INFINITY);
}

static void test_bf16_nan_stays_nan(void **state)
{
    (void)state;
    /* Rounding the payload must not carry a NaN into infinity or zero. */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7f80ffffu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t b = ndm_f32_to_bf16(bits_to_f32(nans[i]));
        assert_int_equal(b & 0x7f80, 0x7f80);
        assert_int_not_equal(b & 0x007f, 0);
        assert_int_equal(b & 0x8000, (nans[i] >> 16) & 0x8000);
        assert_true(isnan(ndm_bf16_to_f32(b)));
    }
    assert_int_equal(f32_to_bits(ndm_bf16_to_f32(0x7fc0)), 0x7fc00000u);
}

/* Storing a double into f16/bf16 must round once, as numpy does: going
 * through float first rounds twice and breaks ties the wrong way. */
static void test_cast_double_to_f16_rounds_once(void **state)
{
    ndm_manager m = ROOT(state);
    uint16_t hb, bb;
    ndm_array h = ndm_full(m, NDM_F16, 1.0 + 0x1p-11 + 0x1p-40, NDM_SCALAR);
    ndm_array b = ndm_full(m, NDM_BF16, 1.0 + 0x1p-8 + 0x1p-30, NDM_SCALAR);
    assert_ok(ndm_array_copy_out(h, &hb, 2));
    assert_ok(ndm_array_copy_out(b, &bb, 2));
    release_ok(h);
    release_ok(b);
    assert_int_equal(hb, 0x3c01);
    assert_int_equal(bb, 0x3f81);
}

/* ---- casts to integers ------------------------------------------------------------ */

static void test_cast_float_to_int_saturates(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype ints[] = {NDM_U8, NDM_I32, NDM_I64};
    const double values[] = {INFINITY, -INFINITY, 1e30, -1e30, 2.9, -2.9,
                             254.9, 255.5, 2147483647.5, -2147483648.9, 9.3e18, -9.3e18};
    for (size_t t = 0; t < 3; t++) {
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            ndm_array a = ndm_full(m, ints[t], values[v], NDM_SHAPE(2));
            double want[2] = {check_cast(values[v], ints[t]), check_cast(values[v], ints[t])};
            assert_values(a, want, 2);
            release_ok(a);
        }
    }
    int64_t got;
    ndm_array big = ndm_full(m, NDM_I64, 1e300, NDM_SCALAR);
    assert_ok(ndm_item_i64(big, &got));
    assert_true(got == INT64_MAX);
    ndm_array small = ndm_full(m, NDM_I64, -1e300, NDM_SCALAR);
    assert_ok(ndm_item_i64(small, &got));
    assert_true(got == INT64_MIN);
    release_ok(big);
    release_ok(small);
}

static void test_cast_nan_to_int_is_zero(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype ints[] = {NDM_U8, NDM_I32, NDM_I64};
    for (size_t t = 0; t < 3; t++) {
        ndm_array a = ndm_full(m, ints[t], NAN, NDM_SHAPE(3));
        assert_values(a, ((double[]){0, 0, 0}), 3);
        release_ok(a);
    }
    /* The same rule from a float array, through item_i64. */
    const float fv[4] = {NAN, INFINITY, -1e20f, 7.99f};
    ndm_array f = ndm_from_buffer(m, NDM_F32, fv, NDM_SHAPE(4));
    const int64_t want[4] = {0, INT64_MAX, INT64_MIN, 7};
    for (int i = 0; i < 4; i++) {
        ndm_array e = ndm_select(f, 0, i);
        int64_t got;
        assert_ok(ndm_item_i64(e, &got));
        assert_true(got == want[i]);
        release_ok(e);
    }
    release_ok(f);
}

static void test_cast_to_bool(void **state)
{
    ndm_manager m = ROOT(state);
    const double values[] = {NAN, -0.0, 0.0, 0.5, -3, INFINITY};
    const double want[] = {1, 0, 0, 1, 1, 1};
    for (size_t v = 0; v < 6; v++) {
        ndm_array a = ndm_full(m, NDM_BOOL, values[v], NDM_SCALAR);
        unsigned char raw;
        assert_ok(ndm_array_copy_out(a, &raw, 1));
        assert_int_equal(raw, want[v]);
        release_ok(a);
    }
}

/* ---- shapes ------------------------------------------------------------------------ */

static void test_shape_zero_d(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SCALAR);
    assert_live(a);
    assert_int_equal(ndm_array_ndim(a), 0);
    assert_int_equal(ndm_array_size(a), 1);
    assert_int_equal(ndm_array_nbytes(a), 4);
    int64_t buf[1];
    assert_int_equal(ndm_array_shape(a, buf, 0), 0);
    assert_int_equal(ndm_array_strides(a, NULL, 0), 0);
    assert_true(ndm_array_is_contiguous(a));
    ndm_clear_error();
    assert_int_equal(ndm_array_dim(a, 0), -1);
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_int_equal(check_live_bytes(m, 0), 4);
    release_ok(a);
}

static void test_shape_size_zero_axis(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F64, NDM_SHAPE(3, 0, 2));
    assert_live(a);
    assert_shape(a, 3, 0, 2);
    assert_strides(a, 2, 2, 1); /* numpy's (16, 16, 8) bytes */
    assert_int_equal(ndm_array_size(a), 0);
    assert_int_equal(ndm_array_nbytes(a), 0);
    assert_true(ndm_array_is_contiguous(a));
    assert_ok(ndm_array_copy_out(a, NULL, 0));
    assert_ok(ndm_array_copy_in(a, NULL, 0));
    assert_int_equal(check_live_bytes(m, 0), 0);
    ndm_array b = ndm_zeros(m, NDM_I32, NDM_SHAPE(0));
    assert_int_equal(ndm_array_size(b), 0);
    release_ok(a);
    release_ok(b);
}

static void test_shape_rank_7(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_arange(m, NDM_F64, 0, 24, 1);
    ndm_array r = ndm_reshape(a, NDM_SHAPE(1, 2, 1, 2, 1, 2, 3));
    ndm_array z = ndm_zeros(m, NDM_F64, NDM_SHAPE(1, 2, 1, 2, 1, 2, 3));
    assert_live(r);
    assert_live(z);
    assert_int_equal(ndm_array_ndim(z), 7);
    assert_shape(z, 1, 2, 1, 2, 1, 2, 3);
    assert_strides(z, 24, 12, 12, 6, 6, 3, 1);
    assert_int_equal(ndm_array_dim(z, -1), 3);
    assert_int_equal(ndm_array_dim(z, 6), 3);
    assert_int_equal(ndm_array_dim(z, -7), 1);
    double vals[24];
    for (int i = 0; i < 24; i++)
        vals[i] = i * 1.5;
    assert_ok(ndm_array_copy_in(z, vals, sizeof vals));
    assert_values(z, vals, 24);
    double idx[24];
    for (int i = 0; i < 24; i++)
        idx[i] = i;
    assert_values(r, idx, 24);
    release_ok(a);
    release_ok(r);
    release_ok(z);
}

static void test_shape_rank_10(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_full(m, NDM_I32, 5, NDM_SHAPE(2, 2, 2, 2, 2, 2, 2, 2, 2, 2));
    assert_live(a);
    assert_int_equal(ndm_array_ndim(a), 10);
    assert_int_equal(ndm_array_size(a), 1024);
    assert_int_equal(ndm_array_nbytes(a), 4096);
    assert_strides(a, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1);
    int64_t small[9];
    ndm_clear_error();
    assert_int_equal(ndm_array_shape(a, small, 9), NDM_E_INVALID);
    double *v = check_read(a, NULL);
    for (int i = 0; i < 1024; i++)
        assert_true(v[i] == 5);
    free(v);
    /* A view of it keeps its own long shape. */
    ndm_array t = ndm_transpose(a);
    assert_int_equal(ndm_array_ndim(t), 10);
    assert_strides(t, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512);
    release_ok(a);
    release_ok(t);
}

static void test_shape_negative_dim(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_zeros(m, NDM_F32, NDM_SHAPE(2, -3)), NDM_E_SHAPE);
    assert_error_has("negative size -3 on axis 1");
    assert_fails(ndm_empty(m, NDM_F32, -1, NULL), NDM_E_SHAPE);
    assert_error_has("negative rank -1");
    assert_fails(ndm_ones(m, NDM_F32, 2, NULL), NDM_E_SHAPE);
    assert_fails(ndm_full(m, NDM_F32, 1.0, NDM_SHAPE(-1)), NDM_E_SHAPE);
    assert_fails(ndm_from_buffer(m, NDM_F32, "", NDM_SHAPE(-4, 0)), NDM_E_SHAPE);
    assert_manager_empty(m);
}

static void test_shape_element_overflow(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_zeros(m, NDM_U8, NDM_SHAPE(INT64_C(1) << 32, INT64_C(1) << 32)),
                 NDM_E_OVERFLOW);
    assert_error_has("element count overflows");
    assert_fails(ndm_empty(m, NDM_U8, NDM_SHAPE(INT64_MAX, 2)), NDM_E_OVERFLOW);
    assert_fails(ndm_empty(m, NDM_U8, NDM_SHAPE(3, INT64_MAX / 2, 1)), NDM_E_OVERFLOW);
    assert_manager_empty(m);
}

static void test_shape_byte_overflow(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_empty(m, NDM_F32, NDM_SHAPE(INT64_C(1) << 62)), NDM_E_OVERFLOW);
    assert_error_has("byte count");
    assert_fails(ndm_empty(m, NDM_F64, NDM_SHAPE(INT64_C(1) << 61)), NDM_E_OVERFLOW);
    /* 2^60 elements of 8 bytes fit in size_t but not in int64. */
    assert_fails(ndm_zeros(m, NDM_I64, NDM_SHAPE(INT64_C(1) << 30, INT64_C(1) << 30)),
                 NDM_E_OVERFLOW);
    assert_manager_empty(m);
}

static void test_dtype_invalid(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype bad[] = {(ndm_dtype)NDM_DTYPE_COUNT, (ndm_dtype)42, (ndm_dtype)-1};
    float buf[6] = {0};
    for (int i = 0; i < 3; i++) {
        assert_fails(ndm_empty(m, bad[i], SHAPE23), NDM_E_DTYPE);
        assert_error_has("invalid dtype");
        assert_fails(ndm_zeros(m, bad[i], SHAPE23), NDM_E_DTYPE);
        assert_fails(ndm_full(m, bad[i], 1, SHAPE23), NDM_E_DTYPE);
        assert_fails(ndm_scalar(m, bad[i], 1), NDM_E_DTYPE);
        assert_fails(ndm_arange(m, bad[i], 0, 3, 1), NDM_E_DTYPE);
        assert_fails(ndm_linspace(m, bad[i], 0, 3, 4), NDM_E_DTYPE);
        assert_fails(ndm_from_buffer(m, bad[i], buf, SHAPE23), NDM_E_DTYPE);
    }
    assert_manager_empty(m);
}

static void test_factory_null_manager_without_scope(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_manager none = NDM_NULL_MANAGER;
    float buf[6] = {0};
    assert_null(ndm_scope_current().id);
    assert_fails(ndm_empty(none, NDM_F32, SHAPE23), NDM_E_NULL);
    assert_error_has("ndm_empty: ");
    assert_fails(ndm_zeros(none, NDM_F32, SHAPE23), NDM_E_NULL);
    assert_fails(ndm_ones(none, NDM_F32, SHAPE23), NDM_E_NULL);
    assert_fails(ndm_full(none, NDM_F32, 2, SHAPE23), NDM_E_NULL);
    assert_fails(ndm_scalar(none, NDM_F32, 2), NDM_E_NULL);
    assert_fails(ndm_arange(none, NDM_F32, 0, 3, 1), NDM_E_NULL);
    assert_fails(ndm_linspace(none, NDM_F32, 0, 3, 4), NDM_E_NULL);
    assert_fails(ndm_from_buffer(none, NDM_F32, buf, SHAPE23), NDM_E_NULL);
    assert_manager_empty(m);
}

static void test_factory_current_scope_without_scope(void **state)
{
    ndm_manager m = ROOT(state);
    assert_null(ndm_scope_current().id);
    assert_fails(ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, SHAPE23), NDM_E_NULL);
    assert_error_has("no scope is active");
    ndm_clear_error();
    assert_fails(ndm_zeros(NDM_OUTPUT_RULE, NDM_F32, SHAPE23), NDM_E_INVALID);
    assert_error_has("NDM_OUTPUT_RULE");
    assert_manager_empty(m);
}

/* A null manager is an error even inside a scope: a failed ndm_manager_new
 * must not turn into arrays of whatever scope is active. */
static void test_factory_null_manager_inside_scope(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager s = ndm_scope_begin(m, "scope");
    ndm_clear_error();
    ndm_manager gpu = ndm_manager_new_on(m, "gpu", NDM_CUDA(15));
    assert_null(gpu.id);
    ndm_status why = ndm_last_status();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ndm_last_error());
    assert_true(why < 0);
    ndm_array z = ndm_zeros(gpu, NDM_F32, SHAPE23);
    assert_null(z.id);
    assert_int_equal(ndm_last_status(), why); /* the first error stays */
    assert_string_equal(ndm_last_error(), msg);
    assert_fails(ndm_zeros(gpu, NDM_F32, SHAPE23), NDM_E_NULL);
    assert_error_has("null manager handle");
    assert_int_equal(test_live_arrays(s), 0);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_manager_empty(m);
}

static void test_factory_current_scope_uses_scope(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_manager none = NDM_CURRENT_SCOPE;
    float buf[6] = {0};
    ndm_manager s = ndm_scope_begin(m, "factories");
    assert_live(s);
    ndm_array made[9] = {
        ndm_empty(none, NDM_F32, SHAPE23),
        ndm_zeros(none, NDM_F32, SHAPE23),
        ndm_ones(none, NDM_F32, SHAPE23),
        ndm_full(none, NDM_F32, 2, SHAPE23),
        ndm_scalar(none, NDM_F32, 2),
        ndm_arange(none, NDM_F32, 0, 3, 1),
        ndm_linspace(none, NDM_F32, 0, 3, 4),
        ndm_from_buffer(none, NDM_F32, buf, SHAPE23),
        ndm_wrap_buffer(none, NDM_F32, buf, NULL, NULL, SHAPE23),
    };
    for (int i = 0; i < 9; i++) {
        assert_live(made[i]);
        assert_int_equal(ndm_array_manager(made[i]).id, s.id);
    }
    /* A named manager still wins inside the scope. */
    ndm_array named = ndm_zeros(m, NDM_F32, SHAPE23);
    assert_int_equal(ndm_array_manager(named).id, m.id);
    assert_int_equal(test_live_arrays(s), 9);
    assert_ok(ndm_scope_end(s, 0, NULL));
    for (int i = 0; i < 9; i++)
        assert_false(ndm_array_valid(made[i]));
    release_ok(named);
}

static void test_factory_stale_manager(void **state)
{
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    close_ok(gone);
    assert_fails(ndm_zeros(gone, NDM_F32, SHAPE23), NDM_E_CLOSED);
    assert_error_has("system/test/gone");
    assert_fails(ndm_arange(gone, NDM_F32, 0, 3, 1), NDM_E_CLOSED);
}

/* A failing factory leaves no trace in the accounting. */
static void test_factory_failure_allocates_nothing(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager c = ndm_manager_new(m, "capped");
    assert_ok(ndm_manager_cap(c, NDM_CAP_ARRAYS));
    assert_fails(ndm_zeros(c, NDM_F32, SHAPE23), NDM_E_CAPPED);
    assert_fails(ndm_zeros(m, NDM_F32, NDM_SHAPE(-1)), NDM_E_SHAPE);
    assert_fails(ndm_from_buffer(m, NDM_F32, NULL, SHAPE23), NDM_E_INVALID);
    close_ok(c);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.created, 0);
    assert_int_equal(st.peak_bytes, 0);
}

/* ---- accessors ----------------------------------------------------------------- */

static void test_accessors_valid_handle(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_arange(m, NDM_I64, 0, 12, 1);
    ndm_array v = ndm_reshape(a, NDM_SHAPE(3, 4));
    ndm_array s = ndm_slice(v, 1, 1, 4, 2);
    ndm_clear_error();
    assert_true(ndm_array_valid(s));
    assert_int_equal(ndm_array_ndim(s), 2);
    assert_int_equal(ndm_array_dim(s, 0), 3);
    assert_int_equal(ndm_array_dim(s, 1), 2);
    assert_int_equal(ndm_array_dim(s, -1), 2);
    assert_shape(s, 3, 2);
    assert_strides(s, 4, 2);
    assert_int_equal(ndm_array_offset(s), 1);
    assert_int_equal(ndm_array_size(s), 6);
    assert_int_equal(ndm_array_nbytes(s), 48);
    assert_int_equal(ndm_array_dtype(s), NDM_I64);
    assert_true(ndm_device_eq(ndm_array_device(s), NDM_CPU));
    assert_int_equal(ndm_array_manager(s).id, m.id);
    assert_false(ndm_array_is_contiguous(s));
    assert_true(ndm_array_is_contiguous(v));
    assert_true(ndm_array_shares_storage(a, s));
    /* data points at the first element of the view. */
    int64_t *base = ndm_array_data(a);
    int64_t *first = ndm_array_data(s);
    assert_ptr_equal(first, base + 1);
    assert_int_equal(*first, 1);
    assert_int_equal(ndm_last_status(), NDM_OK);
    release_ok(a);
    release_ok(v);
    release_ok(s);
}

/* Every accessor on a bad handle returns its documented value and sets `want`. */
static void check_accessors_fail(ndm_array h, ndm_status want)
{
    int64_t buf[4];
#define EXPECT(expr, value)                                                     \
    do {                                                                        \
        ndm_clear_error();                                                      \
        assert_true((expr) == (value));                                         \
        assert_st(ndm_last_status(), want);                                     \
    } while (0)
    EXPECT(ndm_array_ndim(h), -1);
    EXPECT(ndm_array_dim(h, 0), -1);
    EXPECT(ndm_array_shape(h, buf, 4), (int)want);
    EXPECT(ndm_array_strides(h, buf, 4), (int)want);
    EXPECT(ndm_array_offset(h), -1);
    EXPECT(ndm_array_size(h), -1);
    EXPECT(ndm_array_nbytes(h), 0);
    EXPECT(ndm_array_dtype(h), NDM_F32);
    EXPECT(ndm_array_device(h).type, NDM_DEVICE_CPU);
    EXPECT(ndm_array_manager(h).id, 0);
    EXPECT(ndm_array_is_contiguous(h), false);
    EXPECT(ndm_array_data(h), NULL);
    EXPECT(ndm_array_copy_out(h, buf, 8), want);
    EXPECT(ndm_array_copy_in(h, buf, 8), want);
    double d;
    int64_t i;
    EXPECT(ndm_item(h, &d), want);
    EXPECT(ndm_item_i64(h, &i), want);
    char text[16];
    EXPECT(ndm_array_format(h, text, sizeof text), (int)want);
    EXPECT(ndm_array_print(h, stderr), want);
#undef EXPECT
    ndm_clear_error();
    assert_false(ndm_array_valid(h));
    assert_int_equal(ndm_last_status(), NDM_OK); /* valid() sets no error */
}

static void test_accessors_null_handle(void **state)
{
    ndm_manager m = ROOT(state);
    check_accessors_fail(NDM_NULL_ARRAY, NDM_E_NULL);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    ndm_clear_error();
    assert_false(ndm_array_shares_storage(a, NDM_NULL_ARRAY));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_clear_error();
    assert_false(ndm_array_shares_storage(NDM_NULL_ARRAY, a));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    release_ok(a);
}

static void test_accessors_stale_handle(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    release_ok(a);
    check_accessors_fail(a, NDM_E_CLOSED);
    ndm_clear_error();
    assert_false(ndm_array_shares_storage(b, a));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    release_ok(b);
}

static void test_accessors_foreign_handle(void **state)
{
    ndm_manager m = ROOT(state);
    /* A manager handle is not an array handle. */
    ndm_array as_array = {m.id};
    check_accessors_fail(as_array, NDM_E_INVALID);
    assert_int_equal(ndm_array_ndim(as_array), -1);
    assert_error_has("not an array handle");
    /* Neither is an id with generation 0 or a slot never handed out. */
    check_accessors_fail((ndm_array){0x1234}, NDM_E_INVALID);
    check_accessors_fail((ndm_array){(UINT64_C(1) << 32) | 0x3fffffffu}, NDM_E_INVALID);
}

static void test_accessors_bad_arguments(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3, 4));
    ndm_clear_error();
    assert_int_equal(ndm_array_dim(a, 3), -1);
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_int_equal(ndm_array_dim(a, -4), -1);
    assert_int_equal(ndm_array_dim(a, -3), 2);
    int64_t two[2];
    assert_int_equal(ndm_array_shape(a, two, 2), NDM_E_INVALID);
    assert_int_equal(ndm_array_strides(a, two, 2), NDM_E_INVALID);
    assert_int_equal(ndm_array_shape(a, NULL, 3), NDM_E_INVALID);
    release_ok(a);
}

/* ---- release and stale handles ---------------------------------------------------- */

static void test_release_ok_then_already(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, SHAPE23);
    assert_int_equal(check_live_bytes(m, 0), 24);
    ndm_clear_error();
    assert_st(ndm_array_release(a), NDM_OK);
    assert_int_equal(check_live_bytes(m, 0), 0);
    assert_st(ndm_array_release(a), NDM_ALREADY);
    assert_st(ndm_array_release(a), NDM_ALREADY);
    /* NDM_ALREADY is not an error: the thread's error stays clear. */
    assert_int_equal(ndm_last_status(), NDM_OK);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.created, 1);
    assert_int_equal(st.released, 1);
}

static void test_release_null_and_foreign(void **state)
{
    ndm_manager m = ROOT(state);
    assert_st(ndm_array_release(NDM_NULL_ARRAY), NDM_E_NULL);
    assert_st(ndm_array_release(((ndm_array){m.id})), NDM_E_INVALID);
    assert_st(ndm_array_release(((ndm_array){0x99})), NDM_E_INVALID);
    assert_int_equal(ndm_manager_valid(m), true);
}

static void test_release_after_close_is_already(void **state)
{
    ndm_manager b = ndm_manager_new(ROOT(state), "batch");
    ndm_array a = ndm_zeros(b, NDM_F32, SHAPE23);
    close_ok(b);
    assert_st(ndm_array_release(a), NDM_ALREADY);
}

/* Release a series of fresh arrays until the slot of `dead` is handed out
 * again; returns the live array now in that slot. */
static ndm_array cycle_until_reused(ndm_manager m, ndm_array dead)
{
    for (int i = 0; i < 8192; i++) {
        ndm_array b = ndm_zeros(m, NDM_U8, NDM_SHAPE(1));
        assert_live(b);
        ndm_clear_error();
        assert_int_equal(ndm_array_ndim(dead), -1);
        if (strstr(ndm_last_error(), "has been reused"))
            return b;
        release_ok(b);
    }
    fail_msg("the slot of a released array was not reused after 8192 releases");
    return NDM_NULL_ARRAY;
}

static void test_release_stale_spares_slot_reuser(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, SHAPE23);
    release_ok(a);
    ndm_array b = cycle_until_reused(m, a);
    assert_st(ndm_array_release(a), NDM_ALREADY);
    assert_true(ndm_array_valid(b));
    assert_int_equal(test_live_arrays(m), 1);
    release_ok(b);
}

static void test_stale_message_names_release_site(void **state)
{
    ndm_manager m = ROOT(state);
    int made = __LINE__; ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    int freed = __LINE__; release_ok(a);
    char want[512];
    snprintf(want, sizeof want,
             "ndm_array_size: stale array handle: array f32[2,3] created at test_array.c:%d "
             "(%s) was released at test_array.c:%d (%s)",
             made, __func__, freed, __func__);
    ndm_clear_error();
    assert_int_equal(ndm_array_size(a), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_string_equal(ndm_last_error(), want);
    /* An operation with a site appends where it was called. */
    int used = __LINE__; ndm_array v = ndm_alias(a);
    assert_null(v.id);
    char tail[256];
    snprintf(tail, sizeof tail, "was released at test_array.c:%d (%s) [at test_array.c:%d (%s)]",
             freed, __func__, used, __func__);
    assert_error_has(tail);
    assert_error_has("ndm_alias: stale array handle: array f32[2,3]");
}

static void test_stale_message_names_closing_manager(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch-7");
    int made = __LINE__; ndm_array a = ndm_ones(batch, NDM_I32, NDM_SHAPE(4));
    int closed = __LINE__; close_ok(batch);
    char want[512];
    snprintf(want, sizeof want,
             "ndm_array_ndim: stale array handle: array i32[4] created at test_array.c:%d (%s) "
             "was released when its manager 'system/test/batch-7' was closed at "
             "test_array.c:%d (%s)",
             made, __func__, closed, __func__);
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_string_equal(ndm_last_error(), want);
}

static void test_stale_message_parent_close(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    int made = __LINE__; ndm_array a = ndm_zeros(batch, NDM_BF16, NDM_SCALAR);
    int closed = __LINE__; close_ok(model);
    char tail[256];
    snprintf(tail, sizeof tail,
             "array bf16[] created at test_array.c:%d (%s) was released when its manager "
             "'system/test/model/batch' was closed at test_array.c:%d (%s)",
             made, __func__, closed, __func__);
    ndm_clear_error();
    assert_int_equal(ndm_array_dtype(a), NDM_F32);
    assert_error_has(tail);
}

static void test_stale_message_says_reused(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, SHAPE23);
    release_ok(a);
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_null(strstr(ndm_last_error(), "has been reused"));
    ndm_array b = cycle_until_reused(m, a);
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("stale array handle");
    assert_error_has("has been reused");
    /* The message does not describe the array that lives there now. */
    assert_null(strstr(ndm_last_error(), "u8[1]"));
    release_ok(b);
    /* Still "reused" once the new occupant is gone too. */
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_error_has("has been reused");
}

static void test_stale_message_long_shape(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_U8, NDM_SHAPE(1, 2, 3, 4, 5, 6, 7, 8));
    ndm_clear_error();
    release_ok(a);
    assert_int_equal(ndm_array_ndim(a), -1);
    /* A dead record keeps the first six sizes. */
    assert_error_has("array u8[1,2,3,4,5,6,...] created at test_array.c:");
}

/* Once the closed manager's slot holds another manager, the message about an
 * array it released must not name the newcomer. */
static void test_stale_message_after_manager_reuse(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array a = ndm_zeros(batch, NDM_F32, SHAPE23);
    close_ok(batch);
    ndm_manager holder = ndm_manager_new(m, "holder");
    bool reused = false;
    char name[64];
    for (int i = 0; i < 3000 && !reused; i++) {
        ndm_manager other = ndm_manager_new(holder, "newcomer");
        assert_live(other);
        ndm_clear_error();
        assert_true(ndm_manager_name(batch, name, sizeof name) < 0);
        reused = strstr(ndm_last_error(), "has been reused") != NULL;
    }
    assert_true(reused);
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("created at test_array.c:");
    assert_null(strstr(ndm_last_error(), "newcomer"));
    assert_null(strstr(ndm_last_error(), "holder"));
    close_ok(holder);
}

/* ---- host transfers ------------------------------------------------------------------ */

static void test_copy_out_contiguous(void **state)
{
    ndm_manager m = ROOT(state);
    const float src[6] = {1.5f, -2, 3, 4e10f, -0.0f, 6};
    ndm_array a = ndm_from_buffer(m, NDM_F32, src, SHAPE23);
    float out[6];
    assert_ok(ndm_array_copy_out(a, out, sizeof out));
    assert_memory_equal(out, src, sizeof src);
    release_ok(a);
}

static void test_copy_out_strided(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_arange(m, NDM_I32, 0, 12, 1);
    ndm_array g = ndm_reshape(a, NDM_SHAPE(3, 4));
    ndm_array t = ndm_transpose(g);
    int32_t out[12];
    assert_ok(ndm_array_copy_out(t, out, sizeof out));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            assert_int_equal(out[i * 3 + j], j * 4 + i);
    ndm_array s = ndm_slice(g, 1, NDM_END, NDM_END, -2); /* columns 3, 1 */
    int32_t o2[6];
    assert_ok(ndm_array_copy_out(s, o2, sizeof o2));
    const int32_t want[6] = {3, 1, 7, 5, 11, 9};
    assert_memory_equal(o2, want, sizeof want);
    ndm_array e = ndm_expand(ndm_select(g, 1, 0), NDM_SHAPE(2, 3));
    /* The expand consumed a temporary select; both live in m. */
    int32_t o3[6];
    assert_ok(ndm_array_copy_out(e, o3, sizeof o3));
    const int32_t w3[6] = {0, 4, 8, 0, 4, 8};
    assert_memory_equal(o3, w3, sizeof w3);
    assert_int_equal(test_live_arrays(m), 6);
    assert_ok(ndm_scope_release_all(m));
}

static void test_copy_in_contiguous(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_I64, SHAPE23);
    const int64_t src[6] = {INT64_MIN, -1, 0, 1, INT64_MAX, 42};
    assert_ok(ndm_array_copy_in(a, src, sizeof src));
    assert_memory_equal(ndm_array_data(a), src, sizeof src);
    release_ok(a);
}

static void test_copy_in_strided(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array base = ndm_zeros(m, NDM_F64, NDM_SHAPE(3, 4));
    ndm_array t = ndm_transpose(base);                  /* (4, 3) */
    ndm_array s = ndm_slice(t, 0, 1, NDM_END, 2);         /* rows 1, 3 of t = columns of base */
    const double src[6] = {1, 2, 3, 4, 5, 6};
    assert_ok(ndm_array_copy_in(s, src, sizeof src));
    /* s[i][j] = base[j][1 + 2i] */
    const double want[12] = {0, 1, 0, 4, 0, 2, 0, 5, 0, 3, 0, 6};
    assert_values(base, want, 12);
    assert_values(s, src, 6);
    release_ok(base);
    release_ok(t);
    release_ok(s);
}

static void test_copy_wrong_size(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, SHAPE23);
    float buf[8];
    assert_st(ndm_array_copy_out(a, buf, 20), NDM_E_INVALID);
    assert_error_has("buffer of 20 bytes given; the array has 24");
    assert_st(ndm_array_copy_out(a, buf, 28), NDM_E_INVALID);
    assert_st(ndm_array_copy_in(a, buf, 4), NDM_E_INVALID);
    assert_st(ndm_array_copy_in(a, buf, 32), NDM_E_INVALID);
    assert_st(ndm_array_copy_out(a, NULL, 24), NDM_E_INVALID);
    assert_error_has("NULL");
    assert_st(ndm_array_copy_in(a, NULL, 24), NDM_E_INVALID);
    /* Nothing was written by the refused copy_in. */
    assert_values(a, ((double[]){0, 0, 0, 0, 0, 0}), 6);
    release_ok(a);
}

/* ---- item ---------------------------------------------------------------------------- */

static void test_item_any_rank(void **state)
{
    ndm_manager m = ROOT(state);
    double d;
    int64_t i;
    ndm_array s = ndm_scalar(m, NDM_F64, -2.5);
    assert_ok(ndm_item(s, &d));
    assert_true(d == -2.5);
    ndm_array r3 = ndm_full(m, NDM_F32, 0.25, NDM_SHAPE(1, 1, 1));
    assert_ok(ndm_item(r3, &d));
    assert_true(d == 0.25);
    ndm_array big = ndm_arange(m, NDM_I32, 0, 20, 1);
    ndm_array g = ndm_reshape(big, NDM_SHAPE(4, 5));
    ndm_array one = ndm_slice(ndm_slice(g, 0, 3, 4, 1), 1, -2, -1, 1); /* [[18]] */
    assert_shape(one, 1, 1);
    assert_ok(ndm_item_i64(one, &i));
    assert_int_equal(i, 18);
    assert_ok(ndm_item(one, &d));
    assert_true(d == 18);
    assert_ok(ndm_scope_release_all(m));
}

static void test_item_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = check_all_dtypes[k];
        ndm_array a = ndm_full(m, dt, 100.375, NDM_SHAPE(1));
        double d;
        int64_t i;
        assert_ok(ndm_item(a, &d));
        assert_true(d == check_cast(100.375, dt));
        assert_ok(ndm_item_i64(a, &i));
        assert_int_equal(i, (int64_t)check_cast(100.375, dt));
        release_ok(a);
    }
}

static void test_item_wrong_count(void **state)
{
    ndm_manager m = ROOT(state);
    double d;
    int64_t i;
    ndm_array two = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 2));
    assert_st(ndm_item(two, &d), NDM_E_SHAPE);
    assert_error_has("f32[1,2] has 2");
    assert_st(ndm_item_i64(two, &i), NDM_E_SHAPE);
    ndm_array none = ndm_zeros(m, NDM_F32, NDM_SHAPE(0));
    assert_st(ndm_item(none, &d), NDM_E_SHAPE);
    ndm_array one = ndm_zeros(m, NDM_F32, NDM_SHAPE(1));
    assert_st(ndm_item(one, NULL), NDM_E_INVALID);
    assert_st(ndm_item_i64(one, NULL), NDM_E_INVALID);
    release_ok(two);
    release_ok(none);
    release_ok(one);
}

static void test_item_i64_truncates_and_saturates(void **state)
{
    ndm_manager m = ROOT(state);
    const double in[] = {3.9, -3.9, 1e19, -1e19, NAN};
    const int64_t want[] = {3, -3, INT64_MAX, INT64_MIN, 0};
    for (int k = 0; k < 5; k++) {
        ndm_array a = ndm_scalar(m, NDM_F64, in[k]);
        int64_t got;
        assert_ok(ndm_item_i64(a, &got));
        assert_true(got == want[k]);
        release_ok(a);
    }
    ndm_array big = ndm_scalar(m, NDM_I64, 0);
    const int64_t exact = INT64_C(9007199254740993); /* 2^53 + 1: not a double */
    assert_ok(ndm_array_copy_in(big, &exact, 8));
    int64_t got;
    assert_ok(ndm_item_i64(big, &got));
    assert_true(got == exact);
    release_ok(big);
}

/* ---- printing like numpy's repr ----------------------------------------------------- */

/* The text of `a`, checked to be the same through format and print. */
static char *text_of(ndm_array a)
{
    int len = ndm_array_format(a, NULL, 0);
    if (len < 0)
        fail_msg("ndm_array_format failed: %s", ndm_last_error());
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(ndm_array_format(a, buf, (size_t)len + 1), len);
    assert_int_equal(strlen(buf), len);
    check_capture c;
    FILE *f = check_capture_open(&c);
    assert_ok(ndm_array_print(a, f));
    check_capture_close(&c);
    assert_int_equal(c.len, (size_t)len + 1);
    assert_memory_equal(c.text, buf, (size_t)len);
    assert_int_equal(c.text[len], '\n');
    free(c.text);
    return buf;
}

/* Takes `a`: it is released before the comparison, so that a mismatch
 * leaves nothing behind. */
#define assert_repr(a, want)                                                    \
    do {                                                                        \
        ndm_array ra_ = (a);                                                    \
        char *got_ = text_of(ra_);                                              \
        release_ok(ra_);                                                        \
        if (strcmp(got_, (want)) != 0) {                                        \
            print_error("got:\n%s\nexpected:\n%s\n", got_, (want));             \
            free(got_);                                                         \
            fail();                                                             \
        }                                                                       \
        free(got_);                                                             \
    } while (0)

static ndm_array from_f64(ndm_manager m, ndm_dtype dt, const double *v, int ndim,
                          const int64_t *shape)
{
    ndm_array d = ndm_from_buffer(m, NDM_F64, v, ndim, shape);
    assert_live(d);
    if (dt == NDM_F64)
        return d;
    /* Convert here, element by element, and copy the bits in. */
    ndm_array c = ndm_empty(m, dt, ndim, shape);
    int64_t n = ndm_array_size(d);
    void *raw = malloc((size_t)n * ndm_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        double x = v[i];
        switch (dt) {
        case NDM_F32: ((float *)raw)[i] = (float)x; break;
        case NDM_F16: ((uint16_t *)raw)[i] = ndm_f32_to_f16((float)x); break;
        case NDM_I32: ((int32_t *)raw)[i] = (int32_t)x; break;
        case NDM_I64: ((int64_t *)raw)[i] = (int64_t)x; break;
        case NDM_U8: ((uint8_t *)raw)[i] = (uint8_t)x; break;
        case NDM_BOOL: ((uint8_t *)raw)[i] = x != 0; break;
        default: fail_msg("unused dtype");
        }
    }
    assert_ok(ndm_array_copy_in(c, raw, ndm_array_nbytes(c)));
    free(raw);
    release_ok(d);
    return c;
}

#define ARR(m, dt, ...)                                                         \
    from_f64((m), (dt), (const double[]){__VA_ARGS__},                          \
             NDM_SHAPE((int64_t)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double))))

static void test_print_ints(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_I64, 1, -20, 300), "array([  1, -20, 300])");
    assert_repr(ARR(m, NDM_I32, 1, 2, 3), "array([1, 2, 3], dtype=int32)");
    assert_repr(ARR(m, NDM_U8, 0, 255), "array([  0, 255], dtype=uint8)");
    int64_t ext[2] = {INT64_MIN, 0};
    ndm_array e = ndm_from_buffer(m, NDM_I64, ext, NDM_SHAPE(2));
    assert_repr(e, "array([-9223372036854775808,                    0])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_float_decimals(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F32, 0.1, 1.0 / 3), "array([0.1       , 0.33333334], dtype=float32)");
    assert_repr(ARR(m, NDM_F64, 1.5, -2.25, 10), "array([ 1.5 , -2.25, 10.  ])");
    assert_repr(ARR(m, NDM_F64, 1.0 / 3), "array([0.33333333])");
    assert_repr(ARR(m, NDM_F64, 1234567), "array([1234567.])");
    assert_repr(ARR(m, NDM_F64, -0.0, 1), "array([-0.,  1.])");
    assert_repr(ARR(m, NDM_F64, -1.5, 2.25), "array([-1.5 ,  2.25])");
    assert_repr(ARR(m, NDM_F32, 0.1, 0.2, 0.3), "array([0.1, 0.2, 0.3], dtype=float32)");
    assert_repr(ARR(m, NDM_F64, 0.1, 0.2, 0.3), "array([0.1, 0.2, 0.3])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_whole_floats(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F64, 1, 2), "array([1., 2.])");
    assert_repr(ARR(m, NDM_F32, 1, 2, 30), "array([ 1.,  2., 30.], dtype=float32)");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_scientific(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F64, 1e-5, 1), "array([1.e-05, 1.e+00])");
    assert_repr(ARR(m, NDM_F64, 1e8, 1), "array([1.e+08, 1.e+00])");
    assert_repr(ARR(m, NDM_F64, 1.5e-5, 1, 123456789),
                "array([1.50000000e-05, 1.00000000e+00, 1.23456789e+08])");
    assert_repr(ARR(m, NDM_F64, 123456.5, 1.25), "array([1.234565e+05, 1.250000e+00])");
    assert_repr(ARR(m, NDM_F64, -1e-5, 1), "array([-1.e-05,  1.e+00])");
    assert_repr(ARR(m, NDM_F64, 1e16), "array([1.e+16])");
    assert_repr(ndm_scalar(m, NDM_F64, 1e-5), "array(1.e-05)");
    assert_repr(ARR(m, NDM_F64, 1e-5, NAN, -INFINITY), "array([1.e-05,    nan,   -inf])");
    double v[4] = {1e-5, 2, 3, -4e5};
    assert_repr(ndm_from_buffer(m, NDM_F64, v, NDM_SHAPE(2, 2)),
                "array([[ 1.e-05,  2.e+00],\n       [ 3.e+00, -4.e+05]])");
    assert_ok(ndm_scope_release_all(m));
}

/* numpy pads every exponent to the widest one. */
static void test_print_scientific_wide_exponent(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F64, 1e-100, 1), "array([1.e-100, 1.e+000])");
    assert_ok(ndm_scope_release_all(m));
}

/* Past 8 digits numpy rounds to 8 and drops the trailing zeros, in every
 * element and in the common width. */
static void test_print_scientific_rounded_digits(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F64, 1.0000000001e-05), "array([1.e-05])");
    assert_repr(ndm_scalar(m, NDM_F64, 1.0000000001e-05), "array(1.e-05)");
    assert_repr(ARR(m, NDM_F64, 7.71026e-13 + 1e-25, 1.5e-13), "array([7.71026e-13, 1.50000e-13])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_nan_inf(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F64, NAN, INFINITY, -INFINITY, 1), "array([ nan,  inf, -inf,   1.])");
    assert_repr(ARR(m, NDM_F32, NAN, 0.5), "array([nan, 0.5], dtype=float32)");
    assert_repr(ARR(m, NDM_F64, NAN, INFINITY), "array([nan, inf])");
    ndm_array z = ndm_scalar(m, NDM_F64, NAN);
    assert_repr(z, "array(nan)");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_bool(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_BOOL, 1, 0), "array([ True, False])");
    assert_repr(ARR(m, NDM_BOOL, 0, 0), "array([False, False])");
    assert_repr(ndm_scalar(m, NDM_BOOL, 1), "array(True)");
    assert_ok(ndm_scope_release_all(m));
}

/* numpy keeps the room for "False" even when every element is true. */
static void test_print_bool_all_true(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_BOOL, 1, 1), "array([ True,  True])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_zero_d(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ndm_scalar(m, NDM_F64, 3), "array(3.)");
    assert_repr(ndm_scalar(m, NDM_F32, 3), "array(3., dtype=float32)");
    assert_repr(ndm_scalar(m, NDM_I32, 7), "array(7, dtype=int32)");
    assert_repr(ndm_scalar(m, NDM_I64, -7), "array(-7)");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_empty(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ndm_zeros(m, NDM_F32, NDM_SHAPE(0)), "array([], dtype=float32)");
    assert_repr(ndm_zeros(m, NDM_I32, NDM_SHAPE(0, 3)), "array([], shape=(0, 3), dtype=int32)");
    assert_repr(ndm_zeros(m, NDM_F64, NDM_SHAPE(0)), "array([], dtype=float64)");
    assert_repr(ndm_zeros(m, NDM_F64, NDM_SHAPE(3, 0)), "array([], shape=(3, 0), dtype=float64)");
    assert_repr(ndm_zeros(m, NDM_I64, NDM_SHAPE(0)), "array([], dtype=int64)");
    assert_ok(ndm_scope_release_all(m));
}

static ndm_array iota(ndm_manager m, ndm_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    ndm_array a = ndm_arange(m, dt, 0, (double)n, 1);
    ndm_array r = ndm_reshape(a, ndim, shape);
    release_ok(a);
    return r;
}

static void test_print_nested_2d(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2, 3)), "array([[0, 1, 2],\n       [3, 4, 5]])");
    ndm_array g = iota(m, NDM_F64, NDM_SHAPE(2, 3));
    assert_repr(ndm_transpose(g), "array([[0., 3.],\n       [1., 4.],\n       [2., 5.]])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_nested_3d_blank_lines(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2, 2, 2)),
                "array([[[0, 1],\n        [2, 3]],\n\n       [[4, 5],\n        [6, 7]]])");
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2, 2, 2, 2)),
                "array([[[[ 0,  1],\n"
                "         [ 2,  3]],\n"
                "\n"
                "        [[ 4,  5],\n"
                "         [ 6,  7]]],\n"
                "\n"
                "\n"
                "       [[[ 8,  9],\n"
                "         [10, 11]],\n"
                "\n"
                "        [[12, 13],\n"
                "         [14, 15]]]])");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_summarised(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2000)),
                "array([   0,    1,    2, ..., 1997, 1998, 1999])");
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(100, 20)),
                "array([[   0,    1,    2, ...,   17,   18,   19],\n"
                "       [  20,   21,   22, ...,   37,   38,   39],\n"
                "       [  40,   41,   42, ...,   57,   58,   59],\n"
                "       ...,\n"
                "       [1940, 1941, 1942, ..., 1957, 1958, 1959],\n"
                "       [1960, 1961, 1962, ..., 1977, 1978, 1979],\n"
                "       [1980, 1981, 1982, ..., 1997, 1998, 1999]])");
    /* 1000 elements are not summarised; 1001 are. */
    ndm_array k = iota(m, NDM_I64, NDM_SHAPE(1000));
    char *t = text_of(k);
    assert_null(strstr(t, "..."));
    free(t);
    ndm_array k1 = iota(m, NDM_I64, NDM_SHAPE(1001));
    t = text_of(k1);
    assert_non_null(strstr(t, "..."));
    free(t);
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_summarised_3d(void **state)
{
    ndm_manager m = ROOT(state);
    /* numpy 2.1's repr of np.arange(2000, dtype=np.float32).reshape(10, 10, 20). */
    static const char want[] =
        "array([[[0.000e+00, 1.000e+00, 2.000e+00, ..., 1.700e+01, 1.800e+01,\n"
        "         1.900e+01],\n"
        "        [2.000e+01, 2.100e+01, 2.200e+01, ..., 3.700e+01, 3.800e+01,\n"
        "         3.900e+01],\n"
        "        [4.000e+01, 4.100e+01, 4.200e+01, ..., 5.700e+01, 5.800e+01,\n"
        "         5.900e+01],\n"
        "        ...,\n"
        "        [1.400e+02, 1.410e+02, 1.420e+02, ..., 1.570e+02, 1.580e+02,\n"
        "         1.590e+02],\n"
        "        [1.600e+02, 1.610e+02, 1.620e+02, ..., 1.770e+02, 1.780e+02,\n"
        "         1.790e+02],\n"
        "        [1.800e+02, 1.810e+02, 1.820e+02, ..., 1.970e+02, 1.980e+02,\n"
        "         1.990e+02]],\n"
        "\n"
        "       [[2.000e+02, 2.010e+02, 2.020e+02, ..., 2.170e+02, 2.180e+02,\n"
        "         2.190e+02],\n"
        "        [2.200e+02, 2.210e+02, 2.220e+02, ..., 2.370e+02, 2.380e+02,\n"
        "         2.390e+02],\n"
        "        [2.400e+02, 2.410e+02, 2.420e+02, ..., 2.570e+02, 2.580e+02,\n"
        "         2.590e+02],\n"
        "        ...,\n"
        "        [3.400e+02, 3.410e+02, 3.420e+02, ..., 3.570e+02, 3.580e+02,\n"
        "         3.590e+02],\n"
        "        [3.600e+02, 3.610e+02, 3.620e+02, ..., 3.770e+02, 3.780e+02,\n"
        "         3.790e+02],\n"
        "        [3.800e+02, 3.810e+02, 3.820e+02, ..., 3.970e+02, 3.980e+02,\n"
        "         3.990e+02]],\n"
        "\n"
        "       [[4.000e+02, 4.010e+02, 4.020e+02, ..., 4.170e+02, 4.180e+02,\n"
        "         4.190e+02],\n"
        "        [4.200e+02, 4.210e+02, 4.220e+02, ..., 4.370e+02, 4.380e+02,\n"
        "         4.390e+02],\n"
        "        [4.400e+02, 4.410e+02, 4.420e+02, ..., 4.570e+02, 4.580e+02,\n"
        "         4.590e+02],\n"
        "        ...,\n"
        "        [5.400e+02, 5.410e+02, 5.420e+02, ..., 5.570e+02, 5.580e+02,\n"
        "         5.590e+02],\n"
        "        [5.600e+02, 5.610e+02, 5.620e+02, ..., 5.770e+02, 5.780e+02,\n"
        "         5.790e+02],\n"
        "        [5.800e+02, 5.810e+02, 5.820e+02, ..., 5.970e+02, 5.980e+02,\n"
        "         5.990e+02]],\n"
        "\n"
        "       ...,\n"
        "\n"
        "       [[1.400e+03, 1.401e+03, 1.402e+03, ..., 1.417e+03, 1.418e+03,\n"
        "         1.419e+03],\n"
        "        [1.420e+03, 1.421e+03, 1.422e+03, ..., 1.437e+03, 1.438e+03,\n"
        "         1.439e+03],\n"
        "        [1.440e+03, 1.441e+03, 1.442e+03, ..., 1.457e+03, 1.458e+03,\n"
        "         1.459e+03],\n"
        "        ...,\n"
        "        [1.540e+03, 1.541e+03, 1.542e+03, ..., 1.557e+03, 1.558e+03,\n"
        "         1.559e+03],\n"
        "        [1.560e+03, 1.561e+03, 1.562e+03, ..., 1.577e+03, 1.578e+03,\n"
        "         1.579e+03],\n"
        "        [1.580e+03, 1.581e+03, 1.582e+03, ..., 1.597e+03, 1.598e+03,\n"
        "         1.599e+03]],\n"
        "\n"
        "       [[1.600e+03, 1.601e+03, 1.602e+03, ..., 1.617e+03, 1.618e+03,\n"
        "         1.619e+03],\n"
        "        [1.620e+03, 1.621e+03, 1.622e+03, ..., 1.637e+03, 1.638e+03,\n"
        "         1.639e+03],\n"
        "        [1.640e+03, 1.641e+03, 1.642e+03, ..., 1.657e+03, 1.658e+03,\n"
        "         1.659e+03],\n"
        "        ...,\n"
        "        [1.740e+03, 1.741e+03, 1.742e+03, ..., 1.757e+03, 1.758e+03,\n"
        "         1.759e+03],\n"
        "        [1.760e+03, 1.761e+03, 1.762e+03, ..., 1.777e+03, 1.778e+03,\n"
        "         1.779e+03],\n"
        "        [1.780e+03, 1.781e+03, 1.782e+03, ..., 1.797e+03, 1.798e+03,\n"
        "         1.799e+03]],\n"
        "\n"
        "       [[1.800e+03, 1.801e+03, 1.802e+03, ..., 1.817e+03, 1.818e+03,\n"
        "         1.819e+03],\n"
        "        [1.820e+03, 1.821e+03, 1.822e+03, ..., 1.837e+03, 1.838e+03,\n"
        "         1.839e+03],\n"
        "        [1.840e+03, 1.841e+03, 1.842e+03, ..., 1.857e+03, 1.858e+03,\n"
        "         1.859e+03],\n"
        "        ...,\n"
        "        [1.940e+03, 1.941e+03, 1.942e+03, ..., 1.957e+03, 1.958e+03,\n"
        "         1.959e+03],\n"
        "        [1.960e+03, 1.961e+03, 1.962e+03, ..., 1.977e+03, 1.978e+03,\n"
        "         1.979e+03],\n"
        "        [1.980e+03, 1.981e+03, 1.982e+03, ..., 1.997e+03, 1.998e+03,\n"
        "         1.999e+03]]], dtype=float32)";
    assert_repr(iota(m, NDM_F32, NDM_SHAPE(10, 10, 20)), want);
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_wraps_at_75_columns(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(30)),
                "array([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16,\n"
                "       17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
    assert_repr(iota(m, NDM_F64, NDM_SHAPE(30)),
                "array([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12.,\n"
                "       13., 14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25.,\n"
                "       26., 27., 28., 29.])");
    assert_repr(iota(m, NDM_F64, NDM_SHAPE(2, 20)),
                "array([[ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12.,\n"
                "        13., 14., 15., 16., 17., 18., 19.],\n"
                "       [20., 21., 22., 23., 24., 25., 26., 27., 28., 29., 30., 31., 32.,\n"
                "        33., 34., 35., 36., 37., 38., 39.]])");
    assert_ok(ndm_scope_release_all(m));
}

/* numpy's limits at the right edge: a line may reach column 75 with its
 * closing brackets, but the last element of a line keeps room for a "]" and
 * the ")" (or "," before a dtype), and each nesting level takes one more. */
static void test_print_wraps_last_element(void **state)
{
    ndm_manager m = ROOT(state);
    /* Exactly 75 columns: fits. */
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(17)),
                "array([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16])");
    double v[14];
    for (int i = 0; i < 14; i++)
        v[i] = 10 + i;
    ndm_array a = ndm_from_buffer(m, NDM_F64, v, NDM_SHAPE(14));
    assert_repr(a, "array([10., 11., 12., 13., 14., 15., 16., 17., 18., 19., 20., 21., 22.,\n"
                   "       23.])");
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2, 16)),
                "array([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15],\n"
                "       [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]])");
    assert_repr(iota(m, NDM_I64, NDM_SHAPE(2, 17)),
                "array([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15,\n"
                "        16],\n"
                "       [17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,\n"
                "        33]])");
    assert_ok(ndm_scope_release_all(m));
}

/* When ", dtype=..." does not fit after the last line, numpy puts it on its
 * own line under the first bracket. */
static void test_print_dtype_on_new_line(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(iota(m, NDM_F32, NDM_SHAPE(25)),
                "array([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12.,\n"
                "       13., 14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24.],\n"
                "      dtype=float32)");
    assert_ok(ndm_scope_release_all(m));
}

static void test_print_f16(void **state)
{
    ndm_manager m = ROOT(state);
    assert_repr(ARR(m, NDM_F16, 0.1, 1, 65504),
                "array([1.00e-01, 1.00e+00, 6.55e+04], dtype=float16)");
    assert_repr(ARR(m, NDM_F16, 0.5, 0.25, 1), "array([0.5 , 0.25, 1.  ], dtype=float16)");
    assert_ok(ndm_scope_release_all(m));
}

static void test_format_truncates_and_returns_length(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ARR(m, NDM_F64, 1, 2);
    const char *full = "array([1., 2.])";
    char buf[8];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(ndm_array_format(a, buf, sizeof buf), (int)strlen(full));
    assert_string_equal(buf, "array([");
    assert_int_equal(ndm_array_format(a, buf, 1), (int)strlen(full));
    assert_string_equal(buf, "");
    assert_int_equal(ndm_array_format(a, NULL, 0), (int)strlen(full));
    assert_st(ndm_array_print(a, NULL), NDM_E_INVALID);
    release_ok(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_empty_every_dtype),
        TEST(test_zeros_every_dtype),
        TEST(test_ones_every_dtype),
        TEST(test_full_every_dtype),
        TEST(test_full_f16_bf16_bits),
        TEST(test_scalar_every_dtype),
        TEST(test_arange_every_dtype),
        TEST(test_arange_numpy_length),
        TEST(test_arange_negative_step),
        TEST(test_arange_invalid_arguments),
        TEST(test_linspace_every_dtype),
        TEST(test_linspace_num_zero_and_one),
        TEST(test_linspace_exact_endpoint),
        TEST(test_linspace_invalid_arguments),
        TEST(test_from_buffer_every_dtype),
        TEST(test_from_buffer_values),
        TEST(test_from_buffer_null_source),
        TEST(test_wrap_buffer_every_dtype),
        TEST(test_wrap_buffer_free_after_last_view),
        TEST(test_wrap_buffer_freed_by_close),
        TEST(test_wrap_buffer_failure_keeps_buffer),
        TEST(test_wrap_buffer_counts_bytes),
        TEST(test_f16_round_to_nearest_even),
        TEST(test_f16_subnormals),
        TEST(test_f16_inf_nan_overflow),
        TEST(test_f16_every_value_round_trips),
        TEST(test_bf16_rounding),
        TEST(test_bf16_f32_extremes),
        TEST(test_bf16_nan_stays_nan),
        TEST(test_cast_double_to_f16_rounds_once),
        TEST(test_cast_float_to_int_saturates),
        TEST(test_cast_nan_to_int_is_zero),
        TEST(test_cast_to_bool),
        TEST(test_shape_zero_d),
        TEST(test_shape_size_zero_axis),
        TEST(test_shape_rank_7),
        TEST(test_shape_rank_10),
        TEST(test_shape_negative_dim),
        TEST(test_shape_element_overflow),
        TEST(test_shape_byte_overflow),
        TEST(test_dtype_invalid),
        TEST(test_factory_null_manager_without_scope),
        TEST(test_factory_current_scope_uses_scope),
        TEST(test_factory_current_scope_without_scope),
        TEST(test_factory_null_manager_inside_scope),
        TEST(test_factory_stale_manager),
        TEST(test_factory_failure_allocates_nothing),
        TEST(test_accessors_valid_handle),
        TEST(test_accessors_null_handle),
        TEST(test_accessors_stale_handle),
        TEST(test_accessors_foreign_handle),
        TEST(test_accessors_bad_arguments),
        TEST(test_release_ok_then_already),
        TEST(test_release_null_and_foreign),
        TEST(test_release_after_close_is_already),
        TEST(test_release_stale_spares_slot_reuser),
        TEST(test_stale_message_names_release_site),
        TEST(test_stale_message_names_closing_manager),
        TEST(test_stale_message_parent_close),
        TEST(test_stale_message_says_reused),
        TEST(test_stale_message_long_shape),
        TEST(test_stale_message_after_manager_reuse),
        TEST(test_copy_out_contiguous),
        TEST(test_copy_out_strided),
        TEST(test_copy_in_contiguous),
        TEST(test_copy_in_strided),
        TEST(test_copy_wrong_size),
        TEST(test_item_any_rank),
        TEST(test_item_every_dtype),
        TEST(test_item_wrong_count),
        TEST(test_item_i64_truncates_and_saturates),
        TEST(test_print_ints),
        TEST(test_print_float_decimals),
        TEST(test_print_whole_floats),
        TEST(test_print_scientific),
        TEST(test_print_scientific_wide_exponent),
        TEST(test_print_scientific_rounded_digits),
        TEST(test_print_nan_inf),
        TEST(test_print_bool),
        TEST(test_print_bool_all_true),
        TEST(test_print_zero_d),
        TEST(test_print_empty),
        TEST(test_print_nested_2d),
        TEST(test_print_nested_3d_blank_lines),
        TEST(test_print_summarised),
        TEST(test_print_summarised_3d),
        TEST(test_print_wraps_at_75_columns),
        TEST(test_print_wraps_last_element),
        TEST(test_print_dtype_on_new_line),
        TEST(test_print_f16),
        TEST(test_format_truncates_and_returns_length),
    };
    return cmocka_run_group_tests_name("array", tests, NULL, NULL);
}
