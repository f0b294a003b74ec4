/* bench/plan: planned managers against the caching allocator on the same
 * steps, in the same run: a planned training step's peak bytes against the
 * most bytes it had live at once (the offline bound) and against the
 * caching allocator's peak for the same step; the cost of a planned
 * allocation and free against the thread cache's fast path (interleaved,
 * medians); the MLP and CNN training steps planned and not, turn about.
 *
 * The planned allocation is measured through its internal entry point
 * (ndm__plan_alloc) beside ndm__alloc, so neither pays for an array record.
 *
 * usage: plan [--json] [--quick] */
#include <stdlib.h>
#include <string.h>

#include "../lib/manager/create.h"
#include "bench.h"
#include "fashion_net.h"
#include "ndm/ndm.h"

#define BATCH 128
#define PIX 784

static void die(const char *what)
{
    fprintf(stderr, "bench/plan: %s: %s\n", what, ndm_last_error());
    exit(1);
}

/* ---- training steps --------------------------------------------------------------- */

typedef struct net {
    ndm_manager model, trainer;
    ndm_module mod;
    ndm_optimizer opt;
    ndm_plan plan; /* null: unplanned */
    bool cnn;
    int step;
    float *x;
    int64_t *y;
} net;

static net net_new(const char *arch, bool planned)
{
    net n = {.cnn = !strcmp(arch, "cnn")};
    n.model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    n.mod = fashion_net(n.model, arch, &rng);
    n.opt = ndm_adam(n.model, n.mod, 1e-3, 0.9, 0.999, 1e-8, 0);
    if (!n.mod.id || !n.opt.id)
        die("model");
    n.trainer = ndm_manager_new(n.model, "trainer");
    if (planned && !(n.plan = ndm_plan_new(n.model, 4)).id)
        die("plan");
    n.x = malloc(sizeof *n.x * BATCH * PIX);
    n.y = malloc(sizeof *n.y * BATCH);
    if (!n.x || !n.y)
        die("memory");
    return n;
}

static void net_close(net *n)
{
    if (ndm_manager_close(n->model) < 0)
        die("close");
    free(n->x);
    free(n->y);
}

static void net_step(net *n)
{
    int s = n->step++;
    for (int i = 0; i < BATCH * PIX; i++)
        n->x[i] = (float)((i * 2654435761u + (unsigned)s * 40503u) % 1000) / 1000.0f;
    for (int i = 0; i < BATCH; i++)
        n->y[i] = (i + s) % 10;
    ndm_manager b = n->plan.id ? ndm_manager_new_planned(n->trainer, "batch", n->plan, BATCH)
                               : ndm_manager_new(n->trainer, "batch");
    ndm_array x = ndm_empty(b, NDM_F32, NDM_SHAPE(BATCH, 28, 28));
    ndm_array y = ndm_empty(b, NDM_I64, NDM_SHAPE(BATCH));
    if (ndm_array_copy_in(x, n->x, sizeof *n->x * BATCH * PIX) < 0 ||
        ndm_array_copy_in(y, n->y, sizeof *n->y * BATCH) < 0 || ndm_grad_begin(b) < 0)
        die("batch");
    ndm_array loss = ndm_cross_entropy(ndm_forward(n->mod, fashion_input(x, n->cnn)), y);
    if (!loss.id || ndm_backward(loss) < 0 || ndm_grad_end() < 0 ||
        ndm_optimizer_step(n->opt) < 0 || ndm_optimizer_zero_grad(n->opt) < 0 ||
        ndm_manager_close(b) < 0)
        die("step");
}

static int64_t allocated_now(int64_t *peak)
{
    ndm_memory_stats s;
    if (ndm_memory_stats_get(NDM_CPU, &s) < 0)
        die("stats");
    if (peak)
        *peak = s.allocated_bytes[NDM_POOL_ALL].peak;
    return s.allocated_bytes[NDM_POOL_ALL].current;
}

/* The allocator's peak over what it held before, for one step of n; a
 * planned net's arena counts in it whether it was kept from the step
 * before or taken in this one. */
static int64_t step_peak(net *n)
{
    int64_t base = allocated_now(NULL), peak;
    ndm_plan_stats ps;
    if (n->plan.id) {
        if (ndm_plan_get_stats(n->plan, &ps) != NDM_OK)
            die("plan stats");
        base -= ps.arena_bytes;
    }
    if (ndm_memory_reset_peak_stats(NDM_CPU) < 0)
        die("reset");
    net_step(n);
    allocated_now(&peak);
    return peak - base;
}

