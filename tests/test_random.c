/* Random numbers: Philox known answers, the documented stream formulas
 * recomputed here, reproducibility across thread counts and layouts, the
 * generator's offset, fixed-seed statistics, errors, reference vs fast. */
#include <math.h>
#include <stdlib.h>

#include "helpers.h"

#include "backends/backend.h"
#include "backends/cpu/parallel.h"
#include "backends/random.h"

#define release(a) assert_ok(ndm_array_release(a))

/* ---- Philox and the stream, written again here ----------------------------------- */

static void philox_here(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t a = (uint64_t)0xD2511F53u * x[0], b = (uint64_t)0xCD9E8D57u * x[2];
        uint32_t y[4] = {(uint32_t)(b >> 32) ^ x[1] ^ k0, (uint32_t)b,
                         (uint32_t)(a >> 32) ^ x[3] ^ k1, (uint32_t)a};
        memcpy(x, y, sizeof x);
    }
    memcpy(out, x, sizeof x);
}

/* Word j of the stream (seed, stream, offset), as ndm/random.h defines it. */
static uint32_t word(ndm_rng g, uint64_t j)
{
    uint64_t c = g.offset + j / 4;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)g.stream,
                       (uint32_t)(g.stream >> 32)};
    uint32_t key[2] = {(uint32_t)g.seed, (uint32_t)(g.seed >> 32)}, out[4];
    philox_here(ctr, key, out);
    return out[j % 4];
}

static uint64_t bits64(ndm_rng g, uint64_t j)
{
    return word(g, j) | (uint64_t)word(g, j + 1) << 32;
}

