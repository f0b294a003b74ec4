/* Loader workers: batches prepared ahead by threads come out in the order
 * and with the bytes of the loader without workers; stopping early (loader
 * close, trainer close, a new epoch) leaves nothing behind; a batch a
 * worker cannot make is reported as the loader without workers reports it,
 * and the loader goes on from there. Also run under ThreadSanitizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

typedef struct tree {
    ndm_manager model, trainer;
} tree;

static tree make_tree(void **state)
{
    tree t;
    t.model = ndm_manager_new(ROOT(state), "model");
    t.trainer = ndm_manager_new(t.model, "trainer");
    assert_live(t.model);
    assert_live(t.trainer);
    return t;
}

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    return st;
}

/* Images (u8, 2x3 per example, from a fixed hash) and labels 0..9. */
static ndm_dataset images(ndm_manager m, int64_t n)
{
    uint8_t *x = malloc((size_t)n * 6 + 1);
    uint8_t *y = malloc((size_t)n + 1);
    assert_non_null(x);
    assert_non_null(y);
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n * 6; i++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        x[i] = (uint8_t)h;
    }
    for (int64_t i = 0; i < n; i++)
        y[i] = (uint8_t)(i % 10);
    ndm_dataset d = {ndm_from_buffer(m, NDM_U8, x, NDM_SHAPE(n, 2, 3)),
                     ndm_from_buffer(m, NDM_U8, y, NDM_SHAPE(n))};
    free(x);
    free(y);
    assert_live(d.inputs);
    assert_live(d.labels);
    return d;
}

/* What a run of fetches gave: per fetch its return, its batch's position
 * and name, and its bytes, one after another. */
typedef struct trace {
    char *bytes;
    size_t len, cap;
} trace;

static void put(trace *t, const void *p, size_t n)
{
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2;
        t->bytes = realloc(t->bytes, t->cap);
        assert_non_null(t->bytes);
    }
    memcpy(t->bytes + t->len, p, n);
    t->len += n;
}

static void put_array(trace *t, ndm_array a)
{
    int64_t nbytes = ndm_array_nbytes(a);
    assert_true(nbytes >= 0);
    char *buf = malloc((size_t)nbytes + 1);
    assert_ok(ndm_array_copy_out(a, buf, (size_t)nbytes));
    put(t, &nbytes, sizeof nbytes);
    put(t, buf, (size_t)nbytes);
    free(buf);
}

/* One fetch, recorded. */
static int fetch(ndm_loader ld, trace *t)
{
    ndm_batch b;
    int rc = ndm_loader_next(ld, &b);
    put(t, &rc, sizeof rc);
    if (rc < 0)
        fail_msg("ndm_loader_next: %s", ndm_last_error());
    if (rc == 0)
        return 0;
    int64_t pos[4] = {b.size, b.epoch, b.index, b.step};
    put(t, pos, sizeof pos);
    char name[64];
    assert_true(ndm_manager_name(b.manager, name, sizeof name) > 0);
    put(t, name, strlen(name) + 1);
    assert_true(ndm_manager_parent(b.manager).id != 0);
    assert_true(ndm_array_manager(b.inputs).id == b.manager.id);
    put_array(t, b.inputs);
    if (b.labels.id)
        put_array(t, b.labels);
    return rc;
}

/* Three epochs, then back to epoch 1 in the middle of epoch 3, two more
 * epochs, a jump to epoch 7 and a few batches of it. */
static trace run(void **state, ndm_dataset d, ndm_loader_options o)
{
    tree t = make_tree(state);
    ndm_loader ld = ndm_loader_new(t.trainer, d, &o);
    assert_true(ld.id);
    trace tr = {0};
    for (int e = 0; e < 3; e++)
        while (fetch(ld, &tr) > 0) {
        }
    for (int i = 0; i < 2; i++)
        fetch(ld, &tr);
    assert_ok(ndm_loader_set_epoch(ld, 1));
    for (int e = 0; e < 2; e++)
        while (fetch(ld, &tr) > 0) {
        }
    assert_ok(ndm_loader_set_epoch(ld, 7));
    for (int i = 0; i < 3; i++)
        fetch(ld, &tr);
    assert_ok(ndm_loader_close(ld));
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.children, 0);
    assert_int_equal(s.live_arrays, 0);
    assert_ok(ndm_manager_close(t.model));
    return tr;
}

