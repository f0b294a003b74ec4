/* The conformance suite: every operation of the operation lists
 * (lib/backends/ew.h, reduce.h) x dtype x layout, on every backend and every
 * CPU instruction-set table this CPU runs, against the CPU reference kernels;
 * forward at the kernel level, backward through the public API and autograd.
 * A new operation in a list is picked up here with no edit. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/backends/cpu/ew_cpu.h"
#include "../lib/backends/cpu/isa.h"
#include "../lib/backends/registry.h"
#include "../lib/backends/ew.h"
#include "../lib/backends/reduce.h"
#include "../lib/manager/core.h"
#include "../lib/ops/autograd.h"
#include "dtype_host.h"

/* ---- the test tables, derived from the lists ------------------------------ */

#define NDM__EW_GRAD(...) true
#define NDM__EW_GRAD2(...) true
#define NDM__EW_NOGRAD false

typedef ndm_array (*un_api)(NDM_SITE_PARAMS, ndm_manager, ndm_array);
typedef ndm_array (*bin_api)(NDM_SITE_PARAMS, ndm_manager, ndm_array, ndm_array);
typedef ndm_array (*sc_api)(NDM_SITE_PARAMS, ndm_manager, ndm_array, double);
typedef ndm_array (*red_api)(NDM_SITE_PARAMS, ndm_manager, ndm_array, bool, int, const int *);
typedef ndm_array (*redd_api)(NDM_SITE_PARAMS, ndm_manager, ndm_array, int, bool, int,
                              const int *);

typedef struct un_op {
    ndm__ew_unop op;
    const char *name;
    unsigned flags;
    double tol;
    bool params, grad;
    un_api api;
} un_op;

