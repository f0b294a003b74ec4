/* DLPack exchange: exported tensors keep storage alive and show as lent,
 * imported tensors are adopted without a copy and given back on close. */
#include <stdlib.h>

#include <dlpack/dlpack.h>

#include "helpers.h"

/* The dump of m as text (the caller frees it). */
static char *dump_of(ndm_manager m)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    assert_ok(ndm_debug_dump(m, f));
    fclose(f);
    return buf;
}

/* The dump line of the manager named `name` in text (static buffer). */
static const char *line_of(const char *text, const char *name)
{
    static char line[512];
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *q = p;
        while (*q == ' ')
            q++;
        if (!strncmp(q, name, strlen(name)) && q[strlen(name)] == ' ') {
            snprintf(line, sizeof line, "%.*s", (int)n, p);
            return line;
        }
        p = e ? e + 1 : NULL;
    }
    return "";
}

static void test_dlpack_export_describes_the_view(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_arange(m, NDM_F32, 0, 12, 1);
    ndm_array v = ndm_reshape(a, NDM_SHAPE(3, 4));
    static const int perm[2] = {1, 0};
    ndm_array t = ndm_slice(ndm_permute(v, 2, perm), 0, 1, 3, 1); /* (2, 3), strides (1, 4) */
    assert_live(t);
    DLManagedTensor *dl = ndm_to_dlpack(t);
    assert_non_null(dl);
    DLTensor *x = &dl->dl_tensor;
    assert_int_equal(x->device.device_type, kDLCPU);
    assert_int_equal(x->device.device_id, 0);
    assert_int_equal(x->dtype.code, kDLFloat);
    assert_int_equal(x->dtype.bits, 32);
    assert_int_equal(x->dtype.lanes, 1);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_int_equal(x->strides[0], 1);
    assert_int_equal(x->strides[1], 4);
    assert_int_equal(x->byte_offset, 4);
    assert_ptr_equal(x->data, ndm_array_data(a));
    /* element (i, j) of t is a[1 + i + 4 j] */
    const float *p = (const float *)((char *)x->data + x->byte_offset);
    assert_true(p[1 * x->strides[0] + 2 * x->strides[1]] == 1 + 1 + 8);
    dl->deleter(dl);
    assert_ok(ndm_manager_close(m));
}

static void test_dlpack_export_keeps_storage_and_shows_lent(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "src");
    ndm_array a = ndm_full(m, NDM_F64, 2.5, NDM_SHAPE(4));
    assert_ok(ndm_manager_cap(m, NDM_CAP_ARRAYS)); /* a capped model can still export */
    DLManagedTensor *dl = ndm_to_dlpack(a);
    assert_non_null(dl);
    char *d = dump_of(ndm_system());
    if (!strstr(line_of(d, "src"), "lent 1") || !strstr(line_of(d, "detached"), "borrowed 1"))
        fail_msg("the export is not shown as a loan:\n%s", d);
    free(d);
    /* why a is alive: the export, at the line that made it, lent by src */
    char *w = NULL;
    size_t wn = 0;
    FILE *wf = open_memstream(&w, &wn);
    assert_non_null(wf);
    assert_ok(ndm_why_alive(a, wf));
    fclose(wf);
    if (!strstr(w, "f64[4], a DLPack export not yet deleted, in system/detached, made at test_dlpack.c:75") ||
        !strstr(w, "lent by system/test/src"))
        fail_msg("the export is not named as what keeps the array:\n%s", w);
    free(w);
    /* the source closes first: the consumer's view stays valid */
    assert_ok(ndm_manager_close(m));
    double *p = dl->dl_tensor.data;
    assert_true(p[3] == 2.5);
    p[0] = 7; /* and writable */
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_detached(), NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 1);
    assert_int_equal(st.live_bytes, 32);
    dl->deleter(dl);
    assert_ok(ndm_manager_stats(ndm_detached(), NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 0);
    assert_int_equal(st.live_bytes, 0);
}

