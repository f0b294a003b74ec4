/* Elementwise operations: every op against float64 results computed here,
 * over dtypes, broadcast shapes, views, special values; in-place forms;
 * errors; the output rule; fast kernels against the reference ones. */
#include <pthread.h>

#include "ew_testutil.h"

#include "backends/backend.h"
#include "backends/cpu/parallel.h"

/* Internal hooks of the CPU elementwise backend (lib/backends/cpu/ew_cpu.h). */
int ndm__ew_isa_select(const char *name);
void ndm__ew_set_stream_min(int64_t bytes);

/* ---- binary ops and their oracle ------------------------------------------ */

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAX, B_MIN, B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE,
       B_AND, B_OR, B_XOR, B_COUNT };

typedef ndm_array (*bin_fn)(const char *, int, const char *, ndm_manager, ndm_array, ndm_array);
static const struct {
    const char *name;
    bin_fn fn;
} bops[B_COUNT] = {
    {"add", ndm_add_to_at},         {"sub", ndm_sub_to_at},         {"mul", ndm_mul_to_at},
    {"div", ndm_div_to_at},         {"pow", ndm_pow_to_at},         {"maximum", ndm_maximum_to_at},
    {"minimum", ndm_minimum_to_at}, {"eq", ndm_eq_to_at},           {"ne", ndm_ne_to_at},
    {"lt", ndm_lt_to_at},           {"le", ndm_le_to_at},           {"gt", ndm_gt_to_at},
    {"ge", ndm_ge_to_at},           {"logical_and", ndm_logical_and_to_at},
    {"logical_or", ndm_logical_or_to_at}, {"logical_xor", ndm_logical_xor_to_at},
};

static ndm_dtype compute_of(ndm_dtype t) { return t == NDM_F16 || t == NDM_BF16 ? NDM_F32 : t; }

static void bin_types(int op, ndm_dtype a, ndm_dtype b, ndm_dtype *ct, ndm_dtype *rt)
{
    ndm_dtype t = promo[a][b];
    if (op >= B_AND) {
        *ct = *rt = NDM_BOOL;
        return;
    }
    if (op >= B_EQ) {
        *ct = compute_of(t);
        *rt = NDM_BOOL;
        return;
    }
    if (op == B_DIV && !is_float_dt(t))
        t = NDM_F32;
    *ct = compute_of(t);
    *rt = t;
}

static int64_t wrap_to(int64_t v, ndm_dtype t)
{
    switch (t) {
    case NDM_BOOL: return v != 0;
    case NDM_U8: return (uint8_t)v;
    case NDM_I32: return (int32_t)v;
    default: return v;
    }
}

/* An element converted to a float computation dtype (one rounding). */
static double as_float_ct(const void *buf, ndm_dtype t, int64_t i, ndm_dtype ct)
{
    if (t == NDM_I64 && ct == NDM_F32)
        return (float)host_geti(buf, t, i);
    double v = host_get(buf, t, i);
    return ct == NDM_F32 ? (double)(float)v : v;
}

static int64_t ipow_test(int64_t x, int64_t y)
{
    if (y < 0)
        return x == 1 ? 1 : x == -1 ? (y % 2 ? -1 : 1) : 0;
    uint64_t r = 1;
    for (int64_t k = 0; k < y; k++)
        r *= (uint64_t)x;
    return (int64_t)r;
}

/* The expected element in the result dtype: a double for float results,
 * exact in *exact for integer and bool ones (also returned, rounded). */
static double expect_bin_x(int op, ndm_dtype ct, ndm_dtype rt, const void *ab, ndm_dtype ad,
                           int64_t ai, const void *bb, ndm_dtype bd, int64_t bi, int64_t *exact)
{
    *exact = 0;
    if (is_float_dt(ct)) {
        double x = as_float_ct(ab, ad, ai, ct), y = as_float_ct(bb, bd, bi, ct), r = 0;
        switch (op) {
        case B_ADD: r = x + y; break;
        case B_SUB: r = x - y; break;
        case B_MUL: r = x * y; break;
        case B_DIV: r = x / y; break;
        case B_POW: r = pow(x, y); break;
        case B_MAX: r = isnan(x) || isnan(y) ? NAN : x > y ? x : y; break;
        case B_MIN: r = isnan(x) || isnan(y) ? NAN : x < y ? x : y; break;
        case B_EQ: return (double)(*exact = x == y);
        case B_NE: return (double)(*exact = x != y);
        case B_LT: return (double)(*exact = x < y);
        case B_LE: return (double)(*exact = x <= y);
        case B_GT: return (double)(*exact = x > y);
        case B_GE: return (double)(*exact = x >= y);
        }
        if (ct == NDM_F32)
            r = (float)r;
        return round_to(rt, r);
    }
    int64_t x, y;
    if (ct == NDM_BOOL) {
        x = host_get(ab, ad, ai) != 0 || (ad == NDM_I64 && host_geti(ab, ad, ai) != 0);
        y = host_get(bb, bd, bi) != 0 || (bd == NDM_I64 && host_geti(bb, bd, bi) != 0);
    } else {
        x = host_geti(ab, ad, ai);
        y = host_geti(bb, bd, bi);
    }
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    int64_t r = 0;
    switch (op) {
    case B_ADD: r = (int64_t)(ux + uy); break;
    case B_SUB: r = (int64_t)(ux - uy); break;
    case B_MUL: r = (int64_t)(ux * uy); break;
    case B_POW: r = ipow_test(x, y); break;
    case B_MAX: r = x > y ? x : y; break;
    case B_MIN: r = x < y ? x : y; break;
    case B_EQ: r = x == y; break;
    case B_NE: r = x != y; break;
    case B_LT: r = x < y; break;
    case B_LE: r = x <= y; break;
    case B_GT: r = x > y; break;
    case B_GE: r = x >= y; break;
    case B_AND: r = x && y; break;
    case B_OR: r = x || y; break;
    case B_XOR: r = !x != !y; break;
    }
    *exact = wrap_to(r, rt);
    return (double)*exact;
}

static double expect_bin(int op, ndm_dtype ct, ndm_dtype rt, const void *ab, ndm_dtype ad,
                         int64_t ai, const void *bb, ndm_dtype bd, int64_t bi)
{
    int64_t exact;
    return expect_bin_x(op, ct, rt, ab, ad, ai, bb, bd, bi, &exact);
}

static double rtol_of(ndm_dtype rt, bool exact)
{
    if (rt == NDM_F16)
        return exact ? 0 : 2e-3;
    if (rt == NDM_BF16)
        return exact ? 0 : 1.6e-2;
    if (rt == NDM_F32)
        return exact ? 0 : 4e-7;
    return exact ? 0 : 1e-15;
}

/* The broadcast shape of a and b, computed here. */
static int bshape(ndm_array a, ndm_array b, int64_t *out)
{
    int64_t sa[32], sb[32];
    int na = ndm_array_shape(a, sa, 32), nb = ndm_array_shape(b, sb, 32);
    int nd = na > nb ? na : nb;
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - na), ib = d - (nd - nb);
        int64_t x = ia >= 0 ? sa[ia] : 1, y = ib >= 0 ? sb[ib] : 1;
        out[d] = x == 1 ? y : x;
    }
    return nd;
}

/* Run op on a and b and check dtype, shape and every element. */
static void check_binary(int op, ndm_array a, ndm_array b)
{
    ndm_dtype ad = ndm_array_dtype(a), bd = ndm_array_dtype(b), ct, rt;
    bin_types(op, ad, bd, &ct, &rt);
    ndm_array c = bops[op].fn(__FILE__, __LINE__, __func__, NDM_OUTPUT_RULE, a, b);
    if (!c.id)
        fail_msg("%s(%s, %s) failed: %s", bops[op].name, ndm_dtype_short(ad),
                 ndm_dtype_short(bd), ndm_last_error());
    if (ndm_array_dtype(c) != rt)
        fail_msg("%s(%s, %s) gave %s, expected %s", bops[op].name, ndm_dtype_short(ad),
                 ndm_dtype_short(bd), ndm_dtype_short(ndm_array_dtype(c)), ndm_dtype_short(rt));
    int64_t shape[32], cshape[32], sa[32], sb[32];
    int nd = bshape(a, b, shape);
    assert_int_equal(ndm_array_shape(c, cshape, 32), nd);
    for (int d = 0; d < nd; d++)
        assert_int_equal(cshape[d], shape[d]);
    int na = ndm_array_shape(a, sa, 32), nb = ndm_array_shape(b, sb, 32);
    int64_t n, n1, n2;
    void *hc = read_all(c, &n), *ha = read_all(a, &n1), *hb = read_all(b, &n2);
    bool exact = op != B_POW;
    for (int64_t i = 0; i < n; i++) {
        int64_t ai = bcast_index(i, nd, shape, na, sa), bi = bcast_index(i, nd, shape, nb, sb);
        int64_t iwant;
        double want = expect_bin_x(op, ct, rt, ha, ad, ai, hb, bd, bi, &iwant);
        if (is_float_dt(rt)) {
            double got = host_get(hc, rt, i);
            if (!close_to(got, want, rtol_of(rt, exact), 0))
                fail_msg("%s(%s %.9g, %s %.9g) at %lld: got %.9g, want %.9g", bops[op].name,
                         ndm_dtype_short(ad), host_get(ha, ad, ai), ndm_dtype_short(bd),
                         host_get(hb, bd, bi), (long long)i, got, want);
        } else {
            int64_t got = host_geti(hc, rt, i);
            if (got != iwant)
                fail_msg("%s(%s %lld, %s %lld) at %lld: got %lld, want %lld", bops[op].name,
                         ndm_dtype_short(ad), (long long)host_geti(ha, ad, ai),
                         ndm_dtype_short(bd), (long long)host_geti(hb, bd, bi), (long long)i,
                         (long long)got, (long long)iwant);
        }
    }
    free(hc);
    free(ha);
    free(hb);
    REL(c);
}

