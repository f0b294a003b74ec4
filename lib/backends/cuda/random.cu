/* The random family on CUDA: the Philox-4x32-10 stream and the element
 * formulas of random.h, evaluated as the CPU's kernels evaluate them, so a
 * seeded draw gives the CPU's bits on the GPU, for every dtype and layout. */
#include "common.cuh"
#include "iter.cuh"

#include "../random.h"

/* A thread makes one Philox block, four words, and the elements made from
 * them: 4 / w elements of w words each (normal: pairs, whose 2w words never
 * straddle a block). Elements are numbered in C order of dst's shape; a
 * launch covers elements [base, base + n) of that order, so an iteration
 * split over launches keeps every element's words. */

enum { K_UNIFORM, K_NORMAL, K_RANDINT, K_BERNOULLI, K_DRAWS };

typedef struct ndm__cu_rand {
    ndm_rng rng;
    ndm_dtype dtype;
    unsigned w;     /* words per element */
    double a, b;    /* lo, hi or mean, std */
    int64_t lo;
    uint64_t range; /* randint range, bernoulli threshold */
    ndm__below below;
    uint64_t one;   /* bernoulli: 1 in dtype's bits */
} ndm__cu_rand;

/* The value of one element into p: uniform, randint, bernoulli, draws. */
template <int KIND>
NDM__HD void rand_value(const ndm__cu_rand &r, const uint32_t *x, uint64_t i, char *p)
{
    if constexpr (KIND == K_UNIFORM) {
        double lo = r.a, span = r.b - r.a, hi = r.b;
        switch (r.dtype) {
        case NDM_F64: {
            double v = NDM__RNG_DADD(lo, NDM__RNG_DMUL(span, ndm__rng_u53(x)));
            *(double *)p = v >= hi ? r.below.f64 : v;
            break;
        }
        case NDM_F32: {
            float f = (float)NDM__RNG_DADD(lo, NDM__RNG_DMUL(span, ndm__rng_u24(x[0])));
            *(float *)p = (double)f >= hi ? r.below.f32 : f;
            break;
        }
        case NDM_F16: {
            uint16_t h = ndm__f32_to_f16(
                (float)NDM__RNG_DADD(lo, NDM__RNG_DMUL(span, ndm__rng_u24(x[0]))));
            *(uint16_t *)p = (double)ndm__f16_to_f32(h) >= hi ? r.below.f16 : h;
            break;
        }
        default: {
            uint16_t h = ndm__f32_to_bf16(
                (float)NDM__RNG_DADD(lo, NDM__RNG_DMUL(span, ndm__rng_u24(x[0]))));
            *(uint16_t *)p = (double)ndm__bf16_to_f32(h) >= hi ? r.below.bf16 : h;
            break;
        }
        }
    } else if constexpr (KIND == K_RANDINT) {
        int64_t v = r.w == 2 ? (int64_t)((uint64_t)r.lo + ndm__mulhi64(ndm__rng_x64(x), r.range))
                             : ndm__rng_randint(x, 4, r.lo, r.range);
        switch (r.dtype) {
        case NDM_U8: *(uint8_t *)p = (uint8_t)v; break;
        case NDM_I32: *(int32_t *)p = (int32_t)v; break;
        default: *(int64_t *)p = v; break;
        }
    } else if constexpr (KIND == K_BERNOULLI) {
        uint64_t v = (uint64_t)x[0] < r.range ? r.one : 0;
        switch (r.w) { /* here: the element's size */
        case 1: *(uint8_t *)p = (uint8_t)v; break;
        case 2: *(uint16_t *)p = (uint16_t)v; break;
        case 4: *(uint32_t *)p = (uint32_t)v; break;
        default: *(uint64_t *)p = v; break;
        }
    } else {
        /* step i of the shuffle draws j in [0, i] */
        *(int64_t *)p = (int64_t)ndm__mulhi64(ndm__rng_x64(x), i + 1);
    }
}

/* The standard normal pair (z0, z1) of the words x, in f32 (w = 1) as the
 * CPU's f32, f16 and bf16 kernels make it, stored with mean and std. */
