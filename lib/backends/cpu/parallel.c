/* The CPU thread pool: persistent workers that wait briefly awake, then
 * sleep on a futex; the caller runs chunks too, and chunks are claimed one at a time. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "../../base/error.h"
#include "../backend.h"
#include "parallel.h"

#define MAX_THREADS 256
/* Chunks per thread: with several, a thread that loses its core for a while
 * holds up at most one small chunk while the others take the rest. */
#define CHUNKS_PER_THREAD 4
/* How a waiting thread waits, by time (a pause takes 10 to 140 cycles by
 * the CPU): it pauses for WAIT_PAUSE_NS, long enough for the next job of a
 * tight loop of kernels; then yields, so that any other runnable thread
 * takes the core at once while the core itself stays awake; then sleeps on
 * a futex. A sleeping thread's wake-up costs a system call and, in a
 * virtual machine, the host's scheduling of the halted CPU: long enough
 * that a worker woken for each job of a loop of 256x256 products (jobs
 * more than 50 microseconds apart) came too late to help with most.
 * An idle worker stays awake WAIT_WORKER_NS; the caller joining its job,
 * whose wait is on the job's path, WAIT_CALLER_NS. */
#define WAIT_PAUSE_NS 50000
#define WAIT_WORKER_NS 300000
#define WAIT_CALLER_NS 1000000
/* Pauses between looks at the clock */
#define WAIT_CHECK 32

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* One step of a wait that began at *start (0: not yet): false once the
 * thread has been awake for `awake` nanoseconds and should sleep. */
static bool wait_awake(int64_t *start, int *spins, int64_t awake)
{
    if (++*spins % WAIT_CHECK)
        return cpu_relax(), true;
    int64_t t = now_ns();
    if (!*start)
        *start = t;
    int64_t waited = t - *start;
    if (waited < WAIT_PAUSE_NS)
        cpu_relax();
    else if (waited < awake)
        sched_yield();
    else
        return false;
    return true;
}

#if defined(__linux__)
/* Sleep while *w == expect (returns at once otherwise, or on a wake). */
static void futex_wait(atomic_uint *w, unsigned expect)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *w, int n)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#else
/* Without futexes the sleeps become yields: correct, and still no pure spin. */
static void futex_wait(atomic_uint *w, unsigned expect)
{
    (void)w, (void)expect;
    sched_yield();
}

static void futex_wake(atomic_uint *w, int n)
{
    (void)w, (void)n;
}
#endif

/* The claim word: job generation (32 bits) | chunk count (16) | next chunk
 * (16). One compare-and-swap both claims a chunk and checks that the job is
 * still the one the worker saw, so a worker that wakes late never touches
 * the next job's chunks. */
#define CLAIM(gen, chunks, next) ((uint64_t)(gen) << 32 | (uint64_t)(chunks) << 16 | (next))

typedef struct pool {
    int n;                      /* threads a job uses, including the caller */
    int started;                /* threads that exist, including the caller */
    pthread_t tid[MAX_THREADS];
    unsigned born[MAX_THREADS]; /* the generation when each worker was made */
    atomic_uint gen;            /* job generation: workers sleep on it */
    atomic_int sleepers;        /* workers asleep or about to be */
    atomic_int quit_from;       /* workers with this id or above exit */
    _Atomic uint64_t claim;
    atomic_uint done;           /* chunks of the current job finished */
    atomic_int caller_asleep;
    atomic_flag busy;           /* a caller owns the pool */
    /* the current job: written before `claim` publishes it */
    ndm__range_fn fn;
    void *ctx;
    int64_t n_items, chunk;
    /* the submitter's operation context, which the workers take for the
     * job, so that kernel scratch taken there is charged as the caller's */
    const struct ndm__op_context *op;
} pool;

static pool P = {.busy = ATOMIC_FLAG_INIT, .quit_from = MAX_THREADS};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Thread_local bool in_pool;
static _Thread_local int thread_index; /* 0: a caller; workers 1 and up */

