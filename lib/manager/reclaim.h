/* Deferred reclamation: a close never frees memory that an operation running
 * on another thread still reads; such memory waits until every thread that
 * was inside an operation when it was retired has left.
 *
 * Readers: an operation (a kernel call, a module's forward, a request)
 * brackets its work with ndm__op_enter / ndm__op_leave, which write only the
 * calling thread's record: the epoch it entered in. An array remembers the
 * thread that made it; the first lookup by another thread marks it shared
 * (once, with one membarrier()). Retirers: the death of an array that is
 * shared, or another thread's, hands its frees to ndm__defer; ndm__reclaim
 * moves the global epoch on, makes every thread's entry visible with one
 * membarrier() (the fence the readers leave out), and runs what no thread
 * inside can still reach. A process where one thread uses ndm never defers
 * anything. */
#ifndef NDM_RECLAIM_INTERNAL_H
#define NDM_RECLAIM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../base/compiler.h"
#include "thread.h"

/* Two or more threads have used ndm (set once, never cleared). */
extern atomic_bool ndm__multi;
/* The global epoch (from 1): readers copy it on entry, retirers tag with it. */
extern _Atomic uint64_t ndm__gc_epoch;
/* The newest tag waiting in limbo, 0 when none: a thread that entered after
 * it blocks nothing there and need not try to reclaim when it leaves. */
extern _Atomic uint64_t ndm__limbo_newest;
/* Whether a membarrier() stands in for the readers' fence (manager core). */
extern bool ndm__bias_supported;

/* The fence a reader (or a retirer's decision) needs between its store and
 * its load: a compiler barrier when the other side issues membarrier(). */
static inline void ndm__light_barrier(void)
{
    if (NDM__LIKELY(ndm__bias_supported))
        atomic_signal_fence(memory_order_seq_cst);
    else
        atomic_thread_fence(memory_order_seq_cst);
}
/* The other side: every running thread of the process passes a full fence. */
void ndm__heavy_barrier(void);

/* Leaving may let retired memory go: commit this thread's queue, reclaim. */
void ndm__op_leave_slow(void);

/* What ndm__op_enter hands to ndm__op_leave: the thread, and the epoch it
 * entered in when this is its outermost operation (0 when nested). */
typedef struct ndm__op_scope {
    ndm__thread *t;
    uint64_t entered;
} ndm__op_scope;

/* Enter an operation; one already entered on this thread (a forward pass
 * calling kernels) is left as it is, by its own outermost guard. */
static inline ndm__op_scope ndm__op_enter(void)
{
    ndm__thread *t = ndm__thread_get();
    ndm__op_scope s = {t, 0};
    if (NDM__LIKELY(t != NULL) &&
        atomic_load_explicit(&t->op_epoch, memory_order_relaxed) == 0) {
        s.entered = atomic_load_explicit(&ndm__gc_epoch, memory_order_acquire);
        atomic_store_explicit(&t->op_epoch, s.entered, memory_order_relaxed);
        if (NDM__LIKELY(t->membarrier))
            atomic_signal_fence(memory_order_seq_cst);
        else
            atomic_thread_fence(memory_order_seq_cst);
    }
    return s;
}

static inline void ndm__op_leave(ndm__op_scope s)
{
    if (s.entered) {
        ndm__thread *t = s.t;
        atomic_store_explicit(&t->op_epoch, 0, memory_order_release);
        /* (something of its own to hand over, or retired while it was in) */
        if (NDM__UNLIKELY(t->limbo != NULL) ||
            NDM__UNLIKELY(s.entered <=
                          atomic_load_explicit(&ndm__limbo_newest, memory_order_relaxed)))
            ndm__op_leave_slow();
    }
}

static inline void ndm__op_guard_end(ndm__op_scope *s) { ndm__op_leave(*s); }

/* The rest of the enclosing block is an operation: entered here, left when
 * the block exits by any path. */
#define NDM__OP_GUARD()                                                                  \
    ndm__op_scope ndm__op_guard_ __attribute__((cleanup(ndm__op_guard_end), unused)) = \
        ndm__op_enter()

/* Run fn(a, b) once no thread that is inside an operation now can still
 * reach what it frees. Queued on this thread until ndm__limbo_commit (or the
 * thread's next ndm__op_leave); with no memory for the queue, the calling
 * thread waits for the others to leave their operations and runs it. */
typedef void (*ndm__limbo_fn)(void *a, uintptr_t b);
void ndm__defer(ndm__limbo_fn fn, void *a, uintptr_t b);
/* Hand this thread's queue to the shared limbo (no lock of the caller's is
 * a problem: the limbo's lock is taken last). */
void ndm__limbo_commit(void);
/* Commit, then run what no thread still blocks. `wait`: take the limbo's
 * lock even when another reclaimer holds it. Call with no manager or tree
 * lock held: the deferred frees take allocator and table locks. */
void ndm__reclaim(bool wait);
/* ndm__reclaim(true) when this thread retired something: the end of a
 * public close or release. */
static inline void ndm__reclaim_maybe(void)
{
    ndm__thread *t = ndm__tls;
    if (NDM__UNLIKELY(t != NULL && t->limbo != NULL))
        ndm__reclaim(true);
}

/* The thread registry (thread.c): called with the state made or dying. */
void ndm__thread_register(ndm__thread *t);
void ndm__thread_unregister(ndm__thread *t);
/* The lowest op_epoch of the registered threads inside an operation,
 * below `ceiling` (returned when none is). */
uint64_t ndm__threads_min_epoch(uint64_t ceiling);

#endif
