/* ndm status codes and the thread's last error.
 *
 * One status type serves the whole API: 0 is success, positive values are
 * non-error outcomes (NDM_ALREADY), negative values are errors. Functions that
 * create arrays or managers return a handle and, on failure, the null handle;
 * the reason is then in ndm_last_status()/ndm_last_error().
 *
 * Null handles. Any function given a null handle (array, manager, module...)
 * fails: it returns the null handle, or a negative status, and changes
 * nothing. If this thread's last status is already an error (a failure since
 * the last ndm_clear_error()), that status and message stay in place, and a
 * status-returning function returns that status; otherwise it records
 * NDM_E_NULL. A null handle most often is the result of that failure, so a
 * chain of calls (ndm_backward(ndm_sum(ndm_forward(net, x)...))) reports
 * where it first went wrong, at the caller's line. Call ndm_clear_error()
 * before a step whose errors you test, so that an old error is not taken
 * for the reason of a new null handle.
 *
 * Stale and forged handles. A handle whose array or manager has died is
 * stale: releasing or closing it again is NDM_ALREADY, any other use
 * NDM_E_CLOSED. A handle that ndm never issued (a generation its slot has
 * not reached, a manager handle passed as an array, random bits) is
 * NDM_E_INVALID, release and close included, so that a corrupted handle is
 * never taken for one already released. (Other calls keep their one-compare
 * check of the generation: an array handle forged with exactly the next
 * generation of a released array's slot is not told from it there.)
 * Generations wrap after 2^31 - 1 uses of a slot; a handle kept across more
 * than 2^30 reuses of its slot reads as never issued.
 *
 * Thread rules: the last error is per thread. The log callback is process
 * wide and may be called from any thread that uses ndm.
 */
#ifndef NDM_STATUS_H
#define NDM_STATUS_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** X(name, value, text): the one list the enum, ndm_status_name() and
 *  ndm_status_str() are generated from. */
#define NDM_STATUS_LIST(X)                                                      \
    X(OK, 0, "success")                                                         \
    X(ALREADY, 1, "already closed or released; nothing changed")                \
    X(E_INVALID, -1, "invalid argument")                                        \
    X(E_NULL, -2, "null handle")                                                \
    X(E_CLOSED, -3, "stale handle: the array was released or the manager closed") \
    X(E_SHAPE, -4, "invalid or incompatible shape")                             \
    X(E_DTYPE, -5, "unsupported or mismatched dtype")                           \
    X(E_DEVICE, -6, "device mismatch or device error")                          \
    X(E_AXIS, -7, "axis out of range")                                          \
    X(E_OVERFLOW, -8, "size or element count overflows")                        \
    X(E_OOM, -9, "out of memory")                                               \
    X(E_QUOTA, -10, "manager byte limit exceeded")                              \
    X(E_CAPPED, -11, "manager is capped")                                       \
    X(E_NOT_OWNER, -12, "array is not owned by that manager or scope")          \
    X(E_ROOT, -13, "operation not allowed on a built-in manager")              \
    X(E_HOOK, -14, "an on-close hook failed; the close completed")              \
    X(E_UNSUPPORTED, -15, "not supported by this build or backend")             \
    X(E_IO, -16, "file input/output error")                                     \
    X(E_FORMAT, -17, "malformed file or data")                                  \
    X(E_CONFIG, -18, "invalid configuration")                                   \
    X(E_INTERNAL, -19, "internal error")                                        \
    X(E_TIMEOUT, -20, "a wait timed out (other processes, a request's deadline)") \
    X(E_BUSY, -21, "busy: the queue is full, the request was refused at once")

/** The result of a call: NDM_OK (0), NDM_ALREADY (positive, not an error)
 *  or a negative error; the values and their texts are NDM_STATUS_LIST. */
typedef enum ndm_status {
#define NDM_STATUS_ENUM_(name, value, text) NDM_##name = value,
    NDM_STATUS_LIST(NDM_STATUS_ENUM_)
#undef NDM_STATUS_ENUM_
} ndm_status;

/** The name: "NDM_E_CLOSED" for NDM_E_CLOSED; "NDM_UNKNOWN" for other
 *  values. Returns a static string; never fails. */
NDM_API const char *ndm_status_name(ndm_status s);
/** A one-line description of the status. Returns a static string; never
 *  fails. */
NDM_API const char *ndm_status_str(ndm_status s);