/* Steps per timed block: a CNN step costs some twenty MLP steps. */
static int n_steps(const char *arch, bool quick)
{
    return !strcmp(arch, "cnn") ? (quick ? 1 : 3) : (quick ? 5 : 20);
}

typedef struct steps_ctx {
    net *n;
    int steps;
} steps_ctx;

static double steps_sample(void *p)
{
    steps_ctx *c = p;
    double t0 = bench_now();
    for (int i = 0; i < c->steps; i++)
        net_step(c->n);
    return (bench_now() - t0) / c->steps;
}

static void training(bench_report *r, const char *arch, bool quick)
{
    net plain = net_new(arch, false), planned = net_new(arch, true);
    for (int i = 0; i < 3; i++) {
        net_step(&plain);
        net_step(&planned);
    }
    char name[96];
    ndm_plan_stats ps;
    /* Time: blocks of steps, turn about. */
    int steps = n_steps(arch, quick), pairs = quick ? 3 : 7;
    steps_ctx cp = {&planned, steps}, cu = {&plain, steps};
    double t[2][BENCH_MAXSAMPLES];
    bench_sample_fn fn[2] = {steps_sample, steps_sample};
    void *ctx[2] = {&cp, &cu};
    bench_interleave(2, fn, ctx, pairs, t);
    snprintf(name, sizeof name, "%s_step_planned_vs_unplanned", arch);
    bench_add_paired_time(r, name, "ms", 1e3, "the same step unplanned (caching allocator)",
                          t[0], t[1], pairs);
    /* Memory: the same step, on the caching allocator and planned (after
     * the timed steps: a plan whose scratch was short has grown by now). */
    int64_t cache_peak = step_peak(&plain);
    int64_t planned_extra = step_peak(&planned);
    ndm_plan_entry pe;
    if (ndm_plan_get_entry(planned.plan, BATCH, &pe) != NDM_OK ||
        ndm_plan_get_stats(planned.plan, &ps) != NDM_OK)
        die("plan entry");
    double planned_peak = (double)planned_extra; /* (the arena and any fallback) */
    char anchor[160];
    snprintf(name, sizeof name, "%s_planned_peak_vs_max_live", arch);
    snprintf(anchor, sizeof anchor, "most bytes live at once in the step (%lld blocks)",
             (long long)pe.blocks);
    bench_add(r, name, planned_peak / 1048576.0, "MiB", anchor, pe.max_live_bytes / 1048576.0);
    snprintf(name, sizeof name, "%s_caching_peak_vs_max_live", arch);
    bench_add(r, name, cache_peak / 1048576.0, "MiB", "most bytes live at once in the step",
              pe.max_live_bytes / 1048576.0);
    snprintf(name, sizeof name, "%s_planned_peak_vs_caching_peak", arch);
    bench_add(r, name, planned_peak / 1048576.0, "MiB",
              "the caching allocator's peak for the same step", cache_peak / 1048576.0);
    if (ndm_plan_get_stats(planned.plan, &ps) != NDM_OK)
        die("plan stats");
    char note[256];
    snprintf(note, sizeof note,
             "%s: %lld planned allocations served, %lld fell back, %lld arenas taken, %lld re-plans", arch,
             (long long)ps.hits, (long long)ps.fallbacks, (long long)ps.arena_allocs,
             (long long)ps.replanned);
    bench_note(r, note);
    net_close(&plain);
    net_close(&planned);
}

/* ---- the cost of one allocation --------------------------------------------------------
 * A step of K blocks, sizes from 512 bytes to 64 KiB (the thread cache's
 * range), four live at a time: allocated and freed through the planned
 * path (ndm__plan_alloc, then the free that routes the part back) and
 * through the allocator's own entry points, the same pattern. */

#define K 1024
#define LIVE 4

static size_t size_of(int k) { return (size_t)512 << (k * 7 % 8); }

static const ndm__alloc_tag bench_tag = {0, __FILE__, "bench", 0, NULL, false};

