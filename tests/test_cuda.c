/* The CUDA backend against the CPU reference (copy, fill, iota, transfers for
 * every dtype, strided and broadcast views, sticky errors; on a GPU, or on
 * "cuda (host execution)" when NDM_BACKEND_PATH names tests/cuda_host's
 * module; skipped otherwise), and what a machine without a GPU answers. */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "ndm/config.h"
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

int main(int argc, char **argv)
{
    self_path = argc > 0 ? argv[0] : "test_cuda";
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
    };
    return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
