/* ndm linear algebra: matmul with numpy.matmul semantics, dot, outer.
 *
 * Products of f32 and f64 go through the CPU GEMM provider chosen when ndm
 * was built (-Dblas=auto|openblas|blis|none; ndm_gemm_provider() says which).
 * Transposed and other strided views are passed to the provider as they are
 * when it can read them (a transposed operand as a transposed matrix with its
 * leading dimension; BLIS takes any positive strides); other layouts are
 * copied first. The provider's own threading applies: ndm never changes
 * OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS or OMP_NUM_THREADS (BLIS runs on
 * one thread unless one of them is set). With OpenBLAS, by choice, products
 * of m * n * k between 2^18 (the largest it runs on the calling thread) and
 * 2^26 (a training step's sizes) run ndm's own blocked GEMM on ndm's thread
 * pool instead, so that OpenBLAS's threads never compete with that pool;
 * smaller and larger ones go to OpenBLAS. Without a provider, and for the
 * other dtypes, ndm's own blocked GEMM runs on the thread pool.
 *
 * On a CUDA device, f32 and f64 products go through cuBLAS in its default
 * math mode: an f32 product is computed in f32, never in TF32, so it agrees
 * with the CPU's to f32 rounding (the order of the sums differs). Transposed
 * views are gemm's transpose flags; batch axes that step evenly (a broadcast
 * one included) are one strided-batched call; layouts cuBLAS cannot read
 * (a reversed axis, a step on both matrix axes) are copied on the device
 * first. Integer products run ndm's own kernel, wrapping as on the CPU.
 *
 * Dtypes: the operands are promoted (ndm_result_type) and the result has
 * that dtype. f16 and bf16 compute in f32 and round once; bool, u8, i32 and
 * i64 accumulate in int64 and wrap to the result dtype as numpy does (a
 * bool product is "any a[i,k] and b[k,j]").
 *
 * Ownership: every function returns a fresh array attached by the output
 * rule (the `_to` variant's manager, else the innermost scope of this thread,
 * else the manager of `a`), or the null handle with the reason in
 * ndm_last_error(). Null inputs propagate. Library temporaries (converted
 * or copied operands) follow the same rule and are released before return.
 *
 * Errors: NDM_E_SHAPE (inner sizes differ, batch shapes do not broadcast,
 * 0-d operand to matmul), NDM_E_DEVICE (operands on different devices),
 * NDM_E_OVERFLOW (the result's element count overflows), NDM_E_CLOSED,
 * NDM_E_CAPPED, NDM_E_QUOTA, NDM_E_OOM.
 *
 * Thread rules: as for arrays.
 */
#ifndef NDM_LINALG_H
#define NDM_LINALG_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @name Products
 *  Each returns a new array attached by the output rule (the `_to` form: to
 *  m), which the caller releases or its manager's close does, or the null
 *  handle with the errors listed in the file description (NDM_E_SHAPE,
 *  NDM_E_DEVICE, NDM_E_OVERFLOW, NDM_E_CLOSED, NDM_E_CAPPED, NDM_E_QUOTA,
 *  NDM_E_OOM). */
/** @{ */

/** numpy.matmul: 2-D operands multiply as matrices; a 1-D `a` is a row
 *  (k) -> (1, k) and a 1-D `b` a column, the added axis removed from the
 *  result; leading (batch) axes broadcast: (2, 1, m, k) @ (3, k, n) gives
 *  (2, 3, m, n). 0-d operands are NDM_E_SHAPE. */
#define ndm_matmul(a, b) ndm_matmul_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_matmul() with the result attached to m instead of by the output rule. */
#define ndm_matmul_to(m, a, b) ndm_matmul_to_at(NDM_HERE, (m), (a), (b))
/** ndm_matmul_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_matmul_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);

/** numpy.dot: the inner product of two 1-D arrays (a 0-d result); for
 *  N-d `a` and 1-d `b` a sum over the last axes; for N-d `a` and M-d `b`
 *  (M >= 2) a sum over the last axis of `a` and the second-to-last of `b`,
 *  shape a.shape[:-1] + b.shape[:-2] + b.shape[-1:]; a 0-d operand scales
 *  the other. */
#define ndm_dot(a, b) ndm_dot_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_dot() with the result attached to m instead of by the output rule. */
#define ndm_dot_to(m, a, b) ndm_dot_to_at(NDM_HERE, (m), (a), (b))
/** ndm_dot_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_dot_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);

/** numpy.outer: out[i, j] = a.flat[i] * b.flat[j], shape (a.size, b.size). */
#define ndm_outer(a, b) ndm_outer_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_outer() with the result attached to m instead of by the output rule. */
#define ndm_outer_to(m, a, b) ndm_outer_to_at(NDM_HERE, (m), (a), (b))
/** ndm_outer_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_outer_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** @} */

/** The CPU GEMM provider compiled in: "openblas", "blis" or "none"
 *  (a static string; never fails). */
NDM_API const char *ndm_gemm_provider(void);

#ifdef __cplusplus
}
#endif

#endif
