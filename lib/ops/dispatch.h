/* Private helpers shared by the dispatchers in lib/ops/. */
#ifndef NDM_OPS_DISPATCH_H
#define NDM_OPS_DISPATCH_H

#include "../backends/backend.h"
#include "../manager/core.h"

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

/* The backend of an array's device; records NDM_E_UNSUPPORTED when absent. */
static inline const ndm__backend *ndm__backend_of(ndm_device d, const char *api, ndm__site where)
{
    const ndm__backend *b = ndm__backend_for(d.type);
    if (!b) {
        char name[32];
        ndm__fail(NDM_E_UNSUPPORTED, api, where, "no backend for device %s in this build",
                  ndm_device_str(d, name, sizeof name));
    }
    return b;
}

/* Release a half-made result on an error path, keeping the error message. */
void ndm__discard(ndm_array a);

/* Resolve a factory's manager: the one given, NDM_CURRENT_SCOPE resolved,
 * the null handle and NDM_OUTPUT_RULE refused (null returned, error recorded). */
ndm_manager ndm__factory_manager(ndm_manager m, const char *api, ndm__site where);

#endif
