/* DLPack export and import: an exported tensor holds a lent alias of the
 * array, an imported one is wrapped storage whose death calls the producer. */
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include <stddef.h>

#include "../base/dtype.h"
#include "../ops/inner.h"
#include "../base/error.h"
#include "ndm/dlpack.h"
#include "ndm/ndm.h"

/* DLPack's bool code (kDLBool), absent from headers before 0.8. */
#define DL_BOOL_CODE 6

static bool dtype_to_dl(ndm_dtype t, DLDataType *out)
{
    static const DLDataType map[NDM_DTYPE_COUNT] = {
        [NDM_BOOL] = {DL_BOOL_CODE, 8, 1}, [NDM_U8] = {kDLUInt, 8, 1},
        [NDM_I32] = {kDLInt, 32, 1},       [NDM_I64] = {kDLInt, 64, 1},
        [NDM_F16] = {kDLFloat, 16, 1},     [NDM_BF16] = {kDLBfloat, 16, 1},
        [NDM_F32] = {kDLFloat, 32, 1},     [NDM_F64] = {kDLFloat, 64, 1},
    };
    if ((unsigned)t >= NDM_DTYPE_COUNT)
        return false;
    *out = map[t];
    return true;
}

static bool dtype_from_dl(DLDataType d, ndm_dtype *out)
{
    for (int t = 0; t < NDM_DTYPE_COUNT; t++) {
        DLDataType m;
        if (dtype_to_dl((ndm_dtype)t, &m) && m.code == d.code && m.bits == d.bits &&
            m.lanes == d.lanes) {
            *out = (ndm_dtype)t;
            return true;
        }
    }
    return false;
}

/* ---- export ---------------------------------------------------------------- */

/* What an exported tensor carries: the lent alias, and room for its shape
 * and strides (DLPack holds pointers to them). */
typedef struct export_ctx {
    ndm_array alias;
    int64_t *dims; /* shape then strides */
} export_ctx;

static void export_free(export_ctx *c)
{
    /* (NDM_ALREADY if it is gone already: nothing else to undo) */
    ndm_status st = ndm_array_release(c->alias);
    (void)st;
    free(c->dims);
    free(c);
}

/* Fill t from `a`'s alias; ctx and t belong to the caller. */
static ndm_status export_fill(ndm__site site, const char *api, ndm_array a, DLTensor *t,
                              export_ctx **out)
{
    ndm__view v;
    if (!ndm__view_of(a, &v, api, site))
        return ndm_last_status();
    const ndm__tensor *r = &v.t;
    ndm_device dev = v.device;
    if (dev.type == NDM_DEVICE_CUDA) {
        /* the consumer may read on any stream: the queued writes must be done */
        ndm_status st = ndm_device_synchronize(dev);
        if (st < 0)
            return ndm__fail(st, api, site, "the device's queued work failed: %s",
                             ndm_last_error());
    }
    export_ctx *c = calloc(1, sizeof *c);
    int nd = r->ndim;
    if (c)
        c->dims = malloc((size_t)(nd ? 2 * nd : 1) * sizeof *c->dims);
    if (!c || !c->dims) {
        if (c)
            free(c);
        return ndm__fail(NDM_E_OOM, api, site, "no memory for a DLPack tensor");
    }
    c->alias = ndm__array_lend(site, api, a);
    if (!c->alias.id) {
        free(c->dims);
        free(c);
        return ndm_last_status();
    }
    /* (the alias is a view with the same shape, strides and offset) */
    memcpy(c->dims, r->shape, (size_t)nd * sizeof *c->dims);
    memcpy(c->dims + nd, r->strides, (size_t)nd * sizeof *c->dims);
    memset(t, 0, sizeof *t);
    t->byte_offset = (uint64_t)v.offset * ndm__dtype_bytes[r->dtype];
    t->data = (char *)r->data - t->byte_offset;
    t->device.device_type = dev.type == NDM_DEVICE_CUDA ? kDLCUDA : kDLCPU;
    t->device.device_id = dev.type == NDM_DEVICE_CUDA ? dev.index : 0;
    t->ndim = nd;
    dtype_to_dl(r->dtype, &t->dtype);
    t->shape = c->dims;
    t->strides = c->dims + nd;
    *out = c;
    return NDM_OK;
}

static void export_delete(DLManagedTensor *t)
{
    if (!t)
        return;
    export_free(t->manager_ctx);
    free(t);
}

