/* Training within a byte budget: a step under half its peak, or less,
 * gives the unbudgeted step's loss and gradients bit for bit (the MLP, the
 * CNN, the transformer, dropout); a budget below one operation fails at once
 * naming it; the dump counts what was recomputed; modules marked keep or
 * always; no_grad regions and planned managers under a budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fashion_net.h"
#include "helpers.h"
#include "ndm/ndm.h"
#include "text_corpus.h"
#include "text_model.h"

enum { ARCH_MLP, ARCH_CNN, ARCH_GPT, ARCH_DROPOUT };

/* What one step gave: the loss, every gradient, bytes, and the budget's work. */
typedef struct step_out {
    float loss;
    float *grads;
    size_t ngrad;
    int64_t peak;
    ndm_grad_budget_stats bs;
    char dump[4096];
} step_out;

static const text_config gpt_cfg = {TEXT_VOCAB, 16, 32, 4, 3};

/* The device the steps run on: the CPU, or cuda:0 for the tests at the end. */
static ndm_device dev = {NDM_DEVICE_CPU, 0};

/* The model of `arch`, the same for the same arch (fixed seeds); the
 * module marked `mark` (an index among the model's top children) gets mode. */
static ndm_module build(ndm_manager model, int arch, const char *mark, ndm_recompute mode)
{
    ndm_rng rng = ndm_rng_new(11);
    ndm_module net;
    if (arch == ARCH_GPT) {
        net = text_model_new(model, &gpt_cfg, &rng);
    } else if (arch == ARCH_DROPOUT) {
        net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 784, 64, true, &rng),
                                                ndm_relu_module(model),
                                                ndm_dropout_module(model, 0.3, 99),
                                                ndm_linear(model, 64, 64, true, &rng),
                                                ndm_gelu_module(model),
                                                ndm_dropout_module(model, 0.2, 7),
                                                ndm_linear(model, 64, 10, true, &rng)));
    } else {
        net = fashion_net(model, arch == ARCH_CNN ? "cnn" : "mlp", &rng);
    }
    if (net.id && mark && ndm_module_set_recompute(ndm_module_get_child(net, mark), mode) != NDM_OK)
        return (ndm_module){0};
    return net;
}

/* The loss of one batch of arch's data on net, recorded by the caller. */
static ndm_array loss_of(ndm_manager batch, ndm_module net, int arch)
{
    enum { N = 8, T = 16 };
    if (arch == ARCH_GPT) {
        int64_t ids[N / 2 * T], next[N / 2 * T];
        for (int i = 0; i < N / 2 * T; i++) {
            ids[i] = (i * 37 + 11) % TEXT_VOCAB;
            next[i] = (i * 53 + 5) % TEXT_VOCAB;
        }
        ndm_array tok = ndm_from_buffer(batch, NDM_I64, ids, NDM_SHAPE(N / 2, T));
        ndm_array tgt = ndm_from_buffer(batch, NDM_I64, next, NDM_SHAPE(N / 2 * T));
        ndm_array logits = ndm_forward(net, tok);
        return ndm_cross_entropy(ndm_reshape(logits, NDM_SHAPE(N / 2 * T, TEXT_VOCAB)), tgt);
    }
    /* rows enough that activations, not the weights, make the peak */
    int64_t rows = arch == ARCH_CNN ? 4 * N : 64 * N;
    ndm_rng data = ndm_rng_new(5);
    ndm_array x = ndm_uniform(batch, &data, NDM_F32, 0.0, 1.0, NDM_SHAPE(rows, 784));
    ndm_array y = ndm_randint(batch, &data, NDM_I64, 0, 10, NDM_SHAPE(rows));
    return ndm_cross_entropy(ndm_forward(net, fashion_input(x, arch == ARCH_CNN)), y);
}

