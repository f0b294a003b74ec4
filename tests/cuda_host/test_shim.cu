/* Host execution's own suite: kernels written as for a GPU (launched with
 * NDM__LAUNCH) run under the launch shim, and the stand-in runtime's streams,
 * events, errors, memory, driver VMM and cuBLAS keep CUDA's semantics. */
#include <cuda.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "backends/cuda/iter.cuh"

/* Devices of this suite (NDM_HX_DEVICES=4): the failure tests break their
 * own device, so the others stay usable in the same process. */
enum { DEV_OK = 0, DEV_BARRIER = 1, DEV_TRAP = 2, DEV_WARP = 3 };

#define CHECK(call) assert_int_equal((int)(call), (int)cudaSuccess)

template <class T> static T *dev_alloc(size_t n)
{
    void *p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(T)));
    return (T *)p;
}

/* ---- kernels -------------------------------------------------------------------- */

/* Block sums by a shared-memory tree, then one atomicAdd per block. */
__global__ void k_tree_sum(const int *x, int n, int *total, int *block_sums)
{
    __shared__ int buf[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        block_sums[blockIdx.x] = buf[0];
        atomicAdd(total, buf[0]);
    }
}

/* Warp sums by shuffles: down, xor (all lanes get it), an inclusive scan
 * with up, a broadcast of lane 5, and a ballot of odd values. */
__global__ void k_warp(const float *x, float *down, float *xored, float *scan, float *bcast,
                       unsigned *ballot)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    float v = x[i], d = v, a = v, s = v;
    for (int o = 16; o > 0; o >>= 1)
        d += __shfl_down_sync(0xffffffffu, d, o);
    for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
    for (int o = 1; o < 32; o <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o)
            s += t;
    }
    float b = __shfl_sync(0xffffffffu, v, 5);
    unsigned m = __ballot_sync(0xffffffffu, ((int)v) & 1);
    if (lane == 0)
        down[i / 32] = d;
    xored[i] = a;
    scan[i] = s;
    bcast[i] = b;
    if (lane == 0)
        ballot[i / 32] = m;
}

/* Every thread takes a ticket: the old values must be a permutation. */
__global__ void k_atomics(unsigned *counter, unsigned *tickets, int *mx, int *mn, unsigned *cas_wins,
                          unsigned long long *sum64, float *fsum, double *dsum)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tickets[i] = atomicAdd(counter, 1u);
    atomicMax(mx, i * 7 % 1000);
    atomicMin(mn, 1000 - i);
    if (atomicCAS(cas_wins, 0u, (unsigned)i + 1) == 0u)
        atomicAdd(cas_wins + 1, 1u); /* exactly one thread wins */
    atomicAdd(sum64, (unsigned long long)i << 33);
    atomicAdd(fsum, 0.5f);
    atomicAdd(dsum, 0.25);
}

/* Reads dynamic shared memory before writing it (wrong on purpose), then
 * uses it properly. */
__global__ void k_dyn_shared(unsigned *first_seen, int *out)
{
    NDM__DYN_SHARED(int, sh);
    if (threadIdx.x == 0)
        first_seen[blockIdx.x] = (unsigned)sh[blockDim.x - 1];
    __syncthreads();
    sh[threadIdx.x] = (int)(threadIdx.x * 3);
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = sh[blockDim.x - 1 - threadIdx.x];
}

/* threadIdx over a 3-D block, warps by linear index. */
__global__ void k_index(unsigned *out)
{
    unsigned lin = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned per = blockDim.x * blockDim.y * blockDim.z;
    unsigned lane0 = __shfl_sync(0xffffffffu, lin, 0);
    out[blk * per + lin] = lane0 * 1000 + lin;
}

__global__ void k_no_sync(int *out, int n)
{
    NDM__CU_LOOP(int, i, n)
    out[i] = i * 2;
}

