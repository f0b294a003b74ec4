/* Host execution: a test-only stand-in of the CUDA runtime that lets the CUDA
 * module's .cu sources compile as host C++ and run on the CPU (never installed).
 *
 * Device memory is host memory; streams run their work at once, in order, on
 * the calling thread (ndm__hx_stream_hold queues it, for tests of stream
 * ordering); events complete at once; a kernel launched with NDM__LAUNCH runs
 * its grid block after block, each block's threads as cooperative fibers, so
 * that __syncthreads, shared memory, warp shuffles and atomics behave as the
 * CUDA programming model says. __trap and a barrier that the block's threads
 * do not all reach end the kernel and break the context, as a fault does on a
 * GPU: every later call reports cudaErrorLaunchFailure.
 *
 * What host execution cannot show, and the GPU runs (tools/run.sh gpu) do:
 * timing; real concurrency between streams and with the host; memory ordering
 * and visibility between blocks and between threads without a barrier (here
 * every write is seen at once); warp-synchronous code that relies on lockstep
 * without __syncwarp (here a warp's threads run one after another between
 * barriers); device limits (registers, the real shared-memory budget,
 * occupancy); and what only nvcc rejects.
 *
 * Environment: NDM_HX_DEVICES (device count, default 1), NDM_HX_MEMORY_MB
 * (memory of each device, default 4096). */
#ifndef NDM_CUDA_HOST_RUNTIME_H
#define NDM_CUDA_HOST_RUNTIME_H

#ifndef __cplusplus
#error "host execution compiles the CUDA sources as C++"
#endif

#define NDM__CUDA_HOST_EXEC 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "driver_types.h"

/* ---- qualifiers -------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
/* Shared memory is one per block; blocks run one after another on the
 * launching thread, so a per-OS-thread static is the block's array. */
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
/* __restrict__ is GCC's and Clang's own. */

/* ---- vector types -------------------------------------------------------------- */

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/* ---- the runtime API ------------------------------------------------------------ */

extern "C" {
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value);

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *ptr);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t n);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device,
                                size_t n, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t n);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data);

/* Graphs: stream capture records the work submitted to a stream (in
 * order, as one chain of nodes) instead of running it; an instantiated
 * graph runs that work again on the stream it is launched on. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- host execution's own controls (tests only) ----
 *
 * Exported from the host-execution module, so a C test reaches them with
 * dlsym on dlopen("<NDM_BACKEND_PATH>/libndm-cuda.so", RTLD_NOW | RTLD_NOLOAD)
 * once ndm has loaded the module. */
#define NDM__HX_EXPORT __attribute__((visibility("default")))

/* While on, work submitted to s is queued instead of run: events recorded
 * on s stay not ready, cudaStreamQuery(s) says cudaErrorNotReady. Turning it
 * off runs the queue in order. Synchronising s (or its device, or an event
 * recorded on it), or making another stream wait for such an event, runs
 * the queue up to that point, as the GPU would eventually finish it. */
NDM__HX_EXPORT void ndm__hx_stream_hold(cudaStream_t s, int on);
/* The same for every stream of `device` that exists now (the module's own
 * included); returns how many. */
NDM__HX_EXPORT int ndm__hx_device_hold(int device, int on);
/* Kernel launches run so far in this process (for tests that a path ran on
 * the device). */
NDM__HX_EXPORT unsigned long long ndm__hx_launch_count(void);
/* Times a kernel thread on the calling OS thread had to wait for others (a
 * fiber switch away from it): zero for kernels that never synchronise. */
NDM__HX_EXPORT unsigned long long ndm__hx_parks(void);
/* The allocation calls of the module (cudaMalloc, cudaFree, their Async and
 * host forms) are counted by their source file: those of any file but the
 * segment source (memory.cu) are strays, which the conformance suite
 * asserts there are none of (through the backend's test table). Returns
 * the strays so far, the last one's file into where (n bytes). */
void ndm__hx_note_alloc_call(const char *file, const char *call);
long ndm__hx_stray_alloc_calls(char *where, size_t n);
}

#ifdef NDM_BUILDING_LIBRARY
/* In the module's sources only (the stand-in and its own tests call these
 * freely): each call notes its file first. */
