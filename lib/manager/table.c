/* Handle tables: records live in chunks that are never freed, so checking a
 * stale handle reads only memory that stays valid for the whole process. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

_Atomic(ndm__array *) ndm__array_chunks[NDM__MAX_CHUNKS];
_Atomic(ndm__manager *) ndm__manager_chunks[NDM__MAX_CHUNKS];

/* One global FIFO of free slots per table, fed by the thread caches. FIFO
 * order delays reuse, which keeps the "how it died" record of a released
 * array readable for as long as possible. */
typedef struct ndm__table {
    pthread_mutex_t lock;
    uint32_t high;      /* next never-used slot */
    uint32_t free_head; /* oldest free slot */
    uint32_t free_tail;
    uint32_t nfree;
} ndm__table;

static ndm__table arrays_tab = {PTHREAD_MUTEX_INITIALIZER, 1, 0, 0, 0};
static ndm__table managers_tab = {PTHREAD_MUTEX_INITIALIZER, 1, 0, 0, 0};

/* Make sure the chunk holding `slot` exists; under the table lock. */
static bool ensure_chunk(bool managers, uint32_t slot)
{
    uint32_t c = slot >> NDM__CHUNK_BITS;
    if (c >= NDM__MAX_CHUNKS)
        return false;
    if (managers) {
        if (atomic_load_explicit(&ndm__manager_chunks[c], memory_order_relaxed))
            return true;
        ndm__manager *p = calloc(NDM__CHUNK_SIZE, sizeof *p);
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
        ndm__array *p = calloc(NDM__CHUNK_SIZE, sizeof *p);
        if (!p)
            return false;
        for (uint32_t i = 0; i < NDM__CHUNK_SIZE; i++) {
            atomic_init(&p[i].gen, 1);
            p[i].self = (c << NDM__CHUNK_BITS) | i;
        }
        atomic_store_explicit(&ndm__array_chunks[c], p, memory_order_release);
    }
    return true;
}

static uint32_t *next_free_of(bool managers, uint32_t slot)
{
    return managers ? &ndm__manager_slot(slot)->next_free : &ndm__array_slot(slot)->next_free;
}

/* Take up to n slots, oldest free first, then never-used ones. */
static uint32_t table_take(ndm__table *t, bool managers, uint32_t *out, uint32_t n)
{
    uint32_t k = 0;
    pthread_mutex_lock(&t->lock);
    while (k < n && t->nfree) {
        uint32_t s = t->free_head;
        t->free_head = *next_free_of(managers, s);
        t->nfree--;
        out[k++] = s;
    }
    while (k < n) {
        if (!ensure_chunk(managers, t->high))
            break;
        out[k++] = t->high++;
    }
    pthread_mutex_unlock(&t->lock);
    return k;
}

static void table_give(ndm__table *t, bool managers, const uint32_t *slots, uint32_t n)
{
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = slots[i];
        *next_free_of(managers, s) = 0;
        if (t->nfree)
            *next_free_of(managers, t->free_tail) = s;
        else
            t->free_head = s;
        t->free_tail = s;
        t->nfree++;
    }
    pthread_mutex_unlock(&t->lock);
}

/* ---- per-thread FIFO of array slots -------------------------------------- */

#define RING 256
#define BATCH 64

typedef struct slot_cache {
    uint32_t ring[RING];
    uint32_t head;
    uint32_t count;
    bool registered;
} slot_cache;

static _Thread_local slot_cache cache;
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_flush(void *unused)
{
    (void)unused;
    uint32_t tmp[RING];
    uint32_t n = cache.count;
    for (uint32_t i = 0; i < n; i++)
        tmp[i] = cache.ring[(cache.head + i) % RING];
    cache.count = 0;
    if (n)
        table_give(&arrays_tab, false, tmp, n);
}

static void cache_key_make(void) { pthread_key_create(&cache_key, cache_flush); }

uint32_t ndm__array_slot_alloc(void)
{
    if (NDM__UNLIKELY(cache.count == 0)) {
        if (!cache.registered) {
            /* The key's destructor returns this thread's slots when it exits. */
            pthread_once(&cache_once, cache_key_make);
            pthread_setspecific(cache_key, &cache);
            cache.registered = true;
        }
        uint32_t got[BATCH];
        uint32_t n = table_take(&arrays_tab, false, got, BATCH);
        if (n == 0)
            return 0;
        for (uint32_t i = 0; i < n; i++)
            cache.ring[(cache.head + i) % RING] = got[i];
        cache.count = n;
    }
    uint32_t s = cache.ring[cache.head];
    cache.head = (cache.head + 1) % RING;
    cache.count--;
    return s;
}

void ndm__array_slot_free(uint32_t slot)
{
    if (NDM__UNLIKELY(cache.count == RING)) {
        /* Hand the oldest half to the global FIFO. */
        uint32_t tmp[RING / 2];
        for (uint32_t i = 0; i < RING / 2; i++)
            tmp[i] = cache.ring[(cache.head + i) % RING];
        cache.head = (cache.head + RING / 2) % RING;
        cache.count -= RING / 2;
        table_give(&arrays_tab, false, tmp, RING / 2);
    }
    cache.ring[(cache.head + cache.count) % RING] = slot;
    cache.count++;
}

uint32_t ndm__manager_slot_alloc(void)
{
    uint32_t s = 0;
    return table_take(&managers_tab, true, &s, 1) ? s : 0;
}

void ndm__manager_slot_free(uint32_t slot) { table_give(&managers_tab, true, &slot, 1); }

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
