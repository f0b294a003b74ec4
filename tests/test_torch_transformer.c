/* A small decoder-only transformer written as ndm user modules under
 * PyTorch's names loads the state_dict PyTorch saved for the same
 * architecture (in f32 and in bf16), computes PyTorch's logits, and follows
 * PyTorch's AdamW loss curve step by step (references made by
 * tests/data/make_torch_transformer.py), on the CPU and on a CUDA device
 * when there is one; lenient loads say what they did not match, name maps
 * load other namings (a wrapper's prefix, PyTorch's TransformerEncoderLayer),
 * and a checkpoint of another architecture is refused with the module
 * unchanged. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#ifndef NDM_TEST_DATA
#error "NDM_TEST_DATA (the tests/data folder) must be defined by the build"
#endif

#define CKPT NDM_TEST_DATA "/torch_transformer.safetensors"
#define REF NDM_TEST_DATA "/torch_transformer_ref.safetensors"
#define CKPT_BF16 NDM_TEST_DATA "/torch_transformer_bf16.safetensors"

enum { VOCAB = 17, WIDTH = 16, HEADS = 2, CONTEXT = 8, HIDDEN = 32, BATCH = 4, STEPS = 20 };
enum { NSTATE = 28 }; /* tensors in the state_dict */

/* ---- the model ------------------------------------------------------------------------ */

/* Block, PyTorch's
 *     x = x + attn(norm1(x), causal);  x = x + mlp(norm2(x))
 * with mlp = Sequential(Linear, GELU, Linear), so its names are mlp.0, mlp.2. */
static ndm_array block_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n, (void)ud;
    ndm_array x = in[0];
    ndm_array a = ndm_forward(ndm_module_get_child(self, "attn"),
                              ndm_forward(ndm_module_get_child(self, "norm1"), x));
    ndm_array h = ndm_add(x, a);
    ndm_array f = ndm_forward(ndm_module_get_child(self, "mlp"),
                              ndm_forward(ndm_module_get_child(self, "norm2"), h));
    return ndm_add(h, f);
}

static const ndm_module_type block_type = {.name = "Block", .forward = block_forward};

static ndm_module block(ndm_manager model, int64_t hidden, ndm_rng *rng)
{
    ndm_module b = ndm_module_new(model, &block_type, NULL);
    assert_live(b);
    assert_ok(ndm_module_register_child(b, "norm1",
                                        ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(WIDTH))));
    assert_ok(ndm_module_register_child(
        b, "attn", ndm_multihead_attention(model, WIDTH, HEADS, true, true, rng)));
    assert_ok(ndm_module_register_child(b, "norm2",
                                        ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(WIDTH))));
    assert_ok(ndm_module_register_child(
        b, "mlp",
        ndm_sequential(model, NDM_MODULES(ndm_linear(model, WIDTH, hidden, true, rng),
                                          ndm_gelu_module(model),
                                          ndm_linear(model, hidden, WIDTH, true, rng)))));
    return b;
}

/* Model: tokens (batch, seq) -> logits (batch, seq, VOCAB). */
static ndm_array model_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n, (void)ud;
    int64_t t = ndm_array_dim(in[0], 1);
    /* the positions, in this pass's scope (on the tokens' device) */
    ndm_array pos = ndm_arange(ndm_scope_current(), NDM_I64, 0, (double)t, 1);
    ndm_array x = ndm_add(ndm_forward(ndm_module_get_child(self, "tok_emb"), in[0]),
                          ndm_forward(ndm_module_get_child(self, "pos_emb"), pos));
    ndm_module blocks = ndm_module_get_child(self, "blocks");
    int nb = ndm_module_named_children(blocks, NULL, NULL, 0);
    for (int i = 0; i < nb; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        x = ndm_forward(ndm_module_get_child(blocks, name), x);
    }
    return ndm_forward(ndm_module_get_child(self, "head"),
                       ndm_forward(ndm_module_get_child(self, "norm"), x));
}

static const ndm_module_type model_type = {.name = "Transformer", .forward = model_forward};

/* The architecture with `nblocks` blocks of MLP width `hidden` (2 and
 * HIDDEN: PyTorch's), freshly initialised from `seed`. */
