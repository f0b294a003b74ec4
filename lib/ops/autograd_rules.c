/* Backward rules: the gradient of each recorded operation's inputs from the
 * gradient of its result, written with ndm's own operations (they run inside
 * backward's scope, so every temporary is released with it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../backends/ew.h"
#include "autograd.h"
#include "dispatch.h"
#include "fused.h"
#include "ndm/autograd.h"
#include "ndm/conv.h"
#include "ndm/elementwise.h"
#include "ndm/index.h"
#include "ndm/linalg.h"
#include "ndm/reduce.h"
#include "ndm/transfer.h"

static const ndm__array *rec(ndm_array h) { return ndm__array_peek(h); }

ndm_array ndm__ag_sum_to(ndm_array g, int ndim, const int64_t *shape)
{
    const ndm__array *r = rec(g);
    if (!r)
        return NDM_NULL_ARRAY;
    if (r->ndim == ndim && !memcmp(r->shape, shape, sizeof(int64_t) * (size_t)ndim))
        return g;
    int axes[64];
    int n = 0, lead = r->ndim - ndim;
    if (lead < 0 || r->ndim > 64) {
        ndm__fail(NDM_E_SHAPE, "ndm_backward", NDM__NO_SITE, "gradient rank %d above %d", ndim,
                  r->ndim);
        return NDM_NULL_ARRAY;
    }
    for (int j = 0; j < r->ndim; j++)
        if (j < lead || (shape[j - lead] == 1 && r->shape[j] != 1))
            axes[n++] = j;
    ndm_array s = n ? ndm_sum(g, true, n, axes) : g;
    return ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, s, ndim, shape);
}

/* g of a reduction, brought back to the input's shape. */
static ndm_array unreduce(ndm__ag_node *nd, ndm_array g)
{
    const ndm__array *in = rec(nd->in[0]);
    ndm_array u = g;
    if (!nd->p.i[0] && nd->p.naxes != 0) { /* the reduced axes were dropped */
        int64_t shape[64];
        if (in->ndim > 64)
            return NDM_NULL_ARRAY;
        bool reduced[64] = {false};
        if (nd->p.naxes < 0)
            for (int j = 0; j < in->ndim; j++)
                reduced[j] = true;
        else
            for (int k = 0; k < nd->p.naxes; k++)
                reduced[nd->p.axes[k]] = true;
        for (int j = 0; j < in->ndim; j++)
            shape[j] = reduced[j] ? 1 : in->shape[j];
        u = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, g, in->ndim, shape);
    }
    return ndm_expand_to_at(NDM_HERE, NDM_OUTPUT_RULE, u, in->ndim, in->shape);
}

static double reduced_count(ndm__ag_node *nd)
{
    const ndm__array *in = rec(nd->in[0]);
    double c = 1;
    if (nd->p.naxes < 0)
        for (int j = 0; j < in->ndim; j++)
            c *= (double)in->shape[j];
    else
        for (int k = 0; k < nd->p.naxes; k++)
            c *= (double)in->shape[nd->p.axes[k]];
    return c;
}

/* g * mask where the mask is a comparison (bool) turned into g's dtype. */
static ndm_array masked(ndm_array g, ndm_array mask)
{
    return ndm_mul(g, ndm_astype(mask, ndm_array_dtype(g)));
}

/* d/dx of x * Phi(x) (the erf form of gelu): Phi(x) + x * phi(x), computed
 * in float64 on the host. */
static ndm_array gelu_derivative(ndm_array x)
{
    ndm_device dev = ndm_array_device(x);
    ndm_array h = ndm_astype(dev.type == NDM_DEVICE_CPU ? x : ndm_to(x, NDM_CPU), NDM_F64);
    double *v = h.id ? ndm_array_data(h) : NULL;
    if (!v)
        return NDM_NULL_ARRAY;
    int64_t n = ndm_array_size(h);
    for (int64_t i = 0; i < n; i++) {
        double t = v[i];
        v[i] = 0.5 * (1.0 + erf(t / sqrt(2.0))) + t * exp(-0.5 * t * t) / sqrt(2.0 * M_PI);
    }
    return dev.type == NDM_DEVICE_CPU ? h : ndm_to(h, dev);
}

/* d/dx of x * Phi(x) with Phi(x) ~ sigmoid(2u), u = k (x + c x^3):
 * 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(u). */
