/* Scopes: capture of temporaries, keeps moving out, release-all-but, move-out,
 * out-of-order ends, NDM_AUTO, the one-expression helper, thread locality. */
#include <pthread.h>

#include "helpers.h"

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, 0, &st) != NDM_OK)
        fail_msg("stats: %s", ndm_last_error());
    return st;
}

static void test_scope_catches_and_keeps(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array x = ndm_ones(batch, NDM_F32, NDM_SHAPE(4, 4));
    ndm_manager s = ndm_scope_begin(batch, "tmp");
    assert_live(s);
    assert_true(ndm_manager_is_scope(s));
    assert_true(ndm_scope_current().id == s.id);
    ndm_array t1 = ndm_transpose(x);       /* x's manager is batch, but the scope wins */
    ndm_array t2 = ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(3)); /* the scope */
    ndm_array named = ndm_alias_to(batch, x); /* a named manager beats the scope */
    assert_true(ndm_array_manager(t1).id == s.id);
    assert_true(ndm_array_manager(t2).id == s.id);
    assert_true(ndm_array_manager(named).id == batch.id);
    assert_ok(ndm_scope_end(s, 1, &t1));
    assert_true(ndm_array_manager(t1).id == batch.id); /* no enclosing scope: to the parent */
    assert_false(ndm_array_valid(t2));
    assert_false(ndm_manager_valid(s));
    assert_true(ndm_scope_current().id == 0);
    assert_int_equal(stats_of(batch).live_arrays, 3);
    assert_status(ndm_scope_end(s, 0, NULL), NDM_ALREADY);
    assert_ok(ndm_manager_close(batch));
}

static void test_scope_nested_keep_goes_to_enclosing(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager outer = ndm_scope_begin(batch, "outer");
    ndm_manager other = ndm_manager_new(ROOT(state), "elsewhere");
    ndm_manager inner = ndm_scope_begin(other, "inner"); /* a parent outside the outer scope */
    ndm_array r = ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(2));
    assert_true(ndm_array_manager(r).id == inner.id);
    assert_ok(ndm_scope_end(inner, 1, &r));
    assert_true(ndm_array_manager(r).id == outer.id); /* the enclosing scope, not the parent */
    assert_true(ndm_scope_current().id == outer.id);
    assert_ok(ndm_scope_end(outer, 1, &r));
    assert_true(ndm_array_manager(r).id == batch.id);
    assert_ok(ndm_manager_close(other));
    assert_ok(ndm_manager_close(batch));
}

static void test_scope_keep_not_owned_changes_nothing(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array outside = ndm_zeros(batch, NDM_F32, NDM_SHAPE(2));
    ndm_manager s = ndm_scope_begin(batch, "tmp");
    ndm_array mine = ndm_zeros(s, NDM_F32, NDM_SHAPE(2));
    ndm_array keep[2] = {mine, outside};
    ndm_stats before = stats_of(s);
    assert_status(ndm_scope_end(s, 2, keep), NDM_E_NOT_OWNER);
    assert_error_has("keep[1]");
    assert_error_has("system/test/batch");
    /* nothing changed: the scope is active and still owns its array */
    assert_true(ndm_manager_valid(s));
    assert_true(ndm_scope_current().id == s.id);
    ndm_stats after = stats_of(s);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(ndm_array_manager(mine).id == s.id);
    /* a stale keep is refused too */
    ndm_array dead = ndm_zeros(s, NDM_F32, NDM_SHAPE(1));
    assert_ok(ndm_array_release(dead));
    assert_status(ndm_scope_end(s, 1, &dead), NDM_E_CLOSED);
    assert_status(ndm_scope_end(s, 1, NULL), NDM_E_INVALID);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(batch));
}

