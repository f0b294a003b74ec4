/* The NCCL path on a real GPU, for a machine that has one (tools/run.sh gpu
 * runs it under `mpirun -np 1`; any rank count works, all on cuda:0 of
 * their own machine): the bootstrap, then every collective on CUDA arrays
 * of every dtype, each result checked on the host, then a few data-parallel
 * steps of a small MLP on the GPU against the same steps without the
 * wrapper. Plain C, no cmocka, so that a release tree builds it. Exit
 * status 0 when every check passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist_values.h"
#include "ndm/ndm.h"

static int R, S, failures;

/* n elements of rank r on the GPU, in m. */
static ndm_array filled(ndm_manager m, ndm_dtype dt, int r, int64_t n)
{
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = dist_value(dt, r, i);
    ndm_array d = ndm_from_buffer(m, NDM_F64, v, 1, &n);
    free(v);
    ndm_array a = d.id ? ndm_astype(d, dt) : NDM_NULL_ARRAY;
    if (d.id)
        (void)!ndm_array_release(d);
    return a;
}

/* Compare a's elements with want(i); a failure is counted and printed. */
static void check(const char *what, ndm_dtype dt, ndm_array a,
                  double (*want)(ndm_dtype, int64_t, void *), void *ctx)
{
    if (!a.id) {
        printf("FAIL %s %s: %s\n", ndm_dtype_name(dt), what, ndm_last_error());
        failures++;
        return;
    }
    if (ndm_array_device(a).type != NDM_DEVICE_CUDA) {
        printf("FAIL %s %s: the result is not on the GPU\n", ndm_dtype_name(dt), what);
        failures++;
        return;
    }
    ndm_array d = ndm_astype(a, NDM_F64);
    int64_t n = ndm_array_size(a);
    double *v = malloc((size_t)n * sizeof *v);
    if (!d.id || ndm_array_copy_out(d, v, (size_t)n * sizeof *v) != NDM_OK) {
        printf("FAIL %s %s: reading the result: %s\n", ndm_dtype_name(dt), what, ndm_last_error());
        failures++;
    } else {
        for (int64_t i = 0; i < n; i++) {
            double w = want(dt, i, ctx);
            /* a mean may not be exact in the dtype: within its rounding */
            double tol = dt == NDM_F16    ? 1e-3
                         : dt == NDM_BF16 ? 1e-2
                         : dt == NDM_F32  ? 1e-6
                                          : 1e-12;
            if (!(fabs(v[i] - w) <= (ndm_dtype_is_float(dt) ? tol * fmax(1, fabs(w)) : 0))) {
                printf("FAIL %s %s: element %lld is %g, want %g\n", ndm_dtype_name(dt), what,
                       (long long)i, v[i], w);
                failures++;
                break;
            }
        }
    }
    free(v);
    if (d.id)
        (void)!ndm_array_release(d);
}

static double want_reduced(ndm_dtype dt, int64_t i, void *op)
{
    return dist_reference(dt, *(ndm_dist_op *)op, i, S);
}
static double want_root(ndm_dtype dt, int64_t i, void *root)
{
    return dist_value(dt, *(int *)root, i);
}
static double want_gathered(ndm_dtype dt, int64_t i, void *n)
{
    int64_t per = *(int64_t *)n;
    return dist_value(dt, (int)(i / per), i % per);
}
static double want_part(ndm_dtype dt, int64_t i, void *op)
{
    return dist_reference(dt, *(ndm_dist_op *)op, (int64_t)R * 1000 + i, S);
}

