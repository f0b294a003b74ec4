/* The caching allocator core on a simulated device: PyTorch's policy, the
 * compact segment policy, the statistics against the snapshot after every
 * step, limits, retries, OOM. */
#include <inttypes.h>
#include <stdlib.h>

#include "helpers.h"
#include "manager/alloc/pool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* PyTorch's segment policy: the CPU's default is the compact one, so tests
 * that pin PyTorch's behaviour name it. */
#define PYTORCH "policy:pytorch"

/* ---- fixtures ------------------------------------------------------------------ */

typedef struct fixture {
    ndm__sim *sim;
    ndm__pool *pool;
} fixture;

static fixture make(size_t capacity, const char *conf)
{
    fixture f;
    f.sim = ndm__sim_new(capacity);
    assert_non_null(f.sim);
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

static void done(fixture *f)
{
    ndm__pool_destroy(f->pool);
    ndm__sim_destroy(f->sim);
}

static ndm__block get(fixture *f, size_t n)
{
    ndm__block b;
    ndm_status st = ndm__pool_alloc(f->pool, n, NULL, &b);
    if (st != NDM_OK)
        fail_msg("alloc %zu: %s", n, ndm_last_error());
    return b;
}

static void put(fixture *f, ndm__block *b) { ndm__pool_free(f->pool, b); }

static ndm_memory_stats stats(fixture *f)
{
    ndm_memory_stats st;
    ndm__pool_stats(f->pool, &st);
    return st;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- the oracle: figures rebuilt from the snapshot ---------------------------------- */

typedef struct oracle {
    int64_t allocation[3], allocated[3], requested[3], segment[3], reserved[3];
    int64_t isplit_n[3], isplit_b[3];
} oracle;

/* Rebuild the current figures from the layout (PyTorch's
 * _check_memory_stat_consistency), check that blocks tile their segments, and
 * compare with the statistics read just before. */
static oracle check_oracle(fixture *f)
{
    ndm_memory_stats st = stats(f);
    ndm__snapshot s;
    assert_ok(ndm__pool_snapshot(f->pool, &s));
    oracle o;
    memset(&o, 0, sizeof o);
    for (size_t i = 0; i < s.nsegs; i++) {
        const ndm__snap_seg *g = &s.segs[i];
        int k = g->pool == NDM__POOL_SMALL ? NDM_POOL_SMALL : NDM_POOL_LARGE;
        o.segment[k]++;
        o.reserved[k] += (int64_t)g->size;
        uintptr_t at = g->addr;
        for (size_t j = 0; j < g->count; j++) {
            const ndm__snap_block *b = &s.blocks[g->first + j];
            if (b->addr != at)
                fail_msg("segment %zu: block %zu starts at %#" PRIxPTR ", expected %#" PRIxPTR, i,
                         j, b->addr, at);
            at += b->size;
            if (b->state == NDM__B_ALLOCATED) {
                o.allocation[k]++;
                o.allocated[k] += (int64_t)b->size;
                o.requested[k] += (int64_t)b->requested;
            } else if (g->count > 1) {
                o.isplit_n[k]++;
                o.isplit_b[k] += (int64_t)b->size;
            }
        }
        assert_int_equal(at, g->addr + g->size);
        if (i)
            assert_true(s.segs[i - 1].addr + s.segs[i - 1].size <= g->addr);
    }
    ndm__snapshot_free(&s);
    int64_t *fields[] = {o.allocation, o.allocated, o.requested, o.segment,
                         o.reserved,   o.isplit_n,  o.isplit_b};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        fields[i][NDM_POOL_ALL] = fields[i][NDM_POOL_SMALL] + fields[i][NDM_POOL_LARGE];
    for (int k = 0; k < NDM_POOL_COUNT; k++) {
        assert_int_equal(st.allocation[k].current, o.allocation[k]);
        assert_int_equal(st.active[k].current, o.allocation[k]);
        assert_int_equal(st.allocated_bytes[k].current, o.allocated[k]);
        assert_int_equal(st.active_bytes[k].current, o.allocated[k]);
        assert_int_equal(st.requested_bytes[k].current, o.requested[k]);
        assert_int_equal(st.segment[k].current, o.segment[k]);
        assert_int_equal(st.reserved_bytes[k].current, o.reserved[k]);
        assert_int_equal(st.inactive_split[k].current, o.isplit_n[k]);
        assert_int_equal(st.inactive_split_bytes[k].current, o.isplit_b[k]);
        /* current = allocated - freed for every figure that starts at zero */
        assert_int_equal(st.allocated_bytes[k].current,
                         st.allocated_bytes[k].allocated - st.allocated_bytes[k].freed);
        assert_int_equal(st.inactive_split[k].current,
                         st.inactive_split[k].allocated - st.inactive_split[k].freed);
    }
    assert_int_equal(ndm__sim_mapped(f->sim), (size_t)o.reserved[NDM_POOL_ALL]);
    return o;
}

/* ---- policy ----------------------------------------------------------------------- */

static void test_alloc_rounds_to_512_and_picks_pools(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    struct {
        size_t req, size;
        int pool;
    } cases[] = {
        {0, 512, NDM_POOL_SMALL},          {1, 512, NDM_POOL_SMALL},
        {512, 512, NDM_POOL_SMALL},        {513, 1024, NDM_POOL_SMALL},
        {MiB, MiB, NDM_POOL_SMALL},        {MiB + 1, MiB + 512, NDM_POOL_LARGE},
        {10 * MiB + 7, 10 * MiB + 512, NDM_POOL_LARGE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ndm_memory_stats before = stats(&f);
        ndm__block b = get(&f, cases[i].req);
        assert_int_equal(b.size, cases[i].size);
        assert_int_equal((uintptr_t)b.ptr % 512, 0);
        ndm_memory_stats after = stats(&f);
        int k = cases[i].pool;
        assert_int_equal(after.allocated_bytes[k].current - before.allocated_bytes[k].current,
                         (int64_t)cases[i].size);
        assert_int_equal(after.requested_bytes[k].current - before.requested_bytes[k].current,
                         (int64_t)cases[i].req);
        put(&f, &b);
    }
    check_oracle(&f);
    done(&f);
}

static void test_alloc_segment_sizes_follow_pytorch(void **state)
{
    (void)state;
    struct {
        size_t req, segment;
    } cases[] = {
        {100, 2 * MiB},         {MiB, 2 * MiB},           {MiB + 1, 20 * MiB},
        {9 * MiB, 20 * MiB},    {10 * MiB, 10 * MiB},     {11 * MiB + 1, 12 * MiB},
        {41 * MiB, 42 * MiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture f = make(0, PYTORCH);
        ndm__block b = get(&f, cases[i].req);
        assert_int_equal(ndm__sim_mapped(f.sim), cases[i].segment);
        assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 1);
        put(&f, &b);
        done(&f);
    }
    /* large_segment_size_mb changes the segment for 1-10 MiB requests */
    fixture f = make(0, PYTORCH ",large_segment_size_mb:4");
    ndm__block b = get(&f, 3 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 4 * MiB);
    put(&f, &b);
    done(&f);
}

static void test_alloc_best_fit_by_size_then_address(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    /* Four large segments of 12, 14, 12 and 16 MiB, each one block, then free. */
    size_t sizes[] = {12 * MiB, 14 * MiB, 12 * MiB, 16 * MiB};
    ndm__block b[4];
    for (int i = 0; i < 4; i++)
        b[i] = get(&f, sizes[i]);
    uintptr_t addr[4];
    for (int i = 0; i < 4; i++)
        addr[i] = (uintptr_t)b[i].ptr;
    for (int i = 3; i >= 0; i--)
        put(&f, &b[i]);
    /* 13 MiB: the 14 MiB block is the smallest that fits. */
    ndm__block x = get(&f, 13 * MiB);
    assert_int_equal((uintptr_t)x.ptr, addr[1]);
    /* 11 MiB: two 12 MiB blocks tie; the lower address wins. */
    ndm__block y = get(&f, 11 * MiB);
    uintptr_t low = addr[0] < addr[2] ? addr[0] : addr[2];
    assert_int_equal((uintptr_t)y.ptr, low);
    /* 12 MiB: the other 12 MiB block. */
    ndm__block z = get(&f, 12 * MiB);
    assert_int_equal((uintptr_t)z.ptr, addr[0] < addr[2] ? addr[2] : addr[0]);
    assert_int_equal(ndm__sim_maps(f.sim), 4);
    put(&f, &x);
    put(&f, &y);
    put(&f, &z);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_split_rules(void **state)
{
    (void)state;
    /* Small pool: any remainder of at least 512 bytes is split off. */
    fixture f = make(0, PYTORCH);
    ndm__block a = get(&f, 1536);
    ndm__block b = get(&f, 512);
    assert_int_equal((uintptr_t)b.ptr, (uintptr_t)a.ptr + 1536);
    oracle o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_SMALL], 1);
    put(&f, &a);
    put(&f, &b);
    done(&f);

    /* Large pool: split only when more than 1 MiB would remain. */
    f = make(0, PYTORCH);
    ndm__block big = get(&f, 12 * MiB); /* a 12 MiB segment */
    put(&f, &big);
    ndm__block c = get(&f, 11 * MiB);     /* 1 MiB would remain: no split */
    assert_int_equal(c.size, 12 * MiB);
    o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_LARGE], 0);
    assert_int_equal(stats(&f).allocated_bytes[NDM_POOL_LARGE].current, 12 * MiB);
    put(&f, &c);
    ndm__block d = get(&f, 10 * MiB);     /* 2 MiB remain: split */
    o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_LARGE], 1);
    assert_int_equal(o.isplit_b[NDM_POOL_LARGE], 2 * MiB);
    put(&f, &d);
    o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_LARGE], 0); /* merged back */
    done(&f);
}

