/* Benchmark section: ndm_matmul (f32, n x n) against a direct call of the
 * same GEMM provider with the same threads, and against the machine's peak.
 * The provider reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE when it loads,
 * so the second measurement, without them, runs in a child process. */
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ndm/ndm.h"
#include "sections.h"

#if NDM_HAVE_OPENBLAS
#include <cblas.h>
#elif NDM_HAVE_BLIS
#include <blis.h>
#endif

extern char **environ;

/* 64 flop/cycle (two 512-bit FMA pipes) x 3.53 GHz, measured on the
 * project machine. */
#define PEAK_PER_CORE 226.0

static const char *child_flag = "--child-linalg";

static int provider_threads(void)
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

static const char *provider_core(void)
{
#if NDM_HAVE_OPENBLAS
    return openblas_get_corename();
#elif NDM_HAVE_BLIS
    return bli_arch_string(bli_arch_query_id());
#else
    return "ndm blocked kernel";
#endif
}

/* C = A @ B through the provider, row-major; false when there is none. */
static bool direct_sgemm(int n, const float *a, const float *b, float *c)
{
#if NDM_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return true;
#elif NDM_HAVE_BLIS
    float one = 1.0f, zero = 0.0f;
    bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, n, n, n, &one, (float *)a, n, 1, (float *)b,
              n, 1, &zero, c, n, 1);
    return true;
#else
    (void)n, (void)a, (void)b, (void)c;
    return false;
#endif
}

typedef void (*emit_fn)(void *ud, const char *name, double value, const char *unit,
                        const char *anchor, double anchor_value);

static double time_ndm(ndm_array a, ndm_array b, int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++) {
        ndm_array c = ndm_matmul(a, b);
        if (!c.id || ndm_array_release(c) < 0) {
            fprintf(stderr, "ndm_matmul failed: %s\n", ndm_last_error());
            exit(1);
        }
    }
    return (bench_now() - t0) / calls;
}

static double time_direct(int n, const float *a, const float *b, float *c, int calls)
{
    double t0 = bench_now();
    for (int i = 0; i < calls; i++)
        direct_sgemm(n, a, b, c);
    return (bench_now() - t0) / calls;
}

