/* Private to the allocator: the caching pool engine over one segment source,
 * its settings, thread caches, history and the simulated device used by tests. */
#ifndef NDM_ALLOC_POOL_H
#define NDM_ALLOC_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "alloc.h"
#include "ndm/memory.h"

/* PyTorch's constants, in bytes. */
#define NDM__MIN_BLOCK ((size_t)512)
#define NDM__SMALL_SIZE ((size_t)1 << 20)     /* largest small request */
#define NDM__SMALL_BUFFER ((size_t)2 << 20)   /* small-pool segment */
#define NDM__MIN_LARGE_ALLOC ((size_t)10 << 20)
#define NDM__ROUND_LARGE ((size_t)2 << 20)
#define NDM__MB ((size_t)1 << 20)
#define NDM__DIV_INTERVALS 16                 /* 1 MiB .. 64 GiB */

/* ---- settings --------------------------------------------------------------- */

struct ndm__pool_policy;

typedef struct ndm__settings {
    const struct ndm__pool_policy *policy; /* the `strategy` key */
    double preallocate_fraction;
    size_t memory_limit;          /* 0: none */
    size_t max_split_size;        /* SIZE_MAX: unlimited */
    size_t max_non_split_rounding;
    size_t large_segment_size;
    unsigned divisions[NDM__DIV_INTERVALS];
    double gc_threshold;          /* 0: off */
    size_t pressure_every;        /* 0: off */
    bool thread_cache;
    bool release_free_segments;   /* unmap whole free segments before mapping one */
    bool segment_refit;           /* a whole free segment twice the request: remapped */
    size_t segment_round;         /* large-pool segments are rounded up to this */
    bool expandable;              /* expandable_segments: grow one segment in place */
    /* R torch's reclaim rates: which level a pressure event asks for */
    double reserved_rate, allocated_rate, allocated_reserved_rate;
} ndm__settings;

/* The defaults of device `dev`: PyTorch's policy, with the compact policy's
 * segment rules on the CPU (see include/ndm/memory.h). */
void ndm__settings_default(ndm__settings *s, ndm_device dev);
/* Parse `conf` onto the defaults for device `dev`. NDM_E_CONFIG with the
 * reason in err (naming the key) on failure; *out is untouched then. */
ndm_status ndm__settings_parse(const char *conf, ndm_device dev, ndm__settings *out, char *err,
                               size_t n);
/* "strategy:auto_growth,max_split_size_mb:..." (like snprintf). */
int ndm__settings_str(const ndm__settings *s, char *buf, size_t n);
/* roundup_power2_divisions as the grammar writes it (like snprintf). */
int ndm__divisions_str(const unsigned *d, char *buf, size_t n);

/* ---- blocks and segments ---------------------------------------------------- */

enum { NDM__POOL_SMALL = 0, NDM__POOL_LARGE = 1 };
/* PENDING: freed by its owner, not reusable until the events recorded on the
 * other streams that used it are complete (still active in the figures). */
enum { NDM__B_FREE = 0, NDM__B_ALLOCATED = 1, NDM__B_CACHED = 2, NDM__B_PENDING = 3 };

/* One frame of a recorded stack, as PyTorch's snapshots name it: the
 * function, and the file and line inside it. */
typedef struct ndm__frame {
    const char *name, *file;
    int line;
} ndm__frame;

/* A refcounted string (manager paths kept by history entries and blocks);
 * while history is recorded it also holds the allocation's frames,
 * innermost first, in the same allocation. */
typedef struct ndm__rstr {
    atomic_uint refs;
    unsigned nframes;
    const ndm__frame *frames;
    char s[];
} ndm__rstr;
ndm__rstr *ndm__rstr_new(const char *s);
ndm__rstr *ndm__rstr_ref(ndm__rstr *r);
void ndm__rstr_unref(ndm__rstr *r);

struct ndm__aseg;

