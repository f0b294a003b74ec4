/* Writes the seed corpus of one fuzz target into a directory:
 *     fuzz_seeds safetensors|npy|idx|csv|gzip DIR */
#include <stdio.h>

#include "ndm/ndm.h"
#include "seeds.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s safetensors|npy|idx|csv|gzip DIR\n", argv[0]);
        return 2;
    }
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
