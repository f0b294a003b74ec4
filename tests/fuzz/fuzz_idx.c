/* libFuzzer target: IDX, plain or gzip, from a buffer and from a file. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void idx_load(ndm_manager m, const uint8_t *data, size_t size, const char *path,
                     int mode, const void *ctx)
{
    (void)mode, (void)ctx;
    fuzz_check_array(m, path ? ndm_idx_load(m, path) : ndm_idx_load_buffer(m, data, size));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run(data, size, 1, idx_load, NULL);
    return 0;
}
