// Compiled, not run: ndm's headers and literal macros in standard C++17
// (-pedantic-errors, no GNU extensions), and NDM_NODISCARD silenced by a cast.
#include "ndm/ndm.h"

int ndm_header_use_cpp(ndm_manager m, ndm_array a);
int ndm_header_use_cpp(ndm_manager m, ndm_array a)
{
    ndm_array z = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array s = ndm_sum(z, false, NDM_AXES(0, -1));
    ndm_array c = ndm_concat(0, NDM_ARRAYS(a, z));
    ndm_manager n = ndm_manager_new_on(m, "child", NDM_CPU);
    ndm_array none = NDM_NULL_ARRAY;
    (void)ndm_manager_cap(m, NDM_CAP_ARRAYS);
    (void)ndm_manager_close(n);
    {
        NDM_AUTO ndm_manager req = ndm_manager_new(m, "request");
        (void)req;
    }
    return (int)(s.id + c.id + none.id) + (NDM_VERSION >= NDM_VERSION_NUMBER(0, 1, 0));
}