static ndm_array gelu_tanh_derivative(ndm_array a)
{
    const double k = 0.7978845608028654, c = 0.044715;
    ndm_array x2 = ndm_mul(a, a);
    ndm_array t = ndm_tanh(ndm_mul_scalar(ndm_add(a, ndm_mul_scalar(ndm_mul(x2, a), c)), k));
    ndm_array left = ndm_mul_scalar(ndm_add_scalar(t, 1.0), 0.5);
    ndm_array right = ndm_mul(ndm_mul_scalar(ndm_mul(a, ndm_rsub_scalar(ndm_mul(t, t), 1.0)),
                                             0.5 * k),
                              ndm_add_scalar(ndm_mul_scalar(x2, 3.0 * c), 1.0));
    return ndm_add(left, right);
}

/* d/dx of x * sigmoid(x): s * (1 + x * (1 - s)). */
static ndm_array silu_derivative(ndm_array a)
{
    ndm_array s = ndm_sigmoid(a);
    return ndm_mul(s, ndm_add_scalar(ndm_mul(a, ndm_rsub_scalar(s, 1.0)), 1.0));
}

/* The gradient of maximum (mx) or minimum for its operand a against b: g
 * where a wins, half of g where they tie. */
static ndm_array extreme_grad(ndm_array g, ndm_array a, ndm_array b, bool mx)
{
    ndm_array half = ndm_mul_scalar(masked(g, ndm_eq(a, b)), 0.5);
    return ndm_add(masked(g, mx ? ndm_gt(a, b) : ndm_lt(a, b)), half);
}
static ndm_array extreme_grad_scalar(ndm_array g, ndm_array a, double s, bool mx)
{
    ndm_array half = ndm_mul_scalar(masked(g, ndm_eq_scalar(a, s)), 0.5);
    return ndm_add(masked(g, mx ? ndm_gt_scalar(a, s) : ndm_lt_scalar(a, s)), half);
}

/* The rules come from the lists in ../backends/ew.h (the grad columns). */
#define NDM__EW_GRAD(e)                                                         \
    gi[0] = (e);                                                                \
    break;
#define NDM__EW_GRAD2(ea, eb)                                                   \
    gi[0] = nd->needs[0] ? (ea) : NDM_NULL_ARRAY;                               \
    gi[1] = nd->needs[1] ? (eb) : NDM_NULL_ARRAY;                               \
    break;
#define NDM__EW_NOGRAD return NDM_OK; /* zero almost everywhere, or no float input */

static ndm_status unary_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0], out = nd->saved_out;
    (void)a;
    (void)out;
    switch ((ndm__ew_unop)nd->p.i[0]) {
#define NDM__EW_CASE_(ID, name, form, flags, tol, ref_f, ref_i, grad)           \
    case NDM__EW_##ID:                                                          \
        grad
        NDM__EW_UNOPS(NDM__EW_CASE_)
#undef NDM__EW_CASE_
    default:
        return NDM_OK;
    }
    return gi[0].id ? NDM_OK : ndm_last_status();
}

static ndm_status binary_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0], b = nd->in[1], out = nd->saved_out;
    (void)a;
    (void)b;
    (void)out;
    switch ((ndm__ew_binop)nd->p.i[0]) {
#define NDM__EW_CASE_(ID, name, form, flags, tol, ref_f, ref_i, grad2, grads)   \
    case NDM__EW_##ID:                                                          \
        grad2
        NDM__EW_BINOPS(NDM__EW_CASE_)
#undef NDM__EW_CASE_
    default:
        return NDM_OK;
    }
    for (int i = 0; i < 2; i++)
        if (nd->needs[i] && !gi[i].id)
            return ndm_last_status();
    return NDM_OK;
}

static ndm_status scalar_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0], out = nd->saved_out;
    bool swap = nd->p.i[1];
    double s = nd->p.s[0];
    (void)a;
    (void)out;
    (void)swap;
    (void)s;
    switch ((ndm__ew_binop)nd->p.i[0]) {
#define NDM__EW_CASE_(ID, name, form, flags, tol, ref_f, ref_i, grad2, grads)   \
    case NDM__EW_##ID:                                                          \
        grads
        NDM__EW_BINOPS(NDM__EW_CASE_)
#undef NDM__EW_CASE_
    default:
        return NDM_OK;
    }
    return gi[0].id ? NDM_OK : ndm_last_status();
}

