/* The CUDA module's memory for the allocator: segments from cudaMalloc, ranges
 * grown in place with the driver's virtual memory management (expandable
 * segments), page-locked host memory, and the events that guard reuse. */
#include <map>
#include <mutex>
#include <new>
#include <string.h>
#include <vector>

#include <cuda.h>

#include "common.cuh"
#include "stream.cuh"

typedef struct ndm__cuda_source_ctx {
    int device;
} ndm__cuda_source_ctx;

static int ctx_device(void *ctx) { return ((ndm__cuda_source_ctx *)ctx)->device; }

/* ---- segments ------------------------------------------------------------------ */

/* `size` bytes for ctx's device: device memory, or pinned host memory
 * (portable: a buffer may serve copies to any device of the process). */
static ndm_status map_on(void *ctx, size_t size, void **out, bool pinned)
{
    int device = ctx_device(ctx);
    *out = NULL;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    void *p = NULL;
    if (pinned)
        NDM__CUDA_TRY(device, cudaHostAlloc(&p, size, cudaHostAllocPortable));
    else
        NDM__CUDA_TRY(device, cudaMalloc(&p, size));
    *out = p;
    return NDM_OK;
}

static ndm_status cuda_map(void *ctx, size_t size, void **out)
{
    return map_on(ctx, size, out, false);
}

static void cuda_unmap(void *ctx, void *ptr, size_t size)
{
    (void)size;
    int device = ctx_device(ctx);
    /* Freeing must go on when the device has failed: the memory is gone with
     * its context anyway, and the caller cannot act on an error here. */
    if (cudaSetDevice(device) == cudaSuccess) {
        cudaError_t e = cudaFree(ptr);
        if (e != cudaSuccess)
            (void)ndm__cuda_check(device, e, "cudaFree");
    } else {
        (void)cudaGetLastError();
    }
}

static ndm_status cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    int device = ctx_device(ctx);
    *free_bytes = *total_bytes = 0;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    NDM__CUDA_TRY(device, cudaMemGetInfo(free_bytes, total_bytes));
    return NDM_OK;
}

/* ---- events for the allocator -------------------------------------------------------
 * The allocator names streams by the stream table's values (0: the default
 * stream); an event is one of the pooled ones. */

static ndm_status src_event_record(void *ctx, uintptr_t stream, void **event)
{
    int device = ctx_device(ctx);
    ndm_status st = ndm__cuda_event_new(device, event);
    if (st < 0)
        return st;
    st = ndm__cuda_event_record(device, *event, (void *)stream);
    if (st < 0) {
        ndm__cuda_event_release(device, *event);
        *event = NULL;
    }
    return st;
}

static int src_event_query(void *ctx, void *event)
{
    bool done = true;
    ndm_status st = ndm__cuda_event_query(ctx_device(ctx), event, &done);
    return st < 0 ? (int)st : done ? 1 : 0;
}

static ndm_status src_event_sync(void *ctx, void *event)
{
    return ndm__cuda_event_sync(ctx_device(ctx), event);
}

static void src_event_release(void *ctx, void *event)
{
    ndm__cuda_event_release(ctx_device(ctx), event);
}

/* ---- expandable segments: the driver's virtual memory ---------------------------------
 * Reached through the runtime's entry-point query, so the module links no
 * driver library: where the driver lacks them, or the device does not
 * support virtual memory management, the source has no reserve and the
 * allocator maps segments as usual. Each granule is one physical handle, so
 * any granule at the free end can be decommitted on its own. */

typedef struct ndm__vmm {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*release_range)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
#ifndef NDM__CUDA_HOST_EXEC
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attribute)(int *, CUdevice_attribute, CUdevice);
#endif
} ndm__vmm;

static ndm__vmm vmm;
static bool vmm_ok;
static std::once_flag vmm_once;

#ifdef NDM__CUDA_HOST_EXEC
/* The host stand-in of the runtime defines the driver's calls themselves. */
static void vmm_load(void)
{
    vmm = ndm__vmm{cuMemAddressReserve, cuMemAddressFree, cuMemCreate,
                   cuMemRelease,        cuMemMap,         cuMemUnmap,
                   cuMemSetAccess,      cuMemGetAllocationGranularity};
    /* the runtime initialises the real driver; the stand-in's is its own */
    vmm_ok = cuInit(0) == CUDA_SUCCESS;
}
#else
static bool vmm_entry(const char *name, void *fn)
{
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !p) {
        (void)cudaGetLastError();
        return false;
    }
    memcpy(fn, &p, sizeof p);
    return true;
}

