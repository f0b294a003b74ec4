/* Random kernels: nanoseconds per element of the fast CPU kernels on a warm
 * array, beside two anchors measured in the same run: a memset of the same
 * bytes on the same thread pool (the memory floor), and the reference
 * kernel (plain C with libm, one element at a time). ratio = ours / anchor. */
#include <stdint.h>

#include "bench.h"
#include "ndm/ndm.h"

#include "backends/cpu/parallel.h"
#include "backends/random.h"
#include "ops/dispatch.h"

typedef struct ms {
    char *dst;
    int64_t n;
} ms;

static void set_range(void *ctx, int64_t b, int64_t e)
{
    ms *c = ctx;
    memset(c->dst + b, 0x5a, (size_t)(e - b));
}

typedef enum what { UNIFORM, NORMAL, RANDINT, BERNOULLI, PERMUTATION } what;

static void run(const struct ndm__backend_random *k, what w, ndm_array a, ndm_rng g)
{
    ndm__tensor t = ndm__tensor_of(ndm__array_peek(a));
    switch (w) {
    case UNIFORM: (void)k->uniform(0, &t, g, -1, 1); break;
    case NORMAL: (void)k->normal(0, &t, g, 0, 1); break;
    case RANDINT: (void)k->randint(0, &t, g, 0, 1000); break;
    case BERNOULLI: (void)k->bernoulli(0, &t, g, 0.1); break;
    case PERMUTATION: (void)k->permutation(0, &t, g); break;
    }
}

/* One sample of a kernel: each draws fresh numbers (a new offset). */
typedef struct kernel_job {
    const struct ndm__backend_random *k;
    what w;
    ndm_array a;
    ndm_rng g;
} kernel_job;

static double kernel_s(void *ctx)
{
    kernel_job *j = ctx;
    j->g.offset += 1u << 30;
    double t0 = bench_now();
    run(j->k, j->w, j->a, j->g);
    return bench_now() - t0;
}

static double memset_s(void *ctx)
{
    ms *c = ctx;
    double t0 = bench_now();
    ndm__parallel_for(c->n, 1 << 16, set_range, c);
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 5 : 15;
    int64_t n = o.quick ? (1 << 20) : (1 << 24), nref = o.quick ? (1 << 16) : (1 << 20);
    ndm_manager m = ndm_manager_new(ndm_system(), "bench");
    const struct {
        const char *name;
        what w;
        ndm_dtype t;
    } cases[] = {
        {"uniform_f32", UNIFORM, NDM_F32},   {"uniform_f64", UNIFORM, NDM_F64},
        {"normal_f32", NORMAL, NDM_F32},     {"normal_f64", NORMAL, NDM_F64},
        {"randint_i32", RANDINT, NDM_I32},   {"bernoulli_bool", BERNOULLI, NDM_BOOL},
        {"permutation_i64", PERMUTATION, NDM_I64},
    };
    char note[256];
    snprintf(note, sizeof note, "%lld elements (reference: %lld), %d threads, warm arrays",
             (long long)n, (long long)nref, ndm__num_threads());
    bench_note(&rep, note);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t len = cases[k].w == PERMUTATION ? n / 4 : n;
        int64_t rlen = cases[k].w == PERMUTATION ? nref / 4 : nref;
        ndm_array a = ndm_zeros(m, cases[k].t, NDM_SHAPE(len));
        ndm_array r = ndm_zeros(m, cases[k].t, NDM_SHAPE(rlen));
        /* the kernel, the memset and the reference kernel turn about */
        kernel_job fast = {ndm__cpu_backend.random, cases[k].w, a, ndm_rng_new(7)};
        kernel_job ref = {ndm__cpu_ref_backend.random, cases[k].w, r, ndm_rng_new(7)};
        ms c = {ndm_array_data(a), (int64_t)ndm_array_nbytes(a)};
        static double t[3][BENCH_MAXSAMPLES];
        bench_interleave(3, (bench_sample_fn[]){kernel_s, memset_s, kernel_s},
                         (void *[]){&fast, &c, &ref}, reps, t);
        for (int i = 0; i < reps; i++) { /* per element */
            t[0][i] /= (double)len;
            t[1][i] /= (double)len;
            t[2][i] /= (double)rlen;
        }
        char name[96];
        snprintf(name, sizeof name, "%s_ns_per_elem_vs_memset", cases[k].name);
        bench_add_paired_time(&rep, name, "ns", 1e9, "memset of the same bytes, same pool", t[0],
                              t[1], reps);
        snprintf(name, sizeof name, "%s_ns_per_elem_vs_reference", cases[k].name);
        bench_add_paired_time(&rep, name, "ns", 1e9, "reference kernel (plain C, libm)", t[0],
                              t[2], reps);
        (void)!ndm_array_release(a);
        (void)!ndm_array_release(r);
    }
    bench_print(&rep);
    return ndm_manager_close(m) == NDM_OK ? 0 : 1;
}
