/* Planned managers: a recorded step replayed from an arena gives the values
 * of an unplanned run with no allocator call per array; deviations fall back
 * (counted) and never share memory with a live array; the plan cache's LRU
 * bound, closes and bad handles. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"

#define IN 64
#define HID 96
#define OUT 10
#define STEPS 20

/* ---- an MLP training step ----------------------------------------------------------- */

typedef struct mlp {
    ndm_manager model;
    ndm_module net;
    ndm_optimizer opt;
} mlp;

static mlp mlp_new(ndm_manager root)
{
    mlp n;
    n.model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(7);
    ndm_module mods[3] = {ndm_linear(n.model, IN, HID, true, &rng), ndm_relu_module(n.model),
                          ndm_linear(n.model, HID, OUT, true, &rng)};
    n.net = ndm_sequential(n.model, 3, mods);
    assert_live(n.net);
    n.opt = ndm_adam(n.model, n.net, 1e-2, 0.9, 0.999, 1e-8, 0);
    assert_true(n.opt.id != 0);
    return n;
}

/* The inputs and labels of step `step`, `rows` of them, from a fixed formula. */
static void batch_data(int step, int rows, float *x, int64_t *y)
{
    for (int i = 0; i < rows * IN; i++)
        x[i] = (float)sin(0.37 * i + 1.3 * step) * 0.5f;
    for (int i = 0; i < rows; i++)
        y[i] = (i * 7 + step) % OUT;
}

/* One step in `batch` (closed here): forward, backward, optimizer; the loss. */
static ndm_stats last_batch; /* the batch's figures just before its close */

static double mlp_step(mlp *n, ndm_manager batch, int step, int rows)
{
    assert_live(batch);
    float *x = malloc(sizeof *x * (size_t)rows * IN);
    int64_t *y = malloc(sizeof *y * (size_t)rows);
    assert_non_null(x);
    assert_non_null(y);
    batch_data(step, rows, x, y);
    ndm_array xa = ndm_empty(batch, NDM_F32, NDM_SHAPE(rows, IN));
    ndm_array ya = ndm_empty(batch, NDM_I64, NDM_SHAPE(rows));
    assert_ok(ndm_array_copy_in(xa, x, sizeof *x * (size_t)rows * IN));
    assert_ok(ndm_array_copy_in(ya, y, sizeof *y * (size_t)rows));
    free(x);
    free(y);
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(n->net, xa), ya);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_optimizer_step(n->opt));
    assert_ok(ndm_optimizer_zero_grad(n->opt));
    double l;
    assert_ok(ndm_item(loss, &l));
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &last_batch));
    assert_ok(ndm_manager_close(batch));
    return l;
}

static void params_equal(ndm_module a, ndm_module b)
{
    ndm_array pa[8], pb[8];
    int na = ndm_module_parameters(a, pa, 8), nb = ndm_module_parameters(b, pb, 8);
    assert_int_equal(na, nb);
    assert_true(na == 4);
    for (int i = 0; i < na; i++) {
        int64_t n = ndm_array_size(pa[i]);
        assert_int_equal(n, ndm_array_size(pb[i]));
        assert_memory_equal(ndm_array_data(pa[i]), ndm_array_data(pb[i]), (size_t)n * 4);
    }
}

static ndm_memory_stats mem_now(void)
{
    ndm_memory_stats s;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &s));
    return s;
}

