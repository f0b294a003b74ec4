/* Scalar element conversions written once for the CPU kernels (C) and the
 * CUDA kernels (nvcc, host and device code): the saturating float to integer
 * conversions, the double to float rounding "to odd", and f16 and bf16 to
 * and from f32 with round to nearest even (dtype.h's public ndm_f32_to_f16
 * and friends call these). A leaf header: it includes nothing of ndm. */
#ifndef NDM_BACKENDS_CONVERT_SCALAR_H
#define NDM_BACKENDS_CONVERT_SCALAR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define NDM__SCALAR static __host__ __device__ __forceinline__
#else
#define NDM__SCALAR static inline
#endif

NDM__SCALAR uint32_t ndm__f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

NDM__SCALAR float ndm__bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Float to integer: saturates, NaN gives 0. */
NDM__SCALAR int64_t ndm__sat_i64(double v)
{
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

NDM__SCALAR int32_t ndm__sat_i32(double v)
{
    if (v != v)
        return 0;
    if (v >= 2147483647.0)
        return INT32_MAX;
    if (v <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)v;
}

NDM__SCALAR uint8_t ndm__sat_u8(double v)
{
    if (v != v || v <= 0)
        return 0;
    if (v >= 255.0)
        return 255;
    return (uint8_t)v;
}

/* A double rounded to float "to odd": exact values stay, inexact ones get
 * their last bit set, so rounding that float to f16/bf16 gives what rounding
 * the double once would (float keeps more than two extra bits of both). */
NDM__SCALAR float ndm__f64_to_f32_odd(double x)
{
    float f = (float)x;
    if ((double)f == x || x != x)
        return f;
    uint32_t u = ndm__f32_bits(f);
    if (fabs((double)f) > fabs(x))
        u -= 1; /* it rounded away from zero: step back toward it */
    u |= 1;
    return ndm__bits_f32(u);
}

NDM__SCALAR uint16_t ndm__f32_to_f16(float x)
{
    uint32_t u = ndm__f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) /* inf or NaN; keep NaN quiet and non-zero */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* subnormal or zero in half precision */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
        half++; /* may carry into the exponent, giving inf: correct */
    return (uint16_t)half;
}

NDM__SCALAR float ndm__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return ndm__bits_f32(sign);
        float v = (float)man * 5.9604644775390625e-8f; /* exact: man * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31)
        return ndm__bits_f32(sign | 0x7f800000u | (man << 13));
    return ndm__bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

NDM__SCALAR uint16_t ndm__f32_to_bf16(float x)
{
    uint32_t u = ndm__f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

NDM__SCALAR float ndm__bf16_to_f32(uint16_t h) { return ndm__bits_f32((uint32_t)h << 16); }

#undef NDM__SCALAR

#endif