static uint64_t mulhi(uint64_t a, uint64_t b)
{
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* The values of a in C order as doubles (caller frees). */
static double *vals(ndm_array a)
{
    int64_t n = ndm_array_size(a);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    size_t es = ndm_dtype_size(ndm_array_dtype(a));
    unsigned char *buf = malloc((size_t)(n ? n : 1) * es);
    assert_ok(ndm_array_copy_out(a, buf, (size_t)n * es));
    for (int64_t i = 0; i < n; i++) {
        const void *p = buf + (size_t)i * es;
        switch (ndm_array_dtype(a)) {
        case NDM_BOOL:
        case NDM_U8: v[i] = *(const uint8_t *)p; break;
        case NDM_I32: v[i] = *(const int32_t *)p; break;
        case NDM_I64: v[i] = (double)*(const int64_t *)p; break;
        case NDM_F16: v[i] = ndm_f16_to_f32(*(const uint16_t *)p); break;
        case NDM_BF16: v[i] = ndm_bf16_to_f32(*(const uint16_t *)p); break;
        case NDM_F32: v[i] = *(const float *)p; break;
        case NDM_F64: v[i] = *(const double *)p; break;
        }
    }
    free(buf);
    return v;
}

static void *bytes(ndm_array a)
{
    size_t n = ndm_array_nbytes(a);
    void *p = malloc(n ? n : 1);
    assert_ok(ndm_array_copy_out(a, p, n));
    return p;
}

/* ---- known answers and formulas --------------------------------------------------- */

static void test_random_philox_known_answers(void **state)
{
    (void)state;
    /* Random123's kat_vectors for philox4x32_10 */
    const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                 {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                 {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int i = 0; i < 3; i++) {
        uint32_t a[4], b[4] = {ctr[i][0], ctr[i][1], ctr[i][2], ctr[i][3]};
        philox_here(ctr[i], key[i], a);
        ndm__philox(b, key[i][0], key[i][1]);
        assert_memory_equal(a, want[i], sizeof a);
        assert_memory_equal(b, want[i], sizeof b);
    }
}

static void test_random_values_follow_the_documented_stream(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_rng g = {.seed = 0x0123456789abcdefu, .stream = 7, .offset = 1000};
    ndm_rng r = g;
    ndm_array u = ndm_uniform(m, &r, NDM_F32, -2.0, 3.0, NDM_SHAPE(37));
    double *v = vals(u);
    for (uint64_t i = 0; i < 37; i++) {
        float want = (float)(-2.0 + 5.0 * ((double)(word(g, i) >> 8) * 0x1p-24));
        assert_true(v[i] == want);
    }
    free(v);
    assert_true(r.offset == g.offset + 10 && r.seed == g.seed && r.stream == g.stream);

    g = r;
    ndm_array d = ndm_uniform(m, &r, NDM_F64, 0.0, 1.0, NDM_SHAPE(9));
    v = vals(d);
    for (uint64_t i = 0; i < 9; i++)
        assert_true(v[i] == (double)(bits64(g, 2 * i) >> 11) * 0x1p-53);
    free(v);
    assert_true(r.offset == g.offset + 5);

    g = r;
    ndm_array k = ndm_randint(m, &r, NDM_I64, -5, 1000000, NDM_SHAPE(11));
    v = vals(k);
    for (uint64_t i = 0; i < 11; i++)
        assert_true(v[i] == (double)(-5 + (int64_t)mulhi(bits64(g, 2 * i), 1000005)));
    free(v);

    /* a range above 2^32 reads 128 bits per value */
    g = r;
    int64_t lo = INT64_MIN / 2, hi = INT64_MAX / 2;
    ndm_array big = ndm_randint(m, &r, NDM_I64, lo, hi, NDM_SHAPE(5));
    int64_t got[5];
    assert_ok(ndm_array_copy_out(big, got, sizeof got));
    for (uint64_t i = 0; i < 5; i++) {
        unsigned __int128 x = (unsigned __int128)bits64(g, 4 * i + 2) << 64 | bits64(g, 4 * i);
        uint64_t range = (uint64_t)hi - (uint64_t)lo;
        /* floor(x * range / 2^128) from the two 64-bit halves */
        unsigned __int128 hi_part = (unsigned __int128)(uint64_t)(x >> 64) * range;
        unsigned __int128 lo_part = (unsigned __int128)(uint64_t)x * range;
        uint64_t q = (uint64_t)((hi_part + (lo_part >> 64)) >> 64);
        assert_true(got[i] == (int64_t)((uint64_t)lo + q));
    }
    assert_true(r.offset == g.offset + 5);

    g = r;
    ndm_array b = ndm_bernoulli(m, &r, NDM_BOOL, 0.25, NDM_SHAPE(64));
    v = vals(b);
    for (uint64_t i = 0; i < 64; i++)
        assert_true(v[i] == (word(g, i) < 0x40000000u ? 1.0 : 0.0));
    free(v);

    g = r;
    ndm_array z = ndm_normal(m, &r, NDM_F64, 1.0, 2.0, NDM_SHAPE(7));
    v = vals(z);
    for (uint64_t i = 0; i < 7; i++) {
        uint64_t q = i / 2;
        double u1 = (double)((bits64(g, 4 * q) >> 11) + 1) * 0x1p-53;
        double u2 = (double)(bits64(g, 4 * q + 2) >> 11) * 0x1p-53;
        double rr = sqrt(-2 * log(u1)), t = 2 * M_PI * u2;
        double want = 1.0 + 2.0 * rr * (i % 2 ? sin(t) : cos(t));
        if (fabs(v[i] - want) > 1e-12 * (1 + fabs(want)))
            fail_msg("normal element %d is %.17g, expected %.17g", (int)i, v[i], want);
    }
    free(v);
    assert_true(r.offset == g.offset + 4); /* 7 values in 4 pairs of 4 words */

    g = r;
    ndm_array zf = ndm_normal(m, &r, NDM_F32, 0.0, 1.0, NDM_SHAPE(1001));
    v = vals(zf);
    for (uint64_t i = 0; i < 1001; i++) {
        uint64_t q = i / 2;
        double u1 = (double)((word(g, 2 * q) >> 8) + 1) * 0x1p-24;
        double u2 = (double)(word(g, 2 * q + 1) >> 8) * 0x1p-24;
        double rr = sqrt(-2 * log(u1)), t = 2 * M_PI * u2;
        double want = rr * (i % 2 ? sin(t) : cos(t));
        if (fabs(v[i] - want) > 2e-6 * (1 + fabs(want)))
            fail_msg("normal f32 element %d is %.9g, expected %.9g", (int)i, v[i], want);
    }
    free(v);

    g = r;
    ndm_array p = ndm_permutation(m, &r, 1000);
    int64_t perm[1000], mine[1000];
    assert_ok(ndm_array_copy_out(p, perm, sizeof perm));
    for (int64_t i = 0; i < 1000; i++) {
        int64_t j = (int64_t)mulhi(bits64(g, 2 * (uint64_t)i), (uint64_t)i + 1);
        mine[i] = mine[j];
        mine[j] = i;
    }
    assert_memory_equal(perm, mine, sizeof perm);
    assert_true(r.offset == g.offset + 500);
    ndm_array all[] = {u, d, k, big, b, z, zf, p};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(all[i]);
}

/* ---- the generator value ----------------------------------------------------------- */

static void test_random_generator_advances_and_replays(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_rng r = ndm_rng_new(5);
    ndm_rng saved = r;
    ndm_array a = ndm_uniform(m, &r, NDM_F32, 0, 1, NDM_SHAPE(10));
    assert_true(r.offset == ndm_rng_blocks(10, 1));
    ndm_array b = ndm_uniform(m, &r, NDM_F32, 0, 1, NDM_SHAPE(10));
    ndm_array c = ndm_uniform(m, &saved, NDM_F32, 0, 1, NDM_SHAPE(10));
    void *ab = bytes(a), *bb = bytes(b), *cb = bytes(c);
    assert_memory_equal(ab, cb, 40);             /* a copy replays */
    assert_memory_not_equal(ab, bb, 40);         /* the next call is fresh */
    /* other streams and seeds differ */
    ndm_rng s1 = {5, 1, 0}, s2 = ndm_rng_new(6);
    ndm_array d = ndm_uniform(m, &s1, NDM_F32, 0, 1, NDM_SHAPE(10));
    ndm_array e = ndm_uniform(m, &s2, NDM_F32, 0, 1, NDM_SHAPE(10));
    void *db = bytes(d), *eb = bytes(e);
    assert_memory_not_equal(ab, db, 40);
    assert_memory_not_equal(ab, eb, 40);
    /* 0-d takes one block, size 0 none */
    ndm_rng t = ndm_rng_new(1);
    ndm_array s = ndm_normal(m, &t, NDM_F32, 0, 1, NDM_SCALAR);
    assert_true(t.offset == 1);
    ndm_array z = ndm_normal(m, &t, NDM_F32, 0, 1, NDM_SHAPE(3, 0));
    assert_true(t.offset == 1);
    assert_int_equal(ndm_array_size(z), 0);
    free(ab);
    free(bb);
    free(cb);
    free(db);
    free(eb);
    ndm_array all[] = {a, b, c, d, e, s, z};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(all[i]);
}

/* Every distribution, in a fixed order, into a fresh manager-owned array. */
typedef ndm_array (*gen_fn)(ndm_manager m, ndm_rng *r, int64_t n);
static ndm_array g_uniform(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_uniform(m, r, NDM_F32, -1, 1, NDM_SHAPE(n));
}
static ndm_array g_uniform64(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_uniform(m, r, NDM_F64, 0, 10, NDM_SHAPE(n));
}
static ndm_array g_uniform16(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_uniform(m, r, NDM_BF16, 0, 1, NDM_SHAPE(n));
}
static ndm_array g_normal(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_normal(m, r, NDM_F32, 0, 1, NDM_SHAPE(n));
}
static ndm_array g_normal64(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_normal(m, r, NDM_F64, 3, 0.5, NDM_SHAPE(n));
}
static ndm_array g_normal16(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_normal(m, r, NDM_F16, 0, 1, NDM_SHAPE(n));
}
static ndm_array g_randint(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_randint(m, r, NDM_I32, -3, 7, NDM_SHAPE(n));
}
static ndm_array g_randint8(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_randint(m, r, NDM_U8, 0, 256, NDM_SHAPE(n));
}
static ndm_array g_randint_big(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_randint(m, r, NDM_I64, INT64_MIN, INT64_MAX, NDM_SHAPE(n));
}
static ndm_array g_bernoulli(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_bernoulli(m, r, NDM_F16, 0.3, NDM_SHAPE(n));
}
static ndm_array g_permutation(ndm_manager m, ndm_rng *r, int64_t n)
{
    return ndm_permutation(m, r, n);
}

static const struct {
    const char *name;
    gen_fn fn;
    bool exact; /* reference and fast agree bit for bit */
} gens[] = {
    {"uniform f32", g_uniform, true},     {"uniform f64", g_uniform64, true},
    {"uniform bf16", g_uniform16, true},  {"normal f32", g_normal, false},
    {"normal f64", g_normal64, false},    {"normal f16", g_normal16, false},
    {"randint i32", g_randint, true},     {"randint u8", g_randint8, true},
    {"randint i64", g_randint_big, true}, {"bernoulli", g_bernoulli, true},
    {"permutation", g_permutation, true},
};
#define NGENS (sizeof gens / sizeof gens[0])

static void test_random_same_for_every_thread_count(void **state)
{
    ndm_manager m = ROOT(state);
    int threads = ndm__num_threads();
    const int64_t n = 1000003; /* odd: the last normal pair is cut */
    for (size_t k = 0; k < NGENS; k++) {
        ndm_rng r1 = ndm_rng_new(77);
        ndm__set_num_threads(1);
        ndm_array one = gens[k].fn(m, &r1, n);
        void *ob = bytes(one);
        for (int th = 2; th <= 4; th++) {
            ndm_rng r = ndm_rng_new(77);
            ndm__set_num_threads(th);
            ndm_array a = gens[k].fn(m, &r, n);
            ndm__set_num_threads(threads);
            void *ab = bytes(a);
            if (memcmp(ab, ob, ndm_array_nbytes(a)))
                fail_msg("%s differs between 1 and %d threads", gens[k].name, th);
            assert_true(r.offset == r1.offset);
            free(ab);
            release(a);
        }
        ndm__set_num_threads(threads);
        free(ob);
        release(one);
    }
}

static void test_random_counters_carry_on_every_code_path(void **state)
{
    ndm_manager m = ROOT(state);
    /* block counters that cross 2^32 (a carry into the high word) and 2^64 (a wrap) */
    const uint64_t offsets[] = {UINT64_C(0xfffffff0), UINT64_C(0x1fffffffd), UINT64_MAX - 20};
    for (int simd = 0; simd < 2; simd++) {
        ndm__cpu_random_simd(simd);
        for (int k = 0; k < 3; k++) {
            ndm_rng g = {.seed = 0xfeedfacecafebeefu, .stream = UINT64_MAX, .offset = offsets[k]};
            ndm_rng r = g;
            ndm_array u = ndm_uniform(m, &r, NDM_F32, 0, 1, NDM_SHAPE(333));
            double *v = vals(u);
            for (uint64_t i = 0; i < 333; i++)
                if (v[i] != (float)((double)(word(g, i) >> 8) * 0x1p-24))
                    fail_msg("element %d at offset %llx (simd %d)", (int)i,
                             (unsigned long long)offsets[k], simd);
            free(v);
            release(u);
        }
    }
    ndm__cpu_random_simd(true);
}

static void test_random_reference_and_fast_agree(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t n = 100001;
    /* every distribution, with and without the SIMD paths */
    for (int simd = 1; simd >= 0; simd--) {
        ndm__cpu_random_simd(simd);
        for (size_t k = 0; k < NGENS; k++) {
            ndm_rng r1 = ndm_rng_new(123), r2 = r1;
            ndm__cpu_force_reference(true);
            ndm_array want = gens[k].fn(m, &r1, n);
            ndm__cpu_force_reference(false);
            ndm_array got = gens[k].fn(m, &r2, n);
            assert_true(r1.offset == r2.offset);
            if (gens[k].exact) {
                void *wb = bytes(want), *gb = bytes(got);
                if (memcmp(wb, gb, ndm_array_nbytes(want)))
                    fail_msg("%s: fast (simd %d) and reference kernels differ", gens[k].name,
                             simd);
                free(wb);
                free(gb);
            } else {
                /* polynomial log/sin/cos against libm: within the dtype's rounding */
                double tol = ndm_array_dtype(want) == NDM_F64   ? 1e-13
                             : ndm_array_dtype(want) == NDM_F32 ? 2e-6
                                                                : 2e-3;
                double *w = vals(want), *g = vals(got);
                for (int64_t i = 0; i < n; i++)
                    if (fabs(w[i] - g[i]) > tol * (1 + fabs(w[i])))
                        fail_msg("%s element %lld: fast %.17g, reference %.17g", gens[k].name,
                                 (long long)i, g[i], w[i]);
                free(w);
                free(g);
            }
            release(want);
            release(got);
        }
    }
    ndm__cpu_random_simd(true);
}

static void test_random_fills_views_by_logical_position(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array base = ndm_zeros(m, NDM_F32, NDM_SHAPE(40, 60));
    ndm_array t = ndm_transpose(base);                    /* (60, 40) */
    ndm_array h = ndm_slice(t, 1, 1, NDM_END, 2);         /* (60, 20), no single stride */
    ndm_array f = ndm_flip(h, NDM_ALL_AXES);              /* negative strides */
    ndm_array views[] = {t, h, f};
    for (int v = 0; v < 3; v++) {
        int64_t shape[2];
        ndm_array_shape(views[v], shape, 2);
        ndm_rng r = ndm_rng_new(9), c = r;
        assert_ok(ndm_normal_(views[v], &r, 0, 1));
        ndm_array fresh = ndm_normal(m, &c, NDM_F32, 0, 1, 2, shape);
        void *a = bytes(views[v]), *b = bytes(fresh);
        assert_memory_equal(a, b, ndm_array_nbytes(fresh));
        assert_true(r.offset == c.offset);
        free(a);
        free(b);
        release(fresh);
        ndm_rng ri = ndm_rng_new(10), ci = ri;
        ndm_array iv = ndm_zeros(m, NDM_I64, NDM_SHAPE(60, 40));
        ndm_array ivt = ndm_transpose(iv);
        assert_ok(ndm_randint_(ivt, &ri, 0, 100));
        ndm_array ifresh = ndm_randint(m, &ci, NDM_I64, 0, 100, NDM_SHAPE(40, 60));
        a = bytes(ivt);
        b = bytes(ifresh);
        assert_memory_equal(a, b, ndm_array_nbytes(ifresh));
        free(a);
        free(b);
        release(iv);
        release(ivt);
        release(ifresh);
    }
    for (int v = 0; v < 3; v++)
        release(views[v]);
    release(base);
}

/* ---- statistics on a fixed seed (bounds many standard errors wide) ------------------- */

static void moments(const double *v, int64_t n, double *mean, double *var)
{
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++)
        s += v[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++)
        s2 += (v[i] - *mean) * (v[i] - *mean);
    *var = s2 / (double)n;
}

static void test_random_uniform_statistics(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t n = 1000000;
    ndm_rng r = ndm_rng_new(2024);
    ndm_array u = ndm_uniform(m, &r, NDM_F32, 2.0, 4.0, NDM_SHAPE(n));
    double *v = vals(u), mean, var;
    for (int64_t i = 0; i < n; i++)
        assert_true(v[i] >= 2.0 && v[i] < 4.0);
    moments(v, n, &mean, &var);
    assert_true(fabs(mean - 3.0) < 0.004);       /* standard error 0.00058 */
    assert_true(fabs(var - 4.0 / 12) < 0.002);   /* standard error 0.00015 */
    free(v);
    release(u);
    /* f16 in [0, 1): draws within 2^-12 of 1 round up to 1 and are pulled below */
    ndm_array h = ndm_uniform(m, &r, NDM_F16, 0.0, 1.0, NDM_SHAPE(n));
    v = vals(h);
    int64_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(v[i] >= 0.0 && v[i] < 1.0);
        top += v[i] == 1.0 - 0x1p-11;
    }
    assert_true(top > 100);
    free(v);
    release(h);
}

