/* The private backend interface: a table of kernels per device type.
 * Dispatchers in lib/ops/ validate, apply the output rule and allocate; kernels
 * see raw pointers, shapes and strides only, never handles or managers. */
#ifndef NDM_BACKEND_H
#define NDM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ndm/device.h"
#include "ndm/dtype.h"
#include "ndm/status.h"

#define NDM__BACKEND_ABI 1

/* A kernel's view of an array: `data` points at the first element; strides
 * count elements and may be 0 (broadcast) or negative (flipped views). */
typedef struct ndm__tensor {
    void *data;
    ndm_dtype dtype;
    int ndim;
    const int64_t *shape;
    const int64_t *strides;
} ndm__tensor;

/* Operation families. Each is declared in its own header under lib/backends/
 * and filled by the backends that provide it. */
struct ndm__backend_ew;     /* elementwise and casts */
struct ndm__backend_reduce; /* reductions, softmax */
struct ndm__backend_linalg; /* matmul */
struct ndm__backend_index;  /* gather, scatter, concat, ... */
struct ndm__backend_nn;     /* conv, pooling */
struct ndm__backend_random; /* generators */

typedef struct ndm__backend {
    uint32_t abi;          /* NDM__BACKEND_ABI */
    const char *name;      /* "cpu", "cuda" */
    ndm_device_type type;  /* identity: never compare function pointers */

    /* required: dst = src converted to dst's dtype, element by element over
     * dst's shape. src has the same shape; its strides may be 0. dst's
     * elements do not overlap each other or src's. Any dtype pair. */
    ndm_status (*copy)(int device, const ndm__tensor *dst, const ndm__tensor *src);
    /* required: every element of dst = value converted as copy would. */
    ndm_status (*fill)(int device, const ndm__tensor *dst, double value);
    /* required: 1-d dst[i] = start + i * step, computed in double, converted. */
    ndm_status (*iota)(int device, const ndm__tensor *dst, double start, double step);
    /* required: n contiguous bytes between host memory and this device. */
    ndm_status (*upload)(int device, void *dst, const void *src_host, size_t n);
    ndm_status (*download)(int device, void *dst_host, const void *src, size_t n);
    /* optional: wait for queued work. Default: none (synchronous backend). */
    ndm_status (*sync)(int device);
    /* optional: n contiguous bytes from `src` on device `src_device` to `dst` on
     * `device`, both devices of this backend; returns when the bytes have
     * arrived. Default: a bounce through host memory (download, upload). */
    ndm_status (*peer_copy)(int device, void *dst, int src_device, const void *src, size_t n);

    /* Families; NULL when the backend provides none (the dispatcher then
     * fails with NDM_E_UNSUPPORTED). */
    const struct ndm__backend_ew *ew;
    const struct ndm__backend_reduce *reduce;
    const struct ndm__backend_linalg *linalg;
    const struct ndm__backend_index *index;
    const struct ndm__backend_nn *nn;
    const struct ndm__backend_random *random;
} ndm__backend;

/* The backend of a device type; NULL when not built in. */
const ndm__backend *ndm__backend_for(ndm_device_type type);

/* The CPU has two tables with the same families: the fast kernels, and the
 * plain C reference kernels they are tested against (and the CUDA backend
 * too). Every family fills both; a fast table may point at reference
 * functions where nothing faster exists. */
extern const ndm__backend ndm__cpu_backend;
extern const ndm__backend ndm__cpu_ref_backend;

/* Test hook: route CPU dispatch to the reference table (process wide). */
void ndm__cpu_force_reference(bool on);

#endif
