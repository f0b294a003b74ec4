/* The CUDA neural-network family: 2-d convolution and its gradients as
 * im2col / col2im kernels around cuBLAS products, and pooling forward and
 * backward, each result element gathered by one thread (no atomics). */
#include "../nn.h"
#include "iter.cuh"
#include "linalg.cuh"

/* ---- geometry ------------------------------------------------------------------ */

/* Axes [from, to] of t as one axis: its stride in *st (1 for an axis of one
 * element), or false when the strides do not fold. */
static bool fold_axes(const ndm__tensor *t, int from, int to, int64_t *st)
{
    int64_t stride = 0, span = 1;
    bool have = false;
    for (int i = to; i >= from; i--) {
        if (t->shape[i] == 1)
            continue;
        if (!have) {
            stride = t->strides[i];
            have = true;
        } else if (t->strides[i] != stride * span) {
            return false;
        }
        span *= t->shape[i];
    }
    *st = have ? stride : 1;
    return true;
}

/* The weight as the O x K matrix gemm reads, or false (a dense copy then). */
static bool w_matrix(const ndm__tensor *w, const ndm__conv_sizes *c, bool *trans, int64_t *ld)
{
    int64_t ks;
    return fold_axes(w, 1, 3, &ks) &&
           ndm__cuda_gemm_layout(c->O, c->K, w->strides[0], ks, trans, ld);
}

