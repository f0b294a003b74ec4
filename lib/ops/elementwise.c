/* Elementwise binary operations with numpy broadcasting: arithmetic,
 * comparisons and logic, their scalar and in-place forms, and where. */
#include <inttypes.h>
#include <string.h>

#include "autograd.h"
#include "elementwise.h"
#include "../manager/create.h"
#include "supports.h"

/* ---- shared helpers ------------------------------------------------------ */

bool ndm__ew_dims_get(ndm__ew_dims *d, int ndim, const char *api, const ndm__site *site)
{
    size_t cap = ndim > 0 ? (size_t)ndim : 1;
    int64_t *m = d->small;
    d->heap = NULL;
    if (cap > NDM__EW_SMALL) {
        d->heap = ndm__malloc(4 * cap * sizeof(int64_t), NDM__INJ_SCRATCH);
        if (!d->heap) {
            ndm__fail(NDM_E_OOM, api, *site, "no memory for a rank-%d shape", ndim);
            return false;
        }
        m = d->heap;
    }
    d->shape = m;
    d->s0 = m + cap;
    d->s1 = m + 2 * cap;
    d->s2 = m + 3 * cap;
    return true;
}

const ndm__backend_ew *ndm__ew_no_backend(ndm_device dev, const char *api, const ndm__site *site)
{
    const ndm__backend *b = ndm__backend_of(dev, api, *site);
    if (b)
        ndm__fail(NDM_E_UNSUPPORTED, api, *site, "the %s backend has no elementwise kernels",
                  b->name);
    return NULL;
}

ndm_status ndm__ew_device_mismatch(const ndm__array *a, const ndm__array *b, const char *api,
                                   const ndm__site *site)
{
    char d1[160], d2[160], n1[32], n2[32];
    return ndm__fail(NDM_E_DEVICE, api, *site, "%s is on %s but %s is on %s (copy one first)",
                     ndm__array_desc(a, d1, sizeof d1),
                     ndm_device_str(a->storage->device, n1, sizeof n1),
                     ndm__array_desc(b, d2, sizeof d2),
                     ndm_device_str(b->storage->device, n2, sizeof n2));
}

ndm_status ndm__ew_not_writable(const ndm__array *dst, int axis, const char *api,
                                const ndm__site *site)
{
    char desc[160];
    return ndm__fail(NDM_E_INVALID, api, *site,
                     "cannot write into %s in place: axis %d repeats one element "
                     "(a broadcast view); make a copy first",
                     ndm__array_desc(dst, desc, sizeof desc), axis);
}

ndm_dtype ndm__ew_promote(ndm_dtype a, ndm_dtype b)
{
    /* 0 is "not computed yet"; racing fills store the same value. */
    static _Atomic unsigned char table[NDM_DTYPE_COUNT][NDM_DTYPE_COUNT];
    unsigned v = atomic_load_explicit(&table[a][b], memory_order_relaxed);
    if (NDM__UNLIKELY(!v)) {
        v = 1u + (unsigned)ndm_result_type(a, b);
        atomic_store_explicit(&table[a][b], (unsigned char)v, memory_order_relaxed);
    }
    return (ndm_dtype)(v - 1);
}

/* Bytes [lo, hi) a view touches; false for an empty view. */
static bool extent(const ndm__tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    int64_t es = (int64_t)ndm__ew_esize(t->dtype), l = 0, h = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            return false;
        int64_t span = t->strides[i] * (t->shape[i] - 1) * es;
        if (span < 0)
            l += span;
        else
            h += span;
    }
    *lo = (uintptr_t)t->data + (uintptr_t)l;
    *hi = (uintptr_t)t->data + (uintptr_t)h + (uintptr_t)es;
    return true;
}

