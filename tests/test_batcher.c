/* The dynamic batcher: answers equal to the predictor's, batches formed,
 * deadlines, the queue's bound, memory admission, a failing forward pass,
 * and shutdown and model closes under load from several threads, with
 * every request answered exactly once. Batch formation is made
 * deterministic where a test counts batches: a long max_delay, and exactly
 * max_batch rows submitted at once, so that a batch runs when it is full. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "helpers.h"
#include "manager/alloc/alloc.h"

#define IN 16
#define FOREVER_US 60000000 /* a delay no test waits out */

/* 16 -> 8 -> relu -> 4, f32, on the model manager's device. */
static ndm_predictor make_predictor(ndm_manager model)
{
    ndm_rng rng = ndm_rng_new(3);
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_flatten_module(model, 1), ndm_linear(model, IN, 8, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, 8, 4, true, &rng)));
    ndm_no_grad_end();
    assert_live(net);
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_live(p);
    return p;
}

/* An input of `rows` rows whose values depend on seed. */
static ndm_array make_input(ndm_manager m, int64_t rows, int seed)
{
    ndm_array x = ndm_empty(m, NDM_F32, NDM_SHAPE(rows, IN));
    float *d = ndm_array_data(x);
    for (int64_t i = 0; i < rows * IN; i++)
        d[i] = (float)((seed * 131 + i * 17) % 97) / 48.0f - 1.0f;
    return x;
}

/* y holds, bit for bit, what ndm_predict gives for x. */
static bool same_as_predict(ndm_predictor p, ndm_array x, ndm_array y)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "check");
    ndm_array want = ndm_predict_to(m, p, x);
    size_t n = ndm_array_nbytes(want);
    bool ok = want.id && y.id && n == ndm_array_nbytes(y) &&
              ndm_array_ndim(y) == ndm_array_ndim(want);
    if (ok) {
        void *a = malloc(n), *b = malloc(n);
        ok = a && b && ndm_array_copy_out(want, a, n) == NDM_OK &&
             ndm_array_copy_out(y, b, n) == NDM_OK && memcmp(a, b, n) == 0;
        free(a);
        free(b);
    }
    (void)ndm_manager_close(m);
    return ok;
}

static ndm_batcher_stats stats_of(ndm_batcher b)
{
    ndm_batcher_stats s;
    assert_ok(ndm_batcher_stats_get(b, &s));
    return s;
}

/* Wait until `n` requests are queued. */
static void wait_queued(ndm_batcher b, uint64_t n)
{
    while (stats_of(b).queue_depth < n)
        sched_yield();
}

/* ---- clients ------------------------------------------------------------------------ */

typedef struct client {
    ndm_batcher b;
    ndm_predictor p;
    int id, rounds;
    int64_t rows;          /* rows per request */
    int64_t timeout_us;    /* per request; < 0: a varied short one */
    int shape3;            /* submit (rows, 4, 4) instead of (rows, 16) */
    bool poison;           /* an index out of range (the embedding net) */
    _Atomic int *go;       /* start together when set */
    /* outcomes */
    int answers, wrong, closed, timeouts, busy, other;
    ndm_status other_st;
    char other_msg[256];
    bool owner_ok;
    ndm_manager mine;
} client;

static void *client_main(void *v)
{
    client *c = v;
    c->mine = ndm_manager_new(ndm_system(), "client");
    c->owner_ok = true;
    while (c->go && !atomic_load(c->go))
        sched_yield();
    for (int k = 0; k < c->rounds; k++) {
        ndm_array x = make_input(c->mine, c->rows, c->id * 1000 + k);
        if (c->shape3) {
            ndm_array r = ndm_reshape(x, NDM_SHAPE(c->rows, 4, 4));
            (void)ndm_array_release(x);
            x = r;
        }
        int64_t t = c->timeout_us >= 0 ? c->timeout_us : 1 + (c->id * 7 + k * 13) % 400;
        ndm_clear_error();
        ndm_array y = ndm_batcher_predict_to(c->mine, c->b, x, t);
        if (y.id) {
            c->answers++;
            if (ndm_array_manager(y).id != c->mine.id)
                c->owner_ok = false;
            if (c->p.id && !same_as_predict(c->p, x, y))
                c->wrong++;
            (void)ndm_array_release(y);
        } else {
            ndm_status st = ndm_last_status();
            bool said = ndm_last_error()[0] != 0;
            if (st == NDM_E_CLOSED && said)
                c->closed++;
            else if (st == NDM_E_TIMEOUT && said)
                c->timeouts++;
            else if (st == NDM_E_BUSY && said)
                c->busy++;
            else {
                if (!c->other++) {
                    c->other_st = st;
                    snprintf(c->other_msg, sizeof c->other_msg, "%s", ndm_last_error());
                }
            }
        }
        (void)ndm_array_release(x);
    }
    return NULL;
}

