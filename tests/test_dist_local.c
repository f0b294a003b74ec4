/* The process group in one process, without mpirun: a build without MPI
 * answers NDM_E_UNSUPPORTED, saying why; a build with MPI refuses
 * collectives before ndm_dist_init. Either way nothing hangs or changes. */
#include "helpers.h"
#include "ndm/dist.h"

static void test_dist_without_a_group_refuses_with_a_message(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, 1, (int64_t[]){4});
    assert_live(a);
    assert_int_equal(ndm_dist_rank(), 0);
    assert_int_equal(ndm_dist_size(), 1);
    assert_int_equal(ndm_dist_local_rank(), 0);
    ndm_status want = ndm_dist_available() ? NDM_E_INVALID : NDM_E_UNSUPPORTED;
    const char *why = ndm_dist_available() ? "ndm_dist_init first" : "without MPI";
    ndm_clear_error();
    assert_status(ndm_all_reduce_(a, NDM_DIST_SUM), want);
    assert_error_has(why);
    assert_status(ndm_broadcast_(a, 0), want);
    assert_status(ndm_dist_barrier(), want);
    assert_false(ndm_all_gather_to(m, a).id);
    assert_int_equal(ndm_last_status(), want);
    assert_false(ndm_reduce_scatter_to(m, a, NDM_DIST_SUM).id);
    assert_status(ndm_dist_debug_dump(m, stderr), want);
    assert_int_equal(ndm_dist_leak_report(stderr), want);
    assert_false(ndm_ddp_new(m, (ndm_module){0}, (ndm_optimizer){0}, NULL).id);
    assert_int_equal(ndm_last_status(), want);
    ndm_dataset ds = {a, NDM_NULL_ARRAY};
    assert_false(ndm_dist_loader_new(m, ds, &(ndm_loader_options){.batch_size = 1}).id);
    assert_int_equal(ndm_last_status(), want);
    if (!ndm_dist_available())
        assert_status(ndm_dist_init(), NDM_E_UNSUPPORTED);
    assert_status(ndm_dist_finalize(), ndm_dist_available() ? NDM_ALREADY : NDM_E_UNSUPPORTED);
    /* unchanged */
    float v[4];
    assert_ok(ndm_array_copy_out(a, v, sizeof v));
    for (int i = 0; i < 4; i++)
        assert_true(v[i] == 1.0f);
    assert_ok(ndm_array_release(a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_dist_without_a_group_refuses_with_a_message),
    };
    return cmocka_run_group_tests_name("dist_local", tests, NULL, NULL);
}
