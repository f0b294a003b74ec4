/* The CUDA backend against the CPU reference (copy, fill, iota, transfers for
 * every dtype, strided and broadcast views, sticky errors; every operation
 * family through the public API; seeded random draws), the public API on a
 * CUDA device (loader, checkpoints, training, predictor), and what a machine
 * or build without a GPU answers. The device is a GPU, or "cuda (host
 * execution)" when NDM_BACKEND_PATH names tests/cuda_host's module; without
 * either the device tests skip, saying so. */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/cross_entropy_ignore.h"
#include "helpers.h"
#include "ndm/config.h"
#include "ndm/stream.h"
#include "ops/dispatch.h"

static const char *self_path;

#define NEED_GPU()                                                              \
    do {                                                                        \
        if (ndm_cuda_device_count() == 0) {                                     \
            print_message("no CUDA device: skipped\n");                        \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* A CUDA module is loaded: the real one of a build with the toolkit, or
 * host execution's (tests/cuda_host/, named by NDM_BACKEND_PATH), which a
 * build without nvcc loads too. */
static bool have_module(void) { return ndm__backend_for(NDM_DEVICE_CUDA) != NULL; }

/* The CUDA module's test hooks, through the registry (the module exports
 * nothing else); loading it is part of the test. */
static const ndm__backend_test *cuda_hooks(void)
{
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (!b)
        fail_msg("the CUDA module did not load: %s", ndm__backend_unavailable(NDM_DEVICE_CUDA));
    assert_non_null(b->test);
    return b->test;
}

static const ndm_dtype all_dtypes[NDM_DTYPE_COUNT] = {NDM_BOOL, NDM_U8,   NDM_I32, NDM_I64,
                                                      NDM_F16,  NDM_BF16, NDM_F32, NDM_F64};

/* Values that cross every conversion rule: rounding ties, saturation edges,
 * f16 overflow and subnormals, infinities, NaN, negative zero. */
static const double probe_values[] = {
    0.0,   -0.0,  1.0,   -1.0,   0.5,    -0.5,        1.5,          2.5,           -2.5,
    127,   128,   255,   255.5,  256,    300,         -129,         65504,         65519,
    65520, 1e5,   -1e5,  2147483647.0, 2147483648.0, -2147483649.0, 3e9,         1e19,
    -1e19, 9.3e18, 1e-3, 1e-8,   6e-8,   1e-40,       3.0e38,       1e39,          1e300,
    INFINITY, -INFINITY, NAN, 0.1, 1.0 / 3.0, 1234.5678, -7.75,     33554433.0,    -0.0001,
};
#define NPROBE ((int64_t)(sizeof probe_values / sizeof probe_values[0]))

/* ---- helpers ------------------------------------------------------------- */

/* Convert n doubles into dtype dt on the CPU (the reference rules). */
static void cpu_convert(void *dst, ndm_dtype dt, const void *src, ndm_dtype st, int64_t n)
{
    int64_t shape[1] = {n}, one[1] = {1};
    ndm__tensor d = {dst, dt, 1, shape, one}, s = {(void *)src, st, 1, shape, one};
    assert_ok(ndm__cpu_ref_backend.copy(0, &d, &s));
}

static double element_as_double(ndm_dtype dt, const void *p)
{
    double v;
    cpu_convert(&v, NDM_F64, p, dt, 1);
    return v;
}

/* Equal bytes element by element; two NaNs of a float dtype count as equal
 * (their payloads may differ between devices). */
static void assert_same_elements(ndm_dtype dt, const void *want, const void *got, int64_t n,
                                 const char *what)
{
    size_t es = ndm_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        const char *w = (const char *)want + (size_t)i * es;
        const char *g = (const char *)got + (size_t)i * es;
        if (memcmp(w, g, es) == 0)
            continue;
        double wv = element_as_double(dt, w), gv = element_as_double(dt, g);
        if (ndm_dtype_is_float(dt) && isnan(wv) && isnan(gv))
            continue;
        fail_msg("%s (%s): element %lld differs: CPU %.17g, CUDA %.17g", what, ndm_dtype_short(dt),
                 (long long)i, wv, gv);
    }
}

/* The kernel view of a live array. */
static ndm__tensor tensor(ndm_array a)
{
    ndm__array *r = ndm__array_get(a, "test", NDM__NO_SITE);
    assert_non_null(r);
    return ndm__tensor_of(r);
}

static void *copy_out(ndm_array a)
{
    size_t n = ndm_array_nbytes(a);
    void *buf = test_malloc(n ? n : 1);
    assert_ok(ndm_array_copy_out(a, buf, n));
    return buf;
}

/* Compare the elements (C order) of a CPU array and a CUDA array. */
static void assert_arrays_match(ndm_array cpu, ndm_array gpu, const char *what)
{
    assert_live(cpu);
    assert_live(gpu);
    assert_int_equal(ndm_array_dtype(cpu), ndm_array_dtype(gpu));
    assert_int_equal(ndm_array_size(cpu), ndm_array_size(gpu));
    void *w = copy_out(cpu), *g = copy_out(gpu);
    assert_same_elements(ndm_array_dtype(cpu), w, g, ndm_array_size(cpu), what);
    test_free(w);
    test_free(g);
}

/* probe_values in dtype dt, with raw edge patterns of that dtype added. */
static void *probe_data(ndm_dtype dt, int64_t *n_out)
{
    int64_t n = NPROBE + 4;
    size_t es = ndm_dtype_size(dt);
    char *buf = test_calloc((size_t)n, es);
    cpu_convert(buf, dt, probe_values, NDM_F64, NPROBE);
    char *extra = buf + (size_t)NPROBE * es;
    switch (dt) {
    case NDM_I64: {
        int64_t v[4] = {INT64_MAX, INT64_MIN, (INT64_C(1) << 53) + 1, -(INT64_C(1) << 62) - 3};
        memcpy(extra, v, sizeof v);
        break;
    }
    case NDM_I32: {
        int32_t v[4] = {INT32_MAX, INT32_MIN, 16777217, -16777219};
        memcpy(extra, v, sizeof v);
        break;
    }
    case NDM_F16:
    case NDM_BF16: {
        uint16_t v[4] = {0x0001, 0x8000, 0x7e01, 0x03ff}; /* subnormal, -0, NaN, subnormal */
        memcpy(extra, v, sizeof v);
        break;
    }
    case NDM_F32: {
        uint32_t v[4] = {0x00000001u, 0x7fc00001u, 0x33800000u, 0x477fefffu};
        memcpy(extra, v, sizeof v);
        break;
    }
    case NDM_BOOL:
    case NDM_U8: {
        uint8_t v[4] = {0, 1, 1, 0};
        if (dt == NDM_U8)
            v[0] = 200, v[3] = 255;
        memcpy(extra, v, sizeof v);
        break;
    }
    case NDM_F64: {
        double v[4] = {5e-324, -1.7976931348623157e308, 0.1 + 0.2, 4503599627370497.0};
        memcpy(extra, v, sizeof v);
        break;
    }
    }
    *n_out = n;
    return buf;
}

/* A CPU manager and a CUDA manager for one test. */
typedef struct pair {
    ndm_manager cpu, gpu;
} pair;

static pair pair_new(ndm_manager root)
{
    pair p = {ndm_manager_new(root, "host"), ndm_manager_new_on(root, "gpu", NDM_CUDA(0))};
    assert_live(p.cpu);
    assert_live(p.gpu);
    return p;
}

static void pair_close(pair p)
{
    assert_ok(ndm_manager_close(p.gpu));
    assert_ok(ndm_manager_close(p.cpu));
}

/* ---- without a GPU ------------------------------------------------------- */

static void test_cuda_manager_on_missing_device_fails_cleanly(void **state)
{
    ndm_manager root = ROOT(state);
    int count = ndm_cuda_device_count();
    assert_true(count >= 0 && count <= 16);
    assert_int_equal(ndm_cuda_device_count(), count);
    ndm_manager keep = ndm_manager_new(root, "keep");
    assert_live(keep);
    ndm_array x = ndm_full(keep, NDM_F32, 2.5, NDM_SHAPE(3));
    assert_live(x);

    /* With no GPU this is cuda:0, as on most machines without one. */
    ndm_manager g = ndm_manager_new_on(root, "gpu", NDM_CUDA(count));
    assert_true(ndm_manager_is_null(g));
    char want[64];
    snprintf(want, sizeof want, "cuda:%d", count);
    assert_error_has(want);
    assert_error_has("ndm_manager_new_on");
    if (have_module()) {
        assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
        assert_error_has("does not exist");
    } else {
        assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
        assert_error_has("no CUDA backend");
    }

    /* Nothing else moved: the tree, the array and its value. */
    ndm_stats st;
    assert_ok(ndm_manager_stats(root, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 1);
    assert_int_equal(st.live_arrays, 1);
    double v = 0;
    assert_ok(ndm_item(ndm_slice(x, 0, 2, 3, 1), &v));
    assert_true(v == 2.5);
    ndm_manager again = ndm_manager_new(root, "again");
    assert_live(again);
    assert_ok(ndm_manager_close(again));
    assert_ok(ndm_manager_close(keep));
}

static void test_cuda_synchronize_reports_missing_devices(void **state)
{
    (void)state;
    assert_ok(ndm_device_synchronize(NDM_CPU));
    assert_int_equal(ndm_device_synchronize((ndm_device){NDM_DEVICE_CPU, 1}), NDM_E_DEVICE);
    assert_error_has("ndm_device_synchronize");
    assert_error_has("cpu:1");
    int count = ndm_cuda_device_count();
    ndm_status st = ndm_device_synchronize(NDM_CUDA(count));
    char want[64];
    snprintf(want, sizeof want, "cuda:%d", count);
    assert_error_has(want);
    assert_int_equal(st, have_module() ? NDM_E_DEVICE : NDM_E_UNSUPPORTED);
    assert_int_equal(ndm_last_status(), st);
}

static void test_to_missing_device_changes_nothing(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array x = ndm_arange(root, NDM_F32, 0, 6, 1);
    assert_live(x);
    int count = ndm_cuda_device_count();
    ndm_array y = ndm_to(x, NDM_CUDA(count));
    assert_true(ndm_array_is_null(y));
    assert_int_equal(ndm_last_status(), have_module() ? NDM_E_DEVICE : NDM_E_UNSUPPORTED);
    assert_error_has("ndm_to");
    assert_error_has("test_cuda.c");
    assert_int_equal(test_live_arrays(root), 1);
    float v[6];
    assert_ok(ndm_array_copy_out(x, v, sizeof v));
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == (float)i);
    assert_ok(ndm_array_release(x));
}

static void test_to_same_device_returns_fresh_alias(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager w = ndm_manager_new(root, "w");
    ndm_manager other = ndm_manager_new(root, "other");
    ndm_array x = ndm_arange(w, NDM_I32, 0, 12, 1);
    ndm_array xt = ndm_transpose(ndm_reshape(x, NDM_SHAPE(3, 4)));
    assert_live(xt);

    ndm_array y = ndm_to(xt, NDM_CPU);
    assert_live(y);
    assert_true(y.id != xt.id);
    assert_true(ndm_array_shares_storage(y, x));
    assert_int_equal(ndm_array_manager(y).id, w.id); /* the input's manager */
    int64_t sx[2], sy[2];
    assert_int_equal(ndm_array_strides(xt, sx, 2), 2);
    assert_int_equal(ndm_array_strides(y, sy, 2), 2);
    assert_memory_equal(sx, sy, sizeof sx);
    assert_ok(ndm_array_release(y));
    assert_true(ndm_array_valid(xt)); /* releasing the alias leaves the input */

    ndm_array z = ndm_to_to(other, xt, NDM_CPU);
    assert_int_equal(ndm_array_manager(z).id, other.id);
    ndm_manager s = ndm_scope_begin(root, "s");
    ndm_array v = ndm_to(xt, NDM_CPU);
    assert_int_equal(ndm_array_manager(v).id, s.id);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_false(ndm_array_valid(v));
    assert_ok(ndm_manager_close(other));
    assert_false(ndm_array_valid(z));
    assert_true(ndm_array_valid(xt));
    assert_ok(ndm_manager_close(w));
}

static void test_to_null_input_keeps_first_error(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array x = ndm_zeros(root, NDM_F32, NDM_SHAPE(2, 3));
    ndm_array bad = ndm_reshape(x, NDM_SHAPE(4, 4));
    assert_true(ndm_array_is_null(bad));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    char first[1024];
    snprintf(first, sizeof first, "%s", ndm_last_error());
    assert_true(ndm_array_is_null(ndm_to(bad, NDM_CPU)));
    assert_true(ndm_array_is_null(ndm_to(bad, NDM_CUDA(0))));
    assert_int_equal(ndm_last_status(), NDM_E_SHAPE);
    assert_string_equal(ndm_last_error(), first);

    assert_ok(ndm_array_release(x));
    assert_true(ndm_array_is_null(ndm_to(x, NDM_CPU)));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("ndm_to");
}

static void test_to_capped_manager_refuses_before_allocating(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager capped = ndm_manager_new(root, "capped");
    ndm_array x = ndm_ones(root, NDM_F64, NDM_SHAPE(5));
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    assert_true(ndm_array_is_null(ndm_to_to(capped, x, NDM_CPU)));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_int_equal(test_live_arrays(capped), 0);
    assert_int_equal(test_live_arrays(root), 1);
    assert_ok(ndm_manager_close(capped));
    assert_ok(ndm_array_release(x));
}

/* The same view made on both devices. */
typedef ndm_array (*view_fn)(ndm_array a);
static ndm_array v_transpose(ndm_array a) { return ndm_transpose(a); }
static ndm_array v_permute(ndm_array a) { return ndm_permute(a, 3, ((const int[]){1, 0, 2})); }
static ndm_array v_step(ndm_array a) { return ndm_slice(a, 2, 1, NDM_END, 2); }
static ndm_array v_flip(ndm_array a) { return ndm_slice(a, 0, NDM_END, NDM_END, -1); }
static ndm_array v_select(ndm_array a) { return ndm_select(a, 1, 2); }
static ndm_array v_broadcast(ndm_array a)
{
    ndm_array col = ndm_slice(ndm_slice(a, 0, 0, 1, 1), 2, 3, 4, 1); /* (1, 5, 1) */
    return ndm_expand(col, NDM_SHAPE(4, 5, 6));
}
static ndm_array v_flip_broadcast(ndm_array a)
{
    ndm_array row = ndm_slice(ndm_slice(a, 0, 2, 3, 1), 2, NDM_END, NDM_END, -2); /* (1, 5, 3) */
    return ndm_expand(ndm_unsqueeze(row, 0), NDM_SHAPE(2, 4, 5, 3));
}

/* ---- without a GPU: the CUDA plan run on the host --------------------------- */

#define NEED_CUDA_BUILD()                                                       \
    do {                                                                        \
        if (!have_module()) {                                                   \
            print_message("no CUDA module loaded: skipped\n");                 \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* Copy src (any view) into fresh (C-ordered) buffers with the CPU reference
 * and with the CUDA backend's host emulation; both must agree. */
static void host_copy_check(ndm_manager m, ndm_array src, ndm_dtype to, const char *what)
{
    int nd = ndm_array_ndim(src);
    int64_t shape[32];
    assert_int_equal(ndm_array_shape(src, shape, 32), nd);
    ndm_array want = ndm_empty(m, to, nd, shape);
    ndm_array got = ndm_empty(m, to, nd, shape);
    ndm__tensor w = tensor(want), g = tensor(got), x = tensor(src);
    assert_ok(ndm__cpu_ref_backend.copy(0, &w, &x));
    assert_ok(cuda_hooks()->copy_on_host(&g, &x));
    char buf[96];
    snprintf(buf, sizeof buf, "%s %s -> %s", what, ndm_dtype_short(ndm_array_dtype(src)),
             ndm_dtype_short(to));
    void *a = copy_out(want), *b = copy_out(got);
    assert_same_elements(to, a, b, ndm_array_size(want), buf);
    test_free(a);
    test_free(b);
    assert_ok(ndm_array_release(want));
    assert_ok(ndm_array_release(got));
}

static void test_cuda_conversions_match_cpu_on_host(void **state)
{
    NEED_CUDA_BUILD();
    ndm_manager m = ndm_manager_new(ROOT(state), "host");
    for (int si = 0; si < NDM_DTYPE_COUNT; si++) {
        int64_t n;
        void *data = probe_data(all_dtypes[si], &n);
        ndm_array src = ndm_from_buffer(m, all_dtypes[si], data, NDM_SHAPE(n));
        ndm_array flipped = ndm_slice(src, 0, NDM_END, NDM_END, -1);
        for (int di = 0; di < NDM_DTYPE_COUNT; di++) {
            host_copy_check(m, src, all_dtypes[di], "contiguous");
            host_copy_check(m, flipped, all_dtypes[di], "flipped");
        }
        test_free(data);
    }
    assert_ok(ndm_manager_close(m));
}

static void test_cuda_strided_plans_match_cpu_on_host(void **state)
{
    NEED_CUDA_BUILD();
    ndm_manager m = ndm_manager_new(ROOT(state), "host");
    static const view_fn views[] = {v_transpose, v_permute, v_step,           v_flip,
                                    v_select,    v_broadcast, v_flip_broadcast};
    ndm_array base = ndm_reshape(ndm_arange(m, NDM_F32, -60, 60, 1), NDM_SHAPE(4, 5, 6));
    for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
        host_copy_check(m, views[v](base), NDM_F32, "view");
        host_copy_check(m, views[v](base), NDM_I64, "view");
    }
    /* past the kernel's axes: 14 unmergeable axes */
    int64_t shape[14];
    for (int i = 0; i < 14; i++)
        shape[i] = 2;
    ndm_array deep = ndm_reshape_to_at(NDM_HERE, m, ndm_arange(m, NDM_I32, 0, 16384, 1), 14, shape);
    host_copy_check(m, ndm_transpose(deep), NDM_F64, "rank 14");
    host_copy_check(m, ndm_transpose(deep), NDM_I32, "rank 14");
    /* a strided fill leaves the rest alone, as the CPU's does */
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        for (int64_t i = 0; i < NPROBE; i++) {
            ndm_array w = ndm_zeros(m, all_dtypes[k], NDM_SHAPE(5, 7));
            ndm_array g = ndm_zeros(m, all_dtypes[k], NDM_SHAPE(5, 7));
            ndm__tensor tw = tensor(ndm_slice(w, 1, 1, NDM_END, 3));
            ndm__tensor tg = tensor(ndm_slice(g, 1, 1, NDM_END, 3));
            assert_ok(ndm__cpu_ref_backend.fill(0, &tw, probe_values[i]));
            assert_ok(cuda_hooks()->fill_on_host(&tg, probe_values[i]));
            assert_same_elements(all_dtypes[k], ndm_array_data(w), ndm_array_data(g), 35,
                                 "strided fill");
        }
        ndm__tensor td = tensor(ndm_transpose(deep));
        assert_ok(cuda_hooks()->fill_on_host(&td, -4.0));
        int32_t *d = ndm_array_data(deep);
        assert_true(d[0] == -4 && d[16383] == -4 && d[8191] == -4);
    }
    assert_ok(ndm_manager_close(m));
}

/* ---- with a GPU: CUDA against the CPU reference ---------------------------- */

static void test_cuda_copy_matches_cpu_for_every_dtype_pair(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    for (int si = 0; si < NDM_DTYPE_COUNT; si++) {
        ndm_dtype s = all_dtypes[si];
        int64_t n;
        void *data = probe_data(s, &n);
        ndm_array src_c = ndm_from_buffer(p.cpu, s, data, NDM_SHAPE(n));
        ndm_array src_g = ndm_from_buffer(p.gpu, s, data, NDM_SHAPE(n));
        for (int di = 0; di < NDM_DTYPE_COUNT; di++) {
            ndm_dtype d = all_dtypes[di];
            ndm_array dst_c = ndm_empty(p.cpu, d, NDM_SHAPE(n));
            ndm_array dst_g = ndm_empty(p.gpu, d, NDM_SHAPE(n));
            ndm__tensor tc = tensor(dst_c), sc = tensor(src_c);
            ndm__tensor tg = tensor(dst_g), sg = tensor(src_g);
            assert_ok(ndm__cpu_ref_backend.copy(0, &tc, &sc));
            assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->copy(0, &tg, &sg));
            char what[64];
            snprintf(what, sizeof what, "copy %s -> %s", ndm_dtype_short(s), ndm_dtype_short(d));
            assert_arrays_match(dst_c, dst_g, what);
            assert_ok(ndm_array_release(dst_c));
            assert_ok(ndm_array_release(dst_g));
        }
        assert_ok(ndm_array_release(src_c));
        assert_ok(ndm_array_release(src_g));
        test_free(data);
    }
    pair_close(p);
}

