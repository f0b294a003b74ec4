/* Shared ground of the CUDA kernels: per-device state (one stream, a sticky
 * error), CUDA errors turned into statuses, element conversions, launch sizes. */
#ifndef NDM_CUDA_COMMON_CUH
#define NDM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

extern "C" {
#include "../../manager/error.h"
}

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

/* Grid-stride loops: enough blocks to fill the device, no more. */
#define NDM__CUDA_THREADS 256
static inline unsigned ndm__cuda_blocks(int64_t n)
{
    int64_t b = (n + NDM__CUDA_THREADS - 1) / NDM__CUDA_THREADS;
    /* 132 SMs x 16 resident blocks on an H100 is about 2100: beyond that a
     * block only loops, so the cap costs nothing and keeps the index math in
     * range. */
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* ---- element conversions -------------------------------------------------
 *
 * The same rules as the CPU reference (lib/backends/cpu/convert.h), bit for
 * bit, so the CPU can be the oracle of every CUDA test: float to integer
 * saturates (NaN gives 0), integer to integer wraps, anything to bool is
 * "!= 0", f16 and bf16 go through f32 with round to nearest even. */

#define NDM__HD __host__ __device__ __forceinline__

NDM__HD uint32_t ndm__cu_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

NDM__HD float ndm__cu_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

NDM__HD uint16_t ndm__cu_f32_to_f16(float x)
{
    uint32_t u = ndm__cu_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
        half++;
    return (uint16_t)half;
}

NDM__HD float ndm__cu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return ndm__cu_bits_f32(sign);
        float v = (float)man * 5.9604644775390625e-8f; /* exact: man * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31)
        return ndm__cu_bits_f32(sign | 0x7f800000u | (man << 13));
    return ndm__cu_bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

NDM__HD uint16_t ndm__cu_f32_to_bf16(float x)
{
    uint32_t u = ndm__cu_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

NDM__HD float ndm__cu_bf16_to_f32(uint16_t h) { return ndm__cu_bits_f32((uint32_t)h << 16); }

NDM__HD int64_t ndm__cu_sat_i64(double v)
{
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

NDM__HD int32_t ndm__cu_sat_i32(double v)
{
    if (v != v)
        return 0;
    if (v >= 2147483647.0)
        return INT32_MAX;
    if (v <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)v;
}

NDM__HD uint8_t ndm__cu_sat_u8(double v)
{
    if (v != v || v <= 0)
        return 0;
    if (v >= 255.0)
        return 255;
    return (uint8_t)v;
}

/* A double rounded to float "to odd" (see the CPU's convert.h): rounding it
 * again to f16/bf16 then gives what rounding the double once would. */
NDM__HD float ndm__cu_f64_to_f32_odd(double x)
{
    float f = (float)x;
    if ((double)f == x || x != x)
        return f;
    uint32_t u = ndm__cu_f32_bits(f);
    if (fabs((double)f) > fabs(x))
        u -= 1;
    u |= 1;
    return ndm__cu_bits_f32(u);
}

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
    static NDM__HD T st(float v) { return ndm__cu_sat_u8((double)v); }
    static NDM__HD T st(double v) { return ndm__cu_sat_u8(v); }
};
template <> struct ndm__cu_dt<NDM_I32> {
    typedef int32_t T;
    static NDM__HD int32_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
    static NDM__HD T st(float v) { return ndm__cu_sat_i32((double)v); }
    static NDM__HD T st(double v) { return ndm__cu_sat_i32(v); }
};
template <> struct ndm__cu_dt<NDM_I64> {
    typedef int64_t T;
    static NDM__HD int64_t ld(T x) { return x; }
    template <class V> static NDM__HD T st(V v) { return (T)v; }
    static NDM__HD T st(float v) { return ndm__cu_sat_i64((double)v); }
    static NDM__HD T st(double v) { return ndm__cu_sat_i64(v); }
};
template <> struct ndm__cu_dt<NDM_F16> {
    typedef uint16_t T;
    static NDM__HD float ld(T x) { return ndm__cu_f16_to_f32(x); }
    template <class V> static NDM__HD T st(V v) { return ndm__cu_f32_to_f16((float)v); }
    static NDM__HD T st(double v) { return ndm__cu_f32_to_f16(ndm__cu_f64_to_f32_odd(v)); }
};
template <> struct ndm__cu_dt<NDM_BF16> {
    typedef uint16_t T;
    static NDM__HD float ld(T x) { return ndm__cu_bf16_to_f32(x); }
    template <class V> static NDM__HD T st(V v) { return ndm__cu_f32_to_bf16((float)v); }
    static NDM__HD T st(double v) { return ndm__cu_f32_to_bf16(ndm__cu_f64_to_f32_odd(v)); }
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

#endif
