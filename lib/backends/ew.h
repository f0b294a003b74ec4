/* The elementwise family of the backend table: binary and unary maps, where.
 * The dispatcher has already chosen the computation dtype; kernels convert. */
#ifndef NDM_BACKEND_EW_H
#define NDM_BACKEND_EW_H

#include "../base/dtype.h"
#include "backend.h"

/* ---- the operation lists -------------------------------------------------
 * Each elementwise operation is declared once, in one of the two lists
 * below; everything else is derived from them: the enums, the names, the
 * dtype rules (flags), the public entry points (lib/ops/elementwise*.c),
 * the reference kernels (cpu/ew_ref.c, which also fill every slot of the
 * fast tables that has no faster kernel), the gradient rules
 * (lib/ops/autograd_rules.c) and the conformance suite's cases
 * (tests/test_backend_ops.c).
 *
 * Adding a unary operation, e.g. square (the worked example; see also
 * CONTRIBUTING.md), touches these files:
 *   1. here, one line in NDM__EW_UNOPS:
 *        X(SQUARE, square, U, 0, 0, x * x, (int64_t)((uint64_t)x * (uint64_t)x),
 *          NDM__EW_GRAD(ndm_mul(g, ndm_mul_scalar(a, 2.0))))
 *   2. include/ndm/elementwise.h: the documented declarations of
 *      ndm_square_to_at and ndm_square_inplace_at and the three macros;
 *   3. optional, lib/backends/cpu/ew_kern.h: a vectorised kernel and its
 *      row in the table (without it the fast tables run the reference loop);
 *   4. CHANGELOG.md.
 * No test edit: the conformance suite walks the list. Other backends see the
 * new enum member and flags; until they have a kernel for it they return
 * NDM_E_UNSUPPORTED, which the suite reports as declined.
 *
 * Columns of NDM__EW_UNOPS: X(ID, name, form, flags, tol, ref_f, ref_i, grad)
 *   ID     the enum member NDM__EW_<ID>
 *   name   the public name: ndm_<name>, ndm_<name>_, and the name in messages
 *   form   U: the dispatcher defines ndm_<name>_to_at and _inplace_at;
 *          P: the operation takes parameters and its entry points are
 *          written by hand (clamp)
 *   flags  NDM__EWF_* below
 *   tol    relative tolerance of the fast f32 kernels against the reference
 *          (0: bit-exact); f64 allows 1e-14 where it is not 0
 *   ref_f  the reference value in double of double x (clamp: lo, hi too)
 *   ref_i  the reference value in int64_t of int64_t x, wrapping as the
 *          computation dtype wraps (unused for NDM__EWF_FLOAT operations)
 *   grad   NDM__EW_GRAD(expression of g, a, out) giving the input's
 *          gradient, or NDM__EW_NOGRAD (zero almost everywhere, or no
 *          float input); evaluated in autograd_rules.c
 *
 * Columns of NDM__EW_BINOPS: X(ID, name, form, flags, tol, ref_f, ref_i,
 * grad2, grads)
 *   form   ARITH: ndm_<name>, _scalar and both in-place forms;
 *          ARITH_R: the same plus the reversed ndm_r<name>_scalar forms;
 *          ARITH_RN: ARITH plus ndm_r<name>_scalar, not in place;
 *          CMP: ndm_<name> and ndm_<name>_scalar; LOGIC: ndm_<name> only
 *   ref_f, ref_i  of x and y
 *   grad2  NDM__EW_GRAD2(for a, for b) of g, a, b, out
 *   grads  NDM__EW_GRAD(...) of g, a, out, s (the scalar), swap (scalar first)
 */

/* Flags. */
#define NDM__EWF_FLOAT 0x01u    /* integer and bool inputs compute in f32 */
#define NDM__EWF_BOOL 0x02u     /* computes in bool (logical operations) */
#define NDM__EWF_BOOL_OUT 0x04u /* the result is bool (comparisons) */
#define NDM__EWF_NO_BOOL 0x08u  /* refused on bool operands */
#define NDM__EWF_COSTLY 0x10u   /* costly per element: the pool splits smaller pieces */

