/* Reference elementwise kernels: one element at a time in plain C with libm,
 * float results computed in double and rounded once. They are the oracle the
 * fast kernels (and other backends) are tested against, not a fast path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ew_scalar.h"
#include "convert.h"
#include "ew_cpu.h"
#include "iter.h"

/* ---- loads and stores ---------------------------------------------------- */

static double ld_f64(const char *p, ndm_dtype dt)
{
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8: return *(const uint8_t *)p;
    case NDM_I32: return *(const int32_t *)p;
    case NDM_I64: return (double)*(const int64_t *)p;
    case NDM_F16: return ndm_f16_to_f32(*(const uint16_t *)p);
    case NDM_BF16: return ndm_bf16_to_f32(*(const uint16_t *)p);
    case NDM_F32: return *(const float *)p;
    case NDM_F64: return *(const double *)p;
    }
    return 0;
}

/* The f32 value of an element, converted directly (no double rounding). */
static float ld_f32(const char *p, ndm_dtype dt)
{
    switch (dt) {
    case NDM_I64: return (float)*(const int64_t *)p;
    case NDM_F64: return (float)*(const double *)p;
    default: return (float)ld_f64(p, dt);
    }
}

/* An element as an integer of the computation dtype ct (bool: != 0). */
static int64_t ld_int(const char *p, ndm_dtype dt, ndm_dtype ct)
{
    if (ct == NDM_BOOL)
        return ld_f64(p, dt) != 0; /* NaN is true */
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8: return *(const uint8_t *)p;
    case NDM_I32: return *(const int32_t *)p;
    case NDM_I64: return *(const int64_t *)p;
    default: return NDM__ST_i64(ld_f64(p, dt));
    }
}

/* Reduce an integer to the range of ct, wrapping. */
static int64_t wrap(int64_t v, ndm_dtype ct)
{
    switch (ct) {
    case NDM_BOOL: return v != 0;
    case NDM_U8: return (uint8_t)v;
    case NDM_I32: return (int32_t)v;
    default: return v;
    }
}

#define NDM__REF_STORE(N, E, T)                                                 \
    case E:                                                                     \
        *(T *)p = NDM__ST_##N(v);                                               \
        break;
static void st_float(char *p, ndm_dtype dt, float v)
{
    switch (dt) { NDM__CPU_DTYPES(NDM__REF_STORE) }
}
static void st_double(char *p, ndm_dtype dt, double v)
{
    switch (dt) { NDM__CPU_DTYPES(NDM__REF_STORE) }
}
static void st_int(char *p, ndm_dtype dt, int64_t v)
{
    switch (dt) { NDM__CPU_DTYPES(NDM__REF_STORE) }
}

/* A value in the computation dtype: integers (bool included) in i, floats in f. */
typedef struct val {
    int64_t i;
    double f;
} val;

static val ld(const char *p, ndm_dtype dt, ndm_dtype ct)
{
    val v = {0, 0};
    if (ct == NDM_F32)
        v.f = ld_f32(p, dt);
    else if (ct == NDM_F64)
        v.f = ld_f64(p, dt);
    else
        v.i = ld_int(p, dt, ct);
    return v;
}

static void st(char *p, ndm_dtype dt, ndm_dtype ct, val v)
{
    if (ct == NDM_F32)
        st_float(p, dt, (float)v.f);
    else if (ct == NDM_F64)
        st_double(p, dt, v.f);
    else
        st_int(p, dt, wrap(v.i, ct));
}

/* ---- binary -------------------------------------------------------------- */

/* Operations outside their dtype rule (integer division, a float function
 * in an integer dtype) are never asked for by the dispatcher; the slots
 * exist so that every table slot has a kernel, and compute in double,
 * converted as a copy converts. */
static bool bin_via_double(ndm__ew_binop op, ndm_dtype ct)
{
    return ndm__ew_binop_has(op, NDM__EWF_FLOAT) && ct != NDM_F32 && ct != NDM_F64;
}