#undef NDM__EW_GRAD
#undef NDM__EW_GRAD2
#undef NDM__EW_NOGRAD

/* matmul with numpy's rules: 1-d operands are promoted, then the axis added
 * is removed; batch axes broadcast (deliver sums them back). */
static ndm_status matmul_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0], b = nd->in[1];
    const ndm__array *ra = rec(a), *rb = rec(b);
    bool a1 = ra->ndim == 1, b1 = rb->ndim == 1;
    ndm_array A = a1 ? ndm_unsqueeze(a, 0) : a;
    ndm_array B = b1 ? ndm_unsqueeze(b, 1) : b;
    ndm_array G = g;
    if (a1)
        G = ndm_unsqueeze(G, -2);
    if (b1)
        G = ndm_unsqueeze(G, -1);
    if (nd->needs[0]) {
        ndm_array ga = ndm_matmul(G, ndm_swapaxes(B, -1, -2));
        gi[0] = a1 ? ndm_reshape(ndm__ag_sum_to(ga, 2, (int64_t[]){1, ra->shape[0]}), NDM_SHAPE(-1))
                   : ga;
        if (!gi[0].id)
            return ndm_last_status();
    }
    if (nd->needs[1]) {
        /* b a transposed 2-d view (x @ w^T, a linear layer's weight): its
         * gradient computed as (G^T @ A)^T lies in w's own order, so that
         * adding it to w's gradient reads memory in order instead of
         * transposing a matrix the size of w on every step. */
        bool bt = ra->ndim == 2 && rb->ndim == 2 && rb->shape[0] > 1 && rb->shape[1] > 1 &&
                  rb->strides[0] == 1 && rb->strides[1] != 1;
        ndm_array gb = bt ? ndm_transpose(ndm_matmul(ndm_transpose(G), A))
                          : ndm_matmul(ndm_swapaxes(A, -1, -2), G);
        gi[1] = b1 ? ndm_reshape(ndm__ag_sum_to(gb, 2, (int64_t[]){rb->shape[0], 1}), NDM_SHAPE(-1))
                   : gb;
        if (!gi[1].id)
            return ndm_last_status();
    }
    return NDM_OK;
}

static ndm_status dot_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0], b = nd->in[1];
    const ndm__array *ra = rec(a), *rb = rec(b);
    if (rb->ndim != 1 || ra->ndim < 1)
        return ndm__fail(NDM_E_UNSUPPORTED, "ndm_backward", NDM__NO_SITE,
                         "the gradient of ndm_dot is available for a 1-d second operand; use "
                         "ndm_matmul for higher ranks");
    /* out = sum over the last axis of a * b */
    ndm_array ge = ndm_unsqueeze(g, -1);
    if (nd->needs[0] && !(gi[0] = ndm_mul(ge, b)).id)
        return ndm_last_status();
    if (nd->needs[1] && !(gi[1] = ndm_mul(ge, a)).id)
        return ndm_last_status();
    return NDM_OK;
}

static ndm_status reduce_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    ndm_array a = nd->in[0];
    ndm_array ge = unreduce(nd, g);
    switch (nd->op) {
    case NDM__AG_SUM:
        gi[0] = ge;
        break;
    case NDM__AG_MEAN:
        gi[0] = ndm_div_scalar(ge, reduced_count(nd));
        break;
    case NDM__AG_MAX:
    case NDM__AG_MIN: {
        /* the extreme elements share the gradient equally */
        ndm_array hit = ndm_astype(ndm_eq(a, unreduce(nd, nd->saved_out)), ndm_array_dtype(g));
        ndm_array count;
        if (nd->p.naxes < 0)
            count = ndm_sum(hit, true, NDM_ALL_AXES_LIST);
        else
            count = ndm_sum(hit, true, nd->p.naxes, nd->p.axes);
        gi[0] = ndm_div(ndm_mul(ge, hit), count);
        break;
    }
    case NDM__AG_LOGSUMEXP:
        gi[0] = ndm_mul(ge, ndm_exp(ndm_sub(a, unreduce(nd, nd->saved_out))));
        break;
    default:
        return NDM_OK;
    }
    return gi[0].id ? NDM_OK : ndm_last_status();
}

