/* The allocator under several threads: no block handed out twice, exact
 * statistics when the threads stop, exact peaks across thread caches, and
 * the public API from many request managers. Run it under ThreadSanitizer. */
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"
#include "manager/alloc/pool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define THREADS 4

const ndm__segment_source *ndm__cpu_segment_source(void);

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- many threads on one pool over real memory --------------------------------------- */

typedef struct worker {
    ndm__pool *pool;
    int id;
    int ops;
    int bad;
} worker;

typedef struct held {
    ndm__block b;
    size_t n;
    uint64_t tag;
} held;

static void fill(const held *h)
{
    uint64_t *w = h->b.ptr;
    for (size_t i = 0; i < h->n / 8; i++)
        w[i] = h->tag ^ i;
}

static bool intact(const held *h)
{
    const uint64_t *w = h->b.ptr;
    for (size_t i = 0; i < h->n / 8; i++)
        if (w[i] != (h->tag ^ i))
            return false;
    return true;
}

static void *churn(void *arg)
{
    worker *w = arg;
    uint64_t rng = 0x1234567ull * (uint64_t)(w->id + 1);
    held live[64];
    int n = 0;
    for (int op = 0; op < w->ops; op++) {
        uint64_t r = rng_next(&rng);
        if (n < 64 && (n == 0 || r % 2)) {
            size_t size = r % 16 == 0 ? MiB + (r >> 20) % (3 * MiB) : 8 + (r >> 8) % (32 * KiB);
            size &= ~(size_t)7;
            held *h = &live[n];
            if (ndm__pool_alloc(w->pool, size, NULL, &h->b) != NDM_OK) {
                w->bad++;
                continue;
            }
            h->n = size;
            h->tag = ((uint64_t)w->id << 56) ^ ((uint64_t)op << 16);
            fill(h);
            n++;
        } else {
            int i = (int)(rng_next(&rng) % (uint64_t)n);
            if (!intact(&live[i]))
                w->bad++;
            ndm__pool_free(w->pool, &live[i].b);
            live[i] = live[--n];
        }
        if (op % 512 == 0) {
            ndm_memory_stats st;
            ndm__pool_stats(w->pool, &st); /* readers run alongside the fast paths */
            if (st.allocated_bytes[NDM_POOL_ALL].current < 0)
                w->bad++;
        }
    }
    while (n) {
        if (!intact(&live[n - 1]))
            w->bad++;
        ndm__pool_free(w->pool, &live[--n].b);
    }
    return NULL;
}

static void test_alloc_threads_never_share_a_block(void **state)
{
    (void)state;
    ndm__pool *p = ndm__pool_new(ndm__cpu_segment_source(), NDM_CPU, "cpu-test", false);
    assert_non_null(p);
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){p, i, 20000, 0};
        assert_int_equal(pthread_create(&t[i], NULL, churn, &w[i]), 0);
    }
    /* Meanwhile: snapshots and cache flushes freeze the caches. */
    for (int k = 0; k < 20; k++) {
        ndm__snapshot s;
        assert_ok(ndm__pool_snapshot(p, &s));
        ndm__snapshot_free(&s);
        if (k % 5 == 0)
            ndm__pool_empty_cache(p);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(w[i].bad, 0);
    }
    ndm_memory_stats st;
    ndm__pool_stats(p, &st);
    for (int k = 0; k < NDM_POOL_COUNT; k++) {
        assert_int_equal(st.allocated_bytes[k].current, 0);
        assert_int_equal(st.allocation[k].current, 0);
        assert_int_equal(st.requested_bytes[k].current, 0);
        assert_int_equal(st.allocated_bytes[k].allocated, st.allocated_bytes[k].freed);
        assert_int_equal(st.inactive_split[k].current,
                         st.inactive_split[k].allocated - st.inactive_split[k].freed);
    }
    /* Exited threads gave their caches back: everything merges and goes. */
    ndm__pool_empty_cache(p);
    ndm__pool_stats(p, &st);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.inactive_split[NDM_POOL_ALL].current, 0);
    ndm__pool_destroy(p);
}

/* ---- peaks stay exact when one thread's cache would hide another's growth ------------- */

typedef struct stage {
    pthread_barrier_t bar;
    ndm__pool *pool;
    ndm__block a[4], b[4];
    atomic_int bad; /* cmocka's asserts belong to the main thread */
} stage;

