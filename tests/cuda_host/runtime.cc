/* Host execution's CUDA runtime: devices over host memory, in-order streams
 * that run work at once (or queue it while held, or record it while
 * captured into a graph), events, graphs, errors (test-only). */
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <unordered_map>
#include <vector>

#include "hx.h"

namespace ndm__hx {

/* ---- devices ---------------------------------------------------------------- */

static device devices[MAX_DEVICES];
static int count;
static std::once_flag setup_once;
static thread_local int current = 0;
static thread_local cudaError_t last_error = cudaSuccess;

static void setup_streams();

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "host execution: %s=%s is not in [%ld, %ld]; using %ld\n", name, v, lo,
                hi, dflt);
        return dflt;
    }
    return x;
}

static void setup()
{
    std::call_once(setup_once, [] {
        count = (int)env_long("NDM_HX_DEVICES", 1, 0, MAX_DEVICES);
        size_t mb = (size_t)env_long("NDM_HX_MEMORY_MB", 4096, 1, 1L << 20);
        for (int i = 0; i < MAX_DEVICES; i++)
            devices[i].capacity = mb << 20;
        setup_streams();
    });
}

int device_count()
{
    setup();
    return count;
}

device &dev(int i)
{
    setup();
    return devices[i];
}

int current_device() { return current; }