__global__ void k_divergent_barrier(int *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_exit_before_shuffle(int *out)
{
    if (threadIdx.x >= 20)
        return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_trap(int *out)
{
    if (threadIdx.x == 3)
        __trap();
    out[threadIdx.x] = 1;
}

__global__ void k_fill(int *out, int v, int n)
{
    NDM__CU_LOOP(int, i, n)
    out[i] = v;
}

/* ---- the launch shim -------------------------------------------------------------- */

static void test_shim_shared_memory_tree_reduction(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 1000, blocks = 4;
    std::vector<int> h(n);
    long want = 0;
    for (int i = 0; i < n; i++)
        want += h[i] = (i * 37) % 101 - 50;
    int *x = dev_alloc<int>(n), *total = dev_alloc<int>(1), *bs = dev_alloc<int>(blocks);
    CHECK(cudaMemcpy(x, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(total, 0, sizeof(int)));
    unsigned long long parks = ndm__hx_parks();
    NDM__LAUNCH(blocks, 256, 0, nullptr, k_tree_sum)(x, n, total, bs);
    CHECK(cudaGetLastError());
    int got = 0, hb[blocks];
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hb, bs, sizeof hb, cudaMemcpyDeviceToHost));
    assert_int_equal(got, want);
    for (int b = 0; b < blocks; b++) {
        long w = 0;
        for (int i = b * 256; i < (b + 1) * 256 && i < n; i++)
            w += h[i];
        assert_int_equal(hb[b], w);
    }
    /* 9 barriers, every thread but the last to arrive waits at each */
    assert_int_equal(ndm__hx_parks() - parks, (unsigned long long)blocks * 9 * 255);
    CHECK(cudaFree(x));
    CHECK(cudaFree(total));
    CHECK(cudaFree(bs));
}

static void test_shim_warp_shuffles_and_ballot(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 128;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++)
        h[i] = (float)((i * 13) % 29);
    float *x = dev_alloc<float>(n), *down = dev_alloc<float>(n / 32), *xo = dev_alloc<float>(n),
          *scan = dev_alloc<float>(n), *bc = dev_alloc<float>(n);
    unsigned *ballot = dev_alloc<unsigned>(n / 32);
    CHECK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    NDM__LAUNCH(2, 64, 0, nullptr, k_warp)(x, down, xo, scan, bc, ballot);
    CHECK(cudaGetLastError());
    std::vector<float> hd(n / 32), hx(n), hs(n), hbc(n);
    std::vector<unsigned> hbal(n / 32);
    CHECK(cudaMemcpy(hd.data(), down, hd.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hx.data(), xo, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hs.data(), scan, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hbc.data(), bc, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hbal.data(), ballot, hbal.size() * 4, cudaMemcpyDeviceToHost));
    for (int w = 0; w < n / 32; w++) {
        float sum = 0, run = 0;
        unsigned odd = 0;
        for (int l = 0; l < 32; l++) {
            sum += h[w * 32 + l];
            odd |= ((int)h[w * 32 + l] & 1) ? 1u << l : 0;
        }
        assert_true(hd[w] == sum);
        assert_int_equal(hbal[w], odd);
        for (int l = 0; l < 32; l++) {
            run += h[w * 32 + l];
            assert_true(hx[w * 32 + l] == sum);
            assert_true(hs[w * 32 + l] == run);
            assert_true(hbc[w * 32 + l] == h[w * 32 + 5]);
        }
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(down));
    CHECK(cudaFree(xo));
    CHECK(cudaFree(scan));
    CHECK(cudaFree(bc));
    CHECK(cudaFree(ballot));
}

