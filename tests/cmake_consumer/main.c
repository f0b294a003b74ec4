/* Built by CMake against the installed ndm: the headers' and the library's
 * versions, a manager that holds nothing at the end, and whether the CUDA
 * module was found beside the library. */
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
    /* The CUDA backend is a module beside the library: found, it answers for
     * cuda:0 (a manager, or "does not exist" without a GPU); not found, the
     * device type has no backend. */
    ndm_manager g = ndm_manager_new_on(ndm_system(), "gpu", NDM_CUDA(0));
    if (g.id)
        printf("cuda: backend loaded, %d device(s)\n", ndm_cuda_device_count());
    else
        printf("cuda: %s (%s)\n",
               ndm_last_status() == NDM_E_UNSUPPORTED ? "no backend" : "backend loaded",
               ndm_last_error());
    if (g.id && ndm_manager_close(g) != NDM_OK)
        return 1;
    return strcmp(NDM_VERSION_STRING, ndm_version()) != 0 ||
           ndm_version_number() != NDM_VERSION;
}