static ndm_module transformer_of(ndm_manager model, int nblocks, int64_t hidden, uint64_t seed)
{
    ndm_rng rng = ndm_rng_new(seed);
    ndm_module net = ndm_module_new(model, &model_type, NULL);
    assert_live(net);
    assert_ok(ndm_module_register_child(net, "tok_emb", ndm_embedding(model, VOCAB, WIDTH, &rng)));
    assert_ok(
        ndm_module_register_child(net, "pos_emb", ndm_embedding(model, CONTEXT, WIDTH, &rng)));
    ndm_module b[4];
    for (int i = 0; i < nblocks; i++)
        b[i] = block(model, hidden, &rng);
    assert_ok(ndm_module_register_child(net, "blocks", ndm_module_list(model, nblocks, b)));
    assert_ok(
        ndm_module_register_child(net, "norm", ndm_rms_norm_module(model, WIDTH, 1e-6, true)));
    assert_ok(ndm_module_register_child(net, "head", ndm_linear(model, WIDTH, VOCAB, false, &rng)));
    return net;
}

static ndm_module transformer(ndm_manager model, uint64_t seed)
{
    return transformer_of(model, 2, HIDDEN, seed);
}

/* ---- values, files, logs ---------------------------------------------------------------- */

static char tmp_path[256];

static const char *tmp_file(const char *name)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/ndm_torch_tf_%d_%s", t && *t ? t : "/tmp",
             (int)getpid(), name);
    return tmp_path;
}

/* The elements of a as doubles (the caller frees). */
static double *values_of(ndm_array a, int64_t *n)
{
    ndm_manager s = ndm_scope_begin(ndm_system(), "values");
    ndm_array d = ndm_astype(ndm_to(ndm_contiguous(a), NDM_CPU), NDM_F64);
    assert_live(d);
    *n = ndm_array_size(d);
    double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    assert_ok(ndm_array_copy_out(d, v, (size_t)*n * sizeof *v));
    assert_ok(ndm_scope_end(s, 0, NULL));
    return v;
}

/* a and b agree elementwise within atol + rtol |b|; returns the largest
 * |a - b| / (atol + rtol |b|) seen. */
static double assert_close(ndm_array a, ndm_array b, double atol, double rtol, const char *what)
{
    int64_t na, nb;
    double *va = values_of(a, &na), *vb = values_of(b, &nb);
    assert_int_equal(na, nb);
    double worst = 0;
    for (int64_t i = 0; i < na; i++) {
        double d = fabs(va[i] - vb[i]), tol = atol + rtol * fabs(vb[i]);
        if (!(d <= tol))
            fail_msg("%s: element %lld is %.9g, PyTorch's %.9g", what, (long long)i, va[i],
                     vb[i]);
        if (d > 0 && d / tol > worst)
            worst = d / tol;
    }
    free(va);
    free(vb);
    return worst;
}

static ndm_array ref(const ndm_named_arrays *set, const char *name)
{
    int64_t i = ndm_named_arrays_find(set, name);
    if (i < 0)
        fail_msg("the reference file lacks '%s'", name);
    return set->arrays[i];
}

/* Every state value of net, in named_state order (the caller frees). */
static double *state_values(ndm_module net, int64_t *total)
{
    ndm_array a[4 * NSTATE];
    int n = ndm_module_named_state(net, NULL, a, 4 * NSTATE);
    assert_true(n > 0 && n <= 4 * NSTATE);
    double *all = NULL;
    *total = 0;
    for (int i = 0; i < n; i++) {
        int64_t k;
        double *v = values_of(a[i], &k);
        all = realloc(all, (size_t)(*total + k) * sizeof *all);
        memcpy(all + *total, v, (size_t)k * sizeof *v);
        *total += k;
        free(v);
    }
    return all;
}

/* The name map's callback: keep the tensors under the prefix in ud, as the
 * rest of their names; leave every other tensor out. */
static int only_prefix(const char *name, char *buf, size_t cap, void *ud)
{
    const char *prefix = ud;
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n))
        return 0;
    snprintf(buf, cap, "%s", name + n);
    return 1;
}

