/* Checkpoints: PyTorch's state_dicts (saved with safetensors) load into the
 * same architecture built with ndm and compute what PyTorch computed; module
 * and optimizer state round-trip so that a resumed run matches an unbroken
 * one; mismatches are refused with every manager intact. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "helpers.h"

#ifndef NDM_TEST_DATA
#error "NDM_TEST_DATA (the tests/data folder) must be defined by the build"
#endif

static char tmp_path[256];

static const char *tmp_file(const char *name)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/ndm_ckpt_%d_%s", t && *t ? t : "/tmp", (int)getpid(),
             name);
    return tmp_path;
}

/* The elements of a (any float or int dtype) as doubles; the caller frees. */
static double *values_of(ndm_array a, int64_t *n)
{
    ndm_manager s = ndm_scope_begin(ndm_array_manager(a), "values");
    ndm_array d = ndm_astype(ndm_contiguous(a), NDM_F64);
    assert_live(d);
    *n = ndm_array_size(d);
    double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    assert_ok(ndm_array_copy_out(d, v, (size_t)*n * sizeof *v));
    assert_ok(ndm_scope_end(s, 0, NULL));
    return v;
}

/* a and b agree elementwise within atol + rtol |b|. */
static void assert_close(ndm_array a, ndm_array b, double atol, double rtol, const char *what)
{
    int64_t na, nb;
    double *va = values_of(a, &na), *vb = values_of(b, &nb);
    assert_int_equal(na, nb);
    for (int64_t i = 0; i < na; i++) {
        if (!(fabs(va[i] - vb[i]) <= atol + rtol * fabs(vb[i])))
            fail_msg("%s: element %lld is %.9g, PyTorch's %.9g", what, (long long)i, va[i],
                     vb[i]);
    }
    free(va);
    free(vb);
}

static ndm_array ref(const ndm_named_arrays *set, const char *name)
{
    int64_t i = ndm_named_arrays_find(set, name);
    if (i < 0)
        fail_msg("the reference file lacks '%s'", name);
    return set->arrays[i];
}

/* PyTorch's Sequential(Linear(4, 16), BatchNorm1d(16), ReLU, Linear(16, 8),
 * LayerNorm(8), ReLU, Linear(8, 3)), freshly initialised from `seed`. */
static ndm_module mlp(ndm_manager model, uint64_t seed)
{
    ndm_rng rng = ndm_rng_new(seed);
    return ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 16, true, &rng),
                                             ndm_batch_norm1d(model, 16, 1e-5, 0.1, true),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 16, 8, true, &rng),
                                             ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(8)),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 8, 3, true, &rng)));
}

