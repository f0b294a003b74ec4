/* The caching allocator core with streams, expandable segments and reclaim
 * levels, on a simulated device whose streams a test holds back: the figures
 * against the snapshot after every step, reuse only on the owning stream,
 * frees that wait for other streams' events, growth in place, limits, OOM. */
#include <inttypes.h>
#include <stdlib.h>

#include "helpers.h"
#include "manager/alloc/pool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Two user streams beside the default one (0). */
#define SA ((uintptr_t)0x1000)
#define SB ((uintptr_t)0x2000)

typedef struct fixture {
    ndm__sim *sim;
    ndm__pool *pool;
} fixture;

enum { STREAMS = 1, EXPAND = 2 };

static fixture make(size_t capacity, unsigned features, const char *conf)
{
    fixture f;
    f.sim = ndm__sim_new(capacity);
    assert_non_null(f.sim);
    if (features & STREAMS)
        ndm__sim_enable_streams(f.sim);
    if (features & EXPAND)
        ndm__sim_enable_expandable(f.sim, 2 * MiB);
    f.pool = ndm__pool_new(ndm__sim_source(f.sim), NDM_CPU, "sim", false);
    assert_non_null(f.pool);
    if (conf) {
        ndm__settings s;
        char err[256];
        if (ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err) != NDM_OK)
            fail_msg("settings '%s': %s", conf, err);
        assert_ok(ndm__pool_configure(f.pool, &s, conf));
    }
    return f;
}

static ndm_memory_stats stats(fixture *f)
{
    ndm_memory_stats st;
    ndm__pool_stats(f->pool, &st);
    return st;
}

/* Everything is free again and nothing is left behind: no pending free, no
 * live event, and after empty_cache nothing committed on the device. */
static void done(fixture *f)
{
    ndm_memory_stats st = stats(f);
    assert_int_equal(st.allocation[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.active[NDM_POOL_ALL].current, 0);
    assert_int_equal(ndm__pool_pending(f->pool), 0);
    ndm__pool_empty_cache(f->pool);
    assert_int_equal(ndm__sim_mapped(f->sim), 0);
    assert_int_equal(ndm__sim_events_live(f->sim), 0);
    ndm__pool_destroy(f->pool);
    ndm__sim_destroy(f->sim);
}

static ndm__block get_on(fixture *f, size_t n, uintptr_t stream)
{
    ndm__block b;
    ndm_status st = ndm__pool_alloc_on(f->pool, n, stream, NULL, &b);
    if (st != NDM_OK)
        fail_msg("alloc %zu on %#" PRIxPTR ": %s", n, stream, ndm_last_error());
    return b;
}

static void put(fixture *f, ndm__block *b) { ndm__pool_free(f->pool, b); }

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* PyTorch's consistency oracle: the figures rebuilt from the layout. A
 * block waiting on events is active but not allocated, nor inactive. */
static void check_oracle(fixture *f)
{
    ndm_memory_stats st = stats(f);
    ndm__snapshot s;
    assert_ok(ndm__pool_snapshot(f->pool, &s));
    int64_t allocation[3] = {0}, allocated[3] = {0}, active[3] = {0}, active_b[3] = {0};
    int64_t reserved[3] = {0}, segment[3] = {0}, isplit_n[3] = {0}, isplit_b[3] = {0};
    for (size_t i = 0; i < s.nsegs; i++) {
        const ndm__snap_seg *g = &s.segs[i];
        int k = g->pool == NDM__POOL_SMALL ? NDM_POOL_SMALL : NDM_POOL_LARGE;
        segment[k]++;
        reserved[k] += (int64_t)g->size;
        uintptr_t at = g->addr;
        for (size_t j = 0; j < g->count; j++) {
            const ndm__snap_block *b = &s.blocks[g->first + j];
            assert_int_equal(b->addr, at);
            /* every block of a segment serves the segment's stream */
            assert_int_equal(b->stream, g->stream);
            at += b->size;
            if (b->state == NDM__B_ALLOCATED) {
                allocation[k]++;
                allocated[k] += (int64_t)b->size;
            }
            if (b->state == NDM__B_ALLOCATED || b->state == NDM__B_PENDING) {
                active[k]++;
                active_b[k] += (int64_t)b->size;
            } else if (g->count > 1) {
                isplit_n[k]++;
                isplit_b[k] += (int64_t)b->size;
            }
        }
        assert_int_equal(at, g->addr + g->size);
    }
    ndm__snapshot_free(&s);
    int64_t *fields[] = {allocation, allocated, active, active_b, reserved, segment, isplit_n,
                         isplit_b};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        fields[i][NDM_POOL_ALL] = fields[i][NDM_POOL_SMALL] + fields[i][NDM_POOL_LARGE];
    for (int k = 0; k < NDM_POOL_COUNT; k++) {
        assert_int_equal(st.allocation[k].current, allocation[k]);
        assert_int_equal(st.allocated_bytes[k].current, allocated[k]);
        assert_int_equal(st.active[k].current, active[k]);
        assert_int_equal(st.active_bytes[k].current, active_b[k]);
        assert_int_equal(st.segment[k].current, segment[k]);
        assert_int_equal(st.reserved_bytes[k].current, reserved[k]);
        assert_int_equal(st.inactive_split[k].current, isplit_n[k]);
        assert_int_equal(st.inactive_split_bytes[k].current, isplit_b[k]);
    }
    assert_int_equal(ndm__sim_mapped(f->sim), (size_t)reserved[NDM_POOL_ALL]);
}

/* ---- streams ----------------------------------------------------------------------
 * Requests of 10 MiB and more take a segment of their own size under
 * PyTorch's policy, so each block below is a segment and addresses say which
 * block was reused. */

static void test_stream_free_block_reused_by_its_stream_only(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    uintptr_t at = (uintptr_t)a.ptr;
    put(&f, &a);
    /* another stream may still have work queued before the free: it gets
     * memory of its own */
    ndm__block b = get_on(&f, 4 * MiB, SB);
    assert_true((uintptr_t)b.ptr != at);
    ndm__block d = get_on(&f, 4 * MiB, 0);
    assert_true((uintptr_t)d.ptr != at);
    /* the owning stream runs in order: it reuses the block at once */
    ndm__block c = get_on(&f, 4 * MiB, SA);
    assert_int_equal((uintptr_t)c.ptr, at);
    assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 3);
    check_oracle(&f);
    put(&f, &b);
    put(&f, &c);
    put(&f, &d);
    check_oracle(&f);
    done(&f);
}