static void test_random_normal_statistics(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t n = 1000000;
    ndm_rng r = ndm_rng_new(99);
    const ndm_dtype types[] = {NDM_F32, NDM_F64};
    for (int k = 0; k < 2; k++) {
        ndm_array z = ndm_normal(m, &r, types[k], -1.0, 3.0, NDM_SHAPE(n));
        double *v = vals(z), mean, var, m4 = 0, tail = 0;
        moments(v, n, &mean, &var);
        for (int64_t i = 0; i < n; i++) {
            double s = (v[i] + 1.0) / 3.0;
            m4 += s * s * s * s;
            tail += fabs(s) > 1.959963985;
        }
        m4 /= (double)n;
        tail /= (double)n;
        assert_true(fabs(mean + 1.0) < 0.015);   /* standard error 0.003 */
        assert_true(fabs(var - 9.0) < 0.07);     /* standard error 0.0127 */
        assert_true(fabs(m4 - 3.0) < 0.05);      /* standard error 0.0098 */
        assert_true(fabs(tail - 0.05) < 0.0015); /* standard error 0.00022 */
        free(v);
        release(z);
    }
    /* std 0 gives the mean */
    ndm_array c = ndm_normal(m, &r, NDM_BF16, 2.5, 0.0, NDM_SHAPE(5));
    double *v = vals(c);
    for (int i = 0; i < 5; i++)
        assert_true(v[i] == 2.5);
    free(v);
    release(c);
}

