/* numpy broadcasting for dispatchers. */
#ifndef NDM_OPS_BROADCAST_H
#define NDM_OPS_BROADCAST_H

#include "../manager/core.h"

/* The broadcast shape of n arrays (numpy rules: align trailing axes; sizes
 * must match or be 1). `out` must hold max rank entries; *out_ndim gets the
 * rank. NDM_E_SHAPE with a message naming both shapes on mismatch. */
ndm_status ndm__broadcast_shape(int n, ndm__array *const *in, int64_t *out, int *out_ndim,
                                const char *api, ndm__site where);

/* Strides that read `r` as if it had shape (ndim, shape): leading and
 * size-1 axes get stride 0. `shape` must be a broadcast of r's shape. */
void ndm__broadcast_strides(const ndm__array *r, int ndim, const int64_t *shape, int64_t *strides);

/* Highest rank among n arrays. */
int ndm__max_ndim(int n, ndm__array *const *in);

#endif