static void test_plan_mlp_training_bit_identical(void **state)
{
    ndm_manager root = ROOT(state);
    mlp a = mlp_new(root), b = mlp_new(root);
    ndm_plan plan = ndm_plan_new(b.model, 4);
    assert_true(plan.id != 0);
    ndm_manager ta = ndm_manager_new(a.model, "trainer"), tb = ndm_manager_new(b.model, "trainer");
    ndm_plan_stats ps;
    for (int step = 0; step < STEPS; step++) {
        double la = mlp_step(&a, ndm_manager_new(ta, "batch"), step, 32);
        ndm_stats sa = last_batch;
        ndm_memory_stats before = mem_now();
        double lb = mlp_step(&b, ndm_manager_new_planned(tb, "batch", plan, 32), step, 32);
        ndm_memory_stats after = mem_now();
        /* The tree counts a planned step as it counts any. */
        assert_int_equal(last_batch.created, sa.created);
        assert_int_equal(last_batch.released, sa.released);
        assert_int_equal(last_batch.live_bytes, sa.live_bytes);
        assert_int_equal(last_batch.peak_bytes, sa.peak_bytes);
        if (memcmp(&la, &lb, sizeof la))
            fail_msg("step %d: loss %.17g planned, %.17g not", step, lb, la);
        assert_ok(ndm_plan_get_stats(plan, &ps));
        if (step == 0) {
            assert_int_equal(ps.recorded, 1);
            assert_int_equal(ps.hits, 0);
        }
        if (step == 1) /* the first replay takes its arena: one allocation */
            assert_int_equal(after.allocation[NDM_POOL_ALL].allocated -
                                 before.allocation[NDM_POOL_ALL].allocated,
                             1);
        if (step >= 2) {
            /* The arena a finished step gave back serves the next: no
             * allocator call at all for the step's arrays and scratch. */
            assert_int_equal(after.allocation[NDM_POOL_ALL].allocated,
                             before.allocation[NDM_POOL_ALL].allocated);
            assert_int_equal(after.num_thread_cache_allocs, before.num_thread_cache_allocs);
        }
    }
    params_equal(a.net, b.net);
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.fallbacks, 0);
    assert_int_equal(ps.recorded, 1);
    assert_int_equal(ps.replayed, STEPS - 1);
    assert_int_equal(ps.arena_allocs, 1);
    ndm_plan_entry pe;
    assert_ok(ndm_plan_get_entry(plan, 32, &pe));
    assert_true(pe.blocks > 10);
    assert_true(ps.hits >= pe.blocks * (STEPS - 1)); /* (and kernel scratch) */
    assert_int_equal(ps.arena_bytes, (pe.arena_bytes + 511) / 512 * 512);
    /* The planned step's memory against the most it ever had live at once. */
    assert_true(pe.arena_bytes >= pe.max_live_bytes);
    assert_true((double)pe.arena_bytes <= 1.02 * (double)pe.max_live_bytes);
    assert_true(pe.total_bytes > pe.arena_bytes);
    assert_manager_empty(ta);
    assert_manager_empty(tb);
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
    assert_status(ndm_plan_get_stats(plan, &ps), NDM_E_CLOSED); /* closed with its owner */
}

/* A bigger batch under the signature of a smaller one: every size differs,
 * so the step runs on the caching allocator, with the right values. */
static void test_plan_bigger_batch_falls_back(void **state)
{
    ndm_manager root = ROOT(state);
    mlp a = mlp_new(root), b = mlp_new(root);
    ndm_plan plan = ndm_plan_new(b.model, 2);
    for (int step = 0; step < 3; step++) {
        int rows = step == 2 ? 48 : 16;
        double la = mlp_step(&a, ndm_manager_new(a.model, "batch"), step, rows);
        double lb = mlp_step(&b, ndm_manager_new_planned(b.model, "batch", plan, 16), step, rows);
        assert_memory_equal(&la, &lb, sizeof la);
    }
    params_equal(a.net, b.net);
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_true(ps.hits > 0);     /* step 1 */
    assert_true(ps.fallbacks > 5); /* step 2 */
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
}

/* ---- a step of plain arrays ------------------------------------------------------------- */

#define N1 1000 /* floats */

static ndm_array filled(ndm_manager m, int64_t n, float v)
{
    ndm_array a = ndm_full(m, NDM_F32, v, NDM_SHAPE(n));
    assert_live(a);
    return a;
}

static void check_all(ndm_array a, float v)
{
    const float *p = ndm_array_data(a);
    int64_t n = ndm_array_size(a);
    for (int64_t i = 0; i < n; i++)
        if (p[i] != v)
            fail_msg("element %lld is %g, not %g", (long long)i, p[i], v);
}

/* Record: a, b live together; a released; c made (planned into a's memory). */
static void record_abc(ndm_manager parent, ndm_plan plan)
{
    ndm_manager s = ndm_manager_new_planned(parent, "step", plan, 1);
    ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
    assert_ok(ndm_array_release(a));
    ndm_array c = filled(s, N1, 3);
    check_all(b, 2);
    check_all(c, 3);
    assert_ok(ndm_manager_close(s));
}