static void test_dlpack_export_counts_storage_once(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(256));
    DLManagedTensor *dl = ndm_to_dlpack(a);
    assert_non_null(dl);
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_system(), NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, 1024);
    assert_ok(ndm_array_release(a));
    /* the alias now holds the storage alone, charged once */
    assert_ok(ndm_manager_stats(ndm_system(), NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, 1024);
    dl->deleter(dl);
    assert_ok(ndm_manager_stats(ndm_system(), NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_bytes, 0);
    assert_ok(ndm_manager_close(m));
}

static void test_dlpack_export_refuses_stale_handles(void **state)
{
    ndm_array a = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(2));
    assert_ok(ndm_array_release(a));
    assert_null(ndm_to_dlpack(a));
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    ndm_clear_error();
    assert_null(ndm_to_dlpack(NDM_NULL_ARRAY));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
}

/* A producer's tensor over malloc'd memory that counts deleter calls. */
typedef struct producer {
    DLManagedTensor t;
    int64_t shape[4], strides[4];
    int *deleted;
} producer;

static void producer_delete(DLManagedTensor *t)
{
    producer *p = (producer *)t;
    (*p->deleted)++;
    free(t->dl_tensor.data);
    free(p);
}

static DLManagedTensor *produce(int *deleted, DLDataType dt, int nd, const int64_t *shape,
                                const int64_t *strides, size_t bytes)
{
    producer *p = calloc(1, sizeof *p);
    p->deleted = deleted;
    p->t.dl_tensor.data = calloc(1, bytes ? bytes : 1);
    p->t.dl_tensor.device = (DLDevice){kDLCPU, 0};
    p->t.dl_tensor.ndim = nd;
    p->t.dl_tensor.dtype = dt;
    memcpy(p->shape, shape, (size_t)nd * sizeof *shape);
    p->t.dl_tensor.shape = p->shape;
    if (strides) {
        memcpy(p->strides, strides, (size_t)nd * sizeof *strides);
        p->t.dl_tensor.strides = p->strides;
    }
    p->t.deleter = producer_delete;
    return &p->t;
}

static void test_dlpack_import_adopts_without_copy(void **state)
{
    int deleted = 0;
    DLManagedTensor *t = produce(&deleted, (DLDataType){kDLInt, 32, 1}, 2,
                                 (int64_t[]){2, 3}, NULL, 6 * sizeof(int32_t));
    int32_t *mem = t->dl_tensor.data;
    for (int i = 0; i < 6; i++)
        mem[i] = i;
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    ndm_array a = ndm_from_dlpack(m, t);
    assert_live(a);
    assert_ptr_equal(ndm_array_data(a), mem);
    assert_int_equal(ndm_array_dtype(a), NDM_I32);
    assert_int_equal(ndm_array_dim(a, 0), 2);
    assert_int_equal(ndm_array_dim(a, 1), 3);
    mem[4] = 40; /* the producer writes, ndm reads */
    int64_t v;
    assert_ok(ndm_item_i64(ndm_select(ndm_select(a, 0, 1), 0, 1), &v));
    assert_int_equal(v, 40);
    assert_ok(ndm_add_scalar_(a, 1)); /* ndm writes, the producer reads */
    assert_int_equal(mem[0], 1);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_true(st.live_bytes >= 24);
    assert_int_equal(deleted, 0);
    assert_ok(ndm_manager_close(m));
    assert_int_equal(deleted, 1);
}

static void test_dlpack_import_strided_and_offset(void **state)
{
    int deleted = 0;
    /* a (3, 2) view with strides (1, 4) starting at element 2 of 16 floats */
    DLManagedTensor *t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 2,
                                 (int64_t[]){3, 2}, (int64_t[]){1, 4}, 16 * sizeof(float));
    float *mem = t->dl_tensor.data;
    for (int i = 0; i < 16; i++)
        mem[i] = (float)i;
    t->dl_tensor.byte_offset = 2 * sizeof(float);
    ndm_array a = ndm_from_dlpack(ROOT(state), t);
    assert_live(a);
    float out[6];
    assert_ok(ndm_array_copy_out(a, out, sizeof out));
    const float want[6] = {2, 6, 3, 7, 4, 8};
    assert_memory_equal(out, want, sizeof out);
    assert_ok(ndm_array_release(a));
    assert_int_equal(deleted, 1);
}

