/* The allocator through the public API on the CPU: statistics of arrays,
 * OOM under a memory limit with managers named, pressure callbacks, the
 * summary, snapshots and traces. */
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "manager/core.h"
#include "utf8_check.h"

/* A ring larger than any address space must come back from malloc as NULL,
 * as C says, rather than stop the suite under a sanitizer. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }

#define MiB ((int64_t)1 << 20)

/* ---- a small JSON reader for the snapshot ------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype t;
    double num;
    char *str;
    struct jval *items; /* array items or object values */
    char **keys;        /* object keys */
    size_t n;
} jval;

typedef struct jparser {
    const char *s;
    bool bad;
} jparser;

static void jskip(jparser *p)
{
    while (isspace((unsigned char)*p->s))
        p->s++;
}

static bool jparse(jparser *p, jval *v);

static char *jstring(jparser *p)
{
    if (*p->s != '"') {
        p->bad = true;
        return NULL;
    }
    p->s++;
    size_t cap = 16, n = 0;
    char *out = malloc(cap);
    while (*p->s && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\') {
            c = *p->s++;
            if (c == 'u') {
                c = (char)strtol((char[]){p->s[0], p->s[1], p->s[2], p->s[3], 0}, NULL, 16);
                p->s += 4;
            } else if (c == 'n') {
                c = '\n';
            }
        }
        if (n + 1 >= cap)
            out = realloc(out, cap *= 2);
        out[n++] = c;
    }
    if (*p->s != '"')
        p->bad = true;
    else
        p->s++;
    out[n] = '\0';
    return out;
}

static bool jparse(jparser *p, jval *v)
{
    memset(v, 0, sizeof *v);
    jskip(p);
    char c = *p->s;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->t = obj ? J_OBJ : J_ARR;
        p->s++;
        jskip(p);
        size_t cap = 0;
        if (*p->s == (obj ? '}' : ']')) {
            p->s++;
            return true;
        }
        for (;;) {
            if (v->n == cap) {
                cap = cap ? 2 * cap : 8;
                v->items = realloc(v->items, cap * sizeof *v->items);
                if (obj)
                    v->keys = realloc(v->keys, cap * sizeof *v->keys);
            }
            if (obj) {
                jskip(p);
                v->keys[v->n] = jstring(p);
                jskip(p);
                if (*p->s++ != ':')
                    return !(p->bad = true);
            }
            if (!jparse(p, &v->items[v->n++]))
                return false;
            jskip(p);
            if (*p->s == ',') {
                p->s++;
                continue;
            }
            if (*p->s++ != (obj ? '}' : ']'))
                return !(p->bad = true);
            return !p->bad;
        }
    }
    if (c == '"') {
        v->t = J_STR;
        v->str = jstring(p);
        return !p->bad;
    }
    if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "false", 5)) {
        v->t = J_BOOL;
        v->num = *p->s == 't';
        p->s += *p->s == 't' ? 4 : 5;
        return true;
    }
    if (!strncmp(p->s, "null", 4)) {
        p->s += 4;
        return true;
    }
    char *end;
    v->t = J_NUM;
    v->num = strtod(p->s, &end);
    if (end == p->s)
        return !(p->bad = true);
    p->s = end;
    return true;
}

static void jfree(jval *v)
{
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

static const jval *jget(const jval *o, const char *key)
{
    if (!o || o->t != J_OBJ)
        return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key))
            return &o->items[i];
    return NULL;
}

static const jval *jmust(const jval *o, const char *key, jtype t)
{
    const jval *v = jget(o, key);
    if (!v || v->t != t)
        fail_msg("snapshot: member '%s' missing or of the wrong type", key);
    return v;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void temp_path(char *buf, size_t n, const char *tag)
{
    snprintf(buf, n, "%s/ndm-%s-%d.tmp", getenv("TMPDIR") ? getenv("TMPDIR") : P_tmpdir, tag,
             (int)getpid());
}

/* A figure's current value, and its change between two readings. */
#define CUR(st, fig, pool) ((st).fig[NDM_POOL_##pool].current)
#define DELTA(a, b, fig, pool) (CUR(b, fig, pool) - CUR(a, fig, pool))

static ndm_memory_stats mstats(void)
{
    ndm_memory_stats st;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &st));
    return st;
}

/* ---- statistics ------------------------------------------------------------------ */

