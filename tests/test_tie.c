/* Tied parameters (ndm_module_tie): a small language model whose head shares
 * the token embedding's table, as GPT-style models tie them in PyTorch.
 * The shared array is one parameter (listed once, updated once, its
 * gradient the sum of both uses: checked against an untied copy and central
 * differences), two state names (saved, loaded from files with both names
 * or one), described; built without gradients and served; PyTorch's own
 * (tests/data/make_torch_tied.py) loaded, run and trained one step; then
 * every refusal, each leaving the module as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

enum { VOCAB = 6, DIM = 4, TOKENS = 5 };

/* LM: head(tok_emb(idx)), PyTorch's
 *     class LM(nn.Module):
 *         def __init__(self):
 *             self.tok_emb = nn.Embedding(6, 4); self.head = nn.Linear(4, 6, bias=False)
 *             self.head.weight = self.tok_emb.weight
 *         def forward(self, idx): return self.head(self.tok_emb(idx)) */
static ndm_array lm_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n, (void)ud;
    ndm_array h = ndm_forward(ndm_module_get_child(self, "tok_emb"), in[0]);
    return ndm_forward(ndm_module_get_child(self, "head"), h);
}

static const ndm_module_type lm_type = {.name = "LM", .forward = lm_forward};

/* The model, tied or not; with a buffer "scale" (for the refusals). */
static ndm_module lm(ndm_manager model, uint64_t seed, bool tie)
{
    ndm_rng rng = ndm_rng_new(seed);
    ndm_module net = ndm_module_new(model, &lm_type, NULL);
    assert_true(net.id);
    assert_ok(ndm_module_register_child(net, "tok_emb", ndm_embedding(model, VOCAB, DIM, &rng)));
    assert_ok(ndm_module_register_child(net, "head", ndm_linear(model, DIM, VOCAB, false, &rng)));
    assert_ok(ndm_module_register_buffer(net, "scale", ndm_ones(model, NDM_F32, NDM_SHAPE(VOCAB))));
    if (tie)
        assert_ok(ndm_module_tie(net, "head.weight", "tok_emb.weight"));
    return net;
}

static const int64_t tokens[TOKENS] = {3, 0, 5, 3, 1};
static const int64_t targets[TOKENS] = {0, 5, 2, 1, 3};

static ndm_array loss_of(ndm_manager b, ndm_module net)
{
    ndm_array idx = ndm_from_buffer(b, NDM_I64, (int64_t *)tokens, NDM_SHAPE(TOKENS));
    ndm_array y = ndm_from_buffer(b, NDM_I64, (int64_t *)targets, NDM_SHAPE(TOKENS));
    return ndm_cross_entropy(ndm_forward(net, idx), y);
}

static void values(ndm_array a, float *out, size_t n)
{
    assert_ok(ndm_array_copy_out(a, out, n * sizeof *out));
}

static void tmp_file(char *buf, size_t n, const char *name)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/ndm_tie_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
}

/* One array under both names; one parameter; the replaced array and its
 * gradient are gone; the forward pass is take(W) @ W^T. */
static void test_tie_makes_one_array_of_two_names(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = lm(model, 1, false);
    uint64_t before = test_live_arrays(model);
    ndm_array w = ndm_module_get_array(net, "tok_emb.weight");
    ndm_array old = ndm_module_get_array(net, "head.weight");
    assert_ok(ndm_module_tie(net, "head.weight", "tok_emb.weight"));
    assert_int_equal(ndm_module_get_array(net, "head.weight").id, w.id);
    assert_false(ndm_array_valid(old));
    assert_int_equal(test_live_arrays(model), before - 2); /* the weight and its gradient */
    /* state: both names, PyTorch's state_dict order; parameters: once */
    const char *names[8];
    ndm_array arrays[8];
    assert_int_equal(ndm_module_named_state(net, names, arrays, 8), 3);
    assert_string_equal(names[0], "scale");
    assert_string_equal(names[1], "tok_emb.weight");
    assert_string_equal(names[2], "head.weight");
    assert_int_equal(arrays[1].id, arrays[2].id);
    assert_int_equal(ndm_module_named_parameters(net, names, arrays, 8), 1);
    assert_string_equal(names[0], "tok_emb.weight");
    assert_int_equal(arrays[0].id, w.id);
    assert_int_equal(ndm_module_parameters(net, NULL, 0), 1);
    /* the head alone holds it as its own weight */
    ndm_module head = ndm_module_get_child(net, "head");
    assert_int_equal(ndm_module_parameters(head, arrays, 8), 1);
    assert_int_equal(arrays[0].id, w.id);
    /* tying again changes nothing */
    assert_ok(ndm_module_tie(net, "head.weight", "tok_emb.weight"));
    assert_int_equal(ndm_module_named_state(net, NULL, NULL, 0), 3);
    char buf[256];
    const char *want = "LM(tok_emb=Embedding(6, 4), head=Linear(4, 6, bias=false)) "
                       "[head.weight (tied to tok_emb.weight)]";
    assert_int_equal(ndm_module_describe(net, buf, sizeof buf), (int)strlen(want));
    assert_string_equal(buf, want);
    /* the forward pass uses the table both ways */
    ndm_manager b = ndm_manager_new(model, "batch");
    ndm_array idx = ndm_from_buffer(b, NDM_I64, (int64_t *)tokens, NDM_SHAPE(TOKENS));
    float got[TOKENS * VOCAB], table[VOCAB * DIM];
    values(ndm_forward(net, idx), got, TOKENS * VOCAB);
    values(w, table, VOCAB * DIM);
    for (int t = 0; t < TOKENS; t++)
        for (int v = 0; v < VOCAB; v++) {
            double s = 0;
            for (int d = 0; d < DIM; d++)
                s += (double)table[tokens[t] * DIM + d] * table[v * DIM + d];
            assert_true(fabs(got[t * VOCAB + v] - s) < 1e-5);
        }
    assert_ok(ndm_manager_close(b));
    assert_ok(ndm_manager_close(model));
}

