/* Host execution's internals shared by its runtime, launch shim, driver and
 * cuBLAS parts: devices, streams, the memory map, errors (test-only). */
#ifndef NDM_CUDA_HOST_HX_H
#define NDM_CUDA_HOST_HX_H

#include <atomic>
#include <functional>
#include <mutex>

#include "cuda_runtime.h"

namespace ndm__hx {

enum { MAX_DEVICES = 16 };

struct device {
    std::atomic<int> broken{0};  /* set by a kernel fault: every call fails */
    size_t capacity = 0;         /* bytes */
    cudaStream_t null_stream = nullptr;
};

/* The device count and each device, set up once. */
int device_count();
device &dev(int i);
/* The calling thread's current device. */
int current_device();

/* Record e as the calling thread's last error; returns it. */
cudaError_t fail(cudaError_t e);
/* cudaErrorLaunchFailure, recorded, when device d is broken; else success. */
cudaError_t check_alive(int d);
/* Break device d's context, saying why on stderr (once). */
void break_device(int d, const char *why);

/* A stream handle as given (NULL and the special handles name the current
 * device's default stream); nullptr for a destroyed or foreign handle is
 * not detected. */
cudaStream_t resolve(cudaStream_t s);
int stream_device(cudaStream_t s);
/* Run fn on s: now, in order after anything queued, or later if s is held.
 * Fails with the sticky error when the device is broken. */
cudaError_t submit(cudaStream_t s, std::function<void()> fn);

/* The memory map: [p, p+n) lies wholly in device memory (a cudaMalloc block
 * or a mapped, accessible driver range). */
bool is_device_range(const void *p, size_t n);
/* Device memory accounting for the driver's physical allocations: false
 * when the device has not `n` bytes left. */
bool reserve_bytes(int d, size_t n);
void unreserve_bytes(int d, size_t n);
/* Driver mappings enter and leave the memory map as device ranges. */
void map_range(void *p, size_t n, int d);
void unmap_range(void *p, size_t n);

/* Run a validated grid on the calling thread; false (device to be broken,
 * why filled in) when a thread trapped or a barrier could not complete. */
bool run_grid(dim3 grid, dim3 block, size_t shmem, void (*body)(void *), void *ctx, char *why,
              size_t why_len);
/* The largest dynamic shared memory a launch of kernel may ask for. */
size_t dyn_shared_limit(const void *kernel);

} // namespace ndm__hx

#endif
