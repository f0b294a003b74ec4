/* The caching pool engine: PyTorch's block policy (rounding, small and large
 * pools, best fit by stream, size then address, split and oversize rules,
 * frees that wait on other streams' events, the retry ladder) over one
 * segment source, with exact PyTorch statistics; segments sized and returned
 * by PyTorch's rules or by the compact ones, or grown in place. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/error.h"
#include "pool.h"

/* ---- locking ----------------------------------------------------------------- */

void ndm__pool_lock(ndm__pool *p) { pthread_mutex_lock(&p->lock); }
void ndm__pool_unlock(ndm__pool *p) { pthread_mutex_unlock(&p->lock); }

/* ---- block records: chunks of records, recycled through a free list ------------- */

#define RECORDS_PER_CHUNK 256

static ndm__ablk *blk_new(ndm__pool *p)
{
    if (!p->spare) {
        if (p->nchunks == p->chunks_cap) {
            size_t cap = p->chunks_cap ? 2 * p->chunks_cap : 16;
            void **c = realloc(p->chunks, cap * sizeof *c);
            if (!c)
                return NULL;
            p->chunks = c;
            p->chunks_cap = cap;
        }
        ndm__ablk *chunk = calloc(RECORDS_PER_CHUNK, sizeof *chunk);
        if (!chunk)
            return NULL;
        p->chunks[p->nchunks++] = chunk;
        for (int i = RECORDS_PER_CHUNK - 1; i >= 0; i--) {
            chunk[i].link = p->spare;
            p->spare = &chunk[i];
        }
    }
    ndm__ablk *b = p->spare;
    p->spare = b->link;
    memset(b, 0, sizeof *b);
    /* Treap priorities: a xorshift sequence keeps the tree balanced in
     * expectation whatever the order of sizes and addresses. */
    uint32_t x = p->prio_seed;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p->prio_seed = x;
    b->prio = x;
    return b;
}

static void blk_put(ndm__pool *p, ndm__ablk *b)
{
    if (b->path)
        ndm__rstr_unref(b->path);
    b->path = NULL;
    free(b->uses);
    b->uses = NULL;
    b->link = p->spare;
    p->spare = b;
}

/* ---- the free tree: a treap ordered by (stream, size, address) ---------------------- */

