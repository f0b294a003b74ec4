/* bench/dist: run under mpirun -np 2 (its default binding: a core per
 * rank). What the agreement alone costs, all-reduce bus bandwidth of
 * ndm_all_reduce_ against a bare MPI_Allreduce of the same buffers, the
 * share of all-reduce time hidden behind backward in an MLP step, and
 * steps/s of one process against two at the same global batch (the
 * argument "overlap": the hidden share alone). */
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "ndm/ndm.h"

static int R, S;

#define DIE(...)                                                                \
    do {                                                                        \
        fprintf(stderr, "bench/dist: " __VA_ARGS__);                            \
        fprintf(stderr, ": %s\n", ndm_last_error());                            \
        MPI_Abort(MPI_COMM_WORLD, 1);                                           \
    } while (0)

/* The slowest rank's time for what ran since t0 (all ranks start after a barrier). */
static double job_time(double t0)
{
    double t = bench_now() - t0, m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

/* ---- all-reduce bandwidth -------------------------------------------------------------- */

/* NCCL's bus bandwidth: what each link carries in a ring all-reduce. */
static double busbw(double bytes, double secs) { return bytes * 2.0 * (S - 1) / S / secs / 1e9; }

/* What the agreement alone costs (ndm_dist_barrier() is nothing else),
 * against a bare 4 KiB MPI_Allreduce, interleaved. */
static void agreement(bench_report *rep, bool quick)
{
    int pairs = quick ? 200 : 1000;
    double *ag = malloc((size_t)pairs * sizeof *ag), *bare = malloc((size_t)pairs * sizeof *bare);
    double *ratio = malloc((size_t)pairs * sizeof *ratio);
    float buf[1024] = {0};
    for (int k = -10; k < pairs; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        if (ndm_dist_barrier() != NDM_OK)
            DIE("ndm_dist_barrier");
        double ta = job_time(t0);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = bench_now();
        MPI_Allreduce(MPI_IN_PLACE, buf, 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double tb = job_time(t0);
        if (k < 0)
            continue;
        ag[k] = ta;
        bare[k] = tb;
        ratio[k] = ta / tb;
    }
    double ma = bench_median(ag, pairs), mb = bench_median(bare, pairs);
    double mr = bench_median(ratio, pairs);
    char anchor[160];
    snprintf(anchor, sizeof anchor,
             "bare 4 KiB MPI_Allreduce (us); pairs %d, ratio median %.3f, p10-p90 %.3f-%.3f", pairs,
             mr, ratio[pairs / 10], ratio[pairs - 1 - pairs / 10]);
    bench_add(rep, "agreement_alone_us_vs_4KiB_allreduce", ma * 1e6, "us", anchor, mb * 1e6);
    free(ag);
    free(bare);
    free(ratio);
}

static void bandwidth(bench_report *rep, bool quick)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "bench-allreduce");
    int64_t top = quick ? (int64_t)16 << 20 : (int64_t)256 << 20;
    double ratios[16];
    int nr = 0;
    for (int64_t bytes = 4096; bytes <= top; bytes *= 4) {
        int64_t n = bytes / 4;
        ndm_array a = ndm_ones(m, NDM_F32, 1, &n);
        if (!a.id)
            DIE("allocating %lld bytes", (long long)bytes);
        float *p = ndm_array_data(a);
        /* interleaved pairs, ours first in even pairs and bare first in odd
         * ones, so that drift and order hit both alike */
        int pairs = bytes <= (1 << 20) ? (quick ? 50 : 200) : bytes <= (16 << 20) ? 16 : 6;
        if (quick && bytes > (1 << 20))
            pairs = 6;
        double *ours = malloc((size_t)pairs * sizeof *ours);
        double *bare = malloc((size_t)pairs * sizeof *bare);
        double *ratio = malloc((size_t)pairs * sizeof *ratio);
        for (int k = -1; k < pairs; k++) { /* k = -1: warm-up */
            double to = 0, tb = 0;
            for (int turn = 0; turn < 2; turn++) {
                bool ours_now = (turn == 0) == (k % 2 == 0);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = bench_now();
                if (ours_now) {
                    if (ndm_all_reduce_(a, NDM_DIST_SUM) != NDM_OK)
                        DIE("ndm_all_reduce_");
                    to = job_time(t0);
                } else {
                    MPI_Allreduce(MPI_IN_PLACE, p, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                    tb = job_time(t0);
                }
            }
            if (k < 0)
                continue;
            ours[k] = to;
            bare[k] = tb;
            ratio[k] = tb / to; /* bandwidth ratio: ours over bare */
        }
        double mo = bench_median(ours, pairs), mb = bench_median(bare, pairs);
        double mr = bench_median(ratio, pairs);
        double lo = ratio[pairs / 10], hi = ratio[pairs - 1 - pairs / 10];
        char name[96], anchor[160];
        const char *unit = bytes >= (1 << 20) ? "MiB" : "KiB";
        long long shown = bytes >= (1 << 20) ? bytes >> 20 : bytes >> 10;
        snprintf(name, sizeof name, "allreduce_busbw_%lld%s_GBps", shown, unit);
        snprintf(anchor, sizeof anchor,
                 "bare MPI_Allreduce, same buffer; pairs %d, ratio median %.3f, p10-p90 %.3f-%.3f",
                 pairs, mr, lo, hi);
        bench_add(rep, name, busbw((double)bytes, mo), "GB/s", anchor, busbw((double)bytes, mb));
        if (nr < 16)
            ratios[nr++] = mr;
        free(ours);
        free(bare);
        free(ratio);
        if (ndm_array_release(a) != NDM_OK)
            DIE("release");
    }
    double med = bench_median(ratios, nr);
    bench_add(rep, "allreduce_bandwidth_median_ratio_over_sizes", med, "x",
              "1.0 = bare MPI_Allreduce", 1.0);
    (void)!ndm_manager_close(m);
}

/* ---- overlap of all-reduce with backward ---------------------------------------------------- */

static ndm_module mlp(ndm_manager model, int64_t width)
{
    ndm_rng rng = ndm_rng_new(1);
    return ndm_sequential(model, NDM_MODULES(ndm_linear(model, 784, width, true, &rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, width, width, true, &rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, width, 10, true, &rng)));
}

/* Seconds of backward plus step (the slowest rank's), one step. */
static double one_step(ndm_module net, ndm_optimizer opt, ndm_ddp d, ndm_array x, ndm_array y)
{
    ndm_manager batch = ndm_manager_new(ndm_system(), "batch");
    if (ndm_grad_begin(batch) != NDM_OK)
        DIE("grad_begin");
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = bench_now();
    ndm_status s = d.id ? ndm_ddp_backward(d, loss) : ndm_backward(loss);
    (void)ndm_grad_end();
    if (s == NDM_OK)
        s = d.id ? ndm_ddp_step(d) : ndm_optimizer_step(opt);
    if (s == NDM_OK && !d.id)
        s = ndm_optimizer_zero_grad(opt);
    if (s != NDM_OK)
        DIE("a step");
    double t = job_time(t0);
    (void)!ndm_manager_close(batch);
    return t;
}

static void overlap(bench_report *rep, bool quick)
{
    const int64_t widths[] = {256, 1024, 2048};
    int nw = quick ? 2 : 3;
    int steps = quick ? 9 : 21;
    const int64_t bucket = (int64_t)1 << 20;
    for (int w = 0; w < nw; w++) {
        ndm_manager model = ndm_manager_new(ndm_system(), "model");
        ndm_module net = mlp(model, widths[w]);
        ndm_optimizer opt = ndm_sgd(model, net, 0.01, 0.0, 0.0);
        ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = bucket});
        if (!d.id)
            DIE("ndm_ddp_new");
        ndm_manager data = ndm_manager_new(ndm_system(), "data");
        ndm_rng rng = ndm_rng_new(2);
        ndm_array x = ndm_uniform(data, &rng, NDM_F32, 0, 1, 2, (int64_t[]){64, 784});
        ndm_array y = ndm_randint(data, &rng, NDM_I64, 0, 10, 1, (int64_t[]){64});
        int64_t np = 784 * widths[w] + widths[w] + widths[w] * widths[w] + widths[w] +
                     widths[w] * 10 + 10;
        ndm_array flat = ndm_zeros(data, NDM_F32, 1, &np);
        double *c = malloc((size_t)steps * sizeof *c), *pl = malloc((size_t)steps * sizeof *pl);
        double *dp = malloc((size_t)steps * sizeof *dp), *hid = malloc((size_t)steps * sizeof *hid);
        /* interleaved: the buckets' blocking all-reduce alone, a plain step,
         * a data-parallel step, so that the machine's drift hits all three */
        for (int k = -1; k < steps; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = bench_now();
            for (int64_t off = 0; off < np; off += bucket / 4) {
                int cnt = (int)(np - off < bucket / 4 ? np - off : bucket / 4);
                MPI_Allreduce(MPI_IN_PLACE, (float *)ndm_array_data(flat) + off, cnt, MPI_FLOAT,
                              MPI_SUM, MPI_COMM_WORLD);
            }
            double tc = job_time(t0);
            double tp = one_step(net, opt, (ndm_ddp){0}, x, y);
            double td = one_step(net, opt, d, x, y);
            if (k < 0)
                continue;
            c[k] = tc;
            pl[k] = tp;
            dp[k] = td;
            /* what data-parallel adds to backward and step is the all-reduce
             * time backward did not hide */
            /* not clamped: below 0, data-parallel costs more than its
             * all-reduce; above 1, less than it (or noise) */
            hid[k] = tc > 0 ? 1.0 - (td - tp) / tc : 0;
        }
        double comm = bench_median(c, steps), plain = bench_median(pl, steps);
        double dpar = bench_median(dp, steps), hidden = bench_median(hid, steps);
        char name[96], anchor[160]; /* hid is sorted now */
        snprintf(name, sizeof name, "allreduce_hidden_share_mlp%lld", (long long)widths[w]);
        snprintf(anchor, sizeof anchor,
                 "all-reduce %.2f ms; backward+step %.2f ms plain, %.2f ms data-parallel; "
                 "steps %d, p10-p90 %.2f-%.2f", comm * 1e3, plain * 1e3, dpar * 1e3, steps, hid[steps / 10],
                 hid[steps - 1 - steps / 10]);
        bench_add(rep, name, hidden, "share", anchor, 0);
        free(c);
        free(pl);
        free(dp);
        free(hid);
        (void)!ndm_manager_close(data);
        (void)!ndm_manager_close(model);
    }
}