static void test_shim_atomics_return_old_values(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 3 * 128;
    unsigned *counter = dev_alloc<unsigned>(1), *tickets = dev_alloc<unsigned>(n),
             *cas = dev_alloc<unsigned>(2);
    int *mx = dev_alloc<int>(1), *mn = dev_alloc<int>(1);
    unsigned long long *s64 = dev_alloc<unsigned long long>(1);
    float *fs = dev_alloc<float>(1);
    double *ds = dev_alloc<double>(1);
    CHECK(cudaMemset(counter, 0, 4));
    CHECK(cudaMemset(cas, 0, 8));
    CHECK(cudaMemset(mx, 0, 4));
    int big = 1 << 30;
    CHECK(cudaMemcpy(mn, &big, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(s64, 0, 8));
    CHECK(cudaMemset(fs, 0, 4));
    CHECK(cudaMemset(ds, 0, 8));
    NDM__LAUNCH(3, 128, 0, nullptr, k_atomics)(counter, tickets, mx, mn, cas, s64, fs, ds);
    CHECK(cudaGetLastError());
    std::vector<unsigned> t(n);
    CHECK(cudaMemcpy(t.data(), tickets, n * 4, cudaMemcpyDeviceToHost));
    std::vector<int> seen(n, 0);
    for (unsigned v : t) {
        assert_true(v < (unsigned)n);
        seen[v]++;
    }
    for (int c : seen)
        assert_int_equal(c, 1);
    unsigned hc[2], hcount;
    int hmx, hmn;
    unsigned long long h64;
    float hf;
    double hdd;
    CHECK(cudaMemcpy(&hcount, counter, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hc, cas, 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hmx, mx, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hmn, mn, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&h64, s64, 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hf, fs, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hdd, ds, 8, cudaMemcpyDeviceToHost));
    int wmx = 0;
    unsigned long long w64 = 0;
    for (int i = 0; i < n; i++) {
        wmx = i * 7 % 1000 > wmx ? i * 7 % 1000 : wmx;
        w64 += (unsigned long long)i << 33;
    }
    assert_int_equal(hcount, n);
    assert_int_equal(hc[1], 1);
    assert_true(hc[0] >= 1 && hc[0] <= (unsigned)n);
    assert_int_equal(hmx, wmx);
    assert_int_equal(hmn, 1000 - (n - 1));
    assert_true(h64 == w64);
    assert_true(hf == 0.5f * n);
    assert_true(hdd == 0.25 * n);
    for (void *p : {(void *)counter, (void *)tickets, (void *)cas, (void *)mx, (void *)mn,
                    (void *)s64, (void *)fs, (void *)ds})
        CHECK(cudaFree(p));
}

static void test_shim_dynamic_shared_memory_starts_poisoned(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int threads = 64, blocks = 3;
    unsigned *first = dev_alloc<unsigned>(blocks);
    int *out = dev_alloc<int>(threads * blocks);
    NDM__LAUNCH(blocks, threads, threads * sizeof(int), nullptr, k_dyn_shared)(first, out);
    CHECK(cudaGetLastError());
    unsigned hf[blocks];
    std::vector<int> ho(threads * blocks);
    CHECK(cudaMemcpy(hf, first, sizeof hf, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost));
    /* every block, not only the first, starts from the poison pattern */
    for (int b = 0; b < blocks; b++)
        assert_int_equal(hf[b], 0xffffffffu);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < threads; t++)
            assert_int_equal(ho[b * threads + t], (threads - 1 - t) * 3);
    /* more than the default 48 KiB needs the kernel's opt-in, as on a GPU */
    NDM__LAUNCH(1, threads, 64 << 10, nullptr, k_dyn_shared)(first, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(cudaGetLastError()); /* not sticky */
    CHECK(cudaFuncSetAttribute((const void *)k_dyn_shared,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    NDM__LAUNCH(1, threads, 64 << 10, nullptr, k_dyn_shared)(first, out);
    CHECK(cudaGetLastError());
    CHECK(cudaFree(first));
    CHECK(cudaFree(out));
}

static void test_shim_thread_indices_and_warps_in_3d_blocks(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    dim3 grid(2, 2, 1), block(8, 4, 3); /* 96 threads: three warps */
    const unsigned per = 96, total = 4 * per;
    unsigned *out = dev_alloc<unsigned>(total);
    NDM__LAUNCH(grid, block, 0, nullptr, k_index)(out);
    CHECK(cudaGetLastError());
    std::vector<unsigned> h(total);
    CHECK(cudaMemcpy(h.data(), out, total * 4, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < total; i++) {
        unsigned lin = i % per;
        assert_int_equal(h[i], (lin / 32 * 32) * 1000 + lin);
    }
    CHECK(cudaFree(out));
}

static void test_shim_threads_that_never_wait_cost_no_switch(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 5000;
    int *out = dev_alloc<int>(n);
    unsigned long long parks = ndm__hx_parks(), launches = ndm__hx_launch_count();
    NDM__LAUNCH(4, 1024, 0, nullptr, k_no_sync)(out, n);
    CHECK(cudaGetLastError());
    assert_int_equal(ndm__hx_parks(), parks);
    assert_int_equal(ndm__hx_launch_count(), launches + 1);
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), out, n * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        assert_int_equal(h[i], 2 * i);
    CHECK(cudaFree(out));
}

static void test_shim_bad_launch_configuration_is_not_sticky(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    int *out = dev_alloc<int>(4);
    unsigned long long launches = ndm__hx_launch_count();
    NDM__LAUNCH(1, 2048, 0, nullptr, k_fill)(out, 1, 4);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    NDM__LAUNCH(0, 32, 0, nullptr, k_fill)(out, 1, 4);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    NDM__LAUNCH(1, dim3(32, 1, 65), 0, nullptr, k_fill)(out, 1, 4);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(ndm__hx_launch_count(), launches);
    CHECK(cudaGetLastError());
    NDM__LAUNCH(1, 32, 0, nullptr, k_fill)(out, 7, 4);
    CHECK(cudaGetLastError());
    CHECK(cudaFree(out));
}

/* ---- failures break their device, as faults do ----------------------------------- */

/* After a fault on device d: the launch itself succeeded, every later call
 * that uses d reports cudaErrorLaunchFailure, and device DEV_OK still works. */
static void assert_broken(int d)
{
    CHECK(cudaSetDevice(d));
    assert_int_equal(cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* sticky */
    void *p = nullptr;
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorLaunchFailure);
    assert_null(p);
    int *out = nullptr;
    NDM__LAUNCH(1, 32, 0, nullptr, k_fill)(out, 1, 1);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    /* the last error was recorded on this OS thread: read once, then clear */
    CHECK(cudaSetDevice(DEV_OK));
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    CHECK(cudaGetLastError());
    int *q = dev_alloc<int>(1);
    NDM__LAUNCH(1, 32, 0, nullptr, k_fill)(q, 5, 1);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(q));
}

static void test_shim_divergent_barrier_is_a_launch_failure(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_BARRIER));
    int *out = dev_alloc<int>(64);
    NDM__LAUNCH(1, 64, 0, nullptr, k_divergent_barrier)(out);
    /* found asynchronously, as on a GPU: the launch went through */
    CHECK(cudaGetLastError());
    assert_broken(DEV_BARRIER);
    CHECK(cudaSetDevice(DEV_BARRIER));
    /* memory is still freed, the error still reported */
    assert_int_equal(cudaFree(out), cudaErrorLaunchFailure);
    CHECK(cudaSetDevice(DEV_OK));
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* that cudaFree's */
    CHECK(cudaGetLastError());
}

