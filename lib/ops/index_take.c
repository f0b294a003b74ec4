/* Indexing with index arrays: take, index_select, gather, scatter_add,
 * one_hot, repeat. Index ranges are checked on the device before anything
 * is allocated or written. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "broadcast.h"
#include "index_ops.h"
#include "supports.h"

static bool index_dtype(const ndm__array *ri, const char *api, ndm__site site)
{
    if (ri->dtype == NDM_U8 || ri->dtype == NDM_I32 || ri->dtype == NDM_I64)
        return true;
    char desc[160];
    ndm__fail(NDM_E_DTYPE, api, site, "indices %s must be u8, i32 or i64",
              ndm__array_desc(ri, desc, sizeof desc));
    return false;
}

/* Every entry of ri lies in [lo, hi); otherwise NDM_E_INVALID naming the
 * first entry that does not, where it is, and `range` (what it indexes). */
static bool index_range(const struct ndm__backend_index *f, const ndm__array *ri, int64_t lo,
                        int64_t hi, const char *range, const char *api, ndm__site site)
{
    ndm__tensor t = ndm__tensor_of(ri);
    int64_t pos, v;
    ndm_status st;
    /* (a few bytes of device scratch: named, charged to no manager) */
    NDM__WITH_OP_CONTEXT(NDM_NULL_MANAGER, api, site,
                         st = f->find_outside(ri->storage->device.index, &t, lo, hi, &pos, &v));
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s",
                 ndm_last_status() == st && ndm_last_error()[0] ? ndm_last_error()
                                                                : ndm_status_str(st));
        ndm__fail(st, api, site, "index check failed: %s", why);
        return false;
    }
    if (pos < 0)
        return true;
    /* The position as coordinates, innermost last. */
    char where[160];
    size_t len = 0;
    int64_t rest = pos;
    char parts[64][24];
    int k = ri->ndim < 64 ? ri->ndim : 64;
    for (int d = ri->ndim - 1, j = k - 1; d >= 0; d--) {
        int64_t c = ri->shape[d] ? rest % ri->shape[d] : 0;
        rest = ri->shape[d] ? rest / ri->shape[d] : 0;
        if (j >= 0 && d >= ri->ndim - k)
            snprintf(parts[j--], sizeof parts[0], "%" PRId64, c);
    }
    where[0] = 0;
    for (int j = 0; j < k && len < sizeof where; j++)
        len += (size_t)snprintf(where + len, sizeof where - len, "%s%s", j ? "," : "", parts[j]);
    ndm__fail(NDM_E_INVALID, api, site,
              "index %" PRId64 " at [%s] of the indices is out of range for %s", v, where, range);
    return false;
}

/* Look up an array input and an index input (null propagates), resolve the
 * output manager and the axis, check the index dtype and the device. */
static bool two_inputs(ndm_array a, ndm_array indices, int axis, ndm__array **r,
                       ndm__array **ri, int *ax, ndm_manager *out, const char *api,
                       ndm__site site)
{
    *r = ndm__array_get_prop(a, api, site);
    *ri = *r ? ndm__array_get_prop(indices, api, site) : NULL;
    if (!*ri)
        return false;
    if (out) {
        *out = ndm__output_manager(*out, *r, api, site);
        if (!out->id)
            return false;
    }
    return ndm__axis(axis, (*r)->ndim, false, ax, api, site) == NDM_OK &&
           index_dtype(*ri, api, site) && ndm__same_device(*r, *ri, api, site);
}

/* "axis 1 of size 5" */
static const char *axis_range(char *buf, size_t n, int axis, int64_t size)
{
    snprintf(buf, n, "axis %d of size %" PRId64, axis, size);
    return buf;
}

/* The index family of r's device once every entry of ri indexes axis ax of
 * r (`axis` as the caller gave it; negative entries count from the end);
 * NULL with the error recorded. */
static const struct ndm__backend_index *on_axis(const ndm__array *r, const ndm__array *ri,
                                                int axis, int ax, const char *op,
                                                const char *api, ndm__site site)
{
    const struct ndm__backend_index *f = ndm__index_family(r->storage->device, api, site);
    char range[64];
    int64_t n = r->shape[ax];
    if (!f ||
        NDM__DEVICE_DECLINES(r->storage->device, api, site, NDM__OPS_INDEX, 0, op,
                             ndm__layout_of(r) | ndm__layout_of(ri), 2, {r->dtype, ri->dtype}) ||
        !index_range(f, ri, -n, n, axis_range(range, sizeof range, axis, n), api, site))
        return NULL;
    return f;
}

