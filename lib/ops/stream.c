/* Streams and events: handles over the backends' own streams and events, owned
 * by managers, the per-thread current stream, and record_stream for arrays. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "ndm/stream.h"
#include "stream_hook.h"

/* ---- handles ---------------------------------------------------------------------
 * A default stream is named by its device: the top bit set, the device type
 * and index below. Other handles pack a slot (low 30 bits, from 1) and its
 * generation, as arrays' do, with bit 30 set, which no array slot and no
 * object id has (those carry bit 31): an array or module handle is never
 * taken for a stream or event of the same slot. The table is small and its
 * calls are not hot: one mutex guards it, and it is read only under it. */

#define DEFAULT_BIT ((uint64_t)1 << 63)
#define STREAM_TAG (UINT32_C(1) << 30)
#define OTHER_TAG (UINT32_C(1) << 31)

enum { KIND_FREE = 0, KIND_STREAM = 1, KIND_EVENT = 2 };

typedef struct record {
    uint32_t gen;
    uint8_t kind;
    ndm_device device;
    void *obj;          /* the backend's stream or event; NULL on the CPU */
    uint64_t owner;     /* manager handle id */
    uint64_t id;        /* the handle, as slot_drop returns it */
    uint32_t next_free;
} record;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static record *table;      /* slot 0 unused */
static uint32_t table_len, table_cap, free_head;
/* Managers with the one close hook that releases their streams and events. */
static uint64_t *hooked;
static size_t nhooked, hooked_cap;

static uint64_t pack(uint32_t slot, uint32_t gen)
{
    return (uint64_t)gen << 32 | STREAM_TAG | slot;
}

static ndm_stream default_of(ndm_device d)
{
    return (ndm_stream){DEFAULT_BIT | (uint64_t)((unsigned)d.type & 0xff) << 16 |
                        (uint64_t)(d.index & 0xffff)};
}

/* A looked-up handle, copied out of the table. */
typedef struct found {
    ndm_device device;
    void *obj;
    bool is_default;
} found;

static const char *kind_name(int kind) { return kind == KIND_STREAM ? "stream" : "event"; }

/* The slot of a handle that has the stream table's tag, or 0. */
static uint32_t slot_of(uint64_t id)
{
    uint32_t low = (uint32_t)id;
    return (low & (STREAM_TAG | OTHER_TAG)) == STREAM_TAG ? low & ~STREAM_TAG : 0;
}

/* Why a handle does not name a live record of `kind` (lock held):
 * NDM_E_CLOSED for one issued and released since, NDM_E_INVALID for one
 * never issued (a forged generation, another table's id) or of the other
 * kind. */
static ndm_status classify(uint64_t id, int kind)
{
    uint32_t slot = slot_of(id), gen = (uint32_t)(id >> 32);
    if (!slot || slot >= table_len || !gen)
        return NDM_E_INVALID;
    if (gen != table[slot].gen)
        return ndm__gen_stale(gen, table[slot].gen) ? NDM_E_CLOSED : NDM_E_INVALID;
    return table[slot].kind == kind ? NDM_OK : NDM_E_INVALID;
}

/* The record of handle `id` of `kind` (a default stream too, for streams),
 * copied out. NDM_E_NULL for the null handle (an earlier error stays),
 * NDM_E_CLOSED for a released one, NDM_E_INVALID for one never issued or of
 * the other kind; recorded for `api`, unless api is NULL. */
static ndm_status lookup(uint64_t id, int kind, const char *api, found *out)
{
    if (!id)
        return api ? ndm__fail_null(api, NDM__NO_SITE, kind_name(kind)) : NDM_E_NULL;
    ndm_status st = NDM_OK;
    if (id & DEFAULT_BIT) {
        ndm_device d = {(ndm_device_type)((id >> 16) & 0xff), (int)(id & 0xffff)};
        if (kind != KIND_STREAM || (id & ~(DEFAULT_BIT | 0xffffffull)) ||
            (d.type != NDM_DEVICE_CPU && d.type != NDM_DEVICE_CUDA))
            st = NDM_E_INVALID;
        else if ((d.type != NDM_DEVICE_CPU || d.index != 0) && api &&
                 ndm__alloc_device_check(d, api, NDM__NO_SITE) < 0)
            return ndm_last_status(); /* a device this process lacks */
        else
            *out = (found){d, NULL, true};
    } else {
        uint32_t slot = slot_of(id);
        pthread_mutex_lock(&table_lock);
        st = classify(id, kind);
        if (st == NDM_OK)
            *out = (found){table[slot].device, table[slot].obj, false};
        pthread_mutex_unlock(&table_lock);
    }
    if (st == NDM_OK || !api)
        return st;
    if (st == NDM_E_CLOSED)
        return ndm__fail(st, api, NDM__NO_SITE,
                         "the %s was released (explicitly or with its manager)", kind_name(kind));
    return ndm__fail(st, api, NDM__NO_SITE, "%#llx is not a %s handle of this process",
                     (unsigned long long)id, kind_name(kind));
}

