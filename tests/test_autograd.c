/* Autograd: every differentiable operation against float64 central finite
 * differences, and the mechanics (parameters, graph lifetime, accumulation,
 * no-grad, errors). */
#include <math.h>
#include <stdlib.h>

#include "helpers.h"
#include "ops/autograd.h"
#include "ops/fused.h"

/* ---- the finite-difference checker -------------------------------------------- */

#define MAXP 4

typedef ndm_array (*loss_fn)(const ndm_array *p, void *ctx);

typedef struct param_spec {
    int ndim;
    int64_t shape[6];
    double lo, hi; /* values drawn in [lo, hi) */
} param_spec;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(double lo, double hi)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

/* A scalar from any result: sum(out * weights), fixed random weights, so
 * every output element matters. */
static ndm_array project(ndm_array out)
{
    int nd = ndm_array_ndim(out);
    int64_t shape[8];
    ndm_array_shape(out, shape, 8);
    int64_t n = ndm_array_size(out);
    double *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    uint64_t s = 12345;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = 0.5 + (double)(s >> 40) / 16777216.0;
    }
    ndm_manager m = ndm_scope_current();
    ndm_array wa = ndm_from_buffer(m.id ? m : ndm_array_manager(out), NDM_F64, w, nd, shape);
    free(w);
    ndm_array o64 = ndm_array_dtype(out) == NDM_F64 ? out : ndm_astype(out, NDM_F64);
    return ndm_sum(ndm_mul(o64, wa), false, NDM_ALL_AXES_LIST);
}

static double scalar_of(ndm_array a)
{
    double v = NAN;
    if (ndm_item(a, &v) != NDM_OK)
        fail_msg("item: %s", ndm_last_error());
    return v;
}

/* Compare backward's gradients with central differences for each parameter. */
static void check(ndm_manager root, const char *name, int np, const param_spec *spec, loss_fn f,
                  void *ctx, double tol)
{
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_array p[MAXP];
    for (int k = 0; k < np; k++) {
        int64_t n = 1;
        for (int j = 0; j < spec[k].ndim; j++)
            n *= spec[k].shape[j];
        double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        for (int64_t i = 0; i < n; i++)
            v[i] = uniform(spec[k].lo, spec[k].hi);
        p[k] = ndm_from_buffer(model, NDM_F64, v, spec[k].ndim, spec[k].shape);
        free(v);
        assert_live(p[k]);
        assert_ok(ndm_requires_grad(p[k]));
    }
    /* analytic */
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_manager s = ndm_scope_begin(batch, "forward");
    ndm_array loss = project(f(p, ctx));
    if (!loss.id)
        fail_msg("%s: forward failed: %s", name, ndm_last_error());
    assert_ok(ndm_scope_end(s, 1, &loss));
    ndm_status bs = ndm_backward(loss);
    if (bs != NDM_OK)
        fail_msg("%s: backward: %s", name, ndm_last_error());
    assert_ok(ndm_grad_end());
    /* numeric, without recording */
    for (int k = 0; k < np; k++) {
        int64_t n = ndm_array_size(p[k]);
        double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        double *ga = malloc((size_t)(n ? n : 1) * sizeof *ga);
        assert_ok(ndm_array_copy_out(p[k], v, (size_t)n * sizeof *v));
        ndm_array g = ndm_grad_to(batch, p[k]);
        assert_ok(ndm_array_copy_out(g, ga, (size_t)n * sizeof *ga));
        for (int64_t i = 0; i < n; i++) {
            double h = 1e-6 * (fabs(v[i]) > 1 ? fabs(v[i]) : 1);
            double keep = v[i], lp, lm;
            v[i] = keep + h;
            assert_ok(ndm_array_copy_in(p[k], v, (size_t)n * sizeof *v));
            ndm_manager e = ndm_scope_begin(batch, "eval");
            lp = scalar_of(project(f(p, ctx)));
            assert_ok(ndm_scope_end(e, 0, NULL));
            v[i] = keep - h;
            assert_ok(ndm_array_copy_in(p[k], v, (size_t)n * sizeof *v));
            e = ndm_scope_begin(batch, "eval");
            lm = scalar_of(project(f(p, ctx)));
            assert_ok(ndm_scope_end(e, 0, NULL));
            v[i] = keep;
            assert_ok(ndm_array_copy_in(p[k], v, (size_t)n * sizeof *v));
            double num = (lp - lm) / (2 * h);
            double err = fabs(num - ga[i]) / (1 + fabs(num));
            if (!(err <= tol))
                fail_msg("%s: d/dp%d[%lld]: backward %.10g, finite differences %.10g", name, k,
                         (long long)i, ga[i], num);
        }
        free(v);
        free(ga);
    }
    assert_ok(ndm_manager_close(model));
}

#define P1(nd, ...) {nd, {__VA_ARGS__}, -1.0, 1.0}
#define PR(nd, lo, hi, ...) {nd, {__VA_ARGS__}, lo, hi}

/* ---- elementwise ---------------------------------------------------------------- */

typedef ndm_array (*bin_fn)(NDM_SITE_PARAMS, ndm_manager, ndm_array, ndm_array);
static ndm_array call_bin(const ndm_array *p, void *ctx)
{
    return ((bin_fn)ctx)(NDM_HERE, NDM_OUTPUT_RULE, p[0], p[1]);
}