static void test_memory_stats_follow_arrays(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_memory_stats s0 = mstats();
    ndm_array a = ndm_empty(root, NDM_U8, NDM_SHAPE(1000));
    assert_live(a);
    ndm_memory_stats s1 = mstats();
    assert_int_equal(DELTA(s0, s1, allocated_bytes, ALL), 1024);
    assert_int_equal(DELTA(s0, s1, allocated_bytes, SMALL), 1024);
    assert_int_equal(DELTA(s0, s1, requested_bytes, ALL), 1000);
    assert_int_equal(DELTA(s0, s1, allocation, ALL), 1);
    assert_int_equal(DELTA(s0, s1, active_bytes, ALL), 1024);
    ndm_array big = ndm_empty(root, NDM_F32, NDM_SHAPE(3, 1 << 20)); /* 12 MiB: large pool */
    assert_live(big);
    ndm_memory_stats s2 = mstats();
    assert_int_equal(DELTA(s1, s2, allocated_bytes, LARGE), 12 * MiB);
    assert_true(CUR(s2, reserved_bytes, ALL) >= CUR(s2, allocated_bytes, ALL));
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_array_release(big));
    ndm_memory_stats s3 = mstats();
    assert_int_equal(CUR(s3, allocated_bytes, ALL), CUR(s0, allocated_bytes, ALL));
    assert_int_equal(CUR(s3, requested_bytes, ALL), CUR(s0, requested_bytes, ALL));
    int64_t freed = s3.allocated_bytes[NDM_POOL_ALL].freed - s0.allocated_bytes[NDM_POOL_ALL].freed;
    assert_int_equal(freed, 1024 + 12 * MiB);
    /* storage shared by views is one block */
    ndm_array c = ndm_empty(root, NDM_F32, NDM_SHAPE(4, 256));
    ndm_array v = ndm_reshape(c, NDM_SHAPE(1024));
    assert_live(v);
    assert_int_equal(mstats().allocation[NDM_POOL_ALL].current - CUR(s0, allocation, ALL), 1);
    assert_ok(ndm_array_release(c));
    assert_ok(ndm_array_release(v));
}

static void test_memory_stat_keys_follow_pytorch(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array a = ndm_empty(root, NDM_F64, NDM_SHAPE(100));
    ndm_memory_stats st = mstats();
    int64_t v;
    assert_ok(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current", &v));
    assert_int_equal(v, CUR(st, allocated_bytes, ALL));
    assert_ok(ndm_memory_stat_get(NDM_CPU, "reserved_bytes.small_pool.peak", &v));
    assert_int_equal(v, st.reserved_bytes[NDM_POOL_SMALL].peak);
    assert_ok(ndm_memory_stat_get(NDM_CPU, "inactive_split_bytes.large_pool.freed", &v));
    assert_int_equal(v, st.inactive_split_bytes[NDM_POOL_LARGE].freed);
    assert_ok(ndm_memory_stat_get(NDM_CPU, "num_ooms", &v));
    assert_int_equal(v, st.num_ooms);
    assert_ok(ndm_memory_stat_get(NDM_CPU, "oversize_segments.current", &v));
    assert_ok(ndm_memory_stat_get(NDM_CPU, "max_split_size", &v));
    assert_int_equal(v, -1);
    ndm_clear_error();
    assert_int_equal(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.now", &v), NDM_E_INVALID);
    assert_error_has("unknown statistic 'allocated_bytes.all.now'");
    assert_int_equal(ndm_memory_stat_get(NDM_CPU, "bytes", &v), NDM_E_INVALID);
    assert_ok(ndm_array_release(a));
}

static void test_memory_reset_peak_sets_peak_to_current(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(8 << 20)); /* 32 MiB */
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_memory_reset_peak_stats(NDM_CPU));
    ndm_memory_stats st = mstats();
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, CUR(st, allocated_bytes, ALL));
    assert_int_equal(st.reserved_bytes[NDM_POOL_ALL].peak, CUR(st, reserved_bytes, ALL));
    ndm_array b = ndm_empty(root, NDM_F32, NDM_SHAPE(1 << 20));
    st = mstats();
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].peak, CUR(st, allocated_bytes, ALL));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_memory_reset_accumulated_stats(NDM_CPU));
    st = mstats();
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].allocated, 0);
    assert_int_equal(st.num_device_alloc, 0);
}

static void test_memory_empty_cache_returns_free_segments(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(16 << 20)); /* 64 MiB segment */
    assert_ok(ndm_array_release(a));
    ndm_memory_stats st = mstats();
    assert_true(CUR(st, reserved_bytes, LARGE) >= 64 * MiB);
    int64_t syncs = st.num_sync_all_streams;
    assert_ok(ndm_memory_empty_cache(NDM_CPU));
    st = mstats();
    assert_int_equal(CUR(st, reserved_bytes, LARGE), CUR(st, allocated_bytes, LARGE));
    assert_int_equal(st.num_sync_all_streams, syncs + 1);
    assert_int_equal(st.free_bytes, CUR(st, reserved_bytes, ALL) - CUR(st, allocated_bytes, ALL));
}