static void test_stream_recorded_block_waits_for_the_other_stream(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 12 * MiB, SA);
    uintptr_t at = (uintptr_t)a.ptr;
    void *cookie = a.cookie;
    assert_ok(ndm__pool_record_stream(f.pool, cookie, SB));
    assert_ok(ndm__pool_record_stream(f.pool, cookie, SB)); /* once is enough */
    ndm__sim_stream_hold(f.sim, SB, true);
    put(&f, &a);
    assert_int_equal(ndm__pool_pending(f.pool), 1);
    assert_int_equal(ndm__sim_events_live(f.sim), 1);
    /* freed: no longer allocated, still active until SB's work is done */
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.active_bytes[NDM_POOL_ALL].current, (int64_t)(12 * MiB));
    check_oracle(&f);
    /* SB still runs: even its own stream does not get the block back */
    ndm__block b = get_on(&f, 12 * MiB, SA);
    uintptr_t at_b = (uintptr_t)b.ptr;
    assert_true(at_b != at);
    put(&f, &b);
    assert_int_equal(ndm__pool_pending(f.pool), 1);
    /* SB passes the event: the next allocation finds the block free */
    ndm__sim_stream_hold(f.sim, SB, false);
    ndm__block c = get_on(&f, 12 * MiB, SA);
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    assert_int_equal(ndm__sim_events_live(f.sim), 0);
    assert_true((uintptr_t)c.ptr == at || (uintptr_t)c.ptr == at_b);
    ndm__block d = get_on(&f, 12 * MiB, SA);
    assert_true((uintptr_t)d.ptr == at || (uintptr_t)d.ptr == at_b);
    assert_true(c.ptr != d.ptr);
    assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 2);
    check_oracle(&f);
    put(&f, &c);
    put(&f, &d);
    done(&f);
}

/* The count of streams a block was recorded on, read without the pool's
 * lock (ndm_why_alive's "pending stream uses"): its own stream and a second
 * record of one are not counted; a free clears it. */