static void test_random_randint_chi_square(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t n = 1000000;
    ndm_rng r = ndm_rng_new(31337);
    ndm_array k = ndm_randint(m, &r, NDM_I64, -4, 6, NDM_SHAPE(n));
    double *v = vals(k);
    int64_t count[10] = {0};
    for (int64_t i = 0; i < n; i++) {
        assert_true(v[i] >= -4 && v[i] < 6 && v[i] == floor(v[i]));
        count[(int)v[i] + 4]++;
    }
    double chi = 0, e = (double)n / 10;
    for (int b = 0; b < 10; b++)
        chi += ((double)count[b] - e) * ((double)count[b] - e) / e;
    assert_true(chi < 35.0); /* 9 degrees of freedom: P(chi2 > 35) < 1e-4 */
    free(v);
    release(k);
    /* u8 covers 0..255 and the extremes of i32 fit */
    ndm_array b = ndm_randint(m, &r, NDM_U8, 250, 256, NDM_SHAPE(1000));
    v = vals(b);
    bool seen[6] = {false};
    for (int i = 0; i < 1000; i++) {
        assert_true(v[i] >= 250 && v[i] <= 255);
        seen[(int)v[i] - 250] = true;
    }
    for (int i = 0; i < 6; i++)
        assert_true(seen[i]);
    free(v);
    release(b);
    ndm_array w = ndm_randint(m, &r, NDM_I32, INT32_MIN, (int64_t)INT32_MAX + 1, NDM_SHAPE(100));
    assert_live(w);
    release(w);
}

