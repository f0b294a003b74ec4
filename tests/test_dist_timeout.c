/* A rank that does not take part: under mpirun -np 2 with
 * NDM_DIST_TIMEOUT_S=1, rank 0's collective (or, with the argument "ddp",
 * its data-parallel step) ends with NDM_E_TIMEOUT instead of hanging, the
 * group stays broken, and once rank 1 comes late both leave cleanly. Its
 * own program: a broken group cannot be mended. */
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ndm/dist.h"

static void test_dist_wait_for_an_absent_rank_times_out(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_ones(m, NDM_F32, 1, (int64_t[]){16});
    assert_live(a);
    if (ndm_dist_rank() == 0) {
        ndm_clear_error();
        assert_status(ndm_all_reduce_(a, NDM_DIST_SUM), NDM_E_TIMEOUT);
        assert_error_has("waited 1 s");
        /* broken: later collectives fail at once, naming why */
        assert_status(ndm_dist_barrier(), NDM_E_TIMEOUT);
        assert_error_has("broken");
    } else {
        /* absent for three timeouts, then comes to the abandoned agreement
         * with another collective: told so, with no data moved */
        nanosleep(&(struct timespec){3, 0}, NULL);
        ndm_clear_error();
        assert_status(ndm_dist_barrier(), NDM_E_INVALID);
        assert_error_has("rank 0 calls ndm_all_reduce_ and rank 1 calls ndm_dist_check");
    }
    assert_ok(ndm_array_release(a));
}

/* The buckets wait on the communication thread, in MPI's blocking
 * all-reduce: the step's wait is bounded all the same. */
static void test_ddp_step_waits_for_an_absent_rank_times_out(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = ndm_linear(model, 8, 4, true, &rng);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_int_equal(ndm_ddp_buckets(d), 2);
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array x = ndm_ones(batch, NDM_F32, 2, (int64_t[]){2, 8});
    ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){2});
    if (ndm_dist_rank() == 1)
        nanosleep(&(struct timespec){3, 0}, NULL);
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
    assert_ok(ndm_ddp_backward(d, loss));
    (void)ndm_grad_end();
    ndm_clear_error();
    if (ndm_dist_rank() == 0) {
        assert_status(ndm_ddp_step(d), NDM_E_TIMEOUT);
        assert_error_has("waited 1 s");
        assert_status(ndm_dist_barrier(), NDM_E_TIMEOUT);
        assert_error_has("broken");
    } else {
        /* late, it meets rank 0's buckets, which were still waiting */
        assert_ok(ndm_ddp_step(d));
    }
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* The usual teardown checks that nothing is left under system; here the
 * broken group's "dist" manager legitimately is, until the finalize. */
static int teardown(void **state)
{
    ndm_manager *m = *state;
    assert_manager_empty(*m);
    (void)!ndm_manager_close(*m);
    test_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    bool ddp = argc > 1 && !strcmp(argv[1], "ddp");
    if (ndm_dist_init() != NDM_OK) {
        fprintf(stderr, "ndm_dist_init: %s\n", ndm_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dist_wait_for_an_absent_rank_times_out, test_setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ddp_step_waits_for_an_absent_rank_times_out,
                                        test_setup, teardown),
    };
    int failed = _cmocka_run_group_tests(ddp ? "dist timeout, ddp" : "dist timeout", tests + ddp,
                                         1, NULL, NULL);
    /* rank 0 finishes the abandoned operations here: its view of the
     * array's storage is released by the finalize */
    ndm_status st = ndm_dist_finalize();
    if (st != NDM_OK)
        fprintf(stderr, "ndm_dist_finalize: %s\n", ndm_last_error());
    else if (ndm_leak_report(stderr) != 0)
        return 1;
    return failed || st != NDM_OK;
}