static void test_checkpoint_torch_mlp_matches_pytorch(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 7);
    assert_live(net);
    assert_int_equal(ndm_module_load(net, NDM_TEST_DATA "/torch_mlp.safetensors",
                                     NDM_CHECKPOINT_STRICT),
                     13);
    assert_ok(ndm_module_set_training(net, false));
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const ndm_named_arrays *r =
        ndm_safetensors_load(data, NDM_TEST_DATA "/torch_mlp_ref.safetensors", NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_array logits = ndm_forward(net, ref(r, "x"));
    assert_live(logits);
    assert_close(logits, ref(r, "logits"), 1e-5, 1e-4, "eval logits");
    /* the same accuracy as PyTorch's */
    ndm_array hit = ndm_eq(ndm_argmax(logits, 1, false), ref(r, "labels"));
    double acc;
    assert_ok(ndm_item(ndm_mean(ndm_astype(hit, NDM_F64), false, NDM_ALL_AXES_LIST), &acc));
    double torch_acc = atof(ndm_named_arrays_meta(r, "accuracy"));
    assert_true(torch_acc > 0.5);
    assert_true(fabs(acc - torch_acc) < 1e-6);
    print_message("PyTorch accuracy %.4f, ndm %.4f on the same 64 samples\n", torch_acc, acc);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_torch_training_pass_matches(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 7);
    assert_int_equal(ndm_module_load(net, NDM_TEST_DATA "/torch_mlp.safetensors",
                                     NDM_CHECKPOINT_STRICT),
                     13);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const ndm_named_arrays *r =
        ndm_safetensors_load(data, NDM_TEST_DATA "/torch_mlp_ref.safetensors", NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array x = ndm_slice_to(batch, ref(r, "x"), 0, 0, 16, 1);
    assert_ok(ndm_grad_begin(batch));
    ndm_array out = ndm_forward(net, x);
    ndm_array w = ndm_reshape(ndm_linspace(batch, NDM_F32, -1, 1, 48), NDM_SHAPE(16, 3));
    assert_ok(ndm_backward(ndm_sum(ndm_mul(out, w), false, NDM_ALL_AXES_LIST)));
    assert_ok(ndm_grad_end());
    assert_close(out, ref(r, "train.out"), 1e-5, 1e-4, "training-mode output");
    const char *names[32];
    ndm_array arrays[32];
    int n = ndm_module_named_state(net, names, arrays, 32);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        char key[96];
        if (strstr(names[i], "running")) {
            snprintf(key, sizeof key, "train.%s", names[i]);
            assert_close(arrays[i], ref(r, key), 1e-6, 1e-5, key);
            checked++;
        } else if (ndm_array_requires_grad(arrays[i])) {
            snprintf(key, sizeof key, "grad.%s", names[i]);
            assert_close(ndm_grad_to(batch, arrays[i]), ref(r, key), 1e-5, 1e-3, key);
            checked++;
        }
    }
    assert_int_equal(checked, 12); /* 10 gradients, 2 running statistics */
    int64_t batches;
    assert_ok(ndm_item_i64(arrays[6], &batches));
    assert_string_equal(names[6], "1.num_batches_tracked");
    assert_int_equal(batches, 60 + 1); /* PyTorch's 60 training steps, then this pass */
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_torch_batch_norm2d_matches(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_conv2d_module(model, 2, 3, 3, 3, true, &rng, NULL),
                           ndm_batch_norm2d(model, 3, 1e-5, 0.1, true), ndm_relu_module(model),
                           ndm_flatten_module(model, 1), ndm_linear(model, 48, 2, true, &rng)));
    assert_live(net);
    assert_int_equal(ndm_module_load(net, NDM_TEST_DATA "/torch_cnn.safetensors",
                                     NDM_CHECKPOINT_STRICT),
                     9);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const ndm_named_arrays *r =
        ndm_safetensors_load(data, NDM_TEST_DATA "/torch_cnn_ref.safetensors", NDM_LOAD_COPY);
    assert_non_null(r);
    assert_ok(ndm_module_set_training(net, false));
    assert_close(ndm_forward(net, ref(r, "x")), ref(r, "eval"), 1e-5, 1e-4, "eval output");
    assert_ok(ndm_module_set_training(net, true));
    assert_close(ndm_forward(net, ref(r, "x")), ref(r, "train.out"), 1e-5, 1e-4,
                 "training output");
    const char *names[16];
    ndm_array arrays[16];
    int n = ndm_module_named_state(net, names, arrays, 16);
    assert_int_equal(n, 9);
    assert_string_equal(names[4], "1.running_mean");
    assert_close(arrays[4], ref(r, "train.1.running_mean"), 1e-6, 1e-5, "running_mean");
    assert_close(arrays[5], ref(r, "train.1.running_var"), 1e-6, 1e-5, "running_var");
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_save_load_round_trip(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a"), b = ndm_manager_new(ROOT(state), "b");
    ndm_module na = mlp(a, 1), nb = mlp(b, 2);
    ndm_array x = ndm_normal(ROOT(state), &(ndm_rng){0}, NDM_F32, 0, 1, NDM_SHAPE(5, 4));
    /* move a's running statistics away from their start */
    assert_ok(ndm_array_release(ndm_forward(na, x)));
    assert_ok(ndm_module_set_training(na, false));
    assert_ok(ndm_module_set_training(nb, false));
    const char *path = tmp_file("mlp.safetensors");
    assert_ok(ndm_module_save(na, path));
    ndm_manager f = ndm_manager_new(ROOT(state), "file");
    const ndm_named_arrays *set = ndm_safetensors_load(f, path, NDM_LOAD_COPY);
    assert_non_null(set);
    assert_int_equal(set->count, 13);
    assert_string_equal(set->names[0], "0.weight");
    assert_string_equal(set->names[4], "1.running_mean");
    assert_string_equal(set->names[5], "1.running_var");
    assert_string_equal(set->names[6], "1.num_batches_tracked");
    assert_int_equal(ndm_array_dtype(set->arrays[6]), NDM_I64);
    assert_int_equal(ndm_array_ndim(set->arrays[6]), 0);
    assert_string_equal(set->names[12], "6.bias");
    assert_ok(ndm_manager_close(f));
    assert_int_equal(ndm_module_load(nb, path, NDM_CHECKPOINT_STRICT), 13);
    ndm_manager cmp = ndm_scope_begin(ROOT(state), "compare");
    assert_close(ndm_forward(nb, x), ndm_forward(na, x), 0, 0, "reloaded output");
    assert_ok(ndm_scope_end(cmp, 0, NULL));
    unlink(path);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
    assert_ok(ndm_array_release(x));
}

