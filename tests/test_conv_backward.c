/* The gradients of conv2d and pooling: central differences of the forward
 * in float64, direct loops written here, both CPU tables and both ways the
 * fast kernels split work, the max's tie rule, views and broadcast
 * gradients, every float dtype, errors, null inputs, the output rule. */
#include "backends/backend.h"
#include "backends/cpu/parallel.h"
#include "backends/nn.h"
#include "backends/registry.h"
#include "check_numeric.h"
#include "manager/alloc/alloc.h"

/* The kernels under test: the reference table, and the fast one as a
 * batch too small for the threads runs it (one part, the provider's GEMM)
 * and as it splits the batch over threads (inner products for the
 * weight, partial sums), with each set of vector kernels. */
static const struct {
    bool ref;
    int threads, isa;
    const char *name;
} modes[] = {
    {true, 1, 0, "reference"},
    {false, 1, 0, "fast, 1 thread"},
    {false, 3, 0, "fast, 3 threads"},
    {false, 3, 2, "fast, 3 threads, AVX2"}, /* the best there is where AVX2 is not */
    {false, 3, 1, "fast, 3 threads, portable C"},
    {false, 1, 1, "fast, 1 thread, portable C"},
};
#define N_MODES (int)(sizeof modes / sizeof modes[0])

/* Enter mode i; returns what mode_leave needs to restore. */
static int mode_enter(int i)
{
    ndm__cpu_force_reference(modes[i].ref);
    (void)ndm__cpu_conv_grad_isa(modes[i].isa);
    return ndm__set_num_threads(modes[i].threads);
}

static void mode_leave(int threads)
{
    ndm__cpu_force_reference(false);
    (void)ndm__cpu_conv_grad_isa(0);
    ndm__set_num_threads(threads);
}

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int64_t stride[2], pad[2], dil[2], groups;
} conv_case;

static int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static ndm_conv2d_opts opts_of(const conv_case *k)
{
    return (ndm_conv2d_opts){{k->stride[0], k->stride[1]},
                             {k->pad[0], k->pad[1]},
                             {k->dil[0], k->dil[1]},
                             k->groups};
}

typedef struct shapes {
    int64_t x[4], w[4], y[4];
} shapes;

static shapes shapes_of(const conv_case *k)
{
    shapes s = {{k->n, k->c, k->h, k->w},
                {k->o, k->c / k->groups, k->kh, k->kw},
                {k->n, k->o, out_dim(k->h, k->kh, k->stride[0], k->pad[0], k->dil[0]),
                 out_dim(k->w, k->kw, k->stride[1], k->pad[1], k->dil[1])}};
    return s;
}

/* Both gradients by direct loops over every tap of every output pixel, in
 * the scatter form (the kernels gather), with the sums of |terms| that
 * bound the rounding error. */
typedef struct grads {
    double *dx, *dw, *sx, *sw;
} grads;

static grads ref_grads(const conv_case *k, const double *x, const double *w, const double *dy)
{
    shapes s = shapes_of(k);
    int64_t og = k->o / k->groups, cg = k->c / k->groups;
    size_t nx = (size_t)shape_numel(4, s.x) + 1, nw = (size_t)shape_numel(4, s.w) + 1;
    grads g = {calloc(nx, sizeof(double)), calloc(nw, sizeof(double)), calloc(nx, sizeof(double)),
               calloc(nw, sizeof(double))};
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t o = 0; o < k->o; o++)
            for (int64_t i = 0; i < s.y[2]; i++)
                for (int64_t j = 0; j < s.y[3]; j++)
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t p = 0; p < k->kh; p++)
                            for (int64_t q = 0; q < k->kw; q++) {
                                int64_t ih = i * k->stride[0] - k->pad[0] + p * k->dil[0];
                                int64_t iw = j * k->stride[1] - k->pad[1] + q * k->dil[1];
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w)
                                    continue;
                                int64_t ci = (o / og) * cg + c;
                                int64_t xi = ((n * k->c + ci) * k->h + ih) * k->w + iw;
                                int64_t wi = ((o * cg + c) * k->kh + p) * k->kw + q;
                                double d = dy[((n * k->o + o) * s.y[2] + i) * s.y[3] + j];
                                g.dx[xi] += d * w[wi];
                                g.sx[xi] += fabs(d * w[wi]);
                                g.dw[wi] += d * x[xi];
                                g.sw[wi] += fabs(d * x[xi]);
                            }
    return g;
}

static void free_grads(grads *g) { free(g->dx), free(g->dw), free(g->sx), free(g->sw); }

/* got within the error a sum of `terms` products rounded in t (or f32 for
 * f16 and bf16, then rounded once to t) can make. */
static void check_sum(ndm_array a, const double *want, const double *scale, int64_t terms,
                      const char *what)
{
    ndm_dtype t = ndm_array_dtype(a);
    double u = t == NDM_F64 ? 1.2e-16 : 6e-8;
    double *got = read_array(a);
    for (int64_t i = 0; i < ndm_array_size(a); i++)
        if (!close_to(got[i], want[i], dtype_rtol(t), 2.0 * (double)(terms + 2) * u * scale[i]))
            fail_msg("%s (%s): element %lld is %.17g, expected %.17g", what, ndm_dtype_short(t),
                     (long long)i, got[i], want[i]);
    free(got);
}

static ndm_array rand_array(ndm_manager m, rng *g, ndm_dtype t, double *v, int nd,
                            const int64_t *shape)
{
    rng_fill(g, t, v, shape_numel(nd, shape));
    return make_array(m, t, v, nd, shape);
}

/* Both gradients of case k on x, w, dy (any views whose C-order values are
 * xv, wv, dyv), on the table in use. */
static void check_grads_on(const conv_case *k, ndm_array x, const double *xv, ndm_array w,
                           const double *wv, ndm_array dy, const double *dyv, const char *what)
{
    ndm_conv2d_opts o = opts_of(k);
    shapes s = shapes_of(k);
    ndm_dtype t = ndm_array_dtype(dy);
    grads r = ref_grads(k, xv, wv, dyv);
    ndm_array dx = ndm_conv2d_backward_input(dy, w, &o, 4, s.x);
    if (!dx.id)
        fail_msg("%s: input gradient: %s", what, ndm_last_error());
    ndm_array dw = ndm_conv2d_backward_weight(dy, x, &o, 4, s.w);
    if (!dw.id)
        fail_msg("%s: weight gradient: %s", what, ndm_last_error());
    assert_shape(dx, s.x[0], s.x[1], s.x[2], s.x[3]);
    assert_shape(dw, s.w[0], s.w[1], s.w[2], s.w[3]);
    assert_int_equal(ndm_array_dtype(dx), t);
    assert_int_equal(ndm_array_dtype(dw), t);
    char msg[96];
    snprintf(msg, sizeof msg, "%s: input gradient", what);
    check_sum(dx, r.dx, r.sx, (k->o / k->groups) * k->kh * k->kw, msg);
    snprintf(msg, sizeof msg, "%s: weight gradient", what);
    check_sum(dw, r.dw, r.sw, k->n * s.y[2] * s.y[3], msg);
    free_grads(&r);
    release(dx), release(dw);
}

