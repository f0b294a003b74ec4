/* Planned managers on CUDA and device graphs over them: a planned step on
 * the device replays from an arena taken through ndm's allocator with the
 * values of an unplanned one; a training step and a batch-1 request
 * captured once and launched again give the eager values bit for bit;
 * calls that cannot be captured fail the capture and leave the device
 * working; graphs die with their manager. CUDA cases skip without a CUDA
 * device (they run on the host stand-in in CI). */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define IN 24
#define HID 40
#define OUT 6
#define ROWS 8
#define STEPS 6

#define NEED_CUDA()                                                             \
    do {                                                                        \
        if (ndm_cuda_device_count() == 0) {                                     \
            print_message("no CUDA device: skipped\n");                        \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* Kernel launches run so far, as the host stand-in counts them (NULL on a
 * real GPU, whose module has no such counter). */
typedef unsigned long long (*launch_count_fn)(void);
static launch_count_fn launch_counter(void)
{
    const char *dir = getenv("NDM_BACKEND_PATH");
    char path[4096];
    if (!dir || snprintf(path, sizeof path, "%s/libndm-cuda.so", dir) >= (int)sizeof path)
        return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* (kept open: the module stays) */
    return h ? (launch_count_fn)dlsym(h, "ndm__hx_launch_count") : NULL;
}

/* ---- an MLP on the device -------------------------------------------------------- */

typedef struct net {
    ndm_manager model;
    ndm_module mod;
    ndm_optimizer opt;
} net;

static net net_new(ndm_manager root, bool train)
{
    net n;
    n.model = ndm_manager_new_on(root, "model", NDM_CUDA(0));
    assert_live(n.model);
    ndm_rng rng = ndm_rng_new(11);
    if (!train)
        ndm_no_grad_begin();
    ndm_module mods[3] = {ndm_linear(n.model, IN, HID, true, &rng), ndm_relu_module(n.model),
                          ndm_linear(n.model, HID, OUT, true, &rng)};
    n.mod = ndm_sequential(n.model, 3, mods);
    if (!train)
        ndm_no_grad_end();
    assert_live(n.mod);
    n.opt = (ndm_optimizer){0};
    if (train) {
        n.opt = ndm_sgd(n.model, n.mod, 0.05, 0.9, 0);
        assert_true(n.opt.id != 0);
    }
    return n;
}

static void fill_batch(int step, float *x, float *y)
{
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = (float)sin(0.31 * i + 1.7 * step) * 0.5f;
    for (int i = 0; i < ROWS * OUT; i++)
        y[i] = (float)cos(0.23 * i + 0.9 * step);
}

/* The step's inputs (device arrays outside the step, written in place
 * before each step) and its output. */
typedef struct io {
    net *n;
    ndm_array x, y;
    ndm_array loss; /* made in the step */
} io;

static io io_new(net *n, ndm_manager where)
{
    io s = {n, ndm_empty(where, NDM_F32, NDM_SHAPE(ROWS, IN)),
            ndm_empty(where, NDM_F32, NDM_SHAPE(ROWS, OUT)), NDM_NULL_ARRAY};
    assert_live(s.x);
    assert_live(s.y);
    return s;
}

static void io_load(io *s, int step)
{
    float x[ROWS * IN], y[ROWS * OUT];
    fill_batch(step, x, y);
    assert_ok(ndm_array_copy_in(s->x, x, sizeof x));
    assert_ok(ndm_array_copy_in(s->y, y, sizeof y));
}

/* One training step in `step`: forward, MSE, backward, SGD, in a scope of
 * the step (the inputs live outside it: the output rule would put the
 * forward's arrays beside them); the loss is kept in the step. */
static ndm_status train_step(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_manager sc = ndm_scope_begin(step, "forward");
    if (!sc.id)
        return ndm_last_status();
    ndm_status st = ndm_grad_begin(step);
    if (st < 0)
        goto out;
    s->loss = ndm_mse_loss(ndm_forward(s->n->mod, s->x), s->y);
    st = s->loss.id ? ndm_backward(s->loss) : ndm_last_status();
    ndm_status ge = ndm_grad_end();
    if (st >= 0 && ge < 0)
        st = ge;
    if (st >= 0)
        st = ndm_optimizer_step(s->n->opt);
    if (st >= 0)
        st = ndm_optimizer_zero_grad(s->n->opt);
out:;
    ndm_status es = ndm_scope_end(sc, s->loss.id && st >= 0 ? 1 : 0, &s->loss);
    return st < 0 ? st : es;
}

/* One request: the net's answer to s->x, in the step. */
static ndm_status request_step(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_manager sc = ndm_scope_begin(step, "forward");
    if (!sc.id)
        return ndm_last_status();
    s->loss = ndm_forward(s->n->mod, s->x);
    ndm_status st = s->loss.id ? NDM_OK : ndm_last_status();
    ndm_status es = ndm_scope_end(sc, s->loss.id ? 1 : 0, &s->loss);
    return st < 0 ? st : es;
}

static double loss_of(ndm_array a)
{
    double v;
    assert_ok(ndm_item(a, &v));
    return v;
}

static void params_equal(ndm_module a, ndm_module b)
{
    ndm_array pa[8], pb[8];
    int na = ndm_module_parameters(a, pa, 8), nb = ndm_module_parameters(b, pb, 8);
    assert_int_equal(na, 4);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) {
        size_t n = (size_t)ndm_array_size(pa[i]);
        float *u = malloc(n * 4), *v = malloc(n * 4);
        assert_ok(ndm_array_copy_out(pa[i], u, n * 4));
        assert_ok(ndm_array_copy_out(pb[i], v, n * 4));
        assert_memory_equal(u, v, n * 4);
        free(u);
        free(v);
    }
}

static int64_t cuda_stat(const char *key)
{
    int64_t v = -1;
    assert_ok(ndm_memory_stat_get(NDM_CUDA(0), key, &v));
    return v;
}

/* Allocations the CUDA pool has handed out so far. */
static int64_t cuda_allocs(void)
{
    ndm_memory_stats s;
    assert_ok(ndm_memory_stats_get(NDM_CUDA(0), &s));
    return s.allocation[NDM_POOL_ALL].allocated;
}

/* ---- planned managers on CUDA ----------------------------------------------------------- */

static void test_plan_cuda_training_bit_identical(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net a = net_new(root, true), b = net_new(root, true);
    ndm_plan plan = ndm_plan_new(b.model, 2);
    assert_true(plan.id != 0);
    ndm_manager ta = ndm_manager_new(a.model, "trainer"), tb = ndm_manager_new(b.model, "trainer");
    io ia = io_new(&a, ta), ib = io_new(&b, tb);
    ndm_plan_stats ps;
    for (int k = 0; k < STEPS; k++) {
        io_load(&ia, k);
        io_load(&ib, k);
        ndm_manager sa = ndm_manager_new(ta, "batch");
        assert_ok(train_step(sa, &ia));
        double la = loss_of(ia.loss);
        assert_ok(ndm_manager_close(sa));
        ndm_manager sb = ndm_manager_new_planned(tb, "batch", plan, ROWS);
        assert_true(ndm_device_eq(ndm_manager_device(sb), NDM_CUDA(0)));
        int64_t before = cuda_allocs();
        assert_ok(train_step(sb, &ib));
        double lb = loss_of(ib.loss);
        int64_t after = cuda_allocs();
        if (k >= 2) /* served from the kept arena: no allocator call in the step */
            assert_int_equal(after, before);
        if (k >= 1) {
            /* the arena is an allocated block of the CUDA pool */
            assert_ok(ndm_plan_get_stats(plan, &ps));
            assert_true(cuda_stat("allocated_bytes.all.current") >= ps.arena_bytes);
        }
        assert_ok(ndm_manager_close(sb));
        if (memcmp(&la, &lb, sizeof la))
            fail_msg("step %d: loss %.17g planned, %.17g not", k, lb, la);
    }
    params_equal(a.mod, b.mod);
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.recorded, 1);
    assert_int_equal(ps.replayed, STEPS - 1);
    assert_int_equal(ps.arena_allocs, 1);
    assert_int_equal(ps.fallbacks, 0);
    assert_true(ps.hits > 10);
    ndm_plan_entry pe;
    assert_ok(ndm_plan_get_entry(plan, ROWS, &pe));
    assert_true(pe.arena_bytes >= pe.max_live_bytes);
    assert_true(cuda_stat("allocated_bytes.all.current") >= ps.arena_bytes);
    assert_ok(ndm_array_release(ia.x));
    assert_ok(ndm_array_release(ia.y));
    assert_ok(ndm_array_release(ib.x));
    assert_ok(ndm_array_release(ib.y));
    assert_manager_empty(ta);
    assert_manager_empty(tb);
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
}

