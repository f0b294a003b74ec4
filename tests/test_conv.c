/* conv2d and pooling against direct loops written here: strides, padding,
 * dilation, groups, bias, 1x1 and large convolutions, strided views, every
 * float dtype; the error paths, the output rule, and both CPU tables. */
#include "backends/backend.h"
#include "backends/cpu/parallel.h"
#include "backends/nn.h"
#include "check_numeric.h"
#include "manager/alloc/alloc.h"

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int64_t stride[2], pad[2], dil[2], groups;
    bool bias;
} conv_case;

/* Direct cross-correlation in float64 over C-order values. */
static double *ref_conv(const conv_case *k, const double *x, const double *w, const double *b,
                        int64_t oh, int64_t ow, double **scale)
{
    int64_t og = k->o / k->groups, cg = k->c / k->groups;
    int64_t total = k->n * k->o * oh * ow;
    double *y = calloc((size_t)(total + 1), sizeof(double));
    *scale = calloc((size_t)(total + 1), sizeof(double));
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t o = 0; o < k->o; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double s = b ? b[o] : 0, sc = b ? fabs(b[o]) : 0;
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t p = 0; p < k->kh; p++)
                            for (int64_t q = 0; q < k->kw; q++) {
                                int64_t ih = i * k->stride[0] - k->pad[0] + p * k->dil[0];
                                int64_t iw = j * k->stride[1] - k->pad[1] + q * k->dil[1];
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w)
                                    continue;
                                int64_t ci = (o / og) * cg + c;
                                double t = x[((n * k->c + ci) * k->h + ih) * k->w + iw] *
                                           w[((o * cg + c) * k->kh + p) * k->kw + q];
                                s += t;
                                sc += fabs(t);
                            }
                    int64_t at = ((n * k->o + o) * oh + i) * ow + j;
                    y[at] = s;
                    (*scale)[at] = sc;
                }
    return y;
}

static ndm_array rand_array(ndm_manager m, rng *g, ndm_dtype t, double *x, int nd,
                            const int64_t *shape)
{
    rng_fill(g, t, x, shape_numel(nd, shape));
    return make_array(m, t, x, nd, shape);
}

/* Run one case on x (any view whose C-order values are xv) and w. */
static void check_conv_on(const conv_case *k, ndm_array x, const double *xv, ndm_array w,
                          const double *wv, ndm_array b, const double *bv, const char *what)
{
    ndm_conv2d_opts o = {{k->stride[0], k->stride[1]},
                         {k->pad[0], k->pad[1]},
                         {k->dil[0], k->dil[1]},
                         k->groups};
    ndm_array y = k->bias ? ndm_conv2d_bias(x, w, b, &o) : ndm_conv2d(x, w, &o);
    if (!y.id)
        fail_msg("%s: %s", what, ndm_last_error());
    int64_t oh = (k->h + 2 * k->pad[0] - k->dil[0] * (k->kh - 1) - 1) / k->stride[0] + 1;
    int64_t ow = (k->w + 2 * k->pad[1] - k->dil[1] * (k->kw - 1) - 1) / k->stride[1] + 1;
    assert_shape(y, k->n, k->o, oh, ow);
    ndm_dtype t = ndm_array_dtype(x);
    assert_int_equal(ndm_array_dtype(y), t);
    double *scale;
    double *want = ref_conv(k, xv, wv, k->bias ? bv : NULL, oh, ow, &scale);
    double *got = read_array(y);
    int64_t K = (k->c / k->groups) * k->kh * k->kw;
    double u = t == NDM_F64 ? 1.2e-16 : 6e-8;
    for (int64_t i = 0; i < ndm_array_size(y); i++)
        if (!close_to(got[i], want[i], dtype_rtol(t), 2.0 * (double)(K + 2) * u * scale[i]))
            fail_msg("%s (%s): element %lld is %.17g, expected %.17g", what, ndm_dtype_short(t),
                     (long long)i, got[i], want[i]);
    free(want), free(scale), free(got);
    release(y);
}

