/* Strided iteration for CPU kernels: dimensions are coalesced, then a row
 * function runs once per innermost row (never once per element). */
#ifndef NDM_CPU_ITER_H
#define NDM_CPU_ITER_H

#include <stddef.h>
#include <stdint.h>

#include "ndm/status.h"

#define NDM__ITER_MAX_OPERANDS 4

/* A row function: n elements, operand k at p[k] advancing by s[k] elements. */
typedef void (*ndm__row_fn)(void *ctx, char *const *p, const int64_t *s, int64_t n);

/* Run `row` over every row of an iteration of `nops` operands that share
 * `shape`; strides[k] are operand k's element strides and esize[k] its
 * element size. Dimensions are reordered so the innermost row is the
 * longest unit-stride run of operand 0 when strides allow. NDM_E_OOM if the
 * rank is large and scratch memory cannot be had. */
ndm_status ndm__cpu_iterate(int ndim, const int64_t *shape, int nops, char *const *data,
                            const int64_t *const *strides, const size_t *esize, ndm__row_fn row,
                            void *ctx);

#endif
