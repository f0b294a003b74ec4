/* bench/budget: training within a byte budget. For the transformer (ndm-text's
 * network) and the Fashion CNN, a training step's time and peak bytes under
 * budgets of 1.0, 0.7, 0.5 and 0.33 of the unbudgeted step's peak, each
 * budgeted step interleaved with an unbudgeted one (medians of the pairs'
 * ratios); the steps that ran out of budget are counted, and every budgeted
 * loss is checked bit for bit against the unbudgeted one.
 *
 * A budgeted backward also lets go of each rule's temporaries and of the
 * units it has passed, which the unbudgeted backward keeps to its end; so a
 * budget above the budgeted step's own peak with room to spare (the
 * "floor", measured first) recomputes nothing. The same fractions of the
 * floor show what recomputation itself costs.
 *
 * Peak bytes: the allocator's requested bytes over the step (the model's
 * parameters and gradients, made before, excluded).
 *
 * usage: budget [--json] [--quick] */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "fashion_net.h"
#include "ndm/ndm.h"
#include "text_corpus.h"
#include "text_model.h"

static void die(const char *what)
{
    fprintf(stderr, "bench/budget: %s: %s\n", what, ndm_last_error());
    exit(1);
}

typedef struct job {
    const char *name;
    bool gpt;
    ndm_manager model;
    ndm_module net;
    ndm_array params[256];
    int np;
    int64_t rows, seq;
    float *x;
    int64_t *ids, *labels;
} job;

static const text_config gpt_cfg = {TEXT_VOCAB, 64, 128, 4, 4};

static job job_new(const char *name, bool gpt)
{
    job j = {.name = name, .gpt = gpt};
    j.model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    j.net = gpt ? text_model_new(j.model, &gpt_cfg, &rng) : fashion_net(j.model, "cnn", &rng);
    if (!j.net.id)
        die("model");
    j.np = ndm_module_parameters(j.net, j.params, 256);
    if (j.np <= 0 || j.np > 256)
        die("parameters");
    j.rows = gpt ? 16 : 64;
    j.seq = gpt ? gpt_cfg.ctx : 1;
    size_t n = (size_t)(j.rows * j.seq);
    j.ids = malloc(n * sizeof *j.ids);
    j.labels = malloc(n * sizeof *j.labels);
    j.x = malloc((size_t)j.rows * 784 * sizeof *j.x);
    if (!j.ids || !j.labels || !j.x)
        die("memory");
    for (size_t i = 0; i < n; i++) {
        j.ids[i] = (int64_t)((i * 37 + 11) % TEXT_VOCAB);
        j.labels[i] = gpt ? (int64_t)((i * 53 + 5) % TEXT_VOCAB) : (int64_t)(i % 10);
    }
    for (int64_t i = 0; i < j.rows * 784; i++)
        j.x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    return j;
}

/* One step (forward, backward, gradients zeroed) under `budget` bytes (0:
 * none): its time, peak bytes and loss; false when it ran out of budget. */
static bool step(job *j, uint64_t budget, double *secs, int64_t *peak, float *loss,
                 uint64_t *recomputed)
{
    int64_t before = 0, top = 0;
    if (ndm_memory_reset_peak_stats(NDM_CPU) != NDM_OK ||
        ndm_memory_stat_get(NDM_CPU, "requested_bytes.all.current", &before) != NDM_OK)
        die("stats");
    double t0 = bench_now();
    ndm_manager batch = ndm_manager_new(j->model, "batch");
    ndm_status st = budget ? ndm_grad_begin_budget(batch, budget) : ndm_grad_begin(batch);
    if (st != NDM_OK)
        die("grad_begin");
    ndm_array l;
    if (j->gpt) {
        ndm_array tok = ndm_from_buffer(batch, NDM_I64, j->ids, NDM_SHAPE(j->rows, j->seq));
        ndm_array tgt = ndm_from_buffer(batch, NDM_I64, j->labels, NDM_SHAPE(j->rows * j->seq));
        ndm_array logits = ndm_forward(j->net, tok);
        l = ndm_cross_entropy(ndm_reshape(logits, NDM_SHAPE(j->rows * j->seq, TEXT_VOCAB)), tgt);
    } else {
        ndm_array x = ndm_from_buffer(batch, NDM_F32, j->x, NDM_SHAPE(j->rows, 784));
        ndm_array y = ndm_from_buffer(batch, NDM_I64, j->labels, NDM_SHAPE(j->rows));
        l = ndm_cross_entropy(ndm_forward(j->net, fashion_input(x, true)), y);
    }
    st = l.id ? ndm_backward(l) : ndm_last_status();
    ndm_grad_budget_stats bs;
    if (recomputed && st == NDM_OK && ndm_grad_budget_get_stats(&bs) == NDM_OK)
        *recomputed = bs.recomputed_bytes;
    (void)ndm_grad_end();
    if (st == NDM_OK && ndm_array_copy_out(l, loss, sizeof *loss) != NDM_OK)
        die("loss");
    if (ndm_manager_close(batch) != NDM_OK || ndm_zero_grad((size_t)j->np, j->params) != NDM_OK)
        die("close");
    *secs = bench_now() - t0;
    if (ndm_memory_stat_get(NDM_CPU, "requested_bytes.all.peak", &top) != NDM_OK)
        die("stats");
    *peak = top - before;
    return st == NDM_OK;
}

