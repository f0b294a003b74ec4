/* Array records and their storage: creation, release, the close drain and
 * ownership moves, with exact per-manager accounting. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "create.h"
#include "reclaim.h"
#include "thread.h"

/* ---- storage ---------------------------------------------------------------- */

/* The storages of a drain die in batches: their blocks (those on the
 * draining manager's device; others are freed at once) are freed together
 * (the allocator does its bookkeeping once for a run of them, see
 * ndm__free_many) and the bytes charged to the draining manager, when it has
 * no limit to keep current, are given back at the flush. */
#define FREE_BATCH 64
typedef struct free_batch {
    ndm_device dev;      /* the draining manager's device */
    int n;
    ndm__manager *owner; /* NULL: every charge is given back at once */
    int slot;            /* owner's accounting slot gathered in `bytes` */
    int64_t bytes;
    void *cookies[FREE_BATCH];
} free_batch;

static void batch_init(free_batch *fb, ndm__manager *m)
{
    fb->dev = m->device;
    fb->n = 0;
    fb->owner = atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) ? NULL : m;
    fb->slot = m->dev;
    fb->bytes = 0;
}

static void batch_flush(free_batch *fb)
{
    if (fb->bytes) {
        ndm__bytes_sub(fb->owner, fb->slot, fb->bytes);
        fb->bytes = 0;
    }
    if (fb->n) {
        ndm__free_many(fb->dev, fb->cookies, (size_t)fb->n);
        fb->n = 0;
    }
}

static inline bool same_device(ndm_device a, ndm_device b)
{
    return a.type == b.type && a.index == b.index;
}

/* Give a dead storage's bytes back (now, or with the batch fb when given). */
static NDM__ALWAYS_INLINE void storage_uncharge(ndm__storage *s, free_batch *fb)
{
    int dev = ndm__device_slot(s->device);
    if (fb && fb->owner && s->charged == fb->owner->self && dev == fb->slot)
        fb->bytes += (int64_t)s->nbytes;
    else
        ndm__uncharge(ndm__manager_rec(s->charged), dev, (int64_t)s->nbytes);
}

/* Deferred frees (reclaim.h), run once no operation can still read them:
 * a storage's memory (and the slot of its home record when that died
 * first), and a dead record's long shape, extension and slot. */
static void later_storage(void *p, uintptr_t home)
{
    ndm__storage *s = p;
    if (s->cookie) {
        ndm__block b = {s->data, s->cookie, 0};
        ndm__free(s->device, &b);
    } else {
        ndm__storage_cold *c = ndm__storage_cold_of(s);
        if (c->free_fn)
            c->free_fn(s->data, c->free_ud);
    }
    if (home)
        ndm__array_slot_free((uint32_t)home);
}

static void later_record(void *p, uintptr_t free_slot)
{
    ndm__array *r = p;
    ndm__array_free_dims(r);
    if (r->ext) {
        free(r->ext);
        r->ext = NULL;
    }
    if (free_slot)
        ndm__array_slot_free(r->self);
}

ndm__array *ndm__array_share(ndm__array *r, ndm_array h)
{
    atomic_store_explicit(&r->marks, NDM__MARK_SHARED, memory_order_seq_cst);
    atomic_fetch_or_explicit(&r->storage->refs, NDM__REFS_SHARED, memory_order_seq_cst);
    /* Either a close that kills r from now on sees the mark, or its
     * generation store is seen below. */
    ndm__heavy_barrier();
    return atomic_load_explicit(&r->gen, memory_order_acquire) == (uint32_t)(h.id >> 32) ? r
                                                                                       : NULL;
}

/* Free the storage's memory (now, or with the batch fb when given) and give
 * its bytes back; refs reached 0. */
static NDM__ALWAYS_INLINE void storage_destroy(ndm__storage *s, free_batch *fb)
{
    storage_uncharge(s, fb);
    if (s->cookie) {
        if (!fb || !same_device(fb->dev, s->device)) {
            ndm__block b = {s->data, s->cookie, 0};
            ndm__free(s->device, &b);
            return;
        }
        if (fb->n == FREE_BATCH)
            batch_flush(fb);
        fb->cookies[fb->n++] = s->cookie;
    } else {
        ndm__storage_cold *c = ndm__storage_cold_of(s);
        if (c->free_fn)
            c->free_fn(s->data, c->free_ud);
    }
}

/* ---- small helpers --------------------------------------------------------- */

bool ndm__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] == 0)
            return true;
        if (shape[i] != 1 && strides[i] != expect)
            return false;
        expect *= shape[i];
    }
    return true;
}

void ndm__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] ? shape[i] : 1;
    }
}

const char *ndm__array_desc(const ndm__array *r, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "%s[", ndm_dtype_short(r->dtype));
    int shown = r->ndim;
    /* A dead record keeps at most NDM__INLINE_DIMS sizes. */
    const int64_t *dims = atomic_load_explicit(&r->live, memory_order_relaxed) ? r->shape : r->dims;
    if (!atomic_load_explicit(&r->live, memory_order_relaxed) && shown > NDM__INLINE_DIMS)
        shown = NDM__INLINE_DIMS;
    for (int i = 0; i < shown && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, i ? "," : "", dims[i]);
    if (shown < r->ndim && len < n)
        len += (size_t)snprintf(buf + len, n - len, ",...");
    if (len < n)
        snprintf(buf + len, n - len, "]");
    return buf;
}

ndm_status ndm__shape_check(int ndim, const int64_t *shape, ndm_dtype dtype, int64_t *numel,
                            size_t *nbytes, const char *api, ndm__site where)
{
    if (!ndm_dtype_valid(dtype))
        return ndm__fail(NDM_E_DTYPE, api, where, "invalid dtype %d", (int)dtype);
    if (ndim < 0)
        return ndm__fail(NDM_E_SHAPE, api, where, "negative rank %d", ndim);
    if (ndim > 0 && !shape)
        return ndm__fail(NDM_E_SHAPE, api, where, "shape is NULL for rank %d", ndim);
    /* The extent (the product of the non-zero sizes) bounds every stride
     * and, times the element size, every byte offset; for an array with
     * elements it is the element count. */
    int64_t isz = (int64_t)ndm__dtype_bytes[dtype], span = 1, span_bytes = isz;
    bool empty = false, count_over = false;
    int bad = -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ndm__fail(NDM_E_SHAPE, api, where, "negative size %" PRId64 " on axis %d",
                             shape[i], i);
        empty |= shape[i] == 0;
        if (bad < 0 && shape[i]) {
            count_over = ndm__ckd_mul_i64(&span, span, shape[i]);
            if (count_over || ndm__ckd_mul_i64(&span_bytes, span, isz))
                bad = i;
        }
    }
    if (bad >= 0 && empty)
        return ndm__fail(NDM_E_OVERFLOW, api, where,
                         "the strides of an empty array overflow at axis %d (size %" PRId64 ")",
                         bad, shape[bad]);
    if (bad >= 0 && count_over)
        return ndm__fail(NDM_E_OVERFLOW, api, where,
                         "the element count overflows at axis %d (size %" PRId64 ")", bad,
                         shape[bad]);
    if (bad >= 0)
        return ndm__fail(NDM_E_OVERFLOW, api, where,
                         "%" PRId64 " elements of %s overflow the byte count", span,
                         ndm_dtype_name(dtype));
    int64_t n = empty ? 0 : span;
    size_t bytes = (size_t)(empty ? 0 : span_bytes);
    if (numel)
        *numel = n;
    if (nbytes)
        *nbytes = bytes;
    return NDM_OK;
}

ndm_status ndm__axis(int axis, int ndim, bool insert, int *out, const char *api, ndm__site where)
{
    int n = insert ? ndim + 1 : ndim;
    int a = axis < 0 ? axis + n : axis;
    if (a < 0 || a >= n)
        return ndm__fail(NDM_E_AXIS, api, where, "axis %d is out of range for rank %d", axis,
                         ndim);
    *out = a;
    return NDM_OK;
}

/* ---- checked lookup ------------------------------------------------------- */

/* Could h be a handle that ndm issued (live or stale)? False for a manager
 * handle, a slot never allocated, generation 0, or a generation the slot has
 * not reached (see ndm__gen_stale). */
bool ndm__array_issued(ndm_array h)
{
    uint32_t slot = ndm__id_slot(h.id);
    if ((h.id & NDM__KIND_MANAGER) || slot == 0 || ndm__id_gen(h.id) == 0 ||
        slot >= (NDM__MAX_CHUNKS << NDM__CHUNK_BITS))
        return false;
    ndm__array *d = ndm__array_slot(slot);
    if (!d)
        return false;
    uint32_t g = atomic_load_explicit(&d->gen, memory_order_acquire);
    return ndm__id_gen(h.id) == g ? atomic_load_explicit(&d->live, memory_order_acquire) != 0
                                  : ndm__gen_stale(ndm__id_gen(h.id), g);
}

/* What a stale handle h names, into buf: "array f32[2] created at a.c:3
 * (f) was released at a.c:5 (f)", or "... when its manager 'p' was closed
 * at ...". False (buf unset) when its slot was reused since, or still
 * holds the live array (h is issued and not live: checked by the caller).
 * *direct: released by ndm_array_release, not by a close. */
static bool stale_story(ndm_array h, char *buf, size_t n, bool *direct)
{
    uint32_t slot = ndm__id_slot(h.id);
    ndm__array *d = ndm__array_slot(slot);
    /* Read the dead record, then check that the slot was not reused meanwhile. */
    uint32_t want = (ndm__id_gen(h.id) + 1) & 0x7fffffffu;
    uint32_t g1 = atomic_load_explicit(&d->gen, memory_order_acquire);
    char desc[160], made[256], died[256], path[512];
    ndm__site dead_site = ndm__array_dead_site(d), site = ndm__array_site(d);
    uint32_t by = d->dead_by, by_gen = d->dead_by_gen;
    ndm__array_desc(d, desc, sizeof desc);
    bool was_live = atomic_load_explicit(&d->live, memory_order_acquire);
    uint32_t g2 = atomic_load_explicit(&d->gen, memory_order_acquire);
    if (g1 != want || g2 != want || was_live)
        return false;
    ndm__site_str(site, made, sizeof made);
    ndm__site_str(dead_site, died, sizeof died);
    *direct = by == 0;
    if (by) {
        /* The closing manager's record names it only until its slot is reused. */
        ndm__tree_lock();
        ndm__manager *bm = ndm__manager_slot(by);
        uint32_t next = (by_gen + 1) & 0x7fffffffu;
        if (!(atomic_load_explicit(&bm->state, memory_order_acquire) & NDM__M_LIVE) &&
            atomic_load_explicit(&bm->gen, memory_order_acquire) == (next ? next : 1))
            ndm__manager_path_locked(by, path, sizeof path);
        else
            snprintf(path, sizeof path, "? (a manager whose slot has since been reused)");
        ndm__tree_unlock();
        snprintf(buf, n, "array %s created at %s was released when its manager '%s' was closed at %s",
                 desc, made, path, died);
    } else {
        snprintf(buf, n, "array %s created at %s was released at %s", desc, made, died);
    }
    return true;
}

