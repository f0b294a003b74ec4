/* Closes racing work in flight: a model closed while threads predict with
 * it, the manager of an operation's inputs closed while a kernel reads them,
 * a served model hot-swapped under load, and hooks attached while their
 * manager closes and its slot is reused. Each runs for a bounded time
 * (NDM_STRESS_MS, default 600 ms per test); also run under ThreadSanitizer
 * and AddressSanitizer, where a read of freed memory fails the suite. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "helpers.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double budget_ms(void)
{
    const char *e = getenv("NDM_STRESS_MS");
    double v = e ? atof(e) : 0;
    return v > 0 ? v : 600;
}

/* A failed call must say why: a negative status and a message. Returns
 * whether the status is one a request may get when its model went away. */
static bool clear_refusal(void)
{
    ndm_status st = ndm_last_status();
    const char *msg = ndm_last_error();
    return st < 0 && msg && msg[0] && (st == NDM_E_CLOSED || st == NDM_E_NULL);
}

/* ---- a model closed while threads predict with it ------------------------ */

#define LAYERS 16
#define WIDTH 32
#define SERVERS 4

/* A model whose every weight is `v` and whose biases are 0: a 1 x WIDTH
 * input of ones gives a known answer, so an answer from freed weights
 * would show. */
static ndm_module make_net(ndm_manager model, float v)
{
    ndm_rng rng = ndm_rng_new(7);
    ndm_module layers[LAYERS];
    for (int i = 0; i < LAYERS; i++)
        layers[i] = ndm_linear(model, WIDTH, WIDTH, true, &rng);
    ndm_module net = ndm_sequential_at(NDM_HERE, model, LAYERS, layers);
    if (!net.id)
        return net;
    ndm_array params[2 * LAYERS];
    int n = ndm_module_parameters(net, params, 2 * LAYERS);
    for (int i = 0; i < n; i++) {
        int nd = ndm_array_ndim(params[i]);
        if (ndm_mul_scalar_(params[i], 0.0) != NDM_OK ||
            ndm_add_scalar_(params[i], nd == 2 ? v : 0.0) != NDM_OK)
            return (ndm_module){0};
    }
    return net;
}

/* The value every output element takes for weights v: WIDTH^LAYERS v^LAYERS. */
static double expected(float v)
{
    double x = 1;
    for (int i = 0; i < LAYERS; i++)
        x *= WIDTH * (double)v;
    return x;
}

typedef struct served {
    _Atomic uint64_t pred;     /* the predictor now served (an ndm_predictor id) */
    _Atomic int stop;
    _Atomic int hold, held;    /* hold: serving threads wait, outside every call */
    _Atomic long answers, refusals, wrong, unclear;
    float v[2];                /* the weights of the two model versions */
    char unclear_msg[256];     /* what the first unclear outcome said */
} served;

/* Count an outcome that is neither an answer nor a clear refusal. */
static void note_unclear(served *s, const char *what)
{
    if (atomic_fetch_add(&s->unclear, 1) == 0)
        snprintf(s->unclear_msg, sizeof s->unclear_msg, "%s: %s (%s)", what, ndm_last_error(),
                 ndm_status_name(ndm_last_status()));
}

static void *serve(void *p)
{
    served *s = p;
    ndm_manager mine = ndm_manager_new(ndm_system(), "client");
    ndm_array x = ndm_ones(mine, NDM_F32, NDM_SHAPE(1, WIDTH));
    while (!atomic_load(&s->stop)) {
        if (atomic_load(&s->hold)) {
            atomic_fetch_add(&s->held, 1);
            while (atomic_load(&s->hold) && !atomic_load(&s->stop))
                sched_yield();
            atomic_fetch_sub(&s->held, 1);
            continue;
        }
        ndm_predictor pr = {atomic_load(&s->pred)};
        ndm_array y = ndm_predict_to(mine, pr, x);
        if (y.id) {
            float out[WIDTH];
            if (ndm_array_copy_out(y, out, sizeof out) != NDM_OK) {
                note_unclear(s, "copy_out");
            } else {
                bool ok = false;
                for (int k = 0; k < 2; k++)
                    ok = ok || fabs(out[0] - expected(s->v[k])) <= 1e-3 * fabs(expected(s->v[k]));
                for (int i = 1; i < WIDTH; i++)
                    ok = ok && out[i] == out[0];
                atomic_fetch_add(ok ? &s->answers : &s->wrong, 1);
            }
            (void)ndm_array_release(y);
        } else if (clear_refusal()) {
            atomic_fetch_add(&s->refusals, 1);
        } else {
            note_unclear(s, "predict");
        }
    }
    (void)ndm_array_release(x);
    (void)ndm_manager_close(mine);
    return NULL;
}