static void measure(bool quick, emit_fn emit, void *ud)
{
    static const int sizes[] = {256, 512, 1024, 2048, 4096};
    int count = quick ? 4 : 5, threads = provider_threads();
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-linalg");
    for (int s = 0; s < count; s++) {
        int n = sizes[s];
        size_t nn = (size_t)n * (size_t)n;
        float *ha = malloc(nn * sizeof(float)), *hb = malloc(nn * sizeof(float));
        float *hc = malloc(nn * sizeof(float));
        if (!ha || !hb || !hc)
            exit(1);
        for (size_t i = 0; i < nn; i++) {
            ha[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            hb[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
            hc[i] = 0;
        }
        ndm_array a = ndm_from_buffer(m, NDM_F32, ha, NDM_SHAPE(n, n));
        ndm_array b = ndm_from_buffer(m, NDM_F32, hb, NDM_SHAPE(n, n));
        if (!a.id || !b.id)
            exit(1);
        bool have_direct = direct_sgemm(n, ha, hb, hc);
        /* warm up both, then size the calls per sample to about 20 ms */
        double est = time_ndm(a, b, 1);
        if (have_direct)
            est = time_direct(n, ha, hb, hc, 1);
        int calls = est >= 0.02 ? 1 : (int)(0.02 / est) + 1;
        int samples = n >= 4096 ? 3 : quick ? 5 : 7;
        double tn[8], td[8];
        for (int i = 0; i < samples; i++) {
            td[i] = have_direct ? time_direct(n, ha, hb, hc, calls) : 0;
            tn[i] = time_ndm(a, b, calls);
        }
        double flop = 2.0 * (double)n * (double)n * (double)n;
        double g_ndm = flop / bench_median(tn, samples) * 1e-9;
        double g_dir = have_direct ? flop / bench_median(td, samples) * 1e-9 : 0;
        char name[96], what[160];
        snprintf(name, sizeof name, "matmul_f32_n%d_gflops", n);
        snprintf(what, sizeof what, "direct %s sgemm, %d threads", ndm_gemm_provider(), threads);
        emit(ud, name, g_ndm, "GFLOP/s", have_direct ? what : "", g_dir);
        snprintf(name, sizeof name, "matmul_f32_n%d_vs_peak", n);
        snprintf(what, sizeof what, "peak %.0f GFLOP/s per core x %d threads", PEAK_PER_CORE,
                 threads);
        emit(ud, name, g_ndm, "GFLOP/s", what, PEAK_PER_CORE * threads);
        /* a spot check that both computed the same product */
        ndm_array c = ndm_matmul(a, b);
        const float *pc = ndm_array_data(c);
        if (have_direct && pc)
            for (size_t i = 0; i < nn; i += nn / 7 + 1) {
                double d = (double)pc[i] - (double)hc[i];
                if (d > 1e-3 || d < -1e-3) {
                    fprintf(stderr, "matmul n=%d: ndm and the provider differ at %zu\n", n, i);
                    exit(1);
                }
            }
        if (ndm_array_release(c) < 0 || ndm_array_release(a) < 0 || ndm_array_release(b) < 0)
            exit(1);
        free(ha), free(hb), free(hc);
    }
    if (ndm_manager_close(m) < 0)
        exit(1);
}

/* In the child, figures go to stdout as tab-separated lines. */
static void emit_line(void *ud, const char *name, double value, const char *unit,
                      const char *anchor, double anchor_value)
{
    (void)ud;
    printf("%s\t%.9g\t%s\t%.9g\t%s\n", name, value, unit, anchor_value, anchor);
}

static void emit_report(void *ud, const char *name, double value, const char *unit,
                        const char *anchor, double anchor_value)
{
    bench_add(ud, name, value, unit, anchor, anchor_value);
}

bool bench_ops_linalg_child(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], child_flag) != 0)
        return false;
    bool quick = argc > 2 && !strcmp(argv[2], "--quick");
    printf("note\t%s\t%d\n", provider_core(), provider_threads());
    measure(quick, emit_line, NULL);
    fflush(stdout);
    return true;
}

/* Run this program again without the two variables; read its figures. */
static void run_child(bench_report *r)
{
    int fd[2];
    if (pipe(fd) != 0)
        return;
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env)
        return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18) && strncmp(environ[i], "OPENBLAS_L2_SIZE=", 17))
            env[k++] = environ[i];
    char *args[] = {"/proc/self/exe", (char *)child_flag, r->o.quick ? "--quick" : NULL, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        bench_note(r, "linalg: the run without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE could not start");
        return;
    }
    FILE *f = fdopen(fd[0], "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *fields[5] = {0};
        char *save = NULL, *p = strtok_r(line, "\t", &save);
        for (int i = 0; i < 5 && p; i++, p = strtok_r(NULL, "\t", &save))
            fields[i] = p;
        if (fields[0] && !strcmp(fields[0], "note") && fields[2]) {
            char note[256];
            snprintf(note, sizeof note,
                     "linalg _noenv figures: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, "
                     "core %s, %s threads",
                     fields[1], fields[2]);
            bench_note(r, note);
        } else if (fields[4] || (fields[3] && fields[2])) {
            char name[96];
            snprintf(name, sizeof name, "%s_noenv", fields[0]);
            bench_add(r, name, atof(fields[1]), fields[2], fields[4] ? fields[4] : "",
                      atof(fields[3]));
        }
    }
    if (f)
        fclose(f);
    int status;
    waitpid(pid, &status, 0);
}

void bench_ops_linalg(bench_report *r)
{
    const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    char note[256];
    snprintf(note, sizeof note,
             "linalg: provider %s, core %s, %d threads (OPENBLAS_CORETYPE=%s, OPENBLAS_L2_SIZE=%s)",
             ndm_gemm_provider(), provider_core(), provider_threads(), ct ? ct : "unset",
             l2 ? l2 : "unset");
    bench_note(r, note);
    measure(r->o.quick, emit_report, r);
    run_child(r);
}
