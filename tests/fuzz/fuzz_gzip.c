/* libFuzzer target: gzip decoding, through the loaders that inflate. The
 * input follows the gzip magic, so every input reaches the decoder: IDX from
 * a buffer, IDX and CSV from a file, under a small CPU memory limit so that
 * the expanding inputs stop at it. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* In the libFuzzer build (not when a test suite includes this file), the
 * limit that makes a decompression bomb a clean refusal. */
#ifndef NDM_FUZZ_IN_SUITE
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (ndm_alloc_configure(NDM_CPU, "memory_limit_mb:16") != NDM_OK)
        fuzz_die("configure the memory limit");
    return 0;
}
#endif

static void gz_load(ndm_manager m, const uint8_t *data, size_t size, const char *path, int mode,
                    const void *ctx)
{
    (void)ctx;
    ndm_array a;
    if (!path)
        a = ndm_idx_load_buffer(m, data, size);
    else if (mode == 0)
        a = ndm_idx_load(m, path);
    else
        a = ndm_csv_load(m, path, NDM_F32, NULL);
    fuzz_check_array(m, a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *gz = malloc(size + 2);
    if (!gz)
        fuzz_die("malloc");
    gz[0] = 0x1f;
    gz[1] = 0x8b;
    if (size)
        memcpy(gz + 2, data, size);
    fuzz_oom_allowed = true;
    fuzz_run(gz, size + 2, 2, gz_load, NULL);
    fuzz_oom_allowed = false;
    free(gz);
    return 0;
}