/* The shared array's gradient is the sum of its two uses' gradients (an
 * untied model of the same values), and central differences agree; SGD
 * updates it once. */
static void test_tie_gradient_sums_both_uses_and_is_updated_once(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager ma = ndm_manager_new(root, "tied"), mb = ndm_manager_new(root, "untied");
    ndm_module tied = lm(ma, 7, true), untied = lm(mb, 8, false);
    ndm_array w = ndm_module_get_array(tied, "tok_emb.weight");
    assert_ok(ndm_copy_into(ndm_module_get_array(untied, "tok_emb.weight"), w));
    assert_ok(ndm_copy_into(ndm_module_get_array(untied, "head.weight"), w));
    float g[VOCAB * DIM], ge[VOCAB * DIM], gh[VOCAB * DIM], w0[VOCAB * DIM];
    values(w, w0, VOCAB * DIM);
    ndm_manager ba = ndm_manager_new(ma, "batch"), bb = ndm_manager_new(mb, "batch");
    assert_ok(ndm_grad_begin(ba));
    ndm_array la = loss_of(ba, tied);
    assert_ok(ndm_backward(la));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_grad_begin(bb));
    assert_ok(ndm_backward(loss_of(bb, untied)));
    assert_ok(ndm_grad_end());
    values(ndm_grad_to(ba, w), g, VOCAB * DIM);
    values(ndm_grad_to(bb, ndm_module_get_array(untied, "tok_emb.weight")), ge, VOCAB * DIM);
    values(ndm_grad_to(bb, ndm_module_get_array(untied, "head.weight")), gh, VOCAB * DIM);
    for (int i = 0; i < VOCAB * DIM; i++)
        if (fabsf(g[i] - (ge[i] + gh[i])) > 1e-6f)
            fail_msg("gradient %d: %.9g, the two uses give %.9g + %.9g", i, g[i], ge[i], gh[i]);
    /* central differences of the loss in the shared entries */
    double h = 1e-2;
    for (int i = 0; i < VOCAB * DIM; i += 5) {
        double lv[2];
        for (int s = 0; s < 2; s++) {
            float p[VOCAB * DIM];
            memcpy(p, w0, sizeof p);
            p[i] += (float)(s ? -h : h);
            ndm_manager c = ndm_manager_new(ma, "fd");
            assert_ok(ndm_copy_into(w, ndm_from_buffer(c, NDM_F32, p, NDM_SHAPE(VOCAB, DIM))));
            assert_ok(ndm_item(loss_of(c, tied), &lv[s]));
            assert_ok(ndm_manager_close(c));
        }
        double fd = (lv[0] - lv[1]) / (2 * h);
        if (fabs(fd - g[i]) > 2e-3 * (1 + fabs(fd)))
            fail_msg("entry %d: gradient %.6g, central difference %.6g", i, g[i], fd);
    }
    /* the optimizer has one parameter and moves it by lr * gradient once */
    ndm_manager c = ndm_manager_new(ma, "restore");
    assert_ok(ndm_copy_into(w, ndm_from_buffer(c, NDM_F32, w0, NDM_SHAPE(VOCAB, DIM))));
    assert_ok(ndm_manager_close(c));
    ndm_optimizer opt = ndm_sgd(ma, tied, 0.5, 0.0, 0.0);
    assert_true(opt.id);
    assert_ok(ndm_optimizer_step(opt));
    float w1[VOCAB * DIM];
    values(w, w1, VOCAB * DIM);
    for (int i = 0; i < VOCAB * DIM; i++)
        assert_true(fabsf(w1[i] - (w0[i] - 0.5f * g[i])) < 1e-6f);
    assert_ok(ndm_manager_close(ma));
    assert_ok(ndm_manager_close(mb));
}

