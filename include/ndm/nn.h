/* ndm nn: layers, losses, optimizers, learning-rate schedules, predictors.
 *
 * Modules, optimizers and predictors are generational handles, like arrays:
 * each belongs to a manager (the model) and dies with it; a stale handle is
 * reported as NDM_E_CLOSED, never read.
 *
 *     ndm_rng rng = ndm_rng_new(42);
 *     ndm_module net = ndm_sequential(model, NDM_MODULES(
 *         ndm_linear(model, 784, 256, true, &rng), ndm_relu_module(model),
 *         ndm_linear(model, 256, 10, true, &rng)));
 *     ndm_optimizer opt = ndm_adam(model, net, 1e-3, 0.9, 0.999, 1e-8, 0.0);
 *     ndm_manager_cap(model, NDM_CAP_ARRAYS);   // parameters and state are all in
 *     ...
 *     ndm_grad_begin(batch);
 *     ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), labels);
 *     ndm_backward(loss);
 *     ndm_grad_end();
 *     ndm_optimizer_step(opt);                   // in place: the capped model accepts it
 *     ndm_optimizer_zero_grad(opt);
 *
 * Besides the built-in layers, a module may be the user's own: a forward
 * callback over its inputs with parameters, buffers and children
 * registered by name (see "User-defined modules" below), which everything
 * here takes as it takes a layer.
 *
 * Parameters are arrays in the model manager made by the layer constructors,
 * with gradients (ndm_requires_grad), and a module belongs to the model it
 * was made with: ndm_sequential and ndm_predictor_new refuse
 * (NDM_E_NOT_OWNER) a module of another manager, so that closing or capping
 * the model covers the whole net. A failure inside a forward pass is
 * reported at the caller's line of ndm_forward. A forward pass follows the
 * output rule with the input first: its results and temporaries go to the
 * input's manager (the batch), or the innermost scope, or a named manager —
 * never to the model.
 *
 * Thread rules: a module's forward pass only reads its parameters, so many
 * threads may run it at once (predictors do), except in training mode
 * dropout, which draws numbers from the module's generator, and batch norm,
 * which updates its running statistics. Optimizer steps and
 * backward write the shared parameters and gradients: one at a time.
 */
#ifndef NDM_NN_H
#define NDM_NN_H

#include "autograd.h"
#include "base.h"
#include "conv.h"
#include "random.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A module handle: a layer or a sequence of them, owned by its model
 *  manager and freed when that manager closes. */
typedef struct ndm_module {
    uint64_t id; /**< Slot and generation; 0 is the null module. Opaque. */
} ndm_module;

/** An optimizer handle, owned by its model manager. */
typedef struct ndm_optimizer {
    uint64_t id; /**< Slot and generation; 0 is the null optimizer. Opaque. */
} ndm_optimizer;

/** A predictor handle, owned by its model manager. */
typedef struct ndm_predictor {
    uint64_t id; /**< Slot and generation; 0 is the null predictor. Opaque. */
} ndm_predictor;

/** A module list literal: NDM_MODULES(a, b) is `2, (const ndm_module[]){a, b}`. */
#define NDM_MODULES(...)                                                        \
    NDM_LIST_COUNT_(ndm_module, __VA_ARGS__), NDM_LIST_(ndm_module, __VA_ARGS__)

/* ---- initialisation (in place, from the seeded generator) ------------------- */

/** @name Initialisation
 *  Each fills an existing float array in place (a capped model's too) and
 *  returns NDM_OK, or NDM_E_SHAPE (rank 0 or above 16, a fan-in of 0) and
 *  the errors of ndm_uniform_(), with the generator unchanged. */
/** @{ */

/** He/Kaiming uniform: U(-b, b) with b = gain * sqrt(3 / fan_in), gain =
 *  sqrt(2) (ReLU). fan_in is the size of every axis but the first. */
#define ndm_init_kaiming_uniform_(a, rng) ndm_init_kaiming_uniform_inplace_at(NDM_HERE, (a), (rng))
/** ndm_init_kaiming_uniform_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_init_kaiming_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                                    ndm_rng *rng);
/** Glorot/Xavier uniform: U(-b, b) with b = sqrt(6 / (fan_in + fan_out)),
 *  fan_out = a.shape[0] * receptive field. */
#define ndm_init_xavier_uniform_(a, rng) ndm_init_xavier_uniform_inplace_at(NDM_HERE, (a), (rng))
/** ndm_init_xavier_uniform_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_init_xavier_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                                   ndm_rng *rng);
/** @} */

/* ---- layers -------------------------------------------------------------------- */

/** @name Layers
 *  Each constructor returns a module owned by `model` (it dies when `model`
 *  closes), its parameters made in `model` with gradients, or the null
 *  module: NDM_E_INVALID (sizes < 1, a NULL
 *  generator where one is needed, bad options), NDM_E_OOM, and `model`'s
 *  refusals (NDM_E_NULL, NDM_E_CLOSED, NDM_E_CAPPED, NDM_E_QUOTA).
 *  A constructor called while this thread's gradients are paused
 *  (ndm_no_grad_begin()) makes its parameters without gradient arrays: an
 *  inference model, which optimizers refuse (NDM_E_INVALID). */
/** @{ */

/** y = x W^T + b with W (out, in) (Kaiming uniform) and b (out) (zeros),
 *  f32. x is (..., in). */
#define ndm_linear(model, in, out, bias, rng)                                   \
    ndm_linear_at(NDM_HERE, (model), (in), (out), (bias), (rng))
/** ndm_linear() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_linear_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in, int64_t out,
                                 bool bias, ndm_rng *rng);
/** 2-d convolution: weight (out_ch, in_ch / groups, kh, kw) (Kaiming
 *  uniform), bias (out_ch) (zeros), options as ndm_conv2d. */
#define ndm_conv2d_module(model, in_ch, out_ch, kh, kw, bias, rng, opts)        \
    ndm_conv2d_module_at(NDM_HERE, (model), (in_ch), (out_ch), (kh), (kw), (bias), (rng), (opts))
/** ndm_conv2d_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_conv2d_module_at(NDM_SITE_PARAMS, ndm_manager model, int64_t in_ch,
                                        int64_t out_ch, int64_t kh, int64_t kw, bool bias,
                                        ndm_rng *rng, const ndm_conv2d_opts *opts);
/** Max pooling with `opts` (a kernel size is required), no parameters. */
#define ndm_max_pool2d_module(model, opts) ndm_max_pool2d_module_at(NDM_HERE, (model), (opts))
/** ndm_max_pool2d_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_max_pool2d_module_at(NDM_SITE_PARAMS, ndm_manager model,
                                            const ndm_pool2d_opts *opts);
/** ndm_relu() as a module. */
#define ndm_relu_module(model) ndm_relu_module_at(NDM_HERE, (model))
/** ndm_relu_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_relu_module_at(NDM_SITE_PARAMS, ndm_manager model);
/** ndm_gelu() (the exact form) as a module. */
#define ndm_gelu_module(model) ndm_gelu_module_at(NDM_HERE, (model))
/** ndm_gelu_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_gelu_module_at(NDM_SITE_PARAMS, ndm_manager model);
/** Flatten every axis from `start_axis` on into one (PyTorch's Flatten: 1). */
#define ndm_flatten_module(model, start_axis) ndm_flatten_module_at(NDM_HERE, (model), (start_axis))
/** ndm_flatten_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_flatten_module_at(NDM_SITE_PARAMS, ndm_manager model, int start_axis);
/** In training mode, zero each element with probability p and scale the
 *  rest by 1/(1-p); in evaluation mode the identity. Its generator starts
 *  from `seed` (0 <= p < 1). */
