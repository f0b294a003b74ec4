/* The conformance suite: every operation of the operation lists
 * (lib/backends/ew.h, reduce.h) and of the random, index, linalg and nn
 * families x dtype x layout, on every backend and every
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
#include "../lib/backends/random.h"
#include "../lib/backends/linalg.h"
#include "../lib/backends/nn.h"
#include "../lib/backends/reduce.h"
#include "../lib/backends/index.h"
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
#define RED_ROW(ID, name, form, result, flags, grad, tol, ...)                   \
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

/* Indices in [lo, hi) (an index dtype: u8, i32, i64). */
static void fill_index(void *buf, ndm_dtype t, int64_t n, int64_t lo, int64_t hi, rng *r)
{
    for (int64_t i = 0; i < n; i++)
        host_set(buf, t, i, (double)(lo + (int64_t)(rnext(r) % (uint64_t)(hi - lo))));
}

/* +-0.5, +-1, +-2 and a rare NaN: sums and products of many of them are
 * exact in any order, so a long reduction split over threads must give the
 * reference's value; ties are common, which tests argmax's first position. */
static void fill_exact(void *buf, ndm_dtype t, int64_t n, rng *r)
{
    static const double vals[] = {0.5, 1, 2, -0.5, -1, -2};
    for (int64_t i = 0; i < n; i++)
        host_set(buf, t, i, rnext(r) % 3000 == 0 ? NAN : vals[rnext(r) % 6]);
}