ndm_status ndm__ew_unalias(const ndm__array *dst, const ndm__array *in, ndm__tensor *view,
                           ndm__ew_scratch *scratch, const char *api, const ndm__site *sitep)
{
    ndm__site site = *sitep;
    scratch->block = (ndm__block){NULL, NULL, 0};
    /* Storages from the allocator never overlap; wrapped buffers might. */
    if (dst->storage != in->storage && dst->storage->cookie && in->storage->cookie)
        return NDM_OK;
    ndm__tensor d = ndm__ew_tensor(dst);
    uintptr_t dl, dh, il, ih;
    if (!extent(&d, &dl, &dh) || !extent(view, &il, &ih) || ih <= dl || dh <= il)
        return NDM_OK;
    /* The same elements in the same places: each is read before it is written. */
    bool same = view->data == d.data && ndm__ew_esize(view->dtype) == ndm__ew_esize(d.dtype);
    for (int i = 0; same && i < d.ndim; i++)
        same = d.shape[i] == 1 || view->strides[i] == d.strides[i];
    if (same)
        return NDM_OK;
    /* Copy the input's own elements (not the broadcast) and read the copy. */
    int64_t n = ndm__numel(in->ndim, in->shape);
    size_t es = ndm__ew_esize(in->dtype);
    ndm_device dev = in->storage->device;
    ndm__alloc_tag tag = {0, site.file, site.func, site.line, NULL, false};
    if (ndm__alloc(dev, (size_t)n * es, &tag, &scratch->block) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", ndm_last_error());
        return ndm__fail(NDM_E_OOM, api, site, "no scratch for an overlapping input: %s", why);
    }
    scratch->device = dev;
    int64_t small[16];
    int64_t *cs = in->ndim <= 16
                      ? small
                      : ndm__malloc(sizeof(int64_t) * (size_t)in->ndim, NDM__INJ_SCRATCH);
    if (!cs) {
        ndm__ew_scratch_free(scratch);
        return ndm__fail(NDM_E_OOM, api, site, "no memory for strides");
    }
    ndm__contiguous_strides(in->ndim, in->shape, cs);
    ndm__tensor src = ndm__ew_tensor(in);
    ndm__tensor copy = {scratch->block.ptr, in->dtype, in->ndim, in->shape, cs};
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    ndm_status st = b ? b->copy(dev.index, &copy, &src) : NDM_E_UNSUPPORTED;
    if (st < 0) {
        if (cs != small)
            free(cs);
        ndm__ew_scratch_free(scratch);
        return b ? ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st)) : st;
    }
    /* Broadcast strides over the copy: rewrite the view's own stride row. */
    int64_t *vs = (int64_t *)view->strides;
    int lead = view->ndim - in->ndim;
    for (int j = 0; j < view->ndim; j++)
        vs[j] = j < lead || in->shape[j - lead] == 1 ? 0 : cs[j - lead];
    view->data = scratch->block.ptr;
    if (cs != small)
        free(cs);
    return NDM_OK;
}

void ndm__ew_scratch_free(ndm__ew_scratch *scratch)
{
    if (scratch->block.ptr)
        ndm__free(scratch->device, &scratch->block);
}

bool ndm__ew_fits(double s, ndm_dtype t)
{
    if (!ndm__ew_integral(s))
        return false;
    switch (t) {
    case NDM_BOOL: return s == 0 || s == 1;
    case NDM_U8: return s >= 0 && s <= 255;
    case NDM_I32: return s >= -2147483648.0 && s <= 2147483647.0;
    case NDM_I64: return s >= -9223372036854775808.0 && s < 9223372036854775808.0;
    default: return true;
    }
}

void ndm__ew_scalar_value(double s, ndm_dtype via, ndm_dtype ct, void *buf)
{
    switch (ct) {
    case NDM_F32: {
        float f = (float)s;
        if (via == NDM_F16)
            f = ndm_f16_to_f32(ndm_f32_to_f16(f));
        else if (via == NDM_BF16)
            f = ndm_bf16_to_f32(ndm_f32_to_bf16(f));
        memcpy(buf, &f, sizeof f);
        break;
    }
    case NDM_F64: memcpy(buf, &s, sizeof s); break;
    default: {
        /* saturating, as a cast does; callers checked the fit where it matters */
        int64_t v = s != s ? 0
                    : s >= 9223372036854775808.0 ? INT64_MAX
                    : s <= -9223372036854775808.0 ? INT64_MIN
                                                  : (int64_t)s;
        if (ct == NDM_BOOL) {
            uint8_t x = s != 0;
            memcpy(buf, &x, 1);
        } else if (ct == NDM_U8) {
            uint8_t x = v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
            memcpy(buf, &x, 1);
        } else if (ct == NDM_I32) {
            int32_t x = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
            memcpy(buf, &x, 4);
        } else {
            memcpy(buf, &v, 8);
        }
        break;
    }
    }
}

