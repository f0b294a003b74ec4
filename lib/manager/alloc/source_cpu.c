/* The CPU segment source: anonymous mmap aligned to 2 MiB with transparent
 * huge pages requested for segments of 2 MiB and more (a fresh 4 KiB page
 * fault costs about 10 us; one 2 MiB fault covers 512 pages), and 64-byte
 * aligned heap memory for the small exact segments of the system strategy;
 * for expandable segments, ranges reserved without access and committed in
 * place, 2 MiB at a time. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define PAGE ((size_t)4096)

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* len bytes of anonymous memory (len + HUGE_PAGE must not overflow) that
 * start on a huge page boundary, or NULL: over-mapped by one huge page and
 * trimmed, so the kernel can back the range with huge pages. */
static char *map_huge_aligned(size_t len, int prot, int flags)
{
    char *raw = mmap(NULL, len + HUGE_PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)round_up((uintptr_t)raw, HUGE_PAGE);
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + len + HUGE_PAGE - (p + len));
    if (tail)
        munmap(p + len, tail);
    return p;
}

static ndm_status cpu_map(void *ctx, size_t size, void **out)
{
    (void)ctx;
    *out = NULL;
    if (size >= HUGE_PAGE) {
        size_t len = round_up(size, PAGE);
        if (len < size || len + HUGE_PAGE < len)
            return NDM_E_OOM;
        char *p = map_huge_aligned(len, PROT_READ | PROT_WRITE, 0);
        if (!p)
            return NDM_E_OOM;
#ifdef MADV_HUGEPAGE
        madvise(p, len, MADV_HUGEPAGE);
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
    if (size >= HUGE_PAGE)
        munmap(ptr, round_up(size, PAGE));
    else
        free(ptr);
}

/* A reserve is address space only (no access, no swap accounted); commit
 * opens pages for reading and writing, decommit maps fresh inaccessible
 * pages over them, which gives the memory back to the system. */
static ndm_status cpu_reserve(void *ctx, size_t size, void **out)
{
    (void)ctx;
    *out = NULL;
    if (size > SIZE_MAX - HUGE_PAGE)
        return NDM_E_OOM;
    char *p = map_huge_aligned(size, PROT_NONE, MAP_NORESERVE);
    if (!p)
        return NDM_E_OOM;
    *out = p;
    return NDM_OK;
}

static void cpu_unreserve(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    munmap(ptr, size);
}

static ndm_status cpu_commit(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0)
        return NDM_E_OOM;
#ifdef MADV_HUGEPAGE
    madvise(ptr, size, MADV_HUGEPAGE);
#endif
    return NDM_OK;
}

static void cpu_decommit(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (mmap(ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) == MAP_FAILED) {
        /* Keep the range reserved either way: at least drop its pages. */
        madvise(ptr, size, MADV_DONTNEED);
        mprotect(ptr, size, PROT_NONE);
    }
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
    .reserve = cpu_reserve,
    .unreserve = cpu_unreserve,
    .commit = cpu_commit,
    .decommit = cpu_decommit,
    .commit_granularity = HUGE_PAGE,
    .ctx = NULL,
};

const ndm__segment_source *ndm__cpu_segment_source(void);
const ndm__segment_source *ndm__cpu_segment_source(void) { return &cpu_source; }
