/* ndm memory: the caching allocators, their statistics, limits, pressure callbacks and snapshots.
 *
 * Every device has one caching allocator. It takes large segments from the
 * device (the CPU: mmap with huge pages requested; CUDA: cudaMalloc) and
 * carves array storage out of them with PyTorch's block policy: sizes
 * rounded to 512 bytes, requests up to 1 MiB served from 2 MiB segments (the
 * small pool), larger ones from the large pool, best fit by (size, address),
 * PyTorch's split and oversize rules. A freed block goes back to the cache,
 * not to the device; ndm_memory_empty_cache returns whole free segments.
 *
 * Segments follow one of two policies. `pytorch` (the CUDA default, where a
 * cudaMalloc costs about a millisecond): 20 MiB segments for large requests
 * under 10 MiB, otherwise the request rounded to 2 MiB, and segments kept
 * until memory runs out. `compact` (the CPU default, where an mmap costs
 * microseconds): a large segment is the request rounded to 512 KiB (2 MiB at
 * least), whole free segments go back to the device before the pool maps a
 * new one, and a whole free segment at least twice a request is given back
 * and one of the request's size mapped instead of being split. On the replay
 * traces in bench/traces this keeps peak reserved memory within 10% of the
 * live bytes, where PyTorch's policy holds 21-57% more; the price is more
 * segment maps in programs whose large sizes change from step to step.
 *
 * Configuration is one string in PyTorch's grammar, `key:value,key:value`,
 * taken from NDM_ALLOC_CONF when a device's allocator is first used, or from
 * ndm_alloc_configure. An item may start with a device, which limits it to
 * that device: `cpu:memory_limit_mb:512`, `cuda:strategy:preallocate` (every
 * CUDA device), `cuda:1:max_split_size_mb:256` (CUDA device 1). Items apply
 * in order; a later one wins. Keys:
 *
 *   strategy                     auto_growth (default) | preallocate | system
 *   preallocate_fraction         (0, 1], default 0.92: with preallocate, the
 *                                share of memory_limit_mb (or, without a
 *                                limit, of the device's free memory) mapped
 *                                as one segment at first use
 *   memory_limit_mb              cap on reserved memory; 0 = none (default)
 *   max_split_size_mb            >= 20: blocks at least this large are never
 *                                split, nor handed to smaller requests
 *   max_non_split_rounding_mb    >= 20, default 20: how much larger than the
 *                                request an oversize block may be
 *   policy                       pytorch | compact: sets the three keys
 *                                below and large_segment_size_mb to that
 *                                policy's values (later items still win)
 *   release_free_segments        True (CPU default) | False (CUDA): return
 *                                whole free segments of both pools to the
 *                                device before mapping a new one
 *   segment_refit                True (CPU default) | False (CUDA): a whole
 *                                free large segment at least twice the
 *                                request is returned and one that fits is
 *                                mapped, rather than split; whole free
 *                                segments go back first as with
 *                                release_free_segments
 *   segment_round_kb             512 (CPU default) | 1024 | 2048 (CUDA):
 *                                large segments are rounded up to this
 *   large_segment_size_mb        2 to 1024, default 2 on the CPU, 20 on CUDA:
 *                                the smallest segment for requests between 1
 *                                and 10 MiB
 *   roundup_power2_divisions     n (a power of two up to 2^31), or a list like
 *                                [256:1,512:2,1024:4,>:8]: sizes below 256 MiB
 *                                use 1 division, 256-512 MiB use 2, 512 MiB to
 *                                1 GiB use 4, the rest 8 (PyTorch's documented
 *                                meaning)
 *   garbage_collection_threshold (0, 1): when reserved memory passes this
 *                                share of memory_limit_mb (or of the device's
 *                                total memory), free the oldest whole free
 *                                large segments before mapping a new one
 *   pressure_every_mb            run the pressure callbacks each time this
 *                                many MiB more have been allocated (sizes as
 *                                rounded, thread caches included); 0 = never
 *   thread_cache                 True (default) | False: keep recently freed
 *                                small blocks in a per-thread cache (never
 *                                on a device with streams: a cached block
 *                                would not know which stream freed it)
 *   expandable_segments          False (default) | True: each pool keeps,
 *                                per stream, one segment that grows in
 *                                place: a range of addresses as large as
 *                                the device (or memory_limit_mb) is
 *                                reserved, and memory is committed at its
 *                                end as requests need it (CUDA: the
 *                                driver's virtual memory management; the
 *                                CPU: mmap without access, then
 *                                mprotect). A freed block merges with its
 *                                neighbours across what were separate
 *                                segments, so large sizes that change from
 *                                step to step do not fragment.
 *                                ndm_memory_empty_cache decommits the free
 *                                end of the range (memory inside, between
 *                                live blocks, stays committed). Where the
 *                                device cannot reserve, segments are
 *                                mapped as usual.
 *   reserved_rate                [0, 1], default 0.2 \
 *   allocated_rate               [0, 1], default 0.8  > the reclaim level of
 *   allocated_reserved_rate      [0, 1], default 0.8 /  pressure events
 *                                (R torch's rates; see ndm_pressure_level)
 *
 * Unknown keys and out-of-range values are NDM_E_CONFIG, with a message that
 * names the key. The strategy `system` caches nothing: every block is its own
 * segment, so reserved memory equals what the program uses.
 *
 * Statistics follow PyTorch's keys and meaning (torch.cuda.memory_stats):
 * `allocated_bytes.all.current` and so on, each figure with current, peak,
 * allocated (sum of increases) and freed (sum of decreases), over all pools,
 * the small pool and the large pool. A block held in a per-thread cache is
 * free: it counts as inactive (an inactive split block), not as allocated,
 * as a freed block waiting in PyTorch's pool does; only its merge with free
 * neighbours waits until the cache gives it back. The figures are exact,
 * peaks included: a thread cache moves them only within the headroom below
 * each peak that it was granted under the allocator's lock.
 *
 * Pressure: callbacks registered with ndm_on_pressure run every
 * pressure_every_mb allocated and when a device cannot provide memory. They
 * may release arrays and close managers; the event's level says whether a
 * light or a full reclaim is due. After them the allocator searches
 * again, then frees every cached free segment and retries, then fails with
 * NDM_E_OOM and a message that gives the request, what is allocated,
 * reserved, free and limited, the largest free block, and the managers that
 * hold the most bytes on the device.
 *
 * Streams (see stream.h): on a device with streams, a block is tied to the
 * stream it was allocated on (the calling thread's current stream) and a
 * freed block is reused only by allocations on that stream, which runs in
 * order. A block also used on other streams (ndm_array_record_stream) is
 * held after its free until events recorded on those streams complete;
 * the allocator looks at them when it next needs a block it does not have
 * (never on the CPU's fast path), and ndm_memory_empty_cache waits for
 * them. While held, a block counts as active, not allocated.
 *
 * Thread rules: every function is thread-safe. Pressure callbacks run on the
 * thread whose allocation needs memory, with no ndm lock held; a callback that
 * allocates does not trigger callbacks again.
 */
