/* The reduction family of the backend table: reductions over trailing axes
 * and softmax. Dispatchers (lib/ops/reduce.c) fill in dtypes and shapes. */
#ifndef NDM_BACKEND_REDUCE_H
#define NDM_BACKEND_REDUCE_H

#include "backend.h"

/* The reductions, declared once: the enum, the names, the result dtype
 * rule, the empty-reduction rule, the public entry points and the gradient
 * record (lib/ops/reduce.c) and the conformance suite's cases derive from
 * it. Adding one touches this list, include/ndm/reduce.h, the kernels
 * (cpu/reduce.c: the reference switch and the fast paths) and the gradient
 * rule if it has one.
 *
 * X(ID, name, form, result, flags, grad, tol)
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
 */
#define NDM__REDF_IDENTITY 0x01u

enum { NDM__RED_RT_WIDE, NDM__RED_RT_FLOAT, NDM__RED_RT_SAME, NDM__RED_RT_I64, NDM__RED_RT_BOOL };

#define NDM__REDUCE_OPS(X)                                                      \
    X(SUM, sum, R, WIDE, NDM__REDF_IDENTITY, NDM__AG_SUM, 1e-5)                 \
    X(PROD, prod, R, WIDE, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-5)          \
    X(MEAN, mean, R, FLOAT, NDM__REDF_IDENTITY, NDM__AG_MEAN, 1e-5)             \
    X(VAR, var, DDOF, FLOAT, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-4)        \
    X(STD, std, DDOF, FLOAT, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 1e-4)        \
    X(MAX, max, R, SAME, 0, NDM__AG_MAX, 0)                                     \
    X(MIN, min, R, SAME, 0, NDM__AG_MIN, 0)                                     \
    X(ARGMAX, argmax, ARG, I64, 0, NDM__AG_OP_COUNT, 0)                         \
    X(ARGMIN, argmin, ARG, I64, 0, NDM__AG_OP_COUNT, 0)                         \
    X(ALL, all, R, BOOL, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 0)               \
    X(ANY, any, R, BOOL, NDM__REDF_IDENTITY, NDM__AG_OP_COUNT, 0)               \
    X(LOGSUMEXP, logsumexp, R, FLOAT, NDM__REDF_IDENTITY, NDM__AG_LOGSUMEXP, 1e-5)

#define NDM__RED_ENUM_(ID, ...) NDM__RED_##ID,
typedef enum ndm__reduce_op { NDM__REDUCE_OPS(NDM__RED_ENUM_) } ndm__reduce_op;
#undef NDM__RED_ENUM_

/* Kept out of the enum so that switches over it stay complete. */
#define NDM__RED_ONE_(...) +1
enum { NDM__RED_COUNT = 0 NDM__REDUCE_OPS(NDM__RED_ONE_) };
#define NDM__RED_NAME_(ID, name, ...) #name,
#define NDM__RED_RESULT_(ID, name, form, result, ...) NDM__RED_RT_##result,
#define NDM__RED_FLAGS_(ID, name, form, result, flags, ...) flags,
static const char *const ndm__reduce_names[] = {NDM__REDUCE_OPS(NDM__RED_NAME_)};
static const unsigned char ndm__reduce_result[] = {NDM__REDUCE_OPS(NDM__RED_RESULT_)};
static const unsigned char ndm__reduce_flags[] = {NDM__REDUCE_OPS(NDM__RED_FLAGS_)};
_Static_assert(sizeof ndm__reduce_names / sizeof *ndm__reduce_names == NDM__RED_COUNT,
               "reduce names and enum differ");
_Static_assert(sizeof ndm__reduce_result == NDM__RED_COUNT, "reduce results and enum differ");
_Static_assert(sizeof ndm__reduce_flags == NDM__RED_COUNT, "reduce flags and enum differ");

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
