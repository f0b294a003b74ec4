/* bench/cuda: ndm on a GPU against anchors measured in the same run, figure and
 * anchor interleaved (ABAB...), each ratio the median of the pairs' ratios:
 *   - elementwise add GB/s and sum-reduction read GB/s against a device-to-device copy
 *   - transfers and device copies against the CUDA runtime's own
 *   - matmul against a direct cuBLAS call of the same shapes
 *   - cached allocation + free against cudaMalloc/cudaFree and PyTorch's allocator
 *   - MLP and CNN training steps, and their peak reserved bytes, against PyTorch
 *   - a batch-1 MLP request's p50 latency served from a device graph
 *     (ndm_predictor_use_graphs) against the same request launched op by op
 * PyTorch runs as a co-process (bench/cuda_torch.py) from the Python named by
 * --python or NDM_BENCH_PYTHON; without one its figures are skipped, saying so.
 * Without a GPU nothing is measured: the program says so and exits 0. */
/* cuBLAS's half-precision headers test __cplusplus and MSVC macros in C. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cublas_v2.h>
#include <cuda_runtime.h>
#pragma GCC diagnostic pop
#include <stdarg.h>

#include "bench.h"
#include "fashion_net.h"
#include "torch_proc.h"
#include "ndm/ndm.h"

#ifndef NDM_BENCH_TORCH_SCRIPT
#define NDM_BENCH_TORCH_SCRIPT "bench/cuda_torch.py"
#endif

#define MIB ((size_t)1 << 20)
#define DEV NDM_CUDA(0)
#define MAXPAIRS 64

static void die(const char *doing)
{
    fprintf(stderr, "bench/cuda: %s failed: %s\n", doing, ndm_last_error());
    exit(1);
}

/* ndm's streams do not wait for the runtime's legacy stream (where the
 * anchors run): wait for both. */
static void sync_all(void)
{
    if (ndm_device_synchronize(DEV) != NDM_OK)
        die("synchronizing the device");
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "bench/cuda: cudaDeviceSynchronize: %s\n", cudaGetErrorString(e));
        exit(1);
    }
}

/* Seconds per call of fn(ud), over `inner` calls between two syncs. */
static double timed(void (*fn)(void *), void *ud, int inner)
{
    sync_all();
    double t0 = bench_now();
    for (int i = 0; i < inner; i++)
        fn(ud);
    sync_all();
    return (bench_now() - t0) / inner;
}

/* ---- interleaved pairs ------------------------------------------------------------- */

/* A figure against its anchor, measured in turn `pairs` times (ABAB...), so
 * that a drift of clocks or temperature hits both: a side's value is
 * scale / seconds (a rate) or seconds * scale (a latency). The reported ratio
 * is the median of the pairs' ratios; their spread goes in a note. */
typedef struct side {
    void (*fn)(void *);
    void *ud;
    int inner;
    double scale;  /* value = scale / seconds (rates), or seconds * scale (latencies) */
    bool rate;
} side;

static double value_of(const side *s, double secs)
{
    return s->rate ? s->scale / secs : secs * s->scale;
}

static void add_ratio(bench_report *r, const char *name, const char *unit, const char *anchor,
                      double *vo, double *va, int n)
{
    double ratios[MAXPAIRS], a[MAXPAIRS], o[MAXPAIRS];
    for (int i = 0; i < n; i++) {
        ratios[i] = vo[i] / va[i];
        a[i] = va[i];
        o[i] = vo[i];
    }
    bench_add(r, name, bench_median(o, n), unit, anchor, bench_median(a, n));
    double rm = bench_median(ratios, n); /* sorts: ratios[0] and [n-1] are the extremes */
    r->f[r->n - 1].ratio = rm;
    char note[256];
    snprintf(note, sizeof note, "%s: median of %d pair ratios %.3f, spread %.3f..%.3f", name, n,
             rm, ratios[0], ratios[n - 1]);
    bench_note(r, note);
}

