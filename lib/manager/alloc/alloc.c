/* The allocator entry points: one caching pool per device, configured from
 * NDM_ALLOC_CONF or ndm_alloc_configure, the pressure callbacks, the hooks
 * the manager layer registers, and the public memory API. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/compiler.h"
#include "../../base/error.h"
#include "pool.h"

const ndm__segment_source *ndm__cpu_segment_source(void);

#define MAX_CUDA 16
#define MAX_POOLS (1 + MAX_CUDA)

/* ---- devices and their sources --------------------------------------------------- */

const ndm__segment_source *ndm__segment_source_for(ndm_device dev)
{
    if (dev.type == NDM_DEVICE_CPU && dev.index == 0)
        return ndm__cpu_segment_source();
    const ndm__device_memory *m = ndm__device_memory_of(NDM_DEVICE_CUDA);
    if (dev.type == NDM_DEVICE_CUDA && m && dev.index >= 0 && dev.index < MAX_CUDA)
        return m->source(dev.index);
    return NULL;
}

ndm_status ndm__device_usable(ndm_device dev, char *why, size_t n)
{
    if (dev.type == NDM_DEVICE_CPU && dev.index == 0)
        return NDM_OK; /* every manager creation asks: no formatting here */
    char name[32];
    ndm_device_str(dev, name, sizeof name);
    if (dev.type == NDM_DEVICE_CPU) {
        snprintf(why, n, "device %s does not exist (the CPU is device 0)", name);
        return NDM_E_DEVICE;
    }
    if (dev.type != NDM_DEVICE_CUDA) {
        snprintf(why, n, "unknown device type %d", (int)dev.type);
        return NDM_E_DEVICE;
    }
    const ndm__device_memory *m = ndm__device_memory_of(NDM_DEVICE_CUDA);
    if (!m) {
        snprintf(why, n, "device %s: this build of ndm has no CUDA backend", name);
        return NDM_E_UNSUPPORTED;
    }
    ndm_status st = m->usable(dev.index, why, n);
    if (st == NDM_OK && dev.index >= MAX_CUDA) {
        snprintf(why, n, "device %s is past the %d CUDA devices ndm serves", name, MAX_CUDA);
        return NDM_E_DEVICE;
    }
    return st;
}

/* ---- the pools ----------------------------------------------------------------------- */

static _Atomic(ndm__pool *) pools[MAX_POOLS];
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
/* NDM_ALLOC_CONF could not be parsed for this device: its allocations fail
 * with the reason until ndm_alloc_configure succeeds. */
static char conf_error[MAX_POOLS][800];
static atomic_bool conf_bad[MAX_POOLS];
static bool trace_env_done;

static int pool_index(ndm_device dev)
{
    if (dev.type == NDM_DEVICE_CPU)
        return dev.index == 0 ? 0 : -1;
    if (dev.type == NDM_DEVICE_CUDA && dev.index >= 0 && dev.index < MAX_CUDA)
        return 1 + dev.index;
    return -1;
}

__attribute__((cold)) ndm_status ndm__alloc_fail(const ndm__alloc_tag *tag, ndm_status st,
                                                 const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!tag || !tag->api)
        return ndm__fail(st, NULL, NDM__NO_SITE, "%s", msg);
    ndm__site at = {tag->file, tag->func, tag->line};
    return ndm__fail(st, tag->api, at, "%s%s", msg, tag->transient ? " (scratch of a kernel)" : "");
}

/* The pool of a device, made on first use. NULL with the error recorded,
 * as api's failure at `site` (see ndm__alloc_fail). */
