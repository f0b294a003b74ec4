/* Losses. Cross-entropy and NLL are recorded as one node each (their
 * gradient is one expression), mean squared error as its parts. Both skip
 * the rows whose label is the ignored one (PyTorch's ignore_index, -100
 * unless the _ex form names another) and average over the rest. */
#include <inttypes.h>
#include <stdio.h>

#include "../manager/alloc/alloc.h"
#include "../manager/reclaim.h"
#include "../ops/autograd.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"

/* Can a label of dtype dt equal `ignore`? (u8 labels never hold -100:
 * they take the plain path, bit for bit what it was.) */
static bool ignorable(ndm_dtype dt, int64_t ignore)
{
    if (dt == NDM_U8)
        return ignore >= 0 && ignore <= 255;
    if (dt == NDM_I32)
        return ignore >= INT32_MIN && ignore <= INT32_MAX;
    return true;
}

/* Every label in [0, C) (the ignored ones were made 0 in `l`). gather
 * would take a negative one as counting from the end (-1: class C-1), so
 * the range is checked here, by the index family of the labels' device: on
 * a GPU its kernel finds the first bad label and one download brings it
 * back. */
static bool labels_in_range(int64_t c, const ndm__view *l, bool ignoring, int64_t ignore,
                            const char *api, ndm__site site)
{
    int64_t pos = -1, v = 0;
    if (ndm__find_outside(l, 0, c, &pos, &v, api, site) < 0)
        return false;
    if (pos >= 0) {
        char also[64] = "";
        if (ignoring)
            snprintf(also, sizeof also, " and is not the ignored label %" PRId64, ignore);
        ndm__fail(NDM_E_INVALID, api, site,
                  "label %" PRId64 " at position %" PRId64 " is outside [0, %" PRId64
                  ") (the classes of the scores)%s",
                  v, pos, c, also);
        return false;
    }
    return true;
}

/* Validate (N, C) scores and (N) integer labels. */
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
    return true;
}

/* The labels with the ignored ones made 0 (class 0 stands in: its row is
 * masked out), and the mask of the rows kept, in the scope. */
static bool mask_ignored(ndm_array labels, int64_t ignore, ndm_array *safe, ndm_array *keep)
{
    *keep = ndm_ne_scalar(labels, (double)ignore);
    *safe = ndm_mul(labels, ndm_astype(*keep, ndm_array_dtype(labels)));
    return safe->id != 0;
}

/* The mean of the kept rows' losses `per`: sum over the kept / their
 * count (all ignored: 0 / 0, NaN, as PyTorch gives). */
static ndm_array kept_mean(ndm_manager scope, ndm_array per, ndm_array keep)
{
    ndm_array zero = ndm_zeros(scope, ndm_array_dtype(per), NDM_SCALAR);
    ndm_array count = ndm_sum(ndm_astype(keep, ndm_array_dtype(per)), false, NDM_ALL_AXES_LIST);
    return ndm_div(ndm_sum(ndm_where(keep, per, zero), false, NDM_ALL_AXES_LIST), count);
}

/* mean(-picked) over the rows whose label is not `ignore`, where picked =
 * scores[i, label_i], plus lse when given. */
static ndm_array picked_mean(ndm__site site, const char *api, ndm_manager out, ndm_array scores,
                             ndm_array labels, int64_t ignore, bool with_lse)
{
    NDM__CALL_FRAME(api, site);
    if (!check_pair(scores, labels, api, site))
        return NDM_NULL_ARRAY;
    int64_t c = ndm_array_dim(scores, 1);
    /* With an ignored label outside [0, C) (the default -100), labels all
     * in [0, C) (the check the plain path makes anyway) take the plain
     * path: the mask is made only when a label is outside. */
    ndm__view vl0;
    int64_t pos = -1, bad = 0;
    if (!ndm__view_input(labels, &vl0, api, site) ||
        ndm__find_outside(&vl0, 0, c, &pos, &bad, api, site) < 0)
        return NDM_NULL_ARRAY;
    bool ignoring = (pos >= 0 || (ignore >= 0 && ignore < c)) &&
                    ignorable(ndm_array_dtype(labels), ignore);
    ndm_manager dst = ndm__output_for(out, scores, api, site);
    if (!dst.id)
        return NDM_NULL_ARRAY;
    bool paused = ndm__ag_pause();
    ndm_manager s = ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "loss");
    ndm_array loss = NDM_NULL_ARRAY;
    if (s.id) {
        /* a bad label leaves nothing behind: the scope takes the mask */
        ndm_array safe = labels, keep = NDM_NULL_ARRAY;
        ndm__view vl;
        if ((!ignoring || mask_ignored(labels, ignore, &safe, &keep)) &&
            ndm__view_input(safe, &vl, api, site) &&
            labels_in_range(c, &vl, ignoring, ignore, api, site)) {
            ndm_array idx = ndm_unsqueeze(safe, 1);
            ndm_array picked = ndm_reshape(ndm_gather(scores, 1, idx), NDM_SHAPE(-1));
            ndm_array per = with_lse
                                ? ndm_sub(ndm_logsumexp(scores, false, NDM_AXES(1)), picked)
                                : ndm_neg(picked);
            loss = ignoring ? kept_mean(s, per, keep) : ndm_mean(per, false, NDM_ALL_AXES_LIST);
        }
        if (ndm_scope_end_at(NDM__SITE_ARGS(site), s, loss.id ? 1 : 0, &loss) < 0)
            loss = NDM_NULL_ARRAY;
    }
    ndm__ag_resume(paused);
    ndm__ag_params p = {.i = {0, ignoring, ignore}};
    NDM__AG_RECORD(with_lse ? NDM__AG_CROSS_ENTROPY : NDM__AG_NLL, loss, 2,
                   ((ndm_array[]){scores, labels}), &p);
    return loss;
}

NDM_API ndm_array ndm_cross_entropy_ex_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logits,
                                             ndm_array labels, int64_t ignore_index)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_cross_entropy", out, logits, labels, ignore_index, true);
}

NDM_API ndm_array ndm_cross_entropy_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logits,
                                          ndm_array labels)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_cross_entropy", out, logits, labels, NDM_IGNORE_INDEX,
                       true);
}

NDM_API ndm_array ndm_nll_loss_ex_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logp,
                                        ndm_array labels, int64_t ignore_index)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_nll_loss", out, logp, labels, ignore_index, false);
}

NDM_API ndm_array ndm_nll_loss_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logp,
                                     ndm_array labels)
{
    NDM__ENTRY(__func__);
    NDM__OP_GUARD();
    return picked_mean(NDM__SITE, "ndm_nll_loss", out, logp, labels, NDM_IGNORE_INDEX, false);
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
