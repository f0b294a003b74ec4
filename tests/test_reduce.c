/* Reductions and softmax: every op against float64 references computed here,
 * on every dtype, views, empty and 0-d arrays, NaN and Inf; the error paths,
 * the output rule, and the reference kernels against the fast ones. */
#include "backends/backend.h"
#include "check_numeric.h"
#include "manager/alloc/alloc.h"

typedef enum op {
    OP_SUM, OP_PROD, OP_MEAN, OP_VAR, OP_STD, OP_MAX, OP_MIN,
    OP_ARGMAX, OP_ARGMIN, OP_ALL, OP_ANY, OP_LSE, OP_COUNT
} op;

static const char *op_names[] = {"sum", "prod", "mean", "var", "std", "max", "min",
                                 "argmax", "argmin", "all", "any", "logsumexp"};

static bool is_arg(op o) { return o == OP_ARGMAX || o == OP_ARGMIN; }
static bool no_identity(op o) { return o == OP_MAX || o == OP_MIN || is_arg(o); }

static ndm_array run_op(op o, ndm_array a, bool keepdim, int n, const int *axes, int ddof)
{
    switch (o) {
    case OP_SUM: return ndm_sum(a, keepdim, n, axes);
    case OP_PROD: return ndm_prod(a, keepdim, n, axes);
    case OP_MEAN: return ndm_mean(a, keepdim, n, axes);
    case OP_VAR: return ndm_var(a, ddof, keepdim, n, axes);
    case OP_STD: return ndm_std(a, ddof, keepdim, n, axes);
    case OP_MAX: return ndm_max(a, keepdim, n, axes);
    case OP_MIN: return ndm_min(a, keepdim, n, axes);
    case OP_ARGMAX: return ndm_argmax(a, n < 0 ? NDM_ALL_AXES : axes[0], keepdim);
    case OP_ARGMIN: return ndm_argmin(a, n < 0 ? NDM_ALL_AXES : axes[0], keepdim);
    case OP_ALL: return ndm_all(a, keepdim, n, axes);
    case OP_ANY: return ndm_any(a, keepdim, n, axes);
    case OP_LSE: return ndm_logsumexp(a, keepdim, n, axes);
    default: return NDM_NULL_ARRAY;
    }
}

static ndm_dtype want_dtype(op o, ndm_dtype t)
{
    bool fl = ndm_dtype_is_float(t);
    switch (o) {
    case OP_SUM: case OP_PROD: return fl ? t : NDM_I64;
    case OP_MEAN: case OP_VAR: case OP_STD: case OP_LSE: return fl ? t : NDM_F32;
    case OP_MAX: case OP_MIN: return t;
    case OP_ARGMAX: case OP_ARGMIN: return NDM_I64;
    default: return NDM_BOOL;
    }
}

/* One output of the float64 reference over its R values in C order. */
static double ref_one(op o, const double *v, int64_t R, int ddof)
{
    double s = 0, m, best;
    int64_t at = 0;
    bool nan = false;
    for (int64_t i = 0; i < R; i++)
        nan |= isnan(v[i]);
    switch (o) {
    case OP_SUM:
        for (int64_t i = 0; i < R; i++)
            s += v[i];
        return s;
    case OP_PROD:
        s = 1;
        for (int64_t i = 0; i < R; i++)
            s *= v[i];
        return s;
    case OP_MEAN:
        for (int64_t i = 0; i < R; i++)
            s += v[i];
        return R ? s / (double)R : NAN;
    case OP_VAR:
    case OP_STD: {
        if (!R)
            return NAN;
        for (int64_t i = 0; i < R; i++)
            s += v[i];
        double mean = s / (double)R, ss = 0, sd = 0;
        for (int64_t i = 0; i < R; i++) {
            ss += (v[i] - mean) * (v[i] - mean);
            sd += v[i] - mean;
        }
        ss -= sd * sd / (double)R;
        double den = (double)(R - ddof);
        double var = ss / (den > 0 ? den : 0.0);
        return o == OP_STD ? sqrt(var) : var;
    }
    case OP_MAX:
    case OP_MIN:
        if (nan)
            return NAN;
        m = o == OP_MAX ? -INFINITY : INFINITY;
        for (int64_t i = 0; i < R; i++)
            m = o == OP_MAX ? fmax(m, v[i]) : fmin(m, v[i]);
        return m;
    case OP_ARGMAX:
    case OP_ARGMIN:
        for (int64_t i = 0; i < R; i++)
            if (isnan(v[i]))
                return (double)i;
        best = v[0];
        for (int64_t i = 1; i < R; i++)
            if (o == OP_ARGMAX ? v[i] > best : v[i] < best) {
                best = v[i];
                at = i;
            }
        return (double)at;
    case OP_ALL:
        for (int64_t i = 0; i < R; i++)
            if (v[i] == 0)
                return 0;
        return 1;
    case OP_ANY:
        for (int64_t i = 0; i < R; i++)
            if (v[i] != 0)
                return 1;
        return 0;
    case OP_LSE:
        if (nan)
            return NAN;
        m = -INFINITY;
        for (int64_t i = 0; i < R; i++)
            m = fmax(m, v[i]);
        if (isinf(m))
            return m;
        for (int64_t i = 0; i < R; i++)
            s += exp(v[i] - m);
        return m + log(s);
    default:
        return 0;
    }
}