static void start(client *c, int n, pthread_t *th)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &c[i]), 0);
}

/* Join the clients, check their managers are empty, close them. */
static void finish(client *c, int n, pthread_t *th)
{
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        assert_manager_empty(c[i].mine);
        assert_ok(ndm_manager_close(c[i].mine));
        assert_true(c[i].owner_ok);
    }
}

/* ---- answers and batches -------------------------------------------------------------- */

#define CLIENTS 4

/* Four clients of one row each and max_batch 4: every round is one batch
 * of four, and every answer is the predictor's, in the caller's manager. */
static void run_rounds(void **state, unsigned flags)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = CLIENTS, .max_delay_us = FOREVER_US,
                                  .flags = flags});
    assert_live(b);
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        c[i] = (client){.b = b, .p = p, .id = i, .rounds = 6, .rows = 1};
    start(c, CLIENTS, th);
    finish(c, CLIENTS, th);
    for (int i = 0; i < CLIENTS; i++) {
        assert_int_equal(c[i].answers, 6);
        assert_int_equal(c[i].wrong, 0);
    }
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.batches, 6);
    assert_int_equal(s.rows, 6 * CLIENTS);
    assert_true(s.mean_batch == CLIENTS);
    assert_int_equal(s.largest_batch, CLIENTS);
    assert_int_equal(s.submitted, 6 * CLIENTS);
    assert_int_equal(s.answered, 6 * CLIENTS);
    assert_int_equal(s.failed + s.timed_out + s.refused + s.in_flight + s.queue_depth, 0);
    assert_true(s.row_bytes > 0); /* learned from the passes */
    assert_manager_empty(ndm_batcher_manager(b));
    assert_ok(ndm_batcher_close(b));
    assert_status(ndm_batcher_close(b), NDM_ALREADY);
    assert_ok(ndm_manager_close(model));
}

static void test_batcher_answers_are_the_predictors_copies(void **state)
{
    run_rounds(state, 0);
}

static void test_batcher_answers_are_the_predictors_loans(void **state)
{
    run_rounds(state, NDM_BATCHER_LOAN);
}

/* One request submitted by a thread, its answer kept. */
typedef struct kept {
    ndm_batcher b;
    ndm_manager m;
    ndm_array x, y;
    int64_t timeout_us;
    ndm_status st;
} kept;

static void *submit_keep(void *v)
{
    kept *k = v;
    ndm_clear_error();
    k->y = ndm_batcher_predict_to(k->m, k->b, k->x, k->timeout_us);
    k->st = k->y.id ? NDM_OK : ndm_last_status();
    return NULL;
}

/* A loan is a view of the batch's output: two answers of one batch share
 * its storage; copies do not. */
