/* Shape and indexing operations: results against plain loops written here,
 * on seeded inputs, views, size-0 and size-1 axes, 0-d arrays, every dtype;
 * error paths; the output rule; reference and fast kernels; thread counts. */
#include <math.h>
#include <stdlib.h>

#include "helpers.h"

#include "backends/backend.h"
#include "backends/cpu/parallel.h"

static const ndm_dtype all_dtypes[] = {NDM_BOOL, NDM_U8,   NDM_I32, NDM_I64,
                                       NDM_F16,  NDM_BF16, NDM_F32, NDM_F64};
#define NDTYPES 8

/* ---- host values, converted here rather than by the library --------------------- */

/* Floats to integers saturate, as ndm's casts do. */
static void put_elem(ndm_dtype t, void *p, double v)
{
    switch (t) {
    case NDM_BOOL: *(uint8_t *)p = v != 0; break;
    case NDM_U8: *(uint8_t *)p = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    case NDM_I32:
        *(int32_t *)p = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v);
        break;
    case NDM_I64: *(int64_t *)p = (int64_t)v; break;
    case NDM_F16: *(uint16_t *)p = ndm_f32_to_f16((float)v); break;
    case NDM_BF16: *(uint16_t *)p = ndm_f32_to_bf16((float)v); break;
    case NDM_F32: *(float *)p = (float)v; break;
    case NDM_F64: *(double *)p = v; break;
    }
}

static double get_elem(ndm_dtype t, const void *p)
{
    switch (t) {
    case NDM_BOOL:
    case NDM_U8: return *(const uint8_t *)p;
    case NDM_I32: return *(const int32_t *)p;
    case NDM_I64: return (double)*(const int64_t *)p;
    case NDM_F16: return ndm_f16_to_f32(*(const uint16_t *)p);
    case NDM_BF16: return ndm_bf16_to_f32(*(const uint16_t *)p);
    case NDM_F32: return *(const float *)p;
    case NDM_F64: return *(const double *)p;
    }
    return NAN;
}

static int64_t prod(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

/* A C-ordered array of dtype t holding v. */
static ndm_array mk(ndm_manager m, ndm_dtype t, const double *v, int nd, const int64_t *shape)
{
    int64_t n = prod(nd, shape);
    char *buf = malloc((size_t)(n ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++)
        put_elem(t, buf + i * (int64_t)ndm_dtype_size(t), v[i]);
    ndm_array a = ndm_from_buffer(m, t, buf, nd, shape);
    free(buf);
    assert_live(a);
    return a;
}

/* The elements of a in C order as doubles (caller frees). */
static double *vals(ndm_array a)
{
    int64_t n = ndm_array_size(a);
    ndm_dtype t = ndm_array_dtype(a);
    char *buf = malloc((size_t)(n ? n : 1) * 8);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_ok(ndm_array_copy_out(a, buf, ndm_array_nbytes(a)));
    for (int64_t i = 0; i < n; i++)
        v[i] = get_elem(t, buf + i * (int64_t)ndm_dtype_size(t));
    free(buf);
    return v;
}

/* splitmix64: the seeded test inputs. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Small integers every dtype holds exactly. */
static double small_value(uint64_t *s, ndm_dtype t)
{
    uint64_t r = next_u64(s);
    if (t == NDM_BOOL)
        return (double)(r & 1);
    if (t == NDM_U8)
        return (double)(r % 16);
    return (double)(int64_t)(r % 17) - 8;
}

/* A seeded array of shape (nd, shape) and dtype t; *host gets its values. */
static ndm_array seeded(ndm_manager m, ndm_dtype t, uint64_t seed, double **host, int nd,
                        const int64_t *shape)
{
    int64_t n = prod(nd, shape);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = small_value(&seed, t);
    ndm_array a = mk(m, t, v, nd, shape);
    if (host)
        *host = v;
    else
        free(v);
    return a;
}

/* Assert shape and C-order values of a. */
static void check_array(ndm_array a, ndm_dtype t, int nd, const int64_t *shape, const double *want)
{
    assert_live(a);
    assert_int_equal(ndm_array_dtype(a), t);
    assert_int_equal(ndm_array_ndim(a), nd);
    int64_t got_shape[16];
    assert_int_equal(ndm_array_shape(a, got_shape, 16), nd);
    for (int d = 0; d < nd; d++)
        if (got_shape[d] != shape[d])
            fail_msg("axis %d has size %lld, expected %lld", d, (long long)got_shape[d],
                     (long long)shape[d]);
    double *v = vals(a);
    int64_t n = prod(nd, shape);
    for (int64_t i = 0; i < n; i++)
        if (!(v[i] == want[i] || (isnan(v[i]) && isnan(want[i]))))
            fail_msg("element %lld is %g, expected %g (%s)", (long long)i, v[i], want[i],
                     ndm_dtype_name(t));
    free(v);
}

/* The same C-order coordinates helpers the expectations use. */
static void unravel(int64_t i, int nd, const int64_t *shape, int64_t *c)
{
    for (int d = nd - 1; d >= 0; d--) {
        c[d] = i % shape[d];
        i /= shape[d];
    }
}
static int64_t ravel(int nd, const int64_t *shape, const int64_t *c)
{
    int64_t i = 0;
    for (int d = 0; d < nd; d++)
        i = i * shape[d] + c[d];
    return i;
}

#define release(a) assert_ok(ndm_array_release(a))

/* ---- concat and stack ----------------------------------------------------------- */

static void test_concat_every_dtype_and_axis(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        ndm_dtype t = all_dtypes[ti];
        for (int axis = -2; axis < 2; axis++) {
            int ax = axis < 0 ? axis + 2 : axis;
            int64_t sa[2] = {2, 3}, sb[2] = {2, 3};
            sb[ax] = 4;
            double *va, *vb;
            ndm_array a = seeded(m, t, 11 + ti, &va, 2, sa);
            ndm_array b = seeded(m, t, 99 + ti, &vb, 2, sb);
            ndm_array c = ndm_concat(axis, NDM_ARRAYS(a, b));
            int64_t sc[2] = {2, 3};
            sc[ax] = sa[ax] + sb[ax];
            double want[2 * 7 * 3];
            for (int64_t i = 0; i < prod(2, sc); i++) {
                int64_t co[2];
                unravel(i, 2, sc, co);
                if (co[ax] < sa[ax]) {
                    want[i] = va[ravel(2, sa, co)];
                } else {
                    co[ax] -= sa[ax];
                    want[i] = vb[ravel(2, sb, co)];
                }
            }
            check_array(c, t, 2, sc, want);
            assert_true(ndm_array_is_contiguous(c));
            assert_int_equal(ndm_array_manager(c).id, m.id);
            release(a);
            release(b);
            release(c);
            free(va);
            free(vb);
        }
    }
}

static void test_concat_promotes_dtypes_and_reads_views(void **state)
{
    ndm_manager m = ROOT(state);
    double *va, *vb, *vc;
    ndm_array a = seeded(m, NDM_I32, 1, &va, NDM_SHAPE(3, 2));
    ndm_array b = seeded(m, NDM_F32, 2, &vb, NDM_SHAPE(2, 4));
    ndm_array bt = ndm_transpose(b); /* (4, 2), strided */
    ndm_array c = seeded(m, NDM_BOOL, 3, &vc, NDM_SHAPE(2, 2));
    ndm_array r = ndm_concat(0, NDM_ARRAYS(a, bt, c));
    double want[9 * 2];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            want[i * 2 + j] = va[i * 2 + j];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            want[(3 + i) * 2 + j] = vb[j * 4 + i];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            want[(7 + i) * 2 + j] = vc[i * 2 + j];
    check_array(r, NDM_F32, 2, (int64_t[]){9, 2}, want);
    ndm_array u8 = seeded(m, NDM_U8, 4, NULL, NDM_SHAPE(1, 2));
    ndm_array r2 = ndm_concat(0, NDM_ARRAYS(c, u8));
    assert_int_equal(ndm_array_dtype(r2), NDM_U8);
    release(a);
    release(b);
    release(bt);
    release(c);
    release(r);
    release(u8);
    release(r2);
    free(va);
    free(vb);
    free(vc);
}

static void test_concat_size_zero_and_one(void **state)
{
    ndm_manager m = ROOT(state);
    double *vb;
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 3));
    ndm_array b = seeded(m, NDM_F32, 5, &vb, NDM_SHAPE(1, 3));
    ndm_array c = ndm_concat(0, NDM_ARRAYS(a, b, a));
    check_array(c, NDM_F32, 2, (int64_t[]){1, 3}, vb);
    ndm_array e = ndm_concat(1, NDM_ARRAYS(a, a));
    check_array(e, NDM_F32, 2, (int64_t[]){0, 6}, NULL);
    ndm_array one = ndm_concat(-1, NDM_ARRAYS(b));
    check_array(one, NDM_F32, 2, (int64_t[]){1, 3}, vb);
    assert_false(ndm_array_shares_storage(one, b));
    release(a);
    release(b);
    release(c);
    release(e);
    release(one);
    free(vb);
}

static void test_concat_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 4));
    ndm_array v = ndm_zeros(m, NDM_F32, NDM_SHAPE(3));
    ndm_array s = ndm_scalar(m, NDM_F32, 1);
    uint64_t live = test_live_arrays(m);

    assert_true(ndm_array_is_null(ndm_concat(0, NDM_ARRAYS(a, b))));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("f32[2,3] and f32[2,4] (input 1): sizes differ on axis 1");
    assert_true(ndm_array_is_null(ndm_concat(0, NDM_ARRAYS(a, v))));
    assert_error_has("ranks differ");
    assert_true(ndm_array_is_null(ndm_concat(2, NDM_ARRAYS(a, a))));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_true(ndm_array_is_null(ndm_concat(-3, NDM_ARRAYS(a, a))));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_true(ndm_array_is_null(ndm_concat(0, NDM_ARRAYS(s, s))));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_true(ndm_array_is_null(ndm_concat(0, 0, NULL)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_true(ndm_array_is_null(ndm_stack(0, NDM_ARRAYS(a, b))));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_stack(3, NDM_ARRAYS(a, a))));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);

    /* A null input propagates and keeps the first error. */
    ndm_clear_error();
    ndm_array bad = ndm_concat(5, NDM_ARRAYS(a, a));
    ndm_array r = ndm_concat(0, NDM_ARRAYS(a, bad));
    assert_true(ndm_array_is_null(r));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    /* A stale input. */
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    release(gone);
    assert_true(ndm_array_is_null(ndm_concat(0, NDM_ARRAYS(a, gone))));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(m), live); /* nothing was allocated */
    release(a);
    release(b);
    release(v);
    release(s);
}