/* One training step of arch under `budget` bytes (0: none). */
static ndm_status step(ndm_manager root, int arch, uint64_t budget, const char *mark, ndm_recompute mode,
                       step_out *o)
{
    memset(o, 0, sizeof *o);
    ndm_manager model = ndm_manager_new_on(root, "model", dev);
    ndm_module net = build(model, arch, mark, mode);
    assert_live(net);
    ndm_array params[128];
    int np = ndm_module_parameters(net, params, 128);
    assert_true(np > 0 && np <= 128);
    ndm_manager batch = ndm_manager_new_on(root, "batch", dev);
    int64_t before = 0, peak = 0;
    assert_ok(ndm_memory_reset_peak_stats(dev));
    assert_ok(ndm_memory_stat_get(dev, "requested_bytes.all.current", &before));
    ndm_status st = budget ? ndm_grad_begin_budget(batch, budget) : ndm_grad_begin(batch);
    assert_ok(st);
    ndm_array loss = loss_of(batch, net, arch);
    st = loss.id ? ndm_backward(loss) : ndm_last_status();
    if (budget)
        assert_ok(ndm_grad_budget_get_stats(&o->bs));
    (void)ndm_grad_end();
    assert_ok(ndm_memory_stat_get(dev, "requested_bytes.all.peak", &peak));
    o->peak = peak - before;
    if (st == NDM_OK) {
        assert_ok(ndm_array_copy_out(loss, &o->loss, sizeof o->loss));
        for (int i = 0; i < np; i++)
            o->ngrad += (size_t)ndm_array_size(params[i]);
        o->grads = malloc(o->ngrad * sizeof *o->grads);
        size_t at = 0;
        for (int i = 0; i < np; i++) {
            ndm_array g = ndm_grad_to(batch, params[i]);
            size_t n = (size_t)ndm_array_size(params[i]);
            assert_ok(ndm_array_copy_out(g, o->grads + at, n * sizeof *o->grads));
            at += n;
        }
        FILE *f = fmemopen(o->dump, sizeof o->dump - 1, "w");
        assert_ok(ndm_debug_dump(batch, f));
        fclose(f);
    }
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
    return st;
}

/* Budgeted at `frac` of the unbudgeted step's peak (with the child `mark`
 * of the model, if any, marked NDM_RECOMPUTE_ALWAYS): the same bits, and
 * autograd dropped and recomputed. */
static void same_bits_at(void **state, int arch, double frac, const char *mark)
{
    step_out plain, tight;
    assert_ok(step(ROOT(state), arch, 0, NULL, NDM_RECOMPUTE_AUTO, &plain));
    uint64_t budget = (uint64_t)((double)plain.peak * frac);
    assert_ok(step(ROOT(state), arch, budget, mark, NDM_RECOMPUTE_ALWAYS, &tight));
    assert_true(tight.peak <= (int64_t)budget);
    assert_true(tight.bs.drops > 0);
    assert_true(tight.bs.recomputations > 0);
    assert_true(tight.bs.recomputed_bytes > 0);
    assert_memory_equal(&plain.loss, &tight.loss, sizeof plain.loss);
    assert_int_equal(plain.ngrad, tight.ngrad);
    assert_memory_equal(plain.grads, tight.grads, plain.ngrad * sizeof *plain.grads);
    /* the graph's dump line says how much was recomputed */
    char want[64];
    snprintf(want, sizeof want, "recomputed %llu", (unsigned long long)tight.bs.recomputed_bytes);
    if (!strstr(tight.dump, want))
        fail_msg("the dump lacks \"%s\":\n%s", want, tight.dump);
    assert_null(strstr(plain.dump, "recomputed"));
    free(plain.grads);
    free(tight.grads);
}

/* The MLP's and the CNN's peak is their input and first layers' arrays
 * with their gradients, which recomputation cannot lower: there a layer
 * marked ALWAYS makes the recomputation happen; the transformer's blocks
 * are recomputed under a quarter and a sixth of its unbudgeted peak. */
static void test_budget_mlp_same_bits(void **state) { same_bits_at(state, ARCH_MLP, 0.9, "1"); }
static void test_budget_cnn_same_bits(void **state) { same_bits_at(state, ARCH_CNN, 0.65, "3"); }
static void test_budget_gpt_same_bits(void **state) { same_bits_at(state, ARCH_GPT, 0.25, NULL); }
static void test_budget_gpt_sixth_same_bits(void **state)
{
    same_bits_at(state, ARCH_GPT, 0.16, NULL);
}
static void test_budget_dropout_same_bits(void **state)
{
    same_bits_at(state, ARCH_DROPOUT, 0.7, "2");
}

/* A budget below what one operation needs fails at once, naming it. */
static void test_budget_below_one_op_fails(void **state)
{
    step_out o;
    assert_status(step(ROOT(state), ARCH_CNN, 4096, NULL, NDM_RECOMPUTE_AUTO, &o), NDM_E_QUOTA);
    assert_error_has("bytes more");
    assert_error_has("over the budget of 4096 bytes");
    assert_error_has("ndm_");
}

