/* Threads: 8 threads each create and close 10,000 request managers under one
 * shared, capped model manager while reading the model's arrays; counts return
 * to baseline and nothing leaks. Also run under ThreadSanitizer. */
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"

#define THREADS 8
#define REQUESTS 10000

typedef struct worker {
    ndm_manager predictor;
    ndm_array w;
    int id;
    int errors;
    double checksum;
    char first_error[256];
} worker;

static void note_error(worker *wk, const char *what)
{
    if (!wk->errors++)
        snprintf(wk->first_error, sizeof wk->first_error, "%s: %s", what, ndm_last_error());
}

static void *serve(void *p)
{
    worker *wk = p;
    for (int i = 0; i < REQUESTS; i++) {
        ndm_manager req = ndm_manager_new(wk->predictor, "request");
        if (!req.id) {
            note_error(wk, "new request");
            continue;
        }
        ndm_array x = ndm_full(req, NDM_F32, (double)wk->id, NDM_SHAPE(4, 8));
        /* views of the shared model's weights, created in this request's scope */
        ndm_manager s = ndm_scope_begin(req, "tmp");
        ndm_array wt = ndm_transpose(wk->w);
        ndm_array row = ndm_select(wt, 0, i % 8);
        float v[4];
        if (!x.id || !s.id || !row.id || ndm_array_copy_out(row, v, sizeof v) != NDM_OK)
            note_error(wk, "request work");
        else
            wk->checksum += v[0] + v[3];
        if (ndm_scope_end(s, 1, &row) != NDM_OK)
            note_error(wk, "scope end");
        if (i % 100 == 0) {
            /* stats and dumps from many threads at once must be safe */
            ndm_stats st;
            if (ndm_manager_stats(wk->predictor, NDM_CPU, NDM_STATS_SUBTREE, &st) != NDM_OK)
                note_error(wk, "stats");
        }
        if (ndm_manager_close(req) != NDM_OK)
            note_error(wk, "close");
    }
    return NULL;
}

static void test_threads_requests_under_shared_model(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    float wdata[8][4];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 4; c++)
            wdata[r][c] = (float)(r * 4 + c);
    ndm_array w = ndm_from_buffer(model, NDM_F32, wdata, NDM_SHAPE(4, 8));
    assert_live(w);
    ndm_manager predictor = ndm_manager_new(model, "predictor");
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_stats base;
    assert_ok(ndm_manager_stats(model, NDM_CPU, NDM_STATS_SUBTREE, &base));

    pthread_t th[THREADS];
    worker wk[THREADS];
    for (int t = 0; t < THREADS; t++) {
        wk[t] = (worker){predictor, w, t, 0, 0, ""};
        assert_int_equal(pthread_create(&th[t], NULL, serve, &wk[t]), 0);
    }
    double expect = 0;
    /* row i%8 of w's transpose is column i%8 of w: elements (0, i%8) and (3, i%8) */
    for (int i = 0; i < REQUESTS; i++)
        expect += wdata[0][0] * 0 + ((float *)wdata)[i % 8] + ((float *)wdata)[3 * 8 + i % 8];
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        if (wk[t].errors)
            fail_msg("thread %d: %d errors, first: %s", t, wk[t].errors, wk[t].first_error);
        assert_true(wk[t].checksum == expect);
    }

    ndm_stats after;
    assert_ok(ndm_manager_stats(model, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_int_equal(after.live_arrays, base.live_arrays);
    assert_int_equal(after.live_bytes, base.live_bytes);
    assert_int_equal(after.children, base.children);
    ndm_stats pred;
    assert_ok(ndm_manager_stats(predictor, NDM_CPU, 0, &pred));
    assert_int_equal(pred.children, 0);
    assert_int_equal(pred.live_arrays, 0);
    /* the model itself was never written to */
    ndm_stats m;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &m));
    assert_int_equal(m.created, 1);
    assert_int_equal(m.live_arrays, 1);
    assert_ok(ndm_manager_close(model));
}

/* Threads moving arrays between shared managers and closing them race on
 * the same records; counts must stay exact. */
typedef struct mover {
    ndm_manager a, b;
    int errors;
} mover;

static void *shuffle(void *p)
{
    mover *mv = p;
    for (int i = 0; i < 2000; i++) {
        ndm_array x = ndm_zeros(mv->a, NDM_U8, NDM_SHAPE(16));
        ndm_array v = ndm_alias_to(mv->b, x);
        if (!x.id || !v.id || ndm_attach(x, mv->b) != NDM_OK || ndm_ret(v) != NDM_OK ||
            ndm_array_release(x) != NDM_OK || ndm_array_release(v) != NDM_OK)
            mv->errors++;
    }
    return NULL;
}

static void test_threads_moves_between_shared_managers(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(a, "b");
    pthread_t th[4];
    mover mv[4];
    for (int t = 0; t < 4; t++) {
        mv[t] = (mover){a, b, 0};
        assert_int_equal(pthread_create(&th[t], NULL, shuffle, &mv[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(mv[t].errors, 0);
    }
    ndm_stats sa, sb;
    assert_ok(ndm_manager_stats(a, NDM_CPU, 0, &sa));
    assert_ok(ndm_manager_stats(b, NDM_CPU, 0, &sb));
    assert_int_equal(sa.live_arrays + sb.live_arrays, 0);
    assert_int_equal(sa.live_bytes + sb.live_bytes, 0);
    assert_int_equal(sa.created, 8000);
    assert_int_equal(sb.created, 8000);
    assert_int_equal(sa.moved_in, 8000);  /* the rets */
    assert_int_equal(sb.moved_in, 8000);  /* the attaches */
    assert_int_equal(sa.released + sb.released, 16000);
    assert_ok(ndm_manager_close(a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_threads_requests_under_shared_model),
        TEST(test_threads_moves_between_shared_managers),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
