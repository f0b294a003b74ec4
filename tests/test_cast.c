/* Casts: ndm_astype between every pair of dtypes against conversion rules
 * written here, special values, every f16 value, views, promotion, the
 * fast parallel copy against the reference one. */
#include "ew_testutil.h"

#include "backends/backend.h"
#include "backends/cpu/parallel.h"

int ndm__ew_isa_select(const char *name);
void ndm__ew_set_stream_min(int64_t bytes);

/* Source values that exercise rounding, saturation, wrapping and specials. */
static const double float_values[] = {
    NAN,   INFINITY, -INFINITY, 0.0,     -0.0,      1.5,          -1.5,        2.5,
    -2.5,  0.1,      255.7,     256.0,   -1.0,      300.0,        1e10,        -1e10,
    65504, 65520,    1e-8,      6e-8,    3e38,      2147483520.0, 2147483648.0, -2147483904.0,
    9.3e18, -9.3e18, 1.00048828125, 16777217.0, 3.0000001, -0.75, 127.5, 1e-45};
static const int64_t int_values[] = {0,
                                     1,
                                     -1,
                                     127,
                                     128,
                                     255,
                                     256,
                                     -129,
                                     INT32_MAX,
                                     INT32_MIN,
                                     INT64_C(1) << 40,
                                     -(INT64_C(1) << 40),
                                     INT64_MAX,
                                     INT64_MIN,
                                     16777217,
                                     65519,
                                     -65521,
                                     2049};

/* Element i of a host buffer of dtype `to`, made from a source element as the
 * header's rules say. Floats go through their value, integers through int64. */
static void convert_one(const void *src, ndm_dtype from, int64_t i, void *dst, ndm_dtype to)
{
    if (is_float_dt(from)) {
        double v = host_get(src, from, i);
        host_set(dst, to, 0, v); /* host_set implements the float rules */
        return;
    }
    int64_t k = host_geti(src, from, i);
    switch (to) {
    case NDM_BOOL: *(uint8_t *)dst = k != 0; break;
    case NDM_U8: *(uint8_t *)dst = (uint8_t)k; break;
    case NDM_I32: *(int32_t *)dst = (int32_t)k; break;
    case NDM_I64: *(int64_t *)dst = k; break;
    case NDM_F16: *(uint16_t *)dst = ndm_f32_to_f16((float)k); break;
    case NDM_BF16: *(uint16_t *)dst = ndm_f32_to_bf16((float)k); break;
    case NDM_F32: *(float *)dst = (float)k; break;
    case NDM_F64: *(double *)dst = (double)k; break;
    }
}

/* An array of dtype t holding the interesting values (each converted by the
 * rules, since not every value exists in every dtype). */
static ndm_array special_array(ndm_manager m, ndm_dtype t, int64_t *n)
{
    size_t nf = sizeof float_values / sizeof *float_values;
    size_t ni = sizeof int_values / sizeof *int_values;
    *n = (int64_t)(nf + ni);
    unsigned char *buf = calloc((size_t)*n, 8);
    for (size_t i = 0; i < nf; i++)
        convert_one(float_values, NDM_F64, (int64_t)i, buf + i * ndm_dtype_size(t), t);
    for (size_t i = 0; i < ni; i++)
        convert_one(int_values, NDM_I64, (int64_t)i, buf + (nf + i) * ndm_dtype_size(t), t);
    ndm_array a = ndm_from_buffer(m, t, buf, NDM_SHAPE(*n));
    free(buf);
    return a;
}

static bool same_bits_or_nan(const void *x, const void *y, ndm_dtype t, int64_t i)
{
    size_t es = ndm_dtype_size(t);
    if (is_float_dt(t) && isnan(host_get(x, t, i)) && isnan(host_get(y, t, i)))
        return true;
    return memcmp((const char *)x + (size_t)i * es, (const char *)y + (size_t)i * es, es) == 0;
}

