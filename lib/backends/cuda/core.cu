/* The CUDA backend's table and its core: the module's entry point, device
 * discovery, the default stream per device and sticky errors, converting
 * strided copy, fill, iota, transfers (memory.cu and stream.cu: the rest). */
#include <atomic>
#include <mutex>
#include <type_traits>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"
#include "iter.cuh"
#include "stream.cuh"

/* ---- the module -------------------------------------------------------------- */

const ndm__host_api *ndm__cuda_host;

extern "C" ndm_status ndm__cuda_fail(ndm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = ndm__cuda_host->vfail(st, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- scratch ------------------------------------------------------------------ */

ndm_status ndm__cu_scratch_get(int device, cudaStream_t s, size_t bytes, void **out,
                               const char *what)
{
    /* The library's allocator ties the block to the thread's current
     * stream, which is `s`; it records its own failures. */
    (void)s, (void)what;
    return ndm__cuda_host->scratch_alloc(NDM_DEVICE_CUDA, device, bytes, out);
}

ndm_status ndm__cu_scratch_put(int device, cudaStream_t s, void *p)
{
    (void)s;
    ndm__cuda_host->scratch_free(NDM_DEVICE_CUDA, device, p);
    return NDM_OK;
}

/* ---- devices -------------------------------------------------------------- */

typedef struct ndm__cuda_device {
    std::mutex lock;               /* stream creation, the sticky record */
    std::atomic<bool> ready;       /* stream created */
    cudaStream_t stream;
    std::atomic<int> sticky;       /* ndm_status of the failure that broke the device; 0 */
    bool injected;                 /* sticky was set by the test hook */
    char sticky_msg[512];          /* written once, before sticky is published */
} ndm__cuda_device;

static ndm__cuda_device devices[NDM__CUDA_MAX_DEVICES];

static std::once_flag count_once;
static int count_value;

extern "C" int ndm__cuda_count(void)
{
    std::call_once(count_once, [] {
        int n = 0;
        /* No driver, an old driver or no GPU all come back as errors here;
         * each means "no CUDA device" to ndm. */
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            (void)cudaGetLastError();
            n = 0;
        }
        count_value = n < NDM__CUDA_MAX_DEVICES ? n : NDM__CUDA_MAX_DEVICES;
    });
    return count_value;
}

/* Errors after which the context cannot run anything again (CUDA's sticky
 * errors): every later call on the device returns them. */
static bool breaks_context(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

/* Publish the device's sticky error; the first one wins. */
static void make_sticky(int device, ndm_status st, const char *fmt, ...) NDM_PRINTF(3, 4);
static void make_sticky(int device, ndm_status st, const char *fmt, ...)
{
    ndm__cuda_device *d = &devices[device];
    std::lock_guard<std::mutex> g(d->lock);
    if (d->sticky.load(std::memory_order_relaxed))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->sticky_msg, sizeof d->sticky_msg, fmt, ap);
    va_end(ap);
    d->sticky.store((int)st, std::memory_order_release);
}

ndm_status ndm__cuda_check(int device, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return NDM_OK;
    const char *name = cudaGetErrorName(e), *text = cudaGetErrorString(e);
    /* A synchronous error stays recorded in the runtime until read; read it
     * so that it is not reported again by an unrelated later call. */
    (void)cudaGetLastError();
    ndm__cuda_device *d = &devices[device];
    /* A call made while this thread captures a graph that cannot be
     * captured: the call fails (and so will the capture), the device goes on. */
    if (e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
        e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread)
        return ndm__cuda_fail(NDM_E_UNSUPPORTED, "cuda:%d: %s cannot be captured: %s (%s)",
                              device, what, text, name);
    bool broken = breaks_context(e);
    if (!broken && d->ready.load(std::memory_order_acquire)) {
        /* An error CUDA does not list as sticky may still hide a broken
         * context (a fault found by this call): the stream says so. */
        cudaError_t q = cudaStreamQuery(d->stream);
        if (q != cudaSuccess && q != cudaErrorNotReady) {
            (void)cudaGetLastError();
            e = q;
            name = cudaGetErrorName(q);
            text = cudaGetErrorString(q);
            broken = true;
        }
    }
    if (broken) {
        make_sticky(device, NDM_E_DEVICE,
                    "cuda:%d failed asynchronously: %s (%s), found by %s; the device cannot "
                    "run anything more in this process",
                    device, text, name, what);
        return ndm__cuda_fail((ndm_status)d->sticky.load(std::memory_order_acquire), "%s",
                              d->sticky_msg);
    }
    ndm_status st = e == cudaErrorMemoryAllocation ? NDM_E_OOM : NDM_E_DEVICE;
    return ndm__cuda_fail(st, "cuda:%d: %s failed: %s (%s)", device, what, text, name);
}

ndm_status ndm__cuda_enter(int device, cudaStream_t *stream)
{
    int count = ndm__cuda_count();
    if (device < 0 || device >= count)
        return ndm__cuda_fail(NDM_E_DEVICE, "cuda:%d does not exist (%d CUDA device%s found)",
                              device, count, count == 1 ? "" : "s");
    ndm__cuda_device *d = &devices[device];
    int sticky = d->sticky.load(std::memory_order_acquire);
    if (sticky)
        return ndm__cuda_fail((ndm_status)sticky, "%s", d->sticky_msg);
    NDM__CUDA_TRY(device, cudaSetDevice(device));
    if (!d->ready.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> g(d->lock);
        if (!d->ready.load(std::memory_order_relaxed)) {
            /* Non-blocking: the legacy default stream, which other libraries
             * in the process may use, never serialises ndm's work. */
            cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return ndm__cuda_fail(NDM_E_DEVICE, "cuda:%d: cannot create a stream: %s (%s)",
                                      device, cudaGetErrorString(e), cudaGetErrorName(e));
            }
            d->ready.store(true, std::memory_order_release);
        }
    }
    /* The calling thread's current stream, else the device's default. */
    cudaStream_t cur = ndm__cuda_current(device);
    *stream = cur ? cur : d->stream;
    return NDM_OK;
}

