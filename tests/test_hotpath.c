/* The hot path's bookkeeping: a storage lives in the record of the array
 * that made it, so that record's slot waits for the storage's last view; a
 * released slot waits for 256 creations; views dying on several threads at
 * once; a close giving borrowed arrays back; a manager's lock biased to the
 * thread that made it, and the tree lock biased to the thread that started
 * ndm, taken by others; the flat elementwise path against the general one.
 * Also run under ThreadSanitizer. */
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"

/* Values of a float array read through the public accessor. */
static void assert_floats(ndm_array a, const float *want, int n)
{
    const float *p = ndm_array_data(a);
    assert_non_null(p);
    assert_int_equal(ndm_array_size(a), n);
    for (int i = 0; i < n; i++)
        if (p[i] != want[i])
            fail_msg("element %d is %g, expected %g", i, (double)p[i], (double)want[i]);
}

/* Make and release `n` small arrays, so that freed slots come round again. */
static void churn(ndm_manager m, int n)
{
    for (int i = 0; i < n; i++) {
        ndm_array t = ndm_empty(m, NDM_U8, NDM_SHAPE(1));
        assert_live(t);
        assert_ok(ndm_array_release(t));
    }
}

/* The stale message of `dead` says whether its slot has been reused. */
static bool slot_reused(ndm_array dead)
{
    ndm_clear_error();
    assert_int_equal(ndm_array_ndim(dead), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    return strstr(ndm_last_error(), "has been reused") != NULL;
}

static int64_t allocated_now(void)
{
    int64_t v = -1;
    assert_ok(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current", &v));
    return v;
}

static void test_storage_home_slot_waits_for_last_view(void **state)
{
    ndm_manager m = ROOT(state);
    int64_t before = allocated_now();
    float src[6] = {1, 2, 3, 4, 5, 6};
    int made = __LINE__; ndm_array base = ndm_from_buffer(m, NDM_F32, src, NDM_SHAPE(6));
    ndm_array tail = ndm_slice(base, 0, 2, 6, 1);
    assert_live(tail);
    int freed = __LINE__; assert_ok(ndm_array_release(base));
    /* Far more creations than the slot cache holds: the base's record still
     * holds the storage the view reads, so its slot is not handed out. */
    churn(m, 20000);
    assert_false(slot_reused(base));
    char want[256];
    snprintf(want, sizeof want,
             "array f32[6] created at test_hotpath.c:%d (%s) was released at "
             "test_hotpath.c:%d (%s)",
             made, __func__, freed, __func__);
    assert_error_has(want);
    assert_floats(tail, (const float[]){3, 4, 5, 6}, 4);
    float *p = ndm_array_data(tail);
    p[0] = 30;
    churn(m, 100);
    assert_floats(tail, (const float[]){30, 4, 5, 6}, 4);
    assert_int_equal(allocated_now(), before + 512);
    /* The last view frees the memory and, with it, the base's slot. */
    assert_ok(ndm_array_release(tail));
    assert_int_equal(allocated_now(), before);
    bool reused = false;
    for (int i = 0; i < 40 && !reused; i++) {
        churn(m, 512);
        reused = slot_reused(base);
    }
    assert_true(reused);
    assert_manager_empty(m);
}

/* Whatever state this thread's slot cache is in, a released array's slot
 * waits for at least 256 other arrays before it is reused. */
static void test_released_slot_waits_for_256_creations(void **state)
{
    ndm_manager m = ROOT(state);
    enum { MAX_HELD = 600, WAIT = 256 };
    ndm_array *held = malloc(MAX_HELD * sizeof *held);
    assert_non_null(held);
    for (int k = 0; k < MAX_HELD; k += 7) {
        /* k arrays kept alive move the cache to another phase */
        for (int i = 0; i < k; i++)
            held[i] = ndm_empty(m, NDM_U8, NDM_SHAPE(1));
        ndm_array dead = ndm_empty(m, NDM_U8, NDM_SHAPE(1));
        assert_ok(ndm_array_release(dead));
        for (int i = 0; i < WAIT; i++) {
            ndm_array t = ndm_empty(m, NDM_U8, NDM_SHAPE(1));
            assert_live(t);
            assert_ok(ndm_array_release(t));
            if (slot_reused(dead))
                fail_msg("with %d arrays held, a released slot came back after %d creations",
                         k, i + 1);
        }
        for (int i = 0; i < k; i++)
            assert_ok(ndm_array_release(held[i]));
    }
    free(held);
    assert_manager_empty(m);
}

static int frees_seen;
static void count_free(void *data, void *ud)
{
    (void)ud;
    free(data);
    frees_seen++;
}

static void test_storage_wrapped_buffer_freed_by_last_view(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager other = ndm_manager_new(m, "other");
    float *buf = malloc(4 * sizeof *buf);
    assert_non_null(buf);
    for (int i = 0; i < 4; i++)
        buf[i] = (float)(i + 1);
    frees_seen = 0;
    ndm_array base = ndm_wrap_buffer(m, NDM_F32, buf, count_free, NULL, NDM_SHAPE(4));
    ndm_array mid = ndm_reshape(base, NDM_SHAPE(2, 2));
    ndm_array last = ndm_alias(mid);
    assert_live(last);
    assert_ok(ndm_attach(last, other));
    assert_ok(ndm_array_release(base));
    assert_ok(ndm_array_release(mid));
    assert_int_equal(frees_seen, 0);
    assert_floats(last, (const float[]){1, 2, 3, 4}, 4);
    /* The charge followed the last view into `other`. */
    ndm_stats st;
    assert_ok(ndm_manager_stats(other, NDM_CPU, 0, &st));
    assert_int_equal(st.live_bytes, 16);
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(other));
    assert_int_equal(frees_seen, 1);
    assert_manager_empty(m);
}

static void test_storage_close_releases_base_before_views(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array base = ndm_full(batch, NDM_F32, 2.0, NDM_SHAPE(8));
    /* Views made after the base are released first by the close (newest
     * first); a view kept elsewhere outlives the close. */
    ndm_array v1 = ndm_slice(base, 0, 0, 4, 1);
    ndm_array kept = ndm_slice(base, 0, 4, 8, 1);
    assert_live(kept);
    assert_ok(ndm_attach(kept, m));
    assert_live(v1);
    assert_ok(ndm_manager_close(batch));
    assert_false(ndm_array_valid(base));
    assert_false(ndm_array_valid(v1));
    assert_floats(kept, (const float[]){2, 2, 2, 2}, 4);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_bytes, 32);
    assert_int_equal(st.live_arrays, 1);
    assert_ok(ndm_array_release(kept));
    assert_manager_empty(m);
}