static uint32_t slot_take(void)
{
    if (free_head) {
        uint32_t s = free_head;
        free_head = table[s].next_free;
        return s;
    }
    if (table_len == table_cap) {
        if (table_cap >= STREAM_TAG / 2)
            return 0;
        uint32_t cap = table_cap ? 2 * table_cap : 64;
        record *t = realloc(table, cap * sizeof *t);
        if (!t)
            return 0;
        memset(t + table_cap, 0, (cap - table_cap) * sizeof *t);
        table = t;
        table_cap = cap;
        if (!table_len)
            table_len = 1;
    }
    return table_len++;
}

/* ---- the backend side ---------------------------------------------------------------- */

static const ndm__backend_streams *streams_of(ndm_device d)
{
    const ndm__backend *b = ndm__backend_for(d.type);
    return b ? b->streams : NULL;
}

static ndm_status backend_failed(ndm_status st, const char *api, const char *what)
{
    char why[768];
    snprintf(why, sizeof why, "%s",
             ndm_last_status() == st && ndm_last_error()[0] ? ndm_last_error()
                                                            : ndm_status_str(st));
    return ndm__fail(st, api, NDM__NO_SITE, "%s failed: %s", what, why);
}

static void backend_release_now(int kind, ndm_device d, void *obj)
{
    const ndm__backend_streams *bs = streams_of(d);
    if (!bs || !obj)
        return;
    if (kind == KIND_STREAM)
        bs->stream_release(d.index, obj);
    else
        bs->event_release(d.index, obj);
}

static void backend_release_later(void *obj, uintptr_t packed)
{
    ndm_device d = {(ndm_device_type)((packed >> 8) & 0xff), (int)(packed >> 16)};
    backend_release_now((int)(packed & 0xff), d, obj);
}

/* Release a dropped stream or event's backend object: later, once several
 * threads use ndm, since another thread's call may have looked it up just
 * before (reclaim.h). */
static void backend_release(int kind, ndm_device d, void *obj)
{
    if (obj && atomic_load_explicit(&ndm__multi, memory_order_relaxed))
        ndm__defer(backend_release_later, obj,
                   (uintptr_t)kind | (uintptr_t)(d.type & 0xff) << 8 | (uintptr_t)d.index << 16);
    else
        backend_release_now(kind, d, obj);
}

/* The calling thread's current stream per device slot, as handles (0: the
 * default). The allocator and the backend keep their own copies of the
 * backend's value. */
static _Thread_local uint64_t current[1 + 16];

static int current_slot(ndm_device d)
{
    if (d.type == NDM_DEVICE_CPU && d.index == 0)
        return 0;
    if (d.type == NDM_DEVICE_CUDA && d.index >= 0 && d.index < 16)
        return 1 + d.index;
    return -1;
}

/* A stream released on this thread stops being its current one. */
static void forget_current(ndm_device d, uint64_t id)
{
    int k = current_slot(d);
    if (k < 0 || current[k] != id)
        return;
    current[k] = 0;
    const ndm__backend_streams *bs = streams_of(d);
    if (bs)
        bs->stream_set_current(d.index, NULL);
    ndm__alloc_set_stream(d, 0);
}

/* Free slot `slot` (lock held); returns what the backend must release. */
static record slot_drop(uint32_t slot)
{
    record r = table[slot];
    r.id = pack(slot, r.gen);
    table[slot].kind = KIND_FREE;
    table[slot].obj = NULL;
    table[slot].owner = 0;
    if (++table[slot].gen == 0 || table[slot].gen > 0x7fffffffu)
        table[slot].gen = 1;
    table[slot].next_free = free_head;
    free_head = slot;
    return r;
}

