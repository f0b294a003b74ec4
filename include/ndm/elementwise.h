/* ndm elementwise math: arithmetic with numpy broadcasting, comparisons,
 * logic, where, unary functions and activations, and casts.
 *
 * Ownership. Every function that returns an array returns a fresh handle on
 * new storage, attached by the output rule: the manager named by the `_to`
 * variant, else the innermost scope of this thread, else the manager of the
 * first array input (for ndm_where that is `cond`). On failure it returns the
 * null handle, allocates nothing, and ndm_last_error() says why. A null input
 * yields a null result and keeps the first error, so chains report where
 * they first went wrong. In-place forms (a trailing underscore: ndm_add_,
 * ndm_relu_, ...) write into their first argument and return a status
 * (NDM_E_CLOSED for a stale handle, NDM_E_NULL for the null one); they
 * create no array, so they work on arrays of a capped manager.
 *
 * Broadcasting follows numpy: shapes align at their last axis and each pair
 * of sizes must match or one of them be 1 (NDM_E_SHAPE otherwise). An
 * in-place destination keeps its shape: the other operand must broadcast to
 * it. Inputs may be any view (transposed, sliced with steps, reversed,
 * expanded); all operands live on one device (NDM_E_DEVICE otherwise).
 *
 * Dtypes. Two arrays compute in ndm_result_type(a, b) (dtype.h), and:
 *  - comparisons (eq ... ge) and logical ops return bool; logical ops treat
 *    any non-zero element (NaN included) as true;
 *  - ndm_div is true division: integer and bool operands give f32;
 *  - f16 and bf16 results are computed in f32 and rounded once on store;
 *  - integer arithmetic wraps (two's complement), as numpy's does; integer
 *    pow with a negative exponent gives the integer part of 1 / x^-y (1 for
 *    x == 1, +-1 for x == -1, else 0);
 *  - bool + bool is logical or, bool * bool logical and, maximum/minimum
 *    or/and; sub and pow of two bool arrays are NDM_E_DTYPE;
 *  - float functions (exp ... silu) of integer or bool arrays return f32;
 *    neg, abs, sign, relu, floor, ceil, round and clamp keep integer dtypes;
 *  - maximum, minimum and clamp propagate NaN.
 * Scalars (double) join an operation as a Python number joins a numpy array
 * (weak scalars, NEP 50): the array's dtype wins. With a float array the
 * scalar is rounded to that dtype. With an integer array an integral scalar
 * keeps the integer dtype and must fit it (NDM_E_INVALID: "300 does not fit
 * uint8"); a fractional, infinite or NaN scalar makes the result f32. A bool
 * array with an integral scalar gives i64. Comparisons with a scalar never
 * fail: a scalar outside an integer dtype compares in f64.
 * In place, the result must be storable in the destination's kind (bool <
 * integer < float, numpy's same_kind): i32 += f32 or exp_ of an i32 array is
 * NDM_E_DTYPE. A destination whose elements share memory (an expanded view)
 * is NDM_E_INVALID. An input that overlaps the destination other than
 * element for element is read from a private copy first.
 *
 * Float functions: f32 uses vectorized approximations accurate to a few
 * units in the last place (ndm_sin and ndm_cos fall back to the C library
 * for |x| > 6000), f64 the C library. ndm_gelu is the exact form,
 * x * Phi(x) with the normal distribution's erf; ndm_gelu_tanh is the tanh
 * approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). ndm_round
 * rounds half to even, as numpy does.
 *
 * Thread rules: as for arrays. Large operations run on the ndm thread pool
 * (NDM_NUM_THREADS); calls from several threads are safe.
 */
#ifndef NDM_ELEMENTWISE_H
#define NDM_ELEMENTWISE_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @name Arithmetic (a OP b, broadcast)
 *  Each returns a new array attached by the output rule (the `_to` form:
 *  to m), which the caller releases or its manager's close does, or the null
 *  handle with nothing allocated: NDM_E_SHAPE (shapes do not broadcast),
 *  NDM_E_DTYPE, NDM_E_DEVICE (operands on different devices), NDM_E_NULL /
 *  NDM_E_CLOSED (an input or m), NDM_E_CAPPED / NDM_E_QUOTA (the output
 *  manager), NDM_E_OOM, NDM_E_UNSUPPORTED (a backend without the kernel). */
/** @{ */

