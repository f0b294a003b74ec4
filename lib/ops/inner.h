/* The inner interface: all that the layers above ops (io, nn, dist, interop)
 * use of arrays besides the public API. A tensor view of an array as kernels
 * see it, creation on a device, the one host<->device transfer path (through
 * the device's pinned pool), and the compute thread count. It names no
 * record of the manager and no backend table: those stay below it.
 * Thread rules: those of the arrays named (a view is valid while its array
 * lives and nothing reshapes it in place). */
#ifndef NDM_OPS_INNER_H
#define NDM_OPS_INNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ndm/array.h"
#include "ndm/device.h"
#include "ndm/dtype.h"
#include "ndm/manager.h"
#include "ndm/status.h"
#include "../backends/backend.h"
#include "../base/error.h"

/* An array as a kernel sees it: t.data is the address of its first element
 * (a device address off the CPU), t.shape and t.strides (in elements) point
 * into the array's record. */
typedef struct ndm__view {
    ndm__tensor t;
    ndm_device device;
    int64_t numel;
    size_t nbytes;       /* numel * the dtype's size */
    bool contiguous;     /* C order, no gaps */
    ndm_manager owner;
} ndm__view;

/* The view of live array a into *v: true, or false with the error recorded
 * (null, stale or forged handle; api and site name the caller). */
bool ndm__view_of(ndm_array a, ndm__view *v, const char *api, ndm__site site);
/* The same without an error: false when a is not a live array. */
bool ndm__view_peek(ndm_array a, ndm__view *v);

/* A new array of fresh, uninitialised storage in manager m, on *dev (NULL:
 * m's device), with its view in *v when v is not NULL. The null handle on
 * failure, with the error recorded. */
ndm_array ndm__array_make(ndm__site site, const char *api, ndm_manager m, const ndm_device *dev,
                          ndm_dtype dtype, int ndim, const int64_t *shape, ndm__view *v);

/* ---- the one transfer path ------------------------------------------------------
 * Host buffers to and from any array, whatever its device: on the CPU a copy,
 * elsewhere the backend's upload or download, staged through the device's
 * pinned pool when it has one (no driver bounce) and through a contiguous
 * device temporary for a strided array. Each returns when the bytes have
 * arrived; errors are recorded with api and site. */

/* All elements of v's array in C order to host dst (nbytes exactly). */
ndm_status ndm__view_to_host(const ndm__view *v, void *dst, size_t nbytes, const char *api,
                             ndm__site site);
/* All elements of v's array, in C order, from host src (nbytes exactly). */
ndm_status ndm__view_from_host(const ndm__view *v, const void *src, size_t nbytes,
                               const char *api, ndm__site site);
/* Bytes [off, off + n) of contiguous v's data to or from host memory. */
ndm_status ndm__range_to_host(const ndm__view *v, size_t off, void *dst, size_t n,
                              const char *api, ndm__site site);
ndm_status ndm__range_from_host(const ndm__view *v, size_t off, const void *src, size_t n,
                                const char *api, ndm__site site);
/* A strided copy with dtype conversion between two host tensors of one
 * shape (dst's elements apart from each other and from src's). */
ndm_status ndm__host_copy(const ndm__tensor *dst, const ndm__tensor *src, const char *api,
                          ndm__site site);
/* The same between two tensors on device dev, by its backend's copy. */
ndm_status ndm__device_copy(ndm_device dev, const ndm__tensor *dst, const ndm__tensor *src,
                            const char *api, ndm__site site);

/* C-order strides of shape (elements), and whether strides are those. */
void ndm__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
bool ndm__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides);

/* The number of threads compute kernels run on now (>= 1). */
int ndm__compute_threads(void);

/* Is autograd recording paused on this thread (ndm_no_grad_begin, or an
 * operation built from others)? */
bool ndm__ag_paused(void);

#endif