static void test_workers_deal_the_same_batches_bit_for_bit(void **state)
{
    ndm_dataset d = images(ROOT(state), 53);
    const ndm_loader_options shapes[] = {
        {.batch_size = 8, .seed = 5, .flags = NDM_LOADER_SHUFFLE},
        {.batch_size = 8, .seed = 5,
         .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64},
        {.batch_size = 7, .seed = 9, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_DROP_LAST},
        {.batch_size = 4, .seed = 3, .flags = NDM_LOADER_SHUFFLE, .num_shards = 3, .shard = 1},
        {.batch_size = 10, .flags = 0},
        {.batch_size = 60, .seed = 1, .flags = NDM_LOADER_SHUFFLE}, /* one batch an epoch */
    };
    const int workers[] = {1, 3, 3, 2};
    const int prefetch[] = {0, 0, 7, 1};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        trace want = run(state, d, shapes[k]);
        for (size_t w = 0; w < sizeof workers / sizeof *workers; w++) {
            ndm_loader_options o = shapes[k];
            o.workers = workers[w];
            o.prefetch = prefetch[w];
            trace got = run(state, d, o);
            if (got.len != want.len || memcmp(got.bytes, want.bytes, want.len) != 0)
                fail_msg("options %zu with %d workers, prefetch %d: the batches differ", k,
                         workers[w], prefetch[w]);
            free(got.bytes);
        }
        free(want.bytes);
    }
    /* unlabelled, and empty, data */
    ndm_dataset u = {d.inputs, NDM_NULL_ARRAY};
    trace want = run(state, u, (ndm_loader_options){.batch_size = 8, .seed = 2,
                                                   .flags = NDM_LOADER_SHUFFLE});
    trace got = run(state, u, (ndm_loader_options){.batch_size = 8, .seed = 2,
                                                  .flags = NDM_LOADER_SHUFFLE, .workers = 2});
    assert_int_equal(got.len, want.len);
    assert_memory_equal(got.bytes, want.bytes, want.len);
    free(want.bytes);
    free(got.bytes);
    tree t = make_tree(state);
    ndm_array none = ndm_empty(ROOT(state), NDM_U8, NDM_SHAPE(0, 2));
    ndm_loader ld = ndm_loader_new(t.trainer, ((ndm_dataset){none, NDM_NULL_ARRAY}),
                                   &(ndm_loader_options){.batch_size = 4, .workers = 3});
    ndm_batch b;
    for (int i = 0; i < 3; i++)
        assert_int_equal(ndm_loader_next(ld, &b), 0);
    assert_int_equal(stats_of(t.trainer).children, 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_array_release(none));
    assert_ok(ndm_dataset_release(&d));
}

/* The managers and arrays of the batches prepared ahead are made by the
 * fetch, in order: after the first fetch the trainer holds the current
 * batch and `prefetch` more, named by their steps. */
static void test_workers_prepare_named_batches_ahead(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = images(ROOT(state), 40);
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
        .batch_size = 4, .flags = NDM_LOADER_SHUFFLE, .workers = 2, .prefetch = 3});
    ndm_batch b;
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    /* made by the fetch, whatever the workers have done yet */
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.children, 4);
    assert_int_equal(s.live_arrays, 8);
    assert_int_equal(s.live_bytes, 4 * (4 * 6 + 4));
    char path[256];
    assert_true(ndm_manager_path(b.manager, path, sizeof path) > 0);
    assert_string_equal(path, "system/test/model/trainer/batch-0");
    for (int i = 1; i <= 9; i++) {
        assert_int_equal(ndm_loader_next(ld, &b), 1);
        assert_int_equal(b.step, i);
        snprintf(path, sizeof path, "batch-%d", i);
        char name[64];
        assert_true(ndm_manager_name(b.manager, name, sizeof name) > 0);
        assert_string_equal(name, path);
        /* (the epoch's last batch: the next epoch's are prepared too) */
        assert_int_equal(stats_of(t.trainer).children, 4);
    }
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

