/* Ownership moves: attach, ret, detach, temp_attach; refused moves change
 * nothing; exact counters; shared storage counted once and its charge moving. */
#include <stdlib.h>

#include "helpers.h"

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, 0, &st) != NDM_OK)
        fail_msg("stats: %s", ndm_last_error());
    return st;
}

static void test_move_attach_steals(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(10));
    assert_ok(ndm_attach(x, b));
    assert_true(ndm_array_manager(x).id == b.id);
    ndm_stats sa = stats_of(a), sb = stats_of(b);
    assert_int_equal(sa.live_arrays, 0);
    assert_int_equal(sa.created, 1);
    assert_int_equal(sa.moved_out, 1);
    assert_int_equal(sa.live_bytes, 0);
    assert_int_equal(sa.peak_bytes, 40);
    assert_int_equal(sb.live_arrays, 1);
    assert_int_equal(sb.moved_in, 1);
    assert_int_equal(sb.created, 0);
    assert_int_equal(sb.live_bytes, 40);
    /* attaching to its own manager is a no-op */
    assert_ok(ndm_attach(x, b));
    assert_int_equal(stats_of(b).moved_in, 1);
    /* the handle is unchanged and closing a frees nothing of it */
    assert_ok(ndm_manager_close(a));
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_manager_close(b));
    assert_false(ndm_array_valid(x));
}

static void test_move_refused_changes_nothing(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager capped = ndm_manager_new(ROOT(state), "capped");
    ndm_manager small = ndm_manager_new(ROOT(state), "small");
    ndm_manager closed = ndm_manager_new(ROOT(state), "closed");
    assert_ok(ndm_manager_close(closed));
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_set_limit(small, NDM_CPU, 16));
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(10));
    int line = __LINE__ - 1;
    ndm_stats before = stats_of(a);
    assert_status(ndm_attach(x, capped), NDM_E_CAPPED);
    char want[64];
    snprintf(want, sizeof want, "test_moves.c:%d", line);
    assert_error_has(want); /* the refused array's creation site */
    assert_status(ndm_attach(x, small), NDM_E_QUOTA);
    assert_status(ndm_attach(x, closed), NDM_E_CLOSED);
    ndm_clear_error(); /* a null handle would keep the error above */
    assert_status(ndm_attach(x, NDM_NULL_MANAGER), NDM_E_NULL);
    assert_status(ndm_temp_attach(x, capped), NDM_E_CAPPED);
    ndm_stats after = stats_of(a);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(stats_of(capped).moved_in, 0);
    assert_int_equal(stats_of(small).live_bytes, 0);
    assert_true(ndm_array_manager(x).id == a.id);
    /* a stale array cannot move */
    ndm_array y = ndm_zeros(a, NDM_F32, NDM_SHAPE(1));
    assert_ok(ndm_array_release(y));
    assert_status(ndm_attach(y, small), NDM_E_CLOSED);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(capped));
    assert_ok(ndm_manager_close(small));
}

static void test_move_ret_to_parent(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array g = ndm_ones(batch, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_ret(g));
    assert_true(ndm_array_manager(g).id == model.id);
    assert_ok(ndm_manager_close(batch));
    assert_true(ndm_array_valid(g));
    /* ret from the test manager reaches system; from system it is refused */
    assert_ok(ndm_ret(g));
    assert_ok(ndm_ret(g));
    assert_true(ndm_array_manager(g).id == ndm_system().id);
    assert_status(ndm_ret(g), NDM_E_ROOT);
    assert_error_has("no parent");
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_manager_close(model));
}

static void test_move_detach_is_counted(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array x = ndm_zeros(m, NDM_F64, NDM_SHAPE(4));
    assert_ok(ndm_detach(x));
    assert_true(ndm_array_manager(x).id == ndm_detached().id);
    ndm_stats d;
    assert_ok(ndm_manager_stats(ndm_detached(), NDM_CPU, 0, &d));
    assert_int_equal(d.live_arrays, 1);
    assert_int_equal(d.live_bytes, 32);
    /* closing the old manager does not free it; the leak report shows it */
    assert_ok(ndm_manager_close(m));
    assert_true(ndm_array_valid(x));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(ndm_leak_report(f), 1);
    fclose(f);
    assert_non_null(strstr(text, "system/detached"));
    assert_non_null(strstr(text, "test_moves.c"));
    free(text);
    /* ret from detached is refused: the caller must release it */
    assert_status(ndm_ret(x), NDM_E_ROOT);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_stats(ndm_detached(), NDM_CPU, 0, &d));
    assert_int_equal(d.live_arrays, 0);
}

