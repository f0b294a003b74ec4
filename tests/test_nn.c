/* nn: layers against values computed here, initialisers, optimizers against
 * hand-computed updates, schedules, dropout, training convergence, the
 * predictor under threads, and the error paths. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "data/cross_entropy_ignore.h"
#include "helpers.h"

static void fill(ndm_array a, const float *v)
{
    assert_ok(ndm_array_copy_in(a, v, ndm_array_nbytes(a)));
}

static ndm_array param(ndm_module m, int i)
{
    ndm_array p[8];
    int n = ndm_module_parameters(m, p, 8);
    assert_true(i < n);
    return p[i];
}

static void test_nn_linear_forward_and_names(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module lin = ndm_linear(model, 3, 2, true, &rng);
    assert_true(lin.id != 0);
    float w[6] = {1, 2, 3, -1, 0.5f, 2}, b[2] = {0.25f, -1};
    fill(param(lin, 0), w);
    fill(param(lin, 1), b);
    ndm_manager batch = ndm_manager_new(model, "batch");
    float xv[6] = {1, 0, -1, 2, 1, 0.5f};
    ndm_array x = ndm_from_buffer(batch, NDM_F32, xv, NDM_SHAPE(2, 3));
    ndm_array y = ndm_forward(lin, x);
    assert_live(y);
    assert_true(ndm_array_manager(y).id == batch.id); /* the input's manager, not the model */
    float out[4];
    assert_ok(ndm_array_copy_out(y, out, sizeof out));
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 2; c++) {
            float want = b[c];
            for (int k = 0; k < 3; k++)
                want += xv[r * 3 + k] * w[c * 3 + k];
            assert_true(fabsf(out[r * 2 + c] - want) < 1e-5f);
        }
    /* the forward pass left only its result in the batch */
    assert_int_equal(test_live_arrays(batch), 2);
    const char *names[4];
    assert_int_equal(ndm_module_named_parameters(lin, names, NULL, 4), 2);
    assert_string_equal(names[0], "weight");
    assert_string_equal(names[1], "bias");
    ndm_module seq = ndm_sequential(model, NDM_MODULES(lin, ndm_relu_module(model),
                                                       ndm_linear(model, 2, 4, false, &rng)));
    assert_int_equal(ndm_module_named_parameters(seq, names, NULL, 4), 3);
    assert_string_equal(names[0], "0.weight");
    assert_string_equal(names[2], "2.weight");
    char desc[128];
    ndm_module_describe(seq, desc, sizeof desc);
    assert_string_equal(desc, "Sequential(Linear(3, 2), ReLU, Linear(2, 4, bias=false))");
    assert_ok(ndm_manager_close(model));
    /* the modules died with the model */
    assert_true(ndm_forward(lin, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("was freed when its manager");
}

/* An integer or bool input to Linear is refused (PyTorch's nn.Linear
 * refuses it too), alone and fused with a ReLU in a Sequential, naming the
 * caller's line; nothing is left behind. */
static void test_nn_linear_refuses_integer_input(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(2);
    ndm_module lin = ndm_linear(model, 3, 2, true, &rng);
    ndm_module seq = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 3, 2, true, &rng),
                                                       ndm_relu_module(model)));
    ndm_manager batch = ndm_manager_new(model, "batch");
    const ndm_dtype bad[] = {NDM_I32, NDM_I64, NDM_U8, NDM_BOOL};
    for (int i = 0; i < 4; i++) {
        ndm_array x = ndm_ones(batch, bad[i], NDM_SHAPE(2, 3));
        int line = __LINE__; ndm_array y = ndm_forward(lin, x);
        assert_int_equal(y.id, 0);
        assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
        char want[96];
        snprintf(want, sizeof want, "Linear takes a float input, got %s", ndm_dtype_short(bad[i]));
        assert_error_has(want);
        snprintf(want, sizeof want, "test_nn.c:%d", line);
        assert_error_has(want);
        assert_int_equal(ndm_forward(seq, x).id, 0);
        assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
        assert_int_equal(test_live_arrays(batch), 1); /* x alone */
        assert_ok(ndm_array_release(x));
    }
    /* float inputs of every float dtype still run */
    ndm_array x = ndm_ones(batch, NDM_F64, NDM_SHAPE(2, 3));
    assert_live(ndm_forward(lin, x));
    assert_ok(ndm_manager_close(model));
}

/* A failure inside a layer's constructor, an optimizer's or backward reads
 * as the function the user called, at the user's line (not the ndm_empty or
 * the helper it went through). */
static void test_nn_messages_name_the_function_called(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager capped = ndm_manager_new(model, "capped");
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    ndm_rng rng = ndm_rng_new(3);
    char at[64];
    int line = __LINE__; ndm_module lin = ndm_linear(capped, 4, 3, true, &rng);
    assert_int_equal(lin.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_true(strncmp(ndm_last_error(), "ndm_linear: ", 12) == 0);
    snprintf(at, sizeof at, "test_nn.c:%d", line);
    assert_error_has(at);
    line = __LINE__; ndm_module bn = ndm_batch_norm1d(capped, 4, 1e-5, 0.1, true);
    assert_int_equal(bn.id, 0);
    assert_true(strncmp(ndm_last_error(), "ndm_batch_norm", 14) == 0);
    /* an optimizer whose state finds no room */
    ndm_module net = ndm_linear(model, 4, 3, true, &rng);
    line = __LINE__; ndm_optimizer opt = ndm_adam(capped, net, 1e-3, 0.9, 0.999, 1e-8, 0);
    assert_int_equal(opt.id, 0);
    assert_true(strncmp(ndm_last_error(), "ndm_adam: ", 10) == 0);
    /* backward of an array no recorded operation made */
    ndm_array x = ndm_ones(model, NDM_F32, NDM_SHAPE(1));
    line = __LINE__; assert_int_equal(ndm_backward(x), NDM_E_INVALID);
    assert_true(strncmp(ndm_last_error(), "ndm_backward: ", 14) == 0);
    snprintf(at, sizeof at, "test_nn.c:%d", line);
    assert_error_has(at);
    /* after the call, other failures are their own again */
    assert_int_equal(ndm_empty(capped, NDM_F32, NDM_SHAPE(2)).id, 0);
    assert_true(strncmp(ndm_last_error(), "ndm_empty: ", 11) == 0);
    assert_ok(ndm_manager_close(model));
}

static void test_nn_init_bounds(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_rng rng = ndm_rng_new(7);
    ndm_array w = ndm_empty(m, NDM_F32, NDM_SHAPE(64, 200));
    assert_ok(ndm_init_kaiming_uniform_(w, &rng));
    float *v = ndm_array_data(w);
    double b = sqrt(2.0) * sqrt(3.0 / 200), s = 0, s2 = 0;
    for (int i = 0; i < 64 * 200; i++) {
        assert_true(fabs(v[i]) <= b);
        s += v[i];
        s2 += v[i] * (double)v[i];
    }
    double n = 64 * 200, var = s2 / n - (s / n) * (s / n);
    assert_true(fabs(var - b * b / 3) < 0.05 * b * b / 3); /* U(-b, b) has variance b^2/3 */
    assert_ok(ndm_init_xavier_uniform_(w, &rng));
    double bx = sqrt(6.0 / (200 + 64));
    for (int i = 0; i < 64 * 200; i++)
        assert_true(fabs(v[i]) <= bx);
    ndm_array s0 = ndm_empty(m, NDM_F32, NDM_SCALAR);
    assert_status(ndm_init_kaiming_uniform_(s0, &rng), NDM_E_SHAPE);
    assert_ok(ndm_manager_close(m));
}

/* One step of each optimizer against the formulas, on w = [1, -2], g = [0.5, 0.25]. */
static void one_step(ndm_manager root, int which, float *after)
{
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module lin = ndm_linear(model, 2, 1, false, &rng);
    ndm_optimizer o = which == 0   ? ndm_sgd(model, lin, 0.1, 0.0, 0.0)
                      : which == 1 ? ndm_sgd(model, lin, 0.1, 0.9, 0.01)
                      : which == 2 ? ndm_adam(model, lin, 0.1, 0.9, 0.999, 1e-8, 0.01)
                                   : ndm_adamw(model, lin, 0.1, 0.9, 0.999, 1e-8, 0.01);
    assert_true(o.id != 0);
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_array w = param(lin, 0);
    float wv[2] = {1, -2}, gv[2] = {0.5f, 0.25f};
    fill(w, wv);
    ndm_manager b = ndm_manager_new(model, "b");
    for (int step = 0; step < 2; step++) {
        fill(ndm_grad_to(b, w), gv);
        assert_ok(ndm_optimizer_step(o));
    }
    ndm_stats st;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st));
    ndm_stats st2 = st;
    assert_ok(ndm_optimizer_step(o)); /* a third step allocates nothing */
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &st2));
    assert_int_equal(st2.created, st.created);
    assert_int_equal(st2.live_bytes, st.live_bytes);
    assert_ok(ndm_array_copy_out(w, after, 2 * sizeof(float)));
    assert_ok(ndm_manager_close(model));
}