static void interleave(bench_report *r, const char *name, const char *unit, const char *anchor,
                       int pairs, const side *ours, const side *theirs)
{
    double vo[MAXPAIRS], va[MAXPAIRS];
    if (pairs > MAXPAIRS)
        pairs = MAXPAIRS;
    /* warm-up: module load, handles, the allocator's first segments */
    (void)timed(ours->fn, ours->ud, 1);
    (void)timed(theirs->fn, theirs->ud, 1);
    for (int i = 0; i < pairs; i++) {
        vo[i] = value_of(ours, timed(ours->fn, ours->ud, ours->inner));
        va[i] = value_of(theirs, timed(theirs->fn, theirs->ud, theirs->inner));
    }
    add_ratio(r, name, unit, anchor, vo, va, pairs);
}

/* ---- the PyTorch co-process ----------------------------------------------------- */

/* One request, one number back (negative when PyTorch answered an error). */
static double torch_num(torch_proc *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static double torch_num(torch_proc *t, const char *fmt, ...)
{
    char ans[512];
    va_list ap;
    va_start(ap, fmt);
    bool ok = torch_vask(t, ans, sizeof ans, fmt, ap);
    va_end(ap);
    if (!ok)
        return -1;
    char *end = NULL;
    double v = strtod(ans, &end);
    if (end == ans) {
        fprintf(stderr, "bench/cuda: PyTorch: %s\n", ans);
        return -1;
    }
    return v;
}

/* ---- what is measured -------------------------------------------------------- */

typedef struct bw {
    ndm_manager g;
    ndm_array a, c, host;
    void *raw_src, *raw_dst, *raw_host;
    size_t bytes;
} bw;

static void h2d_ndm(void *ud)
{
    bw *j = ud;
    ndm_array d = ndm_to_to(j->g, j->host, DEV);
    if (!d.id || ndm_array_release(d) != NDM_OK)
        die("ndm_to");
}
static void h2d_raw(void *ud)
{
    bw *j = ud;
    (void)cudaMemcpy(j->raw_dst, j->raw_host, j->bytes, cudaMemcpyHostToDevice);
}
static void d2h_ndm(void *ud)
{
    bw *j = ud;
    if (ndm_array_copy_out(j->a, j->raw_host, j->bytes) != NDM_OK)
        die("ndm_array_copy_out");
}
static void d2h_raw(void *ud)
{
    bw *j = ud;
    (void)cudaMemcpy(j->raw_host, j->raw_src, j->bytes, cudaMemcpyDeviceToHost);
}
static void copy_ndm(void *ud)
{
    bw *j = ud;
    if (ndm_copy_into(j->c, j->a) != NDM_OK)
        die("ndm_copy_into");
}

static void add_ndm(void *ud)
{
    bw *j = ud;
    if (ndm_add_(j->c, j->a) != NDM_OK)
        die("ndm_add_");
}
static void sum_ndm(void *ud)
{
    bw *j = ud;
    ndm_array s = ndm_sum_to(j->g, j->a, false, NDM_ALL_AXES_LIST);
    if (!s.id || ndm_array_release(s) != NDM_OK)
        die("ndm_sum");
}
static void d2d_raw(void *ud)
{
    bw *j = ud;
    (void)cudaMemcpyAsync(j->raw_dst, j->raw_src, j->bytes, cudaMemcpyDeviceToDevice, 0);
}

typedef struct mm {
    ndm_manager g;
    ndm_array a, b;
    float *ra, *rb, *rc;
    int m, n, k;
    cublasHandle_t h;
} mm;

static void mm_ndm(void *ud)
{
    mm *j = ud;
    ndm_array c = ndm_matmul_to(j->g, j->a, j->b);
    if (!c.id || ndm_array_release(c) != NDM_OK)
        die("ndm_matmul");
}
/* Row-major C = A B is column-major C^T = B^T A^T: the usual operand swap. */
static void mm_cublas(void *ud)
{
    mm *j = ud;
    const float one = 1, zero = 0;
    (void)cublasSgemm(j->h, CUBLAS_OP_N, CUBLAS_OP_N, j->n, j->m, j->k, &one, j->rb, j->n, j->ra,
                      j->k, &zero, j->rc, j->n);
}

typedef struct al {
    ndm_manager g;
    int64_t bytes;
} al;

static void alloc_ndm(void *ud)
{
    al *j = ud;
    ndm_array t = ndm_empty(j->g, NDM_U8, NDM_SHAPE(j->bytes));
    if (!t.id || ndm_array_release(t) != NDM_OK)
        die("ndm_empty + release");
}
static void alloc_raw(void *ud)
{
    al *j = ud;
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)j->bytes) != cudaSuccess || cudaFree(p) != cudaSuccess) {
        fprintf(stderr, "bench/cuda: cudaMalloc/cudaFree failed\n");
        exit(1);
    }
}

