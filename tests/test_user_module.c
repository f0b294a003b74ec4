/* User-defined modules: a residual MLP and a two-branch network written as
 * ndm_module_type callbacks, checked against the same computation done
 * with raw operations (outputs and gradients), with PyTorch's state names,
 * and through everything that takes a module: optimizers, checkpoints,
 * predictors, models built without gradients, CUDA (when a CUDA module is
 * loaded), descriptions, dumps and snapshot frames; then every refusal. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/manager/alloc/alloc.h"
#include "helpers.h"

enum { IN = 4, HID = 8, OUT = 3, BATCH = 5 };

/* ---- the modules -------------------------------------------------------------------- */

/* Block: x + fc2(relu(fc1(x))), PyTorch's
 *     class Block(nn.Module):
 *         def __init__(self): self.fc1 = nn.Linear(4, 8); self.fc2 = nn.Linear(8, 4)
 *         def forward(self, x): return x + self.fc2(torch.relu(self.fc1(x))) */
static atomic_int forward_calls; /* (serving threads run it at once) */

static ndm_array block_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n, (void)ud;
    atomic_fetch_add(&forward_calls, 1);
    ndm_array h = ndm_forward(ndm_module_get_child(self, "fc1"), in[0]);
    ndm_array y = ndm_forward(ndm_module_get_child(self, "fc2"), ndm_relu(h));
    return ndm_add(in[0], y);
}

static const ndm_module_type block_type = {.name = "Block", .forward = block_forward};

static ndm_module block(ndm_manager model, ndm_rng *rng)
{
    ndm_module b = ndm_module_new(model, &block_type, NULL);
    assert_true(b.id);
    assert_ok(ndm_module_register_child(b, "fc1", ndm_linear(model, IN, HID, true, rng)));
    assert_ok(ndm_module_register_child(b, "fc2", ndm_linear(model, HID, IN, true, rng)));
    return b;
}

/* Net: blocks (a ModuleList of two Blocks), then head; with a second
 * input, a mask multiplied into the logits (left out: the null handle). */
static ndm_array net_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)ud;
    ndm_module blocks = ndm_module_get_child(self, "blocks");
    ndm_array h = in[0];
    for (int i = 0; i < ndm_module_named_children(blocks, NULL, NULL, 0); i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        h = ndm_forward(ndm_module_get_child(blocks, name), h);
    }
    ndm_array y = ndm_forward(ndm_module_get_child(self, "head"), h);
    return n > 1 && in[1].id ? ndm_mul(y, in[1]) : y;
}

static const ndm_module_type net_type = {.name = "Net", .forward = net_forward};

static ndm_module residual_net(ndm_manager model, uint64_t seed)
{
    ndm_rng rng = ndm_rng_new(seed);
    ndm_module b0 = block(model, &rng), b1 = block(model, &rng);
    ndm_module net = ndm_module_new(model, &net_type, NULL);
    assert_true(net.id);
    assert_ok(ndm_module_register_child(net, "blocks", ndm_module_list(model, NDM_MODULES(b0, b1))));
    assert_ok(ndm_module_register_child(net, "head", ndm_linear(model, IN, OUT, true, &rng)));
    return net;
}

/* The same computation with raw operations on the net's own arrays. */
static ndm_array linear_raw(ndm_module net, const char *prefix, ndm_array x)
{
    char w[64], b[64];
    snprintf(w, sizeof w, "%s.weight", prefix);
    snprintf(b, sizeof b, "%s.bias", prefix);
    return ndm_add(ndm_matmul(x, ndm_transpose(ndm_module_get_array(net, w))),
                   ndm_module_get_array(net, b));
}

static ndm_array residual_raw(ndm_module net, ndm_array x)
{
    ndm_array h = x;
    for (int i = 0; i < 2; i++) {
        char p1[32], p2[32];
        snprintf(p1, sizeof p1, "blocks.%d.fc1", i);
        snprintf(p2, sizeof p2, "blocks.%d.fc2", i);
        h = ndm_add(h, linear_raw(net, p2, ndm_relu(linear_raw(net, p1, h))));
    }
    return linear_raw(net, "head", h);
}

static void assert_close(ndm_array a, ndm_array b, double tol, const char *what)
{
    assert_int_equal(ndm_array_size(a), ndm_array_size(b));
    int64_t n = ndm_array_size(a);
    double *va = malloc((size_t)n * sizeof *va), *vb = malloc((size_t)n * sizeof *vb);
    /* (copies apart: a may live in a capped model) */
    ndm_manager tmp = ndm_manager_new(ndm_system(), "compare");
    ndm_array da = ndm_astype_to(tmp, a, NDM_F64), db = ndm_astype_to(tmp, b, NDM_F64);
    assert_ok(ndm_array_copy_out(da, va, (size_t)n * sizeof *va));
    assert_ok(ndm_array_copy_out(db, vb, (size_t)n * sizeof *vb));
    assert_ok(ndm_manager_close(tmp));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(va[i] - vb[i]) <= tol * (1 + fabs(vb[i]))))
            fail_msg("%s element %lld: %.9g, want %.9g", what, (long long)i, va[i], vb[i]);
    free(va);
    free(vb);
}

static ndm_array labels_in(ndm_manager m, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e)
{
    const int64_t v[BATCH] = {a, b, c, d, e};
    const int64_t shape[1] = {BATCH};
    ndm_array l = ndm_from_buffer(m, NDM_I64, v, 1, shape);
    assert_live(l);
    return l;
}

static ndm_array input(ndm_manager m, uint64_t seed)
{
    ndm_rng rng = ndm_rng_new(seed);
    ndm_array x = ndm_normal(m, &rng, NDM_F32, 0.0, 1.0, 2, (int64_t[]){BATCH, IN});
    assert_live(x);
    return x;
}

/* ---- forward, names, gradients --------------------------------------------------------- */