static void pattern(struct ndm__plan_run *run, ndm__block *blk)
{
    for (int k = 0; k < K; k++) {
        ndm__block *b = &blk[k % LIVE];
        if (k >= LIVE)
            ndm__free(NDM_CPU, b);
        if ((run ? ndm__plan_alloc(run, NDM_CPU, size_of(k), &bench_tag, b)
                 : ndm__alloc(NDM_CPU, size_of(k), &bench_tag, b)) < 0)
            die("alloc");
    }
    for (int i = 0; i < LIVE; i++)
        ndm__free(NDM_CPU, &blk[i]);
}

/* The allocations alone: K2 blocks made one after another, timed, then
 * freed untimed. */
#define K2 256

static double pattern_allocs(struct ndm__plan_run *run, ndm__block *blk)
{
    double t0 = bench_now();
    for (int k = 0; k < K2; k++)
        if ((run ? ndm__plan_alloc(run, NDM_CPU, size_of(k) / 8, &bench_tag, &blk[k])
                 : ndm__alloc(NDM_CPU, size_of(k) / 8, &bench_tag, &blk[k])) < 0)
            die("alloc");
    double t = bench_now() - t0;
    for (int k = 0; k < K2; k++)
        ndm__free(NDM_CPU, &blk[k]);
    return t;
}

typedef struct cost_ctx {
    ndm_manager parent;
    ndm_plan plan; /* null: the allocator itself */
    int reps;
    bool allocs_only;
} cost_ctx;

static double cost_sample(void *p)
{
    cost_ctx *c = p;
    static ndm__block blk[K2];
    double total = 0;
    for (int i = 0; i < c->reps; i++) {
        ndm_manager m = c->plan.id ? ndm_manager_new_planned(c->parent, "step", c->plan,
                                                             c->allocs_only ? 2 : 1)
                                   : ndm_manager_new(c->parent, "step");
        struct ndm__plan_run *run =
            c->plan.id ? atomic_load(&ndm__manager_peek(m)->plan_run) : NULL;
        if (c->allocs_only) {
            total += pattern_allocs(run, blk);
        } else {
            double t0 = bench_now();
            pattern(run, blk);
            total += bench_now() - t0;
        }
        if (ndm_manager_close(m) < 0)
            die("close");
    }
    return total / c->reps / (c->allocs_only ? K2 : K) * 1e9;
}

static void alloc_cost(bench_report *r, bool quick)
{
    ndm_manager root = ndm_manager_new(ndm_system(), "cost");
    ndm_plan plan = ndm_plan_new(root, 2);
    cost_ctx cp = {root, plan, quick ? 10 : 40, false};
    cost_ctx ca = {root, NDM_NULL_PLAN, quick ? 10 : 40, false};
    (void)cost_sample(&cp); /* the recorded step */
    int n = quick ? 5 : 15;
    double t[2][BENCH_MAXSAMPLES];
    bench_sample_fn fn[2] = {cost_sample, cost_sample};
    void *ctx[2] = {&cp, &ca};
    bench_interleave(2, fn, ctx, n, t);
    bench_add_paired_time(r, "ns_per_planned_alloc_free_vs_thread_cache", "ns", 1,
                          "ndm__alloc + ndm__free, same sizes (thread cache fast path)", t[0],
                          t[1], n);
    cost_ctx cp2 = cp, ca2 = ca;
    cp2.allocs_only = ca2.allocs_only = true;
    (void)cost_sample(&cp2);
    void *ctx2[2] = {&cp2, &ca2};
    bench_interleave(2, fn, ctx2, n, t);
    bench_add_paired_time(r, "ns_per_planned_alloc_vs_thread_cache", "ns", 1,
                          "ndm__alloc alone, same sizes (thread cache fast path)", t[0], t[1],
                          n);
    ndm_plan_stats ps;
    if (ndm_plan_get_stats(plan, &ps) != NDM_OK || ps.fallbacks)
        die("the planned pattern fell back");
    if (ndm_manager_close(root) < 0)
        die("close");
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report r = {.o = o};
    fflush(stdout);
    if (!o.json && system("uptime") != 0)
        fprintf(stderr, "(no uptime)\n");
    alloc_cost(&r, o.quick);
    training(&r, "mlp", o.quick);
    training(&r, "cnn", o.quick);
    bench_print(&r);
    fflush(stdout);
    if (!o.json && system("uptime") != 0)
        fprintf(stderr, "(no uptime)\n");
    return 0;
}
