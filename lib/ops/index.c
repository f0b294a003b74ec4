/* Shape operations: concat, stack, split, flip, tile, pad, cumsum, cumprod,
 * tril, triu and tri. Each checks everything, applies the output rule, then
 * calls the index family. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "index_ops.h"
#include "supports.h"

/* ---- shared helpers (index_ops.h) ---------------------------------------- */

int64_t *ndm__scratch_get(ndm__scratch *s, size_t n, const char *api, ndm__site site)
{
    s->p = n <= sizeof s->small / sizeof s->small[0]
               ? s->small
               : ndm__malloc(n * sizeof(int64_t), NDM__INJ_SCRATCH);
    if (!s->p)
        ndm__fail(NDM_E_OOM, api, site, "no memory for %zu sizes", n);
    return s->p;
}

void ndm__scratch_put(ndm__scratch *s)
{
    if (s->p && s->p != s->small)
        free(s->p);
    s->p = NULL;
}

const struct ndm__backend_index *ndm__index_family(ndm_device dev, const char *api,
                                                   ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b)
        return NULL;
    if (!b->index)
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "the %s backend has no index kernels", b->name);
    return b->index;
}

/* The index kernels of dev and the result (dtype, nd, shape) on it: the
 * result, or NDM_NULL_ARRAY with the failure recorded. */
static ndm_array index_result(ndm__site site, const char *api, ndm_manager out, ndm_device dev,
                              ndm_dtype dtype, int nd, const int64_t *shape,
                              const struct ndm__backend_index **f, ndm__array **o)
{
    *f = ndm__index_family(dev, api, site);
    if (!*f)
        return NDM_NULL_ARRAY;
    return ndm__array_new_on(site, api, out, dev, dtype, nd, shape, o);
}

/* index_result of r's dtype on r's device, once the device has said it runs
 * `op` from r's dtype to the same. */
static ndm_array index_result_like(ndm__site site, const char *api, ndm_manager out,
                                   const ndm__array *r, const char *op, int nd,
                                   const int64_t *shape, const struct ndm__backend_index **f,
                                   ndm__array **o)
{
    ndm_device dev = r->storage->device;
    if (NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, op, ndm__layout_of(r), 2,
                             {r->dtype, r->dtype}))
        return NDM_NULL_ARRAY;
    return index_result(site, api, out, dev, r->dtype, nd, shape, f, o);
}

bool ndm__same_device(const ndm__array *a, const ndm__array *b, const char *api, ndm__site site)
{
    ndm_device x = a->storage->device, y = b->storage->device;
    if (x.type == y.type && x.index == y.index)
        return true;
    char d1[160], d2[160], n1[32], n2[32];
    ndm__fail(NDM_E_DEVICE, api, site, "%s is on %s but %s is on %s",
              ndm__array_desc(a, d1, sizeof d1), ndm_device_str(x, n1, sizeof n1),
              ndm__array_desc(b, d2, sizeof d2), ndm_device_str(y, n2, sizeof n2));
    return false;
}

ndm_array ndm__kernel_failed(ndm_status st, ndm_array res, const char *what, const char *api,
                             ndm__site site)
{
    ndm__fail(st, api, site, "%s failed: %s", what, ndm_status_str(st));
    ndm__discard(res);
    return NDM_NULL_ARRAY;
}

/* ---- concat and stack ------------------------------------------------------ */

/* Look up n inputs (null propagates) and resolve the output manager. */
static ndm__array **inputs(int n, const ndm_array *arrays, ndm__array **small, int nsmall,
                           ndm_manager *out, const char *api, ndm__site site)
{
    if (n < 1 || !arrays) {
        ndm__fail(NDM_E_INVALID, api, site, "needs at least one array (got %d%s)", n,
                  arrays ? "" : ", NULL list");
        return NULL;
    }
    ndm__array **r = n <= nsmall ? small : ndm__malloc((size_t)n * sizeof *r, NDM__INJ_SCRATCH);
    if (!r) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for %d inputs", n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        r[i] = ndm__array_get_prop(arrays[i], api, site);
        if (!r[i])
            goto fail;
    }
    *out = ndm__output_manager(*out, r[0], api, site);
    if (out->id)
        return r;
fail:
    if (r != small)
        free(r);
    return NULL;
}

/* Inputs agree on device and rank; sizes match except on `skip` (-1: none).
 * Returns the promoted dtype through *dtype. */