static void test_plan_reuse_needs_release(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    record_abc(root, plan);
    /* Replayed as recorded: c takes a's memory. */
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
    ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
    void *pa = ndm_array_data(a);
    assert_ok(ndm_array_release(a));
    ndm_array c = filled(s, N1, 3);
    assert_ptr_equal(ndm_array_data(c), pa);
    check_all(b, 2);
    assert_ok(ndm_manager_close(s));
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.hits, 3);
    assert_int_equal(ps.fallbacks, 0);
    /* a kept while c is made: c must not take its memory. */
    s = ndm_manager_new_planned(root, "step", plan, 1);
    a = filled(s, N1, 1);
    b = filled(s, N1, 2);
    c = filled(s, N1, 3);
    assert_ptr_not_equal(ndm_array_data(c), ndm_array_data(a));
    check_all(a, 1);
    check_all(b, 2);
    check_all(c, 3);
    assert_ok(ndm_manager_close(s));
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.hits, 5);
    assert_int_equal(ps.fallbacks, 1);
    assert_ok(ndm_plan_close(plan));
    assert_status(ndm_plan_close(plan), NDM_ALREADY);
    assert_manager_empty(root);
}

/* Limits see a planned step as any: an array over the limit is refused
 * before any memory is taken, and the plan goes on. */
static void test_plan_limits_apply(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    record_abc(root, plan);
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
    assert_ok(ndm_manager_set_limit(s, NDM_CPU, 2 * N1 * sizeof(float)));
    ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
    assert_true(ndm_full(s, NDM_F32, 3.0, NDM_SHAPE(N1)).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_ok(ndm_array_release(a));
    ndm_array c = filled(s, N1, 3);
    check_all(b, 2);
    check_all(c, 3);
    assert_ok(ndm_manager_close(s));
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.hits, 3);
    assert_int_equal(ps.fallbacks, 0);
    assert_ok(ndm_plan_close(plan));
    assert_manager_empty(root);
}

/* Another order (b's size first) and a size the plan does not have. */
static void test_plan_other_order_falls_back(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 5);
    ndm_array a = filled(s, 100, 1), b = filled(s, 300, 2);
    assert_ok(ndm_manager_close(s));
    s = ndm_manager_new_planned(root, "step", plan, 5);
    b = filled(s, 300, 2);
    a = filled(s, 100, 1);
    ndm_array c = filled(s, 77, 4);
    check_all(a, 1);
    check_all(b, 2);
    check_all(c, 4);
    assert_ok(ndm_manager_close(s));
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.hits, 1);      /* b, matched ahead */
    assert_int_equal(ps.fallbacks, 2); /* a (its turn passed), c */
    assert_manager_empty(root);
}

/* An array moved out of the step outlives its manager: its memory stays
 * (the arena with it) and the next step takes another arena. */
static void test_plan_array_kept_past_close(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager keep = ndm_manager_new(root, "keep");
    ndm_plan plan = ndm_plan_new(root, 2);
    record_abc(root, plan);
    ndm_plan_stats ps;
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
    ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
    assert_ok(ndm_array_release(a));
    ndm_array c = filled(s, N1, 3);
    assert_ok(ndm_attach(c, keep));
    assert_ok(ndm_manager_close(s));
    (void)b;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.arena_allocs, 1);
    /* Another step while c holds the first arena. */
    for (int i = 0; i < 2; i++) {
        s = ndm_manager_new_planned(root, "step", plan, 1);
        a = filled(s, N1, 5);
        b = filled(s, N1, 6);
        assert_ok(ndm_array_release(a));
        ndm_array d = filled(s, N1, 7);
        check_all(b, 6);
        check_all(d, 7);
        assert_ok(ndm_manager_close(s));
    }
    check_all(c, 3);
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.arena_allocs, 2);
    assert_int_equal(ps.fallbacks, 0);
    int64_t two = ps.arena_bytes;
    assert_ok(ndm_array_release(c)); /* the first arena's last block */
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.arena_bytes, two / 2); /* one arena: the one kept */
    assert_manager_empty(root);
    assert_ok(ndm_manager_close(keep));
    assert_ok(ndm_plan_close(plan));
    assert_ok(ndm_memory_stats_get(NDM_CPU, &(ndm_memory_stats){0}));
}

/* The owner closes while a step of its plan runs elsewhere: the step ends
 * on its arena, which then goes back, as do the kept ones. */
