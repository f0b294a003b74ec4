/* ndm arrays: creation, release, accessors and host transfer.
 *
 * An array is a view (dtype, shape, strides, offset) on a refcounted storage
 * on one device; views made by view.h share the storage, which dies with its
 * last view. Shapes are (ndim, const int64_t *shape) pairs with no rank
 * limit; NDM_SHAPE(2, 3) writes one. Strides and offsets count elements.
 *
 * Shapes always come last, so NDM_SHAPE(...) can be passed to any macro:
 *     ndm_full(m, NDM_F32, 0.5, NDM_SHAPE(2, 3))
 *
 * Ownership. Every factory takes the manager that will own the result (the
 * output rule's named manager; NDM_CURRENT_SCOPE means the innermost scope of
 * this thread, NDM_E_NULL when there is none; a null manager is NDM_E_NULL,
 * NDM_OUTPUT_RULE is NDM_E_INVALID) and returns a fresh handle; on failure
 * it returns the null handle and allocates nothing.
 * ndm_array_release frees one handle early; releasing a released array
 * returns NDM_ALREADY.
 *
 * Thread rules: arrays may be read from many threads at once. Writing an
 * array while another thread reads it is a caller bug (the reader may see
 * either value, or a mix). Releasing it, or closing its manager, while
 * another thread's operation reads or writes it is safe: that operation
 * finishes on memory that stays valid, and later ones fail with
 * NDM_E_CLOSED (manager.h).
 */
#ifndef NDM_ARRAY_H
#define NDM_ARRAY_H

#include <stdio.h>

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @name Factories
 *  Each returns a new array owned by m (the caller releases it, or closing
 *  m does), or the null handle with nothing allocated. Errors: NDM_E_SHAPE
 *  (negative dim), NDM_E_OVERFLOW (element or byte count overflows),
 *  NDM_E_DTYPE, NDM_E_NULL/NDM_E_CLOSED/NDM_E_CAPPED/NDM_E_QUOTA for the
 *  manager (NDM_E_INVALID for NDM_OUTPUT_RULE), NDM_E_OOM. */
/** @{ */

/** Uninitialised contents. */
#define ndm_empty(m, dtype, ...) ndm_empty_at(NDM_HERE, (m), (dtype), __VA_ARGS__)
/** ndm_empty() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_empty_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                               const int64_t *shape);
/** Every element 0. */
#define ndm_zeros(m, dtype, ...) ndm_zeros_at(NDM_HERE, (m), (dtype), __VA_ARGS__)
/** ndm_zeros() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_zeros_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                               const int64_t *shape);
/** Every element 1. */
#define ndm_ones(m, dtype, ...) ndm_ones_at(NDM_HERE, (m), (dtype), __VA_ARGS__)
/** ndm_ones() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_ones_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, int ndim,
                              const int64_t *shape);
/** Every element = value, converted to dtype as a cast would. */
#define ndm_full(m, dtype, value, ...) ndm_full_at(NDM_HERE, (m), (dtype), (value), __VA_ARGS__)
/** ndm_full() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_full_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double value,
                              int ndim, const int64_t *shape);
/** A 0-d array holding value. */
#define ndm_scalar(m, dtype, value) ndm_scalar_at(NDM_HERE, (m), (dtype), (value))
/** ndm_scalar() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_scalar_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double value);
/** 1-d: start, start+step, ... while < stop (> stop for a negative step),
 *  numpy's length ceil((stop-start)/step). step 0 is NDM_E_INVALID. */
#define ndm_arange(m, dtype, start, stop, step)                                 \
    ndm_arange_at(NDM_HERE, (m), (dtype), (start), (stop), (step))
/** ndm_arange() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_arange_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double start,
                                double stop, double step);
/** 1-d: num evenly spaced values from start to stop inclusive (num >= 0). */
#define ndm_linspace(m, dtype, start, stop, num)                                \
    ndm_linspace_at(NDM_HERE, (m), (dtype), (start), (stop), (num))
/** ndm_linspace() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_linspace_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, double start,
                                  double stop, int64_t num);
/** A copy of a C-ordered host buffer of prod(shape) elements of dtype. */
#define ndm_from_buffer(m, dtype, src, ...)                                     \
    ndm_from_buffer_at(NDM_HERE, (m), (dtype), (src), __VA_ARGS__)