static void test_random_bernoulli_and_permutation(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t n = 1000000;
    ndm_rng r = ndm_rng_new(4);
    ndm_array b = ndm_bernoulli(m, &r, NDM_BOOL, 0.3, NDM_SHAPE(n));
    double *v = vals(b), mean, var;
    moments(v, n, &mean, &var);
    assert_true(fabs(mean - 0.3) < 0.003); /* standard error 0.00046 */
    free(v);
    release(b);
    ndm_array all = ndm_bernoulli(m, &r, NDM_I32, 1.0, NDM_SHAPE(1000));
    ndm_array none = ndm_bernoulli(m, &r, NDM_F64, 0.0, NDM_SHAPE(1000));
    double *va = vals(all), *vn = vals(none);
    for (int i = 0; i < 1000; i++)
        assert_true(va[i] == 1 && vn[i] == 0);
    free(va);
    free(vn);
    release(all);
    release(none);

    const int64_t np = 100000;
    ndm_array p = ndm_permutation(m, &r, np);
    assert_int_equal(ndm_array_dtype(p), NDM_I64);
    int64_t *pv = bytes(p);
    char *seen = calloc((size_t)np, 1);
    int64_t fixed = 0;
    for (int64_t i = 0; i < np; i++) {
        assert_true(pv[i] >= 0 && pv[i] < np && !seen[pv[i]]);
        seen[pv[i]] = 1;
        fixed += pv[i] == i;
    }
    assert_true(fixed < 10); /* fixed points of a random permutation: Poisson(1) */
    free(seen);
    free(pv);
    release(p);
    ndm_array p0 = ndm_permutation(m, &r, 0), p1 = ndm_permutation(m, &r, 1);
    assert_int_equal(ndm_array_size(p0), 0);
    int64_t only;
    assert_ok(ndm_item_i64(p1, &only));
    assert_true(only == 0);
    release(p0);
    release(p1);
}

/* ---- errors and ownership ------------------------------------------------------------- */

/* ---- multinomial ------------------------------------------------------------------ */

/* With replacement, draw i (of a row r) is the first category whose running
 * sum exceeds u * total, u from the 53 high bits of element i's two words:
 * recomputed here from the stream itself. Without replacement, the draws of
 * a row are distinct and never a zero category. Both advance the generator
 * by two words an element, and a copy of it replays the draw. */
