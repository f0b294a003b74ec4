/* The backend registry: the table of each device type. The CPU's is built
 * in; the CUDA backend is a module, loaded on first use of a CUDA device. */
#ifndef NDM_REGISTRY_H
#define NDM_REGISTRY_H

#include <stdatomic.h>

#include "backend.h"

/* The backend of a device type, or NULL when it has none (not built, or its
 * module could not be loaded: ndm__backend_unavailable says why). The CPU's
 * is a direct table pointer; a module is loaded by the first call for its
 * type, once per process, whichever thread asks first. */
const ndm__backend *ndm__backend_for(ndm_device_type type);

/* ndm__backend_for with the CPU's case inline, for the dispatchers' fast
 * paths (the reference table while ndm__cpu_force_reference holds). */
extern atomic_bool ndm__cpu_reference_forced;
static inline const ndm__backend *ndm__backend_for_inline(ndm_device_type type)
{
    if (type == NDM_DEVICE_CPU)
        return atomic_load_explicit(&ndm__cpu_reference_forced, memory_order_relaxed)
                   ? &ndm__cpu_ref_backend
                   : &ndm__cpu_backend;
    return ndm__backend_for(type);
}

/* Why `type` has no backend: a sentence naming what was looked for, where,
 * and why each attempt failed; "" when it has one. Loads as
 * ndm__backend_for does. The text lives as long as the process. */
const char *ndm__backend_unavailable(ndm_device_type type);

/* Devices of `type` on this machine: 1 for the CPU, 0 for a type without a
 * backend. Loads as ndm__backend_for does. */
int ndm__backend_device_count(ndm_device_type type);

/* What device `dev` is. NDM_E_UNSUPPORTED (no backend) or NDM_E_DEVICE (no
 * such device) with the error recorded. */
ndm_status ndm__backend_device_props(ndm_device dev, ndm__device_props *out);

/* Record NDM_E_UNSUPPORTED for `api` when `b` declines case `c` on `dev`
 * (the message names the op, its dtypes and the device) and return true;
 * false when it runs it. Dispatchers reach it through NDM__BACKEND_DECLINES,
 * which tests b->supports first. */
bool ndm__backend_declines(const ndm__backend *b, ndm_device dev, const ndm__op_case *c,
                           const char *api, const char *file, const char *func, int line);

/* Test hook: serve `type` (not the CPU) with table `b` in place of its
 * module, as if the module had given it. Before the type's first use only.
 * NDM_E_INVALID (recorded) for a table of another ABI or missing members. */
ndm_status ndm__backend_register(const ndm__backend *b);

#endif
