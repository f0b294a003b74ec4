/* The random family of the backend table, and the Philox-4x32-10 block
 * function, stream layout and element formulas that every backend follows
 * (see ndm/random.h), written once for the CPU and the CUDA kernels. */
#ifndef NDM_BACKEND_RANDOM_H
#define NDM_BACKEND_RANDOM_H

#include <math.h>

#include "../base/convert_scalar.h"
#include "backend.h"
#include "index_scalar.h"
#include "ndm/random.h"

/* The scalar helpers below run on the CPU and, compiled by nvcc, in CUDA
 * kernels. Float arithmetic that must give the same bits on both goes
 * through NDM__RNG_ADD/MUL: on the GPU they are the explicitly rounded
 * intrinsics, which nvcc never fuses into a multiply-add (plain C here is
 * ISO C, which does not contract either). */
#ifdef __CUDACC__
#define NDM__SCALAR static __host__ __device__ __forceinline__
#else
#define NDM__SCALAR static inline
#endif
#ifdef __CUDA_ARCH__
#define NDM__RNG_FADD(a, b) __fadd_rn((a), (b))
#define NDM__RNG_FMUL(a, b) __fmul_rn((a), (b))
#define NDM__RNG_DADD(a, b) __dadd_rn((a), (b))
#define NDM__RNG_DMUL(a, b) __dmul_rn((a), (b))
#else
#define NDM__RNG_FADD(a, b) ((a) + (b))
#define NDM__RNG_FMUL(a, b) ((a) * (b))
#define NDM__RNG_DADD(a, b) ((a) + (b))
#define NDM__RNG_DMUL(a, b) ((a) * (b))
#endif

/* Kernels fill every element of dst (any strides) from the stream of `rng`
 * as ndm/random.h defines it; the dispatcher checks the parameters and
 * advances the caller's generator. Every member is required. */
struct ndm__backend_random {
    /* float dtypes; lo < hi, both finite */
    ndm_status (*uniform)(int device, const ndm__tensor *dst, ndm_rng rng, double lo, double hi);
    /* float dtypes; std >= 0, both finite */
    ndm_status (*normal)(int device, const ndm__tensor *dst, ndm_rng rng, double mean, double std);
    /* u8, i32, i64; lo < hi, both representable */
    ndm_status (*randint)(int device, const ndm__tensor *dst, ndm_rng rng, int64_t lo, int64_t hi);
    /* any dtype; 0 <= p <= 1 */
    ndm_status (*bernoulli)(int device, const ndm__tensor *dst, ndm_rng rng, double p);
    /* 1-d i64 */
    ndm_status (*permutation)(int device, const ndm__tensor *dst, ndm_rng rng);
    /* Draws into dst (2-d i64, rows x samples, any strides) from the rows
     * of probs (2-d, rows x categories, a float dtype, any strides), with
     * or without replacement, as ndm/random.h defines it. Every row is
     * checked first: when one fails, bad[0] is the flat position (row *
     * categories + column) it fails at and bad[1] the NDM__MN_* reason,
     * and nothing is written; otherwise bad[1] is 0. Without replacement,
     * samples <= categories. */
    ndm_status (*multinomial)(int device, const ndm__tensor *dst, const ndm__tensor *probs,
                              ndm_rng rng, bool replacement, int64_t bad[2]);
};

/* Why a row of multinomial's probabilities is refused; the first in the
 * row's order of checks (its entries left to right, then its sum) wins,
 * and the first refused row. */
enum {
    NDM__MN_OK,
    NDM__MN_NEGATIVE, /* an entry below 0 (at its column) */
    NDM__MN_NONFINITE, /* an entry that is NaN or infinite (at its column) */
    NDM__MN_ZERO_SUM, /* every entry 0 (at column 0) */
    NDM__MN_OVERFLOW, /* the sum overflows (at column 0) */
    NDM__MN_FEW /* fewer nonzero entries than samples without replacement (column 0) */
};

extern const struct ndm__backend_random ndm__cpu_random;
extern const struct ndm__backend_random ndm__cpu_ref_random;
/* The CPU's multinomial (cpu/multinomial.c), in both tables. */
ndm_status ndm__cpu_multinomial(int device, const ndm__tensor *dst, const ndm__tensor *probs,
                                ndm_rng rng, bool replacement, int64_t bad[2]);
/* Test hook: let the fast CPU kernels use SIMD code paths (default on);
 * off forces the reference level on every CPU family (cpu/isa.h). */
void ndm__cpu_random_simd(bool on);