NDM__HD void normal_pair(const ndm__cu_rand &r, const uint32_t *x, char *p0, char *p1)
{
    if (r.dtype == NDM_F64) {
        double q = -2.0 * ndm__rng_log_f64(ndm__rng_u53_open(x));
        double rad = sqrt(q), sn, cs;
        ndm__rng_sincos2pi_f64(ndm__rng_u53(x + 2), &sn, &cs);
        if (p0)
            *(double *)p0 = NDM__RNG_DADD(r.a, NDM__RNG_DMUL(r.b, NDM__RNG_DMUL(rad, cs)));
        if (p1)
            *(double *)p1 = NDM__RNG_DADD(r.a, NDM__RNG_DMUL(r.b, NDM__RNG_DMUL(rad, sn)));
        return;
    }
    float q = -2.0f * ndm__rng_log_f32((float)((int32_t)(x[0] >> 8) + 1) * 0x1p-24f);
    float u = (float)(int32_t)(x[1] >> 8) * 0x1p-24f, rad = sqrtf(q), sn, cs;
    ndm__rng_sincos2pi_f32(u, &sn, &cs);
    float mean = (float)r.a, std = (float)r.b;
    float v[2] = {NDM__RNG_FADD(mean, NDM__RNG_FMUL(std, NDM__RNG_FMUL(rad, cs))),
                  NDM__RNG_FADD(mean, NDM__RNG_FMUL(std, NDM__RNG_FMUL(rad, sn)))};
    char *ps[2] = {p0, p1};
    for (int k = 0; k < 2; k++) {
        if (!ps[k])
            continue;
        switch (r.dtype) {
        case NDM_F32: *(float *)ps[k] = v[k]; break;
        case NDM_F16: *(uint16_t *)ps[k] = ndm__f32_to_f16(v[k]); break;
        default: *(uint16_t *)ps[k] = ndm__f32_to_bf16(v[k]); break;
        }
    }
}

template <int KIND, class I>
__global__ void ndm__k_random(ndm__cu_geom g, char *dst, int es, ndm__cu_rand r, uint64_t base,
                              int64_t n)
{
    const uint64_t per = 4 / (KIND == K_BERNOULLI ? 1 : r.w); /* elements per block */
    const uint64_t g0 = base / per, ng = (base + (uint64_t)n - 1) / per - g0 + 1;
    NDM__CU_LOOP(I, t, ng)
    {
        uint64_t blk = g0 + (uint64_t)t;
        uint32_t x[4];
        ndm__rng_block(r.rng, blk, x);
        uint64_t e0 = blk * per, end = base + (uint64_t)n;
        if constexpr (KIND == K_NORMAL) {
            for (uint64_t e = e0; e < e0 + per; e += 2) {
                char *p[2] = {NULL, NULL};
                for (int k = 0; k < 2; k++) {
                    if (e + k < base || e + k >= end)
                        continue;
                    int64_t off[1];
                    ndm__cu_offsets<1, int64_t>(g, (int64_t)(e + k - base), off);
                    p[k] = dst + off[0] * es;
                }
                if (p[0] || p[1])
                    normal_pair(r, x + (e - e0) * r.w, p[0], p[1]);
            }
        } else {
            for (uint64_t e = e0; e < e0 + per; e++) {
                if (e < base || e >= end)
                    continue;
                int64_t off[1];
                ndm__cu_offsets<1, int64_t>(g, (int64_t)(e - base), off);
                unsigned w = KIND == K_BERNOULLI ? 1 : r.w;
                rand_value<KIND>(r, x + (e - e0) * w, e, dst + off[0] * es);
            }
        }
    }
}

template <int KIND>
static ndm_status rand_fill(int device, const ndm__tensor *dst, const ndm__cu_rand &r)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    char *data[1] = {(char *)dst->data};
    const int64_t *strides[1] = {dst->strides};
    size_t es[1] = {ndm__cuda_host->dtype_size(dst->dtype)};
    uint64_t base = 0;
    return ndm__cu_run_strided(
        dst->ndim, dst->shape, 1, data, strides, es,
        [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
            uint64_t per = 4 / (KIND == K_BERNOULLI ? 1 : r.w);
            int64_t ng = (int64_t)((base + (uint64_t)n - 1) / per - base / per + 1);
            unsigned blocks = ndm__cuda_blocks(ng);
            if (ng < ((int64_t)1 << 31))
                NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_random<KIND, uint32_t>)(
                    g, p[0], (int)es[0], r, base, n);
            else
                NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_random<KIND, int64_t>)(
                    g, p[0], (int)es[0], r, base, n);
            NDM__CUDA_LAUNCHED(device, "the random kernel");
            base += (uint64_t)n;
            return NDM_OK;
        });
}