static void check_conv(ndm_manager m, rng *g, const conv_case *k, ndm_dtype t, const char *what)
{
    int64_t xs[4] = {k->n, k->c, k->h, k->w};
    int64_t ws[4] = {k->o, k->c / k->groups, k->kh, k->kw};
    double *xv = malloc(sizeof(double) * (size_t)(shape_numel(4, xs) + 1));
    double *wv = malloc(sizeof(double) * (size_t)(shape_numel(4, ws) + 1));
    double *bv = malloc(sizeof(double) * (size_t)(k->o + 1));
    ndm_array x = rand_array(m, g, t, xv, 4, xs);
    ndm_array w = rand_array(m, g, t, wv, 4, ws);
    ndm_array b = rand_array(m, g, t, bv, 1, &k->o);
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        check_conv_on(k, x, xv, w, wv, b, bv, what);
    }
    ndm__cpu_force_reference(false);
    release(x), release(w), release(b);
    free(xv), free(wv), free(bv);
}

static const conv_case cases[] = {
    {2, 3, 7, 6, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {1, 2, 5, 5, 3, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
    {3, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 0}, {2, 1}, 2, true},
    {4, 6, 5, 5, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},  /* 1x1: x is the matrix */
    {4, 6, 5, 5, 9, 1, 1, {1, 1}, {0, 0}, {1, 1}, 3, false}, /* 1x1 in groups */
    {2, 4, 6, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 4, true},  /* depthwise */
    {1, 1, 2, 2, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false}, /* kernel over the edges */
    {2, 3, 11, 13, 5, 5, 3, {3, 2}, {2, 1}, {1, 2}, 1, true},
    {0, 3, 5, 5, 2, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},  /* empty batch */
    {2, 0, 4, 4, 3, 2, 2, {1, 1}, {0, 0}, {1, 1}, 1, true},  /* no input channel: bias */
};

static void test_conv2d_matches_direct_loops(void **state)
{
    rng g = rng_new(1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char what[32];
        snprintf(what, sizeof what, "case %zu", c);
        check_conv(ROOT(state), &g, &cases[c], NDM_F32, what);
        check_conv(ROOT(state), &g, &cases[c], NDM_F64, what);
    }
}

static void test_conv2d_half_precision(void **state)
{
    rng g = rng_new(2);
    check_conv(ROOT(state), &g, &cases[0], NDM_F16, "f16");
    check_conv(ROOT(state), &g, &cases[2], NDM_BF16, "bf16");
}

/* A batch large enough to split over the pool, and a convolution whose
 * unfolded input is cut into tiles. */
static void test_conv2d_parallel_and_tiled(void **state)
{
    rng g = rng_new(3);
    conv_case mnist = {16, 1, 28, 28, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true};
    conv_case deep = {1, 128, 40, 40, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false};
    conv_case wide = {3, 64, 20, 20, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true};
    check_conv(ROOT(state), &g, &mnist, NDM_F32, "mnist batch");
    check_conv(ROOT(state), &g, &deep, NDM_F32, "tiled");
    check_conv(ROOT(state), &g, &wide, NDM_F64, "grouped");
}

/* The fast forward packs the weights once per call and writes each panel
 * of the unfolded input from a padded copy of the sample: kernels 1, 3
 * and 5, strides 2, padding, dilation, channels and filters that fill no
 * panel, a batch of 1 (cut into pixel tiles over the threads), a depth
 * over one block (K = 405) and weights over the row block (200 x 1152),
 * on 1, 2 and 3 threads, with the CPU's micro-kernels and portable C. */
static void test_conv2d_packed_odd_shapes(void **state)
{
    rng g = rng_new(5);
    static const conv_case odd[] = {
        {1, 3, 9, 11, 5, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
        {2, 5, 9, 10, 7, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, false},
        {1, 7, 12, 13, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {3, 6, 11, 9, 13, 5, 5, {2, 2}, {2, 2}, {1, 1}, 1, true},
        {2, 5, 10, 12, 11, 5, 3, {1, 2}, {2, 0}, {2, 1}, 1, false},
        {2, 6, 7, 7, 9, 3, 3, {1, 1}, {2, 2}, {1, 1}, 3, true},
        {2, 45, 8, 7, 10, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {1, 128, 6, 6, 200, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    };
    static const int threads[] = {1, 2, 3};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++)
        for (int isa = 0; isa < 2; isa++) {
            int before = ndm__set_num_threads(threads[t]);
            (void)ndm__cpu_conv_grad_isa(isa); /* 0: the CPU's best; 1: portable C */
            for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++) {
                char what[64];
                snprintf(what, sizeof what, "case %zu, %d threads%s", c, threads[t],
                         isa ? ", portable" : "");
                check_conv(ROOT(state), &g, &odd[c], NDM_F32, what);
                check_conv(ROOT(state), &g, &odd[c], NDM_F64, what);
            }
            (void)ndm__cpu_conv_grad_isa(0);
            ndm__set_num_threads(before);
        }
}

/* Inputs as views: NHWC storage seen as NCHW, and weights stored (O, KH,
 * KW, C) seen as (O, C, KH, KW). */
static void test_conv2d_strided_views(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(4);
    conv_case k = {3, 5, 8, 7, 4, 3, 3, {1, 2}, {1, 1}, {1, 1}, 1, true};
    double xn[3 * 8 * 7 * 5], wn[4 * 3 * 3 * 5], bv[4];
    ndm_array xs = rand_array(m, &g, NDM_F32, xn, 4, (int64_t[]){3, 8, 7, 5});
    ndm_array ws = rand_array(m, &g, NDM_F32, wn, 4, (int64_t[]){4, 3, 3, 5});
    ndm_array b = rand_array(m, &g, NDM_F32, bv, 1, (int64_t[]){4});
    ndm_array x = ndm_permute(xs, 4, ((const int[]){0, 3, 1, 2}));
    ndm_array w = ndm_permute(ws, 4, ((const int[]){0, 3, 1, 2}));
    ndm_array bs = ndm_slice(b, 0, NDM_END, -5, -1); /* bias read backwards */
    double *xv = read_array(x), *wv = read_array(w), *bsv = read_array(bs);
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        check_conv_on(&k, x, xv, w, wv, bs, bsv, "views");
    }
    ndm__cpu_force_reference(false);
    /* the same 1x1 convolution through the direct path, x not contiguous */
    conv_case one = {3, 5, 8, 7, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false};
    double w1[2 * 5];
    ndm_array w1a = rand_array(m, &g, NDM_F32, w1, 4, (int64_t[]){2, 5, 1, 1});
    check_conv_on(&one, x, xv, w1a, w1, NDM_NULL_ARRAY, NULL, "1x1 view");
    free(xv), free(wv), free(bsv);
    release(x), release(w), release(bs), release(xs), release(ws), release(b), release(w1a);
}

typedef struct pool_case {
    int64_t k[2], s[2], p[2];
} pool_case;

static double *ref_pool(const double *x, int64_t N, int64_t C, int64_t H, int64_t W,
                        const pool_case *pc, bool max, bool cip, int64_t oh, int64_t ow)
{
    int64_t sh = pc->s[0] ? pc->s[0] : pc->k[0], sw = pc->s[1] ? pc->s[1] : pc->k[1];
    double *y = calloc((size_t)(N * C * oh * ow + 1), sizeof(double));
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double r = max ? -INFINITY : 0;
                int64_t cnt = 0;
                bool nan = false;
                for (int64_t p = 0; p < pc->k[0]; p++)
                    for (int64_t q = 0; q < pc->k[1]; q++) {
                        int64_t ih = i * sh - pc->p[0] + p, iw = j * sw - pc->p[1] + q;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                            continue;
                        double v = x[(nc * H + ih) * W + iw];
                        nan |= isnan(v);
                        r = max ? fmax(r, v) : r + v;
                        cnt++;
                    }
                if (max)
                    y[(nc * oh + i) * ow + j] = nan ? NAN : r;
                else
                    y[(nc * oh + i) * ow + j] = r / (double)(cip ? pc->k[0] * pc->k[1] : cnt);
            }
    return y;
}

static void check_pool(ndm_array x, const double *xv, const pool_case *pc, bool max, bool cip,
                       const char *what)
{
    int nd;
    int64_t *s = shape_of(x, &nd);
    int64_t sh = pc->s[0] ? pc->s[0] : pc->k[0], sw = pc->s[1] ? pc->s[1] : pc->k[1];
    int64_t oh = (s[2] + 2 * pc->p[0] - pc->k[0]) / sh + 1;
    int64_t ow = (s[3] + 2 * pc->p[1] - pc->k[1]) / sw + 1;
    ndm_pool2d_opts o = {{pc->k[0], pc->k[1]}, {pc->s[0], pc->s[1]}, {pc->p[0], pc->p[1]}};
    ndm_array y = max ? ndm_max_pool2d(x, &o) : ndm_avg_pool2d(x, cip, &o);
    if (!y.id)
        fail_msg("%s: %s", what, ndm_last_error());
    assert_shape(y, s[0], s[1], oh, ow);
    assert_int_equal(ndm_array_dtype(y), ndm_array_dtype(x));
    double *want = ref_pool(xv, s[0], s[1], s[2], s[3], pc, max, cip, oh, ow);
    double *got = read_array(y);
    char msg[96];
    snprintf(msg, sizeof msg, "%s %s pool %s", what, max ? "max" : cip ? "avg+pad" : "avg",
             ndm_dtype_short(ndm_array_dtype(x)));
    assert_close_all(got, want, ndm_array_size(y), dtype_rtol(ndm_array_dtype(x)), 1e-12, msg);
    free(want), free(got), free(s);
    release(y);
}

static const pool_case pools[] = {
    {{2, 2}, {0, 0}, {0, 0}}, {{3, 3}, {1, 1}, {1, 1}}, {{3, 3}, {2, 2}, {1, 1}},
    {{2, 3}, {1, 2}, {1, 1}}, {{7, 6}, {0, 0}, {0, 0}}, {{1, 1}, {2, 3}, {0, 0}},
};

static void test_pool2d_matches_direct_loops(void **state)
{
    ndm_manager m = ROOT(state);
    rng g = rng_new(5);
    const ndm_dtype types[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    for (int t = 0; t < 4; t++) {
        double xv[2 * 3 * 7 * 6];
        ndm_array x = rand_array(m, &g, types[t], xv, 4, (int64_t[]){2, 3, 7, 6});
        for (int ref = 0; ref < 2; ref++) {
            ndm__cpu_force_reference(ref);
            for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++) {
                check_pool(x, xv, &pools[p], true, false, "contiguous");
                check_pool(x, xv, &pools[p], false, false, "contiguous");
                check_pool(x, xv, &pools[p], false, true, "contiguous");
            }
        }
        ndm__cpu_force_reference(false);
        /* a transposed view: H and W swapped */
        ndm_array xt = ndm_swapaxes(x, 2, 3);
        double *xtv = read_array(xt);
        check_pool(xt, xtv, &pools[2], true, false, "swapped");
        check_pool(xt, xtv, &pools[3], false, true, "swapped");
        free(xtv);
        release(xt), release(x);
    }
    /* many planes: split over the pool */
    double *big = malloc(sizeof(double) * 32 * 16 * 12 * 12);
    ndm_array xb = rand_array(m, &g, NDM_F32, big, 4, (int64_t[]){32, 16, 12, 12});
    check_pool(xb, big, &pools[0], true, false, "many planes");
    check_pool(xb, big, &pools[1], false, false, "many planes");
    release(xb);
    free(big);
}

static void test_max_pool2d_nan_and_padding(void **state)
{
    ndm_manager m = ROOT(state);
    /* all negative: padding (never read) must not win with 0 */
    double v[16] = {-5, -4, -3, -2, NAN, -1, -7, -8, -9, -6, -2, -3, -4, -5, -6, -7};
    ndm_array x = make_array(m, NDM_F32, v, NDM_SHAPE(1, 1, 4, 4));
    const pool_case pc = {{3, 3}, {1, 1}, {1, 1}};
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        check_pool(x, v, &pc, true, false, "nan");
        ndm_array y = ndm_max_pool2d(x, NDM_POOL2D(.kernel = {3, 3}, .stride = {1, 1},
                                                   .padding = {1, 1}));
        double *got = read_array(y);
        assert_true(isnan(got[0]));   /* the window holds the NaN */
        assert_true(got[15] == -2);   /* bottom right: max of -6, -2... not 0 */
        free(got);
        release(y);
    }
    ndm__cpu_force_reference(false);
    release(x);
}

