/* The Fashion-MNIST networks, shared by ndm-fashion and bench/train. */
#ifndef NDM_FASHION_NET_H
#define NDM_FASHION_NET_H

#include <stdbool.h>

#include "ndm/ndm.h"

/* "mlp": Flatten, 784-256-128-10 with ReLU; "cnn": two 3x3 convolutions
 * (32, 64 channels) with ReLU and 2x2 max pooling, then 3136-128-10. The
 * parameters go to `model`. Null module on failure. */
ndm_module fashion_net(ndm_manager model, const char *arch, ndm_rng *rng);

/* Images as the network wants them: (B, 28, 28) for the MLP (it flattens),
 * a (B, 1, 28, 28) view for the CNN. */
ndm_array fashion_input(ndm_array x, bool cnn);

#endif