NDM__COLD ndm__array *ndm__array_lookup_failed(ndm_array h, const char *api,
                                               const ndm__site *wherep, bool propagate)
{
    ndm__site where = *wherep;
    (void)propagate;
    if (h.id == 0) {
        ndm__fail_null(api, where, "array");
        return NULL;
    }
    if (!ndm__array_issued(h)) {
        ndm__fail(NDM_E_INVALID, api, where, "not an array handle (id 0x%016" PRIx64 ")", h.id);
        return NULL;
    }
    char story[1536];
    bool direct;
    if (!stale_story(h, story, sizeof story, &direct))
        ndm__fail(NDM_E_CLOSED, api, where,
                  "stale array handle (slot %u, generation %u): the array was released and its "
                  "slot has been reused since",
                  ndm__id_slot(h.id), ndm__id_gen(h.id));
    else
        ndm__fail(NDM_E_CLOSED, api, where, "stale array handle: %s", story);
    return NULL;
}

/* ---- the output rule -------------------------------------------------------- */

ndm_manager ndm__output_manager(ndm_manager named, ndm__array *first_input, const char *api,
                                ndm__site where)
{
    if (named.id == NDM__CURRENT_SCOPE_ID)
        return ndm__current_scope(api, where);
    if (named.id == 0) {
        ndm__fail_null(api, where, "manager");
        return NDM_NULL_MANAGER;
    }
    if (named.id != NDM__OUTPUT_RULE_ID)
        return named;
    ndm_manager s = ndm__scope_innermost();
    if (s.id)
        return s;
    if (first_input) {
        /* A handle made from the record after a close (the input's manager
         * closed on another thread, its scope with it) would carry the next
         * generation and read as never issued: such a manager is closed. */
        ndm__manager *m = ndm__manager_slot(ndm__array_mgr_unlocked(first_input));
        uint32_t g = atomic_load_explicit(&m->gen, memory_order_acquire);
        unsigned st = atomic_load_explicit(&m->state, memory_order_acquire);
        if (NDM__LIKELY((st & NDM__M_LIVE) &&
                        atomic_load_explicit(&m->gen, memory_order_acquire) == g))
            return ndm__manager_handle(m->self, g);
        ndm__fail(NDM_E_CLOSED, api, where,
                  "the manager of the input was closed while the operation ran");
        return NDM_NULL_MANAGER;
    }
    ndm__fail(NDM_E_NULL, api, where,
              "no manager: pass one, or call inside a scope (ndm_scope_begin)");
    return NDM_NULL_MANAGER;
}

ndm__manager *ndm__output_record_slow(ndm_manager named, ndm__array *first_input,
                                      const char *api, const ndm__site *where)
{
    ndm_manager m = ndm__output_manager(named, first_input, api, *where);
    return m.id ? ndm__manager_get(m, api, *where) : NULL;
}

/* ---- creation --------------------------------------------------------------- */

/* Check that manager m accepts a new array; the caller's site is named. */
static NDM__COLD ndm_status accepts(ndm__manager *m, const char *api, const ndm__site *where,
                                    ndm_dtype dtype, int ndim, const int64_t *shape)
{
    unsigned st = atomic_load_explicit(&m->state, memory_order_acquire);
    if (NDM__LIKELY(!(st & (NDM__M_CLOSING | NDM__M_CAP_ARRAYS))))
        return NDM_OK;
    char path[512], desc[160];
    ndm__array tmp = {.ndim = ndim, .dtype = dtype};
    atomic_init(&tmp.live, 1);
    int64_t zero = 0;
    tmp.shape = ndim ? (int64_t *)shape : &zero;
    ndm__array_desc(&tmp, desc, sizeof desc);
    ndm__manager_path(m->self, path, sizeof path);
    if (st & NDM__M_CLOSING)
        return ndm__fail(NDM_E_CLOSED, api, *where, "manager '%s' is closing; array %s refused",
                         path, desc);
    return ndm__fail(NDM_E_CAPPED, api, *where, "manager '%s' is capped; array %s refused", path,
                     desc);
}

/* Fill the shape part of a record: the strides given, or C-contiguous ones. */
static ndm_status set_dims(ndm__array *r, int ndim, const int64_t *shape, const int64_t *strides,
                           const char *api, const ndm__site *where)
{
    if (ndm__array_dims_place(r, ndim, api, where) < 0)
        return NDM_E_OOM;
    if (strides) {
        for (int i = 0; i < ndim; i++) {
            r->shape[i] = shape[i];
            r->strides[i] = strides[i];
        }
        return NDM_OK;
    }
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        r->shape[i] = shape[i];
        r->strides[i] = stride;
        stride *= shape[i] ? shape[i] : 1;
    }
    return NDM_OK;
}

/* Link a filled record into m and count it with its storage bytes, which
 * were reserved in m's limits (see ndm__array_create). False, with the error
 * recorded, when m is no longer the open manager of generation gen or no
 * memory was left for its entry. */
static inline bool link_new(ndm__manager *m, uint32_t gen, ndm__array *r, int dev, int64_t bytes,
                            const char *api, const ndm__site *site)
{
    bool fast = ndm__mlock_acquire(m);
    if (NDM__UNLIKELY(!ndm__manager_open_as(m, gen))) {
        ndm__array_refused_closed(m, gen, fast, api, site);
        return false;
    }
    if (NDM__UNLIKELY(!ndm__arrays_room(m))) {
        ndm__mlock_release(m, fast);
        ndm__fail(NDM_E_OOM, api, *site, "no memory for the array list of '%s'", m->name);
        return false;
    }
    /* live before the lock goes: from then on a close of m may kill it */
    atomic_store_explicit(&r->live, 1, memory_order_relaxed);
    ndm__array_link_into(m, r);
    m->live++;
    m->created++;
    m->count[dev].reserved -= bytes;
    ndm__bytes_add(m, dev, bytes);
    ndm__mlock_release(m, fast);
    return true;
}

ndm_array ndm__array_new_on(ndm__site site, const char *api, ndm_manager mh, ndm_device dev,
                            ndm_dtype dtype, int ndim, const int64_t *shape, ndm__array **out)
{
    ndm__manager *m = ndm__manager_get(mh, api, site);
    if (!m)
        return NDM_NULL_ARRAY;
    return ndm__array_new_inline(&site, api, m, ndm__manager_expected_gen(mh, m), dev, dtype, ndim,
                                 shape, out);
}

/* ---- the out-of-line parts of creation (create.h) ---------------------------- */

NDM__COLD ndm_status ndm__array_dims_on_heap(ndm__array *r, int ndim, const char *api,
                                             const ndm__site *where)
{
    int64_t *p = ndm__malloc(2 * (size_t)ndim * sizeof *p, NDM__INJ_RECORD);
    if (!p)
        return ndm__fail(NDM_E_OOM, api, *where, "no memory for a rank-%d shape", ndim);
    r->shape = p;
    r->strides = p + ndim;
    return NDM_OK;
}

NDM__COLD void ndm__array_free_heap_dims(ndm__array *r)
{
    /* A dead record shows its first sizes in messages. */
    int k = r->ndim < NDM__INLINE_DIMS ? r->ndim : NDM__INLINE_DIMS;
    for (int i = 0; i < k; i++)
        r->dims[i] = r->shape[i];
    free(r->shape);
    r->shape = r->dims;
    r->strides = r->dims + k;
}

NDM__COLD ndm_array ndm__array_shape_refused(int ndim, const int64_t *shape, ndm_dtype dtype,
                                             const char *api, const ndm__site *site)
{
    if (ndm__shape_check(ndim, shape, dtype, NULL, NULL, api, *site) == NDM_OK)
        ndm__fail(NDM_E_SHAPE, api, *site, "invalid shape"); /* unreachable by design */
    return NDM_NULL_ARRAY;
}

/* Give back a reservation counted in m's `reserved` (see ndm__array_create),
 * unless m's close, which came first, gave it back already. */
static void reserve_undo(ndm__manager *m, uint32_t gen, int dev, int64_t bytes)
{
    bool fast = ndm__mlock_acquire(m);
    if (atomic_load_explicit(&m->gen, memory_order_relaxed) == gen) {
        m->count[dev].reserved -= bytes;
        ndm__limit_release(m, dev, bytes);
    }
    ndm__mlock_release(m, fast);
}

/* Reserve bytes in the limits over m, counted in m's `reserved` under its
 * lock while m is the open manager of generation gen (see ndm__array_create).
 * The refusal's message is written once no lock is held (it takes the tree
 * lock). */
static NDM__COLD ndm_status reserve_in(ndm__manager *m, uint32_t gen, int dev, int64_t bytes,
                                       const char *api, const ndm__site *site)
{
    for (;;) {
        bool fast = ndm__mlock_acquire(m);
        if (!ndm__manager_open_as(m, gen)) {
            ndm__array_refused_closed(m, gen, fast, api, site);
            return NDM_E_CLOSED;
        }
        ndm__quota_miss miss;
        ndm_status st = ndm__limit_reserve_quiet(m, dev, bytes, &miss);
        if (st == NDM_OK) {
            ndm__dev_mark(m, dev);
            m->count[dev].reserved += bytes;
        }
        ndm__mlock_release(m, fast);
        if (st == NDM_OK)
            return st;
        /* a byte budget may make room (autograd drops what it can
         * recompute) and the creation tries again */
        ndm__quota_relief_fn relief = atomic_load_explicit(&ndm__quota_relief, memory_order_acquire);
        int64_t freed = relief ? relief(&miss, api, site) : 0;
        if (freed < 0)
            return (ndm_status)freed;
        if (freed == 0)
            return ndm__quota_fail(&miss, api, *site);
    }
}

ndm_status ndm__scratch_reserve(ndm__manager *m, uint32_t gen, ndm_device dev, size_t bytes,
                                const char *api, const ndm__site *site, bool *charged)
{
    *charged = atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != 0;
    if (!*charged)
        return NDM_OK;
    return reserve_in(m, gen, ndm__device_slot(dev), (int64_t)bytes, api, site);
}