/* dy's planes as O x P matrices gemm reads, or false. */
static bool dy_matrix(const ndm__tensor *dy, const ndm__conv_sizes *c, bool *trans, int64_t *ld)
{
    int64_t ps;
    return fold_axes(dy, 2, 3, &ps) &&
           ndm__cuda_gemm_layout(c->O, c->P, dy->strides[1], ps, trans, ld);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* A workspace cut into the column matrix of S samples (CK x S x P) and, when
 * the operands need them, dense copies of dy (S samples) and of w. */
typedef enum conv_kind { CONV_FORWARD, CONV_INPUT, CONV_WEIGHT } conv_kind;

typedef struct conv_plan {
    ndm__conv_sizes c;
    int64_t S;
    bool copy_w, copy_dy;
    bool w_trans, dy_trans;
    int64_t w_ld, dy_ld;
    size_t es, col_off, dy_off, w_off, bytes;
} conv_plan;

/* The column matrix of this many bytes at most, unless one sample needs
 * more. Past a few thousand columns per product, larger chunks only save
 * launches, while the workspace adds to the device's peak memory. */
#ifdef NDM__CUDA_HOST_EXEC
/* Host execution: a few kilobytes, so that the tests' small convolutions
 * run in chunks of one and two samples, a partial last one included. */
#define NDM__CONV_COL_CAP ((size_t)6000)
#else
#define NDM__CONV_COL_CAP ((size_t)32 << 20)
#endif

static conv_plan conv_plan_of(conv_kind kind, const ndm__tensor *y, const ndm__tensor *x,
                              const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    conv_plan p;
    memset(&p, 0, sizeof p);
    p.c = ndm__conv_sizes_of(y, x, w, g);
    const ndm__conv_sizes *c = &p.c;
    p.es = ndm__cuda_host->dtype_size(y->dtype);
    size_t per = (size_t)c->CK * (size_t)c->P * p.es;
    int64_t S = per ? (int64_t)(NDM__CONV_COL_CAP / per) : c->N;
    p.S = S < 1 ? 1 : S > c->N ? (c->N > 0 ? c->N : 1) : S;
    if (kind != CONV_WEIGHT)
        p.copy_w = !w_matrix(w, c, &p.w_trans, &p.w_ld);
    if (p.copy_w)
        p.w_trans = false, p.w_ld = c->K;
    if (kind == CONV_INPUT)
        p.copy_dy = !dy_matrix(y, c, &p.dy_trans, &p.dy_ld);
    /* the weight's gradient reads dy as O x (S x P): always a copy */
    if (kind == CONV_WEIGHT)
        p.copy_dy = true;
    if (p.copy_dy)
        p.dy_trans = false, p.dy_ld = kind == CONV_WEIGHT ? p.S * c->P : c->P;
    p.col_off = 0;
    p.bytes = align64((size_t)c->CK * (size_t)p.S * (size_t)c->P * p.es);
    p.dy_off = p.bytes;
    if (p.copy_dy)
        p.bytes += align64((size_t)c->O * (size_t)p.S * (size_t)c->P * p.es);
    p.w_off = p.bytes;
    if (p.copy_w)
        p.bytes += align64((size_t)c->O * (size_t)c->K * p.es);
    /* nothing to compute: no workspace */
    if (c->N == 0 || c->P == 0 || c->CK == 0 || c->O == 0)
        p.bytes = 0;
    return p;
}

/* ---- kernels --------------------------------------------------------------------- */

/* col[(ci, kh, kw), n, p] = x[n0 + n, ci, ih, iw] under output pixel p,
 * 0 in the padding; x read through its strides. */
template <class T>
__global__ void ndm__k_im2col(ndm__conv_sizes c, int64_t S, const T *x, int64_t xs0, int64_t xs1,
                              int64_t xs2, int64_t xs3, T *col, int64_t total)
{
    NDM__CU_LOOP(int64_t, i, total)
    {
        int64_t p = i % c.P, n = (i / c.P) % S, r = i / (c.P * S);
        int64_t kw = r % c.KW, kh = (r / c.KW) % c.KH, ci = r / (c.KW * c.KH);
        int64_t oh = p / c.OW, ow = p % c.OW;
        int64_t ih = oh * c.sh - c.ph + kh * c.dh, iw = ow * c.sw - c.pw + kw * c.dw;
        T v = 0;
        if (ih >= 0 && ih < c.H && iw >= 0 && iw < c.W)
            v = x[n * xs0 + ci * xs1 + ih * xs2 + iw * xs3];
        col[i] = v;
    }
}

/* dx[n, ci, ih, iw] (S samples, C-contiguous) = the sum of the column
 * entries of every tap that read (ih, iw): the transposed im2col, gathered
 * so that each element is written once. */
template <class T>
__global__ void ndm__k_col2im(ndm__conv_sizes c, int64_t S, const T *col, T *dx, int64_t total)
{
    NDM__CU_LOOP(int64_t, i, total)
    {
        int64_t iw = i % c.W, ih = (i / c.W) % c.H, ci = (i / (c.W * c.H)) % c.C,
                n = i / (c.W * c.H * c.C);
        T s = 0;
        for (int64_t kh = 0; kh < c.KH; kh++) {
            int64_t th = ih + c.ph - kh * c.dh;
            if (th < 0 || th % c.sh || th / c.sh >= c.OH)
                continue;
            for (int64_t kw = 0; kw < c.KW; kw++) {
                int64_t tw = iw + c.pw - kw * c.dw;
                if (tw < 0 || tw % c.sw || tw / c.sw >= c.OW)
                    continue;
                int64_t r = (ci * c.KH + kh) * c.KW + kw;
                s += col[(r * S + n) * c.P + th / c.sh * c.OW + tw / c.sw];
            }
        }
        dx[i] = s;
    }
}

/* y[n, o, p] = bias[o]: the product then adds onto it. */
template <class T>
__global__ void ndm__k_bias_rows(T *y, const T *bias, int64_t bs, int64_t O, int64_t P,
                                 int64_t total)
{
    NDM__CU_LOOP(int64_t, i, total)
    y[i] = bias[(i / P) % O * bs];
}

/* ---- convolution -------------------------------------------------------------------- */

/* A dense copy through the core's copy (same stream, any strides). */
static ndm_status dense_copy(int device, void *dst, ndm_dtype dt, int nd, const int64_t *shape,
                             const int64_t *dst_strides, const void *src,
                             const int64_t *src_strides)
{
    ndm__tensor d = {dst, dt, nd, shape, dst_strides};
    ndm__tensor s = {(void *)src, dt, nd, shape, src_strides};
    return ndm__cuda_backend.copy(device, &d, &s);
}

/* The weight (the caller's, or its dense copy in the workspace). */
static const char *weight_of(int device, const conv_plan *p, const ndm__tensor *w, char *ws,
                             ndm_status *st)
{
    *st = NDM_OK;
    if (!p->copy_w)
        return (const char *)w->data;
    const ndm__conv_sizes *c = &p->c;
    int64_t str[4] = {c->K, c->KH * c->KW, c->KW, 1};
    *st = dense_copy(device, ws + p->w_off, w->dtype, 4, w->shape, str, w->data, w->strides);
    return ws + p->w_off;
}

template <class T>
static ndm_status im2col(int device, cudaStream_t s, const conv_plan *p, const ndm__tensor *x,
                         int64_t n0, int64_t S, T *col)
{
    const ndm__conv_sizes &c = p->c;
    int64_t total = c.CK * S * c.P;
    const T *xp = (const T *)x->data + n0 * x->strides[0];
    NDM__LAUNCH(ndm__cuda_blocks(total), NDM__CUDA_THREADS, 0, s, ndm__k_im2col<T>)(
        c, S, xp, x->strides[0], x->strides[1], x->strides[2], x->strides[3], col, total);
    NDM__CUDA_LAUNCHED(device, "the im2col kernel");
    return NDM_OK;
}

/* The row offset (in elements) of row o0 of a matrix stored as the plan
 * says: its real row stride. */
static int64_t row_offset(bool trans, int64_t ld, int64_t o0)
{
    return trans ? o0 : o0 * ld;
}

template <class T>
static ndm_status conv_forward(int device, cudaStream_t s, cublasHandle_t h, const conv_plan *p,
                               const ndm__tensor *y, const ndm__tensor *x, const ndm__tensor *w,
                               const ndm__tensor *bias, char *ws)
{
    const ndm__conv_sizes &c = p->c;
    T *Y = (T *)y->data;
    int64_t ytotal = c.N * c.O * c.P;
    if (bias) {
        NDM__LAUNCH(ndm__cuda_blocks(ytotal), NDM__CUDA_THREADS, 0, s, ndm__k_bias_rows<T>)(
            Y, (const T *)bias->data, bias->strides[0], c.O, c.P, ytotal);
        NDM__CUDA_LAUNCHED(device, "the bias kernel");
    }
    if (c.K == 0) {
        if (bias)
            return NDM_OK;
        ndm__tensor yt = *y;
        return ndm__cuda_backend.fill(device, &yt, 0.0);
    }
    ndm_status st;
    const T *Wm = (const T *)weight_of(device, p, w, ws, &st);
    if (st < 0)
        return st;
    T *col = (T *)(ws + p->col_off);
    for (int64_t n0 = 0; n0 < c.N; n0 += p->S) {
        int64_t S = c.N - n0 < p->S ? c.N - n0 : p->S;
        st = im2col<T>(device, s, p, x, n0, S, col);
        for (int64_t gi = 0; gi < c.groups && st >= 0; gi++)
            /* y[n, group's rows] (Og x P) = W_g (Og x K) @ col_g (K x P), per sample */
            st = ndm__cuda_gemm_rm(device, h, y->dtype, p->w_trans, false, c.Og, c.P, c.K,
                                   Wm + row_offset(p->w_trans, p->w_ld, gi * c.Og), p->w_ld, 0,
                                   col + gi * c.K * S * c.P, S * c.P, c.P, bias ? 1.0 : 0.0,
                                   Y + (n0 * c.O + gi * c.Og) * c.P, c.P, c.O * c.P, S);
        if (st < 0)
            return st;
    }
    return NDM_OK;
}

template <class T>
static ndm_status conv_input(int device, cudaStream_t s, cublasHandle_t h, const conv_plan *p,
                             const ndm__tensor *dx, const ndm__tensor *dy, const ndm__tensor *w,
                             char *ws)
{
    const ndm__conv_sizes &c = p->c;
    ndm_status st;
    const T *Wm = (const T *)weight_of(device, p, w, ws, &st);
    if (st < 0)
        return st;
    T *col = (T *)(ws + p->col_off), *DX = (T *)dx->data;
    for (int64_t n0 = 0; n0 < c.N; n0 += p->S) {
        int64_t S = c.N - n0 < p->S ? c.N - n0 : p->S;
        const T *D;
        int64_t dsn, drow; /* sample stride, stride of dy's rows (o) */
        if (p->copy_dy) {
            int64_t shape[4] = {S, c.O, c.OH, c.OW}, str[4] = {c.O * c.P, c.P, c.OW, 1};
            st = dense_copy(device, ws + p->dy_off, dy->dtype, 4, shape, str,
                            (const T *)dy->data + n0 * dy->strides[0], dy->strides);
            if (st < 0)
                return st;
            D = (const T *)(ws + p->dy_off), dsn = c.O * c.P, drow = c.P;
        } else {
            D = (const T *)dy->data + n0 * dy->strides[0], dsn = dy->strides[0],
            drow = dy->strides[1];
        }
        for (int64_t gi = 0; gi < c.groups; gi++) {
            /* dcol_g (K x P) = W_g^T (K x Og) @ dy_g (Og x P), per sample */
            st = ndm__cuda_gemm_rm(device, h, dx->dtype, !p->w_trans, p->dy_trans, c.K, c.P,
                                   c.Og, Wm + row_offset(p->w_trans, p->w_ld, gi * c.Og),
                                   p->w_ld, 0, D + gi * c.Og * drow, p->dy_ld, dsn, 0.0,
                                   col + gi * c.K * S * c.P, S * c.P, c.P, S);
            if (st < 0)
                return st;
        }
        int64_t total = S * c.C * c.H * c.W;
        NDM__LAUNCH(ndm__cuda_blocks(total), NDM__CUDA_THREADS, 0, s, ndm__k_col2im<T>)(
            c, S, col, DX + n0 * c.C * c.H * c.W, total);
        NDM__CUDA_LAUNCHED(device, "the col2im kernel");
    }
    return NDM_OK;
}

template <class T>
static ndm_status conv_weight(int device, cudaStream_t s, cublasHandle_t h, const conv_plan *p,
                              const ndm__tensor *dw, const ndm__tensor *dy, const ndm__tensor *x,
                              char *ws)
{
    const ndm__conv_sizes &c = p->c;
    T *col = (T *)(ws + p->col_off), *DW = (T *)dw->data, *D = (T *)(ws + p->dy_off);
    for (int64_t n0 = 0; n0 < c.N; n0 += p->S) {
        int64_t S = c.N - n0 < p->S ? c.N - n0 : p->S;
        ndm_status st = im2col<T>(device, s, p, x, n0, S, col);
        if (st < 0)
            return st;
        /* dy's chunk as O x (S x P), the layout of col's columns */
        int64_t shape[4] = {S, c.O, c.OH, c.OW}, str[4] = {c.P, S * c.P, c.OW, 1};
        st = dense_copy(device, D, dy->dtype, 4, shape, str,
                        (const T *)dy->data + n0 * dy->strides[0], dy->strides);
        if (st < 0)
            return st;
        for (int64_t gi = 0; gi < c.groups; gi++) {
            /* dw_g (Og x K) (+)= dy_g (Og x SP) @ col_g^T (SP x K) */
            st = ndm__cuda_gemm_rm(device, h, dw->dtype, false, true, c.Og, c.K, S * c.P,
                                   D + gi * c.Og * S * c.P, S * c.P, 0,
                                   col + gi * c.K * S * c.P, S * c.P, 0, n0 ? 1.0 : 0.0,
                                   DW + gi * c.Og * c.K, c.K, 0, 1);
            if (st < 0)
                return st;
        }
    }
    return NDM_OK;
}

static size_t cuda_conv2d_workspace(int device, const ndm__tensor *y, const ndm__tensor *x,
                                    const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    (void)device;
    return conv_plan_of(CONV_FORWARD, y, x, w, g).bytes;
}

static size_t cuda_conv2d_input_workspace(int device, const ndm__tensor *dx,
                                          const ndm__tensor *dy, const ndm__tensor *w,
                                          const ndm__conv2d_geom *g)
{
    (void)device;
    return conv_plan_of(CONV_INPUT, dy, dx, w, g).bytes;
}

static size_t cuda_conv2d_weight_workspace(int device, const ndm__tensor *dw,
                                           const ndm__tensor *dy, const ndm__tensor *x,
                                           const ndm__conv2d_geom *g)
{
    (void)device;
    return conv_plan_of(CONV_WEIGHT, dy, x, dw, g).bytes;
}

/* Enter the device, check the dtype and the workspace, get the handle. */
static ndm_status conv_enter(int device, const char *what, ndm_dtype dt, const conv_plan *p,
                             const void *ws, size_t ws_bytes, cudaStream_t *s, cublasHandle_t *h)
{
    ndm_status st = ndm__cuda_enter(device, s);
    if (st < 0)
        return st;
    if (dt != NDM_F32 && dt != NDM_F64)
        return ndm__cuda_fail(NDM_E_DTYPE, "cuda:%d: %s in %d: f32 or f64 only", device, what,
                              (int)dt);
    if (p->bytes && (!ws || ws_bytes < p->bytes))
        return ndm__cuda_fail(NDM_E_INVALID,
                              "cuda:%d: %s needs %zu bytes of workspace, was given %zu", device,
                              what, p->bytes, ws ? ws_bytes : (size_t)0);
    return ndm__cuda_blas(device, *s, h);
}

static ndm_status cuda_conv2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                              const ndm__tensor *w, const ndm__tensor *bias,
                              const ndm__conv2d_geom *g, void *ws)
{
    conv_plan p = conv_plan_of(CONV_FORWARD, y, x, w, g);
    cudaStream_t s = nullptr;
    if (p.c.N == 0 || p.c.O == 0 || p.c.P == 0)
        return ndm__cuda_enter(device, &s); /* y is empty */
    cublasHandle_t h;
    ndm_status st = conv_enter(device, "conv2d", y->dtype, &p, ws, p.bytes, &s, &h);
    if (st < 0)
        return st;
    if (y->dtype == NDM_F32)
        return conv_forward<float>(device, s, h, &p, y, x, w, bias, (char *)ws);
    return conv_forward<double>(device, s, h, &p, y, x, w, bias, (char *)ws);
}

