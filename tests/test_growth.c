/* Growth classes: a tracker sampled once per step tells a leak (still
 * growing, named at its line, with its slope) from a cache warming up, a
 * periodic holding, a steady one and what is released; a manager opened
 * every step and never closed is a leak at its opening line. */
#include <stdlib.h>

#include "helpers.h"

static char *report_of(ndm_growth g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ok(ndm_growth_report(g, f));
    fclose(f);
    return buf;
}

/* The report's line that names `needle` (a "file:line"), or fail. */
static const char *line_with(const char *text, const char *needle, char *buf, size_t n)
{
    const char *p = strstr(text, needle);
    if (!p)
        fail_msg("no line names \"%s\" in:\n%s", needle, text);
    const char *b = p;
    while (b > text && b[-1] != '\n')
        b--;
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - b) : strlen(b);
    if (len >= n)
        len = n - 1;
    memcpy(buf, b, len);
    buf[len] = 0;
    return buf;
}

#define assert_line(text, line_no, want)                                        \
    do {                                                                        \
        char site_[64], l_[512];                                                \
        snprintf(site_, sizeof site_, "test_growth.c:%d", (line_no));           \
        line_with((text), site_, l_, sizeof l_);                                \
        if (!strstr(l_, (want)))                                                \
            fail_msg("line \"%s\" lacks \"%s\"", l_, (want));                   \
    } while (0)

/* A released site is not listed in the report. */
static void assert_not_listed(const char *text, int line_no)
{
    char site[64];
    snprintf(site, sizeof site, "test_growth.c:%d", line_no);
    if (strstr(text, site))
        fail_msg("a released site is listed:\n%s", text);
}

static void test_classes_of_a_training_loop(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager stats = ndm_manager_new(model, "stats");
    ndm_manager cache = ndm_manager_new(model, "cache");
    int l_weights = __LINE__ + 1;
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(16));
    assert_live(w);
    ndm_growth g = ndm_growth_new(ROOT(state), model);
    assert_true(ndm_growth_valid(g));
    ndm_array periodic = NDM_NULL_ARRAY;
    int l_leak = 0, l_cache = 0, l_periodic = 0, l_child = 0, l_batch = 0;
    for (int step = 0; step < 13; step++) {
        ndm_manager batch = ndm_manager_new(model, "batch");
        l_batch = __LINE__ + 1;
        ndm_array x = ndm_zeros(batch, NDM_F32, NDM_SHAPE(8));
        assert_live(x);
        /* a statistic kept every step: the leak */
        l_leak = __LINE__ + 1;
        ndm_array kept = ndm_sum_to(stats, x, false, NDM_ALL_AXES_LIST);
        assert_live(kept);
        /* a cache that fills over the first 4 steps, then only hits */
        if (step < 4) {
            l_cache = __LINE__ + 1;
            ndm_array c = ndm_zeros(cache, NDM_F32, NDM_SHAPE(4));
            assert_live(c);
        }
        /* held every other step (an odd count of steps ends holding it) */
        if (step % 2 == 0) {
            l_periodic = __LINE__ + 1;
            periodic = ndm_zeros(model, NDM_F32, NDM_SHAPE(2));
        } else {
            assert_ok(ndm_array_release(periodic));
        }
        /* a child manager opened every step under the model, never closed */
        l_child = __LINE__ + 1;
        ndm_manager child = ndm_manager_new(model, "child");
        assert_live(child);
        assert_ok(ndm_manager_close(batch));
        assert_ok(ndm_growth_step(g));
    }
    char *t = report_of(g);
    assert_true(strstr(t, "ndm growth: 13 steps of system/test/model") != NULL);
    assert_line(t, l_leak, "leak");
    assert_line(t, l_leak, "+1.00 array/step, +4 bytes/step: 13 arrays, 52 bytes");
    assert_line(t, l_leak, "in system/test/model/stats");
    assert_line(t, l_child, "leak");
    assert_line(t, l_child, "+1.00 manager/step");
    assert_line(t, l_child, "13 managers 'child'");
    assert_line(t, l_cache, "cache");
    assert_line(t, l_cache, "grew, then stopped: 4 arrays, 64 bytes");
    assert_line(t, l_periodic, "periodic");
    assert_line(t, l_weights, "steady");
    /* the batch and its arrays are closed each step: released, not listed */
    assert_not_listed(t, l_batch);
    free(t);
    assert_int_equal(ndm_growth_leaks(g), 2);
    assert_ok(ndm_array_release(periodic));
    assert_ok(ndm_growth_free(g));
    assert_status(ndm_growth_free(g), NDM_ALREADY);
    assert_false(ndm_growth_valid(g));
    assert_ok(ndm_manager_close(model));
}