/* A zeroed box of `size` bytes (DLManagedTensor or its versioned form)
 * whose DLTensor, `at` bytes in, is filled from a; NULL with the error
 * recorded. The caller sets the box's context to *c and its deleter. */
static void *export_box(ndm__site site, const char *api, ndm_array a, size_t size, size_t at,
                        export_ctx **c)
{
    char *box = calloc(1, size);
    if (!box) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a DLPack tensor");
        return NULL;
    }
    *c = NULL;
    if (export_fill(site, api, a, (DLTensor *)(void *)(box + at), c) < 0) {
        free(box);
        return NULL;
    }
    return box;
}

NDM_API DLManagedTensor *ndm_to_dlpack_at(NDM_SITE_PARAMS, ndm_array a)
{
    export_ctx *c;
    DLManagedTensor *t = export_box(NDM__SITE, "ndm_to_dlpack", a, sizeof *t,
                                    offsetof(DLManagedTensor, dl_tensor), &c);
    if (!t)
        return NULL;
    t->manager_ctx = c;
    t->deleter = export_delete;
    return t;
}

/* ---- import ------------------------------------------------------------------ */

/* The producer's tensor and how to give it back. */
typedef struct import_ctx {
    void *tensor;
    void (*deleter)(void *tensor);
} import_ctx;

static void import_release(void *data, void *ud)
{
    (void)data;
    import_ctx *c = ud;
    if (c->deleter)
        c->deleter(c->tensor);
    free(c);
}

