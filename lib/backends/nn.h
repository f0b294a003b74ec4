/* The neural-network family of the backend table: 2-d convolution and
 * pooling on NCHW arrays, and their gradients (dispatchers in
 * lib/ops/conv.c check the geometry); the fused RMS normalisation of rows
 * (lib/ops/norm.c). */
#ifndef NDM_BACKEND_NN_H
#define NDM_BACKEND_NN_H

#include "backend.h"

/* Geometry with every default resolved: index 0 is H, 1 is W. */
typedef struct ndm__conv2d_geom {
    int64_t stride[2], padding[2], dilation[2];
    int64_t groups;
} ndm__conv2d_geom;

typedef struct ndm__pool2d_geom {
    int64_t kernel[2], stride[2], padding[2];
    bool max;               /* max pooling; else average */
    bool count_include_pad; /* average: divide by the full window */
} ndm__pool2d_geom;

/* One call's sizes, read from the tensors, for every backend's kernels
 * (passed by value to device code): y (N, O, OH, OW), x (N, C, H, W), w
 * (O, C/groups, KH, KW); for the gradients dy plays y and dx plays x (or
 * dw plays w). Cg and Og are a group's channels, K a group's
 * Cg x KH x KW, CK all channels' C x KH x KW, P the output pixels. */
typedef struct ndm__conv_sizes {
    int64_t N, C, H, W, O, KH, KW, OH, OW, Cg, Og, K, CK, P, groups;
    int64_t sh, sw, ph, pw, dh, dw;
} ndm__conv_sizes;

static inline ndm__conv_sizes ndm__conv_sizes_of(const ndm__tensor *y, const ndm__tensor *x,
                                                 const ndm__tensor *w, const ndm__conv2d_geom *g)
{
    ndm__conv_sizes c;
    c.N = x->shape[0], c.C = x->shape[1], c.H = x->shape[2], c.W = x->shape[3];
    c.O = w->shape[0], c.KH = w->shape[2], c.KW = w->shape[3];
    c.OH = y->shape[2], c.OW = y->shape[3];
    c.groups = g->groups;
    c.Cg = c.C / c.groups, c.Og = c.O / c.groups;
    c.K = c.Cg * c.KH * c.KW;
    c.CK = c.C * c.KH * c.KW;
    c.P = c.OH * c.OW;
    c.sh = g->stride[0], c.sw = g->stride[1];
    c.ph = g->padding[0], c.pw = g->padding[1];
    c.dh = g->dilation[0], c.dw = g->dilation[1];
    return c;
}

struct ndm__backend_nn {
    /* required: bytes of scratch that conv2d needs for these operands (the
     * dispatcher allocates it and passes it in). */
    size_t (*conv2d_workspace)(int device, const ndm__tensor *y, const ndm__tensor *x,
                               const ndm__tensor *w, const ndm__conv2d_geom *g);
    /* required: y (N, O, OH, OW) = x (N, C, H, W) cross-correlated with
     * w (O, C/groups, KH, KW), plus bias (O) when not NULL. One dtype, f32
     * or f64; x, w and bias may have any strides, y is C-contiguous and
     * does not overlap the inputs. `ws` holds conv2d_workspace bytes,
     * aligned to 64 (NULL when that is 0). */
    ndm_status (*conv2d)(int device, const ndm__tensor *y, const ndm__tensor *x,
                         const ndm__tensor *w, const ndm__tensor *bias,
                         const ndm__conv2d_geom *g, void *ws);
    /* required: y (N, C, OH, OW) = max or mean of each window of x
     * (N, C, H, W); f32 or f64; padding never wins a max. */
    ndm_status (*pool2d)(int device, const ndm__tensor *y, const ndm__tensor *x,
                         const ndm__pool2d_geom *g);

    /* Gradients. In each, the result (dx or dw) is C-contiguous, does not
     * overlap the inputs and is overwritten (never accumulated into); the
     * inputs may have any strides, 0 included (a broadcast gradient). One
     * dtype, f32 or f64. The geometry is the forward's, already checked:
     * dy has the forward's output shape. */

