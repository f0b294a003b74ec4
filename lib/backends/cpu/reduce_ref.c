/* CPU reference reductions and softmax: plain loops, one element at a time,
 * the test oracle. Every reduction of the list (../reduce.h) runs here from
 * its accumulator, map and finish; the fast table (reduce.c) sends here the
 * ones it has no kernel for. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reduce_cpu.h"

/* One output: the elements of the reduced block at `base` visited in C
 * order. The result is *oi when ndm__reduce_int_value, else *od. */
static void ref_one(ndm__reduce_op op, const ndm__tensor *src, int nk, int nr, const char *base,
                    int64_t R, int64_t ddof, int64_t *ridx, double *od, int64_t *oi)
{
    size_t es = ndm_dtype_size(src->dtype);
    const int64_t *rsh = src->shape + nk, *rst = src->strides + nk;
    ndm_dtype t = src->dtype;
    bool fl = ndm_dtype_is_float(t), iacc = ndm__reduce_int_acc(op, t);
    bool mapped = ndm__reduce_mapped[op];
/* BODY sees the element at `p` and its C-order position `ri_`. */
#define NDM__REF_LOOP(BODY)                                                     \
    do {                                                                        \
        if (nr > 0)                                                             \
            memset(ridx, 0, (size_t)nr * sizeof(int64_t));                      \
        for (int64_t ri_ = 0; ri_ < R; ri_++) {                                 \
            const char *p = base + odo_offset(ridx, nr, rst) * (int64_t)es;     \
            BODY;                                                               \
            odo_next(ridx, nr, rsh);                                            \
        }                                                                       \
    } while (0)
/* The element at p as the accumulator sees it, in double. */
#define NDM__REF_X(p) (mapped ? ndm__reduce_map(op, load_one_d(p, t)) : load_one_d(p, t))
    double s = 0, e = 0, pre = 0;
    int acc = ndm__reduce_acc[op];
    switch (acc) {
    case NDM__RACC_SUM:
    case NDM__RACC_PROD: {
        bool prod = acc == NDM__RACC_PROD;
        if (iacc) {
            uint64_t v = prod;
            if (prod)
                NDM__REF_LOOP(v *= (uint64_t)load_one_i(p, t));
            else
                NDM__REF_LOOP(v += (uint64_t)load_one_i(p, t));
            *oi = (int64_t)v;
            return;
        }
        s = prod;
        if (prod)
            NDM__REF_LOOP(s *= NDM__REF_X(p));
        else
            NDM__REF_LOOP(s += NDM__REF_X(p));
        break;
    }
    case NDM__RACC_MAX:
    case NDM__RACC_MIN: {
        bool mx = acc == NDM__RACC_MAX;
        if (iacc) {
            int64_t m = mx ? INT64_MIN : INT64_MAX;
            NDM__REF_LOOP({
                int64_t x = load_one_i(p, t);
                if (mx ? x > m : x < m)
                    m = x;
            });
            *oi = m;
            return;
        }
        double m = mx ? -INFINITY : INFINITY;
        bool nan = false;
        NDM__REF_LOOP({
            double x = NDM__REF_X(p);
            if (isnan(x))
                nan = true;
            else if (mx ? x > m : x < m)
                m = x;
        });
        s = nan ? NAN : m;
        break;
    }
    case NDM__RACC_ARGMAX:
    case NDM__RACC_ARGMIN: {
        bool mx = acc == NDM__RACC_ARGMAX;
        int64_t best = 0, at = -1;
        double bestd = 0;
        bool nan = false;
        NDM__REF_LOOP({
            if (!iacc) {
                double x = NDM__REF_X(p);
                if (!nan && (at < 0 || isnan(x) || (mx ? x > bestd : x < bestd))) {
                    bestd = x;
                    at = ri_;
                    nan = isnan(x);
                }
            } else {
                int64_t x = load_one_i(p, t);
                if (at < 0 || (mx ? x > best : x < best)) {
                    best = x;
                    at = ri_;
                }
            }
        });
        *oi = at < 0 ? 0 : at;
        return;
    }
    case NDM__RACC_ALL:
    case NDM__RACC_ANY: {
        bool all = acc == NDM__RACC_ALL, v = all;
        NDM__REF_LOOP({
            bool x = fl ? NDM__REF_X(p) != 0 : load_one_i(p, t) != 0;
            v = all ? v && x : v || x;
        });
        *oi = v;
        return;
    }
    case NDM__RACC_DEV: {
        double sum = 0;
        NDM__REF_LOOP(sum += NDM__REF_X(p));
        pre = R ? sum / (double)R : NAN;
        NDM__REF_LOOP({
            double d = NDM__REF_X(p) - pre;
            s += d * d;
            e += d;
        });
        break;
    }
    case NDM__RACC_LSE: {
        double m = -INFINITY;
        bool nan = false;
        NDM__REF_LOOP({
            double x = NDM__REF_X(p);
            if (isnan(x))
                nan = true;
            else if (x > m)
                m = x;
        });
        pre = nan ? NAN : m;
        if (!nan && !isinf(m))
            NDM__REF_LOOP(s += exp(NDM__REF_X(p) - m));
        break;
    }
    }
#undef NDM__REF_X
#undef NDM__REF_LOOP
    double v = ndm__reduce_finish(op, s, e, R, ddof, pre);
    if (ndm__reduce_int_value(op, t))
        *oi = ndm__sat_i64(v);
    else
        *od = v;
}

