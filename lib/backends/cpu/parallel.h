/* The CPU thread pool. Kernels split work with ndm__parallel_for; the pool
 * size comes from NDM_NUM_THREADS (default: the cores this process may run on). */
#ifndef NDM_CPU_PARALLEL_H
#define NDM_CPU_PARALLEL_H

#include <stdint.h>

/* fn(ctx, begin, end) over [0, n) in chunks of about `grain` items or more. The chunks are claimed one at a time by the
 * caller and the pool's workers, so a thread that loses its core holds up
 * one chunk, not a share. Runs inline when one chunk suffices, when called
 * from a pool thread (nested calls), or when another thread is using the
 * pool (so concurrent callers never wait for each other). Chunk boundaries
 * depend only on n, grain and the pool size, never on timing: see
 * ndm__parallel_chunks. Idle workers pause for 50 microseconds, yield until
 * 300 have passed, then sleep. A serving thread (ndm__parallel_serving)
 * runs inline too once the serving threads are as many as the pool's
 * threads: the cores are busy with requests then, and a worker woken for
 * one of them would take a core from another. */
typedef void (*ndm__range_fn)(void *ctx, int64_t begin, int64_t end);
void ndm__parallel_for(int64_t n, int64_t grain, ndm__range_fn fn, void *ctx);

/* How many chunks ndm__parallel_for makes of n items at this grain with
 * `threads` threads: at most ceil(n / grain) and 4 per thread; each but the
 * last holds ceil(n / chunks) items. */
int64_t ndm__parallel_chunks(int64_t n, int64_t grain, int threads);

/* Which thread of a job runs this chunk: 0 for the caller (and for any
 * thread outside the pool), 1 to ndm__num_threads() - 1 for workers. Chunks
 * run at the same time have different indices, so per-thread scratch can be
 * indexed by it: a fn runs many chunks, one after another, on each thread. */
int ndm__parallel_thread_index(void);

/* Mark the calling thread as one that serves requests (a predictor's
 * caller), until it exits; cheap after the first call. */
void ndm__parallel_serving(void);
/* Threads marked serving and still alive. */
int ndm__parallel_serving_threads(void);

/* From now on every ndm__parallel_for on the calling thread runs inline:
 * for threads of the library's own that run beside the compute (a loader's
 * workers), so that they never hold the pool the compute needs. */
void ndm__parallel_stay_inline(void);

/* Number of threads the pool uses (>= 1). */
int ndm__num_threads(void);

/* The size the pool takes at start: NDM_NUM_THREADS when it is a whole
 * number >= 1 (capped at 256), else the cores of sched_getaffinity (a set
 * value that is not such a number is ignored with a warning). */
int ndm__default_num_threads(void);

/* Benchmark and test hook: make jobs use n threads (starting or stopping
 * workers as needed) and return the previous size. Waits for a running job
 * to end; must not be called from inside a job. */
int ndm__set_num_threads(int n);

/* Worker threads alive now (the pool's size less the caller). */
int ndm__pool_workers(void);

#endif