#define NDM__EW_UNOPS(X)                                                        \
    X(NEG, neg, U, NDM__EWF_NO_BOOL, 0, -x, (int64_t)(0 - (uint64_t)x),         \
      NDM__EW_GRAD(ndm_neg(g)))                                                 \
    X(ABS, abs, U, 0, 0, fabs(x), x < 0 ? (int64_t)(0 - (uint64_t)x) : x,       \
      NDM__EW_GRAD(ndm_mul(g, ndm_sign(a))))                                    \
    X(SQUARE, square, U, 0, 0, x * x, (int64_t)((uint64_t)x * (uint64_t)x),     \
      NDM__EW_GRAD(ndm_mul(g, ndm_mul_scalar(a, 2.0))))                         \
    X(SIGN, sign, U, 0, 0, x > 0 ? 1.0 : x < 0 ? -1.0 : x, (x > 0) - (x < 0),   \
      NDM__EW_NOGRAD)                                                           \
    X(RELU, relu, U, 0, 0, x < 0 ? 0.0 : x, x < 0 ? 0 : x,                     \
      NDM__EW_GRAD(ndm__relu_grad(g, a)))                                      \
    X(FLOOR, floor, U, 0, 0, floor(x), x, NDM__EW_NOGRAD)                       \
    X(CEIL, ceil, U, 0, 0, ceil(x), x, NDM__EW_NOGRAD)                          \
    X(ROUND, round, U, 0, 0, nearbyint(x), x, NDM__EW_NOGRAD)                   \
    X(CLAMP, clamp, P, 0, 0, ndm__ref_clamp_f(x, lo, hi),                      \
      ndm__ref_clamp_i(x, lo, hi), NDM__EW_NOGRAD)                              \
    X(EXP, exp, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, exp(x), 0,         \
      NDM__EW_GRAD(ndm_mul(g, out)))                                            \
    X(LOG, log, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, log(x), 0,         \
      NDM__EW_GRAD(ndm_div(g, a)))                                              \
    X(LOG1P, log1p, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, log1p(x), 0,   \
      NDM__EW_GRAD(ndm_div(g, ndm_add_scalar(a, 1.0))))                         \
    X(EXPM1, expm1, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, expm1(x), 0,   \
      NDM__EW_GRAD(ndm_mul(g, ndm_add_scalar(out, 1.0))))                       \
    X(SQRT, sqrt, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-7, sqrt(x), 0,      \
      NDM__EW_GRAD(ndm_div(ndm_mul_scalar(g, 0.5), out)))                       \
    /* -x^(-3/2) / 2 = -out^3 / 2 */                                            \
    X(RSQRT, rsqrt, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-7, 1.0 / sqrt(x), 0, \
      NDM__EW_GRAD(ndm_mul(ndm_mul_scalar(g, -0.5), ndm_pow_scalar(out, 3.0)))) \
    X(SIN, sin, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, sin(x), 0,         \
      NDM__EW_GRAD(ndm_mul(g, ndm_cos(a))))                                     \
    X(COS, cos, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, cos(x), 0,         \
      NDM__EW_GRAD(ndm_neg(ndm_mul(g, ndm_sin(a)))))                            \
    X(TANH, tanh, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, tanh(x), 0,      \
      NDM__EW_GRAD(ndm_mul(g, ndm_rsub_scalar(ndm_mul(out, out), 1.0))))        \
    X(SIGMOID, sigmoid, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6,            \
      ndm__ref_sigmoid(x), 0,                                                   \
      NDM__EW_GRAD(ndm_mul(g, ndm_mul(out, ndm_rsub_scalar(out, 1.0)))))        \
    X(GELU, gelu, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, ndm__ref_gelu(x), 0, \
      NDM__EW_GRAD(ndm_mul(g, ndm_astype(gelu_derivative(a), ndm_array_dtype(g))))) \
    X(GELU_TANH, gelu_tanh, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1e-5,          \
      ndm__ref_gelu_tanh(x), 0, NDM__EW_GRAD(ndm_mul(g, gelu_tanh_derivative(a)))) \
    X(SILU, silu, U, NDM__EWF_FLOAT | NDM__EWF_COSTLY, 1.2e-6, ndm__ref_silu(x), 0, \
      NDM__EW_GRAD(ndm_mul(g, silu_derivative(a))))                             \
    X(NOT, logical_not, U, NDM__EWF_BOOL, 0, x == 0, !x, NDM__EW_NOGRAD)

