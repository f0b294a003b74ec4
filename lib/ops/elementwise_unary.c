/* Elementwise unary operations (arithmetic, rounding, float functions,
 * activations, clamp, logical not) and their in-place forms. */
#include <string.h>

#include "autograd.h"
#include "elementwise.h"
#include "supports.h"

/* The computation and result dtypes of a unary op on dtype a; clamp's
 * bounds decide with the weak-scalar rules (ndm_clamp in the header). */
static ndm_status unop_types(ndm__ew_unop op, ndm_dtype a, const double *bounds, ndm_dtype *ct,
                             ndm_dtype *rt, const char *api, const ndm__site *site)
{
    ndm_dtype t = a;
    if (a == NDM_BOOL && ndm__ew_unop_has(op, NDM__EWF_NO_BOOL))
        return ndm__fail(NDM_E_DTYPE, api, *site, "%s of a bool array is not defined%s",
                         ndm__ew_unop_name(op),
                         op == NDM__EW_NEG ? " (use ndm_logical_not)" : "");
    if (ndm__ew_unop_is_float(op) && !ndm_dtype_is_float(a))
        t = NDM_F32;
    if (op == NDM__EW_CLAMP && !ndm_dtype_is_float(a)) {
        for (int i = 0; i < 2; i++)
            if (!ndm__ew_integral(bounds[i]) && !isinf(bounds[i]))
                t = NDM_F32;
    }
    if (ndm__ew_unop_has(op, NDM__EWF_BOOL))
        t = NDM_BOOL;
    *rt = t;
    *ct = ndm__ew_compute(t);
    return NDM_OK;
}

static void kernel_failed(ndm_status st, const char *api, const ndm__site *site)
{
    ndm__fail(st, api, *site, "elementwise kernel failed: %s", ndm_status_str(st));
}

/* clamp's bounds as two values of the computation dtype. */
static void bounds_value(const double *bounds, ndm_dtype a, ndm_dtype ct, unsigned char *buf)
{
    size_t es = ndm__ew_esize(ct);
    ndm_dtype via = ndm_dtype_is_float(a) ? a : ct;
    for (int i = 0; i < 2; i++) {
        /* Bounds saturate into the range of an integer dtype; bool's is [0, 1]. */
        double b = ct == NDM_BOOL ? (bounds[i] <= 0 ? 0.0 : 1.0) : bounds[i];
        ndm__ew_scalar_value(b, via, ct, buf + (size_t)i * es);
    }
}

static ndm_array unary(ndm__site site, const char *api, ndm_manager out, ndm__ew_unop op,
                       ndm_array ha, const double *bounds)
{
    NDM__OP_GUARD();
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return NDM_NULL_ARRAY;
    ndm_dtype ct, rt;
    if (unop_types(op, a->dtype, bounds, &ct, &rt, api, &site) < 0)
        return NDM_NULL_ARRAY;
    ndm__ew_target tg;
    ndm__array *o;
    ndm_array h = ndm__ew_new_for(a, op, ndm__ew_unop_name(op), rt, out, &tg, &o, api, &site);
    if (!h.id)
        return NDM_NULL_ARRAY;
    _Alignas(8) unsigned char params[16];
    if (bounds)
        bounds_value(bounds, a->dtype, ct, params);
    ndm__tensor to = ndm__ew_tensor(o), ta = ndm__ew_tensor(a);
    ndm_status st = tg.ew->unary(tg.index, op, ct, &to, &ta, bounds ? params : NULL);
    if (st < 0) {
        kernel_failed(st, api, &site);
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(rt)) {
        ndm__ag_params agp = {.i = {op}};
        if (bounds) {
            agp.s[0] = bounds[0];
            agp.s[1] = bounds[1];
        }
        ndm__ag_record(bounds ? NDM__AG_CLAMP : NDM__AG_UNARY, h, 1, &ha, &agp);
    }
    return h;
}

static ndm_status unary_inplace(ndm__site site, const char *api, ndm__ew_unop op, ndm_array ha,
                                const double *bounds)
{
    NDM__OP_GUARD();
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return ndm__ew_lookup_failed(ha);
    ndm_dtype ct, rt;
    ndm_status st = unop_types(op, a->dtype, bounds, &ct, &rt, api, &site);
    if (st < 0)
        return st;
    if (ndm__ew_kind(rt) > ndm__ew_kind(a->dtype)) {
        char desc[160];
        return ndm__fail(NDM_E_DTYPE, api, site,
                         "the result of %s is %s, which cannot be written into %s in place "
                         "(cast with ndm_astype or use the form that returns a new array)",
                         ndm__ew_unop_name(op), ndm_dtype_name(rt), ndm__array_desc(a, desc, sizeof desc));
    }
    if ((st = ndm__ew_check_writable(a, api, &site)) < 0)
        return st;
    ndm__ew_target tg;
    if (!ndm__ew_target_of(a, &tg, api, &site) ||
        NDM__DEVICE_DECLINES(a->storage->device, api, site, NDM__OPS_EW, op,
                             ndm__ew_unop_name(op), ndm__layout_of(a), 1, {a->dtype}))
        return ndm_last_status();
    _Alignas(8) unsigned char params[16];
    if (bounds)
        bounds_value(bounds, a->dtype, ct, params);
    ndm__tensor ta = ndm__ew_tensor(a);
    st = tg.ew->unary(tg.index, op, ct, &ta, &ta, bounds ? params : NULL);
    if (st < 0)
        kernel_failed(st, api, &site);
    return st < 0 ? st : NDM_OK;
}

#define NDM__EW_UNARY(name, OP)                                                 \
    NDM_API ndm_array ndm_##name##_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a) \
    {                                                                           \
        return unary(NDM__SITE, "ndm_" #name, out, OP, a, NULL);                    \
    }                                                                           \
    NDM_API ndm_status ndm_##name##_inplace_at(NDM_SITE_PARAMS, ndm_array a)    \
    {                                                                           \
        return unary_inplace(NDM__SITE, "ndm_" #name "_", OP, a, NULL);                 \
    }

/* Every operation of the list whose form is U; P (parameters) below. */
#define NDM__EW_FORM_U(name, OP) NDM__EW_UNARY(name, OP)
#define NDM__EW_FORM_P(name, OP)
#define NDM__EW_API_(ID, name, form, ...) NDM__EW_FORM_##form(name, NDM__EW_##ID)
NDM__EW_UNOPS(NDM__EW_API_)
#undef NDM__EW_API_

NDM_API ndm_array ndm_clamp_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double lo,
                                  double hi)
{
    NDM__OP_GUARD();
    double bounds[2] = {lo, hi};
    return unary(NDM__SITE, "ndm_clamp", out, NDM__EW_CLAMP, a, bounds);
}

NDM_API ndm_status ndm_clamp_inplace_at(NDM_SITE_PARAMS, ndm_array a, double lo, double hi)
{
    NDM__OP_GUARD();
    double bounds[2] = {lo, hi};
    return unary_inplace(NDM__SITE, "ndm_clamp_", NDM__EW_CLAMP, a, bounds);
}