static void test_dlpack_import_refuses_bad_tensors(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    int deleted = 0;
    struct {
        DLDataType dt;
        int64_t stride;
        int device;
        ndm_status want;
        const char *msg;
    } cases[] = {
        {{kDLFloat, 32, 4}, 1, kDLCPU, NDM_E_INVALID, "4 lanes"},
        {{kDLInt, 8, 1}, 1, kDLCPU, NDM_E_DTYPE, "8 bits"},
        {{kDLComplex, 64, 1}, 1, kDLCPU, NDM_E_DTYPE, "code 5"},
        {{kDLFloat, 32, 1}, -1, kDLCPU, NDM_E_INVALID, "negative stride"},
        {{kDLFloat, 32, 1}, 1, kDLCUDA, NDM_E_UNSUPPORTED, "CUDA is not available"},
        {{kDLFloat, 32, 1}, 1, kDLOpenCL, NDM_E_UNSUPPORTED, "device type 4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].device == kDLCUDA && ndm_cuda_device_count() > 0)
            continue;
        DLManagedTensor *t = produce(&deleted, cases[i].dt, 1, (int64_t[]){3},
                                     (int64_t[]){cases[i].stride}, 64);
        t->dl_tensor.device.device_type = cases[i].device;
        ndm_array a = ndm_from_dlpack(m, t);
        assert_int_equal(a.id, 0);
        assert_int_equal(ndm_last_status(), cases[i].want);
        assert_error_has(cases[i].msg);
        /* refused: the tensor is still the caller's */
        assert_int_equal(deleted, 0);
        t->deleter(t);
        deleted = 0;
        assert_int_equal(test_live_arrays(m), 0);
    }
    assert_int_equal(ndm_from_dlpack(m, NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    /* a closed manager refuses, and the tensor stays the caller's */
    DLManagedTensor *t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 1, (int64_t[]){3},
                                 NULL, 12);
    assert_ok(ndm_manager_close(m));
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_int_equal(deleted, 0);
    t->deleter(t);
}

static void test_dlpack_import_refuses_wrapping_and_overflowing_tensors(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    int deleted = 0;
    /* an offset that wraps the address space: data - 8 */
    DLManagedTensor *t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 1, (int64_t[]){2},
                                 NULL, 64);
    t->dl_tensor.byte_offset = UINT64_MAX - 7;
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("wraps the address space");
    /* an offset that fits, but the last element's bytes wrap */
    t->dl_tensor.byte_offset = (UINTPTR_MAX - (uintptr_t)t->dl_tensor.data) & ~(uint64_t)3;
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("wraps the address space");
    assert_int_equal(deleted, 0);
    t->deleter(t);
    deleted = 0;
    /* 2^40 x 2^40 elements with zero strides: an extent of one, a count
     * past int64 */
    t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 2,
                (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}, (int64_t[]){0, 0}, 64);
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_error_has("element count overflows");
    /* a count that fits in elements but not in bytes */
    t->dl_tensor.shape[0] = INT64_C(1) << 31;
    t->dl_tensor.shape[1] = INT64_C(1) << 31;
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_error_has("size in bytes overflows");
    /* empty, but its other sizes overflow when multiplied */
    t->dl_tensor.shape[0] = INT64_C(1) << 62;
    t->dl_tensor.shape[1] = 0;
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_int_equal(deleted, 0);
    t->deleter(t);
    deleted = 0;
    t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 3,
                (int64_t[]){INT64_C(1) << 62, 91, 0}, NULL, 64);
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_OVERFLOW);
    assert_int_equal(deleted, 0);
    t->deleter(t);
    assert_int_equal(test_live_arrays(m), 0);
    assert_ok(ndm_manager_close(m));
}