void ndm__scratch_unreserve(ndm__manager *m, uint32_t gen, ndm_device dev, int64_t bytes)
{
    reserve_undo(m, gen, ndm__device_slot(dev), bytes);
}

NDM__COLD ndm_array ndm__array_create_undo(ndm__array *r, uint32_t slot, ndm__manager *m,
                                           uint32_t gen, ndm_device dev, const ndm__block *blk,
                                           size_t nbytes, bool limited)
{
    if (r)
        ndm__array_free_dims(r);
    if (blk) {
        ndm__block b = *blk;
        ndm__free(dev, &b);
    }
    if (slot)
        ndm__array_slot_free(slot);
    if (limited)
        reserve_undo(m, gen, ndm__device_slot(dev), (int64_t)nbytes);
    return NDM_NULL_ARRAY;
}

NDM__COLD void ndm__array_refused_closed(ndm__manager *m, uint32_t gen, bool fast,
                                         const char *api, const ndm__site *site)
{
    /* The name is read under the lock: once the generation has moved on, the
     * record may be a new manager's, filled by another thread. */
    char name[NDM__NAME_MAX];
    bool same = atomic_load_explicit(&m->gen, memory_order_relaxed) == gen;
    if (same)
        memcpy(name, m->name, sizeof name);
    ndm__mlock_release(m, fast);
    if (same)
        ndm__fail(NDM_E_CLOSED, api, *site, "manager '%s' started closing", name);
    else
        ndm__fail(NDM_E_CLOSED, api, *site, "the manager was closed meanwhile");
}

ndm_array ndm__array_create_checked(const ndm__site *site, const char *api, ndm__manager *m,
                                    uint32_t gen, ndm_device dev, ndm_dtype dtype, int ndim,
                                    const int64_t *shape, size_t nbytes, ndm__array **out)
{
    if (accepts(m, api, site, dtype, ndim, shape) < 0)
        return NDM_NULL_ARRAY;
    bool limited = atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != 0;
    if (limited && reserve_in(m, gen, ndm__device_slot(dev), (int64_t)nbytes, api, site) < 0)
        return NDM_NULL_ARRAY;
    return ndm__array_create(ndm__tls, site, api, m, gen, dev, dtype, ndim, shape, nbytes, limited,
                             out);
}

ndm_array ndm__array_new_in(const ndm__site *site, const char *api, ndm__manager *m,
                            ndm_device dev, ndm_dtype dtype, int ndim, const int64_t *shape,
                            ndm__array **out)
{
    /* (read right after the caller's lookup: see ndm__manager_open_as) */
    uint32_t gen = atomic_load_explicit(&m->gen, memory_order_acquire);
    return ndm__array_new_inline(site, api, m, gen, dev, dtype, ndim, shape, out);
}

ndm_array ndm__array_new(ndm__site site, const char *api, ndm_manager mh, ndm_dtype dtype,
                         int ndim, const int64_t *shape, ndm__array **out)
{
    ndm__manager *m = ndm__manager_get(mh, api, site);
    if (!m)
        return NDM_NULL_ARRAY;
    return ndm__array_new_inline(&site, api, m, ndm__manager_expected_gen(mh, m),
                                 ndm__manager_device_of(m), dtype, ndim, shape, out);
}

ndm_array ndm__array_wrap(ndm__site site, const char *api, ndm_manager mh, ndm_dtype dtype,
                          int ndim, const int64_t *shape, void *data, ndm_free_fn free_fn,
                          void *ud)
{
    ndm__manager *m = ndm__manager_get(mh, api, site);
    if (!m)
        return NDM_NULL_ARRAY;
    size_t nbytes;
    if (ndm__shape_check(ndim, shape, dtype, NULL, &nbytes, api, site) < 0)
        return NDM_NULL_ARRAY;
    if (!data && nbytes)
        return ndm__fail(NDM_E_INVALID, api, site, "data is NULL"), NDM_NULL_ARRAY;
    if (accepts(m, api, &site, dtype, ndim, shape) < 0)
        return NDM_NULL_ARRAY;
    uint32_t gen = ndm__manager_expected_gen(mh, m);
    ndm_device device = ndm__manager_device_of(m);
    int d = ndm__device_slot(device);
    if (reserve_in(m, gen, d, (int64_t)nbytes, api, &site) < 0)
        return NDM_NULL_ARRAY;
    uint32_t slot = ndm__array_slot_alloc();
    if (!slot) {
        reserve_undo(m, gen, d, (int64_t)nbytes);
        ndm__fail(NDM_E_OOM, api, site, "no memory for an array record");
        return NDM_NULL_ARRAY;
    }
    ndm__array *r = ndm__array_slot(slot);
    ndm__storage *s = &r->own;
    ndm__array_record_init(r, dtype, s, &site, ndm__thread_tag());
    if (set_dims(r, ndim, shape, NULL, api, &site) < 0)
        goto fail;
    ndm__array_storage_init(r, m, device, nbytes);
    s->data = data;
    s->cookie = NULL;
    r->own_cold.free_fn = free_fn;
    r->own_cold.free_ud = ud;
    /* (the generation before the link: a close may kill the array after it) */
    ndm_array h = ndm__array_handle(slot, atomic_load_explicit(&r->gen, memory_order_relaxed));
    if (!link_new(m, gen, r, d, (int64_t)nbytes, api, &site)) {
        ndm__array_free_dims(r);
        goto fail;
    }
    return h;
fail:
    ndm__array_slot_free(slot);
    reserve_undo(m, gen, d, (int64_t)nbytes);
    return NDM_NULL_ARRAY;
}

/* Take the locks of m and of bm in slot order (one lock when they are the
 * same manager); ndm__mlock_take and ndm__mlock_drop pair up by themselves. */
static void lock_pair(ndm__manager *m, ndm__manager *bm)
{
    ndm__manager *a = m->self < bm->self ? m : bm;
    ndm__manager *b = m->self < bm->self ? bm : m;
    ndm__mlock_take(a);
    if (b != a)
        ndm__mlock_take(b);
}
static void unlock_pair(ndm__manager *m, ndm__manager *bm)
{
    ndm__manager *a = m->self < bm->self ? m : bm;
    ndm__manager *b = m->self < bm->self ? bm : m;
    if (b != a)
        ndm__mlock_drop(b);
    ndm__mlock_drop(a);
}

/* A view takes a reference to its base's storage while holding the lock of
 * the base's manager as well as its own: every path that kills an array
 * (a release, a close's drain, a move back to a lender) holds the lock of the
 * array's manager, so the base cannot die between the test that it lives
 * and the new reference, and the fast paths that free a storage seen with
 * one reference (view_dies, drain_plain) cannot miss the new one. A base
 * whose manager is closing is refused: its close is releasing it. */
/* A view in limited m of storage charged outside m's limits must fit the
 * storage's whole size (below): under a byte budget, room for it is made
 * first, as for a new array. A refusal is left to the check under the
 * locks, which writes the message. */
static NDM__COLD void view_room(ndm__manager *m, ndm__array *base, const char *api,
                                const ndm__site *site)
{
    ndm__quota_relief_fn relief = atomic_load_explicit(&ndm__quota_relief, memory_order_acquire);
    if (!relief)
        return;
    ndm__storage *s = base->storage;
    for (int tries = 0; tries < 64; tries++) {
        uint32_t ch = __atomic_load_n(&s->charged, __ATOMIC_RELAXED);
        ndm__quota_miss miss;
        if (ch == m->self || ndm__charge_fits(ndm__manager_rec(ch), m, ndm__device_slot(s->device),
                                              (int64_t)s->nbytes, &miss) == NDM_OK)
            return;
        if (relief(&miss, api, site) <= 0)
            return;
    }
}

ndm_array ndm__array_view(ndm__site site, const char *api, ndm_manager mh, ndm__array *base,
                          ndm_dtype dtype, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset, ndm__array **out)
{
    /* (read right after the caller's lookup of the base) */
    uint32_t bgen = atomic_load_explicit(&base->gen, memory_order_acquire);
    ndm__manager *m = ndm__manager_get(mh, api, site);
    if (!m)
        return NDM_NULL_ARRAY;
    uint32_t gen = ndm__manager_expected_gen(mh, m);
    if (accepts(m, api, &site, dtype, ndim, shape) < 0)
        return NDM_NULL_ARRAY;
    if (NDM__UNLIKELY(atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != 0))
        view_room(m, base, api, &site);
    uint32_t slot = ndm__array_slot_alloc();
    if (!slot) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for an array record");
        return NDM_NULL_ARRAY;
    }
    ndm__array *r = ndm__array_slot(slot);
    ndm__array_record_init(r, dtype, NULL, &site, ndm__thread_tag());
    if (set_dims(r, ndim, shape, strides, api, &site) < 0) {
        ndm__array_slot_free(slot);
        return NDM_NULL_ARRAY;
    }
    r->offset = offset;
    /* Lock order: managers (lower slot first), then the storage. */
    ndm__manager *bm;
    const char *why = NULL;
    char oom[NDM__NAME_MAX + 48];
    ndm_status st = NDM_OK;
    ndm__quota_miss miss;
    for (;;) {
        bm = ndm__manager_rec(ndm__array_mgr_unlocked(base));
        lock_pair(m, bm);
        if (atomic_load_explicit(&base->gen, memory_order_relaxed) != bgen ||
            !atomic_load_explicit(&base->live, memory_order_relaxed)) {
            st = NDM_E_CLOSED;
            why = "the array was released meanwhile";
            break;
        }
        if (base->mgr == bm->self)
            break;
        unlock_pair(m, bm); /* moved meanwhile: lock its new manager */
    }
    if (st == NDM_OK && (atomic_load_explicit(&bm->state, memory_order_relaxed) & NDM__M_CLOSING)) {
        st = NDM_E_CLOSED;
        why = "the array is being released by a close";
    } else if (st == NDM_OK && !ndm__manager_open_as(m, gen)) {
        st = NDM_E_CLOSED;
        why = "the manager was closed meanwhile";
    } else if (st == NDM_OK && NDM__UNLIKELY(!ndm__arrays_room(m))) {
        st = NDM_E_OOM;
        snprintf(oom, sizeof oom, "no memory for the array list of '%s'", m->name);
        why = oom;
    }
    ndm__storage *s = st == NDM_OK ? base->storage : NULL;
    ndm__storage_cold *c = s ? ndm__storage_cold_of(s) : NULL;
    if (s) {
        ndm__lock_take(&c->lock);
        /* A view in a limited manager may come to hold the storage's charge
         * when the other views die (shared_view_dies): it must fit there now. */
        if (s->charged != m->self &&
            atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != 0 &&
            ndm__charge_fits(ndm__manager_rec(s->charged), m, ndm__device_slot(s->device),
                             (int64_t)s->nbytes, &miss) < 0) {
            ndm__lock_drop(&c->lock);
            st = NDM_E_QUOTA;
        }
    }
    if (st != NDM_OK) {
        unlock_pair(m, bm);
        ndm__array_free_dims(r);
        ndm__array_slot_free(slot);
        if (st == NDM_E_QUOTA)
            ndm__quota_fail(&miss, api, site);
        else
            ndm__fail(st, api, site, "%s", why);
        return NDM_NULL_ARRAY;
    }
    r->storage = s;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    if (!c->first_view) {
        /* The second view: the list starts with the home, the one view so
         * far, which holds the charge. */
        ndm__array *home = ndm__storage_home(s);
        home->sv_prev = home->sv_next = 0;
        c->first_view = home->self;
        c->charged_views = 1;
    }
    r->sv_prev = 0;
    r->sv_next = c->first_view;
    ndm__array_rec(c->first_view)->sv_prev = slot;
    c->first_view = slot;
    if (s->charged == m->self)
        c->charged_views++;
    ndm__lock_drop(&c->lock);
    /* Live, and its handle's generation read, before the locks go: from then
     * on a close of m may kill it. */
    atomic_store_explicit(&r->live, 1, memory_order_relaxed);
    ndm_array h = ndm__array_handle(slot, atomic_load_explicit(&r->gen, memory_order_relaxed));
    ndm__array_link_into(m, r);
    m->live++;
    m->created++;
    unlock_pair(m, bm);
    if (out)
        *out = r;
    return h;
}

