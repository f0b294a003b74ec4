/* bench/serve_batch: requests per second of a dynamic batcher over one
 * predictor beside the predictor alone, at the same client threads (each
 * with its own manager and batch-1 input, one request in flight), sampled
 * turn about; the batcher's answers as copies and as loans; p50 and p99
 * latency of each, and the bound the batcher aims at: max_delay_us plus two
 * batch times (a full batch's forward pass, measured in the same run).
 *
 * Nets: the Fashion MLP (784-256-128-10, tools/fashion_net.c), whose
 * batch-1 products are a matrix-vector pass over its weights per request,
 * and bench/serve's 784-8-8-10, whose cost is the request's own overhead.
 *
 * usage: serve_batch [--json] [--quick] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "bench.h"
#include "ndm/ndm.h"

#define CLIENTS 16
static int MAX_DELAY_US = 500;
#define MAX_BATCH 16
#define LAT_MAX 200000 /* latencies kept per contender */

typedef enum mode { UNBATCHED, BATCHED_COPY, BATCHED_LOAN, MODES } mode;
static const char *const mode_name[MODES] = {"unbatched", "batched (copies)", "batched (loans)"};

typedef struct lat {
    float us[LAT_MAX];
    _Atomic long n;
} lat;

typedef struct server {
    ndm_predictor pr;
    ndm_batcher b[MODES];   /* b[BATCHED_COPY], b[BATCHED_LOAN] */
    long requests;          /* per client and sample */
    _Atomic long errors;
    lat *lat[MODES];
} server;

typedef struct caller {
    server *s;
    ndm_manager out;
    ndm_array x;
    mode m;
} caller;

static void *serve_requests(void *v)
{
    caller *c = v;
    server *s = c->s;
    lat *l = s->lat[c->m];
    for (long i = 0; i < s->requests; i++) {
        double t0 = bench_now();
        ndm_array y = c->m == UNBATCHED ? ndm_predict_to(c->out, s->pr, c->x)
                                        : ndm_batcher_predict_to(c->out, s->b[c->m], c->x, 0);
        double t1 = bench_now();
        if (!y.id || ndm_array_release(y) != NDM_OK)
            atomic_fetch_add(&s->errors, 1);
        long k = atomic_fetch_add(&l->n, 1);
        if (k < LAT_MAX)
            l->us[k] = (float)((t1 - t0) * 1e6);
    }
    return NULL;
}

typedef struct turn {
    caller *c;
    mode m;
} turn;

