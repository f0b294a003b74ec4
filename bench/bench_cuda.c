/* The CUDA backend's core against the CUDA runtime's own copies, in the same run:
 * transfers through ndm_to, and strided or converting device copies through the table. */
#include <cuda_runtime.h>

#include "bench.h"
#include "ndm/ndm.h"
#include "ops/dispatch.h"

#define MIB ((size_t)1 << 20)

/* Median seconds of `reps` runs of fn(ud), each followed by a device sync. */
static double time_median(int reps, void (*fn)(void *), void *ud)
{
    double t[64];
    if (reps > 64)
        reps = 64;
    /* ndm's streams do not wait for the runtime's legacy stream, where the
     * anchors' device-to-device cudaMemcpy runs asynchronously: wait for both. */
    fn(ud); /* warm up: first-touch, module load */
    if (ndm_device_synchronize(NDM_CUDA(0)) != NDM_OK || cudaDeviceSynchronize() != cudaSuccess)
        return -1;
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now();
        fn(ud);
        if (ndm_device_synchronize(NDM_CUDA(0)) != NDM_OK ||
            cudaDeviceSynchronize() != cudaSuccess)
            return -1;
        t[i] = bench_now() - t0;
    }
    return bench_median(t, reps);
}

typedef struct job {
    ndm_array host, dev;
    ndm__tensor dst, src;
    void *raw_dev, *raw_host;
    size_t bytes;
    ndm_manager scratch;
} job;

static void h2d_ndm(void *ud)
{
    job *j = ud;
    ndm_array a = ndm_to_to(j->scratch, j->host, NDM_CUDA(0));
    (void)!ndm_array_release(a);
}
static void h2d_raw(void *ud)
{
    job *j = ud;
    (void)cudaMemcpy(j->raw_dev, j->raw_host, j->bytes, cudaMemcpyHostToDevice);
}
static void d2h_ndm(void *ud)
{
    job *j = ud;
    (void)!ndm_array_copy_out(j->dev, j->raw_host, j->bytes);
}
static void d2h_raw(void *ud)
{
    job *j = ud;
    (void)cudaMemcpy(j->raw_host, j->raw_dev, j->bytes, cudaMemcpyDeviceToHost);
}
static void d2d_raw(void *ud)
{
    job *j = ud;
    (void)cudaMemcpy(j->raw_dev, j->src.data, j->bytes, cudaMemcpyDeviceToDevice);
}
static void kernel_copy(void *ud)
{
    job *j = ud;
    (void)ndm__backend_for(NDM_DEVICE_CUDA)->copy(0, &j->dst, &j->src);
}

static ndm__tensor tensor(ndm_array a)
{
    return ndm__tensor_of(ndm__array_get(a, "bench", NDM__NO_SITE));
}

int main(int argc, char **argv)
{
    bench_report r = {.o = bench_parse(argc, argv)};
    if (ndm_cuda_device_count() == 0) {
        bench_note(&r, "no CUDA device: nothing measured");
        bench_print(&r);
        return 0;
    }
    int reps = r.o.quick ? 5 : 21;
    int64_t side = r.o.quick ? 2048 : 8192; /* f32 side x side: 16 or 256 MiB */
    size_t bytes = (size_t)(side * side) * 4;
    ndm_manager m = ndm_manager_new(ndm_system(), "bench");
    ndm_manager g = ndm_manager_new_on(m, "gpu", NDM_CUDA(0));
    job j = {0};
    j.bytes = bytes;
    j.scratch = g;
    j.host = ndm_full(m, NDM_F32, 1.5, NDM_SHAPE(side, side));
    j.dev = ndm_full(g, NDM_F32, 2.5, NDM_SHAPE(side, side));
    j.raw_host = malloc(bytes);
    if (!j.host.id || !j.dev.id || !j.raw_host || cudaMalloc(&j.raw_dev, bytes) != cudaSuccess) {
        fprintf(stderr, "bench_cuda: setup failed: %s\n", ndm_last_error());
        return 1;
    }
    memset(j.raw_host, 0, bytes);
    char note[160];
    snprintf(note, sizeof note, "f32 %lldx%lld (%zu MiB), pageable host memory, median of %d",
             (long long)side, (long long)side, bytes / MIB, reps);
    bench_note(&r, note);
    double gb = (double)bytes / 1e9;

    double a = time_median(reps, h2d_raw, &j), t = time_median(reps, h2d_ndm, &j);
    bench_add(&r, "h2d_GBps_ndm_to_vs_cudaMemcpy", gb / t, "GB/s", "cudaMemcpy host to device",
              gb / a);
    a = time_median(reps, d2h_raw, &j);
    t = time_median(reps, d2h_ndm, &j);
    bench_add(&r, "d2h_GBps_copy_out_vs_cudaMemcpy", gb / t, "GB/s", "cudaMemcpy device to host",
              gb / a);

    /* Device copies: bytes read plus bytes written, against a D2D memcpy. */
    ndm_array out = ndm_empty(g, NDM_F32, NDM_SHAPE(side, side));
    ndm_array half = ndm_empty(g, NDM_F16, NDM_SHAPE(side, side));
    j.src = tensor(j.dev);
    j.dst = tensor(out);
    a = time_median(reps, d2d_raw, &j);
    double anchor = 2 * gb / a;
    t = time_median(reps, kernel_copy, &j);
    bench_add(&r, "contiguous_copy_GBps_vs_d2d_memcpy", 2 * gb / t, "GB/s",
              "cudaMemcpy device to device", anchor);
    ndm_array tr = ndm_transpose(j.dev);
    j.src = tensor(tr);
    t = time_median(reps, kernel_copy, &j);
    bench_add(&r, "transpose_copy_GBps_vs_d2d_memcpy", 2 * gb / t, "GB/s",
              "cudaMemcpy device to device", anchor);
    j.src = tensor(j.dev);
    j.dst = tensor(half);
    t = time_median(reps, kernel_copy, &j);
    bench_add(&r, "f32_to_f16_copy_GBps_vs_d2d_memcpy", 1.5 * gb / t, "GB/s",
              "cudaMemcpy device to device", anchor);

    bench_print(&r);
    cudaFree(j.raw_dev);
    free(j.raw_host);
    return ndm_manager_close(m) == NDM_OK ? 0 : 1;
}