static void test_scope_keep_refused_by_target_rolls_back(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    assert_ok(ndm_manager_set_limit(batch, NDM_CPU, 100));
    ndm_manager other = ndm_manager_new(ROOT(state), "other");
    /* the inner scope lives outside the limit; its keeps go to the outer scope, inside it */
    ndm_manager outer = ndm_scope_begin(batch, "outer");
    ndm_manager inner = ndm_scope_begin(other, "inner");
    ndm_array a = ndm_zeros(inner, NDM_U8, NDM_SHAPE(60));
    ndm_array b = ndm_zeros(inner, NDM_U8, NDM_SHAPE(20));
    ndm_array big = ndm_zeros(inner, NDM_U8, NDM_SHAPE(30));
    ndm_array c = ndm_zeros(inner, NDM_U8, NDM_SHAPE(1));
    ndm_array keep4[4] = {a, b, big, c}; /* 60 + 20 + 30 > 100: refused at the third */
    ndm_stats is = stats_of(inner), os = stats_of(outer);
    assert_status(ndm_scope_end(inner, 4, keep4), NDM_E_QUOTA);
    assert_error_has("system/test/batch");
    /* rolled back: the scope is active and owns all four, counters unchanged */
    assert_true(ndm_manager_valid(inner));
    assert_true(ndm_scope_current().id == inner.id);
    ndm_stats is2 = stats_of(inner), os2 = stats_of(outer);
    assert_memory_equal(&is, &is2, sizeof is);
    assert_memory_equal(&os, &os2, sizeof os);
    for (int i = 0; i < 4; i++)
        assert_true(ndm_array_manager(keep4[i]).id == inner.id);
    ndm_array keep3[3] = {a, b, c};
    assert_ok(ndm_scope_end(inner, 3, keep3));
    assert_false(ndm_array_valid(big));
    assert_true(ndm_array_manager(c).id == outer.id);
    ndm_stats total;
    assert_ok(ndm_manager_stats(batch, NDM_CPU, NDM_STATS_SUBTREE, &total));
    assert_int_equal(total.live_bytes, 81);
    assert_ok(ndm_scope_end(outer, 0, NULL));
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(other));
}

static void test_scope_release_all_but(void **state)
{
    ndm_manager s = ndm_scope_begin(ROOT(state), "s");
    ndm_array a = ndm_zeros(s, NDM_F32, NDM_SHAPE(1));
    ndm_array b = ndm_zeros(s, NDM_F32, NDM_SHAPE(2));
    ndm_array c = ndm_zeros(s, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_scope_release_all_but(s, 1, &b));
    assert_false(ndm_array_valid(a));
    assert_true(ndm_array_valid(b));
    assert_false(ndm_array_valid(c));
    assert_true(ndm_manager_valid(s)); /* the scope stays */
    ndm_stats st = stats_of(s);
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.released, 2);
    assert_int_equal(st.live_bytes, 8);
    /* the released arrays' handles say where they died */
    assert_false(ndm_array_valid(a));
    assert_int_equal(ndm_array_ndim(a), -1);
    assert_error_has("released at test_scope.c");
    ndm_array many[40];
    for (int i = 0; i < 40; i++)
        many[i] = ndm_zeros(s, NDM_U8, NDM_SHAPE(1));
    assert_ok(ndm_scope_release_all_but(s, 20, many)); /* the sorted path */
    for (int i = 0; i < 40; i++)
        assert_int_equal(ndm_array_valid(many[i]), i < 20);
    assert_ok(ndm_scope_release_all(s));
    assert_int_equal(stats_of(s).live_arrays, 0);
    assert_ok(ndm_scope_end(s, 0, NULL));
}

static void test_scope_move_out(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager s = ndm_scope_begin(batch, "s");
    ndm_array a = ndm_zeros(s, NDM_F32, NDM_SHAPE(1));
    assert_ok(ndm_scope_move_out(a));
    assert_true(ndm_array_manager(a).id == batch.id);
    assert_status(ndm_scope_move_out(a), NDM_E_NOT_OWNER);
    assert_error_has("not a scope");
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_true(ndm_array_valid(a));
    assert_ok(ndm_manager_close(batch));
}

