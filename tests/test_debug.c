/* Observability: exact statistics, the debug dump's pinned text and JSON,
 * leak hunting since a mark, and the leak reports (in process and at exit). */
#include <stdlib.h>
#include <unistd.h>

#include "../lib/backends/registry.h"
#include "array_check.h"
#include "child_run.h"
#include "utf8_check.h"


static ndm_stats stats_of(ndm_manager m, unsigned flags)
{
    ndm_stats st;
    memset(&st, 0xab, sizeof st);
    assert_ok(ndm_manager_stats(m, NDM_CPU, flags, &st));
    return st;
}

#define assert_stats(m, flags, live, created_, released_, in, out, bytes, peak, res, kids)  \
    do {                                                                        \
        ndm_stats s_ = stats_of((m), (flags));                                  \
        assert_int_equal(s_.live_arrays, (live));                               \
        assert_int_equal(s_.created, (created_));                               \
        assert_int_equal(s_.released, (released_));                             \
        assert_int_equal(s_.moved_in, (in));                                    \
        assert_int_equal(s_.moved_out, (out));                                  \
        assert_int_equal(s_.live_bytes, (bytes));                               \
        assert_int_equal(s_.peak_bytes, (peak));                                \
        assert_int_equal(s_.resources, (res));                                  \
        assert_int_equal(s_.children, (kids));                                  \
    } while (0)

static int freed_resources;
static void free_resource(void *p)
{
    (void)p;
    freed_resources++;
}
static int hook_ok(void *ud)
{
    (void)ud;
    return 0;
}

/* ---- statistics ------------------------------------------------------------------ */

/* A small tree used by the statistics tests:
 *   m: a1 (f32[10], 40 B), a2 (f64[4], 32 B, released), b (u8[100], moved in
 *      from c), one owned resource and one hook
 *   c: made b; child gc */
typedef struct tree {
    ndm_manager m, c, gc;
    ndm_array a1, b;
} tree;

static tree make_tree(ndm_manager root)
{
    tree t;
    t.m = ndm_manager_new(root, "m");
    t.c = ndm_manager_new(t.m, "c");
    t.gc = ndm_manager_new(t.c, "gc");
    t.a1 = ndm_zeros(t.m, NDM_F32, NDM_SHAPE(10));
    ndm_array a2 = ndm_zeros(t.m, NDM_F64, NDM_SHAPE(4));
    release_ok(a2);
    t.b = ndm_zeros(t.c, NDM_U8, NDM_SHAPE(100));
    assert_ok(ndm_attach(t.b, t.m));
    assert_ok(ndm_manager_own(t.m, &freed_resources, free_resource, "counter"));
    assert_ok(ndm_manager_on_close(t.m, hook_ok, NULL));
    return t;
}