/* The 2x2, stride 2 window has its own kernels: they agree bit for bit with
 * the reference on ties (the first maximum wins), NaNs (the last NaN wins),
 * signed zeros, an odd plane (the last row and column are in no window),
 * forward and backward, max and average. */
static void test_pool2d_2x2_fast_path_matches_reference(void **state)
{
    ndm_manager m = ROOT(state);
    double v[5 * 5] = {1,  1,   -0.0, 0.0, 9,  /* ties, then -0 before +0 */
                       1,  1,   0.0,  -0.0, 9,
                       NAN, 2,  -3,   -3,  9,  /* a NaN first, then larger */
                       5,  NAN, -3,   -4,  9,
                       7,  7,   7,    7,   7};
    double gv[2 * 2] = {1.5, -0.0, 2.5, -4};
    ndm_array x = make_array(m, NDM_F32, v, NDM_SHAPE(1, 1, 5, 5));
    ndm_array dy = make_array(m, NDM_F32, gv, NDM_SHAPE(1, 1, 2, 2));
    ndm_pool2d_opts o = {{2, 2}, {2, 2}, {0, 0}};
    float got[2][4][25];
    for (int ref = 0; ref < 2; ref++) {
        ndm__cpu_force_reference(ref);
        ndm_array r[4] = {ndm_max_pool2d(x, &o), ndm_avg_pool2d(x, false, &o),
                          ndm_max_pool2d_backward(dy, x, &o),
                          ndm_avg_pool2d_backward(dy, false, &o, NDM_SHAPE(1, 1, 5, 5))};
        for (int k = 0; k < 4; k++) {
            assert_live(r[k]);
            memset(got[ref][k], 0, sizeof got[ref][k]);
            size_t bytes = (size_t)ndm_array_size(r[k]) * sizeof(float);
            assert_ok(ndm_array_copy_out(r[k], got[ref][k], bytes));
            release(r[k]);
        }
    }
    ndm__cpu_force_reference(false);
    for (int k = 0; k < 4; k++)
        if (memcmp(got[0][k], got[1][k], sizeof got[0][k]) != 0)
            fail_msg("2x2 pooling result %d differs from the reference", k);
    /* and the values themselves: the first of the tied ones, the NaN */
    assert_true(got[0][0][0] == 1 && isnan(got[0][0][2]));
    assert_true(got[0][2][0] == 1.5f && got[0][2][1] == 0 && got[0][2][5] == 0);
    assert_true(got[0][2][24] == 0); /* outside every window */
    release(dy), release(x);
}