static ndm__pool *get_pool_at(ndm_device dev, const char *api, ndm__site site)
{
    int i = pool_index(dev);
    ndm__pool *p = i >= 0 ? atomic_load_explicit(&pools[i], memory_order_acquire) : NULL;
    if (p)
        return p;
    char why[768];
    ndm_status st = ndm__device_usable(dev, why, sizeof why);
    if (st < 0) {
        ndm__fail(st, api, site, "%s", why);
        return NULL;
    }
    const ndm__segment_source *src = ndm__segment_source_for(dev);
    char name[32];
    ndm_device_str(dev, name, sizeof name);
    if (!src || i < 0) {
        ndm__fail(NDM_E_DEVICE, api, site, "no memory source for device %s", name);
        return NULL;
    }
    pthread_mutex_lock(&pools_lock);
    p = atomic_load_explicit(&pools[i], memory_order_relaxed);
    if (!p) {
        if (!trace_env_done) {
            trace_env_done = true;
            const char *tr = getenv("NDM_ALLOC_TRACE");
            char err[160];
            if (tr && *tr && ndm__trace_start(tr, err, sizeof err) < 0)
                ndm__warn("NDM_ALLOC_TRACE: %s", err);
        }
        p = ndm__pool_new(src, dev, name, true);
        if (p) {
            p->poison = NDM__ASAN && dev.type == NDM_DEVICE_CPU;
            const char *conf = getenv("NDM_ALLOC_CONF");
            ndm__settings s;
            char err[768];
            if (ndm__settings_parse(conf, dev, &s, err, sizeof err) == NDM_OK) {
                if (conf && *conf)
                    (void)ndm__pool_configure(p, &s, conf);
            } else {
                snprintf(conf_error[i], sizeof conf_error[i], "NDM_ALLOC_CONF: %s", err);
                atomic_store(&conf_bad[i], true);
                ndm__warn("%s", conf_error[i]);
            }
            if (ndm__hist_recording()) {
                ndm__pool_lock(p);
                ndm__hist_enable(p, ndm__hist_max());
                ndm__pool_refresh(p);
                ndm__pool_unlock(p);
            } else if (atomic_load(&ndm__instrumented)) {
                ndm__pool_lock(p);
                ndm__pool_refresh(p);
                ndm__pool_unlock(p);
            }
            atomic_store_explicit(&pools[i], p, memory_order_release);
        }
    }
    pthread_mutex_unlock(&pools_lock);
    if (!p)
        ndm__fail(NDM_E_OOM, api, site, "no memory for the allocator of %s", name);
    return p;
}

static ndm__pool *get_pool(ndm_device dev, const char *api)
{
    return get_pool_at(dev, api, NDM__NO_SITE);
}

/* Pools made so far, the CPU first. */
static int used_pools(ndm__pool **out)
{
    int n = 0;
    for (int i = 0; i < MAX_POOLS; i++) {
        ndm__pool *p = atomic_load_explicit(&pools[i], memory_order_acquire);
        if (p)
            out[n++] = p;
    }
    return n;
}

/* ---- the manager layer's interface --------------------------------------------------- */

_Atomic int64_t ndm__inject_countdown;
static _Atomic unsigned inject_kinds;
static _Atomic int64_t inject_fired;
static _Atomic unsigned inject_fired_kind;

void ndm__inject_fail_after(int64_t n, unsigned kinds)
{
    atomic_store(&ndm__inject_countdown, 0);
    atomic_store(&inject_fired, 0);
    atomic_store(&inject_fired_kind, 0);
    atomic_store(&inject_kinds, kinds);
    atomic_store(&ndm__inject_countdown, n > 0 ? n : 0);
}

void ndm__alloc_fail_after(int64_t n) { ndm__inject_fail_after(n, NDM__INJ_STORAGE); }

int64_t ndm__inject_fired(void) { return atomic_load(&inject_fired); }
bool ndm__inject_pending(void) { return atomic_load(&ndm__inject_countdown) > 0; }
unsigned ndm__inject_fired_kind(void) { return atomic_load(&inject_fired_kind); }

bool ndm__inject_take(unsigned kind)
{
    if (!(atomic_load_explicit(&inject_kinds, memory_order_relaxed) & kind))
        return false;
    int64_t c = atomic_load_explicit(&ndm__inject_countdown, memory_order_relaxed);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&ndm__inject_countdown, &c, c - 1)) {
            if (c - 1 != 0)
                return false;
            atomic_store(&inject_fired_kind, kind);
            atomic_fetch_add(&inject_fired, 1);
            return true;
        }
    }
    return false;
}

/* A block leaves the pool: its requested bytes become addressable, the
 * slack up to its rounded size stays poisoned (ASan builds only). */
