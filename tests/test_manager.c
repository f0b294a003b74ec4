/* The manager tree: creation, names and paths, deterministic close order,
 * built-in nodes, stale handles, caps, byte limits, owned resources and hooks. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h"

/* ---- creation, names, paths ------------------------------------------------ */

static void test_manager_new_names_path(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    assert_live(model);
    ndm_manager batch = ndm_manager_new(model, "batch-17");
    assert_live(batch);
    char path[256], name[64];
    assert_int_equal(ndm_manager_path(batch, path, sizeof path),
                     (int)strlen("system/test/model/batch-17"));
    assert_string_equal(path, "system/test/model/batch-17");
    assert_int_equal(ndm_manager_name(batch, name, sizeof name), 8);
    assert_string_equal(name, "batch-17");
    /* truncation keeps the full length as the result */
    char small[6];
    assert_int_equal(ndm_manager_path(batch, small, sizeof small), (int)strlen(path));
    assert_string_equal(small, "syste");
    assert_true(ndm_manager_parent(batch).id == model.id);
    assert_true(ndm_manager_parent(ndm_system()).id == 0);
    assert_ok(ndm_manager_close(model));
    assert_false(ndm_manager_valid(batch));
    assert_false(ndm_manager_valid(model));
}

static void test_manager_default_and_long_names(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), NULL);
    assert_live(m);
    char name[128];
    ndm_manager_name(m, name, sizeof name);
    assert_string_equal(name, "manager");
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ndm_manager l = ndm_manager_new(m, longname);
    assert_live(l);
    /* names are kept to their first 47 bytes, as manager.h says: the cut
     * name is the name, in the path too */
    assert_int_equal(ndm_manager_name(l, name, sizeof name), 47);
    assert_int_equal(strlen(name), 47);
    assert_memory_equal(name, longname, 47);
    char path[256], want[256];
    assert_int_equal(ndm_manager_path(l, path, sizeof path),
                     (int)strlen("system/test/manager/") + 47);
    snprintf(want, sizeof want, "system/test/manager/%.47s", longname);
    assert_string_equal(path, want);
    /* 47 bytes exactly are kept whole */
    longname[47] = '\0';
    ndm_manager e = ndm_manager_new(m, longname);
    assert_int_equal(ndm_manager_name(e, name, sizeof name), 47);
    assert_string_equal(name, longname);
    assert_ok(ndm_manager_close(m));
}

static void test_manager_inherits_device(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_device d = ndm_manager_device(m);
    assert_int_equal(d.type, NDM_DEVICE_CPU);
    assert_int_equal(d.index, 0);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    assert_int_equal(ndm_array_device(a).type, NDM_DEVICE_CPU);
    assert_ok(ndm_manager_close(m));
}