static void test_grad_binary(void **state)
{
    struct {
        const char *name;
        bin_fn fn;
        double lo, hi;
    } ops[] = {
        {"add", ndm_add_to_at, -1, 1},         {"sub", ndm_sub_to_at, -1, 1},
        {"mul", ndm_mul_to_at, -1, 1},         {"div", ndm_div_to_at, 0.5, 2},
        {"pow", ndm_pow_to_at, 0.5, 2},        {"maximum", ndm_maximum_to_at, -1, 1},
        {"minimum", ndm_minimum_to_at, -1, 1},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        /* same shapes, then broadcasting (3, 1) with (4,) */
        param_spec same[2] = {PR(2, ops[i].lo, ops[i].hi, 2, 3), PR(2, ops[i].lo, ops[i].hi, 2, 3)};
        param_spec bcast[2] = {PR(2, ops[i].lo, ops[i].hi, 3, 1), PR(1, ops[i].lo, ops[i].hi, 4)};
        check(ROOT(state), ops[i].name, 2, same, call_bin, (void *)ops[i].fn, 1e-6);
        check(ROOT(state), ops[i].name, 2, bcast, call_bin, (void *)ops[i].fn, 1e-6);
    }
}

typedef struct scalar_case {
    ndm_array (*fn)(NDM_SITE_PARAMS, ndm_manager, ndm_array, double);
    double s;
} scalar_case;
static ndm_array call_scalar(const ndm_array *p, void *ctx)
{
    scalar_case *c = ctx;
    return c->fn(NDM_HERE, NDM_OUTPUT_RULE, p[0], c->s);
}

static void test_grad_scalar_forms(void **state)
{
    struct {
        const char *name;
        scalar_case c;
        double lo, hi;
    } ops[] = {
        {"add_scalar", {ndm_add_scalar_to_at, 2.5}, -1, 1},
        {"sub_scalar", {ndm_sub_scalar_to_at, 2.5}, -1, 1},
        {"rsub_scalar", {ndm_rsub_scalar_to_at, 2.5}, -1, 1},
        {"mul_scalar", {ndm_mul_scalar_to_at, -1.5}, -1, 1},
        {"div_scalar", {ndm_div_scalar_to_at, 4.0}, -1, 1},
        {"rdiv_scalar", {ndm_rdiv_scalar_to_at, 3.0}, 0.5, 2},
        {"pow_scalar", {ndm_pow_scalar_to_at, 3.0}, -1, 1},
        {"rpow_scalar", {ndm_rpow_scalar_to_at, 2.0}, -1, 1},
        {"maximum_scalar", {ndm_maximum_scalar_to_at, 0.1}, -1, 1},
        {"minimum_scalar", {ndm_minimum_scalar_to_at, 0.1}, -1, 1},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        param_spec ps[1] = {PR(2, ops[i].lo, ops[i].hi, 3, 2)};
        check(ROOT(state), ops[i].name, 1, ps, call_scalar, &ops[i].c, 1e-6);
    }
}

typedef ndm_array (*un_fn)(NDM_SITE_PARAMS, ndm_manager, ndm_array);
static ndm_array call_un(const ndm_array *p, void *ctx)
{
    return ((un_fn)ctx)(NDM_HERE, NDM_OUTPUT_RULE, p[0]);
}

static void test_grad_unary(void **state)
{
    struct {
        const char *name;
        un_fn fn;
        double lo, hi;
    } ops[] = {
        {"neg", ndm_neg_to_at, -1, 1},        {"abs", ndm_abs_to_at, 0.1, 1},
        {"abs-", ndm_abs_to_at, -1, -0.1},    {"exp", ndm_exp_to_at, -1, 1},
        {"log", ndm_log_to_at, 0.2, 2},       {"log1p", ndm_log1p_to_at, -0.5, 1},
        {"expm1", ndm_expm1_to_at, -1, 1},    {"sqrt", ndm_sqrt_to_at, 0.2, 2},
        {"rsqrt", ndm_rsqrt_to_at, 0.2, 2},   {"sin", ndm_sin_to_at, -2, 2},
        {"cos", ndm_cos_to_at, -2, 2},        {"tanh", ndm_tanh_to_at, -2, 2},
        {"sigmoid", ndm_sigmoid_to_at, -3, 3}, {"relu", ndm_relu_to_at, 0.05, 1},
        {"relu-", ndm_relu_to_at, -1, -0.05}, {"gelu", ndm_gelu_to_at, -3, 3},
        {"gelu_tanh", ndm_gelu_tanh_to_at, -3, 3}, {"silu", ndm_silu_to_at, -3, 3},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        param_spec ps[1] = {PR(2, ops[i].lo, ops[i].hi, 2, 3)};
        check(ROOT(state), ops[i].name, 1, ps, call_un, (void *)ops[i].fn, 1e-6);
    }
}

static ndm_array f_clamp(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_clamp(p[0], -0.5, 0.5);
}

static ndm_array f_where(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_where(ndm_gt(p[0], p[1]), ndm_mul(p[0], p[0]), ndm_sin(p[1]));
}

static ndm_array f_cast(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_astype(ndm_mul(ndm_astype(p[0], NDM_F32), ndm_astype(p[0], NDM_F32)), NDM_F64);
}

static void test_grad_clamp_where_cast(void **state)
{
    param_spec one[1] = {P1(2, 4, 5)};
    check(ROOT(state), "clamp", 1, one, f_clamp, NULL, 1e-6);
    param_spec two[2] = {P1(2, 3, 4), P1(2, 3, 4)};
    check(ROOT(state), "where", 2, two, f_where, NULL, 1e-6);
    /* through f32: central differences with h = 1e-6 keep only ~2 digits */
    check(ROOT(state), "astype", 1, one, f_cast, NULL, 2e-2);
}