static inline ndm_status handed_out(ndm__pool *p, ndm_status st, size_t nbytes,
                                    const ndm__block *out)
{
    if (NDM__ASAN && st == NDM_OK && p->poison) {
        ndm__unpoison(out->ptr, nbytes);
        ndm__poison((char *)out->ptr + nbytes, out->size - nbytes);
    }
    return st;
}

/* A block goes back: all of it is the pool's again. */
static inline void taken_back(ndm__pool *p, const ndm__ablk *b)
{
    if (NDM__ASAN && p->poison)
        ndm__poison(b->addr, b->size);
}

/* The calling thread's current stream per device (0: the default). */
static _Thread_local uintptr_t cur_stream[MAX_POOLS];

void ndm__alloc_set_stream(ndm_device dev, uintptr_t stream)
{
    int i = pool_index(dev);
    if (i > 0)
        cur_stream[i] = stream;
}

static _Thread_local bool capturing[MAX_POOLS];

void ndm__alloc_set_capturing(ndm_device dev, bool on)
{
    int i = pool_index(dev);
    if (i > 0)
        capturing[i] = on;
}

static __attribute__((cold)) ndm_status refuse_capture(ndm_device dev, size_t nbytes,
                                                       const ndm__alloc_tag *tag,
                                                       ndm__block *out)
{
    char name[32];
    memset(out, 0, sizeof *out);
    ndm_device_str(dev, name, sizeof name);
    return ndm__alloc_fail(tag, NDM_E_UNSUPPORTED,
                           "%zu bytes on %s cannot be captured: a device graph's memory is its "
                           "plan's arena (make the step's arrays in the planned manager)",
                           nbytes, name);
}

ndm_status ndm__alloc_record_stream(ndm_device dev, void *cookie, uintptr_t stream)
{
    ndm__xblock *x = ndm__xblock_of(cookie);
    if (x)
        return x->fns->record_stream(x, stream);
    int i = pool_index(dev);
    ndm__pool *p = i > 0 ? atomic_load_explicit(&pools[i], memory_order_acquire) : NULL;
    return p ? ndm__pool_record_stream(p, cookie, stream) : NDM_OK;
}

uint32_t ndm__alloc_stream_uses(ndm_device dev, void *cookie)
{
    ndm__xblock *x = ndm__xblock_of(cookie);
    if (x)
        return x->fns->stream_uses(x);
    int i = pool_index(dev);
    ndm__pool *p = i > 0 ? atomic_load_explicit(&pools[i], memory_order_acquire) : NULL;
    return p && p->streamed ? ndm__pool_stream_uses(cookie) : 0;
}

static ndm_status alloc_rare(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag,
                             ndm__block *out)
{
    memset(out, 0, sizeof *out);
    char name[32];
    if (ndm__inject_take(NDM__INJ_STORAGE)) {
        ndm_device_str(dev, name, sizeof name);
        return ndm__alloc_fail(tag, NDM_E_OOM,
                               "out of memory: %zu bytes on %s (failure injected for a test)",
                               nbytes, name);
    }
    ndm__pool *p = tag && tag->api ? get_pool_at(dev, tag->api,
                                                 (ndm__site){tag->file, tag->func, tag->line})
                                   : get_pool(dev, NULL);
    if (!p)
        return ndm_last_status();
    int i = pool_index(dev);
    if (i >= 0 && capturing[i])
        return refuse_capture(dev, nbytes, tag, out);
    if (atomic_load(&conf_bad[i]))
        return ndm__alloc_fail(tag, NDM_E_CONFIG, "%s", conf_error[i]);
    uintptr_t stream = i > 0 ? cur_stream[i] : 0;
    return handed_out(p, ndm__pool_alloc_on(p, nbytes, stream, tag, out), nbytes, out);
}

/* ndm__alloc past its inline case: other devices, large requests, an
 * injected failure, a bad configuration, an empty bin. `tried`: the thread
 * cache was asked already. */