/* Reference results in output C order; *scale gets, per output, the size
 * of its terms for the tolerance. */
static double *ref_reduce(op o, const double *x, int nd, const int64_t *shape, const bool *red,
                          int ddof, int64_t *nout, double **scale)
{
    int64_t K = 1, R = 1, N = shape_numel(nd, shape);
    for (int i = 0; i < nd; i++)
        *(red[i] ? &R : &K) *= shape[i];
    double *vals = malloc(sizeof(double) * (size_t)(N ? N : 1));
    double *out = malloc(sizeof(double) * (size_t)(K ? K : 1));
    *scale = calloc((size_t)(K ? K : 1), sizeof(double));
    int64_t idx[16] = {0};
    for (int64_t i = 0; i < N; i++) {
        int64_t kf = 0, rf = 0;
        for (int d = 0; d < nd; d++) {
            if (red[d])
                rf = rf * shape[d] + idx[d];
            else
                kf = kf * shape[d] + idx[d];
        }
        vals[kf * R + rf] = x[i];
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < shape[d])
                break;
            idx[d] = 0;
        }
    }
    for (int64_t k = 0; k < K; k++) {
        out[k] = ref_one(o, vals + k * R, R, ddof);
        for (int64_t r = 0; r < R; r++)
            if (isfinite(vals[k * R + r]))
                (*scale)[k] += fabs(vals[k * R + r]) + vals[k * R + r] * vals[k * R + r];
    }
    *nout = K;
    free(vals);
    return out;
}

/* Run op on a (whose C-order values are x) and compare with the reference. */
static void check(op o, ndm_array a, const double *x, bool keepdim, int n, const int *axes,
                  int ddof, const char *what)
{
    int nd;
    int64_t *shape = shape_of(a, &nd);
    bool red[16] = {false};
    for (int i = 0; i < nd; i++)
        red[i] = n < 0;
    for (int i = 0; i < n; i++)
        red[axes[i] < 0 ? axes[i] + nd : axes[i]] = true;
    char msg[256];
    snprintf(msg, sizeof msg, "%s %s of %s (keepdim %d, %d axes)", what, op_names[o],
             ndm_dtype_short(ndm_array_dtype(a)), keepdim, n);
    ndm_array r = run_op(o, a, keepdim, n, axes, ddof);
    if (!r.id)
        fail_msg("%s: %s", msg, ndm_last_error());
    assert_int_equal(ndm_array_dtype(r), want_dtype(o, ndm_array_dtype(a)));
    int rnd;
    int64_t *rs = shape_of(r, &rnd);
    int j = 0;
    for (int i = 0; i < nd; i++) {
        if (red[i] && !keepdim)
            continue;
        assert_true(j < rnd);
        assert_int_equal(rs[j], red[i] ? 1 : shape[i]);
        j++;
    }
    assert_int_equal(j, rnd);
    int64_t K;
    double *scale;
    double *want = ref_reduce(o, x, nd, shape, red, ddof, &K, &scale);
    double *got = read_array(r);
    ndm_dtype odt = ndm_array_dtype(r);
    for (int64_t k = 0; k < K; k++) {
        double rtol = ndm_dtype_is_float(odt) ? dtype_rtol(odt) : 0;
        double atol = ndm_dtype_is_float(odt) ? 1e-10 * scale[k] + 1e-7 : 0;
        if (o == OP_PROD && ndm_dtype_is_float(odt))
            rtol *= 4;
        if (!close_to(got[k], want[k], rtol, atol))
            fail_msg("%s: output %lld is %.17g, expected %.17g", msg, (long long)k, got[k],
                     want[k]);
    }
    free(want);
    free(scale);
    free(got);
    free(rs);
    free(shape);
    release(r);
}

typedef struct axcase {
    int n;
    int axes[4];
} axcase;

typedef struct shcase {
    int nd;
    int64_t shape[4];
    int ncase;
    axcase cases[6];
} shcase;

/* n = -1: every axis; n = 0: none. */
static const shcase shapes[] = {
    {1, {5}, 4, {{1, {0}}, {1, {-1}}, {-1, {0}}, {0, {0}}}},
    {2, {3, 4}, 5, {{1, {0}}, {1, {1}}, {1, {-1}}, {2, {0, 1}}, {2, {1, 0}}}},
    {3, {2, 3, 4}, 5, {{2, {0, 2}}, {1, {1}}, {2, {-3, -1}}, {-1, {0}}, {1, {-2}}}},
    {3, {4, 1, 3}, 3, {{1, {1}}, {2, {0, 2}}, {1, {2}}}},
    {3, {3, 0, 2}, 2, {{1, {0}}, {1, {2}}}},
    {0, {0}, 2, {{-1, {0}}, {0, {0}}}},
    {4, {2, 3, 2, 5}, 4, {{2, {1, 3}}, {1, {3}}, {3, {0, 1, 2}}, {1, {0}}}},
};

