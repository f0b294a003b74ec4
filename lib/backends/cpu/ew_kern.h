/* The body of one instruction-set table of elementwise kernels. It is
 * included by ew_kern_<isa>.c after a target pragma, which then applies to
 * every loop below; the includer defines NDM__EW_ISA_TABLE and _NAME. */
#ifndef NDM__EW_ISA_TABLE
#error "include this file from an ew_kern_<isa>.c file"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "convert.h"
#include "ew_cpu.h"
#include "ew_math.h"

#define NDM__SIMD _Pragma("omp simd")

/* Computation types: X(name, dtype, T, U (unsigned twin), kind). The kinds
 * pick the expression of each operation: BOOL, UINT, SINT, F32, F64. */
#define NDM__EW_CT(X)                                                           \
    X(b8, NDM_BOOL, uint8_t, uint8_t, BOOL)                                     \
    X(u8, NDM_U8, uint8_t, uint8_t, UINT)                                       \
    X(i32, NDM_I32, int32_t, uint32_t, SINT)                                    \
    X(i64, NDM_I64, int64_t, uint64_t, SINT)                                    \
    X(f32, NDM_F32, float, float, F32)                                          \
    X(f64, NDM_F64, double, double, F64)

/* ---- integer power ------------------------------------------------------ */

/* Wrapping power by squaring. A negative exponent gives the integer part of
 * 1 / x^-y: 1 for x == 1, +-1 for x == -1, else 0. */
#define NDM__IPOW(N, T, U, NEG_CASE)                                            \
    static inline T ipow_##N(T x, T y)                                          \
    {                                                                           \
        NEG_CASE                                                                \
        U r = 1, b = (U)x;                                                      \
        U e = (U)y;                                                             \
        while (e) {                                                             \
            if (e & 1u)                                                         \
                r = (U)(r * b);                                                 \
            b = (U)(b * b);                                                     \
            e >>= 1;                                                            \
        }                                                                       \
        return (T)r;                                                            \
    }
#define NDM__IPOW_NEG                                                           \
    if (y < 0)                                                                  \
        return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
NDM__IPOW(u8, uint8_t, uint8_t, )
NDM__IPOW(i32, int32_t, uint32_t, NDM__IPOW_NEG)
NDM__IPOW(i64, int64_t, uint64_t, NDM__IPOW_NEG)

/* ---- binary expressions: OPB_<op>_<kind>(name, T, U, x, y) --------------- */

#define OPB_ADD_BOOL(N, T, U, x, y) ((T)((x) | (y)))
#define OPB_ADD_UINT(N, T, U, x, y) ((T)((U)(x) + (U)(y)))
#define OPB_ADD_SINT OPB_ADD_UINT
#define OPB_ADD_F32(N, T, U, x, y) ((x) + (y))
#define OPB_ADD_F64 OPB_ADD_F32
#define OPB_SUB_BOOL(N, T, U, x, y) ((T)((x) ^ (y)))
#define OPB_SUB_UINT(N, T, U, x, y) ((T)((U)(x) - (U)(y)))
#define OPB_SUB_SINT OPB_SUB_UINT
#define OPB_SUB_F32(N, T, U, x, y) ((x) - (y))
#define OPB_SUB_F64 OPB_SUB_F32
#define OPB_MUL_BOOL(N, T, U, x, y) ((T)((x) & (y)))
#define OPB_MUL_UINT(N, T, U, x, y) ((T)((U)(x) * (U)(y)))
#define OPB_MUL_SINT OPB_MUL_UINT
#define OPB_MUL_F32(N, T, U, x, y) ((x) * (y))
#define OPB_MUL_F64 OPB_MUL_F32
#define OPB_DIV_F32(N, T, U, x, y) ((x) / (y))
#define OPB_DIV_F64 OPB_DIV_F32
#define OPB_POW_BOOL(N, T, U, x, y) ((T)((x) | ((y) ^ 1)))
#define OPB_POW_UINT(N, T, U, x, y) ipow_##N((x), (y))
#define OPB_POW_SINT OPB_POW_UINT
#define OPB_POW_F32(N, T, U, x, y) powf((x), (y))
#define OPB_POW_F64(N, T, U, x, y) pow((x), (y))
#define OPB_MAXIMUM_BOOL(N, T, U, x, y) ((x) > (y) ? (x) : (y))
#define OPB_MAXIMUM_UINT OPB_MAXIMUM_BOOL
#define OPB_MAXIMUM_SINT OPB_MAXIMUM_BOOL
#define OPB_MAXIMUM_F32(N, T, U, x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define OPB_MAXIMUM_F64 OPB_MAXIMUM_F32
#define OPB_MINIMUM_BOOL(N, T, U, x, y) ((x) < (y) ? (x) : (y))
#define OPB_MINIMUM_UINT OPB_MINIMUM_BOOL
#define OPB_MINIMUM_SINT OPB_MINIMUM_BOOL
#define OPB_MINIMUM_F32(N, T, U, x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define OPB_MINIMUM_F64 OPB_MINIMUM_F32

