/* The CPU thread pool: chunks cover the range exactly as ndm__parallel_chunks
 * says, nested and concurrent calls, the thread count from the environment,
 * and workers that stop when the pool shrinks. Also run under ThreadSanitizer. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "backends/cpu/parallel.h"
#include "helpers.h"

#define MAX_ITEMS 5000
#define MAX_CHUNKS 1024

/* What one job saw: how often each item ran and the chunks it came in. */
typedef struct seen {
    atomic_int hits[MAX_ITEMS];
    atomic_int nchunks;
    int64_t begin[MAX_CHUNKS], end[MAX_CHUNKS];
} seen;

static void record(void *ctx, int64_t b, int64_t e)
{
    seen *s = ctx;
    int c = atomic_fetch_add(&s->nchunks, 1);
    if (c < MAX_CHUNKS) {
        s->begin[c] = b;
        s->end[c] = e;
    }
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&s->hits[i], 1);
}

static void reset(seen *s)
{
    for (int i = 0; i < MAX_ITEMS; i++)
        atomic_init(&s->hits[i], 0);
    atomic_init(&s->nchunks, 0);
}

static int by_begin(const void *x, const void *y)
{
    const int64_t *a = x, *b = y;
    return *a < *b ? -1 : *a > *b;
}

/* Every item once, in the chunks ndm__parallel_chunks predicts. */
static void check_job(seen *s, int64_t n, int64_t grain, int threads)
{
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&s->hits[i]) != 1)
            fail_msg("n=%lld grain=%lld threads=%d: item %lld ran %d times", (long long)n,
                     (long long)grain, threads, (long long)i, atomic_load(&s->hits[i]));
    int64_t want = ndm__parallel_chunks(n, grain, threads);
    int got = atomic_load(&s->nchunks);
    /* one chunk runs as a single call over the whole range */
    assert_int_equal(got, want);
    int64_t pairs[MAX_CHUNKS][2];
    for (int c = 0; c < got; c++)
        pairs[c][0] = s->begin[c], pairs[c][1] = s->end[c];
    qsort(pairs, (size_t)got, sizeof pairs[0], by_begin);
    int64_t size = (n + want - 1) / want;
    for (int c = 0; c < got; c++) {
        assert_int_equal(pairs[c][0], c * size);
        assert_int_equal(pairs[c][1], c + 1 < got ? (c + 1) * size : n);
    }
}

static void test_pool_chunks_cover_range_exactly(void **state)
{
    (void)state;
    static seen s;
    static const int64_t ns[] = {1, 2, 3, 7, 64, 100, 1000, 4999};
    static const int64_t grains[] = {1, 3, 16, 1000};
    int keep = ndm__num_threads();
    for (int t = 1; t <= 4; t++) {
        ndm__set_num_threads(t);
        assert_int_equal(ndm__num_threads(), t);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
                reset(&s);
                ndm__parallel_for(ns[i], grains[g], record, &s);
                check_job(&s, ns[i], grains[g], t);
            }
    }
    /* more chunks than threads, so a stalled thread holds up one small part */
    assert_int_equal(ndm__parallel_chunks(1000, 1, 2), 8);
    assert_int_equal(ndm__parallel_chunks(1000, 300, 2), 4);
    assert_int_equal(ndm__parallel_chunks(10, 1, 1), 1);
    assert_int_equal(ndm__parallel_chunks(0, 1, 2), 0);
    ndm__set_num_threads(keep);
}

typedef struct nest {
    seen *inner;
    atomic_int outer_items;
    atomic_int other_thread; /* inner chunks that ran off their caller's thread */
} nest;

typedef struct inner_ctx {
    seen *s;
    int64_t base;
    pthread_t owner;
    atomic_int *other;
} inner_ctx;

static void inner_fn(void *ctx, int64_t b, int64_t e)
{
    inner_ctx *q = ctx;
    if (!pthread_equal(q->owner, pthread_self()))
        atomic_fetch_add(q->other, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&q->s->hits[q->base + i], 1);
}

static void outer_fn(void *ctx, int64_t b, int64_t e)
{
    nest *q = ctx;
    for (int64_t i = b; i < e; i++) {
        inner_ctx in = {q->inner, i * 50, pthread_self(), &q->other_thread};
        ndm__parallel_for(50, 1, inner_fn, &in);
        atomic_fetch_add(&q->outer_items, 1);
    }
}

static void test_pool_nested_calls_run_inline(void **state)
{
    (void)state;
    static seen s;
    reset(&s);
    int keep = ndm__set_num_threads(3);
    nest q = {.inner = &s};
    atomic_init(&q.outer_items, 0);
    atomic_init(&q.other_thread, 0);
    ndm__parallel_for(40, 1, outer_fn, &q);
    assert_int_equal(atomic_load(&q.outer_items), 40);
    assert_int_equal(atomic_load(&q.other_thread), 0);
    for (int i = 0; i < 40 * 50; i++)
        assert_int_equal(atomic_load(&s.hits[i]), 1);
    ndm__set_num_threads(keep);
}