/* The two gradients into `out` (dx from dy and the weights `in`, or dw
 * from dy and the input `in`): zeros when nothing reaches `out` (no output
 * pixel, channel or tap), else the kernel of `kind`. */
static ndm_status conv_backward(conv_kind kind, const char *what, int device,
                                const ndm__tensor *out, const ndm__tensor *dy,
                                const ndm__tensor *in, const ndm__conv2d_geom *g, void *ws,
                                size_t ws_bytes)
{
    bool wg = kind == CONV_WEIGHT;
    conv_plan p = conv_plan_of(kind, dy, wg ? in : out, wg ? out : in, g);
    if (p.bytes == 0) {
        ndm__tensor t = *out;
        return ndm__cuda_backend.fill(device, &t, 0.0);
    }
    cudaStream_t s = nullptr;
    cublasHandle_t h;
    ndm_status st = conv_enter(device, what, out->dtype, &p, ws, ws_bytes, &s, &h);
    if (st < 0)
        return st;
    bool f32 = out->dtype == NDM_F32;
    if (wg)
        return f32 ? conv_weight<float>(device, s, h, &p, out, dy, in, (char *)ws)
                   : conv_weight<double>(device, s, h, &p, out, dy, in, (char *)ws);
    return f32 ? conv_input<float>(device, s, h, &p, out, dy, in, (char *)ws)
               : conv_input<double>(device, s, h, &p, out, dy, in, (char *)ws);
}

