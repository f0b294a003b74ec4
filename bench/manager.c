/* bench/manager: the cost of the manager tree per array, beside talloc and APR
 * pools doing the same work in the same run, and the cost of one handle check.
 *
 *   scope: a new sub-manager, 1000 arrays of 16 floats (first element
 *          touched), then close; ns per array (the manager's cost included).
 *   tree:  a parent with 100 children of 10 arrays each, closed through the
 *          parent; ns per array (101 managers included).
 *   handle check: one accessor call on a live handle (validation + a read).
 *   leak tracking: a training-like step (a batch manager under a model of
 *          32 weights, 64 arrays in it, a scope of 32 temporaries ended,
 *          the batch closed); ns per step with no growth tracker (the
 *          anchor), with a tracker made but not stepped ("off"), and with
 *          one stepped every step ("on"); all three sampled turn about.
 *          Creation sites are recorded in all three (they always are).
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

/* ---- leak tracking ---------------------------------------------------------------- */

#define STEP_ARRAYS 64
#define STEP_TEMPS 32
#define MODEL_WEIGHTS 32

static ndm_manager g_model;
static ndm_growth g_idle, g_on;

static void train_step(void)
{
    ndm_manager batch = ndm_manager_new(g_model, "batch");
    for (int i = 0; i < STEP_ARRAYS; i++) {
        ndm_array a = ndm_empty(batch, NDM_F32, NDM_SHAPE(16));
        touch(ndm_array_data(a));
    }
    ndm_manager scope = ndm_scope_begin(batch, "tmp");
    for (int i = 0; i < STEP_TEMPS; i++) {
        ndm_array t = ndm_empty(scope, NDM_F32, NDM_SHAPE(16));
        touch(ndm_array_data(t));
    }
    if (ndm_scope_end(scope, 0, NULL) != NDM_OK || ndm_manager_close(batch) != NDM_OK)
        fail("step");
}

static void steps_plain(long iters)
{
    for (long it = 0; it < iters; it++)
        train_step();
}

/* (the same loop: a tracker exists, watching the model, and is never stepped) */
static void steps_off(long iters)
{
    for (long it = 0; it < iters; it++)
        train_step();
    sink = (char)ndm_growth_valid(g_idle);
}

static void steps_on(long iters)
{
    for (long it = 0; it < iters; it++) {
        train_step();
        if (ndm_growth_step(g_on) != NDM_OK)
            fail("growth step");
    }
}

static void tracking_setup(void)
{
    g_model = ndm_manager_new(g_root, "model");
    for (int i = 0; i < MODEL_WEIGHTS; i++)
        if (!ndm_zeros(g_model, NDM_F32, NDM_SHAPE(64)).id)
            fail("weights");
    g_idle = ndm_growth_new(g_root, g_model);
    g_on = ndm_growth_new(g_root, g_model);
    if (!g_idle.id || !g_on.id)
        fail("growth tracker");
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

/* A contender at its calibrated size: one sample is ns per unit. */
typedef struct contender {
    void (*f)(long);
    double units_per_iter;
    long iters;
} contender;

/* Calibrate to >= 20 ms per sample. */
static contender calibrate(void (*f)(long), double units_per_iter)
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
    return (contender){f, units_per_iter, iters};
}

static double sample(void *ctx)
{
    contender *c = ctx;
    double t = bench_now();
    c->f(c->iters);
    return (bench_now() - t) * 1e9 / ((double)c->iters * c->units_per_iter);
}

