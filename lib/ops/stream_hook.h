/* The stream dispatcher's private side: a stream's backend value (what the
 * allocator's record calls take, for the data loader's pinned buffers), and
 * a test hook that holds a stream's work back on a device that can be told
 * so (the CUDA stand-in), to test waits without timing. */
#ifndef NDM_OPS_STREAM_HOOK_H
#define NDM_OPS_STREAM_HOOK_H

#include <stdbool.h>
#include <stdint.h>

#include "ndm/stream.h"

/* While held, events recorded on s stay pending; releasing runs its work.
 * NDM_E_UNSUPPORTED where the backend has no such hook (a real GPU, the
 * CPU), NDM_E_CLOSED/NDM_E_INVALID for a bad handle. */
ndm_status ndm__stream_hold(ndm_stream s, bool on);

/* The device of s and its backend value (0: the default stream, or the
 * CPU's), as ndm__pinned_record_stream and ndm__alloc_record_stream take
 * it. Errors as every stream call (recorded). */
ndm_status ndm__stream_value(ndm_stream s, ndm_device *dev, uintptr_t *value);

#endif