static void test_user_module_residual_net_equals_the_hand_computation(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 1);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = input(batch, 2);
    forward_calls = 0;
    ndm_array y = ndm_forward(net, x);
    assert_live(y);
    assert_int_equal(forward_calls, 2);
    /* every intermediate died with the forward pass: x and y are left */
    assert_int_equal(test_live_arrays(batch), 2);
    assert_int_equal(ndm_array_manager(y).id, batch.id);
    ndm_array want = residual_raw(net, x);
    assert_close(y, want, 1e-6, "residual net");
    /* the mask: a second input, and the null handle for one left out */
    ndm_array mask = ndm_full(batch, NDM_F32, 2.0, 2, (int64_t[]){BATCH, OUT});
    ndm_array ym = ndm_forward_n(net, NDM_ARRAYS(x, mask));
    ndm_array yn = ndm_forward_n(net, NDM_ARRAYS(x, NDM_NULL_ARRAY));
    assert_live(ym);
    assert_live(yn);
    assert_close(ym, ndm_mul_scalar(want, 2.0), 1e-6, "masked");
    assert_close(yn, want, 1e-6, "no mask");
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

static void test_user_module_names_compose_as_pytorch_names_them(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 1);
    static const char *want[] = {
        "blocks.0.fc1.weight", "blocks.0.fc1.bias", "blocks.0.fc2.weight", "blocks.0.fc2.bias",
        "blocks.1.fc1.weight", "blocks.1.fc1.bias", "blocks.1.fc2.weight", "blocks.1.fc2.bias",
        "head.weight",         "head.bias",
    };
    const char *names[16];
    ndm_array arrays[16];
    assert_int_equal(ndm_module_named_parameters(net, names, arrays, 16), 10);
    for (int i = 0; i < 10; i++)
        assert_string_equal(names[i], want[i]);
    assert_int_equal(ndm_module_named_state(net, names, NULL, 16), 10);
    assert_true(ndm_module_get_array(net, "blocks.1.fc2.bias").id == arrays[7].id);
    /* qualified module names, and children by dotted path */
    char q[64];
    ndm_module attn = ndm_module_get_child(net, "blocks.1.fc2");
    assert_true(attn.id);
    assert_int_equal(ndm_module_name(attn, q, sizeof q), 12);
    assert_string_equal(q, "blocks.1.fc2");
    assert_int_equal(ndm_module_name(net, q, sizeof q), 0);
    assert_int_equal(ndm_module_named_children(ndm_module_get_child(net, "blocks"), names, NULL, 16),
                     2);
    assert_string_equal(names[1], "1");

    /* PyTorch's order inside a module: its own parameters, then its own
     * buffers, then the children's, whatever the registration order */
    ndm_rng rng = ndm_rng_new(3);
    ndm_module u = ndm_module_new(model, &block_type, NULL);
    assert_ok(ndm_module_register_child(u, "fc1", ndm_linear(model, 2, 2, false, &rng)));
    assert_ok(ndm_module_register_buffer(u, "steps", ndm_zeros(model, NDM_I64, 0, NULL)));
    assert_ok(ndm_module_register_parameter(u, "scale", ndm_ones(model, NDM_F32, 1, (int64_t[]){2})));
    assert_int_equal(ndm_module_named_parameters(u, names, NULL, 16), 2);
    assert_string_equal(names[0], "scale");
    assert_string_equal(names[1], "fc1.weight");
    assert_int_equal(ndm_module_named_state(u, names, NULL, 16), 3);
    assert_string_equal(names[0], "scale");
    assert_string_equal(names[1], "steps");
    assert_string_equal(names[2], "fc1.weight");
    /* a parameter registered with gradients on gets one; a buffer does not */
    assert_true(ndm_array_requires_grad(ndm_module_get_array(u, "scale")));
    assert_false(ndm_array_requires_grad(ndm_module_get_array(u, "steps")));
    assert_ok(ndm_manager_close(model));
}

/* One cross-entropy step's gradients, in the order of net's parameters,
 * into g (the caller frees). */
static double *module_grads(ndm_manager m, ndm_module net, ndm_array x, ndm_array labels, bool raw,
                            int *np)
{
    ndm_array p[16];
    *np = ndm_module_parameters(net, p, 16);
    assert_ok(ndm_zero_grad((size_t)*np, p));
    ndm_manager batch = ndm_manager_new(m, "step");
    assert_ok(ndm_grad_begin(batch));
    ndm_array logits = raw ? residual_raw(net, x) : ndm_forward_to(batch, net, x);
    ndm_array loss = ndm_cross_entropy_to(batch, logits, labels);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    size_t total = 0;
    for (int i = 0; i < *np; i++)
        total += (size_t)ndm_array_size(p[i]);
    double *g = malloc(total * sizeof *g), *at = g;
    for (int i = 0; i < *np; i++) {
        ndm_array gi = ndm_astype_to(batch, ndm_grad_to(batch, p[i]), NDM_F64);
        assert_live(gi);
        assert_ok(ndm_array_copy_out(gi, at, (size_t)ndm_array_size(p[i]) * sizeof *at));
        at += ndm_array_size(p[i]);
    }
    assert_ok(ndm_manager_close(batch));
    return g;
}

static void test_user_module_gradients_equal_those_of_raw_operations(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 4);
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 5);
    ndm_array labels = labels_in(data, 0, 2, 1, 1, 0);
    int n1, n2;
    double *via_module = module_grads(m, net, x, labels, false, &n1);
    double *via_ops = module_grads(m, net, x, labels, true, &n2);
    assert_int_equal(n1, 10);
    assert_int_equal(n2, 10);
    ndm_array p[16];
    ndm_module_parameters(net, p, 16);
    size_t total = 0;
    for (int i = 0; i < n1; i++)
        total += (size_t)ndm_array_size(p[i]);
    bool some = false;
    for (size_t i = 0; i < total; i++) {
        some |= via_ops[i] != 0;
        if (!(fabs(via_module[i] - via_ops[i]) <= 1e-6 * (1 + fabs(via_ops[i]))))
            fail_msg("gradient element %zu: module %.9g, raw ops %.9g", i, via_module[i],
                     via_ops[i]);
    }
    assert_true(some);
    free(via_module);
    free(via_ops);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

/* ---- optimizers, checkpoints, predictors --------------------------------------------- */

