/* Private core of ndm: handle tables, array and manager records, storage,
 * errors. Everything above the manager layer (ops, nn, io) uses this header. */
#ifndef NDM_CORE_H
#define NDM_CORE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ndm/config.h"
#include "ndm/version.h"
#include "ndm/base.h"
#include "ndm/status.h"
#include "ndm/device.h"
#include "ndm/dtype.h"
#include "ndm/manager.h"
#include "ndm/array.h"
#include "ndm/view.h"
#include "ndm/scope.h"
#include "ndm/debug.h"
#include "ndm/memory.h"
#include "../base/checked.h"
#include "../base/compiler.h"
#include "../base/dtype.h"
#include "../base/error.h"
#include "thread.h"
#include "../base/limits.h"
#include "alloc/alloc.h"

/* Two or more threads have used ndm (reclaim.h). */
extern atomic_bool ndm__multi;

/* Shapes up to this rank live inside the array record; longer ones on the heap. */
#define NDM__INLINE_DIMS 6
#define NDM__MAX_DEVICES (1 + NDM__MAX_CUDA)

/* ---- simple lock ------------------------------------------------------- */

/* A test-and-set lock: one atomic exchange to take it, a store to drop it.
 * Managers and storages are rarely contended, so this beats a mutex. */
typedef struct ndm__lock {
    atomic_int v;
} ndm__lock;

void ndm__lock_slow(ndm__lock *l);
static inline void ndm__lock_take(ndm__lock *l)
{
    if (NDM__UNLIKELY(atomic_exchange_explicit(&l->v, 1, memory_order_acquire)))
        ndm__lock_slow(l);
}
static inline void ndm__lock_drop(ndm__lock *l)
{
    atomic_store_explicit(&l->v, 0, memory_order_release);
}

/* ---- storage ----------------------------------------------------------- */

/* A storage lives inside the record of the array that made it (its home), so
 * a new array takes one record and no header. When the home array dies while
 * other views still use the storage, its slot is not reused until the last
 * view dies and frees it: the storage's memory is never reused under a view.
 * Here are the fields that the creation and the death of every array touch;
 * the rest (ndm__storage_cold) waits in the home record's cold lines. */
typedef struct ndm__storage {
    atomic_uint refs;          /* array records viewing it, and NDM__REFS_SHARED */
    uint32_t charged;          /* manager slot charged with nbytes */
    ndm_device device;
    void *data;
    void *cookie;              /* the allocator's block; NULL for a wrapped buffer */
    size_t nbytes;
} ndm__storage;

/* Set in refs, for good, once a thread other than the maker of one of its
 * views looked that view up: its memory then waits for the operations
 * running when it dies (reclaim.h). Exact compares of refs with 1 (the fast paths)
 * fail for such a storage, which takes the general paths. */
#define NDM__REFS_SHARED 0x80000000u
#define NDM__REFS_COUNT 0x7fffffffu

/* The parts of a storage that matter once a second view exists, or for a
 * wrapped buffer. While a storage has one view, its home, no view list is
 * kept (first_view is 0) and that view holds the charge: the list starts
 * when a second view comes and ends when the home is alone again or the
 * storage dies, so a plain array never touches these. */
typedef struct ndm__storage_cold {
    ndm__lock lock;            /* guards the view list and the charge; free when idle */
    uint32_t first_view;       /* views (array slots), newest first; 0: the home alone */
    uint32_t charged_views;    /* views owned by `charged`, while listed */
    ndm_free_fn free_fn;       /* wrapped buffers only (cookie NULL) */
    void *free_ud;
} ndm__storage_cold;

/* ---- array records ------------------------------------------------------ */

/* Laid out by use, one record per 64-byte lines, the chunks aligned to them.
 * A lookup and a kernel call read the first line; the creation of an array
 * of rank 0 or 1 and the death of any array touch the first three and no
 * other. Views, borrowed arrays and long shapes reach the last two. */
typedef struct ndm__array {
    _Alignas(64) atomic_uint gen; /* generation of the slot; a handle must match it */
    atomic_uint live;          /* 1 while the slot holds an array */
    uint32_t self;             /* this record's slot number */
    uint32_t mgr;              /* owning manager slot */
    int32_t ndim;
    ndm_dtype dtype;
    int64_t offset;            /* elements */
    int64_t *shape;            /* = dims or heap */
    int64_t *strides;          /* = dims + ndim or heap */
    ndm__storage *storage;     /* &own, or the own storage of another record */
    void *ext;                 /* per-array extension (autograd) */
    /* second line: its place in the owner, where it was made and how it died */
    uint32_t pos;              /* index of its entry in the owner's `arrays` */
    uint32_t lender;           /* temp_attach: manager slot to return to (0: none) */
    uint32_t lender_gen;
    uint32_t dead_by, dead_by_gen; /* manager whose close released it (0: released directly) */
    int made_line, dead_line;
    /* The tag of the thread that made it (thread.h), or NDM__MARK_SHARED
     * once another thread looked it up: its death then defers its frees
     * until the operations running then have ended (reclaim.h), as does a
     * death on a thread other than its maker's. */
    atomic_uint marks;
    const char *made_file, *made_func; /* creation site (ndm__array_site) */
    const char *dead_file, *dead_func; /* death site, kept until the slot is reused */
    /* third line: the storage this array made (if it made one), a short shape */
    uint64_t epoch;            /* mark epoch at creation (see ndm_mark) */
    ndm__storage own;
    int64_t dims[2 * NDM__INLINE_DIMS]; /* shape then strides, for ranks up to the limit */
    /* cold */
    uint32_t sv_prev, sv_next; /* the storage's view list, while listed */
    ndm__storage_cold own_cold;
    struct ndm__lend *lenders; /* older lenders, newest first; read only while lender != 0 */
} ndm__array;