static void test_cuda_copy_strided_and_broadcast_views_match_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const view_fn views[] = {v_transpose, v_permute, v_step,           v_flip,
                                    v_select,    v_broadcast, v_flip_broadcast};
    static const char *names[] = {"transpose", "permute", "step 2", "flip",
                                  "select",    "broadcast", "flipped broadcast"};
    static const ndm_dtype dts[] = {NDM_F32, NDM_I64, NDM_F16, NDM_BOOL};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        ndm_manager sc = ndm_scope_begin(p.cpu, "views");
        ndm_array base_c = ndm_reshape(ndm_arange(p.cpu, dts[k], 0, 120, 1), NDM_SHAPE(4, 5, 6));
        ndm_array base_g = ndm_to_to(p.gpu, base_c, NDM_CUDA(0));
        assert_live(base_g);
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
            ndm_array vc = views[v](base_c), vg = views[v](base_g);
            assert_live(vg);
            assert_int_equal(ndm_array_device(vg).type, NDM_DEVICE_CUDA);
            /* packed on the device by the backend's copy */
            assert_arrays_match(ndm_copy(vc), ndm_copy(vg), names[v]);
            /* strided download through a device temporary */
            assert_arrays_match(vc, vg, names[v]);
            /* a transfer of the view */
            ndm_array back = ndm_to(vg, NDM_CPU);
            assert_true(ndm_array_is_contiguous(back));
            assert_arrays_match(vc, back, names[v]);
            /* converting copies of the view into f64 and u8 */
            static const ndm_dtype to[] = {NDM_F64, NDM_U8};
            for (int t = 0; t < 2; t++) {
                int nd = ndm_array_ndim(vc);
                int64_t shape[8];
                assert_int_equal(ndm_array_shape(vc, shape, 8), nd);
                ndm_array dc = ndm_empty(sc, to[t], nd, shape);
                ndm_array dg = ndm_empty_at(NDM_HERE, p.gpu, to[t], nd, shape);
                ndm__tensor tdc = tensor(dc), tvc = tensor(vc), tdg = tensor(dg), tvg = tensor(vg);
                assert_ok(ndm__cpu_ref_backend.copy(0, &tdc, &tvc));
                assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->copy(0, &tdg, &tvg));
                assert_arrays_match(dc, dg, names[v]);
                assert_ok(ndm_array_release(dg));
            }
        }
        assert_ok(ndm_scope_end(sc, 0, NULL));
        assert_ok(ndm_array_release(base_g));
    }
    pair_close(p);
}

static void test_cuda_copy_into_strided_destination_matches_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    /* dst: every other column of a zeroed (6, 8), written from a (6, 4) i32
     * source converted to f32; the skipped columns must stay zero. */
    ndm_array src_c = ndm_reshape(ndm_arange(p.cpu, NDM_I32, -12, 12, 1), NDM_SHAPE(6, 4));
    ndm_array src_g = ndm_to_to(p.gpu, src_c, NDM_CUDA(0));
    ndm_array base_c = ndm_zeros(p.cpu, NDM_F32, NDM_SHAPE(6, 8));
    ndm_array base_g = ndm_zeros(p.gpu, NDM_F32, NDM_SHAPE(6, 8));
    ndm_array dc = ndm_slice(base_c, 1, 1, NDM_END, 2), dg = ndm_slice(base_g, 1, 1, NDM_END, 2);
    ndm__tensor a = tensor(dc), b = tensor(src_c), c = tensor(dg), d = tensor(src_g);
    assert_ok(ndm__cpu_ref_backend.copy(0, &a, &b));
    assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->copy(0, &c, &d));
    assert_arrays_match(base_c, base_g, "strided destination");
    float got[48];
    assert_ok(ndm_array_copy_out(base_g, got, sizeof got));
    assert_true(got[0] == 0.0f && got[1] == -12.0f && got[47] == 11.0f);

    /* a source walked backwards (negative stride), through raw tensors */
    int64_t shape[1] = {24}, neg[1] = {-1};
    ndm_array flat_c = ndm_reshape(src_c, NDM_SHAPE(24));
    ndm_array flat_g = ndm_reshape(src_g, NDM_SHAPE(24));
    ndm_array out_c = ndm_empty(p.cpu, NDM_F64, NDM_SHAPE(24));
    ndm_array out_g = ndm_empty(p.gpu, NDM_F64, NDM_SHAPE(24));
    ndm__tensor fc = tensor(flat_c), fg = tensor(flat_g), oc = tensor(out_c), og = tensor(out_g);
    fc.data = (int32_t *)fc.data + 23, fc.strides = neg, fc.shape = shape;
    fg.data = (int32_t *)fg.data + 23, fg.strides = neg, fg.shape = shape;
    assert_ok(ndm__cpu_ref_backend.copy(0, &oc, &fc));
    assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->copy(0, &og, &fg));
    assert_arrays_match(out_c, out_g, "negative strides");
    double rev[24];
    assert_ok(ndm_array_copy_out(out_g, rev, sizeof rev));
    assert_true(rev[0] == 11.0 && rev[23] == -12.0);
    pair_close(p);
}

static void test_cuda_copy_beyond_kernel_rank_matches_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    /* 14 axes of 2, reversed: no two axes merge, so the kernel's axes run
     * out and the outer ones are walked on the host. */
    int64_t shape[14];
    for (int i = 0; i < 14; i++)
        shape[i] = 2;
    ndm_array c = ndm_reshape_to_at(NDM_HERE, p.cpu, ndm_arange(p.cpu, NDM_F32, 0, 16384, 1), 14,
                                    shape);
    ndm_array g = ndm_to_to(p.gpu, c, NDM_CUDA(0));
    ndm_array ct = ndm_transpose(c), gt = ndm_transpose(g);
    assert_arrays_match(ndm_copy(ct), ndm_copy(gt), "rank 14 copy");
    /* and a fill of the same view, after which every element is 3 */
    ndm__tensor t = tensor(gt);
    assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->fill(0, &t, 3.0));
    float *v = copy_out(g);
    for (int i = 0; i < 16384; i++)
        assert_true(v[i] == 3.0f);
    test_free(v);
    pair_close(p);
}