/* Three steps of opt over net, against the same algorithm over the list of
 * a twin net's parameters (same seed): the parameters agree bit for bit. */
static void check_optimizer(ndm_manager m, int which)
{
    ndm_manager ma = ndm_manager_new(m, "a"), mb = ndm_manager_new(m, "b");
    ndm_module na = residual_net(ma, 7), nb = residual_net(mb, 7);
    ndm_array pb[16];
    int np = ndm_module_parameters(nb, pb, 16);
    ndm_optimizer oa = which == 0   ? ndm_sgd(ma, na, 0.1, 0.9, 0.01)
                       : which == 1 ? ndm_adam(ma, na, 0.01, 0.9, 0.999, 1e-8, 0.01)
                                    : ndm_adamw(ma, na, 0.01, 0.9, 0.999, 1e-8, 0.01);
    ndm_optimizer ob = which == 0   ? ndm_sgd_params(mb, np, pb, 0.1, 0.9, 0.01)
                       : which == 1 ? ndm_adam_params(mb, np, pb, 0.01, 0.9, 0.999, 1e-8, 0.01)
                                    : ndm_adamw_params(mb, np, pb, 0.01, 0.9, 0.999, 1e-8, 0.01);
    assert_true(oa.id && ob.id);
    assert_ok(ndm_manager_cap(ma, NDM_CAP_ARRAYS));
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 8);
    ndm_array labels = labels_in(data, 1, 0, 2, 2, 1);
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < 2; k++) {
            ndm_module net = k ? nb : na;
            ndm_manager batch = ndm_manager_new(data, "batch");
            assert_ok(ndm_grad_begin(batch));
            ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), labels);
            assert_live(loss);
            assert_ok(ndm_backward(loss));
            assert_ok(ndm_grad_end());
            assert_ok(ndm_optimizer_step(k ? ob : oa));
            assert_ok(ndm_optimizer_zero_grad(k ? ob : oa));
            assert_ok(ndm_manager_close(batch));
        }
    }
    ndm_array pa[16];
    assert_int_equal(ndm_module_parameters(na, pa, 16), np);
    for (int i = 0; i < np; i++)
        assert_close(pa[i], pb[i], 0, "parameter after three steps");
    /* they moved */
    ndm_manager fresh = ndm_manager_new(m, "fresh");
    ndm_module nf = residual_net(fresh, 7);
    ndm_array pf[16];
    ndm_module_parameters(nf, pf, 16);
    ndm_array d = ndm_sum(ndm_abs(ndm_sub_to(data, pa[0], pf[0])), false, NDM_ALL_AXES_LIST);
    double moved;
    assert_ok(ndm_item(d, &moved));
    assert_true(moved > 0);
    assert_ok(ndm_manager_close(fresh));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(ma));
    assert_ok(ndm_manager_close(mb));
}

static void test_user_module_trains_with_every_optimizer(void **state)
{
    for (int which = 0; which < 3; which++)
        check_optimizer(ROOT(state), which);
}

static void tmp_file(char *buf, size_t n, const char *name)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/ndm_user_module_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
}

static void test_user_module_checkpoint_round_trip_gives_equal_logits(void **state)
{
    ndm_manager m = ROOT(state);
    char path[256];
    tmp_file(path, sizeof path, "net.safetensors");
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 11);
    assert_ok(ndm_module_save(net, path));
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 12);
    ndm_array y = ndm_forward(net, x);

    /* strict, into a fresh model of other weights */
    ndm_manager fresh = ndm_manager_new(m, "fresh");
    ndm_module other = residual_net(fresh, 99);
    assert_ok(ndm_manager_cap(fresh, NDM_CAP_ARRAYS));
    assert_int_equal(ndm_module_load(other, path, NDM_CHECKPOINT_STRICT), 10);
    assert_close(ndm_forward(other, x), y, 0, "logits after load");

    /* lenient, into a net with one block: the other block's tensors are
     * reported and left out, the matching ones loaded */
    ndm_manager small = ndm_manager_new(m, "small");
    ndm_rng rng = ndm_rng_new(5);
    ndm_module s = ndm_module_new(small, &net_type, NULL);
    assert_ok(ndm_module_register_child(s, "blocks",
                                        ndm_module_list(small, NDM_MODULES(block(small, &rng)))));
    assert_ok(ndm_module_register_child(s, "head", ndm_linear(small, IN, OUT, true, &rng)));
    assert_int_equal(ndm_module_load(s, path, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("blocks.1.fc1.weight");
    assert_int_equal(ndm_module_load(s, path, NDM_CHECKPOINT_LENIENT), 6);
    assert_close(ndm_module_get_array(s, "head.weight"), ndm_module_get_array(net, "head.weight"), 0,
                 "head after a lenient load");
    assert_ok(ndm_manager_close(small));
    assert_ok(ndm_manager_close(fresh));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    unlink(path);
}

static void test_user_module_serves_from_a_predictor_built_without_gradients(void **state)
{
    ndm_manager m = ROOT(state);
    char path[256];
    tmp_file(path, sizeof path, "serve.safetensors");
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 21);
    assert_ok(ndm_module_save(net, path));
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 22);
    ndm_array y = ndm_forward(net, x);

    /* built with gradients paused: no gradient arrays, optimizers refuse it */
    ndm_manager serve = ndm_manager_new(m, "serve");
    ndm_no_grad_begin();
    ndm_module snet = residual_net(serve, 1);
    ndm_no_grad_end();
    ndm_array p[16];
    int np = ndm_module_parameters(snet, p, 16);
    assert_int_equal(np, 10);
    for (int i = 0; i < np; i++)
        assert_false(ndm_array_requires_grad(p[i]));
    assert_false(ndm_sgd(serve, snet, 0.1, 0.0, 0.0).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_predictor pr = ndm_predictor_load(serve, snet, path);
    assert_true(pr.id);
    assert_int_equal(ndm_module_training(snet), 0);
    assert_int_equal(ndm_module_training(ndm_module_get_child(snet, "blocks.1.fc1")), 0);
    ndm_array got = ndm_predict(pr, x);
    assert_live(got);
    assert_close(got, y, 0, "prediction");
    assert_int_equal(ndm_array_manager(got).id, data.id);
    /* the request left nothing in the model */
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_predictor_manager(pr), NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 0);

    /* ndm_predictor_new on a trained net: eval mode, same answers */
    ndm_predictor p2 = ndm_predictor_new(model, net);
    assert_true(p2.id);
    assert_close(ndm_predict(p2, x), y, 0, "predictor_new");
    assert_ok(ndm_manager_close(serve));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    unlink(path);
}

