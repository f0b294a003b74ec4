/* An inference service: a model loaded once from a saved file into a capped
 * manager, then a manager per request that dies as soon as the answer is out.
 * Usage: inference_service MODEL_FILE (written first, as training would). */
#include <stdio.h>

#include <ndm/ndm.h>

static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

/* The network, built the same way when training and when serving. */
static ndm_module network(ndm_manager model, ndm_rng *rng)
{
    return ndm_sequential(model, NDM_MODULES(ndm_linear(model, 4, 8, true, rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 8, 3, true, rng)));
}

/* What a training run leaves behind: the parameters in a safetensors file. */
static void save_trained(const char *path)
{
    ndm_manager run = ndm_manager_new(ndm_system(), "training-run");
    ndm_rng rng = ndm_rng_new(7);
    ndm_module net = network(run, &rng);
    const char *names[8];
    ndm_array params[8];
    int n = ndm_module_named_parameters(net, names, params, 8);
    NDM_CHECK(n > 0);
    ndm_named_arrays set = {(size_t)n, names, params, 0, NULL, NULL};
    NDM_CHECK(ndm_safetensors_save(path, &set) == NDM_OK);
    NDM_CHECK(ndm_manager_close(run) == NDM_OK);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: inference_service MODEL_FILE\n");
        return 2;
    }
    ndm_set_log_fn(show_error, NULL);
    save_trained(argv[1]);

    /* Load: build the network without gradient arrays (serving never needs
     * them), then one call reads the file into it and makes the predictor,
     * which caps the model: a request can read it but not add to it. */
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(0); /* overwritten by the file */
    ndm_no_grad_begin();
    ndm_module net = network(model, &rng);
    ndm_no_grad_end();
    ndm_predictor pred = ndm_predictor_load(model, net, argv[1]);
    ndm_manager requests = ndm_manager_new(ndm_system(), "requests");
    NDM_CHECK(pred.id && requests.id);

    const float inputs[5][4] = {
        {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {1, 1, 1, 1}};
    for (int r = 0; r < 5; r++) {
        /* one manager per request: the input, the answer and every
         * temporary die when the block ends, even on an early return */
        NDM_AUTO ndm_manager req = ndm_manager_new(requests, "request");
        ndm_array x = ndm_from_buffer(req, NDM_F32, inputs[r], NDM_SHAPE(1, 4));
        ndm_array answer = ndm_argmax(ndm_predict(pred, x), 1, false); /* in req: x's manager */
        int64_t cls;
        NDM_CHECK(ndm_item_i64(answer, &cls) == NDM_OK);
        printf("request %d: class %lld\n", r, (long long)cls);
    }

    /* after the requests: the model as loaded, and this thread's request
     * manager, kept open empty for its next request */
    (void)ndm_debug_dump(model, stdout);
    (void)ndm_debug_dump(requests, stdout);
    NDM_CHECK(ndm_manager_close(requests) == NDM_OK);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    return 0;
}