static __attribute__((noinline)) ndm_status alloc_general(ndm_device dev, size_t nbytes,
                                                          const ndm__alloc_tag *tag,
                                                          ndm__block *out, bool tried)
{
    int i = dev.type == NDM_DEVICE_CPU ? 0 : 1 + dev.index;
    if (__builtin_expect(i < 0 || i >= MAX_POOLS ||
                             atomic_load_explicit(&ndm__inject_countdown, memory_order_relaxed) > 0,
                         0))
        return alloc_rare(dev, nbytes, tag, out);
    if (__builtin_expect(capturing[i], 0))
        return refuse_capture(dev, nbytes, tag, out);
    ndm__pool *p = atomic_load_explicit(&pools[i], memory_order_acquire);
    if (__builtin_expect(!p || atomic_load_explicit(&conf_bad[i], memory_order_relaxed), 0))
        return alloc_rare(dev, nbytes, tag, out);
    if (!tried && ndm__pool_alloc_fast(p, nbytes, tag, out))
        return handed_out(p, NDM_OK, nbytes, out);
    /* The CPU has one stream; other devices tie the block to the thread's. */
    uintptr_t stream = i ? cur_stream[i] : 0;
    return handed_out(p, ndm__pool_alloc_on(p, nbytes, stream, tag, out), nbytes, out);
}

ndm_status ndm__alloc(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag, ndm__block *out)
{
    /* A small CPU request: the thread's cache, with nothing live across a
     * call (the rest is alloc_general's, a tail call). */
    if (__builtin_expect(dev.type == NDM_DEVICE_CPU && nbytes <= NDM__TC_MAX_SIZE, 1)) {
        ndm__pool *p = atomic_load_explicit(&pools[0], memory_order_acquire);
        if (__builtin_expect(p == NULL ||
                                 atomic_load_explicit(&ndm__inject_countdown,
                                                      memory_order_relaxed) > 0 ||
                                 atomic_load_explicit(&conf_bad[0], memory_order_relaxed),
                             0))
            return alloc_general(dev, nbytes, tag, out, false);
        if (ndm__pool_alloc_fast(p, nbytes, tag, out))
            return handed_out(p, NDM_OK, nbytes, out);
        return alloc_general(dev, nbytes, tag, out, true);
    }
    return alloc_general(dev, nbytes, tag, out, false);
}

void ndm__free(ndm_device dev, ndm__block *blk)
{
    ndm__ablk *b = blk->cookie;
    if (!b)
        return;
    ndm__xblock *x = ndm__xblock_of(b);
    if (NDM__UNLIKELY(x != NULL)) {
        void *ptr = blk->ptr;
        *blk = (ndm__block){NULL, NULL, 0};
        x->fns->free(x, ptr);
        return;
    }
    int i = pool_index(dev);
    ndm__pool *p = i >= 0 ? atomic_load_explicit(&pools[i], memory_order_acquire) : NULL;
    if (!p)
        return;
    taken_back(p, b);
    if (ndm__tc_try_free(p, b)) {
        *blk = (ndm__block){NULL, NULL, 0};
        return;
    }
    ndm__pool_free(p, blk);
}

static void free_many_own(ndm_device dev, void *const *cookies, size_t n);

void ndm__free_many(ndm_device dev, void *const *cookies, size_t n)
{
    /* Parts of larger blocks go to their holders; runs of the pool's own
     * blocks between them are freed together. */
    size_t k = 0;
    while (k < n) {
        ndm__xblock *x = ndm__xblock_of(cookies[k]);
        if (NDM__UNLIKELY(x != NULL)) {
            x->fns->free(x, NULL);
            k++;
            continue;
        }
        size_t j = k + 1;
        while (j < n && !ndm__xblock_of(cookies[j]))
            j++;
        free_many_own(dev, cookies + k, j - k);
        k = j;
    }
}

static void free_many_own(ndm_device dev, void *const *cookies, size_t n)
{
    int i = pool_index(dev);
    ndm__pool *p = i >= 0 ? atomic_load_explicit(&pools[i], memory_order_acquire) : NULL;
    if (!p)
        return;
    if (NDM__ASAN && p->poison)
        for (size_t k = 0; k < n; k++)
            taken_back(p, cookies[k]);
    for (size_t k = 0; k < n; k++) {
        k += ndm__tc_try_free_many(p, cookies + k, n - k);
        if (k < n) {
            ndm__block b = {NULL, cookies[k], 0};
            ndm__pool_free(p, &b);
        }
    }
}