static int affinity_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return -1;
    return CPU_COUNT(&set);
}

static int warned;
static char warned_text[256];

static void count_warning(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN) {
        warned++;
        snprintf(warned_text, sizeof warned_text, "%s", msg);
    }
}

/* Runs first: the pool's starting size is NDM_NUM_THREADS or, unset (the
 * plain suite), the cores of the affinity mask. */
static void test_pool_thread_count_from_env(void **state)
{
    (void)state;
    const char *env = getenv("NDM_NUM_THREADS");
    int want = env && *env ? atoi(env) : affinity_cores();
    assert_true(want >= 1);
    assert_int_equal(ndm__num_threads(), want);
    assert_int_equal(ndm__pool_workers(), want - 1);
    char *saved = env ? strdup(env) : NULL;
    setenv("NDM_NUM_THREADS", "5", 1);
    assert_int_equal(ndm__default_num_threads(), 5);
    setenv("NDM_NUM_THREADS", "100000", 1);
    assert_int_equal(ndm__default_num_threads(), 256);
    /* not a whole number >= 1: the affinity mask decides, with a warning
     * that names the variable (an empty one is unset) */
    static const char *bad[] = {"0", "-2", "abc", "3x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("NDM_NUM_THREADS", bad[i], 1);
        warned = 0;
        warned_text[0] = '\0';
        ndm_set_log_fn(count_warning, NULL);
        int got = ndm__default_num_threads();
        ndm_set_log_fn(NULL, NULL);
        assert_int_equal(got, affinity_cores());
        assert_int_equal(warned, bad[i][0] ? 1 : 0);
        if (bad[i][0]) {
            char expect[64];
            snprintf(expect, sizeof expect, "NDM_NUM_THREADS=%s is not a whole number", bad[i]);
            assert_non_null(strstr(warned_text, expect));
        }
    }
    unsetenv("NDM_NUM_THREADS");
    assert_int_equal(ndm__default_num_threads(), affinity_cores());
    /* a narrower mask gives a smaller default */
    cpu_set_t old, one;
    assert_int_equal(sched_getaffinity(0, sizeof old, &old), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &old)) {
            CPU_SET(c, &one);
            break;
        }
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(ndm__default_num_threads(), 1);
    assert_int_equal(sched_setaffinity(0, sizeof old, &old), 0);
    if (saved) {
        setenv("NDM_NUM_THREADS", saved, 1);
        free(saved);
    }
}

