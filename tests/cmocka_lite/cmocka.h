/* The part of cmocka's API that the CUDA suites (test_cuda, test_backend_ops)
 * use, header-only, so that they build and run where cmocka is not installed
 * (a GPU machine without packages). The build uses it only without cmocka.
 *
 * Same reports as cmocka's ([ RUN ], [ OK ], [ FAILED ], [ SKIPPED ]), same
 * semantics for what the suites need: a failed assertion or skip() ends the
 * test (longjmp), the teardown still runs, the group's result is the number
 * of failed tests. test_malloc() and friends are plain malloc() (no leak
 * check: the suites' own helpers check their managers). One translation
 * unit per program includes it (its state is static). */
#ifndef NDM_CMOCKA_LITE_H
#define NDM_CMOCKA_LITE_H

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*CMUnitTestFunction)(void **state);
typedef int (*CMFixtureFunction)(void **state);

struct CMUnitTest {
    const char *name;
    CMUnitTestFunction test_func;
    CMFixtureFunction setup_func;
    CMFixtureFunction teardown_func;
    void *initial_state;
};

enum { CML_OK, CML_FAILED, CML_SKIPPED };

static jmp_buf cml_jump;
static int cml_in_test;

static void cml_end(int how)
{
    if (cml_in_test)
        longjmp(cml_jump, how);
    exit(how == CML_SKIPPED ? 0 : 1); /* outside a test: nothing to return to */
}

static void cml_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cml_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    printf("[  ERROR   ] --- ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n[   LINE   ] --- %s:%d: error: Failure!\n", file, line);
    fflush(stdout);
    cml_end(CML_FAILED);
}

static inline void print_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void print_message(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

static inline void print_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void print_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

#define test_malloc(n) malloc(n)
#define test_calloc(n, s) calloc((n), (s))
#define test_realloc(p, n) realloc((p), (n))
#define test_free(p) free(p)

#define fail() cml_fail(__FILE__, __LINE__, "%s", "fail()")
#define fail_msg(...) cml_fail(__FILE__, __LINE__, __VA_ARGS__)
#define skip() cml_end(CML_SKIPPED)

#define assert_true(c)                                                                      \
    do {                                                                                    \
        if (!(c))                                                                           \
            cml_fail(__FILE__, __LINE__, "%s", #c);                                         \
    } while (0)
#define assert_false(c) assert_true(!(c))
#define assert_non_null(p)                                                                  \
    do {                                                                                    \
        if ((p) == NULL)                                                                    \
            cml_fail(__FILE__, __LINE__, "%s is NULL", #p);                                 \
    } while (0)
#define assert_null(p)                                                                      \
    do {                                                                                    \
        if ((p) != NULL)                                                                    \
            cml_fail(__FILE__, __LINE__, "%s is not NULL", #p);                             \
    } while (0)
#define assert_ptr_equal(a, b) assert_true((const void *)(a) == (const void *)(b))
#define assert_int_equal(a, b)                                                              \
    do {                                                                                    \
        uintmax_t cml_a = (uintmax_t)(a), cml_b = (uintmax_t)(b);                           \
        if (cml_a != cml_b)                                                                 \
            cml_fail(__FILE__, __LINE__, "%#" PRIxMAX " != %#" PRIxMAX, cml_a, cml_b);      \
    } while (0)
#define assert_int_not_equal(a, b)                                                          \
    do {                                                                                    \
        uintmax_t cml_a = (uintmax_t)(a), cml_b = (uintmax_t)(b);                           \
        if (cml_a == cml_b)                                                                 \
            cml_fail(__FILE__, __LINE__, "%#" PRIxMAX " == %#" PRIxMAX, cml_a, cml_b);      \
    } while (0)
#define assert_string_equal(a, b)                                                           \
    do {                                                                                    \
        const char *cml_a = (a), *cml_b = (b);                                              \
        if (strcmp(cml_a, cml_b))                                                           \
            cml_fail(__FILE__, __LINE__, "\"%s\" != \"%s\"", cml_a, cml_b);                 \
    } while (0)
#define assert_memory_equal(a, b, n)                                                        \
    do {                                                                                    \
        if (memcmp((a), (b), (n)))                                                          \
            cml_fail(__FILE__, __LINE__, "%s and %s differ", #a, #b);                       \
    } while (0)
#define assert_in_range(v, lo, hi)                                                          \
    do {                                                                                    \
        uintmax_t cml_v = (uintmax_t)(v);                                                   \
        if (cml_v < (uintmax_t)(lo) || cml_v > (uintmax_t)(hi))                             \
            cml_fail(__FILE__, __LINE__, "%#" PRIxMAX " is out of range", cml_v);           \
    } while (0)

#define cmocka_unit_test(f) {#f, f, NULL, NULL, NULL}
#define cmocka_unit_test_setup_teardown(f, setup, teardown) {#f, f, setup, teardown, NULL}

/* Run a fixture or a test body; CML_OK, or how it ended. */
static int cml_call(CMUnitTestFunction test, CMFixtureFunction fixture, void **state)
{
    int how = setjmp(cml_jump);
    if (how != 0) {
        cml_in_test = 0;
        return how;
    }
    cml_in_test = 1;
    int rc = 0;
    if (test)
        test(state);
    else
        rc = fixture(state);
    cml_in_test = 0;
    return rc ? CML_FAILED : CML_OK;
}

static int cml_run(const char *group, const struct CMUnitTest *tests, size_t n,
                   CMFixtureFunction setup, CMFixtureFunction teardown)
{
    size_t passed = 0, skipped = 0, failed = 0;
    void *group_state = NULL;
    printf("[==========] %s: Running %zu test(s).\n", group, n);
    if (setup && cml_call(NULL, setup, &group_state) != CML_OK) {
        printf("[  ERROR   ] %s: the group's setup failed\n", group);
        return (int)n;
    }
    for (size_t i = 0; i < n; i++) {
        const struct CMUnitTest *t = &tests[i];
        void *state = t->initial_state;
        printf("[ RUN      ] %s\n", t->name);
        fflush(stdout);
        int how = t->setup_func ? cml_call(NULL, t->setup_func, &state) : CML_OK;
        if (how == CML_OK)
            how = cml_call(t->test_func, NULL, &state);
        if (t->teardown_func && cml_call(NULL, t->teardown_func, &state) == CML_FAILED)
            how = CML_FAILED;
        if (how == CML_OK) {
            passed++;
            printf("[       OK ] %s\n", t->name);
        } else if (how == CML_SKIPPED) {
            skipped++;
            printf("[  SKIPPED ] %s\n", t->name);
        } else {
            failed++;
            printf("[  FAILED  ] %s\n", t->name);
        }
        fflush(stdout);
    }
    if (teardown)
        (void)cml_call(NULL, teardown, &group_state);
    printf("[==========] %s: %zu test(s) run.\n[  PASSED  ] %zu test(s).\n", group, n, passed);
    if (skipped)
        printf("[  SKIPPED ] %zu test(s).\n", skipped);
    if (failed)
        printf("[  FAILED  ] %zu test(s).\n", failed);
    return (int)failed;
}

#define cmocka_run_group_tests(g, setup, teardown)                                          \
    cml_run(#g, (g), sizeof(g) / sizeof((g)[0]), (setup), (teardown))
#define cmocka_run_group_tests_name(name, g, setup, teardown)                               \
    cml_run((name), (g), sizeof(g) / sizeof((g)[0]), (setup), (teardown))

#endif
