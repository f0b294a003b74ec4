/* Planned managers (plan.c): the hooks the creation path and the close call.
 * A manager whose plan_run is set takes its storage through ndm__plan_alloc. */
#ifndef NDM_PLAN_INTERNAL_H
#define NDM_PLAN_INTERNAL_H

#include "core.h"
#include "ndm/plan.h"

struct ndm__plan_run;

/* Storage for a planned manager's array or scratch: the next planned block
 * of the arena when it fits, else the caching allocator (counted), as
 * ndm__alloc would answer. */
ndm_status ndm__plan_alloc(struct ndm__plan_run *run, ndm_device dev, size_t nbytes,
                           const ndm__alloc_tag *tag, ndm__block *out);
/* One more manager (a child of a planned one) takes part in run's step. */
void ndm__plan_run_share(struct ndm__plan_run *run);
/* m's close, its arrays drained: m serves no more creations; its run ends
 * once its last block is freed (then a recorded step becomes a plan). */
void ndm__plan_seal(ndm__manager *m);

/* Device graphs (lib/ops/graph.c). While on, the allocations of planned
 * manager `step`'s run that its arena does not serve fail (NDM_E_UNSUPPORTED)
 * instead of falling back; *arena_bytes (optional): its arena's size.
 * NDM_E_INVALID (nothing recorded) when step is not planned, or (on) not
 * a replay with an arena. */
ndm_status ndm__plan_capture(ndm_manager step, bool on, size_t *arena_bytes);
/* 1 when a plan of `signature` on `dev` is cached in plan h, 0 when not,
 * the (recorded) error of a bad handle. */
int ndm__plan_cached(ndm_plan h, uint64_t signature, ndm_device dev, const char *api,
                     ndm__site site);
/* The arena of step's run is used by work on `stream` (0: the default,
 * nothing to do): its free waits for that stream. */
ndm_status ndm__plan_arena_record_stream(ndm_manager step, uintptr_t stream);

/* The storage of an array or scratch charged to m. */
static NDM__ALWAYS_INLINE ndm_status ndm__storage_alloc(ndm__manager *m, ndm_device dev,
                                                        size_t nbytes, const ndm__alloc_tag *tag,
                                                        ndm__block *out)
{
    struct ndm__plan_run *run = atomic_load_explicit(&m->plan_run, memory_order_relaxed);
    if (NDM__UNLIKELY(run != NULL))
        return ndm__plan_alloc(run, dev, nbytes, tag, out);
    return ndm__alloc(dev, nbytes, tag, out);
}

#endif
