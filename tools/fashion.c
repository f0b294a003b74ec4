/* ndm-fashion: the main job. `train` fits an MLP (or a small CNN) to
 * Fashion-MNIST with flat memory, `serve` answers concurrent requests with a
 * manager each, `leak-demo` shows a deliberate leak caught by its line. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fashion_net.h"
#include "ndm/ndm.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static void die(const char *what)
{
    fprintf(stderr, "ndm-fashion: %s: %s (%s)\n", what, ndm_last_error(),
            ndm_status_name(ndm_last_status()));
    exit(1);
}

#define CHECK(expr)                                                             \
    do {                                                                        \
        if ((expr) < 0)                                                         \
            die(#expr);                                                         \
    } while (0)
#define LIVE(h, what)                                                           \
    do {                                                                        \
        if (!(h).id)                                                            \
            die(what);                                                          \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident set size in MiB. */
static double rss_mib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Where the Debian package put the files (dpkg -L), else its usual folder. */
static void find_data(char *dir, size_t n)
{
    FILE *p = popen("dpkg -L dataset-fashion-mnist 2>/dev/null", "r");
    char line[1024];
    snprintf(dir, n, "%s", DEFAULT_DATA);
    if (!p)
        return;
    while (fgets(line, sizeof line, p)) {
        char *s = strstr(line, "/train-images-idx3-ubyte.gz");
        if (s) {
            *s = '\0';
            snprintf(dir, n, "%s", line);
            break;
        }
    }
    pclose(p);
}

static ndm_dataset load_split(ndm_manager data, const char *dir, const char *split, int64_t limit)
{
    char img[1200], lab[1200];
    snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    if (!exists(img) || !exists(lab)) {
        fprintf(stderr,
                "ndm-fashion: %s not found; install the Debian package dataset-fashion-mnist "
                "or pass --data DIR with MNIST-format files\n",
                img);
        exit(1);
    }
    ndm_dataset d;
    CHECK(ndm_dataset_load_idx(data, img, lab, &d));
    if (limit > 0 && limit < ndm_dataset_size(d)) {
        /* a prefix of the examples (CI trains on a subset) */
        ndm_dataset s = {ndm_slice_to(data, d.inputs, 0, 0, limit, 1),
                         ndm_slice_to(data, d.labels, 0, 0, limit, 1)};
        LIVE(s.inputs, "slice");
        LIVE(s.labels, "slice");
        CHECK(ndm_dataset_release(&d));
        return s;
    }
    return d;
}

/* ---- the networks ------------------------------------------------------------- */

static ndm_module build(ndm_manager model, const char *arch, ndm_rng *rng)
{
    ndm_module net = fashion_net(model, arch, rng);
    LIVE(net, "build the network");
    return net;
}

static ndm_array shaped(ndm_array x, bool cnn)
{
    ndm_array y = fashion_input(x, cnn);
    LIVE(y, "reshape");
    return y;
}