/* ---- take and index_select --------------------------------------------------- */

/* A result of r's dtype and the given shape on r's device, once on_axis has
 * found the family that runs op there; NULL array with the failure recorded. */
static ndm_array axis_result(ndm__site site, const char *api, ndm_manager out, const ndm__array *r,
                             const ndm__array *ri, int axis, int ax, const char *op, int nd,
                             const int64_t *shape, const struct ndm__backend_index **f,
                             ndm__array **o)
{
    *f = on_axis(r, ri, axis, ax, op, api, site);
    if (!*f)
        return NDM_NULL_ARRAY;
    return ndm__array_new_on(site, api, out, r->storage->device, r->dtype, nd, shape, o);
}

/* res once kernel `op` returned st: released with the failure recorded, or
 * recorded for autograd as ag_op of a (r, a float) by indices along ax. */
static ndm_array axis_done(ndm_status st, ndm_array res, const char *op, ndm__ag_op ag_op,
                           const ndm__array *r, ndm_array a, ndm_array indices, int ax,
                           const char *api, ndm__site site)
{
    if (st < 0)
        return ndm__kernel_failed(st, res, op, api, site);
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(r->dtype)) {
        ndm__ag_params agp = {.i = {ax}};
        ndm__ag_record(ag_op, res, 2, (ndm_array[]){a, indices}, &agp);
    }
    return res;
}

static ndm_array take(ndm__site site, const char *api, ndm_manager out, ndm_array a, int axis,
                      ndm_array indices, bool one_d)
{
    ndm__array *r, *ri;
    int ax;
    if (!two_inputs(a, indices, axis, &r, &ri, &ax, &out, api, site))
        return NDM_NULL_ARRAY;
    if (one_d && ri->ndim != 1) {
        char desc[160];
        ndm__fail(NDM_E_SHAPE, api, site, "indices %s must be 1-d",
                  ndm__array_desc(ri, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    int nd = r->ndim - 1 + ri->ndim;
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, (size_t)nd, api, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    memcpy(shape, r->shape, (size_t)ax * sizeof *shape);
    memcpy(shape + ax, ri->shape, (size_t)ri->ndim * sizeof *shape);
    memcpy(shape + ax + ri->ndim, r->shape + ax + 1, (size_t)(r->ndim - ax - 1) * sizeof *shape);
    const struct ndm__backend_index *f;
    ndm__array *o;
    res = axis_result(site, api, out, r, ri, axis, ax, "take", nd, shape, &f, &o);
    if (!res.id)
        goto done;
    ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r), idx = ndm__tensor_of(ri);
    ndm_status st = f->take(r->storage->device.index, &dst, &src, ax, &idx);
    res = axis_done(st, res, "take", NDM__AG_TAKE, r, a, indices, ax, api, site);
done:
    ndm__scratch_put(&sc);
    return res;
}

NDM_API ndm_array ndm_take_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                 ndm_array indices)
{
    NDM__OP_GUARD();
    return take(NDM__SITE, __func__, out, a, axis, indices, false);
}

NDM_API ndm_array ndm_index_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                         ndm_array indices)
{
    NDM__OP_GUARD();
    return take(NDM__SITE, __func__, out, a, axis, indices, true);
}

/* ---- gather -------------------------------------------------------------------- */

/* Strides reading r over `shape` (same rank), 0 where r has size 1 and the
 * shape does not; axis `keep` keeps r's stride. */
static void stretch(const ndm__array *r, const int64_t *shape, int keep, int64_t *strides)
{
    for (int d = 0; d < r->ndim; d++)
        strides[d] = d != keep && r->shape[d] == 1 && shape[d] != 1 ? 0 : r->strides[d];
}