/** a + b. */
#define ndm_add(a, b) ndm_add_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_add() with the result attached to m instead of by the output rule. */
#define ndm_add_to(m, a, b) ndm_add_to_at(NDM_HERE, (m), (a), (b))
/** ndm_add_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_add_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a - b (NDM_E_DTYPE for two bool arrays). */
#define ndm_sub(a, b) ndm_sub_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_sub() with the result attached to m instead of by the output rule. */
#define ndm_sub_to(m, a, b) ndm_sub_to_at(NDM_HERE, (m), (a), (b))
/** ndm_sub_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sub_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a * b. */
#define ndm_mul(a, b) ndm_mul_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_mul() with the result attached to m instead of by the output rule. */
#define ndm_mul_to(m, a, b) ndm_mul_to_at(NDM_HERE, (m), (a), (b))
/** ndm_mul_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_mul_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a / b, true division: integer and bool operands give f32. */
#define ndm_div(a, b) ndm_div_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_div() with the result attached to m instead of by the output rule. */
#define ndm_div_to(m, a, b) ndm_div_to_at(NDM_HERE, (m), (a), (b))
/** ndm_div_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_div_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a ** b: C pow for floats, wrapping integer power for integers. */
#define ndm_pow(a, b) ndm_pow_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_pow() with the result attached to m instead of by the output rule. */
#define ndm_pow_to(m, a, b) ndm_pow_to_at(NDM_HERE, (m), (a), (b))
/** ndm_pow_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_pow_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** The larger of a and b; NaN if either is NaN. */
#define ndm_maximum(a, b) ndm_maximum_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_maximum() with the result attached to m instead of by the output rule. */
#define ndm_maximum_to(m, a, b) ndm_maximum_to_at(NDM_HERE, (m), (a), (b))
/** ndm_maximum_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_maximum_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** The smaller of a and b; NaN if either is NaN. */
#define ndm_minimum(a, b) ndm_minimum_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_minimum() with the result attached to m instead of by the output rule. */
#define ndm_minimum_to(m, a, b) ndm_minimum_to_at(NDM_HERE, (m), (a), (b))
/** ndm_minimum_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_minimum_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);

/** Floor division, Python's a // b (numpy's floor_divide): the quotient
 *  rounded toward -infinity, in the operands' dtype (integers stay
 *  integers). For floats x // 0 is +-inf or NaN; for integers it is 0, as
 *  numpy gives (without numpy's warning); MIN // -1 wraps. No gradient (zero
 *  almost everywhere). */
#define ndm_floor_divide(a, b) ndm_floor_divide_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_floor_divide() with the result attached to m instead of by the output rule. */
#define ndm_floor_divide_to(m, a, b) ndm_floor_divide_to_at(NDM_HERE, (m), (a), (b))
/** ndm_floor_divide_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_floor_divide_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                         ndm_array b);
/** The remainder of floor division, Python's a % b (numpy's remainder,
 *  PyTorch's remainder): it has the sign of b, a == b * (a // b) + a % b.
 *  For floats a % 0 is NaN; for integers it is 0. Gradients: g for a,
 *  -g * floor(a / b) for b. */
#define ndm_remainder(a, b) ndm_remainder_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_remainder() with the result attached to m instead of by the output rule. */
#define ndm_remainder_to(m, a, b) ndm_remainder_to_at(NDM_HERE, (m), (a), (b))
/** ndm_remainder_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_remainder_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                      ndm_array b);
/** C's fmod (numpy's fmod, PyTorch's fmod): the remainder of division
 *  truncated toward zero, with the sign of a. For floats fmod(a, 0) is NaN;
 *  for integers it is 0. Gradients: g for a, -g * trunc(a / b) for b. */
#define ndm_fmod(a, b) ndm_fmod_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_fmod() with the result attached to m instead of by the output rule. */
#define ndm_fmod_to(m, a, b) ndm_fmod_to_at(NDM_HERE, (m), (a), (b))
/** ndm_fmod_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_fmod_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a // s (see ndm_floor_divide()). */
#define ndm_floor_divide_scalar(a, s)                                          \
    ndm_floor_divide_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_floor_divide_scalar() with the result attached to m instead of by the output rule. */
#define ndm_floor_divide_scalar_to(m, a, s)                                    \
    ndm_floor_divide_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_floor_divide_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_floor_divide_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                                double s);
