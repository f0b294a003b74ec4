/* libFuzzer target: .npy from a buffer and from a file. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void npy_check(ndm_manager m, ndm_array a)
{
    if (a.id)
        fuzz_consume(a);
    else
        fuzz_failed(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ndm_manager m = fuzz_manager();
    ndm_clear_error();
    npy_check(m, ndm_npy_load_buffer(m, data, size));
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd >= 0) {
        ndm_clear_error();
        npy_check(m, ndm_npy_load(m, path));
        close(fd);
    }
    fuzz_close(m);
    return 0;
}
