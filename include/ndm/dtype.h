/* ndm element types.
 *
 * f16 and bf16 are storage types: arrays of them can be created, filled,
 * copied and cast; arithmetic on them computes in f32. bool is stored as one
 * byte holding 0 or 1.
 *
 * Thread rules: all functions are pure and safe from any thread.
 */
#ifndef NDM_DTYPE_H
#define NDM_DTYPE_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Element types. */
typedef enum ndm_dtype {
    NDM_BOOL = 0, /**< bool, one byte holding 0 or 1. */
    NDM_U8 = 1,   /**< uint8_t. */
    NDM_I32 = 2,  /**< int32_t. */
    NDM_I64 = 3,  /**< int64_t. */
    NDM_F16 = 4,  /**< IEEE half precision, stored as uint16_t. */
    NDM_BF16 = 5, /**< bfloat16, stored as uint16_t. */
    NDM_F32 = 6,  /**< float. */
    NDM_F64 = 7,  /**< double. */
} ndm_dtype;

/** The number of dtypes: valid values are 0 .. NDM_DTYPE_COUNT - 1. */
#define NDM_DTYPE_COUNT 8

/** The bytes per element; 0 for a value that is not a dtype (never fails). */
NDM_API size_t ndm_dtype_size(ndm_dtype t);
/** numpy's name: "float32", "int64", "bool", "bfloat16"...; "invalid"
 *  otherwise. Returns a static string; never fails. */
NDM_API const char *ndm_dtype_name(ndm_dtype t);
/** The short name used in messages and dumps: "f32", "i64", "bool"...
 *  ("invalid" otherwise). Returns a static string; never fails. */
NDM_API const char *ndm_dtype_short(ndm_dtype t);
/** Is t one of the dtypes above? Never fails. */
NDM_API bool ndm_dtype_valid(ndm_dtype t);
/** Is t f16, bf16, f32 or f64? (false for values that are not dtypes;
 *  never fails) */
NDM_API bool ndm_dtype_is_float(ndm_dtype t);

/** The dtype two operands are computed in (promotion):
 *  - the same kind follows the array API: bool < u8 < i32 < i64 and
 *    f16 < f32 < f64, bf16 < f32 < f64, with f16 and bf16 together giving f32;
 *  - bool or integer with float gives the float type (as PyTorch and JAX do:
 *    i32 with f32 stays f32 rather than numpy's f64).
 *  NDM_F32 for values that are not dtypes; never fails. */
NDM_API ndm_dtype ndm_result_type(ndm_dtype a, ndm_dtype b);

/** IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN;
 *  they never fail). This one returns the bits of the half nearest x. */
NDM_API uint16_t ndm_f32_to_f16(float x);
/** The float value of the bits of a half (exact; never fails). */
NDM_API float ndm_f16_to_f32(uint16_t h);
/** The bits of the bfloat16 nearest x (round to nearest even; NaN stays
 *  NaN; never fails). */
NDM_API uint16_t ndm_f32_to_bf16(float x);
/** The float value of the bits of a bfloat16 (exact; never fails). */
NDM_API float ndm_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
