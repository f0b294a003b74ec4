/* Status codes and errors: names and texts, the thread's last error (set,
 * kept, cleared, per thread), the text of messages, and the log callback. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "array_check.h"

/* ---- names and texts ---------------------------------------------------------------- */

typedef struct status_row {
    int value;
    const char *name;
    const char *text;
} status_row;

#define STATUS_ROW(name, value, text) {value, "NDM_" #name, text},
static const status_row status_rows[] = {NDM_STATUS_LIST(STATUS_ROW)};
#undef STATUS_ROW
#define N_STATUS (sizeof status_rows / sizeof *status_rows)

static void test_status_every_name_and_text(void **state)
{
    (void)state;
    assert_int_equal(N_STATUS, 23);
    for (size_t i = 0; i < N_STATUS; i++) {
        ndm_status s = (ndm_status)status_rows[i].value;
        assert_string_equal(ndm_status_name(s), status_rows[i].name);
        assert_string_equal(ndm_status_str(s), status_rows[i].text);
        assert_true(strlen(status_rows[i].text) > 0);
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(status_rows[i].value, status_rows[j].value);
            assert_string_not_equal(status_rows[i].name, status_rows[j].name);
        }
    }
    assert_string_equal(ndm_status_name(NDM_OK), "NDM_OK");
    assert_string_equal(ndm_status_str(NDM_OK), "success");
    assert_string_equal(ndm_status_name(NDM_ALREADY), "NDM_ALREADY");
    assert_string_equal(ndm_status_name(NDM_E_CLOSED), "NDM_E_CLOSED");
    assert_string_equal(ndm_status_str(NDM_E_QUOTA), "manager byte limit exceeded");
    assert_string_equal(ndm_status_name(NDM_E_INTERNAL), "NDM_E_INTERNAL");
}

/* The values are part of the ABI: 0 is success, NDM_ALREADY is positive,
 * errors are negative and never renumbered. */
static void test_status_values_are_stable(void **state)
{
    (void)state;
    const int want[] = {
        NDM_OK, 0, NDM_ALREADY, 1, NDM_E_INVALID, -1, NDM_E_NULL, -2, NDM_E_CLOSED, -3,
        NDM_E_SHAPE, -4, NDM_E_DTYPE, -5, NDM_E_DEVICE, -6, NDM_E_AXIS, -7, NDM_E_OVERFLOW, -8,
        NDM_E_OOM, -9, NDM_E_QUOTA, -10, NDM_E_CAPPED, -11, NDM_E_NOT_OWNER, -12,
        NDM_E_ROOT, -13, NDM_E_HOOK, -14, NDM_E_UNSUPPORTED, -15, NDM_E_IO, -16,
        NDM_E_FORMAT, -17, NDM_E_CONFIG, -18, NDM_E_INTERNAL, -19,
        NDM_E_TIMEOUT, -20, NDM_E_BUSY, -21,
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i += 2)
        assert_int_equal(want[i], want[i + 1]);
    for (size_t i = 0; i < N_STATUS; i++) {
        const char *n = status_rows[i].name;
        if (!strncmp(n, "NDM_E_", 6))
            assert_true(status_rows[i].value < 0);
        else
            assert_true(status_rows[i].value >= 0);
    }
}

static void test_status_unknown_values(void **state)
{
    (void)state;
    const int unknown[] = {2, 7, -22, -1000, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        assert_string_equal(ndm_status_name((ndm_status)unknown[i]), "NDM_UNKNOWN");
        assert_string_equal(ndm_status_str((ndm_status)unknown[i]), "unknown status");
    }
}

/* ---- the thread's last error -------------------------------------------------------------- */