static void test_nn_optimizer_updates(void **state)
{
    const double w0[2] = {1, -2}, g[2] = {0.5, 0.25};
    float got[2];
    for (int which = 0; which < 4; which++) {
        double w[2] = {w0[0], w0[1]}, v[2] = {0, 0}, m[2] = {0, 0}, s[2] = {0, 0};
        for (int t = 1; t <= 3; t++)
            for (int i = 0; i < 2; i++) {
                if (which == 0) {
                    w[i] -= 0.1 * g[i];
                } else if (which == 1) {
                    v[i] = 0.9 * v[i] + g[i] + 0.01 * w[i];
                    w[i] -= 0.1 * v[i];
                } else {
                    double gi = which == 2 ? g[i] + 0.01 * w[i] : g[i];
                    if (which == 3)
                        w[i] *= 1 - 0.1 * 0.01;
                    m[i] = 0.9 * m[i] + 0.1 * gi;
                    s[i] = 0.999 * s[i] + 0.001 * gi * gi;
                    double mh = m[i] / (1 - pow(0.9, t)), sh = s[i] / (1 - pow(0.999, t));
                    w[i] -= 0.1 * mh / (sqrt(sh) + 1e-8);
                }
            }
        one_step(ROOT(state), which, got);
        for (int i = 0; i < 2; i++)
            if (fabs(got[i] - w[i]) > 1e-5)
                fail_msg("optimizer %d: w[%d] = %.7g, expected %.7g", which, i, got[i], w[i]);
    }
}

/* The composed update the optimizers are defined by: the in-place
 * operations below, each rounded to the array's dtype. */
static void composed_step(int which, int64_t t, ndm_array w, ndm_array g, ndm_array m,
                          ndm_array v, ndm_array t1, ndm_array t2)
{
    const double lr = 0.1, wd = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    bool decay = which == 1 || which == 2 || which == 3, adam = which >= 3;
    ndm_array d = g;
    if (decay && which != 4) { /* L2: d = w * wd + g */
        assert_ok(ndm_copy_into(t1, w));
        assert_ok(ndm_mul_scalar_(t1, wd));
        assert_ok(ndm_add_(t1, g));
        d = t1;
    }
    if (!adam) {
        if (which != 2) { /* momentum */
            assert_ok(ndm_mul_scalar_(m, 0.9));
            assert_ok(ndm_add_(m, d));
            d = m;
        }
        assert_ok(ndm_copy_into(t2, d));
        assert_ok(ndm_mul_scalar_(t2, lr));
        assert_ok(ndm_sub_(w, t2));
        return;
    }
    double bc1 = 1 - pow(b1, (double)t), bc2 = 1 - pow(b2, (double)t);
    if (which == 4)
        assert_ok(ndm_mul_scalar_(w, 1 - lr * wd));
    assert_ok(ndm_mul_scalar_(m, b1));
    assert_ok(ndm_copy_into(t2, d));
    assert_ok(ndm_mul_scalar_(t2, 1 - b1));
    assert_ok(ndm_add_(m, t2));
    assert_ok(ndm_mul_scalar_(v, b2));
    assert_ok(ndm_copy_into(t2, d));
    assert_ok(ndm_mul_(t2, d));
    assert_ok(ndm_mul_scalar_(t2, 1 - b2));
    assert_ok(ndm_add_(v, t2));
    assert_ok(ndm_copy_into(t2, v));
    assert_ok(ndm_mul_scalar_(t2, 1 / bc2));
    assert_ok(ndm_sqrt_(t2));
    assert_ok(ndm_add_scalar_(t2, eps));
    assert_ok(ndm_copy_into(t1, m));
    assert_ok(ndm_div_(t1, t2));
    assert_ok(ndm_mul_scalar_(t1, lr / bc1));
    assert_ok(ndm_sub_(w, t1));
}

/* Each optimizer's step leaves the very bits of the composed in-place
 * operations: SGD plain, with momentum and L2 decay, with decay alone, Adam
 * with L2 decay, AdamW; f32 and f64; a size the pool splits, with a tail. */
static void test_nn_optimizer_step_same_bits(void **state)
{
    const int64_t n = 70001;
    double *wv = malloc((size_t)n * sizeof *wv), *gv = malloc((size_t)n * sizeof *gv);
    assert_non_null(wv);
    assert_non_null(gv);
    uint64_t r = 12345;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        wv[i] = ((double)(r >> 11) / 9007199254740992.0 - 0.5) * 4;
    }
    for (int which = 0; which < 5; which++)
        for (int f64 = 0; f64 < 2; f64++) {
            ndm_dtype dt = f64 ? NDM_F64 : NDM_F32;
            ndm_manager model = ndm_manager_new(ROOT(state), "model");
            ndm_array w = ndm_astype(ndm_from_buffer(model, NDM_F64, wv, NDM_SHAPE(n)), dt);
            /* the reference: the same values in storage of its own */
            ndm_array rw = ndm_astype(ndm_from_buffer(model, NDM_F64, wv, NDM_SHAPE(n)), dt);
            ndm_array rm = ndm_zeros(model, dt, NDM_SHAPE(n)), rv = ndm_zeros(model, dt, NDM_SHAPE(n));
            ndm_array t1 = ndm_zeros(model, dt, NDM_SHAPE(n)), t2 = ndm_zeros(model, dt, NDM_SHAPE(n));
            assert_live(rw);
            assert_ok(ndm_requires_grad(w));
            double lr = 0.1, wd = which == 0 ? 0.0 : 0.01;
            ndm_optimizer o = which == 0   ? ndm_sgd_params(model, 1, &w, lr, 0.9, 0.0)
                              : which == 1 ? ndm_sgd_params(model, 1, &w, lr, 0.9, wd)
                              : which == 2 ? ndm_sgd_params(model, 1, &w, lr, 0.0, wd)
                              : which == 3 ? ndm_adam_params(model, 1, &w, lr, 0.9, 0.999, 1e-8, wd)
                                           : ndm_adamw_params(model, 1, &w, lr, 0.9, 0.999, 1e-8, wd);
            assert_live(o);
            ndm_manager b = ndm_manager_new(model, "b");
            for (int64_t t = 1; t <= 3; t++) {
                for (int64_t i = 0; i < n; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    gv[i] = ((double)(r >> 11) / 9007199254740992.0 - 0.5) * (i % 5 ? 1 : 1e-3);
                }
                ndm_array g = ndm_astype(ndm_from_buffer(b, NDM_F64, gv, NDM_SHAPE(n)), dt);
                assert_ok(ndm_copy_into(ndm_grad_to(b, w), g));
                assert_ok(ndm_optimizer_step(o));
                composed_step(which, t, rw, g, rm, rv, t1, t2);
            }
            size_t bytes = (size_t)ndm_array_nbytes(w);
            char *a = malloc(bytes), *e = malloc(bytes);
            assert_non_null(a);
            assert_non_null(e);
            assert_ok(ndm_array_copy_out(w, a, bytes));
            assert_ok(ndm_array_copy_out(rw, e, bytes));
            if (memcmp(a, e, bytes))
                fail_msg("optimizer %d (%s): the step differs from the composed operations",
                         which, f64 ? "f64" : "f32");
            free(a);
            free(e);
            assert_ok(ndm_manager_close(model));
        }
    free(wv);
    free(gv);
}

static void test_nn_schedules(void **state)
{
    (void)state;
    assert_true(ndm_lr_step(0.1, 0, 3, 0.5) == 0.1);
    assert_true(ndm_lr_step(0.1, 3, 3, 0.5) == 0.05);
    assert_true(fabs(ndm_lr_step(0.1, 7, 3, 0.5) - 0.025) < 1e-15);
    assert_true(ndm_lr_cosine(1.0, 0.0, 0, 10) == 1.0);
    assert_true(fabs(ndm_lr_cosine(1.0, 0.0, 5, 10) - 0.5) < 1e-15);
    assert_true(fabs(ndm_lr_cosine(1.0, 0.1, 10, 10) - 0.1) < 1e-15);
    assert_true(fabs(ndm_lr_cosine(1.0, 0.1, 99, 10) - 0.1) < 1e-15);
}

