/* bench/train: training on Fashion-MNIST, MLP and CNN: time per epoch,
 * examples per second, and the share of a step spent in GEMM. The anchor of
 * the rate is the rate the same steps would have if only their GEMMs ran
 * (the GEMM-bound ceiling), so the ratio is the GEMM share.
 *
 * usage: train [--json] [--quick] [--data DIR]
 *   full: one warm-up epoch then one measured epoch of each network;
 *   quick: 60 warm-up and 120 measured batches of each.
 *        train --vs-pytorch [--python PYTHON] [--pairs N] [--mlp-steps N]
 *              [--cnn-steps N] [--loss-steps N] [--json] [--quick] [--data DIR]
 *   the same networks trained with SGD and momentum beside PyTorch
 *   (train_torch.py, a co-process), turn about, at 1 and 2 threads, and
 *   batch-1 inference at 1 and 2 threads; see vs_torch() below. At one
 *   thread the latency has a second anchor: one thread reading the model's
 *   weights (weights_read.h), the memory floor of a forward pass.
 * Everything is measured again without the OpenBLAS variables (blas_env.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/backends/cpu/gemm.h"
#include "../lib/backends/cpu/parallel.h"
#include "bench.h"
#include "blas_env.h"
#include "fashion_net.h"
#include "torch_proc.h"
#include "weights_read.h"
#include "ndm/ndm.h"

static void die(const char *what)
{
    fprintf(stderr, "bench/train: %s: %s\n", what, ndm_last_error());
    exit(1);
}

typedef struct result {
    double epoch_s, rate, gemm_rate, share;
} result;

/* Run `batches` training steps (0: a whole epoch); returns seconds. */
static double steps(ndm_loader ld, ndm_module net, ndm_optimizer opt, bool cnn, int64_t batches,
                    int64_t *examples)
{
    double t0 = bench_now();
    int64_t done = 0, seen = 0;
    ndm_batch b;
    int rc;
    while ((batches == 0 || done < batches) && (rc = ndm_loader_next(ld, &b)) != 0) {
        if (rc < 0)
            die("loader");
        if (ndm_grad_begin(b.manager) < 0)
            die("grad_begin");
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, fashion_input(b.inputs, cnn)), b.labels);
        if (!loss.id || ndm_backward(loss) < 0 || ndm_grad_end() < 0 ||
            ndm_optimizer_step(opt) < 0 || ndm_optimizer_zero_grad(opt) < 0)
            die("step");
        done++;
        seen += b.size;
    }
    *examples = seen;
    return bench_now() - t0;
}

static result run(const char *arch, ndm_dataset ds, bool quick)
{
    bool cnn = !strcmp(arch, "cnn");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = fashion_net(model, arch, &rng);
    ndm_optimizer opt = ndm_adam(model, net, 1e-3, 0.9, 0.999, 1e-8, 0);
    if (!net.id || !opt.id || ndm_manager_cap(model, NDM_CAP_ARRAYS) < 0)
        die("model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_loader ld = ndm_loader_new(trainer, ds, &(ndm_loader_options){
        .batch_size = 128, .seed = 1,
        .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    if (!ld.id)
        die("loader");
    int64_t nb = ndm_loader_batches(ld), ex;
    steps(ld, net, opt, cnn, quick ? 60 : 0, &ex);
    if (!quick && ndm_loader_set_epoch(ld, 1) < 0)
        die("epoch");
    ndm__gemm_profile(true);
    double s = steps(ld, net, opt, cnn, quick ? 120 : 0, &ex);
    double g = ndm__gemm_profile_seconds();
    ndm__gemm_profile(false);
    int64_t measured = quick ? 120 : nb;
    result r = {s * (double)nb / (double)measured, (double)ex / s, g > 0 ? (double)ex / g : 0,
                g / s};
    if (ndm_manager_close(model) < 0)
        die("close");
    return r;
}


/* ---- --vs-pytorch -------------------------------------------------------------
 * The same networks, initial weights, batches (file order, 128 per step) and
 * optimizer (SGD with momentum) in ndm and in PyTorch. ndm's initial weights go
 * to PyTorch through a checkpoint (ndm_module_save), so the losses of the first
 * steps can be compared. Each figure is measured turn about: a block of ndm's
 * steps, then a block of PyTorch's, `pairs` times; the ratio is the median of
 * the pairs' ratios. PyTorch stays alive between its turns, so its start-up is
 * paid once. Thread counts: ndm's pool (which also runs its GEMMs) and
 * torch.set_num_threads take the same value. */

#ifndef NDM_BENCH_TRAIN_TORCH_SCRIPT
#define NDM_BENCH_TRAIN_TORCH_SCRIPT "bench/train_torch.py"
#endif

#define VS_LR 0.01
#define VS_MOMENTUM 0.9
#define VS_MAXPAIRS 32
#define VS_MAXLOSS 1000

typedef struct vs_opts {
    const char *python, *data;
    int pairs, mlp_steps, cnn_steps, loss_steps, infer_calls;
} vs_opts;

/* The script: beside this program (the build copies it there), else in the
 * source tree. */
static void torch_script(char *path, size_t n)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k > 0) {
        self[k] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, n, "%s/train_torch.py", self);
            if (access(path, R_OK) == 0)
                return;
        }
    }
    snprintf(path, n, "%s", NDM_BENCH_TRAIN_TORCH_SCRIPT);
}

