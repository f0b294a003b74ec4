/* The manager tree: the system root, child creation, deterministic close,
 * caps, limits, owned resources and hooks, names and paths. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "create.h"
#include "plan.h"
#include "reclaim.h"

uint32_t ndm__system_slot, ndm__detached_slot;
_Atomic uint64_t ndm__epoch = 1;

/* Topology (parent and child links, manager slots, names of dead managers)
 * changes under this lock; arrays and counters use each manager's own lock.
 * Lock order: tree lock, then manager locks (lower slot first), then storage
 * locks, then allocator locks. Like a manager's lock (ndm__mlock_take), it is
 * biased, to the thread that started ndm: a program that makes and closes
 * its managers on one thread takes it without an atomic read-modify-write
 * (two of them, lock and unlock, cost more than the rest of a manager's
 * creation); the first other thread to take it ends that for good. */
static pthread_mutex_t tree_mutex = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool tree_biased;
static atomic_uint tree_busy;
static _Atomic uint64_t tree_owner;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

void ndm__tree_lock(void)
{
    ndm__thread *t = ndm__tls;
    if (NDM__LIKELY(t && t->id == atomic_load_explicit(&tree_owner, memory_order_relaxed) &&
                    atomic_load_explicit(&tree_biased, memory_order_relaxed))) {
        atomic_store_explicit(&tree_busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        if (NDM__LIKELY(atomic_load_explicit(&tree_biased, memory_order_relaxed)))
            return;
        atomic_store_explicit(&tree_busy, 0, memory_order_release);
    }
    pthread_mutex_lock(&tree_mutex);
    if (atomic_load_explicit(&tree_biased, memory_order_relaxed))
        ndm__bias_revoke(&tree_biased, &tree_busy);
}

void ndm__tree_unlock(void)
{
    ndm__thread *t = ndm__tls;
    /* Only the owner sets busy, and only on its fast path. */
    if (t && t->id == atomic_load_explicit(&tree_owner, memory_order_relaxed) &&
        atomic_load_explicit(&tree_busy, memory_order_relaxed)) {
        atomic_store_explicit(&tree_busy, 0, memory_order_release);
        return;
    }
    pthread_mutex_unlock(&tree_mutex);
}

static void set_name(ndm__manager *m, const char *name)
{
    /* a bounded copy: snprintf costs more than the rest of a creation */
    if (!name || !*name)
        name = "manager";
    size_t len = strnlen(name, sizeof m->name - 1);
    memcpy(m->name, name, len);
    m->name[len] = '\0';
}

/* A dead manager's slot keeps the room for its array entries up to this
 * many, so the next manager there grows none. */
#define ARRAYS_KEPT 1024

/* Fill a fresh record; under the tree lock. The site comes in its parts:
 * a site the caller has just built, copied whole, is read with one wide load
 * that waits until the stores of its parts have left the core. */
static void record_init(ndm__manager *m, ndm__manager *parent, const char *name,
                        ndm_device device, unsigned flags, const char *file, const char *func,
                        int line)
{
    if (m->limits) {
        free(m->limits);
        m->limits = NULL;
    }
    __atomic_store_n(&m->parent, parent ? parent->self : 0, __ATOMIC_RELAXED); /* (see anchor_above) */
    m->parent_gen = parent ? atomic_load_explicit(&parent->gen, memory_order_relaxed) : 0;
    m->first_child = m->sib_prev = m->sib_next = 0;
    m->narrays = m->holes = 0; /* (the entries' room stays with the slot) */
    atomic_store_explicit(&m->limit_anchor,
                          parent ? atomic_load_explicit(&parent->limit_anchor, memory_order_relaxed)
                                 : 0,
                          memory_order_relaxed);
    __atomic_store(&m->device, &device, __ATOMIC_RELAXED); /* see ndm__manager_device_of */
    m->dev = ndm__device_slot(device);
    set_name(m, name);
    m->site = (ndm__site){file, func, line};
    m->dead_site = NDM__NO_SITE;
    m->epoch = atomic_load_explicit(&ndm__epoch, memory_order_relaxed);
    m->live = m->created = m->released = m->moved_in = m->moved_out = m->resources = 0;
    m->children = 0;
    m->closed_created = m->closed_released = 0;
    atomic_store_explicit(&m->recomputed, 0, memory_order_relaxed);
    /* Only the counts the last manager here used can be other than 0. The
     * manager's own device is marked at once: its first array then finds
     * the mark and needs no atomic read-modify-write. */
    uint32_t used = atomic_load_explicit(&m->dev_used, memory_order_relaxed) | 1u << m->dev;
    for (; used; used &= used - 1) {
        int d = __builtin_ctz(used);
        m->count[d].bytes = m->count[d].peak = m->count[d].reserved = 0;
        atomic_store_explicit(&m->count[d].inbox, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&m->dev_used, 1u << m->dev, memory_order_relaxed);
    m->hooks = NULL;
    /* A child of a planned manager (a scope, an autograd graph) is part of
     * its step: it shares the run (the parent is open, under the tree lock,
     * so its run is not sealed yet). */
    struct ndm__plan_run *run =
        parent ? atomic_load_explicit(&parent->plan_run, memory_order_relaxed) : NULL;
    if (NDM__UNLIKELY(run != NULL))
        ndm__plan_run_share(run);
    atomic_store_explicit(&m->plan_run, run, memory_order_relaxed);
    memset(&m->dumped, 0, sizeof m->dumped);
    /* A record's bias goes to the first thread that makes a manager in it and
     * stays with that thread: a thread that looked up the previous manager
     * here may still be on its way into the lock's fast path (it read
     * `creator` before this manager existed), so biasing the record to
     * another thread could let both in, and that thread's stores to `busy`
     * could hide the other's from a revoker. The owner itself is not on such
     * a way while it makes this manager (it runs this code), so the bias
     * comes back when the owner makes the next manager here; managers made
     * here by other threads start unbiased. */
    ndm__thread *t = ndm__bias_supported ? ndm__thread_get() : NULL;
    uint64_t owner = atomic_load_explicit(&m->creator, memory_order_relaxed);
    if (t && (owner == 0 || owner == t->id)) {
        atomic_store_explicit(&m->creator, t->id, memory_order_relaxed);
        atomic_store_explicit(&m->busy, 0, memory_order_relaxed);
        atomic_store_explicit(&m->biased, true, memory_order_relaxed);
    }
    if (parent) {
        /* newest child first */
        m->sib_next = parent->first_child;
        if (parent->first_child)
            ndm__manager_slot(parent->first_child)->sib_prev = m->self;
        parent->first_child = m->self;
        parent->children++;
    }
    if (atomic_load_explicit(&m->limit_anchor, memory_order_relaxed))
        flags |= NDM__M_LIMITED;
    atomic_store_explicit(&m->state, NDM__M_LIVE | flags, memory_order_release);
}

static void leak_report_at_exit(void)
{
    int64_t n = ndm_leak_report(stderr);
    /* NDM_LEAK_REPORT=why: and why the largest three are alive */
    const char *env = getenv("NDM_LEAK_REPORT");
    if (n > 0 && env && !strcmp(env, "why"))
        ndm__why_top(stderr, NDM_NULL_MANAGER, 3);
}

static void init_process(void)
{
    ndm__bias_setup();
    ndm__thread *t = ndm__bias_supported ? ndm__thread_get() : NULL;
    if (t) {
        atomic_store_explicit(&tree_owner, t->id, memory_order_relaxed);
        atomic_store_explicit(&tree_biased, true, memory_order_relaxed);
    }
    ndm__tree_lock();
    uint32_t s = ndm__manager_slot_alloc();
    uint32_t d = ndm__manager_slot_alloc();
    ndm__manager *sys = ndm__manager_slot(s);
    ndm__manager *det = ndm__manager_slot(d);
    if (!sys || !det) {
        ndm__tree_unlock();
        fprintf(stderr, "ndm: cannot allocate the root manager\n");
        abort(); /* no memory for two records at start-up: nothing sensible is left */
    }
    ndm__site here = {__FILE__, __func__, __LINE__};
    record_init(sys, NULL, "system", NDM_CPU, NDM__M_BUILTIN, here.file, here.func, here.line);
    record_init(det, sys, "detached", NDM_CPU, NDM__M_BUILTIN | NDM__M_CAP_CHILDREN, here.file,
                here.func, here.line);
    ndm__system_slot = s;
    ndm__detached_slot = d;
    ndm__tree_unlock();
    ndm__alloc_set_oom_reporter(ndm__report_top_managers);
    ndm__alloc_set_describer(ndm__describe_manager_path);
    const char *env = getenv("NDM_LEAK_REPORT");
    if (env && *env && strcmp(env, "0") != 0)
        atexit(leak_report_at_exit);
}

static atomic_bool inited;

void ndm__init(void)
{
    /* Every manager creation asks; pthread_once costs a call into libc. */
    if (NDM__LIKELY(atomic_load_explicit(&inited, memory_order_acquire)))
        return;
    pthread_once(&init_once, init_process);
    atomic_store_explicit(&inited, true, memory_order_release);
}

NDM_API ndm_manager ndm_system(void)
{
    ndm__init();
    return ndm__manager_handle_of(ndm__manager_slot(ndm__system_slot));
}

NDM_API ndm_manager ndm_detached(void)
{
    ndm__init();
    return ndm__manager_handle_of(ndm__manager_slot(ndm__detached_slot));
}

/* ---- paths and messages --------------------------------------------------- */

char *ndm__manager_path_locked(uint32_t slot, char *buf, size_t n)
{
    /* Collect names leaf to root, then write them root first. */
    const char *names[64];
    int depth = 0;
    bool unknown = false;
    ndm__manager *m = ndm__manager_slot(slot);
    while (m && depth < 64) {
        names[depth++] = m->name;
        if (!m->parent)
            break;
        ndm__manager *p = ndm__manager_slot(m->parent);
        /* A live parent has the generation recorded at creation; a dead one
         * that was not reused has that generation plus one. */
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed);
        bool p_live = atomic_load_explicit(&p->state, memory_order_relaxed) & NDM__M_LIVE;
        if (!((p_live && g == m->parent_gen) ||
              (!p_live && g == ((m->parent_gen + 1) & 0x7fffffffu)))) {
            unknown = true;
            break;
        }
        m = p;
    }
    size_t len = 0;
    buf[0] = '\0';
    if (unknown)
        len += (size_t)snprintf(buf, n, "?");
    for (int i = depth - 1; i >= 0; i--) {
        if (len >= n)
            break;
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "/" : "", names[i]);
    }
    return buf;
}