static void test_memory_compact_policy_returns_and_refits_segments(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_memory_empty_cache(NDM_CPU));
    ndm_memory_stats s0 = mstats();
    /* 8 MiB: a segment of its size, not PyTorch's 20 MiB */
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(2 << 20));
    ndm_memory_stats s1 = mstats();
    assert_int_equal(DELTA(s0, s1, reserved_bytes, LARGE), 8 * MiB);
    assert_ok(ndm_array_release(a));
    /* 12 MiB does not fit: the free 8 MiB segment goes back before the map */
    ndm_array b = ndm_empty(root, NDM_F32, NDM_SHAPE(3 << 20));
    ndm_memory_stats s2 = mstats();
    assert_int_equal(DELTA(s0, s2, reserved_bytes, LARGE), 12 * MiB);
    assert_int_equal(s2.num_device_free, s1.num_device_free + 1);
    assert_ok(ndm_array_release(b));
    /* 4 MiB would leave two thirds of the free 12 MiB segment idle: refitted */
    ndm_array c = ndm_empty(root, NDM_F32, NDM_SHAPE(1 << 20));
    ndm_memory_stats s3 = mstats();
    assert_int_equal(DELTA(s0, s3, reserved_bytes, LARGE), 4 * MiB);
    assert_int_equal(s3.num_device_free, s2.num_device_free + 1);
    assert_ok(ndm_array_release(c));
    /* PyTorch's policy on the same requests keeps one 20 MiB segment */
    assert_ok(ndm_alloc_configure(NDM_CPU, "policy:pytorch"));
    s0 = mstats();
    a = ndm_empty(root, NDM_F32, NDM_SHAPE(2 << 20));
    assert_ok(ndm_array_release(a));
    b = ndm_empty(root, NDM_F32, NDM_SHAPE(3 << 20));
    assert_ok(ndm_array_release(b));
    c = ndm_empty(root, NDM_F32, NDM_SHAPE(1 << 20));
    s1 = mstats();
    assert_int_equal(DELTA(s0, s1, reserved_bytes, LARGE), 20 * MiB);
    assert_int_equal(s1.num_device_free, s0.num_device_free);
    assert_ok(ndm_array_release(c));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
}

/* ---- OOM under a limit ------------------------------------------------------------- */

static void test_memory_oom_names_managers_and_recovers(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:64"));
    assert_ok(ndm_memory_reset_peak_stats(NDM_CPU));
    ndm_manager big = ndm_manager_new(root, "big");
    ndm_array a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = ndm_empty(big, NDM_F32, NDM_SHAPE(4 << 20)); /* 16 MiB each */
        assert_live(a[i]);
    }
    ndm_stats ms0;
    assert_ok(ndm_manager_stats(root, NDM_CPU, NDM_STATS_SUBTREE, &ms0));
    ndm_memory_stats s0 = mstats();
    ndm_clear_error();
    ndm_array x = ndm_empty(root, NDM_F32, NDM_SHAPE(6 << 20)); /* 24 MiB: over the limit */
    assert_true(ndm_array_is_null(x));
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    assert_error_has("ndm_empty: out of memory on cpu: tried to allocate 24.00 MiB");
    assert_error_has("48.00 MiB allocated");
    assert_error_has("limit 64.00 MiB");
    assert_error_has("largest free block");
    assert_error_has("system/test/big 48.00 MiB");
    assert_error_has("test_alloc_api.c");
    /* Nothing changed but the OOM count. */
    ndm_stats ms1;
    assert_ok(ndm_manager_stats(root, NDM_CPU, NDM_STATS_SUBTREE, &ms1));
    assert_int_equal(ms1.live_arrays, ms0.live_arrays);
    assert_int_equal(ms1.live_bytes, ms0.live_bytes);
    ndm_memory_stats s1 = mstats();
    assert_int_equal(s1.num_ooms, s0.num_ooms + 1);
    assert_int_equal(CUR(s1, allocated_bytes, ALL), CUR(s0, allocated_bytes, ALL));
    assert_true(s1.reserved_bytes[NDM_POOL_ALL].peak <= 64 * MiB);
    /* Closing the manager that holds the memory lets the same request through. */
    assert_ok(ndm_manager_close(big));
    x = ndm_empty(root, NDM_F32, NDM_SHAPE(6 << 20));
    assert_live(x);
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
}

/* Every error the log receives, and the last one. */
typedef struct error_log {
    int errors;
    char last[1024];
} error_log;

static void log_errors(ndm_log_level level, const char *msg, void *ud)
{
    error_log *l = ud;
    if (level == NDM_LOG_ERROR) {
        l->errors++;
        snprintf(l->last, sizeof l->last, "%s", msg);
    }
}

/* An allocation that fails is logged once, as the caller's failure at the
 * caller's line (not first without a site, then again with one), whatever
 * refused it: the limit, or a size no device holds. */
static void test_memory_failure_is_logged_once_with_its_site(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:8"));
    error_log log = {0, ""};
    char want[64];
    ndm_set_log_fn(log_errors, &log);
    int line = __LINE__; ndm_array x = ndm_empty(root, NDM_F32, NDM_SHAPE(4 << 20));
    ndm_set_log_fn(NULL, NULL);
    assert_true(ndm_array_is_null(x));
    assert_int_equal(log.errors, 1);
    assert_string_equal(log.last, ndm_last_error());
    assert_error_has("ndm_empty: out of memory on cpu: tried to allocate 16.00 MiB");
    snprintf(want, sizeof want, "[at test_alloc_api.c:%d (", line);
    assert_error_has(want);

    log = (error_log){0, ""};
    ndm_set_log_fn(log_errors, &log);
    line = __LINE__; x = ndm_empty(root, NDM_U8, NDM_SHAPE((int64_t)1 << 31, (int64_t)1 << 31));
    ndm_set_log_fn(NULL, NULL);
    assert_true(ndm_array_is_null(x));
    assert_int_equal(log.errors, 1);
    assert_string_equal(log.last, ndm_last_error());
    assert_error_has("ndm_empty: out of memory on cpu: tried to allocate");
    assert_error_has("more than any device holds");
    snprintf(want, sizeof want, "[at test_alloc_api.c:%d (", line);
    assert_error_has(want);
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
    assert_int_equal(test_live_arrays(root), 0);
}