static void test_batcher_loans_share_the_batch_output(void **state)
{
    for (int loan = 0; loan < 2; loan++) {
        ndm_manager model = ndm_manager_new(ROOT(state), "model");
        ndm_predictor p = make_predictor(model);
        ndm_batcher b = ndm_batcher_new(
            p, &(ndm_batcher_options){.max_batch = 2, .max_delay_us = FOREVER_US,
                                      .flags = loan ? NDM_BATCHER_LOAN : 0});
        assert_live(b);
        kept k[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
            k[i].x = make_input(k[i].m, 1, i);
            assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        assert_ok(k[0].st);
        assert_ok(k[1].st);
        assert_int_equal(stats_of(b).batches, 1);
        assert_true(ndm_array_shares_storage(k[0].y, k[1].y) == (loan != 0));
        /* the batch is closed: the loans outlive it, charged to their callers */
        assert_manager_empty(ndm_batcher_manager(b));
        for (int i = 0; i < 2; i++) {
            assert_true(same_as_predict(p, k[i].x, k[i].y));
            assert_true(ndm_array_manager(k[i].y).id == k[i].m.id);
        }
        assert_ok(ndm_batcher_close(b));
        for (int i = 0; i < 2; i++)
            assert_ok(ndm_manager_close(k[i].m));
        assert_ok(ndm_manager_close(model));
    }
}

/* ---- deadlines ---------------------------------------------------------------------- */

/* A request alone waits for company that never comes: its deadline ends it,
 * and it leaves the queue. */
static void test_batcher_deadline_while_queued(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 8, .max_delay_us = FOREVER_US});
    assert_live(b);
    ndm_manager m = ndm_manager_new(ROOT(state), "caller");
    ndm_array x = make_input(m, 1, 0);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, x, 2000).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_TIMEOUT);
    assert_error_has("deadline");
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.submitted, 1);
    assert_int_equal(s.timed_out, 1);
    assert_int_equal(s.queue_depth + s.in_flight + s.batches + s.answered, 0);
    assert_ok(ndm_array_release(x));
    assert_manager_empty(m);
    assert_ok(ndm_batcher_close(b));
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_manager_close(model));
}

/* Short, varied deadlines under load, with requests timing out queued and
 * running: every request has exactly one outcome, and the batcher's counts
 * are the callers' counts. */
static void test_batcher_deadlines_under_load_answer_once(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(p, &(ndm_batcher_options){.max_batch = 3, .max_delay_us = 150});
    assert_live(b);
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        c[i] = (client){.b = b, .p = p, .id = i, .rounds = 300, .rows = 1 + i % 2,
                        .timeout_us = -1};
    start(c, CLIENTS, th);
    finish(c, CLIENTS, th);
    int answers = 0, timeouts = 0;
    for (int i = 0; i < CLIENTS; i++) {
        if (c[i].other)
            fail_msg("client %d: %s (%s)", i, c[i].other_msg, ndm_status_name(c[i].other_st));
        assert_int_equal(c[i].wrong + c[i].closed + c[i].busy, 0);
        assert_int_equal(c[i].answers + c[i].timeouts, 300);
        answers += c[i].answers;
        timeouts += c[i].timeouts;
    }
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.submitted, CLIENTS * 300);
    assert_int_equal(s.answered, answers);
    assert_int_equal(s.timed_out, timeouts);
    assert_int_equal(s.failed + s.in_flight + s.queue_depth, 0);
    print_message("%d answers, %d timeouts, %llu batches, mean %.2f rows\n", answers, timeouts,
                  (unsigned long long)s.batches, s.mean_batch);
    assert_ok(ndm_batcher_close(b));
    assert_manager_empty(ndm_predictor_manager(p));
    assert_ok(ndm_manager_close(model));
}

/* ---- the queue's bound and shutdown ------------------------------------------------------- */

/* max_queue requests wait; the next is refused at once with NDM_E_BUSY;
 * closing the batcher answers the queued ones with NDM_E_CLOSED. */
static void test_batcher_full_queue_refuses_then_close_answers(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 8, .max_delay_us = FOREVER_US, .max_queue = 2});
    assert_live(b);
    kept k[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
        k[i].x = make_input(k[i].m, 1, i);
        assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
    }
    wait_queued(b, 2);
    ndm_manager m = ndm_manager_new(ROOT(state), "caller");
    ndm_array x = make_input(m, 1, 9);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_BUSY);
    assert_error_has("queue is full");
    assert_string_equal(ndm_status_name(NDM_E_BUSY), "NDM_E_BUSY");
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.queue_peak, 2);
    assert_ok(ndm_batcher_close(b));
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(k[i].st, NDM_E_CLOSED);
        assert_int_equal(k[i].y.id, 0);
        assert_ok(ndm_array_release(k[i].x));
        assert_manager_empty(k[i].m);
        assert_ok(ndm_manager_close(k[i].m));
    }
    /* the handle is stale now */
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(ndm_batcher_manager(b).id, 0);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_close(m));
    assert_manager_empty(ndm_predictor_manager(p));
    assert_ok(ndm_manager_close(model));
}

/* Clients keep submitting while the batcher closes, or while the model
 * closes: every call ends with an answer or NDM_E_CLOSED, nothing hangs,
 * nothing is left behind. */
