/* The linear algebra family of the backend table: batched matrix products.
 * Dispatchers (lib/ops/linalg.c) promote dtypes and broadcast batch axes. */
#ifndef NDM_BACKEND_LINALG_H
#define NDM_BACKEND_LINALG_H

#include "backend.h"

struct ndm__backend_linalg {
    /* required: c = a @ b for every batch index. a is (..., m, k), b is
     * (..., k, n) and c is (..., m, n), all with the same rank >= 2 and the
     * same batch sizes; a's and b's strides may be 0 (broadcast) or negative.
     * One dtype for all three: f32, f64 or i64 (the dispatcher converts the
     * others; i64 wraps). k may be 0 (c is zeroed). c does not overlap a or b. */
    ndm_status (*matmul)(int device, const ndm__tensor *c, const ndm__tensor *a,
                         const ndm__tensor *b);
    /* optional: a linear layer's forward, y = x @ w^T + b, then relu when
     * `relu`: x is (m, k), w (n, k), b (n) or NULL, y (m, n), one float
     * dtype; y does not overlap the others. Each value must round as
     * matmul, add and relu would in turn. NDM_E_UNSUPPORTED (nothing
     * written) sends the caller to those three operations. Default: them. */
    ndm_status (*linear)(int device, const ndm__tensor *y, const ndm__tensor *x,
                         const ndm__tensor *w, const ndm__tensor *b, bool relu);
};

extern const struct ndm__backend_linalg ndm__cpu_linalg;
extern const struct ndm__backend_linalg ndm__cpu_ref_linalg;

#endif
