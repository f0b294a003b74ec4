/* The CUDA module's private ground: what libndm handed it (the host API),
 * device discovery, and its backend table. Nothing here is seen by libndm. */
#ifndef NDM_CUDA_H
#define NDM_CUDA_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* backend.h has no C++ guards of its own. */
#include "../backend.h"
#include "ndm/base.h"
#include "../../base/limits.h"

/* Accounting has a slot per CUDA device up to NDM__MAX_CUDA; devices past
 * it are not offered. */
#define NDM__CUDA_MAX_DEVICES NDM__MAX_CUDA

/* The library's services, set by the entry point before any other call. */
extern const ndm__host_api *ndm__cuda_host;

/* Record a failure for the calling thread through the host; returns st. */
ndm_status ndm__cuda_fail(ndm_status st, const char *fmt, ...) NDM_PRINTF(2, 3);

/* Usable CUDA devices: 0 without a driver or a GPU, never an abort. Asked
 * once per process; CUDA_VISIBLE_DEVICES applies as usual. */
int ndm__cuda_count(void);

extern const ndm__backend ndm__cuda_backend;
/* What the module runs, for ndm__backend.supports (supports.cu). */
bool ndm__cuda_supports(int device, const ndm__op_case *c);
extern const struct ndm__backend_ew ndm__cuda_ew;
extern const struct ndm__backend_random ndm__cuda_random;
/* Device graphs: capture, launch (graph.cu). */
extern const ndm__backend_graphs ndm__cuda_graphs;

/* The families, one .cu each. */
extern const struct ndm__backend_reduce ndm__cuda_reduce;
extern const struct ndm__backend_index ndm__cuda_index;

/* Families (linalg.cu, nn.cu). */
extern const struct ndm__backend_linalg ndm__cuda_linalg;
extern const struct ndm__backend_nn ndm__cuda_nn;

/* Collectives between processes over NCCL (collective.cu), in modules
 * built with NCCL (NDM_HAVE_NCCL). */
#if NDM_HAVE_NCCL
extern const ndm__backend_collective ndm__cuda_collective;
#endif

#ifdef __cplusplus
}
#endif

#endif