static void check_all_cases(op o, ndm_manager m, ndm_dtype t, uint64_t seed)
{
    rng g = rng_new(seed);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shcase *sc = &shapes[s];
        int64_t n = shape_numel(sc->nd, sc->shape);
        double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
        rng_fill(&g, t, x, n);
        ndm_array a = make_array(m, t, x, sc->nd, sc->shape);
        for (int c = 0; c < sc->ncase; c++) {
            const axcase *ac = &sc->cases[c];
            if (is_arg(o) && ac->n > 1)
                continue;
            if (is_arg(o) && ac->n == 0)
                continue;
            /* an empty reduced block with outputs left has no identity */
            bool empty = false;
            for (int i = 0; i < sc->nd; i++) {
                bool r = ac->n < 0;
                for (int j = 0; j < ac->n; j++)
                    r |= (ac->axes[j] < 0 ? ac->axes[j] + sc->nd : ac->axes[j]) == i;
                if (r && sc->shape[i] == 0)
                    empty = true;
            }
            if (empty && no_identity(o) && n == 0) {
                int64_t kept = 1;
                for (int i = 0; i < sc->nd; i++) {
                    bool r = ac->n < 0;
                    for (int j = 0; j < ac->n; j++)
                        r |= (ac->axes[j] < 0 ? ac->axes[j] + sc->nd : ac->axes[j]) == i;
                    if (!r)
                        kept *= sc->shape[i];
                }
                if (kept > 0)
                    continue;
            }
            for (int kd = 0; kd < 2; kd++)
                check(o, a, x, kd, ac->n, ac->axes, 1, "case");
        }
        release(a);
        free(x);
    }
}

#define OP_TEST(name, o)                                                        \
    static void test_reduce_##name##_matches_reference(void **state)            \
    {                                                                           \
        for (int d = 0; d < N_DTYPES; d++)                                  \
            check_all_cases((o), ROOT(state), all_dtypes[d], 100 + (uint64_t)d); \
    }
OP_TEST(sum, OP_SUM)
OP_TEST(prod, OP_PROD)
OP_TEST(mean, OP_MEAN)
OP_TEST(var, OP_VAR)
OP_TEST(std, OP_STD)
OP_TEST(max, OP_MAX)
OP_TEST(min, OP_MIN)
OP_TEST(argmax, OP_ARGMAX)
OP_TEST(argmin, OP_ARGMIN)
OP_TEST(all, OP_ALL)
OP_TEST(any, OP_ANY)
OP_TEST(logsumexp, OP_LSE)

/* Transposed, stepped, flipped and broadcast (stride 0) views. */
static void test_reduce_views_match_reference(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(7);
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_I32, NDM_F16};
    for (size_t ti = 0; ti < 4; ti++) {
        ndm_dtype t = types[ti];
        double x[4 * 6 * 5];
        rng_fill(&g, t, x, 120);
        ndm_array base = make_array(m, t, x, NDM_SHAPE(4, 6, 5));
        double one[6 * 5];
        rng_fill(&g, t, one, 30);
        ndm_array small = make_array(m, t, one, NDM_SHAPE(1, 6, 5));
        ndm_array views[5], inner[2];
        views[0] = ndm_permute(base, 3, ((const int[]){2, 0, 1}));
        views[1] = ndm_slice(base, 1, 0, NDM_END, 2);
        inner[0] = ndm_slice(base, 2, NDM_END, -6, -1);
        views[2] = ndm_slice(inner[0], 0, 1, 4, 1);
        views[3] = ndm_expand(small, NDM_SHAPE(3, 6, 5));
        inner[1] = ndm_select(base, 0, 2);
        views[4] = ndm_transpose(inner[1]);
        for (int v = 0; v < 5; v++) {
            assert_live(views[v]);
            double *xv = read_array(views[v]);
            int nd = ndm_array_ndim(views[v]);
            for (int o = 0; o < OP_COUNT; o++) {
                if (is_arg((op)o)) {
                    check((op)o, views[v], xv, false, 1, (const int[]){1}, 0, "view");
                    check((op)o, views[v], xv, true, -1, NULL, 0, "view");
                    continue;
                }
                check((op)o, views[v], xv, false, -1, NULL, 1, "view");
                check((op)o, views[v], xv, true, 1, (const int[]){0}, 0, "view");
                check((op)o, views[v], xv, false, 1, (const int[]){nd - 1}, 1, "view");
                if (nd == 3)
                    check((op)o, views[v], xv, false, 2, (const int[]){0, 2}, 0, "view");
            }
            free(xv);
        }
        for (int v = 0; v < 5; v++)
            release(views[v]);
        release(inner[0]);
        release(inner[1]);
        release(base);
        release(small);
    }
}