static val bin_int(ndm__ew_binop op, int64_t x, int64_t y)
{
    val r = {ndm__ew_binop_i(op, x, y), 0};
    return r;
}

static val bin_flt(ndm__ew_binop op, double x, double y)
{
    val r = {0, 0};
    double v = ndm__ew_binop_f(op, x, y);
    if (ndm__ew_binop_is_bool(op))
        r.i = (int64_t)v;
    else
        r.f = v;
    return r;
}

typedef struct bin_ctx {
    ndm__ew_binop op;
    ndm_dtype ct, od, ad, bd;
    size_t eo, ea, eb;
} bin_ctx;

static void bin_row(void *ctx, char *const *p, const int64_t *s, int64_t n)
{
    const bin_ctx *c = ctx;
    bool flt = c->ct == NDM_F32 || c->ct == NDM_F64;
    bool cmp = ndm__ew_binop_is_bool(c->op);
    bool via = bin_via_double(c->op, c->ct);
    for (int64_t i = 0; i < n; i++) {
        char *o = p[0] + i * s[0] * (int64_t)c->eo;
        val x = ld(p[1] + i * s[1] * (int64_t)c->ea, c->ad, c->ct);
        val y = ld(p[2] + i * s[2] * (int64_t)c->eb, c->bd, c->ct);
        if (via) {
            st_double(o, c->od, bin_flt(c->op, (double)x.i, (double)y.i).f);
            continue;
        }
        val r = flt ? bin_flt(c->op, x.f, y.f) : bin_int(c->op, x.i, y.i);
        if (cmp)
            st_int(o, c->od, r.i != 0);
        else
            st(o, c->od, c->ct, r);
    }
}

static ndm_status ref_bin(ndm__ew_binop op, ndm_dtype ct, const ndm__tensor *out,
                          const ndm__tensor *a, const void *as, const ndm__tensor *b,
                          const void *bs)
{
    int64_t *zeros = NULL;
    if ((!a || !b) && !(zeros = calloc((size_t)(out->ndim ? out->ndim : 1), sizeof *zeros)))
        return NDM_E_OOM;
    bin_ctx c = {op, ct, out->dtype, a ? a->dtype : ct, b ? b->dtype : ct,
                 ndm_dtype_size(out->dtype), 0, 0};
    c.ea = ndm_dtype_size(c.ad);
    c.eb = ndm_dtype_size(c.bd);
    char *data[3] = {out->data, a ? a->data : (char *)as, b ? b->data : (char *)bs};
    const int64_t *strides[3] = {out->strides, a ? a->strides : zeros, b ? b->strides : zeros};
    size_t es[3] = {c.eo, c.ea, c.eb};
    ndm_status st = ndm__cpu_iterate(out->ndim, out->shape, 3, data, strides, es, bin_row, &c);
    free(zeros);
    return st;
}

static ndm_status ref_binary(int device, ndm__ew_binop op, ndm_dtype ct, const ndm__tensor *out,
                             const ndm__tensor *a, const ndm__tensor *b)
{
    (void)device;
    return ref_bin(op, ct, out, a, NULL, b, NULL);
}

static ndm_status ref_binary_scalar(int device, ndm__ew_binop op, ndm_dtype ct,
                                    const ndm__tensor *out, const ndm__tensor *a, const void *s,
                                    bool swap)
{
    (void)device;
    return swap ? ref_bin(op, ct, out, NULL, s, a, NULL) : ref_bin(op, ct, out, a, NULL, NULL, s);
}

/* ---- unary --------------------------------------------------------------- */

static double un_flt(ndm__ew_unop op, double x, double lo, double hi)
{
    return ndm__ew_unop_f(op, x, lo, hi);
}

static int64_t un_int(ndm__ew_unop op, int64_t x, int64_t lo, int64_t hi)
{
    return ndm__ew_unop_i(op, x, lo, hi);
}

