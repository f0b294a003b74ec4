/* bench/serve: requests per second of one predictor served by two threads at
 * once, each with its own input and its own manager for the answers, beside
 * the rate of one thread alone times two (what the threads would reach if
 * they shared nothing), sampled turn about: the ratio is the scaling.
 *
 * The net is 784-8-8-10: its arithmetic is small beside a request's own
 * work (the request manager, the handles, the answer's move), so what the
 * threads share shows. The products run on the calling thread (they are
 * below the CPU pool's split), so the pool's size does not matter here.
 *
 * usage: serve [--json] [--quick] */
#include <pthread.h>
#include <stdlib.h>

#include "bench.h"
#include "ndm/ndm.h"

#define THREADS 2

typedef struct server {
    ndm_predictor pr;
    long requests; /* per thread and sample */
    int errors;
} server;

typedef struct caller {
    server *s;
    ndm_manager out;
    ndm_array x;
    int errors;
} caller;

static void *serve_requests(void *v)
{
    caller *c = v;
    for (long i = 0; i < c->s->requests; i++) {
        ndm_array y = ndm_predict(c->s->pr, c->x);
        if (!y.id || ndm_array_release(y) != NDM_OK)
            c->errors++;
    }
    return NULL;
}

/* Seconds for `threads` callers to serve their requests at once. */
static double run_callers(caller *c, int threads)
{
    pthread_t th[THREADS];
    double t0 = bench_now();
    for (int t = 0; t < threads; t++)
        if (pthread_create(&th[t], NULL, serve_requests, &c[t]) != 0)
            c[t].s->errors++;
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    return bench_now() - t0;
}

typedef struct turn {
    caller *c;
    int threads;
} turn;

static double sample(void *ctx)
{
    turn *t = ctx;
    return run_callers(t->c, t->threads);
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 3 : 11;
    ndm_manager root = ndm_manager_new(ndm_system(), "bench");
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_flatten_module(model, 1), ndm_linear(model, 784, 8, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, 8, 8, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, 8, 10, true, &rng)));
    server s = {ndm_predictor_new(model, net), 0, 0};
    if (!s.pr.id) {
        fprintf(stderr, "bench/serve: predictor: %s\n", ndm_last_error());
        return 1;
    }
    caller c[THREADS];
    for (int t = 0; t < THREADS; t++) {
        c[t] = (caller){&s, ndm_manager_new(root, "caller"), NDM_NULL_ARRAY, 0};
        c[t].x = ndm_full(c[t].out, NDM_F32, 0.5, NDM_SHAPE(1, 28, 28));
        if (!c[t].x.id) {
            fprintf(stderr, "bench/serve: input: %s\n", ndm_last_error());
            return 1;
        }
    }
    /* about 20 ms per sample for one thread */
    s.requests = 1000;
    while (run_callers(c, 1) < 0.02 && s.requests < (1L << 30))
        s.requests *= 2;

    static double t[2][BENCH_MAXSAMPLES];
    turn both = {c, THREADS}, alone = {c, 1};
    bench_sample_fn fn[2] = {sample, sample};
    void *ctx[2] = {&both, &alone};
    bench_interleave(2, fn, ctx, reps, t);

    char note[200];
    snprintf(note, sizeof note,
             "784-8-8-10 MLP, one predictor, batch-1 requests; %ld requests per thread and "
             "sample; %d rounds, %d threads then 1, turn about",
             s.requests, reps, THREADS);
    bench_note(&rep, note);
    double work = (double)THREADS * (double)s.requests;
    /* the anchor: one thread's rate times THREADS (its work counted THREADS times) */
    bench_add_paired_rate(&rep, "serve_requests_per_s_2_threads_vs_1", "req/s", 1,
                          "one thread alone, its rate times 2", work, t[0], work, t[1], reps);
    bench_print(&rep);

    int errors = s.errors;
    for (int i = 0; i < THREADS; i++)
        errors += c[i].errors;
    if (errors) {
        fprintf(stderr, "bench/serve: %d requests failed: %s\n", errors, ndm_last_error());
        return 1;
    }
    return ndm_manager_close(root) == NDM_OK ? 0 : 1;
}