/* One binary kernel: three loops for the vector/scalar operand patterns. */
#define NDM__BIN_KERNEL(OPN, N, T, OT, EXPR)                                    \
    static void bin_##OPN##_##N(void *o_, const void *a_, int64_t sa, const void *b_, \
                                int64_t sb, int64_t n)                          \
    {                                                                           \
        OT *o = (OT *)o_;                                                       \
        const T *a = (const T *)a_, *b = (const T *)b_;                         \
        if (sa && sb) {                                                         \
            NDM__SIMD for (int64_t i = 0; i < n; i++)                           \
            {                                                                   \
                T x = a[i], y = b[i];                                           \
                o[i] = (OT)(EXPR);                                              \
            }                                                                   \
        } else if (sa) {                                                        \
            const T y = b[0];                                                   \
            NDM__SIMD for (int64_t i = 0; i < n; i++)                           \
            {                                                                   \
                T x = a[i];                                                     \
                o[i] = (OT)(EXPR);                                              \
            }                                                                   \
        } else {                                                                \
            const T x = a[0];                                                   \
            NDM__SIMD for (int64_t i = 0; i < n; i++)                           \
            {                                                                   \
                T y = b[i];                                                     \
                o[i] = (OT)(EXPR);                                              \
            }                                                                   \
        }                                                                       \
    }

#define NDM__BIN_ARITH(OPN, N, E, T, U, K)                                      \
    NDM__BIN_KERNEL(OPN, N, T, T, OPB_##OPN##_##K(N, T, U, x, y))
#define NDM__BIN_ALL(OPN) NDM__EW_CT(NDM__BIN_ARITH_##OPN)
#define NDM__BIN_ARITH_ADD(N, E, T, U, K) NDM__BIN_ARITH(ADD, N, E, T, U, K)
#define NDM__BIN_ARITH_SUB(N, E, T, U, K) NDM__BIN_ARITH(SUB, N, E, T, U, K)
#define NDM__BIN_ARITH_MUL(N, E, T, U, K) NDM__BIN_ARITH(MUL, N, E, T, U, K)
#define NDM__BIN_ARITH_POW(N, E, T, U, K) NDM__BIN_ARITH(POW, N, E, T, U, K)
/* Float pow with a scalar exponent: the common exponents get loops without
 * a call, equal to pow()'s correctly rounded results, special values
 * included (pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf, where sqrt differs). */
#define NDM__POW_FLOAT(N, T, POWF, SQRTF, FABSF)                                \
    NDM__BIN_KERNEL(POWG, N, T, T, POWF(x, y))                                 \
    static void bin_POW_##N(void *o_, const void *a_, int64_t sa, const void *b_, int64_t sb, \
                            int64_t n)                                          \
    {                                                                           \
        T *o = (T *)o_;                                                         \
        const T *a = (const T *)a_;                                             \
        const T y = ((const T *)b_)[0];                                         \
        if (!sa || sb || !(y == 2 || y == 1 || y == 0 || y == -1 || y == 0.5)) { \
            bin_POWG_##N(o_, a_, sa, b_, sb, n);                                \
            return;                                                             \
        }                                                                       \
        if (y == 2) {                                                           \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = a[i] * a[i];       \
        } else if (y == 1) {                                                    \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = a[i];              \
        } else if (y == 0) {                                                    \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = 1;                 \
        } else if (y == -1) {                                                   \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = 1 / a[i];          \
        } else {                                                                \
            NDM__SIMD for (int64_t i = 0; i < n; i++)                           \
            {                                                                   \
                T x = a[i];                                                     \
                T r = SQRTF(x);                                                 \
                r = x == 0 ? (T)0 : r;                                          \
                o[i] = FABSF(x) == (T)INFINITY ? (T)INFINITY : r;               \
            }                                                                   \
        }                                                                       \
    }