/* Correct predictions of net over a dataset, in a manager of its own. */
static double accuracy(ndm_manager parent, ndm_module net, ndm_dataset d, bool cnn)
{
    ndm_manager ev = ndm_manager_new(parent, "eval");
    LIVE(ev, "eval manager");
    ndm_loader ld = ndm_loader_new(ev, d, &(ndm_loader_options){
        .batch_size = cnn ? 250 : 1000, .flags = NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    LIVE(ld, "eval loader");
    CHECK(ndm_module_set_training(net, false));
    ndm_no_grad_begin();
    int64_t right = 0, total = 0;
    ndm_batch b;
    int rc;
    while ((rc = ndm_loader_next(ld, &b)) > 0) {
        ndm_array logits = ndm_forward(net, shaped(b.inputs, cnn));
        ndm_array hits = ndm_sum(ndm_eq(ndm_argmax(logits, 1, false), b.labels), false,
                                 NDM_ALL_AXES_LIST);
        int64_t h;
        CHECK(ndm_item_i64(hits, &h));
        right += h;
        total += b.size;
    }
    CHECK(rc);
    ndm_no_grad_end();
    CHECK(ndm_module_set_training(net, true));
    CHECK(ndm_manager_close(ev));
    return total ? (double)right / (double)total : 0;
}

static void progress(int epoch, int epochs, int64_t done, int64_t total, double loss, double rate)
{
    int width = 30, filled = total ? (int)(width * done / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    printf("\r  epoch %2d/%d [%s] %4lld/%lld batches  loss %.4f  %6.0f examples/s", epoch, epochs,
           bar, (long long)done, (long long)total, loss, rate);
    fflush(stdout);
}

/* Live arrays of every manager of a subtree, in order, for the flatness check. */
typedef struct snapshot {
    uint64_t arrays[64];
    uint64_t bytes[64];
    int n;
    double rss;
} snapshot;

static void snap_walk(ndm_manager m, snapshot *s)
{
    ndm_stats st;
    if (s->n < 64 && ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st) == NDM_OK) {
        s->arrays[s->n] = st.live_arrays;
        s->bytes[s->n] = st.live_bytes;
        s->n++;
    }
}

/* ---- train -------------------------------------------------------------------- */

typedef struct train_opts {
    const char *arch;
    const char *data;
    const char *out;
    int epochs;
    int64_t batch;
    int64_t limit;
    double lr;
    uint64_t seed;
    bool quiet;
} train_opts;

static int train(train_opts o)
{
    bool cnn = !strcmp(o.arch, "cnn");
    char dir[1024];
    if (o.data)
        snprintf(dir, sizeof dir, "%s", o.data);
    else
        find_data(dir, sizeof dir);
    printf("ndm-fashion train: %s on %s, %d epochs, batch %lld, Adam lr %g (cosine), seed %llu\n",
           cnn ? "CNN" : "MLP 784-256-128-10", dir, o.epochs, (long long)o.batch, o.lr,
           (unsigned long long)o.seed);

    /* system/data holds the datasets; system/model the parameters and the
     * optimizer's state, capped before the first step; model/trainer the
     * loader, and a batch manager per step under it */
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    LIVE(data, "data manager");
    LIVE(model, "model manager");
    ndm_dataset train_set = load_split(data, dir, "train", o.limit);
    ndm_dataset test_set = load_split(data, dir, "t10k", o.limit ? o.limit / 6 + 1 : 0);
    printf("  %lld training and %lld test examples\n", (long long)ndm_dataset_size(train_set),
           (long long)ndm_dataset_size(test_set));
    ndm_rng rng = ndm_rng_new(o.seed);
    ndm_module net = build(model, o.arch, &rng);
    char desc[512];
    ndm_module_describe(net, desc, sizeof desc);
    printf("  %s\n", desc);
    ndm_optimizer opt = ndm_adam(model, net, o.lr, 0.9, 0.999, 1e-8, 0.0);
    LIVE(opt, "optimizer");
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    LIVE(trainer, "trainer");
    ndm_loader ld = ndm_loader_new(trainer, train_set, &(ndm_loader_options){
        .batch_size = o.batch, .seed = o.seed,
        .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    LIVE(ld, "loader");
    int64_t nb = ndm_loader_batches(ld);

    snapshot snaps[256];
    int nsnaps = 0;
    double acc = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        CHECK(ndm_optimizer_set_lr(opt, ndm_lr_cosine(o.lr, o.lr * 0.05, epoch - 1, o.epochs)));
        double t0 = now(), loss_sum = 0;
        int64_t seen = 0;
        ndm_batch b;
        int rc;
        while ((rc = ndm_loader_next(ld, &b)) > 0) {
            /* the graph lives in the batch manager, which the next fetch closes */
            CHECK(ndm_grad_begin(b.manager));
            ndm_array logits = ndm_forward(net, shaped(b.inputs, cnn));
            ndm_array loss = ndm_cross_entropy(logits, b.labels);
            LIVE(loss, "loss");
            CHECK(ndm_backward(loss));
            CHECK(ndm_grad_end());
            CHECK(ndm_optimizer_step(opt));
            CHECK(ndm_optimizer_zero_grad(opt));
            double l;
            CHECK(ndm_item(loss, &l));
            loss_sum += l * (double)b.size;
            seen += b.size;
            if (!o.quiet && (b.index % 25 == 0 || b.index + 1 == nb))
                progress(epoch, o.epochs, b.index + 1, nb, loss_sum / (double)seen,
                         (double)seen / (now() - t0));
        }
        CHECK(rc);
        double secs = now() - t0;
        if (!o.quiet)
            printf("\n");
        acc = accuracy(trainer, net, test_set, cnn);
        snapshot *s = &snaps[nsnaps < 256 ? nsnaps++ : 255];
        s->n = 0;
        snap_walk(model, s);
        snap_walk(trainer, s);
        snap_walk(data, s);
        s->rss = rss_mib();
        printf("  epoch %2d: train loss %.4f  test accuracy %.2f%%  %.1f s  %.0f examples/s  "
               "RSS %.1f MiB\n",
               epoch, loss_sum / (double)seen, 100 * acc, secs, (double)seen / secs, s->rss);
        CHECK(ndm_debug_dump(model, stdout));
    }

    /* flat memory from the second epoch on: every count and the RSS */
    if (nsnaps >= 2) {
        snapshot *a = &snaps[1], *z = &snaps[nsnaps - 1];
        bool flat = a->n == z->n;
        for (int i = 0; i < a->n && flat; i++)
            flat = a->arrays[i] == z->arrays[i] && a->bytes[i] == z->bytes[i];
        double growth = a->rss > 0 ? 100.0 * (z->rss - a->rss) / a->rss : 0;
        printf("memory from epoch 2 to %d: manager counts %s, RSS %.1f -> %.1f MiB (%+.2f%%)\n",
               nsnaps, flat ? "identical" : "CHANGED", a->rss, z->rss, growth);
    }
    printf("final test accuracy: %.2f%%\n", 100 * acc);

    if (o.out) {
        /* the parameters and the architecture, for serve */
        const char *names[64];
        ndm_array params[64];
        int n = ndm_module_named_parameters(net, names, params, 64);
        char accs[32];
        snprintf(accs, sizeof accs, "%.4f", acc);
        const char *keys[2] = {"arch", "test_accuracy"}, *vals[2] = {o.arch, accs};
        ndm_named_arrays set = {(size_t)n, names, params, 2, keys, vals};
        CHECK(ndm_safetensors_save(o.out, &set));
        printf("saved %d parameters to %s\n", n, o.out);
    }
    CHECK(ndm_manager_close(model));
    CHECK(ndm_manager_close(data));
    return 0;
}

/* ---- serve -------------------------------------------------------------------- */

typedef struct client {
    ndm_predictor pred;
    ndm_manager home;       /* this worker's manager */
    ndm_array images;       /* (n, 28, 28) u8 */
    ndm_array labels;
    bool cnn;
    int64_t first, count;   /* requests [first, first + count) */
    double *latency;        /* seconds per request */
    int64_t right;
    int errors;
    char error[256];
} client;

static void *serve_worker(void *p)
{
    client *c = p;
    for (int64_t i = 0; i < c->count; i++) {
        int64_t k = c->first + i;
        double t0 = now();
        /* each request gets a manager for its input and its answer */
        ndm_manager req = ndm_manager_new(c->home, "client");
        ndm_array img = ndm_astype(ndm_slice_to(req, c->images, 0, k, k + 1, 1), NDM_F32);
        ndm_array x = ndm_mul_scalar(img, 1.0 / 255.0);
        ndm_array logits = ndm_predict(c->pred, c->cnn ? ndm_reshape(x, NDM_SHAPE(1, 1, 28, 28))
                                                       : x);
        int64_t guess = -1, label = -2;
        ndm_array am = ndm_argmax(logits, 1, false);
        ndm_array lab = ndm_slice_to(req, c->labels, 0, k, k + 1, 1);
        if (ndm_item_i64(am, &guess) != NDM_OK || ndm_item_i64(lab, &label) != NDM_OK) {
            if (!c->errors++)
                snprintf(c->error, sizeof c->error, "%s", ndm_last_error());
        }
        c->right += guess == label;
        if (ndm_manager_close(req) != NDM_OK && !c->errors++)
            snprintf(c->error, sizeof c->error, "%s", ndm_last_error());
        c->latency[i] = now() - t0;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int serve(const char *path, const char *datadir, int64_t requests, int threads)
{
    char dir[1024];
    if (datadir)
        snprintf(dir, sizeof dir, "%s", datadir);
    else
        find_data(dir, sizeof dir);
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    LIVE(data, "data");
    LIVE(model, "model");
    /* the file is mapped: its tensors are copied into the parameters, then
     * the mapping dies with the loading manager */
    ndm_manager loading = ndm_manager_new(model, "loading");
    const ndm_named_arrays *w = ndm_safetensors_load(loading, path, NDM_LOAD_MMAP);
    if (!w)
        die("load the model (run `ndm-fashion train` first)");
    const char *arch = ndm_named_arrays_meta(w, "arch");
    if (!arch)
        arch = "mlp";
    bool cnn = !strcmp(arch, "cnn");
    ndm_rng rng = ndm_rng_new(0);
    ndm_module net = build(model, arch, &rng);
    const char *names[64];
    ndm_array params[64];
    int n = ndm_module_named_parameters(net, names, params, 64);
    for (int i = 0; i < n; i++) {
        int64_t k = ndm_named_arrays_find(w, names[i]);
        if (k < 0) {
            fprintf(stderr, "ndm-fashion: %s has no tensor %s\n", path, names[i]);
            return 1;
        }
        CHECK(ndm_copy_into(params[i], w->arrays[k]));
    }
    CHECK(ndm_manager_close(loading));
    ndm_predictor pred = ndm_predictor_new(model, net);
    LIVE(pred, "predictor");
    char ipath[1200], lpath[1200];
    snprintf(ipath, sizeof ipath, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lpath, sizeof lpath, "%s/t10k-labels-idx1-ubyte.gz", dir);
    ndm_array images = ndm_idx_load(data, ipath);
    ndm_array labels = ndm_idx_load(data, lpath);
    LIVE(images, "test images");
    LIVE(labels, "test labels");
    int64_t avail = ndm_array_dim(images, 0);
    if (requests > avail)
        requests = avail;
    printf("ndm-fashion serve: %s model from %s, %lld requests from %d threads\n",
           cnn ? "CNN" : "MLP", path, (long long)requests, threads);

    ndm_manager workers = ndm_manager_new(ndm_system(), "workers");
    LIVE(workers, "workers");
    client *cs = calloc((size_t)threads, sizeof *cs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double *lat = calloc((size_t)requests, sizeof *lat);
    if (!cs || !th || !lat) {
        fprintf(stderr, "ndm-fashion: out of memory\n");
        return 1;
    }
    int64_t per = requests / threads, extra = requests % threads, at = 0;
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        char nm[32];
        snprintf(nm, sizeof nm, "worker-%d", t);
        cs[t] = (client){pred, ndm_manager_new(workers, nm), images, labels, cnn, at,
                         per + (t < extra), lat + at, 0, 0, ""};
        LIVE(cs[t].home, "worker manager");
        at += cs[t].count;
        if (pthread_create(&th[t], NULL, serve_worker, &cs[t]) != 0) {
            fprintf(stderr, "ndm-fashion: cannot start a thread\n");
            return 1;
        }
    }
    int64_t right = 0;
    int errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        right += cs[t].right;
        if (cs[t].errors) {
            errors += cs[t].errors;
            fprintf(stderr, "  worker %d: %d errors, first: %s\n", t, cs[t].errors, cs[t].error);
        }
    }
    double secs = now() - t0;
    qsort(lat, (size_t)requests, sizeof *lat, cmp_double);
    printf("  throughput %.0f requests/s; latency p50 %.1f us, p99 %.1f us; accuracy %.2f%%; "
           "%d errors\n",
           (double)requests / secs, 1e6 * lat[requests / 2], 1e6 * lat[(requests * 99) / 100],
           100.0 * (double)right / (double)requests, errors);
    printf("after the requests:\n");
    CHECK(ndm_debug_dump(model, stdout));
    CHECK(ndm_debug_dump(workers, stdout));
    ndm_stats ps;
    CHECK(ndm_manager_stats(ndm_predictor_manager(pred), NDM_CPU, NDM_STATS_SUBTREE, &ps));
    printf("live request managers: %llu, live request arrays: %llu\n",
           (unsigned long long)ps.children, (unsigned long long)ps.live_arrays);
    free(cs);
    free(th);
    free(lat);
    CHECK(ndm_manager_close(workers));
    CHECK(ndm_manager_close(model));
    CHECK(ndm_manager_close(data));
    return errors ? 1 : 0;
}

/* ---- leak-demo ------------------------------------------------------------------ */

static int leak_demo(void)
{
    printf("ndm-fashion leak-demo: a training loop that keeps a per-step statistic in the "
           "trainer by mistake\n");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 16, 8, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 8, 4, true, &rng)));
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    LIVE(opt, "optimizer");
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_seq mark = 0;
    for (int step = 0; step < 30; step++) {
        if (step == 10)
            mark = ndm_mark(model); /* warm-up done: from here nothing should accumulate */
        ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_uniform(batch, &rng, NDM_F32, -1, 1, NDM_SHAPE(32, 16));
        ndm_array y = ndm_randint(batch, &rng, NDM_I64, 0, 4, NDM_SHAPE(32));
        CHECK(ndm_grad_begin(batch));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        CHECK(ndm_backward(loss));
        CHECK(ndm_grad_end());
        CHECK(ndm_optimizer_step(opt));
        CHECK(ndm_optimizer_zero_grad(opt));
        ndm_array kept = ndm_copy_to(trainer, loss); /* the bug: should have stayed in the batch */
        LIVE(kept, "copy");
        CHECK(ndm_manager_close(batch));
    }
    printf("\nndm_debug_dump after 30 steps: the trainer grows by one array per step\n");
    CHECK(ndm_debug_dump(model, stdout));
    printf("\nndm_report_since(model, mark taken at step 10):\n");
    CHECK(ndm_report_since(model, mark, stdout));
    printf("\nand a stray array into the capped model fails at once, at its line:\n");
    ndm_array stray = ndm_zeros(model, NDM_F32, NDM_SHAPE(32, 8));
    if (!stray.id)
        printf("  %s\n", ndm_last_error());
    CHECK(ndm_manager_close(model));
    return 0;
}

/* ---- main ----------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: ndm-fashion train [--cnn] [--epochs N] [--batch N] [--lr X] [--seed N]\n"
            "                         [--limit N] [--data DIR] [--out FILE] [--quiet]\n"
            "       ndm-fashion serve [--model FILE] [--requests N] [--threads N] [--data DIR]\n"
            "       ndm-fashion leak-demo\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (!strcmp(argv[1], "train")) {
        train_opts o = {"mlp", NULL, "fashion-model.safetensors", 10, 128, 0, 1e-3, 1, false};
        for (int i = 2; i < argc; i++) {
            const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
            if (!strcmp(a, "--cnn"))
                o.arch = "cnn";
            else if (!strcmp(a, "--quiet"))
                o.quiet = true;
            else if (v && !strcmp(a, "--epochs") && ++i)
                o.epochs = atoi(v);
            else if (v && !strcmp(a, "--batch") && ++i)
                o.batch = atoll(v);
            else if (v && !strcmp(a, "--lr") && ++i)
                o.lr = atof(v);
            else if (v && !strcmp(a, "--seed") && ++i)
                o.seed = strtoull(v, NULL, 10);
            else if (v && !strcmp(a, "--limit") && ++i)
                o.limit = atoll(v);
            else if (v && !strcmp(a, "--data") && ++i)
                o.data = v;
            else if (v && !strcmp(a, "--out") && ++i)
                o.out = v;
            else
                usage();
        }
        if (o.epochs < 1 || o.batch < 1 || !(o.lr > 0))
            usage();
        return train(o);
    }
    if (!strcmp(argv[1], "serve")) {
        const char *model = "fashion-model.safetensors", *data = NULL;
        int64_t requests = 10000;
        int threads = 4;
        for (int i = 2; i < argc; i++) {
            const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
            if (v && !strcmp(a, "--model") && ++i)
                model = v;
            else if (v && !strcmp(a, "--requests") && ++i)
                requests = atoll(v);
            else if (v && !strcmp(a, "--threads") && ++i)
                threads = atoi(v);
            else if (v && !strcmp(a, "--data") && ++i)
                data = v;
            else
                usage();
        }
        if (requests < 1 || threads < 1 || threads > 256)
            usage();
        return serve(model, data, requests, threads);
    }
    if (!strcmp(argv[1], "leak-demo"))
        return leak_demo();
    usage();
}