NDM_API ndm_array ndm_gather_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   ndm_array indices)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r, *ri;
    int ax;
    if (!two_inputs(a, indices, axis, &r, &ri, &ax, &out, __func__, site))
        return NDM_NULL_ARRAY;
    int nd = r->ndim;
    char d1[160], d2[160];
    if (ri->ndim != nd) {
        ndm__fail(NDM_E_SHAPE, __func__, site, "indices %s must have the rank of %s",
                  ndm__array_desc(ri, d1, sizeof d1), ndm__array_desc(r, d2, sizeof d2));
        return NDM_NULL_ARRAY;
    }
    ndm__scratch sc = {0};
    /* result shape, source shape, source strides, index strides */
    int64_t *shape = ndm__scratch_get(&sc, 4 * (size_t)nd, __func__, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    int64_t *sshape = shape + nd, *sstr = sshape + nd, *istr = sstr + nd;
    ndm_array res = NDM_NULL_ARRAY;
    for (int d = 0; d < nd; d++) {
        int64_t x = r->shape[d], y = ri->shape[d];
        if (d != ax && x != y && x != 1 && y != 1) {
            ndm__fail(NDM_E_SHAPE, __func__, site,
                      "indices %s do not broadcast against %s (axis %d: %" PRId64
                      " against %" PRId64 ")",
                      ndm__array_desc(ri, d1, sizeof d1), ndm__array_desc(r, d2, sizeof d2), d, y,
                      x);
            goto done;
        }
        shape[d] = d == ax || x == 1 ? y : x;
        sshape[d] = d == ax ? x : shape[d];
    }
    stretch(r, shape, ax, sstr);
    stretch(ri, shape, -1, istr);
    const struct ndm__backend_index *f;
    ndm__array *o;
    res = axis_result(site, __func__, out, r, ri, axis, ax, "gather", nd, shape, &f, &o);
    if (!res.id)
        goto done;
    ndm__tensor dst = ndm__tensor_of(o);
    ndm__tensor src = {ndm__array_ptr(r), r->dtype, nd, sshape, sstr};
    ndm__tensor idx = {ndm__array_ptr(ri), ri->dtype, nd, shape, istr};
    ndm_status st = f->gather(r->storage->device.index, &dst, &src, ax, &idx);
    res = axis_done(st, res, "gather", NDM__AG_GATHER, r, a, indices, ax, __func__, site);
done:
    ndm__scratch_put(&sc);
    return res;
}

/* ---- scatter_add ------------------------------------------------------------- */

/* What scatter_add checked: the inputs, and the iteration (idx's shape with
 * a's sizes on the other axes) that indices and src are read over. */
typedef struct scatter {
    ndm__array *a, *idx, *src;
    int ax;
    const struct ndm__backend_index *f;
    ndm__scratch sc;
    int64_t *shape, *istr, *sstr;
} scatter;

static bool scatter_check(scatter *p, ndm_array a, int axis, ndm_array indices, ndm_array src,
                          ndm_manager *out, const char *api, ndm__site site)
{
    if (!two_inputs(a, indices, axis, &p->a, &p->idx, &p->ax, NULL, api, site))
        return false;
    p->src = ndm__array_get_prop(src, api, site);
    if (!p->src)
        return false;
    if (out) {
        *out = ndm__output_manager(*out, p->a, api, site);
        if (!out->id)
            return false;
    }
    ndm__array *r = p->a, *ri = p->idx, *rs = p->src;
    int nd = r->ndim;
    char d1[160], d2[160];
    if (!ndm__same_device(r, rs, api, site))
        return false;
    if (ri->ndim != nd) {
        ndm__fail(NDM_E_SHAPE, api, site, "indices %s must have the rank of %s",
                  ndm__array_desc(ri, d1, sizeof d1), ndm__array_desc(r, d2, sizeof d2));
        return false;
    }
    for (int d = 0; !out && d < nd; d++)
        if (r->strides[d] == 0 && r->shape[d] > 1) {
            ndm__fail(NDM_E_INVALID, api, site,
                      "%s is a broadcast view (stride 0 on axis %d); update a copy",
                      ndm__array_desc(r, d1, sizeof d1), d);
            return false;
        }
    if (!out && ri->storage == r->storage) {
        ndm__fail(NDM_E_INVALID, api, site, "indices %s share memory with the array updated",
                  ndm__array_desc(ri, d1, sizeof d1));
        return false;
    }
    p->shape = ndm__scratch_get(&p->sc, 3 * (size_t)nd, api, site);
    if (!p->shape)
        return false;
    p->istr = p->shape + nd;
    p->sstr = p->istr + nd;
    for (int d = 0; d < nd; d++) {
        if (d != p->ax && ri->shape[d] != r->shape[d] && ri->shape[d] != 1) {
            ndm__fail(NDM_E_SHAPE, api, site,
                      "indices %s do not fit %s (axis %d: %" PRId64 " against %" PRId64 ")",
                      ndm__array_desc(ri, d1, sizeof d1), ndm__array_desc(r, d2, sizeof d2), d,
                      ri->shape[d], r->shape[d]);
            return false;
        }
        p->shape[d] = d == p->ax ? ri->shape[d] : r->shape[d];
    }
    stretch(ri, p->shape, -1, p->istr);
    /* src broadcasts to the iteration by numpy's rules. */
    int lead = nd - rs->ndim;
    for (int j = 0; j < rs->ndim; j++)
        if (lead < 0 || (rs->shape[j] != 1 && rs->shape[j] != p->shape[lead + j])) {
            char d3[160];
            ndm__fail(NDM_E_SHAPE, api, site,
                      "src %s does not broadcast to the shape of indices %s over %s",
                      ndm__array_desc(rs, d1, sizeof d1), ndm__array_desc(ri, d2, sizeof d2),
                      ndm__array_desc(r, d3, sizeof d3));
            return false;
        }
    ndm__broadcast_strides(rs, nd, p->shape, p->sstr);
    p->f = on_axis(r, ri, axis, p->ax, "scatter_add", api, site);
    return p->f != NULL;
}