static void test_alloc_oversize_rules_with_max_split(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH ",max_split_size_mb:40");
    ndm__block big = get(&f, 64 * MiB);
    put(&f, &big);
    /* A request under max_split never takes a block of max_split or more. */
    ndm__block a = get(&f, 30 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 2);
    assert_int_equal(stats(&f).oversize_segments.current, 1);
    /* A request of max_split or more takes a block within 20 MiB of it ... */
    ndm__block b = get(&f, 50 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 2);
    assert_int_equal(b.size, 64 * MiB); /* handed out whole: no split at or above max_split */
    assert_int_equal(stats(&f).oversize_allocations.current, 1);
    put(&f, &b);
    /* ... but not one 20 MiB or more larger than the request. */
    ndm__block c = get(&f, 42 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 3);
    put(&f, &a);
    put(&f, &c);
    check_oracle(&f);
    done(&f);
}

/* PyTorch's roundup with power-of-two divisions, written out independently. */
static size_t reference_round(size_t size, unsigned div)
{
    if (size <= 512 * (size_t)div || div <= 1)
        return (size + 511) / 512 * 512;
    size_t lo = 1;
    while (lo * 2 <= size)
        lo *= 2;
    if (lo == size)
        return size;
    size_t step = lo / div;
    return (size + step - 1) / step * step;
}