static void close_under_load(void **state, bool close_model)
{
    for (int round = 0; round < 4; round++) {
        ndm_manager model = ndm_manager_new(ROOT(state), "model");
        ndm_predictor p = make_predictor(model);
        ndm_batcher b = ndm_batcher_new(p, &(ndm_batcher_options){.max_batch = 4,
                                                                   .max_delay_us = 100,
                                                                   .max_queue = 64});
        assert_live(b);
        client c[CLIENTS];
        pthread_t th[CLIENTS];
        for (int i = 0; i < CLIENTS; i++)
            c[i] = (client){.b = b, .id = i, .rounds = 400, .rows = 1 + (i + round) % 3};
        start(c, CLIENTS, th);
        while (stats_of(b).answered < 20)
            sched_yield();
        if (close_model) {
            assert_ok(ndm_manager_close(model));
            assert_status(ndm_batcher_close(b), NDM_ALREADY);
        } else {
            assert_ok(ndm_batcher_close(b));
        }
        finish(c, CLIENTS, th);
        int closed = 0;
        for (int i = 0; i < CLIENTS; i++) {
            if (c[i].other)
                fail_msg("client %d: %s (%s)", i, c[i].other_msg, ndm_status_name(c[i].other_st));
            assert_int_equal(c[i].answers + c[i].closed, 400);
            closed += c[i].closed;
        }
        assert_true(closed > 0);
        if (!close_model) {
            assert_manager_empty(ndm_predictor_manager(p));
            assert_ok(ndm_manager_close(model));
        }
    }
}

static void test_batcher_close_under_load(void **state) { close_under_load(state, false); }

static void test_batcher_model_closed_under_load(void **state) { close_under_load(state, true); }

/* The predictor's manager (the batcher's parent) closed with requests
 * queued: they are answered NDM_E_CLOSED at once, and so is every later
 * request, until the batcher is closed. */
static void test_batcher_predictor_manager_closed_with_queue(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 8, .max_delay_us = FOREVER_US});
    assert_live(b);
    kept k[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
        k[i].x = make_input(k[i].m, 1, i);
        assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
    }
    wait_queued(b, 2);
    assert_ok(ndm_manager_close(ndm_predictor_manager(p)));
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(k[i].st, NDM_E_CLOSED);
    }
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(k[0].m, b, k[0].x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.failed, 2);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.in_flight + s.queue_depth, 0);
    assert_ok(ndm_batcher_close(b));
    for (int i = 0; i < 2; i++) {
        assert_ok(ndm_array_release(k[i].x));
        assert_ok(ndm_manager_close(k[i].m));
    }
    assert_ok(ndm_manager_close(model));
}

/* ---- admission -------------------------------------------------------------------------- */

/* With a limit of 2.5 rows' estimate on the batcher's manager, four rows
 * (max_batch 4, a delay never waited out) run as two batches of two, and a
 * request of three rows, which could never fit, is refused with
 * NDM_E_QUOTA at once. */
static void test_batcher_admission_splits_and_refuses(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 4, .max_delay_us = FOREVER_US, .row_bytes = 4096});
    assert_live(b);
    assert_ok(ndm_manager_set_limit(ndm_batcher_manager(b), NDM_CPU, 4096 * 5 / 2));
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        c[i] = (client){.b = b, .p = p, .id = i, .rounds = 1, .rows = 1};
    start(c, CLIENTS, th);
    finish(c, CLIENTS, th);
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(c[i].answers, 1);
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.batches, 2);
    assert_int_equal(s.largest_batch, 2);
    /* three rows alone need 12 KiB: never */
    ndm_manager m = ndm_manager_new(ROOT(state), "caller");
    ndm_array x = make_input(m, 3, 5);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_error_has("limits over the batcher's manager");
    assert_int_equal(stats_of(b).failed, 1);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_batcher_close(b));
    assert_ok(ndm_manager_close(model));
}

/* An estimate far too low (one byte a row): the full batch fails over the
 * limit, goes back to the queue with a higher estimate, and runs smaller;
 * every request is answered, bit for bit. */