/* ---- steps/s, 1 process against 2 ------------------------------------------------------------- */

static void step_on(ndm_module net, ndm_optimizer opt, ndm_array x, ndm_array y)
{
    ndm_manager batch = ndm_manager_new(ndm_system(), "batch");
    (void)!ndm_grad_begin(batch);
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
    if (ndm_backward(loss) != NDM_OK || (ndm_grad_end(), ndm_optimizer_step(opt)) ||
        ndm_optimizer_zero_grad(opt)) {
        fprintf(stderr, "bench/dist: a one-process step: %s\n", ndm_last_error());
        exit(1);
    }
    (void)!ndm_manager_close(batch);
}

#define SCALE_GLOBAL 128
#define SCALE_WIDTH 512

/* One process on the whole machine, at the global batch: a child that rank
 * 0 starts before MPI exists, which takes every online core (mpirun bound
 * its parent to one) and the pool's default size, while the other ranks
 * wait in MPI_Init. Steps/s, or 0 when it could not run. */
static double one_process(bool quick)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r || strcmp(r, "0"))
        return 0;
    int fd[2];
    if (pipe(fd))
        return 0;
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        cpu_set_t all;
        CPU_ZERO(&all);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long c = 0; c < n && c < CPU_SETSIZE; c++)
            CPU_SET(c, &all);
        (void)sched_setaffinity(0, sizeof all, &all);
        unsetenv("NDM_NUM_THREADS");
        int steps = quick ? 10 : 40;
        ndm_manager model = ndm_manager_new(ndm_system(), "model");
        ndm_module net = mlp(model, SCALE_WIDTH);
        ndm_optimizer opt = ndm_sgd(model, net, 0.01, 0.0, 0.0);
        ndm_rng rng = ndm_rng_new(3);
        ndm_array x = ndm_uniform(model, &rng, NDM_F32, 0, 1, 2, (int64_t[]){SCALE_GLOBAL, 784});
        ndm_array y = ndm_randint(model, &rng, NDM_I64, 0, 10, 1, (int64_t[]){SCALE_GLOBAL});
        step_on(net, opt, x, y); /* warm-up */
        double t0 = bench_now();
        for (int k = 0; k < steps; k++)
            step_on(net, opt, x, y);
        double v = steps / (bench_now() - t0);
        ssize_t w = write(fd[1], &v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fd[1]);
    double v = 0;
    if (read(fd[0], &v, sizeof v) != (ssize_t)sizeof v)
        v = 0;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? v : 0;
}