static void test_last_error_set_on_failure(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_clear_error();
    int line = __LINE__; ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, -1));
    assert_null(a.id);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    char want[256];
    snprintf(want, sizeof want, "ndm_zeros: negative size -1 on axis 1 [at test_status.c:%d (%s)]",
             line, __func__);
    assert_string_equal(ndm_last_error(), want);
    /* Status-returning calls set it too. */
    ndm_clear_error();
    assert_st(ndm_array_release(NDM_NULL_ARRAY), NDM_E_NULL);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    assert_error_has("ndm_array_release: null array handle");
}

static void test_last_error_kept_across_success(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_zeros(m, (ndm_dtype)99, NDM_SHAPE(2)), NDM_E_DTYPE);
    char first[1024];
    snprintf(first, sizeof first, "%s", ndm_last_error());
    ndm_array a = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    ndm_array v = ndm_reshape(a, NDM_SHAPE(3, 1));
    ndm_manager c = ndm_manager_new(m, "child");
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    release_ok(v);
    release_ok(a);
    close_ok(c);
    /* NDM_ALREADY is not a failure either. */
    assert_int_equal(ndm_array_release(a), NDM_ALREADY);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_string_equal(ndm_last_error(), first);
}

static void test_last_error_replaced_by_next_failure(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_zeros(m, NDM_F32, NDM_SHAPE(-1)), NDM_E_SHAPE);
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    ndm_array a = ndm_zeros(gone, NDM_F32, NDM_SHAPE(1));
    assert_null(a.id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("ndm_zeros: stale manager handle: manager 'system/test/gone'");
    assert_null(strstr(ndm_last_error(), "negative size"));
}

static void test_last_error_cleared(void **state)
{
    ndm_manager m = ROOT(state);
    assert_fails(ndm_zeros(m, NDM_F32, NDM_SHAPE(-1)), NDM_E_SHAPE);
    ndm_clear_error();
    assert_int_equal(ndm_last_status(), NDM_OK);
    assert_string_equal(ndm_last_error(), "");
    ndm_clear_error();
    assert_int_equal(ndm_last_status(), NDM_OK);
}

typedef struct thread_view {
    ndm_status before, after;
    char before_msg[64];
    char after_msg[1024];
    ndm_manager m;
} thread_view;

static void *fail_in_thread(void *p)
{
    thread_view *t = p;
    t->before = ndm_last_status();
    snprintf(t->before_msg, sizeof t->before_msg, "%s", ndm_last_error());
    ndm_array a = ndm_zeros(t->m, NDM_F32, NDM_SHAPE(3, 4, -7));
    (void)a;
    t->after = ndm_last_status();
    snprintf(t->after_msg, sizeof t->after_msg, "%s", ndm_last_error());
    return NULL;
}

