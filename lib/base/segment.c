/* Where the backend registry leaves the memory of its devices for the
 * allocator: one slot per device type, set once when the library loads. */
#include <stdatomic.h>

#include "segment.h"

static _Atomic(const ndm__device_memory *) memories[2];

void ndm__device_memory_register(ndm_device_type type, const ndm__device_memory *m)
{
    if ((unsigned)type < sizeof memories / sizeof memories[0])
        atomic_store_explicit(&memories[type], m, memory_order_release);
}

const ndm__device_memory *ndm__device_memory_of(ndm_device_type type)
{
    if ((unsigned)type >= sizeof memories / sizeof memories[0])
        return NULL;
    return atomic_load_explicit(&memories[type], memory_order_acquire);
}