/* Load the reference file's tensors under `prefix` ("init.") into net, strictly. */
static void load_prefixed(ndm_module net, const char *prefix)
{
    ndm_name_map map = {.fn = only_prefix, .ud = (void *)prefix};
    assert_int_equal(ndm_module_load_mapped(net, REF, NDM_CHECKPOINT_STRICT, &map), NSTATE);
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

/* ---- loading and the forward pass -------------------------------------------------------- */

static void test_torch_transformer_strict_load_matches_every_name(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = transformer(model, 1);
    const char *names[NSTATE + 1];
    ndm_array arrays[NSTATE + 1];
    assert_int_equal(ndm_module_named_state(net, names, arrays, NSTATE + 1), NSTATE);
    /* PyTorch's state_dict order (safetensors files keep no order of their own) */
    static const char *want[NSTATE] = {
        "tok_emb.weight",
        "pos_emb.weight",
        "blocks.0.norm1.weight",
        "blocks.0.norm1.bias",
        "blocks.0.attn.in_proj_weight",
        "blocks.0.attn.in_proj_bias",
        "blocks.0.attn.out_proj.weight",
        "blocks.0.attn.out_proj.bias",
        "blocks.0.norm2.weight",
        "blocks.0.norm2.bias",
        "blocks.0.mlp.0.weight",
        "blocks.0.mlp.0.bias",
        "blocks.0.mlp.2.weight",
        "blocks.0.mlp.2.bias",
        "blocks.1.norm1.weight",
        "blocks.1.norm1.bias",
        "blocks.1.attn.in_proj_weight",
        "blocks.1.attn.in_proj_bias",
        "blocks.1.attn.out_proj.weight",
        "blocks.1.attn.out_proj.bias",
        "blocks.1.norm2.weight",
        "blocks.1.norm2.bias",
        "blocks.1.mlp.0.weight",
        "blocks.1.mlp.0.bias",
        "blocks.1.mlp.2.weight",
        "blocks.1.mlp.2.bias",
        "norm.weight",
        "head.weight",
    };
    for (int i = 0; i < NSTATE; i++)
        assert_string_equal(names[i], want[i]);

    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_int_equal(ndm_module_load(net, CKPT, NDM_CHECKPOINT_STRICT), NSTATE);
    /* every tensor of the file has a name of the module, and now its values */
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *file = ndm_safetensors_load(data, CKPT, NDM_LOAD_COPY);
    assert_non_null(file);
    assert_int_equal(file->count, NSTATE);
    for (size_t j = 0; j < file->count; j++) {
        ndm_array mine = ndm_module_get_array(net, file->names[j]);
        assert_live(mine);
        assert_close(mine, file->arrays[j], 0, 0, file->names[j]);
    }
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(m);
}

static void test_torch_transformer_eval_logits_match_pytorch(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = transformer(model, 1);
    assert_int_equal(ndm_module_load(net, CKPT, NDM_CHECKPOINT_STRICT), NSTATE);
    assert_ok(ndm_module_set_training(net, false));
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_array logits = ndm_forward(net, ref(r, "x"));
    assert_live(logits);
    int64_t shape[3];
    assert_int_equal(ndm_array_shape(logits, shape, 3), 3);
    assert_true(shape[0] == BATCH && shape[1] == CONTEXT && shape[2] == VOCAB);
    double worst = assert_close(logits, ref(r, "logits"), 1e-5, 1e-4, "eval logits");
    print_message("eval logits: worst error %.3g of the tolerance 1e-5 + 1e-4 |x|\n", worst);
    /* causal: the logits at a position do not depend on later tokens */
    int64_t tokens[BATCH * CONTEXT];
    assert_ok(ndm_array_copy_out(ref(r, "x"), tokens, sizeof tokens));
    for (int b = 0; b < BATCH; b++)
        tokens[b * CONTEXT + CONTEXT - 1] = (tokens[b * CONTEXT + CONTEXT - 1] + 5) % VOCAB;
    ndm_array x2 = ndm_from_buffer(data, NDM_I64, tokens, NDM_SHAPE(BATCH, CONTEXT));
    ndm_array l2 = ndm_forward(net, x2);
    /* (and the last position's do) */
    ndm_array d = ndm_sum(ndm_abs(ndm_sub(ndm_slice(l2, 1, CONTEXT - 1, CONTEXT, 1),
                                          ndm_slice(logits, 1, CONTEXT - 1, CONTEXT, 1))),
                          false, NDM_ALL_AXES_LIST);
    double moved;
    assert_ok(ndm_item(d, &moved));
    assert_true(moved > 1e-3);
    /* a shorter sequence: its logits are those of the prefix */
    ndm_array head = ndm_forward(net, ndm_contiguous(ndm_slice(ref(r, "x"), 1, 0, 5, 1)));
    assert_int_equal(ndm_array_dim(head, 1), 5);
    assert_close(head, ndm_slice(logits, 1, 0, 5, 1), 1e-6, 1e-5, "logits of a prefix");
    assert_close(ndm_slice(l2, 1, 0, CONTEXT - 1, 1), ndm_slice(logits, 1, 0, CONTEXT - 1, 1), 0,
                 0, "logits before the changed token");
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(m);
}

static void test_torch_transformer_bf16_checkpoint_loads_into_f32(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = transformer(model, 1);
    assert_int_equal(ndm_module_load(net, CKPT_BF16, NDM_CHECKPOINT_STRICT), NSTATE);
    /* the parameters stay f32, holding the file's values exactly */
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *file = ndm_safetensors_load(data, CKPT_BF16, NDM_LOAD_COPY);
    assert_non_null(file);
    for (size_t j = 0; j < file->count; j++) {
        assert_int_equal(ndm_array_dtype(file->arrays[j]), NDM_BF16);
        ndm_array mine = ndm_module_get_array(net, file->names[j]);
        assert_int_equal(ndm_array_dtype(mine), NDM_F32);
        assert_close(mine, file->arrays[j], 0, 0, file->names[j]);
    }
    assert_ok(ndm_module_set_training(net, false));
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    double worst =
        assert_close(ndm_forward(net, ref(r, "x")), ref(r, "logits_bf16"), 1e-5, 1e-4, "logits");
    print_message("bf16 checkpoint's logits: worst error %.3g of the tolerance\n", worst);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(m);
}

/* Served: a model built without gradients holds each weight once, and its
 * predictor gives PyTorch's logits. */
static void test_torch_transformer_serves_pytorch_logits(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager serving = ndm_manager_new(m, "serving");
    ndm_no_grad_begin();
    ndm_module net = transformer(serving, 1);
    ndm_no_grad_end();
    ndm_predictor p = ndm_predictor_load(serving, net, CKPT);
    assert_true(p.id);
    ndm_array a[NSTATE];
    assert_int_equal(ndm_module_named_state(net, NULL, a, NSTATE), NSTATE);
    uint64_t weights = 0;
    for (int i = 0; i < NSTATE; i++) {
        assert_false(ndm_array_requires_grad(a[i]));
        weights += 4 * (uint64_t)ndm_array_size(a[i]);
    }
    ndm_stats st;
    assert_ok(ndm_manager_stats(serving, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, weights);
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    for (int round = 0; round < 2; round++)
        assert_close(ndm_predict(p, ref(r, "x")), ref(r, "logits"), 1e-5, 1e-4, "served logits");
    assert_ok(ndm_manager_stats(serving, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, weights); /* the requests left nothing */
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(serving));
    assert_manager_empty(m);
}

/* PyTorch's RMSNorm(16) takes eps None, the dtype's machine epsilon: with
 * FLT_EPSILON the module computes what it does; the 1e-6 of the model
 * above would not, on inputs this small. */
static void test_torch_transformer_rms_norm_default_eps_is_flt_epsilon(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module same = ndm_rms_norm_module(model, WIDTH, FLT_EPSILON, true);
    ndm_module other = ndm_rms_norm_module(model, WIDTH, 1e-6, true);
    assert_live(same);
    assert_live(other);
    assert_close(ndm_forward(same, ref(r, "rms.x")), ref(r, "rms.y"), 1e-5, 1e-4,
                 "RMSNorm, eps FLT_EPSILON");
    double gap;
    ndm_array d = ndm_max(ndm_abs(ndm_sub(ndm_forward(other, ref(r, "rms.x")), ref(r, "rms.y"))),
                          false, NDM_ALL_AXES_LIST);
    assert_ok(ndm_item(d, &gap));
    assert_true(gap > 0.1);
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_manager_close(data));
    assert_manager_empty(m);
}

/* ---- training --------------------------------------------------------------------------- */

/* Twenty AdamW steps (PyTorch's settings, from the reference's metadata)
 * from the reference's initial state over its batches; each step's loss
 * against PyTorch's, then every parameter after the last step. */
static void train_and_compare(ndm_manager m, ndm_manager model, ndm_device dev)
{
    ndm_module net = transformer(model, 1);
    load_prefixed(net, "init.");
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    assert_string_equal(ndm_named_arrays_meta(r, "optimizer"), "adamw");
    double lr = atof(ndm_named_arrays_meta(r, "lr")), eps = atof(ndm_named_arrays_meta(r, "eps"));
    double wd = atof(ndm_named_arrays_meta(r, "weight_decay")), b1, b2;
    assert_int_equal(sscanf(ndm_named_arrays_meta(r, "betas"), "%lf,%lf", &b1, &b2), 2);
    ndm_optimizer opt = ndm_adamw(model, net, lr, b1, b2, eps, wd);
    assert_true(opt.id);
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    int64_t nl;
    double *want = values_of(ref(r, "losses"), &nl);
    assert_int_equal(nl, STEPS);
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        char xn[32], yn[32];
        snprintf(xn, sizeof xn, "batch.%d.x", i);
        snprintf(yn, sizeof yn, "batch.%d.y", i);
        ndm_manager step = ndm_manager_new_on(m, "step", dev);
        ndm_array x = ndm_to_to(step, ref(r, xn), dev);
        ndm_array y = ndm_reshape(ndm_to_to(step, ref(r, yn), dev), NDM_SHAPE(BATCH * CONTEXT));
        assert_ok(ndm_grad_begin(step));
        ndm_array logits = ndm_forward(net, x);
        ndm_array loss =
            ndm_cross_entropy(ndm_reshape(logits, NDM_SHAPE(BATCH * CONTEXT, VOCAB)), y);
        assert_live(loss);
        assert_ok(ndm_backward(loss));
        assert_ok(ndm_grad_end());
        double got;
        assert_ok(ndm_item(loss, &got));
        /* f32 throughout, as PyTorch's; the sums run in another order, and
         * Adam's m / sqrt(v) passes a gradient's relative error on to the
         * step, so the curves drift apart by rounding only: 1e-5 relative
         * holds for 20 steps with room to spare (see the worst printed) */
        double err = fabs(got - want[i]) / (1e-5 * fabs(want[i]));
        if (!(err <= 1))
            fail_msg("step %d: loss %.9g, PyTorch's %.9g", i, got, want[i]);
        worst = err > worst ? err : worst;
        assert_ok(ndm_optimizer_step(opt));
        assert_ok(ndm_optimizer_zero_grad(opt));
        assert_ok(ndm_manager_close(step));
    }
    print_message("losses: worst error %.3g of the tolerance 1e-5 relative\n", worst);
    assert_true(want[STEPS - 1] < want[0] - 0.5); /* it learned */
    free(want);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));

    /* the parameters after the last step, but the keys' bias: its gradient
     * is zero in exact arithmetic (q . b_k is the same for every key, and
     * softmax ignores it), so what it holds is rounding noise that Adam's
     * m / sqrt(v) scales up to lr-sized steps, in PyTorch as here; it moves
     * no logit, which the last check shows */
    ndm_manager fm = ndm_manager_new(m, "final");
    ndm_module final = transformer(fm, 2);
    load_prefixed(final, "final.");
    const char *names[NSTATE];
    ndm_array mine[NSTATE], theirs[NSTATE];
    assert_int_equal(ndm_module_named_state(net, names, mine, NSTATE), NSTATE);
    assert_int_equal(ndm_module_named_state(final, NULL, theirs, NSTATE), NSTATE);
    double pworst = 0, w;
    ndm_manager cmp = ndm_manager_new(m, "compare");
    for (int i = 0; i < NSTATE; i++) {
        if (!strstr(names[i], "attn.in_proj_bias")) {
            w = assert_close(mine[i], theirs[i], 1e-5, 1e-4, names[i]);
            pworst = w > pworst ? w : pworst;
            continue;
        }
        for (int part = 0; part < 3; part++) {
            ndm_array a = ndm_slice_to(cmp, mine[i], 0, part * WIDTH, (part + 1) * WIDTH, 1);
            ndm_array b = ndm_slice_to(cmp, theirs[i], 0, part * WIDTH, (part + 1) * WIDTH, 1);
            if (part == 1) {
                /* both within 20 steps of lr from their start, 0 */
                ndm_array zero = ndm_zeros(cmp, NDM_F32, NDM_SHAPE(WIDTH));
                assert_close(a, zero, STEPS * lr, 0, "keys' bias (ndm)");
                assert_close(b, zero, STEPS * lr, 0, "keys' bias (PyTorch)");
                continue;
            }
            w = assert_close(a, b, 1e-5, 1e-4, names[i]);
            pworst = w > pworst ? w : pworst;
        }
    }
    print_message("final parameters: worst error %.3g of the tolerance 1e-5 + 1e-4 |x|\n",
                  pworst);
    /* the trained model's logits are those of PyTorch's final state */
    ndm_manager on = ndm_manager_new_on(m, "on", dev);
    ndm_array mine_logits = ndm_forward(net, ndm_to_to(on, ref(r, "x"), dev));
    ndm_array their_logits = ndm_forward(final, ndm_to_to(cmp, ref(r, "x"), NDM_CPU));
    w = assert_close(mine_logits, their_logits, 1e-5, 1e-4, "logits after training");
    print_message("logits after training: worst error %.3g of the tolerance\n", w);
    assert_ok(ndm_manager_close(on));
    assert_ok(ndm_manager_close(cmp));
    assert_ok(ndm_manager_close(fm));
    assert_ok(ndm_manager_close(data));
}

