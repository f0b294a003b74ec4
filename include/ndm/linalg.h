/* ndm linear algebra: matmul with numpy.matmul semantics, dot, outer. */
#ifndef NDM_LINALG_H
#define NDM_LINALG_H

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