static void test_nn_dropout_and_flatten(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module d = ndm_dropout_module(model, 0.25, 99);
    ndm_module f = ndm_flatten_module(model, 1);
    ndm_manager b = ndm_manager_new(model, "b");
    ndm_array x = ndm_ones(b, NDM_F32, NDM_SHAPE(100, 10, 10));
    ndm_array y = ndm_forward(d, x);
    float *v = ndm_array_data(y);
    int zeros = 0;
    for (int i = 0; i < 10000; i++) {
        assert_true(v[i] == 0.0f || fabsf(v[i] - 1.0f / 0.75f) < 1e-6f);
        zeros += v[i] == 0.0f;
    }
    assert_true(zeros > 2250 && zeros < 2750); /* p = 0.25 of 10000, far beyond 5 sigma */
    assert_ok(ndm_module_set_training(d, false));
    ndm_array e = ndm_forward(d, x);
    assert_int_equal(((float *)ndm_array_data(e))[17] == 1.0f, 1);
    ndm_array z = ndm_forward(f, x);
    int64_t shape[2];
    assert_int_equal(ndm_array_shape(z, shape, 2), 2);
    assert_true(shape[0] == 100 && shape[1] == 100);
    assert_true(ndm_dropout_module(model, 1.0, 0).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_ok(ndm_manager_close(model));
}

/* A forward pass answers: a result, or a null one with a negative status
 * and a message. */
static ndm_array forward_answers(ndm_module m, ndm_array x, const char *what)
{
    ndm_clear_error();
    ndm_array y = ndm_forward(m, x);
    if (!y.id && (ndm_last_status() >= 0 || !*ndm_last_error()))
        fail_msg("%s: a null result with %s and message \"%s\"", what,
                 ndm_status_name(ndm_last_status()), ndm_last_error());
    return y;
}

/* Inputs of rank 65, above the 64 axes the layers once copied shapes into:
 * LayerNorm, Flatten and Dropout take them; every other layer answers. */
static void test_nn_layers_take_inputs_of_any_rank(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(5);
    ndm_manager b = ndm_manager_new(model, "b");
    enum { R = 65 };
    int64_t shape[R], got[R + 1];
    for (int i = 0; i < R; i++)
        shape[i] = 1;
    shape[0] = 2;
    shape[R - 1] = 3;
    ndm_array x = ndm_reshape(ndm_arange(b, NDM_F32, 1, 7, 1), R, shape); /* 1..6 */
    assert_live(x);

    ndm_module ln = ndm_layer_norm(model, 1e-5, false, NDM_SHAPE(3));
    ndm_array y = forward_answers(ln, x, "LayerNorm");
    assert_live(y);
    assert_int_equal(ndm_array_shape(y, got, R), R);
    assert_memory_equal(got, shape, sizeof shape);
    float v[6];
    assert_ok(ndm_array_copy_out(y, v, sizeof v));
    for (int i = 0; i < 6; i++) /* each row (a, a+1, a+2) becomes (-s, 0, s) */
        assert_true(fabsf(v[i] - (float)((i % 3) - 1) * 1.2247357f) < 1e-4f);

    /* Flatten from an axis below 16 and from one above it */
    ndm_array f1 = forward_answers(ndm_flatten_module(model, 1), x, "Flatten(1)");
    assert_live(f1);
    assert_int_equal(ndm_array_shape(f1, got, R), 2);
    assert_true(got[0] == 2 && got[1] == 3);
    ndm_array f40 = forward_answers(ndm_flatten_module(model, 40), x, "Flatten(40)");
    assert_live(f40);
    assert_int_equal(ndm_array_shape(f40, got, R), 41);
    assert_true(got[0] == 2 && got[39] == 1 && got[40] == 3);
    assert_int_equal(ndm_forward(ndm_flatten_module(model, R), x).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_AXIS);

    ndm_module drop = ndm_dropout_module(model, 0.5, 7);
    ndm_array d = forward_answers(drop, x, "Dropout");
    assert_live(d);
    assert_int_equal(ndm_array_shape(d, got, R), R);
    assert_ok(ndm_array_copy_out(d, v, sizeof v));
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == 0.0f || v[i] == 2.0f * (float)(i + 1));

    /* the others: a result or a clear refusal */
    ndm_pool2d_opts pool = {.kernel = {1, 1}};
    ndm_module others[] = {
        ndm_linear(model, 3, 2, true, &rng),
        ndm_conv2d_module(model, 1, 1, 1, 1, true, &rng, NULL),
        ndm_max_pool2d_module(model, &pool),
        ndm_relu_module(model),
        ndm_gelu_module(model),
        ndm_batch_norm1d(model, 2, 1e-5, 0.1, true),
        ndm_batch_norm2d(model, 2, 1e-5, 0.1, true),
        ndm_sequential(model, NDM_MODULES(ndm_linear(model, 3, 3, true, &rng),
                                          ndm_relu_module(model))),
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        char what[128];
        assert_live(others[i]);
        assert_true(ndm_module_describe(others[i], what, sizeof what) > 0);
        forward_answers(others[i], x, what);
    }
    ndm_array bn = ndm_forward(others[5], x);
    assert_int_equal(bn.id, 0);
    assert_error_has("not a rank-65 input");
    /* an embedding of rank-65 indices */
    shape[R - 1] = 1;
    ndm_array idx = ndm_reshape(ndm_zeros(b, NDM_I64, NDM_SHAPE(2)), R, shape);
    forward_answers(ndm_embedding(model, 4, 3, &rng), idx, "Embedding");
    assert_ok(ndm_manager_close(model));
}

/* A tiny separable problem: both optimizers must fit it. */
static void test_nn_training_converges(void **state)
{
    for (int which = 0; which < 2; which++) {
        ndm_manager model = ndm_manager_new(ROOT(state), "model");
        ndm_rng rng = ndm_rng_new(11);
        ndm_module net = ndm_sequential(
            model, NDM_MODULES(ndm_linear(model, 2, 16, true, &rng), ndm_relu_module(model),
                               ndm_linear(model, 16, 2, true, &rng)));
        ndm_optimizer opt = which ? ndm_adam(model, net, 0.05, 0.9, 0.999, 1e-8, 0)
                                  : ndm_sgd(model, net, 0.2, 0.9, 0);
        assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
        float xs[64][2];
        int64_t ys[64];
        for (int i = 0; i < 64; i++) {
            xs[i][0] = (float)((i * 37) % 64) / 32.0f - 1.0f;
            xs[i][1] = (float)((i * 11) % 64) / 32.0f - 1.0f;
            ys[i] = xs[i][0] + xs[i][1] > 0;
        }
        double first = 0, last = 0;
        uint64_t base = test_live_arrays(model);
        for (int step = 0; step < 150; step++) {
            ndm_manager batch = ndm_manager_new(model, "batch");
            ndm_array x = ndm_from_buffer(batch, NDM_F32, xs, NDM_SHAPE(64, 2));
            ndm_array y = ndm_from_buffer(batch, NDM_I64, ys, NDM_SHAPE(64));
            assert_ok(ndm_grad_begin(batch));
            ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
            assert_ok(ndm_backward(loss));
            assert_ok(ndm_grad_end());
            assert_ok(ndm_optimizer_step(opt));
            assert_ok(ndm_optimizer_zero_grad(opt));
            double l;
            assert_ok(ndm_item(loss, &l));
            if (step == 0)
                first = l;
            last = l;
            assert_ok(ndm_manager_close(batch));
        }
        assert_true(last < 0.1 * first);
        ndm_stats s1;
        assert_ok(ndm_manager_stats(model, NDM_CPU, NDM_STATS_SUBTREE, &s1));
        assert_int_equal(s1.children, 0);
        assert_int_equal(test_live_arrays(model), base); /* nothing accumulated in the model */
        assert_ok(ndm_manager_close(model));
    }
}

typedef struct pred_arg {
    ndm_predictor p;
    ndm_manager out;
    float x[4];
    float y[2];
    int errors;
} pred_arg;

static void *predict_many(void *v)
{
    pred_arg *a = v;
    for (int i = 0; i < 500; i++) {
        ndm_manager mine = ndm_manager_new(a->out, "caller");
        ndm_array x = ndm_from_buffer(mine, NDM_F32, a->x, NDM_SHAPE(1, 4));
        ndm_array y = ndm_predict(a->p, x);
        float r[2];
        if (!y.id || ndm_array_manager(y).id != mine.id ||
            ndm_array_copy_out(y, r, sizeof r) != NDM_OK || r[0] != a->y[0] || r[1] != a->y[1])
            a->errors++;
        if (ndm_manager_close(mine) != NDM_OK)
            a->errors++;
    }
    return NULL;
}

/* A serving thread keeps one request manager per predictor open between
 * its requests: the predictor's children stay at one per serving thread,
 * each empty between requests; a thread's close at its exit; a closed model
 * takes its parked managers with it. */
typedef struct parked_arg {
    pred_arg *a;
    pthread_barrier_t *served, *go;
} parked_arg;

