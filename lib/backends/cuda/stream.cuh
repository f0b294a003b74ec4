/* The CUDA module's streams, events and memory sources, as the rest of the
 * module reaches them: the thread's current stream, pooled events, tables. */
#ifndef NDM_CUDA_STREAM_CUH
#define NDM_CUDA_STREAM_CUH

#include <cuda_runtime.h>

#include "cuda.h"

/* The calling thread's current stream on `device`; NULL: the default. */
cudaStream_t ndm__cuda_current(int device);
/* The device's default stream (made on first use), whatever is current. */
ndm_status ndm__cuda_default_stream(int device, cudaStream_t *out);
/* Stream s of the stream table (NULL: the default) as a CUDA stream, with
 * the device entered. */
ndm_status ndm__cuda_stream_or_default(int device, void *s, cudaStream_t *out);

/* Pooled events (disable-timing), shared by the stream table and the
 * allocator's sources. */
ndm_status ndm__cuda_event_new(int device, void **out);
void ndm__cuda_event_release(int device, void *e);
ndm_status ndm__cuda_event_record(int device, void *e, void *s);
ndm_status ndm__cuda_event_query(int device, void *e, bool *done);
ndm_status ndm__cuda_event_sync(int device, void *e);

extern "C" const ndm__backend_streams ndm__cuda_streams;
#ifdef NDM__CUDA_HOST_EXEC
/* Test hook of the host stand-in: hold a stream's work back. */
void ndm__cuda_test_stream_hold(int device, void *s, bool on);
#endif
/* The segment source of a device (memory.cu): cudaMalloc segments, the
 * driver's virtual memory for expandable segments, stream events. */
const ndm__segment_source *ndm__cuda_segment_source(int device);
/* Page-locked host memory for transfers to and from `device`. */
const ndm__segment_source *ndm__cuda_pinned_source(int device);

#endif
