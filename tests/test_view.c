/* Views: alias, reshape, transpose/permute/swapaxes, slice, select,
 * squeeze/unsqueeze, expand, contiguous and copy. Each is checked for its
 * values, for sharing storage (or not), for outliving its base, and for the
 * output rule. */
#include <pthread.h>
#include <stdlib.h>

#include "array_check.h"

/* 0, 1, 2, ... in f64 with the given shape (one handle, its own storage). */
static ndm_array iota_in(ndm_manager m, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)i;
    ndm_array a = ndm_from_buffer(m, NDM_F64, v, ndim, shape);
    free(v);
    assert_live(a);
    return a;
}
#define IOTA(m, ...) iota_in((m), NDM_SHAPE(__VA_ARGS__))

/* The view must survive the release of its base with its values intact;
 * the storage stays charged while the view lives (the bytes held now, with
 * no other storage alive in m) and is freed with the last view. Releases
 * both. */
#define assert_outlives(m, base, view, want, n)                                 \
    check_outlives_at((m), (base), (view), (want), (n), __FILE__, __LINE__)
static void check_outlives_at(ndm_manager m, ndm_array base, ndm_array view, const double *want,
                              int64_t n, const char *file, int line)
{
    uint64_t storage = check_live_bytes(m, NDM_STATS_SUBTREE);
    if (!ndm_array_shares_storage(base, view)) {
        print_error("the view does not share its base's storage\n");
        _fail(file, line);
    }
    check_values_at(view, want, n, file, line);
    release_ok(base);
    if (!ndm_array_valid(view))
        _fail(file, line);
    check_values_at(view, want, n, file, line);
    if (check_live_bytes(m, NDM_STATS_SUBTREE) != storage) {
        print_error("%llu bytes charged after the base went, expected %llu\n",
                    (unsigned long long)check_live_bytes(m, NDM_STATS_SUBTREE),
                    (unsigned long long)storage);
        _fail(file, line);
    }
    release_ok(view);
    if (check_live_bytes(m, NDM_STATS_SUBTREE) != 0) {
        print_error("%llu bytes left after the last view\n",
                    (unsigned long long)check_live_bytes(m, NDM_STATS_SUBTREE));
        _fail(file, line);
    }
}

/* ---- alias --------------------------------------------------------------------- */

static void test_alias_fresh_handle_same_view(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    ndm_array s = ndm_slice(g, 1, 1, 4, 2);
    ndm_array a = ndm_alias(s);
    assert_live(a);
    assert_int_not_equal(a.id, s.id);
    assert_shape(a, 3, 2);
    assert_strides(a, 4, 2);
    assert_int_equal(ndm_array_offset(a), 1);
    assert_true(ndm_array_shares_storage(a, g));
    assert_int_equal(test_live_arrays(m), 3);
    assert_int_equal(check_live_bytes(m, 0), 96); /* one storage, three views */
    release_ok(g);
    assert_outlives(m, s, a, ((double[]){1, 3, 5, 7, 9, 11}), 6);
}

static void test_alias_released_first(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 4);
    ndm_array a = ndm_alias(g);
    release_ok(a);
    assert_true(ndm_array_valid(g));
    assert_values(g, ((double[]){0, 1, 2, 3}), 4);
    assert_st(ndm_array_release(a), NDM_ALREADY);
    release_ok(g);
    assert_int_equal(check_live_bytes(m, 0), 0);
}

/* ---- reshape -------------------------------------------------------------------- */

static void test_reshape_view_when_strides_allow(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array r = ndm_reshape(g, NDM_SHAPE(3, 2));
    assert_shape(r, 3, 2);
    assert_strides(r, 2, 1);
    ndm_array flat = ndm_reshape(g, NDM_SHAPE(6));
    assert_strides(flat, 1);
    assert_true(ndm_array_shares_storage(flat, g));
    release_ok(flat);
    assert_outlives(m, g, r, ((double[]){0, 1, 2, 3, 4, 5}), 6);
}

static void test_reshape_infers_minus_one(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 4, 3);
    ndm_array a = ndm_reshape(g, NDM_SHAPE(-1));
    assert_shape(a, 12);
    ndm_array b = ndm_reshape(g, NDM_SHAPE(2, -1));
    assert_shape(b, 2, 6);
    ndm_array c = ndm_reshape(g, NDM_SHAPE(-1, 3, 1));
    assert_shape(c, 4, 3, 1);
    assert_true(ndm_array_shares_storage(a, g) && ndm_array_shares_storage(b, g) &&
                ndm_array_shares_storage(c, g));
    release_ok(a);
    release_ok(c);
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = i;
    assert_outlives(m, g, b, want, 12);
}

static void test_reshape_size_one_axes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 1, 6, 1);
    ndm_array a = ndm_reshape(g, NDM_SHAPE(6));
    assert_shape(a, 6);
    assert_strides(a, 1);
    ndm_array b = ndm_reshape(a, NDM_SHAPE(1, 2, 1, 3, 1));
    assert_shape(b, 1, 2, 1, 3, 1);
    assert_true(ndm_array_is_contiguous(b));
    ndm_array one = IOTA(m, 1, 1);
    ndm_array zero_d = ndm_reshape(one, 0, NULL);
    assert_shape0(zero_d);
    ndm_array back = ndm_reshape(zero_d, NDM_SHAPE(1, 1, 1));
    assert_shape(back, 1, 1, 1);
    assert_true(ndm_array_shares_storage(back, one));
    release_ok(one);
    release_ok(zero_d);
    release_ok(back);
    release_ok(a);
    assert_outlives(m, g, b, ((double[]){0, 1, 2, 3, 4, 5}), 6);
}

