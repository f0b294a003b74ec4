/* Status names, the per-thread last error and the log callback.
 * Messages say what failed, why, and the caller's site when known. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndm/version.h"
#include "compiler.h"
#include "error.h"
#include "text.h"

#ifndef NDM_DEBUG_ABORT
#define NDM_DEBUG_ABORT 0
#endif

/* When a thread's state cannot be allocated, its failures are still
 * reported by status, with a fixed message. */
static _Thread_local ndm_status fallback_status NDM__TLS_MODEL;
static const char no_room[] = "out of memory (no room for the error message)";

static ndm_log_fn log_fn;
static void *log_ud;

/* A thread's last failure, made on its first failure (most threads never
 * fail) and freed when it exits. */
typedef struct error_state {
    ndm_status status;
    char msg[1024];
} error_state;

static _Thread_local error_state *tls NDM__TLS_MODEL;
static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void thread_exit(void *p)
{
    if (tls == p)
        tls = NULL;
    free(p);
}

static void make_key(void) { (void)pthread_key_create(&key, thread_exit); }

static error_state *state_make(void)
{
    error_state *t = tls;
    if (t)
        return t;
    pthread_once(&once, make_key);
    t = calloc(1, sizeof *t);
    if (t && pthread_setspecific(key, t) != 0) {
        free(t);
        t = NULL;
    }
    return tls = t;
}

NDM_API const char *ndm_status_name(ndm_status s)
{
    switch (s) {
#define NDM_STATUS_NAME_(name, value, text)                                     \
    case NDM_##name:                                                            \
        return "NDM_" #name;
        NDM_STATUS_LIST(NDM_STATUS_NAME_)
#undef NDM_STATUS_NAME_
    }
    return "NDM_UNKNOWN";
}

NDM_API const char *ndm_status_str(ndm_status s)
{
    switch (s) {
#define NDM_STATUS_STR_(name, value, text)                                      \
    case NDM_##name:                                                            \
        return text;
        NDM_STATUS_LIST(NDM_STATUS_STR_)
#undef NDM_STATUS_STR_
    }
    return "unknown status";
}

NDM_API ndm_status ndm_last_status(void)
{
    error_state *t = tls;
    return t ? t->status : fallback_status;
}

NDM_API const char *ndm_last_error(void)
{
    error_state *t = tls;
    if (t)
        return t->msg;
    return fallback_status ? no_room : "";
}

NDM_API void ndm_clear_error(void)
{
    error_state *t = tls;
    if (t) {
        t->status = NDM_OK;
        t->msg[0] = '\0';
    }
    fallback_status = NDM_OK;
}

NDM_API void ndm_set_log_fn(ndm_log_fn fn, void *ud)
{
    /* Set once at start-up by programs; races with logging threads are the
     * caller's to avoid, as for any process-wide setting. */
    log_fn = fn;
    log_ud = ud;
}

/* Set while this thread is logging: a failure raised inside the log
 * callback (the callback calling ndm) is recorded but not logged again,
 * which would recurse without bound. */
static _Thread_local bool logging NDM__TLS_MODEL;

/* Set between ndm__quiet_begin and ndm__quiet_end (error.h). */
static _Thread_local bool quiet NDM__TLS_MODEL;

void ndm__quiet_begin(ndm__quiet_state *saved)
{
    error_state *t = tls;
    saved->quiet = quiet;
    saved->status = t ? t->status : fallback_status;
    saved->msg[0] = '\0';
    if (t) {
        _Static_assert(sizeof saved->msg == sizeof t->msg, "one message size");
        size_t n = strnlen(t->msg, sizeof t->msg - 1);
        memcpy(saved->msg, t->msg, n);
        saved->msg[n] = '\0';
    }
    quiet = true;
}

void ndm__quiet_end(const ndm__quiet_state *saved)
{
    error_state *t = tls;
    if (t) {
        t->status = saved->status;
        memcpy(t->msg, saved->msg, strlen(saved->msg) + 1);
    } else {
        fallback_status = saved->status;
    }
    quiet = saved->quiet;
}

static const char *const level_name[] = {"error", "warning", "info"};

NDM_API void ndm_log_stderr(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    const char *name = (unsigned)level < 3 ? level_name[level] : "log";
    fprintf(stderr, "ndm: %s: %s\n", name, msg ? msg : "");
}

/* The default printing of errors: on unless NDM_LOG_ERRORS is "0". Read
 * at each failure, not cached: failures are rare, and a program may set it
 * after its first one. */
static bool errors_printed(void)
{
    const char *env = getenv("NDM_LOG_ERRORS");
    return !env || strcmp(env, "0") != 0;
}

static void ndm__log(ndm_log_level level, const char *msg)
{
    if (logging)
        return;
    if (log_fn) {
        logging = true;
        log_fn(level, msg, log_ud);
        logging = false;
    } else if (level != NDM_LOG_ERROR || errors_printed()) {
        ndm_log_stderr(level, msg, NULL);
    }
}

