/* CPU fast convolution and pooling and their gradients: convolution as a
 * GEMM whose B panels are unfolded straight from the input, its gradients
 * as GEMM plus col2im and as inner products, split over the batch; pooling
 * split over planes. The reference kernels are in conv_ref.c. */
#include <math.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "conv_cpu.h"
#include "isa.h"
#include "gemm.h"
#include "parallel.h"

#if NDM__CPU_X86
#include <immintrin.h>
#endif

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- fast convolution --------------------------------------------------------
 * y = W @ unfold(x) per (sample, group) on ndm's packed GEMM: the weights
 * are packed once per call, and the unfolded input is never stored: each
 * work item copies its sample's planes once with the padding made real
 * (zeros around, a few KiB), after which tap t of output pixel p reads
 * xpad[toff[t] + poff(p)], offsets that split by tap and by pixel, so
 * each panel of B is written straight from xpad (with unit stride, a few
 * vector copies per tap). Items run in parallel over the batch, cut into
 * pixel tiles when the batch is smaller than the pool. */

typedef struct cplan {
    ndm__conv_sizes c;
    int64_t tile, ntiles, items;
    int64_t Hp, Wp;  /* the padded planes */
    bool parallel, wcopy;
    int slots;
    size_t es, slot_bytes, wbytes, abytes, toff_bytes;
} cplan;

/* Strides let (C, KH, KW) of w read as one axis of a matrix. */
static bool w_is_matrix(const ndm__tensor *w)
{
    return w->strides[2] == w->shape[3] * w->strides[3] &&
           w->strides[1] == w->shape[2] * w->strides[2];
}

/* Pixels per tile: all of them, unless the scratch matrices (`rows` per
 * pixel) would pass about 1M elements; then as many as fit, at least 64. */
static int64_t tile_pixels(int64_t rows, int64_t P)
{
    int64_t budget = (int64_t)1 << 20;
    if (rows <= 0 || rows * P <= budget)
        return P;
    int64_t tile = budget / rows;
    tile = tile < 64 ? 64 : tile;
    return tile > P ? P : tile;
}

/* The planes of one (sample, group) with the padding made real: rows and
 * columns enough for every tap of every pixel, plus a vector's slack so a
 * panel writer may copy whole vectors. */
static void padded_dims(const ndm__conv_sizes *c, int64_t *Hp, int64_t *Wp)
{
    *Hp = c->OH ? (c->OH - 1) * c->sh + (c->KH - 1) * c->dh + 1 : 0;
    *Wp = c->OW ? (c->OW - 1) * c->sw + (c->KW - 1) * c->dw + 1 : 0;
}

#define PAD_SLACK 64 /* elements: more than any panel's width */

static size_t padded_bytes(const ndm__conv_sizes *c, int64_t Hp, int64_t Wp, size_t es)
{
    return align64((size_t)(c->Cg * Hp * Wp + PAD_SLACK) * es);
}

static cplan conv_plan(const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w,
                       const ndm__conv2d_geom *g)
{
    cplan p;
    p.c = ndm__conv_sizes_of(y, x, w, g);
    const ndm__conv_sizes *c = &p.c;
    p.es = ndm_dtype_size(x->dtype);
    padded_dims(c, &p.Hp, &p.Wp);
    int threads = ndm__num_threads();
    int64_t units = c->N * c->groups;
    /* a batch smaller than the pool: two pixel tiles per thread, each a
     * whole number of panels (32 pixels, the widest) */
    p.ntiles = 1;
    if (threads > 1 && units > 0 && units < threads) {
        int64_t want = (2 * threads + units - 1) / units, most = (c->P + 31) / 32;
        p.ntiles = want < most ? want : most > 0 ? most : 1;
    }
    p.tile = (c->P + p.ntiles - 1) / p.ntiles;
    p.tile = (p.tile + 31) / 32 * 32;
    p.ntiles = p.tile ? (c->P + p.tile - 1) / p.tile : 0;
    p.items = c->P ? units * p.ntiles : 0;
    p.parallel = threads > 1 && p.items > 1;
    p.slots = p.parallel ? threads : 1;
    p.slot_bytes = padded_bytes(c, p.Hp, p.Wp, p.es);
    p.wcopy = !w_is_matrix(w);
    p.wbytes = p.wcopy ? align64((size_t)(c->O * c->K) * p.es) : 0;
    p.abytes = align64(ndm__gemm_packed_a_bytes(x->dtype, c->Og, c->K));
    p.toff_bytes = align64((size_t)c->K * sizeof(int64_t));
    return p;
}

static size_t fast_conv2d_workspace(int device, const ndm__tensor *y, const ndm__tensor *x,
                                    const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    (void)device;
    cplan p = conv_plan(y, x, w, g);
    return p.wbytes + (size_t)p.c.groups * p.abytes + p.toff_bytes +
           (size_t)p.slots * p.slot_bytes;
}

/* The weights as an O x K matrix with strides (*rs, *cs): w itself, or,
 * when its strides cannot be read as one (`copy`), w gathered into dst,
 * once per call. */
static const char *weight_matrix(const ndm__tensor *w, const ndm__conv_sizes *c, size_t es,
                                 bool copy,
                                 char *dst, int64_t *rs, int64_t *cs)
{
    if (!copy) {
        *rs = w->strides[0];
        *cs = w->strides[3];
        return w->data;
    }
    *rs = c->K;
    *cs = 1;
    int64_t k = 0;
    for (int64_t o = 0; o < c->O; o++)
        for (int64_t ci = 0; ci < c->Cg; ci++)
            for (int64_t kh = 0; kh < c->KH; kh++)
                for (int64_t kw = 0; kw < c->KW; kw++, k++)
                    memcpy(dst + (size_t)k * es,
                           (const char *)w->data + (o * w->strides[0] + ci * w->strides[1] +
                                                    kh * w->strides[2] + kw * w->strides[3]) *
                                                       (int64_t)es,
                           es);
    return dst;
}

/* The output columns [*lo, *hi) at which tap kw reads inside an input row,
 * iw = ow * sw + off in [0, W); returns off = kw * dw - pw. */
static inline int64_t tap_cols(const ndm__conv_sizes *c, int64_t kw, int64_t *lo, int64_t *hi)
{
    int64_t off = kw * c->dw - c->pw;
    int64_t l = off >= 0 ? 0 : (-off + c->sw - 1) / c->sw;
    int64_t h = c->W - off <= 0 ? 0 : (c->W - off + c->sw - 1) / c->sw;
    *hi = h < c->OW ? h : c->OW;
    *lo = l < *hi ? l : *hi;
    return off;
}

/* A run of the unfolded pixels [p0, p0 + np) for tap (kh, kw): the pixels
 * [pp, pp + seg), in one output row from column ow, read input row ih, and
 * those in columns [a, b) read inside that row, at iw = o * sw + off
 * (tap_cols' [lo, hi) cut to the run). im2col and col2im walk a tap's
 * pixels by these runs, first_run then next_run until seg is 0. */
typedef struct tap_run {
    int64_t kh, lo, hi, off, end;
    int64_t pp, ow, seg, ih, a, b;
} tap_run;

static inline tap_run run_at(const ndm__conv_sizes *c, tap_run t, int64_t pp)
{
    t.pp = pp;
    t.ow = pp % c->OW;
    t.seg = c->OW - t.ow < t.end - pp ? c->OW - t.ow : t.end - pp;
    t.ih = pp / c->OW * c->sh - c->ph + t.kh * c->dh;
    t.a = clamp64(t.lo, t.ow, t.ow + t.seg);
    t.b = clamp64(t.hi, t.a, t.ow + t.seg);
    return t;
}

static inline tap_run first_run(const ndm__conv_sizes *c, int64_t kh, int64_t kw, int64_t p0,
                                int64_t np)
{
    tap_run t = {.kh = kh, .end = p0 + np};
    t.off = tap_cols(c, kw, &t.lo, &t.hi);
    return run_at(c, t, p0);
}

static inline tap_run next_run(const ndm__conv_sizes *c, tap_run t)
{
    return run_at(c, t, t.pp + t.seg);
}

/* Unfold pixels [p0, p0 + np) of group `gi` of sample n into col (K x np). */
#define NDM__IM2COL(T)                                                          \
    static void im2col_##T(T *restrict col, const T *x, const int64_t *xs,      \
                           const ndm__conv_sizes *c,                            \
                           int64_t n, int64_t gi, int64_t p0, int64_t np)       \
    {                                                                           \
        T *row = col;                                                           \
        for (int64_t ci = 0; ci < c->Cg; ci++) {                                \
            const T *plane = x + n * xs[0] + (gi * c->Cg + ci) * xs[1];         \
            for (int64_t kh = 0; kh < c->KH; kh++)                              \
                for (int64_t kw = 0; kw < c->KW; kw++, row += np)               \
                    for (tap_run t = first_run(c, kh, kw, p0, np); t.seg; t = next_run(c, t)) { \
                        T *d = row + (t.pp - p0);                               \
                        if (t.ih < 0 || t.ih >= c->H) {                         \
                            memset(d, 0, (size_t)t.seg * sizeof(T));            \
                        } else {                                                \
                            /* zeros left of the row, the row, zeros right */   \
                            const T *src = plane + t.ih * xs[2];                \
                            memset(d, 0, (size_t)(t.a - t.ow) * sizeof(T));     \
                            if (c->sw == 1 && xs[3] == 1)                       \
                                memcpy(d + (t.a - t.ow), src + t.a + t.off,     \
                                       (size_t)(t.b - t.a) * sizeof(T));        \
                            else                                                \
                                for (int64_t o = t.a; o < t.b; o++)             \
                                    d[o - t.ow] = src[(o * c->sw + t.off) * xs[3]]; \
                            memset(d + (t.b - t.ow), 0, (size_t)(t.ow + t.seg - t.b) * sizeof(T)); \
                        }                                                       \
                    }                                                           \
        }                                                                       \
    }