#ifndef NDM_MEMORY_H
#define NDM_MEMORY_H

#include <stdio.h>

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Which blocks a figure covers (PyTorch's StatType). */
typedef enum ndm_memory_pool {
    NDM_POOL_ALL = 0,   /**< every block */
    NDM_POOL_SMALL = 1, /**< blocks of at most 1 MiB, in 2 MiB segments */
    NDM_POOL_LARGE = 2, /**< larger blocks */
    NDM_POOL_COUNT = 3, /**< the number of pools (array sizes) */
} ndm_memory_pool;

/** One figure: its value now, its highest value since the last peak reset,
 *  and the sums of its increases and decreases since the last reset of
 *  accumulated figures. */
typedef struct ndm_memory_stat {
    int64_t current, peak, allocated, freed;
} ndm_memory_stat;
/** @var ndm_memory_stat::current
 *  The value now. */
/** @var ndm_memory_stat::peak
 *  The highest value since the last peak reset. */
/** @var ndm_memory_stat::allocated
 *  The sum of its increases since the last reset. */
/** @var ndm_memory_stat::freed
 *  The sum of its decreases since the last reset. */

/** A device's allocator statistics; arrays are indexed by ndm_memory_pool. */
typedef struct ndm_memory_stats {
    ndm_memory_stat allocation[NDM_POOL_COUNT];           /**< live blocks */
    ndm_memory_stat segment[NDM_POOL_COUNT];              /**< segments held from the device */
    ndm_memory_stat active[NDM_POOL_COUNT];               /**< allocated or awaiting a free */
    ndm_memory_stat inactive_split[NDM_POOL_COUNT];       /**< free blocks inside split segments */
    ndm_memory_stat allocated_bytes[NDM_POOL_COUNT];      /**< bytes of live blocks (rounded) */
    ndm_memory_stat reserved_bytes[NDM_POOL_COUNT];       /**< bytes of segments */
    ndm_memory_stat active_bytes[NDM_POOL_COUNT];         /**< bytes of active blocks */
    ndm_memory_stat inactive_split_bytes[NDM_POOL_COUNT]; /**< cannot be returned to the device */
    ndm_memory_stat requested_bytes[NDM_POOL_COUNT];      /**< bytes the callers asked for */
    ndm_memory_stat oversize_allocations;                 /**< blocks >= max_split_size */
    ndm_memory_stat oversize_segments;                    /**< segments >= max_split_size */
    int64_t num_alloc_retries;    /**< allocations retried after freeing the cache */
    int64_t num_ooms;             /**< allocations that failed with NDM_E_OOM */
    int64_t num_sync_all_streams; /**< cache flushes */
    int64_t num_device_alloc;     /**< segments mapped */
    int64_t num_device_free;      /**< segments unmapped */
    int64_t num_pressure_calls;   /**< times the pressure callbacks ran */
    int64_t max_split_size;       /**< bytes; -1 when unlimited */
    int64_t memory_limit;         /**< bytes; 0 when unlimited */
    int64_t largest_free_block;   /**< largest cached free block, bytes */
    int64_t free_bytes;           /**< reserved - allocated */
    double fragmentation;         /**< (free - largest free) / free; 0 when nothing is free */
    int64_t device_free, device_total;
    /** Allocations a thread's own cache served, without the pool's lock
     *  (a part of allocation[].allocated; what the pool served is the rest;
     *  zeroed by ndm_memory_reset_accumulated_stats()). */
    int64_t num_thread_cache_allocs;
} ndm_memory_stats;
/** @var ndm_memory_stats::device_free
 *  Free memory as the device reports it (0 when unknown). */
/** @var ndm_memory_stats::device_total
 *  Total memory as the device reports it (0 when unknown). */

/** Fill *out with the statistics of the allocator of `device` (zeros when it
 *  has not been used). NDM_E_DEVICE / NDM_E_UNSUPPORTED for a device this
 *  build or machine does not have. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_stats_get(ndm_device device, ndm_memory_stats *out);

/** One figure by its PyTorch key, e.g. "allocated_bytes.all.current",
 *  "reserved_bytes.large_pool.peak", "num_ooms", "oversize_segments.current",
 *  and ndm's "largest_free_block", "free_bytes", "memory_limit".
 *  NDM_E_INVALID for an unknown key. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_stat_get(ndm_device device, const char *key,
                                                     int64_t *out);

/** @name Per-device maintenance
 *  Each returns NDM_OK, or NDM_E_DEVICE / NDM_E_UNSUPPORTED for a device
 *  this build or machine does not have (ndm_memory_summary also
 *  NDM_E_INVALID for a NULL f). */
/** @{ */
/** Set every peak to its current value. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_reset_peak_stats(ndm_device device);
/** Zero the allocated/freed sums and the event counters. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_reset_accumulated_stats(ndm_device device);

/** Return every whole free segment to the device (blocks in use stay). */
NDM_API NDM_NODISCARD ndm_status ndm_memory_empty_cache(ndm_device device);

/** Print PyTorch's summary table for `device`, then the fragmentation
 *  figures and the effective settings. */
NDM_API ndm_status ndm_memory_summary(ndm_device device, FILE *f);
/** @} */

/** Configure the allocator of `device` from `conf` (grammar above): the
 *  defaults, then `conf`; items for other devices are checked and skipped.
 *  Cached free segments are returned first; live blocks are not moved.
 *  Returns NDM_OK. Owner: nothing is made; conf stays the caller's (ndm
 *  keeps a copy of what it needs). Errors: NDM_E_CONFIG (nothing changed)
 *  with a message naming the bad key or value; NDM_E_DEVICE /
 *  NDM_E_UNSUPPORTED for a device this build or machine does not have. */
#define ndm_alloc_configure(device, conf) ndm_alloc_configure_at(NDM_HERE, (device), (conf))
/** ndm_alloc_configure() with an explicit call site (the macro passes
 *  NDM_HERE). Returns NDM_OK. Owner: conf stays the caller's. Errors:
 *  NDM_E_CONFIG, NDM_E_DEVICE, NDM_E_UNSUPPORTED as for
 *  ndm_alloc_configure(). */
NDM_API NDM_NODISCARD ndm_status ndm_alloc_configure_at(NDM_SITE_PARAMS, ndm_device device,
                                                        const char *conf);

/** Write the effective settings of `device` ("strategy:auto_growth,...") into
 *  buf; returns the length they need (like snprintf), or -1 on a device this
 *  build or machine lacks (NDM_E_DEVICE or NDM_E_UNSUPPORTED recorded). */
NDM_API int ndm_alloc_settings(ndm_device device, char *buf, size_t n);

/** Why the pressure callbacks run. */
typedef enum ndm_pressure_reason {
    NDM_PRESSURE_PERIODIC = 0, /**< another pressure_every_mb allocated */
    NDM_PRESSURE_FAILED = 1,   /**< the device could not provide a segment */
} ndm_pressure_reason;

/** How much a pressure callback should reclaim (R torch's levels). The
 *  allocator decides from the figures and three rates of its settings
 *  (total = the device's memory, or memory_limit_mb when set):
 *  reserved / total < reserved_rate: NDM_RECLAIM_NONE (nothing is due; the
 *  callbacks still run, told so, and may ignore it); otherwise
 *  allocated / total > allocated_rate, or allocated / reserved >
 *  allocated_reserved_rate: NDM_RECLAIM_FULL (release everything that can
 *  go); otherwise NDM_RECLAIM_LIGHT (release what is cheap to find). */
typedef enum ndm_pressure_level {
    NDM_RECLAIM_NONE = 0,
    NDM_RECLAIM_LIGHT = 1,
    NDM_RECLAIM_FULL = 2,
} ndm_pressure_level;

/** What a pressure callback is told. */
typedef struct ndm_pressure_event {
    ndm_device device;          /**< the allocator's device */
    ndm_pressure_reason reason; /**< why it runs */
    size_t request;     /**< bytes asked for by the allocation that triggered it */
    int64_t allocated;  /**< allocated_bytes.all.current */
    int64_t reserved;   /**< reserved_bytes.all.current */
    ndm_pressure_level level; /**< how much to reclaim (see ndm_pressure_level) */
} ndm_pressure_event;

/** The reclaim level the allocator of `device` would name now, by the rates
 *  above; NDM_RECLAIM_NONE for a device this build or machine lacks
 *  (NDM_E_DEVICE or NDM_E_UNSUPPORTED recorded). */
NDM_API ndm_pressure_level ndm_memory_pressure_level(ndm_device device);

/** A pressure callback: ev is valid during the call; ud as registered. */
typedef void (*ndm_pressure_fn)(const ndm_pressure_event *ev, void *ud);

/** Register a pressure callback (called in registration order). NDM_OK;
 *  the same (fn, ud) twice is NDM_ALREADY; NDM_E_INVALID for a NULL fn,
 *  NDM_E_OOM. */
NDM_API NDM_NODISCARD ndm_status ndm_on_pressure(ndm_pressure_fn fn, void *ud);
/** Unregister it: NDM_OK, or NDM_ALREADY when it was not registered; never
 *  fails. */
NDM_API NDM_NODISCARD ndm_status ndm_pressure_remove(ndm_pressure_fn fn, void *ud);

/** Start (on) or stop recording allocator events on every device: a ring of
 *  the last max_entries (0: 100000) per device with time, size, manager path
 *  and call frames. Stopping clears the ring. While recording, every
 *  allocation takes the shared path (the thread caches are bypassed).
 *
 *  The frames of an event run innermost first, as PyTorch's do: the public
 *  function that allocated (file "??", line 0: ndm does not track its own
 *  lines), then each enclosing public function that works through others
 *  (ndm_forward, ndm_predict, ndm_backward, the losses) at its place in the
 *  library, then the user's function at the line that called into ndm. A
 *  segment event carries the frames of the allocation that mapped or
 *  unmapped it. Functions that take no call site (ndm_optimizer_step) end
 *  their stacks inside the library. File names are relative to the source
 *  root (a build directory's "../" and the working directory are dropped).
 *  With history off, frames cost one predictable branch per enclosing call.
 *  NDM_E_OVERFLOW when max_entries events overflow the ring's byte size,
 *  NDM_E_OOM when a ring cannot be allocated: on either error the previous
 *  recording (on or off, and its events) is left as it was. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_record_history(bool on, size_t max_entries);

/** Write the segments, blocks and recorded events of every device used so far
 *  as PyTorch's memory snapshot: a pickle (protocol 2, the opcodes PyTorch's
 *  web viewer decodes) when path ends in ".pickle", so that
 *  `python -m torch.cuda._memory_viz` and the viewer open it unchanged, and
 *  the same tree as JSON otherwise (ndm-memviz reads both).
 *
 *  The tree has PyTorch's keys: "segments" (each with an integer "device",
 *  an index into "device_traces", and ndm's "device_name"; blocks with
 *  "frames", "manager" and "category"), "device_traces" (events with
 *  "action", "addr" or, for "oom", "device_free", "size", "stream",
 *  Unix-epoch "time_us", "frames", the manager path as "user_metadata" and
 *  "manager", and the manager under system as "category": "model", "data",
 *  or "unknown" for events of no manager), "allocator_settings" (PyTorch's
 *  keys from the first device's settings, ndm's own per device under
 *  "ndm"), "external_annotations" (empty) and ndm's "devices" (the name of
 *  each index). The last event of each device is the dump's own "snapshot"
 *  entry, whose size is the bytes of allocated blocks. Each device's
 *  segments and events are copied under one hold of its allocator's lock,
 *  so replaying the events backwards from the segments is exact even while
 *  other threads allocate.
 *  NDM_E_IO when the file cannot be written. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_dump_snapshot(const char *path);

/** Start writing an allocator-independent trace of every allocation and free
 *  on every device to `path` (text: "seq t_us thread device op id size"
 *  lines; bench/alloc_replay replays it); NULL stops and closes the file.
 *  Setting NDM_ALLOC_TRACE=path in the environment starts it at first use.
 *  While tracing, every allocation takes the shared path. Returns NDM_OK, or
 *  NDM_E_IO when the file cannot be opened. */
NDM_API NDM_NODISCARD ndm_status ndm_memory_record_trace(const char *path);

#ifdef __cplusplus
}
#endif

#endif
