/* ndm shape and indexing operations: concat, stack, split, gather, scatter, pad, flip, tile, repeat, cumsum. */
#ifndef NDM_INDEX_H
#define NDM_INDEX_H

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