static bool agree(int n, ndm__array *const *r, int skip, ndm_dtype *dtype, const char *what,
                  const char *api, ndm__site site)
{
    ndm_dtype t = r[0]->dtype;
    for (int i = 1; i < n; i++) {
        if (!ndm__same_device(r[0], r[i], api, site))
            return false;
        char d1[160], d2[160];
        if (r[i]->ndim != r[0]->ndim) {
            ndm__fail(NDM_E_SHAPE, api, site, "cannot %s %s and %s (input %d): ranks differ",
                      what, ndm__array_desc(r[0], d1, sizeof d1),
                      ndm__array_desc(r[i], d2, sizeof d2), i);
            return false;
        }
        for (int d = 0; d < r[0]->ndim; d++)
            if (d != skip && r[i]->shape[d] != r[0]->shape[d]) {
                ndm__fail(NDM_E_SHAPE, api, site,
                          "cannot %s %s and %s (input %d): sizes differ on axis %d", what,
                          ndm__array_desc(r[0], d1, sizeof d1),
                          ndm__array_desc(r[i], d2, sizeof d2), i, d);
                return false;
            }
        t = ndm_result_type(t, r[i]->dtype);
    }
    *dtype = t;
    return true;
}

/* Copy each input, in order, into its part of `res` along axis `ax`: with
 * `drop` the inputs lack that axis and take one index of it each (stack),
 * otherwise they take as many as their own size along it (concat). */
static ndm_status place(const struct ndm__backend_index *f, int n, ndm__array *const *r,
                        ndm__array *res, int ax, bool drop, int64_t *strides)
{
    int nd = r[0]->ndim;
    /* Nothing to copy, and no offsets to step through an empty result. */
    if (ndm__numel(res->ndim, res->shape) == 0)
        return NDM_OK;
    for (int d = 0, k = 0; d < res->ndim; d++)
        if (!(drop && d == ax))
            strides[k++] = res->strides[d];
    int64_t es = (int64_t)ndm_dtype_size(res->dtype);
    char *p = ndm__array_ptr(res);
    for (int i = 0; i < n; i++) {
        ndm__tensor dst = {p, res->dtype, nd, r[i]->shape, strides};
        ndm__tensor src = ndm__tensor_of(r[i]);
        ndm_status st = f->copy(res->storage->device.index, &dst, &src);
        if (st < 0)
            return st;
        p += (drop ? 1 : r[i]->shape[ax]) * res->strides[ax] * es;
    }
    return NDM_OK;
}

static ndm_array join(ndm__site site, const char *api, ndm_manager out, int axis, int n,
                      const ndm_array *arrays, bool stack)
{
    ndm__array *small[8];
    ndm__array **r = inputs(n, arrays, small, 8, &out, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    ndm__scratch sc = {0};
    int nd = r[0]->ndim, ax;
    ndm_dtype dtype;
    if (ndm__axis(axis, nd, stack, &ax, api, site) < 0 ||
        !agree(n, r, stack ? -1 : ax, &dtype, stack ? "stack" : "concatenate", api, site))
        goto done;
    int rnd = stack ? nd + 1 : nd;
    int64_t *shape = ndm__scratch_get(&sc, 2 * (size_t)rnd, api, site);
    if (!shape)
        goto done;
    for (int d = 0, k = 0; d < rnd; d++)
        shape[d] = stack && d == ax ? n : r[0]->shape[k++];
    if (!stack) {
        int64_t total = 0;
        for (int i = 0; i < n; i++)
            if (ndm__ckd_add_i64(&total, total, r[i]->shape[ax])) {
                ndm__fail(NDM_E_OVERFLOW, api, site, "the joined axis overflows");
                goto done;
            }
        shape[ax] = total;
    }
    ndm_device dev = r[0]->storage->device;
    const struct ndm__backend_index *f;
    if (NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, "copy", 0, 1, {dtype}))
        goto done;
    ndm__array *o;
    res = index_result(site, api, out, dev, dtype, rnd, shape, &f, &o);
    if (!res.id)
        goto done;
    ndm_status st = place(f, n, r, o, ax, stack, shape + rnd);
    if (st < 0) {
        res = ndm__kernel_failed(st, res, "copy", api, site);
    } else if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(dtype)) {
        ndm__ag_params agp = {.i = {ax}};
        ndm__ag_record(stack ? NDM__AG_STACK : NDM__AG_CONCAT, res, n, arrays, &agp);
    }