char *ndm__manager_path(uint32_t slot, char *buf, size_t n)
{
    ndm__tree_lock();
    ndm__manager_path_locked(slot, buf, n);
    ndm__tree_unlock();
    return buf;
}

bool ndm__manager_issued(ndm_manager h)
{
    uint32_t slot = ndm__id_slot(h.id);
    if (!(h.id & NDM__KIND_MANAGER) || slot == 0 || ndm__id_gen(h.id) == 0 ||
        slot >= (NDM__MAX_CHUNKS << NDM__CHUNK_BITS))
        return false;
    ndm__manager *r = ndm__manager_slot(slot);
    if (!r)
        return false;
    uint32_t g = atomic_load_explicit(&r->gen, memory_order_acquire);
    if (ndm__id_gen(h.id) == g &&
        !(atomic_load_explicit(&r->state, memory_order_acquire) & NDM__M_LIVE)) {
        /* a close clears the state, then moves the generation on, both under
         * the tree lock: read them again where they agree */
        ndm__tree_lock();
        g = atomic_load_explicit(&r->gen, memory_order_relaxed);
        bool live = atomic_load_explicit(&r->state, memory_order_relaxed) & NDM__M_LIVE;
        ndm__tree_unlock();
        if (ndm__id_gen(h.id) == g)
            return live;
    }
    return ndm__id_gen(h.id) == g || ndm__gen_stale(ndm__id_gen(h.id), g);
}