/* The close hook of a manager: every stream and event it owns goes. */
static int release_owned(void *ud)
{
    uint64_t owner = (uint64_t)(uintptr_t)ud;
    record *drop = NULL;
    size_t ndrop = 0, cap = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < nhooked; i++) {
        if (hooked[i] == owner) {
            hooked[i] = hooked[--nhooked];
            break;
        }
    }
    for (uint32_t s = 1; s < table_len; s++) {
        if (table[s].kind == KIND_FREE || table[s].owner != owner)
            continue;
        if (ndrop == cap) {
            size_t c = cap ? 2 * cap : 8;
            record *d = realloc(drop, c * sizeof *d);
            if (!d) {
                /* no room for the list: release under the lock */
                record r = slot_drop(s);
                backend_release(r.kind, r.device, r.obj);
                continue;
            }
            drop = d;
            cap = c;
        }
        drop[ndrop++] = slot_drop(s);
    }
    pthread_mutex_unlock(&table_lock);
    for (size_t i = 0; i < ndrop; i++) {
        if (drop[i].kind == KIND_STREAM)
            forget_current(drop[i].device, drop[i].id);
        backend_release(drop[i].kind, drop[i].device, drop[i].obj);
    }
    free(drop);
    return 0;
}

/* Make a stream or event under manager m into *out (NDM_E_INVALID for a
 * NULL out). */
static ndm_status make(ndm_manager m, int kind, uint64_t *out, const char *api)
{
    if (!out)
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE, "out is NULL");
    *out = 0;
    ndm__manager *mr = ndm__manager_get(m, api, NDM__NO_SITE);
    if (!mr)
        return ndm_last_status();
    ndm_device d = ndm__manager_device_of(mr);
    const ndm__backend_streams *bs = streams_of(d);
    void *obj = NULL;
    if (bs) {
        ndm_status st = kind == KIND_STREAM ? bs->stream_new(d.index, &obj)
                                            : bs->event_new(d.index, &obj);
        if (st < 0)
            return backend_failed(st, api, kind == KIND_STREAM ? "creating a stream"
                                                               : "creating an event");
    }
    pthread_mutex_lock(&table_lock);
    bool known = false;
    for (size_t i = 0; i < nhooked && !known; i++)
        known = hooked[i] == m.id;
    bool room = known || nhooked < hooked_cap;
    if (!room) {
        size_t cap = hooked_cap ? 2 * hooked_cap : 16;
        uint64_t *h = realloc(hooked, cap * sizeof *h);
        if (h) {
            hooked = h;
            hooked_cap = cap;
            room = true;
        }
    }
    uint32_t slot = room ? slot_take() : 0;
    if (slot) {
        table[slot].kind = (uint8_t)kind;
        if (!table[slot].gen)
            table[slot].gen = 1;
        table[slot].device = d;
        table[slot].obj = obj;
        table[slot].owner = m.id;
        if (!known)
            hooked[nhooked++] = m.id;
    }
    /* read under the lock: another thread's make may move the table */
    uint64_t id = slot ? pack(slot, table[slot].gen) : 0;
    pthread_mutex_unlock(&table_lock);
    if (!slot) {
        backend_release(kind, d, obj);
        return ndm__fail(NDM_E_OOM, api, NDM__NO_SITE, "no memory for a %s record",
                         kind_name(kind));
    }
    if (!known) {
        /* One hook per manager, made with its first stream or event; it
         * refuses system, detached and closing managers. */
        ndm_status st = ndm_manager_on_close_at(__FILE__, __LINE__, api, m, release_owned,
                                                (void *)(uintptr_t)m.id);
        if (st < 0) {
            pthread_mutex_lock(&table_lock);
            for (size_t i = 0; i < nhooked; i++) {
                if (hooked[i] == m.id) {
                    hooked[i] = hooked[--nhooked];
                    break;
                }
            }
            record r = slot_drop(slot);
            pthread_mutex_unlock(&table_lock);
            backend_release(kind, r.device, r.obj);
            char path[256];
            ndm_manager_path(m, path, sizeof path);
            return ndm__fail(st, api, NDM__NO_SITE, "manager '%s' cannot own a %s: %s", path,
                             kind_name(kind), ndm_status_str(st));
        }
    }
    *out = id;
    return NDM_OK;
}

static ndm_status release(uint64_t id, int kind, const char *api)
{
    if (!id)
        return ndm__fail_null(api, NDM__NO_SITE, kind_name(kind));
    if (id & DEFAULT_BIT) {
        found f;
        if (lookup(id, kind, api, &f) < 0)
            return ndm_last_status();
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE,
                         "a device's default stream is never released");
    }
    uint32_t slot = slot_of(id);
    pthread_mutex_lock(&table_lock);
    ndm_status st = classify(id, kind);
    if (st < 0) {
        pthread_mutex_unlock(&table_lock);
        if (st == NDM_E_CLOSED)
            return NDM_ALREADY;
        return ndm__fail(st, api, NDM__NO_SITE, "%#llx is not a %s handle of this process",
                         (unsigned long long)id, kind_name(kind));
    }
    record r = slot_drop(slot);
    pthread_mutex_unlock(&table_lock);
    if (kind == KIND_STREAM)
        forget_current(r.device, id);
    backend_release(kind, r.device, r.obj);
    ndm__reclaim_maybe();
    return NDM_OK;
}