static void test_reshape_strided_view_stays_view(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 4, 6);
    ndm_array s = ndm_slice(g, 1, 0, NDM_END, 2); /* (4, 3), strides (6, 2) */
    assert_strides(s, 6, 2);
    ndm_array r = ndm_reshape(s, NDM_SHAPE(2, 2, 3));
    assert_strides(r, 12, 6, 2);
    /* Evenly spaced elements flatten without a copy, as in numpy. */
    ndm_array flat = ndm_reshape(s, NDM_SHAPE(12));
    assert_strides(flat, 2);
    assert_true(ndm_array_shares_storage(flat, g));
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = 2 * i;
    assert_values(flat, want, 12);
    release_ok(flat);
    release_ok(s);
    assert_outlives(m, g, r, want, 12);
}

static void test_reshape_copies_when_strides_forbid(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array t = ndm_transpose(g);
    ndm_array r = ndm_reshape(t, NDM_SHAPE(6));
    assert_live(r);
    assert_false(ndm_array_shares_storage(r, g));
    assert_true(ndm_array_is_contiguous(r));
    const double want[6] = {0, 3, 1, 4, 2, 5};
    assert_values(r, want, 6);
    ndm_array cols = ndm_slice(IOTA(m, 4, 6), 1, 0, 2, 1); /* (4, 2) strides (6, 1) */
    ndm_array c = ndm_reshape(cols, NDM_SHAPE(8));
    assert_false(ndm_array_shares_storage(c, cols));
    assert_values(c, ((double[]){0, 1, 6, 7, 12, 13, 18, 19}), 8);
    /* The copy is independent of its source. */
    release_ok(g);
    release_ok(t);
    assert_values(r, want, 6);
    assert_int_equal(ndm_array_manager(r).id, m.id);
    assert_ok(ndm_scope_release_all(m));
    assert_int_equal(check_live_bytes(m, 0), 0);
}

static void test_reshape_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array empty = IOTA(m, 0, 3);
    assert_fails(ndm_reshape(g, NDM_SHAPE(-1, -1)), NDM_E_SHAPE);
    assert_error_has("more than one -1");
    assert_fails(ndm_reshape(g, NDM_SHAPE(4, 2)), NDM_E_SHAPE);
    assert_error_has("cannot reshape f64[2,3] (6 elements) into 8 elements");
    assert_fails(ndm_reshape(g, NDM_SHAPE(-2, -3)), NDM_E_SHAPE);
    assert_error_has("negative size -2");
    assert_fails(ndm_reshape(g, NDM_SHAPE(4, -1)), NDM_E_SHAPE);
    assert_fails(ndm_reshape(empty, NDM_SHAPE(0, -1)), NDM_E_SHAPE);
    assert_fails(ndm_reshape(g, -1, NULL), NDM_E_SHAPE);
    assert_fails(ndm_reshape(g, 0, NULL), NDM_E_SHAPE);
    assert_int_equal(test_live_arrays(m), 2);
    ndm_array e2 = ndm_reshape(empty, NDM_SHAPE(3, 0, 7));
    assert_shape(e2, 3, 0, 7);
    release_ok(e2);
    release_ok(g);
    release_ok(empty);
}

/* ---- transpose, permute, swapaxes -------------------------------------------------- */

static void test_transpose_reverses_axes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3, 4);
    ndm_array t = ndm_transpose(g);
    assert_shape(t, 4, 3, 2);
    assert_strides(t, 1, 4, 12);
    assert_false(ndm_array_is_contiguous(t));
    double want[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++)
                want[(i * 3 + j) * 2 + k] = k * 12 + j * 4 + i;
    assert_outlives(m, g, t, want, 24);
}

static void test_transpose_low_ranks(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array v = IOTA(m, 3);
    ndm_array t = ndm_transpose(v);
    assert_shape(t, 3);
    ndm_array s = ndm_scalar(m, NDM_F32, 2);
    ndm_array ts = ndm_transpose(s);
    assert_shape0(ts);
    assert_true(ndm_array_shares_storage(s, ts));
    release_ok(s);
    release_ok(ts);
    assert_outlives(m, v, t, ((double[]){0, 1, 2}), 3);
}

static void test_permute_order(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3, 4);
    ndm_array p = ndm_permute(g, 3, ((const int[]){2, 0, 1}));
    assert_shape(p, 4, 2, 3);
    assert_strides(p, 1, 12, 4);
    ndm_array q = ndm_permute(g, 3, ((const int[]){-1, 0, -2}));
    assert_shape(q, 4, 2, 3);
    assert_strides(q, 1, 12, 4);
    double want[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 2 + j) * 3 + k] = j * 12 + k * 4 + i;
    assert_values(q, want, 24);
    ndm_array same = ndm_permute(g, 3, ((const int[]){0, 1, 2}));
    assert_true(ndm_array_is_contiguous(same));
    release_ok(same);
    release_ok(q);
    assert_outlives(m, g, p, want, 24);
}