/* Stop early every way, with batches queued, running and ready: nothing is
 * left in the trainer, the threads are gone (the process's thread count is
 * not asked: a leaked thread would keep its batch, which is). */
static void test_workers_stopping_early_leaves_nothing(void **state)
{
    ndm_dataset d = images(ROOT(state), 64);
    for (int round = 0; round < 24; round++) {
        tree t = make_tree(state);
        unsigned flags = NDM_LOADER_SHUFFLE | (round % 3 == 2 ? NDM_LOADER_KEEP_BATCHES : 0);
        ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
            .batch_size = 4, .flags = flags, .workers = 1 + round % 4, .prefetch = 1 + round % 6});
        assert_true(ld.id);
        ndm_batch b;
        int fetched = round % 5;
        for (int i = 0; i < fetched; i++)
            assert_int_equal(ndm_loader_next(ld, &b), 1);
        int how = round % 4;
        if (how == 0) {
            assert_ok(ndm_loader_close(ld));
        } else if (how == 1) {
            assert_ok(ndm_manager_close(t.trainer));
        } else if (how == 2) {
            assert_ok(ndm_loader_set_epoch(ld, 3));
            assert_int_equal(stats_of(t.trainer).children,
                             flags & NDM_LOADER_KEEP_BATCHES ? fetched : 0);
            assert_ok(ndm_loader_close(ld));
        } else {
            assert_ok(ndm_manager_close(t.model));
        }
        if (how != 1 && how != 3) {
            ndm_stats s = stats_of(t.trainer);
            /* only the batches the caller kept */
            assert_int_equal(s.children, flags & NDM_LOADER_KEEP_BATCHES ? fetched : 0);
            assert_int_equal(s.live_arrays, 2 * s.children);
        }
        assert_false(ndm_loader_valid(ld));
        assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CLOSED);
        assert_true(ndm_manager_close(t.model) >= 0); /* (NDM_ALREADY when closed above) */
        assert_int_equal(stats_of(ROOT(state)).children, 0);
    }
    assert_ok(ndm_dataset_release(&d));
}

/* What a fetch returned: its status and message, and its batch's bytes. */
typedef struct outcome {
    int rc;
    char msg[1024];
} outcome;

/* Keep every batch under a limit of 2.5 batches: the third fails. Then the
 * first kept batch is closed and the loader goes on from the failed one to
 * the end of the epoch. Returns the trace; *fail is the failed fetch. */
static trace limited(void **state, ndm_dataset d, int workers, uint64_t batch_bytes,
                     outcome *fail)
{
    tree t = make_tree(state);
    assert_ok(ndm_manager_set_limit(t.trainer, NDM_CPU, batch_bytes * 5 / 2));
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
        .batch_size = 8, .seed = 4, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_KEEP_BATCHES,
        .workers = workers, .prefetch = workers ? 4 : 0});
    assert_true(ld.id);
    trace tr = {0};
    ndm_batch first;
    assert_int_equal(ndm_loader_next(ld, &first), 1);
    assert_int_equal(fetch(ld, &tr), 1);
    ndm_batch b;
    fail->rc = ndm_loader_next(ld, &b);
    snprintf(fail->msg, sizeof fail->msg, "%s", ndm_last_error());
    assert_false(b.manager.id);
    /* the same failure again (but for the line): the loader stays at that batch */
    *strstr(fail->msg, " [at ") = '\0';
    assert_int_equal(ndm_loader_next(ld, &b), fail->rc);
    assert_true(strncmp(ndm_last_error(), fail->msg, strlen(fail->msg)) == 0);
    assert_ok(ndm_manager_close(first.manager));
    /* from the failed batch on, closing each kept one as we go */
    for (;;) {
        ndm_batch nb;
        int rc = ndm_loader_next(ld, &nb);
        put(&tr, &rc, sizeof rc);
        if (rc <= 0) {
            assert_int_equal(rc, 0);
            break;
        }
        int64_t pos[3] = {nb.epoch, nb.index, nb.step};
        put(&tr, pos, sizeof pos);
        put_array(&tr, nb.inputs);
        put_array(&tr, nb.labels);
        assert_ok(ndm_manager_close(nb.manager));
    }
    assert_ok(ndm_loader_close(ld));
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.children, 1); /* the second batch, kept */
    assert_int_equal(s.live_arrays, 2);
    assert_ok(ndm_manager_close(t.model));
    return tr;
}

