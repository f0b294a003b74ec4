/* Backends known to this build. */
#include "backend.h"
#include "ndm/config.h"

#if NDM_HAVE_CUDA
extern const ndm__backend ndm__cuda_backend;
#endif

#include <stdatomic.h>

static atomic_bool force_reference;

void ndm__cpu_force_reference(bool on) { atomic_store(&force_reference, on); }

const ndm__backend *ndm__backend_for(ndm_device_type type)
{
    switch (type) {
    case NDM_DEVICE_CPU:
        return atomic_load_explicit(&force_reference, memory_order_relaxed) ? &ndm__cpu_ref_backend
                                                                            : &ndm__cpu_backend;
#if NDM_HAVE_CUDA
    case NDM_DEVICE_CUDA:
        return &ndm__cuda_backend;
#else
    case NDM_DEVICE_CUDA:
        return NULL;
#endif
    }
    return NULL;
}
