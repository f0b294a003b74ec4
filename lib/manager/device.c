/* Device names and counts. */
#include <stdio.h>

#include "ndm/config.h"
#include "core.h"

#if NDM_HAVE_CUDA
int ndm__cuda_count(void);
#endif

NDM_API char *ndm_device_str(ndm_device d, char *buf, size_t n)
{
    if (d.type == NDM_DEVICE_CPU && d.index == 0)
        snprintf(buf, n, "cpu");
    else if (d.type == NDM_DEVICE_CPU)
        snprintf(buf, n, "cpu:%d", d.index);
    else if (d.type == NDM_DEVICE_CUDA)
        snprintf(buf, n, "cuda:%d", d.index);
    else
        snprintf(buf, n, "device(%d,%d)", (int)d.type, d.index);
    return buf;
}

NDM_API int ndm_cuda_device_count(void)
{
#if NDM_HAVE_CUDA
    return ndm__cuda_count();
#else
    return 0;
#endif
}
