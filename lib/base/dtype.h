/* dtype facts without a call, for hot paths of every layer (the public
 * ndm_dtype_size checks its argument; these do not). */
#ifndef NDM_BASE_DTYPE_H
#define NDM_BASE_DTYPE_H

#include <stdint.h>

#include "ndm/dtype.h"

/* Bytes per element, indexed by a valid dtype. */
extern const uint8_t ndm__dtype_bytes[NDM_DTYPE_COUNT];

#endif