/* ---- pinned host memory --------------------------------------------------------------- */

static _Atomic(ndm__pool *) pinned_pools[MAX_CUDA];

static ndm__pool *pinned_pool(ndm_device dev)
{
    if (dev.type != NDM_DEVICE_CUDA || dev.index < 0 || dev.index >= MAX_CUDA) {
        char name[32];
        ndm__fail(NDM_E_DEVICE, NULL, NDM__NO_SITE, "no pinned host memory for device %s",
                  ndm_device_str(dev, name, sizeof name));
        return NULL;
    }
    ndm__pool *p = atomic_load_explicit(&pinned_pools[dev.index], memory_order_acquire);
    if (p)
        return p;
    /* The device pool first: it checks the device and loads its backend. */
    if (!get_pool(dev, NULL))
        return NULL;
    const ndm__device_memory *m = ndm__device_memory_of(NDM_DEVICE_CUDA);
    const ndm__segment_source *src = m && m->pinned_source ? m->pinned_source(dev.index) : NULL;
    if (!src) {
        ndm__fail(NDM_E_UNSUPPORTED, NULL, NDM__NO_SITE,
                  "the backend of cuda:%d has no pinned host memory", dev.index);
        return NULL;
    }
    pthread_mutex_lock(&pools_lock);
    p = atomic_load_explicit(&pinned_pools[dev.index], memory_order_relaxed);
    if (!p) {
        char name[32];
        snprintf(name, sizeof name, "cuda:%d pinned", dev.index);
        p = ndm__pool_new(src, dev, name, false);
        if (p)
            atomic_store_explicit(&pinned_pools[dev.index], p, memory_order_release);
    }
    pthread_mutex_unlock(&pools_lock);
    if (!p)
        ndm__fail(NDM_E_OOM, NULL, NDM__NO_SITE, "no memory for the pinned pool of cuda:%d",
                  dev.index);
    return p;
}

ndm_status ndm__alloc_pinned(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag,
                             ndm__block *out)
{
    memset(out, 0, sizeof *out);
    ndm__pool *p = pinned_pool(dev);
    if (!p)
        return ndm_last_status();
    /* Host work is done when it returns: the buffer belongs to no device
     * stream, so every stream that copies it is another user to wait for. */
    return ndm__pool_alloc_on(p, nbytes, NDM__HOST_STREAM, tag, out);
}

void ndm__free_pinned(ndm_device dev, ndm__block *blk)
{
    if (!blk->cookie || dev.type != NDM_DEVICE_CUDA || dev.index < 0 || dev.index >= MAX_CUDA)
        return;
    ndm__pool *p = atomic_load_explicit(&pinned_pools[dev.index], memory_order_acquire);
    if (p)
        ndm__pool_free(p, blk);
}

ndm_status ndm__pinned_record_stream(ndm_device dev, void *cookie, uintptr_t stream)
{
    if (dev.type != NDM_DEVICE_CUDA || dev.index < 0 || dev.index >= MAX_CUDA)
        return NDM_OK;
    ndm__pool *p = atomic_load_explicit(&pinned_pools[dev.index], memory_order_acquire);
    return p ? ndm__pool_record_stream(p, cookie, stream) : NDM_OK;
}

ndm_status ndm__pinned_stats(ndm_device dev, ndm_memory_stats *out)
{
    memset(out, 0, sizeof *out);
    if (dev.type != NDM_DEVICE_CUDA || dev.index < 0 || dev.index >= MAX_CUDA)
        return NDM_E_DEVICE;
    ndm__pool *p = atomic_load_explicit(&pinned_pools[dev.index], memory_order_acquire);
    if (p)
        ndm__pool_stats(p, out);
    return NDM_OK;
}