/* Saved with both names (as torch.save(state_dict) holds them); loaded
 * strictly from that file, from one with only one of the names (as
 * safetensors' save_model writes), and refused, unchanged, from one whose
 * two names hold different values. */
static void test_tie_checkpoints_hold_both_names_and_load_either(void **state)
{
    ndm_manager root = ROOT(state);
    char both[256], one[256], differ[256];
    tmp_file(both, sizeof both, "both.safetensors");
    tmp_file(one, sizeof one, "one.safetensors");
    tmp_file(differ, sizeof differ, "differ.safetensors");
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_module net = lm(model, 3, true);
    assert_ok(ndm_module_save(net, both));
    ndm_manager files = ndm_manager_new(root, "files");
    const ndm_named_arrays *set = ndm_safetensors_load(files, both, NDM_LOAD_COPY);
    assert_non_null(set);
    assert_int_equal(set->count, 3);
    int64_t ie = ndm_named_arrays_find(set, "tok_emb.weight");
    int64_t ih = ndm_named_arrays_find(set, "head.weight");
    assert_true(ie >= 0 && ih >= 0);
    float a[VOCAB * DIM], b[VOCAB * DIM], w[VOCAB * DIM];
    values(set->arrays[ie], a, VOCAB * DIM);
    values(set->arrays[ih], b, VOCAB * DIM);
    values(ndm_module_get_array(net, "tok_emb.weight"), w, VOCAB * DIM);
    assert_memory_equal(a, w, sizeof a);
    assert_memory_equal(b, w, sizeof b);

    /* strict, into a tied model of other values: both names */
    ndm_manager fresh = ndm_manager_new(root, "fresh");
    ndm_module other = lm(fresh, 99, true);
    ndm_array ow = ndm_module_get_array(other, "tok_emb.weight");
    assert_int_equal(ndm_module_load(other, both, NDM_CHECKPOINT_STRICT), 2);
    values(ow, a, VOCAB * DIM);
    assert_memory_equal(a, w, sizeof a);
    assert_int_equal(ndm_module_get_array(other, "head.weight").id, ow.id);

    /* only one of the tied names (either): nothing is missing */
    for (int k = 0; k < 2; k++) {
        const char *names[2] = {"scale", k ? "head.weight" : "tok_emb.weight"};
        ndm_array arrays[2] = {ndm_ones(files, NDM_F32, NDM_SHAPE(VOCAB)),
                               ndm_full(files, NDM_F32, 0.25 + k, NDM_SHAPE(VOCAB, DIM))};
        ndm_named_arrays s1 = {2, names, arrays, 0, NULL, NULL};
        assert_ok(ndm_safetensors_save(one, &s1));
        ndm_clear_error();
        assert_int_equal(ndm_module_load(other, one, NDM_CHECKPOINT_STRICT), 2);
        values(ow, a, VOCAB * DIM);
        for (int i = 0; i < VOCAB * DIM; i++)
            assert_true(a[i] == 0.25f + (float)k);
    }

    /* both names, different values: refused, the module unchanged */
    const char *names[3] = {"scale", "tok_emb.weight", "head.weight"};
    ndm_array arrays[3] = {ndm_ones(files, NDM_F32, NDM_SHAPE(VOCAB)),
                           ndm_full(files, NDM_F32, 2.0, NDM_SHAPE(VOCAB, DIM)),
                           ndm_full(files, NDM_F32, 3.0, NDM_SHAPE(VOCAB, DIM))};
    ndm_named_arrays s2 = {3, names, arrays, 0, NULL, NULL};
    assert_ok(ndm_safetensors_save(differ, &s2));
    values(ow, b, VOCAB * DIM);
    for (unsigned mode = NDM_CHECKPOINT_STRICT; mode <= NDM_CHECKPOINT_LENIENT; mode++) {
        assert_int_equal(ndm_module_load(other, differ, mode), NDM_E_FORMAT);
        assert_error_has("holds different values for 'tok_emb.weight' and 'head.weight', which "
                         "are tied in the module");
        values(ow, a, VOCAB * DIM);
        assert_memory_equal(a, b, sizeof a);
    }
    ndm_clear_error();
    assert_ok(ndm_manager_close(files));
    assert_ok(ndm_manager_close(fresh));
    assert_ok(ndm_manager_close(model));
    unlink(both);
    unlink(one);
    unlink(differ);
}

