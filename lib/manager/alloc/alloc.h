/* The allocator interface the manager layer uses for array storage.
 * It knows nothing of managers: callers pass an opaque tag that history records. */
#ifndef NDM_ALLOC_INTERNAL_H
#define NDM_ALLOC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../../base/segment.h"
#include "ndm/device.h"
#include "ndm/memory.h"
#include "ndm/status.h"

/* Where an allocation comes from, for history and OOM reports: the caller's
 * site, and the public function that allocates (NULL: none named). */
typedef struct ndm__alloc_tag {
    uint32_t manager; /* manager slot (0: none) */
    const char *file;
    const char *func;
    int line;
    const char *api;
    bool transient; /* kernel scratch: freed before the operation that took it returns */
} ndm__alloc_tag;

/* One allocation. `cookie` is the allocator's own record, so freeing needs no
 * lookup by address. */
typedef struct ndm__block {
    void *ptr;
    void *cookie;
    size_t size;
} ndm__block;

/* A block that is not the allocator's own: a part of a larger block that
 * its holder hands out (a planned manager's arena). Its cookie is the
 * address of its ndm__xblock with the low bit set (the allocator's records
 * are aligned, so no cookie of theirs has it); ndm__free, ndm__free_many,
 * the stream calls and ndm__alloc_retag route such a cookie to its
 * functions, so no part of a block ever reaches the pool as a block. */
typedef struct ndm__xblock ndm__xblock;
typedef struct ndm__xblock_fns {
    void (*free)(ndm__xblock *x, void *ptr); /* any thread; ptr NULL: not known */
    ndm_status (*record_stream)(ndm__xblock *x, uintptr_t stream);
    uint32_t (*stream_uses)(ndm__xblock *x);
} ndm__xblock_fns;
struct ndm__xblock {
    const ndm__xblock_fns *fns;
};
static inline void *ndm__xblock_cookie(ndm__xblock *x) { return (void *)((uintptr_t)x | 1u); }
static inline ndm__xblock *ndm__xblock_of(void *cookie)
{
    return ((uintptr_t)cookie & 1u) ? (ndm__xblock *)((uintptr_t)cookie & ~(uintptr_t)1) : NULL;
}

/* Allocate nbytes (0 allowed: a valid block of size 0) on `dev`, aligned to 64
 * bytes. NDM_E_OOM with a message on failure; *out is zeroed then. */
ndm_status ndm__alloc(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag, ndm__block *out);
/* Record an allocation's failure (cold paths only). A tag that names a
 * public function (api) makes it that function's failure at the tag's site,
 * so the message, logged once, is the one its caller returns: the caller
 * does not raise it again. Without one, the message names neither, for a
 * caller that adds its own. Kernel scratch (transient) says so. Returns st. */
ndm_status ndm__alloc_fail(const ndm__alloc_tag *tag, ndm_status st, const char *fmt, ...)
    NDM_PRINTF(3, 4);
/* Free a block from ndm__alloc (a zeroed block is ignored). */
void ndm__free(ndm_device dev, ndm__block *blk);
/* Free n blocks of one device, given by their cookies (none NULL), as n
 * ndm__free calls would; the thread cache's bookkeeping is done once for a
 * run of small blocks (a manager's close frees many). */
void ndm__free_many(ndm_device dev, void *const *cookies, size_t n);

/* ---- streams --------------------------------------------------------------------
 * On a device with streams (a source with events), an allocation is tied to
 * the calling thread's current stream for that device, and a block used on
 * other streams waits for their events after its free (pool.c). The CPU has
 * none: these calls cost its allocations nothing. */

/* The calling thread's current stream on `dev` (the backend's value, 0: the
 * default stream): set by the stream API, read by ndm__alloc. */
void ndm__alloc_set_stream(ndm_device dev, uintptr_t stream);
/* While the calling thread captures a device graph on dev (on), its
 * allocations on dev that reach the caching allocator fail with
 * NDM_E_UNSUPPORTED: memory a graph uses must be its plan's arena. */
void ndm__alloc_set_capturing(ndm_device dev, bool on);
/* Block `cookie` of `dev`, allocated, is used by work on `stream` too: its
 * free waits for that work. NDM_OK (also where the device has no streams,
 * or for the block's own stream), NDM_E_OOM; errors are not recorded. */
