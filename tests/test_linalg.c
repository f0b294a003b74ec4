/* matmul, dot and outer against float64 products computed here: every dtype,
 * transposed and other strided views, batches that broadcast, the 1-D rules;
 * the error paths, the output rule, and the provider against ndm's kernel. */
#include <time.h>

#include "backends/backend.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/small_gemm.h"
#include "check_numeric.h"
#include "manager/alloc/alloc.h"

/* numpy.matmul over C-order values. Returns the result and its shape. */
static double *ref_matmul(const double *a, int na, const int64_t *sa, const double *b, int nb,
                          const int64_t *sb, int *ond, int64_t *oshape, double **scale)
{
    int64_t m = na == 1 ? 1 : sa[na - 2], k = sa[na - 1];
    int64_t n = nb == 1 ? 1 : sb[nb - 1];
    int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0, nbt = ba > bb ? ba : bb;
    int64_t bshape[8], batches = 1;
    int o = 0;
    for (int i = 0; i < nbt; i++) {
        int64_t da = i >= nbt - ba ? sa[i - (nbt - ba)] : 1;
        int64_t db = i >= nbt - bb ? sb[i - (nbt - bb)] : 1;
        bshape[i] = da == 1 ? db : da;
        oshape[o++] = bshape[i];
        batches *= bshape[i];
    }
    if (na > 1)
        oshape[o++] = m;
    if (nb > 1)
        oshape[o++] = n;
    *ond = o;
    double *c = calloc((size_t)(batches * m * n + 1), sizeof(double));
    *scale = calloc((size_t)(batches * m * n + 1), sizeof(double));
    for (int64_t t = 0; t < batches; t++) {
        /* batch offsets with broadcasting */
        int64_t rem = t, oa = 0, ob = 0, stra = m * k, strb = k * n;
        for (int i = nbt - 1; i >= 0; i--) {
            int64_t q = rem % bshape[i];
            rem /= bshape[i];
            int ia = i - (nbt - ba), ib = i - (nbt - bb);
            if (ia >= 0) {
                oa += (sa[ia] == 1 ? 0 : q) * stra;
                stra *= sa[ia];
            }
            if (ib >= 0) {
                ob += (sb[ib] == 1 ? 0 : q) * strb;
                strb *= sb[ib];
            }
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, sc = 0;
                for (int64_t p = 0; p < k; p++) {
                    double x = a[oa + i * k + p] * b[ob + p * n + j];
                    s += x;
                    sc += fabs(x);
                }
                c[(t * m + i) * n + j] = s;
                (*scale)[(t * m + i) * n + j] = sc;
            }
    }
    return c;
}

/* matmul(a, b) against the reference; a and b are any views. */
static void check_matmul(ndm_array a, ndm_array b, const char *what)
{
    int na, nb;
    int64_t *sa = shape_of(a, &na), *sb = shape_of(b, &nb);
    double *va = read_array(a), *vb = read_array(b);
    int ond;
    int64_t oshape[8];
    double *scale;
    double *want = ref_matmul(va, na, sa, vb, nb, sb, &ond, oshape, &scale);
    ndm_array c = ndm_matmul(a, b);
    if (!c.id)
        fail_msg("%s: %s", what, ndm_last_error());
    ndm_dtype rt = ndm_result_type(ndm_array_dtype(a), ndm_array_dtype(b));
    assert_int_equal(ndm_array_dtype(c), rt);
    int cnd;
    int64_t *cs = shape_of(c, &cnd);
    assert_int_equal(cnd, ond);
    for (int i = 0; i < ond; i++)
        assert_int_equal(cs[i], oshape[i]);
    double *got = read_array(c);
    int64_t k = sa[na - 1], n = ndm_array_size(c);
    for (int64_t i = 0; i < n; i++) {
        double w = want[i];
        double rtol = 0, atol = 0;
        if (ndm_dtype_is_float(rt)) {
            double u = rt == NDM_F64 ? 1.2e-16 : 6e-8; /* f16/bf16 compute in f32 */
            atol = 2.0 * (double)(k + 1) * u * scale[i];
            rtol = dtype_rtol(rt);
        } else if (rt == NDM_BOOL) {
            w = w != 0;
        }
        if (!close_to(got[i], w, rtol, atol))
            fail_msg("%s (%s): element %lld is %.17g, expected %.17g", what,
                     ndm_dtype_short(rt), (long long)i, got[i], w);
    }
    free(sa), free(sb), free(va), free(vb), free(want), free(scale), free(got), free(cs);
    release(c);
}

static ndm_array rand_array(ndm_manager m, rng *g, ndm_dtype t, int nd, const int64_t *shape)
{
    int64_t n = shape_numel(nd, shape);
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
    rng_fill(g, t, x, n);
    ndm_array a = make_array(m, t, x, nd, shape);
    free(x);
    return a;
}

/* Every check runs on both CPU tables: the provider (or ndm's kernel for
 * what the provider does not take) and the reference blocked GEMM. */
#define BOTH_TABLES(...)                                                        \
    for (int ref_ = 0; ref_ < 2; ref_++) {                                      \
        ndm__cpu_force_reference(ref_);                                         \
        __VA_ARGS__;                                                            \
    }                                                                           \
    ndm__cpu_force_reference(false)

static void test_matmul_2d_matches_reference(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(1);
    const int64_t sizes[][3] = {{1, 1, 1},    {2, 3, 4},    {7, 13, 5},    {33, 64, 17},
                                {130, 257, 66}, {5, 300, 3}, {3, 5, 3100}, {49, 31, 97}};
    const ndm_dtype types[] = {NDM_F32, NDM_F64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int t = 0; t < 2; t++) {
            ndm_array a = rand_array(m, &g, types[t], 2, (int64_t[]){sizes[s][0], sizes[s][1]});
            ndm_array b = rand_array(m, &g, types[t], 2, (int64_t[]){sizes[s][1], sizes[s][2]});
            char what[64];
            snprintf(what, sizeof what, "%lldx%lldx%lld", (long long)sizes[s][0],
                     (long long)sizes[s][1], (long long)sizes[s][2]);
            BOTH_TABLES(check_matmul(a, b, what));
            release(a);
            release(b);
        }
}