/* ---- checkpoints of other names ---------------------------------------------------- */

static char last_warning[2048];
static void keep_warning(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN)
        snprintf(last_warning, sizeof last_warning, "%s", msg);
}

/* "blocks.N..." of the file reads as "layers.N..."; "head.bias" is left out;
 * "fail" fails the load. */
static int rename_blocks(const char *file_name, char *buf, size_t cap, void *ud)
{
    (void)ud;
    if (!strcmp(file_name, "head.bias"))
        return 0;
    if (!strncmp(file_name, "blocks.", 7))
        return snprintf(buf, cap, "layers.%s", file_name + 7) < (int)cap;
    snprintf(buf, cap, "%s", file_name);
    return 1;
}

static int refuse_all(const char *file_name, char *buf, size_t cap, void *ud)
{
    (void)file_name, (void)buf, (void)cap, (void)ud;
    return NDM_E_UNSUPPORTED;
}

static void test_user_module_loads_a_checkpoint_of_other_names_through_a_map(void **state)
{
    ndm_manager m = ROOT(state);
    char plain[256], wrapped[256];
    tmp_file(plain, sizeof plain, "plain.safetensors");
    tmp_file(wrapped, sizeof wrapped, "wrapped.safetensors");
    /* the net saved as it is, and inside a wrapper ("model.blocks.0...") */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 51);
    assert_ok(ndm_module_save(net, plain));
    ndm_module wrapper = ndm_module_new(model, &net_type, NULL);
    assert_ok(ndm_module_register_child(wrapper, "model", net));
    const char *names[16];
    ndm_module_named_state(wrapper, names, NULL, 16);
    assert_string_equal(names[0], "model.blocks.0.fc1.weight");
    assert_ok(ndm_module_save(wrapper, wrapped));
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 52);
    ndm_array y = ndm_forward(net, x);

    /* without a map nothing matches, in either mode */
    ndm_manager fresh = ndm_manager_new(m, "fresh");
    ndm_module other = residual_net(fresh, 1);
    assert_int_equal(ndm_module_load(other, wrapped, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_int_equal(ndm_module_load(other, wrapped, NDM_CHECKPOINT_LENIENT), NDM_E_FORMAT);
    assert_error_has("matches none");
    /* the prefix dropped: a strict load, equal logits */
    const char *from[] = {"model."}, *to[] = {""};
    const ndm_name_map strip = {.n = 1, .from = from, .to = to};
    assert_int_equal(ndm_module_load_mapped(other, wrapped, NDM_CHECKPOINT_STRICT, &strip), 10);
    assert_close(ndm_forward(other, x), y, 0, "logits through the prefix map");

    /* a callback: another module naming ("layers"), one tensor left out */
    ndm_manager renamed = ndm_manager_new(m, "renamed");
    ndm_rng rng = ndm_rng_new(51);
    ndm_module r0 = block(renamed, &rng), r1 = block(renamed, &rng);
    ndm_module rn = ndm_module_new(renamed, &net_type, NULL);
    assert_ok(ndm_module_register_child(rn, "layers", ndm_module_list(renamed, NDM_MODULES(r0, r1))));
    assert_ok(ndm_module_register_child(rn, "head", ndm_linear(renamed, IN, OUT, true, &rng)));
    const ndm_name_map cb = {.fn = rename_blocks};
    assert_int_equal(ndm_module_load_mapped(rn, plain, NDM_CHECKPOINT_STRICT, &cb), NDM_E_FORMAT);
    assert_error_has("1 missing ('head.bias')");
    assert_error_has("0 unexpected");
    ndm_set_log_fn(keep_warning, NULL);
    last_warning[0] = '\0';
    assert_int_equal(ndm_module_load_mapped(rn, plain, NDM_CHECKPOINT_LENIENT, &cb), 9);
    ndm_set_log_fn(NULL, NULL);
    assert_non_null(strstr(last_warning, "kept their values: 'head.bias'"));
    assert_close(ndm_module_get_array(rn, "layers.1.fc2.weight"),
                 ndm_module_get_array(net, "blocks.1.fc2.weight"), 0, "renamed");
    /* a lenient load reports every unmatched name, past eight too */
    ndm_manager one = ndm_manager_new(m, "one");
    ndm_module lone = ndm_module_new(one, &net_type, NULL);
    assert_ok(ndm_module_register_child(lone, "head", ndm_linear(one, IN, OUT, true, &rng)));
    ndm_set_log_fn(keep_warning, NULL);
    last_warning[0] = '\0';
    assert_int_equal(ndm_module_load(lone, plain, NDM_CHECKPOINT_LENIENT), 2);
    ndm_set_log_fn(NULL, NULL);
    for (int i = 0; i < 8; i++)
        assert_non_null(strstr(last_warning, names[i] + strlen("model.")));

    /* refusals, the module unchanged */
    const char *two_from[] = {"model.blocks.0.", "model.blocks.1."};
    const char *two_to[] = {"blocks.0.", "blocks.0."};
    const ndm_name_map clash = {.n = 2, .from = two_from, .to = two_to};
    assert_int_equal(ndm_module_load_mapped(other, wrapped, NDM_CHECKPOINT_LENIENT, &clash),
                     NDM_E_FORMAT);
    assert_error_has("both read as 'blocks.0.fc1.weight'");
    const ndm_name_map refuse = {.fn = refuse_all};
    assert_int_equal(ndm_module_load_mapped(other, plain, NDM_CHECKPOINT_STRICT, &refuse),
                     NDM_E_UNSUPPORTED);
    assert_error_has("the name map refused");
    const ndm_name_map broken = {.n = 1};
    assert_int_equal(ndm_module_load_mapped(other, plain, NDM_CHECKPOINT_STRICT, &broken),
                     NDM_E_INVALID);
    assert_close(ndm_forward(other, x), y, 0, "logits after the refusals");
    /* NULL: as ndm_module_load */
    assert_int_equal(ndm_module_load_mapped(other, plain, NDM_CHECKPOINT_STRICT, NULL), 10);
    assert_ok(ndm_manager_close(one));
    assert_ok(ndm_manager_close(renamed));
    assert_ok(ndm_manager_close(fresh));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    unlink(plain);
    unlink(wrapped);
}

/* Serving threads: each predicts through the same user-module net. */
typedef struct {
    ndm_predictor p;
    ndm_array x, want;
    int bad;
} serve_job;

static void *serve_thread(void *arg)
{
    serve_job *j = arg;
    ndm_manager mine = ndm_manager_new(ndm_system(), "client");
    for (int i = 0; i < 50; i++) {
        ndm_array y = ndm_predict_to(mine, j->p, j->x);
        ndm_array d = y.id ? ndm_sum_to(mine, ndm_abs_to(mine, ndm_sub_to(mine, y, j->want)), false,
                                        NDM_ALL_AXES_LIST)
                           : NDM_NULL_ARRAY;
        double diff = 1;
        if (!d.id || ndm_item(d, &diff) != NDM_OK || diff != 0)
            j->bad++;
        (void)!ndm_manager_close(mine);
        mine = ndm_manager_new(ndm_system(), "client");
    }
    (void)!ndm_manager_close(mine);
    return NULL;
}

static void test_user_module_serves_many_threads_at_once(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_no_grad_begin();
    ndm_module net = residual_net(model, 61);
    ndm_no_grad_end();
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 62);
    ndm_array want = ndm_forward(net, x);
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_true(p.id);
    enum { T = 4 };
    pthread_t th[T];
    serve_job jobs[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (serve_job){p, x, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, serve_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(jobs[i].bad, 0);
    }
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
}

/* ---- CUDA ---------------------------------------------------------------------------- */

static void test_user_module_runs_and_trains_on_a_cuda_model(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager gpu = ndm_manager_new_on(m, "gpu", NDM_CUDA(0));
    ndm_array probe = gpu.id ? ndm_zeros(gpu, NDM_F32, 1, (int64_t[]){1}) : NDM_NULL_ARRAY;
    if (!probe.id) {
        if (gpu.id)
            assert_ok(ndm_manager_close(gpu));
        ndm_clear_error();
        print_message("no CUDA device: skipped\n");
        skip();
    }
    assert_ok(ndm_array_release(probe));
    char path[256];
    tmp_file(path, sizeof path, "cuda.safetensors");
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 31);
    assert_ok(ndm_module_save(net, path));
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_array x = input(data, 32);
    ndm_array y = ndm_forward(net, x);

    ndm_manager gmodel = ndm_manager_new(gpu, "model");
    ndm_module gnet = residual_net(gmodel, 1);
    assert_int_equal(ndm_array_device(ndm_module_get_array(gnet, "head.weight")).type,
                     NDM_DEVICE_CUDA);
    assert_int_equal(ndm_module_load(gnet, path, NDM_CHECKPOINT_STRICT), 10);
    ndm_manager gbatch = ndm_manager_new(gpu, "batch");
    ndm_array gx = ndm_to_to(gbatch, x, NDM_CUDA(0));
    ndm_array gy = ndm_forward(gnet, gx);
    assert_live(gy);
    assert_int_equal(ndm_array_device(gy).type, NDM_DEVICE_CUDA);
    assert_close(gy, y, 1e-5, "cuda logits");
    /* a training step on the device */
    ndm_optimizer opt = ndm_adam(gmodel, gnet, 0.01, 0.9, 0.999, 1e-8, 0.0);
    assert_true(opt.id);
    ndm_array labels = ndm_to_to(gbatch, labels_in(data, 0, 1, 2, 0, 1), NDM_CUDA(0));
    assert_ok(ndm_grad_begin(gbatch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(gnet, gx), labels);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_optimizer_step(opt));
    ndm_array after = ndm_forward(gnet, gx);
    double before_loss, after_loss;
    assert_ok(ndm_item(loss, &before_loss));
    assert_ok(ndm_item(ndm_cross_entropy(after, labels), &after_loss));
    assert_true(after_loss < before_loss);
    assert_ok(ndm_manager_close(gbatch));
    assert_ok(ndm_manager_close(gmodel));
    assert_ok(ndm_manager_close(gpu));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    unlink(path);
}