static void cuda_test_set_sticky(int device, bool on)
{
    if (device < 0 || device >= NDM__CUDA_MAX_DEVICES)
        return;
    ndm__cuda_device *d = &devices[device];
    if (on) {
        make_sticky(device, NDM_E_DEVICE,
                    "cuda:%d failed asynchronously: injected failure (test hook); the device "
                    "cannot run anything more in this process",
                    device);
        std::lock_guard<std::mutex> g(d->lock);
        d->injected = true;
        return;
    }
    std::lock_guard<std::mutex> g(d->lock);
    if (d->injected) {
        d->injected = false;
        d->sticky.store(0, std::memory_order_release);
    }
}

__global__ void ndm__k_trap(void) { __trap(); }

static ndm_status cuda_test_fault(int device)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    NDM__LAUNCH(1, 1, 0, s, ndm__k_trap)();
    NDM__CUDA_LAUNCHED(device, "ndm__k_trap");
    return NDM_OK;
}

/* Same-dtype copies move raw elements of the dtype's size. */
template <class U> struct ndm__cu_raw {
    typedef U T;
    static NDM__HD U ld(T x) { return x; }
    static NDM__HD T st(U v) { return v; }
};

/* ---- copy ------------------------------------------------------------------- */

template <class SD, class DD>
__global__ void ndm__k_copy_flat(typename DD::T *dst, int64_t ds, const typename SD::T *src,
                                 int64_t ss, int64_t n)
{
    if (n < ((int64_t)1 << 31)) {
        NDM__CU_LOOP(uint32_t, i, n)
        dst[(int64_t)i * ds] = DD::st(SD::ld(src[(int64_t)i * ss]));
    } else {
        NDM__CU_LOOP(int64_t, i, n)
        dst[i * ds] = DD::st(SD::ld(src[i * ss]));
    }
}

template <class SD, class DD, class I>
__global__ void ndm__k_copy_nd(ndm__cu_geom g, typename DD::T *dst, const typename SD::T *src,
                               int64_t n)
{
    NDM__CU_LOOP(I, i, n)
    {
        int64_t off[2];
        ndm__cu_offsets<2, I>(g, i, off);
        dst[off[0]] = DD::st(SD::ld(src[off[1]]));
    }
}

/* Host = true runs the same plan with a host loop in place of the kernels:
 * the test hook that checks conversions and index math without a GPU. */
