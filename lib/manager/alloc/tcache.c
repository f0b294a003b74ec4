/* Per-thread caches of small free blocks in front of the shared pools, with
 * statistics kept exact: grants, folds and an asymmetric-fence freeze.
 *
 * A cached block is free (inactive) in every figure, as a freed block in
 * PyTorch's pool is; only its merge with free neighbours waits until the
 * cache returns it. The owner counts its fast operations in its own counters,
 * which readers add under a sequence lock, so current values and sums are
 * exact. Peaks stay exact because a fast operation may move a figure only
 * within a grant: a share of the headroom below the figure's peak that the
 * owner took under the pool lock. The grants of all caches never exceed the
 * headroom, so a cache can never reach a new peak unseen; a shared operation
 * that needs the headroom first freezes the caches (a membarrier() makes the
 * owners' relaxed fast path see the flag or be seen mid-operation) and folds
 * their counters in. A frozen cache takes its owner's next operation down the
 * shared path, which grants it again. */
#include <linux/membarrier.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pool.h"

_Thread_local ndm__tc_slot *ndm__tc_tls __attribute__((tls_model("initial-exec")));
bool ndm__tc_supported;

/* ---- slots: one per pool, so a thread finds its cache with one index ---------- */

static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t slot_gen[NDM__MAX_POOL_SLOTS]; /* 0: free; else the owning pool's gen */
static uint32_t next_gen;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;

static void thread_exit(void *arg);