/* A limit below the smallest segment would refuse every allocation, each
 * with a message about its own bytes: refused when set, saying why. The
 * unknown-key message lists every key and names the one a slip meant. */
static void test_memory_configure_explains_limits_and_keys(void **state)
{
    ndm_manager root = ROOT(state);
    char before[1024], after[1024];
    assert_true(ndm_alloc_settings(NDM_CPU, before, sizeof before) > 0);
    ndm_clear_error();
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:1"), NDM_E_CONFIG);
    assert_error_has("ndm_alloc_configure: memory_limit_mb must be 0 (no limit) or at least 2 "
                     "(got 1)");
    assert_error_has("segments of 2 MiB");
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "memory_limit:64"), NDM_E_CONFIG);
    assert_error_has("unknown key 'memory_limit' (did you mean 'memory_limit_mb'? known keys: "
                     "strategy, ");
    assert_error_has(", reserved_rate, allocated_rate, allocated_reserved_rate)");
    assert_true(ndm_alloc_settings(NDM_CPU, after, sizeof after) > 0);
    assert_string_equal(before, after);
    /* the smallest limit allowed works */
    assert_ok(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:2"));
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(256));
    assert_live(a);
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
    assert_int_equal(test_live_arrays(root), 0);
}

typedef struct victim {
    ndm_manager m;
    int calls;
} victim;

static void close_victim(const ndm_pressure_event *ev, void *ud)
{
    victim *v = ud;
    v->calls++;
    if (ev->reason == NDM_PRESSURE_FAILED && ndm_manager_valid(v->m))
        (void)!ndm_manager_close(v->m);
}

static void test_memory_pressure_callback_frees_and_allocation_succeeds(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:64"));
    victim v = {ndm_manager_new(root, "cache"), 0};
    for (int i = 0; i < 3; i++)
        assert_live(ndm_empty(v.m, NDM_F32, NDM_SHAPE(4 << 20)));
    assert_ok(ndm_on_pressure(close_victim, &v));
    int64_t ooms = mstats().num_ooms;
    ndm_array x = ndm_empty(root, NDM_F32, NDM_SHAPE(6 << 20));
    assert_live(x);
    assert_int_equal(v.calls, 1);
    assert_false(ndm_manager_valid(v.m));
    assert_int_equal(mstats().num_ooms, ooms);
    assert_ok(ndm_pressure_remove(close_victim, &v));
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
}

static void test_memory_pressure_runs_every_mb(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_alloc_configure(NDM_CPU, "pressure_every_mb:4"));
    victim v = {NDM_NULL_MANAGER, 0};
    assert_ok(ndm_on_pressure(close_victim, &v));
    for (int i = 0; i < 64; i++) { /* 64 x 256 KiB = 16 MiB */
        ndm_array a = ndm_empty(root, NDM_U8, NDM_SHAPE(256 << 10));
        assert_ok(ndm_array_release(a));
    }
    assert_int_equal(v.calls, 4);
    assert_ok(ndm_pressure_remove(close_victim, &v));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
}

/* ---- configuration ------------------------------------------------------------------- */

