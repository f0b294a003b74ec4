/* CPU reference convolution and pooling and their gradients: direct loops,
 * the test oracle. The fast kernels are in conv.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "conv_cpu.h"

/* KERNEL_float or KERNEL_double on the arguments by dtype t (the kernels
 * are written for both float dtypes), or NDM_E_DTYPE. */
#define NDM__BY_FLOAT(t, KERNEL, ...)                                           \
    ((t) == NDM_F32   ? (KERNEL##_float(__VA_ARGS__), NDM_OK)                   \
     : (t) == NDM_F64 ? (KERNEL##_double(__VA_ARGS__), NDM_OK)                  \
                      : NDM_E_DTYPE)

/* ---- reference ----------------------------------------------------------------- */

#define NDM__REF_CONV(T)                                                        \
    static void ref_conv_##T(const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w, \
                             const ndm__tensor *bias, const ndm__conv_sizes *c) \
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
    ndm__conv_sizes c = ndm__conv_sizes_of(y, x, w, g);
    return NDM__BY_FLOAT(y->dtype, ref_conv, y, x, w, bias, &c);
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
            int64_t h0, h1, w0, w1;                                             \
            pool_span(oh, g->stride[0], g->padding[0], g->kernel[0], H, &h0, &h1); \
            for (int64_t ow = 0; ow < OW; ow++) {                               \
                pool_span(ow, g->stride[1], g->padding[1], g->kernel[1], W, &w0, &w1); \
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

void ndm__cpu_pool_planes(const ndm__tensor *y, const ndm__tensor *x, const ndm__pool2d_geom *g,
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
    ndm__cpu_pool_planes(y, x, g, 0, x->shape[0] * x->shape[1]);
    return NDM_OK;
}

/* ---- reference gradients -------------------------------------------------------
 * Direct loops in double, each result element written once, in the order
 * the definitions read: the oracle for the fast kernels below. */

/* dx[n, ci, ih, iw] sums dy * w over every tap of every output pixel that
 * read (ih, iw): oh * sh - ph + kh * dh = ih, and the same along W. */
#define NDM__REF_CONV_BWD_INPUT(T)                                              \
    static void ref_conv_bwd_input_##T(const ndm__tensor *dx, const ndm__tensor *dy, \
                                       const ndm__tensor *w, const ndm__conv_sizes *c) \
    {                                                                           \
        const T *DY = dy->data, *Wt = w->data;                                  \
        T *DX = dx->data;                                                       \
        const int64_t *ds = dy->strides, *ws = w->strides, *xs = dx->strides;   \
        for (int64_t n = 0; n < c->N; n++)                                      \
            for (int64_t ci = 0; ci < c->C; ci++)                               \
                for (int64_t ih = 0; ih < c->H; ih++)                           \
                    for (int64_t iw = 0; iw < c->W; iw++) {                     \
                        int64_t gi = ci / c->Cg, cl = ci % c->Cg;               \
                        double s = 0.0;                                         \
                        for (int64_t o = gi * c->Og; o < (gi + 1) * c->Og; o++) \
                            for (int64_t kh = 0; kh < c->KH; kh++) {            \
                                int64_t th = ih + c->ph - kh * c->dh;           \
                                if (th < 0 || th % c->sh || th / c->sh >= c->OH) \
                                    continue;                                   \
                                for (int64_t kw = 0; kw < c->KW; kw++) {        \
                                    int64_t tw = iw + c->pw - kw * c->dw;       \
                                    if (tw < 0 || tw % c->sw || tw / c->sw >= c->OW) \
                                        continue;                               \
                                    s += (double)DY[n * ds[0] + o * ds[1] +     \
                                                    th / c->sh * ds[2] + tw / c->sw * ds[3]] * \
                                         (double)Wt[o * ws[0] + cl * ws[1] + kh * ws[2] + \
                                                    kw * ws[3]];                \
                                }                                               \
                            }                                                   \
                        DX[n * xs[0] + ci * xs[1] + ih * xs[2] + iw * xs[3]] = (T)s; \
                    }                                                           \
    }
NDM__REF_CONV_BWD_INPUT(float)
NDM__REF_CONV_BWD_INPUT(double)

/* dw[o, cl, kh, kw] sums dy * x over the batch and the output pixels. */
#define NDM__REF_CONV_BWD_WEIGHT(T)                                             \
    static void ref_conv_bwd_weight_##T(const ndm__tensor *dw, const ndm__tensor *dy, \
                                        const ndm__tensor *x, const ndm__conv_sizes *c) \
    {                                                                           \
        const T *DY = dy->data, *X = x->data;                                   \
        T *DW = dw->data;                                                       \
        const int64_t *ds = dy->strides, *xs = x->strides, *ws = dw->strides;   \
        for (int64_t o = 0; o < c->O; o++)                                      \
            for (int64_t cl = 0; cl < c->Cg; cl++)                              \
                for (int64_t kh = 0; kh < c->KH; kh++)                          \
                    for (int64_t kw = 0; kw < c->KW; kw++) {                    \
                        int64_t ci = o / c->Og * c->Cg + cl;                    \
                        double s = 0.0;                                         \
                        for (int64_t n = 0; n < c->N; n++)                      \
                            for (int64_t oh = 0; oh < c->OH; oh++) {            \
                                int64_t ih = oh * c->sh - c->ph + kh * c->dh;   \
                                if (ih < 0 || ih >= c->H)                       \
                                    continue;                                   \
                                for (int64_t ow = 0; ow < c->OW; ow++) {        \
                                    int64_t iw = ow * c->sw - c->pw + kw * c->dw; \
                                    if (iw < 0 || iw >= c->W)                   \
                                        continue;                               \
                                    s += (double)DY[n * ds[0] + o * ds[1] + oh * ds[2] + \
                                                    ow * ds[3]] *               \
                                         (double)X[n * xs[0] + ci * xs[1] + ih * xs[2] + \
                                                   iw * xs[3]];                 \
                                }                                               \
                            }                                                   \
                        DW[o * ws[0] + cl * ws[1] + kh * ws[2] + kw * ws[3]] = (T)s; \
                    }                                                           \
    }