static void test_cuda_fill_matches_cpu_for_every_dtype(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        for (int64_t i = 0; i < NPROBE; i++) {
            ndm_array c = ndm_full(p.cpu, all_dtypes[k], probe_values[i], NDM_SHAPE(3, 37));
            ndm_array g = ndm_full(p.gpu, all_dtypes[k], probe_values[i], NDM_SHAPE(3, 37));
            char what[64];
            snprintf(what, sizeof what, "fill %.17g", probe_values[i]);
            assert_arrays_match(c, g, what);
            assert_ok(ndm_array_release(c));
            assert_ok(ndm_array_release(g));
        }
        /* a strided fill leaves the other elements alone */
        ndm_array c = ndm_zeros(p.cpu, all_dtypes[k], NDM_SHAPE(8, 9));
        ndm_array g = ndm_zeros(p.gpu, all_dtypes[k], NDM_SHAPE(8, 9));
        ndm__tensor tc = tensor(ndm_slice(c, 1, 2, NDM_END, 3));
        ndm__tensor tg = tensor(ndm_slice(g, 1, 2, NDM_END, 3));
        assert_ok(ndm__cpu_ref_backend.fill(0, &tc, 7.25));
        assert_ok(ndm__backend_for(NDM_DEVICE_CUDA)->fill(0, &tg, 7.25));
        assert_arrays_match(c, g, "strided fill");
        double corner = -1;
        assert_ok(ndm_item(ndm_slice(ndm_slice(g, 0, 0, 1, 1), 1, 0, 1, 1), &corner));
        assert_true(corner == 0.0);
    }
    pair_close(p);
}

static void test_cuda_iota_matches_cpu_for_every_dtype(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = all_dtypes[k];
        assert_arrays_match(ndm_arange(p.cpu, dt, -3.5, 100, 0.7),
                            ndm_arange(p.gpu, dt, -3.5, 100, 0.7), "arange");
        assert_arrays_match(ndm_linspace(p.cpu, dt, -1, 1, 1001),
                            ndm_linspace(p.gpu, dt, -1, 1, 1001), "linspace");
        assert_arrays_match(ndm_arange(p.cpu, dt, 1e9, -1e9, -3.3e6),
                            ndm_arange(p.gpu, dt, 1e9, -1e9, -3.3e6), "falling arange");
    }
    ndm_array e = ndm_arange(p.gpu, NDM_F32, 0, 0, 1);
    assert_int_equal(ndm_array_size(e), 0);
    pair_close(p);
}

static void test_cuda_to_round_trips_every_dtype(void **state)
{
    NEED_GPU();
    ndm_manager root = ROOT(state);
    pair p = pair_new(root);
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_dtype dt = all_dtypes[k];
        int64_t n;
        void *data = probe_data(dt, &n);
        ndm_array c = ndm_from_buffer(p.cpu, dt, data, NDM_SHAPE(n));
        ndm_array g = ndm_to_to(p.gpu, c, NDM_CUDA(0));
        assert_live(g);
        assert_true(ndm_device_eq(ndm_array_device(g), NDM_CUDA(0)));
        assert_false(ndm_array_shares_storage(g, c));
        ndm_array back = ndm_to(g, NDM_CPU); /* lands in p.gpu, g's manager */
        assert_int_equal(ndm_array_manager(back).id, p.gpu.id);
        assert_true(ndm_device_eq(ndm_array_device(back), NDM_CPU));
        void *got = ndm_array_data(back);
        assert_non_null(got);
        assert_memory_equal(got, data, (size_t)n * ndm_dtype_size(dt));
        test_free(data);
    }
    /* the same device gives an alias; an empty array moves too */
    ndm_array g = ndm_zeros(p.gpu, NDM_I64, NDM_SHAPE(4, 0));
    ndm_array a = ndm_to(g, NDM_CUDA(0));
    assert_true(ndm_array_shares_storage(a, g) && a.id != g.id);
    ndm_array e = ndm_to(g, NDM_CPU);
    assert_live(e);
    assert_int_equal(ndm_array_dim(e, 0), 4);
    /* the output rule: a scope catches the copy */
    ndm_manager s = ndm_scope_begin(root, "s");
    ndm_array caught = ndm_to(ndm_ones(p.cpu, NDM_F32, NDM_SHAPE(3)), NDM_CUDA(0));
    assert_int_equal(ndm_array_manager(caught).id, s.id);
    assert_ok(ndm_scope_end(s, 0, NULL));
    if (ndm_cuda_device_count() > 1) {
        ndm_array x = ndm_arange(p.gpu, NDM_F64, 0, 1000, 0.5);
        ndm_array y = ndm_to(ndm_slice(x, 0, 1, NDM_END, 3), NDM_CUDA(1));
        assert_true(ndm_device_eq(ndm_array_device(y), NDM_CUDA(1)));
        assert_arrays_match(ndm_to(ndm_slice(x, 0, 1, NDM_END, 3), NDM_CPU), y, "peer copy");
    }
    assert_ok(ndm_device_synchronize(NDM_CUDA(0)));
    pair_close(p);
}

static void test_cuda_sticky_error_reported_by_every_call(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    ndm_array g = ndm_ones(p.gpu, NDM_F32, NDM_SHAPE(16));
    ndm_array c = ndm_ones(p.cpu, NDM_F32, NDM_SHAPE(16));
    assert_live(g);
    cuda_hooks()->set_sticky(0, true);

    assert_int_equal(ndm_device_synchronize(NDM_CUDA(0)), NDM_E_DEVICE);
    assert_error_has("cuda:0 failed asynchronously");
    assert_error_has("injected");
    float buf[16];
    assert_int_equal(ndm_array_copy_out(g, buf, sizeof buf), NDM_E_DEVICE);
    assert_error_has("cuda:0 failed asynchronously");
    assert_true(ndm_array_is_null(ndm_to(g, NDM_CPU)));
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("ndm_to");
    assert_error_has("cuda:0 failed asynchronously");
    assert_true(ndm_array_is_null(ndm_to(c, NDM_CUDA(0))));
    assert_int_equal(test_live_arrays(p.cpu) + test_live_arrays(p.gpu), 2);
    /* the CPU goes on */
    assert_ok(ndm_device_synchronize(NDM_CPU));
    assert_ok(ndm_array_copy_out(c, buf, sizeof buf));

    cuda_hooks()->set_sticky(0, false);
    assert_ok(ndm_device_synchronize(NDM_CUDA(0)));
    assert_ok(ndm_array_copy_out(g, buf, sizeof buf));
    assert_true(buf[15] == 1.0f);
    pair_close(p);
}

/* Runs in a child process: a real fault breaks the device for good. */
static int fault_child(void)
{
    ndm_manager m = ndm_manager_new_on(ndm_system(), "gpu", NDM_CUDA(0));
    ndm_array x = ndm_ones(m, NDM_F32, NDM_SHAPE(1024));
    float buf[1024];
    if (!x.id || ndm_array_copy_out(x, buf, sizeof buf) != NDM_OK) {
        printf("fault child: setup failed: %s\n", ndm_last_error());
        return 1;
    }
    if (cuda_hooks()->fault(0) != NDM_OK) {
        printf("fault child: the trapping launch itself failed: %s\n", ndm_last_error());
        return 1;
    }
    for (int round = 0; round < 2; round++) {
        ndm_status st = ndm_device_synchronize(NDM_CUDA(0));
        if (st != NDM_E_DEVICE || !strstr(ndm_last_error(), "cuda:0 failed asynchronously")) {
            printf("fault child: synchronize gave %s: %s\n", ndm_status_name(st), ndm_last_error());
            return 1;
        }
        st = ndm_array_copy_out(x, buf, sizeof buf);
        if (st != NDM_E_DEVICE || !strstr(ndm_last_error(), "cuda:0 failed asynchronously")) {
            printf("fault child: copy_out gave %s: %s\n", ndm_status_name(st), ndm_last_error());
            return 1;
        }
    }
    printf("fault child: %s\n", ndm_last_error());
    return 0;
}

static void test_cuda_fault_is_sticky_in_a_fresh_process(void **state)
{
    (void)state;
    NEED_GPU();
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* exec at once: CUDA state does not survive a fork */
        execl(self_path, self_path, "--fault-child", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- elementwise and random on the device ----------------------------------- */

/* The same expressions on the CPU and on the GPU, through the public API:
 * views (transposed, flipped with a step, broadcast rows) go to the kernels
 * as strides, in-place updates write their input, f16 storage converts on
 * the device; all of these operations are exact, so the bytes agree. */
static void test_cuda_elementwise_views_and_in_place_match_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const ndm_dtype dts[] = {NDM_F32, NDM_I32, NDM_F16, NDM_U8};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        ndm_array x[2], row[2], y[2], z[2], w[2], c[2];
        ndm_manager m[2] = {p.cpu, p.gpu};
        for (int d = 0; d < 2; d++) {
            x[d] = ndm_reshape(ndm_arange(m[d], dts[k], 0, 60, 1), NDM_SHAPE(6, 10));
            row[d] = ndm_arange(m[d], dts[k], 1, 7, 1);
            assert_live(x[d]);
            /* (10, 6) transposed view times a broadcast (6,) row, minus 3 */
            y[d] = ndm_sub_scalar_to(m[d], ndm_mul_to(m[d], ndm_transpose(x[d]), row[d]), 3.0);
            /* every other column, flipped, against 1.5 as the left operand */
            z[d] = ndm_rsub_scalar_to(m[d], ndm_slice(x[d], 1, NDM_END, NDM_END, -2), 1.5);
            c[d] = ndm_lt_to(m[d], ndm_transpose(x[d]), row[d]);
            w[d] = ndm_where_to(m[d], c[d], y[d], ndm_clamp_to(m[d], y[d], -4.0, 9.0));
            assert_live(w[d]);
            /* in place: x += x (the same array on both sides), then clamp */
            assert_ok(ndm_add_(x[d], x[d]));
            assert_ok(ndm_clamp_(x[d], 0.0, 30.0));
            /* in place through a flipped, stepped view */
            assert_ok(ndm_mul_scalar_(ndm_slice(x[d], 1, NDM_END, NDM_END, -2), 3.0));
        }
        assert_int_equal(ndm_array_device(y[1]).type, NDM_DEVICE_CUDA);
        assert_arrays_match(y[0], y[1], "transposed times broadcast row");
        assert_arrays_match(z[0], z[1], "scalar minus flipped view");
        assert_arrays_match(c[0], c[1], "comparison");
        assert_arrays_match(w[0], w[1], "where");
        assert_arrays_match(x[0], x[1], "in place");
    }
    pair_close(p);
}

/* A seeded draw on the GPU gives the CPU's bytes, for every distribution and
 * dtype, into fresh arrays and into a transposed view, and advances the
 * generator as far. */
