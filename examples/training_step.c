/* A training step: the model capped once its parameters are in, a batch
 * manager per step that NDM_AUTO closes, and a dump that shows nothing piled up. */
#include <stdio.h>

#include <ndm/ndm.h>

/* ndm passes every failure to this callback as it happens, with the line of
 * your code that made the call. Without a callback, ndm prints each one on
 * stderr (NDM_LOG_ERRORS=0 silences that); ndm_last_error() holds the last.
 * NDM_CHECK stops at the first failure: it prints the check, the error and
 * its line, then aborts. */
static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

int main(void)
{
    ndm_set_log_fn(show_error, NULL);
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(784, 128));
    ndm_array b = ndm_zeros(model, NDM_F32, NDM_SHAPE(128));
    NDM_CHECK(trainer.id && w.id && b.id);
    /* strays into the model now fail, with their line */
    NDM_CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS) == NDM_OK);

    for (int step = 0; step < 100; step++) {
        NDM_AUTO ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_full(batch, NDM_F32, 0.5, NDM_SHAPE(64, 784));
        ndm_array y = ndm_relu(ndm_add(ndm_matmul(x, w), b)); /* lands in batch, x's manager */
        NDM_CHECK(y.id);
    } /* batch closes here, by any path */

    (void)ndm_debug_dump(model, stdout);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    return 0;
}