/* Check t against m and wrap it; on failure nothing is adopted. */
static ndm_array import(ndm__site site, const char *api, ndm_manager mh, const DLTensor *t,
                        import_ctx *ctx)
{
    if (!ndm__require_manager(mh, api, site))
        return NDM_NULL_ARRAY;
    ndm_device mdev = ndm_manager_device(mh);
    ndm_device dev;
    char want[32], got[32];
    switch (t->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
        dev = NDM_CPU;
        break;
    case kDLCUDA:
        dev = NDM_CUDA(t->device.device_id);
        if (t->device.device_id < 0 || t->device.device_id >= ndm_cuda_device_count()) {
            int n = ndm_cuda_device_count();
            ndm__fail(n ? NDM_E_DEVICE : NDM_E_UNSUPPORTED, api, site,
                      "the tensor is on CUDA device %d, but %s", (int)t->device.device_id,
                      n ? "there is no such GPU" : "CUDA is not available in this process");
            return NDM_NULL_ARRAY;
        }
        break;
    default:
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "DLPack device type %d is not supported",
                  (int)t->device.device_type);
        return NDM_NULL_ARRAY;
    }
    if (!ndm_device_eq(dev, mdev)) {
        ndm__fail(NDM_E_DEVICE, api, site,
                  "the tensor is on %s but the manager on %s: adopt it into a manager of "
                  "its device",
                  ndm_device_str(dev, got, sizeof got), ndm_device_str(mdev, want, sizeof want));
        return NDM_NULL_ARRAY;
    }
    ndm_dtype dt;
    if (t->dtype.lanes != 1) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "DLPack dtype (code %u, %u bits) has %u lanes: vector lanes are not supported",
                  (unsigned)t->dtype.code, (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
        return NDM_NULL_ARRAY;
    }
    if (!dtype_from_dl(t->dtype, &dt)) {
        ndm__fail(NDM_E_DTYPE, api, site,
                  "DLPack dtype (code %u, %u bits, %u lanes) has no ndm dtype",
                  (unsigned)t->dtype.code, (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
        return NDM_NULL_ARRAY;
    }
    int nd = t->ndim;
    if (nd < 0 || (nd > 0 && !t->shape)) {
        ndm__fail(NDM_E_INVALID, api, site, "bad DLPack shape (ndim %d)", nd);
        return NDM_NULL_ARRAY;
    }
    size_t isz = ndm__dtype_bytes[dt];
    if (t->byte_offset % isz) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "byte_offset %llu is not a multiple of the element size %zu",
                  (unsigned long long)t->byte_offset, isz);
        return NDM_NULL_ARRAY;
    }
    int64_t *strides = malloc((size_t)(nd ? nd : 1) * sizeof *strides);
    if (!strides) {
        ndm__fail(NDM_E_OOM, api, site, "no memory");
        return NDM_NULL_ARRAY;
    }
    /* The extent: the elements from the first to the last one viewed. */
    bool empty = false;
    for (int i = 0; i < nd; i++)
        empty |= t->shape[i] == 0;
    /* The element count must fit too: zero strides view any count of
     * elements in an extent of one, but ndm's sizes are counted in elements. */
    int64_t extent = 1, run = 1, count = 1, nbytes = 0, ebytes = 0;
    ndm_status bad = NDM_OK;
    for (int i = nd - 1; i >= 0 && bad == NDM_OK; i--) {
        int64_t span;
        strides[i] = t->strides ? t->strides[i] : run;
        if (t->shape[i] < 0)
            bad = ndm__fail(NDM_E_SHAPE, api, site, "negative dimension %lld at axis %d",
                            (long long)t->shape[i], i);
        else if (strides[i] < 0)
            bad = ndm__fail(NDM_E_INVALID, api, site,
                            "negative stride %lld at axis %d: make the tensor contiguous first",
                            (long long)strides[i], i);
        else if (!empty && __builtin_mul_overflow(count, t->shape[i], &count))
            bad = ndm__fail(NDM_E_OVERFLOW, api, site,
                            "the tensor's element count overflows at axis %d", i);
        else if (!empty && (__builtin_mul_overflow(t->shape[i] - 1, strides[i], &span) ||
                            __builtin_add_overflow(extent, span, &extent)))
            bad = ndm__fail(NDM_E_OVERFLOW, api, site, "the tensor's extent overflows");
        else if (__builtin_mul_overflow(run, t->shape[i] ? t->shape[i] : 1, &run))
            run = INT64_MAX;
    }
    /* An empty tensor's other sizes must fit as a new array's would: ndm
     * multiplies them in order (its strides and element count). */
    if (bad == NDM_OK && empty)
        bad = ndm__shape_check(nd, t->shape, dt, NULL, NULL, api, site);
    if (empty)
        extent = 0;
    if (bad == NDM_OK && (__builtin_mul_overflow(count, (int64_t)isz, &nbytes) ||
                          __builtin_mul_overflow(extent, (int64_t)isz, &ebytes)))
        bad = ndm__fail(NDM_E_OVERFLOW, api, site, "the tensor's size in bytes overflows");
    if (bad == NDM_OK && !t->data && extent)
        bad = ndm__fail(NDM_E_INVALID, api, site, "the tensor's data pointer is NULL");
    /* The viewed bytes must lie inside the address space: an offset or an
     * extent that wraps it would point below the producer's buffer. */
    uintptr_t first = 0, last = 0;
    if (bad == NDM_OK && extent &&
        ((uint64_t)(uintptr_t)t->byte_offset != t->byte_offset ||
         __builtin_add_overflow((uintptr_t)t->data, (uintptr_t)t->byte_offset, &first) ||
         __builtin_add_overflow(first, (uintptr_t)ebytes - 1, &last)))
        bad = ndm__fail(NDM_E_INVALID, api, site,
                        "byte_offset %llu past data %p wraps the address space",
                        (unsigned long long)t->byte_offset, t->data);
    /* ndm's kernels load whole elements: the first must be aligned to its size */
    if (bad == NDM_OK && extent && first % isz)
        bad = ndm__fail(NDM_E_INVALID, api, site,
                        "data %p + byte_offset %llu is not aligned to the element size %zu",
                        t->data, (unsigned long long)t->byte_offset, isz);
    if (bad < 0) {
        free(strides);
        return NDM_NULL_ARRAY;
    }
    /* (in integers: an empty tensor's offset is not checked, and pointer
     * arithmetic past its object would be undefined) */
    char *base = (char *)(uintptr_t)((uintptr_t)t->data + (uintptr_t)t->byte_offset);
    bool plain = ndm__is_contiguous(nd, t->shape, strides);
    ndm_array a;
    if (plain) {
        a = ndm__array_wrap(site, api, mh, dt, nd, t->shape, base, import_release, ctx);
    } else {
        /* strided: wrap the extent, view it with the tensor's strides, and let
         * the view hold the storage */
        ndm_array flat =
            ndm__array_wrap(site, api, mh, dt, 1, &extent, base, import_release, ctx);
        a = flat.id ? ndm__array_strided_view(site, api, mh, flat, dt, nd, t->shape, strides, 0)
                    : NDM_NULL_ARRAY;
        if (flat.id && !a.id) {
            /* the wrap took the tensor: give it back untouched */
            ndm__array_disown(flat);
            ndm_status st = ndm_array_release(flat);
            (void)st;
        } else if (flat.id) {
            ndm_status st = ndm_array_release(flat);
            (void)st;
        }
    }
    free(strides);
    return a;
}