NDM__IM2COL(float)
NDM__IM2COL(double)

/* The Cg planes of group gi of sample n into xp (Hp x Wp each), padding
 * and rows or columns past the input as zeros, then the slack. */
#define NDM__PAD_INPUT(T)                                                       \
    static void pad_input_##T(T *restrict xp, const T *x, const int64_t *xs,    \
                              const ndm__conv_sizes *c,                         \
                              int64_t Hp, int64_t Wp, int64_t n, int64_t gi)    \
    {                                                                           \
        int64_t w0 = c->pw < Wp ? c->pw : Wp;                                   \
        int64_t w1 = c->pw + c->W < Wp ? c->pw + c->W : Wp;                     \
        w1 = w1 > w0 ? w1 : w0;                                                 \
        for (int64_t ci = 0; ci < c->Cg; ci++) {                                \
            const T *plane = x + n * xs[0] + (gi * c->Cg + ci) * xs[1];         \
            T *d = xp + ci * Hp * Wp;                                           \
            for (int64_t r = 0; r < Hp; r++, d += Wp) {                         \
                int64_t ih = r - c->ph;                                         \
                if (ih < 0 || ih >= c->H) {                                     \
                    memset(d, 0, (size_t)Wp * sizeof(T));                       \
                    continue;                                                   \
                }                                                               \
                const T *src = plane + ih * xs[2] + (w0 - c->pw) * xs[3];       \
                memset(d, 0, (size_t)w0 * sizeof(T));                           \
                if (xs[3] == 1)                                                 \
                    memcpy(d + w0, src, (size_t)(w1 - w0) * sizeof(T));         \
                else                                                            \
                    for (int64_t j = w0; j < w1; j++)                           \
                        d[j] = src[(j - w0) * xs[3]];                           \
                memset(d + w1, 0, (size_t)(Wp - w1) * sizeof(T));               \
            }                                                                   \
        }                                                                       \
        memset(xp + c->Cg * Hp * Wp, 0, PAD_SLACK * sizeof(T));                 \
    }
NDM__PAD_INPUT(float)
NDM__PAD_INPUT(double)

/* Where tap t = (ci, kh, kw) of pixel 0 reads in the padded planes. */
static void tap_offsets(int64_t *toff, const ndm__conv_sizes *c, int64_t Hp, int64_t Wp)
{
    int64_t t = 0;
    for (int64_t ci = 0; ci < c->Cg; ci++)
        for (int64_t kh = 0; kh < c->KH; kh++)
            for (int64_t kw = 0; kw < c->KW; kw++)
                toff[t++] = ci * Hp * Wp + kh * c->dh * Wp + kw * c->dw;
}

/* The unfolded input of one (sample, group) as a panel source. */
typedef struct unfold {
    const char *xp;       /* padded planes */
    const int64_t *toff;  /* per tap */
    const ndm__conv_sizes *c;
    int64_t Wp, p_base;   /* pixel j of a product is pixel p_base + j */
} unfold;

/* Where pixels [p, p + cols) read in the padded planes, relative to a tap. */
static void pixel_offsets(int64_t *po, const unfold *u, int64_t p, int64_t cols)
{
    const ndm__conv_sizes *c = u->c;
    int64_t oh = p / c->OW, ow = p % c->OW;
    for (int64_t j = 0; j < cols; j++) {
        po[j] = oh * c->sh * u->Wp + ow * c->sw;
        if (++ow == c->OW)
            ow = 0, oh++;
    }
}

/* Forward: B = unfold(x), rows taps, columns pixels. With unit stride a
 * full panel is a few runs of consecutive elements (one per output row it
 * spans); each run is copied as a whole vector of nr elements, the next
 * run (or the next row) overwriting what spilt past it. */
#define NDM__UNFOLD_PANEL(T)                                                    \
    static void unfold_panel_##T(void *ctx, void *dst, int64_t t0, int64_t kc, int64_t j0, \
                                 int64_t cols, int nr)                          \
    {                                                                           \
        const unfold *u = ctx;                                                  \
        const T *xp = (const T *)u->xp;                                         \
        T *d = dst;                                                             \
        int64_t po[64];                                                         \
        pixel_offsets(po, u, u->p_base + j0, cols);                             \
        if (cols == nr && u->c->sw == 1) {                                      \
            int64_t run[64], nrun = 0;                                          \
            for (int64_t j = 0; j < cols; j++)                                  \
                if (j == 0 || po[j] != po[j - 1] + 1)                           \
                    run[nrun++] = j;                                            \
            for (int64_t t = t0; t < t0 + kc; t++, d += nr) {                   \
                const T *src = xp + u->toff[t];                                 \
                for (int64_t r = 0; r < nrun; r++) {                            \
                    int64_t j = run[r];                                         \
                    if (nr * sizeof(T) == 64)                                   \
                        memcpy(d + j, src + po[j], 64);                         \
                    else                                                        \
                        memcpy(d + j, src + po[j], (size_t)nr * sizeof(T));     \
                }                                                               \
            }                                                                   \
            return;                                                             \
        }                                                                       \
        for (int64_t t = t0; t < t0 + kc; t++, d += nr) {                       \
            const T *src = xp + u->toff[t];                                     \
            int64_t j = 0;                                                      \
            for (; j < cols; j++)                                               \
                d[j] = src[po[j]];                                              \
            for (; j < nr; j++)                                                 \
                d[j] = 0;                                                       \
        }                                                                       \
    }
NDM__UNFOLD_PANEL(float)
NDM__UNFOLD_PANEL(double)

/* Weight gradient: B = unfold(x)^T, rows pixels, columns taps. */
#define NDM__UNFOLD_T_PANEL(T)                                                  \
    static void unfold_t_panel_##T(void *ctx, void *dst, int64_t p0, int64_t kc, int64_t j0, \
                                   int64_t cols, int nr)                        \
    {                                                                           \
        const unfold *u = ctx;                                                  \
        const ndm__conv_sizes *c = u->c;                                        \
        const T *xp = (const T *)u->xp;                                         \
        T *d = dst;                                                             \
        const int64_t *to = u->toff + j0;                                       \
        int64_t p = u->p_base + p0, oh = p / c->OW, ow = p % c->OW;             \
        for (int64_t i = 0; i < kc; i++, d += nr) {                             \
            const T *src = xp + oh * c->sh * u->Wp + ow * c->sw;                \
            int64_t j = 0;                                                      \
            for (; j < cols; j++)                                               \
                d[j] = src[to[j]];                                              \
            for (; j < nr; j++)                                                 \
                d[j] = 0;                                                       \
            if (++ow == c->OW)                                                  \
                ow = 0, oh++;                                                   \
        }                                                                       \
    }
NDM__UNFOLD_T_PANEL(float)
NDM__UNFOLD_T_PANEL(double)

#if NDM__CPU_X86
/* unfold_t_panel_float for whole panels of 16 taps: each pixel's row of
 * the panel is two gathers at the taps' offsets. */
__attribute__((target("avx2,fma"))) static void unfold_t_panel_float_avx2(
    void *ctx, void *dst, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr)
{
    const unfold *u = ctx;
    const ndm__conv_sizes *c = u->c;
    const int64_t *to = u->toff + j0;
    if (nr != 16 || cols != 16 || to[15] > INT32_MAX) {
        unfold_t_panel_float(ctx, dst, p0, kc, j0, cols, nr);
        return;
    }
    int32_t o32[16];
    for (int j = 0; j < 16; j++)
        o32[j] = (int32_t)to[j];
    __m256i i0 = _mm256_loadu_si256((const __m256i *)o32);
    __m256i i1 = _mm256_loadu_si256((const __m256i *)(o32 + 8));
    const float *xp = (const float *)u->xp;
    float *d = dst;
    int64_t p = u->p_base + p0, oh = p / c->OW, ow = p % c->OW;
    for (int64_t i = 0; i < kc; i++, d += 16) {
        const float *src = xp + oh * c->sh * u->Wp + ow * c->sw;
        _mm256_storeu_ps(d, _mm256_i32gather_ps(src, i0, 4));
        _mm256_storeu_ps(d + 8, _mm256_i32gather_ps(src, i1, 4));
        if (++ow == c->OW)
            ow = 0, oh++;
    }
}
#endif

/* The weight gradient's panel writer for this dtype and CPU. */
static ndm__gemm_panel_fn unfold_t_pick(size_t es)
{
    if (es == 8)
        return unfold_t_panel_double;
#if NDM__CPU_X86
    if (ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2)
        return unfold_t_panel_float_avx2;
#endif
    return unfold_t_panel_float;
}

typedef struct cctx {
    const cplan *p;
    const ndm__tensor *y, *x, *bias;
    const char *ap;           /* packed weights, one block per group */
    const int64_t *toff;
    char *ws;                 /* slots */
    atomic_int status;
} cctx;

