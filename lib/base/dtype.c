/* dtype facts and the f16/bf16 conversions (round to nearest even). */
#include <math.h>
#include <string.h>

#include "ndm/base.h"
#include "ndm/dtype.h"
#include "convert_scalar.h"
#include "dtype.h"

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

/* The conversions themselves are shared with the kernels (CPU and CUDA). */
NDM_API uint16_t ndm_f32_to_f16(float x) { return ndm__f32_to_f16(x); }
NDM_API float ndm_f16_to_f32(uint16_t h) { return ndm__f16_to_f32(h); }
NDM_API uint16_t ndm_f32_to_bf16(float x) { return ndm__f32_to_bf16(x); }
NDM_API float ndm_bf16_to_f32(uint16_t h) { return ndm__bf16_to_f32(h); }

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