/* The 2x2 windows eight and four at a time (rows of 19, 15, 7 and 8
 * windows, and an odd width): ties, -0 and +0, NaNs anywhere in a window,
 * bit for bit the reference's forward and gradients, max and average. */
static void test_pool2d_2x2_vector_rows_match_reference(void **state)
{
    ndm_manager m = ROOT(state);
    static const int64_t widths[] = {38, 30, 14, 17};
    ndm_pool2d_opts o = {{2, 2}, {2, 2}, {0, 0}};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int64_t W = widths[wi], H = 6, OW = W / 2, n = 2 * 3 * H * W, ny = 2 * 3 * (H / 2) * OW;
        double *v = malloc((size_t)n * sizeof(double)), *gv = malloc((size_t)ny * sizeof(double));
        static const double pick[] = {1, 1, -0.0, 0.0, 2, -3, NAN, 5, -1e30, 1};
        for (int64_t i = 0; i < n; i++) {
            uint64_t r = (uint64_t)i * 2654435761u;
            v[i] = pick[(r >> 7) % 10];
        }
        for (int64_t i = 0; i < ny; i++)
            gv[i] = i % 5 == 0 ? -0.0 : (double)(i % 9) - 3.75;
        ndm_array x = make_array(m, NDM_F32, v, NDM_SHAPE(2, 3, H, W));
        ndm_array dy = make_array(m, NDM_F32, gv, NDM_SHAPE(2, 3, H / 2, OW));
        for (int isa = 0; isa < 2; isa++) {
            (void)ndm__cpu_conv_grad_isa(isa); /* 0: the CPU's best; 1: portable C */
            float *got[2][4];
            size_t len[4] = {(size_t)ny, (size_t)ny, (size_t)n, (size_t)n};
            for (int ref = 0; ref < 2; ref++) {
                ndm__cpu_force_reference(ref);
                ndm_array r[4] = {ndm_max_pool2d(x, &o), ndm_avg_pool2d(x, false, &o),
                                  ndm_max_pool2d_backward(dy, x, &o),
                                  ndm_avg_pool2d_backward(dy, false, &o, NDM_SHAPE(2, 3, H, W))};
                for (int k = 0; k < 4; k++) {
                    assert_live(r[k]);
                    got[ref][k] = malloc(len[k] * sizeof(float));
                    assert_ok(ndm_array_copy_out(r[k], got[ref][k], len[k] * sizeof(float)));
                    release(r[k]);
                }
            }
            ndm__cpu_force_reference(false);
            for (int k = 0; k < 4; k++) {
                if (memcmp(got[0][k], got[1][k], len[k] * sizeof(float)) != 0)
                    fail_msg("width %lld%s: 2x2 pooling result %d differs from the reference",
                             (long long)W, isa ? ", portable" : "", k);
                free(got[0][k]), free(got[1][k]);
            }
        }
        (void)ndm__cpu_conv_grad_isa(0);
        release(x), release(dy);
        free(v), free(gv);
    }
}