static void test_stats_own_figures(void **state)
{
    freed_resources = 0;
    tree t = make_tree(ROOT(state));
    /*            live created released in out bytes peak res kids */
    assert_stats(t.m, 0, 2, 2, 1, 1, 0, 140, 140, 2, 1);
    assert_stats(t.c, 0, 0, 1, 0, 0, 1, 0, 100, 0, 1);
    assert_stats(t.gc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    close_ok(t.m);
    assert_int_equal(freed_resources, 1);
}

static void test_stats_subtree_figures(void **state)
{
    tree t = make_tree(ROOT(state));
    /* Peak over a subtree is the sum of the managers' peaks. */
    assert_stats(t.m, NDM_STATS_SUBTREE, 2, 3, 1, 1, 1, 140, 240, 2, 2);
    assert_stats(t.c, NDM_STATS_SUBTREE, 0, 1, 0, 0, 1, 0, 100, 0, 1);
    assert_stats(ROOT(state), NDM_STATS_SUBTREE, 2, 3, 1, 1, 1, 140, 240, 2, 3);
    assert_stats(ROOT(state), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1);
    close_ok(t.c);
    /* c's lifetime stays in m's totals: it made b (now in m) */
    assert_stats(t.m, NDM_STATS_SUBTREE, 2, 3, 1, 1, 0, 140, 140, 2, 0);
    close_ok(t.m);
}

static void test_stats_peak_stays(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array big = ndm_empty(m, NDM_F64, NDM_SHAPE(1000));
    ndm_array small = ndm_empty(m, NDM_F64, NDM_SHAPE(10));
    release_ok(big);
    assert_stats(m, 0, 1, 2, 1, 0, 0, 80, 8080, 0, 0);
    release_ok(small);
    assert_stats(m, 0, 0, 2, 2, 0, 0, 0, 8080, 0, 0);
}

static void test_stats_shared_storage_counted_once(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager m = ndm_manager_new(root, "m");
    ndm_manager c = ndm_manager_new(root, "c");
    ndm_array base = ndm_zeros(m, NDM_F32, NDM_SHAPE(10));
    ndm_array al = ndm_alias(base);
    ndm_array v = ndm_alias_to(c, base);
    ndm_array s = ndm_slice(base, 0, 2, 4, 1);
    assert_int_equal(ndm_array_manager(v).id, c.id);
    assert_int_equal(check_live_bytes(m, 0), 40);
    assert_int_equal(check_live_bytes(c, 0), 0);
    assert_int_equal(check_live_bytes(root, NDM_STATS_SUBTREE), 40);
    assert_stats(m, 0, 3, 3, 0, 0, 0, 40, 40, 0, 0);
    /* m keeps the charge while it holds a view. */
    release_ok(base);
    release_ok(s);
    assert_int_equal(check_live_bytes(m, 0), 40);
    /* Its last view goes: the charge moves to the manager of a remaining view. */
    release_ok(al);
    assert_stats(m, 0, 0, 3, 3, 0, 0, 0, 40, 0, 0);
    assert_stats(c, 0, 1, 1, 0, 0, 0, 40, 40, 0, 0);
    assert_int_equal(check_live_bytes(root, NDM_STATS_SUBTREE), 40);
    release_ok(v);
    assert_int_equal(check_live_bytes(root, NDM_STATS_SUBTREE), 0);
    assert_int_equal(check_live_bytes(c, 0), 0);
    close_ok(m);
    close_ok(c);
}

static void test_stats_charge_follows_moves(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager m = ndm_manager_new(root, "m");
    ndm_manager c = ndm_manager_new(root, "c");
    ndm_manager d = ndm_manager_new(root, "d");
    ndm_array base = ndm_zeros(m, NDM_F32, NDM_SHAPE(10));
    ndm_array v = ndm_alias_to(c, base);
    /* m's only view moves to d: the charge goes with it. */
    assert_ok(ndm_attach(base, d));
    assert_int_equal(check_live_bytes(m, 0), 0);
    assert_int_equal(check_live_bytes(d, 0), 40);
    assert_int_equal(check_live_bytes(c, 0), 0);
    assert_stats(m, 0, 0, 1, 0, 0, 1, 0, 40, 0, 0);
    assert_stats(d, 0, 1, 0, 0, 1, 0, 40, 40, 0, 0);
    /* A second view joins d, then one of d's two leaves: d keeps it. */
    assert_ok(ndm_attach(v, d));
    assert_ok(ndm_detach(base));
    assert_int_equal(check_live_bytes(d, 0), 40);
    assert_int_equal(check_live_bytes(ndm_detached(), 0), 0);
    /* d's last view dies: the detached node holds the remaining view. */
    release_ok(v);
    assert_int_equal(check_live_bytes(d, 0), 0);
    assert_int_equal(check_live_bytes(ndm_detached(), 0), 40);
    release_ok(base);
    assert_int_equal(check_live_bytes(ndm_detached(), 0), 0);
    close_ok(m);
    close_ok(c);
    close_ok(d);
}

static void test_stats_errors(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_stats st;
    assert_st(ndm_manager_stats(NDM_NULL_MANAGER, NDM_CPU, 0, &st), NDM_E_NULL);
    assert_st(ndm_manager_stats(m, NDM_CPU, 0, NULL), NDM_E_INVALID);
    assert_st(ndm_manager_stats(m, NDM_CUDA(-1), 0, &st), NDM_E_DEVICE);
    assert_st(ndm_manager_stats(m, NDM_CUDA(1000), 0, &st), NDM_E_DEVICE);
    assert_st(ndm_manager_stats(m, ((ndm_device){(ndm_device_type)7, 0}), 0, &st), NDM_E_DEVICE);
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    assert_st(ndm_manager_stats(gone, NDM_CPU, 0, &st), NDM_E_CLOSED);
    assert_st(ndm_manager_stats(m, NDM_CPU, 4, &st), NDM_E_INVALID);
    assert_error_has("unknown flags");
    /* Another device is counted apart: nothing on cuda:0 here. Without one,
     * cuda:0 is refused, as every call on a missing device is: NDM_E_DEVICE
     * when a CUDA backend is there without the device, NDM_E_UNSUPPORTED
     * when there is no CUDA backend at all. */
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    if (ndm_cuda_device_count() > 0) {
        assert_ok(ndm_manager_stats(m, NDM_CUDA(0), 0, &st));
        assert_int_equal(st.live_bytes, 0);
        assert_int_equal(st.live_arrays, 1);
        assert_ok(ndm_manager_set_limit(m, NDM_CUDA(0), 1 << 20));
        assert_ok(ndm_manager_set_limit(m, NDM_CUDA(0), 0));
    } else {
        ndm_status want = ndm__backend_for(NDM_DEVICE_CUDA) ? NDM_E_DEVICE : NDM_E_UNSUPPORTED;
        assert_st(ndm_manager_stats(m, NDM_CUDA(0), 0, &st), want);
        assert_error_has("cuda:0");
        assert_st(ndm_manager_set_limit(m, NDM_CUDA(0), 1 << 20), want);
        assert_error_has("cuda:0");
        assert_int_equal(ndm_manager_limit(m, NDM_CUDA(0)), 0);
    }
    release_ok(a);
}

/* There is one CPU, device 0; ndm_manager_set_limit refuses cpu:1 too. */
static void test_stats_rejects_cpu_index(void **state)
{
    ndm_stats st;
    assert_st(ndm_manager_set_limit(ROOT(state), ((ndm_device){NDM_DEVICE_CPU, 1}), 1),
              NDM_E_DEVICE);
    assert_st(ndm_manager_stats(ROOT(state), ((ndm_device){NDM_DEVICE_CPU, 1}), 0, &st),
              NDM_E_DEVICE);
}

/* ---- the text dump ---------------------------------------------------------------- */

static char *dump_text(ndm_manager m)
{
    check_capture c;
    FILE *f = check_capture_open(&c);
    assert_ok(ndm_debug_dump(m, f));
    return (char *)check_capture_close(&c);
}

#define assert_dump(m, want)                                                    \
    do {                                                                        \
        char *got_ = dump_text(m);                                              \
        if (strcmp(got_, (want)) != 0) {                                        \
            print_error("got:\n%s\nexpected:\n%s\n", got_, (want));             \
            free(got_);                                                         \
            fail();                                                             \
        }                                                                       \
        free(got_);                                                             \
    } while (0)

static void test_dump_format_pinned(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_manager batch = ndm_manager_new(trainer, "batch-17");
    ndm_manager predictor = ndm_manager_new(model, "predictor");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(1024));
    ndm_array x = ndm_zeros(batch, NDM_F64, NDM_SHAPE(3));
    ndm_array y = ndm_ones(batch, NDM_U8, NDM_SHAPE(5));
    release_ok(y);
    (void)predictor;
    (void)w;
    (void)x;
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model         cpu     arrays 1 [new]  bytes 4096 [new]  created 1  released 0"
                "  peak 4096\n"
                "  trainer     cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
                "  peak 0\n"
                "    batch-17  cpu     arrays 1 [new]  bytes 24 [new]  created 2  released 1"
                "  peak 29\n"
                "  predictor   cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
                "  peak 0\n");
    close_ok(model);
}

/* Siblings of one name made at one line print as one line, "N × name",
 * with their sums and their site; their children fold the same way, and
 * the change at the next dump is against the same members' sums. */