void ndm__alloc_retag(void *cookie, uint32_t manager)
{
    ndm__ablk *b = cookie;
    if (b && !ndm__xblock_of(cookie)) /* (a part stays its holder's) */
        atomic_store_explicit(&b->mgr, manager, memory_order_relaxed);
}

static _Atomic(ndm__oom_reporter) reporter;
static _Atomic(ndm__manager_describer) describer;

void ndm__alloc_set_oom_reporter(ndm__oom_reporter fn) { atomic_store(&reporter, fn); }
void ndm__alloc_set_describer(ndm__manager_describer fn) { atomic_store(&describer, fn); }

void ndm__report_managers(ndm_device dev, char *buf, size_t n)
{
    ndm__oom_reporter fn = atomic_load(&reporter);
    buf[0] = '\0';
    if (fn)
        fn(dev, buf, n);
}

ndm__rstr *ndm__describe_manager(uint32_t slot)
{
    ndm__manager_describer fn = atomic_load(&describer);
    if (!fn || !slot)
        return NULL;
    char buf[512];
    buf[0] = '\0';
    fn(slot, buf, sizeof buf);
    return ndm__rstr_new(buf);
}

/* ---- pressure callbacks --------------------------------------------------------------- */

typedef struct callback {
    ndm_pressure_fn fn;
    void *ud;
} callback;

static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static callback *cbs;
static size_t ncbs, cbs_cap;
static _Thread_local bool in_pressure;

NDM_API ndm_status ndm_on_pressure(ndm_pressure_fn fn, void *ud)
{
    if (!fn)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "fn is NULL");
    pthread_mutex_lock(&cb_lock);
    for (size_t i = 0; i < ncbs; i++) {
        if (cbs[i].fn == fn && cbs[i].ud == ud) {
            pthread_mutex_unlock(&cb_lock);
            return NDM_ALREADY;
        }
    }
    if (ncbs == cbs_cap) {
        size_t cap = cbs_cap ? 2 * cbs_cap : 8;
        callback *c = realloc(cbs, cap * sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&cb_lock);
            return ndm__fail(NDM_E_OOM, __func__, NDM__NO_SITE, "no memory for the callback");
        }
        cbs = c;
        cbs_cap = cap;
    }
    cbs[ncbs++] = (callback){fn, ud};
    pthread_mutex_unlock(&cb_lock);
    return NDM_OK;
}

NDM_API ndm_status ndm_pressure_remove(ndm_pressure_fn fn, void *ud)
{
    pthread_mutex_lock(&cb_lock);
    for (size_t i = 0; i < ncbs; i++) {
        if (cbs[i].fn == fn && cbs[i].ud == ud) {
            memmove(&cbs[i], &cbs[i + 1], (ncbs - i - 1) * sizeof *cbs);
            ncbs--;
            pthread_mutex_unlock(&cb_lock);
            return NDM_OK;
        }
    }
    pthread_mutex_unlock(&cb_lock);
    return NDM_ALREADY;
}

bool ndm__pressure_run(ndm__pool *p, ndm_pressure_reason why, size_t request)
{
    /* A callback that allocates must not start the callbacks again. */
    if (in_pressure)
        return false;
    pthread_mutex_lock(&cb_lock);
    size_t n = ncbs;
    callback local[16], *list = n <= 16 ? local : malloc(n * sizeof *list);
    if (!list)
        n = 0;
    else if (n)
        memcpy(list, cbs, n * sizeof *list);
    pthread_mutex_unlock(&cb_lock);
    if (!n)
        return false;
    ndm_memory_stats st;
    ndm__pool_stats(p, &st);
    ndm__pool_lock(p);
    p->st.num_pressure_calls++;
    ndm__settings set = p->set;
    ndm__pool_unlock(p);
    int64_t allocated = st.allocated_bytes[NDM_POOL_ALL].current;
    int64_t reserved = st.reserved_bytes[NDM_POOL_ALL].current;
    int64_t total = set.memory_limit ? (int64_t)set.memory_limit : st.device_total;
    ndm_pressure_event ev = {p->device, why, request, allocated, reserved,
                             ndm__pressure_level(&set, allocated, reserved, total)};
    in_pressure = true;
    for (size_t i = 0; i < n; i++)
        list[i].fn(&ev, list[i].ud);
    in_pressure = false;
    if (list != local)
        free(list);
    return true;
}

