/* Shared test helpers: each test gets a fresh manager under system, and its
 * teardown closes it and fails, printing the tree, if anything is still alive. */
#ifndef NDM_TEST_HELPERS_H
#define NDM_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ndm/ndm.h"

/* Assert a status with the last error in the failure message. */
#define assert_ok(expr)                                                         \
    do {                                                                        \
        ndm_status s_ = (expr);                                                \
        if (s_ != NDM_OK)                                                      \
            fail_msg("%s returned %s: %s", #expr, ndm_status_name(s_), ndm_last_error()); \
    } while (0)
#define assert_status(expr, want)                                               \
    do {                                                                        \
        ndm_status s_ = (expr);                                                \
        if (s_ != (want))                                                       \
            fail_msg("%s returned %s, expected %s (last error: %s)", #expr,     \
                     ndm_status_name(s_), ndm_status_name(want), ndm_last_error()); \
    } while (0)
/* A handle that must be valid. */
#define assert_live(h)                                                          \
    do {                                                                        \
        if (!(h).id)                                                            \
            fail_msg("%s is null: %s (%s)", #h, ndm_last_error(),              \
                     ndm_status_name(ndm_last_status()));                       \
    } while (0)
/* The last error must contain `needle`. */
#define assert_error_has(needle)                                                \
    do {                                                                        \
        if (!strstr(ndm_last_error(), (needle)))                                \
            fail_msg("last error \"%s\" lacks \"%s\"", ndm_last_error(), (needle)); \
    } while (0)

/* Live arrays in the subtree of m. */
static inline uint64_t test_live_arrays(ndm_manager m)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st) != NDM_OK)
        return UINT64_MAX;
    return st.live_arrays;
}

/* Assert that the subtree of m holds no arrays and no bytes; dump it if not. */
#define assert_manager_empty(m)                                                 \
    do {                                                                        \
        ndm_stats ms_;                                                          \
        assert_ok(ndm_manager_stats((m), NDM_CPU, NDM_STATS_SUBTREE, &ms_));    \
        if (ms_.live_arrays || ms_.live_bytes) {                                \
            (void)!ndm_debug_dump((m), stderr);                                 \
            fail_msg("manager still holds %llu arrays, %llu bytes",             \
                     (unsigned long long)ms_.live_arrays,                       \
                     (unsigned long long)ms_.live_bytes);                       \
        }                                                                       \
    } while (0)

/* Per-test state: a manager named after the test under system. */
static inline int test_setup(void **state)
{
    ndm_clear_error();
    ndm_manager *m = test_malloc(sizeof *m);
    *m = ndm_manager_new(ndm_system(), "test");
    if (!m->id)
        return -1;
    *state = m;
    return 0;
}

/* Teardown: the test's manager must be empty (the test released what it
 * made), then closing it must leave nothing alive in the whole process. The
 * manager is closed before any failure is reported, so one failing test does
 * not spill into the next. */
static inline int test_teardown(void **state)
{
    ndm_manager *m = *state;
    ndm_stats mine = {0};
    bool had = false;
    if (ndm_manager_valid(*m)) {
        if (ndm_manager_stats(*m, NDM_CPU, NDM_STATS_SUBTREE, &mine) == NDM_OK &&
            (mine.live_arrays || mine.live_bytes)) {
            (void)!ndm_debug_dump(*m, stderr);
            had = true;
        }
        (void)!ndm_manager_close(*m);
    }
    ndm_stats st;
    bool ok = ndm_manager_stats(ndm_system(), NDM_CPU, NDM_STATS_SUBTREE, &st) == NDM_OK;
    bool leaked = ok && (st.live_arrays || st.children != 1 /* detached */ || st.live_bytes);
    if (leaked)
        ndm_leak_report(stderr);
    test_free(m);
    if (had)
        fail_msg("the test's manager still held %llu arrays, %llu bytes",
                 (unsigned long long)mine.live_arrays, (unsigned long long)mine.live_bytes);
    if (!ok || leaked)
        fail_msg("after the test: %llu arrays, %llu managers, %llu bytes alive",
                 (unsigned long long)st.live_arrays, (unsigned long long)st.children - 1,
                 (unsigned long long)st.live_bytes);
    return 0;
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, test_setup, test_teardown)
#define ROOT(state) (*(ndm_manager *)*(state))

#endif