#define ndm_dropout_module(model, p, seed) ndm_dropout_module_at(NDM_HERE, (model), (p), (seed))
/** ndm_dropout_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_dropout_module_at(NDM_SITE_PARAMS, ndm_manager model, double p,
                                         uint64_t seed);
/** A lookup table (num, dim) (N(0, 1)): integer indices of any shape give
 *  indices.shape + (dim). */
#define ndm_embedding(model, num, dim, rng) ndm_embedding_at(NDM_HERE, (model), (num), (dim), (rng))
/** ndm_embedding() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_embedding_at(NDM_SITE_PARAMS, ndm_manager model, int64_t num, int64_t dim,
                                    ndm_rng *rng);
/** Batch normalisation over (N, C) or (N, C, L) inputs (PyTorch's
 *  BatchNorm1d; eps 1e-5 and momentum 0.1 are PyTorch's defaults): y = (x -
 *  mean) / sqrt(var + eps) * weight + bias per channel. In training mode the
 *  batch's statistics are used (biased variance) and the running ones,
 *  buffers in `model` (running_mean zeros, running_var ones,
 *  num_batches_tracked an i64 0-d count), are updated in place as PyTorch
 *  does: running = (1 - momentum) running + momentum batch, with the
 *  unbiased variance; in evaluation mode the running statistics are used.
 *  Modules start in training mode. With `affine`, weight (ones) and bias
 *  (zeros) of shape (C) are parameters. A training forward pass writes the
 *  buffers: like dropout, one thread at a time. */
#define ndm_batch_norm1d(model, features, eps, momentum, affine)                \
    ndm_batch_norm_at(NDM_HERE, (model), 1, (features), (eps), (momentum), (affine))
/** The same over (N, C, H, W) inputs (PyTorch's BatchNorm2d). */
#define ndm_batch_norm2d(model, features, eps, momentum, affine)                \
    ndm_batch_norm_at(NDM_HERE, (model), 2, (features), (eps), (momentum), (affine))
/** ndm_batch_norm1d() (spatial 1) and ndm_batch_norm2d() (spatial 2) with an
 *  explicit call site. NDM_E_INVALID also for eps <= 0 or momentum outside
 *  [0, 1]; a forward pass on another rank or channel count is NDM_E_SHAPE. */
NDM_API ndm_module ndm_batch_norm_at(NDM_SITE_PARAMS, ndm_manager model, int spatial,
                                     int64_t features, double eps, double momentum, bool affine);
/** Layer normalisation over the last `ndim` axes, of sizes `shape` (1 to 8
 *  axes; PyTorch's LayerNorm, eps 1e-5 by default): y = (x - mean) /
 *  sqrt(var + eps) * weight + bias, biased variance, with weight (ones) and
 *  bias (zeros) of `shape` as parameters when `affine`. */
#define ndm_layer_norm(model, eps, affine, ...)                                 \
    ndm_layer_norm_at(NDM_HERE, (model), __VA_ARGS__, (eps), (affine))
/** ndm_layer_norm() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_layer_norm_at(NDM_SITE_PARAMS, ndm_manager model, int ndim,
                                     const int64_t *shape, double eps, bool affine);
/** RMS normalisation over the last axis of `features` entries (PyTorch's
 *  RMSNorm(features, eps), e.g. eps 1e-6; PyTorch's default, eps=None, is
 *  the dtype's machine epsilon: FLT_EPSILON for f32): y = x / sqrt(mean(x^2)
 *  + eps) * weight, with weight (ones, shape [features]) a parameter when
 *  `affine`.
 *  Returns the module, or a null one: NDM_E_INVALID for features < 1 or an
 *  eps that is negative or not finite, and the model's errors; a forward
 *  pass on another last axis is NDM_E_SHAPE. */
#define ndm_rms_norm_module(model, features, eps, affine)                       \
    ndm_rms_norm_module_at(NDM_HERE, (model), (features), (eps), (affine))
/** ndm_rms_norm_module() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_rms_norm_module_at(NDM_SITE_PARAMS, ndm_manager model, int64_t features,
                                          double eps, bool affine);
/** Multi-head self-attention (PyTorch's nn.MultiheadAttention(embed,
 *  heads, bias, batch_first=True) called as mha(x, x, x), without dropout;
 *  with `causal`, is_causal): x (batch, seq, embed) is projected once to
 *  queries, keys and values by in_proj_weight (3 embed, embed; Xavier
 *  uniform) and in_proj_bias (zeros), each head of embed / heads runs
 *  ndm_sdpa, and the heads joined go through out_proj, a Linear(embed,
 *  embed) child whose state is named out_proj.weight and out_proj.bias.
 *  Returns the module, or a null one: NDM_E_INVALID when embed is not a
 *  positive multiple of heads or rng is NULL, and the model's errors; a
 *  forward pass on another shape is NDM_E_SHAPE. */
#define ndm_multihead_attention(model, embed, heads, bias, causal, rng)         \
    ndm_multihead_attention_at(NDM_HERE, (model), (embed), (heads), (bias), (causal), (rng))
/** ndm_multihead_attention() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_multihead_attention_at(NDM_SITE_PARAMS, ndm_manager model, int64_t embed,
                                              int64_t heads, bool bias, bool causal,
                                              ndm_rng *rng);
/** The modules applied in order (n = 0: the identity, returning an alias).
 *  They must belong to `model` with their parameters (NDM_E_NOT_OWNER). A
 *  null module in the list (a constructor inside it failed) makes the result
 *  null and keeps that constructor's error, as chained operations do. */
#define ndm_sequential(model, ...) ndm_sequential_at(NDM_HERE, (model), __VA_ARGS__)
/** ndm_sequential() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_sequential_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                     const ndm_module *modules);
/** @} */

/** Run a module on x: a fresh array attached by the output rule (the `_to`
 *  manager, else the innermost scope, else x's manager), the caller's to
 *  release, or the null handle with the failing operation's error, reported
 *  at the caller's line: NDM_E_NULL / NDM_E_CLOSED for m or x, NDM_E_SHAPE
 *  or NDM_E_DTYPE for an input the layer does not take, and the errors of
 *  the operations it is made of (NDM_E_OOM, the output manager's). ReLU,
 *  GELU, Flatten, Dropout and LayerNorm take inputs of any rank. Recorded for gradients when this thread records.
 *  When it does not, a linear layer (and a ReLU right after it in a
 *  sequential) runs as one fused operation: the same bits as matmul, add
 *  and relu in turn, without their intermediate arrays. */
