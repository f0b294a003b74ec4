/* What the CUDA backend offers to C code: device discovery, the backend
 * table, one segment source per device, and the test hooks of the suite. */
#ifndef NDM_CUDA_H
#define NDM_CUDA_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The private headers below have no C++ guards of their own. */
#include "../backend.h"
#include "../../manager/alloc/alloc.h"

/* Accounting has a slot per CUDA device up to this many (NDM__MAX_CUDA in
 * the manager core); devices past it are not offered. */
#define NDM__CUDA_MAX_DEVICES 16

/* Usable CUDA devices: 0 without a driver or a GPU, never an abort. Asked
 * once per process; CUDA_VISIBLE_DEVICES applies as usual. */
int ndm__cuda_count(void);

extern const ndm__backend ndm__cuda_backend;

/* cudaMalloc/cudaFree on device `index` (NULL when it does not exist). */
const ndm__segment_source *ndm__cuda_segment_source(int index);

/* Test hooks. set_sticky marks a device as failed (as an asynchronous
 * fault would) or clears that mark; a real fault cannot be cleared. fault
 * launches a kernel that traps, so the device fails asynchronously: the
 * launch itself reports success, and the device is lost to this process. */
void ndm__cuda_test_set_sticky(int device, bool on);
ndm_status ndm__cuda_test_fault(int device);
/* The copy and fill of the backend (same conversions, same coalescing and
 * index math) with a host loop in place of the kernels, on host memory: the
 * CPU checks them against its reference without a GPU. */
ndm_status ndm__cuda_test_copy_on_host(const ndm__tensor *dst, const ndm__tensor *src);
ndm_status ndm__cuda_test_fill_on_host(const ndm__tensor *dst, double value);

#ifdef __cplusplus
}
#endif

#endif