static void test_cuda_random_draws_match_cpu_bit_for_bit(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const ndm_dtype floats[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    for (int k = 0; k < 4; k++) {
        ndm_rng rc = ndm_rng_new(1234 + (uint64_t)k), rg = rc;
        ndm_array uc = ndm_uniform(p.cpu, &rc, floats[k], -2.0, 3.0, NDM_SHAPE(37, 3));
        ndm_array ug = ndm_uniform(p.gpu, &rg, floats[k], -2.0, 3.0, NDM_SHAPE(37, 3));
        assert_arrays_match(uc, ug, "uniform");
        ndm_array nc = ndm_normal(p.cpu, &rc, floats[k], 0.3, 1.7, NDM_SHAPE(5, 7));
        ndm_array ng = ndm_normal(p.gpu, &rg, floats[k], 0.3, 1.7, NDM_SHAPE(5, 7));
        assert_arrays_match(nc, ng, "normal");
        /* into a transposed view of an existing array */
        ndm_array tc = ndm_zeros(p.cpu, floats[k], NDM_SHAPE(4, 9));
        ndm_array tg = ndm_zeros(p.gpu, floats[k], NDM_SHAPE(4, 9));
        assert_ok(ndm_normal_(ndm_transpose(tc), &rc, -1.1, 0.45));
        assert_ok(ndm_normal_(ndm_transpose(tg), &rg, -1.1, 0.45));
        assert_arrays_match(tc, tg, "normal into a transposed view");
        assert_memory_equal(&rc, &rg, sizeof rc);
    }
    ndm_rng rc = ndm_rng_new(99), rg = rc;
    static const ndm_dtype ints[] = {NDM_U8, NDM_I32, NDM_I64};
    for (int k = 0; k < 3; k++) {
        ndm_array ic = ndm_randint(p.cpu, &rc, ints[k], 0, 100, NDM_SHAPE(41));
        ndm_array ig = ndm_randint(p.gpu, &rg, ints[k], 0, 100, NDM_SHAPE(41));
        assert_arrays_match(ic, ig, "randint");
    }
    ndm_array wc = ndm_randint(p.cpu, &rc, NDM_I64, -((int64_t)1 << 50), (int64_t)1 << 50,
                               NDM_SHAPE(9));
    ndm_array wg = ndm_randint(p.gpu, &rg, NDM_I64, -((int64_t)1 << 50), (int64_t)1 << 50,
                               NDM_SHAPE(9));
    assert_arrays_match(wc, wg, "randint over a wide range");
    for (int k = 0; k < NDM_DTYPE_COUNT; k++) {
        ndm_array bc = ndm_bernoulli(p.cpu, &rc, all_dtypes[k], 0.4, NDM_SHAPE(3, 11));
        ndm_array bg = ndm_bernoulli(p.gpu, &rg, all_dtypes[k], 0.4, NDM_SHAPE(3, 11));
        assert_arrays_match(bc, bg, "bernoulli");
    }
    ndm_array pc = ndm_permutation(p.cpu, &rc, 300), pg = ndm_permutation(p.gpu, &rg, 300);
    assert_arrays_match(pc, pg, "permutation");
    assert_memory_equal(&rc, &rg, sizeof rc);
    pair_close(p);
}

/* The sampling calls through the public API: multinomial draws (with and
 * without replacement, each float dtype) equal the CPU's for the same seed,
 * and advance the generator alike; sort, argsort, topk, tril and triu of
 * the same data agree, and a refused row is named as on the CPU. */
static void test_cuda_sampling_ops_match_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const ndm_dtype floats[] = {NDM_F32, NDM_F64, NDM_F16, NDM_BF16};
    for (int k = 0; k < 4; k++) {
        ndm_rng rc = ndm_rng_new(4242 + (uint64_t)k), rg = rc, w = rc;
        ndm_array wc = ndm_uniform(p.cpu, &w, floats[k], 0.0, 2.0, NDM_SHAPE(7, 300));
        ndm_array wg = ndm_to_to(p.gpu, wc, NDM_CUDA(0));
        for (int repl = 0; repl < 2; repl++) {
            ndm_array dc = ndm_multinomial(wc, repl ? 500 : 40, repl, &rc);
            ndm_array dg = ndm_multinomial(wg, repl ? 500 : 40, repl, &rg);
            assert_true(ndm_array_device(dg).type == NDM_DEVICE_CUDA);
            assert_arrays_match(dc, dg, repl ? "multinomial" : "multinomial, no replacement");
            assert_memory_equal(&rc, &rg, sizeof rc);
        }
        ndm_array sc = ndm_sort(wc, 1, true), sg = ndm_sort(wg, 1, true);
        assert_arrays_match(sc, sg, "sort");
        ndm_array ac = ndm_argsort(wc, 0, false), ag = ndm_argsort(wg, 0, false);
        assert_arrays_match(ac, ag, "argsort");
        ndm_array vc, ic, vg, ig;
        assert_ok(ndm_topk(wc, 5, -1, true, &vc, &ic));
        assert_ok(ndm_topk(wg, 5, -1, true, &vg, &ig));
        assert_arrays_match(vc, vg, "topk values");
        assert_arrays_match(ic, ig, "topk indices");
        assert_arrays_match(ndm_tril(wc, 2), ndm_tril(wg, 2), "tril");
        assert_arrays_match(ndm_triu(ndm_transpose(wc), -1), ndm_triu(ndm_transpose(wg), -1),
                            "triu");
    }
    assert_arrays_match(ndm_tri(p.cpu, NDM_BOOL, 5, 6, 0), ndm_tri(p.gpu, NDM_BOOL, 5, 6, 0),
                        "tri");
    /* a refused row: the same message on both devices, the generator unchanged */
    float bad[6] = {1, 2, 3, 0, -1, 1};
    ndm_array bc = ndm_from_buffer(p.cpu, NDM_F32, bad, NDM_SHAPE(2, 3));
    ndm_array bg = ndm_to_to(p.gpu, bc, NDM_CUDA(0));
    ndm_rng r = ndm_rng_new(1), keep = r;
    uint64_t live_g = test_live_arrays(p.gpu);
    assert_true(ndm_array_is_null(ndm_multinomial(bc, 2, true, &r)));
    assert_error_has("entry 1 of row 1 of probs is negative");
    assert_true(ndm_array_is_null(ndm_multinomial(bg, 2, true, &r)));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("entry 1 of row 1 of probs is negative");
    assert_memory_equal(&r, &keep, sizeof r);
    assert_int_equal(test_live_arrays(p.gpu), live_g);
    pair_close(p);
}

/* ---- reductions and the index family through the public API ----------------- */

/* Elements of a CPU and a CUDA array (C order) equal, or within rtol for a
 * float dtype (summing order differs); NaN matches NaN. */
static void assert_arrays_close(ndm_array cpu, ndm_array gpu, double rtol, const char *what)
{
    assert_live(cpu);
    assert_live(gpu);
    ndm_dtype dt = ndm_array_dtype(cpu);
    assert_int_equal(dt, ndm_array_dtype(gpu));
    assert_int_equal(ndm_array_size(cpu), ndm_array_size(gpu));
    int64_t sc[8], sg[8];
    int nd = ndm_array_shape(cpu, sc, 8);
    assert_int_equal(ndm_array_shape(gpu, sg, 8), nd);
    for (int i = 0; i < nd; i++)
        assert_int_equal(sc[i], sg[i]);
    if (!ndm_dtype_is_float(dt) || rtol == 0) {
        assert_arrays_match(cpu, gpu, what);
        return;
    }
    size_t es = ndm_dtype_size(dt);
    char *w = copy_out(cpu), *g = copy_out(gpu);
    for (int64_t i = 0; i < ndm_array_size(cpu); i++) {
        double wv = element_as_double(dt, w + i * (int64_t)es);
        double gv = element_as_double(dt, g + i * (int64_t)es);
        bool ok = isnan(wv) ? isnan(gv)
                  : isinf(wv) ? gv == wv
                              : fabs(gv - wv) <= rtol * fabs(wv) + 1e-6;
        if (!ok)
            fail_msg("%s (%s): element %lld: CPU %.17g, CUDA %.17g", what, ndm_dtype_short(dt),
                     (long long)i, wv, gv);
    }
    test_free(w);
    test_free(g);
}

/* A (6, 40, 50) array of dtype dt on the CPU with many ties and a few
 * fractions; f16/bf16 keep every value exactly. */
static ndm_array pattern(ndm_manager m, ndm_dtype dt)
{
    enum { N = 6 * 40 * 50 };
    double *v = test_malloc(N * sizeof *v);
    for (int i = 0; i < N; i++)
        v[i] = (double)((i * 37) % 23 - 11) + (i % 5 == 0 ? 0.25 : 0.0);
    ndm_array a = ndm_astype_to(m, ndm_from_buffer(m, NDM_F64, v, NDM_SHAPE(6, 40, 50)), dt);
    test_free(v);
    assert_live(a);
    return a;
}

/* The views each case runs on: the array, its axes permuted (2, 0, 1) and
 * flipped along the last axis; the same on both devices. */
static ndm_array view_of(int k, ndm_array a)
{
    static const int perm[3] = {2, 0, 1};
    switch (k) {
    case 1: return ndm_permute(a, 3, perm);
    case 2: return ndm_flip(a, 2);
    default: return ndm_alias(a);
    }
}

static void test_cuda_reductions_match_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const ndm_dtype dts[] = {NDM_F32, NDM_F64, NDM_F16, NDM_I32, NDM_U8, NDM_BOOL};
    static const char *const vnames[3] = {"contiguous", "permuted", "flipped"};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        ndm_manager sc = ndm_scope_begin(p.cpu, "reductions");
        ndm_array xc = pattern(sc, dts[d]);
        ndm_array xg = ndm_to_to(p.gpu, xc, NDM_CUDA(0));
        assert_live(xg);
        for (int k = 0; k < 3; k++) {
            ndm_array vc = view_of(k, xc), vg = view_of(k, xg);
            /* axis sets: one axis, two apart, every axis (a long split) */
            static const int ax1[1] = {1}, ax2[2] = {0, 2};
            const int *sets[3] = {ax1, ax2, NULL};
            const int ns[3] = {1, 2, -1};
            for (int a = 0; a < 3; a++) {
                bool kd = a == 1;
                char what[96];
#define NDM__RED_PAIR(name, call_c, call_g, tol)                                \
    do {                                                                        \
        snprintf(what, sizeof what, "%s over set %d of a %s view", name, a, vnames[k]); \
        ndm_array rc = call_c, rg = call_g;                                     \
        assert_true(ndm_array_device(rg).type == NDM_DEVICE_CUDA);              \
        assert_arrays_close(rc, rg, tol, what);                                 \
    } while (0)
                NDM__RED_PAIR("sum", ndm_sum(vc, kd, ns[a], sets[a]),
                              ndm_sum(vg, kd, ns[a], sets[a]), 1e-5);
                NDM__RED_PAIR("mean", ndm_mean(vc, kd, ns[a], sets[a]),
                              ndm_mean(vg, kd, ns[a], sets[a]), 1e-5);
                NDM__RED_PAIR("var", ndm_var(vc, 1, kd, ns[a], sets[a]),
                              ndm_var(vg, 1, kd, ns[a], sets[a]), 1e-4);
                NDM__RED_PAIR("std", ndm_std(vc, 0, kd, ns[a], sets[a]),
                              ndm_std(vg, 0, kd, ns[a], sets[a]), 1e-4);
                NDM__RED_PAIR("max", ndm_max(vc, kd, ns[a], sets[a]),
                              ndm_max(vg, kd, ns[a], sets[a]), 0);
                NDM__RED_PAIR("min", ndm_min(vc, kd, ns[a], sets[a]),
                              ndm_min(vg, kd, ns[a], sets[a]), 0);
                NDM__RED_PAIR("all", ndm_all(vc, kd, ns[a], sets[a]),
                              ndm_all(vg, kd, ns[a], sets[a]), 0);
                NDM__RED_PAIR("any", ndm_any(vc, kd, ns[a], sets[a]),
                              ndm_any(vg, kd, ns[a], sets[a]), 0);
                NDM__RED_PAIR("logsumexp", ndm_logsumexp(vc, kd, ns[a], sets[a]),
                              ndm_logsumexp(vg, kd, ns[a], sets[a]), 1e-5);
                if (!ndm_dtype_is_float(dts[d]) && dts[d] != NDM_BOOL)
                    NDM__RED_PAIR("prod", ndm_prod(vc, kd, ns[a], sets[a]),
                                  ndm_prod(vg, kd, ns[a], sets[a]), 0);
            }
            for (int axis = -1; axis < 3; axis++) {
                int ax = axis < 0 ? NDM_ALL_AXES : axis;
                char what[96];
                int a = axis;
                NDM__RED_PAIR("argmax", ndm_argmax(vc, ax, false), ndm_argmax(vg, ax, false), 0);
                NDM__RED_PAIR("argmin", ndm_argmin(vc, ax, true), ndm_argmin(vg, ax, true), 0);
                if (axis >= 0) {
                    NDM__RED_PAIR("softmax", ndm_softmax(vc, ax), ndm_softmax(vg, ax), 1e-5);
                    NDM__RED_PAIR("log_softmax", ndm_log_softmax(vc, ax),
                                  ndm_log_softmax(vg, ax), 1e-5);
                }
            }
#undef NDM__RED_PAIR
        }
        assert_ok(ndm_scope_end(sc, 0, NULL));
        assert_ok(ndm_array_release(xg));
    }
    pair_close(p);
}

/* A reduction or softmax of a strided view creates its result and nothing
 * else on the device: the kernels take the strides. */
static void test_cuda_reduction_of_a_view_makes_no_copy(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    ndm_array xc = pattern(p.cpu, NDM_F32);
    ndm_array xg = ndm_to_to(p.gpu, xc, NDM_CUDA(0));
    static const int perm[3] = {2, 0, 1};
    ndm_array vg = ndm_flip(ndm_permute(xg, 3, perm), 1);
    assert_live(vg);
    ndm_stats before, after;
    assert_ok(ndm_manager_stats(p.gpu, NDM_CUDA(0), 0, &before));
    ndm_array s = ndm_sum(vg, false, NDM_AXES(0, 2));
    ndm_array m = ndm_softmax(vg, 1);
    ndm_array c = ndm_cumsum(vg, 2);
    assert_live(s);
    assert_live(m);
    assert_live(c);
    assert_ok(ndm_manager_stats(p.gpu, NDM_CUDA(0), 0, &after));
    assert_int_equal(after.created - before.created, 3);
    assert_int_equal(after.live_bytes - before.live_bytes,
                     ndm_array_nbytes(s) + ndm_array_nbytes(m) + ndm_array_nbytes(c));
    pair_close(p);
}

