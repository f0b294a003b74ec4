/* Normalisation layers: BatchNorm1d/2d, LayerNorm and RMSNorm (and its
 * function), their running statistics and modes, and their gradients
 * against finite differences. */
#include <math.h>
#include <stdlib.h>

#include "helpers.h"

/* The elements of a as doubles (the caller frees). */
static double *values(ndm_array a, int64_t *n)
{
    ndm_manager s = ndm_scope_begin(ndm_system(), "values");
    ndm_array d = ndm_astype(ndm_contiguous(a), NDM_F64);
    assert_live(d);
    *n = ndm_array_size(d);
    double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    assert_ok(ndm_array_copy_out(d, v, (size_t)*n * sizeof *v));
    assert_ok(ndm_scope_end(s, 0, NULL));
    return v;
}

static double get_elem(ndm_array a, int64_t i)
{
    void *p = ndm_array_data(a);
    return ndm_array_dtype(a) == NDM_F64 ? ((double *)p)[i] : ((float *)p)[i];
}

static void set_elem(ndm_array a, int64_t i, double v)
{
    void *p = ndm_array_data(a);
    if (ndm_array_dtype(a) == NDM_F64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* sum(net(x) * r), computed in a scope that leaves nothing behind. */
static double loss_of(ndm_module net, ndm_array x, ndm_array r)
{
    ndm_manager s = ndm_scope_begin(ndm_system(), "loss");
    double v;
    assert_ok(ndm_item(ndm_sum(ndm_mul(ndm_forward(net, x), r), false, NDM_ALL_AXES_LIST), &v));
    assert_ok(ndm_scope_end(s, 0, NULL));
    return v;
}

/* The gradients of sum(net(x) * r) with respect to x and to every parameter
 * of net agree with central differences. */
static void check_gradients(ndm_manager root, ndm_module net, ndm_array x, ndm_array r)
{
    ndm_array arrays[8] = {x};
    int n = 1 + ndm_module_parameters(net, arrays + 1, 7);
    assert_ok(ndm_zero_grad((size_t)n, arrays)); /* gradients add up across passes */
    ndm_manager batch = ndm_manager_new(root, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_array y = ndm_forward(net, x);
    assert_ok(ndm_backward(ndm_sum(ndm_mul(y, r), false, NDM_ALL_AXES_LIST)));
    assert_ok(ndm_grad_end());
    for (int k = 0; k < n; k++) {
        ndm_array a = arrays[k];
        int64_t ng;
        double *g = values(ndm_grad_to(batch, a), &ng);
        bool f32 = ndm_array_dtype(a) == NDM_F32;
        double h = f32 ? 1e-2 : 1e-6;
        for (int64_t i = 0; i < ng; i++) {
            double v = get_elem(a, i);
            set_elem(a, i, v + h);
            double up = get_elem(a, i), lp = loss_of(net, x, r);
            set_elem(a, i, v - h);
            double dn = get_elem(a, i), lm = loss_of(net, x, r);
            set_elem(a, i, v);
            double fd = (lp - lm) / (up - dn);
            double tol = f32 ? 2e-3 + 2e-2 * fabs(fd) : 1e-6 + 1e-5 * fabs(fd);
            if (!(fabs(fd - g[i]) <= tol))
                fail_msg("array %d element %lld: gradient %.9g, finite difference %.9g", k,
                         (long long)i, g[i], fd);
        }
        free(g);
    }
    assert_ok(ndm_manager_close(batch));
}

/* A float64 parameter of `shape` with values from a seeded generator, and
 * the weights r of the loss. */
static ndm_array input(ndm_manager m, uint64_t seed, int nd, const int64_t *shape)
{
    ndm_rng g = ndm_rng_new(seed);
    ndm_array x = ndm_normal_at(NDM_HERE, m, &g, NDM_F64, 0.5, 2.0, nd, shape);
    assert_ok(ndm_requires_grad(x));
    return x;
}

static ndm_array weights(ndm_manager m, int nd, const int64_t *shape)
{
    ndm_rng g = ndm_rng_new(77);
    return ndm_uniform_at(NDM_HERE, m, &g, NDM_F64, -1, 1, nd, shape);
}

/* Non-trivial affine parameters, so their gradients are exercised. */
static void perturb(ndm_module net)
{
    ndm_array p[4];
    int n = ndm_module_parameters(net, p, 4);
    ndm_rng g = ndm_rng_new(5);
    for (int i = 0; i < n; i++)
        assert_ok(ndm_uniform_(p[i], &g, 0.5, 1.5));
}

static void test_norm_batch_norm_gradients(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    const int64_t s1[] = {5, 3}, s3[] = {2, 3, 4}, s4[] = {2, 2, 3, 3};
    struct {
        int spatial, nd;
        const int64_t *shape;
        bool training;
    } cases[] = {{1, 2, s1, true}, {1, 3, s3, true}, {2, 4, s4, true}, {2, 4, s4, false}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t ch = cases[c].shape[1];
        ndm_module bn = ndm_batch_norm_at(NDM_HERE, model, cases[c].spatial, ch, 1e-5, 0.1, true);
        assert_live(bn);
        perturb(bn);
        assert_ok(ndm_module_set_training(bn, cases[c].training));
        ndm_manager data = ndm_manager_new(ROOT(state), "data");
        ndm_array x = input(data, 10 + c, cases[c].nd, cases[c].shape);
        ndm_array r = weights(data, cases[c].nd, cases[c].shape);
        check_gradients(ROOT(state), bn, x, r);
        assert_ok(ndm_manager_close(data));
    }
    assert_ok(ndm_manager_close(model));
}

static void test_norm_layer_norm_gradients(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module ln = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(2, 4));
    assert_live(ln);
    perturb(ln);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const int64_t shape[] = {3, 2, 4};
    ndm_array x = input(data, 3, 3, shape);
    ndm_array r = weights(data, 3, shape);
    check_gradients(ROOT(state), ln, x, r);
    /* without affine parameters: only x */
    ndm_module plain = ndm_layer_norm(model, 1e-5, false, NDM_SHAPE(4));
    assert_int_equal(ndm_module_parameters(plain, NULL, 0), 0);
    check_gradients(ROOT(state), plain, x, r);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

static void test_norm_layer_norm_normalises(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module ln = ndm_layer_norm(model, 0.0 + 1e-12, false, NDM_SHAPE(4));
    ndm_array x = ndm_from_buffer(ROOT(state), NDM_F64, ((double[]){1, 2, 3, 4, 10, 10, 10, 14}),
                                  NDM_SHAPE(2, 4));
    ndm_array y = ndm_forward(ln, x);
    int64_t n;
    double *v = values(y, &n);
    /* row 0: mean 2.5, biased variance 1.25 */
    assert_true(fabs(v[0] - (1 - 2.5) / sqrt(1.25)) < 1e-9);
    assert_true(fabs(v[3] - (4 - 2.5) / sqrt(1.25)) < 1e-9);
    /* row 1: mean 11, variance 3 */
    assert_true(fabs(v[7] - 3 / sqrt(3.0)) < 1e-9);
    free(v);
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(x));
    char buf[64];
    ndm_module ln2 = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(2, 4));
    ndm_module_describe(ln2, buf, sizeof buf);
    assert_string_equal(buf, "LayerNorm(2, 4)");
    assert_ok(ndm_manager_close(model));
}

static void test_norm_rms_norm_matches_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    /* x = (np.arange(6) - 2.5).reshape(2, 3) / 2, w = [0.5, 1, 2]:
     * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w */
    ndm_array x = ndm_from_buffer(m, NDM_F64, ((double[]){-1.25, -0.75, -0.25, 0.25, 0.75, 1.25}),
                                  NDM_SHAPE(2, 3));
    ndm_array w = ndm_from_buffer(m, NDM_F64, ((double[]){0.5, 1, 2}), NDM_SHAPE(3));
    static const double with_w[6] = {-0.73192455282044999, -0.87830946338453997,
                                      -0.58553964225636002, 0.14638491056409,
                                      0.87830946338453997,  2.9276982112818};
    static const double plain[6] = {-1.4638491056409,    -0.87830946338453997,
                                    -0.29276982112818001, 0.29276982112818001,
                                    0.87830946338453997,  1.4638491056409};
    uint64_t live = test_live_arrays(m);
    ndm_array y = ndm_rms_norm(x, w, 1e-6), z = ndm_rms_norm(x, NDM_NULL_ARRAY, 1e-6);
    assert_int_equal(test_live_arrays(m), live + 2); /* the parts are gone */
    int64_t n;
    double *vy = values(y, &n), *vz = values(z, &n);
    for (int i = 0; i < 6; i++)
        assert_true(fabs(vy[i] - with_w[i]) < 1e-14 && fabs(vz[i] - plain[i]) < 1e-14);
    free(vy);
    free(vz);
    /* the layer: weight ones, named as PyTorch names it; f32 input */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module rn = ndm_rms_norm_module(model, 3, 1e-6, true);
    assert_live(rn);
    const char *names[2];
    ndm_array ps[2];
    assert_int_equal(ndm_module_named_parameters(rn, names, ps, 2), 1);
    assert_string_equal(names[0], "weight");
    char buf[32];
    ndm_module_describe(rn, buf, sizeof buf);
    assert_string_equal(buf, "RMSNorm(3)");
    ndm_array x32 = ndm_astype(x, NDM_F32);
    ndm_array y32 = ndm_forward(rn, x32);
    double *v32 = values(y32, &n);
    assert_int_equal(ndm_array_dtype(y32), NDM_F32);
    for (int i = 0; i < 6; i++)
        assert_true(fabs(v32[i] - plain[i]) < 1e-6);
    free(v32);
    /* refusals, nothing made */
    live = test_live_arrays(m);
    ndm_array xi = ndm_zeros(m, NDM_I32, NDM_SHAPE(2, 3));
    ndm_array w4 = ndm_ones(m, NDM_F64, NDM_SHAPE(4));
    ndm_array s0 = ndm_scalar(m, NDM_F64, 1);
    assert_true(ndm_array_is_null(ndm_rms_norm(xi, w, 1e-6)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_rms_norm(x, w4, 1e-6)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_rms_norm(s0, NDM_NULL_ARRAY, 1e-6)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_rms_norm(x, w, -1.0)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("ndm_rms_norm");
    ndm_array x4 = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 4));
    assert_true(ndm_array_is_null(ndm_forward(rn, x4)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_rms_norm_module(model, 0, 1e-6, true).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(test_live_arrays(m), live + 4);
    ndm_array arr[] = {x, w, y, z, x32, y32, xi, w4, s0, x4};
    for (size_t k = 0; k < sizeof arr / sizeof *arr; k++)
        assert_ok(ndm_array_release(arr[k]));
    ndm_clear_error();
    assert_ok(ndm_manager_close(model));
}

static void test_norm_rms_norm_gradients(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module rn = ndm_rms_norm_module(model, 4, 1e-5, true);
    perturb(rn);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const int64_t shape[] = {3, 2, 4};
    ndm_array x = input(data, 9, 3, shape);
    ndm_array r = weights(data, 3, shape);
    check_gradients(ROOT(state), rn, x, r);
    ndm_module plain = ndm_rms_norm_module(model, 4, 1e-5, false);
    assert_int_equal(ndm_module_parameters(plain, NULL, 0), 0);
    check_gradients(ROOT(state), plain, x, r);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

static void test_norm_batch_norm_running_statistics(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module bn = ndm_batch_norm1d(model, 2, 1e-5, 0.1, true);
    assert_live(bn);
    /* buffers are model arrays without gradients, parameters have them */
    const char *names[8];
    ndm_array st[8];
    assert_int_equal(ndm_module_named_state(bn, names, st, 8), 5);
    assert_string_equal(names[2], "running_mean");
    assert_string_equal(names[4], "num_batches_tracked");
    assert_int_equal(ndm_module_parameters(bn, NULL, 0), 2);
    assert_false(ndm_array_requires_grad(st[2]));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS)); /* updates are in place */
    /* channel 0: 1, 2, 3, 6 (mean 3, unbiased var 14/3); channel 1: all 5 */
    ndm_array x = ndm_from_buffer(ROOT(state), NDM_F32, ((float[]){1, 5, 2, 5, 3, 5, 6, 5}),
                                  NDM_SHAPE(4, 2));
    ndm_array y = ndm_forward(bn, x);
    assert_live(y);
    int64_t n;
    double *rm = values(st[2], &n), *rv = values(st[3], &n);
    assert_true(fabs(rm[0] - 0.1 * 3) < 1e-6 && fabs(rm[1] - 0.5) < 1e-6);
    assert_true(fabs(rv[0] - (0.9 + 0.1 * 14.0 / 3)) < 1e-6 && fabs(rv[1] - 0.9) < 1e-6);
    free(rm);
    free(rv);
    double *yv = values(y, &n); /* batch statistics: biased variance 3.5 */
    assert_true(fabs(yv[0] - (1 - 3) / sqrt(3.5 + 1e-5)) < 1e-5);
    assert_true(fabs(yv[1]) < 1e-6);
    free(yv);
    int64_t count;
    assert_ok(ndm_item_i64(st[4], &count));
    assert_int_equal(count, 1);
    /* evaluation: the running statistics, and no update */
    assert_ok(ndm_module_set_training(bn, false));
    ndm_array e = ndm_forward(bn, x);
    yv = values(e, &n);
    assert_true(fabs(yv[0] - (1 - 0.3) / sqrt(0.9 + 0.1 * 14.0 / 3 + 1e-5)) < 1e-5);
    free(yv);
    assert_ok(ndm_item_i64(st[4], &count));
    assert_int_equal(count, 1);
    char buf[64];
    ndm_module_describe(bn, buf, sizeof buf);
    assert_string_equal(buf, "BatchNorm1d(2)");
    assert_ok(ndm_array_release(e));
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_close(model));
}

