/* A simulated device: a segment source whose addresses are arithmetic, with
 * a byte capacity, so policies can be tested and replayed with no memory. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define SIM_BASE ((uintptr_t)1 << 40)
#define SIM_ALIGN ((size_t)2 << 20)

typedef struct range {
    uintptr_t addr;
    size_t size;
} range;

struct ndm__sim {
    ndm__segment_source src;
    pthread_mutex_t lock;
    size_t capacity, mapped, peak;
    uint64_t maps, unmaps;
    uintptr_t top;      /* next fresh address */
    range *holes;       /* freed address ranges, sorted, coalesced */
    size_t nholes, cap;
};

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Take `size` bytes of address space: the lowest hole that fits, else fresh. */
static uintptr_t take_range(ndm__sim *s, size_t size)
{
    size_t span = align_up(size, SIM_ALIGN);
    for (size_t i = 0; i < s->nholes; i++) {
        if (s->holes[i].size >= span) {
            uintptr_t a = s->holes[i].addr;
            s->holes[i].addr += span;
            s->holes[i].size -= span;
            if (!s->holes[i].size) {
                memmove(&s->holes[i], &s->holes[i + 1], (s->nholes - i - 1) * sizeof(range));
                s->nholes--;
            }
            return a;
        }
    }
    uintptr_t a = s->top;
    s->top += span;
    return a;
}

static bool give_range(ndm__sim *s, uintptr_t addr, size_t size)
{
    size_t span = align_up(size, SIM_ALIGN);
    size_t i = 0;
    while (i < s->nholes && s->holes[i].addr < addr)
        i++;
    bool prev = i > 0 && s->holes[i - 1].addr + s->holes[i - 1].size == addr;
    bool next = i < s->nholes && addr + span == s->holes[i].addr;
    if (prev && next) {
        s->holes[i - 1].size += span + s->holes[i].size;
        memmove(&s->holes[i], &s->holes[i + 1], (s->nholes - i - 1) * sizeof(range));
        s->nholes--;
    } else if (prev) {
        s->holes[i - 1].size += span;
    } else if (next) {
        s->holes[i].addr = addr;
        s->holes[i].size += span;
    } else {
        if (s->nholes == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 64;
            range *h = realloc(s->holes, cap * sizeof *h);
            if (!h)
                return false; /* the range is lost to reuse, never handed out twice */
            s->holes = h;
            s->cap = cap;
        }
        memmove(&s->holes[i + 1], &s->holes[i], (s->nholes - i) * sizeof(range));
        s->holes[i] = (range){addr, span};
        s->nholes++;
    }
    /* A hole at the top shrinks the fresh region instead. */
    if (s->nholes && s->holes[s->nholes - 1].addr + s->holes[s->nholes - 1].size == s->top) {
        s->top = s->holes[s->nholes - 1].addr;
        s->nholes--;
    }
    return true;
}

static ndm_status sim_map(void *ctx, size_t size, void **out)
{
    ndm__sim *s = ctx;
    *out = NULL;
    pthread_mutex_lock(&s->lock);
    if (size == 0 || (s->capacity && (size > s->capacity || s->mapped > s->capacity - size))) {
        pthread_mutex_unlock(&s->lock);
        return NDM_E_OOM;
    }
    *out = (void *)take_range(s, size);
    s->mapped += size;
    if (s->mapped > s->peak)
        s->peak = s->mapped;
    s->maps++;
    pthread_mutex_unlock(&s->lock);
    return NDM_OK;
}

static void sim_unmap(void *ctx, void *ptr, size_t size)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    give_range(s, (uintptr_t)ptr, size);
    s->mapped -= size;
    s->unmaps++;
    pthread_mutex_unlock(&s->lock);
}

static ndm_status sim_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    *total_bytes = s->capacity;
    *free_bytes = s->capacity ? s->capacity - s->mapped : 0;
    pthread_mutex_unlock(&s->lock);
    return NDM_OK;
}

ndm__sim *ndm__sim_new(size_t capacity)
{
    ndm__sim *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->capacity = capacity;
    s->top = SIM_BASE;
    s->src = (ndm__segment_source){
        .name = "sim", .map = sim_map, .unmap = sim_unmap, .mem_info = sim_mem_info, .ctx = s};
    return s;
}

void ndm__sim_destroy(ndm__sim *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->lock);
    free(s->holes);
    free(s);
}

const ndm__segment_source *ndm__sim_source(ndm__sim *s) { return &s->src; }

void ndm__sim_set_capacity(ndm__sim *s, size_t capacity)
{
    pthread_mutex_lock(&s->lock);
    s->capacity = capacity;
    pthread_mutex_unlock(&s->lock);
}

#define SIM_GETTER(type, name, field)                                                    \
    type name(const ndm__sim *s)                                                         \
    {                                                                                    \
        pthread_mutex_lock((pthread_mutex_t *)&s->lock);                                 \
        type v = s->field;                                                               \
        pthread_mutex_unlock((pthread_mutex_t *)&s->lock);                               \
        return v;                                                                        \
    }
SIM_GETTER(size_t, ndm__sim_mapped, mapped)
SIM_GETTER(size_t, ndm__sim_peak, peak)
SIM_GETTER(uint64_t, ndm__sim_maps, maps)
SIM_GETTER(uint64_t, ndm__sim_unmaps, unmaps)