static void test_workers_report_a_failed_batch_as_without_workers(void **state)
{
    ndm_dataset d = images(ROOT(state), 50);
    /* how many bytes a batch holds */
    tree t = make_tree(state);
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){.batch_size = 8});
    ndm_batch probe;
    assert_int_equal(ndm_loader_next(ld, &probe), 1);
    uint64_t batch_bytes = stats_of(t.trainer).live_bytes;
    assert_true(batch_bytes > 0);
    assert_ok(ndm_manager_close(t.model));
    outcome want, got;
    trace a = limited(state, d, 0, batch_bytes, &want);
    assert_int_equal(want.rc, NDM_E_QUOTA);
    if (!strstr(want.msg, "ndm_loader_next: batch-2 (epoch 0, batch 2) not made: ") ||
        !strstr(want.msg, "would exceed the limit of manager 'system/test/model/trainer'"))
        fail_msg("the failure does not name its batch: %s", want.msg);
    for (int w = 1; w <= 3; w += 2) {
        trace b = limited(state, d, w, batch_bytes, &got);
        assert_int_equal(got.rc, want.rc);
        assert_string_equal(got.msg, want.msg);
        assert_int_equal(b.len, a.len);
        assert_memory_equal(b.bytes, a.bytes, a.len);
        free(b.bytes);
    }
    free(a.bytes);
    assert_ok(ndm_dataset_release(&d));
}

/* A manager for a batch ahead that cannot be made (the trainer is capped
 * meanwhile) is no error of the fetch that schedules it; the fetch that
 * reaches that batch fails as the loader without workers does. */
static void test_workers_defer_a_refused_batch_to_its_fetch(void **state)
{
    ndm_dataset d = images(ROOT(state), 40);
    for (int workers = 0; workers <= 2; workers += 2) {
        tree t = make_tree(state);
        ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
            .batch_size = 4, .workers = workers, .prefetch = workers ? 2 : 0});
        ndm_batch b;
        assert_int_equal(ndm_loader_next(ld, &b), 1);
        assert_ok(ndm_manager_cap(t.trainer, NDM_CAP_CHILDREN));
        ndm_clear_error();
        for (int i = 0; i < (workers ? 2 : 0); i++) {
            assert_int_equal(ndm_loader_next(ld, &b), 1); /* prepared before the cap */
            assert_int_equal(ndm_last_status(), NDM_OK);
        }
        assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CAPPED);
        assert_error_has("refuses new children");
        assert_error_has(workers ? "'batch-3' refused" : "'batch-1' refused");
        assert_ok(ndm_manager_uncap(t.trainer, NDM_CAP_CHILDREN));
        assert_int_equal(ndm_loader_next(ld, &b), 1);
        assert_int_equal(b.step, workers ? 3 : 1);
        assert_ok(ndm_manager_close(t.model));
    }
    assert_ok(ndm_dataset_release(&d));
}

