/* Branch-free scalar math for the fast CPU kernels: written as selects so the
 * vectorizer turns each function into straight SIMD code inside a loop.
 *
 * Conversions reproduce convert.h bit for bit (the reference semantics):
 * f16/bf16 round to nearest even, float to integer saturates (NaN gives 0).
 * The f32 functions (exp, log, expm1, log1p, tanh, sigmoid, silu, gelu, sin,
 * cos) are polynomial approximations fitted for this file; they stay within a
 * few units in the last place of the correctly rounded result over the whole
 * range, keep IEEE special values (NaN in gives NaN, infinities give limits),
 * and flush nothing to zero. Coefficients were fitted on Chebyshev nodes. */
#ifndef NDM_CPU_EW_MATH_H
#define NDM_CPU_EW_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t ndm__f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float ndm__u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- storage conversions ------------------------------------------------ */

static inline float ndm__h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;       /* rebias 15 -> 127 */
    uint32_t special = (em << 13) | 0x7f800000u;      /* inf and NaN keep the payload */
    float sub = (float)(int32_t)em * 5.9604644775390625e-8f; /* em * 2^-24 */
    uint32_t bits = em >= 0x7c00u ? special : em >= 0x400u ? normal : ndm__f2u(sub);
    return ndm__u2f(bits | sign);
}

