/* Losses. Cross-entropy and NLL are recorded as one node each (their
 * gradient is one expression), mean squared error as its parts. */
#include <inttypes.h>

#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/autograd.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"

/* Every label in [0, C). gather would take a negative one as counting
 * from the end (-1: class C-1), so the range is checked here, by the index
 * family of the labels' device: on a GPU its kernel finds the first bad
 * label and one download brings it back. */
static bool labels_in_range(const ndm__view *s, const ndm__view *l, const char *api,
                            ndm__site site)
{
    int64_t pos = -1, v = 0, c = s->t.shape[1];
    if (ndm__find_outside(l, 0, c, &pos, &v, api, site) < 0)
        return false;
    if (pos >= 0) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "label %" PRId64 " at position %" PRId64 " is outside [0, %" PRId64
                  ") (the classes of the scores)",
                  v, pos, c);
        return false;
    }
    return true;
}

/* Validate (N, C) scores and (N) integer labels in [0, C). */
static bool check_pair(ndm_array scores, ndm_array labels, const char *api, ndm__site site)
{
    ndm__view vs, vl;
    if (!ndm__view_input(scores, &vs, api, site) || !ndm__view_input(labels, &vl, api, site))
        return false;
    const ndm__tensor *s = &vs.t, *l = &vl.t;
    char d1[160], d2[160];
    if (s->ndim != 2 || l->ndim != 1 || l->shape[0] != s->shape[0]) {
        ndm__fail(NDM_E_SHAPE, api, site, "scores must be (N, C) and labels (N); got %s and %s",
                  ndm__view_desc(&vs, d1, sizeof d1), ndm__view_desc(&vl, d2, sizeof d2));
        return false;
    }
    /* the label dtypes are the index dtypes that gather reads */
    if (!ndm_dtype_is_float(s->dtype) ||
        (l->dtype != NDM_U8 && l->dtype != NDM_I32 && l->dtype != NDM_I64)) {
        ndm__fail(NDM_E_DTYPE, api, site,
                  "scores must be float and labels u8, i32 or i64; got %s and %s",
                  ndm__view_desc(&vs, d1, sizeof d1), ndm__view_desc(&vl, d2, sizeof d2));
        return false;
    }
    if (s->shape[0] == 0) {
        ndm__fail(NDM_E_SHAPE, api, site, "an empty batch has no mean loss");
        return false;
    }
    return labels_in_range(&vs, &vl, api, site);
}

/* mean(-picked) where picked = scores[i, label_i], plus lse when given. */
static ndm_array picked_mean(ndm__site site, const char *api, ndm_manager out, ndm_array scores,
                             ndm_array labels, bool with_lse)
{
    NDM__CALL_FRAME(api, site);
    if (!check_pair(scores, labels, api, site))
        return NDM_NULL_ARRAY;
    ndm_manager dst = ndm__output_for(out, scores, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    bool paused = ndm__ag_pause();
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "loss");
    ndm_array loss = NDM_NULL_ARRAY;
    if (s.id) {
        ndm_array idx = ndm_unsqueeze(labels, 1);
        ndm_array picked = ndm_reshape(ndm_gather(scores, 1, idx), NDM_SHAPE(-1));
        ndm_array per = with_lse ? ndm_sub(ndm_logsumexp(scores, false, NDM_AXES(1)), picked)
                                 : ndm_neg(picked);
        loss = ndm_mean(per, false, NDM_ALL_AXES_LIST);
        if (ndm_scope_end_at(NDM__SITE_ARGS(site), s, loss.id ? 1 : 0, &loss) < 0)
            loss = NDM_NULL_ARRAY;
    }
    ndm__ag_resume(paused);
    NDM__AG_RECORD(with_lse ? NDM__AG_CROSS_ENTROPY : NDM__AG_NLL, loss, 2,
                   ((ndm_array[]){scores, labels}), NULL);
    return loss;
}

NDM_API ndm_array ndm_cross_entropy_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logits,
                                          ndm_array labels)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_cross_entropy", out, logits, labels, true);
}

NDM_API ndm_array ndm_nll_loss_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logp,
                                     ndm_array labels)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_nll_loss", out, logp, labels, false);
}

NDM_API ndm_array ndm_mse_loss_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    NDM__CALL_FRAME("ndm_mse_loss", site);
    ndm__view ra;
    if (!ndm__view_input(a, &ra, "ndm_mse_loss", site))
        return NDM_NULL_ARRAY;
    ndm_manager dst = ndm__output_for(out, a, "ndm_mse_loss", site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    /* recorded as its parts: sub, mul, mean */
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "loss");
    if (!s.id)
        return NDM_NULL_ARRAY;
    /* at the caller's site: a shape mismatch names the user's line */
    ndm_array d = ndm_sub_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, a, b);
    ndm_array loss = ndm_mean_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE,
                                    ndm_mul_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, d, d),
                                    false, NDM_ALL_AXES_LIST);
    if (ndm_scope_end_at(NDM__SITE_ARGS(site), s, loss.id ? 1 : 0, &loss) < 0)
        return NDM_NULL_ARRAY;
    return loss;
}