static void test_plan_owner_closed_mid_step(void **state)
{
    ndm_manager root = ROOT(state);
    int64_t base = mem_now().allocated_bytes[NDM_POOL_ALL].current;
    ndm_manager owner = ndm_manager_new(root, "owner");
    ndm_plan plan = ndm_plan_new(owner, 2);
    record_abc(root, plan);
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
    ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_manager_close(owner));
    ndm_array c = filled(s, N1, 3); /* still served: the step holds the plan */
    check_all(b, 2);
    check_all(c, 3);
    assert_true(mem_now().allocated_bytes[NDM_POOL_ALL].current > base);
    assert_ok(ndm_manager_close(s));
    assert_int_equal(mem_now().allocated_bytes[NDM_POOL_ALL].current, base);
    assert_true(ndm_manager_new_planned(root, "step", plan, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_manager_empty(root);
}

static void test_plan_lru_eviction(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    for (uint64_t sig = 1; sig <= 3; sig++) {
        ndm_manager s = ndm_manager_new_planned(root, "step", plan, sig);
        filled(s, 10 * (int64_t)sig, 1);
        assert_ok(ndm_manager_close(s));
    }
    ndm_plan_stats ps;
    ndm_plan_entry pe;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.plans, 2);
    assert_int_equal(ps.evicted, 1);
    assert_status(ndm_plan_get_entry(plan, 1, &pe), NDM_ALREADY);
    assert_int_equal(pe.blocks, 0);
    assert_ok(ndm_plan_get_entry(plan, 3, &pe));
    assert_int_equal(pe.blocks, 1);
    /* 2 used again, then 1 recorded again: 3 is now the oldest and goes. */
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 2);
    ndm_array x = filled(s, 20, 1);
    assert_ok(ndm_manager_close(s));
    (void)x;
    s = ndm_manager_new_planned(root, "step", plan, 1);
    filled(s, 10, 1);
    assert_ok(ndm_manager_close(s));
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.recorded, 4);
    assert_int_equal(ps.replayed, 1);
    assert_int_equal(ps.evicted, 2);
    assert_ok(ndm_plan_get_entry(plan, 2, &pe));
    assert_status(ndm_plan_get_entry(plan, 3, &pe), NDM_ALREADY);
    assert_ok(ndm_plan_close(plan));
    assert_manager_empty(root);
}