#define ndm_forward(m, x) ndm_forward_to_at(NDM_HERE, NDM_OUTPUT_RULE, (m), (x))
/** ndm_forward() with the result attached to out instead of by the output rule. */
#define ndm_forward_to(out, m, x) ndm_forward_to_at(NDM_HERE, (out), (m), (x))
/** ndm_forward_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_forward_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module m, ndm_array x);
/** Run a module on n inputs (a user module's forward may take several: x
 *  and a mask; NDM_ARRAYS(x, mask) writes the count and the list), as
 *  ndm_forward() does with inputs[0] as its x: the output rule follows
 *  inputs[0], which must be live; the others are live arrays or the null
 *  handle (an input left out). A built-in layer takes one input
 *  (NDM_E_INVALID otherwise); n < 1 is NDM_E_INVALID. */
#define ndm_forward_n(m, ...) ndm_forward_n_to_at(NDM_HERE, NDM_OUTPUT_RULE, (m), __VA_ARGS__)
/** ndm_forward_n() with the result attached to out instead of by the output rule. */
#define ndm_forward_n_to(out, m, ...) ndm_forward_n_to_at(NDM_HERE, (out), (m), __VA_ARGS__)
/** ndm_forward_n_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_forward_n_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module m, int n,
                                      const ndm_array *inputs);

/** Training mode (dropout active) or evaluation mode, for m and its
 *  children. NDM_OK; NDM_E_NULL, NDM_E_CLOSED or NDM_E_INVALID for a bad
 *  module handle. */
NDM_API NDM_NODISCARD ndm_status ndm_module_set_training(ndm_module m, bool training);
/** m's part in a byte budget (ndm_grad_begin_budget): NDM_RECOMPUTE_KEEP
 *  (what its forward passes record is never dropped), NDM_RECOMPUTE_ALWAYS
 *  (its calls are units dropped before backward and recomputed there; inside
 *  another unit, that unit is), or NDM_RECOMPUTE_AUTO (the default). For m
 *  itself, not its children. NDM_E_INVALID for another mode; errors as for
 *  ndm_module_set_training() for a bad handle. */
NDM_API NDM_NODISCARD ndm_status ndm_module_set_recompute(ndm_module m, ndm_recompute mode);
/** The parameters of m and its children, in order: writes up to cap handles
 *  (not fresh ones: they are the parameters themselves, owned by the model)
 *  and returns how many there are (more than cap: only cap are written), or
 *  a negative status: errors as for ndm_module_set_training(). */
NDM_API int ndm_module_parameters(ndm_module m, ndm_array *out, int cap);
/** Like ndm_module_parameters(), with names ("0.weight", "0.bias",
 *  "2.weight", ...): names[i] points into the module and lives as long as
 *  it does (names may be NULL). */
NDM_API int ndm_module_named_parameters(ndm_module m, const char **names, ndm_array *out,
                                        int cap);
/** The state of m and its children, in the order and with the names of
 *  PyTorch's state_dict: parameters and buffers (batch norm's running_mean,
 *  running_var, num_batches_tracked). Returns and errors as for
 *  ndm_module_named_parameters(): names[i] points into the module and
 *  lives as long as it does. */
NDM_API int ndm_module_named_state(ndm_module m, const char **names, ndm_array *out, int cap);
/** A one-line description: "Sequential(Linear(784, 256), ReLU, Linear(256, 10))",
 *  into buf (truncated to n, NUL-terminated; buf may be NULL); returns the
 *  full length, or a negative status for a bad handle: errors as for
 *  ndm_module_set_training(). */
NDM_API int ndm_module_describe(ndm_module m, char *buf, size_t n);

/* ---- functional blocks (recorded as their parts) ------------------------------- */

/** @name Functional blocks
 *  Each is composed of the operations it names and recorded as them, so it
 *  has their gradients; its temporaries live in a scope of the output
 *  manager and are released before it returns. Each returns a new array
 *  owned by the output rule's manager (the first input's, unless a scope
 *  or the _to form names one), or the null handle with nothing allocated:
 *  the errors named, NDM_E_NULL / NDM_E_CLOSED for a null or stale handle,
 *  and NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from the output manager. */
/** @{ */

/** torch.nn.functional.rms_norm over the last axis: x / sqrt(mean(x^2,
 *  last axis) + eps), times `weight` (shape [x's last size]) unless it is
 *  the null handle (PyTorch's eps=None is the dtype's machine epsilon:
 *  FLT_EPSILON for f32, DBL_EPSILON for f64). Errors: NDM_E_DTYPE for a
 *  non-float x or weight, NDM_E_SHAPE for a rank-0 x or a weight of
 *  another shape, NDM_E_INVALID for an eps that is negative or not finite. */
#define ndm_rms_norm(x, weight, eps)                                            \
    ndm_rms_norm_to_at(NDM_HERE, NDM_OUTPUT_RULE, (x), (weight), (eps))
/** ndm_rms_norm() with the result attached to m instead of by the output rule. */
#define ndm_rms_norm_to(m, x, weight, eps) ndm_rms_norm_to_at(NDM_HERE, (m), (x), (weight), (eps))
/** ndm_rms_norm_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_rms_norm_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array x,
                                     ndm_array weight, double eps);

/** Scaled dot-product attention (torch.nn.functional.
 *  scaled_dot_product_attention without dropout): softmax(q k^T * scale +
 *  masks) v over q [..., L, E], k [..., S, E] and v [..., S, Ev] (e.g.
 *  [batch, heads, seq, dim]; batch axes broadcast as matmul's do), giving
 *  [..., L, Ev]. `scale` 0 takes 1 / sqrt(E). With `causal`, query i
 *  attends to keys j <= i (the top-left triangle, as PyTorch's is_causal).
 *  `mask`, unless the null handle, broadcasts to [..., L, S]: a bool mask
 *  keeps the scores where it is true (PyTorch's convention; a padding mask
 *  is false at the padded keys), a float one (q's dtype) is added to them;
 *  it combines with `causal`. A query that sees no key gets NaN, as the
 *  composed softmax of PyTorch does. Errors: NDM_E_DTYPE unless q, k and v
 *  share a float dtype and the mask is bool or that dtype, NDM_E_SHAPE for
 *  sizes that do not match (or a mask that does not broadcast),
 *  NDM_E_INVALID for a non-finite scale. */
#define ndm_sdpa(q, k, v, mask, causal, scale)                                  \
    ndm_sdpa_to_at(NDM_HERE, NDM_OUTPUT_RULE, (q), (k), (v), (mask), (causal), (scale))
/** ndm_sdpa() with the result attached to m instead of by the output rule. */
#define ndm_sdpa_to(m, q, k, v, mask, causal, scale)                            \
    ndm_sdpa_to_at(NDM_HERE, (m), (q), (k), (v), (mask), (causal), (scale))