/* Seconds for the clients to serve their requests at once in mode t->m. */
static double sample(void *ctx)
{
    turn *t = ctx;
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        t->c[i].m = t->m;
    double t0 = bench_now();
    for (int i = 0; i < CLIENTS; i++)
        if (pthread_create(&th[i], NULL, serve_requests, &t->c[i]) != 0)
            atomic_fetch_add(&t->c[i].s->errors, 1);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    return bench_now() - t0;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double percentile(lat *l, double q)
{
    long n = atomic_load(&l->n);
    if (n > LAT_MAX)
        n = LAT_MAX;
    if (n == 0)
        return 0;
    qsort(l->us, (size_t)n, sizeof *l->us, cmp_float);
    long k = (long)(q * (double)(n - 1) + 0.5);
    return l->us[k];
}

/* Median seconds of one forward pass over `rows` rows, alone. */
static double batch_time(ndm_predictor pr, ndm_manager m, int64_t rows, int reps)
{
    ndm_array x = ndm_full(m, NDM_F32, 0.5, NDM_SHAPE(rows, 1, 28, 28));
    double t[64];
    for (int i = 0; i < reps && i < 64; i++) {
        double t0 = bench_now();
        ndm_array y = ndm_predict_to(m, pr, x);
        t[i] = bench_now() - t0;
        (void)ndm_array_release(y);
    }
    (void)ndm_array_release(x);
    return bench_median(t, reps < 64 ? reps : 64);
}

/* The rows of a batched answer are the predictor's, bit for bit? */
static bool same_bits(ndm_predictor pr, ndm_batcher b, ndm_manager m)
{
    ndm_array x = ndm_full(m, NDM_F32, 0.25, NDM_SHAPE(1, 1, 28, 28));
    ndm_array y = ndm_predict_to(m, pr, x), z = ndm_batcher_predict_to(m, b, x, 0);
    float a[10] = {0}, c[10] = {1};
    bool same = y.id && z.id && ndm_array_copy_out(y, a, sizeof a) == NDM_OK &&
                ndm_array_copy_out(z, c, sizeof c) == NDM_OK && !memcmp(a, c, sizeof a);
    (void)ndm_array_release(x);
    (void)ndm_array_release(y);
    (void)ndm_array_release(z);
    return same;
}

static int run_net(bench_report *rep, const char *tag, bool fashion, int reps)
{
    ndm_manager root = ndm_manager_new(ndm_system(), "bench");
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_rng rng = ndm_rng_new(1);
    int64_t h1 = fashion ? 256 : 8, h2 = fashion ? 128 : 8;
    ndm_no_grad_begin();
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_flatten_module(model, 1), ndm_linear(model, 784, h1, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, h1, h2, true, &rng),
                           ndm_relu_module(model), ndm_linear(model, h2, 10, true, &rng)));
    ndm_no_grad_end();
    static server s;
    memset(&s, 0, sizeof s);
    s.pr = ndm_predictor_new(model, net);
    for (int m = BATCHED_COPY; m < MODES; m++)
        s.b[m] = ndm_batcher_new(s.pr, &(ndm_batcher_options){
                                           .max_batch = MAX_BATCH,
                                           .max_delay_us = MAX_DELAY_US,
                                           .flags = m == BATCHED_LOAN ? NDM_BATCHER_LOAN : 0});
    if (!s.pr.id || !s.b[BATCHED_COPY].id || !s.b[BATCHED_LOAN].id) {
        fprintf(stderr, "bench/serve_batch: %s\n", ndm_last_error());
        return 1;
    }
    static lat lats[MODES];
    for (int m = 0; m < MODES; m++) {
        atomic_store(&lats[m].n, 0);
        s.lat[m] = &lats[m];
    }
    caller c[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        c[i] = (caller){&s, ndm_manager_new(root, "caller"), NDM_NULL_ARRAY, UNBATCHED};
        c[i].x = ndm_full(c[i].out, NDM_F32, 0.01 * i, NDM_SHAPE(1, 1, 28, 28));
    }
    bool bits = same_bits(s.pr, s.b[BATCHED_COPY], root);
    /* a full batch's pass, and one row's, turn about */
    double tb = 0, t1 = 0, tbs[15], t1s[15];
    for (int i = 0; i < 15; i++) {
        tbs[i] = batch_time(s.pr, root, MAX_BATCH, 9);
        t1s[i] = batch_time(s.pr, root, 1, 9);
    }
    tb = bench_median(tbs, 15);
    t1 = bench_median(t1s, 15);
    /* about 0.1 s per unbatched sample */
    turn tu = {c, UNBATCHED}, tc = {c, BATCHED_COPY}, tl = {c, BATCHED_LOAN};
    s.requests = 50;
    while (sample(&tu) < 0.1 && s.requests < (1L << 24))
        s.requests *= 2;
    for (int m = 0; m < MODES; m++)
        atomic_store(&lats[m].n, 0);

    static double t[MODES][BENCH_MAXSAMPLES];
    bench_sample_fn fn[MODES] = {sample, sample, sample};
    void *ctx[MODES] = {&tc, &tu, &tl}; /* the figure first, then its anchors */
    bench_interleave(MODES, fn, ctx, reps, t);
    /* t[0]: copies, t[1]: unbatched, t[2]: loans */
    double work = (double)CLIENTS * (double)s.requests;
    char name[96], anchor[160];
    snprintf(name, sizeof name, "%s_batched_req_per_s_vs_unbatched", tag);
    snprintf(anchor, sizeof anchor, "ndm_predict, the same %d client threads", CLIENTS);
    bench_add_paired_rate(rep, name, "req/s", 1, anchor, work, t[0], work, t[1], reps);
    snprintf(name, sizeof name, "%s_loans_req_per_s_vs_copies", tag);
    bench_add_paired_rate(rep, name, "req/s", 1, "the batcher answering with copies", work, t[2],
                          work, t[0], reps);
    double p50[MODES], p99[MODES];
    for (int m = 0; m < MODES; m++) {
        p50[m] = percentile(&lats[m], 0.50);
        p99[m] = percentile(&lats[m], 0.99);
    }
    double bound = MAX_DELAY_US + 2 * tb * 1e6;
    snprintf(name, sizeof name, "%s_batched_p99_us_vs_bound", tag);
    bench_add(rep, name, p99[BATCHED_COPY], "us", "max_delay_us + two full-batch forward passes",
              bound);
    snprintf(name, sizeof name, "%s_batched_p50_us_vs_unbatched", tag);
    bench_add(rep, name, p50[BATCHED_COPY], "us", "ndm_predict's p50, the same clients",
              p50[UNBATCHED]);
    snprintf(name, sizeof name, "%s_unbatched_p99_us", tag);
    bench_add(rep, name, p99[UNBATCHED], "us", NULL, 0);
    snprintf(name, sizeof name, "%s_loans_p99_us", tag);
    bench_add(rep, name, p99[BATCHED_LOAN], "us", NULL, 0);
    /* what batching gains on the arithmetic alone: the ceiling of the ratio */
    snprintf(name, sizeof name, "%s_row_us_in_full_batch_vs_batch1", tag);
    bench_add(rep, name, tb * 1e6 / MAX_BATCH, "us", "one row's forward pass alone", t1 * 1e6);
    ndm_batcher_stats st;
    if (ndm_batcher_stats_get(s.b[BATCHED_COPY], &st) == NDM_OK) {
        snprintf(name, sizeof name, "%s_mean_batch_rows", tag);
        bench_add(rep, name, st.mean_batch, "rows", NULL, 0);
    }
    char note[256];
    snprintf(note, sizeof note,
             "%s: %d clients, max_batch %d, max_delay_us %d, %ld requests per client and "
             "sample, %d rounds turn about; a full batch's pass %.1f us; batched rows %s "
             "ndm_predict's bit for bit",
             fashion ? "784-256-128-10" : "784-8-8-10", CLIENTS, MAX_BATCH, MAX_DELAY_US,
             s.requests, reps, tb * 1e6, bits ? "equal" : "DIFFER FROM");
    bench_note(rep, note);
    (void)mode_name;
    long errors = atomic_load(&s.errors);
    if (errors) {
        fprintf(stderr, "bench/serve_batch: %ld requests failed: %s\n", errors, ndm_last_error());
        return 1;
    }
    for (int m = BATCHED_COPY; m < MODES; m++)
        if (ndm_batcher_close(s.b[m]) != NDM_OK)
            return 1;
    return ndm_manager_close(root) == NDM_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    int reps = o.quick ? 3 : 9;
    const char *d = getenv("NDM_BENCH_MAX_DELAY_US");
    if (d && *d)
        MAX_DELAY_US = atoi(d);
    if (run_net(&rep, "fashion_mlp", true, reps) || run_net(&rep, "mlp_784_8_8_10", false, reps))
        return 1;
    bench_print(&rep);
    return 0;
}