/* A fresh model of weights v under system, served by a new predictor. */
static ndm_predictor load_model(float v, ndm_manager *model)
{
    *model = ndm_manager_new(ndm_system(), "model");
    ndm_module net = make_net(*model, v);
    if (!net.id)
        return (ndm_predictor){0};
    return ndm_predictor_new(*model, net);
}

/* Serve a model of s->v[0] with SERVERS threads; *model is its manager. */
static void start_serving(served *s, ndm_manager *model, pthread_t *th)
{
    ndm_predictor pr = load_model(s->v[0], model);
    assert_true(pr.id != 0);
    atomic_store(&s->pred, pr.id);
    for (int i = 0; i < SERVERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, serve, s), 0);
}

static void test_inflight_model_closed_while_predicting(void **state)
{
    (void)state;
    double end = now_ms() + budget_ms();
    long rounds = 0, answers = 0, refusals = 0;
    while (now_ms() < end || rounds < 3) {
        served s = {.v = {0.03125f, 0.03125f}};
        ndm_manager model;
        pthread_t th[SERVERS];
        start_serving(&s, &model, th);
        /* let requests get going, then close the model under them */
        while (atomic_load(&s.answers) < 2 * SERVERS)
            sched_yield();
        assert_ok(ndm_manager_close(model));
        /* every request from now on is refused */
        long before = atomic_load(&s.refusals);
        while (atomic_load(&s.refusals) < before + SERVERS)
            sched_yield();
        atomic_store(&s.stop, 1);
        for (int i = 0; i < SERVERS; i++)
            pthread_join(th[i], NULL);
        assert_int_equal(atomic_load(&s.wrong), 0);
        if (atomic_load(&s.unclear))
            fail_msg("%ld unclear outcomes, the first: %s", (long)s.unclear, s.unclear_msg);
        answers += s.answers;
        refusals += s.refusals;
        rounds++;
    }
    print_message("%ld rounds, %ld answers, %ld refusals\n", rounds, answers, refusals);
}

/* ---- hot swap: load new, swap, close old, under load ---------------------- */

/* Resident bytes of this process (0 when /proc is not there). */
static int64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2)
        res = 0;
    fclose(f);
    return (int64_t)res * 4096;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_CHECKED 0 /* the sanitizers' quarantines and shadows grow on their own */
#else
#define RSS_CHECKED 1
#endif

