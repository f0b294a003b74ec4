/* Shared ground of the CUDA kernels: per-device state (one stream, a sticky
 * error), CUDA errors turned into statuses, element conversions, launch sizes. */
#ifndef NDM_CUDA_COMMON_CUH
#define NDM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../../base/convert_scalar.h"
#include "cuda.h"

/* ---- devices, streams, errors -------------------------------------------
 *
 * Every entry point of a CUDA family starts with ndm__cuda_enter, which
 * returns the device's sticky error if it has one, makes the device current
 * on the calling thread and hands back its stream. Every CUDA call and every
 * launch is checked with NDM__CUDA_TRY / NDM__CUDA_LAUNCHED.
 *
 * Errors come in two kinds. A synchronous one (bad launch configuration,
 * cudaMalloc out of memory) concerns only the call that made it: it is
 * reported there and the device goes on. An asynchronous one (a kernel that
 * faulted after its launch returned) breaks the device's context: CUDA
 * reports it from whatever call comes next, and so does ndm, from then on,
 * for every call on that device: the error is sticky. */

/* NDM_OK with the device current and *stream its stream, or the sticky
 * error, or NDM_E_DEVICE for an index that is not a device. */
ndm_status ndm__cuda_enter(int device, cudaStream_t *stream);

/* Report a failed CUDA call `what` on `device`: NDM_E_OOM for an allocation
 * failure, NDM_E_DEVICE otherwise, with CUDA's name and text for it in the
 * thread's last error. An error that broke the device becomes sticky. */
ndm_status ndm__cuda_check(int device, cudaError_t e, const char *what);

/* Scratch for one call's kernels, from the library's caching allocator
 * (host->scratch_alloc, backend.h "kernel scratch"), never from the
 * runtime: charged to the operation's output manager, seen by its limits,
 * the statistics, the OOM ladder and snapshots. `s` is the stream the
 * kernels are queued on, the thread's current one, which the block is tied
 * to: a put right after queuing is safe (the block serves that stream again
 * at once, other streams once an event says the work has passed), so
 * nothing waits on the host. A failure is recorded by the library (OOM,
 * or the quota of the manager's limit, naming the operation); `what` names
 * the buffer in it when no operation is running. */
ndm_status ndm__cu_scratch_get(int device, cudaStream_t s, size_t bytes, void **out,
                               const char *what);
ndm_status ndm__cu_scratch_put(int device, cudaStream_t s, void *p);

#define NDM__CUDA_TRY(dev, call)                                                \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess)                                                  \
            return ndm__cuda_check((dev), e_, #call);                           \
    } while (0)

/* After every launch: configuration errors show here, faults later. */
#define NDM__CUDA_LAUNCHED(dev, kernel)                                         \
    do {                                                                        \
        cudaError_t e_ = cudaGetLastError();                                    \
        if (e_ != cudaSuccess)                                                  \
            return ndm__cuda_check((dev), e_, "launch of " kernel);             \
    } while (0)

/* ---- launches: one source for the GPU and for host execution ---------------
 *
 * The kernels compile two ways: by nvcc for the GPU, and as host C++ against
 * the test-only stand-in of the CUDA runtime, driver and cuBLAS (tests/
 * cuda_host/, whose cuda_runtime.h defines NDM__CUDA_HOST_EXEC), which runs a
 * block's threads as cooperative fibers so that __syncthreads, shared memory,
 * atomics and warp shuffles behave. So a kernel is launched with
 *     NDM__LAUNCH(grid, block, shmem_bytes, stream, kernel<T...>)(args...);
 * (the kernel last, so that template arguments may hold commas), never with
 * the triple-chevron syntax, and dynamic shared memory is declared with
 *     NDM__DYN_SHARED(T, name);   // T *name, shmem_bytes long
 * Everything else a kernel uses (threadIdx, blockIdx, blockDim, gridDim,
 * warpSize, __syncthreads, __shfl_*_sync, atomicAdd/CAS/Max/Min/Exch, the
 * __*_rn arithmetic, the math library) the stand-in provides under the same
 * names. */
#ifdef NDM__CUDA_HOST_EXEC
#define NDM__LAUNCH(grid, block, shmem, stream, ...)                            \
    ndm__hx_launch_of((grid), (block), (shmem), (stream), __VA_ARGS__)
#define NDM__DYN_SHARED(T, name) T *name = (T *)ndm__hx_dyn_shared()
#else
#define NDM__LAUNCH(grid, block, shmem, stream, ...)                            \
    __VA_ARGS__<<<(grid), (block), (shmem), (stream)>>>
#define NDM__DYN_SHARED(T, name)                                                \
    extern __shared__ __align__(16) unsigned char ndm__dyn_smem[];              \
    T *name = reinterpret_cast<T *>(ndm__dyn_smem)