ndm_status ndm__alloc_record_stream(ndm_device dev, void *cookie, uintptr_t stream);
/* The streams besides its own that block `cookie` of `dev` was recorded on
 * (0 where the device has no streams). Takes no lock, so a caller holding a
 * manager's lock may ask; the caller keeps the block allocated meanwhile
 * (a live view of its storage). */
uint32_t ndm__alloc_stream_uses(ndm_device dev, void *cookie);

/* ---- pinned host memory ----------------------------------------------------------
 * Page-locked host memory for transfers to and from CUDA device `dev`
 * (cudaHostAlloc), cached by the same engine as device memory: a buffer
 * handed to an asynchronous copy is recorded on the copy's stream
 * (ndm__alloc_record_stream with the pinned block, through
 * ndm__pinned_record_stream) and is not reused before the copy is done.
 * For the data loader: take a buffer, fill it, queue its upload on a second
 * stream, record that stream, free it; the next batch gets another buffer
 * until the copy has passed. NDM_E_UNSUPPORTED (recorded) where the device's
 * backend has no pinned memory; then use pageable memory. */
/* The stream of host work (pinned buffers), never a device's. */
#define NDM__HOST_STREAM UINTPTR_MAX
ndm_status ndm__alloc_pinned(ndm_device dev, size_t nbytes, const ndm__alloc_tag *tag,
                             ndm__block *out);
void ndm__free_pinned(ndm_device dev, ndm__block *blk);
ndm_status ndm__pinned_record_stream(ndm_device dev, void *cookie, uintptr_t stream);
/* The statistics of the pinned pool of `dev` (zeros before its first use). */
ndm_status ndm__pinned_stats(ndm_device dev, ndm_memory_stats *out);

/* NDM_OK when `dev` can hold arrays in this build and on this machine;
 * otherwise NDM_E_UNSUPPORTED (no backend) or NDM_E_DEVICE (no such device),
 * with the reason written into why. */
ndm_status ndm__device_usable(ndm_device dev, char *why, size_t n);

/* The segment source of a device (NULL when the device has none in this build). */
const ndm__segment_source *ndm__segment_source_for(ndm_device dev);

/* ---- allocation-failure injection (test hook) ----------------------------------
 * One process-wide countdown that every allocation site of the library
 * consults: array storage, handle-table chunks and manager records, growing
 * lists (a manager's arrays, hooks, names, scope stacks), autograd graphs and
 * nodes, module/optimizer/predictor objects, and an operation's temporary
 * buffers. Armed with a set of kinds, it counts only allocations of those
 * kinds and fails the n-th one (1 = the next). Unarmed, a site pays one
 * predictable branch on a global. (C only: the CUDA sources allocate none.) */
#ifndef __cplusplus
#include <stdatomic.h>
#include <stdbool.h>

enum {
    NDM__INJ_STORAGE = 1u << 0, /* array storage: ndm__alloc */
    NDM__INJ_RECORD = 1u << 1,  /* table chunks, manager, thread and limit records */
    NDM__INJ_LIST = 1u << 2,    /* growing lists: a manager's arrays, scope stacks */
    NDM__INJ_NODE = 1u << 3,    /* autograd graphs, nodes and their tables */
    NDM__INJ_OBJECT = 1u << 4,  /* hooks, owned objects, modules, optimizers, predictors */
    NDM__INJ_SCRATCH = 1u << 5, /* an operation's temporary buffers */
    NDM__INJ_ARRAYS = 1u << 6,  /* the growth of a manager's array list (a LIST too) */
    NDM__INJ_ALL = 0x3fu,
};

extern _Atomic int64_t ndm__inject_countdown;
bool ndm__inject_take(unsigned kind);

/* True when this allocation of `kind` must fail. */
static inline bool ndm__inject(unsigned kind)
{
    return __builtin_expect(
               atomic_load_explicit(&ndm__inject_countdown, memory_order_relaxed) > 0, 0) &&
           ndm__inject_take(kind);
}

/* Arm: the n-th next allocation of one of `kinds` fails (0 disarms). Resets
 * the count of injected failures. */
void ndm__inject_fail_after(int64_t n, unsigned kinds);
/* Failures injected since the last arming, and whether the armed one is
 * still to come. */