static void test_memory_configure_rejects_and_keeps_settings(void **state)
{
    (void)state;
    char before[512], after[512];
    assert_true(ndm_alloc_settings(NDM_CPU, before, sizeof before) > 0);
    assert_non_null(strstr(before, "strategy:auto_growth"));
    ndm_clear_error();
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "max_split_size_mb:1"), NDM_E_CONFIG);
    assert_error_has("ndm_alloc_configure: max_split_size_mb must be at least 20");
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:64,colour:blue"), NDM_E_CONFIG);
    assert_error_has("unknown key 'colour'");
    /* values that do not fit: refused, not truncated or accepted */
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "roundup_power2_divisions:4294967296"),
                     NDM_E_CONFIG);
    assert_error_has("roundup_power2_divisions: 4294967296 is above the largest");
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "roundup_power2_divisions:[256:4294967296,>:8]"),
                     NDM_E_CONFIG);
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "large_segment_size_mb:100000000"),
                     NDM_E_CONFIG);
    assert_error_has("large_segment_size_mb must be at most 1024");
    ndm_alloc_settings(NDM_CPU, after, sizeof after);
    assert_string_equal(before, after);
    assert_ok(ndm_alloc_configure(NDM_CPU, "cpu:max_split_size_mb:64,cuda:strategy:system"));
    ndm_alloc_settings(NDM_CPU, after, sizeof after);
    assert_non_null(strstr(after, "max_split_size_mb:64"));
    assert_non_null(strstr(after, "strategy:auto_growth"));
    assert_ok(ndm_alloc_configure(NDM_CPU, NULL));
    ndm_alloc_settings(NDM_CPU, after, sizeof after);
    assert_string_equal(before, after);
    /* The CPU's default is the compact policy; policy:pytorch restores
     * PyTorch's segments, and the keys after it still apply. */
    const char *compact[] = {"large_segment_size_mb:2,", "release_free_segments:True,",
                             "segment_refit:True,", "segment_round_kb:512"};
    for (size_t i = 0; i < sizeof compact / sizeof *compact; i++)
        if (!strstr(before, compact[i]))
            fail_msg("default settings lack \"%s\": %s", compact[i], before);
    assert_ok(ndm_alloc_configure(NDM_CPU, "policy:pytorch,segment_refit:True"));
    ndm_alloc_settings(NDM_CPU, after, sizeof after);
    assert_non_null(strstr(after, "large_segment_size_mb:20,"));
    assert_non_null(strstr(after, "release_free_segments:False,segment_refit:True,"
                                  "segment_round_kb:2048"));
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "segment_round_kb:100"), NDM_E_CONFIG);
    assert_error_has("ndm_alloc_configure: segment_round_kb must be 512, 1024 or 2048 (got '100')");
    assert_int_equal(ndm_alloc_configure(NDM_CPU, "policy:greedy"), NDM_E_CONFIG);
    assert_error_has("policy: 'greedy' is not one of pytorch, compact");
    ndm_alloc_settings(NDM_CPU, before, sizeof before);
    assert_string_equal(before, after);
    assert_ok(ndm_alloc_configure(NDM_CPU, NULL));
    /* Devices this build or machine lacks: the first CUDA index past the
     * devices present (cuda:0 where there is no GPU). */
    ndm_memory_stats st;
    int missing = ndm_cuda_device_count();
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", missing);
    ndm_status s = ndm_memory_stats_get(NDM_CUDA(missing), &st);
    assert_true(s == NDM_E_UNSUPPORTED || s == NDM_E_DEVICE);
    assert_error_has(name);
    assert_int_equal(ndm_alloc_configure(NDM_CUDA(missing), ""), s);
    assert_int_equal(ndm_alloc_settings((ndm_device){NDM_DEVICE_CPU, 3}, after, sizeof after), -1);
}

static void test_memory_system_strategy_reserves_only_what_is_used(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_alloc_configure(NDM_CPU, "strategy:system"));
    ndm_memory_stats s0 = mstats();
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(1000));
    ndm_array b = ndm_empty(root, NDM_F32, NDM_SHAPE(3 << 20));
    ndm_memory_stats s1 = mstats();
    assert_int_equal(DELTA(s0, s1, reserved_bytes, ALL),
                     DELTA(s0, s1, allocated_bytes, ALL));
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_array_release(b));
    ndm_memory_stats s2 = mstats();
    assert_int_equal(CUR(s2, reserved_bytes, ALL), CUR(s0, reserved_bytes, ALL));
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
}

/* ---- the summary ------------------------------------------------------------------------ */

static void test_memory_summary_prints_pytorch_table(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(100));
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_ok(ndm_memory_summary(NDM_CPU, m));
    fclose(m);
    int table_lines = 0;
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl);
        if (*line == '|') {
            assert_int_equal(nl - line, 77); /* 75 columns between the bars */
            assert_int_equal(nl[-1], '|');
            table_lines++;
        }
    }
    assert_int_equal(table_lines, 47);
    const char *expect[] = {"ndm memory summary, device cpu", "| Allocated memory      |",
                            "|       from small pool |", "| Non-releasable allocs |",
                            "| Oversize segments     |", "Fragmentation: ",
                            "Settings: strategy:auto_growth,",
                            "release_free_segments:True,segment_refit:True,segment_round_kb:512"};
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++)
        if (!strstr(buf, expect[i]))
            fail_msg("summary lacks \"%s\":\n%s", expect[i], buf);
    free(buf);
    assert_ok(ndm_array_release(a));
}

/* ---- snapshots and history ----------------------------------------------------------------- */