static void test_dlpack_import_refuses_misaligned_data(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    int deleted = 0;
    DLManagedTensor *t = produce(&deleted, (DLDataType){kDLFloat, 32, 1}, 1, (int64_t[]){2},
                                 NULL, 64);
    /* an f32 tensor one byte into its buffer: the kernels load whole floats */
    void *data = t->dl_tensor.data;
    t->dl_tensor.data = (char *)data + 1;
    assert_int_equal(ndm_from_dlpack(m, t).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("not aligned to the element size");
    /* an empty tensor takes any offset: nothing is viewed */
    t->dl_tensor.data = data;
    t->dl_tensor.shape[0] = 0;
    t->dl_tensor.byte_offset = UINT64_MAX - 3;
    ndm_array e = ndm_from_dlpack(m, t);
    assert_live(e);
    assert_int_equal(ndm_array_size(e), 0);
    assert_ok(ndm_array_release(e));
    assert_int_equal(deleted, 1); /* the empty import owned it */
    assert_int_equal(test_live_arrays(m), 0);
    assert_ok(ndm_manager_close(m));
}

static void test_dlpack_round_trip_through_ndm(void **state)
{
    ndm_manager a_side = ndm_manager_new(ROOT(state), "a");
    ndm_manager b_side = ndm_manager_new(ROOT(state), "b");
    ndm_array a = ndm_arange(a_side, NDM_I64, 0, 6, 1);
    DLManagedTensor *dl = ndm_to_dlpack(a);
    ndm_array b = ndm_from_dlpack(b_side, dl);
    assert_live(b);
    assert_true(ndm_array_data(b) == ndm_array_data(a));
    assert_ok(ndm_manager_close(a_side)); /* b still holds the storage */
    int64_t out[6];
    assert_ok(ndm_array_copy_out(b, out, sizeof out));
    assert_int_equal(out[5], 5);
    assert_ok(ndm_manager_close(b_side)); /* the deleter releases the alias */
    ndm_stats st;
    assert_ok(ndm_manager_stats(ndm_detached(), NDM_CPU, 0, &st));
    assert_int_equal(st.live_arrays, 0);
}

static void test_dlpack_versioned_matches_the_header(void **state)
{
    ndm_array a = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(2));
#ifdef DLPACK_MAJOR_VERSION
    DLManagedTensorVersioned *t = ndm_to_dlpack_versioned(a);
    assert_non_null(t);
    assert_int_equal(t->version.major, DLPACK_MAJOR_VERSION);
    ndm_array b = ndm_from_dlpack_versioned(ROOT(state), t);
    assert_live(b);
    assert_true(ndm_array_data(b) == ndm_array_data(a));
    assert_ok(ndm_array_release(b));
#else
    assert_null(ndm_to_dlpack_versioned(a));
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("no versioned tensors");
    assert_int_equal(ndm_from_dlpack_versioned(ROOT(state), NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
#endif
    assert_ok(ndm_array_release(a));
}

static void test_dlpack_cuda_device_fields(void **state)
{
    if (ndm_cuda_device_count() == 0) {
        print_message("no CUDA device: skipped\n");
        skip();
    }
    ndm_manager gpu = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(0));
    assert_live(gpu);
    ndm_array a = ndm_arange(gpu, NDM_F32, 0, 8, 1);
    DLManagedTensor *dl = ndm_to_dlpack(a);
    assert_non_null(dl);
    assert_int_equal(dl->dl_tensor.device.device_type, kDLCUDA);
    assert_int_equal(dl->dl_tensor.device.device_id, 0);
    /* a CPU manager cannot adopt device memory; the CUDA one can */
    assert_int_equal(ndm_from_dlpack(ROOT(state), dl).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    ndm_array b = ndm_from_dlpack(gpu, dl);
    assert_live(b);
    assert_true(ndm_device_eq(ndm_array_device(b), NDM_CUDA(0)));
    assert_ok(ndm_add_scalar_(b, 1)); /* written through b, read through a */
    double v;
    assert_ok(ndm_item(ndm_select(a, 0, 7), &v));
    assert_true(v == 8);
    assert_ok(ndm_manager_close(gpu));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_dlpack_export_describes_the_view),
        TEST(test_dlpack_export_keeps_storage_and_shows_lent),
        TEST(test_dlpack_export_counts_storage_once),
        TEST(test_dlpack_export_refuses_stale_handles),
        TEST(test_dlpack_import_adopts_without_copy),
        TEST(test_dlpack_import_strided_and_offset),
        TEST(test_dlpack_import_refuses_bad_tensors),
        TEST(test_dlpack_import_refuses_wrapping_and_overflowing_tensors),
        TEST(test_dlpack_import_refuses_misaligned_data),
        TEST(test_dlpack_round_trip_through_ndm),
        TEST(test_dlpack_versioned_matches_the_header),
        TEST(test_dlpack_cuda_device_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
