/* Fast CPU random kernels: Philox blocks eight or sixteen at a time (AVX2
 * when the CPU has it, portable lanes otherwise), values made a tile at a
 * time with inline polynomials for log, sin and cos, tiles spread over the
 * thread pool. The numbers depend on the element's flat index only, never
 * on the split or on the code path. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../random.h"
#include "isa.h"
#include "convert.h"
#include "index_cpu.h"
#include "parallel.h"

#define LANES 16
/* Elements per tile; a tile's words and values stay in L1. */
#define TILE 256

/* Blocks [b0, b0 + nb) of the stream, four words each, into out: the
 * portable version, sixteen blocks side by side. */
static void philox_lanes(ndm_rng rng, uint64_t b0, int64_t nb, uint32_t *out)
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

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_PATH 1

/* The same blocks with AVX2, sixteen at a time as two independent sets of
 * eight lanes, so one set's multiplies run while the other's wait. The
 * compiler cannot widen the 32x32->64-bit products well by itself: even
 * lanes multiply in place, odd lanes after a shift, blends rejoin halves. */
typedef struct avx_state {
    __m256i x0, x1, x2, x3;
} avx_state;

__attribute__((target("avx2"))) static inline avx_state avx_start(ndm_rng rng, uint64_t c)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i bias = _mm256_set1_epi32(INT32_MIN);
    /* counters c .. c+7: the low words add the lane, a wrap carries into the high word */
    __m256i base = _mm256_set1_epi32((int)(uint32_t)c);
    __m256i lo = _mm256_add_epi32(base, lane);
    __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(base, bias), _mm256_xor_si256(lo, bias));
    avx_state s = {lo, _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(c >> 32)), carry),
                   _mm256_set1_epi32((int)(uint32_t)rng.stream),
                   _mm256_set1_epi32((int)(uint32_t)(rng.stream >> 32))};
    return s;
}

__attribute__((target("avx2"))) static inline avx_state avx_round(avx_state s, __m256i ka,
                                                                   __m256i kb)
{
    const __m256i m0 = _mm256_set1_epi64x(NDM__PHILOX_M0), m1 = _mm256_set1_epi64x(NDM__PHILOX_M1);
    __m256i pe0 = _mm256_mul_epu32(s.x0, m0);
    __m256i po0 = _mm256_mul_epu32(_mm256_srli_epi64(s.x0, 32), m0);
    __m256i pe1 = _mm256_mul_epu32(s.x2, m1);
    __m256i po1 = _mm256_mul_epu32(_mm256_srli_epi64(s.x2, 32), m1);
    __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xaa);
    __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xaa);
    __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xaa);
    __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xaa);
    avx_state n = {_mm256_xor_si256(_mm256_xor_si256(hi1, s.x1), ka), lo1,
                   _mm256_xor_si256(_mm256_xor_si256(hi0, s.x3), kb), lo0};
    return n;
}

/* Lanes to blocks: block l is (x0[l], x1[l], x2[l], x3[l]); eight blocks out. */
__attribute__((target("avx2"))) static inline void avx_store(avx_state s, uint32_t *out)
{
    __m256i t0 = _mm256_unpacklo_epi32(s.x0, s.x1), t1 = _mm256_unpackhi_epi32(s.x0, s.x1);
    __m256i t2 = _mm256_unpacklo_epi32(s.x2, s.x3), t3 = _mm256_unpackhi_epi32(s.x2, s.x3);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i *o = (__m256i *)out;
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
}