static void test_move_temp_attach_returns_on_close(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(8));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_manager step = ndm_manager_new(ROOT(state), "step");
    assert_ok(ndm_temp_attach(w, step));
    assert_true(ndm_array_manager(w).id == step.id);
    ndm_stats s = stats_of(step);
    assert_int_equal(s.live_bytes, 32);
    assert_int_equal(stats_of(model).live_bytes, 0);
    ndm_array t = ndm_zeros(step, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_manager_close(step));
    /* the borrowed array went back to its lender, even though it is capped */
    assert_true(ndm_array_valid(w));
    assert_false(ndm_array_valid(t));
    assert_true(ndm_array_manager(w).id == model.id);
    ndm_stats m = stats_of(model);
    assert_int_equal(m.live_arrays, 1);
    assert_int_equal(m.live_bytes, 32);
    assert_int_equal(m.moved_out, 1);
    assert_int_equal(m.moved_in, 1);
    assert_ok(ndm_manager_close(model));
}

static void test_move_temp_attach_lender_gone(void **state)
{
    ndm_manager lender = ndm_manager_new(ROOT(state), "lender");
    ndm_manager borrower = ndm_manager_new(ROOT(state), "borrower");
    ndm_array x = ndm_zeros(lender, NDM_F32, NDM_SHAPE(8));
    assert_ok(ndm_temp_attach(x, borrower));
    assert_ok(ndm_manager_close(lender)); /* x is not in the lender: it survives */
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_manager_close(borrower)); /* the lender is gone: x is released */
    assert_false(ndm_array_valid(x));
    /* a borrowed array attached elsewhere is no longer borrowed */
    lender = ndm_manager_new(ROOT(state), "lender2");
    borrower = ndm_manager_new(ROOT(state), "borrower2");
    ndm_manager keeper = ndm_manager_new(ROOT(state), "keeper");
    ndm_array y = ndm_zeros(lender, NDM_F32, NDM_SHAPE(8));
    assert_ok(ndm_temp_attach(y, borrower));
    assert_ok(ndm_attach(y, keeper));
    assert_ok(ndm_manager_close(borrower));
    assert_true(ndm_array_manager(y).id == keeper.id);
    assert_ok(ndm_manager_close(keeper));
    assert_false(ndm_array_valid(y));
    assert_ok(ndm_manager_close(lender));
}

static void test_move_shared_storage_counted_once(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(4, 4)); /* 64 bytes */
    ndm_array v1 = ndm_transpose(x);                     /* a view, in a */
    ndm_array v2 = ndm_alias_to(b, x);                   /* a view, in b */
    assert_live(v1);
    assert_live(v2);
    assert_int_equal(stats_of(a).live_bytes, 64);
    assert_int_equal(stats_of(b).live_bytes, 0);
    ndm_stats sub;
    assert_ok(ndm_manager_stats(ROOT(state), NDM_CPU, NDM_STATS_SUBTREE, &sub));
    assert_int_equal(sub.live_bytes, 64);
    assert_int_equal(sub.live_arrays, 3);
    /* a keeps the charge while it holds a view */
    assert_ok(ndm_array_release(x));
    assert_int_equal(stats_of(a).live_bytes, 64);
    /* its last view goes: the charge moves to b, which still holds one */
    assert_ok(ndm_array_release(v1));
    assert_int_equal(stats_of(a).live_bytes, 0);
    assert_int_equal(stats_of(b).live_bytes, 64);
    /* moving the last view moves the charge */
    assert_ok(ndm_attach(v2, a));
    assert_int_equal(stats_of(b).live_bytes, 0);
    assert_int_equal(stats_of(a).live_bytes, 64);
    assert_ok(ndm_array_release(v2));
    assert_int_equal(stats_of(a).live_bytes, 0);
    assert_ok(ndm_manager_stats(ROOT(state), NDM_CPU, NDM_STATS_SUBTREE, &sub));
    assert_int_equal(sub.live_bytes, 0);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
}

static void test_move_charge_across_limits(void **state)
{
    ndm_manager lim = ndm_manager_new(ROOT(state), "limited");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 100));
    ndm_manager in1 = ndm_manager_new(lim, "in1");
    ndm_manager in2 = ndm_manager_new(lim, "in2");
    ndm_manager out = ndm_manager_new(ROOT(state), "out");
    ndm_array x = ndm_zeros(in1, NDM_U8, NDM_SHAPE(80));
    /* moving inside the limited subtree costs nothing against the limit */
    assert_ok(ndm_attach(x, in2));
    ndm_array y = ndm_zeros(out, NDM_U8, NDM_SHAPE(30));
    assert_status(ndm_attach(y, in1), NDM_E_QUOTA); /* 80 + 30 > 100 */
    assert_ok(ndm_attach(x, out));                   /* leaving frees the room */
    assert_ok(ndm_attach(y, in1));
    assert_live(ndm_zeros(in2, NDM_U8, NDM_SHAPE(70)));
    assert_ok(ndm_manager_close(lim));
    assert_ok(ndm_manager_close(out));
}

