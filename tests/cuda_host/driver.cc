/* Host execution's CUDA driver: virtual memory management as mmap
 * reserve-and-commit, accounted against the devices' memory (test-only). */
#include <map>
#include <mutex>
#include <sys/mman.h>

#include "cuda.h"
#include "hx.h"

namespace {

const size_t GRANULE = 2 << 20; /* a GPU's granularity for device memory */

struct physical {
    size_t size;
    int device;
};
struct reservation {
    size_t size;
};
struct mapping {
    size_t size;
    CUmemGenericAllocationHandle handle;
    bool access;
};

std::mutex lock;
bool initialised;
unsigned long long next_handle = 1;
std::map<CUmemGenericAllocationHandle, physical> handles;
std::map<CUdeviceptr, reservation> reserved;
std::map<CUdeviceptr, mapping> mapped;

bool inside_reservation(CUdeviceptr p, size_t n)
{
    auto it = reserved.upper_bound(p);
    if (it == reserved.begin())
        return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second.size;
}

bool overlaps_mapping(CUdeviceptr p, size_t n)
{
    auto it = mapped.lower_bound(p);
    if (it != mapped.end() && it->first < p + n)
        return true;
    if (it == mapped.begin())
        return false;
    --it;
    return it->first + it->second.size > p;
}

bool prop_ok(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < ndm__hx::device_count();
}

} // namespace

extern "C" CUresult cuInit(unsigned flags)
{
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(lock);
    initialised = true;
    return CUDA_SUCCESS;
}

#define NEED_INIT()                                                             \
    do {                                                                        \
        std::lock_guard<std::mutex> g_(lock);                                   \
        if (!initialised)                                                       \
            return CUDA_ERROR_NOT_INITIALIZED;                                  \
    } while (0)

extern "C" CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12080;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = ndm__hx::device_count();
    return CUDA_SUCCESS;
}

extern "C" CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndm__hx::device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

struct result_text {
    CUresult e;
    const char *name, *text;
};
static const result_text texts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

extern "C" CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (const result_text &t : texts)
        if (t.e == e) {
            *s = t.text;
            return CUDA_SUCCESS;
        }
    *s = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

extern "C" CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (const result_text &t : texts)
        if (t.e == e) {
            *s = t.name;
            return CUDA_SUCCESS;
        }
    *s = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

extern "C" CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    NEED_INIT();
    if (!g || !prop_ok(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULE;
    return CUDA_SUCCESS;
}

/* Address space only: no access, no memory, until a handle is mapped. */
extern "C" CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags)
{
    NEED_INIT();
    if (!ptr || !size || size % GRANULE || flags || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > GRANULE ? alignment : GRANULE;
    /* Over-reserve so that an aligned start exists, then trim. */
    size_t span = size + align;
    void *hint = addr ? (void *)addr : nullptr;
    char *m = (char *)mmap(hint, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = ((uintptr_t)m + align - 1) / align * align;
    if (start > (uintptr_t)m)
        munmap(m, start - (uintptr_t)m);
    uintptr_t end = start + size, mend = (uintptr_t)m + span;
    if (mend > end)
        munmap((void *)end, mend - end);
    std::lock_guard<std::mutex> g(lock);
    reserved[(CUdeviceptr)start] = reservation{size};
    *ptr = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    std::lock_guard<std::mutex> g(lock);
    auto it = reserved.find(ptr);
    if (it == reserved.end() || it->second.size != size)
        return CUDA_ERROR_INVALID_VALUE;
    if (overlaps_mapping(ptr, size))
        return CUDA_ERROR_INVALID_VALUE; /* unmap first, as CUDA requires */
    munmap((void *)ptr, size);
    reserved.erase(it);
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED_INIT();
    if (!h || !size || size % GRANULE || flags || !prop_ok(prop))
        return CUDA_ERROR_INVALID_VALUE;
    int d = prop->location.id;
    if (ndm__hx::check_alive(d) != cudaSuccess)
        return CUDA_ERROR_LAUNCH_FAILED;
    if (!ndm__hx::reserve_bytes(d, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> g(lock);
    *h = next_handle++;
    handles[*h] = physical{size, d};
    return CUDA_SUCCESS;
}

/* The memory goes when its handle is released; mappings of it stay usable
 * until unmapped, as CUDA's do. */
extern "C" CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    physical p;
    {
        std::lock_guard<std::mutex> g(lock);
        auto it = handles.find(h);
        if (it == handles.end())
            return CUDA_ERROR_INVALID_VALUE;
        p = it->second;
        handles.erase(it);
    }
    ndm__hx::unreserve_bytes(p.device, p.size);
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle h, unsigned long long flags)
{
    NEED_INIT();
    std::lock_guard<std::mutex> g(lock);
    auto it = handles.find(h);
    if (it == handles.end())
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags || offset || size != it->second.size || ptr % GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!inside_reservation(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    if (overlaps_mapping(ptr, size))
        return CUDA_ERROR_ALREADY_MAPPED;
    /* Fresh pages, still without access until cuMemSetAccess. */
    void *m = mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    mapped[ptr] = mapping{size, h, false};
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    std::lock_guard<std::mutex> g(lock);
    if (!size || ptr % GRANULE || size % GRANULE || !inside_reservation(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    /* The range must be covered by whole mappings. */
    size_t covered = 0;
    for (auto it = mapped.lower_bound(ptr); it != mapped.end() && it->first < ptr + size; ++it) {
        if (it->first + it->second.size > ptr + size)
            return CUDA_ERROR_INVALID_VALUE;
        covered += it->second.size;
    }
    if (covered != size)
        return CUDA_ERROR_INVALID_VALUE;
    /* Finish the device's queued work first: it may still use the range. */
    cudaDeviceSynchronize();
    ndm__hx::unmap_range((void *)ptr, size);
    mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
         0);
    mapped.erase(mapped.lower_bound(ptr), mapped.lower_bound(ptr + size));
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    NEED_INIT();
    if (!desc || !count || !size)
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(lock);
    size_t covered = 0;
    for (auto it = mapped.lower_bound(ptr); it != mapped.end() && it->first < ptr + size; ++it) {
        if (it->first + it->second.size > ptr + size)
            return CUDA_ERROR_INVALID_VALUE;
        covered += it->second.size;
    }
    if (covered != size)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    int dev = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= ndm__hx::device_count())
            return CUDA_ERROR_INVALID_DEVICE;
        dev = desc[i].location.id;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
    }
    if (mprotect((void *)ptr, size, prot))
        return CUDA_ERROR_INVALID_VALUE;
    for (auto it = mapped.lower_bound(ptr); it != mapped.end() && it->first < ptr + size; ++it) {
        it->second.access = prot != PROT_NONE;
        if (it->second.access)
            ndm__hx::map_range((void *)it->first, it->second.size, dev);
        else
            ndm__hx::unmap_range((void *)it->first, it->second.size);
    }
    return CUDA_SUCCESS;
}
