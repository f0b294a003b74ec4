/* The reduction family of the backend table: reductions over trailing axes
 * and softmax. Dispatchers (lib/ops/reduce.c) fill in dtypes and shapes. */
#ifndef NDM_BACKEND_REDUCE_H
#define NDM_BACKEND_REDUCE_H

#include <math.h>

#include "backend.h"

/* The reductions, declared once: the enum, the names, the result dtype
 * rule, the empty-reduction rule, the public entry points, the gradient
 * record (lib/ops/reduce.c), the reference kernels (cpu/reduce_ref.c, which
 * also run every reduction the fast CPU table has no kernel for), the
 * accumulator and the finish of the fast CPU and the CUDA kernels, and the
 * conformance suite's cases derive from it.
 *
 * Adding a reduction, e.g. the l2 norm, touches these files:
 *   1. here, one line:
 *        X(NORM, norm, R, FLOAT, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-5,
 *          SUM, x * x, sqrt(s))
 *   2. include/ndm/reduce.h: the documented declaration of ndm_norm_to_at
 *      and its three macros;
 *   3. CHANGELOG.md;
 *   4. optional: a fast kernel. Without one the fast CPU table runs the
 *      reference kernel for a mapped row, and a row over an existing
 *      accumulator without a map runs the fast accumulator class as it is;
 *      the CUDA kernels fold any row. A gradient rule, if it has one, is
 *      its record in lib/ops/autograd.h and the grad column.
 * No test edit: the conformance suite walks the list.
 *
 * X(ID, name, form, result, flags, grad, tol, acc, map, fin)
 *   form    R: ndm_<name>_to_at(out, a, keepdim, naxes, axes); DDOF: the
 *           same with ddof first; ARG: written by hand (one axis)
 *   result  the result dtype of input dtype t (NDM__RED_RT_*): WIDE keeps
 *           floats and gives i64 otherwise, FLOAT keeps floats and gives
 *           f32 otherwise, SAME keeps t, I64, BOOL
 *   flags   NDM__REDF_IDENTITY: an empty reduction has a value (else the
 *           dispatcher refuses an empty reduction with a non-empty result)
 *   grad    the autograd record (lib/ops/autograd.h), NDM__AG_OP_COUNT for
 *           none
 *   tol     relative tolerance of the fast kernels against the reference
 *           for float inputs (0: bit-exact; summation order differs)
 *   acc     the accumulator (NDM__RACC_*, below), which fixes the identity
 *           (the value of an empty reduction), the combine and its rules
 *   map     the value folded for element x, a double expression of double x
 *           (`x` for the element itself); only for FLOAT results
 *   fin     the result in double, an expression of: s the accumulated value
 *           (the sum, product or extreme; DEV: the sum of squared deviations
 *           from the mean; LSE: the sum of exp(x - max)), e (DEV: the sum of
 *           the deviations, else 0), n the count (a double), ddof, pre (the
 *           first pass of DEV and LSE: the mean, the max). A result of an
 *           integer or bool dtype is the accumulator itself (ARG*: the
 *           index) and does not read fin.
 *
 * Accumulation: a result of an integer or bool dtype over an integer or
 * bool input accumulates in int64 (wrapping sum and product); everything
 * else in double. NaN: MAX and MIN return NaN when an element is NaN;
 * ARGMAX and ARGMIN return the first NaN's position; LSE returns NaN, or
 * the infinite max. Empty: SUM 0, PROD 1, ALL 1, ANY 0, LSE -inf (fin sees
 * n = 0 and s, e 0 for SUM and DEV); MAX, MIN and ARG* have no identity
 * and do not set NDM__REDF_IDENTITY. */
#define NDM__REDF_IDENTITY 0x01u

enum { NDM__RED_RT_WIDE, NDM__RED_RT_FLOAT, NDM__RED_RT_SAME, NDM__RED_RT_I64, NDM__RED_RT_BOOL };

/* The accumulators: what is folded, and how partial results combine. */
enum {
    NDM__RACC_SUM,    /* sum, identity 0 */
    NDM__RACC_PROD,   /* product, identity 1 */
    NDM__RACC_MAX,    /* largest value; a NaN sticks */
    NDM__RACC_MIN,    /* smallest value; a NaN sticks */
    NDM__RACC_ARGMAX, /* C-order position of the first largest (first NaN) */
    NDM__RACC_ARGMIN, /* of the first smallest (first NaN) */
    NDM__RACC_ALL,    /* every element non-zero, identity true */
    NDM__RACC_ANY,    /* some element non-zero, identity false */
    NDM__RACC_DEV,    /* two passes: the mean, then the deviations from it */
    NDM__RACC_LSE,    /* two passes: the max, then the sum of exp(x - max) */
};

