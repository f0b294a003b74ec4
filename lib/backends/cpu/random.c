/* Fast CPU random kernels: Philox blocks sixteen at a time in lanes the
 * compiler can vectorise, values made a tile at a time with inline
 * polynomials for log, sin and cos, tiles spread over the thread pool. The
 * numbers depend on the element's flat index only, never on the split. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "../random.h"
#include "convert.h"
#include "index_cpu.h"
#include "parallel.h"

#define LANES 16
/* Elements per tile; a tile's words and values stay in L1. */
#define TILE 256

/* Blocks [b0, b0 + nb) of the stream, four words each, into out. */
static void philox_blocks(ndm_rng rng, uint64_t b0, int64_t nb, uint32_t *out)
{
    uint32_t k0 = (uint32_t)rng.seed, k1 = (uint32_t)(rng.seed >> 32);
    uint32_t s0 = (uint32_t)rng.stream, s1 = (uint32_t)(rng.stream >> 32);
    for (int64_t b = 0; b < nb; b += LANES) {
        uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
        for (int l = 0; l < LANES; l++) {
            uint64_t c = rng.offset + b0 + (uint64_t)(b + l);
            c0[l] = (uint32_t)c;
            c1[l] = (uint32_t)(c >> 32);
            c2[l] = s0;
            c3[l] = s1;
        }
        uint32_t ka = k0, kb = k1;
        for (int r = 0; r < 10; r++) {
            for (int l = 0; l < LANES; l++) {
                uint64_t p0 = (uint64_t)NDM__PHILOX_M0 * c0[l];
                uint64_t p1 = (uint64_t)NDM__PHILOX_M1 * c2[l];
                uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ ka;
                uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ kb;
                c0[l] = n0;
                c1[l] = (uint32_t)p1;
                c2[l] = n2;
                c3[l] = (uint32_t)p0;
            }
            ka += NDM__PHILOX_W0;
            kb += NDM__PHILOX_W1;
        }
        int m = nb - b < LANES ? (int)(nb - b) : LANES;
        for (int l = 0; l < m; l++) {
            uint32_t *o = out + 4 * (b + l);
            o[0] = c0[l];
            o[1] = c1[l];
            o[2] = c2[l];
            o[3] = c3[l];
        }
    }
}

/* ---- log, sin and cos for Box-Muller ------------------------------------------------ */

/* ln x for normal x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.1716, as a series in s^2. */
static inline float log_f32(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    int e = (int)(b >> 23) - 127;
    b = (b & 0x7fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &b, 4);
    if (m > 1.41421356f) {
        m *= 0.5f;
        e++;
    }
    float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float p = 1.0f + z * (1.0f / 3 + z * (1.0f / 5 + z * (1.0f / 7 + z * (1.0f / 9))));
    return (float)e * 0.693145751953125f + ((float)e * 1.428606765330187045e-06f + 2.0f * s * p);
}

static inline double log_f64(double x)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    int e = (int)(b >> 52) - 1023;
    b = (b & UINT64_C(0xfffffffffffff)) | UINT64_C(0x3ff0000000000000);
    double m;
    memcpy(&m, &b, 8);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 1.0 / 19 + z * (1.0 / 21);
    p = 1.0 / 17 + z * p;
    p = 1.0 / 15 + z * p;
    p = 1.0 / 13 + z * p;
    p = 1.0 / 11 + z * p;
    p = 1.0 / 9 + z * p;
    p = 1.0 / 7 + z * p;
    p = 1.0 / 5 + z * p;
    p = 1.0 / 3 + z * p;
    p = 1.0 + z * p;
    return (double)e * 6.93147180369123816490e-01 + ((double)e * 1.90821492927058770002e-10 + 2.0 * s * p);
}

/* sin and cos of 2 pi u for u in [0, 1): the nearest quarter turn q is taken
 * out exactly (4u is exact), the rest x in [-pi/4, pi/4] goes through Taylor
 * series, and the quarter turns swap and negate the pair. */
static inline void sincos2pi_f32(float u, float *sn, float *cs)
{
    float t = 4.0f * u;
    int q = (int)(t + 0.5f);
    float x = (t - (float)q) * 1.57079632679489662f, z = x * x;
    float s = x * (1 + z * (-1.0f / 6 + z * (1.0f / 120 + z * (-1.0f / 5040 + z * (1.0f / 362880)))));
    float c = 1 + z * (-0.5f + z * (1.0f / 24 + z * (-1.0f / 720 + z * (1.0f / 40320 +
                                                                      z * (-1.0f / 3628800)))));
    float a = q & 1 ? c : s, b = q & 1 ? s : c;
    *sn = q & 2 ? -a : a;
    *cs = (q + 1) & 2 ? -b : b;
}

