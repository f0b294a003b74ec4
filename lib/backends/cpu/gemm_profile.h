/* Private hooks of GEMM profiling (gemm_profile.c) for the GEMM entry point
 * (gemm.c); ndm__gemm_profile and ndm__gemm_profile_seconds in gemm.h turn
 * it on and read it. */
#ifndef NDM_CPU_GEMM_PROFILE_H
#define NDM_CPU_GEMM_PROFILE_H

#include <stdbool.h>

/* Whether products are being timed: one relaxed load. */
bool ndm__gemm_profiling(void);
/* The clock products are timed by (seconds, monotonic). */
double ndm__gemm_profile_now(void);
/* Records a product that started at t0 (from ndm__gemm_profile_now) and
 * ends now; safe from any thread. */
void ndm__gemm_profile_add(double t0);

#endif
