/* The process group under mpirun (2 or 3 ranks): collectives against a
 * single-process reference for every dtype, agreement errors on every
 * rank, a failing rank ending the step everywhere, job-wide reports,
 * sharding and data-parallel training against one process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist_values.h"
#include "helpers.h"
#include "ndm/dist.h"

static int R, S; /* this rank, the group size */

/* ---- data ------------------------------------------------------------------------------- */

static const ndm_dtype all_dtypes[] = {NDM_BOOL, NDM_U8, NDM_I32, NDM_I64,
                                       NDM_F16,  NDM_BF16, NDM_F32, NDM_F64};

static ndm_array filled(ndm_manager m, ndm_dtype dt, int r, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int k = 0; k < ndim; k++)
        n *= shape[k];
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = dist_value(dt, r, i);
    ndm_array d = ndm_from_buffer(m, NDM_F64, v, ndim, shape);
    free(v);
    assert_live(d);
    ndm_array a = ndm_astype(d, dt);
    assert_live(a);
    assert_ok(ndm_array_release(d));
    return a;
}

/* The elements of a as doubles (the caller frees). */
static double *values(ndm_array a)
{
    ndm_array d = ndm_astype(a, NDM_F64);
    assert_live(d);
    int64_t n = ndm_array_size(d);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_ok(ndm_array_copy_out(d, v, (size_t)n * sizeof *v));
    assert_ok(ndm_array_release(d));
    return v;
}


static double tolerance(ndm_dtype dt)
{
    return dt == NDM_F16 ? 1e-3 : dt == NDM_BF16 ? 1e-2 : dt == NDM_F32 ? 1e-6 : 1e-12;
}

static const int64_t shapes[][3] = {{1, 1, 1}, {7, 1, 1}, {3, 5, 1}, {2, 3, 4}, {1000, 1, 1}};
static const int ranks_of[] = {1, 1, 2, 3, 1};

/* ---- the group ------------------------------------------------------------------------------ */

static void test_dist_group_reads_rank_size_and_local_rank(void **state)
{
    (void)state;
    assert_true(ndm_dist_available());
    assert_int_equal(ndm_dist_size(), atoi(getenv("OMPI_COMM_WORLD_SIZE")));
    assert_int_equal(ndm_dist_rank(), atoi(getenv("OMPI_COMM_WORLD_RANK")));
    assert_int_equal(ndm_dist_local_rank(), atoi(getenv("OMPI_COMM_WORLD_LOCAL_RANK")));
    assert_status(ndm_dist_init(), NDM_ALREADY);
    assert_ok(ndm_dist_barrier());
}

/* ---- collectives against the reference ---------------------------------------------------------- */

static void test_all_reduce_matches_the_reference_for_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    const ndm_dist_op ops[] = {NDM_DIST_SUM, NDM_DIST_MEAN, NDM_DIST_MAX};
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++)
        for (size_t o = 0; o < 3; o++) {
            ndm_dtype dt = all_dtypes[t];
            if (dt == NDM_BOOL && ops[o] == NDM_DIST_MEAN)
                continue;
            for (size_t s = 0; s < sizeof ranks_of / sizeof *ranks_of; s++) {
                ndm_array a = filled(m, dt, R, ranks_of[s], shapes[s]);
                assert_ok(ndm_all_reduce_(a, ops[o]));
                double *v = values(a);
                for (int64_t i = 0; i < ndm_array_size(a); i++) {
                    double want = dist_reference(dt, ops[o], i, S);
                    if (fabs(v[i] - want) > tolerance(dt) * fmax(1, fabs(want)))
                        fail_msg("%s op %d shape %zu element %lld: %g, want %g",
                                 ndm_dtype_name(dt), (int)ops[o], s, (long long)i, v[i], want);
                }
                free(v);
                assert_ok(ndm_array_release(a));
            }
        }
}

static void test_all_reduce_stages_a_strided_view(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, NDM_F32, R, 2, (int64_t[]){3, 4});
    ndm_array t = ndm_transpose(a);
    assert_live(t);
    assert_false(ndm_array_is_contiguous(t));
    assert_ok(ndm_all_reduce_(t, NDM_DIST_SUM));
    double *v = values(a);
    for (int64_t i = 0; i < 12; i++)
        assert_true(v[i] == dist_reference(NDM_F32, NDM_DIST_SUM, i, S));
    free(v);
    assert_ok(ndm_array_release(t));
    assert_ok(ndm_array_release(a));
}

static void test_broadcast_copies_the_root_for_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    int root = S - 1;
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++)
        for (size_t s = 0; s < sizeof ranks_of / sizeof *ranks_of; s++) {
            ndm_array a = filled(m, all_dtypes[t], R, ranks_of[s], shapes[s]);
            assert_ok(ndm_broadcast_(a, root));
            double *v = values(a);
            for (int64_t i = 0; i < ndm_array_size(a); i++)
                assert_true(v[i] == dist_value(all_dtypes[t], root, i));
            free(v);
            assert_ok(ndm_array_release(a));
        }
}

static void test_all_gather_concatenates_in_rank_order(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager out = ndm_manager_new(m, "out");
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++) {
        ndm_array a = filled(m, all_dtypes[t], R, 2, (int64_t[]){2, 3});
        ndm_array g = ndm_all_gather_to(out, a);
        assert_live(g);
        assert_true(ndm_array_manager(g).id == out.id);
        assert_int_equal(ndm_array_dim(g, 0), 2 * S);
        assert_int_equal(ndm_array_dim(g, 1), 3);
        double *v = values(g);
        for (int r = 0; r < S; r++)
            for (int64_t i = 0; i < 6; i++)
                assert_true(v[r * 6 + i] == dist_value(all_dtypes[t], r, i));
        free(v);
        assert_ok(ndm_array_release(g));
        assert_ok(ndm_array_release(a));
    }
    assert_ok(ndm_manager_close(out));
}

static void test_reduce_scatter_gives_each_rank_its_part(void **state)
{
    ndm_manager m = ROOT(state);
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++) {
        ndm_dtype dt = all_dtypes[t];
        ndm_array a = filled(m, dt, R, 2, (int64_t[]){2 * S, 3});
        ndm_array p = ndm_reduce_scatter_to(m, a, NDM_DIST_SUM);
        assert_live(p);
        assert_int_equal(ndm_array_dim(p, 0), 2);
        double *v = values(p);
        for (int64_t i = 0; i < 6; i++)
            assert_true(v[i] == dist_reference(dt, NDM_DIST_SUM, R * 6 + i, S));
        free(v);
        assert_ok(ndm_array_release(p));
        assert_ok(ndm_array_release(a));
    }
    /* a first axis the ranks cannot share: every rank fails alike */
    ndm_array odd = filled(m, NDM_F32, R, 1, (int64_t[]){2 * S + 1});
    ndm_clear_error();
    assert_false(ndm_reduce_scatter_to(m, odd, NDM_DIST_SUM).id);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_error_has("rank 0: ");
    assert_error_has("not divisible");
    assert_ok(ndm_array_release(odd));
}

/* ---- agreement ------------------------------------------------------------------------------- */

/* The last rank's array has `theirs` for shape, the others `mine`: every
 * rank fails with a message holding `want`, its array unchanged. */
static void shape_mismatch(void **state, int ndim, const int64_t *mine, const int64_t *theirs,
                           const char *want)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, NDM_F32, R, ndim, R == S - 1 ? theirs : mine);
    ndm_clear_error();
    assert_status(ndm_all_reduce_(a, NDM_DIST_SUM), NDM_E_SHAPE);
    assert_error_has(want);
    double *v = values(a);
    for (int64_t i = 0; i < 6; i++)
        assert_true(v[i] == dist_value(NDM_F32, R, i));
    free(v);
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_dist_barrier());
}

static void test_collective_shape_mismatch_fails_on_every_rank(void **state)
{
    char want[128];
    snprintf(want, sizeof want, "rank 0 has float32 [2, 3] and rank %d has float32 [3, 2]", S - 1);
    shape_mismatch(state, 2, (int64_t[]){2, 3}, (int64_t[]){3, 2}, want);
}