done:
    ndm__scratch_put(&sc);
    if (r != small)
        free(r);
    return res;
}

NDM_API ndm_array ndm_concat_to_at(NDM_SITE_PARAMS, ndm_manager out, int axis, int n,
                                   const ndm_array *arrays)
{
    NDM__OP_GUARD();
    return join(NDM__SITE, __func__, out, axis, n, arrays, false);
}

NDM_API ndm_array ndm_stack_to_at(NDM_SITE_PARAMS, ndm_manager out, int axis, int n,
                                  const ndm_array *arrays)
{
    NDM__OP_GUARD();
    return join(NDM__SITE, __func__, out, axis, n, arrays, true);
}

/* ---- split ------------------------------------------------------------------- */

/* Views of r along ax between consecutive cut points (count + 1 of them,
 * from 0 to the axis size) into outs; all or nothing. */
static ndm_status cut(ndm__site site, const char *api, ndm_manager out, ndm__array *r, int ax,
                      int64_t count, const int64_t *cuts, ndm_array *outs)
{
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, (size_t)r->ndim, api, site);
    if (!shape)
        return NDM_E_OOM;
    memcpy(shape, r->shape, (size_t)r->ndim * sizeof *shape);
    ndm_status st = NDM_OK;
    for (int64_t i = 0; i < count; i++) {
        shape[ax] = cuts[i + 1] - cuts[i];
        int64_t offset = r->offset;
        if (shape[ax] && ndm__ckd_offset(&offset, r->offset, cuts[i], r->strides[ax])) {
            outs[i] = NDM_NULL_ARRAY;
            ndm__fail(NDM_E_OVERFLOW, api, site, "the offset of index %" PRId64
                      " on axis %d overflows", cuts[i], ax);
        } else {
            outs[i] = ndm__array_view(site, api, out, r, r->dtype, r->ndim, shape, r->strides,
                                      offset, NULL);
        }
        if (!outs[i].id) {
            st = ndm_last_status();
            for (int64_t j = 0; j < i; j++) {
                ndm__discard(outs[j]);
                outs[j] = NDM_NULL_ARRAY;
            }
            break;
        }
    }
    ndm__scratch_put(&sc);
    return st;
}

/* Common start of the splits: null outs (when their count is valid), the
 * input (a null one keeps the first error), the manager, the axis. */
static ndm__array *split_input(ndm_array a, int axis, ndm_manager *out, int *ax, ndm_array *outs,
                               int64_t nouts, const char *api, ndm__site site)
{
    for (int64_t i = 0; outs && i < nouts; i++)
        outs[i] = NDM_NULL_ARRAY;
    ndm__array *r = ndm__array_get_prop(a, api, site);
    if (!r)
        return NULL;
    if (!outs) {
        ndm__fail(NDM_E_INVALID, api, site, "outs is NULL");
        return NULL;
    }
    *out = ndm__output_manager(*out, r, api, site);
    if (!out->id || ndm__axis(axis, r->ndim, false, ax, api, site) < 0)
        return NULL;
    return r;
}

NDM_API ndm_status ndm_split_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   int64_t sections, ndm_array *outs)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    int ax;
    ndm__array *r = split_input(a, axis, &out, &ax, outs, sections, __func__, site);
    if (!r)
        return ndm_last_status();
    if (sections < 1)
        return ndm__fail(NDM_E_INVALID, __func__, site, "sections must be >= 1 (got %" PRId64 ")",
                         sections);
    int64_t n = r->shape[ax];
    if (n % sections) {
        char desc[160];
        return ndm__fail(NDM_E_SHAPE, __func__, site,
                         "axis %d of %s (size %" PRId64 ") does not split into %" PRId64
                         " equal parts",
                         axis, ndm__array_desc(r, desc, sizeof desc), n, sections);
    }
    ndm__scratch sc = {0};
    int64_t *cuts = ndm__scratch_get(&sc, (size_t)sections + 1, __func__, site);
    if (!cuts)
        return NDM_E_OOM;
    for (int64_t i = 0; i <= sections; i++)
        cuts[i] = i * (n / sections);
    ndm_status st = cut(site, __func__, out, r, ax, sections, cuts, outs);
    ndm__scratch_put(&sc);
    return st;
}