static void test_inflight_hot_swap_under_load(void **state)
{
    (void)state;
    served s = {.v = {0.03125f, 0.0625f}};
    ndm_manager model;
    pthread_t th[SERVERS];
    start_serving(&s, &model, th);
    ndm_memory_stats base = {0}, after = {0};
    int64_t rss0 = 0;
    double end = now_ms() + budget_ms();
    long swaps = 0;
    while (now_ms() < end || swaps < 4) {
        ndm_manager next;
        ndm_predictor np = load_model(s.v[(swaps + 1) % 2], &next);
        assert_true(np.id != 0);
        atomic_store(&s.pred, np.id);
        long seen = atomic_load(&s.answers);
        assert_ok(ndm_manager_close(model));
        model = next;
        swaps++;
        while (atomic_load(&s.answers) < seen + SERVERS)
            sched_yield();
        if (swaps == 2) {
            assert_ok(ndm_memory_stats_get(NDM_CPU, &base));
            rss0 = rss_bytes() - base.reserved_bytes[NDM_POOL_ALL].current;
        }
    }
    /* The serving threads pause, alive and outside every call, so that the
     * frees a thread descheduled inside a request held back can run: a
     * release of this thread's runs them (what an old model still holds
     * then is held for good). */
    atomic_store(&s.hold, 1);
    while (atomic_load(&s.held) < SERVERS)
        sched_yield();
    ndm_manager scratch = ndm_manager_new(ndm_system(), "scratch");
    assert_ok(ndm_array_release(ndm_zeros(scratch, NDM_F32, NDM_SHAPE(1))));
    assert_ok(ndm_manager_close(scratch));
    assert_ok(ndm_memory_stats_get(NDM_CPU, &after));
    int64_t reserved = after.reserved_bytes[NDM_POOL_ALL].current;
    int64_t rss1 = rss_bytes() - reserved;
    atomic_store(&s.stop, 1);
    for (int i = 0; i < SERVERS; i++)
        pthread_join(th[i], NULL);
    assert_ok(ndm_manager_close(model));
    assert_int_equal(atomic_load(&s.wrong), 0);
    if (atomic_load(&s.unclear))
        fail_msg("%ld unclear outcomes, the first: %s", (long)s.unclear, s.unclear_msg);
    /* memory stays flat from swap to swap: each old model's bytes came back */
    int64_t grown = after.allocated_bytes[NDM_POOL_ALL].current -
                    base.allocated_bytes[NDM_POOL_ALL].current;
    if (grown > 4 * LAYERS * WIDTH * (WIDTH + 1) * 4)
        fail_msg("allocated bytes grew by %lld over %ld swaps", (long long)grown, swaps);
    /* and so does the process: the allocator's cache warms up to a bound
     * (blocks freed on one thread are cached there, so 5 threads spread
     * them over their caches, about 36 MiB here after 600 swaps, then no
     * more), and what lies outside it stays flat (a model is 70 KiB, so
     * 16 MiB is many models) */
    if (reserved > (int64_t)128 << 20)
        fail_msg("the allocator reserved %lld bytes after %ld swaps", (long long)reserved, swaps);
    if (RSS_CHECKED && rss0 && rss1 - rss0 > 16 << 20)
        fail_msg("resident memory outside the allocator grew from %lld to %lld bytes over %ld "
                 "swaps",
                 (long long)rss0, (long long)rss1, swaps);
    print_message("%ld swaps, %ld answers, %ld refusals\n", swaps, (long)s.answers,
                  (long)s.refusals);
}

/* ---- kernels whose inputs' manager closes meanwhile ----------------------- */

typedef struct inputs {
    _Atomic uint64_t a, b;     /* ndm_array ids in the shared manager */
    _Atomic int stop;
    _Atomic long done, refused, unclear;
} inputs;

static void *compute(void *p)
{
    inputs *in = p;
    ndm_manager mine = ndm_manager_new(ndm_system(), "worker");
    for (unsigned k = 0; !atomic_load(&in->stop); k++) {
        ndm_array a = {atomic_load(&in->a)}, b = {atomic_load(&in->b)};
        /* everything made here lands in the scope, which ends each turn */
        ndm_manager sc = ndm_scope_begin(mine, "turn");
        ndm_array y;
        switch (k % 4) {
        case 0: y = ndm_gelu(a); break;
        case 1: y = ndm_matmul(a, b); break;
        case 2: y = ndm_matmul(ndm_slice(a, 0, 0, 1, 1), b); break;
        default: y = ndm_add(a, b); break;
        }
        if (y.id)
            atomic_fetch_add(&in->done, 1);
        else if (clear_refusal())
            atomic_fetch_add(&in->refused, 1);
        else
            atomic_fetch_add(&in->unclear, 1);
        if (ndm_scope_end(sc, 0, NULL) != NDM_OK)
            atomic_fetch_add(&in->unclear, 1);
    }
    (void)ndm_manager_close(mine);
    return NULL;
}

static void test_inflight_inputs_closed_under_kernels(void **state)
{
    (void)state;
    inputs in = {0};
    pthread_t th[2];
    ndm_manager m = ndm_manager_new(ndm_system(), "inputs");
    ndm_array a = ndm_full(m, NDM_F32, 0.5, NDM_SHAPE(96, 96));
    ndm_array b = ndm_full(m, NDM_F32, 0.25, NDM_SHAPE(96, 96));
    atomic_store(&in.a, a.id);
    atomic_store(&in.b, b.id);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, compute, &in), 0);
    double end = now_ms() + budget_ms();
    long rounds = 0;
    while (now_ms() < end || rounds < 20) {
        long seen = atomic_load(&in.done);
        while (atomic_load(&in.done) < seen + 2)
            sched_yield();
        ndm_manager next = ndm_manager_new(ndm_system(), "inputs");
        ndm_array na = ndm_full(next, NDM_F32, 0.5, NDM_SHAPE(96, 96));
        ndm_array nb = ndm_full(next, NDM_F32, 0.25, NDM_SHAPE(96, 96));
        assert_live(na);
        assert_live(nb);
        /* the old inputs die while kernels read them: closed, not swapped
         * first every other round */
        if (rounds % 2) {
            assert_ok(ndm_manager_close(m));
            atomic_store(&in.a, na.id);
            atomic_store(&in.b, nb.id);
        } else {
            atomic_store(&in.a, na.id);
            atomic_store(&in.b, nb.id);
            assert_ok(ndm_manager_close(m));
        }
        m = next;
        rounds++;
    }
    atomic_store(&in.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_ok(ndm_manager_close(m));
    assert_int_equal(atomic_load(&in.unclear), 0);
    print_message("%ld closes, %ld operations, %ld refused\n", rounds, (long)in.done,
                  (long)in.refused);
}

