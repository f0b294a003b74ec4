/* How failures reach a user who did nothing: printed on stderr by default,
 * one line each; NDM_LOG_ERRORS=0 and an installed callback each stop it;
 * ndm_log_stderr prints again; NDM_CHECK prints the expression, the status,
 * the message and the line, then aborts. Each case runs log_child (and its
 * C++ build) in a child process and reads what it wrote.
 * Arguments: the log_child program, then its C++ build or "". */
#include <signal.h>
#include <unistd.h>

#include "child_run.h"

static const char *children[2];

/* Run `prog mode` with NDM_LOG_ERRORS removed from the environment, then set
 * to `log_errors` unless that is NULL. */
static child_run run_child(const char *prog, const char *mode, const char *log_errors)
{
    char setting[64];
    snprintf(setting, sizeof setting, "NDM_LOG_ERRORS=%s", log_errors ? log_errors : "");
    const char *drop[] = {"NDM_LOG_ERRORS=", "NDM_LEAK_REPORT=", NULL};
    const char *add[] = {log_errors ? setting : NULL, NULL};
    char *argv[] = {(char *)prog, (char *)mode, NULL};
    return child_run_of(argv, drop, add);
}

static void child_free(child_run *r)
{
    free(r->out);
    free(r->err);
}

static int lines(const char *s)
{
    int k = 0;
    for (; *s; s++)
        k += *s == '\n';
    return k;
}

/* The child's "line N" (or "check N") on stdout. */
static int child_line(const child_run *r, const char *tag)
{
    const char *p = strstr(r->out, tag);
    if (!p)
        fail_msg("the child printed no '%s' line: %s", tag, r->out);
    return atoi(p + strlen(tag));
}

#define FOR_EACH_CHILD(prog)                                                    \
    for (int c_ = 0; c_ < 2; c_++)                                              \
        for (const char *prog = children[c_]; prog && *prog; prog = NULL)

static void test_log_prints_failures_by_default(void **state)
{
    (void)state;
    FOR_EACH_CHILD(prog) {
        /* unset, and set to anything but 0 */
        const char *values[] = {NULL, "1", ""};
        for (int v = 0; v < 3; v++) {
            child_run r = run_child(prog, "fail", values[v]);
            if (r.status != 0)
                fail_msg("%s fail exited with %d: %s", prog, r.status, r.err);
            char want[256];
            snprintf(want, sizeof want,
                     "ndm: error: ndm_reshape: cannot reshape f32[2,3] (6 elements) into 7 elements");
            if (!strstr(r.err, want))
                fail_msg("%s (NDM_LOG_ERRORS=%s): stderr lacks \"%s\":\n%s", prog,
                         values[v] ? values[v] : "unset", want, r.err);
            snprintf(want, sizeof want, "[at log_child.c:%d (main)]\n", child_line(&r, "line "));
            if (!strstr(r.err, want))
                fail_msg("%s: stderr lacks the caller's line \"%s\":\n%s", prog, want, r.err);
            assert_int_equal(lines(r.err), 1); /* one failure, one line */
            child_free(&r);
        }
    }
}

static void test_log_errors_0_and_a_callback_silence_it(void **state)
{
    (void)state;
    FOR_EACH_CHILD(prog) {
        child_run r = run_child(prog, "fail", "0");
        assert_int_equal(r.status, 0);
        if (r.err[0])
            fail_msg("%s with NDM_LOG_ERRORS=0 printed:\n%s", prog, r.err);
        child_free(&r);

        /* a callback replaces the default: it gets the message, stderr nothing */
        r = run_child(prog, "callback", NULL);
        assert_int_equal(r.status, 0);
        if (r.err[0])
            fail_msg("%s with a callback printed on stderr:\n%s", prog, r.err);
        char want[128];
        snprintf(want, sizeof want, "callback 0: ndm_reshape: cannot reshape");
        if (!strstr(r.out, want))
            fail_msg("%s: the callback did not get the failure:\n%s", prog, r.out);
        child_free(&r);

        /* ndm_log_stderr prints, NDM_LOG_ERRORS=0 or not */
        r = run_child(prog, "stderr_cb", "0");
        assert_int_equal(r.status, 0);
        if (!strstr(r.err, "ndm: error: ndm_reshape: cannot reshape"))
            fail_msg("%s with ndm_log_stderr installed printed:\n%s", prog, r.err);
        assert_int_equal(lines(r.err), 1);
        child_free(&r);
    }
}

static void test_log_check_prints_and_aborts(void **state)
{
    (void)state;
    FOR_EACH_CHILD(prog) {
        child_run r = run_child(prog, "check", "0");
        assert_int_equal(r.status, -SIGABRT);
        char want[512];
        int line = child_line(&r, "line "), check = child_line(&r, "check ");
        snprintf(want, sizeof want,
                 "log_child.c:%d: main: NDM_CHECK(y.id) failed: NDM_E_SHAPE (invalid or "
                 "incompatible shape): ndm_reshape: cannot reshape f32[2,3] (6 elements) into 7 "
                 "elements [at log_child.c:%d (main)]\n",
                 check, line);
        if (!strstr(r.err, want))
            fail_msg("%s check: stderr lacks \"%s\":\n%s", prog, want, r.err);
        /* NDM_LOG_ERRORS=0 silenced the failure itself, not the check */
        assert_int_equal(lines(r.err), 1);
        child_free(&r);

        r = run_child(prog, "check_none", NULL);
        assert_int_equal(r.status, -SIGABRT);
        snprintf(want, sizeof want,
                 "log_child.c:%d: main: NDM_CHECK(ndm_array_ndim(x) == 3) failed (no ndm "
                 "failure recorded)\n",
                 child_line(&r, "check "));
        /* the file as the compiler names it, the rest exactly */
        size_t el = strlen(r.err), wl = strlen(want);
        if (el < wl || strcmp(r.err + el - wl, want) != 0 || lines(r.err) != 1)
            fail_msg("%s check_none: stderr is \"%s\", not \"...%s\"", prog, r.err, want);
        child_free(&r);

        r = run_child(prog, "check_pass", NULL);
        if (r.status != 0)
            fail_msg("%s check_pass exited with %d: %s", prog, r.status, r.err);
        assert_string_equal(r.out, "evaluated 2\n");
        assert_string_equal(r.err, "");
        child_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s log_child [log_child_cxx]\n", argv[0]);
        return 2;
    }
    children[0] = argv[1];
    children[1] = argc > 2 ? argv[2] : "";
    if (!children[1][0])
        printf("log_child_cxx not built (no C++ compiler): the C++ cases are skipped\n");
    const struct CMUnitTest tests[] = {
        TEST(test_log_prints_failures_by_default),
        TEST(test_log_errors_0_and_a_callback_silence_it),
        TEST(test_log_check_prints_and_aborts),
    };
    return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