/* ---- descriptions, dumps, frames ---------------------------------------------------- */

static int branch_describe(ndm_module self, char *buf, size_t n, void *ud)
{
    (void)self;
    return snprintf(buf, n, "TwoBranch(scale=%g)", *(const double *)ud);
}

/* Two branches: scale * (left(x) + right(x)) */
static ndm_array branch_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n;
    ndm_array l = ndm_forward(ndm_module_get_child(self, "left"), in[0]);
    ndm_array r = ndm_forward(ndm_module_get_child(self, "right"), in[0]);
    return ndm_mul_scalar(ndm_add(l, r), *(const double *)ud);
}

static void test_user_module_describes_itself(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 1);
    char buf[512];
    const char *want = "Net(blocks=ModuleList(Block(fc1=Linear(4, 8), fc2=Linear(8, 4)), "
                       "Block(fc1=Linear(4, 8), fc2=Linear(8, 4))), head=Linear(4, 3))";
    assert_int_equal(ndm_module_describe(net, buf, sizeof buf), (int)strlen(want));
    assert_string_equal(buf, want);
    /* truncated as snprintf does */
    assert_int_equal(ndm_module_describe(net, buf, 8), (int)strlen(want));
    assert_string_equal(buf, "Net(blo");
    /* the user's own describe, and its data */
    static double scale = 0.5;
    const ndm_module_type t = {.name = "TwoBranch", .forward = branch_forward,
                               .describe = branch_describe};
    ndm_module two = ndm_module_new(model, &t, &scale);
    assert_true(ndm_module_user_data(two) == &scale);
    assert_int_equal(ndm_module_describe(two, buf, sizeof buf), 20);
    assert_string_equal(buf, "TwoBranch(scale=0.5)");
    assert_ok(ndm_manager_close(model));
}

