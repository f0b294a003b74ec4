/* The CUDA module's device graphs: stream capture on a private stream made
 * the thread's current one, instantiation, launch (ndm__backend_graphs). */
#include "common.cuh"
#include "stream.cuh"

static ndm_status capture_begin(int device, void **capture)
{
    *capture = nullptr;
    void *s = nullptr;
    ndm_status st = ndm__cuda_streams.stream_new(device, &s);
    if (st < 0)
        return st;
    /* Thread-local: this thread's calls that cannot be captured fail (and
     * invalidate the capture); other threads' work on the device goes on. */
    cudaError_t e = cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        ndm__cuda_streams.stream_release(device, s);
        return ndm__cuda_check(device, e, "cudaStreamBeginCapture");
    }
    ndm__cuda_streams.stream_set_current(device, s);
    *capture = s;
    return NDM_OK;
}

static ndm_status capture_end(int device, void *capture, void *restore, void **graph,
                              size_t *nodes)
{
    *graph = nullptr;
    *nodes = 0;
    cudaStream_t cs = (cudaStream_t)capture;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(cs, &g);
    ndm__cuda_streams.stream_set_current(device, restore);
    ndm_status st = NDM_OK;
    if (e != cudaSuccess) {
        const char *name = cudaGetErrorName(e), *text = cudaGetErrorString(e);
        (void)cudaGetLastError();
        st = ndm__cuda_fail(NDM_E_UNSUPPORTED,
                            "cuda:%d: the capture failed: %s (%s): a call made during it "
                            "cannot be captured",
                            device, text, name);
    } else {
        size_t n = 0;
        cudaGraphExec_t x = nullptr;
        e = cudaGraphGetNodes(g, nullptr, &n);
        if (e == cudaSuccess)
            e = cudaGraphInstantiate(&x, g, 0);
        (void)cudaGraphDestroy(g);
        if (e != cudaSuccess) {
            st = ndm__cuda_check(device, e, "cudaGraphInstantiate");
        } else {
            *graph = (void *)x;
            *nodes = n;
        }
    }
    ndm__cuda_streams.stream_release(device, capture);
    return st;
}

static ndm_status launch(int device, void *graph, void *stream)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_stream_or_default(device, stream, &s);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaGraphLaunch((cudaGraphExec_t)graph, s));
    return NDM_OK;
}

static void destroy(int device, void *graph)
{
    if (!graph)
        return;
    if (cudaSetDevice(device) != cudaSuccess || cudaGraphExecDestroy((cudaGraphExec_t)graph))
        (void)cudaGetLastError();
}

extern "C" const ndm__backend_graphs ndm__cuda_graphs = {
    .capture_begin = capture_begin,
    .capture_end = capture_end,
    .launch = launch,
    .destroy = destroy,
};