static bool bool_refused(int op, ndm_dtype a, ndm_dtype b)
{
    return promo[a][b] == NDM_BOOL && (op == B_SUB || op == B_POW);
}

static void test_binary_every_op_f32_matches_f64(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {1};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(37, 129), &r, true);
    ndm_array b = rand_array(m, NDM_F32, NDM_SHAPE(37, 129), &r, true);
    for (int op = 0; op < B_COUNT; op++)
        check_binary(op, a, b);
    REL(a);
    REL(b);
}

static void test_binary_every_dtype_pair(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {2};
    for (int i = 0; i < N_DTYPES; i++) {
        for (int j = 0; j < N_DTYPES; j++) {
            ndm_array a = rand_array(m, all_dtypes[i], NDM_SHAPE(3, 67), &r, true);
            ndm_array b = rand_array(m, all_dtypes[j], NDM_SHAPE(67), &r, true);
            for (int op = 0; op < B_COUNT; op++) {
                if (op == B_POW || bool_refused(op, all_dtypes[i], all_dtypes[j]))
                    continue;
                check_binary(op, a, b);
            }
            REL(a);
            REL(b);
        }
    }
}

/* Small exponents keep the integer oracle's loop short. */
static void test_binary_pow_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {3};
    for (int i = 1; i < N_DTYPES; i++) {
        for (int j = 1; j < N_DTYPES; j++) {
            ndm_dtype ad = all_dtypes[i], bd = all_dtypes[j];
            int64_t n = 96;
            ndm_array a = rand_array(m, ad, NDM_SHAPE(96), &r, true);
            void *eb = malloc(8 * (size_t)n);
            for (int64_t k = 0; k < n; k++)
                host_set(eb, bd, k, bd == NDM_U8 ? (double)(k % 7) : (double)(k % 10) - 3);
            ndm_array b = ndm_from_buffer(m, bd, eb, NDM_SHAPE(96));
            free(eb);
            check_binary(B_POW, a, b);
            REL(a);
            REL(b);
        }
    }
}

static void test_binary_integer_overflow_wraps(void **state)
{
    ndm_manager m = ROOT(state);
    int32_t x[4] = {INT32_MAX, INT32_MIN, 65536, -7};
    int32_t y[4] = {1, 1, 65536, 3};
    ndm_array a = ndm_from_buffer(m, NDM_I32, x, NDM_SHAPE(4));
    ndm_array b = ndm_from_buffer(m, NDM_I32, y, NDM_SHAPE(4));
    ndm_array s = ndm_add(a, b), d = ndm_sub(a, b), p = ndm_mul(a, b), q = ndm_pow(a, b);
    int32_t hs[4], hd[4], hp[4], hq[4];
    assert_ok(ndm_array_copy_out(s, hs, sizeof hs));
    assert_ok(ndm_array_copy_out(d, hd, sizeof hd));
    assert_ok(ndm_array_copy_out(p, hp, sizeof hp));
    assert_ok(ndm_array_copy_out(q, hq, sizeof hq));
    assert_int_equal(hs[0], INT32_MIN);
    assert_int_equal(hd[1], INT32_MAX);
    assert_int_equal(hp[2], 0); /* 2^32 wraps to 0 */
    assert_int_equal(hq[3], -343);
    uint8_t u[2] = {250, 3}, v[2] = {10, 5};
    ndm_array ua = ndm_from_buffer(m, NDM_U8, u, NDM_SHAPE(2));
    ndm_array ub = ndm_from_buffer(m, NDM_U8, v, NDM_SHAPE(2));
    ndm_array us = ndm_add(ua, ub), ud = ndm_sub(ub, ua);
    uint8_t hus[2], hud[2];
    assert_ok(ndm_array_copy_out(us, hus, 2));
    assert_ok(ndm_array_copy_out(ud, hud, 2));
    assert_int_equal(hus[0], 4);
    assert_int_equal(hud[0], 16);
    assert_int_equal(hud[1], 2);
    ndm_array all[] = {a, b, s, d, p, q, ua, ub, us, ud};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        REL(all[i]);
}

static void test_binary_broadcast_shapes(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {4};
    struct {
        int na;
        int64_t a[4];
        int nb;
        int64_t b[4];
    } cases[] = {
        {3, {3, 1, 5}, 2, {4, 1}},   {1, {1}, 2, {2, 3}},       {0, {0}, 2, {2, 3}},
        {2, {0, 3}, 1, {3}},         {2, {2, 0}, 1, {1}},       {0, {0}, 0, {0}},
        {4, {2, 1, 3, 1}, 3, {1, 3, 5}}, {2, {1, 1}, 2, {1, 1}}, {1, {5}, 2, {1, 5}},
        {3, {2, 3, 4}, 3, {2, 3, 4}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ndm_array a = rand_array(m, NDM_F32, cases[c].na, cases[c].a, &r, false);
        ndm_array b = rand_array(m, NDM_I32, cases[c].nb, cases[c].b, &r, false);
        check_binary(B_ADD, a, b);
        check_binary(B_LT, b, a);
        check_binary(B_MAX, a, b);
        REL(a);
        REL(b);
    }
}

static void test_binary_noncontiguous_views(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {5};
    ndm_array base = rand_array(m, NDM_F32, NDM_SHAPE(24, 40), &r, true);
    ndm_array other = rand_array(m, NDM_F64, NDM_SHAPE(40, 24), &r, true);
    ndm_array t = ndm_transpose(other);                     /* f64[24,40], strides (1, 24) */
    ndm_array s = ndm_slice(base, 1, 1, NDM_END, 3);         /* every third column */
    ndm_array rev = ndm_slice(base, 0, NDM_END, NDM_END, -1); /* rows reversed */
    ndm_array rs = ndm_slice(t, 1, 1, NDM_END, 3);
    ndm_array col = ndm_slice(base, 1, 0, 1, 1);             /* f32[24,1], broadcast */
    ndm_array row = ndm_select(base, 0, 5);                  /* f32[40] */
    ndm_array ex = ndm_expand(ndm_slice(row, 0, 0, 1, 1), NDM_SHAPE(24, 40)); /* stride 0 */
    check_binary(B_ADD, base, t);
    check_binary(B_MUL, t, rev);
    check_binary(B_SUB, s, rs);
    check_binary(B_DIV, rev, col);
    check_binary(B_MAX, col, row);
    check_binary(B_GE, ex, rev);
    check_binary(B_MIN, rev, rev);
    ndm_array views[] = {base, other, t, s, rev, rs, col, row, ex};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++)
        REL(views[i]);
    /* ndm_expand's inner slice is still alive: release what remains. */
    assert_int_equal(test_live_arrays(m), 1);
    assert_ok(ndm_scope_release_all(m));
}

/* Ranks above the stack scratch of the dispatchers and the CPU walk. */
static void test_binary_high_rank_views(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {14};
    int64_t shape[20];
    for (int i = 0; i < 20; i++)
        shape[i] = i % 3 == 0 ? 2 : 1 + (i % 2);
    ndm_array a = rand_array(m, NDM_F32, 20, shape, &r, false);
    ndm_array t = ndm_transpose(a);
    ndm_array b = rand_array(m, NDM_F32, 20, shape, &r, false);
    ndm_array bt = ndm_transpose(b);
    check_binary(B_ADD, t, bt);
    check_binary(B_MUL, a, ndm_slice(b, 0, NDM_END, NDM_END, -1));
    ndm_array sq = ndm_select(a, 19, 0); /* rank 19, broadcast against rank 20 */
    check_binary(B_SUB, b, sq);
    ndm_array e = ndm_exp(t);
    assert_live(e);
    assert_ok(ndm_add_(t, bt));
    assert_ok(ndm_copy_into(bt, t));
    assert_ok(ndm_scope_release_all(m));
}

static void test_binary_zero_d_and_size_zero(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_scalar(m, NDM_F32, 2.5), y = ndm_scalar(m, NDM_I64, 3);
    ndm_array z = ndm_mul(x, y);
    assert_int_equal(ndm_array_ndim(z), 0);
    double v;
    assert_ok(ndm_item(z, &v));
    assert_true(v == 7.5);
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 4));
    ndm_array f = ndm_add(e, x);
    assert_int_equal(ndm_array_size(f), 0);
    assert_int_equal(ndm_array_dim(f, 1), 4);
    ndm_array g = ndm_exp(e);
    assert_int_equal(ndm_array_size(g), 0);
    ndm_array all[] = {x, y, z, e, f, g};
    for (size_t i = 0; i < 6; i++)
        REL(all[i]);
}

