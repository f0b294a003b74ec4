/* Out of memory: every constructor that allocates fails cleanly when the
 * allocator refuses (through its failure-injection hook, and for absurd
 * sizes), leaving every manager and counter as it was. */
#include "helpers.h"
#include "manager/alloc/alloc.h"
#include "manager/core.h"

typedef ndm_array (*maker)(ndm_manager m, ndm_array src);

static ndm_array mk_empty(ndm_manager m, ndm_array src)
{
    (void)src;
    return ndm_empty(m, NDM_F32, NDM_SHAPE(8, 8));
}
static ndm_array mk_zeros(ndm_manager m, ndm_array src)
{
    (void)src;
    return ndm_zeros(m, NDM_I64, NDM_SHAPE(3, 3, 3, 3, 3, 3, 3)); /* rank beyond the inline dims */
}
static ndm_array mk_full(ndm_manager m, ndm_array src)
{
    (void)src;
    return ndm_full(m, NDM_BF16, 2.5, NDM_SHAPE(5));
}
static ndm_array mk_arange(ndm_manager m, ndm_array src)
{
    (void)src;
    return ndm_arange(m, NDM_F64, 0, 10, 0.5);
}
static ndm_array mk_linspace(ndm_manager m, ndm_array src)
{
    (void)src;
    return ndm_linspace(m, NDM_F32, -1, 1, 7);
}
static ndm_array mk_from_buffer(ndm_manager m, ndm_array src)
{
    (void)src;
    static const int32_t v[6] = {1, 2, 3, 4, 5, 6};
    return ndm_from_buffer(m, NDM_I32, v, NDM_SHAPE(2, 3));
}
static ndm_array mk_copy(ndm_manager m, ndm_array src)
{
    return ndm_copy_to(m, src);
}
static ndm_array mk_contiguous(ndm_manager m, ndm_array src)
{
    ndm_array t = ndm_transpose_to(m, src);
    ndm_array c = ndm_contiguous_to(m, t); /* a copy: the transpose is not contiguous */
    if (!c.id) {
        ndm_status keep = ndm_last_status();
        (void)!ndm_array_release(t);
        if (keep != NDM_OK && ndm_last_status() == NDM_OK)
            fail_msg("lost the error");
        return c;
    }
    (void)!ndm_array_release(t);
    return c;
}
static ndm_array mk_reshape_copy(ndm_manager m, ndm_array src)
{
    ndm_array t = ndm_transpose_to(m, src);
    ndm_array r = ndm_reshape_to(m, t, NDM_SHAPE(-1)); /* needs a copy */
    (void)!ndm_array_release(t);
    return r;
}

static void test_oom_every_constructor(void **state)
{
    struct {
        const char *name;
        maker fn;
        int views; /* handles made before the allocation (released by the maker) */
    } makers[] = {
        {"empty", mk_empty, 0},       {"zeros", mk_zeros, 0},
        {"full", mk_full, 0},         {"arange", mk_arange, 0},
        {"linspace", mk_linspace, 0}, {"from_buffer", mk_from_buffer, 0},
        {"copy", mk_copy, 0},         {"contiguous", mk_contiguous, 1},
        {"reshape-copy", mk_reshape_copy, 1},
    };
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array src = ndm_arange(m, NDM_F32, 0, 12, 1);
    ndm_array src2 = ndm_reshape(src, NDM_SHAPE(3, 4));
    for (size_t i = 0; i < sizeof makers / sizeof makers[0]; i++) {
        ndm_stats before, after;
        assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &before));
        ndm_clear_error();
        ndm__alloc_fail_after(1);
        ndm_array a = makers[i].fn(m, src2);
        ndm__alloc_fail_after(0);
        if (a.id)
            fail_msg("%s succeeded despite the injected failure", makers[i].name);
        if (ndm_last_status() != NDM_E_OOM)
            fail_msg("%s: %s instead of NDM_E_OOM: %s", makers[i].name,
                     ndm_status_name(ndm_last_status()), ndm_last_error());
        assert_error_has("out of memory");
        assert_error_has("test_oom.c"); /* the caller's site */
        assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &after));
        /* nothing live changed; the only trace is the released views */
        assert_int_equal(after.live_arrays, before.live_arrays);
        assert_int_equal(after.live_bytes, before.live_bytes);
        assert_int_equal(after.created, before.created + (uint64_t)makers[i].views);
        /* the same request succeeds once memory is there again */
        ndm_array ok = makers[i].fn(m, src2);
        if (!ok.id)
            fail_msg("%s failed without injection: %s", makers[i].name, ndm_last_error());
        assert_ok(ndm_array_release(ok));
    }
    assert_ok(ndm_manager_close(m));
}

static void test_oom_absurd_size(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(INT64_C(1) << 48)); /* 1 PiB */
    assert_true(a.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    assert_error_has("tried to allocate 1048576.00 GiB");
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.peak_bytes, 0);
    /* an overflowing element count is caught before any allocation */
    a = ndm_zeros(m, NDM_F64, NDM_SHAPE(INT64_C(1) << 31, INT64_C(1) << 31, 4));
    assert_true(a.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_ok(ndm_manager_close(m));
}

