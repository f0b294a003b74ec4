/* Private declarations shared by the nn files. */
#ifndef NDM_NN_INTERNAL_H
#define NDM_NN_INTERNAL_H

#include "ndm/nn.h"
#include "../base/error.h"

/* Is m a live module? */
bool ndm__module_valid(ndm_module m);
/* Does module m belong to `model`, and do its parameters live there?
 * NDM_OK, or NDM_E_NOT_OWNER (or the handles' errors) recorded for api. */
ndm_status ndm__module_check_owner(ndm_module m, ndm_manager model, const char *api,
                                   ndm__site site);

/* m's forward pass on x, without the scope ndm_forward makes: every array
 * it creates follows the output rule, so the caller's innermost scope must
 * be the one that owns them (a predictor's request). Null on failure, with
 * the error recorded for api. */
ndm_array ndm__module_run(ndm_module m, ndm_array x, const char *api, ndm__site site);

/* A predictor's request as ndm_predict() runs it, its request manager a
 * child of `parent` (a batch) instead of the predictor's manager, the
 * answer moved to dst; *peak (when peak is not NULL) gets the request's
 * peak bytes on the model's device (its temporaries and the answer). Null
 * on failure, with the error recorded for api. */
ndm_array ndm__predict_under(ndm_predictor h, ndm_manager parent, ndm_manager dst,
                             ndm_array input, uint64_t *peak, const char *api, ndm__site site);
/* The model manager of a live predictor (null, with the error recorded,
 * for a bad handle). */
ndm_manager ndm__predictor_model(ndm_predictor h, const char *api, ndm__site site);

/* Write src into dst as ndm_copy_into does, also when src lives on another
 * device (a checkpoint read on the host into a GPU module's state): then
 * through a transfer into `scratch`, released before return. */
ndm_status ndm__nn_copy_into(ndm__site site, ndm_manager scratch, ndm_array dst, ndm_array src);

/* The optimizer's parameter count (or the handle's error), and the index
 * of `param` among its parameters (-1 when it has none such). */
int ndm__optimizer_count(ndm_optimizer h);
int ndm__optimizer_find(ndm_optimizer h, ndm_array param);
/* ndm_optimizer_step() over the parameters idx[0..n-1] only. `start`
 * begins a step (Adam counts it for its bias correction): true on a step's
 * first subset, false on the others. Subsets that cover every parameter
 * once give the bits of ndm_optimizer_step(). */
ndm_status ndm__optimizer_step_some(ndm_optimizer h, const int *idx, int n, bool start);

#endif