static void test_user_module_two_branch_net_matches_its_branches(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_rng rng = ndm_rng_new(41);
    static double scale = 0.5;
    const ndm_module_type t = {.name = "TwoBranch", .forward = branch_forward};
    ndm_module two = ndm_module_new(model, &t, &scale);
    ndm_module left = ndm_sequential(model, NDM_MODULES(ndm_linear(model, IN, HID, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, HID, OUT, true, &rng)));
    ndm_module right = ndm_linear(model, IN, OUT, false, &rng);
    assert_ok(ndm_module_register_child(two, "left", left));
    assert_ok(ndm_module_register_child(two, "right", right));
    const char *names[8];
    assert_int_equal(ndm_module_named_parameters(two, names, NULL, 8), 5);
    assert_string_equal(names[0], "left.0.weight");
    assert_string_equal(names[3], "left.2.bias");
    assert_string_equal(names[4], "right.weight");
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = input(batch, 42);
    ndm_array y = ndm_forward(two, x);
    ndm_array want = ndm_mul_scalar(ndm_add(ndm_forward(left, x), ndm_forward(right, x)), 0.5);
    assert_close(y, want, 0, "two branches");
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* A forward that looks at the thread's frames and dumps the tree. */
static char seen_frames[1024];
static char seen_dump[8192];
static ndm_manager dump_root;

static ndm_array probing_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self, (void)n, (void)ud;
    const ndm__call_frame *f;
    int nf = ndm__frames_current(&f);
    seen_frames[0] = '\0';
    for (int i = 0; i < nf; i++) {
        size_t len = strlen(seen_frames);
        snprintf(seen_frames + len, sizeof seen_frames - len, "%s%s", i ? " > " : "", f[i].api);
    }
    FILE *mem = fmemopen(seen_dump, sizeof seen_dump, "w");
    assert_ok(ndm_debug_dump(dump_root, mem));
    fclose(mem);
    return ndm_mul_scalar(in[0], 2.0);
}

static void test_user_module_forward_pushes_a_frame_with_its_name(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    const ndm_module_type probe_t = {.name = "Probe", .forward = probing_forward};
    ndm_module probe = ndm_module_new(model, &probe_t, NULL);
    ndm_module inner = ndm_module_new(model, &net_type, NULL);
    ndm_rng rng = ndm_rng_new(1);
    /* blocks.1 is the probe: Net(blocks=[Block, Probe], head) */
    assert_ok(ndm_module_register_child(
        inner, "blocks", ndm_module_list(model, NDM_MODULES(block(model, &rng), probe))));
    assert_ok(ndm_module_register_child(inner, "head", ndm_linear(model, IN, OUT, true, &rng)));
    ndm_manager batch = ndm_manager_new(m, "batch");
    dump_root = batch;
    ndm_array x = input(batch, 3);
    char path[256];
    tmp_file(path, sizeof path, "frames.json");
    assert_ok(ndm_memory_record_history(true, 0));
    ndm_array y = ndm_forward(inner, x);
    assert_live(y);
    assert_ok(ndm_memory_dump_snapshot(path));
    assert_ok(ndm_memory_record_history(false, 0));
    /* the outer ndm_forward, the child's ndm_forward, then its name */
    assert_string_equal(seen_frames, "ndm_forward > ndm_forward > blocks.1");
    /* the dump taken inside it shows the forward scopes by name */
    assert_non_null(strstr(seen_dump, "forward"));
    assert_non_null(strstr(seen_dump, "blocks.1"));
    /* the snapshot: the probe's multiplication allocated under "blocks.1",
     * the block's linear layers under "blocks.0.fc1" */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    text[len] = '\0';
    fclose(f);
    assert_non_null(strstr(text, "\"blocks.1\""));
    assert_non_null(strstr(text, "\"blocks.0.fc1\""));
    assert_non_null(strstr(text, "probing_forward"));
    free(text);
    unlink(path);
    /* with history off, nothing is pushed */
    ndm_array y2 = ndm_forward(inner, x);
    assert_live(y2);
    assert_string_equal(seen_frames, "");
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* Wrap: its child "inner" and nothing else. */
static ndm_array wrap_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)ud;
    return ndm_forward_n(ndm_module_get_child(self, "inner"), n, in);
}

/* Five modules nested: eleven frames at the innermost, past the eight a
 * thread keeps in place, all kept. */
static void test_user_module_frames_of_deep_trees_are_all_kept(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    const ndm_module_type probe_t = {.name = "Probe", .forward = probing_forward};
    const ndm_module_type wrap_t = {.name = "Wrap", .forward = wrap_forward};
    ndm_module inner = ndm_module_new(model, &probe_t, NULL);
    for (int i = 0; i < 5; i++) {
        ndm_module w = ndm_module_new(model, &wrap_t, NULL);
        assert_ok(ndm_module_register_child(w, "inner", inner));
        inner = w;
    }
    ndm_manager batch = ndm_manager_new(m, "batch");
    dump_root = batch;
    ndm_array x = input(batch, 3);
    assert_ok(ndm_memory_record_history(true, 0));
    ndm_array y = ndm_forward(inner, x);
    assert_ok(ndm_memory_record_history(false, 0));
    assert_live(y);
    assert_string_equal(seen_frames,
                        "ndm_forward > ndm_forward > inner > ndm_forward > inner.inner > "
                        "ndm_forward > inner.inner.inner > ndm_forward > inner.inner.inner.inner "
                        "> ndm_forward > inner.inner.inner.inner.inner");
    /* and popped: nothing left on the way out */
    const ndm__call_frame *f;
    assert_int_equal(ndm__frames_current(&f), 0);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* ---- failures ------------------------------------------------------------------------ */

static int failing_line;

static ndm_array failing_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self, (void)n, (void)ud;
    ndm_array a = ndm_mul_scalar(in[0], 3.0); /* made, then the pass fails */
    ndm_array wrong = ndm_ones(NDM_CURRENT_SCOPE, NDM_F32, 2, (int64_t[]){7, 7});
    failing_line = __LINE__ + 1;
    return ndm_matmul(a, wrong);
}