cudaError_t fail(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* A fault is first pending: the launch that made it and a cudaGetLastError
 * right after it still succeed, as on a GPU where the kernel faults after
 * the launch returned. Any call that uses the device then finds it. */
enum { FAULT_PENDING = 1, FAULT_SEEN = 2 };

cudaError_t check_alive(int d)
{
    if (d < 0 || d >= MAX_DEVICES || !devices[d].broken.load(std::memory_order_acquire))
        return cudaSuccess;
    devices[d].broken.store(FAULT_SEEN, std::memory_order_release);
    return fail(cudaErrorLaunchFailure);
}

static bool seen_broken(int d)
{
    return d >= 0 && d < count &&
           devices[d].broken.load(std::memory_order_acquire) == FAULT_SEEN;
}

void break_device(int d, const char *why)
{
    int was = 0;
    if (devices[d].broken.compare_exchange_strong(was, FAULT_PENDING, std::memory_order_acq_rel))
        fprintf(stderr, "host execution: cuda:%d failed: %s; the context is broken\n", d, why);
}

/* ---- memory ------------------------------------------------------------------ */

enum region_kind { R_DEVICE, R_MAPPED, R_PINNED, R_REGISTERED };
struct region {
    size_t size;   /* as asked: copies past it are refused */
    region_kind kind;
    int device;
    size_t charge; /* what it takes of the device's memory */
};
/* The runtime's tables are never destroyed: the library frees device memory
 * from its own exit handlers, which may run after this module's static
 * destructors would have. */
static std::mutex mem_lock;
static std::map<uintptr_t, region> &regions = *new std::map<uintptr_t, region>; /* by start */
static size_t used[MAX_DEVICES];

static std::map<uintptr_t, region>::iterator region_at(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    auto it = regions.upper_bound(a);
    if (it == regions.begin())
        return regions.end();
    --it;
    return a < it->first + it->second.size ? it : regions.end();
}

bool is_device_range(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = region_at(p);
    uintptr_t end = (uintptr_t)p + n;
    /* Driver mappings side by side (a segment grown in place) form one range. */
    for (;;) {
        if (it == regions.end() || (it->second.kind != R_DEVICE && it->second.kind != R_MAPPED))
            return false;
        uintptr_t rend = it->first + it->second.size;
        if (end <= rend)
            return true;
        ++it;
        if (it == regions.end() || it->first != rend || it->second.kind != R_MAPPED)
            return false;
    }
}

bool reserve_bytes(int d, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    if (n > devices[d].capacity - used[d])
        return false;
    used[d] += n;
    return true;
}

void unreserve_bytes(int d, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    used[d] -= n;
}

void map_range(void *p, size_t n, int d)
{
    std::lock_guard<std::mutex> g(mem_lock);
    regions[(uintptr_t)p] = region{n, R_MAPPED, d, 0};
}

void unmap_range(void *p, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = regions.lower_bound(a);
    while (it != regions.end() && it->first < a + n) {
        if (it->second.kind == R_MAPPED)
            it = regions.erase(it);
        else
            ++it;
    }
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- streams ----------------------------------------------------------------- */

} // namespace ndm__hx

struct ndm__hx_stream {
    int device;
    unsigned flags;
    /* Held for the whole of each piece of work: a stream is serial, and
     * two threads submitting to one stream must not run their work at once. */
    std::mutex lock;
    bool held = false;
    std::deque<std::function<void()>> queue;
    /* While captured: the work submitted since cudaStreamBeginCapture,
     * recorded instead of run (stream lock). */
    std::shared_ptr<struct ndm__hx_capture> cap;
};

/* A capture in progress: its nodes in order, whether a call that cannot be
 * captured has invalidated it, and the thread that began it. */
struct ndm__hx_capture {
    std::vector<std::function<void()>> nodes;
    bool invalid = false;
    std::thread::id owner;
};

struct ndm__hx_graph {
    std::vector<std::function<void()>> nodes;
};

struct ndm__hx_graph_exec {
    std::shared_ptr<const std::vector<std::function<void()>>> nodes;
};

/* An event's record: done when the work before it on its stream has run. */
struct ndm__hx_record {
    std::atomic<bool> done{false};
    bool captured = false; /* recorded into a capture: done only when a launch runs it */
    cudaStream_t stream = nullptr;
    std::chrono::steady_clock::time_point when;
};

struct ndm__hx_event {
    unsigned flags;
    std::mutex lock;
    std::shared_ptr<ndm__hx_record> rec; /* null until recorded */
};

namespace ndm__hx {

static std::mutex streams_lock;
static std::set<cudaStream_t> &streams = *new std::set<cudaStream_t>; /* the defaults too */

static void setup_streams()
{
    for (int i = 0; i < count; i++) {
        cudaStream_t s = new ndm__hx_stream;
        s->device = i;
        s->flags = 0;
        devices[i].null_stream = s;
        streams.insert(s);
    }
}

cudaStream_t resolve(cudaStream_t s)
{
    setup();
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return current < count ? devices[current].null_stream : nullptr;
    return s;
}

int stream_device(cudaStream_t s) { return resolve(s)->device; }

static bool known(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(streams_lock);
    return streams.count(s) != 0;
}

/* Run everything queued on s (its lock held); a broken device runs nothing
 * more, so its queue is dropped. */
static void drain_locked(cudaStream_t s)
{
    while (!s->queue.empty()) {
        if (devices[s->device].broken.load(std::memory_order_acquire)) {
            s->queue.clear();
            return;
        }
        std::function<void()> fn = std::move(s->queue.front());
        s->queue.pop_front();
        fn();
    }
}

/* Run what every stream of device d has queued. A stream is destroyed only
 * by its owner, who does not race this in a correct program (as on a GPU). */
static void sync_device(int d)
{
    std::vector<cudaStream_t> mine;
    {
        std::lock_guard<std::mutex> g(streams_lock);
        for (cudaStream_t s : streams)
            if (s->device == d)
                mine.push_back(s);
    }
    for (cudaStream_t s : mine) {
        std::lock_guard<std::mutex> g(s->lock);
        drain_locked(s);
    }
}

cudaError_t submit(cudaStream_t s, std::function<void()> fn)
{
    s = resolve(s);
    if (!s)
        return fail(cudaErrorInvalidDevice);
    cudaError_t e = check_alive(s->device);
    if (e != cudaSuccess)
        return e;
    std::lock_guard<std::mutex> g(s->lock);
    if (s->cap) {
        if (s->cap->invalid)
            return fail(cudaErrorStreamCaptureInvalidated);
        s->cap->nodes.push_back(std::move(fn));
        return cudaSuccess;
    }
    if (s->held) {
        s->queue.push_back(std::move(fn));
        return cudaSuccess;
    }
    drain_locked(s);
    fn();
    return cudaSuccess;
}

/* ---- capture ------------------------------------------------------------------ */

/* The streams the calling thread is capturing (thread-local mode: its own
 * calls that would wait for the device or allocate are refused). */
static thread_local std::vector<cudaStream_t> capturing_here;

static bool is_capturing(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(s->lock);
    return s->cap != nullptr;
}

static void invalidate(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(s->lock);
    if (s->cap)
        s->cap->invalid = true;
}

/* A call that cannot be captured, made by a thread that is capturing (or on
 * stream s, when given, that is being captured): every capture concerned is
 * invalidated and the call fails, as CUDA's does. Success otherwise. */
static cudaError_t capture_refuses(cudaStream_t s)
{
    bool hit = false;
    if (s && is_capturing(s)) {
        invalidate(s);
        hit = true;
    }
    for (cudaStream_t c : capturing_here) {
        invalidate(c);
        hit = true;
    }
    return hit ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

} // namespace ndm__hx

using namespace ndm__hx;

/* ---- errors and versions ---------------------------------------------------------- */

struct error_text {
    cudaError_t e;
    const char *name, *text;
};
static const error_text error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", "operation not supported on global/shared address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const error_text *text_of(cudaError_t e)
{
    for (const error_text &t : error_texts)
        if (t.e == e)
            return &t;
    return nullptr;
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    const error_text *t = text_of(e);
    return t ? t->name : "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    const error_text *t = text_of(e);
    return t ? t->text : "unrecognized error code";
}

extern "C" cudaError_t cudaGetLastError(void)
{
    setup();
    if (seen_broken(current))
        return cudaErrorLaunchFailure;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
    setup();
    if (seen_broken(current))
        return cudaErrorLaunchFailure;
    return last_error;
}

extern "C" cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return fail(cudaErrorInvalidValue);
    *v = 12080;
    return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { return cudaDriverGetVersion(v); }

/* ---- devices ------------------------------------------------------------------- */

extern "C" cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n)
        return fail(cudaErrorInvalidValue);
    *n = device_count();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

/* Selecting a broken device succeeds, as on a GPU: the error comes from the
 * next call that uses it. */
extern "C" cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= device_count())
        return fail(device_count() ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    current = d;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *d)
{
    if (!d)
        return fail(cudaErrorInvalidValue);
    if (!device_count())
        return fail(cudaErrorNoDevice);
    *d = current;
    return cudaSuccess;
}