#define UN_API_U(name) ndm_##name##_to_at
#define UN_API_P(name) NULL
#define UN_PARAMS_U false
#define UN_PARAMS_P true
#define UN_ROW(ID, name, form, flags, tol, rf, ri, grad)                        \
    {NDM__EW_##ID, #name, flags, tol, UN_PARAMS_##form, grad, UN_API_##form(name)},
static const un_op uns[] = {NDM__EW_UNOPS(UN_ROW)};
#define N_UN ((int)(sizeof uns / sizeof *uns))

typedef struct bin_op {
    ndm__ew_binop op;
    const char *name;
    unsigned flags;
    double tol;
    bool grad;
    bin_api api;
    sc_api scalar;
} bin_op;

#define SC_API_ARITH(name) ndm_##name##_scalar_to_at
#define SC_API_ARITH_R SC_API_ARITH
#define SC_API_ARITH_RN SC_API_ARITH
#define SC_API_CMP SC_API_ARITH
#define SC_API_LOGIC(name) NULL
#define BIN_ROW(ID, name, form, flags, tol, rf, ri, grad2, grads)               \
    {NDM__EW_##ID, #name, flags, tol, grad2, ndm_##name##_to_at, SC_API_##form(name)},
static const bin_op bins[] = {NDM__EW_BINOPS(BIN_ROW)};
#define N_BIN ((int)(sizeof bins / sizeof *bins))

typedef struct red_op {
    ndm__reduce_op op;
    const char *name;
    unsigned flags;
    double tol;
    bool grad;
    red_api api;
    redd_api api_ddof;
} red_op;

#define RED_API_R(name) ndm_##name##_to_at, NULL
#define RED_API_DDOF(name) NULL, ndm_##name##_to_at
#define RED_API_ARG(name) NULL, NULL
#define RED_ROW(ID, name, form, result, flags, grad, tol)                        \
    {NDM__RED_##ID, #name, flags, tol, grad != NDM__AG_OP_COUNT, RED_API_##form(name)},
static const red_op reds[] = {NDM__REDUCE_OPS(RED_ROW)};
#define N_RED ((int)(sizeof reds / sizeof *reds))

_Static_assert(N_UN == NDM__EW_UNOP_COUNT && N_BIN == NDM__EW_BINOP_COUNT &&
                   N_RED == NDM__RED_COUNT,
               "the test tables follow the lists");

/* ---- data ------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(rnext(r) >> 11) * 0x1p-53);
}

static bool is_float(ndm_dtype t)
{
    return t == NDM_F16 || t == NDM_BF16 || t == NDM_F32 || t == NDM_F64;
}
static ndm_dtype compute_of(ndm_dtype t) { return t == NDM_F16 || t == NDM_BF16 ? NDM_F32 : t; }

/* Store v into element i of a host buffer of dtype t. */
static void host_set(void *buf, ndm_dtype t, int64_t i, double v)
{
    switch (t) {
    case NDM_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    case NDM_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case NDM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case NDM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case NDM_F16: ((uint16_t *)buf)[i] = ndm_f32_to_f16((float)v); break;
    case NDM_BF16: ((uint16_t *)buf)[i] = ndm_f32_to_bf16((float)v); break;
    case NDM_F32: ((float *)buf)[i] = (float)v; break;
    case NDM_F64: ((double *)buf)[i] = v; break;
    }
}

/* n random elements of dtype t; floats include a few special values. */
static void fill_random(void *buf, ndm_dtype t, int64_t n, rng *r)
{
    static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 0.5, -2.5, 1e-3};
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (is_float(t))
            v = (rnext(r) % 9 == 0) ? special[rnext(r) % 8] : runif(r, -3, 3);
        else if (t == NDM_BOOL)
            v = (double)(rnext(r) & 1);
        else if (t == NDM_U8)
            v = (double)(rnext(r) % 40);
        else
            v = (double)((int64_t)(rnext(r) % 41) - 20);
        host_set(buf, t, i, v);
    }
}

/* ---- layouts ------------------------------------------------------------------
 * An operand of logical shape `shape` seen through strides and an offset
 * into a buffer of `count` elements. Outputs are contiguous except in the
 * transposed layout, where they are transposed too. */

typedef enum layout {
    L_CONTIGUOUS,
    L_TRANSPOSED,
    L_STEPPED,
    L_BROADCAST,
    L_EMPTY,
    L_RANK0,
    L_COUNT
} layout;
static const char *const layout_names[L_COUNT] = {"contiguous",         "transposed",
                                                  "sliced with steps",  "broadcast",
                                                  "size-0",             "rank-0"};

typedef struct view {
    int ndim;
    int64_t shape[2], strides[2], offset, count;
} view;

static const int64_t R = 5, C = 7;

/* Operand k (0, 1, 2: the inputs) of layout l. */
static view in_view(layout l, int k)
{
    view v = {2, {R, C}, {C, 1}, 0, R * C};
    switch (l) {
    case L_CONTIGUOUS: break;
    case L_TRANSPOSED: v.strides[0] = 1, v.strides[1] = R; break;
    case L_STEPPED: /* rows 1, 3, ... of a 10 x 21 buffer, every third column, reversed */
        v.strides[0] = 2 * 21, v.strides[1] = -3, v.offset = 21 + 2 + 3 * (C - 1),
        v.count = 10 * 21;
        break;
    case L_BROADCAST: /* a row, a column, a row again */
        if (k == 1)
            v.strides[0] = 1, v.strides[1] = 0, v.count = R;
        else
            v.strides[0] = 0, v.strides[1] = 1, v.count = C;
        break;
    case L_EMPTY: v.shape[0] = 0, v.count = 0; break;
    case L_RANK0: v.ndim = 0, v.count = 1; break;
    default: break;
    }
    return v;
}

static view out_view(layout l)
{
    view v = in_view(l == L_STEPPED || l == L_BROADCAST ? L_CONTIGUOUS : l, 0);
    return v;
}

static int64_t view_size(const view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

/* The buffer position of the i-th element (C order) of a view. */
static int64_t view_pos(const view *v, int64_t i)
{
    int64_t p = v->offset;
    for (int d = v->ndim - 1; d >= 0; d--) {
        p += (i % v->shape[d]) * v->strides[d];
        i /= v->shape[d];
    }
    return p;
}

/* ---- targets: a backend's table on a device ----------------------------------- */

typedef struct target {
    char name[32];
    const ndm__backend *b;
    ndm_device dev;
    ndm_manager m; /* device buffers are arrays of this manager (not the CPU) */
} target;

/* A buffer on the target: host memory for the CPU, else a device array. */
typedef struct dbuf {
    void *p;
    ndm_array h;
} dbuf;

static bool dbuf_get(const target *t, dbuf *d, size_t bytes)
{
    d->h = NDM_NULL_ARRAY;
    if (t->dev.type == NDM_DEVICE_CPU) {
        d->p = malloc(bytes ? bytes : 1);
        return d->p != NULL;
    }
    d->h = ndm_empty(t->m, NDM_U8, NDM_SHAPE((int64_t)(bytes ? bytes : 1)));
    d->p = d->h.id ? ndm__array_ptr(ndm__array_peek(d->h)) : NULL;
    return d->p != NULL;
}
static void dbuf_put(dbuf *d)
{
    if (d->h.id)
        (void)ndm_array_release(d->h);
    else
        free(d->p);
}
static void dbuf_up(const target *t, dbuf *d, const void *host, size_t bytes)
{
    if (t->dev.type == NDM_DEVICE_CPU)
        memcpy(d->p, host, bytes);
    else if (bytes)
        assert_ok(t->b->upload(t->dev.index, d->p, host, bytes));
}
static void dbuf_down(const target *t, const dbuf *d, void *host, size_t bytes)
{
    if (t->dev.type == NDM_DEVICE_CPU)
        memcpy(host, d->p, bytes);
    else if (bytes) {
        if (t->b->sync)
            assert_ok(t->b->sync(t->dev.index));
        assert_ok(t->b->download(t->dev.index, host, d->p, bytes));
    }
}

/* ---- one forward case --------------------------------------------------------- */

enum { MAX_OPS = 4 }; /* operand 0 is the output */

typedef struct fcase {
    const char *op;    /* for messages */
    char dtypes[48];   /* for messages */
    layout l;
    ndm_dtype dt[MAX_OPS];
    view v[MAX_OPS];
    int nops;
    double tol;
} fcase;

typedef struct tally {
    long checked, declined;
    long mismatches;
    char first[512];
} tally;

/* Host copies of the operands, filled once per case and given to both the
 * target and the reference. */
typedef struct hostops {
    void *buf[MAX_OPS];
    size_t bytes[MAX_OPS];
} hostops;

static void host_make(const fcase *c, hostops *h, rng *r)
{
    for (int k = 0; k < c->nops; k++) {
        h->bytes[k] = (size_t)c->v[k].count * ndm__ew_esize(c->dt[k]);
        h->buf[k] = malloc(h->bytes[k] ? h->bytes[k] : 1);
        assert_non_null(h->buf[k]);
        if (k == 0)
            memset(h->buf[k], 0xa5, h->bytes[k]); /* elements outside the view stay */
        else
            fill_random(h->buf[k], c->dt[k], c->v[k].count, r);
    }
}
static void host_free(const fcase *c, hostops *h)
{
    for (int k = 0; k < c->nops; k++)
        free(h->buf[k]);
}

static ndm__tensor tensor_at(const fcase *c, int k, void *base)
{
    char *p = (char *)base + c->v[k].offset * (int64_t)ndm__ew_esize(c->dt[k]);
    return (ndm__tensor){p, c->dt[k], c->v[k].ndim, c->v[k].shape, c->v[k].strides};
}

/* Compare the output views of got and want; record the first mismatch. */
static void compare(const fcase *c, const char *table, const void *got, const void *want,
                    double atol_scale, tally *t)
{
    const view *v = &c->v[0];
    ndm_dtype dt = c->dt[0];
    size_t es = ndm__ew_esize(dt);
    int64_t n = view_size(v);
    double rtol = c->tol, atol = 0;
    if (rtol > 0) {
        if (dt == NDM_F64)
            rtol = 1e-14, atol = 1e-15 * atol_scale;
        else
            atol = 1e-7 * atol_scale;
        if (dt == NDM_F16 && rtol < 1e-3)
            rtol = 1e-3;
        if (dt == NDM_BF16 && rtol < 8e-3)
            rtol = 8e-3;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t p = view_pos(v, i);
        const char *g = (const char *)got + p * (int64_t)es, *w = (const char *)want + p * (int64_t)es;
        bool ok = is_float(dt) ? close_to(host_get(g, dt, 0), host_get(w, dt, 0), rtol, atol)
                               : !memcmp(g, w, es);
        if (ok)
            continue;
        if (!t->mismatches++)
            snprintf(t->first, sizeof t->first,
                     "%s (%s), %s, table %s: element %" PRId64 " got %.9g, expected %.9g", c->op,
                     c->dtypes, layout_names[c->l], table, i, host_get(g, dt, 0),
                     host_get(w, dt, 0));
        return;
    }
}

/* Run `fn` on the target's operands and on the reference's, and compare. */
typedef ndm_status (*case_fn)(const ndm__backend *b, int device, const fcase *c,
                              const ndm__tensor *ops, const void *ctx);

static void run_case(const target *tg, const fcase *c, case_fn fn, const void *ctx, rng *r,
                     double atol_scale, tally *t)
{
    hostops h;
    host_make(c, &h, r);
    /* the reference, on host copies */
    void *want = malloc(h.bytes[0] ? h.bytes[0] : 1);
    assert_non_null(want);
    memcpy(want, h.buf[0], h.bytes[0]);
    ndm__tensor rops[MAX_OPS];
    rops[0] = tensor_at(c, 0, want);
    for (int k = 1; k < c->nops; k++)
        rops[k] = tensor_at(c, k, h.buf[k]);
    ndm_status rs = fn(&ndm__cpu_ref_backend, 0, c, rops, ctx);
    if (rs != NDM_OK)
        fail_msg("%s (%s), %s: the reference failed: %s", c->op, c->dtypes, layout_names[c->l],
                 ndm_status_name(rs));
    /* the target, on its own buffers */
    dbuf d[MAX_OPS];
    ndm__tensor tops[MAX_OPS];
    for (int k = 0; k < c->nops; k++) {
        assert_true(dbuf_get(tg, &d[k], h.bytes[k]));
        dbuf_up(tg, &d[k], h.buf[k], h.bytes[k]);
        tops[k] = tensor_at(c, k, d[k].p);
    }
    ndm_status ts = fn(tg->b, tg->dev.index, c, tops, ctx);
    if (ts == NDM_E_UNSUPPORTED) {
        t->declined++;
    } else if (ts != NDM_OK) {
        if (!t->mismatches++)
            snprintf(t->first, sizeof t->first, "%s (%s), %s, table %s: failed with %s", c->op,
                     c->dtypes, layout_names[c->l], tg->name, ndm_status_name(ts));
    } else {
        void *got = malloc(h.bytes[0] ? h.bytes[0] : 1);
        assert_non_null(got);
        dbuf_down(tg, &d[0], got, h.bytes[0]);
        compare(c, tg->name, got, want, atol_scale, t);
        free(got);
        t->checked++;
    }
    for (int k = 0; k < c->nops; k++)
        dbuf_put(&d[k]);
    free(want);
    host_free(c, &h);
}

/* ---- elementwise ------------------------------------------------------------ */

/* The dispatcher's rules (lib/ops/elementwise*.c), from the list's flags:
 * false when the combination is refused. */
static bool un_types(const un_op *o, ndm_dtype t, ndm_dtype *ct, ndm_dtype *rt)
{
    if (t == NDM_BOOL && (o->flags & NDM__EWF_NO_BOOL))
        return false;
    ndm_dtype r = t;
    if ((o->flags & NDM__EWF_FLOAT) && !is_float(t))
        r = NDM_F32;
    if (o->flags & NDM__EWF_BOOL)
        r = NDM_BOOL;
    *rt = r;
    *ct = compute_of(r);
    return true;
}

static bool bin_types(const bin_op *o, ndm_dtype t, ndm_dtype *ct, ndm_dtype *rt)
{
    if (o->flags & NDM__EWF_BOOL) {
        *ct = *rt = NDM_BOOL;
        return true;
    }
    ndm_dtype r = t;
    if ((o->flags & NDM__EWF_FLOAT) && !is_float(t))
        r = NDM_F32;
    if (r == NDM_BOOL && (o->flags & NDM__EWF_NO_BOOL))
        return false;
    *ct = compute_of(r);
    *rt = (o->flags & NDM__EWF_BOOL_OUT) ? NDM_BOOL : r;
    return true;
}

typedef struct ew_ctx {
    int op;
    ndm_dtype ct;
    bool scalar, swap, flat;
    _Alignas(8) unsigned char value[16]; /* clamp's bounds, or the scalar */
} ew_ctx;

static ndm_status run_unary(const ndm__backend *b, int device, const fcase *c,
                            const ndm__tensor *t, const void *ctx)
{
    (void)c;
    const ew_ctx *x = ctx;
    if (!b->ew)
        return NDM_E_UNSUPPORTED;
    return b->ew->unary(device, (ndm__ew_unop)x->op, x->ct, &t[0], &t[1],
                        uns[x->op].params ? x->value : NULL);
}

static ndm_status run_binary(const ndm__backend *b, int device, const fcase *c,
                             const ndm__tensor *t, const void *ctx)
{
    const ew_ctx *x = ctx;
    if (!b->ew)
        return NDM_E_UNSUPPORTED;
    ndm__ew_binop op = (ndm__ew_binop)x->op;
    if (x->scalar)
        return b->ew->binary_scalar(device, op, x->ct, &t[0], &t[1], x->value, x->swap);
    if (x->flat) {
        /* optional member: a backend without it is not declined, the
         * dispatcher calls binary instead */
        if (!b->ew->binary_flat)
            return b->ew->binary(device, op, x->ct, &t[0], &t[1], &t[2]);
        return b->ew->binary_flat(device, op, x->ct, t[0].data, t[1].data, t[2].data,
                                  view_size(&c->v[0]));
    }
    return b->ew->binary(device, op, x->ct, &t[0], &t[1], &t[2]);
}

static ndm_status run_where(const ndm__backend *b, int device, const fcase *c,
                            const ndm__tensor *t, const void *ctx)
{
    (void)c;
    const ew_ctx *x = ctx;
    if (!b->ew)
        return NDM_E_UNSUPPORTED;
    return b->ew->where(device, x->ct, &t[0], &t[1], &t[2], &t[3]);
}

/* One value of computation dtype ct into buf. */
static void ct_value(void *buf, ndm_dtype ct, double v) { host_set(buf, ct, 0, v); }

static void ew_forward(const target *tg, rng *r, tally *t)
{
    for (int oi = 0; oi < N_UN; oi++) {
        const un_op *o = &uns[oi];
        for (int di = 0; di < N_DTYPES; di++) {
            ndm_dtype dt = all_dtypes[di], ct, rt;
            if (!un_types(o, dt, &ct, &rt))
                continue;
            ew_ctx x = {.op = o->op, .ct = ct};
            if (o->params) { /* clamp's bounds */
                size_t es = ndm__ew_esize(ct);
                ct_value(x.value, ct, is_float(ct) ? -0.75 : ct == NDM_BOOL ? 0 : 2);
                ct_value(x.value + es, ct, is_float(ct) ? 0.8 : 1 + (ct != NDM_BOOL) * 8);
            }
            for (int l = 0; l < L_COUNT; l++) {
                fcase c = {.op = o->name, .l = (layout)l, .nops = 2, .tol = o->tol};
                snprintf(c.dtypes, sizeof c.dtypes, "%s computed in %s", ndm_dtype_name(dt),
                         ndm_dtype_name(ct));
                c.dt[0] = rt, c.dt[1] = dt;
                c.v[0] = out_view((layout)l), c.v[1] = in_view((layout)l, 1);
                if (l == L_BROADCAST)
                    c.v[1] = in_view((layout)l, 0);
                run_case(tg, &c, run_unary, &x, r, 1, t);
            }
        }
    }
    for (int oi = 0; oi < N_BIN; oi++) {
        const bin_op *o = &bins[oi];
        for (int di = 0; di < N_DTYPES; di++) {
            ndm_dtype dt = all_dtypes[di], ct, rt;
            if (!bin_types(o, dt, &ct, &rt))
                continue;
            for (int l = 0; l < L_COUNT; l++) {
                ew_ctx x = {.op = o->op, .ct = ct};
                fcase c = {.op = o->name, .l = (layout)l, .nops = 3, .tol = o->tol};
                snprintf(c.dtypes, sizeof c.dtypes, "%s computed in %s", ndm_dtype_name(dt),
                         ndm_dtype_name(ct));
                c.dt[0] = rt, c.dt[1] = c.dt[2] = dt;
                c.v[0] = out_view((layout)l);
                c.v[1] = in_view((layout)l, 1), c.v[2] = in_view((layout)l, 2);
                run_case(tg, &c, run_binary, &x, r, 1, t);
            }
            /* with a scalar, either side; and the flat path where it applies */
            for (int form = 0; form < 3; form++) {
                bool flat_ok = !(o->flags & (NDM__EWF_BOOL_OUT | NDM__EWF_BOOL)) && dt == ct &&
                               dt != NDM_BOOL && rt == ct;
                if (form == 2 && !flat_ok)
                    continue;
                ew_ctx x = {.op = o->op, .ct = ct, .scalar = form < 2, .swap = form == 1,
                            .flat = form == 2};
                ct_value(x.value, ct, is_float(ct) ? 1.5 : ct == NDM_BOOL ? 1 : 3);
                fcase c = {.op = o->name, .l = L_CONTIGUOUS, .nops = form < 2 ? 2 : 3,
                           .tol = o->tol};
                snprintf(c.dtypes, sizeof c.dtypes, "%s computed in %s, %s", ndm_dtype_name(dt),
                         ndm_dtype_name(ct),
                         form == 0 ? "array op scalar" : form == 1 ? "scalar op array" : "flat");
                c.dt[0] = rt, c.dt[1] = c.dt[2] = dt;
                c.v[0] = c.v[1] = c.v[2] = in_view(L_CONTIGUOUS, 0);
                run_case(tg, &c, run_binary, &x, r, 1, t);
            }
        }
    }
    for (int di = 0; di < N_DTYPES; di++) {
        ndm_dtype dt = all_dtypes[di];
        ew_ctx x = {.ct = compute_of(dt)};
        for (int l = 0; l < L_COUNT; l++) {
            fcase c = {.op = "where", .l = (layout)l, .nops = 4};
            snprintf(c.dtypes, sizeof c.dtypes, "%s", ndm_dtype_name(dt));
            c.dt[0] = c.dt[1] = c.dt[2] = c.dt[3] = dt;
            c.v[0] = out_view((layout)l);
            for (int k = 1; k < 4; k++)
                c.v[k] = in_view((layout)l, k == 3 ? 1 : k - 1);
            run_case(tg, &c, run_where, &x, r, 1, t);
        }
    }
}

/* ---- reductions ------------------------------------------------------------- */

typedef struct red_ctx {
    ndm__reduce_op op;
    int nred;
} red_ctx;

static ndm_status run_reduce(const ndm__backend *b, int device, const fcase *c,
                             const ndm__tensor *t, const void *ctx)
{
    (void)c;
    const red_ctx *x = ctx;
    if (!b->reduce)
        return NDM_E_UNSUPPORTED;
    return b->reduce->reduce(device, x->op, &t[0], &t[1], x->nred, 1);
}

static void reduce_forward(const target *tg, rng *r, tally *t)
{
    for (int oi = 0; oi < N_RED; oi++) {
        const red_op *o = &reds[oi];
        for (int di = 0; di < N_DTYPES; di++) {
            ndm_dtype dt = all_dtypes[di];
            for (int l = 0; l < L_COUNT; l++) {
                /* the input has two axes and the trailing one is reduced; for
                 * rank-0, both are (a scalar result); size-0 reduces a (0, 7)
                 * input, and for operations with an identity a (5, 0) one */
                for (int empty_axis = 0; empty_axis < (l == L_EMPTY ? 2 : 1); empty_axis++) {
                    if (empty_axis && !(o->flags & NDM__REDF_IDENTITY))
                        continue;
                    red_ctx x = {o->op, l == L_RANK0 ? 2 : 1};
                    fcase c = {.op = o->name, .l = (layout)l, .nops = 2, .tol = o->tol};
                    snprintf(c.dtypes, sizeof c.dtypes, "%s%s", ndm_dtype_name(dt),
                             empty_axis ? ", empty reduced axis" : "");
                    c.dt[0] = ndm__reduce_result_dtype(o->op, dt), c.dt[1] = dt;
                    c.v[1] = in_view(l == L_RANK0 ? L_CONTIGUOUS : (layout)l, 0);
                    if (empty_axis)
                        c.v[1].shape[0] = R, c.v[1].shape[1] = 0, c.v[1].count = 0;
                    c.v[0] = (view){x.nred == 2 ? 0 : 1, {c.v[1].shape[0]}, {1}, 0,
                                    x.nred == 2 ? 1 : c.v[1].shape[0]};
                    run_case(tg, &c, run_reduce, &x, r, 10, t);
                }
            }
        }
    }
}

/* ---- the suite -------------------------------------------------------------- */

static void report(const char *what, const tally *t)
{
    printf("[ conformance ] %s: %ld cases checked, %ld declined\n", what, t->checked,
           t->declined);
    if (t->mismatches)
        fail_msg("%ld mismatches; the first: %s", t->mismatches, t->first);
}

/* Every CPU instruction-set table this CPU runs, each against the reference. */
static void test_backend_ops_cpu_tables_match_reference(void **state)
{
    (void)state;
    ndm__cpu_force_reference(false);
    tally all = {0};
    int levels = 0;
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level)) {
            printf("[ conformance ] cpu[%s]: skipped, this CPU cannot run it\n",
                   ndm__cpu_isa_name((ndm__cpu_isa)level));
            continue;
        }
        target tg = {.b = ndm__backend_for(NDM_DEVICE_CPU), .dev = NDM_CPU};
        snprintf(tg.name, sizeof tg.name, "cpu[%s]", ndm__cpu_isa_name((ndm__cpu_isa)level));
        rng r = {(uint64_t)level + 1};
        tally t = {0};
        ew_forward(&tg, &r, &t);
        reduce_forward(&tg, &r, &t);
        printf("[ conformance ] %s: %ld cases checked\n", tg.name, t.checked);
        all.checked += t.checked;
        all.declined += t.declined;
        if (t.mismatches && !all.mismatches)
            memcpy(all.first, t.first, sizeof all.first);
        all.mismatches += t.mismatches;
        levels++;
    }
    assert_true(ndm__cpu_isa_force(-1));
    assert_true(levels >= 1);
    /* the CPU backend provides every family it is asked for here */
    assert_int_equal(all.declined, 0);
    report("cpu, every instruction-set table", &all);
}

