/* Thread stress: creators, viewers, movers, scope users and closers work on
 * shared managers in rounds of a few milliseconds, for about two seconds in
 * all (NDM_STRESS_MS overrides); after each round the live arrays equal the
 * live handles, and once they are released nothing is left. Also run under
 * ThreadSanitizer and AddressSanitizer. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "helpers.h"

#define SHARED 4       /* shared managers per round, each closed by a closer */
#define WORKERS 6      /* creator, viewer, mover, scope user, two closers */
#define HELD_MAX 2048  /* handles a worker keeps per round */
#define BASE_N 256     /* elements of each shared manager's base array */

enum role { CREATOR, VIEWER, MOVER, SCOPER, CLOSER };
static const enum role roles[WORKERS] = {CREATOR, VIEWER, MOVER, SCOPER, CLOSER, CLOSER};

typedef struct round_state {
    ndm_manager shared[SHARED];
    ndm_array base[SHARED];   /* filled with i + 1, in shared[i] */
    _Atomic int stop;         /* the workers' signal to end the round */
    _Atomic int closed;       /* shared managers closed so far */
} round_state;

typedef struct worker {
    int id;
    enum role role;
    unsigned seed;
    ndm_manager home;         /* this worker's own manager (never closed mid-round) */
    ndm_array held[HELD_MAX]; /* every handle it obtained this round */
    int nheld;
    int errors;
    long ops;
    char first_error[512];
} worker;

static round_state g_round;
static worker g_workers[WORKERS];
static pthread_barrier_t g_start, g_done;
static _Atomic int g_quit;

static void note(worker *w, const char *what, ndm_status st)
{
    if (!w->errors++)
        snprintf(w->first_error, sizeof w->first_error, "%s: %s (%s)", what,
                 ndm_status_name(st), ndm_last_error());
}

static void keep(worker *w, ndm_array a)
{
    if (a.id && w->nheld < HELD_MAX)
        w->held[w->nheld++] = a;
    else if (a.id && ndm_array_release(a) != NDM_OK)
        note(w, "release of an extra handle", ndm_last_status());
}

/* A refusal that a race with a close allows; anything else is an error. */
static void expect_closed(worker *w, const char *what)
{
    ndm_status st = ndm_last_status();
    if (st != NDM_E_CLOSED)
        note(w, what, st);
}

static ndm_manager pick(worker *w, int *which)
{
    int i = (int)(rand_r(&w->seed) % SHARED);
    if (which)
        *which = i;
    return g_round.shared[i];
}

static void create_some(worker *w)
{
    ndm_array a = ndm_empty(pick(w, NULL), NDM_F32, NDM_SHAPE(16));
    if (a.id)
        keep(w, a); /* (the round's count shows whether its manager took it) */
    else
        expect_closed(w, "ndm_empty");
}

static void view_some(worker *w)
{
    int i;
    ndm_manager m = pick(w, &i);
    (void)m;
    ndm_array base = g_round.base[i];
    ndm_array v = (w->ops & 1) ? ndm_alias_to(w->home, base)
                               : ndm_slice_to(w->home, base, 0, 8, 72, 2);
    if (!v.id) {
        expect_closed(w, "a view");
        return;
    }
    /* The view keeps the storage: its elements stay i + 1 whatever closes. */
    float buf[BASE_N];
    size_t n = ndm_array_nbytes(v);
    ndm_status st = ndm_array_copy_out(v, buf, n);
    if (st != NDM_OK)
        note(w, "reading a view", st);
    else if (buf[0] != (float)(i + 1) || buf[n / sizeof(float) - 1] != (float)(i + 1))
        note(w, "a view reads other data", NDM_OK);
    keep(w, v);
}

