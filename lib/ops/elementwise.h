/* Private helpers of the elementwise dispatchers: dtype kinds and rules,
 * scratch shapes, the elementwise backend, and in-place safety checks. */
#ifndef NDM_OPS_ELEMENTWISE_H
#define NDM_OPS_ELEMENTWISE_H

#include <math.h>
#include <stdlib.h>

#include "../backends/ew.h"
#include "broadcast.h"
#include "dispatch.h"
#include "supports.h"

/* Kinds order the dtypes for in-place writes: a result may be stored into
 * an array of the same or a higher kind (numpy's same_kind casting). */
enum { NDM__KIND_BOOL = 0, NDM__KIND_INT = 1, NDM__KIND_FLOAT = 2 };
static inline int ndm__ew_kind(ndm_dtype t)
{
    return t == NDM_BOOL ? NDM__KIND_BOOL : ndm_dtype_is_float(t) ? NDM__KIND_FLOAT : NDM__KIND_INT;
}

/* The dtype arithmetic runs in for results of dtype t: f16 and bf16 compute
 * in f32 and are stored back. */
static inline ndm_dtype ndm__ew_compute(ndm_dtype t)
{
    return t == NDM_F16 || t == NDM_BF16 ? NDM_F32 : t;
}

/* The kernel view of an array (ndm__tensor_of without the call for the
 * element size: small operations count every call). */
static inline ndm__tensor ndm__ew_tensor(const ndm__array *r)
{
    char *p = (char *)r->storage->data + r->offset * (int64_t)ndm__ew_esize(r->dtype);
    return (ndm__tensor){p, r->dtype, r->ndim, r->shape, r->strides};
}
static inline void *ndm__ew_ptr(const ndm__array *r)
{
    return (char *)r->storage->data + r->offset * (int64_t)ndm__ew_esize(r->dtype);
}

/* The status of an in-place call whose handle h did not resolve: the one
 * the failed lookup left as the thread's last (for a null handle, the first
 * error of a failed chain, else NDM_E_NULL). */
static inline ndm_status ndm__ew_lookup_failed(ndm_array h)
{
    (void)h;
    return ndm_last_status();
}

/* Shape and strides scratch: on the stack for common ranks. */
#define NDM__EW_SMALL 8
typedef struct ndm__ew_dims {
    int64_t small[4 * NDM__EW_SMALL];
    int64_t *heap;
    int64_t *shape, *s0, *s1, *s2; /* the shape and up to three stride rows */
} ndm__ew_dims;

/* false (and NDM_E_OOM recorded) when a large rank finds no memory. */
bool ndm__ew_dims_get(ndm__ew_dims *d, int ndim, const char *api, const ndm__site *site);
static inline void ndm__ew_dims_put(ndm__ew_dims *d)
{
    if (d->heap)
        free(d->heap);
}

/* The hot checks are inline; their error reports are not. Sites are passed
 * by pointer: a small operation pays for every copy. */
const ndm__backend_ew *ndm__ew_no_backend(ndm_device dev, const char *api, const ndm__site *site);
ndm_status ndm__ew_device_mismatch(const ndm__array *a, const ndm__array *b, const char *api,
                                   const ndm__site *site);
ndm_status ndm__ew_not_writable(const ndm__array *dst, int axis, const char *api,
                                const ndm__site *site);

/* The elementwise family of the device's backend, or NULL (error recorded). */
static inline const ndm__backend_ew *ndm__ew_backend(ndm_device dev, int *index, const char *api,
                                                     const ndm__site *site)
{
    const ndm__backend *b = ndm__backend_for(dev.type);
    *index = dev.index;
    if (NDM__LIKELY(b && b->ew))
        return b->ew;
    return ndm__ew_no_backend(dev, api, site);
}

/* A dispatcher's general path, kept out of the fast one's frame. */
#if defined(__GNUC__)
#define NDM__EW_NOINLINE __attribute__((noinline))
#else
#define NDM__EW_NOINLINE
#endif

/* Where an elementwise operation runs: the device of its first input and
 * that device's elementwise table (every dispatcher finds it so). */
typedef struct ndm__ew_target {
    ndm_device dev;
    int index;
    const ndm__backend_ew *ew;
} ndm__ew_target;

/* The target of an operation on r; false with NDM_E_UNSUPPORTED recorded. */
static inline bool ndm__ew_target_of(const ndm__array *r, ndm__ew_target *t, const char *api,
                                     const ndm__site *site)
{
    t->dev = r->storage->device;
    t->ew = ndm__ew_backend(t->dev, &t->index, api, site);
    return t->ew != NULL;
}
/* The same, recording nothing (a fast path that falls back on false). */
static inline bool ndm__ew_target_quiet(const ndm__array *r, ndm__ew_target *t)
{
    t->dev = r->storage->device;
    t->index = t->dev.index;
    const ndm__backend *b = ndm__backend_for_inline(t->dev.type);
    t->ew = b ? b->ew : NULL;
    return t->ew != NULL;
}