static void test_matmul_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(2);
    for (int d = 0; d < N_DTYPES; d++)
        for (int e = 0; e < N_DTYPES; e += d == e ? 1 : 3) {
            ndm_array a = rand_array(m, &g, all_dtypes[d], 2, (int64_t[]){9, 14});
            ndm_array b = rand_array(m, &g, all_dtypes[e], 2, (int64_t[]){14, 35});
            char what[64];
            snprintf(what, sizeof what, "%s @ %s", ndm_dtype_short(all_dtypes[d]),
                     ndm_dtype_short(all_dtypes[e]));
            BOTH_TABLES(check_matmul(a, b, what));
            release(a);
            release(b);
        }
}

static void test_matmul_integers_wrap_as_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    int32_t a[2] = {1 << 30, 3}, b[2] = {4, 1};
    ndm_array x = ndm_from_buffer(m, NDM_I32, a, NDM_SHAPE(1, 2));
    ndm_array y = ndm_from_buffer(m, NDM_I32, b, NDM_SHAPE(2, 1));
    BOTH_TABLES({
        ndm_array c = ndm_matmul(x, y);
        int64_t v;
        assert_ok(ndm_item_i64(c, &v));
        assert_int_equal(v, 3); /* 2^32 + 3 wraps to 3 in int32 */
        release(c);
    });
    uint8_t p[4] = {1, 0, 0, 0}, q[4] = {0, 1, 1, 1};
    ndm_array bp = ndm_from_buffer(m, NDM_BOOL, p, NDM_SHAPE(2, 2));
    ndm_array bq = ndm_from_buffer(m, NDM_BOOL, q, NDM_SHAPE(2, 2));
    ndm_array bc = ndm_matmul(bp, bq);
    uint8_t out[4];
    assert_ok(ndm_array_copy_out(bc, out, 4));
    assert_true(out[0] == 0 && out[1] == 1 && out[2] == 0 && out[3] == 0);
    release(bc), release(bp), release(bq), release(x), release(y);
}

/* Transposed, stepped, flipped and broadcast operands; the provider takes
 * the first ones as they are and copies the others. */
static void test_matmul_strided_views(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(3);
    const int64_t sizes[][3] = {{6, 5, 7}, {40, 70, 50}, {150, 150, 150}};
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_I64, NDM_F16};
    for (size_t s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++) {
            int64_t M = sizes[s][0], K = sizes[s][1], N = sizes[s][2];
            ndm_array at = rand_array(m, &g, types[t], 2, (int64_t[]){K, M});
            ndm_array bt = rand_array(m, &g, types[t], 2, (int64_t[]){N, K});
            ndm_array a2 = rand_array(m, &g, types[t], 2, (int64_t[]){M, 2 * K});
            ndm_array b2 = rand_array(m, &g, types[t], 2, (int64_t[]){2 * K, N});
            ndm_array row = rand_array(m, &g, types[t], 2, (int64_t[]){1, K});
            ndm_array a = ndm_transpose(at), b = ndm_transpose(bt);
            ndm_array as = ndm_slice(a2, 1, 0, NDM_END, 2);   /* column stride 2 */
            ndm_array bf = ndm_slice(b2, 0, NDM_END, K - 1, -1); /* rows flipped */
            ndm_array ae = ndm_expand(row, NDM_SHAPE(M, K));      /* row stride 0 */
            ndm_array bs = ndm_slice(b2, 0, 1, NDM_END, 2);
            BOTH_TABLES({
                check_matmul(a, b, "a^T @ b^T");
                check_matmul(a, bs, "a^T @ stepped rows");
                check_matmul(as, b, "stepped columns @ b^T");
                check_matmul(as, bf, "stepped @ flipped");
                check_matmul(ae, b, "broadcast rows @ b^T");
            });
            release(a), release(b), release(as), release(bf), release(ae), release(bs);
            release(at), release(bt), release(a2), release(b2), release(row);
        }
}

static void test_matmul_1d_rules(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(4);
    ndm_array v = rand_array(m, &g, NDM_F64, 1, (int64_t[]){6});
    ndm_array w = rand_array(m, &g, NDM_F64, 1, (int64_t[]){6});
    ndm_array a = rand_array(m, &g, NDM_F64, 2, (int64_t[]){4, 6});
    ndm_array b = rand_array(m, &g, NDM_F64, 2, (int64_t[]){6, 3});
    ndm_array t = rand_array(m, &g, NDM_F32, 3, (int64_t[]){2, 4, 6});
    ndm_array bt = rand_array(m, &g, NDM_F32, 3, (int64_t[]){5, 6, 3});
    ndm_array c = ndm_matmul(v, w);
    assert_rank0(c);
    release(c);
    c = ndm_matmul(v, b);
    assert_shape(c, 3);
    release(c);
    c = ndm_matmul(a, v);
    assert_shape(c, 4);
    release(c);
    c = ndm_matmul(t, v);
    assert_shape(c, 2, 4);
    release(c);
    c = ndm_matmul(v, bt);
    assert_shape(c, 5, 3);
    release(c);
    BOTH_TABLES({
        check_matmul(v, w, "vector @ vector");
        check_matmul(v, b, "vector @ matrix");
        check_matmul(a, v, "matrix @ vector");
        check_matmul(t, v, "batch @ vector");
        check_matmul(v, bt, "vector @ batch");
    });
    release(v), release(w), release(a), release(b), release(t), release(bt);
}

static void test_matmul_batches_broadcast(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(5);
    struct {
        int na;
        int64_t sa[4];
        int nb;
        int64_t sb[4];
    } cases[] = {
        {4, {2, 1, 5, 7}, 3, {3, 7, 4}},  /* (2,1) with (3,): (2,3) */
        {3, {4, 9, 8}, 2, {8, 6}},        /* b shared: batches fold into rows */
        {3, {4, 9, 8}, 3, {1, 8, 6}},     /* b broadcast from size 1 */
        {2, {9, 8}, 3, {4, 8, 6}},        /* a shared */
        {3, {8, 16, 16}, 3, {8, 16, 16}}, /* many small products in parallel */
        {4, {2, 3, 40, 30}, 4, {2, 3, 30, 20}},
        {3, {0, 3, 4}, 2, {4, 5}},        /* no batch */
    };
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_I32};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 3; t++) {
            ndm_array a = rand_array(m, &g, types[t], cases[c].na, cases[c].sa);
            ndm_array b = rand_array(m, &g, types[t], cases[c].nb, cases[c].sb);
            char what[48];
            snprintf(what, sizeof what, "batch case %zu", c);
            BOTH_TABLES(check_matmul(a, b, what));
            release(a), release(b);
        }
    /* a batch axis that is not outermost in memory */
    ndm_array base = rand_array(m, &g, NDM_F32, 3, (int64_t[]){5, 3, 4});
    ndm_array a = ndm_permute(base, 3, ((const int[]){1, 0, 2}));
    ndm_array b = rand_array(m, &g, NDM_F32, 3, (int64_t[]){3, 4, 2});
    ndm_array shared = rand_array(m, &g, NDM_F32, 2, (int64_t[]){4, 2});
    BOTH_TABLES({
        check_matmul(a, b, "permuted batch");
        check_matmul(a, shared, "permuted batch @ shared"); /* rows do not fold */
    });
    release(a), release(b), release(base), release(shared);
}