static ndm_status view_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    const ndm__array *in = rec(nd->in[0]);
    switch (nd->op) {
    case NDM__AG_IDENTITY:
    case NDM__AG_EXPAND: /* deliver sums the broadcast axes back */
    case NDM__AG_CAST:   /* deliver casts back */
        gi[0] = g;
        break;
    case NDM__AG_RESHAPE:
        gi[0] = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, g, in->ndim, in->shape);
        break;
    case NDM__AG_PERMUTE: {
        int inv[NDM__AG_MAX_AXES];
        for (int k = 0; k < nd->p.naxes; k++)
            inv[nd->p.axes[k]] = k;
        gi[0] = ndm_permute(g, nd->p.naxes, inv);
        break;
    }
    case NDM__AG_SLICE:
    case NDM__AG_SELECT: {
        ndm_array z = ndm_zeros(NDM_CURRENT_SCOPE, ndm_array_dtype(g), in->ndim, in->shape);
        ndm_array v = nd->op == NDM__AG_SLICE
                          ? ndm_slice(z, (int)nd->p.i[0], nd->p.i[1], nd->p.i[2], nd->p.i[3])
                          : ndm_select(z, (int)nd->p.i[0], nd->p.i[1]);
        if (!v.id || ndm_copy_into(v, g) < 0)
            return ndm_last_status();
        gi[0] = z;
        break;
    }
    case NDM__AG_FLIP:
        gi[0] = ndm_flip(g, (int)nd->p.i[0]);
        break;
    default:
        return NDM_OK;
    }
    return gi[0].id ? NDM_OK : ndm_last_status();
}

static ndm_status index_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    int axis = (int)nd->p.i[0];
    switch (nd->op) {
    case NDM__AG_CONCAT: {
        int64_t start = 0;
        for (int i = 0; i < nd->n; i++) {
            const ndm__array *r = rec(nd->in[i]);
            int ax = axis < 0 ? axis + r->ndim : axis;
            int64_t len = r->shape[ax];
            if (nd->needs[i] && !(gi[i] = ndm_slice(g, ax, start, start + len, 1)).id)
                return ndm_last_status();
            start += len;
        }
        return NDM_OK;
    }
    case NDM__AG_STACK:
        for (int i = 0; i < nd->n; i++)
            if (nd->needs[i] && !(gi[i] = ndm_select(g, axis, i)).id)
                return ndm_last_status();
        return NDM_OK;
    case NDM__AG_TAKE: {
        /* scatter the rows back: indices flattened to (K,), g to
         * a.shape[:axis] + (K,) + a.shape[axis+1:] */
        const ndm__array *ra = rec(nd->in[0]), *ri = rec(nd->in[1]);
        int ax = axis < 0 ? axis + ra->ndim : axis;
        int64_t k = ndm__numel(ri->ndim, ri->shape);
        int64_t gshape[64], ishape[64];
        if (ra->ndim > 64)
            return ndm__fail(NDM_E_UNSUPPORTED, "ndm_backward", NDM__NO_SITE, "rank above 64");
        for (int j = 0; j < ra->ndim; j++) {
            gshape[j] = j == ax ? k : ra->shape[j];
            ishape[j] = j == ax ? k : 1;
        }
        ndm_array gr = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, g, ra->ndim, gshape);
        ndm_array ir = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, nd->in[1], ra->ndim, ishape);
        ndm_array z = ndm_zeros(NDM_CURRENT_SCOPE, ndm_array_dtype(g), ra->ndim, ra->shape);
        if (!gr.id || !ir.id || !z.id || ndm_scatter_add_(z, ax, ir, gr) < 0)
            return ndm_last_status();
        gi[0] = z;
        return NDM_OK;
    }
    case NDM__AG_GATHER: {
        const ndm__array *ra = rec(nd->in[0]);
        ndm_array z = ndm_zeros(NDM_CURRENT_SCOPE, ndm_array_dtype(g), ra->ndim, ra->shape);
        if (!z.id || ndm_scatter_add_(z, axis, nd->in[1], g) < 0)
            return ndm_last_status();
        gi[0] = z;
        return NDM_OK;
    }
    default:
        return NDM_OK;
    }
}

/* The sums of g from each position to the end of its line along axis. */
static ndm_array reverse_cumsum(ndm_array g, int axis)
{
    return ndm_flip(ndm_cumsum(ndm_flip(g, axis), axis), axis);
}

