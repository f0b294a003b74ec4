/* Private interface of the GEMM provider glue (gemm_provider.c) to ndm's
 * GEMM driver (gemm.c); ndm__gemm_uses_provider in gemm.h is its other half. */
#ifndef NDM_CPU_GEMM_PROVIDER_H
#define NDM_CPU_GEMM_PROVIDER_H

#include <stdbool.h>
#include <stdint.h>

#include "ndm/dtype.h"

/* C (m x n) = A @ B (plus C when acc), f32 or f64, by the build's provider:
 * 1 when it did the product, 0 when it cannot take these operands (or the
 * build has none), or a negative status (NDM_E_OOM when a layout it cannot
 * read could not be copied). Strides as ndm__cpu_gemm's. Defined only in
 * builds with a provider. */
int ndm__gemm_provider_run(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                           void *c, int64_t rsc, int64_t csc, bool acc);

#endif