static void test_conv2d_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 4, 5, 5));
    ndm_array w = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 4, 3, 3));
    ndm_array w64 = ndm_zeros(m, NDM_F64, NDM_SHAPE(6, 4, 3, 3));
    ndm_array xi = ndm_zeros(m, NDM_I32, NDM_SHAPE(2, 4, 5, 5));
    ndm_array w2 = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 2, 3, 3));
    ndm_array w3 = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 3, 3, 3));
    ndm_array b5 = ndm_zeros(m, NDM_F32, NDM_SHAPE(5));
    ndm_array x3 = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 5, 5));
    ndm_array big = ndm_zeros(m, NDM_F32, NDM_SHAPE(6, 4, 7, 3));
    assert_fails(ndm_conv2d(x, w64, NULL), NDM_E_DTYPE, "share one float dtype (got f32, f64)");
    assert_fails(ndm_conv2d(xi, w, NULL), NDM_E_DTYPE, "i32");
    assert_fails(ndm_conv2d(x3, w, NULL), NDM_E_SHAPE, "must be 4-d");
    assert_fails(ndm_conv2d(x, w2, NULL), NDM_E_SHAPE, "do not match with 1 groups");
    assert_live(ndm_conv2d(x, w2, NDM_CONV2D(.groups = 2, .padding = {1, 1})));
    assert_fails(ndm_conv2d(x, w3, NDM_CONV2D(.groups = 3)), NDM_E_SHAPE, "3 groups");
    assert_fails(ndm_conv2d_bias(x, w, b5, NULL), NDM_E_SHAPE, "bias f32[5]");
    assert_fails(ndm_conv2d(x, big, NULL), NDM_E_SHAPE, "height: a window of 7 does not fit in 5");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.dilation = {3, 1})), NDM_E_SHAPE, "window of 7");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.padding = {-1, 0})), NDM_E_INVALID, ">= 0");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.stride = {1, -2})), NDM_E_INVALID, ">= 0");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.groups = -1)), NDM_E_INVALID, "groups");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.padding = {INT64_MAX / 2, 0})), NDM_E_OVERFLOW,
                 "overflows");
    assert_fails(ndm_conv2d(x, w, NDM_CONV2D(.dilation = {INT64_MAX / 2 + 1, 1})), NDM_E_OVERFLOW,
                 "overflows");
    assert_ok(ndm_scope_release_all(m));
}

