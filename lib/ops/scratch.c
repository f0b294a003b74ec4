/* Kernel scratch from the caching allocator (backend.h, "kernel scratch"):
 * charged to the running operation's output manager, under its public name.
 * The per-thread record of live blocks lets kernels free by pointer. */
#include <string.h>

#include "dispatch.h"
#include "../manager/create.h"

/* A live block: what its free gives back. */
typedef struct scratch_rec {
    void *ptr;
    ndm__block blk;
    ndm_device dev;
    ndm__manager *m; /* charged in m's limits (NULL: in none) */
    uint32_t gen;    /* m's generation when charged */
    int64_t charge;  /* the bytes charged there */
} scratch_rec;

/* A few blocks at a time per thread (kernels nest no deeper): not worth an
 * initial-exec slot, so this one costs a lookup call, paid by scratch only. */
static _Thread_local struct {
    int n;
    scratch_rec r[NDM__SCRATCH_LIVE];
} live;

static ndm_status scratch_alloc(const ndm__op_context *c, ndm_device_type type, int device,
                                size_t bytes, void **out)
{
    *out = NULL;
    const char *api = c ? c->api : NULL;
    ndm__site site = c ? c->site : NDM__NO_SITE;
    ndm_device dev = {type, device};
    if (live.n == NDM__SCRATCH_LIVE)
        return ndm__fail(NDM_E_OOM, api, site,
                         "a kernel holds %d scratch blocks on this thread already",
                         NDM__SCRATCH_LIVE);
    scratch_rec *r = &live.r[live.n];
    *r = (scratch_rec){0};
    r->dev = dev;
    uint32_t mslot = 0;
    if (c && c->out.id) {
        /* The dispatcher holds the operation's arrays, not its output
         * manager, which another thread may close meanwhile: then the
         * scratch is refused as an array would be. */
        ndm__manager *m = ndm__manager_get(c->out, api, site);
        if (!m)
            return ndm_last_status();
        uint32_t gen = ndm__manager_expected_gen(c->out, m);
        bool charged;
        ndm_status st = ndm__scratch_reserve(m, gen, dev, bytes, api, &site, &charged);
        if (st < 0)
            return st;
        if (charged)
            r->m = m, r->gen = gen, r->charge = (int64_t)bytes;
        mslot = m->self;
    }
    ndm__alloc_tag tag = {mslot, site.file, site.func, site.line, api};
    if (NDM__UNLIKELY(ndm__alloc(dev, bytes, &tag, &r->blk) < 0)) {
        /* The allocator's message says what it had; name the operation. */
        ndm_status st = ndm_last_status();
        if (api)
            ndm__fail(st, api, site, "%s (scratch of a kernel)", ndm_last_error());
        if (r->m)
            ndm__scratch_unreserve(r->m, r->gen, dev, r->charge);
        return st;
    }
    r->ptr = r->blk.ptr;
    live.n++;
    *out = r->ptr;
    return NDM_OK;
}

static void scratch_free(const ndm__op_context *c, ndm_device_type type, int device, void *p)
{
    (void)c;
    if (!p)
        return;
    (void)type, (void)device; /* the record knows its device */
    for (int i = live.n - 1; i >= 0; i--) {
        scratch_rec *r = &live.r[i];
        if (r->ptr != p)
            continue;
        ndm__free(r->dev, &r->blk);
        if (r->m)
            ndm__scratch_unreserve(r->m, r->gen, r->dev, r->charge);
        live.r[i] = live.r[--live.n];
        return;
    }
    /* Not this thread's: a kernel broke the rule above. */
    ndm__warn("ndm: scratch block %p freed on a thread that did not take it (kept)", p);
}

const ndm__scratch_provider ndm__op_scratch = {scratch_alloc, scratch_free};

/* Kernels run outside an operation (a check the library makes for itself)
 * get this provider with a NULL context: counted by the allocator, charged
 * to no manager. Installed when the library loads, before any kernel runs:
 * every dispatcher that takes scratch names ndm__op_scratch, so a static
 * link that holds such a kernel holds this file too. */
__attribute__((constructor)) static void scratch_install(void)
{
    ndm__scratch_install(&ndm__op_scratch);
}
