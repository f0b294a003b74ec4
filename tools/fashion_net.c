/* The Fashion-MNIST networks: an MLP and a small CNN. */
#include <string.h>

#include "fashion_net.h"

ndm_module fashion_net(ndm_manager model, const char *arch, ndm_rng *rng)
{
    if (!strcmp(arch, "cnn"))
        return ndm_sequential(
            model,
            NDM_MODULES(
                ndm_conv2d_module(model, 1, 32, 3, 3, true, rng, NDM_CONV2D(.padding = {1, 1})),
                ndm_relu_module(model), ndm_max_pool2d_module(model, NDM_POOL2D(.kernel = {2, 2})),
                ndm_conv2d_module(model, 32, 64, 3, 3, true, rng, NDM_CONV2D(.padding = {1, 1})),
                ndm_relu_module(model), ndm_max_pool2d_module(model, NDM_POOL2D(.kernel = {2, 2})),
                ndm_flatten_module(model, 1), ndm_linear(model, 64 * 7 * 7, 128, true, rng),
                ndm_relu_module(model), ndm_linear(model, 128, 10, true, rng)));
    return ndm_sequential(model, NDM_MODULES(ndm_flatten_module(model, 1),
                                             ndm_linear(model, 784, 256, true, rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 256, 128, true, rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 128, 10, true, rng)));
}

ndm_array fashion_input(ndm_array x, bool cnn)
{
    return cnn ? ndm_reshape(x, NDM_SHAPE(-1, 1, 28, 28)) : x;
}