/** ndm_sdpa_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_sdpa_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array q, ndm_array k,
                                 ndm_array v, ndm_array mask, bool causal, double scale);
/** @} */

/* ---- user-defined modules ------------------------------------------------------ */

/** @name User-defined modules
 *  A module of the user's own: a forward callback over its inputs, and the
 *  parameters, buffers and child modules it registers by name, so that it
 *  works wherever a built-in layer does (ndm_forward(), autograd, the
 *  optimizers, ndm_module_save() and ndm_module_load(), predictors,
 *  ndm_ddp_new(), ndm_module_describe(), dumps and snapshot frames).
 *
 *      static ndm_array block_forward(ndm_module self, int n, const ndm_array *in, void *ud)
 *      {
 *          ndm_array h = ndm_forward(ndm_module_get_child(self, "fc1"), in[0]);
 *          ndm_array y = ndm_forward(ndm_module_get_child(self, "fc2"), ndm_relu(h));
 *          return ndm_add(in[0], y);                 // x + fc2(relu(fc1(x)))
 *      }
 *      static const ndm_module_type block_type = {.name = "Block", .forward = block_forward};
 *
 *      ndm_module b = ndm_module_new(model, &block_type, NULL);
 *      ndm_module_register_child(b, "fc1", ndm_linear(model, 8, 8, true, &rng));
 *      ndm_module_register_child(b, "fc2", ndm_linear(model, 8, 8, true, &rng));
 *      ndm_module blocks = ndm_module_list(model, NDM_MODULES(b, b2, b3, b4));
 *      ndm_module_register_child(net, "blocks", blocks);   // "blocks.3.fc1.weight"
 *
 *  Names compose as PyTorch's do: a child's entries appear under
 *  "<name>.", in the order of PyTorch's state_dict (a module's own
 *  parameters, then its own buffers, then each child's, in registration
 *  order), so a model written the same way in PyTorch has the same names.
 *  Numbered children ("blocks.3") come from a container: ndm_module_list()
 *  (PyTorch's ModuleList) or ndm_sequential(). A name is local: not empty,
 *  no '.', under 128 bytes, and one a module does not hold yet (parameter,
 *  buffer and child names share one namespace).
 *
 *  A tree is built bottom-up: a module's parameters and children are
 *  registered before it is registered in another (after that, its own
 *  registrations are refused: NDM_E_INVALID). A module has one place in a
 *  tree and a registered array one name; a parameter shared by two modules
 *  (weight tying) is made with ndm_module_tie() once the tree is built.
 *  Every array and child belongs to the module's model manager
 *  (NDM_E_NOT_OWNER). Registration is not thread-safe: build a model on
 *  one thread, then run it on many. */
/** @{ */

/** What a user module does. The struct is copied by ndm_module_new() (it
 *  may be a temporary); the callbacks run on the calling thread. */
typedef struct ndm_module_type {
    /** The class name for descriptions and messages ("Block"; NULL:
     *  "Module"), copied (63 bytes kept). */
    const char *name;
    /** Required: the forward pass. inputs are those given to ndm_forward()
     *  (one) or ndm_forward_n() (n >= 1: inputs[0] a live array, the others
     *  live arrays or the null handle, for an input left out such as a
     *  mask). It runs inside the forward pass's scope: every array made by
     *  the output rule lands there and is released when the pass ends,
     *  except the array returned, which moves to the caller. Return a fresh
     *  array (one of the inputs or of the module's arrays is returned as an
     *  ndm_alias() of it), or the null handle on failure, leaving the
     *  failing call's error (it names the callback's line); a null return
     *  with no error of its own is reported as NDM_E_INVALID. */
    ndm_array (*forward)(ndm_module self, int n, const ndm_array *inputs, void *user_data);
    /** Optional: write the one-line description as snprintf does (buf of n
     *  bytes, NUL-terminated, n may be 0) and return its full length, or a
     *  negative status. NULL: "Name(child=..., ...)", the children
     *  described in registration order ("Name" with none). */
    int (*describe)(ndm_module self, char *buf, size_t n, void *user_data);
    /** Optional: free user_data. Called once, when the module dies (its
     *  model closes; possibly later, on another thread, once no forward
     *  pass still runs), or by ndm_module_new() when it fails. */
    void (*destroy)(void *user_data);
} ndm_module_type;

/** A new module of `type`, owned by `model`, in training mode, with no
 *  parameters yet. user_data is the module's from now on, on every path:
 *  on failure type->destroy (if any) has been called on it. Returns the
 *  module, or the null module: NDM_E_INVALID (type NULL or without a
 *  forward), NDM_E_OOM, and model's refusals (NDM_E_NULL, NDM_E_CLOSED). */
#define ndm_module_new(model, type, user_data)                                  \
    ndm_module_new_at(NDM_HERE, (model), (type), (user_data))
/** ndm_module_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_module_new_at(NDM_SITE_PARAMS, ndm_manager model,
                                     const ndm_module_type *type, void *user_data);
/** Register `a` (an array of m's model, float) as m's parameter `name`:
 *  it joins m's parameters and state (and its ancestors', once m is a
 *  child) and the optimizers made afterwards. Unless this thread's
 *  gradients are paused (between ndm_no_grad_begin() and ndm_no_grad_end()),
 *  an `a` without a gradient is given one (ndm_requires_grad()); a model
 *  built with them paused is an inference model, as with the built-in
 *  layers. The model keeps the array; nothing is copied. NDM_OK,
 *  or with m unchanged: NDM_E_INVALID (a bad name, a name m holds, an
 *  array registered already, m registered in another module already),
 *  NDM_E_NOT_OWNER (an array of another manager), NDM_E_DTYPE (not
 *  float), NDM_E_OOM, and the handles' errors. */
#define ndm_module_register_parameter(m, name, a)                               \
    ndm_module_register_parameter_at(NDM_HERE, (m), (name), (a))
/** ndm_module_register_parameter() with an explicit call site. */
NDM_API NDM_NODISCARD ndm_status ndm_module_register_parameter_at(NDM_SITE_PARAMS, ndm_module m,
                                                                  const char *name, ndm_array a);
/** Register `a` (an array of m's model, any dtype) as m's buffer `name`:
 *  part of its state (checkpoints, ddp's broadcast) but not a parameter
 *  (no gradient, no optimizer). NDM_OK or, with m unchanged, the errors of
 *  ndm_module_register_parameter() (but any dtype). */
#define ndm_module_register_buffer(m, name, a)                                  \
    ndm_module_register_buffer_at(NDM_HERE, (m), (name), (a))
/** ndm_module_register_buffer() with an explicit call site. */
NDM_API NDM_NODISCARD ndm_status ndm_module_register_buffer_at(NDM_SITE_PARAMS, ndm_module m,
                                                               const char *name, ndm_array a);