/* ---- streams ------------------------------------------------------------------------- */

NDM_API ndm_stream ndm_stream_default(ndm_device device)
{
    NDM__OP_GUARD();
    if (ndm__alloc_device_check(device, __func__, NDM__NO_SITE) < 0)
        return (ndm_stream){0};
    return default_of(device);
}

NDM_API ndm_status ndm_stream_new(ndm_manager m, ndm_stream *out)
{
    NDM__OP_GUARD();
    return make(m, KIND_STREAM, out ? &out->id : NULL, __func__);
}

NDM_API ndm_status ndm_stream_release(ndm_stream s) { return release(s.id, KIND_STREAM, __func__); }

NDM_API ndm_device ndm_stream_device(ndm_stream s)
{
    NDM__OP_GUARD();
    found f;
    return lookup(s.id, KIND_STREAM, __func__, &f) < 0 ? NDM_CPU : f.device;
}

/* Waits for the stream or event `id` of `kind` (done NULL) or asks whether
 * its work is done (into *done, true where the device has no streams). */
static ndm_status sync_or_query(uint64_t id, int kind, bool *done, const char *api)
{
    found f;
    ndm_status st = lookup(id, kind, api, &f);
    if (st < 0)
        return st;
    const ndm__backend_streams *bs = streams_of(f.device);
    if (!bs)
        return NDM_OK;
    bool ev = kind == KIND_EVENT;
    if (done)
        st = ev ? bs->event_query(f.device.index, f.obj, done)
                : bs->stream_query(f.device.index, f.obj, done);
    else
        st = ev ? bs->event_sync(f.device.index, f.obj) : bs->stream_sync(f.device.index, f.obj);
    if (st < 0 && done)
        return backend_failed(st, api, ev ? "asking the event" : "asking the stream");
    if (st < 0)
        return backend_failed(st, api, ev ? "waiting for the event" : "waiting for the stream");
    return NDM_OK;
}

/* sync_or_query's query, after checking `done`. */
static ndm_status query(uint64_t id, int kind, bool *done, const char *api)
{
    if (!done)
        return ndm__fail(NDM_E_INVALID, api, NDM__NO_SITE, "done is NULL");
    *done = true;
    return sync_or_query(id, kind, done, api);
}

/* Makes stream sid wait for event eid (`first` KIND_STREAM) or records eid
 * on sid (KIND_EVENT). The handle of kind `first` is looked up first (its
 * failure is the one recorded); the two must be on one device. */
static ndm_status stream_with_event(uint64_t sid, uint64_t eid, int first, const char *api)
{
    bool ev = first == KIND_EVENT;
    found fs, fe;
    ndm_status st = ev ? lookup(eid, KIND_EVENT, api, &fe) : lookup(sid, KIND_STREAM, api, &fs);
    if (st < 0)
        return st;
    st = ev ? lookup(sid, KIND_STREAM, api, &fs) : lookup(eid, KIND_EVENT, api, &fe);
    if (st < 0)
        return st;
    if (!ndm_device_eq(fs.device, fe.device)) {
        char a[32], b[32];
        return ndm__fail(NDM_E_DEVICE, api, NDM__NO_SITE, "the %s is on %s, the %s on %s",
                         kind_name(first),
                         ndm_device_str(ev ? fe.device : fs.device, a, sizeof a),
                         kind_name(ev ? KIND_STREAM : KIND_EVENT),
                         ndm_device_str(ev ? fs.device : fe.device, b, sizeof b));
    }
    const ndm__backend_streams *bs = streams_of(fs.device);
    if (!bs)
        return NDM_OK;
    st = ev ? bs->event_record(fe.device.index, fe.obj, fs.obj)
            : bs->stream_wait_event(fs.device.index, fs.obj, fe.obj);
    if (st < 0)
        return backend_failed(st, api, ev ? "recording the event" : "making the stream wait");
    return NDM_OK;
}

NDM_API ndm_status ndm_stream_synchronize(ndm_stream s)
{
    NDM__OP_GUARD();
    return sync_or_query(s.id, KIND_STREAM, NULL, __func__);
}

NDM_API ndm_status ndm_stream_query(ndm_stream s, bool *done)
{
    NDM__OP_GUARD();
    return query(s.id, KIND_STREAM, done, __func__);
}