#define NDM__BIN_ARITH_MAXIMUM(N, E, T, U, K) NDM__BIN_ARITH(MAXIMUM, N, E, T, U, K)
#define NDM__BIN_ARITH_MINIMUM(N, E, T, U, K) NDM__BIN_ARITH(MINIMUM, N, E, T, U, K)
NDM__BIN_ALL(ADD)
NDM__BIN_ALL(SUB)
NDM__BIN_ALL(MUL)
NDM__BIN_ARITH_POW(b8, NDM_BOOL, uint8_t, uint8_t, BOOL)
NDM__BIN_ARITH_POW(u8, NDM_U8, uint8_t, uint8_t, UINT)
NDM__BIN_ARITH_POW(i32, NDM_I32, int32_t, uint32_t, SINT)
NDM__BIN_ARITH_POW(i64, NDM_I64, int64_t, uint64_t, SINT)
NDM__POW_FLOAT(f32, float, powf, sqrtf, fabsf)
NDM__POW_FLOAT(f64, double, pow, sqrt, fabs)
NDM__BIN_ALL(MAXIMUM)
NDM__BIN_ALL(MINIMUM)
NDM__BIN_KERNEL(DIV, f32, float, float, x / y)
NDM__BIN_KERNEL(DIV, f64, double, double, x / y)

#define NDM__BIN_CMP(OPN, SYM)                                                  \
    NDM__BIN_KERNEL(OPN, b8, uint8_t, uint8_t, x SYM y)                         \
    NDM__BIN_KERNEL(OPN, u8, uint8_t, uint8_t, x SYM y)                         \
    NDM__BIN_KERNEL(OPN, i32, int32_t, uint8_t, x SYM y)                        \
    NDM__BIN_KERNEL(OPN, i64, int64_t, uint8_t, x SYM y)                        \
    NDM__BIN_KERNEL(OPN, f32, float, uint8_t, x SYM y)                          \
    NDM__BIN_KERNEL(OPN, f64, double, uint8_t, x SYM y)
NDM__BIN_CMP(EQ, ==)
NDM__BIN_CMP(NE, !=)
NDM__BIN_CMP(LT, <)
NDM__BIN_CMP(LE, <=)
NDM__BIN_CMP(GT, >)
NDM__BIN_CMP(GE, >=)
/* Inputs are bool already; != 0 keeps foreign bytes from leaking through. */
NDM__BIN_KERNEL(AND, b8, uint8_t, uint8_t, (x != 0) & (y != 0))
NDM__BIN_KERNEL(OR, b8, uint8_t, uint8_t, (x != 0) | (y != 0))
NDM__BIN_KERNEL(XOR, b8, uint8_t, uint8_t, (x != 0) ^ (y != 0))

/* ---- unary expressions: OPU_<op>_<kind>(T, U, x) ------------------------ */

