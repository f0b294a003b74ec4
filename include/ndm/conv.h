/* ndm convolution and pooling (NCHW), and their gradients.
 *
 * Inputs are (N, C, H, W) arrays of f16, bf16, f32 or f64 (f16 and bf16
 * compute in f32); any strides are accepted. Options come last, as a pointer
 * to a struct written with a literal macro whose zero fields take the
 * default, or NULL for every default:
 *
 *     ndm_conv2d(x, w, NDM_CONV2D(.padding = {1, 1}))
 *     ndm_conv2d_bias(x, w, b, NDM_CONV2D(.stride = {2, 2}, .groups = 4))
 *     ndm_max_pool2d(x, NDM_POOL2D(.kernel = {2, 2}))
 *
 * Sizes follow PyTorch (floor mode): out = (in + 2*pad - dil*(k-1) - 1) / stride + 1.
 * A window that does not fit (out < 1) is NDM_E_SHAPE; negative padding,
 * zero or negative explicit kernel sizes are NDM_E_INVALID; a size that
 * overflows is NDM_E_OVERFLOW.
 *
 * Ownership: every function returns a fresh array attached by the output
 * rule (the `_to` variant's manager, else the innermost scope of this thread,
 * else the manager of `x`), or the null handle with the reason in
 * ndm_last_error(). Null inputs (bias included, when one is passed)
 * propagate. Scratch memory (the unfolded input of a convolution) is a
 * library temporary under the same rule, released before return.
 *
 * Thread rules: as for arrays; the CPU kernels split the batch over the
 * thread pool when it has enough samples.
 *
 * On a CUDA device, convolutions and their gradients unfold the input
 * (im2col) into the scratch memory above, a bounded number of samples at a
 * time, and multiply with cuBLAS (f32 in f32, never TF32): results agree
 * with the CPU's to rounding. Pooling and its gradients compute each element
 * in the CPU's order and arithmetic, so they equal the CPU's bit for bit;
 * overlapping windows add up without atomics, so results are deterministic.
 */
#ifndef NDM_CONV_H
#define NDM_CONV_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Convolution options; a zero field takes the default shown. Index 0 is
 *  the height (H) axis, index 1 the width (W) axis. */
typedef struct ndm_conv2d_opts {
    int64_t stride[2];   /**< step between windows; 0: 1 */
    int64_t padding[2];  /**< zeros added before and after each axis; 0: none */
    int64_t dilation[2]; /**< step between kernel taps; 0: 1 */
    int64_t groups;      /**< C and O split in `groups` independent parts; 0: 1 */
} ndm_conv2d_opts;
/** A pointer to convolution options written as designated initialisers:
 *  NDM_CONV2D(.stride = {2, 2}); valid to the end of the full expression. */
#define NDM_CONV2D(...) (&(const ndm_conv2d_opts){__VA_ARGS__})

/** Cross-correlation (PyTorch's conv2d): x (N, C, H, W) with weight
 *  (O, C/groups, KH, KW) gives (N, O, OH, OW); ndm_conv2d_bias adds a
 *  bias (O) to every output channel. x, weight and bias must share one
 *  float dtype (NDM_E_DTYPE) and one device (NDM_E_DEVICE); C and O must
 *  divide by groups and weight.shape[1] equal C/groups (NDM_E_SHAPE).
 *  Returns a new array attached by the output rule (the `_to` forms: to m),
 *  which the caller releases or its manager's close does, or the null
 *  handle: those errors, NDM_E_INVALID (options), NDM_E_OVERFLOW, the output
 *  manager's (NDM_E_NULL, NDM_E_CLOSED, NDM_E_CAPPED, NDM_E_QUOTA),
 *  NDM_E_OOM, NDM_E_UNSUPPORTED (a backend without the kernel). */
#define ndm_conv2d(x, w, ...)                                                   \
    ndm_conv2d_to_at(NDM_HERE, NDM_OUTPUT_RULE, (x), (w), NULL, __VA_ARGS__)
/** ndm_conv2d() with the result attached to m instead of by the output rule. */
#define ndm_conv2d_to(m, x, w, ...) ndm_conv2d_to_at(NDM_HERE, (m), (x), (w), NULL, __VA_ARGS__)
/** ndm_conv2d() plus bias b (O) added to every output channel. */
#define ndm_conv2d_bias(x, w, b, ...)                                           \
    ndm_conv2d_to_at(NDM_HERE, NDM_OUTPUT_RULE, (x), (w), (const ndm_array[]){(b)}, __VA_ARGS__)
