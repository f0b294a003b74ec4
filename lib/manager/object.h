/* Owned objects behind generational handles: modules, optimizers, predictors,
 * loaders.
 * An object belongs to a manager and dies with it (or earlier, when freed);
 * a stale handle is reported, never read. */
#ifndef NDM_OBJECT_INTERNAL_H
#define NDM_OBJECT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ndm/manager.h"
#include "../base/error.h"

typedef struct ndm__object_type {
    const char *name;             /* "module", "loader": used in messages */
    const char *ended;            /* how an explicit free reads: "freed", "closed" */
    void (*destroy)(void *obj);   /* frees the object (its arrays belong to managers) */
    /* destroy only frees memory, so it may run later on any thread: once
     * several threads use ndm it waits until no operation that may hold
     * the object is running (reclaim.h). Without it destroy runs at once. */
    bool later;
    /* Optional: what must happen at once when the object dies (closing what
     * it owns), before destroy, which then only frees memory. */
    void (*retire)(void *obj);
} ndm__object_type;

/* Register obj as owned by `owner`: when owner closes, destroy(obj) runs
 * (after owner's arrays are released). Returns the handle's id, or 0 with
 * an error recorded; then obj is NOT destroyed (the caller still owns it). */
uint64_t ndm__object_new(const ndm__object_type *type, ndm_manager owner, void *obj,
                         ndm__site site, const char *api);
/* The live object of that type behind id, or NULL with NDM_E_NULL,
 * NDM_E_CLOSED (naming where it was made and how it died) or NDM_E_INVALID. */
void *ndm__object_get(uint64_t id, const ndm__object_type *type, const char *api,
                      ndm__site site);
/* Is id a live object of that type? */
bool ndm__object_valid(uint64_t id, const ndm__object_type *type);
/* The manager that owns live object id (null when it is not live). */
ndm_manager ndm__object_owner(uint64_t id);
/* Destroy the object now; NDM_ALREADY when it is gone. */
ndm_status ndm__object_free(uint64_t id, const ndm__object_type *type, const char *api,
                            ndm__site site);

#endif