/** ndm_from_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_from_buffer_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype,
                                     const void *src, int ndim, const int64_t *shape);

/** Called once when the storage of a wrapped buffer dies. */
typedef void (*ndm_free_fn)(void *data, void *ud);
/** An array on the caller's C-ordered buffer on the manager's device,
 *  without a copy. free_fn (may be NULL) runs when its storage dies. On
 *  failure free_fn is NOT called: the caller keeps the buffer. The bytes
 *  count in the manager's accounting but not in the allocator's. */
#define ndm_wrap_buffer(m, dtype, data, free_fn, ud, ...)                       \
    ndm_wrap_buffer_at(NDM_HERE, (m), (dtype), (data), (free_fn), (ud), __VA_ARGS__)
/** ndm_wrap_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_wrap_buffer_at(NDM_SITE_PARAMS, ndm_manager m, ndm_dtype dtype, void *data,
                                     ndm_free_fn free_fn, void *ud, int ndim,
                                     const int64_t *shape);
/** @} */

/** Release one array handle now. Its storage dies with its last view.
 *  NDM_OK; NDM_ALREADY for an array already released (by this call or by a
 *  close); NDM_E_NULL for the null handle, NDM_E_INVALID for a value that
 *  was never an array handle. A second release of an array released by this
 *  call before (not by a close) also goes to the log as a warning naming
 *  where the array was made and both releases. */
#define ndm_array_release(a) ndm_array_release_at(NDM_HERE, (a))
/** ndm_array_release() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_array_release_at(NDM_SITE_PARAMS, ndm_array a);

/** @name Accessors
 *  Each returns what its line says; on a null or stale handle, the value
 *  shown, with the thread's last error set (NDM_E_NULL, NDM_E_CLOSED or
 *  NDM_E_INVALID, as in status.h). They create nothing. */
/** @{ */

/** Is this a live array? (false for null and stale handles; never fails,
 *  sets no error) */
NDM_API bool ndm_array_valid(ndm_array a);
/** Rank, or -1. */
NDM_API int ndm_array_ndim(ndm_array a);
/** Size of one axis (negative axes count from the end), or -1. */
NDM_API int64_t ndm_array_dim(ndm_array a, int axis);
/** Copies ndim sizes into out; returns ndim or a negative status
 *  (NDM_E_INVALID when cap < ndim or out is NULL). */
NDM_API int ndm_array_shape(ndm_array a, int64_t *out, int cap);
/** Copies ndim strides (in elements) into out; returns ndim or a negative
 *  status (NDM_E_INVALID when cap < ndim or out is NULL). */
NDM_API int ndm_array_strides(ndm_array a, int64_t *out, int cap);
/** Offset of the first element in its storage, in elements (-1 on error). */
NDM_API int64_t ndm_array_offset(ndm_array a);
/** Number of elements, or -1. */
NDM_API int64_t ndm_array_size(ndm_array a);
/** Bytes of the elements the view covers (size * itemsize), or 0. */
NDM_API size_t ndm_array_nbytes(ndm_array a);
/** dtype, or NDM_F32 with an error set. */
NDM_API ndm_dtype ndm_array_dtype(ndm_array a);
/** The device of its storage, or NDM_CPU. */
NDM_API ndm_device ndm_array_device(ndm_array a);
/** The owning manager (null for a stale handle): the manager itself, not a
 *  new one for the caller to close. */
NDM_API ndm_manager ndm_array_manager(ndm_array a);
/** Row-major contiguous? */
NDM_API bool ndm_array_is_contiguous(ndm_array a);
/** Do two arrays share storage? */
NDM_API bool ndm_array_shares_storage(ndm_array a, ndm_array b);
/** Address of the first element of a CPU array (NULL with NDM_E_DEVICE for
 *  other devices). Valid while the storage lives; the array keeps owning it. */
NDM_API void *ndm_array_data(ndm_array a);
/** @} */

/** Copy the elements of `a`, in C order, into the caller's host buffer dst
 *  of `nbytes` (which must equal ndm_array_nbytes(a)), for any strides and
 *  device. Returns NDM_OK. Owner: the caller's buffer is filled; `a` and
 *  its manager are unchanged and nothing is allocated that outlives the
 *  call. Errors: NDM_E_INVALID (dst NULL, or nbytes not the array's size),
 *  NDM_E_NULL/NDM_E_CLOSED/NDM_E_INVALID for the handle (status.h),
 *  NDM_E_OOM, NDM_E_DEVICE from the device. */