/* On a pool without streams every stream is 0: the order is (size, address). */
static inline bool key_less(const ndm__ablk *a, const ndm__ablk *b)
{
    if (a->stream != b->stream)
        return a->stream < b->stream;
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static ndm__ablk *rot_right(ndm__ablk *t)
{
    ndm__ablk *l = t->left;
    t->left = l->right;
    l->right = t;
    return l;
}

static ndm__ablk *rot_left(ndm__ablk *t)
{
    ndm__ablk *r = t->right;
    t->right = r->left;
    r->left = t;
    return r;
}

static ndm__ablk *treap_insert(ndm__ablk *t, ndm__ablk *n)
{
    if (!t)
        return n;
    if (key_less(n, t)) {
        t->left = treap_insert(t->left, n);
        if (t->left->prio > t->prio)
            t = rot_right(t);
    } else {
        t->right = treap_insert(t->right, n);
        if (t->right->prio > t->prio)
            t = rot_left(t);
    }
    return t;
}

static ndm__ablk *treap_join(ndm__ablk *a, ndm__ablk *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    if (a->prio > b->prio) {
        a->right = treap_join(a->right, b);
        return a;
    }
    b->left = treap_join(a, b->left);
    return b;
}

static ndm__ablk *treap_remove(ndm__ablk *t, ndm__ablk *n)
{
    if (t == n)
        return treap_join(n->left, n->right);
    if (key_less(n, t))
        t->left = treap_remove(t->left, n);
    else
        t->right = treap_remove(t->right, n);
    return t;
}

static void tree_insert(ndm__pool *p, ndm__ablk *b)
{
    b->left = b->right = NULL;
    b->gc_base = p->searches[b->pool];
    atomic_store_explicit(&b->state, NDM__B_FREE, memory_order_relaxed);
    p->tree[b->pool] = treap_insert(p->tree[b->pool], b);
}

static void tree_remove(ndm__pool *p, ndm__ablk *b)
{
    p->tree[b->pool] = treap_remove(p->tree[b->pool], b);
    b->left = b->right = NULL;
}

/* The smallest block of `stream` of at least `size` bytes, lowest address first. */
static ndm__ablk *tree_lower_bound(ndm__ablk *t, uintptr_t stream, size_t size)
{
    ndm__ablk *best = NULL;
    while (t) {
        if (t->stream > stream || (t->stream == stream && t->size >= size)) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best && best->stream == stream ? best : NULL;
}

static ndm__ablk *tree_max(ndm__ablk *t)
{
    while (t && t->right)
        t = t->right;
    return t;
}

/* The largest free block of a pool: the last in order, unless several
 * streams share the tree. */
static size_t largest_in(const ndm__ablk *t)
{
    if (!t)
        return 0;
    size_t l = largest_in(t->left), r = largest_in(t->right);
    size_t m = l > r ? l : r;
    return t->size > m ? t->size : m;
}

static size_t largest_free(const ndm__pool *p, int pool)
{
    if (p->streamed)
        return largest_in(p->tree[pool]);
    ndm__ablk *m = tree_max(p->tree[pool]);
    return m ? m->size : 0;
}

/* Free blocks in ascending (size, address) order into v (at most cap). */
static size_t tree_collect(ndm__ablk *t, ndm__ablk **v, size_t n, size_t cap)
{
    if (!t || n >= cap)
        return n;
    n = tree_collect(t->left, v, n, cap);
    if (n < cap)
        v[n++] = t;
    return tree_collect(t->right, v, n, cap);
}

static size_t tree_count(const ndm__ablk *t)
{
    return t ? 1 + tree_count(t->left) + tree_count(t->right) : 0;
}

/* ---- statistics ------------------------------------------------------------------ */

static inline int stat_type(int pool)
{
    return pool == NDM__POOL_SMALL ? NDM_POOL_SMALL : NDM_POOL_LARGE;
}

/* Add d to figure s of stat type `pool` and of NDM_POOL_ALL; peaks follow. */
static inline void stat_add(ndm__pool *p, ndm_memory_stat *s, int pool, int64_t d, int grant_kind)
{
    int types[2] = {NDM_POOL_ALL, stat_type(pool)};
    for (int i = 0; i < 2; i++) {
        ndm_memory_stat *x = &s[types[i]];
        x->current += d;
        if (d > 0)
            x->allocated += d;
        else
            x->freed -= d;
    }
    if (d <= 0)
        return;
    /* The shared part alone may pass a peak while other threads' caches
     * still hold unfolded frees (the true value is lower), or grants that
     * let them rise later (a peak they could reach unseen). Either way the
     * caches are frozen and folded first, so the peak is taken from the true
     * value and no grant outlives it. */
    if (grant_kind >= 0) {
        int64_t g = p->granted[grant_kind];
        if ((s[NDM_POOL_ALL].current + g > s[NDM_POOL_ALL].peak ||
             s[NDM_POOL_SMALL].current + g > s[NDM_POOL_SMALL].peak) &&
            p->caches && ndm__tc_dirty(p))
            ndm__tc_freeze_all(p, false);
    }
    for (int i = 0; i < 2; i++) {
        ndm_memory_stat *x = &s[types[i]];
        if (x->current > x->peak)
            x->peak = x->current;
    }
}

static void stat_inc1(ndm_memory_stat *x, int64_t d)
{
    x->current += d;
    if (d > 0) {
        x->allocated += d;
        if (x->current > x->peak)
            x->peak = x->current;
    } else {
        x->freed -= d;
    }
}

/* ---- strategies ------------------------------------------------------------------ */

static inline bool is_split(const ndm__ablk *b) { return b->prev || b->next; }

/* PyTorch's: small requests from 2 MiB segments, large ones from segments
 * rounded to the preset's step (at least its large segment below 10 MiB). */
static int sized_pool(const ndm__settings *s, size_t size)
{
    (void)s;
    return size <= NDM__SMALL_SIZE ? NDM__POOL_SMALL : NDM__POOL_LARGE;
}

static size_t cached_segment(const ndm__settings *s, size_t size)
{
    if (size <= NDM__SMALL_SIZE)
        return NDM__SMALL_BUFFER;
    size_t r = s->segment_round;
    size_t rounded = (size + r - 1) / r * r;
    if (size < NDM__MIN_LARGE_ALLOC)
        return s->large_segment_size > rounded ? s->large_segment_size : rounded;
    return rounded;
}

/* As PyTorch: in a range that grows in place a remainder is never stranded
 * (it merges with what is mapped after it); a large block is split only
 * below max_split_size and for a remainder above the small size. */
static bool split_sized(const ndm__settings *s, const ndm__ablk *b, size_t size)
{
    size_t remaining = b->size - size;
    if (b->seg->expandable || b->pool == NDM__POOL_SMALL)
        return remaining >= NDM__MIN_BLOCK;
    return size < s->max_split_size && remaining > NDM__SMALL_SIZE;
}

/* PyTorch's oversize rules. */
static bool fits_oversize(const ndm__settings *s, int pool, const ndm__ablk *b, size_t size)
{
    size_t max_split = s->max_split_size;
    if (size < max_split && b->size >= max_split)
        return false;
    return !(size >= max_split && b->size >= size + s->max_non_split_rounding);
}

static const ndm__pool_policy auto_growth = {
    .name = "auto_growth",
    .pool_for = sized_pool,
    .segment_size = cached_segment,
    .should_split = split_sized,
    .accept_free_block = fits_oversize,
    .grows_in_place = true,
    .thread_cache = true,
};

/* Paddle's naive best fit: one arena of preallocate_fraction of the device,
 * every request in one pool, any remainder of a minimum block split off. */
static int one_pool(const ndm__settings *s, size_t size)
{
    (void)s, (void)size;
    return NDM__POOL_LARGE;
}

static bool split_any(const ndm__settings *s, const ndm__ablk *b, size_t size)
{
    (void)s;
    return b->size - size >= NDM__MIN_BLOCK;
}

static const ndm__pool_policy preallocate = {
    .name = "preallocate",
    .pool_for = one_pool,
    .segment_size = cached_segment,
    .should_split = split_any,
    .accept_free_block = fits_oversize,
    .arena = true,
};

/* No cache: each request maps a segment of its size, unmapped when freed. */
static size_t exact_segment(const ndm__settings *s, size_t size)
{
    (void)s;
    return size;
}

static bool split_never(const ndm__settings *s, const ndm__ablk *b, size_t size)
{
    (void)s, (void)b, (void)size;
    return false;
}

static const ndm__pool_policy system_policy = {
    .name = "system",
    .pool_for = sized_pool,
    .segment_size = exact_segment,
    .should_split = split_never,
    .release_on_free = true,
};

const ndm__pool_policy *const ndm__pool_policies[] = {&auto_growth, &preallocate, &system_policy,
                                                      NULL};

static inline int pool_for(const ndm__pool *p, size_t size)
{
    return p->set.policy->pool_for(&p->set, size);
}

/* Where segments are cheap to map (segment_refit), a whole free segment at
 * least twice the request is not carved up: attempt() gives it back and maps
 * one that fits, so a transient large block does not pin its size for good.
 * Kernel scratch, freed before its operation returns, takes it as it is:
 * refitting for it would unmap the memory the next step faults in again. */
static bool refit_refuses(const ndm__pool *p, int pool, const ndm__ablk *b, size_t size,
                          bool transient)
{
    return p->set.segment_refit && !transient && pool == NDM__POOL_LARGE && !is_split(b) &&
           !b->seg->pinned && !b->seg->expandable && b->size / 2 >= size;
}

/* Best fit on the request's stream, if the strategy accepts it; the block
 * leaves the tree. A strategy that reuses no free block never searches. */
static ndm__ablk *get_free_block(ndm__pool *p, int pool, uintptr_t stream, size_t size,
                                 bool transient)
{
    const ndm__pool_policy *pol = p->set.policy;
    if (!pol->accept_free_block)
        return NULL;
    if (p->set.gc_threshold > 0)
        p->searches[pool]++;
    ndm__ablk *b = tree_lower_bound(p->tree[pool], stream, size);
    if (!b || !pol->accept_free_block(&p->set, pool, b, size) ||
        refit_refuses(p, pool, b, size, transient))
        return NULL;
    tree_remove(p, b);
    return b;
}

/* ---- segments --------------------------------------------------------------------- */

static void link_segment(ndm__pool *p, ndm__aseg *s)
{
    s->prev = NULL;
    s->next = p->segs;
    if (p->segs)
        p->segs->prev = s;
    p->segs = s;
}

static void unlink_segment(ndm__pool *p, ndm__aseg *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        p->segs = s->next;
    if (s->next)
        s->next->prev = s->prev;
}

/* Map a segment for a request of `size` (rounded) in `pool`; its one block is
 * returned, not in the tree. NULL when the limit or the device refuses. */
static ndm__ablk *map_block(ndm__pool *p, int pool, size_t seg_size, bool retry, bool pinned,
                            uintptr_t stream)
{
    if (retry)
        p->st.num_alloc_retries++;
    size_t limit = p->set.memory_limit;
    if (limit && (seg_size > limit || p->reserved > limit - seg_size))
        return NULL;
    ndm__aseg *s = malloc(sizeof *s);
    ndm__ablk *b = blk_new(p);
    void *ptr = NULL;
    if (!s || !b || p->src->map(p->src->ctx, seg_size, &ptr) < 0 || !ptr) {
        free(s);
        if (b)
            blk_put(p, b);
        return NULL;
    }
    *s = (ndm__aseg){.addr = (uintptr_t)ptr, .size = seg_size, .base = ptr, .pool = (uint8_t)pool,
                     .pinned = pinned, .stream = stream, .span = seg_size};
    if (p->poison)
        ndm__poison(ptr, seg_size); /* all free until handed out */
    link_segment(p, s);
    b->addr = s->addr;
    b->size = seg_size;
    b->seg = s;
    b->pool = (uint8_t)pool;
    b->stream = stream;
    s->head = s->tail = b;
    p->reserved += seg_size;
    stat_add(p, p->st.segment, pool, 1, -1);
    stat_add(p, p->st.reserved_bytes, pool, (int64_t)seg_size, -1);
    if (seg_size >= p->set.max_split_size)
        stat_inc1(&p->st.oversize_segments, 1);
    p->st.num_device_alloc++;
    ndm__hist_event(p, NDM__EV_SEGMENT_ALLOC, s->addr, seg_size, p->hist_cause);
    return b;
}

/* Unmap the segment of free block b, which spans it (it is in the tree). */
static void release_block(ndm__pool *p, ndm__ablk *b)
{
    ndm__aseg *s = b->seg;
    tree_remove(p, b);
    p->st.num_device_free++;
    ndm__hist_event(p, NDM__EV_SEGMENT_FREE, s->addr, s->size, p->hist_cause);
    if (p->poison)
        ndm__unpoison(s->base, s->size); /* the range may be mapped again by anyone */
    if (s->expandable) {
        p->src->decommit(p->src->ctx, s->base, s->size);
        p->src->unreserve(p->src->ctx, s->base, s->span);
    } else {
        p->src->unmap(p->src->ctx, s->base, s->size);
    }
    p->reserved -= s->size;
    stat_add(p, p->st.segment, s->pool, -1, -1);
    stat_add(p, p->st.reserved_bytes, s->pool, -(int64_t)s->size, -1);
    if (s->size >= p->set.max_split_size)
        stat_inc1(&p->st.oversize_segments, -1);
    if (s == p->arena) {
        p->arena = NULL;
        p->arena_tried = false;
    }
    unlink_segment(p, s);
    free(s);
    blk_put(p, b);
}

static bool releasable(const ndm__ablk *b) { return !is_split(b) && !b->seg->pinned; }

/* The first whole free segment of a subtree, in (size, address) order. */
static ndm__ablk *first_releasable(ndm__ablk *t, bool include_pinned)
{
    if (!t)
        return NULL;
    ndm__ablk *b = first_releasable(t->left, include_pinned);
    if (b)
        return b;
    if (!is_split(t) && (include_pinned || !t->seg->pinned))
        return t;
    return first_releasable(t->right, include_pinned);
}

/* Free every whole free segment of one pool. */
static void release_pool(ndm__pool *p, int pool, bool include_pinned)
{
    size_t n = tree_count(p->tree[pool]);
    if (!n)
        return;
    ndm__ablk **v = malloc(n * sizeof *v);
    if (!v) {
        /* No room for the list: one at a time. */
        ndm__ablk *b;
        while ((b = first_releasable(p->tree[pool], include_pinned)))
            release_block(p, b);
        return;
    }
    n = tree_collect(p->tree[pool], v, 0, n);
    for (size_t i = 0; i < n; i++)
        if (!is_split(v[i]) && (include_pinned || !v[i]->seg->pinned))
            release_block(p, v[i]);
    free(v);
}

/* Whole free segments of both pools go back. Before the pool grows none of
 * them could serve the request, and on a device where mapping is cheap a
 * segment held idle only raises the peak; thread caches keep their blocks
 * then, since flushing them at every growth would cost the fast path its hits. */
static void release_idle(ndm__pool *p)
{
    release_pool(p, NDM__POOL_LARGE, false);
    release_pool(p, NDM__POOL_SMALL, false);
}

/* ---- expandable segments ---------------------------------------------------------- */

static size_t commit_granularity(const ndm__pool *p)
{
    size_t g = p->src->commit_granularity;
    return g ? g : NDM__ROUND_LARGE;
}

static bool expandable_on(const ndm__pool *p)
{
    return p->can_expand && p->set.expandable && p->set.policy->grows_in_place;
}

/* Free block b of a split segment counts as inactive (sign +1) or stops
 * counting (-1). */
static void count_inactive(ndm__pool *p, const ndm__ablk *b, int sign)
{
    if (!is_split(b))
        return;
    stat_add(p, p->st.inactive_split, b->pool, sign, NDM__G_FN);
    stat_add(p, p->st.inactive_split_bytes, b->pool, sign * (int64_t)b->size, NDM__G_FB);
}

/* The range reserved for one expandable segment: the device's memory (a
 * limit when one is set), so that one segment can grow to hold anything the
 * device can. */
static size_t expandable_span(ndm__pool *p, size_t at_least)
{
    size_t span = p->set.memory_limit, fr = 0, total = 0;
    if (!span && p->src->mem_info && p->src->mem_info(p->src->ctx, &fr, &total) == NDM_OK)
        span = total;
    if (!span)
        span = (size_t)64 << 30;
    if (span < at_least)
        span = at_least;
    size_t g = commit_granularity(p);
    return span > SIZE_MAX - g ? 0 : (span + g - 1) / g * g;
}

static void drop_empty_expandable(ndm__pool *p, ndm__aseg *s)
{
    p->src->unreserve(p->src->ctx, s->base, s->span);
    unlink_segment(p, s);
    free(s);
}

/* Grow the expandable segment of (pool, stream), reserving it first, until
 * the free block at its end holds `size` bytes; that block is returned, out
 * of the tree. NULL when the reserve, the limit or the device refuses;
 * *reserved says whether a range was there to grow (else the caller maps a
 * segment as usual). */
static ndm__ablk *expand(ndm__pool *p, int pool, uintptr_t stream, size_t size, bool *reserved)
{
    size_t g = commit_granularity(p);
    ndm__aseg *s = p->segs;
    while (s && !(s->expandable && s->pool == pool && s->stream == stream))
        s = s->next;
    *reserved = s != NULL;
    if (!s) {
        size_t span = expandable_span(p, size);
        void *base = NULL;
        s = span ? malloc(sizeof *s) : NULL;
        if (!s || p->src->reserve(p->src->ctx, span, &base) < 0 || !base) {
            free(s);
            return NULL;
        }
        *s = (ndm__aseg){.addr = (uintptr_t)base, .size = 0, .base = base, .pool = (uint8_t)pool,
                         .expandable = true, .stream = stream, .span = span};
        link_segment(p, s);
        *reserved = true;
    }
    ndm__ablk *t = s->tail;
    size_t have = t && atomic_load_explicit(&t->state, memory_order_relaxed) == NDM__B_FREE
                      ? t->size
                      : 0;
    size_t need = (size - have + g - 1) / g * g;
    size_t limit = p->set.memory_limit;
    ndm__ablk *nb = have ? NULL : blk_new(p);
    if ((!have && !nb) || need > s->span - s->size ||
        (limit && (need > limit || p->reserved > limit - need)) ||
        p->src->commit(p->src->ctx, (void *)(s->addr + s->size), need) < 0) {
        if (nb)
            blk_put(p, nb);
        if (!s->size)
            drop_empty_expandable(p, s);
        return NULL;
    }
    if (p->poison)
        ndm__poison(s->addr + s->size, need);
    if (have) {
        tree_remove(p, t);
        count_inactive(p, t, -1);
        t->size += need;
    } else {
        nb->addr = s->addr + s->size;
        nb->size = need;
        nb->seg = s;
        nb->pool = (uint8_t)pool;
        nb->stream = stream;
        nb->prev = t;
        if (t)
            t->next = nb;
        else
            s->head = nb;
        s->tail = t = nb;
    }
    /* alloc_found takes a split block as counted inactive */
    count_inactive(p, t, +1);
    if (!s->size)
        stat_add(p, p->st.segment, pool, 1, -1);
    s->size += need;
    p->reserved += need;
    stat_add(p, p->st.reserved_bytes, pool, (int64_t)need, -1);
    p->st.num_device_alloc++;
    ndm__hist_event(p, NDM__EV_SEGMENT_MAP, t->addr + t->size - need, need, p->hist_cause);
    return t;
}

/* Decommit the free end of every expandable segment, whole granules only;
 * a segment left with nothing committed gives its range back. Thread caches
 * are flushed by the caller, so the block before a removed end is not an
 * inactive one. */
static void shrink_expandable(ndm__pool *p)
{
    size_t g = commit_granularity(p);
    for (ndm__aseg *s = p->segs, *n; s; s = n) {
        n = s->next;
        ndm__ablk *t = s->tail;
        if (!s->expandable || !t || atomic_load_explicit(&t->state, memory_order_relaxed) != NDM__B_FREE)
            continue;
        uintptr_t end = s->addr + s->size;
        uintptr_t from = s->addr + (t->addr - s->addr + g - 1) / g * g;
        if (from >= end)
            continue;
        size_t cut = end - from;
        if (from == s->addr) {
            release_block(p, t); /* nothing stays committed */
            continue;
        }
        tree_remove(p, t);
        count_inactive(p, t, -1);
        if (p->poison)
            ndm__unpoison(from, cut);
        p->src->decommit(p->src->ctx, (void *)from, cut);
        t->size -= cut;
        if (!t->size) {
            s->tail = t->prev;
            t->prev->next = NULL;
            blk_put(p, t);
        } else {
            tree_insert(p, t);
            count_inactive(p, t, +1);
        }
        s->size -= cut;
        p->reserved -= cut;
        stat_add(p, p->st.reserved_bytes, s->pool, -(int64_t)cut, -1);
        p->st.num_device_free++;
        ndm__hist_event(p, NDM__EV_SEGMENT_UNMAP, from, cut, p->hist_cause);
    }
}

/* A new segment for a request: grown in place when expandable segments are
 * on and the device reserves, mapped otherwise. */
static ndm__ablk *grow(ndm__pool *p, int pool, uintptr_t stream, size_t size, bool retry)
{
    if (expandable_on(p)) {
        bool reserved = false;
        ndm__ablk *b = expand(p, pool, stream, size, &reserved);
        if (b || reserved) {
            if (retry)
                p->st.num_alloc_retries++;
            return b;
        }
    }
    return map_block(p, pool, p->set.policy->segment_size(&p->set, size), retry, false, stream);
}

/* ---- frees that wait on other streams ------------------------------------------------ */

static void free_block(ndm__pool *p, ndm__ablk *b, bool counted);

static void complete_free(ndm__pool *p, ndm__ablk *b)
{
    ndm__hist_event(p, NDM__EV_FREE_COMPLETED, b->addr, b->requested, b->path);
    free_block(p, b, false);
}

static bool pending_push(ndm__pool *p, void *event, ndm__ablk *b, uintptr_t stream)
{
    if (p->npending == p->pending_cap) {
        size_t cap = p->pending_cap ? 2 * p->pending_cap : 16;
        ndm__pending *v = realloc(p->pending, cap * sizeof *v);
        if (!v)
            return false;
        p->pending = v;
        p->pending_cap = cap;
    }
    p->pending[p->npending++] = (ndm__pending){event, b, stream};
    return true;
}

/* Block b, used on other streams, is freed: an event is recorded on each of
 * them and b waits, active, until all are complete (PyTorch's
 * insert_events). A record that fails leaves an entry without an event,
 * which only a full synchronisation completes; with no room for an entry the
 * event is waited for at once. */
static void defer_free(ndm__pool *p, ndm__ablk *b)
{
    atomic_store_explicit(&b->state, NDM__B_PENDING, memory_order_relaxed);
    for (uint32_t i = 0; i < b->nuses; i++) {
        void *ev = NULL;
        if (p->src->event_record(p->src->ctx, b->uses[i], &ev) < 0)
            ev = NULL;
        if (!pending_push(p, ev, b, b->uses[i])) {
            if (ev) {
                (void)p->src->event_sync(p->src->ctx, ev);
                p->src->event_release(p->src->ctx, ev);
            }
            continue;
        }
        b->events++;
    }
    free(b->uses);
    b->uses = NULL;
    __atomic_store_n(&b->nuses, 0, __ATOMIC_RELAXED); /* (see ndm__pool_stream_uses) */
    b->uses_cap = 0;
    if (!b->events)
        complete_free(p, b);
}

static void pending_done(ndm__pool *p, const ndm__pending *e)
{
    if (e->event)
        p->src->event_release(p->src->ctx, e->event);
    if (--e->b->events == 0)
        complete_free(p, e->b);
}

/* Frees whose events are complete become free blocks. Events of one stream
 * complete in order, so a stream's first pending event stops its scan
 * (PyTorch's process_events); other streams go on. */
static void process_events(ndm__pool *p)
{
    uintptr_t blocked[16];
    int nblocked = 0;
    size_t w = 0;
    for (size_t i = 0; i < p->npending; i++) {
        ndm__pending e = p->pending[i];
        bool skip = false;
        for (int k = 0; k < nblocked && !skip; k++)
            skip = blocked[k] == e.stream;
        if (skip || !e.event || p->src->event_query(p->src->ctx, e.event) != 1) {
            if (!skip && nblocked < 16)
                blocked[nblocked++] = e.stream;
            p->pending[w++] = e;
            continue;
        }
        pending_done(p, &e);
    }
    p->npending = w;
}

/* Wait for every pending event and complete the frees. */
static void sync_pending(ndm__pool *p)
{
    size_t n = p->npending;
    p->npending = 0;
    for (size_t i = 0; i < n; i++) {
        ndm__pending e = p->pending[i];
        if (e.event)
            (void)p->src->event_sync(p->src->ctx, e.event);
        pending_done(p, &e);
    }
}

/* PyTorch's release_cached_blocks: pending frees are waited for, every
 * thread cache is flushed so its blocks can merge, then every whole free
 * segment goes back and the free ends of expandable segments are
 * decommitted. */
static void release_cached(ndm__pool *p, bool count)
{
    if (count)
        p->st.num_sync_all_streams++;
    if (p->npending)
        sync_pending(p);
    ndm__tc_freeze_all(p, true);
    release_idle(p);
    shrink_expandable(p);
}

/* PyTorch's release_available_cached_blocks (only with max_split_size set):
 * free one oversize block that covers the request, or oversize blocks from
 * the largest down until enough is freed. */
static bool release_available(ndm__pool *p, int pool, uintptr_t stream, size_t size)
{
    size_t max_split = p->set.max_split_size;
    if (max_split == SIZE_MAX)
        return false;
    size_t target = size < max_split ? max_split : size;
    ndm__ablk *b = tree_lower_bound(p->tree[pool], stream, target);
    if (b && !releasable(b))
        b = NULL;
    if (b) {
        release_block(p, b);
        return true;
    }
    size_t n = tree_count(p->tree[pool]);
    ndm__ablk **v = n ? malloc(n * sizeof *v) : NULL;
    if (!v)
        return false;
    n = tree_collect(p->tree[pool], v, 0, n);
    size_t freed = 0;
    for (size_t i = n; i-- > 0 && freed < target;) {
        if (v[i]->size < max_split)
            break;
        if (!releasable(v[i]))
            continue;
        freed += v[i]->size;
        release_block(p, v[i]);
    }
    free(v);
    return freed >= target;
}

/* PyTorch's age-based collection, without its need for a memory fraction:
 * the threshold is a share of memory_limit_mb or of the device's total. */
static void garbage_collect(ndm__pool *p)
{
    size_t base = p->set.memory_limit;
    if (!base && p->src->mem_info) {
        size_t fr = 0, total = 0;
        if (p->src->mem_info(p->src->ctx, &fr, &total) == NDM_OK)
            base = total;
    }
    if (!base)
        return;
    size_t threshold = (size_t)(p->set.gc_threshold * (double)base);
    if (p->reserved <= threshold)
        return;
    size_t target = p->reserved - threshold, reclaimed = 0;
    ndm__ablk **v = NULL;
    size_t n = tree_count(p->tree[NDM__POOL_LARGE]);
    if (!n || !(v = malloc(n * sizeof *v)))
        return;
    n = tree_collect(p->tree[NDM__POOL_LARGE], v, 0, n);
    double total_age = 0;
    size_t count = 0;
    uint64_t now = p->searches[NDM__POOL_LARGE];
    for (size_t i = 0; i < n; i++) {
        if (releasable(v[i])) {
            total_age += (double)(now - v[i]->gc_base);
            count++;
        } else {
            v[i] = NULL;
        }
    }
    bool freed_one = true;
    while (reclaimed < target && freed_one && count > 0) {
        double threshold_age = total_age / (double)count;
        freed_one = false;
        for (size_t i = 0; i < n; i++) {
            if (!v[i] || (double)(now - v[i]->gc_base) < threshold_age)
                continue;
            freed_one = true;
            reclaimed += v[i]->size;
            total_age -= (double)(now - v[i]->gc_base);
            count--;
            release_block(p, v[i]);
            v[i] = NULL;
        }
    }
    free(v);
}

/* The preallocated arena: one pinned segment, mapped at first use. */
static void map_arena(ndm__pool *p)
{
    p->arena_tried = true;
    size_t base = p->set.memory_limit;
    if (!base && p->src->mem_info) {
        size_t fr = 0, total = 0;
        if (p->src->mem_info(p->src->ctx, &fr, &total) == NDM_OK)
            base = fr;
    }
    size_t size = (size_t)(p->set.preallocate_fraction * (double)base);
    size = size / NDM__ROUND_LARGE * NDM__ROUND_LARGE;
    if (!size)
        return;
    ndm__ablk *b = map_block(p, NDM__POOL_LARGE, size, false, true, 0);
    if (!b)
        return;
    p->arena = b->seg;
    tree_insert(p, b);
}

/* ---- allocation and free under the lock ----------------------------------------------- */

/* Hand out block b for a request of `size` (rounded) bytes, `req` asked.
 * `from_cache`: b came from a thread cache with its inactive figures moved,
 * and has the exact size. */
static ndm__ablk *alloc_found(ndm__pool *p, ndm__ablk *b, size_t size, size_t req,
                              bool from_cache)
{
    int pool = b->pool;
    bool already_split = is_split(b);
    /* The front becomes the allocation; the tail stays free. Without a
     * record for the front, the whole block is handed out. */
    ndm__ablk *front = !from_cache && p->set.policy->should_split(&p->set, b, size) ? blk_new(p) : NULL;
    if (front) {
        ndm__ablk *rem = b;
        front->addr = rem->addr;
        front->size = size;
        front->seg = rem->seg;
        front->pool = rem->pool;
        front->stream = rem->stream;
        front->prev = rem->prev;
        if (front->prev)
            front->prev->next = front;
        else
            rem->seg->head = front;
        front->next = rem;
        rem->prev = front;
        rem->addr += size;
        rem->size -= size;
        tree_insert(p, rem);
        if (already_split) {
            stat_add(p, p->st.inactive_split_bytes, pool, -(int64_t)size, NDM__G_FB);
        } else {
            stat_add(p, p->st.inactive_split_bytes, pool, (int64_t)rem->size, NDM__G_FB);
            stat_add(p, p->st.inactive_split, pool, 1, NDM__G_FN);
        }
        b = front;
    } else if (already_split && !from_cache) {
        stat_add(p, p->st.inactive_split_bytes, pool, -(int64_t)b->size, NDM__G_FB);
        stat_add(p, p->st.inactive_split, pool, -1, NDM__G_FN);
    }
    atomic_store_explicit(&b->state, NDM__B_ALLOCATED, memory_order_relaxed);
    b->requested = req;
    stat_add(p, p->st.allocation, pool, 1, NDM__G_N);
    stat_add(p, p->st.allocated_bytes, pool, (int64_t)b->size, NDM__G_B);
    stat_add(p, p->st.active, pool, 1, NDM__G_N);
    stat_add(p, p->st.active_bytes, pool, (int64_t)b->size, NDM__G_B);
    stat_add(p, p->st.requested_bytes, pool, (int64_t)req, NDM__G_R);
    if (b->size >= p->set.max_split_size)
        stat_inc1(&p->st.oversize_allocations, 1);
    p->cum_alloc += (int64_t)b->size;
    return b;
}

/* Put free block b into the tree, merging with free neighbours (PyTorch's
 * free_block). `counted`: b already counts as an inactive split block (it
 * comes from a thread cache); otherwise it was active until now. */
static void free_block(ndm__pool *p, ndm__ablk *b, bool counted)
{
    int pool = b->pool;
    size_t orig = b->size, req = b->requested;
    int64_t dn = counted ? -1 : 0, db = counted ? -(int64_t)orig : 0;
    ndm__ablk *cands[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        ndm__ablk *c = cands[i];
        if (!c || atomic_load_explicit(&c->state, memory_order_relaxed) != NDM__B_FREE)
            continue;
        tree_remove(p, c);
        if (c == b->prev) {
            b->addr = c->addr;
            b->prev = c->prev;
            if (b->prev)
                b->prev->next = b;
            else
                b->seg->head = b;
        } else {
            b->next = c->next;
            if (b->next)
                b->next->prev = b;
            if (b->seg->tail == c)
                b->seg->tail = b;
        }
        b->size += c->size;
        dn -= 1;
        db -= (int64_t)c->size;
        blk_put(p, c);
    }
    b->requested = 0;
    b->file = b->func = NULL;
    b->line = 0;
    atomic_store_explicit(&b->mgr, 0, memory_order_relaxed);
    if (b->path) {
        ndm__rstr_unref(b->path);
        b->path = NULL;
    }
    tree_insert(p, b);
    if (is_split(b)) {
        dn += 1;
        db += (int64_t)b->size;
    }
    if (dn)
        stat_add(p, p->st.inactive_split, pool, dn, NDM__G_FN);
    if (db)
        stat_add(p, p->st.inactive_split_bytes, pool, db, NDM__G_FB);
    if (!counted) {
        stat_add(p, p->st.active, pool, -1, NDM__G_N);
        stat_add(p, p->st.active_bytes, pool, -(int64_t)orig, NDM__G_B);
        stat_add(p, p->st.requested_bytes, pool, -(int64_t)req, NDM__G_R);
    }
}

void ndm__core_free_block(ndm__pool *p, ndm__ablk *b) { free_block(p, b, true); }

/* ---- the calling thread's cache, under the lock ------------------------------------------- */

/* Whether b may wait in a thread cache: a piece of a split small segment. */
static bool cacheable(const ndm__pool *p, const ndm__tcache *tc, const ndm__ablk *b)
{
    return tc && p->tc_allowed && b->pool == NDM__POOL_SMALL && b->size <= NDM__TC_MAX_SIZE &&
           b->size != b->seg->size &&
           atomic_load_explicit(&tc->bins[ndm__tc_index(b->size)].count, memory_order_relaxed) <
               NDM__TC_BIN_MAX &&
           tc->cached_bytes + (int64_t)b->size <= NDM__TC_MAX_BYTES;
}

/* An allocated block goes into the cache with its figures moved here, where
 * peaks can rise (the fast path may only stay below them). */
static void cache_put_locked(ndm__pool *p, ndm__tcache *tc, ndm__ablk *b)
{
    int pool = b->pool;
    int64_t size = (int64_t)b->size;
    stat_add(p, p->st.active, pool, -1, NDM__G_N);
    stat_add(p, p->st.active_bytes, pool, -size, NDM__G_B);
    stat_add(p, p->st.requested_bytes, pool, -(int64_t)b->requested, NDM__G_R);
    stat_add(p, p->st.inactive_split, pool, 1, NDM__G_FN);
    stat_add(p, p->st.inactive_split_bytes, pool, size, NDM__G_FB);
    ndm__tbin *bin = &tc->bins[ndm__tc_index(b->size)];
    atomic_store_explicit(&b->cache, tc, memory_order_relaxed);
    atomic_store_explicit(&b->state, NDM__B_CACHED, memory_order_relaxed);
    b->link = bin->head;
    bin->head = b;
    atomic_store_explicit(&bin->count, atomic_load_explicit(&bin->count, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    tc->cached_bytes += size;
}

/* A cached block of exactly `size` bytes, taken for an allocation. */
static ndm__ablk *cache_take_locked(ndm__pool *p, ndm__tcache *tc, size_t size)
{
    if (!tc || !p->tc_allowed || size > NDM__TC_MAX_SIZE)
        return NULL;
    ndm__tbin *bin = &tc->bins[ndm__tc_index(size)];
    ndm__ablk *b = bin->head;
    if (!b)
        return NULL;
    bin->head = b->link;
    b->link = NULL;
    atomic_store_explicit(&bin->count, atomic_load_explicit(&bin->count, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    tc->cached_bytes -= (int64_t)size;
    stat_add(p, p->st.inactive_split, b->pool, -1, NDM__G_FN);
    stat_add(p, p->st.inactive_split_bytes, b->pool, -(int64_t)size, NDM__G_FB);
    return b;
}

/* One attempt: search, collect garbage, map a segment. Before a small
 * segment is mapped, the calling thread's cached blocks go back if merging
 * them with their free neighbours makes room for the request, so the cache
 * does not cost memory that PyTorch's policy would not have taken. */
static ndm__ablk *attempt(ndm__pool *p, ndm__tcache *tc, uintptr_t stream, size_t size,
                          bool transient)
{
    int pool = pool_for(p, size);
    if (p->set.policy->arena && !p->arena_tried)
        map_arena(p);
    ndm__ablk *b = get_free_block(p, pool, stream, size, transient);
    if (!b && pool == NDM__POOL_SMALL && tc && tc->cached_bytes &&
        ndm__tc_flush_mergeable(p, tc, size))
        b = get_free_block(p, pool, stream, size, transient);
    if (b)
        return b;
    if (p->set.gc_threshold > 0)
        garbage_collect(p);
    if (!transient && (p->set.release_free_segments || p->set.segment_refit))
        release_idle(p);
    return grow(p, pool, stream, size, false);
}

/* The last resorts, as PyTorch: free oversize blocks and retry the device,
 * then flush everything, search again and retry. */
static ndm__ablk *attempt_after_release(ndm__pool *p, uintptr_t stream, size_t size)
{
    int pool = pool_for(p, size);
    ndm__ablk *b = NULL;
    if (release_available(p, pool, stream, size))
        b = grow(p, pool, stream, size, false);
    if (b)
        return b;
    /* The events are waited for here, so a block they held is found by the
     * search that follows. */
    release_cached(p, true);
    b = get_free_block(p, pool, stream, size, false);
    return b ? b : grow(p, pool, stream, size, true);
}

static void set_tag(ndm__ablk *b, const ndm__alloc_tag *tag, ndm__rstr *path)
{
    b->file = tag ? tag->file : NULL;
    b->func = tag ? tag->func : NULL;
    b->line = tag ? tag->line : 0;
    atomic_store_explicit(&b->mgr, tag ? tag->manager : 0, memory_order_relaxed);
    if (b->path)
        ndm__rstr_unref(b->path);
    b->path = path ? ndm__rstr_ref(path) : NULL;
}

/* Start of a slow operation of this thread: its cache's counters join the
 * shared figures. */
static ndm__tcache *slow_begin(ndm__pool *p)
{
    ndm__tcache *tc = ndm__tc_get_locked(p);
    if (tc) {
        ndm__tc_fold(p, tc);
        if (!p->tc_allowed && tc->cached_bytes)
            ndm__tc_flush(p, tc);
    }
    return tc;
}

static void slow_end(ndm__pool *p, ndm__tcache *tc)
{
    if (tc)
        ndm__tc_grant(p, tc);
}

/* Whether another pressure_every_mb has been allocated since the last run. */
static bool pressure_due(ndm__pool *p)
{
    size_t every = p->set.pressure_every;
    if (!every)
        return false;
    int64_t total = p->cum_alloc;
    for (ndm__tcache *tc = p->caches; tc; tc = tc->next)
        total += atomic_load_explicit(&tc->b_alloc, memory_order_relaxed);
    if (total < p->next_pressure)
        return false;
    p->next_pressure = (total / (int64_t)every + 1) * (int64_t)every;
    return true;
}

static void finish_alloc(ndm__pool *p, ndm__ablk *b, size_t size, size_t req,
                         const ndm__alloc_tag *tag, ndm__rstr *path, ndm__block *out,
                         bool from_cache)
{
    b = alloc_found(p, b, size, req, from_cache);
    b->whole = b->size == b->seg->size;
    set_tag(b, tag, path);
    ndm__hist_event(p, NDM__EV_ALLOC, b->addr, req, b->path);
    ndm__trace_alloc(p, b, req);
    out->ptr = (void *)b->addr;
    out->cookie = b;
    out->size = b->size;
}

const char *ndm__fmt_size(size_t n, char *buf, size_t len)
{
    if (n <= 1024)
        snprintf(buf, len, "%zu bytes", n);
    else if (n <= ((size_t)1 << 20))
        snprintf(buf, len, "%.2f KiB", (double)n / 1024.0);
    else if (n <= ((size_t)1 << 30))
        snprintf(buf, len, "%.2f MiB", (double)n / (1024.0 * 1024.0));
    else
        snprintf(buf, len, "%.2f GiB", (double)n / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

static ndm_status oom(ndm__pool *p, size_t req, size_t size, ndm__rstr *cause,
                      const ndm__alloc_tag *tag)
{
    char s_req[32], s_round[32], s_alloc[32], s_res[32], s_free[32], s_large[32], s_lim[48];
    char s_dfree[32], s_dtotal[32];
    ndm__pool_lock(p);
    p->st.num_ooms++;
    size_t dfree = 0, dtotal = 0;
    if (p->src->mem_info)
        (void)p->src->mem_info(p->src->ctx, &dfree, &dtotal);
    ndm__hist_event(p, NDM__EV_OOM, dfree, req, cause);
    ndm_memory_stats st = p->st;
    int64_t largest_cached = 0;
    ndm__tc_add_unfolded(p, &st, &largest_cached);
    size_t l0 = largest_free(p, 0), l1 = largest_free(p, 1);
    size_t largest = (size_t)largest_cached;
    if (l0 > largest)
        largest = l0;
    if (l1 > largest)
        largest = l1;
    size_t limit = p->set.memory_limit;
    ndm__pool_unlock(p);
    int64_t allocated = st.allocated_bytes[NDM_POOL_ALL].current;
    int64_t reserved = st.reserved_bytes[NDM_POOL_ALL].current;
    if (limit)
        ndm__fmt_size(limit, s_lim, sizeof s_lim);
    else
        snprintf(s_lim, sizeof s_lim, "none");
    char managers[512] = "";
    if (p->real_device)
        ndm__report_managers(p->device, managers, sizeof managers);
    char dev[96] = "";
    if (dtotal)
        snprintf(dev, sizeof dev, "; the device has %s free of %s",
                 ndm__fmt_size(dfree, s_dfree, sizeof s_dfree),
                 ndm__fmt_size(dtotal, s_dtotal, sizeof s_dtotal));
    /* Named after the tag's caller and site, when it has them. */
    return ndm__alloc_fail(
        tag, NDM_E_OOM,
        "out of memory on %s: tried to allocate %s (%s rounded); %s allocated, %s reserved "
        "(%s free in the cache, largest free block %s), limit %s%s%s%s",
        p->name, ndm__fmt_size(req, s_req, sizeof s_req),
        ndm__fmt_size(size, s_round, sizeof s_round),
        ndm__fmt_size((size_t)allocated, s_alloc, sizeof s_alloc),
        ndm__fmt_size((size_t)reserved, s_res, sizeof s_res),
        ndm__fmt_size((size_t)(reserved - allocated), s_free, sizeof s_free),
        ndm__fmt_size(largest, s_large, sizeof s_large), s_lim, dev,
        managers[0] ? "; managers holding the most: " : "", managers);
}

static ndm_status alloc_slow(ndm__pool *p, size_t req, size_t size, uintptr_t stream,
                             const ndm__alloc_tag *tag, ndm__block *out)
{
    /* While recording, the allocation's context (manager path and frames)
     * is made before the lock: describing a manager takes the tree lock. */
    ndm__rstr *path = NULL;
    if (__builtin_expect(atomic_load_explicit(&ndm__instrumented, memory_order_relaxed) & 1, 0) &&
        tag && ndm__hist_recording())
        path = ndm__hist_context(p->real_device ? tag->manager : 0, tag);
    ndm_status st = NDM_OK;
    bool periodic = false, failed = false;
    /* Only small-pool operations touch the thread cache; the others leave
     * its counters and grant alone (the peak checks count them). */
    ndm__pool_lock(p);
    bool small = pool_for(p, size) == NDM__POOL_SMALL;
    ndm__tcache *tc = small ? slow_begin(p) : NULL;
    p->hist_cause = path; /* segment events name the allocation that caused them */
    if (p->npending)
        process_events(p);
    ndm__ablk *b = cache_take_locked(p, tc, size);
    bool from_cache = b != NULL;
    if (!b)
        b = attempt(p, tc, stream, size, tag && tag->transient);
    if (b) {
        finish_alloc(p, b, size, req, tag, path, out, from_cache);
        periodic = pressure_due(p);
    }
    p->hist_cause = NULL;
    slow_end(p, tc);
    ndm__pool_unlock(p);
    if (!b) {
        /* The device has nothing more: let the program release what it can,
         * with no lock held, then search again. */
        failed = ndm__pressure_run(p, NDM_PRESSURE_FAILED, req);
        ndm__pool_lock(p);
        small = pool_for(p, size) == NDM__POOL_SMALL;
        tc = small ? slow_begin(p) : NULL;
        p->hist_cause = path;
        if (failed) {
            int pool = pool_for(p, size);
            b = get_free_block(p, pool, stream, size, false);
            if (!b)
                b = grow(p, pool, stream, size, false);
        }
        if (!b)
            b = attempt_after_release(p, stream, size);
        if (b) {
            finish_alloc(p, b, size, req, tag, path, out, false);
            periodic = pressure_due(p);
        }
        p->hist_cause = NULL;
        slow_end(p, tc);
        ndm__pool_unlock(p);
        if (!b)
            st = oom(p, req, size, path, tag);
    }
    if (path)
        ndm__rstr_unref(path);
    if (periodic)
        ndm__pressure_run(p, NDM_PRESSURE_PERIODIC, req);
    return st;
}

ndm_status ndm__pool_alloc(ndm__pool *p, size_t nbytes, const ndm__alloc_tag *tag,
                           ndm__block *out)
{
    return ndm__pool_alloc_on(p, nbytes, 0, tag, out);
}

ndm_status ndm__pool_alloc_on(ndm__pool *p, size_t nbytes, uintptr_t stream,
                              const ndm__alloc_tag *tag, ndm__block *out)
{
    if (__builtin_expect(nbytes > (SIZE_MAX >> 2), 0)) {
        char s[32];
        memset(out, 0, sizeof *out);
        return ndm__alloc_fail(tag, NDM_E_OOM,
                               "out of memory on %s: tried to allocate %s, more than any device "
                               "holds",
                               p->name, ndm__fmt_size(nbytes, s, sizeof s));
    }
    size_t size = ndm__pool_round(p, nbytes);
    if (size <= NDM__TC_MAX_SIZE && ndm__tc_try_alloc(p, size, nbytes, tag, out))
        return NDM_OK;
    ndm_status st = alloc_slow(p, nbytes, size, p->streamed ? stream : 0, tag, out);
    if (st < 0)
        memset(out, 0, sizeof *out);
    return st;
}

void ndm__pool_free(ndm__pool *p, ndm__block *blk)
{
    ndm__ablk *b = blk->cookie;
    memset(blk, 0, sizeof *blk);
    if (!b)
        return;
    if (ndm__tc_try_free(p, b))
        return;
    int pool = b->pool;
    ndm__pool_lock(p);
    ndm__tcache *tc = pool == NDM__POOL_SMALL ? slow_begin(p) : NULL;
    stat_add(p, p->st.allocation, pool, -1, NDM__G_N);
    stat_add(p, p->st.allocated_bytes, pool, -(int64_t)b->size, NDM__G_B);
    if (b->size >= p->set.max_split_size)
        stat_inc1(&p->st.oversize_allocations, -1);
    if (cacheable(p, tc, b)) {
        cache_put_locked(p, tc, b);
        slow_end(p, tc);
        ndm__pool_unlock(p);
        return;
    }
    ndm__hist_event(p, NDM__EV_FREE_REQUESTED, b->addr, b->requested, b->path);
    ndm__trace_free(p, b);
    if (b->nuses) {
        defer_free(p, b);
        slow_end(p, tc);
        ndm__pool_unlock(p);
        return;
    }
    ndm__hist_event(p, NDM__EV_FREE_COMPLETED, b->addr, b->requested, b->path);
    free_block(p, b, false);
    if (p->set.policy->release_on_free && !is_split(b))
        release_block(p, b);
    slow_end(p, tc);
    ndm__pool_unlock(p);
}

/* ---- lifecycle ------------------------------------------------------------------------ */

ndm_status ndm__pool_record_stream(ndm__pool *p, void *cookie, uintptr_t stream)
{
    ndm__ablk *b = cookie;
    if (!b || !p->streamed)
        return NDM_OK;
    ndm_status st = NDM_OK;
    ndm__pool_lock(p);
    bool known = stream == b->stream;
    for (uint32_t i = 0; i < b->nuses && !known; i++)
        known = b->uses[i] == stream;
    if (atomic_load_explicit(&b->state, memory_order_relaxed) != NDM__B_ALLOCATED) {
        st = NDM_E_INVALID;
    } else if (!known) {
        if (b->nuses == b->uses_cap) {
            uint32_t cap = b->uses_cap ? 2 * b->uses_cap : 2;
            uintptr_t *u = realloc(b->uses, cap * sizeof *u);
            if (!u) {
                ndm__pool_unlock(p);
                return NDM_E_OOM;
            }
            b->uses = u;
            b->uses_cap = cap;
        }
        b->uses[b->nuses] = stream;
        __atomic_store_n(&b->nuses, b->nuses + 1, __ATOMIC_RELAXED); /* (see below) */
    }
    ndm__pool_unlock(p);
    return st;
}

uint32_t ndm__pool_stream_uses(void *cookie)
{
    /* The count is written under the pool's lock with atomic stores, so it
     * can be read without the lock: by a caller that holds a manager's
     * lock (ndm_why_alive), which must not take the pool's after it. */
    const ndm__ablk *b = cookie;
    return b ? __atomic_load_n(&b->nuses, __ATOMIC_RELAXED) : 0;
}

size_t ndm__pool_pending(ndm__pool *p)
{
    ndm__pool_lock(p);
    size_t n = p->npending;
    ndm__pool_unlock(p);
    return n;
}

static void update_tc_allowed(ndm__pool *p)
{
    p->tc_allowed = ndm__tc_supported && p->slot >= 0 && p->set.thread_cache && !p->streamed &&
                    p->set.policy->thread_cache && !p->hist &&
                    !(atomic_load_explicit(&ndm__instrumented, memory_order_relaxed) & 2);
}

ndm__pool *ndm__pool_new(const ndm__segment_source *src, ndm_device device, const char *name,
                         bool real_device)
{
    ndm__pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->src = src;
    p->device = device;
    p->real_device = real_device;
    snprintf(p->name, sizeof p->name, "%s", name);
    ndm__settings_default(&p->set, device);
    p->prio_seed = 0x9e3779b9u ^ (uint32_t)(uintptr_t)p;
    if (!p->prio_seed)
        p->prio_seed = 1;
    p->st.max_split_size = -1;
    p->streamed = src->event_record && src->event_query && src->event_sync && src->event_release;
    p->can_expand = src->reserve && src->unreserve && src->commit && src->decommit;
    p->slot = ndm__tc_slot_acquire(&p->gen);
    update_tc_allowed(p);
    return p;
}

void ndm__pool_destroy(ndm__pool *p)
{
    if (!p)
        return;
    if (p->slot >= 0)
        ndm__tc_slot_release(p->slot);
    ndm__pool_lock(p);
    ndm__tc_drop_all(p);
    for (size_t i = 0; i < p->npending; i++)
        if (p->pending[i].event)
            p->src->event_release(p->src->ctx, p->pending[i].event);
    free(p->pending);
    for (ndm__aseg *s = p->segs, *n; s; s = n) {
        n = s->next;
        if (p->poison)
            ndm__unpoison(s->base, s->size);
        if (s->expandable) {
            p->src->decommit(p->src->ctx, s->base, s->size);
            p->src->unreserve(p->src->ctx, s->base, s->span);
        } else {
            p->src->unmap(p->src->ctx, s->base, s->size);
        }
        free(s);
    }
    p->segs = NULL;
    ndm__hist_drop(p);
    for (size_t i = 0; i < p->nchunks; i++) {
        ndm__ablk *c = p->chunks[i];
        for (int k = 0; k < RECORDS_PER_CHUNK; k++) {
            if (c[k].path)
                ndm__rstr_unref(c[k].path);
            free(c[k].uses);
        }
        free(c);
    }
    free(p->chunks);
    ndm__pool_unlock(p);
    pthread_mutex_destroy(&p->lock);
    free(p);
}


ndm_status ndm__pool_configure(ndm__pool *p, const ndm__settings *s, const char *conf)
{
    ndm__pool_lock(p);
    ndm__tcache *tc = slow_begin(p);
    release_cached(p, false);
    if (p->arena) {
        /* A free arena goes; one still in use stays, pinned only while the
         * strategy still keeps an arena (preallocate). */
        ndm__ablk *h = p->arena->head;
        if (!is_split(h) && atomic_load_explicit(&h->state, memory_order_relaxed) == NDM__B_FREE) {
            release_block(p, h);
        } else if (!s->policy->arena) {
            p->arena->pinned = false;
            p->arena = NULL;
        }
    }
    p->set = *s;
    for (int k = 0; k < NDM__DIV_INTERVALS; k++)
        atomic_store_explicit(&p->divisions[k], s->divisions[k], memory_order_relaxed);
    p->arena_tried = p->arena != NULL;
    p->st.max_split_size = s->max_split_size == SIZE_MAX ? -1 : (int64_t)s->max_split_size;
    p->next_pressure = s->pressure_every ? p->cum_alloc + (int64_t)s->pressure_every : 0;
    snprintf(p->conf, sizeof p->conf, "%s", conf ? conf : "");
    update_tc_allowed(p);
    slow_end(p, tc);
    ndm__pool_unlock(p);
    return NDM_OK;
}

void ndm__pool_refresh(ndm__pool *p)
{
    update_tc_allowed(p);
    if (!p->tc_allowed)
        ndm__tc_freeze_all(p, true);
}

void ndm__pool_settings(ndm__pool *p, ndm__settings *out, char *conf, size_t n)
{
    ndm__pool_lock(p);
    *out = p->set;
    if (conf)
        snprintf(conf, n, "%s", p->conf);
    ndm__pool_unlock(p);
}

/* ---- statistics and maintenance ----------------------------------------------------------- */

void ndm__pool_stats(ndm__pool *p, ndm_memory_stats *out)
{
    ndm__pool_lock(p);
    *out = p->st;
    int64_t largest = 0;
    ndm__tc_add_unfolded(p, out, &largest);
    for (int pool = 0; pool < 2; pool++) {
        size_t m = largest_free(p, pool);
        if ((int64_t)m > largest)
            largest = (int64_t)m;
    }
    out->memory_limit = (int64_t)p->set.memory_limit;
    ndm__pool_unlock(p);
    out->largest_free_block = largest;
    out->free_bytes =
        out->reserved_bytes[NDM_POOL_ALL].current - out->allocated_bytes[NDM_POOL_ALL].current;
    out->fragmentation =
        out->free_bytes > 0 ? (double)(out->free_bytes - largest) / (double)out->free_bytes : 0;
    size_t fr = 0, total = 0;
    if (p->src->mem_info && p->src->mem_info(p->src->ctx, &fr, &total) == NDM_OK) {
        out->device_free = (int64_t)fr;
        out->device_total = (int64_t)total;
    }
}

static void each_stat(ndm_memory_stats *s, void (*fn)(ndm_memory_stat *))
{
    ndm_memory_stat *groups[] = {s->allocation,     s->segment,        s->active,
                                 s->inactive_split, s->allocated_bytes, s->reserved_bytes,
                                 s->active_bytes,   s->inactive_split_bytes, s->requested_bytes};
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
        for (int k = 0; k < NDM_POOL_COUNT; k++)
            fn(&groups[g][k]);
    fn(&s->oversize_allocations);
    fn(&s->oversize_segments);
}

static void peak_to_current(ndm_memory_stat *x) { x->peak = x->current; }
static void zero_sums(ndm_memory_stat *x) { x->allocated = x->freed = 0; }

void ndm__pool_reset_peaks(ndm__pool *p)
{
    ndm__pool_lock(p);
    ndm__tcache *tc = slow_begin(p);
    ndm__tc_freeze_all(p, false);
    each_stat(&p->st, peak_to_current);
    slow_end(p, tc);
    ndm__pool_unlock(p);
}

void ndm__pool_reset_accumulated(ndm__pool *p)
{
    ndm__pool_lock(p);
    ndm__tcache *tc = slow_begin(p);
    ndm__tc_freeze_all(p, false);
    each_stat(&p->st, zero_sums);
    p->st.num_alloc_retries = p->st.num_ooms = p->st.num_sync_all_streams = 0;
    p->st.num_device_alloc = p->st.num_device_free = p->st.num_pressure_calls = 0;
    p->st.num_thread_cache_allocs = 0;
    slow_end(p, tc);
    ndm__pool_unlock(p);
}

void ndm__pool_empty_cache(ndm__pool *p)
{
    ndm__pool_lock(p);
    ndm__tcache *tc = slow_begin(p);
    release_cached(p, true);
    slow_end(p, tc);
    ndm__pool_unlock(p);
}

/* ---- snapshots ----------------------------------------------------------------------------- */

static int seg_cmp(const void *a, const void *b)
{
    const ndm__snap_seg *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

ndm_status ndm__pool_snapshot(ndm__pool *p, ndm__snapshot *out)
{
    memset(out, 0, sizeof *out);
    ndm__pool_lock(p);
    ndm__tcache *tc = slow_begin(p);
    /* The caches stop so their blocks can be read; they restart at their
     * owners' next shared operation. */
    ndm__tc_freeze_all(p, false);
    size_t nsegs = 0, nblocks = 0;
    for (ndm__aseg *s = p->segs; s; s = s->next) {
        nsegs++;
        for (ndm__ablk *b = s->head; b; b = b->next)
            nblocks++;
    }
    out->segs = malloc((nsegs ? nsegs : 1) * sizeof *out->segs);
    out->blocks = malloc((nblocks ? nblocks : 1) * sizeof *out->blocks);
    if (!out->segs || !out->blocks) {
        slow_end(p, tc);
        ndm__pool_unlock(p);
        ndm__snapshot_free(out);
        return NDM_E_OOM;
    }
    size_t k = 0, j = 0, active = 0;
    for (ndm__aseg *s = p->segs; s; s = s->next) {
        ndm__snap_seg *g = &out->segs[k++];
        *g = (ndm__snap_seg){.addr = s->addr, .size = s->size, .pool = s->pool,
                             .pinned = s->pinned, .expandable = s->expandable,
                             .stream = s->stream, .first = j, .count = 0};
        for (ndm__ablk *b = s->head; b; b = b->next) {
            int state = atomic_load_explicit(&b->state, memory_order_relaxed);
            uint32_t mgr = atomic_load_explicit(&b->mgr, memory_order_relaxed);
            out->blocks[j++] = (ndm__snap_block){
                .addr = b->addr,
                .size = b->size,
                .requested = state == NDM__B_ALLOCATED ? b->requested : 0,
                .state = state == NDM__B_ALLOCATED || state == NDM__B_PENDING ? state : NDM__B_FREE,
                .stream = b->stream,
                .mgr = state == NDM__B_ALLOCATED ? mgr : 0,
                .file = state == NDM__B_ALLOCATED ? b->file : NULL,
                .func = state == NDM__B_ALLOCATED ? b->func : NULL,
                .line = state == NDM__B_ALLOCATED ? b->line : 0,
                .path = state == NDM__B_ALLOCATED && b->path ? ndm__rstr_ref(b->path) : NULL,
            };
            g->count++;
            if (state == NDM__B_ALLOCATED)
                active += b->size;
        }
    }
    /* PyTorch's snapshot entry carries the active bytes; the ring is copied
     * after it, under the same hold of the lock as the segments, so a
     * replay of the trace backwards from the segments is exact. */
    ndm__hist_event(p, NDM__EV_SNAPSHOT, 0, active, NULL);
    ndm_status st = ndm__hist_copy(p, &out->trace, &out->ntrace);
    out->active = active;
    out->set = p->set;
    snprintf(out->conf, sizeof out->conf, "%s", p->conf);
    slow_end(p, tc);
    ndm__pool_unlock(p);
    if (st < 0) {
        out->nblocks = nblocks;
        ndm__snapshot_free(out);
        return st;
    }
    out->nsegs = nsegs;
    out->nblocks = nblocks;
    qsort(out->segs, nsegs, sizeof *out->segs, seg_cmp);
    return NDM_OK;
}

void ndm__snapshot_free(ndm__snapshot *s)
{
    if (s->blocks)
        for (size_t i = 0; i < s->nblocks; i++)
            if (s->blocks[i].path)
                ndm__rstr_unref(s->blocks[i].path);
    ndm__hist_copy_free(s->trace, s->ntrace);
    free(s->segs);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

/* ---- refcounted strings ------------------------------------------------------------------- */

ndm__rstr *ndm__rstr_new(const char *s)
{
    size_t n = strlen(s);
    ndm__rstr *r = malloc(sizeof *r + n + 1);
    if (!r)
        return NULL;
    atomic_init(&r->refs, 1);
    r->nframes = 0;
    r->frames = NULL;
    memcpy(r->s, s, n + 1);
    return r;
}

ndm__rstr *ndm__rstr_ref(ndm__rstr *r)
{
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    return r;
}

void ndm__rstr_unref(ndm__rstr *r)
{
    if (r && atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
        free(r);
}
