/* The small fixed model of the checkpoint target and of its seeds: two
 * linear layers (3 -> 4 -> 2, "0.weight" ... "1.bias") and Adam over them. */
#ifndef NDM_FUZZ_CHECKPOINT_H
#define NDM_FUZZ_CHECKPOINT_H

#include "ndm/ndm.h"

typedef struct fuzz_model {
    ndm_manager model;
    ndm_module net;
    ndm_optimizer opt;
} fuzz_model;

/* false when a part could not be made (the last error says why). */
static bool fuzz_model_make(fuzz_model *fm)
{
    ndm_rng rng = ndm_rng_new(7);
    fm->model = ndm_manager_new(ndm_system(), "fuzz-model");
    if (!fm->model.id)
        return false;
    fm->net = ndm_sequential(fm->model, NDM_MODULES(ndm_linear(fm->model, 3, 4, true, &rng),
                                                    ndm_linear(fm->model, 4, 2, true, &rng)));
    if (!fm->net.id)
        return false;
    fm->opt = ndm_adam(fm->model, fm->net, 1e-3, 0.9, 0.999, 1e-8, 0.0);
    return fm->opt.id != 0;
}

#endif