static void test_dump_folds_repeated_siblings(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager req[40];
    int rline = 0, sline = 0;
    for (int i = 0; i < 40; i++) {
        rline = __LINE__; req[i] = ndm_manager_new(model, "request");
        (void)ndm_zeros(req[i], NDM_F32, NDM_SHAPE(4));
        if (i % 10 == 0) {
            sline = __LINE__; (void)ndm_manager_new(req[i], "scope");
        }
    }
    ndm_manager other = ndm_manager_new(model, "request"); /* another line: its own */
    char want[1024];
    snprintf(want, sizeof want,
             "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
             "model           cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
             "  peak 0\n"
             "  40 \u00d7 request  cpu     arrays 40 [new]  bytes 640 [new]  created 40"
             "  released 0  peak 640  made at test_debug.c:%d (%s)\n"
             "    4 \u00d7 scope   cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
             "  peak 0  made at test_debug.c:%d (%s)\n"
             "  request       cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
             "  peak 0\n",
             rline, __func__, sline, __func__);
    assert_dump(model, want);
    for (int i = 0; i < 20; i++)
        close_ok(req[i]);
    ndm_array a = ndm_zeros(model, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_attach(a, req[30]));
    /* 20 left: 20 arrays at the last dump, 21 now; the move shows */
    snprintf(want, sizeof want,
             "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
             "model           cpu     arrays 0 [=]  bytes 0 [=]  created 1 (+20 in closed"
             " children)  released 0 (+20 in closed children)  moved out 1  peak 8\n"
             "  20 \u00d7 request  cpu     arrays 21 [+1]  bytes 328 [+8]  created 20"
             "  released 0  moved in 1  peak 328  made at test_debug.c:%d (%s)\n"
             "    2 \u00d7 scope   cpu     arrays 0 [=]  bytes 0 [=]  created 0  released 0"
             "  peak 0  made at test_debug.c:%d (%s)\n"
             "  request       cpu     arrays 0 [=]  bytes 0 [=]  created 0  released 0"
             "  peak 0\n",
             rline, __func__, sline, __func__);
    assert_dump(model, want);
    (void)other;
    close_ok(model);
}

static void test_dump_deltas_on_second_dump(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array x = ndm_zeros(batch, NDM_F64, NDM_SHAPE(3));
    free(dump_text(model));
    ndm_array w1 = ndm_zeros(model, NDM_F32, NDM_SHAPE(8));
    ndm_array w2 = ndm_zeros(model, NDM_F32, NDM_SHAPE(2));
    release_ok(x);
    ndm_manager late = ndm_manager_new(batch, "late");
    (void)late;
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model     cpu     arrays 2 [+2]  bytes 40 [+40]  created 2  released 0"
                "  peak 40\n"
                "  batch   cpu     arrays 0 [-1]  bytes 0 [-24]  created 1  released 1"
                "  peak 24\n"
                "    late  cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0"
                "  peak 0\n");
    release_ok(w2);
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model     cpu     arrays 1 [-1]  bytes 32 [-8]  created 2  released 1"
                "  peak 40\n"
                "  batch   cpu     arrays 0 [=]  bytes 0 [=]  created 1  released 1  peak 24\n"
                "    late  cpu     arrays 0 [=]  bytes 0 [=]  created 0  released 0  peak 0\n");
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model     cpu     arrays 1 [=]  bytes 32 [=]  created 2  released 1  peak 40\n"
                "  batch   cpu     arrays 0 [=]  bytes 0 [=]  created 1  released 1  peak 24\n"
                "    late  cpu     arrays 0 [=]  bytes 0 [=]  created 0  released 0  peak 0\n");
    release_ok(w1);
    close_ok(model);
}

/* Each manager remembers its own last dump, whoever asked for it. */
static void test_dump_deltas_per_manager(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array x = ndm_zeros(batch, NDM_U8, NDM_SHAPE(3));
    free(dump_text(batch));
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model    cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0\n"
                "  batch  cpu     arrays 1 [=]  bytes 3 [=]  created 1  released 0  peak 3\n");
    release_ok(x);
    close_ok(model);
}

static void test_dump_marks(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager a = ndm_manager_new(model, "a");
    ndm_manager b = ndm_manager_new(model, "b");
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_cap(a, NDM_CAP_CHILDREN));
    assert_ok(ndm_manager_cap(b, NDM_CAP_ARRAYS | NDM_CAP_CHILDREN));
    assert_ok(ndm_manager_own(model, &freed_resources, free_resource, "r1"));
    assert_ok(ndm_manager_on_close(model, hook_ok, NULL));
    ndm_manager s = ndm_scope_begin(model, "step");
    assert_ok(ndm_manager_on_close(s, hook_ok, NULL));
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model   cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0"
                "  resources 2  capped(arrays)\n"
                "  a     cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0"
                "  capped(children)\n"
                "  b     cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0"
                "  capped(arrays,children)\n"
                "  step  cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0"
                "  resources 1  scope\n");
    assert_ok(ndm_scope_end(s, 0, NULL));
    close_ok(model);
}

static char *json_text(ndm_manager m)
{
    check_capture c;
    FILE *f = check_capture_open(&c);
    assert_ok(ndm_debug_dump_json(m, f));
    return (char *)check_capture_close(&c);
}

/* A closed child's lifetime counts stay in its parent's: on the parent's
 * line after its own, in the subtree statistics, in the JSON. */
static void test_dump_keeps_counts_of_closed_children(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(2));
    for (int step = 0; step < 3; step++) {
        ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_zeros(batch, NDM_F32, NDM_SHAPE(4));
        ndm_array y = ndm_ones(batch, NDM_F32, NDM_SHAPE(4));
        release_ok(y);
        /* a scope inside the step: its arrays count in the batch's totals */
        ndm_manager s = ndm_scope_begin(batch, "scope");
        ndm_array t = ndm_zeros(s, NDM_U8, NDM_SHAPE(1));
        (void)t;
        (void)x;
        assert_ok(ndm_scope_end(s, 0, NULL));
        close_ok(batch);
    }
    /* 3 steps x (2 in the batch + 1 in its scope), all released */
    assert_stats(trainer, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    assert_stats(trainer, NDM_STATS_SUBTREE, 0, 9, 9, 0, 0, 0, 0, 0, 0);
    assert_stats(model, NDM_STATS_SUBTREE, 1, 10, 9, 0, 0, 8, 8, 0, 1);
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model      cpu     arrays 1 [new]  bytes 8 [new]  created 1  released 0"
                "  peak 8\n"
                "  trainer  cpu     arrays 0 [new]  bytes 0 [new]"
                "  created 0 (+9 in closed children)  released 0 (+9 in closed children)"
                "  peak 0\n");
    /* closing the trainer hands all of it to the model */
    close_ok(trainer);
    assert_stats(model, NDM_STATS_SUBTREE, 1, 10, 9, 0, 0, 8, 8, 0, 0);
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model  cpu     arrays 1 [=]  bytes 8 [=]  created 1 (+9 in closed children)"
                "  released 0 (+9 in closed children)  peak 8\n");
    char *j = json_text(model);
    if (!strstr(j, "\"created\":1,\"released\":0,\"closed_created\":9,\"closed_released\":9,"))
        fail_msg("JSON lacks the closed children's counts:\n%s", j);
    free(j);
    release_ok(w);
    close_ok(model);
    /* and the test's manager keeps the model's lifetime */
    assert_stats(ROOT(state), NDM_STATS_SUBTREE, 0, 10, 10, 0, 0, 0, 0, 0, 0);
}