static void *serve_once_and_wait(void *v)
{
    parked_arg *pa = v;
    ndm_manager mine = ndm_manager_new(pa->a->out, "caller");
    ndm_array x = ndm_from_buffer(mine, NDM_F32, pa->a->x, NDM_SHAPE(1, 4));
    if (!ndm_predict(pa->a->p, x).id) /* the answer goes with `mine` */
        pa->a->errors++;
    if (ndm_manager_close(mine) != NDM_OK)
        pa->a->errors++;
    pthread_barrier_wait(pa->served);
    pthread_barrier_wait(pa->go);
    return NULL;
}

static uint64_t pred_children(ndm_predictor p, ndm_stats *st)
{
    assert_ok(ndm_manager_stats(ndm_predictor_manager(p), NDM_CPU, NDM_STATS_SUBTREE, st));
    return st->children;
}

static void test_nn_predictor_parks_request_managers(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(6);
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 8, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 8, 2, true, &rng)));
    ndm_no_grad_end();
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id != 0);
    ndm_manager callers = ndm_manager_new(ROOT(state), "callers");
    float xin[4] = {1, 2, 3, 4};
    ndm_array x = ndm_from_buffer(callers, NDM_F32, xin, NDM_SHAPE(1, 4));
    ndm_stats st;
    assert_int_equal(pred_children(p, &st), 0);
    uint64_t made = 0;
    for (int i = 0; i < 50; i++) {
        ndm_array y = ndm_predict(p, x);
        assert_live(y);
        assert_ok(ndm_array_release(y));
        /* one request manager, empty between requests, its counts growing */
        assert_int_equal(pred_children(p, &st), 1);
        assert_int_equal(st.live_arrays, 0);
        assert_int_equal(st.live_bytes, 0);
        assert_true(st.created > made);
        made = st.created;
    }
    /* a second predictor on another model: a request manager of its own */
    ndm_manager model2 = ndm_manager_new(ROOT(state), "model2");
    ndm_no_grad_begin();
    ndm_module net2 = ndm_linear(model2, 4, 2, true, &rng);
    ndm_no_grad_end();
    ndm_predictor p2 = ndm_predictor_new(model2, net2);
    ndm_array y2 = ndm_predict(p2, x);
    assert_live(y2);
    assert_ok(ndm_array_release(y2));
    assert_int_equal(pred_children(p2, &st), 1);
    assert_int_equal(pred_children(p, &st), 1);
    /* another serving thread adds its own while it lives */
    pred_arg a = {p, callers, {1, 2, 3, 4}, {0, 0}, 0};
    pthread_barrier_t served, go;
    pthread_barrier_init(&served, NULL, 2);
    pthread_barrier_init(&go, NULL, 2);
    parked_arg pa = {&a, &served, &go};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, serve_once_and_wait, &pa), 0);
    pthread_barrier_wait(&served);
    assert_int_equal(pred_children(p, &st), 2);
    assert_int_equal(st.live_arrays, 0);
    pthread_barrier_wait(&go);
    pthread_join(th, NULL);
    assert_int_equal(a.errors, 0);
    assert_int_equal(pred_children(p, &st), 1); /* closed at the thread's exit */
    pthread_barrier_destroy(&served);
    pthread_barrier_destroy(&go);
    /* closing a model closes its parked managers; the thread serves on */
    assert_ok(ndm_manager_close(model2));
    assert_true(ndm_predict(p2, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_array y = ndm_predict(p, x);
    assert_live(y);
    assert_ok(ndm_array_release(y));
    assert_int_equal(pred_children(p, &st), 1);
    assert_ok(ndm_array_release(x));
    assert_manager_empty(callers);
    assert_ok(ndm_manager_close(callers));
    assert_ok(ndm_manager_close(model));
}

static void test_nn_predictor_threads(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(5);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 8, true, &rng),
                                                       ndm_gelu_module(model),
                                                       ndm_linear(model, 8, 2, true, &rng)));
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id != 0);
    assert_int_equal(ndm_manager_caps(model), NDM_CAP_ARRAYS | NDM_CAP_CHILDREN);
    ndm_manager outs = ndm_manager_new(ROOT(state), "callers");
    pred_arg args[8];
    pthread_t th[8];
    for (int t = 0; t < 8; t++) {
        args[t] = (pred_arg){p, outs, {(float)t, 1, -1, 0.5f}, {0, 0}, 0};
        /* the expected answer, from one prediction in this thread */
        ndm_array x = ndm_from_buffer(outs, NDM_F32, args[t].x, NDM_SHAPE(1, 4));
        ndm_array y = ndm_predict(p, x);
        assert_live(y);
        assert_ok(ndm_array_copy_out(y, args[t].y, sizeof args[t].y));
        assert_ok(ndm_array_release(x));
        assert_ok(ndm_array_release(y));
    }
    for (int t = 0; t < 8; t++)
        assert_int_equal(pthread_create(&th[t], NULL, predict_many, &args[t]), 0);
    for (int t = 0; t < 8; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(args[t].errors, 0);
    }
    ndm_stats ps;
    assert_ok(ndm_manager_stats(ndm_predictor_manager(p), NDM_CPU, NDM_STATS_SUBTREE, &ps));
    /* each serving thread kept its request manager open between requests;
     * those of the 8 threads closed when they exited, this thread's stays */
    assert_int_equal(ps.children, 1);
    assert_int_equal(ps.live_arrays, 0);
    /* the requests' temporaries lived in the request managers, none in the
     * predictor's own manager; the answers moved out to the callers */
    assert_true(ps.created > 0);
    assert_int_equal(ps.created, ps.released + 8 * 500 + 8);
    assert_ok(ndm_manager_stats(ndm_predictor_manager(p), NDM_CPU, 0, &ps));
    assert_int_equal(ps.created, 0);
    /* a stray array into the served model fails at its line */
    assert_true(ndm_zeros(model, NDM_F32, NDM_SHAPE(2)).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_error_has("test_nn.c");
    assert_ok(ndm_manager_close(outs));
    assert_ok(ndm_manager_close(model));
}

/* Handle lookups take no lock: they must see a live object whole and never
 * take a stale handle for the object that reuses its slot, while another
 * thread makes and frees objects and the table grows by chunks. */
typedef struct churn_arg {
    ndm_manager root;
    _Atomic int done;
    int errors;
} churn_arg;

typedef struct lookup_arg {
    churn_arg *churn;
    ndm_module live, stale;
    long live_ok, stale_closed, wrong;
} lookup_arg;

static void *churn_objects(void *v)
{
    churn_arg *a = v;
    for (int i = 0; i < 1500; i++) {
        ndm_manager m = ndm_manager_new(a->root, "churn");
        /* every 100th round holds more objects than a chunk of the table */
        int n = i % 100 == 0 ? 300 : 3;
        for (int k = 0; k < n; k++) {
            ndm_module mod = ndm_relu_module(m);
            if (!mod.id || ndm_module_parameters(mod, NULL, 0) != 0)
                a->errors++;
        }
        if (ndm_manager_close(m) != NDM_OK)
            a->errors++;
    }
    atomic_store(&a->done, 1);
    return NULL;
}

static void *lookup_objects(void *v)
{
    lookup_arg *a = v;
    while (!atomic_load(&a->churn->done)) {
        int n = ndm_module_parameters(a->live, NULL, 0);
        if (n == 2)
            a->live_ok++;
        else
            a->wrong++;
        n = ndm_module_parameters(a->stale, NULL, 0);
        if (n == NDM_E_CLOSED)
            a->stale_closed++;
        else
            a->wrong++;
        /* a module's handle is never a predictor's */
        if (ndm_predictor_manager((ndm_predictor){a->live.id}).id != 0)
            a->wrong++;
    }
    return NULL;
}

static void test_nn_object_lookups_race_churn(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module live = ndm_linear(model, 3, 2, true, &rng);
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    ndm_module stale = ndm_relu_module(gone);
    assert_true(live.id && stale.id);
    assert_ok(ndm_manager_close(gone));
    churn_arg c = {.root = ROOT(state)};
    lookup_arg l[2] = {{&c, live, stale, 0, 0, 0}, {&c, live, stale, 0, 0, 0}};
    pthread_t tc, tl[2];
    assert_int_equal(pthread_create(&tc, NULL, churn_objects, &c), 0);
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&tl[t], NULL, lookup_objects, &l[t]), 0);
    pthread_join(tc, NULL);
    for (int t = 0; t < 2; t++) {
        pthread_join(tl[t], NULL);
        assert_int_equal(l[t].wrong, 0);
        assert_true(l[t].live_ok > 0 && l[t].stale_closed == l[t].live_ok);
    }
    assert_int_equal(c.errors, 0);
    /* the stale handle still says what it was, after its slot's reuse */
    assert_int_equal(ndm_module_parameters(stale, NULL, 0), NDM_E_CLOSED);
    assert_error_has("stale module handle");
    assert_ok(ndm_manager_close(model));
}

