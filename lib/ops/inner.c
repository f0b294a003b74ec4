/* The inner interface (inner.h): views of array records for the layers above
 * ops, and the one path by which bytes move between host and device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backends/cpu/parallel.h"
#include "../manager/alloc/alloc.h"
#include "dispatch.h"
#include "index_ops.h"
#include "inner.h"

/* Pinned staging moves a transfer in pieces of this size at most. */
#define PIN_CHUNK ((size_t)4 << 20)

void ndm__view_fill(const ndm__array *r, ndm__view *v)
{
    v->t = ndm__tensor_of(r);
    v->device = r->storage->device;
    v->numel = ndm__numel(r->ndim, r->shape);
    v->nbytes = (size_t)v->numel * ndm_dtype_size(r->dtype);
    v->contiguous = ndm__is_contiguous(r->ndim, r->shape, r->strides);
    v->owner = ndm__manager_handle_of(ndm__manager_slot(r->mgr));
    v->offset = r->offset;
}

static bool filled(const ndm__array *r, ndm__view *v)
{
    if (r)
        ndm__view_fill(r, v);
    return r != NULL;
}

bool ndm__view_of(ndm_array a, ndm__view *v, const char *api, ndm__site site)
{
    return filled(ndm__array_get(a, api, site), v);
}

bool ndm__view_input(ndm_array a, ndm__view *v, const char *api, ndm__site site)
{
    return filled(ndm__array_get_prop(a, api, site), v);
}

bool ndm__view_peek(ndm_array a, ndm__view *v) { return filled(ndm__array_peek(a), v); }

ndm_array ndm__array_make(ndm__site site, const char *api, ndm_manager m, const ndm_device *dev,
                          ndm_dtype dtype, int ndim, const int64_t *shape, ndm__view *v)
{
    ndm__array *r;
    ndm_array a = dev ? ndm__array_new_on(site, api, m, *dev, dtype, ndim, shape, &r)
                      : ndm__array_new(site, api, m, dtype, ndim, shape, &r);
    if (a.id && v)
        ndm__view_fill(r, v);
    return a;
}

bool ndm__require_manager(ndm_manager m, const char *api, ndm__site site)
{
    return ndm__manager_get(m, api, site) != NULL;
}

ndm_manager ndm__resolve_manager(ndm_manager m, const char *api, ndm__site site)
{
    if (!ndm__manager_get(m, api, site))
        return NDM_NULL_MANAGER;
    return ndm__manager_resolved(m, api, site);
}

bool ndm__manager_gone(ndm_manager m)
{
    ndm__manager *r = ndm__manager_peek(m);
    return !r || (atomic_load_explicit(&r->state, memory_order_acquire) & NDM__M_CLOSING);
}

ndm_manager ndm__output_for(ndm_manager named, ndm_array first, const char *api, ndm__site site)
{
    return ndm__output_manager(named, ndm__array_peek(first), api, site);
}

const char *ndm__shape_desc(ndm_dtype dtype, int ndim, const int64_t *shape, char *buf, size_t n)
{
    ndm__array tmp = {.dtype = dtype, .ndim = ndim, .shape = (int64_t *)shape};
    atomic_store_explicit(&tmp.live, 1, memory_order_relaxed);
    return ndm__array_desc(&tmp, buf, n);
}

ndm_array ndm__array_strided_view(ndm__site site, const char *api, ndm_manager m, ndm_array base,
                                  ndm_dtype dtype, int ndim, const int64_t *shape,
                                  const int64_t *strides, int64_t offset)
{
    ndm__array *r = ndm__array_get(base, api, site);
    return r ? ndm__array_view(site, api, m, r, dtype, ndim, shape, strides, r->offset + offset,
                               NULL)
             : NDM_NULL_ARRAY;
}

ndm_array ndm__array_lend(ndm__site site, const char *api, ndm_array a)
{
    ndm__array *r = ndm__array_get(a, api, site);
    return r ? ndm__array_lend_out(site, api, r) : NDM_NULL_ARRAY;
}

void ndm__array_disown(ndm_array a)
{
    ndm__array *r = ndm__array_peek(a);
    if (r)
        r->own_cold.free_fn = NULL;
}