/* Arrays on loan and storage shared between managers are marked. */
static void test_dump_marks_loans_and_shared_storage(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager lender = ndm_manager_new(model, "lender");
    ndm_manager req = ndm_manager_new(model, "req");
    ndm_manager views = ndm_manager_new(model, "views");
    ndm_array a = ndm_zeros(lender, NDM_F32, NDM_SHAPE(4));
    ndm_array b = ndm_zeros(lender, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_temp_attach(a, req));
    assert_ok(ndm_temp_attach(b, req));
    /* two views of c's storage in another manager; d's views stay home */
    ndm_array c = ndm_zeros(lender, NDM_U8, NDM_SHAPE(6));
    ndm_array v1 = ndm_reshape_to(views, c, NDM_SHAPE(2, 3));
    ndm_array v2 = ndm_alias_to(views, c);
    ndm_array d = ndm_zeros(lender, NDM_U8, NDM_SHAPE(3));
    ndm_array d2 = ndm_alias(d);
    assert_live(v1);
    assert_live(v2);
    assert_live(d2);
    assert_dump(model,
                "ndm dump: system/test/model (arrays, bytes; [change since the previous dump])\n"
                "model     cpu     arrays 0 [new]  bytes 0 [new]  created 0  released 0  peak 0\n"
                "  lender  cpu     arrays 3 [new]  bytes 9 [new]  created 5  released 0  moved out 2"
                "  peak 24"
                "  lent 2  shared 1\n"
                "  req     cpu     arrays 2 [new]  bytes 24 [new]  created 0  released 0  moved in 2"
                "  peak 24"
                "  borrowed 2\n"
                "  views   cpu     arrays 2 [new]  bytes 0 [new]  created 2  released 0  peak 0"
                "  shared 2\n");
    char *j = json_text(model);
    const char *want[3] = {
        "\"path\":\"system/test/model/lender\"",
        "\"resources\":0,\"lent\":2,\"borrowed\":0,\"shared\":1,",
        "\"resources\":0,\"lent\":0,\"borrowed\":2,\"shared\":0,",
    };
    for (int i = 0; i < 3; i++)
        if (!strstr(j, want[i]))
            fail_msg("JSON lacks %s:\n%s", want[i], j);
    free(j);
    /* the loans end with the borrower */
    close_ok(req);
    assert_dump(lender,
                "ndm dump: system/test/model/lender (arrays, bytes; [change since the previous "
                "dump])\n"
                "lender  cpu     arrays 5 [+2]  bytes 33 [+24]  created 5  released 0  moved in 2"
                "  moved out 2  peak 33"
                "  shared 1\n");
    close_ok(model);
}

static void test_dump_errors(void **state)
{
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    close_ok(gone);
    assert_st(ndm_debug_dump(gone, stderr), NDM_E_CLOSED);
    ndm_clear_error(); /* a null handle keeps an earlier error */
    assert_st(ndm_debug_dump(NDM_NULL_MANAGER, stderr), NDM_E_NULL);
    assert_st(ndm_debug_dump(ROOT(state), NULL), NDM_E_INVALID);
    assert_st(ndm_debug_dump_json(gone, stderr), NDM_E_CLOSED);
    assert_st(ndm_debug_dump_json(ROOT(state), NULL), NDM_E_INVALID);
}

/* ---- JSON -------------------------------------------------------------------------- */

/* A small JSON reader: enough to prove the dump is well formed and to list
 * the keys of each manager object. */
typedef struct jreader {
    const char *p;
    bool ok;
    int managers;       /* objects that have a "children" key */
    bool keys_ok;       /* every manager object has exactly the expected keys */
} jreader;

static void j_ws(jreader *r)
{
    while (*r->p == ' ' || *r->p == '\n' || *r->p == '\t' || *r->p == '\r')
        r->p++;
}

static void j_value(jreader *r, char *string_out, size_t cap);

static void j_string(jreader *r, char *out, size_t cap)
{
    size_t n = 0;
    if (*r->p != '"') {
        r->ok = false;
        return;
    }
    r->p++;
    while (*r->p && *r->p != '"') {
        char c = *r->p++;
        if ((unsigned char)c < 0x20) {
            r->ok = false;
            return;
        }
        if (c == '\\') {
            char e = *r->p++;
            if (e == 'u') {
                for (int i = 0; i < 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", *r->p++) || !r->p[-1]) {
                        r->ok = false;
                        return;
                    }
                c = '?';
            } else if (strchr("\"\\/bfnrt", e) && e) {
                c = e;
            } else {
                r->ok = false;
                return;
            }
        }
        if (out && n + 1 < cap)
            out[n++] = c;
    }
    if (*r->p != '"') {
        r->ok = false;
        return;
    }
    r->p++;
    if (out && cap)
        out[n] = '\0';
}

static const char *const manager_keys[] = {
    "name", "path", "device", "scope", "capped", "live_arrays", "created", "released",
    "closed_created", "closed_released", "moved_in", "moved_out", "resources", "lent",
    "borrowed", "shared", "bytes", "children",
};
#define N_MANAGER_KEYS (sizeof manager_keys / sizeof *manager_keys)