static void test_compare_nan_and_inf(void **state)
{
    ndm_manager m = ROOT(state);
    float x[6] = {NAN, NAN, 1.0f, INFINITY, -INFINITY, -0.0f};
    float y[6] = {NAN, 1.0f, NAN, INFINITY, 0.0f, 0.0f};
    ndm_array a = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(6));
    ndm_array b = ndm_from_buffer(m, NDM_F32, y, NDM_SHAPE(6));
    for (int op = B_EQ; op <= B_GE; op++)
        check_binary(op, a, b);
    ndm_array eq = ndm_eq(a, b), ne = ndm_ne(a, b), mx = ndm_maximum(a, b);
    uint8_t he[6], hn[6];
    float hm[6];
    assert_ok(ndm_array_copy_out(eq, he, 6));
    assert_ok(ndm_array_copy_out(ne, hn, 6));
    assert_ok(ndm_array_copy_out(mx, hm, sizeof hm));
    assert_int_equal(he[0], 0);
    assert_int_equal(hn[0], 1);
    assert_int_equal(he[3], 1);
    assert_int_equal(he[5], 1); /* -0 == 0 */
    assert_true(isnan(hm[0]) && isnan(hm[1]) && isnan(hm[2]));
    assert_true(hm[3] == INFINITY && hm[4] == 0.0f);
    ndm_array all[] = {a, b, eq, ne, mx};
    for (size_t i = 0; i < 5; i++)
        REL(all[i]);
}

static void test_logical_ops_any_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {6};
    for (int i = 0; i < N_DTYPES; i++) {
        ndm_array a = rand_array(m, all_dtypes[i], NDM_SHAPE(5, 33), &r, true);
        ndm_array b = rand_array(m, all_dtypes[(i + 3) % N_DTYPES], NDM_SHAPE(33), &r, true);
        check_binary(B_AND, a, b);
        check_binary(B_OR, a, b);
        check_binary(B_XOR, b, a);
        ndm_array n = ndm_logical_not(a);
        assert_int_equal(ndm_array_dtype(n), NDM_BOOL);
        int64_t cnt, k;
        void *hn = read_all(n, &cnt), *ha = read_all(a, &k);
        for (int64_t e = 0; e < cnt; e++) {
            bool truth = host_get(ha, all_dtypes[i], e) != 0;
            assert_int_equal(((uint8_t *)hn)[e], !truth);
        }
        free(hn);
        free(ha);
        REL(n);
        REL(a);
        REL(b);
    }
}

static void test_where_broadcasts_and_promotes(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {7};
    ndm_array cond = rand_array(m, NDM_F32, NDM_SHAPE(4, 1, 9), &r, true);
    ndm_array a = rand_array(m, NDM_I32, NDM_SHAPE(3, 1), &r, false);
    ndm_array b = rand_array(m, NDM_F16, NDM_SHAPE(9), &r, true);
    ndm_array w = ndm_where(cond, a, b);
    assert_live(w);
    assert_int_equal(ndm_array_dtype(w), NDM_F16);
    int64_t shape[3];
    assert_int_equal(ndm_array_shape(w, shape, 3), 3);
    assert_true(shape[0] == 4 && shape[1] == 3 && shape[2] == 9);
    int64_t n, k;
    void *hw = read_all(w, &n), *hc = read_all(cond, &k), *ha = read_all(a, &k),
         *hb = read_all(b, &k);
    for (int64_t i = 0; i < n; i++) {
        int64_t i0 = i / 27, i1 = (i / 9) % 3, i2 = i % 9;
        bool c = host_get(hc, NDM_F32, i0 * 9 + i2) != 0;
        double want = c ? round_to(NDM_F16, host_get(ha, NDM_I32, i1)) : host_get(hb, NDM_F16, i2);
        double got = host_get(hw, NDM_F16, i);
        assert_true(close_to(got, want, 0, 0));
    }
    free(hw);
    free(hc);
    free(ha);
    free(hb);
    /* stride-0 condition and operands */
    ndm_array t = ndm_scalar(m, NDM_BOOL, 1);
    ndm_array w2 = ndm_where(t, ndm_scalar(m, NDM_F64, 2), b);
    assert_live(w2);
    assert_int_equal(ndm_array_dtype(w2), NDM_F64);
    double v[9];
    assert_ok(ndm_array_copy_out(w2, v, sizeof v));
    for (int i = 0; i < 9; i++)
        assert_true(v[i] == 2.0);
    assert_ok(ndm_scope_release_all(m));
}

/* ---- scalars ---------------------------------------------------------------- */

typedef ndm_array (*scal_fn)(const char *, int, const char *, ndm_manager, ndm_array, double);

static void check_scalar_op(scal_fn fn, const char *name, int op, bool swap, ndm_array a, double s,
                            ndm_dtype want_rt)
{
    ndm_array c = fn(__FILE__, __LINE__, __func__, NDM_OUTPUT_RULE, a, s);
    if (!c.id)
        fail_msg("%s(%g) failed: %s", name, s, ndm_last_error());
    ndm_dtype rt = ndm_array_dtype(c);
    if (rt != want_rt)
        fail_msg("%s on %s with %g gave %s, expected %s", name,
                 ndm_dtype_short(ndm_array_dtype(a)), s, ndm_dtype_short(rt),
                 ndm_dtype_short(want_rt));
    ndm_dtype ad = ndm_array_dtype(a);
    ndm_dtype ct = op >= B_EQ ? (is_float_dt(ad) ? compute_of(ad) : ad) : compute_of(rt);
    if (op >= B_EQ && !is_float_dt(ad) &&
        !(floor(s) == s && isfinite(s) &&
          (ad == NDM_BOOL ? (s == 0 || s == 1)
                          : ad == NDM_U8 ? (s >= 0 && s <= 255)
                                         : ad == NDM_I32 ? fabs(s) <= 2147483647.0 : true)))
        ct = NDM_F64;
    /* the scalar as a one-element buffer of the array's dtype (its weak type) */
    unsigned char sb[8];
    ndm_dtype sd = is_float_dt(ad) ? ad : is_float_dt(ct) ? ct : ct;
    host_set(sb, sd, 0, s);
    int64_t n, k;
    void *hc = read_all(c, &n), *ha = read_all(a, &k);
    for (int64_t i = 0; i < n; i++) {
        double want = swap ? expect_bin(op, ct, rt, sb, sd, 0, ha, ad, i)
                           : expect_bin(op, ct, rt, ha, ad, i, sb, sd, 0);
        double got = host_get(hc, rt, i);
        if (!close_to(got, want, op == B_POW ? rtol_of(rt, false) : 0, 0))
            fail_msg("%s(%s %.9g, %g) at %lld: got %.9g want %.9g", name, ndm_dtype_short(ad),
                     host_get(ha, ad, i), s, (long long)i, got, want);
    }
    free(hc);
    free(ha);
    REL(c);
}

static void test_scalar_ops_values_and_dtypes(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {8};
    const struct {
        scal_fn fn;
        const char *name;
        int op;
        bool swap;
    } ops[] = {
        {ndm_add_scalar_to_at, "add_scalar", B_ADD, false},
        {ndm_sub_scalar_to_at, "sub_scalar", B_SUB, false},
        {ndm_rsub_scalar_to_at, "rsub_scalar", B_SUB, true},
        {ndm_mul_scalar_to_at, "mul_scalar", B_MUL, false},
        {ndm_div_scalar_to_at, "div_scalar", B_DIV, false},
        {ndm_rdiv_scalar_to_at, "rdiv_scalar", B_DIV, true},
        {ndm_pow_scalar_to_at, "pow_scalar", B_POW, false},
        {ndm_rpow_scalar_to_at, "rpow_scalar", B_POW, true},
        {ndm_maximum_scalar_to_at, "maximum_scalar", B_MAX, false},
        {ndm_minimum_scalar_to_at, "minimum_scalar", B_MIN, false},
        {ndm_eq_scalar_to_at, "eq_scalar", B_EQ, false},
        {ndm_ne_scalar_to_at, "ne_scalar", B_NE, false},
        {ndm_lt_scalar_to_at, "lt_scalar", B_LT, false},
        {ndm_le_scalar_to_at, "le_scalar", B_LE, false},
        {ndm_gt_scalar_to_at, "gt_scalar", B_GT, false},
        {ndm_ge_scalar_to_at, "ge_scalar", B_GE, false},
    };
    const double scalars[] = {2.0, -3.0, 0.1, 2.5, NAN, INFINITY};
    for (int di = 1; di < N_DTYPES; di++) {
        ndm_dtype t = all_dtypes[di];
        ndm_array a = rand_array(m, t, NDM_SHAPE(2, 45), &r, true);
        for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) {
            for (size_t si = 0; si < sizeof scalars / sizeof *scalars; si++) {
                double s = scalars[si];
                int op = ops[oi].op;
                bool integral = floor(s) == s && isfinite(s);
                ndm_dtype rt = op >= B_EQ ? NDM_BOOL
                               : is_float_dt(t) ? t
                               : !integral     ? NDM_F32
                                               : t;
                if (op == B_DIV && !is_float_dt(rt))
                    rt = NDM_F32;
                if (!is_float_dt(rt) && rt != NDM_BOOL && t == NDM_U8 && s < 0) {
                    ndm_clear_error();
                    ndm_array bad = ops[oi].fn(NDM_HERE, NDM_OUTPUT_RULE, a, s);
                    assert_int_equal(bad.id, 0);
                    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
                    assert_error_has("does not fit uint8");
                    continue;
                }
                if (op == B_POW && !is_float_dt(rt) && (ops[oi].swap || s < 0))
                    continue; /* exponents from the array: covered by the array forms */
                check_scalar_op(ops[oi].fn, ops[oi].name, op, ops[oi].swap, a, s, rt);
            }
        }
        REL(a);
    }
}

