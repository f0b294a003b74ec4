/* Elementwise section of bench/ops: add, mul and relu on 64M floats in GB/s
 * against a STREAM triad loop compiled here, on 1 and 2 threads; and the
 * overhead of one small add against a plain C loop with malloc and free. */
#include <stdint.h>
#include <stdlib.h>

#include "ndm/ndm.h"
#include "backends/cpu/parallel.h"
#include "sections.h"

#define BIG ((int64_t)64 << 20)

/* ---- the anchor: STREAM triad, a[i] = b[i] + s * c[i] ------------------- */

typedef struct triad {
    float *a;
    const float *b, *c;
    float s;
} triad;

static void triad_range(void *ctx, int64_t begin, int64_t end)
{
    triad *t = ctx;
    float *restrict a = t->a;
    const float *restrict b = t->b, *restrict c = t->c;
    const float s = t->s;
    for (int64_t i = begin; i < end; i++)
        a[i] = b[i] + s * c[i];
}

/* Seconds for one triad over n floats on the pool (as many threads as the
 * pool has now), split like the library splits its work. */
static double time_triad(float *a, const float *b, const float *c, int64_t n)
{
    triad t = {a, b, c, 3.0f};
    double t0 = bench_now();
    ndm__parallel_for(n, (int64_t)1 << 16, triad_range, &t);
    return bench_now() - t0;
}

/* ---- helpers ------------------------------------------------------------------ */

static void check(ndm_status st, const char *what)
{
    if (st != NDM_OK) {
        fprintf(stderr, "bench: %s: %s\n", what, ndm_last_error());
        exit(1);
    }
}

static void need(ndm_array a, const char *what)
{
    if (!a.id) {
        fprintf(stderr, "bench: %s: %s\n", what, ndm_last_error());
        exit(1);
    }
}

enum { OP_ADD, OP_MUL, OP_RELU };
static const char *const op_names[] = {"add", "mul", "relu"};

/* One operation over the big arrays. `alloc`: the form that returns a new
 * array (timed with its release); else the in-place form into x. */
static double time_op(int op, bool alloc, ndm_array x, ndm_array y)
{
    double t0 = bench_now();
    if (alloc) {
        ndm_array c = op == OP_ADD ? ndm_add(x, y) : op == OP_MUL ? ndm_mul(x, y) : ndm_relu(x);
        need(c, op_names[op]);
        double t = bench_now() - t0;
        check(ndm_array_release(c), "release");
        return t;
    }
    check(op == OP_ADD ? ndm_add_(x, y) : op == OP_MUL ? ndm_mul_(x, y) : ndm_relu_(x),
          op_names[op]);
    return bench_now() - t0;
}

static double median_of(double *v, int n) { return bench_median(v, n); }

/* ---- sections ----------------------------------------------------------------- */

static void bandwidth(bench_report *r, ndm_manager m)
{
    int reps = r->o.quick ? 3 : 7;
    ndm_array x = ndm_full(m, NDM_F32, 1.0, NDM_SHAPE(BIG));
    ndm_array y = ndm_full(m, NDM_F32, 0.5, NDM_SHAPE(BIG));
    ndm_array z = ndm_zeros(m, NDM_F32, NDM_SHAPE(BIG));
    need(x, "x");
    need(y, "y");
    need(z, "z");
    float *a = ndm_array_data(z), *b = ndm_array_data(x), *c = ndm_array_data(y);
    int before = ndm__set_num_threads(1);
    for (int threads = 1; threads <= 2; threads++) {
        ndm__set_num_threads(threads);
        double samples[16];
        time_triad(a, b, c, BIG);
        for (int i = 0; i < reps; i++)
            samples[i] = time_triad(a, b, c, BIG);
        double triad_gbs = 12.0 * (double)BIG / median_of(samples, reps) * 1e-9;
        char name[96], anchor[160];
        snprintf(anchor, sizeof anchor, "STREAM triad f32, 64M, %dt (12 B/elem)", threads);
        snprintf(name, sizeof name, "triad_f32_64M_%dt", threads);
        bench_add(r, name, triad_gbs, "GB/s", "", 0);
        for (int op = 0; op < 3; op++) {
            double bytes = (op == OP_RELU ? 8.0 : 12.0) * (double)BIG;
            for (int alloc = 0; alloc <= 1; alloc++) {
                time_op(op, alloc, x, y);
                /* the op and the triad alternate: the ratio of each pair */
                double ta[16];
                for (int i = 0; i < reps; i++) {
                    samples[i] = time_op(op, alloc, x, y);
                    /* keep the values bounded: x stays near 1 */
                    if (!alloc && op != OP_RELU)
                        check(ndm_copy_into(x, y), "reset");
                    ta[i] = time_triad(a, b, c, BIG);
                }
                /* per byte: the op's bytes differ from the triad's */
                double tf[16];
                for (int i = 0; i < reps; i++)
                    tf[i] = samples[i] / bytes, ta[i] /= 12.0 * (double)BIG;
                bench_pairs p = bench_pair_stats(tf, ta, reps, true);
                double gbs = 1e-9 / p.fig_t;
                snprintf(name, sizeof name, "%s_f32_64M%s_%dt_vs_triad", op_names[op],
                         alloc ? "_new" : "_inplace", threads);
                bench_add_pairs(r, name, gbs, "GB/s", anchor, 1e-9 / p.anchor_t, p);
            }
        }
    }
    ndm__set_num_threads(before);
    bench_note(r, "GB/s counts bytes read plus written (STREAM's convention, no write-allocate): "
                  "12 B/elem for add, mul and the triad, 8 for relu");
    bench_note(r, "_inplace: ndm_add_(x, y) etc. (no allocation); _new: ndm_add(x, y) plus its "
                  "release, which includes first-touch page faults on a fresh output");
    check(ndm_array_release(x), "release");
    check(ndm_array_release(y), "release");
    check(ndm_array_release(z), "release");
}