/* Case k with fresh contiguous operands of dtype t, on both tables. */
static void check_grads(ndm_manager m, rng *g, const conv_case *k, ndm_dtype t, const char *what)
{
    shapes s = shapes_of(k);
    double *xv = malloc(sizeof(double) * (size_t)(shape_numel(4, s.x) + 1));
    double *wv = malloc(sizeof(double) * (size_t)(shape_numel(4, s.w) + 1));
    double *dyv = malloc(sizeof(double) * (size_t)(shape_numel(4, s.y) + 1));
    ndm_array x = rand_array(m, g, t, xv, 4, s.x);
    ndm_array w = rand_array(m, g, t, wv, 4, s.w);
    ndm_array dy = rand_array(m, g, t, dyv, 4, s.y);
    for (int md = 0; md < N_MODES; md++) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s, %s", what, modes[md].name);
        int keep = mode_enter(md);
        check_grads_on(k, x, xv, w, wv, dy, dyv, msg);
        mode_leave(keep);
    }
    release(x), release(w), release(dy);
    free(xv), free(wv), free(dyv);
}

static const conv_case cases[] = {
    {2, 3, 7, 6, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},
    {1, 2, 5, 5, 3, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1},
    {3, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 0}, {2, 1}, 2},
    {4, 6, 5, 5, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},  /* 1x1: dx written by the GEMM */
    {4, 6, 5, 5, 9, 1, 1, {1, 1}, {0, 0}, {1, 1}, 3},  /* 1x1 in groups */
    {3, 6, 7, 7, 4, 1, 1, {2, 2}, {0, 0}, {1, 1}, 2},  /* 1x1 strided: pixels no tap reads */
    {2, 4, 6, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 4},  /* depthwise */
    {1, 1, 2, 2, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},  /* kernel over the edges */
    {2, 3, 11, 13, 5, 5, 3, {3, 2}, {2, 1}, {1, 2}, 1},
    {2, 2, 8, 9, 3, 2, 2, {3, 3}, {0, 0}, {1, 1}, 1},  /* stride past the kernel */
    {3, 2, 10, 7, 4, 3, 3, {2, 3}, {3, 2}, {3, 2}, 2}, /* padding past the dilated taps */
    {0, 3, 5, 5, 2, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},  /* empty batch: dw is zeros */
    {2, 0, 4, 4, 3, 2, 2, {1, 1}, {0, 0}, {1, 1}, 1},  /* no input channel */
    {2, 3, 4, 4, 0, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},  /* no output channel: dx is zeros */
    {2, 2, 0, 3, 2, 2, 2, {1, 1}, {1, 1}, {1, 1}, 1},  /* windows over padding only */
};
#define N_CASES (sizeof cases / sizeof cases[0])

static void test_conv2d_backward_matches_direct_loops(void **state)
{
    rng g = rng_new(11);
    for (size_t c = 0; c < N_CASES; c++) {
        char what[32];
        snprintf(what, sizeof what, "case %zu", c);
        check_grads(ROOT(state), &g, &cases[c], NDM_F32, what);
        check_grads(ROOT(state), &g, &cases[c], NDM_F64, what);
    }
}

static void test_conv2d_backward_half_precision(void **state)
{
    rng g = rng_new(12);
    check_grads(ROOT(state), &g, &cases[0], NDM_F16, "f16");
    check_grads(ROOT(state), &g, &cases[2], NDM_BF16, "bf16");
    check_grads(ROOT(state), &g, &cases[3], NDM_F16, "f16 1x1");
}

/* sum(conv2d(x, w) * r) in float64. */
static double conv_loss(ndm_array x, ndm_array w, const ndm_conv2d_opts *o, const double *r)
{
    ndm_array y = ndm_conv2d(x, w, o);
    assert_live(y);
    double *v = read_array(y), s = 0;
    for (int64_t i = 0; i < ndm_array_size(y); i++)
        s += v[i] * r[i];
    free(v);
    release(y);
    return s;
}

/* Central differences of the loss in every element of a (f64, contiguous):
 * the loss is linear in each operand, so they are exact but for rounding. */
static double *central(ndm_array a, ndm_array x, ndm_array w, const ndm_conv2d_opts *o,
                       const double *r)
{
    const double h = 1.0 / 1024;
    double *p = ndm_array_data(a), *fd = malloc(sizeof(double) * (size_t)ndm_array_size(a));
    assert_non_null(p);
    for (int64_t i = 0; i < ndm_array_size(a); i++) {
        double keep = p[i];
        p[i] = keep + h;
        double up = conv_loss(x, w, o, r);
        p[i] = keep - h;
        double down = conv_loss(x, w, o, r);
        p[i] = keep;
        fd[i] = (up - down) / (2 * h);
    }
    return fd;
}

static void check_central(ndm_array g, const double *fd, const char *what)
{
    double *got = read_array(g);
    for (int64_t i = 0; i < ndm_array_size(g); i++)
        if (fabs(fd[i] - got[i]) > 1e-9 * (1 + fabs(fd[i])))
            fail_msg("%s: element %lld: central difference %.17g, gradient %.17g", what,
                     (long long)i, fd[i], got[i]);
    free(got);
}

static void test_conv2d_backward_central_differences(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(13);
    const conv_case small[] = {
        {2, 3, 7, 6, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},
        {3, 4, 7, 8, 6, 3, 2, {2, 1}, {1, 0}, {2, 1}, 2},
        {1, 2, 9, 7, 3, 3, 3, {3, 2}, {2, 1}, {1, 2}, 1},
        {2, 4, 5, 5, 4, 3, 3, {1, 2}, {1, 1}, {1, 1}, 4},
        {3, 4, 5, 6, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2},
        {3, 2, 6, 5, 2, 2, 3, {2, 2}, {1, 1}, {2, 1}, 1},
    };
    for (size_t c = 0; c < sizeof small / sizeof small[0]; c++) {
        const conv_case *k = &small[c];
        ndm_conv2d_opts o = opts_of(k);
        shapes s = shapes_of(k);
        double xv[1000], wv[200], rv[1000];
        assert_true(shape_numel(4, s.x) <= 1000 && shape_numel(4, s.y) <= 1000);
        ndm_array x = rand_array(m, &g, NDM_F64, xv, 4, s.x);
        ndm_array w = rand_array(m, &g, NDM_F64, wv, 4, s.w);
        ndm_array dy = rand_array(m, &g, NDM_F64, rv, 4, s.y);
        double *fx = central(x, x, w, &o, rv), *fw = central(w, x, w, &o, rv);
        for (int md = 0; md < N_MODES; md++) {
            int keep = mode_enter(md);
            ndm_array dx = ndm_conv2d_backward_input(dy, w, &o, 4, s.x);
            ndm_array dw = ndm_conv2d_backward_weight(dy, x, &o, 4, s.w);
            mode_leave(keep);
            assert_live(dx);
            assert_live(dw);
            char what[64];
            snprintf(what, sizeof what, "case %zu %s: input", c, modes[md].name);
            check_central(dx, fx, what);
            snprintf(what, sizeof what, "case %zu %s: weight", c, modes[md].name);
            check_central(dw, fw, what);
            release(dx), release(dw);
        }
        free(fx), free(fw);
        release(x), release(w), release(dy);
    }
}

/* Larger problems on every path: a Fashion-MNIST-like batch, groups with
 * partial sums, a deep input whose unfolding is cut into tiles (alone and
 * with a grad_out gathered tile by tile); two runs on threads agree bit
 * for bit (partial sums are added in a fixed order); the reference and the
 * fast table agree closely. */
