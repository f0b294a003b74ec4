/* The object table: one slot per owned object, a generation per slot, and
 * a hook on the owner's close. Ids carry bit 31 of the low word, which no
 * array slot has, so an object handle is never taken for an array. */
#include <inttypes.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "object.h"
#include "reclaim.h"

#define OBJ_TAG (UINT64_C(1) << 31)
#define GEN_MASK 0x7fffffffu

/* Slots live in chunks that are never moved or freed, so a lookup reads a
 * slot without the lock: its generation, then the object and its type,
 * then the generation again. A retire clears the object before it moves
 * the generation on, and a new object is stored after both, so a lookup
 * that sees the same generation twice saw that generation's object. The
 * rest of a slot (sites, owner) is read and written under the lock. */
#define OBJ_CHUNK_BITS 8
#define OBJ_CHUNK (1u << OBJ_CHUNK_BITS)
#define OBJ_MAX_CHUNKS 4096u

typedef struct obj_slot {
    _Atomic uint32_t gen;
    _Atomic(const ndm__object_type *) type;
    _Atomic(void *) obj;       /* NULL when free */
    ndm__site site;            /* where it was made (kept after death) */
    ndm__site died;            /* where it was freed, or none for its owner's close */
    char owner[120];           /* the owner's path, for messages after its close */
    ndm_manager owner_h;       /* the owner itself */
    uint32_t next_free;        /* slot + 1, 0: none */
} obj_slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(obj_slot *) chunks[OBJ_MAX_CHUNKS];
static _Atomic uint32_t high; /* slots below it have their chunk */
static uint32_t free_head;    /* under the lock */

static obj_slot *rec(uint32_t s)
{
    return &atomic_load_explicit(&chunks[s >> OBJ_CHUNK_BITS],
                                 memory_order_acquire)[s & (OBJ_CHUNK - 1)];
}

static uint64_t make_id(uint32_t slot, uint32_t gen)
{
    return (uint64_t)gen << 32 | OBJ_TAG | (slot + 1);
}

static bool decode(uint64_t id, uint32_t *slot, uint32_t *gen)
{
    uint32_t low = (uint32_t)id;
    if ((id >> 63) || !(low & OBJ_TAG) || !(low & ~(uint32_t)OBJ_TAG))
        return false;
    *slot = (low & ~(uint32_t)OBJ_TAG) - 1;
    *gen = (uint32_t)(id >> 32) & GEN_MASK;
    return *gen != 0;
}

/* The live object behind slot s at generation gen with this type, or NULL;
 * no lock. */
static void *peek(uint32_t s, uint32_t gen, const ndm__object_type *type)
{
    if (s >= atomic_load_explicit(&high, memory_order_acquire))
        return NULL;
    obj_slot *r = rec(s);
    if (atomic_load_explicit(&r->gen, memory_order_acquire) != gen)
        return NULL;
    void *obj = atomic_load_explicit(&r->obj, memory_order_acquire);
    const ndm__object_type *t = atomic_load_explicit(&r->type, memory_order_acquire);
    if (!obj || t != type || atomic_load_explicit(&r->gen, memory_order_acquire) != gen)
        return NULL;
    return obj;
}

/* Retire a slot (lock held): the object is returned for destroying. */
static void *retire(uint32_t s, ndm__site died)
{
    obj_slot *r = rec(s);
    void *obj = atomic_load_explicit(&r->obj, memory_order_relaxed);
    atomic_store_explicit(&r->obj, NULL, memory_order_relaxed);
    r->died = died;
    uint32_t g = (atomic_load_explicit(&r->gen, memory_order_relaxed) + 1) & GEN_MASK;
    atomic_store_explicit(&r->gen, g ? g : 1, memory_order_release);
    r->next_free = free_head;
    free_head = s + 1;
    return obj;
}

/* The live object of slot s at gen (lock held), whatever its type. */
static obj_slot *live_locked(uint32_t s, uint32_t gen)
{
    if (s >= atomic_load_explicit(&high, memory_order_relaxed))
        return NULL;
    obj_slot *r = rec(s);
    return atomic_load_explicit(&r->gen, memory_order_relaxed) == gen &&
                   atomic_load_explicit(&r->obj, memory_order_relaxed)
               ? r
               : NULL;
}

static void destroy_later(void *obj, uintptr_t type)
{
    ((const ndm__object_type *)type)->destroy(obj);
}