static void j_object(jreader *r)
{
    char keys[32][32];
    int nk = 0;
    r->p++; /* '{' */
    j_ws(r);
    if (*r->p == '}') {
        r->p++;
        return;
    }
    for (;;) {
        j_ws(r);
        char key[32];
        j_string(r, key, sizeof key);
        if (!r->ok)
            return;
        if (nk < 32)
            snprintf(keys[nk++], sizeof keys[0], "%s", key);
        j_ws(r);
        if (*r->p++ != ':') {
            r->ok = false;
            return;
        }
        j_ws(r);
        j_value(r, NULL, 0);
        if (!r->ok)
            return;
        j_ws(r);
        if (*r->p == ',') {
            r->p++;
            continue;
        }
        if (*r->p == '}') {
            r->p++;
            break;
        }
        r->ok = false;
        return;
    }
    bool is_manager = false;
    for (int i = 0; i < nk; i++)
        is_manager |= strcmp(keys[i], "children") == 0;
    if (!is_manager)
        return;
    r->managers++;
    if (nk != (int)N_MANAGER_KEYS)
        r->keys_ok = false;
    for (size_t k = 0; k < N_MANAGER_KEYS; k++) {
        bool found = false;
        for (int i = 0; i < nk; i++)
            found |= strcmp(keys[i], manager_keys[k]) == 0;
        if (!found)
            r->keys_ok = false;
    }
}

static void j_value(jreader *r, char *string_out, size_t cap)
{
    j_ws(r);
    if (*r->p == '{') {
        j_object(r);
    } else if (*r->p == '[') {
        r->p++;
        j_ws(r);
        if (*r->p == ']') {
            r->p++;
            return;
        }
        for (;;) {
            j_value(r, NULL, 0);
            if (!r->ok)
                return;
            j_ws(r);
            if (*r->p == ',') {
                r->p++;
                continue;
            }
            if (*r->p++ != ']')
                r->ok = false;
            return;
        }
    } else if (*r->p == '"') {
        j_string(r, string_out, cap);
    } else if (!strncmp(r->p, "true", 4) || !strncmp(r->p, "null", 4)) {
        r->p += 4;
    } else if (!strncmp(r->p, "false", 5)) {
        r->p += 5;
    } else if (*r->p == '-' || (*r->p >= '0' && *r->p <= '9')) {
        char *end;
        strtod(r->p, &end);
        if (end == r->p)
            r->ok = false;
        r->p = end;
    } else {
        r->ok = false;
    }
}

static void test_dump_json_exact(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(4));
    ndm_array x = ndm_zeros(batch, NDM_U8, NDM_SHAPE(3));
    assert_ok(ndm_attach(x, model));
    ndm_array y = ndm_zeros(batch, NDM_U8, NDM_SHAPE(2));
    release_ok(y);
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    assert_ok(ndm_manager_on_close(batch, hook_ok, NULL));
    char *got = json_text(model);
    const char *want =
        "{\"name\":\"model\",\"path\":\"system/test/model\",\"device\":\"cpu\",\"scope\":false,"
        "\"capped\":[\"arrays\"],\"live_arrays\":2,\"created\":1,\"released\":0,"
        "\"closed_created\":0,\"closed_released\":0,\"moved_in\":1,"
        "\"moved_out\":0,\"resources\":0,\"lent\":0,\"borrowed\":0,\"shared\":0,"
        "\"bytes\":{\"cpu\":{\"live\":19,\"peak\":19}},"
        "\"children\":[{\"name\":\"batch\",\"path\":\"system/test/model/batch\","
        "\"device\":\"cpu\",\"scope\":false,\"capped\":[],\"live_arrays\":0,\"created\":2,"
        "\"released\":1,\"closed_created\":0,\"closed_released\":0,\"moved_in\":0,"
        "\"moved_out\":1,\"resources\":1,\"lent\":0,\"borrowed\":0,\"shared\":0,"
        "\"bytes\":{\"cpu\":{\"live\":0,\"peak\":3}},\"children\":[]}]}\n";
    if (strcmp(got, want) != 0) {
        print_error("got:\n%s\nexpected:\n%s\n", got, want);
        free(got);
        fail();
    }
    free(got);
    (void)w;
    close_ok(model);
}

static void test_dump_json_parses(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "we\"ird\\name\n");
    ndm_manager a = ndm_manager_new(model, "a");
    ndm_manager b = ndm_manager_new(a, "b");
    ndm_manager c = ndm_manager_new(model, "c");
    assert_ok(ndm_manager_cap(c, NDM_CAP_ARRAYS | NDM_CAP_CHILDREN));
    ndm_manager s = ndm_scope_begin(b, NULL);
    ndm_array x = ndm_ones(NDM_CURRENT_SCOPE, NDM_F64, NDM_SHAPE(7));
    assert_live(x);
    char *text = json_text(model);
    jreader r = {text, true, 0, true};
    j_value(&r, NULL, 0);
    j_ws(&r);
    assert_true(r.ok);
    assert_int_equal(*r.p, '\0');
    assert_int_equal(r.managers, 5);
    assert_true(r.keys_ok);
    /* Names are escaped, so the document survives odd characters. */
    assert_non_null(strstr(text, "\"name\":\"we\\\"ird\\\\name\\u000a\""));
    assert_non_null(strstr(text, "\"capped\":[\"arrays\",\"children\"]"));
    assert_non_null(strstr(text, "\"scope\":true"));
    assert_non_null(strstr(text, "\"bytes\":{\"cpu\":{\"live\":56,\"peak\":56}}"));
    free(text);
    assert_ok(ndm_scope_end(s, 0, NULL));
    close_ok(model);
}

/* Names hold any bytes: the JSON stays valid UTF-8, invalid bytes as
 * U+FFFD, control bytes escaped, valid multi-byte text kept. */
static void test_dump_json_is_utf8_whatever_the_names(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "bad\xff\x01name");
    ndm_manager a = ndm_manager_new(model, "\xc0\xaf\xed\xa0\x80\xe2\x82");
    ndm_manager b = ndm_manager_new(model, "caf\xc3\xa9\x7f");
    assert_live(a);
    assert_live(b);
    char *text = json_text(model);
    assert_true(test_utf8_valid(text));
    jreader r = {text, true, 0, true};
    j_value(&r, NULL, 0);
    j_ws(&r);
    assert_true(r.ok);
    assert_int_equal(*r.p, '\0');
    assert_int_equal(r.managers, 3);
    assert_non_null(strstr(text, "\"name\":\"bad\\ufffd\\u0001name\""));
    assert_non_null(strstr(text, "\"name\":\"\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\""));
    assert_non_null(strstr(text, "\"name\":\"caf\xc3\xa9\\u007f\""));
    free(text);
    close_ok(model);
}

