// The same from C++17 without GNU extensions, through the C API and through
// ndm.hpp (installed with the package).
#include <cstdio>
#include <cstring>

#include <ndm/ndm.h>
#include <ndm/ndm.hpp>

int main()
{
    ndm_manager m = ndm_manager_new(ndm_system(), "consumer");
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 3));
    double s = 0;
    if (!a.id || ndm_item(ndm_sum(a, false, NDM_AXES(0, 1)), &s) != NDM_OK ||
        ndm_manager_close(m) != NDM_OK) {
        std::fprintf(stderr, "%s\n", ndm_last_error());
        return 1;
    }
    ndm::manager owner(ndm_system(), "consumer");
    double t = ndm::sum(ndm::ones(owner, NDM_F32, {2, 3}) * 2.0).item();
    std::printf("C++: headers %s, library %s, sum %.0f, through ndm.hpp %.0f\n",
                NDM_VERSION_STRING, ndm_version(), s, t);
    return std::strcmp(NDM_VERSION_STRING, ndm_version()) != 0 || t != 12;
}