static void test_stream_uses_count_the_other_streams(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    assert_int_equal(ndm__pool_stream_uses(a.cookie), 0);
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SA));
    assert_int_equal(ndm__pool_stream_uses(a.cookie), 0);
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SB));
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SB));
    assert_int_equal(ndm__pool_stream_uses(a.cookie), 1);
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, 0));
    assert_int_equal(ndm__pool_stream_uses(a.cookie), 2);
    assert_int_equal(ndm__pool_stream_uses(NULL), 0);
    ndm__block b = get_on(&f, 4 * MiB, SB);
    assert_int_equal(ndm__pool_stream_uses(b.cookie), 0);
    put(&f, &a);
    put(&f, &b);
    /* (the next allocation collects a's events, done: the streams ran) */
    ndm__block c = get_on(&f, 4 * MiB, SA);
    assert_int_equal(ndm__pool_stream_uses(c.cookie), 0);
    put(&f, &c);
    done(&f);
}

static void test_stream_record_on_own_stream_changes_nothing(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    uintptr_t at = (uintptr_t)a.ptr;
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SA));
    ndm__sim_stream_hold(f.sim, SA, true);
    put(&f, &a);
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    assert_int_equal(ndm__sim_events_live(f.sim), 0);
    ndm__block b = get_on(&f, 4 * MiB, SA);
    assert_int_equal((uintptr_t)b.ptr, at);
    put(&f, &b);
    ndm__sim_stream_hold(f.sim, SA, false);
    done(&f);
}

static void test_stream_events_of_each_stream_complete_in_order(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 12 * MiB, 0), b = get_on(&f, 14 * MiB, 0);
    uintptr_t at_a = (uintptr_t)a.ptr, at_b = (uintptr_t)b.ptr;
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SA));
    assert_ok(ndm__pool_record_stream(f.pool, b.cookie, SA));
    assert_ok(ndm__pool_record_stream(f.pool, b.cookie, SB));
    ndm__sim_stream_hold(f.sim, SA, true);
    put(&f, &a);
    put(&f, &b);
    assert_int_equal(ndm__pool_pending(f.pool), 3);
    /* SB is done but b still waits for SA */
    ndm__block x = get_on(&f, 512, 0);
    assert_int_equal(ndm__pool_pending(f.pool), 2);
    ndm__block y = get_on(&f, 14 * MiB, 0);
    assert_true((uintptr_t)y.ptr != at_b);
    check_oracle(&f);
    ndm__sim_stream_hold(f.sim, SA, false);
    ndm__block z = get_on(&f, 12 * MiB, 0);
    assert_int_equal((uintptr_t)z.ptr, at_a);
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    check_oracle(&f);
    put(&f, &x);
    put(&f, &y);
    put(&f, &z);
    done(&f);
}

static void test_stream_empty_cache_waits_for_pending_frees(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SB));
    ndm__sim_stream_hold(f.sim, SB, true);
    put(&f, &a);
    int64_t syncs = stats(&f).num_sync_all_streams;
    ndm__pool_empty_cache(f.pool);
    /* the event was waited for, the block freed, its segment returned */
    assert_int_equal(ndm__sim_event_syncs(f.sim), 1);
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    assert_int_equal(stats(&f).num_sync_all_streams, syncs + 1);
    assert_int_equal(stats(&f).reserved_bytes[NDM_POOL_ALL].current, 0);
    check_oracle(&f);
    ndm__sim_stream_hold(f.sim, SB, false);
    done(&f);
}

/* A device that cannot map another segment: the retry ladder waits for the
 * events and searches the pool again before it maps (PyTorch's #189504). */
