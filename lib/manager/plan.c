/* Planned managers: plan caches, the recording of a step's allocations, the
 * offset plan (greedy by size over lifetimes) and the replay from an arena. */
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "plan.h"
#include "reclaim.h"
#include "thread.h"
#include "../base/error.h"
#include "ndm/manager.h"
#include "ndm/plan.h"

#define MAX_HANDLES 1024
#define MAX_PLANS 1024
/* A creation may match one of the next few planned sizes (a planned one
 * missing from this step); those skipped are not served in this step. */
#define LOOKAHEAD 4
/* A recorded step longer than this is planned over its first blocks only. */
#define REC_MAX (1u << 20)
#define ALIGN ((size_t)64)
/* Scratch blocks a burst keeps track of (more are stacked for good). */
#define SCRATCH_LIVE 64
/* Times a plan's scratch blocks may grow. */
#define MAX_REPLANS 8
#ifndef SCRATCH_SLACK_PCT
#define SCRATCH_SLACK_PCT 0
#endif

/* States of a planned block in one step. Only RELEASED vouches for the
 * blocks below it (see serve). */
enum {
    ST_UNSERVED = 0,
    ST_LIVE,
    ST_RELEASED,
    ST_LIVE_STREAMED, /* used on another stream: its memory is not reused in this step */
    ST_HELD,
};

/* One cached plan: a step's allocations in creation order, n of them, and
 * before each (and after the last) the kernel scratch taken between it and
 * the one before, as one block of the most bytes that scratch stacked up:
 * nb blocks in all, in the order they are served. */
typedef struct entry {
    struct entry *next; /* the cache, most recently used first */
    uint64_t sig;
    ndm_device dev;
    uint32_t n, nb;
    size_t *nbytes;   /* [n] request bytes of the allocations */
    uint32_t *pidx;   /* [n] allocation k is block pidx[k] */
    uint32_t *slot;   /* [n + 1] the scratch block before allocation c (UINT32_MAX: none) */
    size_t *off, *size; /* [nb] offsets and (aligned) sizes */
    /* For block k, the earlier blocks whose memory it overlaps that must be
     * released before k is served: klist[kstart[k] .. kstart[k + 1]). */
    uint32_t *kstart, *klist;
    size_t arena_bytes, max_live, total;
    struct blk_in *life; /* [nb] the recorded sizes and lifetimes (for a re-plan) */
    int replans;         /* times its scratch blocks grew */
    ndm__block spare; /* the arena a finished step gave back (cookie NULL: none) */
    int runs;         /* steps using it (plan lock) */
    bool listed;      /* in the cache; once evicted it dies with its last step */
} entry;

typedef struct ndm__plan {
    pthread_mutex_t lock;
    atomic_int refs; /* the handle, the owner's hook, each run */
    uint32_t slot, gen;
    uint32_t owner; /* owner's manager slot: the arenas' tag */
    int max_plans, nentries;
    entry *entries;
    bool closed;
    int64_t recorded, replayed, evicted, arena_allocs, replanned; /* under lock */
    _Atomic int64_t hits, fallbacks, arena_bytes;
} ndm__plan;

typedef struct ndm__plan_run run_t;

typedef struct blk_life {
    size_t nbytes;
    uint64_t t0, t1;
} blk_life;

/* A block the allocator gave while a step was recorded, handed out under a
 * cookie of the run's own: what recorded blocks and scratch share. */
typedef struct held_blk {
    ndm__xblock x;
    run_t *run;
    ndm__block real;
    ndm_device dev;
    size_t nbytes;
} held_blk;

/* A block of a recorded step: the allocator's block, and its lifetime. */
typedef struct rec_blk {
    held_blk h;
    uint64_t t_alloc;
    _Atomic uint64_t t_free;
} rec_blk;

/* A planned block of a replayed step. */
typedef struct sub_blk {
    ndm__xblock x;
    run_t *run;
    uint32_t idx; /* its block */
} sub_blk;

/* The scratch taken between two allocations of a recorded step. */
typedef struct gap_rec {
    size_t high;   /* the most bytes stacked at once */
    uint64_t t0, t1; /* from the first take to the last free */
} gap_rec;

struct ndm__plan_run {
    ndm__plan *plan;
    uint64_t sig;
    ndm_device dev;
    uint64_t tid;    /* the thread whose creations are planned */
    atomic_int refs; /* the manager (until its close) and each live block */
    bool replay;
    _Atomic int64_t hits, fallbacks; /* hits: the planned thread only */
    _Atomic int64_t shits;           /* scratch served from the region, any thread */
    /* recording */
    rec_blk **recs;
    uint32_t nrec, caprec;
    _Atomic uint32_t nrec_pub; /* nrec, for other threads */
    _Atomic uint64_t clock;
    /* Kernel scratch (transient: freed before its operation returns, on
     * any thread of a parallel kernel, in an order that varies) is not
     * planned block by block: a burst of it (from a first take to the free
     * that leaves none live) is stacked in the scratch block of the gap
     * between allocations where it began. Under tlock. */
    pthread_mutex_t tlock;
    uint32_t s_live, s_block; /* live scratch blocks; the block they are in (replay) */
    uint32_t s_gap;           /* recording: the gap they began in */
    size_t s_top;             /* the end of the highest live one */
    uint64_t s_t0;
    /* The live scratch blocks of the burst, [off, end) in its block: a
     * free of the highest lowers the top, as a stack's would. */
    size_t s_off[SCRATCH_LIVE], s_end[SCRATCH_LIVE];
    int s_n;
    size_t s_untracked;       /* the end of the highest one not tracked */
    gap_rec *gaps;            /* recording: [ngaps] */
    uint32_t ngaps;
    blk_life *tl;             /* recording: each scratch block's bytes and lifetime */
    size_t ntl, captl;
    ndm__xblock sx;           /* the one cookie of every scratch block served */
    size_t *need;             /* replay: [nb] room a burst wanted past its block (tlock) */
    bool short_scratch;
    /* replay */
    entry *e;
    ndm__block arena;
    char *base;
    _Atomic uint32_t cursor;
    atomic_bool streamed;
    /* Captured into a device graph now: an allocation the arena does not
     * serve cannot be captured (the graph could not own its memory). */
    atomic_bool capturing;
    sub_blk *subs;
    _Atomic unsigned char *state;
};