static void kernel_failed(ndm_status st, const char *api, const ndm__site *site)
{
    ndm__fail(st, api, *site, "elementwise kernel failed: %s", ndm_status_str(st));
}

static bool same_shape(const ndm__array *a, const ndm__array *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* b's strides read as if b had dst's shape; NDM_E_SHAPE unless b broadcasts
 * to exactly that shape (an in-place destination cannot grow). */
static ndm_status broadcast_into(const ndm__array *dst, const ndm__array *b, int64_t *strides,
                                 const char *api, const ndm__site *site)
{
    int lead = dst->ndim - b->ndim;
    bool ok = lead >= 0;
    for (int j = 0; ok && j < b->ndim; j++)
        ok = b->shape[j] == dst->shape[lead + j] || b->shape[j] == 1;
    if (!ok) {
        char d1[160], d2[160];
        return ndm__fail(NDM_E_SHAPE, api, *site,
                         "cannot broadcast %s into %s (an in-place result keeps the shape of "
                         "its destination)",
                         ndm__array_desc(b, d1, sizeof d1), ndm__array_desc(dst, d2, sizeof d2));
    }
    ndm__broadcast_strides(b, dst->ndim, dst->shape, strides);
    return NDM_OK;
}

/* An in-place result of dtype rt must be storable in dst (same kind or
 * higher, as numpy's same_kind casting). */
static ndm_status storable(ndm_dtype rt, const ndm__array *dst, const char *what,
                           const char *api, const ndm__site *site)
{
    if (ndm__ew_kind(rt) <= ndm__ew_kind(dst->dtype))
        return NDM_OK;
    char desc[160];
    return ndm__fail(NDM_E_DTYPE, api, *site,
                     "the result of %s is %s, which cannot be written into %s in place "
                     "(cast with ndm_astype or use the form that returns a new array)",
                     what, ndm_dtype_name(rt), ndm__array_desc(dst, desc, sizeof desc));
}

/* ---- dtype rules --------------------------------------------------------- */

/* Array with array: the computation dtype ct and the result dtype rt. */
static ndm_status binop_types(ndm__ew_binop op, ndm_dtype a, ndm_dtype b, ndm_dtype *ct,
                              ndm_dtype *rt, const char *api, const ndm__site *site)
{
    ndm_dtype t = ndm__ew_promote(a, b);
    if (ndm__ew_binop_has(op, NDM__EWF_BOOL)) {
        *ct = *rt = NDM_BOOL;
        return NDM_OK;
    }
    if (ndm__ew_binop_is_bool(op)) {
        *ct = ndm__ew_compute(t);
        *rt = NDM_BOOL;
        return NDM_OK;
    }
    if (ndm__ew_binop_has(op, NDM__EWF_FLOAT) && !ndm_dtype_is_float(t))
        t = NDM_F32; /* true division */
    if (t == NDM_BOOL && ndm__ew_binop_has(op, NDM__EWF_NO_BOOL))
        return ndm__fail(NDM_E_DTYPE, api, *site,
                         "%s of two bool arrays is not defined (%s)", ndm__ew_binop_name(op),
                         op == NDM__EW_SUB ? "use ndm_logical_xor, or cast to an integer dtype"
                                           : "cast to an integer dtype first");
    *rt = t;
    *ct = ndm__ew_compute(t);
    return NDM_OK;
}

/* Array with a scalar (see the header for the rules). `via` is the dtype the
 * scalar is rounded through before it joins the computation. */
static ndm_status scalar_types(ndm__ew_binop op, ndm_dtype a, double s, ndm_dtype *ct,
                               ndm_dtype *rt, ndm_dtype *via, const char *api,
                               const ndm__site *site)
{
    int kind = ndm__ew_kind(a);
    if (ndm__ew_binop_is_bool(op)) {
        if (kind == NDM__KIND_FLOAT) {
            *ct = ndm__ew_compute(a);
            *via = a;
        } else if (ndm__ew_fits(s, a)) {
            *ct = *via = a;
        } else {
            *ct = *via = NDM_F64; /* exact for every bool, u8 and i32 value */
        }
        *rt = NDM_BOOL;
        return NDM_OK;
    }
    bool integral = ndm__ew_integral(s);
    ndm_dtype t = kind == NDM__KIND_FLOAT ? a
                  : !integral             ? NDM_F32
                  : kind == NDM__KIND_BOOL ? NDM_I64
                                           : a;
    if (ndm__ew_binop_has(op, NDM__EWF_FLOAT) && !ndm_dtype_is_float(t))
        t = NDM_F32;
    if (!ndm_dtype_is_float(t) && !ndm__ew_fits(s, t))
        return ndm__fail(NDM_E_INVALID, api, *site,
                         "the scalar %.17g does not fit %s, the dtype of the result of %s "
                         "(cast the array first)",
                         s, ndm_dtype_name(t), ndm__ew_binop_name(op));
    *rt = t;
    *ct = ndm__ew_compute(t);
    *via = kind == NDM__KIND_FLOAT ? a : t;
    return NDM_OK;
}

/* ---- binary -------------------------------------------------------------- */

/* The flat path: both inputs of one dtype t that is also the result and the
 * computation dtype (an arithmetic op on a type that needs no conversion),
 * the same shape, both C-contiguous. Returns the element count, or -1. */
#define FLAT_ANY_ \
    ((1u << NDM_U8) | (1u << NDM_I32) | (1u << NDM_I64) | (1u << NDM_F32) | (1u << NDM_F64))
#define FLAT_FLOAT_ ((1u << NDM_F32) | (1u << NDM_F64))
/* Those dtypes, one bit each, per operation: none for a bool result, f32
 * and f64 for a float function, else every type but bool and the halves. */
#define FLAT_DTYPES_(ID, name, form, flags, ...)                                    \
    (unsigned char)(((flags) & NDM__EWF_BOOL_OUT) ? 0u                              \
                    : ((flags) & NDM__EWF_FLOAT)  ? FLAT_FLOAT_                     \
                                                  : FLAT_ANY_),
static const unsigned char flat_dtypes[NDM__EW_BINOP_COUNT] = {NDM__EW_BINOPS(FLAT_DTYPES_)};
#undef FLAT_DTYPES_
#undef FLAT_FLOAT_
#undef FLAT_ANY_

/* (t: a live array's dtype, below NDM_DTYPE_COUNT) */
static inline bool flat_dtype(ndm__ew_binop op, ndm_dtype t)
{
    return (flat_dtypes[op] >> (unsigned)t) & 1u;
}

static inline int64_t flat_count(ndm__ew_binop op, const ndm__array *a, const ndm__array *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim || !flat_dtype(op, a->dtype))
        return -1;
    /* one walk: the same sizes, both C-contiguous */
    const int64_t *sa = a->shape, *sb = b->shape, *ta = a->strides, *tb = b->strides;
    int64_t n = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        int64_t e = sa[i];
        if (e != sb[i] || (e != 1 && (ta[i] != n || tb[i] != n)))
            return -1;
        n *= e;
    }
    return n;
}