/* A generous budget changes nothing and drops nothing. */
static void test_budget_roomy_drops_nothing(void **state)
{
    step_out plain, roomy;
    assert_ok(step(ROOT(state), ARCH_GPT, 0, NULL, NDM_RECOMPUTE_AUTO, &plain));
    assert_ok(step(ROOT(state), ARCH_GPT, 1u << 30, NULL, NDM_RECOMPUTE_AUTO, &roomy));
    assert_true(roomy.bs.units > 0);
    assert_int_equal(roomy.bs.recomputations, 0);
    assert_memory_equal(plain.grads, roomy.grads, plain.ngrad * sizeof *plain.grads);
    free(plain.grads);
    free(roomy.grads);
}

/* ALWAYS: dropped and recomputed with room to spare; KEEP: never dropped. */
static void test_budget_always_and_keep(void **state)
{
    step_out plain, always, keep;
    assert_ok(step(ROOT(state), ARCH_GPT, 0, NULL, NDM_RECOMPUTE_AUTO, &plain));
    /* the final norm: a unit of its own (the head reads its result),
     * dropped before backward with room to spare */
    assert_ok(step(ROOT(state), ARCH_GPT, 1u << 30, "norm_f", NDM_RECOMPUTE_ALWAYS, &always));
    assert_true(always.bs.recomputations >= 1);
    assert_memory_equal(&plain.loss, &always.loss, sizeof plain.loss);
    assert_memory_equal(plain.grads, always.grads, plain.ngrad * sizeof *plain.grads);
    /* the MLP's first layer kept: its arrays are never dropped */
    step_out mlp;
    assert_ok(step(ROOT(state), ARCH_MLP, 0, NULL, NDM_RECOMPUTE_AUTO, &mlp));
    assert_ok(step(ROOT(state), ARCH_MLP, (uint64_t)mlp.peak * 9 / 10, "1", NDM_RECOMPUTE_KEEP, &keep));
    assert_int_equal(keep.bs.recomputations, 0); /* the first layer's unit was not made */
    assert_memory_equal(mlp.grads, keep.grads, mlp.ngrad * sizeof *mlp.grads);
    free(plain.grads);
    free(always.grads);
    free(mlp.grads);
    free(keep.grads);
}

/* A snapshot taken with history on shows the recomputation as a frame of
 * the allocations it made. */
static void test_budget_snapshot_marks_recompute(void **state)
{
    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ndm-budget-snapshot-%d.json", tmp && *tmp ? tmp : P_tmpdir,
             (int)getpid());
    assert_ok(ndm_memory_record_history(true, 100000));
    step_out o;
    assert_ok(step(ROOT(state), ARCH_MLP, 1u << 30, "1", NDM_RECOMPUTE_ALWAYS, &o));
    assert_true(o.bs.recomputations > 0);
    assert_ok(ndm_memory_dump_snapshot(path));
    assert_ok(ndm_memory_record_history(false, 0));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 24];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    remove(path);
    buf[n] = 0;
    assert_non_null(strstr(buf, "\"recompute\""));
    free(o.grads);
}

/* A bad mode is refused with a message. */
static void test_budget_bad_mode(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module relu = ndm_relu_module(model);
    assert_status(ndm_module_set_recompute(relu, (ndm_recompute)7), NDM_E_INVALID);
    assert_error_has("not a recompute mode");
    assert_status(ndm_grad_begin_budget(model, 0), NDM_E_INVALID);
    ndm_grad_budget_stats bs;
    assert_status(ndm_grad_budget_get_stats(NULL), NDM_E_INVALID);
    (void)bs;
    assert_ok(ndm_manager_close(model));
}

/* no_grad inside a budgeted step: an evaluation pass records nothing and
 * the training step after it still gives the same bits. */