static void test_last_error_per_thread(void **state)
{
    ndm_manager m = ROOT(state);
    /* This thread's error is not seen there, and theirs not here. */
    assert_fails(ndm_from_buffer(m, NDM_F32, NULL, NDM_SHAPE(2)), NDM_E_INVALID);
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", ndm_last_error());
    thread_view t = {.m = m};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fail_in_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(t.before, NDM_OK);
    assert_string_equal(t.before_msg, "");
    assert_int_equal(t.after, NDM_E_SHAPE);
    assert_non_null(strstr(t.after_msg, "negative size -7 on axis 2"));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_string_equal(ndm_last_error(), mine);
    /* And with this thread clear, the other's failure still does not show. */
    ndm_clear_error();
    assert_int_equal(pthread_create(&th, NULL, fail_in_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(ndm_last_status(), NDM_OK);
    assert_string_equal(ndm_last_error(), "");
}

/* ---- messages ----------------------------------------------------------------------------- */

static void test_error_message_drops_at_suffix(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(1));
    ndm_clear_error();
    assert_null(ndm_manager_new(gone, "x").id);
    assert_true(!strncmp(ndm_last_error(), "ndm_manager_new: ", 17));
    assert_st(ndm_attach(a, gone), NDM_E_CLOSED);
    assert_true(!strncmp(ndm_last_error(), "ndm_attach: ", 12));
    ndm_clear_error(); /* a null handle would keep the error above */
    assert_st(ndm_manager_close(NDM_NULL_MANAGER), NDM_E_NULL);
    assert_true(!strncmp(ndm_last_error(), "ndm_manager_close: ", 19));
    assert_st(ndm_scope_end(m, 0, NULL), NDM_E_INVALID);
    assert_true(!strncmp(ndm_last_error(), "ndm_scope_end: ", 15));
    assert_null(ndm_arange(m, NDM_F32, 0, 1, 0).id);
    assert_true(!strncmp(ndm_last_error(), "ndm_arange: ", 12));
    assert_null(strstr(ndm_last_error(), "_at:"));
    release_ok(a);
}

static void test_error_message_names_site(void **state)
{
    ndm_manager m = ROOT(state);
    /* A wrapper passes its own caller's site; only the file's base name shows. */
    ndm_array a = ndm_zeros_at("some/dir/model_loader.c", 321, "load_layer", m, NDM_F32,
                               NDM_SHAPE(-2));
    assert_null(a.id);
    assert_string_equal(
        ndm_last_error(),
        "ndm_zeros: negative size -2 on axis 0 [at model_loader.c:321 (load_layer)]");
    int line = __LINE__; assert_st(ndm_manager_close(ndm_system()), NDM_E_ROOT);
    char tail[128];
    snprintf(tail, sizeof tail, " [at test_status.c:%d (%s)]", line, __func__);
    const char *msg = ndm_last_error();
    assert_true(strlen(msg) > strlen(tail));
    assert_string_equal(msg + strlen(msg) - strlen(tail), tail);
    assert_error_has("ndm_manager_close: the built-in manager 'system' cannot be closed");
}

/* The last error must be "<api>: ..." and end with this test file's line
 * `line` in `func`: the function the user called, at the user's line. */
#define assert_error_at(api, line, func)                                        \
    do {                                                                        \
        char tail_[160];                                                        \
        snprintf(tail_, sizeof tail_, " [at test_status.c:%d (%s)]", (line), (func)); \
        const char *msg_ = ndm_last_error();                                    \
        size_t n_ = strlen(msg_), t_ = strlen(tail_), a_ = strlen(api);         \
        if (strncmp(msg_, api, a_) || strncmp(msg_ + a_, ": ", 2) || n_ < t_ || \
            strcmp(msg_ + n_ - t_, tail_))                                      \
            fail_msg("last error \"%s\" is not \"%s: ...%s\"", msg_, (api), tail_); \
    } while (0)

/* ndm_item and ndm_item_i64 report their failures at the caller's line:
 * a stale handle, more than one element, a NULL out. */
static void test_error_site_item(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array three = ndm_ones(m, NDM_F32, NDM_SHAPE(3));
    ndm_array one = ndm_ones(m, NDM_I32, NDM_SHAPE(1, 1));
    ndm_array gone = ndm_zeros(m, NDM_F32, NDM_SCALAR);
    assert_live(three);
    assert_live(one);
    release_ok(gone);
    double v = 7;
    int64_t i = 7;
    int line = __LINE__; assert_st(ndm_item(three, &v), NDM_E_SHAPE);
    assert_error_at("ndm_item", line, __func__);
    assert_error_has("item() needs exactly one element");
    line = __LINE__; assert_st(ndm_item(gone, &v), NDM_E_CLOSED);
    assert_error_at("ndm_item", line, __func__);
    assert_error_has("stale array handle");
    assert_true(v == 7);
    line = __LINE__; assert_st(ndm_item_i64(one, NULL), NDM_E_INVALID);
    assert_error_at("ndm_item_i64", line, __func__);
    line = __LINE__; assert_st(ndm_item_i64(three, &i), NDM_E_SHAPE);
    assert_error_at("ndm_item_i64", line, __func__);
    assert_true(i == 7);
    /* a wrapper passes its own caller's site */
    assert_st(ndm_item_at("src/loss.c", 53, "picked_mean", three, &v), NDM_E_SHAPE);
    assert_true(!strncmp(ndm_last_error(), "ndm_item: ", 10));
    assert_non_null(strstr(ndm_last_error(), " [at loss.c:53 (picked_mean)]"));
    /* and the calls still work */
    assert_ok(ndm_item_i64(one, &i));
    assert_int_equal(i, 1);
    release_ok(three);
    release_ok(one);
    assert_manager_empty(m);
}

/* ndm_array_copy_out and ndm_array_copy_in: a wrong size, a NULL buffer and
 * a stale handle name the call and the caller's line. */
static void test_error_site_copy_out(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_arange(m, NDM_F32, 0, 6, 1);
    assert_live(a);
    float buf[6] = {0};
    int line = __LINE__; assert_st(ndm_array_copy_out(a, buf, 5 * sizeof *buf), NDM_E_INVALID);
    assert_error_at("ndm_array_copy_out", line, __func__);
    line = __LINE__; assert_st(ndm_array_copy_out(a, NULL, sizeof buf), NDM_E_INVALID);
    assert_error_at("ndm_array_copy_out", line, __func__);
    line = __LINE__; assert_st(ndm_array_copy_in(a, buf, 7 * sizeof *buf), NDM_E_INVALID);
    assert_error_at("ndm_array_copy_in", line, __func__);
    assert_ok(ndm_array_copy_out(a, buf, sizeof buf));
    assert_true(buf[5] == 5.0f);
    release_ok(a);
    line = __LINE__; assert_st(ndm_array_copy_out(a, buf, sizeof buf), NDM_E_CLOSED);
    assert_error_at("ndm_array_copy_out", line, __func__);
    assert_error_has("stale array handle");
    line = __LINE__; assert_st(ndm_array_copy_in(a, buf, sizeof buf), NDM_E_CLOSED);
    assert_error_at("ndm_array_copy_in", line, __func__);
    assert_manager_empty(m);
}

/* ndm_debug_dump and ndm_debug_dump_json on a closed manager or a NULL FILE. */
static void test_error_site_debug_dump(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager gone = ndm_manager_new(m, "gone");
    assert_live(gone);
    close_ok(gone);
    int line = __LINE__; assert_st(ndm_debug_dump(gone, stderr), NDM_E_CLOSED);
    assert_error_at("ndm_debug_dump", line, __func__);
    assert_error_has("manager 'system/test/gone'");
    line = __LINE__; assert_st(ndm_debug_dump(m, NULL), NDM_E_INVALID);
    assert_error_at("ndm_debug_dump", line, __func__);
    line = __LINE__; assert_st(ndm_debug_dump_json(gone, stderr), NDM_E_CLOSED);
    assert_error_at("ndm_debug_dump_json", line, __func__);
    line = __LINE__; assert_st(ndm_debug_dump_json(m, NULL), NDM_E_INVALID);
    assert_error_at("ndm_debug_dump_json", line, __func__);
    assert_manager_empty(m);
}

/* ndm_alloc_configure: a bad string names the call and the caller's line,
 * and changes nothing. */
static void test_error_site_alloc_configure(void **state)
{
    ndm_manager m = ROOT(state);
    char before[512], after[512];
    assert_true(ndm_alloc_settings(NDM_CPU, before, sizeof before) < (int)sizeof before);
    int line = __LINE__; assert_st(ndm_alloc_configure(NDM_CPU, "max_split_size_mb:5"), NDM_E_CONFIG);
    assert_error_at("ndm_alloc_configure", line, __func__);
    assert_error_has("max_split_size_mb must be at least 20");
    line = __LINE__; assert_st(ndm_alloc_configure(NDM_CPU, "no_such_key:1"), NDM_E_CONFIG);
    assert_error_at("ndm_alloc_configure", line, __func__);
    assert_error_has("no_such_key");
    assert_true(ndm_alloc_settings(NDM_CPU, after, sizeof after) < (int)sizeof after);
    assert_string_equal(before, after);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    assert_live(a);
    release_ok(a);
    assert_manager_empty(m);
}

/* Accessors record no site: their messages end without one. */
static void test_error_message_without_site(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(1));
    release_ok(a);
    ndm_clear_error();
    assert_int_equal(ndm_array_size(a), -1);
    assert_null(strstr(ndm_last_error(), "[at "));
    assert_error_has("ndm_array_size: stale array handle");
}

