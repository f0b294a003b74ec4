/* A small fork-join pool: persistent workers spin briefly, then sleep on a
 * condition variable. One job runs at a time; a second caller runs inline. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "parallel.h"

#define MAX_THREADS 256
#define SPIN 20000

typedef struct pool {
    int n;                      /* threads a job uses, including the caller */
    int started;                /* threads that exist, including the caller */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint job;            /* generation of the current job */
    atomic_int pending;         /* workers still running the current job */
    atomic_flag busy;           /* a caller owns the pool */
    ndm__range_fn fn;
    void *ctx;
    int64_t n_items, chunk;
    int chunks;
} pool;

static pool P = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
                 .busy = ATOMIC_FLAG_INIT};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Thread_local bool in_pool;

static void run_chunk(int c)
{
    int64_t b = (int64_t)c * P.chunk;
    int64_t e = b + P.chunk < P.n_items ? b + P.chunk : P.n_items;
    if (b < e)
        P.fn(P.ctx, b, e);
}

/* arg packs the worker's id and the job generation when it was made. */
static void *worker(void *arg)
{
    int id = (int)((uintptr_t)arg & 0xffffu);
    unsigned seen = (unsigned)((uintptr_t)arg >> 16);
    in_pool = true;
    for (;;) {
        unsigned job;
        int spins = 0;
        while ((job = atomic_load_explicit(&P.job, memory_order_acquire)) == seen) {
            if (++spins < SPIN) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&P.lock);
            while ((job = atomic_load_explicit(&P.job, memory_order_acquire)) == seen)
                pthread_cond_wait(&P.wake, &P.lock);
            pthread_mutex_unlock(&P.lock);
            break;
        }
        seen = job;
        /* Every started worker answers every job, so none can lag into the
         * next; those beyond the job's size (ndm__set_num_threads) run no
         * chunk. */
        int n = P.n;
        for (int c = id; id < n && c < P.chunks; c += n)
            run_chunk(c);
        atomic_fetch_sub_explicit(&P.pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* Start workers up to n threads in all; returns how many exist. */
static int grow(int n)
{
    for (int i = P.started; i < n; i++) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        uintptr_t arg = (uintptr_t)i | (uintptr_t)atomic_load(&P.job) << 16;
        if (pthread_create(&t, &at, worker, (void *)arg) != 0) {
            pthread_attr_destroy(&at);
            break;
        }
        pthread_attr_destroy(&at);
        P.started = i + 1;
    }
    return P.started;
}

static void start(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores > 0 ? (int)cores : 1;
    const char *env = getenv("NDM_NUM_THREADS");
    if (env && *env) {
        long v = strtol(env, NULL, 10);
        if (v >= 1)
            n = v > MAX_THREADS ? MAX_THREADS : (int)v;
    }
    P.started = 1;
    P.n = grow(n);
}

int ndm__set_num_threads(int n)
{
    pthread_once(&once, start);
    if (n < 1)
        n = 1;
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    /* Own the pool so that no job is running while its size changes. */
    while (atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire))
        sched_yield();
    int before = P.n;
    P.n = grow(n) < n ? P.started : n;
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
    return before;
}

int ndm__num_threads(void)
{
    pthread_once(&once, start);
    return P.n;
}

void ndm__parallel_for(int64_t n, int64_t grain, ndm__range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int threads = ndm__num_threads();
    if (threads == 1 || n <= grain || in_pool ||
        atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire)) {
        fn(ctx, 0, n);
        return;
    }
    threads = P.n; /* fixed while we own the pool */
    int64_t want = (n + grain - 1) / grain;
    int chunks = want < threads ? (int)want : threads;
    P.fn = fn;
    P.ctx = ctx;
    P.n_items = n;
    P.chunk = (n + chunks - 1) / chunks;
    P.chunks = chunks;
    atomic_store_explicit(&P.pending, P.started - 1, memory_order_relaxed);
    pthread_mutex_lock(&P.lock);
    atomic_fetch_add_explicit(&P.job, 1, memory_order_release);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
    in_pool = true;
    for (int c = 0; c < chunks; c += threads)
        run_chunk(c);
    in_pool = false;
    while (atomic_load_explicit(&P.pending, memory_order_acquire) > 0) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
}