/* A byte limit over the trainer sees the planned step's arrays. */
static void test_plan_cuda_limit_sees_the_step(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net b = net_new(root, true);
    ndm_plan plan = ndm_plan_new(b.model, 2);
    ndm_manager tb = ndm_manager_new(b.model, "trainer");
    io ib = io_new(&b, tb);
    for (int k = 0; k < 2; k++) {
        io_load(&ib, k);
        ndm_manager s = ndm_manager_new_planned(tb, "batch", plan, ROWS);
        assert_ok(train_step(s, &ib));
        assert_ok(ndm_manager_close(s));
    }
    assert_ok(ndm_manager_set_limit(tb, NDM_CUDA(0), 2 * ROWS * IN * 4 + 64));
    ndm_manager s = ndm_manager_new_planned(tb, "batch", plan, ROWS);
    assert_int_equal(train_step(s, &ib), NDM_E_QUOTA);
    assert_ok(ndm_manager_close(s));
    assert_ok(ndm_array_release(ib.x));
    assert_ok(ndm_array_release(ib.y));
    assert_manager_empty(tb);
    assert_ok(ndm_manager_close(b.model));
}

/* ---- graphs ------------------------------------------------------------------------------ */

/* A training step captured once and launched for every later batch: the
 * losses and the parameters are the eager run's, bit for bit. */