static void test_norm_bad_input_is_refused(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    assert_int_equal(ndm_batch_norm1d(model, 0, 1e-5, 0.1, true).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(ndm_batch_norm2d(model, 3, 0.0, 0.1, true).id, 0);
    assert_int_equal(ndm_batch_norm2d(model, 3, 1e-5, 1.5, true).id, 0);
    assert_int_equal(ndm_batch_norm_at(NDM_HERE, model, 3, 3, 1e-5, 0.1, true).id, 0);
    assert_int_equal(ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(0)).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(test_live_arrays(model), 0);
    ndm_module bn = ndm_batch_norm2d(model, 3, 1e-5, 0.1, true);
    ndm_module ln = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(4));
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    ndm_array x3 = ndm_zeros(data, NDM_F32, NDM_SHAPE(2, 3, 4));
    ndm_array x4 = ndm_zeros(data, NDM_F32, NDM_SHAPE(2, 5, 4, 4));
    ndm_array one = ndm_zeros(data, NDM_F32, NDM_SHAPE(1, 3, 1, 1));
    assert_int_equal(ndm_forward(bn, x3).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("BatchNorm2d(3) takes (N, 3, H, W), not a rank-3 input");
    assert_int_equal(ndm_forward(bn, x4).id, 0);
    assert_error_has("with another channel count");
    assert_int_equal(ndm_forward(bn, one).id, 0);
    assert_error_has("more than one value per channel");
    assert_live(ndm_forward(ln, x3));
    assert_int_equal(ndm_forward(ln, ndm_zeros(data, NDM_F32, NDM_SHAPE(4, 3))).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    /* a refused forward pass left nothing behind, and the buffers unchanged */
    const char *names[8];
    ndm_array st[8];
    ndm_module_named_state(bn, names, st, 8);
    int64_t count;
    assert_ok(ndm_item_i64(st[4], &count));
    assert_int_equal(count, 0);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_norm_batch_norm_gradients),
        TEST(test_norm_layer_norm_gradients),
        TEST(test_norm_layer_norm_normalises),
        TEST(test_norm_rms_norm_matches_numpy),
        TEST(test_norm_rms_norm_gradients),
        TEST(test_norm_batch_norm_running_statistics),
        TEST(test_norm_bad_input_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