static void test_permute_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3, 4);
    assert_fails(ndm_permute(g, 3, ((const int[]){0, 2, 0})), NDM_E_AXIS);
    assert_error_has("repeated");
    assert_fails(ndm_permute(g, 3, ((const int[]){0, -3, 1})), NDM_E_AXIS);
    assert_fails(ndm_permute(g, 2, ((const int[]){1, 0})), NDM_E_AXIS);
    assert_error_has("2 axes given for an array of rank 3");
    assert_fails(ndm_permute(g, 4, ((const int[]){0, 1, 2, 3})), NDM_E_AXIS);
    assert_fails(ndm_permute(g, 3, ((const int[]){0, 1, 3})), NDM_E_AXIS);
    assert_fails(ndm_permute(g, 3, NULL), NDM_E_AXIS);
    assert_int_equal(test_live_arrays(m), 1);
    release_ok(g);
}

static void test_swapaxes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3, 4);
    ndm_array s = ndm_swapaxes(g, 0, 2);
    assert_shape(s, 4, 3, 2);
    assert_strides(s, 1, 4, 12);
    ndm_array n = ndm_swapaxes(g, -1, 1);
    assert_shape(n, 2, 4, 3);
    assert_strides(n, 12, 1, 4);
    ndm_array same = ndm_swapaxes(g, 1, -2);
    assert_shape(same, 2, 3, 4);
    assert_true(ndm_array_shares_storage(same, g));
    assert_fails(ndm_swapaxes(g, 0, 3), NDM_E_AXIS);
    assert_fails(ndm_swapaxes(g, -4, 0), NDM_E_AXIS);
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 4 + j) * 3 + k] = i * 12 + k * 4 + j;
    release_ok(s);
    release_ok(same);
    assert_outlives(m, g, n, want, 24);
}

/* ---- slice ------------------------------------------------------------------------- */

typedef struct slice_case {
    int64_t start, stop, step;
    int64_t len;
    double want[10];
} slice_case;

/* Each case against Python's a[start:stop:step] on a = list(range(10)). */
static void check_slices(ndm_manager m, const slice_case *cases, size_t n)
{
    ndm_array a = IOTA(m, 10);
    for (size_t c = 0; c < n; c++) {
        ndm_array s = ndm_slice(a, 0, cases[c].start, cases[c].stop, cases[c].step);
        if (!s.id)
            fail_msg("case %zu failed: %s", c, ndm_last_error());
        assert_shape(s, cases[c].len);
        assert_true(ndm_array_shares_storage(s, a));
        assert_values(s, cases[c].want, cases[c].len);
        release_ok(s);
    }
    release_ok(a);
}

#define CASES(...) ((const slice_case[]){__VA_ARGS__})
#define NCASES(...) (sizeof(CASES(__VA_ARGS__)) / sizeof(slice_case))
#define SLICES(m, ...) check_slices((m), CASES(__VA_ARGS__), NCASES(__VA_ARGS__))

static void test_slice_basic(void **state)
{
    SLICES(ROOT(state), {2, 8, 1, 6, {2, 3, 4, 5, 6, 7}}, {0, NDM_END, 3, 4, {0, 3, 6, 9}},
           {3, 4, 1, 1, {3}}, {9, 100, 5, 1, {9}});
}

static void test_slice_negative_indices(void **state)
{
    SLICES(ROOT(state), {-3, NDM_END, 1, 3, {7, 8, 9}},
           {NDM_END, -3, 1, 7, {0, 1, 2, 3, 4, 5, 6}},
           {1, -1, 1, 8, {1, 2, 3, 4, 5, 6, 7, 8}});
}

static void test_slice_clamps(void **state)
{
    SLICES(ROOT(state), {-100, 3, 1, 3, {0, 1, 2}}, {-100, 100, 4, 3, {0, 4, 8}},
           {-11, NDM_END, 2, 5, {0, 2, 4, 6, 8}}, {100, -100, -3, 4, {9, 6, 3, 0}},
           {INT64_MIN + 1, INT64_MAX - 1, 1, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}});
}

static void test_slice_negative_step(void **state)
{
    SLICES(ROOT(state), {NDM_END, NDM_END, -1, 10, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}},
           {8, 2, -2, 3, {8, 6, 4}}, {-1, -11, -1, 10, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}},
           {NDM_END, 3, -1, 6, {9, 8, 7, 6, 5, 4}},
           {-2, NDM_END, -1, 9, {8, 7, 6, 5, 4, 3, 2, 1, 0}},
           {NDM_END, -100, -1, 10, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}}, {4, -7, -1, 1, {4}},
           {NDM_END, NDM_END, -10, 1, {9}});
    ndm_manager m = ROOT(state);
    ndm_array a = IOTA(m, 10);
    ndm_array s = ndm_slice(a, 0, 8, 2, -2);
    assert_int_equal(ndm_array_offset(s), 8);
    assert_strides(s, -2);
    assert_outlives(m, a, s, ((double[]){8, 6, 4}), 3);
}