static void test_torch_transformer_training_follows_pytorch_loss_curve(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    train_and_compare(m, model, NDM_CPU);
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(m);
}

/* ---- names that differ ------------------------------------------------------------------ */

/* Save the checkpoint's tensors again, their names through `rename` (NULL
 * from it: left out), plus `extra` tensors named in extra_names. */
static void rewrite_checkpoint(ndm_manager data, const char *path,
                               const char *(*rename)(const char *name, char *buf, size_t cap),
                               int nextra, const char **extra_names, const ndm_array *extra)
{
    const ndm_named_arrays *file = ndm_safetensors_load(data, CKPT, NDM_LOAD_COPY);
    assert_non_null(file);
    size_t cap = file->count + (size_t)nextra;
    const char **names = calloc(cap, sizeof *names);
    char(*bufs)[128] = calloc(cap, sizeof *bufs);
    ndm_array *arrays = calloc(cap, sizeof *arrays);
    size_t n = 0;
    for (size_t j = 0; j < file->count; j++) {
        const char *to = rename(file->names[j], bufs[n], sizeof bufs[n]);
        if (!to)
            continue;
        names[n] = to;
        arrays[n++] = file->arrays[j];
    }
    for (int k = 0; k < nextra; k++) {
        names[n] = extra_names[k];
        arrays[n++] = extra[k];
    }
    ndm_named_arrays set = {n, names, arrays, 0, NULL, NULL};
    assert_ok(ndm_safetensors_save(path, &set));
    free(names);
    free(bufs);
    free(arrays);
}

