/* bench/train: training on Fashion-MNIST, MLP and CNN: time per epoch,
 * examples per second, and the share of a step spent in GEMM. The anchor of
 * the rate is the rate the same steps would have if only their GEMMs ran
 * (the GEMM-bound ceiling), so the ratio is the GEMM share.
 *
 * usage: train [--json] [--quick] [--data DIR]
 *   full: one warm-up epoch then one measured epoch of each network;
 *   quick: 60 warm-up and 120 measured batches of each.
 * Everything is measured again without the OpenBLAS variables (blas_env.h). */
#include <stdlib.h>
#include <string.h>

#include "../lib/backends/cpu/gemm.h"
#include "bench.h"
#include "blas_env.h"
#include "fashion_net.h"
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

int main(int argc, char **argv)
{
    const char *dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--data"))
            dir = argv[i + 1];
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    char img[1024], lab[1024];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", dir);
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_dataset ds;
    if (ndm_dataset_load_idx(data, img, lab, &ds) < 0)
        die("load Fashion-MNIST (install dataset-fashion-mnist or pass --data DIR)");
    char note[256];
    snprintf(note, sizeof note,
             "%s: batch 128, Adam; GEMM provider %s; a step is forward, cross-entropy, backward "
             "and the optimizer",
             o.quick ? "quick: 120 measured batches" : "one measured epoch of 60000 examples",
             ndm_gemm_provider());
    bench_note(&rep, note);
    bool child = bench_blas_is_child(argc, argv);
    if (!child)
        bench_blas_note(&rep, "train");
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