/* The fast paths' start: both records, looked up quietly, and their element
 * count when they make the flat case (see binary) on one device; false
 * sends the caller to its general path, which looks up again and writes
 * the messages. */
static NDM__ALWAYS_INLINE bool flat_operands(ndm__ew_binop op, ndm_array ha, ndm_array hb,
                                             ndm__array **pa, ndm__array **pb, int64_t *n)
{
    ndm__array *a = ndm__array_peek(ha);
    ndm__array *b = NDM__LIKELY(a != NULL) ? ndm__array_peek(hb) : NULL;
    if (NDM__UNLIKELY(!b) || (*n = flat_count(op, a, b)) < 0 || !ndm__ew_same_device_quiet(a, b))
        return false;
    *pa = a;
    *pb = b;
    return true;
}

/* The general path of binary: broadcasting, promotion and strided operands
 * (the caller entered the operation, see binary). */
static NDM__EW_NOINLINE ndm_array binary_any(const ndm__site *sitep, const char *api, ndm_manager out,
                                          ndm__ew_binop op, ndm_array ha, ndm_array hb)
{
    ndm__site site = *sitep;
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return NDM_NULL_ARRAY;
    ndm__array *b = ndm__array_get_prop(hb, api, site);
    if (!b || ndm__ew_same_device(a, b, api, &site) < 0)
        return NDM_NULL_ARRAY;
    ndm_dtype ct, rt;
    if (binop_types(op, a->dtype, b->dtype, &ct, &rt, api, &site) < 0)
        return NDM_NULL_ARRAY;
    ndm__ew_target tg;
    if (!ndm__ew_target_of(a, &tg, api, &site) || NDM__DEVICE_DECLINES(a->storage->device, api, site, NDM__OPS_EW, op, ndm__ew_binop_name(op),
                                 ndm__layout_of(a) | ndm__layout_of(b) |
                                     (same_shape(a, b) ? 0u : NDM__LAYOUT_BROADCAST),
                                 2, {a->dtype, b->dtype}))
        return NDM_NULL_ARRAY;
    ndm__ew_dims d;
    d.heap = NULL;
    int nd = a->ndim;
    const int64_t *shape = a->shape, *sa = a->strides, *sb = b->strides;
    ndm_array h = NDM_NULL_ARRAY;
    if (!same_shape(a, b)) {
        ndm__array *in[2] = {a, b};
        if (!ndm__ew_dims_get(&d, ndm__max_ndim(2, in), api, &site) ||
            ndm__broadcast_shape(2, in, d.shape, &nd, api, site) < 0)
            goto done;
        ndm__broadcast_strides(a, nd, d.shape, d.s0);
        ndm__broadcast_strides(b, nd, d.shape, d.s1);
        shape = d.shape;
        sa = d.s0;
        sb = d.s1;
    }
    ndm__manager *m = ndm__output_record(out, a, api, &site);
    ndm__array *o;
    if (!m || !(h = ndm__array_new_in(&site, api, m, tg.dev, rt, nd, shape, &o)).id)
        goto done;
    ndm__tensor to = ndm__ew_tensor(o);
    ndm__tensor ta = {ndm__ew_ptr(a), a->dtype, nd, shape, sa};
    ndm__tensor tb = {ndm__ew_ptr(b), b->dtype, nd, shape, sb};
    ndm_status st = tg.ew->binary(tg.index, op, ct, &to, &ta, &tb);
    if (st < 0) {
        kernel_failed(st, api, &site);
        ndm__discard(h);
        h = NDM_NULL_ARRAY;
    } else if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(rt)) {
        ndm__ag_params agp = {.i = {op}};
        ndm__ag_record(NDM__AG_BINARY, h, 2, (ndm_array[]){ha, hb}, &agp);
    }
