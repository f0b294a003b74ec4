/* bench/torch_proc: starting PyTorch as a co-process, asking it, stopping it.
 * A dead co-process shows as a failed answer, never as SIGPIPE. */
#include "torch_proc.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool torch_start(torch_proc *t, const char *python, const char *script, char *why, size_t n)
{
    memset(t, 0, sizeof *t);
    signal(SIGPIPE, SIG_IGN);
    int in[2], out[2];
    if (pipe(in) != 0)
        return snprintf(why, n, "pipe failed"), false;
    if (pipe(out) != 0) {
        close(in[0]), close(in[1]);
        return snprintf(why, n, "pipe failed"), false;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        return snprintf(why, n, "fork failed"), false;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execlp(python, python, "-u", script, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->pid = pid;
    t->to = fdopen(in[1], "w");
    t->from = fdopen(out[0], "r");
    char line[256] = "";
    if (!t->to || !t->from || !fgets(line, sizeof line, t->from) || strncmp(line, "ok ", 3)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(why, n, "%.100s on %.250s: %.120s", python, script,
                 line[0] ? line : "no answer (no such program?)");
        if (t->to)
            fclose(t->to);
        else
            close(in[1]);
        if (t->from)
            fclose(t->from);
        else
            close(out[0]);
        waitpid(pid, NULL, 0);
        t->pid = 0;
        return false;
    }
    line[strcspn(line, "\n")] = '\0';
    snprintf(t->version, sizeof t->version, "%.150s", line + 3);
    return true;
}

bool torch_vask(torch_proc *t, char *ans, size_t n, const char *fmt, va_list ap)
{
    vfprintf(t->to, fmt, ap);
    fputc('\n', t->to);
    fflush(t->to);
    if (!fgets(ans, (int)n, t->from)) {
        fprintf(stderr, "bench: PyTorch stopped answering\n");
        ans[0] = '\0';
        return false;
    }
    ans[strcspn(ans, "\n")] = '\0';
    if (!strncmp(ans, "error", 5)) {
        fprintf(stderr, "bench: PyTorch: %s\n", ans);
        return false;
    }
    return true;
}

bool torch_ask(torch_proc *t, char *ans, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bool ok = torch_vask(t, ans, n, fmt, ap);
    va_end(ap);
    return ok;
}

void torch_stop(torch_proc *t)
{
    if (!t->pid)
        return;
    fprintf(t->to, "quit\n");
    fclose(t->to);
    fclose(t->from);
    waitpid(t->pid, NULL, 0);
    t->pid = 0;
}