/* CUDA, when a device is there: the same cases, uploaded, run, downloaded.
 * A family the CUDA table lacks counts as declined. */
static void test_backend_ops_cuda_matches_reference(void **state)
{
    int n = ndm_cuda_device_count();
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (n <= 0 || !b) {
        printf("[ conformance ] cuda: skipped: %s\n",
               !b ? ndm__backend_unavailable(NDM_DEVICE_CUDA) : "no CUDA device is visible");
        return;
    }
    target tg = {.b = b, .dev = {NDM_DEVICE_CUDA, 0}};
    snprintf(tg.name, sizeof tg.name, "cuda:0");
    /* which device ran the cases: a GPU, or "cuda (host execution)" */
    ndm__device_props props;
    assert_ok(b->device_props(0, &props));
    printf("[ conformance ] cuda:0 is %s\n", props.name);
    tg.m = ndm_manager_new_on(ROOT(state), "cuda", tg.dev);
    assert_true(tg.m.id != 0);
    rng r = {7};
    tally t = {0};
    ew_forward(&tg, &r, &t);
    reduce_forward(&tg, &r, &t);
    assert_ok(ndm_manager_close(tg.m));
    printf("[ conformance ] cuda:0 families: ew %s, reduce %s\n", b->ew ? "yes" : "declined",
           b->reduce ? "yes" : "declined");
    report("cuda:0", &t);
}

