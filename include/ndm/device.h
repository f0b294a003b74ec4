/* ndm devices. A device is a {type, index} value; the CPU is always there.
 * CUDA devices exist when the library was built with the CUDA backend, its
 * module (libndm-cuda.so) is found, and a GPU is present at run time;
 * otherwise using one fails with NDM_E_UNSUPPORTED (no backend in this
 * build, or the module could not be loaded: the message says what was looked
 * for, where, and why it failed) or NDM_E_DEVICE (no such GPU).
 *
 * The module is loaded by the first call that needs a CUDA device (this
 * count, a manager or an allocator setting on one), once per process. It is
 * looked for in the directories of NDM_BACKEND_PATH (one, or a
 * colon-separated list), then in the directory libndm was loaded from, then
 * on the loader's default path. A candidate's ELF headers are read before it
 * is loaded: one that is not a regular file, is for another class or
 * machine, or is shorter than its headers say (a truncated copy) is skipped,
 * and the message says why. A failed load is not retried.
 *
 * CPU kernels pick their instruction set once per process, the widest this
 * CPU and OS run (AVX-512, AVX2, or the portable C kernels). The
 * environment variable NDM_CPU_ISA=ref|avx2|avx512, read on first use,
 * lowers it, to compare results or timings across instruction sets; a value
 * this CPU cannot run or an unknown one is ignored with a warning to the log
 * callback. Results may differ between instruction sets within the
 * tolerances the kernels document (float functions, summation order).
 *
 * Thread rules: all functions are safe from any thread.
 */
#ifndef NDM_DEVICE_H
#define NDM_DEVICE_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The kind of a device. */
typedef enum ndm_device_type {
    NDM_DEVICE_CPU = 0,  /**< Host memory. */
    NDM_DEVICE_CUDA = 1, /**< A CUDA GPU (needs the CUDA backend). */
} ndm_device_type;

/** A device: its kind and, for CUDA, its ordinal. A plain value. */
typedef struct ndm_device {
    ndm_device_type type; /**< CPU or CUDA. */
    int index;            /**< The CUDA device ordinal; 0 for the CPU. */
} ndm_device;

/** The CPU device. */
#define NDM_CPU NDM_LITERAL_(ndm_device, NDM_DEVICE_CPU, 0)
/** CUDA device number i. */
#define NDM_CUDA(i) NDM_LITERAL_(ndm_device, NDM_DEVICE_CUDA, (i))

/** Same kind and index? */
static inline bool ndm_device_eq(ndm_device a, ndm_device b)
{
    return a.type == b.type && a.index == b.index;
}

/** Writes "cpu" or "cuda:N" into buf (at most n bytes, truncated); returns
 *  buf, the caller's. Never fails. */
NDM_API char *ndm_device_str(ndm_device d, char *buf, size_t n);

/** Number of usable CUDA devices: 0 without the backend (not built, or its
 *  module not found) or without a GPU. Loads the module on first call.
 *  Never fails: a module that does not load counts as no device. */
NDM_API int ndm_cuda_device_count(void);

/** Wait until the work queued on `device` is done. NDM_OK, or the device's
 *  sticky error: once work failed asynchronously on a CUDA device (a kernel
 *  fault), this call and every later use of the device return NDM_E_DEVICE
 *  with CUDA's reason, for the rest of the process. NDM_E_DEVICE for a device
 *  that does not exist, NDM_E_UNSUPPORTED without its backend. The CPU has
 *  nothing queued: NDM_OK. */
NDM_API NDM_NODISCARD ndm_status ndm_device_synchronize(ndm_device device);

#ifdef __cplusplus
}
#endif

#endif