/* The agreement record holds eight dimensions; the rest still count. */
static void test_collective_shape_mismatch_past_eight_dims_fails_on_every_rank(void **state)
{
    char want[160];
    snprintf(want, sizeof want, "and rank %d has float32 [1, 1, 1, 1, 1, 1, 1, 1, ...", S - 1);
    shape_mismatch(state, 10, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 2, 3},
                   (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 3, 2}, want);
}

static void test_collective_dtype_mismatch_fails_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, R == S - 1 ? NDM_F64 : NDM_F32, R, 1, (int64_t[]){4});
    ndm_clear_error();
    assert_status(ndm_broadcast_(a, 0), NDM_E_DTYPE);
    char want[128];
    snprintf(want, sizeof want, "rank 0 has float32 [4] and rank %d has float64 [4]", S - 1);
    assert_error_has(want);
    assert_ok(ndm_array_release(a));
}

static void test_collective_other_operation_fails_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, NDM_F32, R, 1, (int64_t[]){4});
    ndm_clear_error();
    ndm_status st = R == 0 ? ndm_all_reduce_(a, NDM_DIST_SUM) : ndm_broadcast_(a, 0);
    assert_int_equal(st, NDM_E_INVALID);
    assert_error_has("rank 0 calls ndm_all_reduce_ and rank 1 calls ndm_broadcast_");
    assert_ok(ndm_array_release(a));
}

static void test_failing_rank_fails_the_collective_with_its_message(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, NDM_F32, R, 1, (int64_t[]){4});
    ndm_array gone = filled(m, NDM_F32, R, 1, (int64_t[]){4});
    assert_ok(ndm_array_release(gone));
    ndm_clear_error();
    /* the last rank passes a released array: every rank fails with its error */
    ndm_status st = ndm_all_reduce_(R == S - 1 ? gone : a, NDM_DIST_MAX);
    assert_int_equal(st, NDM_E_CLOSED);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", S - 1);
    assert_error_has(want);
    assert_error_has("released");
    double *v = values(a);
    assert_true(v[1] == dist_value(NDM_F32, R, 1));
    free(v);
    /* ndm_dist_check carries a status the same way */
    ndm_clear_error();
    ndm_status local = NDM_OK;
    if (R == 1)
        local = ndm_manager_close(ndm_system()); /* a genuine error on one rank */
    assert_int_equal(ndm_dist_check(local), NDM_E_ROOT);
    assert_error_has("rank 1: ");
    assert_ok(ndm_dist_barrier());
    assert_ok(ndm_array_release(a));
}

static void test_collective_bad_arguments_fail_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = filled(m, NDM_BOOL, R, 1, (int64_t[]){4});
    ndm_clear_error();
    assert_status(ndm_all_reduce_(a, NDM_DIST_MEAN), NDM_E_DTYPE);
    assert_status(ndm_all_reduce_(a, (ndm_dist_op)7), NDM_E_INVALID);
    assert_status(ndm_broadcast_(a, S), NDM_E_INVALID);
    assert_status(ndm_broadcast_(a, -1), NDM_E_INVALID);
    assert_status(ndm_dist_set_timeout(0), NDM_E_INVALID);
    assert_ok(ndm_dist_barrier());
    assert_ok(ndm_array_release(a));
}

/* ---- CUDA arrays over NCCL ------------------------------------------------------------------
 *
 * The suite runs with host execution's CUDA module, whose NCCL stand-in
 * moves device memory (host memory there) between the ranks through shared
 * memory: every result is checked against the CPU path's (MPI) on the same
 * data, element for element. */

/* A manager on cuda:0 under m, or the null handle when this run has no CUDA
 * device: every rank has the module or none has, so all skip alike. */
static ndm_manager gpu_manager(ndm_manager m)
{
    ndm_manager gpu = ndm_manager_new_on(m, "gpu", NDM_CUDA(0));
    ndm_array probe = gpu.id ? ndm_zeros(gpu, NDM_F32, 1, (int64_t[]){1}) : NDM_NULL_ARRAY;
    if (!probe.id) {
        if (gpu.id)
            (void)!ndm_manager_close(gpu);
        return (ndm_manager){0};
    }
    assert_ok(ndm_array_release(probe));
    return gpu;
}

/* A copy of the CPU array c on cuda:0, in gpu. */
static ndm_array on_gpu(ndm_manager gpu, ndm_array c)
{
    ndm_array g = ndm_to_to(gpu, c, NDM_CUDA(0));
    assert_live(g);
    assert_int_equal(ndm_array_device(g).type, NDM_DEVICE_CUDA);
    return g;
}

/* The CUDA array g holds what the CPU array c holds, exactly. */
static void assert_same_values(ndm_array g, ndm_array c, const char *what)
{
    assert_int_equal(ndm_array_device(g).type, NDM_DEVICE_CUDA);
    assert_int_equal(ndm_array_dtype(g), ndm_array_dtype(c));
    assert_int_equal(ndm_array_size(g), ndm_array_size(c));
    double *vg = values(g), *vc = values(c);
    for (int64_t i = 0; i < ndm_array_size(c); i++)
        if (!(vg[i] == vc[i]))
            fail_msg("%s %s element %lld: cuda %g, cpu %g", what,
                     ndm_dtype_name(ndm_array_dtype(c)), (long long)i, vg[i], vc[i]);
    free(vg);
    free(vc);
}

/* Close gpu, asserting that it held nothing on the device. */
static void close_gpu(ndm_manager gpu)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(gpu, NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(gpu));
}

#define GPU_OR_SKIP(gpu, m)                                                     \
    ndm_manager gpu = gpu_manager(m);                                           \
    if (!gpu.id)                                                                \
    skip()

static void test_cuda_all_reduce_matches_the_cpu_path_for_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    const ndm_dist_op ops[] = {NDM_DIST_SUM, NDM_DIST_MEAN, NDM_DIST_MAX};
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++)
        for (size_t o = 0; o < 3; o++) {
            ndm_dtype dt = all_dtypes[t];
            if (dt == NDM_BOOL && ops[o] == NDM_DIST_MEAN)
                continue;
            for (size_t s = 0; s < sizeof ranks_of / sizeof *ranks_of; s++) {
                ndm_array c = filled(m, dt, R, ranks_of[s], shapes[s]);
                ndm_array g = on_gpu(gpu, c);
                assert_ok(ndm_all_reduce_(c, ops[o]));
                assert_ok(ndm_all_reduce_(g, ops[o]));
                assert_same_values(g, c, "all-reduce");
                assert_ok(ndm_array_release(g));
                assert_ok(ndm_array_release(c));
            }
        }
    close_gpu(gpu);
}

/* The bool rule of the CPU path: sum and max are both "any", and every
 * byte stays a bool's 0 or 1 (a sum of bytes would give 2, or wrap). */
static void test_cuda_all_reduce_of_bools_is_any(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    for (int o = 0; o < 2; o++) {
        /* true on every rank at 0 (and where the pattern says) */
        ndm_array c = filled(m, NDM_BOOL, 0, 1, (int64_t[]){9});
        ndm_array g = on_gpu(gpu, c);
        assert_ok(ndm_all_reduce_(g, o ? NDM_DIST_MAX : NDM_DIST_SUM));
        uint8_t bytes[9];
        assert_ok(ndm_array_copy_out(g, bytes, sizeof bytes));
        for (int64_t i = 0; i < 9; i++)
            assert_int_equal(bytes[i], dist_value(NDM_BOOL, 0, i) != 0);
        assert_ok(ndm_array_release(g));
        assert_ok(ndm_array_release(c));
        c = filled(m, NDM_BOOL, R, 1, (int64_t[]){9});
        g = on_gpu(gpu, c);
        assert_ok(ndm_all_reduce_(g, o ? NDM_DIST_MAX : NDM_DIST_SUM));
        assert_ok(ndm_array_copy_out(g, bytes, sizeof bytes));
        for (int64_t i = 0; i < 9; i++) {
            bool any = false;
            for (int r = 0; r < S; r++)
                any |= dist_value(NDM_BOOL, r, i) != 0;
            assert_int_equal(bytes[i], any);
        }
        assert_ok(ndm_array_release(g));
        assert_ok(ndm_array_release(c));
    }
    close_gpu(gpu);
}