/* Budgets at fractions of `ref` bytes (`of`: what ref is, in the names). */
static void at_fractions(bench_report *r, job *j, int reps, int64_t ref, const char *of)
{
    static const double fracs[] = {1.0, 0.7, 0.5, 0.33};
    for (size_t k = 0; k < sizeof fracs / sizeof fracs[0]; k++) {
        uint64_t budget = (uint64_t)((double)ref * fracs[k]);
        double ft[64], at[64], t, tb;
        int n = 0, ooms = 0, diff = 0;
        int64_t peak = 0, p, plain_peak = 0;
        float lp, lb;
        uint64_t recomputed = 0;
        for (int i = 0; i < reps; i++) {
            bool ok = step(j, budget, &tb, &p, &lb, &recomputed);
            if (!step(j, 0, &t, &plain_peak, &lp, NULL))
                die("unbudgeted step");
            if (!ok) {
                ooms++;
                ndm_clear_error();
                continue;
            }
            diff += memcmp(&lb, &lp, sizeof lb) != 0;
            if (p > peak)
                peak = p;
            ft[n] = tb;
            at[n++] = t;
        }
        char name[96], anchor[160];
        snprintf(anchor, sizeof anchor, "unbudgeted step, interleaved (%d pairs)", n);
        if (n) {
            bench_pairs bp = bench_pair_stats(ft, at, n, false);
            snprintf(name, sizeof name, "%s_step_s_at_%.2f_%s_vs_unbudgeted", j->name, fracs[k], of);
            bench_add_pairs(r, name, bp.fig_t, "s", anchor, bp.anchor_t, bp);
            snprintf(name, sizeof name, "%s_peak_bytes_at_%.2f_%s_vs_unbudgeted", j->name,
                     fracs[k], of);
            bench_add(r, name, (double)peak, "B", "unbudgeted step's peak", (double)plain_peak);
            snprintf(name, sizeof name, "%s_recomputed_bytes_at_%.2f_%s", j->name, fracs[k], of);
            bench_add(r, name, (double)recomputed, "B/step", "", 0);
        }
        snprintf(name, sizeof name, "%s_ooms_at_%.2f_%s_of_%d", j->name, fracs[k], of, reps);
        bench_add(r, name, ooms, "steps", "", 0);
        snprintf(name, sizeof name, "%s_losses_not_bit_equal_at_%.2f_%s", j->name, fracs[k], of);
        bench_add(r, name, diff, "steps", "", 0);
    }
}

static void run(bench_report *r, job *j, bool quick)
{
    int reps = quick ? 3 : 9;
    double t;
    int64_t plain_peak = 0, floor_peak = 0;
    float l;
    /* warm-up, the unbudgeted peak, and the floor */
    for (int i = 0; i < 2; i++)
        if (!step(j, 0, &t, &plain_peak, &l, NULL))
            die("unbudgeted step");
    if (!step(j, (uint64_t)plain_peak, &t, &floor_peak, &l, NULL))
        die("budgeted step");
    at_fractions(r, j, reps, plain_peak, "peak");
    at_fractions(r, j, reps, floor_peak, "floor");
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report r = {.o = o};
    fflush(stdout);
    if (!o.json && system("uptime") != 0)
        fprintf(stderr, "(no uptime)\n");
    job g = job_new("gpt", true), c = job_new("cnn", false);
    bench_note(&r, "gpt: 4 blocks, width 128, 4 heads, 16 x 64 tokens; cnn: Fashion CNN, 64 images");
    run(&r, &g, o.quick);
    run(&r, &c, o.quick);
    bench_print(&r);
    fflush(stdout);
    if (!o.json && system("uptime") != 0)
        fprintf(stderr, "(no uptime)\n");
    if (ndm_manager_close(g.model) != NDM_OK || ndm_manager_close(c.model) != NDM_OK)
        die("close");
    free(g.x), free(g.ids), free(g.labels), free(c.x), free(c.ids), free(c.labels);
    return 0;
}