/* The backend's words (a device's sticky error says which launch broke
 * it) kept under the caller's api. */
static ndm_status failed(ndm_status st, const char *what, const char *api, ndm__site site)
{
    char why[512];
    snprintf(why, sizeof why, "%s", ndm_last_error());
    return ndm__fail(st, api, site, "%s failed: %s", what, why);
}

/* n contiguous bytes between device memory dptr and host memory: staged
 * through the pinned pool when the device has one, else direct. */
ndm_status ndm__bytes_move(const ndm__backend *b, ndm_device dev, void *dptr_, void *host_,
                           size_t n, bool out)
{
    char *dptr = dptr_, *host = host_;
    ndm__block pin = {0};
    size_t cap = n < PIN_CHUNK ? n : PIN_CHUNK;
    if (dev.type != NDM_DEVICE_CPU && b->pinned_source && n &&
        ndm__alloc_pinned(dev, cap, NULL, &pin) != NDM_OK)
        pin.ptr = NULL; /* pageable memory, then */
    if (!pin.ptr)
        return out ? b->download(dev.index, host, dptr, n) : b->upload(dev.index, dptr, host, n);
    ndm_status st = NDM_OK;
    for (size_t done = 0; done < n && st == NDM_OK; done += cap) {
        size_t k = n - done < cap ? n - done : cap;
        if (out) {
            st = b->download(dev.index, pin.ptr, dptr + done, k);
            if (st == NDM_OK)
                memcpy(host + done, pin.ptr, k);
        } else {
            memcpy(pin.ptr, host + done, k);
            st = b->upload(dev.index, dptr + done, pin.ptr, k);
        }
    }
    ndm__free_pinned(dev, &pin);
    return st;
}

static ndm_status range(const ndm__view *v, size_t off, void *host, size_t n, bool out,
                        const char *api, ndm__site site)
{
    if (!v->contiguous || off > v->nbytes || n > v->nbytes - off)
        return ndm__fail(NDM_E_INVALID, api, site,
                         "bytes [%zu, %zu) of a %scontiguous array of %zu bytes", off, off + n,
                         v->contiguous ? "" : "non-", v->nbytes);
    if (!n)
        return NDM_OK;
    if (v->device.type == NDM_DEVICE_CPU) {
        if (out)
            memcpy(host, (char *)v->t.data + off, n);
        else
            memcpy((char *)v->t.data + off, host, n);
        return NDM_OK;
    }
    const ndm__backend *b = ndm__backend_of(v->device, api, site);
    if (!b)
        return ndm_last_status();
    ndm_status st = ndm__bytes_move(b, v->device, (char *)v->t.data + off, host, n, out);
    return st < 0 ? failed(st, out ? "download" : "upload", api, site) : NDM_OK;
}

ndm_status ndm__range_to_host(const ndm__view *v, size_t off, void *dst, size_t n,
                              const char *api, ndm__site site)
{
    return range(v, off, dst, n, true, api, site);
}

ndm_status ndm__range_from_host(const ndm__view *v, size_t off, const void *src, size_t n,
                                const char *api, ndm__site site)
{
    return range(v, off, (void *)src, n, false, api, site);
}