static void test_astype_every_pair_follows_rules(void **state)
{
    ndm_manager m = ROOT(state);
    for (int i = 0; i < N_DTYPES; i++) {
        int64_t n;
        ndm_array a = special_array(m, all_dtypes[i], &n);
        void *ha = read_all(a, &n);
        for (int j = 0; j < N_DTYPES; j++) {
            ndm_dtype to = all_dtypes[j];
            ndm_array c = ndm_astype(a, to);
            assert_live(c);
            assert_int_equal(ndm_array_dtype(c), to);
            int64_t k;
            void *hc = read_all(c, &k);
            unsigned char want[8];
            for (int64_t e = 0; e < n; e++) {
                convert_one(ha, all_dtypes[i], e, want, to);
                if (!same_bits_or_nan((char *)hc + e * (int64_t)ndm_dtype_size(to), want, to, 0))
                    fail_msg("%s %.17g -> %s: got %.17g, want %.17g",
                             ndm_dtype_short(all_dtypes[i]), host_get(ha, all_dtypes[i], e),
                             ndm_dtype_short(to),
                             host_get(hc, to, e), host_get(want, to, 0));
            }
            free(hc);
            REL(c);
        }
        free(ha);
        REL(a);
    }
}

static void test_astype_documented_edge_values(void **state)
{
    ndm_manager m = ROOT(state);
    double x[6] = {-1.9, 1.9, NAN, 1e300, -1e300, 255.99};
    ndm_array a = ndm_from_buffer(m, NDM_F64, x, NDM_SHAPE(6));
    ndm_array i = ndm_astype(a, NDM_I32), u = ndm_astype(a, NDM_U8), b = ndm_astype(a, NDM_BOOL);
    int32_t hi[6];
    uint8_t hu[6], hb[6];
    assert_ok(ndm_array_copy_out(i, hi, sizeof hi));
    assert_ok(ndm_array_copy_out(u, hu, sizeof hu));
    assert_ok(ndm_array_copy_out(b, hb, sizeof hb));
    const int32_t wi[6] = {-1, 1, 0, INT32_MAX, INT32_MIN, 255};
    const uint8_t wu[6] = {0, 1, 0, 255, 0, 255};
    const uint8_t wb[6] = {1, 1, 1, 1, 1, 1};
    assert_memory_equal(hi, wi, sizeof wi);
    assert_memory_equal(hu, wu, sizeof wu);
    assert_memory_equal(hb, wb, sizeof wb);
    int64_t big[2] = {300, -2};
    ndm_array g = ndm_from_buffer(m, NDM_I64, big, NDM_SHAPE(2));
    ndm_array gu = ndm_astype(g, NDM_U8);
    assert_ok(ndm_array_copy_out(gu, hu, 2));
    assert_true(hu[0] == 44 && hu[1] == 254); /* integers wrap */
    assert_ok(ndm_scope_release_all(m));
}

static void test_astype_always_copies(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {21};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(5, 7), &r, true);
    ndm_array same = ndm_astype(a, NDM_F32);
    assert_live(same);
    assert_false(ndm_array_shares_storage(a, same));
    assert_true(ndm_array_is_contiguous(same));
    int64_t n, k;
    void *x = read_all(a, &n), *y = read_all(same, &k);
    assert_memory_equal(x, y, (size_t)n * 4);
    free(y);
    /* writing the copy leaves the source alone */
    assert_ok(ndm_mul_scalar_(same, 0.0));
    y = read_all(a, &k);
    assert_memory_equal(x, y, (size_t)n * 4);
    free(x);
    free(y);
    /* a transposed source gives a C-ordered result */
    ndm_array t = ndm_transpose(a);
    ndm_array tc = ndm_astype(t, NDM_F64);
    assert_true(ndm_array_is_contiguous(tc));
    void *ht = read_all(t, &n), *hc = read_all(tc, &k);
    for (int64_t e = 0; e < n; e++)
        assert_true(close_to(host_get(hc, NDM_F64, e), host_get(ht, NDM_F32, e), 0, 0));
    free(ht);
    free(hc);
    /* a broadcast view becomes real elements */
    ndm_array ex = ndm_expand(ndm_scalar(m, NDM_I32, 7), NDM_SHAPE(3, 2));
    ndm_array exc = ndm_astype(ex, NDM_I32);
    int64_t strides[2];
    assert_int_equal(ndm_array_strides(exc, strides, 2), 2);
    assert_true(strides[0] == 2 && strides[1] == 1);
    assert_ok(ndm_scope_release_all(m));
}

