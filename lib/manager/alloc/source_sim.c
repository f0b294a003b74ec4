/* A simulated device: a segment source whose addresses are arithmetic, with
 * a byte capacity, so policies can be tested and replayed with no memory;
 * optionally with streams whose work a test holds back, and with reserved
 * ranges committed in place (expandable segments). */
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

/* A simulated stream: events recorded on it are numbered; those up to
 * `done` are complete. A held stream completes nothing until released. */
typedef struct sim_stream {
    uintptr_t id;
    uint64_t recorded, done;
    bool held;
} sim_stream;

typedef struct sim_event {
    uintptr_t stream;
    uint64_t seq;
} sim_event;

#define SIM_STREAMS 64

struct ndm__sim {
    ndm__segment_source src;
    pthread_mutex_t lock;
    size_t capacity, mapped;
    uint64_t maps;
    sim_stream streams[SIM_STREAMS];
    int nstreams;
    uint64_t events_live, event_syncs;
    bool fail_record;
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

/* Count `size` more bytes as mapped, within the capacity; s->lock held. A
 * mapped range and a committed part of a reserved one cost the same. */
static ndm_status charge(ndm__sim *s, size_t size)
{
    if (size == 0 || (s->capacity && (size > s->capacity || s->mapped > s->capacity - size)))
        return NDM_E_OOM;
    s->mapped += size;
    s->maps++;
    return NDM_OK;
}

static ndm_status sim_map(void *ctx, size_t size, void **out)
{
    ndm__sim *s = ctx;
    *out = NULL;
    pthread_mutex_lock(&s->lock);
    ndm_status st = charge(s, size);
    if (st == NDM_OK)
        *out = (void *)take_range(s, size);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void sim_unmap(void *ctx, void *ptr, size_t size)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    give_range(s, (uintptr_t)ptr, size);
    s->mapped -= size;
    pthread_mutex_unlock(&s->lock);
}

static sim_stream *sim_stream_of(ndm__sim *s, uintptr_t id)
{
    for (int i = 0; i < s->nstreams; i++)
        if (s->streams[i].id == id)
            return &s->streams[i];
    if (s->nstreams == SIM_STREAMS)
        return NULL;
    sim_stream *t = &s->streams[s->nstreams++];
    *t = (sim_stream){.id = id};
    return t;
}

static ndm_status sim_event_record(void *ctx, uintptr_t stream, void **event)
{
    ndm__sim *s = ctx;
    *event = NULL;
    sim_event *e = malloc(sizeof *e);
    pthread_mutex_lock(&s->lock);
    sim_stream *t = sim_stream_of(s, stream);
    if (!e || !t || s->fail_record) {
        s->fail_record = false;
        pthread_mutex_unlock(&s->lock);
        free(e);
        return NDM_E_DEVICE;
    }
    e->stream = stream;
    e->seq = ++t->recorded;
    if (!t->held)
        t->done = t->recorded;
    s->events_live++;
    pthread_mutex_unlock(&s->lock);
    *event = e;
    return NDM_OK;
}

static int sim_event_query(void *ctx, void *event)
{
    ndm__sim *s = ctx;
    sim_event *e = event;
    pthread_mutex_lock(&s->lock);
    sim_stream *t = sim_stream_of(s, e->stream);
    int done = t && t->done >= e->seq;
    pthread_mutex_unlock(&s->lock);
    return done;
}

/* Waiting for an event of a held stream: the held work runs to that point,
 * as a synchronisation on a device would wait for it. */
static ndm_status sim_event_sync(void *ctx, void *event)
{
    ndm__sim *s = ctx;
    sim_event *e = event;
    pthread_mutex_lock(&s->lock);
    sim_stream *t = sim_stream_of(s, e->stream);
    if (t && t->done < e->seq)
        t->done = e->seq;
    s->event_syncs++;
    pthread_mutex_unlock(&s->lock);
    return NDM_OK;
}

static void sim_event_release(void *ctx, void *event)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->events_live--;
    pthread_mutex_unlock(&s->lock);
    free(event);
}

/* Reserved ranges take addresses only; commits count as mapped bytes. */
static ndm_status sim_reserve(void *ctx, size_t size, void **out)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    *out = (void *)take_range(s, size);
    pthread_mutex_unlock(&s->lock);
    return NDM_OK;
}

static void sim_unreserve(void *ctx, void *ptr, size_t size)
{
    ndm__sim *s = ctx;
    pthread_mutex_lock(&s->lock);
    give_range(s, (uintptr_t)ptr, size);
    pthread_mutex_unlock(&s->lock);
}

static ndm_status sim_commit(void *ctx, void *ptr, size_t size)
{
    ndm__sim *s = ctx;
    (void)ptr;
    pthread_mutex_lock(&s->lock);
    ndm_status st = charge(s, size);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void sim_decommit(void *ctx, void *ptr, size_t size)
{
    ndm__sim *s = ctx;
    (void)ptr;
    pthread_mutex_lock(&s->lock);
    s->mapped -= size;
    pthread_mutex_unlock(&s->lock);
}

void ndm__sim_enable_streams(ndm__sim *s)
{
    s->src.event_record = sim_event_record;
    s->src.event_query = sim_event_query;
    s->src.event_sync = sim_event_sync;
    s->src.event_release = sim_event_release;
}

void ndm__sim_enable_expandable(ndm__sim *s, size_t granularity)
{
    s->src.reserve = sim_reserve;
    s->src.unreserve = sim_unreserve;
    s->src.commit = sim_commit;
    s->src.decommit = sim_decommit;
    s->src.commit_granularity = granularity;
}

void ndm__sim_stream_hold(ndm__sim *s, uintptr_t stream, bool on)
{
    pthread_mutex_lock(&s->lock);
    sim_stream *t = sim_stream_of(s, stream);
    if (t) {
        t->held = on;
        if (!on)
            t->done = t->recorded;
    }
    pthread_mutex_unlock(&s->lock);
}

void ndm__sim_fail_next_record(ndm__sim *s)
{
    pthread_mutex_lock(&s->lock);
    s->fail_record = true;
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

#define SIM_GETTER(type, name, field)                                                    \
    type name(const ndm__sim *s)                                                         \
    {                                                                                    \
        pthread_mutex_lock((pthread_mutex_t *)&s->lock);                                 \
        type v = s->field;                                                               \
        pthread_mutex_unlock((pthread_mutex_t *)&s->lock);                               \
        return v;                                                                        \
    }
SIM_GETTER(size_t, ndm__sim_mapped, mapped)
SIM_GETTER(uint64_t, ndm__sim_maps, maps)
SIM_GETTER(uint64_t, ndm__sim_events_live, events_live)
SIM_GETTER(uint64_t, ndm__sim_event_syncs, event_syncs)
SIM_GETTER(size_t, ndm__sim_committed, mapped)