/* y = cumprod(x): d/dx_j of sum_k g_k y_k is sum over k >= j of g_k times
 * the product of x_i for i <= k but i != j. Before a line's first zero that
 * is reverse_cumsum(g * y)_j / x_j (x_j is not zero there); after it, every
 * term holds the zero, so 0; at the first zero itself it is
 * reverse_cumsum(g * y1) with y1 the cumprod of x with that zero made 1.
 * No division ever meets a zero, so the gradient is exact where PyTorch's
 * is, and finite. */
static ndm_status cumprod_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    int axis = (int)nd->p.i[0];
    ndm_array x = nd->in[0], y = nd->saved_out;
    ndm_dtype t = ndm_array_dtype(g);
    ndm_array one = ndm_ones(NDM_CURRENT_SCOPE, t, NDM_SCALAR);
    ndm_array zero = ndm_zeros(NDM_CURRENT_SCOPE, t, NDM_SCALAR);
    ndm_array is_zero = ndm_eq_scalar(x, 0.0);
    ndm_array zeros_so_far = ndm_cumsum(is_zero, axis);
    ndm_array before = ndm_eq_scalar(zeros_so_far, 0.0);
    ndm_array first = ndm_logical_and(is_zero, ndm_eq_scalar(zeros_so_far, 1.0));
    ndm_array lead = ndm_div(reverse_cumsum(ndm_mul(g, y), axis), ndm_where(before, x, one));
    ndm_array y1 = ndm_cumprod(ndm_where(first, one, x), axis);
    ndm_array at_zero = reverse_cumsum(ndm_mul(g, y1), axis);
    gi[0] = ndm_where(before, lead, ndm_where(first, at_zero, zero));
    return gi[0].id ? NDM_OK : ndm_last_status();
}

/* Scatter g (K entries of a's trailing shape after the leading k axes, or
 * of none) into zeros of `shape` (ndim axes) read as [prod(shape[:k])] +
 * shape[k:], at the flat positions pos (K of them, any shape). */
static ndm_array scatter_flat(ndm_array g, ndm_array pos, int k, int ndim, const int64_t *shape)
{
    int64_t fshape[65], gshape[65], ishape[65];
    if (ndim - k + 1 > 65)
        return NDM_NULL_ARRAY;
    int64_t lead = 1, npos = ndm_array_size(pos);
    for (int j = 0; j < k; j++)
        lead *= shape[j];
    fshape[0] = lead;
    gshape[0] = npos;
    ishape[0] = npos;
    for (int j = k; j < ndim; j++) {
        fshape[j - k + 1] = shape[j];
        gshape[j - k + 1] = shape[j];
        ishape[j - k + 1] = 1;
    }
    int fnd = ndim - k + 1;
    ndm_array z = ndm_zeros(NDM_CURRENT_SCOPE, ndm_array_dtype(g), fnd, fshape);
    ndm_array gr = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, g, fnd, gshape);
    ndm_array ir = ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, pos, fnd, ishape);
    if (!z.id || !gr.id || !ir.id || ndm_scatter_add_(z, 0, ir, gr) < 0)
        return NDM_NULL_ARRAY;
    return ndm_reshape_to_at(NDM_HERE, NDM_OUTPUT_RULE, z, ndim, shape);
}

static ndm_status select_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    const ndm__array *ra = rec(nd->in[0]);
    if (nd->op == NDM__AG_INDEX) {
        gi[0] = scatter_flat(g, nd->in[1], (int)nd->p.i[0], ra->ndim, ra->shape);
        return gi[0].id ? NDM_OK : ndm_last_status();
    }
    /* masked_select: the positions index the broadcast of a and the mask */
    const ndm__array *rm = rec(nd->in[1]);
    int bnd = ra->ndim > rm->ndim ? ra->ndim : rm->ndim;
    int64_t shape[64];
    if (bnd > 64)
        return ndm__fail(NDM_E_UNSUPPORTED, "ndm_backward", NDM__NO_SITE, "rank above 64");
    for (int j = 0; j < bnd; j++) {
        int ja = j - (bnd - ra->ndim), jm = j - (bnd - rm->ndim);
        int64_t sa = ja >= 0 ? ra->shape[ja] : 1, sm = jm >= 0 ? rm->shape[jm] : 1;
        shape[j] = sa == 1 ? sm : sa;
    }
    ndm_array z = scatter_flat(g, nd->in[2], bnd, bnd, shape);
    gi[0] = z.id ? ndm__ag_sum_to(z, ra->ndim, ra->shape) : NDM_NULL_ARRAY;
    return gi[0].id ? NDM_OK : ndm_last_status();
}