/* A null input makes an operation fail quietly, keeping the first error of
 * the chain. */
static void test_error_first_in_chain_kept(void **state)
{
    ndm_manager m = ROOT(state);
    int line = __LINE__; ndm_array bad = ndm_zeros(m, NDM_F32, NDM_SHAPE(4, -4));
    ndm_array r = ndm_transpose(ndm_slice(ndm_reshape(bad, NDM_SHAPE(-1)), 0, 0, 2, 1));
    assert_null(r.id);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    char want[256];
    snprintf(want, sizeof want, "ndm_zeros: negative size -4 on axis 1 [at test_status.c:%d (%s)]",
             line, __func__);
    assert_string_equal(ndm_last_error(), want);
    assert_manager_empty(m);
}

/* A null handle keeps the thread's last error, for managers as for arrays:
 * a failed ndm_manager_new is not silently another manager. */
static void test_error_null_manager_keeps_first_error(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager gone = ndm_manager_new(m, "gone");
    close_ok(gone);
    ndm_clear_error();
    ndm_manager child = ndm_manager_new(gone, "child");
    assert_null(child.id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ndm_last_error());
    ndm_array a = ndm_zeros(child, NDM_F32, NDM_SHAPE(2));
    assert_null(a.id);
    assert_int_equal(ndm_manager_close(child), NDM_E_CLOSED);
    assert_null(ndm_scope_begin(child, "s").id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_string_equal(ndm_last_error(), msg);
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    assert_int_equal(ndm_attach(x, child), NDM_E_CLOSED);
    assert_null(ndm_add_to(child, x, x).id);
    assert_string_equal(ndm_last_error(), msg);
    ndm_clear_error();
    assert_st(ndm_attach(x, child), NDM_E_NULL);
    assert_error_has("null manager handle");
    release_ok(x);
    assert_manager_empty(m);
}

/* A handle whose generation was never issued is not an array or manager
 * handle; one that was issued and has died is NDM_ALREADY on release. */
static void test_error_forged_handles(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    ndm_array ahead = {a.id + (UINT64_C(3) << 32)}; /* the slot never reached it */
    assert_st(ndm_array_release(ahead), NDM_E_INVALID);
    assert_error_has("not an array handle");
    assert_true(ndm_array_valid(a));
    release_ok(a);
    assert_st(ndm_array_release(a), NDM_ALREADY);
    ndm_array next = {a.id + (UINT64_C(1) << 32)}; /* the next one, not made yet */
    assert_st(ndm_array_release(next), NDM_E_INVALID);
    double v;
    assert_st(ndm_item(ahead, &v), NDM_E_INVALID);
    assert_st(ndm_item(a, &v), NDM_E_CLOSED);
    ndm_manager c = ndm_manager_new(m, "c");
    ndm_manager c_ahead = {c.id + (UINT64_C(2) << 32)};
    assert_st(ndm_manager_close(c_ahead), NDM_E_INVALID);
    assert_error_has("not a manager handle");
    assert_true(ndm_manager_valid(c));
    close_ok(c);
    assert_st(ndm_manager_close(c), NDM_ALREADY);
    ndm_manager c_next = {c.id + (UINT64_C(1) << 32)};
    assert_st(ndm_manager_close(c_next), NDM_E_INVALID);
    /* an array handle is not a scope, and a scope end is not faked by it */
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    assert_st(ndm_scope_end((ndm_manager){b.id}, 0, NULL), NDM_E_INVALID);
    assert_st(ndm_manager_close((ndm_manager){b.id}), NDM_E_INVALID);
    assert_true(ndm_array_valid(b));
    release_ok(b);
    assert_manager_empty(m);
}

/* ---- the log callback ------------------------------------------------------------------------ */

typedef struct log_record {
    int errors, warnings, infos;
    int calls;
    void *ud;
    char last[1024];
    ndm_log_level last_level;
} log_record;

static log_record logged;

static void record_log(ndm_log_level level, const char *msg, void *ud)
{
    logged.calls++;
    if (level == NDM_LOG_ERROR)
        logged.errors++;
    else if (level == NDM_LOG_WARN)
        logged.warnings++;
    else
        logged.infos++;
    logged.ud = ud;
    logged.last_level = level;
    snprintf(logged.last, sizeof logged.last, "%s", msg);
}

static int failing_hook(void *ud)
{
    (void)ud;
    return 3;
}

static void test_log_receives_errors(void **state)
{
    ndm_manager m = ROOT(state);
    memset(&logged, 0, sizeof logged);
    ndm_set_log_fn(record_log, &logged);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(-3));
    ndm_set_log_fn(NULL, NULL);
    assert_null(a.id);
    assert_int_equal(logged.calls, 1);
    assert_int_equal(logged.errors, 1);
    assert_int_equal(logged.last_level, NDM_LOG_ERROR);
    assert_ptr_equal(logged.ud, &logged);
    assert_string_equal(logged.last, ndm_last_error());
}