/* An older lender of a borrowed array: lending an array that is already
 * borrowed pushes its lender here, and each borrower's close gives the array
 * one step back. */
typedef struct ndm__lend {
    struct ndm__lend *next;
    uint32_t slot, gen;
} ndm__lend;

_Static_assert(offsetof(ndm__array, pos) == 64 && offsetof(ndm__array, epoch) == 128 &&
                   offsetof(ndm__array, dims) + 2 * sizeof(int64_t) == 192,
               "the lines of an array record");
_Static_assert(sizeof(ndm__array) <= 320, "an array record is five lines");

/* r's manager slot, read without that manager's lock, which a move into
 * another manager may change meanwhile: the caller takes the lock of the
 * manager read and checks it again under the lock. (Its stores are atomic,
 * in ndm__array_link_into; reads under the lock need not be.) */
static inline uint32_t ndm__array_mgr_unlocked(const ndm__array *r)
{
    return __atomic_load_n(&r->mgr, __ATOMIC_RELAXED);
}

static inline ndm__site ndm__array_site(const ndm__array *r)
{
    return (ndm__site){r->made_file, r->made_func, r->made_line};
}
/* Two sites name one line (the same file and function, by pointer or text:
 * one line's literals may be merged or not). How the reports group. */
static inline bool ndm__same_site(ndm__site a, ndm__site b)
{
    return a.line == b.line && (a.file == b.file || (a.file && b.file && !strcmp(a.file, b.file))) &&
           (a.func == b.func || (a.func && b.func && !strcmp(a.func, b.func)));
}
static inline ndm__site ndm__array_dead_site(const ndm__array *r)
{
    return (ndm__site){r->dead_file, r->dead_func, r->dead_line};
}

/* While the array lives, its death fields may tell its last move instead
 * (written under the locks of the move, which readers of them hold too):
 * dead_by then holds the kind of move (below) and dead_by_gen the record's
 * generation with NDM__MOVED set, which no manager generation has, and the
 * dead site is the line of the move. A death overwrites them all. */
#define NDM__MOVED 0x80000000u
enum {
    NDM__MOVED_ATTACH = 1, /* ndm_attach */
    NDM__MOVED_RET,        /* ndm_ret */
    NDM__MOVED_DETACH,     /* ndm_detach */
    NDM__MOVED_LEND,       /* ndm_temp_attach */
    NDM__MOVED_LIST,       /* ndm_attach_all */
    NDM__MOVED_SCOPE,      /* a scope's kept result, at its end */
};
static inline void ndm__array_moved_at(ndm__array *r, uint32_t how, const ndm__site *site)
{
    r->dead_file = site->file;
    r->dead_func = site->func;
    r->dead_line = site->line;
    r->dead_by = how;
    r->dead_by_gen = atomic_load_explicit(&r->gen, memory_order_relaxed) | NDM__MOVED;
}
/* The kind of live r's last move (0: never moved), its line in *site. */
static inline uint32_t ndm__array_last_move(const ndm__array *r, ndm__site *site)
{
    if (r->dead_by_gen != (atomic_load_explicit(&r->gen, memory_order_relaxed) | NDM__MOVED))
        return 0;
    *site = ndm__array_dead_site(r);
    return r->dead_by;
}
/* r's lender (0: none) and its generation: written under r's manager lock
 * (and the other manager's, for a loan), read by that lock's holders and,
 * without it, by ndm_why_alive for the other views of a storage it lists:
 * hence relaxed atomics, which cost a plain move. */
static inline void ndm__array_set_lender(ndm__array *r, uint32_t slot, uint32_t gen)
{
    __atomic_store_n(&r->lender, slot, __ATOMIC_RELAXED);
    __atomic_store_n(&r->lender_gen, gen, __ATOMIC_RELAXED);
}
static inline uint32_t ndm__array_lender_unlocked(const ndm__array *r, uint32_t *gen)
{
    *gen = __atomic_load_n(&r->lender_gen, __ATOMIC_RELAXED);
    return __atomic_load_n(&r->lender, __ATOMIC_RELAXED);
}
/* "ndm_attach" for NDM__MOVED_ATTACH, and so on. */
const char *ndm__move_name(uint32_t how);

/* The record a storage lives in, and the storage's cold part there. */
static inline struct ndm__array *ndm__storage_home(ndm__storage *s)
{
    return (struct ndm__array *)(void *)((char *)s - offsetof(struct ndm__array, own));
}
static inline ndm__storage_cold *ndm__storage_cold_of(ndm__storage *s)
{
    return &ndm__storage_home(s)->own_cold;
}
/* Views of s owned by its charged manager; its lock held, or s unshared. */
static inline uint32_t ndm__storage_charged_views(ndm__storage *s)
{
    ndm__storage_cold *c = ndm__storage_cold_of(s);
    return c->first_view ? c->charged_views : 1;
}

/* ---- manager records ---------------------------------------------------- */

enum {
    NDM__M_LIVE = 1u << 0,
    NDM__M_CLOSING = 1u << 1,
    NDM__M_CAP_ARRAYS = 1u << 2, /* = NDM_CAP_ARRAYS << 2 */
    NDM__M_CAP_CHILDREN = 1u << 3,
    NDM__M_SCOPE = 1u << 4,
    NDM__M_BUILTIN = 1u << 5,    /* system, detached */
    NDM__M_LIMITED = 1u << 6,    /* limit_anchor is set: byte limits apply */
    NDM__M_DRAINING = 1u << 7,   /* closing, its children closed: its arrays are going */
    NDM__M_UNLINKED = 1u << 8,   /* closing, already taken out of its parent's children */
};
/* The cases a new array must check for; one test of the state on the
 * common path, where none applies. */
