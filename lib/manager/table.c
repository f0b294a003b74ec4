/* Handle tables: records live in chunks that are never freed, so checking a
 * stale handle reads only memory that stays valid for the whole process. */
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"
#include "thread.h"

_Atomic(ndm__array *) ndm__array_chunks[NDM__MAX_CHUNKS];
_Atomic(ndm__manager *) ndm__manager_chunks[NDM__MAX_CHUNKS];
_Atomic uint32_t ndm__array_high;
_Atomic uint32_t ndm__manager_high;

/* Free slots wait in a global FIFO. Managers are few and use it one slot at
 * a time (under the tree lock, not the table's); array slots move between it
 * and the thread caches in batches, stored outside the records so a transfer
 * touches none. */
typedef struct slot_batch {
    struct slot_batch *next;
    uint32_t n;
    uint32_t slots[NDM__SLOT_BATCH];
} slot_batch;

typedef struct ndm__table {
    pthread_mutex_t lock;
    uint32_t high;        /* next never-used slot */
    uint32_t free_head;   /* managers: oldest free slot (linked through records) */
    uint32_t free_tail;
    uint32_t nfree;
    slot_batch *first;    /* arrays: oldest batch of free slots */
    slot_batch *last;
    slot_batch *spare;    /* empty batch records kept for reuse */
} ndm__table;

static ndm__table arrays_tab = {PTHREAD_MUTEX_INITIALIZER, 1, 0, 0, 0, NULL, NULL, NULL};
static ndm__table managers_tab = {PTHREAD_MUTEX_INITIALIZER, 1, 0, 0, 0, NULL, NULL, NULL};

/* Make sure the chunk holding `slot` exists; under the table lock. */
static bool ensure_chunk(bool managers, uint32_t slot)
{
    uint32_t c = slot >> NDM__CHUNK_BITS;
    if (c >= NDM__MAX_CHUNKS)
        return false;
    if (managers) {
        if (atomic_load_explicit(&ndm__manager_chunks[c], memory_order_relaxed))
            return true;
        ndm__manager *p = ndm__calloc(NDM__CHUNK_SIZE, sizeof *p, NDM__INJ_RECORD);
        if (!p)
            return false;
        for (uint32_t i = 0; i < NDM__CHUNK_SIZE; i++) {
            atomic_init(&p[i].gen, 1);
            p[i].self = (c << NDM__CHUNK_BITS) | i;
        }
        atomic_store_explicit(&ndm__manager_chunks[c], p, memory_order_release);
    } else {
        if (atomic_load_explicit(&ndm__array_chunks[c], memory_order_relaxed))
            return true;
        /* aligned to the records' lines (see ndm__array) */
        ndm__array *p = ndm__inject(NDM__INJ_RECORD) ? NULL
                        : aligned_alloc(_Alignof(ndm__array), NDM__CHUNK_SIZE * sizeof *p);
        if (!p)
            return false;
        memset(p, 0, NDM__CHUNK_SIZE * sizeof *p);
        for (uint32_t i = 0; i < NDM__CHUNK_SIZE; i++) {
            atomic_init(&p[i].gen, 1);
            p[i].self = (c << NDM__CHUNK_BITS) | i;
        }
        atomic_store_explicit(&ndm__array_chunks[c], p, memory_order_release);
    }
    return true;
}

/* ---- managers: one slot at a time, under the tree lock ----------------------- */

/* The tree lock, which every caller holds, guards the manager table. */
uint32_t ndm__manager_slot_alloc(void)
{
    ndm__table *t = &managers_tab;
    uint32_t s = 0;
    if (t->nfree) {
        s = t->free_head;
        t->free_head = ndm__manager_slot(s)->next_free;
        t->nfree--;
    } else if (ensure_chunk(true, t->high)) {
        s = t->high++;
        atomic_store_explicit(&ndm__manager_high, t->high, memory_order_release);
    }
    return s;
}

void ndm__manager_slot_free(uint32_t slot)
{
    ndm__table *t = &managers_tab;
    ndm__manager_slot(slot)->next_free = 0;
    if (t->nfree)
        ndm__manager_slot(t->free_tail)->next_free = slot;
    else
        t->free_head = slot;
    t->free_tail = slot;
    t->nfree++;
}

/* ---- arrays: batches between the global FIFO and the thread rings -------------- */

/* Take up to n slots: the oldest batch, else never-used slots. */
static uint32_t arrays_take(uint32_t *out, uint32_t n)
{
    ndm__table *t = &arrays_tab;
    uint32_t k = 0;
    pthread_mutex_lock(&t->lock);
    slot_batch *b = t->first;
    if (b) {
        t->first = b->next;
        if (!t->first)
            t->last = NULL;
        k = b->n < n ? b->n : n;
        memcpy(out, b->slots, k * sizeof *out);
        if (k < b->n) { /* give back what does not fit (only for n < a batch) */
            memmove(b->slots, b->slots + k, (b->n - k) * sizeof *out);
            b->n -= k;
            b->next = t->first;
            t->first = b;
            if (!t->last)
                t->last = b;
        } else {
            b->next = t->spare;
            t->spare = b;
        }
    }
    while (k < n && ensure_chunk(false, t->high))
        out[k++] = t->high++;
    atomic_store_explicit(&ndm__array_high, t->high, memory_order_release);
    pthread_mutex_unlock(&t->lock);
    return k;
}