NDM_API void ndm_check_failed_at(NDM_SITE_PARAMS, const char *expr)
{
    ndm_status st = ndm_last_status();
    const char *msg = ndm_last_error();
    const char *file = ndm_file_ ? ndm_file_ : "?", *func = ndm_func_ ? ndm_func_ : "?";
    expr = expr ? expr : "?";
    if (st == NDM_OK && !msg[0])
        fprintf(stderr, "%s:%d: %s: NDM_CHECK(%s) failed (no ndm failure recorded)\n", file,
                ndm_line_, func, expr);
    else
        fprintf(stderr, "%s:%d: %s: NDM_CHECK(%s) failed: %s (%s): %s\n", file, ndm_line_, func,
                expr, ndm_status_name(st), ndm_status_str(st), msg);
    fflush(stderr);
    abort();
}

/* Names in a message (a tensor's, a file's, a manager's) come from users:
 * a control byte in one is escaped, so that a message is one line of text
 * whatever it names. */
static void escape_controls(char *msg, size_t cap)
{
    const char *p = msg;
    while (*p && (unsigned char)*p >= 0x20 && *p != 0x7f)
        p++;
    if (!*p)
        return;
    char tmp[1024];
    size_t n = ndm__escape_controls(msg, tmp, sizeof tmp < cap ? sizeof tmp : cap);
    memcpy(msg, tmp, n + 1);
}

const char *ndm__site_str(ndm__site s, char *buf, size_t n)
{
    if (!s.file) {
        snprintf(buf, n, "an unknown site");
        return buf;
    }
    const char *base = strrchr(s.file, '/');
    base = base ? base + 1 : s.file;
    if (s.func)
        snprintf(buf, n, "%s:%d (%s)", base, s.line, s.func);
    else
        snprintf(buf, n, "%s:%d", base, s.line);
    return buf;
}

/* The entry point being run (NDM__ENTRY), NULL outside one. */
static _Thread_local const char *entry_api;

const char *ndm__entry_begin(const char *api)
{
    const char *saved = entry_api;
    if (!saved)
        entry_api = api;
    return saved;
}

void ndm__entry_end(const char **saved)
{
    entry_api = *saved;
}

/* Failures recorded on this thread so far (ndm__fail_count). */
static _Thread_local uint64_t fail_count NDM__TLS_MODEL;

uint64_t ndm__fail_count(void) { return fail_count; }

ndm_status ndm__vfail(ndm_status st, const char *api, ndm__site where, const char *fmt,
                      va_list ap)
{
    fail_count++;
    if (entry_api)
        api = entry_api; /* (the function the user called, not the one it called) */
    error_state *t = state_make();
    if (!t) {
        fallback_status = st;
        if (!quiet)
            ndm__log(NDM_LOG_ERROR, no_room);
        return st;
    }
    /* fmt's arguments may point into t->msg (a message re-raised with a
     * prefix): format into a scratch buffer first */
    char out[sizeof t->msg];
    size_t cap = sizeof out;
    size_t len = 0;
    if (api) {
        /* "ndm_attach_at" is reported as "ndm_attach" and "ndm_alias_to_at" as
         * "ndm_alias": the names users call. */
        size_t an = strlen(api);
        if (an > 6 && strcmp(api + an - 6, "_to_at") == 0)
            an -= 6;
        else if (an > 3 && strcmp(api + an - 3, "_at") == 0)
            an -= 3;
        len = (size_t)snprintf(out, cap, "%.*s: ", (int)an, api);
        if (len >= cap)
            len = cap - 1;
    }
    int k = vsnprintf(out + len, cap - len, fmt, ap);
    if (k > 0)
        len += (size_t)k;
    if (len >= cap)
        len = cap - 1;
    if (where.file && len < cap - 1) {
        char site[256];
        snprintf(out + len, cap - len, " [at %s]", ndm__site_str(where, site, sizeof site));
    }
    escape_controls(out, sizeof out);
    memcpy(t->msg, out, sizeof out);
    t->status = st;
    /* The callback gets the copy: a failure inside it rewrites t->msg, and
     * is the last error only until the callback returns, when the failure
     * being logged (the one the caller's call returns) is again. */
    if (quiet)
        return st; /* (recorded for the failure path, not logged, no debug abort) */
    bool outer = !logging && log_fn;
    ndm__log(NDM_LOG_ERROR, out);
    if (outer) {
        memcpy(t->msg, out, sizeof out);
        t->status = st;
    }
#if NDM_DEBUG_ABORT
    if (st == NDM_E_INVALID || st == NDM_E_NULL || st == NDM_E_CLOSED || st == NDM_E_SHAPE ||
        st == NDM_E_DTYPE || st == NDM_E_AXIS) {
        fprintf(stderr, "ndm: aborting on invalid argument (debug_abort): %s\n", out);
        abort();
    }
#endif
    return st;
}

ndm_status ndm__fail(ndm_status st, const char *api, ndm__site where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ndm__vfail(st, api, where, fmt, ap);
    va_end(ap);
    return st;
}

ndm_status ndm__fail_null(const char *api, ndm__site where, const char *what)
{
    ndm_status last = ndm_last_status();
    if (last < 0)
        return last;
    return ndm__fail(NDM_E_NULL, api, where, "null %s handle", what);
}

void ndm__warn(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    escape_controls(buf, sizeof buf);
    ndm__log(NDM_LOG_WARN, buf);
}

NDM_API const char *ndm_version(void)
{
    return NDM_VERSION_STRING;
}

NDM_API unsigned ndm_version_number(void)
{
    return NDM_VERSION;
}