/* Add into `dst` (a, or its copy). src is read through a temporary in dst's
 * dtype when the dtypes differ or src shares a's memory; the temporary lives
 * in `tmp_mgr` and is released before return. */
static ndm_status scatter_run(scatter *p, ndm__array *dst, ndm_manager tmp_mgr, const char *api,
                              ndm__site site)
{
    ndm_device dev = dst->storage->device;
    ndm__tensor d = ndm__tensor_of(dst);
    ndm__tensor idx = {ndm__array_ptr(p->idx), p->idx->dtype, p->idx->ndim, p->shape, p->istr};
    ndm__tensor src = {ndm__array_ptr(p->src), p->src->dtype, d.ndim, p->shape, p->sstr};
    ndm_array tmp = NDM_NULL_ARRAY;
    ndm_status st;
    if (p->src->dtype != dst->dtype || p->src->storage == p->a->storage) {
        ndm__array *t;
        tmp = ndm__array_new_on(site, api, tmp_mgr, dev, dst->dtype, d.ndim, p->shape, &t);
        if (!tmp.id)
            return ndm_last_status();
        ndm__tensor tt = ndm__tensor_of(t);
        st = p->f->copy(dev.index, &tt, &src);
        if (st < 0) {
            ndm__discard(tmp);
            return ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st));
        }
        src = tt;
    }
    st = p->f->scatter_add(dev.index, &d, p->ax, &idx, &src);
    if (tmp.id)
        ndm__discard(tmp);
    if (st < 0)
        return ndm__fail(st, api, site, "scatter_add failed: %s", ndm_status_str(st));
    return NDM_OK;
}

NDM_API ndm_status ndm_scatter_add_inplace_at(NDM_SITE_PARAMS, ndm_array a, int axis,
                                              ndm_array indices, ndm_array src)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    scatter p = {0};
    ndm_status st;
    if (scatter_check(&p, a, axis, indices, src, NULL, __func__, site)) {
        /* A temporary follows the output rule of src, the input that is not
         * updated, so a capped model's arrays can still be updated in place. */
        ndm_manager tm = ndm__output_manager(NDM_OUTPUT_RULE, p.src, __func__, site);
        st = scatter_run(&p, p.a, tm, __func__, site);
    } else {
        st = ndm_last_status();
    }
    ndm__scratch_put(&p.sc);
    return st;
}

NDM_API ndm_array ndm_scatter_add_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                        ndm_array indices, ndm_array src)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    scatter p = {0};
    ndm_array res = NDM_NULL_ARRAY;
    if (!scatter_check(&p, a, axis, indices, src, &out, __func__, site))
        goto done;
    ndm_device dev = p.a->storage->device;
    ndm__array *o;
    res = ndm__array_new_on(site, __func__, out, dev, p.a->dtype, p.a->ndim, p.a->shape, &o);
    if (!res.id)
        goto done;
    ndm__tensor dst = ndm__tensor_of(o), in = ndm__tensor_of(p.a);
    ndm_status st = p.f->copy(dev.index, &dst, &in);
    if (st < 0) {
        res = ndm__kernel_failed(st, res, "copy", __func__, site);
        goto done;
    }
    if (scatter_run(&p, o, out, __func__, site) < 0) {
        ndm__discard(res);
        res = NDM_NULL_ARRAY;
    }
done:
    ndm__scratch_put(&p.sc);
    return res;
}

/* ---- one_hot ------------------------------------------------------------------- */