/* The first cache line holds what a thread cache's fast paths touch. */
typedef struct ndm__ablk {
    uintptr_t addr;
    size_t size;
    size_t requested;
    struct ndm__ablk *link;          /* thread cache bin, record free list */
    const char *file, *func;         /* creation site */
    int line;
    _Atomic uint32_t mgr;            /* manager slot that owns the array (0: none) */
    uint8_t pool;
    _Atomic uint8_t state;           /* NDM__B_*; read by merges while a cache owns it */
    bool whole;                      /* spans its segment (set when allocated) */
    struct ndm__aseg *seg;
    struct ndm__ablk *prev, *next;   /* address neighbours in the segment */
    struct ndm__ablk *left, *right;  /* free tree */
    uint64_t gc_base;                /* pool's search count when it became free */
    uint32_t prio;
    ndm__rstr *path;                 /* manager path when history recorded the alloc */
    /* the cache holding it, while NDM__B_CACHED (read by others' merges) */
    _Atomic(struct ndm__tcache *) cache;
    uint64_t trace_id;
    /* Streams: the allocation stream (the segment's), the other streams
     * recorded as users while allocated, and the events still pending after
     * its free. Zero everywhere on a pool without streams. */
    uintptr_t stream;
    uintptr_t *uses;
    uint32_t nuses, uses_cap;
    uint32_t events;
} ndm__ablk;

typedef struct ndm__aseg {
    uintptr_t addr;
    size_t size;
    void *base;                      /* as the source returned it */
    struct ndm__aseg *prev, *next;   /* the pool's segments */
    ndm__ablk *head;                 /* first block by address */
    ndm__ablk *tail;                 /* last block by address */
    uint8_t pool;
    bool pinned;                     /* the preallocated arena: never unmapped by the cache */
    bool expandable;                 /* size bytes committed of a reserve of `span` bytes */
    uintptr_t stream;                /* the stream whose requests it serves */
    size_t span;
} ndm__aseg;

/* ---- strategies ----------------------------------------------------------------
 *
 * An allocation strategy is a table (PyTorch's allocator policy functions),
 * chosen once when the pool is configured (the `strategy` key) and asked by
 * the pool's slow path, under its lock. The settings are those in force. A
 * new strategy is one more instance in pool.c and its entry in
 * ndm__pool_policies (the parser and the printed settings find it there). */
typedef struct ndm__pool_policy {
    const char *name; /* the `strategy` value */
    /* the pool (NDM__POOL_SMALL or _LARGE) of a request of `size` (rounded) */
    int (*pool_for)(const ndm__settings *s, size_t size);
    /* the bytes of the segment mapped for a request of `size` */
    size_t (*segment_size)(const ndm__settings *s, size_t size);
    /* is free block b, chosen for a request of `size`, split (its rest kept
     * as a free block)? */
    bool (*should_split)(const ndm__settings *s, const ndm__ablk *b, size_t size);
    /* may block b of `pool`, the best fit for a request of `size`, serve it?
     * NULL: free blocks are never reused (each request maps its own). */
    bool (*accept_free_block)(const ndm__settings *s, int pool, const ndm__ablk *b, size_t size);
    bool arena;           /* one pinned segment of preallocate_fraction, mapped first */
    bool release_on_free; /* a freed block that spans its segment is unmapped at once */
    bool grows_in_place;  /* expandable_segments applies */
    bool thread_cache;    /* thread caches may hold its blocks */
} ndm__pool_policy;

/* Every strategy, NULL-terminated; the first is the default. */
extern const ndm__pool_policy *const ndm__pool_policies[];

/* Segment presets (the `policy` key): the segment rules of a named policy,
 * applied over the settings in force. */
typedef struct ndm__segment_preset {
    const char *name;
    size_t large_segment_size;
    size_t segment_round;
    bool release_free_segments;
    bool segment_refit;
} ndm__segment_preset;

/* ---- the pool -------------------------------------------------------------------- */

/* Grant kinds: how far a thread cache may move the figures it touches without
 * taking the pool lock. N/B/R bound the net allocations (count, bytes,
 * requested bytes) since its last fold; FN/FB bound its net frees (they raise
 * inactive_split); CUM bounds bytes allocated (pressure_every_mb). */
enum { NDM__G_N, NDM__G_B, NDM__G_R, NDM__G_FN, NDM__G_FB, NDM__G_KINDS };

/* AddressSanitizer builds poison the bytes the caching allocator holds for
 * itself (free and cached blocks, the slack between a request and its
 * rounded size), so overruns and uses after free inside a segment are caught,
 * not only at the segment's edges. Only pools of host memory that hand
 * blocks out through ndm__alloc do it (p->poison); a block is unpoisoned up
 * to its requested size when handed out, and a segment before it is unmapped. */