static void test_random_multinomial_follows_the_documented_stream(void **state)
{
    ndm_manager m = ROOT(state);
    const double w[2][5] = {{0.5, 0, 1.25, 3, 0.25}, {2, 2, 0, 1, 0.125}};
    ndm_array p = ndm_from_buffer(m, NDM_F64, w, NDM_SHAPE(2, 5));
    ndm_rng r = {2024, 3, 17}, keep = r;
    ndm_array d = ndm_multinomial(p, 9, true, &r);
    assert_live(d);
    assert_int_equal(ndm_array_dtype(d), NDM_I64);
    assert_int_equal(ndm_array_dim(d, 0), 2);
    assert_int_equal(ndm_array_dim(d, 1), 9);
    assert_true(r.seed == keep.seed && r.stream == keep.stream);
    assert_int_equal(r.offset, keep.offset + ndm_rng_blocks(18, 2));
    int64_t got[18];
    assert_ok(ndm_array_copy_out(d, got, sizeof got));
    for (int row = 0; row < 2; row++) {
        double c[5], sum = 0;
        for (int j = 0; j < 5; j++)
            c[j] = sum += w[row][j];
        for (int s = 0; s < 9; s++) {
            uint64_t i = (uint64_t)(row * 9 + s);
            double u = (double)(bits64(keep, 2 * i) >> 11) * 0x1p-53, t = u * c[4];
            int j = 0;
            while (c[j] <= t)
                j++;
            if (got[i] != j)
                fail_msg("draw %d of row %d is %lld, the stream says %d", s, row,
                         (long long)got[i], j);
        }
    }
    /* a copy of the generator replays it; 1-d probs give a 1-d draw */
    ndm_rng again = keep;
    ndm_array d2 = ndm_multinomial(p, 9, true, &again);
    void *a = bytes(d), *b = bytes(d2);
    assert_memory_equal(a, b, sizeof got);
    free(a);
    free(b);
    ndm_array row = ndm_select(p, 0, 1);
    ndm_array one = ndm_multinomial(row, 4, false, &r);
    assert_int_equal(ndm_array_ndim(one), 1);
    assert_int_equal(ndm_array_dim(one, 0), 4);
    int64_t u[4];
    assert_ok(ndm_array_copy_out(one, u, sizeof u));
    /* the four nonzero categories of row 1, each once */
    bool seen[5] = {false};
    for (int k = 0; k < 4; k++) {
        assert_true(u[k] >= 0 && u[k] < 5 && u[k] != 2 && !seen[u[k]]);
        seen[u[k]] = true;
    }
    release(d);
    release(d2);
    release(row);
    release(one);
    release(p);
}

static double chi2(const int64_t *count, const double *prob, int k, double n)
{
    double c = 0;
    for (int j = 0; j < k; j++)
        c += ((double)count[j] - n * prob[j]) * ((double)count[j] - n * prob[j]) / (n * prob[j]);
    return c;
}

/* Fixed seeds, so each check is deterministic: the frequencies of the
 * categories against their probabilities, with replacement and for the
 * first two draws without (the second's law: sum over the first i of
 * p_i p_j / (1 - p_i)). 3 degrees of freedom: P(chi2 > 21.1) < 1e-4. */
static void test_random_multinomial_frequencies(void **state)
{
    ndm_manager m = ROOT(state);
    const double prob[4] = {0.1, 0.2, 0.3, 0.4};
    ndm_array p = ndm_from_buffer(m, NDM_F32, ((float[]){1, 2, 3, 4, 0}), NDM_SHAPE(5));
    ndm_rng r = ndm_rng_new(77);
    const int64_t n = 200000;
    ndm_array d = ndm_multinomial(p, n, true, &r);
    double *v = vals(d);
    int64_t count[5] = {0};
    for (int64_t i = 0; i < n; i++)
        count[(int)v[i]]++;
    assert_int_equal(count[4], 0);
    assert_true(chi2(count, prob, 4, (double)n) < 21.1);
    free(v);
    release(d);
    /* without replacement: 20000 rows of the same weights, 2 draws each */
    const int64_t rows = 20000;
    ndm_manager sc = ndm_scope_begin(m, "rows");
    ndm_array many = ndm_astype(ndm_expand(ndm_unsqueeze(p, 0), NDM_SHAPE(rows, 5)), NDM_F64);
    assert_ok(ndm_scope_end(sc, 1, &many));
    ndm_array w = ndm_multinomial(many, 2, false, &r);
    v = vals(w);
    int64_t first[5] = {0}, second[5] = {0};
    for (int64_t i = 0; i < rows; i++) {
        assert_true(v[2 * i] != v[2 * i + 1]);
        first[(int)v[2 * i]]++;
        second[(int)v[2 * i + 1]]++;
    }
    assert_int_equal(first[4] + second[4], 0);
    double after[4] = {0};
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++)
            if (i != j)
                after[j] += prob[i] * prob[j] / (1 - prob[i]);
    assert_true(chi2(first, prob, 4, (double)rows) < 21.1);
    assert_true(chi2(second, after, 4, (double)rows) < 21.1);
    free(v);
    release(w);
    release(many);
    release(p);
}