static void test_matmul_empty_sizes(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(6);
    ndm_array a = rand_array(m, &g, NDM_F32, 2, (int64_t[]){4, 0});
    ndm_array b = rand_array(m, &g, NDM_F32, 2, (int64_t[]){0, 3});
    ndm_array z = rand_array(m, &g, NDM_F32, 2, (int64_t[]){0, 4});
    BOTH_TABLES({
        ndm_array c = ndm_matmul(a, b);
        assert_shape(c, 4, 3);
        double *v = read_array(c);
        for (int i = 0; i < 12; i++)
            assert_true(v[i] == 0); /* k = 0: a sum of nothing */
        free(v);
        release(c);
        c = ndm_matmul(z, a);
        assert_shape(c, 0, 0);
        release(c);
    });
    release(a), release(b), release(z);
}

static void test_matmul_shape_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 5));
    ndm_array p = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3, 4));
    ndm_array q = ndm_zeros(m, NDM_F32, NDM_SHAPE(3, 4, 5));
    ndm_array s = ndm_scalar(m, NDM_F32, 1);
    assert_fails(ndm_matmul(a, b), NDM_E_SHAPE, "inner sizes differ: f32[2,3] @ f32[4,5]");
    assert_fails(ndm_matmul(p, q), NDM_E_SHAPE, "do not broadcast");
    assert_fails(ndm_matmul(s, a), NDM_E_SHAPE, "rank >= 1");
    assert_fails(ndm_matmul(a, s), NDM_E_SHAPE, "rank >= 1");
    assert_fails(ndm_dot(a, b), NDM_E_SHAPE, "inner sizes differ");
    ndm_array r = ndm_zeros(m, NDM_F32, NDM_SHAPE(3, 5, 6));
    assert_fails(ndm_dot(p, r), NDM_E_SHAPE, "axis -2");
    assert_int_equal(test_live_arrays(m), 6);
    release(a), release(b), release(p), release(q), release(r), release(s);
}

static void test_matmul_count_overflow_allocates_nothing(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array one = ndm_ones(m, NDM_F32, NDM_SHAPE(1, 1));
    ndm_array tall = ndm_expand(one, NDM_SHAPE((int64_t)1 << 32, 1));
    ndm_array wide = ndm_expand(one, NDM_SHAPE(1, (int64_t)1 << 32));
    assert_live(tall);
    assert_live(wide);
    ndm_stats before, after;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &before));
    assert_fails(ndm_matmul(tall, wide), NDM_E_OVERFLOW, "overflow");
    assert_fails(ndm_outer(tall, wide), NDM_E_OVERFLOW, "overflow");
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &after));
    assert_int_equal(after.created, before.created);
    release(tall), release(wide), release(one);
}

static void test_dot_follows_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(7);
    double x[5], y[5];
    rng_fill(&g, NDM_F64, x, 5);
    rng_fill(&g, NDM_F64, y, 5);
    ndm_array v = make_array(m, NDM_F64, x, NDM_SHAPE(5));
    ndm_array w = make_array(m, NDM_F64, y, NDM_SHAPE(5));
    ndm_array d = ndm_dot(v, w);
    assert_rank0(d);
    double got, want = 0;
    for (int i = 0; i < 5; i++)
        want += x[i] * y[i];
    assert_ok(ndm_item(d, &got));
    assert_true(close_to(got, want, 1e-14, 1e-15));
    release(d);
    /* N-d with M-d: dot(a, b)[i,j,k,l] = sum_p a[i,j,p] * b[k,p,l] */
    double a[2 * 3 * 4], b[5 * 4 * 6];
    rng_fill(&g, NDM_F64, a, 24);
    rng_fill(&g, NDM_F64, b, 120);
    ndm_array A = make_array(m, NDM_F64, a, NDM_SHAPE(2, 3, 4));
    ndm_array B = make_array(m, NDM_F64, b, NDM_SHAPE(5, 4, 6));
    BOTH_TABLES({
        ndm_array D = ndm_dot(A, B);
        assert_live(D);
        assert_shape(D, 2, 3, 5, 6);
        double *gv = read_array(D);
        for (int i = 0; i < 6; i++)
            for (int k = 0; k < 5; k++)
                for (int l = 0; l < 6; l++) {
                    double s = 0;
                    for (int p = 0; p < 4; p++)
                        s += a[i * 4 + p] * b[(k * 4 + p) * 6 + l];
                    assert_true(close_to(gv[(i * 5 + k) * 6 + l], s, 1e-13, 1e-14));
                }
        free(gv);
        release(D);
    });
    /* 1-d with N-d, N-d with 1-d, scalars */
    ndm_array v4 = make_array(m, NDM_F64, x, NDM_SHAPE(4));
    ndm_array D = ndm_dot(v4, B);
    assert_shape(D, 5, 6);
    double *gv = read_array(D);
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < 6; l++) {
            double s = 0;
            for (int p = 0; p < 4; p++)
                s += x[p] * b[(k * 4 + p) * 6 + l];
            assert_true(close_to(gv[k * 6 + l], s, 1e-13, 1e-14));
        }
    free(gv);
    release(D);
    D = ndm_dot(A, v4);
    assert_shape(D, 2, 3);
    release(D);
    ndm_array s = ndm_scalar(m, NDM_F32, 3);
    D = ndm_dot(s, A);
    assert_shape(D, 2, 3, 4);
    assert_int_equal(ndm_array_dtype(D), NDM_F64);
    gv = read_array(D);
    for (int i = 0; i < 24; i++)
        assert_true(close_to(gv[i], 3 * a[i], 1e-15, 0));
    free(gv);
    release(D);
    D = ndm_dot(B, s);
    assert_shape(D, 5, 4, 6);
    release(D);
    D = ndm_dot(s, s);
    assert_rank0(D);
    assert_ok(ndm_item(D, &got));
    assert_true(got == 9);
    release(D);
    release(v), release(w), release(A), release(B), release(v4), release(s);
}