int64_t ndm__inject_fired(void);
bool ndm__inject_pending(void);
/* The kinds of the site that took the last injected failure (0: none yet). */
unsigned ndm__inject_fired_kind(void);

/* malloc, calloc, realloc and aligned_alloc that the injection can fail. */
static inline void *ndm__malloc(size_t n, unsigned kind)
{
    return ndm__inject(kind) ? NULL : malloc(n);
}
static inline void *ndm__calloc(size_t n, size_t size, unsigned kind)
{
    return ndm__inject(kind) ? NULL : calloc(n, size);
}
static inline void *ndm__realloc(void *p, size_t n, unsigned kind)
{
    return ndm__inject(kind) ? NULL : realloc(p, n);
}
#endif

/* Test hook: make the n-th next storage allocation (1 = the next one) fail
 * with NDM_E_OOM; 0 disables. Process wide; the injection above, storage only. */
void ndm__alloc_fail_after(int64_t n);

/* The block of `cookie` (NULL: none) is now owned by manager `manager`
 * (snapshots name the owner). A relaxed store: callers may hold any lock. */
void ndm__alloc_retag(void *cookie, uint32_t manager);

/* Hooks the manager layer registers, so the allocator can name managers
 * without knowing them. The reporter writes the managers holding the most
 * bytes on a device ("system/model 40.00 MiB, ..."); the describer writes
 * the path of a manager slot. Both take the tree lock: the allocator calls
 * them with none of its locks held, never from ndm__free, and the describer
 * only while history is recorded. */
typedef void (*ndm__oom_reporter)(ndm_device dev, char *buf, size_t n);
typedef void (*ndm__manager_describer)(uint32_t slot, char *buf, size_t n);
void ndm__alloc_set_oom_reporter(ndm__oom_reporter fn);
void ndm__alloc_set_describer(ndm__manager_describer fn);

/* ---- call frames for history -------------------------------------------------
 * A public function that does its work through other public functions (a
 * layer's forward, backward, an optimizer step) pushes a frame while history
 * is recorded: its name, the site its caller gave, and where in the library
 * it runs. An allocation inside takes the calling thread's frames, so its
 * recorded stack leads from the function that allocated out to the user's
 * own line. With history off, entering costs one predictable branch. */
typedef struct ndm__call_frame {
    const char *api;       /* the public function ("ndm_module_forward") */
    const char *file;      /* the site its caller passed */
    const char *func;
    int line;
    const char *body_file; /* where in the library it runs (__FILE__, __LINE__) */
    int body_line;
} ndm__call_frame;

#ifndef __cplusplus
#include <stdatomic.h>
/* Bit 0: history is recorded; bit 1: a trace is written (relaxed reads). */
extern atomic_int ndm__instrumented;
#endif

/* The calling thread's frames, innermost last; *out stays valid until the
 * thread pushes or pops one. */
int ndm__frames_current(const ndm__call_frame **out);
/* Push a frame when history is recorded; returns whether it pushed (pass it
 * to ndm__frame_pop). A frame beyond the stack's depth is not kept. */
int ndm__frame_push_slow(const ndm__call_frame *f);
void ndm__frame_pop_slow(void);
#ifndef __cplusplus
static inline int ndm__frame_push(const char *api, const char *file, const char *func, int line,
                                  const char *body_file, int body_line)
{
    if (__builtin_expect(!(atomic_load_explicit(&ndm__instrumented, memory_order_relaxed) & 1),
                         1))
        return 0;
    ndm__call_frame f = {api, file, func, line, body_file, body_line};
    return ndm__frame_push_slow(&f);
}
static inline void ndm__frame_pop(const int *pushed)
{
    if (__builtin_expect(*pushed, 0))
        ndm__frame_pop_slow();
}
/* In a public function with a `site` (ndm__site) and an `api` name: the
 * frame lives until the enclosing block exits. */
#define NDM__CALL_FRAME(api_, site_)                                                     \
    int ndm__frame_pushed_ __attribute__((cleanup(ndm__frame_pop), unused)) =            \
        ndm__frame_push((api_), (site_).file, (site_).func, (site_).line, __FILE__, __LINE__)
#endif

#endif