/* Serving threads: counted once per thread (a pthread key's destructor
 * takes it back at the thread's exit), read on each job with a relaxed load
 * of a line that changes only when a serving thread starts or ends. */
static atomic_int serving;
static _Thread_local bool is_serving;
static pthread_key_t serving_key;
static pthread_once_t serving_once = PTHREAD_ONCE_INIT;

static void serving_exit(void *v)
{
    (void)v;
    atomic_fetch_sub_explicit(&serving, 1, memory_order_relaxed);
}

static void serving_setup(void) { (void)pthread_key_create(&serving_key, serving_exit); }

void ndm__parallel_serving(void)
{
    if (NDM__LIKELY(is_serving))
        return;
    pthread_once(&serving_once, serving_setup);
    /* counted only when its exit will be: the key holds a non-null value */
    if (pthread_setspecific(serving_key, (void *)1) != 0)
        return;
    is_serving = true;
    atomic_fetch_add_explicit(&serving, 1, memory_order_relaxed);
}

int ndm__parallel_serving_threads(void) { return atomic_load_explicit(&serving, memory_order_relaxed); }

/* Claim and run chunks of job `gen` until none is left or the job has been
 * replaced. */
static void run_chunks(unsigned gen)
{
    uint64_t cw = atomic_load_explicit(&P.claim, memory_order_acquire);
    for (;;) {
        if ((unsigned)(cw >> 32) != gen)
            return;
        unsigned chunks = (unsigned)(cw >> 16) & 0xffffu, next = (unsigned)cw & 0xffffu;
        if (next >= chunks)
            return;
        if (!atomic_compare_exchange_weak_explicit(&P.claim, &cw, cw + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int64_t b = (int64_t)next * P.chunk;
        int64_t e = b + P.chunk < P.n_items ? b + P.chunk : P.n_items;
        if (b < e) {
            /* read as P.fn is, once a chunk of this job is claimed */
            if (thread_index)
                ndm__op_context_current = P.op;
            P.fn(P.ctx, b, e);
        }
        unsigned d = atomic_fetch_add(&P.done, 1) + 1;
        if (d == chunks && atomic_load(&P.caller_asleep))
            futex_wake(&P.done, 1);
        cw = atomic_load_explicit(&P.claim, memory_order_acquire);
    }
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    in_pool = true;
    thread_index = id;
    /* Not the generation of now: a worker that starts late must still see
     * the jobs (and a shrink) published since it was made. */
    unsigned seen = P.born[id];
    for (;;) {
        unsigned gen;
        int spins = 0;
        int64_t since = 0;
        while ((gen = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen) {
            if (wait_awake(&since, &spins, WAIT_WORKER_NS))
                continue;
            /* Announce the sleep before the last look, so the caller that
             * bumps `gen` after that look sees a sleeper and wakes it. */
            atomic_fetch_add(&P.sleepers, 1);
            if (atomic_load(&P.gen) == seen)
                futex_wait(&P.gen, seen);
            atomic_fetch_sub(&P.sleepers, 1);
            spins = 0, since = 0;
        }
        seen = gen;
        if (id >= atomic_load(&P.quit_from))
            return NULL;
        run_chunks(gen);
    }
}

/* Start workers up to n threads in all; returns how many exist. */
static int grow(int n)
{
    for (int i = P.started; i < n; i++) {
        P.born[i] = atomic_load(&P.gen);
        if (pthread_create(&P.tid[i], NULL, worker, (void *)(intptr_t)i) != 0)
            break;
        P.started = i + 1;
    }
    return P.started;
}

/* Stop the workers with id >= n (the caller owns the pool, no job runs). */
static void shrink(int n)
{
    if (n >= P.started)
        return;
    atomic_store(&P.quit_from, n);
    atomic_store(&P.claim, CLAIM(atomic_load(&P.gen) + 1, 0, 0));
    atomic_fetch_add(&P.gen, 1);
    futex_wake(&P.gen, MAX_THREADS);
    for (int i = n; i < P.started; i++)
        pthread_join(P.tid[i], NULL);
    P.started = n;
    atomic_store(&P.quit_from, MAX_THREADS);
}

static int core_threads(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c >= 1)
            return c > MAX_THREADS ? MAX_THREADS : c;
    }
#endif
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
}

static int default_threads(void)
{
    const char *env = getenv("NDM_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (v >= 1 && *end == '\0')
            return v > MAX_THREADS ? MAX_THREADS : (int)v;
        /* said, as NDM_CPU_ISA and NDM_ALLOC_CONF say theirs: a typo
         * would otherwise run on every core unnoticed */
        int n = core_threads();
        ndm__warn("NDM_NUM_THREADS=%s is not a whole number >= 1: ignored, %d threads "
                  "(the cores this process may run on)",
                  env, n);
        return n;
    }
    return core_threads();
}

static void start(void)
{
    P.started = 1;
    P.n = grow(default_threads());
}

int ndm__default_num_threads(void)
{
    return default_threads();
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
    shrink(n);
    P.n = grow(n);
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
    return before;
}

int ndm__num_threads(void)
{
    pthread_once(&once, start);
    return P.n;
}

int ndm__pool_workers(void)
{
    pthread_once(&once, start);
    while (atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire))
        sched_yield();
    int w = P.started - 1;
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
    return w;
}