static void test_alloc_roundup_power2_divisions(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH ",roundup_power2_divisions:4");
    size_t sizes[] = {84 * MiB + 3, 400 * MiB, 1200, 5 * MiB + 1, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        ndm__block b = get(&f, sizes[i]);
        assert_int_equal(b.size, reference_round(sizes[i], 4));
        put(&f, &b);
    }
    done(&f);
    /* The list: below 256 MiB 1 division (none), 256-512 MiB 2, above 8. */
    f = make(0, PYTORCH ",roundup_power2_divisions:[256:1,512:2,>:8]");
    ndm__block b = get(&f, 100 * MiB + 1);
    assert_int_equal(b.size, 100 * MiB + 512);
    put(&f, &b);
    b = get(&f, 300 * MiB);
    assert_int_equal(b.size, reference_round(300 * MiB, 2));
    assert_int_equal(b.size, 384 * MiB);
    put(&f, &b);
    b = get(&f, 600 * MiB);
    assert_int_equal(b.size, reference_round(600 * MiB, 8));
    put(&f, &b);
    char buf[256];
    ndm__settings s;
    ndm__pool_settings(f.pool, &s, NULL, 0);
    ndm__settings_str(&s, buf, sizeof buf);
    assert_non_null(strstr(buf, "roundup_power2_divisions:[256:1,512:2,>:8]"));
    done(&f);
}

/* ---- the compact policy (the CPU default) ---------------------------------------------- */

static void test_alloc_compact_segments_fit_the_request(void **state)
{
    (void)state;
    struct {
        size_t req, segment;
    } cases[] = {
        {100, 2 * MiB},          {MiB, 2 * MiB},           {MiB + 1, 2 * MiB},
        {3 * MiB, 3 * MiB},      {3 * MiB + 1, 3 * MiB + 512 * KiB},
        {9 * MiB, 9 * MiB},      {11 * MiB + 1, 11 * MiB + 512 * KiB},
        {41 * MiB, 41 * MiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture f = make(0, NULL);
        ndm__block b = get(&f, cases[i].req);
        assert_int_equal(ndm__sim_mapped(f.sim), cases[i].segment);
        assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 1);
        put(&f, &b);
        check_oracle(&f);
        done(&f);
    }
    /* segment_round_kb and large_segment_size_mb still apply */
    fixture f = make(0, "segment_round_kb:1024,large_segment_size_mb:4");
    ndm__block a = get(&f, 3 * MiB), b = get(&f, 5 * MiB + 1);
    assert_int_equal(ndm__sim_mapped(f.sim), 4 * MiB + 6 * MiB);
    put(&f, &a);
    put(&f, &b);
    done(&f);
}

static void test_alloc_compact_returns_free_segments_before_growing(void **state)
{
    (void)state;
    /* Whole free segments of both pools go back when a request needs a new
     * one; a segment still in use stays. (A small block freed into a thread
     * cache keeps its segment in use, so the cache is off here.) */
    fixture f = make(0, "thread_cache:False");
    ndm__block s = get(&f, 4 * KiB), a = get(&f, 4 * MiB), keep = get(&f, 3 * MiB);
    put(&f, &s);
    put(&f, &a);
    assert_int_equal(ndm__sim_mapped(f.sim), 2 * MiB + 4 * MiB + 3 * MiB);
    ndm__block c = get(&f, 6 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 3 * MiB + 6 * MiB);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_device_free, 2);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].peak, (int64_t)(9 * MiB));
    check_oracle(&f);
    /* a request that a free block serves maps and unmaps nothing */
    uintptr_t at = (uintptr_t)c.ptr;
    put(&f, &c);
    ndm__block d = get(&f, 5 * MiB);
    assert_int_equal((uintptr_t)d.ptr, at);
    assert_int_equal(stats(&f).num_device_free, 2);
    assert_int_equal(ndm__sim_maps(f.sim), 4);
    put(&f, &d);
    put(&f, &keep);
    check_oracle(&f);
    done(&f);

    /* PyTorch's policy keeps them */
    f = make(0, PYTORCH ",thread_cache:False,large_segment_size_mb:2,segment_round_kb:512");
    s = get(&f, 4 * KiB);
    a = get(&f, 4 * MiB);
    put(&f, &s);
    put(&f, &a);
    c = get(&f, 6 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 2 * MiB + 4 * MiB + 6 * MiB);
    assert_int_equal(stats(&f).num_device_free, 0);
    put(&f, &c);
    done(&f);
}

static void test_alloc_compact_does_not_carve_a_much_larger_free_segment(void **state)
{
    (void)state;
    fixture f = make(0, NULL);
    ndm__block big = get(&f, 16 * MiB);
    put(&f, &big);
    /* 8 MiB: half the free segment, which goes back for an 8 MiB one */
    ndm__block a = get(&f, 8 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 8 * MiB);
    assert_int_equal(a.size, 8 * MiB);
    uintptr_t at = (uintptr_t)a.ptr;
    put(&f, &a);
    /* 5 MiB: more than half of the 8 MiB segment, which is split */
    ndm__block b = get(&f, 5 * MiB);
    assert_int_equal((uintptr_t)b.ptr, at);
    assert_int_equal(ndm__sim_mapped(f.sim), 8 * MiB);
    oracle o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_LARGE], 1);
    /* a free piece of a segment in use is carved as before */
    ndm__block c = get(&f, 2 * MiB);
    assert_int_equal((uintptr_t)c.ptr, (uintptr_t)b.ptr + 5 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 2);
    put(&f, &b);
    put(&f, &c);
    check_oracle(&f);
    done(&f);

    /* Without segment_refit the free segment is carved, as PyTorch does. */
    f = make(0, "segment_refit:False");
    big = get(&f, 16 * MiB);
    at = (uintptr_t)big.ptr;
    put(&f, &big);
    a = get(&f, 8 * MiB);
    assert_int_equal((uintptr_t)a.ptr, at);
    assert_int_equal(ndm__sim_mapped(f.sim), 16 * MiB);
    put(&f, &a);
    done(&f);

    /* Under a limit the swap still fits: the large segment goes first. */
    f = make(0, "memory_limit_mb:16");
    big = get(&f, 16 * MiB);
    put(&f, &big);
    a = get(&f, 4 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 4 * MiB);
    ndm__block x = get(&f, 12 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 16 * MiB);
    put(&f, &a);
    put(&f, &x);
    check_oracle(&f);
    done(&f);
}