/* ---- views ----------------------------------------------------------------------- */

static ndm_array f_views(const ndm_array *p, void *ctx)
{
    int which = (int)(intptr_t)ctx;
    ndm_array x = p[0]; /* (2, 3, 4) */
    switch (which) {
    case 0:
        return ndm_reshape(x, NDM_SHAPE(4, -1));
    case 1:
        return ndm_transpose(x);
    case 2:
        return ndm_permute(x, 3, ((const int[]){1, 2, 0}));
    case 3:
        return ndm_swapaxes(x, 0, 2);
    case 4:
        return ndm_slice(x, 2, 1, NDM_END, 2);
    case 5:
        return ndm_slice(x, 1, NDM_END, NDM_END, -2);
    case 6:
        return ndm_select(x, 1, -1);
    case 7:
        return ndm_squeeze(ndm_unsqueeze(x, 1), 1);
    case 8:
        return ndm_expand(ndm_slice(x, 0, 0, 1, 1), NDM_SHAPE(5, 3, 4));
    case 9:
        return ndm_mul(ndm_contiguous(ndm_transpose(x)), ndm_copy(ndm_transpose(x)));
    case 10:
        return ndm_mul(ndm_alias(x), ndm_flip(x, 2));
    default:
        return ndm_reshape(ndm_transpose(x), NDM_SHAPE(-1)); /* reshape that copies */
    }
}

static void test_grad_views(void **state)
{
    param_spec ps[1] = {P1(3, 2, 3, 4)};
    for (int i = 0; i <= 11; i++) {
        char name[32];
        snprintf(name, sizeof name, "view case %d", i);
        check(ROOT(state), name, 1, ps, f_views, (void *)(intptr_t)i, 1e-6);
    }
}

/* ---- reductions ------------------------------------------------------------------ */

static ndm_array f_reduce(const ndm_array *p, void *ctx)
{
    int which = (int)(intptr_t)ctx;
    ndm_array x = p[0]; /* (3, 4, 2) */
    switch (which) {
    case 0:
        return ndm_sum(x, false, NDM_AXES(1));
    case 1:
        return ndm_sum(x, true, NDM_AXES(0, -1));
    case 2:
        return ndm_sum(x, false, NDM_ALL_AXES_LIST);
    case 3:
        return ndm_mean(x, false, NDM_AXES(-2));
    case 4:
        return ndm_max(x, false, NDM_AXES(1));
    case 5:
        return ndm_min(x, true, NDM_AXES(0, 2));
    case 6:
        return ndm_logsumexp(x, false, NDM_AXES(1));
    case 7:
        return ndm_softmax(x, 1);
    case 8:
        return ndm_log_softmax(x, -1);
    default:
        return ndm_mean(x, true, NDM_ALL_AXES_LIST);
    }
}

static void test_grad_reductions(void **state)
{
    param_spec ps[1] = {P1(3, 3, 4, 2)};
    for (int i = 0; i <= 9; i++) {
        char name[32];
        snprintf(name, sizeof name, "reduction case %d", i);
        check(ROOT(state), name, 1, ps, f_reduce, (void *)(intptr_t)i, 1e-6);
    }
}

/* ---- linear algebra -------------------------------------------------------------- */

static ndm_array f_matmul(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_matmul(p[0], p[1]);
}
/* x @ w^T with w (n, k) held row by row, as a linear layer holds it */
static ndm_array f_matmul_wt(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_matmul(p[0], ndm_transpose(p[1]));
}
static ndm_array f_dot(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_dot(p[0], p[1]);
}
static ndm_array f_outer(const ndm_array *p, void *ctx)
{
    (void)ctx;
    return ndm_outer(p[0], p[1]);
}

static void test_grad_linalg(void **state)
{
    param_spec mm[2] = {P1(2, 3, 4), P1(2, 4, 5)};
    check(ROOT(state), "matmul 2d", 2, mm, f_matmul, NULL, 1e-6);
    param_spec wt[2] = {P1(2, 3, 4), P1(2, 5, 4)};
    check(ROOT(state), "matmul 2d @ transposed", 2, wt, f_matmul_wt, NULL, 1e-6);
    param_spec bb[2] = {P1(3, 2, 3, 4), P1(2, 4, 2)}; /* the second broadcasts over the batch */
    check(ROOT(state), "matmul batched", 2, bb, f_matmul, NULL, 1e-6);
    param_spec vm[2] = {P1(1, 4), P1(3, 2, 4, 3)};
    check(ROOT(state), "matmul 1-d @ 3-d", 2, vm, f_matmul, NULL, 1e-6);
    param_spec mv[2] = {P1(2, 3, 4), P1(1, 4)};
    check(ROOT(state), "matmul 2-d @ 1-d", 2, mv, f_matmul, NULL, 1e-6);
    param_spec vv[2] = {P1(1, 5), P1(1, 5)};
    check(ROOT(state), "dot 1-d", 2, vv, f_dot, NULL, 1e-6);
    param_spec nv[2] = {P1(2, 3, 5), P1(1, 5)};
    check(ROOT(state), "dot n-d, 1-d", 2, nv, f_dot, NULL, 1e-6);
    param_spec oo[2] = {P1(1, 3), P1(1, 4)};
    check(ROOT(state), "outer", 2, oo, f_outer, NULL, 1e-6);
}