static void test_scalar_weak_typing_rules(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array b = ndm_ones(m, NDM_BOOL, NDM_SHAPE(3));
    ndm_array u = ndm_full(m, NDM_U8, 200, NDM_SHAPE(3));
    ndm_array h = ndm_full(m, NDM_F16, 0.1, NDM_SHAPE(3));
    ndm_array x;
    /* bool with an integer scalar gives i64 */
    x = ndm_add_scalar(b, 1);
    assert_int_equal(ndm_array_dtype(x), NDM_I64);
    REL(x);
    /* integer with an integral scalar keeps its dtype and wraps */
    x = ndm_add_scalar(u, 100);
    assert_int_equal(ndm_array_dtype(x), NDM_U8);
    int64_t v;
    assert_ok(ndm_item_i64(ndm_select(x, 0, 0), &v));
    assert_int_equal(v, 44);
    REL(x);
    /* a scalar that does not fit the integer dtype is refused */
    ndm_clear_error();
    x = ndm_add_scalar(u, 300);
    assert_int_equal(x.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("300 does not fit uint8");
    /* comparisons never refuse: 200 < 300 everywhere */
    x = ndm_lt_scalar(u, 300);
    assert_live(x);
    uint8_t lt[3];
    assert_ok(ndm_array_copy_out(x, lt, 3));
    assert_true(lt[0] && lt[1] && lt[2]);
    REL(x);
    /* f16 compares with the f16 value of the scalar (numpy's weak scalar) */
    x = ndm_eq_scalar(h, 0.1);
    assert_ok(ndm_array_copy_out(x, lt, 3));
    assert_true(lt[0] && lt[1] && lt[2]);
    REL(x);
    /* a fractional scalar makes an integer result f32 */
    x = ndm_mul_scalar(u, 0.5);
    assert_int_equal(ndm_array_dtype(x), NDM_F32);
    REL(x);
    assert_ok(ndm_scope_release_all(m));
}

/* pow with the exponents that take call-free loops equals C's pow exactly,
 * signed zeros and infinities included. */
static void test_pow_scalar_common_exponents(void **state)
{
    ndm_manager m = ROOT(state);
    const double x[] = {NAN,  INFINITY, -INFINITY, 0.0,   -0.0, 1.0, -1.0,
                        2.0,  -2.0,     0.25,      1e-30, 3e38, -7.5};
    const double ys[] = {2, 1, 0, -1, 0.5, 3};
    ndm_dtype dts[] = {NDM_F32, NDM_F64};
    for (int d = 0; d < 2; d++) {
        ndm_array a = ndm_from_buffer(m, NDM_F64, x, NDM_SHAPE(13));
        ndm_array ad = ndm_astype(a, dts[d]);
        for (size_t k = 0; k < sizeof ys / sizeof *ys; k++) {
            ndm_array p = ndm_pow_scalar(ad, ys[k]);
            double got[13];
            ndm_array pd = ndm_astype(p, NDM_F64);
            assert_ok(ndm_array_copy_out(pd, got, sizeof got));
            for (int i = 0; i < 13; i++) {
                double want = dts[d] == NDM_F32 ? (double)powf((float)x[i], (float)ys[k])
                                                 : pow(x[i], ys[k]);
                bool same = isnan(want) ? isnan(got[i])
                                        : got[i] == want && signbit(got[i]) == signbit(want);
                if (!same && !(ys[k] == 3 && close_to(got[i], want, 2.5e-7, 0)))
                    fail_msg("pow(%s %g, %g): got %.17g, want %.17g", ndm_dtype_short(dts[d]),
                             x[i], ys[k], got[i], want);
            }
            REL(p);
            REL(pd);
        }
        REL(a);
        REL(ad);
    }
}

/* ---- in place ---------------------------------------------------------------- */

static void test_inplace_ops_write_first_input(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {9};
    typedef ndm_status (*ip_fn)(const char *, int, const char *, ndm_array, ndm_array);
    const struct {
        ip_fn fn;
        int op;
    } ops[] = {{ndm_add_inplace_at, B_ADD},         {ndm_sub_inplace_at, B_SUB},
               {ndm_mul_inplace_at, B_MUL},         {ndm_div_inplace_at, B_DIV},
               {ndm_pow_inplace_at, B_POW},         {ndm_maximum_inplace_at, B_MAX},
               {ndm_minimum_inplace_at, B_MIN}};
    ndm_dtype dts[] = {NDM_F32, NDM_F16, NDM_F64};
    for (size_t d = 0; d < 3; d++) {
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
            ndm_array a = rand_array(m, dts[d], NDM_SHAPE(6, 50), &r, true);
            ndm_array b = rand_array(m, NDM_F32, NDM_SHAPE(50), &r, true);
            /* the expected result: the returning form, cast to a's dtype */
            ndm_array want = bops[ops[i].op].fn(NDM_HERE, NDM_OUTPUT_RULE, a, b);
            ndm_array wc = ndm_astype(want, dts[d]);
            int64_t id_before = (int64_t)a.id;
            uint64_t live = test_live_arrays(m);
            assert_ok(ops[i].fn(NDM_HERE, a, b));
            assert_int_equal((int64_t)a.id, id_before);
            assert_int_equal(test_live_arrays(m), live);
            int64_t n, k;
            void *ha = read_all(a, &n), *hw = read_all(wc, &k);
            for (int64_t e = 0; e < n; e++)
                assert_true(close_to(host_get(ha, dts[d], e), host_get(hw, dts[d], e),
                                     ops[i].op == B_POW ? 1e-6 : 0, 0));
            free(ha);
            free(hw);
            REL(a);
            REL(b);
            REL(want);
            REL(wc);
        }
    }
}

static void test_inplace_scalar_and_unary_forms(void **state)
{
    ndm_manager m = ROOT(state);
    float x[5] = {-2.0f, -0.5f, 0.0f, 1.5f, 3.0f};
    ndm_array a = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(5));
    assert_ok(ndm_mul_scalar_(a, 2.0));   /* -4 -1 0 3 6 */
    assert_ok(ndm_add_scalar_(a, 1.0));   /* -3 0 1 4 7 */
    assert_ok(ndm_rsub_scalar_(a, 10.0)); /* 13 10 9 6 3 */
    assert_ok(ndm_sub_scalar_(a, 3.0));   /* 10 7 6 3 0 */
    assert_ok(ndm_div_scalar_(a, 2.0));   /* 5 3.5 3 1.5 0 */
    assert_ok(ndm_maximum_scalar_(a, 1.0)); /* 5 3.5 3 1.5 1 */
    assert_ok(ndm_minimum_scalar_(a, 4.0)); /* 4 3.5 3 1.5 1 */
    assert_ok(ndm_pow_scalar_(a, 2.0));   /* 16 12.25 9 2.25 1 */
    assert_ok(ndm_rdiv_scalar_(a, 36.0)); /* 2.25 ... */
    assert_ok(ndm_sqrt_(a));              /* 1.5 1.714 2 4 6 */
    assert_ok(ndm_clamp_(a, 1.0, 1.9));   /* 1.5 1.714 1.9 1.9 1.9 */
    float y[5];
    assert_ok(ndm_array_copy_out(a, y, sizeof y));
    const float want[5] = {1.5f, 1.7142857f, 1.9f, 1.9f, 1.9f};
    for (int i = 0; i < 5; i++)
        assert_true(close_to(y[i], want[i], 1e-6, 0));
    assert_ok(ndm_neg_(a));
    assert_ok(ndm_relu_(a));
    assert_ok(ndm_array_copy_out(a, y, sizeof y));
    for (int i = 0; i < 5; i++)
        assert_true(y[i] == 0.0f);
    ndm_array s = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(5));
    assert_ok(ndm_exp_(s));
    assert_ok(ndm_log_(s));
    assert_ok(ndm_array_copy_out(s, y, sizeof y));
    for (int i = 0; i < 5; i++)
        assert_true(close_to(y[i], x[i], 1e-6, 1e-6));
    REL(a);
    REL(s);
}

static void test_inplace_refuses_wider_kinds(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array i = ndm_ones(m, NDM_I32, NDM_SHAPE(4));
    ndm_array f = ndm_ones(m, NDM_F32, NDM_SHAPE(4));
    ndm_array b = ndm_ones(m, NDM_BOOL, NDM_SHAPE(4));
    ndm_clear_error();
    assert_int_equal(ndm_add_(i, f), NDM_E_DTYPE);
    assert_error_has("float32");
    assert_error_has("cannot be written into i32[4] in place");
    assert_int_equal(ndm_div_(i, i), NDM_E_DTYPE);
    assert_int_equal(ndm_exp_(i), NDM_E_DTYPE);
    assert_int_equal(ndm_add_scalar_(i, 0.5), NDM_E_DTYPE);
    assert_int_equal(ndm_add_(b, i), NDM_E_DTYPE);
    assert_int_equal(ndm_neg_(b), NDM_E_DTYPE);
    assert_error_has("neg of a bool array");
    /* narrowing within a kind is allowed: f32 += f64, u8 into i32 */
    ndm_array d = ndm_full(m, NDM_F64, 0.5, NDM_SHAPE(4));
    assert_ok(ndm_add_(f, d));
    assert_ok(ndm_add_(i, b));
    int32_t hi[4];
    assert_ok(ndm_array_copy_out(i, hi, sizeof hi));
    assert_int_equal(hi[0], 2);
    /* the destination keeps its shape */
    ndm_array wide = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 4));
    assert_int_equal(ndm_add_(f, wide), NDM_E_SHAPE);
    assert_error_has("cannot broadcast f32[2,4] into f32[4]");
    /* a broadcast view cannot be written in place */
    ndm_array ex = ndm_expand(f, NDM_SHAPE(3, 4));
    assert_int_equal(ndm_mul_scalar_(ex, 2), NDM_E_INVALID);
    assert_error_has("broadcast view");
    assert_ok(ndm_scope_release_all(m));
}

