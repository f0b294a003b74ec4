/* ndm_why_alive: the retention path of an array (its owners, the views that
 * keep its storage, what each of them is), in text and JSON, its errors, and
 * a race with threads that make and release views of the same storage. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "helpers.h"

/* The text ndm_why_alive (or its JSON form) prints for a; the caller frees it. */
static char *why_text(ndm_array a, bool json)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    if (json)
        assert_ok(ndm_why_alive_json(a, f));
    else
        assert_ok(ndm_why_alive(a, f));
    fclose(f);
    return buf;
}

#define assert_has(text, needle)                                                \
    do {                                                                        \
        if (!strstr((text), (needle)))                                          \
            fail_msg("\"%s\" lacks \"%s\"", (text), (needle));                  \
    } while (0)
#define assert_lacks(text, needle)                                              \
    do {                                                                        \
        if (strstr((text), (needle)))                                           \
            fail_msg("\"%s\" has \"%s\"", (text), (needle));                    \
    } while (0)

/* "test_why.c:N" for a line of this file. */
static const char *here(int line)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "test_why.c:%d", line);
    return buf;
}

static void test_plain_array_names_its_owners_opening_lines(void **state)
{
    int l_stats = __LINE__ + 1;
    ndm_manager stats = ndm_manager_new(ROOT(state), "stats");
    int l_a = __LINE__ + 1;
    ndm_array a = ndm_zeros(stats, NDM_F32, NDM_SHAPE(10));
    assert_live(a);
    char *t = why_text(a, false);
    assert_has(t, "why alive: f32[10], made at ");
    assert_has(t, here(l_a));
    /* the owner chain, root first, each manager at the line that opened it */
    assert_has(t, "'system'");
    assert_has(t, "'stats' opened at ");
    assert_has(t, here(l_stats));
    assert_has(t, "owned by system/test/stats");
    assert_has(t, "storage: 40 bytes, charged to system/test/stats");
    assert_has(t, "no other view holds the storage");
    assert_lacks(t, "pins");
    free(t);
    assert_ok(ndm_manager_close(stats));
}

static void test_slice_names_the_base_and_the_bytes_it_pins(void **state)
{
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_manager keep = ndm_manager_new(ROOT(state), "keep");
    int l_base = __LINE__ + 1;
    ndm_array base = ndm_zeros(batch, NDM_F32, NDM_SHAPE(1024, 1024));
    int l_row = __LINE__ + 1;
    ndm_array row = ndm_slice_to(keep, base, 0, 0, 1, 1);
    assert_live(base);
    assert_live(row);
    char *t = why_text(row, false);
    assert_has(t, "why alive: f32[1,1024]");
    assert_has(t, here(l_row));
    assert_has(t, "owned by system/test/keep");
    assert_has(t, "storage: 4.0 MiB, charged to system/test/batch");
    assert_has(t, "this array's elements are 4096 bytes, so it pins 4.0 MiB more");
    assert_has(t, "1 other view holds the storage");
    assert_has(t, "f32[1024,1024], the array that made the storage, in system/test/batch");
    assert_has(t, here(l_base));
    free(t);
    /* asked of the base: the slice is what else holds it */
    t = why_text(base, false);
    assert_has(t, "f32[1,1024], a view, in system/test/keep");
    assert_has(t, here(l_row));
    free(t);
    /* the batch closes: the slice alone pins the whole storage now */
    assert_ok(ndm_manager_close(batch));
    t = why_text(row, false);
    assert_has(t, "storage: 4.0 MiB");
    assert_has(t, "so it pins 4.0 MiB more");
    assert_has(t, "no other view holds the storage: releasing this array frees it");
    free(t);
    t = why_text(row, true);
    assert_has(t, "\"pinned_beyond_elements\":4190208,\"stream_uses\":0}");
    assert_has(t, "\"held_by\":[]");
    free(t);
    assert_ok(ndm_manager_close(keep));
}

