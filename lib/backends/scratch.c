/* Kernel scratch as backends see it (backend.h, "kernel scratch"): through
 * the provider of the calling thread's operation context, which the layer
 * that knows managers fills; backends own only the context's thread slot. */
#include <stdatomic.h>

#include "backend.h"
#include "../base/error.h"

_Thread_local const struct ndm__op_context *ndm__op_context_current NDM__TLS_MODEL;

/* Outside an operation (a kernel the library runs for itself, a test that
 * calls a table): the provider installed by the layer above, which counts
 * the block in the allocator and charges no manager. */
static _Atomic(const ndm__scratch_provider *) fallback;

void ndm__scratch_install(const ndm__scratch_provider *p)
{
    atomic_store_explicit(&fallback, p, memory_order_release);
}

/* A context begins with its provider (lib/ops/dispatch.h). */
static const ndm__scratch_provider *provider_of(const struct ndm__op_context *c)
{
    return c ? *(const ndm__scratch_provider *const *)(const void *)c
             : atomic_load_explicit(&fallback, memory_order_acquire);
}

ndm_status ndm__scratch_alloc(ndm_device_type type, int device, size_t bytes, void **out)
{
    const struct ndm__op_context *c = ndm__op_context_current;
    const ndm__scratch_provider *p = provider_of(c);
    if (NDM__UNLIKELY(!p)) {
        *out = NULL;
        return ndm__fail(NDM_E_INTERNAL, NULL, NDM__NO_SITE,
                         "a kernel asked for %zu bytes of scratch with no provider installed", bytes);
    }
    return p->alloc(c, type, device, bytes, out);
}

void ndm__scratch_free(ndm_device_type type, int device, void *ptr)
{
    const struct ndm__op_context *c = ndm__op_context_current;
    const ndm__scratch_provider *p = provider_of(c);
    if (ptr && p)
        p->free(c, type, device, ptr);
    else if (ptr)
        ndm__warn("ndm: scratch block %p freed outside an operation (kept)", ptr);
}
