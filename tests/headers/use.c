/* Compiled, not run: NDM_NODISCARD is silenced by a (void) cast and not
 * attached to printing functions, under -std=c11 -pedantic -Werror. */
#include <stdio.h>

#include "ndm/ndm.h"

int ndm_header_use_c(ndm_manager m, ndm_array a);
int ndm_header_use_c(ndm_manager m, ndm_array a)
{
    (void)ndm_manager_cap(m, NDM_CAP_ARRAYS);
    (void)ndm_manager_uncap(m, NDM_CAP_ARRAYS);
    ndm_debug_dump(m, stdout);
    ndm_array_print(a, stdout);
    ndm_report_since(m, ndm_mark(m), stdout);
    {
        NDM_AUTO ndm_manager req = ndm_manager_new(m, "request");
        NDM_AUTO ndm_array x = ndm_zeros(req, NDM_F32, NDM_SHAPE(2));
        (void)x;
    }
    return NDM_VERSION >= NDM_VERSION_NUMBER(0, 1, 0);
}
