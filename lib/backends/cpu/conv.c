/* CPU convolution and pooling: direct loops as the reference, and the fast
 * kernels (convolution as im2col plus GEMM, split over the batch; pooling
 * split over planes). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../nn.h"
#include "gemm.h"
#include "parallel.h"

/* Geometry of one call, read from the tensors. */
typedef struct cgeo {
    int64_t N, C, H, W, O, KH, KW, OH, OW, Cg, Og, K, P;
    int64_t sh, sw, ph, pw, dh, dw, groups;
} cgeo;

static cgeo conv_geo(const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w,
                     const ndm__conv2d_geom *g)
{
    cgeo c;
    c.N = x->shape[0], c.C = x->shape[1], c.H = x->shape[2], c.W = x->shape[3];
    c.O = w->shape[0], c.KH = w->shape[2], c.KW = w->shape[3];
    c.OH = y->shape[2], c.OW = y->shape[3];
    c.groups = g->groups;
    c.Cg = c.C / c.groups, c.Og = c.O / c.groups;
    c.K = c.Cg * c.KH * c.KW;
    c.P = c.OH * c.OW;
    c.sh = g->stride[0], c.sw = g->stride[1];
    c.ph = g->padding[0], c.pw = g->padding[1];
    c.dh = g->dilation[0], c.dw = g->dilation[1];
    return c;
}

/* ---- reference ----------------------------------------------------------------- */

#define NDM__REF_CONV(T)                                                        \
    static void ref_conv_##T(const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w, \
                             const ndm__tensor *bias, const cgeo *c)           \
    {                                                                           \
        const T *X = x->data, *Wt = w->data, *B = bias ? bias->data : NULL;     \
        T *Y = y->data;                                                         \
        const int64_t *xs = x->strides, *ws = w->strides, *ys = y->strides;     \
        for (int64_t n = 0; n < c->N; n++)                                      \
            for (int64_t o = 0; o < c->O; o++)                                  \
                for (int64_t oh = 0; oh < c->OH; oh++)                          \
                    for (int64_t ow = 0; ow < c->OW; ow++) {                    \
                        double s = B ? (double)B[o * bias->strides[0]] : 0.0;   \
                        int64_t gi = o / c->Og;                                 \
                        for (int64_t ci = 0; ci < c->Cg; ci++)                  \
                            for (int64_t kh = 0; kh < c->KH; kh++) {            \
                                int64_t ih = oh * c->sh - c->ph + kh * c->dh;   \
                                if (ih < 0 || ih >= c->H)                       \
                                    continue;                                   \
                                for (int64_t kw = 0; kw < c->KW; kw++) {        \
                                    int64_t iw = ow * c->sw - c->pw + kw * c->dw; \
                                    if (iw < 0 || iw >= c->W)                   \
                                        continue;                               \
                                    s += (double)X[n * xs[0] + (gi * c->Cg + ci) * xs[1] + \
                                                   ih * xs[2] + iw * xs[3]] *   \
                                         (double)Wt[o * ws[0] + ci * ws[1] + kh * ws[2] + \
                                                    kw * ws[3]];                \
                                }                                               \
                            }                                                   \
                        Y[n * ys[0] + o * ys[1] + oh * ys[2] + ow * ys[3]] = (T)s; \
                    }                                                           \
    }
NDM__REF_CONV(float)
NDM__REF_CONV(double)

static size_t ref_conv2d_workspace(int device, const ndm__tensor *y, const ndm__tensor *x,
                                   const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    (void)device, (void)y, (void)x, (void)w, (void)g;
    return 0;
}

static ndm_status ref_conv2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                             const ndm__tensor *w, const ndm__tensor *bias,
                             const ndm__conv2d_geom *g, void *ws)
{
    (void)device, (void)ws;
    cgeo c = conv_geo(y, x, w, g);
    if (y->dtype == NDM_F32)
        ref_conv_float(y, x, w, bias, &c);
    else if (y->dtype == NDM_F64)
        ref_conv_double(y, x, w, bias, &c);
    else
        return NDM_E_DTYPE;
    return NDM_OK;
}

/* One output plane of pooling; shared by both kernels (the fast one runs it
 * on many planes at once). Padding is never read: a max window covers at
 * least one input element because padding is at most half the kernel. */