/** a % s (see ndm_remainder()). */
#define ndm_remainder_scalar(a, s) ndm_remainder_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_remainder_scalar() with the result attached to m instead of by the output rule. */
#define ndm_remainder_scalar_to(m, a, s) ndm_remainder_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_remainder_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_remainder_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                             double s);
/** fmod(a, s) (see ndm_fmod()). */
#define ndm_fmod_scalar(a, s) ndm_fmod_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_fmod_scalar() with the result attached to m instead of by the output rule. */
#define ndm_fmod_scalar_to(m, a, s) ndm_fmod_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_fmod_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_fmod_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                        double s);
/** a = a // b */
#define ndm_floor_divide_(a, b) ndm_floor_divide_inplace_at(NDM_HERE, (a), (b))
/** ndm_floor_divide_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_floor_divide_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                             ndm_array b);
/** a = a % b */
#define ndm_remainder_(a, b) ndm_remainder_inplace_at(NDM_HERE, (a), (b))
/** ndm_remainder_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_remainder_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                          ndm_array b);
/** a = fmod(a, b) */
#define ndm_fmod_(a, b) ndm_fmod_inplace_at(NDM_HERE, (a), (b))
/** ndm_fmod_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_fmod_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a = a // s */
#define ndm_floor_divide_scalar_(a, s) ndm_floor_divide_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_floor_divide_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_floor_divide_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                                    double s);
/** a = a % s */
#define ndm_remainder_scalar_(a, s) ndm_remainder_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_remainder_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_remainder_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                                 double s);
/** a = fmod(a, s) */
#define ndm_fmod_scalar_(a, s) ndm_fmod_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_fmod_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_fmod_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                            double s);

/** @} */

/** @name Comparisons and logic (bool results)
 *  Each returns a new bool array attached by the output rule (the `_to`
 *  form: to m), which the caller releases or its manager's close does, or
 *  the null handle with nothing allocated: errors as for ndm_add(). */
/** @{ */

/** a == b. */
#define ndm_eq(a, b) ndm_eq_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_eq() with the result attached to m instead of by the output rule. */
#define ndm_eq_to(m, a, b) ndm_eq_to_at(NDM_HERE, (m), (a), (b))
/** ndm_eq_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_eq_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a != b (true where either is NaN). */
#define ndm_ne(a, b) ndm_ne_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_ne() with the result attached to m instead of by the output rule. */
#define ndm_ne_to(m, a, b) ndm_ne_to_at(NDM_HERE, (m), (a), (b))
/** ndm_ne_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ne_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a < b. */
#define ndm_lt(a, b) ndm_lt_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_lt() with the result attached to m instead of by the output rule. */
#define ndm_lt_to(m, a, b) ndm_lt_to_at(NDM_HERE, (m), (a), (b))
/** ndm_lt_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_lt_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a <= b. */
#define ndm_le(a, b) ndm_le_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_le() with the result attached to m instead of by the output rule. */
#define ndm_le_to(m, a, b) ndm_le_to_at(NDM_HERE, (m), (a), (b))
/** ndm_le_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_le_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a > b. */
#define ndm_gt(a, b) ndm_gt_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_gt() with the result attached to m instead of by the output rule. */
#define ndm_gt_to(m, a, b) ndm_gt_to_at(NDM_HERE, (m), (a), (b))
/** ndm_gt_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_gt_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a >= b. */
#define ndm_ge(a, b) ndm_ge_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_ge() with the result attached to m instead of by the output rule. */
#define ndm_ge_to(m, a, b) ndm_ge_to_at(NDM_HERE, (m), (a), (b))
/** ndm_ge_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ge_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a && b (non-zero is true). */
#define ndm_logical_and(a, b) ndm_logical_and_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_logical_and() with the result attached to m instead of by the output rule. */
#define ndm_logical_and_to(m, a, b) ndm_logical_and_to_at(NDM_HERE, (m), (a), (b))
/** ndm_logical_and_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_logical_and_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** a || b. */
#define ndm_logical_or(a, b) ndm_logical_or_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_logical_or() with the result attached to m instead of by the output rule. */
#define ndm_logical_or_to(m, a, b) ndm_logical_or_to_at(NDM_HERE, (m), (a), (b))
/** ndm_logical_or_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_logical_or_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** !a != !b. */
#define ndm_logical_xor(a, b) ndm_logical_xor_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_logical_xor() with the result attached to m instead of by the output rule. */
#define ndm_logical_xor_to(m, a, b) ndm_logical_xor_to_at(NDM_HERE, (m), (a), (b))
/** ndm_logical_xor_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_logical_xor_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);

/** cond ? a : b elementwise, the three broadcast together; the result has
 *  ndm_result_type(a, b); cond may have any dtype (non-zero is true). */