/* ---- joining and indexing -------------------------------------------------------- */

static ndm_array f_index(const ndm_array *p, void *ctx)
{
    int which = (int)(intptr_t)ctx;
    switch (which) {
    case 0:
        return ndm_concat(1, NDM_ARRAYS(p[0], p[1], p[0]));
    case 1:
        return ndm_stack(0, NDM_ARRAYS(p[0], ndm_slice(p[1], 1, 0, 3, 1)));
    case 2: {
        int64_t idx[4] = {2, 0, 2, 1};
        ndm_array i = ndm_from_buffer(ndm_scope_current(), NDM_I64, idx, NDM_SHAPE(4));
        return ndm_take(p[0], 1, i);
    }
    case 3: {
        int64_t idx[6] = {1, 0, 1, 1, 0, 0};
        ndm_array i = ndm_from_buffer(ndm_scope_current(), NDM_I64, idx, NDM_SHAPE(2, 3));
        return ndm_take(p[1], 0, i); /* an embedding lookup */
    }
    default: {
        int64_t idx[6] = {0, 2, 2, 1, 0, 1};
        ndm_array i = ndm_from_buffer(ndm_scope_current(), NDM_I64, idx, NDM_SHAPE(2, 3));
        return ndm_gather(p[0], 1, i);
    }
    }
}

static void test_grad_index(void **state)
{
    param_spec ps[2] = {P1(2, 2, 3), P1(2, 2, 5)};
    for (int i = 0; i <= 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "index case %d", i);
        check(ROOT(state), name, 2, ps, f_index, (void *)(intptr_t)i, 1e-6);
    }
}

/* ---- running sums and products, selection by index arrays and masks ---------------- */

static ndm_array f_cum(const ndm_array *p, void *ctx)
{
    switch ((int)(intptr_t)ctx) {
    case 0:
        return ndm_cumsum(p[0], 1);
    case 1:
        return ndm_cumsum(ndm_transpose(p[0]), 0);
    case 2:
        return ndm_cumprod(p[0], 1);
    case 3:
        return ndm_cumprod(ndm_transpose(p[0]), -2);
    case 4: /* p[1] is all zeros: each line holds a zero, then more values, then another */
        return ndm_cumprod(ndm_concat(1, NDM_ARRAYS(p[0], p[1], p[2], p[1])), 1);
    case 5: /* a zero first, along axis 0 of a view */
        return ndm_cumprod(ndm_transpose(ndm_concat(1, NDM_ARRAYS(p[1], p[0], p[2]))), 0);
    default: /* a single zero at the end of a line */
        return ndm_cumprod(ndm_concat(1, NDM_ARRAYS(p[2], p[1])), 1);
    }
}

static void test_grad_cumsum_and_cumprod(void **state)
{
    param_spec one[1] = {P1(2, 3, 5)};
    for (int i = 0; i <= 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "cumulative case %d", i);
        check(ROOT(state), name, 1, one, f_cum, (void *)(intptr_t)i, 1e-6);
    }
    /* with exact zeros (the middle parameter): the rule must not divide by
     * them, and the gradient at each zero must still be right */
    param_spec zeros[3] = {P1(2, 2, 2), PR(2, 0.0, 0.0, 2, 1), P1(2, 2, 3)};
    for (int i = 4; i <= 6; i++) {
        char name[32];
        snprintf(name, sizeof name, "cumprod with zeros, case %d", i);
        check(ROOT(state), name, 3, zeros, f_cum, (void *)(intptr_t)i, 1e-6);
    }
}

static ndm_array f_select(const ndm_array *p, void *ctx)
{
    ndm_manager sc = ndm_scope_current();
    switch ((int)(intptr_t)ctx) {
    case 0: { /* p[0][i, j] with repeated pairs, which must accumulate */
        int64_t iv[4] = {2, 0, -1, 2};
        int32_t jv[2] = {1, -1};
        ndm_array i = ndm_from_buffer(sc, NDM_I64, iv, NDM_SHAPE(2, 2));
        ndm_array j = ndm_from_buffer(sc, NDM_I32, jv, NDM_SHAPE(2));
        return ndm_index(p[0], NDM_ARRAYS(i, j));
    }
    case 1: { /* p[1][i, j] keeps the trailing axis; p[1] read transposed */
        int64_t iv[3] = {1, 1, -2};
        int64_t jv[3] = {0, 2, 0};
        ndm_array i = ndm_from_buffer(sc, NDM_I64, iv, NDM_SHAPE(3));
        ndm_array j = ndm_from_buffer(sc, NDM_I64, jv, NDM_SHAPE(3));
        static const int perm[3] = {1, 2, 0};
        return ndm_index(ndm_permute(p[1], 3, perm), NDM_ARRAYS(i, j));
    }
    case 2: { /* a mask broadcast over p[0]'s rows */
        uint8_t mv[4] = {1, 0, 1, 1};
        ndm_array m = ndm_from_buffer(sc, NDM_BOOL, mv, NDM_SHAPE(4));
        return ndm_masked_select(p[0], m);
    }
    default: { /* p[2] broadcast over the mask's rows: the gradient sums them */
        uint8_t mv[8] = {1, 0, 1, 1, 0, 1, 1, 0};
        ndm_array m = ndm_from_buffer(sc, NDM_BOOL, mv, NDM_SHAPE(2, 4));
        return ndm_masked_select(p[2], m);
    }
    }
}

