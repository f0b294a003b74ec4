/* The segment source: how the caching allocator maps large ranges of one
 * device's memory. A leaf: backends fill it, the allocator carves blocks. */
#ifndef NDM_SEGMENT_H
#define NDM_SEGMENT_H

#include <stddef.h>

#include "ndm/status.h"

/* A segment source maps large ranges of device memory; the allocator carves
 * blocks out of them. */
typedef struct ndm__segment_source {
    const char *name;
    /* required: map `size` bytes (a multiple of the source's granularity) */
    ndm_status (*map)(void *ctx, size_t size, void **out);
    /* required: unmap a range returned by map */
    void (*unmap)(void *ctx, void *ptr, size_t size);
    /* optional: free and total bytes of the device; default: unknown (0, 0) */
    ndm_status (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    void *ctx;
} ndm__segment_source;

#endif