enum : size_t {
    SHARED_DEFAULT = 48 << 10,  /* per block without opting in */
    SHARED_OPTIN = 227 << 10,   /* an H100's per-block maximum */
};

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count())
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda (host execution)");
    p->totalGlobalMem = devices[d].capacity;
    p->sharedMemPerBlock = SHARED_DEFAULT;
    p->sharedMemPerBlockOptin = SHARED_OPTIN;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)1 << 31;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    /* Few multiprocessors: grids sized by them stay small on the host. */
    p->multiProcessorCount = 2;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->pciBusID = d;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 64;
    p->l2CacheSize = 1 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->managedMemory = 0;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d)
{
    cudaDeviceProp p;
    if (!v)
        return fail(cudaErrorInvalidValue);
    cudaError_t e = cudaGetDeviceProperties(&p, d);
    if (e != cudaSuccess)
        return e;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxGridDimX: *v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer)
{
    if (!can)
        return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count() || peer < 0 || peer >= device_count())
        return fail(cudaErrorInvalidDevice);
    *can = d != peer;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    if (flags)
        return fail(cudaErrorInvalidValue);
    if (peer < 0 || peer >= device_count())
        return fail(cudaErrorInvalidDevice);
    return check_alive(current);
}

extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

static std::mutex func_lock;
static std::unordered_map<const void *, size_t> &func_shared =
    *new std::unordered_map<const void *, size_t>;

