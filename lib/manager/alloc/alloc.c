/* The allocator entry points used by array storage. This is the "system"
 * strategy: every block is its own segment from the device's source, with
 * no cache. The caching core replaces the bodies without touching callers. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "ndm/config.h"
#include "../error.h"

const ndm__segment_source *ndm__cpu_segment_source(void);
#if NDM_HAVE_CUDA
const ndm__segment_source *ndm__cuda_segment_source(int index);
int ndm__cuda_count(void);
#endif

static _Atomic int64_t fail_countdown;

void ndm__alloc_fail_after(int64_t n) { atomic_store(&fail_countdown, n); }

const ndm__segment_source *ndm__segment_source_for(ndm_device dev)
{
    if (dev.type == NDM_DEVICE_CPU && dev.index == 0)
        return ndm__cpu_segment_source();
#if NDM_HAVE_CUDA
    if (dev.type == NDM_DEVICE_CUDA && dev.index >= 0 && dev.index < ndm__cuda_count())
        return ndm__cuda_segment_source(dev.index);
#endif
    return NULL;
}

ndm_status ndm__device_usable(ndm_device dev, char *why, size_t n)
{
    char name[32];
    ndm_device_str(dev, name, sizeof name);
    if (dev.type == NDM_DEVICE_CPU) {
        if (dev.index == 0)
            return NDM_OK;
        snprintf(why, n, "device %s does not exist (the CPU is device 0)", name);
        return NDM_E_DEVICE;
    }
    if (dev.type != NDM_DEVICE_CUDA) {
        snprintf(why, n, "unknown device type %d", (int)dev.type);
        return NDM_E_DEVICE;
    }
#if NDM_HAVE_CUDA
    int count = ndm__cuda_count();
    if (dev.index < 0 || dev.index >= count) {
        snprintf(why, n, "device %s does not exist (%d CUDA device%s found)", name, count,
                 count == 1 ? "" : "s");
        return NDM_E_DEVICE;
    }
    return NDM_OK;
#else
    snprintf(why, n, "device %s: this build of ndm has no CUDA backend", name);
    return NDM_E_UNSUPPORTED;
#endif
}

static int64_t take_failure(void)
{
    int64_t c = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1))
            return c - 1 == 0;
    }
    return 0;
}

ndm_status ndm__alloc(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag, ndm__block *out)
{
    (void)tag;
    memset(out, 0, sizeof *out);
    const ndm__segment_source *src = ndm__segment_source_for(dev);
    char name[32];
    if (!src) {
        ndm_device_str(dev, name, sizeof name);
        return ndm__fail(NDM_E_DEVICE, NULL, NDM__NO_SITE, "no memory source for device %s", name);
    }
    size_t size = nbytes < 64 ? 64 : (nbytes + 63) & ~(size_t)63;
    if (size < nbytes || take_failure())
        goto oom;
    void *p = NULL;
    if (src->map(src->ctx, size, &p) < 0 || !p)
        goto oom;
    out->ptr = p;
    out->cookie = p;
    out->size = size;
    return NDM_OK;
oom:
    ndm_device_str(dev, name, sizeof name);
    /* The manager layer prefixes this with the caller's name and site. */
    return ndm__fail(NDM_E_OOM, NULL, NDM__NO_SITE, "out of memory: %zu bytes on %s", nbytes,
                     name);
}

void ndm__free(ndm_device dev, ndm__block *blk)
{
    if (!blk->ptr)
        return;
    const ndm__segment_source *src = ndm__segment_source_for(dev);
    if (src)
        src->unmap(src->ctx, blk->ptr, blk->size);
    memset(blk, 0, sizeof *blk);
}
