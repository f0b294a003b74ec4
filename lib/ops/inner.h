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
#include "../backends/ew.h" /* ndm__optim_args, for the fused optimizer step */
#include "../base/error.h"
#include "../base/limits.h"


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
    int64_t offset;      /* of the first element from the storage's start (elements) */
} ndm__view;

/* The view of live array a into *v: true, or false with the error recorded
 * (null, stale or forged handle; api and site name the caller). */
bool ndm__view_of(ndm_array a, ndm__view *v, const char *api, ndm__site site);
/* The same for an operation's input: the null handle a failed operation
 * returned keeps that operation's error. */
bool ndm__view_input(ndm_array a, ndm__view *v, const char *api, ndm__site site);
/* The same without an error: false when a is not a live array. */
bool ndm__view_peek(ndm_array a, ndm__view *v);

/* A new array of fresh, uninitialised storage in manager m, on *dev (NULL:
 * m's device), with its view in *v when v is not NULL. The null handle on
 * failure, with the error recorded. */
ndm_array ndm__array_make(ndm__site site, const char *api, ndm_manager m, const ndm_device *dev,
                          ndm_dtype dtype, int ndim, const int64_t *shape, ndm__view *v);

/* Is m a live manager? false with the error recorded (null, stale, forged). */
bool ndm__require_manager(ndm_manager m, const char *api, ndm__site site);

/* m itself, or the innermost scope's handle for NDM_CURRENT_SCOPE; the null
 * handle with the error recorded when m is not a live manager. */
ndm_manager ndm__resolve_manager(ndm_manager m, const char *api, ndm__site site);
/* Is m closed, or closing (on any thread)? */
bool ndm__manager_gone(ndm_manager m);
/* A scope that stays open on its thread between uses (a server's request
 * scope): the thread's parked scope under parent, pushed, or a new one
 * (ndm_scope_begin's terms); and its end: its arrays released, popped and
 * parked for the thread's next use under parent (lib/manager/scope.c; the
 * same declarations as core.h's, which inner.c sees both of). */
ndm_manager ndm__scope_reuse(ndm__site site, ndm_manager parent, const char *name);
ndm_status ndm__scope_park(ndm__site site, ndm_manager parent, ndm_manager s);

/* An array wrapping caller memory (ndm_array_wrap's terms), in manager m. */
ndm_array ndm__array_wrap(ndm__site site, const char *api, ndm_manager m, ndm_dtype dtype,
                          int ndim, const int64_t *shape, void *data, ndm_free_fn free_fn,
                          void *ud);
/* A view of base's storage in manager m (dtype, shape, strides in elements,
 * offset from base's first element); base may be released after. */
ndm_array ndm__array_strided_view(ndm__site site, const char *api, ndm_manager m, ndm_array base,
                                  ndm_dtype dtype, int ndim, const int64_t *shape,
                                  const int64_t *strides, int64_t offset);
/* An alias of a under the detached node, lent by a's manager (an export). */
ndm_array ndm__array_lend(ndm__site site, const char *api, ndm_array a);
/* Forget how wrapped array a frees its memory (an import given back). */
void ndm__array_disown(ndm_array a);
/* Release a half-made result on an error path, keeping the error message. */
void ndm__discard(ndm_array a);

/* The output rule (the manager named, else the innermost scope, else the
 * manager of `first`, an operation's first input): null with the error
 * recorded when none applies. */
ndm_manager ndm__output_for(ndm_manager named, ndm_array first, const char *api, ndm__site site);
/* Resolve a factory's manager: the one given, NDM_CURRENT_SCOPE resolved,
 * the null handle and NDM_OUTPUT_RULE refused (null returned, error recorded). */
ndm_manager ndm__factory_manager(ndm_manager m, const char *api, ndm__site where);

/* ---- fused paths --------------------------------------------------------------- */