#define ndm_where(cond, a, b) ndm_where_to_at(NDM_HERE, NDM_OUTPUT_RULE, (cond), (a), (b))
/** ndm_where() with the result attached to m instead of by the output rule. */
#define ndm_where_to(m, cond, a, b) ndm_where_to_at(NDM_HERE, (m), (cond), (a), (b))
/** ndm_where_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_where_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array cond, ndm_array a,
                                  ndm_array b);

/** @} */

/** @name With a scalar (weak scalar rules in the file description)
 *  Each returns a new array attached by the output rule (the `_to` form: to
 *  m), which the caller releases or its manager's close does, or the null
 *  handle: errors as for ndm_add(), plus NDM_E_INVALID for an integral
 *  scalar that does not fit an integer array's dtype (arithmetic only:
 *  comparisons never fail on the scalar). */
/** @{ */

/** a + s. */
#define ndm_add_scalar(a, s) ndm_add_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_add_scalar() with the result attached to m instead of by the output rule. */
#define ndm_add_scalar_to(m, a, s) ndm_add_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_add_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_add_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a - s. */
#define ndm_sub_scalar(a, s) ndm_sub_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_sub_scalar() with the result attached to m instead of by the output rule. */
#define ndm_sub_scalar_to(m, a, s) ndm_sub_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_sub_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sub_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** s - a. */
#define ndm_rsub_scalar(a, s) ndm_rsub_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_rsub_scalar() with the result attached to m instead of by the output rule. */
#define ndm_rsub_scalar_to(m, a, s) ndm_rsub_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_rsub_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_rsub_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a * s. */
#define ndm_mul_scalar(a, s) ndm_mul_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_mul_scalar() with the result attached to m instead of by the output rule. */
#define ndm_mul_scalar_to(m, a, s) ndm_mul_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_mul_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_mul_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a / s (true division). */
#define ndm_div_scalar(a, s) ndm_div_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_div_scalar() with the result attached to m instead of by the output rule. */
#define ndm_div_scalar_to(m, a, s) ndm_div_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_div_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_div_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** s / a (true division). */
#define ndm_rdiv_scalar(a, s) ndm_rdiv_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_rdiv_scalar() with the result attached to m instead of by the output rule. */
#define ndm_rdiv_scalar_to(m, a, s) ndm_rdiv_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_rdiv_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_rdiv_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a ** s. */
#define ndm_pow_scalar(a, s) ndm_pow_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_pow_scalar() with the result attached to m instead of by the output rule. */
#define ndm_pow_scalar_to(m, a, s) ndm_pow_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_pow_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_pow_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** s ** a. */
#define ndm_rpow_scalar(a, s) ndm_rpow_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_rpow_scalar() with the result attached to m instead of by the output rule. */
#define ndm_rpow_scalar_to(m, a, s) ndm_rpow_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_rpow_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_rpow_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** max(a, s), NaN propagating. */
#define ndm_maximum_scalar(a, s) ndm_maximum_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_maximum_scalar() with the result attached to m instead of by the output rule. */
#define ndm_maximum_scalar_to(m, a, s) ndm_maximum_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_maximum_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_maximum_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** min(a, s), NaN propagating. */
#define ndm_minimum_scalar(a, s) ndm_minimum_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_minimum_scalar() with the result attached to m instead of by the output rule. */
#define ndm_minimum_scalar_to(m, a, s) ndm_minimum_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_minimum_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_minimum_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a == s. */
#define ndm_eq_scalar(a, s) ndm_eq_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_eq_scalar() with the result attached to m instead of by the output rule. */
#define ndm_eq_scalar_to(m, a, s) ndm_eq_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_eq_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_eq_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a != s. */
#define ndm_ne_scalar(a, s) ndm_ne_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_ne_scalar() with the result attached to m instead of by the output rule. */
#define ndm_ne_scalar_to(m, a, s) ndm_ne_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_ne_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ne_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a < s. */
#define ndm_lt_scalar(a, s) ndm_lt_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_lt_scalar() with the result attached to m instead of by the output rule. */
#define ndm_lt_scalar_to(m, a, s) ndm_lt_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_lt_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_lt_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a <= s. */
#define ndm_le_scalar(a, s) ndm_le_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_le_scalar() with the result attached to m instead of by the output rule. */
#define ndm_le_scalar_to(m, a, s) ndm_le_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_le_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_le_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a > s. */
#define ndm_gt_scalar(a, s) ndm_gt_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_gt_scalar() with the result attached to m instead of by the output rule. */
#define ndm_gt_scalar_to(m, a, s) ndm_gt_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_gt_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_gt_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);
/** a >= s. */
#define ndm_ge_scalar(a, s) ndm_ge_scalar_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (s))
/** ndm_ge_scalar() with the result attached to m instead of by the output rule. */
#define ndm_ge_scalar_to(m, a, s) ndm_ge_scalar_to_at(NDM_HERE, (m), (a), (s))
/** ndm_ge_scalar_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ge_scalar_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double s);

/** @} */