#define NDM__POOL_PLANE(T)                                                      \
    static void pool_plane_##T(const T *x, int64_t xs2, int64_t xs3, int64_t H, int64_t W, \
                               T *y, int64_t ys2, int64_t ys3, int64_t OH, int64_t OW, \
                               const ndm__pool2d_geom *g)                       \
    {                                                                           \
        for (int64_t oh = 0; oh < OH; oh++) {                                   \
            int64_t h0 = oh * g->stride[0] - g->padding[0];                     \
            int64_t h1 = h0 + g->kernel[0] < H ? h0 + g->kernel[0] : H;         \
            h0 = h0 > 0 ? h0 : 0;                                               \
            for (int64_t ow = 0; ow < OW; ow++) {                               \
                int64_t w0 = ow * g->stride[1] - g->padding[1];                 \
                int64_t w1 = w0 + g->kernel[1] < W ? w0 + g->kernel[1] : W;     \
                w0 = w0 > 0 ? w0 : 0;                                           \
                double r;                                                       \
                if (g->max) {                                                   \
                    T m = -(T)INFINITY;                                         \
                    for (int64_t ih = h0; ih < h1; ih++)                        \
                        for (int64_t iw = w0; iw < w1; iw++) {                  \
                            T v = x[ih * xs2 + iw * xs3];                       \
                            m = (v > m || v != v) ? v : m;                      \
                        }                                                       \
                    r = m;                                                      \
                } else {                                                        \
                    double s = 0;                                               \
                    for (int64_t ih = h0; ih < h1; ih++)                        \
                        for (int64_t iw = w0; iw < w1; iw++)                    \
                            s += x[ih * xs2 + iw * xs3];                        \
                    int64_t cnt = g->count_include_pad ? g->kernel[0] * g->kernel[1] \
                                                       : (h1 - h0) * (w1 - w0); \
                    r = s / (double)cnt;                                        \
                }                                                               \
                y[oh * ys2 + ow * ys3] = (T)r;                                  \
            }                                                                   \
        }                                                                       \
    }
NDM__POOL_PLANE(float)
NDM__POOL_PLANE(double)

static void pool_planes(const ndm__tensor *y, const ndm__tensor *x, const ndm__pool2d_geom *g,
                        int64_t begin, int64_t end)
{
    int64_t C = x->shape[1];
    size_t es = ndm_dtype_size(x->dtype);
    for (int64_t pl = begin; pl < end; pl++) {
        int64_t n = pl / C, ch = pl % C;
        const char *xp = (const char *)x->data + (n * x->strides[0] + ch * x->strides[1]) * (int64_t)es;
        char *yp = (char *)y->data + (n * y->strides[0] + ch * y->strides[1]) * (int64_t)es;
        if (x->dtype == NDM_F32)
            pool_plane_float((const float *)xp, x->strides[2], x->strides[3], x->shape[2],
                             x->shape[3], (float *)yp, y->strides[2], y->strides[3], y->shape[2],
                             y->shape[3], g);
        else
            pool_plane_double((const double *)xp, x->strides[2], x->strides[3], x->shape[2],
                              x->shape[3], (double *)yp, y->strides[2], y->strides[3],
                              y->shape[2], y->shape[3], g);
    }
}

static ndm_status ref_pool2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                             const ndm__pool2d_geom *g)
{
    (void)device;
    if (x->dtype != NDM_F32 && x->dtype != NDM_F64)
        return NDM_E_DTYPE;
    pool_planes(y, x, g, 0, x->shape[0] * x->shape[1]);
    return NDM_OK;
}

/* ---- fast convolution --------------------------------------------------------
 * Each work item is (sample, group, tile of output pixels): unfold the
 * input window under each pixel into a K x tile matrix (im2col) in this
 * thread's slot of the workspace, then one GEMM writes the Og x tile block
 * of y. A 1x1 convolution with unit stride and no padding reads x as the
 * matrix directly. Items run in parallel over the batch with ndm's GEMM on
 * each thread; a batch too small for the threads runs item after item with
 * the provider's threaded GEMM. */

typedef struct cplan {
    cgeo c;
    int64_t tile, ntiles, items;
    bool direct, parallel, wcopy;
    int slots;
    size_t es, slot_bytes, wbytes;
} cplan;

/* Strides let (C, KH, KW) of w read as one axis of a matrix. */
static bool w_is_matrix(const ndm__tensor *w)
{
    return w->strides[2] == w->shape[3] * w->strides[3] &&
           w->strides[1] == w->shape[2] * w->strides[2];
}