ndm_pressure_level ndm__pressure_level(const ndm__settings *s, int64_t allocated,
                                       int64_t reserved, int64_t total)
{
    /* R torch's should_call_gc: a device mostly empty needs nothing; one
     * whose memory is mostly allocated, or whose cache is mostly allocated,
     * needs everything released; otherwise a light pass. Without a known
     * total, the reserved bytes stand in for it. */
    double t = (double)(total > 0 ? total : reserved);
    if (t <= 0 || (double)reserved / t < s->reserved_rate)
        return NDM_RECLAIM_NONE;
    if ((double)allocated / t > s->allocated_rate)
        return NDM_RECLAIM_FULL;
    if (reserved > 0 && (double)allocated / (double)reserved > s->allocated_reserved_rate)
        return NDM_RECLAIM_FULL;
    return NDM_RECLAIM_LIGHT;
}

/* ---- the public memory API ------------------------------------------------------------- */

NDM_API ndm_pressure_level ndm_memory_pressure_level(ndm_device device)
{
    ndm__pool *p = get_pool(device, __func__);
    if (!p)
        return NDM_RECLAIM_NONE;
    ndm_memory_stats st;
    ndm__pool_stats(p, &st);
    ndm__settings set;
    ndm__pool_settings(p, &set, NULL, 0);
    int64_t total = set.memory_limit ? (int64_t)set.memory_limit : st.device_total;
    return ndm__pressure_level(&set, st.allocated_bytes[NDM_POOL_ALL].current,
                               st.reserved_bytes[NDM_POOL_ALL].current, total);
}

NDM_API ndm_status ndm_memory_stats_get(ndm_device device, ndm_memory_stats *out)
{
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "out is NULL");
    ndm__pool *p = get_pool(device, __func__);
    if (!p)
        return ndm_last_status();
    ndm__pool_stats(p, out);
    return NDM_OK;
}

NDM_API ndm_status ndm_memory_stat_get(ndm_device device, const char *key, int64_t *out)
{
    if (!key || !out)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "key or out is NULL");
    ndm_memory_stats st;
    ndm_status s = ndm_memory_stats_get(device, &st);
    if (s < 0)
        return s;
    if (!ndm__stats_key(&st, key, out))
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "unknown statistic '%s' (keys look like allocated_bytes.all.current, "
                         "reserved_bytes.large_pool.peak, num_ooms)",
                         key);
    return NDM_OK;
}

/* Runs act on device's pool; api names the caller in messages. */
static ndm_status on_pool(ndm_device device, void (*act)(ndm__pool *p), const char *api)
{
    ndm__pool *p = get_pool(device, api);
    if (!p)
        return ndm_last_status();
    act(p);
    return NDM_OK;
}

NDM_API ndm_status ndm_memory_reset_peak_stats(ndm_device device)
{
    return on_pool(device, ndm__pool_reset_peaks, __func__);
}

NDM_API ndm_status ndm_memory_reset_accumulated_stats(ndm_device device)
{
    return on_pool(device, ndm__pool_reset_accumulated, __func__);
}

NDM_API ndm_status ndm_memory_empty_cache(ndm_device device)
{
    return on_pool(device, ndm__pool_empty_cache, __func__);
}

NDM_API ndm_status ndm_memory_summary(ndm_device device, FILE *f)
{
    if (!f)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "f is NULL");
    ndm__pool *p = get_pool(device, __func__);
    if (!p)
        return ndm_last_status();
    ndm__pool_summary(p, f);
    return NDM_OK;
}

NDM_API ndm_status ndm_alloc_configure_at(NDM_SITE_PARAMS, ndm_device device, const char *conf)
{
    ndm__pool *p = get_pool_at(device, __func__, NDM__SITE);
    if (!p)
        return ndm_last_status();
    ndm__settings s;
    char err[768];
    ndm_status st = ndm__settings_parse(conf, device, &s, err, sizeof err);
    if (st < 0)
        return ndm__fail(st, __func__, NDM__SITE, "%s", err);
    st = ndm__pool_configure(p, &s, conf);
    if (st == NDM_OK)
        atomic_store(&conf_bad[pool_index(device)], false);
    return st;
}