static void test_shim_exited_lanes_at_a_shuffle_are_a_launch_failure(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_WARP));
    int *out = dev_alloc<int>(32);
    NDM__LAUNCH(1, 32, 0, nullptr, k_exit_before_shuffle)(out);
    CHECK(cudaGetLastError());
    assert_broken(DEV_WARP);
    CHECK(cudaSetDevice(DEV_WARP));
    assert_int_equal(cudaFree(out), cudaErrorLaunchFailure);
    CHECK(cudaSetDevice(DEV_OK));
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* that cudaFree's */
    CHECK(cudaGetLastError());
}

static void test_shim_trap_breaks_the_context(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_TRAP));
    int *out = dev_alloc<int>(64);
    CHECK(cudaMemset(out, 0, 64 * sizeof(int)));
    NDM__LAUNCH(4, 64, 0, nullptr, k_trap)(out);
    CHECK(cudaGetLastError());
    assert_broken(DEV_TRAP);
    CHECK(cudaSetDevice(DEV_TRAP));
    int h[64];
    assert_int_equal(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost), cudaErrorLaunchFailure);
    assert_int_equal(cudaFree(out), cudaErrorLaunchFailure);
    CHECK(cudaSetDevice(DEV_OK));
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* that cudaFree's */
    CHECK(cudaGetLastError());
}

/* ---- streams and events --------------------------------------------------------------- */

/* out[i] += v: launched again by each replay, so replays add up. */
__global__ void k_add(int *out, int v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] += v;
}

/* Capture records a stream's work without running it; each launch of the
 * instantiated graph runs all of it again, in order, on the launch stream. */
static void test_graph_capture_records_and_launch_replays(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 64;
    int *buf = dev_alloc<int>(n);
    int *pinned = nullptr;
    CHECK(cudaHostAlloc((void **)&pinned, n * sizeof(int), 0));
    int h[n];
    cudaStream_t s, t;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(buf, 0, n * sizeof(int), s));
    cudaStreamCaptureStatus cs;
    CHECK(cudaStreamIsCapturing(s, &cs));
    assert_int_equal(cs, cudaStreamCaptureStatusNone);
    unsigned long long l0 = ndm__hx_launch_count();
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaStreamIsCapturing(s, &cs));
    assert_int_equal(cs, cudaStreamCaptureStatusActive);
    NDM__LAUNCH(1, 64, 0, s, k_add)(buf, 2, n);
    NDM__LAUNCH(1, 64, 0, s, k_add)(buf, 3, n);
    CHECK(cudaMemcpyAsync(pinned, buf, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaGetLastError());
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal),
                     cudaErrorIllegalState);
    (void)cudaGetLastError();
    cudaGraph_t g = nullptr;
    CHECK(cudaStreamEndCapture(s, &g));
    assert_non_null(g);
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    assert_int_equal(nodes, 3);
    /* nothing ran */
    assert_int_equal(ndm__hx_launch_count(), l0);
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[0], 0);
    cudaGraphExec_t x = nullptr;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaGraphDestroy(g)); /* the instance keeps its own copy */
    for (int k = 1; k <= 3; k++) {
        CHECK(cudaGraphLaunch(x, k == 3 ? t : s));
        CHECK(cudaStreamSynchronize(k == 3 ? t : s));
        assert_int_equal(pinned[0], 5 * k);
        assert_int_equal(pinned[n - 1], 5 * k);
    }
    assert_int_equal(ndm__hx_launch_count(), l0 + 6);
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(t));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(buf));
}

/* A call that cannot be captured (an allocation, a wait for the device, a
 * copy with pageable memory) fails while the thread captures, invalidates
 * the capture, and the capture's end says so; the device goes on. */
static void test_graph_uncapturable_calls_invalidate_the_capture(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 16;
    int *buf = dev_alloc<int>(n);
    int h[n] = {0};
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* the legacy default stream cannot be captured */
    assert_int_equal(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal),
                     cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    for (int which = 0; which < 6; which++) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        NDM__LAUNCH(1, 16, 0, s, k_add)(buf, 1, n);
        cudaError_t e = cudaSuccess;
        void *p = nullptr;
        switch (which) {
        case 0: e = cudaMalloc(&p, 256); break;
        case 1: e = cudaStreamSynchronize(s); break;
        case 2: e = cudaDeviceSynchronize(); break;
        case 3: e = cudaMemcpyAsync(h, buf, sizeof h, cudaMemcpyDeviceToHost, s); break;
        case 4: e = cudaMemcpy(buf, h, sizeof h, cudaMemcpyHostToDevice); break;
        case 5: e = cudaStreamQuery(s); break;
        }
        assert_int_equal(e, cudaErrorStreamCaptureUnsupported);
        assert_null(p);
        cudaStreamCaptureStatus cs;
        CHECK(cudaStreamIsCapturing(s, &cs));
        assert_int_equal(cs, cudaStreamCaptureStatusInvalidated);
        /* later work on the stream is refused too */
        NDM__LAUNCH(1, 16, 0, s, k_add)(buf, 1, n);
        assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
        cudaGraph_t g = (cudaGraph_t)0x1;
        assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
        assert_null(g);
        (void)cudaGetLastError();
        CHECK(cudaStreamIsCapturing(s, &cs));
        assert_int_equal(cs, cudaStreamCaptureStatusNone);
    }
    /* ending from another thread than the one that began */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t other = cudaSuccess;
    std::thread th([&] {
        cudaGraph_t g = nullptr;
        other = cudaStreamEndCapture(s, &g);
    });
    th.join();
    assert_int_equal(other, cudaErrorStreamCaptureWrongThread);
    cudaGraph_t g = nullptr;
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphDestroy(g));
    /* nothing captured ran, and the device still works */
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    int *q = dev_alloc<int>(4);
    CHECK(cudaFree(q));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(buf));
}