/* ---- the flat elementwise path against the general one ---------------------------- */

typedef ndm_array (*binary_to_fn)(NDM_SITE_PARAMS, ndm_manager, ndm_array, ndm_array);
typedef ndm_status (*binary_inplace_fn)(NDM_SITE_PARAMS, ndm_array, ndm_array);

static const struct {
    const char *name;
    binary_to_fn to;
    binary_inplace_fn inplace;
} flat_ops[] = {
    {"add", ndm_add_to_at, ndm_add_inplace_at},
    {"sub", ndm_sub_to_at, ndm_sub_inplace_at},
    {"mul", ndm_mul_to_at, ndm_mul_inplace_at},
    {"div", ndm_div_to_at, ndm_div_inplace_at},
    {"pow", ndm_pow_to_at, ndm_pow_inplace_at},
    {"maximum", ndm_maximum_to_at, ndm_maximum_inplace_at},
    {"minimum", ndm_minimum_to_at, ndm_minimum_inplace_at},
};

/* n values of dtype t from a fixed sequence: small, of both signs where the
 * dtype has them, so that no operation overflows a float. */
static ndm_array sequence(ndm_manager m, ndm_dtype t, int64_t n, int seed)
{
    size_t es = ndm_dtype_size(t);
    unsigned char *buf = malloc((size_t)n * es + 1);
    assert_non_null(buf);
    uint32_t x = 2463534242u + (uint32_t)seed;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        int v = (int)(x % 7) - (t == NDM_U8 ? 0 : 3); /* pow stays small: |v| <= 6 */
        if (t == NDM_F32) {
            float f = (float)v + 0.25f;
            memcpy(buf + i * es, &f, es);
        } else if (t == NDM_F64) {
            double d = (double)v - 0.5;
            memcpy(buf + i * es, &d, es);
        } else if (t == NDM_I64) {
            int64_t w = v;
            memcpy(buf + i * es, &w, es);
        } else if (t == NDM_I32) {
            int32_t w = v;
            memcpy(buf + i * es, &w, es);
        } else {
            buf[i] = (unsigned char)v;
        }
    }
    ndm_array a = ndm_from_buffer(m, t, buf, NDM_SHAPE(n));
    free(buf);
    assert_live(a);
    return a;
}

/* The same values as `a`, read through a view with stride 2: the general
 * path (the flat one needs C-contiguous inputs). */
static ndm_array strided_twin(ndm_manager m, ndm_array a)
{
    int64_t n = ndm_array_size(a);
    ndm_array wide = ndm_zeros(m, ndm_array_dtype(a), NDM_SHAPE(2 * n));
    ndm_array even = ndm_slice(wide, 0, 0, 2 * n, 2);
    assert_live(even);
    assert_ok(ndm_copy_into(even, a));
    assert_ok(ndm_array_release(wide));
    return even;
}

static void assert_same_bytes(ndm_array x, ndm_array y, const char *what)
{
    size_t nb = ndm_array_nbytes(x);
    assert_int_equal(nb, ndm_array_nbytes(y));
    unsigned char *p = malloc(nb + 1), *q = malloc(nb + 1);
    assert_non_null(p);
    assert_non_null(q);
    assert_ok(ndm_array_copy_out(x, p, nb));
    assert_ok(ndm_array_copy_out(y, q, nb));
    if (memcmp(p, q, nb) != 0)
        fail_msg("%s: the flat path and the general path disagree", what);
    free(p);
    free(q);
}