/* The result of a general path: a's shape, dtype rt, on a's device (its
 * target in *tg), in the manager of the output rule (out); the null handle
 * with the error recorded when none can be made. */
static inline ndm_array ndm__ew_new_like(ndm__array *a, ndm_dtype rt, ndm_manager out,
                                         ndm__ew_target *tg, ndm__array **o, const char *api,
                                         const ndm__site *site)
{
    if (!ndm__ew_target_of(a, tg, api, site))
        return NDM_NULL_ARRAY;
    ndm__manager *m = ndm__output_record(out, a, api, site);
    return m ? ndm__array_new_in(site, api, m, tg->dev, rt, a->ndim, a->shape, o)
             : NDM_NULL_ARRAY;
}

/* ndm__ew_new_like for the operation `name` (enum value op) on a alone, once
 * a's device has not declined it (the failure recorded then). */
static inline ndm_array ndm__ew_new_for(ndm__array *a, int op, const char *name, ndm_dtype rt,
                                        ndm_manager out, ndm__ew_target *tg, ndm__array **o,
                                        const char *api, const ndm__site *site)
{
    if (NDM__DEVICE_DECLINES(a->storage->device, api, *site, NDM__OPS_EW, op, name,
                             ndm__layout_of(a), 1, {a->dtype}))
        return NDM_NULL_ARRAY;
    return ndm__ew_new_like(a, rt, out, tg, o, api, site);
}

/* The element count when r is C-contiguous, else -1. */
static inline int64_t ndm__ew_c_count(const ndm__array *r)
{
    int64_t n = 1;
    for (int i = r->ndim - 1; i >= 0; i--) {
        if (r->shape[i] != 1 && r->strides[i] != n)
            return -1;
        n *= r->shape[i];
    }
    return n;
}

static inline bool ndm__ew_same_device_quiet(const ndm__array *a, const ndm__array *b)
{
    ndm_device da = a->storage->device, db = b->storage->device;
    return da.type == db.type && da.index == db.index;
}

/* NDM_E_DEVICE unless both arrays live on the same device. */
static inline ndm_status ndm__ew_same_device(const ndm__array *a, const ndm__array *b,
                                             const char *api, const ndm__site *site)
{
    if (NDM__LIKELY(ndm__ew_same_device_quiet(a, b)))
        return NDM_OK;
    return ndm__ew_device_mismatch(a, b, api, site);
}

/* A destination written in place must not have elements that share memory
 * (a broadcast view): NDM_E_INVALID naming it. */
static inline ndm_status ndm__ew_check_writable(const ndm__array *dst, const char *api,
                                                const ndm__site *site)
{
    for (int i = 0; i < dst->ndim; i++)
        if (NDM__UNLIKELY(dst->strides[i] == 0 && dst->shape[i] > 1))
            return ndm__ew_not_writable(dst, i, api, site);
    return NDM_OK;
}

/* ndm_result_type through a table filled on first use. */
ndm_dtype ndm__ew_promote(ndm_dtype a, ndm_dtype b);

/* Scratch storage for an input that overlaps the destination of an in-place
 * write: a raw block from the allocator, owned by no manager, freed before
 * the call returns (in-place operations create no arrays, even inside a
 * capped manager). */
typedef struct ndm__ew_scratch {
    ndm__block block;
    ndm_device device;
    ndm__tensor t;
} ndm__ew_scratch;

/* When `in` (seen through `view`, its broadcast strides) shares memory with
 * `dst` other than element for element, copy it into scratch and point
 * *view at the copy. NDM_OK when nothing was needed. */
ndm_status ndm__ew_unalias(const ndm__array *dst, const ndm__array *in, ndm__tensor *view,
                           ndm__ew_scratch *scratch, const char *api, const ndm__site *site);
void ndm__ew_scratch_free(ndm__ew_scratch *scratch);

/* The weak-scalar rules: a C double joins an array operation the way a
 * Python number joins a numpy array (NEP 50). */
static inline bool ndm__ew_integral(double s) { return isfinite(s) && floor(s) == s; }
/* Does s lie in the range of integer dtype t? */
bool ndm__ew_fits(double s, ndm_dtype t);
/* Convert s into one value of computation dtype ct (into buf, 8 bytes):
 * floats go through `via` first (the array's dtype, so that f16 arrays
 * compare with the f16 value of the scalar); integers saturate. */
void ndm__ew_scalar_value(double s, ndm_dtype via, ndm_dtype ct, void *buf);

#endif