NDM__COLD ndm__manager *ndm__manager_lookup_failed(ndm_manager h, const char *api,
                                                   const ndm__site *wherep)
{
    ndm__site where = *wherep;
    if (h.id == NDM__CURRENT_SCOPE_ID) {
        ndm__manager *s = ndm__manager_peek(ndm__scope_innermost());
        if (!s)
            ndm__fail(NDM_E_NULL, api, where, "NDM_CURRENT_SCOPE: no scope is active on this thread");
        return s;
    }
    if (h.id == NDM__OUTPUT_RULE_ID) {
        ndm__fail(NDM_E_INVALID, api, where,
                  "NDM_OUTPUT_RULE names no manager: pass a manager or NDM_CURRENT_SCOPE");
        return NULL;
    }
    if (h.id == 0) {
        ndm__fail_null(api, where, "manager");
        return NULL;
    }
    if (!ndm__manager_issued(h)) {
        ndm__fail(NDM_E_INVALID, api, where, "not a manager handle (id 0x%016" PRIx64 ")", h.id);
        return NULL;
    }
    uint32_t slot = ndm__id_slot(h.id);
    ndm__manager *r = ndm__manager_slot(slot);
    ndm__tree_lock();
    uint32_t g = atomic_load_explicit(&r->gen, memory_order_relaxed);
    bool live = atomic_load_explicit(&r->state, memory_order_relaxed) & NDM__M_LIVE;
    char path[512], made[256], died[256];
    if (g == ((ndm__id_gen(h.id) + 1) & 0x7fffffffu) && !live) {
        ndm__manager_path_locked(slot, path, sizeof path);
        ndm__site_str(r->site, made, sizeof made);
        ndm__site_str(r->dead_site, died, sizeof died);
        ndm__tree_unlock();
        ndm__fail(NDM_E_CLOSED, api, where,
                  "stale manager handle: manager '%s' created at %s was closed at %s", path, made,
                  died);
    } else {
        ndm__tree_unlock();
        ndm__fail(NDM_E_CLOSED, api, where,
                  "stale manager handle (slot %u, generation %u): the manager was closed and its "
                  "slot has been reused since",
                  slot, ndm__id_gen(h.id));
    }
    return NULL;
}

/* ---- creation ------------------------------------------------------------- */

/* A child of the live record p (looked up by the caller). */
/* ndm__alloc_device_check out of line: inline, the copy of the site it
 * takes was made on entry, a load that waited on the caller's stores. */
static NDM__COLD bool device_refused(ndm_device device, const char *api, const ndm__site *site)
{
    return ndm__alloc_device_check(device, api, *site) < 0;
}

static ndm_manager manager_new(const ndm__site *site, const char *api, ndm__manager *p,
                               uint32_t pgen, const char *name, ndm_device device,
                               unsigned flags)
{
    if ((device.type != NDM_DEVICE_CPU || device.index != 0) && device_refused(device, api, site))
        return NDM_NULL_MANAGER;
    ndm__tree_lock();
    unsigned st = atomic_load_explicit(&p->state, memory_order_relaxed);
    char path[512];
    if (atomic_load_explicit(&p->gen, memory_order_relaxed) != pgen) {
        /* closed after the lookup, and its slot perhaps taken by another */
        ndm__tree_unlock();
        ndm__fail(NDM_E_CLOSED, api, *site, "the parent manager was closed meanwhile");
        return NDM_NULL_MANAGER;
    }
    if (!(st & NDM__M_LIVE) || (st & NDM__M_CLOSING)) {
        ndm__manager_path_locked(p->self, path, sizeof path);
        ndm__tree_unlock();
        ndm__fail(NDM_E_CLOSED, api, *site, "parent manager '%s' is closing", path);
        return NDM_NULL_MANAGER;
    }
    if (st & NDM__M_CAP_CHILDREN) {
        ndm__manager_path_locked(p->self, path, sizeof path);
        ndm__tree_unlock();
        ndm__fail(p->self == ndm__detached_slot ? NDM_E_ROOT : NDM_E_CAPPED, api, *site,
                  "manager '%s' refuses new children (%s); child '%s' refused", path,
                  p->self == ndm__detached_slot ? "it holds detached arrays only"
                                                : "capped with NDM_CAP_CHILDREN",
                  name ? name : "manager");
        return NDM_NULL_MANAGER;
    }
    uint32_t slot = ndm__manager_slot_alloc();
    if (!slot) {
        ndm__tree_unlock();
        ndm__fail(NDM_E_OOM, api, *site, "no memory for a manager record");
        return NDM_NULL_MANAGER;
    }
    ndm__manager *m = ndm__manager_slot(slot);
    record_init(m, p, name, device, flags, site->file, site->func, site->line);
    ndm_manager h = ndm__manager_handle_of(m);
    ndm__tree_unlock();
    return h;
}