static void test_cuda_broadcast_copies_the_root_for_every_dtype(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    for (int root = 0; root < S; root += S - 1) {
        for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++)
            for (size_t s = 0; s < sizeof ranks_of / sizeof *ranks_of; s++) {
                ndm_array c = filled(m, all_dtypes[t], R, ranks_of[s], shapes[s]);
                ndm_array g = on_gpu(gpu, c);
                assert_ok(ndm_broadcast_(c, root));
                assert_ok(ndm_broadcast_(g, root));
                assert_same_values(g, c, "broadcast");
                assert_ok(ndm_array_release(g));
                assert_ok(ndm_array_release(c));
            }
        if (S == 1)
            break;
    }
    close_gpu(gpu);
}

static void test_cuda_all_gather_and_reduce_scatter_match_the_cpu_path(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager out = ndm_manager_new(m, "out");
    const int64_t shapes2[][2] = {{S, 1}, {2 * S, 3}, {S * 7, 5}};
    const ndm_dist_op ops[] = {NDM_DIST_SUM, NDM_DIST_MEAN, NDM_DIST_MAX};
    for (size_t t = 0; t < sizeof all_dtypes / sizeof *all_dtypes; t++)
        for (size_t s = 0; s < 3; s++) {
            ndm_dtype dt = all_dtypes[t];
            ndm_array c = filled(m, dt, R, 2, shapes2[s]);
            ndm_array g = on_gpu(gpu, c);
            /* into a CPU manager: the result stays on the input's device */
            ndm_array gc = ndm_all_gather_to(out, c), gg = ndm_all_gather_to(out, g);
            assert_live(gg);
            assert_true(ndm_array_manager(gg).id == out.id);
            assert_int_equal(ndm_array_dim(gg, 0), shapes2[s][0] * S);
            assert_same_values(gg, gc, "all-gather");
            assert_ok(ndm_array_release(gg));
            assert_ok(ndm_array_release(gc));
            for (size_t o = 0; o < 3; o++) {
                if (dt == NDM_BOOL && ops[o] == NDM_DIST_MEAN)
                    continue;
                ndm_array pc = ndm_reduce_scatter_to(gpu, c, ops[o]);
                ndm_array pg = ndm_reduce_scatter_to(gpu, g, ops[o]);
                assert_live(pg);
                assert_int_equal(ndm_array_dim(pg, 0), shapes2[s][0] / S);
                assert_same_values(pg, pc, "reduce-scatter");
                assert_ok(ndm_array_release(pg));
                assert_ok(ndm_array_release(pc));
            }
            assert_ok(ndm_array_release(g));
            assert_ok(ndm_array_release(c));
        }
    assert_ok(ndm_manager_close(out));
    close_gpu(gpu);
}

/* Buffers larger than the stand-in's 1 MiB slot per rank go through in
 * pieces; a reduce-scatter's piece boundaries fall inside rank blocks. */
static void test_cuda_collectives_of_large_buffers_match_the_cpu_path(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    int64_t n = 300001;
    ndm_array c = filled(m, NDM_F64, R, 1, &n);
    ndm_array g = on_gpu(gpu, c);
    assert_ok(ndm_all_reduce_(c, NDM_DIST_MEAN));
    assert_ok(ndm_all_reduce_(g, NDM_DIST_MEAN));
    assert_same_values(g, c, "all-reduce");
    ndm_array gc = ndm_all_gather_to(m, c), gg = ndm_all_gather_to(gpu, g);
    assert_same_values(gg, gc, "all-gather");
    assert_ok(ndm_array_release(gg));
    assert_ok(ndm_array_release(gc));
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    int64_t per = 200003 * S;
    c = filled(m, NDM_F32, R, 1, &per);
    g = on_gpu(gpu, c);
    ndm_array pc = ndm_reduce_scatter_to(m, c, NDM_DIST_SUM);
    ndm_array pg = ndm_reduce_scatter_to(gpu, g, NDM_DIST_SUM);
    assert_same_values(pg, pc, "reduce-scatter");
    assert_ok(ndm_array_release(pg));
    assert_ok(ndm_array_release(pc));
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    close_gpu(gpu);
}

static void test_cuda_all_reduce_stages_a_strided_view(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_array c = filled(m, NDM_F32, R, 2, (int64_t[]){3, 4});
    ndm_array g = on_gpu(gpu, c);
    ndm_array t = ndm_transpose(g);
    assert_live(t);
    assert_false(ndm_array_is_contiguous(t));
    assert_ok(ndm_all_reduce_(t, NDM_DIST_SUM));
    double *v = values(g);
    for (int64_t i = 0; i < 12; i++)
        assert_true(v[i] == dist_reference(NDM_F32, NDM_DIST_SUM, i, S));
    free(v);
    assert_ok(ndm_array_release(t));
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    close_gpu(gpu);
}

/* The last rank's CUDA array differs in dtype, then in shape: every rank
 * fails before anything moves, every array unchanged. */
static void test_cuda_collective_mismatch_fails_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    bool odd = R == S - 1;
    ndm_array c = filled(m, odd ? NDM_F64 : NDM_F32, R, 1, (int64_t[]){4});
    ndm_array g = on_gpu(gpu, c);
    ndm_clear_error();
    assert_status(ndm_all_reduce_(g, NDM_DIST_SUM), NDM_E_DTYPE);
    char want[128];
    snprintf(want, sizeof want, "rank 0 has float32 [4] and rank %d has float64 [4]", S - 1);
    assert_error_has(want);
    assert_same_values(g, c, "unchanged");
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    c = filled(m, NDM_F32, R, 2, odd ? (int64_t[]){3, 2} : (int64_t[]){2, 3});
    g = on_gpu(gpu, c);
    ndm_clear_error();
    assert_false(ndm_all_gather_to(gpu, g).id);
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    snprintf(want, sizeof want, "rank 0 has float32 [2, 3] and rank %d has float32 [3, 2]", S - 1);
    assert_error_has(want);
    assert_same_values(g, c, "unchanged");
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    /* and the group goes on */
    c = filled(m, NDM_I32, R, 1, (int64_t[]){5});
    g = on_gpu(gpu, c);
    assert_ok(ndm_all_reduce_(c, NDM_DIST_SUM));
    assert_ok(ndm_all_reduce_(g, NDM_DIST_SUM));
    assert_same_values(g, c, "after the mismatch");
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    close_gpu(gpu);
}

/* Rank 0 passes a CUDA array, the others CPU arrays: every rank fails. */
static void test_cuda_and_cpu_arrays_mixed_fail_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_array c = filled(m, NDM_F32, R, 1, (int64_t[]){6});
    ndm_array g = on_gpu(gpu, c);
    ndm_array mine = R == 0 ? g : c;
    ndm_clear_error();
    assert_status(ndm_all_reduce_(mine, NDM_DIST_MAX), NDM_E_DEVICE);
    assert_error_has("rank 0's array is on cuda:0 and rank 1's on cpu:0");
    ndm_clear_error();
    assert_status(ndm_broadcast_(mine, 0), NDM_E_DEVICE);
    ndm_clear_error();
    assert_false(ndm_reduce_scatter_to(m, R == 0 ? g : c, NDM_DIST_SUM).id);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_same_values(g, c, "unchanged");
    assert_ok(ndm_array_release(g));
    assert_ok(ndm_array_release(c));
    close_gpu(gpu);
    assert_ok(ndm_dist_barrier());
}

/* ---- reports ---------------------------------------------------------------------------------- */