static void test_pool_shrink_stops_workers(void **state)
{
    (void)state;
    static seen s;
    int keep = ndm__set_num_threads(4);
    assert_int_equal(ndm__pool_workers(), 3);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    check_job(&s, 1000, 1, 4);
    ndm__set_num_threads(1);
    assert_int_equal(ndm__pool_workers(), 0);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    check_job(&s, 1000, 1, 1);
    ndm__set_num_threads(3);
    assert_int_equal(ndm__pool_workers(), 2);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    check_job(&s, 1000, 1, 3);
    ndm__set_num_threads(keep);
    assert_int_equal(ndm__pool_workers(), keep - 1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct sum_ctx {
    atomic_llong total;
} sum_ctx;

static void add_range(void *ctx, int64_t b, int64_t e)
{
    sum_ctx *q = ctx;
    long long t = 0;
    for (int64_t i = b; i < e; i++)
        t += i;
    atomic_fetch_add(&q->total, t);
}

/* A chunk whose thread sleeps: the job still ends with every item run once. */
static void slow_first(void *ctx, int64_t b, int64_t e)
{
    if (b == 0)
        usleep(20000);
    record(ctx, b, e);
}

typedef struct caller {
    int jobs, errors;
} caller;

static void *call_many(void *p)
{
    caller *c = p;
    double t0 = now();
    for (c->jobs = 0; c->jobs < 2000 && now() - t0 < 1.0; c->jobs++) {
        int64_t n = 1 + c->jobs % 97;
        sum_ctx q;
        atomic_init(&q.total, 0);
        ndm__parallel_for(n, 1, add_range, &q);
        if (atomic_load(&q.total) != n * (n - 1) / 2)
            c->errors++;
    }
    return NULL;
}

/* Many tiny jobs back to back (workers between spinning and sleeping),
 * from one caller and from several at once; bounded by time. */
static void test_pool_many_jobs_and_callers(void **state)
{
    (void)state;
    static seen s;
    int keep = ndm__set_num_threads(3);
    reset(&s);
    ndm__parallel_for(12, 1, slow_first, &s);
    check_job(&s, 12, 1, 3);
    /* let the workers fall asleep, then wake them with a job */
    usleep(50000);
    reset(&s);
    ndm__parallel_for(300, 1, record, &s);
    check_job(&s, 300, 1, 3);
    caller one = {0};
    call_many(&one);
    assert_int_equal(one.errors, 0);
    assert_true(one.jobs > 0);
    pthread_t t[4];
    caller cs[4] = {{0}};
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, call_many, &cs[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(cs[i].errors, 0);
    }
    ndm__set_num_threads(keep);
}

typedef struct who {
    atomic_int bad;
    pthread_t owner[8];
    atomic_int claimed[8];
} who;

static void note_thread(void *ctx, int64_t b, int64_t e)
{
    (void)b, (void)e;
    who *w = ctx;
    int i = ndm__parallel_thread_index();
    if (i < 0 || i >= ndm__num_threads()) {
        atomic_fetch_add(&w->bad, 1);
        return;
    }
    /* the first chunk on an index names its thread; later ones must match */
    int expect = 0;
    if (atomic_compare_exchange_strong(&w->claimed[i], &expect, 1)) {
        w->owner[i] = pthread_self();
        atomic_store(&w->claimed[i], 2);
    } else {
        while (atomic_load(&w->claimed[i]) != 2)
            sched_yield();
        if (!pthread_equal(w->owner[i], pthread_self()))
            atomic_fetch_add(&w->bad, 1);
    }
    usleep(100);
}

/* Per-thread scratch is indexed by ndm__parallel_thread_index: within a
 * job, an index belongs to one thread, and the caller's is 0. */
static void test_pool_thread_index_names_one_thread(void **state)
{
    (void)state;
    int keep = ndm__set_num_threads(3);
    assert_int_equal(ndm__parallel_thread_index(), 0);
    for (int rep = 0; rep < 20; rep++) {
        who w;
        atomic_init(&w.bad, 0);
        for (int i = 0; i < 8; i++)
            atomic_init(&w.claimed[i], 0);
        ndm__parallel_for(60, 1, note_thread, &w);
        assert_int_equal(atomic_load(&w.bad), 0);
        if (atomic_load(&w.claimed[0]) == 2)
            assert_true(pthread_equal(w.owner[0], pthread_self()));
    }
    ndm__set_num_threads(keep);
}

/* Serving threads that occupy the pool's threads run their jobs inline;
 * others still split theirs; a serving thread's exit gives its count back. */
typedef struct server_arg {
    pthread_barrier_t *marked, *done;
} server_arg;

static void *serve_and_wait(void *v)
{
    server_arg *a = v;
    ndm__parallel_serving();
    ndm__parallel_serving(); /* counted once */
    pthread_barrier_wait(a->marked);
    pthread_barrier_wait(a->done);
    return NULL;
}

static void *split_job(void *v)
{
    seen *s = v;
    reset(s);
    ndm__parallel_for(1000, 1, record, s);
    return NULL;
}

static void test_pool_serving_threads_run_inline(void **state)
{
    (void)state;
    static seen s;
    int keep = ndm__set_num_threads(3);
    int before = ndm__parallel_serving_threads();
    /* a serving thread alone: the pool still splits its jobs */
    pthread_t me;
    server_arg a;
    pthread_barrier_t marked, done;
    pthread_barrier_init(&marked, NULL, 3);
    pthread_barrier_init(&done, NULL, 3);
    a = (server_arg){&marked, &done};
    ndm__parallel_serving();
    assert_int_equal(ndm__parallel_serving_threads(), before + 1);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    check_job(&s, 1000, 1, 3);
    assert_true(atomic_load(&s.nchunks) > 1);
    /* three serving threads for a pool of three: inline */
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&th[t], NULL, serve_and_wait, &a), 0);
    pthread_barrier_wait(&marked);
    assert_int_equal(ndm__parallel_serving_threads(), before + 3);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    assert_int_equal(atomic_load(&s.nchunks), 1);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(atomic_load(&s.hits[i]), 1);
    /* a thread that does not serve still gets the pool */
    assert_int_equal(pthread_create(&me, NULL, split_job, &s), 0);
    pthread_join(me, NULL);
    check_job(&s, 1000, 1, 3);
    assert_true(atomic_load(&s.nchunks) > 1);
    pthread_barrier_wait(&done);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    /* the two exited: this thread serves alone again, and splits */
    assert_int_equal(ndm__parallel_serving_threads(), before + 1);
    reset(&s);
    ndm__parallel_for(1000, 1, record, &s);
    check_job(&s, 1000, 1, 3);
    pthread_barrier_destroy(&marked);
    pthread_barrier_destroy(&done);
    ndm__set_num_threads(keep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_pool_thread_count_from_env),
        TEST(test_pool_chunks_cover_range_exactly),
        TEST(test_pool_nested_calls_run_inline),
        TEST(test_pool_shrink_stops_workers),
        TEST(test_pool_many_jobs_and_callers),
        TEST(test_pool_thread_index_names_one_thread),
        TEST(test_pool_serving_threads_run_inline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
