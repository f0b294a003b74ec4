/* matmul, dot and outer: numpy's shape rules and dtype promotion here, the
 * products in the backend's linalg family. dot and outer are matmul on
 * reshaped views. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../backends/linalg.h"
#include "autograd.h"
#include "linalg_temp.h"
#include "ndm/config.h"

ndm__array *ndm__temp_copy(ndm__site site, const char *api, ndm_manager out, ndm__array *r,
                           ndm_dtype dt, ndm_array *h)
{
    ndm__array *c;
    *h = ndm__array_new_on(site, api, out, r->storage->device, dt, r->ndim, r->shape, &c);
    if (!h->id)
        return NULL;
    const ndm__backend *b = ndm__backend_of(r->storage->device, api, site);
    ndm__tensor dst = ndm__tensor_of(c), src = ndm__tensor_of(r);
    ndm_status st = b ? b->copy(r->storage->device.index, &dst, &src) : NDM_E_UNSUPPORTED;
    if (st < 0) {
        if (b)
            ndm__fail(st, api, site, "converting a copy failed: %s", ndm_status_str(st));
        ndm__discard(*h);
        *h = NDM_NULL_ARRAY;
        return NULL;
    }
    return c;
}

NDM_API const char *ndm_gemm_provider(void) { return NDM_BLAS_PROVIDER; }

/* The dtype the kernels compute a result dtype in. */
static ndm_dtype compute_dtype(ndm_dtype t)
{
    switch (t) {
    case NDM_F32:
    case NDM_F64:
        return t;
    case NDM_F16:
    case NDM_BF16:
        return NDM_F32;
    default:
        return NDM_I64;
    }
}

/* Both inputs, on one device, and in *out the output manager. */
static bool inputs2(ndm_array a, ndm_array b, ndm__array **ra, ndm__array **rb, ndm_manager *out,
                    const char *api, ndm__site site)
{
    *ra = ndm__array_get_prop(a, api, site);
    if (!*ra)
        return false;
    *rb = ndm__array_get_prop(b, api, site);
    if (!*rb)
        return false;
    if (!ndm_device_eq((*ra)->storage->device, (*rb)->storage->device)) {
        char d1[32], d2[32];
        ndm__fail(NDM_E_DEVICE, api, site, "operands on different devices (%s and %s)",
                  ndm_device_str((*ra)->storage->device, d1, sizeof d1),
                  ndm_device_str((*rb)->storage->device, d2, sizeof d2));
        return false;
    }
    *out = ndm__output_manager(*out, *ra, api, site);
    return out->id != 0;
}

