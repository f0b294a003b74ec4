/* libFuzzer target: safetensors from a buffer, and from a file copied and
 * mapped (read-only and copy-on-write). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void st_check(ndm_manager m, const ndm_named_arrays *set)
{
    if (!set) {
        fuzz_failed(m);
        return;
    }
    for (size_t i = 0; i < set->count; i++) {
        if (!set->names[i])
            fuzz_die("a NULL name");
        fuzz_consume(set->arrays[i]);
    }
    for (size_t i = 0; i < set->meta_count; i++)
        if (!set->meta_keys[i] || !set->meta_values[i] ||
            ndm_named_arrays_meta(set, set->meta_keys[i]) == NULL)
            fuzz_die("metadata");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ndm_manager m = fuzz_manager();
    ndm_clear_error();
    st_check(m, ndm_safetensors_load_buffer(m, data, size));
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd >= 0) {
        static const unsigned modes[] = {NDM_LOAD_COPY, NDM_LOAD_MMAP, NDM_LOAD_MMAP_COW};
        for (int i = 0; i < 3; i++) {
            ndm_clear_error();
            st_check(m, ndm_safetensors_load(m, path, modes[i]));
        }
        close(fd);
    }
    fuzz_close(m);
    return 0;
}