__attribute__((target("avx2"))) static void philox_avx2(ndm_rng rng, uint64_t b0, int64_t nb,
                                                       uint32_t *out)
{
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        uint64_t c = rng.offset + b0 + (uint64_t)b;
        avx_state s = avx_start(rng, c), t = avx_start(rng, c + 8);
        uint32_t ka = (uint32_t)rng.seed, kb = (uint32_t)(rng.seed >> 32);
        for (int r = 0; r < 10; r++) {
            __m256i va = _mm256_set1_epi32((int)ka), vb = _mm256_set1_epi32((int)kb);
            s = avx_round(s, va, vb);
            t = avx_round(t, va, vb);
            ka += NDM__PHILOX_W0;
            kb += NDM__PHILOX_W1;
        }
        avx_store(s, out + 4 * b);
        avx_store(t, out + 4 * b + 32);
    }
    if (b < nb)
        philox_lanes(rng, b0 + (uint64_t)b, nb - b, out + 4 * b);
}
#endif

void ndm__cpu_random_simd(bool on) { (void)ndm__cpu_isa_force(on ? -1 : NDM__CPU_ISA_REF); }

/* Blocks [b0, b0 + nb) of the stream into out, with the widest code this
 * CPU runs; every version gives the same words. */
static void philox_blocks(ndm_rng rng, uint64_t b0, int64_t nb, uint32_t *out)
{
#ifdef HAVE_AVX2_PATH
    if (ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2) {
        philox_avx2(rng, b0, nb, out);
        return;
    }
#endif
    philox_lanes(rng, b0, nb, out);
}

/* ---- Box-Muller ------------------------------------------------------------------ */

/* ln, sin and cos are random.h's (shared with the CUDA kernels); square roots
 * go through SSE, because sqrtf keeps its errno path, which stops the
 * vectoriser. */

/* In-place square roots of n values >= 0 (exact IEEE roots either way). */
static inline void sqrt_f32(float *v, int64_t n)
{
    int64_t i = 0;
#if defined(__SSE__)
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(v + i, _mm_sqrt_ps(_mm_loadu_ps(v + i)));
#endif
    for (; i < n; i++)
        v[i] = sqrtf(v[i]);
}

static inline void sqrt_f64(double *v, int64_t n)
{
    int64_t i = 0;
#if defined(__SSE2__)
    for (; i + 2 <= n; i += 2)
        _mm_storeu_pd(v + i, _mm_sqrt_pd(_mm_loadu_pd(v + i)));
#endif
    for (; i < n; i++)
        v[i] = sqrt(v[i]);
}

/* ---- values ----------------------------------------------------------------------- */

#define PAIRS (TILE / 2)

/* The loop `for i in [0, n): body`, written with the constant bound N when
 * n == N (a full tile) so that the compiler vectorises it. */
#define FOR_N(i, n, N, ...)                                                     \
    do {                                                                        \
        if ((n) == (N)) {                                                       \
            for (int64_t i = 0; i < (N); i++) {                                 \
                __VA_ARGS__;                                                    \
            }                                                                   \
        } else {                                                                \
            for (int64_t i = 0; i < (n); i++) {                                 \
                __VA_ARGS__;                                                    \
            }                                                                   \
        }                                                                       \
    } while (0)

typedef struct rand_job rand_job;
/* Values of elements [first, first + m) of dst's dtype into vals (packed),
 * from their words w (w[0] is the first word of element `first`). */
typedef void (*gen_fn)(const rand_job *j, const uint32_t *restrict w, uint64_t first, int64_t m,
                       void *restrict vals);

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

static void uniform_f32(const rand_job *j, const uint32_t *restrict w, uint64_t first, int64_t m,
                        void *restrict vals)
{
    (void)first;
    float *o = vals, below = j->below.f32;
    double lo = j->a, span = j->b - j->a, hi = j->b;
    FOR_N(i, m, TILE, {
        float f = (float)(lo + span * ((double)(int32_t)(w[i] >> 8) * 0x1p-24));
        o[i] = (double)f >= hi ? below : f;
    });
}

static void uniform_f64(const rand_job *j, const uint32_t *restrict w, uint64_t first, int64_t m,
                        void *restrict vals)
{
    (void)first;
    double *o = vals, lo = j->a, span = j->b - j->a, hi = j->b, below = j->below.f64;
    FOR_N(i, m, TILE, {
        double v = lo + span * ndm__rng_u53(w + 2 * i);
        o[i] = v >= hi ? below : v;
    });
}