static void test_dist_reports_gather_every_rank_with_its_prefix(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager leaky = ndm_manager_new(m, "leaky");
    ndm_array a = ndm_zeros(leaky, NDM_F32, 1, (int64_t[]){R == S - 1 ? 100 : 1});
    assert_live(a);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(ndm_dist_debug_dump(m, f));
    int64_t live = ndm_dist_leak_report(f);
    fclose(f);
    assert_int_equal(live, S); /* one array per rank */
    if (R == 0) {
        for (int r = 0; r < S; r++) {
            char want[64];
            snprintf(want, sizeof want, "ndm dump: rank%d/system/test", r);
            if (!strstr(buf, want))
                fail_msg("no \"%s\" in:\n%s", want, buf);
            snprintf(want, sizeof want, "manager rank%d/system/test/leaky", r);
            if (!strstr(buf, want))
                fail_msg("no \"%s\" in:\n%s", want, buf);
        }
        char want[64];
        snprintf(want, sizeof want, "400 bytes, created at");
        assert_non_null(strstr(buf, want)); /* the last rank's larger array */
    } else {
        assert_int_equal(len, 0);
    }
    free(buf);
    assert_ok(ndm_manager_close(leaky));
}

/* ---- sharding --------------------------------------------------------------------------------- */

static void check_epoch_shards(ndm_manager m, int64_t n, int64_t batch, unsigned flags)
{
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_manager trainer = ndm_manager_new(m, "trainer");
    ndm_dataset ds = {ndm_arange(data, NDM_I64, 0, (double)n, 1), NDM_NULL_ARRAY};
    assert_live(ds.inputs);
    ndm_loader ld = ndm_dist_loader_new(trainer, ds, &(ndm_loader_options){
        .batch_size = batch, .seed = 7, .flags = flags | NDM_LOADER_SHUFFLE});
    assert_true(ndm_loader_valid(ld));
    for (int epoch = 0; epoch < 2; epoch++) {
        /* what this rank saw, as counts per example, summed over ranks */
        ndm_array seen = ndm_zeros(m, NDM_I64, 1, (int64_t[]){n});
        int64_t *cnt = ndm_array_data(seen);
        int64_t batches = 0;
        ndm_batch b;
        int rc;
        while ((rc = ndm_loader_next(ld, &b)) > 0) {
            int64_t *x = ndm_array_data(b.inputs);
            for (int64_t i = 0; i < b.size; i++)
                cnt[x[i]]++;
            batches++;
        }
        assert_int_equal(rc, 0);
        ndm_array nb = ndm_full(m, NDM_I64, (double)batches, 1, (int64_t[]){1});
        ndm_array nbmax = ndm_alias(nb);
        assert_ok(ndm_all_reduce_(nb, NDM_DIST_SUM));
        assert_ok(ndm_all_reduce_(nbmax, NDM_DIST_MAX));
        int64_t total_batches;
        assert_ok(ndm_item_i64(nb, &total_batches));
        assert_int_equal(total_batches, batches * S); /* the same count on every rank */
        assert_ok(ndm_all_reduce_(seen, NDM_DIST_SUM));
        int64_t global = batch * S, kept = (flags & NDM_LOADER_DROP_LAST) ? n / global * global : n;
        int64_t once = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_true(cnt[i] <= 1);
            once += cnt[i];
        }
        assert_int_equal(once, kept);
        assert_ok(ndm_array_release(nbmax));
        assert_ok(ndm_array_release(nb));
        assert_ok(ndm_array_release(seen));
    }
    assert_ok(ndm_manager_close(trainer));
    assert_ok(ndm_manager_close(data));
}

static void test_loader_shards_every_example_once_per_epoch(void **state)
{
    /* uneven: 10 examples over S ranks in batches of 2 */
    check_epoch_shards(ROOT(state), 10, 2, 0);
    check_epoch_shards(ROOT(state), 10, 2, NDM_LOADER_DROP_LAST);
    check_epoch_shards(ROOT(state), 1000, 64, 0);
}

/* ---- data-parallel training --------------------------------------------------------------------- */

#define IN 20
#define HID 32
#define CLASSES 10
#define B 64
#define STEPS 50

static ndm_module mlp(ndm_manager model)
{
    ndm_rng rng = ndm_rng_new(3);
    ndm_module net = ndm_sequential(model, NDM_MODULES(ndm_linear(model, IN, HID, true, &rng),
                                                       ndm_relu_module(model),
                                                       ndm_linear(model, HID, CLASSES, true, &rng)));
    assert_true(net.id);
    return net;
}

/* A user module: head(gain * (h + fc(relu(h)))) with h = proj(x), its own
 * parameter `gain` beside its children (names "gain", "proj.weight", ...). */
static ndm_array residual_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)n, (void)ud;
    ndm_array h = ndm_forward(ndm_module_get_child(self, "proj"), in[0]);
    ndm_array r = ndm_forward(ndm_module_get_child(self, "fc"), ndm_relu(h));
    ndm_array g = ndm_mul(ndm_add(h, r), ndm_module_get_array(self, "gain"));
    return ndm_forward(ndm_module_get_child(self, "head"), g);
}

static ndm_module residual(ndm_manager model)
{
    static const ndm_module_type t = {.name = "Residual", .forward = residual_forward};
    ndm_rng rng = ndm_rng_new(3);
    ndm_module net = ndm_module_new(model, &t, NULL);
    assert_true(net.id);
    ndm_array gain = ndm_full(model, NDM_F32, 0.5, 1, (int64_t[]){HID});
    assert_ok(ndm_module_register_parameter(net, "gain", gain));
    assert_ok(ndm_module_register_child(net, "proj", ndm_linear(model, IN, HID, true, &rng)));
    assert_ok(ndm_module_register_child(net, "fc", ndm_linear(model, HID, HID, true, &rng)));
    assert_ok(ndm_module_register_child(net, "head", ndm_linear(model, HID, CLASSES, true, &rng)));
    return net;
}

static ndm_dataset synthetic(ndm_manager data, int64_t n)
{
    ndm_rng rng = ndm_rng_new(11);
    ndm_array x = ndm_normal(data, &rng, NDM_F32, 0.0, 1.0, 2, (int64_t[]){n, IN});
    ndm_array y = ndm_randint(data, &rng, NDM_I64, 0, CLASSES, 1, (int64_t[]){n});
    assert_live(x);
    assert_live(y);
    return (ndm_dataset){x, y};
}

/* One step of the single-process reference on its batch: the loss. */
static double reference_step(ndm_module net, ndm_optimizer opt, ndm_batch *b)
{
    assert_ok(ndm_grad_begin(b->manager));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, b->inputs), b->labels);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    (void)ndm_grad_end();
    double l;
    assert_ok(ndm_item(loss, &l));
    assert_ok(ndm_optimizer_step(opt));
    assert_ok(ndm_optimizer_zero_grad(opt));
    return l;
}

/* Every parameter of net holds rank 0's values, bit for bit. */
static void assert_parameters_agree(ndm_manager m, ndm_module net)
{
    ndm_array p[16];
    int np = ndm_module_parameters(net, p, 16);
    assert_true(np > 0 && np <= 16);
    for (int i = 0; i < np; i++) {
        /* copies in m: the model may be capped */
        ndm_array own = ndm_astype_to(m, p[i], NDM_F64), root = ndm_astype_to(m, p[i], NDM_F64);
        assert_live(own);
        assert_live(root);
        assert_ok(ndm_broadcast_(root, 0));
        double *mine = values(own), *theirs = values(root);
        for (int64_t k = 0; k < ndm_array_size(p[i]); k++)
            if (mine[k] != theirs[k])
                fail_msg("parameter %d element %lld: rank %d has %.9g, rank 0 %.9g", i,
                         (long long)k, R, mine[k], theirs[k]);
        free(mine);
        free(theirs);
        assert_ok(ndm_array_release(own));
        assert_ok(ndm_array_release(root));
    }
}

/* Data-parallel training of build()'s net on `dev` with per-rank batch
 * `batch` on ds against one process with batch batch * S on the same
 * device, for `steps` steps: the global batch's losses agree to a relative
 * 1e-4 (float32 sums in another order), and every rank ends with rank 0's
 * parameters. */