/** @name In place: write into a, return a status
 *  Each returns NDM_OK, or the errors of the returning forms, plus NDM_E_DTYPE when the
 *  result cannot be stored into a's dtype and NDM_E_INVALID for a broadcast
 *  view; a is unchanged then. They create no array, so a capped manager's
 *  arrays can be updated. */
/** @{ */

/** a += b */
#define ndm_add_(a, b) ndm_add_inplace_at(NDM_HERE, (a), (b))
/** ndm_add_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_add_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a -= b */
#define ndm_sub_(a, b) ndm_sub_inplace_at(NDM_HERE, (a), (b))
/** ndm_sub_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sub_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a *= b */
#define ndm_mul_(a, b) ndm_mul_inplace_at(NDM_HERE, (a), (b))
/** ndm_mul_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_mul_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a /= b */
#define ndm_div_(a, b) ndm_div_inplace_at(NDM_HERE, (a), (b))
/** ndm_div_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_div_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a **= b */
#define ndm_pow_(a, b) ndm_pow_inplace_at(NDM_HERE, (a), (b))
/** ndm_pow_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_pow_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a = maximum(a, b) */
#define ndm_maximum_(a, b) ndm_maximum_inplace_at(NDM_HERE, (a), (b))
/** ndm_maximum_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_maximum_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a = minimum(a, b) */
#define ndm_minimum_(a, b) ndm_minimum_inplace_at(NDM_HERE, (a), (b))
/** ndm_minimum_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_minimum_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_array b);
/** a += s */
#define ndm_add_scalar_(a, s) ndm_add_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_add_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_add_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a -= s */
#define ndm_sub_scalar_(a, s) ndm_sub_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_sub_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sub_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a = s - a */
#define ndm_rsub_scalar_(a, s) ndm_rsub_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_rsub_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_rsub_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a *= s */
#define ndm_mul_scalar_(a, s) ndm_mul_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_mul_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_mul_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a /= s */
#define ndm_div_scalar_(a, s) ndm_div_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_div_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_div_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a = s / a */
#define ndm_rdiv_scalar_(a, s) ndm_rdiv_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_rdiv_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_rdiv_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a = a ** s */
#define ndm_pow_scalar_(a, s) ndm_pow_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_pow_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_pow_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a, double s);
/** a = max(a, s) */
#define ndm_maximum_scalar_(a, s) ndm_maximum_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_maximum_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_maximum_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                               double s);
/** a = min(a, s) */
#define ndm_minimum_scalar_(a, s) ndm_minimum_scalar_inplace_at(NDM_HERE, (a), (s))
/** ndm_minimum_scalar_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_minimum_scalar_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                               double s);

/** @} */

/** @name Unary functions
 *  Each has three forms: ndm_exp(a) (new array, output rule), ndm_exp_to(m, a)
 *  (new array in m) and ndm_exp_(a) (in place, returns a status). The
 *  returning forms give a new array that the caller releases (or its
 *  manager's close does), or the null handle, with the errors of the
 *  arithmetic functions; the in-place forms return NDM_OK or those errors,
 *  plus NDM_E_DTYPE when the result does not fit a's dtype (exp_ of an
 *  integer array). */
/** @{ */