static inline uint16_t ndm__f2h(float x)
{
    uint32_t u = ndm__f2u(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    int32_t e = (int32_t)exp - 112;
    /* normal half: round the 13 dropped bits to nearest even; a carry into
     * the exponent is correct (it may give inf) */
    uint32_t nh = ((uint32_t)(e > 0 ? e : 0) << 10) + (man >> 13);
    uint32_t rem = man & 0x1fffu;
    uint32_t up = rem > 0x1000u ? 1u : 0u;
    nh += rem == 0x1000u ? (nh & 1u) : up;
    /* subnormal half */
    int32_t shift = 14 - e;
    shift = shift < 14 ? 14 : shift > 24 ? 24 : shift;
    uint32_t m2 = man | 0x800000u;
    uint32_t sh = m2 >> shift;
    uint32_t rem2 = m2 & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    uint32_t up2 = rem2 > mid ? 1u : 0u;
    sh += rem2 == mid ? (sh & 1u) : up2;
    uint32_t nan = 0x7c00u | (man ? 0x200u | (man >> 13) : 0u);
    uint32_t r = exp == 0xffu ? nan : e >= 31 ? 0x7c00u : e >= 1 ? nh : e >= -10 ? sh : 0u;
    return (uint16_t)(sign | r);
}

static inline float ndm__b2f(uint16_t h) { return ndm__u2f((uint32_t)h << 16); }

static inline uint16_t ndm__f2b(float x)
{
    uint32_t u = ndm__f2u(x);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Saturating float to integer: NaN gives 0, out of range gives the bound. */
static inline int32_t ndm__sat_f32_i32(float v)
{
    float c = v > -2147483648.0f ? v : -2147483648.0f;
    c = c < 2147483520.0f ? c : 2147483520.0f; /* the largest float below 2^31 */
    int32_t r = (int32_t)c;
    r = v >= 2147483648.0f ? INT32_MAX : r;
    return v != v ? 0 : r;
}
static inline int32_t ndm__sat_f64_i32(double v)
{
    double c = v > -2147483648.0 ? v : -2147483648.0;
    c = c < 2147483647.0 ? c : 2147483647.0;
    int32_t r = (int32_t)c;
    return v != v ? 0 : r;
}
static inline int64_t ndm__sat_f32_i64(float v)
{
    float c = v > -9223372036854775808.0f ? v : -9223372036854775808.0f;
    c = c < 9223371487098961920.0f ? c : 9223371487098961920.0f;
    int64_t r = (int64_t)c;
    r = v >= 9223372036854775808.0f ? INT64_MAX : r;
    return v != v ? 0 : r;
}
static inline int64_t ndm__sat_f64_i64(double v)
{
    double c = v > -9223372036854775808.0 ? v : -9223372036854775808.0;
    c = c < 9223372036854774784.0 ? c : 9223372036854774784.0;
    int64_t r = (int64_t)c;
    r = v >= 9223372036854775808.0 ? INT64_MAX : r;
    return v != v ? 0 : r;
}
static inline uint8_t ndm__sat_f32_u8(float v)
{
    float c = v > 0.0f ? v : 0.0f;
    c = c < 255.0f ? c : 255.0f;
    return (uint8_t)(int32_t)c;
}
static inline uint8_t ndm__sat_f64_u8(double v)
{
    double c = v > 0.0 ? v : 0.0;
    c = c < 255.0 ? c : 255.0;
    return (uint8_t)(int32_t)c;
}

/* ---- rounding ----------------------------------------------------------- */

/* Nearest, ties to even: adding and removing 2^23 leaves the integer part
 * rounded by the FPU's default mode. Larger magnitudes, infinities and NaN
 * are already integers (or NaN) and pass through. */
static inline float ndm__roundevenf(float x)
{
    float a = fabsf(x);
    float r = (a + 8388608.0f) - 8388608.0f;
    return a < 8388608.0f ? copysignf(r, x) : x;
}
static inline double ndm__roundeven(double x)
{
    double a = fabs(x);
    double r = (a + 4503599627370496.0) - 4503599627370496.0;
    return a < 4503599627370496.0 ? copysign(r, x) : x;
}
static inline float ndm__floorf(float x)
{
    float r = ndm__roundevenf(x);
    return r > x ? r - 1.0f : r;
}
static inline float ndm__ceilf(float x)
{
    float r = ndm__roundevenf(x);
    return r < x ? r + 1.0f : r;
}
static inline double ndm__floor(double x)
{
    double r = ndm__roundeven(x);
    return r > x ? r - 1.0 : r;
}
static inline double ndm__ceil(double x)
{
    double r = ndm__roundeven(x);
    return r < x ? r + 1.0 : r;
}

/* ---- f32 transcendental functions --------------------------------------- */

#define NDM__LOG2E_F 1.44269504088896341f
#define NDM__LN2_HI_F 0.693359375f           /* 9 bits: k * LN2_HI is exact */
#define NDM__LN2_LO_F -2.12194440054690583e-4f
#define NDM__RND_F 12582912.0f               /* 1.5 * 2^23 */

/* (e^r - 1 - r) / r^2 on |r| <= ln2/2, degree 5. */
static inline float ndm__expq(float r)
{
    float q = 1.989098087e-04f;
    q = q * r + 1.393364103e-03f;
    q = q * r + 8.333310934e-03f;
    q = q * r + 4.166646501e-02f;
    q = q * r + 1.666666668e-01f;
    q = q * r + 5.000000013e-01f;
    return q;
}

/* 2^k for integer k in [-126, 127] (as float). */
static inline float ndm__pow2i(int32_t k) { return ndm__u2f((uint32_t)(k + 127) << 23); }

static inline float ndm__expf(float x)
{
    float xc = x > -104.0f ? x : -104.0f;
    xc = xc < 89.0f ? xc : 89.0f;
    float k = (xc * NDM__LOG2E_F + NDM__RND_F) - NDM__RND_F;
    float r = xc - k * NDM__LN2_HI_F;
    r = r - k * NDM__LN2_LO_F;
    float p = 1.0f + (r + r * r * ndm__expq(r));
    /* Scale in two steps so that 2^k never leaves the normal range; the one
     * rounding happens in the last product (gradual underflow included). */
    int32_t ki = (int32_t)k;
    int32_t k1 = ki / 2;
    float res = p * ndm__pow2i(k1) * ndm__pow2i(ki - k1);
    return x != x ? x : res;
}

static inline float ndm__expm1f(float x)
{
    float xc = x > -30.0f ? x : -30.0f;
    xc = xc < 89.0f ? xc : 89.0f;
    float k = (xc * NDM__LOG2E_F + NDM__RND_F) - NDM__RND_F;
    float r = xc - k * NDM__LN2_HI_F;
    r = r - k * NDM__LN2_LO_F;
    float em = r + r * r * ndm__expq(r); /* expm1(r) */
    int32_t ki = (int32_t)k;
    /* 2^k (e^r - 1) + (2^k - 1); 2^k - 1 is exact for k <= 24. Above, the
     * -1 is below the rounding and 2^k may overflow, so scale in two steps. */
    float t = ndm__pow2i(ki < 24 ? ki : 24);
    float small = t * em + (t - 1.0f);
    float big = ((em + 1.0f) * ndm__pow2i(ki > 25 ? ki - 1 : 24)) * 2.0f;
    float res = ki > 24 ? big : small;
    res = x == 0.0f ? x : res; /* keeps -0 */
    return x != x ? x : res;
}

static inline float ndm__logf(float x)
{
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    uint32_t u = ndm__f2u(xs);
    int32_t e = (int32_t)((u >> 23) & 0xffu) - 127 - (sub ? 23 : 0);
    float m = ndm__u2f((u & 0x7fffffu) | 0x3f800000u); /* [1, 2) */
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e += big;
    /* log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716 */
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float q = 2.333046722e-01f;
    q = q * z + 2.855082082e-01f;
    q = q * z + 4.000012184e-01f;
    q = q * z + 6.666666655e-01f;
    float lm = 2.0f * s + s * z * q;
    float ef = (float)e;
    float res = ef * NDM__LN2_HI_F + (lm + ef * NDM__LN2_LO_F);
    res = x == 0.0f ? -INFINITY : res;
    res = x == INFINITY ? INFINITY : res;
    return x < 0.0f || x != x ? NAN : res;
}

/* log(1 + x) = log(u) * x / (u - 1) with u = 1 + x rounded: the quotient
 * corrects the rounding of u (the classic trick), exact when u == 1. */
static inline float ndm__log1pf(float x)
{
    float u = 1.0f + x;
    float d = u - 1.0f;
    float res = ndm__logf(u) * (x / (d != 0.0f ? d : 1.0f));
    res = d == 0.0f ? x : res;
    return u == INFINITY ? u : res;
}

static inline float ndm__tanhf(float x)
{
    float a = fabsf(x);
    a = a < 9.0f ? a : 9.0f; /* tanh(9) rounds to 1 */
    float e = ndm__expm1f(2.0f * a);
    float r = copysignf(e / (e + 2.0f), x);
    return x != x ? x : r;
}

/* 1 / (1 + e^-x) through e = e^-|x|, which never overflows: the negative
 * side is e / (1 + e) and keeps its accuracy down to the subnormals. */
static inline float ndm__sigmoidf(float x)
{
    float e = ndm__expf(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* x * sigmoid(x); the limit at -inf is -0 (the product would give NaN). */
static inline float ndm__siluf(float x)
{
    float r = x * ndm__sigmoidf(x);
    return x == -INFINITY ? -0.0f : r;
}

/* x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same value as
 * 0.5 x (1 + tanh(u)) without the cancellation of 1 + tanh(u) for x < 0. */
static inline float ndm__gelu_tanhf(float x)
{
    float u = 0.797884560802865f * (x + 0.044715f * x * x * x);
    float r = x * ndm__sigmoidf(2.0f * u);
    return x == -INFINITY ? -0.0f : r;
}

/* erfc(|x| / sqrt 2), accurate relative to itself (the tail of gelu).
 * Below t = 0.5: 1 - erf(t) with erf(t) = t P(t^2). Above: exp(-t^2) R(s),
 * s = 1 / (1 + t/2), with exp(-x^2/2) split so that x^2 is exact. */
static inline float ndm__erfc_half(float x)
{
    float a = fabsf(x);
    float t = a * 0.707106781186547524f;
    float z = t * t;
    float p = -7.694534279e-04f;
    p = p * z + 5.200413724e-03f;
    p = p * z + -2.686314303e-02f;
    p = p * z + 1.128377401e-01f;
    p = p * z + -3.761263853e-01f;
    p = p * z + 1.128379167e+00f;
    float small = 1.0f - t * p;
    float tc = t < 10.0f ? t : 10.0f;
    tc = tc > 0.5f ? tc : 0.5f;
    float ac = tc * 1.41421356237309505f;
    float s = 1.0f / (1.0f + 0.5f * tc);
    float q = 5.219202023e-03f;
    q = q * s + -1.010846123e-01f;
    q = q * s + 4.107675850e-01f;
    q = q * s + -6.872733235e-01f;
    q = q * s + 4.685269594e-01f;
    q = q * s + -1.416890770e-01f;
    q = q * s + 2.475869507e-01f;
    q = q * s + 2.319066375e-01f;
    q = q * s + 2.840845585e-01f;
    q = q * s + 2.819420993e-01f;
    q = q * s + 5.125972621e-06f;
    /* a = ah + al with ah of 12 bits: ah^2 is exact, a^2 - ah^2 = al (a + ah) */
    float aa = t < 10.0f ? a : ac;
    aa = t > 0.5f ? aa : ac;
    float ah = ndm__u2f(ndm__f2u(aa) & 0xfffff000u);
    float al = aa - ah;
    float e = ndm__expf(-0.5f * ah * ah) * ndm__expf(-0.5f * al * (aa + ah));
    float large = e * q;
    float res = t < 0.5f ? small : large;
    return t > 10.0f ? 0.0f : res;
}

/* x Phi(x), Phi the normal distribution: the exact (erf) GELU. */
static inline float ndm__geluf(float x)
{
    float e = ndm__erfc_half(x);
    float phi = x < 0.0f ? 0.5f * e : 1.0f - 0.5f * e;
    float r = x * phi;
    r = x == -INFINITY ? -0.0f : r;
    return x != x ? x : r;
}

/* sin and cos for |x| <= NDM__TRIG_MAX_F: x = j pi/2 + r with pi/2 in three
 * parts (8 + 12 bits + rest, so j * part is exact for j < 4096). Callers
 * route larger arguments, infinities and NaN to libm. */
#define NDM__TRIG_MAX_F 6000.0f
static inline float ndm__sincosf(float x, int32_t quadrant_shift)
{
    float j = (x * 0.636619772367581343f + NDM__RND_F) - NDM__RND_F;
    float r = x - j * 1.5703125f;
    r = r - j * 4.8387050628662109e-4f;
    r = r - j * -4.3711388286737929e-08f;
    float z = r * r;
    float ps = 2.724992580e-06f;
    ps = ps * z + -1.984008674e-04f;
    ps = ps * z + 8.333331875e-03f;
    ps = ps * z + -1.666666666e-01f;
    float s = r + r * z * ps;
    float pc = -2.730095920e-07f;
    pc = pc * z + 2.480060038e-05f;
    pc = pc * z + -1.388888767e-03f;
    pc = pc * z + 4.166666666e-02f;
    float c = 1.0f - 0.5f * z + z * z * pc;
    int32_t q = (int32_t)j + quadrant_shift;
    float res = (q & 1) ? c : s;
    return (q & 2) ? -res : res;
}

#endif
