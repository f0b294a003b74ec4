/* Reference random kernels: each element is computed on its own, in C
 * order, straight from the stream formulas of ndm/random.h, with libm in
 * double precision. The oracle for the fast kernels. */
#include <math.h>
#include <string.h>

#include "../random.h"
#include "convert.h"
#include "index_cpu.h"

/* Words [first, first + n) of the stream. */
static void words(ndm_rng rng, uint64_t first, unsigned n, uint32_t *out)
{
    for (unsigned k = 0; k < n; k++)
        out[k] = ndm__rng_word(rng, first + k);
}

/* Calls value(ctx, i, p) for each element p of t, i its C-order position. */
typedef void (*elem_fn)(const void *ctx, uint64_t i, void *p);

static ndm_status each(const ndm__tensor *t, elem_fn value, const void *ctx)
{
    if (ndm__numel_t(t) == 0)
        return NDM_OK;
    ndm__coords cs;
    int64_t *c = ndm__coords_get(&cs, (size_t)t->ndim);
    if (!c)
        return NDM_E_OOM;
    int64_t es = (int64_t)ndm_dtype_size(t->dtype);
    uint64_t i = 0;
    do {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++)
            off += c[d] * t->strides[d];
        value(ctx, i++, (char *)t->data + off * es);
    } while (ndm__odo_next(t->ndim, t->shape, c));
    ndm__coords_put(&cs);
    return NDM_OK;
}

typedef struct ref_ctx {
    ndm_rng rng;
    ndm_dtype dtype;
    double a, b;             /* lo, hi or mean, std or p */
    int64_t lo;
    uint64_t range;
    unsigned w;
    ndm__below below;
} ref_ctx;

static void uniform_value(const void *ctx, uint64_t i, void *p)
{
    const ref_ctx *c = ctx;
    uint32_t x[2];
    words(c->rng, i * c->w, c->w, x);
    double v = c->a + (c->b - c->a) * (c->w == 1 ? ndm__rng_u24(x[0]) : ndm__rng_u53(x));
    switch (c->dtype) {
    case NDM_F16: {
        uint16_t h = ndm_f32_to_f16((float)v);
        if ((double)ndm_f16_to_f32(h) >= c->b)
            h = c->below.f16;
        memcpy(p, &h, 2);
        break;
    }
    case NDM_BF16: {
        uint16_t h = ndm_f32_to_bf16((float)v);
        if ((double)ndm_bf16_to_f32(h) >= c->b)
            h = c->below.bf16;
        memcpy(p, &h, 2);
        break;
    }
    case NDM_F32: {
        float f = (float)v;
        if ((double)f >= c->b)
            f = c->below.f32;
        memcpy(p, &f, 4);
        break;
    }
    default:
        if (v >= c->b)
            v = c->below.f64;
        memcpy(p, &v, 8);
        break;
    }
}

static ndm_status ref_uniform(int device, const ndm__tensor *dst, ndm_rng rng, double lo,
                              double hi)
{
    (void)device;
    ref_ctx c = {.rng = rng, .dtype = dst->dtype, .a = lo, .b = hi,
                 .w = ndm__rng_words_float(dst->dtype), .below = ndm__uniform_below(hi)};
    return each(dst, uniform_value, &c);
}

static void normal_value(const void *ctx, uint64_t i, void *p)
{
    const ref_ctx *c = ctx;
    uint32_t x[4];
    words(c->rng, (i & ~(uint64_t)1) * c->w, 2 * c->w, x);
    double u1 = c->w == 1 ? ndm__rng_u24_open(x[0]) : ndm__rng_u53_open(x);
    double u2 = c->w == 1 ? ndm__rng_u24(x[1]) : ndm__rng_u53(x + 2);
    double r = sqrt(-2.0 * log(u1)), t = 2.0 * M_PI * u2;
    ndm__cpu_store_f64(c->dtype, p, c->a + c->b * r * (i & 1 ? sin(t) : cos(t)));
}

static ndm_status ref_normal(int device, const ndm__tensor *dst, ndm_rng rng, double mean,
                             double std)
{
    (void)device;
    ref_ctx c = {.rng = rng, .dtype = dst->dtype, .a = mean, .b = std,
                 .w = ndm__rng_words_float(dst->dtype)};
    return each(dst, normal_value, &c);
}

static void randint_value(const void *ctx, uint64_t i, void *p)
{
    const ref_ctx *c = ctx;
    uint32_t x[4];
    words(c->rng, i * c->w, c->w, x);
    int64_t v = ndm__rng_randint(x, c->w, c->lo, c->range);
    switch (c->dtype) {
    case NDM_U8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case NDM_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    default:
        *(int64_t *)p = v;
        break;
    }
}

static ndm_status ref_randint(int device, const ndm__tensor *dst, ndm_rng rng, int64_t lo,
                              int64_t hi)
{
    (void)device;
    ref_ctx c = {.rng = rng, .dtype = dst->dtype, .lo = lo, .range = (uint64_t)hi - (uint64_t)lo,
                 .w = ndm__rng_words_randint(lo, hi)};
    return each(dst, randint_value, &c);
}

static void bernoulli_value(const void *ctx, uint64_t i, void *p)
{
    const ref_ctx *c = ctx;
    ndm__cpu_store_f64(c->dtype, p, ndm__rng_word(c->rng, i) < c->range ? 1.0 : 0.0);
}

static ndm_status ref_bernoulli(int device, const ndm__tensor *dst, ndm_rng rng, double p)
{
    (void)device;
    ref_ctx c = {.rng = rng, .dtype = dst->dtype, .range = ndm__rng_threshold(p),
                 .w = NDM__RNG_WORDS_BERNOULLI};
    return each(dst, bernoulli_value, &c);
}

static ndm_status ref_permutation(int device, const ndm__tensor *dst, ndm_rng rng)
{
    (void)device;
    int64_t n = dst->shape[0], s = dst->strides[0];
    int64_t *out = dst->data;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x[2];
        words(rng, (uint64_t)i * NDM__RNG_WORDS_PERMUTATION, 2, x);
        int64_t j = ndm__rng_randint(x, 2, 0, (uint64_t)i + 1);
        /* inside-out Fisher-Yates: a[i] = a[j]; a[j] = i */
        out[i * s] = out[j * s];
        out[j * s] = i;
    }
    return NDM_OK;
}

const struct ndm__backend_random ndm__cpu_ref_random = {
    .uniform = ref_uniform,
    .normal = ref_normal,
    .randint = ref_randint,
    .bernoulli = ref_bernoulli,
    .permutation = ref_permutation,
    .multinomial = ndm__cpu_multinomial,
};