static void test_nn_embedding_and_loss_errors(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(9);
    ndm_module emb = ndm_embedding(model, 5, 3, &rng);
    ndm_manager b = ndm_manager_new(model, "b");
    int64_t idx[4] = {4, 0, 4, 2};
    ndm_array i = ndm_from_buffer(b, NDM_I64, idx, NDM_SHAPE(2, 2));
    ndm_array e = ndm_forward(emb, i);
    int64_t shape[3];
    assert_int_equal(ndm_array_shape(e, shape, 3), 3);
    assert_true(shape[0] == 2 && shape[1] == 2 && shape[2] == 3);
    float ev[12], table[15];
    assert_ok(ndm_array_copy_out(e, ev, sizeof ev));
    assert_ok(ndm_array_copy_out(param(emb, 0), table, sizeof table));
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 3; c++)
            assert_true(ev[k * 3 + c] == table[idx[k] * 3 + c]);
    /* gradient of an embedding lookup: rows scattered back, repeats added */
    assert_ok(ndm_grad_begin(b));
    ndm_array loss = ndm_sum(ndm_forward(emb, i), false, NDM_ALL_AXES_LIST);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    float g[15];
    assert_ok(ndm_array_copy_out(ndm_grad_to(b, param(emb, 0)), g, sizeof g));
    assert_true(g[4 * 3] == 2.0f && g[0] == 1.0f && g[1 * 3] == 0.0f && g[2 * 3] == 1.0f);
    /* losses refuse bad input */
    ndm_array logits = ndm_zeros(b, NDM_F32, NDM_SHAPE(2, 3));
    int64_t bad[2] = {0, 3};
    ndm_array lb = ndm_from_buffer(b, NDM_I64, bad, NDM_SHAPE(2));
    assert_true(ndm_cross_entropy(logits, lb).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_array l3 = ndm_zeros(b, NDM_I64, NDM_SHAPE(3));
    assert_true(ndm_cross_entropy(logits, l3).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    ndm_array fl = ndm_zeros(b, NDM_F32, NDM_SHAPE(2));
    assert_true(ndm_nll_loss(logits, fl).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    /* an optimizer cannot make its state in a capped model */
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_true(ndm_sgd(model, emb, 0.1, 0.9, 0).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_true(ndm_linear(model, 0, 3, true, &rng).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_ok(ndm_manager_close(model));
}

/* Labels outside [0, C) are refused for every label dtype, naming the first
 * bad one and its position; -1 is not taken as class C-1. */
static void test_nn_loss_labels_outside_classes_are_refused(void **state)
{
    ndm_manager b = ndm_manager_new(ROOT(state), "batch");
    ndm_array logits = ndm_zeros(b, NDM_F32, NDM_SHAPE(4, 5));
    static const struct {
        ndm_dtype dt;
        int64_t v[4];
        const char *says;
    } bad[] = {
        {NDM_I64, {0, 2, -1, 4}, "label -1 at position 2 is outside [0, 5)"},
        {NDM_I64, {0, 5, -1, 4}, "label 5 at position 1 is outside [0, 5)"},
        {NDM_I64, {INT64_MIN, 0, 0, 0}, "label -9223372036854775808 at position 0"},
        {NDM_I32, {1, 1, 1, -5}, "label -5 at position 3 is outside [0, 5)"},
        {NDM_I32, {1, 7, 1, 1}, "label 7 at position 1 is outside [0, 5)"},
        {NDM_U8, {0, 1, 200, 3}, "label 200 at position 2 is outside [0, 5)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ndm_array l = ndm_astype(ndm_from_buffer(b, NDM_I64, (int64_t *)bad[i].v, NDM_SHAPE(4)),
                                 bad[i].dt);
        assert_live(l);
        uint64_t live = test_live_arrays(b);
        for (int nll = 0; nll < 2; nll++) {
            ndm_clear_error();
            ndm_array loss = nll ? ndm_nll_loss(logits, l) : ndm_cross_entropy(logits, l);
            if (loss.id || ndm_last_status() != NDM_E_INVALID ||
                !strstr(ndm_last_error(), bad[i].says))
                fail_msg("case %zu (%s): %s \"%s\", expected NDM_E_INVALID with \"%s\"", i,
                         nll ? "nll" : "cross entropy", ndm_status_name(ndm_last_status()),
                         ndm_last_error(), bad[i].says);
            assert_int_equal(test_live_arrays(b), live);
        }
    }
    /* in range, every dtype: -log(1/5) for equal scores */
    for (int k = 0; k < 3; k++) {
        ndm_dtype dt = k == 0 ? NDM_U8 : k == 1 ? NDM_I32 : NDM_I64;
        ndm_array l = ndm_astype(ndm_arange(b, NDM_I64, 1, 5, 1), dt);
        double ce, nll;
        assert_ok(ndm_item(ndm_cross_entropy(logits, l), &ce));
        assert_ok(ndm_item(ndm_nll_loss(logits, l), &nll));
        assert_true(fabs(ce - log(5.0)) < 1e-6);
        assert_true(nll == 0.0);
    }
    assert_ok(ndm_manager_close(b));
}

/* The loss of ce_ignore_cases[k] (labels of dtype dt) and its gradient
 * against what PyTorch gave (tests/data/make_cross_entropy_ignore.py). */
static void check_ignore_case(ndm_manager b, size_t k, ndm_dtype dt)
{
    ndm_array x = ndm_from_buffer(b, NDM_F32, (float *)ce_ignore_logits,
                                  NDM_SHAPE(CE_IGNORE_N, CE_IGNORE_C));
    ndm_array l = ndm_astype(ndm_from_buffer(b, NDM_I64, (int64_t *)ce_ignore_cases[k].labels,
                                             NDM_SHAPE(CE_IGNORE_N)),
                             dt);
    assert_live(x);
    assert_live(l);
    assert_ok(ndm_requires_grad(x));
    int64_t ig = ce_ignore_cases[k].ignore_index;
    assert_ok(ndm_grad_begin(b));
    ndm_array loss = ce_ignore_cases[k].nll
                         ? (ig == NDM_IGNORE_INDEX ? ndm_nll_loss(x, l) : ndm_nll_loss_ex(x, l, ig))
                         : (ig == NDM_IGNORE_INDEX ? ndm_cross_entropy(x, l)
                                                   : ndm_cross_entropy_ex(x, l, ig));
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    double v;
    assert_ok(ndm_item(loss, &v));
    double want = ce_ignore_cases[k].loss;
    if (isnan(want) ? !isnan(v) : fabs(v - want) > 1e-6 * (1 + fabs(want)))
        fail_msg("%s (%s labels): loss %.9g, PyTorch %.9g", ce_ignore_cases[k].name,
                 ndm_dtype_short(dt), v, want);
    float g[CE_IGNORE_N * CE_IGNORE_C];
    assert_ok(ndm_array_copy_out(ndm_grad_to(b, x), g, sizeof g));
    for (int i = 0; i < CE_IGNORE_N * CE_IGNORE_C; i++)
        if (fabsf(g[i] - ce_ignore_cases[k].grad[i]) > 1e-6f)
            fail_msg("%s (%s labels): gradient %d is %.9g, PyTorch %.9g",
                     ce_ignore_cases[k].name, ndm_dtype_short(dt), i, g[i],
                     ce_ignore_cases[k].grad[i]);
}

/* The loss must fail with NDM_E_INVALID and a message containing `needle`. */
#define assert_loss_refused(expr, needle)                                       \
    do {                                                                        \
        ndm_clear_error();                                                      \
        if ((expr).id || ndm_last_status() != NDM_E_INVALID)                    \
            fail_msg("%s: %s \"%s\", expected NDM_E_INVALID", #expr,          \
                     ndm_status_name(ndm_last_status()), ndm_last_error());     \
        assert_error_has(needle);                                               \
    } while (0)

/* PyTorch's ignore_index: rows labelled -100 (or the _ex form's label) add
 * nothing, get zero gradients, and the mean is over the others; all
 * ignored is NaN with zero gradients. Values and gradients are PyTorch's. */
static void test_nn_loss_ignored_labels_match_pytorch(void **state)
{
    ndm_manager b = ndm_manager_new(ROOT(state), "batch");
    for (size_t k = 0; k < sizeof ce_ignore_cases / sizeof *ce_ignore_cases; k++) {
        check_ignore_case(b, k, NDM_I64);
        check_ignore_case(b, k, NDM_I32);
        if (ce_ignore_cases[k].ignore_index >= 0) /* u8 labels hold no -100 */
            check_ignore_case(b, k, NDM_U8);
    }
    assert_ok(ndm_manager_close(b));
}

/* Only the ignored label is skipped: other negatives and labels past the
 * classes are still refused, naming the ignored one, with nothing left. */
static void test_nn_loss_ignore_index_refuses_other_bad_labels(void **state)
{
    ndm_manager b = ndm_manager_new(ROOT(state), "batch");
    ndm_array logits = ndm_zeros(b, NDM_F32, NDM_SHAPE(4, 5));
    int64_t minus1[4] = {0, -100, -1, 4}, past[4] = {-100, 5, 0, 0}, other[4] = {0, -100, 2, 2};
    ndm_array a = ndm_from_buffer(b, NDM_I64, minus1, NDM_SHAPE(4));
    ndm_array p = ndm_from_buffer(b, NDM_I64, past, NDM_SHAPE(4));
    ndm_array o = ndm_from_buffer(b, NDM_I64, other, NDM_SHAPE(4));
    assert_live(a);
    assert_live(p);
    assert_live(o);
    uint64_t live = test_live_arrays(b);
    assert_loss_refused(ndm_cross_entropy(logits, a),
                 "label -1 at position 2 is outside [0, 5) (the classes of the scores) and is "
                 "not the ignored label -100");
    assert_loss_refused(ndm_nll_loss(logits, p),
                 "label 5 at position 1 is outside [0, 5)");
    /* with another ignored label, -100 is a bad label like any other */
    assert_loss_refused(ndm_cross_entropy_ex(logits, o, 2),
                 "label -100 at position 1 is outside [0, 5) (the classes of the scores) and is "
                 "not the ignored label 2");
    assert_loss_refused(ndm_nll_loss_ex(logits, o, 7), "is not the ignored label 7");
    assert_int_equal(test_live_arrays(b), live);
    /* the rows kept: equal scores give log(5) whatever is ignored */
    double ce;
    assert_ok(ndm_item(ndm_cross_entropy_ex(logits, o, -100), &ce));
    assert_true(fabs(ce - log(5.0)) < 1e-6);
    assert_ok(ndm_manager_close(b));
}

/* A failure inside a forward pass names the caller's line, and the calls
 * that receive its null result keep that first error. */
static void test_nn_null_result_keeps_first_error(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_flatten_module(model, 1),
                                                       ndm_linear(model, 784, 16, true, &rng)));
    assert_live(model);
    ndm_manager b = ndm_manager_new(model, "batch");
    ndm_array x = ndm_zeros(b, NDM_F32, NDM_SHAPE(4, 28, 27)); /* 756 features, not 784 */
    assert_ok(ndm_grad_begin(b));
    ndm_clear_error();
    ndm_array y = ndm_forward(net, x);
    assert_null(y.id);
    ndm_status first = ndm_last_status();
    assert_int_equal(first, NDM_E_SHAPE);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ndm_last_error());
    assert_non_null(strstr(msg, "ndm_matmul"));
    assert_non_null(strstr(msg, "test_nn.c")); /* the caller's line, not the library's */
    assert_null(strstr(msg, "module.c"));
    /* every later call on the null result leaves the first error in place */
    ndm_array loss = ndm_cross_entropy(y, x);
    assert_null(loss.id);
    assert_int_equal(ndm_backward(loss), first);
    double v = 0;
    assert_int_equal(ndm_item(loss, &v), first);
    float out[1];
    assert_int_equal(ndm_array_copy_out(loss, out, sizeof out), first);
    assert_null(ndm_relu(ndm_add(loss, x)).id);
    assert_int_equal(ndm_add_(loss, x), first);
    assert_int_equal(ndm_last_status(), first);
    assert_string_equal(ndm_last_error(), msg);
    /* after ndm_clear_error a null handle is NDM_E_NULL again */
    ndm_clear_error();
    assert_int_equal(ndm_item(loss, &v), NDM_E_NULL);
    assert_error_has("null array handle");
    assert_ok(ndm_grad_end());
    assert_ok(ndm_manager_close(model));
}

static void test_nn_list_contracts(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_clear_error();
    assert_int_equal(ndm_zero_grad(1, NULL), NDM_E_INVALID);
    assert_error_has("params is NULL");
    assert_ok(ndm_zero_grad(0, NULL));
    /* an empty sequential is the identity (no copy from a NULL list) */
    ndm_module empty = ndm_sequential(model, 0, NULL);
    assert_true(empty.id != 0);
    ndm_array x = ndm_ones(model, NDM_F32, NDM_SHAPE(2));
    ndm_array y = ndm_forward(empty, x);
    assert_live(y);
    assert_true(y.id != x.id);
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(x));
    /* the null module is NDM_E_NULL, a stale one NDM_E_CLOSED */
    ndm_clear_error();
    assert_null(ndm_predictor_new(model, (ndm_module){0}).id);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_int_equal(ndm_manager_caps(model), 0);
    assert_ok(ndm_manager_close(model));
}