static ndm_status cuda_uniform(int device, const ndm__tensor *dst, ndm_rng rng, double lo,
                               double hi)
{
    ndm__cu_rand r;
    memset(&r, 0, sizeof r);
    r.rng = rng, r.dtype = dst->dtype, r.w = ndm__rng_words_float(dst->dtype);
    r.a = lo, r.b = hi, r.below = ndm__uniform_below(hi);
    return rand_fill<K_UNIFORM>(device, dst, r);
}

static ndm_status cuda_normal(int device, const ndm__tensor *dst, ndm_rng rng, double mean,
                              double std)
{
    ndm__cu_rand r;
    memset(&r, 0, sizeof r);
    r.rng = rng, r.dtype = dst->dtype, r.w = ndm__rng_words_float(dst->dtype);
    r.a = mean, r.b = std;
    return rand_fill<K_NORMAL>(device, dst, r);
}

static ndm_status cuda_randint(int device, const ndm__tensor *dst, ndm_rng rng, int64_t lo,
                               int64_t hi)
{
    ndm__cu_rand r;
    memset(&r, 0, sizeof r);
    r.rng = rng, r.dtype = dst->dtype, r.w = ndm__rng_words_randint(lo, hi);
    r.lo = lo, r.range = (uint64_t)hi - (uint64_t)lo;
    return rand_fill<K_RANDINT>(device, dst, r);
}

static ndm_status cuda_bernoulli(int device, const ndm__tensor *dst, ndm_rng rng, double p)
{
    ndm__cu_rand r;
    memset(&r, 0, sizeof r);
    r.rng = rng, r.dtype = dst->dtype, r.range = ndm__rng_threshold(p);
    /* 1 in the dtype's bits, converted as a copy converts */
    switch (dst->dtype) {
#define NDM__CU_ONE_(E)                                                         \
    case E: {                                                                   \
        typename ndm__cu_dt<E>::T one = ndm__cu_dt<E>::st(1.0);                 \
        memcpy(&r.one, &one, sizeof one);                                       \
        r.w = sizeof one;                                                       \
        break;                                                                  \
    }
        NDM__CU_DTYPES(NDM__CU_ONE_)
#undef NDM__CU_ONE_
    }
    return rand_fill<K_BERNOULLI>(device, dst, r);
}

/* Inside-out Fisher-Yates over the draws: each step depends on the last, so
 * one thread runs them, in place. */
__global__ void ndm__k_shuffle(int64_t *a, int64_t s, int64_t n)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = a[i * s];
        a[i * s] = a[k * s];
        a[k * s] = i;
    }
}

static ndm_status cuda_permutation(int device, const ndm__tensor *dst, ndm_rng rng)
{
    ndm__cu_rand r;
    memset(&r, 0, sizeof r);
    r.rng = rng, r.dtype = NDM_I64, r.w = NDM__RNG_WORDS_PERMUTATION;
    ndm_status st = rand_fill<K_DRAWS>(device, dst, r);
    int64_t n = dst->shape[0];
    if (st < 0 || n == 0)
        return st;
    cudaStream_t s = nullptr;
    st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    NDM__LAUNCH(1, 1, 0, s, ndm__k_shuffle)((int64_t *)dst->data, dst->strides[0], n);
    NDM__CUDA_LAUNCHED(device, "the shuffle kernel");
    return NDM_OK;
}

extern "C" const struct ndm__backend_random ndm__cuda_random = {
    .uniform = cuda_uniform,
    .normal = cuda_normal,
    .randint = cuda_randint,
    .bernoulli = cuda_bernoulli,
    .permutation = cuda_permutation,
};
