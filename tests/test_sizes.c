/* Size arithmetic at its edges: shapes with a zero size next to huge ones,
 * through creation and the operations that compute sizes, strides and
 * offsets. Each result is either right or NDM_E_OVERFLOW (run it under
 * UBSan: an overflow on the way is a failure too). */
#include <inttypes.h>
#include <stdlib.h>

#include "helpers.h"

/* What a result of some shape and dtype should be, from 128-bit arithmetic. */
typedef enum { FITS, TOO_BIG, OVERFLOWS } verdict;

/* Results with elements are allocated and checked up to this size. */
#define CHECKED_BYTES ((unsigned __int128)1 << 20)

static verdict judge(int nd, const int64_t *shape, ndm_dtype dt, bool allocates)
{
    unsigned __int128 extent = 1;
    bool empty = false;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0)
            return OVERFLOWS;
        if (shape[i] == 0) {
            empty = true;
            continue;
        }
        extent *= (uint64_t)shape[i];
        if (extent > INT64_MAX)
            return OVERFLOWS;
    }
    unsigned __int128 bytes = extent * ndm_dtype_size(dt);
    if (bytes > INT64_MAX)
        return OVERFLOWS;
    return allocates && !empty && bytes > CHECKED_BYTES ? TOO_BIG : FITS;
}