static ndm_array matmul_impl(ndm__site site, const char *api, ndm_manager out, ndm__array *ra,
                             ndm__array *rb)
{
    char d1[160], d2[160];
    if (ra->ndim == 0 || rb->ndim == 0) {
        ndm__fail(NDM_E_SHAPE, api, site, "matmul needs operands of rank >= 1, got %s and %s",
                  ndm__array_desc(ra, d1, sizeof d1), ndm__array_desc(rb, d2, sizeof d2));
        return NDM_NULL_ARRAY;
    }
    bool a1 = ra->ndim == 1, b1 = rb->ndim == 1;
    int na = ra->ndim, nbd = rb->ndim;
    int64_t m = a1 ? 1 : ra->shape[na - 2], k = ra->shape[na - 1];
    int64_t kb = b1 ? rb->shape[0] : rb->shape[nbd - 2], n = b1 ? 1 : rb->shape[nbd - 1];
    if (k != kb) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "inner sizes differ: %s @ %s (%" PRId64 " against %" PRId64 ")",
                  ndm__array_desc(ra, d1, sizeof d1), ndm__array_desc(rb, d2, sizeof d2), k, kb);
        return NDM_NULL_ARRAY;
    }
    int ba = na > 2 ? na - 2 : 0, bb = nbd > 2 ? nbd - 2 : 0;
    int nb = ba > bb ? ba : bb, nd = nb + 2;
    /* shapes and strides: output, kernel a, b, c (nd each) */
    int64_t small[7 * 18];
    int64_t *buf =
        nd <= 18 ? small : ndm__malloc(7 * (size_t)nd * sizeof(int64_t), NDM__INJ_SCRATCH);
    if (!buf) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a rank-%d product", nd);
        return NDM_NULL_ARRAY;
    }
    int64_t *oshape = buf, *kshape_a = buf + nd, *sa = buf + 2 * nd, *kshape_b = buf + 3 * nd;
    int64_t *sb = buf + 4 * nd, *kshape_c = buf + 5 * nd, *sc = buf + 6 * nd;
    ndm_array res = NDM_NULL_ARRAY, ta = NDM_NULL_ARRAY, tb = NDM_NULL_ARRAY, tc = NDM_NULL_ARRAY;
    int ond = 0;
    for (int i = 0; i < nb; i++) {
        int64_t da = i >= nb - ba ? ra->shape[i - (nb - ba)] : 1;
        int64_t db = i >= nb - bb ? rb->shape[i - (nb - bb)] : 1;
        if (da != db && da != 1 && db != 1) {
            ndm__fail(NDM_E_SHAPE, api, site,
                      "batch axes of %s and %s do not broadcast (axis %d: %" PRId64
                      " against %" PRId64 ")",
                      ndm__array_desc(ra, d1, sizeof d1), ndm__array_desc(rb, d2, sizeof d2),
                      i - nb - 2, da, db);
            goto done;
        }
        oshape[ond++] = da == 1 ? db : da;
    }
    if (!a1)
        oshape[ond++] = m;
    if (!b1)
        oshape[ond++] = n;
    ndm_dtype rdt = ndm_result_type(ra->dtype, rb->dtype), cdt = compute_dtype(rdt);
    if (ndm__shape_check(ond, oshape, rdt, NULL, NULL, api, site) < 0)
        goto done;
    const ndm__backend *be = ndm__backend_of(ra->storage->device, api, site);
    if (!be)
        goto done;
    if (!be->linalg) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "no matrix products on device %s",
                  ndm_device_str(ra->storage->device, d1, sizeof d1));
        goto done;
    }
    if (NDM__BACKEND_DECLINES(be, ra->storage->device, api, site, NDM__OPS_LINALG, 0, "matmul",
                              ndm__layout_of(ra) | ndm__layout_of(rb), 3, {cdt, cdt, cdt}))
        goto done;
    ndm__array *ro, *ea = ra, *eb = rb, *ec;
    res = ndm__array_new_on(site, api, out, ra->storage->device, rdt, ond, oshape, &ro);
    if (!res.id)
        goto done;
    ec = ro;
    if (ra->dtype != cdt && !(ea = ndm__temp_copy(site, api, out, ra, cdt, &ta)))
        goto fail;
    if (rb->dtype != cdt && !(eb = ndm__temp_copy(site, api, out, rb, cdt, &tb)))
        goto fail;
    if (rdt != cdt) {
        ndm_array h = ndm__array_new_on(site, api, out, ra->storage->device, cdt, ond, oshape, &ec);
        if (!h.id)
            goto fail;
        tc = h;
    }
    /* Kernel views: batch axes broadcast with stride 0; a 1-D a is a row,
     * a 1-D b a column; c's memory is C-ordered over (batch, m, n). */
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - ba), ib = i - (nb - bb);
        kshape_a[i] = kshape_b[i] = kshape_c[i] = oshape[i];
        sa[i] = ia >= 0 && ea->shape[ia] != 1 ? ea->strides[ia] : 0;
        sb[i] = ib >= 0 && eb->shape[ib] != 1 ? eb->strides[ib] : 0;
    }
    kshape_a[nb] = m, kshape_a[nb + 1] = k;
    sa[nb] = a1 ? 0 : ea->strides[na - 2];
    sa[nb + 1] = ea->strides[na - 1];
    kshape_b[nb] = k, kshape_b[nb + 1] = n;
    sb[nb] = b1 ? eb->strides[0] : eb->strides[nbd - 2];
    sb[nb + 1] = b1 ? 0 : eb->strides[nbd - 1];
    kshape_c[nb] = m, kshape_c[nb + 1] = n;
    ndm__contiguous_strides(nd, kshape_c, sc);
    ndm__tensor A = {ndm__array_ptr(ea), cdt, nd, kshape_a, sa};
    ndm__tensor B = {ndm__array_ptr(eb), cdt, nd, kshape_b, sb};
    ndm__tensor C = {ndm__array_ptr(ec), cdt, nd, kshape_c, sc};
    ndm_status st;
    NDM__WITH_OP_CONTEXT(out, api, site,
                         st = be->linalg->matmul(ra->storage->device.index, &C, &A, &B));
    if (st >= 0 && tc.id) {
        ndm__tensor dst = ndm__tensor_of(ro), src = ndm__tensor_of(ec);
        st = be->copy(ra->storage->device.index, &dst, &src);
    }
    if (st < 0) {
        ndm__fail(st, api, site, "product of %s and %s failed: %s",
                  ndm__array_desc(ra, d1, sizeof d1), ndm__array_desc(rb, d2, sizeof d2),
                  ndm_status_str(st));
        goto fail;
    }
    goto done;
