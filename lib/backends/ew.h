/* The elementwise family of the backend table: binary and unary maps, where.
 * The dispatcher has already chosen the computation dtype; kernels convert. */
#ifndef NDM_BACKEND_EW_H
#define NDM_BACKEND_EW_H

#include "backend.h"

/* Binary operations. Arithmetic ones store their result in the computation
 * dtype; comparisons and logical ones store bool (0 or 1). */
typedef enum ndm__ew_binop {
    NDM__EW_ADD,
    NDM__EW_SUB,
    NDM__EW_MUL,
    NDM__EW_DIV,
    NDM__EW_POW,
    NDM__EW_MAXIMUM,
    NDM__EW_MINIMUM,
    NDM__EW_EQ,
    NDM__EW_NE,
    NDM__EW_LT,
    NDM__EW_LE,
    NDM__EW_GT,
    NDM__EW_GE,
    NDM__EW_AND,
    NDM__EW_OR,
    NDM__EW_XOR,
    NDM__EW_BINOP_COUNT
} ndm__ew_binop;

/* Unary operations. Float functions (EXP ... SILU) are only asked for with a
 * float computation dtype; LOGICAL_NOT only with bool. */
typedef enum ndm__ew_unop {
    NDM__EW_NEG,
    NDM__EW_ABS,
    NDM__EW_SIGN,
    NDM__EW_RELU,
    NDM__EW_FLOOR,
    NDM__EW_CEIL,
    NDM__EW_ROUND,
    NDM__EW_CLAMP,
    NDM__EW_EXP,
    NDM__EW_LOG,
    NDM__EW_LOG1P,
    NDM__EW_EXPM1,
    NDM__EW_SQRT,
    NDM__EW_RSQRT,
    NDM__EW_SIN,
    NDM__EW_COS,
    NDM__EW_TANH,
    NDM__EW_SIGMOID,
    NDM__EW_GELU,
    NDM__EW_GELU_TANH,
    NDM__EW_SILU,
    NDM__EW_NOT,
    NDM__EW_UNOP_COUNT
} ndm__ew_unop;

/* Bytes per element without a call (hot paths of small operations). */
static inline size_t ndm__ew_esize(ndm_dtype t)
{
    static const unsigned char bytes[NDM_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
    return bytes[t];
}

static inline bool ndm__ew_binop_is_bool(ndm__ew_binop op) { return op >= NDM__EW_EQ; }
static inline bool ndm__ew_unop_is_float(ndm__ew_unop op)
{
    return op >= NDM__EW_EXP && op <= NDM__EW_SILU;
}

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
} ndm__backend_ew;

#endif