/* import() with the producer's tensor t, given back by `del`, adopted on
 * success and left to the caller on failure. */
static ndm_array import_owned(ndm__site site, const char *api, ndm_manager m, const DLTensor *dl,
                              void *t, void (*del)(void *))
{
    import_ctx *c = malloc(sizeof *c);
    if (!c) {
        ndm__fail(NDM_E_OOM, api, site, "no memory");
        return NDM_NULL_ARRAY;
    }
    *c = (import_ctx){t, del};
    ndm_array a = import(site, api, m, dl, c);
    if (!a.id)
        free(c);
    return a;
}

static void unversioned_delete(void *t)
{
    DLManagedTensor *mt = t;
    if (mt->deleter)
        mt->deleter(mt);
}

NDM_API ndm_array ndm_from_dlpack_at(NDM_SITE_PARAMS, ndm_manager m, DLManagedTensor *t)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_from_dlpack";
    if (!t) {
        ndm__fail(NDM_E_NULL, api, site, "the tensor is NULL");
        return NDM_NULL_ARRAY;
    }
    return import_owned(site, api, m, &t->dl_tensor, t, unversioned_delete);
}

/* ---- DLPack 1.0: versioned tensors ---------------------------------------------- */

#ifdef DLPACK_MAJOR_VERSION

typedef struct versioned_box {
    DLManagedTensorVersioned t;
} versioned_box;

static void versioned_export_delete(DLManagedTensorVersioned *t)
{
    if (!t)
        return;
    export_free(t->manager_ctx);
    free(t);
}

NDM_API DLManagedTensorVersioned *ndm_to_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_array a)
{
    export_ctx *c;
    DLManagedTensorVersioned *t = export_box(NDM__SITE, "ndm_to_dlpack_versioned", a, sizeof *t,
                                             offsetof(DLManagedTensorVersioned, dl_tensor), &c);
    if (!t)
        return NULL;
    t->version.major = DLPACK_MAJOR_VERSION;
    t->version.minor = DLPACK_MINOR_VERSION;
    t->manager_ctx = c;
    t->deleter = versioned_export_delete;
    t->flags = 0;
    return t;
}

static void versioned_delete(void *t)
{
    DLManagedTensorVersioned *mt = t;
    if (mt->deleter)
        mt->deleter(mt);
}

NDM_API ndm_array ndm_from_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_manager m,
                                               DLManagedTensorVersioned *t)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_from_dlpack_versioned";
    if (!t) {
        ndm__fail(NDM_E_NULL, api, site, "the tensor is NULL");
        return NDM_NULL_ARRAY;
    }
    if (t->version.major != DLPACK_MAJOR_VERSION) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "DLPack major version %u (ndm reads %u)",
                  (unsigned)t->version.major, (unsigned)DLPACK_MAJOR_VERSION);
        return NDM_NULL_ARRAY;
    }
    if (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
        ndm__fail(NDM_E_INVALID, api, site, "the tensor is read-only; ndm arrays are writable");
        return NDM_NULL_ARRAY;
    }
    return import_owned(site, api, m, &t->dl_tensor, t, versioned_delete);
}

#else /* a DLPack header before 1.0: the versioned struct does not exist */

NDM_API struct DLManagedTensorVersioned *ndm_to_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_array a)
{
    (void)a;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_to_dlpack_versioned", NDM__SITE,
              "built against DLPack %d.%d, which has no versioned tensors (1.0 has)",
              DLPACK_VERSION / 100, DLPACK_VERSION % 100 / 10);
    return NULL;
}

NDM_API ndm_array ndm_from_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_manager m,
                                               struct DLManagedTensorVersioned *t)
{
    (void)m;
    (void)t;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_from_dlpack_versioned", NDM__SITE,
              "built against DLPack %d.%d, which has no versioned tensors (1.0 has)",
              DLPACK_VERSION / 100, DLPACK_VERSION % 100 / 10);
    return NDM_NULL_ARRAY;
}

#endif