/* n random finite elements of float dtype t. */
static void fill_finite(void *buf, ndm_dtype t, int64_t n, rng *r)
{
    for (int64_t i = 0; i < n; i++)
        host_set(buf, t, i, runif(r, -3, 3));
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
    int64_t shape[4], strides[4], offset, count;
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

/* How an input is filled: random values with a few special ones, values
 * whose sums and products are exact in any order (the long reductions), or
 * indices in [lo, hi). */
enum { FILL_RANDOM, FILL_EXACT, FILL_INDEX };

typedef struct fcase {
    ndm__op_family family; /* for the backend's supports table */
    const char *op;    /* for messages and the table */
    char dtypes[48];   /* for messages */
    layout l;
    ndm_dtype dt[MAX_OPS];
    view v[MAX_OPS];
    int nops;
    double tol;
    unsigned char fill[MAX_OPS];
    int64_t lo[MAX_OPS], hi[MAX_OPS];
    bool finite; /* inputs without infinities and NaN */
} fcase;

typedef struct tally {
    long checked, unsupported; /* unsupported: declined by the target's table, not run */
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
        else if (c->fill[k] == FILL_INDEX)
            fill_index(h->buf[k], c->dt[k], c->v[k].count, c->lo[k], c->hi[k], r);
        else if (c->fill[k] == FILL_EXACT && is_float(c->dt[k]))
            fill_exact(h->buf[k], c->dt[k], c->v[k].count, r);
        else if (c->finite)
            fill_finite(h->buf[k], c->dt[k], c->v[k].count, r);
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

/* ---- the supports table ------------------------------------------------------- */

/* A declined case through the dispatchers' path (ndm__backend_declines):
 * refused with NDM_E_UNSUPPORTED and a message naming the op, each dtype
 * and the device. */
static void site_fail_check(const target *tg, const ndm__op_case *q)
{
    ndm_clear_error();
    assert_true(ndm__backend_declines(tg->b, tg->dev, q, "test_backend_ops", __FILE__, __func__,
                                      __LINE__));
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    const char *msg = ndm_last_error();
    char dev[32];
    ndm_device_str(tg->dev, dev, sizeof dev);
    if (!strstr(msg, q->name) || !strstr(msg, dev))
        fail_msg("the refusal of %s does not name it and %s: %s", q->name, dev, msg);
    for (int k = 0; k < q->ndtypes; k++)
        if (!strstr(msg, ndm_dtype_short(q->dtypes[k])))
            fail_msg("the refusal of %s does not name dtype %s: %s", q->name,
                     ndm_dtype_short(q->dtypes[k]), msg);
}

/* The layout bits of a kernel operand, as the dispatchers give them. */
static unsigned view_layout(int nd, const int64_t *shape, const int64_t *strides)
{
    unsigned l = 0;
    int64_t want = 1;
    for (int i = nd - 1; i >= 0; i--) {
        if (shape[i] == 0)
            l |= NDM__LAYOUT_EMPTY;
        if (shape[i] != 1 && strides[i] != want)
            l |= strides[i] == 0 ? NDM__LAYOUT_BROADCAST : NDM__LAYOUT_STRIDED;
        want *= shape[i];
    }
    return l;
}

/* Does the target's table run the case? (true without a table.) When it
 * declines, the dispatchers' refusal is checked too: NDM_E_UNSUPPORTED, and
 * a message that names the op, its dtypes and the device. */
static bool table_runs(const target *tg, const ndm__op_case *q, tally *t)
{
    if (!tg->b->supports || tg->b->supports(tg->dev.index, q))
        return true;
    site_fail_check(tg, q);
    t->unsupported++;
    return false;
}

/* The case fcase c puts to the table: elementwise cases carry their inputs'
 * dtypes (the dispatchers ask before the result's is known), the others
 * every operand's, the output first. */
static ndm__op_case case_of(const fcase *c)
{
    ndm__op_case q = {c->family, 0, c->op, 0, 0, {0}};
    int first = c->family == NDM__OPS_EW ? 1 : 0;
    for (int k = 0; k < c->nops; k++)
        q.layout |= view_layout(c->v[k].ndim, c->v[k].shape, c->v[k].strides);
    for (int k = first; k < c->nops && q.ndtypes < NDM__OP_MAX_OPERANDS; k++)
        q.dtypes[q.ndtypes++] = c->dt[k];
    return q;
}

/* Run `fn` on the target's operands and on the reference's, and compare. */
typedef ndm_status (*case_fn)(const ndm__backend *b, int device, const fcase *c,
                              const ndm__tensor *ops, const void *ctx);

static void run_case(const target *tg, const fcase *c, case_fn fn, const void *ctx, rng *r,
                     double atol_scale, tally *t)
{
    ndm__op_case q = case_of(c);
    if (!table_runs(tg, &q, t))
        return;
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
    if (ts != NDM_OK) {
        /* the table said it runs: a refusal is a disagreement too */
        if (!t->mismatches++)
            snprintf(t->first, sizeof t->first, "%s (%s), %s, table %s: failed with %s%s", c->op,
                     c->dtypes, layout_names[c->l], tg->name, ndm_status_name(ts),
                     ts == NDM_E_UNSUPPORTED ? " (its supports table said it runs)" : "");
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

/* Casts are the backend's copy between dtypes: every pair, every layout. */
static ndm_status run_cast(const ndm__backend *b, int device, const fcase *c,
                           const ndm__tensor *t, const void *ctx)
{
    (void)c;
    (void)ctx;
    return b->copy(device, &t[0], &t[1]);
}

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
                fcase c = {.family = NDM__OPS_EW,
                           .op = o->name, .l = (layout)l, .nops = 2, .tol = o->tol};
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
                fcase c = {.family = NDM__OPS_EW,
                           .op = o->name, .l = (layout)l, .nops = 3, .tol = o->tol};
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
                fcase c = {.family = NDM__OPS_EW,
                           .op = o->name, .l = L_CONTIGUOUS, .nops = form < 2 ? 2 : 3,
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
    for (int si = 0; si < N_DTYPES; si++) {
        for (int di = 0; di < N_DTYPES; di++) {
            for (int l = 0; l < L_COUNT; l++) {
                fcase c = {.family = NDM__OPS_CORE, .op = "cast", .l = (layout)l, .nops = 2};
                snprintf(c.dtypes, sizeof c.dtypes, "%s to %s", ndm_dtype_name(all_dtypes[si]),
                         ndm_dtype_name(all_dtypes[di]));
                c.dt[0] = all_dtypes[di], c.dt[1] = all_dtypes[si];
                c.v[0] = out_view((layout)l), c.v[1] = in_view((layout)l, 1);
                run_case(tg, &c, run_cast, NULL, r, 1, t);
            }
        }
    }
    for (int di = 0; di < N_DTYPES; di++) {
        ndm_dtype dt = all_dtypes[di];
        ew_ctx x = {.ct = compute_of(dt)};
        for (int l = 0; l < L_COUNT; l++) {
            fcase c = {.family = NDM__OPS_EW, .op = "where", .l = (layout)l, .nops = 4};
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

/* Long reductions, so that a backend's paths for many elements per output
 * run too: a few long rows (a block per output, split in parts), many short
 * strided rows (a thread per output), middling rows (a warp per output) and
 * one reduction of a whole vector. The values and the power-of-two lengths
 * make every order of summing exact, the deviations of var and std too. */
typedef struct long_shape {
    const char *name;
    view in, out;
    layout l;
} long_shape;

static void reduce_long(const target *tg, const red_op *o, ndm_dtype dt, rng *r, tally *t)
{
    static const long_shape shapes[] = {
        {"3 long rows", {2, {3, 4096}, {4096, 1}, 0, 12288}, {1, {3}, {1}, 0, 3}, L_CONTIGUOUS},
        {"4100 strided rows of 32", {2, {4100, 32}, {1, 4100}, 0, 131200},
         {1, {4100}, {1}, 0, 4100}, L_TRANSPOSED},
        {"40 rows of 128", {2, {40, 128}, {128, 1}, 0, 5120}, {1, {40}, {1}, 0, 40},
         L_CONTIGUOUS},
        {"a whole vector", {1, {16384}, {1}, 0, 16384}, {0, {0}, {0}, 0, 1}, L_CONTIGUOUS},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const long_shape *sh = &shapes[i];
        red_ctx x = {o->op, sh->in.ndim - sh->out.ndim};
        fcase c = {.family = NDM__OPS_REDUCE, .op = o->name, .l = sh->l, .nops = 2, .tol = o->tol};
        snprintf(c.dtypes, sizeof c.dtypes, "%s, %s", ndm_dtype_name(dt), sh->name);
        c.dt[0] = ndm__reduce_result_dtype(o->op, dt), c.dt[1] = dt;
        c.v[0] = sh->out, c.v[1] = sh->in;
        c.fill[1] = FILL_EXACT;
        run_case(tg, &c, run_reduce, &x, r, 10, t);
    }
}

typedef struct smx_ctx {
    int axis;
    bool log;
} smx_ctx;

static ndm_status run_softmax(const ndm__backend *b, int device, const fcase *c,
                              const ndm__tensor *t, const void *ctx)
{
    (void)c;
    const smx_ctx *x = ctx;
    if (!b->reduce)
        return NDM_E_UNSUPPORTED;
    return b->reduce->softmax(device, &t[0], &t[1], x->axis, x->log);
}

/* softmax and log_softmax along either axis of every layout (rank 0 comes
 * as one element with stride 0, as the dispatcher passes it), then along
 * long rows. */
static void softmax_forward(const target *tg, rng *r, tally *t)
{
    static const view long_in[2] = {{2, {3, 4096}, {4096, 1}, 0, 12288},
                                    {2, {40, 128}, {1, 40}, 0, 5120}};
    for (int di = 0; di < N_DTYPES; di++) {
        ndm_dtype dt = all_dtypes[di];
        for (int lg = 0; lg < 2; lg++) {
            for (int l = 0; l < L_COUNT; l++) {
                for (int axis = 0; axis < (l == L_RANK0 ? 1 : 2); axis++) {
                    smx_ctx x = {axis, lg};
                    fcase c = {.family = NDM__OPS_REDUCE,
                               .op = lg ? "log_softmax" : "softmax", .l = (layout)l, .nops = 2,
                               .tol = 1e-5};
                    snprintf(c.dtypes, sizeof c.dtypes, "%s, axis %d", ndm_dtype_name(dt), axis);
                    c.dt[0] = is_float(dt) ? dt : NDM_F32, c.dt[1] = dt;
                    c.v[0] = out_view((layout)l), c.v[1] = in_view((layout)l, 0);
                    if (l == L_RANK0)
                        c.v[0] = c.v[1] = (view){1, {1}, {0}, 0, 1};
                    run_case(tg, &c, run_softmax, &x, r, 10, t);
                }
            }
            for (int i = 0; i < 2; i++) {
                smx_ctx x = {1, lg};
                fcase c = {.family = NDM__OPS_REDUCE, .op = lg ? "log_softmax" : "softmax",
                           .l = i ? L_TRANSPOSED : L_CONTIGUOUS, .nops = 2, .tol = 1e-5};
                snprintf(c.dtypes, sizeof c.dtypes, "%s, long rows", ndm_dtype_name(dt));
                c.dt[0] = is_float(dt) ? dt : NDM_F32, c.dt[1] = dt;
                c.v[0] = c.v[1] = long_in[i];
                c.fill[1] = FILL_EXACT;
                run_case(tg, &c, run_softmax, &x, r, 10, t);
            }
        }
    }
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
                    fcase c = {.family = NDM__OPS_REDUCE,
                               .op = o->name, .l = (layout)l, .nops = 2, .tol = o->tol};
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
            reduce_long(tg, o, dt, r, t);
        }
    }
    softmax_forward(tg, r, t);
}

/* ---- index ----------------------------------------------------------------- */

typedef struct ix_ctx {
    int kind, axis;
    ndm_pad_mode mode;
    int64_t before[2];
    int64_t lo, hi;
} ix_ctx;

enum { IX_COPY, IX_FIND, IX_TAKE, IX_GATHER, IX_SCATTER, IX_ONE_HOT, IX_PAD, IX_CUMSUM, IX_CUMPROD,
       IX_NONZERO, IX_TRIL, IX_TRIU, IX_SORT_VALUES, IX_SORT_INDICES };

static ndm_status run_index(const ndm__backend *b, int device, const fcase *c,
                            const ndm__tensor *t, const void *ctx)
{
    (void)c;
    const ix_ctx *x = ctx;
    const struct ndm__backend_index *f = b->index;
    if (!f)
        return NDM_E_UNSUPPORTED;
    switch (x->kind) {
    case IX_COPY: return f->copy(device, &t[0], &t[1]);
    case IX_FIND: {
        /* the answer goes into the output operand, which is compared */
        int64_t res[2] = {-7, -7};
        ndm_status st = f->find_outside(device, &t[1], x->lo, x->hi, &res[0], &res[1]);
        if (st < 0)
            return st;
        if (res[0] < 0)
            res[1] = 0;
        if (b->type == NDM_DEVICE_CPU)
            memcpy(t[0].data, res, sizeof res);
        else
            st = b->upload(device, t[0].data, res, sizeof res);
        return st;
    }
    case IX_TAKE: return f->take(device, &t[0], &t[1], x->axis, &t[2]);
    case IX_GATHER: return f->gather(device, &t[0], &t[1], x->axis, &t[2]);
    case IX_SCATTER: return f->scatter_add(device, &t[0], x->axis, &t[1], &t[2]);
    case IX_ONE_HOT: return f->one_hot(device, &t[0], &t[1]);
    case IX_PAD: return f->pad(device, &t[0], &t[1], x->before, x->mode, -1.5);
    case IX_CUMSUM: return f->cumsum(device, &t[0], &t[1], x->axis);
    case IX_CUMPROD: return f->cumprod(device, &t[0], &t[1], x->axis);
    case IX_TRIL:
    case IX_TRIU: return f->tri(device, &t[0], &t[1], x->lo, x->kind == IX_TRIU);
    /* hi: descending */
    case IX_SORT_VALUES: return f->sort(device, &t[0], NULL, &t[1], x->axis, x->hi != 0);
    case IX_SORT_INDICES: return f->sort(device, NULL, &t[0], &t[1], x->axis, x->hi != 0);
    case IX_NONZERO: {
        /* the count goes into the output's first element, the positions
         * after it; the rest of the output stays as it was */
        int64_t count = -7;
        ndm_status st = f->nonzero(device, NULL, &t[1], &count);
        if (st < 0)
            return st;
        if (count < 0 || count > t[0].shape[0] - 1)
            return NDM_E_INVALID;
        if (b->type == NDM_DEVICE_CPU)
            memcpy(t[0].data, &count, sizeof count);
        else
            st = b->upload(device, t[0].data, &count, sizeof count);
        if (st < 0 || count == 0)
            return st;
        const int64_t one = 1;
        ndm__tensor d = {(int64_t *)t[0].data + 1, NDM_I64, 1, &count, &one};
        return f->nonzero(device, &d, &t[1], NULL);
    }
    }
    return NDM_E_INVALID;
}

/* A C-contiguous view of `shape` (count elements). */
static view dense_view(int ndim, const int64_t *shape)
{
    view v = {ndim, {0}, {0}, 0, 1};
    for (int d = ndim - 1; d >= 0; d--) {
        v.shape[d] = shape[d];
        v.strides[d] = v.count;
        v.count *= shape[d];
    }
    return v;
}

static const ndm_dtype index_dtypes[3] = {NDM_U8, NDM_I32, NDM_I64};

/* One case of the index family: operand views and dtypes given. */
static void ix_case(const target *tg, rng *r, tally *t, const char *op, ndm_dtype dt, layout l,
                    const ix_ctx *x, int nops, const ndm_dtype *dts, const view *vs,
                    int idx_operand, ndm_dtype it)
{
    fcase c = {.family = NDM__OPS_INDEX, .op = op, .l = l, .nops = nops};
    snprintf(c.dtypes, sizeof c.dtypes, "%s, %s indices", ndm_dtype_name(dt), ndm_dtype_name(it));
    for (int k = 0; k < nops; k++)
        c.dt[k] = dts[k], c.v[k] = vs[k];
    if (idx_operand > 0) {
        c.fill[idx_operand] = FILL_INDEX;
        c.lo[idx_operand] = it == NDM_U8 && x->lo < 0 ? 0 : x->lo;
        c.hi[idx_operand] = x->hi;
    }
    run_case(tg, &c, run_index, x, r, 1, t);
}

/* Every member of the index family, every data dtype, the layouts of the
 * source (contiguous, transposed, stepped, broadcast, size-0; rank-0 where
 * the operation takes it), indices of the three index dtypes in turn and
 * broadcast indices where the contract allows them. */
static void index_forward(const target *tg, rng *r, tally *t)
{
    for (int di = 0; di < N_DTYPES; di++) {
        ndm_dtype dt = all_dtypes[di];
        for (int l = 0; l < L_COUNT; l++) {
            ndm_dtype it = index_dtypes[(di + l) % 3];
            view in = in_view((layout)l, 1);
            bool empty = l == L_EMPTY, rank0 = l == L_RANK0;
            /* copy, converting too */
            for (int conv = 0; conv < 2; conv++) {
                ix_ctx x = {.kind = IX_COPY};
                ndm_dtype dts[2] = {conv ? NDM_F32 : dt, dt};
                view vs[2] = {out_view((layout)l), in};
                ix_case(tg, r, t, conv ? "copy to float32" : "copy", dt, (layout)l, &x, 2, dts,
                        vs, 0, dt);
            }
            /* find_outside: the answer in a two-element i64 output */
            if (dt == NDM_U8 || dt == NDM_I32 || dt == NDM_I64) {
                for (int hi = 3; hi <= 41; hi += 38) {
                    ix_ctx x = {.kind = IX_FIND, .lo = dt == NDM_U8 ? 0 : -20, .hi = hi};
                    ndm_dtype dts[2] = {NDM_I64, dt};
                    view vs[2] = {{1, {2}, {1}, 0, 2}, in};
                    ix_case(tg, r, t, hi == 41 ? "find_outside, none" : "find_outside", dt,
                            (layout)l, &x, 2, dts, vs, 0, dt);
                }
            }
            /* nonzero: the count, then the positions, in one i64 output of
             * room for every element */
            {
                ix_ctx x = {.kind = IX_NONZERO};
                int64_t room = view_size(&in) + 1;
                ndm_dtype dts[2] = {NDM_I64, dt};
                view vs[2] = {{1, {room}, {1}, 0, room}, in};
                ix_case(tg, r, t, "nonzero", dt, (layout)l, &x, 2, dts, vs, 0, dt);
            }
            if (!rank0) {
                /* take along either axis with a 1-d index; along axis 0 with
                 * a 2-d one */
                for (int axis = 0; axis < 2; axis++) {
                    int64_t n = in.shape[axis];
                    if (n == 0)
                        continue;
                    ix_ctx x = {.kind = IX_TAKE, .axis = axis, .lo = -n, .hi = n};
                    int64_t osh[2] = {axis ? in.shape[0] : 4, axis ? 4 : in.shape[1]};
                    view idx = {1, {4}, {1}, 0, 4};
                    ndm_dtype dts[3] = {dt, dt, it};
                    view vs[3] = {dense_view(2, osh), in, idx};
                    ix_case(tg, r, t, "take", dt, (layout)l, &x, 3, dts, vs, 2, it);
                }
                {
                    ix_ctx x = {.kind = IX_TAKE, .axis = 1, .lo = -C, .hi = C};
                    int64_t osh[3] = {in.shape[0], 2, 3};
                    view idx = {2, {2, 3}, {1, 2}, 0, 6}; /* a transposed index */
                    ndm_dtype dts[3] = {dt, dt, it};
                    view vs[3] = {dense_view(3, osh), in, idx};
                    ix_case(tg, r, t, "take, 2-d index", dt, (layout)l, &x, 3, dts, vs, 2, it);
                }
                /* gather along axis 1: a (rows, 4) index, dense or broadcast
                 * down the rows */
                for (int bc = 0; bc < 2; bc++) {
                    ix_ctx x = {.kind = IX_GATHER, .axis = 1, .lo = -C, .hi = C};
                    int64_t osh[2] = {in.shape[0], 4};
                    view idx = dense_view(2, osh);
                    if (bc)
                        idx.strides[0] = 0, idx.count = 4;
                    ndm_dtype dts[3] = {dt, dt, it};
                    view vs[3] = {dense_view(2, osh), in, idx};
                    ix_case(tg, r, t, bc ? "gather, broadcast index" : "gather", dt, (layout)l,
                            &x, 3, dts, vs, 2, it);
                }
                /* scatter_add into a (rows, 7) destination along either axis
                 * from 9 sources per line: repeated targets are certain. The
                 * sources take the layout; the index is broadcast in the
                 * broadcast layout. */
                for (int axis = 0; axis < 2; axis++) {
                    int64_t n = axis ? C : in.shape[0];
                    if (n == 0 && !empty)
                        continue;
                    ix_ctx x = {.kind = IX_SCATTER, .axis = axis, .lo = -n, .hi = n ? n : 1};
                    int64_t ish[2] = {axis ? in.shape[0] : 9, axis ? 9 : C};
                    int64_t dsh[2] = {in.shape[0], C};
                    view idx = dense_view(2, ish), src = dense_view(2, ish);
                    if (l == L_TRANSPOSED)
                        src.strides[0] = 1, src.strides[1] = ish[0];
                    if (l == L_STEPPED)
                        src.strides[0] = -ish[1], src.offset = (ish[0] - 1) * ish[1];
                    if (l == L_BROADCAST)
                        idx.strides[1 - axis] = 0, src.strides[1 - axis] = 0;
                    if (empty && axis == 0)
                        idx.shape[0] = src.shape[0] = 0, idx.count = src.count = 0;
                    ndm_dtype dts[3] = {dt, it, dt};
                    view vs[3] = {dense_view(2, dsh), idx, src};
                    ix_case(tg, r, t, "scatter_add", dt, (layout)l, &x, 3, dts, vs, 1, it);
                }
                /* long lines (300 sources onto 7 targets each), whose
                 * additions a backend may spread over threads but must
                 * make in order; transposed sources */
                if (l == L_CONTIGUOUS) {
                    ix_ctx x = {.kind = IX_SCATTER, .axis = 1, .lo = -C, .hi = C};
                    int64_t ish[2] = {3, 300}, dsh[2] = {3, C};
                    view src = {2, {3, 300}, {1, 3}, 0, 900};
                    ndm_dtype dts[3] = {dt, it, dt};
                    view vs[3] = {dense_view(2, dsh), dense_view(2, ish), src};
                    ix_case(tg, r, t, "scatter_add, long lines", dt, (layout)l, &x, 3, dts, vs,
                            1, it);
                }
            }
            /* one_hot: indices of this layout (their dtype), classes 6, the
             * data dtype as the output's */
            {
                ix_ctx x = {.kind = IX_ONE_HOT, .lo = 0, .hi = 6};
                view idx = in;
                if (l == L_BROADCAST)
                    idx = in_view((layout)l, 0);
                int64_t osh[3] = {idx.shape[0], idx.shape[1], 6};
                if (rank0)
                    osh[0] = 6;
                ndm_dtype dts[2] = {dt, it};
                view vs[2] = {dense_view(idx.ndim + 1, osh), idx};
                ix_case(tg, r, t, "one_hot", dt, (layout)l, &x, 2, dts, vs, 1, it);
            }
            if (!rank0) {
                /* pad: every mode; reflect wider than the axis */
                for (int mode = 0; mode < 3; mode++) {
                    ix_ctx x = {.kind = IX_PAD, .mode = (ndm_pad_mode)mode,
                                .before = {empty && mode ? 0 : 1, 9}};
                    int64_t after[2] = {empty && mode ? 0 : 2, 3};
                    int64_t osh[2] = {in.shape[0] + x.before[0] + after[0],
                                      in.shape[1] + x.before[1] + after[1]};
                    ndm_dtype dts[2] = {dt, dt};
                    view vs[2] = {dense_view(2, osh), in};
                    static const char *const names[3] = {"pad, constant", "pad, edge",
                                                         "pad, reflect"};
                    ix_case(tg, r, t, names[mode], dt, (layout)l, &x, 2, dts, vs, 0, dt);
                }
                /* cumsum along either axis */
                for (int axis = 0; axis < 2; axis++) {
                    ix_ctx x = {.kind = IX_CUMSUM, .axis = axis};
                    ndm_dtype dts[2] = {is_float(dt) ? dt : NDM_I64, dt};
                    view vs[2] = {out_view((layout)l), in};
                    ix_case(tg, r, t, axis ? "cumsum, axis 1" : "cumsum, axis 0", dt, (layout)l,
                            &x, 2, dts, vs, 0, dt);
                    x.kind = IX_CUMPROD;
                    ix_case(tg, r, t, axis ? "cumprod, axis 1" : "cumprod, axis 0", dt,
                            (layout)l, &x, 2, dts, vs, 0, dt);
                }
                /* tril and triu with offsets below, on and above the diagonal */
                for (int k = -2; k <= 3; k++) {
                    ix_ctx x = {.kind = k % 2 ? IX_TRIU : IX_TRIL, .lo = k};
                    ndm_dtype dts[2] = {dt, dt};
                    view vs[2] = {out_view((layout)l), in};
                    ix_case(tg, r, t, k % 2 ? "triu" : "tril", dt, (layout)l, &x, 2, dts, vs, 0,
                            dt);
                }
                /* sort along either axis, both directions: the values, the
                 * positions, and the first 3 of each (topk) */
                for (int axis = 0; axis < 2; axis++) {
                    for (int desc = 0; desc < 2; desc++) {
                        for (int keep = 0; keep < 2; keep++) {
                            int64_t osh[2] = {in.shape[0], in.shape[1]};
                            if (keep)
                                osh[axis] = osh[axis] < 3 ? osh[axis] : 3;
                            ix_ctx x = {.kind = IX_SORT_VALUES, .axis = axis, .hi = desc};
                            ndm_dtype dts[2] = {dt, dt};
                            view vs[2] = {dense_view(2, osh), in};
                            static const char *const names[2][2] = {
                                {"sort", "sort, descending"}, {"topk 3", "topk 3, smallest"}};
                            ix_case(tg, r, t, names[keep][!desc], dt, (layout)l, &x, 2, dts, vs,
                                    0, dt);
                            x.kind = IX_SORT_INDICES;
                            dts[0] = NDM_I64;
                            ix_case(tg, r, t, keep ? "topk 3, indices" : "argsort", dt,
                                    (layout)l, &x, 2, dts, vs, 0, dt);
                        }
                    }
                }
            }
        }
        /* lines longer than a block of threads and the CPU's insertion runs,
         * with many ties (small integers) or random values; a batch of
         * triangles read with the batch axis in the middle */
        for (int ties = 0; ties < 2; ties++) {
            for (int desc = 0; desc < 2; desc++) {
                ix_ctx x = {.kind = IX_SORT_INDICES, .axis = 1, .hi = desc};
                int64_t sh[2] = {3, 600};
                view vs[2] = {dense_view(2, sh), dense_view(2, sh)};
                ndm_dtype dts[2] = {NDM_I64, dt};
                fcase c = {.family = NDM__OPS_INDEX, .op = ties ? "argsort, long ties" : "argsort, long",
                           .l = L_CONTIGUOUS, .nops = 2};
                snprintf(c.dtypes, sizeof c.dtypes, "%s", ndm_dtype_name(dt));
                for (int k = 0; k < 2; k++)
                    c.dt[k] = dts[k], c.v[k] = vs[k];
                if (ties)
                    c.fill[1] = FILL_INDEX, c.lo[1] = 0, c.hi[1] = 6;
                run_case(tg, &c, run_index, &x, r, 1, t);
                x.kind = IX_SORT_VALUES;
                c.dt[0] = dt;
                c.op = ties ? "sort, long ties" : "sort, long";
                run_case(tg, &c, run_index, &x, r, 1, t);
            }
        }
        {
            ix_ctx x = {.kind = IX_TRIL, .lo = 1};
            int64_t sh[3] = {3, 4, 6};
            view src = {3, {3, 4, 6}, {6, 18, 1}, 0, 72};
            view vs[2] = {dense_view(3, sh), src};
            ndm_dtype dts[2] = {dt, dt};
            ix_case(tg, r, t, "tril, batch", dt, L_TRANSPOSED, &x, 2, dts, vs, 0, dt);
            x.kind = IX_TRIU, x.lo = -1;
            ix_case(tg, r, t, "triu, batch", dt, L_TRANSPOSED, &x, 2, dts, vs, 0, dt);
        }
    }
}

/* ---- random ------------------------------------------------------------------
 * A seeded draw on a target against the same draw on the CPU: bit for bit
 * against the CPU's fast kernels (the backends share the stream, the
 * formulas and normal's polynomials), and, for the CPU itself, against the
 * reference kernels, which are exact except for normal's libm (ndm/random.h:
 * a few units in the last place). The whole buffer is compared, so an
 * element written outside the view fails too. */

enum { RND_UNIFORM, RND_NORMAL, RND_RANDINT, RND_BERNOULLI, RND_PERMUTATION, RND_COUNT };
static const char *const rnd_names[RND_COUNT] = {"uniform", "normal", "randint", "bernoulli",
                                                 "permutation"};

typedef struct rnd_case {
    int kind;
    ndm_rng rng;
    double a, b;
    int64_t lo, hi;
} rnd_case;

static ndm_status run_random(const ndm__backend *b, int device, const ndm__tensor *t,
                             const rnd_case *x)
{
    if (!b->random)
        return NDM_E_UNSUPPORTED;
    switch (x->kind) {
    case RND_UNIFORM: return b->random->uniform(device, t, x->rng, x->a, x->b);
    case RND_NORMAL: return b->random->normal(device, t, x->rng, x->a, x->b);
    case RND_RANDINT: return b->random->randint(device, t, x->rng, x->lo, x->hi);
    case RND_BERNOULLI: return b->random->bernoulli(device, t, x->rng, x->a);
    default: return b->random->permutation(device, t, x->rng);
    }
}

static void random_case(const target *tg, const rnd_case *x, ndm_dtype dt, const view *v,
                        const char *lname, tally *t)
{
    ndm__op_case q = {NDM__OPS_RANDOM, 0, rnd_names[x->kind],
                      view_layout(v->ndim, v->shape, v->strides), 1, {dt}};
    if (!table_runs(tg, &q, t))
        return;
    bool vs_ref = tg->dev.type == NDM_DEVICE_CPU;
    const ndm__backend *oracle = vs_ref ? &ndm__cpu_ref_backend : ndm__backend_for(NDM_DEVICE_CPU);
    size_t es = ndm__ew_esize(dt), bytes = (size_t)v->count * es;
    unsigned char *want = malloc(bytes + 1), *got = malloc(bytes + 1);
    assert_true(want && got);
    memset(want, 0xa5, bytes);
    ndm__tensor w = {want + v->offset * (int64_t)es, dt, v->ndim, v->shape, v->strides};
    ndm_status rs = run_random(oracle, 0, &w, x);
    if (rs != NDM_OK)
        fail_msg("%s (%s), %s: the CPU failed: %s", rnd_names[x->kind], ndm_dtype_name(dt),
                 lname, ndm_status_name(rs));
    dbuf d;
    assert_true(dbuf_get(tg, &d, bytes));
    memset(got, 0xa5, bytes);
    dbuf_up(tg, &d, got, bytes);
    ndm__tensor tt = {(char *)d.p + v->offset * (int64_t)es, dt, v->ndim, v->shape, v->strides};
    ndm_status ts = run_random(tg->b, tg->dev.index, &tt, x);
    if (ts != NDM_OK) {
        if (!t->mismatches++)
            snprintf(t->first, sizeof t->first, "%s (%s), %s, %s: failed with %s",
                     rnd_names[x->kind], ndm_dtype_name(dt), lname, tg->name,
                     ndm_status_name(ts));
    } else {
        dbuf_down(tg, &d, got, bytes);
        t->checked++;
        for (int64_t i = 0; i < v->count; i++) {
            const unsigned char *g = got + i * (int64_t)es, *e = want + i * (int64_t)es;
            bool ok = !memcmp(g, e, es);
            if (!ok && vs_ref && x->kind == RND_NORMAL) {
                double rtol = dt == NDM_F64 ? 1e-12 : dt == NDM_F32 ? 1e-5 : 8e-3;
                ok = close_to(host_get(g, dt, 0), host_get(e, dt, 0), rtol, rtol);
            }
            if (ok)
                continue;
            if (!t->mismatches++)
                snprintf(t->first, sizeof t->first,
                         "%s (%s), %s, %s: buffer element %" PRId64 " got %.17g, expected %.17g",
                         rnd_names[x->kind], ndm_dtype_name(dt), lname, tg->name, i,
                         host_get(g, dt, 0), host_get(e, dt, 0));
            break;
        }
    }
    dbuf_put(&d);
    free(want);
    free(got);
}

/* multinomial: rows of weights (a few zero, one row refused in the last
 * case) of each float dtype, contiguous or transposed, into a contiguous
 * or transposed i64 output; the draws, and the refusal (its position and
 * reason), equal the CPU's bit for bit. */
static void multinomial_forward(const target *tg, rng *r, tally *t)
{
    static const ndm_dtype fts[4] = {NDM_F16, NDM_BF16, NDM_F32, NDM_F64};
    for (int fi = 0; fi < 4; fi++) {
        ndm_dtype dt = fts[fi];
        for (int variant = 0; variant < 6; variant++) {
            bool repl = variant % 2 == 0, trans = variant / 2 == 1, refuse = variant >= 4;
            int64_t rows = 6, n = 37, samples = repl ? 50 : 20;
            ndm__op_case q = {NDM__OPS_RANDOM, 0, "multinomial",
                              trans ? NDM__LAYOUT_STRIDED : 0, 2, {dt, NDM_I64}};
            if (!table_runs(tg, &q, t))
                continue;
            size_t es = ndm__ew_esize(dt), pb = (size_t)(rows * n) * es,
                   db = (size_t)(rows * samples) * sizeof(int64_t);
            unsigned char *hp = malloc(pb);
            int64_t *want = malloc(db), *got = malloc(db);
            assert_true(hp && want && got);
            for (int64_t i = 0; i < rows * n; i++)
                host_set(hp, dt, i, rnext(r) % 5 == 0 ? 0.0 : runif(r, 0.01, 4.0));
            if (refuse)
                host_set(hp, dt, 3 * n + 11, variant == 4 ? -0.5 : NAN);
            int64_t psh[2] = {rows, n}, pst[2] = {n, 1}, dsh[2] = {rows, samples},
                    dst_[2] = {samples, 1};
            if (trans) /* probs stored column-major, the draws too */
                pst[0] = 1, pst[1] = rows, dst_[0] = 1, dst_[1] = rows;
            rnd_case x = {.rng = {rnext(r), rnext(r) % 5, rnext(r) % 1000}};
            bool vs_ref = tg->dev.type == NDM_DEVICE_CPU;
            const ndm__backend *oracle =
                vs_ref ? &ndm__cpu_ref_backend : ndm__backend_for(NDM_DEVICE_CPU);
            /* the transposed host copy holds the same logical rows */
            unsigned char *src = malloc(pb);
            assert_non_null(src);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < n; j++)
                    memcpy(src + (i * pst[0] + j * pst[1]) * (int64_t)es, hp + (i * n + j) * (int64_t)es,
                           es);
            memset(want, 0xa5, db);
            memset(got, 0xa5, db);
            ndm__tensor wp = {src, dt, 2, psh, pst}, wd = {want, NDM_I64, 2, dsh, dst_};
            int64_t wbad[2] = {-7, -7}, gbad[2] = {-7, -7};
            assert_ok(oracle->random->multinomial(0, &wd, &wp, x.rng, repl, wbad));
            dbuf dp, dd;
            assert_true(dbuf_get(tg, &dp, pb) && dbuf_get(tg, &dd, db));
            dbuf_up(tg, &dp, src, pb);
            dbuf_up(tg, &dd, got, db);
            ndm__tensor tp = {dp.p, dt, 2, psh, pst}, td = {dd.p, NDM_I64, 2, dsh, dst_};
            ndm_status ts = tg->b->random->multinomial(tg->dev.index, &td, &tp, x.rng, repl, gbad);
            char what[96];
            snprintf(what, sizeof what, "multinomial (%s%s%s%s)", ndm_dtype_name(dt),
                     repl ? ", with replacement" : "", trans ? ", transposed" : "",
                     refuse ? ", refused" : "");
            if (ts != NDM_OK) {
                if (!t->mismatches++)
                    snprintf(t->first, sizeof t->first, "%s, %s: failed with %s", what, tg->name,
                             ndm_status_name(ts));
            } else {
                dbuf_down(tg, &dd, got, db);
                t->checked++;
                if (refuse && !(wbad[1] == (variant == 4 ? NDM__MN_NEGATIVE : NDM__MN_NONFINITE) &&
                                wbad[0] == 3 * n + 11))
                    fail_msg("%s: the CPU reports %lld at %lld", what, (long long)wbad[1],
                             (long long)wbad[0]);
                if (gbad[0] != wbad[0] || gbad[1] != wbad[1] || memcmp(got, want, db)) {
                    if (!t->mismatches++)
                        snprintf(t->first, sizeof t->first,
                                 "%s, %s: draws or refusal differ (refusal %lld at %lld, "
                                 "expected %lld at %lld)",
                                 what, tg->name, (long long)gbad[1], (long long)gbad[0],
                                 (long long)wbad[1], (long long)wbad[0]);
                }
            }
            dbuf_put(&dp);
            dbuf_put(&dd);
            free(src);
            free(hp);
            free(want);
            free(got);
        }
    }
}

static void random_forward(const target *tg, rng *r, tally *t)
{
    multinomial_forward(tg, r, t);
    /* parameters per distribution and dtype: randint's i64 takes both word
     * counts (ranges up to 2^32 and above) */
    for (int kind = 0; kind < RND_PERMUTATION; kind++) {
        for (int di = 0; di < N_DTYPES; di++) {
            ndm_dtype dt = all_dtypes[di];
            bool flt = is_float(dt);
            if ((kind == RND_UNIFORM || kind == RND_NORMAL) && !flt)
                continue;
            if (kind == RND_RANDINT && dt != NDM_U8 && dt != NDM_I32 && dt != NDM_I64)
                continue;
            for (int variant = 0; variant < (kind == RND_RANDINT && dt == NDM_I64 ? 2 : 1);
                 variant++) {
                rnd_case x = {.kind = kind,
                              .rng = {rnext(r), rnext(r) % 5, rnext(r) % 1000}};
                switch (kind) {
                case RND_UNIFORM: x.a = -1.5, x.b = 2.25; break;
                case RND_NORMAL: x.a = 0.3, x.b = 1.7; break;
                case RND_BERNOULLI: x.a = 0.3; break;
                default:
                    x.lo = dt == NDM_U8 ? 3 : variant ? -((int64_t)1 << 40) : -1000;
                    x.hi = dt == NDM_U8 ? 200 : variant ? (int64_t)1 << 41 : 1000;
                    break;
                }
                /* every output layout: broadcast has no meaning for an output */
                for (int l = 0; l < L_COUNT; l++) {
                    if (l == L_BROADCAST)
                        continue;
                    view v = l == L_STEPPED ? in_view(L_STEPPED, 1) : out_view((layout)l);
                    random_case(tg, &x, dt, &v, layout_names[l], t);
                }
            }
        }
    }
    /* permutation: 1-d i64, forward, reversed with a step, empty */
    static const view pviews[3] = {{1, {35}, {1}, 0, 35}, {1, {35}, {-2}, 68, 70},
                                   {1, {0}, {1}, 0, 0}};
    static const char *const pnames[3] = {"contiguous", "reversed with a step", "size-0"};
    for (int k = 0; k < 3; k++) {
        rnd_case x = {.kind = RND_PERMUTATION, .rng = {rnext(r), 1, rnext(r) % 1000}};
        random_case(tg, &x, NDM_I64, &pviews[k], pnames[k], t);
    }
}

/* ---- linear algebra and convolution ------------------------------------------
 * Batched matmul and the nn family (convolution, pooling, their gradients)
 * on operands of up to four axes. Each case names its layout; the sizes are
 * small and odd so that tiles and batches have ragged edges. */

/* `shape` seen through a buffer laid out in the axis order `perm` (perm[0]
 * outermost): a transposed or channels-last operand. */
static view permuted_view(int nd, const int64_t *shape, const int *perm)
{
    view v = {nd, {0}, {0}, 0, 1};
    for (int i = nd - 1; i >= 0; i--) {
        v.shape[perm[i]] = shape[perm[i]];
        v.strides[perm[i]] = v.count;
        v.count *= shape[perm[i]];
    }
    return v;
}

/* `shape` with the last axis reversed and every stride doubled: a step on
 * every axis, a negative one on the last. */
static view stepped_view(int nd, const int64_t *shape)
{
    view v = dense_view(nd, shape);
    for (int i = 0; i < nd; i++)
        v.strides[i] *= 2;
    v.strides[nd - 1] = -v.strides[nd - 1];
    v.offset = (shape[nd - 1] - 1) * 2;
    v.count = 2 * v.count;
    if (v.count == 0)
        v.offset = 0;
    return v;
}

/* `shape` with axis `axis` broadcast (stride 0). */
static view bcast_view(int nd, const int64_t *shape, int axis)
{
    int64_t one[4];
    memcpy(one, shape, (size_t)nd * sizeof *one);
    one[axis] = 1;
    view v = dense_view(nd, one);
    v.shape[axis] = shape[axis];
    v.strides[axis] = 0;
    return v;
}

static ndm_status run_matmul(const ndm__backend *b, int device, const fcase *c,
                             const ndm__tensor *t, const void *ctx)
{
    (void)c, (void)ctx;
    if (!b->linalg)
        return NDM_E_UNSUPPORTED;
    return b->linalg->matmul(device, &t[0], &t[1], &t[2]);
}

static void linalg_forward(const target *tg, rng *r, tally *t)
{
    static const ndm_dtype dts[] = {NDM_F32, NDM_F64, NDM_I64};
    enum { LM_PLAIN, LM_MATRIX, LM_TRANSPOSED, LM_STEPPED, LM_BCAST_B, LM_BCAST_LOOP,
           LM_EMPTY, LM_K0, LM_TILES, LM_COUNT };
    static const char *const what[LM_COUNT] = {
        "batched", "one matrix", "every operand transposed", "steps and a reversed axis",
        "b broadcast over the batch", "batch axes that do not collapse", "empty batch",
        "k = 0", "sizes past one tile"};
    static const layout lay[LM_COUNT] = {L_CONTIGUOUS, L_CONTIGUOUS, L_TRANSPOSED, L_STEPPED,
                                         L_BROADCAST, L_BROADCAST, L_EMPTY, L_EMPTY,
                                         L_CONTIGUOUS};
    for (int di = 0; di < 3; di++) {
        ndm_dtype dt = dts[di];
        for (int l = 0; l < LM_COUNT; l++) {
            int64_t bt = l == LM_EMPTY ? 0 : 3, m = 4, k = l == LM_K0 ? 0 : 5, n = 6;
            if (l == LM_TILES) /* ragged tiles of 16 on every axis */
                bt = 2, m = 19, k = 37, n = 21;
            /* 3-d: (batch, rows, cols); the non-collapsing batch is (2, 3) */
            int nd = l == LM_MATRIX ? 2 : l == LM_BCAST_LOOP ? 4 : 3;
            int64_t sc[4], sa[4], sb[4];
            int q = 0;
            if (nd == 4)
                sc[q] = sa[q] = sb[q] = 2, q++;
            if (nd >= 3)
                sc[q] = sa[q] = sb[q] = bt, q++;
            sc[q] = sa[q] = m, sb[q] = k, q++;
            sc[q] = sb[q] = n, sa[q] = k;
            fcase c = {.family = NDM__OPS_LINALG,
                       .op = "matmul", .l = lay[l], .nops = 3, .tol = 1e-5};
            snprintf(c.dtypes, sizeof c.dtypes, "%s, %s", ndm_dtype_name(dt), what[l]);
            c.dt[0] = c.dt[1] = c.dt[2] = dt;
            c.v[0] = dense_view(nd, sc), c.v[1] = dense_view(nd, sa), c.v[2] = dense_view(nd, sb);
            if (l == LM_TRANSPOSED) {
                int perm[3] = {0, 2, 1};
                c.v[0] = permuted_view(nd, sc, perm);
                c.v[1] = permuted_view(nd, sa, perm);
                c.v[2] = permuted_view(nd, sb, perm);
            } else if (l == LM_STEPPED) {
                c.v[1] = stepped_view(nd, sa);
                int perm[3] = {0, 2, 1};
                c.v[2] = permuted_view(nd, sb, perm);
                c.v[2].strides[0] *= 2, c.v[2].strides[1] *= 3, c.v[2].strides[2] *= 2;
                c.v[2].count *= 6;
            } else if (l == LM_BCAST_B) {
                c.v[2] = bcast_view(nd, sb, 0); /* one b for every batch */
            } else if (l == LM_BCAST_LOOP) {
                c.v[1] = bcast_view(nd, sa, 0);
            }
            run_case(tg, &c, run_matmul, NULL, r, 100, t);
        }
    }
}

/* ---- nn ---- */

typedef enum nn_op { NN_CONV, NN_CONV_INPUT, NN_CONV_WEIGHT, NN_POOL, NN_POOL_BWD } nn_op;

typedef struct nn_ctx {
    nn_op op;
    ndm__conv2d_geom cg;
    ndm__pool2d_geom pg;
    bool bias;
    const target *tg; /* for the workspace on the target's device */
} nn_ctx;

/* The workspace a member asks for, on the device that runs it. */
static ndm_status with_workspace(const ndm__backend *b, const nn_ctx *x, size_t bytes,
                                 void **ws, dbuf *d)
{
    *ws = NULL;
    d->h = NDM_NULL_ARRAY, d->p = NULL;
    if (!bytes)
        return NDM_OK;
    if (b == &ndm__cpu_ref_backend || x->tg->dev.type == NDM_DEVICE_CPU) {
        d->p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!d->p)
            return NDM_E_OOM;
    } else if (!dbuf_get(x->tg, d, bytes)) {
        return NDM_E_OOM;
    }
    *ws = d->p;
    return NDM_OK;
}

static ndm_status run_nn(const ndm__backend *b, int device, const fcase *c, const ndm__tensor *t,
                         const void *ctx)
{
    (void)c;
    const nn_ctx *x = ctx;
    if (!b->nn)
        return NDM_E_UNSUPPORTED;
    const struct ndm__backend_nn *nn = b->nn;
    size_t bytes = 0;
    void *ws;
    dbuf d;
    ndm_status st;
    switch (x->op) {
    case NN_CONV:
        bytes = nn->conv2d_workspace(device, &t[0], &t[1], &t[2], &x->cg);
        if ((st = with_workspace(b, x, bytes, &ws, &d)) < 0)
            return st;
        st = nn->conv2d(device, &t[0], &t[1], &t[2], x->bias ? &t[3] : NULL, &x->cg, ws);
        break;
    case NN_CONV_INPUT:
        if (!nn->conv2d_backward_input)
            return NDM_E_UNSUPPORTED;
        bytes = nn->conv2d_backward_input_workspace
                    ? nn->conv2d_backward_input_workspace(device, &t[0], &t[1], &t[2], &x->cg)
                    : 0;
        if ((st = with_workspace(b, x, bytes, &ws, &d)) < 0)
            return st;
        st = nn->conv2d_backward_input(device, &t[0], &t[1], &t[2], &x->cg, ws, bytes);
        break;
    case NN_CONV_WEIGHT:
        if (!nn->conv2d_backward_weight)
            return NDM_E_UNSUPPORTED;
        bytes = nn->conv2d_backward_weight_workspace
                    ? nn->conv2d_backward_weight_workspace(device, &t[0], &t[1], &t[2], &x->cg)
                    : 0;
        if ((st = with_workspace(b, x, bytes, &ws, &d)) < 0)
            return st;
        st = nn->conv2d_backward_weight(device, &t[0], &t[1], &t[2], &x->cg, ws, bytes);
        break;
    case NN_POOL:
        return nn->pool2d(device, &t[0], &t[1], &x->pg);
    default:
        if (!nn->pool2d_backward)
            return NDM_E_UNSUPPORTED;
        return nn->pool2d_backward(device, &t[0], &t[1], x->pg.max ? &t[2] : NULL, &x->pg);
    }
    if (d.h.id) {
        /* the kernels are queued: the buffer goes when they are done */
        if (st >= 0 && x->tg->b->sync)
            st = x->tg->b->sync(x->tg->dev.index);
        dbuf_put(&d);
    } else {
        free(d.p);
    }
    return st;
}

/* The layouts of a 4-d input operand; a weight's channels-last is its
 * output channels last (NL_O_LAST), which gemm reads as a transpose. */
enum { NL_CONTIGUOUS, NL_CHANNELS_LAST, NL_STEPPED, NL_BROADCAST, NL_COUNT, NL_O_LAST };
static const layout nn_lay[NL_COUNT] = {L_CONTIGUOUS, L_TRANSPOSED, L_STEPPED, L_BROADCAST};
static const char *const nn_what[NL_COUNT] = {"", ", channels last", ", steps, reversed W",
                                              ", broadcast"};

static view nn_view(int l, const int64_t *shape)
{
    static const int nhwc[4] = {0, 2, 3, 1};
    switch (l) {
    case NL_CHANNELS_LAST: return permuted_view(4, shape, nhwc);
    case NL_O_LAST: {
        static const int olast[4] = {1, 2, 3, 0};
        return permuted_view(4, shape, olast);
    }
    case NL_STEPPED: return stepped_view(4, shape);
    case NL_BROADCAST: return bcast_view(4, shape, 0);
    default: return dense_view(4, shape);
    }
}

typedef struct conv_shape {
    int64_t n, c, h, w, o, kh, kw;
    ndm__conv2d_geom g;
    bool bias;
} conv_shape;

/* rms_norm: operand 0 is what is compared, y or the roots (which = 1);
 * the other output goes to the last operand. ctx: {which, has_w}. */
static ndm_status run_rms_norm(const ndm__backend *b, int device, const fcase *c,
                               const ndm__tensor *t, const void *ctx)
{
    const int *x = ctx;
    if (!b->nn || !b->nn->rms_norm)
        return NDM_E_UNSUPPORTED;
    const ndm__tensor *y = x[0] ? &t[c->nops - 1] : &t[0], *rs = x[0] ? &t[0] : &t[c->nops - 1];
    return b->nn->rms_norm(device, y, rs, &t[1], x[1] ? &t[2] : NULL, 1e-5);
}

/* The fused rms_norm where a backend has it (the CPU's tables: the same
 * arithmetic row by row), with and without a weight, rows of 1 to 300. */
static void rms_norm_forward(const target *tg, rng *r, tally *t)
{
    if (!tg->b->nn || !tg->b->nn->rms_norm)
        return;
    static const ndm_dtype dts[] = {NDM_F32, NDM_F64};
    static const int64_t cols[] = {1, 7, 300};
    for (int di = 0; di < 2; di++)
        for (int ci = 0; ci < 3; ci++)
            for (int has_w = 0; has_w < 2; has_w++)
                for (int which = 0; which < 2; which++) {
                    int64_t xs[2] = {5, cols[ci]}, rs[2] = {5, 1}, ws[1] = {cols[ci]};
                    fcase c = {.family = NDM__OPS_NN, .op = which ? "rms_norm roots" : "rms_norm",
                               .l = L_CONTIGUOUS, .nops = has_w ? 4 : 3, .finite = true};
                    snprintf(c.dtypes, sizeof c.dtypes, "%s, %lld columns%s",
                             ndm_dtype_name(dts[di]), (long long)cols[ci],
                             has_w ? ", weight" : "");
                    for (int k = 0; k < 4; k++)
                        c.dt[k] = dts[di];
                    c.v[0] = which ? dense_view(2, rs) : dense_view(2, xs);
                    c.v[1] = dense_view(2, xs);
                    if (has_w)
                        c.v[2] = dense_view(1, ws);
                    c.v[c.nops - 1] = which ? dense_view(2, xs) : dense_view(2, rs);
                    int ctx[2] = {which, has_w};
                    run_case(tg, &c, run_rms_norm, ctx, r, 1, t);
                }
}

static void nn_forward(const target *tg, rng *r, tally *t)
{
    rms_norm_forward(tg, r, t);
    static const ndm_dtype dts[] = {NDM_F32, NDM_F64};
    static const conv_shape convs[] = {
        /* groups, stride, padding and dilation, all unequal across H and W */
        {2, 4, 7, 6, 6, 3, 2, {{2, 1}, {1, 1}, {1, 2}, 2}, false},
        {3, 3, 5, 5, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
        {2, 3, 4, 4, 5, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1}, true},
        {0, 3, 4, 4, 5, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true}, /* empty batch */
        {2, 4, 12, 12, 8, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true}, /* a few grid strides */
    };
    for (int di = 0; di < 2; di++) {
        ndm_dtype dt = dts[di];
        for (size_t ci = 0; ci < sizeof convs / sizeof *convs; ci++) {
            const conv_shape *s = &convs[ci];
            const ndm__conv2d_geom *g = &s->g;
            int64_t oh = (s->h + 2 * g->padding[0] - g->dilation[0] * (s->kh - 1) - 1) / g->stride[0] + 1;
            int64_t ow = (s->w + 2 * g->padding[1] - g->dilation[1] * (s->kw - 1) - 1) / g->stride[1] + 1;
            int64_t xs[4] = {s->n, s->c, s->h, s->w}, ws[4] = {s->o, s->c / g->groups, s->kh, s->kw};
            int64_t ys[4] = {s->n, s->o, oh, ow}, bs[1] = {s->o};
            for (int op = NN_CONV; op <= NN_CONV_WEIGHT; op++)
                for (int l = 0; l < NL_COUNT; l++) {
                    if (s->n == 0 && l != NL_CONTIGUOUS)
                        continue;
                    nn_ctx x = {.op = (nn_op)op, .cg = *g, .bias = s->bias && op == NN_CONV, .tg = tg};
                    static const char *const names[3] = {"conv2d", "conv2d_backward_input",
                                                         "conv2d_backward_weight"};
                    fcase c = {.family = NDM__OPS_NN,
                               .op = names[op], .l = s->n == 0 ? L_EMPTY : nn_lay[l],
                               .nops = x.bias ? 4 : 3, .tol = 1e-4, .finite = true};
                    snprintf(c.dtypes, sizeof c.dtypes, "%s, shape %zu%s%s", ndm_dtype_name(dt),
                             ci, x.bias ? ", bias" : "", nn_what[l]);
                    c.dt[0] = c.dt[1] = c.dt[2] = c.dt[3] = dt;
                    if (op == NN_CONV) {
                        /* the layout applies to x and w (and a stepped bias) */
                        c.v[0] = dense_view(4, ys), c.v[1] = nn_view(l, xs);
                        c.v[2] = nn_view(l == NL_BROADCAST ? NL_CONTIGUOUS : l == NL_CHANNELS_LAST ? NL_O_LAST : l, ws);
                        c.v[3] = dense_view(1, bs);
                        if (l == NL_STEPPED)
                            c.v[3].strides[0] = -3, c.v[3].offset = 3 * (s->o - 1),
                            c.v[3].count = 3 * s->o;
                    } else if (op == NN_CONV_INPUT) {
                        c.v[0] = dense_view(4, xs), c.v[1] = nn_view(l, ys);
                        c.v[2] = nn_view(l == NL_BROADCAST ? NL_CONTIGUOUS : l == NL_CHANNELS_LAST ? NL_O_LAST : l, ws);
                    } else {
                        c.v[0] = dense_view(4, ws), c.v[1] = nn_view(l, ys);
                        c.v[2] = nn_view(l == NL_BROADCAST ? NL_CONTIGUOUS : l, xs);
                    }
                    run_case(tg, &c, run_nn, &x, r, 1000, t);
                }
        }
    }
    /* pooling: the inputs include NaN and infinities (the max's rules) */
    static const struct {
        int64_t n, c, h, w;
        ndm__pool2d_geom g;
    } pools[] = {
        {2, 3, 7, 6, {{3, 3}, {2, 2}, {1, 1}, true, false}},  /* overlapping, padded */
        {2, 2, 6, 6, {{2, 2}, {2, 2}, {0, 0}, true, false}},
        {2, 3, 7, 5, {{3, 2}, {1, 2}, {1, 1}, true, false}},
        {2, 3, 7, 6, {{3, 3}, {1, 1}, {1, 1}, false, true}},
        {2, 3, 7, 6, {{3, 3}, {2, 1}, {1, 1}, false, false}},
        {2, 2, 5, 7, {{2, 3}, {2, 1}, {1, 1}, false, true}},
        {0, 2, 5, 7, {{2, 2}, {2, 2}, {0, 0}, true, false}}, /* empty batch */
        {2, 4, 21, 20, {{3, 3}, {2, 2}, {1, 1}, true, false}}, /* a few grid strides */
    };
    for (int di = 0; di < 2; di++) {
        ndm_dtype dt = dts[di];
        for (size_t pi = 0; pi < sizeof pools / sizeof *pools; pi++) {
            const ndm__pool2d_geom *g = &pools[pi].g;
            int64_t xs[4] = {pools[pi].n, pools[pi].c, pools[pi].h, pools[pi].w};
            int64_t ys[4] = {xs[0], xs[1], (xs[2] + 2 * g->padding[0] - g->kernel[0]) / g->stride[0] + 1,
                             (xs[3] + 2 * g->padding[1] - g->kernel[1]) / g->stride[1] + 1};
            for (int op = NN_POOL; op <= NN_POOL_BWD; op++)
                for (int l = 0; l < NL_COUNT; l++) {
                    if (xs[0] == 0 && l != NL_CONTIGUOUS)
                        continue;
                    nn_ctx x = {.op = (nn_op)op, .pg = *g, .tg = tg};
                    const char *kind = g->max ? "max" : g->count_include_pad ? "avg, padding counted" : "avg";
                    fcase c = {.family = NDM__OPS_NN,
                               .op = op == NN_POOL ? "pool2d" : "pool2d_backward",
                               .l = xs[0] == 0 ? L_EMPTY : nn_lay[l], .tol = 0};
                    snprintf(c.dtypes, sizeof c.dtypes, "%s, %s, shape %zu%s", ndm_dtype_name(dt),
                             kind, pi, nn_what[l]);
                    c.dt[0] = c.dt[1] = c.dt[2] = dt;
                    if (op == NN_POOL) {
                        c.nops = 2;
                        c.v[0] = dense_view(4, ys), c.v[1] = nn_view(l, xs);
                    } else {
                        /* dy in the layout; the forward's input in another */
                        c.nops = g->max ? 3 : 2;
                        c.v[0] = dense_view(4, xs), c.v[1] = nn_view(l, ys);
                        c.v[2] = nn_view(l == NL_STEPPED ? NL_CHANNELS_LAST : NL_STEPPED, xs);
                    }
                    run_case(tg, &c, run_nn, &x, r, 1, t);
                }
        }
    }
}

/* ---- the suite -------------------------------------------------------------- */

static void report(const char *what, const tally *t)
{
    printf("[ conformance ] %s: %ld cases checked, %ld not supported (by its table)\n", what,
           t->checked, t->unsupported);
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
        random_forward(&tg, &r, &t);
        index_forward(&tg, &r, &t);
        linalg_forward(&tg, &r, &t);
        nn_forward(&tg, &r, &t);
        printf("[ conformance ] %s: %ld cases checked\n", tg.name, t.checked);
        all.checked += t.checked;
        all.unsupported += t.unsupported;
        if (t.mismatches && !all.mismatches)
            memcpy(all.first, t.first, sizeof all.first);
        all.mismatches += t.mismatches;
        levels++;
    }
    assert_true(ndm__cpu_isa_force(-1));
    assert_true(levels >= 1);
    /* the CPU backend provides every family it is asked for here */
    assert_int_equal(all.unsupported, 0);
    report("cpu, every instruction-set table", &all);
}

/* CUDA, when a device is there (a GPU, or "cuda (host execution)" when
 * NDM_BACKEND_PATH names the host stand-in's module): the same cases,
 * uploaded, run, downloaded, each first put to the module's supports table:
 * a case it says it runs must run and match, one it declines is refused
 * with a message (table_runs). The table runs every case of the suite. */
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
    ndm__device_props props;
    assert_ok(b->device_props(0, &props));
    printf("[ conformance ] cuda:0 is %s\n", props.name);
    tg.m = ndm_manager_new_on(ROOT(state), "cuda", tg.dev);
    assert_true(tg.m.id != 0);
    rng r = {7};
    static const char *const names[] = {"ew", "reduce", "random", "index", "linalg", "nn"};
    void (*const families[])(const target *, rng *, tally *) = {
        ew_forward, reduce_forward, random_forward, index_forward, linalg_forward, nn_forward};
    tally t = {0};
    for (int i = 0; i < 6; i++) {
        tally f = {0};
        families[i](&tg, &r, &f);
        printf("[ conformance ] cuda:0 (%s) %s: %ld (op, dtype, layout) cases checked, "
               "%ld not supported (by its table)\n",
               props.name, names[i], f.checked, f.unsupported);
        assert_true(f.checked > 0);
        t.checked += f.checked;
        t.unsupported += f.unsupported;
        if (f.mismatches && !t.mismatches)
            memcpy(t.first, f.first, sizeof t.first);
        t.mismatches += f.mismatches;
    }
    assert_ok(ndm_manager_close(tg.m));
    report("cuda:0", &t);
    assert_int_equal(t.unsupported, 0);
    /* Every byte the kernels took came from ndm's allocator: the device
     * runtime's allocator was called by the segment source only. */
    if (b->test && b->test->runtime_alloc_calls) {
        char where[256] = "";
        long strays = b->test->runtime_alloc_calls(where, sizeof where);
        printf("[ conformance ] cuda:0: %ld runtime allocation calls outside the segment "
               "source%s%s\n",
               strays, strays ? ", the last " : "", where);
        assert_int_equal(strays, 0);
    }
}

/* NDM__DEVICE_DECLINES asks no table for an operation on the CPU: neither
 * CPU table has one. */
static void test_backend_ops_cpu_tables_have_no_supports(void **state)
{
    (void)state;
    assert_null(ndm__cpu_backend.supports);
    assert_null(ndm__cpu_ref_backend.supports);
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CPU);
    ndm__op_case q = {NDM__OPS_LINALG, 0, "linear", 0, 1, {NDM_F16}};
    ndm_clear_error();
    assert_false(ndm__backend_declines(b, NDM_CPU, &q, "test", __FILE__, __func__, __LINE__));
    assert_int_equal(ndm_last_status(), NDM_OK);
}