static void test_graph_training_step_replays_bit_identical(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net a = net_new(root, true), b = net_new(root, true);
    ndm_plan plan = ndm_plan_new(b.model, 2);
    ndm_manager ta = ndm_manager_new(a.model, "trainer"), tb = ndm_manager_new(b.model, "trainer");
    io ia = io_new(&a, ta), ib = io_new(&b, tb);
    /* step 0 on both, eagerly; b's records the plan */
    io_load(&ia, 0);
    io_load(&ib, 0);
    ndm_manager sa = ndm_manager_new(ta, "batch");
    assert_ok(train_step(sa, &ia));
    double la0 = loss_of(ia.loss);
    assert_ok(ndm_manager_close(sa));
    ndm_manager sb = ndm_manager_new_planned(tb, "batch", plan, ROWS);
    assert_ok(train_step(sb, &ib));
    double lb0 = loss_of(ib.loss);
    assert_ok(ndm_manager_close(sb));
    assert_memory_equal(&la0, &lb0, sizeof la0);

    ndm_graph g = ndm_graph_capture(tb, "batch", plan, ROWS, train_step, &ib);
    if (!g.id)
        fail_msg("capture failed: %s", ndm_last_error());
    ndm_graph_info gi;
    assert_ok(ndm_graph_get_info(g, &gi));
    assert_int_equal(gi.signature, ROWS);
    assert_true(gi.nodes > 10);
    assert_int_equal(gi.launches, 0);
    ndm_plan_stats ps;
    assert_ok(ndm_plan_get_stats(plan, &ps));
    assert_int_equal(ps.fallbacks, 0);
    assert_int_equal(gi.arena_bytes, ps.arena_bytes);
    ndm_manager gm = ndm_graph_manager(g);
    assert_live(gm);
    assert_true(ndm_manager_parent(gm).id == tb.id);
    ndm_array loss = ib.loss; /* in the graph's manager, rewritten by each launch */
    int64_t allocs = cuda_allocs();
    for (int k = 1; k < STEPS; k++) {
        io_load(&ia, k);
        io_load(&ib, k);
        sa = ndm_manager_new(ta, "batch");
        assert_ok(train_step(sa, &ia));
        double la = loss_of(ia.loss);
        assert_ok(ndm_manager_close(sa));
        int64_t before = cuda_allocs();
        assert_ok(ndm_graph_launch(g));
        assert_int_equal(cuda_allocs(), before);
        double lb = loss_of(loss);
        if (memcmp(&la, &lb, sizeof la))
            fail_msg("step %d: loss %.17g replayed, %.17g eager", k, lb, la);
    }
    (void)allocs;
    params_equal(a.mod, b.mod);
    assert_ok(ndm_graph_get_info(g, &gi));
    assert_int_equal(gi.launches, STEPS - 1);
    assert_ok(ndm_graph_close(g));
    assert_status(ndm_graph_close(g), NDM_ALREADY);
    assert_status(ndm_graph_launch(g), NDM_E_CLOSED);
    assert_false(ndm_manager_valid(gm));
    /* the arena went back to the plan: the next planned step takes it */
    ndm_plan_stats ps2;
    sb = ndm_manager_new_planned(tb, "batch", plan, ROWS);
    io_load(&ib, STEPS);
    assert_ok(train_step(sb, &ib));
    assert_ok(ndm_manager_close(sb));
    assert_ok(ndm_plan_get_stats(plan, &ps2));
    assert_int_equal(ps2.arena_allocs, ps.arena_allocs);
    assert_ok(ndm_array_release(ia.x));
    assert_ok(ndm_array_release(ia.y));
    assert_ok(ndm_array_release(ib.x));
    assert_ok(ndm_array_release(ib.y));
    assert_manager_empty(ta);
    assert_manager_empty(tb);
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
}