static void move_some(worker *w)
{
    ndm_array x = ndm_zeros(w->home, NDM_U8, NDM_SHAPE(64));
    if (!x.id) {
        note(w, "ndm_zeros in the home manager", ndm_last_status());
        return;
    }
    keep(w, x);
    ndm_manager m = pick(w, NULL);
    ndm_status st = (w->ops % 3 == 0) ? ndm_temp_attach(x, m) : ndm_attach(x, m);
    if (st == NDM_OK) {
        /* sometimes bring it back: a move out of a manager that may be closing */
        if (w->ops % 4 == 1) {
            st = ndm_attach(x, w->home);
            if (st != NDM_OK && st != NDM_E_CLOSED)
                note(w, "ndm_attach back home", st);
        }
        return;
    }
    if (st != NDM_E_CLOSED)
        note(w, "a move into a shared manager", st);
}

static void scope_some(worker *w)
{
    ndm_manager s = ndm_scope_begin(pick(w, NULL), "work");
    if (!s.id) {
        expect_closed(w, "ndm_scope_begin");
        return;
    }
    /* Arrays made in the scope (the innermost) and not written: the close of
     * the shared manager may close the scope at any time, and computing
     * with arrays of a manager that another thread closes is a caller bug. */
    ndm_array a = ndm_empty(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(8));
    ndm_array c = ndm_empty(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(8));
    /* (a closed scope is no longer the innermost: then there is none) */
    if ((!a.id || !c.id) && ndm_last_status() != NDM_E_NULL)
        expect_closed(w, "ndm_empty in a scope");
    ndm_status st = ndm_scope_end(s, c.id ? 1 : 0, &c);
    if (st == NDM_OK && c.id) {
        keep(w, c); /* now in the shared manager, or closed with it */
    } else if (st != NDM_OK && st != NDM_E_CLOSED && st != NDM_ALREADY) {
        note(w, "ndm_scope_end", st);
    }
}

static void spin(worker *w, unsigned max)
{
    unsigned n = rand_r(&w->seed) % max;
    for (volatile unsigned i = 0; i < n; i++) {
    }
}