static void test_memory_snapshot_has_tiled_segments_and_history(void **state)
{
    ndm_manager root = ROOT(state);
    assert_ok(ndm_memory_record_history(true, 1000));
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_manager batch = ndm_manager_new(model, "batch-3");
    ndm_array w = ndm_empty(model, NDM_F32, NDM_SHAPE(300));
    ndm_array t[4];
    for (int i = 0; i < 4; i++)
        t[i] = ndm_empty(batch, NDM_F32, NDM_SHAPE(1000 + i));
    ndm_array moved = ndm_empty(batch, NDM_F32, NDM_SHAPE(777));
    assert_ok(ndm_attach(moved, model)); /* owned by the model now */
    assert_ok(ndm_array_release(t[1]));
    char path[256];
    temp_path(path, sizeof path, "snapshot");
    assert_ok(ndm_memory_dump_snapshot(path));
    assert_ok(ndm_memory_record_history(false, 0));

    char *text = read_file(path);
    jparser jp = {text, false};
    jval root_v;
    if (!jparse(&jp, &root_v) || jp.bad)
        fail_msg("snapshot is not JSON near: %.60s", jp.s);
    const jval *devices = jmust(&root_v, "devices", J_ARR);
    assert_true(devices->n >= 1);
    assert_string_equal(devices->items[0].str, "cpu");
    const jval *segs = jmust(&root_v, "segments", J_ARR);
    const jval *traces = jmust(&root_v, "device_traces", J_ARR);
    assert_int_equal(traces->n, devices->n);
    /* PyTorch's keys, and ndm's own settings per device under "ndm" */
    const jval *all_settings = jmust(&root_v, "allocator_settings", J_OBJ);
    assert_true(jmust(all_settings, "max_split_size", J_NUM)->num == -1);
    jmust(all_settings, "PYTORCH_CUDA_ALLOC_CONF", J_STR);
    const jval *settings = jmust(jmust(all_settings, "ndm", J_OBJ), "cpu", J_OBJ);
    assert_string_equal(jmust(settings, "strategy", J_STR)->str, "auto_growth");
    jmust(settings, "max_split_size_mb", J_NUM);
    assert_true(jmust(settings, "release_free_segments", J_BOOL)->num == 1);
    assert_true(jmust(settings, "segment_refit", J_BOOL)->num == 1);
    assert_true(jmust(settings, "segment_round_kb", J_NUM)->num == 512);

    int found_batch = 0, found_moved = 0, found_model = 0;
    for (size_t i = 0; i < segs->n; i++) {
        const jval *g = &segs->items[i];
        double addr = jmust(g, "address", J_NUM)->num, total = jmust(g, "total_size", J_NUM)->num;
        const jval *blocks = jmust(g, "blocks", J_ARR);
        double at = addr, allocated = 0, requested = 0;
        for (size_t k = 0; k < blocks->n; k++) {
            const jval *b = &blocks->items[k];
            assert_true(jmust(b, "address", J_NUM)->num == at);
            double size = jmust(b, "size", J_NUM)->num;
            at += size;
            const char *st = jmust(b, "state", J_STR)->str;
            const char *mgr = jmust(b, "manager", J_STR)->str;
            jmust(b, "frames", J_ARR);
            if (!strcmp(st, "active_allocated")) {
                allocated += size;
                requested += jmust(b, "requested_size", J_NUM)->num;
            } else {
                assert_string_equal(st, "inactive");
                assert_string_equal(mgr, "");
            }
            double req = jmust(b, "requested_size", J_NUM)->num;
            if (!strcmp(mgr, "system/test/model/batch-3")) {
                found_batch++;
                /* the function that allocated, then the caller's line */
                const jval *fr = jmust(b, "frames", J_ARR);
                assert_int_equal(fr->n, 2);
                assert_string_equal(jmust(&fr->items[0], "name", J_STR)->str, "ndm_empty");
                const char *file = jmust(&fr->items[1], "filename", J_STR)->str;
                assert_string_equal(file, "tests/test_alloc_api.c");
                assert_string_equal(jmust(&fr->items[1], "name", J_STR)->str,
                                    "test_memory_snapshot_has_tiled_segments_and_history");
            }
            if (!strcmp(mgr, "system/test/model")) {
                found_model++;
                if (req == 777 * 4)
                    found_moved++;
            }
        }
        assert_true(at == addr + total); /* the blocks tile the segment */
        assert_true(jmust(g, "allocated_size", J_NUM)->num == allocated);
        assert_true(jmust(g, "requested_size", J_NUM)->num == requested);
        const char *type = jmust(g, "segment_type", J_STR)->str;
        assert_true(!strcmp(type, "small") || !strcmp(type, "large"));
    }
    assert_int_equal(found_batch, 3);
    assert_int_equal(found_model, 2);
    assert_int_equal(found_moved, 1);

    const jval *ev = &traces->items[0];
    assert_int_equal(ev->t, J_ARR);
    int allocs = 0, frees = 0;
    double last = 0;
    for (size_t i = 0; i < ev->n; i++) {
        const jval *e = &ev->items[i];
        const char *action = jmust(e, "action", J_STR)->str;
        double t_us = jmust(e, "time_us", J_NUM)->num;
        assert_true(t_us > last);
        last = t_us;
        jmust(e, "addr", J_NUM);
        jmust(e, "stream", J_NUM);
        const char *mgr = jmust(e, "manager", J_STR)->str;
        if (!strcmp(action, "alloc")) {
            allocs++;
            assert_true(!strcmp(mgr, "system/test/model") ||
                        !strcmp(mgr, "system/test/model/batch-3"));
        }
        if (!strcmp(action, "free_requested")) {
            frees++;
            assert_int_equal(jmust(e, "size", J_NUM)->num, 1001 * 4);
            assert_string_equal(mgr, "system/test/model/batch-3");
        }
    }
    assert_int_equal(allocs, 6);
    assert_int_equal(frees, 1);
    jfree(&root_v);
    free(text);
    unlink(path);
    assert_ok(ndm_manager_close(model));
    (void)w;
}

static void test_memory_snapshot_reports_io_errors(void **state)
{
    (void)state;
    ndm_clear_error();
    assert_int_equal(ndm_memory_dump_snapshot("/nonexistent-dir/x/snapshot.json"), NDM_E_IO);
    assert_error_has("cannot open '/nonexistent-dir/x/snapshot.json'");
    assert_int_equal(ndm_memory_record_trace("/nonexistent-dir/x/trace.txt"), NDM_E_IO);
}