static void test_stack_new_axis_and_scalars(void **state)
{
    ndm_manager m = ROOT(state);
    for (int axis = -3; axis < 3; axis++) {
        int ax = axis < 0 ? axis + 3 : axis;
        double *va, *vb;
        ndm_array a = seeded(m, NDM_I64, 7, &va, NDM_SHAPE(2, 3));
        ndm_array b0 = seeded(m, NDM_I64, 8, &vb, NDM_SHAPE(3, 2));
        ndm_array b = ndm_transpose(b0);
        ndm_array s = ndm_stack(axis, NDM_ARRAYS(a, b));
        int64_t shape[3], k = 0;
        for (int d = 0; d < 3; d++)
            shape[d] = d == ax ? 2 : (k++ == 0 ? 2 : 3);
        double want[12];
        for (int64_t i = 0; i < 12; i++) {
            int64_t c[3], rest[2];
            unravel(i, 3, shape, c);
            for (int d = 0, j = 0; d < 3; d++)
                if (d != ax)
                    rest[j++] = c[d];
            want[i] = c[ax] == 0 ? va[rest[0] * 3 + rest[1]] : vb[rest[1] * 2 + rest[0]];
        }
        check_array(s, NDM_I64, 3, shape, want);
        release(a);
        release(b0);
        release(b);
        release(s);
        free(va);
        free(vb);
    }
    ndm_array x = ndm_scalar(m, NDM_F64, 1.5), y = ndm_scalar(m, NDM_I32, -2);
    ndm_array xy = ndm_stack(0, NDM_ARRAYS(x, y, x));
    check_array(xy, NDM_F64, 1, (int64_t[]){3}, (double[]){1.5, -2, 1.5});
    release(x);
    release(y);
    release(xy);
}

/* ---- the output rule (checked once here for every family of operation) ------------ */

static void test_index_output_rule(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager other = ndm_manager_new(m, "other");
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 3));
    ndm_array i = mk(m, NDM_I64, (double[]){0, 2}, NDM_SHAPE(2));
    /* first input's manager */
    ndm_array r1 = ndm_take(a, 0, i);
    assert_int_equal(ndm_array_manager(r1).id, m.id);
    /* a named manager wins over the scope */
    ndm_manager s = ndm_scope_begin(m, "scope");
    ndm_array r2 = ndm_concat_to(other, 0, NDM_ARRAYS(a, a));
    assert_int_equal(ndm_array_manager(r2).id, other.id);
    /* the innermost scope wins over the input's manager, for every kind of result */
    ndm_array r3 = ndm_pad(a, NDM_PAD_CONSTANT, 0.0, NDM_SHAPE(1, 1));
    ndm_array r4 = ndm_flip(a, 0);
    ndm_array parts[2];
    assert_ok(ndm_split(a, 0, 2, parts));
    ndm_array r5 = ndm_repeat(a, 1, 2);
    ndm_array r6 = ndm_cumsum(a, 0);
    ndm_array r7 = ndm_one_hot(i, 4, NDM_F32);
    ndm_array r8 = ndm_tile(a, NDM_SHAPE(2));
    ndm_array idx2 = mk(m, NDM_I64, (double[]){1, 0, 2}, NDM_SHAPE(1, 3));
    ndm_array r9 = ndm_gather(a, 0, idx2);
    ndm_array r10 = ndm_scatter_add(a, 0, idx2, r9);
    ndm_array r11 = ndm_stack(0, NDM_ARRAYS(a));
    ndm_array got[] = {r3, r4, parts[0], parts[1], r5, r6, r7, r8, r9, r10, r11};
    for (size_t k = 0; k < sizeof got / sizeof got[0]; k++) {
        assert_live(got[k]);
        assert_int_equal(ndm_array_manager(got[k]).id, s.id);
    }
    /* scatter_add_ creates nothing, even with a temporary for the dtype */
    ndm_array f64src = ndm_ones(m, NDM_F64, NDM_SHAPE(1, 3));
    uint64_t before = test_live_arrays(m);
    assert_ok(ndm_scatter_add_(a, 0, idx2, f64src));
    assert_int_equal(test_live_arrays(m), before);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_false(ndm_array_valid(r3));
    release(a);
    release(i);
    release(r1);
    release(idx2);
    release(f64src);
    assert_ok(ndm_manager_close(other));
}

static void test_index_capped_manager_refuses_before_allocating(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(4, 2));
    ndm_array idx = ndm_zeros(model, NDM_I64, NDM_SHAPE(3, 2));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_true(ndm_array_is_null(ndm_concat(0, NDM_ARRAYS(w, w))));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    ndm_array parts[2] = {{7}, {7}};
    assert_int_equal(ndm_split(w, 0, 2, parts), NDM_E_CAPPED);
    assert_true(ndm_array_is_null(parts[0]) && ndm_array_is_null(parts[1]));
    assert_true(ndm_array_is_null(ndm_repeat(w, 0, 3)));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_int_equal(test_live_arrays(model), 2);
    /* in place still works on a capped model; src lives in the batch */
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array g = ndm_ones(batch, NDM_F64, NDM_SHAPE(3, 2));
    assert_ok(ndm_scatter_add_(w, 0, idx, g));
    double *v = vals(w);
    assert_true(v[0] == 3 && v[1] == 3 && v[2] == 0);
    free(v);
    assert_int_equal(test_live_arrays(model), 2);
    assert_int_equal(test_live_arrays(batch), 1);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
}

/* ---- split ------------------------------------------------------------------------- */

static void test_split_equal_views(void **state)
{
    ndm_manager m = ROOT(state);
    double *v;
    ndm_array a = seeded(m, NDM_F32, 21, &v, NDM_SHAPE(2, 6));
    ndm_array parts[3];
    assert_ok(ndm_split(a, -1, 3, parts));
    for (int p = 0; p < 3; p++) {
        double want[4];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                want[i * 2 + j] = v[i * 6 + p * 2 + j];
        check_array(parts[p], NDM_F32, 2, (int64_t[]){2, 2}, want);
        assert_true(ndm_array_shares_storage(parts[p], a));
        release(parts[p]);
    }
    /* a size-0 axis splits into empty parts */
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 2));
    ndm_array ep[2];
    assert_ok(ndm_split(e, 0, 2, ep));
    check_array(ep[1], NDM_F32, 2, (int64_t[]){0, 2}, NULL);
    release(ep[0]);
    release(ep[1]);
    release(e);
    release(a);
    free(v);
}

static void test_split_indices_and_errors(void **state)
{
    ndm_manager m = ROOT(state);
    double *v;
    ndm_array a = seeded(m, NDM_I32, 22, &v, NDM_SHAPE(7));
    ndm_array p[4];
    assert_ok(ndm_split_indices(a, 0, p, NDM_SHAPE(2, 2, -2)));
    check_array(p[0], NDM_I32, 1, (int64_t[]){2}, v);
    check_array(p[1], NDM_I32, 1, (int64_t[]){0}, NULL);
    check_array(p[2], NDM_I32, 1, (int64_t[]){3}, v + 2);
    check_array(p[3], NDM_I32, 1, (int64_t[]){2}, v + 5);
    for (int i = 0; i < 4; i++)
        release(p[i]);
    uint64_t live = test_live_arrays(m);
    ndm_array q[8] = {{7}, {7}, {7}};
    assert_int_equal(ndm_split_indices(a, 0, q, NDM_SHAPE(4, 3)), NDM_E_INVALID);
    assert_error_has("split index 3 (entry 1) is below the previous one");
    assert_true(ndm_array_is_null(q[0]) && ndm_array_is_null(q[2]));
    assert_int_equal(ndm_split_indices(a, 0, q, NDM_SHAPE(8, 9)), NDM_E_INVALID);
    assert_error_has("out of range");
    assert_int_equal(ndm_split(a, 0, 2, q), NDM_E_SHAPE);
    assert_error_has("does not split into 2 equal parts");
    assert_int_equal(ndm_split(a, 0, 0, q), NDM_E_INVALID);
    assert_int_equal(ndm_split(a, 1, 7, q), NDM_E_AXIS);
    /* a null input keeps the first error, or reports itself */
    assert_int_equal(ndm_split(NDM_NULL_ARRAY, 0, 0, q), NDM_E_AXIS);
    ndm_clear_error();
    assert_int_equal(ndm_split(NDM_NULL_ARRAY, 0, 1, q), NDM_E_NULL);
    assert_int_equal(ndm_split(a, 0, 7, NULL), NDM_E_INVALID);
    assert_error_has("outs is NULL");
    assert_int_equal(test_live_arrays(m), live);
    release(a);
    free(v);
}

/* ---- flip ------------------------------------------------------------------------ */

static void test_flip_is_a_view(void **state)
{
    ndm_manager m = ROOT(state);
    double *v;
    ndm_array a = seeded(m, NDM_F64, 31, &v, NDM_SHAPE(3, 4));
    ndm_array f = ndm_flip(a, -1);
    double want[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            want[i * 4 + j] = v[i * 4 + 3 - j];
    check_array(f, NDM_F64, 2, (int64_t[]){3, 4}, want);
    assert_true(ndm_array_shares_storage(f, a));
    int64_t st[2];
    ndm_array_strides(f, st, 2);
    assert_true(st[1] == -1);
    ndm_array all = ndm_flip(a, NDM_ALL_AXES);
    for (int i = 0; i < 12; i++)
        want[i] = v[11 - i];
    check_array(all, NDM_F64, 2, (int64_t[]){3, 4}, want);
    /* flipping back and a copy of a flipped view */
    ndm_array back = ndm_flip(all, NDM_ALL_AXES);
    check_array(back, NDM_F64, 2, (int64_t[]){3, 4}, v);
    ndm_array s = ndm_scalar(m, NDM_F32, 2), fs = ndm_flip(s, NDM_ALL_AXES);
    check_array(fs, NDM_F32, 0, NULL, (double[]){2});
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 2)), fe = ndm_flip(e, 0);
    check_array(fe, NDM_F32, 2, (int64_t[]){0, 2}, NULL);
    assert_true(ndm_array_is_null(ndm_flip(a, 2)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array arr[] = {a, f, all, back, s, fs, e, fe};
    for (size_t i = 0; i < 8; i++)
        release(arr[i]);
    free(v);
}

/* ---- take and index_select --------------------------------------------------------- */

static void test_take_every_dtype_and_index_type(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype itypes[] = {NDM_U8, NDM_I32, NDM_I64};
    for (int ti = 0; ti < NDTYPES; ti++)
        for (int ii = 0; ii < 3; ii++)
            for (int axis = -3; axis < 3; axis++) {
                int ax = axis < 0 ? axis + 3 : axis;
                int64_t sa[3] = {3, 4, 5};
                double *va;
                ndm_array a = seeded(m, all_dtypes[ti], 40 + ti, &va, 3, sa);
                int64_t n = sa[ax];
                double iv[6] = {0, (double)(n - 1), 1, 0, 2, (double)(n - 1)};
                if (itypes[ii] != NDM_U8) {
                    iv[1] = -1; /* negative counts from the end */
                    iv[4] = -(double)n;
                }
                ndm_array idx = mk(m, itypes[ii], iv, NDM_SHAPE(2, 3));
                ndm_array r = ndm_take(a, axis, idx);
                int64_t shape[4], k = 0;
                for (int d = 0; d < ax; d++)
                    shape[k++] = sa[d];
                shape[k++] = 2;
                shape[k++] = 3;
                for (int d = ax + 1; d < 3; d++)
                    shape[k++] = sa[d];
                double want[3 * 4 * 5 * 6];
                int64_t total = prod(4, shape);
                for (int64_t i = 0; i < total; i++) {
                    int64_t c[4], src[3];
                    unravel(i, 4, shape, c);
                    int64_t v = (int64_t)iv[c[ax] * 3 + c[ax + 1]];
                    if (v < 0)
                        v += n;
                    for (int d = 0; d < 3; d++)
                        src[d] = d < ax ? c[d] : d == ax ? v : c[d + 1];
                    want[i] = va[ravel(3, sa, src)];
                }
                check_array(r, all_dtypes[ti], 4, shape, want);
                release(a);
                release(idx);
                release(r);
                free(va);
            }
}

static void test_take_views_scalars_and_empty(void **state)
{
    ndm_manager m = ROOT(state);
    double *va;
    ndm_array base = seeded(m, NDM_F32, 50, &va, NDM_SHAPE(6, 5));
    ndm_array a = ndm_slice(base, 0, 5, NDM_END, -2); /* rows 5, 3, 1 */
    ndm_array ib = mk(m, NDM_I32, (double[]){4, 0, 2, 1, 3, 4}, NDM_SHAPE(3, 2));
    ndm_array idx = ndm_transpose(ib); /* (2, 3), strided: 4 2 3 / 0 1 4 */
    ndm_array r = ndm_take(a, 1, idx);
    double want[3 * 2 * 3];
    const int rows[3] = {5, 3, 1}, iv[6] = {4, 2, 3, 0, 1, 4};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 6; k++)
            want[i * 6 + k] = va[rows[i] * 5 + iv[k]];
    check_array(r, NDM_F32, 3, (int64_t[]){3, 2, 3}, want);
    /* a 0-d index removes the axis */
    ndm_array i0 = ndm_scalar(m, NDM_I64, -1);
    ndm_array row = ndm_take(base, 0, i0);
    check_array(row, NDM_F32, 1, (int64_t[]){5}, va + 25);
    ndm_array elem = ndm_take(row, 0, i0);
    check_array(elem, NDM_F32, 0, NULL, va + 29);
    /* no indices give an empty result */
    ndm_array none = ndm_zeros(m, NDM_I64, NDM_SHAPE(0));
    ndm_array e = ndm_index_select(base, 1, none);
    check_array(e, NDM_F32, 2, (int64_t[]){6, 0}, NULL);
    /* embedding lookup: 2-d token ids into a table */
    ndm_array tok = mk(m, NDM_I64, (double[]){1, 5, 5, 0}, NDM_SHAPE(2, 2));
    ndm_array emb = ndm_take(base, 0, tok);
    double ew[2 * 2 * 5];
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < 5; j++)
            ew[t * 5 + j] = va[(int)(t == 0 ? 1 : t == 3 ? 0 : 5) * 5 + j];
    check_array(emb, NDM_F32, 3, (int64_t[]){2, 2, 5}, ew);
    ndm_array arr[] = {base, a, ib, idx, r, i0, row, elem, none, e, tok, emb};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        release(arr[i]);
    free(va);
}

