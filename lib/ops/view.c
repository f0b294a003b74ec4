/* Views: new handles on the storage of their input (alias, reshape, permute,
 * slice, select, squeeze, unsqueeze, expand) and the copying helpers
 * contiguous and copy. Every result follows the output rule. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "dispatch.h"

/* Scratch for shapes and strides: on the stack for common ranks. */
typedef struct dims {
    int64_t small[2 * 16];
    int64_t *shape, *strides;
} dims;

static bool dims_get(dims *d, int ndim)
{
    if (ndim <= 16) {
        d->shape = d->small;
    } else {
        d->shape = ndm__malloc(2 * (size_t)ndim * sizeof(int64_t), NDM__INJ_SCRATCH);
        if (!d->shape)
            return false;
    }
    d->strides = d->shape + (ndim <= 16 ? 16 : ndim);
    return true;
}

/* dims_get that reports a failure. */
static bool dims_new(dims *d, int ndim, const char *api, ndm__site site)
{
    if (dims_get(d, ndim))
        return true;
    ndm__fail(NDM_E_OOM, api, site, "no memory for a rank-%d shape", ndim);
    return false;
}

static void dims_put(dims *d)
{
    if (d->shape != d->small)
        free(d->shape);
}

/* r's axes but axis `drop` (all its size-1 axes when drop < 0) into d;
 * returns how many. */
static int kept_axes(const ndm__array *r, int drop, dims *d)
{
    int k = 0;
    for (int j = 0; j < r->ndim; j++) {
        if (drop >= 0 ? j == drop : r->shape[j] == 1)
            continue;
        d->shape[k] = r->shape[j];
        d->strides[k] = r->strides[j];
        k++;
    }
    return k;
}

/* The input record of `a` and its axis `axis` in *ax (one past the last
 * allowed when `end`), or NULL with the failure recorded. */
static ndm__array *input_axis(ndm_array a, ndm_manager *out, int axis, bool end, int *ax,
                              const char *api, ndm__site site)
{
    ndm__array *r = ndm__input(a, out, api, site);
    if (!r || ndm__axis(axis, r->ndim, end, ax, api, site) < 0)
        return NULL;
    return r;
}

/* A view of r at `offset` with its axes but `drop` (kept_axes' rule). */
static ndm_array kept_view(ndm__site site, const char *api, ndm_manager out, ndm__array *r,
                           int drop, int64_t offset)
{
    dims d;
    if (!dims_new(&d, r->ndim, api, site))
        return NDM_NULL_ARRAY;
    int k = kept_axes(r, drop, &d);
    ndm_array res = ndm__array_view(site, api, out, r, r->dtype, k, d.shape, d.strides, offset,
                                    NULL);
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_alias_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    ndm_array res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim, r->shape,
                                    r->strides, r->offset, NULL);
    NDM__AG_RECORD(NDM__AG_IDENTITY, res, 1, &a, NULL);
    return res;
}

/* A C-ordered copy of r with the given shape (same element count). */
static ndm_array copy_as(ndm__site site, const char *api, ndm_manager out, ndm__array *r,
                         int ndim, const int64_t *shape)
{
    NDM__OP_GUARD();
    ndm__array *c;
    ndm_array h = ndm__array_new_on(site, api, out, r->storage->device, r->dtype, ndim, shape, &c);
    if (!h.id)
        return h;
    /* Write c's memory as if it had r's shape in C order. */
    dims d;
    if (!dims_get(&d, r->ndim)) {
        ndm__discard(h);
        ndm__fail(NDM_E_OOM, api, site, "no memory for strides");
        return NDM_NULL_ARRAY;
    }
    ndm__contiguous_strides(r->ndim, r->shape, d.strides);
    ndm__tensor dst = {c->storage->data, r->dtype, r->ndim, r->shape, d.strides};
    ndm__tensor src = ndm__tensor_of(r);
    const ndm__backend *b = ndm__backend_of(r->storage->device, api, site);
    ndm_status st = b ? b->copy(r->storage->device.index, &dst, &src) : NDM_E_UNSUPPORTED;
    dims_put(&d);
    if (st < 0) {
        if (b)
            ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st));
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    return h;
}