static void test_batcher_over_limit_batch_runs_again_smaller(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    /* what one row needs: learned by a first batcher */
    ndm_batcher probe = ndm_batcher_new(p, NULL);
    ndm_manager m = ndm_manager_new(ROOT(state), "caller");
    ndm_array x = make_input(m, 1, 1);
    ndm_array y = ndm_batcher_predict_to(m, probe, x, 0);
    assert_live(y);
    uint64_t one = stats_of(probe).row_bytes;
    assert_true(one > 0);
    assert_ok(ndm_batcher_close(probe));
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(x));

    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 4, .max_delay_us = FOREVER_US, .row_bytes = 1});
    assert_live(b);
    assert_ok(ndm_manager_set_limit(ndm_batcher_manager(b), NDM_CPU, one * 3 / 2));
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        c[i] = (client){.b = b, .p = p, .id = i, .rounds = 1, .rows = 1};
    start(c, CLIENTS, th);
    finish(c, CLIENTS, th);
    for (int i = 0; i < CLIENTS; i++) {
        if (c[i].other)
            fail_msg("client %d: %s (%s)", i, c[i].other_msg, ndm_status_name(c[i].other_st));
        assert_int_equal(c[i].answers, 1);
        assert_int_equal(c[i].wrong, 0);
    }
    ndm_batcher_stats s = stats_of(b);
    assert_true(s.splits >= 1);
    assert_true(s.largest_batch < CLIENTS);
    assert_int_equal(s.answered, CLIENTS);
    assert_int_equal(s.failed, 0);
    assert_ok(ndm_batcher_close(b));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_manager_close(model));
}

/* ---- a failing forward pass --------------------------------------------------------------- */

/* An embedding net: an index out of range fails the forward pass. */
static ndm_predictor make_embedding_predictor(ndm_manager model)
{
    ndm_rng rng = ndm_rng_new(5);
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_embedding(model, 10, 3, &rng), ndm_flatten_module(model, 1)));
    ndm_no_grad_end();
    assert_live(net);
    ndm_predictor p = ndm_predictor_new(model, net);
    assert_live(p);
    return p;
}

static _Atomic int errors_logged;

static void count_errors(ndm_log_level level, const char *msg, void *ud)
{
    (void)msg;
    (void)ud;
    if (level == NDM_LOG_ERROR)
        atomic_fetch_add(&errors_logged, 1);
}

/* Four requests in one batch, one of them poisoned: the batch fails, runs
 * again one request at a time, and only the poisoned one fails, its error
 * logged once (by its caller's call, not by the worker's attempts). */
static void test_batcher_poisoned_input_fails_alone(void **state)
{
    atomic_store(&errors_logged, 0);
    ndm_set_log_fn(count_errors, NULL);
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_embedding_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 4, .max_delay_us = FOREVER_US});
    assert_live(b);
    kept k[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
        int64_t idx[2] = {i, i == 2 ? 99 : 9 - i};
        k[i].x = ndm_from_buffer(k[i].m, NDM_I64, idx, NDM_SHAPE(1, 2));
        assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        if (i == 2) {
            assert_int_equal(k[i].st, NDM_E_INVALID);
        } else {
            assert_ok(k[i].st);
            assert_true(same_as_predict(p, k[i].x, k[i].y));
            assert_ok(ndm_array_release(k[i].y));
        }
        assert_ok(ndm_array_release(k[i].x));
        assert_manager_empty(k[i].m);
        assert_ok(ndm_manager_close(k[i].m));
    }
    ndm_batcher_stats s = stats_of(b);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(atomic_load(&errors_logged), 1);
    assert_int_equal(s.isolated, 1);
    assert_int_equal(s.batches, 3); /* the three good ones, alone */
    assert_int_equal(s.answered, 3);
    assert_int_equal(s.failed, 1);
    assert_ok(ndm_batcher_close(b));
    assert_ok(ndm_manager_close(model));
}

/* Out of memory in a batch: the joined input's storage fails, the batch
 * runs again one request at a time and each is answered; failing a lone
 * request's pass gives its caller NDM_E_OOM, once. */