#define OPU_NEG_BOOL(T, U, x) (x)
#define OPU_NEG_UINT(T, U, x) ((T)(0u - (U)(x)))
#define OPU_NEG_SINT OPU_NEG_UINT
#define OPU_NEG_F32(T, U, x) (-(x))
#define OPU_NEG_F64 OPU_NEG_F32
#define OPU_ABS_BOOL(T, U, x) (x)
#define OPU_ABS_UINT OPU_ABS_BOOL
#define OPU_ABS_SINT(T, U, x) ((x) < 0 ? (T)(0u - (U)(x)) : (x))
#define OPU_ABS_F32(T, U, x) fabsf(x)
#define OPU_ABS_F64(T, U, x) fabs(x)
#define OPU_SQUARE_BOOL(T, U, x) (x)
#define OPU_SQUARE_UINT(T, U, x) ((T)((U)(x) * (U)(x)))
#define OPU_SQUARE_SINT OPU_SQUARE_UINT
#define OPU_SQUARE_F32(T, U, x) ((x) * (x))
#define OPU_SQUARE_F64 OPU_SQUARE_F32
#define OPU_SIGN_BOOL(T, U, x) (x)
#define OPU_SIGN_UINT(T, U, x) ((T)((x) != 0))
#define OPU_SIGN_SINT(T, U, x) ((T)(((x) > 0) - ((x) < 0)))
#define OPU_SIGN_F32(T, U, x) ((x) > 0 ? (T)1 : (x) < 0 ? (T)-1 : (x))
#define OPU_SIGN_F64 OPU_SIGN_F32
#define OPU_RELU_BOOL(T, U, x) (x)
#define OPU_RELU_UINT OPU_RELU_BOOL
#define OPU_RELU_SINT(T, U, x) ((x) < 0 ? (T)0 : (x))
#define OPU_RELU_F32 OPU_RELU_SINT
#define OPU_RELU_F64 OPU_RELU_SINT
#define OPU_FLOOR_BOOL(T, U, x) (x)
#define OPU_FLOOR_UINT OPU_FLOOR_BOOL
#define OPU_FLOOR_SINT OPU_FLOOR_BOOL
#define OPU_FLOOR_F32(T, U, x) ndm__floorf(x)
#define OPU_FLOOR_F64(T, U, x) ndm__floor(x)
#define OPU_CEIL_BOOL OPU_FLOOR_BOOL
#define OPU_CEIL_UINT OPU_FLOOR_BOOL
#define OPU_CEIL_SINT OPU_FLOOR_BOOL
#define OPU_CEIL_F32(T, U, x) ndm__ceilf(x)
#define OPU_CEIL_F64(T, U, x) ndm__ceil(x)
#define OPU_ROUND_BOOL OPU_FLOOR_BOOL
#define OPU_ROUND_UINT OPU_FLOOR_BOOL
#define OPU_ROUND_SINT OPU_FLOOR_BOOL
#define OPU_ROUND_F32(T, U, x) ndm__roundevenf(x)
#define OPU_ROUND_F64(T, U, x) ndm__roundeven(x)

#define NDM__UN_KERNEL(OPN, N, T, OT, EXPR)                                     \
    static void un_##OPN##_##N(void *o_, const void *a_, int64_t n, const void *params) \
    {                                                                           \
        (void)params;                                                           \
        OT *o = (OT *)o_;                                                       \
        const T *a = (const T *)a_;                                             \
        NDM__SIMD for (int64_t i = 0; i < n; i++)                               \
        {                                                                       \
            T x = a[i];                                                         \
            o[i] = (OT)(EXPR);                                                  \
        }                                                                       \
    }

#define NDM__UN_EXPR(OPN, N, E, T, U, K) NDM__UN_KERNEL(OPN, N, T, T, OPU_##OPN##_##K(T, U, x))
#define NDM__UN_NEG(N, E, T, U, K) NDM__UN_EXPR(NEG, N, E, T, U, K)
#define NDM__UN_ABS(N, E, T, U, K) NDM__UN_EXPR(ABS, N, E, T, U, K)
#define NDM__UN_SQUARE(N, E, T, U, K) NDM__UN_EXPR(SQUARE, N, E, T, U, K)
#define NDM__UN_SIGN(N, E, T, U, K) NDM__UN_EXPR(SIGN, N, E, T, U, K)
#define NDM__UN_RELU(N, E, T, U, K) NDM__UN_EXPR(RELU, N, E, T, U, K)
#define NDM__UN_FLOOR(N, E, T, U, K) NDM__UN_EXPR(FLOOR, N, E, T, U, K)
#define NDM__UN_CEIL(N, E, T, U, K) NDM__UN_EXPR(CEIL, N, E, T, U, K)
#define NDM__UN_ROUND(N, E, T, U, K) NDM__UN_EXPR(ROUND, N, E, T, U, K)
NDM__EW_CT(NDM__UN_NEG)
NDM__EW_CT(NDM__UN_ABS)
NDM__EW_CT(NDM__UN_SQUARE)
NDM__EW_CT(NDM__UN_SIGN)
NDM__EW_CT(NDM__UN_RELU)
NDM__EW_CT(NDM__UN_FLOOR)
NDM__EW_CT(NDM__UN_CEIL)
NDM__EW_CT(NDM__UN_ROUND)
NDM__UN_KERNEL(NOT, b8, uint8_t, uint8_t, x == 0)