static void test_cuda_index_ops_match_cpu(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    static const ndm_dtype dts[] = {NDM_F32, NDM_I64, NDM_F16, NDM_U8, NDM_BOOL};
    static const char *const vnames[3] = {"contiguous", "permuted", "flipped"};
    int64_t iv[7] = {3, -1, 0, 3, 5, -6, 2};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        ndm_manager sc = ndm_scope_begin(p.cpu, "index");
        ndm_array xc = pattern(sc, dts[d]);
        ndm_array xg = ndm_to_to(p.gpu, xc, NDM_CUDA(0));
        ndm_array ic = ndm_from_buffer(sc, NDM_I64, iv, NDM_SHAPE(7));
        ndm_array ig = ndm_to_to(p.gpu, ic, NDM_CUDA(0));
        ndm_array i32c = ndm_astype(ic, NDM_I32);
        ndm_array i32g = ndm_to_to(p.gpu, i32c, NDM_CUDA(0));
        assert_live(xg);
        assert_live(ig);
        assert_live(i32g);
        for (int k = 0; k < 3; k++) {
            ndm_array vc = view_of(k, xc), vg = view_of(k, xg);
            char what[96];
#define NDM__IX_PAIR(name, call_c, call_g)                                      \
    do {                                                                        \
        snprintf(what, sizeof what, "%s of a %s view", name, vnames[k]);        \
        ndm_array rc = call_c, rg = call_g;                                     \
        assert_true(ndm_array_device(rg).type == NDM_DEVICE_CUDA);              \
        assert_arrays_match(rc, rg, what);                                      \
    } while (0)
            /* joins convert: a second operand of another dtype */
            ndm_array oc = ndm_astype(ndm_slice(vc, 1, 0, 3, 1), NDM_F64);
            ndm_array og = ndm_to_to(p.gpu, oc, NDM_CUDA(0));
            NDM__IX_PAIR("concat", ndm_concat(1, NDM_ARRAYS(vc, oc, vc)),
                         ndm_concat(1, NDM_ARRAYS(vg, og, vg)));
            NDM__IX_PAIR("stack", ndm_stack(2, NDM_ARRAYS(vc, vc)),
                         ndm_stack(2, NDM_ARRAYS(vg, vg)));
            ndm_array pc[2], pg[2];
            assert_ok(ndm_split(vc, 0, 2, pc));
            assert_ok(ndm_split(vg, 0, 2, pg));
            NDM__IX_PAIR("split", ndm_copy(pc[1]), ndm_copy(pg[1]));
            NDM__IX_PAIR("flip", ndm_copy(ndm_flip(vc, 1)), ndm_copy(ndm_flip(vg, 1)));
            NDM__IX_PAIR("tile", ndm_tile(vc, NDM_SHAPE(2, 1, 3)), ndm_tile(vg, NDM_SHAPE(2, 1, 3)));
            NDM__IX_PAIR("repeat", ndm_repeat(vc, 2, 3), ndm_repeat(vg, 2, 3));
            NDM__IX_PAIR("take", ndm_take(vc, 1, ic), ndm_take(vg, 1, ig));
            NDM__IX_PAIR("take with i32 indices", ndm_take(vc, 2, i32c), ndm_take(vg, 2, i32g));
            NDM__IX_PAIR("index_select", ndm_index_select(vc, 1, ic),
                         ndm_index_select(vg, 1, ig));
            /* gather and scatter_add with a (n0, n1, 7) index of repeated targets */
            int64_t sh[3];
            assert_int_equal(ndm_array_shape(vc, sh, 3), 3);
            ndm_array gic = ndm_astype(ndm_tile(ndm_reshape(ic, NDM_SHAPE(1, 1, 7)),
                                                NDM_SHAPE(sh[0], sh[1], 1)),
                                       NDM_I64);
            ndm_array gig = ndm_to_to(p.gpu, gic, NDM_CUDA(0));
            NDM__IX_PAIR("gather", ndm_gather(vc, 2, gic), ndm_gather(vg, 2, gig));
            ndm_array srcc = ndm_slice(vc, 2, 0, 7, 1), srcg = ndm_slice(vg, 2, 0, 7, 1);
            if (dts[d] != NDM_BOOL) {
                NDM__IX_PAIR("scatter_add", ndm_scatter_add(vc, 2, gic, srcc),
                             ndm_scatter_add(vg, 2, gig, srcg));
                ndm_array tc = ndm_copy(vc), tg = ndm_copy(vg);
                assert_ok(ndm_scatter_add_(tc, 2, gic, srcc));
                assert_ok(ndm_scatter_add_(tg, 2, gig, srcg));
                NDM__IX_PAIR("scatter_add in place", tc, tg);
            }
            NDM__IX_PAIR("pad constant", ndm_pad(vc, NDM_PAD_CONSTANT, 7.0, NDM_SHAPE(1, 2)),
                         ndm_pad(vg, NDM_PAD_CONSTANT, 7.0, NDM_SHAPE(1, 2)));
            NDM__IX_PAIR("pad edge", ndm_pad(vc, NDM_PAD_EDGE, 0.0, NDM_SHAPE(0, 1, 2, 0, 3, 3)),
                         ndm_pad(vg, NDM_PAD_EDGE, 0.0, NDM_SHAPE(0, 1, 2, 0, 3, 3)));
            NDM__IX_PAIR("pad reflect",
                         ndm_pad(vc, NDM_PAD_REFLECT, 0.0, NDM_SHAPE(7, 8, 1, 1, 0, 2)),
                         ndm_pad(vg, NDM_PAD_REFLECT, 0.0, NDM_SHAPE(7, 8, 1, 1, 0, 2)));
            for (int axis = 0; axis < 3; axis++) {
                NDM__IX_PAIR("cumsum", ndm_cumsum(vc, axis), ndm_cumsum(vg, axis));
                NDM__IX_PAIR("cumprod", ndm_cumprod(vc, axis), ndm_cumprod(vg, axis));
            }
            /* sizes that depend on the data: the count is read back */
            NDM__IX_PAIR("nonzero", ndm_nonzero(vc), ndm_nonzero(vg));
            ndm_array mc = ndm_gt_scalar(ndm_slice(vc, 0, 0, 1, 1), 1.0);
            ndm_array mg = ndm_to_to(p.gpu, mc, NDM_CUDA(0));
            NDM__IX_PAIR("masked_select with a broadcast mask", ndm_masked_select(vc, mc),
                         ndm_masked_select(vg, mg));
            NDM__IX_PAIR("nonzero of a broadcast mask",
                         ndm_nonzero(ndm_expand(mc, NDM_SHAPE(sh[0], sh[1], sh[2]))),
                         ndm_nonzero(ndm_expand(mg, NDM_SHAPE(sh[0], sh[1], sh[2]))));
            ndm_array jc = ndm_reshape(ndm_slice(i32c, 0, 0, 2, 1), NDM_SHAPE(2, 1));
            ndm_array jg = ndm_to_to(p.gpu, jc, NDM_CUDA(0));
            ndm_array kc = ndm_astype(ndm_clamp(ic, -3.0, 2.0), NDM_I64);
            ndm_array kg = ndm_to_to(p.gpu, kc, NDM_CUDA(0));
            NDM__IX_PAIR("index on two axes", ndm_index(vc, NDM_ARRAYS(jc, kc)),
                         ndm_index(vg, NDM_ARRAYS(jg, kg)));
#undef NDM__IX_PAIR
        }
        char what[64];
        snprintf(what, sizeof what, "one_hot into %s", ndm_dtype_short(dts[d]));
        ndm_array hc = ndm_one_hot(ndm_reshape(ndm_astype(ndm_abs(ic), NDM_U8), NDM_SHAPE(7, 1)),
                                   7, dts[d]);
        ndm_array ug = ndm_to_to(p.gpu, ndm_reshape(ndm_astype(ndm_abs(ic), NDM_U8),
                                                    NDM_SHAPE(7, 1)), NDM_CUDA(0));
        assert_arrays_match(hc, ndm_one_hot(ug, 7, dts[d]), what);
        assert_ok(ndm_scope_end(sc, 0, NULL));
        assert_ok(ndm_manager_close(p.gpu));
        p.gpu = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(0));
        assert_live(p.gpu);
    }
    pair_close(p);
}

/* The data-sized selections on a device: an operand on the other device is
 * refused before anything is made, an index out of range is named as on
 * the CPU, and the results (the count read back) match the CPU's. */
static void test_cuda_selection_checks_devices_and_ranges(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    float xv[6] = {0, 1.5f, 0, -2, 0, 3};
    uint8_t mv[3] = {1, 0, 1};
    int64_t iv[2] = {1, -2}, jv[2] = {0, 3};
    ndm_array xc = ndm_from_buffer(p.cpu, NDM_F32, xv, NDM_SHAPE(2, 3));
    ndm_array mc = ndm_from_buffer(p.cpu, NDM_BOOL, mv, NDM_SHAPE(3));
    ndm_array ic = ndm_from_buffer(p.cpu, NDM_I64, iv, NDM_SHAPE(2));
    ndm_array jc = ndm_from_buffer(p.cpu, NDM_I64, jv, NDM_SHAPE(2));
    ndm_array xg = ndm_to_to(p.gpu, xc, NDM_CUDA(0));
    ndm_array mg = ndm_to_to(p.gpu, mc, NDM_CUDA(0));
    ndm_array ig = ndm_to_to(p.gpu, ic, NDM_CUDA(0));
    ndm_array jg = ndm_to_to(p.gpu, jc, NDM_CUDA(0));
    assert_live(jg);
    uint64_t live_c = test_live_arrays(p.cpu), live_g = test_live_arrays(p.gpu);
    assert_true(ndm_array_is_null(ndm_masked_select(xg, mc)));
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("is on cuda:0 but");
    assert_true(ndm_array_is_null(ndm_index(xg, NDM_ARRAYS(ic))));
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("is on cpu");
    assert_true(ndm_array_is_null(ndm_index(xg, NDM_ARRAYS(ig, jg))));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("index 3 at [1] of the indices is out of range for axis 1 of size 3");
    assert_int_equal(test_live_arrays(p.cpu), live_c);
    assert_int_equal(test_live_arrays(p.gpu), live_g);
    /* torch.masked_select(x, m) == [0, 0, -2, 3]; np.argwhere(x) == [[0, 1], [1, 0], [1, 2]] */
    ndm_array sg = ndm_masked_select(xg, mg);
    ndm_array ng = ndm_nonzero(xg);
    assert_true(ndm_array_device(sg).type == NDM_DEVICE_CUDA);
    assert_arrays_match(ndm_masked_select(xc, mc), sg, "masked_select");
    assert_arrays_match(ndm_nonzero(xc), ng, "nonzero");
    int64_t got[6];
    assert_int_equal(ndm_array_size(ng), 6);
    assert_ok(ndm_array_copy_out(ndm_to_to(p.cpu, ng, NDM_CPU), got, sizeof got));
    assert_true(got[0] == 0 && got[1] == 1 && got[2] == 1 && got[3] == 0 && got[4] == 1 &&
                got[5] == 2);
    /* more chunks of positions than the scan has threads, several per thread */
    ndm_array big = ndm_gt_scalar(ndm_sin(ndm_arange(p.cpu, NDM_F32, 0, 150001, 1)), 0.9);
    ndm_array bigg = ndm_to_to(p.gpu, big, NDM_CUDA(0));
    assert_live(bigg);
    assert_arrays_match(ndm_nonzero(big), ndm_nonzero(bigg), "nonzero of 150001 entries");
    pair_close(p);
}

/* The losses' label range is checked on the device too: a negative label
 * is refused with its value and position, not taken as the last class. */