/* An alias of `base` under the detached node, recorded as lent by base's
 * manager: what an export hands to another library, so that dumps show the
 * storage as lent out until the other side releases it. */
ndm_array ndm__array_lend_out(ndm__site site, const char *api, ndm__array *base)
{
    uint32_t lender = ndm__array_mgr_unlocked(base);
    uint32_t lender_gen = atomic_load_explicit(&ndm__manager_rec(lender)->gen, memory_order_acquire);
    ndm__array *r;
    ndm_array h = ndm__array_view(site, api, ndm_detached(), base, base->dtype, base->ndim,
                                  base->shape, base->strides, base->offset, &r);
    if (!h.id)
        return h;
    ndm__manager *d = ndm__manager_rec(ndm__detached_slot);
    ndm__mlock_take(d);
    /* (released meanwhile by another thread's deleter: nothing to mark) */
    if (atomic_load_explicit(&r->gen, memory_order_relaxed) == ndm__id_gen(h.id) &&
        r->mgr == d->self && !r->lender) {
        ndm__array_set_lender(r, lender, lender_gen);
    }
    ndm__mlock_drop(d);
    return h;
}

/* ---- storage bookkeeping when a view leaves a manager ----------------------- */

/* Count the views of s owned by manager slot `mgr`; storage lock held. */
static uint32_t count_views(ndm__storage *s, uint32_t mgr)
{
    uint32_t first = ndm__storage_cold_of(s)->first_view;
    if (!first)
        return ndm__storage_home(s)->mgr == mgr;
    uint32_t n = 0;
    for (uint32_t v = first; v; v = ndm__array_rec(v)->sv_next)
        if (ndm__array_rec(v)->mgr == mgr)
            n++;
    return n;
}

/* The last view of s died: its memory and bytes go back, and its home
 * record's slot, kept while views outlived it, is freed unless that record
 * is `dying` (which frees its own slot). */
static NDM__ALWAYS_INLINE void storage_dies(ndm__storage *s, ndm__array *dying, free_batch *fb,
                                            bool later)
{
    if (NDM__UNLIKELY(later)) {
        storage_uncharge(s, fb);
        uintptr_t home = 0;
        if (s != &dying->own) {
            ndm__storage_cold_of(s)->first_view = 0;
            home = ndm__storage_home(s)->self;
        }
        ndm__defer(later_storage, s, home);
        return;
    }
    storage_destroy(s, fb);
    if (s != &dying->own) {
        /* The last view was another record's: the home's list ends with it. */
        ndm__storage_cold_of(s)->first_view = 0;
        ndm__array_slot_free(ndm__storage_home(s)->self);
    }
}

/* View r of storage s dies; its manager was `from`. Manager lock of `from`
 * is held by the caller (or `from` is closing under this thread). Returns
 * whether r's slot must wait: its own storage lives on in other views. */
/* What view_dies reports: r's slot must wait (its storage lives on in other
 * views), and the storage's memory was deferred (r's record must wait too). */
enum { VIEW_WAITS = 1, VIEW_DEFERRED = 2 };
static unsigned shared_view_dies(ndm__array *r, ndm__manager *from, free_batch *fb, bool later);

/* `later`: the memory may still be read by another thread's operation (a
 * foreign close); a storage marked shared defers too. */
static NDM__ALWAYS_INLINE unsigned view_dies(ndm__array *r, ndm__manager *from, free_batch *fb,
                                             bool later)
{
    ndm__storage *s = r->storage;
    if (NDM__LIKELY(atomic_load_explicit(&s->refs, memory_order_acquire) == 1)) {
        /* The only view: nobody else can reach s. */
        atomic_store_explicit(&s->refs, 0, memory_order_relaxed);
        storage_dies(s, r, fb, later);
        return later ? VIEW_DEFERRED : 0;
    }
    return shared_view_dies(r, from, fb, later);
}

/* view_dies when other views may share the storage, or it is marked. */
static unsigned shared_view_dies(ndm__array *r, ndm__manager *from, free_batch *fb, bool later)
{
    ndm__storage *s = r->storage;
    ndm__storage_cold *c = ndm__storage_cold_of(s);
    ndm__lock_take(&c->lock);
    /* Listed when more than one view was alive as this one started to die;
     * a marked storage's one view (its home) has no list, and its links are
     * stale. */
    if (c->first_view) {
        if (r->sv_prev)
            ndm__array_rec(r->sv_prev)->sv_next = r->sv_next;
        else
            c->first_view = r->sv_next;
        if (r->sv_next)
            ndm__array_rec(r->sv_next)->sv_prev = r->sv_prev;
    }
    unsigned old = atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel);
    unsigned left = (old & NDM__REFS_COUNT) - 1;
    later = later || (old & NDM__REFS_SHARED);
    if (left == 0) {
        ndm__lock_drop(&c->lock);
        storage_dies(s, r, fb, later);
        return later ? VIEW_DEFERRED : 0;
    }
    if (s->charged == from->self && --c->charged_views == 0) {
        /* The charged manager holds no view any more: the charge moves to the
         * manager of the newest remaining view that has room for it under its
         * limits (views in limited managers were checked for that when they
         * were made), or to the newest's when none has room any more. to's
         * lock is not held (taking it here could invert the lock order): the
         * bytes land in its inbox. */
        int dev = ndm__device_slot(s->device);
        uint32_t to_slot = 0;
        for (uint32_t v = c->first_view; v && !to_slot; v = ndm__array_rec(v)->sv_next) {
            uint32_t t = ndm__array_rec(v)->mgr;
            if (ndm__charge_move(from, ndm__manager_slot(t), dev, (int64_t)s->nbytes, false, true,
                                 NULL, NDM__NO_SITE) == NDM_OK)
                to_slot = t;
        }
        if (!to_slot) {
            to_slot = ndm__array_rec(c->first_view)->mgr;
            ndm__charge_move(from, ndm__manager_slot(to_slot), dev, (int64_t)s->nbytes, true,
                             true, NULL, NDM__NO_SITE);
        }
        s->charged = to_slot;
        c->charged_views = count_views(s, to_slot);
        ndm__alloc_retag(s->cookie, to_slot);
    }
    /* The home alone again (it holds the charge then): the list ends. */
    if (left == 1 && c->first_view == ndm__storage_home(s)->self)
        c->first_view = 0;
    ndm__lock_drop(&c->lock);
    /* (s lives on: what waits for its readers is its last view's death) */
    return s == &r->own ? VIEW_WAITS : 0;
}

/* Array r dies; `from`, its manager, has unlinked it (from's lock held, or
 * from closing under this thread). The record is marked dead before its
 * storage reference goes: once the last view of a storage frees the slot of
 * the storage's dead home record, nobody writes that record any more. */
/* Forget every lender of r (its lock held, or r dying). */
static NDM__COLD void lenders_drop(ndm__array *r)
{
    for (ndm__lend *l = r->lenders, *next; l; l = next) {
        next = l->next;
        free(l);
    }
    r->lenders = NULL;
    ndm__array_set_lender(r, 0, 0);
}

/* r went back one step (or its lender is gone): the lender before becomes
 * its lender. False when there was none. */
static bool lenders_pop(ndm__array *r)
{
    ndm__lend *l = r->lenders;
    if (!l) {
        ndm__array_set_lender(r, 0, 0);
        return false;
    }
    ndm__array_set_lender(r, l->slot, l->gen);
    r->lenders = l->next;
    free(l);
    return true;
}

/* r's handle stops working: its lenders are forgotten, the slot reads
 * dead and its generation moves on. */
static NDM__ALWAYS_INLINE void record_dies(ndm__array *r)
{
    if (NDM__UNLIKELY(r->lender))
        lenders_drop(r);
    atomic_store_explicit(&r->live, 0, memory_order_relaxed);
    unsigned g = atomic_load_explicit(&r->gen, memory_order_relaxed);
    g = (g + 1) & 0x7fffffffu;
    atomic_store_explicit(&r->gen, g ? g : 1, memory_order_release);
}

/* r dies with its frees deferred: its record is left as it was (a running
 * operation may still read its shape), its slot and memory go later. */
static NDM__COLD void array_dies_later(ndm__array *r, ndm__manager *from, free_batch *fb)
{
    record_dies(r);
    ndm__light_barrier(); /* (see array_dies) */
    unsigned v = view_dies(r, from, fb, true);
    ndm__defer(later_record, r, !(v & VIEW_WAITS));
}