static void test_grad_index_and_masked_select(void **state)
{
    param_spec ps[3] = {P1(2, 3, 4), P1(3, 2, 3, 4), P1(1, 4)};
    for (int i = 0; i <= 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "selection case %d", i);
        check(ROOT(state), name, 3, ps, f_select, (void *)(intptr_t)i, 1e-6);
    }
}

/* ---- triangles and sorts ------------------------------------------------------------ */

static ndm_array f_tri_sort(const ndm_array *p, void *ctx)
{
    ndm_array v = NDM_NULL_ARRAY;
    switch ((int)(intptr_t)ctx) {
    case 0: /* a batch of 3x4 below the first superdiagonal */
        return ndm_tril(p[0], 1);
    case 1: /* a transposed batch on and above the -1 diagonal */
        return ndm_triu(ndm_transpose(p[0]), -1);
    case 2: /* sorted lines: each value's gradient goes back to its place */
        return ndm_sort(p[0], -1, false);
    case 3:
        return ndm_sort(p[0], 1, true);
    case 4: /* the 2 largest of each line along axis 0 */
        if (ndm_topk(p[0], 2, 0, true, &v, NULL) != NDM_OK)
            return NDM_NULL_ARRAY;
        return v;
    default: /* the smallest, through a square: the gradient meets a product */
        if (ndm_topk(ndm_mul(p[0], p[0]), 3, -1, false, &v, NULL) != NDM_OK)
            return NDM_NULL_ARRAY;
        return v;
    }
}

static void test_grad_tril_triu_sort_topk(void **state)
{
    param_spec one[1] = {P1(3, 2, 3, 4)};
    static const char *const names[] = {"tril", "triu", "sort", "sort, descending", "topk",
                                        "topk, smallest"};
    for (int i = 0; i < 6; i++)
        check(ROOT(state), names[i], 1, one, f_tri_sort, (void *)(intptr_t)i, 1e-6);
}

/* ---- rms_norm and attention ---------------------------------------------------------- */

static ndm_array f_attn(const ndm_array *p, void *ctx)
{
    ndm_manager sc = ndm_scope_current();
    switch ((int)(intptr_t)ctx) {
    case 0: /* q, k, v of [2, 2, 3|4, 3|2], no mask */
        return ndm_sdpa(p[0], p[1], p[2], NDM_NULL_ARRAY, false, 0);
    case 1:
        return ndm_sdpa(p[0], p[1], p[2], NDM_NULL_ARRAY, true, 0.7);
    case 2: { /* a padding mask per batch, broadcast over heads and queries */
        uint8_t mv[8] = {1, 1, 0, 1, 1, 1, 1, 0};
        ndm_array m = ndm_from_buffer(sc, NDM_BOOL, mv, NDM_SHAPE(2, 1, 1, 4));
        return ndm_sdpa(p[0], p[1], p[2], m, true, 0);
    }
    case 3: { /* an additive mask that is itself a parameter */
        return ndm_sdpa(p[0], p[1], p[2], p[3], false, 0);
    }
    default: /* rms_norm with a weight */
        return ndm_rms_norm(p[0], p[1], 1e-5);
    }
}

static void test_grad_sdpa_and_rms_norm(void **state)
{
    param_spec ps[4] = {P1(4, 2, 2, 3, 3), P1(4, 2, 2, 4, 3), P1(4, 2, 2, 4, 2), P1(2, 3, 4)};
    static const char *const names[] = {"sdpa", "sdpa, causal, scaled", "sdpa, causal and padding",
                                        "sdpa, additive mask"};
    for (int i = 0; i < 4; i++)
        check(ROOT(state), names[i], i == 3 ? 4 : 3, ps, f_attn, (void *)(intptr_t)i, 1e-6);
    /* x [2, 3, 4] and its weight [4] */
    param_spec rs[2] = {P1(3, 2, 3, 4), PR(1, 0.5, 1.5, 4)};
    check(ROOT(state), "rms_norm", 2, rs, f_attn, (void *)(intptr_t)4, 1e-6);
}

/* ---- convolution and pooling ------------------------------------------------------- */

static ndm_array f_conv(const ndm_array *p, void *ctx)
{
    switch ((int)(intptr_t)ctx) {
    case 0:
        return ndm_conv2d_bias(p[0], p[1], p[2], NDM_CONV2D(.padding = {1, 1}));
    case 1:
        return ndm_conv2d(p[0], p[1], NDM_CONV2D(.stride = {2, 1}, .dilation = {1, 2}));
    case 2:
        return ndm_max_pool2d(ndm_relu(p[0]), NDM_POOL2D(.kernel = {2, 2}));
    default:
        return ndm_avg_pool2d(p[0], true, NDM_POOL2D(.kernel = {3, 3}, .stride = {2, 2},
                                                     .padding = {1, 1}));
    }
}

static void test_grad_conv_and_pool(void **state)
{
    param_spec conv[3] = {P1(4, 2, 3, 5, 6), P1(4, 4, 3, 3, 3), P1(1, 4)};
    check(ROOT(state), "conv2d + bias", 3, conv, f_conv, (void *)0, 1e-6);
    check(ROOT(state), "conv2d strided, dilated", 2, conv, f_conv, (void *)1, 1e-6);
    param_spec pool[1] = {P1(4, 2, 3, 6, 4)};
    check(ROOT(state), "max_pool2d", 1, pool, f_conv, (void *)2, 1e-6);
    check(ROOT(state), "avg_pool2d", 1, pool, f_conv, (void *)3, 1e-6);
}