static void test_astype_every_f16_and_bf16_value(void **state)
{
    ndm_manager m = ROOT(state);
    uint16_t *bits = malloc(65536 * sizeof *bits);
    for (uint32_t i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    ndm_dtype halves[2] = {NDM_F16, NDM_BF16};
    for (int h = 0; h < 2; h++) {
        ndm_array a = ndm_from_buffer(m, halves[h], bits, NDM_SHAPE(65536));
        ndm_array f = ndm_astype(a, NDM_F32);
        ndm_array back = ndm_astype(f, halves[h]);
        float *hf = malloc(65536 * sizeof *hf);
        uint16_t *hb = malloc(65536 * sizeof *hb);
        assert_ok(ndm_array_copy_out(f, hf, 65536 * sizeof *hf));
        assert_ok(ndm_array_copy_out(back, hb, 65536 * sizeof *hb));
        for (uint32_t i = 0; i < 65536; i++) {
            float want = h ? ndm_bf16_to_f32((uint16_t)i) : ndm_f16_to_f32((uint16_t)i);
            if (memcmp(&hf[i], &want, 4) != 0)
                fail_msg("%s 0x%04x -> f32: %a, want %a", h ? "bf16" : "f16", i, hf[i], want);
            uint16_t again = h ? ndm_f32_to_bf16(want) : ndm_f32_to_f16(want);
            if (hb[i] != again)
                fail_msg("%s 0x%04x round trip: 0x%04x, want 0x%04x", h ? "bf16" : "f16", i,
                         hb[i], again);
        }
        free(hf);
        free(hb);
        REL(a);
        REL(f);
        REL(back);
    }
    free(bits);
    /* f32 to f16 over a sweep of bit patterns: ties, subnormals, overflow */
    enum { N = 1 << 20 };
    uint32_t *pat = malloc(N * sizeof *pat);
    for (uint32_t i = 0; i < N; i++)
        pat[i] = i * 4099u + (i & 7) * 0x1000u;
    ndm_array f = ndm_from_buffer(m, NDM_F32, pat, NDM_SHAPE(N));
    ndm_array h16 = ndm_astype(f, NDM_F16), hb16 = ndm_astype(f, NDM_BF16);
    uint16_t *o16 = malloc(N * sizeof *o16), *ob16 = malloc(N * sizeof *ob16);
    assert_ok(ndm_array_copy_out(h16, o16, N * sizeof *o16));
    assert_ok(ndm_array_copy_out(hb16, ob16, N * sizeof *ob16));
    for (uint32_t i = 0; i < N; i++) {
        float x;
        memcpy(&x, &pat[i], 4);
        if (o16[i] != ndm_f32_to_f16(x) || ob16[i] != ndm_f32_to_bf16(x))
            fail_msg("f32 %a -> f16 0x%04x / bf16 0x%04x, want 0x%04x / 0x%04x", x, o16[i],
                     ob16[i], ndm_f32_to_f16(x), ndm_f32_to_bf16(x));
    }
    free(pat);
    free(o16);
    free(ob16);
    REL(f);
    REL(h16);
    REL(hb16);
}

static void test_result_type_table(void **state)
{
    (void)state;
    for (int i = 0; i < N_DTYPES; i++)
        for (int j = 0; j < N_DTYPES; j++)
            assert_int_equal(ndm_result_type(all_dtypes[i], all_dtypes[j]), promo[i][j]);
}

/* The promotion table and the conversion examples of docs/overview.md are
 * what the library does. */
static void test_overview_states_the_rules(void **state)
{
    const char *path = getenv("NDM_TEST_OVERVIEW"); /* (set by the test command) */
    if (!path)
        fail_msg("NDM_TEST_OVERVIEW does not name docs/overview.md");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        char name[16];
        if (sscanf(line, "| **%15[a-z0-9]** |", name) != 1)
            continue;
        ndm_dtype a = NDM_DTYPE_COUNT;
        for (int t = 0; t < NDM_DTYPE_COUNT; t++)
            if (!strcmp(ndm_dtype_short((ndm_dtype)t), name))
                a = (ndm_dtype)t;
        assert_true(a < NDM_DTYPE_COUNT);
        char *cell = strchr(strchr(line, '|') + 1, '|') + 1;
        for (int b = 0; b < NDM_DTYPE_COUNT; b++) {
            char got[16];
            assert_int_equal(sscanf(cell, " %15[a-z0-9]", got), 1);
            if (strcmp(got, ndm_dtype_short(ndm_result_type(a, (ndm_dtype)b))))
                fail_msg("overview: %s with %s gives %s, the library %s", name,
                         ndm_dtype_short((ndm_dtype)b), got,
                         ndm_dtype_short(ndm_result_type(a, (ndm_dtype)b)));
            cell = strchr(cell, '|') + 1;
        }
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, NDM_DTYPE_COUNT);

    ndm_manager m = ROOT(state);
    struct {
        ndm_dtype t;
        double v, want;
    } full[] = {{NDM_U8, 300, 255}, {NDM_U8, -5, 0}, {NDM_I64, NAN, 0}, {NDM_U8, 2.7, 2}};
    for (int i = 0; i < 4; i++) {
        ndm_array a = ndm_full(m, full[i].t, full[i].v, NDM_SHAPE(1));
        double got = -1;
        assert_ok(ndm_item(a, &got));
        assert_true(got == full[i].want);
        REL(a);
    }
    ndm_array i32 = ndm_full(m, NDM_I32, 300, NDM_SHAPE(1));
    ndm_array u8 = ndm_astype(i32, NDM_U8);
    double got = -1;
    assert_ok(ndm_item(u8, &got));
    assert_true(got == 44);
    REL(i32);
    REL(u8);
}