#define NDM__M_SLOW_NEW (NDM__M_CLOSING | NDM__M_CAP_ARRAYS | NDM__M_LIMITED)
#define NDM__CAP_SHIFT 2

typedef struct ndm__limits {
    _Atomic uint64_t limit[NDM__MAX_DEVICES]; /* 0: none */
    _Atomic int64_t used[NDM__MAX_DEVICES];   /* bytes charged in the subtree */
} ndm__limits;

typedef struct ndm__hook {
    struct ndm__hook *next;    /* older */
    void (*free_fn)(void *);   /* owned resource */
    ndm_close_fn close_fn;     /* on-close hook */
    void *ptr;
    char *name;
    ndm__site site;
} ndm__hook;

typedef struct ndm__dump_prev {
    uint64_t live, created, released;
    int64_t bytes;
    bool seen;
} ndm__dump_prev;

#define NDM__NAME_MAX 48

/* A manager's storage bytes on one device (see ndm__manager). `reserved`:
 * bytes reserved in its limits by creations still in progress (under the
 * lock); a close gives back what is left of it when it ends, so that a
 * creation that then finds the manager gone owes nothing to limits that may
 * belong to other managers by then. */
typedef struct ndm__dev_count {
    int64_t bytes, peak;
    _Atomic int64_t inbox;
    int64_t reserved;
} ndm__dev_count;

typedef struct ndm__manager {
    atomic_uint gen;
    uint32_t self;             /* this record's slot number */
    atomic_uint state;         /* NDM__M_* */
    ndm__lock lock;            /* array list, counters, hooks: see ndm__mlock_take */
    atomic_uint busy;          /* the creator is inside the lock on its fast path */
    atomic_bool biased;        /* the creator may take the lock with plain stores */
    _Atomic uint64_t creator;  /* id of the creating thread (0: none) */
    /* A planned manager's run (plan.c): its storage is recorded or served
     * from an arena. NULL for every other manager; set before the manager
     * is published, cleared by its close. */
    _Atomic(struct ndm__plan_run *) plan_run;
    uint32_t parent;
    uint32_t parent_gen;       /* to name dead ancestors correctly */
    uint32_t first_child;      /* newest child; siblings linked newest to oldest */
    uint32_t sib_prev, sib_next;
    /* The slots of its arrays in the order they came (a move in comes last),
     * 0 where one has left: `narrays` entries, `holes` of them 0. A close
     * walks them newest first with loads that do not wait on each other, as
     * the links of a list would. Kept with the slot when the manager dies. */
    uint32_t *arrays;
    uint32_t narrays, arrays_cap, holes;
    atomic_uint limit_anchor;  /* nearest manager (self or ancestor) with limits */
    ndm__limits *limits;
    ndm_device device;
    int dev;
    char name[NDM__NAME_MAX];  /* truncated copy; kept after death until reuse */
    ndm__site site;
    ndm__site dead_site;
    uint64_t epoch;
    /* counters, under `lock` */
    uint64_t live, created, released, moved_in, moved_out, resources;
    uint64_t children;         /* under the tree lock */
    /* arrays created and released by closed children and their subtrees:
     * a close folds them into the parent, so subtree totals keep them;
     * under the tree lock */
    uint64_t closed_created, closed_released;
    /* Bytes of intermediates autograd recomputed for a step under a byte
     * budget (ndm_grad_begin_budget), counted on the graph's manager. */
    _Atomic uint64_t recomputed;
    /* Storage bytes charged here: bytes + inbox. bytes and peak change under
     * `lock`; a charge moved here by a thread that holds another manager's
     * lock (a view dying elsewhere) lands in inbox, so no thread ever takes a
     * second manager lock out of order. The peak is the larger of `peak` and
     * the total: a total only falls after ndm__bytes_sub folded it into
     * `peak`, so a creation counts its bytes with no compare. */
    ndm__hook *hooks;
    ndm__dump_prev dumped;     /* under the tree lock */
    uint32_t next_free;
    /* Accounting slots whose counts below may be other than 0: a new
     * manager clears those only (most use one device, and clearing all 17
     * touched seven lines of the record). Set before a count changes. */
    _Atomic uint32_t dev_used;
    /* By device, the three counts side by side: a manager that uses one
     * device touches one line of them, which follows the fields above. */
    ndm__dev_count count[NDM__MAX_DEVICES];
} ndm__manager;

/* m's device, read before m's lock is taken: m may be closed and its record
 * filled for a new manager meanwhile (the check under the lock then refuses
 * the work), so the store in record_init and this load are atomic. */
static inline ndm_device ndm__manager_device_of(ndm__manager *m)
{
    ndm_device d;
    __atomic_load(&m->device, &d, __ATOMIC_RELAXED);
    return d;
}

/* ---- a manager's array entries (its lock held) ------------------------ */

bool ndm__arrays_grow(ndm__manager *m);   /* false: no memory */
/* Test hook: the n-th next growth of an array list (1 = the next) fails as if
 * memory ran out; 0 disables. Process wide. */
void ndm__arrays_grow_fail_after(int n);
void ndm__arrays_compact(ndm__manager *m);
/* A closing m's lifetime counts join its parent's closed-children totals;
 * tree lock held, m's arrays drained. */
void ndm__lifetime_fold(ndm__manager *m);

/* Room for one more entry; false when memory ran out. */
static inline bool ndm__arrays_room(ndm__manager *m)
{
    return NDM__LIKELY(m->narrays < m->arrays_cap) || ndm__arrays_grow(m);
}

/* Take r's entry out of m. Holes at the end go at once; others stay until
 * they are half the entries (`compact`), or until the caller, walking the
 * entries down from the end, compacts once it is done (positions below r's
 * do not change here). */