static void test_log_receives_warnings(void **state)
{
    ndm_manager h = ndm_manager_new(ROOT(state), "h");
    int line = __LINE__; assert_ok(ndm_manager_on_close(h, failing_hook, NULL));
    memset(&logged, 0, sizeof logged);
    ndm_set_log_fn(record_log, &logged);
    ndm_status st = ndm_manager_close(h);
    ndm_set_log_fn(NULL, NULL);
    assert_int_equal(st, NDM_E_HOOK);
    /* The close completed anyway. */
    assert_false(ndm_manager_valid(h));
    assert_int_equal(ndm_manager_close(h), NDM_ALREADY);
    assert_int_equal(logged.warnings, 1);
    assert_int_equal(logged.errors, 0);
    char want[256];
    snprintf(want, sizeof want,
             "on-close hook registered at test_status.c:%d (%s) failed with 3 while closing "
             "'system/test/h'",
             line, __func__);
    assert_string_equal(logged.last, want);
}

/* Runs fn with stderr sent to a temporary file; returns what was written. */
static char *capture_stderr(void (*fn)(void *), void *arg)
{
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    dup2(fileno(tmp), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long size = ftell(tmp);
    rewind(tmp);
    char *text = calloc((size_t)size + 1, 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)size, tmp), (size_t)size);
    fclose(tmp);
    return text;
}