/* A batch-1 request: launched for new inputs, the eager forward's answer,
 * and the kernels the eager request launches. */
static void test_graph_request_replays_eager_answers(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net n = net_new(root, false);
    ndm_manager pm = ndm_manager_new(n.model, "predictor");
    ndm_plan plan = ndm_plan_new(pm, 4);
    io s = io_new(&n, pm);
    io_load(&s, 0);
    ndm_no_grad_begin();
    ndm_manager r = ndm_manager_new_planned(pm, "request", plan, 1);
    assert_ok(request_step(r, &s));
    assert_ok(ndm_manager_close(r));
    ndm_graph g = ndm_graph_capture(pm, "request", plan, 1, request_step, &s);
    if (!g.id)
        fail_msg("capture failed: %s", ndm_last_error());
    ndm_array out = s.loss;
    for (int k = 1; k < 4; k++) {
        io_load(&s, k);
        launch_count_fn count = launch_counter();
        unsigned long long c0 = count ? count() : 0;
        ndm_array want = ndm_forward(n.mod, s.x);
        assert_live(want);
        float wv[ROWS * OUT], gv[ROWS * OUT];
        assert_ok(ndm_array_copy_out(want, wv, sizeof wv));
        assert_ok(ndm_array_release(want));
        unsigned long long c1 = count ? count() : 0;
        assert_ok(ndm_graph_launch(g));
        assert_ok(ndm_array_copy_out(out, gv, sizeof gv));
        unsigned long long c2 = count ? count() : 0;
        assert_memory_equal(wv, gv, sizeof wv);
        /* the launch ran the kernels of the eager forward pass, no more */
        if (count) {
            assert_true(c1 > c0);
            assert_int_equal(c2 - c1, c1 - c0);
        }
    }
    ndm_no_grad_end();
    /* the graph dies with its manager's parent */
    assert_ok(ndm_array_release(s.x));
    assert_ok(ndm_array_release(s.y));
    assert_ok(ndm_manager_close(pm));
    assert_status(ndm_graph_launch(g), NDM_E_CLOSED);
    assert_status(ndm_graph_close(g), NDM_ALREADY);
    assert_ok(ndm_manager_close(n.model));
}