done:
    ndm__ew_dims_put(&d);
    return h;
}

/* Every binary operation with a new result starts here: the operation is
 * entered, both handles looked up once, and two operands of one dtype and
 * one shape, both C-contiguous, on one device whose table has the flat
 * entry, go straight to it (no promotion, broadcast or plan), into an array
 * made inline with the bytes of the inputs' shape (a live array's shape,
 * checked when it was made). Anything else, a failed lookup included (whose
 * message the general path writes), takes binary_any. */
static NDM__EW_NOINLINE ndm_array binary(const ndm__site *site, const char *api, ndm_manager out,
                                     ndm__ew_binop op, ndm_array ha, ndm_array hb)
{
    NDM__OP_GUARD();
    ndm__array *a, *b;
    int64_t n;
    ndm__ew_target tg;
    if (!flat_operands(op, ha, hb, &a, &b, &n) || !ndm__ew_target_quiet(a, &tg) ||
        !tg.ew->binary_flat || NDM__UNLIKELY(tg.dev.type != NDM_DEVICE_CPU))
        return binary_any(site, api, out, op, ha, hb); /* (a device with a supports table) */
    /* (the guard's thread state, read once for the operation) */
    ndm__thread *th = ndm__op_guard_.t;
    ndm__manager *m = ndm__output_record_as(th, out, a, api, site);
    ndm__array *o;
    ndm_array h;
    if (!m || !(h = ndm__array_new_sized(th, site, api, m, tg.dev, a->dtype, a->ndim, a->shape,
                                          (size_t)n * ndm__ew_esize(a->dtype), &o))
                   .id)
        return NDM_NULL_ARRAY;
    /* (o: a new array, its own storage from its start) */
    ndm_status st = tg.ew->binary_flat(tg.index, op, a->dtype, o->own.data, ndm__ew_ptr(a),
                                       ndm__ew_ptr(b), n);
    if (NDM__UNLIKELY(st < 0)) {
        kernel_failed(st, api, site);
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(a->dtype)) {
        ndm__ag_params agp = {.i = {op}};
        ndm__ag_record(NDM__AG_BINARY, h, 2, (ndm_array[]){ha, hb}, &agp);
    }
    return h;
}