static void test_outer_flattens_views(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(8);
    double x[6], y[3];
    rng_fill(&g, NDM_F32, x, 6);
    rng_fill(&g, NDM_I32, y, 3);
    ndm_array a = make_array(m, NDM_F32, x, NDM_SHAPE(2, 3));
    ndm_array at = ndm_transpose(a); /* flattened in its own C order */
    ndm_array b = make_array(m, NDM_I32, y, NDM_SHAPE(3));
    BOTH_TABLES({
        ndm_array o = ndm_outer(at, b);
        assert_shape(o, 6, 3);
        assert_int_equal(ndm_array_dtype(o), NDM_F32);
        double *va = read_array(at), *got = read_array(o);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 3; j++)
                assert_true(close_to(got[i * 3 + j], va[i] * y[j], 1e-6, 0));
        free(va), free(got);
        release(o);
    });
    release(at), release(a), release(b);
}

static void test_matmul_stale_and_null_inputs(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 2));
    ndm_array b = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 2));
    release(b);
    assert_fails(ndm_matmul(a, b), NDM_E_CLOSED, "stale array handle");
    assert_fails(ndm_outer(b, a), NDM_E_CLOSED, "released");
    ndm_clear_error();
    ndm_array bad = ndm_matmul(a, b);
    ndm_array next = ndm_matmul(bad, a);
    assert_true(next.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED); /* the first error is kept */
    assert_fails(ndm_dot(NDM_NULL_ARRAY, a), NDM_E_NULL, "null");
    release(a);
}

static void test_matmul_output_rule_and_temporaries(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager in = ndm_manager_new(m, "inputs");
    ndm_manager named = ndm_manager_new(m, "named");
    /* f16 computes through f32 temporaries, which must not outlive the call */
    ndm_array a = ndm_ones(in, NDM_F16, NDM_SHAPE(3, 4));
    ndm_array b = ndm_ones(in, NDM_F16, NDM_SHAPE(4, 2));
    ndm_array c = ndm_matmul(a, b);
    assert_true(ndm_array_manager(c).id == in.id);
    assert_int_equal(test_live_arrays(in), 3);
    ndm_array d = ndm_matmul_to(named, a, b);
    assert_true(ndm_array_manager(d).id == named.id);
    assert_int_equal(test_live_arrays(named), 1);
    ndm_array o = ndm_outer_to(named, a, b);
    assert_int_equal(test_live_arrays(named), 2);
    assert_shape(o, 12, 8);
    ndm_manager s = ndm_scope_begin(m, "step");
    ndm_array e = ndm_dot(a, b);
    ndm_array f = ndm_matmul(e, ndm_transpose(b));
    assert_true(ndm_array_manager(e).id == s.id);
    assert_ok(ndm_scope_end(s, 1, &f));
    assert_true(ndm_array_manager(f).id == m.id);
    assert_false(ndm_array_valid(e));
    double v;
    ndm_array f0 = ndm_select(ndm_select(f, 0, 0), 0, 0);
    assert_ok(ndm_item(f0, &v));
    assert_true(v == 8);
    assert_ok(ndm_scope_release_all(m));
    assert_ok(ndm_manager_close(named));
    assert_ok(ndm_manager_close(in));
}

static void test_matmul_capped_and_failing_allocations(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array w = ndm_ones(model, NDM_BF16, NDM_SHAPE(4, 4));
    ndm_array x = ndm_ones(model, NDM_BF16, NDM_SHAPE(4, 2));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_fails(ndm_matmul(w, x), NDM_E_CAPPED, "capped");
    assert_int_equal(test_live_arrays(model), 2);
    /* each allocation of the call (the result and three f32 temporaries)
     * fails in turn: an error, and nothing left behind */
    int failures = 0;
    for (int i = 1; i < 10; i++) {
        ndm__alloc_fail_after(i);
        ndm_array r = ndm_matmul_to(m, w, x);
        ndm__alloc_fail_after(0);
        if (r.id) {
            double v;
            ndm_array r0 = ndm_select(r, 0, 0);
            ndm_array r00 = ndm_select(r0, 0, 1);
            assert_ok(ndm_item(r00, &v));
            assert_true(v == 4);
            release(r00), release(r0), release(r);
            break;
        }
        failures++;
        assert_int_equal(ndm_last_status(), NDM_E_OOM);
        assert_int_equal(test_live_arrays(m), 2);
    }
    assert_int_equal(failures, 4);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
}

/* One small product (few rows of C) against a float64 product: B read as
 * columns (dot form, w is n x k) or as rows (axpy form, k x n), C strided or
 * not; mode 0 plain, 1 a bias per row, 2 accumulating, 3 a bias per column
 * then relu (a linear layer's epilogue), 4 relu alone. */
static void check_small(ndm_dtype dt, int64_t m, int64_t n, int64_t k, bool dot, int64_t csc,
                        int mode, const char *level)
{
    size_t es = ndm_dtype_size(dt);
    int64_t rsa = k + 3; /* rows of A apart */
    char *a = malloc((size_t)(m * rsa + 1) * es), *b = malloc((size_t)(k * n + 1) * es);
    char *c = malloc((size_t)(m * n * csc + 1) * es), *bias = malloc((size_t)(m + 1) * es);
    char *cbias = malloc((size_t)(n + 1) * es);
    double *want = malloc((size_t)(m * n + 1) * sizeof(double));
    uint64_t seed = (uint64_t)(m * 1000003 + n * 1009 + k);
#define VAL() ((double)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 40) / \
                   (double)(1ull << 24) - 0.5)
#define PUT(buf, i, v) (dt == NDM_F32 ? (void)(((float *)(buf))[i] = (float)(v)) \
                                      : (void)(((double *)(buf))[i] = (v)))