template <class SD, class DD, bool Host>
static ndm_status copy_typed(int device, cudaStream_t s, const ndm__tensor *dst,
                             const ndm__tensor *src)
{
    char *data[2] = {(char *)dst->data, (char *)src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {sizeof(typename DD::T), sizeof(typename SD::T)};
    return ndm__cu_run_strided(dst->ndim, dst->shape, 2, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        typename DD::T *d = (typename DD::T *)p[0];
        const typename SD::T *x = (const typename SD::T *)p[1];
        if constexpr (Host) {
            for (int64_t i = 0; i < n; i++) {
                int64_t off[2];
                ndm__cu_offsets<2, int64_t>(g, i, off);
                d[off[0]] = DD::st(SD::ld(x[off[1]]));
            }
            return NDM_OK;
        }
        unsigned blocks = ndm__cuda_blocks(n);
        if (g.ndim <= 1) {
            int64_t sd = g.ndim ? g.stride[0][0] : 0, ss = g.ndim ? g.stride[1][0] : 0;
            if (std::is_same<SD, DD>::value && sd == 1 && ss == 1) {
                /* A plain move of contiguous bytes: the copy engines do it. */
                NDM__CUDA_TRY(device, cudaMemcpyAsync(d, x, (size_t)n * sizeof *d,
                                                      cudaMemcpyDeviceToDevice, s));
                return NDM_OK;
            }
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_copy_flat<SD, DD>)(d, sd, x, ss, n);
            NDM__CUDA_LAUNCHED(device, "the flat copy kernel");
        } else if (n < ((int64_t)1 << 31)) {
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_copy_nd<SD, DD, uint32_t>)(g, d, x, n);
            NDM__CUDA_LAUNCHED(device, "the strided copy kernel");
        } else {
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_copy_nd<SD, DD, int64_t>)(g, d, x, n);
            NDM__CUDA_LAUNCHED(device, "the strided copy kernel");
        }
        return NDM_OK;
    });
}

typedef ndm_status (*ndm__cu_copy_fn)(int, cudaStream_t, const ndm__tensor *, const ndm__tensor *);

#define NDM__CU_CONV(S, D) copy_typed<ndm__cu_dt<S>, ndm__cu_dt<D>, HOST>,
#define NDM__CU_CONV_ROW(S)                                                     \
    {NDM__CU_CONV(S, NDM_BOOL) NDM__CU_CONV(S, NDM_U8) NDM__CU_CONV(S, NDM_I32)   \
     NDM__CU_CONV(S, NDM_I64) NDM__CU_CONV(S, NDM_F16) NDM__CU_CONV(S, NDM_BF16)  \
     NDM__CU_CONV(S, NDM_F32) NDM__CU_CONV(S, NDM_F64)},
/* Indexed [src][dst] in enum order; the diagonal is never used (raw moves). */
#define HOST false
static const ndm__cu_copy_fn conv_table[NDM_DTYPE_COUNT][NDM_DTYPE_COUNT] = {
    NDM__CU_DTYPES(NDM__CU_CONV_ROW)};
#undef HOST
#define HOST true
static const ndm__cu_copy_fn conv_table_host[NDM_DTYPE_COUNT][NDM_DTYPE_COUNT] = {
    NDM__CU_DTYPES(NDM__CU_CONV_ROW)};
#undef HOST

template <bool Host>
static ndm_status copy_any(int device, cudaStream_t s, const ndm__tensor *dst,
                           const ndm__tensor *src)
{
    if (dst->dtype != src->dtype)
        return (Host ? conv_table_host : conv_table)[src->dtype][dst->dtype](device, s, dst, src);
    switch (ndm__cuda_host->dtype_size(dst->dtype)) {
    case 1:
        return copy_typed<ndm__cu_raw<uint8_t>, ndm__cu_raw<uint8_t>, Host>(device, s, dst, src);
    case 2:
        return copy_typed<ndm__cu_raw<uint16_t>, ndm__cu_raw<uint16_t>, Host>(device, s, dst, src);
    case 4:
        return copy_typed<ndm__cu_raw<uint32_t>, ndm__cu_raw<uint32_t>, Host>(device, s, dst, src);
    default:
        return copy_typed<ndm__cu_raw<uint64_t>, ndm__cu_raw<uint64_t>, Host>(device, s, dst, src);
    }
}

static ndm_status cuda_copy(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    if (!ndm__cuda_host->dtype_valid(dst->dtype) || !ndm__cuda_host->dtype_valid(src->dtype))
        return ndm__cuda_fail(NDM_E_DTYPE, "copy: invalid dtype");
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    return copy_any<false>(device, s, dst, src);
}

static ndm_status cuda_test_copy_on_host(const ndm__tensor *dst, const ndm__tensor *src)
{
    if (!ndm__cuda_host->dtype_valid(dst->dtype) || !ndm__cuda_host->dtype_valid(src->dtype))
        return NDM_E_DTYPE;
    return copy_any<true>(0, NULL, dst, src);
}

/* ---- fill ------------------------------------------------------------------- */

template <class U>
__global__ void ndm__k_fill_flat(U *dst, int64_t ds, U v, int64_t n)
{
    if (n < ((int64_t)1 << 31)) {
        NDM__CU_LOOP(uint32_t, i, n)
        dst[(int64_t)i * ds] = v;
    } else {
        NDM__CU_LOOP(int64_t, i, n)
        dst[i * ds] = v;
    }
}