static inline void sincos2pi_f64(double u, double *sn, double *cs)
{
    double t = 4.0 * u;
    int q = (int)(t + 0.5);
    double x = (t - (double)q) * 1.57079632679489661923, z = x * x;
    double s = 1.0 / 355687428096000.0; /* 1/17! */
    s = -1.0 / 1307674368000.0 + z * s;
    s = 1.0 / 6227020800.0 + z * s;
    s = -1.0 / 39916800.0 + z * s;
    s = 1.0 / 362880.0 + z * s;
    s = -1.0 / 5040.0 + z * s;
    s = 1.0 / 120.0 + z * s;
    s = -1.0 / 6.0 + z * s;
    s = x * (1.0 + z * s);
    double c = 1.0 / 20922789888000.0; /* 1/16! */
    c = -1.0 / 87178291200.0 + z * c;
    c = 1.0 / 479001600.0 + z * c;
    c = -1.0 / 3628800.0 + z * c;
    c = 1.0 / 40320.0 + z * c;
    c = -1.0 / 720.0 + z * c;
    c = 1.0 / 24.0 + z * c;
    c = -0.5 + z * c;
    c = 1.0 + z * c;
    double a = q & 1 ? c : s, b = q & 1 ? s : c;
    *sn = q & 2 ? -a : a;
    *cs = (q + 1) & 2 ? -b : b;
}

/* ---- values ----------------------------------------------------------------------- */

typedef struct rand_job rand_job;
/* Values of elements [first, first + m) of dtype dst into vals (packed),
 * from their words w (w[0] is the first word of element `first`). */
typedef void (*gen_fn)(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, void *vals);

struct rand_job {
    const ndm__tensor *dst;
    ndm_rng rng;
    unsigned w;              /* words per element */
    bool pairs;              /* values come in pairs (normal) */
    gen_fn gen;
    double a, b;             /* lo, hi or mean, std */
    int64_t lo;
    uint64_t range;          /* randint range or bernoulli threshold */
    ndm__below below;
    unsigned char zero[8], one[8];
    /* where the elements go: a single run of n with stride `stride`, or the
     * general walk over dst's axes when `run` is false */
    bool run;
    int64_t stride;
    atomic_int status;
};

/* uniform: (name, type, u from the words, store with the clamp below hi) */
#define NDM__UNIFORM(N, T, U, CLAMP)                                         \
    static void uniform_##N(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, \
                            void *vals)                                         \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals;                                                            \
        double lo = j->a, span = j->b - j->a, hi = j->b;                        \
        for (int64_t i = 0; i < m; i++) {                                       \
            double v = lo + span * (U);                                         \
            CLAMP;                                                              \
        }                                                                       \
    }
NDM__UNIFORM(f32, float, ndm__rng_u24(w[i]), {
    float f = (float)v;
    o[i] = (double)f >= hi ? j->below.f32 : f;
})
NDM__UNIFORM(f64, double, ndm__rng_u53(w + 2 * i), o[i] = v >= hi ? j->below.f64 : v)
NDM__UNIFORM(f16, uint16_t, ndm__rng_u24(w[i]), {
    uint16_t h = ndm_f32_to_f16((float)v);
    o[i] = (double)ndm_f16_to_f32(h) >= hi ? j->below.f16 : h;
})
NDM__UNIFORM(bf16, uint16_t, ndm__rng_u24(w[i]), {
    uint16_t h = ndm_f32_to_bf16((float)v);
    o[i] = (double)ndm_bf16_to_f32(h) >= hi ? j->below.bf16 : h;
})

/* normal: pairs (z0, z1) = r (cos, sin); m is even */
#define NDM__NORMAL32(N, T, STORE)                                              \
    static void normal_##N(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, \
                           void *vals)                                          \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals;                                                            \
        float mean = (float)j->a, std = (float)j->b;                            \
        for (int64_t i = 0; i < m; i += 2) {                                    \
            float u1 = (float)((w[i] >> 8) + 1) * 0x1p-24f;                     \
            float u2 = (float)(w[i + 1] >> 8) * 0x1p-24f;                       \
            float r = sqrtf(-2.0f * log_f32(u1)), s, c;                         \
            sincos2pi_f32(u2, &s, &c);                                          \
            o[i] = STORE(mean + std * (r * c));                                 \
            o[i + 1] = STORE(mean + std * (r * s));                             \
        }                                                                       \
    }
NDM__NORMAL32(f32, float, (float))
NDM__NORMAL32(f16, uint16_t, ndm_f32_to_f16)
NDM__NORMAL32(bf16, uint16_t, ndm_f32_to_bf16)