static void test_random_multinomial_errors_change_nothing(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array good = ndm_from_buffer(m, NDM_F32, ((float[]){1, 2, 0, 1, 1, 0}), NDM_SHAPE(2, 3));
    ndm_array neg = ndm_from_buffer(m, NDM_F32, ((float[]){1, 2, 0, 1, -1, 0}), NDM_SHAPE(2, 3));
    ndm_array nan = ndm_from_buffer(m, NDM_F64, ((double[]){1, NAN, 0}), NDM_SHAPE(3));
    ndm_array inf = ndm_from_buffer(m, NDM_F64, ((double[]){1, 0, INFINITY}), NDM_SHAPE(3));
    ndm_array zero = ndm_from_buffer(m, NDM_F32, ((float[]){1, 2, 0, 0, 0, 0}), NDM_SHAPE(2, 3));
    ndm_array big = ndm_from_buffer(m, NDM_F64, ((double[]){1e308, 1e308}), NDM_SHAPE(2));
    ndm_array ints = ndm_zeros(m, NDM_I32, NDM_SHAPE(3));
    ndm_array cube = ndm_ones(m, NDM_F32, NDM_SHAPE(2, 2, 2));
    uint64_t live = test_live_arrays(m);
    ndm_rng r = ndm_rng_new(5), keep = r;
    static const struct {
        int which;
        int64_t samples;
        bool repl;
        ndm_status st;
        const char *msg;
    } cases[] = {
        {1, 1, true, NDM_E_INVALID, "entry 1 of row 1 of probs is negative"},
        {2, 1, true, NDM_E_INVALID, "entry 1 of probs is NaN or infinite"},
        {3, 1, true, NDM_E_INVALID, "entry 2 of probs is NaN or infinite"},
        {4, 1, true, NDM_E_INVALID, "row 1 of probs sums to zero"},
        {5, 1, true, NDM_E_INVALID, "the sum of probs overflows"},
        {0, 3, false, NDM_E_INVALID, "row 0 of probs has fewer than 3 nonzero entries"},
        {0, 4, false, NDM_E_INVALID, "cannot draw 4 samples without replacement from 3"},
        {0, 0, true, NDM_E_INVALID, "num_samples must be >= 1"},
        {6, 1, true, NDM_E_DTYPE, "must have a float dtype"},
        {7, 1, true, NDM_E_SHAPE, "must be 1-d (categories) or 2-d"},
    };
    ndm_array ps[] = {good, neg, nan, inf, zero, big, ints, cube};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ndm_clear_error();
        ndm_array d = ndm_multinomial(ps[cases[c].which], cases[c].samples, cases[c].repl, &r);
        assert_true(ndm_array_is_null(d));
        assert_int_equal(ndm_last_status(), cases[c].st);
        assert_error_has(cases[c].msg);
        assert_memory_equal(&r, &keep, sizeof r);
    }
    assert_true(ndm_array_is_null(ndm_multinomial(good, 1, true, NULL)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(test_live_arrays(m), live);
    /* a released probs is named stale */
    ndm_array gone = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    release(gone);
    assert_true(ndm_array_is_null(ndm_multinomial(gone, 1, true, &r)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++)
        release(ps[k]);
}

static void test_random_errors_change_nothing(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_rng r = ndm_rng_new(8), before = r;
    uint64_t live = test_live_arrays(m);
    struct {
        ndm_array got;
        ndm_status st;
        const char *msg;
    } cases[] = {
        {ndm_uniform(m, &r, NDM_F32, 1, 1, NDM_SHAPE(3)), NDM_E_INVALID, "lo < hi"},
        {ndm_uniform(m, &r, NDM_F32, 0, NAN, NDM_SHAPE(3)), NDM_E_INVALID, "finite"},
        {ndm_uniform(m, &r, NDM_F64, -1e308, 1e308, NDM_SHAPE(3)), NDM_E_INVALID, "finite span"},
        {ndm_uniform(m, &r, NDM_I32, 0, 1, NDM_SHAPE(3)), NDM_E_DTYPE, "float dtypes"},
        {ndm_normal(m, &r, NDM_F32, 0, -1, NDM_SHAPE(3)), NDM_E_INVALID, "std >= 0"},
        {ndm_normal(m, &r, NDM_F32, INFINITY, 1, NDM_SHAPE(3)), NDM_E_INVALID, "finite"},
        {ndm_normal(m, &r, NDM_U8, 0, 1, NDM_SHAPE(3)), NDM_E_DTYPE, "float dtypes"},
        {ndm_randint(m, &r, NDM_I32, 5, 5, NDM_SHAPE(3)), NDM_E_INVALID, "lo < hi"},
        {ndm_randint(m, &r, NDM_U8, -1, 5, NDM_SHAPE(3)), NDM_E_INVALID, "does not fit uint8"},
        {ndm_randint(m, &r, NDM_I32, 0, (int64_t)1 << 32, NDM_SHAPE(3)), NDM_E_INVALID, "fit"},
        {ndm_randint(m, &r, NDM_F32, 0, 5, NDM_SHAPE(3)), NDM_E_DTYPE, "u8, i32 or i64"},
        {ndm_bernoulli(m, &r, NDM_BOOL, 1.5, NDM_SHAPE(3)), NDM_E_INVALID, "p in [0, 1]"},
        {ndm_bernoulli(m, &r, NDM_BOOL, -0.1, NDM_SHAPE(3)), NDM_E_INVALID, "p in [0, 1]"},
        {ndm_bernoulli(m, &r, NDM_BOOL, NAN, NDM_SHAPE(3)), NDM_E_INVALID, "p in [0, 1]"},
        {ndm_bernoulli(m, NULL, NDM_BOOL, 0.5, NDM_SHAPE(3)), NDM_E_INVALID, "generator is NULL"},
        {ndm_permutation(m, &r, -1), NDM_E_INVALID, "n must be >= 0"},
        {ndm_uniform(m, &r, NDM_F32, 0, 1, NDM_SHAPE(-1)), NDM_E_SHAPE, "negative size"},
    };
    /* every case failed before allocating or drawing */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_true(ndm_array_is_null(cases[i].got));
    assert_int_equal(test_live_arrays(m), live);
    assert_true(r.offset == before.offset);
    /* and the status and message of each, one at a time */
    assert_true(ndm_array_is_null(ndm_uniform(m, &r, NDM_F32, 1, 1, NDM_SHAPE(3))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("uniform needs lo < hi with a finite span (got lo 1, hi 1)");
    assert_true(ndm_array_is_null(ndm_normal(m, &r, NDM_F32, 0, -1, NDM_SHAPE(3))));
    assert_error_has("normal needs std >= 0 (got -1)");
    assert_true(ndm_array_is_null(ndm_randint(m, &r, NDM_U8, -1, 5, NDM_SHAPE(3))));
    assert_error_has("randint range [-1, 5) does not fit uint8");
    assert_true(ndm_array_is_null(ndm_bernoulli(m, &r, NDM_BOOL, 1.5, NDM_SHAPE(3))));
    assert_error_has("bernoulli needs p in [0, 1] (got 1.5)");
    assert_true(ndm_array_is_null(ndm_randint(m, &r, NDM_F32, 0, 5, NDM_SHAPE(3))));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_true(ndm_array_is_null(ndm_bernoulli(m, NULL, NDM_BOOL, 0.5, NDM_SHAPE(3))));
    assert_error_has("the generator is NULL");

    /* in place: dtype, broadcast views, null and stale handles */
    ndm_array i = ndm_zeros(m, NDM_I64, NDM_SHAPE(4));
    assert_int_equal(ndm_uniform_(i, &r, 0, 1), NDM_E_DTYPE);
    ndm_array row = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    ndm_array bc = ndm_expand(row, NDM_SHAPE(3, 4));
    assert_int_equal(ndm_normal_(bc, &r, 0, 1), NDM_E_INVALID);
    assert_error_has("broadcast view");
    ndm_clear_error();
    assert_int_equal(ndm_bernoulli_(NDM_NULL_ARRAY, &r, 0.5), NDM_E_NULL);
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    release(gone);
    assert_int_equal(ndm_uniform_(gone, &r, 0, 1), NDM_E_CLOSED);
    assert_true(r.offset == before.offset);
    /* a null manager outside any scope */
    ndm_clear_error();
    assert_true(ndm_array_is_null(ndm_uniform(NDM_NULL_MANAGER, &r, NDM_F32, 0, 1, NDM_SHAPE(2))));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_true(r.offset == before.offset);
    release(i);
    release(row);
    release(bc);
}

static void test_random_ownership(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_rng r = ndm_rng_new(1);
    /* NDM_CURRENT_SCOPE inside a scope means the scope */
    ndm_manager s = ndm_scope_begin(m, "init");
    ndm_array a = ndm_normal(NDM_CURRENT_SCOPE, &r, NDM_F32, 0, 1, NDM_SHAPE(3));
    assert_int_equal(ndm_array_manager(a).id, s.id);
    ndm_array p = ndm_permutation(NDM_CURRENT_SCOPE, &r, 4);
    assert_int_equal(ndm_array_manager(p).id, s.id);
    assert_ok(ndm_scope_end(s, 0, NULL));
    /* a capped model refuses new arrays but its weights can be re-initialised */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(8, 8));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_rng before = r;
    assert_true(ndm_array_is_null(ndm_uniform(model, &r, NDM_F32, 0, 1, NDM_SHAPE(2))));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_true(ndm_array_is_null(ndm_permutation(model, &r, 5)));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_true(r.offset == before.offset);
    assert_ok(ndm_uniform_(w, &r, -0.1, 0.1));
    assert_true(r.offset == before.offset + 16);
    double *v = vals(w);
    for (int i = 0; i < 64; i++)
        assert_true(v[i] >= -0.1 && v[i] < 0.1 && v[i] != 0);
    free(v);
    assert_int_equal(test_live_arrays(model), 1);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_close(model));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_random_philox_known_answers),
        TEST(test_random_values_follow_the_documented_stream),
        TEST(test_random_generator_advances_and_replays),
        TEST(test_random_same_for_every_thread_count),
        TEST(test_random_counters_carry_on_every_code_path),
        TEST(test_random_reference_and_fast_agree),
        TEST(test_random_fills_views_by_logical_position),
        TEST(test_random_uniform_statistics),
        TEST(test_random_normal_statistics),
        TEST(test_random_randint_chi_square),
        TEST(test_random_bernoulli_and_permutation),
        TEST(test_random_multinomial_follows_the_documented_stream),
        TEST(test_random_multinomial_frequencies),
        TEST(test_random_multinomial_errors_change_nothing),
        TEST(test_random_errors_change_nothing),
        TEST(test_random_ownership),
    };
    return cmocka_run_group_tests_name("random", tests, NULL, NULL);
}