#define NDM__EW_BINOPS(X)                                                       \
    X(ADD, add, ARITH, 0, 0, x + y, (int64_t)((uint64_t)x + (uint64_t)y),       \
      NDM__EW_GRAD2(g, g), NDM__EW_GRAD(g))                                     \
    X(SUB, sub, ARITH_R, NDM__EWF_NO_BOOL, 0, x - y,                            \
      (int64_t)((uint64_t)x - (uint64_t)y), NDM__EW_GRAD2(g, ndm_neg(g)),      \
      NDM__EW_GRAD(swap ? ndm_neg(g) : g))                                      \
    X(MUL, mul, ARITH, 0, 0, x * y, (int64_t)((uint64_t)x * (uint64_t)y),        \
      NDM__EW_GRAD2(ndm_mul(g, b), ndm_mul(g, a)), NDM__EW_GRAD(ndm_mul_scalar(g, s))) \
    /* a / s, or s / a with derivative -s / a^2 = -out / a */                   \
    X(DIV, div, ARITH_R, NDM__EWF_FLOAT, 0, x / y, 0,                           \
      NDM__EW_GRAD2(ndm_div(g, b), ndm_neg(ndm_div(ndm_mul(g, out), b))),       \
      NDM__EW_GRAD(swap ? ndm_neg(ndm_div(ndm_mul(g, out), a)) : ndm_div_scalar(g, s))) \
    /* a^s, or s^a with derivative out * log(s) */                              \
    X(POW, pow, ARITH_RN, NDM__EWF_NO_BOOL | NDM__EWF_COSTLY, 1e-6, pow(x, y),   \
      ndm__ref_ipow(x, y),                                                      \
      NDM__EW_GRAD2(ndm_mul(g, ndm_mul(b, ndm_pow(a, ndm_sub_scalar(b, 1.0)))), \
                    ndm_mul(g, ndm_mul(out, ndm_log(a)))),                      \
      NDM__EW_GRAD(swap ? ndm_mul_scalar(ndm_mul(g, out), log(s))               \
                        : ndm_mul(g, ndm_mul_scalar(ndm_pow_scalar(a, s - 1.0), s)))) \
    /* the larger (smaller) takes the gradient; ties split it */                \
    X(MAXIMUM, maximum, ARITH, 0, 0, isnan(x) || x > y ? x : y, x > y ? x : y,  \
      NDM__EW_GRAD2(extreme_grad(g, a, b, true), extreme_grad(g, b, a, true)),  \
      NDM__EW_GRAD(extreme_grad_scalar(g, a, s, true)))                         \
    X(MINIMUM, minimum, ARITH, 0, 0, isnan(x) || x < y ? x : y, x < y ? x : y,  \
      NDM__EW_GRAD2(extreme_grad(g, a, b, false), extreme_grad(g, b, a, false)), \
      NDM__EW_GRAD(extreme_grad_scalar(g, a, s, false)))                        \
    /* Python's //: rounded toward -inf (numpy's floor_divide); integer x // 0 \
     * is 0, as numpy gives; zero gradient almost everywhere */               \
    X(FLOOR_DIVIDE, floor_divide, ARITH, NDM__EWF_NO_BOOL, 0,                   \
      ndm__ref_floordiv_f(x, y), ndm__ref_floordiv_i(x, y), NDM__EW_NOGRAD,     \
      NDM__EW_NOGRAD)                                                           \
    /* Python's %: the sign of the divisor (numpy's remainder); x % 0 is NaN \
     * for floats, 0 for integers; b's gradient is -floor(a / b)             */ \
    X(REMAINDER, remainder, ARITH, NDM__EWF_NO_BOOL, 0, ndm__ref_remainder_f(x, y), \
      ndm__ref_remainder_i(x, y),                                               \
      NDM__EW_GRAD2(g, ndm_neg(ndm_mul(g, ndm_floor_divide(a, b)))), NDM__EW_GRAD(g)) \
    /* C's fmod: the sign of the dividend; b's gradient is -trunc(a / b),    \
     * (a - out) / b exactly                                                 */ \
    X(FMOD, fmod, ARITH, NDM__EWF_NO_BOOL, 0, fmod(x, y), ndm__ref_fmod_i(x, y), \
      NDM__EW_GRAD2(g, ndm_neg(ndm_mul(g, ndm_div(ndm_sub(a, out), b)))), NDM__EW_GRAD(g)) \
    X(EQ, eq, CMP, NDM__EWF_BOOL_OUT, 0, x == y, x == y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(NE, ne, CMP, NDM__EWF_BOOL_OUT, 0, x != y, x != y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(LT, lt, CMP, NDM__EWF_BOOL_OUT, 0, x < y, x < y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(LE, le, CMP, NDM__EWF_BOOL_OUT, 0, x <= y, x <= y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(GT, gt, CMP, NDM__EWF_BOOL_OUT, 0, x > y, x > y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(GE, ge, CMP, NDM__EWF_BOOL_OUT, 0, x >= y, x >= y, NDM__EW_NOGRAD, NDM__EW_NOGRAD) \
    X(AND, logical_and, LOGIC, NDM__EWF_BOOL | NDM__EWF_BOOL_OUT, 0, x != 0 && y != 0, \
      x && y, NDM__EW_NOGRAD, NDM__EW_NOGRAD)                                   \
    X(OR, logical_or, LOGIC, NDM__EWF_BOOL | NDM__EWF_BOOL_OUT, 0, x != 0 || y != 0, \
      x || y, NDM__EW_NOGRAD, NDM__EW_NOGRAD)                                   \
    X(XOR, logical_xor, LOGIC, NDM__EWF_BOOL | NDM__EWF_BOOL_OUT, 0, (x != 0) != (y != 0), \
      !x != !y, NDM__EW_NOGRAD, NDM__EW_NOGRAD)

#define NDM__EW_ENUM_(ID, ...) NDM__EW_##ID,
typedef enum ndm__ew_binop { NDM__EW_BINOPS(NDM__EW_ENUM_) NDM__EW_BINOP_COUNT } ndm__ew_binop;
typedef enum ndm__ew_unop { NDM__EW_UNOPS(NDM__EW_ENUM_) NDM__EW_UNOP_COUNT } ndm__ew_unop;
#undef NDM__EW_ENUM_

/* Derived tables. The arrays are sized by counting the list a second way,
 * so an entry that a derived table misses fails to compile. */
#define NDM__EW_ONE_(...) +1
#define NDM__EW_NAME_(ID, name, ...) #name,
#define NDM__EW_FLAGS_(ID, name, form, flags, ...) flags,
_Static_assert(NDM__EW_UNOP_COUNT == 0 NDM__EW_UNOPS(NDM__EW_ONE_), "unary list and enum differ");
_Static_assert(NDM__EW_BINOP_COUNT == 0 NDM__EW_BINOPS(NDM__EW_ONE_),
               "binary list and enum differ");

static const char *const ndm__ew_unop_names[] = {NDM__EW_UNOPS(NDM__EW_NAME_)};
static const char *const ndm__ew_binop_names[] = {NDM__EW_BINOPS(NDM__EW_NAME_)};
static const unsigned char ndm__ew_unop_flags[] = {NDM__EW_UNOPS(NDM__EW_FLAGS_)};
static const unsigned char ndm__ew_binop_flags[] = {NDM__EW_BINOPS(NDM__EW_FLAGS_)};
_Static_assert(sizeof ndm__ew_unop_names / sizeof *ndm__ew_unop_names == NDM__EW_UNOP_COUNT,
               "unary names and enum differ");
_Static_assert(sizeof ndm__ew_binop_names / sizeof *ndm__ew_binop_names == NDM__EW_BINOP_COUNT,
               "binary names and enum differ");
_Static_assert(sizeof ndm__ew_unop_flags == NDM__EW_UNOP_COUNT, "unary flags and enum differ");
_Static_assert(sizeof ndm__ew_binop_flags == NDM__EW_BINOP_COUNT, "binary flags and enum differ");

static inline const char *ndm__ew_unop_name(ndm__ew_unop op) { return ndm__ew_unop_names[op]; }
static inline const char *ndm__ew_binop_name(ndm__ew_binop op) { return ndm__ew_binop_names[op]; }
static inline bool ndm__ew_unop_has(ndm__ew_unop op, unsigned flag)
{
    return (ndm__ew_unop_flags[op] & flag) != 0;
}
static inline bool ndm__ew_binop_has(ndm__ew_binop op, unsigned flag)
{
    return (ndm__ew_binop_flags[op] & flag) != 0;
}

/* Bytes per element without a call (hot paths of small operations). */
static inline size_t ndm__ew_esize(ndm_dtype t) { return ndm__dtype_bytes[t]; }

/* The result of a comparison or logical operation is bool. */
static inline bool ndm__ew_binop_is_bool(ndm__ew_binop op)
{
    return ndm__ew_binop_has(op, NDM__EWF_BOOL_OUT);
}
/* A float function: integer and bool inputs compute in f32. */
static inline bool ndm__ew_unop_is_float(ndm__ew_unop op)
{
    return ndm__ew_unop_has(op, NDM__EWF_FLOAT);
}

/* One fused optimizer step (optim_flat). `kind` 0 is SGD: d = (w * wd) + g
 * with L2 decay, else d = g; with momentum (m not NULL), m = (m * momentum)
 * + d and d = m; then w = w - (d * lr). `kind` 1 is Adam: d as for SGD;
 * with decoupled decay, w = w * decay; m = (m * b1) + (d * one_b1);
 * v = (v * b2) + ((d * d) * one_b2); w = w - ((m / (sqrt(v * inv_bc2) +
 * eps)) * lr_bc1). Every product, quotient, sum and root is rounded to t
 * as parenthesised, as the optimizer's separate operations round. */
typedef struct ndm__optim_args {
    int kind;      /* 0 SGD, 1 Adam */
    void *w;       /* the parameter, updated */
    const void *g; /* its gradient */
    void *m;       /* SGD: velocity (NULL without momentum); Adam: first moment */
    void *v;       /* Adam: second moment */
    /* scalars as doubles; kernels convert each to t before use */
    double lr, momentum, wd, decay, b1, one_b1, b2, one_b2, inv_bc2, eps, lr_bc1;
    bool l2, decoupled;
} ndm__optim_args;

/* Common contract. `ct` (the computation dtype) is one of bool, u8, i32,
 * i64, f32, f64, never f16 or bf16. Every input is converted to ct as the
 * core copy converts, the operation runs in ct, and the result is converted
 * to out's dtype (which may differ: f16 storage, bool results, in-place
 * updates of a narrower array). Inputs have out's shape; their strides may be
 * 0 (broadcast) or negative. out's elements do not overlap each other, and an
 * input either does not overlap out or is exactly out (in place).
 * Integer arithmetic wraps; float to integer conversion saturates. */
typedef struct ndm__backend_ew {
    /* required: out = a OP b. */
    ndm_status (*binary)(int device, ndm__ew_binop op, ndm_dtype ct, const ndm__tensor *out,
                         const ndm__tensor *a, const ndm__tensor *b);
    /* required: out = a OP s, or s OP a when `swap`; `s` points at one host
     * value of dtype ct. */
    ndm_status (*binary_scalar)(int device, ndm__ew_binop op, ndm_dtype ct,
                                const ndm__tensor *out, const ndm__tensor *a, const void *s,
                                bool swap);
    /* required: out = OP(a). `params` holds the two bounds of CLAMP as host
     * values of dtype ct (lo, hi) and is NULL for the other operations. */
    ndm_status (*unary)(int device, ndm__ew_unop op, ndm_dtype ct, const ndm__tensor *out,
                        const ndm__tensor *a, const void *params);
    /* required: out = cond ? a : b, cond converted to bool, a and b to ct. */
    ndm_status (*where)(int device, ndm_dtype ct, const ndm__tensor *out,
                        const ndm__tensor *cond, const ndm__tensor *a, const ndm__tensor *b);
    /* optional: out[i] = a[i] OP b[i] for i < n, three C-contiguous arrays of
     * dtype t, which is also the computation dtype (an arithmetic op, no
     * conversion); out may be a exactly. Small operations pay for little
     * else, so this skips the layout checks of `binary`. NULL: the
     * dispatcher calls `binary`. */
    ndm_status (*binary_flat)(int device, ndm__ew_binop op, ndm_dtype t, void *out, const void *a,
                              const void *b, int64_t n);
    /* optional: the gradient of relu, out[i] = g[i] * (x[i] > 0 ? 1 : 0), for
     * i < n, three C-contiguous arrays of float dtype t (f32 or f64); out may
     * be g exactly. Bit for bit the product of g and the converted mask, in
     * one pass and no temporaries. NULL: the rule composes gt, astype, mul. */
    ndm_status (*relu_grad_flat)(int device, ndm_dtype t, void *out, const void *g, const void *x,
                                 int64_t n);
    /* optional: one optimizer step over n elements of C-contiguous arrays of
     * float dtype t (f32 or f64), the same arithmetic as the optimizer's
     * sequence of in-place operations in t, each scalar converted to t
     * first (see ndm__optim_args); NULL: the optimizer runs that sequence. */
    ndm_status (*optim_flat)(int device, ndm_dtype t, const ndm__optim_args *args,
                             int64_t n);
} ndm__backend_ew;

#endif