/* Alloc events of manager `path` in the recorded history of the CPU. */
static int history_allocs(const char *path)
{
    char file[256];
    temp_path(file, sizeof file, "history");
    assert_ok(ndm_memory_dump_snapshot(file));
    char *text = read_file(file);
    jparser jp = {text, false};
    jval root;
    if (!jparse(&jp, &root) || jp.bad)
        fail_msg("snapshot is not JSON near: %.60s", jp.s);
    const jval *ev = &jmust(&root, "device_traces", J_ARR)->items[0];
    int n = 0;
    for (size_t i = 0; i < ev->n; i++)
        n += !strcmp(jmust(&ev->items[i], "action", J_STR)->str, "alloc") &&
             !strcmp(jmust(&ev->items[i], "manager", J_STR)->str, path);
    jfree(&root);
    free(text);
    unlink(file);
    return n;
}

static void make_and_release(ndm_manager m)
{
    ndm_array a = ndm_empty(m, NDM_F32, NDM_SHAPE(123));
    assert_live(a);
    assert_ok(ndm_array_release(a));
}

static void test_history_refuses_a_ring_whose_size_overflows(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "hist");
    assert_ok(ndm_memory_record_history(true, 100));
    make_and_release(m);
    /* SIZE_MAX / 16 + 1 events of 16 bytes or more overflow size_t. */
    ndm_clear_error();
    assert_status(ndm_memory_record_history(true, SIZE_MAX / 16 + 1), NDM_E_OVERFLOW);
    assert_error_has("overflows the size of its ring");
    assert_status(ndm_memory_record_history(true, SIZE_MAX), NDM_E_OVERFLOW);
    /* The ring recorded so far is kept and recording goes on. */
    make_and_release(m);
    assert_int_equal(history_allocs("system/test/hist"), 2);
    assert_ok(ndm_memory_record_history(false, 0));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

/* A manager's name holds any bytes: the snapshot stays valid UTF-8 JSON,
 * with invalid bytes as U+FFFD and control bytes escaped, and the pickle
 * holds valid UTF-8 text. */
static void test_snapshot_is_utf8_whatever_the_names(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "snap\xff\x01\xc0\xaf" "end");
    assert_ok(ndm_memory_record_history(true, 100));
    make_and_release(m);
    char file[256];
    temp_path(file, sizeof file, "utf8");
    assert_ok(ndm_memory_dump_snapshot(file));
    assert_ok(ndm_memory_record_history(false, 0));
    char *text = read_file(file);
    unlink(file);
    assert_true(test_utf8_valid(text));
    jparser jp = {text, false};
    jval root;
    if (!jparse(&jp, &root) || jp.bad)
        fail_msg("snapshot is not JSON near: %.60s", jp.s);
    jfree(&root);
    assert_non_null(strstr(text, "system/test/snap\xef\xbf\xbd\\u0001\xef\xbf\xbd\xef\xbf\xbd"
                                 "end\""));
    free(text);
    /* the pickle: its text is the cleaned name, byte for byte */
    char pk[300];
    snprintf(pk, sizeof pk, "%s.pickle", file);
    assert_ok(ndm_memory_record_history(true, 100));
    make_and_release(m);
    assert_ok(ndm_memory_dump_snapshot(pk));
    assert_ok(ndm_memory_record_history(false, 0));
    FILE *f = fopen(pk, "rb");
    assert_non_null(f);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    unlink(pk);
    const char want[] = "system/test/snap\xef\xbf\xbd\x01\xef\xbf\xbd\xef\xbf\xbd" "end";
    assert_non_null(memmem(buf, n, want, sizeof want - 1));
    assert_null(memmem(buf, n, "snap\xff", 5));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

static void test_history_reports_a_ring_it_cannot_allocate(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "hist");
    /* 2^57 events need 2^63 bytes: more than any address space holds. */
    const size_t huge = (size_t)1 << 57;
    assert_ok(ndm_memory_record_history(true, 100));
    make_and_release(m);
    ndm_clear_error();
    assert_status(ndm_memory_record_history(true, huge), NDM_E_OOM);
    assert_error_has("no memory for a history of 144115188075855872 events");
    make_and_release(m);
    assert_int_equal(history_allocs("system/test/hist"), 2);
    /* Refused while off: it stays off. */
    assert_ok(ndm_memory_record_history(false, 0));
    assert_status(ndm_memory_record_history(true, huge), NDM_E_OOM);
    make_and_release(m);
    assert_int_equal(history_allocs("system/test/hist"), 0);
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

