/* Per-thread state of the manager layer: the array slot cache and the scope
 * stack, in one heap block reached through one initial-exec TLS pointer.
 * (The last error is the base layer's; autograd keeps its own, in ops.) */
#ifndef NDM_THREAD_INTERNAL_H
#define NDM_THREAD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ndm/base.h"
#include "ndm/status.h"
#include "../base/compiler.h"

#define NDM__SLOT_RING 2048   /* array slots cached per thread (FIFO) */
#define NDM__SLOT_BATCH 512   /* slots moved to or from the global table at once */
/* A thread refills its FIFO (in front) before fewer than this many slots are
 * left, so a slot released on a thread is reused there only after at least
 * this many other arrays were made on it: a stale handle names where its
 * array died at least that long. */
#define NDM__SLOT_RESERVE 256
#define NDM__SCOPES_INLINE 16
/* Scopes a thread keeps open between uses (ndm__scope_reuse): one per
 * parent it serves under, the oldest closed when a fifth parent comes. */
#define NDM__PARKED_SCOPES 4

typedef struct ndm__parked_scope {
    uint64_t parent; /* the parent's handle id; 0: an empty entry */
    ndm_manager scope;
} ndm__parked_scope;

typedef struct ndm__thread {
    uint64_t id;               /* never reused: managers remember their creator by it */
    uint32_t tag;              /* 1.. while it lives, then reused: arrays name their maker by it */
    /* array slots: a FIFO so a freed slot is reused late and a stale handle
     * still finds how its array died */
    uint32_t ring[NDM__SLOT_RING];
    uint32_t ring_head, ring_count;
    /* the scope stack, innermost last */
    ndm_manager *scopes;
    int scope_depth, scope_cap;
    ndm_manager scope_inline[NDM__SCOPES_INLINE];
    /* scopes parked for reuse, newest first; closed at the thread's exit */
    ndm__parked_scope parked[NDM__PARKED_SCOPES];
    /* Deferred reclamation (reclaim.h): the epoch this thread's outermost
     * operation began in (0: in none), read by reclaiming threads; what it
     * retired and has not handed over yet. */
    _Atomic uint64_t op_epoch;
    bool membarrier;           /* reclaimers issue membarrier(): no fence on entry */
    struct ndm__limbo *limbo;
    struct ndm__thread *reg_prev, *reg_next; /* every thread's state, for reclaimers */
} ndm__thread;

extern _Thread_local ndm__thread *ndm__tls NDM__TLS_MODEL;

/* Create this thread's state (NULL when memory is short: callers then take
 * the uncached paths). */
ndm__thread *ndm__thread_make(void);

static inline ndm__thread *ndm__thread_get(void)
{
    ndm__thread *t = ndm__tls;
    return __builtin_expect(t != 0, 1) ? t : ndm__thread_make();
}

/* Close a thread's parked scopes (thread exit; scope.c). */
void ndm__scope_unpark_all(ndm__thread *t);
/* Give a thread's cached slots back (thread exit). */
void ndm__slot_cache_flush(ndm__thread *t);

#endif