static inline void ndm__arrays_remove(ndm__manager *m, uint32_t pos, bool compact)
{
    m->arrays[pos] = 0;
    if (pos + 1 == m->narrays) {
        m->narrays--;
        /* (no holes: the entry below is a live one) */
        if (NDM__LIKELY(m->holes == 0))
            return;
        while (m->narrays && !m->arrays[m->narrays - 1]) {
            m->narrays--;
            m->holes--;
        }
    } else if (++m->holes > m->narrays / 2 && compact && m->narrays >= 64) {
        ndm__arrays_compact(m);
    }
}

/* ---- manager locks ------------------------------------------------------ */

/* A manager's lock is biased to the thread that created it: that thread
 * takes it with plain stores (an atomic exchange waits for every pending
 * store, which costs more than the rest of a small array's creation). The
 * first other thread to take it clears the bias for good, then waits for the
 * creator to leave: a membarrier() stands in for the fence the creator's
 * fast path leaves out, so either the creator sees the bias gone or its busy
 * flag is seen. From then on everyone takes the exchange lock. Without
 * membarrier() no manager is biased. A record keeps its first owner for
 * good: a later manager in the slot is biased only when that thread makes it
 * (see record_init), so a thread that read `creator` for an earlier manager
 * there never shares the fast path with another. */
extern bool ndm__bias_supported;
void ndm__bias_setup(void);              /* once, from ndm__init */
/* Clear a bias the caller saw set while holding the lock it stands in for,
 * then wait until the owner is out of its fast path. */
void ndm__bias_revoke(atomic_bool *biased, atomic_uint *busy);
void ndm__mlock_slow(ndm__manager *m);   /* clear the bias if set; take the lock */

/* Take m's lock; true when taken on the creator's fast path. Hand the
 * result to ndm__mlock_release. `t` is the calling thread's state (or NULL). */
