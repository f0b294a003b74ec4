/* Deferred reclamation: the per-thread queues of retired frees, the shared
 * limbo they wait in, and the epoch scan that releases them (see reclaim.h). */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/membarrier.h>

#include "reclaim.h"

atomic_bool ndm__multi;
_Atomic uint64_t ndm__gc_epoch = 1;
_Atomic uint64_t ndm__limbo_newest;

#define LIMBO_ENTRIES 62

typedef struct ndm__limbo {
    struct ndm__limbo *next;
    uint64_t tag;              /* the epoch it was retired in (set on commit) */
    uint32_t n;
    struct {
        ndm__limbo_fn fn;
        void *a;
        uintptr_t b;
    } e[LIMBO_ENTRIES];
} ndm__limbo;

/* The shared limbo, oldest first; its lock is a leaf: nothing else is taken
 * while it is held. */
static pthread_mutex_t limbo_lock = PTHREAD_MUTEX_INITIALIZER;
static ndm__limbo *head, *tail;

void ndm__heavy_barrier(void)
{
    if (ndm__bias_supported)
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    else
        atomic_thread_fence(memory_order_seq_cst);
}

static void run_all(ndm__limbo *l)
{
    while (l) {
        ndm__limbo *next = l->next;
        for (uint32_t i = 0; i < l->n; i++)
            l->e[i].fn(l->e[i].a, l->e[i].b);
        free(l);
        l = next;
    }
}

/* Wait until no other thread is inside an operation it entered before now. */
static void quiesce(void)
{
    uint64_t now = atomic_fetch_add_explicit(&ndm__gc_epoch, 1, memory_order_acq_rel) + 1;
    ndm__heavy_barrier();
    ndm__thread *self = ndm__tls;
    uint64_t mine = self ? atomic_load_explicit(&self->op_epoch, memory_order_relaxed) : 0;
    if (self)
        atomic_store_explicit(&self->op_epoch, 0, memory_order_relaxed);
    while (ndm__threads_min_epoch(now) < now)
        sched_yield();
    if (self)
        atomic_store_explicit(&self->op_epoch, mine, memory_order_relaxed);
}

void ndm__defer(ndm__limbo_fn fn, void *a, uintptr_t b)
{
    ndm__thread *t = ndm__tls;
    if (t && (!t->limbo || t->limbo->n == LIMBO_ENTRIES)) {
        ndm__limbo *l = malloc(sizeof *l);
        if (l) {
            l->n = 0;
            l->tag = 0;
            l->next = t->limbo; /* newest chunk first until the commit */
            t->limbo = l;
        }
    }
    if (t && t->limbo && t->limbo->n < LIMBO_ENTRIES) {
        ndm__limbo *l = t->limbo;
        l->e[l->n].fn = fn;
        l->e[l->n].a = a;
        l->e[l->n].b = b;
        l->n++;
        return;
    }
    /* No memory for the queue: wait for the readers, then free. */
    ndm__limbo_commit();
    quiesce();
    fn(a, b);
}

void ndm__limbo_commit(void)
{
    ndm__thread *t = ndm__tls;
    if (!t || !t->limbo)
        return;
    /* The chunks came newest first: put them in the order they were filled. */
    ndm__limbo *first = NULL, *last = t->limbo;
    for (ndm__limbo *l = t->limbo, *next; l; l = next) {
        next = l->next;
        l->next = first;
        first = l;
    }
    t->limbo = NULL;
    pthread_mutex_lock(&limbo_lock);
    /* A read-modify-write after every retire's generation stores: a reader
     * that then copies a later epoch sees them and cannot reach the frees. */
    uint64_t tag = atomic_fetch_add_explicit(&ndm__gc_epoch, 1, memory_order_acq_rel);
    for (ndm__limbo *l = first; l; l = l->next)
        l->tag = tag;
    if (tail)
        tail->next = first;
    else
        head = first;
    tail = last;
    atomic_store_explicit(&ndm__limbo_newest, tag, memory_order_release);
    pthread_mutex_unlock(&limbo_lock);
}

void ndm__reclaim(bool wait)
{
    ndm__limbo_commit();
    if (!atomic_load_explicit(&ndm__limbo_newest, memory_order_acquire))
        return;
    if (wait)
        pthread_mutex_lock(&limbo_lock);
    else if (pthread_mutex_trylock(&limbo_lock) != 0)
        return;
    ndm__limbo *ready = NULL, **rtail = &ready;
    if (head) {
        uint64_t now = atomic_fetch_add_explicit(&ndm__gc_epoch, 1, memory_order_acq_rel) + 1;
        ndm__heavy_barrier();
        uint64_t min = ndm__threads_min_epoch(now);
        /* Tags rise along the list: the ready part is a prefix. */
        while (head && head->tag < min) {
            ndm__limbo *l = head;
            head = l->next;
            l->next = NULL;
            *rtail = l;
            rtail = &l->next;
        }
        if (!head)
            tail = NULL;
    }
    if (!head)
        atomic_store_explicit(&ndm__limbo_newest, 0, memory_order_release);
    pthread_mutex_unlock(&limbo_lock);
    run_all(ready);
}

void ndm__op_leave_slow(void) { ndm__reclaim(false); }