/* Words per element: the layout contract between dispatcher and kernels. */
static inline unsigned ndm__rng_words_float(ndm_dtype t) { return t == NDM_F64 ? 2 : 1; }
static inline unsigned ndm__rng_words_randint(int64_t lo, int64_t hi)
{
    return (uint64_t)hi - (uint64_t)lo <= (UINT64_C(1) << 32) ? 2 : 4;
}
#define NDM__RNG_WORDS_BERNOULLI 1u
#define NDM__RNG_WORDS_PERMUTATION 2u
#define NDM__RNG_WORDS_MULTINOMIAL 2u

#define NDM__PHILOX_M0 UINT32_C(0xD2511F53)
#define NDM__PHILOX_M1 UINT32_C(0xCD9E8D57)
#define NDM__PHILOX_W0 UINT32_C(0x9E3779B9)
#define NDM__PHILOX_W1 UINT32_C(0xBB67AE85)

/* Philox-4x32-10 in place on one counter. */
NDM__SCALAR void ndm__philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)NDM__PHILOX_M0 * c[0];
        uint64_t p1 = (uint64_t)NDM__PHILOX_M1 * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (uint32_t)p1;
        c[2] = n2;
        c[3] = (uint32_t)p0;
        k0 += NDM__PHILOX_W0;
        k1 += NDM__PHILOX_W1;
    }
}

/* Block b of the stream of rng. */
NDM__SCALAR void ndm__rng_block(ndm_rng rng, uint64_t b, uint32_t out[4])
{
    uint64_t c = rng.offset + b;
    out[0] = (uint32_t)c;
    out[1] = (uint32_t)(c >> 32);
    out[2] = (uint32_t)rng.stream;
    out[3] = (uint32_t)(rng.stream >> 32);
    ndm__philox(out, (uint32_t)rng.seed, (uint32_t)(rng.seed >> 32));
}

/* Word j of the stream of rng. */
NDM__SCALAR uint32_t ndm__rng_word(ndm_rng rng, uint64_t j)
{
    uint32_t w[4];
    ndm__rng_block(rng, j / 4, w);
    return w[j % 4];
}