#if defined(__SANITIZE_ADDRESS__)
#define NDM__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NDM__ASAN 1
#endif
#endif
#ifndef NDM__ASAN
#define NDM__ASAN 0
#endif
#if NDM__ASAN
#include <sanitizer/asan_interface.h>
#define ndm__poison(addr, n) ASAN_POISON_MEMORY_REGION((void *)(addr), (n))
#define ndm__unpoison(addr, n) ASAN_UNPOISON_MEMORY_REGION((void *)(addr), (n))
#else
#define ndm__poison(addr, n) ((void)(addr), (void)(n))
#define ndm__unpoison(addr, n) ((void)(addr), (void)(n))
#endif

struct ndm__tcache;
struct ndm__history;

typedef struct ndm__pool {
    pthread_mutex_t lock;
    const ndm__segment_source *src;
    ndm_device device;
    bool real_device;              /* reports managers on OOM */
    bool poison;                   /* host memory under ASan: what is free is poisoned */
    char name[24];
    int slot;                      /* thread-cache slot, -1: none */
    uint32_t gen;
    ndm__settings set;
    char conf[512];                /* the string the settings came from */
    /* set.divisions for the unlocked path: configure may change it while
     * other threads allocate */
    _Atomic unsigned divisions[NDM__DIV_INTERVALS];

    ndm__ablk *tree[2];            /* free blocks by (size, address), per pool */
    uint64_t searches[2];          /* age clock for garbage collection */
    ndm__aseg *segs;
    ndm__aseg *arena;              /* preallocated segment */
    bool arena_tried;
    ndm__ablk *spare;              /* unused block records */
    void **chunks;                 /* record chunks, to free them */
    size_t nchunks, chunks_cap;
    uint32_t prio_seed;
    size_t reserved;

    ndm_memory_stats st;           /* the shared part; thread caches add theirs */
    int64_t cum_alloc;             /* bytes allocated (for pressure_every_mb) */
    int64_t next_pressure;

    /* thread caches (tcache.c) */
    struct ndm__tcache *caches;
    int64_t granted[NDM__G_KINDS]; /* sums over the caches of their grants */
    int64_t granted_cum;
    uint64_t grants;               /* grants made: the clock of idleness */
    bool tc_allowed;               /* settings and instrumentation allow caches */

    /* instrumentation (history.c) */
    struct ndm__history *hist;
    ndm__rstr *hist_cause;         /* the allocation being served, for segment events */
    uint64_t next_trace_id;

    /* streams: the source has events; frees waiting on them, oldest first */
    bool streamed;
    bool can_expand;               /* the source reserves and commits */
    struct ndm__pending *pending;
    size_t npending, pending_cap;
} ndm__pool;

typedef struct ndm__pending {
    void *event;                   /* NULL: recording failed, wait for a full sync */
    ndm__ablk *b;
    uintptr_t stream;
} ndm__pending;

/* Lifecycle. The source must outlive the pool. `device` is what messages and
 * snapshots name; real_device: OOM messages list managers. */
ndm__pool *ndm__pool_new(const ndm__segment_source *src, ndm_device device, const char *name,
                         bool real_device);
/* Destroy: every block must be free. Segments are unmapped. */
void ndm__pool_destroy(ndm__pool *p);
/* Apply settings: the cache is emptied first. */
ndm_status ndm__pool_configure(ndm__pool *p, const ndm__settings *s, const char *conf);
void ndm__pool_settings(ndm__pool *p, ndm__settings *out, char *conf, size_t n);
/* Instrumentation started or stopped: caches follow (lock held). */
void ndm__pool_refresh(ndm__pool *p);

ndm_status ndm__pool_alloc(ndm__pool *p, size_t nbytes, const ndm__alloc_tag *tag,
                           ndm__block *out);
/* The same for work queued on `stream` (0: the default stream); on a pool
 * without streams the stream is ignored. */
ndm_status ndm__pool_alloc_on(ndm__pool *p, size_t nbytes, uintptr_t stream,
                              const ndm__alloc_tag *tag, ndm__block *out);
/* Block `cookie`, allocated, is used by work on `stream` too: its free will
 * wait for that work (PyTorch's record_stream). NDM_E_OOM when the record
 * cannot grow; a no-op on a pool without streams or for its own stream. */
