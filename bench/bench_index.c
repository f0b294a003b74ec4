/* Index kernels against memcpy: each figure is the bandwidth of one fast CPU
 * kernel (bytes read plus bytes written per second) beside a memcpy that
 * moves the same bytes on the same thread pool, both on warm buffers, so
 * allocation and page faults stay out of both. ratio = ours / memcpy. */
#include <stdint.h>

#include "bench.h"
#include "ndm/ndm.h"

#include "backends/cpu/parallel.h"
#include "backends/index.h"
#include "ops/dispatch.h"

typedef struct mc {
    char *dst;
    const char *src;
} mc;

static void copy_range(void *ctx, int64_t b, int64_t e)
{
    mc *c = ctx;
    memcpy(c->dst + b, c->src + b, (size_t)(e - b));
}

/* memcpy of n bytes split over the pool as the kernels split theirs. */
static void pool_memcpy(char *dst, const char *src, size_t n)
{
    mc c = {dst, src};
    ndm__parallel_for((int64_t)n, 1 << 16, copy_range, &c);
}

static ndm__tensor T(ndm_array a) { return ndm__tensor_of(ndm__array_peek(a)); }

typedef struct kcase {
    const char *name;
    ndm_array in[3], out;
    double bytes;            /* read + written per run */
    int axis;
    void (*run)(struct kcase *);
} kcase;

static const struct ndm__backend_index *K;

static void run_concat(kcase *c)
{
    ndm__tensor o = T(c->out);
    int64_t half[2] = {o.shape[0], o.shape[1] / 2};
    ndm__tensor s = T(c->in[0]);
    ndm__tensor d0 = {o.data, o.dtype, 2, half, o.strides};
    ndm__tensor d1 = {(float *)o.data + half[1], o.dtype, 2, half, o.strides};
    (void)K->copy(0, &d0, &s);
    (void)K->copy(0, &d1, &s);
}
static void run_take(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]), i = T(c->in[1]);
    (void)K->take(0, &o, &s, c->axis, &i);
}
static void run_gather(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]), i = T(c->in[1]);
    (void)K->gather(0, &o, &s, c->axis, &i);
}
static void run_scatter(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]), i = T(c->in[1]);
    /* indices (n, 1) broadcast over the columns of src (n, d) */
    int64_t ist[2] = {i.strides[0], 0};
    ndm__tensor ib = {i.data, i.dtype, 2, s.shape, ist};
    (void)K->scatter_add(0, &o, 0, &ib, &s);
}
static void run_one_hot(kcase *c)
{
    ndm__tensor o = T(c->out), i = T(c->in[0]);
    (void)K->one_hot(0, &o, &i);
}
static void run_pad(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]);
    int64_t before[2] = {4, 4};
    (void)K->pad(0, &o, &s, before, (ndm_pad_mode)c->axis, 0.0);
}
static void run_cumsum(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]);
    (void)K->cumsum(0, &o, &s, c->axis);
}
static void run_cumprod(kcase *c)
{
    ndm__tensor o = T(c->out), s = T(c->in[0]);
    (void)K->cumprod(0, &o, &s, c->axis);
}
static void run_transpose_copy(kcase *c)
{
    ndm__tensor o = T(c->out);
    ndm_array t = ndm_transpose(c->in[0]);
    ndm__tensor s = T(t);
    (void)K->copy(0, &o, &s);
    (void)!ndm_array_release(t);
}