size_t ndm__hx::dyn_shared_limit(const void *kernel)
{
    std::lock_guard<std::mutex> g(func_lock);
    auto it = func_shared.find(kernel);
    return it == func_shared.end() ? SHARED_DEFAULT : it->second;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (!func)
        return fail(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > SHARED_OPTIN)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(func_lock);
    func_shared[func] = (size_t)value;
    return cudaSuccess;
}

/* ---- memory ---------------------------------------------------------------------- */

static cudaError_t device_alloc(void **ptr, size_t size, int d)
{
    if (!ptr)
        return fail(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (d >= device_count())
        return fail(cudaErrorNoDevice);
    cudaError_t e = check_alive(d);
    if (e != cudaSuccess)
        return e;
    if ((e = capture_refuses(nullptr)) != cudaSuccess)
        return e;
    if (size == 0)
        return cudaSuccess;
    size_t n = round_up(size, 256);
    if (n < size || !reserve_bytes(d, n))
        return fail(cudaErrorMemoryAllocation);
    void *p = aligned_alloc(256, n);
    if (!p) {
        unreserve_bytes(d, n);
        return fail(cudaErrorMemoryAllocation);
    }
    {
        std::lock_guard<std::mutex> g(mem_lock);
        regions[(uintptr_t)p] = region{size, R_DEVICE, d, n};
    }
    *ptr = p;
    return cudaSuccess;
}

/* Allocation calls by source file (cuda_runtime.h). */
static std::atomic<long> stray_calls;
static std::mutex stray_lock;
static char stray_last[256];

extern "C" void ndm__hx_note_alloc_call(const char *file, const char *call)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (!strcmp(base, "memory.cu"))
        return;
    stray_calls.fetch_add(1);
    std::lock_guard<std::mutex> g(stray_lock);
    snprintf(stray_last, sizeof stray_last, "%s in %s", call, base);
}

extern "C" long ndm__hx_stray_alloc_calls(char *where, size_t n)
{
    std::lock_guard<std::mutex> g(stray_lock);
    if (where && n)
        snprintf(where, n, "%s", stray_last);
    return stray_calls.load();
}

extern "C" cudaError_t cudaMalloc(void **ptr, size_t size)
{
    return device_alloc(ptr, size, current);
}

/* A block is freed even on a broken device (the error is still reported),
 * so that a failed test leaves no leak behind it. */
extern "C" cudaError_t cudaFree(void *ptr)
{
    if (!ptr)
        return check_alive(current);
    if (cudaError_t e = capture_refuses(nullptr))
        return e;
    int d;
    size_t n;
    {
        std::lock_guard<std::mutex> g(mem_lock);
        auto it = regions.find((uintptr_t)ptr);
        if (it == regions.end() || it->second.kind != R_DEVICE)
            return fail(cudaErrorInvalidValue);
        d = it->second.device;
        n = it->second.charge;
        regions.erase(it);
        used[d] -= n;
    }
    /* cudaFree waits for the device, as on a GPU: a held stream that still
     * uses the block would read freed memory otherwise. */
    sync_device(d);
    free(ptr);
    return check_alive(d);
}

extern "C" cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t s)
{
    return device_alloc(ptr, size, stream_device(s));
}