/* ndm_debug_dump_why: the dump, then why the subtree's biggest sites are
 * alive, biggest first, none from outside the subtree. */
static void test_debug_dump_why_explains_the_top_sites(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    int big = __LINE__; ndm_array x = ndm_zeros(batch, NDM_F32, NDM_SHAPE(64, 16));
    ndm_array base = ndm_zeros(batch, NDM_F32, NDM_SHAPE(32, 16));
    int slice = __LINE__; ndm_array row = ndm_slice_to(model, base, 0, 0, 1, 1);
    release_ok(base); /* the slice keeps its 2 KiB alive */
    assert_live(x);
    int small = __LINE__; ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(4));
    int outside = __LINE__; ndm_array o = ndm_zeros(root, NDM_F64, NDM_SHAPE(4096));
    assert_live(row);
    assert_live(w);
    assert_live(o);
    char want[3][256];
    snprintf(want[0], sizeof want[0], "why alive: f32[64,16], made at test_debug.c:%d", big);
    snprintf(want[1], sizeof want[1], "why alive: f32[1,16], made at test_debug.c:%d", slice);
    snprintf(want[2], sizeof want[2], "why alive: f32[4], made at test_debug.c:%d", small);
    for (int top = 1; top <= 3; top++) {
        check_capture c;
        FILE *f = check_capture_open(&c);
        assert_ok(ndm_debug_dump_why(model, f, top));
        char *text = (char *)check_capture_close(&c);
        assert_true(strncmp(text, "ndm dump: system/test/model ", 28) == 0);
        const char *at = text;
        for (int i = 0; i < 3; i++) {
            const char *p = strstr(text, want[i]);
            if (i < top && (!p || p < at))
                fail_msg("top %d: \"%s\" missing or out of order in:\n%s", top, want[i], text);
            if (i >= top && p)
                fail_msg("top %d: \"%s\" is listed in:\n%s", top, want[i], text);
            at = p ? p : at;
        }
        char far[64];
        snprintf(far, sizeof far, "test_debug.c:%d", outside);
        assert_null(strstr(text, far));
        free(text);
    }
    assert_st(ndm_debug_dump_why(model, stderr, 0), NDM_E_INVALID);
    assert_error_has("top 0");
    assert_st(ndm_debug_dump_why(model, stderr, NDM_DUMP_WHY_MAX + 1), NDM_E_INVALID);
    assert_st(ndm_debug_dump_why(model, NULL, 1), NDM_E_INVALID);
    release_ok(o);
    close_ok(model);
    assert_st(ndm_debug_dump_why(model, stderr, 1), NDM_E_CLOSED);
}

/* ---- leak hunting since a mark -------------------------------------------------------- */

static char *report_text(ndm_manager m, ndm_seq mark)
{
    check_capture c;
    FILE *f = check_capture_open(&c);
    assert_ok(ndm_report_since(m, mark, f));
    return (char *)check_capture_close(&c);
}

static void test_report_since_groups_by_site(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array before = ndm_zeros(model, NDM_F32, NDM_SHAPE(8));
    ndm_seq mark = ndm_mark(root);
    assert_true(mark > 0);
    int loop_line = 0, big_line = 0, small_line = 0, gone_line = 0;
    for (int i = 0; i < 3; i++) {
        loop_line = __LINE__; ndm_array t = ndm_zeros(batch, NDM_F32, NDM_SHAPE(2));
        (void)t;
    }
    big_line = __LINE__; ndm_array big = ndm_zeros(model, NDM_F64, NDM_SHAPE(50));
    small_line = __LINE__; ndm_array small = ndm_zeros(model, NDM_U8, NDM_SHAPE(8));
    gone_line = __LINE__; ndm_array gone = ndm_zeros(model, NDM_U8, NDM_SHAPE(8));
    release_ok(gone);
    (void)big;
    (void)small;
    char want[1024];
    snprintf(want, sizeof want,
             "ndm report: 5 arrays created since mark %llu still alive under system/test\n"
             "  3 arrays, 24 bytes, created at test_debug.c:%d (%s) in system/test/model/batch\n"
             "  1 array, 400 bytes, created at test_debug.c:%d (%s) in system/test/model\n"
             "  1 array, 8 bytes, created at test_debug.c:%d (%s) in system/test/model\n",
             (unsigned long long)mark, loop_line, __func__, big_line, __func__, small_line,
             __func__);
    char *got = report_text(root, mark);
    if (strcmp(got, want) != 0) {
        print_error("got:\n%s\nexpected:\n%s\n", got, want);
        free(got);
        fail();
    }
    free(got);
    assert_null(strstr(want, "test_debug.c:0"));
    (void)gone_line;
    assert_int_equal(ndm_count_since(root, mark), 5);
    assert_int_equal(ndm_count_since(batch, mark), 3);
    /* Arrays made before the mark are not listed. */
    assert_int_equal(ndm_count_since(model, 0), 6);
    (void)before;
    close_ok(model);
}

static void test_report_since_nothing_new(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array old = ndm_zeros(root, NDM_F32, NDM_SHAPE(2));
    ndm_seq mark = ndm_mark(root);
    ndm_array tmp = ndm_zeros(root, NDM_F32, NDM_SHAPE(2));
    release_ok(tmp);
    char want[256];
    snprintf(want, sizeof want,
             "ndm report: 0 arrays created since mark %llu still alive under system/test\n",
             (unsigned long long)mark);
    char *got = report_text(root, mark);
    assert_string_equal(got, want);
    free(got);
    assert_int_equal(ndm_count_since(root, mark), 0);
    release_ok(old);
}

static void test_report_since_views_and_moves(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager other = ndm_manager_new(root, "other");
    ndm_array a = ndm_zeros(other, NDM_F32, NDM_SHAPE(4));
    ndm_seq mark = ndm_mark(root);
    /* A view made after the mark counts at its own site; an older array
     * moved after the mark does not. */
    ndm_array v = ndm_alias_to(root, a);
    assert_ok(ndm_attach(a, root));
    assert_int_equal(ndm_count_since(root, mark), 1);
    assert_int_equal(ndm_count_since(other, mark), 0);
    release_ok(v);
    release_ok(a);
    close_ok(other);
}

