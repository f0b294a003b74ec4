/* Planned managers (plan.c): the hooks the creation path and the close call.
 * A manager whose plan_run is set takes its storage through ndm__plan_alloc. */
#ifndef NDM_PLAN_INTERNAL_H
#define NDM_PLAN_INTERNAL_H

#include "core.h"

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
