/* The segment source: how the caching allocator maps large ranges of one
 * device's memory. A leaf: backends fill it, the allocator carves blocks. */
#ifndef NDM_SEGMENT_H
#define NDM_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "ndm/device.h"
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

    /* Streams (optional, all four or none). A source whose device runs work
     * asynchronously on streams says when a stream has passed a point: the
     * allocator records an event on each stream that used a freed block and
     * reuses the block only once every event is complete. A stream is the
     * backend's own value, 0 for the device's default stream. Without them
     * (the CPU), work is done when its call returns and a freed block is
     * reusable at once by anyone. */
    /* record an event on `stream` now; *event is released by event_release */
    ndm_status (*event_record)(void *ctx, uintptr_t stream, void **event);
    /* 1: every work queued before the record is done; 0: not yet; < 0: error */
    int (*event_query)(void *ctx, void *event);
    /* wait until the event is complete */
    ndm_status (*event_sync)(void *ctx, void *event);
    void (*event_release)(void *ctx, void *event);

    /* Expandable segments (optional, all four or none): reserve a range of
     * addresses with nothing behind it, then commit and decommit memory in
     * place inside it, in multiples of commit_granularity bytes at offsets
     * that are multiples of it. */
    ndm_status (*reserve)(void *ctx, size_t size, void **out);
    void (*unreserve)(void *ctx, void *ptr, size_t size);
    ndm_status (*commit)(void *ctx, void *ptr, size_t size);
    void (*decommit)(void *ctx, void *ptr, size_t size);
    size_t commit_granularity; /* 0: 2 MiB */
    void *ctx;
} ndm__segment_source;

/* The memory of the devices of one type other than the CPU, as the layer
 * that knows them (the backend registry) offers it to the allocator, which
 * declares no function of any backend: both meet here. usable answers
 * NDM_OK when device `index` exists and can hold memory, otherwise
 * NDM_E_UNSUPPORTED (no backend for the type) or NDM_E_DEVICE (no such
 * device) with the reason in why; it may load a backend on first use.
 * source gives the device's segment source (NULL when none). */
typedef struct ndm__device_memory {
    ndm_status (*usable)(int index, char *why, size_t n);
    const ndm__segment_source *(*source)(int index);
    /* page-locked host memory for transfers to and from device `index`
     * (NULL, or a NULL result: none) */
    const ndm__segment_source *(*pinned_source)(int index);
} ndm__device_memory;

/* Registered when the library is loaded, before any allocation can ask. */
void ndm__device_memory_register(ndm_device_type type, const ndm__device_memory *m);
/* What was registered for `type`; NULL when nothing was (no backend). */
const ndm__device_memory *ndm__device_memory_of(ndm_device_type type);

#endif