static inline bool ndm__mlock_acquire_as(ndm__manager *m, ndm__thread *t)
{
    if (NDM__LIKELY(t && t->id == atomic_load_explicit(&m->creator, memory_order_relaxed))) {
        atomic_store_explicit(&m->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        if (NDM__LIKELY(atomic_load_explicit(&m->biased, memory_order_relaxed)))
            return true;
        atomic_store_explicit(&m->busy, 0, memory_order_release);
    }
    ndm__mlock_slow(m);
    return false;
}
static inline bool ndm__mlock_acquire(ndm__manager *m) { return ndm__mlock_acquire_as(m, ndm__tls); }

static inline void ndm__mlock_release(ndm__manager *m, bool fast)
{
    if (fast)
        atomic_store_explicit(&m->busy, 0, memory_order_release);
    else
        ndm__lock_drop(&m->lock);
}

static inline void ndm__mlock_take(ndm__manager *m) { (void)ndm__mlock_acquire(m); }

static inline void ndm__mlock_drop(ndm__manager *m)
{
    ndm__thread *t = ndm__tls;
    /* Only the creator sets busy, and only on its fast path. */
    ndm__mlock_release(m, t && t->id == atomic_load_explicit(&m->creator, memory_order_relaxed) &&
                              atomic_load_explicit(&m->busy, memory_order_relaxed));
}

/* ---- handle tables ------------------------------------------------------ */

#define NDM__CHUNK_BITS 12
#define NDM__CHUNK_SIZE (1u << NDM__CHUNK_BITS)
#define NDM__MAX_CHUNKS (1u << 18)
#define NDM__KIND_MANAGER (UINT64_C(1) << 63)

extern _Atomic(ndm__array *) ndm__array_chunks[NDM__MAX_CHUNKS];
extern _Atomic(ndm__manager *) ndm__manager_chunks[NDM__MAX_CHUNKS];
/* Array slots below this have their chunk: one compare tells a slot that may
 * hold an array from one that never did (stored after the chunk, released). */
extern _Atomic uint32_t ndm__array_high;
extern _Atomic uint32_t ndm__manager_high;

static inline uint32_t ndm__id_slot(uint64_t id) { return (uint32_t)id; }
static inline uint32_t ndm__id_gen(uint64_t id) { return (uint32_t)(id >> 32) & 0x7fffffffu; }

/* The reserved manager values of base.h (generation 0: never a real handle). */
#define NDM__OUTPUT_RULE_ID UINT64_C(0x8000000000000001)
#define NDM__CURRENT_SCOPE_ID UINT64_C(0x8000000000000002)
/* The generation that creations into m (looked up from h) must still find
 * under m's lock: h's own, or, for a reserved value such as
 * NDM_CURRENT_SCOPE (generation 0, which no record has), m's as read right
 * after the lookup. */
#define ndm__manager_expected_gen(h, m)                                                  \
    (ndm__id_gen((h).id) ? ndm__id_gen((h).id)                                          \
                         : atomic_load_explicit(&(m)->gen, memory_order_acquire))

/* Did a handle of generation h exist before its slot's record reached
 * generation g (the live object's, or the next to be issued while the slot
 * is empty)? Generations run 1..2^31-1 and wrap to 1; one lying less than
 * half a cycle behind g was issued (a stale handle), one ahead of g, or
 * equal to it while the slot is empty, never was (a forged or corrupted
 * handle). A handle kept across 2^30 reuses of its slot is thus taken for a
 * forged one. */
static inline bool ndm__gen_stale(uint32_t h, uint32_t g)
{
    uint32_t behind = g >= h ? g - h : g + 0x7fffffffu - h;
    return behind > 0 && behind < (1u << 30);
}

/* The record of a slot, or NULL when the slot was never allocated. */
static inline ndm__array *ndm__array_slot(uint32_t slot)
{
    ndm__array *c = atomic_load_explicit(&ndm__array_chunks[slot >> NDM__CHUNK_BITS],
                                         memory_order_acquire);
    return c ? &c[slot & (NDM__CHUNK_SIZE - 1)] : NULL;
}
static inline ndm__manager *ndm__manager_slot(uint32_t slot)
{
    ndm__manager *c = atomic_load_explicit(&ndm__manager_chunks[slot >> NDM__CHUNK_BITS],
                                           memory_order_acquire);
    return c ? &c[slot & (NDM__CHUNK_SIZE - 1)] : NULL;
}

/* The record of a slot known to exist (a list link, an owner, a slot from
 * the free lists): no test for a missing chunk. */
static inline ndm__array *ndm__array_rec(uint32_t slot)
{
    return &atomic_load_explicit(&ndm__array_chunks[slot >> NDM__CHUNK_BITS],
                                 memory_order_acquire)[slot & (NDM__CHUNK_SIZE - 1)];
}
static inline ndm__manager *ndm__manager_rec(uint32_t slot)
{
    return &atomic_load_explicit(&ndm__manager_chunks[slot >> NDM__CHUNK_BITS],
                                 memory_order_acquire)[slot & (NDM__CHUNK_SIZE - 1)];
}

static inline ndm_array ndm__array_handle(uint32_t slot, uint32_t gen)
{
    return (ndm_array){((uint64_t)gen << 32) | slot};
}
static inline ndm_manager ndm__manager_handle(uint32_t slot, uint32_t gen)
{
    return (ndm_manager){NDM__KIND_MANAGER | ((uint64_t)gen << 32) | slot};
}

/* Fast checks with no error reporting. The generation alone tells a live
 * array: a slot's generation moves on when its array dies, and a handle with
 * the new one exists only once the next array there is made. A record's
 * generation is never 0 and never has bit 31 set, so the compare with the
 * handle's upper half also refuses the null handle and manager handles: a
 * check is one compare for the slot, one load for the chunk, one compare
 * for the generation. */
/* Once several threads use ndm, a lookup by a thread other than the
 * array's maker marks the record and its storage, then checks again that
 * the array lives (ndm__array_share): a death that frees them then defers. */
#define NDM__MARK_SHARED UINT32_MAX
ndm__array *ndm__array_share(ndm__array *r, ndm_array h);
/* The calling thread's tag (0 without a thread state: nothing is its own). */
static inline uint32_t ndm__thread_tag(void)
{
    ndm__thread *t = ndm__tls;
    return t ? t->tag : 0;
}
static inline bool ndm__array_claimed(const ndm__array *r)
{
    uint32_t m = atomic_load_explicit(&r->marks, memory_order_relaxed);
    return m == NDM__MARK_SHARED || m == ndm__thread_tag();
}

/* A record the lookup has read through, so not null: callers need not test
 * it again (the compiler is told so). */
#if defined(__GNUC__)
#define ndm__read_through(r) (__builtin_expect((r) != NULL, 1) ? (r) : (__builtin_unreachable(), (r)))
#else
#define ndm__read_through(r) (r)
#endif

/* The check alone, for callers that read an array's description and no
 * memory behind it (the accessors of its shape, dtype, device). */
static inline ndm__array *ndm__array_peek_meta(ndm_array h)
{
    uint32_t slot = ndm__id_slot(h.id);
    if (NDM__UNLIKELY(slot >= atomic_load_explicit(&ndm__array_high, memory_order_acquire)))
        return NULL;
    ndm__array *r = ndm__array_rec(slot);
    if (NDM__UNLIKELY(atomic_load_explicit(&r->gen, memory_order_acquire) !=
                      (uint32_t)(h.id >> 32)))
        return NULL;
    return ndm__read_through(r);
}

static inline ndm__array *ndm__array_peek(ndm_array h)
{
    ndm__array *r = ndm__array_peek_meta(h);
    if (NDM__UNLIKELY(atomic_load_explicit(&ndm__multi, memory_order_relaxed)) && r &&
        !ndm__array_claimed(r))
        return ndm__array_share(r, h);
    return r;
}
static inline ndm__manager *ndm__manager_peek(ndm_manager h)
{
    uint32_t slot = ndm__id_slot(h.id);
    if (NDM__UNLIKELY(slot >= atomic_load_explicit(&ndm__manager_high, memory_order_acquire)))
        return NULL;
    ndm__manager *r = ndm__manager_rec(slot);
    /* the kind bit lands on bit 31 of the handle's upper half */
    if (NDM__UNLIKELY((atomic_load_explicit(&r->gen, memory_order_acquire) | 0x80000000u) !=
                      (uint32_t)(h.id >> 32)) ||
        !(atomic_load_explicit(&r->state, memory_order_acquire) & NDM__M_LIVE))
        return NULL;
    return ndm__read_through(r);
}

/* Checked lookups: on failure they record NDM_E_NULL / NDM_E_CLOSED /
 * NDM_E_INVALID with a message naming the array or manager and how it died,
 * and return NULL. A null handle keeps the thread's last error when there is
 * one (ndm__fail_null; `propagate` is kept for the callers that pass it and
 * no longer changes this). A manager lookup resolves NDM_CURRENT_SCOPE to the
 * innermost scope. The checks are inline; only a failure calls out, so the
 * site is built on that path only. */
ndm__array *ndm__array_lookup_failed(ndm_array h, const char *api, const ndm__site *where,
                                     bool propagate);
ndm__manager *ndm__manager_lookup_failed(ndm_manager h, const char *api, const ndm__site *where);
/* Whether h was ever issued (it may be stale) as an array or manager handle:
 * what tells a stale handle (NDM_ALREADY on release or close) from a forged
 * one (NDM_E_INVALID). */
bool ndm__array_issued(ndm_array h);
bool ndm__manager_issued(ndm_manager h);

static inline ndm__array *ndm__array_get(ndm_array h, const char *api, ndm__site where)
{
    ndm__array *r = ndm__array_peek(h);
    return NDM__LIKELY(r != NULL) ? r : ndm__array_lookup_failed(h, api, &where, false);
}
static inline ndm__array *ndm__array_get_prop(ndm_array h, const char *api, ndm__site where)
{
    ndm__array *r = ndm__array_peek(h);
    return NDM__LIKELY(r != NULL) ? r : ndm__array_lookup_failed(h, api, &where, true);
}
static inline ndm__manager *ndm__manager_get(ndm_manager h, const char *api, ndm__site where)
{
    ndm__manager *m = ndm__manager_peek(h);
    return NDM__LIKELY(m != NULL) ? m : ndm__manager_lookup_failed(h, api, &where);
}

static inline ndm_array ndm__array_handle_of(ndm__array *r)
{
    return ndm__array_handle(r->self, atomic_load_explicit(&r->gen, memory_order_relaxed));
}
static inline ndm_manager ndm__manager_handle_of(ndm__manager *r)
{
    return ndm__manager_handle(r->self, atomic_load_explicit(&r->gen, memory_order_relaxed));
}

/* Slot allocation. Array slots come from a per-thread FIFO cache, so a slot
 * freed now is reused late (NDM__SLOT_RESERVE) and a stale handle still finds
 * how its array died. The fast paths are inline; the slow ones refill or
 * spill a batch. */
uint32_t ndm__array_slot_alloc_slow(void);
void ndm__array_slot_free_slow(uint32_t slot);

/* `th` is the calling thread's state (ndm__tls, NULL when not made yet). */
static inline uint32_t ndm__array_slot_alloc_as(ndm__thread *th)
{
    if (NDM__UNLIKELY(!th || th->ring_count <= NDM__SLOT_RESERVE))
        return ndm__array_slot_alloc_slow();
    uint32_t s = th->ring[th->ring_head];
    th->ring_head = (th->ring_head + 1) % NDM__SLOT_RING;
    th->ring_count--;
    return s;
}
static inline uint32_t ndm__array_slot_alloc(void) { return ndm__array_slot_alloc_as(ndm__tls); }

static inline void ndm__array_slot_free_as(ndm__thread *th, uint32_t slot)
{
    if (NDM__UNLIKELY(!th || th->ring_count == NDM__SLOT_RING)) {
        ndm__array_slot_free_slow(slot);
        return;
    }
    th->ring[(th->ring_head + th->ring_count) % NDM__SLOT_RING] = slot;
    th->ring_count++;
}
static inline void ndm__array_slot_free(uint32_t slot) { ndm__array_slot_free_as(ndm__tls, slot); }
/* Free n slots at once, as n ndm__array_slot_free calls would. */
void ndm__array_slot_free_many(const uint32_t *slots, uint32_t n);
uint32_t ndm__manager_slot_alloc(void);   /* under the tree lock */
void ndm__manager_slot_free(uint32_t slot); /* under the tree lock */

/* ---- process state ------------------------------------------------------ */

void ndm__init(void);                      /* idempotent, thread-safe */
extern uint32_t ndm__system_slot, ndm__detached_slot;
/* The mark epoch: ndm_mark advances it; records keep the value they saw. A
 * plain load per creation, where a sequence counter would cost an atomic. */
extern _Atomic uint64_t ndm__epoch;
void ndm__tree_lock(void);
void ndm__tree_unlock(void);

static inline int ndm__device_slot(ndm_device d)
{
    return d.type == NDM_DEVICE_CPU ? 0 : 1 + d.index;
}
static inline ndm_device ndm__slot_device(int s)
{
    return s == 0 ? NDM_CPU : NDM_CUDA(s - 1);
}

/* Records an error unless `dev` can hold arrays (see ndm__device_usable). */
static inline ndm_status ndm__alloc_device_check(ndm_device dev, const char *api, ndm__site where)
{
    if (dev.type == NDM_DEVICE_CPU && dev.index == 0)
        return NDM_OK;
    char why[768];
    ndm_status st = ndm__device_usable(dev, why, sizeof why);
    return st < 0 ? ndm__fail(st, api, where, "%s", why) : NDM_OK;
}

/* ---- arrays ------------------------------------------------------------- */

/* Checks a shape: ndim >= 0, dims >= 0, element and byte counts fit. */
ndm_status ndm__shape_check(int ndim, const int64_t *shape, ndm_dtype dtype, int64_t *numel,
                            size_t *nbytes, const char *api, ndm__site where);

/* The output rule, written once: the manager named by the caller, else (the
 * caller passed NDM_OUTPUT_RULE) the innermost scope of this thread, else the
 * manager of the first input. NDM_CURRENT_SCOPE is resolved; a null `named`
 * is NDM_E_NULL. Returns the null handle (error recorded) when none applies. */
ndm_manager ndm__output_manager(ndm_manager named, ndm__array *first_input, const char *api,
                                ndm__site where);

/* The output rule resolved to a manager record, for hot paths: the common
 * case (no manager named, no scope on this thread) is inline. NULL with the
 * error recorded when no manager applies or the named one is stale. */
ndm__manager *ndm__output_record_slow(ndm_manager named, ndm__array *first_input,
                                      const char *api, const ndm__site *where);
/* (t: the calling thread's state, ndm__tls, read once by the caller) */
static inline ndm__manager *ndm__output_record_as(ndm__thread *t, ndm_manager named,
                                                  ndm__array *first_input, const char *api,
                                                  const ndm__site *where)
{
    if (NDM__LIKELY(named.id == NDM__OUTPUT_RULE_ID && first_input &&
                    (!t || t->scope_depth == 0)))
        return ndm__manager_rec(first_input->mgr);
    return ndm__output_record_slow(named, first_input, api, where);
}
static inline ndm__manager *ndm__output_record(ndm_manager named, ndm__array *first_input,
                                               const char *api, const ndm__site *where)
{
    return ndm__output_record_as(ndm__tls, named, first_input, api, where);
}

/* Describe the array in messages: "f32[2,3]". */
const char *ndm__array_desc(const ndm__array *r, char *buf, size_t n);

/* A new array with fresh storage (uninitialised) in manager `m` on the
 * manager's device (or `dev` when dev_given). Strides are C-contiguous. Checks
 * come first: nothing is allocated when the manager refuses. */
ndm_array ndm__array_new(ndm__site site, const char *api, ndm_manager m, ndm_dtype dtype,
                         int ndim, const int64_t *shape, ndm__array **out);
ndm_array ndm__array_new_on(ndm__site site, const char *api, ndm_manager m, ndm_device dev,
                            ndm_dtype dtype, int ndim, const int64_t *shape, ndm__array **out);
/* The same for a manager record already looked up; the site by pointer, as
 * hot paths pass it. */
ndm_array ndm__array_new_in(const ndm__site *site, const char *api, ndm__manager *m,
                            ndm_device dev, ndm_dtype dtype, int ndim, const int64_t *shape,
                            ndm__array **out);
/* A new view of the storage of `base` in manager `m`. */
ndm_array ndm__array_view(ndm__site site, const char *api, ndm_manager m, ndm__array *base,
                          ndm_dtype dtype, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset, ndm__array **out);
/* An alias of `base` under the detached node, lent by base's manager (an export). */
ndm_array ndm__array_lend_out(ndm__site site, const char *api, ndm__array *base);
/* A new array over a caller's buffer. */
ndm_array ndm__array_wrap(ndm__site site, const char *api, ndm_manager m, ndm_dtype dtype,
                          int ndim, const int64_t *shape, void *data, ndm_free_fn free_fn,
                          void *ud);

/* Release a live array record (explicit release path, with locking). */
ndm_status ndm__array_release(ndm__array *r, ndm__site site, const char *api);

/* Element sizes by dtype, for hot paths (ndm_dtype_size checks its argument). */

/* Address of the first element. */
static inline void *ndm__array_ptr(const ndm__array *r)
{
    return (char *)r->storage->data + r->offset * (int64_t)ndm__dtype_bytes[r->dtype];
}
static inline int64_t ndm__numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}
bool ndm__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides);
void ndm__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Normalise an axis in [-ndim, ndim) (or [-ndim-1, ndim] when `insert`). */
ndm_status ndm__axis(int axis, int ndim, bool insert, int *out, const char *api, ndm__site where);