static void test_slice_empty_result(void **state)
{
    SLICES(ROOT(state), {100, 200, 1, 0, {0}}, {5, 5, 1, 0, {0}}, {7, 3, 1, 0, {0}},
           {3, 7, -1, 0, {0}});
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    ndm_array e = ndm_slice(g, 1, 2, 2, 1);
    assert_shape(e, 3, 0);
    assert_int_equal(ndm_array_size(e), 0);
    ndm_array e2 = ndm_slice(e, 1, NDM_END, NDM_END, -1);
    assert_shape(e2, 3, 0);
    release_ok(e2);
    assert_outlives(m, g, e, NULL, 0);
}

static void test_slice_open_bounds(void **state)
{
    SLICES(ROOT(state), {NDM_END, NDM_END, 1, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
           {NDM_END, NDM_END, 10, 1, {0}}, {NDM_END, NDM_END, 3, 4, {0, 3, 6, 9}},
           {NDM_END, NDM_END, -4, 3, {9, 5, 1}});
}

static void test_slice_other_axes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    ndm_array c = ndm_slice(g, 1, 1, 3, 1);
    assert_shape(c, 3, 2);
    assert_values(c, ((double[]){1, 2, 5, 6, 9, 10}), 6);
    ndm_array r = ndm_slice(g, -2, -1, NDM_END, -2);
    assert_shape(r, 2, 4);
    assert_values(r, ((double[]){8, 9, 10, 11, 0, 1, 2, 3}), 8);
    ndm_array both = ndm_slice(r, -1, NDM_END, NDM_END, -3); /* columns 3, 0 */
    assert_values(both, ((double[]){11, 8, 3, 0}), 4);
    release_ok(c);
    release_ok(r);
    assert_outlives(m, g, both, ((double[]){11, 8, 3, 0}), 4);
}

static void test_slice_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    assert_fails(ndm_slice(g, 0, 0, 2, 0), NDM_E_INVALID);
    assert_error_has("step must be non-zero");
    assert_fails(ndm_slice(g, 0, 0, 2, INT64_MIN), NDM_E_INVALID);
    assert_error_has("step INT64_MIN is out of range");
    assert_fails(ndm_slice(g, 2, 0, 2, 1), NDM_E_AXIS);
    assert_fails(ndm_slice(g, -3, 0, 2, 1), NDM_E_AXIS);
    ndm_array s = ndm_scalar(m, NDM_F64, 1);
    assert_fails(ndm_slice(s, 0, 0, 1, 1), NDM_E_AXIS);
    assert_int_equal(test_live_arrays(m), 2);
    release_ok(g);
    release_ok(s);
}

/* ---- select ----------------------------------------------------------------------- */

static void test_select_removes_axis(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    ndm_array row = ndm_select(g, 0, 1);
    assert_shape(row, 4);
    assert_int_equal(ndm_array_offset(row), 4);
    assert_values(row, ((double[]){4, 5, 6, 7}), 4);
    ndm_array col = ndm_select(g, 1, -1);
    assert_shape(col, 3);
    assert_strides(col, 4);
    assert_values(col, ((double[]){3, 7, 11}), 3);
    ndm_array one = ndm_select(row, -1, -4);
    assert_shape0(one);
    double v;
    assert_ok(ndm_item(one, &v));
    assert_true(v == 4);
    release_ok(row);
    release_ok(one);
    assert_outlives(m, g, col, ((double[]){3, 7, 11}), 3);
}

static void test_select_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 4);
    assert_fails(ndm_select(g, 0, 3), NDM_E_INVALID);
    assert_error_has("index 3 is out of range for axis 0 of size 3");
    assert_fails(ndm_select(g, 0, -4), NDM_E_INVALID);
    assert_fails(ndm_select(g, 2, 0), NDM_E_AXIS);
    ndm_array e = IOTA(m, 0, 2);
    assert_fails(ndm_select(e, 0, 0), NDM_E_INVALID);
    assert_int_equal(test_live_arrays(m), 2);
    release_ok(g);
    release_ok(e);
}

/* ---- squeeze and unsqueeze ------------------------------------------------------------ */

static void test_squeeze_one_axis(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 1, 3, 1);
    ndm_array a = ndm_squeeze(g, 0);
    assert_shape(a, 3, 1);
    ndm_array b = ndm_squeeze(g, -1);
    assert_shape(b, 1, 3);
    assert_values(b, ((double[]){0, 1, 2}), 3);
    release_ok(a);
    assert_outlives(m, g, b, ((double[]){0, 1, 2}), 3);
}

static void test_squeeze_all_axes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 1, 3, 1, 1);
    ndm_array a = ndm_squeeze(g, NDM_ALL_AXES);
    assert_shape(a, 3);
    ndm_array ones = IOTA(m, 1, 1);
    ndm_array z = ndm_squeeze(ones, NDM_ALL_AXES);
    assert_shape0(z);
    ndm_array plain = IOTA(m, 2, 3);
    ndm_array p = ndm_squeeze(plain, NDM_ALL_AXES);
    assert_shape(p, 2, 3);
    assert_true(ndm_array_shares_storage(p, plain));
    release_ok(ones);
    release_ok(z);
    release_ok(plain);
    release_ok(p);
    assert_outlives(m, g, a, ((double[]){0, 1, 2}), 3);
}