/* RMS normalisation of x over its last axis (times w unless null) in one
 * kernel, where x's device has one and the operands fit it (f32 or f64, C
 * contiguous, w of x's dtype), recorded as one autograd node: true with
 * the result in *res (null on failure, the error recorded); false when the
 * fused path does not apply, nothing done (the caller composes). The
 * inputs are live arrays the caller has checked. */
bool ndm__rms_norm_fused(ndm__site site, const char *api, ndm_manager out, ndm_array x,
                         ndm_array w, double eps, ndm_array *res);

/* ---- shapes ---------------------------------------------------------------------- */

/* Checks a shape: ndim >= 0, dims >= 0, element and byte counts fit. */
ndm_status ndm__shape_check(int ndim, const int64_t *shape, ndm_dtype dtype, int64_t *numel,
                            size_t *nbytes, const char *api, ndm__site where);
/* The element count of a valid shape. */
static inline int64_t ndm__shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}
/* "f32[2,3]", for messages; returns buf. */
const char *ndm__shape_desc(ndm_dtype dtype, int ndim, const int64_t *shape, char *buf, size_t n);
static inline const char *ndm__view_desc(const ndm__view *v, char *buf, size_t n)
{
    return ndm__shape_desc(v->t.dtype, v->t.ndim, v->t.shape, buf, n);
}
/* Axis `axis` of a rank-ndim array normalised into *out (negative counts
 * from the end; `insert`: one more place, for a new axis), or an error. */
ndm_status ndm__axis(int axis, int ndim, bool insert, int *out, const char *api, ndm__site where);
/* C-order strides of shape (elements), and whether strides are those. */
void ndm__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
bool ndm__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides);

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
/* Every element of dst, on device dev, = value converted as a copy would. */
ndm_status ndm__device_fill(ndm_device dev, const ndm__tensor *dst, double value, const char *api,
                            ndm__site site);

/* The slot of manager m, as the allocator's tag for memory charged to it. */
uint32_t ndm__owner_slot(ndm_manager m);

/* The first element of integer array v outside [lo, hi), by the index
 * family of its device: *pos its C-order position (-1: none) and *value
 * its value. A failed kernel is an error recorded. */
ndm_status ndm__find_outside(const ndm__view *v, int64_t lo, int64_t hi, int64_t *pos,
                             int64_t *value, const char *api, ndm__site site);

/* A linear layer's forward, relu(x @ w^T + b) when `relu`, else x @ w^T + b
 * (b may be the null handle), fused where the backend can (fused.h says
 * when): a new array under the output rule, or null with the error. */
ndm_array ndm__linear(ndm__site site, const char *api, ndm_array x, ndm_array w, ndm_array b,
                      bool relu);
/* One optimizer step over a parameter by the backend's fused kernel
 * (fused.h, where it is defined, says when): NDM_OK when done,
 * NDM_E_UNSUPPORTED (nothing written, no error) when the caller must run
 * the composed operations instead. */
ndm_status ndm__optim_fused(ndm__optim_args *a, ndm_array w, ndm_array g, ndm_array m,
                            ndm_array v);

/* The collectives of device type `type`'s backend, or NULL: then *missing
 * (when not NULL) is why the backend itself is unavailable, or NULL when
 * it is there without collectives. */
const ndm__backend_collective *ndm__collectives(ndm_device_type type, const char **missing);

/* The number of threads compute kernels run on now (>= 1). */
int ndm__compute_threads(void);
/* Mark the calling thread as a serving thread: once as many serve as the
 * compute pool has threads, their kernels run on the thread itself, not
 * split across the pool (lib/backends/cpu/parallel.h). */
void ndm__compute_serving(void);

/* The calling thread, one of the library's own beside the compute (a
 * loader's worker), runs its kernels inline from now on, never taking the
 * compute pool. */
void ndm__compute_pool_avoid(void);

/* Is autograd recording paused on this thread (ndm_no_grad_begin, or an
 * operation built from others)? */
bool ndm__ag_paused(void);

#endif