/* ---- managers ----------------------------------------------------------- */

/* The two halves of a charge, for allocations: reserve room in the limits
 * before allocating, count the bytes (and the peak) once memory is held. */
ndm_status ndm__limit_reserve(ndm__manager *m, int dev, int64_t bytes, const char *api,
                              ndm__site where);
void ndm__limit_release(ndm__manager *m, int dev, int64_t bytes);
/* A limit that refused a charge, for a message written later. */
typedef struct ndm__quota_miss {
    uint32_t slot;             /* the limited manager */
    int dev;
    int64_t bytes, used;
    uint64_t limit;
} ndm__quota_miss;
/* ndm__limit_reserve that writes no message (callers holding manager locks:
 * the message takes the tree lock); NDM_E_QUOTA with `miss` filled. */
ndm_status ndm__limit_reserve_quiet(ndm__manager *m, int dev, int64_t bytes,
                                    ndm__quota_miss *miss);
/* Relief under a byte budget: called (no lock held) when a creation of
 * `bytes` on accounting slot dev does not fit the limit of manager
 * miss->slot. It returns the bytes it freed there (the creation is tried
 * again when more than 0), 0 when it freed nothing (the refusal is the
 * plain NDM_E_QUOTA), or a negative status once it recorded the error
 * itself. Installed once by autograd; null until then, so that a refusal
 * with no budget costs one load. */