static void test_astype_fast_matches_reference(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {22};
    const char *isas[] = {"avx512", "avx2", "generic"};
    for (size_t s = 0; s < 3; s++) {
        if (ndm__ew_isa_select(isas[s]) != NDM_OK)
            continue;
        for (int i = 0; i < N_DTYPES; i++) {
            int64_t n;
            ndm_array sp = special_array(m, all_dtypes[i], &n);
            ndm_array rnd = rand_array(m, all_dtypes[i], NDM_SHAPE(33, 65), &r, true);
            ndm_array views[3] = {sp, ndm_transpose(rnd), ndm_slice(rnd, 1, NDM_END, NDM_END, -3)};
            for (int v = 0; v < 3; v++) {
                for (int j = 0; j < N_DTYPES; j++) {
                    ndm__cpu_force_reference(true);
                    ndm_array want = ndm_astype(views[v], all_dtypes[j]);
                    ndm__cpu_force_reference(false);
                    ndm_array got = ndm_astype(views[v], all_dtypes[j]);
                    int64_t a, b;
                    void *hw = read_all(want, &a), *hg = read_all(got, &b);
                    for (int64_t e = 0; e < a; e++)
                        if (!same_bits_or_nan(hg, hw, all_dtypes[j], e))
                            fail_msg("%s -> %s (%s) element %lld: fast %.17g, reference %.17g",
                                     ndm_dtype_short(all_dtypes[i]), ndm_dtype_short(all_dtypes[j]),
                                     isas[s], (long long)e, host_get(hg, all_dtypes[j], e),
                                     host_get(hw, all_dtypes[j], e));
                    free(hw);
                    free(hg);
                    REL(want);
                    REL(got);
                }
            }
            assert_ok(ndm_scope_release_all(m));
        }
    }
    assert_ok(ndm__ew_isa_select(NULL));
}