/* Rounds of the mix of 8 sizes (rotated by one each round when `rotate`),
 * freed in a scrambled order; at round `at` it notes the bytes mapped, the
 * maps made and the peak reserved. */
typedef struct mix_mark {
    size_t mapped;
    uint64_t maps;
    int64_t peak;
} mix_mark;

static mix_mark mix_rounds(fixture *f, const size_t mix[8], bool rotate, int rounds, int at)
{
    ndm__block b[8];
    mix_mark m = {0, 0, 0};
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < 8; i++)
            b[i] = get(f, mix[rotate ? (i + round) % 8 : i]);
        for (int i = 0; i < 8; i++)
            put(f, &b[(i * 3 + round) % 8]);
        if (round == at)
            m = (mix_mark){ndm__sim_mapped(f->sim), ndm__sim_maps(f->sim),
                           stats(f).reserved_bytes[NDM_POOL_ALL].peak};
    }
    return m;
}

static const size_t round_mix[8] = {300,      7 * KiB, 900 * KiB,   3 * MiB,
                                    17 * MiB, 2 * KiB, 5 * MiB + 3, 64};

static void test_alloc_compact_no_growth_after_many_rounds(void **state)
{
    (void)state;
    /* A training-like loop: the same sizes every round. After the first
     * round, the segments in place serve everything. */
    fixture f = make(0, NULL);
    mix_mark m = mix_rounds(&f, round_mix, false, 1000, 1);
    assert_int_equal(ndm__sim_mapped(f.sim), m.mapped);
    assert_int_equal(ndm__sim_maps(f.sim), m.maps);
    check_oracle(&f);
    done(&f);

    /* Sizes that rotate every round: segments are remapped, but the peak
     * reached in the first rotation is never passed. */
    f = make(0, NULL);
    m = mix_rounds(&f, round_mix, true, 1000, 15);
    assert_int_equal(stats(&f).reserved_bytes[NDM_POOL_ALL].peak, m.peak);
    assert_true(ndm__sim_mapped(f.sim) <= (size_t)m.peak);
    check_oracle(&f);
    done(&f);
}

/* ---- statistics ----------------------------------------------------------------------- */

static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    switch (r % 8) {
    case 0: return (size_t)(r >> 8) % 600;                 /* tiny */
    case 1: case 2: return (size_t)(r >> 8) % (64 * KiB);
    case 3: return (size_t)(r >> 8) % MiB + 1;
    case 4: return MiB + (size_t)(r >> 8) % (9 * MiB);     /* 20 MiB segments */
    case 5: return 10 * MiB + (size_t)(r >> 8) % (30 * MiB);
    default: return (size_t)(r >> 8) % (4 * KiB);
    }
}

/* Random allocations and frees; after every step the statistics must match
 * the snapshot and every peak must be the highest value seen so far. */
static void oracle_run(const char *conf, uint64_t seed, int steps, int check_every)
{
    fixture f = make(0, conf);
    uint64_t rng = seed;
    ndm__block live[200];
    int n = 0;
    oracle hi;
    memset(&hi, 0, sizeof hi);
    for (int step = 0; step < steps; step++) {
        uint64_t r = rng_next(&rng);
        if (n < 200 && (n == 0 || r % 100 < 55)) {
            live[n++] = get(&f, random_size(&rng));
        } else if (n) {
            int i = (int)(rng_next(&rng) % (uint64_t)n);
            put(&f, &live[i]);
            live[i] = live[--n];
        }
        if (r % 97 == 0)
            ndm__pool_empty_cache(f.pool);
        if (step % check_every)
            continue;
        oracle o = check_oracle(&f);
        ndm_memory_stats st = stats(&f);
        for (int k = 0; k < 3; k++) {
#define HI(x) hi.x[k] = hi.x[k] > o.x[k] ? hi.x[k] : o.x[k]
            HI(allocation);
            HI(allocated);
            HI(requested);
            HI(reserved);
#undef HI
            if (check_every == 1) {
                /* every step observed: each peak is exactly the highest value */
                assert_int_equal(st.allocated_bytes[k].peak, hi.allocated[k]);
                assert_int_equal(st.allocation[k].peak, hi.allocation[k]);
                assert_int_equal(st.requested_bytes[k].peak, hi.requested[k]);
                assert_int_equal(st.reserved_bytes[k].peak, hi.reserved[k]);
            } else {
                assert_true(st.allocated_bytes[k].peak >= hi.allocated[k]);
            }
        }
        if (step == steps / 2) {
            ndm__pool_reset_peaks(f.pool);
            memset(&hi, 0, sizeof hi);
            hi = check_oracle(&f);
        }
    }
    while (n)
        put(&f, &live[--n]);
    check_oracle(&f);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.requested_bytes[NDM_POOL_ALL].current, 0);
    ndm__pool_empty_cache(f.pool);
    check_oracle(&f);
    assert_int_equal(ndm__sim_mapped(f.sim), 0);
    done(&f);
}

static void test_alloc_stats_match_snapshot_every_step(void **state)
{
    (void)state;
    oracle_run(NULL, 0x9e3779b97f4a7c15ull, 3000, 1); /* the CPU default: compact */
    oracle_run(PYTORCH, 0x9e3779b97f4a7c15ull, 3000, 1);
    oracle_run(PYTORCH ",max_split_size_mb:24,roundup_power2_divisions:[64:2,>:4]", 12345, 2000,
               1);
    oracle_run("max_split_size_mb:24,roundup_power2_divisions:[64:2,>:4]", 12345, 2000, 1);
    oracle_run("thread_cache:False", 777, 2000, 1);
    oracle_run(PYTORCH ",thread_cache:False", 777, 2000, 1);
    oracle_run("strategy:system", 4242, 1500, 1);
}