static void conv_items(void *ctx, int64_t begin, int64_t end)
{
    cctx *q = ctx;
    const cplan *p = q->p;
    const ndm__conv_sizes *c = &p->c;
    /* the slot of this thread: chunks are many more than threads */
    int slot = ndm__parallel_thread_index();
    char *xp = q->ws + (size_t)(slot < p->slots ? slot : 0) * p->slot_bytes;
    int64_t es = (int64_t)p->es;
    const int64_t *ys = q->y->strides, *xs = q->x->strides;
    int64_t padded = -1; /* the (sample, group) now in xp */
    for (int64_t it = begin; it < end; it++) {
        int64_t tile = it % p->ntiles, ng = it / p->ntiles;
        int64_t gi = ng % c->groups, n = ng / c->groups;
        int64_t p0 = tile * p->tile;
        int64_t np = c->P - p0 < p->tile ? c->P - p0 : p->tile;
        if (ng != padded) {
            if (es == 4)
                pad_input_float((float *)xp, q->x->data, xs, c, p->Hp, p->Wp, n, gi);
            else
                pad_input_double((double *)xp, q->x->data, xs, c, p->Hp, p->Wp, n, gi);
            padded = ng;
        }
        /* y's (OH, OW) plane is contiguous (dispatcher): pixel p at p * ys[3] */
        char *yb = (char *)q->y->data + (n * ys[0] + gi * c->Og * ys[1] + p0 * ys[3]) * es;
        const char *bias = NULL;
        if (q->bias)
            bias = (const char *)q->bias->data + gi * c->Og * q->bias->strides[0] * es;
        unfold u = {xp, q->toff, c, p->Wp, p0};
        ndm_status st = ndm__gemm_packed(
            q->y->dtype, c->Og, np, c->K, q->ap + (size_t)gi * p->abytes,
            es == 4 ? unfold_panel_float : unfold_panel_double, &u, yb, ys[1], ys[3], bias,
            q->bias ? q->bias->strides[0] : 0, 0);
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
    char *wsp = ws;
    int64_t wrs, wcs;
    const char *wm = weight_matrix(w, &p.c, p.es, p.wcopy, wsp, &wrs, &wcs);
    char *ap = wsp + p.wbytes;
    for (int64_t gi = 0; gi < p.c.groups; gi++)
        ndm__gemm_pack_a(y->dtype, p.c.Og, p.c.K, wm + gi * p.c.Og * wrs * (int64_t)p.es, wrs,
                         wcs, ap + (size_t)gi * p.abytes);
    int64_t *toff = (int64_t *)(ap + (size_t)p.c.groups * p.abytes);
    tap_offsets(toff, &p.c, p.Hp, p.Wp);
    cctx q = {&p, y, x, bias, ap, toff, (char *)toff + p.toff_bytes, 0};
    atomic_init(&q.status, NDM_OK);
    if (p.parallel)
        ndm__parallel_for(p.items, 1, conv_items, &q);
    else
        conv_items(&q, 0, p.items);
    return (ndm_status)atomic_load(&q.status);
}

typedef struct pctx {
    const ndm__tensor *y, *x;
    const ndm__pool2d_geom *g;
} pctx;

/* The common 2x2 window of stride 2 without padding, f32, rows contiguous:
 * windows do not overlap and lie inside the plane, so no clipping; the same
 * comparisons in the same order as pool_plane_float, so the same results. */
static bool pool_is_2x2(const ndm__pool2d_geom *g, const ndm__tensor *a, const ndm__tensor *b)
{
    return a->dtype == NDM_F32 && g->kernel[0] == 2 && g->kernel[1] == 2 && g->stride[0] == 2 &&
           g->stride[1] == 2 && g->padding[0] == 0 && g->padding[1] == 0 &&
           a->strides[3] == 1 && b->strides[3] == 1;
}

#if NDM__CPU_X86
/* Eight maxima at a time of one row of pool2x2_plane, the same comparisons
 * lane by lane; returns how many windows it did. */
__attribute__((target("avx2,fma"))) static int64_t pool2x2_max_row_avx2(const float *r0,
                                                                       const float *r1,
                                                                       float *yo, int64_t OW)
{
    int64_t ow = 0;
    for (; ow + 8 <= OW; ow += 8) {
        __m256 u0 = _mm256_loadu_ps(r0 + 2 * ow), u1 = _mm256_loadu_ps(r0 + 2 * ow + 8);
        __m256 v0 = _mm256_loadu_ps(r1 + 2 * ow), v1 = _mm256_loadu_ps(r1 + 2 * ow + 8);
        __m256 a = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(u0, u1, 0x88)), 0xd8));
        __m256 b = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(u0, u1, 0xdd)), 0xd8));
        __m256 c = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xd8));
        __m256 d = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xdd)), 0xd8));
        __m256 m = a;
        m = _mm256_blendv_ps(m, b, _mm256_or_ps(_mm256_cmp_ps(b, m, _CMP_GT_OQ),
                                                _mm256_cmp_ps(b, b, _CMP_UNORD_Q)));
        m = _mm256_blendv_ps(m, c, _mm256_or_ps(_mm256_cmp_ps(c, m, _CMP_GT_OQ),
                                                _mm256_cmp_ps(c, c, _CMP_UNORD_Q)));
        m = _mm256_blendv_ps(m, d, _mm256_or_ps(_mm256_cmp_ps(d, m, _CMP_GT_OQ),
                                                _mm256_cmp_ps(d, d, _CMP_UNORD_Q)));
        _mm256_storeu_ps(yo + ow, m);
    }
    for (; ow + 4 <= OW; ow += 4) {
        __m128 u0 = _mm_loadu_ps(r0 + 2 * ow), u1 = _mm_loadu_ps(r0 + 2 * ow + 4);
        __m128 v0 = _mm_loadu_ps(r1 + 2 * ow), v1 = _mm_loadu_ps(r1 + 2 * ow + 4);
        __m128 a = _mm_shuffle_ps(u0, u1, 0x88), b = _mm_shuffle_ps(u0, u1, 0xdd);
        __m128 c = _mm_shuffle_ps(v0, v1, 0x88), d = _mm_shuffle_ps(v0, v1, 0xdd);
        __m128 m = a;
        m = _mm_blendv_ps(m, b, _mm_or_ps(_mm_cmp_ps(b, m, _CMP_GT_OQ), _mm_cmp_ps(b, b, _CMP_UNORD_Q)));
        m = _mm_blendv_ps(m, c, _mm_or_ps(_mm_cmp_ps(c, m, _CMP_GT_OQ), _mm_cmp_ps(c, c, _CMP_UNORD_Q)));
        m = _mm_blendv_ps(m, d, _mm_or_ps(_mm_cmp_ps(d, m, _CMP_GT_OQ), _mm_cmp_ps(d, d, _CMP_UNORD_Q)));
        _mm_storeu_ps(yo + ow, m);
    }
    return ow;
}
#endif

static void pool2x2_plane(const float *x, int64_t xs2, float *y, int64_t ys2, int64_t OH,
                          int64_t OW, bool max)
{
#if NDM__CPU_X86
    bool avx2 = max && ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2;
#endif
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *r0 = x + 2 * oh * xs2, *r1 = r0 + xs2;
        float *yo = y + oh * ys2;
        if (max) {
            int64_t ow = 0;
#if NDM__CPU_X86
            if (avx2)
                ow = pool2x2_max_row_avx2(r0, r1, yo, OW);
#endif
            for (; ow < OW; ow++) {
                float m = r0[2 * ow], v = r0[2 * ow + 1];
                m = (v > m || v != v) ? v : m;
                v = r1[2 * ow];
                m = (v > m || v != v) ? v : m;
                v = r1[2 * ow + 1];
                yo[ow] = (v > m || v != v) ? v : m;
            }
        } else {
            for (int64_t ow = 0; ow < OW; ow++)
                yo[ow] = (float)(((double)r0[2 * ow] + r0[2 * ow + 1] + r1[2 * ow] +
                                  r1[2 * ow + 1]) / 4.0);
        }
    }
}

static void pool_range(void *ctx, int64_t begin, int64_t end)
{
    const pctx *q = ctx;
    const ndm__tensor *x = q->x, *y = q->y;
    if (!pool_is_2x2(q->g, x, y)) {
        ndm__cpu_pool_planes(y, x, q->g, begin, end);
        return;
    }
    int64_t C = x->shape[1];
    for (int64_t pl = begin; pl < end; pl++) {
        int64_t n = pl / C, ch = pl % C;
        pool2x2_plane((const float *)x->data + n * x->strides[0] + ch * x->strides[1],
                      x->strides[2],
                      (float *)y->data + n * y->strides[0] + ch * y->strides[1], y->strides[2],
                      y->shape[2], y->shape[3], q->g->max);
    }
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

/* ---- vector kernels of the gradients ------------------------------------------
 * The weight gradient contracts over pixels, the axis along which both
 * dy's rows and the unfolded input's rows are contiguous: each element of
 * dw is the inner product of two rows. Read in place, blocks of rows keep
 * their sums in vector registers. A GEMM kernel would first pack dy
 * across its rows, a transposition of all of dy per sample that costs
 * more than the products, which are small. col2im adds short rows (one
 * output row each), which the compiler leaves scalar at -O2. */

/* c[i * rsc + j * csc] += a[i * lda + p] * b[j * ldb + p] summed over p < k,
 * for i < m, j < n. */
typedef void (*dot_s_fn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *b, int64_t ldb, float *c, int64_t rsc, int64_t csc);
typedef void (*dot_d_fn)(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                         const double *b, int64_t ldb, double *c, int64_t rsc, int64_t csc);
/* dst[i] += src[i] for i < n; the two do not overlap. */
typedef void (*add_s_fn)(float *restrict dst, const float *restrict src, int64_t n);
typedef void (*add_d_fn)(double *restrict dst, const double *restrict src, int64_t n);

/* Plain C: the portable kernel, and the tails of the vector ones. */
#define NDM__DOT_C(T)                                                           \
    static inline T dot_tail_##T(const T *a, const T *b, int64_t p0, int64_t k) \
    {                                                                           \
        T s = 0;                                                                \
        for (int64_t p = p0; p < k; p++)                                        \
            s += a[p] * b[p];                                                   \
        return s;                                                               \
    }                                                                           \
    static void dot_c_##T(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b, \
                          int64_t ldb, T *c, int64_t rsc, int64_t csc)          \
    {                                                                           \
        for (int64_t i = 0; i < m; i++)                                         \
            for (int64_t j = 0; j < n; j++)                                     \
                c[i * rsc + j * csc] += dot_tail_##T(a + i * lda, b + j * ldb, 0, k); \
    }
