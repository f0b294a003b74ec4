/* libFuzzer target: ndm_module_load (strict and lenient) and
 * ndm_optimizer_load on arbitrary bytes as a file, into a small fixed model
 * made once. A load succeeds or refuses with a clean status and a message;
 * either way the model holds the arrays it held before. */
#include "fuzz_checkpoint.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A refusal: one of the statuses the headers promise, with a message. */
static void checkpoint_refused(int st)
{
    if (st != NDM_E_FORMAT && st != NDM_E_DTYPE && st != NDM_E_OVERFLOW && st != NDM_E_SHAPE &&
        st != NDM_E_INVALID && st != NDM_E_OOM)
        fuzz_die("a malformed checkpoint gave an unexpected status");
    if (ndm_last_status() != st)
        fuzz_die("the returned status is not the last status");
    if (!ndm_last_error()[0])
        fuzz_die("a failure without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_model fm;
    static uint64_t live;
    if (!fm.model.id) {
        if (!fuzz_model_make(&fm))
            fuzz_die("the model");
        live = fuzz_live(fm.model);
    }
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    for (unsigned mode = NDM_CHECKPOINT_STRICT; mode <= NDM_CHECKPOINT_LENIENT; mode++) {
        ndm_clear_error();
        int n = ndm_module_load(fm.net, path, mode);
        if (n < 0)
            checkpoint_refused(n);
        else if (n > 4)
            fuzz_die("more tensors loaded than the module has");
        if (fuzz_live(fm.model) != live)
            fuzz_die("a module load changed the model's arrays");
    }
    ndm_clear_error();
    ndm_status st = ndm_optimizer_load(fm.opt, path);
    if (st < 0)
        checkpoint_refused(st);
    if (fuzz_live(fm.model) != live)
        fuzz_die("an optimizer load changed the model's arrays");
    close(fd);
    return 0;
}