NDM_API ndm_array ndm_one_hot_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array indices,
                                    int64_t num_classes, ndm_dtype dtype)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *ri = ndm__input(indices, &out, __func__, site);
    if (!ri || !index_dtype(ri, __func__, site))
        return NDM_NULL_ARRAY;
    if (num_classes < 1) {
        ndm__fail(NDM_E_INVALID, __func__, site, "num_classes must be >= 1 (got %" PRId64 ")",
                  num_classes);
        return NDM_NULL_ARRAY;
    }
    if (!ndm_dtype_valid(dtype)) {
        ndm__fail(NDM_E_DTYPE, __func__, site, "invalid dtype %d", (int)dtype);
        return NDM_NULL_ARRAY;
    }
    int nd = ri->ndim + 1;
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, (size_t)nd, __func__, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    memcpy(shape, ri->shape, (size_t)ri->ndim * sizeof *shape);
    shape[nd - 1] = num_classes;
    ndm_device dev = ri->storage->device;
    const struct ndm__backend_index *f = ndm__index_family(dev, __func__, site);
    char range[64];
    snprintf(range, sizeof range, "%" PRId64 " classes", num_classes);
    if (!f ||
        NDM__DEVICE_DECLINES(dev, __func__, site, NDM__OPS_INDEX, 0, "one_hot",
                             ndm__layout_of(ri), 2, {dtype, ri->dtype}) ||
        !index_range(f, ri, 0, num_classes, range, __func__, site))
        goto done;
    ndm__array *o;
    res = ndm__array_new_on(site, __func__, out, dev, dtype, nd, shape, &o);
    if (!res.id)
        goto done;
    ndm__tensor dst = ndm__tensor_of(o), idx = ndm__tensor_of(ri);
    ndm_status st = f->one_hot(dev.index, &dst, &idx);
    if (st < 0)
        res = ndm__kernel_failed(st, res, "one_hot", __func__, site);
done:
    ndm__scratch_put(&sc);
    return res;
}

/* ---- repeat -------------------------------------------------------------------- */

/* Repeat is a take: entry i of the axis appears reps[i] times in a row, so
 * the result is `a` taken at 0,0,..,1,1,..; the index list is a temporary in
 * the output's manager. n == 1 repeats every entry alike. */
static ndm_array repeat(ndm__site site, const char *api, ndm_manager out, ndm_array a, int axis,
                        int n, const int64_t *reps)
{
    ndm__array *r = ndm__input(a, &out, api, site);
    int ax;
    if (!r || ndm__axis(axis, r->ndim, false, &ax, api, site) < 0)
        return NDM_NULL_ARRAY;
    int64_t size = r->shape[ax], total = 0;
    if (n != 1 && n != size) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "%d repeat counts for axis %d of size %" PRId64 " (give 1 or %" PRId64 ")", n,
                  axis, size, size);
        return NDM_NULL_ARRAY;
    }
    if (!reps) {
        ndm__fail(NDM_E_INVALID, api, site, "repeat counts are NULL");
        return NDM_NULL_ARRAY;
    }
    for (int64_t i = 0; i < size; i++) {
        int64_t k = reps[n == 1 ? 0 : i];
        if (k < 0) {
            ndm__fail(NDM_E_INVALID, api, site, "repeat count %" PRId64 " (entry %" PRId64
                      ") is negative", k, n == 1 ? 0 : i);
            return NDM_NULL_ARRAY;
        }
        if (ndm__ckd_add_i64(&total, total, k)) {
            ndm__fail(NDM_E_OVERFLOW, api, site, "the repeated axis overflows");
            return NDM_NULL_ARRAY;
        }
    }
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, (size_t)r->ndim, api, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    memcpy(shape, r->shape, (size_t)r->ndim * sizeof *shape);
    shape[ax] = total;
    ndm_array res = NDM_NULL_ARRAY, tmp = NDM_NULL_ARRAY;
    int64_t *host = NULL;
    ndm_device dev = r->storage->device;
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    const struct ndm__backend_index *f = ndm__index_family(dev, api, site);
    ndm__array *o, *t;
    if (!b || !f ||
        NDM__BACKEND_DECLINES(b, dev, api, site, NDM__OPS_INDEX, 0, "take", ndm__layout_of(r), 2,
                              {r->dtype, NDM_I64}))
        goto done;
    res = ndm__array_new_on(site, api, out, dev, r->dtype, r->ndim, shape, &o);
    if (!res.id)
        goto done;
    if (ndm__numel(r->ndim, shape) == 0)
        goto done;
    tmp = ndm__array_new_on(site, api, out, dev, NDM_I64, 1, &total, &t);
    host = ndm__malloc((size_t)total * sizeof *host, NDM__INJ_SCRATCH);
    if (!tmp.id || !host) {
        if (tmp.id)
            ndm__fail(NDM_E_OOM, api, site, "no memory for %" PRId64 " indices", total);
        ndm__discard(res);
        res = NDM_NULL_ARRAY;
        goto done;
    }
    for (int64_t i = 0, j = 0; i < size; i++)
        for (int64_t k = reps[n == 1 ? 0 : i]; k > 0; k--)
            host[j++] = i;
    ndm_status st = b->upload(dev.index, ndm__array_ptr(t), host, (size_t)total * sizeof *host);
    if (st == NDM_OK) {
        ndm__tensor dst = ndm__tensor_of(o), src = ndm__tensor_of(r), idx = ndm__tensor_of(t);
        st = f->take(dev.index, &dst, &src, ax, &idx);
    }
    if (st < 0)
        res = ndm__kernel_failed(st, res, "take", api, site);