/* ndm's side: a model trained with SGD and momentum on batches in file order. */
typedef struct vs_net {
    ndm_manager model;
    ndm_module net;
    ndm_optimizer opt;
    ndm_loader ld;
    bool cnn;
    int64_t epoch;
} vs_net;

/* Build `arch` from seed 1 and write its initial state to `weights`. */
static vs_net vs_net_new(const char *arch, ndm_dataset ds, const char *weights)
{
    vs_net v = {.cnn = !strcmp(arch, "cnn")};
    v.model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    v.net = fashion_net(v.model, arch, &rng);
    if (!v.net.id || ndm_module_save(v.net, weights) != NDM_OK)
        die("model");
    v.opt = ndm_sgd(v.model, v.net, VS_LR, VS_MOMENTUM, 0.0);
    if (!v.opt.id || ndm_manager_cap(v.model, NDM_CAP_ARRAYS) < 0)
        die("optimizer");
    ndm_manager trainer = ndm_manager_new(v.model, "trainer");
    v.ld = ndm_loader_new(trainer, ds, &(ndm_loader_options){
        .batch_size = 128, .seed = 1,
        .flags = NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    if (!v.ld.id)
        die("loader");
    return v;
}

/* One training step; its loss in *loss when asked. */
static void vs_step(vs_net *v, double *loss_out)
{
    ndm_batch b;
    int rc = ndm_loader_next(v->ld, &b);
    if (rc == 0) { /* the epoch is over: the next, in the same order */
        if (ndm_loader_set_epoch(v->ld, ++v->epoch) < 0)
            die("epoch");
        rc = ndm_loader_next(v->ld, &b);
    }
    if (rc <= 0)
        die("loader");
    if (ndm_grad_begin(b.manager) < 0)
        die("grad_begin");
    ndm_array loss = ndm_cross_entropy(ndm_forward(v->net, fashion_input(b.inputs, v->cnn)),
                                       b.labels);
    if (!loss.id || ndm_backward(loss) < 0 || ndm_grad_end() < 0 ||
        ndm_optimizer_step(v->opt) < 0 || ndm_optimizer_zero_grad(v->opt) < 0)
        die("step");
    if (loss_out && ndm_item(loss, loss_out) < 0)
        die("loss");
}

/* `steps` steps: the median seconds per step, and the block's total. */
static double vs_block(vs_net *v, int steps, double *total)
{
    double *t = malloc((size_t)steps * sizeof *t), t0 = bench_now();
    if (!t)
        die("memory");
    for (int i = 0; i < steps; i++) {
        double s = bench_now();
        vs_step(v, NULL);
        t[i] = bench_now() - s;
    }
    *total = bench_now() - t0;
    double m = bench_median(t, steps);
    free(t);
    return m;
}

/* PyTorch's losses of the first `n` steps from `weights` at `threads`
 * threads, into out; how many it gave, or -1. */
static int torch_losses(torch_proc *tp, const char *arch, const char *weights, int threads,
                        int n, double *out)
{
    static char ans[VS_MAXLOSS * 24];
    if (!torch_ask(tp, ans, sizeof ans, "threads %d", threads) ||
        !torch_ask(tp, ans, sizeof ans, "setup %s %s %.17g %.17g", arch, weights, VS_LR,
                   VS_MOMENTUM) ||
        !torch_ask(tp, ans, sizeof ans, "losses %d", n))
        return -1;
    char *p = ans, *end;
    int got = 0;
    for (; got < n; got++, p = end) {
        out[got] = strtod(p, &end);
        if (end == p)
            break;
    }
    return got;
}

static double max_abs_diff(const double *a, const double *b, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        worst = d > worst || isnan(d) ? d : worst;
    }
    return worst;
}

/* Losses of the first `n` steps from the same weights on both sides, ndm and
 * PyTorch at one thread. The anchor is PyTorch against itself at two threads:
 * a network with ReLU and max-pool turns a rounding difference into a larger
 * one whenever a unit crosses zero or a window's maximum changes, so no two
 * float32 runs stay within rounding for hundreds of steps. */
static void vs_losses(bench_report *r, torch_proc *tp, const char *arch, ndm_dataset ds,
                      const char *weights, int n)
{
    static double ours[VS_MAXLOSS], theirs[VS_MAXLOSS], theirs2[VS_MAXLOSS];
    if (n > VS_MAXLOSS)
        n = VS_MAXLOSS;
    vs_net v = vs_net_new(arch, ds, weights);
    for (int i = 0; i < n; i++)
        vs_step(&v, &ours[i]);
    if (ndm_manager_close(v.model) < 0)
        die("close");
    if (!tp || n <= 0)
        return;
    int got = torch_losses(tp, arch, weights, 1, n, theirs);
    if (got <= 0)
        return;
    int got2 = torch_losses(tp, arch, weights, 2, got, theirs2);
    double worst = max_abs_diff(ours, theirs, got);
    double self = got2 == got ? max_abs_diff(theirs, theirs2, got) : NAN;
    int early = got < 20 ? got : 20;
    char name[96], note[256];
    snprintf(name, sizeof name, "%s_loss_max_abs_diff_vs_torch", arch);
    bench_add(r, name, worst, "abs", "PyTorch 1 thread against PyTorch 2 threads", self);
    snprintf(note, sizeof note,
             "%s losses, %d steps at 1 thread: step 1 ndm %.7f torch %.7f; step %d ndm %.7f "
             "torch %.7f; largest difference %.2g (first %d steps %.2g); PyTorch 1 against 2 "
             "threads %.2g (first %d steps %.2g)",
             arch, got, ours[0], theirs[0], got, ours[got - 1], theirs[got - 1], worst, early,
             max_abs_diff(ours, theirs, early), self, early,
             got2 == got ? max_abs_diff(theirs, theirs2, early) : NAN);
    bench_note(r, note);
}

/* A figure from the pairs, or ndm's alone without PyTorch. */
static void vs_add(bench_report *r, const char *name, const char *unit, double scale,
                   const char *anchor, const double *ours, const double *theirs, int pairs,
                   bool have_torch)
{
    if (!have_torch) {
        double v[VS_MAXPAIRS];
        memcpy(v, ours, (size_t)pairs * sizeof *v);
        bench_add(r, name, bench_median(v, pairs) * scale, unit, NULL, 0);
        return;
    }
    bench_pairs p = bench_pair_stats(ours, theirs, pairs, false);
    bench_add_pairs(r, name, p.fig_t * scale, unit, anchor, p.anchor_t * scale, p);
}

/* Training steps of `arch` at 1 and 2 threads, and its speedup. */
static void vs_train(bench_report *r, torch_proc *tp, const char *arch, ndm_dataset ds,
                     const char *weights, int steps, int pairs)
{
    int warm = steps < 20 ? 2 : 10;
    double step_t[2][2]; /* [threads - 1][ndm, torch]: median per-step seconds */
    char ans[256];
    vs_net v = vs_net_new(arch, ds, weights);
    bool have = tp && torch_ask(tp, ans, sizeof ans, "setup %s %s %.17g %.17g", arch, weights,
                                VS_LR, VS_MOMENTUM);
    for (int threads = 1; threads <= 2; threads++) {
        ndm__set_num_threads(threads);
        have = have && torch_ask(tp, ans, sizeof ans, "threads %d", threads);
        double ms[VS_MAXPAIRS], mt[VS_MAXPAIRS], ts[VS_MAXPAIRS], tt[VS_MAXPAIRS], total;
        (void)vs_block(&v, warm, &total);
        have = have && torch_ask(tp, ans, sizeof ans, "steps %d", warm);
        for (int i = 0; i < pairs; i++) {
            ms[i] = vs_block(&v, steps, &ts[i]);
            if (have && torch_ask(tp, ans, sizeof ans, "steps %d", steps) &&
                sscanf(ans, "%lf %lf", &mt[i], &tt[i]) == 2)
                continue;
            have = false;
        }
        char name[96], anchor[160];
        snprintf(name, sizeof name, "%s_step_ms_%dt_vs_torch", arch, threads);
        snprintf(anchor, sizeof anchor, "PyTorch %.100s, same step, %d thread%s",
                 tp ? tp->version : "", threads, threads > 1 ? "s" : "");
        vs_add(r, name, "ms", 1e3, anchor, ms, mt, pairs, have);
        snprintf(name, sizeof name, "%s_%d_steps_s_%dt_vs_torch", arch, steps, threads);
        vs_add(r, name, "s", 1.0, anchor, ts, tt, pairs, have);
        double a[VS_MAXPAIRS], b[VS_MAXPAIRS];
        memcpy(a, ms, sizeof a);
        memcpy(b, mt, sizeof b);
        step_t[threads - 1][0] = bench_median(a, pairs);
        step_t[threads - 1][1] = have ? bench_median(b, pairs) : 0;
    }
    char name[96];
    snprintf(name, sizeof name, "%s_speedup_1_to_2t_vs_torch", arch);
    bench_add(r, name, step_t[0][0] / step_t[1][0], "x",
              have ? "PyTorch's speedup, same steps" : NULL, have ? step_t[0][1] / step_t[1][1] : 0);
    if (ndm_manager_close(v.model) < 0)
        die("close");
}

/* Batch-1 MLP inference at `threads` on both sides: p50 of ndm_predict
 * (from C) against p50 of a no-grad forward (from Python), `calls` requests
 * per turn. */
static void vs_infer(bench_report *r, torch_proc *tp, ndm_dataset ds, const char *weights,
                     int calls, int pairs, int threads)
{
    ndm__set_num_threads(threads);
    char ans[256];
    bool have = tp && torch_ask(tp, ans, sizeof ans, "threads %d", threads) &&
                torch_ask(tp, ans, sizeof ans, "infer_setup %s", weights);
    ndm_manager model = ndm_manager_new(ndm_system(), "serve");
    ndm_manager req = ndm_manager_new(ndm_system(), "requests");
    ndm_rng rng = ndm_rng_new(2);
    ndm_no_grad_begin();
    ndm_module net = fashion_net(model, "mlp", &rng);
    ndm_no_grad_end();
    if (!net.id || ndm_module_load(net, weights, NDM_CHECKPOINT_STRICT) < 0)
        die("serving model");
    ndm_predictor pr = ndm_predictor_new(model, net);
    ndm_array x = ndm_empty(req, NDM_F32, NDM_SHAPE(1, 28, 28));
    if (!pr.id || !x.id)
        die("predictor");
    const uint8_t *px = ndm_array_data(ds.inputs);
    float *xf = ndm_array_data(x);
    for (int i = 0; i < 784; i++)
        xf[i] = (float)px[i] / 255.0f;
    /* At one thread, the same number of passes that only read the weights
     * follow each block of requests: the floor beside the figure. */
    weights_read wr;
    bool floor = threads == 1 && weights_read_init(&wr, net);
    double *lat = malloc((size_t)calls * sizeof *lat), ours[VS_MAXPAIRS], theirs[VS_MAXPAIRS],
           reads[VS_MAXPAIRS];
    volatile float sink = 0;
    if (!lat)
        die("memory");
    for (int i = -1; i < pairs; i++) { /* -1: the warm-up turn */
        for (int c = 0; c < calls; c++) {
            double t0 = bench_now();
            ndm_array y = ndm_predict(pr, x);
            if (!y.id || ndm_array_release(y) < 0)
                die("predict");
            lat[c] = bench_now() - t0;
        }
        double p50 = bench_median(lat, calls), warm;
        for (int c = 0; floor && c < calls; c++) {
            double t0 = bench_now();
            sink += weights_read_pass(&wr);
            lat[c] = bench_now() - t0;
        }
        if (floor && i >= 0)
            reads[i] = bench_median(lat, calls);
        if (have && !(torch_ask(tp, ans, sizeof ans, "infer %d", calls) &&
                      sscanf(ans, "%lf", i >= 0 ? &theirs[i] : &warm) == 1))
            have = false;
        if (i >= 0)
            ours[i] = p50;
    }
    free(lat);
    char name[64], anchor[128];
    snprintf(name, sizeof name, "mlp_batch1_infer_p50_us_%dt_vs_torch", threads);
    snprintf(anchor, sizeof anchor,
             "PyTorch no-grad forward from Python, %d thread%s (ndm: ndm_predict from C)", threads,
             threads > 1 ? "s" : "");
    vs_add(r, name, "us", 1e6, anchor, ours, theirs, pairs, have);
    if (floor) {
        snprintf(name, sizeof name, "mlp_batch1_infer_p50_us_%dt_vs_weights_read", threads);
        snprintf(anchor, sizeof anchor,
                 "one thread reading the model's %.0f KiB of weights once, in the predictor's "
                 "order (p50 of as many passes)", (double)wr.bytes / 1024.0);
        bench_pairs p = bench_pair_stats(ours, reads, pairs, false);
        bench_add_pairs(r, name, p.fig_t * 1e6, "us", anchor, p.anchor_t * 1e6, p);
    }
    (void)sink;
    if (ndm_manager_close(req) < 0 || ndm_manager_close(model) < 0)
        die("close");
}

static int vs_int(int argc, char **argv, const char *flag, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], flag))
            return atoi(argv[i + 1]);
    return dflt;
}