static void test_oom_respects_scope_and_limits(void **state)
{
    /* an injected failure inside a scope leaves the scope consistent */
    ndm_manager s = ndm_scope_begin(ROOT(state), "s");
    ndm_array x = ndm_ones(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(4));
    ndm__alloc_fail_after(2); /* the second allocation from now fails */
    ndm_array y = ndm_copy(x);
    ndm_array z = ndm_copy(x);
    ndm__alloc_fail_after(0);
    assert_live(y);
    assert_true(z.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    ndm_stats st;
    assert_ok(ndm_manager_stats(s, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 2);
    assert_int_equal(st.live_bytes, 32);
    assert_ok(ndm_scope_end(s, 0, NULL));
    /* a failed allocation gives its reservation back to the limit */
    ndm_manager lim = ndm_manager_new(ROOT(state), "lim");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 64));
    ndm__alloc_fail_after(1);
    assert_true(ndm_zeros(lim, NDM_U8, NDM_SHAPE(64)).id == 0);
    ndm__alloc_fail_after(0);
    assert_live(ndm_zeros(lim, NDM_U8, NDM_SHAPE(64)));
    assert_ok(ndm_manager_close(lim));
}

/* Fill m with f32[4] arrays until its array list needs to grow a second time
 * and that growth is refused; returns how many went in. */
static int fill_to_list_edge(ndm_manager m)
{
    ndm__arrays_grow_fail_after(2);
    for (int i = 0; i < 5000; i++) {
        if (!ndm_zeros(m, NDM_F32, NDM_SHAPE(4)).id) {
            ndm__arrays_grow_fail_after(0);
            return i;
        }
    }
    ndm__arrays_grow_fail_after(0);
    fail_msg("the array list never grew in 5000 arrays");
    return -1;
}

static void expect_list_oom(ndm_manager m, int live, const char *what)
{
    if (ndm_last_status() != NDM_E_OOM)
        fail_msg("%s: %s instead of NDM_E_OOM: %s", what, ndm_status_name(ndm_last_status()),
                 ndm_last_error());
    assert_error_has("no memory for the array list of '");
    assert_error_has("m' [at test_oom.c:"); /* the manager and the caller's line */
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, live);
    assert_int_equal(st.live_bytes, 16 * live);
}

/* A manager's list of arrays that cannot grow refuses a creation, a view, a
 * wrapped buffer and a move before anything changes; the allocator gets its
 * block back, and the same calls succeed once the list can grow. */
static void test_oom_array_list_growth(void **state)
{
    ndm_manager other = ndm_manager_new(ROOT(state), "other");
    ndm_array src = ndm_arange(other, NDM_F32, 0, 4, 1);
    ndm_array mover = ndm_ones(other, NDM_F32, NDM_SHAPE(4));
    static float buf[4] = {1, 2, 3, 4};
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    int n = fill_to_list_edge(m);
    assert_true(n >= 64); /* the first growth went through */
    expect_list_oom(m, n, "creation");

    ndm_memory_stats s0, s1;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &s0));
    ndm__arrays_grow_fail_after(1);
    assert_true(ndm_full(m, NDM_F32, 2.0, NDM_SHAPE(4)).id == 0);
    expect_list_oom(m, n, "creation");
    ndm__arrays_grow_fail_after(1);
    assert_true(ndm_reshape_to(m, src, NDM_SHAPE(2, 2)).id == 0);
    expect_list_oom(m, n, "view");
    ndm__arrays_grow_fail_after(1);
    assert_true(ndm_wrap_buffer(m, NDM_F32, buf, NULL, NULL, NDM_SHAPE(4)).id == 0);
    expect_list_oom(m, n, "wrapped buffer");
    ndm__arrays_grow_fail_after(1);
    assert_status(ndm_attach(mover, m), NDM_E_OOM);
    expect_list_oom(m, n, "move");
    assert_ok(ndm_memory_stats_get(NDM_CPU, &s1));
    assert_int_equal(s1.allocated_bytes[NDM_POOL_ALL].current,
                     s0.allocated_bytes[NDM_POOL_ALL].current);
    ndm__arrays_grow_fail_after(0);
    ndm_stats st;
    assert_ok(ndm_manager_stats(other, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 2); /* the refused move left it where it was */
    assert_true(ndm_array_manager(mover).id == other.id);

    /* with room again, each goes in */
    assert_live(ndm_full(m, NDM_F32, 2.0, NDM_SHAPE(4)));
    assert_live(ndm_reshape_to(m, src, NDM_SHAPE(2, 2)));
    assert_live(ndm_wrap_buffer(m, NDM_F32, buf, NULL, NULL, NDM_SHAPE(4)));
    assert_ok(ndm_attach(mover, m));
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, n + 4);
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_manager_close(other));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_oom_every_constructor),
        TEST(test_oom_absurd_size),
        TEST(test_oom_respects_scope_and_limits),
        TEST(test_oom_array_list_growth),
    };
    return cmocka_run_group_tests_name("oom", tests, NULL, NULL);
}
