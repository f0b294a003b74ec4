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

static void st_load(ndm_manager m, const uint8_t *data, size_t size, const char *path, int mode,
                    const void *ctx)
{
    (void)ctx;
    static const unsigned modes[] = {NDM_LOAD_COPY, NDM_LOAD_MMAP, NDM_LOAD_MMAP_COW};
    st_check(m, path ? ndm_safetensors_load(m, path, modes[mode])
                     : ndm_safetensors_load_buffer(m, data, size));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run(data, size, 3, st_load, NULL);
    return 0;
}