/* The high 64 bits of a 64x64-bit product. */
NDM__SCALAR uint64_t ndm__mulhi64(uint64_t a, uint64_t b)
{
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
    uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint64_t mid = (ll >> 32) + (uint32_t)lh + (uint32_t)hl;
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

/* Element values from their words: the formulas of ndm/random.h. Multi-word
 * values read their words little-endian (the first word is the lowest). */
NDM__SCALAR uint64_t ndm__rng_x64(const uint32_t *w)
{
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}
/* [0, 1) */
NDM__SCALAR double ndm__rng_u24(uint32_t w) { return (double)(w >> 8) * 0x1p-24; }
NDM__SCALAR double ndm__rng_u53(const uint32_t *w)
{
    return (double)(ndm__rng_x64(w) >> 11) * 0x1p-53;
}
/* (0, 1] */
NDM__SCALAR double ndm__rng_u24_open(uint32_t w) { return (double)((w >> 8) + 1) * 0x1p-24; }
NDM__SCALAR double ndm__rng_u53_open(const uint32_t *w)
{
    return (double)((ndm__rng_x64(w) >> 11) + 1) * 0x1p-53;
}
/* lo + floor(x * range / 2^64) over 2 words, or 2^128 over 4 (range > 2^32). */
NDM__SCALAR int64_t ndm__rng_randint(const uint32_t *w, unsigned words, int64_t lo,
                                       uint64_t range)
{
    uint64_t q;
    if (words == 2) {
        q = ndm__mulhi64(ndm__rng_x64(w), range);
    } else {
        uint64_t xl = ndm__rng_x64(w), xh = ndm__rng_x64(w + 2);
        uint64_t lo64 = xh * range, t = ndm__mulhi64(xl, range);
        q = ndm__mulhi64(xh, range) + (lo64 + t < lo64);
    }
    return (int64_t)((uint64_t)lo + q);
}
/* A word is below this with probability p (to within 2^-32). */
NDM__SCALAR uint64_t ndm__rng_threshold(double p)
{
    return p >= 1.0 ? UINT64_C(1) << 32 : (uint64_t)(p * 4294967296.0);
}

/* One step toward -inf for f16 and bf16 bits (sign and magnitude). */
static inline uint16_t ndm__half_down(uint16_t h)
{
    if (!(h & 0x7fffu))
        return 0x8001u;
    return (uint16_t)(h & 0x8000u ? h + 1 : h - 1);
}

/* The largest value of each float dtype below hi: a uniform value that
 * rounds up to hi is replaced by it. */
typedef struct ndm__below {
    double f64;
    float f32;
    uint16_t f16, bf16;
} ndm__below;

static inline ndm__below ndm__uniform_below(double hi)
{
    ndm__below b;
    b.f64 = nextafter(hi, -INFINITY);
    b.f32 = (float)hi;
    if ((double)b.f32 >= hi)
        b.f32 = nextafterf(b.f32, -INFINITY);
    b.f16 = ndm__f32_to_f16((float)hi);
    while ((double)ndm__f16_to_f32(b.f16) >= hi)
        b.f16 = ndm__half_down(b.f16);
    b.bf16 = ndm__f32_to_bf16((float)hi);
    while ((double)ndm__bf16_to_f32(b.bf16) >= hi)
        b.bf16 = ndm__half_down(b.bf16);
    return b;
}

/* ---- ln, sin and cos for Box-Muller -------------------------------------------
 * normal's own polynomials (ndm/random.h): plain +, *, / and exact steps
 * only, so that the CPU and the GPU give the same bits. The CPU vectorises
 * loops over them only when they have no branches and no call: conditions
 * pick between constants that then multiply. */

/* ln x for normal x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.1716, as a series in s^2. */
NDM__SCALAR float ndm__rng_log_f32(float x)
{
    uint32_t b = ndm__f32_bits(x);
    int32_t e = (int32_t)(b >> 23) - 127;
    b = (b & 0x7fffffu) | 0x3f800000u;
    float m = ndm__bits_f32(b);
    int32_t big = (b & 0x7fffffu) > 0x3504f3u; /* m > sqrt(2) */
    m = NDM__RNG_FMUL(m, big ? 0.5f : 1.0f);
    e += big;
    float s = (m - 1.0f) / (m + 1.0f), z = NDM__RNG_FMUL(s, s);
    float p = NDM__RNG_FADD(1.0f / 7, NDM__RNG_FMUL(z, 1.0f / 9));
    p = NDM__RNG_FADD(1.0f / 5, NDM__RNG_FMUL(z, p));
    p = NDM__RNG_FADD(1.0f / 3, NDM__RNG_FMUL(z, p));
    p = NDM__RNG_FADD(1.0f, NDM__RNG_FMUL(z, p));
    float fe = (float)e;
    return NDM__RNG_FADD(NDM__RNG_FMUL(fe, 0.693145751953125f),
                         NDM__RNG_FADD(NDM__RNG_FMUL(fe, 1.428606765330187045e-06f),
                                       NDM__RNG_FMUL(NDM__RNG_FMUL(2.0f, s), p)));
}

NDM__SCALAR double ndm__rng_log_f64(double x)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    /* the exponent as a double without an integer conversion: 2^52 + k - 2^52 */
    uint64_t eb = UINT64_C(0x4330000000000000) | (b >> 52);
    double e;
    memcpy(&e, &eb, 8);
    e -= 4503599627370496.0 + 1023.0;
    b = (b & UINT64_C(0xfffffffffffff)) | UINT64_C(0x3ff0000000000000);
    double m;
    memcpy(&m, &b, 8);
    int64_t big = (b & UINT64_C(0xfffffffffffff)) > UINT64_C(0x6a09e667f3bcd); /* m > sqrt(2) */
    m = NDM__RNG_DMUL(m, big ? 0.5 : 1.0);
    e = e + (big ? 1.0 : 0.0);
    double s = (m - 1.0) / (m + 1.0), z = NDM__RNG_DMUL(s, s);
    double p = NDM__RNG_DADD(1.0 / 19, NDM__RNG_DMUL(z, 1.0 / 21));
    p = NDM__RNG_DADD(1.0 / 17, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 15, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 13, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 11, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 9, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 7, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 5, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0 / 3, NDM__RNG_DMUL(z, p));
    p = NDM__RNG_DADD(1.0, NDM__RNG_DMUL(z, p));
    return NDM__RNG_DADD(NDM__RNG_DMUL(e, 6.93147180369123816490e-01),
                         NDM__RNG_DADD(NDM__RNG_DMUL(e, 1.90821492927058770002e-10),
                                       NDM__RNG_DMUL(NDM__RNG_DMUL(2.0, s), p)));
}

/* sin and cos of 2 pi u for u in [0, 1): the nearest quarter turn q is taken
 * out exactly (4u is exact), the rest x in [-pi/4, pi/4] goes through Taylor
 * series, and the quarter turns swap and negate the pair. */