static void test_autograd_graph_and_loans_are_named(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager step = ndm_manager_new(ROOT(state), "step");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(4));
    assert_live(w);
    assert_ok(ndm_requires_grad(w));
    assert_ok(ndm_grad_begin(step));
    ndm_array x = ndm_full(step, NDM_F32, 2.0, NDM_SHAPE(4));
    int l_mul = __LINE__ + 1;
    ndm_array y = ndm_mul(x, w);
    assert_live(y);
    char *t = why_text(w, false);
    assert_has(t, "saved by an autograd graph, in system/test/step/graph, made at ");
    assert_has(t, here(l_mul));
    free(t);
    t = why_text(w, true);
    assert_has(t, "\"role\":\"autograd\"");
    assert_has(t, "\"role\":\"self\"");
    free(t);
    assert_ok(ndm_grad_end());
    /* a loan: the borrowed array says where it goes back */
    ndm_manager req = ndm_manager_new(ROOT(state), "request");
    ndm_array v = ndm_zeros(model, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_temp_attach(v, req));
    t = why_text(v, false);
    assert_has(t, "owned by system/test/request, moved there by ndm_temp_attach at ");
    assert_has(t, " (borrowed: it goes back to system/test/model when that manager closes)");
    free(t);
    t = why_text(v, true);
    assert_has(t, "\"lender\":\"system/test/model\"");
    free(t);
    assert_ok(ndm_manager_close(req));
    assert_ok(ndm_manager_close(step));
    assert_ok(ndm_manager_close(model));
}

static void test_bad_calls_are_refused(void **state)
{
    ndm_array a = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(2));
    assert_live(a);
    assert_status(ndm_why_alive(a, NULL), NDM_E_INVALID);
    assert_error_has("FILE is NULL");
    assert_error_has("ndm_why_alive");
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    ndm_clear_error(); /* (a null handle keeps an earlier error: status.h) */
    assert_status(ndm_why_alive(NDM_NULL_ARRAY, f), NDM_E_NULL);
    assert_error_has("ndm_why_alive");
    ndm_array forged = {a.id ^ 0x0000400000000000ull};
    assert_true(ndm_why_alive_json(forged, f) < 0);
    assert_ok(ndm_array_release(a));
    int l_stale = __LINE__ + 1;
    assert_status(ndm_why_alive(a, f), NDM_E_CLOSED);
    assert_error_has(here(l_stale));
    fclose(f);
    assert_manager_empty(ROOT(state));
}

/* Threads make and release views of one storage (and close managers that
 * hold them) while another asks why the base is alive, again and again. */
typedef struct race {
    ndm_manager root;
    ndm_array base;
    atomic_int stop;
} race;

static void *churn(void *p)
{
    race *r = p;
    while (!atomic_load(&r->stop)) {
        ndm_manager m = ndm_manager_new(r->root, "churn");
        if (!m.id)
            continue;
        /* (a borrower too: loans start and end while the views are read) */
        ndm_manager b = ndm_manager_new(r->root, "borrower");
        for (int i = 0; i < 8; i++) {
            ndm_array v = ndm_slice_to(m, r->base, 0, i, i + 1, 1);
            if (v.id && (i & 1))
                (void)!ndm_array_release(v);
            else if (v.id && b.id && i % 4 == 0)
                (void)!ndm_temp_attach(v, b);
        }
        (void)!ndm_manager_close(b);
        (void)!ndm_manager_close(m);
    }
    return NULL;
}

static void test_why_alive_races_with_views_dying(void **state)
{
    race r = {ROOT(state), ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(16, 4)), 0};
    assert_live(r.base);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, churn, &r), 0);
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    for (int k = 0; k < 2000; k++) {
        assert_ok(ndm_why_alive(r.base, f));
        assert_ok(ndm_why_alive_json(r.base, f));
    }
    atomic_store(&r.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    fclose(f);
    char *t = why_text(r.base, false);
    assert_has(t, "no other view holds the storage");
    free(t);
    assert_ok(ndm_array_release(r.base));
    assert_manager_empty(ROOT(state));
}