static ndm_array null_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self, (void)n, (void)in, (void)ud;
    return NDM_NULL_ARRAY;
}

static ndm_array identity_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self, (void)n, (void)ud;
    return in[0];
}

static void test_user_module_failing_forward_frees_what_it_made(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    const ndm_module_type ft = {.name = "Failing", .forward = failing_forward};
    const ndm_module_type nt = {.name = "Silent", .forward = null_forward};
    const ndm_module_type it = {.name = "Identity", .forward = identity_forward};
    ndm_module bad = ndm_module_new(model, &ft, NULL);
    ndm_module silent = ndm_module_new(model, &nt, NULL);
    ndm_module id = ndm_module_new(model, &it, NULL);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = input(batch, 1);
    assert_false(ndm_forward(bad, x).id);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    char where[64];
    snprintf(where, sizeof where, "test_user_module.c:%d", failing_line);
    assert_error_has(where);
    assert_error_has("ndm_matmul");
    assert_int_equal(test_live_arrays(batch), 1);
    assert_int_equal(test_live_arrays(model), 0);
    /* a null result without an error of its own says which module */
    ndm_clear_error();
    assert_false(ndm_forward(silent, x).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("Silent");
    /* handing back the input gives an alias; the input stays the caller's */
    ndm_array y = ndm_forward(id, x);
    assert_live(y);
    assert_true(y.id != x.id);
    assert_ok(ndm_array_release(y));
    assert_true(ndm_array_valid(x));
    assert_int_equal(test_live_arrays(batch), 1);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* A forward pass that closes the manager its result goes to (as a model's
 * close, on another thread, closes a request under it): the pass's scope
 * dies with it. */
static ndm_array closing_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self, (void)n;
    ndm_array y = ndm_mul_scalar(in[0], 2.0);
    (void)ndm_manager_close(*(ndm_manager *)ud);
    return y;
}

static void test_user_module_pass_whose_manager_closes_says_so(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_manager request = ndm_manager_new(m, "request");
    const ndm_module_type ct = {.name = "Closing", .forward = closing_forward};
    ndm_module c = ndm_module_new(model, &ct, &request);
    ndm_array x = input(request, 1);
    ndm_clear_error();
    assert_false(ndm_forward(c, x).id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("closed while the pass ran");
    assert_false(ndm_manager_valid(request));
    assert_int_equal(test_live_arrays(model), 0);
    assert_ok(ndm_manager_close(model));
}

static int destroyed;
static void count_destroy(void *ud)
{
    destroyed += *(int *)ud;
}

static void test_user_module_refuses_bad_types_and_frees_the_user_data(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    static int one = 1;
    destroyed = 0;
    const ndm_module_type no_fwd = {.name = "Nothing", .destroy = count_destroy};
    assert_false(ndm_module_new(model, &no_fwd, &one).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("no forward");
    assert_int_equal(destroyed, 1);
    assert_false(ndm_module_new(model, NULL, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    /* a closed model: refused, the data freed */
    const ndm_module_type t = {.forward = identity_forward, .destroy = count_destroy};
    ndm_manager gone = ndm_manager_new(m, "gone");
    assert_ok(ndm_manager_close(gone));
    assert_false(ndm_module_new(gone, &t, &one).id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(destroyed, 2);
    /* made: freed with its model, once; the type was copied */
    ndm_module_type tmp = t;
    ndm_module u = ndm_module_new(model, &tmp, &one);
    memset(&tmp, 0, sizeof tmp);
    char buf[32];
    ndm_module_describe(u, buf, sizeof buf);
    assert_string_equal(buf, "Module");
    assert_ok(ndm_manager_close(model));
    assert_int_equal(destroyed, 3);
    assert_null(ndm_module_user_data(u));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
}

static void test_user_module_refuses_bad_registrations_unchanged(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_manager other = ndm_manager_new(m, "other");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module u = ndm_module_new(model, &block_type, NULL);
    ndm_array w = ndm_zeros(model, NDM_F32, 1, (int64_t[]){3});
    assert_ok(ndm_module_register_parameter(u, "w", w));
    ndm_module lin = ndm_linear(model, 2, 2, true, &rng);
    assert_ok(ndm_module_register_child(u, "lin", lin));
    const int before = ndm_module_named_state(u, NULL, NULL, 0);
    assert_int_equal(before, 3);
    ndm_array v = ndm_zeros(model, NDM_F32, 1, (int64_t[]){3});

    /* names: dotted, empty, NULL, taken (by a parameter or by a child), too long */
    assert_status(ndm_module_register_parameter(u, "a.b", v), NDM_E_INVALID);
    assert_error_has("'a.b' has a '.'");
    assert_status(ndm_module_register_parameter(u, "", v), NDM_E_INVALID);
    assert_status(ndm_module_register_buffer(u, NULL, v), NDM_E_INVALID);
    assert_status(ndm_module_register_parameter(u, "w", v), NDM_E_INVALID);
    assert_error_has("holds 'w' already");
    assert_status(ndm_module_register_buffer(u, "lin", v), NDM_E_INVALID);
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_status(ndm_module_register_parameter(u, longname, v), NDM_E_INVALID);
    /* arrays: registered already, of another manager, not float, stale */
    assert_status(ndm_module_register_buffer(u, "again", w), NDM_E_INVALID);
    assert_error_has("registered already as 'w'");
    ndm_array foreign = ndm_zeros(other, NDM_F32, 1, (int64_t[]){3});
    assert_status(ndm_module_register_parameter(u, "f", foreign), NDM_E_NOT_OWNER);
    assert_error_has("other");
    ndm_array ints = ndm_zeros(model, NDM_I32, 1, (int64_t[]){3});
    assert_status(ndm_module_register_parameter(u, "i", ints), NDM_E_DTYPE);
    assert_ok(ndm_module_register_buffer(u, "i", ints)); /* a buffer may be */
    ndm_array dead = ndm_zeros(model, NDM_F32, 1, (int64_t[]){3});
    assert_ok(ndm_array_release(dead));
    assert_status(ndm_module_register_parameter(u, "d", dead), NDM_E_CLOSED);
    /* children: itself, registered twice, of another manager, null */
    assert_status(ndm_module_register_child(u, "me", u), NDM_E_INVALID);
    assert_error_has("under itself");
    ndm_module u2 = ndm_module_new(model, &block_type, NULL);
    assert_status(ndm_module_register_child(u2, "lin", lin), NDM_E_INVALID);
    assert_error_has("registered already (as 'lin')");
    ndm_module far = ndm_linear(other, 2, 2, true, &rng);
    assert_status(ndm_module_register_child(u, "far", far), NDM_E_NOT_OWNER);
    ndm_clear_error(); /* (a null module keeps the error before it) */
    assert_status(ndm_module_register_child(u, "null", (ndm_module){0}), NDM_E_NULL);
    /* a child whose arrays the tree holds already */
    ndm_module twin = ndm_module_new(model, &block_type, NULL);
    assert_ok(ndm_module_register_parameter(twin, "t", v));
    ndm_module holder = ndm_module_new(model, &block_type, NULL);
    assert_ok(ndm_module_register_buffer(holder, "v", v));
    assert_status(ndm_module_register_child(holder, "twin", twin), NDM_E_INVALID);
    assert_error_has("one name in a tree");
    /* a cycle: u into u2, then u2 into u (u is a child now: refused) */
    assert_ok(ndm_module_register_child(u2, "u", u));
    assert_status(ndm_module_register_child(u, "u2", u2), NDM_E_INVALID);
    assert_error_has("registered in another already");
    assert_status(ndm_module_register_parameter(u, "late", v), NDM_E_INVALID);
    /* into a built-in layer, or with a bad handle */
    assert_status(ndm_module_register_parameter(lin, "extra", v), NDM_E_INVALID);
    assert_error_has("Linear");
    ndm_clear_error();
    assert_status(ndm_module_register_parameter((ndm_module){0}, "x", v), NDM_E_NULL);
    /* the same module twice in a list, or one registered already */
    ndm_module r = ndm_relu_module(model);
    assert_false(ndm_module_list(model, NDM_MODULES(r, r)).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_false(ndm_sequential(model, NDM_MODULES(lin)).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    /* r is free again after the failed list */
    assert_true(ndm_module_list(model, NDM_MODULES(r)).id);
    /* u held what it had (a buffer added on the way) */
    assert_int_equal(ndm_module_named_state(u, NULL, NULL, 0), before + 1);
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(model));
}

static void test_user_module_lookups_and_inputs_are_checked(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = residual_net(model, 1);
    assert_false(ndm_module_get_child(net, "blocks.7").id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("no child '7'");
    assert_error_has("'0', '1'");
    assert_false(ndm_module_get_array(net, "head.wieght").id);
    assert_error_has("head.weight");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module lin = ndm_linear(model, IN, OUT, true, &rng);
    assert_null(ndm_module_user_data(lin));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = input(batch, 1);
    /* a built-in layer takes one input; a list has no forward pass */
    assert_false(ndm_forward_n(lin, NDM_ARRAYS(x, x)).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("Linear takes one input, got 2");
    assert_false(ndm_forward(ndm_module_get_child(net, "blocks"), x).id);
    assert_error_has("ModuleList has no forward pass");
    assert_false(ndm_forward_n(net, 0, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_array dead = ndm_zeros(batch, NDM_F32, 1, (int64_t[]){1});
    assert_ok(ndm_array_release(dead));
    assert_false(ndm_forward_n(net, NDM_ARRAYS(x, dead)).id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(test_live_arrays(batch), 1);
    /* train/eval reaches every descendant */
    assert_ok(ndm_module_set_training(net, false));
    assert_int_equal(ndm_module_training(ndm_module_get_child(net, "blocks.0.fc2")), 0);
    assert_ok(ndm_module_set_training(net, true));
    assert_int_equal(ndm_module_training(ndm_module_get_child(net, "blocks.0.fc2")), 1);
    assert_ok(ndm_manager_close(batch));
    assert_true(ndm_module_valid(net));
    assert_ok(ndm_manager_close(model));
    ndm_clear_error();
    assert_false(ndm_module_valid(net));
    assert_int_equal(ndm_last_status(), NDM_OK); /* (sets no error) */
    assert_false(ndm_module_valid((ndm_module){0}));
    assert_int_equal(ndm_module_training(net), NDM_E_CLOSED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_user_module_residual_net_equals_the_hand_computation),
        TEST(test_user_module_names_compose_as_pytorch_names_them),
        TEST(test_user_module_gradients_equal_those_of_raw_operations),
        TEST(test_user_module_trains_with_every_optimizer),
        TEST(test_user_module_checkpoint_round_trip_gives_equal_logits),
        TEST(test_user_module_serves_from_a_predictor_built_without_gradients),
        TEST(test_user_module_loads_a_checkpoint_of_other_names_through_a_map),
        TEST(test_user_module_serves_many_threads_at_once),
        TEST(test_user_module_runs_and_trains_on_a_cuda_model),
        TEST(test_user_module_describes_itself),
        TEST(test_user_module_two_branch_net_matches_its_branches),
        TEST(test_user_module_forward_pushes_a_frame_with_its_name),
        TEST(test_user_module_frames_of_deep_trees_are_all_kept),
        TEST(test_user_module_failing_forward_frees_what_it_made),
        TEST(test_user_module_pass_whose_manager_closes_says_so),
        TEST(test_user_module_refuses_bad_types_and_frees_the_user_data),
        TEST(test_user_module_refuses_bad_registrations_unchanged),
        TEST(test_user_module_lookups_and_inputs_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