/* clamp = min(max(x, lo), hi); NaN bounds give NaN as NaN inputs do. */
#define NDM__CLAMP_INT(N, E, T, U, K)                                           \
    static void un_CLAMP_##N(void *o_, const void *a_, int64_t n, const void *params) \
    {                                                                           \
        T *o = (T *)o_;                                                         \
        const T *a = (const T *)a_;                                             \
        const T lo = ((const T *)params)[0], hi = ((const T *)params)[1];        \
        NDM__SIMD for (int64_t i = 0; i < n; i++)                               \
        {                                                                       \
            T t = a[i] < lo ? lo : a[i];                                        \
            o[i] = t > hi ? hi : t;                                             \
        }                                                                       \
    }
#define NDM__CLAMP_FLT(N, T)                                                    \
    static void un_CLAMP_##N(void *o_, const void *a_, int64_t n, const void *params) \
    {                                                                           \
        T *o = (T *)o_;                                                         \
        const T *a = (const T *)a_;                                             \
        const T lo = ((const T *)params)[0], hi = ((const T *)params)[1];        \
        const int lo_nan = lo != lo, hi_nan = hi != hi;                         \
        NDM__SIMD for (int64_t i = 0; i < n; i++)                               \
        {                                                                       \
            T t = (a[i] < lo || lo_nan) ? lo : a[i];                            \
            o[i] = (t > hi || hi_nan) ? hi : t;                                 \
        }                                                                       \
    }
NDM__CLAMP_INT(b8, NDM_BOOL, uint8_t, uint8_t, BOOL)
NDM__CLAMP_INT(u8, NDM_U8, uint8_t, uint8_t, UINT)
NDM__CLAMP_INT(i32, NDM_I32, int32_t, uint32_t, SINT)
NDM__CLAMP_INT(i64, NDM_I64, int64_t, uint64_t, SINT)
NDM__CLAMP_FLT(f32, float)
NDM__CLAMP_FLT(f64, double)

/* Float functions: f32 through ew_math.h, f64 through libm. */
NDM__UN_KERNEL(EXP, f32, float, float, ndm__expf(x))
NDM__UN_KERNEL(LOG, f32, float, float, ndm__logf(x))
NDM__UN_KERNEL(LOG1P, f32, float, float, ndm__log1pf(x))
NDM__UN_KERNEL(EXPM1, f32, float, float, ndm__expm1f(x))
NDM__UN_KERNEL(SQRT, f32, float, float, sqrtf(x))
NDM__UN_KERNEL(RSQRT, f32, float, float, 1.0f / sqrtf(x))
NDM__UN_KERNEL(TANH, f32, float, float, ndm__tanhf(x))
NDM__UN_KERNEL(SIGMOID, f32, float, float, ndm__sigmoidf(x))
NDM__UN_KERNEL(GELU, f32, float, float, ndm__geluf(x))
NDM__UN_KERNEL(GELU_TANH, f32, float, float, ndm__gelu_tanhf(x))
NDM__UN_KERNEL(SILU, f32, float, float, ndm__siluf(x))

static inline double silu_f64(double x)
{
    double r = x / (1.0 + exp(-x));
    return x == -INFINITY ? -0.0 : r;
}
static inline double sigmoid_f64(double x)
{
    double e = exp(-fabs(x));
    return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}
static inline double gelu_tanh_f64(double x)
{
    double u = 0.797884560802865355 * (x + 0.044715 * x * x * x);
    double e = exp(-fabs(2.0 * u));
    double s = (u >= 0.0 ? 1.0 : e) / (1.0 + e);
    return x == -INFINITY ? -0.0 : x * s;
}
static inline double gelu_f64(double x)
{
    double r = 0.5 * x * erfc(-x / 1.41421356237309504880);
    return x == -INFINITY ? -0.0 : r;
}
NDM__UN_KERNEL(EXP, f64, double, double, exp(x))
NDM__UN_KERNEL(LOG, f64, double, double, log(x))
NDM__UN_KERNEL(LOG1P, f64, double, double, log1p(x))
NDM__UN_KERNEL(EXPM1, f64, double, double, expm1(x))
NDM__UN_KERNEL(SQRT, f64, double, double, sqrt(x))
NDM__UN_KERNEL(RSQRT, f64, double, double, 1.0 / sqrt(x))
NDM__UN_KERNEL(SIN, f64, double, double, sin(x))
NDM__UN_KERNEL(COS, f64, double, double, cos(x))
NDM__UN_KERNEL(TANH, f64, double, double, tanh(x))
NDM__UN_KERNEL(SIGMOID, f64, double, double, sigmoid_f64(x))
NDM__UN_KERNEL(GELU, f64, double, double, gelu_f64(x))
NDM__UN_KERNEL(GELU_TANH, f64, double, double, gelu_tanh_f64(x))
NDM__UN_KERNEL(SILU, f64, double, double, silu_f64(x))