static void test_conv2d_backward_threads_and_tiles(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(14);
    conv_case mnist = {16, 1, 28, 28, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
    conv_case grouped = {5, 8, 9, 9, 12, 3, 3, {2, 1}, {1, 1}, {1, 2}, 4};
    /* K = 1152 by 1600 pixels: the unfolded input is cut into tiles */
    conv_case deep = {3, 128, 40, 40, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
    check_grads(m, &g, &mnist, NDM_F32, "mnist");
    check_grads(m, &g, &grouped, NDM_F64, "grouped");
    check_grads(m, &g, &deep, NDM_F32, "tiled");
    {
        shapes s = shapes_of(&deep);
        double *xv = malloc(sizeof(double) * (size_t)shape_numel(4, s.x));
        double *wv = malloc(sizeof(double) * (size_t)shape_numel(4, s.w));
        double dv[3 * 40 * 40 * 4];
        ndm_array x = rand_array(m, &g, NDM_F32, xv, 4, s.x);
        ndm_array w = rand_array(m, &g, NDM_F32, wv, 4, s.w);
        ndm_array db = rand_array(m, &g, NDM_F32, dv, 4, (int64_t[]){3, 4, 40, 40});
        ndm_array dy = ndm_swapaxes(db, 2, 3);
        double *dyv = read_array(dy);
        for (int md = 0; md < N_MODES; md++) {
            int keep = mode_enter(md);
            check_grads_on(&deep, x, xv, w, wv, dy, dyv, modes[md].name);
            mode_leave(keep);
        }
        free(xv), free(wv), free(dyv);
        release(x), release(w), release(db), release(dy);
    }
    int before = ndm__set_num_threads(3);
    shapes s = shapes_of(&grouped);
    ndm_conv2d_opts o = opts_of(&grouped);
    double *xv = malloc(sizeof(double) * (size_t)shape_numel(4, s.x));
    double *dyv = malloc(sizeof(double) * (size_t)shape_numel(4, s.y));
    ndm_array x = rand_array(m, &g, NDM_F32, xv, 4, s.x);
    ndm_array dy = rand_array(m, &g, NDM_F32, dyv, 4, s.y);
    ndm_array a = ndm_conv2d_backward_weight(dy, x, &o, 4, s.w);
    ndm_array b = ndm_conv2d_backward_weight(dy, x, &o, 4, s.w);
    double *va = read_array(a), *vb = read_array(b);
    assert_memory_equal(va, vb, sizeof(double) * (size_t)shape_numel(4, s.w));
    free(va), free(vb), free(xv), free(dyv);
    release(a), release(b), release(x), release(dy);
    ndm__set_num_threads(before);

    conv_case wide = {6, 12, 15, 13, 10, 3, 5, {2, 1}, {1, 2}, {1, 1}, 2};
    s = shapes_of(&wide);
    o = opts_of(&wide);
    double *v = malloc(sizeof(double) * (size_t)shape_numel(4, s.x));
    x = rand_array(m, &g, NDM_F64, v, 4, s.x);
    ndm_array w = rand_array(m, &g, NDM_F64, v, 4, s.w);
    dy = rand_array(m, &g, NDM_F64, v, 4, s.y);
    free(v);
    ndm_array got[N_MODES][2];
    for (int md = 0; md < N_MODES; md++) {
        int keep = mode_enter(md);
        got[md][0] = ndm_conv2d_backward_input(dy, w, &o, 4, s.x);
        got[md][1] = ndm_conv2d_backward_weight(dy, x, &o, 4, s.w);
        mode_leave(keep);
    }
    for (int i = 0; i < 2; i++) {
        double *r = read_array(got[0][i]);
        for (int md = 1; md < N_MODES; md++) {
            double *f = read_array(got[md][i]);
            char what[64];
            snprintf(what, sizeof what, "%s gradient: %s vs reference", i ? "weight" : "input",
                     modes[md].name);
            assert_close_all(f, r, ndm_array_size(got[0][i]), 1e-12, 1e-12, what);
            free(f);
            release(got[md][i]);
        }
        free(r);
        release(got[0][i]);
    }
    release(x), release(w), release(dy);
}

/* The packed gradients: the weight's from each sample's dy packed and
 * unfold(x)^T written straight into the panels (more than 64 taps), the
 * input's from W^T packed once per call. Kernels 1, 3 and 5, strides 2,
 * padding, dilation, groups, channels that fill no panel, a batch of 1,
 * 400 pixels (two depth blocks of the weight's product) and 1152 taps
 * (more rows of W^T than one row block), in every mode. */
static void test_conv2d_backward_packed_odd_shapes(void **state)
{
    rng g = rng_new(15);
    static const conv_case odd[] = {
        {1, 9, 8, 7, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
        {3, 8, 9, 11, 6, 5, 5, {2, 2}, {2, 2}, {1, 1}, 1},
        {2, 10, 7, 9, 7, 3, 5, {1, 2}, {1, 2}, {2, 1}, 1},
        {2, 70, 5, 6, 11, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},
        {2, 75, 7, 6, 9, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1},
        {2, 24, 6, 6, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2},
        {2, 8, 20, 20, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
        {1, 128, 5, 5, 64, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
    };
    for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++) {
        char what[32];
        snprintf(what, sizeof what, "case %zu", c);
        check_grads(ROOT(state), &g, &odd[c], NDM_F32, what);
        check_grads(ROOT(state), &g, &odd[c], NDM_F64, what);
    }
}

/* Operands as views: x stored NHWC, w stored (O, KH, KW, C) (the fast
 * input gradient gathers it), grad_out transposed (no single pixel
 * stride: gathered a tile at a time), read backwards, and broadcast from
 * one value per channel (stride 0). */
static void test_conv2d_backward_views_and_broadcast(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(15);
    conv_case k = {3, 5, 8, 7, 4, 3, 3, {1, 2}, {1, 1}, {1, 1}, 1};
    shapes s = shapes_of(&k); /* y: 3, 4, 8, 4 */
    double xn[3 * 8 * 7 * 5], wn[4 * 3 * 3 * 5], dn[3 * 4 * 4 * 8], dc[4];
    ndm_array xs = rand_array(m, &g, NDM_F32, xn, 4, (int64_t[]){3, 8, 7, 5});
    ndm_array ws = rand_array(m, &g, NDM_F32, wn, 4, (int64_t[]){4, 3, 3, 5});
    ndm_array dt = rand_array(m, &g, NDM_F32, dn, 4, (int64_t[]){3, 4, 4, 8});
    ndm_array d1 = rand_array(m, &g, NDM_F32, dc, 4, (int64_t[]){1, 4, 1, 1});
    ndm_array x = ndm_permute(xs, 4, ((const int[]){0, 3, 1, 2}));
    ndm_array w = ndm_permute(ws, 4, ((const int[]){0, 3, 1, 2}));
    ndm_array dyt = ndm_swapaxes(dt, 2, 3);
    ndm_array dyr = ndm_slice(dyt, 3, NDM_END, -5, -1);
    ndm_array dyb = ndm_expand(d1, 4, s.y);
    assert_live(dyr);
    assert_live(dyb);
    double *xv = read_array(x), *wv = read_array(w);
    ndm_array views[3] = {dyt, dyr, dyb};
    for (int i = 0; i < 3; i++) {
        double *dv = read_array(views[i]);
        for (int md = 0; md < N_MODES; md++) {
            char what[64];
            snprintf(what, sizeof what, "%s, %s",
                     i == 0 ? "transposed" : i == 1 ? "reversed" : "broadcast", modes[md].name);
            int keep = mode_enter(md);
            check_grads_on(&k, x, xv, w, wv, views[i], dv, what);
            mode_leave(keep);
        }
        free(dv);
    }
    /* a 1x1 kernel reads x's pixels in place, x a view */
    conv_case one = {3, 5, 8, 7, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1};
    double w1[2 * 5], d2[3 * 2 * 8 * 7];
    ndm_array w1a = rand_array(m, &g, NDM_F32, w1, 4, (int64_t[]){2, 5, 1, 1});
    ndm_array dy1 = rand_array(m, &g, NDM_F32, d2, 4, (int64_t[]){3, 2, 8, 7});
    for (int md = 0; md < N_MODES; md++) {
        int keep = mode_enter(md);
        check_grads_on(&one, x, xv, w1a, w1, dy1, d2, modes[md].name);
        mode_leave(keep);
    }
    free(xv), free(wv);
    release(x), release(w), release(dyt), release(dyr), release(dyb), release(xs), release(ws);
    release(dt), release(d1), release(w1a), release(dy1);
}

static ndm__tensor tensor_of(ndm_array a, int64_t *shape, int64_t *strides)
{
    assert_int_equal(ndm_array_shape(a, shape, 4), 4);
    assert_int_equal(ndm_array_strides(a, strides, 4), 4);
    return (ndm__tensor){ndm_array_data(a), ndm_array_dtype(a), 4, shape, strides};
}

/* The fast kernels stay inside the workspace they are given: sized for one
 * thread, then run with the pool grown to three, they fall back to one
 * part; given none when they need some, they refuse. */
static void test_conv2d_backward_kernels_fit_their_workspace(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(18);
    conv_case k = {6, 2, 9, 9, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
    shapes s = shapes_of(&k);
    double xv[6 * 2 * 9 * 9], wv[8 * 2 * 3 * 3], dyv[6 * 8 * 9 * 9];
    ndm_array x = rand_array(m, &g, NDM_F64, xv, 4, s.x);
    ndm_array w = rand_array(m, &g, NDM_F64, wv, 4, s.w);
    ndm_array dy = rand_array(m, &g, NDM_F64, dyv, 4, s.y);
    ndm_array dx = ndm_zeros(m, NDM_F64, 4, s.x), dw = ndm_zeros(m, NDM_F64, 4, s.w);
    int64_t sh[5][4], st[5][4];
    ndm__tensor tx = tensor_of(x, sh[0], st[0]), tw = tensor_of(w, sh[1], st[1]);
    ndm__tensor ty = tensor_of(dy, sh[2], st[2]), tdx = tensor_of(dx, sh[3], st[3]);
    ndm__tensor tdw = tensor_of(dw, sh[4], st[4]);
    ndm__conv2d_geom geo = {{1, 1}, {1, 1}, {1, 1}, 1};
    const struct ndm__backend_nn *nn = ndm__cpu_backend.nn;
    int keep = ndm__set_num_threads(1);
    size_t in1 = nn->conv2d_backward_input_workspace(0, &tdx, &ty, &tw, &geo);
    size_t wt1 = nn->conv2d_backward_weight_workspace(0, &tdw, &ty, &tx, &geo);
    ndm__set_num_threads(3);
    assert_true(nn->conv2d_backward_weight_workspace(0, &tdw, &ty, &tx, &geo) > wt1);
    void *wsi = aligned_alloc(64, in1), *wsw = aligned_alloc(64, wt1);
    assert_non_null(wsi);
    assert_non_null(wsw);
    assert_ok(nn->conv2d_backward_input(0, &tdx, &ty, &tw, &geo, wsi, in1));
    assert_ok(nn->conv2d_backward_weight(0, &tdw, &ty, &tx, &geo, wsw, wt1));
    assert_status(nn->conv2d_backward_input(0, &tdx, &ty, &tw, &geo, NULL, 0), NDM_E_INVALID);
    assert_status(nn->conv2d_backward_weight(0, &tdw, &ty, &tx, &geo, NULL, 0), NDM_E_INVALID);
    ndm__set_num_threads(keep);
    free(wsi), free(wsw);
    grads r = ref_grads(&k, xv, wv, dyv);
    check_sum(dx, r.dx, r.sx, 8 * 9, "input gradient");
    check_sum(dw, r.dw, r.sw, 6 * 81, "weight gradient");
    free_grads(&r);
    release(x), release(w), release(dy), release(dx), release(dw);
}

/* ---- pooling ------------------------------------------------------------------ */

typedef struct pool_case {
    int64_t k[2], s[2], p[2];
} pool_case;

static ndm_pool2d_opts pool_opts(const pool_case *pc)
{
    return (ndm_pool2d_opts){{pc->k[0], pc->k[1]}, {pc->s[0], pc->s[1]}, {pc->p[0], pc->p[1]}};
}

static void pool_out(const int64_t *x, const pool_case *pc, int64_t *y)
{
    for (int i = 0; i < 2; i++) {
        int64_t s = pc->s[i] ? pc->s[i] : pc->k[i];
        y[2 + i] = (x[2 + i] + 2 * pc->p[i] - pc->k[i]) / s + 1;
    }
    y[0] = x[0], y[1] = x[1];
}

/* The gradient by the definition: each window in turn, the max by the
 * forward's comparison from the window's first element, the average over
 * the forward's divisor. */
static double *ref_pool_grad(const double *x, const double *dy, const int64_t *xs,
                             const pool_case *pc, bool max, bool cip, double **scale)
{
    int64_t ys[4];
    pool_out(xs, pc, ys);
    int64_t sh = pc->s[0] ? pc->s[0] : pc->k[0], sw = pc->s[1] ? pc->s[1] : pc->k[1];
    int64_t H = xs[2], W = xs[3];
    double *dx = calloc((size_t)shape_numel(4, xs) + 1, sizeof(double));
    double *sc = *scale = calloc((size_t)shape_numel(4, xs) + 1, sizeof(double));
    for (int64_t nc = 0; nc < xs[0] * xs[1]; nc++)
        for (int64_t i = 0; i < ys[2]; i++)
            for (int64_t j = 0; j < ys[3]; j++) {
                double d = dy[(nc * ys[2] + i) * ys[3] + j];
                int64_t best = -1, cnt = 0;
                for (int64_t p = 0; p < pc->k[0]; p++)
                    for (int64_t q = 0; q < pc->k[1]; q++) {
                        int64_t ih = i * sh - pc->p[0] + p, iw = j * sw - pc->p[1] + q;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                            continue;
                        int64_t at = (nc * H + ih) * W + iw;
                        cnt++;
                        if (best < 0 || x[at] > x[best] || isnan(x[at]))
                            best = at;
                    }
                if (max && best >= 0) {
                    dx[best] += d;
                    sc[best] += fabs(d);
                    continue;
                }
                if (max || !cnt)
                    continue;
                double div = (double)(cip ? pc->k[0] * pc->k[1] : cnt);
                for (int64_t p = 0; p < pc->k[0]; p++)
                    for (int64_t q = 0; q < pc->k[1]; q++) {
                        int64_t ih = i * sh - pc->p[0] + p, iw = j * sw - pc->p[1] + q;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
                            dx[(nc * H + ih) * W + iw] += d / div;
                            sc[(nc * H + ih) * W + iw] += fabs(d / div);
                        }
                    }
            }
    return dx;
}

/* One pooling gradient of x (values xv) against the definition; dy is a
 * view whose C-order values are dyv. */
static void check_pool_grad(ndm_array x, const double *xv, ndm_array dy, const double *dyv,
                            const pool_case *pc, bool max, bool cip, const char *what)
{
    int nd;
    int64_t *xs = shape_of(x, &nd);
    ndm_pool2d_opts o = pool_opts(pc);
    ndm_array dx = max ? ndm_max_pool2d_backward(dy, x, &o)
                       : ndm_avg_pool2d_backward(dy, cip, &o, 4, xs);
    if (!dx.id)
        fail_msg("%s: %s", what, ndm_last_error());
    assert_shape(dx, xs[0], xs[1], xs[2], xs[3]);
    ndm_dtype t = ndm_array_dtype(dy);
    assert_int_equal(ndm_array_dtype(dx), t);
    double *scale, *want = ref_pool_grad(xv, dyv, xs, pc, max, cip, &scale);
    char msg[128];
    snprintf(msg, sizeof msg, "%s %s gradient", what, max ? "max" : cip ? "avg+pad" : "avg");
    /* at most k0*k1 shares add up in one element */
    check_sum(dx, want, scale, pc->k[0] * pc->k[1], msg);
    free(want), free(scale), free(xs);
    release(dx);
}

static const pool_case pools[] = {
    {{2, 2}, {0, 0}, {0, 0}}, {{3, 3}, {1, 1}, {1, 1}}, {{3, 3}, {2, 2}, {1, 1}},
    {{2, 3}, {1, 2}, {1, 1}}, {{7, 6}, {0, 0}, {0, 0}}, {{1, 1}, {2, 3}, {0, 0}},
    {{4, 2}, {3, 1}, {2, 1}},
};
#define N_POOLS (sizeof pools / sizeof pools[0])

static void test_pool2d_backward_matches_direct_loops(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(16);
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    const int64_t xs[4] = {2, 3, 7, 6};
    for (int t = 0; t < 4; t++) {
        double xv[2 * 3 * 7 * 6];
        ndm_array x = rand_array(m, &g, types[t], xv, 4, xs);
        for (size_t p = 0; p < N_POOLS; p++) {
            int64_t ys[4];
            pool_out(xs, &pools[p], ys);
            double dyv[2 * 3 * 7 * 6];
            ndm_array dy = rand_array(m, &g, types[t], dyv, 4, ys);
            for (int md = 0; md < N_MODES; md++) {
                int keep = mode_enter(md);
                check_pool_grad(x, xv, dy, dyv, &pools[p], true, false, modes[md].name);
                check_pool_grad(x, xv, dy, dyv, &pools[p], false, false, modes[md].name);
                check_pool_grad(x, xv, dy, dyv, &pools[p], false, true, modes[md].name);
                mode_leave(keep);
            }
            release(dy);
        }
        release(x);
    }
    /* views: x with H and W swapped, grad_out transposed and broadcast */
    double xv[2 * 3 * 7 * 6], dv[2 * 3 * 3 * 4], d1[3];
    ndm_array xb = rand_array(m, &g, NDM_F32, xv, 4, xs);
    ndm_array x = ndm_swapaxes(xb, 2, 3); /* 2, 3, 6, 7 */
    ndm_array db = rand_array(m, &g, NDM_F32, dv, 4, (int64_t[]){2, 3, 4, 3});
    ndm_array dy = ndm_swapaxes(db, 2, 3); /* 2, 3, 3, 4: kernel 3, stride 2, padding 1 */
    ndm_array dc = rand_array(m, &g, NDM_F32, d1, 4, (int64_t[]){1, 3, 1, 1});
    ndm_array dyb = ndm_expand(dc, NDM_SHAPE(2, 3, 3, 4));
    double *xtv = read_array(x), *dyv = read_array(dy), *dbv = read_array(dyb);
    for (int md = 0; md < N_MODES; md++) {
        int keep = mode_enter(md);
        for (int cip = 0; cip < 2; cip++) {
            check_pool_grad(x, xtv, dy, dyv, &pools[2], !cip, false, "views");
            check_pool_grad(x, xtv, dyb, dbv, &pools[2], false, cip, "broadcast");
        }
        check_pool_grad(x, xtv, dyb, dbv, &pools[2], true, false, "broadcast");
        mode_leave(keep);
    }
    free(xtv), free(dyv), free(dbv);
    release(x), release(xb), release(dy), release(db), release(dyb), release(dc);
    /* many planes: split over the pool */
    double *big = malloc(sizeof(double) * 32 * 16 * 12 * 12);
    double *bdy = malloc(sizeof(double) * 32 * 16 * 12 * 12);
    const int64_t bs[4] = {32, 16, 12, 12};
    xb = rand_array(m, &g, NDM_F32, big, 4, bs);
    for (int p = 0; p < 2; p++) {
        int64_t ys[4];
        pool_out(bs, &pools[p], ys);
        dy = rand_array(m, &g, NDM_F32, bdy, 4, ys);
        check_pool_grad(xb, big, dy, bdy, &pools[p], p == 0, false, "many planes");
        release(dy);
    }
    release(xb);
    free(big), free(bdy);
}

/* sum(pool(x) * r) in float64. */
static double pool_loss(ndm_array x, const ndm_pool2d_opts *o, bool max, bool cip, const double *r)
{
    ndm_array y = max ? ndm_max_pool2d(x, o) : ndm_avg_pool2d(x, cip, o);
    assert_live(y);
    double *v = read_array(y), s = 0;
    for (int64_t i = 0; i < ndm_array_size(y); i++)
        s += v[i] * r[i];
    free(v);
    release(y);
    return s;
}

/* Central differences of the forward: x holds distinct values 1/64 apart,
 * so a step of 1/1024 never changes which element a max picks. */
static void test_pool2d_backward_central_differences(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(17);
    const int64_t xs[4] = {2, 2, 7, 6};
    int64_t n = shape_numel(4, xs);
    double xv[2 * 2 * 7 * 6], rv[2 * 2 * 7 * 6];
    for (int64_t i = 0; i < n; i++)
        xv[i] = (double)i / 64 - 1;
    for (int64_t i = n - 1; i > 0; i--) { /* shuffle */
        int64_t j = (int64_t)(rng_next(&g) % (uint64_t)(i + 1));
        double t = xv[i];
        xv[i] = xv[j], xv[j] = t;
    }
    ndm_array x = make_array(m, NDM_F64, xv, 4, xs);
    double *p = ndm_array_data(x);
    const double h = 1.0 / 1024;
    for (size_t c = 0; c < N_POOLS; c++)
        for (int kind = 0; kind < 3; kind++) {
            bool max = kind == 0, cip = kind == 2;
            ndm_pool2d_opts o = pool_opts(&pools[c]);
            int64_t ys[4];
            pool_out(xs, &pools[c], ys);
            ndm_array dy = rand_array(m, &g, NDM_F64, rv, 4, ys);
            ndm_array dx = max ? ndm_max_pool2d_backward(dy, x, &o)
                               : ndm_avg_pool2d_backward(dy, cip, &o, 4, xs);
            assert_live(dx);
            double *grad = read_array(dx);
            for (int64_t i = 0; i < n; i++) {
                double keep = p[i];
                p[i] = keep + h;
                double up = pool_loss(x, &o, max, cip, rv);
                p[i] = keep - h;
                double down = pool_loss(x, &o, max, cip, rv);
                p[i] = keep;
                double fd = (up - down) / (2 * h);
                if (fabs(fd - grad[i]) > 1e-9 * (1 + fabs(fd)))
                    fail_msg("pool %zu kind %d: element %lld: central difference %.17g, "
                             "gradient %.17g",
                             c, kind, (long long)i, fd, grad[i]);
            }
            free(grad);
            release(dx), release(dy);
        }
    release(x);
}

/* Gradient of a 1-plane max pooling of v (h x w) with dy all `d`. */
static double *max_grad(ndm_manager m, ndm_dtype t, double *v, int64_t h, int64_t w,
                        const ndm_pool2d_opts *o, double d)
{
    ndm_array x = make_array(m, t, v, NDM_SHAPE(1, 1, h, w));
    ndm_array y = ndm_max_pool2d(x, o);
    assert_live(y);
    int nd;
    int64_t *ys = shape_of(y, &nd);
    ndm_array dy = ndm_full(m, t, d, 4, ys);
    ndm_array dx = ndm_max_pool2d_backward(dy, x, o);
    assert_live(dx);
    double *g = read_array(dx);
    free(ys);
    release(x), release(y), release(dy), release(dx);
    return g;
}

/* The element the forward picks: the first of equal maxima, the last NaN,
 * the first of a window of -inf, a real element over the padding; and
 * overlapping windows adding up on a shared maximum. */
static void test_max_pool2d_backward_picks_the_forwards_element(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    for (int t = 0; t < 4; t++)
        for (int md = 0; md < N_MODES; md++) {
            int keep = mode_enter(md);
            ndm_pool2d_opts k2 = {{2, 2}, {0, 0}, {0, 0}};
            double ties[8] = {1, 3, 3, 2, 3, 0, 1, 3};
            double *g = max_grad(m, types[t], ties, 2, 4, &k2, 10);
            const double want_ties[8] = {0, 10, 10, 0, 0, 0, 0, 0};
            assert_close_all(g, want_ties, 8, 0, 0, "ties go to the first");
            free(g);
            double nans[8] = {NAN, 5, 2, NAN, NAN, 1, NAN, 7};
            g = max_grad(m, types[t], nans, 2, 4, &k2, 10);
            const double want_nans[8] = {0, 0, 0, 0, 10, 0, 10, 0};
            assert_close_all(g, want_nans, 8, 0, 0, "the last NaN");
            free(g);
            double infs[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
            g = max_grad(m, types[t], infs, 2, 2, &k2, 10);
            const double want_infs[4] = {10, 0, 0, 0};
            assert_close_all(g, want_infs, 4, 0, 0, "a window of -inf");
            free(g);
            /* every 3x3 window around a 2x2 plane covers all of it: padding never wins */
            ndm_pool2d_opts pad = {{3, 3}, {1, 1}, {1, 1}};
            double neg[4] = {-4, -3, -2, -1};
            g = max_grad(m, types[t], neg, 2, 2, &pad, 1.5);
            const double want_neg[4] = {0, 0, 0, 6};
            assert_close_all(g, want_neg, 4, 0, 0, "padding never wins");
            free(g);
            double peak[9] = {1, 2, 3, 4, 9, 5, 6, 7, 8};
            ndm_pool2d_opts k2s1 = {{2, 2}, {1, 1}, {0, 0}};
            g = max_grad(m, types[t], peak, 3, 3, &k2s1, 2);
            const double want_peak[9] = {0, 0, 0, 0, 8, 0, 0, 0, 0};
            assert_close_all(g, want_peak, 9, 0, 0, "overlapping windows add up");
            free(g);
            mode_leave(keep);
        }
}

/* Max pooling's 2x2, stride-2 kernel over planes with odd sides, values
 * drawn from a few levels (many ties) with NaNs sprinkled in, against the
 * definition; the kernel's dx first holds NaNs, so an element it fails to
 * write (the odd last row and column) shows. */
static void test_max_pool2d_backward_2x2_ties_nans_odd_sides(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(29);
    const int64_t xs[4] = {3, 5, 13, 17};
    int64_t n = shape_numel(4, xs);
    pool_case pc = {{2, 2}, {0, 0}, {0, 0}};
    int64_t ys[4];
    pool_out(xs, &pc, ys);
    double *xv = malloc((size_t)n * sizeof(double)), *dyv = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = (uint64_t)(i * 2654435761u) ^ (uint64_t)(i >> 3);
        xv[i] = r % 11 == 0 ? NAN : (double)(r % 3);
    }
    /* the CPU kernel itself, on a dx that holds NaNs */
    int64_t xst[4] = {xs[1] * xs[2] * xs[3], xs[2] * xs[3], xs[3], 1};
    int64_t yst[4] = {ys[1] * ys[2] * ys[3], ys[2] * ys[3], ys[3], 1};
    int64_t ny = shape_numel(4, ys);
    float *xf = malloc((size_t)n * sizeof(float)), *dxf = malloc((size_t)n * sizeof(float));
    float *dyf = malloc((size_t)ny * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        xf[i] = (float)xv[i];
    for (int64_t i = 0; i < ny; i++)
        dyf[i] = (float)(dyv[i] = (double)(i % 7) - 2.5);
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CPU);
    for (int max = 0; max < 2; max++)
        for (int md = 0; md < N_MODES; md++) {
            int keep = mode_enter(md);
            ndm__tensor tx = {xf, NDM_F32, 4, xs, xst}, tdx = {dxf, NDM_F32, 4, xs, xst};
            ndm__tensor tdy = {dyf, NDM_F32, 4, ys, yst};
            ndm__pool2d_geom geom = {{2, 2}, {2, 2}, {0, 0}, max, false};
            for (int64_t i = 0; i < n; i++)
                dxf[i] = NAN;
            assert_ok(b->nn->pool2d_backward(0, &tdx, &tdy, &tx, &geom));
            double *scale, *want = ref_pool_grad(xv, dyv, xs, &pc, max, false, &scale);
            for (int64_t i = 0; i < n; i++)
                if (!((double)dxf[i] == want[i]))
                    fail_msg("%s, mode %d: dx[%lld] = %g, want %g", max ? "max" : "avg", md,
                             (long long)i, (double)dxf[i], want[i]);
            free(want), free(scale);
            mode_leave(keep);
        }
    free(xf), free(dxf), free(dyf);
    /* and through the API */
    for (int md = 0; md < N_MODES; md++) {
        int keep = mode_enter(md);
        ndm_array x = make_array(m, NDM_F32, xv, 4, xs);
        ndm_array dy = rand_array(m, &g, NDM_F32, dyv, 4, ys);
        check_pool_grad(x, xv, dy, dyv, &pc, true, false, "2x2 ties and NaNs");
        check_pool_grad(x, xv, dy, dyv, &pc, false, false, "2x2 average");
        release(x), release(dy);
        mode_leave(keep);
    }
    free(xv), free(dyv);
}

/* A 2x2 plane of ones under a 2x2 window, stride 1, padding 1 (3x3
 * windows): with count_include_pad every window divides by 4, without it
 * corner windows by 1, edge ones by 2, the middle one by 4. */
static void test_avg_pool2d_backward_divisors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_pool2d_opts o = {{2, 2}, {1, 1}, {1, 1}};
    double dv[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    ndm_array dy = make_array(m, NDM_F64, dv, NDM_SHAPE(1, 1, 3, 3));
    for (int md = 0; md < N_MODES; md++) {
        int keep = mode_enter(md);
        ndm_array a = ndm_avg_pool2d_backward(dy, true, &o, NDM_SHAPE(1, 1, 2, 2));
        ndm_array b = ndm_avg_pool2d_backward(dy, false, &o, NDM_SHAPE(1, 1, 2, 2));
        double *ga = read_array(a), *gb = read_array(b);
        /* element (0, 0) is in windows (0,0) (0,1) (1,0) (1,1) */
        const double want_a[4] = {(1 + 2 + 4 + 5) / 4.0, (2 + 3 + 5 + 6) / 4.0,
                                  (4 + 5 + 7 + 8) / 4.0, (5 + 6 + 8 + 9) / 4.0};
        const double want_b[4] = {1 + 2 / 2.0 + 4 / 2.0 + 5 / 4.0, 3 + 2 / 2.0 + 6 / 2.0 + 5 / 4.0,
                                  7 + 4 / 2.0 + 8 / 2.0 + 5 / 4.0, 9 + 6 / 2.0 + 8 / 2.0 + 5 / 4.0};
        assert_close_all(ga, want_a, 4, 1e-15, 0, "count_include_pad");
        assert_close_all(gb, want_b, 4, 1e-15, 0, "without count_include_pad");
        free(ga), free(gb);
        release(a), release(b);
        mode_leave(keep);
    }
    release(dy);
}

/* ---- errors, null inputs, the output rule --------------------------------------- */

static void test_conv2d_backward_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 4, 5, 5));
    ndm_array w = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 4, 3, 3));
    ndm_array dy = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 6, 3, 3));
    ndm_array w64 = ndm_zeros(m, NDM_F64, NDM_SHAPE(6, 4, 3, 3));
    ndm_array dyi = ndm_zeros(m, NDM_I32, NDM_SHAPE(2, 6, 3, 3));
    ndm_array dy3 = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 3, 3));
    assert_fails(ndm_conv2d_backward_input(dy, w64, NULL, NDM_SHAPE(2, 4, 5, 5)), NDM_E_DTYPE,
                 "share one float dtype (got f32, f64)");
    assert_fails(ndm_conv2d_backward_input(dyi, w, NULL, NDM_SHAPE(2, 4, 5, 5)), NDM_E_DTYPE,
                 "i32");
    assert_fails(ndm_conv2d_backward_weight(dy, ndm_zeros(m, NDM_F64, NDM_SHAPE(2, 4, 5, 5)),
                                            NULL, NDM_SHAPE(6, 4, 3, 3)),
                 NDM_E_DTYPE, "grad_out and input must share one float dtype");
    assert_fails(ndm_conv2d_backward_input(dy3, w, NULL, NDM_SHAPE(2, 4, 5, 5)), NDM_E_SHAPE,
                 "must be 4-d, got f32[6,3,3]");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(4, 5, 5)), NDM_E_SHAPE,
                 "the input shape must have 4 dims, got 3");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(2, 4, -5, 5)), NDM_E_SHAPE,
                 "negative size -5");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, 4, NULL), NDM_E_SHAPE, "NULL");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(2, 4, 7, 5)), NDM_E_SHAPE,
                 "grad_out f32[2,6,3,3] is not the forward's output: input f32[2,4,7,5] with "
                 "weight f32[6,4,3,3] gives [2,6,5,3]");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(3, 4, 5, 5)), NDM_E_SHAPE,
                 "gives [3,6,3,3]");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(2, 3, 5, 5)), NDM_E_SHAPE,
                 "do not match with 1 groups");
    assert_fails(ndm_conv2d_backward_input(dy, w, NDM_CONV2D(.padding = {-1, 0}),
                                           NDM_SHAPE(2, 4, 5, 5)),
                 NDM_E_INVALID, ">= 0");
    assert_fails(ndm_conv2d_backward_input(dy, w, NULL, NDM_SHAPE(2, 4, 2, 5)), NDM_E_SHAPE,
                 "does not fit");
    assert_fails(ndm_conv2d_backward_weight(dy, x, NULL, NDM_SHAPE(6, 4, 2, 2)), NDM_E_SHAPE,
                 "gives [2,6,4,4]");
    assert_fails(ndm_conv2d_backward_weight(dy, x, NULL, NDM_SHAPE(6, 2, 3, 3)), NDM_E_SHAPE,
                 "do not match with 1 groups");
    assert_fails(ndm_conv2d_backward_weight(dy, x, NULL, NDM_SHAPE(6, 4, 3)), NDM_E_SHAPE,
                 "the weight shape must have 4 dims");
    assert_fails(ndm_conv2d_backward_weight(dy, x, NDM_CONV2D(.groups = 2), NDM_SHAPE(6, 4, 3, 3)),
                 NDM_E_SHAPE, "do not match with 2 groups");
    assert_fails(ndm_conv2d_backward_weight(dy, x, NDM_CONV2D(.stride = {2, 2}),
                                            NDM_SHAPE(6, 4, 3, 3)),
                 NDM_E_SHAPE, "gives [2,6,2,2]");
    /* with a stride, two input sizes give the same output: each gets its shape */
    ndm_array s4 = ndm_conv2d_backward_input(dy, w, NDM_CONV2D(.stride = {2, 2}, .padding = {1, 1}),
                                             NDM_SHAPE(2, 4, 5, 5));
    ndm_array s5 = ndm_conv2d_backward_input(dy, w, NDM_CONV2D(.stride = {2, 2}, .padding = {1, 1}),
                                             NDM_SHAPE(2, 4, 6, 6));
    assert_shape(s4, 2, 4, 5, 5);
    assert_shape(s5, 2, 4, 6, 6);
    assert_ok(ndm_scope_release_all(m));
}