/* Destroy a retired object, or queue that while another thread may be in an
 * operation that looked it up before it was retired. */
static void destroy(const ndm__object_type *type, void *obj)
{
    if (type->retire)
        type->retire(obj);
    if (type->later && atomic_load_explicit(&ndm__multi, memory_order_relaxed))
        ndm__defer(destroy_later, obj, (uintptr_t)type);
    else
        type->destroy(obj);
}

/* The owner's close: destroy the object if its handle is still live. */
static int on_owner_close(void *ud)
{
    uint64_t id = (uint64_t)(uintptr_t)ud;
    uint32_t s, gen;
    if (!decode(id, &s, &gen))
        return 0;
    pthread_mutex_lock(&lock);
    void *obj = NULL;
    const ndm__object_type *type = NULL;
    obj_slot *r = live_locked(s, gen);
    if (r) {
        type = atomic_load_explicit(&r->type, memory_order_relaxed);
        obj = retire(s, NDM__NO_SITE);
    }
    pthread_mutex_unlock(&lock);
    if (obj)
        destroy(type, obj);
    return 0;
}

/* A slot for a new object (lock held), or UINT32_MAX when no memory. */
static uint32_t take_slot(void)
{
    if (free_head) {
        uint32_t s = free_head - 1;
        free_head = rec(s)->next_free;
        return s;
    }
    uint32_t s = atomic_load_explicit(&high, memory_order_relaxed), c = s >> OBJ_CHUNK_BITS;
    if (c >= OBJ_MAX_CHUNKS)
        return UINT32_MAX;
    if (!atomic_load_explicit(&chunks[c], memory_order_relaxed)) {
        obj_slot *p = ndm__calloc(OBJ_CHUNK, sizeof *p, NDM__INJ_OBJECT);
        if (!p)
            return UINT32_MAX;
        for (uint32_t i = 0; i < OBJ_CHUNK; i++)
            atomic_init(&p[i].gen, 1);
        atomic_store_explicit(&chunks[c], p, memory_order_release);
    }
    atomic_store_explicit(&high, s + 1, memory_order_release);
    return s;
}

uint64_t ndm__object_new(const ndm__object_type *type, ndm_manager owner, void *obj,
                         ndm__site site, const char *api)
{
    _Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "ids travel as hook arguments");
    char path[sizeof ((obj_slot *)0)->owner];
    ndm__manager *om = ndm__manager_get(owner, api, site);
    if (!om)
        return 0;
    owner = ndm__manager_resolved(owner, api, site);
    if (ndm_manager_path(owner, path, sizeof path) < 0)
        return 0;
    pthread_mutex_lock(&lock);
    uint32_t s = take_slot();
    if (s == UINT32_MAX) {
        pthread_mutex_unlock(&lock);
        ndm__fail(NDM_E_OOM, api, site, "no memory for an object record");
        return 0;
    }
    obj_slot *r = rec(s);
    r->site = site;
    r->died = NDM__NO_SITE;
    memcpy(r->owner, path, sizeof path);
    r->owner_h = owner;
    /* the type, then the object: a lookup that sees either sees this generation */
    atomic_store_explicit(&r->type, type, memory_order_release);
    atomic_store_explicit(&r->obj, obj, memory_order_release);
    uint64_t id = make_id(s, atomic_load_explicit(&r->gen, memory_order_relaxed));
    pthread_mutex_unlock(&lock);
    if (ndm_manager_on_close_at(NDM__SITE_ARGS(site), owner, on_owner_close,
                                (void *)(uintptr_t)id) != NDM_OK) {
        pthread_mutex_lock(&lock);
        retire(s, site); /* the caller keeps obj */
        pthread_mutex_unlock(&lock);
        return 0;
    }
    return id;
}

