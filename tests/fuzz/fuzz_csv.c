/* libFuzzer target: CSV. The first byte picks the dtype (bits 0-2), the
 * header flag (bit 3) and the delimiter (bits 4-5); the rest is the text. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void csv_check(ndm_manager m, ndm_array a)
{
    if (a.id) {
        if (ndm_array_ndim(a) != 2)
            fuzz_die("a CSV array that is not 2-D");
        fuzz_consume(a);
    } else {
        fuzz_failed(m);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char delims[4] = {',', ';', '\t', ' '};
    ndm_csv_options o = {delims[(data[0] >> 4) & 3], (data[0] >> 3) & 1};
    ndm_dtype dt = (ndm_dtype)(data[0] & 7);
    ndm_manager m = fuzz_manager();
    ndm_clear_error();
    csv_check(m, ndm_csv_load_buffer(m, (const char *)data + 1, size - 1, dt, &o));
    char path[64];
    int fd = fuzz_file(data + 1, size - 1, path, sizeof path);
    if (fd >= 0) {
        ndm_clear_error();
        csv_check(m, ndm_csv_load(m, path, dt, &o));
        close(fd);
    }
    fuzz_close(m);
    return 0;
}
