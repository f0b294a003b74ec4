/* The random family on CUDA: the Philox-4x32-10 stream and the element
 * formulas of random.h, evaluated as the CPU's kernels evaluate them, so a
 * seeded draw gives the CPU's bits on the GPU, for every dtype and layout. */
#include "common.cuh"
#include "iter.cuh"
#include "sort.cuh"

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

/* ---- multinomial ------------------------------------------------------------------
 * A thread per row checks it (and, with replacement, writes its running
 * sums and last positive category to scratch) in the CPU's order of
 * additions; the first refused row's position and reason come back in one
 * word (an atomic minimum of position * 8 + reason), the one download.
 * Then a thread per draw bisects its row (with replacement), or a block
 * per row sorts its categories' keys (sort.cuh) and keeps the first. */

struct ndm__cu_mn {
    const char *probs;
    ndm_dtype t;
    int64_t es, rows, n, ps0, ps1, samples, ds0, ds1;
};

NDM__HD double mn_entry(const ndm__cu_mn &a, int64_t r, int64_t j)
{
    return ndm__mn_load(a.probs + (r * a.ps0 + j * a.ps1) * a.es, a.t);
}

__global__ void ndm__k_mn_rows(ndm__cu_mn a, bool replacement, double *cdf, int64_t *last,
                               unsigned long long *bad)
{
    NDM__CU_LOOP(int64_t, r, a.rows)
    {
        double total = 0;
        int64_t nonzero = 0, lastpos = 0;
        int why = NDM__MN_OK;
        for (int64_t j = 0; j < a.n && !why; j++) {
            double p = mn_entry(a, r, j);
            why = ndm__mn_check(p);
            if (why) {
                atomicMin(bad, (unsigned long long)(r * a.n + j) << 3 | (unsigned)why);
                break;
            }
            total = NDM__RNG_DADD(total, p);
            if (cdf)
                cdf[r * a.n + j] = total;
            nonzero += p > 0;
            lastpos = p > 0 ? j : lastpos;
        }
        if (why)
            continue;
        why = total == 0                              ? NDM__MN_ZERO_SUM
              : !(total - total == 0)                 ? NDM__MN_OVERFLOW
              : !replacement && nonzero < a.samples ? NDM__MN_FEW
                                                      : NDM__MN_OK;
        if (why)
            atomicMin(bad, (unsigned long long)(r * a.n) << 3 | (unsigned)why);
        if (last)
            last[r] = lastpos;
    }
}

__global__ void ndm__k_mn_pick(ndm__cu_mn a, ndm_rng rng, const double *cdf, const int64_t *last,
                               int64_t *dst)
{
    NDM__CU_LOOP(int64_t, i, a.rows * a.samples)
    {
        int64_t r = i / a.samples, s = i % a.samples;
        uint32_t w[2];
        ndm__mn_words(rng, (uint64_t)i, w);
        dst[r * a.ds0 + s * a.ds1] = ndm__mn_pick(w, cdf + r * a.n, a.n, last[r]);
    }
}

__global__ void ndm__k_mn_sorted(ndm__cu_mn a, ndm_rng rng, int64_t *dst, ndm__sort_pair *room,
                                 int64_t per)
{
    ndm__sort_pair *p = room + (int64_t)blockIdx.x * per;
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
            ndm__sort_pair q = ndm__cu_sort_pad();
            if (j < a.n) {
                uint32_t w[2];
                ndm__mn_words(rng, (uint64_t)(r * a.n + j), w);
                q.key = ndm__mn_key(w, mn_entry(a, r, j));
                q.pos = j;
            }
            p[j] = q;
        }
        __syncthreads();
        ndm__cu_block_sort(p, per);
        for (int64_t s = threadIdx.x; s < a.samples; s += blockDim.x)
            dst[r * a.ds0 + s * a.ds1] = p[s].pos;
        __syncthreads(); /* the room serves the block's next row */
    }
}

static ndm_status cuda_multinomial(int device, const ndm__tensor *dst, const ndm__tensor *probs,
                                   ndm_rng rng, bool replacement, int64_t bad[2])
{
    bad[0] = 0, bad[1] = NDM__MN_OK;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    ndm__cu_mn a;
    a.probs = (const char *)probs->data, a.t = probs->dtype;
    a.es = (int64_t)ndm__cuda_host->dtype_size(probs->dtype);
    a.rows = probs->shape[0], a.n = probs->shape[1];
    a.ps0 = probs->strides[0], a.ps1 = probs->strides[1];
    a.samples = dst->shape[1], a.ds0 = dst->strides[0], a.ds1 = dst->strides[1];
    if (a.rows == 0)
        return NDM_OK;
    /* the refusal word, then (with replacement) the sums and last positions */
    size_t sums = replacement ? (size_t)(a.rows * a.n) : 0;
    void *ws = NULL;
    st = ndm__cu_scratch_get(device, s, 8 + 8 * sums + 8 * (size_t)a.rows, &ws,
                             "the row sums of multinomial");
    if (st < 0)
        return st;
    unsigned long long *word = (unsigned long long *)ws, found = ~0ull;
    double *cdf = replacement ? (double *)ws + 1 : NULL;
    int64_t *last = replacement ? (int64_t *)ws + 1 + sums : NULL;
    cudaError_t e = cudaMemsetAsync(word, 0xff, sizeof found, s);
    if (e != cudaSuccess)
        st = ndm__cuda_check(device, e, "cudaMemsetAsync");
    if (st >= 0) {
        NDM__LAUNCH(ndm__cuda_blocks(a.rows), NDM__CUDA_THREADS, 0, s, ndm__k_mn_rows)(
            a, replacement, cdf, last, word);
        e = cudaGetLastError();
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(&found, word, sizeof found, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s);
        if (e != cudaSuccess)
            st = ndm__cuda_check(device, e, "the row check of multinomial");
    }
    if (st >= 0 && found != ~0ull) {
        bad[0] = (int64_t)(found >> 3), bad[1] = (int64_t)(found & 7);
    } else if (st >= 0 && a.samples > 0 && replacement) {
        NDM__LAUNCH(ndm__cuda_blocks(a.rows * a.samples), NDM__CUDA_THREADS, 0, s,
                    ndm__k_mn_pick)(a, rng, cdf, last, (int64_t *)dst->data);
        e = cudaGetLastError();
        if (e != cudaSuccess)
            st = ndm__cuda_check(device, e, "launch of the multinomial kernel");
    } else if (st >= 0 && a.samples > 0) {
        int64_t per = ndm__cu_sort_room(a.n);
        unsigned blocks = ndm__cu_sort_blocks(a.rows, per);
        void *room = NULL;
        st = ndm__cu_scratch_get(device, s, (size_t)blocks * (size_t)per * sizeof(ndm__sort_pair),
                                 &room, "the keys of multinomial");
        if (st >= 0) {
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_mn_sorted)(
                a, rng, (int64_t *)dst->data, (ndm__sort_pair *)room, per);
            e = cudaGetLastError();
            if (e != cudaSuccess)
                st = ndm__cuda_check(device, e, "launch of the multinomial kernel");
            ndm_status fs = ndm__cu_scratch_put(device, s, room);
            st = st < 0 ? st : fs;
        }
    }
    ndm_status fs = ndm__cu_scratch_put(device, s, ws);
    return st < 0 ? st : fs;
}

extern "C" const struct ndm__backend_random ndm__cuda_random = {
    .uniform = cuda_uniform,
    .normal = cuda_normal,
    .randint = cuda_randint,
    .bernoulli = cuda_bernoulli,
    .permutation = cuda_permutation,
    .multinomial = cuda_multinomial,
};