/* ---- backward ------------------------------------------------------------------
 * The gradient of sum(w * f(x)) through the public API with each CPU level
 * forced, against the same with the reference backend. */

typedef ndm_array (*fwd_fn)(const void *op, ndm_array x, ndm_array y);

/* The loss's weights: fixed, exact in f32. */
static const double weights[24] = {0.5,  -1.25, 2,    0.75,  -0.5, 1.5,  1,    -2,
                                   0.25, 1.75,  -1,   0.625, 2.5,  -0.75, 1.25, 0.5,
                                   -1.5, 2.25,  0.375, -0.25, 1,    -1.75, 0.875, 1.5};

static ndm_array fwd_un(const void *op, ndm_array x, ndm_array y)
{
    (void)y;
    return ((const un_op *)op)->api(NDM_HERE, NDM_OUTPUT_RULE, x);
}
static ndm_array fwd_bin(const void *op, ndm_array x, ndm_array y)
{
    return ((const bin_op *)op)->api(NDM_HERE, NDM_OUTPUT_RULE, x, y);
}
static ndm_array fwd_sc(const void *op, ndm_array x, ndm_array y)
{
    (void)y;
    return ((const bin_op *)op)->scalar(NDM_HERE, NDM_OUTPUT_RULE, x, 1.75);
}
static ndm_array fwd_red(const void *op, ndm_array x, ndm_array y)
{
    (void)y;
    const red_op *o = op;
    int axes[1] = {1};
    return o->api ? o->api(NDM_HERE, NDM_OUTPUT_RULE, x, true, 1, axes)
                  : o->api_ddof(NDM_HERE, NDM_OUTPUT_RULE, x, 1, true, 1, axes);
}

