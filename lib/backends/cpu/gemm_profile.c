/* Profiling of CPU products for bench/train: while on, each GEMM records
 * when it ran, and the time spent in GEMM is read as one figure. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "gemm.h"
#include "gemm_profile.h"

/* While profiling, every GEMM appends its [start, end) interval; the time
 * spent in GEMM is the union of the intervals, since calls made by several
 * threads at once (a convolution's batch split) overlap. */
#define PROFILE_CAP (1 << 20)
static atomic_bool profiling;
static atomic_long profile_n;
static double (*profile_iv)[2];

double ndm__gemm_profile_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ndm__gemm_profile(bool on)
{
    if (on && !profile_iv)
        profile_iv = malloc(sizeof *profile_iv * PROFILE_CAP);
    atomic_store(&profile_n, 0);
    atomic_store(&profiling, on && profile_iv);
}

static int by_start(const void *x, const void *y)
{
    const double *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

double ndm__gemm_profile_seconds(void)
{
    long n = atomic_load(&profile_n);
    if (n > PROFILE_CAP)
        n = PROFILE_CAP;
    if (!profile_iv || n <= 0)
        return 0;
    qsort(profile_iv, (size_t)n, sizeof *profile_iv, by_start);
    double total = 0, lo = profile_iv[0][0], hi = profile_iv[0][1];
    for (long i = 1; i < n; i++) {
        if (profile_iv[i][0] > hi) {
            total += hi - lo;
            lo = profile_iv[i][0];
            hi = profile_iv[i][1];
        } else if (profile_iv[i][1] > hi) {
            hi = profile_iv[i][1];
        }
    }
    return total + (hi - lo);
}

bool ndm__gemm_profiling(void)
{
    return atomic_load_explicit(&profiling, memory_order_relaxed);
}

void ndm__gemm_profile_add(double t0)
{
    long i = atomic_fetch_add(&profile_n, 1);
    if (i < PROFILE_CAP) {
        profile_iv[i][0] = t0;
        profile_iv[i][1] = ndm__gemm_profile_now();
    }
}