/* ndm_predict on a predictor that uses graphs: the first request of a
 * shape runs planned, the second is captured, later ones launch; every
 * answer is the eager predictor's; other shapes run uncaptured. */
static void test_graph_predictor_serves_from_graphs(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net a = net_new(root, false), b = net_new(root, false);
    ndm_predictor pa = ndm_predictor_new(a.model, a.mod), pb = ndm_predictor_new(b.model, b.mod);
    assert_true(pa.id && pb.id);
    assert_ok(ndm_predictor_use_graphs(pb, 1));
    assert_status(ndm_predictor_use_graphs(pb, 1), NDM_E_INVALID);
    ndm_manager in = ndm_manager_new_on(root, "inputs", NDM_CUDA(0));
    for (int k = 0; k < 6; k++) {
        int rows = k == 4 ? 3 : 1; /* a second shape: no slot left, uncaptured */
        float x[3 * IN];
        for (int i = 0; i < rows * IN; i++)
            x[i] = (float)sin(0.7 * i + k);
        ndm_array xa = ndm_empty(in, NDM_F32, NDM_SHAPE(rows, IN));
        assert_ok(ndm_array_copy_in(xa, x, sizeof *x * (size_t)rows * IN));
        ndm_array ya = ndm_predict(pa, xa), yb = ndm_predict(pb, xa);
        assert_live(ya);
        assert_live(yb);
        float va[3 * OUT], vb[3 * OUT];
        assert_ok(ndm_array_copy_out(ya, va, sizeof *va * (size_t)rows * OUT));
        assert_ok(ndm_array_copy_out(yb, vb, sizeof *vb * (size_t)rows * OUT));
        assert_memory_equal(va, vb, sizeof *va * (size_t)rows * OUT);
        assert_ok(ndm_array_release(ya));
        assert_ok(ndm_array_release(yb));
        assert_ok(ndm_array_release(xa));
    }
    ndm_predictor_graph_stats gs;
    assert_ok(ndm_predictor_get_graph_stats(pb, &gs));
    assert_int_equal(gs.captured, 1);
    assert_int_equal(gs.uncaptured, 1);
    assert_int_equal(gs.launched, 4); /* requests 1, 2, 3, 5 */
    assert_ok(ndm_predictor_get_graph_stats(pa, &gs));
    assert_int_equal(gs.launched, 0);
    assert_manager_empty(in);
    assert_ok(ndm_manager_close(in));
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
}

/* Threads serving one shape at once: one holds the graph, the others run
 * their request uncaptured meanwhile; every answer is the eager one. */
#define SERVERS 3
#define PER_SERVER 12
typedef struct server {
    ndm_predictor p;
    ndm_manager in;
    const float (*want)[OUT];
    int bad;
} server;

static void request_input(int k, float *x)
{
    for (int i = 0; i < IN; i++)
        x[i] = (float)cos(0.4 * i + 0.3 * k);
}

static void *serve(void *ud)
{
    server *sv = ud;
    for (int k = 0; k < PER_SERVER; k++) {
        float x[IN], y[OUT];
        request_input(k, x);
        ndm_array xa = ndm_empty(sv->in, NDM_F32, NDM_SHAPE(1, IN));
        ndm_array ya = ndm_array_copy_in(xa, x, sizeof x) == NDM_OK ? ndm_predict(sv->p, xa)
                                                                  : NDM_NULL_ARRAY;
        if (!ya.id || ndm_array_copy_out(ya, y, sizeof y) != NDM_OK ||
            memcmp(y, sv->want[k], sizeof y))
            sv->bad++;
        (void)ndm_array_release(ya);
        (void)ndm_array_release(xa);
    }
    return NULL;
}

