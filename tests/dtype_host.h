/* Host-side values of every dtype, shared by the numeric suites' helpers
 * (check_numeric.h, ew_testutil.h): the dtype list, an element of a host
 * buffer read as a double, and the comparison with a tolerance. Written
 * here independently of the library's kernels. */
#ifndef NDM_TEST_DTYPE_HOST_H
#define NDM_TEST_DTYPE_HOST_H

#include <math.h>

#include "helpers.h"

static const ndm_dtype all_dtypes[] = {NDM_BOOL, NDM_U8,   NDM_I32, NDM_I64,
                                       NDM_F16,  NDM_BF16, NDM_F32, NDM_F64};
#define N_DTYPES 8

/* The value of element i of a host buffer of dtype t, as a double (exact
 * but for i64 beyond 2^53). */
static inline double host_get(const void *buf, ndm_dtype t, int64_t i)
{
    switch (t) {
    case NDM_BOOL:
    case NDM_U8: return ((const uint8_t *)buf)[i];
    case NDM_I32: return ((const int32_t *)buf)[i];
    case NDM_I64: return (double)((const int64_t *)buf)[i];
    case NDM_F16: return ndm_f16_to_f32(((const uint16_t *)buf)[i]);
    case NDM_BF16: return ndm_bf16_to_f32(((const uint16_t *)buf)[i]);
    case NDM_F32: return ((const float *)buf)[i];
    case NDM_F64: return ((const double *)buf)[i];
    }
    return 0;
}

/* got matches want within atol + rtol * |want|; NaN matches NaN;
 * infinities must be equal. */
static inline bool close_to(double got, double want, double rtol, double atol)
{
    if (want != want)
        return got != got;
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

#endif
