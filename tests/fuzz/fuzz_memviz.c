/* libFuzzer target: ndm-memviz's reader and page writer on arbitrary bytes
 * (JSON or pickle). tools/memviz/ is built in with NDM_MEMVIZ_FUZZ, which
 * leaves out its main and turns its refusals into returns: a crash, a
 * sanitizer report, a leak or a timeout is a finding. */
#include <stddef.h>
#include <stdint.h>

int ndm_memviz_fuzz(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ndm_memviz_fuzz(data, size);
}
