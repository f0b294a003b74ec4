/* bench/ops_small: the fixed cost of one small operation, f32[16], through
 * the public API alone: c = ndm_add(a, b) and its release, ndm_add_(a, b) in
 * place, and ndm_empty plus release. Each form runs in its own function, so
 * a profile by function (callgrind --dump-instr=no) gives each one's
 * instructions per call: its inclusive count divided by the iterations.
 * Arguments: [iterations (default 1000000)] [repetitions (default 5)];
 * prints the median ns per call of each form over the repetitions, which
 * alternate between the forms. */
#include <stdio.h>
#include <stdlib.h>

#include "ndm/ndm.h"

static void need(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "ops_small: %s: %s\n", what, ndm_last_error());
        exit(1);
    }
}

#include <time.h>
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

__attribute__((noinline)) static void small_add(ndm_array a, ndm_array b, long n)
{
    for (long k = 0; k < n; k++) {
        ndm_array c = ndm_add(a, b);
        need(c.id != 0, "add");
        need(ndm_array_release(c) == NDM_OK, "release");
    }
}

__attribute__((noinline)) static void small_add_inplace(ndm_array a, ndm_array b, long n)
{
    for (long k = 0; k < n; k++)
        need(ndm_add_(a, b) == NDM_OK, "add_");
}

__attribute__((noinline)) static void small_empty_release(ndm_manager m, long n)
{
    for (long k = 0; k < n; k++) {
        ndm_array c = ndm_empty(m, NDM_F32, NDM_SHAPE(16));
        need(c.id != 0, "empty");
        need(ndm_array_release(c) == NDM_OK, "release");
    }
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: ops_small [iterations] [repetitions (1..64)]\n");
        return 2;
    }
    ndm_manager m = ndm_manager_new(ndm_system(), "ops-small");
    need(m.id != 0, "manager");
    /* the operands of bench/ops' small figures: 0..15 and zeros */
    ndm_array a = ndm_arange(m, NDM_F32, 0.0, 16.0, 1.0);
    ndm_array b = ndm_full(m, NDM_F32, 0.0, NDM_SHAPE(16));
    need(a.id && b.id, "inputs");
    double t[3][64];
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        small_add(a, b, n);
        double t1 = now();
        small_add_inplace(a, b, n);
        double t2 = now();
        small_empty_release(m, n);
        double t3 = now();
        t[0][r] = (t1 - t0) / (double)n * 1e9;
        t[1][r] = (t2 - t1) / (double)n * 1e9;
        t[2][r] = (t3 - t2) / (double)n * 1e9;
    }
    static const char *names[3] = {"small_add_16", "small_add_inplace_16",
                                   "small_empty_release_16"};
    for (int k = 0; k < 3; k++) {
        qsort(t[k], (size_t)reps, sizeof(double), cmp);
        printf("%-24s %8.1f ns/call (median of %d x %ld)\n", names[k], t[k][reps / 2], reps, n);
    }
    need(ndm_array_release(a) == NDM_OK && ndm_array_release(b) == NDM_OK, "release");
    need(ndm_manager_close(m) == NDM_OK, "close");
    return 0;
}
