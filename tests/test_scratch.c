/* Kernel scratch comes from ndm's allocator: counted in the statistics,
 * refused by the output manager's limit with a message naming the
 * operation, and recorded in history under the operation's frame; on the
 * CPU and, through the host stand-in, on the CUDA path. */
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h"

static ndm_memory_stats mem(ndm_device d)
{
    ndm_memory_stats s;
    assert_ok(ndm_memory_stats_get(d, &s));
    return s;
}

/* A 128 x 128 by 128 x 64 product: on the CPU ndm's blocked kernel, which
 * packs panels of both operands. */
static void operands(ndm_manager m, ndm_device d, ndm_array *a, ndm_array *b, ndm_array *bt)
{
    *a = ndm_full(m, NDM_F32, 0.5, NDM_SHAPE(128, 128));
    ndm_array b0 = ndm_full(m, NDM_F32, 2.0, NDM_SHAPE(256, 256));
    assert_live(*a);
    assert_live(b0);
    if (d.type != NDM_DEVICE_CPU) {
        ndm_array x = ndm_to(*a, d), y = ndm_to(b0, d);
        assert_live(x);
        assert_live(y);
        assert_ok(ndm_array_release(*a));
        assert_ok(ndm_array_release(b0));
        *a = x, b0 = y;
    }
    *b = b0;
    /* a step on both axes: a layout no GEMM reads, copied into scratch on
     * CUDA (the views between are the manager's, closed with it) */
    *bt = ndm_slice(ndm_slice(ndm_transpose(b0), 0, 0, 256, 2), 1, 0, 256, 4);
    assert_live(*bt);
}

static void release3(ndm_array a, ndm_array b, ndm_array c)
{
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_array_release(c));
}

/* The product's scratch is allocated and freed by the allocator: more
 * blocks pass through it than the one output, and its allocated bytes come
 * back to where they were. */
static void scratch_counted(void **state, ndm_device d)
{
    ndm_manager m = ndm_manager_new_on(ROOT(state), "inputs", d);
    ndm_array a, b, bt;
    operands(m, d, &a, &b, &bt);
    ndm_array warm = ndm_matmul(a, bt); /* segments in place */
    assert_live(warm);
    assert_ok(ndm_array_release(warm));
    ndm_memory_stats before = mem(d);
    ndm_array c = ndm_matmul(a, bt);
    assert_live(c);
    assert_ok(ndm_array_release(c));
    ndm_memory_stats after = mem(d);
    int64_t blocks = after.allocation[NDM_POOL_ALL].allocated -
                     before.allocation[NDM_POOL_ALL].allocated;
    assert_true(blocks >= 2); /* the output, and at least one scratch block */
    assert_int_equal(after.allocated_bytes[NDM_POOL_ALL].current,
                     before.allocated_bytes[NDM_POOL_ALL].current);
    assert_int_equal(after.allocation[NDM_POOL_ALL].current,
                     before.allocation[NDM_POOL_ALL].current);
    release3(a, b, bt);
    assert_ok(ndm_manager_close(m));
}

/* Under a limit that holds the output but not the output and the scratch,
 * the product is refused, naming itself, and the managers stay intact. */
static void scratch_limited(void **state, ndm_device d)
{
    ndm_manager m = ndm_manager_new_on(ROOT(state), "inputs", d);
    ndm_manager out = ndm_manager_new_on(ROOT(state), "out", d);
    ndm_array a, b, bt;
    operands(m, d, &a, &b, &bt);
    /* the output is 128 x 64 f32: 32 KiB */
    assert_ok(ndm_manager_set_limit(out, d, 32768 + 512));
    ndm_memory_stats before = mem(d);
    ndm_array c = ndm_matmul_to(out, a, bt);
    assert_true(c.id == 0);
    ndm_status st = ndm_last_status();
    assert_true(st == NDM_E_QUOTA || st == NDM_E_OOM);
    assert_error_has("ndm_matmul");
    ndm_memory_stats after = mem(d);
    assert_int_equal(after.allocated_bytes[NDM_POOL_ALL].current,
                     before.allocated_bytes[NDM_POOL_ALL].current);
    /* with room, the same product runs */
    assert_ok(ndm_manager_set_limit(out, d, 0));
    c = ndm_matmul_to(out, a, bt);
    assert_live(c);
    assert_ok(ndm_array_release(c));
    assert_manager_empty(out);
    release3(a, b, bt);
    assert_ok(ndm_manager_close(out));
    assert_ok(ndm_manager_close(m));
}