NDM_API ndm_status ndm_stream_set_current(ndm_stream s)
{
    NDM__OP_GUARD();
    found f;
    ndm_status st = lookup(s.id, KIND_STREAM, __func__, &f);
    if (st < 0)
        return st;
    int k = current_slot(f.device);
    if (k < 0)
        return ndm__fail(NDM_E_DEVICE, __func__, NDM__NO_SITE, "no such device");
    current[k] = f.is_default ? 0 : s.id;
    const ndm__backend_streams *bs = streams_of(f.device);
    if (bs)
        bs->stream_set_current(f.device.index, f.obj);
    ndm__alloc_set_stream(f.device, (uintptr_t)f.obj);
    return NDM_OK;
}

NDM_API ndm_stream ndm_stream_current(ndm_device device)
{
    NDM__OP_GUARD();
    if (ndm__alloc_device_check(device, __func__, NDM__NO_SITE) < 0)
        return (ndm_stream){0};
    int k = current_slot(device);
    if (k < 0 || !current[k])
        return default_of(device);
    found f;
    if (lookup(current[k], KIND_STREAM, NULL, &f) < 0) {
        /* released by its manager meanwhile: the default again */
        current[k] = 0;
        return default_of(device);
    }
    return (ndm_stream){current[k]};
}

NDM_API ndm_status ndm_stream_wait_event(ndm_stream s, ndm_event e)
{
    NDM__OP_GUARD();
    return stream_with_event(s.id, e.id, KIND_STREAM, __func__);
}

/* ---- events -------------------------------------------------------------------------- */

NDM_API ndm_status ndm_event_new(ndm_manager m, ndm_event *out)
{
    NDM__OP_GUARD();
    return make(m, KIND_EVENT, out ? &out->id : NULL, __func__);
}

NDM_API ndm_status ndm_event_release(ndm_event e) { return release(e.id, KIND_EVENT, __func__); }

NDM_API ndm_status ndm_event_record(ndm_event e, ndm_stream s)
{
    NDM__OP_GUARD();
    return stream_with_event(s.id, e.id, KIND_EVENT, __func__);
}

NDM_API ndm_status ndm_event_query(ndm_event e, bool *done)
{
    NDM__OP_GUARD();
    return query(e.id, KIND_EVENT, done, __func__);
}

NDM_API ndm_status ndm_event_synchronize(ndm_event e)
{
    NDM__OP_GUARD();
    return sync_or_query(e.id, KIND_EVENT, NULL, __func__);
}

/* ---- arrays -------------------------------------------------------------------------- */

NDM_API ndm_status ndm_array_record_stream(ndm_array a, ndm_stream s)
{
    NDM__OP_GUARD();
    const char *api = __func__;
    ndm__array *r = ndm__array_get(a, api, NDM__NO_SITE);
    if (!r)
        return ndm_last_status();
    found f;
    ndm_status st = lookup(s.id, KIND_STREAM, api, &f);
    if (st < 0)
        return st;
    ndm__storage *sto = r->storage;
    if (!ndm_device_eq(sto->device, f.device)) {
        char a1[32], b1[32], desc[160];
        return ndm__fail(NDM_E_DEVICE, api, NDM__NO_SITE, "%s is on %s, the stream on %s",
                         ndm__array_desc(r, desc, sizeof desc),
                         ndm_device_str(sto->device, a1, sizeof a1),
                         ndm_device_str(f.device, b1, sizeof b1));
    }
    /* Wrapped memory is its owner's to free: nothing of the allocator's
     * waits for it (as PyTorch ignores memory it did not allocate). */
    if (!sto->cookie)
        return NDM_OK;
    st = ndm__alloc_record_stream(sto->device, sto->cookie, (uintptr_t)f.obj);
    if (st < 0)
        return ndm__fail(st, api, NDM__NO_SITE, "no memory to record the stream");
    return NDM_OK;
}

/* ---- test hook ----------------------------------------------------------------------- */

ndm_status ndm__stream_hold(ndm_stream s, bool on)
{
    found f;
    ndm_status st = lookup(s.id, KIND_STREAM, __func__, &f);
    if (st < 0)
        return st;
    const ndm__backend *b = ndm__backend_for(f.device.type);
    if (!b || !b->test || !b->test->stream_hold)
        return NDM_E_UNSUPPORTED;
    b->test->stream_hold(f.device.index, f.obj, on);
    return NDM_OK;
}

ndm_status ndm__stream_value(ndm_stream s, ndm_device *dev, uintptr_t *value)
{
    found f;
    ndm_status st = lookup(s.id, KIND_STREAM, __func__, &f);
    if (st < 0)
        return st;
    *dev = f.device;
    *value = (uintptr_t)f.obj;
    return NDM_OK;
}