ndm_manager ndm__manager_new_ex(ndm__site site, const char *api, ndm_manager parent,
                                const char *name, ndm_device device, unsigned flags)
{
    ndm__init();
    ndm__manager *p = ndm__manager_get(parent, api, site);
    if (!p)
        return NDM_NULL_MANAGER;
    return manager_new(&site, api, p, ndm__manager_expected_gen(parent, p), name, device, flags);
}

NDM_API ndm_manager ndm_manager_new_on_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name,
                                          ndm_device device)
{
    return ndm__manager_new_ex(NDM__SITE, __func__, parent, name, device, 0);
}

NDM_API ndm_manager ndm_manager_new_at(NDM_SITE_PARAMS, ndm_manager parent, const char *name)
{
    ndm__init();
    ndm__site site = NDM__SITE;
    /* (the site goes by address: a copy made for the check stalled on the
     * stores that built it, on every creation) */
    ndm__manager *p = ndm__manager_peek(parent);
    if (!p && !(p = ndm__manager_lookup_failed(parent, __func__, &site)))
        return NDM_NULL_MANAGER;
    return manager_new(&site, __func__, p, ndm__manager_expected_gen(parent, p), name,
                       ndm__manager_device_of(p), 0);
}

/* ---- close ---------------------------------------------------------------- */

static ndm_status run_hooks(ndm__manager *m)
{
    /* m is closing: add_hook saw that under m's lock, which this thread took
     * after setting it, so nobody adds hooks any more. */
    if (!m->hooks)
        return NDM_OK;
    ndm__mlock_take(m);
    ndm__hook *h = m->hooks;
    m->hooks = NULL;
    ndm__mlock_drop(m);
    ndm_status result = NDM_OK;
    while (h) {
        ndm__hook *next = h->next;
        if (h->free_fn) {
            h->free_fn(h->ptr);
        } else if (h->close_fn) {
            int rc = h->close_fn(h->ptr);
            if (rc != 0) {
                char path[512], site[256];
                ndm__manager_path(m->self, path, sizeof path);
                ndm__warn("on-close hook registered at %s failed with %d while closing '%s'",
                          ndm__site_str(h->site, site, sizeof site), rc, path);
                result = NDM_E_HOOK;
            }
        }
        free(h->name);
        free(h);
        h = next;
    }
    ndm__mlock_take(m);
    m->resources = 0;
    ndm__mlock_drop(m);
    return result;
}

/* The closes in progress on this thread, innermost first: a close that meets
 * a child being closed waits for it, unless this very thread is closing it
 * further up its stack (a hook of the child closes an ancestor). */
typedef struct close_frame {
    ndm__manager *m;
    struct close_frame *up;
} close_frame;
static _Thread_local close_frame *closing_here NDM__TLS_MODEL;

static bool closing_on_this_thread(ndm__manager *m)
{
    for (close_frame *f = closing_here; f; f = f->up)
        if (f->m == m)
            return true;
    return false;
}

/* Take child c out of p's list of children (tree lock held); c's own
 * links are left as they were. */
static void sibling_unlink(ndm__manager *p, ndm__manager *c)
{
    if (c->sib_prev)
        ndm__manager_rec(c->sib_prev)->sib_next = c->sib_next;
    else
        p->first_child = c->sib_next;
    if (c->sib_next)
        ndm__manager_rec(c->sib_next)->sib_prev = c->sib_prev;
    p->children--;
}

/* Take child c, whose close is in progress further up this thread's stack,
 * out of its parent p now (tree lock held): p's close can then end, and c's
 * ends later without touching p, which may be gone by then. */
static void unlink_closing_child(ndm__manager *p, ndm__manager *c)
{
    sibling_unlink(p, c);
    c->sib_prev = c->sib_next = 0;
    atomic_fetch_or_explicit(&c->state, NDM__M_UNLINKED, memory_order_relaxed);
}

/* Close m and its subtree. `site` is the site of the user's close call. The
 * tree lock is held on entry and on return; it is dropped while m's arrays
 * are released and its hooks run, and kept from one child to the next.
 * NDM_ALREADY (the lock still held) when m is closed or another thread is
 * closing it. */