/* one renamed, one left out */
static const char *rename_some(const char *name, char *buf, size_t cap)
{
    if (!strcmp(name, "head.weight"))
        return NULL;
    if (!strcmp(name, "blocks.1.mlp.0.weight"))
        return "blocks.1.ffn.0.weight";
    snprintf(buf, cap, "%s", name);
    return buf;
}

static void test_torch_transformer_lenient_load_reports_every_unmatched_name(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_file("renamed.safetensors"));
    ndm_array extra = ndm_ones(data, NDM_F32, 1, (int64_t[]){WIDTH});
    rewrite_checkpoint(data, path, rename_some, 1, (const char *[]){"extra.scale"}, &extra);

    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = transformer(model, 1);
    int64_t nb;
    double *before = state_values(net, &nb);
    /* strict: refused, naming all four, the module unchanged */
    assert_int_equal(ndm_module_load(net, path, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("2 missing ('blocks.1.mlp.0.weight', 'head.weight')");
    assert_error_has("2 unexpected ('blocks.1.ffn.0.weight', 'extra.scale')");
    int64_t na;
    double *after = state_values(net, &na);
    assert_int_equal(na, nb);
    assert_memory_equal(before, after, (size_t)nb * sizeof *before);
    free(after);

    /* lenient: the 26 that match load, one warning names the other four */
    nwarned = 0;
    ndm_set_log_fn(keep_warning, NULL);
    int got = ndm_module_load(net, path, NDM_CHECKPOINT_LENIENT);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(got, NSTATE - 2);
    assert_int_equal(nwarned, 1);
    const char *want[] = {"loaded 26 of the module's 28 tensors",
                          "kept their values: 'blocks.1.mlp.0.weight', 'head.weight'",
                          "not in the module: 'blocks.1.ffn.0.weight', 'extra.scale'",
                          "test_torch_transformer.c:"};
    for (int i = 0; i < 4; i++)
        if (!strstr(warned, want[i]))
            fail_msg("the warning lacks \"%s\":\n%s", want[i], warned);
    const ndm_named_arrays *file = ndm_safetensors_load(data, CKPT, NDM_LOAD_COPY);
    assert_non_null(file);
    for (size_t j = 0; j < file->count; j++) {
        const char *name = file->names[j];
        if (strcmp(name, "head.weight") && strcmp(name, "blocks.1.mlp.0.weight"))
            assert_close(ndm_module_get_array(net, name), file->arrays[j], 0, 0, name);
    }
    /* the two left unmatched kept their values */
    ndm_manager fresh = ndm_manager_new(m, "fresh");
    ndm_module twin = transformer(fresh, 1);
    assert_close(ndm_module_get_array(net, "head.weight"),
                 ndm_module_get_array(twin, "head.weight"), 0, 0, "head.weight kept");
    assert_close(ndm_module_get_array(net, "blocks.1.mlp.0.weight"),
                 ndm_module_get_array(twin, "blocks.1.mlp.0.weight"), 0, 0,
                 "blocks.1.mlp.0.weight kept");
    free(before);
    unlink(path);
    assert_ok(ndm_manager_close(fresh));
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_manager_close(data));
    assert_manager_empty(m);
}

