/* Private helpers shared by the dispatchers in lib/ops/. */
#ifndef NDM_OPS_DISPATCH_H
#define NDM_OPS_DISPATCH_H

/* The public declarations this layer defines (the manager core names only
 * its own), so every definition is checked against its prototype. */
#include "ndm/autograd.h"
#include "ndm/conv.h"
#include "ndm/elementwise.h"
#include "ndm/index.h"
#include "ndm/linalg.h"
#include "ndm/random.h"
#include "ndm/reduce.h"
#include "ndm/transfer.h"
#include "../backends/registry.h"
#include "../manager/core.h"
#include "../manager/reclaim.h"
#include "inner.h"

/* The operation context kernel scratch is charged to (backend.h, "kernel
 * scratch"): a dispatcher whose kernels may take scratch brackets the
 * kernel call with push and pop, the context on its stack; others pay
 * nothing. */
typedef struct ndm__op_context {
    const ndm__scratch_provider *provider; /* first: all that backends read */
    ndm_manager out; /* the output manager */
    const char *api; /* the public function */
    ndm__site site;  /* its caller's line */
} ndm__op_context;

/* The provider of every context (lib/ops/scratch.c). */
extern const ndm__scratch_provider ndm__op_scratch;

static inline const ndm__op_context *ndm__op_context_push(const ndm__op_context *c)
{
    const ndm__op_context *prev = ndm__op_context_current;
    ndm__op_context_current = c;
    return prev;
}
static inline void ndm__op_context_pop(const ndm__op_context *prev)
{
    ndm__op_context_current = prev;
}
/* Run the statement (a kernel call) under the context of the operation
 * `api` called at `site` with output manager `out` (a handle; 0: charge no
 * manager, only name the operation). */
#define NDM__WITH_OP_CONTEXT(out_, api_, site_, ...)                                    \
    do {                                                                                \
        const ndm__op_context ndm__oc_ = {&ndm__op_scratch, (out_), (api_), (site_)};   \
        const ndm__op_context *ndm__oc_prev_ = ndm__op_context_push(&ndm__oc_);         \
        __VA_ARGS__;                                                                    \
        ndm__op_context_pop(ndm__oc_prev_);                                             \
    } while (0)

/* The kernel view of an array record. */
static inline ndm__tensor ndm__tensor_of(const ndm__array *r)
{
    return (ndm__tensor){ndm__array_ptr(r), r->dtype, r->ndim, r->shape, r->strides};
}

/* The start of a one-input operation: a's record (a null or stale handle
 * keeps the first error) and, in *out, the output manager by the output
 * rule; NULL with the error recorded. */
static inline ndm__array *ndm__input(ndm_array a, ndm_manager *out, const char *api,
                                     ndm__site site)
{
    ndm__array *r = ndm__array_get_prop(a, api, site);
    if (!r)
        return NULL;
    *out = ndm__output_manager(*out, r, api, site);
    return out->id ? r : NULL;
}

/* The backend of an array's device; records NDM_E_UNSUPPORTED when absent,
 * with the registry's reason (a module that could not be loaded). */
static inline const ndm__backend *ndm__backend_of(ndm_device d, const char *api, ndm__site where)
{
    const ndm__backend *b = ndm__backend_for(d.type);
    if (!b) {
        char name[32];
        ndm__fail(NDM_E_UNSUPPORTED, api, where, "no backend for device %s: %s",
                  ndm_device_str(d, name, sizeof name), ndm__backend_unavailable(d.type));
    }
    return b;
}

/* True, with NDM_E_UNSUPPORTED recorded, when backend b declines to run a
 * case on device dev: the arguments after `where` initialise an ndm__op_case
 * (family, op, name, layout, ndtypes, {dtypes}). A backend that runs
 * everything has no supports member: the case is not even built. */
#define NDM__BACKEND_DECLINES(b, dev, api, where, ...)                          \
    (NDM__UNLIKELY((b)->supports != NULL) &&                                    \
     ndm__backend_declines((b), (dev), &(const ndm__op_case){__VA_ARGS__}, (api), (where).file, \
                           (where).func, (where).line))

/* The layout bits of an operand for ndm__op_case. */
static inline unsigned ndm__layout_of(const ndm__array *r)
{
    unsigned l = 0;
    int64_t want = 1;
    for (int i = r->ndim - 1; i >= 0; i--) {
        if (r->shape[i] == 0)
            l |= NDM__LAYOUT_EMPTY;
        if (r->shape[i] != 1 && r->strides[i] != want)
            l |= r->strides[i] == 0 ? NDM__LAYOUT_BROADCAST : NDM__LAYOUT_STRIDED;
        want *= r->shape[i];
    }
    return l;
}

/* The inner interface's view of record r (inner.h). */
void ndm__view_fill(const ndm__array *r, ndm__view *v);

/* (ndm__discard and ndm__factory_manager: inner.h.) */

/* n contiguous bytes between dptr on device dev (of backend b) and host
 * memory, to the host when `to_host`: the host leg of every transfer,
 * staged through dev's pinned pool when it has one (inner.c). Errors are
 * the backend's, not recorded here. */
ndm_status ndm__bytes_move(const ndm__backend *b, ndm_device dev, void *dptr, void *host, size_t n,
                           bool to_host);

#endif