static void warn_and_fail(void *arg)
{
    ndm_manager *root = arg;
    ndm_manager h = ndm_manager_new(*root, "quiet");
    (void)!ndm_manager_on_close(h, failing_hook, NULL);
    (void)!ndm_manager_close(h);
    (void)ndm_zeros(*root, NDM_F32, NDM_SHAPE(-9));
}

static void test_log_null_restores_default(void **state)
{
    ndm_manager m = ROOT(state);
    memset(&logged, 0, sizeof logged);
    ndm_set_log_fn(record_log, &logged);
    ndm_set_log_fn(NULL, NULL);
    char *text = capture_stderr(warn_and_fail, &m);
    assert_int_equal(logged.calls, 0);
    /* The default prints warnings, not errors. */
    assert_non_null(strstr(text, "ndm: warning: on-close hook registered at test_status.c:"));
    assert_non_null(strstr(text, "while closing 'system/test/quiet'\n"));
    assert_null(strstr(text, "negative size -9"));
    free(text);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
}

static void test_log_replaced_callback(void **state)
{
    ndm_manager m = ROOT(state);
    static log_record other;
    memset(&logged, 0, sizeof logged);
    ndm_set_log_fn(record_log, &other);
    ndm_set_log_fn(record_log, &logged);
    assert_fails(ndm_zeros(m, NDM_F32, NDM_SHAPE(-1)), NDM_E_SHAPE);
    ndm_set_log_fn(NULL, NULL);
    assert_ptr_equal(logged.ud, &logged);
    assert_int_equal(logged.errors, 1);
}