/** Register `child` (a module of m's model: a built-in layer, a container
 *  or a user module) as m's child `name`: its parameters and state join
 *  m's under "name.", its qualified name becomes "name" under m's
 *  ("blocks.3.attn"), and m's train/eval switch reaches it. NDM_OK or,
 *  with m unchanged: NDM_E_INVALID (a bad or taken name, child is m,
 *  child registered already, m registered in another module already, an
 *  array of child's that m's tree holds already, a composed state name
 *  past 127 bytes), NDM_E_NOT_OWNER (child or its arrays of another
 *  manager), NDM_E_OOM, and the handles' errors (a null child, from a
 *  constructor that failed, keeps that constructor's error). */
#define ndm_module_register_child(m, name, child)                               \
    ndm_module_register_child_at(NDM_HERE, (m), (name), (child))
/** ndm_module_register_child() with an explicit call site. */
NDM_API NDM_NODISCARD ndm_status ndm_module_register_child_at(NDM_SITE_PARAMS, ndm_module m,
                                                              const char *name,
                                                              ndm_module child);
/** Tie the parameter `name` of m's tree to the parameter `to` (dotted names
 *  from m, as ndm_module_named_state() gives them): `name` becomes the very
 *  array of `to`, as PyTorch's `model.head.weight = model.tok_emb.weight`
 *  does, in m, in the module that holds `name` (a built-in layer uses the
 *  new array in its forward pass) and in every module above it. The array
 *  that was at `name` is released with its gradient (unless the tree still
 *  holds it under another name): tie before making optimizers, predictors
 *  or ddp over the model, which keep the handles they were given, and look
 *  the arrays up by name in a user module's forward (ndm_module_get_array())
 *  rather than keeping handles of them.
 *
 *  Afterwards ndm_module_named_state() (and so ndm_module_save(), which
 *  writes both names, as torch.save(model.state_dict()) holds both keys)
 *  lists both names, while ndm_module_parameters() and
 *  ndm_module_named_parameters() list the array once, under its first name
 *  in state order (PyTorch's parameters()), so an optimizer updates it once;
 *  a forward pass that uses it twice adds both uses into its one gradient.
 *  ndm_module_load() reads a file with both names (their values must be
 *  equal: NDM_E_FORMAT otherwise, nothing loaded) or with one of them (as
 *  PyTorch's safetensors save_model writes), and counts the array once in
 *  the tensors it returns as loaded. ndm_module_describe() ends with
 *  " [head.weight (tied to tok_emb.weight)]".
 *
 *  NDM_OK (tied already: nothing changes), or with the module unchanged:
 *  NDM_E_INVALID (a NULL or unknown name, a buffer, name equal to to),
 *  NDM_E_SHAPE / NDM_E_DTYPE / NDM_E_DEVICE (the two differ in shape,
 *  dtype or device), NDM_E_NOT_OWNER (either array lives outside m's
 *  model, moved out with ndm_attach(): parameters of different models are
 *  not tied), and the handle's errors. Not thread-safe, as registration. */
#define ndm_module_tie(m, name, to) ndm_module_tie_at(NDM_HERE, (m), (name), (to))
/** ndm_module_tie() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_module_tie_at(NDM_SITE_PARAMS, ndm_module m,
                                                   const char *name, const char *to);
/** The modules as children "0", "1", ... with no forward pass of its own
 *  (PyTorch's ModuleList: a user module runs them as it likes, for
 *  instance with a mask): ndm_forward() on it is NDM_E_INVALID. Registered
 *  as "blocks", its children are "blocks.0", "blocks.1", ... Errors as for
 *  ndm_sequential(), and NDM_E_INVALID for a module registered already or
 *  twice in the list. */
#define ndm_module_list(model, ...) ndm_module_list_at(NDM_HERE, (model), __VA_ARGS__)
/** ndm_module_list() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_module_list_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                      const ndm_module *modules);
/** The user data given to ndm_module_new(), or NULL: for a module that is
 *  not a user module, NDM_E_INVALID; for a bad handle, its error. */
NDM_API void *ndm_module_user_data(ndm_module m);
/** The array m holds under `name`: its own ("weight") or a descendant's
 *  ("attn.qkv.weight"), a parameter or a buffer. The handle is the array
 *  itself, not a fresh one (owned by the model: do not release it), or the
 *  null handle: NDM_E_INVALID naming what m holds, and the handle's errors. */
#define ndm_module_get_array(m, name) ndm_module_get_array_at(NDM_HERE, (m), (name))
/** ndm_module_get_array() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_module_get_array_at(NDM_SITE_PARAMS, ndm_module m, const char *name);
/** m's child `name`, or a descendant's through dots ("blocks.3.attn"): the
 *  module itself (owned by the model), or the null module: NDM_E_INVALID
 *  naming m's children, and the handle's errors. */
#define ndm_module_get_child(m, name) ndm_module_get_child_at(NDM_HERE, (m), (name))
/** ndm_module_get_child() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_module ndm_module_get_child_at(NDM_SITE_PARAMS, ndm_module m, const char *name);
/** m's direct children in registration order with their names (names[i]
 *  points into m and lives as long as it does; names and out may be
 *  NULL): writes up to cap, returns how many there are, or a negative
 *  status for a bad handle. */
NDM_API int ndm_module_named_children(ndm_module m, const char **names, ndm_module *out, int cap);
/** m's qualified name in its tree ("blocks.3.attn"; "" for a root, as
 *  PyTorch's named_modules() names it) into buf as snprintf would; returns
 *  its length, or a negative status for a bad handle. */
NDM_API int ndm_module_name(ndm_module m, char *buf, size_t n);
/** Is this a live module? (false for null and stale handles; never fails,
 *  sets no error) */
NDM_API bool ndm_module_valid(ndm_module m);
/** 1 in training mode, 0 in evaluation mode (ndm_module_set_training()),
 *  or a negative status for a bad handle. */
NDM_API int ndm_module_training(ndm_module m);
/** @} */

/* ---- losses (recorded for gradients) -------------------------------------------- */

/** @name Losses
 *  Each returns a new 0-d array attached by the output rule (the `_to`
 *  form: to m), which the caller releases or its manager's close does, or
 *  the null handle: NDM_E_SHAPE, NDM_E_DTYPE (logits not float, labels not
 *  u8, i32 or i64), NDM_E_INVALID (a label outside [0, C) that is not the
 *  ignored one, negative ones included: the message names the first and
 *  its position; checked on the labels' device), and the errors of the elementwise and reduction
 *  functions it is made of. */
/** @{ */

/** The label PyTorch's cross_entropy and nll_loss ignore by default
 *  (ignore_index=-100): ndm_cross_entropy() and ndm_nll_loss() skip it too. */
#define NDM_IGNORE_INDEX (-100)
/** Mean over the batch of -log softmax(logits)[label]: logits (N, C) float,
 *  labels (N) integer in [0, C) or NDM_IGNORE_INDEX (NDM_E_INVALID
 *  otherwise). A row whose label is NDM_IGNORE_INDEX adds nothing and gets
 *  a zero gradient; the mean is over the other rows (all ignored: NaN, and
 *  zero gradients, as PyTorch gives). A 0-d result. */
#define ndm_cross_entropy(logits, labels)                                       \
    ndm_cross_entropy_to_at(NDM_HERE, NDM_OUTPUT_RULE, (logits), (labels))
