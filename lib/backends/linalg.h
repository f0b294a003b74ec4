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
};

extern const struct ndm__backend_linalg ndm__cpu_linalg;
extern const struct ndm__backend_linalg ndm__cpu_ref_linalg;

#endif