static ndm_status close_locked(ndm__manager *m, const ndm__site *site)
{
    unsigned st = atomic_load_explicit(&m->state, memory_order_relaxed);
    if (!(st & NDM__M_LIVE) || (st & NDM__M_CLOSING))
        return NDM_ALREADY;
    /* From here no child can be created under m and no array can enter or
     * leave it except through this close. The state changes only under the
     * tree lock: a store, not a read-modify-write, suffices. */
    ndm__mlock_take(m);
    atomic_store_explicit(&m->state, st | NDM__M_CLOSING, memory_order_release);
    ndm__mlock_drop(m);
    close_frame frame = {m, closing_here};
    closing_here = &frame;

    /* Children newest first. A child that another thread is closing right now
     * is waited for: it unlinks itself when done. One that this thread is
     * closing (its hook closes m) cannot be waited for: it leaves m now. */
    ndm_status result = NDM_OK;
    for (uint32_t c; (c = m->first_child) != 0;) {
        ndm__manager *cm = ndm__manager_rec(c);
        ndm_status cs = close_locked(cm, site);
        if (cs == NDM_ALREADY && closing_on_this_thread(cm)) {
            unlink_closing_child(m, cm);
        } else if (cs == NDM_ALREADY) {
            ndm__tree_unlock();
            sched_yield();
            ndm__tree_lock();
        } else if (cs < 0 && result == NDM_OK) {
            result = cs;
        }
    }
    /* Until now (the children's hooks included) arrays could still leave m;
     * from here its drain owns them. */
    ndm__mlock_take(m);
    atomic_fetch_or_explicit(&m->state, NDM__M_DRAINING, memory_order_release);
    ndm__mlock_drop(m);
    ndm__tree_unlock();

    ndm__manager_drain_arrays(m, *site);
    if (atomic_load_explicit(&m->plan_run, memory_order_relaxed))
        ndm__plan_seal(m);
    ndm_status hs = run_hooks(m);
    if (hs < 0 && result == NDM_OK)
        result = hs;

    ndm__tree_lock();
    closing_here = frame.up;
    bool linked = !(atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_UNLINKED);
    /* (an unlinked m's parent may be gone: its counts go nowhere) */
    if (linked)
        ndm__lifetime_fold(m);
    if (m->parent && linked)
        sibling_unlink(ndm__manager_rec(m->parent), m);
    m->dead_site = *site;
    /* The last change, under m's lock as well (see ndm__manager_open_as):
     * a creation or a move that takes the lock after it sees the new
     * generation and backs off. Limit reservations of creations still in
     * progress go back now, while the limits over m are still its own. */
    ndm__mlock_take(m);
    for (uint32_t used = atomic_load_explicit(&m->dev_used, memory_order_relaxed); used;
         used &= used - 1) {
        int d = __builtin_ctz(used);
        if (m->count[d].reserved) {
            ndm__limit_release(m, d, m->count[d].reserved);
            m->count[d].reserved = 0;
        }
    }
    atomic_store_explicit(&m->state, 0, memory_order_release);
    unsigned g = atomic_load_explicit(&m->gen, memory_order_relaxed);
    atomic_store_explicit(&m->gen, ((g + 1) & 0x7fffffffu) ? ((g + 1) & 0x7fffffffu) : 1,
                          memory_order_release);
    ndm__mlock_drop(m);
    if (m->arrays_cap > ARRAYS_KEPT) {
        /* a large room is not kept for whoever takes the slot next */
        free(m->arrays);
        m->arrays = NULL;
        m->arrays_cap = 0;
    }
    ndm__manager_slot_free(m->self);
    return result;
}

/* Close m if it is still the manager of generation gen: under the tree lock,
 * so that a close racing with another close of the same handle cannot take
 * a new manager that got the slot meanwhile for it. */
static ndm_status close_manager(ndm__manager *m, uint32_t gen, ndm__site site)
{
    ndm__tree_lock();
    ndm_status st = atomic_load_explicit(&m->gen, memory_order_relaxed) == gen
                        ? close_locked(m, &site)
                        : NDM_ALREADY;
    ndm__tree_unlock();
    return st;
}

NDM_API ndm_status ndm_manager_close_at(NDM_SITE_PARAMS, ndm_manager h)
{
    ndm__site site = NDM__SITE;
    ndm__manager *m = ndm__manager_peek(h);
    if (!m) {
        if (h.id == NDM__CURRENT_SCOPE_ID || h.id == NDM__OUTPUT_RULE_ID || h.id == 0) {
            if (!(m = ndm__manager_lookup_failed(h, __func__, &site)))
                return ndm_last_status();
        } else if (!ndm__manager_issued(h)) {
            return ndm__fail(NDM_E_INVALID, __func__, site,
                             "not a manager handle (id 0x%016" PRIx64 ")", h.id);
        } else {
            return NDM_ALREADY; /* closing a closed manager changes nothing */
        }
    }
    if (atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN) {
        return ndm__fail(NDM_E_ROOT, __func__, site, "the built-in manager '%s' cannot be closed",
                         m->name);
    }
    ndm__thread_get(); /* (a thread that kills arrays counts: see ndm__multi) */
    ndm_status st = close_manager(m, ndm__id_gen(h.id), site);
    ndm__reclaim_maybe();
    return st;
}

/* ---- caps, limits, resources ------------------------------------------------ */

/* Sets (or clears) cap flags; api names the caller in messages. */
static ndm_status change_caps(ndm_manager h, unsigned flags, bool set, const char *api)
{
    ndm__manager *m = ndm__manager_get(h, api, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if (flags & ~(unsigned)(NDM_CAP_ARRAYS | NDM_CAP_CHILDREN))
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE, "unknown cap flags 0x%x", flags);
    if (atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN)
        return ndm__fail(NDM_E_ROOT, api, NDM__NO_SITE, "the built-in manager '%s' cannot be %s",
                         m->name, set ? "capped" : "uncapped");
    ndm__tree_lock();
    ndm__mlock_take(m);
    if (set)
        atomic_fetch_or_explicit(&m->state, flags << NDM__CAP_SHIFT, memory_order_acq_rel);
    else
        atomic_fetch_and_explicit(&m->state, ~(flags << NDM__CAP_SHIFT), memory_order_acq_rel);
    ndm__mlock_drop(m);
    ndm__tree_unlock();
    return NDM_OK;
}

NDM_API ndm_status ndm_manager_cap(ndm_manager h, unsigned flags)
{
    return change_caps(h, flags, true, __func__);
}

NDM_API ndm_status ndm_manager_uncap(ndm_manager h, unsigned flags)
{
    return change_caps(h, flags, false, __func__);
}

NDM_API unsigned ndm_manager_caps(ndm_manager h)
{
    ndm__manager *m = ndm__manager_peek(h);
    if (!m)
        return 0;
    return (atomic_load_explicit(&m->state, memory_order_relaxed) >> NDM__CAP_SHIFT) &
           (NDM_CAP_ARRAYS | NDM_CAP_CHILDREN);
}

/* Sum of the bytes charged in the subtree of m on device slot dev; tree lock held. */
static int64_t subtree_bytes_locked(ndm__manager *m, int dev)
{
    ndm__mlock_take(m);
    int64_t sum = ndm__bytes_of(m, dev);
    ndm__mlock_drop(m);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        sum += subtree_bytes_locked(ndm__manager_slot(c), dev);
    return sum;
}