/* numpy's no-copy reshape: the new strides when the old ones allow a view,
 * false otherwise. */
static bool reshape_strides(const ndm__array *r, int nd, const int64_t *ns, int64_t *nst)
{
    int64_t od[64], ost[64];
    int on = 0;
    if (ndm__numel(r->ndim, r->shape) == 0 || ndm__numel(nd, ns) <= 1) {
        ndm__contiguous_strides(nd, ns, nst);
        return true;
    }
    for (int i = 0; i < r->ndim; i++) {
        if (r->shape[i] == 1)
            continue;
        if (on == 64)
            return false; /* deep ranks take the copy path */
        od[on] = r->shape[i];
        ost[on] = r->strides[i];
        on++;
    }
    int ni = 0, oi = 0, nj = 1, oj = 1;
    while (ni < nd && oi < on) {
        int64_t np = ns[ni], op = od[oi];
        while (np != op) {
            if (np < op) {
                if (nj >= nd)
                    return false;
                np *= ns[nj++];
            } else {
                if (oj >= on)
                    return false;
                op *= od[oj++];
            }
        }
        for (int ok = oi; ok < oj - 1; ok++)
            if (ost[ok] != od[ok + 1] * ost[ok + 1])
                return false;
        nst[nj - 1] = ost[oj - 1];
        for (int nk = nj - 1; nk > ni; nk--)
            nst[nk - 1] = nst[nk] * ns[nk];
        ni = nj++;
        oi = oj++;
    }
    int64_t last = ni > 0 ? nst[ni - 1] : 1;
    for (int nk = ni; nk < nd; nk++)
        nst[nk] = last;
    return true;
}

NDM_API ndm_array ndm_reshape_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ndim,
                                    const int64_t *shape)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (ndim < 0 || (ndim > 0 && !shape)) {
        ndm__fail(NDM_E_SHAPE, __func__, site, "invalid target shape (rank %d)", ndim);
        return NDM_NULL_ARRAY;
    }
    dims d;
    if (!dims_new(&d, ndim, __func__, site))
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    int infer = -1;
    int64_t known = 1, total = ndm__numel(r->ndim, r->shape);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) {
                ndm__fail(NDM_E_SHAPE, __func__, site, "more than one -1 in the target shape");
                goto done;
            }
            infer = i;
        } else if (shape[i] < 0) {
            ndm__fail(NDM_E_SHAPE, __func__, site, "negative size %" PRId64 " on axis %d",
                      shape[i], i);
            goto done;
        } else if (ndm__ckd_mul_i64(&known, known, shape[i])) {
            ndm__fail(NDM_E_OVERFLOW, __func__, site, "the target shape overflows");
            goto done;
        }
        d.shape[i] = shape[i];
    }
    if (infer >= 0) {
        if (known == 0 || total % known != 0) {
            ndm__fail(NDM_E_SHAPE, __func__, site,
                      "cannot infer axis %d: %" PRId64 " elements into blocks of %" PRId64, infer,
                      total, known);
            goto done;
        }
        d.shape[infer] = total / known;
        known = total;
    }
    if (known != total) {
        char desc[160];
        ndm__fail(NDM_E_SHAPE, __func__, site,
                  "cannot reshape %s (%" PRId64 " elements) into %" PRId64 " elements",
                  ndm__array_desc(r, desc, sizeof desc), total, known);
        goto done;
    }
    /* An empty array takes any shape with no elements: its strides must
     * still fit. */
    if (ndm__shape_check(ndim, d.shape, r->dtype, NULL, NULL, __func__, site) < 0)
        goto done;
    if (reshape_strides(r, ndim, d.shape, d.strides))
        res = ndm__array_view(site, __func__, out, r, r->dtype, ndim, d.shape, d.strides,
                              r->offset, NULL);
    else
        res = copy_as(site, __func__, out, r, ndim, d.shape);
    NDM__AG_RECORD(NDM__AG_RESHAPE, res, 1, &a, NULL);
