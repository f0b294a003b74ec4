/* The random family of the backend table, and the Philox-4x32-10 block
 * function and stream layout that every backend follows (see ndm/random.h). */
#ifndef NDM_BACKEND_RANDOM_H
#define NDM_BACKEND_RANDOM_H

#include <math.h>

#include "backend.h"
#include "ndm/random.h"

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
};

extern const struct ndm__backend_random ndm__cpu_random;
extern const struct ndm__backend_random ndm__cpu_ref_random;
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

#define NDM__PHILOX_M0 UINT32_C(0xD2511F53)
#define NDM__PHILOX_M1 UINT32_C(0xCD9E8D57)
#define NDM__PHILOX_W0 UINT32_C(0x9E3779B9)
#define NDM__PHILOX_W1 UINT32_C(0xBB67AE85)

/* Philox-4x32-10 in place on one counter. */
static inline void ndm__philox(uint32_t c[4], uint32_t k0, uint32_t k1)
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
static inline void ndm__rng_block(ndm_rng rng, uint64_t b, uint32_t out[4])
{
    uint64_t c = rng.offset + b;
    out[0] = (uint32_t)c;
    out[1] = (uint32_t)(c >> 32);
    out[2] = (uint32_t)rng.stream;
    out[3] = (uint32_t)(rng.stream >> 32);
    ndm__philox(out, (uint32_t)rng.seed, (uint32_t)(rng.seed >> 32));
}

/* Word j of the stream of rng. */
static inline uint32_t ndm__rng_word(ndm_rng rng, uint64_t j)
{
    uint32_t w[4];
    ndm__rng_block(rng, j / 4, w);
    return w[j % 4];
}

/* The high 64 bits of a 64x64-bit product. */
static inline uint64_t ndm__mulhi64(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
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
static inline uint64_t ndm__rng_x64(const uint32_t *w)
{
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}
/* [0, 1) */
static inline double ndm__rng_u24(uint32_t w) { return (double)(w >> 8) * 0x1p-24; }
static inline double ndm__rng_u53(const uint32_t *w)
{
    return (double)(ndm__rng_x64(w) >> 11) * 0x1p-53;
}
/* (0, 1] */
static inline double ndm__rng_u24_open(uint32_t w) { return (double)((w >> 8) + 1) * 0x1p-24; }
static inline double ndm__rng_u53_open(const uint32_t *w)
{
    return (double)((ndm__rng_x64(w) >> 11) + 1) * 0x1p-53;
}
/* lo + floor(x * range / 2^64) over 2 words, or 2^128 over 4 (range > 2^32). */
static inline int64_t ndm__rng_randint(const uint32_t *w, unsigned words, int64_t lo,
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
static inline uint64_t ndm__rng_threshold(double p)
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
    b.f16 = ndm_f32_to_f16((float)hi);
    while ((double)ndm_f16_to_f32(b.f16) >= hi)
        b.f16 = ndm__half_down(b.f16);
    b.bf16 = ndm_f32_to_bf16((float)hi);
    while ((double)ndm_bf16_to_f32(b.bf16) >= hi)
        b.bf16 = ndm__half_down(b.bf16);
    return b;
}

#endif