static cplan conv_plan(const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w,
                       const ndm__conv2d_geom *g)
{
    cplan p;
    p.c = conv_geo(y, x, w, g);
    const cgeo *c = &p.c;
    p.es = ndm_dtype_size(x->dtype);
    p.direct = c->KH == 1 && c->KW == 1 && c->sh == 1 && c->sw == 1 && c->ph == 0 &&
               c->pw == 0 && x->strides[2] == c->W * x->strides[3];
    /* Tiles keep the unfolded matrix near 1M elements. */
    int64_t budget = (int64_t)1 << 20;
    p.tile = c->P;
    if (!p.direct && c->K > 0 && c->K * c->P > budget) {
        p.tile = budget / c->K;
        p.tile = p.tile < 64 ? 64 : p.tile;
        p.tile = p.tile > c->P ? c->P : p.tile;
    }
    p.ntiles = p.tile ? (c->P + p.tile - 1) / p.tile : 0;
    p.items = c->N * c->groups * p.ntiles;
    int threads = ndm__num_threads();
    p.parallel = threads > 1 && p.items >= threads;
    p.slots = p.parallel ? threads : 1;
    p.slot_bytes = p.direct ? 0 : ((size_t)(c->K * p.tile) * p.es + 63) & ~(size_t)63;
    p.wcopy = !w_is_matrix(w);
    p.wbytes = p.wcopy ? ((size_t)(c->O * c->K) * p.es + 63) & ~(size_t)63 : 0;
    return p;
}

static size_t fast_conv2d_workspace(int device, const ndm__tensor *y, const ndm__tensor *x,
                                    const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    (void)device;
    cplan p = conv_plan(y, x, w, g);
    return p.wbytes + (size_t)p.slots * p.slot_bytes;
}

/* Unfold pixels [p0, p0 + np) of group `gi` of sample n into col (K x np). */
#define NDM__IM2COL(T)                                                          \
    static void im2col_##T(T *restrict col, const T *x, const int64_t *xs, const cgeo *c, \
                           int64_t n, int64_t gi, int64_t p0, int64_t np)       \
    {                                                                           \
        T *row = col;                                                           \
        for (int64_t ci = 0; ci < c->Cg; ci++) {                                \
            const T *plane = x + n * xs[0] + (gi * c->Cg + ci) * xs[1];         \
            for (int64_t kh = 0; kh < c->KH; kh++)                              \
                for (int64_t kw = 0; kw < c->KW; kw++, row += np) {             \
                    /* ow in [lo, hi) reads inside the row: iw = ow*sw - pw + kw*dw */ \
                    int64_t off = kw * c->dw - c->pw;                           \
                    int64_t lo = off >= 0 ? 0 : (-off + c->sw - 1) / c->sw;     \
                    int64_t hi = c->W - off <= 0 ? 0 : (c->W - off + c->sw - 1) / c->sw; \
                    hi = hi < c->OW ? hi : c->OW;                               \
                    lo = lo < hi ? lo : hi;                                     \
                    int64_t pp = p0, end = p0 + np;                             \
                    while (pp < end) {                                          \
                        int64_t oh = pp / c->OW, ow = pp % c->OW;               \
                        int64_t seg = c->OW - ow < end - pp ? c->OW - ow : end - pp; \
                        T *d = row + (pp - p0);                                 \
                        int64_t ih = oh * c->sh - c->ph + kh * c->dh;           \
                        if (ih < 0 || ih >= c->H) {                             \
                            memset(d, 0, (size_t)seg * sizeof(T));              \
                        } else {                                                \
                            /* zeros left of the row, the row, zeros right */   \
                            const T *src = plane + ih * xs[2];                  \
                            int64_t a = lo < ow ? ow : lo > ow + seg ? ow + seg : lo; \
                            int64_t b = hi < a ? a : hi > ow + seg ? ow + seg : hi; \
                            memset(d, 0, (size_t)(a - ow) * sizeof(T));         \
                            if (c->sw == 1 && xs[3] == 1)                       \
                                memcpy(d + (a - ow), src + a + off, (size_t)(b - a) * sizeof(T)); \
                            else                                                \
                                for (int64_t o = a; o < b; o++)                 \
                                    d[o - ow] = src[(o * c->sw + off) * xs[3]]; \
                            memset(d + (b - ow), 0, (size_t)(ow + seg - b) * sizeof(T)); \
                        }                                                       \
                        pp += seg;                                              \
                    }                                                           \
                }                                                               \
        }                                                                       \
    }
NDM__IM2COL(float)
NDM__IM2COL(double)

typedef struct cctx {
    const cplan *p;
    const ndm__tensor *y, *x, *w, *bias;
    const char *wm;           /* weights as an O x K matrix */
    int64_t wrs, wcs;
    char *ws;                 /* slots */
    unsigned flags;
    atomic_int next_slot;
    atomic_int status;
} cctx;