/* The gradients of x and y (y may be unused) into gx, gy (host, f64). */
static void grads(ndm_manager root, ndm_dtype dt, fwd_fn f, const void *op, const double *xv,
                  const double *yv, int64_t n, double *gx, double *gy)
{
    ndm_manager model = ndm_manager_new(root, "model");
    float xf[64], yf[64];
    for (int64_t i = 0; i < n; i++)
        xf[i] = (float)xv[i], yf[i] = (float)yv[i];
    bool f32 = dt == NDM_F32;
    ndm_array x = ndm_from_buffer(model, dt, f32 ? (const void *)xf : xv, NDM_SHAPE(4, 6));
    ndm_array y = ndm_from_buffer(model, dt, f32 ? (const void *)yf : yv, NDM_SHAPE(4, 6));
    assert_live(x);
    assert_live(y);
    assert_ok(ndm_requires_grad(x));
    assert_ok(ndm_requires_grad(y));
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_manager s = ndm_scope_begin(batch, "forward");
    ndm_array out = f(op, x, y);
    assert_live(out);
    ndm_array w = ndm_astype(ndm_from_buffer(batch, NDM_F64, weights, NDM_SHAPE(4, 6)), dt);
    ndm_array loss = ndm_sum(ndm_mul(out, w), false, NDM_ALL_AXES_LIST);
    assert_live(loss);
    assert_ok(ndm_scope_end(s, 1, &loss));
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    ndm_manager rd = ndm_scope_begin(batch, "read");
    ndm_array g[2] = {ndm_grad(x), ndm_grad(y)};
    double *dst[2] = {gx, gy};
    for (int k = 0; k < 2; k++) {
        ndm_array g64 = g[k].id ? ndm_astype(g[k], NDM_F64) : NDM_NULL_ARRAY;
        if (g64.id)
            assert_ok(ndm_array_copy_out(g64, dst[k], (size_t)n * sizeof(double)));
        else
            memset(dst[k], 0, (size_t)n * sizeof(double));
    }
    ndm_clear_error();
    assert_ok(ndm_scope_end(rd, 0, NULL));
    assert_ok(ndm_manager_close(model));
}

