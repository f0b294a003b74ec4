/* dtype facts and the f16/bf16 conversions (round to nearest even). */
#include <math.h>
#include <string.h>

#include "core.h"

static const struct {
    size_t size;
    const char *name;
    const char *short_name;
} dtypes[NDM_DTYPE_COUNT] = {
    [NDM_BOOL] = {1, "bool", "bool"},     [NDM_U8] = {1, "uint8", "u8"},
    [NDM_I32] = {4, "int32", "i32"},      [NDM_I64] = {8, "int64", "i64"},
    [NDM_F16] = {2, "float16", "f16"},    [NDM_BF16] = {2, "bfloat16", "bf16"},
    [NDM_F32] = {4, "float32", "f32"},    [NDM_F64] = {8, "float64", "f64"},
};

const uint8_t ndm__dtype_bytes[NDM_DTYPE_COUNT] = {
    [NDM_BOOL] = 1, [NDM_U8] = 1, [NDM_I32] = 4, [NDM_I64] = 8,
    [NDM_F16] = 2,  [NDM_BF16] = 2, [NDM_F32] = 4, [NDM_F64] = 8,
};

NDM_API bool ndm_dtype_valid(ndm_dtype t) { return (unsigned)t < NDM_DTYPE_COUNT; }

NDM_API size_t ndm_dtype_size(ndm_dtype t)
{
    return ndm_dtype_valid(t) ? dtypes[t].size : 0;
}

NDM_API const char *ndm_dtype_name(ndm_dtype t)
{
    return ndm_dtype_valid(t) ? dtypes[t].name : "invalid";
}

NDM_API const char *ndm_dtype_short(ndm_dtype t)
{
    return ndm_dtype_valid(t) ? dtypes[t].short_name : "invalid";
}

NDM_API bool ndm_dtype_is_float(ndm_dtype t)
{
    return t == NDM_F16 || t == NDM_BF16 || t == NDM_F32 || t == NDM_F64;
}

static inline uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

NDM_API uint16_t ndm_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
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

NDM_API float ndm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

NDM_API uint16_t ndm_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

NDM_API float ndm_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

NDM_API ndm_dtype ndm_result_type(ndm_dtype a, ndm_dtype b)
{
    if (!ndm_dtype_valid(a) || !ndm_dtype_valid(b))
        return NDM_F32;
    if (a == b)
        return a;
    bool fa = ndm_dtype_is_float(a), fb = ndm_dtype_is_float(b);
    if (fa != fb)
        return fa ? a : b; /* the float operand decides */
    if (!fa)
        return a > b ? a : b; /* bool < u8 < i32 < i64 in enum order */
    if ((a == NDM_F16 && b == NDM_BF16) || (a == NDM_BF16 && b == NDM_F16))
        return NDM_F32;
    return a > b ? a : b; /* f16, bf16 < f32 < f64 in enum order */
}