static void test_scope_out_of_order_end(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager s1 = ndm_scope_begin(batch, "s1");
    ndm_manager s2 = ndm_scope_begin(batch, "s2"); /* not a child of s1 */
    ndm_array x = ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(2));
    assert_true(ndm_array_manager(x).id == s2.id);
    /* the caller ends s1 first (a callee forgot s2) */
    assert_ok(ndm_scope_end(s1, 0, NULL));
    assert_true(ndm_scope_current().id == s2.id);
    ndm_array y = ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(2));
    assert_true(ndm_array_manager(y).id == s2.id);
    /* s2's enclosing scope is gone: keeps go to its parent */
    assert_ok(ndm_scope_end(s2, 1, &y));
    assert_true(ndm_array_manager(y).id == batch.id);
    assert_true(ndm_scope_current().id == 0);
    /* a child scope dies with its parent scope and leaves the stack */
    ndm_manager p = ndm_scope_begin(batch, "p");
    ndm_manager c = ndm_scope_begin(p, "c");
    assert_ok(ndm_scope_end(p, 0, NULL));
    assert_false(ndm_manager_valid(c));
    assert_true(ndm_scope_current().id == 0);
    assert_status(ndm_scope_end(c, 0, NULL), NDM_ALREADY);
    /* a scope closed through its parent manager leaves the stack too */
    ndm_manager holder = ndm_manager_new(batch, "holder");
    ndm_manager s3 = ndm_scope_begin(holder, "s3");
    assert_true(ndm_scope_current().id == s3.id);
    assert_ok(ndm_manager_close(holder));
    assert_true(ndm_scope_current().id == 0);
    assert_ok(ndm_manager_close(batch));
}

static void test_scope_end_errors(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "plain");
    assert_status(ndm_scope_end(m, 0, NULL), NDM_E_INVALID);
    assert_error_has("not a scope");
    ndm_clear_error();
    assert_status(ndm_scope_end(NDM_NULL_MANAGER, 0, NULL), NDM_E_NULL);
    ndm_clear_error();
    ndm_manager s = ndm_scope_begin(NDM_CURRENT_SCOPE, "s");
    assert_true(s.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_error_has("no scope is active");
    ndm_clear_error();
    ndm_array a = ndm_zeros(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(1));
    assert_true(a.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    /* NDM_CURRENT_SCOPE as the parent inside a scope: the current scope */
    ndm_manager outer = ndm_scope_begin(m, "outer");
    ndm_manager inner = ndm_scope_begin(NDM_CURRENT_SCOPE, "inner");
    assert_true(ndm_manager_parent(inner).id == outer.id);
    /* a null parent is refused even inside a scope */
    ndm_clear_error();
    assert_true(ndm_scope_begin(NDM_NULL_MANAGER, "s").id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_true(ndm_scope_current().id == inner.id);
    assert_ok(ndm_scope_end(outer, 0, NULL));
    assert_ok(ndm_manager_close(m));
}

static ndm_array return_input(void *ud) { return *(ndm_array *)ud; }

static ndm_array make_sum(void *ud)
{
    ndm_manager *where = ud;
    ndm_array t = ndm_ones(NDM_CURRENT_SCOPE, NDM_F32, NDM_SHAPE(2, 3)); /* temporary */
    *where = ndm_array_manager(t);
    return ndm_reshape(ndm_transpose(t), NDM_SHAPE(6)); /* a copy: transposed strides */
}

static void test_scope_one_expression_helpers(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager seen = NDM_NULL_MANAGER;
    ndm_array r = ndm_scoped(batch, make_sum, &seen);
    assert_live(r);
    assert_true(ndm_array_manager(r).id == batch.id);
    assert_false(ndm_manager_valid(seen)); /* the helper's scope is gone */
    assert_int_equal(stats_of(batch).live_arrays, 1);
    ndm_array x = ndm_arange(batch, NDM_F32, 0, 6, 1);
    ndm_array y = NDM_SCOPED(batch, ndm_copy(ndm_transpose(ndm_reshape(x, NDM_SHAPE(2, 3)))));
    assert_live(y);
    assert_true(ndm_array_manager(y).id == batch.id);
    assert_int_equal(stats_of(batch).live_arrays, 3); /* r, x, y: the temporaries are gone */
    float v[6];
    assert_ok(ndm_array_copy_out(y, v, sizeof v));
    assert_true(v[1] == 3.0f && v[2] == 1.0f);
    /* an expression that returns one of its inputs gives a fresh alias (one
     * disposal protocol: every handle that comes out is the caller's) */
    ndm_array z = NDM_SCOPED(batch, x);
    assert_live(z);
    assert_true(z.id != x.id);
    assert_true(ndm_array_manager(z).id == batch.id);
    assert_ok(ndm_array_release(z));
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_array_copy_out(x, v, sizeof v));
    assert_true(v[5] == 5.0f);
    assert_int_equal(stats_of(batch).live_arrays, 3);
    ndm_array w = ndm_scoped(batch, return_input, &x);
    assert_live(w);
    assert_true(w.id != x.id);
    assert_ok(ndm_array_release(w));
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_manager_close(batch));
}