static NDM__ALWAYS_INLINE void array_dies_as(ndm__thread *th, ndm__array *r,
                                             ndm__manager *from, const ndm__site *site,
                                             uint32_t by, uint32_t by_gen, free_batch *fb)
{
    r->dead_file = site->file;
    r->dead_func = site->func;
    r->dead_line = site->line;
    r->dead_by = by;
    r->dead_by_gen = by_gen;
    /* Another thread's array, or one another thread looked up: its
     * operations may be reading it. (Read before the generation moves: a
     * mark made after this read is made by a lookup that then sees r dead,
     * or that the barrier in view_dies orders before the reads after it,
     * which defer all the same.) */
    bool multi = atomic_load_explicit(&ndm__multi, memory_order_relaxed);
    uint32_t tag = NDM__UNLIKELY(multi) && th ? th->tag : 0;
    if (NDM__UNLIKELY(multi) && atomic_load_explicit(&r->marks, memory_order_relaxed) != tag) {
        array_dies_later(r, from, fb);
        return;
    }
    record_dies(r);
    /* The generation moved on: a lookup that marks r or its storage from now
     * on finds r dead, one that marked them before is seen below; so is a
     * second thread that started to use ndm meanwhile (ndm__multi). */
    ndm__light_barrier();
    unsigned v = view_dies(r, from, fb, false);
    if (NDM__UNLIKELY(v & VIEW_DEFERRED) ||
        NDM__UNLIKELY(atomic_load_explicit(&ndm__multi, memory_order_relaxed) &&
                      atomic_load_explicit(&r->marks, memory_order_relaxed) !=
                          (th ? th->tag : 0))) {
        /* its memory waits (its storage is marked), or r was marked by a
         * lookup racing with this death */
        ndm__defer(later_record, r, !(v & VIEW_WAITS));
        return;
    }
    ndm__array_free_dims(r);
    if (NDM__UNLIKELY(r->ext)) {
        /* a parameter's record (autograd); its gradient array lives on in
         * the manager like any other array */
        free(r->ext);
        r->ext = NULL;
    }
    if (!(v & VIEW_WAITS))
        ndm__array_slot_free_as(th, r->self);
}

static NDM__ALWAYS_INLINE void array_dies(ndm__array *r, ndm__manager *from,
                                          const ndm__site *site, uint32_t by, uint32_t by_gen,
                                          free_batch *fb)
{
    array_dies_as(ndm__tls, r, from, site, by, by_gen, fb);
}

/* The storage bookkeeping of view r moving from `from` to `to` once its
 * charge, if it follows r, has moved (the caller counted it: view_moves,
 * or ndm__charge_commit for a list): both manager locks held, and the
 * storage's lock when other views share it. */
static void view_follows(ndm__array *r, ndm__manager *from, ndm__manager *to)
{
    ndm__storage *s = r->storage;
    ndm__storage_cold *c = ndm__storage_cold_of(s);
    bool shared = (atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT) > 1;
    /* Unshared and unlisted, r is the home and holds the charge alone. */
    bool listed = c->first_view != 0;
    if (s->charged == from->self) {
        if (!listed || c->charged_views == 1) {
            /* r is the charged manager's last view: the charge follows it. */
            s->charged = to->self;
            if (listed)
                c->charged_views = shared ? count_views(s, to->self) + 1 : 1;
            ndm__alloc_retag(s->cookie, to->self);
        } else {
            c->charged_views--;
        }
    } else if (s->charged == to->self) {
        c->charged_views++;
    }
}

/* View r moves from `from` to `to`; both manager locks held. Fails with
 * NDM_E_QUOTA (nothing changed) when the charge would move into a full
 * limit, unless `force`. */
static ndm_status view_moves(ndm__array *r, ndm__manager *from, ndm__manager *to, bool force,
                             const char *api, ndm__site where)
{
    ndm__storage *s = r->storage;
    ndm__storage_cold *c = ndm__storage_cold_of(s);
    bool shared = (atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT) > 1;
    if (shared)
        ndm__lock_take(&c->lock);
    ndm_status st = NDM_OK;
    if (s->charged == from->self && (!c->first_view || c->charged_views == 1))
        st = ndm__charge_move(from, to, ndm__device_slot(s->device), (int64_t)s->nbytes, force,
                              false, api, where);
    if (st == NDM_OK)
        view_follows(r, from, to);
    if (shared)
        ndm__lock_drop(&c->lock);
    return st;
}

/* ---- unlinking and killing ---------------------------------------------------- */

static inline void unlink_from(ndm__manager *m, ndm__array *r)
{
    ndm__arrays_remove(m, r->pos, true);
}

void ndm__arrays_grow_fail_after(int n) { ndm__inject_fail_after(n, NDM__INJ_ARRAYS); }

bool ndm__arrays_grow(ndm__manager *m)
{
    uint32_t cap = m->arrays_cap ? 2 * m->arrays_cap : 64;
    if (cap <= m->arrays_cap)
        return false;
    uint32_t *p = ndm__realloc(m->arrays, (size_t)cap * sizeof *p, NDM__INJ_LIST | NDM__INJ_ARRAYS);
    if (!p)
        return false;
    m->arrays = p;
    m->arrays_cap = cap;
    return true;
}

void ndm__arrays_compact(ndm__manager *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->narrays; i++) {
        uint32_t a = m->arrays[i];
        if (a) {
            m->arrays[n] = a;
            ndm__array_rec(a)->pos = n++;
        }
    }
    m->narrays = n;
    m->holes = 0;
}

/* The release of live record r by thread th (its state, or NULL), inline
 * in ndm_array_release: its manager, read without the lock, is checked
 * again under it (a move may change it meanwhile). */
static NDM__ALWAYS_INLINE ndm_status release_as(ndm__thread *th, ndm__array *r,
                                                const ndm__site *site)
{
    uint32_t gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
    for (;;) {
        ndm__manager *m = ndm__manager_rec(ndm__array_mgr_unlocked(r));
        bool fast = ndm__mlock_acquire_as(m, th);
        ndm_status st = NDM_ALREADY;
        if (atomic_load_explicit(&r->gen, memory_order_relaxed) != gen ||
            !atomic_load_explicit(&r->live, memory_order_relaxed)) {
            /* released meanwhile */
        } else if (NDM__UNLIKELY(r->mgr != m->self)) { /* moved by another thread meanwhile */
            ndm__mlock_release(m, fast);
            continue;
        } else if (NDM__LIKELY(!(atomic_load_explicit(&m->state, memory_order_relaxed) &
                                 NDM__M_DRAINING))) {
            /* (when draining, its manager's close is releasing it now) */
            unlink_from(m, r);
            m->live--;
            m->released++;
            array_dies_as(th, r, m, site, 0, 0, NULL);
            st = NDM_OK;
        }
        ndm__mlock_release(m, fast);
        return st;
    }
}

ndm_status ndm__array_release(ndm__array *r, ndm__site site, const char *api)
{
    (void)api;
    return release_as(ndm__tls, r, &site);
}

/* ndm_array_release of a handle that names no live array: NDM_ALREADY for
 * one that did (its array died), else the error. */
static NDM__COLD ndm_status release_refused(ndm_array h, const ndm__site *site)
{
    if (h.id == 0)
        return ndm__fail_null("ndm_array_release", *site, "array");
    if (!ndm__array_issued(h))
        return ndm__fail(NDM_E_INVALID, "ndm_array_release", *site,
                         "not an array handle (id 0x%016" PRIx64 ")", h.id);
    /* A second ndm_array_release of one array is most often a bug (an
     * array released by its manager's close is not: owners in C++ release
     * what a close may have taken first), so it goes to the log, with the
     * first release's line; the status stays NDM_ALREADY, not an error. */
    char story[1536], at[256];
    bool direct;
    if (stale_story(h, story, sizeof story, &direct) && direct)
        ndm__warn("ndm_array_release: released twice: %s; again at %s", story,
                  ndm__site_str(*site, at, sizeof at));
    return NDM_ALREADY;
}

NDM_API ndm_status ndm_array_release_at(NDM_SITE_PARAMS, ndm_array h)
{
    ndm__site site = NDM__SITE;
    /* (no mark: the death of another thread's array defers all the same) */
    ndm__array *r = ndm__array_peek_meta(h);
    /* the fast check passes a dead slot's next generation, never issued yet */
    if (NDM__UNLIKELY(!r) || NDM__UNLIKELY(!atomic_load_explicit(&r->live, memory_order_acquire)))
        return release_refused(h, &site);
    ndm__thread *th = ndm__thread_get(); /* (a thread that kills arrays counts: see ndm__multi) */
    ndm_status st = release_as(th, r, &site);
    if (NDM__UNLIKELY(th != NULL && th->limbo != NULL))
        ndm__reclaim(true);
    return st;
}

/* Give a borrowed array back to its lender during the borrower's close; a
 * lender that is gone (or closing) passes it on to the one before it.
 * Returns false when none is left (the caller releases the array). */