static void test_squeeze_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 1, 3);
    assert_fails(ndm_squeeze(g, 1), NDM_E_SHAPE);
    assert_error_has("cannot squeeze axis 1 of size 3");
    assert_fails(ndm_squeeze(g, 2), NDM_E_AXIS);
    assert_fails(ndm_squeeze(g, -3), NDM_E_AXIS);
    assert_int_equal(test_live_arrays(m), 1);
    release_ok(g);
}

static void test_unsqueeze_every_position(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    const int axes[6] = {0, 1, 2, -1, -2, -3};
    const int64_t shapes[6][3] = {{1, 2, 3}, {2, 1, 3}, {2, 3, 1},
                                  {2, 3, 1}, {2, 1, 3}, {1, 2, 3}};
    for (int i = 0; i < 6; i++) {
        ndm_array u = ndm_unsqueeze(g, axes[i]);
        assert_live(u);
        check_shape_at(u, 3, shapes[i], __FILE__, __LINE__);
        assert_true(ndm_array_is_contiguous(u));
        assert_true(ndm_array_shares_storage(u, g));
        assert_values(u, ((double[]){0, 1, 2, 3, 4, 5}), 6);
        release_ok(u);
    }
    ndm_array s = ndm_scalar(m, NDM_F64, 7);
    ndm_array s1 = ndm_unsqueeze(s, -1);
    assert_shape(s1, 1);
    release_ok(s);
    assert_values(s1, ((double[]){7}), 1);
    release_ok(s1);
    ndm_array u = ndm_unsqueeze(g, 1);
    assert_outlives(m, g, u, ((double[]){0, 1, 2, 3, 4, 5}), 6);
}

static void test_unsqueeze_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    assert_fails(ndm_unsqueeze(g, 3), NDM_E_AXIS);
    assert_fails(ndm_unsqueeze(g, -4), NDM_E_AXIS);
    assert_int_equal(test_live_arrays(m), 1);
    release_ok(g);
}

/* ---- expand ----------------------------------------------------------------------------- */

static void test_expand_size_one_axis(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array c = IOTA(m, 3, 1);
    ndm_array e = ndm_expand(c, NDM_SHAPE(3, 4));
    assert_shape(e, 3, 4);
    assert_strides(e, 1, 0);
    assert_int_equal(ndm_array_nbytes(e), 96);
    /* Only the storage counts, not the elements the view shows. */
    assert_int_equal(check_live_bytes(m, 0), 24);
    /* A write to the base shows in every repeated element. */
    const double three[3] = {5, 6, 7};
    assert_ok(ndm_array_copy_in(c, three, sizeof three));
    assert_outlives(m, c, e, ((double[]){5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7}), 12);
}

static void test_expand_new_leading_axes(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array v = IOTA(m, 3);
    ndm_array e = ndm_expand(v, NDM_SHAPE(2, 2, 3));
    assert_shape(e, 2, 2, 3);
    assert_strides(e, 0, 0, 1);
    ndm_array z = ndm_expand(v, NDM_SHAPE(0, 3));
    assert_shape(z, 0, 3);
    release_ok(z);
    ndm_array s = ndm_scalar(m, NDM_F64, 4);
    ndm_array es = ndm_expand(s, NDM_SHAPE(2));
    assert_strides(es, 0);
    assert_values(es, ((double[]){4, 4}), 2);
    release_ok(s);
    release_ok(es);
    assert_outlives(m, v, e, ((double[]){0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}), 12);
}

static void test_expand_minus_one_keeps_size(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array c = IOTA(m, 3, 1);
    ndm_array e = ndm_expand(c, NDM_SHAPE(-1, 2));
    assert_shape(e, 3, 2);
    assert_strides(e, 1, 0);
    ndm_array same = ndm_expand(c, NDM_SHAPE(-1, -1));
    assert_shape(same, 3, 1);
    ndm_array one = IOTA(m, 1);
    ndm_array zero = ndm_expand(one, NDM_SHAPE(0));
    assert_shape(zero, 0);
    release_ok(one);
    release_ok(zero);
    release_ok(same);
    assert_outlives(m, c, e, ((double[]){0, 0, 1, 1, 2, 2}), 6);
}

static void test_expand_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 3, 2);
    assert_fails(ndm_expand(g, NDM_SHAPE(3, 4)), NDM_E_SHAPE);
    assert_error_has("cannot expand f64[3,2]: axis 1 has size 2, not 1 or 4");
    assert_fails(ndm_expand(g, NDM_SHAPE(6)), NDM_E_SHAPE);
    assert_fails(ndm_expand(g, NDM_SHAPE(-1, 3, 2)), NDM_E_SHAPE);
    assert_fails(ndm_expand(g, NDM_SHAPE(-2, 3, 2)), NDM_E_SHAPE);
    assert_fails(ndm_expand(g, NDM_SHAPE(3, -2)), NDM_E_SHAPE);
    ndm_array one = IOTA(m, 1);
    assert_fails(ndm_expand(one, NDM_SHAPE(INT64_C(1) << 62, 4)), NDM_E_OVERFLOW);
    assert_int_equal(test_live_arrays(m), 2);
    release_ok(g);
    release_ok(one);
}

/* ---- contiguous and copy ----------------------------------------------------------------- */