/* ---- handles ------------------------------------------------------------------- */

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static ndm__plan *handles[MAX_HANDLES];
static uint32_t handle_gen[MAX_HANDLES];

static void plan_unref(ndm__plan *p)
{
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* The plan of handle h with a reference taken, or NULL with the error. */
static ndm__plan *plan_get(ndm_plan h, const char *api, ndm__site site)
{
    if (!h.id) {
        ndm__fail(NDM_E_NULL, api, site, "null plan handle");
        return NULL;
    }
    uint32_t slot = (uint32_t)h.id, gen = (uint32_t)(h.id >> 32);
    if (!slot || slot >= MAX_HANDLES || !gen) {
        ndm__fail(NDM_E_INVALID, api, site, "not a plan handle (id 0x%016" PRIx64 ")", h.id);
        return NULL;
    }
    pthread_mutex_lock(&handles_lock);
    ndm__plan *p = handles[slot];
    bool issued = gen <= handle_gen[slot];
    if (p && handle_gen[slot] == gen)
        atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
    else
        p = NULL;
    pthread_mutex_unlock(&handles_lock);
    if (!p)
        ndm__fail(issued ? NDM_E_CLOSED : NDM_E_INVALID, api, site,
                  issued ? "the plan was closed (by ndm_plan_close or its owner's close)"
                         : "not a plan handle (id 0x%016" PRIx64 ")",
                  h.id);
    return p;
}

/* ---- entries ---------------------------------------------------------------------- */

static void entry_free(entry *e)
{
    free(e->nbytes);
    free(e->pidx);
    free(e->slot);
    free(e->size);
    free(e->off);
    free(e->kstart);
    free(e->klist);
    free(e->life);
    free(e);
}

/* Take e out of the cache (plan lock held); its kept arena goes to *spare
 * for the caller to free once the lock is gone. Freed now when no step
 * uses it. */
static void entry_unlist(ndm__plan *p, entry *e, ndm__block *spare)
{
    e->listed = false;
    p->nentries--;
    *spare = e->spare;
    e->spare = (ndm__block){NULL, NULL, 0};
    if (!e->runs)
        entry_free(e);
}

static void arena_free(ndm__plan *p, ndm_device dev, ndm__block *b)
{
    if (!b->cookie)
        return;
    atomic_fetch_sub_explicit(&p->arena_bytes, (int64_t)b->size, memory_order_relaxed);
    ndm__free(dev, b);
}

/* ---- the plan: greedy by size over lifetimes ---------------------------------------- */

typedef struct blk_in {
    size_t size; /* aligned */
    uint64_t t0, t1;
} blk_in;

static const blk_in *sort_base;

static int by_size(const void *a, const void *b)
{
    const blk_in *x = &sort_base[*(const uint32_t *)a], *y = &sort_base[*(const uint32_t *)b];
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    return 0;
}

static int by_off(const void *a, const void *b)
{
    const size_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static inline bool mem_overlap(size_t o1, size_t s1, size_t o2, size_t s2)
{
    return s1 && s2 && o1 < o2 + s2 && o2 < o1 + s1;
}

/* The plan of a recorded step (n blocks, creation order), or NULL without
 * memory. Blocks whose lifetimes overlap get disjoint memory; each block,
 * largest first, takes the smallest gap that holds it among the blocks
 * already placed whose lifetimes overlap its own. */
static entry *plan_compute(const blk_in *in, uint32_t n)
{
    entry *e = calloc(1, sizeof *e);
    uint32_t *order = malloc(sizeof *order * (n ? n : 1));
    uint32_t *placed = malloc(sizeof *placed * (n ? n : 1));
    size_t *gaps = malloc(sizeof *gaps * 2 * (n ? n : 1));
    if (!e || !order || !placed || !gaps)
        goto fail;
    e->nb = n;
    e->off = calloc(n ? n : 1, sizeof *e->off);
    e->size = malloc(sizeof *e->size * (n ? n : 1));
    e->kstart = calloc((size_t)n + 1, sizeof *e->kstart);
    if (!e->off || !e->size || !e->kstart)
        goto fail;
    for (uint32_t i = 0; i < n; i++)
        e->size[i] = in[i].size;
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    sort_base = in; /* (plans are computed under the plan lock of none: see finish) */
    qsort(order, n, sizeof *order, by_size);
    uint32_t nplaced = 0;
    size_t top = 0;
    for (uint32_t oi = 0; oi < n; oi++) {
        uint32_t i = order[oi];
        const blk_in *b = &in[i];
        if (!b->size) {
            e->off[i] = 0;
            continue;
        }
        /* The placed blocks alive with b, by offset. */
        size_t ng = 0;
        for (uint32_t q = 0; q < nplaced; q++) {
            const blk_in *o = &in[placed[q]];
            if (o->t0 < b->t1 && b->t0 < o->t1) {
                gaps[2 * ng] = e->off[placed[q]];
                gaps[2 * ng + 1] = o->size;
                ng++;
            }
        }
        qsort(gaps, ng, 2 * sizeof *gaps, by_off);
        size_t best = SIZE_MAX, best_gap = SIZE_MAX, at = 0;
        for (size_t g = 0; g < ng; g++) {
            size_t o = gaps[2 * g], s = gaps[2 * g + 1];
            if (o >= at && o - at >= b->size && o - at < best_gap) {
                best = at;
                best_gap = o - at;
            }
            if (o + s > at)
                at = o + s;
        }
        if (best == SIZE_MAX)
            best = at; /* past every block alive with it */
        e->off[i] = best;
        if (best + b->size > top)
            top = best + b->size;
        placed[nplaced++] = i;
    }
    e->arena_bytes = top;
    e->life = malloc(sizeof *e->life * (n ? n : 1));
    if (!e->life)
        goto fail;
    memcpy(e->life, in, sizeof *in * n);

    /* The blocks each block must find released: the earlier ones under its
     * memory, newest first, leaving out one that a kept newer one overlaps
     * (that one's own check covered it). */
    size_t cap = 16, used = 0;
    e->klist = malloc(sizeof *e->klist * cap);
    if (!e->klist)
        goto fail;
    for (uint32_t k = 0; k < n; k++) {
        e->kstart[k] = (uint32_t)used;
        size_t ko = e->off[k], ks = in[k].size;
        for (uint32_t j = k; j-- > 0;) {
            if (!mem_overlap(e->off[j], in[j].size, ko, ks))
                continue;
            bool covered = false;
            for (size_t q = e->kstart[k]; q < used && !covered; q++) {
                uint32_t w = e->klist[q];
                covered = mem_overlap(e->off[j], in[j].size, e->off[w], in[w].size);
            }
            if (covered)
                continue;
            if (used == cap) {
                uint32_t *g = realloc(e->klist, sizeof *g * cap * 2);
                if (!g)
                    goto fail;
                e->klist = g;
                cap *= 2;
            }
            e->klist[used++] = j;
        }
    }
    e->kstart[n] = (uint32_t)used;
    free(order);
    free(placed);
    free(gaps);
    return e;
fail:
    free(order);
    free(placed);
    free(gaps);
    if (e)
        entry_free(e);
    return NULL;
}

/* The most request bytes live at once, and their total. */
static void live_bytes(run_t *r, size_t *max_live, size_t *total)
{
    /* Events in clock order: each clock value is one creation or release. */
    uint64_t end = atomic_load_explicit(&r->clock, memory_order_relaxed);
    int64_t *delta = calloc(end ? end : 1, sizeof *delta);
    size_t cur = 0, best = 0, sum = 0;
    if (!delta) {
        *max_live = *total = 0;
        return;
    }
    for (uint32_t i = 0; i < r->nrec; i++) {
        rec_blk *b = r->recs[i];
        delta[b->t_alloc] += (int64_t)b->h.nbytes;
        delta[atomic_load_explicit(&b->t_free, memory_order_relaxed)] -= (int64_t)b->h.nbytes;
        sum += b->h.nbytes;
    }
    for (size_t i = 0; i < r->ntl; i++) { /* kernel scratch */
        delta[r->tl[i].t0] += (int64_t)r->tl[i].nbytes;
        delta[r->tl[i].t1] -= (int64_t)r->tl[i].nbytes;
        sum += r->tl[i].nbytes;
    }
    for (uint64_t t = 0; t < end; t++) {
        cur = (size_t)((int64_t)cur + delta[t]);
        if (cur > best)
            best = cur;
    }
    free(delta);
    *max_live = best;
    *total = sum;
}

/* ---- the end of a step ----------------------------------------------------------- */

static pthread_mutex_t compute_lock = PTHREAD_MUTEX_INITIALIZER;

/* The room a gap's scratch gets: what its burst had live in the recorded
 * step, and a share more, since the pool's threads take and free their
 * blocks in another order each step (a burst that does not fit falls back). */
static size_t scratch_room(size_t high)
{
    size_t extra = high / 100 * SCRATCH_SLACK_PCT;
    return (high + extra + ALIGN - 1) & ~(ALIGN - 1);
}

/* A recorded step's last block went: its plan joins the cache. */
static void finish_recording(run_t *r)
{
    ndm__plan *p = r->plan;
    uint32_t n = r->nrec, ng = r->ngaps < n + 1 ? r->ngaps : n + 1, nb = n;
    for (uint32_t c = 0; c < ng; c++)
        nb += r->gaps[c].high > 0;
    /* The blocks in the order they are served: gap c's scratch, then
     * allocation c. */
    blk_in *in = malloc(sizeof *in * (nb ? nb : 1));
    size_t *bytes = malloc(sizeof *bytes * (n ? n : 1));
    uint32_t *pidx = malloc(sizeof *pidx * (n ? n : 1));
    uint32_t *slot = malloc(sizeof *slot * (n + 1));
    entry *e = NULL;
    if (in && bytes && pidx && slot) {
        uint32_t i = 0;
        for (uint32_t c = 0; c <= n; c++) {
            slot[c] = UINT32_MAX;
            if (c < ng && r->gaps[c].high) {
                slot[c] = i;
                in[i++] = (blk_in){scratch_room(r->gaps[c].high), r->gaps[c].t0, r->gaps[c].t1};
            }
            if (c == n)
                break;
            rec_blk *b = r->recs[c];
            pidx[c] = i;
            in[i++] = (blk_in){(b->h.nbytes + ALIGN - 1) & ~(ALIGN - 1), b->t_alloc,
                               atomic_load_explicit(&b->t_free, memory_order_relaxed)};
            bytes[c] = b->h.nbytes;
        }
        pthread_mutex_lock(&compute_lock); /* (qsort's comparison reads one base) */
        e = plan_compute(in, nb);
        pthread_mutex_unlock(&compute_lock);
    }
    if (e) {
        e->n = n;
        e->nbytes = bytes;
        e->pidx = pidx;
        e->slot = slot;
        bytes = NULL;
        pidx = slot = NULL;
        live_bytes(r, &e->max_live, &e->total);
        e->sig = r->sig;
        e->dev = r->dev;
    }
    free(bytes);
    free(pidx);
    free(slot);
    free(r->gaps);
    free(in);
    for (uint32_t i = 0; i < n; i++)
        free(r->recs[i]);
    free(r->recs);
    ndm__block drop = {NULL, NULL, 0};
    ndm_device drop_dev = NDM_CPU;
    pthread_mutex_lock(&p->lock);
    bool have = false;
    for (entry *x = p->entries; x; x = x->next)
        have |= x->sig == r->sig && ndm_device_eq(x->dev, r->dev);
    if (e && !p->closed && !have) {
        e->listed = true;
        e->next = p->entries;
        p->entries = e;
        p->nentries++;
        p->recorded++;
        e = NULL;
        if (p->nentries > p->max_plans) {
            /* the least recently used goes */
            entry **pp = &p->entries;
            while ((*pp)->next)
                pp = &(*pp)->next;
            entry *old = *pp;
            *pp = NULL;
            drop_dev = old->dev;
            entry_unlist(p, old, &drop);
            p->evicted++;
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (e)
        entry_free(e);
    arena_free(p, drop_dev, &drop);
}

/* A replayed step's last block went: its arena is kept for the next step of
 * its signature, or freed (the plan closed or evicted, a spare kept already,
 * or a block used on another stream, whose work the allocator waits for). */
/* A plan like e with the scratch blocks a step found short grown to what
 * it wanted (NULL without memory). */
static entry *replan(const entry *e, const size_t *need)
{
    blk_in *in = malloc(sizeof *in * (e->nb ? e->nb : 1));
    size_t *nbytes = malloc(sizeof *nbytes * (e->n ? e->n : 1));
    uint32_t *pidx = malloc(sizeof *pidx * (e->n ? e->n : 1));
    uint32_t *slot = malloc(sizeof *slot * (e->n + 1));
    entry *x = NULL;
    if (in && nbytes && pidx && slot) {
        memcpy(in, e->life, sizeof *in * e->nb);
        for (uint32_t i = 0; i < e->nb; i++)
            if (need[i] > in[i].size)
                in[i].size = (need[i] + ALIGN - 1) & ~(ALIGN - 1);
        pthread_mutex_lock(&compute_lock);
        x = plan_compute(in, e->nb);
        pthread_mutex_unlock(&compute_lock);
    }
    if (x) {
        memcpy(nbytes, e->nbytes, sizeof *nbytes * e->n);
        memcpy(pidx, e->pidx, sizeof *pidx * e->n);
        memcpy(slot, e->slot, sizeof *slot * (e->n + 1));
        x->n = e->n;
        x->nbytes = nbytes;
        x->pidx = pidx;
        x->slot = slot;
        x->max_live = e->max_live;
        x->total = e->total;
        x->sig = e->sig;
        x->dev = e->dev;
        x->replans = e->replans + 1;
    } else {
        free(nbytes);
        free(pidx);
        free(slot);
    }
    free(in);
    return x;
}

static void finish_replay(run_t *r)
{
    ndm__plan *p = r->plan;
    entry *e = r->e;
    ndm__block a = r->arena;
    /* Scratch that did not fit (the pool's threads stacked it otherwise
     * than in the recorded step): the next steps get a plan with room for
     * it, a few times at most. */
    entry *x = r->short_scratch && r->need && e->replans < MAX_REPLANS ? replan(e, r->need) : NULL;
    ndm__block drop = {NULL, NULL, 0};
    pthread_mutex_lock(&p->lock);
    if (x && e->listed && !p->closed) {
        entry **pp = &p->entries;
        while (*pp != e)
            pp = &(*pp)->next;
        x->next = e->next;
        *pp = x;
        x->listed = true;
        e->listed = false;
        drop = e->spare;
        e->spare = (ndm__block){NULL, NULL, 0};
        p->replanned++;
        x = NULL;
    }
    if (a.cookie && e->listed && !e->spare.cookie && !p->closed &&
        !atomic_load_explicit(&r->streamed, memory_order_relaxed)) {
        e->spare = a;
        a = (ndm__block){NULL, NULL, 0};
    }
    bool dead = --e->runs == 0 && !e->listed;
    pthread_mutex_unlock(&p->lock);
    if (x)
        entry_free(x);
    arena_free(p, r->dev, &a);
    arena_free(p, r->dev, &drop);
    if (dead)
        entry_free(e);
    free(r->need);
    free(r->subs);
    free((void *)r->state);
}

static void run_unref(run_t *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    ndm__plan *p = r->plan;
    atomic_fetch_add_explicit(&p->hits,
                              atomic_load_explicit(&r->hits, memory_order_relaxed) +
                                  atomic_load_explicit(&r->shits, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&p->fallbacks,
                              atomic_load_explicit(&r->fallbacks, memory_order_relaxed),
                              memory_order_relaxed);
    if (r->replay)
        finish_replay(r);
    else
        finish_recording(r);
    pthread_mutex_destroy(&r->tlock);
    free(r->tl);
    free(r);
    plan_unref(p);
}

static void run_unref_later(void *a, uintptr_t b)
{
    (void)b;
    run_unref(a);
}

void ndm__plan_run_share(run_t *r) { atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); }

void ndm__plan_seal(ndm__manager *m)
{
    run_t *r = atomic_exchange_explicit(&m->plan_run, NULL, memory_order_relaxed);
    if (!r)
        return;
    /* The planned thread may be inside a creation in m right now (a close
     * from another thread): the run outlives what it can still read. */
    ndm__thread *th = ndm__tls;
    if (th && th->id == r->tid)
        run_unref(r);
    else
        ndm__defer(run_unref_later, r, 0);
}

/* ---- the blocks ---------------------------------------------------------------------- */

static void rec_free(ndm__xblock *x, void *ptr)
{
    (void)ptr;
    rec_blk *b = (rec_blk *)x;
    run_t *r = b->h.run;
    atomic_store_explicit(&b->t_free,
                          atomic_fetch_add_explicit(&r->clock, 1, memory_order_relaxed),
                          memory_order_relaxed);
    ndm__free(b->h.dev, &b->h.real);
    run_unref(r);
}

static ndm_status held_record_stream(ndm__xblock *x, uintptr_t stream)
{
    held_blk *h = (held_blk *)x;
    return ndm__alloc_record_stream(h->dev, h->real.cookie, stream);
}

static uint32_t held_stream_uses(ndm__xblock *x)
{
    held_blk *h = (held_blk *)x;
    return ndm__alloc_stream_uses(h->dev, h->real.cookie);
}

/* Take h's block from the allocator, with a reference on the run (a pressure
 * callback inside the allocation may close the manager); on failure the
 * reference is dropped and *out empty. */
static ndm_status held_take(run_t *r, held_blk *h, const ndm__xblock_fns *fns, ndm_device dev,
                            size_t nbytes, const ndm__alloc_tag *tag, ndm__block *out)
{
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    ndm_status st = ndm__alloc(dev, nbytes, tag, &h->real);
    if (st < 0) {
        run_unref(r);
        *out = (ndm__block){NULL, NULL, 0};
        return st;
    }
    h->x.fns = fns;
    h->run = r;
    h->dev = dev;
    h->nbytes = nbytes;
    return NDM_OK;
}

/* The block the caller sees: the allocator's memory under h's cookie. */
static void held_out(held_blk *h, ndm__block *out)
{
    out->ptr = h->real.ptr;
    out->cookie = ndm__xblock_cookie(&h->x);
    out->size = h->real.size;
}

static const ndm__xblock_fns rec_fns = {rec_free, held_record_stream, held_stream_uses};

static void sub_free(ndm__xblock *x, void *ptr)
{
    (void)ptr;
    sub_blk *b = (sub_blk *)x;
    run_t *r = b->run;
    unsigned char st = atomic_load_explicit(&r->state[b->idx], memory_order_relaxed);
    /* Release: the next user of this memory, on any thread, sees our writes done. */
    atomic_store_explicit(&r->state[b->idx], st == ST_LIVE_STREAMED ? ST_HELD : ST_RELEASED,
                          memory_order_release);
    run_unref(r);
}

static ndm_status sub_record_stream(ndm__xblock *x, uintptr_t stream)
{
    sub_blk *b = (sub_blk *)x;
    run_t *r = b->run;
    /* The arena's free waits for that stream; this block's memory is not
     * reused in the step, nor the arena kept for the next one. */
    ndm_status st = ndm__alloc_record_stream(r->dev, r->arena.cookie, stream);
    if (st == NDM_OK) {
        atomic_store_explicit(&r->streamed, true, memory_order_relaxed);
        atomic_store_explicit(&r->state[b->idx], ST_LIVE_STREAMED, memory_order_relaxed);
    }
    return st;
}

static uint32_t sub_stream_uses(ndm__xblock *x)
{
    sub_blk *b = (sub_blk *)x;
    return atomic_load_explicit(&b->run->state[b->idx], memory_order_relaxed) ==
                   ST_LIVE_STREAMED
               ? 1
               : 0;
}

static const ndm__xblock_fns sub_fns = {sub_free, sub_record_stream, sub_stream_uses};

static inline bool same_dev(ndm_device a, ndm_device b)
{
    return a.type == b.type && a.index == b.index;
}

/* ---- the scratch region ------------------------------------------------------------ */

/* Stack asz bytes on the burst (tlock held): their offset. */
static size_t burst_push(run_t *r, size_t asz)
{
    size_t at = r->s_top;
    r->s_top += asz;
    if (r->s_n < SCRATCH_LIVE) {
        r->s_off[r->s_n] = at;
        r->s_end[r->s_n] = at + asz;
        r->s_n++;
    } else if (r->s_untracked < at + asz) {
        r->s_untracked = at + asz;
    }
    return at;
}

/* The block at offset `at` of the burst is freed (tlock held); the top
 * comes down to the highest block still live. */
static void burst_end(run_t *r)
{
    r->s_top = r->s_untracked = 0;
    r->s_n = 0;
}

static void burst_pop(run_t *r, size_t at)
{
    for (int i = 0; i < r->s_n; i++)
        if (r->s_off[i] == at) {
            r->s_off[i] = r->s_off[--r->s_n];
            r->s_end[i] = r->s_end[r->s_n];
            size_t top = 0;
            for (int j = 0; j < r->s_n; j++)
                if (r->s_end[j] > top)
                    top = r->s_end[j];
            /* (blocks not kept track of stay below the top: it only
             * comes down to the highest one recorded, never under them) */
            if (r->s_n == 0 || top < r->s_top)
                r->s_top = r->s_untracked > top ? r->s_untracked : top;
            return;
        }
}

static void sx_free(ndm__xblock *x, void *ptr)
{
    run_t *r = (run_t *)((char *)x - offsetof(run_t, sx));
    pthread_mutex_lock(&r->tlock);
    if (ptr)
        burst_pop(r, (size_t)((char *)ptr - (r->base + r->e->off[r->s_block])));
    if (--r->s_live == 0) {
        /* the burst is over: its block's memory may serve later blocks */
        atomic_store_explicit(&r->state[r->s_block], ST_RELEASED, memory_order_release);
        burst_end(r);
    }
    pthread_mutex_unlock(&r->tlock);
    run_unref(r);
}

static ndm_status sx_record_stream(ndm__xblock *x, uintptr_t stream)
{
    run_t *r = (run_t *)((char *)x - offsetof(run_t, sx));
    /* The arena waits for that stream; the region serves no more scratch. */
    ndm_status st = ndm__alloc_record_stream(r->dev, r->arena.cookie, stream);
    if (st == NDM_OK)
        atomic_store_explicit(&r->streamed, true, memory_order_relaxed);
    return st;
}

static uint32_t sx_stream_uses(ndm__xblock *x)
{
    run_t *r = (run_t *)((char *)x - offsetof(run_t, sx));
    return atomic_load_explicit(&r->streamed, memory_order_relaxed) ? 1 : 0;
}

static const ndm__xblock_fns sx_fns = {sx_free, sx_record_stream, sx_stream_uses};

/* A scratch block of a recorded step: the allocator's, measured. */
typedef struct trans_blk {
    held_blk h;
    uint64_t t0;
    size_t voff; /* its place in the burst, as the replay will stack it */
} trans_blk;

static void trans_free(ndm__xblock *x, void *ptr)
{
    trans_blk *b = (trans_blk *)x;
    run_t *r = b->h.run;
    blk_life l = {b->h.nbytes, b->t0, atomic_fetch_add_explicit(&r->clock, 1, memory_order_relaxed)};
    pthread_mutex_lock(&r->tlock);
    burst_pop(r, b->voff);
    if (--r->s_live == 0) {
        if (r->s_gap < r->ngaps) {
            gap_rec *g = &r->gaps[r->s_gap];
            if (!g->t1 || g->t0 > r->s_t0)
                g->t0 = r->s_t0;
            g->t1 = l.t1 + 1;
        }
        burst_end(r);
    }
    if (r->ntl == r->captl) {
        size_t cap = r->captl ? r->captl * 2 : 64;
        blk_life *g = realloc(r->tl, sizeof *g * cap);
        if (g) {
            r->tl = g;
            r->captl = cap;
        }
    }
    if (r->ntl < r->captl)
        r->tl[r->ntl++] = l;
    pthread_mutex_unlock(&r->tlock);
    ndm__free(b->h.dev, &b->h.real);
    free(b);
    run_unref(r);
}

static const ndm__xblock_fns trans_fns = {trans_free, held_record_stream, held_stream_uses};

static ndm_status record_scratch(run_t *r, ndm_device dev, size_t nbytes,
                                 const ndm__alloc_tag *tag, ndm__block *out)
{
    trans_blk *b = malloc(sizeof *b);
    if (!b)
        return ndm__alloc(dev, nbytes, tag, out);
    ndm_status st = held_take(r, &b->h, &trans_fns, dev, nbytes, tag, out);
    if (st < 0) {
        free(b);
        return st;
    }
    size_t asz = (nbytes + ALIGN - 1) & ~(ALIGN - 1);
    pthread_mutex_lock(&r->tlock);
    b->t0 = atomic_fetch_add_explicit(&r->clock, 1, memory_order_relaxed);
    if (r->s_live++ == 0) {
        r->s_gap = atomic_load_explicit(&r->nrec_pub, memory_order_relaxed);
        r->s_t0 = b->t0;
        if (r->s_gap >= r->ngaps) {
            uint32_t ng = r->s_gap + 1;
            gap_rec *g = realloc(r->gaps, sizeof *g * ng);
            if (g) {
                memset(g + r->ngaps, 0, sizeof *g * (ng - r->ngaps));
                r->gaps = g;
                r->ngaps = ng;
            }
        }
    }
    b->voff = burst_push(r, asz);
    if (r->s_gap < r->ngaps && r->gaps[r->s_gap].high < r->s_top)
        r->gaps[r->s_gap].high = r->s_top;
    pthread_mutex_unlock(&r->tlock);
    held_out(&b->h, out);
    return NDM_OK;
}

static ndm_status record(run_t *r, ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag,
                         ndm__block *out)
{
    if (r->nrec == r->caprec) {
        uint32_t cap = r->caprec ? r->caprec * 2 : 64;
        rec_blk **g = cap <= REC_MAX ? realloc(r->recs, sizeof *g * cap) : NULL;
        if (!g)
            return ndm__alloc(dev, nbytes, tag, out);
        r->recs = g;
        r->caprec = cap;
    }
    rec_blk *b = malloc(sizeof *b);
    if (!b)
        return ndm__alloc(dev, nbytes, tag, out);
    ndm_status st = held_take(r, &b->h, &rec_fns, dev, nbytes, tag, out);
    if (st < 0) {
        free(b);
        return st;
    }
    b->t_alloc = atomic_fetch_add_explicit(&r->clock, 1, memory_order_relaxed);
    atomic_init(&b->t_free, 0);
    r->recs[r->nrec++] = b;
    atomic_store_explicit(&r->nrec_pub, r->nrec, memory_order_relaxed);
    held_out(&b->h, out);
    return NDM_OK; /* (the block's reference is the one held_take took) */
}

/* Scratch from the block of the gap where its burst began, stacked; false
 * when there is none, it is full, or it is not free yet. */
static bool serve_scratch(run_t *r, size_t nbytes, ndm__block *out)
{
    const entry *e = r->e;
    size_t asz = (nbytes + ALIGN - 1) & ~(ALIGN - 1);
    bool ok = false;
    pthread_mutex_lock(&r->tlock);
    if (atomic_load_explicit(&r->streamed, memory_order_relaxed))
        goto done;
    if (r->s_live == 0) {
        uint32_t c = atomic_load_explicit(&r->cursor, memory_order_relaxed);
        uint32_t s = c <= e->n ? e->slot[c] : UINT32_MAX;
        if (s == UINT32_MAX)
            goto done;
        if (asz > e->size[s]) {
            if (r->need && r->need[s] < asz)
                r->need[s] = asz;
            r->short_scratch = true;
            goto done;
        }
        for (uint32_t q = e->kstart[s]; q < e->kstart[s + 1]; q++)
            if (atomic_load_explicit(&r->state[e->klist[q]], memory_order_acquire) != ST_RELEASED)
                goto done;
        r->s_block = s;
        burst_end(r);
        atomic_store_explicit(&r->state[s], ST_LIVE, memory_order_relaxed);
    } else if (asz > e->size[r->s_block] - r->s_top) {
        if (r->need && r->need[r->s_block] < r->s_top + asz)
            r->need[r->s_block] = r->s_top + asz;
        r->short_scratch = true;
        goto done;
    }
    r->s_live++;
    out->ptr = r->base + e->off[r->s_block] + burst_push(r, asz);
    out->cookie = ndm__xblock_cookie(&r->sx);
    out->size = nbytes;
    ok = true;
done:
    pthread_mutex_unlock(&r->tlock);
    if (ok) {
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->shits, 1, memory_order_relaxed);
    }
    return ok;
}

ndm_status ndm__plan_alloc(run_t *r, ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag,
                           ndm__block *out)
{
    ndm__thread *th = ndm__tls;
    bool mine = th && th->id == r->tid && same_dev(dev, r->dev);
    if (tag && tag->transient && same_dev(dev, r->dev)) {
        if (!r->replay)
            return record_scratch(r, dev, nbytes, tag, out);
        if (r->base && serve_scratch(r, nbytes, out))
            return NDM_OK;
        goto fallback;
    }
    if (!r->replay) {
        if (mine)
            return record(r, dev, nbytes, tag, out);
        return ndm__alloc(dev, nbytes, tag, out);
    }
    if (NDM__LIKELY(mine && r->base)) {
        const entry *e = r->e;
        uint32_t c = atomic_load_explicit(&r->cursor, memory_order_relaxed);
        uint32_t end = c + LOOKAHEAD < e->n ? c + LOOKAHEAD : e->n;
        for (uint32_t k = c; k < end; k++) {
            if (e->nbytes[k] != nbytes)
                continue;
            uint32_t i = e->pidx[k];
            for (uint32_t q = e->kstart[i]; q < e->kstart[i + 1]; q++)
                if (atomic_load_explicit(&r->state[e->klist[q]], memory_order_acquire) !=
                    ST_RELEASED)
                    goto fallback;
            atomic_store_explicit(&r->cursor, k + 1, memory_order_relaxed);
            atomic_store_explicit(&r->state[i], ST_LIVE, memory_order_relaxed);
            atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
            atomic_store_explicit(&r->hits, atomic_load_explicit(&r->hits, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            out->ptr = r->base + e->off[i];
            out->cookie = ndm__xblock_cookie(&r->subs[k].x);
            out->size = nbytes;
            return NDM_OK;
        }
    }
fallback:
    if (atomic_load_explicit(&r->capturing, memory_order_relaxed)) {
        *out = (ndm__block){NULL, NULL, 0};
        return ndm__alloc_fail(tag, NDM_E_UNSUPPORTED,
                               "%zu bytes cannot be captured: the plan's arena does not serve "
                               "them (the step differs from the recorded one here)",
                               nbytes);
    }
    atomic_fetch_add_explicit(&r->fallbacks, 1, memory_order_relaxed);
    return ndm__alloc(dev, nbytes, tag, out);
}

/* ---- capture into device graphs ----------------------------------------------------- */

static run_t *run_of(ndm_manager step)
{
    ndm__manager *m = ndm__manager_peek(step);
    return m ? atomic_load_explicit(&m->plan_run, memory_order_acquire) : NULL;
}

ndm_status ndm__plan_capture(ndm_manager step, bool on, size_t *arena_bytes)
{
    run_t *r = run_of(step);
    if (!r)
        return NDM_E_INVALID;
    if (on && (!r->replay || !r->base))
        return NDM_E_INVALID;
    atomic_store_explicit(&r->capturing, on, memory_order_relaxed);
    if (arena_bytes)
        *arena_bytes = r->arena.size;
    return NDM_OK;
}

int ndm__plan_cached(ndm_plan h, uint64_t signature, ndm_device dev, const char *api,
                     ndm__site site)
{
    ndm__plan *p = plan_get(h, api, site);
    if (!p)
        return ndm_last_status();
    bool have = false;
    pthread_mutex_lock(&p->lock);
    for (entry *e = p->entries; e && !have; e = e->next)
        have = e->sig == signature && same_dev(e->dev, dev);
    pthread_mutex_unlock(&p->lock);
    plan_unref(p);
    return have;
}

ndm_status ndm__plan_arena_record_stream(ndm_manager step, uintptr_t stream)
{
    run_t *r = run_of(step);
    if (!r || !r->arena.cookie || !stream)
        return NDM_OK;
    ndm_status st = ndm__alloc_record_stream(r->dev, r->arena.cookie, stream);
    if (st == NDM_OK)
        atomic_store_explicit(&r->streamed, true, memory_order_relaxed);
    return st;
}

/* ---- the public API ------------------------------------------------------------------ */

static void plan_shut(ndm__plan *p)
{
    pthread_mutex_lock(&handles_lock);
    if (handles[p->slot] == p)
        handles[p->slot] = NULL;
    pthread_mutex_unlock(&handles_lock);
    ndm__block spares[MAX_PLANS];
    ndm_device devs[MAX_PLANS];
    int ns = 0;
    pthread_mutex_lock(&p->lock);
    p->closed = true;
    while (p->entries) {
        entry *e = p->entries;
        p->entries = e->next;
        devs[ns] = e->dev;
        entry_unlist(p, e, &spares[ns]);
        ns++;
    }
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < ns; i++)
        arena_free(p, devs[i], &spares[i]);
}

/* The owner's close. */
static void owner_closed(void *ptr)
{
    ndm__plan *p = ptr;
    bool was;
    pthread_mutex_lock(&p->lock);
    was = p->closed;
    pthread_mutex_unlock(&p->lock);
    if (!was) {
        plan_shut(p);
        plan_unref(p); /* the handle's */
    }
    plan_unref(p); /* the hook's */
}

NDM_API ndm_plan ndm_plan_new_at(NDM_SITE_PARAMS, ndm_manager owner, int max_plans)
{
    ndm__init();
    ndm__site site = NDM__SITE;
    ndm__manager *m = ndm__manager_get(owner, __func__, site);
    if (!m)
        return NDM_NULL_PLAN;
    if (max_plans < 1 || max_plans > MAX_PLANS) {
        ndm__fail(NDM_E_INVALID, __func__, site, "max_plans is %d, not 1..%d", max_plans,
                  MAX_PLANS);
        return NDM_NULL_PLAN;
    }
    ndm__plan *p = ndm__calloc(1, sizeof *p, NDM__INJ_OBJECT);
    if (!p) {
        ndm__fail(NDM_E_OOM, __func__, site, "no memory for a plan cache");
        return NDM_NULL_PLAN;
    }
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->refs, 2);
    p->max_plans = max_plans;
    p->owner = m->self;
    pthread_mutex_lock(&handles_lock);
    uint32_t slot = 0;
    for (uint32_t i = 1; i < MAX_HANDLES && !slot; i++)
        if (!handles[i] && handle_gen[i] < UINT32_MAX)
            slot = i;
    if (slot) {
        handles[slot] = p;
        p->slot = slot;
        p->gen = ++handle_gen[slot];
    }
    pthread_mutex_unlock(&handles_lock);
    if (!slot) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        ndm__fail(NDM_E_OOM, __func__, site, "%d plan caches are open already",
                  MAX_HANDLES - 1);
        return NDM_NULL_PLAN;
    }
    if (ndm__manager_own_as(owner, p, owner_closed, "plan", __func__, site) < 0) {
        plan_shut(p);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NDM_NULL_PLAN;
    }
    return (ndm_plan){(uint64_t)p->gen << 32 | slot};
}

NDM_API ndm_status ndm_plan_close_at(NDM_SITE_PARAMS, ndm_plan h)
{
    ndm__site site = NDM__SITE;
    if (!h.id)
        return ndm__fail(NDM_E_NULL, __func__, site, "null plan handle");
    uint32_t slot = (uint32_t)h.id, gen = (uint32_t)(h.id >> 32);
    if (!slot || slot >= MAX_HANDLES || !gen)
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "not a plan handle (id 0x%016" PRIx64 ")", h.id);
    pthread_mutex_lock(&handles_lock);
    ndm__plan *p = handle_gen[slot] == gen ? handles[slot] : NULL;
    bool issued = gen <= handle_gen[slot];
    if (p)
        handles[slot] = NULL; /* (this close, not the owner's, drops the handle's reference) */
    pthread_mutex_unlock(&handles_lock);
    if (!p) {
        if (issued)
            return NDM_ALREADY;
        return ndm__fail(NDM_E_INVALID, __func__, site,
                         "not a plan handle (id 0x%016" PRIx64 ")", h.id);
    }
    plan_shut(p);
    plan_unref(p);
    return NDM_OK;
}

NDM_API ndm_manager ndm_manager_new_planned_at(NDM_SITE_PARAMS, ndm_manager parent,
                                               const char *name, ndm_plan plan,
                                               uint64_t signature)
{
    ndm__init();
    ndm__site site = NDM__SITE;
    ndm__manager *pm = ndm__manager_get(parent, __func__, site);
    if (!pm)
        return NDM_NULL_MANAGER;
    ndm__plan *p = plan_get(plan, __func__, site);
    if (!p)
        return NDM_NULL_MANAGER;
    ndm_device dev = ndm__manager_device_of(pm);
    run_t *r = ndm__calloc(1, sizeof *r, NDM__INJ_OBJECT);
    if (!r) {
        plan_unref(p);
        ndm__fail(NDM_E_OOM, __func__, site, "no memory for a planned step");
        return NDM_NULL_MANAGER;
    }
    ndm_manager h = ndm__manager_new_ex(site, __func__, parent, name, dev, 0);
    if (!h.id) {
        free(r);
        plan_unref(p);
        return NDM_NULL_MANAGER;
    }
    ndm__thread *th = ndm__thread_get();
    r->plan = p;
    r->sig = signature;
    r->dev = dev;
    r->tid = th ? th->id : 0;
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->tlock, NULL);
    pthread_mutex_lock(&p->lock);
    entry *e = NULL, **pp = &p->entries;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->sig == signature && same_dev((*pp)->dev, dev)) {
            e = *pp;
            *pp = e->next; /* to the front: most recently used */
            e->next = p->entries;
            p->entries = e;
            break;
        }
    bool closed = p->closed;
    if (e && !closed) {
        e->runs++;
        p->replayed++;
        r->arena = e->spare;
        e->spare = (ndm__block){NULL, NULL, 0};
    }
    pthread_mutex_unlock(&p->lock);
    if (closed) {
        /* (closed since the lookup) */
        pthread_mutex_destroy(&r->tlock);
        free(r);
        plan_unref(p);
        ndm_status cst = ndm_manager_close_at(site.file, site.line, site.func, h);
        (void)cst;
        ndm__fail(NDM_E_CLOSED, __func__, site, "the plan was closed");
        return NDM_NULL_MANAGER;
    }
    if (e) {
        r->replay = true;
        r->e = e;
        r->subs = malloc(sizeof *r->subs * (e->n ? e->n : 1));
        r->state = calloc(e->nb ? e->nb : 1, 1);
        r->need = calloc(e->nb ? e->nb : 1, sizeof *r->need);
        if (r->subs && r->state && !r->arena.cookie && e->arena_bytes) {
            ndm__alloc_tag tag = {p->owner, site.file, site.func, site.line, NULL, false};
            ndm__quiet_state q;
            ndm__quiet_begin(&q);
            ndm_status ast = ndm__alloc(dev, e->arena_bytes, &tag, &r->arena);
            ndm__quiet_end(&q);
            if (ast == NDM_OK) {
                atomic_fetch_add_explicit(&p->arena_bytes, (int64_t)r->arena.size,
                                          memory_order_relaxed);
                pthread_mutex_lock(&p->lock);
                p->arena_allocs++;
                pthread_mutex_unlock(&p->lock);
            } /* (else no arena: the step runs on the caching allocator, counted) */
        }
        if (r->subs && r->state && r->arena.cookie) {
            r->base = r->arena.ptr;
            r->sx.fns = &sx_fns;
            for (uint32_t k = 0; k < e->n; k++)
                r->subs[k] = (sub_blk){{&sub_fns}, r, e->pidx[k]};
        }
    }
    ndm__manager *m = ndm__manager_peek(h);
    atomic_store_explicit(&m->plan_run, r, memory_order_release);
    return h;
}