static void test_take_index_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 5));
    ndm_array idx = mk(m, NDM_I64, (double[]){0, 1, 2, 3, 5, 1}, NDM_SHAPE(2, 3));
    uint64_t live = test_live_arrays(m);
    assert_true(ndm_array_is_null(ndm_take(a, 1, idx)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("index 5 at [1,1] of the indices is out of range for axis 1 of size 5");
    ndm_array neg = mk(m, NDM_I32, (double[]){-5}, NDM_SHAPE(1));
    assert_true(ndm_array_is_null(ndm_index_select(a, 0, neg)));
    assert_error_has("index -5 at [0] of the indices is out of range for axis 0 of size 4");
    assert_true(ndm_array_is_null(ndm_index_select(a, 0, idx)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("must be 1-d");
    ndm_array fidx = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    assert_true(ndm_array_is_null(ndm_take(a, 0, fidx)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_take(a, 2, neg)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array empty = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 5));
    assert_true(ndm_array_is_null(ndm_take(empty, 0, neg)));
    assert_error_has("axis 0 of size 0");
    ndm_clear_error();
    assert_true(ndm_array_is_null(ndm_take(a, 0, NDM_NULL_ARRAY)));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_int_equal(test_live_arrays(m), live + 3);
    ndm_array arr[] = {a, idx, neg, fidx, empty};
    for (size_t i = 0; i < 5; i++)
        release(arr[i]);
}

/* ---- gather ---------------------------------------------------------------------- */

/* numpy's take_along_axis over 3-d arrays, written out. */
static void gather_expect(const double *va, const int64_t *sa, const double *vi, const int64_t *si,
                          int ax, int64_t *shape, double *want)
{
    for (int d = 0; d < 3; d++)
        shape[d] = d == ax ? si[d] : (sa[d] == 1 ? si[d] : sa[d]);
    for (int64_t i = 0; i < prod(3, shape); i++) {
        int64_t c[3], ci[3], cs[3];
        unravel(i, 3, shape, c);
        for (int d = 0; d < 3; d++) {
            ci[d] = si[d] == 1 ? 0 : c[d];
            cs[d] = sa[d] == 1 ? 0 : c[d];
        }
        int64_t v = (int64_t)vi[ravel(3, si, ci)];
        cs[ax] = v < 0 ? v + sa[ax] : v;
        want[i] = va[ravel(3, sa, cs)];
    }
}

static void test_gather_broadcasts_like_take_along_axis(void **state)
{
    ndm_manager m = ROOT(state);
    struct {
        int64_t sa[3], si[3];
    } cases[] = {
        {{3, 4, 5}, {3, 4, 2}}, {{3, 4, 5}, {1, 4, 7}}, {{3, 1, 5}, {3, 4, 2}},
        {{2, 3, 4}, {2, 1, 1}}, {{1, 1, 1}, {1, 1, 3}}, {{3, 0, 2}, {3, 0, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int axis = -1; axis < 3; axis++) {
            int ax = axis < 0 ? 2 : axis;
            const int64_t *sa = cases[c].sa;
            int64_t si[3] = {cases[c].si[0], cases[c].si[1], cases[c].si[2]};
            if (sa[ax] == 0)
                continue;
            double *va;
            ndm_array a = seeded(m, NDM_F16, 60 + c, &va, 3, sa);
            int64_t ni = prod(3, si);
            double *vi = malloc((size_t)(ni ? ni : 1) * sizeof *vi);
            uint64_t s = 70 + c;
            for (int64_t i = 0; i < ni; i++)
                vi[i] = (double)(int64_t)(next_u64(&s) % (uint64_t)(2 * sa[ax])) - (double)sa[ax];
            ndm_array idx = mk(m, NDM_I32, vi, 3, si);
            bool fits = true;
            for (int d = 0; d < 3; d++)
                fits &= d == ax || si[d] == sa[d] || si[d] == 1 || sa[d] == 1;
            ndm_array r = ndm_gather(a, axis, idx);
            if (!fits) {
                assert_true(ndm_array_is_null(r));
                assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
                release(a);
                release(idx);
                free(va);
                free(vi);
                continue;
            }
            int64_t shape[3];
            double *want = malloc((size_t)(3 * 4 * 7 * 5) * sizeof *want);
            gather_expect(va, sa, vi, si, ax, shape, want);
            check_array(r, NDM_F16, 3, shape, want);
            release(a);
            release(idx);
            release(r);
            free(va);
            free(vi);
            free(want);
        }
}

static void test_gather_views_and_errors(void **state)
{
    ndm_manager m = ROOT(state);
    double *va;
    ndm_array a0 = seeded(m, NDM_I64, 80, &va, NDM_SHAPE(5, 4));
    ndm_array a = ndm_transpose(a0); /* (4, 5) */
    ndm_array i0 = mk(m, NDM_U8, (double[]){4, 0, 3, 3, 1, 2, 0, 4}, NDM_SHAPE(2, 4));
    ndm_array idx = ndm_transpose(i0); /* (4, 2) */
    ndm_array r = ndm_gather(a, 1, idx);
    double want[8];
    const int iv[8] = {4, 0, 3, 3, 1, 2, 0, 4};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++)
            want[i * 2 + k] = va[iv[k * 4 + i] * 4 + i];
    check_array(r, NDM_I64, 2, (int64_t[]){4, 2}, want);
    ndm_array bad = mk(m, NDM_I64, (double[]){0, 5}, NDM_SHAPE(1, 2));
    assert_true(ndm_array_is_null(ndm_gather(a, 1, bad)));
    assert_error_has("index 5 at [0,1] of the indices is out of range for axis 1 of size 5");
    ndm_array flat = mk(m, NDM_I64, (double[]){0}, NDM_SHAPE(1));
    assert_true(ndm_array_is_null(ndm_gather(a, 1, flat)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    ndm_array wide = ndm_zeros(m, NDM_I64, NDM_SHAPE(3, 1));
    assert_true(ndm_array_is_null(ndm_gather(a, 1, wide)));
    assert_error_has("do not broadcast");
    ndm_array arr[] = {a0, a, i0, idx, r, bad, flat, wide};
    for (size_t i = 0; i < 8; i++)
        release(arr[i]);
    free(va);
}

/* ---- scatter_add --------------------------------------------------------------------- */

static void test_scatter_add_accumulates_repeats(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        ndm_dtype t = all_dtypes[ti];
        for (int axis = 0; axis < 2; axis++) {
            int64_t sa[2] = {4, 3}, si[2] = {4, 3};
            si[axis] = 5;
            double *va, *vs;
            ndm_array a = seeded(m, t, 90 + ti, &va, 2, sa);
            ndm_array src = seeded(m, t, 91 + ti, &vs, 2, si);
            double vi[20];
            int64_t ni = prod(2, si);
            uint64_t s = 92 + ti;
            for (int i = 0; i < ni; i++)
                vi[i] = (double)(int64_t)(next_u64(&s) % (uint64_t)(2 * sa[axis])) -
                        (double)sa[axis];
            ndm_array idx = mk(m, NDM_I64, vi, 2, si);
            double want[12];
            memcpy(want, va, sizeof want);
            for (int64_t i = 0; i < ni; i++) {
                int64_t c[2];
                unravel(i, 2, si, c);
                int64_t v = (int64_t)vi[i];
                c[axis] = v < 0 ? v + sa[axis] : v;
                double *w = &want[ravel(2, sa, c)];
                if (t == NDM_BOOL)
                    *w = (*w != 0 || vs[i] != 0);
                else if (t == NDM_U8)
                    *w = (double)(uint8_t)(*w + vs[i]);
                else if (t == NDM_F16)
                    *w = ndm_f16_to_f32(ndm_f32_to_f16((float)(*w + vs[i])));
                else if (t == NDM_BF16)
                    *w = ndm_bf16_to_f32(ndm_f32_to_bf16((float)(*w + vs[i])));
                else
                    *w += vs[i];
            }
            ndm_array out = ndm_scatter_add(a, axis, idx, src);
            check_array(out, t, 2, sa, want);
            check_array(a, t, 2, sa, va); /* untouched */
            assert_ok(ndm_scatter_add_(a, axis, idx, src));
            check_array(a, t, 2, sa, want);
            release(a);
            release(src);
            release(idx);
            release(out);
            free(va);
            free(vs);
        }
    }
}

static void test_scatter_add_broadcasts_and_converts(void **state)
{
    ndm_manager m = ROOT(state);
    /* embedding gradient: rows of a table += rows of src, index (3, 1) broadcast over columns */
    ndm_array table = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 2));
    ndm_array idx = mk(m, NDM_I32, (double[]){2, 0, 2}, NDM_SHAPE(3, 1));
    double *vs;
    ndm_array src = seeded(m, NDM_F64, 100, &vs, NDM_SHAPE(3, 2));
    assert_ok(ndm_scatter_add_(table, 0, idx, src));
    double want[8] = {0};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 2; j++)
            want[(k == 1 ? 0 : 2) * 2 + j] += vs[k * 2 + j];
    check_array(table, NDM_F32, 2, (int64_t[]){4, 2}, want);
    /* a 0-d src broadcasts to every index; a transposed destination view */
    ndm_array base = ndm_zeros(m, NDM_I64, NDM_SHAPE(3, 2));
    ndm_array dst = ndm_transpose(base); /* (2, 3) */
    ndm_array one = ndm_scalar(m, NDM_I32, 1);
    ndm_array ix = mk(m, NDM_I64, (double[]){0, 0, 2, 1}, NDM_SHAPE(2, 2));
    ndm_array ixb = ndm_slice(ix, 1, 0, NDM_END, 1);
    assert_ok(ndm_scatter_add_(dst, 1, ixb, one));
    check_array(dst, NDM_I64, 2, (int64_t[]){2, 3}, (double[]){2, 0, 0, 0, 1, 1});
    /* src sharing the updated array's memory is read as it was */
    ndm_array v = mk(m, NDM_F64, (double[]){1, 2, 3}, NDM_SHAPE(3));
    ndm_array iv = mk(m, NDM_I64, (double[]){1, 2, 0}, NDM_SHAPE(3));
    assert_ok(ndm_scatter_add_(v, 0, iv, v));
    check_array(v, NDM_F64, 1, (int64_t[]){3}, (double[]){4, 3, 5});
    ndm_array arr[] = {table, idx, src, base, dst, one, ix, ixb, v, iv};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        release(arr[i]);
    free(vs);
}

static void test_scatter_add_errors_leave_input_untouched(void **state)
{
    ndm_manager m = ROOT(state);
    double *va;
    ndm_array a = seeded(m, NDM_F32, 110, &va, NDM_SHAPE(3, 4));
    ndm_array idx = mk(m, NDM_I64, (double[]){0, 1, 2, 3, 1, 0, 3, 2}, NDM_SHAPE(2, 4));
    ndm_array src = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 4));
    assert_int_equal(ndm_scatter_add_(a, 0, idx, src), NDM_E_INVALID);
    assert_error_has("index 3 at [0,3] of the indices is out of range for axis 0 of size 3");
    check_array(a, NDM_F32, 2, (int64_t[]){3, 4}, va);
    ndm_array wide = ndm_ones(m, NDM_F32, NDM_SHAPE(3, 4));
    assert_int_equal(ndm_scatter_add_(a, 0, idx, wide), NDM_E_SHAPE);
    assert_error_has("does not broadcast");
    ndm_array idx3 = ndm_zeros(m, NDM_I64, NDM_SHAPE(2, 3));
    assert_int_equal(ndm_scatter_add_(a, 0, idx3, src), NDM_E_SHAPE);
    assert_error_has("do not fit");
    ndm_array row = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    ndm_array bc = ndm_expand(row, NDM_SHAPE(3, 4));
    ndm_array i1 = ndm_zeros(m, NDM_I64, NDM_SHAPE(1, 4));
    ndm_array s1 = ndm_ones(m, NDM_F32, NDM_SHAPE(1, 4));
    assert_int_equal(ndm_scatter_add_(bc, 0, i1, s1), NDM_E_INVALID);
    assert_error_has("broadcast view");
    assert_int_equal(ndm_scatter_add_(a, 2, i1, s1), NDM_E_AXIS);
    ndm_clear_error();
    assert_int_equal(ndm_scatter_add_(a, 0, i1, NDM_NULL_ARRAY), NDM_E_NULL);
    check_array(a, NDM_F32, 2, (int64_t[]){3, 4}, va);
    ndm_array arr[] = {a, idx, src, wide, idx3, row, bc, i1, s1};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        release(arr[i]);
    free(va);
}