/* ---- losses -------------------------------------------------------------------------- */

static ndm_array f_loss(const ndm_array *p, void *ctx)
{
    int64_t lab[4] = {2, 0, 1, 2};
    ndm_array labels = ndm_from_buffer(ndm_scope_current(), NDM_I64, lab, NDM_SHAPE(4));
    switch ((int)(intptr_t)ctx) {
    case 0:
        return ndm_cross_entropy(p[0], labels);
    case 1:
        return ndm_nll_loss(ndm_log_softmax(p[0], 1), labels);
    default:
        return ndm_mse_loss(p[0], ndm_tanh(p[0]));
    }
}

static void test_grad_losses(void **state)
{
    param_spec ps[1] = {PR(2, -2, 2, 4, 3)};
    check(ROOT(state), "cross_entropy", 1, ps, f_loss, (void *)0, 1e-6);
    check(ROOT(state), "nll_loss", 1, ps, f_loss, (void *)1, 1e-6);
    check(ROOT(state), "mse_loss", 1, ps, f_loss, (void *)2, 1e-6);
}

/* ---- mechanics ------------------------------------------------------------------- */

static void test_grad_accumulates_and_zeroes(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    double wv[3] = {1, 2, 3};
    ndm_array w = ndm_from_buffer(model, NDM_F64, wv, NDM_SHAPE(3));
    assert_ok(ndm_requires_grad(w));
    assert_ok(ndm_requires_grad(w)); /* again: nothing new */
    assert_true(ndm_array_requires_grad(w));
    ndm_stats st0;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st0));
    assert_int_equal(st0.created, 2); /* the parameter and its gradient */
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    for (int step = 0; step < 3; step++) {
        ndm_manager batch = ndm_manager_new(model, "batch");
        assert_ok(ndm_grad_begin(batch));
        /* w's manager is capped: without a scope, mul(w, w) would be refused */
        ndm_manager s = ndm_scope_begin(batch, "step");
        ndm_array loss = ndm_sum(ndm_mul(w, w), false, NDM_ALL_AXES_LIST); /* d/dw = 2w */
        assert_ok(ndm_scope_end(s, 1, &loss));
        assert_ok(ndm_backward(loss));
        assert_ok(ndm_backward(loss)); /* twice: gradients add up */
        assert_ok(ndm_grad_end());
        double g[3];
        assert_ok(ndm_array_copy_out(ndm_grad_to(batch, w), g, sizeof g));
        for (int i = 0; i < 3; i++)
            assert_true(g[i] == 4 * wv[i] * (step + 1));
        assert_ok(ndm_manager_close(batch));
    }
    /* the gradient array was never reallocated, and the capped model gained nothing */
    ndm_stats st1;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st1));
    assert_int_equal(st1.created, 2);
    assert_int_equal(st1.live_arrays, 2);
    assert_int_equal(st1.children, 0); /* batches and their graphs are gone */
    assert_ok(ndm_zero_grad(1, &w));
    ndm_manager s = ndm_scope_begin(model, "read");
    double g[3];
    assert_ok(ndm_array_copy_out(ndm_grad(w), g, sizeof g));
    assert_true(g[0] == 0 && g[1] == 0 && g[2] == 0);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(model));
}

static void test_grad_graph_lives_in_owner(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(4, 4));
    assert_ok(ndm_requires_grad(w));
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    assert_true(ndm_grad_recording());
    ndm_manager s = ndm_scope_begin(batch, "tmp");
    ndm_array h = ndm_relu(ndm_matmul(w, w));
    ndm_array loss = ndm_mean(h, false, NDM_ALL_AXES_LIST);
    assert_ok(ndm_scope_end(s, 1, &loss)); /* h dies with the scope; the graph kept it */
    assert_false(ndm_array_valid(h));
    assert_ok(ndm_backward(loss));
    ndm_stats gs;
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &gs));
    assert_true(gs.children >= 1); /* the graph */
    assert_true(gs.live_arrays > 1);
    assert_ok(ndm_manager_close(batch)); /* closing the batch frees the graph */
    assert_false(ndm_grad_recording());
    assert_int_equal(test_live_arrays(model), 2);
    assert_status(ndm_grad_end(), NDM_ALREADY);
    assert_ok(ndm_manager_close(model));
}