#define GET(buf, i) (dt == NDM_F32 ? (double)((float *)(buf))[i] : ((double *)(buf))[i])
    for (int64_t i = 0; i < m * rsa; i++)
        PUT(a, i, VAL());
    for (int64_t i = 0; i < k * n; i++)
        PUT(b, i, VAL());
    for (int64_t i = 0; i < m; i++)
        PUT(bias, i, VAL());
    for (int64_t j = 0; j < n; j++)
        PUT(cbias, j, VAL());
    for (int64_t i = 0; i < m * n * csc; i++)
        PUT(c, i, VAL());
    int64_t rsb = dot ? 1 : n, csb = dot ? k : 1;
    double tol = dt == NDM_F32 ? 1e-5 : 1e-13;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = mode == 1 ? GET(bias, i) : mode == 2 ? GET(c, (i * n + j) * csc) : 0;
            for (int64_t p = 0; p < k; p++)
                s += GET(a, i * rsa + p) * GET(b, p * rsb + j * csb);
            want[i * n + j] = s + (mode == 3 ? GET(cbias, j) : 0);
        }
    if (mode >= 3) {
        ndm__gemm_epi e = {false, NULL, 0, mode == 3 ? cbias : NULL, 1, true};
        bool took = ndm__gemm_small(dt, m, n, k, a, rsa, 1, b, rsb, csb, c, n * csc, csc, &e);
        if (took != (m <= NDM__GEMM_SMALL_M))
            fail_msg("%s m=%lld: the small path %s", level, (long long)m,
                     took ? "took a product too large" : "declined");
        if (!took) {
            free(a), free(b), free(c), free(bias), free(cbias), free(want);
            return;
        }
    } else {
        ndm_status st = ndm__cpu_gemm_bias(dt, m, n, k, a, rsa, 1, b, rsb, csb, c, n * csc, csc,
                                           mode == 1 ? bias : NULL, 1,
                                           mode == 2 ? NDM__GEMM_ACCUMULATE : 0);
        if (st != NDM_OK)
            fail_msg("%s gemm returned %s", level, ndm_status_name(st));
    }
    double bound = tol * (1.0 + (double)k);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double got = GET(c, (i * n + j) * csc), w = want[i * n + j];
            /* relu: exactly 0 where the sum is surely negative */
            bool bad = mode >= 3 ? (w < -bound ? got != 0 : !(fabs(got - (w < 0 ? 0 : w)) <= bound))
                                 : !(fabs(got - w) <= bound);
            if (bad)
                fail_msg("%s %s m=%lld n=%lld k=%lld %s csc=%lld mode=%d: C[%lld][%lld] = %.9g, "
                         "want %.9g", level, ndm_dtype_name(dt), (long long)m, (long long)n,
                         (long long)k, dot ? "dot" : "axpy", (long long)csc, mode, (long long)i,
                         (long long)j, got, w);
        }
#undef VAL
#undef PUT
#undef GET
    free(a), free(b), free(c), free(bias), free(cbias), free(want);
}

/* The small-product path (batch-1 and small-batch shapes) at every CPU
 * level this machine runs, odd sizes around the vector widths, one and
 * several threads. */
static void test_gemm_small_path_every_level(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 3, 4, 5, 7, 9, 17, 33, 64, 65, 130, 300, 784};
    static const int64_t ks[] = {1, 2, 7, 8, 9, 16, 31, 33, 100, 784};
    static const ndm_dtype dts[] = {NDM_F32, NDM_F64};
    int keep = ndm__set_num_threads(1);
    int levels = 0;
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        levels++;
        const char *name = ndm__cpu_isa_name((ndm__cpu_isa)level);
        for (int threads = 1; threads <= 3; threads += 2) {
            ndm__set_num_threads(threads);
            for (size_t d = 0; d < 2; d++)
                for (int64_t m = 1; m <= 5; m++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                            for (int form = 0; form < 2; form++) {
                                int mode = (int)((ni + ki + (size_t)m) % 5);
                                int64_t csc = form == 0 && ni % 2 ? 2 : 1;
                                check_small(dts[d], m, ns[ni], ks[ki], form == 0, csc, mode,
                                            name);
                            }
        }
    }
    assert_true(ndm__cpu_isa_force(-1));
    ndm__set_num_threads(keep);
    assert_true(levels >= 1);
}

/* The CPU backend's linear kernel, relu(x @ w^T + b) or without bias or
 * relu, against float64: few rows (the small path, whose epilogue adds the
 * bias and relu as it writes) and more (the general product, then one pass),
 * with x's rows apart. */
static void test_linear_kernel_matches_float64(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 7, 9, 33, 130};
    static const int64_t ks[] = {1, 7, 9, 33, 784};
    int keep = ndm__set_num_threads(1);
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        for (int64_t m = 1; m <= 6; m++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                    for (int variant = 0; variant < 3; variant++) {
                        int64_t n = ns[ni], k = ks[ki], ldx = k + 5;
                        bool with_bias = variant != 1, relu = variant != 2;
                        float *x = malloc((size_t)(m * ldx) * sizeof(float));
                        float *w = malloc((size_t)(n * k) * sizeof(float));
                        float *b = malloc((size_t)n * sizeof(float));
                        float *y = malloc((size_t)(m * n) * sizeof(float));
                        assert_true(x && w && b && y);
                        uint64_t seed = (uint64_t)(m * 7919 + n * 31 + k);
                        for (int64_t i = 0; i < m * ldx; i++)
                            x[i] = (float)((double)((seed = seed * 6364136223846793005ull + 1) >> 40) /
                                               (double)(1ull << 24) - 0.5);
                        for (int64_t i = 0; i < n * k; i++)
                            w[i] = (float)((double)((seed = seed * 6364136223846793005ull + 1) >> 40) /
                                               (double)(1ull << 24) - 0.5);
                        for (int64_t j = 0; j < n; j++)
                            b[j] = (float)j * 0.01f - 0.3f;
                        int64_t xs[2] = {m, k}, xst[2] = {ldx, 1}, ws[2] = {n, k}, wst[2] = {k, 1};
                        int64_t bs[1] = {n}, bst[1] = {1}, ys[2] = {m, n}, yst[2] = {n, 1};
                        ndm__tensor tx = {x, NDM_F32, 2, xs, xst}, tw = {w, NDM_F32, 2, ws, wst};
                        ndm__tensor tb = {b, NDM_F32, 1, bs, bst}, ty = {y, NDM_F32, 2, ys, yst};
                        assert_int_equal(ndm__cpu_linear(0, &ty, &tx, &tw, with_bias ? &tb : NULL,
                                                         relu),
                                         NDM_OK);
                        double bound = 1e-5 * (1.0 + (double)k);
                        for (int64_t i = 0; i < m; i++)
                            for (int64_t j = 0; j < n; j++) {
                                double want = with_bias ? b[j] : 0;
                                for (int64_t p = 0; p < k; p++)
                                    want += (double)x[i * ldx + p] * (double)w[j * k + p];
                                double got = y[i * n + j];
                                bool bad = relu && want < -bound ? got != 0
                                           : !(fabs(got - (relu && want < 0 ? 0 : want)) <= bound);
                                if (bad)
                                    fail_msg("%s m=%lld n=%lld k=%lld bias %d relu %d: y[%lld][%lld] "
                                             "= %.9g, want %.9g",
                                             ndm__cpu_isa_name((ndm__cpu_isa)level), (long long)m,
                                             (long long)n, (long long)k, with_bias, relu,
                                             (long long)i, (long long)j, got, want);
                            }
                        free(x), free(w), free(b), free(y);
                    }
    }
    assert_true(ndm__cpu_isa_force(-1));
    ndm__set_num_threads(keep);
}