static void test_stream_oom_ladder_waits_for_events_and_reuses(void **state)
{
    (void)state;
    fixture f = make(16 * MiB, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 12 * MiB, SA);
    uintptr_t at = (uintptr_t)a.ptr;
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SB));
    ndm__sim_stream_hold(f.sim, SB, true);
    put(&f, &a);
    ndm__block b = get_on(&f, 12 * MiB, SA);
    assert_int_equal((uintptr_t)b.ptr, at);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_ooms, 0);
    assert_int_equal(st.num_sync_all_streams, 1);
    assert_int_equal(ndm__sim_event_syncs(f.sim), 1);
    check_oracle(&f);
    /* a request no wait can serve is an OOM that names the request */
    ndm__block c;
    assert_int_equal(ndm__pool_alloc_on(f.pool, 12 * MiB, SA, NULL, &c), NDM_E_OOM);
    assert_error_has("tried to allocate 12.00 MiB");
    assert_null(c.cookie);
    assert_int_equal(stats(&f).num_ooms, 1);
    put(&f, &b);
    ndm__sim_stream_hold(f.sim, SB, false);
    done(&f);
}

static void test_stream_failed_record_waits_for_a_full_sync(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    uintptr_t at = (uintptr_t)a.ptr;
    assert_ok(ndm__pool_record_stream(f.pool, a.cookie, SB));
    ndm__sim_fail_next_record(f.sim);
    put(&f, &a);
    /* without an event nothing says SB is past the block: it stays held */
    assert_int_equal(ndm__pool_pending(f.pool), 1);
    ndm__block b = get_on(&f, 4 * MiB, SA);
    assert_true((uintptr_t)b.ptr != at);
    assert_int_equal(ndm__pool_pending(f.pool), 1);
    put(&f, &b);
    ndm__pool_empty_cache(f.pool);
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    check_oracle(&f);
    done(&f);
}

static void test_stream_record_rejects_bad_input(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "policy:pytorch");
    ndm__block a = get_on(&f, 4 * MiB, SA);
    void *cookie = a.cookie;
    put(&f, &a);
    /* a free block is no one's to record */
    assert_int_equal(ndm__pool_record_stream(f.pool, cookie, SB), NDM_E_INVALID);
    assert_ok(ndm__pool_record_stream(f.pool, NULL, SB));
    assert_int_equal(ndm__pool_pending(f.pool), 0);
    done(&f);
    /* a device without streams: work is done when its call returns */
    fixture g = make(0, 0, "policy:pytorch");
    ndm__block b = get_on(&g, 4 * MiB, SA);
    uintptr_t at = (uintptr_t)b.ptr;
    assert_ok(ndm__pool_record_stream(g.pool, b.cookie, SB));
    put(&g, &b);
    ndm__block c = get_on(&g, 4 * MiB, SB);
    assert_int_equal((uintptr_t)c.ptr, at);
    put(&g, &c);
    done(&g);
}

/* Random allocations and frees on three streams, with random cross-stream
 * uses and holds, checked against the layout after every step; no block is
 * ever handed out twice, nor while a stream that used it is held. */
static void test_stream_random_mix_keeps_figures_exact(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS, "thread_cache:False");
    enum { N = 48 };
    struct live {
        ndm__block b;
        uintptr_t stream;
    } live[N];
    memset(live, 0, sizeof live);
    const uintptr_t streams[3] = {0, SA, SB};
    bool held[3] = {false, false, false};
    /* blocks freed while a stream that used them was held: address and the
     * held streams, which must not be reused until those are released */
    struct waiting {
        uintptr_t addr;
        size_t size;
        unsigned mask;
    } wait[4096];
    size_t nwait = 0;
    uint64_t rng = 0x5eed;
    for (int step = 0; step < 3000; step++) {
        uint64_t r = rng_next(&rng);
        int i = (int)(r % N);
        int si = (int)((r >> 8) % 3);
        if ((r >> 16) % 17 == 0) {
            held[si] = !held[si];
            ndm__sim_stream_hold(f.sim, streams[si], held[si]);
            if (!held[si]) {
                size_t w = 0;
                for (size_t k = 0; k < nwait; k++) {
                    wait[k].mask &= ~(1u << si);
                    if (wait[k].mask)
                        wait[w++] = wait[k];
                }
                nwait = w;
            }
        } else if (!live[i].b.cookie) {
            size_t sizes[] = {700, 64 * KiB, 900 * KiB, 3 * MiB, 12 * MiB};
            size_t n = sizes[(r >> 24) % 5];
            live[i].b = get_on(&f, n, streams[si]);
            live[i].stream = streams[si];
            uintptr_t a = (uintptr_t)live[i].b.ptr;
            for (size_t k = 0; k < nwait; k++)
                if (a < wait[k].addr + wait[k].size && wait[k].addr < a + live[i].b.size)
                    fail_msg("step %d: block %#" PRIxPTR " handed out while a held stream may "
                             "use it",
                             step, a);
        } else if ((r >> 32) % 3 == 0) {
            assert_ok(ndm__pool_record_stream(f.pool, live[i].b.cookie, streams[si]));
            if (streams[si] != live[i].stream && held[si] && nwait < 4096) {
                wait[nwait++] = (struct waiting){(uintptr_t)live[i].b.ptr, live[i].b.size,
                                                 1u << si};
            }
        } else {
            /* entries recorded for a block still live start counting at
             * its free; until then the block is not free anyway */
            put(&f, &live[i].b);
        }
        if (step % 50 == 0)
            check_oracle(&f);
    }
    check_oracle(&f);
    for (int i = 0; i < N; i++)
        if (live[i].b.cookie)
            put(&f, &live[i].b);
    for (int k = 0; k < 3; k++)
        ndm__sim_stream_hold(f.sim, streams[k], false);
    ndm__block flush = get_on(&f, 512, 0);
    put(&f, &flush);
    check_oracle(&f);
    done(&f);
}