static void test_inplace_overlapping_input_reads_a_copy(void **state)
{
    ndm_manager m = ROOT(state);
    float x[6] = {1, 2, 3, 4, 5, 6};
    ndm_array a = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(6));
    ndm_array dst = ndm_slice(a, 0, 1, NDM_END, 1); /* a[1:] */
    ndm_array src = ndm_slice(a, 0, 0, 5, 1);       /* a[:-1] */
    assert_ok(ndm_add_(dst, src));                 /* numpy: a[1:] += a[:-1] */
    float y[6];
    assert_ok(ndm_array_copy_out(a, y, sizeof y));
    const float want[6] = {1, 3, 5, 7, 9, 11};
    for (int i = 0; i < 6; i++)
        assert_true(y[i] == want[i]);
    /* reversed view of itself: a = a + a[::-1] */
    ndm_array b = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(6));
    ndm_array rb = ndm_slice(b, 0, NDM_END, NDM_END, -1);
    assert_ok(ndm_add_(b, rb));
    assert_ok(ndm_array_copy_out(b, y, sizeof y));
    for (int i = 0; i < 6; i++)
        assert_true(y[i] == 7.0f);
    /* exactly itself: a *= a */
    assert_ok(ndm_mul_(b, b));
    assert_ok(ndm_array_copy_out(b, y, sizeof y));
    assert_true(y[0] == 49.0f);
    assert_ok(ndm_scope_release_all(m));
}

static void test_inplace_works_on_capped_manager(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(8));
    ndm_array g = ndm_full(root, NDM_F32, 0.5, NDM_SHAPE(8));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    /* an SGD step: w -= lr * g, with the product in the caller's manager */
    ndm_array step = ndm_mul_scalar_to(root, g, 0.1);
    assert_ok(ndm_sub_(w, step));
    assert_ok(ndm_clamp_(w, 0.0, 0.97));
    assert_ok(ndm_copy_into(w, ndm_scalar(root, NDM_F64, 0.25)));
    /* overlapping in place on a capped manager: the scratch is no array */
    assert_ok(ndm_add_(w, ndm_slice_to_at(NDM_HERE, root, w, 0, NDM_END, NDM_END, -1)));
    float y[8];
    assert_ok(ndm_array_copy_out(w, y, sizeof y));
    assert_true(y[0] == 0.5f);
    /* a returning op on the capped model's array is refused, naming the cap */
    ndm_clear_error();
    ndm_array bad = ndm_add(w, w);
    assert_int_equal(bad.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_error_has("capped");
    ndm_stats st;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_scope_release_all(root));
}

static void test_inplace_on_closed_manager_is_stale(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager req = ndm_manager_new(root, "request");
    ndm_array a = ndm_ones(req, NDM_F32, NDM_SHAPE(4));
    ndm_array b = ndm_ones(root, NDM_F32, NDM_SHAPE(4));
    assert_ok(ndm_manager_close(req));
    ndm_clear_error();
    assert_int_equal(ndm_add_(a, b), NDM_E_CLOSED);
    assert_error_has("stale array handle");
    assert_error_has("request");
    assert_int_equal(ndm_relu_(a), NDM_E_CLOSED);
    ndm_clear_error(); /* a null handle keeps an earlier error */
    assert_int_equal(ndm_add_(b, NDM_NULL_ARRAY), NDM_E_NULL);
    REL(b);
}

/* ---- unary ------------------------------------------------------------------- */

enum { U_NEG, U_ABS, U_SIGN, U_RELU, U_FLOOR, U_CEIL, U_ROUND, U_EXP, U_LOG, U_LOG1P, U_EXPM1,
       U_SQRT, U_RSQRT, U_SIN, U_COS, U_TANH, U_SIGMOID, U_GELU, U_GELU_TANH, U_SILU, U_COUNT };

typedef ndm_array (*un_fn)(const char *, int, const char *, ndm_manager, ndm_array);
static const struct {
    const char *name;
    un_fn fn;
    bool flt;
} uops[U_COUNT] = {
    {"neg", ndm_neg_to_at, false},     {"abs", ndm_abs_to_at, false},
    {"sign", ndm_sign_to_at, false},   {"relu", ndm_relu_to_at, false},
    {"floor", ndm_floor_to_at, false}, {"ceil", ndm_ceil_to_at, false},
    {"round", ndm_round_to_at, false}, {"exp", ndm_exp_to_at, true},
    {"log", ndm_log_to_at, true},      {"log1p", ndm_log1p_to_at, true},
    {"expm1", ndm_expm1_to_at, true},  {"sqrt", ndm_sqrt_to_at, true},
    {"rsqrt", ndm_rsqrt_to_at, true},  {"sin", ndm_sin_to_at, true},
    {"cos", ndm_cos_to_at, true},      {"tanh", ndm_tanh_to_at, true},
    {"sigmoid", ndm_sigmoid_to_at, true}, {"gelu", ndm_gelu_to_at, true},
    {"gelu_tanh", ndm_gelu_tanh_to_at, true}, {"silu", ndm_silu_to_at, true},
};

static double sig_d(double x)
{
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

static double expect_un(int op, double x)
{
    switch (op) {
    case U_NEG: return -x;
    case U_ABS: return fabs(x);
    case U_SIGN: return x > 0 ? 1 : x < 0 ? -1 : x;
    case U_RELU: return x < 0 ? 0 : x;
    case U_FLOOR: return floor(x);
    case U_CEIL: return ceil(x);
    case U_ROUND: return nearbyint(x);
    case U_EXP: return exp(x);
    case U_LOG: return log(x);
    case U_LOG1P: return log1p(x);
    case U_EXPM1: return expm1(x);
    case U_SQRT: return sqrt(x);
    case U_RSQRT: return 1 / sqrt(x);
    case U_SIN: return sin(x);
    case U_COS: return cos(x);
    case U_TANH: return tanh(x);
    case U_SIGMOID: return sig_d(x);
    case U_GELU: return x == -INFINITY ? 0 : 0.5 * x * erfc(-x / sqrt(2.0));
    case U_GELU_TANH: {
        if (x == -INFINITY)
            return 0;
        double u = sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
        return x * sig_d(2 * u);
    }
    case U_SILU: return x == -INFINITY ? 0 : x * sig_d(x);
    }
    return 0;
}

/* Relative and absolute tolerance of a float function in dtype rt. */
static void un_tol(int op, ndm_dtype rt, double *rtol, double *atol)
{
    *rtol = 0;
    *atol = 0;
    if (!uops[op].flt && op != U_ROUND)
        return;
    if (op == U_ROUND)
        return;
    if (rt == NDM_F64) {
        *rtol = 1e-14;
        *atol = 1e-300;
    } else if (rt == NDM_F32) {
        *rtol = op == U_GELU_TANH ? 1e-5 : op == U_SQRT || op == U_RSQRT ? 1.2e-7 : 1.2e-6;
        *atol = op == U_SIN || op == U_COS ? 1e-7 : 1e-37;
    } else {
        *rtol = rt == NDM_F16 ? 2e-3 : 1.6e-2;
        *atol = rt == NDM_F16 ? 1e-7 : 1e-37;
    }
}

static void check_unary(int op, ndm_array a)
{
    ndm_dtype ad = ndm_array_dtype(a);
    ndm_array c = uops[op].fn(__FILE__, __LINE__, __func__, NDM_OUTPUT_RULE, a);
    if (!c.id)
        fail_msg("%s(%s) failed: %s", uops[op].name, ndm_dtype_short(ad), ndm_last_error());
    ndm_dtype rt = uops[op].flt && !is_float_dt(ad) ? NDM_F32 : ad;
    assert_int_equal(ndm_array_dtype(c), rt);
    double rtol, atol;
    un_tol(op, rt, &rtol, &atol);
    int64_t n, k;
    void *hc = read_all(c, &n), *ha = read_all(a, &k);
    assert_int_equal(n, k);
    for (int64_t i = 0; i < n; i++) {
        if (is_float_dt(rt)) {
            double x = host_get(ha, ad, i);
            if (rt == NDM_F32 || rt == NDM_F16 || rt == NDM_BF16)
                x = (float)x;
            double want = expect_un(op, x);
            if (rt != NDM_F64)
                want = round_to(rt, (float)want);
            double got = host_get(hc, rt, i);
            if (!close_to(got, want, rtol, atol))
                fail_msg("%s(%s %.9g) at %lld: got %.9g, want %.9g", uops[op].name,
                         ndm_dtype_short(ad), x, (long long)i, got, want);
        } else {
            int64_t x = host_geti(ha, ad, i), want;
            switch (op) {
            case U_NEG: want = wrap_to((int64_t)(0 - (uint64_t)x), rt); break;
            case U_ABS: want = wrap_to(x < 0 ? (int64_t)(0 - (uint64_t)x) : x, rt); break;
            case U_SIGN: want = (x > 0) - (x < 0); break;
            case U_RELU: want = x < 0 ? 0 : x; break;
            default: want = x;
            }
            int64_t got = host_geti(hc, rt, i);
            if (got != want)
                fail_msg("%s(%s %lld): got %lld, want %lld", uops[op].name, ndm_dtype_short(ad),
                         (long long)x, (long long)got, (long long)want);
        }
    }
    free(hc);
    free(ha);
    REL(c);
}

/* Inputs spread over each function's interesting range. */
static ndm_array unary_input(ndm_manager m, ndm_dtype t, int op, int64_t n, rng *r)
{
    double lo = -8, hi = 8;
    if (op == U_EXP || op == U_EXPM1)
        lo = -110, hi = 95;
    else if (op == U_LOG || op == U_SQRT || op == U_RSQRT)
        lo = 0, hi = 1e6;
    else if (op == U_LOG1P)
        lo = -1, hi = 50;
    else if (op == U_SIN || op == U_COS)
        lo = -1000, hi = 1000;
    else if (op == U_SIGMOID || op == U_SILU || op == U_TANH)
        lo = -100, hi = 100;
    else if (op == U_GELU)
        lo = -15, hi = 15;
    void *buf = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        double v = i % 3 == 0 ? rng_unif(r, -3, 3) : rng_unif(r, lo, hi);
        if (i % 17 == 0)
            v = rand_value(r, t, true);
        if (i % 23 == 0)
            v = (double)(int64_t)(v * 2) / 2; /* exact halves for rounding */
        host_set(buf, t, i, is_float_dt(t) ? v : floor(v));
    }
    ndm_array a = ndm_from_buffer(m, t, buf, NDM_SHAPE(n));
    free(buf);
    return a;
}