static void test_cuda_loss_label_out_of_range_is_refused(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    ndm_array logits = ndm_zeros(p.gpu, NDM_F32, NDM_SHAPE(4, 5));
    int64_t v[4] = {0, 2, -1, 4};
    ndm_array lg = ndm_to_to(p.gpu, ndm_from_buffer(p.cpu, NDM_I64, v, NDM_SHAPE(4)),
                             NDM_CUDA(0));
    assert_live(logits);
    assert_live(lg);
    uint64_t live = test_live_arrays(p.gpu);
    assert_int_equal(ndm_cross_entropy(logits, lg).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("label -1 at position 2 is outside [0, 5)");
    assert_int_equal(ndm_nll_loss(logits, ndm_astype(lg, NDM_I32)).id, 0);
    assert_error_has("label -1 at position 2 is outside [0, 5)");
    assert_int_equal(test_live_arrays(p.gpu), live + 1); /* the i32 copy only */
    ndm_clear_error();
    int64_t ok[4] = {0, 2, 1, 4};
    ndm_array og = ndm_to_to(p.gpu, ndm_from_buffer(p.cpu, NDM_I64, ok, NDM_SHAPE(4)),
                             NDM_CUDA(0));
    double ce;
    assert_ok(ndm_item(ndm_cross_entropy(logits, og), &ce));
    assert_true(fabs(ce - log(5.0)) < 1e-6);
    pair_close(p);
}

/* PyTorch's ignore_index on the device: the ignored rows' losses and
 * gradients are masked there, the mean is over the others (all ignored:
 * NaN), and the values and gradients are PyTorch's
 * (tests/data/make_cross_entropy_ignore.py); -1 is still refused. */
static void test_cuda_loss_ignored_labels_match_pytorch(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    for (size_t k = 0; k < sizeof ce_ignore_cases / sizeof *ce_ignore_cases; k++) {
        ndm_manager batch = ndm_manager_new(p.gpu, "batch");
        ndm_array x = ndm_to_to(batch, ndm_from_buffer(p.cpu, NDM_F32, (float *)ce_ignore_logits,
                                                       NDM_SHAPE(CE_IGNORE_N, CE_IGNORE_C)),
                                NDM_CUDA(0));
        ndm_array l = ndm_to_to(batch, ndm_from_buffer(p.cpu, NDM_I64,
                                                       (int64_t *)ce_ignore_cases[k].labels,
                                                       NDM_SHAPE(CE_IGNORE_N)),
                                NDM_CUDA(0));
        assert_live(x);
        assert_live(l);
        assert_ok(ndm_requires_grad(x));
        assert_ok(ndm_grad_begin(batch));
        int64_t ig = ce_ignore_cases[k].ignore_index;
        ndm_array loss = ce_ignore_cases[k].nll ? ndm_nll_loss_ex(x, l, ig)
                                                : ndm_cross_entropy_ex(x, l, ig);
        assert_live(loss);
        assert_true(ndm_array_device(loss).type == NDM_DEVICE_CUDA);
        assert_ok(ndm_backward(loss));
        assert_ok(ndm_grad_end());
        double v, want = ce_ignore_cases[k].loss;
        assert_ok(ndm_item(loss, &v));
        if (isnan(want) ? !isnan(v) : fabs(v - want) > 1e-6 * (1 + fabs(want)))
            fail_msg("%s: loss %.9g on the device, PyTorch %.9g", ce_ignore_cases[k].name, v,
                     want);
        float g[CE_IGNORE_N * CE_IGNORE_C];
        assert_ok(ndm_array_copy_out(ndm_grad(x), g, sizeof g));
        for (int i = 0; i < CE_IGNORE_N * CE_IGNORE_C; i++)
            if (fabsf(g[i] - ce_ignore_cases[k].grad[i]) > 1e-6f)
                fail_msg("%s: gradient %d is %.9g on the device, PyTorch %.9g",
                         ce_ignore_cases[k].name, i, g[i], ce_ignore_cases[k].grad[i]);
        assert_ok(ndm_manager_close(batch));
    }
    int64_t bad[4] = {0, -100, -1, 4};
    ndm_array logits = ndm_zeros(p.gpu, NDM_F32, NDM_SHAPE(4, 5));
    ndm_array lg = ndm_to_to(p.gpu, ndm_from_buffer(p.cpu, NDM_I64, bad, NDM_SHAPE(4)),
                             NDM_CUDA(0));
    assert_live(logits);
    assert_live(lg);
    uint64_t live = test_live_arrays(p.gpu);
    assert_int_equal(ndm_cross_entropy(logits, lg).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("label -1 at position 2 is outside [0, 5) (the classes of the scores) and "
                     "is not the ignored label -100");
    assert_int_equal(test_live_arrays(p.gpu), live);
    ndm_clear_error();
    pair_close(p);
}

/* An index out of range is found on the device and named with its position
 * and value; nothing is created and the managers are intact. */
static void test_cuda_take_out_of_range_index_fails_cleanly(void **state)
{
    NEED_GPU();
    pair p = pair_new(ROOT(state));
    ndm_array xg = ndm_arange(p.gpu, NDM_F32, 0, 20, 1);
    int32_t iv[6] = {1, 2, -20, 19, 20, -21};
    ndm_array ig = ndm_to_to(p.gpu, ndm_from_buffer(p.cpu, NDM_I32, iv, NDM_SHAPE(2, 3)),
                             NDM_CUDA(0));
    assert_live(xg);
    assert_live(ig);
    ndm_stats before, after;
    assert_ok(ndm_manager_stats(p.gpu, NDM_CUDA(0), 0, &before));
    ndm_array r = ndm_take(xg, 0, ig);
    assert_int_equal(r.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    const char *msg = ndm_last_error();
    /* the first one in C order: 20 at [1,1], not -21 after it */
    assert_non_null(strstr(msg, "index 20 at [1,1]"));
    assert_ok(ndm_manager_stats(p.gpu, NDM_CUDA(0), 0, &after));
    assert_int_equal(after.live_arrays, before.live_arrays);
    assert_int_equal(after.live_bytes, before.live_bytes);
    ndm_clear_error();
    /* the device goes on: the same take with the index in range */
    int32_t ok[6] = {1, 2, -20, 19, 0, -1};
    ndm_array og = ndm_to_to(p.gpu, ndm_from_buffer(p.cpu, NDM_I32, ok, NDM_SHAPE(2, 3)),
                             NDM_CUDA(0));
    float got[6];
    assert_ok(ndm_array_copy_out(ndm_take(xg, 0, og), got, sizeof got));
    assert_true(got[0] == 1 && got[1] == 2 && got[2] == 0 && got[3] == 19 && got[4] == 0 &&
                got[5] == 19);
    pair_close(p);
}

/* The gradient of sum(f(x)^2) for f through reductions, softmax and the
 * index family, on CUDA against the CPU. Backward needs the elementwise
 * family as well: skipped while the CUDA table lacks it. */
static ndm_array ag_f(int k, ndm_array x, ndm_array idx, ndm_array gidx)
{
    switch (k) {
    case 0: return ndm_sum(x, false, NDM_AXES(1));
    case 1: return ndm_mean(x, true, NDM_AXES(0));
    case 2: return ndm_max(x, false, NDM_AXES(1));
    case 3: return ndm_min(x, false, NDM_ALL_AXES_LIST);
    case 4: return ndm_logsumexp(x, false, NDM_AXES(0));
    case 5: return ndm_softmax(x, 1);
    case 6: return ndm_log_softmax(x, 0);
    case 7: return ndm_take(x, 1, idx);
    case 8: return ndm_gather(x, 1, gidx);
    case 9: return ndm_concat(0, NDM_ARRAYS(x, ndm_flip(x, 1)));
    default: return ndm_stack(1, NDM_ARRAYS(x, x));
    }
}

static void ag_grad(ndm_manager root, ndm_device dev, int k, float *out)
{
    static const int64_t iv[6] = {0, 4, 4, -1, 2, 0};
    static const int64_t gv[12] = {1, 1, 0, 4, 3, 2, 2, 2, 0, 0, 4, 1};
    ndm_manager model = ndm_manager_new_on(root, "model", dev);
    ndm_manager host = ndm_manager_new(root, "host");
    float xv[15];
    for (int i = 0; i < 15; i++)
        xv[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    ndm_array x = ndm_to_to(model, ndm_from_buffer(host, NDM_F32, xv, NDM_SHAPE(3, 5)), dev);
    ndm_array idx = ndm_to_to(model, ndm_from_buffer(host, NDM_I64, iv, NDM_SHAPE(6)), dev);
    ndm_array gidx = ndm_to_to(model, ndm_from_buffer(host, NDM_I64, gv, NDM_SHAPE(3, 4)), dev);
    assert_live(x);
    assert_ok(ndm_requires_grad(x));
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_array y = ag_f(k, x, idx, gidx);
    ndm_array loss = ndm_sum(ndm_mul(y, y), false, NDM_ALL_AXES_LIST);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_array_copy_out(ndm_grad(x), out, 15 * sizeof(float)));
    assert_ok(ndm_manager_close(host));
    assert_ok(ndm_manager_close(model));
}

static void test_cuda_autograd_through_reductions_and_index(void **state)
{
    NEED_GPU();
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (!b || !b->ew) {
        print_message("the CUDA backend has no elementwise family: skipped\n");
        skip();
    }
    for (int k = 0; k < 11; k++) {
        float gc[15], gg[15];
        ag_grad(ROOT(state), NDM_CPU, k, gc);
        ag_grad(ROOT(state), NDM_CUDA(0), k, gg);
        for (int i = 0; i < 15; i++)
            if (!(fabsf(gc[i] - gg[i]) <= 1e-5f * fabsf(gc[i]) + 1e-6f))
                fail_msg("function %d: gradient element %d: CPU %.9g, CUDA %.9g", k, i, gc[i],
                         gg[i]);
    }
}

/* The blocks of a network through autograd on a device: the gradient of
 * sum(y * y) for y = sdpa (causal, with a padding mask), rms_norm, sort,
 * topk and tril of one x [2, 3, 4], on the CPU and on CUDA. */
static ndm_array block_f(int k, ndm_array x, ndm_manager host, ndm_device dev)
{
    ndm_array v = NDM_NULL_ARRAY;
    switch (k) {
    case 0: {
        ndm_array q = ndm_reshape(x, NDM_SHAPE(1, 2, 3, 4));
        ndm_array pad = ndm_to_to(host, ndm_from_buffer(host, NDM_BOOL, ((uint8_t[]){1, 1, 0}),
                                                        NDM_SHAPE(3)), dev);
        return ndm_sdpa(q, ndm_mul_scalar(q, 0.5), ndm_sin(q), pad, true, 0);
    }
    case 1: {
        ndm_array w = ndm_to_to(host, ndm_from_buffer(host, NDM_F32, ((float[]){0.5f, 1, 1.5f, 2}),
                                                      NDM_SHAPE(4)), dev);
        return ndm_rms_norm(x, w, 1e-5);
    }
    case 2: return ndm_sort(x, -1, true);
    case 3: return ndm_topk(x, 2, 1, true, &v, NULL) == NDM_OK ? v : NDM_NULL_ARRAY;
    default: return ndm_triu(ndm_tril(x, 1), -1);
    }
}

static void block_grad(ndm_manager root, ndm_device dev, int k, float *out)
{
    ndm_manager model = ndm_manager_new_on(root, "model", dev);
    ndm_manager host = ndm_manager_new(root, "host");
    float xv[24];
    for (int i = 0; i < 24; i++)
        xv[i] = (float)((i * 7) % 13) * 0.25f - 1.5f + (float)i * 0.01f;
    ndm_array x = ndm_to_to(model, ndm_from_buffer(host, NDM_F32, xv, NDM_SHAPE(2, 3, 4)), dev);
    assert_live(x);
    assert_ok(ndm_requires_grad(x));
    ndm_manager batch = ndm_manager_new(model, "batch");
    assert_ok(ndm_grad_begin(batch));
    ndm_array y = block_f(k, x, host, dev);
    assert_true(ndm_array_device(y).type == dev.type);
    ndm_array loss = ndm_sum(ndm_mul(y, y), false, NDM_ALL_AXES_LIST);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_array_copy_out(ndm_to_to(host, ndm_grad(x), NDM_CPU), out, 24 * sizeof(float)));
    assert_ok(ndm_manager_close(host));
    assert_ok(ndm_manager_close(model));
}

static void test_cuda_network_blocks_gradients_match_cpu(void **state)
{
    NEED_GPU();
    for (int k = 0; k < 5; k++) {
        float gc[24], gg[24];
        block_grad(ROOT(state), NDM_CPU, k, gc);
        block_grad(ROOT(state), NDM_CUDA(0), k, gg);
        for (int i = 0; i < 24; i++)
            if (!(fabsf(gc[i] - gg[i]) <= 1e-5f * fabsf(gc[i]) + 1e-6f))
                fail_msg("block %d: gradient element %d: CPU %.9g, CUDA %.9g", k, i, gc[i],
                         gg[i]);
    }
}

/* ---- convolution, pooling and matmul through the API ----------------------- */

/* A small convolutional net's forward and its gradients, on the device of
 * manager `m`: x (2, 3, 8, 8) through conv 3x3 (padding 1), max pool 2x2, a
 * grouped conv 3x3, avg pool 3x3 (stride 1, padding 1), a flattening
 * reshape and a matmul; the backward pass starts from a fixed gradient of
 * the output. out and the gradients of x, w1, w2 and w3 come back as f64,
 * in that order, each `len` long, into res. The forward with a bias (no
 * gradient) comes back as the sixth. */
enum { NET_PARTS = 6 };
static const int64_t net_len[NET_PARTS] = {2 * 5, 2 * 3 * 8 * 8, 4 * 3 * 3 * 3, 6 * 2 * 3 * 3,
                                           96 * 5, 2 * 4 * 8 * 8};

static ndm_array net_param(ndm_manager model, ndm_device dev, ndm_dtype dt, int nd,
                           const int64_t *shape, uint64_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    double *v = test_malloc((size_t)n * sizeof *v);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (double)(s >> 11) * 0x1p-53 * 2.0 - 1.0;
    }
    ndm_manager sc = ndm_scope_begin(model, "init");
    ndm_array h = ndm_astype(ndm_from_buffer(sc, NDM_F64, v, nd, shape), dt);
    ndm_array a = ndm_to_to(model, h, dev);
    assert_live(a);
    assert_ok(ndm_scope_end(sc, 0, NULL));
    test_free(v);
    return a;
}

static void net_read(ndm_array a, double *out, int64_t n)
{
    ndm_array d = ndm_astype(a, NDM_F64);
    assert_live(d);
    assert_int_equal(ndm_array_size(d), n);
    assert_ok(ndm_array_copy_out(d, out, (size_t)n * sizeof *out));
}

/* The net's gradients by the public gradient functions, layer by layer
 * (the chain rule written out), or by autograd (`tape`), whose accumulation
 * into the parameters' gradients also needs the elementwise family. */
static void net_run(ndm_manager root, ndm_device dev, ndm_dtype dt, bool tape, double **res)
{
    ndm_manager model = ndm_manager_new_on(root, "model", dev);
    assert_live(model);
    ndm_array x = net_param(model, dev, dt, 4, (const int64_t[]){2, 3, 8, 8}, 1);
    ndm_array w1 = net_param(model, dev, dt, 4, (const int64_t[]){4, 3, 3, 3}, 2);
    ndm_array w2 = net_param(model, dev, dt, 4, (const int64_t[]){6, 2, 3, 3}, 3);
    ndm_array w3 = net_param(model, dev, dt, 2, (const int64_t[]){96, 5}, 4);
    ndm_array b1 = net_param(model, dev, dt, 1, (const int64_t[]){4}, 5);
    ndm_array g = net_param(model, dev, dt, 2, (const int64_t[]){2, 5}, 6);
    ndm_array params[4] = {x, w1, w2, w3};
    const ndm_conv2d_opts *c1 = NDM_CONV2D(.padding = {1, 1});
    const ndm_conv2d_opts *c2 = NDM_CONV2D(.padding = {1, 1}, .groups = 2);
    const ndm_pool2d_opts *p1 = NDM_POOL2D(.kernel = {2, 2});
    const ndm_pool2d_opts *p2 = NDM_POOL2D(.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1});
    ndm_manager batch = ndm_manager_new(model, "batch");
    if (tape) {
        for (int i = 0; i < 4; i++)
            assert_ok(ndm_requires_grad(params[i]));
        assert_ok(ndm_grad_begin(batch));
    }
    ndm_manager s = ndm_scope_begin(batch, "forward");
    ndm_array h1 = ndm_conv2d(x, w1, c1);
    ndm_array q1 = ndm_max_pool2d(h1, p1);
    ndm_array h2 = ndm_conv2d(q1, w2, c2);
    ndm_array q2 = ndm_avg_pool2d(h2, true, p2);
    ndm_array f = ndm_reshape(q2, NDM_SHAPE(2, 96));
    ndm_array out = ndm_matmul(f, w3);
    assert_live(out);
    assert_int_equal(ndm_array_device(out).type, dev.type);
    ndm_array grads[4];
    if (tape) {
        assert_ok(ndm_scope_end(s, 1, &out));
        assert_ok(ndm_backward_with(out, g));
        assert_ok(ndm_grad_end());
        s = ndm_scope_begin(batch, "read");
        for (int i = 0; i < 4; i++)
            grads[i] = ndm_grad(params[i]);
    } else {
        /* matmul's gradients take the transposes as views */
        grads[3] = ndm_matmul(ndm_transpose(f), g);
        ndm_array dq2 = ndm_reshape(ndm_matmul(g, ndm_transpose(w3)), NDM_SHAPE(2, 6, 4, 4));
        ndm_array dh2 = ndm_avg_pool2d_backward(dq2, true, p2, NDM_SHAPE(2, 6, 4, 4));
        grads[2] = ndm_conv2d_backward_weight(dh2, q1, c2, NDM_SHAPE(6, 2, 3, 3));
        ndm_array dq1 = ndm_conv2d_backward_input(dh2, w2, c2, NDM_SHAPE(2, 4, 4, 4));
        ndm_array dh1 = ndm_max_pool2d_backward(dq1, h1, p1);
        grads[1] = ndm_conv2d_backward_weight(dh1, x, c1, NDM_SHAPE(4, 3, 3, 3));
        grads[0] = ndm_conv2d_backward_input(dh1, w1, c1, NDM_SHAPE(2, 3, 8, 8));
    }
    net_read(out, res[0], net_len[0]);
    for (int i = 0; i < 4; i++) {
        assert_live(grads[i]);
        assert_int_equal(ndm_array_device(grads[i]).type, dev.type);
        net_read(grads[i], res[1 + i], net_len[1 + i]);
    }
    net_read(ndm_conv2d_bias(x, w1, b1, c1), res[5], net_len[5]);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(model));
}

