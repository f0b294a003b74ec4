/* ndm elementwise math: arithmetic with numpy broadcasting, comparisons, logic, where, unary functions, casts. */
#ifndef NDM_ELEMENTWISE_H
#define NDM_ELEMENTWISE_H

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
