/* Writes the seed corpus of one fuzz target into a directory:
 *     fuzz_seeds safetensors|npy|idx|csv|gzip|memviz|dlpack|checkpoint DIR
 * The checkpoint target's seeds are the states ndm saves of its model (the
 * optimizer's metadata is ndm's own format), and a file of wrong shapes. */
#include <stdio.h>

#include "fuzz_checkpoint.h"
#include "ndm/ndm.h"
#include "seeds.h"

static int checkpoint_seeds(const char *dir)
{
    fuzz_model fm;
    char path[4096];
    if (!fuzz_model_make(&fm)) {
        fprintf(stderr, "fuzz_seeds: the model: %s\n", ndm_last_error());
        return 1;
    }
    snprintf(path, sizeof path, "%s/seed-00", dir);
    ndm_status st = ndm_module_save(fm.net, path);
    snprintf(path, sizeof path, "%s/seed-01", dir);
    if (st == NDM_OK)
        st = ndm_optimizer_save(fm.opt, path);
    if (st != NDM_OK) {
        fprintf(stderr, "fuzz_seeds: %s\n", ndm_last_error());
        return 1;
    }
    static const uint8_t w[24];
    fuzz_seed s = seed_st("{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                          "\"1.bias\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                          w, sizeof w);
    snprintf(path, sizeof path, "%s/seed-02", dir);
    FILE *f = fopen(path, "wb");
    int rc = !f || fwrite(s.p, 1, s.n, f) != s.n;
    if (f && fclose(f) != 0)
        rc = 1;
    free(s.p);
    if (rc)
        perror(path);
    (void)!ndm_manager_close(fm.model);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s safetensors|npy|idx|csv|gzip|memviz|dlpack|checkpoint DIR\n",
                argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "checkpoint"))
        return checkpoint_seeds(argv[2]);
    fuzz_seed s[32];
    size_t n = fuzz_seeds(argv[1], s, 32);
    if (!n) {
        fprintf(stderr, "%s: no seeds for '%s'\n", argv[0], argv[1]);
        return 2;
    }
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-%02zu", argv[2], i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(s[i].p, 1, s[i].n, f) != s[i].n || fclose(f) != 0) {
            perror(path);
            return 1;
        }
        free(s[i].p);
    }
    return 0;
}