static ndm_status cuda_conv2d_backward_input(int device, const ndm__tensor *dx,
                                             const ndm__tensor *dy, const ndm__tensor *w,
                                             const ndm__conv2d_geom *g, void *ws,
                                             size_t ws_bytes)
{
    return conv_backward(CONV_INPUT, "conv2d_backward_input", device, dx, dy, w, g, ws,
                         ws_bytes);
}

static ndm_status cuda_conv2d_backward_weight(int device, const ndm__tensor *dw,
                                              const ndm__tensor *dy, const ndm__tensor *x,
                                              const ndm__conv2d_geom *g, void *ws,
                                              size_t ws_bytes)
{
    return conv_backward(CONV_WEIGHT, "conv2d_backward_weight", device, dw, dy, x, g, ws,
                         ws_bytes);
}

/* ---- pooling ------------------------------------------------------------------------ */

typedef struct ndm__cu_pool {
    int64_t N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
    bool max, include_pad;
} ndm__cu_pool;

static ndm__cu_pool pool_of(const ndm__tensor *y, const ndm__tensor *x,
                            const ndm__pool2d_geom *g)
{
    ndm__cu_pool q;
    q.N = x->shape[0], q.C = x->shape[1], q.H = x->shape[2], q.W = x->shape[3];
    q.OH = y->shape[2], q.OW = y->shape[3];
    q.kh = g->kernel[0], q.kw = g->kernel[1];
    q.sh = g->stride[0], q.sw = g->stride[1];
    q.ph = g->padding[0], q.pw = g->padding[1];
    q.max = g->max;
    q.include_pad = g->count_include_pad;
    return q;
}