    /* optional: bytes of scratch for conv2d_backward_input. Default: none. */
    size_t (*conv2d_backward_input_workspace)(int device, const ndm__tensor *dx,
                                              const ndm__tensor *dy, const ndm__tensor *w,
                                              const ndm__conv2d_geom *g);
    /* optional: dx (N, C, H, W) = the gradient of conv2d with respect to its
     * input, given dy (N, O, OH, OW) and w (O, C/groups, KH, KW): the
     * transposed convolution. `ws` holds the ws_bytes the workspace member
     * asked for, aligned to 64 (a kernel must fit in what it is given).
     * Default: the dispatcher fails with NDM_E_UNSUPPORTED. */
    ndm_status (*conv2d_backward_input)(int device, const ndm__tensor *dx, const ndm__tensor *dy,
                                        const ndm__tensor *w, const ndm__conv2d_geom *g,
                                        void *ws, size_t ws_bytes);
    /* optional: bytes of scratch for conv2d_backward_weight. Default: none. */
    size_t (*conv2d_backward_weight_workspace)(int device, const ndm__tensor *dw,
                                               const ndm__tensor *dy, const ndm__tensor *x,
                                               const ndm__conv2d_geom *g);
    /* optional: dw (O, C/groups, KH, KW) = the gradient of conv2d with
     * respect to its weight, given dy (N, O, OH, OW) and x (N, C, H, W),
     * summed over the batch. Default: NDM_E_UNSUPPORTED, as above. */
    ndm_status (*conv2d_backward_weight)(int device, const ndm__tensor *dw, const ndm__tensor *dy,
                                         const ndm__tensor *x, const ndm__conv2d_geom *g,
                                         void *ws, size_t ws_bytes);
    /* optional: dx (N, C, H, W) = the gradient of pool2d with respect to its
     * input, given dy (N, C, OH, OW). Max pooling routes each element of dy
     * to the element of x (the forward's input) that the forward picked, by
     * its rule: the first largest in row-major window order, a NaN over any
     * number, the last NaN over an earlier one. Average pooling spreads it
     * over the window with the forward's divisor; x is NULL then.
     * Overlapping windows add up. Default: NDM_E_UNSUPPORTED, as above. */
    ndm_status (*pool2d_backward)(int device, const ndm__tensor *dx, const ndm__tensor *dy,
                                  const ndm__tensor *x, const ndm__pool2d_geom *g);
    /* optional: RMS normalisation of each row of x, a C-contiguous (rows,
     * n) f32 or f64 array (n >= 1): rstd[r] = 1 / sqrt(sum_j x[r, j]^2 / n
     * + eps), the sum (in an order of the backend's choosing) and the root
     * in double, then rounded to the dtype;
     * y[r, j] = x[r, j] * rstd[r] rounded, times w[j] rounded (w NULL:
     * none). y (x's shape) and rstd (rows) are C-contiguous, of x's dtype,
     * as w (n) is. Default: the dispatcher composes the operations. */
    ndm_status (*rms_norm)(int device, const ndm__tensor *y, const ndm__tensor *rstd,
                           const ndm__tensor *x, const ndm__tensor *w, double eps);
};

extern const struct ndm__backend_nn ndm__cpu_nn;
extern const struct ndm__backend_nn ndm__cpu_ref_nn;
/* The CPU's rms_norm (cpu/norm.c): one row at a time (the reference) or
 * rows spread over the pool (the fast table), with the same arithmetic. */
ndm_status ndm__cpu_ref_rms_norm(int device, const ndm__tensor *y, const ndm__tensor *rstd,
                                 const ndm__tensor *x, const ndm__tensor *w, double eps);
ndm_status ndm__cpu_rms_norm(int device, const ndm__tensor *y, const ndm__tensor *rstd,
                             const ndm__tensor *x, const ndm__tensor *w, double eps);

/* Test hook (process wide): the fast CPU gradients use the vector kernels
 * for `isa` (1 portable C, 2 AVX2, 3 AVX-512; 0 the default level), as
 * every CPU family does (ndm__cpu_isa_force in cpu/isa.h). False,
 * changing nothing, when this CPU cannot run them. */
bool ndm__cpu_conv_grad_isa(int isa);

#endif