static ndm_status softmax_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    int axis = (int)nd->p.i[0];
    ndm_array out = nd->saved_out;
    if (nd->op == NDM__AG_SOFTMAX) /* out * (g - sum(g * out)) */
        gi[0] = ndm_mul(out, ndm_sub(g, ndm_sum(ndm_mul(g, out), true, NDM_AXES(axis))));
    else /* g - exp(out) * sum(g) */
        gi[0] = ndm_sub(g, ndm_mul(ndm_exp(out), ndm_sum(g, true, NDM_AXES(axis))));
    return gi[0].id ? NDM_OK : ndm_last_status();
}

/* y = x r w with r = 1 / sqrt(mean(x^2) + eps) along the last axis and
 * xhat = x r: dx = r (g w - xhat mean(g w xhat)), dw = the sum of g xhat
 * over every row. */
static ndm_status rms_norm_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    bool has_w = nd->p.i[0] != 0;
    ndm_array x = nd->in[0], r = nd->in[has_w ? 2 : 1];
    int last = ndm_array_ndim(x) - 1;
    ndm_array xhat = ndm_mul(x, r);
    ndm_array gw = has_w ? ndm_mul(g, nd->in[1]) : g;
    if (nd->needs[0]) {
        ndm_array m = ndm_mean(ndm_mul(gw, xhat), true, 1, &last);
        if (!(gi[0] = ndm_mul(r, ndm_sub(gw, ndm_mul(xhat, m)))).id)
            return ndm_last_status();
    }
    if (has_w && nd->needs[1]) {
        ndm_array rows = ndm_reshape(ndm_mul(g, xhat), NDM_SHAPE(-1, ndm_array_dim(x, last)));
        if (!(gi[1] = ndm_sum(rows, false, NDM_AXES(0))).id)
            return ndm_last_status();
    }
    return NDM_OK;
}

