/* Running a program from a test: the environment less some variables plus
 * others, stdout and stderr captured, the exit status or the signal. */
#ifndef NDM_TESTS_CHILD_RUN_H
#define NDM_TESTS_CHILD_RUN_H

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

extern char **environ;

typedef struct child_run {
    int status; /* exit status, or -signal */
    char *out, *err;
} child_run;

/* All of f, from its start, NUL-terminated (the caller frees); f is closed. */
static inline char *file_slurp(FILE *f)
{
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Run argv[0] with argv, in this environment less the variables whose
 * "NAME=" starts an entry of drop (NULL-terminated) and with add's
 * "NAME=value" entries (NULL-terminated; either list may be NULL). */
static inline child_run child_run_of(char *const argv[], const char *const *drop,
                                     const char *const *add)
{
    size_t n = 0, na = 0;
    while (environ[n])
        n++;
    while (add && add[na])
        na++;
    char **envp = calloc(n + na + 1, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool keep = true;
        for (size_t d = 0; drop && drop[d] && keep; d++)
            keep = strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
        if (keep)
            envp[k++] = environ[i];
    }
    for (size_t i = 0; i < na; i++)
        envp[k++] = (char *)add[i];
    envp[k] = NULL;
    FILE *fo = tmpfile(), *fe = tmpfile();
    assert_non_null(fo);
    assert_non_null(fe);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(fo), 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(fe), 2);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    if (rc != 0)
        fail_msg("cannot run %s: %s", argv[0], strerror(rc));
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    child_run r = {WIFEXITED(wst) ? WEXITSTATUS(wst) : -WTERMSIG(wst), file_slurp(fo),
                   file_slurp(fe)};
    return r;
}

#endif