static void conv_items(void *ctx, int64_t begin, int64_t end)
{
    cctx *q = ctx;
    const cplan *p = q->p;
    const cgeo *c = &p->c;
    int slot = atomic_fetch_add(&q->next_slot, 1);
    char *col = q->ws + (size_t)slot * p->slot_bytes;
    int64_t es = (int64_t)p->es;
    const int64_t *ys = q->y->strides, *xs = q->x->strides;
    for (int64_t it = begin; it < end; it++) {
        int64_t tile = it % p->ntiles, ng = it / p->ntiles;
        int64_t gi = ng % c->groups, n = ng / c->groups;
        int64_t p0 = tile * p->tile;
        int64_t np = c->P - p0 < p->tile ? c->P - p0 : p->tile;
        /* y's (OH, OW) plane is contiguous (dispatcher): pixel p at p * ys[3] */
        char *yb = (char *)q->y->data + (n * ys[0] + gi * c->Og * ys[1] + p0 * ys[3]) * es;
        const char *bias = NULL;
        if (q->bias)
            bias = (const char *)q->bias->data + gi * c->Og * q->bias->strides[0] * es;
        const char *a = q->wm + gi * c->Og * q->wrs * es;
        const char *b;
        int64_t rsb, csb;
        if (p->direct) {
            b = (const char *)q->x->data + (n * xs[0] + gi * c->Cg * xs[1] + p0 * xs[3]) * es;
            rsb = xs[1];
            csb = xs[3];
        } else {
            if (es == 4)
                im2col_float((float *)col, q->x->data, xs, c, n, gi, p0, np);
            else
                im2col_double((double *)col, q->x->data, xs, c, n, gi, p0, np);
            b = col;
            rsb = np;
            csb = 1;
        }
        ndm_status st = ndm__cpu_gemm_bias(q->y->dtype, c->Og, np, c->K, a, q->wrs, q->wcs, b,
                                           rsb, csb, yb, ys[1], ys[3], bias,
                                           q->bias ? q->bias->strides[0] : 0, q->flags);
        if (st < 0)
            atomic_store(&q->status, st);
    }
}

static ndm_status fast_conv2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                              const ndm__tensor *w, const ndm__tensor *bias,
                              const ndm__conv2d_geom *g, void *ws)
{
    (void)device;
    if (y->dtype != NDM_F32 && y->dtype != NDM_F64)
        return NDM_E_DTYPE;
    cplan p = conv_plan(y, x, w, g);
    if (p.items == 0 || p.c.Og == 0)
        return NDM_OK;
    cctx q = {&p, y, x, w, bias, w->data, w->strides[0], w->strides[3], NULL, 0, 0, 0};
    atomic_init(&q.next_slot, 0);
    atomic_init(&q.status, NDM_OK);
    char *wsp = ws;
    if (p.wcopy) {
        /* gather the weights into an O x K matrix once */
        const cgeo *c = &p.c;
        int64_t k = 0;
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t ci = 0; ci < c->Cg; ci++)
                for (int64_t kh = 0; kh < c->KH; kh++)
                    for (int64_t kw = 0; kw < c->KW; kw++, k++)
                        memcpy(wsp + (size_t)k * p.es,
                               (const char *)w->data + (o * w->strides[0] + ci * w->strides[1] +
                                                        kh * w->strides[2] + kw * w->strides[3]) *
                                                           (int64_t)p.es,
                               p.es);
        q.wm = wsp;
        q.wrs = c->K;
        q.wcs = 1;
    }
    q.ws = wsp + p.wbytes;
    if (p.parallel) {
        q.flags = NDM__GEMM_NO_PROVIDER;
        ndm__parallel_for(p.items, 1, conv_items, &q);
    } else {
        /* ndm's kernel writes the bias with C; with a short contraction
         * that saves a pass over y worth more than the provider's speed */
        q.flags = p.c.K <= 64 ? NDM__GEMM_NO_PROVIDER : 0;
        conv_items(&q, 0, p.items);
    }
    return (ndm_status)atomic_load(&q.status);
}

typedef struct pctx {
    const ndm__tensor *y, *x;
    const ndm__pool2d_geom *g;
} pctx;

static void pool_range(void *ctx, int64_t begin, int64_t end)
{
    const pctx *q = ctx;
    pool_planes(q->y, q->x, q->g, begin, end);
}

static ndm_status fast_pool2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                              const ndm__pool2d_geom *g)
{
    (void)device;
    if (x->dtype != NDM_F32 && x->dtype != NDM_F64)
        return NDM_E_DTYPE;
    pctx q = {y, x, g};
    int64_t per_plane = y->shape[2] * y->shape[3] * g->kernel[0] * g->kernel[1] + 1;
    int64_t grain = per_plane >= 16384 ? 1 : 16384 / per_plane;
    ndm__parallel_for(x->shape[0] * x->shape[1], grain, pool_range, &q);
    return NDM_OK;
}

const struct ndm__backend_nn ndm__cpu_nn = {
    .conv2d_workspace = fast_conv2d_workspace,
    .conv2d = fast_conv2d,
    .pool2d = fast_pool2d,
};

const struct ndm__backend_nn ndm__cpu_ref_nn = {
    .conv2d_workspace = ref_conv2d_workspace,
    .conv2d = ref_conv2d,
    .pool2d = ref_pool2d,
};