extern "C" cudaError_t cudaFreeAsync(void *ptr, cudaStream_t s)
{
    (void)s;
    return cudaFree(ptr);
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return fail(cudaErrorInvalidValue);
    if (!device_count())
        return fail(cudaErrorNoDevice);
    cudaError_t e = check_alive(current);
    if (e != cudaSuccess)
        return e;
    std::lock_guard<std::mutex> g(mem_lock);
    *total_bytes = devices[current].capacity;
    *free_bytes = devices[current].capacity - used[current];
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags)
{
    if (!ptr || flags > 7)
        return fail(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (cudaError_t e = capture_refuses(nullptr))
        return e;
    if (!size)
        return cudaSuccess;
    size_t n = round_up(size, 4096);
    void *p = n < size ? nullptr : aligned_alloc(4096, n);
    if (!p)
        return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(mem_lock);
    regions[(uintptr_t)p] = region{size, R_PINNED, -1, 0};
    *ptr = p;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

extern "C" cudaError_t cudaFreeHost(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    if (cudaError_t e = capture_refuses(nullptr))
        return e;
    {
        std::lock_guard<std::mutex> g(mem_lock);
        auto it = regions.find((uintptr_t)ptr);
        if (it == regions.end() || it->second.kind != R_PINNED)
            return fail(cudaErrorInvalidValue);
        regions.erase(it);
    }
    for (int d = 0; d < device_count(); d++)
        sync_device(d);
    free(ptr);
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags)
{
    if (!ptr || !size || flags > 15)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(mem_lock);
    uintptr_t a = (uintptr_t)ptr;
    auto it = regions.lower_bound(a);
    if ((it != regions.end() && it->first < a + size) || region_at(ptr) != regions.end())
        return fail(cudaErrorHostMemoryAlreadyRegistered);
    regions[a] = region{size, R_REGISTERED, -1, 0};
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void *ptr)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = regions.find((uintptr_t)ptr);
    if (it == regions.end() || it->second.kind != R_REGISTERED)
        return fail(cudaErrorHostMemoryNotRegistered);
    regions.erase(it);
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *ptr)
{
    if (!attr)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = region_at(ptr);
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->devicePointer = nullptr;
    attr->hostPointer = nullptr;
    if (it == regions.end())
        return cudaSuccess;
    if (it->second.kind == R_DEVICE || it->second.kind == R_MAPPED) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = it->second.device;
        attr->devicePointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeHost;
        attr->device = 0;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* ---- copies ----------------------------------------------------------------------- */

/* Device sides must lie in device memory, as a GPU's copy engines require:
 * a host pointer passed as a device one is an error here, not a silent copy. */
static cudaError_t check_kind(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((int)kind < 0 || kind > cudaMemcpyDefault)
        return fail(cudaErrorInvalidMemcpyDirection);
    if ((dd && !is_device_range(dst, n)) || (sd && !is_device_range(src, n)))
        return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

static bool is_pinned_range(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = region_at(p);
    return it != regions.end() &&
           (it->second.kind == R_PINNED || it->second.kind == R_REGISTERED) &&
           (uintptr_t)p + n <= it->first + it->second.size;
}

/* Pageable host memory behaves as CUDA says it does: a copy from it is
 * staged at the call (the caller may reuse its buffer at once), a copy into
 * it returns when it has arrived (the stream's earlier work done). Pinned
 * memory is used when the stream gets to the copy. */
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                       cudaStream_t s)
{
    if (!n)
        return cudaSuccess;
    cudaError_t e = check_kind(dst, src, n, kind);
    if (e != cudaSuccess)
        return e;
    /* Pageable memory cannot be captured: the copy would wait on the host. */
    bool pageable = (kind == cudaMemcpyHostToDevice && !is_pinned_range(src, n)) ||
                    (kind == cudaMemcpyDeviceToHost && !is_pinned_range(dst, n));
    if (pageable && (e = capture_refuses(resolve(s))) != cudaSuccess)
        return e;
    if (kind == cudaMemcpyHostToDevice && !is_pinned_range(src, n)) {
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        return submit(s, [=] { memcpy(dst, staged->data(), n); });
    }
    e = submit(s, [=] { memmove(dst, src, n); });
    if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost && !is_pinned_range(dst, n))
        e = cudaStreamSynchronize(s);
    return e;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr);
    return e != cudaSuccess ? e : cudaStreamSynchronize(nullptr);
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                         size_t width, size_t height, cudaMemcpyKind kind,
                                         cudaStream_t s)
{
    if (!width || !height)
        return cudaSuccess;
    if (width > dpitch || width > spitch)
        return fail(cudaErrorInvalidValue);
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dd && !is_device_range(dst, dpitch * (height - 1) + width)) ||
        (sd && !is_device_range(src, spitch * (height - 1) + width)))
        return fail(cudaErrorInvalidValue);
    return submit(s, [=] {
        for (size_t r = 0; r < height; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
}

extern "C" cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src,
                                           int src_device, size_t n, cudaStream_t s)
{
    if (dst_device < 0 || dst_device >= device_count() || src_device < 0 ||
        src_device >= device_count())
        return fail(cudaErrorInvalidDevice);
    cudaError_t e = check_alive(src_device);
    if (e != cudaSuccess)
        return e;
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
}

extern "C" cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device,
                                      size_t n)
{
    cudaError_t e = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, nullptr);
    return e != cudaSuccess ? e : cudaStreamSynchronize(nullptr);
}