static void scaling(bench_report *rep, bool quick, double one)
{
    const int64_t global = SCALE_GLOBAL;
    int steps = quick ? 10 : 40;
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_module net = mlp(model, SCALE_WIDTH);
    ndm_optimizer opt = ndm_sgd(model, net, 0.01, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, NULL);
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_rng rng = ndm_rng_new(3);
    ndm_array xs = ndm_uniform(data, &rng, NDM_F32, 0, 1, 2, (int64_t[]){global / S, 784});
    ndm_array ys = ndm_randint(data, &rng, NDM_I64, 0, 10, 1, (int64_t[]){global / S});
    if (!d.id || !ys.id)
        DIE("setting up the scaling run");
    MPI_Bcast(&one, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    double t0 = 0;
    for (int k = -1; k < steps; k++) { /* k = -1: warm-up */
        if (k == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = bench_now();
        }
        ndm_manager batch = ndm_manager_new(ndm_system(), "batch");
        (void)!ndm_grad_begin(batch);
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, xs), ys);
        (void)ndm_ddp_backward(d, loss);
        (void)ndm_grad_end();
        if (ndm_ddp_step(d) != NDM_OK)
            DIE("a data-parallel step");
        (void)!ndm_manager_close(batch);
    }
    double two = steps / job_time(t0);
    char name[64], anchor[160];
    snprintf(name, sizeof name, "steps_per_s_%d_processes_mlp512_batch128", S);
    snprintf(anchor, sizeof anchor,
             "1 process on all %ld cores at the same global batch (child of rank 0)",
             sysconf(_SC_NPROCESSORS_ONLN));
    bench_add(rep, name, two, "steps/s", anchor, one);
    (void)!ndm_manager_close(data);
    (void)!ndm_manager_close(model);
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    /* "overlap": that part alone (measuring changes to the step) */
    bool only_overlap = false;
    for (int i = 1; i < argc; i++)
        only_overlap |= !strcmp(argv[i], "overlap");
    /* before MPI: a process that forks after MPI_Init is on its own */
    double one = only_overlap ? 0 : one_process(o.quick);
    if (ndm_dist_init() != NDM_OK) {
        fprintf(stderr, "bench/dist: %s\n", ndm_last_error());
        return 1;
    }
    R = ndm_dist_rank();
    S = ndm_dist_size();
    if (S < 2) {
        fprintf(stderr, "bench/dist: run it under mpirun -np 2 (or more)\n");
        (void)ndm_dist_finalize();
        return 1;
    }
    static bench_report rep;
    rep.o = o;
    if (!only_overlap) {
        agreement(&rep, o.quick);
        bandwidth(&rep, o.quick);
    }
    overlap(&rep, o.quick);
    if (!only_overlap)
        scaling(&rep, o.quick, one);
    char note[256];
    snprintf(note, sizeof note,
             "%d processes on one machine over shared memory; every figure is the slowest rank's",
             S);
    bench_note(&rep, note);
    cpu_set_t mine;
    int cores = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : -1;
    const char *nt = getenv("NDM_NUM_THREADS");
    snprintf(note, sizeof note,
             "rank %d may run on %d core(s); NDM_NUM_THREADS %s (the pool defaults to those cores)",
             R, cores, nt && *nt ? nt : "unset");
    bench_note(&rep, note);
    bench_note(&rep, "hidden share: median over interleaved steps of 1 - (data-parallel "
                     "backward+step - plain backward+step) / blocking all-reduce of the same "
                     "buckets, not clamped to 0..1");
    if (R == 0)
        bench_print(&rep);
    return ndm_dist_finalize() == NDM_OK ? 0 : 1;
}