static void test_unary_every_op_float_dtypes(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {10};
    ndm_dtype dts[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    for (size_t d = 0; d < 4; d++)
        for (int op = 0; op < U_COUNT; op++) {
            ndm_array a = unary_input(m, dts[d], op, 2000, &r);
            check_unary(op, a);
            REL(a);
        }
}

static void test_unary_integer_and_bool_inputs(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {11};
    ndm_dtype dts[] = {NDM_U8, NDM_I32, NDM_I64, NDM_BOOL};
    for (size_t d = 0; d < 4; d++)
        for (int op = 0; op < U_COUNT; op++) {
            if (op == U_NEG && dts[d] == NDM_BOOL)
                continue;
            ndm_array a = unary_input(m, dts[d], op, 300, &r);
            check_unary(op, a);
            REL(a);
        }
    int32_t x[3] = {INT32_MIN, -5, 7};
    ndm_array a = ndm_from_buffer(m, NDM_I32, x, NDM_SHAPE(3));
    ndm_array ab = ndm_abs(a), ng = ndm_neg(a);
    int32_t y[3];
    assert_ok(ndm_array_copy_out(ab, y, sizeof y));
    assert_true(y[0] == INT32_MIN && y[1] == 5 && y[2] == 7);
    assert_ok(ndm_array_copy_out(ng, y, sizeof y));
    assert_true(y[0] == INT32_MIN && y[1] == 5 && y[2] == -7);
    ndm_clear_error();
    ndm_array bad = ndm_neg(ndm_ones(m, NDM_BOOL, NDM_SHAPE(2)));
    assert_int_equal(bad.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("ndm_logical_not");
    assert_ok(ndm_scope_release_all(m));
}

/* Floor division and the two remainders against numpy's values (signs,
 * zeros, infinities, division by zero, an inexact quotient, MIN // -1). */
static void test_floor_divide_and_remainders_match_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    double a[] = {-7, 7, -7, 7, 0, 5, -0.0, 7.5, -7.5, 1e300, 0.1, 1.0, -1.0};
    double b[] = {3, -3, -3, 3, 2, 0, 3, -2, 2, 3e-300, 0.01, INFINITY, INFINITY};
    double fd[] = {-3, -3, 2, 2, 0, INFINITY, -0.0, -4, -4, INFINITY, 10, 0, -1};
    double rem[] = {2, -2, -1, 1, 0, NAN, 0, -0.5, 0.5, 9.626317689605992e-301,
                    3.469446951953614e-18, 1, INFINITY};
    double fm[] = {-1, 1, -1, 1, 0, NAN, -0.0, 1.5, -1.5, 9.626317689605992e-301,
                   3.469446951953614e-18, 1, -1};
    enum { N = 13 };
    ndm_array x = ndm_from_buffer(m, NDM_F64, a, NDM_SHAPE(N));
    ndm_array y = ndm_from_buffer(m, NDM_F64, b, NDM_SHAPE(N));
    const double *want[3] = {fd, rem, fm};
    ndm_array got[3] = {ndm_floor_divide(x, y), ndm_remainder(x, y), ndm_fmod(x, y)};
    const char *names[3] = {"floor_divide", "remainder", "fmod"};
    for (int k = 0; k < 3; k++) {
        double v[N];
        assert_ok(ndm_array_copy_out(got[k], v, sizeof v));
        for (int i = 0; i < N; i++) {
            bool same = isnan(want[k][i]) ? isnan(v[i])
                                          : v[i] == want[k][i] &&
                                                signbit(v[i]) == signbit(want[k][i]);
            if (!same && !(fabs(want[k][i]) < 1e-17 && fabs(v[i] - want[k][i]) < 1e-30 &&
                           fabs(want[k][i]) > 0))
                fail_msg("%s(%g, %g) = %.17g, numpy gives %.17g", names[k], a[i], b[i], v[i],
                         want[k][i]);
        }
        REL(got[k]);
    }
    /* integers stay integers; x // 0 and x % 0 are 0; MIN // -1 wraps */
    int32_t ia[] = {-7, 7, -7, 7, 0, 5, INT32_MIN}, ib[] = {3, -3, -3, 3, 2, 0, -1};
    int32_t ifd[] = {-3, -3, 2, 2, 0, 0, INT32_MIN}, irem[] = {2, -2, -1, 1, 0, 0, 0},
            ifm[] = {-1, 1, -1, 1, 0, 0, 0};
    ndm_array xi = ndm_from_buffer(m, NDM_I32, ia, NDM_SHAPE(7));
    ndm_array yi = ndm_from_buffer(m, NDM_I32, ib, NDM_SHAPE(7));
    const int32_t *iwant[3] = {ifd, irem, ifm};
    ndm_array igot[3] = {ndm_floor_divide(xi, yi), ndm_remainder(xi, yi), ndm_fmod(xi, yi)};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ndm_array_dtype(igot[k]), NDM_I32);
        int32_t v[7];
        assert_ok(ndm_array_copy_out(igot[k], v, sizeof v));
        for (int i = 0; i < 7; i++)
            if (v[i] != iwant[k][i])
                fail_msg("%s(%d, %d) = %d, numpy gives %d", names[k], ia[i], ib[i], v[i],
                         iwant[k][i]);
        REL(igot[k]);
    }
    /* scalar and in-place forms agree with the array forms */
    ndm_array s = ndm_remainder_scalar(xi, -3);
    int32_t sv[7];
    assert_ok(ndm_array_copy_out(s, sv, sizeof sv));
    assert_int_equal(sv[0], -1); /* -7 % -3 */
    assert_int_equal(sv[1], -2); /* 7 % -3 */
    assert_ok(ndm_floor_divide_scalar_(xi, 2));
    assert_ok(ndm_array_copy_out(xi, sv, sizeof sv));
    assert_int_equal(sv[0], -4); /* -7 // 2 */
    assert_int_equal(sv[1], 3);
    /* bool is refused, as for subtraction */
    ndm_array t = ndm_ones(m, NDM_BOOL, NDM_SHAPE(2));
    assert_int_equal(ndm_remainder(t, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    REL(s);
    REL(t);
    REL(x);
    REL(y);
    REL(xi);
    REL(yi);
}

static void test_unary_special_values(void **state)
{
    ndm_manager m = ROOT(state);
    const float sp[] = {NAN,      INFINITY, -INFINITY, 0.0f,   -0.0f,  1e-40f, -1e-40f,
                        1.4e-45f, 1.0f,     -1.0f,     88.7f,  88.73f, -87.5f, -103.5f,
                        1e30f,    -1e30f,   0.5f,      -0.5f,  2.5f,   -2.5f,  1e-7f,
                        -1e-7f,   6000.0f,  7000.0f,   3.14159265f, 1e7f};
    ndm_array a = ndm_from_buffer(m, NDM_F32, sp, NDM_SHAPE((int64_t)(sizeof sp / sizeof *sp)));
    ndm_array d = ndm_astype(a, NDM_F64);
    for (int op = 0; op < U_COUNT; op++) {
        check_unary(op, a);
        check_unary(op, d);
    }
    REL(a);
    REL(d);
}

static void test_round_half_to_even(void **state)
{
    ndm_manager m = ROOT(state);
    const double x[] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999999, 4503599627370497.0, -0.0};
    const double want[] = {0, 2, 2, -0.0, -2, -2, 3, 4503599627370497.0, -0.0};
    ndm_array a = ndm_from_buffer(m, NDM_F64, x, NDM_SHAPE(9));
    ndm_array f = ndm_astype(a, NDM_F32);
    ndm_array ra = ndm_round(a), rf = ndm_round(f);
    double y[9];
    float z[9];
    assert_ok(ndm_array_copy_out(ra, y, sizeof y));
    assert_ok(ndm_array_copy_out(rf, z, sizeof z));
    for (int i = 0; i < 9; i++) {
        assert_true(y[i] == want[i] && signbit(y[i]) == signbit(want[i]));
        assert_true(z[i] == (float)nearbyint((float)x[i]));
    }
    assert_ok(ndm_scope_release_all(m));
}