static void check_parity_on(ndm_manager m, ndm_device dev, ndm_module (*build)(ndm_manager),
                            ndm_dataset ds, int64_t batch, int steps, const char *what)
{
    /* the reference: one process, batch batch * S */
    ndm_manager rmodel = ndm_manager_new_on(m, "reference", dev);
    ndm_module rnet = build(rmodel);
    ndm_optimizer ropt = ndm_sgd(rmodel, rnet, 0.1, 0.9, 0.0);
    ndm_manager rtrainer = ndm_manager_new(rmodel, "trainer");
    ndm_loader rld = ndm_loader_new(rtrainer, ds, &(ndm_loader_options){
        .batch_size = batch * S, .seed = 5, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_DROP_LAST});
    /* data-parallel: this rank's shard, batch `batch` */
    ndm_manager model = ndm_manager_new_on(m, "model", dev);
    ndm_module net = build(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.9, 0.0);
    /* small buckets: several all-reduces in flight during backward */
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1024});
    assert_true(d.id);
    assert_true(ndm_ddp_buckets(d) >= 3);
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    ndm_loader ld = ndm_dist_loader_new(trainer, ds, &(ndm_loader_options){
        .batch_size = batch, .seed = 5, .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_DROP_LAST});
    assert_true(ndm_loader_valid(rld) && ndm_loader_valid(ld));
    assert_int_equal(ndm_loader_batches(ld), ndm_loader_batches(rld));
    /* the buckets are made: a capped model takes every step in place */
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    double worst = 0;
    for (int step = 0; step < steps; step++) {
        ndm_batch rb, b;
        if (ndm_loader_next(rld, &rb) == 0) {
            assert_int_equal(ndm_loader_next(rld, &rb), 1);
            assert_int_equal(ndm_loader_next(ld, &b), 0);
        }
        assert_int_equal(ndm_loader_next(ld, &b), 1);
        assert_int_equal(b.size, batch);
        assert_int_equal(ndm_array_device(b.inputs).type, dev.type);
        double want = reference_step(rnet, ropt, &rb);
        assert_ok(ndm_grad_begin(b.manager));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, b.inputs), b.labels);
        assert_live(loss);
        assert_ok(ndm_ddp_backward(d, loss));
        (void)ndm_grad_end();
        assert_ok(ndm_ddp_step(d));
        /* the global batch's loss: the mean of the ranks' (equal shards) */
        ndm_array l = ndm_alias(loss);
        assert_ok(ndm_all_reduce_(l, NDM_DIST_MEAN));
        double got;
        assert_ok(ndm_item(l, &got));
        assert_ok(ndm_array_release(l));
        double err = fabs(got - want) / fmax(1.0, fabs(want));
        worst = err > worst ? err : worst;
        if (err > 1e-4)
            fail_msg("%s, step %d: data-parallel loss %.9g, one process %.9g", what, step, got,
                     want);
    }
    if (R == 0)
        printf("%s: ddp vs one process over %d steps: worst relative loss difference %.3g\n", what,
               steps, worst);
    assert_parameters_agree(m, net);
    assert_ok(ndm_manager_close(trainer));
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_manager_close(rmodel));
}

static void check_parity(ndm_manager m, ndm_module (*build)(ndm_manager), ndm_dataset ds,
                         int64_t batch, int steps, const char *what)
{
    check_parity_on(m, NDM_CPU, build, ds, batch, steps, what);
}

static void test_ddp_matches_one_process_at_the_same_global_batch(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    check_parity(m, mlp, synthetic(data, (int64_t)B * S * 20 + 5), B, STEPS, "mlp");
    assert_ok(ndm_manager_close(data));
}

static void test_ddp_user_module_matches_one_process_at_the_same_global_batch(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    check_parity(m, residual, synthetic(data, (int64_t)B * S * 20 + 5), B, 20, "user module");
    assert_ok(ndm_manager_close(data));
}

/* A small convolutional net on 8x8 single-channel images. */
static ndm_module cnn(ndm_manager model)
{
    ndm_rng rng = ndm_rng_new(4);
    ndm_module net = ndm_sequential(
        model, NDM_MODULES(ndm_conv2d_module(model, 1, 4, 3, 3, true, &rng, NULL),
                           ndm_relu_module(model), ndm_flatten_module(model, 1),
                           ndm_linear(model, 4 * 6 * 6, CLASSES, true, &rng)));
    assert_true(net.id);
    return net;
}

static void test_ddp_cnn_matches_one_process_at_the_same_global_batch(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager data = ndm_manager_new(m, "data");
    int64_t n = (int64_t)16 * S * 10 + 3;
    ndm_rng rng = ndm_rng_new(12);
    ndm_array x = ndm_normal(data, &rng, NDM_F32, 0.0, 1.0, 4, (int64_t[]){n, 1, 8, 8});
    ndm_array y = ndm_randint(data, &rng, NDM_I64, 0, CLASSES, 1, (int64_t[]){n});
    assert_live(x);
    assert_live(y);
    check_parity(m, cnn, (ndm_dataset){x, y}, 16, 20, "cnn");
    assert_ok(ndm_manager_close(data));
}

static void test_ddp_failing_rank_ends_the_step_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, NULL);
    assert_true(d.id);
    assert_int_equal(ndm_ddp_buckets(d), 1); /* 25 MiB holds this net */
    ndm_array w;
    assert_int_equal(ndm_module_parameters(net, &w, 1), 4);
    double *before = values(w);
    ndm_manager batch = ndm_manager_new(m, "batch");
    for (int round = 0; round < 2; round++) {
        /* round 0: the last rank feeds a wrongly shaped input; round 1: all well */
        bool bad = round == 0 && R == S - 1;
        ndm_array x = ndm_zeros(batch, NDM_F32, 2, (int64_t[]){8, bad ? IN + 1 : IN});
        ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){8});
        ndm_clear_error();
        assert_ok(ndm_grad_begin(batch));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        assert_true(bad ? !loss.id : loss.id != 0);
        ndm_status st = ndm_ddp_backward(d, loss);
        (void)ndm_grad_end();
        assert_true(bad ? st < 0 : st == NDM_OK);
        st = ndm_ddp_step(d);
        if (round == 0) {
            assert_int_equal(st, NDM_E_SHAPE);
            char want[32];
            snprintf(want, sizeof want, "rank %d: ", S - 1);
            assert_error_has(want);
            double *after = values(w);
            assert_memory_equal(before, after, sizeof(double) * HID * IN); /* no rank stepped */
            free(after);
        } else {
            assert_ok(st);
        }
        assert_ok(ndm_manager_close(batch));
        batch = ndm_manager_new(m, "batch");
    }
    free(before);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* A second backward before the step, on one rank, is refused and does
 * nothing else: the first backward's buckets are out on every rank, every
 * rank steps on them, and the parameters still agree. */
static void test_ddp_backward_twice_is_refused_and_the_step_goes_on(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_true(d.id);
    ndm_array w;
    assert_int_equal(ndm_module_parameters(net, &w, 1), 4);
    double *before = values(w);
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = filled(batch, NDM_F32, R, 2, (int64_t[]){8, IN});
    ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){8});
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
    assert_ok(ndm_ddp_backward(d, loss));
    if (R == S - 1) {
        assert_int_equal(ndm_ddp_backward(d, loss), NDM_E_INVALID);
        assert_error_has("backward ran twice");
    }
    (void)ndm_grad_end();
    assert_ok(ndm_ddp_step(d));
    double *after = values(w);
    bool moved = false;
    for (int i = 0; i < HID * IN; i++)
        moved |= after[i] != before[i];
    assert_true(moved);
    assert_parameters_agree(m, net);
    free(before);
    free(after);
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* Buckets in flight on the communication thread, then a collective of
 * the caller's own: it waits for them, and every rank sees both in order. */
