/* ndm reductions over any set of axes, and softmax. */
#ifndef NDM_REDUCE_H
#define NDM_REDUCE_H

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
