/* ndm convolution and pooling (NCHW). */
#ifndef NDM_CONV_H
#define NDM_CONV_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif

#endif