/* Sizes that reach the parallel paths: split reductions (few outputs, many
 * elements), vertical blocks wider than one lane block, long rows. */
static void test_reduce_large_parallel_paths(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(11);
    struct {
        int nd;
        int64_t shape[2];
        int n;
        int axes[2];
    } cases[] = {
        {1, {300001}, -1, {0}},     {2, {3, 100003}, 1, {1}}, {2, {100003, 3}, 1, {0}},
        {2, {1, 70001}, 1, {1}},    {2, {600, 700}, 1, {0}},  {2, {700, 600}, 1, {1}},
        {2, {2, 131072}, -1, {0}},  {2, {70001, 1}, 1, {0}},
    };
    /* the last entry repeats f32 with few distinct values: ties across parts */
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_I32, NDM_U8, NDM_F32};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t ti = 0; ti < 5; ti++) {
            int64_t n = shape_numel(cases[c].nd, cases[c].shape);
            double *x = malloc(sizeof(double) * (size_t)n);
            rng_fill(&g, types[ti], x, n);
            if (ti == 4)
                for (int64_t i = 0; i < n; i++)
                    x[i] = floor(x[i]);
            ndm_array a = make_array(m, types[ti], x, cases[c].nd, cases[c].shape);
            for (int o = 0; o < OP_COUNT; o++) {
                if (o == OP_PROD)
                    continue; /* products of 1e5 values under/overflow either way */
                if (is_arg((op)o) && cases[c].n > 1)
                    continue;
                check((op)o, a, x, false, cases[c].n, cases[c].axes, 1, "large");
            }
            release(a);
            free(x);
        }
}

static void test_reduce_dtypes_follow_rules(void **state)
{
    ndm_manager m = ROOT(state);
    double v[4] = {1, 0, 1, 1};
    ndm_array b = make_array(m, NDM_BOOL, v, NDM_SHAPE(4));
    ndm_array s = ndm_sum(b, false, NDM_ALL_AXES_LIST);
    assert_int_equal(ndm_array_dtype(s), NDM_I64);
    int64_t iv;
    assert_ok(ndm_item_i64(s, &iv));
    assert_int_equal(iv, 3);
    ndm_array mean = ndm_mean(b, false, NDM_ALL_AXES_LIST);
    assert_int_equal(ndm_array_dtype(mean), NDM_F32);
    double d;
    assert_ok(ndm_item(mean, &d));
    assert_true(d == 0.75);
    ndm_array mx = ndm_max(b, false, NDM_ALL_AXES_LIST);
    assert_int_equal(ndm_array_dtype(mx), NDM_BOOL);
    ndm_array all = ndm_all(b, false, NDM_ALL_AXES_LIST);
    assert_int_equal(ndm_array_dtype(all), NDM_BOOL);
    assert_ok(ndm_item(all, &d));
    assert_true(d == 0);
    double w[3] = {200, 100, 3};
    ndm_array u = make_array(m, NDM_U8, w, NDM_SHAPE(3));
    ndm_array p = ndm_prod(u, false, NDM_ALL_AXES_LIST);
    assert_int_equal(ndm_array_dtype(p), NDM_I64);
    assert_ok(ndm_item_i64(p, &iv));
    assert_int_equal(iv, 60000); /* int64 accumulation: no u8 wrap */
    ndm_array none = ndm_sum(u, false, NDM_NO_AXES);
    assert_int_equal(ndm_array_dtype(none), NDM_I64);
    assert_shape(none, 3);
    release(s), release(mean), release(mx), release(all), release(p), release(none);
    release(b), release(u);
}

static void test_reduce_int64_sum_wraps(void **state)
{
    ndm_manager m = ROOT(state);
    int64_t v[2] = {INT64_MAX, 2};
    ndm_array a = ndm_from_buffer(m, NDM_I64, v, NDM_SHAPE(2));
    assert_live(a);
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        ndm_array s = ndm_sum(a, false, NDM_ALL_AXES_LIST);
        int64_t got;
        assert_ok(ndm_item_i64(s, &got));
        assert_true(got == INT64_MIN + 1);
        release(s);
    }
    ndm__cpu_force_reference(false);
    release(a);
}

static void test_reduce_empty_identities(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 0));
    assert_live(e);
    struct {
        op o;
        double want;
    } cases[] = {{OP_SUM, 0},        {OP_PROD, 1}, {OP_MEAN, NAN}, {OP_VAR, NAN},
                 {OP_STD, NAN},      {OP_ALL, 1},  {OP_ANY, 0},    {OP_LSE, -INFINITY}};
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            ndm_array r = run_op(cases[c].o, e, false, 1, (const int[]){1}, 0);
            assert_live(r);
            assert_shape(r, 2);
            double *got = read_array(r);
            for (int i = 0; i < 2; i++)
                if (!close_to(got[i], cases[c].want, 0, 0))
                    fail_msg("%s of an empty axis is %g, expected %g", op_names[cases[c].o],
                             got[i], cases[c].want);
            free(got);
            release(r);
        }
    }
    ndm__cpu_force_reference(false);
    /* reducing the non-empty axis gives an empty result, even for max */
    ndm_array r = ndm_max(e, false, NDM_AXES(0));
    assert_live(r);
    assert_shape(r, 0);
    release(r);
    release(e);
}

