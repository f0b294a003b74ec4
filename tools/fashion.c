/* ndm-fashion: the main job. `train` fits an MLP (or a small CNN) to
 * Fashion-MNIST with flat memory, `serve` answers concurrent requests with a
 * manager each, `leak-demo` shows a deliberate leak caught by its line. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fashion_net.h"
#include "job.h"
#include "ndm/ndm.h"
#include "progress.h"

const char *prog = "ndm-fashion";

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

/* A library call failed: say what we were doing, then ndm's own message
 * (which names the cause and the line). */
static void die(const char *doing)
{
    fprintf(stderr, "ndm-fashion: %s failed: %s\n", doing, ndm_last_error());
    exit(1);
}

#define CHECK(expr, doing)                                                      \
    do {                                                                        \
        if ((expr) < 0)                                                         \
            die(doing);                                                         \
    } while (0)
#define LIVE(h, doing)                                                          \
    do {                                                                        \
        if (!(h).id)                                                            \
            die(doing);                                                         \
    } while (0)

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

/* The data folder: --data, else where the package put it. */
static void data_dir(const char *given, char *dir, size_t n)
{
    if (given)
        snprintf(dir, n, "%s", given);
    else
        find_data(dir, n);
}

/* Both files of a split, or a message naming the one that is missing. */
static void split_paths(const char *cmd, const char *dir, const char *split, char *img, char *lab,
                        size_t n)
{
    snprintf(img, n, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lab, n, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    const char *what[2] = {"images", "labels"}, *path[2] = {img, lab};
    for (int i = 0; i < 2; i++) {
        if (!exists(path[i])) {
            fprintf(stderr,
                    "ndm-fashion %s: the %s %s are not at %s; install the Debian package "
                    "dataset-fashion-mnist or pass --data DIR with MNIST-format files\n",
                    cmd, !strcmp(split, "train") ? "training" : "test", what[i], path[i]);
            exit(1);
        }
    }
}


static ndm_dataset load_split(ndm_manager data, const char *img, const char *lab, int64_t limit)
{
    ndm_dataset d;
    CHECK(ndm_dataset_load_idx(data, img, lab, &d), "loading the dataset");
    if (limit > 0 && limit < ndm_dataset_size(d)) {
        /* a prefix of the examples (CI trains on a subset) */
        ndm_dataset s = {ndm_slice_to(data, d.inputs, 0, 0, limit, 1),
                         ndm_slice_to(data, d.labels, 0, 0, limit, 1)};
        LIVE(s.inputs, "taking a subset of the dataset");
        LIVE(s.labels, "taking a subset of the dataset");
        CHECK(ndm_dataset_release(&d), "releasing the full dataset");
        return s;
    }
    return d;
}

/* ---- the networks ------------------------------------------------------------- */

static ndm_module build(ndm_manager model, const char *arch, ndm_rng *rng)
{
    ndm_module net = fashion_net(model, arch, rng);
    LIVE(net, "building the network");
    return net;
}

static ndm_array shaped(ndm_array x, bool cnn)
{
    ndm_array y = fashion_input(x, cnn);
    LIVE(y, "shaping a batch for the network");
    return y;
}

/* ---- evaluation ------------------------------------------------------------------ */

/* Correct predictions of net over a dataset, in a manager of its own. */
static double accuracy(ndm_manager parent, ndm_module net, ndm_dataset d, bool cnn)
{
    const char *doing = "measuring the test accuracy";
    ndm_manager ev = ndm_manager_new(parent, "eval");
    LIVE(ev, doing);
    ndm_loader ld = ndm_loader_new(ev, d, &(ndm_loader_options){
        .batch_size = cnn ? 250 : 1000, .flags = NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64});
    LIVE(ld, doing);
    CHECK(ndm_module_set_training(net, false), doing);
    ndm_no_grad_begin();
    int64_t right = 0, total = 0;
    ndm_batch b;
    int rc;
    while ((rc = ndm_loader_next(ld, &b)) > 0) {
        ndm_array logits = ndm_forward(net, shaped(b.inputs, cnn));
        ndm_array hits = ndm_sum(ndm_eq(ndm_argmax(logits, 1, false), b.labels), false,
                                 NDM_ALL_AXES_LIST);
        int64_t h;
        CHECK(ndm_item_i64(hits, &h), doing);
        right += h;
        total += b.size;
    }
    CHECK(rc, doing);
    ndm_no_grad_end();
    CHECK(ndm_module_set_training(net, true), doing);
    CHECK(ndm_manager_close(ev), doing);
    return total ? (double)right / (double)total : 0;
}


/* ---- train -------------------------------------------------------------------- */


typedef struct train_opts {
    bool cnn;
    const char *data;
    const char *out;
    int64_t epochs;
    int64_t batch;
    int64_t limit;
    double lr;
    int64_t seed;
    bool quiet;
    bool no_save;
    const char *snapshot;
    bool dist;
    const char *device;
} train_opts;

static int train(train_opts o)
{
    const char *arch = o.cnn ? "cnn" : "mlp";
    /* --dist: every rank trains on its shard of each global batch; rank 0
     * speaks and saves, the others stay silent */
    int rank = 0, ranks = 1;
    if (o.dist) {
        CHECK(ndm_dist_init(), "joining the MPI job");
        rank = ndm_dist_rank();
        ranks = ndm_dist_size();
        if (o.batch % ranks) {
            fprintf(stderr, "ndm-fashion train: --batch %lld is not divisible by the %d ranks\n",
                    (long long)o.batch, ranks);
            return 1;
        }
        if (rank != 0) {
            o.no_save = true;
            o.snapshot = NULL;
            if (!freopen("/dev/null", "w", stdout))
                die("silencing a rank other than 0");
        }
    }
    char dir[1024], why[1200], devname[32];
    ndm_device dev = device_option("train", o.device);
    /* --dist --device cuda: the ranks of a machine share its GPUs, one
     * each while there are enough (cuda:N given explicitly is kept) */
    if (o.dist && !strcmp(o.device, "cuda") && ndm_cuda_device_count() > 0)
        dev = NDM_CUDA(ndm_dist_local_rank() % ndm_cuda_device_count());
    ndm_device_str(dev, devname, sizeof devname);
    data_dir(o.data, dir, sizeof dir);
    /* everything that can be known wrong is checked before the first step */
    char timg[1200], tlab[1200], vimg[1200], vlab[1200];
    split_paths("train", dir, "train", timg, tlab, sizeof timg);
    split_paths("train", dir, "t10k", vimg, vlab, sizeof vimg);
    if (!o.no_save && !writable(o.out, why, sizeof why)) {
        fprintf(stderr, "ndm-fashion train: cannot save the model to %s: %s (choose another --out, "
                "or --no-save)\n", o.out, why);
        return 1;
    }
    /* the device last: a missing GPU is reported before the data is read */
    ndm_manager model = model_manager("train", dev);
    printf("ndm-fashion train: %s on %s, %lld epochs, batch %lld, Adam lr %g (cosine), seed %lld, "
           "device %s\n",
           o.cnn ? "CNN" : "MLP 784-256-128-10", dir, (long long)o.epochs, (long long)o.batch,
           o.lr, (long long)o.seed, devname);

    /* system/data holds the datasets, on the CPU; system/model, on --device,
     * the parameters and the optimizer's state, capped before the first step;
     * model/trainer the loader, and a batch manager per step under it (the
     * loader copies each batch to the trainer's device); with --snapshot
     * every allocation from here on is recorded with its stack */
    if (o.snapshot)
        CHECK(ndm_memory_record_history(true, 0), "starting the memory history");
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    LIVE(data, "creating the data manager");
    ndm_dataset train_set = load_split(data, timg, tlab, o.limit);
    /* the test split keeps the training split's proportion (60000 : 10000) */
    ndm_dataset test_set = load_split(data, vimg, vlab, o.limit ? (o.limit + 5) / 6 : 0);
    printf("  %lld training and %lld test examples\n", (long long)ndm_dataset_size(train_set),
           (long long)ndm_dataset_size(test_set));
    ndm_rng rng = ndm_rng_new((uint64_t)o.seed);
    ndm_module net = build(model, arch, &rng);
    char desc[512];
    ndm_module_describe(net, desc, sizeof desc);
    printf("  %s\n", desc);
    ndm_optimizer opt = ndm_adam(model, net, o.lr, 0.9, 0.999, 1e-8, 0.0);
    LIVE(opt, "creating the optimizer");
    ndm_ddp ddp = {0};
    if (o.dist) {
        ddp = ndm_ddp_new(model, net, opt, NULL); /* its buckets go in the model, before the cap */
        LIVE(ddp, "wrapping the model for data-parallel training");
        printf("  data-parallel over %d processes, %lld examples per process and step, "
               "%d gradient bucket(s)\n", ranks, (long long)(o.batch / ranks),
               ndm_ddp_buckets(ddp));
    }
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS), "capping the model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    LIVE(trainer, "creating the trainer");
    ndm_loader_options lopts = {
        .batch_size = o.batch / ranks, .seed = (uint64_t)o.seed,
        .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64};
    ndm_loader ld = o.dist ? ndm_dist_loader_new(trainer, train_set, &lopts)
                           : ndm_loader_new(trainer, train_set, &lopts);
    LIVE(ld, "creating the batch loader");
    int64_t nb = ndm_loader_batches(ld);

    progress bar;
    progress_init(&bar, stderr, 10.0);
    /* the counts must be equal from the end of the first epoch on (the
     * optimizer's state exists by then); the RSS from the second on, after
     * the allocator's caches have grown to their working size */
    snapshot first = {0}, last = {0}, rss_base = {0};
    int first_epoch = 0, rss_epoch = 0;
    double acc = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        const char *doing = "a training step";
        CHECK(ndm_optimizer_set_lr(opt, ndm_lr_cosine(o.lr, o.lr * 0.05, epoch - 1, o.epochs)),
              "setting the learning rate");
        double t0 = now(), loss_sum = 0;
        int64_t seen = 0;
        ndm_batch b;
        int rc;
        progress_state ps = {epoch, (int)o.epochs, 0, nb, 0, 0, NULL};
        while ((rc = ndm_loader_next(ld, &b)) > 0) {
            /* the graph lives in the batch manager, which the next fetch closes */
            CHECK(ndm_grad_begin(b.manager), doing);
            ndm_array logits = ndm_forward(net, shaped(b.inputs, o.cnn));
            ndm_array loss = ndm_cross_entropy(logits, b.labels);
            if (o.dist) {
                /* a rank that fails here still sends its buckets, so every
                 * rank's step ends with its message */
                (void)ndm_ddp_backward(ddp, loss);
                CHECK(ndm_grad_end(), doing);
                CHECK(ndm_ddp_step(ddp), doing);
            } else {
                LIVE(loss, doing);
                CHECK(ndm_backward(loss), doing);
                CHECK(ndm_grad_end(), doing);
                CHECK(ndm_optimizer_step(opt), doing);
                CHECK(ndm_optimizer_zero_grad(opt), doing);
            }
            double l;
            CHECK(ndm_item(loss, &l), doing);
            loss_sum += l * (double)b.size;
            seen += b.size;
            double t = now();
            ps.done = b.index + 1;
            ps.loss = loss_sum / (double)seen;
            ps.rate = (double)seen / (t - t0);
            if (!o.quiet)
                progress_update(&bar, &ps, t);
        }
        CHECK(rc, "fetching a batch");
        double secs = now() - t0;
        if (o.dist) {
            /* the job's loss and examples, not this rank's share of them */
            const char *summing = "summing the epoch over the ranks";
            double v[2] = {loss_sum, (double)seen};
            ndm_array t = ndm_from_buffer(data, NDM_F64, v, 1, (int64_t[]){2});
            LIVE(t, summing);
            CHECK(ndm_all_reduce_(t, NDM_DIST_SUM), summing);
            CHECK(ndm_array_copy_out(t, v, sizeof v), summing);
            CHECK(ndm_array_release(t), summing);
            loss_sum = v[0];
            seen = (int64_t)v[1];
        }
        if (!o.quiet)
            progress_end_epoch(&bar, &ps, now());
        acc = accuracy(trainer, net, test_set, o.cnn);
        snapshot s = {0};
        snap_add(model, dev, &s);
        snap_add(trainer, dev, &s);
        snap_add(data, dev, &s);
        s.rss = rss_mib();
        if (dev.type != NDM_DEVICE_CPU)
            device_bytes(dev, &s.dev_allocated, &s.dev_reserved);
        if (epoch == 1) {
            first = s;
            first_epoch = epoch;
        }
        if (epoch == 2 || o.epochs == 1) {
            rss_base = s;
            rss_epoch = epoch;
        }
        last = s;
        printf("  epoch %2d: train loss %.4f  test accuracy %.2f%%  %.1f s  %.0f examples/s  "
               "RSS %.1f MiB",
               epoch, loss_sum / (double)seen, 100 * acc, secs, (double)seen / secs, s.rss);
        if (dev.type != NDM_DEVICE_CPU)
            printf("  %s allocated %.1f MiB, reserved %.1f MiB", devname,
                   (double)s.dev_allocated / (1024.0 * 1024.0),
                   (double)s.dev_reserved / (1024.0 * 1024.0));
        printf("\n");
        fflush(stdout);
        if (!o.quiet)
            (void)(o.dist ? ndm_dist_debug_dump(model, stdout) : ndm_debug_dump(model, stdout));
    }

    /* flat memory: the live arrays and bytes of model, trainer and data at
     * the end of each epoch, and the RSS */
    if (o.epochs >= 2) {
        bool flat = first.n == last.n;
        uint64_t arrays = 0, bytes = 0;
        for (int i = 0; i < last.n; i++) {
            flat = flat && first.arrays[i] == last.arrays[i] && first.bytes[i] == last.bytes[i];
            arrays += last.arrays[i];
            bytes += last.bytes[i];
        }
        printf("memory after epoch %d and after epoch %lld: live arrays and bytes of model, "
               "trainer and data %s (%llu arrays, %.1f MiB)\n",
               first_epoch, (long long)o.epochs, flat ? "identical" : "CHANGED",
               (unsigned long long)arrays, (double)bytes / (1024.0 * 1024.0));
        if (o.epochs > rss_epoch)
            printf("RSS after epoch %d and after epoch %lld: %.1f -> %.1f MiB (%+.2f%%)\n",
                   rss_epoch, (long long)o.epochs, rss_base.rss, last.rss,
                   rss_base.rss > 0 ? 100.0 * (last.rss - rss_base.rss) / rss_base.rss : 0.0);
        else
            printf("RSS: not compared (the first epoch grows the caches; it takes 3 epochs)\n");
        if (dev.type != NDM_DEVICE_CPU) {
            /* the device's allocator: what is allocated at the end of each
             * epoch must be equal, and what it reserves must not grow once
             * its cache has reached the working size (from the second epoch) */
            printf("%s allocated after epoch %d and after epoch %lld: %.1f -> %.1f MiB (%s)\n",
                   devname, first_epoch, (long long)o.epochs,
                   (double)first.dev_allocated / (1024.0 * 1024.0),
                   (double)last.dev_allocated / (1024.0 * 1024.0),
                   first.dev_allocated == last.dev_allocated ? "identical" : "CHANGED");
            if (o.epochs > rss_epoch)
                printf("%s reserved after epoch %d and after epoch %lld: %.1f -> %.1f MiB (%s)\n",
                       devname, rss_epoch, (long long)o.epochs,
                       (double)rss_base.dev_reserved / (1024.0 * 1024.0),
                       (double)last.dev_reserved / (1024.0 * 1024.0),
                       last.dev_reserved <= rss_base.dev_reserved ? "not grown" : "GREW");
        }
    } else {
        printf("memory: one epoch, nothing to compare (the check needs --epochs 2 or more)\n");
    }
    printf("final test accuracy: %.2f%% on %lld test examples\n", 100 * acc,
           (long long)ndm_dataset_size(test_set));

    if (!o.no_save) {
        /* the state (parameters and buffers) and the architecture, for serve */
        const char *names[64];
        ndm_array params[64];
        int n = ndm_module_named_state(net, names, params, 64);
        char accs[32], tested[32];
        snprintf(accs, sizeof accs, "%.4f", acc);
        snprintf(tested, sizeof tested, "%lld", (long long)ndm_dataset_size(test_set));
        const char *keys[3] = {"arch", "test_accuracy", "test_examples"};
        const char *vals[3] = {arch, accs, tested};
        ndm_named_arrays set = {(size_t)n, names, params, 3, keys, vals};
        CHECK(ndm_safetensors_save(o.out, &set), "saving the model");
        printf("saved %d parameters to %s\n", n, o.out);
    }
    if (o.snapshot) {
        CHECK(ndm_memory_dump_snapshot(o.snapshot), "writing the memory snapshot");
        CHECK(ndm_memory_record_history(false, 0), "stopping the memory history");
        printf("wrote the memory snapshot to %s (ndm-memviz draws it; a .pickle opens in "
               "PyTorch's tools)\n", o.snapshot);
    }
    CHECK(ndm_manager_close(model), "closing the model");
    CHECK(ndm_manager_close(data), "closing the data");
    if (dev.type != NDM_DEVICE_CPU) {
        printf("the allocator of %s at the end:\n", devname);
        CHECK(ndm_memory_summary(dev, stdout), "printing the device's allocator summary");
    }
    if (o.dist)
        CHECK(ndm_dist_finalize(), "leaving the MPI job");
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
    int64_t avail;          /* images; request k shows image k mod avail */
    double *latency;        /* seconds per request */
    int64_t right;
    int errors;
    char error[256];
} client;