typedef struct un_ctx {
    ndm__ew_unop op;
    ndm_dtype ct, od, ad;
    size_t eo, ea;
    val lo, hi;
} un_ctx;

static void un_row(void *ctx, char *const *p, const int64_t *s, int64_t n)
{
    const un_ctx *c = ctx;
    bool flt = c->ct == NDM_F32 || c->ct == NDM_F64;
    /* a float function in an integer dtype: see bin_via_double */
    bool via = !flt && ndm__ew_unop_is_float(c->op);
    for (int64_t i = 0; i < n; i++) {
        val x = ld(p[1] + i * s[1] * (int64_t)c->ea, c->ad, c->ct);
        val r = {0, 0};
        if (via) {
            st_double(p[0] + i * s[0] * (int64_t)c->eo, c->od,
                      un_flt(c->op, (double)x.i, (double)c->lo.i, (double)c->hi.i));
            continue;
        }
        if (flt)
            r.f = un_flt(c->op, x.f, c->lo.f, c->hi.f);
        else
            r.i = un_int(c->op, x.i, c->lo.i, c->hi.i);
        st(p[0] + i * s[0] * (int64_t)c->eo, c->od, c->ct, r);
    }
}

static ndm_status ref_unary(int device, ndm__ew_unop op, ndm_dtype ct, const ndm__tensor *out,
                            const ndm__tensor *a, const void *params)
{
    (void)device;
    un_ctx c = {op, ct, out->dtype, a->dtype, ndm_dtype_size(out->dtype),
                ndm_dtype_size(a->dtype), {0, 0}, {0, 0}};
    if (params) {
        size_t e = ndm_dtype_size(ct);
        c.lo = ld(params, ct, ct);
        c.hi = ld((const char *)params + e, ct, ct);
    }
    char *data[2] = {out->data, a->data};
    const int64_t *strides[2] = {out->strides, a->strides};
    size_t es[2] = {c.eo, c.ea};
    return ndm__cpu_iterate(out->ndim, out->shape, 2, data, strides, es, un_row, &c);
}

/* ---- where --------------------------------------------------------------- */

typedef struct where_ctx {
    ndm_dtype ct, od, cd, ad, bd;
    size_t eo, ec, ea, eb;
} where_ctx;

static void where_row(void *ctx, char *const *p, const int64_t *s, int64_t n)
{
    const where_ctx *c = ctx;
    for (int64_t i = 0; i < n; i++) {
        bool take_a = ld_int(p[1] + i * s[1] * (int64_t)c->ec, c->cd, NDM_BOOL) != 0;
        val v = take_a ? ld(p[2] + i * s[2] * (int64_t)c->ea, c->ad, c->ct)
                       : ld(p[3] + i * s[3] * (int64_t)c->eb, c->bd, c->ct);
        st(p[0] + i * s[0] * (int64_t)c->eo, c->od, c->ct, v);
    }
}

static ndm_status ref_where(int device, ndm_dtype ct, const ndm__tensor *out,
                            const ndm__tensor *cond, const ndm__tensor *a, const ndm__tensor *b)
{
    (void)device;
    where_ctx c = {ct,
                   out->dtype,
                   cond->dtype,
                   a->dtype,
                   b->dtype,
                   ndm_dtype_size(out->dtype),
                   ndm_dtype_size(cond->dtype),
                   ndm_dtype_size(a->dtype),
                   ndm_dtype_size(b->dtype)};
    char *data[4] = {out->data, cond->data, a->data, b->data};
    const int64_t *strides[4] = {out->strides, cond->strides, a->strides, b->strides};
    size_t es[4] = {c.eo, c.ec, c.ea, c.eb};
    return ndm__cpu_iterate(out->ndim, out->shape, 4, data, strides, es, where_row, &c);
}

const ndm__backend_ew ndm__cpu_ref_ew = {
    .binary = ref_binary,
    .binary_scalar = ref_binary_scalar,
    .unary = ref_unary,
    .where = ref_where,
};