int ndm__parallel_thread_index(void)
{
    return thread_index;
}

int64_t ndm__parallel_chunks(int64_t n, int64_t grain, int threads)
{
    if (n <= 0)
        return 0;
    if (grain < 1)
        grain = 1;
    int64_t want = (n + grain - 1) / grain;
    int64_t cap = (int64_t)threads * CHUNKS_PER_THREAD;
    if (threads <= 1 || want <= 1)
        return 1;
    if (want > cap)
        want = cap;
    int64_t chunk = (n + want - 1) / want;
    return (n + chunk - 1) / chunk;
}

void ndm__parallel_stay_inline(void) { in_pool = true; }

void ndm__parallel_for(int64_t n, int64_t grain, ndm__range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    int threads = ndm__num_threads();
    if (threads == 1 || n <= grain || in_pool ||
        (is_serving && atomic_load_explicit(&serving, memory_order_relaxed) >= threads) ||
        atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire)) {
        fn(ctx, 0, n);
        return;
    }
    threads = P.n; /* fixed while we own the pool */
    int64_t want = ndm__parallel_chunks(n, grain, threads);
    int64_t chunk = (n + want - 1) / want;
    unsigned chunks = (unsigned)((n + chunk - 1) / chunk);
    if (chunks <= 1 || P.started == 1) {
        atomic_flag_clear_explicit(&P.busy, memory_order_release);
        fn(ctx, 0, n);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.op = ndm__op_context_current;
    P.n_items = n;
    P.chunk = chunk;
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    unsigned gen = atomic_load_explicit(&P.gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&P.claim, CLAIM(gen, chunks, 0), memory_order_release);
    atomic_store(&P.gen, gen);
    if (atomic_load(&P.sleepers) > 0)
        futex_wake(&P.gen, P.started - 1);
    in_pool = true;
    run_chunks(gen);
    in_pool = false;
    /* Every chunk is claimed; wait for those still running elsewhere. */
    unsigned d;
    int spins = 0;
    int64_t since = 0;
    while ((d = atomic_load_explicit(&P.done, memory_order_acquire)) != chunks) {
        if (wait_awake(&since, &spins, WAIT_CALLER_NS))
            continue;
        atomic_store(&P.caller_asleep, 1);
        if (atomic_load(&P.done) == d)
            futex_wait(&P.done, d);
        atomic_store(&P.caller_asleep, 0);
        spins = 0, since = 0;
    }
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
}