static void test_contiguous_aliases_contiguous_input(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array c = ndm_contiguous(g);
    assert_live(c);
    assert_int_not_equal(c.id, g.id);
    assert_shape(c, 2, 3);
    ndm_array row = ndm_select(g, 0, 1); /* contiguous, offset 3 */
    ndm_array cr = ndm_contiguous(row);
    assert_true(ndm_array_shares_storage(cr, g));
    assert_int_equal(ndm_array_offset(cr), 3);
    release_ok(row);
    release_ok(cr);
    /* Strides of size-1 axes do not matter: (3, 1) with strides (1, 3) is
     * C-contiguous, as numpy says. */
    ndm_array one_row = ndm_select(g, 0, 0);
    ndm_array col = ndm_transpose(ndm_unsqueeze(one_row, 0));
    assert_strides(col, 1, 3);
    assert_true(ndm_array_is_contiguous(col));
    ndm_array cc = ndm_contiguous(col);
    assert_true(ndm_array_shares_storage(cc, g));
    assert_ok(ndm_scope_release_all_but(m, 2, ((const ndm_array[]){g, c})));
    assert_outlives(m, g, c, ((double[]){0, 1, 2, 3, 4, 5}), 6);
}

static void test_contiguous_copies_strided_input(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array t = ndm_transpose(g);
    ndm_array c = ndm_contiguous(t);
    assert_false(ndm_array_shares_storage(c, g));
    assert_true(ndm_array_is_contiguous(c));
    assert_shape(c, 3, 2);
    assert_strides(c, 2, 1);
    ndm_array e = ndm_expand(ndm_select(g, 0, 0), NDM_SHAPE(2, 3));
    ndm_array ce = ndm_contiguous(e);
    assert_false(ndm_array_shares_storage(ce, g));
    assert_strides(ce, 3, 1);
    assert_values(ce, ((double[]){0, 1, 2, 0, 1, 2}), 6);
    assert_ok(ndm_scope_release_all_but(m, 1, &c));
    assert_values(c, ((double[]){0, 3, 1, 4, 2, 5}), 6);
    assert_int_equal(check_live_bytes(m, 0), 48);
    release_ok(c);
}

static void test_copy_never_shares(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array g = IOTA(m, 2, 3);
    ndm_array c = ndm_copy(g);
    assert_false(ndm_array_shares_storage(c, g));
    assert_int_equal(check_live_bytes(m, 0), 96);
    const double z[6] = {0};
    assert_ok(ndm_array_copy_in(c, z, sizeof z));
    assert_values(g, ((double[]){0, 1, 2, 3, 4, 5}), 6);
    ndm_array s = ndm_slice(g, 1, NDM_END, NDM_END, -1);
    ndm_array cs = ndm_copy(s);
    assert_true(ndm_array_is_contiguous(cs));
    assert_values(cs, ((double[]){2, 1, 0, 5, 4, 3}), 6);
    ndm_array scalar = ndm_scalar(m, NDM_I32, 9);
    ndm_array c0 = ndm_copy(scalar);
    assert_shape0(c0);
    assert_int_equal(ndm_array_dtype(c0), NDM_I32);
    release_ok(g);
    release_ok(s);
    assert_values(cs, ((double[]){2, 1, 0, 5, 4, 3}), 6);
    assert_ok(ndm_scope_release_all(m));
    assert_int_equal(check_live_bytes(m, 0), 0);
}

/* ---- the output rule, null inputs and refused managers --------------------------------------- */

enum view_op {
    OP_ALIAS, OP_RESHAPE, OP_RESHAPE_COPY, OP_TRANSPOSE, OP_PERMUTE, OP_SWAPAXES, OP_SLICE,
    OP_SELECT, OP_SQUEEZE, OP_UNSQUEEZE, OP_EXPAND, OP_CONTIGUOUS, OP_CONTIGUOUS_COPY, OP_COPY,
    OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "alias", "reshape", "reshape (copy)", "transpose", "permute", "swapaxes", "slice",
    "select", "squeeze", "unsqueeze", "expand", "contiguous", "contiguous (copy)", "copy",
};

/* Apply one view function to `a` (shape (2, 1, 3), or its transpose for the
 * copying variants) with output manager `out` (null: the output rule). */
static ndm_array apply_op(enum view_op op, ndm_manager out, ndm_array a)
{
    switch (op) {
    case OP_ALIAS:
        return ndm_alias_to_at(NDM_HERE, out, a);
    case OP_RESHAPE:
    case OP_RESHAPE_COPY:
        return ndm_reshape_to_at(NDM_HERE, out, a, NDM_SHAPE(3, 2));
    case OP_TRANSPOSE:
        return ndm_permute_to_at(NDM_HERE, out, a, 0, NULL);
    case OP_PERMUTE:
        return ndm_permute_to_at(NDM_HERE, out, a, 3, (const int[]){2, 0, 1});
    case OP_SWAPAXES:
        return ndm_swapaxes_to_at(NDM_HERE, out, a, 0, 2);
    case OP_SLICE:
        return ndm_slice_to_at(NDM_HERE, out, a, 2, 0, 2, 1);
    case OP_SELECT:
        return ndm_select_to_at(NDM_HERE, out, a, 0, 1);
    case OP_SQUEEZE:
        return ndm_squeeze_to_at(NDM_HERE, out, a, 1);
    case OP_UNSQUEEZE:
        return ndm_unsqueeze_to_at(NDM_HERE, out, a, 0);
    case OP_EXPAND:
        return ndm_expand_to_at(NDM_HERE, out, a, NDM_SHAPE(2, 2, 4, 3));
    case OP_CONTIGUOUS:
    case OP_CONTIGUOUS_COPY:
        return ndm_contiguous_to_at(NDM_HERE, out, a);
    case OP_COPY:
        return ndm_copy_to_at(NDM_HERE, out, a);
    default:
        return NDM_NULL_ARRAY;
    }
}