NDM__DOT_C(float)
NDM__DOT_C(double)

#define NDM__ADD_C(T)                                                           \
    static void add_c_##T(T *restrict dst, const T *restrict src, int64_t n)    \
    {                                                                           \
        for (int64_t i = 0; i < n; i++)                                         \
            dst[i] += src[i];                                                   \
    }
NDM__ADD_C(float)
NDM__ADD_C(double)

#if NDM__CPU_X86
/* MB x NB blocks of sums in vectors V of L elements; the rows and columns
 * left over go one sum at a time. */
#define NDM__DOT_SIMD(NAME, T, V, L, ATTR, LOAD, ZERO, FMA, HSUM, MB, NB)       \
    ATTR static void NAME(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b, \
                          int64_t ldb, T *c, int64_t rsc, int64_t csc)          \
    {                                                                           \
        int64_t kv = k - k % L, mf = m - m % MB, nf = n - n % NB;               \
        for (int64_t i0 = 0; i0 < mf; i0 += MB)                                 \
            for (int64_t j0 = 0; j0 < nf; j0 += NB) {                           \
                V acc[MB][NB], va[MB], vb[NB];                                  \
                _Pragma("GCC unroll 4") for (int ii = 0; ii < MB; ii++)         \
                    _Pragma("GCC unroll 4") for (int jj = 0; jj < NB; jj++)     \
                        acc[ii][jj] = ZERO();                                   \
                for (int64_t p = 0; p < kv; p += L) {                           \
                    _Pragma("GCC unroll 4") for (int ii = 0; ii < MB; ii++)     \
                        va[ii] = LOAD(a + (i0 + ii) * lda + p);                 \
                    _Pragma("GCC unroll 4") for (int jj = 0; jj < NB; jj++)     \
                        vb[jj] = LOAD(b + (j0 + jj) * ldb + p);                 \
                    _Pragma("GCC unroll 4") for (int ii = 0; ii < MB; ii++)     \
                        _Pragma("GCC unroll 4") for (int jj = 0; jj < NB; jj++) \
                            acc[ii][jj] = FMA(va[ii], vb[jj], acc[ii][jj]);     \
                }                                                               \
                for (int ii = 0; ii < MB; ii++)                                 \
                    for (int jj = 0; jj < NB; jj++) {                           \
                        const T *ar = a + (i0 + ii) * lda, *br = b + (j0 + jj) * ldb; \
                        c[(i0 + ii) * rsc + (j0 + jj) * csc] +=                 \
                            HSUM(acc[ii][jj]) + dot_tail_##T(ar, br, kv, k);    \
                    }                                                           \
            }                                                                   \
        for (int64_t i = 0; i < m; i++)                                         \
            for (int64_t j = i < mf ? nf : 0; j < n; j++) {                     \
                const T *ar = a + i * lda, *br = b + j * ldb;                   \
                V s = ZERO();                                                   \
                for (int64_t p = 0; p < kv; p += L)                             \
                    s = FMA(LOAD(ar + p), LOAD(br + p), s);                     \
                c[i * rsc + j * csc] += HSUM(s) + dot_tail_##T(ar, br, kv, k);  \
            }                                                                   \
    }

#define NDM__AVX512 __attribute__((target("avx512f")))
#define NDM__AVX2 __attribute__((target("avx2,fma")))

NDM__AVX2 static inline float hsum_ps256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