/** -a; integers wrap; NDM_E_DTYPE for bool. */
#define ndm_neg(a) ndm_neg_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_neg() with the result attached to m instead of by the output rule. */
#define ndm_neg_to(m, a) ndm_neg_to_at(NDM_HERE, (m), (a))
/** ndm_neg() in place: writes the result into a; returns a status. */
#define ndm_neg_(a) ndm_neg_inplace_at(NDM_HERE, (a))
/** ndm_neg_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_neg_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_neg_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_neg_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** |a|; the most negative integer stays itself (wraps). */
#define ndm_abs(a) ndm_abs_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_abs() with the result attached to m instead of by the output rule. */
#define ndm_abs_to(m, a) ndm_abs_to_at(NDM_HERE, (m), (a))
/** ndm_abs() in place: writes the result into a; returns a status. */
#define ndm_abs_(a) ndm_abs_inplace_at(NDM_HERE, (a))
/** ndm_abs_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_abs_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_abs_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_abs_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** a * a, in a's dtype: integers wrap, bool stays bool (a and a). */
#define ndm_square(a) ndm_square_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_square() with the result attached to m instead of by the output rule. */
#define ndm_square_to(m, a) ndm_square_to_at(NDM_HERE, (m), (a))
/** ndm_square() in place: writes the result into a; returns a status. */
#define ndm_square_(a) ndm_square_inplace_at(NDM_HERE, (a))
/** ndm_square_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_square_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_square_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_square_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** -1, 0 or 1 (0 keeps its sign, NaN stays NaN); bool stays bool. */
#define ndm_sign(a) ndm_sign_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_sign() with the result attached to m instead of by the output rule. */
#define ndm_sign_to(m, a) ndm_sign_to_at(NDM_HERE, (m), (a))
/** ndm_sign() in place: writes the result into a; returns a status. */
#define ndm_sign_(a) ndm_sign_inplace_at(NDM_HERE, (a))
/** ndm_sign_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sign_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_sign_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sign_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Largest integer <= a (integers unchanged). */
#define ndm_floor(a) ndm_floor_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_floor() with the result attached to m instead of by the output rule. */
#define ndm_floor_to(m, a) ndm_floor_to_at(NDM_HERE, (m), (a))
/** ndm_floor() in place: writes the result into a; returns a status. */
#define ndm_floor_(a) ndm_floor_inplace_at(NDM_HERE, (a))
/** ndm_floor_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_floor_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_floor_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_floor_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Smallest integer >= a (integers unchanged). */
#define ndm_ceil(a) ndm_ceil_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_ceil() with the result attached to m instead of by the output rule. */
#define ndm_ceil_to(m, a) ndm_ceil_to_at(NDM_HERE, (m), (a))
/** ndm_ceil() in place: writes the result into a; returns a status. */
#define ndm_ceil_(a) ndm_ceil_inplace_at(NDM_HERE, (a))
/** ndm_ceil_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ceil_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_ceil_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_ceil_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Nearest integer, halves to even as numpy (integers unchanged). */
#define ndm_round(a) ndm_round_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_round() with the result attached to m instead of by the output rule. */
#define ndm_round_to(m, a) ndm_round_to_at(NDM_HERE, (m), (a))
/** ndm_round() in place: writes the result into a; returns a status. */
#define ndm_round_(a) ndm_round_inplace_at(NDM_HERE, (a))
/** ndm_round_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_round_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_round_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_round_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** e^a. */
#define ndm_exp(a) ndm_exp_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_exp() with the result attached to m instead of by the output rule. */
#define ndm_exp_to(m, a) ndm_exp_to_at(NDM_HERE, (m), (a))
/** ndm_exp() in place: writes the result into a; returns a status. */
#define ndm_exp_(a) ndm_exp_inplace_at(NDM_HERE, (a))
/** ndm_exp_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_exp_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_exp_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_exp_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Natural log (-inf at 0, NaN below). */
#define ndm_log(a) ndm_log_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_log() with the result attached to m instead of by the output rule. */
#define ndm_log_to(m, a) ndm_log_to_at(NDM_HERE, (m), (a))
/** ndm_log() in place: writes the result into a; returns a status. */
#define ndm_log_(a) ndm_log_inplace_at(NDM_HERE, (a))
/** ndm_log_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_log_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_log_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_log_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** log(1 + a), accurate near 0. */
#define ndm_log1p(a) ndm_log1p_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_log1p() with the result attached to m instead of by the output rule. */
#define ndm_log1p_to(m, a) ndm_log1p_to_at(NDM_HERE, (m), (a))
/** ndm_log1p() in place: writes the result into a; returns a status. */
#define ndm_log1p_(a) ndm_log1p_inplace_at(NDM_HERE, (a))
/** ndm_log1p_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_log1p_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_log1p_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_log1p_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** e^a - 1, accurate near 0. */
#define ndm_expm1(a) ndm_expm1_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_expm1() with the result attached to m instead of by the output rule. */
#define ndm_expm1_to(m, a) ndm_expm1_to_at(NDM_HERE, (m), (a))
/** ndm_expm1() in place: writes the result into a; returns a status. */
#define ndm_expm1_(a) ndm_expm1_inplace_at(NDM_HERE, (a))
/** ndm_expm1_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_expm1_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_expm1_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_expm1_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Square root (NaN below 0). */
#define ndm_sqrt(a) ndm_sqrt_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_sqrt() with the result attached to m instead of by the output rule. */
#define ndm_sqrt_to(m, a) ndm_sqrt_to_at(NDM_HERE, (m), (a))
/** ndm_sqrt() in place: writes the result into a; returns a status. */
#define ndm_sqrt_(a) ndm_sqrt_inplace_at(NDM_HERE, (a))
/** ndm_sqrt_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sqrt_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_sqrt_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sqrt_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** 1 / sqrt(a), correctly computed (not the hardware estimate). */
#define ndm_rsqrt(a) ndm_rsqrt_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_rsqrt() with the result attached to m instead of by the output rule. */
#define ndm_rsqrt_to(m, a) ndm_rsqrt_to_at(NDM_HERE, (m), (a))
/** ndm_rsqrt() in place: writes the result into a; returns a status. */
#define ndm_rsqrt_(a) ndm_rsqrt_inplace_at(NDM_HERE, (a))
/** ndm_rsqrt_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_rsqrt_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_rsqrt_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_rsqrt_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Sine (radians). */
#define ndm_sin(a) ndm_sin_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_sin() with the result attached to m instead of by the output rule. */
#define ndm_sin_to(m, a) ndm_sin_to_at(NDM_HERE, (m), (a))
/** ndm_sin() in place: writes the result into a; returns a status. */
#define ndm_sin_(a) ndm_sin_inplace_at(NDM_HERE, (a))
/** ndm_sin_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sin_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_sin_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sin_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Cosine (radians). */
#define ndm_cos(a) ndm_cos_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_cos() with the result attached to m instead of by the output rule. */
#define ndm_cos_to(m, a) ndm_cos_to_at(NDM_HERE, (m), (a))
/** ndm_cos() in place: writes the result into a; returns a status. */
#define ndm_cos_(a) ndm_cos_inplace_at(NDM_HERE, (a))
/** ndm_cos_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_cos_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_cos_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_cos_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Hyperbolic tangent. */
#define ndm_tanh(a) ndm_tanh_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_tanh() with the result attached to m instead of by the output rule. */
#define ndm_tanh_to(m, a) ndm_tanh_to_at(NDM_HERE, (m), (a))
/** ndm_tanh() in place: writes the result into a; returns a status. */
#define ndm_tanh_(a) ndm_tanh_inplace_at(NDM_HERE, (a))
/** ndm_tanh_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_tanh_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_tanh_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_tanh_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** 1 / (1 + e^-a). */
#define ndm_sigmoid(a) ndm_sigmoid_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_sigmoid() with the result attached to m instead of by the output rule. */
#define ndm_sigmoid_to(m, a) ndm_sigmoid_to_at(NDM_HERE, (m), (a))
/** ndm_sigmoid() in place: writes the result into a; returns a status. */
#define ndm_sigmoid_(a) ndm_sigmoid_inplace_at(NDM_HERE, (a))
/** ndm_sigmoid_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sigmoid_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_sigmoid_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_sigmoid_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** max(a, 0); NaN stays NaN; integers keep their dtype. */
#define ndm_relu(a) ndm_relu_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_relu() with the result attached to m instead of by the output rule. */
#define ndm_relu_to(m, a) ndm_relu_to_at(NDM_HERE, (m), (a))
/** ndm_relu() in place: writes the result into a; returns a status. */
#define ndm_relu_(a) ndm_relu_inplace_at(NDM_HERE, (a))
/** ndm_relu_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_relu_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_relu_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_relu_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** Exact GELU: a * Phi(a) = 0.5 a (1 + erf(a / sqrt 2)). */
#define ndm_gelu(a) ndm_gelu_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_gelu() with the result attached to m instead of by the output rule. */
#define ndm_gelu_to(m, a) ndm_gelu_to_at(NDM_HERE, (m), (a))
/** ndm_gelu() in place: writes the result into a; returns a status. */
#define ndm_gelu_(a) ndm_gelu_inplace_at(NDM_HERE, (a))
/** ndm_gelu_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_gelu_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_gelu_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_gelu_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** GELU, tanh approximation: 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))). */
#define ndm_gelu_tanh(a) ndm_gelu_tanh_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_gelu_tanh() with the result attached to m instead of by the output rule. */
#define ndm_gelu_tanh_to(m, a) ndm_gelu_tanh_to_at(NDM_HERE, (m), (a))
/** ndm_gelu_tanh() in place: writes the result into a; returns a status. */
#define ndm_gelu_tanh_(a) ndm_gelu_tanh_inplace_at(NDM_HERE, (a))
/** ndm_gelu_tanh_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_gelu_tanh_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_gelu_tanh_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_gelu_tanh_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** a * sigmoid(a) (also called swish). */
#define ndm_silu(a) ndm_silu_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_silu() with the result attached to m instead of by the output rule. */
#define ndm_silu_to(m, a) ndm_silu_to_at(NDM_HERE, (m), (a))
/** ndm_silu() in place: writes the result into a; returns a status. */
#define ndm_silu_(a) ndm_silu_inplace_at(NDM_HERE, (a))
/** ndm_silu_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_silu_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_silu_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_silu_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** !a as bool (non-zero is true). */
#define ndm_logical_not(a) ndm_logical_not_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a))
/** ndm_logical_not() with the result attached to m instead of by the output rule. */
#define ndm_logical_not_to(m, a) ndm_logical_not_to_at(NDM_HERE, (m), (a))
/** ndm_logical_not() in place: writes the result into a; returns a status. */
#define ndm_logical_not_(a) ndm_logical_not_inplace_at(NDM_HERE, (a))
/** ndm_logical_not_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_logical_not_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a);
/** ndm_logical_not_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_logical_not_inplace_at(NDM_SITE_PARAMS, ndm_array a);
/** min(max(a, lo), hi) (so lo > hi gives hi); NaN in a or in a bound gives
 *  NaN. Integer arrays keep their dtype when both bounds are integral or
 *  infinite (bounds saturate into the dtype's range), else the result is f32.
 *  +-INFINITY leaves a side open. */