static stage *the_stage;

static void take(ndm__pool *p, ndm__block *v, int n)
{
    for (int i = 0; i < n; i++)
        if (ndm__pool_alloc(p, 4 * KiB, NULL, &v[i]) != NDM_OK)
            atomic_fetch_add(&the_stage->bad, 1);
}

static void give(ndm__pool *p, ndm__block *v, int n)
{
    for (int i = 0; i < n; i++)
        ndm__pool_free(p, &v[i]);
}

static void *thread_a(void *arg)
{
    stage *s = arg;
    take(s->pool, s->a, 4); /* warm: A's cache holds 4 blocks */
    give(s->pool, s->a, 4);
    pthread_barrier_wait(&s->bar); /* 1: warmed */
    pthread_barrier_wait(&s->bar); /* 2: peaks reset */
    for (int r = 0; r < 10; r++) { /* A's cache earns a grant of 4 blocks */
        take(s->pool, s->a, 4);
        give(s->pool, s->a, 4);
    }
    pthread_barrier_wait(&s->bar); /* 3 */
    pthread_barrier_wait(&s->bar); /* 4: B holds 4 */
    /* 5 live for a moment: a new peak that A's grant, taken when nothing
     * was live, must not hide. */
    take(s->pool, s->a, 1);
    give(s->pool, s->a, 1);
    pthread_barrier_wait(&s->bar); /* 5 */
    pthread_barrier_wait(&s->bar); /* 6: checked */
    return NULL;
}

static void *thread_b(void *arg)
{
    stage *s = arg;
    take(s->pool, s->b, 4);
    give(s->pool, s->b, 4);
    pthread_barrier_wait(&s->bar); /* 1 */
    pthread_barrier_wait(&s->bar); /* 2 */
    pthread_barrier_wait(&s->bar); /* 3: A is done warming its grant */
    take(s->pool, s->b, 4);
    pthread_barrier_wait(&s->bar); /* 4 */
    pthread_barrier_wait(&s->bar); /* 5 */
    pthread_barrier_wait(&s->bar); /* 6 */
    give(s->pool, s->b, 4);
    return NULL;
}

static void test_alloc_threads_peak_seen_across_caches(void **state)
{
    (void)state;
    ndm__sim *sim = ndm__sim_new(0);
    stage s;
    the_stage = &s;
    atomic_init(&s.bad, 0);
    s.pool = ndm__pool_new(ndm__sim_source(sim), NDM_CPU, "sim", false);
    pthread_barrier_init(&s.bar, NULL, 3);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, thread_a, &s);
    pthread_create(&tb, NULL, thread_b, &s);
    pthread_barrier_wait(&s.bar); /* 1 */
    ndm__pool_reset_peaks(s.pool);
    pthread_barrier_wait(&s.bar); /* 2 */
    pthread_barrier_wait(&s.bar); /* 3 */
    pthread_barrier_wait(&s.bar); /* 4 */
    pthread_barrier_wait(&s.bar); /* 5 */
    ndm_memory_stats st;
    ndm__pool_stats(s.pool, &st);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 4 * 4 * KiB);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, 5 * 4 * KiB);
    assert_int_equal(st.allocation[NDM_POOL_SMALL].peak, 5);
    assert_int_equal(st.requested_bytes[NDM_POOL_ALL].peak, 5 * 4 * KiB);
    pthread_barrier_wait(&s.bar); /* 6 */
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(atomic_load(&s.bad), 0);
    ndm__pool_stats(s.pool, &st);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, 5 * 4 * KiB);
    pthread_barrier_destroy(&s.bar);
    ndm__pool_destroy(s.pool);
    ndm__sim_destroy(sim);
}

/* ---- a thread that stops allocating keeps no share of the headroom -------------------- */

typedef struct request_loop {
    ndm__pool *pool;
    int requests;
    int bad;
} request_loop;

/* A request's pattern: three blocks of three sizes live at once, then freed. */
static void *request_pattern(void *arg)
{
    request_loop *l = arg;
    static const size_t sizes[3] = {1 * KiB, 3 * KiB, 8 * KiB};
    for (int r = 0; r < l->requests; r++) {
        ndm__block b[3];
        for (int i = 0; i < 3; i++)
            if (ndm__pool_alloc(l->pool, sizes[i], NULL, &b[i]) != NDM_OK)
                l->bad++;
        for (int i = 3; i-- > 0;)
            ndm__pool_free(l->pool, &b[i]);
    }
    return NULL;
}