/* Point every manager of the subtree whose anchor is `old` at `anchor`. */
static void reanchor_locked(ndm__manager *m, uint32_t old, uint32_t anchor)
{
    if (atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != old)
        return; /* a limited manager below keeps its own anchor */
    atomic_store_explicit(&m->limit_anchor, anchor, memory_order_release);
    atomic_fetch_or_explicit(&m->state, NDM__M_LIMITED, memory_order_release);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        reanchor_locked(ndm__manager_slot(c), old, anchor);
}

NDM_API ndm_status ndm_manager_set_limit(ndm_manager h, ndm_device device, uint64_t bytes)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if ((device.type != NDM_DEVICE_CPU && device.type != NDM_DEVICE_CUDA) || device.index < 0 ||
        (device.type == NDM_DEVICE_CPU && device.index != 0) || device.index >= NDM__MAX_CUDA)
        return ndm__fail(NDM_E_DEVICE, __func__, NDM__NO_SITE, "not a device: type %d index %d",
                         (int)device.type, device.index);
    if (bytes > (uint64_t)INT64_MAX)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "limit %" PRIu64 " is too large",
                         bytes);
    if (ndm__alloc_device_check(device, __func__, NDM__NO_SITE) < 0)
        return ndm_last_status(); /* a limit on a missing device would never apply */
    int dev = ndm__device_slot(device);
    ndm__tree_lock();
    if (!m->limits) {
        ndm__limits *l = ndm__calloc(1, sizeof *l, NDM__INJ_RECORD);
        if (!l) {
            ndm__tree_unlock();
            return ndm__fail(NDM_E_OOM, __func__, NDM__NO_SITE, "no memory for a limit record");
        }
        for (int d = 0; d < NDM__MAX_DEVICES; d++)
            atomic_store_explicit(&l->used[d], subtree_bytes_locked(m, d), memory_order_relaxed);
        m->limits = l;
        uint32_t old = atomic_load_explicit(&m->limit_anchor, memory_order_relaxed);
        reanchor_locked(m, old, m->self);
    }
    atomic_store_explicit(&m->limits->limit[dev], bytes, memory_order_release);
    ndm__tree_unlock();
    return NDM_OK;
}

NDM_API uint64_t ndm_manager_limit(ndm_manager h, ndm_device device)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m || !m->limits || device.index < 0 || device.index >= NDM__MAX_CUDA)
        return 0;
    return atomic_load_explicit(&m->limits->limit[ndm__device_slot(device)], memory_order_relaxed);
}

/* Add hk to m, the manager of generation gen: checked under m's lock, where
 * a close sets CLOSING and later moves the generation on, so a hook never
 * joins a manager that is closing, closed, or a later one in the slot. */
static ndm_status add_hook(ndm__manager *m, uint32_t gen, ndm__hook *hk, const char *api,
                           ndm__site site)
{
    ndm__mlock_take(m);
    if (!ndm__manager_open_as(m, gen)) {
        /* (the name only while the record is still this manager's) */
        bool closing = atomic_load_explicit(&m->gen, memory_order_relaxed) == gen;
        char name[NDM__NAME_MAX] = "";
        if (closing)
            memcpy(name, m->name, sizeof name);
        ndm__mlock_drop(m);
        free(hk->name);
        free(hk);
        if (closing)
            return ndm__fail(NDM_E_CLOSED, api, site, "manager '%s' is closing", name);
        return ndm__fail(NDM_E_CLOSED, api, site, "the manager was closed meanwhile");
    }
    hk->next = m->hooks;
    m->hooks = hk;
    m->resources++;
    ndm__mlock_drop(m);
    return NDM_OK;
}

/* The manager a hook goes on (any but a built-in one, which never closes)
 * and its generation; the hook's callback, named fn_name, must be given. */
static ndm_status hook_target(ndm_manager h, bool has_fn, const char *fn_name, const char *api,
                              ndm__site site, ndm__manager **out, uint32_t *gen)
{
    ndm__manager *m = ndm__manager_get(h, api, site);
    if (!m)
        return ndm_last_status();
    *gen = ndm__manager_expected_gen(h, m);
    if (atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN)
        return ndm__fail(NDM_E_ROOT, api, site,
                         "the built-in manager '%s' never closes, so it cannot own resources",
                         m->name);
    if (!has_fn)
        return ndm__fail(NDM_E_INVALID, api, site, "%s is NULL", fn_name);
    *out = m;
    return NDM_OK;
}

/* A copy of proto on h's manager, with its own copy of name (NULL: none)
 * and the caller's site: what ndm_manager_own and ndm_manager_on_close do;
 * `what` names the record in the out-of-memory message. */
static ndm_status put_hook(ndm_manager h, bool has_fn, const char *fn_name, ndm__hook proto,
                           const char *name, const char *what, const char *api, ndm__site site)
{
    ndm__manager *m = NULL;
    uint32_t gen = 0;
    ndm_status st = hook_target(h, has_fn, fn_name, api, site, &m, &gen);
    if (st < 0)
        return st;
    ndm__hook *hk = ndm__calloc(1, sizeof *hk, NDM__INJ_OBJECT);
    char *nm = name && !ndm__inject(NDM__INJ_OBJECT) ? strdup(name) : NULL;
    if (!hk || (name && !nm)) {
        free(hk);
        free(nm);
        return ndm__fail(NDM_E_OOM, api, site, "no memory for a %s record", what);
    }
    *hk = proto;
    hk->name = nm;
    hk->site = site;
    return add_hook(m, gen, hk, api, site);
}