#endif

/* Grid-stride loops: enough blocks to fill the device, no more. */
#define NDM__CUDA_THREADS 256
static inline unsigned ndm__cuda_blocks(int64_t n)
{
    int64_t b = (n + NDM__CUDA_THREADS - 1) / NDM__CUDA_THREADS;
    /* 132 SMs x 16 resident blocks on an H100 is about 2100: beyond that a
     * block only loops, so the cap costs nothing and keeps the index math in
     * range. */
#ifdef NDM__CUDA_HOST_EXEC
    /* Host execution runs blocks one after another: a few blocks still
     * exercise the grid-stride loops without paying for 4096. */
    const int64_t cap = 8;
#else
    const int64_t cap = 4096;
#endif
    return (unsigned)(b < cap ? (b > 0 ? b : 1) : cap);
}

/* ---- element conversions -------------------------------------------------
 *
 * The same rules as the CPU reference (lib/backends/cpu/convert.h), bit for
 * bit, so the CPU can be the oracle of every CUDA test: float to integer
 * saturates (NaN gives 0), integer to integer wraps, anything to bool is
 * "!= 0", f16 and bf16 go through f32 with round to nearest even. The scalar
 * conversions are the CPU's own (convert_scalar.h). */

#define NDM__HD __host__ __device__ __forceinline__

/* One struct per dtype: `T` is the storage type, ld() gives the natural C
 * value (f16 and bf16 load as float), st() stores any natural value. The
 * float and double overloads of st() are the saturating ones, as the CPU's
 * _Generic picks. */
template <ndm_dtype E> struct ndm__cu_dt;

template <> struct ndm__cu_dt<NDM_BOOL> {
    typedef uint8_t T;
    static NDM__HD uint8_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)(v != 0); }
};
template <> struct ndm__cu_dt<NDM_U8> {
    typedef uint8_t T;
    static NDM__HD uint8_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
    static NDM__HD T st(float v) { return ndm__sat_u8((double)v); }
    static NDM__HD T st(double v) { return ndm__sat_u8(v); }
};
template <> struct ndm__cu_dt<NDM_I32> {
    typedef int32_t T;
    static NDM__HD int32_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
    static NDM__HD T st(float v) { return ndm__sat_i32((double)v); }
    static NDM__HD T st(double v) { return ndm__sat_i32(v); }
};
template <> struct ndm__cu_dt<NDM_I64> {
    typedef int64_t T;
    static NDM__HD int64_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
    static NDM__HD T st(float v) { return ndm__sat_i64((double)v); }
    static NDM__HD T st(double v) { return ndm__sat_i64(v); }
};
template <> struct ndm__cu_dt<NDM_F16> {
    typedef uint16_t T;
    static NDM__HD float ld(T x) { return ndm__f16_to_f32(x); }
    template <class V> static NDM__HD T st(V v) { return ndm__f32_to_f16((float)v); }
    static NDM__HD T st(double v) { return ndm__f32_to_f16(ndm__f64_to_f32_odd(v)); }
};
template <> struct ndm__cu_dt<NDM_BF16> {
    typedef uint16_t T;
    static NDM__HD float ld(T x) { return ndm__bf16_to_f32(x); }
    template <class V> static NDM__HD T st(V v) { return ndm__f32_to_bf16((float)v); }
    static NDM__HD T st(double v) { return ndm__f32_to_bf16(ndm__f64_to_f32_odd(v)); }
};
template <> struct ndm__cu_dt<NDM_F32> {
    typedef float T;
    static NDM__HD float ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
};
template <> struct ndm__cu_dt<NDM_F64> {
    typedef double T;
    static NDM__HD double ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
};

/* X(dtype enum): every dtype, for switch tables over templates. */
#define NDM__CU_DTYPES(X)                                                       \
    X(NDM_BOOL) X(NDM_U8) X(NDM_I32) X(NDM_I64) X(NDM_F16) X(NDM_BF16) X(NDM_F32) X(NDM_F64)

/* v (a float, double or int64_t) converted to dtype dt at p, by the CPU's
 * store rules (saturating from floats, wrapping between integers). A
 * switch, not a template parameter: where the output dtype follows from the
 * input's, templating on both would only multiply the instantiations. */
template <class X> NDM__HD void ndm__cu_st_any(void *p, ndm_dtype dt, X v)
{
    switch (dt) {
#define NDM__CU_ST_CASE_(E)                                                     \
    case E:                                                                     \
        *(typename ndm__cu_dt<E>::T *)p = ndm__cu_dt<E>::st(v);                 \
        break;
        NDM__CU_DTYPES(NDM__CU_ST_CASE_)
#undef NDM__CU_ST_CASE_
    }
}

#endif
