/* A program that fails once, for the log suite: how a failure reaches the
 * user with no callback, with NDM_LOG_ERRORS=0, with a callback installed,
 * and through NDM_CHECK. Built as C and as C++ (log_child_cxx.cpp), which
 * must behave the same. argv[1] is the mode:
 *   fail        a shape error (no callback: the default printing)
 *   callback    the same failure with a callback installed (it prints on stdout)
 *   stderr_cb   the same failure with ndm_log_stderr installed
 *   check       NDM_CHECK on the failed call's handle: aborts
 *   check_none  NDM_CHECK on a false condition no ndm call failed for: aborts
 *   check_pass  NDM_CHECK on true conditions: each evaluated once, no output
 * On stdout: "line N" for the failing call's line (and "check N" for the
 * NDM_CHECK's), then what the mode adds; exit status 0 when it returns. */
#include <stdio.h>
#include <string.h>

#include "ndm/ndm.h"

static void to_stdout(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    printf("callback %d: %s\n", (int)level, msg);
}

static int evaluated;

static int once(int v)
{
    evaluated++;
    return v;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "fail";
    if (!strcmp(mode, "callback"))
        ndm_set_log_fn(to_stdout, NULL);
    else if (!strcmp(mode, "stderr_cb"))
        ndm_set_log_fn(ndm_log_stderr, NULL);
    ndm_manager m = ndm_manager_new(ndm_system(), "child");
    ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(2, 3));
    if (!x.id)
        return 3;
    if (!strcmp(mode, "check_pass")) {
        NDM_CHECK(once(x.id != 0));
        NDM_CHECK(once(ndm_manager_valid(m)) && ndm_array_ndim(x) == 2);
        printf("evaluated %d\n", evaluated);
        return ndm_manager_close(m) == NDM_OK ? 0 : 3;
    }
    if (!strcmp(mode, "check_none")) {
        printf("check %d\n", __LINE__ + 2);
        fflush(stdout); /* abort() flushes nothing */
        NDM_CHECK(ndm_array_ndim(x) == 3);
        return 4; /* not reached */
    }
    int line = __LINE__ + 1;
    ndm_array y = ndm_reshape(x, NDM_SHAPE(7));
    printf("line %d\n", line);
    fflush(stdout);
    if (!strcmp(mode, "check")) {
        printf("check %d\n", __LINE__ + 2);
        fflush(stdout);
        NDM_CHECK(y.id);
        return 4; /* not reached */
    }
    if (y.id)
        return 3;
    return ndm_manager_close(m) == NDM_OK ? 0 : 3;
}