static void test_manager_new_on_missing_device(void **state)
{
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(63));
    assert_true(m.id == 0);
    ndm_status st = ndm_last_status();
    /* without the backend the build says so; with it, device 63 does not exist */
    assert_true(st == NDM_E_UNSUPPORTED || st == NDM_E_DEVICE);
    assert_error_has("cuda:63");
    m = ndm_manager_new_on(ROOT(state), "cpu1", ((ndm_device){NDM_DEVICE_CPU, 1}));
    assert_true(m.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    m = ndm_manager_new_on(ROOT(state), "odd", ((ndm_device){(ndm_device_type)7, 0}));
    assert_true(m.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    /* the parent is intact */
    assert_true(ndm_manager_valid(ROOT(state)));
}

static void test_manager_new_bad_parent(void **state)
{
    (void)state;
    ndm_manager m = ndm_manager_new(NDM_NULL_MANAGER, "x");
    assert_true(m.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    assert_ok(ndm_manager_close(gone));
    m = ndm_manager_new(gone, "child");
    assert_true(m.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("system/test/gone");
    /* an array handle's bits are not a manager */
    ndm_manager fake = {12345};
    m = ndm_manager_new(fake, "x");
    assert_true(m.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
}

/* ---- close order ------------------------------------------------------------- */

typedef struct order_log {
    char what[32][24];
    int n;
} order_log;

static order_log *g_log;

static void log_free(void *p)
{
    snprintf(g_log->what[g_log->n++], 24, "res:%s", (const char *)p);
}

static void log_wrap(void *data, void *ud)
{
    (void)data;
    snprintf(g_log->what[g_log->n++], 24, "arr:%s", (const char *)ud);
}

static int log_hook(void *ud)
{
    snprintf(g_log->what[g_log->n++], 24, "hook:%s", (const char *)ud);
    return 0;
}

static void test_manager_close_order(void **state)
{
    order_log log = {0};
    g_log = &log;
    static float buf[4][2];
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_manager c1 = ndm_manager_new(m, "c1");
    ndm_manager c2 = ndm_manager_new(m, "c2");
    assert_live(ndm_wrap_buffer(c1, NDM_F32, buf[0], log_wrap, "c1a", NDM_SHAPE(2)));
    assert_live(ndm_wrap_buffer(c2, NDM_F32, buf[1], log_wrap, "c2a", NDM_SHAPE(2)));
    assert_live(ndm_wrap_buffer(m, NDM_F32, buf[2], log_wrap, "a1", NDM_SHAPE(2)));
    assert_ok(ndm_manager_own(m, "r1", log_free, "r1"));
    assert_ok(ndm_manager_on_close(m, log_hook, "h1"));
    assert_live(ndm_wrap_buffer(m, NDM_F32, buf[3], log_wrap, "a2", NDM_SHAPE(2)));
    assert_ok(ndm_manager_own(m, "r2", log_free, "r2"));
    assert_ok(ndm_manager_close(m));
    /* children newest first (post-order), then arrays newest first, then
     * resources and hooks newest first */
    const char *want[] = {"arr:c2a", "arr:c1a", "arr:a2", "arr:a1", "res:r2", "hook:h1", "res:r1"};
    assert_int_equal(log.n, 7);
    for (int i = 0; i < 7; i++)
        assert_string_equal(log.what[i], want[i]);
    g_log = NULL;
}

static void test_manager_close_twice_is_already(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(3));
    assert_live(a);
    assert_ok(ndm_manager_close(m));
    ndm_clear_error();
    assert_status(ndm_manager_close(m), NDM_ALREADY);
    assert_status(ndm_array_release(a), NDM_ALREADY);
    /* NDM_ALREADY is not an error: the last error stays clear */
    assert_int_equal(ndm_last_status(), NDM_OK);
}

static void test_manager_builtins_cannot_close(void **state)
{
    (void)state;
    assert_status(ndm_manager_close(ndm_system()), NDM_E_ROOT);
    assert_error_has("system");
    assert_status(ndm_manager_close(ndm_detached()), NDM_E_ROOT);
    assert_status(ndm_manager_cap(ndm_system(), NDM_CAP_ARRAYS), NDM_E_ROOT);
    assert_status(ndm_manager_own(ndm_system(), NULL, free, "x"), NDM_E_ROOT);
    /* detached holds arrays only */
    ndm_manager c = ndm_manager_new(ndm_detached(), "child");
    assert_true(c.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_ROOT);
    assert_true(ndm_manager_valid(ndm_system()));
}

static void test_manager_stale_handle_message(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "batch-3");
    int line = __LINE__ - 1;
    assert_ok(ndm_manager_close(m));
    int close_line = __LINE__ - 1;
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    assert_true(a.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    char want[128];
    assert_error_has("system/test/batch-3");
    snprintf(want, sizeof want, "test_manager.c:%d", line);
    assert_error_has(want);
    snprintf(want, sizeof want, "closed at test_manager.c:%d", close_line);
    assert_error_has(want);
    assert_error_has("ndm_zeros:");
}

/* ---- caps ---------------------------------------------------------------------- */

static void test_manager_cap_arrays(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(4));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_int_equal(ndm_manager_caps(model), NDM_CAP_ARRAYS);
    ndm_stats before;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &before));
    ndm_array stray = ndm_zeros(model, NDM_F32, NDM_SHAPE(64, 128));
    int line = __LINE__ - 1;
    assert_true(stray.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    char want[64];
    snprintf(want, sizeof want, "test_manager.c:%d", line);
    assert_error_has(want);
    assert_error_has("f32[64,128]");
    assert_error_has("system/test/model");
    /* nothing changed */
    ndm_stats after;
    assert_ok(ndm_manager_stats(model, NDM_CPU, 0, &after));
    assert_memory_equal(&before, &after, sizeof before);
    /* children are still allowed, and the existing array can be read */
    ndm_manager child = ndm_manager_new(model, "trainer");
    assert_live(child);
    float v[4];
    assert_ok(ndm_array_copy_out(w, v, sizeof v));
    assert_true(v[3] == 1.0f);
    /* in-place writes to existing arrays work on a capped manager */
    float z[4] = {5, 6, 7, 8};
    assert_ok(ndm_array_copy_in(w, z, sizeof z));
    /* a view of a capped manager's array created without a scope would land
     * in the model, so it is refused too */
    assert_true(ndm_alias(w).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_ok(ndm_manager_uncap(model, NDM_CAP_ARRAYS));
    assert_int_equal(ndm_manager_caps(model), 0);
    assert_live(ndm_zeros(model, NDM_F32, NDM_SHAPE(1)));
    assert_ok(ndm_manager_close(model));
}

static void test_manager_cap_children(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    assert_ok(ndm_manager_cap(m, NDM_CAP_CHILDREN));
    ndm_manager c = ndm_manager_new(m, "c");
    assert_true(c.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_error_has("NDM_CAP_CHILDREN");
    /* arrays are still accepted */
    assert_live(ndm_zeros(m, NDM_U8, NDM_SHAPE(3)));
    assert_status(ndm_manager_cap(m, 0x100), NDM_E_INVALID);
    assert_ok(ndm_manager_uncap(m, NDM_CAP_CHILDREN));
    assert_live(ndm_manager_new(m, "c"));
    assert_ok(ndm_manager_close(m));
}

/* ---- limits -------------------------------------------------------------------- */

static void test_manager_limit_quota(void **state)
{
    ndm_manager req = ndm_manager_new(ROOT(state), "request");
    assert_ok(ndm_manager_set_limit(req, NDM_CPU, 1000));
    assert_int_equal(ndm_manager_limit(req, NDM_CPU), 1000);
    ndm_manager tmp = ndm_manager_new(req, "tmp");
    ndm_array a = ndm_zeros(tmp, NDM_F32, NDM_SHAPE(200)); /* 800 bytes */
    assert_live(a);
    ndm_stats before;
    assert_ok(ndm_manager_stats(req, NDM_CPU, NDM_STATS_SUBTREE, &before));
    ndm_array b = ndm_zeros(tmp, NDM_F32, NDM_SHAPE(100)); /* 400 more: over */
    assert_true(b.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_error_has("system/test/request");
    assert_error_has("limit 1000");
    ndm_stats after;
    assert_ok(ndm_manager_stats(req, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_memory_equal(&before, &after, sizeof before);
    /* other requests go on */
    assert_live(ndm_zeros(tmp, NDM_F32, NDM_SHAPE(50)));
    /* freeing makes room */
    assert_ok(ndm_array_release(a));
    assert_live(ndm_zeros(tmp, NDM_F32, NDM_SHAPE(100)));
    /* managers outside the limited subtree are not limited */
    assert_live(ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(1000)));
    assert_ok(ndm_manager_close(req));
    assert_ok(ndm_scope_release_all(ROOT(state)));
}

static void test_manager_limit_nested_and_below_use(void **state)
{
    ndm_manager outer = ndm_manager_new(ROOT(state), "outer");
    ndm_manager inner = ndm_manager_new(outer, "inner");
    ndm_array x = ndm_zeros(inner, NDM_U8, NDM_SHAPE(600));
    /* a limit set below the current use refuses new bytes until enough are freed */
    assert_ok(ndm_manager_set_limit(outer, NDM_CPU, 500));
    assert_true(ndm_zeros(inner, NDM_U8, NDM_SHAPE(1)).id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_set_limit(inner, NDM_CPU, 300));
    assert_live(ndm_zeros(inner, NDM_U8, NDM_SHAPE(300)));
    assert_true(ndm_zeros(inner, NDM_U8, NDM_SHAPE(1)).id == 0);
    assert_error_has("system/test/outer/inner");
    /* the outer limit counts its whole subtree */
    ndm_manager side = ndm_manager_new(outer, "side");
    assert_live(ndm_zeros(side, NDM_U8, NDM_SHAPE(200)));
    assert_true(ndm_zeros(side, NDM_U8, NDM_SHAPE(1)).id == 0);
    assert_error_has("system/test/outer'");
    /* removing a limit */
    assert_ok(ndm_manager_set_limit(outer, NDM_CPU, 0));
    assert_live(ndm_zeros(side, NDM_U8, NDM_SHAPE(100)));
    assert_status(ndm_manager_set_limit(outer, NDM_CUDA(99), 1), NDM_E_DEVICE);
    assert_ok(ndm_manager_close(outer));
}

/* ---- owned resources and hooks -------------------------------------------------- */

static int hook_calls;
static int failing_hook(void *ud)
{
    (void)ud;
    hook_calls++;
    return 7;
}

static int warnings;
static void count_warnings(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN && strstr(msg, "failed with 7"))
        warnings++;
}

static void test_manager_failing_hook_reported(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(8));
    hook_calls = 0;
    warnings = 0;
    ndm_set_log_fn(count_warnings, NULL);
    assert_ok(ndm_manager_on_close(m, failing_hook, NULL));
    assert_status(ndm_manager_close(m), NDM_E_HOOK);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(hook_calls, 1);
    assert_int_equal(warnings, 1);
    /* the close completed */
    assert_false(ndm_manager_valid(m));
    assert_false(ndm_array_valid(a));
}

static void test_manager_own_errors(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    assert_status(ndm_manager_own(m, NULL, NULL, "x"), NDM_E_INVALID);
    assert_status(ndm_manager_on_close(m, NULL, NULL), NDM_E_INVALID);
    char *p = malloc(16);
    assert_ok(ndm_manager_own(m, p, free, "buffer"));
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.resources, 1);
    assert_ok(ndm_manager_close(m));
    /* a closed manager refuses; the caller still owns the pointer */
    char *q = malloc(16);
    assert_status(ndm_manager_own(m, q, free, "late"), NDM_E_CLOSED);
    free(q);
}

/* ---- accounting across a subtree ------------------------------------------------- */

static void test_manager_counts_return_to_baseline(void **state)
{
    ndm_manager trainer = ndm_manager_new(ROOT(state), "trainer");
    for (int step = 0; step < 50; step++) {
        ndm_manager batch = ndm_manager_new(trainer, "batch");
        for (int i = 0; i < 10; i++)
            assert_live(ndm_zeros(batch, NDM_F32, NDM_SHAPE(i + 1)));
        assert_ok(ndm_manager_close(batch));
    }
    ndm_stats st;
    assert_ok(ndm_manager_stats(trainer, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.children, 0);
    assert_ok(ndm_manager_close(trainer));
}

/* ---- closes that race with the work they interrupt ------------------------ */

/* A pressure callback (run inside the allocation of a new array) closes the
 * manager the array is for, then makes managers until one takes the closed
 * one's slot, so the record is live again under another generation. */
typedef struct close_in_alloc {
    ndm_manager target, parent, reused;
    ndm_manager others[4096];
    int nothers;
    int calls;
} close_in_alloc;

static void close_target(const ndm_pressure_event *ev, void *ud)
{
    (void)ev;
    close_in_alloc *c = ud;
    if (c->calls++ || !ndm_manager_valid(c->target))
        return;
    if (ndm_manager_close(c->target) != NDM_OK)
        return;
    uint32_t slot = (uint32_t)c->target.id;
    while (c->nothers < 4096) {
        ndm_manager m = ndm_manager_new(c->parent, "other");
        if (!m.id)
            return;
        if ((uint32_t)m.id == slot) {
            c->reused = m;
            return;
        }
        c->others[c->nothers++] = m;
    }
}

static void test_manager_closed_by_pressure_callback_refuses_array(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager lim = ndm_manager_new(root, "limited");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 8u << 20));
    static close_in_alloc c;
    memset(&c, 0, sizeof c);
    c.target = ndm_manager_new(lim, "target");
    c.parent = root;
    assert_ok(ndm_alloc_configure(NDM_CPU, "pressure_every_mb:1"));
    assert_ok(ndm_on_pressure(close_target, &c));
    ndm_clear_error();
    ndm_array a = ndm_empty(c.target, NDM_U8, NDM_SHAPE(2 << 20));
    assert_ok(ndm_pressure_remove(close_target, &c));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
    assert_true(c.calls >= 1);
    assert_false(ndm_manager_valid(c.target));
    assert_live(c.reused);
    /* the array was refused: its manager closed while it was being made */
    assert_true(a.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* the manager now in the slot holds nothing, and counts right */
    ndm_stats st;
    assert_ok(ndm_manager_stats(c.reused, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.created, 0);
    assert_int_equal(st.live_bytes, 0);
    ndm_array b = ndm_zeros(c.reused, NDM_U8, NDM_SHAPE(100));
    assert_live(b);
    assert_ok(ndm_manager_stats(c.reused, NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.live_bytes, 100);
    /* the reservation went back to the limit it was taken from: all of it
     * is free again */
    ndm_array full = ndm_empty(lim, NDM_U8, NDM_SHAPE(8 << 20));
    assert_live(full);
    assert_ok(ndm_array_release(full));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_manager_close(c.reused));
    for (int i = 0; i < c.nothers; i++)
        assert_ok(ndm_manager_close(c.others[i]));
    assert_ok(ndm_manager_close(lim));
}

/* An on-close hook of a child closes its parent while only the child is
 * being closed: the parent closes at once and the child's close ends. */
typedef struct parent_closer {
    ndm_manager parent;
    ndm_status got;
    int ran;
} parent_closer;

static int close_parent_hook(void *ud)
{
    parent_closer *pc = ud;
    pc->ran++;
    pc->got = ndm_manager_close(pc->parent);
    return 0;
}

static int count_hook(void *ud)
{
    (*(int *)ud)++;
    return 0;
}

typedef struct hook_case {
    ndm_manager root;
    _Atomic int done;
    char failure[256];
} hook_case;

static void *run_hook_case(void *p)
{
    hook_case *hc = p;
    ndm_manager grand = ndm_manager_new(hc->root, "grand");
    ndm_manager parent = ndm_manager_new(grand, "parent");
    ndm_manager child = ndm_manager_new(parent, "child");
    ndm_manager sibling = ndm_manager_new(parent, "sibling");
    static parent_closer pc;
    pc = (parent_closer){grand, NDM_OK, 0};
    int later = 0, sib = 0;
    ndm_status st = NDM_OK;
    /* the hooks run newest first: count_hook after close_parent_hook */
    if (ndm_manager_on_close(child, count_hook, &later) != NDM_OK ||
        ndm_manager_on_close(child, close_parent_hook, &pc) != NDM_OK ||
        ndm_manager_on_close(sibling, count_hook, &sib) != NDM_OK ||
        !ndm_zeros(child, NDM_F32, NDM_SHAPE(8)).id ||
        !ndm_zeros(parent, NDM_F32, NDM_SHAPE(8)).id ||
        !ndm_zeros(sibling, NDM_F32, NDM_SHAPE(8)).id)
        snprintf(hc->failure, sizeof hc->failure, "setup: %s", ndm_last_error());
    else if ((st = ndm_manager_close(child)) != NDM_OK)
        snprintf(hc->failure, sizeof hc->failure, "close of the child: %s", ndm_status_name(st));
    else if (pc.ran != 1 || pc.got != NDM_OK || later != 1 || sib != 1)
        snprintf(hc->failure, sizeof hc->failure,
                 "hook ran %d times, its close returned %s; later hook %d, sibling's %d", pc.ran,
                 ndm_status_name(pc.got), later, sib);
    else if (ndm_manager_valid(child) || ndm_manager_valid(parent) ||
             ndm_manager_valid(sibling) || ndm_manager_valid(grand))
        snprintf(hc->failure, sizeof hc->failure, "a manager is still open");
    hc->done = 1;
    return NULL;
}

static void test_manager_hook_closes_ancestor_of_closing_child(void **state)
{
    hook_case hc = {ROOT(state), 0, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_hook_case, &hc), 0);
    /* A close that waits for itself never ends: give it a few seconds. */
    for (int i = 0; i < 500 && !hc.done; i++)
        usleep(10000);
    if (!hc.done) {
        fprintf(stderr, "the close of a manager whose hook closes an ancestor never ended\n");
        fflush(stderr);
        _exit(1);
    }
    pthread_join(th, NULL);
    if (hc.failure[0])
        fail_msg("%s", hc.failure);
    ndm_stats st;
    assert_ok(ndm_manager_stats(ROOT(state), NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 0);
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_manager_new_names_path),
        TEST(test_manager_default_and_long_names),
        TEST(test_manager_inherits_device),
        TEST(test_manager_new_on_missing_device),
        TEST(test_manager_new_bad_parent),
        TEST(test_manager_close_order),
        TEST(test_manager_close_twice_is_already),
        TEST(test_manager_builtins_cannot_close),
        TEST(test_manager_stale_handle_message),
        TEST(test_manager_cap_arrays),
        TEST(test_manager_cap_children),
        TEST(test_manager_limit_quota),
        TEST(test_manager_limit_nested_and_below_use),
        TEST(test_manager_failing_hook_reported),
        TEST(test_manager_own_errors),
        TEST(test_manager_counts_return_to_baseline),
        TEST(test_manager_closed_by_pressure_callback_refuses_array),
        TEST(test_manager_hook_closes_ancestor_of_closing_child),
    };
    return cmocka_run_group_tests_name("manager", tests, NULL, NULL);
}