/* The input for `op`, in manager m: (2, 1, 3); for the ops that must take
 * their copying path, a transpose with strides (1, 2, 2) that outlived its
 * base. */
static ndm_array op_input(enum view_op op, ndm_manager m)
{
    if (op != OP_RESHAPE_COPY && op != OP_CONTIGUOUS_COPY)
        return IOTA(m, 2, 1, 3);
    ndm_array g = IOTA(m, 3, 1, 2);
    ndm_array t = ndm_transpose(g);
    release_ok(g);
    assert_false(ndm_array_is_contiguous(t));
    return t;
}

static void test_view_output_input_manager(void **state)
{
    ndm_manager owner = ndm_manager_new(ROOT(state), "owner");
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_array a = op_input(op, owner);
        ndm_array v = apply_op(op, NDM_OUTPUT_RULE, a);
        if (!v.id)
            fail_msg("%s: %s", op_names[op], ndm_last_error());
        if (ndm_array_manager(v).id != owner.id)
            fail_msg("%s: the result is not in its input's manager", op_names[op]);
        release_ok(v);
        release_ok(a);
    }
    assert_manager_empty(owner);
    close_ok(owner);
}

static void test_view_output_scope_wins(void **state)
{
    ndm_manager owner = ndm_manager_new(ROOT(state), "owner");
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_array a = op_input(op, owner);
        ndm_manager s = ndm_scope_begin(ROOT(state), "catch");
        ndm_array v = apply_op(op, NDM_OUTPUT_RULE, a);
        if (!v.id)
            fail_msg("%s: %s", op_names[op], ndm_last_error());
        if (ndm_array_manager(v).id != s.id)
            fail_msg("%s: the result is not in the innermost scope", op_names[op]);
        /* An inner scope wins over the outer one. */
        ndm_manager inner = ndm_scope_begin(s, "inner");
        ndm_array w = apply_op(op, NDM_OUTPUT_RULE, a);
        assert_int_equal(ndm_array_manager(w).id, inner.id);
        assert_ok(ndm_scope_end(inner, 0, NULL));
        assert_false(ndm_array_valid(w));
        assert_ok(ndm_scope_end(s, 0, NULL));
        assert_false(ndm_array_valid(v));
        assert_true(ndm_array_valid(a));
        release_ok(a);
    }
    assert_manager_empty(owner);
    close_ok(owner);
}

static void test_view_output_named_wins(void **state)
{
    ndm_manager owner = ndm_manager_new(ROOT(state), "owner");
    ndm_manager named = ndm_manager_new(ROOT(state), "named");
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_array a = op_input(op, owner);
        ndm_manager s = ndm_scope_begin(ROOT(state), "scope");
        ndm_array v = apply_op(op, named, a);
        if (!v.id)
            fail_msg("%s: %s", op_names[op], ndm_last_error());
        if (ndm_array_manager(v).id != named.id)
            fail_msg("%s: the result is not in the named manager", op_names[op]);
        assert_int_equal(test_live_arrays(s), 0);
        assert_ok(ndm_scope_end(s, 0, NULL));
        /* Releasing the input keeps the result in its manager valid. */
        release_ok(a);
        assert_true(ndm_array_valid(v));
        release_ok(v);
    }
    assert_manager_empty(owner);
    assert_manager_empty(named);
    close_ok(owner);
    close_ok(named);
}

typedef struct other_thread {
    ndm_manager parent;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int step; /* 1: scope begun; 2: may end */
    ndm_manager scope;
} other_thread;

static void *scope_elsewhere(void *p)
{
    other_thread *o = p;
    ndm_manager s = ndm_scope_begin(o->parent, "elsewhere");
    pthread_mutex_lock(&o->lock);
    o->scope = s;
    o->step = 1;
    pthread_cond_broadcast(&o->cond);
    while (o->step < 2)
        pthread_cond_wait(&o->cond, &o->lock);
    pthread_mutex_unlock(&o->lock);
    ndm_status st = ndm_scope_end(s, 0, NULL);
    return (void *)(intptr_t)st;
}