/* sin and cos in f32: blocks whose arguments all lie in the reduced range
 * run the polynomial; a block holding a huge, infinite or NaN argument runs
 * libm element by element (rare in practice, exact everywhere). */
static void trig_f32(float *o, const float *a, int64_t n, int32_t shift)
{
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t m = n - i0 < 256 ? n - i0 : 256;
        const float *x = a + i0;
        float *y = o + i0;
        int wide = 0;
        _Pragma("omp simd reduction(|:wide)") for (int64_t i = 0; i < m; i++)
            wide |= !(fabsf(x[i]) <= NDM__TRIG_MAX_F);
        if (wide) {
            for (int64_t i = 0; i < m; i++)
                y[i] = shift ? cosf(x[i]) : sinf(x[i]);
        } else {
            NDM__SIMD for (int64_t i = 0; i < m; i++)
                y[i] = ndm__sincosf(x[i], shift);
        }
    }
}
static void un_SIN_f32(void *o, const void *a, int64_t n, const void *params)
{
    (void)params;
    trig_f32((float *)o, (const float *)a, n, 0);
}
static void un_COS_f32(void *o, const void *a, int64_t n, const void *params)
{
    (void)params;
    trig_f32((float *)o, (const float *)a, n, 1);
}

/* ---- where -------------------------------------------------------------- */

#define NDM__WHERE(BITS)                                                        \
    static void where_##BITS(void *o_, const uint8_t *c, const void *a_, int64_t sa, \
                             const void *b_, int64_t sb, int64_t n)             \
    {                                                                           \
        uint##BITS##_t *o = (uint##BITS##_t *)o_;                               \
        const uint##BITS##_t *a = (const uint##BITS##_t *)a_;                   \
        const uint##BITS##_t *b = (const uint##BITS##_t *)b_;                   \
        if (sa && sb) {                                                         \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i]; \
        } else if (sa) {                                                        \
            const uint##BITS##_t y = b[0];                                      \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : y;   \
        } else if (sb) {                                                        \
            const uint##BITS##_t x = a[0];                                      \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x : b[i];   \
        } else {                                                                \
            const uint##BITS##_t x = a[0], y = b[0];                            \
            NDM__SIMD for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x : y;      \
        }                                                                       \
    }
NDM__WHERE(8)
NDM__WHERE(32)
NDM__WHERE(64)

/* ---- conversions -------------------------------------------------------- */

/* Load: storage value to its natural C type. */
#define LD_b8(x) (x)
#define LD_u8(x) (x)
#define LD_i32(x) (x)
#define LD_i64(x) (x)
#define LD_f16(x) ndm__h2f(x)
#define LD_bf16(x) ndm__b2f(x)
#define LD_f32(x) (x)
#define LD_f64(x) (x)
/* Store: a natural C value to storage, as convert.h defines it. */
#define ST_b8(v) ((uint8_t)((v) != 0))
#define ST_u8(v)                                                                \
    _Generic((v), float: ndm__sat_f32_u8, double: ndm__sat_f64_u8, default: st_u8_int)(v)
#define ST_i32(v)                                                               \
    _Generic((v), float: ndm__sat_f32_i32, double: ndm__sat_f64_i32, default: st_i32_int)(v)
#define ST_i64(v)                                                               \
    _Generic((v), float: ndm__sat_f32_i64, double: ndm__sat_f64_i64, default: st_i64_int)(v)
#define ST_f16(v) ndm__f2h((float)(v))
#define ST_bf16(v) ndm__f2b((float)(v))
#define ST_f32(v) ((float)(v))
#define ST_f64(v) ((double)(v))
static inline uint8_t st_u8_int(int64_t v) { return (uint8_t)v; }
static inline int32_t st_i32_int(int64_t v) { return (int32_t)v; }
static inline int64_t st_i64_int(int64_t v) { return v; }