ndm_status ndm__ag_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi)
{
    switch (nd->op) {
    case NDM__AG_BINARY:
        return binary_rule(nd, g, gi);
    case NDM__AG_SCALAR:
        return scalar_rule(nd, g, gi);
    case NDM__AG_UNARY:
        return unary_rule(nd, g, gi);
    case NDM__AG_CLAMP:
        gi[0] = masked(g, ndm_logical_and(ndm_ge_scalar(nd->in[0], nd->p.s[0]),
                                          ndm_le_scalar(nd->in[0], nd->p.s[1])));
        return gi[0].id ? NDM_OK : ndm_last_status();
    case NDM__AG_WHERE: {
        ndm_array zero = ndm_zeros(NDM_CURRENT_SCOPE, ndm_array_dtype(g), NDM_SCALAR);
        if (nd->needs[1])
            gi[1] = ndm_where(nd->in[0], g, zero);
        if (nd->needs[2])
            gi[2] = ndm_where(nd->in[0], zero, g);
        return (nd->needs[1] && !gi[1].id) || (nd->needs[2] && !gi[2].id) ? ndm_last_status()
                                                                           : NDM_OK;
    }
    case NDM__AG_CAST:
    case NDM__AG_IDENTITY:
    case NDM__AG_RESHAPE:
    case NDM__AG_PERMUTE:
    case NDM__AG_SLICE:
    case NDM__AG_SELECT:
    case NDM__AG_EXPAND:
    case NDM__AG_FLIP:
        return view_rule(nd, g, gi);
    case NDM__AG_SUM:
    case NDM__AG_MEAN:
    case NDM__AG_MAX:
    case NDM__AG_MIN:
    case NDM__AG_LOGSUMEXP:
        return reduce_rule(nd, g, gi);
    case NDM__AG_SOFTMAX:
    case NDM__AG_LOG_SOFTMAX:
        return softmax_rule(nd, g, gi);
    case NDM__AG_MATMUL:
        return matmul_rule(nd, g, gi);
    case NDM__AG_DOT:
        return dot_rule(nd, g, gi);
    case NDM__AG_OUTER: /* out[i, j] = a[i] b[j] */
        if (nd->needs[0] && !(gi[0] = ndm_matmul(g, nd->in[1])).id)
            return ndm_last_status();
        if (nd->needs[1] && !(gi[1] = ndm_matmul(ndm_transpose(g), nd->in[0])).id)
            return ndm_last_status();
        return NDM_OK;
    case NDM__AG_CONCAT:
    case NDM__AG_STACK:
    case NDM__AG_TAKE:
    case NDM__AG_GATHER:
        return index_rule(nd, g, gi);
    case NDM__AG_CUMSUM:
        gi[0] = reverse_cumsum(g, (int)nd->p.i[0]);
        return gi[0].id ? NDM_OK : ndm_last_status();
    case NDM__AG_CUMPROD:
        return cumprod_rule(nd, g, gi);
    case NDM__AG_RMS_NORM:
        return rms_norm_rule(nd, g, gi);
    case NDM__AG_TRI: /* the kept triangle passes the gradient, the rest none */
        gi[0] = nd->p.i[1] ? ndm_triu(g, nd->p.i[0]) : ndm_tril(g, nd->p.i[0]);
        return gi[0].id ? NDM_OK : ndm_last_status();
    case NDM__AG_INDEX:
    case NDM__AG_MASKED_SELECT:
        return select_rule(nd, g, gi);
    case NDM__AG_CONV2D: {
        const int64_t *c = nd->p.conv;
        ndm_conv2d_opts o = {{c[0], c[1]}, {c[2], c[3]}, {c[4], c[5]}, c[6]};
        const ndm__array *rx = rec(nd->in[0]), *rw = rec(nd->in[1]);
        if (nd->needs[0] &&
            !(gi[0] = ndm_conv2d_backward_input(g, nd->in[1], &o, 4, rx->shape)).id)
            return ndm_last_status();
        if (nd->needs[1] &&
            !(gi[1] = ndm_conv2d_backward_weight(g, nd->in[0], &o, 4, rw->shape)).id)
            return ndm_last_status();
        if (nd->n > 2 && nd->needs[2] && !(gi[2] = ndm_sum(g, false, NDM_AXES(0, 2, 3))).id)
            return ndm_last_status();
        return NDM_OK;
    }
    case NDM__AG_MAX_POOL2D:
    case NDM__AG_AVG_POOL2D: {
        const int64_t *c = nd->p.conv;
        ndm_pool2d_opts o = {{c[0], c[1]}, {c[2], c[3]}, {c[4], c[5]}};
        const ndm__array *rx = rec(nd->in[0]);
        gi[0] = nd->op == NDM__AG_MAX_POOL2D
                    ? ndm_max_pool2d_backward(g, nd->in[0], &o)
                    : ndm_avg_pool2d_backward(g, nd->p.i[0] != 0, &o, 4, rx->shape);
        return gi[0].id ? NDM_OK : ndm_last_status();
    }
    case NDM__AG_CROSS_ENTROPY:
    case NDM__AG_NLL: {
        /* d/dscores of mean(lse - picked) = (softmax - onehot) / N; of
         * mean(-picked) = -onehot / N. With an ignored label (i[1]; the
         * label i[2]), N counts the kept rows and the ignored rows get 0
         * (all ignored: zeros, as PyTorch gives). */
        const ndm__array *rs = rec(nd->in[0]);
        int64_t n = rs->shape[0], c = rs->shape[1];
        ndm_array labels = nd->in[1], keep = NDM_NULL_ARRAY;
        if (nd->p.i[1]) {
            keep = ndm_ne_scalar(labels, (double)nd->p.i[2]);
            labels = ndm_mul(labels, ndm_astype(keep, ndm_array_dtype(labels)));
        }
        ndm_array onehot = ndm_one_hot(labels, c, rs->dtype);
        ndm_array d = nd->op == NDM__AG_CROSS_ENTROPY ? ndm_sub(ndm_softmax(nd->in[0], 1), onehot)
                                                      : ndm_neg(onehot);
        if (nd->p.i[1]) {
            ndm_array count =
                ndm_sum(ndm_astype(keep, rs->dtype), false, NDM_ALL_AXES_LIST);
            ndm_array zero = ndm_zeros(NDM_CURRENT_SCOPE, rs->dtype, NDM_SCALAR);
            d = ndm_where(ndm_unsqueeze(keep, 1), ndm_div(d, count), zero);
        } else {
            d = ndm_div_scalar(d, (double)n);
        }
        gi[0] = ndm_mul(d, g);
        return gi[0].id ? NDM_OK : ndm_last_status();
    }
    default:
        return ndm__fail(NDM_E_UNSUPPORTED, "ndm_backward", NDM__NO_SITE,
                         "no gradient rule for recorded operation %d", (int)nd->op);
    }
}