static void test_checkpoint_mismatch_is_refused(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(5);
    /* another head: 3 -> 4 outputs, and no LayerNorm */
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_linear(model, 4, 16, true, &rng),
                           ndm_batch_norm1d(model, 16, 1e-5, 0.1, true), ndm_relu_module(model),
                           ndm_linear(model, 16, 4, true, &rng)));
    const char *path = NDM_TEST_DATA "/torch_mlp.safetensors";
    ndm_array params[8];
    assert_int_equal(ndm_module_parameters(net, params, 8), 6);
    int64_t n;
    double *w0 = values_of(params[0], &n);
    /* mis-shaped: refused in either mode, naming both shapes */
    for (unsigned mode = 0; mode < 2; mode++) {
        assert_int_equal(ndm_module_load(net, path, mode), NDM_E_SHAPE);
        assert_error_has("'3.weight' is (8, 16) in the file, (4, 16) in the module");
        assert_error_has("'3.bias' is (8) in the file, (4) in the module");
    }
    /* nothing was written */
    double *w1 = values_of(params[0], &n);
    assert_memory_equal(w0, w1, (size_t)n * sizeof *w0);
    free(w1);
    ndm_module small = ndm_sequential(
        model, NDM_MODULES(ndm_linear(model, 4, 16, true, &rng),
                           ndm_batch_norm1d(model, 16, 1e-5, 0.1, true), ndm_relu_module(model),
                           ndm_linear(model, 16, 8, true, &rng),
                           ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(8)),
                           ndm_relu_module(model),
                           ndm_linear(model, 8, 3, true, &rng),
                           ndm_linear(model, 3, 2, true, &rng)));
    assert_int_equal(ndm_module_load(small, path, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("2 missing ('7.weight', '7.bias'); 0 unexpected");
    ndm_module big = mlp(model, 9);
    ndm_module part = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 16, true, &rng)));
    assert_int_equal(ndm_module_load(part, path, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("0 missing; 11 unexpected (");
    assert_error_has("'1.running_var'");
    /* lenient: what matches is loaded */
    assert_int_equal(ndm_module_load(small, path, NDM_CHECKPOINT_LENIENT), 13);
    assert_int_equal(ndm_module_load(part, path, NDM_CHECKPOINT_LENIENT), 2);
    assert_int_equal(ndm_module_load(big, "/nonexistent/x.safetensors", 0), NDM_E_IO);
    assert_int_equal(ndm_module_load(big, path, 7), NDM_E_INVALID);
    free(w0);
    /* the temporary checkpoint managers are gone */
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_system(), NDM_CPU, 0, &st));
    assert_int_equal(st.children, 2); /* detached and the test's */
    assert_ok(ndm_manager_close(model));
}

/* ---- optimizer state: resumed runs ---------------------------------------------- */

/* Train net for `steps` on fixed batches from `step0` on; losses into out. */
static void run_steps(ndm_manager root, ndm_module net, ndm_optimizer opt, int step0, int steps,
                      double *out)
{
    for (int s = step0; s < step0 + steps; s++) {
        ndm_manager batch = ndm_manager_new(root, "batch");
        ndm_rng rng = ndm_rng_new(1000 + (uint64_t)s);
        ndm_array x = ndm_normal(batch, &rng, NDM_F32, 0, 1, NDM_SHAPE(16, 4));
        ndm_array y = ndm_randint(batch, &rng, NDM_I64, 0, 3, NDM_SHAPE(16));
        assert_ok(ndm_grad_begin(batch));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        assert_ok(ndm_backward(loss));
        assert_ok(ndm_grad_end());
        assert_ok(ndm_item(loss, &out[s - step0]));
        assert_ok(ndm_optimizer_step(opt));
        assert_ok(ndm_optimizer_zero_grad(opt));
        assert_ok(ndm_manager_close(batch));
    }
}

static ndm_optimizer make_opt(ndm_manager model, ndm_module net, int kind)
{
    return kind == 0   ? ndm_sgd(model, net, 0.05, 0.9, 1e-4)
           : kind == 1 ? ndm_adam(model, net, 1e-2, 0.9, 0.999, 1e-8, 0.0)
                       : ndm_adamw(model, net, 1e-2, 0.9, 0.999, 1e-8, 0.01);
}

static void test_checkpoint_resumed_run_matches_unbroken(void **state)
{
    for (int kind = 0; kind < 3; kind++) {
        double unbroken[8], first[4], resumed[4];
        ndm_manager m1 = ndm_manager_new(ROOT(state), "unbroken");
        ndm_module n1 = mlp(m1, 11);
        ndm_optimizer o1 = make_opt(m1, n1, kind);
        assert_ok(ndm_manager_cap(m1, NDM_CAP_ARRAYS));
        run_steps(ROOT(state), n1, o1, 0, 8, unbroken);
        assert_ok(ndm_manager_close(m1));

        ndm_manager m2 = ndm_manager_new(ROOT(state), "first");
        ndm_module n2 = mlp(m2, 11);
        ndm_optimizer o2 = make_opt(m2, n2, kind);
        run_steps(ROOT(state), n2, o2, 0, 4, first);
        char mpath[256], opath[256];
        snprintf(mpath, sizeof mpath, "%s", tmp_file("resume_model.safetensors"));
        snprintf(opath, sizeof opath, "%s", tmp_file("resume_optim.safetensors"));
        assert_ok(ndm_module_save(n2, mpath));
        assert_ok(ndm_optimizer_save(o2, opath));
        assert_ok(ndm_manager_close(m2));

        /* a fresh process's view: another initialisation, then the checkpoint */
        ndm_manager m3 = ndm_manager_new(ROOT(state), "resumed");
        ndm_module n3 = mlp(m3, 99);
        ndm_optimizer o3 = make_opt(m3, n3, kind);
        assert_ok(ndm_manager_cap(m3, NDM_CAP_ARRAYS));
        assert_int_equal(ndm_module_load(n3, mpath, NDM_CHECKPOINT_STRICT), 13);
        assert_ok(ndm_optimizer_load(o3, opath));
        run_steps(ROOT(state), n3, o3, 4, 4, resumed);
        for (int i = 0; i < 4; i++) {
            assert_true(first[i] == unbroken[i]);
            if (resumed[i] != unbroken[4 + i])
                fail_msg("optimizer %d, step %d: resumed loss %.9g, unbroken %.9g", kind,
                         4 + i, resumed[i], unbroken[4 + i]);
        }
        /* the state matters: without it the run differs (momentum, moments, step) */
        ndm_manager m4 = ndm_manager_new(ROOT(state), "no-state");
        ndm_module n4 = mlp(m4, 99);
        ndm_optimizer o4 = make_opt(m4, n4, kind);
        assert_int_equal(ndm_module_load(n4, mpath, NDM_CHECKPOINT_STRICT), 13);
        run_steps(ROOT(state), n4, o4, 4, 4, resumed);
        assert_true(resumed[0] == unbroken[4]); /* same weights: the first loss agrees */
        assert_true(resumed[3] != unbroken[7]);
        assert_ok(ndm_manager_close(m4));
        unlink(mpath);
        unlink(opath);
        assert_ok(ndm_manager_close(m3));
    }
}

