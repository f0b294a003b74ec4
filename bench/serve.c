/* bench/serve: requests per second of one predictor served by T threads at
 * once, each with its own input and its own manager for the answers, beside
 * the rate of one thread alone times T (what the threads would reach if
 * they shared nothing), sampled turn about: the ratio is the scaling. The
 * sweep runs T = 2, 4, 8, ... up to the cores this process may use (at
 * least 2), and prints one figure per T.
 *
 * The net is 784-8-8-10: its arithmetic is small beside a request's own
 * work (the request manager, the handles, the answer's move), so what the
 * threads share shows. It is built without gradients, as a served net is.
 *
 * With --wide the net is 784-256-128-10, whose batch-1 products are large
 * enough for ndm's compute pool to split: the pool then competes with the
 * serving threads for the cores.
 *
 * usage: serve [--json] [--quick] [--wide] [--fixed T [N]]
 *   --fixed T: no pairs; T threads serve N requests each (default 200000)
 *   and the rate is printed, for counters (perf stat, callgrind) or whole
 *   process timings of one configuration. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench.h"
#include "ndm/ndm.h"

#define MAX_THREADS 64

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
    pthread_t th[MAX_THREADS];
    double t0 = bench_now();
    int made = 0;
    for (int t = 0; t < threads; t++, made++)
        if (pthread_create(&th[t], NULL, serve_requests, &c[t]) != 0) {
            c[t].s->errors++;
            break;
        }
    for (int t = 0; t < made; t++)
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

static int cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

int main(int argc, char **argv)
{
    int fixed = 0;
    long fixed_n = 200000;
    bool wide = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--wide"))
            wide = true;
        else if (!strcmp(argv[i], "--fixed") && i + 1 < argc) {
            fixed = atoi(argv[++i]);
            if (i + 1 < argc && argv[i + 1][0] != '-')
                fixed_n = atol(argv[++i]);
        }
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 3 : 11;
    int most = cores() < 2 ? 2 : cores() > MAX_THREADS ? MAX_THREADS : cores();
    if (fixed > MAX_THREADS || fixed < 0 || fixed_n < 1) {
        fprintf(stderr, "bench/serve: --fixed takes 1 to %d threads and N >= 1\n", MAX_THREADS);
        return 2;
    }
    ndm_manager root = ndm_manager_new(ndm_system(), "bench");
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(1);
    int64_t h1 = wide ? 256 : 8, h2 = wide ? 128 : 8;
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_flatten_module(model, 1), ndm_linear(model, 784, h1, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, h1, h2, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, h2, 10, true, &rng)));
    ndm_no_grad_end();
    server s = {ndm_predictor_new(model, net), 0, 0};
    if (!s.pr.id) {
        fprintf(stderr, "bench/serve: predictor: %s\n", ndm_last_error());
        return 1;
    }
    static caller c[MAX_THREADS];
    int nc = fixed > most ? fixed : most;
    for (int t = 0; t < nc; t++) {
        c[t] = (caller){&s, ndm_manager_new(root, "caller"), NDM_NULL_ARRAY, 0};
        c[t].x = ndm_full(c[t].out, NDM_F32, 0.5, NDM_SHAPE(1, 28, 28));
        if (!c[t].x.id) {
            fprintf(stderr, "bench/serve: input: %s\n", ndm_last_error());
            return 1;
        }
    }
    if (fixed) {
        s.requests = fixed_n;
        double secs = run_callers(c, fixed);
        printf("%d threads: %ld requests each in %.3f s: %.4g requests/s\n", fixed, s.requests,
               secs, (double)fixed * (double)s.requests / secs);
    } else {
        /* about 20 ms per sample for one thread */
        s.requests = 1000;
        while (run_callers(c, 1) < 0.02 && s.requests < (1L << 30))
            s.requests *= 2;
        char note[240];
        snprintf(note, sizeof note,
                 "784-%d-%d-10 MLP built without gradients, one predictor, batch-1 requests; %ld "
                 "requests per thread and sample; %d rounds of T threads then 1, turn about; "
                 "NDM_NUM_THREADS=%s",
                 (int)h1, (int)h2, s.requests, reps, getenv("NDM_NUM_THREADS") ? getenv("NDM_NUM_THREADS") : "(unset)");
        bench_note(&rep, note);
        static double t[2][BENCH_MAXSAMPLES];
        /* 2, 4, 8, ... and last the core count itself */
        for (int threads = 2; threads <= most; threads = threads < most && threads * 2 > most ? most : threads * 2) {
            turn all = {c, threads}, alone = {c, 1};
            bench_sample_fn fn[2] = {sample, sample};
            void *ctx[2] = {&all, &alone};
            bench_interleave(2, fn, ctx, reps, t);
            char name[64], anchor[64];
            snprintf(name, sizeof name, "serve_requests_per_s_%d_threads_vs_1", threads);
            snprintf(anchor, sizeof anchor, "one thread alone, its rate times %d", threads);
            double work = (double)threads * (double)s.requests;
            /* the anchor: one thread's rate times T (its work counted T times) */
            bench_add_paired_rate(&rep, name, "req/s", 1, anchor, work, t[0], work, t[1], reps);
        }
        bench_print(&rep);
    }

    int errors = s.errors;
    for (int i = 0; i < nc; i++)
        errors += c[i].errors;
    if (errors) {
        fprintf(stderr, "bench/serve: %d requests failed: %s\n", errors, ndm_last_error());
        return 1;
    }
    return ndm_manager_close(root) == NDM_OK ? 0 : 1;
}