static void test_reduce_empty_max_is_shape_error(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array e = ndm_zeros(m, NDM_F64, NDM_SHAPE(3, 0));
    assert_fails(ndm_max(e, false, NDM_AXES(1)), NDM_E_SHAPE, "no identity");
    assert_fails(ndm_min(e, true, NDM_ALL_AXES_LIST), NDM_E_SHAPE, "axis 1 has size 0");
    assert_fails(ndm_argmax(e, 1, false), NDM_E_SHAPE, "empty reduction");
    assert_fails(ndm_argmin(e, NDM_ALL_AXES, false), NDM_E_SHAPE, "f64[3,0]");
    assert_int_equal(test_live_arrays(m), 1);
    release(e);
}

static void test_reduce_nan_and_inf(void **state)
{
    ndm_manager m = ROOT(state);
    double v[6] = {1, NAN, 3, INFINITY, NAN, -2};
    ndm_array a = make_array(m, NDM_F32, v, NDM_SHAPE(6));
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        for (int o = 0; o < OP_COUNT; o++)
            check((op)o, a, v, false, -1, NULL, 0, ref ? "nan (reference)" : "nan");
        double w[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        ndm_array ninf = make_array(m, NDM_F64, w, NDM_SHAPE(2, 2));
        check(OP_LSE, ninf, w, false, 1, (const int[]){1}, 0, "all -inf");
        check(OP_MAX, ninf, w, false, 1, (const int[]){0}, 0, "all -inf");
        check(OP_ARGMAX, ninf, w, false, 1, (const int[]){1}, 0, "all -inf");
        double z[3] = {INFINITY, 1, 2};
        ndm_array pinf = make_array(m, NDM_F64, z, NDM_SHAPE(3));
        check(OP_LSE, pinf, z, false, -1, NULL, 0, "+inf");
        check(OP_SUM, pinf, z, false, -1, NULL, 0, "+inf");
        check(OP_ARGMAX, pinf, z, false, -1, NULL, 0, "+inf");
        release(ninf);
        release(pinf);
    }
    ndm__cpu_force_reference(false);
    ndm_array am = ndm_argmax(a, NDM_ALL_AXES, false);
    int64_t at;
    assert_ok(ndm_item_i64(am, &at));
    assert_int_equal(at, 1); /* the first NaN */
    release(am);
    release(a);
}

static void test_reduce_var_ddof(void **state)
{
    ndm_manager m = ROOT(state);
    double v[4] = {1, 2, 3, 4};
    ndm_array a = make_array(m, NDM_F64, v, NDM_SHAPE(4));
    double want[] = {1.25, 5.0 / 3.0, 2.5, 5.0, INFINITY, INFINITY};
    for (int ddof = 0; ddof < 6; ddof++) {
        ndm_array r = ndm_var(a, ddof, false, NDM_ALL_AXES_LIST);
        double d;
        assert_ok(ndm_item(r, &d));
        if (!close_to(d, want[ddof], 1e-15, 0))
            fail_msg("var ddof %d is %g, expected %g", ddof, d, want[ddof]);
        release(r);
    }
    double c[3] = {7, 7, 7};
    ndm_array k = make_array(m, NDM_F64, c, NDM_SHAPE(3));
    ndm_array r = ndm_var(k, 3, false, NDM_ALL_AXES_LIST);
    double d;
    assert_ok(ndm_item(r, &d));
    assert_true(isnan(d)); /* 0 / 0, as numpy */
    release(r);
    assert_fails(ndm_var(a, -1, false, NDM_ALL_AXES_LIST), NDM_E_INVALID, "ddof");
    /* A mean that rounds (the sum needs more than 53 bits): the second term
     * of the corrected two-pass formula removes its error. Exact: 0.75. */
    double big[4] = {1e16, 1e16 + 2, 1e16 + 2, 1e16 + 2};
    ndm_array bg = make_array(m, NDM_F64, big, NDM_SHAPE(4));
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        ndm_array bv = ndm_var(bg, 0, false, NDM_ALL_AXES_LIST);
        assert_ok(ndm_item(bv, &d));
        if (d != 0.75)
            fail_msg("var of 1e16 + {0, 2, 2, 2} is %.17g, expected 0.75 (%s)", d,
                     ref ? "reference" : "fast");
        release(bv);
    }
    ndm__cpu_force_reference(false);
    release(bg);
    release(k);
    release(a);
}