/* Four batch-1 products over large Bs inside w (157 x 785 values) at
 * offsets 1..4, none of them at w itself. */
static void small_products_elsewhere(ndm_dtype dt, const char *w, const char *x, char *y)
{
    size_t es = ndm_dtype_size(dt);
    for (int other = 0; other < 4; other++) {
        ndm__gemm_epi e = {false, NULL, 0, NULL, 0, false};
        int64_t n = 67 - other, k = 257;
        assert_true(ndm__gemm_small(dt, 1, n, k, x, k, 1, w + (size_t)(other + 1) * es, 1, k, y,
                                    n, 1, &e));
    }
}

/* A batch-1 forward over three weights, as an MLP's request runs them,
 * repeated: the dot form alternates its direction over each B of 64 KiB or
 * more (per thread) and keeps it forward over smaller ones, every call gives
 * the first call's bits, and those agree with float64; odd sizes, so that
 * the first group met going backwards is the ragged one; f32 and f64, one
 * and three threads. */
static void test_gemm_small_direction_alternates_same_bits(void **state)
{
    (void)state;
    /* n x k per weight: two large (tracked), one small */
    static const int64_t shape[3][2] = {{157, 785}, {67, 257}, {11, 67}};
    int keep = ndm__set_num_threads(1);
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        const char *name = ndm__cpu_isa_name((ndm__cpu_isa)level);
        for (int threads = 1; threads <= 3; threads += 2)
            for (int d = 0; d < 2; d++) {
                ndm__set_num_threads(threads);
                ndm_dtype dt = d ? NDM_F64 : NDM_F32;
                size_t es = ndm_dtype_size(dt);
                char *w[3], *bias[3], *x[3], *y[3], *first[3];
                uint64_t seed = (uint64_t)(level * 2 + d + 1);
                for (int l = 0; l < 3; l++) {
                    int64_t n = shape[l][0], k = shape[l][1];
                    w[l] = malloc((size_t)(n * k) * es), bias[l] = malloc((size_t)n * es);
                    x[l] = malloc((size_t)k * es), y[l] = malloc((size_t)n * es);
                    first[l] = malloc((size_t)n * es);
                    assert_true(w[l] && bias[l] && x[l] && y[l] && first[l]);
#define VAL() ((double)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 40) / \
                   (double)(1ull << 24) - 0.5)
#define PUT(buf, i, v) (dt == NDM_F32 ? (void)(((float *)(buf))[i] = (float)(v)) \
                                      : (void)(((double *)(buf))[i] = (v)))
#define GET(buf, i) (dt == NDM_F32 ? (double)((float *)(buf))[i] : ((double *)(buf))[i])
                    for (int64_t i = 0; i < n * k; i++)
                        PUT(w[l], i, VAL());
                    for (int64_t j = 0; j < n; j++)
                        PUT(bias[l], j, VAL());
                    for (int64_t p = 0; p < k; p++)
                        PUT(x[l], p, VAL());
                }
                /* what this thread saw before (a freed B's address reused) forgotten */
                small_products_elsewhere(dt, w[0], x[1], y[1]);
                for (int call = 0; call < 5; call++)
                    for (int l = 0; l < 3; l++) {
                        int64_t n = shape[l][0], k = shape[l][1];
                        bool tracked = n * k * (int64_t)es >= 64 * 1024;
                        /* a new B starts forward, then alternates */
                        bool rev = ndm__gemm_small_next_reversed(w[l]);
                        if (rev != (tracked && call % 2 == 1))
                            fail_msg("%s %s threads %d call %d weight %d: direction %d",
                                     name, ndm_dtype_name(dt), threads, call, l, rev);
                        ndm__gemm_epi e = {false, NULL, 0, bias[l], 1, true};
                        assert_true(ndm__gemm_small(dt, 1, n, k, x[l], k, 1, w[l], 1, k, y[l], n,
                                                    1, &e));
                        if (call == 0) {
                            memcpy(first[l], y[l], (size_t)n * es);
                            double bound = (dt == NDM_F32 ? 1e-5 : 1e-13) * (1.0 + (double)k);
                            for (int64_t j = 0; j < n; j++) {
                                double want = GET(bias[l], j);
                                for (int64_t p = 0; p < k; p++)
                                    want += GET(x[l], p) * GET(w[l], j * k + p);
                                double got = GET(y[l], j);
                                if (want < -bound ? got != 0
                                                  : !(fabs(got - (want < 0 ? 0 : want)) <= bound))
                                    fail_msg("%s %s weight %d: y[%lld] = %.17g, want %.17g", name,
                                             ndm_dtype_name(dt), l, (long long)j, got, want);
                            }
                        } else if (memcmp(first[l], y[l], (size_t)n * es) != 0) {
                            fail_msg("%s %s threads %d call %d weight %d: not the first "
                                     "call's bits", name, ndm_dtype_name(dt), threads, call, l);
                        }
                    }
#undef VAL
#undef PUT
#undef GET
                /* the thread keeps a few Bs: four other large ones push the
                 * first out, and it starts forward again */
                assert_true(ndm__gemm_small_next_reversed(w[0]));
                small_products_elsewhere(dt, w[0], x[1], y[1]);
                assert_false(ndm__gemm_small_next_reversed(w[0]));
                for (int l = 0; l < 3; l++)
                    free(w[l]), free(bias[l]), free(x[l]), free(y[l]), free(first[l]);
            }
    }
    assert_true(ndm__cpu_isa_force(-1));
    ndm__set_num_threads(keep);
}