done:
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_permute_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                    const int *axes)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int nd = r->ndim;
    if (!(n == 0 && !axes) && (n != nd || !axes)) {
        ndm__fail(NDM_E_AXIS, __func__, site, "%d axes given for an array of rank %d", n, nd);
        return NDM_NULL_ARRAY;
    }
    dims d;
    if (!dims_new(&d, nd, __func__, site))
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    ndm__ag_params agp;
    agp.naxes = nd <= NDM__AG_MAX_AXES ? nd : -1;
    unsigned char seen_small[64] = {0};
    unsigned char *seen = nd <= 64 ? seen_small : ndm__calloc((size_t)nd, 1, NDM__INJ_SCRATCH);
    if (!seen) {
        ndm__fail(NDM_E_OOM, __func__, site, "no memory");
        goto done;
    }
    for (int i = 0; i < nd; i++) {
        int ax = nd - 1 - i;
        if (axes && ndm__axis(axes[i], nd, false, &ax, __func__, site) < 0)
            goto done;
        if (seen[ax]) {
            ndm__fail(NDM_E_AXIS, __func__, site, "axis %d repeated in the permutation", ax);
            goto done;
        }
        seen[ax] = 1;
        if (i < NDM__AG_MAX_AXES)
            agp.axes[i] = ax;
        d.shape[i] = r->shape[ax];
        d.strides[i] = r->strides[ax];
    }
    res = ndm__array_view(site, __func__, out, r, r->dtype, nd, d.shape, d.strides, r->offset,
                          NULL);
    if (agp.naxes >= 0)
        NDM__AG_RECORD(NDM__AG_PERMUTE, res, 1, &a, &agp);