static void test_ddp_collective_between_backward_and_step_keeps_the_order(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_int_equal(ndm_ddp_buckets(d), 4);
    ndm_manager batch = ndm_manager_new(m, "batch");
    for (int step = 0; step < 3; step++) {
        ndm_array x = filled(batch, NDM_F32, R, 2, (int64_t[]){4, IN});
        ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){4});
        assert_ok(ndm_grad_begin(batch));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        assert_ok(ndm_ddp_backward(d, loss));
        (void)ndm_grad_end();
        ndm_array c = filled(batch, NDM_I64, R, 1, (int64_t[]){1000});
        assert_ok(ndm_all_reduce_(c, NDM_DIST_SUM));
        double *v = values(c);
        for (int64_t i = 0; i < 1000; i++)
            assert_true(v[i] == dist_reference(NDM_I64, NDM_DIST_SUM, i, S));
        free(v);
        assert_ok(ndm_ddp_step(d));
        /* the same parameters everywhere afterwards */
        ndm_array w;
        assert_int_equal(ndm_module_parameters(net, &w, 1), 4);
        ndm_array w0 = ndm_astype(w, NDM_F64);
        assert_ok(ndm_broadcast_(w0, 0));
        double *mine = values(w), *root = values(w0);
        assert_memory_equal(mine, root, sizeof(double) * HID * IN);
        free(mine);
        free(root);
        assert_ok(ndm_manager_close(batch));
        batch = ndm_manager_new(m, "batch");
    }
    assert_ok(ndm_manager_close(batch));
    assert_ok(ndm_manager_close(model));
}

/* model's dump names its "ddp" manager and holds `want`. */
static void assert_ddp_dump_has(ndm_manager model, const char *want)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(ndm_debug_dump(model, f));
    fclose(f);
    if (!strstr(buf, "ddp") || !strstr(buf, want))
        fail_msg("no ddp line with \"%s\" in:\n%s", want, buf);
    free(buf);
}

static void test_ddp_buckets_are_model_arrays_shown_in_dumps(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    /* one bucket per parameter when none fits */
    assert_int_equal(ndm_ddp_buckets(d), 4);
    /* 4 buckets of (gradients + 1 flag) floats, and the 4 gradients as
     * views of them: their storage counts once */
    char want[128];
    int64_t bytes = 4 * ((int64_t)HID * IN + HID + CLASSES * HID + CLASSES + 4);
    snprintf(want, sizeof want, "arrays 8 [new]  bytes %lld", (long long)bytes);
    assert_ddp_dump_has(model, want);
    assert_ok(ndm_ddp_close(d));
    assert_status(ndm_ddp_close(d), NDM_ALREADY);
    assert_int_equal(ndm_ddp_buckets(d), NDM_E_CLOSED);
    assert_ok(ndm_manager_close(model));
}

/* Backward accumulates straight into the buckets: each gradient is a view
 * of its bucket, holding what the gradient held before, until the wrapper
 * closes and gives every parameter its own array back with the values. */
static void test_ddp_gradients_live_in_the_buckets_until_the_close(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_array p[4];
    assert_int_equal(ndm_module_parameters(net, p, 4), 4);
    ndm_array own = ndm_grad_to(m, p[0]);
    float *o = ndm_array_data(own);
    o[0] = 3;
    ndm_ddp d = ndm_ddp_new(model, net, opt, NULL);
    assert_int_equal(ndm_ddp_buckets(d), 1);
    ndm_array in_bucket = ndm_grad_to(m, p[0]);
    float *b = ndm_array_data(in_bucket);
    assert_ptr_not_equal(b, o);
    assert_true(b[0] == 3);
    b[0] = 5;
    assert_ok(ndm_ddp_close(d));
    ndm_array back = ndm_grad_to(m, p[0]);
    assert_ptr_equal(ndm_array_data(back), o);
    assert_true(o[0] == 5);
    assert_ok(ndm_array_release(back));
    assert_ok(ndm_array_release(in_bucket));
    assert_ok(ndm_array_release(own));
    assert_ok(ndm_manager_close(model));
}

/* ---- data-parallel training on a CUDA device (NCCL) ------------------------------------------- */

/* The buckets on cuda:0 go over NCCL in stream order: the same losses as
 * one process on cuda:0 at the same global batch, the same parameters on
 * every rank, and nothing left on the device. */
static void test_ddp_cuda_user_module_matches_one_process_at_the_same_global_batch(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager data = ndm_manager_new(m, "data");
    check_parity_on(gpu, NDM_CUDA(0), residual, synthetic(data, (int64_t)B * S * 20 + 5), B, 10,
                    "user module on cuda:0");
    assert_ok(ndm_manager_close(data));
    close_gpu(gpu);
}

static void test_ddp_cuda_matches_one_process_at_the_same_global_batch(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager data = ndm_manager_new(m, "data");
    check_parity_on(gpu, NDM_CUDA(0), mlp, synthetic(data, (int64_t)B * S * 20 + 5), B, 20,
                    "mlp on cuda:0");
    assert_ok(ndm_manager_close(data));
    close_gpu(gpu);
}

/* One step of a CUDA model under d on a batch of 8 in `batch`; `bad` feeds
 * a wrongly shaped input (the loss is then null), `skip` calls the step
 * without backward. Returns the step's status. */
static ndm_status cuda_step(ndm_ddp d, ndm_module net, ndm_manager batch, bool bad, bool skip)
{
    /* ones: every weight has a gradient */
    ndm_array xc = ndm_ones(batch, NDM_F32, 2, (int64_t[]){8, bad ? IN + 1 : IN});
    ndm_array x = ndm_to_to(batch, xc, NDM_CUDA(0));
    ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){8});
    ndm_array yg = ndm_to_to(batch, y, NDM_CUDA(0));
    assert_live(x);
    assert_live(yg);
    ndm_clear_error();
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), yg);
    assert_true(bad ? !loss.id : loss.id != 0);
    if (!skip) {
        ndm_status st = ndm_ddp_backward(d, loss);
        assert_true(bad ? st < 0 : st == NDM_OK);
    }
    (void)ndm_grad_end();
    return ndm_ddp_step(d);
}

/* A rank whose forward pass failed (null loss), then a rank that steps
 * without backward: each time every rank's step fails with that rank's
 * message and no rank steps; then all goes on. */
static void test_ddp_cuda_failing_rank_ends_the_step_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager model = ndm_manager_new(gpu, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    /* one bucket per parameter: a failure in the middle of backward */
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_true(d.id);
    assert_int_equal(ndm_ddp_buckets(d), 4);
    ndm_array w;
    assert_int_equal(ndm_module_parameters(net, &w, 1), 4);
    double *before = values(w);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", S - 1);
    for (int round = 0; round < 3; round++) {
        ndm_manager batch = ndm_manager_new(gpu, "batch");
        bool last = R == S - 1;
        ndm_status st = cuda_step(d, net, batch, round == 0 && last, round == 1 && last);
        if (round < 2) {
            assert_int_equal(st, round == 0 ? NDM_E_SHAPE : NDM_E_INVALID);
            assert_error_has(want);
            if (round == 1)
                assert_error_has("without ndm_ddp_backward");
            double *after = values(w);
            assert_memory_equal(before, after, sizeof(double) * HID * IN); /* no rank stepped */
            free(after);
        } else {
            assert_ok(st);
            double *after = values(w);
            assert_true(memcmp(before, after, sizeof(double) * HID * IN) != 0);
            free(after);
        }
        assert_ok(ndm_manager_close(batch));
    }
    assert_parameters_agree(m, net);
    free(before);
    assert_ok(ndm_manager_close(model));
    close_gpu(gpu);
}

/* The buckets, their gradient views and the flags are arrays of the model's
 * "ddp" manager on the parameters' device, made once: steps add nothing,
 * and the close gives every parameter its own gradient back. */
