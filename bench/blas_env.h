/* BLAS-bound figures measured twice: with the environment as it is and
 * with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset. The provider reads
 * those when it loads, so the second measurement runs in a child process:
 * this program again, started with BENCH_BLAS_CHILD_FLAG first. */
#ifndef NDM_BENCH_BLAS_ENV_H
#define NDM_BENCH_BLAS_ENV_H

#include "bench.h"

#define BENCH_BLAS_CHILD_FLAG "--blas-env-unset-child"

/* The provider's core name ("Haswell", "SkylakeX", a BLIS arch) and threads. */
const char *bench_blas_core(void);
int bench_blas_threads(void);

/* A note naming the provider, its core, its threads and both variables. */
void bench_blas_note(bench_report *r, const char *label);

/* True when this process is the child; it then measures as usual and ends
 * with bench_blas_child_emit instead of bench_print. */
bool bench_blas_is_child(int argc, char **argv);
void bench_blas_child_emit(const bench_report *r);

/* Run the child with args (argc entries, after the flag) and the two
 * variables unset; add its figures to r with the suffix "_noenv" and a note
 * with the core it ran on. */
void bench_blas_rerun(bench_report *r, const char *label, int argc, char **argv);

#endif