static void test_alloc_stats_exact_while_thread_cache_runs(void **state)
{
    (void)state;
    /* Checked only every 50 steps so the thread cache serves the steps in
     * between on its fast path; peaks cannot be rebuilt then, only bounded. */
    oracle_run(NULL, 99, 20000, 50);
}

static void test_alloc_peaks_exact_through_thread_cache(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    /* Warm: 8 blocks of 4 KiB allocated then freed into the thread cache. */
    ndm__block b[8];
    for (int i = 0; i < 8; i++)
        b[i] = get(&f, 4 * KiB);
    for (int i = 0; i < 8; i++)
        put(&f, &b[i]);
    ndm__pool_reset_peaks(f.pool);
    /* Up to 3 blocks live, through the fast path, then 5: peaks follow. */
    for (int round = 0; round < 100; round++) {
        for (int i = 0; i < 3; i++)
            b[i] = get(&f, 4 * KiB);
        for (int i = 0; i < 3; i++)
            put(&f, &b[i]);
    }
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, 3 * 4 * KiB);
    assert_int_equal(st.allocation[NDM_POOL_SMALL].peak, 3);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].allocated, (8 + 300) * 4 * KiB);
    for (int i = 0; i < 5; i++)
        b[i] = get(&f, 4 * KiB);
    st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, 5 * 4 * KiB);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 5 * 4 * KiB);
    for (int i = 0; i < 5; i++)
        put(&f, &b[i]);
    st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 0);
    assert_int_equal(st.inactive_split_bytes[NDM_POOL_ALL].current,
                     (int64_t)(2 * MiB)); /* cached pieces plus the rest of the segment */
    check_oracle(&f);
    done(&f);
}

static void test_alloc_thread_cache_gives_back_before_mapping(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    /* Fill one small segment with 8 blocks of 256 KiB, then free them: they
     * wait in this thread's cache, unmerged. */
    ndm__block b[8];
    for (int i = 0; i < 8; i++)
        b[i] = get(&f, 256 * KiB);
    uintptr_t base = (uintptr_t)b[0].ptr;
    for (int i = 0; i < 8; i++)
        put(&f, &b[i]);
    assert_int_equal(ndm__sim_maps(f.sim), 1);
    oracle o = check_oracle(&f);
    assert_int_equal(o.isplit_n[NDM_POOL_SMALL], 8); /* pieces, as cached */
    /* 1 MiB fits once the cached pieces merge: no second segment. */
    ndm__block big = get(&f, MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 1);
    assert_int_equal((uintptr_t)big.ptr, base);
    put(&f, &big);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_reset_accumulated_keeps_current(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    ndm__block a = get(&f, 3 * KiB), b = get(&f, 5 * MiB);
    put(&f, &a);
    ndm__pool_reset_accumulated(f.pool);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].allocated, 0);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].freed, 0);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, (int64_t)(5 * MiB));
    assert_int_equal(st.num_device_alloc, 0);
    put(&f, &b);
    st = stats(&f);
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].freed, (int64_t)(5 * MiB));
    done(&f);
}

/* ---- growth, limits, retries, OOM on a device with a capacity ---------------------------- */