#define NDM__HX_NOTED(call, ...) (ndm__hx_note_alloc_call(__FILE__, #call), call(__VA_ARGS__))
#define cudaMalloc(...) NDM__HX_NOTED(cudaMalloc, __VA_ARGS__)
#define cudaFree(...) NDM__HX_NOTED(cudaFree, __VA_ARGS__)
#define cudaMallocAsync(...) NDM__HX_NOTED(cudaMallocAsync, __VA_ARGS__)
#define cudaFreeAsync(...) NDM__HX_NOTED(cudaFreeAsync, __VA_ARGS__)
#define cudaHostAlloc(...) NDM__HX_NOTED(cudaHostAlloc, __VA_ARGS__)
#define cudaMallocHost(...) NDM__HX_NOTED(cudaMallocHost, __VA_ARGS__)
#define cudaFreeHost(...) NDM__HX_NOTED(cudaFreeHost, __VA_ARGS__)
#endif

/* ---- device facilities ---------------------------------------------------------- */

/* Read through functions (values, not lvalues, as CUDA's are read-only):
 * the shim switches fibers under the compiler's feet, and UBSan misreads a
 * member of a thread_local struct reached from a fiber as a null access. */
uint3 ndm__hx_thread_idx(void);
uint3 ndm__hx_block_idx(void);
uint3 ndm__hx_block_dim(void);
uint3 ndm__hx_grid_dim(void);
#define threadIdx (ndm__hx_thread_idx())
#define blockIdx (ndm__hx_block_idx())
#define blockDim (ndm__hx_block_dim())
#define gridDim (ndm__hx_grid_dim())
static constexpr int warpSize = 32;

/* Barriers: a fiber switch when the thread must wait. */
void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
[[noreturn]] void __trap(void);
void *ndm__hx_dyn_shared(void);
/* Exchange sizeof(v) <= 8 bytes through the warp's slots; returns the value
 * lane `src` put there (the caller's own when src < 0). */
uint64_t ndm__hx_warp_exchange(unsigned mask, uint64_t v, int (*pick)(int lane, int a, int w),
                               int a, int width);
int ndm__hx_lane(void);

static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

template <class T> static inline T __ldg(const T *p) { return *p; }

namespace ndm__hx {
template <class T> static inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "warp exchanges move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
/* The source lane of each shuffle within its width-wide segment, or -1 for
 * the caller's own value (CUDA's rules for an out-of-segment source). */
static inline int pick_idx(int lane, int src, int w) { return (lane & ~(w - 1)) + (src & (w - 1)); }
static inline int pick_up(int lane, int d, int w) { return (lane & (w - 1)) >= d ? lane - d : -1; }
static inline int pick_down(int lane, int d, int w)
{
    return (lane & (w - 1)) + d < w ? lane + d : -1;
}
static inline int pick_xor(int lane, int m, int w)
{
    int s = lane ^ m;
    return s < (lane & ~(w - 1)) + w ? s : -1;
}
} // namespace ndm__hx