static void test_flat_binary_matches_general_path(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dtype types[] = {NDM_U8, NDM_I32, NDM_I64, NDM_F32, NDM_F64};
    /* One element, a few, and more than one thread's share. */
    const int64_t sizes[] = {1, 37, 70001};
    char what[128];
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            ndm_array a = sequence(m, types[ti], sizes[si], 1);
            ndm_array b = sequence(m, types[ti], sizes[si], 2);
            ndm_array b2 = strided_twin(m, b);
            for (size_t oi = 0; oi < sizeof flat_ops / sizeof *flat_ops; oi++) {
                snprintf(what, sizeof what, "%s %s[%lld]", flat_ops[oi].name,
                         ndm_dtype_name(types[ti]), (long long)sizes[si]);
                ndm_array fast = flat_ops[oi].to(NDM_HERE, NDM_OUTPUT_RULE, a, b);
                ndm_array slow = flat_ops[oi].to(NDM_HERE, NDM_OUTPUT_RULE, a, b2);
                assert_live(fast);
                assert_live(slow);
                assert_int_equal(ndm_array_dtype(fast), ndm_array_dtype(slow));
                assert_same_bytes(fast, slow, what);
                /* in place: into a copy of a, from b (flat) and from b2 */
                ndm_array x = ndm_copy(a), y = ndm_copy(a);
                ndm_status sx = flat_ops[oi].inplace(NDM_HERE, x, b);
                ndm_status sy = flat_ops[oi].inplace(NDM_HERE, y, b2);
                assert_int_equal(sx, sy);
                if (sx == NDM_OK)
                    assert_same_bytes(x, y, what);
                /* in place with itself: x op= x reads each element before writing it */
                ndm_array z = ndm_copy(a), zc = ndm_copy(a);
                ndm_array z2 = strided_twin(m, zc);
                sx = flat_ops[oi].inplace(NDM_HERE, z, z);
                sy = flat_ops[oi].inplace(NDM_HERE, zc, z2);
                assert_int_equal(sx, sy);
                if (sx == NDM_OK)
                    assert_same_bytes(z, zc, what);
                ndm_array all[] = {fast, slow, x, y, z, zc, z2};
                for (size_t k = 0; k < sizeof all / sizeof *all; k++)
                    assert_ok(ndm_array_release(all[k]));
            }
            assert_ok(ndm_array_release(a));
            assert_ok(ndm_array_release(b));
            assert_ok(ndm_array_release(b2));
        }
    }
    assert_manager_empty(m);
}

static void test_flat_inplace_overlapping_buffers_read_a_copy(void **state)
{
    ndm_manager m = ROOT(state);
    /* Two arrays over one caller's buffer, the destination one element
     * ahead: written in place front to back, it would read elements it
     * already wrote. Not the flat path, which only takes storages that
     * cannot overlap. */
    enum { N = 100 };
    float *buf = calloc(N + 1, sizeof *buf);
    assert_non_null(buf);
    float want[N];
    for (int i = 0; i <= N; i++)
        buf[i] = (float)(i % 13);
    for (int i = 0; i < N; i++)
        want[i] = buf[i + 1] + buf[i];
    ndm_array x = ndm_wrap_buffer(m, NDM_F32, buf + 1, NULL, NULL, NDM_SHAPE(N));
    ndm_array y = ndm_wrap_buffer(m, NDM_F32, buf, NULL, NULL, NDM_SHAPE(N));
    assert_live(x);
    assert_live(y);
    assert_ok(ndm_add_(x, y));
    for (int i = 0; i < N; i++)
        if (buf[i + 1] != want[i])
            fail_msg("element %d is %g, expected %g", i, (double)buf[i + 1], (double)want[i]);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_array_release(y));
    free(buf);
}

/* The flat case (one dtype, one shape, C-contiguous) keeps every guarantee of
 * the general path: handles checked, the output rule and named managers,
 * closed, capped and limited managers refused with their counts exact, the
 * graph recorded. */