static void init_caches(void)
{
    pthread_key_create(&exit_key, thread_exit);
    /* Without asymmetric fences a frozen owner could not be told apart from
     * one inside a fast operation: caches stay off then. */
    long r = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (r >= 0 && (r & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        ndm__tc_supported = true;
}

int ndm__tc_slot_acquire(uint32_t *gen)
{
    pthread_once(&init_once, init_caches);
    pthread_mutex_lock(&slots_lock);
    int slot = -1;
    for (int i = 0; i < NDM__MAX_POOL_SLOTS; i++) {
        if (!slot_gen[i]) {
            slot = i;
            break;
        }
    }
    if (slot >= 0) {
        if (++next_gen == 0)
            next_gen = 1;
        slot_gen[slot] = next_gen;
        *gen = next_gen;
    } else {
        *gen = 0;
    }
    pthread_mutex_unlock(&slots_lock);
    return slot;
}

void ndm__tc_slot_release(int slot)
{
    pthread_mutex_lock(&slots_lock);
    slot_gen[slot] = 0;
    pthread_mutex_unlock(&slots_lock);
}

static void unlink_cache(ndm__pool *p, ndm__tcache *tc)
{
    if (tc->prev)
        tc->prev->next = tc->next;
    else
        p->caches = tc->next;
    if (tc->next)
        tc->next->prev = tc->prev;
}

/* A thread leaves: its caches go back to their pools, if those still exist. */
static void thread_exit(void *arg)
{
    ndm__tc_slot *slots = arg;
    for (int i = 0; i < NDM__MAX_POOL_SLOTS; i++) {
        if (!slots[i].tc)
            continue;
        pthread_mutex_lock(&slots_lock);
        if (slot_gen[i] == slots[i].gen) {
            ndm__tcache *tc = slots[i].tc;
            ndm__pool *p = tc->pool;
            ndm__pool_lock(p);
            ndm__tc_fold(p, tc);
            ndm__tc_flush(p, tc);
            unlink_cache(p, tc);
            ndm__pool_unlock(p);
            free(tc);
        }
        pthread_mutex_unlock(&slots_lock);
    }
    ndm__tc_tls = NULL;
    free(slots);
}

ndm__tcache *ndm__tc_get_locked(ndm__pool *p)
{
    if (!p->tc_allowed && !ndm__tc_mine(p))
        return NULL;
    ndm__tcache *tc = ndm__tc_mine(p);
    if (tc)
        return tc;
    ndm__tc_slot *slots = ndm__tc_tls;
    if (!slots) {
        slots = calloc(NDM__MAX_POOL_SLOTS, sizeof *slots);
        if (!slots)
            return NULL;
        ndm__tc_tls = slots;
        pthread_setspecific(exit_key, slots);
    }
    tc = calloc(1, sizeof *tc);
    if (!tc)
        return NULL;
    tc->pool = p;
    tc->owner = pthread_self();
    tc->next = p->caches;
    if (p->caches)
        p->caches->prev = tc;
    p->caches = tc;
    slots[p->slot] = (ndm__tc_slot){tc, p->gen};
    return tc;
}

/* ---- folding and flushing ------------------------------------------------------ */

static void add_fig(ndm_memory_stat *s, int64_t up, int64_t down)
{
    for (int k = NDM_POOL_ALL; k <= NDM_POOL_SMALL; k++) {
        s[k].current += up - down;
        s[k].allocated += up;
        s[k].freed += down;
    }
}

/* The figures moved by fast operations: allocations move bytes from
 * inactive_split to allocated, frees move them back. */
static void add_counters(ndm_memory_stats *st, int64_t na, int64_t ba, int64_t ra, int64_t nf,
                         int64_t bf, int64_t rf)
{
    add_fig(st->allocation, na, nf);
    add_fig(st->active, na, nf);
    add_fig(st->allocated_bytes, ba, bf);
    add_fig(st->active_bytes, ba, bf);
    add_fig(st->requested_bytes, ra, rf);
    add_fig(st->inactive_split, nf, na);
    add_fig(st->inactive_split_bytes, bf, ba);
    st->num_thread_cache_allocs += na;
}

void ndm__tc_fold(ndm__pool *p, ndm__tcache *tc)
{
    int64_t na = atomic_load_explicit(&tc->n_alloc, memory_order_relaxed);
    int64_t ba = atomic_load_explicit(&tc->b_alloc, memory_order_relaxed);
    int64_t ra = atomic_load_explicit(&tc->r_alloc, memory_order_relaxed);
    int64_t nf = atomic_load_explicit(&tc->n_free, memory_order_relaxed);
    int64_t bf = atomic_load_explicit(&tc->b_free, memory_order_relaxed);
    int64_t rf = atomic_load_explicit(&tc->r_free, memory_order_relaxed);
    if (na | nf) {
        add_counters(&p->st, na, ba, ra, nf, bf, rf);
        p->cum_alloc += ba;
        atomic_store_explicit(&tc->n_alloc, 0, memory_order_relaxed);
        atomic_store_explicit(&tc->b_alloc, 0, memory_order_relaxed);
        atomic_store_explicit(&tc->r_alloc, 0, memory_order_relaxed);
        atomic_store_explicit(&tc->n_free, 0, memory_order_relaxed);
        atomic_store_explicit(&tc->b_free, 0, memory_order_relaxed);
        atomic_store_explicit(&tc->r_free, 0, memory_order_relaxed);
    }
    for (int k = 0; k < NDM__G_KINDS; k++) {
        p->granted[k] -= tc->cap[k];
        tc->cap[k] = 0;
    }
    if (p->set.pressure_every)
        p->granted_cum -= tc->cap_cum;
    tc->cap_cum = 0;
}

void ndm__tc_flush(ndm__pool *p, ndm__tcache *tc)
{
    if (!tc->cached_bytes)
        return;
    for (size_t i = 0; i < NDM__TC_BINS; i++) {
        ndm__tbin *bin = &tc->bins[i];
        while (bin->head) {
            ndm__ablk *b = bin->head;
            bin->head = b->link;
            b->link = NULL;
            ndm__core_free_block(p, b);
        }
        atomic_store_explicit(&bin->count, 0, memory_order_relaxed);
    }
    tc->cached_bytes = 0;
}

/* Blocks that merge with tc's cached blocks once those go back: free ones,
 * and tc's own cached ones. */
static bool joins(const ndm__tcache *tc, const ndm__ablk *b)
{
    int st = atomic_load_explicit(&b->state, memory_order_relaxed);
    return st == NDM__B_FREE ||
           (st == NDM__B_CACHED && atomic_load_explicit(&b->cache, memory_order_relaxed) == tc);
}

static void unbin(ndm__tcache *tc, ndm__ablk *b)
{
    ndm__tbin *bin = &tc->bins[ndm__tc_index(b->size)];
    for (ndm__ablk **at = &bin->head; *at; at = &(*at)->link) {
        if (*at == b) {
            *at = b->link;
            b->link = NULL;
            atomic_store_explicit(&bin->count,
                                  atomic_load_explicit(&bin->count, memory_order_relaxed) - 1,
                                  memory_order_relaxed);
            tc->cached_bytes -= (int64_t)b->size;
            return;
        }
    }
}

bool ndm__tc_flush_mergeable(ndm__pool *p, ndm__tcache *tc, size_t size)
{
    for (size_t i = 0; i < NDM__TC_BINS && tc->cached_bytes; i++) {
        for (ndm__ablk *b = tc->bins[i].head; b; b = b->link) {
            /* Each run is walked once, from its first cached block: a run
             * starts at most one free block earlier, as free blocks in the
             * pool are always merged. */
            ndm__ablk *first = b;
            if (first->prev && joins(tc, first->prev)) {
                if (atomic_load_explicit(&first->prev->state, memory_order_relaxed) ==
                    NDM__B_CACHED)
                    continue;
                first = first->prev;
            }
            size_t run = 0;
            ndm__ablk *end = first;
            for (; end && joins(tc, end); end = end->next)
                run += end->size;
            if (run < size)
                continue;
            /* This run fits the request once merged: return its cached blocks. */
            for (ndm__ablk *x = first, *nx; x != end; x = nx) {
                nx = x->next;
                if (atomic_load_explicit(&x->state, memory_order_relaxed) == NDM__B_CACHED) {
                    unbin(tc, x);
                    ndm__core_free_block(p, x);
                }
            }
            return true;
        }
    }
    return false;
}

size_t ndm__tc_try_free_many(ndm__pool *p, void *const *cookies, size_t n)
{
    ndm__tcache *tc = ndm__tc_mine(p);
    if (!tc || !n)
        return 0;
    uint64_t seq;
    size_t k = 0;
    if (!ndm__tc_enter(tc, &seq))
        goto done;
    /* The tests of ndm__tc_try_free, block by block, on local copies: the
     * counters are stored once, which readers see as one operation. The
     * grants cannot change meanwhile (they change only under the pool lock,
     * with this cache frozen or by its owner). */
    const int64_t na = atomic_load_explicit(&tc->n_alloc, memory_order_relaxed);
    const int64_t ba = atomic_load_explicit(&tc->b_alloc, memory_order_relaxed);
    const int64_t min_nf = na + tc->cap[NDM__G_FN], min_bf = ba + tc->cap[NDM__G_FB];
    int64_t nf = atomic_load_explicit(&tc->n_free, memory_order_relaxed);
    int64_t bf = atomic_load_explicit(&tc->b_free, memory_order_relaxed);
    int64_t rf = atomic_load_explicit(&tc->r_free, memory_order_relaxed);
    int64_t cached = tc->cached_bytes;
    for (; k < n; k++) {
        ndm__ablk *b = cookies[k];
        if (!b || b->pool != NDM__POOL_SMALL || b->size > NDM__TC_MAX_SIZE || b->whole)
            break;
        int64_t size = (int64_t)b->size;
        ndm__tbin *bin = &tc->bins[ndm__tc_index(b->size)];
        uint32_t count = atomic_load_explicit(&bin->count, memory_order_relaxed);
        if (count >= NDM__TC_BIN_MAX || cached + size > NDM__TC_MAX_BYTES || nf + 1 > min_nf ||
            bf + size > min_bf)
            break;
        nf++;
        bf += size;
        rf += (int64_t)b->requested;
        cached += size;
        atomic_store_explicit(&b->cache, tc, memory_order_relaxed);
        atomic_store_explicit(&b->state, NDM__B_CACHED, memory_order_relaxed);
        b->link = bin->head;
        bin->head = b;
        atomic_store_explicit(&bin->count, count + 1, memory_order_release);
    }
    tc->cached_bytes = cached;
    atomic_store_explicit(&tc->n_free, nf, memory_order_release);
    atomic_store_explicit(&tc->b_free, bf, memory_order_release);
    atomic_store_explicit(&tc->r_free, rf, memory_order_release);
done:
    ndm__tc_leave(tc, seq);
    return k;
}

/* ---- freezing ---------------------------------------------------------------------- */

static void wait_quiet(ndm__tcache *tc)
{
    for (int spins = 0; atomic_load_explicit(&tc->seq, memory_order_acquire) & 1; spins++) {
        if (spins > 64)
            sched_yield();
    }
}

void ndm__tc_freeze_all(ndm__pool *p, bool flush)
{
    ndm__tcache *self = ndm__tc_mine(p);
    bool others = false;
    for (ndm__tcache *tc = p->caches; tc; tc = tc->next) {
        if (tc != self) {
            atomic_store_explicit(&tc->frozen, 1, memory_order_relaxed);
            others = true;
        }
    }
    if (others)
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    for (ndm__tcache *tc = p->caches; tc; tc = tc->next) {
        if (tc != self)
            wait_quiet(tc);
        ndm__tc_fold(p, tc);
        if (flush)
            ndm__tc_flush(p, tc);
    }
}

/* Whether a cache could move a figure: it holds a grant or unfolded counts.
 * A clean one cannot change without the lock: with no grant its fast path
 * refuses everything. */
bool ndm__tc_dirty(ndm__pool *p)
{
    for (ndm__tcache *tc = p->caches; tc; tc = tc->next) {
        for (int k = 0; k < NDM__G_KINDS; k++)
            if (tc->cap[k])
                return true;
        if (atomic_load_explicit(&tc->n_alloc, memory_order_relaxed) ||
            atomic_load_explicit(&tc->n_free, memory_order_relaxed))
            return true;
    }
    return false;
}

/* ---- grants ------------------------------------------------------------------------- */

static int64_t headroom(const ndm_memory_stat *s, int64_t granted)
{
    int64_t a = s[NDM_POOL_ALL].peak - s[NDM_POOL_ALL].current - granted;
    int64_t b = s[NDM_POOL_SMALL].peak - s[NDM_POOL_SMALL].current - granted;
    int64_t h = a < b ? a : b;
    return h > 0 ? h : 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A cache whose owner made no fast operation while the pool made this many
 * grants is idle: its grant goes back to the pool. */
#define IDLE_GRANTS 256

static bool holds_grant(const ndm__tcache *tc)
{
    for (int k = 0; k < NDM__G_KINDS; k++)
        if (tc->cap[k])
            return true;
    return false;
}

/* Whether a cache other than self shares the headroom now: one whose owner
 * moved since the last look, or that holds a grant and was not idle long.
 * An idle one's grant is taken back (frozen, fenced, folded), so that a
 * thread that stopped allocating (the one that built a model, a finished
 * worker) does not keep half the room from the threads that serve; its
 * owner's next operation takes the shared path, which grants it again. */
static bool others_share(ndm__pool *p, ndm__tcache *self)
{
    uint64_t now = ++p->grants;
    bool sharing = false, idle = false;
    for (ndm__tcache *o = p->caches; o; o = o->next) {
        if (o == self)
            continue;
        uint64_t seq = atomic_load_explicit(&o->seq, memory_order_relaxed);
        if (seq != o->seen_seq) {
            o->seen_seq = seq;
            o->seen_at = now;
            sharing = true;
        } else if (holds_grant(o)) {
            if (now - o->seen_at < IDLE_GRANTS) {
                sharing = true;
            } else {
                atomic_store_explicit(&o->frozen, 1, memory_order_relaxed);
                idle = true;
            }
        }
    }
    if (idle) {
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
        for (ndm__tcache *o = p->caches; o; o = o->next) {
            if (o != self && holds_grant(o) && atomic_load_explicit(&o->frozen, memory_order_relaxed)) {
                wait_quiet(o);
                ndm__tc_fold(p, o);
            }
        }
    }
    self->seen_seq = atomic_load_explicit(&self->seq, memory_order_relaxed);
    self->seen_at = now;
    return sharing;
}

void ndm__tc_grant(ndm__pool *p, ndm__tcache *tc)
{
    if (!p->tc_allowed)
        return;
    atomic_store_explicit(&tc->frozen, 0, memory_order_relaxed);
    bool alone = !others_share(p, tc); /* (first: it may take idle grants back) */
    int64_t room[NDM__G_KINDS];
    room[NDM__G_N] = min64(headroom(p->st.allocation, p->granted[NDM__G_N]),
                           headroom(p->st.active, p->granted[NDM__G_N]));
    room[NDM__G_B] = min64(headroom(p->st.allocated_bytes, p->granted[NDM__G_B]),
                           headroom(p->st.active_bytes, p->granted[NDM__G_B]));
    room[NDM__G_R] = headroom(p->st.requested_bytes, p->granted[NDM__G_R]);
    room[NDM__G_FN] = headroom(p->st.inactive_split, p->granted[NDM__G_FN]);
    room[NDM__G_FB] = headroom(p->st.inactive_split_bytes, p->granted[NDM__G_FB]);
    /* Alone, a cache takes all the room; with others, half of what is left. */
    for (int k = 0; k < NDM__G_KINDS; k++) {
        int64_t share = alone ? room[k] : room[k] / 2;
        tc->cap[k] = share;
        p->granted[k] += share;
    }
    if (p->set.pressure_every) {
        int64_t left = p->next_pressure - p->cum_alloc - p->granted_cum;
        /* Exclusive: the allocation that reaches the mark takes the shared
         * path, which runs the callbacks. */
        int64_t share = left > 0 ? (alone ? left : left / 2) - 1 : -1;
        tc->cap_cum = share;
        p->granted_cum += share;
    } else {
        tc->cap_cum = INT64_MAX;
    }
}

/* ---- readers -------------------------------------------------------------------------- */

void ndm__tc_add_unfolded(ndm__pool *p, ndm_memory_stats *st, int64_t *largest_cached)
{
    for (ndm__tcache *tc = p->caches; tc; tc = tc->next) {
        int64_t v[6];
        int64_t largest = 0;
        for (unsigned tries = 0;; tries++) {
            uint64_t s1 = atomic_load_explicit(&tc->seq, memory_order_acquire);
            if (s1 & 1) {
                if (tries > 64)
                    sched_yield();
                continue;
            }
            /* acquire loads: the second read of the sequence stays after them */
            v[0] = atomic_load_explicit(&tc->n_alloc, memory_order_acquire);
            v[1] = atomic_load_explicit(&tc->b_alloc, memory_order_acquire);
            v[2] = atomic_load_explicit(&tc->r_alloc, memory_order_acquire);
            v[3] = atomic_load_explicit(&tc->n_free, memory_order_acquire);
            v[4] = atomic_load_explicit(&tc->b_free, memory_order_acquire);
            v[5] = atomic_load_explicit(&tc->r_free, memory_order_acquire);
            largest = 0;
            for (size_t i = NDM__TC_BINS; i-- > 0;) {
                if (atomic_load_explicit(&tc->bins[i].count, memory_order_acquire)) {
                    largest = (int64_t)((i + 1) * NDM__MIN_BLOCK);
                    break;
                }
            }
            if (atomic_load_explicit(&tc->seq, memory_order_relaxed) == s1)
                break;
            if (tries > 64)
                sched_yield();
        }
        add_counters(st, v[0], v[1], v[2], v[3], v[4], v[5]);
        if (largest > *largest_cached)
            *largest_cached = largest;
    }
}

void ndm__tc_drop_all(ndm__pool *p)
{
    ndm__tcache *self = ndm__tc_mine(p);
    for (ndm__tcache *tc = p->caches, *n; tc; tc = n) {
        n = tc->next;
        free(tc);
    }
    p->caches = NULL;
    if (self)
        ndm__tc_tls[p->slot] = (ndm__tc_slot){NULL, 0};
}