/** ndm_cross_entropy() with the result attached to m instead of by the output rule. */
#define ndm_cross_entropy_to(m, logits, labels)                                 \
    ndm_cross_entropy_to_at(NDM_HERE, (m), (logits), (labels))
/** ndm_cross_entropy_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_cross_entropy_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logits,
                                          ndm_array labels);
/** ndm_cross_entropy() ignoring the label ignore_index instead of
 *  NDM_IGNORE_INDEX (PyTorch's ignore_index argument; one in [0, C) drops
 *  that class). u8 labels never equal a value outside [0, 255]. */
#define ndm_cross_entropy_ex(logits, labels, ignore_index)                      \
    ndm_cross_entropy_ex_to_at(NDM_HERE, NDM_OUTPUT_RULE, (logits), (labels), (ignore_index))
/** ndm_cross_entropy_ex() with the result attached to m instead of by the output rule. */
#define ndm_cross_entropy_ex_to(m, logits, labels, ignore_index)                \
    ndm_cross_entropy_ex_to_at(NDM_HERE, (m), (logits), (labels), (ignore_index))
/** ndm_cross_entropy_ex_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_cross_entropy_ex_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logits,
                                             ndm_array labels, int64_t ignore_index);
/** Mean over the batch of -logp[label]: logp (N, C), labels (N), the rows
 *  labelled NDM_IGNORE_INDEX skipped as in ndm_cross_entropy(). */
#define ndm_nll_loss(logp, labels) ndm_nll_loss_to_at(NDM_HERE, NDM_OUTPUT_RULE, (logp), (labels))
/** ndm_nll_loss() with the result attached to m instead of by the output rule. */
#define ndm_nll_loss_to(m, logp, labels) ndm_nll_loss_to_at(NDM_HERE, (m), (logp), (labels))
/** ndm_nll_loss_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_nll_loss_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logp,
                                     ndm_array labels);
/** ndm_nll_loss() ignoring the label ignore_index instead of NDM_IGNORE_INDEX. */
#define ndm_nll_loss_ex(logp, labels, ignore_index)                             \
    ndm_nll_loss_ex_to_at(NDM_HERE, NDM_OUTPUT_RULE, (logp), (labels), (ignore_index))
/** ndm_nll_loss_ex() with the result attached to m instead of by the output rule. */
#define ndm_nll_loss_ex_to(m, logp, labels, ignore_index)                       \
    ndm_nll_loss_ex_to_at(NDM_HERE, (m), (logp), (labels), (ignore_index))
/** ndm_nll_loss_ex_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_nll_loss_ex_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array logp,
                                        ndm_array labels, int64_t ignore_index);
/** Mean of (a - b)^2 (broadcasting). */
#define ndm_mse_loss(a, b) ndm_mse_loss_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_mse_loss() with the result attached to m instead of by the output rule. */
#define ndm_mse_loss_to(m, a, b) ndm_mse_loss_to_at(NDM_HERE, (m), (a), (b))
/** ndm_mse_loss_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_mse_loss_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** @} */

/* ---- optimizers ------------------------------------------------------------------- */

/** @name Optimizers
 *  Each constructor returns an optimizer owned by `model` (freed when it
 *  closes), with its state arrays in `model`, or the null optimizer:
 *  NDM_E_INVALID (a rate that is not finite, lr or eps <= 0, a beta outside
 *  [0, 1)), NDM_E_OOM, the errors of net's handle, and `model`'s refusals;
 *  state arrays made before a failure stay in `model` until it closes. A
 *  step or zero_grad returns NDM_OK or the first in-place update's error;
 *  on a bad handle NDM_E_NULL, NDM_E_CLOSED or NDM_E_INVALID. */
/** @{ */

/** SGD over the parameters of `net`: v = momentum v + g + weight_decay w;
 *  w -= lr v (plain SGD with momentum 0). Its state (velocities and scratch)
 *  is made now in `model`, so the model can be capped afterwards; steps
 *  allocate nothing. */
#define ndm_sgd(model, net, lr, momentum, weight_decay)                         \
    ndm_sgd_at(NDM_HERE, (model), (net), (lr), (momentum), (weight_decay))
/** ndm_sgd() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_optimizer ndm_sgd_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net, double lr,
                                 double momentum, double weight_decay);
/** Adam (L2 weight decay added to the gradient) over the parameters of net. */
#define ndm_adam(model, net, lr, beta1, beta2, eps, weight_decay)               \
    ndm_adam_at(NDM_HERE, (model), (net), (lr), (beta1), (beta2), (eps), (weight_decay), false)
/** AdamW: weight decay applied to the weights directly (decoupled). */
#define ndm_adamw(model, net, lr, beta1, beta2, eps, weight_decay)              \
    ndm_adam_at(NDM_HERE, (model), (net), (lr), (beta1), (beta2), (eps), (weight_decay), true)
/** ndm_adam() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_optimizer ndm_adam_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net, double lr,
                                  double beta1, double beta2, double eps, double weight_decay,
                                  bool decoupled);
/** SGD over any list of n parameters (arrays with gradients, made by
 *  ndm_requires_grad), for networks built without modules. The list is
 *  copied; NDM_E_INVALID for an array that is not a parameter. */
#define ndm_sgd_params(model, n, params, lr, momentum, weight_decay)            \
    ndm_sgd_params_at(NDM_HERE, (model), (n), (params), (lr), (momentum), (weight_decay))
/** ndm_sgd_params() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_optimizer ndm_sgd_params_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                        const ndm_array *params, double lr, double momentum,
                                        double weight_decay);
/** Adam over any list of n parameters (as ndm_sgd_params()). */
#define ndm_adam_params(model, n, params, lr, beta1, beta2, eps, weight_decay)  \
    ndm_adam_params_at(NDM_HERE, (model), (n), (params), (lr), (beta1), (beta2), (eps),      \
                       (weight_decay), false)
/** AdamW over any list of n parameters (as ndm_sgd_params()). */
#define ndm_adamw_params(model, n, params, lr, beta1, beta2, eps, weight_decay) \
    ndm_adam_params_at(NDM_HERE, (model), (n), (params), (lr), (beta1), (beta2), (eps),      \
                       (weight_decay), true)
/** ndm_adam_params() and ndm_adamw_params() with an explicit call site. */
NDM_API ndm_optimizer ndm_adam_params_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                         const ndm_array *params, double lr, double beta1,
                                         double beta2, double eps, double weight_decay,
                                         bool decoupled);
/** The most steps an optimizer counts (2^53, where a double, which Adam's
 *  bias correction reads the count as, stops being exact): the step after
 *  it is refused, and a loaded state may not hold more. */
#define NDM_OPTIMIZER_MAX_STEPS (INT64_C(1) << 53)
/** Update every parameter from its gradient (in place). Where the backend
 *  has a fused kernel (the CPU) and the parameter, its gradient and its
 *  state are contiguous f32 or f64 arrays apart from each other, the update
 *  is one pass per parameter; either way its result is, bit for bit, that of
 *  the formulas above evaluated as separate elementwise operations in the
 *  parameter's dtype (each scalar converted to it first, no fused
 *  multiply-add). NDM_E_OVERFLOW, with nothing changed, once the optimizer
 *  has taken NDM_OPTIMIZER_MAX_STEPS steps. */