NDM__AVX2 static inline double hsum_pd256(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* 4 x 3 blocks: 12 sums and 7 loads in 32 registers; 4 x 2 in 16. */
NDM__DOT_SIMD(dot_s_avx512, float, __m512, 16, NDM__AVX512, _mm512_loadu_ps, _mm512_setzero_ps,
              _mm512_fmadd_ps, _mm512_reduce_add_ps, 4, 3)
NDM__DOT_SIMD(dot_d_avx512, double, __m512d, 8, NDM__AVX512, _mm512_loadu_pd, _mm512_setzero_pd,
              _mm512_fmadd_pd, _mm512_reduce_add_pd, 4, 3)
NDM__DOT_SIMD(dot_s_avx2, float, __m256, 8, NDM__AVX2, _mm256_loadu_ps, _mm256_setzero_ps,
              _mm256_fmadd_ps, hsum_ps256, 4, 2)
NDM__DOT_SIMD(dot_d_avx2, double, __m256d, 4, NDM__AVX2, _mm256_loadu_pd, _mm256_setzero_pd,
              _mm256_fmadd_pd, hsum_pd256, 4, 2)

/* AVX-512 ends a row with a masked vector; AVX2 with scalars. */
#define NDM__ADD_AVX512(NAME, T, L, MASK, SUF)                                  \
    NDM__AVX512 static void NAME(T *restrict dst, const T *restrict src, int64_t n) \
    {                                                                           \
        int64_t i = 0;                                                          \
        for (; i + L <= n; i += L)                                              \
            _mm512_storeu_##SUF(dst + i, _mm512_add_##SUF(_mm512_loadu_##SUF(dst + i), \
                                                          _mm512_loadu_##SUF(src + i))); \
        if (i < n) {                                                            \
            MASK m = (MASK)((1u << (n - i)) - 1);                               \
            _mm512_mask_storeu_##SUF(dst + i, m,                                \
                                     _mm512_add_##SUF(_mm512_maskz_loadu_##SUF(m, dst + i), \
                                                      _mm512_maskz_loadu_##SUF(m, src + i))); \
        }                                                                       \
    }
NDM__ADD_AVX512(add_s_avx512, float, 16, __mmask16, ps)
NDM__ADD_AVX512(add_d_avx512, double, 8, __mmask8, pd)

#define NDM__ADD_AVX2(NAME, T, L, SUF)                                          \
    NDM__AVX2 static void NAME(T *restrict dst, const T *restrict src, int64_t n) \
    {                                                                           \
        int64_t i = 0;                                                          \
        for (; i + L <= n; i += L)                                              \
            _mm256_storeu_##SUF(dst + i, _mm256_add_##SUF(_mm256_loadu_##SUF(dst + i), \
                                                          _mm256_loadu_##SUF(src + i))); \
        for (; i < n; i++)                                                      \
            dst[i] += src[i];                                                   \
    }
NDM__ADD_AVX2(add_s_avx2, float, 8, ps)
NDM__ADD_AVX2(add_d_avx2, double, 4, pd)
#endif

typedef struct grad_kernels {
    dot_s_fn dot_s;
    dot_d_fn dot_d;
    add_s_fn add_s;
    add_d_fn add_d;
} grad_kernels;

static const grad_kernels gk_portable = {dot_c_float, dot_c_double, add_c_float, add_c_double};
#if NDM__CPU_X86
static const grad_kernels gk_avx512 = {dot_s_avx512, dot_d_avx512, add_s_avx512, add_d_avx512};
static const grad_kernels gk_avx2 = {dot_s_avx2, dot_d_avx2, add_s_avx2, add_d_avx2};
#endif
/* The kernels of the CPU level in effect (isa.h). */
static const grad_kernels *gk_pick(void)
{
#if NDM__CPU_X86
    static const grad_kernels *const by_level[NDM__CPU_ISA_COUNT] = {&gk_portable, &gk_avx2,
                                                                      &gk_avx512};
    return by_level[ndm__cpu_isa_level()];
#else
    return &gk_portable;
#endif
}

bool ndm__cpu_conv_grad_isa(int isa)
{
    return ndm__cpu_isa_force(isa <= 0 ? -1 : isa - 1);
}

/* ---- fast gradients -------------------------------------------------------------
 * The forward read backwards. For the input, per (sample, group): one GEMM
 * gives the gradient of the unfolded input, col (K x tile) = W^T @ dy, and
 * col2im adds its rows back into dx (a 1x1 convolution with unit stride and
 * no padding writes dx directly). For the weight: dw += dy @ im2col(x)^T
 * over the batch. The (sample, group) units are cut into `parts` that run
 * side by side, one per thread, each with its own scratch and, for the
 * weight, its own partial sum; the partials are added in part order, so the
 * result does not depend on timing. There the input gradient runs ndm's
 * GEMM and the weight gradient the inner products above. A batch too small
 * for the threads runs as one part with the provider's threaded GEMM. */

typedef struct bplan {
    ndm__conv_sizes c;
    int64_t tile, ntiles, units;
    int64_t dps, xps;  /* pixel strides of dy and of x (or dx) when they have one */
    bool weight;    /* the weight's gradient (else the input's) */
    bool direct, gather, wcopy;
    bool dot;       /* weight gradient by inner products (rows of unit stride) */
    bool packed;    /* ndm's GEMM on packed operands, a part per thread */
    bool padx;      /* input gradient, packed: summed into padded planes */
    int parts;
    int64_t Hp, Wp; /* weight gradient, packed: x's padded planes */
    size_t es, col_bytes, slot_bytes, wbytes, part_bytes, abytes, toff_bytes;
} bplan;

static int64_t numel4(const int64_t *shape)
{
    return shape[0] * shape[1] * shape[2] * shape[3];
}

/* The stride of pixel p = h * Wd + w of an Hd x Wd plane with strides (s2,
 * s3), or false when no single stride reaches every pixel. */
static bool pixel_stride(int64_t Hd, int64_t Wd, int64_t s2, int64_t s3, int64_t *ps)
{
    if (Wd <= 1)
        *ps = s2;
    else if (Hd <= 1 || s2 == Wd * s3)
        *ps = s3;
    else
        return false;
    return true;
}

/* x is the forward's input (dx for the input gradient), w its weight (dw
 * for the weight gradient). */
static bplan bwd_plan(const ndm__tensor *dy, const ndm__tensor *x, const ndm__tensor *w,
                      const ndm__conv2d_geom *g, bool weight, int threads)
{
    bplan p;
    memset(&p, 0, sizeof p);
    p.c = ndm__conv_sizes_of(dy, x, w, g);
    const ndm__conv_sizes *c = &p.c;
    p.weight = weight;
    p.es = ndm_dtype_size(dy->dtype);
    p.units = c->N * c->groups;
    p.wcopy = !weight && !w_is_matrix(w);
    p.wbytes = p.wcopy ? align64((size_t)(c->O * c->K) * p.es) : 0;
    p.part_bytes = weight ? align64((size_t)(c->O * c->K) * p.es) : 0;
    p.parts = threads > 1 && p.units >= threads ? threads : 1;
    /* Partial sums of a large weight cost more memory than splitting each
     * product over the provider's threads costs time. */
    if (p.parts > 1 && p.part_bytes * (size_t)(p.parts - 1) > ((size_t)32 << 20))
        p.parts = 1;
    /* Inner products suit a short K (a first layer's few taps, where a GEMM
     * tile would be mostly padding); longer ones run ndm's GEMM, which
     * keeps a block of dw in registers: inner products over a 64 x 288
     * dw took a fifth of a 2-thread CNN step. */
    p.dot = weight && p.parts > 1 && c->K <= 64;
    p.direct = c->KH == 1 && c->KW == 1 && c->sh == 1 && c->sw == 1 && c->ph == 0 &&
               c->pw == 0 && pixel_stride(c->H, c->W, x->strides[2], x->strides[3], &p.xps) &&
               (!p.dot || p.xps == 1);
    /* dy whose pixels have no single stride (a transposed view) is
     * gathered a tile at a time, and so is one whose stride is not 1 when
     * inner products read it */
    p.gather = !pixel_stride(c->OH, c->OW, dy->strides[2], dy->strides[3], &p.dps) ||
               (p.dot && p.dps != 1);
    int64_t rows = p.direct ? 0 : c->K;
    rows = p.gather && c->Og > rows ? c->Og : rows;
    p.tile = tile_pixels(rows, c->P);
    p.ntiles = p.tile ? (c->P + p.tile - 1) / p.tile : 0;
    p.col_bytes = p.direct ? 0 : align64((size_t)(c->K * p.tile) * p.es);
    p.slot_bytes = p.col_bytes + (p.gather ? align64((size_t)(c->Og * p.tile) * p.es) : 0);
    /* Packed operands where each thread runs whole units (one thread, or a
     * batch that fills the pool): the input gradient packs W^T once; the
     * weight gradient packs each unit's dy and writes unfold(x)^T straight
     * into B's panels from x's padded planes, whole planes at a time. A
     * few taps (a first layer's) would leave most of each panel (or each
     * row panel of W^T) zeros: those keep the provider's small product or
     * the inner products. */
    p.packed = (p.parts > 1 || threads == 1) && c->K > 64 && (!weight || (!p.dot && !p.gather));
    if (p.packed && weight) {
        padded_dims(c, &p.Hp, &p.Wp);
        p.tile = c->P;
        p.ntiles = c->P ? 1 : 0;
        p.col_bytes = 0;
        p.slot_bytes = padded_bytes(c, p.Hp, p.Wp, p.es) +
                       align64(ndm__gemm_packed_a_bytes(dy->dtype, c->Og, c->P));
        p.toff_bytes = align64((size_t)c->K * sizeof(int64_t));
    } else if (p.packed) {
        p.abytes = align64(ndm__gemm_packed_a_bytes(dy->dtype, c->K, c->Og));
        /* col2im adds whole rows into padded planes, no edge to clip, which
         * are then copied into dx once: dx is written, never cleared */
        p.padx = !p.direct;
        if (p.padx) {
            padded_dims(c, &p.Hp, &p.Wp);
            p.toff_bytes = align64((size_t)c->K * sizeof(int64_t));
            p.slot_bytes += padded_bytes(c, p.Hp, p.Wp, p.es);
        }
    }
    return p;
}

static size_t bwd_workspace(const bplan *p)
{
    return p->wbytes + (size_t)p->c.groups * p->abytes + p->toff_bytes +
           (size_t)(p->parts - 1) * p->part_bytes + (size_t)p->parts * p->slot_bytes;
}

static size_t bwd_workspace_for(const ndm__tensor *dy, const ndm__tensor *x,
                                const ndm__tensor *w, const ndm__conv2d_geom *g, bool weight)
{
    bplan p = bwd_plan(dy, x, w, g, weight, ndm__num_threads());
    return bwd_workspace(&p);
}

/* The plan of a run whose workspace holds ws_bytes: the pool may have been
 * resized since the workspace was sized, and then one part is tried. False
 * when that does not fit either. */
static bool bwd_plan_fit(bplan *p, const ndm__tensor *dy, const ndm__tensor *x,
                         const ndm__tensor *w, const ndm__conv2d_geom *g, bool weight,
                         size_t ws_bytes)
{
    *p = bwd_plan(dy, x, w, g, weight, ndm__num_threads());
    if (bwd_workspace(p) <= ws_bytes)
        return true;
    *p = bwd_plan(dy, x, w, g, weight, 1);
    return bwd_workspace(p) <= ws_bytes;
}

/* dy's pixels [p0, p0 + np) of group gi of sample n as an Og x np matrix
 * (row stride *rs, column stride *cs): in place, or gathered into buf. */
#define NDM__DY_GATHER(T)                                                       \
    static void dy_gather_##T(T *restrict buf, const T *base, const int64_t *ds, int64_t og, \
                              int64_t OW, int64_t p0, int64_t np)               \
    {                                                                           \
        for (int64_t o = 0; o < og; o++) {                                      \
            const T *src = base + o * ds[1];                                    \
            int64_t oh = p0 / OW, ow = p0 % OW;                                 \
            for (int64_t i = 0; i < np; i++) {                                  \
                *buf++ = src[oh * ds[2] + ow * ds[3]];                          \
                if (++ow == OW)                                                 \
                    ow = 0, oh++;                                               \
            }                                                                   \
        }                                                                       \
    }
NDM__DY_GATHER(float)
NDM__DY_GATHER(double)

static const char *dy_tile(const bplan *p, const ndm__tensor *dy, char *buf, int64_t n,
                           int64_t gi, int64_t p0, int64_t np, int64_t *rs, int64_t *cs)
{
    const ndm__conv_sizes *c = &p->c;
    const int64_t *ds = dy->strides, es = (int64_t)p->es;
    const char *base = (const char *)dy->data + (n * ds[0] + gi * c->Og * ds[1]) * es;
    if (!p->gather) {
        *rs = ds[1];
        *cs = p->dps;
        return base + p0 * p->dps * es;
    }
    if (es == 4)
        dy_gather_float((float *)buf, (const float *)base, ds, c->Og, c->OW, p0, np);
    else
        dy_gather_double((double *)buf, (const double *)base, ds, c->Og, c->OW, p0, np);
    *rs = np;
    *cs = 1;
    return buf;
}

/* The inverse of im2col: add col (K x np), the gradient of the unfolded
 * pixels [p0, p0 + np) of group gi of sample n, into dx, which holds
 * zeros or earlier tiles' sums. Rows of col whose taps fall in the padding
 * are skipped, as im2col wrote zeros for them. */
#define NDM__COL2IM(T, ADD)                                                     \
    static void col2im_##T(const T *col, T *dx, const int64_t *xs, const ndm__conv_sizes *c, \
                           int64_t n,                                           \
                           int64_t gi, int64_t p0, int64_t np, const grad_kernels *gk) \
    {                                                                           \
        const T *row = col;                                                     \
        for (int64_t ci = 0; ci < c->Cg; ci++) {                                \
            T *plane = dx + n * xs[0] + (gi * c->Cg + ci) * xs[1];              \
            for (int64_t kh = 0; kh < c->KH; kh++)                              \
                for (int64_t kw = 0; kw < c->KW; kw++, row += np)               \
                    for (tap_run t = first_run(c, kh, kw, p0, np); t.seg; t = next_run(c, t)) { \
                        const T *d = row + (t.pp - p0);                         \
                        if (t.ih >= 0 && t.ih < c->H) {                         \
                            T *dst = plane + t.ih * xs[2];                      \
                            if (c->sw == 1 && xs[3] == 1)                       \
                                gk->ADD(dst + t.a + t.off, d + (t.a - t.ow), t.b - t.a); \
                            else                                                \
                                for (int64_t o = t.a; o < t.b; o++)             \
                                    dst[(o * c->sw + t.off) * xs[3]] += d[o - t.ow]; \
                        }                                                       \
                    }                                                           \
        }                                                                       \
    }
NDM__COL2IM(float, add_s)
NDM__COL2IM(double, add_d)

/* col2im into padded planes (see pad_input): add col (K x np), the
 * gradient of the unfolded pixels [p0, p0 + np), at xp[toff[t] + poff(p)];
 * with unit stride, a run of consecutive elements per output row. */