extern "C" cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
    if (!n)
        return cudaSuccess;
    if (!is_device_range(dst, n))
        return fail(cudaErrorInvalidValue);
    return submit(s, [=] { memset(dst, value, n); });
}

extern "C" cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    cudaError_t e = cudaMemsetAsync(dst, value, n, nullptr);
    return e != cudaSuccess ? e : cudaStreamSynchronize(nullptr);
}

/* ---- streams ----------------------------------------------------------------------- */

extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority)
{
    (void)priority;
    if (!s || flags > cudaStreamNonBlocking)
        return fail(cudaErrorInvalidValue);
    if (!device_count())
        return fail(cudaErrorNoDevice);
    cudaError_t e = check_alive(current);
    if (e != cudaSuccess)
        return e;
    cudaStream_t n = new ndm__hx_stream;
    n->device = current;
    n->flags = flags;
    std::lock_guard<std::mutex> g(streams_lock);
    streams.insert(n);
    *s = n;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    return cudaStreamCreateWithPriority(s, flags, 0);
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

/* Queued work still runs, as a GPU finishes it after the handle is gone. */
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread || !known(s))
        return fail(cudaErrorInvalidResourceHandle);
    for (int i = 0; i < count; i++)
        if (devices[i].null_stream == s)
            return fail(cudaErrorInvalidResourceHandle);
    {
        std::lock_guard<std::mutex> g(s->lock);
        s->held = false;
        drain_locked(s);
    }
    {
        std::lock_guard<std::mutex> g(streams_lock);
        streams.erase(s);
    }
    delete s;
    return cudaSuccess;
}

/* Synchronising runs what a hold queued: the GPU would finish it. */
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    s = resolve(s);
    if (!s)
        return fail(cudaErrorNoDevice);
    if (cudaError_t e = capture_refuses(s))
        return e;
    {
        std::lock_guard<std::mutex> g(s->lock);
        drain_locked(s);
    }
    return check_alive(s->device);
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
    s = resolve(s);
    if (!s)
        return fail(cudaErrorNoDevice);
    cudaError_t e = check_alive(s->device);
    if (e != cudaSuccess)
        return e;
    if (is_capturing(s)) {
        invalidate(s);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    std::lock_guard<std::mutex> g(s->lock);
    /* Not ready is not an error: it is not recorded as the last error. */
    return s->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    if (!fn)
        return fail(cudaErrorInvalidValue);
    return submit(s, [=] { fn(data); });
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    if (!device_count())
        return fail(cudaErrorNoDevice);
    if (cudaError_t e = capture_refuses(nullptr))
        return e;
    sync_device(current);
    return check_alive(current);
}

extern "C" void ndm__hx_stream_hold(cudaStream_t s, int on)
{
    s = resolve(s);
    if (!s)
        return;
    std::lock_guard<std::mutex> g(s->lock);
    s->held = on != 0;
    if (!on)
        drain_locked(s);
}

