/* The manager tree: creation, close order, caps, limits, owned resources. */
#include "helpers.h"

static void test_manager_new_names_path(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    assert_live(model);
    ndm_manager batch = ndm_manager_new(model, "batch-17");
    assert_live(batch);
    char path[256];
    assert_int_equal(ndm_manager_path(batch, path, sizeof path), (int)strlen("system/test/model/batch-17"));
    assert_string_equal(path, "system/test/model/batch-17");
    assert_ok(ndm_manager_close(model));
    assert_false(ndm_manager_valid(batch));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_manager_new_names_path),
    };
    return cmocka_run_group_tests_name("manager", tests, NULL, NULL);
}
