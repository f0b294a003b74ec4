/* Transfers between devices (ndm_to) and device synchronisation. Host memory
 * is the meeting point, except between two devices of a backend with a peer copy. */
#include <stdlib.h>

#include "dispatch.h"

/* The reason a backend gave for `st`, when the last error is its message. */
static const char *backend_reason(ndm_status st)
{
    return ndm_last_status() == st && ndm_last_error()[0] ? ndm_last_error() : ndm_status_str(st);
}

/* r's elements in C order on r's own device: r's memory when r is
 * contiguous, else a temporary block (*tmp, freed by the caller) that the
 * backend's copy packs. */
static ndm_status packed_source(ndm__array *r, const ndm__backend *b, size_t n,
                                const ndm__alloc_tag *tag, ndm__block *tmp, const void **out)
{
    if (ndm__is_contiguous(r->ndim, r->shape, r->strides)) {
        *out = ndm__array_ptr(r);
        return NDM_OK;
    }
    int64_t small[16];
    int64_t *cs = small;
    if (r->ndim > 16 && !(cs = ndm__malloc((size_t)r->ndim * sizeof *cs, NDM__INJ_SCRATCH)))
        return ndm__fail(NDM_E_OOM, NULL, NDM__NO_SITE, "no memory for strides");
    ndm__contiguous_strides(r->ndim, r->shape, cs);
    ndm_status st = ndm__alloc(r->storage->device, n, tag, tmp);
    if (st == NDM_OK) {
        ndm__tensor c = {tmp->ptr, r->dtype, r->ndim, r->shape, cs};
        ndm__tensor t = ndm__tensor_of(r);
        st = b->copy(r->storage->device.index, &c, &t);
        *out = tmp->ptr;
    }
    if (cs != small)
        free(cs);
    return st;
}

/* Copy the n bytes of r, packed, to `dst` on device `to`. */
static ndm_status move_bytes(ndm__array *r, void *dst, ndm_device to, const ndm__backend *bs,
                             const ndm__backend *bd, size_t n, const ndm__alloc_tag *tag)
{
    ndm_device from = r->storage->device;
    ndm__block tmp = {0}, bounce = {0};
    const void *src = NULL;
    ndm_status st = packed_source(r, bs, n, tag, &tmp, &src);
    if (st == NDM_OK) {
        /* the host legs take the one transfer path (inner.c) */
        if (from.type == NDM_DEVICE_CPU) {
            st = ndm__bytes_move(bd, to, dst, (void *)src, n, false);
        } else if (to.type == NDM_DEVICE_CPU) {
            st = ndm__bytes_move(bs, from, (void *)src, dst, n, true);
        } else if (bs->type == bd->type && bs->peer_copy) {
            st = bs->peer_copy(to.index, dst, from.index, src, n);
        } else {
            st = ndm__alloc(NDM_CPU, n, tag, &bounce);
            if (st == NDM_OK)
                st = ndm__bytes_move(bs, from, (void *)src, bounce.ptr, n, true);
            if (st == NDM_OK)
                st = ndm__bytes_move(bd, to, dst, bounce.ptr, n, false);
        }
    }
    ndm__free(NDM_CPU, &bounce);
    ndm__free(from, &tmp);
    return st;
}

NDM_API ndm_array ndm_to_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_device device)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    ndm__array *r = ndm__input(a, &out, api, site);
    if (!r)
        return NDM_NULL_ARRAY;
    ndm_device from = r->storage->device;
    if (ndm_device_eq(from, device))
        return ndm__array_view(site, api, out, r, r->dtype, r->ndim, r->shape, r->strides,
                               r->offset, NULL);
    if (ndm__alloc_device_check(device, api, site) < 0)
        return NDM_NULL_ARRAY;
    const ndm__backend *bs = ndm__backend_of(from, api, site);
    const ndm__backend *bd = bs ? ndm__backend_of(device, api, site) : NULL;
    if (!bd)
        return NDM_NULL_ARRAY;
    ndm__array *o;
    ndm_array h = ndm__array_new_on(site, api, out, device, r->dtype, r->ndim, r->shape, &o);
    if (!h.id)
        return h;
    size_t n = o->storage->nbytes;
    if (n == 0)
        return h;
    ndm__manager *om = ndm__manager_peek(out);
    ndm__alloc_tag tag = {om ? om->self : 0, site.file, site.func, site.line, NULL, false};
    ndm_status st = move_bytes(r, o->storage->data, device, bs, bd, n, &tag);
    if (st < 0) {
        char desc[160], fname[32], tname[32], why[768];
        snprintf(why, sizeof why, "%s", backend_reason(st));
        ndm__fail(st, api, site, "copying %s from %s to %s failed: %s",
                  ndm__array_desc(r, desc, sizeof desc), ndm_device_str(from, fname, sizeof fname),
                  ndm_device_str(device, tname, sizeof tname), why);
        ndm__discard(h);
        return NDM_NULL_ARRAY;
    }
    return h;
}

NDM_API ndm_status ndm_device_synchronize(ndm_device device)
{
    const char *api = __func__;
    if (ndm__alloc_device_check(device, api, NDM__NO_SITE) < 0)
        return ndm_last_status();
    const ndm__backend *b = ndm__backend_of(device, api, NDM__NO_SITE);
    if (!b)
        return ndm_last_status();
    if (!b->sync)
        return NDM_OK;
    ndm_status st = b->sync(device.index);
    if (st < 0) {
        char why[768];
        snprintf(why, sizeof why, "%s", backend_reason(st));
        return ndm__fail(st, api, NDM__NO_SITE, "%s", why);
    }
    return NDM_OK;
}