static ndm_status run(ndm_manager gpu)
{
    static const ndm_dtype dtypes[] = {NDM_BOOL, NDM_U8, NDM_I32, NDM_I64,
                                       NDM_F16,  NDM_BF16, NDM_F32, NDM_F64};
    static const ndm_dist_op ops[] = {NDM_DIST_SUM, NDM_DIST_MEAN, NDM_DIST_MAX};
    static const char *op_names[] = {"sum", "mean", "max"};
    const int64_t n = 1000;
    for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++) {
        ndm_dtype dt = dtypes[t];
        int before = failures;
        for (int o = 0; o < 3; o++) {
            if (dt == NDM_BOOL && ops[o] == NDM_DIST_MEAN)
                continue;
            char what[64];
            snprintf(what, sizeof what, "all-reduce %s", op_names[o]);
            ndm_array a = filled(gpu, dt, R, n);
            ndm_status st = a.id ? ndm_all_reduce_(a, ops[o]) : ndm_last_status();
            check(what, dt, st == NDM_OK ? a : NDM_NULL_ARRAY, want_reduced, (void *)&ops[o]);
            if (a.id)
                (void)!ndm_array_release(a);
            snprintf(what, sizeof what, "reduce-scatter %s", op_names[o]);
            ndm_array whole = filled(gpu, dt, R, n * S);
            ndm_array part = whole.id ? ndm_reduce_scatter_to(gpu, whole, ops[o]) : NDM_NULL_ARRAY;
            check(what, dt, part, want_part, (void *)&ops[o]);
            if (part.id)
                (void)!ndm_array_release(part);
            if (whole.id)
                (void)!ndm_array_release(whole);
        }
        int root = S - 1;
        ndm_array b = filled(gpu, dt, R, n);
        ndm_status st = b.id ? ndm_broadcast_(b, root) : ndm_last_status();
        check("broadcast", dt, st == NDM_OK ? b : NDM_NULL_ARRAY, want_root, &root);
        if (b.id)
            (void)!ndm_array_release(b);
        ndm_array a = filled(gpu, dt, R, n);
        ndm_array g = a.id ? ndm_all_gather_to(gpu, a) : NDM_NULL_ARRAY;
        check("all-gather", dt, g, want_gathered, (void *)&n);
        if (g.id)
            (void)!ndm_array_release(g);
        if (a.id)
            (void)!ndm_array_release(a);
        if (R == 0)
            printf("%-8s all-reduce sum/mean/max, reduce-scatter, broadcast, all-gather: %s\n",
                   ndm_dtype_name(dt), failures == before ? "ok" : "FAILED");
    }
    return ndm_device_synchronize(NDM_CUDA(0));
}

/* ---- data-parallel steps ------------------------------------------------------------ */

#define DDP_IN 24
#define DDP_HID 48
#define DDP_OUT 10
#define DDP_BATCH 32
#define DDP_STEPS 5

/* The same small MLP every time (a fixed seed), on the GPU model manager m. */
static ndm_module ddp_mlp(ndm_manager m)
{
    ndm_rng rng = ndm_rng_new(7);
    return ndm_sequential(m, NDM_MODULES(ndm_linear(m, DDP_IN, DDP_HID, true, &rng),
                                         ndm_relu_module(m),
                                         ndm_linear(m, DDP_HID, DDP_OUT, true, &rng)));
}

/* Step `step`'s batch, the same on every rank, in batch (on the GPU). */
static ndm_status ddp_batch(ndm_manager batch, int step, ndm_array *x, ndm_array *y)
{
    ndm_rng rng = ndm_rng_new(100 + (uint64_t)step);
    *x = ndm_normal(batch, &rng, NDM_F32, 0.0, 1.0, 2, (int64_t[]){DDP_BATCH, DDP_IN});
    *y = ndm_randint(batch, &rng, NDM_I64, 0, DDP_OUT, 1, (int64_t[]){DDP_BATCH});
    return x->id && y->id ? NDM_OK : ndm_last_status();
}

/* Train a fresh MLP for DDP_STEPS steps, under ndm_ddp or not; its losses
 * into loss[] and its first layer's weight into w (DDP_HID * DDP_IN). */
static ndm_status ddp_train(ndm_manager gpu, bool wrapped, double *loss, float *w)
{
    ndm_manager model = ndm_manager_new(gpu, "model");
    ndm_module net = model.id ? ddp_mlp(model) : (ndm_module){0};
    ndm_optimizer opt = net.id ? ndm_sgd(model, net, 0.1, 0.9, 0.0) : (ndm_optimizer){0};
    ndm_ddp d = {0};
    ndm_status st = opt.id ? NDM_OK : ndm_last_status();
    if (st == NDM_OK && wrapped) {
        /* small buckets: several all-reduces queued while backward runs */
        d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 4096});
        st = d.id ? NDM_OK : ndm_last_status();
    }
    if (st == NDM_OK)
        st = ndm_manager_cap(model, NDM_CAP_ARRAYS);
    for (int step = 0; step < DDP_STEPS && st == NDM_OK; step++) {
        ndm_manager batch = ndm_manager_new(gpu, "batch");
        ndm_array x, y;
        st = batch.id ? ddp_batch(batch, step, &x, &y) : ndm_last_status();
        if (st == NDM_OK)
            st = ndm_grad_begin(batch);
        ndm_array l = st == NDM_OK ? ndm_cross_entropy(ndm_forward(net, x), y) : NDM_NULL_ARRAY;
        if (st == NDM_OK && wrapped) {
            st = ndm_ddp_backward(d, l);
            (void)ndm_grad_end();
            ndm_status s2 = ndm_ddp_step(d);
            st = st < 0 ? st : s2;
        } else if (st == NDM_OK) {
            st = l.id ? ndm_backward(l) : ndm_last_status();
            (void)ndm_grad_end();
            if (st == NDM_OK)
                st = ndm_optimizer_step(opt);
            if (st == NDM_OK)
                st = ndm_optimizer_zero_grad(opt);
        }
        if (st == NDM_OK)
            st = ndm_item(l, &loss[step]);
        if (batch.id)
            (void)!ndm_manager_close(batch);
    }
    ndm_array p;
    if (st == NDM_OK && ndm_module_parameters(net, &p, 1) < 1)
        st = ndm_last_status();
    if (st == NDM_OK)
        st = ndm_array_copy_out(p, w, sizeof(float) * DDP_HID * DDP_IN) == NDM_OK
                 ? NDM_OK
                 : ndm_last_status();
    if (d.id)
        (void)!ndm_ddp_close(d);
    if (model.id)
        (void)!ndm_manager_close(model);
    return st;
}