static void vmm_load(void)
{
    vmm_ok = vmm_entry("cuMemAddressReserve", &vmm.reserve) &&
             vmm_entry("cuMemAddressFree", &vmm.release_range) &&
             vmm_entry("cuMemCreate", &vmm.create) && vmm_entry("cuMemRelease", &vmm.release) &&
             vmm_entry("cuMemMap", &vmm.map) && vmm_entry("cuMemUnmap", &vmm.unmap) &&
             vmm_entry("cuMemSetAccess", &vmm.set_access) &&
             vmm_entry("cuMemGetAllocationGranularity", &vmm.granularity) &&
             vmm_entry("cuDeviceGet", &vmm.device_get) &&
             vmm_entry("cuDeviceGetAttribute", &vmm.attribute);
}
#endif

static CUmemAllocationProp device_prop(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    /* a runtime ordinal names the same device as the driver's handle of it */
    prop.location.id = device;
    return prop;
}

/* The physical handles behind each reserved range, one per granule. */
typedef struct ndm__reservation {
    size_t span;
    std::vector<CUmemGenericAllocationHandle> handles;
} ndm__reservation;

typedef struct ndm__vmm_device {
    std::mutex lock;
    std::map<uintptr_t, ndm__reservation> ranges;
    size_t granularity;
} ndm__vmm_device;

static ndm__vmm_device vmm_devices[NDM__CUDA_MAX_DEVICES];

static ndm_status vmm_fail(int device, CUresult r, const char *what)
{
    return ndm__cuda_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? NDM_E_OOM : NDM_E_DEVICE,
                          "cuda:%d: %s failed (CUresult %d)", device, what, (int)r);
}

static ndm_status cuda_reserve(void *ctx, size_t size, void **out)
{
    int device = ctx_device(ctx);
    *out = NULL;
    ndm__vmm_device &d = vmm_devices[device];
    CUdeviceptr p = 0;
    CUresult r = vmm.reserve(&p, size, d.granularity, 0, 0);
    if (r != CUDA_SUCCESS)
        return vmm_fail(device, r, "cuMemAddressReserve");
    std::lock_guard<std::mutex> g(d.lock);
    try {
        ndm__reservation &res = d.ranges[(uintptr_t)p];
        res.span = size;
        res.handles.assign(size / d.granularity, 0);
    } catch (const std::bad_alloc &) {
        d.ranges.erase((uintptr_t)p);
        vmm.release_range(p, size);
        return ndm__cuda_fail(NDM_E_OOM, "cuda:%d: no memory to track a reserved range", device);
    }
    *out = (void *)p;
    return NDM_OK;
}

/* The reservation holding [ptr, ptr + size) (lock held); NULL if none. */
static ndm__reservation *range_of(ndm__vmm_device &d, uintptr_t ptr, size_t *base)
{
    auto it = d.ranges.upper_bound(ptr);
    if (it == d.ranges.begin())
        return nullptr;
    --it;
    if (ptr >= it->first + it->second.span)
        return nullptr;
    *base = it->first;
    return &it->second;
}

static void unmap_granules(int device, ndm__reservation *res, size_t base, uintptr_t from,
                           size_t n)
{
    size_t g = vmm_devices[device].granularity;
    for (size_t k = 0; k < n; k++) {
        uintptr_t at = from + k * g;
        CUmemGenericAllocationHandle &h = res->handles[(at - base) / g];
        if (!h)
            continue;
        (void)vmm.unmap((CUdeviceptr)at, g);
        (void)vmm.release(h);
        h = 0;
    }
}

static ndm_status cuda_commit(void *ctx, void *ptr, size_t size)
{
    int device = ctx_device(ctx);
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    ndm__vmm_device &d = vmm_devices[device];
    size_t g = d.granularity;
    CUmemAllocationProp prop = device_prop(device);
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::lock_guard<std::mutex> lk(d.lock);
    size_t base = 0;
    ndm__reservation *res = range_of(d, (uintptr_t)ptr, &base);
    if (!res)
        return ndm__cuda_fail(NDM_E_INVALID, "cuda:%d: commit outside a reserved range", device);
    size_t n = size / g;
    for (size_t k = 0; k < n; k++) {
        uintptr_t at = (uintptr_t)ptr + k * g;
        CUmemGenericAllocationHandle h = 0;
        CUresult r = vmm.create(&h, g, &prop, 0);
        if (r == CUDA_SUCCESS && (r = vmm.map((CUdeviceptr)at, g, 0, h, 0)) != CUDA_SUCCESS)
            (void)vmm.release(h);
        if (r == CUDA_SUCCESS &&
            (r = vmm.set_access((CUdeviceptr)at, g, &access, 1)) != CUDA_SUCCESS) {
            (void)vmm.unmap((CUdeviceptr)at, g);
            (void)vmm.release(h);
        }
        if (r != CUDA_SUCCESS) {
            unmap_granules(device, res, base, (uintptr_t)ptr, k);
            return vmm_fail(device, r, "mapping memory into a reserved range");
        }
        res->handles[(at - base) / g] = h;
    }
    return NDM_OK;
}

