/* The child run without the OpenBLAS variables (blas_env.h). */
#include "blas_env.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ndm/ndm.h"

#if NDM_HAVE_OPENBLAS
#include <cblas.h>
#elif NDM_HAVE_BLIS
#include <blis.h>
#endif

extern char **environ;

const char *bench_blas_core(void)
{
#if NDM_HAVE_OPENBLAS
    return openblas_get_corename();
#elif NDM_HAVE_BLIS
    return bli_arch_string(bli_arch_query_id());
#else
    return "ndm blocked kernel";
#endif
}

int bench_blas_threads(void)
{
#if NDM_HAVE_OPENBLAS
    return openblas_get_num_threads();
#elif NDM_HAVE_BLIS
    /* -1 when neither BLIS_NUM_THREADS nor OMP_NUM_THREADS is set: one thread */
    dim_t t = bli_thread_get_num_threads();
    return t > 0 ? (int)t : 1;
#else
    const char *e = getenv("NDM_NUM_THREADS");
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return e && atoi(e) >= 1 ? atoi(e) : c > 0 ? (int)c : 1;
#endif
}

void bench_blas_note(bench_report *r, const char *label)
{
    const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    char note[256];
    snprintf(note, sizeof note,
             "%s: provider %s, core %s, %d threads (OPENBLAS_CORETYPE=%s, OPENBLAS_L2_SIZE=%s)",
             label, ndm_gemm_provider(), bench_blas_core(), bench_blas_threads(),
             ct ? ct : "unset", l2 ? l2 : "unset");
    bench_note(r, note);
}

bool bench_blas_is_child(int argc, char **argv)
{
    return argc > 1 && !strcmp(argv[1], BENCH_BLAS_CHILD_FLAG);
}

/* The child's figures go to stdout as tab-separated lines after one line
 * naming the core. */
void bench_blas_child_emit(const bench_report *r)
{
    printf("core\t%s\t%d\n", bench_blas_core(), bench_blas_threads());
    for (int i = 0; i < r->n; i++) {
        const bench_figure *f = &r->f[i];
        printf("%s\t%.9g\t%s\t%.9g\t%s\t%.9g\t%.9g\t%.9g\n", f->name, f->value, f->unit,
               f->anchor_value, f->anchor[0] ? f->anchor : "-", f->ratio, f->ratio_lo,
               f->ratio_hi);
    }
    fflush(stdout);
}

void bench_blas_rerun(bench_report *r, const char *label, int argc, char **argv)
{
    int fd[2];
    if (pipe(fd) != 0)
        return;
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!env || !args) {
        free(env), free(args);
        close(fd[0]), close(fd[1]);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18) &&
            strncmp(environ[i], "OPENBLAS_L2_SIZE=", 17))
            env[k++] = environ[i];
    args[0] = "/proc/self/exe";
    args[1] = BENCH_BLAS_CHILD_FLAG;
    for (int i = 0; i < argc; i++)
        args[i + 2] = argv[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    free(args);
    close(fd[1]);
    char note[256];
    if (rc != 0) {
        close(fd[0]);
        snprintf(note, sizeof note,
                 "%s: the run without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE could not start", label);
        bench_note(r, note);
        return;
    }
    FILE *f = fdopen(fd[0], "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *fields[8] = {0};
        char *save = NULL, *p = strtok_r(line, "\t", &save);
        for (int i = 0; i < 8 && p; i++, p = strtok_r(NULL, "\t", &save))
            fields[i] = p;
        if (fields[0] && !strcmp(fields[0], "core") && fields[2]) {
            snprintf(note, sizeof note,
                     "%s _noenv figures: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, "
                     "core %s, %s threads",
                     label, fields[1], fields[2]);
            bench_note(r, note);
        } else if (fields[3]) {
            char name[96];
            snprintf(name, sizeof name, "%s_noenv", fields[0]);
            bench_add(r, name, atof(fields[1]), fields[2],
                      fields[4] && strcmp(fields[4], "-") ? fields[4] : "", atof(fields[3]));
            /* the child's paired ratio and spread, when it measured pairs */
            if (fields[7] && atof(fields[7]) > 0 && r->n > 0) {
                bench_figure *fg = &r->f[r->n - 1];
                fg->ratio = atof(fields[5]);
                fg->ratio_lo = atof(fields[6]);
                fg->ratio_hi = atof(fields[7]);
            }
        }
    }
    if (f)
        fclose(f);
    else
        close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(note, sizeof note, "%s: the run without the OpenBLAS variables failed", label);
        bench_note(r, note);
    }
}