static ndm_array binary_scalar(ndm__site site, const char *api, ndm_manager out,
                               ndm__ew_binop op, ndm_array ha, double s, bool swap)
{
    NDM__OP_GUARD();
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return NDM_NULL_ARRAY;
    ndm_dtype ct, rt, via;
    if (scalar_types(op, a->dtype, s, &ct, &rt, &via, api, &site) < 0)
        return NDM_NULL_ARRAY;
    ndm__ew_target tg;
    ndm__array *o;
    ndm_array h = ndm__ew_new_for(a, op, ndm__ew_binop_name(op), rt, out, &tg, &o, api, &site);
    if (!h.id)
        return NDM_NULL_ARRAY;
    _Alignas(8) unsigned char value[8];
    ndm__ew_scalar_value(s, via, ct, value);
    ndm__tensor to = ndm__ew_tensor(o), ta = ndm__ew_tensor(a);
    ndm_status st = tg.ew->binary_scalar(tg.index, op, ct, &to, &ta, value, swap);
    if (st < 0) {
        kernel_failed(st, api, &site);
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(rt)) {
        ndm__ag_params agp = {.i = {op, swap}, .s = {s}};
        ndm__ag_record(NDM__AG_SCALAR, h, 1, &ha, &agp);
    }
    return h;
}

/* The general path of binary_inplace (the caller entered the operation). */
static NDM__EW_NOINLINE ndm_status binary_inplace_any(const ndm__site *sitep, const char *api,
                                                   ndm__ew_binop op, ndm_array ha, ndm_array hb)
{
    ndm__site site = *sitep;
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return ndm__ew_lookup_failed(ha);
    ndm__array *b = ndm__array_get_prop(hb, api, site);
    if (!b)
        return ndm__ew_lookup_failed(hb);
    ndm_status st = ndm__ew_same_device(a, b, api, &site);
    ndm_dtype ct, rt;
    if (st < 0 || (st = binop_types(op, a->dtype, b->dtype, &ct, &rt, api, &site)) < 0 ||
        (st = storable(rt, a, ndm__ew_binop_name(op), api, &site)) < 0 ||
        (st = ndm__ew_check_writable(a, api, &site)) < 0)
        return st;
    ndm__ew_target tg;
    if (!ndm__ew_target_of(a, &tg, api, &site))
        return ndm_last_status();
    if (NDM__DEVICE_DECLINES(a->storage->device, api, site, NDM__OPS_EW, op, ndm__ew_binop_name(op),
                             ndm__layout_of(a) | ndm__layout_of(b) |
                                 (same_shape(a, b) ? 0u : NDM__LAYOUT_BROADCAST),
                             2, {a->dtype, b->dtype}))
        return NDM_E_UNSUPPORTED;
    ndm__ew_dims d;
    d.heap = NULL;
    ndm__ew_scratch scratch;
    scratch.block.ptr = NULL;
    ndm__tensor ta = ndm__ew_tensor(a);
    ndm__tensor tb = {ndm__ew_ptr(b), b->dtype, a->ndim, a->shape, b->strides};
    if (!same_shape(a, b)) {
        if (!ndm__ew_dims_get(&d, a->ndim, api, &site))
            return NDM_E_OOM;
        if ((st = broadcast_into(a, b, d.s1, api, &site)) < 0)
            goto done;
        tb.strides = d.s1;
    } else if (a->storage == b->storage || !a->storage->cookie ||
               !b->storage->cookie) {
        /* the overlap check may rewrite the strides: give it a copy */
        if (!ndm__ew_dims_get(&d, a->ndim, api, &site))
            return NDM_E_OOM;
        memcpy(d.s1, b->strides, sizeof(int64_t) * (size_t)a->ndim);
        tb.strides = d.s1;
    }
    if ((st = ndm__ew_unalias(a, b, &tb, &scratch, api, &site)) < 0)
        goto done;
    st = tg.ew->binary(tg.index, op, ct, &ta, &ta, &tb);
    if (st < 0)
        kernel_failed(st, api, &site);
done:
    ndm__ew_scratch_free(&scratch);
    ndm__ew_dims_put(&d);
    return st < 0 ? st : NDM_OK;
}

