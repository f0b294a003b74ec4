/* The per-element math of the elementwise lists, written once for the CPU
 * reference (C) and the CUDA kernels (nvcc, host and device code): the
 * helpers the lists' reference columns name, and one function per column
 * (ref_f, ref_i of NDM__EW_UNOPS and NDM__EW_BINOPS) that evaluates it. */
#ifndef NDM_BACKENDS_EW_SCALAR_H
#define NDM_BACKENDS_EW_SCALAR_H

#include <math.h>
#include <stdint.h>

#include "ew.h"

#ifdef __CUDACC__
#define NDM__SCALAR static __host__ __device__ __forceinline__
#else
#define NDM__SCALAR static inline
#endif

/* ---- helpers of the reference columns ---------------------------------------- */

NDM__SCALAR int64_t ndm__ref_ipow(int64_t x, int64_t y)
{
    if (y < 0)
        return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
    uint64_t r = 1, b = (uint64_t)x;
    for (uint64_t e = (uint64_t)y; e; e >>= 1) {
        if (e & 1)
            r *= b;
        b *= b;
    }
    return (int64_t)r;
}

/* Floor division and the remainder that goes with it (x == y * q + r, r of
 * y's sign), as Python and numpy define them: the quotient comes from fmod
 * so that it is exact where x / y would round across an integer. */
NDM__SCALAR double ndm__ref_floordiv_f(double x, double y)
{
    if (y == 0)
        return x / y;
    double m = fmod(x, y), d = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0)))
        d -= 1.0;
    if (d == 0)
        return copysign(0.0, x / y);
    double f = floor(d);
    return d - f > 0.5 ? f + 1.0 : f;
}
NDM__SCALAR double ndm__ref_remainder_f(double x, double y)
{
    double m = fmod(x, y);
    if (m != 0 && ((y < 0) != (m < 0)))
        return m + y;
    return m == 0 ? copysign(0.0, y) : m;
}
/* The integer forms: x // 0 and x % 0 are 0 (numpy's values); MIN // -1
 * wraps (as the computation dtype does). */
NDM__SCALAR int64_t ndm__ref_floordiv_i(int64_t x, int64_t y)
{
    if (y == 0)
        return 0;
    if (y == -1)
        return (int64_t)(0 - (uint64_t)x);
    int64_t q = x / y;
    return x % y != 0 && ((x < 0) != (y < 0)) ? q - 1 : q;
}
NDM__SCALAR int64_t ndm__ref_remainder_i(int64_t x, int64_t y)
{
    if (y == 0 || y == -1)
        return 0;
    int64_t r = x % y;
    return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
NDM__SCALAR int64_t ndm__ref_fmod_i(int64_t x, int64_t y)
{
    return y == 0 || y == -1 ? 0 : x % y;
}

NDM__SCALAR double ndm__ref_gelu(double x)
{
    return x == -INFINITY ? -0.0 : 0.5 * x * erfc(-x / sqrt(2.0));
}
/* 0.5 (1 + tanh(u)) = sigmoid(2u): the same function without cancelling. */
NDM__SCALAR double ndm__ref_sigmoid(double x)
{
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}
NDM__SCALAR double ndm__ref_gelu_tanh(double x)
{
    const double c = sqrt(2.0 / 3.14159265358979323846);
    return x == -INFINITY ? -0.0 : x * ndm__ref_sigmoid(2.0 * c * (x + 0.044715 * x * x * x));
}
NDM__SCALAR double ndm__ref_silu(double x) { return x == -INFINITY ? -0.0 : x / (1.0 + exp(-x)); }
NDM__SCALAR double ndm__ref_clamp_f(double x, double lo, double hi)
{
    if (isnan(lo) || isnan(hi))
        return NAN;
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
NDM__SCALAR int64_t ndm__ref_clamp_i(int64_t x, int64_t lo, int64_t hi)
{
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

/* ---- the columns ------------------------------------------------------------------
 * Floats compute in double (an f32 operand is widened exactly, the result
 * rounded once by the caller); integers in int64_t, wrapping as the
 * computation dtype wraps once the caller reduces the result to it.
 * Comparisons and logical operations give 0 or 1 in either form. */

NDM__SCALAR double ndm__ew_unop_f(ndm__ew_unop op, double x, double lo, double hi)
{
    (void)lo;
    (void)hi;
    switch (op) {
#define NDM__EWS_CASE_(ID, name, form, flags, tol, ref_f, ...)                  \
    case NDM__EW_##ID:                                                          \
        return (double)(ref_f);
        NDM__EW_UNOPS(NDM__EWS_CASE_)
#undef NDM__EWS_CASE_
    default: return x;
    }
}

NDM__SCALAR int64_t ndm__ew_unop_i(ndm__ew_unop op, int64_t x, int64_t lo, int64_t hi)
{
    (void)lo;
    (void)hi;
    switch (op) {
#define NDM__EWS_CASE_(ID, name, form, flags, tol, ref_f, ref_i, ...)           \
    case NDM__EW_##ID:                                                          \
        return (int64_t)(ref_i);
        NDM__EW_UNOPS(NDM__EWS_CASE_)
#undef NDM__EWS_CASE_
    default: return x;
    }
}

NDM__SCALAR double ndm__ew_binop_f(ndm__ew_binop op, double x, double y)
{
    switch (op) {
#define NDM__EWS_CASE_(ID, name, form, flags, tol, ref_f, ...)                  \
    case NDM__EW_##ID:                                                          \
        return (double)(ref_f);
        NDM__EW_BINOPS(NDM__EWS_CASE_)
#undef NDM__EWS_CASE_
    default: return 0;
    }
}

NDM__SCALAR int64_t ndm__ew_binop_i(ndm__ew_binop op, int64_t x, int64_t y)
{
    switch (op) {
#define NDM__EWS_CASE_(ID, name, form, flags, tol, ref_f, ref_i, ...)           \
    case NDM__EW_##ID:                                                          \
        return (int64_t)(ref_i);
        NDM__EW_BINOPS(NDM__EWS_CASE_)
#undef NDM__EWS_CASE_
    default: return 0;
    }
}

#undef NDM__SCALAR

#endif