ndm_status ndm__pool_record_stream(ndm__pool *p, void *cookie, uintptr_t stream);
/* How many streams besides its own block `cookie` (allocated, and kept so
 * by the caller) was recorded on: the streams whose work its free will
 * wait for. No lock is taken: a caller holding other locks may ask. */
uint32_t ndm__pool_stream_uses(void *cookie);
/* Frees still waiting on events (for tests and summaries). */
size_t ndm__pool_pending(ndm__pool *p);
void ndm__pool_free(ndm__pool *p, ndm__block *blk);

void ndm__pool_stats(ndm__pool *p, ndm_memory_stats *out);
void ndm__pool_reset_peaks(ndm__pool *p);
void ndm__pool_reset_accumulated(ndm__pool *p);
void ndm__pool_empty_cache(ndm__pool *p);
void ndm__pool_summary(ndm__pool *p, FILE *f);
/* One figure by PyTorch's flattened key; false for an unknown key. */
bool ndm__stats_key(const ndm_memory_stats *st, const char *key, int64_t *out);

/* A copy of the layout, for snapshots and tests. */
typedef struct ndm__snap_block {
    uintptr_t addr;
    size_t size, requested;
    int state;                     /* NDM__B_* (cached blocks are free to the user) */
    uintptr_t stream;
    uint32_t mgr;
    const char *file, *func;
    int line;
    ndm__rstr *path;               /* referenced; NULL when not recorded */
} ndm__snap_block;

typedef struct ndm__snap_seg {
    uintptr_t addr;
    size_t size;
    int pool;
    bool pinned;
    bool expandable;
    uintptr_t stream;
    size_t first, count;           /* into blocks[] */
} ndm__snap_seg;

/* One history event, as copied out of the ring. */
typedef struct ndm__hist_entry {
    uint8_t action;
    uintptr_t addr;
    size_t size;
    int64_t time_us;
    ndm__rstr *ctx;
} ndm__hist_entry;

typedef struct ndm__snapshot {
    ndm__snap_seg *segs;
    size_t nsegs;
    ndm__snap_block *blocks;
    size_t nblocks;
    ndm__hist_entry *trace;        /* the history, copied under the same lock */
    size_t ntrace;
    size_t active;                 /* bytes of allocated blocks */
    ndm__settings set;
    char conf[512];
} ndm__snapshot;

/* Segments sorted by address, and the history and settings at the same
 * moment (one hold of the pool's lock). NDM_E_OOM when the copy cannot be
 * made. */
ndm_status ndm__pool_snapshot(ndm__pool *p, ndm__snapshot *out);
void ndm__snapshot_free(ndm__snapshot *s);

/* ---- internals shared by pool.c, tcache.c, history.c, stats.c ---------------------- */

void ndm__pool_lock(ndm__pool *p);
void ndm__pool_unlock(ndm__pool *p);
/* Core operations under the lock (used by tcache.c to flush bins). */
void ndm__core_free_block(ndm__pool *p, ndm__ablk *b);

/* ---- thread caches (tcache.c) -------------------------------------------------- */

#define NDM__TC_MAX_SIZE NDM__SMALL_SIZE
#define NDM__TC_BINS (NDM__TC_MAX_SIZE / NDM__MIN_BLOCK)
_Static_assert(NDM__TC_MAX_SIZE <= NDM__SMALL_SIZE, "thread caches hold small-pool blocks only");
#define NDM__TC_BIN_MAX 4096u
#define NDM__TC_MAX_BYTES ((int64_t)8 << 20)
#define NDM__MAX_POOL_SLOTS 64

typedef struct ndm__tbin {
    ndm__ablk *head;
    _Atomic uint32_t count;
} ndm__tbin;

typedef struct ndm__tcache {
    /* Written only by the owner thread outside the lock (fast path); read by
     * others under a sequence lock. */
    _Atomic uint64_t seq;          /* odd while the owner is inside a fast operation */
    _Atomic int frozen;            /* set by another thread: the fast path must stop */
    _Atomic int64_t n_alloc, b_alloc, r_alloc, n_free, b_free, r_free;
    int64_t cached_bytes;
    /* Written under the pool lock (by the owner, or by another thread once the
     * owner is frozen); the fast path reads them. */
    int64_t cap[NDM__G_KINDS];
    int64_t cap_cum;
    /* Idleness, as other caches' grants see it (under the pool lock): seq
     * as last seen, and the pool's grant count then. */
    uint64_t seen_seq, seen_at;
    ndm__pool *pool;
    struct ndm__tcache *next, *prev; /* the pool's caches */
    pthread_t owner;
    ndm__tbin bins[NDM__TC_BINS];
} ndm__tcache;