#define NDM__CONV(SN, ST, DN, DT)                                               \
    static void conv_##SN##_##DN(void *d_, int64_t ds, const void *s_, int64_t ss, int64_t n) \
    {                                                                           \
        DT *d = (DT *)d_;                                                       \
        const ST *s = (const ST *)s_;                                           \
        if (ds == 1 && ss == 1) {                                               \
            NDM__SIMD for (int64_t i = 0; i < n; i++) d[i] = ST_##DN(LD_##SN(s[i])); \
        } else if (ss == 0) {                                                   \
            const DT v = ST_##DN(LD_##SN(s[0]));                                \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * ds] = v;                                                  \
        } else {                                                                \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * ds] = ST_##DN(LD_##SN(s[i * ss]));                        \
        }                                                                       \
    }
#define NDM__CONV_FROM(SN, SE, ST)                                              \
    NDM__CONV(SN, ST, b8, uint8_t)                                              \
    NDM__CONV(SN, ST, u8, uint8_t)                                              \
    NDM__CONV(SN, ST, i32, int32_t)                                             \
    NDM__CONV(SN, ST, i64, int64_t)                                             \
    NDM__CONV(SN, ST, f16, uint16_t)                                            \
    NDM__CONV(SN, ST, bf16, uint16_t)                                           \
    NDM__CONV(SN, ST, f32, float)                                               \
    NDM__CONV(SN, ST, f64, double)
NDM__CPU_DTYPES(NDM__CONV_FROM)

/* Same dtype: move elements of the size. */
#define NDM__MOVE(BITS)                                                         \
    static void move_##BITS(void *d_, int64_t ds, const void *s_, int64_t ss, int64_t n) \
    {                                                                           \
        uint##BITS##_t *d = (uint##BITS##_t *)d_;                               \
        const uint##BITS##_t *s = (const uint##BITS##_t *)s_;                   \
        if (ds == 1 && ss == 1) {                                               \
            memcpy(d, s, (size_t)n * sizeof *d);                                \
        } else if (ss == 0) {                                                   \
            const uint##BITS##_t v = s[0];                                      \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * ds] = v;                                                  \
        } else {                                                                \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * ds] = s[i * ss];                                          \
        }                                                                       \
    }
NDM__MOVE(8)
NDM__MOVE(16)
NDM__MOVE(32)
NDM__MOVE(64)

/* ---- non-temporal copy -------------------------------------------------- */

#if defined(__x86_64__)
#if defined(__AVX512F__)
#define NDM__NT_BYTES 64
#define NDM__NT_STEP(d, s)                                                      \
    _mm512_stream_si512((void *)(d), _mm512_loadu_si512((const void *)(s)))
#elif defined(__AVX2__)
#define NDM__NT_BYTES 32
#define NDM__NT_STEP(d, s)                                                      \
    _mm256_stream_si256((__m256i *)(d), _mm256_loadu_si256((const __m256i *)(s)))
#else
#define NDM__NT_BYTES 16
#define NDM__NT_STEP(d, s)                                                      \
    _mm_stream_si128((__m128i *)(d), _mm_loadu_si128((const __m128i *)(s)))
#endif
static void stream_copy(void *d_, const void *s_, size_t n)
{
    char *d = (char *)d_;
    const char *s = (const char *)s_;
    size_t head = (size_t)(-(uintptr_t)d & (NDM__NT_BYTES - 1));
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 4 * NDM__NT_BYTES; n -= 4 * NDM__NT_BYTES) {
        NDM__NT_STEP(d, s);
        NDM__NT_STEP(d + NDM__NT_BYTES, s + NDM__NT_BYTES);
        NDM__NT_STEP(d + 2 * NDM__NT_BYTES, s + 2 * NDM__NT_BYTES);
        NDM__NT_STEP(d + 3 * NDM__NT_BYTES, s + 3 * NDM__NT_BYTES);
        d += 4 * NDM__NT_BYTES;
        s += 4 * NDM__NT_BYTES;
    }
    memcpy(d, s, n);
}
static void stream_fence(void) { _mm_sfence(); }
#define NDM__STREAM stream_copy
#define NDM__FENCE stream_fence
#else
#define NDM__STREAM NULL
#define NDM__FENCE NULL
#endif

/* ---- the table ---------------------------------------------------------- */