done:
    free(host);
    if (tmp.id)
        ndm__discard(tmp);
    ndm__scratch_put(&sc);
    return res;
}

NDM_API ndm_array ndm_repeat_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                   int64_t repeats)
{
    NDM__OP_GUARD();
    return repeat(NDM__SITE, __func__, out, a, axis, 1, &repeats);
}

NDM_API ndm_array ndm_repeat_each_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int axis,
                                        int n, const int64_t *repeats)
{
    NDM__OP_GUARD();
    return repeat(NDM__SITE, __func__, out, a, axis, n, repeats);
}

/* ---- nonzero, masked_select and indexing by several index arrays ------------------ */

/* The C-order positions of the nonzero entries of r read over (nd, shape,
 * strides), a broadcast view of r when `bcast`: a new 1-d i64 array in out,
 * or the null handle with the error recorded. The count is taken first and
 * sizes the result (on a device, a download). */
static ndm_array nonzero_positions(ndm__site site, const char *api, ndm_manager out,
                                   const ndm__array *r, int nd, const int64_t *shape,
                                   const int64_t *strides, bool bcast)
{
    ndm_device dev = r->storage->device;
    const struct ndm__backend_index *f = ndm__index_family(dev, api, site);
    unsigned layout = ndm__layout_of(r) | (bcast ? NDM__LAYOUT_BROADCAST : 0u);
    if (!f || NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_INDEX, 0, "nonzero", layout, 2,
                                   {NDM_I64, r->dtype}))
        return NDM_NULL_ARRAY;
    ndm__tensor src = {ndm__array_ptr(r), r->dtype, nd, shape, strides};
    int64_t count = 0;
    ndm_status st;
    NDM__WITH_OP_CONTEXT(out, api, site, st = f->nonzero(dev.index, NULL, &src, &count));
    if (st < 0) {
        ndm__fail(st, api, site, "counting the nonzero entries failed: %s", ndm_status_str(st));
        return NDM_NULL_ARRAY;
    }
    ndm__array *o;
    ndm_array res = ndm__array_new_on(site, api, out, dev, NDM_I64, 1, &count, &o);
    if (!res.id || count == 0)
        return res;
    ndm__tensor dst = ndm__tensor_of(o);
    NDM__WITH_OP_CONTEXT(out, api, site, st = f->nonzero(dev.index, &dst, &src, NULL));
    if (st < 0)
        return ndm__kernel_failed(st, res, "nonzero", api, site);
    return res;
}

/* Release a temporary handle (null ones are skipped). */
static void drop(ndm_array h)
{
    if (h.id)
        ndm__discard(h);
}

