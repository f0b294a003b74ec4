/* The list macros in C++: each argument is evaluated once, as in C (the
 * count is taken without evaluating it), so a layer, an array or a draw in
 * a list happens once, whichever compiler orders the arguments. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ndm/ndm.h>

#include "expect.h"

static int calls;
static int64_t dim(int64_t v)
{
    calls++;
    return v;
}
static int axis(int v)
{
    calls++;
    return v;
}

static int64_t live(ndm_manager m)
{
    ndm_stats st;
    ndm_device cpu = {NDM_DEVICE_CPU, 0};
    return ndm_manager_stats(m, cpu, 0, &st) == NDM_OK ? (int64_t)st.live_arrays : -1;
}

int main()
{
    ndm_manager m = ndm_manager_new(ndm_system(), "cxx");
    EXPECT(m.id != 0);

    calls = 0; /* NDM_SHAPE */
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(dim(2), dim(3)));
    EXPECT(calls == 2 && ndm_array_size(a) == 6);

    calls = 0; /* NDM_AXES */
    double v = 0;
    EXPECT(ndm_item(ndm_sum(a, false, NDM_AXES(axis(0), axis(1))), &v) == NDM_OK && v == 6.0);
    EXPECT(calls == 2);

    int64_t before = live(m); /* NDM_ARRAYS: two inputs made once, one result */
    ndm_array c = ndm_concat(0, NDM_ARRAYS(ndm_add(a, a), ndm_mul(a, a)));
    EXPECT(c.id != 0 && ndm_array_dim(c, 0) == 4);
    EXPECT(live(m) == before + 3);

    /* ndm_attach_all with a literal list: each array made once and moved,
     * and ndm_manager_move takes the subtree along */
    ndm_manager dst = ndm_manager_new(m, "dst");
    ndm_manager sub = ndm_manager_new(m, "sub");
    before = live(m);
    EXPECT(ndm_attach_all(sub, NDM_ARRAYS(ndm_add(a, a), ndm_mul(a, a))) == NDM_OK);
    EXPECT(live(m) == before && live(sub) == 2);
    EXPECT(ndm_manager_move(sub, dst) == NDM_OK && ndm_manager_parent(sub).id == dst.id);
    EXPECT(ndm_manager_close(dst) == NDM_OK && !ndm_manager_valid(sub));

    /* ndm_index with NDM_ARRAYS: the array and the index array made once */
    int64_t iv[2] = {1, -2};
    ndm_array idx = ndm_from_buffer(m, NDM_I64, iv, NDM_SHAPE(2));
    before = live(m);
    ndm_array x = ndm_index(ndm_add(a, a), NDM_ARRAYS(ndm_astype(idx, NDM_I32)));
    EXPECT(x.id != 0 && ndm_array_dim(x, 0) == 2 && ndm_array_dim(x, 1) == 3);
    EXPECT(live(m) == before + 3);

    /* the new index calls' macros from C++: each argument made once */
    before = live(m);
    ndm_array sv = NDM_NULL_ARRAY, si = NDM_NULL_ARRAY;
    EXPECT(ndm_topk(ndm_add(a, a), 2, -1, true, &sv, &si) == NDM_OK);
    EXPECT(ndm_array_dim(sv, 1) == 2 && ndm_array_dtype(si) == NDM_I64);
    ndm_array st = ndm_triu(ndm_sort(ndm_add(a, a), 0, true), 0);
    EXPECT(st.id != 0 && live(m) == before + 6);
    ndm_rng gen = ndm_rng_new(3);
    ndm_array draws = ndm_multinomial(ndm_tri(m, NDM_F32, 3, 3, 0), 2, true, &gen);
    EXPECT(draws.id != 0 && ndm_array_dim(draws, 1) == 2 && gen.offset == 3);

    /* NDM_MODULES: each layer built once, so the model holds one layer's
     * parameters each, and the same weights under every compiler */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_rng rng = ndm_rng_new(7);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 3, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 3, 2, false, &rng)));
    EXPECT(net.id != 0);
    ndm_array p[3] = {NDM_NULL_ARRAY, NDM_NULL_ARRAY, NDM_NULL_ARRAY};
    EXPECT(ndm_module_parameters(net, p, 3) == 3);
    /* the same layers one by one, from the same seed */
    ndm_rng same = ndm_rng_new(7);
    ndm_manager ref = ndm_manager_new(m, "ref");
    ndm_module first = ndm_linear(ref, 4, 3, true, &same);
    EXPECT(ndm_relu_module(ref).id != 0 && ndm_linear(ref, 3, 2, false, &same).id != 0);
    EXPECT(live(model) == live(ref));
    if (live(model) != live(ref))
        std::fprintf(stderr, "the model holds %lld arrays, the same layers %lld\n",
                     (long long)live(model), (long long)live(ref));
    ndm_array q[2] = {NDM_NULL_ARRAY, NDM_NULL_ARRAY};
    EXPECT(ndm_module_parameters(first, q, 2) == 2);
    double s1 = 0, s2 = 0;
    EXPECT(ndm_item(ndm_sum(p[0], false, NDM_ALL_AXES_LIST), &s1) == NDM_OK &&
           ndm_item(ndm_sum(q[0], false, NDM_ALL_AXES_LIST), &s2) == NDM_OK && s1 == s2);

    /* ndm_forward_n with NDM_ARRAYS and ndm_module_list with NDM_MODULES:
     * each input made once, each layer once */
    ndm_module body = ndm_module_list(model, NDM_MODULES(ndm_linear(model, 3, 3, true, &rng)));
    EXPECT(body.id != 0 && ndm_module_named_children(body, nullptr, nullptr, 0) == 1);
    ndm_array in = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 4));
    before = live(m);
    ndm_array y = ndm_forward_n(net, NDM_ARRAYS(ndm_add(in, in)));
    EXPECT(y.id != 0 && ndm_array_dim(y, 1) == 2);
    EXPECT(live(m) == before + 2);
    /* the batcher from C++: its options as a named struct (C's compound
     * literal is not C++), each macro argument evaluated once */
    ndm_predictor pr = ndm_predictor_new(model, net);
    ndm_batcher_options bo = {};
    bo.max_batch = 4;
    int made = 0, asked = 0;
    ndm_batcher b = ndm_batcher_new((made++, pr), &bo);
    ndm_array one = ndm_ones(m, NDM_F32, NDM_SHAPE(1, 4));
    ndm_array ans = ndm_batcher_predict_to(m, (asked++, b), one, 0);
    ndm_array want = ndm_predict_to(m, pr, one);
    float av[2] = {0, 0}, wv[2] = {1, 1};
    EXPECT(made == 1 && asked == 1 && b.id != 0 && ans.id != 0 && ndm_array_dim(ans, 1) == 2);
    EXPECT(ndm_array_copy_out(ans, av, sizeof av) == NDM_OK &&
           ndm_array_copy_out(want, wv, sizeof wv) == NDM_OK && av[0] == wv[0] && av[1] == wv[1]);
    EXPECT(ndm_batcher_close(b) == NDM_OK);

    /* plans and graphs: each argument once (a CPU manager has no graphs) */
    int planned = 0, sigs = 0;
    ndm_plan plan = ndm_plan_new((planned++, m), 2);
    ndm_manager pst = ndm_manager_new_planned(m, "step", (planned++, plan), (uint64_t)(sigs++, 3));
    EXPECT(plan.id != 0 && pst.id != 0 && planned == 2 && sigs == 1);
    EXPECT(ndm_manager_close(pst) == NDM_OK);
    ndm_step_fn step_fn = [](ndm_manager, void *) -> ndm_status { return NDM_OK; };
    ndm_graph gr = ndm_graph_capture(m, "step", plan, (uint64_t)(sigs++, 3), step_fn, nullptr);
    EXPECT(gr.id == 0 && sigs == 2 && ndm_last_status() == NDM_E_UNSUPPORTED);
    ndm_graph none = NDM_NULL_GRAPH;
    EXPECT(ndm_graph_launch(none) == NDM_E_NULL && ndm_graph_close(none) == NDM_E_NULL);
    ndm_graph_info gi;
    EXPECT(ndm_graph_get_info(none, &gi) == NDM_E_NULL);
    ndm_predictor_graph_stats pgs;
    EXPECT(ndm_predictor_use_graphs(pr, 2) == NDM_E_UNSUPPORTED &&
           ndm_predictor_get_graph_stats(pr, &pgs) == NDM_OK && pgs.launched == 0);
    ndm_clear_error();

    /* a step under a byte budget from C++, with a layer marked ALWAYS:
     * the loss's gradient of the unbudgeted step, bit for bit */
    ndm_manager layers = ndm_manager_new(m, "layers");
    ndm_module fc1 = ndm_linear(layers, 4, 8, true, &rng),
               fc2 = ndm_linear(layers, 8, 2, true, &rng);
    ndm_module mlp = ndm_sequential(layers, NDM_MODULES(fc1, ndm_relu_module(layers), fc2));
    ndm_array w[4] = {NDM_NULL_ARRAY, NDM_NULL_ARRAY, NDM_NULL_ARRAY, NDM_NULL_ARRAY};
    EXPECT(mlp.id != 0 && ndm_module_parameters(mlp, w, 4) == 4);
    float grads[2][32] = {};
    for (int run = 0; run < 2; run++) {
        EXPECT(ndm_zero_grad(4, w) == NDM_OK);
        EXPECT(ndm_module_set_recompute(fc1, run ? NDM_RECOMPUTE_ALWAYS : NDM_RECOMPUTE_AUTO) ==
               NDM_OK);
        ndm_manager step = ndm_manager_new(m, "step");
        EXPECT((run ? ndm_grad_begin_budget(step, 1u << 20) : ndm_grad_begin(step)) == NDM_OK);
        ndm_array loss = ndm_sum(ndm_forward(mlp, ndm_ones(step, NDM_F32, NDM_SHAPE(3, 4))), false,
                                 NDM_ALL_AXES_LIST);
        EXPECT(ndm_backward(loss) == NDM_OK);
        ndm_grad_budget_stats bs = {};
        EXPECT(ndm_grad_budget_get_stats(&bs) == (run ? NDM_OK : NDM_E_INVALID));
        EXPECT(!run || bs.recomputations == 1);
        (void)ndm_grad_end();
        EXPECT(ndm_array_copy_out(ndm_grad_to(step, w[0]), grads[run], sizeof grads[run]) ==
               NDM_OK);
        EXPECT(ndm_manager_close(step) == NDM_OK);
    }
    EXPECT(std::memcmp(grads[0], grads[1], sizeof grads[0]) == 0);

    EXPECT(ndm_manager_close(m) == NDM_OK);
    if (failures)
        std::fprintf(stderr, "%d failure(s)\n", failures);
    else
        std::printf("list macros: every argument evaluated once\n");
    return failures ? 1 : 0;
}
