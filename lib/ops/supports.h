/* The backend's supports table asked by a dispatcher that holds the device,
 * not the backend table (elementwise, reductions, index, nn, random). */
#ifndef NDM_OPS_SUPPORTS_H
#define NDM_OPS_SUPPORTS_H

#include <stdbool.h>

#include "../backends/registry.h"
#include "../base/compiler.h"
#include "../base/error.h"

/* As NDM__BACKEND_DECLINES: true, with NDM_E_UNSUPPORTED recorded (the
 * message names the op, its dtypes and the device), when the backend of dev
 * declines the case the arguments after `where` initialise (family, op,
 * name, layout, ndtypes, {dtypes}). The CPU's tables have no supports member
 * (the conformance suite asserts it), so an operation on the CPU pays one
 * test of its device type and the case is never built. */
#define NDM__DEVICE_DECLINES(dev, api, where, ...)                                \
    (NDM__UNLIKELY((dev).type != NDM_DEVICE_CPU) &&                               \
     ndm__device_declines((dev), (api), (where), &(const ndm__op_case){__VA_ARGS__}))

static inline bool ndm__device_declines(ndm_device dev, const char *api, ndm__site where,
                                        const ndm__op_case *c)
{
    const ndm__backend *b = ndm__backend_for(dev.type);
    return b && b->supports &&
           ndm__backend_declines(b, dev, c, api, where.file, where.func, where.line);
}

/* For a fused path with a fallback: does backend b (on dev) run the case?
 * Asks nothing and records nothing when b has no supports member. */
#define NDM__BACKEND_RUNS(b, dev, ...)                                            \
    (NDM__LIKELY((b)->supports == NULL) ||                                        \
     (b)->supports((dev).index, &(const ndm__op_case){__VA_ARGS__}))

#endif