/* A scope active on another thread does not catch this thread's results. */
static void test_view_output_scope_is_per_thread(void **state)
{
    ndm_manager owner = ndm_manager_new(ROOT(state), "owner");
    other_thread o = {.parent = ROOT(state), .step = 0};
    pthread_mutex_init(&o.lock, NULL);
    pthread_cond_init(&o.cond, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, scope_elsewhere, &o), 0);
    pthread_mutex_lock(&o.lock);
    while (o.step < 1)
        pthread_cond_wait(&o.cond, &o.lock);
    pthread_mutex_unlock(&o.lock);
    assert_live(o.scope);
    ndm_array a = IOTA(owner, 2, 1, 3);
    ndm_array v = ndm_reshape(a, NDM_SHAPE(6));
    ndm_array c = ndm_copy(a);
    bool in_owner = ndm_array_manager(v).id == owner.id && ndm_array_manager(c).id == owner.id;
    assert_null(ndm_scope_current().id);
    pthread_mutex_lock(&o.lock);
    o.step = 2;
    pthread_cond_broadcast(&o.cond);
    pthread_mutex_unlock(&o.lock);
    void *rc;
    pthread_join(th, &rc);
    assert_int_equal((intptr_t)rc, NDM_OK);
    pthread_mutex_destroy(&o.lock);
    pthread_cond_destroy(&o.cond);
    assert_true(in_owner);
    close_ok(owner);
}

static void test_view_null_input_keeps_first_error(void **state)
{
    ndm_manager m = ROOT(state);
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_clear_error();
        ndm_array bad = ndm_zeros(m, NDM_F32, NDM_SHAPE(-5));
        assert_null(bad.id);
        char first[512];
        snprintf(first, sizeof first, "%s", ndm_last_error());
        ndm_array v = apply_op(op, NDM_OUTPUT_RULE, bad);
        assert_null(v.id);
        if (ndm_last_status() != NDM_E_SHAPE || strcmp(ndm_last_error(), first) != 0)
            fail_msg("%s replaced the first error with: %s", op_names[op], ndm_last_error());
        /* Without an earlier error, a null input is reported as such. */
        ndm_clear_error();
        v = apply_op(op, NDM_OUTPUT_RULE, NDM_NULL_ARRAY);
        assert_null(v.id);
        assert_int_equal(ndm_last_status(), NDM_E_NULL);
    }
    assert_manager_empty(m);
}

static void test_view_stale_input(void **state)
{
    ndm_manager m = ROOT(state);
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_array a = op_input(op, m);
        release_ok(a);
        ndm_clear_error();
        ndm_array v = apply_op(op, NDM_OUTPUT_RULE, a);
        assert_null(v.id);
        if (ndm_last_status() != NDM_E_CLOSED)
            fail_msg("%s on a stale input: %s", op_names[op], ndm_status_name(ndm_last_status()));
        assert_error_has("stale array handle");
    }
    assert_manager_empty(m);
}

static void test_view_refused_output_manager(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager capped = ndm_manager_new(m, "capped");
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    for (int op = 0; op < OP_COUNT; op++) {
        ndm_array a = op_input(op, m);
        ndm_clear_error();
        assert_null(apply_op(op, capped, a).id);
        if (ndm_last_status() != NDM_E_CAPPED)
            fail_msg("%s into a capped manager: %s", op_names[op], ndm_last_error());
        assert_error_has("system/test/capped");
        ndm_clear_error();
        assert_null(apply_op(op, gone, a).id);
        if (ndm_last_status() != NDM_E_CLOSED)
            fail_msg("%s into a closed manager: %s", op_names[op], ndm_last_error());
        /* Refused before anything was made. */
        assert_int_equal(test_live_arrays(m), 1);
        release_ok(a);
    }
    ndm_stats st;
    assert_ok(ndm_manager_stats(capped, NDM_CPU, 0, &st));
    assert_int_equal(st.created, 0);
    assert_int_equal(st.peak_bytes, 0);
    close_ok(capped);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_alias_fresh_handle_same_view),
        TEST(test_alias_released_first),
        TEST(test_reshape_view_when_strides_allow),
        TEST(test_reshape_infers_minus_one),
        TEST(test_reshape_size_one_axes),
        TEST(test_reshape_strided_view_stays_view),
        TEST(test_reshape_copies_when_strides_forbid),
        TEST(test_reshape_errors),
        TEST(test_transpose_reverses_axes),
        TEST(test_transpose_low_ranks),
        TEST(test_permute_order),
        TEST(test_permute_errors),
        TEST(test_swapaxes),
        TEST(test_slice_basic),
        TEST(test_slice_negative_indices),
        TEST(test_slice_clamps),
        TEST(test_slice_negative_step),
        TEST(test_slice_empty_result),
        TEST(test_slice_open_bounds),
        TEST(test_slice_other_axes),
        TEST(test_slice_errors),
        TEST(test_select_removes_axis),
        TEST(test_select_errors),
        TEST(test_squeeze_one_axis),
        TEST(test_squeeze_all_axes),
        TEST(test_squeeze_errors),
        TEST(test_unsqueeze_every_position),
        TEST(test_unsqueeze_errors),
        TEST(test_expand_size_one_axis),
        TEST(test_expand_new_leading_axes),
        TEST(test_expand_minus_one_keeps_size),
        TEST(test_expand_errors),
        TEST(test_contiguous_aliases_contiguous_input),
        TEST(test_contiguous_copies_strided_input),
        TEST(test_copy_never_shares),
        TEST(test_view_output_input_manager),
        TEST(test_view_output_scope_wins),
        TEST(test_view_output_named_wins),
        TEST(test_view_output_scope_is_per_thread),
        TEST(test_view_null_input_keeps_first_error),
        TEST(test_view_stale_input),
        TEST(test_view_refused_output_manager),
    };
    return cmocka_run_group_tests_name("view", tests, NULL, NULL);
}