/** The status of the last failure on this thread (NDM_OK if none since the
 *  last ndm_clear_error()). Successful calls do not reset it. Never fails. */
NDM_API ndm_status ndm_last_status(void);
/** The message of the last failure on this thread: what failed, why, and
 *  where (the caller's file:line when the entry point records sites). Valid
 *  until the next failure on this thread, owned by ndm; "" when there is
 *  none. Never fails. */
NDM_API const char *ndm_last_error(void);
/** Forget this thread's last failure. Never fails. */
NDM_API void ndm_clear_error(void);

/** How serious a logged message is. */
typedef enum ndm_log_level {
    NDM_LOG_ERROR = 0, /**< A failure, as recorded for ndm_last_error(). */
    NDM_LOG_WARN = 1,  /**< A problem that failed no call (a failed on-close hook...). */
    NDM_LOG_INFO = 2,  /**< Information (ndm itself sends none today). */
} ndm_log_level;

/** A log callback: msg is valid during the call only; ud is the pointer
 *  given to ndm_set_log_fn(). May be called from any thread that uses ndm. */
typedef void (*ndm_log_fn)(ndm_log_level level, const char *msg, void *ud);

/** Install a log callback (NULL restores the default). The default prints
 *  every failure to stderr as it happens, one line each
 *  ("ndm: error: <message>", the message of ndm_last_error(), with the
 *  caller's file:line), and warnings ("ndm: warning: ..."); the environment
 *  variable NDM_LOG_ERRORS=0 silences the errors (warnings still print). An
 *  installed callback replaces the default and NDM_LOG_ERRORS: it receives
 *  each failure at NDM_LOG_ERROR, as it happens, and each warning.
 *  ndm_log_stderr() is the default's printing as a callback (printing
 *  errors whatever NDM_LOG_ERRORS says). The callback may call ndm: a
 *  failure inside it is recorded (the thread's last error until the
 *  callback returns, when the failure being logged is again) but not
 *  logged, so a failing callback never recurses. Never fails. */
NDM_API void ndm_set_log_fn(ndm_log_fn fn, void *ud);

/** A ready log callback: prints "ndm: error: <msg>" (or "warning",
 *  "info") as one line on stderr; ud is ignored. Install it to print
 *  errors where NDM_LOG_ERRORS=0 has silenced the default, or to put
 *  printing back after another callback. Returns nothing, fails never. */
NDM_API void ndm_log_stderr(ndm_log_level level, const char *msg, void *ud);

/** Marks a function that does not return. */
#if defined(__GNUC__)
#define NDM_NORETURN __attribute__((noreturn))
#elif defined(__cplusplus)
#define NDM_NORETURN [[noreturn]]
#else
#define NDM_NORETURN _Noreturn
#endif

/** NDM_CHECK(cond): stop the program at the first failure. cond is a
 *  condition, as for assert(): a status compared with NDM_OK
 *  (`NDM_CHECK(ndm_backward(loss) == NDM_OK)`), a handle tested
 *  (`NDM_CHECK(w.id)`), any scalar expression; it is evaluated once, and
 *  the check is kept whatever NDEBUG says. When cond is false (zero), one
 *  line goes to stderr, then the program aborts (SIGABRT, so that a
 *  debugger or a core dump stops at the failure and no exit handler runs,
 *  NDM_LEAK_REPORT's included: the leak report of a program stopped
 *  half-way would name every live array):
 *    app.c:12: main: NDM_CHECK(y.id) failed: NDM_E_SHAPE (invalid or
 *    incompatible shape): ndm_matmul: ... [at app.c:11 (main)]
 *  that is the caller's file (__FILE__, as the compiler spells it), line
 *  and function, the expression, the thread's last status and its message
 *  (ndm_last_error(); "no ndm failure recorded" alone when there is none).
 *  It behaves the same in C and in C++. */
#define NDM_CHECK(...)                                                          \
    ((__VA_ARGS__) ? (void)0 : ndm_check_failed_at(NDM_HERE, #__VA_ARGS__))
/** What a false NDM_CHECK() calls: prints its line (see NDM_CHECK) for the
 *  given site and expression text, then abort(). Does not return, and so
 *  reports no errors. */
NDM_API NDM_NORETURN void ndm_check_failed_at(NDM_SITE_PARAMS, const char *expr);

#ifdef __cplusplus
}
#endif

#endif
