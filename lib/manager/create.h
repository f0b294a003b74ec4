/* The creation of an array with fresh storage, inline where arrays are made
 * most (ndm__array_new_in and the factories): the common case is straight-line
 * code; closing, capped and limited managers, long shapes and failures call out. */
#ifndef NDM_CREATE_H
#define NDM_CREATE_H

#include "core.h"
#include "plan.h"
#include "thread.h"

/* Out of line (array.c). */
ndm_status ndm__array_dims_on_heap(ndm__array *r, int ndim, const char *api,
                                   const ndm__site *where);
void ndm__array_free_heap_dims(ndm__array *r);
ndm_array ndm__array_shape_refused(int ndim, const int64_t *shape, ndm_dtype dtype,
                                   const char *api, const ndm__site *site);
/* Undo a creation that failed after its checks: r's heap shape (r given),
 * the memory (blk given), the slot (non-zero) and the limit reservation
 * (see ndm__array_create) go back. Returns the null handle. */
ndm_array ndm__array_create_undo(ndm__array *r, uint32_t slot, ndm__manager *m, uint32_t gen,
                                 ndm_device dev, const ndm__block *blk, size_t nbytes,
                                 bool limited);
/* m's lock held: m is not the live, open manager of generation gen. Drops
 * the lock (`fast` as ndm__mlock_acquire returned it) and records
 * NDM_E_CLOSED. */
void ndm__array_refused_closed(ndm__manager *m, uint32_t gen, bool fast, const char *api,
                               const ndm__site *site);
/* ndm__array_new_inline when m is closing, capped or limited: the checks,
 * the limit reserved before any memory is taken, then the creation. */
ndm_array ndm__array_create_checked(const ndm__site *site, const char *api, ndm__manager *m,
                                    uint32_t gen, ndm_device dev, ndm_dtype dtype, int ndim,
                                    const int64_t *shape, size_t nbytes, ndm__array **out);
/* Kernel scratch (lib/ops/scratch.c): reserve bytes in the limits over m,
 * the open manager of generation gen, as an array's storage would be (and
 * given back by m's close if it comes first); *charged false when m has no
 * limit to keep (nothing was reserved). NDM_E_QUOTA or NDM_E_CLOSED,
 * recorded for api at site. */
ndm_status ndm__scratch_reserve(ndm__manager *m, uint32_t gen, ndm_device dev, size_t bytes,
                                const char *api, const ndm__site *site, bool *charged);
void ndm__scratch_unreserve(ndm__manager *m, uint32_t gen, ndm_device dev, int64_t bytes);

/* Whether m, its lock held, is still the live, open manager of generation
 * gen: the test every creation and move makes before it links an array into
 * m. Close protocol: a close sets NDM__M_CLOSING under m's lock before it
 * drains m, and makes its last change (the state to 0, the generation
 * moved on) under m's lock too, before the slot can be reused; so a thread
 * that passes this test under the lock links into a manager whose drain
 * has not started and will see the entry. The generation, which the caller
 * took from its handle (or read right after its lookup), tells a manager
 * that closed, and a slot that a new manager took, since the lookup: the
 * state alone tells neither. Only atomics are read before the test passes:
 * a new manager's record_init may be writing the rest of a reused record. */
static inline bool ndm__manager_open_as(ndm__manager *m, uint32_t gen)
{
    unsigned st = atomic_load_explicit(&m->state, memory_order_relaxed);
    return NDM__LIKELY((st & (NDM__M_LIVE | NDM__M_CLOSING)) == NDM__M_LIVE) &&
           NDM__LIKELY(atomic_load_explicit(&m->gen, memory_order_relaxed) == gen);
}

/* Point the record at room for its shape and strides: inline, the strides
 * right after the sizes so that a small rank stays on the record's third
 * line, or on the heap for a long shape. */
static inline ndm_status ndm__array_dims_place(ndm__array *r, int ndim, const char *api,
                                               const ndm__site *where)
{
    r->ndim = ndim;
    if (NDM__LIKELY(ndim <= NDM__INLINE_DIMS)) {
        r->shape = r->dims;
        r->strides = r->dims + ndim;
        return NDM_OK;
    }
    return ndm__array_dims_on_heap(r, ndim, api, where);
}

static inline void ndm__array_free_dims(ndm__array *r)
{
    if (NDM__UNLIKELY(r->shape != r->dims))
        ndm__array_free_heap_dims(r);
}