static void test_checkpoint_optimizer_state_mismatch_is_refused(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 1);
    ndm_optimizer sgd = ndm_sgd(model, net, 0.1, 0.9, 0);
    ndm_optimizer adam = ndm_adam(model, net, 1e-3, 0.9, 0.999, 1e-8, 0);
    const char *path = tmp_file("sgd.safetensors");
    assert_ok(ndm_optimizer_save(sgd, path));
    assert_status(ndm_optimizer_load(adam, path), NDM_E_INVALID);
    assert_error_has("the state of sgd over 10 parameters, not of adam over 10");
    assert_true(ndm_optimizer_lr(adam) == 1e-3);
    assert_status(ndm_optimizer_load(sgd, NDM_TEST_DATA "/torch_mlp.safetensors"),
                  NDM_E_FORMAT);
    assert_error_has("is not an optimizer state");
    unlink(path);
    assert_ok(ndm_manager_close(model));
}

/* `to`: the safetensors file `from` with its metadata `key` set to `value`. */
static void rewrite_meta(ndm_manager root, const char *from, const char *to, const char *key,
                         const char *value)
{
    ndm_manager m = ndm_manager_new(root, "rewrite");
    const ndm_named_arrays *set = ndm_safetensors_load(m, from, NDM_LOAD_COPY);
    assert_non_null(set);
    const char *keys[8], *values[8];
    assert_true(set->meta_count <= 8);
    for (size_t i = 0; i < set->meta_count; i++) {
        keys[i] = set->meta_keys[i];
        values[i] = strcmp(keys[i], key) ? set->meta_values[i] : value;
    }
    ndm_named_arrays out = {set->count, set->names, set->arrays, set->meta_count, keys, values};
    assert_ok(ndm_safetensors_save(to, &out));
    assert_ok(ndm_manager_close(m));
}

/* The bytes of a file; the caller frees. */
static char *file_bytes(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    *len = ftell(f);
    rewind(f);
    char *b = malloc((size_t)*len + 1);
    assert_int_equal(fread(b, 1, (size_t)*len, f), (size_t)*len);
    fclose(f);
    return b;
}

static bool same_file(const char *a, const char *b)
{
    long na, nb;
    char *x = file_bytes(a, &na), *y = file_bytes(b, &nb);
    bool same = na == nb && !memcmp(x, y, (size_t)na);
    free(x);
    free(y);
    return same;
}