static void test_pool2d_backward_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 2, 4, 4));
    ndm_array dy = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 2, 2, 2));
    ndm_array dy64 = ndm_zeros(m, NDM_F64, NDM_SHAPE(1, 2, 2, 2));
    ndm_array dyu = ndm_zeros(m, NDM_U8, NDM_SHAPE(1, 2, 2, 2));
    ndm_array dy2 = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 2));
    const ndm_pool2d_opts *k2 = NDM_POOL2D(.kernel = {2, 2});
    assert_fails(ndm_max_pool2d_backward(dy, x, NULL), NDM_E_INVALID, "kernel size");
    assert_fails(ndm_avg_pool2d_backward(dy, false, NULL, NDM_SHAPE(1, 2, 4, 4)), NDM_E_INVALID,
                 "kernel size");
    assert_fails(ndm_max_pool2d_backward(dy64, x, k2), NDM_E_DTYPE, "(got f64, f32)");
    assert_fails(ndm_avg_pool2d_backward(dyu, false, k2, NDM_SHAPE(1, 2, 4, 4)), NDM_E_DTYPE,
                 "u8");
    assert_fails(ndm_max_pool2d_backward(dy2, x, k2), NDM_E_SHAPE, "must be 4-d");
    assert_fails(ndm_avg_pool2d_backward(dy2, true, k2, NDM_SHAPE(1, 2, 4, 4)), NDM_E_SHAPE,
                 "4-d");
    assert_fails(ndm_max_pool2d_backward(dy, x, NDM_POOL2D(.kernel = {2, 2}, .stride = {1, 1})),
                 NDM_E_SHAPE, "grad_out f32[1,2,2,2] is not the forward's output: input "
                              "f32[1,2,4,4] gives [1,2,3,3]");
    assert_fails(ndm_avg_pool2d_backward(dy, true, k2, NDM_SHAPE(1, 2, 6, 4)), NDM_E_SHAPE,
                 "gives [1,2,3,2]");
    assert_fails(ndm_avg_pool2d_backward(dy, true, k2, NDM_SHAPE(1, 2, 4)), NDM_E_SHAPE,
                 "must have 4 dims");
    assert_fails(ndm_avg_pool2d_backward(dy, true, NDM_POOL2D(.kernel = {2, 2}, .padding = {2, 0}),
                                         NDM_SHAPE(1, 2, 4, 4)),
                 NDM_E_INVALID, "half the kernel");
    /* odd sizes: the last row and column no window reads get zeros */
    ndm_array a = ndm_avg_pool2d_backward(ndm_ones(m, NDM_F32, NDM_SHAPE(1, 2, 2, 2)), false, k2,
                                          NDM_SHAPE(1, 2, 5, 5));
    assert_live(a);
    double *v = read_array(a);
    assert_true(v[0] == 0.25 && v[4] == 0 && v[20] == 0 && v[24] == 0);
    free(v);
    assert_ok(ndm_scope_release_all(m));
}