/* What the CUDA table declines, the module lacks: a member it does not
 * fill, a dtype its kernel refuses, a family it does not know. Each is
 * refused as the dispatchers refuse it (site_fail_check). */
static void test_backend_ops_cuda_table_declines_what_it_lacks(void **state)
{
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (ndm_cuda_device_count() <= 0 || !b) {
        printf("[ conformance ] cuda: skipped: %s\n",
               !b ? ndm__backend_unavailable(NDM_DEVICE_CUDA) : "no CUDA device is visible");
        return;
    }
    assert_non_null(b->supports);
    target tg = {.b = b, .dev = {NDM_DEVICE_CUDA, 0}};
    snprintf(tg.name, sizeof tg.name, "cuda:0");
    tg.m = ndm_manager_new_on(ROOT(state), "cuda", tg.dev);
    assert_true(tg.m.id != 0);
    /* members the module does not fill (the dispatchers compose them), and
     * a family it does not know */
    const ndm__op_case absent[] = {
        {NDM__OPS_LINALG, 0, "linear", 0, 2, {NDM_F32, NDM_F32}},
        {NDM__OPS_EW, 0, "relu_grad_flat", 0, 2, {NDM_F32, NDM_F32}},
        {NDM__OPS_EW, 0, "optim_flat", 0, 1, {NDM_F32}},
        /* no such family, within the enum's range (C++ code reads it) */
        {(ndm__op_family)7, 0, "nothing", 0, 1, {NDM_F32}},
    };
    assert_null(b->linalg->linear);
    assert_null(b->ew->relu_grad_flat);
    assert_null(b->ew->optim_flat);
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
        assert_false(b->supports(0, &absent[i]));
        site_fail_check(&tg, &absent[i]);
    }
    /* dtypes its kernels refuse: the table says so before a call, and the
     * kernel agrees when called anyway */
    ndm__op_case mm = {NDM__OPS_LINALG, 0, "matmul", 0, 3, {NDM_F16, NDM_F16, NDM_F16}};
    ndm__op_case conv = {NDM__OPS_NN, 0, "conv2d", 0, 1, {NDM_I32}};
    assert_false(b->supports(0, &mm));
    assert_false(b->supports(0, &conv));
    site_fail_check(&tg, &mm);
    site_fail_check(&tg, &conv);
    dbuf d[3];
    int64_t shape[2] = {2, 2}, strides[2] = {2, 1};
    uint16_t host[4] = {0x3c00, 0, 0, 0x3c00}; /* f16 ones on the diagonal */
    for (int k = 0; k < 3; k++) {
        assert_true(dbuf_get(&tg, &d[k], sizeof host));
        dbuf_up(&tg, &d[k], host, sizeof host);
    }
    ndm__tensor t[3];
    for (int k = 0; k < 3; k++)
        t[k] = (ndm__tensor){d[k].p, NDM_F16, 2, shape, strides};
    assert_true(b->linalg->matmul(0, &t[0], &t[1], &t[2]) < 0);
    mm.dtypes[0] = mm.dtypes[1] = mm.dtypes[2] = NDM_F32;
    assert_true(b->supports(0, &mm));
    for (int k = 0; k < 3; k++)
        dbuf_put(&d[k]);
    ndm_clear_error();
    assert_ok(ndm_manager_close(tg.m));
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
        TEST(test_backend_ops_cpu_tables_have_no_supports),
        TEST(test_backend_ops_cuda_table_declines_what_it_lacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