static void test_flat_binary_keeps_the_guarantees(void **state)
{
    ndm_manager m = ROOT(state);
    float ha[16], hb[16], want[16];
    for (int i = 0; i < 16; i++) {
        ha[i] = (float)i;
        hb[i] = 0.5f * (float)i;
        want[i] = ha[i] + hb[i];
    }
    ndm_array a = ndm_from_buffer(m, NDM_F32, ha, NDM_SHAPE(16));
    ndm_array b = ndm_from_buffer(m, NDM_F32, hb, NDM_SHAPE(16));
    assert_live(a);
    assert_live(b);
    ndm_stats st;
    /* the output rule: a's manager, counted exactly */
    ndm_array c = ndm_add(a, b);
    assert_live(c);
    assert_floats(c, want, 16);
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 3);
    assert_int_equal(st.live_bytes, 3 * 64);
    /* stale and forged handles, and the null one */
    ndm_array dead = c;
    assert_ok(ndm_array_release(c));
    assert_true(ndm_add(dead, b).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_true(ndm_add(a, dead).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_status(ndm_add_(dead, b), NDM_E_CLOSED);
    assert_status(ndm_add_(a, dead), NDM_E_CLOSED);
    ndm_array forged = {a.id + (UINT64_C(1) << 40)};
    assert_true(ndm_add(a, forged).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_clear_error();
    assert_true(ndm_add(NDM_NULL_ARRAY, b).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_status(ndm_array_release(dead), NDM_ALREADY);
    assert_status(ndm_array_release(forged), NDM_E_INVALID);
    /* a named manager, then the same one closed */
    ndm_manager out = ndm_manager_new(m, "out");
    c = ndm_add_to(out, a, b);
    assert_live(c);
    assert_floats(c, want, 16);
    assert_ok(ndm_manager_stats(out, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.live_bytes, 64);
    assert_ok(ndm_manager_close(out));
    assert_true(ndm_add_to(out, a, b).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* capped, then limited: refused, nothing counted */
    ndm_manager small = ndm_manager_new(m, "small");
    assert_ok(ndm_manager_cap(small, NDM_CAP_ARRAYS));
    assert_true(ndm_add_to(small, a, b).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_ok(ndm_manager_uncap(small, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_set_limit(small, NDM_CPU, 100));
    c = ndm_add_to(small, a, b);
    assert_live(c);
    assert_true(ndm_add_to(small, a, b).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_ok(ndm_manager_stats(small, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.live_bytes, 64);
    assert_int_equal(st.created, 1);
    assert_ok(ndm_manager_close(small));
    /* recorded while the graph is on: d(sum(a + b))/da is 1 everywhere */
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_array p = ndm_from_buffer(model, NDM_F32, ha, NDM_SHAPE(16));
    assert_live(p);
    assert_ok(ndm_requires_grad(p));
    ndm_manager batch = ndm_manager_new(m, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_array y = ndm_add_to(batch, p, b);
    assert_live(y);
    ndm_array loss = ndm_sum_to(batch, y, false, NDM_ALL_AXES_LIST);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    ndm_array g = ndm_grad_to(batch, p);
    assert_live(g);
    float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f;
    assert_floats(g, ones, 16);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model)); /* p and its gradient */
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_array_release(b));
    assert_manager_empty(m);
}

/* ---- a close that gives borrowed arrays back in the middle of its list ---------- */

static void test_close_gives_back_between_its_own_arrays(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager lender = ndm_manager_new(root, "lender");
    ndm_manager gone = ndm_manager_new(root, "gone");
    ndm_manager step = ndm_manager_new(root, "step");
    ndm_array first = ndm_zeros(step, NDM_F32, NDM_SHAPE(4));
    ndm_array w = ndm_ones(lender, NDM_F32, NDM_SHAPE(8));
    ndm_array orphan = ndm_ones(gone, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_temp_attach(w, step));
    ndm_array middle = ndm_zeros(step, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_temp_attach(orphan, step));
    ndm_array last = ndm_zeros(step, NDM_F32, NDM_SHAPE(5));
    assert_ok(ndm_manager_close(gone)); /* orphan's lender goes first */
    ndm_stats st;
    assert_ok(ndm_manager_stats(step, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 5);
    assert_int_equal(st.live_bytes, 4 * (4 + 8 + 2 + 3 + 5));
    /* newest first: last, orphan (released: its lender is gone), middle, w
     * (back to its lender), first */
    assert_ok(ndm_manager_close(step));
    assert_false(ndm_array_valid(first));
    assert_false(ndm_array_valid(middle));
    assert_false(ndm_array_valid(last));
    assert_false(ndm_array_valid(orphan));
    assert_true(ndm_array_valid(w));
    assert_int_equal(ndm_array_manager(w).id, lender.id);
    assert_ok(ndm_manager_stats(lender, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.live_bytes, 32);
    assert_int_equal(st.moved_in, 1);
    float v[8];
    assert_ok(ndm_array_copy_out(w, v, sizeof v));
    for (int i = 0; i < 8; i++)
        assert_true(v[i] == 1.0f);
    assert_ok(ndm_manager_close(lender));
    assert_manager_empty(root);
}

/* ---- views dying on two threads at once ------------------------------------------ */

#define ROUNDS 2000
#define VIEWS 3

typedef struct racer {
    pthread_barrier_t *go;
    ndm_manager scratch;
    ndm_array *victims; /* ROUNDS x (1 + VIEWS): this thread's share */
    int stride, first, count;
    int errors;
} racer;

static void *release_share(void *p)
{
    racer *r = p;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(r->go);
        for (int k = 0; k < r->count; k++) {
            ndm_array a = r->victims[round * r->stride + r->first + k];
            float *d = ndm_array_data(a);
            if (!d || d[0] != (float)round || ndm_array_release(a) != NDM_OK)
                r->errors++;
        }
        /* New arrays take the slots just freed, the other thread's dead
         * records among them. */
        for (int k = 0; k < 4; k++) {
            ndm_array t = ndm_full(r->scratch, NDM_F32, -1.0, NDM_SHAPE(4));
            if (!t.id || ndm_array_release(t) != NDM_OK)
                r->errors++;
        }
    }
    return NULL;
}

static void test_storage_views_released_on_two_threads(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager a = ndm_manager_new(m, "a");
    ndm_manager b = ndm_manager_new(m, "b");
    int64_t before = allocated_now();
    ndm_array *v = malloc(sizeof *v * ROUNDS * (1 + VIEWS));
    assert_non_null(v);
    for (int round = 0; round < ROUNDS; round++) {
        ndm_array *row = v + round * (1 + VIEWS);
        row[0] = ndm_full(a, NDM_F32, (double)round, NDM_SHAPE(4));
        for (int k = 1; k <= VIEWS; k++)
            row[k] = ndm_alias_to(k % 2 ? b : a, row[0]);
        for (int k = 0; k <= VIEWS; k++)
            assert_live(row[k]);
    }
    /* One thread releases each base and one view, the other the rest: the
     * base and the last view die on different threads in either order. */
    pthread_barrier_t go;
    assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
    racer r1 = {&go, m, v, 1 + VIEWS, 0, 2, 0};
    racer r2 = {&go, m, v, 1 + VIEWS, 2, VIEWS - 1, 0};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, release_share, &r1), 0);
    assert_int_equal(pthread_create(&t2, NULL, release_share, &r2), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(r1.errors + r2.errors, 0);
    for (int i = 0; i < ROUNDS * (1 + VIEWS); i++)
        assert_false(ndm_array_valid(v[i]));
    free(v);
    assert_int_equal(allocated_now(), before);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
}

/* ---- a manager's lock, biased to its creator, taken by another thread ------------ */

#define LOCK_ROUNDS 200
#define LOCK_ARRAYS 50

typedef struct sharer {
    pthread_barrier_t *go;
    ndm_manager *current; /* the round's manager, set by the creator */
    int errors;
} sharer;

static int make_and_release(ndm_manager m, float value)
{
    int errors = 0;
    ndm_array keep[LOCK_ARRAYS];
    for (int i = 0; i < LOCK_ARRAYS; i++) {
        keep[i] = ndm_full(m, NDM_F32, value, NDM_SHAPE(4));
        if (!keep[i].id)
            errors++;
    }
    for (int i = 0; i < LOCK_ARRAYS; i++) {
        float *d = ndm_array_data(keep[i]);
        if (!d || d[3] != value || ndm_array_release(keep[i]) != NDM_OK)
            errors++;
    }
    return errors;
}

static void *share_rounds(void *p)
{
    sharer *s = p;
    for (int round = 0; round < LOCK_ROUNDS; round++) {
        pthread_barrier_wait(s->go);
        s->errors += make_and_release(*s->current, 2.0f);
        pthread_barrier_wait(s->go);
    }
    return NULL;
}

static void test_manager_lock_taken_from_another_thread(void **state)
{
    ndm_manager root = ROOT(state);
    pthread_barrier_t go;
    assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
    ndm_manager current = NDM_NULL_MANAGER;
    sharer other = {&go, &current, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, share_rounds, &other), 0);
    int errors = 0;
    for (int round = 0; round < LOCK_ROUNDS; round++) {
        /* A fresh manager each round: its creator works in it on the fast
         * path while the other thread's first use takes the bias away. */
        current = ndm_manager_new(root, "shared");
        assert_live(current);
        errors += make_and_release(current, 1.0f) ? 1 : 0;
        pthread_barrier_wait(&go);
        errors += make_and_release(current, 1.0f);
        pthread_barrier_wait(&go);
        ndm_stats st;
        assert_ok(ndm_manager_stats(current, NDM_CPU, 0, &st));
        assert_int_equal(st.created, 3 * LOCK_ARRAYS);
        assert_int_equal(st.released, 3 * LOCK_ARRAYS);
        assert_int_equal(st.live_arrays, 0);
        assert_int_equal(st.live_bytes, 0);
        assert_int_equal(st.peak_bytes >= 16 * LOCK_ARRAYS, true);
        assert_ok(ndm_manager_close(current));
    }
    pthread_join(th, NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(errors + other.errors, 0);
}

/* A manager made on one thread and closed on another, with its arrays. */
static void *close_it(void *p)
{
    ndm_manager *m = p;
    if (ndm_manager_close(*m) != NDM_OK)
        *m = NDM_NULL_MANAGER;
    return NULL;
}

static void test_manager_closed_by_another_thread(void **state)
{
    ndm_manager root = ROOT(state);
    for (int round = 0; round < 20; round++) {
        ndm_manager m = ndm_manager_new(root, "request");
        ndm_array a = ndm_full(m, NDM_F32, 3.0, NDM_SHAPE(8));
        assert_live(a);
        ndm_manager closing = m;
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, close_it, &closing), 0);
        pthread_join(th, NULL);
        assert_int_equal(closing.id, m.id);
        assert_false(ndm_array_valid(a));
        /* The creator still works in its other managers on its fast path. */
        ndm_manager next = ndm_manager_new(root, "next");
        assert_int_equal(make_and_release(next, 4.0f), 0);
        assert_ok(ndm_manager_close(next));
    }
    assert_manager_empty(root);
}

/* ---- the tree lock, biased to the thread that started ndm, taken by another ----- */

#define TREE_ROUNDS 300

typedef struct builder {
    ndm_manager root;
    pthread_barrier_t *go;
    int errors;
} builder;

/* Make a small tree, fill it, close it; false on any failure. */
static bool build_and_close(ndm_manager root, int round)
{
    ndm_manager top = ndm_manager_new(root, "top");
    bool ok = top.id != 0;
    for (int c = 0; ok && c < 4; c++) {
        ndm_manager child = ndm_manager_new(top, "child");
        ok = child.id && ndm_full(child, NDM_I32, (double)round, NDM_SHAPE(2)).id;
    }
    ndm_stats st;
    ok = ok && ndm_manager_stats(top, NDM_CPU, NDM_STATS_SUBTREE, &st) == NDM_OK &&
         st.live_arrays == 4 && st.children == 4;
    return ndm_manager_close(top) == NDM_OK && ok;
}

static void *build_rounds(void *p)
{
    builder *b = p;
    pthread_barrier_wait(b->go);
    for (int round = 0; round < TREE_ROUNDS; round++)
        b->errors += !build_and_close(b->root, round);
    return NULL;
}

/* Storage charges against a model: random creations, views, releases and
 * moves over three managers, with each manager's bytes checked after every
 * step. The charge stays where it is while its manager holds a view, goes to
 * the manager of the newest view left when it holds none, and follows the
 * last view it holds when that moves. Thousands of steps reuse every slot
 * many times, as a home alone, a home with views, a view. */
enum { MODEL_STORAGES = 6, MODEL_VIEWS = 8, MODEL_MGRS = 3 };

typedef struct model_storage {
    int nviews;
    ndm_array view[MODEL_VIEWS]; /* newest first */
    int mgr[MODEL_VIEWS];
    int charged;
    int64_t bytes;
} model_storage;

static uint32_t model_rand(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

static int model_views_in(const model_storage *s, int mgr)
{
    int n = 0;
    for (int i = 0; i < s->nviews; i++)
        n += s->mgr[i] == mgr;
    return n;
}

static void model_check(ndm_manager *mg, model_storage *st)
{
    for (int k = 0; k < MODEL_MGRS; k++) {
        int64_t want = 0;
        for (int i = 0; i < MODEL_STORAGES; i++)
            if (st[i].nviews && st[i].charged == k)
                want += st[i].bytes;
        ndm_stats ms;
        assert_ok(ndm_manager_stats(mg[k], NDM_CPU, 0, &ms));
        if ((int64_t)ms.live_bytes != want)
            fail_msg("manager %d holds %llu bytes, the model %lld", k,
                     (unsigned long long)ms.live_bytes, (long long)want);
    }
    for (int i = 0; i < MODEL_STORAGES; i++) {
        if (!st[i].nviews)
            continue;
        float *p = ndm_array_data(st[i].view[0]);
        assert_non_null(p);
        for (int v = 1; v < st[i].nviews; v++)
            assert_ptr_equal(ndm_array_data(st[i].view[v]), p);
        p[0] = (float)i;
    }
}

static void test_storage_charges_follow_the_model(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager mg[MODEL_MGRS];
    for (int k = 0; k < MODEL_MGRS; k++)
        mg[k] = ndm_manager_new(root, "m");
    model_storage st[MODEL_STORAGES];
    memset(st, 0, sizeof st);
    uint32_t seed = 12345;
    for (int step = 0; step < 6000; step++) {
        model_storage *s = &st[model_rand(&seed) % MODEL_STORAGES];
        int k = (int)(model_rand(&seed) % MODEL_MGRS);
        int op = (int)(model_rand(&seed) % 4);
        if (!s->nviews) {
            int64_t n = 1 + model_rand(&seed) % 40;
            s->view[0] = ndm_empty(mg[k], NDM_F32, NDM_SHAPE(n));
            assert_live(s->view[0]);
            s->mgr[0] = s->charged = k;
            s->bytes = 4 * n;
            s->nviews = 1;
        } else if (op == 0 && s->nviews < MODEL_VIEWS) {
            int v = (int)(model_rand(&seed) % (uint32_t)s->nviews);
            ndm_array a = ndm_alias_to(mg[k], s->view[v]);
            assert_live(a);
            memmove(&s->view[1], &s->view[0], (size_t)s->nviews * sizeof s->view[0]);
            memmove(&s->mgr[1], &s->mgr[0], (size_t)s->nviews * sizeof s->mgr[0]);
            s->view[0] = a;
            s->mgr[0] = k;
            s->nviews++;
        } else if (op == 1) {
            int v = (int)(model_rand(&seed) % (uint32_t)s->nviews);
            int from = s->mgr[v];
            if (from == k)
                continue;
            assert_ok(ndm_attach(s->view[v], mg[k]));
            if (s->charged == from && model_views_in(s, from) == 1)
                s->charged = k;
            s->mgr[v] = k;
        } else {
            int v = (int)(model_rand(&seed) % (uint32_t)s->nviews);
            int from = s->mgr[v];
            assert_ok(ndm_array_release(s->view[v]));
            s->nviews--;
            memmove(&s->view[v], &s->view[v + 1], (size_t)(s->nviews - v) * sizeof s->view[0]);
            memmove(&s->mgr[v], &s->mgr[v + 1], (size_t)(s->nviews - v) * sizeof s->mgr[0]);
            if (s->nviews && s->charged == from && !model_views_in(s, from))
                s->charged = s->mgr[0];
        }
        model_check(mg, st);
    }
    for (int k = 0; k < MODEL_MGRS; k++)
        assert_ok(ndm_manager_close(mg[k]));
    assert_manager_empty(root);
}

/* A handle check is a bound on the slot and a compare of the generation
 * with the handle's upper half, kind bit included: flipping that bit, or
 * pointing past every slot handed out, is refused with its message. */
static void test_handle_check_refuses_other_kinds(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(3));
    assert_live(a);
    ndm_clear_error();
    ndm_array flipped = {a.id | (UINT64_C(1) << 63)};
    assert_int_equal(ndm_array_ndim(flipped), -1);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("not an array handle");
    assert_null(ndm_array_data(flipped));
    assert_false(ndm_array_valid(flipped));
    /* the slot bits of a live manager, read as an array */
    ndm_clear_error();
    ndm_array as_array = {m.id & ~(UINT64_C(1) << 63)};
    assert_int_equal(ndm_array_ndim(as_array), -1);
    assert_true(ndm_last_status() == NDM_E_INVALID || ndm_last_status() == NDM_E_CLOSED);
    /* the same generation one slot past the last one ever made */
    ndm_clear_error();
    ndm_array past = {(a.id & ~UINT64_C(0xffffffff)) | 0x3ffffff0u};
    assert_int_equal(ndm_array_ndim(past), -1);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    /* a manager handle with its kind bit cleared */
    ndm_clear_error();
    ndm_manager plain = {m.id & ~(UINT64_C(1) << 63)};
    assert_status(ndm_manager_close(plain), NDM_E_INVALID);
    assert_true(ndm_manager_new(plain, "x").id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("not a manager handle");
    /* the real ones still work */
    assert_int_equal(ndm_array_ndim(a), 1);
    assert_ok(ndm_array_release(a));
    assert_manager_empty(m);
}

/* First in the suite: the tree lock is still biased to this thread when the
 * other thread starts using it. */
static void test_tree_lock_taken_from_another_thread(void **state)
{
    ndm_manager root = ROOT(state);
    pthread_barrier_t go;
    assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
    builder other = {root, &go, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, build_rounds, &other), 0);
    int errors = 0;
    pthread_barrier_wait(&go);
    for (int round = 0; round < TREE_ROUNDS; round++)
        errors += !build_and_close(root, round);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(errors + other.errors, 0);
    ndm_stats st;
    assert_ok(ndm_manager_stats(root, NDM_CPU, 0, &st));
    assert_int_equal(st.children, 0);
    assert_manager_empty(root);
}

/* ---- close order through removals, moves and compactions ----------------------- */

#define ORDER_MAX 2048

/* Ids of wrapped arrays in the order their storages died. */
static int death_log[ORDER_MAX];
static int deaths;
static float order_buf[1];

static void log_death(void *data, void *ud)
{
    (void)data;
    if (deaths < ORDER_MAX)
        death_log[deaths++] = (int)(intptr_t)ud;
}

/* A model of a manager's arrays in the order they came (a move in comes
 * last): a close must kill them from the end. */
typedef struct order_model {
    int ids[ORDER_MAX];
    ndm_array h[ORDER_MAX]; /* by id */
    int n, next_id;
    uint32_t rng;
} order_model;

static ndm_array order_wrap(order_model *o, ndm_manager m)
{
    int id = o->next_id++;
    o->h[id] = ndm_wrap_buffer(m, NDM_F32, order_buf, log_death, (void *)(intptr_t)id,
                               NDM_SHAPE(1));
    assert_live(o->h[id]);
    return o->h[id];
}

static int order_pick(order_model *o)
{
    o->rng = o->rng * 1103515245u + 12345u;
    return (int)((o->rng >> 8) % (uint32_t)o->n);
}

static void order_drop(order_model *o, int at)
{
    memmove(&o->ids[at], &o->ids[at + 1], (size_t)(o->n - at - 1) * sizeof o->ids[0]);
    o->n--;
}

/* The deaths since `from` are the model's ids from the newest down, but
 * for those marked in `spared` (NULL: none). */
static void assert_deaths_newest_first_but(const order_model *o, int from, const bool *spared)
{
    int k = from;
    for (int j = o->n - 1; j >= 0; j--) {
        if (spared && spared[o->ids[j]])
            continue;
        if (k >= deaths)
            fail_msg("array %d did not die", o->ids[j]);
        if (death_log[k] != o->ids[j])
            fail_msg("death %d is array %d, expected %d", k - from, death_log[k], o->ids[j]);
        k++;
    }
    assert_int_equal(deaths, k);
}

static void assert_deaths_newest_first(const order_model *o, int from)
{
    assert_deaths_newest_first_but(o, from, NULL);
}

static void test_close_order_exact_after_releases_and_moves(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager m = ndm_manager_new(root, "order");
    ndm_manager other = ndm_manager_new(root, "other");
    /* arrays lent to m: those of `stays` go back at m's close, those of
     * `goes` (closed first) die there in their place */
    ndm_manager stays = ndm_manager_new(root, "stays");
    ndm_manager goes = ndm_manager_new(root, "goes");
    static order_model o;
    static bool back[ORDER_MAX];
    memset(&o, 0, sizeof o);
    memset(back, 0, sizeof back);
    o.rng = 7;
    int plain = 0;
    deaths = 0;
    for (int k = 0; k < 900; k++) {
        order_wrap(&o, m);
        o.ids[o.n++] = o.next_id - 1;
        /* plain arrays between them take the close's short path */
        for (int j = 0; j < k % 3; j++, plain++)
            assert_live(ndm_zeros(m, NDM_F32, NDM_SHAPE(4)));
        if (k % 4 != 3 && o.n > 1) {
            /* most go again, in no order: the entries fill with holes and
             * are compacted again and again */
            int at = order_pick(&o);
            int before = deaths;
            assert_ok(ndm_array_release(o.h[o.ids[at]]));
            assert_int_equal(deaths, before + 1);
            order_drop(&o, at);
        }
        if (k % 50 == 49) {
            /* one moves out, one moves in (the newest then) */
            int at = order_pick(&o);
            assert_ok(ndm_attach(o.h[o.ids[at]], other));
            order_drop(&o, at);
            ndm_array in = order_wrap(&o, other);
            assert_ok(ndm_attach(in, m));
            o.ids[o.n++] = o.next_id - 1;
        }
        if (k % 30 == 29) {
            bool keep = k % 60 == 59;
            ndm_array lent = order_wrap(&o, keep ? stays : goes);
            assert_ok(ndm_temp_attach(lent, m));
            o.ids[o.n++] = o.next_id - 1;
            back[o.next_id - 1] = keep;
        }
    }
    /* (a released or moved lent array is out of the model already) */
    for (int k = 0; k < o.next_id; k++)
        if (back[k] && (!ndm_array_valid(o.h[k]) || ndm_array_manager(o.h[k]).id != m.id))
            back[k] = false;
    int lent_dead = deaths;
    assert_ok(ndm_manager_close(goes)); /* its lent arrays stay in m */
    assert_int_equal(deaths, lent_dead);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, (uint64_t)(o.n + plain));
    assert_int_equal(st.live_bytes, 4 * o.n + 16 * plain);
    int from = deaths, nback = 0;
    assert_ok(ndm_manager_close(m));
    assert_deaths_newest_first_but(&o, from, back);
    for (int k = 0; k < o.next_id; k++) {
        if (back[k]) {
            assert_true(ndm_array_valid(o.h[k]));
            assert_int_equal(ndm_array_manager(o.h[k]).id, stays.id);
            nback++;
        }
    }
    assert_true(nback > 3);
    assert_ok(ndm_manager_stats(stays, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, (uint64_t)nback);
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(stays));
    assert_manager_empty(root);
}

static void test_release_all_but_keeps_order_for_close(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager m = ndm_manager_new(root, "partial");
    static order_model o;
    memset(&o, 0, sizeof o);
    o.rng = 11;
    deaths = 0;
    for (int k = 0; k < 300; k++) {
        order_wrap(&o, m);
        o.ids[o.n++] = o.next_id - 1;
        assert_live(ndm_ones(m, NDM_F32, NDM_SHAPE(2)));
    }
    /* keep every seventh wrapped array; the rest die newest first */
    ndm_array keep[64];
    static order_model kept, gone;
    memset(&kept, 0, sizeof kept);
    memset(&gone, 0, sizeof gone);
    size_t nkeep = 0;
    for (int k = 0; k < o.n; k++) {
        if (k % 7 == 0 && nkeep < 64) {
            keep[nkeep++] = o.h[o.ids[k]];
            kept.ids[kept.n++] = o.ids[k];
        } else {
            gone.ids[gone.n++] = o.ids[k];
        }
    }
    assert_ok(ndm_scope_release_all_but(m, nkeep, keep));
    assert_deaths_newest_first(&gone, 0);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, nkeep);
    /* new arrays come after the kept ones, and die before them */
    for (int k = 0; k < 100; k++) {
        order_wrap(&o, m);
        kept.ids[kept.n++] = o.next_id - 1;
    }
    int from = deaths;
    assert_ok(ndm_manager_close(m));
    assert_deaths_newest_first(&kept, from);
    assert_manager_empty(root);
}

/* ---- a manager slot's counts when it is taken again ------------------------------ */

static void assert_counts_zero(ndm_manager m)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.peak_bytes, 0);
    assert_int_equal(st.live_arrays, 0);
}

static void test_manager_counts_start_at_zero_on_reused_slots(void **state)
{
    ndm_manager root = ROOT(state);
    for (int k = 0; k < 300; k++) {
        ndm_manager a = ndm_manager_new(root, "a");
        ndm_manager b = ndm_manager_new(root, "b");
        assert_counts_zero(a);
        assert_counts_zero(b);
        /* a's charge moves to b when a's last view dies (b's inbox), then
         * b gives it back when its own view dies: b ends with bytes and an
         * inbox that cancel, and a peak */
        ndm_array base = ndm_zeros(a, NDM_F32, NDM_SHAPE(4 + k % 5));
        ndm_array v = ndm_alias(base);
        assert_ok(ndm_attach(v, b));
        assert_live(ndm_ones(b, NDM_F32, NDM_SHAPE(3)));
        assert_ok(ndm_array_release(base));
        ndm_stats st;
        assert_ok(ndm_manager_stats(b, NDM_CPU, 0, &st));
        assert_int_equal(st.live_bytes, 4 * (4 + k % 5) + 12);
        assert_ok(ndm_manager_stats(a, NDM_CPU, 0, &st));
        assert_int_equal(st.live_bytes, 0);
        assert_int_equal(st.peak_bytes, 4 * (4 + k % 5));
        if (k % 2)
            assert_ok(ndm_array_release(v));
        assert_ok(ndm_manager_close(b));
        assert_ok(ndm_manager_close(a));
    }
    assert_manager_empty(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_tree_lock_taken_from_another_thread),
        TEST(test_storage_home_slot_waits_for_last_view),
        TEST(test_released_slot_waits_for_256_creations),
        TEST(test_storage_wrapped_buffer_freed_by_last_view),
        TEST(test_storage_close_releases_base_before_views),
        TEST(test_storage_views_released_on_two_threads),
        TEST(test_manager_lock_taken_from_another_thread),
        TEST(test_manager_closed_by_another_thread),
        TEST(test_close_gives_back_between_its_own_arrays),
        TEST(test_flat_binary_matches_general_path),
        TEST(test_flat_inplace_overlapping_buffers_read_a_copy),
        TEST(test_flat_binary_keeps_the_guarantees),
        TEST(test_handle_check_refuses_other_kinds),
        TEST(test_storage_charges_follow_the_model),
        TEST(test_close_order_exact_after_releases_and_moves),
        TEST(test_release_all_but_keeps_order_for_close),
        TEST(test_manager_counts_start_at_zero_on_reused_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