static void test_checkpoint_optimizer_bad_metadata_is_refused(void **state)
{
    static const struct {
        const char *key, *value;
        ndm_status want;
        const char *says;
    } bad[] = {
        {"lr", "inf", NDM_E_INVALID, "lr metadata must be > 0 and finite"},
        {"lr", "1e999", NDM_E_FORMAT, "lr metadata is not a number"},
        {"lr", "nan", NDM_E_INVALID, "lr metadata must be > 0"},
        {"lr", "-0.01", NDM_E_INVALID, "lr metadata must be > 0"},
        {"lr", "0", NDM_E_INVALID, "lr metadata must be > 0"},
        {"lr", "0.01x", NDM_E_FORMAT, "lr metadata is not a number"},
        {"lr", " 0.01", NDM_E_FORMAT, "lr metadata is not a number"},
        {"lr", "", NDM_E_FORMAT, "lr metadata is not a number"},
        {"step", "9223372036854775807", NDM_E_INVALID, "step metadata 9223372036854775807 is "
                                                       "outside [0, 9007199254740992]"},
        {"step", "9007199254740993", NDM_E_INVALID, "step metadata 9007199254740993 is outside"},
        {"step", "9223372036854775808", NDM_E_FORMAT, "step metadata is not a whole number"},
        {"step", "-1", NDM_E_INVALID, "step metadata -1 is outside"},
        {"step", "2abc", NDM_E_FORMAT, "step metadata is not a whole number"},
        {"step", "2.0", NDM_E_FORMAT, "step metadata is not a whole number"},
        {"params", "10abc", NDM_E_FORMAT, "params metadata is not a whole number"},
        {"params", "4294967306", NDM_E_INVALID, "over 4294967306 parameters, not of adam over 10"},
        {"params", "99999999999999999999", NDM_E_FORMAT, "params metadata is not a whole number"},
        {"params", "", NDM_E_FORMAT, "params metadata is not a whole number"},
    };
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 3);
    ndm_optimizer opt = ndm_adam(model, net, 1e-2, 0.9, 0.999, 1e-8, 0.0);
    double losses[2];
    run_steps(ROOT(state), net, opt, 0, 2, losses);
    char good[256], before[256], after[256], hostile[256];
    snprintf(good, sizeof good, "%s", tmp_file("meta_good.safetensors"));
    snprintf(before, sizeof before, "%s", tmp_file("meta_before.safetensors"));
    snprintf(after, sizeof after, "%s", tmp_file("meta_after.safetensors"));
    snprintf(hostile, sizeof hostile, "%s", tmp_file("meta_hostile.safetensors"));
    assert_ok(ndm_optimizer_save(opt, good));
    /* another state in the optimizer, so that a partial load would show */
    run_steps(ROOT(state), net, opt, 2, 1, losses);
    assert_ok(ndm_optimizer_set_lr(opt, 0.5));
    assert_ok(ndm_optimizer_save(opt, before));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rewrite_meta(ROOT(state), good, hostile, bad[i].key, bad[i].value);
        ndm_status st = ndm_optimizer_load(opt, hostile);
        if (st != bad[i].want || !strstr(ndm_last_error(), bad[i].says))
            fail_msg("%s \"%s\": %s (%s), expected %s with \"%s\"", bad[i].key, bad[i].value,
                     ndm_status_name(st), ndm_last_error(), ndm_status_name(bad[i].want),
                     bad[i].says);
        /* state arrays, step count and learning rate as they were */
        assert_true(ndm_optimizer_lr(opt) == 0.5);
        assert_ok(ndm_optimizer_save(opt, after));
        if (!same_file(before, after))
            fail_msg("%s \"%s\" changed the optimizer", bad[i].key, bad[i].value);
    }
    /* the untouched file still loads */
    assert_ok(ndm_optimizer_load(opt, good));
    assert_true(ndm_optimizer_lr(opt) == 1e-2);
    unlink(good);
    unlink(before);
    unlink(after);
    unlink(hostile);
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_optimizer_step_count_never_overflows(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 4);
    ndm_optimizer opt = ndm_adam(model, net, 1e-2, 0.9, 0.999, 1e-8, 0.0);
    double losses[1];
    run_steps(ROOT(state), net, opt, 0, 1, losses);
    char path[256], last[256], w0[256], w1[256];
    snprintf(path, sizeof path, "%s", tmp_file("steps.safetensors"));
    snprintf(last, sizeof last, "%s", tmp_file("steps_last.safetensors"));
    snprintf(w0, sizeof w0, "%s", tmp_file("steps_w0.safetensors"));
    snprintf(w1, sizeof w1, "%s", tmp_file("steps_w1.safetensors"));
    assert_ok(ndm_optimizer_save(opt, path));
    /* the bound itself loads; the step after it is refused, changing nothing */
    char bound[32];
    snprintf(bound, sizeof bound, "%lld", (long long)NDM_OPTIMIZER_MAX_STEPS);
    rewrite_meta(ROOT(state), path, last, "step", bound);
    assert_ok(ndm_optimizer_load(opt, last));
    assert_ok(ndm_module_save(net, w0));
    assert_status(ndm_optimizer_step(opt), NDM_E_OVERFLOW);
    assert_error_has("9007199254740992 steps, the most it counts");
    assert_status(ndm_optimizer_step(opt), NDM_E_OVERFLOW);
    assert_ok(ndm_module_save(net, w1));
    assert_true(same_file(w0, w1));
    assert_ok(ndm_optimizer_save(opt, path));
    assert_true(same_file(path, last));
    unlink(path);
    unlink(last);
    unlink(w0);
    unlink(w1);
    assert_ok(ndm_manager_close(model));
}

/* ---- optimizers over any parameters; predictors without gradients ---------------- */

