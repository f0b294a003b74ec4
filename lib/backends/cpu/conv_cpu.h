/* Shared by the CPU convolution and pooling kernels (conv_ref.c, conv.c). */
#ifndef NDM_CPU_CONV_CPU_H
#define NDM_CPU_CONV_CPU_H

#include "../nn.h"

/* The input rows (or columns) [*lo, *hi) under output position o of a
 * pooling window, clipped to the input's size. */
static inline void pool_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size,
                             int64_t *lo, int64_t *hi)
{
    int64_t s = o * stride - pad;
    *hi = s + k < size ? s + k : size;
    *lo = s > 0 ? s : 0;
}

/* Pooling of planes [begin, end) (sample x channel) of x into y, one plane
 * at a time by the reference loops; the fast kernel runs it on the planes
 * it has no special kernel for. */
void ndm__cpu_pool_planes(const ndm__tensor *y, const ndm__tensor *x, const ndm__pool2d_geom *g,
                          int64_t begin, int64_t end);

#endif