static void test_clamp_rules(void **state)
{
    ndm_manager m = ROOT(state);
    float x[5] = {-3, 0.5f, NAN, 7, 2};
    ndm_array a = ndm_from_buffer(m, NDM_F32, x, NDM_SHAPE(5));
    ndm_array c = ndm_clamp(a, -1, 4);
    float y[5];
    assert_ok(ndm_array_copy_out(c, y, sizeof y));
    assert_true(y[0] == -1 && y[1] == 0.5f && isnan(y[2]) && y[3] == 4 && y[4] == 2);
    ndm_array inv = ndm_clamp(a, 3, 1); /* lo > hi: hi everywhere but NaN */
    assert_ok(ndm_array_copy_out(inv, y, sizeof y));
    assert_true(y[0] == 1 && y[1] == 1 && isnan(y[2]) && y[4] == 1);
    ndm_array nb = ndm_clamp(a, NAN, 1);
    assert_ok(ndm_array_copy_out(nb, y, sizeof y));
    for (int i = 0; i < 5; i++)
        assert_true(isnan(y[i]));
    ndm_array open = ndm_clamp(a, -INFINITY, 1);
    assert_ok(ndm_array_copy_out(open, y, sizeof y));
    assert_true(y[0] == -3 && y[3] == 1);
    /* integers: integral bounds saturate and keep the dtype */
    uint8_t u[4] = {0, 10, 200, 255};
    ndm_array ua = ndm_from_buffer(m, NDM_U8, u, NDM_SHAPE(4));
    ndm_array uc = ndm_clamp(ua, -5, 300);
    assert_int_equal(ndm_array_dtype(uc), NDM_U8);
    uint8_t uy[4];
    assert_ok(ndm_array_copy_out(uc, uy, 4));
    assert_memory_equal(uy, u, 4);
    ndm_array uc2 = ndm_clamp(ua, 5, INFINITY);
    assert_int_equal(ndm_array_dtype(uc2), NDM_U8);
    assert_ok(ndm_array_copy_out(uc2, uy, 4));
    assert_true(uy[0] == 5 && uy[3] == 255);
    ndm_array uf = ndm_clamp(ua, 0.5, 100); /* fractional bound: f32 */
    assert_int_equal(ndm_array_dtype(uf), NDM_F32);
    assert_ok(ndm_array_copy_out(uf, y, 4 * sizeof(float)));
    assert_true(y[0] == 0.5f && y[1] == 10 && y[2] == 100);
    ndm_array bb = ndm_clamp(ndm_ones(m, NDM_BOOL, NDM_SHAPE(2)), -3, 0);
    uint8_t hb[2];
    assert_ok(ndm_array_copy_out(bb, hb, 2));
    assert_true(hb[0] == 0 && hb[1] == 0);
    assert_ok(ndm_scope_release_all(m));
}

/* ---- errors, the output rule ------------------------------------------------- */

static void test_errors_shape_and_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array b = ndm_ones(m, NDM_F32, NDM_SHAPE(4));
    ndm_clear_error();
    ndm_array c = ndm_add(a, b);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("f32[2,3] and f32[4] do not broadcast");
    assert_error_has("ndm_add");
    c = ndm_where(a, b, a);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    ndm_array t = ndm_ones(m, NDM_BOOL, NDM_SHAPE(2, 3));
    c = ndm_sub(t, t);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("ndm_logical_xor");
    c = ndm_pow(t, t);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    c = ndm_astype(a, (ndm_dtype)42);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_int_equal(test_live_arrays(m), 3);
    assert_ok(ndm_scope_release_all(m));
}

static void test_errors_element_count_overflow(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array one = ndm_ones(m, NDM_F32, NDM_SHAPE(1, 1));
    ndm_array tall = ndm_expand(one, NDM_SHAPE(INT64_C(1) << 32, 1));
    ndm_array wide = ndm_expand(one, NDM_SHAPE(1, INT64_C(1) << 32));
    assert_live(tall);
    assert_live(wide);
    uint64_t live = test_live_arrays(m);
    ndm_clear_error();
    ndm_array c = ndm_mul(tall, wide);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_int_equal(test_live_arrays(m), live);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_bytes, 4); /* only `one` */
    assert_ok(ndm_scope_release_all(m));
}