NDM_API NDM_NODISCARD ndm_status ndm_optimizer_step(ndm_optimizer o);
/** Zero every parameter's gradient. Returns NDM_OK, or NDM_E_NULL,
 *  NDM_E_CLOSED or NDM_E_INVALID for a bad handle. */
NDM_API NDM_NODISCARD ndm_status ndm_optimizer_zero_grad(ndm_optimizer o);
/** Set the learning rate (> 0 and finite: NDM_E_INVALID otherwise). */
NDM_API NDM_NODISCARD ndm_status ndm_optimizer_set_lr(ndm_optimizer o, double lr);
/** The learning rate, or -1 for a bad handle (NDM_E_NULL, NDM_E_CLOSED or
 *  NDM_E_INVALID set). */
NDM_API double ndm_optimizer_lr(ndm_optimizer o);

/** Save the optimizer's state as safetensors: its state arrays under
 *  PyTorch's names ("state.0.momentum_buffer", "state.0.exp_avg",
 *  "state.0.exp_avg_sq", by parameter index) and, as metadata, the
 *  algorithm ("sgd", "adam", "adamw"), the step count, the learning rate
 *  and the parameter count. NDM_OK or the errors of ndm_safetensors_save(). */
#define ndm_optimizer_save(o, path) ndm_optimizer_save_at(NDM_HERE, (o), (path))
/** ndm_optimizer_save() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_optimizer_save_at(NDM_SITE_PARAMS, ndm_optimizer o,
                                                       const char *path);
/** Restore a state saved by ndm_optimizer_save() into an optimizer of the
 *  same algorithm over parameters of the same shapes: the state arrays (in
 *  place: a capped model accepts it), the step count and the learning rate,
 *  so that a resumed run takes the steps an unbroken one would. Everything
 *  is checked first: on failure nothing changes (state arrays, step count,
 *  learning rate), and the message names the field or tensor at fault.
 *  The metadata numbers are read whole, each within its type (no blanks,
 *  no trailing bytes: "8abc" is refused, not read as 8). NDM_E_INVALID
 *  (another algorithm or parameter count, a step count outside [0,
 *  NDM_OPTIMIZER_MAX_STEPS], a learning rate ndm_optimizer_set_lr()
 *  refuses), NDM_E_FORMAT (not an optimizer state, a metadata number that
 *  does not parse or overflows its type, a tensor missing or extra),
 *  NDM_E_SHAPE, and the load's errors. */
#define ndm_optimizer_load(o, path) ndm_optimizer_load_at(NDM_HERE, (o), (path))
/** ndm_optimizer_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_optimizer_load_at(NDM_SITE_PARAMS, ndm_optimizer o,
                                                       const char *path);

/** Step decay: returns base * gamma^floor(epoch / step_size) (base for
 *  step_size < 1 or epoch < 0); never fails. */
NDM_API double ndm_lr_step(double base, int64_t epoch, int64_t step_size, double gamma);
/** Cosine annealing: returns the rate at step t from base (t = 0) to min_lr
 *  (t = total; t clamped to [0, total], base for total < 1); never fails. */
NDM_API double ndm_lr_cosine(double base, double min_lr, int64_t t, int64_t total);
/** @} */

/* ---- checkpoints ------------------------------------------------------------------- */

/** How ndm_module_load() treats names that do not match. */
enum {
    /** Every tensor of the module must be in the file and nothing else
     *  (PyTorch's strict=True). */
    NDM_CHECKPOINT_STRICT = 0,
    /** Tensors missing from the file keep their values; tensors the module
     *  lacks are ignored (strict=False), and a warning names every one of
     *  both. Shapes must still match, and a file of which no name matches
     *  (another naming scheme: "fc1.weight" for "0.weight") is refused with
     *  NDM_E_FORMAT, the module unchanged. */
    NDM_CHECKPOINT_LENIENT = 1,
};

/** Save the state of m (ndm_module_named_state(): parameters and buffers
 *  under PyTorch's state_dict names, "0.weight", "2.bias", ...) as a
 *  safetensors file that PyTorch's safetensors.torch.load_file() and
 *  load_state_dict() read. NDM_OK or the errors of ndm_safetensors_save(). */
#define ndm_module_save(m, path) ndm_module_save_at(NDM_HERE, (m), (path))
/** ndm_module_save() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_module_save_at(NDM_SITE_PARAMS, ndm_module m,
                                                    const char *path);
/** Load a safetensors state (one written by ndm_module_save(), or a PyTorch
 *  state_dict saved with safetensors) into m, in place (a capped model
 *  accepts it), converting dtypes as a cast would. Names and shapes are all
 *  checked before anything is written, so on these errors m is unchanged:
 *  NDM_E_SHAPE names every mis-shaped tensor with both shapes (past eight
 *  sizes, the first eight, "..." and the rank); in strict
 *  mode NDM_E_FORMAT names the missing and unexpected tensors. Returns the
 *  number of tensors loaded, or a negative status (also NDM_E_INVALID for
 *  an unknown mode, and the errors of ndm_safetensors_load()). The file is
 *  read through a private mapping held only during the call. */
#define ndm_module_load(m, path, mode) ndm_module_load_at(NDM_HERE, (m), (path), (mode))
/** ndm_module_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API int ndm_module_load_at(NDM_SITE_PARAMS, ndm_module m, const char *path, unsigned mode);

/** How the names of a checkpoint read in the module, for a file written
 *  under another naming (a wrapper's "model." prefix, "fc1" for "0"):
 *  first the prefix rewrites, then the callback. Both are optional. */
typedef struct ndm_name_map {
    /** Prefix rewrites: a file name that starts with from[k] reads as to[k]
     *  followed by the rest (the first k that matches; to[k] may be "" or
     *  NULL, which drops the prefix). n = 0: none. */
    int n;
    const char *const *from; /**< n file prefixes ("model.") */
    const char *const *to;   /**< n module prefixes ("", "encoder.") */
    /** Optional: the module's name for `file_name` (after the prefixes),
     *  written into buf (cap bytes, NUL-terminated): return 1 to use it, 0
     *  to leave the tensor out (neither loaded nor reported), or a negative
     *  status to fail the load with it. */
    int (*fn)(const char *file_name, char *buf, size_t cap, void *ud);
    void *ud; /**< passed to fn */
} ndm_name_map;

/** ndm_module_load() with the file's names read through `map` (NULL: as
 *  they are): matching, the messages (which give the names as mapped) and
 *  both modes are as there. Also NDM_E_FORMAT when two of the file's
 *  tensors map to one name, NDM_E_INVALID for a map with n < 0 or n > 0
 *  and a list NULL, or a mapped name past 511 bytes, and the callback's own
 *  negative status; on every error m is unchanged. */