template <class U, class I>
__global__ void ndm__k_fill_nd(ndm__cu_geom g, U *dst, U v, int64_t n)
{
    NDM__CU_LOOP(I, i, n)
    {
        int64_t off[2];
        ndm__cu_offsets<1, I>(g, i, off);
        dst[off[0]] = v;
    }
}

template <class U, bool Host>
static ndm_status fill_typed(int device, cudaStream_t s, const ndm__tensor *dst, U v)
{
    char *data[2] = {(char *)dst->data, NULL};
    const int64_t *strides[2] = {dst->strides, NULL};
    size_t es[2] = {sizeof(U), 0};
    return ndm__cu_run_strided(dst->ndim, dst->shape, 1, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        U *d = (U *)p[0];
        if constexpr (Host) {
            for (int64_t i = 0; i < n; i++) {
                int64_t off[2];
                ndm__cu_offsets<1, int64_t>(g, i, off);
                d[off[0]] = v;
            }
            return NDM_OK;
        }
        unsigned blocks = ndm__cuda_blocks(n);
        if (g.ndim <= 1) {
            int64_t sd = g.ndim ? g.stride[0][0] : 0;
            bool bytes_alike = true;
            const unsigned char *b = (const unsigned char *)&v;
            for (size_t k = 1; k < sizeof v; k++)
                bytes_alike = bytes_alike && b[k] == b[0];
            if (sd == 1 && bytes_alike) {
                /* Zeros (and one-byte patterns) go to the copy engines. */
                NDM__CUDA_TRY(device, cudaMemsetAsync(d, b[0], (size_t)n * sizeof v, s));
                return NDM_OK;
            }
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_fill_flat<U>)(d, sd, v, n);
            NDM__CUDA_LAUNCHED(device, "the flat fill kernel");
        } else if (n < ((int64_t)1 << 31)) {
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_fill_nd<U, uint32_t>)(g, d, v, n);
            NDM__CUDA_LAUNCHED(device, "the strided fill kernel");
        } else {
            NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_fill_nd<U, int64_t>)(g, d, v, n);
            NDM__CUDA_LAUNCHED(device, "the strided fill kernel");
        }
        return NDM_OK;
    });
}

template <bool Host>
static ndm_status fill_any(int device, cudaStream_t s, const ndm__tensor *dst, double value)
{
    /* The value is converted once, here, by the same rules as the kernels. */
    switch (dst->dtype) {
#define NDM__CU_FILL_CASE_(E)                                                   \
    case E:                                                                     \
        return fill_typed<typename ndm__cu_dt<E>::T, Host>(device, s, dst,      \
                                                           ndm__cu_dt<E>::st(value));
        NDM__CU_DTYPES(NDM__CU_FILL_CASE_)
#undef NDM__CU_FILL_CASE_
    }
    return ndm__cuda_fail(NDM_E_DTYPE, "fill: invalid dtype %d", (int)dst->dtype);
}

static ndm_status cuda_test_fill_on_host(const ndm__tensor *dst, double value)
{
    return fill_any<true>(0, NULL, dst, value);
}

static ndm_status cuda_fill(int device, const ndm__tensor *dst, double value)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    return fill_any<false>(device, s, dst, value);
}

/* ---- iota ------------------------------------------------------------------- */

template <class DD>
__global__ void ndm__k_iota(typename DD::T *dst, int64_t ds, int64_t n, double start,
                            double step)
{
    /* Explicit rounding: a fused multiply-add would round once where the
     * CPU rounds twice, and the results would differ in the last bit. */
    NDM__CU_LOOP(int64_t, i, n)
    dst[i * ds] = DD::st(__dadd_rn(start, __dmul_rn((double)i, step)));
}

static ndm_status cuda_iota(int device, const ndm__tensor *dst, double start, double step)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int64_t n = dst->ndim ? dst->shape[0] : 1;
    int64_t ds = dst->ndim ? dst->strides[0] : 1;
    if (n == 0)
        return NDM_OK;
    unsigned blocks = ndm__cuda_blocks(n);
    switch (dst->dtype) {
#define NDM__CU_IOTA_CASE(E)                                                    \
    case E:                                                                     \
        NDM__LAUNCH(blocks, NDM__CUDA_THREADS, 0, s, ndm__k_iota<ndm__cu_dt<E>>)(          \
            (typename ndm__cu_dt<E>::T *)dst->data, ds, n, start, step);        \
        NDM__CUDA_LAUNCHED(device, "the iota kernel");                          \
        return NDM_OK;
        NDM__CU_DTYPES(NDM__CU_IOTA_CASE)
#undef NDM__CU_IOTA_CASE
    }
    return ndm__cuda_fail(NDM_E_DTYPE, "iota: invalid dtype %d", (int)dst->dtype);
}