#define NDM__ROW6(P)                                                            \
    {[NDM_BOOL] = P##_b8, [NDM_U8] = P##_u8, [NDM_I32] = P##_i32, [NDM_I64] = P##_i64, \
     [NDM_F32] = P##_f32, [NDM_F64] = P##_f64}
#define NDM__ROWF(P) {[NDM_F32] = P##_f32, [NDM_F64] = P##_f64}
#define NDM__CONV_ROW(SN, SE, ST)                                               \
    [SE] = {[NDM_BOOL] = conv_##SN##_b8, [NDM_U8] = conv_##SN##_u8,             \
            [NDM_I32] = conv_##SN##_i32, [NDM_I64] = conv_##SN##_i64,           \
            [NDM_F16] = conv_##SN##_f16, [NDM_BF16] = conv_##SN##_bf16,         \
            [NDM_F32] = conv_##SN##_f32, [NDM_F64] = conv_##SN##_f64},

const ndm__ew_isa NDM__EW_ISA_TABLE = {
    .name = NDM__EW_ISA_NAME,
    .bin = {
        [NDM__EW_ADD] = NDM__ROW6(bin_ADD),
        [NDM__EW_SUB] = NDM__ROW6(bin_SUB),
        [NDM__EW_MUL] = NDM__ROW6(bin_MUL),
        [NDM__EW_DIV] = NDM__ROWF(bin_DIV),
        [NDM__EW_POW] = NDM__ROW6(bin_POW),
        [NDM__EW_MAXIMUM] = NDM__ROW6(bin_MAXIMUM),
        [NDM__EW_MINIMUM] = NDM__ROW6(bin_MINIMUM),
        [NDM__EW_EQ] = NDM__ROW6(bin_EQ),
        [NDM__EW_NE] = NDM__ROW6(bin_NE),
        [NDM__EW_LT] = NDM__ROW6(bin_LT),
        [NDM__EW_LE] = NDM__ROW6(bin_LE),
        [NDM__EW_GT] = NDM__ROW6(bin_GT),
        [NDM__EW_GE] = NDM__ROW6(bin_GE),
        [NDM__EW_AND] = {[NDM_BOOL] = bin_AND_b8},
        [NDM__EW_OR] = {[NDM_BOOL] = bin_OR_b8},
        [NDM__EW_XOR] = {[NDM_BOOL] = bin_XOR_b8},
    },
    .un = {
        [NDM__EW_NEG] = NDM__ROW6(un_NEG),
        [NDM__EW_ABS] = NDM__ROW6(un_ABS),
        [NDM__EW_SQUARE] = NDM__ROW6(un_SQUARE),
        [NDM__EW_SIGN] = NDM__ROW6(un_SIGN),
        [NDM__EW_RELU] = NDM__ROW6(un_RELU),
        [NDM__EW_FLOOR] = NDM__ROW6(un_FLOOR),
        [NDM__EW_CEIL] = NDM__ROW6(un_CEIL),
        [NDM__EW_ROUND] = NDM__ROW6(un_ROUND),
        [NDM__EW_CLAMP] = NDM__ROW6(un_CLAMP),
        [NDM__EW_EXP] = NDM__ROWF(un_EXP),
        [NDM__EW_LOG] = NDM__ROWF(un_LOG),
        [NDM__EW_LOG1P] = NDM__ROWF(un_LOG1P),
        [NDM__EW_EXPM1] = NDM__ROWF(un_EXPM1),
        [NDM__EW_SQRT] = NDM__ROWF(un_SQRT),
        [NDM__EW_RSQRT] = NDM__ROWF(un_RSQRT),
        [NDM__EW_SIN] = NDM__ROWF(un_SIN),
        [NDM__EW_COS] = NDM__ROWF(un_COS),
        [NDM__EW_TANH] = NDM__ROWF(un_TANH),
        [NDM__EW_SIGMOID] = NDM__ROWF(un_SIGMOID),
        [NDM__EW_GELU] = NDM__ROWF(un_GELU),
        [NDM__EW_GELU_TANH] = NDM__ROWF(un_GELU_TANH),
        [NDM__EW_SILU] = NDM__ROWF(un_SILU),
        [NDM__EW_NOT] = {[NDM_BOOL] = un_NOT_b8},
    },
    .where = {[NDM_BOOL] = where_8, [NDM_U8] = where_8, [NDM_I32] = where_32,
              [NDM_I64] = where_64, [NDM_F32] = where_32, [NDM_F64] = where_64},
    .conv = {NDM__CPU_DTYPES(NDM__CONV_ROW)},
    .move = {[1] = move_8, [2] = move_16, [4] = move_32, [8] = move_64},
    .stream = NDM__STREAM,
    .fence = NDM__FENCE,
};