#define ndm_clamp(a, lo, hi) ndm_clamp_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (lo), (hi))
/** ndm_clamp() with the result attached to m instead of by the output rule. */
#define ndm_clamp_to(m, a, lo, hi) ndm_clamp_to_at(NDM_HERE, (m), (a), (lo), (hi))
/** ndm_clamp() in place: writes the result into a; returns a status. */
#define ndm_clamp_(a, lo, hi) ndm_clamp_inplace_at(NDM_HERE, (a), (lo), (hi))
/** ndm_clamp_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_clamp_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, double lo,
                                  double hi);
/** ndm_clamp_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_clamp_inplace_at(NDM_SITE_PARAMS, ndm_array a, double lo,
                                                      double hi);

/** @} */

/** @name Casts
 *  Conversions between dtypes: float to integer truncates toward zero and
 *  saturates (NaN gives 0), integer to integer wraps, anything to bool is
 *  "!= 0" (NaN is true), to f16/bf16 rounds to nearest even (from i64 and
 *  f64 through f32, as the core copy does). */
/** @{ */

/** A new C-contiguous array of `dtype` with a's values converted: ALWAYS a
 *  copy on new storage, even when a already has that dtype (for a second
 *  handle on the same storage, use ndm_alias). NDM_E_DTYPE for an invalid
 *  dtype. */
#define ndm_astype(a, dtype) ndm_astype_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (dtype))
/** ndm_astype() with the result attached to m instead of by the output rule. */
#define ndm_astype_to(m, a, dtype) ndm_astype_to_at(NDM_HERE, (m), (a), (dtype))
/** ndm_astype_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_astype_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a,
                                   ndm_dtype dtype);

/** Write src, broadcast to dst's shape and converted to dst's dtype (any
 *  pair of dtypes), into dst. Creates nothing (works on a capped manager).
 *  NDM_E_SHAPE when src does not broadcast to dst, NDM_E_INVALID when dst is
 *  a broadcast view, NDM_E_DEVICE across devices. */
#define ndm_copy_into(dst, src) ndm_copy_into_at(NDM_HERE, (dst), (src))
/** ndm_copy_into() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_copy_into_at(NDM_SITE_PARAMS, ndm_array dst, ndm_array src);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
