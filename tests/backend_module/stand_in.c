/* A backend module for the registry suite: one "CUDA" device whose memory is
 * host memory; it declines f16 (supports) and runs f32 and f64 only. */
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"

static const ndm__host_api *host;

static ndm_status fail(ndm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = host->vfail(st, fmt, ap);
    va_end(ap);
    return st;
}

static int count(void) { return 1; }

static ndm_status props(int device, ndm__device_props *out)
{
    if (device != 0)
        return fail(NDM_E_DEVICE, "stand-in:%d does not exist", device);
    strcpy(out->name, "stand-in");
    out->memory_bytes = 1u << 30;
    out->cc_major = 9;
    out->cc_minor = 0;
    return NDM_OK;
}

static bool supports(int device, const ndm__op_case *c)
{
    (void)device;
    for (int i = 0; i < c->ndtypes; i++)
        if (c->dtypes[i] == NDM_F16)
            return false;
    return true;
}

/* Element `i` (row-major over the shape) of t, as a double. */
static char *element(const ndm__tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    return (char *)t->data + off * (int64_t)host->dtype_size(t->dtype);
}

static int64_t numel(const ndm__tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static double get(const ndm__tensor *t, int64_t i)
{
    char *p = element(t, i);
    return t->dtype == NDM_F32 ? *(float *)p : *(double *)p;
}

static void put(const ndm__tensor *t, int64_t i, double v)
{
    char *p = element(t, i);
    if (t->dtype == NDM_F32)
        *(float *)p = (float)v;
    else
        *(double *)p = v;
}

static ndm_status float_only(const ndm__tensor *t)
{
    if (t->dtype == NDM_F32 || t->dtype == NDM_F64)
        return NDM_OK;
    return fail(NDM_E_UNSUPPORTED, "stand-in: dtype %d", (int)t->dtype);
}

static ndm_status copy(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    ndm_status st = float_only(dst);
    if (st < 0 || (st = float_only(src)) < 0)
        return st;
    for (int64_t i = 0, n = numel(dst); i < n; i++)
        put(dst, i, get(src, i));
    return NDM_OK;
}

static ndm_status fill(int device, const ndm__tensor *dst, double value)
{
    ndm_status st = float_only(dst);
    for (int64_t i = 0, n = numel(dst); st == NDM_OK && i < n; i++)
        put(dst, i, value);
    return st;
}

static ndm_status iota(int device, const ndm__tensor *dst, double start, double step)
{
    ndm_status st = float_only(dst);
    for (int64_t i = 0, n = numel(dst); st == NDM_OK && i < n; i++)
        put(dst, i, start + (double)i * step);
    return st;
}

static ndm_status move(int device, void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    return NDM_OK;
}

static ndm_status map(void *ctx, size_t size, void **out)
{
    *out = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    return *out ? NDM_OK : fail(NDM_E_OOM, "stand-in: no memory for %zu bytes", size);
}

static void unmap(void *ctx, void *ptr, size_t size) { free(ptr); }

static const ndm__segment_source source = {.name = "stand-in", .map = map, .unmap = unmap};

static const ndm__segment_source *segment_source(int device)
{
    return device == 0 ? &source : NULL;
}

static ndm__backend table = {
    .abi = NDM__BACKEND_ABI,
    .name = "stand-in",
    .type = NDM_DEVICE_CUDA,
    .device_count = count,
    .device_props = props,
    .segment_source = segment_source,
    .supports = supports,
    .copy = copy,
    .fill = fill,
    .iota = iota,
    .upload = move,
    .download = move,
};

/* NDM_STAND_IN_ABI: the ABI the table claims (a module built for another
 * libndm). */
__attribute__((visibility("default"))) const ndm__backend *
ndm_backend_cuda_register(const ndm__host_api *h);
__attribute__((visibility("default"))) const ndm__backend *
ndm_backend_cuda_register(const ndm__host_api *h)
{
    if (h->abi != NDM__BACKEND_ABI)
        return NULL;
    host = h;
    const char *abi = getenv("NDM_STAND_IN_ABI");
    if (abi && *abi)
        table.abi = (uint32_t)atoi(abi);
    return &table;
}