#define NDM__COL2IM_PAD(T, ATTR, NAME, VEC)                                     \
    ATTR static void NAME(const T *col, T *xp, const int64_t *toff, const ndm__conv_sizes *c, \
                          int64_t Wp,                                           \
                          int64_t p0, int64_t np)                               \
    {                                                                           \
        int64_t oh0 = p0 / c->OW, ow0 = p0 % c->OW, end = p0 + np;              \
        for (int64_t t = 0; t < c->K; t++) {                                    \
            const T *s = col + t * np;                                          \
            T *base = xp + toff[t];                                             \
            int64_t oh = oh0, ow = ow0, pp = p0;                                \
            while (pp < end) {                                                  \
                int64_t seg = c->OW - ow < end - pp ? c->OW - ow : end - pp;    \
                T *d = base + oh * c->sh * Wp + ow * c->sw;                     \
                int64_t i = 0;                                                  \
                if (c->sw == 1) {                                               \
                    VEC                                                         \
                    for (; i < seg; i++)                                        \
                        d[i] += s[i];                                           \
                } else {                                                        \
                    for (; i < seg; i++)                                        \
                        d[i * c->sw] += s[i];                                   \
                }                                                               \
                s += seg, pp += seg, oh++, ow = 0;                              \
            }                                                                   \
        }                                                                       \
    }
NDM__COL2IM_PAD(float, , col2im_pad_float, )
NDM__COL2IM_PAD(double, , col2im_pad_double, )
#if NDM__CPU_X86
/* lanes [8 - r, 16 - r) of this hold r ones then zeros: the mask of an
 * r-element tail */
static const int32_t tail_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1};
NDM__COL2IM_PAD(float, NDM__AVX2, col2im_pad_float_avx2,
                for (; i + 8 <= seg; i += 8) _mm256_storeu_ps(
                    d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
                if (i < seg) {
                    __m256i mk = _mm256_loadu_si256((const __m256i *)(tail_mask + 8 - (seg - i)));
                    _mm256_maskstore_ps(d + i, mk,
                                        _mm256_add_ps(_mm256_maskload_ps(d + i, mk),
                                                      _mm256_maskload_ps(s + i, mk)));
                    i = seg;
                })
#endif

static void col2im_pad(const char *col, char *xp, const int64_t *toff, const ndm__conv_sizes *c,
                       int64_t Wp,
                       int64_t p0, int64_t np, int64_t es)
{
    if (es == 8) {
        col2im_pad_double((const double *)col, (double *)xp, toff, c, Wp, p0, np);
        return;
    }
#if NDM__CPU_X86
    if (ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2) {
        col2im_pad_float_avx2((const float *)col, (float *)xp, toff, c, Wp, p0, np);
        return;
    }
#endif
    col2im_pad_float((const float *)col, (float *)xp, toff, c, Wp, p0, np);
}

/* The inverse of pad_input: the planes of group gi's block of dx (at dx,
 * strides xs) from the padded ones; input elements no tap reads get 0. */
#define NDM__UNPAD(T)                                                           \
    static void unpad_##T(T *dx, const int64_t *xs, const T *xp, const ndm__conv_sizes *c, \
                          int64_t Hp,                                           \
                          int64_t Wp)                                           \
    {                                                                           \
        int64_t wv = Wp - c->pw < c->W ? Wp - c->pw : c->W;                     \
        wv = wv > 0 ? wv : 0;                                                   \
        for (int64_t ci = 0; ci < c->Cg; ci++)                                  \
            for (int64_t ih = 0; ih < c->H; ih++) {                             \
                T *d = dx + ci * xs[1] + ih * xs[2];                            \
                int64_t r = ih + c->ph, iw = 0;                                 \
                if (r < Hp) {                                                   \
                    const T *s = xp + (ci * Hp + r) * Wp + c->pw;               \
                    if (xs[3] == 1) {                                           \
                        memcpy(d, s, (size_t)wv * sizeof(T));                   \
                        iw = wv;                                                \
                    } else {                                                    \
                        for (; iw < wv; iw++)                                   \
                            d[iw * xs[3]] = s[iw];                              \
                    }                                                           \
                }                                                               \
                for (; iw < c->W; iw++)                                         \
                    d[iw * xs[3]] = 0;                                          \
            }                                                                   \
    }
NDM__UNPAD(float)
NDM__UNPAD(double)

typedef struct bctx {
    const bplan *p;
    const ndm__tensor *out, *dy, *in; /* out: dx or dw; in: w or x */
    const char *wm;                   /* input gradient: the weights as an O x K matrix */
    int64_t wrs, wcs;
    const char *ap;                   /* packed: W^T per group (input) */
    const int64_t *toff;              /* packed: tap offsets (weight) */
    char *partials, *slots;
    const grad_kernels *gk;
    unsigned flags;
    atomic_int status;
} bctx;

/* Sample n, group gi of the input gradient, tile by tile into dx. */
static void bwd_input_unit(bctx *q, char *col, char *dyb, int64_t n, int64_t gi)
{
    const bplan *p = q->p;
    const ndm__conv_sizes *c = &p->c;
    int64_t es = (int64_t)p->es;
    ndm_dtype dt = q->out->dtype;
    const int64_t *xs = q->out->strides;
    char *dxg = (char *)q->out->data + (n * xs[0] + gi * c->Cg * xs[1]) * es;
    /* dx is C-contiguous: the group's channels are one block */
    char *dxp = NULL;
    if (p->padx) {
        dxp = col + p->slot_bytes - padded_bytes(c, p->Hp, p->Wp, p->es);
        memset(dxp, 0, (size_t)(c->Cg * p->Hp * p->Wp) * p->es);
    } else if (!p->direct) {
        memset(dxg, 0, (size_t)(c->Cg * c->H * c->W) * p->es);
    }
    /* W^T of the group: K x Og */
    const char *a = q->wm + gi * c->Og * q->wrs * es;
    for (int64_t t = 0; t < p->ntiles; t++) {
        int64_t p0 = t * p->tile;
        int64_t np = c->P - p0 < p->tile ? c->P - p0 : p->tile;
        int64_t rsb, csb;
        const char *b = dy_tile(p, q->dy, dyb, n, gi, p0, np, &rsb, &csb);
        ndm_status st;
        if (p->packed) {
            ndm__gemm_matrix mb = {b, rsb, csb, p->es};
            const char *ag = q->ap + (size_t)gi * p->abytes;
            char *cp = p->direct ? dxg + p0 * p->xps * es : col;
            st = ndm__gemm_packed(dt, c->K, np, c->Og, ag, ndm__gemm_matrix_panel, &mb, cp,
                                  p->direct ? xs[1] : np, p->direct ? p->xps : 1, NULL, 0, 0);
            if (st >= 0 && p->padx)
                col2im_pad(col, dxp, q->toff, c, p->Wp, p0, np, es);
        } else if (p->direct) {
            st = ndm__cpu_gemm(dt, c->K, np, c->Og, a, q->wcs, q->wrs, b, rsb, csb,
                               dxg + p0 * p->xps * es, xs[1], p->xps, q->flags);
        } else {
            st = ndm__cpu_gemm(dt, c->K, np, c->Og, a, q->wcs, q->wrs, b, rsb, csb, col, np, 1,
                               q->flags);
            if (st >= 0 && es == 4)
                col2im_float((const float *)col, q->out->data, xs, c, n, gi, p0, np, q->gk);
            else if (st >= 0)
                col2im_double((const double *)col, q->out->data, xs, c, n, gi, p0, np, q->gk);
        }
        if (st < 0)
            atomic_store(&q->status, st);
    }
    if (p->padx && es == 4)
        unpad_float((float *)dxg, xs, (const float *)dxp, c, p->Hp, p->Wp);
    else if (p->padx)
        unpad_double((double *)dxg, xs, (const double *)dxp, c, p->Hp, p->Wp);
}

/* Sample n, group gi of the weight gradient, tile by tile, added into acc
 * (an O x K matrix). */
static void bwd_weight_unit(bctx *q, char *col, char *dyb, char *acc, int64_t n, int64_t gi)
{
    const bplan *p = q->p;
    const ndm__conv_sizes *c = &p->c;
    int64_t es = (int64_t)p->es;
    const int64_t *xs = q->in->strides;
    char *cg = acc + gi * c->Og * c->K * es;
    if (p->packed) {
        /* the slot: x's padded planes, then this unit's dy packed */
        char *xp = col, *ap = col + padded_bytes(c, p->Hp, p->Wp, p->es);
        if (es == 4)
            pad_input_float((float *)xp, q->in->data, xs, c, p->Hp, p->Wp, n, gi);
        else
            pad_input_double((double *)xp, q->in->data, xs, c, p->Hp, p->Wp, n, gi);
        const int64_t *ds = q->dy->strides;
        const char *dyg = (const char *)q->dy->data + (n * ds[0] + gi * c->Og * ds[1]) * es;
        ndm__gemm_pack_a(q->out->dtype, c->Og, c->P, dyg, ds[1], p->dps, ap);
        unfold u = {xp, q->toff, c, p->Wp, 0};
        ndm_status st = ndm__gemm_packed(
            q->out->dtype, c->Og, c->K, c->P, ap, unfold_t_pick(p->es), &u, cg, c->K, 1, NULL, 0,
            NDM__GEMM_ACCUMULATE);
        if (st < 0)
            atomic_store(&q->status, st);
        return;
    }
    for (int64_t t = 0; t < p->ntiles; t++) {
        int64_t p0 = t * p->tile;
        int64_t np = c->P - p0 < p->tile ? c->P - p0 : p->tile;
        int64_t rsa, csa, rsb, csb;
        const char *a = dy_tile(p, q->dy, dyb, n, gi, p0, np, &rsa, &csa);
        const char *b;
        if (p->direct) {
            /* a 1x1 kernel: x's pixels are the unfolded input */
            b = (const char *)q->in->data + (n * xs[0] + gi * c->Cg * xs[1] + p0 * p->xps) * es;
            rsb = p->xps;
            csb = xs[1];
        } else {
            if (es == 4)
                im2col_float((float *)col, q->in->data, xs, c, n, gi, p0, np);
            else
                im2col_double((double *)col, q->in->data, xs, c, n, gi, p0, np);
            b = col;
            rsb = 1;
            csb = np;
        }
        if (p->dot && es == 4) {
            q->gk->dot_s(c->Og, c->K, np, (const float *)a, rsa, (const float *)b, csb,
                         (float *)cg, c->K, 1);
        } else if (p->dot) {
            q->gk->dot_d(c->Og, c->K, np, (const double *)a, rsa, (const double *)b, csb,
                         (double *)cg, c->K, 1);
        } else {
            ndm_status st = ndm__cpu_gemm(q->out->dtype, c->Og, c->K, np, a, rsa, csa, b, rsb,
                                          csb, cg, c->K, 1, q->flags | NDM__GEMM_ACCUMULATE);
            if (st < 0)
                atomic_store(&q->status, st);
        }
    }
}