static void test_stream_hold_queues_work_until_released(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    const int n = 100;
    int *buf = dev_alloc<int>(n);
    int h[n];
    cudaStream_t s, t;
    cudaEvent_t e;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreate(&t));
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK(cudaEventQuery(e)); /* never recorded: complete */
    CHECK(cudaMemsetAsync(buf, 0, n * sizeof(int), s));

    ndm__hx_stream_hold(s, 1);
    NDM__LAUNCH(1, 64, 0, s, k_fill)(buf, 3, n);
    CHECK(cudaEventRecord(e, s));
    NDM__LAUNCH(1, 64, 0, s, k_fill)(buf, 4, n);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(cudaEventQuery(e), cudaErrorNotReady);
    CHECK(cudaGetLastError()); /* not ready is no error */
    /* the queued kernels have not run: another stream reads the old data */
    CHECK(cudaMemcpyAsync(h, buf, sizeof h, cudaMemcpyDeviceToHost, t));
    CHECK(cudaStreamSynchronize(t));
    assert_int_equal(h[0], 0);
    assert_int_equal(h[n - 1], 0);
    /* waiting for the event runs the hold's queue up to it, not past it */
    CHECK(cudaStreamWaitEvent(t, e, 0));
    CHECK(cudaEventQuery(e));
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    CHECK(cudaMemcpyAsync(h, buf, sizeof h, cudaMemcpyDeviceToHost, t));
    CHECK(cudaStreamSynchronize(t));
    assert_int_equal(h[0], 3);
    assert_int_equal(h[n - 1], 3);
    /* release: the rest runs in order */
    ndm__hx_stream_hold(s, 0);
    CHECK(cudaStreamQuery(s));
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[0], 4);

    /* a synchronisation finishes held work too, and the hold stays on */
    ndm__hx_stream_hold(s, 1);
    NDM__LAUNCH(1, 64, 0, s, k_fill)(buf, 5, n);
    CHECK(cudaEventRecord(e, s));
    assert_int_equal(cudaEventQuery(e), cudaErrorNotReady);
    CHECK(cudaEventSynchronize(e));
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[7], 5);
    NDM__LAUNCH(1, 64, 0, s, k_fill)(buf, 6, n);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamQuery(s));
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[9], 6);
    ndm__hx_stream_hold(s, 0);

    /* destroying a held stream still runs its work; so does cudaFree */
    ndm__hx_stream_hold(s, 1);
    NDM__LAUNCH(1, 64, 0, s, k_fill)(buf, 8, n);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaMemcpy(h, buf, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[1], 8);
    /* a device-wide hold takes every stream of the device, the default too */
    assert_true(ndm__hx_device_hold(DEV_OK, 1) >= 2);
    NDM__LAUNCH(1, 64, 0, nullptr, k_fill)(buf, 9, n);
    NDM__LAUNCH(1, 64, 0, t, k_fill)(buf, 10, n);
    assert_int_equal(cudaStreamQuery(nullptr), cudaErrorNotReady);
    assert_int_equal(cudaStreamQuery(t), cudaErrorNotReady);
    assert_int_equal(ndm__hx_device_hold(DEV_OK, 0), ndm__hx_device_hold(DEV_OK, 0));
    CHECK(cudaStreamQuery(nullptr));
    CHECK(cudaStreamQuery(t));
    CHECK(cudaStreamDestroy(t));
    CHECK(cudaEventDestroy(e));
    CHECK(cudaFree(buf));
}

static void test_stream_copies_treat_pinned_and_pageable_memory_as_cuda_does(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    int *d = dev_alloc<int>(2);
    int *pinned = nullptr;
    CHECK(cudaMallocHost((void **)&pinned, 2 * sizeof(int)));
    int pageable[2] = {1, 1};
    pinned[0] = pinned[1] = 1;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    ndm__hx_stream_hold(s, 1);
    /* from pageable memory: staged at the call, the buffer is free again */
    CHECK(cudaMemcpyAsync(d, pageable, sizeof(int), cudaMemcpyHostToDevice, s));
    pageable[0] = 2;
    /* from pinned memory: read when the stream gets there */
    CHECK(cudaMemcpyAsync(d + 1, pinned, sizeof(int), cudaMemcpyHostToDevice, s));
    pinned[0] = 2;
    ndm__hx_stream_hold(s, 0);
    int h[2];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    assert_int_equal(h[0], 1);
    assert_int_equal(h[1], 2);
    /* into pinned memory: arrives with the stream; into pageable: at return */
    ndm__hx_stream_hold(s, 1);
    pinned[0] = pinned[1] = 0;
    CHECK(cudaMemcpyAsync(pinned, d, sizeof h, cudaMemcpyDeviceToHost, s));
    assert_int_equal(pinned[0], 0);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    CHECK(cudaMemcpyAsync(pageable, d, sizeof h, cudaMemcpyDeviceToHost, s));
    assert_int_equal(pageable[0], 1);
    assert_int_equal(pinned[1], 2); /* the earlier copy ran first, in order */
    CHECK(cudaStreamQuery(s));
    ndm__hx_stream_hold(s, 0);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(d));
}