typedef struct ndm__tc_slot {
    ndm__tcache *tc;
    uint32_t gen;
} ndm__tc_slot;

/* The calling thread's cache slots (NDM__MAX_POOL_SLOTS entries, made on
 * first use). Initial-exec: one load from the thread pointer on the fast path. */
extern _Thread_local ndm__tc_slot *ndm__tc_tls __attribute__((tls_model("initial-exec")));
extern bool ndm__tc_supported;     /* asymmetric fences available */

static inline ndm__tcache *ndm__tc_mine(const ndm__pool *p)
{
    ndm__tc_slot *s = ndm__tc_tls;
    if (!s || p->slot < 0)
        return NULL;
    ndm__tc_slot *e = &s[p->slot];
    return e->gen == p->gen ? e->tc : NULL;
}

int ndm__tc_slot_acquire(uint32_t *gen);
void ndm__tc_slot_release(int slot);
/* The calling thread's cache for p, made on first use (lock held). */
ndm__tcache *ndm__tc_get_locked(ndm__pool *p);
/* Fold the owner's counters into the pool stats and clear its grants (lock
 * held; the cache is the caller's or frozen). */
void ndm__tc_fold(ndm__pool *p, ndm__tcache *tc);
/* Return every cached block of tc to the pool (lock held, tc folded). */
void ndm__tc_flush(ndm__pool *p, ndm__tcache *tc);
/* Whether a cache (the caller's included) holds a grant or unfolded counts
 * (lock held). */
bool ndm__tc_dirty(ndm__pool *p);
/* If merging some of tc's cached blocks with their free neighbours makes a
 * free block of at least `size` bytes, return those blocks to the pool and
 * say so (lock held, tc folded). */
bool ndm__tc_flush_mergeable(ndm__pool *p, ndm__tcache *tc, size_t size);
/* Stop every other thread's cache and fold all (lock held). */
void ndm__tc_freeze_all(ndm__pool *p, bool flush);
/* After a slow operation of the calling thread: grant its cache a share of
 * the headroom (lock held). */
void ndm__tc_grant(ndm__pool *p, ndm__tcache *tc);
/* Figures of the caches that are not folded yet, added into *st (lock held). */
void ndm__tc_add_unfolded(ndm__pool *p, ndm_memory_stats *st, int64_t *largest_cached);
/* Drop every cache of p (destroy; lock held). */
void ndm__tc_drop_all(ndm__pool *p);

static inline size_t ndm__tc_index(size_t size) { return size / NDM__MIN_BLOCK - 1; }

/* Fast paths: true when the thread cache served the request. Nothing of the
 * cache is read before the frozen flag, which a freezer may set at any time.
 * The sequence is odd during an operation; the counters are stored with
 * release order after it, so a reader that sees a new counter also sees the
 * odd sequence and reads again. */
static inline bool ndm__tc_enter(ndm__tcache *tc, uint64_t *seq)
{
    *seq = atomic_load_explicit(&tc->seq, memory_order_relaxed);
    atomic_store_explicit(&tc->seq, *seq + 1, memory_order_relaxed);
    /* The other side is a membarrier(): a compiler barrier suffices here. */
    atomic_signal_fence(memory_order_seq_cst);
    return !atomic_load_explicit(&tc->frozen, memory_order_relaxed);
}

static inline void ndm__tc_leave(ndm__tcache *tc, uint64_t seq)
{
    atomic_store_explicit(&tc->seq, seq + 2, memory_order_release);
}