typedef struct ndm__cu_str4 {
    int64_t s[4];
} ndm__cu_str4;

static ndm__cu_str4 str4(const ndm__tensor *t)
{
    ndm__cu_str4 r = {{t->strides[0], t->strides[1], t->strides[2], t->strides[3]}};
    return r;
}

/* The input span [*lo, *hi) under output position o, clipped (the CPU's). */
static NDM__HD void pool_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size,
                              int64_t *lo, int64_t *hi)
{
    int64_t s = o * stride - pad;
    *hi = s + k < size ? s + k : size;
    *lo = s > 0 ? s : 0;
}

/* One thread per output element, in the CPU reference's window order and
 * arithmetic (the max's comparison; the average summed in double): the
 * results are the CPU's bit for bit. */
template <class T>
__global__ void ndm__k_pool_fwd(ndm__cu_pool q, const T *x, ndm__cu_str4 xs, T *y,
                                ndm__cu_str4 ys, int64_t total)
{
    NDM__CU_LOOP(int64_t, i, total)
    {
        int64_t ow = i % q.OW, oh = (i / q.OW) % q.OH, ch = (i / (q.OW * q.OH)) % q.C,
                n = i / (q.OW * q.OH * q.C);
        int64_t h0, h1, w0, w1;
        pool_span(oh, q.sh, q.ph, q.kh, q.H, &h0, &h1);
        pool_span(ow, q.sw, q.pw, q.kw, q.W, &w0, &w1);
        const T *xp = x + n * xs.s[0] + ch * xs.s[1];
        double r;
        if (q.max) {
            T m = -(T)INFINITY;
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++) {
                    T v = xp[ih * xs.s[2] + iw * xs.s[3]];
                    m = (v > m || v != v) ? v : m;
                }
            r = m;
        } else {
            double s = 0;
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++)
                    s += xp[ih * xs.s[2] + iw * xs.s[3]];
            int64_t cnt = q.include_pad ? q.kh * q.kw : (h1 - h0) * (w1 - w0);
            r = s / (double)cnt;
        }
        y[n * ys.s[0] + ch * ys.s[1] + oh * ys.s[2] + ow * ys.s[3]] = (T)r;
    }
}