static void test_workers_reject_bad_options(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = images(ROOT(state), 10);
    const int bad[][2] = {{-1, 0}, {65, 0}, {1, -1}, {1, 1025}, {0, 2}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
            .batch_size = 2, .workers = bad[i][0], .prefetch = bad[i][1]});
        assert_false(ld.id);
        assert_int_equal(ndm_last_status(), NDM_E_INVALID);
        assert_error_has("workers");
    }
    /* the largest are fine */
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
        .batch_size = 2, .workers = 64, .prefetch = 1024});
    assert_true(ld.id);
    ndm_batch b;
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_ok(ndm_loader_close(ld));
    assert_int_equal(ndm_loader_close(ld), NDM_ALREADY);
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.children, 0);
    assert_int_equal(s.live_arrays, 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

/* The dataset released while batches are prepared from it (a caller
 * error that must stay safe): the next fetch fails with NDM_E_CLOSED and
 * the message of the loader without workers, and the trainer is left with
 * nothing but the batches it failed to hand out, closed with the loader. */
static void test_workers_survive_a_released_dataset(void **state)
{
    char want[1024] = "";
    for (int workers = 0; workers <= 3; workers += 3) {
        tree t = make_tree(state);
        ndm_dataset d = images(ROOT(state), 400);
        ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
            .batch_size = 4, .flags = NDM_LOADER_SHUFFLE, .workers = workers,
            .prefetch = workers ? 6 : 0});
        ndm_batch b;
        assert_int_equal(ndm_loader_next(ld, &b), 1);
        assert_ok(ndm_dataset_release(&d));
        assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CLOSED);
        if (!workers)
            snprintf(want, sizeof want, "%s", ndm_last_error());
        else
            assert_string_equal(ndm_last_error(), want);
        assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CLOSED);
        ndm_stats s = stats_of(t.trainer);
        assert_int_equal(s.live_arrays, 0);
        assert_int_equal(s.children, 0);
        assert_ok(ndm_loader_close(ld));
        assert_ok(ndm_manager_close(t.model));
    }
}

/* The growth tracker over a loop with workers: the batches prepared ahead
 * are steady, never a leak; batches kept every step are a leak opened at
 * the line of the fetch. */
static void test_workers_batches_ahead_are_no_leak(void **state)
{
    ndm_dataset d = images(ROOT(state), 64);
    for (int keep = 0; keep <= 1; keep++) {
        tree t = make_tree(state);
        ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
            .batch_size = 4, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS,
            .workers = 2, .prefetch = 3});
        ndm_growth g = ndm_growth_new(ROOT(state), t.model);
        assert_true(ndm_growth_valid(g));
        int line = 0;
        for (int step = 0; step < 40; step++) {
            ndm_batch b;
            line = __LINE__ + 1;
            int rc = ndm_loader_next(ld, &b);
            assert_true(rc >= 0);
            if (rc == 1) {
                ndm_array y = ndm_mul(b.inputs, b.inputs); /* the step's work, in the batch */
                assert_live(y);
                if (keep)
                    assert_ok(ndm_loader_keep(ld));
            }
            assert_ok(ndm_growth_step(g));
        }
        /* kept: the batch managers, their arrays, the step's product */
        assert_int_equal(ndm_growth_leaks(g), keep ? 3 : 0);
        if (keep) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            assert_ok(ndm_growth_report(g, f));
            fclose(f);
            char site[64];
            snprintf(site, sizeof site, "opened at test_loader_workers.c:%d", line);
            if (!strstr(buf, "managers 'batch-40' (and other names)") || !strstr(buf, site))
                fail_msg("the leak is not named at the fetch:\n%s", buf);
            free(buf);
        }
        assert_ok(ndm_growth_free(g));
        assert_ok(ndm_manager_close(t.model));
    }
    assert_ok(ndm_dataset_release(&d));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_workers_deal_the_same_batches_bit_for_bit),
        TEST(test_workers_prepare_named_batches_ahead),
        TEST(test_workers_stopping_early_leaves_nothing),
        TEST(test_workers_report_a_failed_batch_as_without_workers),
        TEST(test_workers_defer_a_refused_batch_to_its_fetch),
        TEST(test_workers_reject_bad_options),
        TEST(test_workers_survive_a_released_dataset),
        TEST(test_workers_batches_ahead_are_no_leak),
    };
    return cmocka_run_group_tests_name("loader_workers", tests, NULL, NULL);
}