NDM_API int ndm_alloc_settings(ndm_device device, char *buf, size_t n)
{
    ndm__pool *p = get_pool(device, __func__);
    if (!p)
        return -1;
    ndm__settings s;
    ndm__pool_settings(p, &s, NULL, 0);
    return ndm__settings_str(&s, buf, n);
}

static void refresh_all(void)
{
    ndm__pool *list[MAX_POOLS];
    int n = used_pools(list);
    for (int i = 0; i < n; i++) {
        ndm__pool_lock(list[i]);
        ndm__pool_refresh(list[i]);
        ndm__pool_unlock(list[i]);
    }
}

NDM_API ndm_status ndm_memory_record_history(bool on, size_t max_entries)
{
    if (!on)
        max_entries = 0;
    else if (!max_entries)
        max_entries = 100000;
    size_t bytes = 0;
    if (on && !ndm__hist_bytes(max_entries, &bytes))
        return ndm__fail(NDM_E_OVERFLOW, __func__, NDM__NO_SITE,
                         "a history of %zu events overflows the size of its ring", max_entries);
    /* Every ring is made before any is replaced, so a failure leaves the
     * recording as it was. */
    pthread_mutex_lock(&pools_lock);
    ndm__pool *list[MAX_POOLS];
    struct ndm__history *rings[MAX_POOLS] = {0};
    int n = used_pools(list);
    /* With no device used yet, one ring is still made (and given back):
     * the first device's pool makes its own later, too late to report. */
    bool probe = on && !n;
    for (int i = 0; on && i < (probe ? 1 : n); i++) {
        if ((rings[i] = ndm__hist_new(max_entries)) && probe) {
            ndm__hist_free(rings[i]);
            rings[i] = NULL;
        } else if (!rings[i]) {
            for (int j = 0; j < i; j++)
                ndm__hist_free(rings[j]);
            pthread_mutex_unlock(&pools_lock);
            return ndm__fail(NDM_E_OOM, __func__, NDM__NO_SITE,
                             "no memory for a history of %zu events (%zu bytes per device)",
                             max_entries, bytes);
        }
    }
    ndm__hist_set(on, max_entries);
    for (int i = 0; i < n; i++) {
        ndm__pool_lock(list[i]);
        ndm__hist_install(list[i], rings[i]);
        ndm__pool_unlock(list[i]);
    }
    pthread_mutex_unlock(&pools_lock);
    return NDM_OK;
}

NDM_API ndm_status ndm_memory_dump_snapshot(const char *path)
{
    if (!path)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "path is NULL");
    ndm__pool *list[MAX_POOLS];
    if (!get_pool(NDM_CPU, __func__))
        return ndm_last_status();
    int n = used_pools(list);
    size_t len = strlen(path);
    bool pickle = len >= 7 && !strcmp(path + len - 7, ".pickle");
    FILE *f = fopen(path, pickle ? "wb" : "w");
    if (!f)
        return ndm__fail(NDM_E_IO, __func__, NDM__NO_SITE, "cannot open '%s' for writing", path);
    ndm_status st = ndm__snapshot_write(f, list, n, pickle);
    if (fclose(f) != 0 && st == NDM_OK)
        st = NDM_E_IO;
    if (st == NDM_E_IO)
        return ndm__fail(st, __func__, NDM__NO_SITE, "writing '%s' failed", path);
    if (st < 0)
        return ndm__fail(st, __func__, NDM__NO_SITE, "no memory to copy the allocator state");
    return NDM_OK;
}

NDM_API ndm_status ndm_memory_record_trace(const char *path)
{
    char err[256];
    pthread_mutex_lock(&pools_lock);
    trace_env_done = true;
    ndm_status st = ndm__trace_start(path, err, sizeof err);
    refresh_all();
    pthread_mutex_unlock(&pools_lock);
    if (st < 0)
        return ndm__fail(st, __func__, NDM__NO_SITE, "%s", err);
    return NDM_OK;
}
