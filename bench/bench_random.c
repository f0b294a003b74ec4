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

static double median_run(const struct ndm__backend_random *k, what w, ndm_array a, int reps)
{
    double t[64];
    ndm_rng g = ndm_rng_new(7);
    run(k, w, a, g);
    for (int r = 0; r < reps; r++) {
        g.offset += 1u << 30;
        double t0 = bench_now();
        run(k, w, a, g);
        t[r] = bench_now() - t0;
    }
    return bench_median(t, reps);
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
        double t = median_run(ndm__cpu_backend.random, cases[k].w, a, reps) / (double)len;
        double tr = median_run(ndm__cpu_ref_backend.random, cases[k].w, r, o.quick ? 3 : 5) /
                    (double)rlen;
        double ts[64];
        ms c = {ndm_array_data(a)};
        for (int i = 0; i < reps; i++) {
            double t0 = bench_now();
            ndm__parallel_for((int64_t)ndm_array_nbytes(a), 1 << 16, set_range, &c);
            ts[i] = bench_now() - t0;
        }
        double tm = bench_median(ts, reps) / (double)len;
        char name[96];
        snprintf(name, sizeof name, "%s_ns_per_elem_vs_memset", cases[k].name);
        bench_add(&rep, name, t * 1e9, "ns", "memset of the same bytes, same pool", tm * 1e9);
        snprintf(name, sizeof name, "%s_ns_per_elem_vs_reference", cases[k].name);
        bench_add(&rep, name, t * 1e9, "ns", "reference kernel (plain C, libm)", tr * 1e9);
        (void)!ndm_array_release(a);
        (void)!ndm_array_release(r);
    }
    bench_print(&rep);
    return ndm_manager_close(m) == NDM_OK ? 0 : 1;
}