static void test_budget_no_grad(void **state)
{
    step_out plain;
    assert_ok(step(ROOT(state), ARCH_MLP, 0, NULL, NDM_RECOMPUTE_AUTO, &plain));
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = build(model, ARCH_MLP, "1", NDM_RECOMPUTE_ALWAYS);
    ndm_array params[16];
    int np = ndm_module_parameters(net, params, 16);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    assert_ok(ndm_grad_begin_budget(batch, (uint64_t)plain.peak * 3 / 2));
    ndm_no_grad_begin();
    ndm_array ev = loss_of(batch, net, ARCH_MLP);
    ndm_no_grad_end();
    assert_live(ev);
    assert_ok(ndm_array_release(ev));
    ndm_grad_budget_stats none;
    assert_ok(ndm_grad_budget_get_stats(&none));
    assert_int_equal(none.units, 0); /* the pass without gradients recorded nothing */
    ndm_array loss = loss_of(batch, net, ARCH_MLP);
    assert_ok(ndm_backward(loss));
    ndm_grad_budget_stats bs;
    assert_ok(ndm_grad_budget_get_stats(&bs));
    assert_true(bs.recomputations > 0);
    (void)ndm_grad_end();
    float *g = malloc(plain.ngrad * sizeof *g);
    size_t at = 0;
    for (int i = 0; i < np; i++) {
        size_t n = (size_t)ndm_array_size(params[i]);
        assert_ok(ndm_array_copy_out(ndm_grad_to(batch, params[i]), g + at, n * sizeof *g));
        at += n;
    }
    assert_memory_equal(plain.grads, g, plain.ngrad * sizeof *g);
    free(g);
    free(plain.grads);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* A planned batch under a budget: two steps of one signature give the
 * unbudgeted gradients. */
static void test_budget_planned(void **state)
{
    step_out plain;
    assert_ok(step(ROOT(state), ARCH_MLP, 0, NULL, NDM_RECOMPUTE_AUTO, &plain));
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_module net = build(model, ARCH_MLP, "1", NDM_RECOMPUTE_ALWAYS);
    ndm_array params[16];
    int np = ndm_module_parameters(net, params, 16);
    ndm_plan plan = ndm_plan_new(ROOT(state), 4);
    assert_true(plan.id != 0);
    float *g = malloc(plain.ngrad * sizeof *g);
    for (int s = 0; s < 2; s++) {
        assert_ok(ndm_zero_grad((size_t)np, params));
        ndm_manager batch = ndm_manager_new_planned(ROOT(state), "batch", plan, 1);
        assert_live(batch);
        assert_ok(ndm_grad_begin_budget(batch, (uint64_t)plain.peak * 9 / 10));
        ndm_array loss = loss_of(batch, net, ARCH_MLP);
        assert_ok(ndm_backward(loss));
        ndm_grad_budget_stats bs;
        assert_ok(ndm_grad_budget_get_stats(&bs));
        assert_true(bs.recomputations > 0);
        (void)ndm_grad_end();
        size_t at = 0;
        for (int i = 0; i < np; i++) {
            size_t n = (size_t)ndm_array_size(params[i]);
            assert_ok(ndm_array_copy_out(ndm_grad_to(batch, params[i]), g + at, n * sizeof *g));
            at += n;
        }
        assert_memory_equal(plain.grads, g, plain.ngrad * sizeof *g);
        assert_ok(ndm_manager_close(batch));
    }
    free(g);
    free(plain.grads);
    assert_ok(ndm_plan_close(plan));
    assert_ok(ndm_manager_close(model));
}

/* The same on cuda:0 (the host stand-in in the unit suite), skipped
 * without a CUDA module. */
static bool on_cuda(void **state)
{
    ndm_manager gpu = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(0));
    ndm_array probe = gpu.id ? ndm_zeros(gpu, NDM_F32, NDM_SHAPE(1)) : NDM_NULL_ARRAY;
    if (gpu.id)
        assert_ok(ndm_manager_close(gpu));
    if (!probe.id) {
        ndm_clear_error();
        print_message("no CUDA device: skipped\n");
        return false;
    }
    dev = NDM_CUDA(0);
    return true;
}

static void test_budget_cuda_gpt_same_bits(void **state)
{
    if (!on_cuda(state))
        skip();
    same_bits_at(state, ARCH_GPT, 0.25, NULL);
    dev = NDM_CPU;
}

static void test_budget_cuda_cnn_dropout_same_bits(void **state)
{
    if (!on_cuda(state))
        skip();
    same_bits_at(state, ARCH_CNN, 0.65, "3");
    same_bits_at(state, ARCH_DROPOUT, 0.7, "2");
    dev = NDM_CPU;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_budget_mlp_same_bits),       TEST(test_budget_cnn_same_bits),
        TEST(test_budget_gpt_same_bits),       TEST(test_budget_gpt_sixth_same_bits),
        TEST(test_budget_dropout_same_bits),   TEST(test_budget_below_one_op_fails),
        TEST(test_budget_roomy_drops_nothing), TEST(test_budget_always_and_keep),
        TEST(test_budget_snapshot_marks_recompute), TEST(test_budget_bad_mode),            TEST(test_budget_no_grad),
        TEST(test_budget_planned),             TEST(test_budget_cuda_gpt_same_bits),
        TEST(test_budget_cuda_cnn_dropout_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