/* A Fashion-MNIST network, Adam, and one fixed batch on the GPU. */
typedef struct trainer {
    ndm_manager model;
    ndm_module net;
    ndm_optimizer opt;
    ndm_array x, y;
    bool cnn;
} trainer;

static void trainer_new(trainer *t, ndm_manager parent, const char *arch, int64_t batch,
                        uint64_t seed)
{
    t->cnn = !strcmp(arch, "cnn");
    t->model = ndm_manager_new_on(parent, arch, DEV);
    if (!t->model.id)
        die("a model manager on the GPU");
    ndm_rng rng = ndm_rng_new(seed);
    t->net = fashion_net(t->model, arch, &rng);
    t->opt = ndm_adam(t->model, t->net, 1e-3, 0.9, 0.999, 1e-8, 0.0);
    t->x = ndm_uniform(t->model, &rng, NDM_F32, 0, 1, NDM_SHAPE(batch, 28, 28));
    t->y = ndm_randint(t->model, &rng, NDM_I64, 0, 10, NDM_SHAPE(batch));
    if (!t->net.id || !t->opt.id || !t->x.id || !t->y.id)
        die("building the network");
}

/* One step as ndm-fashion takes it: a batch manager, the graph in it. */
static void train_step(void *ud)
{
    trainer *t = ud;
    ndm_manager b = ndm_manager_new(t->model, "step");
    ndm_array x = ndm_copy_to(b, t->x); /* the batch, as the loader gives it */
    if (!b.id || !x.id || ndm_grad_begin(b) != NDM_OK)
        die("starting a step");
    ndm_array loss = ndm_cross_entropy(ndm_forward(t->net, fashion_input(x, t->cnn)), t->y);
    if (!loss.id || ndm_backward(loss) != NDM_OK)
        die("a training step");
    (void)ndm_grad_end();
    if (ndm_optimizer_step(t->opt) != NDM_OK || ndm_optimizer_zero_grad(t->opt) != NDM_OK ||
        ndm_manager_close(b) != NDM_OK)
        die("the optimizer's step");
}

/* Peak reserved bytes of `steps` steps from an empty cache. */
static double peak_reserved(ndm_manager parent, const char *arch, int64_t batch, int steps)
{
    sync_all();
    if (ndm_memory_empty_cache(DEV) != NDM_OK || ndm_memory_reset_peak_stats(DEV) != NDM_OK)
        die("resetting the allocator's peak");
    trainer t;
    trainer_new(&t, parent, arch, batch, 1);
    for (int i = 0; i < steps; i++)
        train_step(&t);
    sync_all();
    int64_t peak = 0;
    if (ndm_memory_stat_get(DEV, "reserved_bytes.all.peak", &peak) != NDM_OK)
        die("reading reserved_bytes.all.peak");
    if (ndm_manager_close(t.model) != NDM_OK || ndm_memory_empty_cache(DEV) != NDM_OK)
        die("closing the model");
    return (double)peak;
}

/* ---- a batch-1 request: a device graph against launches op by op ------------------ */

typedef struct req {
    ndm_predictor p;
    ndm_manager model, out;
    ndm_array x;
    float y[10];
} req;

static void req_new(req *q, ndm_manager parent, bool graphs)
{
    q->model = ndm_manager_new_on(parent, graphs ? "serve-graphs" : "serve-eager", DEV);
    ndm_rng rng = ndm_rng_new(5);
    ndm_no_grad_begin();
    ndm_module net = q->model.id ? fashion_net(q->model, "mlp", &rng) : (ndm_module){0};
    ndm_no_grad_end();
    q->p = net.id ? ndm_predictor_new(q->model, net) : (ndm_predictor){0};
    q->out = ndm_manager_new_on(parent, "answers", DEV);
    q->x = ndm_uniform(q->out, &rng, NDM_F32, 0, 1, NDM_SHAPE(1, 28, 28));
    if (!q->p.id || !q->x.id || (graphs && ndm_predictor_use_graphs(q->p, 1) != NDM_OK))
        die("a predictor on the GPU");
}