static void test_batcher_out_of_memory_answers_each_once(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 4, .max_delay_us = FOREVER_US});
    assert_live(b);
    kept k[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
        k[i].x = make_input(k[i].m, 1, i);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
    wait_queued(b, 3);
    ndm__alloc_fail_after(1); /* the next storage: the batch's joined input */
    assert_int_equal(pthread_create(&th[3], NULL, submit_keep, &k[3]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    ndm__alloc_fail_after(0);
    for (int i = 0; i < 4; i++) {
        assert_ok(k[i].st);
        assert_true(same_as_predict(p, k[i].x, k[i].y));
        assert_ok(ndm_array_release(k[i].y));
    }
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.isolated, 1);
    assert_int_equal(s.answered, 4);
    assert_ok(ndm_batcher_close(b));
    /* one request alone (a batcher that waits for no company), its pass
     * out of memory */
    b = ndm_batcher_new(p, NULL);
    assert_live(b);
    k[0].b = b;
    ndm__alloc_fail_after(1);
    submit_keep(&k[0]);
    ndm__alloc_fail_after(0);
    assert_int_equal(k[0].st, NDM_E_OOM);
    s = stats_of(b);
    assert_int_equal(s.failed, 1);
    assert_int_equal(s.submitted, 1);
    assert_manager_empty(ndm_batcher_manager(b));
    assert_ok(ndm_batcher_close(b));
    for (int i = 0; i < 4; i++) {
        assert_ok(ndm_array_release(k[i].x));
        assert_manager_empty(k[i].m);
        assert_ok(ndm_manager_close(k[i].m));
    }
    assert_ok(ndm_manager_close(model));
}

/* ---- signatures --------------------------------------------------------------------------- */

/* Inputs (1, 16) and (1, 4, 4) both suit the net (it flattens), but are
 * never joined: they run as separate batches, each answer the predictor's. */
static void test_batcher_other_shapes_batch_separately(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = 4, .max_delay_us = FOREVER_US});
    assert_live(b);
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        c[i] = (client){.b = b, .p = p, .id = i, .rounds = 1, .rows = 1, .shape3 = i % 2};
    start(c, CLIENTS, th);
    finish(c, CLIENTS, th);
    for (int i = 0; i < CLIENTS; i++) {
        assert_int_equal(c[i].answers, 1);
        assert_int_equal(c[i].wrong, 0);
    }
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.batches, 2);
    assert_int_equal(s.largest_batch, 2);
    assert_ok(ndm_batcher_close(b));
    assert_ok(ndm_manager_close(model));
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void test_batcher_bad_input_is_refused(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_predictor p = make_predictor(model);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_new(p, &(ndm_batcher_options){.max_batch = -1}).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(ndm_batcher_new(p, &(ndm_batcher_options){.flags = 1u << 7}).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_new((ndm_predictor){0}, NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_new((ndm_predictor){model.id}, NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_batcher b = ndm_batcher_new(p, &(ndm_batcher_options){.max_batch = 2});
    assert_live(b);
    ndm_manager m = ndm_manager_new(ROOT(state), "caller");
    ndm_array scalar = ndm_scalar(m, NDM_F32, 1.0);
    ndm_array three = make_input(m, 3, 0);
    ndm_array empty = ndm_empty(m, NDM_F32, NDM_SHAPE(0, IN));
    ndm_array x = make_input(m, 1, 0);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, scalar, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_int_equal(ndm_batcher_predict_to(m, b, three, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("max_batch (2)");
    assert_int_equal(ndm_batcher_predict_to(m, b, empty, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_int_equal(ndm_batcher_predict_to(m, b, x, -5).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, b, NDM_NULL_ARRAY, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    /* a forged handle, a predictor passed as a batcher */
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(m, (ndm_batcher){p.id}, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_status(ndm_batcher_close((ndm_batcher){p.id}), NDM_E_INVALID);
    assert_status(ndm_batcher_stats_get(b, NULL), NDM_E_INVALID);
    /* a closed caller's manager: the answer is refused, the request fails */
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    assert_ok(ndm_manager_close(gone));
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(gone, b, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* a capped one: the batch ran, the answer is refused at the move */
    ndm_manager capped = ndm_manager_new(ROOT(state), "capped");
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    ndm_clear_error();
    assert_int_equal(ndm_batcher_predict_to(capped, b, x, 0).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.refused, 6);
    assert_int_equal(s.failed, 1);
    assert_int_equal(s.batches, 1);
    assert_manager_empty(ndm_batcher_manager(b));
    assert_ok(ndm_manager_close(capped));
    assert_ok(ndm_batcher_close(b));
    assert_status(ndm_batcher_close(b), NDM_ALREADY);
    ndm_clear_error();
    assert_status(ndm_batcher_close((ndm_batcher){0}), NDM_E_NULL);
    assert_status(ndm_batcher_stats_get(b, &s), NDM_E_CLOSED);
    assert_manager_empty(ndm_predictor_manager(p));
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_manager_close(model));
    /* the model's close took the batcher with it */
    ndm_manager model2 = ndm_manager_new(ROOT(state), "model");
    ndm_batcher b2 = ndm_batcher_new(make_predictor(model2), NULL);
    assert_live(b2);
    assert_ok(ndm_manager_close(model2));
    assert_status(ndm_batcher_close(b2), NDM_ALREADY);
    ndm_clear_error();
    assert_int_equal(ndm_batcher_manager(b2).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
}

/* ---- CUDA ------------------------------------------------------------------------------------ */

/* The model and its batches on a CUDA device (the host stand-in in the
 * tests), CPU inputs: answers on the device, the predictor's. */
static void test_batcher_cuda_model(void **state)
{
    if (ndm_cuda_device_count() == 0) {
        print_message("no CUDA device: skipped\n");
        return;
    }
    ndm_manager model = ndm_manager_new_on(ROOT(state), "model", NDM_CUDA(0));
    ndm_predictor p = make_predictor(model);
    ndm_batcher b = ndm_batcher_new(
        p, &(ndm_batcher_options){.max_batch = CLIENTS, .max_delay_us = FOREVER_US});
    assert_live(b);
    kept k[CLIENTS];
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        k[i] = (kept){.b = b, .m = ndm_manager_new(ROOT(state), "caller")};
        k[i].x = make_input(k[i].m, 1, i);
        assert_int_equal(pthread_create(&th[i], NULL, submit_keep, &k[i]), 0);
    }
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < CLIENTS; i++) {
        assert_ok(k[i].st);
        assert_int_equal(ndm_array_device(k[i].y).type, NDM_DEVICE_CUDA);
        /* the stand-in's GEMM may round a batch otherwise than one row */
        ndm_manager chk = ndm_manager_new(ROOT(state), "check");
        ndm_array want = ndm_predict_to(chk, p, k[i].x);
        float a[4], w[4];
        assert_ok(ndm_array_copy_out(k[i].y, a, sizeof a));
        assert_ok(ndm_array_copy_out(want, w, sizeof w));
        for (int j = 0; j < 4; j++)
            assert_true(fabsf(a[j] - w[j]) <= 1e-5f * (1.0f + fabsf(w[j])));
        assert_ok(ndm_manager_close(chk));
        assert_ok(ndm_array_release(k[i].y));
        assert_ok(ndm_array_release(k[i].x));
        assert_ok(ndm_manager_close(k[i].m));
    }
    ndm_batcher_stats s = stats_of(b);
    assert_int_equal(s.batches, 1);
    assert_int_equal(s.largest_batch, CLIENTS);
    assert_true(s.row_bytes > 0); /* device bytes, learned */
    ndm_stats ms;
    assert_ok(ndm_manager_stats(ndm_batcher_manager(b), NDM_CUDA(0), NDM_STATS_SUBTREE, &ms));
    assert_int_equal(ms.live_bytes, 0);
    assert_ok(ndm_batcher_close(b));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_batcher_answers_are_the_predictors_copies),
        TEST(test_batcher_answers_are_the_predictors_loans),
        TEST(test_batcher_loans_share_the_batch_output),
        TEST(test_batcher_deadline_while_queued),
        TEST(test_batcher_deadlines_under_load_answer_once),
        TEST(test_batcher_full_queue_refuses_then_close_answers),
        TEST(test_batcher_close_under_load),
        TEST(test_batcher_model_closed_under_load),
        TEST(test_batcher_predictor_manager_closed_with_queue),
        TEST(test_batcher_admission_splits_and_refuses),
        TEST(test_batcher_over_limit_batch_runs_again_smaller),
        TEST(test_batcher_poisoned_input_fails_alone),
        TEST(test_batcher_out_of_memory_answers_each_once),
        TEST(test_batcher_other_shapes_batch_separately),
        TEST(test_batcher_bad_input_is_refused),
        TEST(test_batcher_cuda_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
