/* bench/manager: the cost of the manager tree per array, beside talloc and APR
 * pools doing the same work in the same run, and the cost of one handle check.
 *
 *   scope: a new sub-manager, 1000 arrays of 16 floats (first element
 *          touched), then close; ns per array (the manager's cost included).
 *   tree:  a parent with 100 children of 10 arrays each, closed through the
 *          parent; ns per array (101 managers included).
 *   handle check: one accessor call on a live handle (validation + a read).
 * Anchors: talloc (talloc_new / talloc_size / talloc_free) and APR
 * (apr_pool_create / apr_palloc / apr_pool_destroy) with 64-byte objects.
 * glibc is pinned to its "warm" state (mmap threshold 32 MiB, trim 64 MiB)
 * before the first allocation, as the reference measurements do. glibc's
 * malloc, under talloc and APR, takes a cheaper path while a process has
 * one thread, and the GEMM provider may start its threads when it loads:
 * the program then runs itself again with OPENBLAS_NUM_THREADS=1, so every
 * contender runs in a single-threaded process, as the references did.
 *
 * usage: manager [--json] [--quick] */
#include <malloc.h>
#include <unistd.h>

#include "bench.h"
#include "ndm/ndm.h"

#if NDM_BENCH_HAVE_TALLOC
#include <talloc.h>
#endif
#if NDM_BENCH_HAVE_APR
#include <apr_general.h>
#include <apr_pools.h>
#endif

#define NOBJ 1000
#define NCHILD 100
#define PERCHILD 10
#define OBJ_BYTES 64

static volatile char sink;
static inline void touch(void *p) { ((volatile char *)p)[0] = 1; }

static ndm_manager g_root;
static int g_failed;

static void fail(const char *what)
{
    fprintf(stderr, "manager bench: %s: %s\n", what, ndm_last_error());
    g_failed = 1;
    exit(1);
}

/* ---- ndm ---------------------------------------------------------------------- */

static void scope_ndm(long iters)
{
    for (long it = 0; it < iters; it++) {
        ndm_manager m = ndm_manager_new(g_root, "scope");
        for (int i = 0; i < NOBJ; i++) {
            ndm_array a = ndm_empty(m, NDM_F32, NDM_SHAPE(16));
            touch(ndm_array_data(a));
        }
        if (ndm_manager_close(m) != NDM_OK)
            fail("close");
    }
}

static void tree_ndm(long iters)
{
    for (long it = 0; it < iters; it++) {
        ndm_manager root = ndm_manager_new(g_root, "tree");
        for (int c = 0; c < NCHILD; c++) {
            ndm_manager ch = ndm_manager_new(root, "child");
            for (int i = 0; i < PERCHILD; i++) {
                ndm_array a = ndm_empty(ch, NDM_F32, NDM_SHAPE(16));
                touch(ndm_array_data(a));
            }
        }
        if (ndm_manager_close(root) != NDM_OK)
            fail("close");
    }
}

static ndm_array g_handle;

static void check_ndm(long iters)
{
    int sum = 0;
    for (long i = 0; i < iters; i++)
        sum += ndm_array_ndim(g_handle);
    sink = (char)sum;
}

/* ---- anchors --------------------------------------------------------------------- */

#if NDM_BENCH_HAVE_TALLOC
static void scope_talloc(long iters)
{
    for (long it = 0; it < iters; it++) {
        TALLOC_CTX *ctx = talloc_new(NULL);
        for (int i = 0; i < NOBJ; i++)
            touch(talloc_size(ctx, OBJ_BYTES));
        talloc_free(ctx);
    }
}

static void tree_talloc(long iters)
{
    for (long it = 0; it < iters; it++) {
        TALLOC_CTX *root = talloc_new(NULL);
        for (int c = 0; c < NCHILD; c++) {
            TALLOC_CTX *ch = talloc_new(root);
            for (int i = 0; i < PERCHILD; i++)
                touch(talloc_size(ch, OBJ_BYTES));
        }
        talloc_free(root);
    }
}

static void *g_talloc_obj;

/* talloc checks a chunk's magic on access: the closest analogue of a handle check */
static void check_talloc(long iters)
{
    size_t sum = 0;
    for (long i = 0; i < iters; i++)
        sum += talloc_get_size(g_talloc_obj);
    sink = (char)sum;
}
#endif

#if NDM_BENCH_HAVE_APR
static void scope_apr(long iters)
{
    for (long it = 0; it < iters; it++) {
        apr_pool_t *p;
        apr_pool_create(&p, NULL);
        for (int i = 0; i < NOBJ; i++)
            touch(apr_palloc(p, OBJ_BYTES));
        apr_pool_destroy(p);
    }
}