/* ---- transfers -------------------------------------------------------------- */

/* Both directions return when the bytes have arrived: the host buffer may be
 * reused (or read) at once, whether it is pageable or pinned. */
static ndm_status transfer(int device, void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0 || !n)
        return st;
    NDM__CUDA_TRY(device, cudaMemcpyAsync(dst, src, n, kind, s));
    NDM__CUDA_TRY(device, cudaStreamSynchronize(s));
    return NDM_OK;
}

static ndm_status cuda_upload(int device, void *dst, const void *src_host, size_t n)
{
    return transfer(device, dst, src_host, n, cudaMemcpyHostToDevice);
}

static ndm_status cuda_download(int device, void *dst_host, const void *src, size_t n)
{
    return transfer(device, dst_host, src, n, cudaMemcpyDeviceToHost);
}

static ndm_status cuda_sync(int device)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaStreamSynchronize(s));
    return NDM_OK;
}

static ndm_status cuda_peer_copy(int device, void *dst, int src_device, const void *src,
                                 size_t n)
{
    cudaStream_t ss = nullptr, ds = nullptr;
    ndm_status st = ndm__cuda_enter(src_device, &ss);
    if (st < 0)
        return st;
    /* The source's producers run on the source's stream. */
    NDM__CUDA_TRY(src_device, cudaStreamSynchronize(ss));
    st = ndm__cuda_enter(device, &ds);
    if (st < 0 || !n)
        return st;
    /* Queued on the destination's stream, ahead of the work that reads it;
     * CUDA goes through the host when the devices have no peer access. */
    NDM__CUDA_TRY(device, cudaMemcpyPeerAsync(dst, device, src, src_device, n, ds));
    NDM__CUDA_TRY(device, cudaStreamSynchronize(ds));
    return NDM_OK;
}


/* ---- the table and the entry point ---------------------------------------------- */

static ndm_status cuda_device_props(int device, ndm__device_props *out)
{
    if (device < 0 || device >= ndm__cuda_count())
        return ndm__cuda_fail(NDM_E_DEVICE, "cuda:%d does not exist", device);
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess)
        return ndm__cuda_check(device, e, "cudaGetDeviceProperties");
    snprintf(out->name, sizeof out->name, "%.127s", p.name);
    out->memory_bytes = (uint64_t)p.totalGlobalMem;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->features[0] = '\0';
    return NDM_OK;
}

static const ndm__backend_test cuda_test = {
    .set_sticky = cuda_test_set_sticky,
    .fault = cuda_test_fault,
    .copy_on_host = cuda_test_copy_on_host,
    .fill_on_host = cuda_test_fill_on_host,
#ifdef NDM__CUDA_HOST_EXEC
    .stream_hold = ndm__cuda_test_stream_hold,
    .runtime_alloc_calls = ndm__hx_stray_alloc_calls,
#else
    .stream_hold = NULL,
    .runtime_alloc_calls = NULL,
#endif
};

extern "C" const ndm__backend ndm__cuda_backend = {
    .abi = NDM__BACKEND_ABI,
    .name = "cuda",
    .type = NDM_DEVICE_CUDA,
    .device_count = ndm__cuda_count,
    .device_props = cuda_device_props,
    .segment_source = ndm__cuda_segment_source,
    .supports = ndm__cuda_supports,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .iota = cuda_iota,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .peer_copy = cuda_peer_copy,
    .ew = &ndm__cuda_ew,
    .reduce = &ndm__cuda_reduce,
    .linalg = &ndm__cuda_linalg,
    .index = &ndm__cuda_index,
    .nn = &ndm__cuda_nn,
    .random = &ndm__cuda_random,
    .test = &cuda_test,
    .streams = &ndm__cuda_streams,
    .pinned_source = ndm__cuda_pinned_source,
#if NDM_HAVE_NCCL
    .collective = &ndm__cuda_collective,
#endif
    .graphs = &ndm__cuda_graphs,
};

/* The module's one export. libndm checks the table it returns; the module
 * checks the host's ABI, the first member of every version of it. */
extern "C" __attribute__((visibility("default"))) const ndm__backend *
ndm_backend_cuda_register(const ndm__host_api *host)
{
    if (!host || host->abi != NDM__BACKEND_ABI)
        return NULL;
    ndm__cuda_host = host;
    return &ndm__cuda_backend;
}
