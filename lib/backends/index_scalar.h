/* Per-element index math written once for the CPU kernels (C) and the CUDA
 * kernels (nvcc, host and device code): where a padded coordinate reads. */
#ifndef NDM_BACKENDS_INDEX_SCALAR_H
#define NDM_BACKENDS_INDEX_SCALAR_H

#include <stdint.h>

#include "ndm/index.h"

#ifdef __CUDACC__
#define NDM__SCALAR static __host__ __device__ __forceinline__
#else
#define NDM__SCALAR static inline
#endif

/* Source position of padded coordinate x on an axis of size n (n > 0 for
 * EDGE and REFLECT); -1 for the constant. */
NDM__SCALAR int64_t ndm__pad_source(int64_t x, int64_t n, ndm_pad_mode mode)
{
    if (x >= 0 && x < n)
        return x;
    if (mode == NDM_PAD_CONSTANT)
        return -1;
    if (mode == NDM_PAD_EDGE || n == 1)
        return x < 0 ? 0 : n - 1;
    int64_t p = 2 * (n - 1);
    int64_t m = x % p;
    if (m < 0)
        m += p;
    return m < n ? m : p - m;
}

#undef NDM__SCALAR

#endif