extern "C" int ndm__hx_device_hold(int device, int on)
{
    if (device < 0 || device >= device_count())
        return 0;
    std::vector<cudaStream_t> mine;
    {
        std::lock_guard<std::mutex> g(streams_lock);
        for (cudaStream_t s : streams)
            if (s->device == device)
                mine.push_back(s);
    }
    for (cudaStream_t s : mine)
        ndm__hx_stream_hold(s, on);
    return (int)mine.size();
}

/* ---- graphs ---------------------------------------------------------------------------- */

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if ((int)mode < 0 || mode > cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorNoDevice);
    /* the legacy default stream cannot be captured */
    if (s == nullptr || s == cudaStreamLegacy || r == devices[r->device].null_stream)
        return fail(cudaErrorStreamCaptureUnsupported);
    if (cudaError_t e = check_alive(r->device))
        return e;
    std::lock_guard<std::mutex> g(r->lock);
    if (r->cap)
        return fail(cudaErrorIllegalState);
    /* work queued before the capture is not part of it: it runs first */
    drain_locked(r);
    r->cap = std::make_shared<ndm__hx_capture>();
    r->cap->owner = std::this_thread::get_id();
    if (mode != cudaStreamCaptureModeRelaxed)
        capturing_here.push_back(r);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!graph)
        return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorNoDevice);
    std::shared_ptr<ndm__hx_capture> cap;
    {
        std::lock_guard<std::mutex> g(r->lock);
        if (!r->cap)
            return fail(cudaErrorIllegalState);
        if (r->cap->owner != std::this_thread::get_id())
            return fail(cudaErrorStreamCaptureWrongThread);
        cap = std::move(r->cap);
    }
    for (size_t i = 0; i < capturing_here.size(); i++)
        if (capturing_here[i] == r) {
            capturing_here.erase(capturing_here.begin() + (long)i);
            break;
        }
    if (cap->invalid)
        return fail(cudaErrorStreamCaptureInvalidated);
    *graph = new ndm__hx_graph{std::move(cap->nodes)};
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    if (!status)
        return fail(cudaErrorInvalidValue);
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorNoDevice);
    std::lock_guard<std::mutex> g(r->lock);
    *status = !r->cap ? cudaStreamCaptureStatusNone
              : r->cap->invalid ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                            unsigned long long flags)
{
    if (!exec || !graph || flags)
        return fail(cudaErrorInvalidValue);
    *exec = new ndm__hx_graph_exec{
        std::make_shared<const std::vector<std::function<void()>>>(graph->nodes)};
    return cudaSuccess;
}

/* The graph's work, in its order, as one piece of the stream's: the work
 * before it on s runs first, the work after it waits for it. */
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec)
        return fail(cudaErrorInvalidResourceHandle);
    auto nodes = exec->nodes;
    return submit(s, [nodes] {
        for (const std::function<void()> &fn : *nodes)
            fn();
    });
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    if (!exec)
        return fail(cudaErrorInvalidResourceHandle);
    delete exec; /* (a launch still queued keeps its nodes) */
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    if (!graph)
        return fail(cudaErrorInvalidResourceHandle);
    delete graph;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count)
{
    if (!graph || !count)
        return fail(cudaErrorInvalidValue);
    if (nodes) {
        size_t n = *count < graph->nodes.size() ? *count : graph->nodes.size();
        for (size_t i = 0; i < n; i++)
            nodes[i] = (cudaGraphNode_t)(uintptr_t)(i + 1); /* (opaque; never dereferenced) */
        *count = n;
        return cudaSuccess;
    }
    *count = graph->nodes.size();
    return cudaSuccess;
}