static void test_alloc_no_growth_after_many_rounds(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    mix_mark m = mix_rounds(&f, round_mix, true, 1000, 0);
    assert_int_equal(ndm__sim_mapped(f.sim), m.mapped);
    assert_int_equal(ndm__sim_maps(f.sim), m.maps);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_memory_limit_caps_reserved(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH ",memory_limit_mb:50");
    ndm__block b[3];
    b[0] = get(&f, 20 * MiB);
    b[1] = get(&f, 20 * MiB);
    ndm__block x;
    ndm_clear_error();
    assert_int_equal(ndm__pool_alloc(f.pool, 20 * MiB, NULL, &x), NDM_E_OOM);
    assert_null(x.ptr);
    assert_error_has("limit 50.00 MiB");
    assert_true(stats(&f).reserved_bytes[NDM_POOL_ALL].peak <= (int64_t)(50 * MiB));
    assert_int_equal(stats(&f).num_ooms, 1);
    b[2] = get(&f, 10 * MiB); /* a 10 MiB segment still fits */
    for (int i = 0; i < 3; i++)
        put(&f, &b[i]);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_retry_frees_cached_segments(void **state)
{
    (void)state;
    fixture f = make(60 * MiB, PYTORCH);
    /* Two 20 MiB segments, cached after their blocks are freed. */
    ndm__block a = get(&f, 15 * MiB), b = get(&f, 15 * MiB);
    assert_int_equal(ndm__sim_mapped(f.sim), 32 * MiB); /* 15 MiB rounds to 16 */
    put(&f, &a);
    put(&f, &b);
    /* 40 MiB fits only if the cached segments go back to the device. */
    ndm__block c = get(&f, 40 * MiB);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_alloc_retries, 1);
    assert_int_equal(st.num_sync_all_streams, 1);
    assert_int_equal(st.num_device_free, 2);
    assert_int_equal(ndm__sim_mapped(f.sim), 40 * MiB);
    put(&f, &c);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_oom_message_and_recovery(void **state)
{
    (void)state;
    fixture f = make(48 * MiB, PYTORCH);
    ndm__block a = get(&f, 30 * MiB);
    ndm__block small = get(&f, 100 * KiB);
    ndm__block x;
    ndm_clear_error();
    assert_int_equal(ndm__pool_alloc(f.pool, 30 * MiB, NULL, &x), NDM_E_OOM);
    assert_null(x.cookie);
    assert_error_has("out of memory on sim: tried to allocate 30.00 MiB");
    assert_error_has("allocated");
    assert_error_has("reserved");
    assert_error_has("largest free block 1.90 MiB");
    assert_error_has("limit none");
    assert_error_has("the device has 16.00 MiB free of 48.00 MiB");
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(st.num_alloc_retries, 1);
    check_oracle(&f);
    put(&f, &a);
    x = get(&f, 30 * MiB); /* the same request succeeds now */
    put(&f, &x);
    put(&f, &small);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_max_split_releases_oversize_first(void **state)
{
    (void)state;
    fixture f = make(100 * MiB, PYTORCH ",max_split_size_mb:20");
    ndm__block a = get(&f, 30 * MiB), b = get(&f, 30 * MiB);
    put(&f, &a);
    put(&f, &b);
    /* 60 MiB needs both oversize blocks released; no full flush is needed. */
    ndm__block c = get(&f, 60 * MiB);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.num_device_free, 2);
    assert_int_equal(st.num_sync_all_streams, 0);
    assert_int_equal(st.num_alloc_retries, 0);
    put(&f, &c);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_garbage_collection_frees_old_segments(void **state)
{
    (void)state;
    /* Limit 100 MiB, threshold 0.5: when reserved passes 50 MiB, a miss frees
     * the oldest whole free large segments before mapping. */
    fixture f = make(0, PYTORCH ",memory_limit_mb:100,garbage_collection_threshold:0.5");
    ndm__block b[4];
    for (int i = 0; i < 4; i++)
        b[i] = get(&f, 14 * MiB);
    for (int i = 0; i < 4; i++)
        put(&f, &b[i]);
    assert_int_equal(ndm__sim_mapped(f.sim), 56 * MiB);
    ndm__block c = get(&f, 30 * MiB); /* a miss: garbage collection runs */
    assert_true(ndm__sim_mapped(f.sim) <= 50 * MiB + 30 * MiB);
    assert_true(stats(&f).num_device_free >= 1);
    put(&f, &c);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_preallocate_maps_one_arena(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH ",strategy:preallocate,memory_limit_mb:100,preallocate_fraction:0.5");
    ndm__block a = get(&f, 100), b = get(&f, 5 * MiB), c = get(&f, 20 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 1);
    assert_int_equal(ndm__sim_mapped(f.sim), 50 * MiB);
    assert_int_equal((uintptr_t)b.ptr, (uintptr_t)a.ptr + 512);
    assert_int_equal(stats(&f).segment[NDM_POOL_ALL].current, 1);
    put(&f, &a);
    put(&f, &b);
    put(&f, &c);
    ndm__pool_empty_cache(f.pool); /* the arena stays */
    assert_int_equal(ndm__sim_mapped(f.sim), 50 * MiB);
    /* Past the arena, segments grow on demand within the limit. */
    ndm__block d = get(&f, 45 * MiB), e = get(&f, 30 * MiB);
    assert_int_equal(ndm__sim_maps(f.sim), 2);
    put(&f, &d);
    put(&f, &e);
    check_oracle(&f);
    done(&f);
}

static void test_alloc_system_strategy_reserves_what_is_used(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH ",strategy:system");
    ndm__block a = get(&f, 1000), b = get(&f, 3 * MiB + 5);
    ndm_memory_stats st = stats(&f);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current,
                     st.allocated_bytes[NDM_POOL_ALL].current);
    assert_int_equal(st.segment[NDM_POOL_ALL].current, 2);
    put(&f, &a);
    st = stats(&f);
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].current, 3 * MiB + 512);
    put(&f, &b);
    assert_int_equal(ndm__sim_mapped(f.sim), 0);
    check_oracle(&f);
    done(&f);
}

/* ---- pressure ------------------------------------------------------------------------ */

typedef struct pressure_log {
    int periodic, failed;
    fixture *f;
    ndm__block *hold;
} pressure_log;

static void on_pressure(const ndm_pressure_event *ev, void *ud)
{
    pressure_log *log = ud;
    if (ev->reason == NDM_PRESSURE_PERIODIC)
        log->periodic++;
    else
        log->failed++;
    if (ev->reason == NDM_PRESSURE_FAILED && log->hold && log->hold->cookie)
        put(log->f, log->hold); /* the program lets go of something */
}

static void test_alloc_pressure_runs_periodically_and_on_failure(void **state)
{
    (void)state;
    fixture f = make(64 * MiB, PYTORCH ",pressure_every_mb:10");
    pressure_log log = {0, 0, &f, NULL};
    assert_ok(ndm_on_pressure(on_pressure, &log));
    assert_int_equal(ndm_on_pressure(on_pressure, &log), NDM_ALREADY);
    for (int i = 0; i < 100; i++) { /* 100 x 512 KiB = 50 MiB allocated */
        ndm__block b = get(&f, 512 * KiB);
        put(&f, &b);
    }
    assert_int_equal(log.periodic, 5);
    /* A failed allocation: the callback frees a block, and it succeeds. */
    ndm__block hold = get(&f, 40 * MiB);
    log.hold = &hold;
    ndm__block c = get(&f, 40 * MiB);
    assert_int_equal(log.failed, 1);
    assert_null(hold.cookie);
    assert_true(stats(&f).num_pressure_calls >= 6);
    put(&f, &c);
    assert_ok(ndm_pressure_remove(on_pressure, &log));
    assert_int_equal(ndm_pressure_remove(on_pressure, &log), NDM_ALREADY);
    check_oracle(&f);
    done(&f);
}

/* ---- settings ------------------------------------------------------------------------- */

static void expect_config_error(const char *conf, const char *needle)
{
    ndm__settings s;
    char err[1024] = "";
    if (ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err) != NDM_E_CONFIG)
        fail_msg("'%s' was accepted", conf);
    if (!strstr(err, needle))
        fail_msg("'%s': error \"%s\" lacks \"%s\"", conf, err, needle);
}