/* Lending a borrowed array again: each borrower's close gives it one step
 * back, to the lender it came from. */
static void test_move_temp_attach_chain_returns_step_by_step(void **state)
{
    ndm_manager o = ndm_manager_new(ROOT(state), "o");
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager c = ndm_manager_new(ROOT(state), "c");
    ndm_array x = ndm_zeros(o, NDM_F32, NDM_SHAPE(4));
    assert_ok(ndm_temp_attach(x, a));
    assert_ok(ndm_temp_attach(x, c));
    assert_true(ndm_array_manager(x).id == c.id);
    assert_ok(ndm_manager_close(c));
    assert_true(ndm_array_manager(x).id == a.id);
    assert_ok(ndm_manager_close(a));
    assert_true(ndm_array_valid(x)); /* back with its original owner, not released */
    assert_true(ndm_array_manager(x).id == o.id);
    assert_int_equal(stats_of(o).live_arrays, 1);
    /* a lender in the middle that is gone passes it on to the one before */
    ndm_manager a2 = ndm_manager_new(ROOT(state), "a2");
    ndm_manager c2 = ndm_manager_new(ROOT(state), "c2");
    assert_ok(ndm_temp_attach(x, a2));
    assert_ok(ndm_temp_attach(x, c2));
    assert_ok(ndm_manager_close(a2));
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_manager_close(c2));
    assert_true(ndm_array_manager(x).id == o.id);
    /* an attach ends the chain: the new owner keeps it */
    ndm_manager a3 = ndm_manager_new(ROOT(state), "a3");
    ndm_manager c3 = ndm_manager_new(ROOT(state), "c3");
    assert_ok(ndm_temp_attach(x, a3));
    assert_ok(ndm_temp_attach(x, c3));
    assert_ok(ndm_attach(x, c3));
    assert_ok(ndm_manager_close(a3));
    assert_true(ndm_array_manager(x).id == c3.id);
    assert_ok(ndm_manager_close(c3));
    assert_false(ndm_array_valid(x));
    /* a chained array released early frees its chain (ASan checks) */
    ndm_manager a4 = ndm_manager_new(ROOT(state), "a4");
    ndm_manager c4 = ndm_manager_new(ROOT(state), "c4");
    ndm_array y = ndm_zeros(o, NDM_F32, NDM_SHAPE(4));
    assert_ok(ndm_temp_attach(y, a4));
    assert_ok(ndm_temp_attach(y, c4));
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_manager_close(c4));
    assert_ok(ndm_manager_close(a4));
    assert_ok(ndm_manager_close(o));
}

/* Lending to a manager that never closes would never give the array back. */
static void test_move_temp_attach_to_builtin_refused(void **state)
{
    ndm_manager o = ndm_manager_new(ROOT(state), "o");
    ndm_array x = ndm_zeros(o, NDM_F32, NDM_SHAPE(4));
    ndm_stats before = stats_of(ndm_system());
    assert_status(ndm_temp_attach(x, ndm_system()), NDM_E_ROOT);
    assert_error_has("never closes");
    assert_status(ndm_temp_attach(x, ndm_detached()), NDM_E_ROOT);
    assert_true(ndm_array_manager(x).id == o.id);
    assert_int_equal(stats_of(o).live_arrays, 1);
    assert_int_equal(stats_of(o).moved_out, 0);
    assert_int_equal(stats_of(ndm_system()).moved_in, before.moved_in);
    assert_ok(ndm_manager_close(o));
}

typedef struct rescue {
    ndm_array a;
    ndm_manager to;
    ndm_status st;
} rescue;

static int rescue_hook(void *ud)
{
    rescue *r = ud;
    r->st = ndm_attach(r->a, r->to);
    return 0;
}

/* By the close order a child closes (hooks included) before its parent's
 * arrays are released, so a child's hook may still move them. */