static void *serve_worker(void *p)
{
    client *c = p;
    for (int64_t i = 0; i < c->count; i++) {
        int64_t k = (c->first + i) % c->avail;
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

typedef struct serve_opts {
    const char *model;
    const char *data;
    int64_t requests;
    int64_t threads;
    const char *device;
} serve_opts;

static int serve(serve_opts o)
{
    char dir[1024], ipath[1200], lpath[1200], devname[32];
    ndm_device dev = device_option("serve", o.device);
    ndm_device_str(dev, devname, sizeof devname);
    data_dir(o.data, dir, sizeof dir);
    split_paths("serve", dir, "t10k", ipath, lpath, sizeof ipath);
    if (!exists(o.model)) {
        fprintf(stderr, "ndm-fashion serve: no model at %s (run `ndm-fashion train --out %s` "
                "first, or pass --model FILE)\n", o.model, o.model);
        return 1;
    }
    int threads = (int)o.threads;
    int64_t requests = o.requests;
    ndm_manager model = model_manager("serve", dev);
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    LIVE(data, "creating the data manager");
    /* the architecture, from the file's metadata (a mapping that dies with
     * the manager that reads it) */
    ndm_manager peek = ndm_manager_new_on(model, "peek", NDM_CPU);
    LIVE(peek, "creating the manager that reads the model's metadata");
    const ndm_named_arrays *w = ndm_safetensors_load(peek, o.model, NDM_LOAD_MMAP);
    if (!w)
        die("loading the model");
    const char *meta = ndm_named_arrays_meta(w, "arch");
    char arch[32];
    snprintf(arch, sizeof arch, "%s", meta ? meta : "mlp");
    CHECK(ndm_manager_close(peek), "closing the model file");
    bool cnn = !strcmp(arch, "cnn");
    /* built without gradient arrays (serving needs none), then one call reads
     * the file into it and makes the predictor, which caps the model */
    ndm_rng rng = ndm_rng_new(0);
    ndm_no_grad_begin();
    ndm_module net = build(model, arch, &rng);
    ndm_no_grad_end();
    ndm_predictor pred = ndm_predictor_load(model, net, o.model);
    if (!pred.id) {
        fprintf(stderr, "ndm-fashion serve: %s is not a model that `ndm-fashion train` saved "
                "for this architecture: %s\n", o.model, ndm_last_error());
        return 1;
    }
    ndm_array images = ndm_idx_load(data, ipath);
    LIVE(images, "loading the test images");
    ndm_array labels = ndm_idx_load(data, lpath);
    LIVE(labels, "loading the test labels");
    int64_t avail = ndm_array_dim(images, 0);
    printf("ndm-fashion serve: %s model from %s on %s, %lld requests from %d threads",
           cnn ? "CNN" : "MLP", o.model, devname, (long long)requests, threads);
    if (requests > avail)
        printf(" (the %lld test images in turn)", (long long)avail);
    printf("\n");

    ndm_manager workers = ndm_manager_new(ndm_system(), "workers");
    LIVE(workers, "creating the workers' manager");
    client *cs = calloc((size_t)threads, sizeof *cs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double *lat = calloc((size_t)requests, sizeof *lat);
    if (!cs || !th || !lat) {
        fprintf(stderr, "ndm-fashion serve: out of memory for %lld requests\n",
                (long long)requests);
        return 1;
    }
    int64_t per = requests / threads, extra = requests % threads, at = 0;
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        char nm[32];
        snprintf(nm, sizeof nm, "worker-%d", t);
        cs[t] = (client){pred, ndm_manager_new(workers, nm), images, labels, cnn, at,
                         per + (t < extra), avail, lat + at, 0, 0, ""};
        LIVE(cs[t].home, "creating a worker's manager");
        at += cs[t].count;
        if (pthread_create(&th[t], NULL, serve_worker, &cs[t]) != 0) {
            fprintf(stderr, "ndm-fashion serve: cannot start thread %d of %d\n", t + 1, threads);
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
    (void)ndm_debug_dump(model, stdout);
    (void)ndm_debug_dump(workers, stdout);
    ndm_stats ps;
    CHECK(ndm_manager_stats(ndm_predictor_manager(pred), NDM_CPU, NDM_STATS_SUBTREE, &ps),
          "counting the request managers");
    printf("live request managers: %llu, live request arrays: %llu\n",
           (unsigned long long)ps.children, (unsigned long long)ps.live_arrays);
    free(cs);
    free(th);
    free(lat);
    CHECK(ndm_manager_close(workers), "closing the workers' manager");
    CHECK(ndm_manager_close(model), "closing the model");
    CHECK(ndm_manager_close(data), "closing the data");
    if (dev.type != NDM_DEVICE_CPU) {
        printf("the allocator of %s at the end:\n", devname);
        CHECK(ndm_memory_summary(dev, stdout), "printing the device's allocator summary");
    }
    return errors ? 1 : 0;
}

/* ---- leak-demo ------------------------------------------------------------------ */

static int leak_demo(void)
{
    const char *doing = "a step of the demo";
    printf("ndm-fashion leak-demo: a training loop that keeps a per-step statistic in the "
           "trainer by mistake\n");
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, 16, 8, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, 8, 4, true, &rng)));
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    LIVE(opt, "creating the optimizer");
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS), "capping the model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_seq mark = 0;
    for (int step = 0; step < 30; step++) {
        if (step == 10)
            mark = ndm_mark(model); /* warm-up done: from here nothing should accumulate */
        ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_uniform(batch, &rng, NDM_F32, -1, 1, NDM_SHAPE(32, 16));
        ndm_array y = ndm_randint(batch, &rng, NDM_I64, 0, 4, NDM_SHAPE(32));
        CHECK(ndm_grad_begin(batch), doing);
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        CHECK(ndm_backward(loss), doing);
        CHECK(ndm_grad_end(), doing);
        CHECK(ndm_optimizer_step(opt), doing);
        CHECK(ndm_optimizer_zero_grad(opt), doing);
        ndm_array kept = ndm_copy_to(trainer, loss); /* the bug: should have stayed in the batch */
        LIVE(kept, doing);
        CHECK(ndm_manager_close(batch), doing);
    }
    printf("\nndm_debug_dump after 30 steps: the trainer grows by one array per step\n");
    (void)ndm_debug_dump(model, stdout);
    printf("\nndm_report_since(model, mark taken at step 10):\n");
    (void)ndm_report_since(model, mark, stdout);
    printf("\nand a stray array into the capped model fails at once, at its line:\n");
    ndm_array stray = ndm_zeros(model, NDM_F32, NDM_SHAPE(32, 8));
    if (!stray.id)
        printf("  %s\n", ndm_last_error());
    CHECK(ndm_manager_close(model), "closing the model");
    return 0;
}