static void test_grad_no_grad_and_errors(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(3));
    ndm_array iw = ndm_ones(model, NDM_I32, NDM_SHAPE(3));
    assert_status(ndm_requires_grad(iw), NDM_E_DTYPE);
    assert_ok(ndm_requires_grad(w));
    assert_true(ndm_grad_to(model, iw).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    assert_status(ndm_grad_begin(batch), NDM_E_INVALID);
    ndm_no_grad_begin();
    assert_false(ndm_grad_recording());
    ndm_array paused = ndm_sum(ndm_mul_to(batch, w, w), false, NDM_ALL_AXES_LIST);
    ndm_no_grad_end();
    assert_status(ndm_backward(paused), NDM_E_INVALID);
    assert_error_has("not made by a recorded operation");
    ndm_array vec = ndm_mul_to(batch, w, w);
    assert_status(ndm_backward(vec), NDM_E_SHAPE);
    ndm_array seed = ndm_full(batch, NDM_F32, 2.0, NDM_SHAPE(3));
    assert_ok(ndm_backward_with(vec, seed)); /* d/dw sum(seed * w^2) = 4w */
    float g[3];
    assert_ok(ndm_array_copy_out(ndm_grad_to(batch, w), g, sizeof g));
    assert_true(g[0] == 4.0f && g[2] == 4.0f);
    ndm_array bad = ndm_ones(batch, NDM_F32, NDM_SHAPE(4));
    assert_status(ndm_backward_with(vec, bad), NDM_E_SHAPE);
    assert_ok(ndm_grad_end());
    /* a capped manager cannot take a new parameter's gradient */
    ndm_array late = ndm_ones(model, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_status(ndm_requires_grad(late), NDM_E_CAPPED);
    assert_false(ndm_array_requires_grad(late));
    assert_ok(ndm_manager_close(model));
}

/* What the completion hook saw: each gradient once, with its final value. */
typedef struct seen_grads {
    int n;
    uint64_t ids[8];
    float values[8][4];
} seen_grads;

static void record_ready(void *ud, ndm_array g)
{
    seen_grads *s = ud;
    if (s->n < 8) {
        s->ids[s->n] = g.id;
        assert_ok(ndm_array_copy_out(g, s->values[s->n], ndm_array_nbytes(g)));
    }
    s->n++;
}

static void test_backward_reports_each_gradient_when_complete(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "model");
    /* w is used twice, late and early; b once; unused is not in the graph */
    ndm_array w = ndm_full(m, NDM_F32, 2.0, 1, (int64_t[]){4});
    ndm_array b = ndm_full(m, NDM_F32, 1.0, 1, (int64_t[]){4});
    ndm_array unused = ndm_zeros(m, NDM_F32, 1, (int64_t[]){4});
    assert_ok(ndm_requires_grad(w));
    assert_ok(ndm_requires_grad(b));
    assert_ok(ndm_requires_grad(unused));
    ndm_manager batch = ndm_manager_new(m, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_manager sc = ndm_scope_begin(batch, "step");
    ndm_array h = ndm_mul(w, b);                 /* early use of w */
    ndm_array loss = ndm_sum(ndm_mul(ndm_add(h, b), w), false, NDM_ALL_AXES_LIST); /* late use */
    assert_live(loss);
    (void)ndm_grad_end();
    seen_grads s = {0};
    assert_ok(ndm__ag_backward_hooked("ndm_backward", (ndm__site){__FILE__, __func__, __LINE__}, loss,
                                      NDM_NULL_ARRAY, record_ready, &s));
    assert_int_equal(s.n, 2);
    assert_true(s.ids[0] != s.ids[1]);
    ndm_array gw = ndm__ag_grad_of(w), gb = ndm__ag_grad_of(b);
    assert_true((s.ids[0] == gw.id || s.ids[0] == gb.id) && (s.ids[1] == gw.id || s.ids[1] == gb.id));
    assert_false(ndm__ag_grad_of(h).id);
    /* loss = sum((w b + b) w): d/dw = 2 w b + b = 5, d/db = w^2 + w = 6, final when reported */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            assert_true(s.values[k][i] == (s.ids[k] == gw.id ? 5.0f : 6.0f));
    assert_ok(ndm_scope_end(sc, 0, NULL));
    assert_ok(ndm_manager_close(batch));
    (void)unused;
    assert_ok(ndm_manager_close(m));
}

/* With a completion hook, a product's weight gradient is made and reported
 * before the gradient of its other input is computed (data-parallel
 * training sends it while that product runs): under a limit that the
 * weight's gradient fits and the input's does not, backward fails at the
 * input's gradient with the weight already reported, at its final value. */
static void record_ready_head(void *ud, ndm_array g)
{
    seen_grads *s = ud;
    if (s->n < 8) {
        s->ids[s->n] = g.id;
        memcpy(s->values[s->n], ndm_array_data(g), sizeof s->values[0]); /* the first 4 */
    }
    s->n++;
}

static void test_backward_hook_reports_a_weight_before_its_input_gradient(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_full(m, NDM_F32, 0.5, 2, (int64_t[]){2, 512});
    ndm_array c = ndm_ones(m, NDM_F32, 1, (int64_t[]){512});
    assert_ok(ndm_requires_grad(w));
    assert_ok(ndm_requires_grad(c));
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = ndm_ones(batch, NDM_F32, 2, (int64_t[]){256, 512});
    assert_ok(ndm_grad_begin(batch));
    ndm_array a = ndm_mul(x, c); /* needs a gradient, and is no parameter */
    ndm_array loss = ndm_sum(ndm_matmul(a, ndm_transpose(w)), false, NDM_ALL_AXES_LIST);
    assert_live(loss);
    (void)ndm_grad_end();
    ndm_stats st;
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &st));
    /* a's gradient (512 KiB) does not fit; w's (4 KiB) does */
    assert_ok(ndm_manager_set_limit(batch, NDM_CPU, st.live_bytes + 64 * 1024));
    seen_grads s = {0};
    ndm_status bs = ndm__ag_backward_hooked("ndm_backward", (ndm__site){__FILE__, __func__, __LINE__}, loss,
                                            NDM_NULL_ARRAY, record_ready_head, &s);
    assert_int_equal(bs, NDM_E_QUOTA);
    assert_int_equal(s.n, 1);
    assert_true(s.ids[0] == ndm__ag_grad_of(w).id);
    for (int i = 0; i < 4; i++) /* d/dw[o][i] = sum over the batch of a[b][i] */
        assert_true(s.values[0][i] == 256.0f);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(m));
}