/* Parts [begin, end): each runs its share of the (sample, group) units
 * with its own scratch slot. Part 0 of the weight gradient sums into dw
 * itself (C-contiguous: an O x K matrix), the others into their partials. */
static void bwd_parts(void *ctx, int64_t begin, int64_t end)
{
    bctx *q = ctx;
    const bplan *p = q->p;
    int64_t groups = p->c.groups;
    for (int64_t part = begin; part < end; part++) {
        char *col = p->slot_bytes ? q->slots + (size_t)part * p->slot_bytes : NULL;
        char *dyb = col ? col + p->col_bytes : NULL;
        char *acc = NULL;
        if (p->weight) {
            acc = part ? q->partials + (size_t)(part - 1) * p->part_bytes : q->out->data;
            memset(acc, 0, (size_t)(p->c.O * p->c.K) * p->es);
        }
        int64_t u1 = (part + 1) * p->units / p->parts;
        for (int64_t u = part * p->units / p->parts; u < u1; u++) {
            if (p->weight)
                bwd_weight_unit(q, col, dyb, acc, u / groups, u % groups);
            else
                bwd_input_unit(q, col, dyb, u / groups, u % groups);
        }
    }
}

/* Either gradient: out is dx (in is then w) or dw (in is x). The workspace
 * holds the gathered weights (input) or the partial sums of parts 1 and
 * up (weight), then a scratch slot per part. */
static ndm_status bwd_run(const ndm__tensor *out, const ndm__tensor *dy, const ndm__tensor *in,
                          const ndm__conv2d_geom *g, bool weight, void *ws, size_t ws_bytes)
{
    if (out->dtype != NDM_F32 && out->dtype != NDM_F64)
        return NDM_E_DTYPE;
    if (numel4(out->shape) == 0)
        return NDM_OK;
    bplan p;
    if (!bwd_plan_fit(&p, dy, weight ? in : out, weight ? out : in, g, weight, ws_bytes))
        return NDM_E_INVALID;
    char *wsp = ws;
    bctx q = {&p, out, dy, in, NULL, 0, 0, NULL, NULL, NULL, NULL, gk_pick(), 0, 0};
    atomic_init(&q.status, NDM_OK);
    /* the workspace: gathered weights, packed W^T per group, tap offsets,
     * partial sums, slots */
    char *at = wsp ? wsp + p.wbytes : NULL;
    if (!weight)
        q.wm = weight_matrix(in, &p.c, p.es, p.wcopy, wsp, &q.wrs, &q.wcs);
    if (!weight && p.packed) {
        q.ap = at;
        for (int64_t gi = 0; gi < p.c.groups; gi++)
            ndm__gemm_pack_a(out->dtype, p.c.K, p.c.Og, q.wm + gi * p.c.Og * q.wrs * (int64_t)p.es,
                             q.wcs, q.wrs, at + (size_t)gi * p.abytes);
    }
    at = at ? at + (size_t)p.c.groups * p.abytes : NULL;
    if ((weight && p.packed) || p.padx) {
        tap_offsets((int64_t *)at, &p.c, p.Hp, p.Wp);
        q.toff = (const int64_t *)at;
    }
    q.partials = at ? at + p.toff_bytes : NULL;
    q.slots = q.partials ? q.partials + (size_t)(p.parts - 1) * p.part_bytes : NULL;
    if (p.parts > 1) {
        q.flags = NDM__GEMM_NO_PROVIDER;
        ndm__parallel_for(p.parts, 1, bwd_parts, &q);
    } else {
        bwd_parts(&q, 0, 1);
    }
    int64_t ok = p.c.O * p.c.K;
    for (int part = 1; weight && part < p.parts; part++) {
        const char *src = q.partials + (size_t)(part - 1) * p.part_bytes;
        if (p.es == 4)
            q.gk->add_s(out->data, (const float *)src, ok);
        else
            q.gk->add_d(out->data, (const double *)src, ok);
    }
    return (ndm_status)atomic_load(&q.status);
}

/* The table's entries of the two gradients: `out` is dx (WGRAD 0, `in` the
 * weights) or dw (WGRAD 1, `in` the input); the same plan and run. */
#define NDM__BWD_ENTRIES(NAME, WGRAD)                                           \
    static size_t fast_conv2d_backward_##NAME##_workspace(                      \
        int device, const ndm__tensor *out, const ndm__tensor *dy, const ndm__tensor *in, \
        const ndm__conv2d_geom *g)                                              \
    {                                                                           \
        (void)device;                                                           \
        return bwd_workspace_for(dy, WGRAD ? in : out, WGRAD ? out : in, g, WGRAD); \
    }                                                                           \
    static ndm_status fast_conv2d_backward_##NAME(int device, const ndm__tensor *out, \
                                                  const ndm__tensor *dy, const ndm__tensor *in, \
                                                  const ndm__conv2d_geom *g, void *ws, \
                                                  size_t ws_bytes)              \
    {                                                                           \
        (void)device;                                                           \
        return bwd_run(out, dy, in, g, WGRAD, ws, ws_bytes);                    \
    }
NDM__BWD_ENTRIES(input, false)
NDM__BWD_ENTRIES(weight, true)
#undef NDM__BWD_ENTRIES

/* One plane of pooling's gradient, windows clipped to the plane once. dx
 * is C-contiguous. */
#define NDM__POOL_BWD_PLANE(T)                                                  \
    static void pool_bwd_plane_##T(T *dx, int64_t H, int64_t W, const T *x, int64_t xs2, \
                                   int64_t xs3, const T *dy, int64_t ys2, int64_t ys3, \
                                   int64_t OH, int64_t OW, const ndm__pool2d_geom *g) \
    {                                                                           \
        memset(dx, 0, (size_t)(H * W) * sizeof(T));                             \
        for (int64_t oh = 0; oh < OH; oh++) {                                   \
            int64_t h0, h1, w0, w1;                                             \
            pool_span(oh, g->stride[0], g->padding[0], g->kernel[0], H, &h0, &h1); \
            for (int64_t ow = 0; ow < OW; ow++) {                               \
                pool_span(ow, g->stride[1], g->padding[1], g->kernel[1], W, &w0, &w1); \
                if (h0 >= h1 || w0 >= w1)                                       \
                    continue;                                                   \
                T gv = dy[oh * ys2 + ow * ys3];                                 \
                if (g->max) {                                                   \
                    int64_t bh = h0, bw = w0;                                   \
                    T m = x[h0 * xs2 + w0 * xs3];                               \
                    for (int64_t ih = h0; ih < h1; ih++)                        \
                        for (int64_t iw = w0; iw < w1; iw++) {                  \
                            T v = x[ih * xs2 + iw * xs3];                       \
                            if (v > m || v != v)                                \
                                m = v, bh = ih, bw = iw;                        \
                        }                                                       \
                    dx[bh * W + bw] += gv;                                      \
                } else {                                                        \
                    int64_t div = g->count_include_pad ? g->kernel[0] * g->kernel[1] \
                                                       : (h1 - h0) * (w1 - w0); \
                    T share = (T)((double)gv / (double)div);                    \
                    for (int64_t ih = h0; ih < h1; ih++)                        \
                        for (int64_t iw = w0; iw < w1; iw++)                    \
                            dx[ih * W + iw] += share;                           \
                }                                                               \
            }                                                                   \
        }                                                                       \
    }
NDM__POOL_BWD_PLANE(float)
NDM__POOL_BWD_PLANE(double)

typedef struct pbctx {
    const ndm__tensor *dx, *dy, *x;
    const ndm__pool2d_geom *g;
} pbctx;

/* pool_bwd_plane_float for the 2x2 window of stride 2 without padding (see
 * pool_is_2x2): the same winner and the same sums. The windows tile the
 * plane, so each element of dx is written once, from the window that holds
 * it (0 + g for the winner, as the sum onto zeros would give: -0 becomes +0),
 * without clearing dx first; only a last odd row and column, which no window
 * holds, are cleared. The winner is found without branches: the first
 * maximum, or the last NaN (the forward's comparison). */
#if NDM__CPU_X86
/* Eight windows at a time of one row of pool2x2_bwd_plane: the same
 * comparisons, lane by lane; returns how many windows it did. */