static void test_errors_stale_handles(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    ndm_array b = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    REL(a);
    ndm_clear_error();
    ndm_array c = ndm_add(b, a);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("stale array handle");
    assert_error_has("f32[3]");
    ndm_clear_error();
    assert_int_equal(ndm_exp(a).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_clear_error();
    assert_int_equal(ndm_copy_into(b, a), NDM_E_CLOSED);
    REL(b);
}

static void test_null_propagates_first_error(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array b = ndm_ones(m, NDM_F32, NDM_SHAPE(5));
    ndm_clear_error();
    /* the first failure (shapes) must survive the rest of the chain */
    ndm_array c = ndm_relu(ndm_mul_scalar(ndm_exp(ndm_add(a, b)), 2.0));
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("do not broadcast");
    c = ndm_where(NDM_NULL_ARRAY, a, a);
    assert_int_equal(c.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_int_equal(ndm_astype(NDM_NULL_ARRAY, NDM_F32).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    /* without an earlier error, a null handle is NDM_E_NULL */
    ndm_clear_error();
    assert_int_equal(ndm_sub(a, NDM_NULL_ARRAY).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_int_equal(test_live_arrays(m), 2);
    assert_ok(ndm_scope_release_all(m));
}

static void test_output_rule_for_operations(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager owner = ndm_manager_new(root, "owner");
    ndm_manager named = ndm_manager_new(root, "named");
    ndm_manager second = ndm_manager_new(root, "second");
    ndm_array a = ndm_ones(owner, NDM_F32, NDM_SHAPE(4));
    ndm_array b = ndm_ones(second, NDM_F32, NDM_SHAPE(4));
    /* no scope, no name: the first input's manager */
    ndm_array c = ndm_add(a, b);
    assert_int_equal(ndm_array_manager(c).id, owner.id);
    ndm_array u = ndm_exp(b);
    assert_int_equal(ndm_array_manager(u).id, second.id);
    ndm_array w = ndm_where(b, a, a);
    assert_int_equal(ndm_array_manager(w).id, second.id);
    /* the innermost scope beats the first input */
    ndm_manager outer = ndm_scope_begin(root, "outer");
    ndm_manager inner = ndm_scope_begin(outer, "inner");
    ndm_array d = ndm_mul(a, b);
    assert_int_equal(ndm_array_manager(d).id, inner.id);
    ndm_array e = ndm_astype(a, NDM_F16);
    assert_int_equal(ndm_array_manager(e).id, inner.id);
    /* a named manager beats the scope */
    ndm_array f = ndm_sub_to(named, a, b);
    assert_int_equal(ndm_array_manager(f).id, named.id);
    ndm_array g = ndm_add_scalar_to(named, a, 1);
    assert_int_equal(ndm_array_manager(g).id, named.id);
    ndm_array h = ndm_astype_to(named, a, NDM_I32);
    assert_int_equal(ndm_array_manager(h).id, named.id);
    ndm_array k = ndm_sigmoid_to(named, a);
    assert_int_equal(ndm_array_manager(k).id, named.id);
    assert_ok(ndm_scope_end(inner, 0, NULL));
    assert_false(ndm_array_valid(d));
    assert_ok(ndm_scope_end(outer, 0, NULL));
    assert_int_equal(test_live_arrays(named), 4);
    assert_ok(ndm_manager_close(named));
    assert_ok(ndm_manager_close(owner));
    assert_ok(ndm_manager_close(second));
}

/* ---- fast kernels against the reference ------------------------------------- */

static bool same_values(ndm_array x, ndm_array y, double rtol, double atol)
{
    ndm_dtype t = ndm_array_dtype(x);
    if (t != ndm_array_dtype(y))
        return false;
    int64_t n, k;
    void *hx = read_all(x, &n), *hy = read_all(y, &k);
    bool ok = n == k;
    for (int64_t i = 0; ok && i < n; i++) {
        if (is_float_dt(t))
            ok = close_to(host_get(hx, t, i), host_get(hy, t, i), rtol, atol);
        else
            ok = host_geti(hx, t, i) == host_geti(hy, t, i);
        if (!ok)
            print_message("element %lld: %.9g vs %.9g\n", (long long)i, host_get(hx, t, i),
                          host_get(hy, t, i));
    }
    free(hx);
    free(hy);
    return ok;
}

/* Every op on several operand layouts, under each instruction set the CPU
 * has, against the reference table. */
static void fast_against_reference(ndm_manager m, ndm_array a, ndm_array b)
{
    ndm_dtype at = ndm_array_dtype(a), bt = ndm_array_dtype(b);
    for (int op = 0; op < B_COUNT; op++) {
        if (bool_refused(op, at, bt))
            continue;
        ndm__cpu_force_reference(true);
        ndm_array want = bops[op].fn(NDM_HERE, m, a, b);
        ndm__cpu_force_reference(false);
        ndm_array got = bops[op].fn(NDM_HERE, m, a, b);
        assert_live(want);
        assert_live(got);
        if (!same_values(got, want, op == B_POW ? 1e-6 : 0, 0))
            fail_msg("%s(%s, %s): fast and reference differ", bops[op].name,
                     ndm_dtype_short(at), ndm_dtype_short(bt));
        REL(want);
        REL(got);
    }
    for (int op = 0; op < U_COUNT; op++) {
        if (op == U_NEG && at == NDM_BOOL)
            continue;
        ndm__cpu_force_reference(true);
        ndm_array want = uops[op].fn(NDM_HERE, m, a);
        ndm__cpu_force_reference(false);
        ndm_array got = uops[op].fn(NDM_HERE, m, a);
        double rtol, atol;
        un_tol(op, ndm_array_dtype(got), &rtol, &atol);
        if (!same_values(got, want, rtol, atol))
            fail_msg("%s(%s): fast and reference differ", uops[op].name, ndm_dtype_short(at));
        REL(want);
        REL(got);
    }
    ndm__cpu_force_reference(true);
    ndm_array w1 = ndm_where_to(m, a, a, b), c1 = ndm_astype_to(m, b, at);
    ndm__cpu_force_reference(false);
    ndm_array w2 = ndm_where_to(m, a, a, b), c2 = ndm_astype_to(m, b, at);
    assert_true(same_values(w1, w2, 0, 0));
    assert_true(same_values(c1, c2, 0, 0));
    REL(w1);
    REL(w2);
    REL(c1);
    REL(c2);
}

static void test_fast_kernels_match_reference(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {12};
    const char *isas[] = {"avx512", "avx2", "generic"};
    for (size_t s = 0; s < 3; s++) {
        if (ndm__ew_isa_select(isas[s]) != NDM_OK)
            continue;
        for (int i = 0; i < N_DTYPES; i++) {
            ndm_dtype t = all_dtypes[i], u = all_dtypes[(i + 5) % N_DTYPES];
            ndm_array a = rand_array(m, t, NDM_SHAPE(7, 301), &r, true);
            ndm_array b = rand_array(m, u, NDM_SHAPE(301, 7), &r, true);
            ndm_array bt = ndm_transpose(b);
            ndm_array col = ndm_slice(a, 1, 5, 6, 1);
            ndm_array rev = ndm_slice(a, 1, NDM_END, NDM_END, -2);
            ndm_array rb = ndm_slice(bt, 1, 0, NDM_END, 2);
            fast_against_reference(m, a, a);
            fast_against_reference(m, a, bt);
            fast_against_reference(m, col, a);
            fast_against_reference(m, rev, rb);
            ndm_array all[] = {a, b, bt, col, rev, rb};
            for (size_t k = 0; k < 6; k++)
                REL(all[k]);
        }
    }
    assert_ok(ndm__ew_isa_select(NULL));
}

/* Big enough to split across the pool, and through non-temporal stores. */
static void test_parallel_and_streaming_paths_agree(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {13};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(3, 100003), &r, true);
    ndm_array b = rand_array(m, NDM_F32, NDM_SHAPE(100003), &r, true);
    ndm_array h = ndm_astype(a, NDM_F16);
    int before = ndm__set_num_threads(1);
    ndm_array one[5] = {ndm_add(a, b), ndm_exp(a), ndm_astype(h, NDM_F32), ndm_lt(a, b),
                        ndm_where(a, h, b)};
    ndm__set_num_threads(3);
    ndm__ew_set_stream_min(1);
    ndm_array many[5] = {ndm_add(a, b), ndm_exp(a), ndm_astype(h, NDM_F32), ndm_lt(a, b),
                         ndm_where(a, h, b)};
    ndm__ew_set_stream_min((int64_t)64 << 20);
    ndm__set_num_threads(before);
    for (int i = 0; i < 5; i++) {
        assert_true(same_values(one[i], many[i], 0, 0));
        REL(one[i]);
        REL(many[i]);
    }
    /* in place on a big transposed view, through the pool */
    ndm_array t = ndm_transpose(ndm_reshape(a, NDM_SHAPE(100003, 3)));
    ndm_array want = ndm_mul_scalar(t, 3.0);
    assert_ok(ndm_mul_scalar_(t, 3.0));
    assert_true(same_values(t, want, 0, 0));
    assert_ok(ndm_scope_release_all(m));
}

/* Inputs read across their memory order take the blocked walk: several
 * blocks, partial ones at the edges, split across the pool. */
static void test_transposed_operands_blocked_walk(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {15};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(300, 701), &r, true);
    ndm_array b = rand_array(m, NDM_F64, NDM_SHAPE(701, 300), &r, true);
    ndm_array c = rand_array(m, NDM_BF16, NDM_SHAPE(3, 701, 300), &r, true);
    ndm_array bt = ndm_transpose(b);
    ndm_array ct = ndm_permute(c, 3, ((const int[]){0, 2, 1}));
    for (int threads = 1; threads <= 3; threads += 2) {
        int before = ndm__set_num_threads(threads);
        ndm__cpu_force_reference(true);
        ndm_array w[4] = {ndm_add(a, bt), ndm_exp(bt), ndm_where(ct, a, bt), ndm_mul(ct, a)};
        ndm__cpu_force_reference(false);
        ndm_array g[4] = {ndm_add(a, bt), ndm_exp(bt), ndm_where(ct, a, bt), ndm_mul(ct, a)};
        ndm__set_num_threads(before);
        for (int i = 0; i < 4; i++) {
            assert_true(same_values(g[i], w[i], i == 1 ? 1e-14 : 0, 0));
            REL(w[i]);
            REL(g[i]);
        }
    }
    check_binary(B_SUB, bt, a);
    assert_ok(ndm_scope_release_all(m));
}

/* Several threads running large operations at once: one owns the pool, the
 * others run inline; every result is right. */
typedef struct caller {
    ndm_manager parent;
    int seed;
    int bad;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    ndm_manager m = ndm_manager_new(c->parent, "caller");
    rng r = {(uint64_t)c->seed};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(400, 600), &r, false);
    ndm_array b = rand_array(m, NDM_F32, NDM_SHAPE(600), &r, false);
    int64_t n, k;
    float *ha = read_all(a, &n), *hb = read_all(b, &k);
    for (int rep = 0; rep < 20; rep++) {
        ndm_array s = ndm_mul(a, b);
        float *hs = read_all(s, &n);
        for (int64_t i = 0; i < n; i++)
            c->bad += hs[i] != ha[i] * hb[i % 600];
        free(hs);
        c->bad += ndm_array_release(s) != NDM_OK;
    }
    free(ha);
    free(hb);
    c->bad += ndm_manager_close(m) != NDM_OK;
    return NULL;
}

static void test_concurrent_callers_share_the_pool(void **state)
{
    caller c[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (caller){ROOT(state), 100 + i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, caller_main, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(c[i].bad, 0);
    }
}

static void test_copy_into_broadcasts_and_casts(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array dst = ndm_zeros(m, NDM_I32, NDM_SHAPE(3, 4));
    double row[4] = {1.9, -2.9, 1e20, NAN};
    ndm_array src = ndm_from_buffer(m, NDM_F64, row, NDM_SHAPE(4));
    assert_ok(ndm_copy_into(dst, src));
    int32_t y[12];
    assert_ok(ndm_array_copy_out(dst, y, sizeof y));
    for (int i = 0; i < 3; i++)
        assert_true(y[4 * i] == 1 && y[4 * i + 1] == -2 && y[4 * i + 2] == INT32_MAX &&
                    y[4 * i + 3] == 0);
    /* into a transposed view */
    ndm_array t = ndm_transpose(dst);
    ndm_array col = ndm_arange(m, NDM_I64, 0, 3, 1);
    assert_ok(ndm_copy_into(t, col));
    assert_ok(ndm_array_copy_out(dst, y, sizeof y));
    for (int i = 0; i < 12; i++)
        assert_int_equal(y[i], i / 4); /* t[i][j] = j, so row j of dst holds j */
    ndm_clear_error();
    assert_int_equal(ndm_copy_into(src, dst), NDM_E_SHAPE);
    assert_error_has("cannot broadcast i32[3,4] into f64[4]");
    assert_int_equal(ndm_copy_into(ndm_expand(src, NDM_SHAPE(2, 4)), src), NDM_E_INVALID);
    assert_ok(ndm_scope_release_all(m));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_binary_every_op_f32_matches_f64),
        TEST(test_binary_every_dtype_pair),
        TEST(test_binary_pow_every_dtype),
        TEST(test_binary_integer_overflow_wraps),
        TEST(test_binary_broadcast_shapes),
        TEST(test_binary_noncontiguous_views),
        TEST(test_binary_high_rank_views),
        TEST(test_binary_zero_d_and_size_zero),
        TEST(test_compare_nan_and_inf),
        TEST(test_logical_ops_any_dtype),
        TEST(test_where_broadcasts_and_promotes),
        TEST(test_scalar_ops_values_and_dtypes),
        TEST(test_scalar_weak_typing_rules),
        TEST(test_pow_scalar_common_exponents),
        TEST(test_inplace_ops_write_first_input),
        TEST(test_inplace_scalar_and_unary_forms),
        TEST(test_inplace_refuses_wider_kinds),
        TEST(test_inplace_overlapping_input_reads_a_copy),
        TEST(test_inplace_works_on_capped_manager),
        TEST(test_inplace_on_closed_manager_is_stale),
        TEST(test_unary_every_op_float_dtypes),
        TEST(test_unary_integer_and_bool_inputs),
        TEST(test_unary_special_values),
        TEST(test_round_half_to_even),
        TEST(test_clamp_rules),
        TEST(test_errors_shape_and_dtype),
        TEST(test_errors_element_count_overflow),
        TEST(test_errors_stale_handles),
        TEST(test_null_propagates_first_error),
        TEST(test_output_rule_for_operations),
        TEST(test_fast_kernels_match_reference),
        TEST(test_parallel_and_streaming_paths_agree),
        TEST(test_transposed_operands_blocked_walk),
        TEST(test_concurrent_callers_share_the_pool),
        TEST(test_copy_into_broadcasts_and_casts),
        TEST(test_floor_divide_and_remainders_match_numpy),
    };
    return cmocka_run_group_tests_name("elementwise", tests, NULL, NULL);
}