/** ndm_conv2d_bias() with the result attached to m instead of by the output rule. */
#define ndm_conv2d_bias_to(m, x, w, b, ...)                                     \
    ndm_conv2d_to_at(NDM_HERE, (m), (x), (w), (const ndm_array[]){(b)}, __VA_ARGS__)
/** ndm_conv2d() and ndm_conv2d_bias() with an explicit call site; `bias`
 *  NULL: no bias, otherwise it points at the bias handle. */
NDM_API ndm_array ndm_conv2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x, ndm_array w,
                                   const ndm_array *bias, const ndm_conv2d_opts *opts);

/** Pooling options; index 0 is H, index 1 is W. */
typedef struct ndm_pool2d_opts {
    int64_t kernel[2];  /**< window size; required (>= 1) */
    int64_t stride[2];  /**< 0: the kernel size (non-overlapping windows) */
    int64_t padding[2]; /**< 0: none; at most half the kernel size */
} ndm_pool2d_opts;
/** A pointer to pooling options, as NDM_CONV2D does for convolutions. */
#define NDM_POOL2D(...) (&(const ndm_pool2d_opts){__VA_ARGS__})

/** Largest element of each window (padding never wins; NaN propagates):
 *  (N, C, H, W) -> (N, C, OH, OW), same dtype. Returns a new array, owned
 *  as ndm_conv2d()'s is, or the null handle: errors as for ndm_conv2d()
 *  (NDM_E_INVALID for a kernel below 1 or padding over half of it). */
#define ndm_max_pool2d(x, ...) ndm_max_pool2d_to_at(NDM_HERE, NDM_OUTPUT_RULE, (x), __VA_ARGS__)
/** ndm_max_pool2d() with the result attached to m instead of by the output rule. */
#define ndm_max_pool2d_to(m, x, ...) ndm_max_pool2d_to_at(NDM_HERE, (m), (x), __VA_ARGS__)
/** ndm_max_pool2d_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_max_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       const ndm_pool2d_opts *opts);

/** Mean of each window. With count_include_pad the sum is divided by the
 *  full window size KH*KW, padded zeros included (PyTorch's default); without
 *  it, by the number of input elements the window covers (TensorFlow's
 *  "SAME" pooling). Without padding both are the same. Returns and errors as
 *  ndm_max_pool2d(): a new array attached by the output rule, or the null
 *  handle (errors as for ndm_max_pool2d()). */
#define ndm_avg_pool2d(x, count_include_pad, ...)                               \
    ndm_avg_pool2d_to_at(NDM_HERE, NDM_OUTPUT_RULE, (x), (count_include_pad), __VA_ARGS__)
/** ndm_avg_pool2d() with the result attached to m instead of by the output rule. */
#define ndm_avg_pool2d_to(m, x, count_include_pad, ...)                         \
    ndm_avg_pool2d_to_at(NDM_HERE, (m), (x), (count_include_pad), __VA_ARGS__)
/** ndm_avg_pool2d_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_avg_pool2d_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                       bool count_include_pad, const ndm_pool2d_opts *opts);

/** @name Gradients
 *  For reverse-mode differentiation. Each takes grad_out, the
 *  gradient of a loss with respect to the forward's result (so shaped like
 *  it: NDM_E_SHAPE otherwise), and the forward's options, and returns the
 *  gradient with respect to one operand, shaped like that operand, in
 *  grad_out's dtype: a new array attached by the output rule, or the null
 *  handle. grad_out may have any strides (a broadcast gradient
 *  works as is); it is the first input of the output rule. Shapes given as
 *  (ndim, shape) come last and must be 4-d:
 *
 *      ndm_conv2d_backward_input(dy, w, NDM_CONV2D(.padding = {1, 1}), NDM_SHAPE(128, 1, 28, 28))
 *
 *  Errors are the forward's (NDM_E_DTYPE, NDM_E_DEVICE, NDM_E_SHAPE,
 *  NDM_E_INVALID, NDM_E_OVERFLOW), plus NDM_E_UNSUPPORTED on a device whose
 *  backend has no such gradient. The bias gradient of conv2d_bias is
 *  grad_out summed over axes 0, 2 and 3 (ndm_sum). */
/** @{ */

