/* libFuzzer target: CSV. The first byte picks the dtype (bits 0-2), the
 * header flag (bit 3) and the delimiter (bits 4-5); the rest is the text. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct csv_args {
    ndm_dtype dt;
    ndm_csv_options o;
} csv_args;

static void csv_load(ndm_manager m, const uint8_t *data, size_t size, const char *path, int mode,
                     const void *ctx)
{
    (void)mode;
    const csv_args *c = ctx;
    ndm_array a = path ? ndm_csv_load(m, path, c->dt, &c->o)
                       : ndm_csv_load_buffer(m, (const char *)data, size, c->dt, &c->o);
    if (a.id && ndm_array_ndim(a) != 2)
        fuzz_die("a CSV array that is not 2-D");
    fuzz_check_array(m, a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char delims[4] = {',', ';', '\t', ' '};
    csv_args c = {(ndm_dtype)(data[0] & 7), {delims[(data[0] >> 4) & 3], (data[0] >> 3) & 1}};
    fuzz_run(data + 1, size - 1, 1, csv_load, &c);
    return 0;
}