/* ---- expandable segments ---------------------------------------------------------- */

#define EXP "policy:pytorch,thread_cache:False,expandable_segments:True"

static void test_expandable_segment_grows_in_place(void **state)
{
    (void)state;
    fixture f = make(0, EXPAND, EXP);
    ndm__block a = get_on(&f, 3 * MiB, 0);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.segment[NDM_POOL_LARGE].current, 1);
    /* committed in 2 MiB granules, not PyTorch's 20 MiB segment */
    assert_int_equal(st.reserved_bytes[NDM_POOL_LARGE].current, (int64_t)(4 * MiB));
    ndm__block b = get_on(&f, 5 * MiB, 0);
    /* the same segment, grown: b follows a */
    assert_int_equal((uintptr_t)b.ptr, (uintptr_t)a.ptr + 3 * MiB);
    st = stats(&f);
    assert_int_equal(st.segment[NDM_POOL_LARGE].current, 1);
    assert_int_equal(st.reserved_bytes[NDM_POOL_LARGE].current, (int64_t)(8 * MiB));
    assert_int_equal(ndm__sim_committed(f.sim), 8 * MiB);
    check_oracle(&f);
    /* freed, the two merge: a larger request fits without growing */
    put(&f, &a);
    put(&f, &b);
    check_oracle(&f);
    ndm__block c = get_on(&f, 7 * MiB, 0);
    assert_int_equal(stats(&f).reserved_bytes[NDM_POOL_ALL].current, (int64_t)(8 * MiB));
    put(&f, &c);
    check_oracle(&f);
    done(&f);
}

static void test_expandable_empty_cache_decommits_the_free_end(void **state)
{
    (void)state;
    fixture f = make(0, EXPAND, EXP);
    ndm__block a = get_on(&f, 3 * MiB, 0), b = get_on(&f, 9 * MiB, 0);
    assert_int_equal(stats(&f).reserved_bytes[NDM_POOL_ALL].current, (int64_t)(12 * MiB));
    put(&f, &b);
    int64_t frees = stats(&f).num_device_free;
    ndm__pool_empty_cache(f.pool);
    /* the end is decommitted down to the granule a still touches */
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, (int64_t)(4 * MiB));
    assert_int_equal(st.segment[NDM_POOL_ALL].current, 1);
    assert_int_equal(st.num_device_free, frees + 1);
    assert_int_equal(ndm__sim_committed(f.sim), 4 * MiB);
    check_oracle(&f);
    /* it grows again from there */
    ndm__block c = get_on(&f, 5 * MiB, 0);
    assert_int_equal((uintptr_t)c.ptr, (uintptr_t)a.ptr + 3 * MiB);
    check_oracle(&f);
    put(&f, &a);
    put(&f, &c);
    ndm__pool_empty_cache(f.pool);
    assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 0);
    assert_int_equal(ndm__sim_committed(f.sim), 0);
    done(&f);
}

/* The pattern that strands PyTorch's segments: a large block freed, then a
 * slightly larger request. In place, it grows by the difference. */