/* Every element of v in C order to or from a host buffer. */
static ndm_status whole(const ndm__view *v, void *host, size_t nbytes, bool out, const char *api,
                        ndm__site site)
{
    if (nbytes != v->nbytes)
        return ndm__fail(NDM_E_INVALID, api, site, "buffer of %zu bytes given; the array has %zu",
                         nbytes, v->nbytes);
    if (!nbytes)
        return NDM_OK;
    if (!host)
        return ndm__fail(NDM_E_INVALID, api, site, "buffer is NULL");
    if (v->contiguous)
        return range(v, 0, host, nbytes, out, api, site);
    const ndm__backend *b = ndm__backend_of(v->device, api, site);
    if (!b)
        return ndm_last_status();
    int ndim = v->t.ndim;
    int64_t cs_small[16], *cs = cs_small;
    if (ndim > 16 && !(cs = ndm__malloc((size_t)ndim * sizeof *cs, NDM__INJ_SCRATCH)))
        return ndm__fail(NDM_E_OOM, api, site, "no memory");
    ndm__contiguous_strides(ndim, v->t.shape, cs);
    ndm_status st;
    if (v->device.type == NDM_DEVICE_CPU) {
        ndm__tensor h = {host, v->t.dtype, ndim, v->t.shape, cs};
        st = out ? b->copy(0, &h, &v->t) : b->copy(0, &v->t, &h);
    } else {
        /* A strided device array goes through a contiguous device buffer. */
        ndm__block tmp;
        st = ndm__alloc(v->device, nbytes, NULL, &tmp);
        if (st == NDM_OK) {
            ndm__tensor c = {tmp.ptr, v->t.dtype, ndim, v->t.shape, cs};
            int dev = v->device.index;
            if (out) {
                st = b->copy(dev, &c, &v->t);
                if (st == NDM_OK)
                    st = ndm__bytes_move(b, v->device, tmp.ptr, host, nbytes, true);
            } else {
                st = ndm__bytes_move(b, v->device, tmp.ptr, host, nbytes, false);
                if (st == NDM_OK)
                    st = b->copy(dev, &v->t, &c);
            }
            ndm__free(v->device, &tmp);
        }
    }
    if (cs != cs_small)
        free(cs);
    return st < 0 ? failed(st, "transfer", api, site) : NDM_OK;
}

ndm_status ndm__view_to_host(const ndm__view *v, void *dst, size_t nbytes, const char *api,
                             ndm__site site)
{
    return whole(v, dst, nbytes, true, api, site);
}

ndm_status ndm__view_from_host(const ndm__view *v, const void *src, size_t nbytes,
                               const char *api, ndm__site site)
{
    return whole(v, (void *)src, nbytes, false, api, site);
}

ndm_status ndm__host_copy(const ndm__tensor *dst, const ndm__tensor *src, const char *api,
                          ndm__site site)
{
    ndm_status st = ndm__cpu_backend.copy(0, dst, src);
    return st < 0 ? ndm__fail(st, api, site, "copy failed: %s", ndm_status_str(st)) : NDM_OK;
}

ndm_status ndm__device_copy(ndm_device dev, const ndm__tensor *dst, const ndm__tensor *src,
                            const char *api, ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b)
        return ndm_last_status();
    ndm_status st = b->copy(dev.index, dst, src);
    return st < 0 ? failed(st, "copy", api, site) : NDM_OK;
}

ndm_status ndm__find_outside(const ndm__view *v, int64_t lo, int64_t hi, int64_t *pos,
                             int64_t *value, const char *api, ndm__site site)
{
    const struct ndm__backend_index *f = ndm__index_family(v->device, api, site);
    if (!f)
        return ndm_last_status();
    ndm_status st = f->find_outside(v->device.index, &v->t, lo, hi, pos, value);
    if (st >= 0)
        return NDM_OK;
    /* the backend's reason (a capture refusing the read, say), else the status's */
    char why[512];
    snprintf(why, sizeof why, "%s",
             ndm_last_status() == st && ndm_last_error()[0] ? ndm_last_error()
                                                            : ndm_status_str(st));
    return ndm__fail(st, api, site, "label check failed: %s", why);
}

ndm_status ndm__device_fill(ndm_device dev, const ndm__tensor *dst, double value, const char *api,
                            ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b)
        return ndm_last_status();
    ndm_status st = b->fill(dev.index, dst, value);
    return st < 0 ? failed(st, "fill", api, site) : NDM_OK;
}

const ndm__backend_collective *ndm__collectives(ndm_device_type type, const char **missing)
{
    const ndm__backend *b = ndm__backend_for(type);
    if (missing)
        *missing = b ? NULL : ndm__backend_unavailable(type);
    return b ? b->collective : NULL;
}

int ndm__compute_threads(void) { return ndm__num_threads(); }

void ndm__compute_serving(void) { ndm__parallel_serving(); }

void ndm__compute_pool_avoid(void) { ndm__parallel_stay_inline(); }

uint32_t ndm__owner_slot(ndm_manager m) { return ndm__id_slot(m.id); }