typedef int64_t (*ndm__quota_relief_fn)(const ndm__quota_miss *miss, const char *api,
                                        const ndm__site *site);
extern _Atomic(ndm__quota_relief_fn) ndm__quota_relief;
/* Count bytes recomputed in manager h's dump line (a live handle; else
 * nothing). */
void ndm__manager_count_recomputed(ndm_manager h, uint64_t bytes);
/* Record NDM_E_QUOTA for `miss` (no lock held: it takes the tree lock). */
ndm_status ndm__quota_fail(const ndm__quota_miss *miss, const char *api, ndm__site where);

/* Bytes charged to m on accounting slot dev (its lock held, or for a
 * consistent reading of a manager nobody changes). */
static inline int64_t ndm__bytes_of(ndm__manager *m, int dev)
{
    return m->count[dev].bytes + atomic_load_explicit(&m->count[dev].inbox, memory_order_relaxed);
}
/* Mark m's counts on dev as in use (see dev_used); any thread. */
static inline void ndm__dev_mark(ndm__manager *m, int dev)
{
    uint32_t bit = 1u << dev;
    if (NDM__UNLIKELY(!(atomic_load_explicit(&m->dev_used, memory_order_relaxed) & bit)))
        atomic_fetch_or_explicit(&m->dev_used, bit, memory_order_relaxed);
}
/* Count bytes in m (its lock held); the peak follows lazily. */
static inline void ndm__bytes_add(ndm__manager *m, int dev, int64_t bytes)
{
    ndm__dev_mark(m, dev);
    m->count[dev].bytes += bytes;
}
/* Take bytes out of m's count (its lock held), the total so far folded
 * into its peak first. (No mark: bytes taken out were added first, and each
 * addition marked dev.) */
