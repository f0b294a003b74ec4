/* A helper shared by the linalg and conv dispatchers: operands converted or
 * copied into library temporaries that follow the output rule. */
#ifndef NDM_OPS_LINALG_TEMP_H
#define NDM_OPS_LINALG_TEMP_H

#include "dispatch.h"

/* A C-contiguous copy of `r` converted to `dt`, made in manager `out` on r's
 * device. The caller releases *h (ndm__discard) before returning. NULL with
 * the error recorded on failure. */
ndm__array *ndm__temp_copy(ndm__site site, const char *api, ndm_manager out, ndm__array *r,
                           ndm_dtype dt, ndm_array *h);

#endif