/* A tied model built without gradients loads and serves from a predictor,
 * with the answers of the trained one. */
static void test_tie_serves_from_a_predictor_built_without_gradients(void **state)
{
    ndm_manager root = ROOT(state);
    char path[256];
    tmp_file(path, sizeof path, "serve.safetensors");
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_module net = lm(model, 5, true);
    assert_ok(ndm_module_save(net, path));
    ndm_manager data = ndm_manager_new(root, "data");
    ndm_array idx = ndm_from_buffer(data, NDM_I64, (int64_t *)tokens, NDM_SHAPE(TOKENS));
    float want[TOKENS * VOCAB], got[TOKENS * VOCAB];
    values(ndm_forward(net, idx), want, TOKENS * VOCAB);

    ndm_manager serve = ndm_manager_new(root, "serve");
    ndm_no_grad_begin();
    ndm_module snet = lm(serve, 1, true);
    ndm_no_grad_end();
    ndm_array p[4];
    assert_int_equal(ndm_module_parameters(snet, p, 4), 1);
    assert_false(ndm_array_requires_grad(p[0]));
    ndm_predictor pr = ndm_predictor_load(serve, snet, path);
    assert_true(pr.id);
    values(ndm_predict(pr, idx), got, TOKENS * VOCAB);
    assert_memory_equal(got, want, sizeof got);
    assert_ok(ndm_manager_close(serve));
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(model));
    unlink(path);
}

/* The n floats of a, in out. */
static void floats(ndm_array a, float *out, int64_t n)
{
    assert_int_equal(ndm_array_size(a), n);
    assert_int_equal(ndm_array_dtype(a), NDM_F32);
    values(a, out, (size_t)n);
}

static void assert_near(const float *got, const float *want, int n, float tol, const char *what)
{
    for (int i = 0; i < n; i++)
        if (fabsf(got[i] - want[i]) > tol * (1 + fabsf(want[i])))
            fail_msg("%s %d: %.9g, PyTorch %.9g", what, i, got[i], want[i]);
}

/* PyTorch's tied model, saved by safetensors' save_model (one name of the
 * pair: "head.weight"), loads strictly; its logits, its loss with an
 * ignored target, the shared weight's gradient and one SGD step are
 * PyTorch's. */
static void test_tie_matches_pytorch(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_module net = lm(model, 1, true);
    assert_int_equal(ndm_module_load(net, NDM_TEST_DATA "/torch_tied.safetensors",
                                     NDM_CHECKPOINT_STRICT),
                     2);
    ndm_manager ref = ndm_manager_new(root, "ref");
    const ndm_named_arrays *r =
        ndm_safetensors_load(ref, NDM_TEST_DATA "/torch_tied_ref.safetensors", NDM_LOAD_COPY);
    assert_non_null(r);
    ndm_array tok = r->arrays[ndm_named_arrays_find(r, "tokens")];
    ndm_array tgt = r->arrays[ndm_named_arrays_find(r, "targets")];
    float want[TOKENS * VOCAB], got[TOKENS * VOCAB], g[VOCAB * DIM], wg[VOCAB * DIM];
    ndm_manager b = ndm_manager_new(model, "batch");
    ndm_array w = ndm_module_get_array(net, "tok_emb.weight");
    assert_ok(ndm_grad_begin(b));
    ndm_array logits = ndm_forward_to(b, net, tok);
    ndm_array loss = ndm_cross_entropy(logits, tgt);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    floats(r->arrays[ndm_named_arrays_find(r, "logits")], want, TOKENS * VOCAB);
    floats(logits, got, TOKENS * VOCAB);
    assert_near(got, want, TOKENS * VOCAB, 1e-6f, "logit");
    float lw, lg;
    floats(r->arrays[ndm_named_arrays_find(r, "loss")], &lw, 1);
    floats(loss, &lg, 1);
    assert_near(&lg, &lw, 1, 1e-6f, "loss");
    floats(r->arrays[ndm_named_arrays_find(r, "grad")], wg, VOCAB * DIM);
    floats(ndm_grad_to(b, w), g, VOCAB * DIM);
    assert_near(g, wg, VOCAB * DIM, 1e-6f, "gradient");
    ndm_optimizer opt = ndm_sgd(model, net, 0.5, 0.0, 0.0);
    assert_true(opt.id);
    assert_ok(ndm_optimizer_step(opt));
    floats(r->arrays[ndm_named_arrays_find(r, "stepped")], wg, VOCAB * DIM);
    floats(w, g, VOCAB * DIM);
    assert_near(g, wg, VOCAB * DIM, 1e-6f, "weight after a step");
    assert_ok(ndm_manager_close(ref));
    assert_ok(ndm_manager_close(model));
}