static void test_reduce_axis_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3, 4));
    assert_fails(ndm_sum(a, false, NDM_AXES(3)), NDM_E_AXIS, "axis 3 is out of range");
    assert_fails(ndm_mean(a, false, NDM_AXES(-4)), NDM_E_AXIS, "out of range");
    assert_fails(ndm_max(a, false, NDM_AXES(0, 2, -1)), NDM_E_AXIS, "axis 2 is given twice");
    assert_fails(ndm_prod(a, false, NDM_AXES(1, 1)), NDM_E_AXIS, "given twice");
    assert_fails(ndm_sum(a, false, -2, NULL), NDM_E_AXIS, "-2 axes");
    assert_fails(ndm_sum(a, false, 2, NULL), NDM_E_INVALID, "axes is NULL");
    assert_fails(ndm_argmax(a, 5, false), NDM_E_AXIS, "axis 5");
    assert_fails(ndm_softmax(a, -4), NDM_E_AXIS, "out of range");
    ndm_array s = ndm_scalar(m, NDM_F32, 2);
    assert_fails(ndm_sum(s, false, NDM_AXES(0)), NDM_E_AXIS, "rank 0");
    assert_fails(ndm_argmin(s, 0, false), NDM_E_AXIS, "rank 0");
    assert_int_equal(test_live_arrays(m), 2);
    release(s);
    release(a);
}

static void test_reduce_stale_and_null_inputs(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    release(a);
    assert_fails(ndm_sum(a, false, NDM_ALL_AXES_LIST), NDM_E_CLOSED, "stale array handle");
    assert_fails(ndm_softmax(a, 0), NDM_E_CLOSED, "released");
    /* a failed result flows through the next call with its first error */
    ndm_clear_error();
    ndm_array bad = ndm_sum(a, false, NDM_ALL_AXES_LIST);
    ndm_array next = ndm_logsumexp(bad, false, NDM_ALL_AXES_LIST);
    assert_true(next.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("ndm_sum");
    ndm_clear_error();
    assert_fails(ndm_max(NDM_NULL_ARRAY, false, NDM_ALL_AXES_LIST), NDM_E_NULL, "null");
}

static void test_reduce_output_rule(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager a_m = ndm_manager_new(m, "inputs");
    ndm_manager named = ndm_manager_new(m, "named");
    ndm_array a = ndm_ones(a_m, NDM_F32, NDM_SHAPE(4, 2));
    /* first input's manager */
    ndm_array r1 = ndm_sum(a, false, NDM_AXES(0));
    assert_true(ndm_array_manager(r1).id == a_m.id);
    /* a named manager wins */
    ndm_array r2 = ndm_mean_to(named, a, false, NDM_AXES(1));
    assert_true(ndm_array_manager(r2).id == named.id);
    ndm_array r3 = ndm_softmax_to(named, a, 0);
    assert_true(ndm_array_manager(r3).id == named.id);
    /* the innermost scope catches results, and ending it releases them */
    ndm_manager s = ndm_scope_begin(m, "scope");
    ndm_array r4 = ndm_argmax(a, 0, false);
    ndm_array r5 = ndm_log_softmax(a, 1);
    assert_true(ndm_array_manager(r4).id == s.id);
    assert_true(ndm_array_manager(r5).id == s.id);
    ndm_array r6 = ndm_max_to(named, a, false, NDM_ALL_AXES_LIST);
    assert_true(ndm_array_manager(r6).id == named.id);
    assert_ok(ndm_scope_end(s, 1, &r4));
    assert_false(ndm_array_valid(r5));
    assert_true(ndm_array_manager(r4).id == m.id);
    release(r4);
    assert_ok(ndm_manager_close(named));
    assert_false(ndm_array_valid(r2));
    release(r1);
    assert_ok(ndm_manager_close(a_m));
}

static void test_reduce_capped_manager_refuses(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(8, 8));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_fails(ndm_sum(w, false, NDM_AXES(0)), NDM_E_CAPPED, "capped");
    assert_fails(ndm_softmax(w, 1), NDM_E_CAPPED, "capped");
    ndm_stats st;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    /* naming an uncapped manager works */
    ndm_array r = ndm_sum_to(m, w, false, NDM_AXES(0));
    assert_live(r);
    release(r);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
}

static void test_reduce_alloc_failure_leaks_nothing(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(5, 4));
    ndm__alloc_fail_after(1);
    assert_fails(ndm_var(a, 0, false, NDM_AXES(1)), NDM_E_OOM, "out of memory");
    ndm__alloc_fail_after(1);
    assert_fails(ndm_softmax(a, 0), NDM_E_OOM, "out of memory");
    ndm__alloc_fail_after(0);
    assert_int_equal(test_live_arrays(m), 1);
    release(a);
}