static void test_alloc_threads_idle_cache_gives_back_its_grant(void **state)
{
    (void)state;
    ndm__sim *sim = ndm__sim_new(0);
    ndm__pool *p = ndm__pool_new(ndm__sim_source(sim), NDM_CPU, "sim", false);
    /* This thread builds something (its cache takes a grant), then only waits. */
    ndm__block mine[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ndm__pool_alloc(p, 2 * KiB, NULL, &mine[i]), NDM_OK);
    for (int i = 0; i < 2; i++)
        ndm__pool_free(p, &mine[i]);
    ndm_memory_stats s0, s1;
    ndm__pool_stats(p, &s0);
    request_loop l = {p, 4000, 0};
    pthread_t t;
    pthread_create(&t, NULL, request_pattern, &l);
    pthread_join(t, NULL);
    assert_int_equal(l.bad, 0);
    ndm__pool_stats(p, &s1);
    int64_t allocs = s1.allocation[NDM_POOL_ALL].allocated - s0.allocation[NDM_POOL_ALL].allocated;
    int64_t cached = s1.num_thread_cache_allocs - s0.num_thread_cache_allocs;
    assert_int_equal(allocs, 3 * 4000);
    /* the serving thread's own cache serves its requests: all but the few
     * that warm it and the one that takes the idle grant back */
    assert_true(cached >= allocs - 1024);
    /* and the peaks stay exact: three blocks at most were ever live */
    assert_int_equal(s1.allocation[NDM_POOL_ALL].peak, 3);
    assert_int_equal(s1.allocated_bytes[NDM_POOL_ALL].peak, (int64_t)(12 * KiB));
    assert_int_equal(s1.allocation[NDM_POOL_ALL].current, 0);
    ndm__pool_destroy(p);
    ndm__sim_destroy(sim);
}

/* ---- the public API: requests under one model from several threads -------------------- */

typedef struct server {
    ndm_manager model;
    int id;
    int bad;
} server;

static void *serve(void *arg)
{
    server *sv = arg;
    for (int r = 0; r < 300; r++) {
        ndm_manager req = ndm_manager_new(sv->model, "request");
        if (!req.id) {
            sv->bad++;
            continue;
        }
        for (int k = 0; k < 8; k++) {
            int64_t n = 16 + ((r * 7 + k * 13 + sv->id) % 200) * 64;
            ndm_array a = ndm_full(req, NDM_F32, (double)(sv->id * 1000 + k), NDM_SHAPE(n));
            float *d = ndm_array_data(a);
            if (!d || d[0] != (float)(sv->id * 1000 + k) || d[n - 1] != d[0])
                sv->bad++;
        }
        if (ndm_manager_close(req) != NDM_OK)
            sv->bad++;
    }
    return NULL;
}

static void test_alloc_threads_request_managers(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_memory_stats s0;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &s0));
    pthread_t t[THREADS];
    server sv[THREADS];
    for (int i = 0; i < THREADS; i++) {
        sv[i] = (server){model, i, 0};
        pthread_create(&t[i], NULL, serve, &sv[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(sv[i].bad, 0);
    }
    ndm_memory_stats s1;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &s1));
    assert_int_equal(s1.allocated_bytes[NDM_POOL_ALL].current,
                     s0.allocated_bytes[NDM_POOL_ALL].current);
    assert_int_equal(s1.allocation[NDM_POOL_ALL].current, s0.allocation[NDM_POOL_ALL].current);
    assert_int_equal(s1.allocation[NDM_POOL_ALL].allocated - s0.allocation[NDM_POOL_ALL].allocated,
                     THREADS * 300 * 8);
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_alloc_threads_never_share_a_block),
        TEST(test_alloc_threads_peak_seen_across_caches),
        TEST(test_alloc_threads_request_managers),
        TEST(test_alloc_threads_idle_cache_gives_back_its_grant),
    };
    return cmocka_run_group_tests_name("alloc_threads", tests, NULL, NULL);
}