/* Keeps the anchor's buffer from being optimised away. */
static void escape(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static double plain_small_add(const float *a, const float *b, int64_t iters)
{
    double t0 = bench_now();
    for (int64_t k = 0; k < iters; k++) {
        float *c = malloc(16 * sizeof *c);
        for (int i = 0; i < 16; i++)
            c[i] = a[i] + b[i];
        escape(c);
        free(c);
    }
    return (bench_now() - t0) / (double)iters * 1e9;
}

typedef enum { SMALL_ADD, SMALL_ADD_INPLACE, SMALL_EMPTY } small_kind;

static double ndm_small(small_kind kind, ndm_manager m, ndm_array a, ndm_array b, int64_t iters)
{
    double t0 = bench_now();
    for (int64_t k = 0; k < iters; k++) {
        if (kind == SMALL_ADD_INPLACE) {
            check(ndm_add_(a, b), "add_");
            continue;
        }
        ndm_array c = kind == SMALL_ADD ? ndm_add(a, b) : ndm_empty(m, NDM_F32, NDM_SHAPE(16));
        need(c, "small");
        check(ndm_array_release(c), "release");
    }
    return (bench_now() - t0) / (double)iters * 1e9;
}

static void overhead(bench_report *r, ndm_manager m)
{
    int64_t iters = r->o.quick ? 200000 : 2000000;
    int reps = r->o.quick ? 3 : 9;
    float ha[16], hb[16];
    for (int i = 0; i < 16; i++) {
        ha[i] = (float)i;
        hb[i] = 0.0f;
    }
    ndm_array a = ndm_from_buffer(m, NDM_F32, ha, NDM_SHAPE(16));
    ndm_array b = ndm_from_buffer(m, NDM_F32, hb, NDM_SHAPE(16));
    need(a, "a");
    need(b, "b");
    double plain[16], add[16], inplace[16], empty[16];
    plain_small_add(ha, hb, iters / 10);
    ndm_small(SMALL_ADD, m, a, b, iters / 10);
    for (int i = 0; i < reps; i++) {
        plain[i] = plain_small_add(ha, hb, iters);
        add[i] = ndm_small(SMALL_ADD, m, a, b, iters);
        inplace[i] = ndm_small(SMALL_ADD_INPLACE, m, a, b, iters);
        empty[i] = ndm_small(SMALL_EMPTY, m, a, b, iters);
    }
    /* each figure's samples alternate with the anchor's: ratios per pair */
    const char *what = "plain C: malloc 64 B, add 16 floats, free";
    bench_pairs p = bench_pair_stats(add, plain, reps, false);
    bench_add_pairs(r, "small_add_16_ns_per_call_vs_plain_c", p.fig_t, "ns", what, p.anchor_t, p);
    p = bench_pair_stats(inplace, plain, reps, false);
    bench_add_pairs(r, "small_add_inplace_16_ns_per_call_vs_plain_c", p.fig_t, "ns", what,
                    p.anchor_t, p);
    p = bench_pair_stats(empty, plain, reps, false);
    bench_add_pairs(r, "small_empty_release_16_ns_per_call_vs_plain_c", p.fig_t, "ns", what,
                    p.anchor_t, p);
    bench_note(r, "small_add: c = ndm_add(a, b) of two f32[16] and ndm_array_release(c); "
                  "small_add_inplace: ndm_add_(a, b); small_empty_release: ndm_empty + release");
    check(ndm_array_release(a), "release");
    check(ndm_array_release(b), "release");
}

void bench_ops_elementwise(bench_report *r)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-elementwise");
    if (!m.id) {
        fprintf(stderr, "bench: %s\n", ndm_last_error());
        exit(1);
    }
    overhead(r, m);
    bandwidth(r, m);
    check(ndm_manager_close(m), "close");
}