template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = warpSize)
{
    return ndm__hx::from_bits<T>(
        ndm__hx_warp_exchange(mask, ndm__hx::to_bits(v), ndm__hx::pick_idx, src, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    return ndm__hx::from_bits<T>(
        ndm__hx_warp_exchange(mask, ndm__hx::to_bits(v), ndm__hx::pick_up, (int)delta, width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    return ndm__hx::from_bits<T>(
        ndm__hx_warp_exchange(mask, ndm__hx::to_bits(v), ndm__hx::pick_down, (int)delta, width));
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize)
{
    return ndm__hx::from_bits<T>(
        ndm__hx_warp_exchange(mask, ndm__hx::to_bits(v), ndm__hx::pick_xor, lane_mask, width));
}
unsigned __ballot_sync(unsigned mask, int predicate);
static inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
static inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, p) == mask; }

/* Atomics: a launch runs on one OS thread, so plain read-modify-writes are
 * atomic; they return the old value as CUDA's do. */
#define NDM__HX_RMW(name, T, expr)                                              \
    static inline T name(T *p, T v)                                             \
    {                                                                           \
        T old = *p;                                                             \
        *p = (expr);                                                            \
        return old;                                                             \
    }
NDM__HX_RMW(atomicAdd, int, old + v)
NDM__HX_RMW(atomicAdd, unsigned, old + v)
NDM__HX_RMW(atomicAdd, unsigned long long, old + v)
NDM__HX_RMW(atomicAdd, float, old + v)
NDM__HX_RMW(atomicAdd, double, old + v)
NDM__HX_RMW(atomicSub, int, old - v)
NDM__HX_RMW(atomicSub, unsigned, old - v)
NDM__HX_RMW(atomicExch, int, v)
NDM__HX_RMW(atomicExch, unsigned, v)
NDM__HX_RMW(atomicExch, unsigned long long, v)
NDM__HX_RMW(atomicExch, float, v)
NDM__HX_RMW(atomicMax, int, old > v ? old : v)
NDM__HX_RMW(atomicMax, unsigned, old > v ? old : v)
NDM__HX_RMW(atomicMax, long long, old > v ? old : v)
NDM__HX_RMW(atomicMax, unsigned long long, old > v ? old : v)
NDM__HX_RMW(atomicMin, int, old < v ? old : v)
NDM__HX_RMW(atomicMin, unsigned, old < v ? old : v)
NDM__HX_RMW(atomicMin, long long, old < v ? old : v)
NDM__HX_RMW(atomicMin, unsigned long long, old < v ? old : v)
NDM__HX_RMW(atomicAnd, int, old & v)
NDM__HX_RMW(atomicAnd, unsigned, old & v)
NDM__HX_RMW(atomicOr, int, old | v)
NDM__HX_RMW(atomicOr, unsigned, old | v)
#undef NDM__HX_RMW
#define NDM__HX_CAS(T)                                                          \
    static inline T atomicCAS(T *p, T cmp, T v)                                 \
    {                                                                           \
        T old = *p;                                                             \
        if (old == cmp)                                                         \
            *p = v;                                                             \
        return old;                                                             \
    }
NDM__HX_CAS(int)
NDM__HX_CAS(unsigned)
NDM__HX_CAS(unsigned long long)
#undef NDM__HX_CAS

/* Correctly rounded arithmetic: the host rounds every operation (the build
 * turns off contraction into fused multiply-adds). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

static inline unsigned __float_as_uint(float x) { return ndm__hx::from_bits<unsigned>(ndm__hx::to_bits(x)); }
static inline float __uint_as_float(unsigned x) { return ndm__hx::from_bits<float>(ndm__hx::to_bits(x)); }
static inline int __float_as_int(float x) { return ndm__hx::from_bits<int>(ndm__hx::to_bits(x)); }
static inline float __int_as_float(int x) { return ndm__hx::from_bits<float>(ndm__hx::to_bits(x)); }
static inline long long __double_as_longlong(double x)
{
    return ndm__hx::from_bits<long long>(ndm__hx::to_bits(x));
}
static inline double __longlong_as_double(long long x)
{
    return ndm__hx::from_bits<double>(ndm__hx::to_bits(x));
}

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* CUDA's min/max overloads, mixed signedness included. */
#define NDM__HX_MINMAX(A, B, R)                                                 \
    static inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }         \
    static inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
NDM__HX_MINMAX(int, int, int)
NDM__HX_MINMAX(unsigned, unsigned, unsigned)
NDM__HX_MINMAX(int, unsigned, unsigned)
NDM__HX_MINMAX(unsigned, int, unsigned)
NDM__HX_MINMAX(long, long, long)
NDM__HX_MINMAX(unsigned long, unsigned long, unsigned long)
NDM__HX_MINMAX(long long, long long, long long)
NDM__HX_MINMAX(unsigned long long, unsigned long long, unsigned long long)
NDM__HX_MINMAX(long long, unsigned long long, unsigned long long)
NDM__HX_MINMAX(unsigned long long, long long, unsigned long long)
#undef NDM__HX_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }

/* ---- launches --------------------------------------------------------------------- */

/* Validate a launch's configuration (an error is returned and recorded as
 * the thread's last error, as a bad <<<>>> is) and hand `run` to the stream,
 * which runs the grid now or when its hold ends. */
cudaError_t ndm__hx_submit_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
                                  const void *kernel, void (*thread_body)(void *),
                                  std::function<void()> &&keep, void *ctx);

template <class... P> struct ndm__hx_launcher {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    void (*kernel)(P...);

    struct bound {
        void (*kernel)(P...);
        std::tuple<std::decay_t<P>...> args;
    };
    /* Each thread gets its own copies of the arguments, as on a GPU. */
    static void body(void *ctx)
    {
        bound *b = static_cast<bound *>(ctx);
        std::apply(b->kernel, b->args);
    }
    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel takes exactly its parameters");
        auto b = std::make_shared<bound>(bound{kernel, std::tuple<std::decay_t<P>...>(
                                                           std::forward<A>(a)...)});
        void *ctx = b.get();
        (void)ndm__hx_submit_launch(grid, block, shmem, stream, (const void *)kernel, body,
                                    [b] {}, ctx);
    }
};

template <class... P>
static inline ndm__hx_launcher<P...> ndm__hx_launch_of(dim3 grid, dim3 block, size_t shmem,
                                                       cudaStream_t s, void (*kernel)(P...))
{
    return ndm__hx_launcher<P...>{grid, block, shmem, s, kernel};
}

#endif