/* The reference kernels (the oracle) and the fast ones agree on every op. */
static void test_reduce_reference_and_fast_agree(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(23);
    const int64_t shp[3] = {37, 5, 300};
    const axcase cases[] = {{1, {2}}, {1, {0}}, {2, {0, 2}}, {-1, {0}}, {1, {1}}};
    for (int d = 0; d < N_DTYPES; d++) {
        ndm_dtype t = all_dtypes[d];
        double *x = malloc(sizeof(double) * 37 * 5 * 300);
        rng_fill(&g, t, x, 37 * 5 * 300);
        ndm_array base = make_array(m, t, x, 3, shp);
        ndm_array a = ndm_permute(base, 3, ((const int[]){1, 2, 0}));
        for (int o = 0; o < OP_COUNT; o++)
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                if (is_arg((op)o) && cases[c].n > 1)
                    continue;
                ndm__cpu_force_reference(true);
                ndm_array r0 = run_op((op)o, a, false, cases[c].n, cases[c].axes, 1);
                ndm__cpu_force_reference(false);
                ndm_array r1 = run_op((op)o, a, false, cases[c].n, cases[c].axes, 1);
                assert_live(r0);
                assert_live(r1);
                double *v0 = read_array(r0), *v1 = read_array(r1);
                ndm_dtype odt = ndm_array_dtype(r0);
                double rtol = ndm_dtype_is_float(odt) ? 4 * dtype_rtol(odt) : 0;
                char what[96];
                snprintf(what, sizeof what, "%s of %s, case %zu", op_names[o],
                         ndm_dtype_short(t), c);
                assert_close_all(v1, v0, ndm_array_size(r0), rtol,
                                 ndm_dtype_is_float(odt) ? 1e-9 : 0, what);
                free(v0);
                free(v1);
                release(r0);
                release(r1);
            }
        release(a);
        release(base);
        free(x);
    }
}

/* softmax and log_softmax along each axis of a view, every dtype. */
static void check_softmax(ndm_array a, int axis, const char *what)
{
    int nd;
    int64_t *shape = shape_of(a, &nd);
    int ax = axis < 0 ? axis + (nd ? nd : 1) : axis;
    double *x = read_array(a);
    int64_t n = shape_numel(nd, shape);
    int64_t len = nd ? shape[ax] : 1, inner = 1;
    for (int i = ax + 1; i < nd; i++)
        inner *= shape[i];
    double *want_s = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *want_l = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t o = 0; o < (len ? n / len : 0); o++) {
        int64_t base = (o / inner) * len * inner + o % inner;
        double m = -INFINITY, s = 0;
        bool nan = false;
        for (int64_t j = 0; j < len; j++) {
            double v = x[base + j * inner];
            nan |= isnan(v);
            m = fmax(m, v);
        }
        if (nan)
            m = NAN;
        for (int64_t j = 0; j < len; j++)
            s += exp(x[base + j * inner] - m);
        for (int64_t j = 0; j < len; j++) {
            double v = x[base + j * inner];
            want_s[base + j * inner] = exp(v - m) / s;
            want_l[base + j * inner] = (v - m) - log(s);
        }
    }
    ndm_array s = ndm_softmax(a, axis), l = ndm_log_softmax(a, axis);
    assert_live(s);
    assert_live(l);
    ndm_dtype t = ndm_array_dtype(a), odt = ndm_dtype_is_float(t) ? t : NDM_F32;
    assert_int_equal(ndm_array_dtype(s), odt);
    assert_int_equal(ndm_array_dtype(l), odt);
    assert_int_equal(ndm_array_ndim(s), nd);
    double *gs = read_array(s), *gl = read_array(l);
    char msg[128];
    snprintf(msg, sizeof msg, "softmax %s axis %d (%s)", ndm_dtype_short(t), axis, what);
    assert_close_all(gs, want_s, n, 2 * dtype_rtol(odt), 1e-12, msg);
    snprintf(msg, sizeof msg, "log_softmax %s axis %d (%s)", ndm_dtype_short(t), axis, what);
    assert_close_all(gl, want_l, n, 2 * dtype_rtol(odt), 1e-12, msg);
    free(gs), free(gl), free(want_s), free(want_l), free(x), free(shape);
    release(s);
    release(l);
}

static void test_softmax_matches_reference(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(31);
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        for (int d = 0; d < N_DTYPES; d++) {
            ndm_dtype t = all_dtypes[d];
            double x[3 * 4 * 5];
            rng_fill(&g, t, x, 60);
            ndm_array a = make_array(m, t, x, NDM_SHAPE(3, 4, 5));
            for (int axis = -3; axis < 3; axis++)
                check_softmax(a, axis, "contiguous");
            ndm_array v = ndm_permute(a, 3, ((const int[]){2, 0, 1}));
            check_softmax(v, 0, "permuted");
            check_softmax(v, 2, "permuted");
            ndm_array f = ndm_slice(a, 2, NDM_END, 0, -2);
            check_softmax(f, -1, "flipped");
            ndm_array e = ndm_zeros(m, t, NDM_SHAPE(2, 0, 3));
            check_softmax(e, 1, "empty");
            check_softmax(e, 2, "empty");
            release(v), release(f), release(e), release(a);
        }
    }
    ndm__cpu_force_reference(false);
    /* long rows split over the pool */
    double *big = malloc(sizeof(double) * 3 * 20000);
    rng_fill(&g, NDM_F32, big, 3 * 20000);
    ndm_array b = make_array(m, NDM_F32, big, NDM_SHAPE(3, 20000));
    check_softmax(b, 1, "long");
    check_softmax(b, 0, "tall");
    release(b);
    free(big);
}