/* a wrapper's names: "model." before each */
static const char *add_model_prefix(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "model.%s", name);
    return buf;
}

/* Replace the first `from` in name by `to`, into buf. */
static void replace_in(const char *name, const char *from, const char *to, char *buf, size_t cap)
{
    const char *at = strstr(name, from);
    if (at)
        snprintf(buf, cap, "%.*s%s%s", (int)(at - name), name, to, at + strlen(from));
    else
        snprintf(buf, cap, "%s", name);
}

/* The names of the same model built of PyTorch's TransformerEncoderLayer
 * (the script checks that it computes the same logits): "encoder.layers.N."
 * for "blocks.N.", self_attn for attn, linear1 and linear2 for mlp.0 and
 * mlp.2 (norm1 and norm2 keep theirs). */
static const char *stock_names(const char *name, char *buf, size_t cap)
{
    static const char *const from[] = {"blocks.", ".attn.", ".mlp.0.", ".mlp.2."};
    static const char *const to[] = {"encoder.layers.", ".self_attn.", ".linear1.", ".linear2."};
    char tmp[128];
    snprintf(buf, cap, "%s", name);
    for (int k = 0; k < 4; k++) {
        replace_in(buf, from[k], to[k], tmp, sizeof tmp);
        snprintf(buf, cap, "%s", tmp);
    }
    return buf;
}