/* sum(w * f(x, y)) in f64 without recording, for finite differences. */
static double loss_value(ndm_manager root, fwd_fn f, const void *op, const double *xv,
                         const double *yv)
{
    ndm_manager s = ndm_scope_begin(root, "numeric");
    ndm_array x = ndm_from_buffer(s, NDM_F64, xv, NDM_SHAPE(4, 6));
    ndm_array y = ndm_from_buffer(s, NDM_F64, yv, NDM_SHAPE(4, 6));
    ndm_array w = ndm_from_buffer(s, NDM_F64, weights, NDM_SHAPE(4, 6));
    ndm_array loss = ndm_sum(ndm_mul(f(op, x, y), w), false, NDM_ALL_AXES_LIST);
    double v = NAN;
    assert_live(loss);
    assert_ok(ndm_array_copy_out(loss, &v, sizeof v));
    assert_ok(ndm_scope_end(s, 0, NULL));
    return v;
}

/* The reference backend's analytic gradients (rx, ry) against central
 * differences: the gradient rules of the lists are right, not only equal
 * across tables. */
static void check_numeric(ndm_manager root, const char *name, fwd_fn f, const void *op,
                          double *xv, double *yv, int n, const double *rx, const double *ry,
                          tally *t)
{
    for (int k = 0; k < 2; k++) {
        double *v = k ? yv : xv;
        const double *ga = k ? ry : rx;
        for (int i = 0; i < n; i++) {
            double keep = v[i], h = 1e-6;
            v[i] = keep + h;
            double lp = loss_value(root, f, op, xv, yv);
            v[i] = keep - h;
            double lm = loss_value(root, f, op, xv, yv);
            v[i] = keep;
            double num = (lp - lm) / (2 * h);
            if (close_to(ga[i], num, 1e-5, 1e-6))
                continue;
            if (!t->mismatches++)
                snprintf(t->first, sizeof t->first,
                         "gradient rule of %s (float64): d/d%s element %d: analytic %.9g, "
                         "numeric %.9g",
                         name, k ? "y" : "x", i, ga[i], num);
            return;
        }
    }
}