#define ndm_array_copy_out(a, dst, nbytes) ndm_array_copy_out_at(NDM_HERE, (a), (dst), (nbytes))
/** ndm_array_copy_out() with an explicit call site (the macro passes
 *  NDM_HERE). Returns NDM_OK. Owner: the caller's buffer is filled.
 *  Errors: NDM_E_INVALID, NDM_E_NULL, NDM_E_CLOSED, NDM_E_OOM, NDM_E_DEVICE
 *  as for ndm_array_copy_out(). */
NDM_API NDM_NODISCARD ndm_status ndm_array_copy_out_at(NDM_SITE_PARAMS, ndm_array a, void *dst,
                                                       size_t nbytes);
/** Overwrite the elements of `a`, in C order, from the caller's host buffer
 *  src of `nbytes` (which must equal ndm_array_nbytes(a)). Returns NDM_OK.
 *  Owner: `a` keeps its storage, now holding a copy; src stays the
 *  caller's. Errors: NDM_E_INVALID (src NULL, or nbytes not the
 *  array's size), and the others of ndm_array_copy_out(). */
#define ndm_array_copy_in(a, src, nbytes) ndm_array_copy_in_at(NDM_HERE, (a), (src), (nbytes))
/** ndm_array_copy_in() with an explicit call site (the macro passes
 *  NDM_HERE). Returns NDM_OK. Owner: `a` holds the copy, src stays the
 *  caller's. Errors: NDM_E_INVALID, NDM_E_NULL, NDM_E_CLOSED, NDM_E_OOM,
 *  NDM_E_DEVICE as for ndm_array_copy_in(). */
NDM_API NDM_NODISCARD ndm_status ndm_array_copy_in_at(NDM_SITE_PARAMS, ndm_array a,
                                                      const void *src, size_t nbytes);

/** The value of a one-element array (any rank), converted to double, into
 *  the caller's *out. Returns NDM_OK. Owner: *out is written (nothing is
 *  allocated). Errors: NDM_E_SHAPE (more or fewer than one element),
 *  NDM_E_INVALID (out NULL), NDM_E_NULL/NDM_E_CLOSED/NDM_E_INVALID for the
 *  handle (status.h), NDM_E_DEVICE from the device. */
#define ndm_item(a, out) ndm_item_at(NDM_HERE, (a), (out))
/** ndm_item() with an explicit call site (the macro passes NDM_HERE).
 *  Returns NDM_OK. Owner: the caller's *out is written. Errors:
 *  NDM_E_SHAPE, NDM_E_INVALID, NDM_E_NULL, NDM_E_CLOSED, NDM_E_DEVICE as
 *  for ndm_item(). */
NDM_API NDM_NODISCARD ndm_status ndm_item_at(NDM_SITE_PARAMS, ndm_array a, double *out);
/** ndm_item(), converted to int64 as ndm_astype would (a float truncated
 *  toward zero and clamped, NaN giving 0). Returns NDM_OK.
 *  Owner: the caller's *out is written. Errors: NDM_E_SHAPE, NDM_E_INVALID
 *  and the others of ndm_item(). */
#define ndm_item_i64(a, out) ndm_item_i64_at(NDM_HERE, (a), (out))
/** ndm_item_i64() with an explicit call site (the macro passes NDM_HERE).
 *  Returns NDM_OK. Owner: the caller's *out is written. Errors:
 *  NDM_E_SHAPE, NDM_E_INVALID and the others of ndm_item(). */
NDM_API NDM_NODISCARD ndm_status ndm_item_i64_at(NDM_SITE_PARAMS, ndm_array a, int64_t *out);

/** Print `a` to f as numpy's repr would. It reads
 *  `array([[1., 2.], [3., 4.]], dtype=float32)`, summarised with "..." above
 *  1000 elements. NDM_OK, or NDM_E_INVALID for a NULL f, NDM_E_OOM, or the
 *  device's error reading the elements. */
NDM_API ndm_status ndm_array_print(ndm_array a, FILE *f);
/** The same text into buf (truncated to n, NUL-terminated; buf may be NULL
 *  with n 0 to measure); returns the full length or a negative status:
 *  errors as for ndm_array_print(). */
NDM_API int ndm_array_format(ndm_array a, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
