/* A program that exits with a manager and an array still alive, for the
 * exit-time leak report (run by the debug suite with NDM_LEAK_REPORT set).
 * It prints the lines that made them on stdout so the suite can look for
 * those lines in the report on stderr. */
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
    printf("manager %d\narray %d\n", mline, aline);
    return 0;
}