/* The map's callback, after its prefix rewrite ("encoder.layers." to
 * "blocks."): the layer's own names to the Block's; counts its calls. */
static int stock_to_block(const char *name, char *buf, size_t cap, void *ud)
{
    (*(int *)ud)++;
    static const char *const from[] = {".self_attn.", ".linear1.", ".linear2."};
    static const char *const to[] = {".attn.", ".mlp.0.", ".mlp.2."};
    char tmp[512];
    snprintf(buf, cap, "%s", name);
    for (int k = 0; k < 3; k++) {
        replace_in(buf, from[k], to[k], tmp, sizeof tmp);
        snprintf(buf, cap, "%s", tmp);
    }
    return 1;
}

static void test_torch_transformer_name_map_loads_other_names(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    char wrapped[256], other[256];
    snprintf(wrapped, sizeof wrapped, "%s", tmp_file("wrapped.safetensors"));
    snprintf(other, sizeof other, "%s", tmp_file("other.safetensors"));
    rewrite_checkpoint(data, wrapped, add_model_prefix, 0, NULL, NULL);
    rewrite_checkpoint(data, other, stock_names, 0, NULL, NULL);
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);

    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = transformer(model, 1);
    assert_ok(ndm_module_set_training(net, false));
    /* as they are, the names match none of the module's */
    assert_int_equal(ndm_module_load(net, wrapped, NDM_CHECKPOINT_LENIENT), NDM_E_FORMAT);
    assert_error_has("matches none of the module's 28 tensors");
    assert_error_has("'model.blocks.0.attn.in_proj_bias'");
    /* a prefix rewrite */
    ndm_name_map strip = {1, (const char *[]){"model."}, (const char *[]){""}, NULL, NULL};
    assert_int_equal(ndm_module_load_mapped(net, wrapped, NDM_CHECKPOINT_STRICT, &strip), NSTATE);
    assert_close(ndm_forward(net, ref(r, "x")), ref(r, "logits"), 1e-5, 1e-4, "logits (prefix)");

    /* a prefix rewrite and a callback together */
    ndm_manager m2 = ndm_manager_new(m, "model2");
    ndm_module net2 = transformer(m2, 3);
    assert_ok(ndm_module_set_training(net2, false));
    int calls = 0;
    ndm_name_map back = {1, (const char *[]){"encoder.layers."}, (const char *[]){"blocks."},
                         stock_to_block, &calls};
    assert_int_equal(ndm_module_load(net2, other, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("'encoder.layers.0.linear1.bias'");
    assert_int_equal(ndm_module_load_mapped(net2, other, NDM_CHECKPOINT_STRICT, &back), NSTATE);
    assert_int_equal(calls, NSTATE);
    assert_close(ndm_forward(net2, ref(r, "x")), ref(r, "logits"), 1e-5, 1e-4,
                 "logits (prefix and callback)");
    unlink(wrapped);
    unlink(other);
    assert_ok(ndm_manager_close(m2));
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_manager_close(data));
    assert_manager_empty(m);
}