static void test_checkpoint_optimizer_over_a_parameter_list(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_full(model, NDM_F32, 2.0, NDM_SHAPE(3));
    ndm_array b = ndm_full(model, NDM_F32, -1.0, NDM_SHAPE(1));
    assert_ok(ndm_requires_grad(w));
    assert_ok(ndm_requires_grad(b));
    ndm_optimizer opt = ndm_sgd_params(model, 2, ((ndm_array[]){w, b}), 0.5, 0.0, 0.0);
    assert_live(opt);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array x = ndm_arange(batch, NDM_F32, 1, 4, 1); /* loss = sum(w * x) + b */
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_add(ndm_sum(ndm_mul(w, x), false, NDM_ALL_AXES_LIST), b);
    assert_ok(ndm_backward(ndm_sum(loss, false, NDM_ALL_AXES_LIST)));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_optimizer_step(opt));
    float wv[3], bv;
    assert_ok(ndm_array_copy_out(w, wv, sizeof wv));
    assert_ok(ndm_array_copy_out(b, &bv, sizeof bv));
    assert_true(wv[0] == 1.5f && wv[1] == 1.0f && wv[2] == 0.5f);
    assert_true(bv == -1.5f);
    assert_ok(ndm_manager_close(batch));
    /* an array without a gradient is refused, naming its place */
    ndm_array plain = ndm_zeros(model, NDM_F32, NDM_SHAPE(2));
    assert_int_equal(ndm_adam_params(model, 2, ((ndm_array[]){w, plain}), 1e-3, 0.9, 0.999,
                                     1e-8, 0)
                         .id,
                     0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("array 1 of the list is not a parameter");
    assert_int_equal(ndm_sgd_params(model, 1, NULL, 0.1, 0, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_optimizer_over_a_high_rank_parameter(void **state)
{
    /* rank 17: above the 16 axes the optimizer once copied shapes into */
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_full(model, NDM_F32, 2.0,
                           NDM_SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2));
    assert_ok(ndm_requires_grad(w));
    ndm_optimizer opt = ndm_sgd_params(model, 1, ((ndm_array[]){w}), 0.5, 0.9, 0.0);
    assert_live(opt);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    assert_ok(ndm_grad_begin(batch));
    assert_ok(ndm_backward(ndm_sum(w, false, NDM_ALL_AXES_LIST)));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_optimizer_step(opt));
    float wv[2];
    assert_ok(ndm_array_copy_out(w, wv, sizeof wv));
    assert_true(wv[0] == 1.5f && wv[1] == 1.5f);
    assert_ok(ndm_manager_close(batch));
    /* its momentum round-trips (shapes compared at any rank) */
    const char *path = tmp_file("rank17.safetensors");
    assert_ok(ndm_optimizer_save(opt, path));
    assert_ok(ndm_optimizer_load(opt, path));
    unlink(path);
    assert_ok(ndm_manager_close(model));
}

static uint64_t live_bytes(ndm_manager m)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    return st.live_bytes;
}

/* The last warning logged, and how many (ndm_set_log_fn). */
static char warned[4096];
static int nwarned;
static void keep_warning(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN) {
        snprintf(warned, sizeof warned, "%s", msg);
        nwarned++;
    }
}

static void test_checkpoint_predictor_holds_weights_once(void **state)
{
    /* the state's bytes: 13 tensors of torch_mlp, 4-byte floats and one i64 */
    const uint64_t weights = 4 * (4 * 16 + 16 + 16 * 4 + 16 * 8 + 8 + 8 * 2 + 8 * 3 + 3) + 8;
    ndm_manager trained = ndm_manager_new(ROOT(state), "trained");
    ndm_module tn = mlp(trained, 1);
    /* built for training: every parameter has a gradient of its size */
    assert_int_equal(live_bytes(trained), weights + (weights - 8 - 4 * 32));

    ndm_manager serving = ndm_manager_new(ROOT(state), "serving");
    ndm_no_grad_begin();
    ndm_module net = mlp(serving, 1);
    ndm_no_grad_end();
    assert_live(net);
    nwarned = 0;
    ndm_set_log_fn(keep_warning, NULL);
    ndm_predictor p = ndm_predictor_load(serving, net, NDM_TEST_DATA "/torch_mlp.safetensors");
    ndm_set_log_fn(NULL, NULL);
    assert_live(p);
    assert_int_equal(nwarned, 0); /* built without gradients: nothing to say */
    assert_int_equal(live_bytes(serving), weights);
    /* a predictor over the net built for training says what its gradients cost */
    ndm_set_log_fn(keep_warning, NULL);
    ndm_predictor tp = ndm_predictor_new(trained, tn);
    ndm_set_log_fn(NULL, NULL);
    assert_live(tp);
    assert_int_equal(nwarned, 1);
    char want[160];
    int np = ndm_module_parameters(tn, NULL, 0);
    snprintf(want, sizeof want, "%d of the net's %d parameters carry gradient arrays (%llu bytes)",
             np, np, (unsigned long long)(weights - 8 - 4 * 32));
    if (!strstr(warned, want) || !strstr(warned, "ndm_no_grad_begin()"))
        fail_msg("the warning lacks \"%s\":\n%s", want, warned);
    ndm_array params[16];
    int n = ndm_module_parameters(net, params, 16);
    for (int i = 0; i < n; i++)
        assert_false(ndm_array_requires_grad(params[i]));
    /* an inference model cannot be trained */
    assert_int_equal(ndm_sgd(trained, net, 0.1, 0, 0).id, 0);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    const ndm_named_arrays *r =
        ndm_safetensors_load(data, NDM_TEST_DATA "/torch_mlp_ref.safetensors", NDM_LOAD_COPY);
    assert_close(ndm_predict(p, ref(r, "x")), ref(r, "logits"), 1e-5, 1e-4, "served logits");
    assert_int_equal(live_bytes(serving), weights); /* the request left nothing */
    /* a bad checkpoint gives no predictor and leaves the model uncapped */
    ndm_manager other = ndm_manager_new(ROOT(state), "other");
    ndm_module small = ndm_sequential(other, NDM_MODULES(ndm_relu_module(other)));
    assert_int_equal(ndm_predictor_load(other, small, NDM_TEST_DATA "/torch_mlp.safetensors").id,
                     0);
    assert_int_equal(ndm_last_status(), NDM_E_FORMAT);
    assert_int_equal(ndm_manager_caps(other), 0);
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(serving));
    assert_ok(ndm_manager_close(trained));
    (void)tn;
}

/* ---- files that are not regular files ------------------------------------------- */