static void test_copy_parallel_and_streaming(void **state)
{
    ndm_manager m = ROOT(state);
    rng r = {23};
    ndm_array a = rand_array(m, NDM_F32, NDM_SHAPE(1 << 19), &r, true);
    ndm_array t = ndm_transpose(ndm_reshape(a, NDM_SHAPE(512, 1024)));
    ndm__cpu_force_reference(true);
    ndm_array w1 = ndm_astype(a, NDM_BF16), w2 = ndm_astype(t, NDM_F64);
    ndm_array w3 = ndm_astype(a, NDM_F32);
    ndm__cpu_force_reference(false);
    int before = ndm__set_num_threads(2);
    ndm__ew_set_stream_min(1);
    ndm_array g1 = ndm_astype(a, NDM_BF16), g2 = ndm_astype(t, NDM_F64);
    ndm_array g3 = ndm_astype(a, NDM_F32);
    ndm__ew_set_stream_min((int64_t)64 << 20);
    ndm__set_num_threads(before);
    ndm_array pairs[3][2] = {{w1, g1}, {w2, g2}, {w3, g3}};
    for (int p = 0; p < 3; p++) {
        int64_t n, k;
        void *x = read_all(pairs[p][0], &n), *y = read_all(pairs[p][1], &k);
        assert_int_equal(n, k);
        for (int64_t e = 0; e < n; e++)
            assert_true(same_bits_or_nan(x, y, ndm_array_dtype(pairs[p][0]), e));
        free(x);
        free(y);
    }
    assert_ok(ndm_scope_release_all(m));
}

static void test_astype_errors_and_managers(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager model = ndm_manager_new(root, "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_manager_cap(model, NDM_CAP_ARRAYS));
    ndm_clear_error();
    ndm_array bad = ndm_astype(w, NDM_F16);
    assert_int_equal(bad.id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    ndm_array ok = ndm_astype_to(root, w, NDM_F16);
    assert_live(ok);
    assert_int_equal(ndm_array_manager(ok).id, root.id);
    ndm_clear_error();
    assert_int_equal(ndm_astype(w, (ndm_dtype)-1).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("invalid dtype");
    ndm_array z = ndm_astype(ndm_scalar(root, NDM_F64, 3.75), NDM_I64);
    int64_t v;
    assert_ok(ndm_item_i64(z, &v));
    assert_int_equal(v, 3);
    assert_int_equal(ndm_array_ndim(z), 0);
    ndm_array e = ndm_astype(ndm_zeros(root, NDM_F32, NDM_SHAPE(3, 0)), NDM_BOOL);
    assert_int_equal(ndm_array_size(e), 0);
    REL(w);
    ndm_clear_error();
    assert_int_equal(ndm_astype(w, NDM_F16).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_ok(ndm_manager_close(model));
    assert_ok(ndm_scope_release_all(root));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_astype_every_pair_follows_rules),
        TEST(test_astype_documented_edge_values),
        TEST(test_overview_states_the_rules),
        TEST(test_astype_always_copies),
        TEST(test_astype_every_f16_and_bf16_value),
        TEST(test_result_type_table),
        TEST(test_astype_fast_matches_reference),
        TEST(test_copy_parallel_and_streaming),
        TEST(test_astype_errors_and_managers),
    };
    return cmocka_run_group_tests_name("cast", tests, NULL, NULL);
}