/* The first output position whose window (k wide, stride s, padding p)
 * covers input position i. */
static NDM__HD int64_t first_window(int64_t i, int64_t k, int64_t s, int64_t p)
{
    int64_t v = i + p - k + 1;
    return v <= 0 ? 0 : (v + s - 1) / s;
}

/* One thread per element of dx: the windows that cover it, in the order
 * the CPU reference visits them (row-major), each adding its share in T as
 * the reference's scatter does; so dx is the CPU's bit for bit. A max
 * window picks its element by the reference's rule (the first largest, a
 * NaN over any number, the last NaN). */
template <class T>
__global__ void ndm__k_pool_bwd(ndm__cu_pool q, T *dx, ndm__cu_str4 dxs, const T *dy,
                                ndm__cu_str4 dys, const T *x, ndm__cu_str4 xs, int64_t total)
{
    NDM__CU_LOOP(int64_t, i, total)
    {
        int64_t iw = i % q.W, ih = (i / q.W) % q.H, ch = (i / (q.W * q.H)) % q.C,
                n = i / (q.W * q.H * q.C);
        const T *gp = dy + n * dys.s[0] + ch * dys.s[1];
        const T *xp = q.max ? x + n * xs.s[0] + ch * xs.s[1] : nullptr;
        int64_t oh0 = first_window(ih, q.kh, q.sh, q.ph), oh1 = (ih + q.ph) / q.sh;
        int64_t ow0 = first_window(iw, q.kw, q.sw, q.pw), ow1 = (iw + q.pw) / q.sw;
        if (oh1 > q.OH - 1)
            oh1 = q.OH - 1;
        if (ow1 > q.OW - 1)
            ow1 = q.OW - 1;
        T acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++) {
            int64_t h0, h1;
            pool_span(oh, q.sh, q.ph, q.kh, q.H, &h0, &h1);
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t w0, w1;
                pool_span(ow, q.sw, q.pw, q.kw, q.W, &w0, &w1);
                T gv = gp[oh * dys.s[2] + ow * dys.s[3]];
                if (q.max) {
                    int64_t bh = -1, bw = -1;
                    T m = 0;
                    for (int64_t a = h0; a < h1; a++)
                        for (int64_t b = w0; b < w1; b++) {
                            T v = xp[a * xs.s[2] + b * xs.s[3]];
                            if (bh < 0 || v > m || v != v)
                                m = v, bh = a, bw = b;
                        }
                    if (bh == ih && bw == iw)
                        acc += gv;
                } else {
                    int64_t div = q.include_pad ? q.kh * q.kw : (h1 - h0) * (w1 - w0);
                    acc += (T)((double)gv / (double)div);
                }
            }
        }
        dx[n * dxs.s[0] + ch * dxs.s[1] + ih * dxs.s[2] + iw * dxs.s[3]] = acc;
    }
}

