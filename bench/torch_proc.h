/* bench/torch_proc: PyTorch as a co-process of a benchmark, one request per
 * line on its stdin and one answer per line on its stdout ("error ..." on failure). */
#ifndef NDM_BENCH_TORCH_PROC_H
#define NDM_BENCH_TORCH_PROC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct torch_proc {
    pid_t pid;
    FILE *to, *from;
    char version[160]; /* what followed "ok " in the script's first line */
} torch_proc;

/* Start `python -u script`; false, with *why, when it does not answer "ok ...". */
bool torch_start(torch_proc *t, const char *python, const char *script, char *why, size_t n);

/* One request; its answer in `ans` without the newline. False when the
 * script answered an error or stopped: said on stderr. */
bool torch_ask(torch_proc *t, char *ans, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool torch_vask(torch_proc *t, char *ans, size_t n, const char *fmt, va_list ap);

/* Ask the script to quit and wait for it; nothing when it never started. */
void torch_stop(torch_proc *t);

#endif
