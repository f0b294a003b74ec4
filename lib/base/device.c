/* Device names (their counts come from the backend registry). */
#include <stdio.h>

#include "ndm/base.h"
#include "ndm/device.h"

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
