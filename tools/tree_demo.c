/* The manager tree at work: a model, a trainer, a batch manager per step
 * closed every step, debug dumps showing flat counts, a capped model
 * refusing a stray array, and a deliberate leak that ndm_report_since names
 * by its line. */
#include <stdio.h>
#include <stdlib.h>

#include "ndm/ndm.h"

#define CHECK(expr)                                                             \
    do {                                                                        \
        if ((expr) < 0) {                                                       \
            fprintf(stderr, "%s failed: %s\n", #expr, ndm_last_error());        \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define LIVE(h)                                                                 \
    do {                                                                        \
        if (!(h).id) {                                                          \
            fprintf(stderr, "%s: %s\n", #h, ndm_last_error());                 \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

/* One training-shaped step: inputs in the batch, temporaries in a scope. */
static void step(ndm_manager trainer, ndm_array w, int n)
{
    char name[32];
    snprintf(name, sizeof name, "batch-%d", n);
    NDM_AUTO ndm_manager batch = ndm_manager_new(trainer, name);
    LIVE(batch);
    ndm_array x = ndm_full(batch, NDM_F32, 0.5, NDM_SHAPE(64, 784));
    LIVE(x);
    ndm_manager s = ndm_scope_begin(batch, "activations");
    LIVE(s);
    /* views and copies land in the scope: the innermost scope wins */
    ndm_array xt = ndm_transpose(x);
    ndm_array h = ndm_contiguous(xt);
    ndm_array wv = ndm_reshape(w, NDM_SHAPE(784, -1));
    ndm_array out = ndm_slice(h, 0, 0, 10, 1);
    LIVE(wv);
    LIVE(out);
    CHECK(ndm_scope_end(s, 1, &out)); /* out moves to the batch; the rest goes */
}

int main(void)
{
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    LIVE(model);
    LIVE(trainer);
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(784, 128));
    ndm_array b = ndm_zeros(model, NDM_F32, NDM_SHAPE(128));
    LIVE(w);
    LIVE(b);
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS));

    printf("== a capped model refuses a step's intermediate ==\n");
    ndm_array stray = ndm_zeros(model, NDM_F32, NDM_SHAPE(64, 128));
    printf("refused: %s\n  %s\n\n", ndm_status_name(ndm_last_status()), ndm_last_error());
    (void)stray;

    int n = 0;
    for (int epoch = 1; epoch <= 3; epoch++) {
        for (int i = 0; i < 200; i++)
            step(trainer, w, ++n);
        printf("== after epoch %d (%d batch managers opened and closed) ==\n", epoch, n);
        CHECK(ndm_debug_dump(model, stdout));
        printf("\n");
    }

    printf("== a deliberate leak: running statistics kept in the trainer by mistake ==\n");
    ndm_seq mark = ndm_mark(model);
    for (int i = 0; i < 5; i++) {
        step(trainer, w, ++n);
        ndm_array running = ndm_zeros(trainer, NDM_F32, NDM_SHAPE(128)); /* the leak */
        LIVE(running);
    }
    CHECK(ndm_report_since(model, mark, stdout));
    CHECK(ndm_debug_dump(model, stdout));

    CHECK(ndm_manager_close(model));
    printf("\n== after closing the model ==\n");
    ndm_leak_report(stdout);
    return 0;
}
