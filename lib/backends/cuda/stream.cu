/* The CUDA module's streams and events: per-device pools that recycle them
 * (never destroyed, so a handle released while still some thread's current
 * stream names a live stream), and the calling thread's current stream. */
#include <mutex>
#include <new>
#include <vector>

#include "common.cuh"
#include "stream.cuh"

/* NULL: the device's default stream (the non-blocking one of core.cu). */
static thread_local cudaStream_t current[NDM__CUDA_MAX_DEVICES];

cudaStream_t ndm__cuda_current(int device)
{
    return device >= 0 && device < NDM__CUDA_MAX_DEVICES ? current[device] : nullptr;
}

ndm_status ndm__cuda_default_stream(int device, cudaStream_t *out)
{
    /* ndm__cuda_enter hands back the current stream: with none set on
     * this thread for the call, that is the default one. */
    cudaStream_t saved = ndm__cuda_current(device);
    if (device >= 0 && device < NDM__CUDA_MAX_DEVICES)
        current[device] = nullptr;
    ndm_status st = ndm__cuda_enter(device, out);
    if (device >= 0 && device < NDM__CUDA_MAX_DEVICES)
        current[device] = saved;
    return st;
}

ndm_status ndm__cuda_stream_or_default(int device, void *s, cudaStream_t *out)
{
    if (s) {
        cudaStream_t ignored = nullptr;
        ndm_status st = ndm__cuda_enter(device, &ignored);
        *out = (cudaStream_t)s;
        return st;
    }
    return ndm__cuda_default_stream(device, out);
}

/* ---- pools ------------------------------------------------------------------- */

typedef struct ndm__cuda_pool {
    std::mutex lock;
    std::vector<void *> streams, events;
} ndm__cuda_pool;

/* Never destroyed, not even at exit: the streams it keeps are still
 * reachable then (a thread may still use one), as the driver's are. */
static ndm__cuda_pool *const pools = new ndm__cuda_pool[NDM__CUDA_MAX_DEVICES];

static void *pool_take(int device, bool stream)
{
    ndm__cuda_pool &p = pools[device];
    std::lock_guard<std::mutex> g(p.lock);
    std::vector<void *> &v = stream ? p.streams : p.events;
    if (v.empty())
        return nullptr;
    void *x = v.back();
    v.pop_back();
    return x;
}

static void pool_put(int device, bool stream, void *x)
{
    if (!x || device < 0 || device >= NDM__CUDA_MAX_DEVICES)
        return;
    ndm__cuda_pool &p = pools[device];
    std::lock_guard<std::mutex> g(p.lock);
    try {
        (stream ? p.streams : p.events).push_back(x);
    } catch (const std::bad_alloc &) {
        /* no room to keep it for later: it stays allocated (it may still be
         * a thread's current stream), a few bytes of the driver's */
    }
}

static ndm_status stream_new(int device, void **out)
{
    *out = nullptr;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    if ((*out = pool_take(device, true)))
        return NDM_OK;
    /* Non-blocking, as the default stream: the legacy stream of other
     * libraries never serialises ndm's work. */
    NDM__CUDA_TRY(device, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (void *)s;
    return NDM_OK;
}

static void stream_release(int device, void *s) { pool_put(device, true, s); }

static ndm_status stream_sync(int device, void *s)
{
    cudaStream_t cs = nullptr;
    ndm_status st = ndm__cuda_stream_or_default(device, s, &cs);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaStreamSynchronize(cs));
    return NDM_OK;
}

/* *done from a query's answer: cudaErrorNotReady is no error, only work
 * still queued (and it is cleared, as it would stick otherwise). */
static ndm_status query_answer(int device, cudaError_t e, bool *done)
{
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = false;
        return NDM_OK;
    }
    NDM__CUDA_TRY(device, e);
    return NDM_OK;
}

static ndm_status stream_query(int device, void *s, bool *done)
{
    *done = true;
    cudaStream_t cs = nullptr;
    ndm_status st = ndm__cuda_stream_or_default(device, s, &cs);
    if (st < 0)
        return st;
    return query_answer(device, cudaStreamQuery(cs), done);
}

static void stream_set_current(int device, void *s)
{
    if (device >= 0 && device < NDM__CUDA_MAX_DEVICES)
        current[device] = (cudaStream_t)s;
}

ndm_status ndm__cuda_event_new(int device, void **out)
{
    *out = nullptr;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    if ((*out = pool_take(device, false)))
        return NDM_OK;
    /* Events only order work here: timing them would cost every record. */
    cudaEvent_t e = nullptr;
    NDM__CUDA_TRY(device, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (void *)e;
    return NDM_OK;
}

void ndm__cuda_event_release(int device, void *e) { pool_put(device, false, e); }

ndm_status ndm__cuda_event_record(int device, void *e, void *s)
{
    cudaStream_t cs = nullptr;
    ndm_status st = ndm__cuda_stream_or_default(device, s, &cs);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaEventRecord((cudaEvent_t)e, cs));
    return NDM_OK;
}

ndm_status ndm__cuda_event_query(int device, void *e, bool *done)
{
    *done = true;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    return query_answer(device, cudaEventQuery((cudaEvent_t)e), done);
}

ndm_status ndm__cuda_event_sync(int device, void *e)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaEventSynchronize((cudaEvent_t)e));
    return NDM_OK;
}

static ndm_status stream_wait_event(int device, void *s, void *e)
{
    cudaStream_t cs = nullptr;
    ndm_status st = ndm__cuda_stream_or_default(device, s, &cs);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaStreamWaitEvent(cs, (cudaEvent_t)e, 0));
    return NDM_OK;
}

#ifdef NDM__CUDA_HOST_EXEC
void ndm__cuda_test_stream_hold(int device, void *s, bool on)
{
    cudaStream_t cs = nullptr;
    if (ndm__cuda_stream_or_default(device, s, &cs) == NDM_OK)
        ndm__hx_stream_hold(cs, on);
}
#endif

extern "C" const ndm__backend_streams ndm__cuda_streams = {
    .stream_new = stream_new,
    .stream_release = stream_release,
    .stream_sync = stream_sync,
    .stream_query = stream_query,
    .stream_set_current = stream_set_current,
    .event_new = ndm__cuda_event_new,
    .event_release = ndm__cuda_event_release,
    .event_record = ndm__cuda_event_record,
    .event_query = ndm__cuda_event_query,
    .event_sync = ndm__cuda_event_sync,
    .stream_wait_event = stream_wait_event,
};