static void test_softmax_stable_for_large_values(void **state)
{
    ndm_manager m = ROOT(state);
    double x[6] = {1000, 1001, 1002, -1000, -1001, -1002};
    ndm_array a = make_array(m, NDM_F32, x, NDM_SHAPE(2, 3));
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        ndm_array s = ndm_softmax(a, 1);
        double *v = read_array(s);
        double e0 = exp(-2.0), e1 = exp(-1.0), z = 1 + e0 + e1;
        double want[6] = {e0 / z, e1 / z, 1 / z, 1 / z, e1 / z, e0 / z};
        assert_close_all(v, want, 6, 1e-6, 0, "softmax of large values");
        free(v);
        ndm_array l = ndm_logsumexp(a, false, NDM_AXES(1));
        v = read_array(l);
        double wl[2] = {1002 + log(z), -1000 + log(z)};
        assert_close_all(v, wl, 2, 1e-7, 0, "logsumexp of large values");
        free(v);
        release(s);
        release(l);
    }
    ndm__cpu_force_reference(false);
    release(a);
}

static void test_softmax_masked_and_nan(void **state)
{
    ndm_manager m = ROOT(state);
    double x[9] = {1, -INFINITY, 2, -INFINITY, -INFINITY, -INFINITY, NAN, 0, 1};
    ndm_array a = make_array(m, NDM_F64, x, NDM_SHAPE(3, 3));
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        check_softmax(a, 1, "masked");
        ndm_array s = ndm_softmax(a, 1);
        double *v = read_array(s);
        assert_true(v[1] == 0.0);        /* a masked entry gets exactly 0 */
        assert_true(isnan(v[3]));        /* a fully masked row is 0/0 */
        assert_true(isnan(v[7]));        /* NaN spreads over its row */
        free(v);
        release(s);
    }
    ndm__cpu_force_reference(false);
    release(a);
    /* rows long enough for the vector exp: NaN, masks, a fully masked row */
    double y[3 * 9];
    for (int i = 0; i < 27; i++)
        y[i] = (double)(i % 7) - 3.0;
    y[4] = NAN;
    y[9 + 2] = y[9 + 5] = y[9 + 8] = -INFINITY;
    for (int i = 18; i < 27; i++)
        y[i] = -INFINITY;
    ndm_array b = make_array(m, NDM_F64, y, NDM_SHAPE(3, 9));
    check_softmax(b, 1, "long rows, masked and NaN");
    check(OP_LSE, b, y, false, 1, (const int[]){1}, 0, "long rows, masked and NaN");
    release(b);
}

static void test_softmax_of_0d(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array s = ndm_scalar(m, NDM_I32, 7);
    check_softmax(s, 0, "0-d");
    check_softmax(s, -1, "0-d");
    assert_fails(ndm_softmax(s, 1), NDM_E_AXIS, "rank 0");
    release(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_reduce_sum_matches_reference),
        TEST(test_reduce_prod_matches_reference),
        TEST(test_reduce_mean_matches_reference),
        TEST(test_reduce_var_matches_reference),
        TEST(test_reduce_std_matches_reference),
        TEST(test_reduce_max_matches_reference),
        TEST(test_reduce_min_matches_reference),
        TEST(test_reduce_argmax_matches_reference),
        TEST(test_reduce_argmin_matches_reference),
        TEST(test_reduce_all_matches_reference),
        TEST(test_reduce_any_matches_reference),
        TEST(test_reduce_logsumexp_matches_reference),
        TEST(test_reduce_views_match_reference),
        TEST(test_reduce_large_parallel_paths),
        TEST(test_reduce_dtypes_follow_rules),
        TEST(test_reduce_int64_sum_wraps),
        TEST(test_reduce_empty_identities),
        TEST(test_reduce_empty_max_is_shape_error),
        TEST(test_reduce_nan_and_inf),
        TEST(test_reduce_var_ddof),
        TEST(test_reduce_axis_errors),
        TEST(test_reduce_stale_and_null_inputs),
        TEST(test_reduce_output_rule),
        TEST(test_reduce_capped_manager_refuses),
        TEST(test_reduce_alloc_failure_leaks_nothing),
        TEST(test_reduce_reference_and_fast_agree),
        TEST(test_softmax_matches_reference),
        TEST(test_softmax_stable_for_large_values),
        TEST(test_softmax_masked_and_nan),
        TEST(test_softmax_of_0d),
    };
    return cmocka_run_group_tests_name("reduce", tests, NULL, NULL);
}