/* ndm (first) and its anchors sampled turn about, `reps` rounds: t[j][i]. */
static void measure(int k, contender *c, int reps, double (*t)[BENCH_MAXSAMPLES])
{
    bench_sample_fn fn[3] = {sample, sample, sample};
    void *ctx[3] = {&c[0], &c[1], &c[2]};
    bench_interleave(k, fn, ctx, reps, t);
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

    /* Each shape: ndm, then talloc, then APR, round after round. */
    static double ts[3][BENCH_MAXSAMPLES], tt[3][BENCH_MAXSAMPLES], tc[2][BENCH_MAXSAMPLES];
    contender cs[3] = {calibrate(scope_ndm, NOBJ)}, ct[3] = {calibrate(tree_ndm, NOBJ)};
    g_handle = ndm_zeros(g_root, NDM_F32, NDM_SHAPE(16));
    contender cc[2] = {calibrate(check_ndm, 1)};
    int k = 1, kc = 1, talloc_at = 0, apr_at = 0;
#if NDM_BENCH_HAVE_TALLOC
    talloc_at = k++;
    cs[talloc_at] = calibrate(scope_talloc, NOBJ);
    ct[talloc_at] = calibrate(tree_talloc, NOBJ);
    g_talloc_obj = talloc_size(NULL, OBJ_BYTES);
    cc[kc++] = calibrate(check_talloc, 1);
#else
    bench_note(&rep, "talloc not found at build time: no talloc anchors");
#endif
#if NDM_BENCH_HAVE_APR
    apr_at = k++;
    cs[apr_at] = calibrate(scope_apr, NOBJ);
    ct[apr_at] = calibrate(tree_apr, NOBJ);
#else
    bench_note(&rep, "APR not found at build time: no APR anchors");
#endif
    tracking_setup();
    static double tl[3][BENCH_MAXSAMPLES];
    contender cl[3] = {calibrate(steps_plain, 1), calibrate(steps_off, 1), calibrate(steps_on, 1)};
    /* one size for the three, so each pair times the same number of steps */
    cl[1].iters = cl[2].iters = cl[0].iters;
    measure(k, cs, reps, ts);
    measure(k, ct, reps, tt);
    measure(kc, cc, reps, tc);
    measure(3, cl, reps, tl);
#if NDM_BENCH_HAVE_TALLOC
    talloc_free(g_talloc_obj);
#endif

    char note[256];
    snprintf(note, sizeof note,
             "per array: create a 16-float array, touch it, free it with its manager; "
             "anchors allocate %d-byte objects; %d rounds, ndm and its anchors sampled turn "
             "about", OBJ_BYTES, reps);
    bench_note(&rep, note);
    snprintf(note, sizeof note, "process threads while measuring: %d%s", threads,
             getenv("NDM_BENCH_MANAGER_RERUN") ? " (run again with OPENBLAS_NUM_THREADS=1)" : "");
    bench_note(&rep, note);
    /* a missing anchor (null): ndm's figure alone */
    const double *none = NULL;
    const double *ta = talloc_at ? ts[talloc_at] : none, *aa = apr_at ? ts[apr_at] : none;
    bench_add_paired_time(&rep, "scope_ns_per_array_vs_talloc", "ns", 1,
                          "talloc scope of 1000 objects", ts[0], ta, reps);
    bench_add_paired_time(&rep, "scope_ns_per_array_vs_apr", "ns", 1, "APR pool of 1000 objects",
                          ts[0], aa, reps);
    ta = talloc_at ? tt[talloc_at] : none, aa = apr_at ? tt[apr_at] : none;
    bench_add_paired_time(&rep, "tree_ns_per_array_vs_talloc", "ns", 1,
                          "talloc tree of 100 contexts x 10 objects", tt[0], ta, reps);
    bench_add_paired_time(&rep, "tree_ns_per_array_vs_apr", "ns", 1,
                          "APR tree of 100 pools x 10 objects", tt[0], aa, reps);
    bench_add_paired_time(&rep, "handle_check_ns_vs_talloc", "ns", 1,
                          "talloc_get_size (magic-checked access)", tc[0], kc > 1 ? tc[1] : none,
                          reps);
    /* tracking off (a tracker made, never stepped) and on (stepped every
     * step), each against the same loop without a tracker; the targets
     * are a ratio of at most 1.01 off and 1.10 on */
    bench_add_paired_time(&rep, "leak_tracking_off_ns_per_step", "ns", 1,
                          "the same step without a growth tracker", tl[1], tl[0], reps);
    bench_add_paired_time(&rep, "leak_tracking_on_ns_per_step", "ns", 1,
                          "the same step without a growth tracker", tl[2], tl[0], reps);
    bench_print(&rep);

    if (ndm_growth_free(g_idle) != NDM_OK || ndm_growth_free(g_on) != NDM_OK)
        fail("free the trackers");
    if (ndm_manager_close(g_root) != NDM_OK)
        fail("close root");
#if NDM_BENCH_HAVE_APR
    apr_terminate();
#endif
    return g_failed;
}