static void test_expandable_changing_sizes_do_not_fragment(void **state)
{
    (void)state;
    fixture classic = make(0, EXPAND, "policy:pytorch,thread_cache:False");
    fixture grown = make(0, EXPAND, EXP);
    fixture *fx[2] = {&classic, &grown};
    for (int k = 0; k < 2; k++) {
        for (size_t n = 12; n <= 20; n += 2) {
            ndm__block b = get_on(fx[k], n * MiB, 0);
            put(fx[k], &b);
        }
        check_oracle(fx[k]);
    }
    int64_t peak_classic = stats(&classic).reserved_bytes[NDM_POOL_ALL].peak;
    int64_t peak_grown = stats(&grown).reserved_bytes[NDM_POOL_ALL].peak;
    assert_int_equal(peak_classic, (int64_t)((12 + 14 + 16 + 18 + 20) * MiB));
    assert_int_equal(peak_grown, (int64_t)(20 * MiB));
    done(&classic);
    done(&grown);
}

static void test_expandable_limit_and_oom(void **state)
{
    (void)state;
    fixture f = make(0, EXPAND, EXP ",memory_limit_mb:10");
    ndm__block a = get_on(&f, 6 * MiB, 0);
    ndm__block b;
    assert_int_equal(ndm__pool_alloc_on(f.pool, 6 * MiB, 0, NULL, &b), NDM_E_OOM);
    assert_error_has("limit 10.00 MiB");
    assert_null(b.cookie);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, (int64_t)(6 * MiB));
    check_oracle(&f);
    /* within the limit it still grows */
    ndm__block c = get_on(&f, 4 * MiB, 0);
    assert_int_equal((uintptr_t)c.ptr, (uintptr_t)a.ptr + 6 * MiB);
    put(&f, &a);
    put(&f, &c);
    done(&f);
    /* the device itself refuses: the free end of the segment is given
     * back by the retry ladder before the OOM is reported */
    fixture g = make(8 * MiB, EXPAND, EXP);
    ndm__block small = get_on(&g, 600 * KiB, 0);
    ndm__block x = get_on(&g, 4 * MiB, 0);
    put(&g, &x);
    ndm__block y = get_on(&g, 6 * MiB, 0);
    assert_int_equal(stats(&g).num_alloc_retries, 0);
    ndm__block z;
    assert_int_equal(ndm__pool_alloc_on(g.pool, 4 * MiB, 0, NULL, &z), NDM_E_OOM);
    assert_int_equal(stats(&g).num_ooms, 1);
    check_oracle(&g);
    put(&g, &y);
    put(&g, &small);
    done(&g);
}

static void test_expandable_one_segment_per_stream_and_pool(void **state)
{
    (void)state;
    fixture f = make(0, STREAMS | EXPAND, EXP);
    ndm__block a = get_on(&f, 3 * MiB, SA), b = get_on(&f, 3 * MiB, SB);
    ndm__block c = get_on(&f, 100 * KiB, SA), d = get_on(&f, 3 * MiB, SA);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.segment[NDM_POOL_LARGE].current, 2);
    assert_int_equal(st.segment[NDM_POOL_SMALL].current, 1);
    assert_int_equal((uintptr_t)d.ptr, (uintptr_t)a.ptr + 3 * MiB);
    check_oracle(&f);
    put(&f, &a);
    put(&f, &b);
    put(&f, &c);
    put(&f, &d);
    done(&f);
}

static void test_expandable_without_reserve_maps_segments(void **state)
{
    (void)state;
    /* a device that cannot reserve: expandable_segments changes nothing */
    fixture f = make(0, 0, EXP);
    ndm__block a = get_on(&f, 3 * MiB, 0);
    assert_int_equal(stats(&f).reserved_bytes[NDM_POOL_ALL].current, (int64_t)(20 * MiB));
    put(&f, &a);
    done(&f);
}

/* The CPU's own source: a reserved range without access, committed in
 * place; data written before a growth is still there after it. */
const ndm__segment_source *ndm__cpu_segment_source(void);