/* Enter r as m's newest array (m's lock held, room made by ndm__arrays_room). */
static inline void ndm__array_link_into(ndm__manager *m, ndm__array *r)
{
    /* (an atomic store: see ndm__array_mgr_unlocked) */
    __atomic_store_n(&r->mgr, m->self, __ATOMIC_RELAXED);
    r->pos = m->narrays;
    m->arrays[m->narrays++] = r->self;
}

/* The fields every new record sets; the storage s is its own or a base's,
 * `tag` the making thread's (ndm__thread_tag).
 * (The view-list links are set only for a view, see ndm__array_view.) */
static inline void ndm__array_record_init(ndm__array *r, ndm_dtype dtype, ndm__storage *s,
                                          const ndm__site *site, uint32_t tag)
{
    r->dtype = dtype;
    r->offset = 0;
    r->storage = s;
    r->ext = NULL;
    r->lender = 0;
    r->made_file = site->file;
    r->made_func = site->func;
    r->made_line = site->line;
    atomic_store_explicit(&r->marks, tag, memory_order_relaxed);
    r->epoch = atomic_load_explicit(&ndm__epoch, memory_order_relaxed);
}

/* A fresh storage in r's own room, charged to m, with r its one view (no
 * list: see ndm__storage_cold). Nobody can reach it yet: the slot's previous
 * storage died before the slot was freed, its lock free and its list ended. */
static inline ndm__storage *ndm__array_storage_init(ndm__array *r, ndm__manager *m,
                                                    ndm_device dev, size_t nbytes)
{
    ndm__storage *s = &r->own;
    atomic_init(&s->refs, 1);
    s->charged = m->self;
    s->device = dev;
    s->nbytes = nbytes;
    return s;
}

/* Element bytes of a shape; false for a bad dtype, rank or size, or when
 * the extent of the shape (the product of its non-zero sizes, which bounds
 * its strides) overflows in bytes, for an empty array too (ndm__shape_check
 * then writes the message). */
static inline bool ndm__shape_bytes(int ndim, const int64_t *shape, ndm_dtype dtype,
                                    size_t *nbytes)
{
    if ((unsigned)dtype >= NDM_DTYPE_COUNT || ndim < 0 || (ndim && !shape))
        return false;
    int64_t isz = (int64_t)ndm__dtype_bytes[dtype], extent, numel;
    if (ndm__ckd_extent(ndim, shape, isz, &extent, &numel))
        return false;
    *nbytes = (size_t)numel * (size_t)isz;
    return true;
}

/* The creation once the checks passed: a slot, the memory, the record, the
 * link into m, if m is still the open manager of generation gen. `limited`:
 * nbytes were reserved in m's limits and counted in m's `reserved` (under
 * its lock, see ndm__dev_count), so that a close that comes first gives the
 * reservation back and the creation, finding the generation moved, leaves
 * it alone. `th` is the calling thread's state (ndm__tls, read once by the
 * caller). */