/* f16 and bf16 round the f32 value; `below` replaces what rounds up to hi */
#define NDM__UNIFORM_HALF(N, TO, FROM)                                          \
    static void uniform_##N(const rand_job *j, const uint32_t *restrict w, uint64_t first, \
                            int64_t m, void *restrict vals)                     \
    {                                                                           \
        (void)first;                                                            \
        uint16_t *o = vals;                                                     \
        double lo = j->a, span = j->b - j->a, hi = j->b;                        \
        for (int64_t i = 0; i < m; i++) {                                       \
            uint16_t h = TO((float)(lo + span * ndm__rng_u24(w[i])));           \
            o[i] = (double)FROM(h) >= hi ? j->below.N : h;                      \
        }                                                                       \
    }
NDM__UNIFORM_HALF(f16, ndm_f32_to_f16, ndm_f16_to_f32)
NDM__UNIFORM_HALF(bf16, ndm_f32_to_bf16, ndm_bf16_to_f32)

/* Standard normal pairs (z[2q], z[2q+1]) = r (cos, sin) for np pairs. */
static void box_muller_f32(const uint32_t *restrict w, int64_t np, float *restrict z)
{
    float r[PAIRS + 1], u[PAIRS + 1], sn[PAIRS + 1], cs[PAIRS + 1];
    FOR_N(q, np, PAIRS, {
        r[q] = -2.0f * ndm__rng_log_f32((float)((int32_t)(w[2 * q] >> 8) + 1) * 0x1p-24f);
        u[q] = (float)(int32_t)(w[2 * q + 1] >> 8) * 0x1p-24f;
    });
    sqrt_f32(r, np);
    FOR_N(q, np, PAIRS, ndm__rng_sincos2pi_f32(u[q], &sn[q], &cs[q]));
    FOR_N(q, np, PAIRS, {
        z[2 * q] = r[q] * cs[q];
        z[2 * q + 1] = r[q] * sn[q];
    });
}

static void normal_f32(const rand_job *j, const uint32_t *restrict w, uint64_t first, int64_t m,
                       void *restrict vals)
{
    (void)first;
    float z[TILE + 2], *o = vals, mean = (float)j->a, std = (float)j->b;
    box_muller_f32(w, m / 2, z);
    FOR_N(i, m, TILE, o[i] = mean + std * z[i]);
}

#define NDM__NORMAL_HALF(N, TO)                                                 \
    static void normal_##N(const rand_job *j, const uint32_t *restrict w, uint64_t first, \
                           int64_t m, void *restrict vals)                      \
    {                                                                           \
        (void)first;                                                            \
        float z[TILE + 2], mean = (float)j->a, std = (float)j->b;               \
        uint16_t *o = vals;                                                     \
        box_muller_f32(w, m / 2, z);                                            \
        for (int64_t i = 0; i < m; i++)                                         \
            o[i] = TO(mean + std * z[i]);                                       \
    }
NDM__NORMAL_HALF(f16, ndm_f32_to_f16)
NDM__NORMAL_HALF(bf16, ndm_f32_to_bf16)

static void normal_f64(const rand_job *j, const uint32_t *restrict w, uint64_t first, int64_t m,
                       void *restrict vals)
{
    (void)first;
    double r[PAIRS + 1], u[PAIRS + 1], sn[PAIRS + 1], cs[PAIRS + 1], *o = vals;
    int64_t np = m / 2;
    FOR_N(q, np, PAIRS, {
        r[q] = -2.0 * ndm__rng_log_f64(ndm__rng_u53_open(w + 4 * q));
        u[q] = ndm__rng_u53(w + 4 * q + 2);
    });
    sqrt_f64(r, np);
    FOR_N(q, np, PAIRS, ndm__rng_sincos2pi_f64(u[q], &sn[q], &cs[q]));
    FOR_N(q, np, PAIRS, {
        o[2 * q] = j->a + j->b * (r[q] * cs[q]);
        o[2 * q + 1] = j->a + j->b * (r[q] * sn[q]);
    });
}