/* relu's gradient is g * (x > 0) bit for bit (a negative g over x <= 0 gives
 * -0, a NaN g over x > 0 stays NaN), contiguous or through a transposed
 * view, in f32 and f64, split across threads or not; and the contiguous case
 * makes no temporaries: its backward creates as many arrays as neg's. */
static uint64_t backward_created(ndm_manager model, ndm_array x, ndm_array gy, int op,
                                 bool transposed)
{
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_manager sc = ndm_scope_begin(batch, "step");
    ndm_array in = transposed ? ndm_transpose(x) : x;
    ndm_array y = op ? ndm_relu(in) : ndm_neg(in);
    assert_live(y);
    ndm_stats before, after;
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &before));
    assert_ok(ndm_backward_with(y, gy));
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_ok(ndm_scope_end(sc, 0, NULL));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_manager_close(batch));
    return after.created - before.created;
}

static void test_grad_relu_one_pass_same_bits(void **state)
{
    enum { R = 300, C = 257 }; /* 77100 elements: above one task of the pool */
    const int64_t n = (int64_t)R * C;
    for (int f64 = 0; f64 < 2; f64++)
        for (int transposed = 0; transposed < 2; transposed++) {
            ndm_manager model = ndm_manager_new(ROOT(state), "model");
            ndm_dtype dt = f64 ? NDM_F64 : NDM_F32;
            double *xv = malloc((size_t)n * sizeof *xv), *gv = malloc((size_t)n * sizeof *gv);
            assert_non_null(xv);
            assert_non_null(gv);
            for (int64_t i = 0; i < n; i++) {
                xv[i] = i % 7 == 0 ? 0.0 : i % 11 == 0 ? -0.0 : uniform(-1, 1);
                gv[i] = i % 13 == 0 ? NAN : uniform(-2, 2);
            }
            ndm_array x64 = ndm_from_buffer(model, NDM_F64, xv, NDM_SHAPE(R, C));
            ndm_array x = ndm_astype(x64, dt);
            int64_t gr = transposed ? C : R, gc = transposed ? R : C;
            ndm_array gy = ndm_astype(ndm_from_buffer(model, NDM_F64, gv, NDM_SHAPE(gr, gc)), dt);
            assert_live(x);
            assert_live(gy);
            assert_ok(ndm_requires_grad(x));
            uint64_t made_neg = backward_created(model, x, gy, 0, transposed);
            assert_ok(ndm_zero_grad(1, &x));
            uint64_t made_relu = backward_created(model, x, gy, 1, transposed);
            if (!transposed)
                assert_int_equal(made_relu, made_neg);
            /* the expected gradient, in the array's dtype, from the same values */
            ndm_manager sc = ndm_scope_begin(model, "read");
            ndm_array gx = ndm_astype(ndm_grad(x), NDM_F64);
            ndm_array xr = ndm_astype(x, NDM_F64), gr64 = ndm_astype(gy, NDM_F64);
            if (transposed)
                gr64 = ndm_contiguous(ndm_transpose(gr64));
            const double *got = ndm_array_data(gx), *xs = ndm_array_data(xr),
                         *gs = ndm_array_data(gr64);
            assert_non_null(got);
            assert_non_null(xs);
            assert_non_null(gs);
            /* the gradient is added to the zeroed one: 0 + (-0) is +0 */
            for (int64_t i = 0; i < n; i++) {
                double want = f64 ? 0.0 + gs[i] * (xs[i] > 0 ? 1.0 : 0.0)
                                  : (double)(0.0f + (float)gs[i] * (xs[i] > 0 ? 1.0f : 0.0f));
                if (memcmp(&want, &got[i], sizeof want) && !(isnan(want) && isnan(got[i])))
                    fail_msg("%s%s: element %lld: %a, expected %a", f64 ? "f64" : "f32",
                             transposed ? " transposed" : "", (long long)i, got[i], want);
            }
            /* the rule's own result, -0 and NaN payloads included, against
             * the composition it replaces */
            if (!transposed) {
                ndm_array fused = ndm__relu_grad(gy, x);
                ndm_array composed = ndm_mul(gy, ndm_astype(ndm_gt_scalar(x, 0.0), dt));
                assert_live(fused);
                assert_live(composed);
                assert_memory_equal(ndm_array_data(fused), ndm_array_data(composed),
                                    ndm_array_nbytes(composed));
            }
            assert_ok(ndm_scope_end(sc, 0, NULL));
            free(xv);
            free(gv);
            assert_ok(ndm_manager_close(model));
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_grad_binary),
        TEST(test_grad_scalar_forms),
        TEST(test_grad_unary),
        TEST(test_grad_relu_one_pass_same_bits),
        TEST(test_grad_clamp_where_cast),
        TEST(test_grad_views),
        TEST(test_grad_reductions),
        TEST(test_grad_linalg),
        TEST(test_grad_index),
        TEST(test_grad_cumsum_and_cumprod),
        TEST(test_grad_index_and_masked_select),
        TEST(test_grad_tril_triu_sort_topk),
        TEST(test_grad_sdpa_and_rms_norm),
        TEST(test_grad_losses),
        TEST(test_grad_conv_and_pool),
        TEST(test_grad_accumulates_and_zeroes),
        TEST(test_backward_reports_each_gradient_when_complete),
        TEST(test_backward_hook_reports_a_weight_before_its_input_gradient),
        TEST(test_grad_graph_lives_in_owner),
        TEST(test_grad_no_grad_and_errors),
    };
    return cmocka_run_group_tests_name("autograd", tests, NULL, NULL);
}
