/* Finding leaks. Growth per step: a training loop keeps one array per step
 * by mistake; ndm_debug_dump shows which manager grows, and ndm_mark then
 * ndm_report_since on ndm_system() name the line that made what is still
 * alive. A forgotten close: NDM_LEAK_REPORT=1 lists at exit every manager
 * still open, with its line (ndm_leak_report prints the same at any time). */
#include <stdio.h>

#include <ndm/ndm.h>

static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

int main(void)
{
    ndm_set_log_fn(show_error, NULL);
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 16, 8, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 8, 4, true, &rng)));
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_array losses = ndm_zeros(trainer, NDM_F32, NDM_SHAPE(30)); /* one slot per step */
    NDM_CHECK(opt.id && losses.id);
    NDM_CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS) == NDM_OK);

    ndm_seq mark = 0;
    for (int step = 0; step < 30; step++) {
        if (step == 10) {
            (void)ndm_debug_dump(model, stdout); /* the first dump: the baseline */
            mark = ndm_mark(ndm_system());       /* warmed up: nothing should pile up now */
        }
        NDM_AUTO ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_uniform(batch, &rng, NDM_F32, -1, 1, NDM_SHAPE(32, 16));
        ndm_array y = ndm_randint(batch, &rng, NDM_I64, 0, 4, NDM_SHAPE(32));
        NDM_CHECK(ndm_grad_begin(batch) == NDM_OK);
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        NDM_CHECK(ndm_backward(loss) == NDM_OK);
        NDM_CHECK(ndm_grad_end() == NDM_OK);
        NDM_CHECK(ndm_optimizer_step(opt) == NDM_OK);
        NDM_CHECK(ndm_optimizer_zero_grad(opt) == NDM_OK);

        /* The bug: the step's loss is copied into the trainer to be logged,
         * and never released. The fix is to keep it in `batch` (plain
         * ndm_copy), or to write it into `losses` with ndm_copy_into. */
        ndm_array logged = ndm_copy_to(trainer, loss);
        NDM_CHECK(logged.id);
    }

    printf("\nafter 30 steps the trainer holds 20 more arrays than at step 10:\n");
    (void)ndm_debug_dump(model, stdout);
    printf("\nwhat was made since the mark and is still alive, by line:\n");
    (void)ndm_report_since(ndm_system(), mark, stdout);
    printf("\n%lld arrays leaked since the mark\n",
           (long long)ndm_count_since(ndm_system(), mark));
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);

    /* The other kind: a manager nobody closes (made for one request, say,
     * and forgotten on an early return). */
    ndm_manager cache = ndm_manager_new(ndm_system(), "cache");
    NDM_CHECK(ndm_zeros(cache, NDM_F32, NDM_SHAPE(256)).id);
    printf("\nwhat NDM_LEAK_REPORT=1 would print at exit without the close below:\n");
    (void)ndm_leak_report(stdout);
    NDM_CHECK(ndm_manager_close(cache) == NDM_OK);
    return 0;
}