/* Helpers of the finish expressions. */
#ifdef __CUDACC__
#define NDM__RED_FN static inline __host__ __device__
#else
#define NDM__RED_FN static inline
#endif

/* The variance from the sum of squared deviations ss and the sum of the
 * deviations sd over n: sd is 0 but for the rounding of the mean, and
 * removing sd^2/n corrects it. */
NDM__RED_FN double ndm__red_var(double ss, double sd, double n, int64_t ddof)
{
    if (!(n > 0))
        return NAN;
    ss -= sd * sd / n;
    double den = n - (double)ddof;
    return (ss < 0 ? 0.0 : ss) / (den > 0 ? den : 0.0);
}

/* log(sum(exp(x))) from the max and the sum of exp(x - max). */
NDM__RED_FN double ndm__red_lse(double pre, double s)
{
    return (pre != pre || isinf(pre)) ? pre : pre + log(s);
}

#define NDM__REDUCE_OPS(X)                                                      \
    X(SUM, sum, R, WIDE, NDM__REDF_IDENTITY, NDM__AG_SUM, 1e-5, SUM, x, s)      \
    X(PROD, prod, R, WIDE, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-5, PROD, x, s) \
    X(MEAN, mean, R, FLOAT, NDM__REDF_IDENTITY, NDM__AG_MEAN, 1e-5, SUM, x,     \
      n > 0 ? s / n : NAN)                                                      \
    X(VAR, var, DDOF, FLOAT, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-4, DEV, x, \
      ndm__red_var(s, e, n, ddof))                                              \
    X(STD, std, DDOF, FLOAT, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-4, DEV, x, \
      sqrt(ndm__red_var(s, e, n, ddof)))                                        \
    X(MAX, max, R, SAME, 0, NDM__AG_MAX, 0, MAX, x, s)                          \
    X(MIN, min, R, SAME, 0, NDM__AG_MIN, 0, MIN, x, s)                          \
    X(ARGMAX, argmax, ARG, I64, 0, NDM__AG_OP_COUNT, 0, ARGMAX, x, 0)           \
    X(ARGMIN, argmin, ARG, I64, 0, NDM__AG_OP_COUNT, 0, ARGMIN, x, 0)           \
    X(ALL, all, R, BOOL, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 0, ALL, x, 0)    \
    X(ANY, any, R, BOOL, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 0, ANY, x, 0)    \
    X(LOGSUMEXP, logsumexp, R, FLOAT, NDM__REDF_IDENTITY, NDM__AG_LOGSUMEXP, 1e-5, LSE, x, \
      ndm__red_lse(pre, s))

#define NDM__RED_ENUM_(ID, ...) NDM__RED_##ID,
typedef enum ndm__reduce_op { NDM__REDUCE_OPS(NDM__RED_ENUM_) } ndm__reduce_op;
#undef NDM__RED_ENUM_