static void test_alloc_config_rejects_bad_keys_and_values(void **state)
{
    (void)state;
    expect_config_error("bogus:1", "unknown key 'bogus'");
    expect_config_error("max_split_size_mb:10", "max_split_size_mb must be at least 20");
    expect_config_error("max_split_size_mb:abc", "max_split_size_mb");
    expect_config_error("garbage_collection_threshold:1.5",
                        "garbage_collection_threshold must be in (0, 1)");
    expect_config_error("garbage_collection_threshold:0", "garbage_collection_threshold");
    expect_config_error("preallocate_fraction:0", "preallocate_fraction must be in (0, 1]");
    expect_config_error("strategy:fast", "strategy: 'fast' is not one of");
    expect_config_error("roundup_power2_divisions:3", "roundup_power2_divisions");
    expect_config_error("roundup_power2_divisions:[300:2]", "power of two");
    expect_config_error("roundup_power2_divisions:[512:2,256:4]", "intervals must increase");
    expect_config_error("roundup_power2_divisions:[256:2", "missing ']'");
    expect_config_error("memory_limit_mb", "expected ':' after 'memory_limit_mb'");
    expect_config_error("memory_limit_mb:", "memory_limit_mb: missing value");
    expect_config_error("thread_cache:maybe", "thread_cache: expected True or False");
    expect_config_error("cuda:1:bogus:2", "unknown key 'bogus'"); /* checked, though not ours */
    expect_config_error("strategy:system:x", "expected ','");
    expect_config_error("policy:tight", "policy: 'tight' is not one of pytorch, compact");
    expect_config_error("release_free_segments:2", "release_free_segments: expected True or");
    expect_config_error("segment_refit:yes", "segment_refit: expected True or False");
    expect_config_error("segment_round_kb:4096", "segment_round_kb must be 512, 1024 or 2048");
    expect_config_error("segment_round_kb:768", "segment_round_kb must be 512, 1024 or 2048");
    expect_config_error("large_segment_size_mb:1", "large_segment_size_mb must be at least 2");
    expect_config_error("memory_limit_mb:1",
                        "memory_limit_mb must be 0 (no limit) or at least 2 (got 1): the "
                        "allocator reserves memory in segments of 2 MiB or more");
    expect_config_error("cuda:memory_limit_mb:1", "memory_limit_mb must be 0 (no limit)");
}

/* The unknown-key message lists all 18 keys, and names the key a slip of a
 * few letters (or a key's start) meant; nothing for a word far from all. */
static void test_alloc_config_unknown_key_lists_all_and_suggests(void **state)
{
    (void)state;
    static const char *const keys[] = {
        "strategy", "preallocate_fraction", "memory_limit_mb", "max_split_size_mb",
        "max_non_split_rounding_mb", "large_segment_size_mb", "roundup_power2_divisions",
        "garbage_collection_threshold", "pressure_every_mb", "thread_cache", "policy",
        "release_free_segments", "segment_refit", "segment_round_kb", "expandable_segments",
        "reserved_rate", "allocated_rate", "allocated_reserved_rate",
    };
    char list[1024] = "(known keys: ";
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        strcat(list, keys[k]);
        strcat(list, k + 1 < sizeof keys / sizeof *keys ? ", " : ")");
    }
    expect_config_error("bogus:1", "unknown key 'bogus' ");
    expect_config_error("bogus:1", list);
    expect_config_error("colour:blue", "unknown key 'colour' (known keys: strategy,");
    expect_config_error("stratgey:system", "unknown key 'stratgey' (did you mean 'strategy'?");
    expect_config_error("memory_limit:64", "(did you mean 'memory_limit_mb'?");
    expect_config_error("Thread_Cache:False", "(did you mean 'thread_cache'?");
    expect_config_error("expandable_segment:True", "(did you mean 'expandable_segments'?");
    expect_config_error("max_split_size:64", "(did you mean 'max_split_size_mb'?");
    expect_config_error("garbage_collection:0.5", "(did you mean 'garbage_collection_threshold'?");
    /* a suggestion, and the whole list after it */
    char tail[1100];
    snprintf(tail, sizeof tail, "(did you mean 'strategy'? %s", list + 1);
    expect_config_error("strategi:system", tail);
    /* the limit at one segment, and no limit, are accepted */
    ndm__settings s;
    char err[1024] = "";
    assert_int_equal(ndm__settings_parse("memory_limit_mb:2", NDM_CPU, &s, err, sizeof err), NDM_OK);
    assert_int_equal(s.memory_limit, (size_t)2 << 20);
    assert_int_equal(ndm__settings_parse("memory_limit_mb:0", NDM_CPU, &s, err, sizeof err), NDM_OK);
    assert_int_equal(s.memory_limit, 0);
}