NDM_API ndm_array ndm_nonzero_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    int nd = r->ndim;
    ndm_array pos = nonzero_positions(site, __func__, out, r, nd, r->shape, r->strides, false);
    if (!pos.id)
        return pos;
    int64_t count = ndm__array_peek(pos)->shape[0];
    if (nd == 0) {
        /* [count, 0]: rows of no coordinates */
        ndm__array *o;
        drop(pos);
        return ndm__array_new_on(site, __func__, out, r->storage->device, NDM_I64, 2,
                                 (int64_t[]){count, 0}, &o);
    }
    if (nd == 1 || count == 0) {
        /* a column of positions, or no rows */
        ndm_array res = ndm_reshape_to_at(NDM__SITE_ARGS(site), out, pos, 2,
                                          (int64_t[]){count, nd});
        drop(pos);
        return res;
    }
    /* Coordinates from positions: axis d's is (pos // inner) % size, inner
     * the product of the sizes after d. */
    ndm_array small[16];
    ndm_array *col = nd <= 16 ? small : ndm__malloc((size_t)nd * sizeof *col, NDM__INJ_SCRATCH);
    ndm_array res = NDM_NULL_ARRAY;
    int d = nd - 1;
    if (!col) {
        ndm__fail(NDM_E_OOM, __func__, site, "no memory for %d columns", nd);
        goto done;
    }
    for (int64_t inner = 1; d >= 0; inner *= r->shape[d], d--) {
        ndm_array q = inner == 1 ? NDM_NULL_ARRAY
                                 : ndm_floor_divide_scalar_to_at(NDM__SITE_ARGS(site), out, pos,
                                                                 (double)inner);
        ndm_array from = inner == 1 ? pos : q;
        if (!from.id)
            break;
        if (d > 0) {
            col[d] = ndm_remainder_scalar_to_at(NDM__SITE_ARGS(site), out, from,
                                                (double)r->shape[d]);
            drop(q);
        } else {
            col[d] = from; /* (pos itself only when every later size is 1) */
        }
        if (!col[d].id)
            break;
    }
    if (d < 0)
        res = ndm_stack_to_at(NDM__SITE_ARGS(site), out, 1, nd, col);
done:
    /* columns d+1 .. nd-1 were made */
    for (int k = d + 1; col && k < nd; k++)
        if (col[k].id != pos.id)
            drop(col[k]);
    if (col != small)
        free(col);
    drop(pos);
    return res;
}

