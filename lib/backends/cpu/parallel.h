/* The CPU thread pool. Kernels split work with ndm__parallel_for; the pool
 * size comes from NDM_NUM_THREADS (default: every online core). */
#ifndef NDM_CPU_PARALLEL_H
#define NDM_CPU_PARALLEL_H

#include <stdint.h>

/* fn(ctx, begin, end) over [0, n) in chunks of at least `grain` items.
 * Runs inline when one chunk suffices, when called from a pool thread, or
 * when another thread is using the pool (so concurrent callers never wait
 * for each other). Chunk boundaries depend only on n, grain and the pool
 * size, never on timing. */
typedef void (*ndm__range_fn)(void *ctx, int64_t begin, int64_t end);
void ndm__parallel_for(int64_t n, int64_t grain, ndm__range_fn fn, void *ctx);

/* Number of threads the pool uses (>= 1). */
int ndm__num_threads(void);

/* Benchmark and test hook: make jobs use n threads (starting workers as
 * needed) and return the previous size. Waits for a running job to end. */
int ndm__set_num_threads(int n);

#endif