static void test_graph_predictor_threads_share_a_shape(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net a = net_new(root, false), b = net_new(root, false);
    ndm_predictor pa = ndm_predictor_new(a.model, a.mod), pb = ndm_predictor_new(b.model, b.mod);
    assert_ok(ndm_predictor_use_graphs(pb, 2));
    ndm_manager in = ndm_manager_new_on(root, "inputs", NDM_CUDA(0));
    float want[PER_SERVER][OUT];
    for (int k = 0; k < PER_SERVER; k++) {
        float x[IN];
        request_input(k, x);
        ndm_array xa = ndm_empty(in, NDM_F32, NDM_SHAPE(1, IN));
        assert_ok(ndm_array_copy_in(xa, x, sizeof x));
        ndm_array ya = ndm_predict(pa, xa);
        assert_live(ya);
        assert_ok(ndm_array_copy_out(ya, want[k], sizeof want[k]));
        assert_ok(ndm_array_release(ya));
        assert_ok(ndm_array_release(xa));
    }
    server sv[SERVERS];
    pthread_t th[SERVERS];
    for (int t = 0; t < SERVERS; t++) {
        sv[t] = (server){pb, in, (const float(*)[OUT])want, 0};
        assert_int_equal(pthread_create(&th[t], NULL, serve, &sv[t]), 0);
    }
    for (int t = 0; t < SERVERS; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(sv[t].bad, 0);
    }
    ndm_predictor_graph_stats gs;
    assert_ok(ndm_predictor_get_graph_stats(pb, &gs));
    assert_int_equal(gs.captured, 1);
    assert_true(gs.launched >= 1 && gs.launched <= SERVERS * PER_SERVER - 1);
    assert_true(gs.uncaptured == 1);
    assert_manager_empty(in);
    assert_ok(ndm_manager_close(in));
    assert_ok(ndm_manager_close(a.model));
    assert_ok(ndm_manager_close(b.model));
}

/* ---- what cannot be captured ---------------------------------------------------------------- */

static ndm_status reads_a_value(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_status st = request_step(step, ud);
    if (st < 0)
        return st;
    s->loss = ndm_sum_to(step, s->loss, false, NDM_ALL_AXES_LIST);
    double v;
    return ndm_item(s->loss, &v); /* waits for the device: cannot be captured */
}

static ndm_array stray;
static ndm_status makes_outside(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_status st = request_step(step, ud);
    if (st < 0)
        return st;
    stray = ndm_zeros(s->n->model, NDM_F32, NDM_SHAPE(1000)); /* not in the step */
    return stray.id ? NDM_OK : ndm_last_status();
}

static ndm_status differs(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_array big = ndm_zeros(step, NDM_F32, NDM_SHAPE(4096)); /* not in the plan */
    s->loss = big;
    return big.id ? NDM_OK : ndm_last_status();
}

/* A loss whose labels are checked on the host: it reads the device. */
static ndm_array labels;
static ndm_status checks_labels(ndm_manager step, void *ud)
{
    io *s = ud;
    ndm_status st = request_step(step, ud);
    if (st < 0)
        return st;
    s->loss = ndm_cross_entropy_to(step, s->loss, labels);
    return s->loss.id ? NDM_OK : ndm_last_status();
}

static ndm_status fails_itself(ndm_manager step, void *ud)
{
    (void)step;
    (void)ud;
    return NDM_E_SHAPE;
}