static void net_compare(ndm_manager root, bool tape)
{
    static const char *const names[NET_PARTS] = {"output", "d x", "d w1", "d w2", "d w3",
                                                 "conv2d with bias"};
    static const ndm_dtype dts[2] = {NDM_F32, NDM_F64};
    for (int d = 0; d < 2; d++) {
        double *cpu[NET_PARTS], *gpu[NET_PARTS];
        for (int i = 0; i < NET_PARTS; i++) {
            cpu[i] = test_malloc((size_t)net_len[i] * sizeof(double));
            gpu[i] = test_malloc((size_t)net_len[i] * sizeof(double));
        }
        net_run(root, NDM_CPU, dts[d], tape, cpu);
        net_run(root, NDM_CUDA(0), dts[d], tape, gpu);
        /* f32: cuBLAS sums in f32 in its own order, the CPU in another;
         * relative to the largest element of each result */
        double tol = dts[d] == NDM_F32 ? 2e-5 : 1e-12;
        for (int i = 0; i < NET_PARTS; i++) {
            double scale = 0;
            for (int64_t k = 0; k < net_len[i]; k++)
                scale = fmax(scale, fabs(cpu[i][k]));
            assert_true(scale > 0); /* the gradient reached every operand */
            for (int64_t k = 0; k < net_len[i]; k++)
                if (!(fabs(gpu[i][k] - cpu[i][k]) <= tol * scale))
                    fail_msg("%s (%s), element %lld: CUDA %.17g, CPU %.17g", names[i],
                             ndm_dtype_short(dts[d]), (long long)k, gpu[i][k], cpu[i][k]);
            test_free(cpu[i]);
            test_free(gpu[i]);
        }
    }
}

/* Forward, then each layer's gradient by the public gradient functions. */
static void test_cuda_conv_net_forward_and_backward_match_cpu(void **state)
{
    NEED_GPU();
    net_compare(ROOT(state), false);
}

/* The same by autograd, which adds gradients into the parameters' with the
 * elementwise family: skipped while the CUDA table lacks it. */
static void test_cuda_conv_net_autograd_matches_cpu(void **state)
{
    NEED_GPU();
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (!b || !b->ew) {
        print_message("the CUDA backend has no elementwise family: skipped\n");
        skip();
    }
    net_compare(ROOT(state), true);
}

/* ---- the public API on CUDA: loader, checkpoints, training, serving ------- */

/* The subtree of m holds nothing on the CPU nor on cuda:0. */
static void assert_empty_on_both(ndm_manager m)
{
    assert_manager_empty(m);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, 0);
}

/* A two-layer MLP (8 -> 16 -> 4) in model, its weights from seed (the null
 * module when the device cannot make it). */
static ndm_module try_small_mlp(ndm_manager model, uint64_t seed)
{
    ndm_rng rng = ndm_rng_new(seed);
    return ndm_sequential(model, NDM_MODULES(ndm_linear(model, 8, 16, true, &rng),
                                             ndm_relu_module(model),
                                             ndm_linear(model, 16, 4, true, &rng)));
}

static ndm_module small_mlp(ndm_manager model, uint64_t seed)
{
    ndm_module net = try_small_mlp(model, seed);
    if (!net.id)
        fail_msg("building the MLP failed: %s", ndm_last_error());
    return net;
}

/* Skip unless cuda:0 runs a whole training step: the CUDA module gains its
 * operation families one by one, and a step needs elementwise, reduction,
 * index and matrix operations. Any failure other than an unsupported
 * operation is a real one. */
static void need_cuda_training(ndm_manager root)
{
    NEED_GPU();
    ndm_manager g = ndm_manager_new_on(root, "probe", NDM_CUDA(0));
    assert_live(g);
    ndm_module net = try_small_mlp(g, 1);
    ndm_optimizer opt = net.id ? ndm_sgd(g, net, 0.1, 0.0, 0.0) : (ndm_optimizer){0};
    ndm_manager step = ndm_manager_new(g, "step");
    ndm_rng rng = ndm_rng_new(2);
    ndm_array x = ndm_uniform(step, &rng, NDM_F32, -1, 1, NDM_SHAPE(4, 8));
    ndm_array y = ndm_randint(step, &rng, NDM_I64, 0, 4, NDM_SHAPE(4));
    ndm_status st = opt.id && x.id && y.id ? ndm_grad_begin(step) : ndm_last_status();
    if (st == NDM_OK) {
        ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), y);
        st = loss.id ? ndm_backward(loss) : ndm_last_status();
        (void)ndm_grad_end();
    }
    if (st == NDM_OK)
        st = ndm_optimizer_step(opt);
    char why[512];
    snprintf(why, sizeof why, "%s", ndm_last_error());
    assert_ok(ndm_manager_close(g));
    if (st == NDM_E_UNSUPPORTED) {
        print_message("the CUDA module cannot run a training step yet (%s): skipped\n", why);
        ndm_clear_error();
        skip();
    }
    if (st != NDM_OK)
        fail_msg("a training step on cuda:0 failed: %s", why);
}

/* The elements of f32 array a (any device) as doubles, test_malloc'd: read
 * with ndm_array_copy_out, which makes nothing in a's (perhaps capped)
 * manager. */
static double *values_of(ndm_array a)
{
    int64_t n = ndm_array_size(a);
    assert_true(n >= 0);
    assert_int_equal(ndm_array_dtype(a), NDM_F32);
    float *f = test_malloc((size_t)(n ? n : 1) * sizeof *f);
    assert_ok(ndm_array_copy_out(a, f, (size_t)n * sizeof *f));
    double *v = test_malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = f[i];
    test_free(f);
    return v;
}

/* Every parameter of nets a and b within tol (relative to 1). */
static void assert_same_parameters(ndm_module a, ndm_module b, double tol)
{
    const char *na[16], *nb[16];
    ndm_array pa[16], pb[16];
    int n = ndm_module_named_parameters(a, na, pa, 16);
    assert_int_equal(ndm_module_named_parameters(b, nb, pb, 16), n);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        assert_string_equal(na[i], nb[i]);
        int64_t k = ndm_array_size(pa[i]);
        assert_int_equal(ndm_array_size(pb[i]), k);
        double *x = values_of(pa[i]), *y = values_of(pb[i]);
        for (int64_t j = 0; j < k; j++)
            if (fabs(x[j] - y[j]) > tol * (1 + fabs(x[j])))
                fail_msg("%s[%lld]: %.9g and %.9g", na[i], (long long)j, x[j], y[j]);
        test_free(x);
        test_free(y);
    }
}

static void test_cuda_array_data_refuses_device_memory(void **state)
{
    ndm_manager root = ROOT(state);
    NEED_GPU();
    ndm_manager g = ndm_manager_new_on(root, "gpu", NDM_CUDA(0));
    assert_live(g);
    ndm_array d = ndm_full(g, NDM_F32, 2.5, NDM_SHAPE(2, 3));
    ndm_array c = ndm_full(root, NDM_F32, 2.5, NDM_SHAPE(2, 3));
    assert_live(d);
    assert_null(ndm_array_data(d));
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("ndm_array_copy_out");
    /* reads through a transfer answer as on the CPU */
    double v = 0;
    assert_ok(ndm_item(ndm_slice(ndm_slice(d, 0, 1, 2, 1), 1, 2, 3, 1), &v));
    assert_true(v == 2.5);
    char on_gpu[256], on_cpu[256];
    assert_true(ndm_array_format(d, on_gpu, sizeof on_gpu) > 0);
    assert_true(ndm_array_format(c, on_cpu, sizeof on_cpu) > 0);
    assert_string_equal(on_gpu, on_cpu);
    assert_ok(ndm_array_release(c));
    assert_ok(ndm_manager_close(g));
    assert_empty_on_both(root);
}

static void test_cuda_loader_batches_land_on_device(void **state)
{
    ndm_manager root = ROOT(state);
    NEED_GPU();
    ndm_manager data = ndm_manager_new(root, "data");
    ndm_rng rng = ndm_rng_new(7);
    /* 37 u8 "images" of 3x5 and their labels: the last batch is short */
    ndm_dataset ds = {ndm_randint(data, &rng, NDM_U8, 0, 256, NDM_SHAPE(37, 3, 5)),
                      ndm_randint(data, &rng, NDM_U8, 0, 10, NDM_SHAPE(37))};
    assert_live(ds.inputs);
    assert_live(ds.labels);
    ndm_manager tc = ndm_manager_new(root, "cpu-trainer");
    ndm_manager tg = ndm_manager_new_on(root, "gpu-trainer", NDM_CUDA(0));
    assert_live(tg);
    ndm_loader_options o = {.batch_size = 8, .seed = 3,
                            .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS |
                                     NDM_LOADER_LABELS_I64};
    ndm_loader lc = ndm_loader_new(tc, ds, &o), lg = ndm_loader_new(tg, ds, &o);
    assert_true(lc.id && lg.id);
    for (int epoch = 0; epoch < 2; epoch++) {
        ndm_batch bc, bg;
        int rc, batches = 0;
        while ((rc = ndm_loader_next(lc, &bc)) > 0) {
            assert_int_equal(ndm_loader_next(lg, &bg), 1);
            assert_int_equal(bg.size, bc.size);
            assert_int_equal(ndm_array_device(bg.inputs).type, NDM_DEVICE_CUDA);
            assert_int_equal(ndm_array_device(bg.labels).type, NDM_DEVICE_CUDA);
            assert_arrays_match(bc.inputs, bg.inputs, "batch inputs");
            assert_arrays_match(bc.labels, bg.labels, "batch labels");
            batches++;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(ndm_loader_next(lg, &bg), 0);
        assert_int_equal(batches, 5);
    }
    /* the batches went with their managers: only the datasets remain */
    ndm_stats st;
    assert_ok(ndm_manager_stats(tg, NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(tg));
    assert_ok(ndm_manager_close(tc));
    assert_ok(ndm_manager_close(data));
    assert_empty_on_both(root);
}

static void test_cuda_checkpoint_moves_between_devices(void **state)
{
    ndm_manager root = ROOT(state);
    need_cuda_training(root);
    char path[] = "/tmp/ndm-test-cuda-ckpt-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ndm_manager mc = ndm_manager_new(root, "cpu-model");
    ndm_manager mg = ndm_manager_new_on(root, "gpu-model", NDM_CUDA(0));
    assert_live(mg);
    ndm_module cpu = small_mlp(mc, 11), gpu = small_mlp(mg, 12);
    /* CPU to GPU: the file is read on the host, the parameters live on the GPU */
    assert_ok(ndm_module_save(cpu, path));
    assert_int_equal(ndm_module_load(gpu, path, NDM_CHECKPOINT_STRICT), 4);
    assert_same_parameters(cpu, gpu, 0);
    /* and back: a GPU module's file loads into a fresh CPU module */
    ndm_module back = small_mlp(mc, 13);
    assert_ok(ndm_module_save(gpu, path));
    assert_int_equal(ndm_module_load(back, path, NDM_CHECKPOINT_STRICT), 4);
    assert_same_parameters(cpu, back, 0);
    unlink(path);
    assert_ok(ndm_manager_close(mg));
    assert_ok(ndm_manager_close(mc));
    assert_empty_on_both(root);
}

/* One training step of net with opt on (x, y), copied to dev in a batch
 * manager of root; returns the loss. */
static double step_on(ndm_manager root, ndm_device dev, ndm_module net, ndm_optimizer opt,
                      ndm_array x, ndm_array y)
{
    ndm_manager b = ndm_manager_new_on(root, "batch", dev);
    assert_live(b);
    ndm_array bx = ndm_to_to(b, x, dev), by = ndm_to_to(b, y, dev);
    assert_ok(ndm_grad_begin(b));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, bx), by);
    assert_live(loss);
    assert_int_equal(ndm_array_device(loss).type, dev.type);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_optimizer_step(opt));
    assert_ok(ndm_optimizer_zero_grad(opt));
    double l = 0;
    assert_ok(ndm_item(loss, &l));
    assert_ok(ndm_manager_close(b));
    return l;
}