/* A callback that calls ndm and fails: each failure inside it must be
 * recorded, not logged again (which recursed until the stack ran out). */
typedef struct reentrant_log {
    int calls, depth, max_depth;
    ndm_manager m;
    ndm_status inner_status;
    char inner[256], outer[256];
} reentrant_log;

static void failing_log(ndm_log_level level, const char *msg, void *ud)
{
    (void)level;
    reentrant_log *r = ud;
    r->calls++;
    if (++r->depth > r->max_depth)
        r->max_depth = r->depth;
    snprintf(r->outer, sizeof r->outer, "%s", msg);
    ndm_array a = ndm_zeros(r->m, NDM_F32, NDM_SHAPE(-5));
    (void)a;
    r->inner_status = ndm_last_status();
    snprintf(r->inner, sizeof r->inner, "%s", ndm_last_error());
    /* msg is still the message being logged */
    assert_string_equal(msg, r->outer);
    r->depth--;
}

static void test_log_callback_failure_is_recorded_not_logged(void **state)
{
    reentrant_log r = {.m = ROOT(state)};
    ndm_set_log_fn(failing_log, &r);
    ndm_array a = ndm_zeros(r.m, NDM_F32, NDM_SHAPE(-3));
    ndm_status st = ndm_manager_close(ndm_system());
    ndm_set_log_fn(NULL, NULL);
    assert_null(a.id);
    assert_true(st < 0);
    /* one call per failure of the caller's, none for those inside it */
    assert_int_equal(r.calls, 2);
    assert_int_equal(r.max_depth, 1);
    /* inside the callback, its own failure was the thread's last error */
    assert_int_equal(r.inner_status, NDM_E_SHAPE);
    assert_non_null(strstr(r.inner, "-5"));
    /* after it, the failure logged is the last error again */
    assert_int_equal(ndm_last_status(), st);
    assert_string_equal(ndm_last_error(), r.outer);
    assert_int_equal(test_live_arrays(r.m), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_status_every_name_and_text),
        TEST(test_status_values_are_stable),
        TEST(test_status_unknown_values),
        TEST(test_last_error_set_on_failure),
        TEST(test_last_error_kept_across_success),
        TEST(test_last_error_replaced_by_next_failure),
        TEST(test_last_error_cleared),
        TEST(test_last_error_per_thread),
        TEST(test_error_message_drops_at_suffix),
        TEST(test_error_message_names_site),
        TEST(test_error_site_item),
        TEST(test_error_site_copy_out),
        TEST(test_error_site_debug_dump),
        TEST(test_error_site_alloc_configure),
        TEST(test_error_message_without_site),
        TEST(test_error_first_in_chain_kept),
        TEST(test_error_null_manager_keeps_first_error),
        TEST(test_error_forged_handles),
        TEST(test_log_receives_errors),
        TEST(test_log_receives_warnings),
        TEST(test_log_callback_failure_is_recorded_not_logged),
        TEST(test_log_null_restores_default),
        TEST(test_log_replaced_callback),
    };
    return cmocka_run_group_tests_name("status", tests, NULL, NULL);
}