static NDM__ALWAYS_INLINE ndm_array ndm__array_create(ndm__thread *th,
                                                      const ndm__site *site, const char *api,
                                                      ndm__manager *m, uint32_t gen,
                                                      ndm_device dev,
                                                      ndm_dtype dtype, int ndim,
                                                      const int64_t *shape, size_t nbytes,
                                                      bool limited, ndm__array **out)
{
    uint32_t slot = ndm__array_slot_alloc_as(th);
    if (NDM__UNLIKELY(!slot)) {
        ndm__fail(NDM_E_OOM, api, *site, "no memory for an array record");
        return ndm__array_create_undo(NULL, 0, m, gen, dev, NULL, nbytes, limited);
    }
    ndm__array *r = ndm__array_rec(slot);
    ndm__storage *s = &r->own;
    ndm__alloc_tag tag = {m->self, site->file, site->func, site->line, api, false};
    ndm__block blk;
    if (NDM__UNLIKELY(ndm__storage_alloc(m, dev, nbytes, &tag, &blk) < 0)) {
        /* The allocator's message says what it had, as api's failure at
         * the tag's site: logged once. Without an api it named neither. */
        if (!api)
            ndm__fail(ndm_last_status(), api, *site, "%s", ndm_last_error());
        return ndm__array_create_undo(NULL, slot, m, gen, dev, NULL, nbytes, limited);
    }
    ndm__array_record_init(r, dtype, s, site, th ? th->tag : 0);
    if (NDM__UNLIKELY(ndm__array_dims_place(r, ndim, api, site) < 0))
        return ndm__array_create_undo(NULL, slot, m, gen, dev, &blk, nbytes, limited);
    /* The strides are partial products of the extent that ndm__shape_bytes
     * bounded, so they cannot overflow. */
    int64_t *sizes = r->shape, *strides = r->strides, stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        int64_t e = shape[i];
        sizes[i] = e;
        strides[i] = stride;
        stride *= e ? e : 1;
    }
    ndm__array_storage_init(r, m, dev, nbytes);
    s->data = blk.ptr;
    s->cookie = blk.cookie;
    /* m may have closed since the caller's check (another thread, or a
     * pressure callback inside ndm__alloc on this one). */
    bool fast = ndm__mlock_acquire_as(m, th);
    if (NDM__UNLIKELY(!ndm__manager_open_as(m, gen))) {
        ndm__array_refused_closed(m, gen, fast, api, site);
        return ndm__array_create_undo(r, slot, m, gen, dev, &blk, nbytes, limited);
    }
    if (NDM__UNLIKELY(!ndm__arrays_room(m))) {
        ndm__mlock_release(m, fast);
        ndm__fail(NDM_E_OOM, api, *site, "no memory for the array list of '%s'", m->name);
        return ndm__array_create_undo(r, slot, m, gen, dev, &blk, nbytes, limited);
    }
    /* Live, and its handle's generation read, before the lock goes: from
     * then on a close of m may kill it (the handle then names a dead array). */
    atomic_store_explicit(&r->live, 1, memory_order_relaxed);
    ndm_array h = ndm__array_handle(slot, atomic_load_explicit(&r->gen, memory_order_relaxed));
    ndm__array_link_into(m, r);
    m->live++;
    m->created++;
    int d = ndm__device_slot(dev);
    if (NDM__UNLIKELY(limited))
        m->count[d].reserved -= (int64_t)nbytes; /* the reservation is the charge now */
    ndm__bytes_add(m, d, (int64_t)nbytes);
    ndm__mlock_release(m, fast);
    if (out)
        *out = r;
    return h;
}

/* A new array with fresh storage (uninitialised) in manager m on `dev`,
 * C-contiguous: ndm__array_new_in, inline. `gen` is the generation of the
 * handle m was looked up with (see ndm__manager_open_as). Checks come first, inline; only a
 * failure calls out to write its message, and one test of m's state covers a
 * close, a cap and limits. */
static NDM__ALWAYS_INLINE ndm_array ndm__array_new_inline(const ndm__site *site,
                                                          const char *api, ndm__manager *m,
                                                          uint32_t gen, ndm_device dev,
                                                          ndm_dtype dtype, int ndim,
                                                          const int64_t *shape, ndm__array **out)
{
    size_t nbytes;
    if (NDM__UNLIKELY(!ndm__shape_bytes(ndim, shape, dtype, &nbytes)))
        return ndm__array_shape_refused(ndim, shape, dtype, api, site);
    if (NDM__UNLIKELY(atomic_load_explicit(&m->state, memory_order_acquire) & NDM__M_SLOW_NEW))
        return ndm__array_create_checked(site, api, m, gen, dev, dtype, ndim, shape, nbytes, out);
    return ndm__array_create(ndm__tls, site, api, m, gen, dev, dtype, ndim, shape, nbytes, false,
                             out);
}

/* ndm__array_new_in for a shape known good, of nbytes bytes: the shape of
 * a live array (checked when that array was made), so it is not checked
 * again. For the dispatchers' fast paths; `th` as for ndm__array_create. */
static NDM__ALWAYS_INLINE ndm_array ndm__array_new_sized(ndm__thread *th,
                                                         const ndm__site *site, const char *api,
                                                         ndm__manager *m, ndm_device dev,
                                                         ndm_dtype dtype, int ndim,
                                                         const int64_t *shape, size_t nbytes,
                                                         ndm__array **out)
{
    /* (read right after the caller's lookup: see ndm__manager_open_as) */
    uint32_t gen = atomic_load_explicit(&m->gen, memory_order_acquire);
    if (NDM__UNLIKELY(atomic_load_explicit(&m->state, memory_order_acquire) & NDM__M_SLOW_NEW))
        return ndm__array_create_checked(site, api, m, gen, dev, dtype, ndim, shape, nbytes, out);
    return ndm__array_create(th, site, api, m, gen, dev, dtype, ndim, shape, nbytes, false, out);
}

#endif