static void test_conv2d_backward_null_and_stale_inputs(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 3, 3));
    ndm_array w = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 2, 2));
    ndm_array dy = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 2, 2));
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 2, 2));
    release(gone);
    assert_fails(ndm_conv2d_backward_input(NDM_NULL_ARRAY, w, NULL, NDM_SHAPE(1, 1, 3, 3)),
                 NDM_E_NULL, "null");
    assert_fails(ndm_conv2d_backward_input(dy, gone, NULL, NDM_SHAPE(1, 1, 3, 3)), NDM_E_CLOSED,
                 "stale array handle");
    assert_fails(ndm_conv2d_backward_weight(gone, x, NULL, NDM_SHAPE(1, 1, 2, 2)), NDM_E_CLOSED,
                 "stale array handle");
    assert_fails(ndm_max_pool2d_backward(dy, NDM_NULL_ARRAY, NDM_POOL2D(.kernel = {2, 2})),
                 NDM_E_NULL, "null");
    /* a failed operand propagates: the first error is kept */
    ndm_array fns[4];
    ndm_clear_error();
    ndm_array bad = ndm_sum(gone, false, NDM_ALL_AXES_LIST);
    fns[0] = ndm_conv2d_backward_input(bad, w, NULL, NDM_SHAPE(1, 1, 3, 3));
    fns[1] = ndm_conv2d_backward_weight(dy, bad, NULL, NDM_SHAPE(1, 1, 2, 2));
    fns[2] = ndm_max_pool2d_backward(bad, x, NDM_POOL2D(.kernel = {2, 2}));
    fns[3] = ndm_avg_pool2d_backward(bad, true, NDM_POOL2D(.kernel = {2, 2}),
                                     NDM_SHAPE(1, 1, 3, 3));
    for (int i = 0; i < 4; i++)
        assert_true(fns[i].id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("ndm_sum");
    assert_int_equal(test_live_arrays(m), 3);
    release(x), release(w), release(dy);
}