static void test_plan_bad_input(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan_stats ps;
    assert_true(ndm_plan_new(NDM_NULL_MANAGER, 2).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_true(ndm_plan_new(root, 0).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("max_plans");
    assert_true(ndm_plan_new(ndm_system(), 2).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_ROOT);
    ndm_manager gone = ndm_manager_new(root, "gone");
    assert_ok(ndm_manager_close(gone));
    assert_true(ndm_plan_new(gone, 2).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);

    assert_true(ndm_manager_new_planned(root, "s", NDM_NULL_PLAN, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_plan forged = {UINT64_C(0x7777000000000123)};
    assert_true(ndm_manager_new_planned(root, "s", forged, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("not a plan handle");
    assert_status(ndm_plan_get_stats(forged, &ps), NDM_E_INVALID);
    assert_status(ndm_plan_close(forged), NDM_E_INVALID);
    assert_status(ndm_plan_close(NDM_NULL_PLAN), NDM_E_NULL);

    /* A plan whose owner closed, and one closed by hand. */
    ndm_manager owner = ndm_manager_new(root, "owner");
    ndm_plan p1 = ndm_plan_new(owner, 2), p2 = ndm_plan_new(root, 2);
    assert_true(p1.id && p2.id);
    assert_status(ndm_plan_get_stats(p1, NULL), NDM_E_INVALID);
    assert_ok(ndm_manager_close(owner));
    assert_true(ndm_manager_new_planned(root, "s", p1, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("closed");
    assert_status(ndm_plan_get_stats(p1, &ps), NDM_E_CLOSED);
    assert_status(ndm_plan_close(p1), NDM_ALREADY);
    assert_ok(ndm_plan_close(p2));
    assert_true(ndm_manager_new_planned(root, "s", p2, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* A stale parent. */
    ndm_plan p3 = ndm_plan_new(root, 2);
    assert_true(ndm_manager_new_planned(gone, "s", p3, 1).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_ok(ndm_plan_close(p3));
    /* Nothing was made or left behind. */
    ndm_stats st;
    assert_ok(ndm_manager_stats(root, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 0);
    assert_manager_empty(root);
}

/* ---- threads ----------------------------------------------------------------------------- */

typedef struct thr_arg {
    ndm_manager m;
    ndm_array made;
} thr_arg;

static void *close_there(void *p)
{
    thr_arg *t = p;
    if (ndm_manager_close(t->m) != NDM_OK)
        return p;
    return NULL;
}

static void *make_there(void *p)
{
    thr_arg *t = p;
    t->made = ndm_full(t->m, NDM_F32, 9.0, NDM_SHAPE(N1));
    return NULL;
}

/* Blocks of a replayed step freed on another thread (their manager closed
 * there), and a creation in a planned manager from a thread other than its
 * opener's (served by the caching allocator, counted). */
static void test_plan_frees_on_other_threads(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    record_abc(root, plan);
    for (int round = 0; round < 4; round++) {
        ndm_manager keep = ndm_manager_new(root, "keep");
        ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
        ndm_array a = filled(s, N1, 1), b = filled(s, N1, 2);
        assert_ok(ndm_array_release(a));
        thr_arg t = {s, NDM_NULL_ARRAY};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, make_there, &t), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_live(t.made);
        ndm_array c = filled(s, N1, 3);
        assert_ok(ndm_attach(b, keep));
        assert_ok(ndm_attach(c, keep));
        check_all(t.made, 9);
        assert_ok(ndm_manager_close(s));
        thr_arg k = {keep, NDM_NULL_ARRAY};
        assert_int_equal(pthread_create(&th, NULL, close_there, &k), 0);
        void *rc;
        assert_int_equal(pthread_join(th, &rc), 0);
        assert_null(rc);
    }
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.fallbacks, 4);
    assert_int_equal(ps.hits, 12);
    assert_ok(ndm_plan_close(plan));
    assert_manager_empty(root);
}

/* Products big enough for the thread pool: their packing scratch is taken
 * on the pool's threads, in an order that varies, and stacked in the
 * planned scratch blocks; the values are those of the unplanned run. */
static void big_step(ndm_manager batch, ndm_array w1, ndm_array w2, int step, float *out)
{
    ndm_array x = ndm_empty(batch, NDM_F32, NDM_SHAPE(128, 784));
    float *p = ndm_array_data(x);
    for (int i = 0; i < 128 * 784; i++)
        p[i] = (float)((i * 2654435761u + (unsigned)step * 40503u) % 1000) / 1000.0f;
    ndm_array y = ndm_matmul(ndm_relu(ndm_matmul(x, w1)), w2);
    assert_live(y);
    assert_ok(ndm_array_copy_out(y, out, 128 * 64 * sizeof *out));
    assert_ok(ndm_manager_close(batch));
}

static void test_plan_parallel_scratch(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(5);
    ndm_array w1 = ndm_uniform(model, &rng, NDM_F32, -0.05, 0.05, NDM_SHAPE(784, 256));
    ndm_array w2 = ndm_uniform(model, &rng, NDM_F32, -0.05, 0.05, NDM_SHAPE(256, 64));
    ndm_plan plan = ndm_plan_new(model, 2);
    static float a[128 * 64], b[128 * 64];
    for (int step = 0; step < 6; step++) {
        big_step(ndm_manager_new(root, "batch"), w1, w2, step, a);
        big_step(ndm_manager_new_planned(root, "batch", plan, 128), w1, w2, step, b);
        assert_memory_equal(a, b, sizeof a);
    }
    ndm_plan_stats ps;
    ndm_plan_entry pe;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_ok(ndm_plan_get_entry(plan, 128, &pe));
    /* the arrays, and scratch besides (how much of it fits varies) */
    assert_true(ps.hits > 5 * pe.blocks);
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_plan_mlp_training_bit_identical),
        TEST(test_plan_bigger_batch_falls_back),
        TEST(test_plan_reuse_needs_release),
        TEST(test_plan_limits_apply),
        TEST(test_plan_other_order_falls_back),
        TEST(test_plan_array_kept_past_close),
        TEST(test_plan_owner_closed_mid_step),
        TEST(test_plan_lru_eviction),
        TEST(test_plan_bad_input),
        TEST(test_plan_frees_on_other_threads),
        TEST(test_plan_parallel_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