ndm_status ndm__manager_own_as(ndm_manager h, void *ptr, void (*free_fn)(void *ptr),
                               const char *name, const char *api, ndm__site site)
{
    return put_hook(h, free_fn != NULL, "free_fn", (ndm__hook){.free_fn = free_fn, .ptr = ptr},
                    name, "resource", api, site);
}

NDM_API ndm_status ndm_manager_own_at(NDM_SITE_PARAMS, ndm_manager h, void *ptr,
                                      void (*free_fn)(void *ptr), const char *name)
{
    return put_hook(h, free_fn != NULL, "free_fn", (ndm__hook){.free_fn = free_fn, .ptr = ptr},
                    name, "resource", __func__, NDM__SITE);
}

NDM_API ndm_status ndm_manager_on_close_at(NDM_SITE_PARAMS, ndm_manager h, ndm_close_fn fn,
                                           void *ud)
{
    return put_hook(h, fn != NULL, "fn", (ndm__hook){.close_fn = fn, .ptr = ud}, NULL, "hook",
                    __func__, NDM__SITE);
}

/* ---- queries -------------------------------------------------------------- */

NDM_API bool ndm_manager_valid(ndm_manager h) { return ndm__manager_peek(h) != NULL; }

NDM_API ndm_manager ndm_manager_parent(ndm_manager h)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return NDM_NULL_MANAGER;
    /* (under the tree lock: ndm_manager_move changes the pair) */
    ndm__tree_lock();
    ndm_manager p = m->parent ? ndm__manager_handle(m->parent, m->parent_gen) : NDM_NULL_MANAGER;
    ndm__tree_unlock();
    return p;
}

NDM_API ndm_device ndm_manager_device(ndm_manager h)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    /* (atomic: a close on another thread may hand the record to a new manager) */
    return m ? ndm__manager_device_of(m) : NDM_CPU;
}

static int copy_out(const char *s, char *buf, size_t n)
{
    size_t len = strlen(s);
    if (buf && n) {
        size_t k = len < n - 1 ? len : n - 1;
        memcpy(buf, s, k);
        buf[k] = '\0';
    }
    return (int)len;
}

NDM_API int ndm_manager_name(ndm_manager h, char *buf, size_t n)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    ndm__tree_lock();
    int len = copy_out(m->name, buf, n);
    ndm__tree_unlock();
    return len;
}

NDM_API int ndm_manager_path(ndm_manager h, char *buf, size_t n)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    char path[4096];
    ndm__manager_path(m->self, path, sizeof path);
    return copy_out(path, buf, n);
}

/* ---- re-parenting ----------------------------------------------------------- */

/* Is m `root` or below it? (tree lock held) */
static bool within(ndm__manager *root, ndm__manager *m)
{
    for (ndm__manager *x = m; x; x = x->parent ? ndm__manager_rec(x->parent) : NULL)
        if (x == root)
            return true;
    return false;
}

/* The slots of m's subtree into out (NULL: count only); tree lock held. */
static size_t subtree_slots(ndm__manager *m, uint32_t *out, size_t at)
{
    if (out)
        out[at] = m->self;
    at++;
    for (uint32_t c = m->first_child; c; c = ndm__manager_rec(c)->sib_next)
        at = subtree_slots(ndm__manager_rec(c), out, at);
    return at;
}

