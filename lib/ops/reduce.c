/* Reductions and softmax: axis lists, result dtypes and the empty-reduction
 * rules are settled here; the backend's reduce family does the arithmetic. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../backends/reduce.h"
#include "autograd.h"
#include "dispatch.h"
#include "supports.h"

static ndm_dtype result_dtype(ndm__reduce_op op, ndm_dtype t)
{
    return ndm__reduce_result_dtype(op, t);
}

static bool has_identity(ndm__reduce_op op)
{
    return (ndm__reduce_flags[op] & NDM__REDF_IDENTITY) != 0;
}

/* The reduce family of the input's device, or NULL with the error recorded. */
static const struct ndm__backend_reduce *family(const ndm__array *r, const char *api,
                                                ndm__site site)
{
    char name[32];
    const ndm__backend *b = ndm__backend_of(r->storage->device, api, site);
    if (!b)
        return NULL;
    if (!b->reduce) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "no reductions on device %s",
                  ndm_device_str(r->storage->device, name, sizeof name));
        return NULL;
    }
    return b->reduce;
}

/* Per-axis scratch: on the stack for common ranks. */
typedef struct axes_buf {
    int64_t small[6 * 16];
    int64_t *p;
} axes_buf;

static bool axes_get(axes_buf *b, int nd)
{
    b->p = nd <= 16 ? b->small : ndm__malloc(6 * (size_t)nd * sizeof(int64_t), NDM__INJ_SCRATCH);
    return b->p != NULL;
}

static void axes_put(axes_buf *b)
{
    if (b->p != b->small)
        free(b->p);
}

static ndm_array reduce_impl(ndm__site site, const char *api, ndm__reduce_op op, ndm_manager out,
                             ndm_array a, bool keepdim, int naxes, const int *axes, int64_t ddof)
{
    NDM__OP_GUARD();
    ndm__array *r = ndm__input(a, &out, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (naxes < -1) {
        ndm__fail(NDM_E_AXIS, api, site, "%d axes: pass a count >= 0, or NDM_ALL_AXES_LIST",
                  naxes);
        return NDM_NULL_ARRAY;
    }
    if (naxes > 0 && !axes) {
        ndm__fail(NDM_E_INVALID, api, site, "axes is NULL for %d axes", naxes);
        return NDM_NULL_ARRAY;
    }
    if (ddof < 0) {
        ndm__fail(NDM_E_INVALID, api, site, "ddof must be >= 0 (got %" PRId64 ")", ddof);
        return NDM_NULL_ARRAY;
    }
    const struct ndm__backend_reduce *fam = family(r, api, site);
    if (!fam || NDM__DEVICE_DECLINES(r->storage->device, api, site, NDM__OPS_REDUCE, op,
                                     ndm__reduce_names[op], ndm__layout_of(r), 2,
                                     {result_dtype(op, r->dtype), r->dtype}))
        return NDM_NULL_ARRAY;
    int nd = r->ndim;
    axes_buf ab;
    if (!axes_get(&ab, nd)) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a rank-%d reduction", nd);
        return NDM_NULL_ARRAY;
    }
    int64_t *red = ab.p, *oshape = red + nd, *kshape = oshape + nd, *kstr = kshape + nd;
    int64_t *sshape = kstr + nd, *sstr = sshape + nd;
    ndm_array res = NDM_NULL_ARRAY;
    char desc[160];
    for (int i = 0; i < nd; i++)
        red[i] = naxes == -1;
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (ndm__axis(axes[i], nd, false, &ax, api, site) < 0)
            goto done;
        if (red[ax]) {
            ndm__fail(NDM_E_AXIS, api, site, "axis %d is given twice (as %d) for %s", ax,
                      axes[i], ndm__array_desc(r, desc, sizeof desc));
            goto done;
        }
        red[ax] = 1;
    }
    /* The kernel sees the kept axes first, then the reduced ones in order. */
    int ond = 0, nk = 0, nr = 0;
    int64_t K = 1, R = 1;
    for (int i = 0; i < nd; i++) {
        if (red[i]) {
            R *= r->shape[i];
            if (keepdim)
                oshape[ond++] = 1;
            continue;
        }
        K *= r->shape[i];
        oshape[ond++] = r->shape[i];
        kshape[nk] = r->shape[i];
        sshape[nk] = r->shape[i];
        sstr[nk] = r->strides[i];
        nk++;
    }
    for (int i = 0; i < nd; i++)
        if (red[i]) {
            sshape[nk + nr] = r->shape[i];
            sstr[nk + nr] = r->strides[i];
            nr++;
        }
    if (R == 0 && K > 0 && !has_identity(op)) {
        int ax = 0;
        while (ax < nd && !(red[ax] && r->shape[ax] == 0))
            ax++;
        ndm__fail(NDM_E_SHAPE, api, site,
                  "empty reduction of %s (axis %d has size 0): the operation has no identity",
                  ndm__array_desc(r, desc, sizeof desc), ax);
        goto done;
    }
    ndm__array *o;
    res = ndm__array_new_on(site, api, out, r->storage->device, result_dtype(op, r->dtype), ond,
                            oshape, &o);
    if (!res.id)
        goto done;
    for (int i = 0, j = 0, k = 0; i < nd; i++) {
        if (red[i]) {
            j += keepdim;
            continue;
        }
        kstr[k++] = o->strides[j++];
    }
    ndm__tensor dst = {ndm__array_ptr(o), o->dtype, nk, kshape, kstr};
    ndm__tensor src = {ndm__array_ptr(r), r->dtype, nd, sshape, sstr};
    ndm_status st;
    NDM__WITH_OP_CONTEXT(out, api, site,
                         st = fam->reduce(r->storage->device.index, op, &dst, &src, nr, ddof));
    if (st < 0) {
        ndm__fail(st, api, site, "reduction of %s failed: %s",
                  ndm__array_desc(r, desc, sizeof desc), ndm_status_str(st));
        ndm__discard(res);
        res = NDM_NULL_ARRAY;
    } else if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(o->dtype)) {
        /* the list's grad column: prod, var and std record no gradient */
#define NDM__RED_GRAD_(ID, name, form, result, flags, grad, ...) grad,
        static const ndm__ag_op grads[NDM__RED_COUNT] = {NDM__REDUCE_OPS(NDM__RED_GRAD_)};
#undef NDM__RED_GRAD_
        ndm__ag_op rec = grads[op];
        if (rec != NDM__AG_OP_COUNT)
            ndm__ag_record_reduce(rec, res, a, r->ndim, keepdim, naxes, axes);
    }