static void close_some(worker *w)
{
    /* Each closer closes the shared managers in its own order; the other
     * closer's close of the same manager returns NDM_ALREADY. */
    int order[SHARED];
    for (int i = 0; i < SHARED; i++)
        order[i] = i;
    for (int i = SHARED - 1; i > 0; i--) {
        int j = (int)(rand_r(&w->seed) % (unsigned)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int k = 0; k < SHARED; k++) {
        spin(w, 200000);
        ndm_status st = ndm_manager_close(g_round.shared[order[k]]);
        if (st == NDM_OK)
            g_round.closed++;
        else if (st != NDM_ALREADY)
            note(w, "closing a shared manager", st);
    }
}

static void *work(void *p)
{
    worker *w = p;
    for (;;) {
        pthread_barrier_wait(&g_start);
        if (g_quit)
            break;
        if (w->role == CLOSER) {
            close_some(w);
        } else {
            while (!g_round.stop && w->nheld < HELD_MAX) {
                switch (w->role) {
                case CREATOR: create_some(w); break;
                case VIEWER: view_some(w); break;
                case MOVER: move_some(w); break;
                case SCOPER: scope_some(w); break;
                case CLOSER: break;
                }
                w->ops++;
            }
        }
        pthread_barrier_wait(&g_done);
    }
    return NULL;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int64_t allocated_now(void)
{
    ndm_memory_stats st;
    if (ndm_memory_stats_get(NDM_CPU, &st) != NDM_OK)
        return -1;
    return st.allocated_bytes[NDM_POOL_ALL].current;
}

static void test_stress_close_races_creations_views_and_moves(void **state)
{
    ndm_manager root = ROOT(state);
    const char *env = getenv("NDM_STRESS_MS");
    double budget = env && *env ? atof(env) : 2000.0;
    int64_t alloc0 = allocated_now();
    assert_true(alloc0 >= 0);
    assert_int_equal(pthread_barrier_init(&g_start, NULL, WORKERS + 1), 0);
    assert_int_equal(pthread_barrier_init(&g_done, NULL, WORKERS + 1), 0);
    g_quit = 0;
    pthread_t th[WORKERS];
    for (int t = 0; t < WORKERS; t++) {
        g_workers[t] = (worker){.id = t, .role = roles[t], .seed = 12345u + 77u * (unsigned)t};
        assert_int_equal(pthread_create(&th[t], NULL, work, &g_workers[t]), 0);
    }
    int rounds = 0, closed_total = 0;
    for (double t0 = now_ms(); now_ms() - t0 < budget; rounds++) {
        g_round.stop = 0;
        g_round.closed = 0;
        for (int i = 0; i < SHARED; i++) {
            g_round.shared[i] = ndm_manager_new(root, "shared");
            assert_live(g_round.shared[i]);
            g_round.base[i] = ndm_full(g_round.shared[i], NDM_F32, (double)(i + 1),
                                       NDM_SHAPE(BASE_N));
            assert_live(g_round.base[i]);
        }
        for (int t = 0; t < WORKERS; t++) {
            g_workers[t].home = ndm_manager_new(root, "home");
            assert_live(g_workers[t].home);
            g_workers[t].nheld = 0;
        }
        pthread_barrier_wait(&g_start);
        /* The round lasts until both closers are done, then a little more. */
        while (g_round.closed < SHARED)
            sched_yield();
        g_round.stop = 1;
        pthread_barrier_wait(&g_done);
        closed_total += g_round.closed;

        /* Every array alive under root is one a worker holds a valid handle
         * to: none was left in a closed manager, none was lost. */
        uint64_t valid = 0;
        for (int t = 0; t < WORKERS; t++)
            for (int k = 0; k < g_workers[t].nheld; k++)
                valid += ndm_array_valid(g_workers[t].held[k]);
        ndm_stats st;
        assert_ok(ndm_manager_stats(root, NDM_CPU, NDM_STATS_SUBTREE, &st));
        if (st.live_arrays != valid) {
            (void)!ndm_debug_dump(root, stderr);
            /* name the handles whose arrays are not where they should be */
            for (int t = 0; t < WORKERS; t++)
                for (int k = 0; k < g_workers[t].nheld; k++) {
                    ndm_array h = g_workers[t].held[k];
                    ndm_manager hm = ndm_array_manager(h);
                    char path[256] = "";
                    if (ndm_array_valid(h) &&
                        (ndm_manager_path(hm, path, sizeof path) < 0 ||
                         strncmp(path, "system/test/", 12) != 0))
                        fprintf(stderr, "worker %d, handle %d: valid, manager '%s' (%s)\n", t,
                                k, path, ndm_manager_valid(hm) ? "live" : "closed");
                }
            fail_msg("round %d: %llu arrays alive under the root, %llu valid handles", rounds,
                     (unsigned long long)st.live_arrays, (unsigned long long)valid);
        }
        assert_int_equal(st.children, WORKERS); /* the homes; every shared one closed */
        for (int t = 0; t < WORKERS; t++) {
            worker *w = &g_workers[t];
            for (int k = 0; k < w->nheld; k++) {
                ndm_status rs = ndm_array_release(w->held[k]);
                if (rs != NDM_OK && rs != NDM_ALREADY)
                    note(w, "releasing a held handle", rs);
            }
            ndm_stats hs;
            assert_ok(ndm_manager_stats(w->home, NDM_CPU, 0, &hs));
            assert_int_equal(hs.live_arrays, 0);
            assert_int_equal(hs.live_bytes, 0);
            assert_ok(ndm_manager_close(w->home));
            if (w->errors)
                fail_msg("round %d, worker %d: %d errors, first: %s", rounds, t, w->errors,
                         w->first_error);
        }
        assert_manager_empty(root);
        /* nothing leaked in the allocator either */
        assert_int_equal(allocated_now(), alloc0);
    }
    g_quit = 1;
    pthread_barrier_wait(&g_start);
    for (int t = 0; t < WORKERS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&g_start);
    pthread_barrier_destroy(&g_done);
    assert_true(rounds > 0);
    assert_int_equal(closed_total, rounds * SHARED);
    long ops = 0;
    for (int t = 0; t < WORKERS; t++)
        ops += g_workers[t].ops;
    print_message("%d rounds, %ld operations\n", rounds, ops);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_stress_close_races_creations_views_and_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
