/* Kernel scratch from the caching allocator (backend.h, "kernel scratch"):
 * charged to the running operation's output manager, under its public name.
 * The per-thread record of live blocks lets kernels free by pointer. */
#include <pthread.h>
#include <stdlib.h>
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

/* A few blocks at a time per thread (kernels nest no deeper), on the heap
 * from the thread's first scratch on and freed when it exits: a library
 * with initial-exec thread-locals has its whole TLS block in the static
 * area when loaded with dlopen, which is small, so only a pointer lives
 * there. */
typedef struct live_set {
    int n;
    scratch_rec r[NDM__SCRATCH_LIVE];
} live_set;

static _Thread_local live_set *live_tls;
static pthread_key_t live_key;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void live_key_make(void) { (void)pthread_key_create(&live_key, free); }

/* This thread's set, made on first use; NULL when there is no memory. */
static live_set *live_get(void)
{
    live_set *l = live_tls;
    if (NDM__LIKELY(l))
        return l;
    pthread_once(&live_once, live_key_make);
    l = calloc(1, sizeof *l);
    if (l && pthread_setspecific(live_key, l) != 0) {
        free(l);
        l = NULL;
    }
    return live_tls = l;
}

static ndm_status scratch_alloc(const ndm__op_context *c, ndm_device_type type, int device,
                                size_t bytes, void **out)
{
    *out = NULL;
    const char *api = c ? c->api : NULL;
    ndm__site site = c ? c->site : NDM__NO_SITE;
    ndm_device dev = {type, device};
    live_set *lv = live_get();
    if (!lv)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for this thread's scratch records");
    if (lv->n == NDM__SCRATCH_LIVE)
        return ndm__fail(NDM_E_OOM, api, site,
                         "a kernel holds %d scratch blocks on this thread already",
                         NDM__SCRATCH_LIVE);
    scratch_rec *r = &lv->r[lv->n];
    *r = (scratch_rec){0};
    r->dev = dev;
    uint32_t mslot = 0;
    ndm__manager *planned = NULL;
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
        planned = m;
    }
    ndm__alloc_tag tag = {mslot, site.file, site.func, site.line, api, true};
    ndm_status ast = planned ? ndm__storage_alloc(planned, dev, bytes, &tag, &r->blk)
                             : ndm__alloc(dev, bytes, &tag, &r->blk);
    if (NDM__UNLIKELY(ast < 0)) {
        /* The allocator's message says what it had, as api's failure at
         * the site (the tag is transient: it says "scratch of a kernel"). */
        ndm_status st = ndm_last_status();
        if (r->m)
            ndm__scratch_unreserve(r->m, r->gen, dev, r->charge);
        return st;
    }
    r->ptr = r->blk.ptr;
    lv->n++;
    *out = r->ptr;
    return NDM_OK;
}

static void scratch_free(const ndm__op_context *c, ndm_device_type type, int device, void *p)
{
    (void)c;
    if (!p)
        return;
    (void)type, (void)device; /* the record knows its device */
    live_set *lv = live_tls;
    for (int i = lv ? lv->n - 1 : -1; i >= 0; i--) {
        scratch_rec *r = &lv->r[i];
        if (r->ptr != p)
            continue;
        ndm__free(r->dev, &r->blk);
        if (r->m)
            ndm__scratch_unreserve(r->m, r->gen, r->dev, r->charge);
        lv->r[i] = lv->r[--lv->n];
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
