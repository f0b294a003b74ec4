/* DLPack without its header at build time: the same API, every call
 * answering NDM_E_UNSUPPORTED. */
#include "../base/error.h"
#include "ndm/dlpack.h"
#include "ndm/ndm.h"

#define NO_DLPACK "built without the DLPack header (dlpack/dlpack.h)"

NDM_API struct DLManagedTensor *ndm_to_dlpack_at(NDM_SITE_PARAMS, ndm_array a)
{
    (void)a;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_to_dlpack", NDM__SITE, NO_DLPACK);
    return NULL;
}

NDM_API struct DLManagedTensorVersioned *ndm_to_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_array a)
{
    (void)a;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_to_dlpack_versioned", NDM__SITE, NO_DLPACK);
    return NULL;
}

NDM_API ndm_array ndm_from_dlpack_at(NDM_SITE_PARAMS, ndm_manager m, struct DLManagedTensor *t)
{
    (void)m;
    (void)t;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_from_dlpack", NDM__SITE, NO_DLPACK);
    return NDM_NULL_ARRAY;
}

NDM_API ndm_array ndm_from_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_manager m,
                                               struct DLManagedTensorVersioned *t)
{
    (void)m;
    (void)t;
    ndm__fail(NDM_E_UNSUPPORTED, "ndm_from_dlpack_versioned", NDM__SITE, NO_DLPACK);
    return NDM_NULL_ARRAY;
}