static void test_event_elapsed_time_needs_timing(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    cudaEvent_t a, b, c;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventCreateWithFlags(&c, cudaEventDisableTiming));
    float ms = -1;
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);
    CHECK(cudaEventRecord(a, nullptr));
    CHECK(cudaEventRecord(b, nullptr));
    CHECK(cudaEventRecord(c, nullptr));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    assert_true(ms >= 0);
    assert_int_equal(cudaEventElapsedTime(&ms, a, c), cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle ? cudaSuccess : cudaErrorUnknown);
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    CHECK(cudaEventDestroy(c));
}

/* ---- memory ---------------------------------------------------------------------------- */

static void test_memory_is_tracked_and_bounded(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    size_t free0, total;
    CHECK(cudaMemGetInfo(&free0, &total));
    assert_int_equal(total, (size_t)64 << 20); /* NDM_HX_MEMORY_MB=64 */
    void *p = nullptr;
    CHECK(cudaMalloc(&p, 1000));
    assert_int_equal((uintptr_t)p % 256, 0);
    size_t free1;
    CHECK(cudaMemGetInfo(&free1, &total));
    assert_int_equal(free0 - free1, 1024);
    /* out of memory: reported, not sticky */
    void *q = (void *)1;
    assert_int_equal(cudaMalloc(&q, (size_t)65 << 20), cudaErrorMemoryAllocation);
    assert_null(q);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError());
    /* a pointer that is not a block's start is refused */
    assert_int_equal(cudaFree((char *)p + 256), cudaErrorInvalidValue);
    int local[4] = {0};
    assert_int_equal(cudaFree(local), cudaErrorInvalidValue);
    /* copies check their device sides */
    assert_int_equal(cudaMemcpy(local, local, sizeof local, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(local, (char *)p + 990, 16, cudaMemcpyDeviceToHost),
                     cudaErrorInvalidValue);
    CHECK(cudaMemcpy(local, (char *)p + 984, 16, cudaMemcpyDeviceToHost));
    assert_int_equal(cudaMemset(local, 0, 4), cudaErrorInvalidValue);
    cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, (char *)p + 10));
    assert_int_equal(at.type, cudaMemoryTypeDevice);
    CHECK(cudaPointerGetAttributes(&at, local));
    assert_int_equal(at.type, cudaMemoryTypeUnregistered);
    CHECK(cudaFree(p));
    assert_int_equal(cudaFree(p), cudaErrorInvalidValue); /* twice */
    CHECK(cudaMemGetInfo(&free1, &total));
    assert_int_equal(free1, free0);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue ? cudaSuccess : cudaErrorUnknown);

    void *pinned = nullptr;
    CHECK(cudaHostAlloc(&pinned, 100, cudaHostAllocDefault));
    CHECK(cudaPointerGetAttributes(&at, pinned));
    assert_int_equal(at.type, cudaMemoryTypeHost);
    assert_int_equal(cudaFree(pinned), cudaErrorInvalidValue);
    CHECK(cudaFreeHost(pinned));
    assert_int_equal(cudaFreeHost(pinned), cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue ? cudaSuccess : cudaErrorUnknown);
}

