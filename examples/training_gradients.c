/* Training with gradients on Fashion-MNIST: a loader deals batches, each in
 * a manager of its own; the graph lives in the batch; the optimizer updates
 * the capped model in place. Usage: training_gradients [DATA_DIR] */
#include <stdio.h>

#include <ndm/ndm.h>

static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    char images[1024], labels[1024];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte.gz", dir);
    ndm_set_log_fn(show_error, NULL);

    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_dataset ds; /* inputs u8 [60000, 28, 28], labels u8 [60000] */
    NDM_CHECK(ndm_dataset_load_idx(data, images, labels, &ds) == NDM_OK);

    ndm_rng rng = ndm_rng_new(42);
    ndm_module net = ndm_sequential(model, NDM_MODULES(
        ndm_flatten_module(model, 1), /* [64, 28, 28] -> [64, 784] */
        ndm_linear(model, 784, 256, true, &rng), ndm_relu_module(model),
        ndm_linear(model, 256, 10, true, &rng)));
    ndm_optimizer opt = ndm_adam(model, net, 1e-3, 0.9, 0.999, 1e-8, 0.0);
    NDM_CHECK(opt.id); /* a failure anywhere above gives a null handle here */
    NDM_CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS) == NDM_OK); /* parameters and state are all in */

    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_loader loader = ndm_loader_new(trainer, ds, &(ndm_loader_options){
        .batch_size = 64, .seed = 1,
        .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    NDM_CHECK(loader.id);

    ndm_batch b;
    for (int step = 0; step < 60; step++) {
        NDM_CHECK(ndm_loader_next(loader, &b) > 0); /* closes the previous batch's manager */
        NDM_CHECK(ndm_grad_begin(b.manager) == NDM_OK); /* the graph is a child of the batch */
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, b.inputs), b.labels);
        NDM_CHECK(ndm_backward(loss) == NDM_OK);
        NDM_CHECK(ndm_grad_end() == NDM_OK);
        NDM_CHECK(ndm_optimizer_step(opt) == NDM_OK); /* in place: the capped model accepts it */
        NDM_CHECK(ndm_optimizer_zero_grad(opt) == NDM_OK);
        double l;
        NDM_CHECK(ndm_item(loss, &l) == NDM_OK);
        if (step % 20 == 0 || step == 59)
            printf("step %3d: loss %.1f\n", step, l);
    }
    (void)ndm_debug_dump(model, stdout);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    NDM_CHECK(ndm_manager_close(data) == NDM_OK);
    return 0;
}
