/* Per-thread state: made on first use, returned to the shared pools when the
 * thread exits (a pthread key destructor), so short-lived threads leak nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "reclaim.h"
#include "thread.h"

_Thread_local ndm__thread *ndm__tls NDM__TLS_MODEL;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t last_id;

/* Every thread's state, for reclaimers scanning who is inside an operation. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ndm__thread *registered;
static unsigned nregistered;
/* Tags of threads that exited, to be given again: an array made by a dead
 * thread can be in no operation of it, so its tag may name another. */
static uint32_t *free_tags;
static unsigned nfree_tags, free_tags_cap;
static uint32_t next_tag = 1;

void ndm__thread_register(ndm__thread *t)
{
    pthread_mutex_lock(&reg_lock);
    t->tag = nfree_tags ? free_tags[--nfree_tags] : next_tag++;
    t->membarrier = ndm__bias_supported;
    t->reg_prev = NULL;
    t->reg_next = registered;
    if (registered)
        registered->reg_prev = t;
    registered = t;
    bool second = ++nregistered == 2 && !atomic_load_explicit(&ndm__multi, memory_order_relaxed);
    if (second)
        atomic_store_explicit(&ndm__multi, true, memory_order_seq_cst);
    pthread_mutex_unlock(&reg_lock);
    /* A thread that freed on the single-thread path either sees the flag
     * or its generation stores are seen by this thread's lookups. */
    if (second)
        ndm__heavy_barrier();
}

void ndm__thread_unregister(ndm__thread *t)
{
    pthread_mutex_lock(&reg_lock);
    if (t->reg_prev)
        t->reg_prev->reg_next = t->reg_next;
    else
        registered = t->reg_next;
    if (t->reg_next)
        t->reg_next->reg_prev = t->reg_prev;
    nregistered--;
    if (nfree_tags == free_tags_cap) {
        unsigned cap = free_tags_cap ? 2 * free_tags_cap : 64;
        uint32_t *p = realloc(free_tags, cap * sizeof *p);
        if (p) {
            free_tags = p;
            free_tags_cap = cap;
        }
    }
    if (nfree_tags < free_tags_cap) /* (else the tag is not given again) */
        free_tags[nfree_tags++] = t->tag;
    pthread_mutex_unlock(&reg_lock);
}

uint64_t ndm__threads_min_epoch(uint64_t ceiling)
{
    uint64_t min = ceiling;
    pthread_mutex_lock(&reg_lock);
    for (ndm__thread *t = registered; t; t = t->reg_next) {
        uint64_t e = atomic_load_explicit(&t->op_epoch, memory_order_acquire);
        if (e && e < min)
            min = e;
    }
    pthread_mutex_unlock(&reg_lock);
    return min;
}

static void thread_exit(void *p)
{
    ndm__thread *t = p;
    /* its parked scopes first: their close needs the thread's state */
    ndm__scope_unpark_all(t);
    /* (this thread is in no operation now: what it retired may go) */
    atomic_store_explicit(&t->op_epoch, 0, memory_order_release);
    ndm__reclaim(false);
    ndm__thread_unregister(t);
    ndm__slot_cache_flush(t);
    if (t->scopes != t->scope_inline)
        free(t->scopes);
    if (ndm__tls == t)
        ndm__tls = NULL;
    free(t);
}

static void make_key(void) { pthread_key_create(&key, thread_exit); }

ndm__thread *ndm__thread_make(void)
{
    pthread_once(&once, make_key);
    ndm__thread *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->id = atomic_fetch_add_explicit(&last_id, 1, memory_order_relaxed) + 1;
    t->scopes = t->scope_inline;
    t->scope_cap = NDM__SCOPES_INLINE;
    if (pthread_setspecific(key, t) != 0) {
        free(t);
        return NULL;
    }
    ndm__tls = t;
    ndm__thread_register(t);
    return t;
}
