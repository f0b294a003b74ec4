/* Per-thread state: made on first use, returned to the shared pools when the
 * thread exits (a pthread key destructor), so short-lived threads leak nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "thread.h"

_Thread_local ndm__thread *ndm__tls NDM__TLS_MODEL;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t last_id;

static void thread_exit(void *p)
{
    ndm__thread *t = p;
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
    return t;
}