/* Every rank trains on the same batches, so the ranks' mean gradient is the
 * one process's: at one rank (and any power of two, where 1/size is exact)
 * the two runs must agree bit for bit; otherwise to a relative 1e-5. */
static void run_ddp(ndm_manager gpu)
{
    double lw[DDP_STEPS], lp[DDP_STEPS];
    float ww[DDP_HID * DDP_IN], wp[DDP_HID * DDP_IN];
    ndm_status st = ddp_train(gpu, true, lw, ww);
    if (st == NDM_OK)
        st = ddp_train(gpu, false, lp, wp);
    if (st != NDM_OK) {
        printf("FAIL ddp: %s\n", ndm_last_error());
        failures++;
        return;
    }
    bool exact = (S & (S - 1)) == 0;
    double tol = exact ? 0 : 1e-5, worst = 0;
    int before = failures;
    for (int i = 0; i < DDP_STEPS; i++) {
        double e = fabs(lw[i] - lp[i]) / fmax(1, fabs(lp[i]));
        worst = e > worst ? e : worst;
        if (!(e <= tol)) {
            printf("FAIL ddp step %d: loss %.9g under ndm_ddp, %.9g without\n", i, lw[i], lp[i]);
            failures++;
        }
    }
    for (int i = 0; i < DDP_HID * DDP_IN; i++) {
        double e = fabs((double)ww[i] - wp[i]) / fmax(1, fabs((double)wp[i]));
        worst = e > worst ? e : worst;
        if (!(e <= tol)) {
            printf("FAIL ddp weight %d: %.9g under ndm_ddp, %.9g without\n", i, ww[i], wp[i]);
            failures++;
            break;
        }
    }
    if (R == 0)
        printf("ddp      %d steps of an MLP against the same steps without it "
               "(tolerance %g, worst %.3g): %s\n",
               DDP_STEPS, tol, worst, failures == before ? "ok" : "FAILED");
}

int main(void)
{
    if (ndm_dist_init() != NDM_OK) {
        fprintf(stderr, "ndm_dist_init: %s\n", ndm_last_error());
        return 1;
    }
    R = ndm_dist_rank();
    S = ndm_dist_size();
    int ndev = ndm_cuda_device_count();
    if (ndev < 1) {
        fprintf(stderr, "rank %d: no CUDA device\n", R);
        return 1;
    }
    ndm_manager gpu = ndm_manager_new_on(ndm_system(), "gpu", NDM_CUDA(0));
    if (!gpu.id) {
        fprintf(stderr, "rank %d: %s\n", R, ndm_last_error());
        return 1;
    }
    if (R == 0)
        printf("%d rank(s) on cuda:0 each\n", S);
    ndm_status st = run(gpu);
    if (st == NDM_OK)
        run_ddp(gpu);
    if (st != NDM_OK) {
        printf("FAIL synchronize: %s\n", ndm_last_error());
        failures++;
    }
    ndm_stats stats;
    if (ndm_manager_stats(gpu, NDM_CUDA(0), NDM_STATS_SUBTREE, &stats) != NDM_OK ||
        stats.live_arrays) {
        printf("FAIL the GPU manager still holds arrays\n");
        failures++;
    }
    (void)!ndm_manager_close(gpu);
    /* every rank learns whether any failed */
    ndm_status mine = failures ? NDM_E_INVALID : NDM_OK;
    st = ndm_dist_check(mine);
    if (ndm_dist_finalize() != NDM_OK || st != NDM_OK) {
        if (!failures)
            printf("FAIL rank %d: another rank failed or finalize failed: %s\n", R,
                   ndm_last_error());
        return 1;
    }
    if (R == 0)
        printf("ok\n");
    return 0;
}