/* ---- main ----------------------------------------------------------------------- */

static train_opts topt = {false, NULL, "fashion-model.safetensors", 10, 128, 0, 1e-3, 1, false,
                          false, NULL, false, "cpu"};
static serve_opts sopt = {"fashion-model.safetensors", NULL, 10000, 4, "cpu"};

static const cli_opt train_opts_list[] = {
    {"--cnn", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.cnn, NULL,
     "train the convolutional network instead of the MLP"},
    {"--epochs", "N", OPT_INT, 1, 1000, 0, 0, &topt.epochs, NULL, "passes over the training set"},
    {"--batch", "N", OPT_INT, 1, 60000, 0, 0, &topt.batch, NULL, "examples per step"},
    {"--lr", "X", OPT_REAL, 0, 0, 0, 10, &topt.lr, NULL,
     "Adam's learning rate, decayed to 5% on a cosine"},
    {"--seed", "N", OPT_INT, 0, INT64_MAX, 0, 0, &topt.seed, NULL,
     "seed of the initial weights and the shuffle"},
    {"--limit", "N", OPT_INT, 0, 60000, 0, 0, &topt.limit, "0, every example",
     "train on the first N examples and test on the first N/6, rounded up"},
    {"--data", "DIR", OPT_TEXT, 0, 0, 0, 0, &topt.data, "where dataset-fashion-mnist is installed",
     "folder with the MNIST-format files"},
    {"--out", "FILE", OPT_TEXT, 0, 0, 0, 0, &topt.out, NULL, "where to save the model"},
    {"--no-save", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.no_save, NULL, "do not save the model"},
    {"--snapshot", "FILE", OPT_TEXT, 0, 0, 0, 0, &topt.snapshot, NULL,
     "record the allocator's history and write a memory snapshot at the end (.pickle: "
     "PyTorch's format, else JSON)"},
    {"--quiet", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.quiet, NULL,
     "no progress and no per-epoch dump; the summary lines only"},
    {"--dist", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.dist, NULL,
     "data-parallel over the processes of mpirun: --batch is the global batch, split over "
     "the ranks; rank 0 prints and saves"},
    {"--device", "DEV", OPT_TEXT, 0, 0, 0, 0, &topt.device, NULL,
     "where the model and the batches live: cpu, cuda or cuda:N (with --dist, cuda is "
     "cuda:(local rank % GPUs))"},
};
static const cli_opt serve_opts_list[] = {
    {"--model", "FILE", OPT_TEXT, 0, 0, 0, 0, &sopt.model, NULL, "the model `train` saved"},
    {"--requests", "N", OPT_INT, 1, 10000000, 0, 0, &sopt.requests, NULL,
     "requests to answer, one test image each (in turn when N exceeds them)"},
    {"--threads", "N", OPT_INT, 1, 256, 0, 0, &sopt.threads, NULL, "concurrent clients"},
    {"--data", "DIR", OPT_TEXT, 0, 0, 0, 0, &sopt.data, "where dataset-fashion-mnist is installed",
     "folder with the MNIST-format test files"},
    {"--device", "DEV", OPT_TEXT, 0, 0, 0, 0, &sopt.device, NULL,
     "where the model runs: cpu, cuda or cuda:N (requests come from the CPU)"},
};
static int run_train(void) { return train(topt); }
static int run_serve(void) { return serve(sopt); }
static const command commands[] = {
    {"train", "train a network on Fashion-MNIST, checking that memory stays flat", train_opts_list,
     (int)(sizeof train_opts_list / sizeof train_opts_list[0]), run_train},
    {"serve", "answer concurrent requests with a saved model, a manager per request",
     serve_opts_list, (int)(sizeof serve_opts_list / sizeof serve_opts_list[0]), run_serve},
    {"leak-demo", "a training loop that leaks on purpose, and the leak found by its line", NULL,
     0, leak_demo},
};
enum { NCOMMANDS = (int)(sizeof commands / sizeof commands[0]) };

int main(int argc, char **argv)
{
    return run_tool(argc, argv, commands, NCOMMANDS);
}