static void test_ddp_cuda_buckets_are_device_arrays_of_the_model(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager model = ndm_manager_new(gpu, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_stats before;
    assert_ok(ndm_manager_stats(model, NDM_CUDA(0), NDM_STATS_SUBTREE, &before));
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_int_equal(ndm_ddp_buckets(d), 4);
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    for (int step = 0; step < 2; step++) {
        ndm_manager batch = ndm_manager_new(gpu, "batch");
        assert_ok(cuda_step(d, net, batch, false, false));
        assert_ok(ndm_manager_close(batch));
    }
    /* 4 buckets of (gradients + 1 flag) floats, the 4 gradients as views of
     * them (their storage counts once), and the 4 flags gathered as f32 */
    char want[128];
    int64_t bytes = 4 * ((int64_t)HID * IN + HID + CLASSES * HID + CLASSES + 4) + 4 * 4;
    snprintf(want, sizeof want, "cuda:0  arrays 9 [new]  bytes %lld", (long long)bytes);
    assert_ddp_dump_has(model, want);
    ndm_stats during;
    assert_ok(ndm_manager_stats(model, NDM_CUDA(0), NDM_STATS_SUBTREE, &during));
    assert_int_equal(during.live_bytes, before.live_bytes + bytes);
    assert_ok(ndm_ddp_close(d));
    ndm_stats after;
    assert_ok(ndm_manager_stats(model, NDM_CUDA(0), NDM_STATS_SUBTREE, &after));
    assert_int_equal(after.live_arrays, before.live_arrays);
    assert_int_equal(after.live_bytes, before.live_bytes);
    assert_ok(ndm_manager_close(model));
    close_gpu(gpu);
}

/* Rank 0's model on cuda:0 and the others' on the CPU: refused on every
 * rank, naming both devices, with nothing left behind. */
static void test_ddp_of_mixed_devices_is_refused_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    GPU_OR_SKIP(gpu, m);
    ndm_manager model = ndm_manager_new(R == 0 ? gpu : m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_sgd(model, net, 0.1, 0.0, 0.0);
    ndm_clear_error();
    ndm_ddp d = ndm_ddp_new(model, net, opt, NULL);
    assert_false(d.id);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("rank 0's array is on cuda:0 and rank 1's on cpu:0");
    assert_ok(ndm_manager_close(model));
    close_gpu(gpu);
    assert_ok(ndm_dist_barrier());
}

/* ---- small all-reduces carry their data with the agreement ------------------------------ */

/* Each rank's own values, unchanged: what a failed collective must leave. */
static void assert_own_values(ndm_array a)
{
    double *v = values(a);
    for (int64_t i = 0; i < ndm_array_size(a); i++)
        if (v[i] != dist_value(ndm_array_dtype(a), R, i))
            fail_msg("element %lld: %g, want this rank's own %g", (long long)i, v[i],
                     dist_value(ndm_array_dtype(a), R, i));
    free(v);
}

static void assert_reference_sum(ndm_array a)
{
    double *v = values(a);
    for (int64_t i = 0; i < ndm_array_size(a); i++)
        if (v[i] != dist_reference(ndm_array_dtype(a), NDM_DIST_SUM, i, S))
            fail_msg("element %lld: %g, want %g", (long long)i, v[i],
                     dist_reference(ndm_array_dtype(a), NDM_DIST_SUM, i, S));
    free(v);
}

/* The last rank's array differs in size from the others': too large to
 * carry (32 KiB), carried in two pieces, and carried in one message of its
 * own, against a small one. Every rank fails with both shapes named, keeps
 * its own values, and the next all-reduce finds no data left over from
 * the failed one. */
static void test_all_reduce_carried_against_other_sizes_fails_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    const int64_t last[] = {8192, 700, 2000}, others = 16;
    for (int k = 0; k < 3; k++) {
        ndm_array a = filled(m, NDM_F32, R, 1, (int64_t[]){R == S - 1 ? last[k] : others});
        ndm_clear_error();
        assert_status(ndm_all_reduce_(a, NDM_DIST_SUM), NDM_E_SHAPE);
        char want[128];
        snprintf(want, sizeof want, "rank 0 has float32 [%lld] and rank %d has float32 [%lld]",
                 (long long)others, S - 1, (long long)last[k]);
        assert_error_has(want);
        assert_own_values(a);
        assert_ok(ndm_array_release(a));
        ndm_array b = filled(m, NDM_F32, R, 1, (int64_t[]){700});
        assert_ok(ndm_all_reduce_(b, NDM_DIST_SUM));
        assert_reference_sum(b);
        assert_ok(ndm_array_release(b));
    }
}

/* Rank 0 passes a strided view, which it cannot send as it is: the others,
 * who could carry theirs, fall back with it to MPI's all-reduce. */
static void test_all_reduce_one_strided_rank_among_carrying_ones_matches_the_reference(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array c = filled(m, NDM_F32, R, 2, (int64_t[]){4, 3});
    ndm_array base = NDM_NULL_ARRAY, a = c;
    if (R == 0) {
        /* a [4, 3] view whose row-major elements are c's */
        ndm_array t = ndm_transpose(c);
        base = ndm_contiguous(t);
        assert_ok(ndm_array_release(t));
        a = ndm_transpose(base);
        assert_live(a);
        assert_false(ndm_array_is_contiguous(a));
    }
    assert_ok(ndm_all_reduce_(a, NDM_DIST_SUM));
    assert_reference_sum(a);
    if (R == 0) {
        assert_ok(ndm_array_release(a));
        assert_ok(ndm_array_release(base));
    }
    assert_ok(ndm_array_release(c));
}

/* Run with a CUDA module that has no collectives (the registry's stand-in,
 * as a module built without NCCL): every rank is told so, with no hang. */
static void test_collective_on_cuda_arrays_without_nccl_is_unsupported_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager gpu = gpu_manager(m); /* this mode runs with the stand-in module */
    assert_true(gpu.id);
    ndm_array a = ndm_zeros(gpu, NDM_F32, 1, (int64_t[]){4});
    assert_live(a);
    ndm_clear_error();
    assert_status(ndm_all_reduce_(a, NDM_DIST_SUM), NDM_E_UNSUPPORTED);
    assert_error_has("rank 0: ");
    assert_error_has("built without it");
    assert_error_has("NCCL");
    ndm_clear_error();
    assert_false(ndm_all_gather_to(gpu, a).id);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_ok(ndm_array_release(a));
    close_gpu(gpu);
    assert_ok(ndm_dist_barrier());
}

/* ---- the step per bucket ------------------------------------------------------------------- */

/* One data-parallel step of net on this rank's batch (input value R + k). */
static void ddp_step_on(ndm_manager m, ndm_module net, ndm_ddp d, int k)
{
    ndm_manager batch = ndm_manager_new(m, "batch");
    ndm_array x = ndm_full(batch, NDM_F32, (R + 1) * 0.25 + k, 2, (int64_t[]){4, IN});
    ndm_array y = ndm_full(batch, NDM_I64, (R + k) % CLASSES, 1, (int64_t[]){4});
    assert_ok(ndm_grad_begin(batch));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
    assert_live(loss);
    assert_ok(ndm_ddp_backward(d, loss));
    (void)ndm_grad_end();
    assert_ok(ndm_ddp_step(d));
    assert_ok(ndm_manager_close(batch));
}

/* An optimizer over the net's parameters steps them bucket by bucket, the
 * buckets before the last while the last is on the wire; one that also
 * steps an array outside the net takes the whole step after the last
 * bucket. The same buckets (so the same all-reduces) and the same steps
 * give the same bits either way, with Adam's step count taken once. */
static void test_ddp_step_per_bucket_gives_the_bits_of_the_whole_step(void **state)
{
    ndm_manager m = ROOT(state);
    for (int adam = 0; adam < 2; adam++) {
        ndm_manager ma = ndm_manager_new(m, "per-bucket");
        ndm_manager mb = ndm_manager_new(m, "whole");
        ndm_module na = mlp(ma), nb = mlp(mb);
        ndm_array pa[5], pb[5];
        assert_int_equal(ndm_module_parameters(na, pa, 4), 4);
        assert_int_equal(ndm_module_parameters(nb, pb, 4), 4);
        pb[4] = ndm_zeros(mb, NDM_F32, 1, (int64_t[]){3});
        assert_ok(ndm_requires_grad(pb[4]));
        ndm_optimizer oa = adam ? ndm_adam(ma, na, 0.01, 0.9, 0.999, 1e-8, 0.01)
                                : ndm_sgd(ma, na, 0.1, 0.9, 0.01);
        ndm_optimizer ob = adam ? ndm_adam_params(mb, 5, pb, 0.01, 0.9, 0.999, 1e-8, 0.01)
                                : ndm_sgd_params(mb, 5, pb, 0.1, 0.9, 0.01);
        ndm_ddp da = ndm_ddp_new(ma, na, oa, &(ndm_ddp_options){.bucket_bytes = 1});
        ndm_ddp db = ndm_ddp_new(mb, nb, ob, &(ndm_ddp_options){.bucket_bytes = 1});
        assert_int_equal(ndm_ddp_buckets(da), 4);
        assert_int_equal(ndm_ddp_buckets(db), 4);
        double *start = values(pa[0]);
        for (int k = 0; k < 4; k++) {
            ddp_step_on(m, na, da, k);
            ddp_step_on(m, nb, db, k);
        }
        for (int i = 0; i < 4; i++) {
            int64_t n = ndm_array_size(pa[i]);
            double *a = values(pa[i]), *b = values(pb[i]);
            for (int64_t j = 0; j < n; j++)
                if (memcmp(&a[j], &b[j], sizeof a[j]))
                    fail_msg("%s, parameter %d element %lld: %.17g per bucket, %.17g whole",
                             adam ? "adam" : "sgd", i, (long long)j, a[j], b[j]);
            if (i == 0) /* the steps moved it */
                assert_true(memcmp(a, start, (size_t)n * sizeof *a) != 0);
            free(a);
            free(b);
        }
        free(start);
        assert_ok(ndm_manager_close(mb));
        assert_ok(ndm_manager_close(ma));
    }
}