static void test_expandable_cpu_source_commits_in_place(void **state)
{
    (void)state;
    ndm__pool *p = ndm__pool_new(ndm__cpu_segment_source(), NDM_CPU, "cpu-test", false);
    assert_non_null(p);
    const char *conf = EXP ",memory_limit_mb:64";
    ndm__settings s;
    char err[256];
    assert_ok(ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err));
    assert_ok(ndm__pool_configure(p, &s, conf));
    ndm__block a, b, c;
    assert_ok(ndm__pool_alloc(p, 3 * MiB, NULL, &a));
    memset(a.ptr, 0x5a, 3 * MiB);
    assert_ok(ndm__pool_alloc(p, 5 * MiB, NULL, &b));
    assert_int_equal((uintptr_t)b.ptr, (uintptr_t)a.ptr + 3 * MiB);
    memset(b.ptr, 0xa5, 5 * MiB);
    const unsigned char *x = a.ptr;
    assert_int_equal(x[0], 0x5a);
    assert_int_equal(x[3 * MiB - 1], 0x5a);
    ndm_memory_stats st;
    ndm__pool_stats(p, &st);
    assert_int_equal(st.segment[NDM_POOL_ALL].current, 1);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, (int64_t)(8 * MiB));
    /* past the 64 MiB range: refused, nothing changed */
    assert_int_equal(ndm__pool_alloc(p, 60 * MiB, NULL, &c), NDM_E_OOM);
    ndm__pool_free(p, &b);
    ndm__pool_empty_cache(p);
    ndm__pool_stats(p, &st);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, (int64_t)(4 * MiB));
    /* committed again after a decommit: usable (fresh zero pages) */
    assert_ok(ndm__pool_alloc(p, 5 * MiB, NULL, &b));
    memset(b.ptr, 1, 5 * MiB);
    assert_int_equal(x[3 * MiB - 1], 0x5a);
    ndm__pool_free(p, &a);
    ndm__pool_free(p, &b);
    ndm__pool_empty_cache(p);
    ndm__pool_stats(p, &st);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.segment[NDM_POOL_ALL].current, 0);
    ndm__pool_destroy(p);
}

/* ---- settings and reclaim levels ------------------------------------------------------ */

static void expect_config_error(const char *conf, const char *needle)
{
    ndm__settings s;
    char err[256];
    assert_int_equal(ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err), NDM_E_CONFIG);
    if (!strstr(err, needle))
        fail_msg("'%s': error '%s' lacks '%s'", conf, err, needle);
}

static void test_reclaim_settings_parse_and_reject(void **state)
{
    (void)state;
    ndm__settings s;
    char err[256];
    assert_ok(ndm__settings_parse("", NDM_CPU, &s, err, sizeof err));
    assert_false(s.expandable);
    assert_true(s.reserved_rate == 0.2 && s.allocated_rate == 0.8 &&
                s.allocated_reserved_rate == 0.8);
    assert_ok(ndm__settings_parse("reserved_rate:0.5,allocated_rate:1,allocated_reserved_rate:0,"
                                  "expandable_segments:True",
                                  NDM_CPU, &s, err, sizeof err));
    assert_true(s.reserved_rate == 0.5 && s.allocated_rate == 1 &&
                s.allocated_reserved_rate == 0);
    assert_true(s.expandable);
    expect_config_error("reserved_rate:1.5", "reserved_rate must be in [0, 1] (got 1.5)");
    expect_config_error("allocated_rate:-0.1", "allocated_rate must be in [0, 1]");
    expect_config_error("allocated_reserved_rate:high", "'high' is not a number");
    expect_config_error("expandable_segments:maybe", "expected True or False, got 'maybe'");
    expect_config_error("expandable_segment:True", "unknown key 'expandable_segment'");
}