fail:
    ndm__discard(res);
    res = NDM_NULL_ARRAY;
done:
    if (ta.id)
        ndm__discard(ta);
    if (tb.id)
        ndm__discard(tb);
    if (tc.id)
        ndm__discard(tc);
    if (buf != small)
        free(buf);
    return res;
}

NDM_API ndm_array ndm_matmul_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *ra, *rb;
    if (!inputs2(a, b, &ra, &rb, &out, __func__, site))
        return NDM_NULL_ARRAY;
    bool paused = ndm__ag_pause();
    ndm_array res = matmul_impl(site, __func__, out, ra, rb);
    ndm__ag_resume(paused);
    NDM__AG_RECORD(NDM__AG_MATMUL, res, 2, ((ndm_array[]){a, b}), NULL);
    return res;
}

/* matmul of two views given as (shape) reshapes of a and b, the result
 * reshaped to (ond, oshape). Every intermediate handle is released. */
static ndm_array reshaped_product(ndm__site site, const char *api, ndm_manager out, ndm_array a,
                                  int nda, const int64_t *sha, ndm_array b, int ndb,
                                  const int64_t *shb, int ond, const int64_t *oshape)
{
    NDM__OP_GUARD();
    ndm_array va = ndm_reshape_to_at(site.file, site.line, site.func, out, a, nda, sha);
    ndm_array vb = va.id ? ndm_reshape_to_at(site.file, site.line, site.func, out, b, ndb, shb)
                         : NDM_NULL_ARRAY;
    ndm_array res = NDM_NULL_ARRAY;
    if (vb.id) {
        ndm__array *ra = ndm__array_peek(va), *rb = ndm__array_peek(vb);
        ndm_array c = matmul_impl(site, api, out, ra, rb);
        if (c.id) {
            res = ndm_reshape_to_at(site.file, site.line, site.func, out, c, ond, oshape);
            ndm__discard(c);
        }
    }
    if (va.id)
        ndm__discard(va);
    if (vb.id)
        ndm__discard(vb);
    return res;
}

NDM_API ndm_array ndm_outer_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *ra, *rb;
    if (!inputs2(a, b, &ra, &rb, &out, __func__, site))
        return NDM_NULL_ARRAY;
    int64_t na = ndm__numel(ra->ndim, ra->shape), nb = ndm__numel(rb->ndim, rb->shape);
    int64_t sha[2] = {na, 1}, shb[2] = {1, nb}, sho[2] = {na, nb};
    /* checked before any view is made */
    if (ndm__shape_check(2, sho, ndm_result_type(ra->dtype, rb->dtype), NULL, NULL, __func__,
                         site) < 0)
        return NDM_NULL_ARRAY;
    bool paused = ndm__ag_pause();
    ndm_array res = reshaped_product(site, __func__, out, a, 2, sha, b, 2, shb, 2, sho);
    ndm__ag_resume(paused);
    if (ra->ndim == 1 && rb->ndim == 1)
        NDM__AG_RECORD(NDM__AG_OUTER, res, 2, ((ndm_array[]){a, b}), NULL);
    return res;
}