/* ---- another architecture -------------------------------------------------------------- */

static void test_torch_transformer_wrong_architecture_is_refused(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");

    /* three blocks: the third's twelve tensors are missing */
    ndm_module deep = transformer_of(model, 3, HIDDEN, 4);
    int64_t nb, na;
    double *before = state_values(deep, &nb);
    assert_int_equal(ndm_module_load(deep, CKPT, NDM_CHECKPOINT_STRICT), NDM_E_FORMAT);
    assert_error_has("does not match the module: 12 missing ('blocks.2.norm1.weight', "
                     "'blocks.2.norm1.bias', 'blocks.2.attn.in_proj_weight'");
    assert_error_has("0 unexpected");
    assert_error_has("test_torch_transformer.c:");
    double *after = state_values(deep, &na);
    assert_int_equal(na, nb);
    assert_memory_equal(before, after, (size_t)nb * sizeof *before);
    free(before);
    free(after);

    /* a wider MLP: the six mis-shaped tensors named with both shapes, in
     * either mode */
    ndm_module wide = transformer_of(model, 2, 2 * HIDDEN, 5);
    before = state_values(wide, &nb);
    for (unsigned mode = NDM_CHECKPOINT_STRICT; mode <= NDM_CHECKPOINT_LENIENT; mode++) {
        assert_int_equal(ndm_module_load(wide, CKPT, mode), NDM_E_SHAPE);
        assert_error_has("'blocks.0.mlp.0.weight' is (32, 16) in the file, (64, 16) in the module");
        assert_error_has("'blocks.0.mlp.0.bias' is (32) in the file, (64) in the module");
        assert_error_has("'blocks.0.mlp.2.weight' is (16, 32) in the file, (16, 64) in the module");
        assert_error_has("'blocks.1.mlp.2.weight' is (16, 32) in the file, (16, 64) in the module");
        after = state_values(wide, &na);
        assert_int_equal(na, nb);
        assert_memory_equal(before, after, (size_t)nb * sizeof *before);
        free(after);
    }
    free(before);
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(m);
}

/* ---- CUDA ------------------------------------------------------------------------------- */

static void test_torch_transformer_on_a_cuda_model(void **state)
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
    ndm_manager model = ndm_manager_new(gpu, "model");
    ndm_module net = transformer(model, 1);
    assert_int_equal(ndm_array_device(ndm_module_get_array(net, "head.weight")).type,
                     NDM_DEVICE_CUDA);
    assert_int_equal(ndm_module_load(net, CKPT, NDM_CHECKPOINT_STRICT), NSTATE);
    assert_ok(ndm_module_set_training(net, false));
    ndm_manager data = ndm_manager_new(m, "data");
    const ndm_named_arrays *r = ndm_safetensors_load(data, REF, NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_manager batch = ndm_manager_new(gpu, "batch");
    ndm_array logits = ndm_forward(net, ndm_to_to(batch, ref(r, "x"), NDM_CUDA(0)));
    assert_live(logits);
    assert_int_equal(ndm_array_device(logits).type, NDM_DEVICE_CUDA);
    double worst = assert_close(logits, ref(r, "logits"), 1e-5, 1e-4, "cuda eval logits");
    print_message("cuda eval logits: worst error %.3g of the tolerance 1e-5 + 1e-4 |x|\n", worst);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));

    ndm_manager tmodel = ndm_manager_new(gpu, "train");
    train_and_compare(m, tmodel, NDM_CUDA(0));
    assert_ok(ndm_manager_close(tmodel));
    assert_ok(ndm_manager_close(gpu));
    assert_manager_empty(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_torch_transformer_strict_load_matches_every_name),
        TEST(test_torch_transformer_eval_logits_match_pytorch),
        TEST(test_torch_transformer_bf16_checkpoint_loads_into_f32),
        TEST(test_torch_transformer_serves_pytorch_logits),
        TEST(test_torch_transformer_rms_norm_default_eps_is_flt_epsilon),
        TEST(test_torch_transformer_training_follows_pytorch_loss_curve),
        TEST(test_torch_transformer_lenient_load_reports_every_unmatched_name),
        TEST(test_torch_transformer_name_map_loads_other_names),
        TEST(test_torch_transformer_wrong_architecture_is_refused),
        TEST(test_torch_transformer_on_a_cuda_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