static void vs_torch(bench_report *r, ndm_dataset ds, const char *dir, int argc, char **argv,
                     bool quick)
{
    vs_opts o = {
        .python = getenv("NDM_TORCH_PYTHON"),
        .data = dir,
        .pairs = vs_int(argc, argv, "--pairs", 3),
        .mlp_steps = vs_int(argc, argv, "--mlp-steps", quick ? 40 : 469),
        .cnn_steps = vs_int(argc, argv, "--cnn-steps", quick ? 8 : 200),
        .loss_steps = vs_int(argc, argv, "--loss-steps", quick ? 20 : 200),
        .infer_calls = quick ? 2000 : 20000,
    };
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--python"))
            o.python = argv[i + 1];
    if (!o.python || !*o.python)
        o.python = "python3";
    if (o.pairs < 1 || o.pairs > VS_MAXPAIRS || o.mlp_steps < 1 || o.cnn_steps < 1 ||
        o.loss_steps < 0) {
        fprintf(stderr, "bench/train: --pairs takes 1 to %d, --mlp-steps and --cnn-steps at "
                        "least 1, --loss-steps at least 0\n", VS_MAXPAIRS);
        exit(2);
    }
    torch_proc t, *tp = &t;
    char why[512], note[256], ans[256], script[PATH_MAX + 32];
    torch_script(script, sizeof script);
    if (!torch_start(&t, o.python, script, why, sizeof why)) {
        snprintf(note, sizeof note, "no PyTorch (%.200s): ndm's figures alone", why);
        bench_note(r, note);
        tp = NULL;
    } else if (!torch_ask(&t, ans, sizeof ans, "data %s", o.data)) {
        snprintf(note, sizeof note, "PyTorch could not read %.150s: ndm's figures alone", o.data);
        bench_note(r, note);
        torch_stop(&t);
        tp = NULL;
    } else {
        snprintf(note, sizeof note, "PyTorch %s from %s", t.version, o.python);
        bench_note(r, note);
    }
    snprintf(note, sizeof note,
             "batch 128 in file order, SGD lr %g momentum %g; %d pair%s of turns (ndm's block, "
             "then PyTorch's); a block: %d MLP / %d CNN steps after warm-up; ms/step: median of "
             "a block",
             VS_LR, VS_MOMENTUM, o.pairs, o.pairs > 1 ? "s" : "", o.mlp_steps, o.cnn_steps);
    bench_note(r, note);
    char tmp[512];
    if (!bench_tempdir(tmp, sizeof tmp, "train"))
        die("a temporary folder");
    char wm[600], wc[600];
    snprintf(wm, sizeof wm, "%s/mlp.safetensors", tmp);
    snprintf(wc, sizeof wc, "%s/cnn.safetensors", tmp);
    int before = ndm__set_num_threads(1);
    vs_losses(r, tp, "mlp", ds, wm, o.loss_steps);
    vs_losses(r, tp, "cnn", ds, wc, o.loss_steps);
    vs_train(r, tp, "mlp", ds, wm, o.mlp_steps, o.pairs);
    vs_train(r, tp, "cnn", ds, wc, o.cnn_steps, o.pairs);
    vs_infer(r, tp, ds, wm, o.infer_calls, quick ? 3 : 5, 1);
    vs_infer(r, tp, ds, wm, o.infer_calls, quick ? 3 : 5, 2);
    ndm__set_num_threads(before);
    if (tp)
        torch_stop(tp);
    unlink(wm);
    unlink(wc);
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    const char *dir = "/usr/share/datasets/fashion-mnist";
    bool vs = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--vs-pytorch"))
            vs = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--json] [--quick] [--data DIR]\n"
                   "       %s --vs-pytorch [--python PYTHON] [--pairs N] [--mlp-steps N]\n"
                   "          [--cnn-steps N] [--loss-steps N] [--json] [--quick] [--data DIR]\n"
                   "  PYTHON (else NDM_TORCH_PYTHON, else python3) runs PyTorch for the anchors\n"
                   "  of --vs-pytorch; without it, ndm's figures alone. Blocks of N steps per\n"
                   "  turn (full: an MLP epoch, 469 steps, and 200 CNN steps; quick: 40 and 8)\n",
                   argv[0], argv[0]);
            return 0;
        }
    }
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    char img[1024], lab[1024];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", dir);
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_dataset ds;
    if (ndm_dataset_load_idx(data, img, lab, &ds) < 0)
        die("load Fashion-MNIST (install dataset-fashion-mnist or pass --data DIR)");
    bool child = bench_blas_is_child(argc, argv);
    if (!child)
        bench_blas_note(&rep, "train");
    if (vs) {
        vs_torch(&rep, ds, dir, argc, argv, o.quick);
    } else {
        char note[256];
        snprintf(note, sizeof note,
                 "%s: batch 128, Adam; GEMM provider %s; a step is forward, cross-entropy, "
                 "backward and the optimizer",
                 o.quick ? "quick: 120 measured batches" : "one measured epoch of 60000 examples",
                 ndm_gemm_provider());
        bench_note(&rep, note);
        const char *archs[2] = {"mlp", "cnn"};
        for (int i = 0; i < 2; i++) {
            result r = run(archs[i], ds, o.quick);
            char name[64], anchor[128];
            snprintf(name, sizeof name, "%s_epoch_seconds", archs[i]);
            bench_add(&rep, name, r.epoch_s, "s", NULL, 0);
            snprintf(name, sizeof name, "%s_examples_per_s_vs_gemm_bound", archs[i]);
            snprintf(anchor, sizeof anchor, "the rate if the %s step did only its GEMMs",
                     archs[i]);
            bench_add(&rep, name, r.rate, "examples/s", anchor, r.gemm_rate);
            snprintf(name, sizeof name, "%s_gemm_share_of_step", archs[i]);
            bench_add(&rep, name, r.share, "fraction", NULL, 0);
        }
    }
    if (ndm_manager_close(data) < 0)
        die("close");
    if (child) {
        bench_blas_child_emit(&rep);
        return 0;
    }
    bench_blas_rerun(&rep, "train", argc - 1, argv + 1);
    bench_print(&rep);
    return 0;
}