/* The result follows grad_out (not the weight or x), a named manager, the
 * innermost scope; no temporary stays; every allocation of an f16
 * gradient failing in turn leaves nothing; a capped manager refuses. */
static void test_conv2d_backward_output_rule_and_allocations(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager grads_m = ndm_manager_new(m, "grads");
    ndm_manager params = ndm_manager_new(m, "params");
    ndm_manager named = ndm_manager_new(m, "named");
    ndm_array x = ndm_ones(params, NDM_F16, NDM_SHAPE(2, 2, 4, 4));
    ndm_array w = ndm_ones(params, NDM_F16, NDM_SHAPE(3, 2, 3, 3));
    ndm_array dy = ndm_ones(grads_m, NDM_F16, NDM_SHAPE(2, 3, 4, 4));
    ndm_array py = ndm_ones(grads_m, NDM_F16, NDM_SHAPE(2, 2, 2, 2));
    const ndm_conv2d_opts *o = NDM_CONV2D(.padding = {1, 1});
    const ndm_pool2d_opts *k2 = NDM_POOL2D(.kernel = {2, 2});
    ndm_array r[4] = {
        ndm_conv2d_backward_input(dy, w, o, NDM_SHAPE(2, 2, 4, 4)),
        ndm_conv2d_backward_weight(dy, x, o, NDM_SHAPE(3, 2, 3, 3)),
        ndm_max_pool2d_backward(py, x, k2),
        ndm_avg_pool2d_backward(py, true, k2, NDM_SHAPE(2, 2, 4, 4)),
    };
    for (int i = 0; i < 4; i++) {
        assert_live(r[i]);
        assert_true(ndm_array_manager(r[i]).id == grads_m.id);
        assert_int_equal(ndm_array_dtype(r[i]), NDM_F16);
    }
    assert_int_equal(test_live_arrays(grads_m), 6); /* no temporary left */
    assert_int_equal(test_live_arrays(params), 2);
    double v;
    ndm_array e = ndm_select(ndm_select(ndm_select(ndm_select(r[1], 0, 0), 0, 0), 0, 1), 0, 1);
    assert_ok(ndm_item(e, &v));
    assert_true(v == 2 * 16); /* the middle tap reads every pixel of both samples */
    ndm_array t[4] = {
        ndm_conv2d_backward_input_to(named, dy, w, o, NDM_SHAPE(2, 2, 4, 4)),
        ndm_conv2d_backward_weight_to(named, dy, x, o, NDM_SHAPE(3, 2, 3, 3)),
        ndm_max_pool2d_backward_to(named, py, x, k2),
        ndm_avg_pool2d_backward_to(named, py, false, k2, NDM_SHAPE(2, 2, 4, 4)),
    };
    for (int i = 0; i < 4; i++)
        assert_true(ndm_array_manager(t[i]).id == named.id);
    assert_int_equal(test_live_arrays(named), 4);
    ndm_manager s = ndm_scope_begin(m, "step");
    ndm_array a = ndm_conv2d_backward_input(dy, w, o, NDM_SHAPE(2, 2, 4, 4));
    ndm_array b = ndm_max_pool2d_backward(py, x, k2);
    assert_true(ndm_array_manager(a).id == s.id);
    assert_true(ndm_array_manager(b).id == s.id);
    assert_int_equal(test_live_arrays(s), 2);
    assert_ok(ndm_scope_end(s, 1, &a));
    assert_true(ndm_array_manager(a).id == m.id);
    release(a);
    /* every allocation failing in turn: result, converted inputs, f32
     * result, scratch; nothing stays */
    ndm_stats before;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &before));
    for (int op = 0; op < 4; op++) {
        int failures = 0;
        for (int i = 1; i < 12; i++) {
            ndm__alloc_fail_after(i);
            ndm_array g;
            if (op == 0)
                g = ndm_conv2d_backward_input_to(m, dy, w, o, NDM_SHAPE(2, 2, 4, 4));
            else if (op == 1)
                g = ndm_conv2d_backward_weight_to(m, dy, x, o, NDM_SHAPE(3, 2, 3, 3));
            else if (op == 2)
                g = ndm_max_pool2d_backward_to(m, py, x, k2);
            else
                g = ndm_avg_pool2d_backward_to(m, py, true, k2, NDM_SHAPE(2, 2, 4, 4));
            ndm__alloc_fail_after(0);
            if (g.id) {
                release(g);
                break;
            }
            failures++;
            assert_int_equal(ndm_last_status(), NDM_E_OOM);
            ndm_stats now;
            assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &now));
            assert_int_equal(now.live_arrays, before.live_arrays);
        }
        /* result, grad_out and x or w in f32, the f32 result */
        assert_true(failures >= (op == 3 ? 3 : 4));
    }
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array mw = ndm_ones(model, NDM_F32, NDM_SHAPE(3, 2, 3, 3));
    ndm_array mdy = ndm_ones(model, NDM_F32, NDM_SHAPE(1, 3, 2, 2));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_fails(ndm_conv2d_backward_input(mdy, mw, NULL, NDM_SHAPE(1, 2, 4, 4)), NDM_E_CAPPED,
                 "capped");
    assert_int_equal(test_live_arrays(model), 2);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_manager_close(named));
    assert_ok(ndm_manager_close(grads_m));
    assert_ok(ndm_manager_close(params));
    assert_ok(ndm_scope_release_all(m));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_conv2d_backward_matches_direct_loops),
        TEST(test_conv2d_backward_half_precision),
        TEST(test_conv2d_backward_central_differences),
        TEST(test_conv2d_backward_threads_and_tiles),
        TEST(test_conv2d_backward_packed_odd_shapes),
        TEST(test_conv2d_backward_views_and_broadcast),
        TEST(test_conv2d_backward_kernels_fit_their_workspace),
        TEST(test_pool2d_backward_matches_direct_loops),
        TEST(test_pool2d_backward_central_differences),
        TEST(test_max_pool2d_backward_picks_the_forwards_element),
        TEST(test_max_pool2d_backward_2x2_ties_nans_odd_sides),
        TEST(test_avg_pool2d_backward_divisors),
        TEST(test_conv2d_backward_errors),
        TEST(test_pool2d_backward_errors),
        TEST(test_conv2d_backward_null_and_stale_inputs),
        TEST(test_conv2d_backward_output_rule_and_allocations),
    };
    return cmocka_run_group_tests_name("conv_backward", tests, NULL, NULL);
}