static void test_backend_ops_backward_matches_reference(void **state)
{
    ndm_manager root = ROOT(state);
    enum { N = 24 };
    double xv[N], yv[N];
    rng r = {99};
    /* positive inputs: every function of the lists is defined there */
    for (int i = 0; i < N; i++)
        xv[i] = runif(&r, 0.25, 2.0), yv[i] = runif(&r, 0.25, 2.0);
    long checked = 0;
    tally t = {0};
    static const ndm_dtype dts[2] = {NDM_F32, NDM_F64};
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        if (!ndm__cpu_isa_force(level))
            continue;
        for (int kind = 0; kind < 4; kind++) {
            int count = kind == 0 ? N_UN : kind == 3 ? N_RED : N_BIN;
            for (int oi = 0; oi < count; oi++) {
                const void *op;
                fwd_fn f;
                const char *name;
                bool has;
                if (kind == 0)
                    op = &uns[oi], f = fwd_un, name = uns[oi].name,
                    has = uns[oi].grad && uns[oi].api;
                else if (kind == 3)
                    op = &reds[oi], f = fwd_red, name = reds[oi].name,
                    has = reds[oi].grad && (reds[oi].api || reds[oi].api_ddof);
                else
                    op = &bins[oi], f = kind == 1 ? fwd_bin : fwd_sc, name = bins[oi].name,
                    has = bins[oi].grad && (kind == 1 || bins[oi].scalar);
                if (!has)
                    continue;
                for (int d = 0; d < 2; d++) {
                    double gx[N], gy[N], rx[N], ry[N];
                    grads(root, dts[d], f, op, xv, yv, N, gx, gy);
                    ndm__cpu_force_reference(true);
                    grads(root, dts[d], f, op, xv, yv, N, rx, ry);
                    if (level == 0 && dts[d] == NDM_F64)
                        check_numeric(root, name, f, op, xv, yv, N, rx, ry, &t);
                    ndm__cpu_force_reference(false);
                    double rtol = dts[d] == NDM_F32 ? 1e-4 : 1e-10;
                    for (int i = 0; i < 2 * N; i++) {
                        double g = i < N ? gx[i] : gy[i - N], w = i < N ? rx[i] : ry[i - N];
                        if (close_to(g, w, rtol, rtol))
                            continue;
                        if (!t.mismatches++)
                            snprintf(t.first, sizeof t.first,
                                     "backward of %s%s (%s), contiguous, table cpu[%s]: "
                                     "gradient of %s, element %d: got %.9g, expected %.9g",
                                     name, kind == 2 ? "_scalar" : "", ndm_dtype_name(dts[d]),
                                     ndm__cpu_isa_name((ndm__cpu_isa)level), i < N ? "x" : "y",
                                     i % N, g, w);
                        break;
                    }
                    checked++;
                }
            }
        }
    }
    assert_true(ndm__cpu_isa_force(-1));
    t.checked = checked;
    report("backward, cpu, every instruction-set table", &t);
}