/* With the step per bucket, a rank that fails still ends the step on every
 * rank with its message before any rank steps a bucket: every parameter
 * keeps its values. The next step goes on. */
static void test_ddp_step_per_bucket_failing_rank_ends_the_step_on_every_rank(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_manager model = ndm_manager_new(m, "model");
    ndm_module net = mlp(model);
    ndm_optimizer opt = ndm_adam(model, net, 0.01, 0.9, 0.999, 1e-8, 0.0);
    ndm_ddp d = ndm_ddp_new(model, net, opt, &(ndm_ddp_options){.bucket_bytes = 1});
    assert_int_equal(ndm_ddp_buckets(d), 4);
    ndm_array p[4];
    assert_int_equal(ndm_module_parameters(net, p, 4), 4);
    double *before[4];
    for (int i = 0; i < 4; i++)
        before[i] = values(p[i]);
    for (int round = 0; round < 3; round++) {
        /* round 0: the last rank's forward fails; round 1: the first rank
         * steps without backward; round 2: all well */
        bool bad = (round == 0 && R == S - 1) || (round == 1 && R == 0);
        ndm_manager batch = ndm_manager_new(m, "batch");
        ndm_array x = ndm_zeros(batch, NDM_F32, 2, (int64_t[]){8, round == 0 && bad ? IN + 1 : IN});
        ndm_array y = ndm_zeros(batch, NDM_I64, 1, (int64_t[]){8});
        ndm_clear_error();
        assert_ok(ndm_grad_begin(batch));
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        ndm_status st = round == 1 && bad ? NDM_OK : ndm_ddp_backward(d, loss);
        (void)ndm_grad_end();
        assert_true(round == 0 && bad ? st < 0 : st == NDM_OK);
        st = ndm_ddp_step(d);
        if (round < 2) {
            assert_int_equal(st, round == 0 ? NDM_E_SHAPE : NDM_E_INVALID);
            char want[32];
            snprintf(want, sizeof want, "rank %d: ", round == 0 ? S - 1 : 0);
            assert_error_has(want);
            for (int i = 0; i < 4; i++) { /* no rank stepped any bucket */
                double *now = values(p[i]);
                assert_memory_equal(before[i], now,
                                    (size_t)ndm_array_size(p[i]) * sizeof *now);
                free(now);
            }
        } else {
            assert_ok(st);
            double *now = values(p[3]); /* the first bucket's parameter moved */
            assert_true(memcmp(before[3], now, (size_t)ndm_array_size(p[3]) * sizeof *now));
            free(now);
        }
        assert_ok(ndm_manager_close(batch));
    }
    for (int i = 0; i < 4; i++)
        free(before[i]);
    assert_ok(ndm_manager_close(model));
}

int main(int argc, char **argv)
{
    if (ndm_dist_init() != NDM_OK) {
        fprintf(stderr, "ndm_dist_init: %s\n", ndm_last_error());
        return 1;
    }
    R = ndm_dist_rank();
    S = ndm_dist_size();
    const struct CMUnitTest tests[] = {
        TEST(test_dist_group_reads_rank_size_and_local_rank),
        TEST(test_all_reduce_matches_the_reference_for_every_dtype),
        TEST(test_all_reduce_stages_a_strided_view),
        TEST(test_broadcast_copies_the_root_for_every_dtype),
        TEST(test_all_gather_concatenates_in_rank_order),
        TEST(test_reduce_scatter_gives_each_rank_its_part),
        TEST(test_collective_shape_mismatch_fails_on_every_rank),
        TEST(test_collective_shape_mismatch_past_eight_dims_fails_on_every_rank),
        TEST(test_collective_dtype_mismatch_fails_on_every_rank),
        TEST(test_collective_other_operation_fails_on_every_rank),
        TEST(test_failing_rank_fails_the_collective_with_its_message),
        TEST(test_collective_bad_arguments_fail_on_every_rank),
        TEST(test_cuda_all_reduce_matches_the_cpu_path_for_every_dtype),
        TEST(test_cuda_all_reduce_of_bools_is_any),
        TEST(test_cuda_broadcast_copies_the_root_for_every_dtype),
        TEST(test_cuda_all_gather_and_reduce_scatter_match_the_cpu_path),
        TEST(test_cuda_collectives_of_large_buffers_match_the_cpu_path),
        TEST(test_cuda_all_reduce_stages_a_strided_view),
        TEST(test_cuda_collective_mismatch_fails_on_every_rank),
        TEST(test_cuda_and_cpu_arrays_mixed_fail_on_every_rank),
        TEST(test_dist_reports_gather_every_rank_with_its_prefix),
        TEST(test_loader_shards_every_example_once_per_epoch),
        TEST(test_ddp_matches_one_process_at_the_same_global_batch),
        TEST(test_ddp_cnn_matches_one_process_at_the_same_global_batch),
        TEST(test_ddp_user_module_matches_one_process_at_the_same_global_batch),
        TEST(test_ddp_failing_rank_ends_the_step_on_every_rank),
        TEST(test_ddp_collective_between_backward_and_step_keeps_the_order),
        TEST(test_ddp_buckets_are_model_arrays_shown_in_dumps),
        TEST(test_ddp_gradients_live_in_the_buckets_until_the_close),
        TEST(test_ddp_cuda_matches_one_process_at_the_same_global_batch),
        TEST(test_ddp_cuda_user_module_matches_one_process_at_the_same_global_batch),
        TEST(test_ddp_cuda_failing_rank_ends_the_step_on_every_rank),
        TEST(test_ddp_cuda_buckets_are_device_arrays_of_the_model),
        TEST(test_ddp_of_mixed_devices_is_refused_on_every_rank),
        TEST(test_all_reduce_carried_against_other_sizes_fails_on_every_rank),
        TEST(test_all_reduce_one_strided_rank_among_carrying_ones_matches_the_reference),
        TEST(test_ddp_step_per_bucket_gives_the_bits_of_the_whole_step),
        TEST(test_ddp_step_per_bucket_failing_rank_ends_the_step_on_every_rank),
        TEST(test_ddp_backward_twice_is_refused_and_the_step_goes_on),
    };
    const struct CMUnitTest no_nccl[] = {
        TEST(test_collective_on_cuda_arrays_without_nccl_is_unsupported_on_every_rank),
    };
    char name[48];
    int failed;
    if (argc > 1 && !strcmp(argv[1], "no-nccl")) {
        snprintf(name, sizeof name, "dist without NCCL rank %d of %d", R, S);
        failed = cmocka_run_group_tests_name(name, no_nccl, NULL, NULL);
    } else {
        snprintf(name, sizeof name, "dist rank %d of %d", R, S);
        failed = cmocka_run_group_tests_name(name, tests, NULL, NULL);
    }
    /* a rank whose test failed early may be out of step with the others:
     * leave without the collective finalize then */
    if (failed)
        return failed;
    ndm_status st = ndm_dist_finalize();
    return st == NDM_OK ? 0 : 1;
}