static char *leak_text(int64_t *count);

/* Arrays made by one line and moved where they are by two others are two
 * groups, each named by its creation and its move, as the growth tracker
 * names them; arrays made there stay a group of their own. */
static void test_report_since_names_moves(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager keep = ndm_manager_new(root, "keep");
    ndm_seq mark = ndm_mark(root);
    int made = 0, by_attach = 0, by_list = 0, here = 0;
    for (int i = 0; i < 5; i++) {
        ndm_manager batch = ndm_manager_new(root, "batch");
        made = __LINE__; ndm_array a = ndm_zeros(batch, NDM_F32, NDM_SHAPE(2));
        if (i < 3) {
            by_attach = __LINE__; assert_ok(ndm_attach(a, keep));
        } else {
            by_list = __LINE__; assert_ok(ndm_attach_all(keep, 1, &a));
        }
        close_ok(batch);
    }
    here = __LINE__; ndm_array b = ndm_zeros(keep, NDM_F32, NDM_SHAPE(2));
    (void)b;
    char want[1024];
    snprintf(want, sizeof want,
             "ndm report: 6 arrays created since mark %llu still alive under system/test\n"
             "  3 arrays, 24 bytes, created at test_debug.c:%d (%s), moved by ndm_attach at "
             "test_debug.c:%d (%s), in system/test/keep\n"
             "  2 arrays, 16 bytes, created at test_debug.c:%d (%s), moved by ndm_attach_all at "
             "test_debug.c:%d (%s), in system/test/keep\n"
             "  1 array, 8 bytes, created at test_debug.c:%d (%s) in system/test/keep\n",
             (unsigned long long)mark, made, __func__, by_attach, __func__, made, __func__,
             by_list, __func__, here, __func__);
    char *got = report_text(root, mark);
    if (strcmp(got, want) != 0) {
        print_error("got:\n%s\nexpected:\n%s\n", got, want);
        free(got);
        fail();
    }
    free(got);
    /* the leak report groups them the same way */
    int64_t n;
    char *text = leak_text(&n);
    char line[512];
    snprintf(line, sizeof line,
             "  2 arrays, 16 bytes, created at test_debug.c:%d (%s), moved by ndm_attach_all at "
             "test_debug.c:%d (%s), in system/test/keep\n",
             made, __func__, by_list, __func__);
    if (!strstr(text, line))
        fail_msg("leak report:\n%s\nlacks:\n%s", text, line);
    free(text);
    close_ok(keep);
}

static void test_report_since_errors(void **state)
{
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    ndm_seq mark = ndm_mark(gone);
    close_ok(gone);
    ndm_clear_error();
    assert_int_equal(ndm_mark(gone), 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(ndm_count_since(gone, mark), NDM_E_CLOSED);
    assert_st(ndm_report_since(gone, mark, stderr), NDM_E_CLOSED);
    assert_st(ndm_report_since(ROOT(state), mark, NULL), NDM_E_INVALID);
    ndm_clear_error(); /* a null handle keeps an earlier error */
    assert_int_equal(ndm_count_since(NDM_NULL_MANAGER, mark), NDM_E_NULL);
}

/* ---- leak reports ------------------------------------------------------------------------ */

static char *leak_text(int64_t *count)
{
    check_capture c;
    FILE *f = check_capture_open(&c);
    *count = ndm_leak_report(f);
    return (char *)check_capture_close(&c);
}

static void test_leak_report_lists_live(void **state)
{
    ndm_manager root = ROOT(state);
    int mline = __LINE__; ndm_manager req = ndm_manager_new(root, "req");
    int aline = __LINE__; ndm_array a = ndm_zeros(req, NDM_F32, NDM_SHAPE(2, 3));
    int dline = __LINE__; ndm_array d = ndm_zeros(req, NDM_I32, NDM_SHAPE(4));
    assert_ok(ndm_detach(d));
    (void)a;
    int64_t n;
    char *text = leak_text(&n);
    assert_int_equal(n, 2);
    char line[512];
    const char *expect[4];
    char buf[3][256];
    snprintf(buf[0], sizeof buf[0],
             "  1 array, 16 bytes, created at test_debug.c:%d (%s), moved by ndm_detach at "
             "test_debug.c:%d (%s), in system/detached\n",
             dline, __func__, dline + 1, __func__);
    snprintf(buf[1], sizeof buf[1], "  manager system/test/req created at test_debug.c:%d (%s)\n",
             mline, __func__);
    snprintf(buf[2], sizeof buf[2],
             "  1 array, 24 bytes, created at test_debug.c:%d (%s) in system/test/req\n", aline,
             __func__);
    expect[0] = "ndm leak report: 2 live managers, 2 live arrays\n";
    expect[1] = buf[0];
    expect[2] = "  manager system/test created at ";
    expect[3] = NULL;
    /* Header first, then the tree from the oldest node: detached, test, req. */
    const char *p = text;
    for (int i = 0; i < 3; i++) {
        if (strncmp(p, expect[i], strlen(expect[i])) != 0)
            fail_msg("leak report line %d: expected \"%s\" in:\n%s", i, expect[i], text);
        p = strchr(p, '\n') + 1;
    }
    snprintf(line, sizeof line, "%s%s", buf[1], buf[2]);
    if (strcmp(p, line) != 0)
        fail_msg("leak report ends with:\n%s\nexpected:\n%s", p, line);
    free(text);
    assert_int_equal(ndm_leak_report(NULL), 2);
    release_ok(d);
    close_ok(req);
}

/* 300 leaked managers made by one line, each with its arrays: one entry,
 * their arrays summed by site, not 300 of each. */
static void test_leak_report_folds_repeated_managers(void **state)
{
    ndm_manager root = ROOT(state);
    int mline = 0, aline = 0;
    for (int i = 0; i < 300; i++) {
        mline = __LINE__; ndm_manager req = ndm_manager_new(root, "request");
        aline = __LINE__; (void)ndm_zeros(req, NDM_F32, NDM_SHAPE(4));
    }
    int64_t n;
    char *text = leak_text(&n);
    assert_int_equal(n, 300);
    char want[512];
    snprintf(want, sizeof want,
             "  300 \u00d7 manager system/test/request created at test_debug.c:%d (%s)\n"
             "  300 arrays, 4800 bytes, created at test_debug.c:%d (%s) in system/test/request\n",
             mline, __func__, aline, __func__);
    if (!strstr(text, want))
        fail_msg("leak report:\n%s\nlacks:\n%s", text, want);
    int lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 4); /* the header, system/test, and the two above */
    assert_true(strstr(text, "ndm leak report: 301 live managers, 300 live arrays\n") == text);
    free(text);
    close_ok(root);
}