static void normal_f64(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, void *vals)
{
    (void)first;
    double *o = vals;
    for (int64_t i = 0; i < m; i += 2) {
        double r = sqrt(-2.0 * log_f64(ndm__rng_u53_open(w + 2 * i))), s, c;
        sincos2pi_f64(ndm__rng_u53(w + 2 * i + 2), &s, &c);
        o[i] = j->a + j->b * (r * c);
        o[i + 1] = j->a + j->b * (r * s);
    }
}

#define NDM__RANDINT(N, T)                                                      \
    static void randint_##N(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, \
                            void *vals)                                         \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals;                                                            \
        if (j->w == 2)                                                          \
            for (int64_t i = 0; i < m; i++)                                     \
                o[i] = (T)(int64_t)((uint64_t)j->lo +                           \
                                    ndm__mulhi64(ndm__rng_x64(w + 2 * i), j->range)); \
        else                                                                    \
            for (int64_t i = 0; i < m; i++)                                     \
                o[i] = (T)ndm__rng_randint(w + 4 * i, 4, j->lo, j->range);      \
    }
NDM__RANDINT(u8, uint8_t)
NDM__RANDINT(i32, int32_t)
NDM__RANDINT(i64, int64_t)

#define NDM__BERNOULLI(N, T)                                                    \
    static void bernoulli_##N(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m, \
                              void *vals)                                       \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals, one, zero;                                                 \
        memcpy(&one, j->one, sizeof one);                                       \
        memcpy(&zero, j->zero, sizeof zero);                                    \
        for (int64_t i = 0; i < m; i++)                                         \
            o[i] = (uint64_t)w[i] < j->range ? one : zero;                      \
    }
NDM__BERNOULLI(s1, uint8_t)
NDM__BERNOULLI(s2, uint16_t)
NDM__BERNOULLI(s4, uint32_t)
NDM__BERNOULLI(s8, uint64_t)

/* Step i of the shuffle draws j in [0, i]. */
static void permutation_draws(const rand_job *j, const uint32_t *w, uint64_t first, int64_t m,
                              void *vals)
{
    (void)j;
    int64_t *o = vals;
    for (int64_t i = 0; i < m; i++)
        o[i] = (int64_t)ndm__mulhi64(ndm__rng_x64(w + 2 * i), first + (uint64_t)i + 1);
}

/* ---- tiles ----------------------------------------------------------------------- */

/* Store m packed values as elements [first, first + m) of dst. */
static void put(rand_job *j, const char *vals, int64_t first, int64_t m)
{
    const ndm__tensor *t = j->dst;
    size_t es = ndm_dtype_size(t->dtype);
    if (j->run && j->stride == 1) {
        memcpy((char *)t->data + (size_t)first * es, vals, (size_t)m * es);
        return;
    }
    if (j->run) {
        ndm__tensor to = {(char *)t->data + first * j->stride * (int64_t)es, t->dtype, 1, &m,
                          &j->stride};
        ndm__tensor from = {(void *)vals, t->dtype, 1, &m, (const int64_t[]){1}};
        (void)ndm__cpu_copy(0, &to, &from);
        return;
    }
    ndm__coords cs;
    int64_t *c = ndm__coords_get(&cs, (size_t)t->ndim);
    if (!c) {
        atomic_store(&j->status, NDM_E_OOM);
        return;
    }
    int64_t rest = first, off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        c[d] = rest % t->shape[d];
        rest /= t->shape[d];
        off += c[d] * t->strides[d];
    }
    for (int64_t i = 0; i < m; i++) {
        memcpy((char *)t->data + off * (int64_t)es, vals + (size_t)i * es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            off += t->strides[d];
            if (++c[d] < t->shape[d])
                break;
            off -= t->strides[d] * t->shape[d];
            c[d] = 0;
        }
    }
    ndm__coords_put(&cs);
}

static void rand_range(void *ctx, int64_t b, int64_t e)
{
    rand_job *j = ctx;
    uint32_t words[4 * (TILE + 4)]; /* up to TILE + 2 elements of 4 words, block-aligned */
    uint64_t vals[TILE + 2];
    size_t es = ndm_dtype_size(j->dst->dtype);
    for (int64_t t0 = b; t0 < e; t0 += TILE) {
        int64_t t1 = e - t0 < TILE ? e : t0 + TILE;
        /* Pairs start at even elements, so a tile may make one more on each side. */
        int64_t a0 = j->pairs ? t0 & ~(int64_t)1 : t0;
        int64_t a1 = j->pairs ? (t1 + 1) & ~(int64_t)1 : t1;
        uint64_t w0 = (uint64_t)a0 * j->w, w1 = (uint64_t)a1 * j->w;
        uint64_t blk0 = w0 / 4, blk1 = (w1 + 3) / 4;
        philox_blocks(j->rng, blk0, (int64_t)(blk1 - blk0), words);
        j->gen(j, words + (w0 - 4 * blk0), (uint64_t)a0, a1 - a0, vals);
        put(j, (const char *)vals + (size_t)(t0 - a0) * es, t0, t1 - t0);
    }
}

