/* Element conversions between every pair of dtypes, as X-macros, so the copy
 * kernels are typed loops with no per-element calls or switches.
 * Rules: float to integer saturates (NaN gives 0); integer to integer wraps
 * (two's complement, as numpy); anything to bool is "!= 0" (NaN is true). */
#ifndef NDM_CPU_CONVERT_H
#define NDM_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "../../base/convert_scalar.h"
#include "ndm/dtype.h"

/* X(NAME, dtype enum, storage type) */
#define NDM__CPU_DTYPES(X)                                                      \
    X(b8, NDM_BOOL, uint8_t)                                                  \
    X(u8, NDM_U8, uint8_t)                                                      \
    X(i32, NDM_I32, int32_t)                                                    \
    X(i64, NDM_I64, int64_t)                                                    \
    X(f16, NDM_F16, uint16_t)                                                   \
    X(bf16, NDM_BF16, uint16_t)                                                 \
    X(f32, NDM_F32, float)                                                      \
    X(f64, NDM_F64, double)

/* Load: storage value to its natural C type. */
#define NDM__LD_b8(x) (x)
#define NDM__LD_u8(x) (x)
#define NDM__LD_i32(x) (x)
#define NDM__LD_i64(x) (x)
#define NDM__LD_f16(x) ndm_f16_to_f32(x)
#define NDM__LD_bf16(x) ndm_bf16_to_f32(x)
#define NDM__LD_f32(x) (x)
#define NDM__LD_f64(x) (x)

/* Store: any C arithmetic value to a storage value. _Generic picks the
 * saturating path for floating sources. */
#define NDM__IS_FLOAT_EXPR(x) _Generic((x), float: 1, double: 1, default: 0)
#define NDM__ST_b8(x) ((uint8_t)((x) != 0))
#define NDM__ST_u8(x) (NDM__IS_FLOAT_EXPR(x) ? ndm__sat_u8((double)(x)) : (uint8_t)(x))
#define NDM__ST_i32(x) (NDM__IS_FLOAT_EXPR(x) ? ndm__sat_i32((double)(x)) : (int32_t)(x))
#define NDM__ST_i64(x) (NDM__IS_FLOAT_EXPR(x) ? ndm__sat_i64((double)(x)) : (int64_t)(x))
#define NDM__NARROW(x) _Generic((x), float: (x), default: ndm__f64_to_f32_odd((double)(x)))
#define NDM__ST_f16(x) ndm_f32_to_f16(NDM__NARROW(x))
#define NDM__ST_bf16(x) ndm_f32_to_bf16(NDM__NARROW(x))
#define NDM__ST_f32(x) ((float)(x))
#define NDM__ST_f64(x) ((double)(x))

/* v converted to dtype t into the one element at p (which need not be
 * aligned): for reference kernels that store element by element. */
static inline void ndm__cpu_store_f64(ndm_dtype t, void *p, double v)
{
    switch (t) {
#define NDM__CPU_STORE_CASE_(N, E, T)                                           \
    case E: {                                                                   \
        T x = NDM__ST_##N(v);                                                   \
        memcpy(p, &x, sizeof x);                                                \
        break;                                                                  \
    }
        NDM__CPU_DTYPES(NDM__CPU_STORE_CASE_)
#undef NDM__CPU_STORE_CASE_
    }
}

#endif