/* With OpenBLAS, the products of a training step (a convolution's, a linear
 * layer's) run on ndm's pool, not the provider's; products it runs on the
 * calling thread and very large ones still go to it. */
static void test_gemm_step_products_avoid_provider_pool(void **state)
{
    (void)state;
    static const int64_t step[][3] = {{64, 196, 288}, {288, 196, 64}, {64, 288, 196},
                                      {128, 128, 3136}, {128, 3136, 128}, {3136, 128, 128},
                                      {128, 256, 784}, {256, 256, 256}};
    static const int64_t provider[][3] = {{64, 64, 64}, {2, 2, 2}, {1024, 1024, 1024}};
    bool openblas = !strcmp(ndm_gemm_provider(), "openblas");
    bool blis = !strcmp(ndm_gemm_provider(), "blis");
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++) {
        bool uses = ndm__gemm_uses_provider(step[i][0], step[i][1], step[i][2]);
        if (uses != blis)
            fail_msg("%lld x %lld x %lld: provider %s", (long long)step[i][0],
                     (long long)step[i][1], (long long)step[i][2], uses ? "yes" : "no");
    }
    for (size_t i = 0; i < sizeof provider / sizeof provider[0]; i++)
        assert_true(ndm__gemm_uses_provider(provider[i][0], provider[i][1], provider[i][2]) ==
                    (openblas || blis));
}

/* Mid-sized products (the range ndm's kernel takes from the provider):
 * edges along m, n and k, a bias, accumulation; against float64 products,
 * on one thread and on several. */
static void test_gemm_mid_products_match_float64(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {70, 150, 300}, {130, 67, 1000}, {5, 3000, 200}, {300, 20, 129}, {9, 9, 5000}};
    int keep = ndm__set_num_threads(1);
    for (int threads = 1; threads <= 3; threads += 2) {
        ndm__set_num_threads(threads);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int d = 0; d < 2; d++)
                for (int form = 0; form < 2; form++)
                    check_small(d ? NDM_F64 : NDM_F32, shapes[i][0], shapes[i][1],
                                shapes[i][2], form == 0, 1, (int)((i + (size_t)form) % 3),
                                "mid");
    }
    ndm__set_num_threads(keep);
}

/* ndm's blocked kernel (no provider) on one layout of A and B: A's rows
 * contiguous or its columns (a layer's input transposed, for a weight's
 * gradient), B's rows contiguous or its columns (a weight read as W^T), both
 * with gaps between lines; mode 0 plain, 1 a bias per row, 2 accumulating.
 * Against float64; the gaps of C must stay as they were. */
static void check_blocked(ndm_dtype dt, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                          int mode, const char *level)
{
    size_t es = ndm_dtype_size(dt);
    int64_t lda = ta ? m + 1 : k + 3, ldb = tb ? k + 2 : n + 1, ldc = n + 2;
    int64_t rsa = ta ? 1 : lda, csa = ta ? lda : 1, rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    char *a = malloc((size_t)na * es), *b = malloc((size_t)nb * es);
    char *c = malloc((size_t)nc * es), *bias = malloc((size_t)m * es);
    double *c0 = malloc((size_t)nc * sizeof(double));
    assert_true(a && b && c && bias && c0);
    uint64_t seed = (uint64_t)(m * 1000003 + n * 1009 + k * 7 + ta * 2 + tb);
#define VAL() ((double)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 40) / \
                   (double)(1ull << 24) - 0.5)
#define PUT(buf, i, v) (dt == NDM_F32 ? (void)(((float *)(buf))[i] = (float)(v)) \
                                      : (void)(((double *)(buf))[i] = (v)))
#define GET(buf, i) (dt == NDM_F32 ? (double)((float *)(buf))[i] : ((double *)(buf))[i])
    for (int64_t i = 0; i < na; i++)
        PUT(a, i, VAL());
    for (int64_t i = 0; i < nb; i++)
        PUT(b, i, VAL());
    for (int64_t i = 0; i < m; i++)
        PUT(bias, i, VAL());
    for (int64_t i = 0; i < nc; i++) {
        PUT(c, i, VAL());
        c0[i] = GET(c, i);
    }
    ndm_status st = ndm__cpu_gemm_bias(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, ldc, 1,
                                       mode == 1 ? bias : NULL, 1,
                                       NDM__GEMM_NO_PROVIDER |
                                           (mode == 2 ? NDM__GEMM_ACCUMULATE : 0));
    if (st != NDM_OK)
        fail_msg("%s gemm returned %s", level, ndm_status_name(st));
    double tol = (dt == NDM_F32 ? 1e-6 : 1e-14) * (1.0 + (double)k);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double got = GET(c, i * ldc + j), want = c0[i * ldc + j];
            if (j < n) {
                want = mode == 1 ? GET(bias, i) : mode == 2 ? want : 0;
                for (int64_t p = 0; p < k; p++)
                    want += GET(a, i * rsa + p * csa) * GET(b, p * rsb + j * csb);
            }
            if (!(fabs(got - want) <= (j < n ? tol : 0)))
                fail_msg("%s %s m=%lld n=%lld k=%lld A%s B%s mode=%d: C[%lld][%lld] = %.9g, "
                         "want %.9g", level, ndm_dtype_name(dt), (long long)m, (long long)n,
                         (long long)k, ta ? "^T" : "", tb ? "^T" : "", mode, (long long)i,
                         (long long)j, got, want);
        }
#undef VAL
#undef PUT
#undef GET
    free(a), free(b), free(c), free(bias), free(c0);
}

/* The blocked kernel's packing at every CPU level: A and B in both
 * layouts (the transposing packs take A's contiguous rows and B's
 * contiguous columns), sizes around the panel widths (6, 12, 16, 32) and
 * the transposes' 8, depths that leave a remainder of a block or split
 * into several blocks, partial panels, one thread and several. */
static void test_gemm_blocked_packs_every_layout(void **state)
{
    (void)state;
    static const int64_t ms[] = {5, 6, 7, 13, 25, 130};
    static const int64_t ns[] = {7, 16, 17, 40, 65};
    static const int64_t ks[] = {5, 8, 9, 23, 300, 784};
    int keep = ndm__set_num_threads(1);
    int levels = 0;
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        levels++;
        const char *name = ndm__cpu_isa_name((ndm__cpu_isa)level);
        for (int threads = 1; threads <= 2; threads++) {
            ndm__set_num_threads(threads);
            for (int d = 0; d < 2; d++)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                            for (int form = 0; form < 4; form++) {
                                if (threads == 2 && (mi + ni + ki) % 3)
                                    continue;
                                check_blocked(d ? NDM_F64 : NDM_F32, ms[mi], ns[ni], ks[ki],
                                              form & 1, form & 2,
                                              (int)((mi + ni + ki + (size_t)form) % 3), name);
                            }
        }
    }
    assert_true(ndm__cpu_isa_force(-1));
    ndm__set_num_threads(keep);
    assert_true(levels >= 1);
}