/* One request as a client sees it: the answer back on the host. */
static void request_once(void *ud)
{
    req *q = ud;
    ndm_array y = ndm_predict_to(q->out, q->p, q->x);
    if (!y.id || ndm_array_copy_out(y, q->y, sizeof q->y) != NDM_OK ||
        ndm_array_release(y) != NDM_OK)
        die("a request");
}

/* The median latency (microseconds) of n requests, each timed alone. */
static double request_p50_us(req *q, int n)
{
    double t[256];
    if (n > 256)
        n = 256;
    for (int i = 0; i < n; i++) {
        double t0 = bench_now();
        request_once(q);
        t[i] = (bench_now() - t0) * 1e6;
    }
    return bench_median(t, n);
}

static void request_figures(bench_report *r, ndm_manager root, int pairs, bool quick)
{
    req e, g;
    req_new(&e, root, false);
    req_new(&g, root, true);
    for (int w = 0; w < 20; w++) { /* warm-up; the graph's first two requests record and capture */
        request_once(&e);
        request_once(&g);
    }
    bool same = !memcmp(e.y, g.y, sizeof e.y);
    double vo[MAXPAIRS], va[MAXPAIRS];
    int n = quick ? 50 : 200;
    for (int i = 0; i < pairs; i++) {
        vo[i] = request_p50_us(&g, n);
        va[i] = request_p50_us(&e, n);
    }
    add_ratio(r, "mlp_request_p50_us_graph_vs_eager", "us",
              "the same batch-1 MLP request launched op by op (ndm_predict without graphs)", vo,
              va, pairs);
    ndm_predictor_graph_stats gs;
    char note[256];
    if (ndm_predictor_get_graph_stats(g.p, &gs) != NDM_OK)
        die("reading the graph statistics");
    snprintf(note, sizeof note, "mlp request: batch 1, p50 of %d requests per pair (answer copied "
             "back to the host); target p50 <= 50 us; %lld launched from the graph; answers "
             "identical to op-by-op: %s", n, (long long)gs.launched, same ? "yes" : "NO");
    bench_note(r, note);
    if (ndm_manager_close(e.out) != NDM_OK || ndm_manager_close(g.out) != NDM_OK ||
        ndm_manager_close(e.model) != NDM_OK || ndm_manager_close(g.model) != NDM_OK)
        die("closing the predictors");
}