/* ---- hooks attached while their manager closes ---------------------------- */

#define HOOK_ROUNDS (1 << 20)

typedef struct hooks {
    _Atomic uint64_t cur;      /* the manager of the round now open */
    _Atomic int round;         /* its index (-1: none open) */
    _Atomic int stop;
    _Atomic int ok[HOOK_ROUNDS];      /* hooks added with NDM_OK, per round */
    _Atomic int ran[HOOK_ROUNDS];     /* hooks that ran, per round */
    int ran_at_close[HOOK_ROUNDS];    /* ran[] read right after the round's close */
} hooks;

static hooks g_hooks;

static int count_hook(void *ud)
{
    atomic_fetch_add((_Atomic int *)ud, 1);
    return 0;
}

static void *add_hooks(void *p)
{
    hooks *h = p;
    while (!atomic_load(&h->stop)) {
        /* the newest manager, whether or not its close has begun */
        int r = atomic_load(&h->round);
        ndm_manager m = {atomic_load(&h->cur)};
        /* (a pair read whole: the closer clears round before it moves cur) */
        if (r < 0 || atomic_load(&h->round) != r || atomic_load(&h->ok[r]) >= 64)
            continue;
        ndm_status st = ndm_manager_on_close(m, count_hook, &h->ran[r]);
        if (st == NDM_OK)
            atomic_fetch_add(&h->ok[r], 1);
        else if (st != NDM_E_CLOSED || !ndm_last_error()[0])
            atomic_store(&h->stop, 2);
    }
    return NULL;
}

static void test_inflight_hooks_race_close_and_reuse(void **state)
{
    (void)state;
    hooks *h = &g_hooks;
    memset(h, 0, sizeof *h);
    atomic_store(&h->round, -1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, add_hooks, h), 0);
    double end = now_ms() + 2 * budget_ms();
    int rounds = 0;
    /* each manager is closed as soon as it is published, and the next one
     * takes its slot: a hook attached late must fail, not join the next */
    while (rounds < HOOK_ROUNDS && (now_ms() < end || rounds < 64)) {
        ndm_manager m = ndm_manager_new(ndm_system(), "hooked");
        assert_true(m.id != 0);
        atomic_store(&h->round, -1);
        atomic_store(&h->cur, m.id);
        atomic_store(&h->round, rounds);
        assert_ok(ndm_manager_close(m));
        h->ran_at_close[rounds] = atomic_load(&h->ran[rounds]);
        rounds++;
    }
    atomic_store(&h->round, -1);
    atomic_store(&h->stop, atomic_load(&h->stop) ? atomic_load(&h->stop) : 1);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&h->stop), 1);
    long added = 0;
    for (int r = 0; r < rounds; r++) {
        /* every hook added with NDM_OK ran, at its own manager's close */
        if (atomic_load(&h->ok[r]) != h->ran_at_close[r] ||
            atomic_load(&h->ran[r]) != h->ran_at_close[r])
            fail_msg("round %d: %d hooks added, %d ran at its close, %d in all", r,
                     atomic_load(&h->ok[r]), h->ran_at_close[r], atomic_load(&h->ran[r]));
        added += atomic_load(&h->ok[r]);
    }
    print_message("%d rounds, %ld hooks added\n", rounds, added);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_inflight_model_closed_while_predicting),
        TEST(test_inflight_hot_swap_under_load),
        TEST(test_inflight_inputs_closed_under_kernels),
        TEST(test_inflight_hooks_race_close_and_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