static ndm_status ref_reduce(int device, ndm__reduce_op op, const ndm__tensor *dst,
                             const ndm__tensor *src, int nred, int64_t ddof)
{
    (void)device;
    int nk = dst->ndim, nd = src->ndim;
    int64_t K = numel(nk, dst->shape), R = numel(nred, src->shape + nk);
    if (K == 0)
        return NDM_OK;
    odo ko, ro;
    if (!odo_get(&ko, nk))
        return NDM_E_OOM;
    if (!odo_get(&ro, nd)) {
        odo_put(&ko);
        return NDM_E_OOM;
    }
    size_t ses = ndm_dtype_size(src->dtype), des = ndm_dtype_size(dst->dtype);
    bool iout = ndm__reduce_int_value(op, src->dtype);
    do {
        const char *base = (const char *)src->data +
                           odo_offset(ko.idx, nk, src->strides) * (int64_t)ses;
        char *out = (char *)dst->data + odo_offset(ko.idx, nk, dst->strides) * (int64_t)des;
        double vd = 0;
        int64_t vi = 0;
        ref_one(op, src, nk, nred, base, R, ddof, ro.idx, &vd, &vi);
        store_row(dst->dtype, out, 1, 1, iout ? NULL : &vd, &vi);
    } while (odo_next(ko.idx, nk, dst->shape));
    odo_put(&ko);
    odo_put(&ro);
    return NDM_OK;
}

static ndm_status ref_softmax(int device, const ndm__tensor *dst, const ndm__tensor *src,
                              int axis, bool lg)
{
    (void)device;
    int nd = src->ndim;
    int64_t n = src->shape[axis];
    if (numel(nd, src->shape) == 0)
        return NDM_OK;
    odo o;
    if (!odo_get(&o, nd))
        return NDM_E_OOM;
    size_t ses = ndm_dtype_size(src->dtype), des = ndm_dtype_size(dst->dtype);
    /* Walk every line along `axis`: its index stays 0 in the odometer. */
    int64_t *shape = malloc((size_t)nd * sizeof *shape);
    if (!shape) {
        odo_put(&o);
        return NDM_E_OOM;
    }
    memcpy(shape, src->shape, (size_t)nd * sizeof *shape);
    shape[axis] = 1;
    do {
        const char *s = (const char *)src->data + odo_offset(o.idx, nd, src->strides) * (int64_t)ses;
        char *d = (char *)dst->data + odo_offset(o.idx, nd, dst->strides) * (int64_t)des;
        int64_t ss = src->strides[axis] * (int64_t)ses, ds = dst->strides[axis];
        double m = -INFINITY;
        bool nan = false;
        for (int64_t j = 0; j < n; j++) {
            double x = load_one_d(s + j * ss, src->dtype);
            if (isnan(x))
                nan = true;
            else if (x > m)
                m = x;
        }
        if (nan)
            m = NAN;
        double sum = 0;
        for (int64_t j = 0; j < n; j++)
            sum += exp(load_one_d(s + j * ss, src->dtype) - m);
        double ls = log(sum);
        for (int64_t j = 0; j < n; j++) {
            double x = load_one_d(s + j * ss, src->dtype);
            double v = lg ? (x - m) - ls : exp(x - m) / sum;
            store_row(dst->dtype, d + j * ds * (int64_t)des, 1, 1, &v, NULL);
        }
    } while (odo_next(o.idx, nd, shape));
    free(shape);
    odo_put(&o);
    return NDM_OK;
}

/* ---- fast kernels ---------------------------------------------------------------
 * The dispatcher's axes are coalesced and sorted so that the innermost axis
 * of each group (kept, reduced) has the smallest stride. Two layouts:
 *  - inner: the reduced axes are the fast ones; each output reduces rows
 *    (horizontal, in vector lanes).
 *  - outer: a kept axis is the fast one; a block of up to BL outputs along
 *    it accumulates row after row of the reduced axes (vertical).
 * Tasks are (group of outputs) x (part of the reduced range); the reduced
 * range is split only when there are too few groups for the threads. */
const struct ndm__backend_reduce ndm__cpu_ref_reduce = {
    .reduce = ref_reduce,
    .softmax = ref_softmax,
};
