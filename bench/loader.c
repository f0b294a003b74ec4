/* bench/loader: does a loader with workers speed up a loop whose consumer
 * does work? The loop: fetch a batch of 256 u8 images (28 x 28, scaled to
 * f32 in [0, 1], shuffled), then the step's work on it: a [256,784] x
 * [784,128] product and a ReLU, in the batch's manager. The figure is
 * examples per second with `workers` threads preparing batches ahead
 * (prefetch 2 x workers); the anchor, sampled turn about with it in the
 * same run, is the same loop without workers. A third figure, the fetch
 * alone (no step work), says how much of a step the gathering is.
 *
 * usage: loader [--json] [--quick] [workers (default 2)] */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ndm/ndm.h"

#define N 8192
#define BATCH 256

static ndm_manager g_root, g_model;
static ndm_dataset g_data;
static ndm_array g_w;
static int g_workers;

static void fail(const char *what)
{
    fprintf(stderr, "loader bench: %s: %s\n", what, ndm_last_error());
    exit(1);
}

typedef struct run {
    int workers;
    bool work;
} run;

/* One epoch: seconds per example. */
static double epoch(void *ctx)
{
    const run *r = ctx;
    ndm_manager trainer = ndm_manager_new(g_model, "trainer");
    ndm_loader ld = ndm_loader_new(trainer, g_data, &(ndm_loader_options){
        .batch_size = BATCH, .seed = 7,
        .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS | NDM_LOADER_LABELS_I64,
        .workers = r->workers});
    if (!ld.id)
        fail("loader");
    double t = bench_now();
    ndm_batch b;
    int rc;
    int64_t seen = 0;
    while ((rc = ndm_loader_next(ld, &b)) > 0) {
        seen += b.size;
        if (r->work) {
            ndm_array x = ndm_reshape(b.inputs, NDM_SHAPE(b.size, 784));
            ndm_array h = ndm_relu(ndm_matmul(x, g_w));
            if (!h.id)
                fail("step");
        }
    }
    t = bench_now() - t;
    if (rc < 0 || seen != N)
        fail("epoch");
    if (ndm_manager_close(trainer) != NDM_OK)
        fail("close");
    return t / (double)N;
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    g_workers = 2;
    for (int i = 1; i < argc; i++)
        if (argv[i][0] != '-')
            g_workers = atoi(argv[i]);
    if (g_workers < 1)
        g_workers = 1;
    int reps = o.quick ? 3 : 11;
    g_root = ndm_manager_new(ndm_system(), "bench");
    g_model = ndm_manager_new(g_root, "model");
    uint8_t *px = malloc((size_t)N * 784);
    uint8_t *py = malloc(N);
    if (!px || !py)
        fail("memory");
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)N * 784; i++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        px[i] = (uint8_t)h;
    }
    for (int i = 0; i < N; i++)
        py[i] = (uint8_t)(i % 10);
    g_data = (ndm_dataset){ndm_from_buffer(g_root, NDM_U8, px, NDM_SHAPE(N, 28, 28)),
                           ndm_from_buffer(g_root, NDM_U8, py, NDM_SHAPE(N))};
    free(px);
    free(py);
    g_w = ndm_full(g_model, NDM_F32, 0.01, NDM_SHAPE(784, 128));
    if (!g_data.inputs.id || !g_data.labels.id || !g_w.id)
        fail("data");

    static double t[4][BENCH_MAXSAMPLES];
    run runs[4] = {{g_workers, true}, {0, true}, {g_workers, false}, {0, false}};
    bench_sample_fn fn[4] = {epoch, epoch, epoch, epoch};
    void *ctx[4] = {&runs[0], &runs[1], &runs[2], &runs[3]};
    bench_interleave(4, fn, ctx, reps, t);

    char note[256];
    snprintf(note, sizeof note,
             "an epoch of %d examples in batches of %d, shuffled and scaled; step work: "
             "[%d,784] x [784,128] and a ReLU; %d workers, prefetch %d; %d rounds, turn about",
             N, BATCH, BATCH, g_workers, 2 * g_workers, reps);
    bench_note(&rep, note);
    bench_add_paired_rate(&rep, "loop_examples_per_s_with_workers", "examples/s", 1,
                          "the same loop without workers", 1, t[0], 1, t[1], reps);
    bench_add_paired_rate(&rep, "fetch_only_examples_per_s_with_workers", "examples/s", 1,
                          "fetching without workers", 1, t[2], 1, t[3], reps);
    bench_print(&rep);
    if (ndm_manager_close(g_root) != NDM_OK)
        fail("close root");
    return 0;
}