/* Kept out of the enum so that switches over it stay complete. */
#define NDM__RED_ONE_(...) +1
enum { NDM__RED_COUNT = 0 NDM__REDUCE_OPS(NDM__RED_ONE_) };
#define NDM__RED_NAME_(ID, name, ...) #name,
#define NDM__RED_RESULT_(ID, name, form, result, ...) NDM__RED_RT_##result,
#define NDM__RED_FLAGS_(ID, name, form, result, flags, ...) flags,
#define NDM__RED_ACC_(ID, name, form, result, flags, grad, tol, acc, ...) NDM__RACC_##acc,
/* A map other than `x` (one character: nothing else but a constant). */
#define NDM__RED_MAPPED_(ID, name, form, result, flags, grad, tol, acc, map, fin) \
    (sizeof #map != 2),
static const char *const ndm__reduce_names[] = {NDM__REDUCE_OPS(NDM__RED_NAME_)};
static const unsigned char ndm__reduce_result[] = {NDM__REDUCE_OPS(NDM__RED_RESULT_)};
static const unsigned char ndm__reduce_flags[] = {NDM__REDUCE_OPS(NDM__RED_FLAGS_)};
static const unsigned char ndm__reduce_acc[] = {NDM__REDUCE_OPS(NDM__RED_ACC_)};
static const bool ndm__reduce_mapped[] = {NDM__REDUCE_OPS(NDM__RED_MAPPED_)};
_Static_assert(sizeof ndm__reduce_names / sizeof *ndm__reduce_names == NDM__RED_COUNT,
               "reduce names and enum differ");
_Static_assert(sizeof ndm__reduce_result == NDM__RED_COUNT, "reduce results and enum differ");
_Static_assert(sizeof ndm__reduce_flags == NDM__RED_COUNT, "reduce flags and enum differ");
_Static_assert(sizeof ndm__reduce_acc == NDM__RED_COUNT, "reduce accumulators and enum differ");
_Static_assert(sizeof ndm__reduce_mapped == NDM__RED_COUNT, "reduce maps and enum differ");
/* A mapped element is a double: only FLOAT results accumulate in double
 * whatever the input. */
#define NDM__RED_MAPCHECK_(ID, name, form, result, flags, grad, tol, acc, map, fin) \
    +(sizeof #map != 2 && NDM__RED_RT_##result != NDM__RED_RT_FLOAT)
_Static_assert(0 NDM__REDUCE_OPS(NDM__RED_MAPCHECK_) == 0,
               "a reduction with a map has a FLOAT result");
#undef NDM__RED_MAPCHECK_

/* The result dtype of op over dtype t. */
static inline ndm_dtype ndm__reduce_result_dtype(ndm__reduce_op op, ndm_dtype t)
{
    bool fl = t == NDM_F16 || t == NDM_BF16 || t == NDM_F32 || t == NDM_F64;
    switch (ndm__reduce_result[op]) {
    case NDM__RED_RT_WIDE: return fl ? t : NDM_I64;
    case NDM__RED_RT_FLOAT: return fl ? t : NDM_F32;
    case NDM__RED_RT_I64: return NDM_I64;
    case NDM__RED_RT_BOOL: return NDM_BOOL;
    default: return t;
    }
}

/* Whether op over dtype t accumulates in int64: an integer or bool result
 * of an integer or bool input. */
static inline bool ndm__reduce_int_acc(ndm__reduce_op op, ndm_dtype t)
{
    ndm_dtype r = ndm__reduce_result_dtype(op, t);
    bool fl = t == NDM_F16 || t == NDM_BF16 || t == NDM_F32 || t == NDM_F64;
    bool rfl = r == NDM_F16 || r == NDM_BF16 || r == NDM_F32 || r == NDM_F64;
    return !fl && !rfl;
}
/* Whether op's result over dtype t is an int64 value (the int64
 * accumulator, a truth, an index) rather than fin's double. */
static inline bool ndm__reduce_int_value(ndm__reduce_op op, ndm_dtype t)
{
    int a = ndm__reduce_acc[op];
    return a == NDM__RACC_ARGMAX || a == NDM__RACC_ARGMIN || a == NDM__RACC_ALL ||
           a == NDM__RACC_ANY || ndm__reduce_int_acc(op, t);
}

/* The list's map and finish, by operation. */
NDM__RED_FN double ndm__reduce_map(ndm__reduce_op op, double x)
{
    switch (op) {
#define NDM__RED_MAP_(ID, name, form, result, flags, grad, tol, acc, map, fin) \
    case NDM__RED_##ID:                                                         \
        return map;
        NDM__REDUCE_OPS(NDM__RED_MAP_)
#undef NDM__RED_MAP_
    }
    return x;
}

NDM__RED_FN double ndm__reduce_finish(ndm__reduce_op op, double s, double e, int64_t count,
                                      int64_t ddof, double pre)
{
    double n = (double)count;
    (void)s, (void)e, (void)n, (void)ddof, (void)pre;
    switch (op) {
#define NDM__RED_FIN_(ID, name, form, result, flags, grad, tol, acc, map, fin) \
    case NDM__RED_##ID:                                                         \
        return fin;
        NDM__REDUCE_OPS(NDM__RED_FIN_)
#undef NDM__RED_FIN_
    }
    return s;
}

struct ndm__backend_reduce {
    /* required: reduce the trailing `nred` axes of src into dst. src has
     * dst->ndim + nred axes and its leading axes have dst's shape; the
     * reduced axes come in the input's order, so the flat index that
     * argmax/argmin return is their C-order position. dst's dtype is the
     * op's result dtype (float accumulation in f64, integer sum/prod in
     * int64 wrapping). When the reduced count is 0: sum 0, prod 1, all 1,
     * any 0, logsumexp -inf, mean/var/std NaN; the dispatcher never passes
     * an empty max/min/argmax/argmin with a non-empty dst. `ddof` is used
     * by var and std. dst does not overlap src. */
    ndm_status (*reduce)(int device, ndm__reduce_op op, const ndm__tensor *dst,
                         const ndm__tensor *src, int nred, int64_t ddof);
    /* required: softmax (or log_softmax when `log`) of src along `axis`
     * into dst, same shape, a float dtype; src may be any dtype. */
    ndm_status (*softmax)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                          bool log);
};

extern const struct ndm__backend_reduce ndm__cpu_reduce;
extern const struct ndm__backend_reduce ndm__cpu_ref_reduce;

#endif