NDM__SCALAR void ndm__rng_sincos2pi_f32(float u, float *sn, float *cs)
{
    float t = 4.0f * u;
    int32_t q = (int32_t)(t + 0.5f);
    float x = NDM__RNG_FMUL(t - (float)q, 1.57079632679489662f), z = NDM__RNG_FMUL(x, x);
    float s = NDM__RNG_FADD(-1.0f / 5040, NDM__RNG_FMUL(z, 1.0f / 362880));
    s = NDM__RNG_FADD(1.0f / 120, NDM__RNG_FMUL(z, s));
    s = NDM__RNG_FADD(-1.0f / 6, NDM__RNG_FMUL(z, s));
    s = NDM__RNG_FMUL(x, NDM__RNG_FADD(1.0f, NDM__RNG_FMUL(z, s)));
    float c = NDM__RNG_FADD(1.0f / 40320, NDM__RNG_FMUL(z, -1.0f / 3628800));
    c = NDM__RNG_FADD(-1.0f / 720, NDM__RNG_FMUL(z, c));
    c = NDM__RNG_FADD(1.0f / 24, NDM__RNG_FMUL(z, c));
    c = NDM__RNG_FADD(-0.5f, NDM__RNG_FMUL(z, c));
    c = NDM__RNG_FADD(1.0f, NDM__RNG_FMUL(z, c));
    float a = q & 1 ? c : s, b = q & 1 ? s : c;
    *sn = a * (q & 2 ? -1.0f : 1.0f);
    *cs = b * ((q + 1) & 2 ? -1.0f : 1.0f);
}

NDM__SCALAR void ndm__rng_sincos2pi_f64(double u, double *sn, double *cs)
{
    double t = 4.0 * u;
    int64_t q = (int64_t)(t + 0.5);
    double x = NDM__RNG_DMUL(t - (double)q, 1.57079632679489661923), z = NDM__RNG_DMUL(x, x);
    double s = 1.0 / 355687428096000.0; /* 1/17! */
    s = NDM__RNG_DADD(-1.0 / 1307674368000.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(1.0 / 6227020800.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(-1.0 / 39916800.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(1.0 / 362880.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(-1.0 / 5040.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(1.0 / 120.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DADD(-1.0 / 6.0, NDM__RNG_DMUL(z, s));
    s = NDM__RNG_DMUL(x, NDM__RNG_DADD(1.0, NDM__RNG_DMUL(z, s)));
    double c = 1.0 / 20922789888000.0; /* 1/16! */
    c = NDM__RNG_DADD(-1.0 / 87178291200.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(1.0 / 479001600.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(-1.0 / 3628800.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(1.0 / 40320.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(-1.0 / 720.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(1.0 / 24.0, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(-0.5, NDM__RNG_DMUL(z, c));
    c = NDM__RNG_DADD(1.0, NDM__RNG_DMUL(z, c));
    double a = q & 1 ? c : s, b = q & 1 ? s : c;
    *sn = a * (q & 2 ? -1.0 : 1.0);
    *cs = b * ((q + 1) & 2 ? -1.0 : 1.0);
}

/* ---- multinomial --------------------------------------------------------------
 * The steps of ndm/random.h's definition that every backend takes in the
 * same order, so that the draws agree bit for bit. */

/* Entry p of a probability row, a float dtype, as double (exact). */
NDM__SCALAR double ndm__mn_load(const void *p, ndm_dtype t)
{
    switch (t) {
    case NDM_F16: return (double)ndm__f16_to_f32(*(const uint16_t *)p);
    case NDM_BF16: return (double)ndm__bf16_to_f32(*(const uint16_t *)p);
    case NDM_F32: return (double)*(const float *)p;
    default: return *(const double *)p;
    }
}

/* The two words of element i (two per element: never across a block). */
NDM__SCALAR void ndm__mn_words(ndm_rng rng, uint64_t i, uint32_t w[2])
{
    uint32_t b[4];
    ndm__rng_block(rng, i / 2, b);
    w[0] = b[(i % 2) * 2];
    w[1] = b[(i % 2) * 2 + 1];
}

/* The check of one entry, in the row's order: a reason or NDM__MN_OK. */
NDM__SCALAR int ndm__mn_check(double p)
{
    if (p < 0)
        return NDM__MN_NEGATIVE;
    if (!(p - p == 0))
        return NDM__MN_NONFINITE;
    return NDM__MN_OK;
}

/* Without replacement: the sort key of category j with probability p whose
 * element words are w, an exponential variate of rate p, -ln(u) / p with u
 * in (0, 1] (ln by normal's polynomial); the categories of the smallest
 * keys are the draw. A zero p never comes before a positive one. */
NDM__SCALAR uint64_t ndm__mn_key(const uint32_t w[2], double p)
{
    if (!(p > 0))
        return ~(uint64_t)0;
    return ndm__sort_key_f64(-ndm__rng_log_f64(ndm__rng_u53_open(w)) / p);
}

/* With replacement: the category of a draw whose element words are w from
 * the running sums c[0..n) of a row (c[n - 1] its total), last the last
 * category of positive probability: the first j with c[j] > u * total,
 * u in [0, 1), found by bisection; last when rounding leaves none. */
NDM__SCALAR int64_t ndm__mn_pick(const uint32_t w[2], const double *c, int64_t n, int64_t last)
{
    double t = NDM__RNG_DMUL(ndm__rng_u53(w), c[n - 1]);
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (c[mid] > t)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < n ? lo : last;
}

#undef NDM__SCALAR

#endif
