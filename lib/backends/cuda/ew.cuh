/* Element loads and stores of the CUDA elementwise kernels in a computation
 * dtype, with the CPU reference's conversions (cpu/ew_ref.c), and the
 * elementwise lists seen from C++. */
#ifndef NDM_CUDA_EW_CUH
#define NDM_CUDA_EW_CUH

#include "common.cuh"

/* The lists' headers check themselves with C11's _Static_assert, which is
 * C++'s static_assert. */
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#endif
#include "../ew_scalar.h"

/* A value in computation dtype CT: integers (bool included) as int64_t,
 * f32 and f64 as double (an f32 value widened exactly, rounded to float
 * once on store), as the reference computes. */
template <ndm_dtype CT> struct ndm__cu_ct {
    typedef int64_t V;
    static constexpr bool flt = false;
};
template <> struct ndm__cu_ct<NDM_F32> {
    typedef double V;
    static constexpr bool flt = true;
};
template <> struct ndm__cu_ct<NDM_F64> {
    typedef double V;
    static constexpr bool flt = true;
};

/* Element p of storage dtype dt in double. */
NDM__HD double ndm__cu_ld_f64(const void *p, ndm_dtype dt)
{
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8: return *(const uint8_t *)p;
    case NDM_I32: return *(const int32_t *)p;
    case NDM_I64: return (double)*(const int64_t *)p;
    case NDM_F16: return ndm__f16_to_f32(*(const uint16_t *)p);
    case NDM_BF16: return ndm__bf16_to_f32(*(const uint16_t *)p);
    case NDM_F32: return *(const float *)p;
    case NDM_F64: return *(const double *)p;
    }
    return 0;
}

/* ... in float, converted directly (no double rounding). */
NDM__HD float ndm__cu_ld_f32(const void *p, ndm_dtype dt)
{
    switch (dt) {
    case NDM_I64: return (float)*(const int64_t *)p;
    case NDM_F64: return (float)*(const double *)p;
    default: return (float)ndm__cu_ld_f64(p, dt);
    }
}

/* ... as an integer of computation dtype ct (bool: != 0, NaN is true). */
NDM__HD int64_t ndm__cu_ld_int(const void *p, ndm_dtype dt, ndm_dtype ct)
{
    if (ct == NDM_BOOL)
        return ndm__cu_ld_f64(p, dt) != 0;
    switch (dt) {
    case NDM_BOOL:
    case NDM_U8: return *(const uint8_t *)p;
    case NDM_I32: return *(const int32_t *)p;
    case NDM_I64: return *(const int64_t *)p;
    default: return ndm__sat_i64(ndm__cu_ld_f64(p, dt));
    }
}

template <ndm_dtype CT> NDM__HD typename ndm__cu_ct<CT>::V ndm__cu_ld(const void *p, ndm_dtype dt)
{
    if constexpr (CT == NDM_F32)
        return (double)ndm__cu_ld_f32(p, dt);
    else if constexpr (CT == NDM_F64)
        return ndm__cu_ld_f64(p, dt);
    else
        return ndm__cu_ld_int(p, dt, CT);
}

/* An integer result reduced to the range of ct, wrapping. */
NDM__HD int64_t ndm__cu_wrap(int64_t v, ndm_dtype ct)
{
    switch (ct) {
    case NDM_BOOL: return v != 0;
    case NDM_U8: return (uint8_t)v;
    case NDM_I32: return (int32_t)v;
    default: return v;
    }
}

/* A result in CT stored into dtype dt, as the reference stores it. */
template <ndm_dtype CT> NDM__HD void ndm__cu_st(void *p, ndm_dtype dt, typename ndm__cu_ct<CT>::V v)
{
    if constexpr (CT == NDM_F32)
        ndm__cu_st_any(p, dt, (float)v);
    else if constexpr (CT == NDM_F64)
        ndm__cu_st_any(p, dt, v);
    else
        ndm__cu_st_any(p, dt, ndm__cu_wrap(v, CT));
}

#endif