/* nn.h: a sequential's modules and a predictor's parameters belong to the
 * model; the predictor caps that model and no other. */
static void test_nn_modules_belong_to_model(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager other = ndm_manager_new(ROOT(state), "other");
    ndm_rng rng = ndm_rng_new(5);
    ndm_module mine = ndm_linear(model, 4, 4, true, &rng);
    ndm_module theirs = ndm_linear(other, 4, 4, true, &rng);
    ndm_module relu_there = ndm_relu_module(other);
    ndm_clear_error();
    assert_null(ndm_sequential(model, NDM_MODULES(mine, theirs)).id);
    assert_int_equal(ndm_last_status(), NDM_E_NOT_OWNER);
    assert_error_has("system/test/other");
    ndm_clear_error();
    assert_null(ndm_sequential(model, NDM_MODULES(mine, relu_there)).id);
    assert_int_equal(ndm_last_status(), NDM_E_NOT_OWNER);
    /* a net registered with model but whose parameters live elsewhere */
    ndm_manager sub = ndm_manager_new(model, "sub");
    ndm_module deep = ndm_linear(sub, 4, 4, false, &rng);
    ndm_clear_error();
    assert_null(ndm_predictor_new(model, theirs).id);
    assert_int_equal(ndm_last_status(), NDM_E_NOT_OWNER);
    assert_null(ndm_predictor_new(model, deep).id);
    assert_int_equal(ndm_last_status(), NDM_E_NOT_OWNER);
    assert_int_equal(ndm_manager_caps(model), 0);
    assert_int_equal(ndm_manager_caps(sub), 0);
    assert_int_equal(ndm_manager_caps(other), 0);
    /* the model's own net is accepted */
    ndm_module net = ndm_sequential(model, NDM_MODULES(mine, ndm_relu_module(model)));
    assert_true(net.id != 0);
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id != 0);
    assert_true(ndm_manager_caps(model) != 0);
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(model));
}

/* relu(x @ w^T + b) by the public operations, in a scope; the result moves out. */
static ndm_array composed_layer(ndm_manager out, ndm_array x, ndm_array w, ndm_array b, bool relu)
{
    ndm_manager s = ndm_scope_begin(out, "composed");
    ndm_array y = ndm_matmul(x, ndm_permute(w, 0, NULL));
    if (b.id)
        y = ndm_add(y, b);
    if (relu)
        y = ndm_relu(y);
    assert_ok(ndm_scope_end(s, 1, &y));
    return y;
}

/* Out of training, a linear layer and the relu after it run as one
 * operation: the same bits as matmul, add and relu in turn, one array per
 * layer and no temporaries; batches of the small path and beyond it, and an
 * input of rank 3 (the composed path). */
static void test_nn_linear_relu_fused_matches_composed(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(11);
    ndm_module l0 = ndm_linear(model, 37, 33, true, &rng), l1 = ndm_linear(model, 33, 9, true, &rng);
    ndm_module l2 = ndm_linear(model, 9, 7, false, &rng);
    ndm_module net = ndm_sequential(model, NDM_MODULES(l0, ndm_relu_module(model), l1,
                                                       ndm_relu_module(model), l2));
    assert_true(net.id != 0);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    static const int64_t rows[] = {1, 3, 6, 0};
    for (size_t t = 0; t < sizeof rows / sizeof rows[0]; t++) {
        /* rows 0: a (2, 2, 37) input, which the fused kernel does not take */
        ndm_array x = rows[t] ? ndm_normal(batch, &rng, NDM_F32, 0.0, 1.0, NDM_SHAPE(rows[t], 37))
                              : ndm_normal(batch, &rng, NDM_F32, 0.0, 1.0, NDM_SHAPE(2, 2, 37));
        assert_live(x);
        ndm_stats before, after;
        assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &before));
        ndm_no_grad_begin();
        ndm_array y = ndm_forward(net, x);
        ndm_no_grad_end();
        assert_live(y);
        assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &after));
        if (rows[t])
            assert_int_equal(after.created - before.created, 3);
        ndm_array h = composed_layer(batch, x, param(l0, 0), param(l0, 1), true);
        ndm_array h2 = composed_layer(batch, h, param(l1, 0), param(l1, 1), true);
        ndm_array want = composed_layer(batch, h2, param(l2, 0), NDM_NULL_ARRAY, false);
        assert_live(want);
        assert_int_equal(ndm_array_nbytes(y), ndm_array_nbytes(want));
        assert_memory_equal(ndm_array_data(y), ndm_array_data(want), ndm_array_nbytes(y));
        assert_ok(ndm_array_release(x));
        assert_ok(ndm_array_release(y));
        assert_ok(ndm_array_release(h));
        assert_ok(ndm_array_release(h2));
        assert_ok(ndm_array_release(want));
        assert_manager_empty(batch);
    }
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* A request runs inside the caller's scope: the answer follows the output
 * rule into it, the scope stays the innermost one afterwards, and a request
 * that fails (an input of the wrong width) returns null with the layer's
 * error and leaves nothing in the predictor or the caller's scope. */