/** Gradient of ndm_conv2d with respect to its input x (N, C, H, W), given
 *  grad_out (N, O, OH, OW) and the weight (O, C/groups, KH, KW): the
 *  transposed convolution. x's shape is passed because with a stride
 *  several input sizes give the same output size. grad_out and weight
 *  share one float dtype and one device. */
#define ndm_conv2d_backward_input(grad_out, w, opts, ...)                       \
    ndm_conv2d_backward_input_to_at(NDM_HERE, NDM_OUTPUT_RULE, (grad_out), (w), (opts), \
                                    __VA_ARGS__)
/** ndm_conv2d_backward_input() with the result attached to m instead of by the output rule. */
#define ndm_conv2d_backward_input_to(m, grad_out, w, opts, ...)                 \
    ndm_conv2d_backward_input_to_at(NDM_HERE, (m), (grad_out), (w), (opts), __VA_ARGS__)
/** ndm_conv2d_backward_input_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_conv2d_backward_input_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                  ndm_array grad_out, ndm_array w,
                                                  const ndm_conv2d_opts *opts, int ndim,
                                                  const int64_t *input_shape);

/** Gradient of ndm_conv2d with respect to its weight, shaped weight_shape
 *  (O, C/groups, KH, KW), given grad_out (N, O, OH, OW) and the forward's
 *  input x (N, C, H, W): grad_out times the unfolded x, summed over the
 *  batch. grad_out and x share one float dtype and one device. */
#define ndm_conv2d_backward_weight(grad_out, x, opts, ...)                      \
    ndm_conv2d_backward_weight_to_at(NDM_HERE, NDM_OUTPUT_RULE, (grad_out), (x), (opts), \
                                     __VA_ARGS__)
/** ndm_conv2d_backward_weight() with the result attached to m instead of by the output rule. */
#define ndm_conv2d_backward_weight_to(m, grad_out, x, opts, ...)                \
    ndm_conv2d_backward_weight_to_at(NDM_HERE, (m), (grad_out), (x), (opts), __VA_ARGS__)
/** ndm_conv2d_backward_weight_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_conv2d_backward_weight_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                   ndm_array grad_out, ndm_array x,
                                                   const ndm_conv2d_opts *opts, int ndim,
                                                   const int64_t *weight_shape);

/** Gradient of ndm_max_pool2d with respect to x (N, C, H, W), the forward's
 *  input: each element of grad_out goes to the element its window's
 *  maximum came from, the one the forward picked (the first largest in
 *  row-major window order; a NaN over any number, the last NaN over an
 *  earlier one); overlapping windows add up. grad_out and x share one
 *  float dtype and one device. */
#define ndm_max_pool2d_backward(grad_out, x, ...)                               \
    ndm_max_pool2d_backward_to_at(NDM_HERE, NDM_OUTPUT_RULE, (grad_out), (x), __VA_ARGS__)
/** ndm_max_pool2d_backward() with the result attached to m instead of by the output rule. */
#define ndm_max_pool2d_backward_to(m, grad_out, x, ...)                         \
    ndm_max_pool2d_backward_to_at(NDM_HERE, (m), (grad_out), (x), __VA_ARGS__)
/** ndm_max_pool2d_backward_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_max_pool2d_backward_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                ndm_array grad_out, ndm_array x,
                                                const ndm_pool2d_opts *opts);

/** Gradient of ndm_avg_pool2d with respect to its input, of shape
 *  input_shape (N, C, H, W): each element of grad_out spread evenly over
 *  the input elements of its window, divided as the forward divides
 *  (count_include_pad as given to it); overlapping windows add up. */
#define ndm_avg_pool2d_backward(grad_out, count_include_pad, opts, ...)          \
    ndm_avg_pool2d_backward_to_at(NDM_HERE, NDM_OUTPUT_RULE, (grad_out), (count_include_pad), \
                                  (opts), __VA_ARGS__)
/** ndm_avg_pool2d_backward() with the result attached to m instead of by the output rule. */
#define ndm_avg_pool2d_backward_to(m, grad_out, count_include_pad, opts, ...)    \
    ndm_avg_pool2d_backward_to_at(NDM_HERE, (m), (grad_out), (count_include_pad), (opts), \
                                  __VA_ARGS__)
/** ndm_avg_pool2d_backward_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_avg_pool2d_backward_to_at(NDM_SITE_PARAMS, ndm_manager out,
                                                ndm_array grad_out, bool count_include_pad,
                                                const ndm_pool2d_opts *opts, int ndim,
                                                const int64_t *input_shape);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