/* ---- the reference loops of the fast tables --------------------------------
 * One contiguous kernel per (operation, computation dtype) slot, generated
 * from the lists: the fast tables start from these and override the slots
 * that have faster kernels, so every slot has one. */

#define NDM__REF_CTS(Y, A)                                                      \
    Y(A, b8, NDM_BOOL) Y(A, u8, NDM_U8) Y(A, i32, NDM_I32) Y(A, i64, NDM_I64)   \
        Y(A, f32, NDM_F32) Y(A, f64, NDM_F64)

static void cref_un(ndm__ew_unop op, ndm_dtype ct, void *o, const void *a, int64_t n,
                    const void *params)
{
    size_t e = ndm__ew_esize(ct);
    un_ctx c = {op, ct, ct, ct, e, e, {0, 0}, {0, 0}};
    if (params) {
        c.lo = ld(params, ct, ct);
        c.hi = ld((const char *)params + e, ct, ct);
    }
    char *p[2] = {o, (char *)a};
    int64_t s[2] = {1, 1};
    un_row(&c, p, s, n);
}

static void cref_bin(ndm__ew_binop op, ndm_dtype ct, void *o, const void *a, int64_t sa,
                     const void *b, int64_t sb, int64_t n)
{
    ndm_dtype rt = ndm__ew_binop_is_bool(op) ? NDM_BOOL : ct;
    size_t e = ndm__ew_esize(ct);
    bin_ctx c = {op, ct, rt, ct, ct, ndm__ew_esize(rt), e, e};
    char *p[3] = {o, (char *)a, (char *)b};
    int64_t s[3] = {1, sa, sb};
    bin_row(&c, p, s, n);
}

#define NDM__CREF_UN_(ID, N, E)                                                 \
    static void cref_un_##ID##_##N(void *o, const void *a, int64_t n, const void *params) \
    {                                                                           \
        cref_un(NDM__EW_##ID, E, o, a, n, params);                              \
    }
#define NDM__CREF_BIN_(ID, N, E)                                                \
    static void cref_bin_##ID##_##N(void *o, const void *a, int64_t sa, const void *b, \
                                    int64_t sb, int64_t n)                      \
    {                                                                           \
        cref_bin(NDM__EW_##ID, E, o, a, sa, b, sb, n);                          \
    }
#define NDM__CREF_UN_OP_(ID, ...) NDM__REF_CTS(NDM__CREF_UN_, ID)
#define NDM__CREF_BIN_OP_(ID, ...) NDM__REF_CTS(NDM__CREF_BIN_, ID)
NDM__EW_UNOPS(NDM__CREF_UN_OP_)
NDM__EW_BINOPS(NDM__CREF_BIN_OP_)

#define NDM__CREF_SLOT_(ID, N, E) [E] = ID##_##N,
#define NDM__CREF_UN_ROW_(ID, ...) [NDM__EW_##ID] = {NDM__REF_CTS(NDM__CREF_SLOT_, cref_un_##ID)},
#define NDM__CREF_BIN_ROW_(ID, ...)                                             \
    [NDM__EW_##ID] = {NDM__REF_CTS(NDM__CREF_SLOT_, cref_bin_##ID)},

static const ndm__ew_un_fn cref_un_table[NDM__EW_UNOP_COUNT][NDM_DTYPE_COUNT] = {
    NDM__EW_UNOPS(NDM__CREF_UN_ROW_)};
static const ndm__ew_bin_fn cref_bin_table[NDM__EW_BINOP_COUNT][NDM_DTYPE_COUNT] = {
    NDM__EW_BINOPS(NDM__CREF_BIN_ROW_)};

void ndm__ew_isa_fill_reference(ndm__ew_isa *t)
{
    memcpy(t->bin, cref_bin_table, sizeof t->bin);
    memcpy(t->un, cref_un_table, sizeof t->un);
}
