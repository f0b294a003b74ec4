/* The object table: one slot per owned object, a generation per slot, and
 * a hook on the owner's close. Ids carry bit 31 of the low word, which no
 * array slot has, so an object handle is never taken for an array. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "object.h"

#define OBJ_TAG (UINT64_C(1) << 31)
#define GEN_MASK 0x7fffffffu

typedef struct obj_slot {
    uint32_t gen;
    const ndm__object_type *type;
    void *obj;                 /* NULL when free */
    ndm__site site;            /* where it was made (kept after death) */
    ndm__site died;            /* where it was freed, or none for its owner's close */
    char owner[120];           /* the owner's path, for messages after its close */
    ndm_manager owner_h;       /* the owner itself */
    uint32_t next_free;        /* slot + 1, 0: none */
} obj_slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static obj_slot *slots;
static uint32_t nslots, cap, free_head;

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

/* Retire a slot (lock held): the object is returned for destroying. */
static void *retire(uint32_t s, ndm__site died)
{
    obj_slot *r = &slots[s];
    void *obj = r->obj;
    r->obj = NULL;
    r->died = died;
    uint32_t g = (r->gen + 1) & GEN_MASK;
    r->gen = g ? g : 1;
    r->next_free = free_head;
    free_head = s + 1;
    return obj;
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
    if (s < nslots && slots[s].gen == gen && slots[s].obj) {
        type = slots[s].type;
        obj = retire(s, NDM__NO_SITE);
    }
    pthread_mutex_unlock(&lock);
    if (obj)
        type->destroy(obj);
    return 0;
}

uint64_t ndm__object_new(const ndm__object_type *type, ndm_manager owner, void *obj,
                         ndm__site site, const char *api)
{
    _Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "ids travel as hook arguments");
    char path[sizeof slots->owner];
    ndm__manager *om = ndm__manager_get(owner, api, site);
    if (!om)
        return 0;
    owner = ndm__manager_resolved(owner, api, site);
    if (ndm_manager_path(owner, path, sizeof path) < 0)
        return 0;
    pthread_mutex_lock(&lock);
    uint32_t s;
    if (free_head) {
        s = free_head - 1;
        free_head = slots[s].next_free;
    } else {
        if (nslots == cap) {
            uint32_t c = cap ? cap * 2 : 64;
            obj_slot *p =
                c < (1u << 30) ? ndm__realloc(slots, c * sizeof *p, NDM__INJ_OBJECT) : NULL;
            if (!p) {
                pthread_mutex_unlock(&lock);
                ndm__fail(NDM_E_OOM, api, site, "no memory for an object record");
                return 0;
            }
            slots = p;
            cap = c;
        }
        s = nslots++;
        memset(&slots[s], 0, sizeof slots[s]);
        slots[s].gen = 1;
    }
    obj_slot *r = &slots[s];
    r->type = type;
    r->obj = obj;
    r->site = site;
    r->died = NDM__NO_SITE;
    memcpy(r->owner, path, sizeof path);
    r->owner_h = owner;
    uint64_t id = make_id(s, r->gen);
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
    pthread_mutex_lock(&lock);
    if (!decode(id, &s, &gen) || s >= nslots) {
        pthread_mutex_unlock(&lock);
        ndm__fail(NDM_E_INVALID, api, site, "not a %s handle (id 0x%016" PRIx64 ")", type->name,
                  id);
        return NULL;
    }
    obj_slot *r = &slots[s];
    if (r->gen == gen && r->obj && r->type == type) {
        void *obj = r->obj;
        pthread_mutex_unlock(&lock);
        return obj;
    }
    uint32_t next = (gen + 1) & GEN_MASK;
    bool known = r->gen == (next ? next : 1) && !r->obj;
    const ndm__object_type *t = r->type;
    ndm__site made = r->site, died = r->died;
    char m[256], d[256], owner[sizeof r->owner];
    memcpy(owner, r->owner, sizeof owner);
    pthread_mutex_unlock(&lock);
    if (r->gen == gen && r->obj && t != type)
        ndm__fail(NDM_E_INVALID, api, site, "the handle is a %s, not a %s", t->name, type->name);
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
    if (!decode(id, &s, &gen))
        return false;
    pthread_mutex_lock(&lock);
    bool ok = s < nslots && slots[s].gen == gen && slots[s].obj && slots[s].type == type;
    pthread_mutex_unlock(&lock);
    return ok;
}

ndm_status ndm__object_free(uint64_t id, const ndm__object_type *type, const char *api,
                            ndm__site site)
{
    uint32_t s, gen;
    if (!id)
        return ndm__fail_null(api, site, type->name);
    if (!decode(id, &s, &gen))
        return ndm__fail(NDM_E_INVALID, api, site, "not a %s handle", type->name);
    pthread_mutex_lock(&lock);
    if (s >= nslots || slots[s].gen != gen || !slots[s].obj) {
        pthread_mutex_unlock(&lock);
        return NDM_ALREADY;
    }
    if (slots[s].type != type) {
        const char *tn = slots[s].type->name;
        pthread_mutex_unlock(&lock);
        return ndm__fail(NDM_E_INVALID, api, site, "the handle is a %s, not a %s", tn,
                         type->name);
    }
    void *obj = retire(s, site);
    pthread_mutex_unlock(&lock);
    type->destroy(obj);
    return NDM_OK;
}

ndm_manager ndm__object_owner(uint64_t id)
{
    uint32_t s, gen;
    ndm_manager owner = NDM_NULL_MANAGER;
    if (!decode(id, &s, &gen))
        return owner;
    pthread_mutex_lock(&lock);
    if (s < nslots && slots[s].gen == gen && slots[s].obj)
        owner = slots[s].owner_h;
    pthread_mutex_unlock(&lock);
    return owner;
}
