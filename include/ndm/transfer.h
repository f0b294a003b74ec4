/* ndm transfers: copies of an array on another device.
 *
 * ndm_to(a, device) returns a C-contiguous copy of `a` on `device`, with the
 * same dtype and shape; when `a` already lives there it returns an alias of
 * `a` (a fresh handle on the same view, no copy). The result is attached by
 * the output rule: the `_to` variant's manager, else the innermost scope of
 * this thread, else the manager of `a` (whatever that manager's device).
 * Transfers return when the data has arrived. Errors: NDM_E_DEVICE (no such
 * device, or a device failure, with CUDA's reason), NDM_E_UNSUPPORTED (no
 * backend for the device in this build), the manager's NDM_E_CAPPED /
 * NDM_E_QUOTA / NDM_E_CLOSED, NDM_E_OOM. A null input propagates.
 *
 * Thread rules: as for arrays. A transfer waits for the work queued on the
 * source device before it reads.
 */
#ifndef NDM_TRANSFER_H
#define NDM_TRANSFER_H

#include "base.h"
#include "device.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A contiguous copy of `a` on `device`, or an alias when it is there: a
 *  new handle by the output rule, the caller's to release, or the null
 *  handle (errors in the file description: NDM_E_DEVICE, NDM_E_UNSUPPORTED,
 *  the manager's refusals, NDM_E_OOM). */
#define ndm_to(a, device) ndm_to_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (device))
/** ndm_to() with the result attached to m instead of by the output rule. */
#define ndm_to_to(m, a, device) ndm_to_to_at(NDM_HERE, (m), (a), (device))
/** ndm_to_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_to_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_device device);

#ifdef __cplusplus
}
#endif

#endif