/* Every binary operation in place starts here, as binary does: the flat
 * case (see there) when b cannot overlap a other than element for element
 * (storages from the allocator never overlap) goes straight to the table's
 * flat entry; anything else takes binary_inplace_any. */
static NDM__EW_NOINLINE ndm_status binary_inplace(const ndm__site *site, const char *api,
                                              ndm__ew_binop op, ndm_array ha, ndm_array hb)
{
    NDM__OP_GUARD();
    ndm__array *a, *b;
    int64_t n;
    ndm__ew_target tg;
    if (!flat_operands(op, ha, hb, &a, &b, &n))
        return binary_inplace_any(site, api, op, ha, hb);
    void *pa = ndm__ew_ptr(a), *pb = ndm__ew_ptr(b);
    if (!((a->storage != b->storage && a->storage->cookie && b->storage->cookie) || pa == pb) ||
        !ndm__ew_target_quiet(a, &tg) || !tg.ew->binary_flat ||
        NDM__UNLIKELY(tg.dev.type != NDM_DEVICE_CPU))
        return binary_inplace_any(site, api, op, ha, hb);
    ndm_status st = tg.ew->binary_flat(tg.index, op, a->dtype, pa, pa, pb, n);
    if (NDM__UNLIKELY(st < 0)) {
        kernel_failed(st, api, site);
        return st;
    }
    return NDM_OK;
}

static ndm_status binary_scalar_inplace(ndm__site site, const char *api, ndm__ew_binop op,
                                        ndm_array ha, double s, bool swap)
{
    NDM__OP_GUARD();
    ndm__array *a = ndm__array_get_prop(ha, api, site);
    if (!a)
        return ndm__ew_lookup_failed(ha);
    ndm_dtype ct, rt, via;
    ndm_status st = scalar_types(op, a->dtype, s, &ct, &rt, &via, api, &site);
    if (st < 0 || (st = storable(rt, a, ndm__ew_binop_name(op), api, &site)) < 0 ||
        (st = ndm__ew_check_writable(a, api, &site)) < 0)
        return st;
    ndm__ew_target tg;
    if (!ndm__ew_target_of(a, &tg, api, &site) ||
        NDM__DEVICE_DECLINES(a->storage->device, api, site, NDM__OPS_EW, op,
                             ndm__ew_binop_name(op), ndm__layout_of(a), 1, {a->dtype}))
        return ndm_last_status();
    _Alignas(8) unsigned char value[8];
    ndm__ew_scalar_value(s, via, ct, value);
    ndm__tensor ta = ndm__ew_tensor(a);
    st = tg.ew->binary_scalar(tg.index, op, ct, &ta, &ta, value, swap);
    if (st < 0)
        kernel_failed(st, api, &site);
    return st < 0 ? st : NDM_OK;
}

/* ---- public entry points ------------------------------------------------- */