#define ndm_module_load_mapped(m, path, mode, map)                              \
    ndm_module_load_mapped_at(NDM_HERE, (m), (path), (mode), (map))
/** ndm_module_load_mapped() with an explicit call site (the macro passes NDM_HERE). */
NDM_API int ndm_module_load_mapped_at(NDM_SITE_PARAMS, ndm_module m, const char *path,
                                      unsigned mode, const ndm_name_map *map);

/* ---- predictors -------------------------------------------------------------------- */

/** A predictor for `net`, which must belong to `model` with every parameter
 *  owned by `model` itself (NDM_E_NOT_OWNER otherwise, and nothing is
 *  capped): caps `model` (arrays and children, except the predictor's own
 *  manager "predictor", made now) and puts net in evaluation mode. A null
 *  net is NDM_E_NULL, a freed one NDM_E_CLOSED. Returns the predictor, owned
 *  by `model`, or the null predictor. */
#define ndm_predictor_new(model, net) ndm_predictor_new_at(NDM_HERE, (model), (net))
/** ndm_predictor_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_predictor ndm_predictor_new_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net);
/** Run net on `input` in a request manager (a child of the predictor's
 *  manager, "request", the calling thread's innermost scope while the net
 *  runs, so every intermediate lands in it; emptied before return) and
 *  return the result in
 *  `out` (NDM_OUTPUT_RULE: the innermost scope, else input's manager).
 *  An input on another device than the model manager's is copied to the
 *  model's device first (inside the request), so a CPU request reaches a
 *  GPU model unchanged; the result stays on the model's device (read it with
 *  ndm_item() or ndm_array_copy_out(), or move it with ndm_to()).
 *  Thread-safe: many threads may predict at once. Each thread keeps its
 *  request manager open, empty, between its requests (one per thread and
 *  predictor, closed at the thread's exit or with the model), so a request
 *  takes no lock the other serving threads take; and once as many threads
 *  serve as ndm's compute pool has threads (NDM_NUM_THREADS, by default
 *  the cores), each request's kernels run on its own thread rather than
 *  split across the pool, whose workers would take cores from the other
 *  requests. Returns a new handle, the
 *  caller's to release, or the null handle with the forward pass's error:
 *  errors as for ndm_forward() (NDM_E_CLOSED also for a freed predictor). */
#define ndm_predict(p, input) ndm_predict_to_at(NDM_HERE, NDM_OUTPUT_RULE, (p), (input))
/** ndm_predict() with the result attached to out instead of by the output rule. */
#define ndm_predict_to(out, p, input) ndm_predict_to_at(NDM_HERE, (out), (p), (input))
/** ndm_predict_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_predict_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_predictor p,
                                    ndm_array input);
/** ndm_predict_to(parent, p, input) with the request manager a fresh child
 *  of `parent` (closed before return) instead of the predictor's parked
 *  one, so that the byte limits over `parent` (ndm_manager_set_limit())
 *  cover the forward pass's temporaries as well as the answer: a server
 *  gives each request a manager with a limit, and a request that would not
 *  fit fails alone with NDM_E_QUOTA, its temporaries released, the other
 *  requests going on. Thread-safe as ndm_predict(); a close of the model
 *  while it runs is NDM_E_CLOSED, as for ndm_predict(). Returns a new handle
 *  owned by `parent`, the caller's to release, or the null handle: errors
 *  as for ndm_predict_to(), NDM_E_QUOTA / NDM_E_OOM when the request would
 *  not fit. */
#define ndm_predict_under(parent, p, input)                                     \
    ndm_predict_under_at(NDM_HERE, (parent), (p), (input))
/** ndm_predict_under() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_predict_under_at(NDM_SITE_PARAMS, ndm_manager parent, ndm_predictor p,
                                       ndm_array input);
/** What a predictor's device graphs did (ndm_predictor_get_graph_stats). */
typedef struct ndm_predictor_graph_stats {
    int64_t captured;   /**< request shapes captured as graphs */
    int64_t launched;   /**< requests served by launching a graph */
    int64_t uncaptured; /**< planned requests run uncaptured (each shape's first) */
} ndm_predictor_graph_stats;

/** Serve ndm_predict() requests of up to max_shapes (1..64) input shapes
 *  (dtype and shape) from device graphs (plan.h) on a CUDA model: a
 *  shape's first request runs in a planned manager (recording its plan),
 *  its second is captured as a graph, and every later one copies its
 *  input into the graph's input, launches the graph and copies the answer
 *  out: one launch instead of a kernel launch per operation, the same
 *  answer bit for bit. Other shapes, a request that finds its shape's
 *  graph in use by another thread, inputs on another device, and nets
 *  whose forward pass cannot be captured run as before. The graphs and
 *  their memory live in the predictor's manager. Call it before the
 *  predictor serves (not while other threads predict). NDM_OK; NDM_E_INVALID
 *  (max_shapes out of range, or graphs on already); NDM_E_UNSUPPORTED
 *  (the model is not on a CUDA device); NDM_E_NULL/NDM_E_CLOSED/
 *  NDM_E_INVALID for a bad predictor; NDM_E_OOM. */
#define ndm_predictor_use_graphs(p, max_shapes)                                 \
    ndm_predictor_use_graphs_at(NDM_HERE, (p), (max_shapes))
/** ndm_predictor_use_graphs() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_predictor_use_graphs_at(NDM_SITE_PARAMS, ndm_predictor p,
                                                             int max_shapes);
/** Fill *out with what p's graphs did (zeros without graphs). NDM_OK;
 *  NDM_E_INVALID for a NULL out; errors of a bad predictor. */
#define ndm_predictor_get_graph_stats(p, out)                                   \
    ndm_predictor_get_graph_stats_at(NDM_HERE, (p), (out))
/** ndm_predictor_get_graph_stats() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_predictor_get_graph_stats_at(NDM_SITE_PARAMS,
                                                                  ndm_predictor p,
                                                                  ndm_predictor_graph_stats *out);
/** Load a checkpoint into net (strict, as ndm_module_load()) and make a
 *  predictor of it (as ndm_predictor_new()). For serving, build the net
 *  between ndm_no_grad_begin() and ndm_no_grad_end(): layers made while
 *  gradients are paused get no gradient arrays, so the model holds the
 *  weights once instead of twice. Returns the predictor, owned by `model`,
 *  or the null predictor with ndm_module_load()'s error or errors as for
 *  ndm_predictor_new(). */
#define ndm_predictor_load(model, net, path) ndm_predictor_load_at(NDM_HERE, (model), (net), (path))
/** ndm_predictor_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_predictor ndm_predictor_load_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net,
                                            const char *path);
/** The manager that holds the request managers (for dumps): the
 *  predictor's own, closed with the model, not the caller's to close. The
 *  null manager with NDM_E_NULL, NDM_E_CLOSED or NDM_E_INVALID for a bad
 *  handle. */
NDM_API ndm_manager ndm_predictor_manager(ndm_predictor p);

#ifdef __cplusplus
}
#endif

#endif