static ndm_array dot_impl(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);

NDM_API ndm_array ndm_dot_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b)
{
    bool paused = ndm__ag_pause();
    ndm_array res = dot_impl(ndm_file_, ndm_line_, ndm_func_, out, a, b);
    ndm__ag_resume(paused);
    NDM__AG_RECORD(NDM__AG_DOT, res, 2, ((ndm_array[]){a, b}), NULL);
    return res;
}

static ndm_array dot_impl(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    ndm__array *ra, *rb;
    if (!inputs2(a, b, &ra, &rb, &out, "ndm_dot", site))
        return NDM_NULL_ARRAY;
    int na = ra->ndim, nbd = rb->ndim;
    if (na == 0 || nbd == 0) {
        int64_t sza = ndm__numel(na, ra->shape), szb = ndm__numel(nbd, rb->shape);
        /* a scalar operand scales the other: a (1 x 1) or (n x 1) product */
        int64_t sha[2] = {na == 0 ? 1 : sza, 1}, shb[2] = {1, na == 0 ? szb : 1};
        ndm__array *big = na == 0 ? rb : ra;
        return reshaped_product(site, "ndm_dot", out, a, 2, sha, b, 2, shb, big->ndim,
                                big->shape);
    }
    if (nbd <= 2)
        return matmul_impl(site, "ndm_dot", out, ra, rb);
    /* N-d with M-d, M > 2: a as (rows, k) against b's axis -2 as rows of a
     * (k, batch * n) matrix, so b's axis -2 moves to the front first. */
    int64_t k = ra->shape[na - 1], kb = rb->shape[nbd - 2];
    if (k != kb) {
        char d1[160], d2[160];
        ndm__fail(NDM_E_SHAPE, "ndm_dot", site,
                  "dot: last axis of %s and axis -2 of %s differ (%" PRId64 " against %" PRId64 ")",
                  ndm__array_desc(ra, d1, sizeof d1), ndm__array_desc(rb, d2, sizeof d2), k, kb);
        return NDM_NULL_ARRAY;
    }
    int ond = na - 1 + nbd - 1;
    int *perm = ndm__malloc((size_t)nbd * sizeof *perm, NDM__INJ_SCRATCH);
    int64_t *oshape = ndm__malloc((size_t)ond * sizeof *oshape, NDM__INJ_SCRATCH);
    ndm_array res = NDM_NULL_ARRAY;
    if (!perm || !oshape) {
        ndm__fail(NDM_E_OOM, "ndm_dot", site, "no memory for a rank-%d dot", ond);
        goto done;
    }
    perm[0] = nbd - 2;
    for (int i = 0; i < nbd - 2; i++)
        perm[i + 1] = i;
    perm[nbd - 1] = nbd - 1;
    for (int i = 0; i < na - 1; i++)
        oshape[i] = ra->shape[i];
    for (int i = 0; i < nbd - 2; i++)
        oshape[na - 1 + i] = rb->shape[i];
    oshape[ond - 1] = rb->shape[nbd - 1];
    if (ndm__shape_check(ond, oshape, ndm_result_type(ra->dtype, rb->dtype), NULL, NULL, "ndm_dot",
                         site) < 0)
        goto done;
    ndm_array pb = ndm_permute_to_at(ndm_file_, ndm_line_, ndm_func_, out, b, nbd, perm);
    if (pb.id) {
        int64_t sha[2] = {ndm__numel(na - 1, ra->shape), k};
        int64_t shb[2] = {k, ndm__numel(nbd - 2, rb->shape) * rb->shape[nbd - 1]};
        res = reshaped_product(site, "ndm_dot", out, a, 2, sha, pb, 2, shb, ond, oshape);
        ndm__discard(pb);
    }
done:
    free(perm);
    free(oshape);
    return res;
}
