/* A memory snapshot: record the allocator's events while a few steps run,
 * write them as JSON shaped like PyTorch's snapshot, and turn that into a
 * page with ndm-memviz. Usage: memory_snapshot OUT.json, then
 *     ndm-memviz OUT.json OUT.html */
#include <stdio.h>

#include <ndm/ndm.h>

static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: memory_snapshot OUT.json\n");
        return 2;
    }
    ndm_set_log_fn(show_error, NULL);
    /* every allocation from here on is recorded with its manager and line */
    NDM_CHECK(ndm_memory_record_history(true, 0) == NDM_OK);

    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(512, 512)); /* 1 MiB, lives throughout */
    NDM_CHECK(trainer.id && w.id);
    for (int step = 0; step < 5; step++) {
        NDM_AUTO ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_full(batch, NDM_F32, 1.0, NDM_SHAPE(256, 512));
        ndm_array y = ndm_tanh(ndm_matmul(x, w)); /* the step's temporaries, in batch */
        NDM_CHECK(y.id);
    }

    /* the page shows w as a flat band and the five steps as five bumps */
    NDM_CHECK(ndm_memory_dump_snapshot(argv[1]) == NDM_OK);
    NDM_CHECK(ndm_memory_record_history(false, 0) == NDM_OK);
    printf("wrote %s; turn it into a page with: ndm-memviz %s snapshot.html\n", argv[1], argv[1]);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    return 0;
}