NDM_API ndm_status ndm_split_indices_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                           int axis, ndm_array *outs, int n,
                                           const int64_t *indices)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    int ax;
    ndm__array *r = split_input(a, axis, &out, &ax, outs, n < 0 ? 0 : (int64_t)n + 1, __func__,
                                site);
    if (!r)
        return ndm_last_status();
    if (n < 0 || (n > 0 && !indices))
        return ndm__fail(NDM_E_INVALID, __func__, site, "invalid index list (%d entries%s)", n,
                         indices ? "" : ", NULL");
    ndm__scratch sc = {0};
    int64_t *cuts = ndm__scratch_get(&sc, (size_t)n + 2, __func__, site);
    if (!cuts)
        return NDM_E_OOM;
    int64_t size = r->shape[ax];
    cuts[0] = 0;
    cuts[n + 1] = size;
    ndm_status st = NDM_OK;
    for (int i = 0; i < n; i++) {
        int64_t v = indices[i] < 0 ? indices[i] + size : indices[i];
        if (v < cuts[i] || v > size) {
            st = ndm__fail(NDM_E_INVALID, __func__, site,
                           "split index %" PRId64 " (entry %d) is %s for axis %d of size %" PRId64,
                           indices[i], i,
                           v < 0 || v > size ? "out of range" : "below the previous one", axis,
                           size);
            break;
        }
        cuts[i + 1] = v;
    }
    if (st == NDM_OK)
        st = cut(site, __func__, out, r, ax, (int64_t)n + 1, cuts, outs);
    ndm__scratch_put(&sc);
    return st;
}

/* ---- flip ---------------------------------------------------------------------- */

NDM_API ndm_array ndm_flip_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    int ax = -1;
    if (!r || (axis != NDM_ALL_AXES && ndm__axis(axis, r->ndim, false, &ax, __func__, site) < 0))
        return NDM_NULL_ARRAY;
    ndm__scratch sc = {0};
    int64_t *strides = ndm__scratch_get(&sc, (size_t)r->ndim, __func__, site);
    if (!strides)
        return NDM_NULL_ARRAY;
    int64_t offset = r->offset;
    for (int d = 0; d < r->ndim; d++) {
        strides[d] = r->strides[d];
        if ((ax < 0 || d == ax) && r->shape[d] > 0) {
            if (ndm__ckd_offset(&offset, offset, r->shape[d] - 1, r->strides[d])) {
                ndm__fail(NDM_E_OVERFLOW, __func__, site, "the offset of the last index on axis %d"
                          " overflows", d);
                ndm__scratch_put(&sc);
                return NDM_NULL_ARRAY;
            }
            strides[d] = -r->strides[d];
        }
    }
    ndm_array res = ndm__array_view(site, __func__, out, r, r->dtype, r->ndim, r->shape, strides,
                                    offset, NULL);
    ndm__ag_params agp = {.i = {axis}};
    NDM__AG_RECORD(NDM__AG_FLIP, res, 1, &a, &agp);
    ndm__scratch_put(&sc);
    return res;
}

/* ---- tile ---------------------------------------------------------------------- */

/* Checks a list of n sizes: n >= 0, entries >= 0. */
static bool size_list(int n, const int64_t *v, const char *what, const char *api, ndm__site site)
{
    if (n < 0 || (n > 0 && !v)) {
        ndm__fail(NDM_E_INVALID, api, site, "invalid %s list (%d entries%s)", what, n,
                  v ? "" : ", NULL");
        return false;
    }
    for (int i = 0; i < n; i++)
        if (v[i] < 0) {
            ndm__fail(NDM_E_INVALID, api, site, "%s %" PRId64 " (entry %d) is negative", what,
                      v[i], i);
            return false;
        }
    return true;
}