/* ---- scaled dot-product attention ---------------------------------------------------- */

/* q, k, v of [1, 2, 3|4, 4|2] filled as the expectations' numpy script
 * fills them: q = sin(0.3 i), k = cos(0.7 i), v = 0.1 i - 1 (i the flat index). */
static ndm_array attn_input(ndm_manager m, int which, int64_t l, int64_t e)
{
    double v[64];
    for (int64_t i = 0; i < 2 * l * e; i++)
        v[i] = which == 0 ? sin(0.3 * (double)i) : which == 1 ? cos(0.7 * (double)i) : 0.1 * (double)i - 1;
    return ndm_from_buffer(m, NDM_F64, v, NDM_SHAPE(1, 2, l, e));
}

static void test_nn_sdpa_masks_match_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array q = attn_input(m, 0, 3, 4), k = attn_input(m, 1, 4, 4), v = attn_input(m, 2, 4, 2);
    ndm_array pad = ndm_from_buffer(m, NDM_BOOL, ((uint8_t[]){1, 1, 1, 0}), NDM_SHAPE(4));
    ndm_array fm = ndm_from_buffer(m, NDM_F64, ((double[]){0, -1, 0.5, 0, 0, 0, 0, -2, 1, 0, 0, 0}),
                                   NDM_SHAPE(3, 4));
    /* softmax(q k^T scale + mask) v in numpy, float64 */
    static const struct {
        int mask; /* 0 none, 1 padding (bool), 2 additive */
        bool causal;
        double scale, want[12];
    } cases[] = {
        {0, false, 0, {-0.71347584556722188, -0.6134758455672219, -0.73272832623356443,
                       -0.63272832623356445, -0.74532737077022426, -0.6453273707702244,
                       0.13174680815898582, 0.2317468081589858, 0.11248550206890456,
                       0.21248550206890457, 0.067609331589899208, 0.16760933158989916}},
        {0, true, 0, {-1, -0.90000000000000002, -0.97105825812730151, -0.87105825812730164,
                      -0.80311210561408741, -0.70311210561408743, -0.19999999999999996,
                      -0.099999999999999978, -0.027005567865977291, 0.072994432134022791,
                      0.010735396913408846, 0.11073539691340878}},
        {1, false, 0, {-0.76614636625169774, -0.66614636625169776, -0.74671079705244592,
                       -0.64671079705244594, -0.80311210561408741, -0.70311210561408743,
                       0.006603077086538716, 0.10660307708653878, 0.017848568613840543,
                       0.11784856861384059, 0.010735396913408846, 0.11073539691340878}},
        {2, false, 0, {-0.67727962840126732, -0.57727962840126723, -0.74475010409692932,
                       -0.64475010409692946, -0.84496322166708338, -0.7449632216670834,
                       0.19881924656192163, 0.2988192465619216, 0.034146021303129798,
                       0.13414602130312983, -0.02907270493931495, 0.070927295060684986}},
        {1, true, 0, {-1, -0.90000000000000002, -0.97105825812730151, -0.87105825812730164,
                      -0.80311210561408741, -0.70311210561408743, -0.19999999999999996,
                      -0.099999999999999978, -0.027005567865977291, 0.072994432134022791,
                      0.010735396913408846, 0.11073539691340878}},
        {0, false, 0.25, {-0.70982737275685848, -0.60982737275685839, -0.73278494257951632,
                          -0.63278494257951623, -0.72306835569467642, -0.62306835569467633,
                          0.1272488473871802, 0.22724884738718015, 0.11582590596037282,
                          0.21582590596037277, 0.082149094244618234, 0.18214909424461817}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        uint64_t live = test_live_arrays(m);
        ndm_array mask = cases[c].mask == 1 ? pad : cases[c].mask == 2 ? fm : NDM_NULL_ARRAY;
        ndm_array y = ndm_sdpa(q, k, v, mask, cases[c].causal, cases[c].scale);
        assert_live(y);
        assert_int_equal(test_live_arrays(m), live + 1); /* its parts are gone */
        int64_t sh[4];
        assert_int_equal(ndm_array_shape(y, sh, 4), 4);
        assert_true(sh[0] == 1 && sh[1] == 2 && sh[2] == 3 && sh[3] == 2);
        double got[12];
        assert_ok(ndm_array_copy_out(y, got, sizeof got));
        for (int i = 0; i < 12; i++)
            if (fabs(got[i] - cases[c].want[i]) > 1e-12)
                fail_msg("case %zu, element %d: %.17g, expected %.17g", c, i, got[i],
                         cases[c].want[i]);
        assert_ok(ndm_array_release(y));
    }
    /* a query that sees no key gives NaN, as the composed softmax does */
    ndm_array none = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(4));
    ndm_array yn = ndm_sdpa(q, k, v, none, false, 0);
    double g0[12];
    assert_ok(ndm_array_copy_out(yn, g0, sizeof g0));
    for (int i = 0; i < 12; i++)
        assert_true(isnan(g0[i]));
    /* refusals, nothing made */
    uint64_t live = test_live_arrays(m);
    ndm_array q32 = ndm_astype(q, NDM_F32), k5 = ndm_zeros(m, NDM_F64, NDM_SHAPE(1, 2, 4, 5));
    ndm_array mi = ndm_zeros(m, NDM_I32, NDM_SHAPE(4)), m5 = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(5));
    live += 4;
    assert_true(ndm_array_is_null(ndm_sdpa(q32, k, v, NDM_NULL_ARRAY, false, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_sdpa(q, k, v, mi, false, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_sdpa(q, k5, v, NDM_NULL_ARRAY, true, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("ndm_sdpa");
    assert_true(ndm_array_is_null(ndm_sdpa(q, k, v, m5, false, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_array_is_null(ndm_sdpa(q, k, v, NDM_NULL_ARRAY, false, NAN)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_array gone = ndm_zeros(m, NDM_BOOL, NDM_SHAPE(4));
    assert_ok(ndm_array_release(gone));
    assert_true(ndm_array_is_null(ndm_sdpa(q, k, v, gone, false, 0)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_true(ndm_array_is_null(ndm_rms_norm(q, gone, 1e-6)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(m), live);
    ndm_array arr[] = {q, k, v, pad, fm, none, yn, q32, k5, mi, m5};
    for (size_t i = 0; i < sizeof arr / sizeof *arr; i++)
        assert_ok(ndm_array_release(arr[i]));
    ndm_clear_error();
}

/* MultiheadAttention against the same arithmetic written out here in
 * double: y = out_proj(concat over heads of softmax(q k^T / sqrt(d)
 * [causal]) v), q, k, v = x in_proj_weight^T + in_proj_bias split in three;
 * its state under PyTorch's names, its gradients reach every parameter. */
static void test_nn_multihead_attention_matches_its_definition(void **state)
{
    enum { B = 2, T = 3, E = 4, H = 2, D = E / H };
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(11);
    ndm_module mha = ndm_multihead_attention(model, E, H, true, true, &rng);
    assert_live(mha);
    char desc[64];
    ndm_module_describe(mha, desc, sizeof desc);
    assert_string_equal(desc, "MultiheadAttention(4, 2, causal)");
    const char *names[8];
    ndm_array ps[8];
    assert_int_equal(ndm_module_named_parameters(mha, names, ps, 8), 4);
    float w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E];
    float *dst[4] = {w_in, b_in, w_out, b_out};
    static const char *const want[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                        "out_proj.bias"};
    static const size_t sizes[4] = {sizeof w_in, sizeof b_in, sizeof w_out, sizeof b_out};
    ndm_rng fill = ndm_rng_new(3);
    for (int k = 0; k < 4; k++) {
        int found = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(names[i], want[k]))
                found = i;
        if (found < 0)
            fail_msg("no parameter named %s", want[k]);
        if (k % 2) /* the biases start at zero: give them values */
            assert_ok(ndm_uniform_(ps[found], &fill, -0.5, 0.5));
        assert_ok(ndm_array_copy_out(ps[found], dst[k], sizes[k]));
    }
    float xv[B * T * E];
    for (int i = 0; i < B * T * E; i++)
        xv[i] = (float)sin(0.37 * i);
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array x = ndm_from_buffer(batch, NDM_F32, xv, NDM_SHAPE(B, T, E));
    assert_ok(ndm_grad_begin(batch));
    ndm_array y = ndm_forward(mha, x);
    assert_live(y);
    float got[B * T * E];
    assert_ok(ndm_array_copy_out(y, got, sizeof got));
    for (int b = 0; b < B; b++) {
        double qkv[T][3 * E], heads[T][E];
        for (int t = 0; t < T; t++)
            for (int o = 0; o < 3 * E; o++) {
                double acc = b_in[o];
                for (int i = 0; i < E; i++)
                    acc += (double)xv[(b * T + t) * E + i] * w_in[o * E + i];
                qkv[t][o] = acc;
            }
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double sc[T], mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) { /* causal: keys up to t */
                    double dot = 0;
                    for (int j = 0; j < D; j++)
                        dot += qkv[t][h * D + j] * qkv[u][E + h * D + j];
                    sc[u] = dot / sqrt((double)D);
                    mx = sc[u] > mx ? sc[u] : mx;
                }
                for (int u = 0; u <= t; u++)
                    sum += sc[u] = exp(sc[u] - mx);
                for (int j = 0; j < D; j++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += sc[u] / sum * qkv[u][2 * E + h * D + j];
                    heads[t][h * D + j] = acc;
                }
            }
        for (int t = 0; t < T; t++)
            for (int o = 0; o < E; o++) {
                double acc = b_out[o];
                for (int i = 0; i < E; i++)
                    acc += heads[t][i] * w_out[o * E + i];
                float g = got[(b * T + t) * E + o];
                if (fabs(g - acc) > 1e-5 * (1 + fabs(acc)))
                    fail_msg("y[%d, %d, %d] = %.9g, its definition gives %.9g", b, t, o, g, acc);
            }
    }
    assert_ok(ndm_backward(ndm_sum(ndm_mul(y, y), false, NDM_ALL_AXES_LIST)));
    assert_ok(ndm_grad_end());
    for (int k = 0; k < 4; k++) {
        ndm_array g = ndm_grad(ps[k]);
        assert_live(g);
        assert_int_equal(ndm_array_size(g), ndm_array_size(ps[k]));
        double n2 = 0;
        assert_ok(ndm_item(ndm_sum(ndm_mul(g, g), false, NDM_ALL_AXES_LIST), &n2));
        assert_true(n2 > 0);
    }
    /* refusals */
    assert_true(ndm_multihead_attention(model, 6, 4, true, false, &rng).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_array x2 = ndm_zeros(batch, NDM_F32, NDM_SHAPE(T, E));
    assert_true(ndm_array_is_null(ndm_forward(mha, x2)));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    ndm_clear_error();
    assert_ok(ndm_manager_close(model));
}

/* A request under the caller's manager: its limit covers the forward pass's
 * temporaries, so a request that would not fit fails alone, leaving
 * nothing; one that fits leaves only its answer, in the caller's manager. */
static void test_nn_predict_under_limits_the_request(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(13);
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 16, 256, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 256, 2, true, &rng)));
    ndm_no_grad_end();
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id != 0);
    ndm_manager inputs = ndm_manager_new(ROOT(state), "inputs");
    ndm_array x = ndm_normal(inputs, &rng, NDM_F32, 0.0, 1.0, NDM_SHAPE(64, 16));
    ndm_array want = ndm_predict(p, x);
    assert_live(want);
    /* the hidden layer's 64 x 256 floats (64 KiB) cannot fit under 16 KiB,
     * though the input (4 KiB, outside) and the answer (512 bytes) would */
    ndm_manager req = ndm_manager_new(ROOT(state), "request");
    assert_ok(ndm_manager_set_limit(req, NDM_CPU, 16 << 10));
    assert_true(ndm_predict_under(req, p, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_manager_empty(req);
    ndm_stats st;
    assert_ok(ndm_manager_stats(req, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 0);
    /* the same request under a limit it fits: the predictor's answer */
    assert_ok(ndm_manager_set_limit(req, NDM_CPU, 1 << 20));
    ndm_array y = ndm_predict_under(req, p, x);
    assert_live(y);
    assert_true(ndm_array_manager(y).id == req.id);
    assert_int_equal(test_live_arrays(req), 1);
    assert_ok(ndm_manager_stats(req, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 0);
    assert_int_equal(st.live_bytes, 64 * 2 * 4); /* the answer only */
    float a[128], b[128];
    assert_int_equal(ndm_array_copy_out(want, a, sizeof a), NDM_OK);
    assert_int_equal(ndm_array_copy_out(y, b, sizeof b), NDM_OK);
    assert_memory_equal(a, b, sizeof a);
    /* NDM_OUTPUT_RULE is not a parent; a closed model is NDM_E_CLOSED */
    assert_true(ndm_predict_under(NDM_OUTPUT_RULE, p, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(want));
    assert_ok(ndm_manager_close(model));
    assert_true(ndm_predict_under(req, p, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_manager_empty(req);
    assert_ok(ndm_manager_close(req));
    assert_ok(ndm_array_release(x));
    assert_manager_empty(inputs);
    assert_ok(ndm_manager_close(inputs));
}

static void test_nn_predict_requests_leave_only_answers(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(12);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_flatten_module(model, 1),
                                                       ndm_linear(model, 12, 8, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 8, 3, true, &rng)));
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id != 0);
    ndm_manager caller = ndm_manager_new(ROOT(state), "caller");
    ndm_array x = ndm_normal(caller, &rng, NDM_F32, 0.0, 1.0, NDM_SHAPE(2, 3, 4));
    ndm_array bad = ndm_normal(caller, &rng, NDM_F32, 0.0, 1.0, NDM_SHAPE(1, 11));
    ndm_manager s = ndm_scope_begin(caller, "serving");
    ndm_array y = ndm_predict(p, x);
    assert_live(y);
    assert_true(ndm_array_manager(y).id == s.id);
    assert_true(ndm_scope_current().id == s.id);
    int64_t shape[2];
    assert_int_equal(ndm_array_ndim(y), 2);
    assert_int_equal(ndm_array_shape(y, shape, 2), 2);
    assert_true(shape[0] == 2 && shape[1] == 3);
    assert_true(ndm_predict(p, bad).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_true(ndm_scope_current().id == s.id);
    assert_int_equal(test_live_arrays(s), 1);
    ndm_stats ps;
    assert_ok(ndm_manager_stats(ndm_predictor_manager(p), NDM_CPU, NDM_STATS_SUBTREE, &ps));
    assert_int_equal(ps.children, 1); /* this thread's request manager, parked, empty */
    assert_int_equal(ps.live_arrays, 0);
    assert_int_equal(ps.live_bytes, 0);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_array_release(x));
        assert_ok(ndm_array_release(bad));
    assert_manager_empty(caller);
    assert_ok(ndm_manager_close(caller));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_nn_linear_forward_and_names),
        TEST(test_nn_linear_refuses_integer_input),
        TEST(test_nn_messages_name_the_function_called),
        TEST(test_nn_init_bounds),
        TEST(test_nn_optimizer_updates),
        TEST(test_nn_optimizer_step_same_bits),
        TEST(test_nn_schedules),
        TEST(test_nn_dropout_and_flatten),
        TEST(test_nn_layers_take_inputs_of_any_rank),
        TEST(test_nn_training_converges),
        TEST(test_nn_predictor_threads),
        TEST(test_nn_predictor_parks_request_managers),
        TEST(test_nn_object_lookups_race_churn),
        TEST(test_nn_embedding_and_loss_errors),
        TEST(test_nn_loss_labels_outside_classes_are_refused),
        TEST(test_nn_loss_ignored_labels_match_pytorch),
        TEST(test_nn_loss_ignore_index_refuses_other_bad_labels),
        TEST(test_nn_null_result_keeps_first_error),
        TEST(test_nn_list_contracts),
        TEST(test_nn_modules_belong_to_model),
        TEST(test_nn_linear_relu_fused_matches_composed),
        TEST(test_nn_sdpa_masks_match_numpy),
        TEST(test_nn_multihead_attention_matches_its_definition),
        TEST(test_nn_predict_requests_leave_only_answers),
        TEST(test_nn_predict_under_limits_the_request),
    };
    return cmocka_run_group_tests_name("nn", tests, NULL, NULL);
}