/* An array handle is not a scope: ndm_scope_end refuses it rather than
 * taking it for an ended scope (NDM_SCOPED would then hand back an array
 * of a scope that is still active). */
static void test_scope_end_refuses_array_handle(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager s = ndm_scope_begin(batch, "s");
    ndm_array a = ndm_zeros(s, NDM_F32, NDM_SHAPE(2));
    assert_status(ndm_scope_end((ndm_manager){a.id}, 0, NULL), NDM_E_INVALID);
    assert_error_has("not a manager handle");
    assert_true(ndm_scope_current().id == s.id);
    assert_true(ndm_array_valid(a));
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(batch));
}

/* ndm_scope_finish on what is not a live scope: a null result always
 * comes with a negative status and a message, and nothing is left behind
 * (an alias made in system would live until the process exits). */
static void test_scope_finish_refuses_ended_and_non_scopes(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array x = ndm_zeros(batch, NDM_F32, NDM_SHAPE(2));
    ndm_manager s = ndm_scope_begin(batch, "s");
    assert_ok(ndm_scope_end(s, 0, NULL));
    ndm_clear_error();
    assert_true(ndm_scope_finish_at(__FILE__, __LINE__, __func__, s, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("already ended");
    ndm_clear_error();
    assert_true(ndm_scope_finish_at(__FILE__, __LINE__, __func__, s, NDM_NULL_ARRAY).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* system and a plain manager are not scopes: refused, no alias made */
    ndm_stats before = stats_of(ndm_system());
    ndm_clear_error();
    assert_true(ndm_scope_finish_at(__FILE__, __LINE__, __func__, ndm_system(), x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("not a scope");
    ndm_stats after = stats_of(ndm_system());
    assert_int_equal(after.live_arrays, before.live_arrays);
    assert_int_equal(after.created, before.created);
    ndm_manager plain = ndm_manager_new(batch, "plain");
    ndm_clear_error();
    assert_true(ndm_scope_finish_at(__FILE__, __LINE__, __func__, plain, x).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_int_equal(stats_of(plain).live_arrays, 0);
    assert_int_equal(stats_of(plain).created, 0);
    /* x is untouched throughout */
    assert_true(ndm_array_valid(x));
    assert_int_equal(stats_of(batch).live_arrays, 1);
    assert_ok(ndm_manager_close(batch));
}

static ndm_manager g_auto_mgr, g_auto_scope;
static ndm_array g_auto_arr;

static void auto_block(ndm_manager parent, int early)
{
    NDM_AUTO ndm_manager m = ndm_manager_new(parent, "auto");
    NDM_AUTO ndm_manager s = ndm_scope_begin(m, "auto-scope");
    NDM_AUTO ndm_array a = ndm_zeros(parent, NDM_F32, NDM_SHAPE(4));
    g_auto_mgr = m;
    g_auto_scope = s;
    g_auto_arr = a;
    if (early) {
        /* an explicit close before the cleanup is harmless */
        if (ndm_manager_close(m) != NDM_OK)
            fail_msg("close: %s", ndm_last_error());
        return;
    }
}

static void test_scope_auto_cleanup(void **state)
{
    for (int early = 0; early < 2; early++) {
        int warned = 0;
        auto_block(ROOT(state), early);
        (void)warned;
        assert_false(ndm_manager_valid(g_auto_mgr));
        assert_false(ndm_manager_valid(g_auto_scope));
        assert_false(ndm_array_valid(g_auto_arr));
        assert_true(ndm_scope_current().id == 0);
    }
}

/* NDM_AUTO's cleanup given another kind of handle (a module: Clang
 * compiles that, GCC does not) warns with what to do and touches nothing. */
static char auto_warning[512];
static void keep_auto_warning(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN)
        snprintf(auto_warning, sizeof auto_warning, "%s", msg);
}

static void test_scope_auto_cleanup_of_a_module_says_why(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module lin = ndm_linear(model, 2, 2, true, &rng);
    assert_true(lin.id != 0);
    auto_warning[0] = 0;
    ndm_clear_error();
    ndm_set_log_fn(keep_auto_warning, NULL);
    ndm_auto_cleanup(&lin);
    ndm_set_log_fn(NULL, NULL);
    assert_non_null(strstr(auto_warning, "is not a manager, scope or array"));
    assert_non_null(strstr(auto_warning, "remove NDM_AUTO"));
    assert_int_equal(ndm_last_status(), NDM_OK); /* no failure recorded */
    /* the module lives on with its model */
    ndm_array x = ndm_ones(model, NDM_F32, NDM_SHAPE(1, 2));
    assert_true(ndm_forward(lin, x).id != 0);
    assert_ok(ndm_manager_close(model));
}

typedef struct thread_arg {
    ndm_manager parent;
    ndm_manager got;
    ndm_manager scope_seen;
} thread_arg;

static void *other_thread(void *p)
{
    thread_arg *t = p;
    t->scope_seen = ndm_scope_current();
    ndm_array a = ndm_zeros(t->parent, NDM_F32, NDM_SHAPE(1));
    ndm_array v = ndm_alias(a);
    t->got = ndm_array_manager(v);
    return NULL;
}

static void test_scope_is_per_thread(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager s = ndm_scope_begin(batch, "mine");
    thread_arg t = {batch, NDM_NULL_MANAGER, NDM_NULL_MANAGER};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &t), 0);
    pthread_join(th, NULL);
    assert_true(t.scope_seen.id == 0);
    assert_true(t.got.id == batch.id); /* not captured by this thread's scope */
    assert_int_equal(stats_of(s).live_arrays, 0);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(batch));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_scope_catches_and_keeps),
        TEST(test_scope_nested_keep_goes_to_enclosing),
        TEST(test_scope_keep_not_owned_changes_nothing),
        TEST(test_scope_keep_refused_by_target_rolls_back),
        TEST(test_scope_release_all_but),
        TEST(test_scope_move_out),
        TEST(test_scope_out_of_order_end),
        TEST(test_scope_end_errors),
        TEST(test_scope_one_expression_helpers),
        TEST(test_scope_end_refuses_array_handle),
        TEST(test_scope_finish_refuses_ended_and_non_scopes),
        TEST(test_scope_auto_cleanup),
        TEST(test_scope_auto_cleanup_of_a_module_says_why),
        TEST(test_scope_is_per_thread),
    };
    return cmocka_run_group_tests_name("scope", tests, NULL, NULL);
}