/* Fill every element of dst through gen. */
static ndm_status fill(rand_job *j)
{
    const ndm__tensor *t = j->dst;
    int64_t n = ndm__numel_t(t), size;
    atomic_init(&j->status, NDM_OK);
    j->run = ndm__merge_axes(t, 0, t->ndim, &size, &j->stride);
    if (n == 0)
        return NDM_OK;
    /* A tile costs about 40 ns per block; keep chunks to tens of microseconds. */
    ndm__parallel_for(n, 4 * TILE, rand_range, j);
    return (ndm_status)atomic_load(&j->status);
}

static ndm_status fast_uniform(int device, const ndm__tensor *dst, ndm_rng rng, double lo,
                               double hi)
{
    (void)device;
    rand_job j = {.dst = dst, .rng = rng, .w = ndm__rng_words_float(dst->dtype), .a = lo,
                  .b = hi, .below = ndm__uniform_below(hi)};
    j.gen = dst->dtype == NDM_F32   ? uniform_f32
            : dst->dtype == NDM_F64 ? uniform_f64
            : dst->dtype == NDM_F16 ? uniform_f16
                                    : uniform_bf16;
    return fill(&j);
}

static ndm_status fast_normal(int device, const ndm__tensor *dst, ndm_rng rng, double mean,
                              double std)
{
    (void)device;
    rand_job j = {.dst = dst, .rng = rng, .w = ndm__rng_words_float(dst->dtype), .pairs = true,
                  .a = mean, .b = std};
    j.gen = dst->dtype == NDM_F32   ? normal_f32
            : dst->dtype == NDM_F64 ? normal_f64
            : dst->dtype == NDM_F16 ? normal_f16
                                    : normal_bf16;
    return fill(&j);
}

static ndm_status fast_randint(int device, const ndm__tensor *dst, ndm_rng rng, int64_t lo,
                               int64_t hi)
{
    (void)device;
    rand_job j = {.dst = dst, .rng = rng, .w = ndm__rng_words_randint(lo, hi), .lo = lo,
                  .range = (uint64_t)hi - (uint64_t)lo};
    j.gen = dst->dtype == NDM_U8 ? randint_u8 : dst->dtype == NDM_I32 ? randint_i32 : randint_i64;
    return fill(&j);
}

static ndm_status fast_bernoulli(int device, const ndm__tensor *dst, ndm_rng rng, double p)
{
    rand_job j = {.dst = dst, .rng = rng, .w = NDM__RNG_WORDS_BERNOULLI,
                  .range = ndm__rng_threshold(p)};
    double one = 1.0;
    ndm__tensor from = {&one, NDM_F64, 0, NULL, NULL}, to = {j.one, dst->dtype, 0, NULL, NULL};
    ndm_status st = ndm__cpu_copy(device, &to, &from);
    if (st < 0)
        return st;
    switch (ndm_dtype_size(dst->dtype)) {
    case 1: j.gen = bernoulli_s1; break;
    case 2: j.gen = bernoulli_s2; break;
    case 4: j.gen = bernoulli_s4; break;
    default: j.gen = bernoulli_s8; break;
    }
    return fill(&j);
}

static ndm_status fast_permutation(int device, const ndm__tensor *dst, ndm_rng rng)
{
    (void)device;
    /* The draws are independent, so they fill dst in parallel; the swaps
     * that use them run in order: inside-out Fisher-Yates in place. */
    rand_job j = {.dst = dst, .rng = rng, .w = NDM__RNG_WORDS_PERMUTATION,
                  .gen = permutation_draws};
    ndm_status st = fill(&j);
    if (st < 0)
        return st;
    int64_t n = dst->shape[0], s = dst->strides[0];
    int64_t *a = dst->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = a[i * s];
        a[i * s] = a[k * s];
        a[k * s] = i;
    }
    return NDM_OK;
}

const struct ndm__backend_random ndm__cpu_random = {
    .uniform = fast_uniform,
    .normal = fast_normal,
    .randint = fast_randint,
    .bernoulli = fast_bernoulli,
    .permutation = fast_permutation,
};