static int cmp_slot(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Point the managers of m's subtree whose anchor is `old` at `anchor`
 * (0: none; a manager with no limits of its own is then unlimited). */
static void repoint_locked(ndm__manager *m, uint32_t old, uint32_t anchor)
{
    if (atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != old)
        return; /* a limited manager below keeps its own anchor */
    atomic_store_explicit(&m->limit_anchor, anchor, memory_order_release);
    if (anchor)
        atomic_fetch_or_explicit(&m->state, NDM__M_LIMITED, memory_order_release);
    else
        atomic_fetch_and_explicit(&m->state, ~(unsigned)NDM__M_LIMITED, memory_order_release);
    for (uint32_t c = m->first_child; c; c = ndm__manager_rec(c)->sib_next)
        repoint_locked(ndm__manager_rec(c), old, anchor);
}

/* The move of child c under np, decided and made under the tree lock, which
 * every change of the tree's shape takes (creations, closes, limits): a
 * close is then either done (c or np is stale or closing: refused) or
 * starts after the move, and closes c only if c is below it now. The locks
 * of the subtree's managers are held as well (in slot order, after the
 * tree lock, as ndm_manager_set_limit takes them) while its bytes are
 * counted and the limits over it change, so that no array of it is
 * charged or given back meanwhile under the old limits. */
NDM_API ndm_status ndm_manager_move_at(NDM_SITE_PARAMS, ndm_manager child, ndm_manager new_parent)
{
    const char *api = __func__;
    ndm__site site = NDM__SITE;
    ndm__manager *c = ndm__manager_get(child, api, site);
    if (!c)
        return ndm_last_status();
    uint32_t cgen = ndm__manager_expected_gen(child, c);
    ndm__manager *np = ndm__manager_get(new_parent, api, site);
    if (!np)
        return ndm_last_status();
    uint32_t npgen = ndm__manager_expected_gen(new_parent, np);
    char cpath[512], ppath[512], why[1400];
    ndm_status st = NDM_OK;
    uint32_t *slots = NULL;
    size_t k = 0;
    ndm__tree_lock();
    unsigned cs = atomic_load_explicit(&c->state, memory_order_relaxed);
    unsigned ps = atomic_load_explicit(&np->state, memory_order_relaxed);
    ndm__manager_path_locked(c->self, cpath, sizeof cpath);
    ndm__manager_path_locked(np->self, ppath, sizeof ppath);
    if (atomic_load_explicit(&c->gen, memory_order_relaxed) != cgen ||
        atomic_load_explicit(&np->gen, memory_order_relaxed) != npgen) {
        st = NDM_E_CLOSED;
        snprintf(why, sizeof why, "the %s was closed meanwhile",
                 atomic_load_explicit(&c->gen, memory_order_relaxed) != cgen ? "manager"
                                                                             : "new parent");
    } else if (cs & NDM__M_BUILTIN) {
        st = NDM_E_ROOT;
        snprintf(why, sizeof why, "the built-in manager '%s' stays where it is", cpath);
    } else if (np->self == ndm__detached_slot) {
        st = NDM_E_ROOT;
        snprintf(why, sizeof why, "'%s' holds detached arrays only; '%s' refused", ppath, cpath);
    } else if ((cs & NDM__M_CLOSING) || !(cs & NDM__M_LIVE)) {
        st = NDM_E_CLOSED;
        snprintf(why, sizeof why, "manager '%s' is closing", cpath);
    } else if ((ps & NDM__M_CLOSING) || !(ps & NDM__M_LIVE)) {
        st = NDM_E_CLOSED;
        snprintf(why, sizeof why, "new parent '%s' is closing; '%s' refused", ppath, cpath);
    } else if (within(c, np)) {
        st = NDM_E_INVALID;
        snprintf(why, sizeof why, "'%s' cannot go under %s ('%s'): the tree would have a cycle",
                 cpath, np == c ? "itself" : "its own descendant", ppath);
    } else if (cs & NDM__M_SCOPE) {
        /* A scope ends into its enclosing scope or the parent it began
         * under: moving it would change where its kept results go. */
        st = NDM_E_INVALID;
        snprintf(why, sizeof why,
                 "'%s' is a scope: it ends where it began (move its results with ndm_scope_end)",
                 cpath);
    } else if (c->parent == np->self) {
        st = NDM_OK; /* already there */
    } else if (ps & NDM__M_CAP_CHILDREN) {
        st = NDM_E_CAPPED;
        snprintf(why, sizeof why,
                 "manager '%s' refuses new children (capped with NDM_CAP_CHILDREN); '%s' refused",
                 ppath, cpath);
    } else {
        k = subtree_slots(c, NULL, 0);
        slots = malloc(k * sizeof *slots);
        if (!slots) {
            st = NDM_E_OOM;
            snprintf(why, sizeof why, "no memory to move the %zu managers of '%s'", k, cpath);
        }
    }
    if (st != NDM_OK || !slots) {
        ndm__tree_unlock();
        return st == NDM_OK ? st : ndm__fail(st, api, site, "%s", why);
    }
    subtree_slots(c, slots, 0);
    qsort(slots, k, sizeof *slots, cmp_slot);
    for (size_t j = 0; j < k; j++)
        ndm__mlock_take(ndm__manager_rec(slots[j]));
    /* The subtree's bytes, with the reservations of creations in progress
     * (counted in the old limits already), by device. */
    int64_t bytes[NDM__MAX_DEVICES] = {0};
    for (size_t j = 0; j < k; j++) {
        ndm__manager *x = ndm__manager_rec(slots[j]);
        for (uint32_t used = atomic_load_explicit(&x->dev_used, memory_order_relaxed); used;
             used &= used - 1) {
            int d = __builtin_ctz(used);
            bytes[d] += ndm__bytes_of(x, d) + x->count[d].reserved;
        }
    }
    ndm__manager *op = ndm__manager_rec(c->parent);
    uint32_t oa = atomic_load_explicit(&op->limit_anchor, memory_order_relaxed);
    uint32_t na = atomic_load_explicit(&np->limit_anchor, memory_order_relaxed);
    ndm__quota_miss miss = {0};
    int d = 0;
    if (oa != na) {
        /* the limits np brings over c take its bytes, those it leaves give them up */
        for (; d < NDM__MAX_DEVICES; d++)
            if (bytes[d] && ndm__charge_reserve(op, np, d, bytes[d], &miss) < 0) {
                st = NDM_E_QUOTA;
                while (d-- > 0)
                    if (bytes[d])
                        ndm__charge_unreserve(op, np, d, bytes[d]);
                break;
            }
        if (st == NDM_OK)
            for (d = 0; d < NDM__MAX_DEVICES; d++)
                if (bytes[d])
                    ndm__charge_unreserve(np, op, d, bytes[d]);
    }
    if (st == NDM_OK) {
        if (oa != na)
            repoint_locked(c, oa, na);
        sibling_unlink(op, c);
        c->sib_prev = 0;
        c->sib_next = np->first_child;
        if (np->first_child)
            ndm__manager_rec(np->first_child)->sib_prev = c->self;
        np->first_child = c->self;
        np->children++;
        /* (atomic: read without c's lock by ndm_ret's first look, and by
         * the walks of limits above a limited c) */
        __atomic_store_n(&c->parent, np->self, __ATOMIC_RELAXED);
        c->parent_gen = npgen;
    }
    for (size_t j = k; j-- > 0;)
        ndm__mlock_drop(ndm__manager_rec(slots[j]));
    free(slots);
    ndm__tree_unlock();
    if (st == NDM_E_QUOTA) {
        miss.bytes = bytes[miss.dev];
        char lpath[512], devs[32];
        ndm__manager_path(miss.slot, lpath, sizeof lpath);
        ndm_device_str(ndm__slot_device(miss.dev), devs, sizeof devs);
        return ndm__fail(NDM_E_QUOTA, api, site,
                         "the %" PRId64 " bytes of '%s' on %s would exceed the limit of manager "
                         "'%s' (limit %" PRIu64 ", in use %" PRId64 "); nothing moved",
                         miss.bytes, cpath, devs, lpath, miss.limit, miss.used);
    }
    return NDM_OK;
}