static inline bool ndm__tc_try_alloc(ndm__pool *p, size_t size, size_t req,
                                     const ndm__alloc_tag *tag, ndm__block *out)
{
    ndm__tcache *tc = ndm__tc_mine(p);
    if (!tc)
        return false;
    uint64_t seq;
    if (!ndm__tc_enter(tc, &seq))
        goto refuse;
    ndm__tbin *bin = &tc->bins[ndm__tc_index(size)];
    ndm__ablk *b = bin->head;
    if (!b)
        goto refuse;
    /* Each grant test, then its counter: few values live at once. */
    int64_t na = atomic_load_explicit(&tc->n_alloc, memory_order_relaxed) + 1;
    if (na - atomic_load_explicit(&tc->n_free, memory_order_relaxed) > tc->cap[NDM__G_N])
        goto refuse;
    int64_t ba = atomic_load_explicit(&tc->b_alloc, memory_order_relaxed) + (int64_t)size;
    if (ba - atomic_load_explicit(&tc->b_free, memory_order_relaxed) > tc->cap[NDM__G_B] ||
        ba > tc->cap_cum)
        goto refuse;
    int64_t ra = atomic_load_explicit(&tc->r_alloc, memory_order_relaxed) + (int64_t)req;
    if (ra - atomic_load_explicit(&tc->r_free, memory_order_relaxed) > tc->cap[NDM__G_R])
        goto refuse;
    atomic_store_explicit(&tc->n_alloc, na, memory_order_release);
    atomic_store_explicit(&tc->b_alloc, ba, memory_order_release);
    atomic_store_explicit(&tc->r_alloc, ra, memory_order_release);
    bin->head = b->link;
    if (b->link)
        __builtin_prefetch(b->link, 1, 3);
    atomic_store_explicit(&bin->count, atomic_load_explicit(&bin->count, memory_order_relaxed) - 1,
                          memory_order_release);
    tc->cached_bytes -= (int64_t)size;
    b->requested = req;
    if (tag) {
        b->file = tag->file;
        b->func = tag->func;
        b->line = tag->line;
        atomic_store_explicit(&b->mgr, tag->manager, memory_order_relaxed);
    } else {
        b->file = b->func = NULL;
        b->line = 0;
        atomic_store_explicit(&b->mgr, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&b->state, NDM__B_ALLOCATED, memory_order_relaxed);
    ndm__tc_leave(tc, seq);
    out->ptr = (void *)b->addr;
    out->cookie = b;
    out->size = size;
    return true;
refuse:
    ndm__tc_leave(tc, seq);
    return false;
}

static inline bool ndm__tc_try_free(ndm__pool *p, ndm__ablk *b)
{
    ndm__tcache *tc = ndm__tc_mine(p);
    /* Only pieces of split small segments: a whole segment (left by the
     * system strategy) is not an inactive split block. */
    if (!tc || b->pool != NDM__POOL_SMALL || b->size > NDM__TC_MAX_SIZE || b->whole)
        return false;
    size_t size = b->size;
    uint64_t seq;
    if (!ndm__tc_enter(tc, &seq))
        goto refuse;
    ndm__tbin *bin = &tc->bins[ndm__tc_index(size)];
    if (atomic_load_explicit(&bin->count, memory_order_relaxed) >= NDM__TC_BIN_MAX ||
        tc->cached_bytes + (int64_t)size > NDM__TC_MAX_BYTES)
        goto refuse;
    int64_t nf = atomic_load_explicit(&tc->n_free, memory_order_relaxed) + 1;
    int64_t bf = atomic_load_explicit(&tc->b_free, memory_order_relaxed) + (int64_t)size;
    /* A cached block is an inactive piece of a split segment: the frees may
     * raise inactive_split only as far as the grant allows. */
    if (atomic_load_explicit(&tc->n_alloc, memory_order_relaxed) - nf < -tc->cap[NDM__G_FN] ||
        atomic_load_explicit(&tc->b_alloc, memory_order_relaxed) - bf < -tc->cap[NDM__G_FB])
        goto refuse;
    int64_t rf = atomic_load_explicit(&tc->r_free, memory_order_relaxed) + (int64_t)b->requested;
    atomic_store_explicit(&b->cache, tc, memory_order_relaxed);
    atomic_store_explicit(&b->state, NDM__B_CACHED, memory_order_relaxed);
    b->link = bin->head;
    bin->head = b;
    atomic_store_explicit(&bin->count, atomic_load_explicit(&bin->count, memory_order_relaxed) + 1,
                          memory_order_release);
    tc->cached_bytes += (int64_t)size;
    atomic_store_explicit(&tc->n_free, nf, memory_order_release);
    atomic_store_explicit(&tc->b_free, bf, memory_order_release);
    atomic_store_explicit(&tc->r_free, rf, memory_order_release);
    ndm__tc_leave(tc, seq);
    return true;
refuse:
    ndm__tc_leave(tc, seq);
    return false;
}

/* Cache the blocks of cookies[0..k) as ndm__tc_try_free would, one after
 * another, with the counters stored once; returns k (the first block refused
 * stops it). */
size_t ndm__tc_try_free_many(ndm__pool *p, void *const *cookies, size_t n);

/* ---- rounding and the fast paths, inline for ndm__alloc and ndm__free ---------- */

static inline size_t ndm__round_pow2_division(size_t size, unsigned divisions)
{
    if (!(size & (size - 1)))
        return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll(size));
    size_t step = floor2 >> (31 - __builtin_clz(divisions));
    if (!step)
        return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

/* The size a request of n bytes takes in p: 512-byte granularity, or a
 * power-of-two division (roundup_power2_divisions). */
static inline size_t ndm__pool_round(ndm__pool *p, size_t n)
{
    if (n < NDM__MIN_BLOCK)
        return NDM__MIN_BLOCK;
    int idx = (63 - __builtin_clzll(n)) - 20;
    if (idx < 0)
        idx = 0;
    if (idx > NDM__DIV_INTERVALS - 1)
        idx = NDM__DIV_INTERVALS - 1;
    unsigned d = atomic_load_explicit(&p->divisions[idx], memory_order_relaxed);
    if (d > 1 && n > NDM__MIN_BLOCK * d)
        return ndm__round_pow2_division(n, d);
    return (n + NDM__MIN_BLOCK - 1) / NDM__MIN_BLOCK * NDM__MIN_BLOCK;
}

/* A small request served by the calling thread's cache, without a call;
 * false sends the caller to ndm__pool_alloc. */
static inline bool ndm__pool_alloc_fast(ndm__pool *p, size_t nbytes, const ndm__alloc_tag *tag,
                                        ndm__block *out)
{
    if (nbytes > NDM__TC_MAX_SIZE)
        return false;
    size_t size = ndm__pool_round(p, nbytes);
    return size <= NDM__TC_MAX_SIZE && ndm__tc_try_alloc(p, size, nbytes, tag, out);
}

/* ---- history and traces (history.c) ------------------------------------------- */

enum {
    NDM__EV_ALLOC,
    NDM__EV_FREE_REQUESTED,
    NDM__EV_FREE_COMPLETED,
    NDM__EV_SEGMENT_ALLOC,
    NDM__EV_SEGMENT_FREE,
    NDM__EV_SEGMENT_MAP,
    NDM__EV_SEGMENT_UNMAP,
    NDM__EV_OOM,
    NDM__EV_SNAPSHOT,
};

/* Record an event (lock held; no-op unless recording); ctx: the manager path
 * and frames of the allocation it concerns (NULL: none). */
void ndm__hist_record(ndm__pool *p, int action, uintptr_t addr, size_t size, ndm__rstr *ctx);
/* The context history keeps for an allocation from `tag`: the path of
 * manager slot `manager` (0: none) and the frames from the allocating
 * function out to the caller's site. No lock may be held. NULL without
 * memory (the events then carry none). */
ndm__rstr *ndm__hist_context(uint32_t manager, const ndm__alloc_tag *tag);
/* A copy of the ring (lock held), oldest first, each entry referencing its
 * context; ndm__hist_copy_free releases it. */
ndm_status ndm__hist_copy(ndm__pool *p, ndm__hist_entry **out, size_t *n);
void ndm__hist_copy_free(ndm__hist_entry *e, size_t n);
#define ndm__hist_event(p, ...)                                                         \
    do {                                                                                \
        if (__builtin_expect((p)->hist != NULL, 0))                                     \
            ndm__hist_record((p), __VA_ARGS__);                                         \
    } while (0)
/* Trace lines for replay (lock held; no-op unless tracing). */
void ndm__trace_alloc_record(ndm__pool *p, ndm__ablk *b, size_t nbytes);
void ndm__trace_free_record(ndm__pool *p, ndm__ablk *b);
static inline void ndm__trace_alloc(ndm__pool *p, ndm__ablk *b, size_t nbytes)
{
    b->trace_id = 0;
    if (__builtin_expect(atomic_load_explicit(&ndm__instrumented, memory_order_relaxed) & 2, 0))
        ndm__trace_alloc_record(p, b, nbytes);
}
static inline void ndm__trace_free(ndm__pool *p, ndm__ablk *b)
{
    if (__builtin_expect(b->trace_id != 0, 0))
        ndm__trace_free_record(p, b);
}
bool ndm__hist_recording(void);
void ndm__hist_drop(ndm__pool *p);
/* Begin/end history on one pool (lock held); a ring that cannot be made
 * leaves the pool without history. */
void ndm__hist_enable(ndm__pool *p, size_t max_entries);
/* A ring of max_entries events, or NULL when its size overflows or memory
 * runs out; ndm__hist_bytes says whether the size fits and what it is. */
struct ndm__history *ndm__hist_new(size_t max_entries);
bool ndm__hist_bytes(size_t max_entries, size_t *bytes);
void ndm__hist_free(struct ndm__history *h);
/* Replace the pool's ring by h (made by ndm__hist_new, or NULL to stop);
 * lock held. */
void ndm__hist_install(ndm__pool *p, struct ndm__history *h);
/* Write the snapshot of these pools (no lock held): PyTorch's pickle, or
 * the same tree as JSON. */
ndm_status ndm__snapshot_write(FILE *f, ndm__pool **pools, int n, bool pickle);
/* Start/stop the trace file (NULL stops). */
ndm_status ndm__trace_start(const char *path, char *err, size_t n);
/* Start/stop history: the flag only; pools follow with ndm__hist_enable. */
void ndm__hist_set(bool on, size_t max_entries);
size_t ndm__hist_max(void);

/* ---- pressure and reports (alloc.c) -------------------------------------------- */

/* Run the registered pressure callbacks (no pool lock held). Returns whether any ran. */
bool ndm__pressure_run(ndm__pool *p, ndm_pressure_reason why, size_t request);
/* R torch's decision for figures (allocated, reserved) of a device of
 * `total` bytes (0: unknown, reserved stands in): none, light or full. */
ndm_pressure_level ndm__pressure_level(const ndm__settings *s, int64_t allocated,
                                       int64_t reserved, int64_t total);
/* Managers holding the most bytes on a device, for OOM messages ("" if none). */
void ndm__report_managers(ndm_device dev, char *buf, size_t n);
/* The manager path of slot (for history), or "" (no lock may be held). */
ndm__rstr *ndm__describe_manager(uint32_t slot);

/* ---- the simulated device (source_sim.c) ---------------------------------------- */

/* A segment source with no memory behind it: addresses are arithmetic, so
 * the allocator's policy can be run and measured at any scale. map fails with
 * NDM_E_OOM once `capacity` bytes are mapped (0: unlimited). */
typedef struct ndm__sim ndm__sim;
ndm__sim *ndm__sim_new(size_t capacity);
void ndm__sim_destroy(ndm__sim *s);
const ndm__segment_source *ndm__sim_source(ndm__sim *s);
size_t ndm__sim_mapped(const ndm__sim *s);
uint64_t ndm__sim_maps(const ndm__sim *s);
/* Give the simulated device streams and events (before a pool is made over
 * it): events recorded on a held stream stay pending until it is released,
 * as work queued behind a busy kernel would. */
void ndm__sim_enable_streams(ndm__sim *s);
void ndm__sim_stream_hold(ndm__sim *s, uintptr_t stream, bool on);
/* Events made and not released; events synchronised. */
uint64_t ndm__sim_events_live(const ndm__sim *s);
uint64_t ndm__sim_event_syncs(const ndm__sim *s);
/* Give it expandable segments: reserved ranges cost nothing, committed
 * bytes count against the capacity like mapped ones. Before a pool is made. */
void ndm__sim_enable_expandable(ndm__sim *s, size_t granularity);
size_t ndm__sim_committed(const ndm__sim *s);
/* Fail the next event record (test of the fallback). */
void ndm__sim_fail_next_record(ndm__sim *s);

/* Size formatting for messages: "512 bytes", "1.50 MiB". */
const char *ndm__fmt_size(size_t n, char *buf, size_t len);

#endif