NDM_API ndm_array ndm_tile_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                 const int64_t *reps)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r || !size_list(n, reps, "repetition", __func__, site))
        return NDM_NULL_ARRAY;
    int nd = n > r->ndim ? n : r->ndim;
    ndm__scratch sc = {0};
    /* shape[nd], then the rank-2*nd copy: dst shape, dst strides, src strides */
    int64_t *shape = ndm__scratch_get(&sc, 7 * (size_t)nd, __func__, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    int64_t *pair = shape + nd, *dstr = pair + 2 * nd, *sstr = dstr + 2 * nd;
    ndm_array res = NDM_NULL_ARRAY;
    for (int d = 0; d < nd; d++) {
        int rd = d - (nd - r->ndim), pd = d - (nd - n);
        int64_t s = rd >= 0 ? r->shape[rd] : 1, k = pd >= 0 ? reps[pd] : 1;
        if (ndm__ckd_mul_i64(&shape[d], s, k)) {
            ndm__fail(NDM_E_OVERFLOW, __func__, site, "tiled axis %d overflows", d);
            goto done;
        }
        pair[2 * d] = k;
        pair[2 * d + 1] = s;
        sstr[2 * d] = 0;
        sstr[2 * d + 1] = rd >= 0 ? r->strides[rd] : 0;
    }
    const struct ndm__backend_index *f;
    ndm__array *o;
    res = index_result_like(site, __func__, out, r, "copy", nd, shape, &f, &o);
    if (!res.id)
        goto done;
    /* The result, read as (reps, size) pairs, is `a` broadcast over the reps;
     * an empty result has nothing to copy, and its pairs' strides (a rep
     * beside a size 0) need not fit. */
    if (ndm__numel(nd, shape) == 0)
        goto done;
    ndm__contiguous_strides(2 * nd, pair, dstr);
    ndm__tensor dst = {ndm__array_ptr(o), o->dtype, 2 * nd, pair, dstr};
    ndm__tensor src = {ndm__array_ptr(r), r->dtype, 2 * nd, pair, sstr};
    ndm_status st = f->copy(r->storage->device.index, &dst, &src);
    if (st < 0)
        res = ndm__kernel_failed(st, res, "copy", __func__, site);
done:
    ndm__scratch_put(&sc);
    return res;
}

/* ---- pad ----------------------------------------------------------------------- */

NDM_API ndm_array ndm_pad_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_pad_mode mode,
                                double value, int n, const int64_t *widths)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (mode != NDM_PAD_CONSTANT && mode != NDM_PAD_EDGE && mode != NDM_PAD_REFLECT) {
        ndm__fail(NDM_E_INVALID, __func__, site, "unknown pad mode %d", (int)mode);
        return NDM_NULL_ARRAY;
    }
    int nd = r->ndim;
    if (n != 2 * nd && n != 2) {
        ndm__fail(NDM_E_INVALID, __func__, site,
                  "%d pad widths for rank %d: give 2 per axis (%d) or 2 for all", n, nd, 2 * nd);
        return NDM_NULL_ARRAY;
    }
    if (!size_list(n, widths, "pad width", __func__, site))
        return NDM_NULL_ARRAY;
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, 2 * (size_t)nd + 1, __func__, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    int64_t *before = shape + nd;
    ndm_array res = NDM_NULL_ARRAY;
    for (int d = 0; d < nd; d++) {
        const int64_t *w = n == 2 ? widths : widths + 2 * d;
        before[d] = w[0];
        if (ndm__ckd_add_i64(&shape[d], r->shape[d], w[0]) ||
            ndm__ckd_add_i64(&shape[d], shape[d], w[1])) {
            ndm__fail(NDM_E_OVERFLOW, __func__, site, "padded axis %d overflows", d);
            goto done;
        }
        if (mode != NDM_PAD_CONSTANT && r->shape[d] == 0 && (w[0] || w[1])) {
            char desc[160];
            ndm__fail(NDM_E_SHAPE, __func__, site,
                      "cannot %s-pad axis %d of %s: it is empty",
                      mode == NDM_PAD_EDGE ? "edge" : "reflect", d,
                      ndm__array_desc(r, desc, sizeof desc));
            goto done;
        }
    }
    const struct ndm__backend_index *f;
    ndm__array *o;
    res = index_result_like(site, __func__, out, r, "pad", nd, shape, &f, &o);
    if (!res.id)
        goto done;
    ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r);
    ndm_status st = f->pad(r->storage->device.index, &dst, &src, before, mode, value);
    if (st < 0)
        res = ndm__kernel_failed(st, res, "pad", __func__, site);
done:
    ndm__scratch_put(&sc);
    return res;
}

/* ---- cumsum and cumprod ------------------------------------------------------- */