static ndm_status cuda_pool2d(int device, const ndm__tensor *y, const ndm__tensor *x,
                              const ndm__pool2d_geom *g)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    ndm__cu_pool q = pool_of(y, x, g);
    int64_t total = q.N * q.C * q.OH * q.OW;
    if (total == 0)
        return NDM_OK;
    unsigned blocks = ndm__cuda_blocks(total);
    if (x->dtype == NDM_F32) {
        NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_pool_fwd<float>)(
            q, (const float *)x->data, str4(x), (float *)y->data, str4(y), total);
    } else if (x->dtype == NDM_F64) {
        NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_pool_fwd<double>)(
            q, (const double *)x->data, str4(x), (double *)y->data, str4(y), total);
    } else {
        return ndm__cuda_fail(NDM_E_DTYPE, "cuda:%d: pool2d in %d: f32 or f64 only", device,
                              (int)x->dtype);
    }
    NDM__CUDA_LAUNCHED(device, "the pooling kernel");
    return NDM_OK;
}

static ndm_status cuda_pool2d_backward(int device, const ndm__tensor *dx, const ndm__tensor *dy,
                                       const ndm__tensor *x, const ndm__pool2d_geom *g)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    ndm__cu_pool q = pool_of(dy, dx, g);
    int64_t total = q.N * q.C * q.H * q.W;
    if (total == 0)
        return NDM_OK;
    if (q.OH == 0 || q.OW == 0) {
        ndm__tensor t = *dx;
        return ndm__cuda_backend.fill(device, &t, 0.0);
    }
    ndm__cu_str4 xs = x ? str4(x) : ndm__cu_str4{{0, 0, 0, 0}};
    unsigned blocks = ndm__cuda_blocks(total);
    if (dx->dtype == NDM_F32) {
        NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_pool_bwd<float>)(
            q, (float *)dx->data, str4(dx), (const float *)dy->data, str4(dy),
            x ? (const float *)x->data : nullptr, xs, total);
    } else if (dx->dtype == NDM_F64) {
        NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_pool_bwd<double>)(
            q, (double *)dx->data, str4(dx), (const double *)dy->data, str4(dy),
            x ? (const double *)x->data : nullptr, xs, total);
    } else {
        return ndm__cuda_fail(NDM_E_DTYPE, "cuda:%d: pool2d_backward in %d: f32 or f64 only",
                              device, (int)dx->dtype);
    }
    NDM__CUDA_LAUNCHED(device, "the pooling gradient kernel");
    return NDM_OK;
}

extern "C" const struct ndm__backend_nn ndm__cuda_nn = {
    .conv2d_workspace = cuda_conv2d_workspace,
    .conv2d = cuda_conv2d,
    .pool2d = cuda_pool2d,
    .conv2d_backward_input_workspace = cuda_conv2d_input_workspace,
    .conv2d_backward_input = cuda_conv2d_backward_input,
    .conv2d_backward_weight_workspace = cuda_conv2d_weight_workspace,
    .conv2d_backward_weight = cuda_conv2d_backward_weight,
    .pool2d_backward = cuda_pool2d_backward,
    .rms_norm = NULL, /* RMSNorm runs composed here: a reduction, an add, rsqrt, products */
};
