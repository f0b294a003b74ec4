/* The CPU segment source: 64-byte aligned heap memory for small segments,
 * anonymous mmap with transparent huge pages requested for large ones (a
 * fresh 4 KiB page fault costs about 10 us; a 2 MiB one covers 512 pages). */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"

#define HUGE_MIN ((size_t)2 << 20)

static ndm_status cpu_map(void *ctx, size_t size, void **out)
{
    (void)ctx;
    *out = NULL;
    if (size >= HUGE_MIN) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NDM_E_OOM;
#ifdef MADV_HUGEPAGE
        madvise(p, size, MADV_HUGEPAGE);
#endif
        *out = p;
        return NDM_OK;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0)
        return NDM_E_OOM;
    *out = p;
    return NDM_OK;
}

static void cpu_unmap(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (size >= HUGE_MIN)
        munmap(ptr, size);
    else
        free(ptr);
}

static ndm_status cpu_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    (void)ctx;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long psize = sysconf(_SC_PAGESIZE);
    *total_bytes = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0;
    *free_bytes = avail > 0 && psize > 0 ? (size_t)avail * (size_t)psize : 0;
    return NDM_OK;
}

static const ndm__segment_source cpu_source = {
    .name = "cpu",
    .map = cpu_map,
    .unmap = cpu_unmap,
    .mem_info = cpu_mem_info,
    .ctx = NULL,
};

const ndm__segment_source *ndm__cpu_segment_source(void);
const ndm__segment_source *ndm__cpu_segment_source(void) { return &cpu_source; }
