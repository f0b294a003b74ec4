/* Built by CMake against the installed ndm: the headers' and the library's
 * versions, and a manager that holds nothing at the end. */
#include <stdio.h>
#include <string.h>

#include <ndm/ndm.h>

int main(void)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "consumer");
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 3));
    double s = 0;
    if (!a.id || ndm_item(ndm_sum(a, false, NDM_ALL_AXES_LIST), &s) != NDM_OK ||
        ndm_manager_close(m) != NDM_OK) {
        fprintf(stderr, "%s\n", ndm_last_error());
        return 1;
    }
    printf("C: headers %s, library %s, sum %.0f\n", NDM_VERSION_STRING, ndm_version(), s);
    return strcmp(NDM_VERSION_STRING, ndm_version()) != 0 ||
           ndm_version_number() != NDM_VERSION;
}