static void test_pool2d_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 2, 4, 4));
    ndm_array xi = ndm_zeros(m, NDM_U8, NDM_SHAPE(1, 2, 4, 4));
    ndm_array x2 = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, 4));
    assert_fails(ndm_max_pool2d(x, NULL), NDM_E_INVALID, "kernel size");
    assert_fails(ndm_max_pool2d(x, NDM_POOL2D(.kernel = {0, 2})), NDM_E_INVALID, "kernel 0");
    assert_fails(ndm_avg_pool2d(x, true, NDM_POOL2D(.kernel = {2, 2}, .padding = {2, 0})),
                 NDM_E_INVALID, "half the kernel");
    assert_fails(ndm_max_pool2d(x, NDM_POOL2D(.kernel = {2, 2}, .stride = {-1, 1})),
                 NDM_E_INVALID, "stride -1");
    assert_fails(ndm_max_pool2d(xi, NDM_POOL2D(.kernel = {2, 2})), NDM_E_DTYPE, "u8");
    assert_fails(ndm_max_pool2d(x2, NDM_POOL2D(.kernel = {2, 2})), NDM_E_SHAPE, "4-d");
    assert_fails(ndm_max_pool2d(x, NDM_POOL2D(.kernel = {5, 2})), NDM_E_SHAPE, "does not fit");
    assert_int_equal(test_live_arrays(m), 3);
    release(x), release(xi), release(x2);
}