static void test_graph_uncapturable_calls_fail_the_capture(void **state)
{
    NEED_CUDA();
    ndm_manager root = ROOT(state);
    net n = net_new(root, false);
    ndm_manager pm = ndm_manager_new(n.model, "predictor");
    ndm_plan plan = ndm_plan_new(pm, 4);
    io s = io_new(&n, pm);
    io_load(&s, 0);
    ndm_no_grad_begin();
    /* no plan of the signature yet */
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, request_step, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("run one step of it");
    ndm_manager r = ndm_manager_new_planned(pm, "request", plan, 1);
    assert_ok(reads_a_value(r, &s));
    assert_ok(ndm_manager_close(r));
    uint64_t children = 0;
    ndm_stats st0;
    assert_ok(ndm_manager_stats(pm, NDM_CUDA(0), NDM_STATS_SUBTREE, &st0));
    children = st0.children;

    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, reads_a_value, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("cannot be captured");
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, makes_outside, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("cannot be captured");
    assert_int_equal(stray.id, 0);
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, differs, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("the plan's arena does not serve");
    int64_t lab[ROWS];
    for (int i = 0; i < ROWS; i++)
        lab[i] = i % OUT;
    labels = ndm_empty(pm, NDM_I64, NDM_SHAPE(ROWS));
    assert_ok(ndm_array_copy_in(labels, lab, sizeof lab));
    r = ndm_manager_new_planned(pm, "request", plan, 2);
    assert_ok(checks_labels(r, &s));
    assert_ok(ndm_manager_close(r));
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 2, checks_labels, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("cannot be captured");
    assert_ok(ndm_array_release(labels));
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, fails_itself, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_int_equal(ndm_graph_capture(pm, "r", plan, 1, NULL, &s).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    /* nothing stayed open, and the device goes on working */
    ndm_stats st1;
    assert_ok(ndm_manager_stats(pm, NDM_CUDA(0), NDM_STATS_SUBTREE, &st1));
    assert_int_equal(st1.children, children);
    r = ndm_manager_new_planned(pm, "request", plan, 1);
    assert_ok(reads_a_value(r, &s));
    assert_ok(ndm_manager_close(r));
    ndm_graph g = ndm_graph_capture(pm, "r", plan, 1, request_step, &s);
    assert_true(g.id != 0);
    assert_ok(ndm_graph_launch(g));
    assert_ok(ndm_graph_close(g));
    ndm_no_grad_end();
    assert_ok(ndm_array_release(s.x));
    assert_ok(ndm_array_release(s.y));
    assert_manager_empty(pm);
    assert_ok(ndm_manager_close(n.model));
}

/* ---- bad handles and the CPU (no CUDA needed) ---------------------------------------------- */

static void test_graph_bad_handles_and_cpu_refused(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_plan plan = ndm_plan_new(root, 2);
    ndm_manager s = ndm_manager_new_planned(root, "step", plan, 1);
    ndm_array a = ndm_zeros(s, NDM_F32, NDM_SHAPE(10));
    assert_live(a);
    assert_ok(ndm_manager_close(s));
    assert_int_equal(ndm_graph_capture(root, "step", plan, 1, request_step, NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("cpu has no device graphs");
    assert_status(ndm_graph_launch(NDM_NULL_GRAPH), NDM_E_NULL);
    assert_status(ndm_graph_close(NDM_NULL_GRAPH), NDM_E_NULL);
    ndm_graph bogus = {(uint64_t)77 << 32 | 5};
    assert_status(ndm_graph_launch(bogus), NDM_E_INVALID);
    assert_status(ndm_graph_close(bogus), NDM_E_INVALID);
    ndm_graph_info gi;
    assert_status(ndm_graph_get_info(bogus, &gi), NDM_E_INVALID);
    assert_status(ndm_graph_get_info(bogus, NULL), NDM_E_INVALID);
    assert_int_equal(ndm_graph_manager(bogus).id, 0);
    assert_ok(ndm_plan_close(plan));
    /* a predictor of a CPU model has no graphs to use */
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_no_grad_begin();
    ndm_module lin = ndm_linear(model, 4, 2, true, &rng);
    ndm_no_grad_end();
    ndm_predictor p = ndm_predictor_new(model, lin);
    assert_status(ndm_predictor_use_graphs(p, 2), NDM_E_UNSUPPORTED);
    assert_error_has("no device graphs");
    assert_status(ndm_predictor_get_graph_stats(p, NULL), NDM_E_INVALID);
    assert_ok(ndm_manager_close(model));
    assert_manager_empty(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_plan_cuda_training_bit_identical),
        TEST(test_plan_cuda_limit_sees_the_step),
        TEST(test_graph_training_step_replays_bit_identical),
        TEST(test_graph_request_replays_eager_answers),
        TEST(test_graph_predictor_serves_from_graphs),
        TEST(test_graph_predictor_threads_share_a_shape),
        TEST(test_graph_uncapturable_calls_fail_the_capture),
        TEST(test_graph_bad_handles_and_cpu_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