/* The convolution's entry (A packed by the caller, B's panels written by a
 * callback) reading B through ndm__gemm_matrix_panel in both layouts. */
static void test_gemm_packed_matrix_panels_both_layouts(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{7, 17, 9}, {13, 40, 300}, {25, 65, 23}, {6, 16, 8}};
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int form = 0; form < 4; form++) {
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                bool ta = form & 1, tb = form & 2;
                int64_t lda = ta ? m + 1 : k + 3, ldb = tb ? k + 2 : n + 1;
                float *a = malloc((size_t)((ta ? k : m) * lda) * sizeof(float));
                float *b = malloc((size_t)((tb ? n : k) * ldb) * sizeof(float));
                float *c = malloc((size_t)(m * n) * sizeof(float));
                void *ap = aligned_alloc(64, (ndm__gemm_packed_a_bytes(NDM_F32, m, k) + 63) / 64 * 64);
                assert_true(a && b && c && ap);
                for (int64_t i = 0; i < (ta ? k : m) * lda; i++)
                    a[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
                for (int64_t i = 0; i < (tb ? n : k) * ldb; i++)
                    b[i] = (float)((i * 53) % 97) / 97.0f - 0.5f;
                int64_t rsa = ta ? 1 : lda, csa = ta ? lda : 1;
                ndm__gemm_matrix bm = {b, tb ? 1 : ldb, tb ? ldb : 1, sizeof(float)};
                ndm__gemm_pack_a(NDM_F32, m, k, a, rsa, csa, ap);
                assert_int_equal(ndm__gemm_packed(NDM_F32, m, n, k, ap, ndm__gemm_matrix_panel,
                                                  &bm, c, n, 1, NULL, 0, 0),
                                 NDM_OK);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double want = 0;
                        for (int64_t p = 0; p < k; p++)
                            want += (double)a[i * rsa + p * csa] * (double)b[p * bm.rs + j * bm.cs];
                        if (!(fabs(c[i * n + j] - want) <= 1e-6 * (1.0 + (double)k)))
                            fail_msg("%s m=%lld n=%lld k=%lld A%s B%s: C[%lld][%lld] = %.9g, "
                                     "want %.9g", ndm__cpu_isa_name((ndm__cpu_isa)level),
                                     (long long)m, (long long)n, (long long)k, ta ? "^T" : "",
                                     tb ? "^T" : "", (long long)i, (long long)j, c[i * n + j],
                                     want);
                    }
                free(a), free(b), free(c), free(ap);
            }
    }
    assert_true(ndm__cpu_isa_force(-1));
}

#if defined(__linux__)
static double cpu_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#endif

/* With a pool of one thread, a step-sized product runs on the calling
 * thread alone: the provider's own threads (OpenBLAS starts some when it loads)
 * take no share of the work and do not spin beside it. Measured as CPU
 * time, not wall time, so other load on the machine does not matter. */
static void test_gemm_provider_runs_on_calling_thread(void **state)
{
    (void)state;
#if defined(__linux__)
    int keep = ndm__set_num_threads(1);
    /* threads the provider woke earlier in this process fall asleep */
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    int64_t n = 384;
    float *a = malloc((size_t)(n * n) * sizeof(float)), *b = malloc((size_t)(n * n) * sizeof(float));
    float *c = malloc((size_t)(n * n) * sizeof(float));
    assert_non_null(a), assert_non_null(b), assert_non_null(c);
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)(i % 17) * 0.25f - 2.0f;
        b[i] = (float)(i % 13) * 0.5f - 3.0f;
    }
    double p0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID), t0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < 4; r++)
        assert_int_equal(ndm__cpu_gemm(NDM_F32, n, n, n, a, n, 1, b, n, 1, c, n, 1, 0), NDM_OK);
    double own = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
    double others = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - p0 - own;
    double want = 0;
    for (int64_t p = 0; p < n; p++)
        want += (double)a[5 * n + p] * (double)b[p * n + 7];
    assert_true(fabs(c[5 * n + 7] - want) <= 1e-3 * (1.0 + fabs(want)));
    if (others > 0.1 * own)
        fail_msg("other threads used %.3f s of CPU beside the caller's %.3f s", others, own);
    free(a), free(b), free(c);
    ndm__set_num_threads(keep);
#endif
}

static void test_gemm_provider_is_named(void **state)
{
    (void)state;
    assert_string_equal(ndm_gemm_provider(), NDM_BLAS_PROVIDER);
    const char *p = ndm_gemm_provider();
    assert_true(!strcmp(p, "openblas") || !strcmp(p, "blis") || !strcmp(p, "none"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_matmul_2d_matches_reference),
        TEST(test_matmul_every_dtype),
        TEST(test_matmul_integers_wrap_as_numpy),
        TEST(test_matmul_strided_views),
        TEST(test_matmul_1d_rules),
        TEST(test_matmul_batches_broadcast),
        TEST(test_matmul_empty_sizes),
        TEST(test_matmul_shape_errors),
        TEST(test_matmul_count_overflow_allocates_nothing),
        TEST(test_dot_follows_numpy),
        TEST(test_outer_flattens_views),
        TEST(test_matmul_stale_and_null_inputs),
        TEST(test_matmul_output_rule_and_temporaries),
        TEST(test_matmul_capped_and_failing_allocations),
        TEST(test_gemm_provider_is_named),
        TEST(test_gemm_small_path_every_level),
        TEST(test_linear_kernel_matches_float64),
        TEST(test_gemm_small_direction_alternates_same_bits),
        TEST(test_gemm_step_products_avoid_provider_pool),
        TEST(test_gemm_mid_products_match_float64),
        TEST(test_gemm_blocked_packs_every_layout),
        TEST(test_gemm_packed_matrix_panels_both_layouts),
        TEST(test_gemm_provider_runs_on_calling_thread),
    };
    return cmocka_run_group_tests_name("linalg", tests, NULL, NULL);
}