static void test_move_child_hook_moves_parent_array(void **state)
{
    ndm_manager parent = ndm_manager_new(ROOT(state), "parent");
    ndm_manager child = ndm_manager_new(parent, "child");
    ndm_manager keeper = ndm_manager_new(ROOT(state), "keeper");
    rescue r = {ndm_ones(parent, NDM_F32, NDM_SHAPE(3)), keeper, NDM_E_INVALID};
    assert_ok(ndm_manager_on_close(child, rescue_hook, &r));
    assert_ok(ndm_manager_close(parent));
    assert_ok(r.st);
    assert_true(ndm_array_valid(r.a));
    assert_true(ndm_array_manager(r.a).id == keeper.id);
    /* a parent's own hooks run after its arrays are gone: nothing to move */
    ndm_manager p2 = ndm_manager_new(ROOT(state), "p2");
    rescue late = {ndm_ones(p2, NDM_F32, NDM_SHAPE(3)), keeper, NDM_OK};
    assert_ok(ndm_manager_on_close(p2, rescue_hook, &late));
    assert_ok(ndm_manager_close(p2));
    assert_int_equal(late.st, NDM_E_CLOSED);
    assert_int_equal(stats_of(keeper).live_arrays, 1);
    assert_ok(ndm_manager_close(keeper));
}

/* A view is no way around a limit: a view in a limited manager of storage
 * charged outside it may come to hold the charge, so it must fit. */
static void test_move_view_into_limit_checked(void **state)
{
    ndm_manager big = ndm_manager_new(ROOT(state), "big");
    ndm_manager lim = ndm_manager_new(ROOT(state), "limited");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 1024));
    ndm_array x = ndm_zeros(big, NDM_U8, NDM_SHAPE(4 << 20));
    assert_live(x);
    assert_status(ndm_attach(x, lim), NDM_E_QUOTA);
    /* an empty view of it is refused too, naming the limit */
    ndm_clear_error();
    ndm_array v = ndm_slice_to(lim, x, 0, 0, 0, 1);
    assert_true(v.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_error_has("system/test/limited");
    assert_int_equal(stats_of(lim).live_arrays, 0);
    /* releasing the original leaves the limited manager as it was */
    assert_ok(ndm_array_release(x));
    assert_int_equal(stats_of(lim).live_bytes, 0);
    assert_int_equal(stats_of(big).live_bytes, 0);
    /* a view whose storage fits is made, and the charge can come in */
    ndm_array y = ndm_zeros(big, NDM_U8, NDM_SHAPE(1000));
    ndm_array w = ndm_alias_to(lim, y);
    assert_live(w);
    assert_ok(ndm_array_release(y));
    assert_int_equal(stats_of(lim).live_bytes, 1000);
    assert_int_equal(stats_of(big).live_bytes, 0);
    /* storage charged inside the limit needs no room for a view there */
    ndm_array z = ndm_alias_to(lim, w);
    assert_live(z);
    assert_ok(ndm_array_release(w));
    assert_ok(ndm_array_release(z));
    assert_int_equal(stats_of(lim).live_bytes, 0);
    assert_ok(ndm_manager_close(big));
    assert_ok(ndm_manager_close(lim));
}

/* When a charge moves and the newest view's manager has no room left under
 * its limit, an older view's manager with room takes it. */
static void test_move_shared_charge_goes_where_it_fits(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager open = ndm_manager_new(ROOT(state), "open");
    ndm_manager lim = ndm_manager_new(ROOT(state), "limited");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 1024));
    ndm_array x = ndm_zeros(a, NDM_U8, NDM_SHAPE(1000));
    ndm_array v1 = ndm_alias_to(open, x);
    ndm_array v2 = ndm_alias_to(lim, x); /* fits now */
    assert_live(v1);
    assert_live(v2);
    ndm_array filler = ndm_zeros(lim, NDM_U8, NDM_SHAPE(512)); /* no room for x any more */
    assert_live(filler);
    assert_ok(ndm_array_release(x));
    assert_int_equal(stats_of(lim).live_bytes, 512);
    assert_int_equal(stats_of(open).live_bytes, 1000);
    assert_int_equal(stats_of(a).live_bytes, 0);
    assert_ok(ndm_array_release(v1));
    assert_ok(ndm_array_release(v2));
    assert_ok(ndm_array_release(filler));
    assert_int_equal(stats_of(open).live_bytes, 0);
    assert_int_equal(stats_of(lim).live_bytes, 0);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(open));
    assert_ok(ndm_manager_close(lim));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_move_attach_steals),
        TEST(test_move_refused_changes_nothing),
        TEST(test_move_ret_to_parent),
        TEST(test_move_detach_is_counted),
        TEST(test_move_temp_attach_returns_on_close),
        TEST(test_move_temp_attach_lender_gone),
        TEST(test_move_temp_attach_chain_returns_step_by_step),
        TEST(test_move_temp_attach_to_builtin_refused),
        TEST(test_move_child_hook_moves_parent_array),
        TEST(test_move_shared_storage_counted_once),
        TEST(test_move_charge_across_limits),
        TEST(test_move_view_into_limit_checked),
        TEST(test_move_shared_charge_goes_where_it_fits),
    };
    return cmocka_run_group_tests_name("moves", tests, NULL, NULL);
}
