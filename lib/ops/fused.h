/* Fused operations of the training step, for the autograd rules and the
 * optimizers: one pass where the composed operations take several. */
#ifndef NDM_OPS_FUSED_H
#define NDM_OPS_FUSED_H

#include "../backends/ew.h"
#include "dispatch.h"

/* The gradient of relu at x for the incoming gradient g: g * (x > 0), a new
 * array under the output rule (g's manager or the innermost scope). Bit for
 * bit mul(g, astype(gt_scalar(x, 0), dtype(g))), which it falls back to
 * when the backend has no fused kernel, the layouts or dtypes differ, or
 * recording is on (a gradient of the gradient). Null on failure, with the
 * error recorded. */
ndm_array ndm__relu_grad(ndm_array g, ndm_array x);

/* A linear layer's forward, relu(x @ w^T + b) when `relu`, else x @ w^T + b
 * (b may be the null handle): a new array under the output rule. While
 * recording is off and x (m, k), w (n, k) and b (n) share one float dtype
 * and device, the backend's linear kernel writes it in one pass with no
 * temporaries; otherwise (recording, other shapes or dtypes, a backend
 * without the kernel) the composed matmul, add and relu run, with their
 * errors. Either way the values are the same bit for bit. Null on failure,
 * with the error recorded (api names the caller's operation). */
ndm_array ndm__linear(ndm__site site, const char *api, ndm_array x, ndm_array w, ndm_array b,
                      bool relu);

/* One optimizer step over a parameter with the backend's fused kernel:
 * every array of `a` named by handle (w, g, and m, v where used) must be
 * C-contiguous, of one float dtype and shape on one device, with w, m and v
 * writable and apart from each other and from g. Returns NDM_OK when done,
 * NDM_E_UNSUPPORTED (nothing written, no error recorded) when the caller
 * must run the composed operations instead. The pointers in `a` are filled
 * here. */
ndm_status ndm__optim_fused(ndm__optim_args *a, ndm_array w, ndm_array g, ndm_array m,
                            ndm_array v);

#endif