static void test_reclaim_level_follows_the_rates(void **state)
{
    (void)state;
    ndm__settings s;
    char err[256];
    assert_ok(ndm__settings_parse("", NDM_CPU, &s, err, sizeof err));
    const int64_t G = 1 << 30;
    /* mostly empty device: nothing due */
    assert_int_equal(ndm__pressure_level(&s, G / 10, G / 10, 10 * G), NDM_RECLAIM_NONE);
    /* most of the device allocated: full */
    assert_int_equal(ndm__pressure_level(&s, 9 * G, 9 * G + 1, 10 * G), NDM_RECLAIM_FULL);
    /* the cache is mostly allocated: full */
    assert_int_equal(ndm__pressure_level(&s, 5 * G, 6 * G, 10 * G), NDM_RECLAIM_FULL);
    /* much cached and free: light */
    assert_int_equal(ndm__pressure_level(&s, 2 * G, 6 * G, 10 * G), NDM_RECLAIM_LIGHT);
    /* the boundaries are strict as R torch's: reserved at the rate counts */
    assert_int_equal(ndm__pressure_level(&s, 0, 2 * G, 10 * G), NDM_RECLAIM_LIGHT);
    /* without a known total, reserved stands in */
    assert_int_equal(ndm__pressure_level(&s, G, 4 * G, 0), NDM_RECLAIM_LIGHT);
    assert_int_equal(ndm__pressure_level(&s, 0, 0, 0), NDM_RECLAIM_NONE);
}

static ndm_pressure_level seen_level;
static int seen_calls;

static void record_level(const ndm_pressure_event *ev, void *ud)
{
    (void)ud;
    seen_level = ev->level;
    seen_calls++;
}

static void test_reclaim_level_reaches_the_callbacks(void **state)
{
    (void)state;
    assert_ok(ndm_on_pressure(record_level, NULL));
    struct {
        const char *conf;
        ndm_pressure_level want;
    } cases[] = {
        {"policy:pytorch,thread_cache:False", NDM_RECLAIM_FULL},
        {"policy:pytorch,thread_cache:False,allocated_rate:1,allocated_reserved_rate:1",
         NDM_RECLAIM_LIGHT},
        {"policy:pytorch,thread_cache:False,reserved_rate:1", NDM_RECLAIM_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        /* 12 of 16 MiB allocated, all of it reserved: a second 12 MiB fails */
        fixture f = make(16 * MiB, 0, cases[i].conf);
        ndm__block a = get_on(&f, 12 * MiB, 0);
        seen_calls = 0;
        ndm__block b;
        assert_int_equal(ndm__pool_alloc_on(f.pool, 12 * MiB, 0, NULL, &b), NDM_E_OOM);
        assert_int_equal(seen_calls, 1);
        assert_int_equal(seen_level, cases[i].want);
        put(&f, &a);
        done(&f);
    }
    assert_ok(ndm_pressure_remove(record_level, NULL));
    /* the public query on the CPU's allocator */
    ndm_pressure_level l = ndm_memory_pressure_level(NDM_CPU);
    assert_true(l == NDM_RECLAIM_NONE || l == NDM_RECLAIM_LIGHT || l == NDM_RECLAIM_FULL);
    assert_int_equal(ndm_memory_pressure_level(NDM_CUDA(99)), NDM_RECLAIM_NONE);
    assert_true(ndm_last_status() < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_free_block_reused_by_its_stream_only),
        cmocka_unit_test(test_stream_recorded_block_waits_for_the_other_stream),
        cmocka_unit_test(test_stream_record_on_own_stream_changes_nothing),
        cmocka_unit_test(test_stream_uses_count_the_other_streams),
        cmocka_unit_test(test_stream_events_of_each_stream_complete_in_order),
        cmocka_unit_test(test_stream_empty_cache_waits_for_pending_frees),
        cmocka_unit_test(test_stream_oom_ladder_waits_for_events_and_reuses),
        cmocka_unit_test(test_stream_failed_record_waits_for_a_full_sync),
        cmocka_unit_test(test_stream_record_rejects_bad_input),
        cmocka_unit_test(test_stream_random_mix_keeps_figures_exact),
        cmocka_unit_test(test_expandable_segment_grows_in_place),
        cmocka_unit_test(test_expandable_empty_cache_decommits_the_free_end),
        cmocka_unit_test(test_expandable_changing_sizes_do_not_fragment),
        cmocka_unit_test(test_expandable_limit_and_oom),
        cmocka_unit_test(test_expandable_one_segment_per_stream_and_pool),
        cmocka_unit_test(test_expandable_without_reserve_maps_segments),
        cmocka_unit_test(test_expandable_cpu_source_commits_in_place),
        cmocka_unit_test(test_reclaim_settings_parse_and_reject),
        cmocka_unit_test(test_reclaim_level_follows_the_rates),
        cmocka_unit_test(test_reclaim_level_reaches_the_callbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