/* Every refusal: a clear status and message, and the module as it was
 * (same arrays under every name, nothing released or made). */
static void test_tie_refuses_bad_input_unchanged(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(4);
    ndm_module net = lm(model, 2, false);
    /* a parameter of another shape, and one of another dtype */
    ndm_module extra = ndm_module_new(model, &lm_type, NULL);
    assert_ok(ndm_module_register_child(extra, "fc", ndm_linear(model, DIM, 3, true, &rng)));
    assert_ok(ndm_module_register_parameter(
        extra, "w64", ndm_zeros(model, NDM_F64, NDM_SHAPE(VOCAB, DIM))));
    assert_ok(ndm_module_register_child(net, "extra", extra));
    ndm_array before[8];
    int ns = ndm_module_named_state(net, NULL, before, 8);
    assert_int_equal(ns, 6);
    uint64_t live = test_live_arrays(model);
    static const struct {
        const char *name, *to;
        ndm_status st;
        const char *says;
    } bad[] = {
        {"head.weight", "nothing", NDM_E_INVALID, "holds no parameter named 'nothing'"},
        {"head.wieght", "tok_emb.weight", NDM_E_INVALID, "holds no parameter named 'head.wieght'"},
        {NULL, "tok_emb.weight", NDM_E_INVALID, "a parameter name is NULL"},
        {"head.weight", NULL, NDM_E_INVALID, "a parameter name is NULL"},
        {"scale", "tok_emb.weight", NDM_E_INVALID, "'scale' is a buffer, not a parameter"},
        {"head.weight", "scale", NDM_E_INVALID, "'scale' is a buffer, not a parameter"},
        {"head.weight", "head.weight", NDM_E_INVALID, "cannot be tied to itself"},
        {"extra.fc.weight", "tok_emb.weight", NDM_E_SHAPE,
         "tied parameters have one dtype, device and shape"},
        {"extra.w64", "tok_emb.weight", NDM_E_DTYPE, "'extra.w64' is"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ndm_clear_error();
        ndm_status st = ndm_module_tie(net, bad[i].name, bad[i].to);
        if (st != bad[i].st || !strstr(ndm_last_error(), bad[i].says))
            fail_msg("case %zu: %s \"%s\", expected %s with \"%s\"", i, ndm_status_name(st),
                     ndm_last_error(), ndm_status_name(bad[i].st), bad[i].says);
        ndm_array now[8];
        assert_int_equal(ndm_module_named_state(net, NULL, now, 8), ns);
        for (int k = 0; k < ns; k++)
            assert_int_equal(now[k].id, before[k].id);
        assert_int_equal(ndm_module_parameters(net, NULL, 0), 5);
        assert_int_equal(test_live_arrays(model), live);
    }
    /* a parameter moved to another model is not the module's to share */
    ndm_manager other = ndm_manager_new(root, "other");
    ndm_array head_w = ndm_module_get_array(net, "head.weight");
    assert_ok(ndm_attach(head_w, other));
    ndm_clear_error();
    assert_int_equal(ndm_module_tie(net, "tok_emb.weight", "head.weight"), NDM_E_NOT_OWNER);
    assert_error_has("parameters of different models cannot be tied");
    assert_error_has("/other', not in the module's model");
    assert_true(ndm_array_valid(head_w));
    assert_int_equal(ndm_module_get_array(net, "tok_emb.weight").id, before[1].id);
    /* a stale module */
    ndm_manager gone = ndm_manager_new(root, "gone");
    ndm_module dead = lm(gone, 1, false);
    assert_ok(ndm_manager_close(gone));
    assert_int_equal(ndm_module_tie(dead, "head.weight", "tok_emb.weight"), NDM_E_CLOSED);
    ndm_clear_error();
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_tie_makes_one_array_of_two_names),
        TEST(test_tie_gradient_sums_both_uses_and_is_updated_once),
        TEST(test_tie_checkpoints_hold_both_names_and_load_either),
        TEST(test_tie_serves_from_a_predictor_built_without_gradients),
        TEST(test_tie_matches_pytorch),
        TEST(test_tie_refuses_bad_input_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