done:
    if (seen && seen != seen_small)
        free(seen);
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_swapaxes_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis1,
                                     int axis2)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int x, y;
    if (ndm__axis(axis1, r->ndim, false, &x, __func__, site) < 0 ||
        ndm__axis(axis2, r->ndim, false, &y, __func__, site) < 0)
        return NDM_NULL_ARRAY;
    dims d;
    if (!dims_new(&d, r->ndim, __func__, site))
        return NDM_NULL_ARRAY;
    ndm__ag_params agp;
    agp.naxes = r->ndim <= NDM__AG_MAX_AXES ? r->ndim : -1;
    for (int i = 0; i < r->ndim; i++) {
        int src = i == x ? y : i == y ? x : i;
        if (i < NDM__AG_MAX_AXES)
            agp.axes[i] = src;
        d.shape[i] = r->shape[src];
        d.strides[i] = r->strides[src];
    }
    ndm_array res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim, d.shape, d.strides,
                                    r->offset, NULL);
    if (agp.naxes >= 0)
        NDM__AG_RECORD(NDM__AG_PERMUTE, res, 1, &a, &agp);
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_slice_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                  int64_t start, int64_t stop, int64_t step)
{
    ndm__site site = NDM__SITE;
    int ax;
    ndm__array *r = input_axis(a, &out, axis, false, &ax, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (step == 0 || step == INT64_MIN) {
        /* -INT64_MIN does not exist: the step's magnitude must fit int64 */
        ndm__fail(NDM_E_INVALID, __func__, site,
                  step ? "slice step INT64_MIN is out of range (its negation overflows)"
                       : "slice step must be non-zero");
        return NDM_NULL_ARRAY;
    }
    /* Python's slice.indices(): clamp into range, with open bounds per sign. */
    int64_t n = r->shape[ax];
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
    if (start == NDM_END)
        start = step > 0 ? lo : hi;
    else if (start < 0)
        start = start + n < lo ? lo : start + n;
    else
        start = start > hi ? hi : start;
    if (stop == NDM_END)
        stop = step > 0 ? hi : lo;
    else if (stop < 0)
        stop = stop + n < lo ? lo : stop + n;
    else
        stop = stop > hi ? hi : stop;
    /* start and stop lie in [-1, n], so their distance fits; the count is
     * 1 + (distance - 1) / |step|, which cannot overflow as the rounded-up
     * sum would with a huge step. */
    int64_t len = 0;
    if (step > 0 && stop > start)
        len = 1 + (stop - start - 1) / step;
    else if (step < 0 && stop < start)
        len = 1 + (start - stop - 1) / -step;
    /* With one element or none the stride of the axis is never applied:
     * keep the input's rather than a product that may overflow. */
    int64_t stride = r->strides[ax], offset = r->offset;
    if (len > 1 && ndm__ckd_mul_i64(&stride, r->strides[ax], step)) {
        ndm__fail(NDM_E_OVERFLOW, __func__, site, "the stride of axis %d times %" PRId64
                  " overflows", ax, step);
        return NDM_NULL_ARRAY;
    }
    if (len && ndm__ckd_offset(&offset, r->offset, start, r->strides[ax])) {
        ndm__fail(NDM_E_OVERFLOW, __func__, site, "the offset of index %" PRId64
                  " on axis %d overflows", start, ax);
        return NDM_NULL_ARRAY;
    }
    dims d;
    if (!dims_new(&d, r->ndim, __func__, site))
        return NDM_NULL_ARRAY;
    memcpy(d.shape, r->shape, (size_t)r->ndim * sizeof(int64_t));
    memcpy(d.strides, r->strides, (size_t)r->ndim * sizeof(int64_t));
    d.shape[ax] = len;
    d.strides[ax] = stride;
    ndm_array res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim, d.shape, d.strides,
                                    offset, NULL);
    if (NDM__UNLIKELY(ndm__ag_on()) && res.id) {
        /* the clamped bounds: backward slices a zero array of the input's shape the same way */
        ndm__ag_params agp = {.i = {ax, start, len ? start + (len - 1) * step + (step > 0 ? 1 : -1) : start, step}};
        if (step < 0 && len && agp.i[2] < 0)
            agp.i[2] = NDM_END;
        ndm__ag_record(NDM__AG_SLICE, res, 1, &a, &agp);
    }
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   int64_t index)
{
    ndm__site site = NDM__SITE;
    int ax;
    ndm__array *r = input_axis(a, &out, axis, false, &ax, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int64_t n = r->shape[ax];
    int64_t i = index < 0 ? index + n : index;
    if (i < 0 || i >= n) {
        ndm__fail(NDM_E_INVALID, __func__, site,
                  "index %" PRId64 " is out of range for axis %d of size %" PRId64, index, axis, n);
        return NDM_NULL_ARRAY;
    }
    int64_t offset;
    if (ndm__ckd_offset(&offset, r->offset, i, r->strides[ax])) {
        ndm__fail(NDM_E_OVERFLOW, __func__, site, "the offset of index %" PRId64
                  " on axis %d overflows", i, ax);
        return NDM_NULL_ARRAY;
    }
    ndm_array res = kept_view(site, __func__, out, r, ax, offset);
    ndm__ag_params agp = {.i = {ax, i}};
    NDM__AG_RECORD(NDM__AG_SELECT, res, 1, &a, &agp);
    return res;
}

NDM_API ndm_array ndm_squeeze_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int ax = -1;
    if (axis != NDM_ALL_AXES) {
        if (ndm__axis(axis, r->ndim, false, &ax, __func__, site) < 0)
            return NDM_NULL_ARRAY;
        if (r->shape[ax] != 1) {
            ndm__fail(NDM_E_SHAPE, __func__, site,
                      "cannot squeeze axis %d of size %" PRId64 " (it must be 1)", axis,
                      r->shape[ax]);
            return NDM_NULL_ARRAY;
        }
    }
    ndm_array res = kept_view(site, __func__, out, r, ax, r->offset);
    NDM__AG_RECORD(NDM__AG_RESHAPE, res, 1, &a, NULL);
    return res;
}