static const char *shape_str(int nd, const int64_t *s, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? "," : "", s[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* One case: the input's description and the manager its results go to. */
typedef struct sweep {
    char in[128];
    ndm_dtype dt;
    int calls, fits, refused;
} sweep;

/* Check result r of `op` against the expected shape: a valid array of that
 * shape, C-contiguous when `allocates`, whose elements (if any) equal
 * `value`; or NDM_E_OVERFLOW with a message when the shape overflows. */
static void check(sweep *sw, const char *op, ndm_array r, verdict v, int nd, const int64_t *want,
                  ndm_dtype dt, bool allocates, double value)
{
    char ws[128];
    sw->calls++;
    if (v == OVERFLOWS) {
        if (r.id || ndm_last_status() != NDM_E_OVERFLOW || !ndm_last_error()[0])
            fail_msg("%s of %s %s: want NDM_E_OVERFLOW for %s, got %s (%s)", op,
                     ndm_dtype_short(sw->dt), sw->in, shape_str(nd, want, ws, sizeof ws),
                     r.id ? "an array" : ndm_status_name(ndm_last_status()), ndm_last_error());
        sw->refused++;
        return;
    }
    if (!r.id)
        fail_msg("%s of %s %s: want %s, got %s: %s", op, ndm_dtype_short(sw->dt), sw->in,
                 shape_str(nd, want, ws, sizeof ws), ndm_status_name(ndm_last_status()),
                 ndm_last_error());
    sw->fits++;
    int64_t got[8], st[8];
    char gs[128];
    assert_int_equal(ndm_array_ndim(r), nd);
    assert_int_equal(ndm_array_shape(r, got, 8), nd);
    if (memcmp(got, want, (size_t)nd * sizeof *got))
        fail_msg("%s of %s %s: shape %s, want %s", op, ndm_dtype_short(sw->dt), sw->in,
                 shape_str(nd, got, gs, sizeof gs), shape_str(nd, want, ws, sizeof ws));
    assert_int_equal(ndm_array_dtype(r), dt);
    int64_t numel = 1;
    for (int i = 0; i < nd; i++)
        numel *= want[i];
    assert_int_equal(ndm_array_nbytes(r), (size_t)numel * ndm_dtype_size(dt));
    if (allocates) {
        /* Fresh storage is C-contiguous; a size-0 axis counts as 1. */
        assert_int_equal(ndm_array_strides(r, st, 8), nd);
        int64_t s = 1;
        for (int i = nd - 1; i >= 0; i--) {
            if (st[i] != s)
                fail_msg("%s of %s %s: stride %d is %" PRId64 ", want %" PRId64, op,
                         ndm_dtype_short(sw->dt), sw->in, i, st[i], s);
            s *= want[i] ? want[i] : 1;
        }
    }
    if (numel) {
        ndm_array f = ndm_astype(r, NDM_F64);
        assert_live(f);
        double *vals = malloc((size_t)numel * sizeof *vals);
        assert_non_null(vals);
        assert_ok(ndm_array_copy_out(f, vals, (size_t)numel * sizeof *vals));
        for (int64_t i = 0; i < numel; i++)
            if (vals[i] != value)
                fail_msg("%s of %s %s: element %" PRId64 " is %g, want %g", op,
                         ndm_dtype_short(sw->dt), sw->in, i, vals[i], value);
        free(vals);
        assert_ok(ndm_array_release(f));
    }
    assert_ok(ndm_array_release(r));
}

/* Run `call` when its result is small enough to make, then check it. */
#define OP(sw, name, call, nd, want, dt, allocates, value)                      \
    do {                                                                        \
        verdict v_ = judge((nd), (want), (dt), (allocates));                    \
        if (v_ != TOO_BIG) {                                                    \
            ndm_clear_error();                                                  \
            check((sw), (name), (call), v_, (nd), (want), (dt), (allocates), (value)); \
        }                                                                       \
    } while (0)

/* Python's len(range(n)[start:stop:step]), in 128 bits. */
static int64_t slice_len(int64_t n, int64_t start, int64_t stop, int64_t step)
{
    __int128 lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1, a, b;
    if (start == NDM_END)
        a = step > 0 ? lo : hi;
    else
        a = start < 0 ? ((__int128)start + n < lo ? lo : (__int128)start + n)
                      : (start > hi ? hi : start);
    if (stop == NDM_END)
        b = step > 0 ? hi : lo;
    else
        b = stop < 0 ? ((__int128)stop + n < lo ? lo : (__int128)stop + n)
                     : (stop > hi ? hi : stop);
    if (step > 0)
        return b > a ? (int64_t)((b - a + step - 1) / step) : 0;
    return a > b ? (int64_t)((a - b - step - 1) / -step) : 0;
}

static ndm_dtype sum_dtype(ndm_dtype dt)
{
    return ndm_dtype_is_float(dt) ? dt : NDM_I64;
}

/* Views: no storage of their own, so they always fit. */
static void sweep_views(sweep *sw, ndm_array a, const int64_t *s)
{
    ndm_dtype dt = sw->dt;
    int64_t w[4];
    static const int64_t slices[][3] = {
        {0, NDM_END, 1},        {1, NDM_END, 2},         {NDM_END, NDM_END, -1},
        {0, NDM_END, INT64_MAX}, {NDM_END, NDM_END, -INT64_MAX}, {-1, NDM_END, 1},
        {INT64_MIN, INT64_MAX - 1, 3}, {INT64_MAX - 1, INT64_MIN, -2}, {2, 1, 1},
    };
    for (int ax = 0; ax < 3; ax++) {
        for (size_t k = 0; k < sizeof slices / sizeof *slices; k++) {
            memcpy(w, s, 3 * sizeof *w);
            w[ax] = slice_len(s[ax], slices[k][0], slices[k][1], slices[k][2]);
            ndm_array v = ndm_slice(a, ax, slices[k][0], slices[k][1], slices[k][2]);
            ndm_array c = v.id ? ndm_copy(v) : NDM_NULL_ARRAY;
            OP(sw, "slice", v, 3, w, dt, false, 0);
            OP(sw, "copy of a slice", c, 3, w, dt, true, 0);
        }
        OP(sw, "flip", ndm_flip(a, ax), 3, s, dt, false, 0);
        if (s[ax] > 0) {
            for (int j = 0, k = 0; j < 3; j++)
                if (j != ax)
                    w[k++] = s[j];
            OP(sw, "select first", ndm_select(a, ax, 0), 2, w, dt, false, 0);
            OP(sw, "select last", ndm_select(a, ax, -1), 2, w, dt, false, 0);
        }
    }
    ndm_array fl = ndm_flip(a, NDM_ALL_AXES);
    OP(sw, "flip all", ndm_alias(fl), 3, s, dt, false, 0);
    OP(sw, "copy of a flip", ndm_copy(fl), 3, s, dt, true, 0);
    assert_ok(ndm_array_release(fl));
    int64_t rot[3] = {s[1], s[2], s[0]};
    static const int order[3] = {1, 2, 0};
    OP(sw, "permute", ndm_permute(a, 3, order), 3, rot, dt, false, 0);
    OP(sw, "reshape to rotated", ndm_reshape(a, 3, rot), 3, rot, dt, false, 0);
    OP(sw, "reshape to -1", ndm_reshape(a, NDM_SHAPE(-1)), 1, (int64_t[]){0}, dt, false, 0);
    for (int at = 0; at <= 3; at++) {
        for (int j = 0, k = 0; j < 4; j++)
            w[j] = j == at ? 1 : s[k++];
        OP(sw, "unsqueeze", ndm_unsqueeze(a, at), 4, w, dt, false, 0);
    }
}

static const int64_t huge[] = {3,
                               INT64_C(1) << 20,
                               INT64_C(1) << 31,
                               INT64_C(1) << 40,
                               INT64_C(1) << 61,
                               INT64_C(1) << 62,
                               INT64_MAX / 2 + 1,
                               INT64_MAX};
#define NHUGE (sizeof huge / sizeof *huge)

/* Shapes built from the input that may overflow where the input did not. */
static void sweep_growth(sweep *sw, ndm_array a, const int64_t *s)
{
    ndm_dtype dt = sw->dt;
    int64_t w[4];
    for (size_t h = 0; h < NHUGE; h++) {
        int64_t H = huge[h];
        int64_t t[3] = {0, H, H}, u[3] = {H, 0, 2}, x[3] = {H, 1, 0};
        OP(sw, "reshape", ndm_reshape(a, 3, t), 3, t, dt, false, 0);
        OP(sw, "reshape", ndm_reshape(a, 3, u), 3, u, dt, false, 0);
        OP(sw, "reshape", ndm_reshape(a, 3, x), 3, x, dt, false, 0);
        w[0] = H;
        memcpy(w + 1, s, 3 * sizeof *w);
        OP(sw, "expand", ndm_expand(a, 4, w), 4, w, dt, false, 0);
        for (int ax = 0; ax < 3; ax++) {
            memcpy(w, s, 3 * sizeof *w);
            int64_t reps[3] = {1, 1, 1};
            reps[ax] = H;
            bool wraps = __builtin_mul_overflow(s[ax], H, &w[ax]);
            if (!wraps)
                OP(sw, "tile", ndm_tile(a, 3, reps), 3, w, dt, true, 0);
            else {
                ndm_clear_error();
                check(sw, "tile", ndm_tile(a, 3, reps), OVERFLOWS, 3, s, dt, true, 0);
            }
            /* A constant pad of an empty axis makes elements. */
            int64_t widths[6] = {0};
            widths[2 * ax] = widths[2 * ax + 1] = H / 2;
            memcpy(w, s, 3 * sizeof *w);
            if (__builtin_add_overflow(s[ax], 2 * (H / 2), &w[ax])) {
                ndm_clear_error();
                check(sw, "pad", ndm_pad(a, NDM_PAD_CONSTANT, 1.5, 6, widths), OVERFLOWS, 3, s, dt,
                      true, 0);
            } else {
                OP(sw, "pad", ndm_pad(a, NDM_PAD_CONSTANT, 1.5, 6, widths), 3, w, dt, true,
                   dt == NDM_U8 ? 1 : 1.5);
            }
        }
    }
    for (int ax = 0; ax < 3; ax++) {
        memcpy(w, s, 3 * sizeof *w);
        if (__builtin_mul_overflow(s[ax], 2, &w[ax])) {
            ndm_clear_error();
            check(sw, "concat", ndm_concat(ax, NDM_ARRAYS(a, a)), OVERFLOWS, 3, s, dt, true, 0);
        } else {
            OP(sw, "concat", ndm_concat(ax, NDM_ARRAYS(a, a)), 3, w, dt, true, 0);
        }
    }
}

/* Operations that write a fresh array of the input's shape, or a reduced one. */
static void sweep_compute(sweep *sw, ndm_array a, const int64_t *s)
{
    ndm_dtype dt = sw->dt;
    OP(sw, "copy", ndm_copy(a), 3, s, dt, true, 0);
    OP(sw, "add", ndm_add(a, a), 3, s, dt, true, 0);
    ndm_array one = ndm_zeros(ndm_array_manager(a), dt, NDM_SHAPE(1, 1, 1));
    assert_live(one);
    OP(sw, "add broadcast", ndm_add(a, one), 3, s, dt, true, 0);
    OP(sw, "add broadcast", ndm_add(one, a), 3, s, dt, true, 0);
    OP(sw, "tril", ndm_tril(a, 0), 3, s, dt, true, 0);
    assert_ok(ndm_array_release(one));
    ndm_dtype soft = ndm_dtype_is_float(dt) ? dt : NDM_F32;
    int64_t w[3];
    for (int ax = 0; ax < 3; ax++) {
        OP(sw, "cumsum", ndm_cumsum(a, ax), 3, s, sum_dtype(dt), true, 0);
        OP(sw, "cumprod", ndm_cumprod(a, ax), 3, s, sum_dtype(dt), true, 0);
        OP(sw, "sort", ndm_sort(a, ax, false), 3, s, dt, true, 0);
        OP(sw, "argsort", ndm_argsort(a, ax, true), 3, s, NDM_I64, true, 0);
        OP(sw, "softmax", ndm_softmax(a, ax), 3, s, soft, true, 0);
        for (int j = 0, k = 0; j < 3; j++)
            if (j != ax)
                w[k++] = s[j];
        OP(sw, "sum", ndm_sum(a, false, NDM_AXES(ax)), 2, w, sum_dtype(dt), true, 0);
    }
}

static void sweep_shape(ndm_manager root, ndm_dtype dt, const int64_t *s, sweep *total)
{
    sweep sw = {.dt = dt};
    shape_str(3, s, sw.in, sizeof sw.in);
    ndm_manager m = ndm_manager_new(root, "case");
    assert_live(m);
    verdict v = judge(3, s, dt, false);
    ndm_clear_error();
    ndm_array e = ndm_empty(m, dt, 3, s);
    ndm_array o = ndm_ones(m, dt, 3, s);
    ndm_array f = ndm_full(m, dt, 2.0, 3, s);
    ndm_array a = ndm_zeros(m, dt, 3, s);
    if (v == OVERFLOWS) {
        check(&sw, "zeros", a, v, 3, s, dt, true, 0);
        assert_false(e.id || o.id || f.id);
    } else {
        assert_true(e.id && o.id && f.id);
        assert_ok(ndm_array_release(e));
        assert_ok(ndm_array_release(o));
        assert_ok(ndm_array_release(f));
        check(&sw, "zeros", ndm_alias(a), v, 3, s, dt, true, 0);
        sweep_views(&sw, a, s);
        sweep_compute(&sw, a, s);
        sweep_growth(&sw, a, s);
        assert_ok(ndm_array_release(a));
    }
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    total->calls += sw.calls;
    total->fits += sw.fits;
    total->refused += sw.refused;
}

static void test_sizes_zero_beside_huge_fit_or_overflow(void **state)
{
    ndm_manager root = ROOT(state);
    const ndm_dtype dts[] = {NDM_U8, NDM_F32, NDM_F64};
    sweep total = {0};
    for (size_t d = 0; d < 3; d++)
        for (int zero = 0; zero < 3; zero++)
            for (size_t i = 0; i < NHUGE; i++)
                for (size_t j = 0; j < NHUGE; j++) {
                    int64_t s[3];
                    for (int k = 0, n = 0; k < 3; k++)
                        s[k] = k == zero ? 0 : n++ ? huge[j] : huge[i];
                    sweep_shape(root, dts[d], s, &total);
                }
    print_message("%d results checked: %d right, %d refused with NDM_E_OVERFLOW\n", total.calls,
                  total.fits, total.refused);
    assert_true(total.fits > 0 && total.refused > 0);
    assert_manager_empty(root);
}

/* The shape the report named, in both orders: refused alike. */
static void test_sizes_overflowing_empty_shape_is_refused_in_any_order(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t orders[3][3] = {
        {0, INT64_MAX, INT64_MAX}, {INT64_MAX, 0, INT64_MAX}, {INT64_MAX, INT64_MAX, 0}};
    for (int i = 0; i < 3; i++) {
        ndm_clear_error();
        assert_false(ndm_zeros(m, NDM_F32, 3, orders[i]).id);
        assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
        assert_error_has("the strides of an empty array overflow at axis");
        assert_false(ndm_empty(m, NDM_F32, 3, orders[i]).id);
        assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    }
    /* A reshape of an empty array into such a shape is refused too. */
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(0));
    assert_live(a);
    for (int i = 0; i < 3; i++) {
        ndm_clear_error();
        assert_false(ndm_reshape(a, 3, orders[i]).id);
        assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    }
    assert_ok(ndm_array_release(a));
    assert_manager_empty(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_sizes_zero_beside_huge_fit_or_overflow),
        TEST(test_sizes_overflowing_empty_shape_is_refused_in_any_order),
    };
    return cmocka_run_group_tests_name("sizes", tests, NULL, NULL);
}