static void cuda_decommit(void *ctx, void *ptr, size_t size)
{
    int device = ctx_device(ctx);
    /* Unmapping is not ordered with the streams: work queued before the
     * blocks were freed must be done first. */
    if (cudaSetDevice(device) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        (void)cudaGetLastError();
    ndm__vmm_device &d = vmm_devices[device];
    std::lock_guard<std::mutex> lk(d.lock);
    size_t base = 0;
    ndm__reservation *res = range_of(d, (uintptr_t)ptr, &base);
    if (res)
        unmap_granules(device, res, base, (uintptr_t)ptr, size / d.granularity);
}

static void cuda_unreserve(void *ctx, void *ptr, size_t size)
{
    int device = ctx_device(ctx);
    ndm__vmm_device &d = vmm_devices[device];
    std::lock_guard<std::mutex> lk(d.lock);
    auto it = d.ranges.find((uintptr_t)ptr);
    if (it != d.ranges.end()) {
        unmap_granules(device, &it->second, it->first, it->first, it->second.span / d.granularity);
        d.ranges.erase(it);
    }
    (void)vmm.release_range((CUdeviceptr)ptr, size);
}

/* Whether `device` can grow segments in place; its granularity set. */
static bool vmm_usable(int device)
{
    std::call_once(vmm_once, vmm_load);
    if (!vmm_ok)
        return false;
#ifndef NDM__CUDA_HOST_EXEC
    CUdevice dev = 0;
    int supported = 0;
    if (vmm.device_get(&dev, device) != CUDA_SUCCESS ||
        vmm.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        !supported)
        return false;
#endif
    CUmemAllocationProp prop = device_prop(device);
    size_t g = 0;
    if (vmm.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
        return false;
    /* The allocator commits whole multiples of 2 MiB: a granule that
     * divides it keeps every commit aligned. */
    if (((size_t)2 << 20) % g)
        return false;
    vmm_devices[device].granularity = g;
    return true;
}

/* ---- pinned host memory -------------------------------------------------------------- */

static ndm_status pinned_map(void *ctx, size_t size, void **out)
{
    return map_on(ctx, size, out, true);
}

static void pinned_unmap(void *ctx, void *ptr, size_t size)
{
    (void)size;
    int device = ctx_device(ctx);
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess)
        (void)ndm__cuda_check(device, e, "cudaFreeHost");
}

/* ---- the sources -------------------------------------------------------------------- */

static ndm__cuda_source_ctx source_ctx[NDM__CUDA_MAX_DEVICES];
static ndm__segment_source sources[NDM__CUDA_MAX_DEVICES];
static ndm__segment_source pinned[NDM__CUDA_MAX_DEVICES];
static std::once_flag sources_once;

static void sources_init(void)
{
    int n = ndm__cuda_count();
    for (int i = 0; i < NDM__CUDA_MAX_DEVICES; i++) {
        source_ctx[i].device = i;
        ndm__segment_source s;
        memset(&s, 0, sizeof s);
        s.name = "cuda";
        s.map = cuda_map;
        s.unmap = cuda_unmap;
        s.mem_info = cuda_mem_info;
        s.event_record = src_event_record;
        s.event_query = src_event_query;
        s.event_sync = src_event_sync;
        s.event_release = src_event_release;
        s.ctx = &source_ctx[i];
        pinned[i] = s;
        pinned[i].name = "cuda-pinned";
        pinned[i].map = pinned_map;
        pinned[i].unmap = pinned_unmap;
        pinned[i].mem_info = NULL;
        if (i < n && vmm_usable(i)) {
            s.reserve = cuda_reserve;
            s.unreserve = cuda_unreserve;
            s.commit = cuda_commit;
            s.decommit = cuda_decommit;
            s.commit_granularity = (size_t)2 << 20;
        }
        sources[i] = s;
    }
}

const ndm__segment_source *ndm__cuda_segment_source(int index)
{
    if (index < 0 || index >= ndm__cuda_count())
        return NULL;
    std::call_once(sources_once, sources_init);
    return &sources[index];
}

const ndm__segment_source *ndm__cuda_pinned_source(int index)
{
    if (index < 0 || index >= ndm__cuda_count())
        return NULL;
    std::call_once(sources_once, sources_init);
    return &pinned[index];
}
