/* NDM_ALLOC_CONF read at the first allocation: a bad string fails every
 * allocation with its reason until ndm_alloc_configure, a good one applies.
 * Run as two tests, each with its own environment (NDM_TEST_ENV_CASE). */
#include <stdlib.h>

#include "helpers.h"

static bool env_case(const char *want)
{
    const char *c = getenv("NDM_TEST_ENV_CASE");
    return c && !strcmp(c, want);
}

static void test_alloc_env_bad_conf_fails_allocations(void **state)
{
    if (!env_case("bad"))
        skip();
    ndm_manager root = ROOT(state);
    ndm_clear_error();
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(10));
    assert_true(ndm_array_is_null(a));
    assert_int_equal(ndm_last_status(), NDM_E_CONFIG);
    assert_error_has("NDM_ALLOC_CONF: max_split_size_mb must be at least 20 (got 5)");
    assert_int_equal(test_live_arrays(root), 0);
    /* Still failing, until the program configures the device itself. */
    assert_true(ndm_array_is_null(ndm_empty(root, NDM_F32, NDM_SHAPE(10))));
    assert_ok(ndm_alloc_configure(NDM_CPU, "max_split_size_mb:20"));
    a = ndm_empty(root, NDM_F32, NDM_SHAPE(10));
    assert_live(a);
    assert_ok(ndm_array_release(a));
}

static void test_alloc_env_conf_applies_per_device(void **state)
{
    if (!env_case("good"))
        skip();
    ndm_manager root = ROOT(state);
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(10));
    assert_live(a);
    char buf[512];
    assert_true(ndm_alloc_settings(NDM_CPU, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "strategy:auto_growth"));
    assert_non_null(strstr(buf, "memory_limit_mb:128"));
    assert_non_null(strstr(buf, "pressure_every_mb:2"));
    ndm_memory_stats st;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &st));
    assert_int_equal(st.memory_limit, 128 << 20);
    assert_ok(ndm_array_release(a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_alloc_env_bad_conf_fails_allocations),
        TEST(test_alloc_env_conf_applies_per_device),
    };
    return cmocka_run_group_tests_name("alloc_env", tests, NULL, NULL);
}