NDM__AVX2 static int64_t pool2x2_bwd_row_avx2(float *d0, float *d1, const float *r0,
                                              const float *r1, const float *g, int64_t OW,
                                              bool max)
{
    int64_t ow = 0;
    const __m256 zero = _mm256_setzero_ps();
    for (; ow + 8 <= OW; ow += 8) {
        __m256 gv = _mm256_add_ps(zero, _mm256_loadu_ps(g + ow));
        __m256 pa, pb, pc, pd;
        if (max) {
            /* even and odd columns of the two rows, in window order */
            __m256 u0 = _mm256_loadu_ps(r0 + 2 * ow), u1 = _mm256_loadu_ps(r0 + 2 * ow + 8);
            __m256 v0 = _mm256_loadu_ps(r1 + 2 * ow), v1 = _mm256_loadu_ps(r1 + 2 * ow + 8);
            __m256 a = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(u0, u1, 0x88)), 0xd8));
            __m256 b = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(u0, u1, 0xdd)), 0xd8));
            __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xd8));
            __m256 d = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xdd)), 0xd8));
            __m256 m = a;
            __m256 tb = _mm256_or_ps(_mm256_cmp_ps(b, m, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
            m = _mm256_blendv_ps(m, b, tb);
            __m256 tc = _mm256_or_ps(_mm256_cmp_ps(c, m, _CMP_GT_OQ), _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
            m = _mm256_blendv_ps(m, c, tc);
            __m256 td = _mm256_or_ps(_mm256_cmp_ps(d, m, _CMP_GT_OQ), _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
            /* the last comparison that moved the maximum names the winner */
            pd = _mm256_and_ps(td, gv);
            pc = _mm256_and_ps(_mm256_andnot_ps(td, tc), gv);
            pb = _mm256_and_ps(_mm256_andnot_ps(_mm256_or_ps(tc, td), tb), gv);
            pa = _mm256_andnot_ps(_mm256_or_ps(tb, _mm256_or_ps(tc, td)), gv);
        } else {
            pa = pb = pc = pd = _mm256_add_ps(zero, _mm256_mul_ps(gv, _mm256_set1_ps(0.25f)));
        }
        /* back to interleaved columns */
        __m256 lo = _mm256_unpacklo_ps(pa, pb), hi = _mm256_unpackhi_ps(pa, pb);
        _mm256_storeu_ps(d0 + 2 * ow, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(d0 + 2 * ow + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        lo = _mm256_unpacklo_ps(pc, pd), hi = _mm256_unpackhi_ps(pc, pd);
        _mm256_storeu_ps(d1 + 2 * ow, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(d1 + 2 * ow + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
    /* four more with half vectors (a row of 7 windows, say) */
    for (; ow + 4 <= OW; ow += 4) {
        __m128 z = _mm_setzero_ps(), gv = _mm_add_ps(z, _mm_loadu_ps(g + ow));
        __m128 pa, pb, pc, pd;
        if (max) {
            __m128 u0 = _mm_loadu_ps(r0 + 2 * ow), u1 = _mm_loadu_ps(r0 + 2 * ow + 4);
            __m128 v0 = _mm_loadu_ps(r1 + 2 * ow), v1 = _mm_loadu_ps(r1 + 2 * ow + 4);
            __m128 a = _mm_shuffle_ps(u0, u1, 0x88), b = _mm_shuffle_ps(u0, u1, 0xdd);
            __m128 c = _mm_shuffle_ps(v0, v1, 0x88), d = _mm_shuffle_ps(v0, v1, 0xdd);
            __m128 m = a;
            __m128 tb = _mm_or_ps(_mm_cmp_ps(b, m, _CMP_GT_OQ), _mm_cmp_ps(b, b, _CMP_UNORD_Q));
            m = _mm_blendv_ps(m, b, tb);
            __m128 tc = _mm_or_ps(_mm_cmp_ps(c, m, _CMP_GT_OQ), _mm_cmp_ps(c, c, _CMP_UNORD_Q));
            m = _mm_blendv_ps(m, c, tc);
            __m128 td = _mm_or_ps(_mm_cmp_ps(d, m, _CMP_GT_OQ), _mm_cmp_ps(d, d, _CMP_UNORD_Q));
            pd = _mm_and_ps(td, gv);
            pc = _mm_and_ps(_mm_andnot_ps(td, tc), gv);
            pb = _mm_and_ps(_mm_andnot_ps(_mm_or_ps(tc, td), tb), gv);
            pa = _mm_andnot_ps(_mm_or_ps(tb, _mm_or_ps(tc, td)), gv);
        } else {
            pa = pb = pc = pd = _mm_add_ps(z, _mm_mul_ps(gv, _mm_set1_ps(0.25f)));
        }
        _mm_storeu_ps(d0 + 2 * ow, _mm_unpacklo_ps(pa, pb));
        _mm_storeu_ps(d0 + 2 * ow + 4, _mm_unpackhi_ps(pa, pb));
        _mm_storeu_ps(d1 + 2 * ow, _mm_unpacklo_ps(pc, pd));
        _mm_storeu_ps(d1 + 2 * ow + 4, _mm_unpackhi_ps(pc, pd));
    }
    return ow;
}
#endif

static void pool2x2_bwd_plane(float *dx, int64_t H, int64_t W, const float *x, int64_t xs2,
                              const float *dy, int64_t ys2, int64_t OH, int64_t OW, bool max)
{
#if NDM__CPU_X86
    bool avx2 = ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2;
#endif
    for (int64_t oh = 0; oh < OH; oh++) {
        float *d0 = dx + 2 * oh * W, *d1 = d0 + W;
        const float *g = dy + oh * ys2;
        int64_t done = 0;
#if NDM__CPU_X86
        if (avx2)
            done = pool2x2_bwd_row_avx2(d0, d1, max ? x + 2 * oh * xs2 : NULL,
                                        max ? x + 2 * oh * xs2 + xs2 : NULL, g, OW, max);
#endif
        if (max) {
            const float *r0 = x + 2 * oh * xs2, *r1 = r0 + xs2;
            for (int64_t ow = done; ow < OW; ow++) {
                float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
                float m = a;
                int w = 0;
                bool t = b > m || b != b;
                m = t ? b : m;
                w = t ? 1 : w;
                t = c > m || c != c;
                m = t ? c : m;
                w = t ? 2 : w;
                t = d > m || d != d;
                w = t ? 3 : w;
                float gv = 0.0f + g[ow];
                d0[2 * ow] = w == 0 ? gv : 0.0f;
                d0[2 * ow + 1] = w == 1 ? gv : 0.0f;
                d1[2 * ow] = w == 2 ? gv : 0.0f;
                d1[2 * ow + 1] = w == 3 ? gv : 0.0f;
            }
        } else {
            for (int64_t ow = done; ow < OW; ow++) {
                float share = 0.0f + (float)((double)g[ow] / 4.0);
                d0[2 * ow] = share, d0[2 * ow + 1] = share;
                d1[2 * ow] = share, d1[2 * ow + 1] = share;
            }
        }
        for (int64_t iw = 2 * OW; iw < W; iw++)
            d0[iw] = d1[iw] = 0.0f;
    }
    if (2 * OH < H)
        memset(dx + 2 * OH * W, 0, (size_t)((H - 2 * OH) * W) * sizeof(float));
}

static void pool_bwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pbctx *q = ctx;
    const ndm__tensor *dx = q->dx, *dy = q->dy, *x = q->x;
    int64_t C = dx->shape[1], H = dx->shape[2], W = dx->shape[3];
    size_t es = ndm_dtype_size(dx->dtype);
    bool fast = pool_is_2x2(q->g, dx, dy) && (!x || x->strides[3] == 1);
    for (int64_t pl = begin; pl < end; pl++) {
        int64_t n = pl / C, ch = pl % C;
        char *dp = (char *)dx->data + (size_t)(pl * H * W) * es;
        const char *yp =
            (const char *)dy->data + (n * dy->strides[0] + ch * dy->strides[1]) * (int64_t)es;
        const char *xp = x ? (const char *)x->data + (n * x->strides[0] + ch * x->strides[1]) *
                                                         (int64_t)es
                           : NULL;
        int64_t xs2 = x ? x->strides[2] : 0, xs3 = x ? x->strides[3] : 0;
        if (fast)
            pool2x2_bwd_plane((float *)dp, H, W, (const float *)xp, xs2, (const float *)yp,
                              dy->strides[2], dy->shape[2], dy->shape[3], q->g->max);
        else if (es == 4)
            pool_bwd_plane_float((float *)dp, H, W, (const float *)xp, xs2, xs3,
                                 (const float *)yp, dy->strides[2], dy->strides[3],
                                 dy->shape[2], dy->shape[3], q->g);
        else
            pool_bwd_plane_double((double *)dp, H, W, (const double *)xp, xs2, xs3,
                                  (const double *)yp, dy->strides[2], dy->strides[3],
                                  dy->shape[2], dy->shape[3], q->g);
    }
}

static ndm_status fast_pool2d_backward(int device, const ndm__tensor *dx, const ndm__tensor *dy,
                                       const ndm__tensor *x, const ndm__pool2d_geom *g)
{
    (void)device;
    if (dx->dtype != NDM_F32 && dx->dtype != NDM_F64)
        return NDM_E_DTYPE;
    pbctx q = {dx, dy, x, g};
    int64_t per_plane = dy->shape[2] * dy->shape[3] * g->kernel[0] * g->kernel[1] +
                        dx->shape[2] * dx->shape[3] + 1;
    int64_t grain = per_plane >= 16384 ? 1 : 16384 / per_plane;
    ndm__parallel_for(dx->shape[0] * dx->shape[1], grain, pool_bwd_range, &q);
    return NDM_OK;
}

const struct ndm__backend_nn ndm__cpu_nn = {
    .conv2d_workspace = fast_conv2d_workspace,
    .conv2d = fast_conv2d,
    .pool2d = fast_pool2d,
    .conv2d_backward_input_workspace = fast_conv2d_backward_input_workspace,
    .conv2d_backward_input = fast_conv2d_backward_input,
    .conv2d_backward_weight_workspace = fast_conv2d_backward_weight_workspace,
    .conv2d_backward_weight = fast_conv2d_backward_weight,
    .pool2d_backward = fast_pool2d_backward,
    .rms_norm = ndm__cpu_rms_norm,
};