void *ndm__object_get(uint64_t id, const ndm__object_type *type, const char *api,
                      ndm__site site)
{
    if (!id) {
        ndm__fail_null(api, site, type->name);
        return NULL;
    }
    uint32_t s, gen;
    bool ok = decode(id, &s, &gen);
    void *obj = ok ? peek(s, gen, type) : NULL;
    if (NDM__LIKELY(obj != NULL))
        return obj;
    /* Not live (or changing meanwhile): look again under the lock, and say why. */
    pthread_mutex_lock(&lock);
    if (!ok || s >= atomic_load_explicit(&high, memory_order_relaxed)) {
        pthread_mutex_unlock(&lock);
        ndm__fail(NDM_E_INVALID, api, site, "not a %s handle (id 0x%016" PRIx64 ")", type->name,
                  id);
        return NULL;
    }
    obj_slot *r = rec(s);
    uint32_t now = atomic_load_explicit(&r->gen, memory_order_relaxed);
    const ndm__object_type *t = atomic_load_explicit(&r->type, memory_order_relaxed);
    obj = atomic_load_explicit(&r->obj, memory_order_relaxed);
    if (now == gen && obj && t == type) {
        pthread_mutex_unlock(&lock);
        return obj;
    }
    uint32_t next = (gen + 1) & GEN_MASK;
    bool known = now == (next ? next : 1) && !obj;
    bool other_type = now == gen && obj && t != type;
    /* a generation ahead of the slot's, or its own while empty: never issued */
    bool issued = now == gen ? obj != NULL : ndm__gen_stale(gen, now);
    ndm__site made = r->site, died = r->died;
    char m[256], d[256], owner[sizeof r->owner];
    memcpy(owner, r->owner, sizeof owner);
    pthread_mutex_unlock(&lock);
    if (other_type)
        ndm__fail(NDM_E_INVALID, api, site, "the handle is a %s, not a %s", t->name, type->name);
    else if (!issued)
        ndm__fail(NDM_E_INVALID, api, site,
                  "not a %s handle: id 0x%016" PRIx64 " was never issued", type->name, id);
    else if (!known)
        ndm__fail(NDM_E_CLOSED, api, site,
                  "stale %s handle: it was freed and its slot has been reused since", type->name);
    else if (died.file)
        ndm__fail(NDM_E_CLOSED, api, site, "stale %s handle: the %s made at %s was %s at %s",
                  type->name, type->name, ndm__site_str(made, m, sizeof m), type->ended,
                  ndm__site_str(died, d, sizeof d));
    else
        ndm__fail(NDM_E_CLOSED, api, site,
                  "stale %s handle: the %s made at %s was freed when its manager '%s' was closed",
                  type->name, type->name, ndm__site_str(made, m, sizeof m), owner);
    return NULL;
}

bool ndm__object_valid(uint64_t id, const ndm__object_type *type)
{
    uint32_t s, gen;
    return decode(id, &s, &gen) && peek(s, gen, type);
}

ndm_status ndm__object_free(uint64_t id, const ndm__object_type *type, const char *api,
                            ndm__site site)
{
    uint32_t s, gen;
    if (!id)
        return ndm__fail_null(api, site, type->name);
    if (!decode(id, &s, &gen))
        return ndm__fail(NDM_E_INVALID, api, site, "not a %s handle (id 0x%016" PRIx64 ")",
                         type->name, id);
    pthread_mutex_lock(&lock);
    obj_slot *r = live_locked(s, gen);
    if (!r) {
        /* freed before (NDM_ALREADY), or never issued */
        bool stale = s < atomic_load_explicit(&high, memory_order_relaxed) &&
                     ndm__gen_stale(gen, atomic_load_explicit(&rec(s)->gen, memory_order_relaxed));
        pthread_mutex_unlock(&lock);
        if (stale)
            return NDM_ALREADY;
        return ndm__fail(NDM_E_INVALID, api, site,
                         "not a %s handle: id 0x%016" PRIx64 " was never issued", type->name, id);
    }
    const ndm__object_type *t = atomic_load_explicit(&r->type, memory_order_relaxed);
    if (t != type) {
        pthread_mutex_unlock(&lock);
        return ndm__fail(NDM_E_INVALID, api, site, "the handle is a %s, not a %s", t->name,
                         type->name);
    }
    void *obj = retire(s, site);
    pthread_mutex_unlock(&lock);
    destroy(type, obj);
    ndm__reclaim_maybe();
    return NDM_OK;
}

ndm_manager ndm__object_owner(uint64_t id)
{
    uint32_t s, gen;
    ndm_manager owner = NDM_NULL_MANAGER;
    if (!decode(id, &s, &gen))
        return owner;
    pthread_mutex_lock(&lock);
    obj_slot *r = live_locked(s, gen);
    if (r)
        owner = r->owner_h;
    pthread_mutex_unlock(&lock);
    return owner;
}