static bool give_back(ndm__manager *from, ndm__array *r)
{
    for (;;) {
        ndm__manager *to = ndm__manager_peek(ndm__manager_handle(r->lender, r->lender_gen));
        if (to && to != from) {
            ndm__manager *a = from->self < to->self ? from : to;
            ndm__manager *b = from->self < to->self ? to : from;
            ndm__mlock_take(a);
            ndm__mlock_take(b);
            /* (with no memory for its entry there, r goes on as when the
             * lender is gone) */
            if (ndm__manager_open_as(to, r->lender_gen) && ndm__arrays_room(to)) {
                unlink_from(from, r);
                from->live--;
                from->moved_out++;
                (void)view_moves(r, from, to, true, NULL, NDM__NO_SITE); /* forced */
                ndm__array_link_into(to, r);
                to->live++;
                to->moved_in++;
                lenders_pop(r);
                r->dead_by_gen = 0; /* (back at its lender: no move of its own to tell) */
                ndm__mlock_drop(b);
                ndm__mlock_drop(a);
                return true;
            }
            ndm__mlock_drop(b);
            ndm__mlock_drop(a);
        }
        ndm__mlock_take(from);
        bool more = r->mgr == from->self && r->lender && lenders_pop(r);
        ndm__mlock_drop(from);
        if (!more)
            return false;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static bool in_keep(uint32_t slot, const uint32_t *keep, size_t n, bool sorted)
{
    if (sorted)
        return bsearch(&slot, keep, n, sizeof *keep, cmp_u32) != NULL;
    for (size_t i = 0; i < n; i++)
        if (keep[i] == slot)
            return true;
    return false;
}

/* Release the arrays of m newest first, except `keep` (m is open: a scope's
 * release); borrowed arrays go back to their lenders. Other threads may add
 * or release arrays while the lock is dropped to give an array back, and
 * the walk restarts then. */
/* A drain of m meets r, borrowed: bring m's counters and frees up to date,
 * give r back to its lender with m's lock dropped, and take the lock again.
 * True when the walk must start again from m's head (r went back, or the
 * list changed meanwhile); false when the lender is gone and r is m's to
 * release now. */
static bool drain_lend_back(ndm__manager *m, ndm__array *r, bool *fast, uint64_t *gone,
                            free_batch *fb)
{
    uint32_t g = atomic_load_explicit(&r->gen, memory_order_relaxed);
    m->live -= *gone;
    m->released += *gone;
    *gone = 0;
    batch_flush(fb);
    ndm__mlock_release(m, *fast);
    bool back = give_back(m, r);
    *fast = ndm__mlock_acquire(m);
    if (back || atomic_load_explicit(&r->gen, memory_order_relaxed) != g || r->mgr != m->self)
        return true;
    lenders_drop(r); /* every lender is gone: release it here */
    return false;
}

static void drain(ndm__manager *m, const uint32_t *keep, size_t nkeep, bool sorted,
                  ndm__site site)
{
    uint64_t gone = 0; /* released, not yet counted: the counters catch up before unlocking */
    free_batch fb;
    batch_init(&fb, m);
    bool fast = ndm__mlock_acquire(m);
    /* Entries at and above i are done; removals leave the ones below in
     * place (no compaction until the walk ends). */
    uint32_t i = m->narrays;
    while (i) {
        uint32_t cur = m->arrays[i - 1];
        if (!cur || (nkeep && in_keep(cur, keep, nkeep, sorted))) {
            i--;
            continue;
        }
        ndm__array *r = ndm__array_rec(cur);
        if (r->lender && drain_lend_back(m, r, &fast, &gone, &fb)) {
            i = m->narrays;
            continue;
        }
        i = r->pos; /* (the entries may have moved while the lock was dropped) */
        ndm__arrays_remove(m, r->pos, false);
        gone++;
        array_dies(r, m, &site, 0, 0, &fb);
    }
    if (m->holes > m->narrays / 2)
        ndm__arrays_compact(m);
    m->live -= gone;
    m->released += gone;
    batch_flush(&fb);
    ndm__mlock_release(m, fast);
}

/* The plain arrays of a closing manager's drain: each made its storage, has
 * no other view, is charged to m on m's device, holds memory from the
 * allocator, a short shape, no extension and no lender. They die from entry
 * i - 1 down with a few stores each, their memory, bytes and slots going
 * back in batches. Returns the number of entries left below the first array
 * that is not plain, plus one (0: none left): the caller kills that one on
 * the general path. */
static uint32_t drain_plain(ndm__manager *m, uint32_t i, const ndm__site *site,
                            uint32_t by_gen, uint64_t *gone)
{
    const char *file = site->file, *func = site->func;
    int line = site->line;
    uint32_t by = m->self;
    ndm_device dev = m->device;
    const uint32_t *arrays = m->arrays;
    bool multi = atomic_load_explicit(&ndm__multi, memory_order_relaxed);
    uint32_t tag = ndm__thread_tag();
    void *cookies[FREE_BATCH];
    uint32_t slots[FREE_BATCH];
    int64_t bytes = 0;
    uint32_t n = 0;
    uint64_t k = 0;
    for (; i; i--) {
        uint32_t cur = arrays[i - 1];
        if (!cur)
            continue;
        ndm__array *r = ndm__array_rec(cur);
        ndm__storage *s = r->storage;
        if (NDM__UNLIKELY(s != &r->own || r->lender || r->ext || r->shape != r->dims ||
                          atomic_load_explicit(&s->refs, memory_order_relaxed) != 1 ||
                          s->charged != by || !same_device(s->device, dev) || !s->cookie ||
                          (multi && atomic_load_explicit(&r->marks, memory_order_relaxed) != tag)))
            break;
        r->dead_file = file;
        r->dead_func = func;
        r->dead_line = line;
        r->dead_by = by;
        r->dead_by_gen = by_gen;
        atomic_store_explicit(&r->live, 0, memory_order_relaxed);
        unsigned g = (atomic_load_explicit(&r->gen, memory_order_relaxed) + 1) & 0x7fffffffu;
        atomic_store_explicit(&r->gen, g ? g : 1, memory_order_release);
        ndm__light_barrier(); /* (see array_dies) */
        if (NDM__UNLIKELY(atomic_load_explicit(&s->refs, memory_order_relaxed) != 1 ||
                          (atomic_load_explicit(&ndm__multi, memory_order_relaxed) &&
                           atomic_load_explicit(&r->marks, memory_order_relaxed) != tag))) {
            /* marked shared by a lookup racing with the close (see view_dies) */
            bytes += (int64_t)s->nbytes;
            ndm__defer(later_storage, s, 0);
            ndm__defer(later_record, r, 1);
            atomic_store_explicit(&s->refs, 0, memory_order_relaxed);
            k++;
            continue;
        }
        atomic_store_explicit(&s->refs, 0, memory_order_relaxed);
        bytes += (int64_t)s->nbytes;
        cookies[n] = s->cookie;
        slots[n] = cur;
        if (NDM__UNLIKELY(++n == FREE_BATCH)) {
            ndm__bytes_sub(m, m->dev, bytes);
            ndm__free_many(dev, cookies, n);
            ndm__array_slot_free_many(slots, n);
            k += n;
            bytes = 0;
            n = 0;
        }
    }
    if (n) {
        ndm__bytes_sub(m, m->dev, bytes);
        ndm__free_many(dev, cookies, n);
        ndm__array_slot_free_many(slots, n);
        k += n;
    }
    *gone += k;
    return i;
}

/* The drain of a closing manager. Nobody else reads or changes its entries
 * meanwhile (a release or a move sees it closing and backs off; readers take
 * its lock, held here except while an array goes back to its lender), so the
 * entries are not removed one by one: they are cut off as they are consumed. */
void ndm__manager_drain_arrays(ndm__manager *m, ndm__site site)
{
    uint32_t by = m->self, by_gen = atomic_load_explicit(&m->gen, memory_order_relaxed);
    uint64_t gone = 0;
    free_batch fb;
    batch_init(&fb, m);
    /* With limits to keep current, or frees to defer, every array takes the
     * general path. */
    bool plain = fb.owner != NULL;
    bool fast = ndm__mlock_acquire(m);
    for (uint32_t i = m->narrays; i;) {
        if (NDM__LIKELY(plain) && !(i = drain_plain(m, i, &site, by_gen, &gone)))
            break;
        uint32_t cur = m->arrays[i - 1];
        if (!cur) {
            i--;
            continue;
        }
        ndm__array *r = ndm__array_rec(cur);
        if (NDM__UNLIKELY(r->lender)) {
            /* The entries must be whole (up to r) while the lock is dropped.
             * Their holes are not counted again (a close with many borrowed
             * arrays would count them once for each): i bounds them, and
             * only r's entry, the last, leaves meanwhile, which takes no
             * more than that bound down. */
            m->narrays = i;
            m->holes = i;
            if (drain_lend_back(m, r, &fast, &gone, &fb)) {
                i = m->narrays;
                continue;
            }
            i = r->pos + 1;
        }
        i--;
        gone++;
        array_dies(r, m, &site, by, by_gen, &fb);
    }
    m->narrays = 0;
    m->holes = 0;
    m->live -= gone;
    m->released += gone;
    batch_flush(&fb);
    ndm__mlock_release(m, fast);
}

void ndm__manager_release_except(ndm__manager *m, const uint32_t *keep, size_t n, ndm__site site)
{
    uint32_t *sorted = NULL;
    if (n > 16 && (sorted = ndm__malloc(n * sizeof *sorted, NDM__INJ_SCRATCH))) {
        memcpy(sorted, keep, n * sizeof *sorted);
        qsort(sorted, n, sizeof *sorted, cmp_u32);
        keep = sorted;
    }
    drain(m, keep, n, sorted != NULL, site);
    free(sorted);
}

/* ---- moves -------------------------------------------------------------------- */

/* MOVE_SCOPE: an attach by a scope's end (it reads as ndm_attach but is
 * recorded as the scope's). */
enum move_kind { MOVE_ATTACH, MOVE_RET, MOVE_DETACH, MOVE_LEND, MOVE_SCOPE };

const char *ndm__move_name(uint32_t how)
{
    switch (how) {
    case NDM__MOVED_ATTACH: return "ndm_attach";
    case NDM__MOVED_RET: return "ndm_ret";
    case NDM__MOVED_DETACH: return "ndm_detach";
    case NDM__MOVED_LEND: return "ndm_temp_attach";
    case NDM__MOVED_LIST: return "ndm_attach_all";
    case NDM__MOVED_SCOPE: return "a scope's end";
    default: return "a move";
    }
}

static ndm_status move_locked(ndm__array *r, uint32_t rgen, ndm_manager target,
                              enum move_kind kind, ndm__lend **prev, const char *api,
                              ndm__site site);

static ndm_status move(ndm_array h, ndm_manager target, enum move_kind kind, const char *api,
                       ndm__site site)
{
    ndm__array *r = ndm__array_get(h, api, site);
    if (!r)
        return ndm_last_status();
    /* A loan records the current lender, if any, as the one before: room
     * for it is taken before any lock (it is rare, and freed if unused). */
    ndm__lend *prev = NULL;
    if (kind == MOVE_LEND && !(prev = malloc(sizeof *prev)))
        return ndm__fail(NDM_E_OOM, api, site, "no memory to record the lender");
    ndm_status st = move_locked(r, ndm__id_gen(h.id), target, kind, &prev, api, site);
    free(prev);
    return st;
}

static ndm_status move_locked(ndm__array *r, uint32_t rgen, ndm_manager target,
                              enum move_kind kind, ndm__lend **prev, const char *api,
                              ndm__site site)
{
    for (;;) {
        ndm__manager *from = ndm__manager_slot(ndm__array_mgr_unlocked(r));
        ndm__manager *to;
        uint32_t named_gen = 0;
        char path[512], desc[160], made[256];
        if (kind == MOVE_RET) {
            /* (read before from's lock: ndm_manager_move may change it, which
             * the check under the locks sees) */
            uint32_t up = __atomic_load_n(&from->parent, __ATOMIC_RELAXED);
            if (atomic_load_explicit(&from->state, memory_order_relaxed) & NDM__M_BUILTIN || !up) {
                ndm__manager_path(from->self, path, sizeof path);
                return ndm__fail(NDM_E_ROOT, api, site,
                                 "array %s is owned by '%s', which has no parent to return it to",
                                 ndm__array_desc(r, desc, sizeof desc), path);
            }
            to = ndm__manager_slot(up);
        } else if (kind == MOVE_DETACH) {
            to = ndm__manager_slot(ndm__detached_slot);
        } else {
            to = ndm__manager_get(target, api, site);
            if (!to)
                return ndm_last_status();
            /* (a reserved value, NDM_CURRENT_SCOPE, has no generation of its
             * own: the resolved manager's, read right after the lookup) */
            named_gen = ndm__manager_expected_gen(target, to);
            if (kind == MOVE_LEND &&
                (atomic_load_explicit(&to->state, memory_order_relaxed) & NDM__M_BUILTIN)) {
                ndm__manager_path(to->self, path, sizeof path);
                return ndm__fail(NDM_E_ROOT, api, site,
                                 "'%s' never closes, so array %s lent to it would never come "
                                 "back: use ndm_attach or ndm_detach",
                                 path, ndm__array_desc(r, desc, sizeof desc));
            }
        }
        if (to == from) {
            if (kind == MOVE_ATTACH || kind == MOVE_SCOPE) {
                /* (the lender is read under the lock: a close giving r back
                 * may be changing it) */
                ndm__mlock_take(from);
                if (r->mgr == from->self && r->lender)
                    lenders_drop(r);
                ndm__mlock_drop(from);
            }
            return NDM_OK;
        }
        ndm__manager *a = from->self < to->self ? from : to;
        ndm__manager *b = from->self < to->self ? to : from;
        ndm__mlock_take(a);
        ndm__mlock_take(b);
        if (ndm__manager_slot(r->mgr) != from ||
            (kind == MOVE_RET && from->parent != to->self)) { /* moved meanwhile: start over */
            ndm__mlock_drop(b);
            ndm__mlock_drop(a);
            continue;
        }
        ndm_status st = NDM_OK;
        unsigned fs = atomic_load_explicit(&from->state, memory_order_relaxed);
        unsigned ts = atomic_load_explicit(&to->state, memory_order_relaxed);
        /* The generations tell an array released and a target closed since
         * their lookups, slots reused or not (see ndm__manager_open_as). */
        uint32_t tgen = kind == MOVE_RET      ? from->parent_gen
                        : kind == MOVE_DETACH ? atomic_load_explicit(&to->gen, memory_order_relaxed)
                                              : named_gen;
        if (!atomic_load_explicit(&r->live, memory_order_relaxed) ||
            atomic_load_explicit(&r->gen, memory_order_relaxed) != rgen || (fs & NDM__M_DRAINING)) {
            /* (a manager that is closing its children still lets its arrays
             * go: a child's on-close hook may move them) */
            st = ndm__fail(NDM_E_CLOSED, api, site, "the array is being released by a close");
        } else if (!(ts & NDM__M_LIVE) || (ts & NDM__M_CLOSING) ||
                   atomic_load_explicit(&to->gen, memory_order_relaxed) != tgen) {
            ndm__mlock_drop(b);
            ndm__mlock_drop(a);
            if (atomic_load_explicit(&to->gen, memory_order_relaxed) != tgen)
                return ndm__fail(NDM_E_CLOSED, api, site, "the target manager was closed");
            ndm__manager_path(to->self, path, sizeof path);
            return ndm__fail(NDM_E_CLOSED, api, site, "target manager '%s' is closing", path);
        } else if ((ts & NDM__M_CAP_ARRAYS) && kind != MOVE_DETACH) {
            ndm__mlock_drop(b);
            ndm__mlock_drop(a);
            ndm__manager_path(to->self, path, sizeof path);
            return ndm__fail(NDM_E_CAPPED, api, site,
                             "manager '%s' is capped; array %s created at %s refused", path,
                             ndm__array_desc(r, desc, sizeof desc),
                             ndm__site_str(ndm__array_site(r), made, sizeof made));
        } else if (!ndm__arrays_room(to)) {
            ndm__mlock_drop(b);
            ndm__mlock_drop(a);
            ndm__manager_path(to->self, path, sizeof path);
            return ndm__fail(NDM_E_OOM, api, site, "no memory for the array list of '%s'", path);
        } else {
            st = view_moves(r, from, to, kind == MOVE_DETACH, api, site);
        }
        if (st == NDM_OK) {
            unlink_from(from, r);
            from->live--;
            from->moved_out++;
            ndm__array_link_into(to, r);
            to->live++;
            to->moved_in++;
            static const uint32_t moved_as[] = {
                [MOVE_ATTACH] = NDM__MOVED_ATTACH, [MOVE_RET] = NDM__MOVED_RET,
                [MOVE_DETACH] = NDM__MOVED_DETACH, [MOVE_LEND] = NDM__MOVED_LEND,
                [MOVE_SCOPE] = NDM__MOVED_SCOPE};
            ndm__array_moved_at(r, moved_as[kind], &site);
            if (kind == MOVE_LEND) {
                if (r->lender) {
                    (*prev)->slot = r->lender;
                    (*prev)->gen = r->lender_gen;
                    (*prev)->next = r->lenders;
                    r->lenders = *prev;
                    *prev = NULL;
                } else {
                    r->lenders = NULL;
                }
                ndm__array_set_lender(r, from->self,
                                      atomic_load_explicit(&from->gen, memory_order_relaxed));
            } else if (r->lender) {
                lenders_drop(r);
            }
        }
        ndm__mlock_drop(b);
        ndm__mlock_drop(a);
        return st;
    }
}

NDM_API ndm_status ndm_attach_at(NDM_SITE_PARAMS, ndm_array a, ndm_manager m)
{
    return move(a, m, MOVE_ATTACH, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_ret_at(NDM_SITE_PARAMS, ndm_array a)
{
    return move(a, NDM_NULL_MANAGER, MOVE_RET, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_detach_at(NDM_SITE_PARAMS, ndm_array a)
{
    return move(a, NDM_NULL_MANAGER, MOVE_DETACH, __func__, NDM__SITE);
}

NDM_API ndm_status ndm_temp_attach_at(NDM_SITE_PARAMS, ndm_array a, ndm_manager m)
{
    return move(a, m, MOVE_LEND, __func__, NDM__SITE);
}

/* Internal: move r into manager `to` as ndm_attach would (used by scopes). */
ndm_status ndm__array_attach(ndm__array *r, ndm_manager to, const char *api, ndm__site site)
{
    return move(ndm__array_handle_of(r), to, MOVE_SCOPE, api, site);
}

/* ---- a list attached at once ---------------------------------------------------- */

/* ndm_attach_all is one decision: it takes the locks of the target and of
 * every manager that owns an array of the list, in slot order (the order of
 * every two-lock move, so no cycle can form however many it takes), then
 * the locks of the storages the list shares with other views, in the order
 * of their home slots (a storage lock is otherwise taken alone and last, so
 * these cannot cycle either). Under them nothing the decision reads can
 * change: no array can die, leave or enter a locked manager, no view of a
 * listed storage can come or go, and so no charge can move. Every check
 * (live arrays, open target, caps, room for the entries, the bytes under
 * every limit) is made first; the moves that follow cannot fail. The limits
 * are reserved in one step per (source, device) for the whole set, on
 * counters that creations elsewhere update without these locks: a
 * reservation that does not fit is given back before anything moved.
 * Rolling back one-by-one moves instead was not chosen: a move ends a
 * borrowed array's chain of lenders, changes its place among its owner's
 * entries (the order a close follows) and may raise a peak, none of which
 * a forced move back restores. The cost is bounded by the list: at most
 * n + 1 manager locks and n storage locks, held for a few sorts and walks
 * of the list (the buffers are allocated, and messages written, with no
 * lock held). */
typedef struct list_item {
    ndm__array *r;
    size_t index;              /* its first place in the caller's list */
    uint32_t gen;
} list_item;

typedef struct list_charge {
    uint32_t from;             /* the manager giving up the charge */
    int dev;
    int64_t bytes;
    size_t index;              /* a listed view of the storage, for messages */
} list_charge;

static int cmp_item_slot(const void *a, const void *b)
{
    const list_item *x = a, *y = b;
    if (x->r != y->r)
        return x->r->self < y->r->self ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}
static int cmp_item_index(const void *a, const void *b)
{
    const list_item *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}
static int cmp_item_storage(const void *a, const void *b)
{
    const list_item *x = a, *y = b;
    uint32_t hx = ndm__storage_home(x->r->storage)->self, hy = ndm__storage_home(y->r->storage)->self;
    return hx < hy ? -1 : hx > hy;
}
static int cmp_charge(const void *a, const void *b)
{
    const list_charge *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    return x->dev < y->dev ? -1 : x->dev > y->dev;
}

/* Refuse entry i of the list, whose handle h names no live array. */
static NDM__COLD ndm_status list_refused(ndm_array h, size_t i, const char *api, ndm__site site)
{
    if (h.id == 0)
        return ndm__fail(NDM_E_NULL, api, site, "arrays[%zu] is the null handle; nothing moved", i);
    if (!ndm__array_issued(h))
        return ndm__fail(NDM_E_INVALID, api, site,
                         "arrays[%zu] is not an array handle (id 0x%016" PRIx64 "); nothing moved",
                         i, h.id);
    char story[1536];
    bool direct;
    if (!stale_story(h, story, sizeof story, &direct))
        snprintf(story, sizeof story,
                 "the array was released and its slot has been reused since (slot %u, "
                 "generation %u)",
                 ndm__id_slot(h.id), ndm__id_gen(h.id));
    return ndm__fail(NDM_E_CLOSED, api, site, "arrays[%zu] is a stale array handle: %s; nothing moved",
                     i, story);
}

static void unlock_slots(const uint32_t *slots, size_t k)
{
    for (size_t j = k; j-- > 0;)
        ndm__mlock_drop(ndm__manager_rec(slots[j]));
}

static bool slot_listed(const uint32_t *slots, size_t k, uint32_t slot)
{
    return bsearch(&slot, slots, k, sizeof *slots, cmp_u32) != NULL;
}

/* Why a locked attempt refused: written once the locks are dropped. */
enum list_refusal { LIST_OK, LIST_DEAD, LIST_DRAINING, LIST_TARGET_GONE, LIST_TARGET_CLOSING,
                    LIST_CAPPED, LIST_OOM, LIST_QUOTA };

NDM_API ndm_status ndm_attach_all_at(NDM_SITE_PARAMS, ndm_manager m, size_t n,
                                     const ndm_array *arrays)
{
    const char *api = __func__;
    ndm__site site = NDM__SITE;
    ndm__manager *to = ndm__manager_get(m, api, site);
    if (!to)
        return ndm_last_status();
    uint32_t tgen = ndm__manager_expected_gen(m, to);
    if (n == 0)
        return NDM_OK;
    if (!arrays)
        return ndm__fail(NDM_E_INVALID, api, site, "arrays is NULL for a list of %zu", n);
    if (n > SIZE_MAX / 4 / (sizeof(list_item) + sizeof(list_charge) + 2 * sizeof(uint32_t)))
        return ndm__fail(NDM_E_INVALID, api, site, "a list of %zu arrays is too long", n);
    list_item *items = malloc(n * sizeof *items);
    list_item *byst = malloc(n * sizeof *byst);
    list_charge *charges = malloc(n * sizeof *charges);
    uint32_t *slots = malloc((n + 1) * sizeof *slots);
    if (!items || !byst || !charges || !slots) {
        free(items);
        free(byst);
        free(charges);
        free(slots);
        return ndm__fail(NDM_E_OOM, api, site, "no memory to attach a list of %zu arrays", n);
    }
    for (size_t i = 0; i < n; i++) {
        /* (a record stays a record once looked up: one that dies from here
         * on is caught by the checks under the locks) */
        items[i] = (list_item){ndm__array_peek(arrays[i]), i, ndm__id_gen(arrays[i].id)};
        if (!items[i].r) {
            free(items);
            free(byst);
            free(charges);
            free(slots);
            return list_refused(arrays[i], i, api, site);
        }
    }
    /* Duplicates move once: the first place counts. */
    qsort(items, n, sizeof *items, cmp_item_slot);
    size_t ni = 0;
    for (size_t i = 0; i < n; i++)
        if (ni == 0 || items[ni - 1].r != items[i].r)
            items[ni++] = items[i];
    qsort(items, ni, sizeof *items, cmp_item_index);

    enum list_refusal why = LIST_OK;
    size_t bad = 0;                    /* the entry a refusal names */
    ndm__quota_miss miss = {0};
    list_charge over = {0};
    size_t k, nmove, nst, ncharge;
    for (;;) {
        k = 0;
        slots[k++] = to->self;
        for (size_t i = 0; i < ni; i++)
            slots[k++] = ndm__array_mgr_unlocked(items[i].r);
        qsort(slots, k, sizeof *slots, cmp_u32);
        size_t kk = 0;
        for (size_t j = 0; j < k; j++)
            if (kk == 0 || slots[kk - 1] != slots[j])
                slots[kk++] = slots[j];
        k = kk;
        for (size_t j = 0; j < k; j++)
            ndm__mlock_take(ndm__manager_rec(slots[j]));
        bool moved = false;
        for (size_t i = 0; i < ni && !moved; i++)
            moved = !slot_listed(slots, k, items[i].r->mgr);
        if (!moved)
            break;
        unlock_slots(slots, k); /* an array changed owners meanwhile: lock again */
    }
    /* Every lock is held from here to the end of the decision. */
    nmove = 0;
    for (size_t i = 0; i < ni && why == LIST_OK; i++) {
        ndm__array *r = items[i].r;
        if (!atomic_load_explicit(&r->live, memory_order_relaxed) ||
            atomic_load_explicit(&r->gen, memory_order_relaxed) != items[i].gen) {
            why = LIST_DEAD;
            bad = items[i].index;
        } else if (atomic_load_explicit(&ndm__manager_rec(r->mgr)->state, memory_order_relaxed) &
                   NDM__M_DRAINING) {
            why = LIST_DRAINING;
            bad = items[i].index;
        } else if (r->mgr != to->self) {
            nmove++;
        }
    }
    unsigned ts = atomic_load_explicit(&to->state, memory_order_relaxed);
    if (why != LIST_OK) {
    } else if (atomic_load_explicit(&to->gen, memory_order_relaxed) != tgen) {
        why = LIST_TARGET_GONE;
    } else if (!(ts & NDM__M_LIVE) || (ts & NDM__M_CLOSING)) {
        why = LIST_TARGET_CLOSING;
    } else if ((ts & NDM__M_CAP_ARRAYS) && nmove) {
        why = LIST_CAPPED;
        for (size_t i = 0; i < ni; i++)
            if (items[i].r->mgr != to->self) {
                bad = items[i].index;
                break;
            }
    } else {
        while (why == LIST_OK && to->arrays_cap - to->narrays < nmove)
            if (!ndm__arrays_grow(to))
                why = LIST_OOM;
    }
    /* The storages of the moving arrays, in home-slot order; those other
     * views share are locked. */
    nst = 0;
    if (why == LIST_OK) {
        for (size_t i = 0; i < ni; i++)
            if (items[i].r->mgr != to->self)
                byst[nst++] = items[i];
        qsort(byst, nst, sizeof *byst, cmp_item_storage);
        for (size_t i = 0; i < nst; i++) {
            ndm__storage *s = byst[i].r->storage;
            if ((i == 0 || byst[i - 1].r->storage != s) &&
                (atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT) > 1)
                ndm__lock_take(&ndm__storage_cold_of(s)->lock);
        }
    }
    /* A storage's charge moves when every view of it that its charged
     * manager owns is in the list; one charge per source and device is
     * reserved for the whole set. */
    ncharge = 0;
    for (size_t i = 0; why == LIST_OK && i < nst;) {
        ndm__storage *s = byst[i].r->storage;
        size_t views = 0, first = byst[i].index;
        for (; i < nst && byst[i].r->storage == s; i++)
            views += byst[i].r->mgr == s->charged;
        if (views && views == ndm__storage_charged_views(s))
            charges[ncharge++] = (list_charge){s->charged, ndm__device_slot(s->device),
                                               (int64_t)s->nbytes, first};
    }
    qsort(charges, ncharge, sizeof *charges, cmp_charge);
    size_t ng = 0;
    for (size_t j = 0; j < ncharge; j++) {
        if (ng && charges[ng - 1].from == charges[j].from && charges[ng - 1].dev == charges[j].dev) {
            charges[ng - 1].bytes += charges[j].bytes;
            if (charges[j].index < charges[ng - 1].index)
                charges[ng - 1].index = charges[j].index;
        } else {
            charges[ng++] = charges[j];
        }
    }
    ncharge = ng;
    for (size_t j = 0; why == LIST_OK && j < ncharge; j++) {
        ndm__manager *f = ndm__manager_rec(charges[j].from);
        if (ndm__charge_reserve(f, to, charges[j].dev, charges[j].bytes, &miss) < 0) {
            why = LIST_QUOTA;
            over = charges[j];
            bad = over.index;
            while (j-- > 0)
                ndm__charge_unreserve(ndm__manager_rec(charges[j].from), to, charges[j].dev,
                                      charges[j].bytes);
            /* (the message tells the whole set's bytes on that device, and
             * what the limit held before the list came) */
            miss.bytes = 0;
            for (size_t g = 0; g < ncharge; g++)
                if (charges[g].dev == miss.dev)
                    miss.bytes += charges[g].bytes;
            ndm__limits *l = ndm__manager_rec(miss.slot)->limits;
            miss.used = atomic_load_explicit(&l->used[miss.dev], memory_order_relaxed);
            break;
        }
    }
    /* (described while the locks keep the refused array alive) */
    char desc[160] = "", made[256] = "";
    for (size_t i = 0; (why == LIST_CAPPED || why == LIST_QUOTA) && i < ni; i++)
        if (items[i].index == bad) {
            ndm__array_desc(items[i].r, desc, sizeof desc);
            ndm__site_str(ndm__array_site(items[i].r), made, sizeof made);
        }
    if (why == LIST_OK) {
        /* The decision is made: the moves, in the list's order. */
        for (size_t i = 0; i < ni; i++) {
            ndm__array *r = items[i].r;
            if (r->mgr != to->self) {
                ndm__manager *from = ndm__manager_rec(r->mgr);
                unlink_from(from, r);
                from->live--;
                from->moved_out++;
                view_follows(r, from, to);
                ndm__array_link_into(to, r);
                to->live++;
                to->moved_in++;
                ndm__array_moved_at(r, NDM__MOVED_LIST, &site);
            }
            if (r->lender)
                lenders_drop(r); /* an attach ends a loan */
        }
        for (size_t j = 0; j < ncharge; j++)
            ndm__charge_commit(ndm__manager_rec(charges[j].from), to, charges[j].dev,
                               charges[j].bytes);
    }
    for (size_t i = nst; i-- > 0;) {
        ndm__storage *s = byst[i].r->storage;
        if ((i == 0 || byst[i - 1].r->storage != s) &&
            (atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT) > 1)
            ndm__lock_drop(&ndm__storage_cold_of(s)->lock);
    }
    unlock_slots(slots, k);

    ndm_status st = NDM_OK;
    char path[512], fpath[512], devs[32];
    switch (why) {
    case LIST_OK:
        break;
    case LIST_DEAD:
    case LIST_DRAINING:
        st = ndm__fail(NDM_E_CLOSED, api, site,
                       "arrays[%zu] is being released by a close%s; nothing moved", bad,
                       why == LIST_DRAINING ? " of its manager" : "");
        break;
    case LIST_TARGET_GONE:
        st = ndm__fail(NDM_E_CLOSED, api, site, "the target manager was closed; nothing moved");
        break;
    case LIST_TARGET_CLOSING:
        ndm__manager_path(to->self, path, sizeof path);
        st = ndm__fail(NDM_E_CLOSED, api, site, "target manager '%s' is closing; nothing moved",
                       path);
        break;
    case LIST_CAPPED:
        ndm__manager_path(to->self, path, sizeof path);
        st = ndm__fail(NDM_E_CAPPED, api, site,
                       "manager '%s' is capped; arrays[%zu] (%s created at %s) refused, nothing "
                       "moved",
                       path, bad, desc, made);
        break;
    case LIST_OOM:
        ndm__manager_path(to->self, path, sizeof path);
        st = ndm__fail(NDM_E_OOM, api, site, "no memory for the array list of '%s'; nothing moved",
                       path);
        break;
    case LIST_QUOTA:
        ndm__manager_path(miss.slot, path, sizeof path);
        ndm__manager_path(over.from, fpath, sizeof fpath);
        ndm_device_str(ndm__slot_device(miss.dev), devs, sizeof devs);
        st = ndm__fail(NDM_E_QUOTA, api, site,
                       "the list's %" PRId64 " bytes on %s (arrays[%zu], %s of '%s', among "
                       "them) would exceed the limit of manager '%s' (limit %" PRIu64
                       ", in use %" PRId64 "); nothing moved",
                       miss.bytes, devs, bad, desc, fpath, path,
                       miss.limit, miss.used);
        break;
    }
    free(items);
    free(byst);
    free(charges);
    free(slots);
    return st;
}
