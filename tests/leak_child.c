/* A program that exits with a manager and an array still alive, for the
 * exit-time leak report (run by the debug suite with NDM_LEAK_REPORT set).
 * It prints the lines that made them on stdout so the suite can look for
 * those lines in the report on stderr; one line makes 320 arrays. */
#include <stdio.h>

#include "ndm/ndm.h"

int main(void)
{
    int mline = __LINE__; ndm_manager m = ndm_manager_new(ndm_system(), "leaky");
    int aline = __LINE__; ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    if (!m.id || !a.id) {
        fprintf(stderr, "leak_child: %s\n", ndm_last_error());
        return 2;
    }
    /* one leak site met 320 times: the report groups it on one line */
    int lline = 0;
    for (int i = 0; i < 320; i++) {
        lline = __LINE__; ndm_array b = ndm_zeros(m, NDM_I32, NDM_SHAPE(4));
        if (!b.id) {
            fprintf(stderr, "leak_child: %s\n", ndm_last_error());
            return 2;
        }
    }
    printf("manager %d\narray %d\nloop %d\n", mline, aline, lline);
    return 0;
}