NDM_API ndm_array ndm_unsqueeze_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    ndm__site site = NDM__SITE;
    int ax;
    ndm__array *r = input_axis(a, &out, axis, true, &ax, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    dims d;
    if (!dims_new(&d, r->ndim + 1, __func__, site))
        return NDM_NULL_ARRAY;
    for (int j = 0, k = 0; j <= r->ndim; j++) {
        if (j == ax) {
            d.shape[j] = 1;
            /* Any stride works for a size-1 axis; keep the view contiguous-looking
             * where the product fits. */
            if (k >= r->ndim || ndm__ckd_mul_i64(&d.strides[j], r->strides[k], r->shape[k]))
                d.strides[j] = 1;
            continue;
        }
        d.shape[j] = r->shape[k];
        d.strides[j] = r->strides[k];
        k++;
    }
    ndm_array res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim + 1, d.shape,
                                    d.strides, r->offset, NULL);
    NDM__AG_RECORD(NDM__AG_RESHAPE, res, 1, &a, NULL);
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_expand_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int ndim,
                                   const int64_t *shape)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (ndim < r->ndim || (ndim > 0 && !shape)) {
        ndm__fail(NDM_E_SHAPE, __func__, site,
                  "cannot expand rank %d to rank %d (the rank cannot shrink)", r->ndim, ndim);
        return NDM_NULL_ARRAY;
    }
    dims d;
    if (!dims_new(&d, ndim, __func__, site))
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    int lead = ndim - r->ndim;
    for (int j = 0; j < ndim; j++) {
        int64_t want = shape[j];
        if (j < lead) {
            if (want < 0) {
                ndm__fail(NDM_E_SHAPE, __func__, site, "size %" PRId64 " on new axis %d", want, j);
                goto done;
            }
            d.shape[j] = want;
            d.strides[j] = 0;
            continue;
        }
        int64_t have = r->shape[j - lead];
        if (want == -1 || want == have) {
            d.shape[j] = have;
            d.strides[j] = r->strides[j - lead];
        } else if (have == 1 && want >= 0) {
            d.shape[j] = want;
            d.strides[j] = 0;
        } else {
            char desc[160];
            ndm__fail(NDM_E_SHAPE, __func__, site,
                      "cannot expand %s: axis %d has size %" PRId64 ", not 1 or %" PRId64,
                      ndm__array_desc(r, desc, sizeof desc), j - lead, have, want);
            goto done;
        }
    }
    if (ndm__shape_check(ndim, d.shape, r->dtype, NULL, NULL, __func__, site) < 0)
        goto done;
    res = ndm__array_view(site, __func__, out, r, r->dtype, ndim, d.shape, d.strides, r->offset,
                          NULL);
    NDM__AG_RECORD(NDM__AG_EXPAND, res, 1, &a, NULL);
done:
    dims_put(&d);
    return res;
}

NDM_API ndm_array ndm_contiguous_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    ndm_array res;
    if (ndm__is_contiguous(r->ndim, r->shape, r->strides))
        res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim, r->shape, r->strides,
                              r->offset, NULL);
    else
        res = copy_as(site, __func__, out, r, r->ndim, r->shape);
    NDM__AG_RECORD(NDM__AG_IDENTITY, res, 1, &a, NULL);
    return res;
}

NDM_API ndm_array ndm_copy_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    ndm_array res = copy_as(site, __func__, out, r, r->ndim, r->shape);
    NDM__AG_RECORD(NDM__AG_IDENTITY, res, 1, &a, NULL);
    return res;
}
