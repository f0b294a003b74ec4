/* ndm memory: the caching allocators, their statistics, limits, pressure callbacks and snapshots. */
#ifndef NDM_MEMORY_H
#define NDM_MEMORY_H

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