/* A load blocked on a FIFO would hang the suite: the alarm fails it. */
static void blocked_on_open(int sig)
{
    (void)sig;
    static const char msg[] = "a call blocked on a path that is not a regular file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void test_checkpoint_loads_refuse_a_fifo_at_once(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 3);
    ndm_optimizer opt = make_opt(model, net, 1);
    const char *fifo = tmp_file("load.fifo");
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    ndm_array params[16];
    assert_int_equal(ndm_module_parameters(net, params, 16), 10);
    int64_t n;
    double *w0 = values_of(params[0], &n);
    signal(SIGALRM, blocked_on_open);
    alarm(60);
    ndm_clear_error();
    assert_int_equal(ndm_module_load(net, fifo, NDM_CHECKPOINT_STRICT), NDM_E_IO);
    assert_error_has("is a FIFO, not a regular file");
    assert_error_has(fifo);
    ndm_clear_error();
    assert_int_equal(ndm_optimizer_load(opt, fifo), NDM_E_IO);
    assert_error_has("is a FIFO");
    ndm_clear_error();
    assert_int_equal(ndm_predictor_load(model, net, fifo).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has("is a FIFO");
    ndm_clear_error();
    assert_int_equal(ndm_module_load(net, "/dev/null", NDM_CHECKPOINT_LENIENT), NDM_E_IO);
    assert_error_has("'/dev/null' is a character device");
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    /* nothing changed, nothing is capped */
    double *w1 = values_of(params[0], &n);
    assert_memory_equal(w0, w1, (size_t)n * sizeof *w0);
    free(w0);
    free(w1);
    assert_int_equal(ndm_manager_caps(model), 0);
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    unlink(fifo);
    assert_ok(ndm_manager_close(model));
}

static void test_checkpoint_saves_keep_what_is_at_the_path(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = mlp(model, 4);
    ndm_optimizer opt = make_opt(model, net, 0);
    char fifo[256], dev[256];
    snprintf(fifo, sizeof fifo, "%s", tmp_file("save.fifo"));
    snprintf(dev, sizeof dev, "%s", tmp_file("save-full.dev"));
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    struct {
        const char *path, *kind;
        mode_t type;
    } cases[2] = {{fifo, "a FIFO", S_IFIFO}, {dev, "a character device", S_IFCHR}};
    int ncases = 1;
    /* A node with /dev/full's numbers, of our own: the real one is never
     * touched. Making one needs root. */
    unlink(dev);
    if (mknod(dev, S_IFCHR | 0600, makedev(1, 7)) == 0)
        ncases = 2;
    else
        print_message("no device node (%s): the device case is skipped\n", strerror(errno));
    signal(SIGALRM, blocked_on_open);
    alarm(60);
    for (int i = 0; i < ncases; i++) {
        char want[400];
        snprintf(want, sizeof want, "cannot save to '%s': it is %s", cases[i].path,
                 cases[i].kind);
        ndm_clear_error();
        assert_status(ndm_module_save(net, cases[i].path), NDM_E_IO);
        assert_error_has(want);
        ndm_clear_error();
        assert_status(ndm_optimizer_save(opt, cases[i].path), NDM_E_IO);
        assert_error_has(want);
        struct stat st;
        assert_int_equal(lstat(cases[i].path, &st), 0);
        assert_int_equal(st.st_mode & S_IFMT, cases[i].type);
        unlink(cases[i].path);
    }
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    assert_ok(ndm_manager_close(model));
}

/* ---- shapes in messages ----------------------------------------------------------- */

static void test_checkpoint_high_rank_shape_is_named(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(8);
    ndm_module net = ndm_linear(model, 2, 3, true, &rng);
    /* weight (3, 2) in the module, of rank 20 in the file; bias of rank 12 */
    int64_t w[20], b[12];
    for (int i = 0; i < 20; i++)
        w[i] = i < 2 ? 3 - i : 1;
    for (int i = 0; i < 12; i++)
        b[i] = i ? 1 : 3;
    ndm_manager f = ndm_manager_new(ROOT(state), "file");
    ndm_array aw = ndm_zeros(f, NDM_F32, 20, w), ab = ndm_zeros(f, NDM_F32, 12, b);
    assert_live(aw);
    assert_live(ab);
    const char *path = tmp_file("rank20.safetensors");
    ndm_named_arrays set = {2, (const char *[]){"weight", "bias"}, (ndm_array[]){aw, ab}, 0, NULL,
                            NULL};
    assert_ok(ndm_safetensors_save(path, &set));
    assert_ok(ndm_manager_close(f));
    for (unsigned mode = 0; mode < 2; mode++) {
        ndm_clear_error();
        assert_int_equal(ndm_module_load(net, path, mode), NDM_E_SHAPE);
        assert_error_has("'weight' is (3, 2, 1, 1, 1, 1, 1, 1, ...; rank 20) in the file, "
                         "(3, 2) in the module");
        assert_error_has("'bias' is (3, 1, 1, 1, 1, 1, 1, 1, ...; rank 12) in the file, (3) in "
                         "the module");
    }
    /* the weights are as they were: the module still loads its own file */
    const char *own = tmp_file("linear.safetensors");
    char keep[256];
    snprintf(keep, sizeof keep, "%s", path);
    assert_ok(ndm_module_save(net, own));
    assert_int_equal(ndm_module_load(net, own, NDM_CHECKPOINT_STRICT), 2);
    unlink(own);
    unlink(keep);
    assert_ok(ndm_manager_close(model));
}

/* What a lenient load leaves unmatched is said, every name of it; a file
 * of which nothing matches (PyTorch's "fc1.weight" for ndm's "0.weight") is
 * refused, and the module keeps its values. */
static void test_checkpoint_lenient_load_says_what_it_skipped(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(9);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 2, 3, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 3, 1, true, &rng)));
    ndm_manager f = ndm_manager_new(ROOT(state), "file");
    ndm_array w1 = ndm_ones(f, NDM_F32, NDM_SHAPE(3, 2)), b1 = ndm_ones(f, NDM_F32, NDM_SHAPE(3));
    ndm_array w2 = ndm_ones(f, NDM_F32, NDM_SHAPE(1, 3)), b2 = ndm_ones(f, NDM_F32, NDM_SHAPE(1));
    const char *path = tmp_file("torch_names.safetensors");
    char torch[256];
    snprintf(torch, sizeof torch, "%s", path);
    ndm_named_arrays set = {4, (const char *[]){"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"},
                            (ndm_array[]){w1, b1, w2, b2}, 0, NULL, NULL};
    assert_ok(ndm_safetensors_save(torch, &set));
    ndm_array params[4];
    assert_int_equal(ndm_module_parameters(net, params, 4), 4);
    int64_t n;
    double *before = values_of(params[0], &n);
    int line = __LINE__; int got = ndm_module_load(net, torch, NDM_CHECKPOINT_LENIENT);
    assert_int_equal(got, NDM_E_FORMAT);
    assert_error_has("matches none of the module's 4 tensors (lenient load)");
    assert_error_has("'0.weight'");
    assert_error_has("'fc1.weight'");
    char at[64];
    snprintf(at, sizeof at, "test_checkpoint.c:%d", line);
    assert_error_has(at);
    double *after = values_of(params[0], &n);
    assert_memory_equal(before, after, (size_t)n * sizeof *before);
    free(before);
    free(after);

    /* half of it matches: loaded, and the rest named, all of it */
    ndm_named_arrays half = {12,
                             (const char *[]){"0.weight", "0.bias", "x0", "x1", "x2", "x3", "x4",
                                              "x5", "x6", "x7", "x8", "x9"},
                             (ndm_array[]){w1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1}, 0,
                             NULL, NULL};
    const char *hp = tmp_file("half.safetensors");
    char halfp[256];
    snprintf(halfp, sizeof halfp, "%s", hp);
    assert_ok(ndm_safetensors_save(halfp, &half));
    nwarned = 0;
    ndm_set_log_fn(keep_warning, NULL);
    got = ndm_module_load(net, halfp, NDM_CHECKPOINT_LENIENT);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(got, 2);
    assert_int_equal(nwarned, 1);
    const char *want[] = {"loaded 2 of the module's 4 tensors",
                          "kept their values: '2.weight', '2.bias'",
                          "'x0', 'x1', 'x2', 'x3', 'x4', 'x5', 'x6', 'x7', 'x8', 'x9'"};
    for (int i = 0; i < 3; i++)
        if (!strstr(warned, want[i]))
            fail_msg("the warning lacks \"%s\":\n%s", want[i], warned);
    double v = 0;
    assert_ok(ndm_item(ndm_sum(params[0], false, NDM_ALL_AXES_LIST), &v));
    assert_true(v == 6.0); /* the file's ones */

    /* all of it matches: nothing to say */
    const char *own = tmp_file("own.safetensors");
    char ownp[256];
    snprintf(ownp, sizeof ownp, "%s", own);
    assert_ok(ndm_module_save(net, ownp));
    nwarned = 0;
    ndm_set_log_fn(keep_warning, NULL);
    got = ndm_module_load(net, ownp, NDM_CHECKPOINT_LENIENT);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(got, 4);
    assert_int_equal(nwarned, 0);
    unlink(torch);
    unlink(halfp);
    unlink(ownp);
    assert_ok(ndm_manager_close(f));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_checkpoint_torch_mlp_matches_pytorch),
        TEST(test_checkpoint_torch_training_pass_matches),
        TEST(test_checkpoint_torch_batch_norm2d_matches),
        TEST(test_checkpoint_save_load_round_trip),
        TEST(test_checkpoint_mismatch_is_refused),
        TEST(test_checkpoint_resumed_run_matches_unbroken),
        TEST(test_checkpoint_optimizer_state_mismatch_is_refused),
        TEST(test_checkpoint_optimizer_bad_metadata_is_refused),
        TEST(test_checkpoint_optimizer_step_count_never_overflows),
        TEST(test_checkpoint_optimizer_over_a_parameter_list),
        TEST(test_checkpoint_optimizer_over_a_high_rank_parameter),
        TEST(test_checkpoint_predictor_holds_weights_once),
        TEST(test_checkpoint_loads_refuse_a_fifo_at_once),
        TEST(test_checkpoint_saves_keep_what_is_at_the_path),
        TEST(test_checkpoint_high_rank_shape_is_named),
        TEST(test_checkpoint_lenient_load_says_what_it_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