done:
    axes_put(&ab);
    return res;
}

/* The public reductions: each one line below. */
#define NDM__REDUCTION(name, OP)                                                \
    NDM_API ndm_array ndm_##name##_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, \
                                         bool keepdim, int naxes, const int *axes) \
    {                                                                           \
        return reduce_impl(NDM__SITE, __func__, OP, out, a, keepdim, naxes, axes, 0); \
    }
#define NDM__REDUCTION_DDOF(name, OP)                                           \
    NDM_API ndm_array ndm_##name##_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, \
                                         int ddof, bool keepdim, int naxes, const int *axes) \
    {                                                                           \
        return reduce_impl(NDM__SITE, __func__, OP, out, a, keepdim, naxes, axes, ddof); \
    }

#define NDM__RED_FORM_R(name, OP) NDM__REDUCTION(name, OP)
#define NDM__RED_FORM_DDOF(name, OP) NDM__REDUCTION_DDOF(name, OP)
#define NDM__RED_FORM_ARG(name, OP)
#define NDM__RED_API_(ID, name, form, ...) NDM__RED_FORM_##form(name, NDM__RED_##ID)
NDM__REDUCE_OPS(NDM__RED_API_)
#undef NDM__RED_API_

static ndm_array arg_impl(ndm__site site, const char *api, ndm__reduce_op op, ndm_manager out,
                          ndm_array a, int axis, bool keepdim)
{
    NDM__OP_GUARD();
    if (axis == NDM_ALL_AXES)
        return reduce_impl(site, api, op, out, a, keepdim, -1, NULL, 0);
    return reduce_impl(site, api, op, out, a, keepdim, 1, &axis, 0);
}

NDM_API ndm_array ndm_argmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   bool keepdim)
{
    return arg_impl(NDM__SITE, __func__, NDM__RED_ARGMAX, out, a, axis, keepdim);
}

NDM_API ndm_array ndm_argmin_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   bool keepdim)
{
    return arg_impl(NDM__SITE, __func__, NDM__RED_ARGMIN, out, a, axis, keepdim);
}

static ndm_array softmax_impl(ndm__site site, const char *api, ndm_manager out, ndm_array a,
                              int axis, bool lg)
{
    NDM__OP_GUARD();
    ndm__array *r = ndm__input(a, &out, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int ax = 0;
    /* A 0-d array is a single slice along axis 0 (or -1), as PyTorch has it. */
    if (r->ndim == 0 ? (axis != 0 && axis != -1)
                     : ndm__axis(axis, r->ndim, false, &ax, api, site) < 0) {
        if (r->ndim == 0)
            ndm__fail(NDM_E_AXIS, api, site, "axis %d is out of range for rank 0", axis);
        return NDM_NULL_ARRAY;
    }
    const struct ndm__backend_reduce *fam = family(r, api, site);
    ndm_dtype rdt = ndm_dtype_is_float(r->dtype) ? r->dtype : NDM_F32;
    if (!fam || NDM__DEVICE_DECLINES(r->storage->device, api, site, NDM__OPS_REDUCE, 0,
                                     lg ? "log_softmax" : "softmax", ndm__layout_of(r), 2,
                                     {rdt, r->dtype}))
        return NDM_NULL_ARRAY;
    ndm__array *o;
    ndm_array res = ndm__array_new_on(site, api, out, r->storage->device, rdt, r->ndim, r->shape,
                                      &o);
    if (!res.id)
        return res;
    int64_t one = 1, zero = 0;
    ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r);
    if (r->ndim == 0) {
        dst = (ndm__tensor){ndm__array_ptr(o), o->dtype, 1, &one, &zero};
        src = (ndm__tensor){ndm__array_ptr(r), r->dtype, 1, &one, &zero};
    }
    ndm_status st;
    NDM__WITH_OP_CONTEXT(out, api, site,
                         st = fam->softmax(r->storage->device.index, &dst, &src, ax, lg));
    if (st < 0) {
        char desc[160];
        ndm__fail(st, api, site, "softmax of %s failed: %s", ndm__array_desc(r, desc, sizeof desc),
                  ndm_status_str(st));
        ndm__discard(res);
        return NDM_NULL_ARRAY;
    }
    ndm__ag_params agp = {.i = {ax}};
    NDM__AG_RECORD(lg ? NDM__AG_LOG_SOFTMAX : NDM__AG_SOFTMAX, res, 1, &a, &agp);
    return res;
}

NDM_API ndm_array ndm_softmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    return softmax_impl(NDM__SITE, __func__, out, a, axis, false);
}

NDM_API ndm_array ndm_log_softmax_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    return softmax_impl(NDM__SITE, __func__, out, a, axis, true);
}