#define NDM__RANDINT(N, T)                                                      \
    static void randint_##N(const rand_job *j, const uint32_t *restrict w, uint64_t first, \
                            int64_t m, void *restrict vals)                     \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals;                                                            \
        uint64_t lo = (uint64_t)j->lo, range = j->range;                        \
        if (j->w == 2)                                                          \
            for (int64_t i = 0; i < m; i++)                                     \
                o[i] = (T)(int64_t)(lo + ndm__mulhi64(ndm__rng_x64(w + 2 * i), range)); \
        else                                                                    \
            for (int64_t i = 0; i < m; i++)                                     \
                o[i] = (T)ndm__rng_randint(w + 4 * i, 4, j->lo, range);         \
    }
NDM__RANDINT(u8, uint8_t)
NDM__RANDINT(i32, int32_t)
NDM__RANDINT(i64, int64_t)

#define NDM__BERNOULLI(N, T)                                                    \
    static void bernoulli_##N(const rand_job *j, const uint32_t *restrict w, uint64_t first, \
                              int64_t m, void *restrict vals)                   \
    {                                                                           \
        (void)first;                                                            \
        T *o = vals, one, zero;                                                 \
        uint64_t t = j->range;                                                  \
        memcpy(&one, j->one, sizeof one);                                       \
        memcpy(&zero, j->zero, sizeof zero);                                    \
        FOR_N(i, m, TILE, o[i] = (uint64_t)w[i] < t ? one : zero);              \
    }
NDM__BERNOULLI(s1, uint8_t)
NDM__BERNOULLI(s2, uint16_t)
NDM__BERNOULLI(s4, uint32_t)
NDM__BERNOULLI(s8, uint64_t)

/* Step i of the shuffle draws j in [0, i]. */
static void permutation_draws(const rand_job *j, const uint32_t *restrict w, uint64_t first,
                              int64_t m, void *restrict vals)
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
    /* Tiles are aligned to multiples of TILE, whatever the chunk, so that
     * inner tiles are full and their pairs start on even elements. */
    for (int64_t t0 = b, t1; t0 < e; t0 = t1) {
        t1 = (t0 / TILE + 1) * TILE;
        t1 = t1 < e ? t1 : e;
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

/* The one of a float distribution's generators, given for f32, f64, f16
 * and bf16 in that order, that fills dtype t. */
static gen_fn float_gen(ndm_dtype t, const gen_fn g[4])
{
    return t == NDM_F32 ? g[0] : t == NDM_F64 ? g[1] : t == NDM_F16 ? g[2] : g[3];
}

static ndm_status fast_uniform(int device, const ndm__tensor *dst, ndm_rng rng, double lo,
                               double hi)
{
    (void)device;
    rand_job j = {.dst = dst, .rng = rng, .w = ndm__rng_words_float(dst->dtype), .a = lo,
                  .b = hi, .below = ndm__uniform_below(hi)};
    j.gen = float_gen(dst->dtype, (const gen_fn[4]){uniform_f32, uniform_f64, uniform_f16, uniform_bf16});
    return fill(&j);
}

static ndm_status fast_normal(int device, const ndm__tensor *dst, ndm_rng rng, double mean,
                              double std)
{
    (void)device;
    rand_job j = {.dst = dst, .rng = rng, .w = ndm__rng_words_float(dst->dtype), .pairs = true,
                  .a = mean, .b = std};
    j.gen = float_gen(dst->dtype, (const gen_fn[4]){normal_f32, normal_f64, normal_f16, normal_bf16});
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
    .multinomial = ndm__cpu_multinomial,
};