/* A move's line is told where the array now lives: a list attach, a scope's
 * kept result, and nothing once a loan has gone back to its lender. */
static void test_moves_are_named_at_their_line(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager batch = ndm_manager_new(ROOT(state), "batch");
    ndm_array a = ndm_zeros(batch, NDM_F32, NDM_SHAPE(2));
    ndm_array b = ndm_zeros(batch, NDM_F32, NDM_SHAPE(3));
    int l_list = __LINE__ + 1;
    assert_ok(ndm_attach_all(model, NDM_ARRAYS(a, b)));
    char *t = why_text(b, false);
    assert_has(t, "owned by system/test/model, moved there by ndm_attach_all at ");
    assert_has(t, here(l_list));
    free(t);
    t = why_text(b, true);
    assert_has(t, "\"moved\":{\"by\":\"ndm_attach_all\",\"at\":{\"file\":");
    free(t);
    /* a scope's kept result: moved at the scope's end */
    ndm_manager s = ndm_scope_begin(batch, "step");
    ndm_array y = ndm_ones(s, NDM_F32, NDM_SHAPE(4));
    int l_end = __LINE__ + 1;
    assert_ok(ndm_scope_end(s, 1, &y));
    t = why_text(y, false);
    assert_has(t, "owned by system/test/batch, moved there by a scope's end at ");
    assert_has(t, here(l_end));
    free(t);
    /* lent, then given back when the borrower closes: made there, no move told */
    ndm_manager req = ndm_manager_new(ROOT(state), "request");
    assert_ok(ndm_temp_attach(y, req));
    assert_ok(ndm_manager_close(req));
    t = why_text(y, false);
    assert_has(t, "owned by system/test/batch\n");
    free(t);
    /* a plain array made where it lives: no move */
    t = why_text(ndm_zeros(model, NDM_F32, NDM_SHAPE(1)), false);
    assert_lacks(t, "moved there");
    free(t);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* The log's warnings, kept for the test below. */
static char warned[2048];
static void keep_warnings(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level == NDM_LOG_WARN)
        snprintf(warned, sizeof warned, "%s", msg);
}

static void test_a_second_release_is_logged_with_both_lines(void **state)
{
    ndm_set_log_fn(keep_warnings, NULL);
    warned[0] = 0;
    int l_made = __LINE__ + 1;
    ndm_array a = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(5));
    int l_first = __LINE__ + 1;
    assert_ok(ndm_array_release(a));
    assert_true(warned[0] == 0);
    int l_again = __LINE__ + 1;
    assert_status(ndm_array_release(a), NDM_ALREADY);
    ndm_set_log_fn(NULL, NULL);
    assert_has(warned, "ndm_array_release: released twice: array f32[5] created at ");
    assert_has(warned, here(l_made));
    assert_has(warned, "was released at ");
    assert_has(warned, here(l_first));
    assert_has(warned, "; again at ");
    assert_has(warned, here(l_again));
    /* released by its manager's close first: a later release is an owner's
     * ordinary cleanup (C++ owners do it), not logged */
    ndm_set_log_fn(keep_warnings, NULL);
    warned[0] = 0;
    ndm_manager m = ndm_manager_new(ROOT(state), "batch");
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(5));
    assert_ok(ndm_manager_close(m));
    assert_status(ndm_array_release(b), NDM_ALREADY);
    ndm_set_log_fn(NULL, NULL);
    assert_true(warned[0] == 0);
    assert_manager_empty(ROOT(state));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_plain_array_names_its_owners_opening_lines),
        TEST(test_slice_names_the_base_and_the_bytes_it_pins),
        TEST(test_autograd_graph_and_loans_are_named),
        TEST(test_bad_calls_are_refused),
        TEST(test_why_alive_races_with_views_dying),
        TEST(test_a_second_release_is_logged_with_both_lines),
        TEST(test_moves_are_named_at_their_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