static ndm_array cumulate(ndm__site site, const char *api, ndm_manager out, ndm_array a, int axis,
                          bool prod)
{
    const char *op = prod ? "cumprod" : "cumsum";
    ndm__array *r = ndm__input(a, &out, api, site);
    int ax;
    if (!r || ndm__axis(axis, r->ndim, false, &ax, api, site) < 0)
        return NDM_NULL_ARRAY;
    ndm_device dev = r->storage->device;
    const struct ndm__backend_index *f = ndm__index_family(dev, api, site);
    ndm_dtype t = ndm_dtype_is_float(r->dtype) ? r->dtype : NDM_I64;
    if (!f || NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, op, ndm__layout_of(r), 2,
                                   {t, r->dtype}))
        return NDM_NULL_ARRAY;
    ndm__array *o;
    ndm_array res = ndm__array_new_on(site, api, out, dev, t, r->ndim, r->shape, &o);
    if (!res.id)
        return res;
    ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r);
    ndm_status st = prod ? f->cumprod(dev.index, &dst, &src, ax) : f->cumsum(dev.index, &dst, &src, ax);
    if (st < 0)
        return ndm__kernel_failed(st, res, op, api, site);
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(t)) {
        ndm__ag_params agp = {.i = {ax}};
        ndm__ag_record(prod ? NDM__AG_CUMPROD : NDM__AG_CUMSUM, res, 1, &a, &agp);
    }
    return res;
}

NDM_API ndm_array ndm_cumsum_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    NDM__OP_GUARD();
    return cumulate(NDM__SITE, __func__, out, a, axis, false);
}

NDM_API ndm_array ndm_cumprod_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis)
{
    NDM__OP_GUARD();
    return cumulate(NDM__SITE, __func__, out, a, axis, true);
}

/* ---- tril, triu and tri ---------------------------------------------------------- */

static ndm_array triangle(ndm__site site, const char *api, ndm_manager out, ndm_array a, int64_t k,
                          bool upper)
{
    ndm__array *r = ndm__input(a, &out, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    if (r->ndim < 2) {
        char d[160];
        ndm__fail(NDM_E_SHAPE, api, site,
                  "%s has rank %d; a triangle needs the last two axes of a matrix",
                  ndm__array_desc(r, d, sizeof d), r->ndim);
        return NDM_NULL_ARRAY;
    }
    ndm_device dev = r->storage->device;
    const struct ndm__backend_index *f = ndm__index_family(dev, api, site);
    const char *op = upper ? "triu" : "tril";
    if (!f || NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, op, ndm__layout_of(r), 2,
                                   {r->dtype, r->dtype}))
        return NDM_NULL_ARRAY;
    ndm__array *o;
    ndm_array res = ndm__array_new_on(site, api, out, dev, r->dtype, r->ndim, r->shape, &o);
    if (!res.id)
        return res;
    ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r);
    ndm_status st = f->tri(dev.index, &dst, &src, k, upper);
    if (st < 0)
        return ndm__kernel_failed(st, res, op, api, site);
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(r->dtype)) {
        ndm__ag_params agp = {.i = {k, upper}};
        ndm__ag_record(NDM__AG_TRI, res, 1, &a, &agp);
    }
    return res;
}

NDM_API ndm_array ndm_tril_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int64_t k)
{
    NDM__OP_GUARD();
    return triangle(NDM__SITE, __func__, out, a, k, false);
}

NDM_API ndm_array ndm_triu_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int64_t k)
{
    NDM__OP_GUARD();
    return triangle(NDM__SITE, __func__, out, a, k, true);
}

/* A broadcast one through the tril kernel: no full-size temporary. */
NDM_API ndm_array ndm_tri_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int64_t rows,
                             int64_t cols, int64_t k)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    if (rows < 0 || cols < 0) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "rows and cols must be >= 0 (got %" PRId64 " and %" PRId64 ")", rows, cols);
        return NDM_NULL_ARRAY;
    }
    if (!ndm_dtype_valid(dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site, "invalid dtype %d", (int)dtype);
        return NDM_NULL_ARRAY;
    }
    m = ndm__factory_manager(m, api, site);
    if (!m.id)
        return NDM_NULL_ARRAY;
    ndm_array one = ndm_ones_at(NDM__SITE_ARGS(site), m, dtype, 2, (int64_t[]){1, 1});
    if (!one.id)
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    ndm_array wide = ndm_expand_to_at(NDM__SITE_ARGS(site), m, one, 2, (int64_t[]){rows, cols});
    if (wide.id) {
        bool paused = ndm__ag_pause();
        res = triangle(site, api, m, wide, k, false);
        ndm__ag_resume(paused);
        ndm__discard(wide);
    }
    ndm__discard(one);
    return res;
}
