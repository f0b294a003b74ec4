/* ndm DLPack: zero-copy exchange of arrays with NumPy, PyTorch and any other
 * library that speaks DLPack (https://dmlc.github.io/dlpack/).
 *
 * Export. ndm_to_dlpack(a) returns a DLManagedTensor that views a's storage.
 * Behind it is a fresh alias of `a` held under the `detached` node and
 * recorded as lent by a's manager, so the storage lives while either side
 * holds it (a's manager may close first) and ndm_debug_dump shows the
 * export as "lent 1" on a's manager and "borrowed 1" on `detached` until the
 * consumer calls the tensor's deleter, which releases the alias. A tensor
 * never consumed must still have its deleter called (NDM_LEAK_REPORT lists
 * it otherwise). Shape and strides are those of the view (strides in
 * elements, as DLPack counts them). On a CUDA device the export waits for
 * the device's queued work first, so the consumer may read it on any stream.
 *
 * Import. ndm_from_dlpack(m, t) adopts a producer's tensor without a copy:
 * the result is an array of `m` viewing t's memory, with t's shape, strides
 * and byte offset; the producer's deleter runs when its storage dies (the
 * array released, or m closed). Its bytes count in m's accounting, not in
 * the allocator's. On failure nothing is adopted and the caller keeps t (its
 * deleter is not called). The tensor's device must be m's device: a CPU
 * tensor (kDLCPU, or kDLCUDAHost) needs a CPU manager, a CUDA tensor
 * (kDLCUDA, device_id i) a manager on NDM_CUDA(i); without the CUDA backend
 * or that GPU, CUDA tensors are refused (NDM_E_UNSUPPORTED or NDM_E_DEVICE).
 * Negative strides, vector lanes and dtypes ndm lacks are refused.
 *
 * Dtypes: F64 F32 F16 BF16 I64 I32 U8 and BOOL map to DLPack's float, bfloat,
 * int, uint and bool codes (bool as code 6, 8 bits, as DLPack >= 0.8 and
 * NumPy write it).
 *
 * Versions: the unversioned DLManagedTensor (DLPack 0.x) is always
 * available. DLPack 1.0's DLManagedTensorVersioned is supported when the
 * library was built against a DLPack >= 1.0 header; otherwise the _versioned
 * functions fail with NDM_E_UNSUPPORTED. The DLPack types are only declared
 * here: include <dlpack/dlpack.h> to read their fields.
 *
 * Thread rules: exports and imports may run on many threads at once; a
 * deleter may run on any thread.
 */
#ifndef NDM_DLPACK_H
#define NDM_DLPACK_H

#include "base.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct DLManagedTensor;
struct DLManagedTensorVersioned;

/** Export `a` as a DLPack tensor (see above). Returns the tensor: the caller
 *  (or the consumer it hands it to) must call its deleter once. NULL on failure:
 *  NDM_E_NULL, NDM_E_CLOSED for the handle, NDM_E_OOM, the device's error. */
#define ndm_to_dlpack(a) ndm_to_dlpack_at(NDM_HERE, (a))
/** ndm_to_dlpack() with an explicit call site (the macro passes NDM_HERE). */
NDM_API struct DLManagedTensor *ndm_to_dlpack_at(NDM_SITE_PARAMS, ndm_array a);
/** Like ndm_to_dlpack(), as a DLPack 1.0 versioned tensor (flags 0:
 *  writable, not a copy). NDM_E_UNSUPPORTED when built against a DLPack header older than 1.0. */
#define ndm_to_dlpack_versioned(a) ndm_to_dlpack_versioned_at(NDM_HERE, (a))
/** ndm_to_dlpack_versioned() with an explicit call site (the macro passes NDM_HERE). */
NDM_API struct DLManagedTensorVersioned *ndm_to_dlpack_versioned_at(NDM_SITE_PARAMS,
                                                                    ndm_array a);

/** Adopt `t` into manager `m` without a copy (see above). Returns a new
 *  array owned by `m`, or the null handle: NDM_E_NULL (t NULL), NDM_E_DTYPE,
 *  NDM_E_INVALID (bad shape, strides, lanes or data pointer, or a byte_offset
 *  or extent that wraps the address space), NDM_E_OVERFLOW (an element count
 *  or size in bytes past int64, zero strides included), NDM_E_DEVICE,
 *  NDM_E_UNSUPPORTED, and m's refusals; t stays the caller's on failure. */
#define ndm_from_dlpack(m, t) ndm_from_dlpack_at(NDM_HERE, (m), (t))
/** ndm_from_dlpack() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_from_dlpack_at(NDM_SITE_PARAMS, ndm_manager m, struct DLManagedTensor *t);
/** Like ndm_from_dlpack(), for a DLPack 1.0 versioned tensor; one marked read-only is
 *  refused (NDM_E_INVALID: ndm arrays are writable). NDM_E_UNSUPPORTED when
 *  built against a DLPack header older than 1.0. */
#define ndm_from_dlpack_versioned(m, t) ndm_from_dlpack_versioned_at(NDM_HERE, (m), (t))
/** ndm_from_dlpack_versioned() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_from_dlpack_versioned_at(NDM_SITE_PARAMS, ndm_manager m,
                                               struct DLManagedTensorVersioned *t);

#ifdef __cplusplus
}
#endif

#endif