static void test_cuda_training_steps_match_cpu(void **state)
{
    ndm_manager root = ROOT(state);
    need_cuda_training(root);
    char path[] = "/tmp/ndm-test-cuda-train-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ndm_manager mc = ndm_manager_new(root, "cpu-model");
    ndm_manager mg = ndm_manager_new_on(root, "gpu-model", NDM_CUDA(0));
    ndm_module cpu = small_mlp(mc, 21), gpu = small_mlp(mg, 22);
    assert_ok(ndm_module_save(cpu, path));
    assert_int_equal(ndm_module_load(gpu, path, NDM_CHECKPOINT_STRICT), 4);
    /* SGD with momentum: its update follows the gradient's small rounding
     * differences smoothly (Adam's divides them by near-zero moments) */
    ndm_optimizer oc = ndm_sgd(mc, cpu, 0.1, 0.9, 0.0);
    ndm_optimizer og = ndm_sgd(mg, gpu, 0.1, 0.9, 0.0);
    assert_true(oc.id && og.id);
    ndm_rng rng = ndm_rng_new(5);
    ndm_manager data = ndm_manager_new(root, "data");
    ndm_array x = ndm_uniform(data, &rng, NDM_F32, -1, 1, NDM_SHAPE(6, 8));
    ndm_array y = ndm_randint(data, &rng, NDM_I64, 0, 4, NDM_SHAPE(6));
    for (int s = 0; s < 5; s++) {
        double lc = step_on(root, NDM_CPU, cpu, oc, x, y);
        double lg = step_on(root, NDM_CUDA(0), gpu, og, x, y);
        if (fabs(lc - lg) > 1e-4 * (1 + fabs(lc)))
            fail_msg("step %d: loss %.9g on the CPU, %.9g on cuda:0", s, lc, lg);
    }
    assert_same_parameters(cpu, gpu, 1e-4);
    /* the CPU optimizer's momentum, saved, loads into a fresh optimizer of
     * the GPU net: the next steps agree only if it arrived */
    assert_ok(ndm_optimizer_save(oc, path));
    ndm_optimizer fresh = ndm_sgd(mg, gpu, 0.1, 0.9, 0.0);
    assert_true(fresh.id != 0);
    assert_ok(ndm_optimizer_load(fresh, path));
    unlink(path);
    (void)step_on(root, NDM_CPU, cpu, oc, x, y);
    (void)step_on(root, NDM_CUDA(0), gpu, fresh, x, y);
    assert_same_parameters(cpu, gpu, 1e-4);
    assert_ok(ndm_manager_close(data));
    assert_ok(ndm_manager_close(mg));
    assert_ok(ndm_manager_close(mc));
    assert_empty_on_both(root);
}

static void test_cuda_predictor_answers_cpu_requests(void **state)
{
    ndm_manager root = ROOT(state);
    need_cuda_training(root);
    char path[] = "/tmp/ndm-test-cuda-pred-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ndm_manager mc = ndm_manager_new(root, "cpu-model");
    ndm_manager mg = ndm_manager_new_on(root, "gpu-model", NDM_CUDA(0));
    ndm_module cpu = small_mlp(mc, 31), gpu = small_mlp(mg, 32);
    assert_ok(ndm_module_save(cpu, path));
    ndm_predictor pc = ndm_predictor_load(mc, cpu, path);
    ndm_predictor pg = ndm_predictor_load(mg, gpu, path);
    unlink(path);
    assert_true(pc.id && pg.id);
    ndm_manager req = ndm_manager_new(root, "requests");
    ndm_rng rng = ndm_rng_new(9);
    ndm_array x = ndm_uniform(req, &rng, NDM_F32, -1, 1, NDM_SHAPE(3, 8));
    ndm_array yc = ndm_predict(pc, x), yg = ndm_predict(pg, x);
    assert_live(yc);
    assert_live(yg);
    /* the answer is computed, and stays, on the model's device, owned by
     * the request's manager */
    assert_int_equal(ndm_array_device(yg).type, NDM_DEVICE_CUDA);
    assert_true(ndm_array_manager(yg).id == req.id);
    double *a = values_of(yc), *b = values_of(yg);
    for (int i = 0; i < 12; i++)
        assert_true(fabs(a[i] - b[i]) <= 1e-5 * (1 + fabs(a[i])));
    test_free(a);
    test_free(b);
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_predictor_manager(pg), NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 1); /* this thread's request manager, parked, empty */
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(req));
    assert_ok(ndm_manager_close(mg));
    assert_ok(ndm_manager_close(mc));
    assert_empty_on_both(root);
}

/* Runs in a child process whose CUDA module is the registry suite's stand-in
 * (host memory behind the CUDA device type, copies and transfers only): a
 * GPU trainer's loader deals the batches a CPU trainer's deals, on the
 * device, epoch after epoch, and they leave nothing behind. 0 on success. */
static int loader_child(void)
{
#define CHILD_CHECK(c, ...)                                                     \
    do {                                                                        \
        if (!(c)) {                                                             \
            printf("loader child: " __VA_ARGS__);                               \
            printf(" (%s)\n", ndm_last_error());                                \
            return 1;                                                           \
        }                                                                       \
    } while (0)
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    ndm_rng rng = ndm_rng_new(7);
    ndm_dataset ds = {ndm_randint(data, &rng, NDM_U8, 0, 256, NDM_SHAPE(37, 3, 5)),
                      ndm_randint(data, &rng, NDM_U8, 0, 10, NDM_SHAPE(37))};
    CHILD_CHECK(ds.inputs.id && ds.labels.id, "no dataset");
    ndm_manager tc = ndm_manager_new(ndm_system(), "cpu-trainer");
    ndm_manager tg = ndm_manager_new_on(ndm_system(), "gpu-trainer", NDM_CUDA(0));
    CHILD_CHECK(tg.id, "no trainer on the stand-in's cuda:0");
    ndm_loader_options o = {.batch_size = 8, .seed = 3,
                            .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS |
                                     NDM_LOADER_LABELS_I64};
    ndm_loader lc = ndm_loader_new(tc, ds, &o), lg = ndm_loader_new(tg, ds, &o);
    CHILD_CHECK(lc.id && lg.id, "no loaders");
    static char got[8 * 15 * 8];
    for (int epoch = 0; epoch < 3; epoch++) {
        ndm_batch bc, bg;
        int rc, batches = 0;
        while ((rc = ndm_loader_next(lc, &bc)) > 0) {
            CHILD_CHECK(ndm_loader_next(lg, &bg) == 1, "the GPU loader ended early");
            CHILD_CHECK(bg.size == bc.size, "batch sizes differ");
            ndm_array pairs[2][2] = {{bc.inputs, bg.inputs}, {bc.labels, bg.labels}};
            for (int k = 0; k < 2; k++) {
                ndm_array c = pairs[k][0], g = pairs[k][1];
                CHILD_CHECK(ndm_array_device(g).type == NDM_DEVICE_CUDA, "a batch is not on cuda:0");
                CHILD_CHECK(ndm_array_manager(g).id == bg.manager.id, "a batch is not in its manager");
                CHILD_CHECK(ndm_array_dtype(g) == ndm_array_dtype(c), "dtypes differ");
                size_t n = ndm_array_nbytes(c);
                CHILD_CHECK(n <= sizeof got && ndm_array_nbytes(g) == n, "sizes differ");
                CHILD_CHECK(ndm_array_copy_out(g, got, n) == NDM_OK, "copy_out failed");
                CHILD_CHECK(!memcmp(got, ndm_array_data(c), n),
                            "epoch %d batch %d: %s differ from the CPU loader's", epoch, batches,
                            k ? "labels" : "inputs");
            }
            batches++;
        }
        CHILD_CHECK(rc == 0 && ndm_loader_next(lg, &bg) == 0 && batches == 5, "epoch %d", epoch);
    }
    ndm_stats st;
    CHILD_CHECK(ndm_manager_stats(tg, NDM_CUDA(0), NDM_STATS_SUBTREE, &st) == NDM_OK &&
                    st.live_bytes == 0 && st.children == 0,
                "the GPU trainer still holds %llu bytes in %llu managers",
                (unsigned long long)st.live_bytes, (unsigned long long)st.children);
    /* the batches went up on the loader's own stream, and the thread's
     * current stream is back */
    CHILD_CHECK(ndm_stream_current(NDM_CUDA(0)).id == ndm_stream_default(NDM_CUDA(0)).id,
                "the loader left its copy stream current");
    CHILD_CHECK(ndm_loader_close(lg) == NDM_OK, "closing the GPU loader");
    CHILD_CHECK(ndm_manager_close(tg) == NDM_OK && ndm_manager_close(tc) == NDM_OK &&
                    ndm_manager_close(data) == NDM_OK,
                "closing");
    printf("loader child: 3 epochs of 5 batches matched on cuda:0 (stand-in)\n");
    return 0;
#undef CHILD_CHECK
}

/* The loader's device path on every machine: through the stand-in module. */
static void test_loader_batches_reach_a_device_module(void **state)
{
    (void)state;
    const char *dir = getenv("NDM_TEST_STAND_IN_DIR");
    if (!dir) {
        print_message("NDM_TEST_STAND_IN_DIR is not set (the build's test runner sets it): "
                      "skipped\n");
        skip();
    }
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("NDM_BACKEND_PATH", dir, 1);
        execl(self_path, self_path, "--loader-child", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    self_path = argc > 0 ? argv[0] : "test_cuda";
    if (argc > 1 && !strcmp(argv[1], "--loader-child")) {
        int rc = loader_child();
        fflush(stdout);
        return rc;
    }
    if (argc > 1 && !strcmp(argv[1], "--fault-child")) {
        int rc = fault_child();
        fflush(stdout);
        _exit(rc); /* skip exit-time cleanup on a broken device */
    }
    const struct CMUnitTest tests[] = {
        TEST(test_cuda_manager_on_missing_device_fails_cleanly),
        TEST(test_cuda_synchronize_reports_missing_devices),
        TEST(test_to_missing_device_changes_nothing),
        TEST(test_to_same_device_returns_fresh_alias),
        TEST(test_to_null_input_keeps_first_error),
        TEST(test_to_capped_manager_refuses_before_allocating),
        TEST(test_cuda_conversions_match_cpu_on_host),
        TEST(test_cuda_strided_plans_match_cpu_on_host),
        TEST(test_cuda_copy_matches_cpu_for_every_dtype_pair),
        TEST(test_cuda_copy_strided_and_broadcast_views_match_cpu),
        TEST(test_cuda_copy_into_strided_destination_matches_cpu),
        TEST(test_cuda_copy_beyond_kernel_rank_matches_cpu),
        TEST(test_cuda_fill_matches_cpu_for_every_dtype),
        TEST(test_cuda_iota_matches_cpu_for_every_dtype),
        TEST(test_cuda_to_round_trips_every_dtype),
        TEST(test_cuda_sticky_error_reported_by_every_call),
        TEST(test_cuda_fault_is_sticky_in_a_fresh_process),
        TEST(test_cuda_elementwise_views_and_in_place_match_cpu),
        TEST(test_cuda_random_draws_match_cpu_bit_for_bit),
        TEST(test_cuda_sampling_ops_match_cpu),
        TEST(test_cuda_reductions_match_cpu),
        TEST(test_cuda_reduction_of_a_view_makes_no_copy),
        TEST(test_cuda_index_ops_match_cpu),
        TEST(test_cuda_take_out_of_range_index_fails_cleanly),
        TEST(test_cuda_loss_label_out_of_range_is_refused),
        TEST(test_cuda_loss_ignored_labels_match_pytorch),
        TEST(test_cuda_selection_checks_devices_and_ranges),
        TEST(test_cuda_autograd_through_reductions_and_index),
        TEST(test_cuda_network_blocks_gradients_match_cpu),
        TEST(test_cuda_conv_net_forward_and_backward_match_cpu),
        TEST(test_cuda_conv_net_autograd_matches_cpu),
        TEST(test_cuda_array_data_refuses_device_memory),
        TEST(test_cuda_loader_batches_land_on_device),
        TEST(test_loader_batches_reach_a_device_module),
        TEST(test_cuda_checkpoint_moves_between_devices),
        TEST(test_cuda_training_steps_match_cpu),
        TEST(test_cuda_predictor_answers_cpu_requests),
    };
    return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