NDM_API ndm_status ndm_plan_get_stats_at(NDM_SITE_PARAMS, ndm_plan h, ndm_plan_stats *out)
{
    ndm__site site = NDM__SITE;
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, site, "out is NULL");
    ndm__plan *p = plan_get(h, __func__, site);
    if (!p)
        return ndm_last_status();
    pthread_mutex_lock(&p->lock);
    *out = (ndm_plan_stats){
        .plans = p->nentries,
        .recorded = p->recorded,
        .replayed = p->replayed,
        .evicted = p->evicted,
        .hits = atomic_load(&p->hits),
        .fallbacks = atomic_load(&p->fallbacks),
        .arena_bytes = atomic_load(&p->arena_bytes),
        .arena_allocs = p->arena_allocs,
        .replanned = p->replanned,
    };
    pthread_mutex_unlock(&p->lock);
    plan_unref(p);
    return NDM_OK;
}

NDM_API ndm_status ndm_plan_get_entry_at(NDM_SITE_PARAMS, ndm_plan h, uint64_t signature,
                                         ndm_plan_entry *out)
{
    ndm__site site = NDM__SITE;
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, site, "out is NULL");
    *out = (ndm_plan_entry){0};
    ndm__plan *p = plan_get(h, __func__, site);
    if (!p)
        return ndm_last_status();
    ndm_status st = NDM_ALREADY;
    pthread_mutex_lock(&p->lock);
    for (entry *e = p->entries; e; e = e->next)
        if (e->sig == signature) {
            *out = (ndm_plan_entry){(int64_t)e->n, (int64_t)e->arena_bytes,
                                    (int64_t)e->max_live, (int64_t)e->total};
            st = NDM_OK;
            break;
        }
    pthread_mutex_unlock(&p->lock);
    plan_unref(p);
    return st;
}