NDM_API ndm_array ndm_masked_select_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                          ndm_array mask)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__array_get_prop(a, __func__, site);
    ndm__array *rm = r ? ndm__array_get_prop(mask, __func__, site) : NULL;
    if (!rm)
        return NDM_NULL_ARRAY;
    out = ndm__output_manager(out, r, __func__, site);
    if (!out.id || !ndm__same_device(r, rm, __func__, site))
        return NDM_NULL_ARRAY;
    char desc[160];
    if (rm->dtype != NDM_BOOL) {
        ndm__fail(NDM_E_DTYPE, __func__, site, "mask %s must be bool",
                  ndm__array_desc(rm, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    int nd = ndm__max_ndim(2, (ndm__array *[]){r, rm});
    ndm__scratch sc = {0};
    int64_t *shape = ndm__scratch_get(&sc, 2 * (size_t)nd + 1, __func__, site);
    ndm_array res = NDM_NULL_ARRAY, pos = NDM_NULL_ARRAY, ex = NDM_NULL_ARRAY, flat = NDM_NULL_ARRAY;
    if (!shape ||
        ndm__broadcast_shape(2, (ndm__array *[]){r, rm}, shape, &nd, __func__, site) < 0)
        goto done;
    int64_t *mstr = shape + nd;
    ndm__broadcast_strides(rm, nd, shape, mstr);
    bool bcast = rm->ndim != nd;
    for (int d = 0; d < rm->ndim; d++)
        bcast |= rm->shape[d] != shape[nd - rm->ndim + d];
    /* the mask's positions in the broadcast shape, then a take from `a`
     * broadcast to that shape and read flat (a view when a has it already) */
    pos = nonzero_positions(site, __func__, out, rm, nd, shape, mstr, bcast);
    if (!pos.id)
        goto done;
    bool paused = ndm__ag_pause();
    int64_t total = ndm__numel(nd, shape);
    ex = ndm_expand_to_at(NDM__SITE_ARGS(site), out, a, nd, shape);
    flat = ex.id ? ndm_reshape_to_at(NDM__SITE_ARGS(site), out, ex, 1, &total) : NDM_NULL_ARRAY;
    res = flat.id ? ndm_take_to_at(NDM__SITE_ARGS(site), out, flat, 0, pos) : NDM_NULL_ARRAY;
    ndm__ag_resume(paused);
    if (NDM__UNLIKELY(ndm__ag_on()) && res.id && ndm_dtype_is_float(r->dtype))
        ndm__ag_record(NDM__AG_MASKED_SELECT, res, 3, (ndm_array[]){a, mask, pos}, NULL);
done:
    drop(flat);
    drop(ex);
    drop(pos);
    ndm__scratch_put(&sc);
    return res;
}

NDM_API ndm_array ndm_index_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, int n,
                                  const ndm_array *indices)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *r = ndm__input(a, &out, __func__, site);
    if (!r)
        return NDM_NULL_ARRAY;
    char desc[160];
    if (n < 1 || !indices || n > r->ndim) {
        ndm__fail(NDM_E_INVALID, __func__, site, "%d index arrays%s for %s: give 1 to its rank",
                  n, indices ? "" : " (NULL list)", ndm__array_desc(r, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    ndm__array *small[8];
    ndm__array **ri = n <= 8 ? small : ndm__malloc((size_t)n * sizeof *ri, NDM__INJ_SCRATCH);
    ndm__scratch sc = {0};
    ndm_array res = NDM_NULL_ARRAY, lin = NDM_NULL_ARRAY, flat = NDM_NULL_ARRAY;
    if (!ri) {
        ndm__fail(NDM_E_OOM, __func__, site, "no memory for %d index arrays", n);
        return NDM_NULL_ARRAY;
    }
    for (int j = 0; j < n; j++) {
        ri[j] = ndm__array_get_prop(indices[j], __func__, site);
        if (!ri[j] || !ndm__same_device(r, ri[j], __func__, site))
            goto done;
        if (ri[j]->dtype == NDM_BOOL) {
            ndm__fail(NDM_E_DTYPE, __func__, site,
                      "index array %d %s is bool: select with ndm_masked_select", j,
                      ndm__array_desc(ri[j], desc, sizeof desc));
            goto done;
        }
        if (!index_dtype(ri[j], __func__, site))
            goto done;
    }
    int bnd = ndm__max_ndim(n, ri);
    int rest = r->ndim - n;
    int64_t *shape = ndm__scratch_get(&sc, (size_t)bnd + 1 + (size_t)rest, __func__, site);
    if (!shape || ndm__broadcast_shape(n, ri, shape, &bnd, __func__, site) < 0)
        goto done;
    const struct ndm__backend_index *f = ndm__index_family(r->storage->device, __func__, site);
    if (!f)
        goto done;
    for (int j = 0; j < n; j++) {
        char range[96];
        snprintf(range, sizeof range, "axis %d of size %" PRId64 " (index array %d)", j,
                 r->shape[j], j);
        if (NDM__DEVICE_DECLINES(r->storage->device, __func__, site, NDM__OPS_INDEX, 0, "take",
                                 ndm__layout_of(r) | ndm__layout_of(ri[j]), 2,
                                 {r->dtype, ri[j]->dtype}) ||
            !index_range(f, ri[j], -r->shape[j], r->shape[j], range, __func__, site))
            goto done;
    }
    /* The leading n axes as one of their product's size, indexed by the
     * positions sum_j wrap(i_j) * (sizes after j among the n): one take. */
    bool paused = ndm__ag_pause();
    int64_t *fshape = shape + bnd;
    fshape[0] = ndm__numel(n, r->shape);
    memcpy(fshape + 1, r->shape + n, (size_t)rest * sizeof *fshape);
    for (int j = 0; j < n; j++) {
        int64_t size = r->shape[j];
        ndm_array w = ndm_astype_to_at(NDM__SITE_ARGS(site), out, indices[j], NDM_I64);
        ndm_array v = w.id ? ndm_remainder_scalar_to_at(NDM__SITE_ARGS(site), out, w,
                                                        (double)(size ? size : 1))
                           : NDM_NULL_ARRAY;
        drop(w);
        if (lin.id && v.id) {
            ndm_array s = ndm_mul_scalar_to_at(NDM__SITE_ARGS(site), out, lin, (double)size);
            ndm_array t = s.id ? ndm_add_to_at(NDM__SITE_ARGS(site), out, s, v) : NDM_NULL_ARRAY;
            drop(s);
            drop(v);
            v = t;
        }
        drop(lin);
        lin = v;
        if (!lin.id)
            break;
    }
    if (lin.id)
        flat = ndm_reshape_to_at(NDM__SITE_ARGS(site), out, a, 1 + rest, fshape);
    if (flat.id)
        res = ndm_take_to_at(NDM__SITE_ARGS(site), out, flat, 0, lin);
    ndm__ag_resume(paused);
    if (NDM__UNLIKELY(ndm__ag_on()) && res.id && ndm_dtype_is_float(r->dtype)) {
        ndm__ag_params agp = {.i = {n}};
        ndm__ag_record(NDM__AG_INDEX, res, 2, (ndm_array[]){a, lin}, &agp);
    }
done:
    drop(flat);
    drop(lin);
    ndm__scratch_put(&sc);
    if (ri != small)
        free(ri);
    return res;
}