static inline void ndm__bytes_sub(ndm__manager *m, int dev, int64_t bytes)
{
    int64_t now = ndm__bytes_of(m, dev);
    if (now > m->count[dev].peak)
        m->count[dev].peak = now;
    m->count[dev].bytes -= bytes;
}
/* The highest total m has held on dev (its lock held). */
static inline int64_t ndm__bytes_peak(ndm__manager *m, int dev)
{
    int64_t now = ndm__bytes_of(m, dev);
    return now > m->count[dev].peak ? now : m->count[dev].peak;
}

/* Give back the bytes of a dead storage: m's count (its lock held) and limits. */
static inline void ndm__uncharge(ndm__manager *m, int dev, int64_t bytes)
{
    if (NDM__UNLIKELY(atomic_load_explicit(&m->limit_anchor, memory_order_relaxed) != 0))
        ndm__limit_release(m, dev, bytes);
    ndm__bytes_sub(m, dev, bytes);
}
/* Would moving `bytes` from `from` to `to` fit the limits? (no change made) */
ndm_status ndm__charge_check(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                             const char *api, ndm__site where);
/* ndm__charge_check without a message (for callers holding manager locks). */
ndm_status ndm__charge_fits(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                            ndm__quota_miss *miss);
/* Move a charge between managers; limited ancestors common to both keep it.
 * `from`'s lock is held; so is `to`'s unless `to_unlocked`, when the bytes go
 * to its inbox. */
ndm_status ndm__charge_move(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                            bool force, bool to_unlocked, const char *api, ndm__site where);

/* ndm__charge_move in two halves, for moves of several charges that must
 * all fit or none: reserve `bytes` in the limits that `to` adds over `from`
 * (quiet: NDM_E_QUOTA with `miss` filled), then either commit (from's
 * limits give them up, the bytes move; both locks held) or unreserve. */
ndm_status ndm__charge_reserve(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                               ndm__quota_miss *miss);
void ndm__charge_unreserve(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes);
void ndm__charge_commit(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes);

/* Write the path of manager `slot` ("system/model/batch-3") into buf; takes
 * the tree lock. Works for a dead manager until its slot (or an ancestor's)
 * is reused; then the unknown part is written as "?". Returns buf. */
char *ndm__manager_path(uint32_t slot, char *buf, size_t n);
/* ndm_manager_own for a library object, as api's call at site. */
ndm_status ndm__manager_own_as(ndm_manager h, void *ptr, void (*free_fn)(void *ptr),
                               const char *name, const char *api, ndm__site site);
/* The same, for callers that already hold the tree lock. */
char *ndm__manager_path_locked(uint32_t slot, char *buf, size_t n);
/* ndm_why_alive for one array of each of the `top` creation sites of
 * root's subtree (the whole tree for the null handle) holding the most
 * bytes (no lock held; NDM_LEAK_REPORT=why at exit, ndm_debug_dump_why). */
void ndm__why_top(FILE *f, ndm_manager root, int top);

/* A new manager with extra NDM__M_* flags (scopes). */
ndm_manager ndm__manager_new_ex(ndm__site site, const char *api, ndm_manager parent,
                                const char *name, ndm_device device, unsigned flags);
/* Release every array of m (newest first) except the keep slots; borrowed
 * arrays go back to their lenders. Used by close (m closing) and by
 * ndm_scope_release_all_but. */
void ndm__manager_drain_arrays(ndm__manager *m, ndm__site site);
void ndm__manager_release_except(ndm__manager *m, const uint32_t *keep, size_t n,
                                 ndm__site site);
/* Move r into `to` as ndm_attach does. */
ndm_status ndm__array_attach(ndm__array *r, ndm_manager to, const char *api, ndm__site site);

/* Allocator hooks (report.c), registered at start-up: the managers holding
 * the most bytes on a device, for OOM messages, and a slot's path. */
void ndm__report_top_managers(ndm_device dev, char *buf, size_t n);
void ndm__describe_manager_path(uint32_t slot, char *buf, size_t n);

/* Scopes (scope.c): the innermost live scope of this thread, or null. */
/* Scopes kept open between uses, on the thread that made them: the
 * thread's parked scope under `parent` (taken off the shelf and pushed), or
 * a new one as ndm_scope_begin makes it; and the end of such a use: every
 * array of s released and s popped and parked for the next use (a scope that
 * is not one of this thread's, closing, capped or with children ends as
 * ndm_scope_end ends it). A thread's parked scopes close at its exit, and
 * with their parent. */
ndm_manager ndm__scope_reuse(ndm__site site, ndm_manager parent, const char *name);
ndm_status ndm__scope_park(ndm__site site, ndm_manager parent, ndm_manager s);
ndm_manager ndm__scope_innermost(void);
/* NDM_CURRENT_SCOPE resolved: the innermost scope's handle, or the null
 * handle with NDM_E_NULL recorded when this thread has none. */
ndm_manager ndm__current_scope(const char *api, ndm__site where);
/* The handle that h names, for a caller that looked it up and keeps it:
 * h itself, or the innermost scope's own handle for NDM_CURRENT_SCOPE
 * (never one made from the record, which a close on another thread may
 * have moved to the next generation since the lookup). */
static inline ndm_manager ndm__manager_resolved(ndm_manager h, const char *api, ndm__site where)
{
    return h.id == NDM__CURRENT_SCOPE_ID ? ndm__current_scope(api, where) : h;
}

#endif