/* The child's side of the test below: this process has used no device. */
static int fresh_history_child(void)
{
    /* 2^58 + 1 events: past any address space in bytes, within size_t */
    const size_t huge = ((size_t)1 << 58) + 1;
    ndm_status st = ndm_memory_record_history(true, huge);
    if (st != NDM_E_OOM && st != NDM_E_OVERFLOW)
        return 1;
    if (ndm_last_status() != st || !strstr(ndm_last_error(), "288230376151711745 events"))
        return 2;
    /* refused: still off, and nothing recorded */
    ndm_manager m = ndm_manager_new(ndm_system(), "fresh");
    make_and_release(m);
    char file[256];
    temp_path(file, sizeof file, "fresh");
    if (ndm_memory_dump_snapshot(file) != NDM_OK)
        return 3;
    char *text = read_file(file);
    unlink(file);
    bool recorded = strstr(text, "\"alloc\"") != NULL;
    free(text);
    if (recorded)
        return 4;
    if (ndm_memory_record_history(true, 100) != NDM_OK || ndm_manager_close(m) != NDM_OK)
        return 5;
    return ndm_memory_record_history(false, 0) == NDM_OK ? 0 : 6;
}

static void test_history_refuses_a_huge_ring_before_any_device(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("NDM_TEST_FRESH_HISTORY", "1", 1);
        execl("/proc/self/exe", "test_alloc_api", (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* ---- traces ---------------------------------------------------------------------- */

static void test_memory_trace_records_allocations_and_frees(void **state)
{
    ndm_manager root = ROOT(state);
    char path[256];
    temp_path(path, sizeof path, "trace");
    assert_ok(ndm_memory_record_trace(path));
    ndm_array a = ndm_empty(root, NDM_U8, NDM_SHAPE(4000));
    ndm_array b = ndm_empty(root, NDM_U8, NDM_SHAPE(3 << 20));
    assert_ok(ndm_array_release(a));
    ndm_array c = ndm_empty(root, NDM_U8, NDM_SHAPE(12));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_memory_record_trace(NULL));
    assert_ok(ndm_array_release(c)); /* after the trace stopped: not recorded */
    char *text = read_file(path);
    char op[5][2];
    uint64_t seq[5], id[5];
    size_t size[5];
    int n = 0;
    for (char *line = text; *line; line = strchr(line, '\n') + 1) {
        if (*line != '#') {
            assert_true(n < 5);
            int64_t t;
            int thread;
            char dev[16];
            assert_int_equal(sscanf(line, "%" SCNu64 " %" SCNd64 " %d %15s %1s %" SCNu64 " %zu",
                                    &seq[n], &t, &thread, dev, op[n], &id[n], &size[n]),
                             7);
            assert_string_equal(dev, "cpu");
            n++;
        }
    }
    assert_int_equal(n, 5);
    const char *ops = "aafaf";
    size_t sizes[] = {4000, 3 << 20, 4000, 12, 3 << 20};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(op[i][0], ops[i]);
        assert_int_equal(size[i], sizes[i]);
        assert_int_equal(seq[i], (uint64_t)i + 1);
    }
    assert_int_equal(id[2], id[0]); /* a free names its allocation */
    assert_int_equal(id[4], id[1]);
    assert_true(id[0] != id[1] && id[3] != id[0] && id[3] != id[1]);
    free(text);
    unlink(path);
}

/* ---- file names ---------------------------------------------------------------------- */

/* The compiler sees each of ndm's sources by its path from the build folder
 * ("../tests/x.c" from a folder in the tree, "../../../src/ndm/tests/x.c" from
 * one elsewhere): the file names that sites and frames record, the tests'
 * and the library's own, are relative to the source root in every build. */
static void test_own_file_names_are_relative_to_the_source_root(void **state)
{
    (void)state;
    assert_string_equal(__FILE__, "tests/test_alloc_api.c");
    const ndm__manager *sys = ndm__manager_slot(ndm__system_slot);
    assert_non_null(sys);
    assert_string_equal(sys->site.file, "lib/manager/tree.c");
}

int main(void)
{
    if (getenv("NDM_TEST_FRESH_HISTORY"))
        return fresh_history_child();
    const struct CMUnitTest tests[] = {
        TEST(test_memory_stats_follow_arrays),
        TEST(test_memory_stat_keys_follow_pytorch),
        TEST(test_memory_reset_peak_sets_peak_to_current),
        TEST(test_memory_empty_cache_returns_free_segments),
        TEST(test_memory_compact_policy_returns_and_refits_segments),
        TEST(test_memory_oom_names_managers_and_recovers),
        TEST(test_memory_failure_is_logged_once_with_its_site),
        TEST(test_memory_configure_explains_limits_and_keys),
        TEST(test_memory_pressure_callback_frees_and_allocation_succeeds),
        TEST(test_memory_pressure_runs_every_mb),
        TEST(test_memory_configure_rejects_and_keeps_settings),
        TEST(test_memory_system_strategy_reserves_only_what_is_used),
        TEST(test_memory_summary_prints_pytorch_table),
        TEST(test_memory_snapshot_has_tiled_segments_and_history),
        TEST(test_memory_snapshot_reports_io_errors),
        TEST(test_history_refuses_a_ring_whose_size_overflows),
        TEST(test_history_reports_a_ring_it_cannot_allocate),
        TEST(test_snapshot_is_utf8_whatever_the_names),
        TEST(test_history_refuses_a_huge_ring_before_any_device),
        TEST(test_memory_trace_records_allocations_and_frees),
        TEST(test_own_file_names_are_relative_to_the_source_root),
    };
    return cmocka_run_group_tests_name("alloc_api", tests, NULL, NULL);
}