static void test_conv2d_stale_and_null_inputs(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 3, 3));
    ndm_array w = ndm_zeros(m, NDM_F32, NDM_SHAPE(1, 1, 2, 2));
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(1));
    release(b);
    assert_fails(ndm_conv2d_bias(x, w, b, NULL), NDM_E_CLOSED, "stale array handle");
    /* a failed bias propagates: its first error is kept, no bias is not assumed */
    ndm_clear_error();
    ndm_array bad = ndm_sum(b, false, NDM_ALL_AXES_LIST);
    ndm_array y = ndm_conv2d_bias(x, w, bad, NULL);
    assert_true(y.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("ndm_sum");
    assert_fails(ndm_max_pool2d(NDM_NULL_ARRAY, NDM_POOL2D(.kernel = {1, 1})), NDM_E_NULL, "null");
    release(x), release(w);
}

static void test_conv2d_output_rule_and_allocations(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager in = ndm_manager_new(m, "inputs");
    ndm_manager named = ndm_manager_new(m, "named");
    ndm_array x = ndm_ones(in, NDM_F16, NDM_SHAPE(2, 2, 4, 4));
    ndm_array w = ndm_ones(in, NDM_F16, NDM_SHAPE(3, 2, 3, 3));
    ndm_array b = ndm_ones(in, NDM_F16, NDM_SHAPE(3));
    ndm_array y = ndm_conv2d_bias(x, w, b, NULL);
    assert_true(ndm_array_manager(y).id == in.id);
    assert_int_equal(test_live_arrays(in), 4); /* no temporary left */
    ndm_array p = ndm_avg_pool2d_to(named, x, false, NDM_POOL2D(.kernel = {2, 2}));
    assert_true(ndm_array_manager(p).id == named.id);
    ndm_manager s = ndm_scope_begin(m, "step");
    ndm_array q = ndm_max_pool2d(y, NDM_POOL2D(.kernel = {2, 2}, .stride = {1, 1}));
    ndm_array r = ndm_conv2d(x, w, NDM_CONV2D(.padding = {1, 1}));
    assert_true(ndm_array_manager(q).id == s.id);
    assert_true(ndm_array_manager(r).id == s.id);
    assert_ok(ndm_scope_end(s, 1, &r));
    assert_true(ndm_array_manager(r).id == m.id);
    double v;
    ndm_array r0 = ndm_select(r, 0, 0), r00 = ndm_select(r0, 0, 1), e = ndm_select(r00, 0, 1);
    ndm_array e1 = ndm_select(e, 0, 1);
    assert_ok(ndm_item(e1, &v));
    assert_true(v == 18); /* 2 channels x 3 x 3 ones */
    /* every allocation of an f16 convolution fails in turn, nothing is left */
    ndm_stats before;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &before));
    int failures = 0;
    for (int i = 1; i < 12; i++) {
        ndm__alloc_fail_after(i);
        ndm_array t = ndm_conv2d_bias_to(m, x, w, b, NULL);
        ndm__alloc_fail_after(0);
        if (t.id) {
            release(t);
            break;
        }
        failures++;
        assert_int_equal(ndm_last_status(), NDM_E_OOM);
        ndm_stats now;
        assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &now));
        assert_int_equal(now.live_arrays, before.live_arrays);
    }
    assert_true(failures >= 5); /* result, x, w, bias, y in f32 (and scratch) */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array mw = ndm_ones(model, NDM_F32, NDM_SHAPE(3, 2, 3, 3));
    ndm_array mx = ndm_ones(model, NDM_F32, NDM_SHAPE(1, 2, 4, 4));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_fails(ndm_conv2d(mx, mw, NULL), NDM_E_CAPPED, "capped");
    assert_fails(ndm_max_pool2d(mx, NDM_POOL2D(.kernel = {2, 2})), NDM_E_CAPPED, "capped");
    assert_int_equal(test_live_arrays(model), 2);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_scope_release_all(m));
    assert_ok(ndm_manager_close(named));
    assert_ok(ndm_manager_close(in));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_conv2d_matches_direct_loops),
        TEST(test_conv2d_half_precision),
        TEST(test_conv2d_parallel_and_tiled),
        TEST(test_conv2d_strided_views),
        TEST(test_conv2d_packed_odd_shapes),
        TEST(test_pool2d_matches_direct_loops),
        TEST(test_max_pool2d_nan_and_padding),
        TEST(test_pool2d_2x2_fast_path_matches_reference),
        TEST(test_pool2d_2x2_vector_rows_match_reference),
        TEST(test_conv2d_errors),
        TEST(test_pool2d_errors),
        TEST(test_conv2d_stale_and_null_inputs),
        TEST(test_conv2d_output_rule_and_allocations),
    };
    return cmocka_run_group_tests_name("conv", tests, NULL, NULL);
}