/* The lists and the tables derived from them agree, and the hook refuses
 * a level this CPU cannot run. */
static void test_backend_ops_lists_and_levels(void **state)
{
    (void)state;
    for (int i = 0; i < N_UN; i++) {
        assert_int_equal(uns[i].op, i);
        assert_string_equal(ndm__ew_unop_name(uns[i].op), uns[i].name);
    }
    for (int i = 0; i < N_BIN; i++)
        assert_int_equal(bins[i].op, i);
    for (int i = 0; i < N_RED; i++)
        assert_int_equal(reds[i].op, i);
    ndm__cpu_isa best = ndm__cpu_isa_detected();
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        assert_int_equal(ndm__cpu_isa_force(level), level <= (int)best);
        assert_int_equal(ndm__cpu_isa_level(), level <= (int)best ? level : (int)best);
    }
    assert_false(ndm__cpu_isa_force(NDM__CPU_ISA_COUNT));
    assert_true(ndm__cpu_isa_force(-1));
    assert_int_equal(ndm__cpu_isa_parse("avx2"), NDM__CPU_ISA_AVX2);
    assert_int_equal(ndm__cpu_isa_parse("sse9"), -1);
}

/* Every (operation, computation dtype) slot of every level's elementwise
 * table has a kernel: the fast tables start from the reference loops. */
static void test_backend_ops_cpu_tables_have_every_slot(void **state)
{
    (void)state;
    static const ndm_dtype cts[] = {NDM_BOOL, NDM_U8, NDM_I32, NDM_I64, NDM_F32, NDM_F64};
    for (int level = 0; level < NDM__CPU_ISA_COUNT; level++) {
        const ndm__ew_isa *t = ndm__ew_isa_of(level);
        for (int k = 0; k < 6; k++) {
            ndm_dtype ct = cts[k];
            for (int op = 0; op < NDM__EW_UNOP_COUNT; op++)
                if (!t->un[op][ct])
                    fail_msg("%s table: no kernel for %s in %s", ndm__cpu_isa_name(level),
                             ndm__ew_unop_name(op), ndm_dtype_name(ct));
            for (int op = 0; op < NDM__EW_BINOP_COUNT; op++)
                if (!t->bin[op][ct])
                    fail_msg("%s table: no kernel for %s in %s", ndm__cpu_isa_name(level),
                             ndm__ew_binop_name(op), ndm_dtype_name(ct));
            assert_non_null(t->where[ct]);
        }
        for (int a = 0; a < NDM_DTYPE_COUNT; a++)
            for (int b = 0; b < NDM_DTYPE_COUNT; b++)
                assert_non_null(t->conv[a][b]);
    }
}

static void keep_warning(ndm_log_level level, const char *msg, void *ud)
{
    if (level == NDM_LOG_WARN)
        snprintf(ud, 256, "%s", msg);
}

/* NDM_CPU_ISA lowers the level; a value the CPU cannot run, or an unknown
 * one, is ignored with a warning that names it. */
static void test_backend_ops_env_lowers_level(void **state)
{
    (void)state;
    char warned[256] = "";
    ndm_set_log_fn(keep_warning, warned);
    ndm__cpu_isa best = ndm__cpu_isa_detected();
    setenv("NDM_CPU_ISA", "ref", 1);
    assert_true(ndm__cpu_isa_force(-1));
    assert_int_equal(ndm__cpu_isa_level(), NDM__CPU_ISA_REF);
    assert_string_equal(warned, "");
    setenv("NDM_CPU_ISA", "sse9", 1);
    assert_true(ndm__cpu_isa_force(-1));
    assert_int_equal(ndm__cpu_isa_level(), best);
    assert_non_null(strstr(warned, "NDM_CPU_ISA=sse9"));
    if (best < NDM__CPU_ISA_AVX512) {
        warned[0] = 0;
        setenv("NDM_CPU_ISA", "avx512", 1);
        assert_true(ndm__cpu_isa_force(-1));
        assert_int_equal(ndm__cpu_isa_level(), best);
        assert_non_null(strstr(warned, "runs at most"));
    }
    unsetenv("NDM_CPU_ISA");
    ndm_set_log_fn(NULL, NULL);
    assert_true(ndm__cpu_isa_force(-1));
    assert_int_equal(ndm__cpu_isa_level(), best);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_backend_ops_lists_and_levels),
        TEST(test_backend_ops_env_lowers_level),
        TEST(test_backend_ops_cpu_tables_have_every_slot),
        TEST(test_backend_ops_cpu_tables_match_reference),
        TEST(test_backend_ops_backward_matches_reference),
        TEST(test_backend_ops_cuda_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
