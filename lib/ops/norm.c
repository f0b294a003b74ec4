/* The fused RMS normalisation: the nn family's rms_norm where the device
 * has it and the operands fit it (ndm_rms_norm composes otherwise), one
 * autograd node whose rule reads the saved reciprocal roots. */
#include "../backends/nn.h"
#include "autograd.h"
#include "dispatch.h"

bool ndm__rms_norm_fused(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                         ndm_array w, double eps, ndm_array *res)
{
    *res = NDM_NULL_ARRAY;
    ndm__array *rx = ndm__array_peek(x), *rw = w.id ? ndm__array_peek(w) : NULL;
    if (!rx || (w.id && !rw))
        return false;
    ndm_device dev = rx->storage->device;
    const ndm__backend *b = ndm__backend_for(dev.type);
    int nd = rx->ndim;
    if (!b || !b->nn || !b->nn->rms_norm || (rx->dtype != NDM_F32 && rx->dtype != NDM_F64) ||
        nd < 1 || rx->shape[nd - 1] < 1 || ndm__layout_of(rx) != 0 ||
        (rw && (rw->dtype != rx->dtype || rw->ndim != 1 || ndm__layout_of(rw) != 0 ||
                rw->storage->device.type != dev.type || rw->storage->device.index != dev.index)))
        return false;
    out = ndm__output_manager(out, rx, api, site);
    if (!out.id)
        return true;
    /* the roots keep x's shape with the last axis 1, for the rule's broadcasts */
    int64_t small[8], *rshape = nd <= 8 ? small : NULL;
    if (!rshape) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "rank %d above the fused path's 8", nd);
        return true;
    }
    for (int d = 0; d < nd; d++)
        rshape[d] = d == nd - 1 ? 1 : rx->shape[d];
    ndm__array *oy, *orr;
    ndm_array y = ndm__array_new_on(site, api, out, dev, rx->dtype, nd, rx->shape, &oy);
    if (!y.id)
        return true;
    ndm_array r = ndm__array_new_on(site, api, out, dev, rx->dtype, nd, rshape, &orr);
    if (!r.id) {
        ndm__discard(y);
        return true;
    }
    ndm__tensor ty = ndm__tensor_of(oy), tr = ndm__tensor_of(orr), tx = ndm__tensor_of(rx), tw;
    if (rw)
        tw = ndm__tensor_of(rw);
    ndm_status st = b->nn->rms_norm(dev.index, &ty, &tr, &tx, rw ? &tw : NULL, eps);
    if (st < 0) {
        ndm__fail(st, api, site, "rms_norm kernel failed: %s", ndm_status_str(st));
        ndm__discard(y);
        ndm__discard(r);
        return true;
    }
    if (NDM__UNLIKELY(ndm__ag_on())) {
        ndm__ag_params agp = {.i = {rw != NULL}, .s = {eps}};
        ndm_array in[3] = {x, rw ? w : r, r};
        ndm__ag_record(NDM__AG_RMS_NORM, y, rw ? 3 : 2, in, &agp);
    }
    ndm__discard(r);
    *res = y;
    return true;
}