static void test_driver_vmm_grows_a_range_in_place(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = DEV_OK;
    size_t g = 0;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_SUCCESS);
    assert_int_equal(g, (size_t)2 << 20);
    CUdeviceptr base = 0;
    assert_int_equal(cuMemAddressReserve(&base, 8 * g, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(base % g, 0);
    size_t free0, total, free1;
    CHECK(cudaMemGetInfo(&free0, &total));
    CUmemGenericAllocationHandle h[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cuMemCreate(&h[i], g, &prop, 0), CUDA_SUCCESS);
        assert_int_equal(cuMemMap(base + i * g, g, 0, h[i], 0), CUDA_SUCCESS);
    }
    CHECK(cudaMemGetInfo(&free1, &total));
    assert_int_equal(free0 - free1, 2 * g);
    /* mapped but not accessible: not device memory yet */
    int v[4] = {1, 2, 3, 4};
    assert_int_equal(cudaMemcpy((void *)(base + g - 8), v, sizeof v, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    CUmemAccessDesc acc;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    assert_int_equal(cuMemSetAccess(base, 2 * g, &acc, 1), CUDA_SUCCESS);
    /* one copy across the two physical allocations */
    CHECK(cudaMemcpy((void *)(base + g - 8), v, sizeof v, cudaMemcpyHostToDevice));
    int back[4];
    CHECK(cudaMemcpy(back, (void *)(base + g - 8), sizeof back, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, v, sizeof v);
    /* past the mapped part: refused */
    assert_int_equal(cudaMemcpy((void *)(base + 2 * g - 8), v, sizeof v, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue ? cudaSuccess : cudaErrorUnknown);
    /* out of device memory: 64 MiB in all */
    CUmemGenericAllocationHandle big;
    assert_int_equal(cuMemCreate(&big, 32 * g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* a range with mappings cannot be freed; unmapping a part of one is refused */
    assert_int_equal(cuMemAddressFree(base, 8 * g), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(base, g, 0, h[1], 0), CUDA_ERROR_ALREADY_MAPPED);
    assert_int_equal(cuMemUnmap(base, 2 * g), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++)
        assert_int_equal(cuMemRelease(h[i]), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h[0]), CUDA_ERROR_INVALID_VALUE);
    CHECK(cudaMemGetInfo(&free1, &total));
    assert_int_equal(free1, free0);
    assert_int_equal(cuMemAddressFree(base, 8 * g), CUDA_SUCCESS);
    const char *msg = nullptr;
    assert_int_equal(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &msg), CUDA_SUCCESS);
    assert_string_equal(msg, "out of memory");
}

/* ---- cuBLAS ---------------------------------------------------------------------------- */

/* Column-major reference: C = alpha op(A) op(B) + beta C. */
static void ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double *A, int lda,
                     const double *B, int ldb, double beta, double *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int p = 0; p < k; p++)
                acc += (ta ? A[i * lda + p] : A[p * lda + i]) * (tb ? B[p * ldb + j] : B[j * ldb + p]);
            C[j * ldc + i] = alpha * acc + beta * C[j * ldc + i];
        }
}

static void test_cublas_gemm_follows_column_major_semantics(void **state)
{
    (void)state;
    CHECK(cudaSetDevice(DEV_OK));
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    assert_int_equal(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    const int m = 5, n = 4, k = 3, batch = 3, lda = 6, ldb = 7, ldc = 8;
    const long long sa = 40, sb = 0, sc = 40; /* B broadcast over the batch */
    std::vector<double> A(batch * sa), B(64), C(batch * sc), W;
    for (size_t i = 0; i < A.size(); i++)
        A[i] = (double)((i * 7) % 11) - 5;
    for (size_t i = 0; i < B.size(); i++)
        B[i] = (double)((i * 5) % 13) - 6;
    for (size_t i = 0; i < C.size(); i++)
        C[i] = (double)(i % 9) - 4;
    double *dA = dev_alloc<double>(A.size()), *dB = dev_alloc<double>(B.size()),
           *dC = dev_alloc<double>(C.size());
    CHECK(cudaMemcpy(dA, A.data(), A.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, B.data(), B.size() * 8, cudaMemcpyHostToDevice));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            CHECK(cudaMemcpy(dC, C.data(), C.size() * 8, cudaMemcpyHostToDevice));
            double alpha = 1.5, beta = -0.5;
            assert_int_equal(cublasDgemmStridedBatched(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                       tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                                       &alpha, dA, lda, sa, dB, ldb, sb, &beta, dC,
                                                       ldc, sc, batch),
                             CUBLAS_STATUS_SUCCESS);
            W = C;
            for (int b = 0; b < batch; b++)
                ref_gemm(ta, tb, m, n, k, alpha, A.data() + b * sa, lda, B.data() + b * sb, ldb,
                         beta, W.data() + b * sc, ldc);
            std::vector<double> got(C.size());
            CHECK(cudaMemcpyAsync(got.data(), dC, C.size() * 8, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            for (size_t i = 0; i < C.size(); i++)
                assert_true(got[i] == W[i]); /* small integers: exact */
        }
    /* f32 through GemmEx, beta = 0 never reads C (NaN there stays unread) */
    float fa[6] = {1, 2, 3, 4, 5, 6}, fb[6] = {1, 0, -1, 2, 1, 0}, fc[4];
    float *dfa = dev_alloc<float>(6), *dfb = dev_alloc<float>(6), *dfc = dev_alloc<float>(4);
    CHECK(cudaMemcpy(dfa, fa, sizeof fa, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dfb, fb, sizeof fb, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dfc, 0xff, sizeof fc));
    float one = 1, zero = 0;
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dfa, CUDA_R_32F, 2,
                                  dfb, CUDA_R_32F, 3, &zero, dfc, CUDA_R_32F, 2,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    CHECK(cudaMemcpy(fc, dfc, sizeof fc, cudaMemcpyDeviceToHost));
    /* A = [1 3 5; 2 4 6], B = [1 2; 0 1; -1 0] */
    assert_true(fc[0] == -4 && fc[1] == -4 && fc[2] == 5 && fc[3] == 8);
    /* cuBLAS's argument checks */
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dfa, 1, dfb, 3, &zero,
                                 dfc, 2),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dfa, 2, dfb, 3, &zero,
                                 dfc, 2),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 3, &one, dfa, 2, dfb, 3,
                                 &zero, dfc, 2),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dfa, CUDA_R_32F, 2,
                                  dfb, CUDA_R_64F, 3, &zero, dfc, CUDA_R_32F, 2,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    assert_string_equal(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE),
                        "CUBLAS_STATUS_INVALID_VALUE");
    cudaStream_t got_s;
    assert_int_equal(cublasGetStream(h, &got_s), CUBLAS_STATUS_SUCCESS);
    assert_ptr_equal(got_s, s);
    /* held stream: the GEMM waits with the stream's other work */
    ndm__hx_stream_hold(s, 1);
    CHECK(cudaMemset(dfc, 0, sizeof fc));
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dfa, 2, dfb, 3, &zero,
                                 dfc, 2),
                     CUBLAS_STATUS_SUCCESS);
    CHECK(cudaMemcpy(fc, dfc, sizeof fc, cudaMemcpyDeviceToHost));
    assert_true(fc[0] == 0);
    ndm__hx_stream_hold(s, 0);
    CHECK(cudaMemcpy(fc, dfc, sizeof fc, cudaMemcpyDeviceToHost));
    assert_true(fc[0] == -4);
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    CHECK(cudaStreamDestroy(s));
    for (void *p : {(void *)dA, (void *)dB, (void *)dC, (void *)dfa, (void *)dfb, (void *)dfc})
        CHECK(cudaFree(p));
}