/* ---- main ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    const char *python = getenv("NDM_BENCH_PYTHON");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--json] [--quick] [--python PYTHON]\n"
                   "  PYTHON (or NDM_BENCH_PYTHON) runs PyTorch for its anchors\n",
                   argv[0]);
            return 0;
        }
        if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
    }
    bench_report *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    r->o = bench_parse(argc, argv);
    if (ndm_cuda_device_count() == 0) {
        /* exit 0: a machine without a GPU is not a failure of the benchmark */
        ndm_manager probe = ndm_manager_new_on(ndm_system(), "probe", DEV);
        char note[256];
        snprintf(note, sizeof note, "no CUDA device: nothing measured (%s)",
                 probe.id ? "?" : ndm_last_error());
        bench_note(r, note);
        bench_print(r);
        free(r);
        return 0;
    }
    bool quick = r->o.quick;
    int pairs = quick ? 4 : 10;
    ndm_manager root = ndm_manager_new(ndm_system(), "bench");
    ndm_manager g = ndm_manager_new_on(root, "gpu", DEV);
    if (!g.id)
        die("a manager on cuda:0");
    struct cudaDeviceProp prop;
    char note[256];
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        snprintf(note, sizeof note, "device: %.160s, %d multiprocessors, sm_%d%d", prop.name,
                 prop.multiProcessorCount, prop.major, prop.minor);
        bench_note(r, note);
    }

    /* bandwidth: f32 vectors of 64 Mi elements (256 MiB; 16 MiB with --quick) */
    bw b = {0};
    int64_t n = quick ? (4 << 20) : (64 << 20);
    b.g = g;
    b.bytes = (size_t)n * 4;
    b.a = ndm_full(g, NDM_F32, 1.0, NDM_SHAPE(n));
    b.c = ndm_full(g, NDM_F32, 0.0, NDM_SHAPE(n));
    if (!b.a.id || !b.c.id)
        die("the bandwidth arrays");
    if (cudaMalloc(&b.raw_src, b.bytes) != cudaSuccess ||
        cudaMalloc(&b.raw_dst, b.bytes) != cudaSuccess ||
        cudaMemset(b.raw_src, 0, b.bytes) != cudaSuccess) {
        fprintf(stderr, "bench/cuda: cudaMalloc of the anchor's buffers failed\n");
        return 1;
    }
    b.host = ndm_full(root, NDM_F32, 1.5, NDM_SHAPE(n));
    b.raw_host = malloc(b.bytes);
    if (!b.host.id || !b.raw_host)
        die("the host buffers");
    memset(b.raw_host, 0, b.bytes);
    double gb = (double)b.bytes / 1e9;
    snprintf(note, sizeof note, "bandwidth: f32 vectors of %lld elements (%zu MiB), pageable "
             "host memory for transfers", (long long)n, b.bytes / MIB);
    bench_note(r, note);
    side copy_rw = {d2d_raw, &b, 10, 2 * gb, true}, copy_r = {d2d_raw, &b, 10, gb, true};
    interleave(r, "h2d_GBps_ndm_to_vs_cudaMemcpy", "GB/s", "cudaMemcpy host to device", pairs,
               &(side){h2d_ndm, &b, 2, gb, true}, &(side){h2d_raw, &b, 2, gb, true});
    interleave(r, "d2h_GBps_copy_out_vs_cudaMemcpy", "GB/s", "cudaMemcpy device to host", pairs,
               &(side){d2h_ndm, &b, 2, gb, true}, &(side){d2h_raw, &b, 2, gb, true});
    interleave(r, "copy_GBps_vs_d2d_copy", "GB/s", "cudaMemcpy device to device (read + write)",
               pairs, &(side){copy_ndm, &b, 10, 2 * gb, true}, &copy_rw);
    interleave(r, "add_GBps_vs_d2d_copy", "GB/s", "cudaMemcpy device to device (read + write)",
               pairs, &(side){add_ndm, &b, 10, 3 * gb, true}, &copy_rw);
    interleave(r, "sum_read_GBps_vs_d2d_copy_read", "GB/s",
               "cudaMemcpy device to device (bytes read)", pairs,
               &(side){sum_ndm, &b, 10, gb, true}, &copy_r);
    cudaFree(b.raw_src);
    cudaFree(b.raw_dst);
    free(b.raw_host);
    if (ndm_array_release(b.a) != NDM_OK || ndm_array_release(b.c) != NDM_OK ||
        ndm_array_release(b.host) != NDM_OK)
        die("releasing the bandwidth arrays");

    /* matmul: f32 (m, k) x (k, n), against cublasSgemm on the same shapes */
    mm j = {0};
    j.g = g;
    j.m = j.n = j.k = quick ? 1024 : 4096;
    j.a = ndm_full(g, NDM_F32, 0.5, NDM_SHAPE(j.m, j.k));
    j.b = ndm_full(g, NDM_F32, 0.25, NDM_SHAPE(j.k, j.n));
    if (!j.a.id || !j.b.id)
        die("the matmul operands");
    if (cublasCreate(&j.h) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc((void **)&j.ra, (size_t)j.m * j.k * 4) != cudaSuccess ||
        cudaMalloc((void **)&j.rb, (size_t)j.k * j.n * 4) != cudaSuccess ||
        cudaMalloc((void **)&j.rc, (size_t)j.m * j.n * 4) != cudaSuccess) {
        fprintf(stderr, "bench/cuda: cuBLAS setup failed\n");
        return 1;
    }
    double tflop = 2.0 * j.m * j.n * j.k / 1e12;
    snprintf(note, sizeof note, "matmul: f32 %dx%d times %dx%d, default math mode on both sides",
             j.m, j.k, j.k, j.n);
    bench_note(r, note);
    interleave(r, "matmul_TFLOPs_vs_cublas", "TFLOP/s", "cublasSgemm, same shapes", pairs,
               &(side){mm_ndm, &j, 5, tflop, true}, &(side){mm_cublas, &j, 5, tflop, true});
    cublasDestroy(j.h);
    cudaFree(j.ra);
    cudaFree(j.rb);
    cudaFree(j.rc);
    if (ndm_array_release(j.a) != NDM_OK || ndm_array_release(j.b) != NDM_OK)
        die("releasing the matmul operands");

    /* allocation + free of 1 MiB: ndm's cache against the driver's */
    al a = {g, (int64_t)MIB};
    interleave(r, "alloc_free_ns_vs_cudaMalloc", "ns", "cudaMalloc + cudaFree of 1 MiB", pairs,
               &(side){alloc_ndm, &a, 1000, 1e9, false}, &(side){alloc_raw, &a, 100, 1e9, false});

    /* a batch-1 request from a device graph against op-by-op launches */
    request_figures(r, root, pairs, quick);

    /* against PyTorch, same GPU, same shapes, seeds and batch */
    torch_proc tp;
    char why[400];
    int64_t batch = 128;
    if (!python || !*python) {
        bench_note(r, "PyTorch figures skipped: no Python given (--python or NDM_BENCH_PYTHON)");
    } else if (!torch_start(&tp, python, NDM_BENCH_TORCH_SCRIPT, why, sizeof why)) {
        snprintf(note, sizeof note, "PyTorch figures skipped: %.200s", why);
        bench_note(r, note);
    } else {
        char tnote[512];
        snprintf(tnote, sizeof tnote, "PyTorch %s; steps: batch %lld, Adam, f32, TF32 off; ndm's "
                 "step also copies its batch into the step's manager, as a loader does",
                 tp.version, (long long)batch);
        bench_note(r, tnote);
        double vo[MAXPAIRS], va[MAXPAIRS];
        int k = 0;
        (void)timed(alloc_ndm, &a, 100);
        for (int i = 0; i < pairs; i++, k++) {
            vo[k] = 1e9 * timed(alloc_ndm, &a, 1000);
            va[k] = torch_num(&tp, "alloc %lld 5", (long long)MIB);
            if (va[k] <= 0)
                break;
        }
        if (k == pairs)
            add_ratio(r, "alloc_free_ns_vs_torch", "ns", "torch.empty + del of 1 MiB (caching)",
                      vo, va, k);
        else
            bench_note(r, "alloc_free_ns_vs_torch: PyTorch answered an error (on stderr)");
        const char *archs[2] = {"mlp", "cnn"};
        for (int q = 0; q < 2; q++) {
            trainer t;
            trainer_new(&t, root, archs[q], batch, 1);
            for (int w = 0; w < 5; w++)
                train_step(&t);
            int reps = quick ? 5 : 20;
            for (k = 0; k < pairs; k++) {
                double ts[64];
                for (int s = 0; s < reps; s++)
                    ts[s] = timed(train_step, &t, 1);
                vo[k] = bench_median(ts, reps);
                va[k] = torch_num(&tp, "step %s %lld 1 %d", archs[q], (long long)batch, reps);
                if (va[k] <= 0)
                    break;
            }
            if (ndm_manager_close(t.model) != NDM_OK)
                die("closing the model");
            char name[96], what[160];
            snprintf(name, sizeof name, "%s_step_s_vs_torch", archs[q]);
            if (k == pairs) {
                snprintf(what, sizeof what, "PyTorch %s step, median of %d", archs[q], reps);
                add_ratio(r, name, "s", what, vo, va, k);
            } else {
                snprintf(what, sizeof what, "%s: PyTorch answered an error (on stderr)", name);
                bench_note(r, what);
            }
            int steps = 10;
            double ours = peak_reserved(root, archs[q], batch, steps);
            double theirs = torch_num(&tp, "peak %s %lld 1 %d", archs[q], (long long)batch, steps);
            if (theirs > 0) {
                snprintf(name, sizeof name, "%s_peak_reserved_bytes_vs_torch", archs[q]);
                snprintf(what, sizeof what, "torch.cuda.max_memory_reserved() over %d steps",
                         steps);
                bench_add(r, name, ours, "bytes", what, theirs);
            }
        }
        torch_stop(&tp);
    }

    bench_print(r);
    free(r);
    return ndm_manager_close(root) == NDM_OK ? 0 : 1;
}