/* ---- events --------------------------------------------------------------------------- */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e || flags > 7)
        return fail(cudaErrorInvalidValue);
    *e = new ndm__hx_event;
    (*e)->flags = flags;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    s = resolve(s);
    if (!s)
        return fail(cudaErrorNoDevice);
    auto rec = std::make_shared<ndm__hx_record>();
    rec->stream = s;
    rec->captured = is_capturing(s);
    cudaError_t err = submit(s, [rec] {
        rec->when = std::chrono::steady_clock::now();
        rec->done.store(true, std::memory_order_release);
    });
    if (err != cudaSuccess)
        return err;
    std::lock_guard<std::mutex> g(e->lock);
    e->rec = rec;
    return cudaSuccess;
}

static std::shared_ptr<ndm__hx_record> record_of(cudaEvent_t e)
{
    std::lock_guard<std::mutex> g(e->lock);
    return e->rec;
}

/* An event never recorded counts as complete, as CUDA's does. */
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    auto rec = record_of(e);
    if (rec && rec->captured && !rec->done.load(std::memory_order_acquire)) {
        invalidate(rec->stream);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (!rec || rec->done.load(std::memory_order_acquire))
        return cudaSuccess;
    cudaError_t err = check_alive(rec->stream->device);
    return err != cudaSuccess ? err : cudaErrorNotReady;
}

/* Run the stream of e's record up to it (a stream stays alive while it has
 * queued work: its destruction runs the queue first). */
static cudaError_t complete(const std::shared_ptr<ndm__hx_record> &rec)
{
    if (!rec || rec->done.load(std::memory_order_acquire))
        return cudaSuccess;
    cudaStream_t s = rec->stream;
    std::lock_guard<std::mutex> g(s->lock);
    while (!rec->done.load(std::memory_order_acquire) && !s->queue.empty()) {
        if (devices[s->device].broken.load(std::memory_order_acquire)) {
            s->queue.clear();
            break;
        }
        std::function<void()> fn = std::move(s->queue.front());
        s->queue.pop_front();
        fn();
    }
    return check_alive(s->device);
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    auto rec = record_of(e);
    if (cudaError_t err = capture_refuses(rec && rec->captured ? rec->stream : nullptr))
        return err;
    return complete(rec);
}

/* The waiting stream runs at once, so the awaited work is run now. */
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    if (!e || flags > 1)
        return fail(!e ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    s = resolve(s);
    if (!s)
        return fail(cudaErrorNoDevice);
    auto rec = record_of(e);
    if (rec && rec->stream == s)
        return check_alive(s->device); /* in order on its own stream */
    if (rec && rec->captured) {
        /* (a capture joined across streams: not modelled here) */
        invalidate(rec->stream);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    cudaError_t err = complete(rec);
    return err != cudaSuccess ? err : check_alive(s->device);
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms || !start || !end)
        return fail(cudaErrorInvalidValue);
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle);
    auto a = record_of(start), b = record_of(end);
    if (!a || !b)
        return fail(cudaErrorInvalidResourceHandle);
    if (!a->done.load(std::memory_order_acquire) || !b->done.load(std::memory_order_acquire))
        return fail(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

/* ---- launches ----------------------------------------------------------------------------- */

static std::atomic<unsigned long long> launches;

extern "C" unsigned long long ndm__hx_launch_count(void)
{
    return launches.load(std::memory_order_relaxed);
}

cudaError_t ndm__hx_submit_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
                                  const void *kernel, void (*thread_body)(void *),
                                  std::function<void()> &&keep, void *ctx)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || block.x > 1024 ||
        block.y > 1024 || block.z > 64 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration);
    if (shmem > dyn_shared_limit(kernel))
        return fail(cudaErrorInvalidValue);
    s = resolve(s);
    if (!s)
        return fail(cudaErrorNoDevice);
    int d = s->device;
    return submit(s, [=, keep = std::move(keep)] {
        (void)keep;
        launches.fetch_add(1, std::memory_order_relaxed);
        char why[256];
        if (!run_grid(grid, block, shmem, thread_body, ctx, why, sizeof why))
            break_device(d, why);
    });
}