/* One sample of the kernel, and one of the memcpy anchor. */
static double kernel_s(void *ctx)
{
    kcase *c = ctx;
    double t0 = bench_now();
    c->run(c);
    return bench_now() - t0;
}

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static double memcpy_s(void *ctx)
{
    copy_job *j = ctx;
    double t0 = bench_now();
    pool_memcpy(j->dst, j->src, j->n);
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 5 : 21;
    int64_t n = o.quick ? 512 : 2048; /* square side */
    int64_t rows = o.quick ? 4096 : 32768, vocab = o.quick ? 5000 : 50000, dim = 256;
    K = ndm__cpu_backend.index;
    ndm_manager m = ndm_manager_new(ndm_system(), "bench");
    ndm_rng g = ndm_rng_new(1);

    ndm_array sq = ndm_uniform(m, &g, NDM_F32, -1, 1, NDM_SHAPE(n, n / 2));
    ndm_array full = ndm_uniform(m, &g, NDM_F32, -1, 1, NDM_SHAPE(n, n));
    ndm_array table = ndm_uniform(m, &g, NDM_F32, -1, 1, NDM_SHAPE(vocab, dim));
    ndm_array tok = ndm_randint(m, &g, NDM_I64, 0, vocab, NDM_SHAPE(rows));
    ndm_array tok2 = ndm_randint(m, &g, NDM_I64, 0, vocab, NDM_SHAPE(rows, 1));
    ndm_array cols = ndm_randint(m, &g, NDM_I64, 0, n, NDM_SHAPE(n / 2));
    ndm_array pick = ndm_randint(m, &g, NDM_I64, 0, n, NDM_SHAPE(n, n / 2));
    ndm_array labels = ndm_randint(m, &g, NDM_U8, 0, 10, NDM_SHAPE(rows * 4));
    ndm_array grads = ndm_uniform(m, &g, NDM_F32, -1, 1, NDM_SHAPE(rows, dim));

    double f4 = 4.0, sq_bytes = (double)(n * n) * f4;
    kcase cases[] = {
        {"concat_f32", {sq}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 0, run_concat},
        {"transpose_copy_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 0,
         run_transpose_copy},
        {"take_embedding_rows_f32", {table, tok}, ndm_empty(m, NDM_F32, NDM_SHAPE(rows, dim)),
         2.0 * (double)(rows * dim) * f4 + (double)rows * 8, 0, run_take},
        {"take_columns_f32", {full, cols}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n / 2)),
         2.0 * (double)(n * n / 2) * f4, 1, run_take},
        {"gather_last_axis_f32", {full, pick}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n / 2)),
         (double)(n * n / 2) * (f4 * 2 + 8), 1, run_gather},
        {"scatter_add_rows_f32", {grads, tok2}, ndm_zeros(m, NDM_F32, NDM_SHAPE(vocab, dim)),
         3.0 * (double)(rows * dim) * f4 + (double)rows * 8, 0, run_scatter},
        {"one_hot_u8_to_f32", {labels}, ndm_empty(m, NDM_F32, NDM_SHAPE(rows * 4, 10)),
         (double)(rows * 4) * (1 + 10 * f4), 0, run_one_hot},
        {"pad_constant_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n + 8, n + 8)),
         sq_bytes + (double)((n + 8) * (n + 8)) * f4, NDM_PAD_CONSTANT, run_pad},
        {"pad_reflect_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n + 8, n + 8)),
         sq_bytes + (double)((n + 8) * (n + 8)) * f4, NDM_PAD_REFLECT, run_pad},
        {"cumsum_axis0_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 0,
         run_cumsum},
        {"cumsum_axis1_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 1,
         run_cumsum},
        {"cumprod_axis0_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 0,
         run_cumprod},
        {"cumprod_axis1_f32", {full}, ndm_empty(m, NDM_F32, NDM_SHAPE(n, n)), 2 * sq_bytes, 1,
         run_cumprod},
    };
    char note[256];
    snprintf(note, sizeof note,
             "fast CPU kernels on warm buffers, %d threads; GB/s = (bytes read + written) / s",
             ndm__num_threads());
    bench_note(&rep, note);
    size_t big = (size_t)(vocab * dim) * 4 * 3;
    char *a = malloc(big), *b = malloc(big);
    memset(a, 1, big);
    memset(b, 2, big);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kcase *c = &cases[k];
        size_t half = (size_t)(c->bytes / 2) < big ? (size_t)(c->bytes / 2) : big;
        copy_job j = {a, b, half};
        /* the kernel and its memcpy turn about: each pair's ratio */
        static double t[2][BENCH_MAXSAMPLES];
        bench_interleave(2, (bench_sample_fn[]){kernel_s, memcpy_s}, (void *[]){c, &j}, reps, t);
        char name[96];
        snprintf(name, sizeof name, "%s_gbps_vs_memcpy", c->name);
        bench_add_paired_rate(&rep, name, "GB/s", 1e-9, "memcpy of the same bytes, same pool",
                              c->bytes, t[0], (double)half * 2, t[1], reps);
        (void)!ndm_array_release(c->out);
    }
    free(a);
    free(b);
    bench_print(&rep);
    return ndm_manager_close(m) == NDM_OK ? 0 : 1;
}
