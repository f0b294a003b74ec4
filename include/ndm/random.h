/* ndm random numbers from a seeded counter-based generator. */
#ifndef NDM_RANDOM_H
#define NDM_RANDOM_H

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