static void tree_apr(long iters)
{
    for (long it = 0; it < iters; it++) {
        apr_pool_t *root;
        apr_pool_create(&root, NULL);
        for (int c = 0; c < NCHILD; c++) {
            apr_pool_t *ch;
            apr_pool_create(&ch, root);
            for (int i = 0; i < PERCHILD; i++)
                touch(apr_palloc(ch, OBJ_BYTES));
        }
        apr_pool_destroy(root);
    }
}
#endif

/* ---- measuring ----------------------------------------------------------------------- */

/* Calibrate to >= 20 ms per sample (the calibration is the warm-up), then the
 * median over `reps` samples of ns per unit. */
static double measure(void (*f)(long), double units_per_iter, int reps)
{
    long iters = 1;
    for (;;) {
        double t = bench_now();
        f(iters);
        t = bench_now() - t;
        if (t >= 0.02)
            break;
        iters *= t < 0.002 ? 10 : 2;
    }
    double v[64];
    for (int r = 0; r < reps; r++) {
        double t = bench_now();
        f(iters);
        v[r] = (bench_now() - t) * 1e9 / ((double)iters * units_per_iter);
    }
    return bench_median(v, reps);
}

/* Threads of this process, from /proc (0 when unknown). */
static int process_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    int threads = process_threads();
    if (threads > 1 && !getenv("NDM_BENCH_MANAGER_RERUN")) {
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        setenv("NDM_BENCH_MANAGER_RERUN", "1", 1);
        execv("/proc/self/exe", argv);
    }
    /* pin glibc before the first allocation so every contender sees one heap state */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 3 : 11;
#if NDM_BENCH_HAVE_APR
    apr_initialize();
#endif
    g_root = ndm_manager_new(ndm_system(), "bench");
    if (!g_root.id)
        fail("root");

    double s_ndm = measure(scope_ndm, NOBJ, reps);
    double t_ndm = measure(tree_ndm, NOBJ, reps);
    g_handle = ndm_zeros(g_root, NDM_F32, NDM_SHAPE(16));
    double c_ndm = measure(check_ndm, 1, reps);

    double s_talloc = 0, t_talloc = 0, c_talloc = 0, s_apr = 0, t_apr = 0;
#if NDM_BENCH_HAVE_TALLOC
    s_talloc = measure(scope_talloc, NOBJ, reps);
    t_talloc = measure(tree_talloc, NOBJ, reps);
    g_talloc_obj = talloc_size(NULL, OBJ_BYTES);
    c_talloc = measure(check_talloc, 1, reps);
    talloc_free(g_talloc_obj);
#else
    bench_note(&rep, "talloc not found at build time: no talloc anchors");
#endif
#if NDM_BENCH_HAVE_APR
    s_apr = measure(scope_apr, NOBJ, reps);
    t_apr = measure(tree_apr, NOBJ, reps);
#else
    bench_note(&rep, "APR not found at build time: no APR anchors");
#endif

    char note[256];
    snprintf(note, sizeof note,
             "per array: create a 16-float array, touch it, free it with its manager; "
             "anchors allocate %d-byte objects; median of %d samples", OBJ_BYTES, reps);
    bench_note(&rep, note);
    snprintf(note, sizeof note, "process threads while measuring: %d%s", threads,
             getenv("NDM_BENCH_MANAGER_RERUN") ? " (run again with OPENBLAS_NUM_THREADS=1)" : "");
    bench_note(&rep, note);
    bench_add(&rep, "scope_ns_per_array_vs_talloc", s_ndm, "ns", "talloc scope of 1000 objects",
              s_talloc);
    bench_add(&rep, "scope_ns_per_array_vs_apr", s_ndm, "ns", "APR pool of 1000 objects", s_apr);
    bench_add(&rep, "tree_ns_per_array_vs_talloc", t_ndm, "ns",
              "talloc tree of 100 contexts x 10 objects", t_talloc);
    bench_add(&rep, "tree_ns_per_array_vs_apr", t_ndm, "ns",
              "APR tree of 100 pools x 10 objects", t_apr);
    bench_add(&rep, "handle_check_ns_vs_talloc", c_ndm, "ns",
              "talloc_get_size (magic-checked access)", c_talloc);
    bench_print(&rep);

    if (ndm_manager_close(g_root) != NDM_OK)
        fail("close root");
#if NDM_BENCH_HAVE_APR
    apr_terminate();
#endif
    return g_failed;
}