/* Give n slots back as one batch (n <= NDM__SLOT_BATCH). */
static void arrays_give(const uint32_t *slots, uint32_t n)
{
    ndm__table *t = &arrays_tab;
    pthread_mutex_lock(&t->lock);
    slot_batch *b = t->spare;
    if (b)
        t->spare = b->next;
    pthread_mutex_unlock(&t->lock);
    if (!b)
        b = malloc(sizeof *b);
    if (!b) {
        /* no memory for a batch record: these slots stay unused, which only
         * costs address space in the table */
        return;
    }
    b->n = n;
    b->next = NULL;
    memcpy(b->slots, slots, n * sizeof *slots);
    pthread_mutex_lock(&t->lock);
    if (t->last)
        t->last->next = b;
    else
        t->first = b;
    t->last = b;
    pthread_mutex_unlock(&t->lock);
}

void ndm__slot_cache_flush(ndm__thread *th)
{
    while (th->ring_count) {
        uint32_t tmp[NDM__SLOT_BATCH];
        uint32_t n = th->ring_count < NDM__SLOT_BATCH ? th->ring_count : NDM__SLOT_BATCH;
        for (uint32_t i = 0; i < n; i++)
            tmp[i] = th->ring[(th->ring_head + i) % NDM__SLOT_RING];
        th->ring_head = (th->ring_head + n) % NDM__SLOT_RING;
        th->ring_count -= n;
        arrays_give(tmp, n);
    }
}

uint32_t ndm__array_slot_alloc_slow(void)
{
    ndm__thread *th = ndm__thread_get();
    if (NDM__UNLIKELY(!th)) {
        uint32_t s = 0;
        return arrays_take(&s, 1) ? s : 0;
    }
    if (th->ring_count <= NDM__SLOT_RESERVE) {
        /* In front of the slots released lately, which keep waiting. */
        uint32_t got[NDM__SLOT_BATCH];
        uint32_t n = arrays_take(got, NDM__SLOT_BATCH);
        if (n == 0 && th->ring_count == 0)
            return 0;
        th->ring_head = (th->ring_head + NDM__SLOT_RING - n) % NDM__SLOT_RING;
        for (uint32_t i = 0; i < n; i++)
            th->ring[(th->ring_head + i) % NDM__SLOT_RING] = got[i];
        th->ring_count += n;
    }
    /* Pop as the fast path does (with no memory for more slots, the last
     * ones in the FIFO are handed out too). */
    uint32_t s = th->ring[th->ring_head];
    th->ring_head = (th->ring_head + 1) % NDM__SLOT_RING;
    th->ring_count--;
    return s;
}

void ndm__array_slot_free_slow(uint32_t slot)
{
    ndm__thread *th = ndm__thread_get();
    if (NDM__UNLIKELY(!th)) {
        arrays_give(&slot, 1);
        return;
    }
    if (th->ring_count == NDM__SLOT_RING) {
        /* hand the oldest batch to the global FIFO */
        uint32_t tmp[NDM__SLOT_BATCH];
        for (uint32_t i = 0; i < NDM__SLOT_BATCH; i++)
            tmp[i] = th->ring[(th->ring_head + i) % NDM__SLOT_RING];
        th->ring_head = (th->ring_head + NDM__SLOT_BATCH) % NDM__SLOT_RING;
        th->ring_count -= NDM__SLOT_BATCH;
        arrays_give(tmp, NDM__SLOT_BATCH);
    }
    th->ring[(th->ring_head + th->ring_count) % NDM__SLOT_RING] = slot;
    th->ring_count++;
}

void ndm__array_slot_free_many(const uint32_t *slots, uint32_t n)
{
    ndm__thread *th = ndm__tls;
    if (!th || th->ring_count + n > NDM__SLOT_RING) {
        for (uint32_t i = 0; i < n; i++)
            ndm__array_slot_free(slots[i]);
        return;
    }
    uint32_t tail = (th->ring_head + th->ring_count) % NDM__SLOT_RING;
    for (uint32_t i = 0; i < n; i++)
        th->ring[(tail + i) % NDM__SLOT_RING] = slots[i];
    th->ring_count += n;
}

void ndm__lock_slow(ndm__lock *l)
{
    for (unsigned spins = 0;; spins++) {
        while (atomic_load_explicit(&l->v, memory_order_relaxed)) {
            if (spins++ < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield();
            }
        }
        if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
            return;
    }
}

/* ---- biased manager locks ------------------------------------------------------------ */

bool ndm__bias_supported;

void ndm__bias_setup(void)
{
    long r = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    ndm__bias_supported =
        r >= 0 && (r & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

void ndm__bias_revoke(atomic_bool *biased, atomic_uint *busy)
{
    atomic_store_explicit(biased, false, memory_order_relaxed);
    syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    for (unsigned spins = 0; atomic_load_explicit(busy, memory_order_acquire); spins++) {
        if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

void ndm__mlock_slow(ndm__manager *m)
{
    ndm__lock_take(&m->lock);
    /* The lock is held: no other thread clears the bias at the same time. */
    if (atomic_load_explicit(&m->biased, memory_order_relaxed))
        ndm__bias_revoke(&m->biased, &m->busy);
}