/* A manager whose arrays do not change is sampled from what its last walk
 * found (its counts of arrays made, released and moved are those of then):
 * over many steps, and past a slot reused by another manager, every site
 * keeps its exact count and bytes, and a change is seen at the step it
 * happens. */
static void test_unchanged_managers_keep_their_counts(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager frozen = ndm_manager_new(model, "frozen");
    /* line a's two arrays with line b's between them */
    ndm_array a[2], b = NDM_NULL_ARRAY;
    int l_a = 0, l_b = 0;
    for (int i = 0; i < 2; i++) {
        if (i == 1) {
            l_b = __LINE__ + 1;
            b = ndm_zeros(frozen, NDM_F32, NDM_SHAPE(3));
        }
        l_a = __LINE__ + 1;
        a[i] = ndm_zeros(frozen, NDM_F32, NDM_SHAPE(5));
    }
    assert_true(a[0].id && b.id && a[1].id);
    ndm_growth g = ndm_growth_new(ROOT(state), model);
    for (int step = 0; step < 70; step++) {
        /* a manager closed each step: its slot is taken again by the next */
        ndm_manager batch = ndm_manager_new(model, "batch");
        assert_live(ndm_zeros(batch, NDM_F32, NDM_SHAPE(step % 3 + 1)));
        assert_ok(ndm_manager_close(batch));
        if (step == 69)
            assert_ok(ndm_array_release(b));
        assert_ok(ndm_growth_step(g));
    }
    char *t = report_of(g);
    assert_line(t, l_a, "steady");
    assert_line(t, l_a, "2 arrays, 40 bytes");
    /* released at the last step: not listed */
    assert_not_listed(t, l_b);
    free(t);
    assert_int_equal(ndm_growth_leaks(g), 0);
    assert_ok(ndm_growth_free(g));
    assert_ok(ndm_manager_close(model));
}

static void test_a_clean_loop_has_no_leaks(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(16));
    assert_live(w);
    ndm_growth g = ndm_growth_new(ROOT(state), model);
    for (int step = 0; step < 40; step++) {
        ndm_manager batch = ndm_manager_new(model, "batch");
        ndm_array y = ndm_mul(ndm_zeros(batch, NDM_F32, NDM_SHAPE(16)), w);
        assert_live(y);
        assert_ok(ndm_manager_close(batch));
        assert_ok(ndm_growth_step(g));
    }
    assert_int_equal(ndm_growth_leaks(g), 0);
    char *t = report_of(g);
    assert_true(strstr(t, "40 steps") && strstr(t, "0 growing") && strstr(t, "classes over the last 32 steps"));
    free(t);
    assert_ok(ndm_manager_close(model));
    /* the watched manager is gone: a step says so, the report still prints */
    assert_status(ndm_growth_step(g), NDM_E_CLOSED);
    t = report_of(g);
    assert_true(strstr(t, "of a closed manager") != NULL);
    free(t);
    assert_ok(ndm_growth_free(g));
}

static void test_few_steps_and_bad_calls(void **state)
{
    ndm_manager owner = ndm_manager_new(ROOT(state), "owner");
    ndm_array a = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(3));
    ndm_growth g = ndm_growth_new(owner, ROOT(state));
    assert_true(g.id != 0);
    assert_ok(ndm_growth_step(g));
    assert_ok(ndm_growth_step(g));
    char *t = report_of(g);
    assert_true(strstr(t, "too few steps") != NULL);
    free(t);
    assert_status(ndm_growth_report(g, NULL), NDM_E_INVALID);
    assert_error_has("ndm_growth_report");
    /* the tracker dies with its owner */
    assert_ok(ndm_manager_close(owner));
    assert_false(ndm_growth_valid(g));
    int l_stale = __LINE__ + 1;
    assert_status(ndm_growth_step(g), NDM_E_CLOSED);
    char here[64];
    snprintf(here, sizeof here, "test_growth.c:%d", l_stale);
    assert_error_has(here);
    ndm_growth forged = {g.id ^ 0x0000400000000000ull};
    assert_true(ndm_growth_leaks(forged) < 0);
    ndm_clear_error();
    assert_status(ndm_growth_step((ndm_growth){0}), NDM_E_NULL);
    /* a built-in node owns no tracker, and the message names this call */
    ndm_growth sys = ndm_growth_new(ndm_system(), ROOT(state));
    assert_true(sys.id == 0);
    assert_error_has("ndm_growth_new");
    /* a stale manager makes no tracker */
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    assert_ok(ndm_manager_close(gone));
    ndm_growth none = ndm_growth_new(ROOT(state), gone);
    assert_true(none.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_ok(ndm_array_release(a));
    assert_manager_empty(ROOT(state));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_classes_of_a_training_loop),
        TEST(test_unchanged_managers_keep_their_counts),
        TEST(test_a_clean_loop_has_no_leaks),
        TEST(test_few_steps_and_bad_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