static void test_leak_report_nothing_alive(void **state)
{
    close_ok(ROOT(state));
    int64_t n;
    char *text = leak_text(&n);
    assert_int_equal(n, 0);
    assert_string_equal(text, "ndm leak report: nothing alive\n");
    free(text);
}

/* Run the leak_child program next to this test with NDM_LEAK_REPORT set to
 * `value` (NULL: unset); returns its exit status and what it wrote. */
static int run_leak_child(const char *value, char **out, char **err)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 32);
    assert_true(len > 0);
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    assert_non_null(slash);
    strcpy(slash + 1, "leak_child");
    char setting[64];
    snprintf(setting, sizeof setting, "NDM_LEAK_REPORT=%s", value ? value : "");
    const char *drop[] = {"NDM_LEAK_REPORT=", NULL};
    const char *add[] = {value ? setting : NULL, NULL};
    char *argv[] = {self, NULL};
    child_run r = child_run_of(argv, drop, add);
    *out = r.out;
    *err = r.err;
    return r.status < 0 ? -1 : r.status;
}

static void test_leak_report_at_exit(void **state)
{
    (void)state;
    char *out, *err;
    int rc = run_leak_child("1", &out, &err);
    if (rc != 0)
        fail_msg("leak_child exited with %d: %s", rc, err);
    int mline = 0, aline = 0, lline = 0;
    assert_int_equal(sscanf(out, "manager %d\narray %d\nloop %d", &mline, &aline, &lline), 3);
    /* one line per creation site, the largest group first */
    char want[512];
    snprintf(want, sizeof want,
             "ndm leak report: 1 live manager, 321 live arrays\n"
             "  manager system/leaky created at leak_child.c:%d (main)\n"
             "  320 arrays, 5120 bytes, created at leak_child.c:%d (main) in system/leaky\n"
             "  1 array, 24 bytes, created at leak_child.c:%d (main) in system/leaky\n",
             mline, lline, aline);
    if (!strstr(err, want))
        fail_msg("stderr of leak_child:\n%s\nlacks:\n%s", err, want);
    free(out);
    free(err);
}

/* NDM_LEAK_REPORT=why: the report, then why the largest sites' arrays are
 * alive, each with its owners' opening lines. */
static void test_leak_report_why_at_exit(void **state)
{
    (void)state;
    char *out, *err;
    int rc = run_leak_child("why", &out, &err);
    if (rc != 0)
        fail_msg("leak_child exited with %d: %s", rc, err);
    int mline = 0, aline = 0, lline = 0;
    assert_int_equal(sscanf(out, "manager %d\narray %d\nloop %d", &mline, &aline, &lline), 3);
    char want[256];
    assert_non_null(strstr(err, "ndm leak report: 1 live manager, 321 live arrays\n"));
    /* the 320 small arrays hold 320 x 16 bytes, the one f32[2,3] 24: that
     * site comes first */
    snprintf(want, sizeof want, "why alive: i32[4], made at leak_child.c:%d (main)\n", lline);
    const char *first = strstr(err, want);
    if (!first)
        fail_msg("stderr of leak_child:\n%s\nlacks:\n%s", err, want);
    snprintf(want, sizeof want, "'leaky' opened at leak_child.c:%d (main)", mline);
    assert_non_null(strstr(first, want));
    snprintf(want, sizeof want, "why alive: f32[2,3], made at leak_child.c:%d (main)\n", aline);
    const char *second = strstr(err, want);
    assert_non_null(second);
    assert_true(second > first);
    free(out);
    free(err);
}

static void test_leak_report_off_by_default(void **state)
{
    (void)state;
    const char *values[] = {NULL, "0", ""};
    for (int i = 0; i < 3; i++) {
        char *out, *err;
        assert_int_equal(run_leak_child(values[i], &out, &err), 0);
        if (strstr(err, "ndm leak report"))
            fail_msg("NDM_LEAK_REPORT=%s printed a report:\n%s", values[i] ? values[i] : "(unset)",
                     err);
        free(out);
        free(err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_stats_own_figures),
        TEST(test_stats_subtree_figures),
        TEST(test_stats_peak_stays),
        TEST(test_stats_shared_storage_counted_once),
        TEST(test_stats_charge_follows_moves),
        TEST(test_stats_errors),
        TEST(test_stats_rejects_cpu_index),
        TEST(test_dump_format_pinned),
        TEST(test_dump_folds_repeated_siblings),
        TEST(test_dump_deltas_on_second_dump),
        TEST(test_dump_deltas_per_manager),
        TEST(test_dump_marks),
        TEST(test_dump_keeps_counts_of_closed_children),
        TEST(test_dump_marks_loans_and_shared_storage),
        TEST(test_dump_errors),
        TEST(test_dump_json_exact),
        TEST(test_dump_json_parses),
        TEST(test_dump_json_is_utf8_whatever_the_names),
        TEST(test_report_since_groups_by_site),
        TEST(test_report_since_nothing_new),
        TEST(test_report_since_views_and_moves),
        TEST(test_report_since_names_moves),
        TEST(test_debug_dump_why_explains_the_top_sites),
        TEST(test_report_since_errors),
        TEST(test_leak_report_lists_live),
        TEST(test_leak_report_folds_repeated_managers),
        TEST(test_leak_report_nothing_alive),
        TEST(test_leak_report_at_exit),
        TEST(test_leak_report_why_at_exit),
        TEST(test_leak_report_off_by_default),
    };
    return cmocka_run_group_tests_name("debug", tests, NULL, NULL);
}