/* ---- OS threads -------------------------------------------------------------------------- */

/* Each OS thread runs its own launches with its own fibers and shared
 * memory; two threads on one stream are serialised as a stream is. */
static void test_shim_launches_from_several_threads(void **state)
{
    (void)state;
    const int n = 512, rounds = 40;
    cudaStream_t shared_s;
    CHECK(cudaSetDevice(DEV_OK));
    CHECK(cudaStreamCreate(&shared_s));
    std::atomic<int> bad{0};
    auto work = [&](int id) {
        if (cudaSetDevice(DEV_OK) != cudaSuccess) {
            bad++;
            return;
        }
        std::vector<int> h(n);
        for (int i = 0; i < n; i++)
            h[i] = i % 17 + id;
        int *x = nullptr, *total = nullptr, *bs = nullptr;
        if (cudaMalloc((void **)&x, n * 4) || cudaMalloc((void **)&total, 4) ||
            cudaMalloc((void **)&bs, 8 * 4)) {
            bad++;
            return;
        }
        cudaStream_t s = id == 0 ? shared_s : nullptr;
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < rounds; r++) {
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5))
                break;
            int got = -1;
            cudaMemcpyAsync(x, h.data(), n * 4, cudaMemcpyHostToDevice, s);
            cudaMemsetAsync(total, 0, 4, s);
            NDM__LAUNCH(2, 256, 0, s, k_tree_sum)(x, n, total, bs);
            cudaMemcpyAsync(&got, total, 4, cudaMemcpyDeviceToHost, s);
            if (cudaStreamSynchronize(s) != cudaSuccess)
                bad++;
            long want = 0;
            for (int v : h)
                want += v;
            if (got != want)
                bad++;
        }
        cudaFree(x);
        cudaFree(total);
        cudaFree(bs);
    };
    std::thread a(work, 0), b(work, 1), c(work, 2);
    a.join();
    b.join();
    c.join();
    assert_int_equal(bad.load(), 0);
    CHECK(cudaStreamDestroy(shared_s));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shim_shared_memory_tree_reduction),
        cmocka_unit_test(test_shim_warp_shuffles_and_ballot),
        cmocka_unit_test(test_shim_atomics_return_old_values),
        cmocka_unit_test(test_shim_dynamic_shared_memory_starts_poisoned),
        cmocka_unit_test(test_shim_thread_indices_and_warps_in_3d_blocks),
        cmocka_unit_test(test_shim_threads_that_never_wait_cost_no_switch),
        cmocka_unit_test(test_shim_bad_launch_configuration_is_not_sticky),
        cmocka_unit_test(test_shim_divergent_barrier_is_a_launch_failure),
        cmocka_unit_test(test_shim_exited_lanes_at_a_shuffle_are_a_launch_failure),
        cmocka_unit_test(test_shim_trap_breaks_the_context),
        cmocka_unit_test(test_stream_hold_queues_work_until_released),
        cmocka_unit_test(test_graph_capture_records_and_launch_replays),
        cmocka_unit_test(test_graph_uncapturable_calls_invalidate_the_capture),
        cmocka_unit_test(test_stream_copies_treat_pinned_and_pageable_memory_as_cuda_does),
        cmocka_unit_test(test_event_elapsed_time_needs_timing),
        cmocka_unit_test(test_memory_is_tracked_and_bounded),
        cmocka_unit_test(test_driver_vmm_grows_a_range_in_place),
        cmocka_unit_test(test_cublas_gemm_follows_column_major_semantics),
        cmocka_unit_test(test_shim_launches_from_several_threads),
    };
    return cmocka_run_group_tests_name("cuda_host_shim", tests, NULL, NULL);
}