/* ---- one_hot ------------------------------------------------------------------------- */

static void test_one_hot_labels(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        ndm_array lab = mk(m, NDM_U8, (double[]){3, 0, 9, 3, 1, 7}, NDM_SHAPE(2, 3));
        ndm_array lt = ndm_transpose(lab); /* (3, 2), strided */
        ndm_array oh = ndm_one_hot(lt, 10, all_dtypes[ti]);
        const int lv[6] = {3, 3, 0, 1, 9, 7}; /* lt in C order */
        double want[60];
        for (int i = 0; i < 6; i++)
            for (int c = 0; c < 10; c++)
                want[i * 10 + c] = c == lv[i];
        check_array(oh, all_dtypes[ti], 3, (int64_t[]){3, 2, 10}, want);
        release(lab);
        release(lt);
        release(oh);
    }
    ndm_array s = ndm_scalar(m, NDM_I64, 2);
    ndm_array os = ndm_one_hot(s, 3, NDM_I32);
    check_array(os, NDM_I32, 1, (int64_t[]){3}, (double[]){0, 0, 1});
    ndm_array neg = mk(m, NDM_I32, (double[]){1, -1}, NDM_SHAPE(2));
    assert_true(ndm_array_is_null(ndm_one_hot(neg, 3, NDM_F32)));
    assert_error_has("index -1 at [1] of the indices is out of range for 3 classes");
    assert_true(ndm_array_is_null(ndm_one_hot(s, 2, NDM_F32)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_true(ndm_array_is_null(ndm_one_hot(s, 0, NDM_F32)));
    assert_error_has("num_classes must be >= 1");
    assert_true(ndm_array_is_null(ndm_one_hot(s, 4, (ndm_dtype)42)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    release(s);
    release(os);
    release(neg);
}

/* ---- pad -------------------------------------------------------------------------- */

/* Where padded coordinate x reads from, by bouncing off the ends. */
static int64_t pad_from(int64_t x, int64_t n, ndm_pad_mode mode)
{
    if (x >= 0 && x < n)
        return x;
    if (mode == NDM_PAD_CONSTANT)
        return -1;
    if (mode == NDM_PAD_EDGE || n == 1)
        return x < 0 ? 0 : n - 1;
    while (x < 0 || x >= n)
        x = x < 0 ? -x : 2 * (n - 1) - x;
    return x;
}

static void pad_check(ndm_manager m, ndm_dtype t, ndm_array a, const double *va, int nd,
                      const int64_t *sa, ndm_pad_mode mode, double value, int nw,
                      const int64_t *w)
{
    ndm_array r = ndm_pad(a, mode, value, nw, w);
    int64_t shape[4], before[4];
    for (int d = 0; d < nd; d++) {
        const int64_t *p = nw == 2 ? w : w + 2 * d;
        before[d] = p[0];
        shape[d] = sa[d] + p[0] + p[1];
    }
    int64_t n = prod(nd, shape);
    double *want = malloc((size_t)(n ? n : 1) * sizeof *want);
    double cv;
    put_elem(t, &cv, value);
    cv = get_elem(t, &cv);
    for (int64_t i = 0; i < n; i++) {
        int64_t c[4];
        unravel(i, nd, shape, c);
        bool in = true;
        for (int d = 0; d < nd && in; d++) {
            c[d] = pad_from(c[d] - before[d], sa[d], mode);
            in = c[d] >= 0;
        }
        want[i] = in ? va[ravel(nd, sa, c)] : cv;
    }
    check_array(r, t, nd, shape, want);
    (void)m;
    free(want);
    release(r);
}

static void test_pad_modes(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        double *va;
        ndm_array a = seeded(m, all_dtypes[ti], 120 + ti, &va, NDM_SHAPE(3, 4));
        for (ndm_pad_mode mode = NDM_PAD_CONSTANT; mode <= NDM_PAD_REFLECT; mode++) {
            pad_check(m, all_dtypes[ti], a, va, 2, (int64_t[]){3, 4}, mode, 5.0,
                      NDM_SHAPE(1, 2, 0, 3));
            /* wider than the axis: reflect keeps bouncing */
            pad_check(m, all_dtypes[ti], a, va, 2, (int64_t[]){3, 4}, mode, -1.0,
                      NDM_SHAPE(7, 5));
        }
        release(a);
        free(va);
    }
    /* views, size-1 axes, 0-d, zero widths */
    double *vb;
    ndm_array b = seeded(m, NDM_F32, 130, &vb, NDM_SHAPE(4, 1, 3));
    const int rev[3] = {2, 1, 0};
    ndm_array bv = ndm_permute(b, 3, rev); /* (3, 1, 4) */
    double vbt[12];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            vbt[i * 4 + k] = vb[k * 3 + i];
    for (ndm_pad_mode mode = NDM_PAD_CONSTANT; mode <= NDM_PAD_REFLECT; mode++)
        pad_check(m, NDM_F32, bv, vbt, 3, (int64_t[]){3, 1, 4}, mode, 0.5,
                  NDM_SHAPE(0, 2, 3, 1, 2, 2));
    pad_check(m, NDM_F32, bv, vbt, 3, (int64_t[]){3, 1, 4}, NDM_PAD_EDGE, 0, NDM_SHAPE(0, 0));
    ndm_array s = ndm_scalar(m, NDM_I32, 7);
    ndm_array ps = ndm_pad(s, NDM_PAD_REFLECT, 0, 0, NULL);
    check_array(ps, NDM_I32, 0, NULL, (double[]){7});
    /* an empty axis pads with the constant only */
    ndm_array e = ndm_zeros(m, NDM_F64, NDM_SHAPE(0, 2));
    ndm_array pe = ndm_pad(e, NDM_PAD_CONSTANT, 3, NDM_SHAPE(1, 0, 0, 1));
    check_array(pe, NDM_F64, 2, (int64_t[]){1, 3}, (double[]){3, 3, 3});
    release(b);
    release(bv);
    release(s);
    release(ps);
    release(pe);
    free(vb);
    /* errors */
    assert_true(ndm_array_is_null(ndm_pad(e, NDM_PAD_EDGE, 0, NDM_SHAPE(1, 0, 0, 0))));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("cannot edge-pad axis 0");
    assert_true(ndm_array_is_null(ndm_pad(e, NDM_PAD_CONSTANT, 0, NDM_SHAPE(1, 0, -1, 0))));
    assert_error_has("pad width -1 (entry 2) is negative");
    assert_true(ndm_array_is_null(ndm_pad(e, NDM_PAD_CONSTANT, 0, NDM_SHAPE(1, 1, 1))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_true(ndm_array_is_null(ndm_pad(e, (ndm_pad_mode)9, 0, NDM_SHAPE(1, 1))));
    assert_error_has("unknown pad mode 9");
    assert_true(ndm_array_is_null(ndm_pad(e, NDM_PAD_CONSTANT, 0, NDM_SHAPE(INT64_MAX, 1))));
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    release(e);
}

/* ---- tile and repeat ---------------------------------------------------------------- */

static void test_tile_numpy_reps(void **state)
{
    ndm_manager m = ROOT(state);
    double *va;
    ndm_array a0 = seeded(m, NDM_BF16, 140, &va, NDM_SHAPE(3, 2));
    ndm_array a = ndm_transpose(a0); /* (2, 3) */
    double at[6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            at[i * 3 + j] = va[j * 2 + i];
    struct {
        int n;
        int64_t reps[3];
        int nd;
        int64_t shape[3];
    } cases[] = {
        {1, {2}, 2, {2, 6}},       {2, {3, 1}, 2, {6, 3}},   {3, {2, 1, 2}, 3, {2, 2, 6}},
        {2, {0, 2}, 2, {0, 6}},   {0, {0}, 2, {2, 3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ndm_array r = ndm_tile(a, cases[c].n, cases[c].reps);
        int nd = cases[c].nd;
        int64_t n = prod(nd, cases[c].shape);
        double want[36];
        for (int64_t i = 0; i < n; i++) {
            int64_t co[3];
            unravel(i, nd, cases[c].shape, co);
            /* the last two coordinates wrap around a's shape */
            want[i] = at[(co[nd - 2] % 2) * 3 + co[nd - 1] % 3];
        }
        check_array(r, NDM_BF16, nd, cases[c].shape, want);
        release(r);
    }
    ndm_array s = ndm_scalar(m, NDM_U8, 9);
    ndm_array ts = ndm_tile(s, NDM_SHAPE(2, 2));
    check_array(ts, NDM_U8, 2, (int64_t[]){2, 2}, (double[]){9, 9, 9, 9});
    assert_true(ndm_array_is_null(ndm_tile(a, NDM_SHAPE(-1))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    release(a0);
    release(a);
    release(s);
    release(ts);
    free(va);
}

static void test_repeat_scalar_and_each(void **state)
{
    ndm_manager m = ROOT(state);
    double *va;
    ndm_array a = seeded(m, NDM_I32, 150, &va, NDM_SHAPE(2, 3));
    ndm_array r = ndm_repeat(a, -1, 2);
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 6; j++)
            want[i * 6 + j] = va[i * 3 + j / 2];
    check_array(r, NDM_I32, 2, (int64_t[]){2, 6}, want);
    ndm_array e = ndm_repeat_each(a, 1, NDM_SHAPE(0, 3, 1));
    for (int i = 0; i < 2; i++) {
        const int src[4] = {1, 1, 1, 2};
        for (int j = 0; j < 4; j++)
            want[i * 4 + j] = va[i * 3 + src[j]];
    }
    check_array(e, NDM_I32, 2, (int64_t[]){2, 4}, want);
    ndm_array z = ndm_repeat(a, 0, 0);
    check_array(z, NDM_I32, 2, (int64_t[]){0, 3}, NULL);
    ndm_array f = ndm_flip(a, 0);
    ndm_array rf = ndm_repeat_each(f, 0, NDM_SHAPE(2));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            want[i * 3 + j] = va[(1 - i / 2) * 3 + j];
    check_array(rf, NDM_I32, 2, (int64_t[]){4, 3}, want);
    assert_true(ndm_array_is_null(ndm_repeat(a, 0, -1)));
    assert_error_has("repeat count -1 (entry 0) is negative");
    assert_true(ndm_array_is_null(ndm_repeat_each(a, 1, NDM_SHAPE(1, 2))));
    assert_error_has("2 repeat counts for axis 1 of size 3");
    ndm_array s = ndm_scalar(m, NDM_F32, 1);
    assert_true(ndm_array_is_null(ndm_repeat(s, 0, 2)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array arr[] = {a, r, e, z, f, rf, s};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        release(arr[i]);
    free(va);
}

/* ---- cumsum ------------------------------------------------------------------------- */

static void test_cumsum_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        ndm_dtype t = all_dtypes[ti];
        ndm_dtype rt = ndm_dtype_is_float(t) ? t : NDM_I64;
        for (int axis = -3; axis < 3; axis++) {
            int ax = axis < 0 ? axis + 3 : axis;
            int64_t sa[3] = {3, 4, 5};
            double *va;
            ndm_array base = seeded(m, t, 160 + ti, &va, 3, sa);
            /* read it through a permuted view: shape (5, 3, 4) */
            const int order[3] = {2, 0, 1};
            ndm_array a = ndm_permute(base, 3, order);
            int64_t sh[3] = {5, 3, 4};
            double x[60], want[60];
            for (int64_t i = 0; i < 60; i++) {
                int64_t c[3];
                unravel(i, 3, sh, c);
                x[i] = va[ravel(3, sa, (int64_t[]){c[1], c[2], c[0]})];
            }
            for (int64_t i = 0; i < 60; i++) {
                int64_t c[3];
                unravel(i, 3, sh, c);
                if (c[ax] > 0)
                    continue;
                float facc = 0;
                double dacc = 0;
                for (int64_t k = 0; k < sh[ax]; k++) {
                    c[ax] = k;
                    int64_t j = ravel(3, sh, c);
                    facc += (float)x[j];
                    dacc += x[j];
                    want[j] = t == NDM_F16    ? ndm_f16_to_f32(ndm_f32_to_f16(facc))
                              : t == NDM_BF16 ? ndm_bf16_to_f32(ndm_f32_to_bf16(facc))
                              : t == NDM_F32  ? facc
                                              : dacc;
                }
            }
            ndm_array r = ndm_cumsum(a, axis);
            check_array(r, rt, 3, sh, want);
            release(base);
            release(a);
            release(r);
            free(va);
        }
    }
}

static void test_cumsum_integers_widen(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = mk(m, NDM_I32, (double[]){2147483647.0, 2147483647.0, -5}, NDM_SHAPE(3));
    ndm_array r = ndm_cumsum(a, 0);
    check_array(r, NDM_I64, 1, (int64_t[]){3},
                (double[]){2147483647.0, 4294967294.0, 4294967289.0});
    ndm_array e = ndm_zeros(m, NDM_U8, NDM_SHAPE(2, 0));
    ndm_array re = ndm_cumsum(e, 1);
    check_array(re, NDM_I64, 2, (int64_t[]){2, 0}, NULL);
    ndm_array s = ndm_scalar(m, NDM_F32, 1);
    assert_true(ndm_array_is_null(ndm_cumsum(s, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array arr[] = {a, r, e, re, s};
    for (size_t i = 0; i < 5; i++)
        release(arr[i]);
}

/* ---- cumprod ------------------------------------------------------------------------ */

static void test_cumprod_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    for (int ti = 0; ti < NDTYPES; ti++) {
        ndm_dtype t = all_dtypes[ti];
        ndm_dtype rt = ndm_dtype_is_float(t) ? t : NDM_I64;
        for (int axis = -3; axis < 3; axis++) {
            int ax = axis < 0 ? axis + 3 : axis;
            int64_t sa[3] = {3, 4, 5};
            double *va;
            ndm_array base = seeded(m, t, 260 + ti, &va, 3, sa);
            /* read it through a permuted view: shape (5, 3, 4) */
            const int order[3] = {2, 0, 1};
            ndm_array a = ndm_permute(base, 3, order);
            int64_t sh[3] = {5, 3, 4};
            double x[60], want[60];
            for (int64_t i = 0; i < 60; i++) {
                int64_t c[3];
                unravel(i, 3, sh, c);
                x[i] = va[ravel(3, sa, (int64_t[]){c[1], c[2], c[0]})];
            }
            for (int64_t i = 0; i < 60; i++) {
                int64_t c[3];
                unravel(i, 3, sh, c);
                if (c[ax] > 0)
                    continue;
                float facc = 1;
                double dacc = 1;
                for (int64_t k = 0; k < sh[ax]; k++) {
                    c[ax] = k;
                    int64_t j = ravel(3, sh, c);
                    facc *= (float)x[j];
                    dacc *= x[j];
                    want[j] = t == NDM_F16    ? ndm_f16_to_f32(ndm_f32_to_f16(facc))
                              : t == NDM_BF16 ? ndm_bf16_to_f32(ndm_f32_to_bf16(facc))
                              : t == NDM_F32  ? facc
                                              : dacc;
                }
            }
            ndm_array r = ndm_cumprod(a, axis);
            check_array(r, rt, 3, sh, want);
            release(base);
            release(a);
            release(r);
            free(va);
        }
    }
}

static void test_cumprod_numpy_values(void **state)
{
    ndm_manager m = ROOT(state);
    /* a = np.array([[1.5, -2, 0, 3], [0.5, 4, -1, 2]]) */
    ndm_array a = mk(m, NDM_F64, (double[]){1.5, -2, 0, 3, 0.5, 4, -1, 2}, NDM_SHAPE(2, 4));
    /* np.cumprod(a, axis=1) */
    ndm_array r1 = ndm_cumprod(a, 1);
    check_array(r1, NDM_F64, 2, (int64_t[]){2, 4}, (double[]){1.5, -3, -0.0, -0.0, 0.5, 2, -2, -4});
    /* np.cumprod(a, axis=0) */
    ndm_array r0 = ndm_cumprod(a, -2);
    check_array(r0, NDM_F64, 2, (int64_t[]){2, 4}, (double[]){1.5, -2, 0, 3, 0.75, -8, -0.0, 6});
    /* np.cumprod(np.array([65536, 65536, 65536, 3], np.int32)): int64 */
    ndm_array i = mk(m, NDM_I32, (double[]){65536, 65536, 65536, 3}, NDM_SHAPE(4));
    ndm_array ri = ndm_cumprod(i, 0);
    check_array(ri, NDM_I64, 1, (int64_t[]){4},
                (double[]){65536, 4294967296.0, 281474976710656.0, 844424930131968.0});
    /* np.cumprod(np.array([3037000500, 3037000500, -1], np.int64)) wraps */
    int64_t big[3] = {3037000500, 3037000500, -1};
    ndm_array b = ndm_from_buffer(m, NDM_I64, big, NDM_SHAPE(3));
    ndm_array rb = ndm_cumprod(b, 0);
    int64_t got[3];
    assert_ok(ndm_array_copy_out(rb, got, sizeof got));
    assert_true(got[0] == 3037000500 && got[1] == -9223372036709301616 &&
                got[2] == 9223372036709301616);
    /* np.cumprod(np.array([True, True, False, True])) */
    ndm_array t = mk(m, NDM_BOOL, (double[]){1, 1, 0, 1}, NDM_SHAPE(4));
    ndm_array rt = ndm_cumprod(t, 0);
    check_array(rt, NDM_I64, 1, (int64_t[]){4}, (double[]){1, 1, 0, 0});
    /* empty and 0-d */
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 3));
    ndm_array re = ndm_cumprod(e, 0);
    check_array(re, NDM_F32, 2, (int64_t[]){0, 3}, NULL);
    uint64_t live = test_live_arrays(m);
    ndm_array s = ndm_scalar(m, NDM_F32, 1);
    assert_true(ndm_array_is_null(ndm_cumprod(s, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    assert_true(ndm_array_is_null(ndm_cumprod(a, 2)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    release(gone);
    assert_true(ndm_array_is_null(ndm_cumprod(gone, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(m), live + 1);
    ndm_array arr[] = {a, r1, r0, i, ri, b, rb, t, rt, e, re, s};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        release(arr[k]);
}

/* ---- tril, triu, tri ----------------------------------------------------------------- */

static void test_tril_triu_numpy_values(void **state)
{
    ndm_manager m = ROOT(state);
    double av[24];
    for (int i = 0; i < 24; i++)
        av[i] = i - 5;
    int64_t sh[3] = {2, 3, 4};
    /* a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5: a batch of two 3x4 */
    ndm_array a = mk(m, NDM_F32, av, 3, sh);
    static const struct {
        bool upper;
        int64_t k;
        double want[24];
    } cases[] = {
        /* np.tril(a, 0) */
        {false, 0, {-5, 0, 0, 0, -1, 0, 0, 0, 3, 4, 5, 0, 7, 0, 0, 0, 11, 12, 0, 0, 15, 16, 17, 0}},
        /* np.tril(a, 1) */
        {false, 1, {-5, -4, 0, 0, -1, 0, 1, 0, 3, 4, 5, 6, 7, 8, 0, 0, 11, 12, 13, 0, 15, 16, 17, 18}},
        /* np.tril(a, -1) */
        {false, -1, {0, 0, 0, 0, -1, 0, 0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 11, 0, 0, 0, 15, 16, 0, 0}},
        /* np.triu(a, 0) */
        {true, 0, {-5, -4, -3, -2, 0, 0, 1, 2, 0, 0, 5, 6, 7, 8, 9, 10, 0, 12, 13, 14, 0, 0, 17, 18}},
        /* np.triu(a, 2) */
        {true, 2, {0, 0, -3, -2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 9, 10, 0, 0, 0, 14, 0, 0, 0, 0}},
        /* np.triu(a, -1) */
        {true, -1, {-5, -4, -3, -2, -1, 0, 1, 2, 0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0, 16, 17,
                    18}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ndm_array r = cases[c].upper ? ndm_triu(a, cases[c].k) : ndm_tril(a, cases[c].k);
        check_array(r, NDM_F32, 3, sh, cases[c].want);
        release(r);
    }
    /* a transposed integer view: np.tril(np.arange(12).reshape(3, 4).T) */
    double bv[12];
    for (int i = 0; i < 12; i++)
        bv[i] = i;
    ndm_array b = mk(m, NDM_I32, bv, 2, (int64_t[]){3, 4});
    ndm_array bt = ndm_transpose(b);
    ndm_array rb = ndm_tril(bt, 0);
    check_array(rb, NDM_I32, 2, (int64_t[]){4, 3}, (double[]){0, 0, 0, 1, 5, 0, 2, 6, 10, 3, 7, 11});
    /* k past either edge keeps all, or nothing */
    ndm_array all = ndm_tril(a, 3), none = ndm_triu(a, 4);
    check_array(all, NDM_F32, 3, sh, av);
    double zeros[24] = {0};
    check_array(none, NDM_F32, 3, sh, zeros);
    /* np.tri(3, 4, 0) as bool, np.tri(2, 3, -1) as f64; an empty one */
    ndm_array t = ndm_tri(m, NDM_BOOL, 3, 4, 0);
    check_array(t, NDM_BOOL, 2, (int64_t[]){3, 4}, (double[]){1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0});
    ndm_array t2 = ndm_tri(m, NDM_F64, 2, 3, -1);
    check_array(t2, NDM_F64, 2, (int64_t[]){2, 3}, (double[]){0, 0, 0, 1, 0, 0});
    ndm_array t0 = ndm_tri(m, NDM_F32, 0, 3, 0);
    check_array(t0, NDM_F32, 2, (int64_t[]){0, 3}, NULL);
    /* refusals leave nothing behind */
    uint64_t live = test_live_arrays(m);
    ndm_array v = mk(m, NDM_F32, av, 1, (int64_t[]){4});
    assert_true(ndm_array_is_null(ndm_tril(v, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("a triangle needs the last two axes");
    assert_true(ndm_array_is_null(ndm_tri(m, NDM_F32, -1, 3, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_tri(m, (ndm_dtype)99, 2, 3, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 2));
    release(gone);
    assert_true(ndm_array_is_null(ndm_triu(gone, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(m), live + 1);
    ndm_array arr[] = {a, b, bt, rb, all, none, t, t2, t0, v};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        release(arr[k]);
}

/* ---- sort, argsort, topk --------------------------------------------------------------- */

/* The signs of a's f32 entries (check_array takes -0.0 for 0.0). */
static void check_signs(ndm_array a, int n, const int *neg)
{
    float v[16];
    assert_ok(ndm_array_copy_out(a, v, (size_t)n * sizeof *v));
    for (int i = 0; i < n; i++)
        if (!isnan(v[i]) && (signbit(v[i]) != 0) != (neg[i] != 0))
            fail_msg("element %d is %g with the wrong sign", i, (double)v[i]);
}

static void test_sort_numpy_and_torch_values(void **state)
{
    ndm_manager m = ROOT(state);
    /* x = np.array([3, 1, nan, -0.0, 0.0, 2, 1, -inf], np.float32) */
    ndm_array x = mk(m, NDM_F32, (double[]){3, 1, NAN, -0.0, 0.0, 2, 1, -INFINITY},
                     NDM_SHAPE(8));
    /* np.sort(x, kind="stable"), np.argsort(x, kind="stable") */
    ndm_array s = ndm_sort(x, 0, false), i = ndm_argsort(x, -1, false);
    check_array(s, NDM_F32, 1, (int64_t[]){8}, (double[]){-INFINITY, -0.0, 0, 1, 1, 2, 3, NAN});
    check_signs(s, 8, (int[]){1, 1, 0, 0, 0, 0, 0, 0});
    check_array(i, NDM_I64, 1, (int64_t[]){8}, (double[]){7, 3, 4, 1, 6, 5, 0, 2});
    /* torch.sort(x, descending=True, stable=True): NaN first, ties in order */
    ndm_array sd = ndm_sort(x, 0, true), id = ndm_argsort(x, 0, true);
    check_array(sd, NDM_F32, 1, (int64_t[]){8}, (double[]){NAN, 3, 2, 1, 1, -0.0, 0, -INFINITY});
    check_signs(sd, 8, (int[]){0, 0, 0, 0, 0, 1, 0, 1});
    check_array(id, NDM_I64, 1, (int64_t[]){8}, (double[]){2, 0, 5, 1, 6, 3, 4, 7});
    /* mm = np.array([[3, 1, 3, 0, 1], [2, 2, -1, 5, 2]], np.int32), read
     * through a transposed view of its transpose */
    ndm_array mt = mk(m, NDM_I32, (double[]){3, 2, 1, 2, 3, -1, 0, 5, 1, 2}, NDM_SHAPE(5, 2));
    ndm_array mm = ndm_transpose(mt);
    /* np.sort(mm, axis=1, kind="stable"), np.argsort(...) */
    ndm_array s1 = ndm_sort(mm, 1, false), i1 = ndm_argsort(mm, 1, false);
    check_array(s1, NDM_I32, 2, (int64_t[]){2, 5}, (double[]){0, 1, 1, 3, 3, -1, 2, 2, 2, 5});
    check_array(i1, NDM_I64, 2, (int64_t[]){2, 5}, (double[]){3, 1, 4, 0, 2, 2, 0, 1, 4, 3});
    /* np.sort(mm, axis=0, kind="stable"), np.argsort(...) */
    ndm_array s0 = ndm_sort(mm, -2, false), i0 = ndm_argsort(mm, 0, false);
    check_array(s0, NDM_I32, 2, (int64_t[]){2, 5}, (double[]){2, 1, -1, 0, 1, 3, 2, 3, 5, 2});
    check_array(i0, NDM_I64, 2, (int64_t[]){2, 5}, (double[]){1, 0, 1, 0, 0, 0, 1, 0, 1, 1});
    /* torch.sort(mm, 1, descending=True, stable=True) */
    ndm_array d1 = ndm_sort(mm, 1, true), j1 = ndm_argsort(mm, 1, true);
    check_array(d1, NDM_I32, 2, (int64_t[]){2, 5}, (double[]){3, 3, 1, 1, 0, 5, 2, 2, 2, -1});
    check_array(j1, NDM_I64, 2, (int64_t[]){2, 5}, (double[]){0, 2, 1, 4, 3, 3, 0, 1, 4, 2});
    /* int64 beyond 2^53 sorts exactly: [2^53 + 1, 2^53, -5, 2^53 + 1] */
    int64_t big[4] = {((int64_t)1 << 53) + 1, (int64_t)1 << 53, -5, ((int64_t)1 << 53) + 1};
    ndm_array b = ndm_from_buffer(m, NDM_I64, big, NDM_SHAPE(4));
    ndm_array bs = ndm_sort(b, 0, false), bi = ndm_argsort(b, 0, false);
    int64_t got[4];
    assert_ok(ndm_array_copy_out(bs, got, sizeof got));
    assert_true(got[0] == -5 && got[1] == big[1] && got[2] == big[0] && got[3] == big[0]);
    check_array(bi, NDM_I64, 1, (int64_t[]){4}, (double[]){2, 1, 0, 3});
    /* bool and f16 */
    ndm_array t = mk(m, NDM_BOOL, (double[]){1, 0, 1, 0}, NDM_SHAPE(4));
    ndm_array ts = ndm_sort(t, 0, false), ti = ndm_argsort(t, 0, true);
    check_array(ts, NDM_BOOL, 1, (int64_t[]){4}, (double[]){0, 0, 1, 1});
    check_array(ti, NDM_I64, 1, (int64_t[]){4}, (double[]){0, 2, 1, 3});
    ndm_array h = mk(m, NDM_F16, (double[]){0.5, -2, 65504, -0.25}, NDM_SHAPE(4));
    ndm_array hs = ndm_sort(h, 0, true);
    check_array(hs, NDM_F16, 1, (int64_t[]){4}, (double[]){65504, 0.5, -0.25, -2});
    /* empty lines, and the refusals */
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(3, 0));
    ndm_array es = ndm_sort(e, 1, false);
    check_array(es, NDM_F32, 2, (int64_t[]){3, 0}, NULL);
    uint64_t live = test_live_arrays(m);
    assert_true(ndm_array_is_null(ndm_sort(mm, 2, false)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array z = ndm_scalar(m, NDM_F32, 1);
    assert_true(ndm_array_is_null(ndm_argsort(z, 0, false)));
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    release(gone);
    assert_true(ndm_array_is_null(ndm_sort(gone, 0, false)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(m), live + 1);
    ndm_array arr[] = {x, s, i, sd, id, mt, mm, s1, i1, s0, i0, d1, j1, b, bs, bi, t, ts, ti,
                       h, hs, e, es, z};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        release(arr[k]);
}

static void test_topk_largest_and_smallest(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = mk(m, NDM_F64, (double[]){3, 1, 3, 0, 1, 2, 2, -1, 5, 2}, NDM_SHAPE(2, 5));
    ndm_array v = NDM_NULL_ARRAY, i = NDM_NULL_ARRAY;
    /* torch.topk(a, 2, 1): ties come in the order of their positions */
    assert_ok(ndm_topk(a, 2, 1, true, &v, &i));
    check_array(v, NDM_F64, 2, (int64_t[]){2, 2}, (double[]){3, 3, 5, 2});
    check_array(i, NDM_I64, 2, (int64_t[]){2, 2}, (double[]){0, 2, 3, 0});
    release(v);
    release(i);
    /* torch.topk(a, 3, 1, largest=False) */
    assert_ok(ndm_topk(a, 3, -1, false, &v, &i));
    check_array(v, NDM_F64, 2, (int64_t[]){2, 3}, (double[]){0, 1, 1, -1, 2, 2});
    check_array(i, NDM_I64, 2, (int64_t[]){2, 3}, (double[]){3, 1, 4, 2, 0, 1});
    release(v);
    release(i);
    /* torch.topk(a, 1, 0): along the rows; only the indices */
    assert_ok(ndm_topk(a, 1, 0, true, NULL, &i));
    check_array(i, NDM_I64, 2, (int64_t[]){1, 5}, (double[]){0, 1, 0, 1, 1});
    release(i);
    /* k = 0 and k = n; only the values */
    assert_ok(ndm_topk(a, 0, 1, true, &v, NULL));
    check_array(v, NDM_F64, 2, (int64_t[]){2, 0}, NULL);
    release(v);
    assert_ok(ndm_topk(a, 5, 1, true, &v, NULL));
    check_array(v, NDM_F64, 2, (int64_t[]){2, 5}, (double[]){3, 3, 1, 1, 0, 5, 2, 2, 2, -1});
    release(v);
    /* refusals: both handles null, nothing allocated */
    uint64_t live = test_live_arrays(m);
    v = i = a;
    assert_int_equal(ndm_topk(a, 6, 1, true, &v, &i), NDM_E_INVALID);
    assert_error_has("k = 6 is larger than axis 1");
    assert_true(ndm_array_is_null(v) && ndm_array_is_null(i));
    assert_int_equal(ndm_topk(a, -1, 1, true, &v, &i), NDM_E_INVALID);
    assert_int_equal(ndm_topk(a, 1, 1, true, NULL, NULL), NDM_E_INVALID);
    assert_int_equal(ndm_topk(a, 1, 2, true, &v, &i), NDM_E_AXIS);
    assert_int_equal(test_live_arrays(m), live);
    release(a);
}

/* ---- nonzero and masked_select --------------------------------------------------------- */

static void test_nonzero_numpy_argwhere(void **state)
{
    ndm_manager m = ROOT(state);
    /* np.argwhere(np.array([[0, 1.5, 0], [-0.0, np.nan, 2]])): NaN counts, -0.0 does not */
    ndm_array a = mk(m, NDM_F32, (double[]){0, 1.5, 0, -0.0, NAN, 2}, NDM_SHAPE(2, 3));
    ndm_array r = ndm_nonzero(a);
    check_array(r, NDM_I64, 2, (int64_t[]){3, 2}, (double[]){0, 1, 1, 1, 1, 2});
    /* c = (np.arange(24).reshape(2, 3, 4) % 5 == 0) * np.arange(24).reshape(2, 3, 4),
     * as int32; np.argwhere(c) (the 0 at [0, 0, 0] is not picked) */
    double cv[24] = {0};
    for (int k = 0; k < 24; k += 5)
        cv[k] = k;
    ndm_array c = mk(m, NDM_I32, cv, NDM_SHAPE(2, 3, 4));
    ndm_array rc = ndm_nonzero(c);
    check_array(rc, NDM_I64, 2, (int64_t[]){4, 3},
                (double[]){0, 1, 1, 0, 2, 2, 1, 0, 3, 1, 2, 0});
    /* through a transposed view: np.argwhere(c.transpose(2, 1, 0)) */
    ndm_array ct = ndm_transpose(c);
    ndm_array rct = ndm_nonzero(ct);
    check_array(rct, NDM_I64, 2, (int64_t[]){4, 3},
                (double[]){0, 2, 1, 1, 1, 0, 2, 2, 0, 3, 0, 1});
    /* np.argwhere(np.array([0, 3, 0, 4])) */
    ndm_array v = mk(m, NDM_U8, (double[]){0, 3, 0, 4}, NDM_SHAPE(4));
    ndm_array rv = ndm_nonzero(v);
    check_array(rv, NDM_I64, 2, (int64_t[]){2, 1}, (double[]){1, 3});
    /* np.argwhere(np.array(5)).shape == (1, 0); of 0: (0, 0); of zeros((2, 0)): (0, 2) */
    ndm_array s5 = ndm_scalar(m, NDM_I64, 5), s0 = ndm_scalar(m, NDM_BOOL, 0);
    ndm_array e = ndm_zeros(m, NDM_F16, NDM_SHAPE(2, 0));
    ndm_array r5 = ndm_nonzero(s5), r0 = ndm_nonzero(s0), re = ndm_nonzero(e);
    check_array(r5, NDM_I64, 2, (int64_t[]){1, 0}, NULL);
    check_array(r0, NDM_I64, 2, (int64_t[]){0, 0}, NULL);
    check_array(re, NDM_I64, 2, (int64_t[]){0, 2}, NULL);
    /* the output rule: to m2 */
    ndm_manager m2 = ndm_manager_new(m, "other");
    ndm_array r2 = ndm_nonzero_to(m2, a);
    assert_live(r2);
    assert_int_equal(ndm_array_manager(r2).id, m2.id);
    assert_ok(ndm_manager_close(m2));
    ndm_array arr[] = {a, r, c, rc, ct, rct, v, rv, s5, s0, e, r5, r0, re};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        release(arr[k]);
}

static void test_masked_select_broadcasts(void **state)
{
    ndm_manager m = ROOT(state);
    /* x = np.arange(6).reshape(2, 3).astype(np.float32); m = np.array([True, False, True]);
     * torch.masked_select(x, m) == x[np.broadcast_to(m, (2, 3))] */
    ndm_array x = mk(m, NDM_F32, (double[]){0, 1, 2, 3, 4, 5}, NDM_SHAPE(2, 3));
    ndm_array mk1 = mk(m, NDM_BOOL, (double[]){1, 0, 1}, NDM_SHAPE(3));
    ndm_array r = ndm_masked_select(x, mk1);
    check_array(r, NDM_F32, 1, (int64_t[]){4}, (double[]){0, 2, 3, 5});
    /* a broadcast too: np.broadcast_to(np.array([10., 20, 30]), (2, 3))[mm] with
     * mm = [[True, False, True], [False, True, True]] */
    ndm_array y = mk(m, NDM_I32, (double[]){10, 20, 30}, NDM_SHAPE(3));
    ndm_array mm = mk(m, NDM_BOOL, (double[]){1, 0, 1, 0, 1, 1}, NDM_SHAPE(2, 3));
    ndm_array r2 = ndm_masked_select(y, mm);
    check_array(r2, NDM_I32, 1, (int64_t[]){4}, (double[]){10, 30, 20, 30});
    /* a view of x and an all-false mask */
    ndm_array xt = ndm_transpose(x);
    ndm_array none = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(3, 1));
    ndm_array r3 = ndm_masked_select(xt, none);
    check_array(r3, NDM_F32, 1, (int64_t[]){0}, NULL);
    /* x.T[np.array([[True], [False], [True]])] picks rows 0 and 2 of x.T */
    ndm_array rows = mk(m, NDM_BOOL, (double[]){1, 0, 1}, NDM_SHAPE(3, 1));
    ndm_array r4 = ndm_masked_select(xt, rows);
    check_array(r4, NDM_F32, 1, (int64_t[]){4}, (double[]){0, 3, 2, 5});

    /* bad inputs: a failed call creates nothing */
    uint64_t live = test_live_arrays(m);
    ndm_array fm = ndm_zeros(m, NDM_U8, NDM_SHAPE(3));
    assert_true(ndm_array_is_null(ndm_masked_select(x, fm)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("must be bool");
    ndm_array wide = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(4));
    assert_true(ndm_array_is_null(ndm_masked_select(x, wide)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    ndm_array gone = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(3));
    release(gone);
    assert_true(ndm_array_is_null(ndm_masked_select(x, gone)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_clear_error();
    assert_true(ndm_array_is_null(ndm_masked_select(NDM_NULL_ARRAY, mk1)));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_int_equal(test_live_arrays(m), live + 2);
    /* a closed output manager */
    ndm_manager dead = ndm_manager_new(m, "dead");
    assert_ok(ndm_manager_close(dead));
    assert_true(ndm_array_is_null(ndm_masked_select_to(dead, x, mk1)));
    assert_true(ndm_last_status() < 0);
    assert_true(ndm_array_is_null(ndm_nonzero_to(dead, x)));
    assert_true(ndm_last_status() < 0);
    assert_int_equal(test_live_arrays(m), live + 2);
    ndm_array arr[] = {x, mk1, r, y, mm, r2, xt, none, r3, rows, r4, fm, wide};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        release(arr[k]);
}

/* ---- indexing by several index arrays -------------------------------------------------- */

static void test_index_leading_axes_like_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    double av[24];
    for (int k = 0; k < 24; k++)
        av[k] = k;
    /* A = np.arange(24).reshape(2, 3, 4).astype(np.float64) */
    ndm_array a = mk(m, NDM_F64, av, NDM_SHAPE(2, 3, 4));
    /* i = np.array([[1, 0], [-1, 1]]); j = np.array([2, -3], np.int32); A[i, j] */
    ndm_array i = mk(m, NDM_I64, (double[]){1, 0, -1, 1}, NDM_SHAPE(2, 2));
    ndm_array j = mk(m, NDM_I32, (double[]){2, -3}, NDM_SHAPE(2));
    ndm_array r = ndm_index(a, NDM_ARRAYS(i, j));
    check_array(r, NDM_F64, 3, (int64_t[]){2, 2, 4},
                (double[]){20, 21, 22, 23, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15});
    /* k = np.array([3, -4]); A[i, j, k] */
    ndm_array k = mk(m, NDM_U8, (double[]){3, 0}, NDM_SHAPE(2));
    ndm_array r3 = ndm_index(a, NDM_ARRAYS(i, j, k));
    check_array(r3, NDM_F64, 2, (int64_t[]){2, 2}, (double[]){23, 0, 23, 12});
    /* A[np.array([1, -2, 1])] is take along axis 0 */
    ndm_array one = mk(m, NDM_I32, (double[]){1, -2, 1}, NDM_SHAPE(3));
    ndm_array r1 = ndm_index(a, NDM_ARRAYS(one));
    double w1[36];
    for (int q = 0; q < 36; q++)
        w1[q] = (double)((q / 12 == 1 ? 0 : 12) + q % 12);
    check_array(r1, NDM_F64, 3, (int64_t[]){3, 3, 4}, w1);
    /* of a transposed view, as float64 and as int32 */
    ndm_array at = ndm_transpose(a);
    ndm_array ai = ndm_astype(at, NDM_I32);
    ndm_array jj = mk(m, NDM_I64, (double[]){2, -1}, NDM_SHAPE(2, 1)); /* on axis 0 (size 4) */
    ndm_array ii = mk(m, NDM_I64, (double[]){1, 0}, NDM_SHAPE(2));     /* on axis 1 (size 3) */
    ndm_array rt = ndm_index(at, NDM_ARRAYS(jj, ii));
    ndm_array rti = ndm_index(ai, NDM_ARRAYS(jj, ii));
    /* np.arange(24).reshape(2, 3, 4).transpose(2, 1, 0)[[[2], [-1]], [1, 0]]:
     * [[[6, 18], [2, 14]], [[7, 19], [3, 15]]] */
    check_array(rt, NDM_F64, 3, (int64_t[]){2, 2, 2}, (double[]){6, 18, 2, 14, 7, 19, 3, 15});
    check_array(rti, NDM_I32, 3, (int64_t[]){2, 2, 2}, (double[]){6, 18, 2, 14, 7, 19, 3, 15});
    /* empty index arrays give an empty result */
    ndm_array none = ndm_zeros(m, NDM_I64, NDM_SHAPE(0));
    ndm_array j1 = mk(m, NDM_I32, (double[]){2}, NDM_SHAPE(1));
    ndm_array re = ndm_index(a, NDM_ARRAYS(none, j1));
    check_array(re, NDM_F64, 2, (int64_t[]){0, 4}, NULL);
    ndm_array arr[] = {a, i, j, r, k, r3, one, r1, ai, at, jj, ii, rt, rti, none, j1, re};
    for (size_t q = 0; q < sizeof arr / sizeof *arr; q++)
        release(arr[q]);
}

static void test_index_errors_name_the_index_and_axis(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3, 4));
    ndm_array i = mk(m, NDM_I64, (double[]){1, 0}, NDM_SHAPE(2));
    ndm_array bad = mk(m, NDM_I32, (double[]){0, 3}, NDM_SHAPE(2));
    ndm_array neg = mk(m, NDM_I64, (double[]){-4}, NDM_SHAPE(1));
    ndm_array f = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    ndm_array b = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(2));
    ndm_array three = ndm_zeros(m, NDM_I64, NDM_SHAPE(3));
    uint64_t live = test_live_arrays(m);
    /* out of range: index 3 on axis 1 (size 3), the second index array */
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(i, bad))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("index 3 at [1] of the indices is out of range for axis 1 of size 3 "
                     "(index array 1)");
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(neg))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("index -4 at [0] of the indices is out of range for axis 0 of size 2");
    /* dtypes */
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(i, f))));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(b))));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("ndm_masked_select");
    /* shapes that do not broadcast, too many or too few index arrays */
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(i, three))));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(i, i, i, i))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_true(ndm_array_is_null(ndm_index(a, 0, NULL)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    /* stale and null handles, a closed output manager */
    ndm_array gone = ndm_zeros(m, NDM_I64, NDM_SHAPE(1));
    release(gone);
    assert_true(ndm_array_is_null(ndm_index(a, NDM_ARRAYS(i, gone))));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_clear_error();
    assert_true(ndm_array_is_null(ndm_index(NDM_NULL_ARRAY, NDM_ARRAYS(i))));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_manager dead = ndm_manager_new(m, "dead");
    assert_ok(ndm_manager_close(dead));
    assert_true(ndm_array_is_null(ndm_index_to(dead, a, NDM_ARRAYS(i))));
    assert_true(ndm_last_status() < 0);
    assert_true(ndm_array_is_null(ndm_cumprod_to(dead, a, 0)));
    assert_true(ndm_last_status() < 0);
    /* nothing was created, and the manager still works */
    assert_int_equal(test_live_arrays(m), live);
    ndm_array ok = ndm_index(a, NDM_ARRAYS(i));
    check_array(ok, NDM_F32, 3, (int64_t[]){2, 3, 4}, (double[24]){0});
    ndm_array arr[] = {a, i, bad, neg, f, b, three, ok};
    for (size_t q = 0; q < sizeof arr / sizeof *arr; q++)
        release(arr[q]);
}

/* ---- reference and fast kernels, thread counts -------------------------------------- */

/* Bytes of a (C order). */
static void *bytes(ndm_array a)
{
    size_t n = ndm_array_nbytes(a);
    void *p = malloc(n ? n : 1);
    assert_ok(ndm_array_copy_out(a, p, n));
    return p;
}

typedef ndm_array (*op_fn)(ndm_array *in);

static ndm_array op_concat(ndm_array *in) { return ndm_concat(1, NDM_ARRAYS(in[0], in[1], in[0])); }
static ndm_array op_stack(ndm_array *in) { return ndm_stack(-1, NDM_ARRAYS(in[0], in[1])); }
static ndm_array op_take(ndm_array *in) { return ndm_take(in[0], 1, in[2]); }
static ndm_array op_take0(ndm_array *in) { return ndm_take(in[0], 0, in[3]); }
static ndm_array op_gather(ndm_array *in) { return ndm_gather(in[0], 1, in[4]); }
static ndm_array op_scatter(ndm_array *in) { return ndm_scatter_add(in[0], 1, in[4], in[5]); }
static ndm_array op_scatter0(ndm_array *in) { return ndm_scatter_add(in[0], 0, in[6], in[7]); }
static ndm_array op_one_hot(ndm_array *in) { return ndm_one_hot(in[2], 400, NDM_F16); }
static ndm_array op_pad(ndm_array *in)
{
    return ndm_pad(in[1], NDM_PAD_REFLECT, 0, NDM_SHAPE(3, 2, 300, 7));
}
static ndm_array op_pad_c(ndm_array *in)
{
    return ndm_pad(in[0], NDM_PAD_CONSTANT, 2.5, NDM_SHAPE(1, 1, 0, 4));
}
static ndm_array op_tile(ndm_array *in) { return ndm_tile(in[1], NDM_SHAPE(2, 1, 3)); }
static ndm_array op_repeat(ndm_array *in) { return ndm_repeat(in[1], 1, 3); }
static ndm_array op_cumsum(ndm_array *in) { return ndm_cumsum(in[0], 0); }
static ndm_array op_cumsum1(ndm_array *in) { return ndm_cumsum(in[1], 1); }
static ndm_array op_cumprod(ndm_array *in) { return ndm_cumprod(in[0], 0); }
static ndm_array op_cumprod1(ndm_array *in) { return ndm_cumprod(in[1], 1); }
static ndm_array op_nonzero(ndm_array *in) { return ndm_nonzero(in[6]); }
static ndm_array op_nonzero1(ndm_array *in) { return ndm_nonzero(in[1]); }

/* Values in [-1, 1) with many bits, so any change of summation order shows. */
static ndm_array seeded_real(ndm_manager m, ndm_dtype t, uint64_t seed, int nd,
                             const int64_t *shape)
{
    int64_t n = prod(nd, shape);
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)(next_u64(&seed) >> 11) * 0x1p-52 - 1.0;
    ndm_array a = mk(m, t, v, nd, shape);
    free(v);
    return a;
}

/* Indices uniform in [lo, hi). */
static ndm_array seeded_idx(ndm_manager m, ndm_dtype t, uint64_t seed, int64_t lo, int64_t hi,
                            int nd, const int64_t *shape)
{
    int64_t n = prod(nd, shape);
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)(lo + (int64_t)(next_u64(&seed) % (uint64_t)(hi - lo)));
    ndm_array a = mk(m, t, v, nd, shape);
    free(v);
    return a;
}

static void test_index_reference_and_fast_agree(void **state)
{
    ndm_manager m = ROOT(state);
    int threads = ndm__num_threads();
    ndm_array other = seeded_real(m, NDM_F32, 171, NDM_SHAPE(400, 600));
    ndm_array in[8] = {
        seeded_real(m, NDM_F32, 170, NDM_SHAPE(600, 400)),
        ndm_transpose(other),                                      /* (600, 400), strided */
        seeded_idx(m, NDM_I32, 172, 0, 400, NDM_SHAPE(500)),
        seeded_idx(m, NDM_I64, 173, -600, 600, NDM_SHAPE(2, 300)),
        seeded_idx(m, NDM_I64, 174, -400, 400, NDM_SHAPE(600, 100)),
        seeded_real(m, NDM_F32, 175, NDM_SHAPE(600, 100)),
        seeded_idx(m, NDM_U8, 176, 0, 255, NDM_SHAPE(1000, 1)),
        seeded_real(m, NDM_F32, 177, NDM_SHAPE(1000, 400)),
    };
    const struct {
        const char *name;
        op_fn fn;
    } ops[] = {
        {"concat", op_concat},   {"stack", op_stack},       {"take", op_take},
        {"take0", op_take0},     {"gather", op_gather},     {"scatter", op_scatter},
        {"scatter0", op_scatter0}, {"one_hot", op_one_hot}, {"pad", op_pad},
        {"pad_c", op_pad_c},     {"tile", op_tile},         {"repeat", op_repeat},
        {"cumsum", op_cumsum},   {"cumsum1", op_cumsum1},
        {"cumprod", op_cumprod}, {"cumprod1", op_cumprod1}, {"nonzero", op_nonzero},
        {"nonzero1", op_nonzero1},
    };
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        ndm__cpu_force_reference(true);
        ndm_array want = ops[k].fn(in);
        ndm__cpu_force_reference(false);
        assert_live(want);
        void *wb = bytes(want);
        for (int th = 1; th <= 3; th++) {
            ndm__set_num_threads(th);
            ndm_array got = ops[k].fn(in);
            ndm__set_num_threads(threads);
            assert_live(got);
            assert_int_equal(ndm_array_nbytes(got), ndm_array_nbytes(want));
            void *gb = bytes(got);
            if (memcmp(gb, wb, ndm_array_nbytes(want)))
                fail_msg("%s: fast kernel on %d threads differs from the reference", ops[k].name,
                         th);
            free(gb);
            release(got);
        }
        free(wb);
        release(want);
    }
    for (int i = 0; i < 8; i++)
        release(in[i]);
    release(other);
}

static void test_index_check_names_the_first_bad_index(void **state)
{
    ndm_manager m = ROOT(state);
    int threads = ndm__num_threads();
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(10));
    ndm_array idx = ndm_zeros(m, NDM_I64, NDM_SHAPE(1000000));
    int64_t *p = ndm_array_data(idx);
    p[700000] = 11;
    p[600000] = -11;
    for (int th = 1; th <= 3; th++) {
        ndm__set_num_threads(th);
        assert_true(ndm_array_is_null(ndm_take(a, 0, idx)));
        assert_error_has("index -11 at [600000] of the indices");
        p[10] = 10;
        assert_true(ndm_array_is_null(ndm_take(a, 0, idx)));
        assert_error_has("index 10 at [10] of the indices");
        p[10] = 0;
    }
    ndm__set_num_threads(threads);
    release(a);
    release(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_concat_every_dtype_and_axis),
        TEST(test_concat_promotes_dtypes_and_reads_views),
        TEST(test_concat_size_zero_and_one),
        TEST(test_concat_errors),
        TEST(test_stack_new_axis_and_scalars),
        TEST(test_index_output_rule),
        TEST(test_index_capped_manager_refuses_before_allocating),
        TEST(test_split_equal_views),
        TEST(test_split_indices_and_errors),
        TEST(test_flip_is_a_view),
        TEST(test_take_every_dtype_and_index_type),
        TEST(test_take_views_scalars_and_empty),
        TEST(test_take_index_errors),
        TEST(test_gather_broadcasts_like_take_along_axis),
        TEST(test_gather_views_and_errors),
        TEST(test_scatter_add_accumulates_repeats),
        TEST(test_scatter_add_broadcasts_and_converts),
        TEST(test_scatter_add_errors_leave_input_untouched),
        TEST(test_one_hot_labels),
        TEST(test_pad_modes),
        TEST(test_tile_numpy_reps),
        TEST(test_repeat_scalar_and_each),
        TEST(test_cumsum_every_dtype),
        TEST(test_cumsum_integers_widen),
        TEST(test_cumprod_every_dtype),
        TEST(test_cumprod_numpy_values),
        TEST(test_tril_triu_numpy_values),
        TEST(test_sort_numpy_and_torch_values),
        TEST(test_topk_largest_and_smallest),
        TEST(test_nonzero_numpy_argwhere),
        TEST(test_masked_select_broadcasts),
        TEST(test_index_leading_axes_like_numpy),
        TEST(test_index_errors_name_the_index_and_axis),
        TEST(test_index_reference_and_fast_agree),
        TEST(test_index_check_names_the_first_bad_index),
    };
    return cmocka_run_group_tests_name("index", tests, NULL, NULL);
}