NDM__REF_CONV_BWD_WEIGHT(float)
NDM__REF_CONV_BWD_WEIGHT(double)

static ndm_status ref_conv2d_backward_input(int device, const ndm__tensor *dx,
                                            const ndm__tensor *dy, const ndm__tensor *w,
                                            const ndm__conv2d_geom *g, void *ws,
                                            size_t ws_bytes)
{
    (void)device, (void)ws, (void)ws_bytes;
    ndm__conv_sizes c = ndm__conv_sizes_of(dy, dx, w, g);
    return NDM__BY_FLOAT(dx->dtype, ref_conv_bwd_input, dx, dy, w, &c);
}

static ndm_status ref_conv2d_backward_weight(int device, const ndm__tensor *dw,
                                             const ndm__tensor *dy, const ndm__tensor *x,
                                             const ndm__conv2d_geom *g, void *ws,
                                             size_t ws_bytes)
{
    (void)device, (void)ws, (void)ws_bytes;
    ndm__conv_sizes c = ndm__conv_sizes_of(dy, x, dw, g);
    return NDM__BY_FLOAT(dw->dtype, ref_conv_bwd_weight, dw, dy, x, &c);
}

/* Pooling's gradient over every window in turn, each window clipped to the
 * input as the forward's is. The max picks with the forward's comparison, starting from
 * the window's first element so that a window of -inf still routes to it. */
#define NDM__REF_POOL_BWD(T)                                                    \
    static void ref_pool_bwd_##T(const ndm__tensor *dx, const ndm__tensor *dy,  \
                                 const ndm__tensor *x, const ndm__pool2d_geom *g) \
    {                                                                           \
        T *DX = dx->data;                                                       \
        const T *DY = dy->data, *X = x ? x->data : NULL;                        \
        const int64_t *xs = dx->strides, *ys = dy->strides, *is = x ? x->strides : NULL; \
        int64_t N = dx->shape[0], C = dx->shape[1], H = dx->shape[2], W = dx->shape[3]; \
        int64_t OH = dy->shape[2], OW = dy->shape[3];                           \
        for (int64_t n = 0; n < N; n++)                                         \
            for (int64_t ch = 0; ch < C; ch++)                                  \
                for (int64_t ih = 0; ih < H; ih++)                              \
                    for (int64_t iw = 0; iw < W; iw++)                          \
                        DX[n * xs[0] + ch * xs[1] + ih * xs[2] + iw * xs[3]] = 0; \
        for (int64_t n = 0; n < N; n++)                                         \
            for (int64_t ch = 0; ch < C; ch++)                                  \
                for (int64_t oh = 0; oh < OH; oh++)                             \
                    for (int64_t ow = 0; ow < OW; ow++) {                       \
                        T gv = DY[n * ys[0] + ch * ys[1] + oh * ys[2] + ow * ys[3]]; \
                        T *plane = DX + n * xs[0] + ch * xs[1];                 \
                        int64_t h0, h1, w0, w1, bh = -1, bw = -1;               \
                        pool_span(oh, g->stride[0], g->padding[0], g->kernel[0], H, &h0, &h1); \
                        pool_span(ow, g->stride[1], g->padding[1], g->kernel[1], W, &w0, &w1); \
                        if (g->max) {                                           \
                            T m = 0;                                            \
                            for (int64_t ih = h0; ih < h1; ih++)                \
                                for (int64_t iw = w0; iw < w1; iw++) {          \
                                    T v = X[n * is[0] + ch * is[1] + ih * is[2] + iw * is[3]]; \
                                    if (bh < 0 || v > m || v != v) {            \
                                        m = v;                                  \
                                        bh = ih;                                \
                                        bw = iw;                                \
                                    }                                           \
                                }                                               \
                            if (bh >= 0)                                        \
                                plane[bh * xs[2] + bw * xs[3]] += gv;           \
                            continue;                                           \
                        }                                                       \
                        int64_t cnt = (h1 > h0 ? h1 - h0 : 0) * (w1 > w0 ? w1 - w0 : 0); \
                        if (!cnt)                                               \
                            continue;                                           \
                        int64_t div = g->count_include_pad ? g->kernel[0] * g->kernel[1] : cnt; \
                        T share = (T)((double)gv / (double)div);                \
                        for (int64_t ih = h0; ih < h1; ih++)                    \
                            for (int64_t iw = w0; iw < w1; iw++)                \
                                plane[ih * xs[2] + iw * xs[3]] += share;        \
                    }                                                           \
    }
NDM__REF_POOL_BWD(float)
NDM__REF_POOL_BWD(double)

static ndm_status ref_pool2d_backward(int device, const ndm__tensor *dx, const ndm__tensor *dy,
                                      const ndm__tensor *x, const ndm__pool2d_geom *g)
{
    (void)device;
    return NDM__BY_FLOAT(dx->dtype, ref_pool_bwd, dx, dy, x, g);
}

const struct ndm__backend_nn ndm__cpu_ref_nn = {
    .conv2d_workspace = ref_conv2d_workspace,
    .conv2d = ref_conv2d,
    .pool2d = ref_pool2d,
    .conv2d_backward_input = ref_conv2d_backward_input,
    .conv2d_backward_weight = ref_conv2d_backward_weight,
    .pool2d_backward = ref_pool2d_backward,
    .rms_norm = ndm__cpu_ref_rms_norm,
};