/* A file's bytes (NUL-terminated), or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

/* The sizes of the allocations the snapshot's history records under the
 * frame of ndm_matmul: the output's, and the product's scratch (the dense
 * copy on CUDA, the packed panels on the CPU). */
static int matmul_allocs_in(const char *js, int64_t *sizes, int max)
{
    int n = 0;
    for (const char *p = js; (p = strstr(p, "\"alloc\"")) && n < max; p++) {
        const char *end = strstr(p + 1, "\"action\"");
        const char *fr = strstr(p, "\"ndm_matmul");
        const char *sz = strstr(p, "\"size\"");
        if (!fr || (end && fr > end) || !sz || (end && sz > end))
            continue;
        sz += 6;
        while (*sz == ' ' || *sz == ':')
            sz++;
        sizes[n++] = strtoll(sz, NULL, 10);
    }
    return n;
}

static void scratch_in_history(void **state, ndm_device d)
{
    ndm_manager m = ndm_manager_new_on(ROOT(state), "inputs", d);
    ndm_array a, b, bt;
    operands(m, d, &a, &b, &bt);
    assert_ok(ndm_memory_record_history(true, 0));
    ndm_array c = ndm_matmul(a, bt);
    assert_live(c);
    char path[512];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ndm_scratch_%d.json", dir && *dir ? dir : "/tmp",
             (int)getpid());
    assert_ok(ndm_memory_dump_snapshot(path));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_array_release(c));
    char *js = slurp(path);
    if (!getenv("NDM_TEST_KEEP"))
        remove(path);
    assert_non_null(js);
    int64_t sizes[64];
    int n = matmul_allocs_in(js, sizes, 64);
    free(js);
    /* the output is one; the others are scratch */
    if (n < 2)
        fail_msg("no scratch allocation under ndm_matmul in the snapshot (%d of ndm_matmul)", n);
    release3(a, b, bt);
    assert_ok(ndm_manager_close(m));
}

static void test_scratch_cpu_matmul_counted(void **state) { scratch_counted(state, NDM_CPU); }
static void test_scratch_cpu_matmul_limited(void **state) { scratch_limited(state, NDM_CPU); }
static void test_scratch_cpu_matmul_in_history(void **state)
{
    scratch_in_history(state, NDM_CPU);
}

/* The fast softmax folds each row in a scratch row of doubles, on the pool's
 * threads too: they charge the caller's output manager. */
static void test_scratch_cpu_softmax_limited(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "inputs");
    ndm_manager out = ndm_manager_new(ROOT(state), "out");
    ndm_array x = ndm_full(m, NDM_F32, 1.0, NDM_SHAPE(64, 4096));
    assert_live(x);
    /* the output, 1 MiB, fits; a 64 KiB row of scratch beside it does not */
    assert_ok(ndm_manager_set_limit(out, NDM_CPU, 64 * 4096 * 4 + 4096));
    ndm_array y = ndm_softmax_to_at(NDM_HERE, out, x, 1);
    assert_true(y.id == 0);
    ndm_status st = ndm_last_status();
    assert_true(st == NDM_E_QUOTA || st == NDM_E_OOM);
    assert_error_has("ndm_softmax");
    assert_manager_empty(out);
    assert_ok(ndm_manager_set_limit(out, NDM_CPU, 0));
    y = ndm_softmax_to_at(NDM_HERE, out, x, 1);
    assert_live(y);
    assert_ok(ndm_array_release(y));
    assert_ok(ndm_array_release(x));
    assert_ok(ndm_manager_close(out));
    assert_ok(ndm_manager_close(m));
}

/* The same on CUDA where a device is there (the host stand-in in the
 * cuda_host suites): the dense copy of the strided operand is scratch. */
static bool have_cuda(void)
{
    if (ndm_cuda_device_count() > 0)
        return true;
    printf("[ scratch ] no CUDA device: skipped\n");
    return false;
}
static void test_scratch_cuda_matmul_counted(void **state)
{
    if (have_cuda())
        scratch_counted(state, NDM_CUDA(0));
}
static void test_scratch_cuda_matmul_limited(void **state)
{
    if (have_cuda())
        scratch_limited(state, NDM_CUDA(0));
}
static void test_scratch_cuda_matmul_in_history(void **state)
{
    if (have_cuda())
        scratch_in_history(state, NDM_CUDA(0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_scratch_cpu_matmul_counted),
        TEST(test_scratch_cpu_matmul_limited),
        TEST(test_scratch_cpu_matmul_in_history),
        TEST(test_scratch_cpu_softmax_limited),
        TEST(test_scratch_cuda_matmul_counted),
        TEST(test_scratch_cuda_matmul_limited),
        TEST(test_scratch_cuda_matmul_in_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