#define NDM__EW_BINARY(name, OP)                                                \
    NDM_API ndm_array ndm_##name##_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, \
                                         ndm_array b)                           \
    {                                                                           \
        ndm__site site_ = NDM__SITE;                                            \
        return binary(&site_, "ndm_" #name, out, OP, a, b);                     \
    }
#define NDM__EW_SCALAR(name, OP, SWAP)                                          \
    NDM_API ndm_array ndm_##name##_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, \
                                         double s)                              \
    {                                                                           \
        return binary_scalar(NDM__SITE, "ndm_" #name, out, OP, a, s, SWAP);         \
    }
#define NDM__EW_INPLACE(name, OP)                                               \
    NDM_API ndm_status ndm_##name##_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b) \
    {                                                                           \
        ndm__site site_ = NDM__SITE;                                            \
        return binary_inplace(&site_, "ndm_" #name "_", OP, a, b);              \
    }
#define NDM__EW_SCALAR_INPLACE(name, OP, SWAP)                                  \
    NDM_API ndm_status ndm_##name##_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s) \
    {                                                                           \
        return binary_scalar_inplace(NDM__SITE, "ndm_" #name "_", OP, a, s, SWAP);      \
    }

/* The forms of each operation, by its list's `form` column. */
#define NDM__EW_FORM_LOGIC(name, OP) NDM__EW_BINARY(name, OP)
#define NDM__EW_FORM_CMP(name, OP)                                              \
    NDM__EW_BINARY(name, OP)                                                    \
    NDM__EW_SCALAR(name##_scalar, OP, false)
#define NDM__EW_FORM_ARITH(name, OP)                                            \
    NDM__EW_FORM_CMP(name, OP)                                                  \
    NDM__EW_INPLACE(name, OP)                                                   \
    NDM__EW_SCALAR_INPLACE(name##_scalar, OP, false)
#define NDM__EW_FORM_ARITH_R(name, OP)                                          \
    NDM__EW_FORM_ARITH(name, OP)                                                \
    NDM__EW_SCALAR(r##name##_scalar, OP, true)                                  \
    NDM__EW_SCALAR_INPLACE(r##name##_scalar, OP, true)
#define NDM__EW_FORM_ARITH_RN(name, OP)                                         \
    NDM__EW_FORM_ARITH(name, OP)                                                \
    NDM__EW_SCALAR(r##name##_scalar, OP, true)
#define NDM__EW_API_(ID, name, form, ...) NDM__EW_FORM_##form(name, NDM__EW_##ID)
NDM__EW_BINOPS(NDM__EW_API_)
#undef NDM__EW_API_

/* ---- where --------------------------------------------------------------- */

NDM_API ndm_array ndm_where_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array cond, ndm_array a,
                                  ndm_array b)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_where";
    ndm__array *c = ndm__array_get_prop(cond, api, site);
    if (!c)
        return NDM_NULL_ARRAY;
    ndm__array *x = ndm__array_get_prop(a, api, site);
    if (!x)
        return NDM_NULL_ARRAY;
    ndm__array *y = ndm__array_get_prop(b, api, site);
    if (!y || ndm__ew_same_device(c, x, api, &site) < 0 ||
        ndm__ew_same_device(c, y, api, &site) < 0)
        return NDM_NULL_ARRAY;
    ndm_dtype rt = ndm_result_type(x->dtype, y->dtype);
    ndm__ew_target tg;
    if (!ndm__ew_target_of(c, &tg, api, &site) ||
        NDM__DEVICE_DECLINES(tg.dev, api, site, NDM__OPS_EW, 0, "where",
                             ndm__layout_of(c) | ndm__layout_of(x) | ndm__layout_of(y) |
                                 (same_shape(c, x) && same_shape(c, y) ? 0u
                                                                       : NDM__LAYOUT_BROADCAST),
                             3, {c->dtype, x->dtype, y->dtype}))
        return NDM_NULL_ARRAY;
    ndm__array *in[3] = {c, x, y};
    ndm__ew_dims d;
    int nd;
    ndm_array h = NDM_NULL_ARRAY;
    if (!ndm__ew_dims_get(&d, ndm__max_ndim(3, in), api, &site))
        return h;
    if (ndm__broadcast_shape(3, in, d.shape, &nd, api, site) < 0)
        goto done;
    ndm__broadcast_strides(c, nd, d.shape, d.s0);
    ndm__broadcast_strides(x, nd, d.shape, d.s1);
    ndm__broadcast_strides(y, nd, d.shape, d.s2);
    /* The output rule's first input is cond. */
    ndm_manager m = ndm__output_manager(out, c, api, site);
    ndm__array *o;
    if (!m.id || !(h = ndm__array_new_on(site, api, m, tg.dev, rt, nd, d.shape, &o)).id)
        goto done;
    ndm__tensor to = ndm__ew_tensor(o);
    ndm__tensor tc = {ndm__ew_ptr(c), c->dtype, nd, d.shape, d.s0};
    ndm__tensor tx = {ndm__ew_ptr(x), x->dtype, nd, d.shape, d.s1};
    ndm__tensor ty = {ndm__ew_ptr(y), y->dtype, nd, d.shape, d.s2};
    ndm_status st = tg.ew->where(tg.index, ndm__ew_compute(rt), &to, &tc, &tx, &ty);
    if (st < 0) {
        kernel_failed(st, api, &site);
        ndm__discard(h);
        h = NDM_NULL_ARRAY;
    } else if (NDM__UNLIKELY(ndm__ag_on()) && ndm_dtype_is_float(rt)) {
        ndm__ag_record(NDM__AG_WHERE, h, 3, (ndm_array[]){cond, a, b}, NULL);
    }
done:
    ndm__ew_dims_put(&d);
    return h;
}