static void test_alloc_config_applies_device_prefixes(void **state)
{
    (void)state;
    ndm__settings s;
    char err[256];
    const char *conf = "memory_limit_mb:100, cuda:memory_limit_mb:200, cuda:1:memory_limit_mb:300,"
                       "cpu:strategy:system, max_split_size_mb:64";
    assert_ok(ndm__settings_parse(conf, NDM_CPU, &s, err, sizeof err));
    assert_int_equal(s.memory_limit, 100 * MiB);
    assert_string_equal(s.policy->name, "system");
    assert_int_equal(s.max_split_size, 64 * MiB);
    assert_ok(ndm__settings_parse(conf, NDM_CUDA(0), &s, err, sizeof err));
    assert_int_equal(s.memory_limit, 200 * MiB);
    assert_string_equal(s.policy->name, "auto_growth");
    assert_ok(ndm__settings_parse(conf, NDM_CUDA(1), &s, err, sizeof err));
    assert_int_equal(s.memory_limit, 300 * MiB);
    /* defaults, and the effective settings printed back */
    assert_ok(ndm__settings_parse("", NDM_CPU, &s, err, sizeof err));
    char buf[512];
    ndm__settings_str(&s, buf, sizeof buf);
    assert_string_equal(buf, "strategy:auto_growth,preallocate_fraction:0.92,memory_limit_mb:0,"
                             "max_split_size_mb:unlimited,max_non_split_rounding_mb:20,"
                             "large_segment_size_mb:2,roundup_power2_divisions:0,"
                             "garbage_collection_threshold:0,pressure_every_mb:0,"
                             "thread_cache:True,release_free_segments:True,"
                             "segment_refit:True,segment_round_kb:512,"
                             "expandable_segments:False,reserved_rate:0.2,allocated_rate:0.8,"
                             "allocated_reserved_rate:0.8");
    /* CUDA keeps PyTorch's segments; policy:pytorch gives them on the CPU */
    const char *pytorch = "strategy:auto_growth,preallocate_fraction:0.92,memory_limit_mb:0,"
                          "max_split_size_mb:unlimited,max_non_split_rounding_mb:20,"
                          "large_segment_size_mb:20,roundup_power2_divisions:0,"
                          "garbage_collection_threshold:0,pressure_every_mb:0,"
                          "thread_cache:True,release_free_segments:False,"
                          "segment_refit:False,segment_round_kb:2048,"
                          "expandable_segments:False,reserved_rate:0.2,allocated_rate:0.8,"
                          "allocated_reserved_rate:0.8";
    assert_ok(ndm__settings_parse("", NDM_CUDA(0), &s, err, sizeof err));
    ndm__settings_str(&s, buf, sizeof buf);
    assert_string_equal(buf, pytorch);
    assert_ok(ndm__settings_parse("policy:pytorch", NDM_CPU, &s, err, sizeof err));
    ndm__settings_str(&s, buf, sizeof buf);
    assert_string_equal(buf, pytorch);
    /* a preset sets its keys where it stands: later items still win */
    assert_ok(ndm__settings_parse("release_free_segments:False,policy:compact,"
                                  "segment_round_kb:1024", NDM_CUDA(0), &s, err, sizeof err));
    assert_true(s.release_free_segments);
    assert_true(s.segment_refit);
    assert_int_equal(s.large_segment_size, 2 * MiB);
    assert_int_equal(s.segment_round, 1024 * KiB);
    assert_ok(ndm__settings_parse("cpu:policy:pytorch,large_segment_size_mb:6", NDM_CPU, &s, err,
                                  sizeof err));
    assert_false(s.release_free_segments);
    assert_false(s.segment_refit);
    assert_int_equal(s.large_segment_size, 6 * MiB);
    assert_int_equal(s.segment_round, 2 * MiB);
}

/* ---- history ---------------------------------------------------------------------------- */

static void test_alloc_history_ring_keeps_the_last_events(void **state)
{
    (void)state;
    fixture f = make(0, PYTORCH);
    ndm__pool_lock(f.pool);
    ndm__hist_enable(f.pool, 5);
    ndm__pool_unlock(f.pool);
    ndm__block a = get(&f, 1000); /* segment_alloc, alloc */
    put(&f, &a);                  /* free_requested, free_completed (no cache: recording) */
    ndm__block b = get(&f, 2000); /* alloc */
    put(&f, &b);
    ndm__pool_empty_cache(f.pool); /* segment_free */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ndm__pool *pools[1] = {f.pool};
    assert_ok(ndm__snapshot_write(m, pools, 1, false));
    fclose(m);
    /* ring of 5: alloc(b), free_requested, free_completed, segment_free, snapshot */
    const char *order[] = {"\"action\": \"alloc\", \"addr\"", "\"free_requested\"",
                           "\"free_completed\"", "\"segment_free\"", "\"snapshot\""};
    const char *at = buf;
    for (int i = 0; i < 5; i++) {
        const char *hit = strstr(at, order[i]);
        if (!hit)
            fail_msg("event %d (%s) missing or out of order in\n%s", i, order[i], buf);
        at = hit + 1;
    }
    assert_null(strstr(buf, "segment_alloc"));
    assert_non_null(strstr(buf, "\"size\": 2000"));
    free(buf);
    done(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_alloc_rounds_to_512_and_picks_pools),
        TEST(test_alloc_segment_sizes_follow_pytorch),
        TEST(test_alloc_best_fit_by_size_then_address),
        TEST(test_alloc_split_rules),
        TEST(test_alloc_oversize_rules_with_max_split),
        TEST(test_alloc_roundup_power2_divisions),
        TEST(test_alloc_compact_segments_fit_the_request),
        TEST(test_alloc_compact_returns_free_segments_before_growing),
        TEST(test_alloc_compact_does_not_carve_a_much_larger_free_segment),
        TEST(test_alloc_compact_no_growth_after_many_rounds),
        TEST(test_alloc_stats_match_snapshot_every_step),
        TEST(test_alloc_stats_exact_while_thread_cache_runs),
        TEST(test_alloc_peaks_exact_through_thread_cache),
        TEST(test_alloc_thread_cache_gives_back_before_mapping),
        TEST(test_alloc_reset_accumulated_keeps_current),
        TEST(test_alloc_no_growth_after_many_rounds),
        TEST(test_alloc_memory_limit_caps_reserved),
        TEST(test_alloc_retry_frees_cached_segments),
        TEST(test_alloc_oom_message_and_recovery),
        TEST(test_alloc_max_split_releases_oversize_first),
        TEST(test_alloc_garbage_collection_frees_old_segments),
        TEST(test_alloc_preallocate_maps_one_arena),
        TEST(test_alloc_system_strategy_reserves_what_is_used),
        TEST(test_alloc_pressure_runs_periodically_and_on_failure),
        TEST(test_alloc_config_rejects_bad_keys_and_values),
        TEST(test_alloc_config_unknown_key_lists_all_and_suggests),
        TEST(test_alloc_config_applies_device_prefixes),
        TEST(test_alloc_history_ring_keeps_the_last_events),
    };
    return cmocka_run_group_tests_name("alloc", tests, NULL, NULL);
}
