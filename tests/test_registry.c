/* The backend registry: the CPU built in, the CUDA module found, loaded and
 * checked on first use (a stand-in module here, so no GPU is needed), and
 * what a missing, broken or mismatched module answers. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "helpers.h"
#include "ndm/config.h"
#include "ops/dispatch.h"

static const char *self_path;

/* ---- the parent: each case in a fresh process ---------------------------- */

/* A module is loaded once per process: each search runs in a child (this
 * program again, with `mode`), with NDM_BACKEND_PATH set to `path` and
 * `extra` ("NAME=value" or NULL) in its environment. Its output goes into
 * out; the exit status is returned. */
static int run_child(const char *mode, const char *path, const char *extra, char *out, size_t n)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        setenv("NDM_BACKEND_PATH", path, 1);
        if (extra)
            putenv((char *)extra);
        execl(self_path, self_path, mode, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t k;
    while ((k = read(fd[0], out + len, n - 1 - len)) > 0)
        len += (size_t)k;
    out[len] = '\0';
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

#define assert_has(text, needle)                                                \
    do {                                                                        \
        if (!strstr((text), (needle)))                                          \
            fail_msg("\"%s\" lacks \"%s\"", (text), (needle));                  \
    } while (0)

#define NEED_MODULES()                                                          \
    do {                                                                        \
        if (!NDM_HAVE_CUDA) {                                                   \
            print_message("this build has no CUDA backend: no module is loaded; skipped\n"); \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* A fresh empty directory (removed by the caller). */
static void make_dir(char *buf, size_t n)
{
    snprintf(buf, n, "%s/ndm-registry-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(buf));
}

static void remove_dir(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/libndm-cuda.so", dir);
    (void)unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

static void test_registry_cpu_is_built_in(void **state)
{
    (void)state;
    assert_ptr_equal(ndm__backend_for(NDM_DEVICE_CPU), &ndm__cpu_backend);
    assert_string_equal(ndm__backend_unavailable(NDM_DEVICE_CPU), "");
    assert_int_equal(ndm__backend_device_count(NDM_DEVICE_CPU), 1);
    ndm__device_props p;
    assert_ok(ndm__backend_device_props(NDM_CPU, &p));
    assert_true(p.name[0] != '\0');
    assert_true(p.memory_bytes > 0);
    assert_int_equal(p.cc_major, 0);
    assert_status(ndm__backend_device_props((ndm_device){NDM_DEVICE_CPU, 1}, &p), NDM_E_DEVICE);
    assert_error_has("cpu:1 does not exist");
}

static int no_devices(void) { return 0; }
static const ndm__segment_source *no_source(int device)
{
    (void)device;
    return NULL;
}

static void test_registry_register_refuses_bad_tables(void **state)
{
    (void)state;
    ndm__backend t = {.abi = NDM__BACKEND_ABI + 1, .name = "odd", .type = NDM_DEVICE_CUDA};
    assert_status(ndm__backend_register(&t), NDM_E_INVALID);
    assert_error_has("odd: its table is of another ABI");
    t.abi = NDM__BACKEND_ABI;
    assert_status(ndm__backend_register(&t), NDM_E_INVALID);
    assert_error_has("odd: its table lacks a required member");
    assert_status(ndm__backend_register(&ndm__cpu_backend), NDM_E_INVALID);
    /* a collective table is whole or absent */
    ndm__backend whole = ndm__cpu_backend;
    whole.name = "odd";
    whole.type = NDM_DEVICE_CUDA;
    whole.device_count = no_devices;
    whole.segment_source = no_source;
    ndm__backend_collective half = {.id_bytes = 128};
    whole.collective = &half;
    assert_status(ndm__backend_register(&whole), NDM_E_INVALID);
    assert_error_has("odd: its collective table lacks a member");
}

static void test_registry_missing_module_says_what_where_why(void **state)
{
    (void)state;
    NEED_MODULES();
    char dir[256], out[4096];
    make_dir(dir, sizeof dir);
    assert_int_equal(run_child("--probe", dir, NULL, out, sizeof out), 0);
    remove_dir(dir);
    assert_has(out, "count 0\n");
    assert_has(out, "new_on NDM_E_UNSUPPORTED: ndm_manager_new_on: device cuda:0: the CUDA "
                    "backend module libndm-cuda.so could not be loaded");
    char want[512];
    snprintf(want, sizeof want, "NDM_BACKEND_PATH=%s", dir);
    assert_has(out, want);
    snprintf(want, sizeof want, "%s/libndm-cuda.so: cannot open shared object file", dir);
    assert_has(out, want);
    /* the loader's default path was tried too */
    assert_has(out, "libndm-cuda.so: cannot open shared object file");
}

static void test_registry_broken_module_reports_the_loader_error(void **state)
{
    (void)state;
    NEED_MODULES();
    char dir[256], path[512], out[4096];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/libndm-cuda.so", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 256; i++)
        fputs("not a shared object ", f);
    fclose(f);
    /* what the loader says of this file, to find in the message */
    assert_null(dlopen(path, RTLD_NOW | RTLD_LOCAL));
    char reason[512];
    snprintf(reason, sizeof reason, "%s", dlerror());
    assert_int_equal(run_child("--probe", dir, NULL, out, sizeof out), 0);
    remove_dir(dir);
    assert_has(out, "new_on NDM_E_UNSUPPORTED");
    assert_has(out, reason);
}

static void test_registry_module_without_entry_point_is_refused(void **state)
{
    (void)state;
    NEED_MODULES();
    /* a real shared object that is not a backend: zlib, under the name */
    Dl_info info;
    assert_true(dladdr((void *)zlibVersion, &info));
    char dir[256], path[512], out[4096];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/libndm-cuda.so", dir);
    assert_int_equal(symlink(info.dli_fname, path), 0);
    assert_int_equal(run_child("--probe", dir, NULL, out, sizeof out), 0);
    remove_dir(dir);
    assert_has(out, "new_on NDM_E_UNSUPPORTED");
    char want[600];
    snprintf(want, sizeof want, "%s: no entry point ndm_backend_cuda_register", path);
    assert_has(out, want);
}

static void test_registry_module_of_another_abi_is_refused(void **state)
{
    (void)state;
    NEED_MODULES();
    char out[4096], want[128];
    assert_int_equal(run_child("--probe", getenv("NDM_TEST_STAND_IN_DIR"), "NDM_STAND_IN_ABI=99",
                               out, sizeof out),
                     0);
    assert_has(out, "count 0\n");
    snprintf(want, sizeof want, "built for backend ABI 99, this libndm has ABI %d",
             NDM__BACKEND_ABI);
    assert_has(out, want);
}

static void test_registry_stand_in_module_serves_cuda_devices(void **state)
{
    (void)state;
    NEED_MODULES();
    /* a list: the first directory is empty, the search goes on */
    char dir[256], path[600], out[16384];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s::%s", dir, getenv("NDM_TEST_STAND_IN_DIR"));
    int rc = run_child("--stand-in", path, NULL, out, sizeof out);
    remove_dir(dir);
    if (rc != 0)
        fail_msg("the stand-in suite failed:\n%s", out);
    assert_has(out, "[==========] 4 test(s) run.");
}

/* A copy of the stand-in module cut at `len` bytes (a download or a copy cut
 * short): the loader would map its segments past the end of the file and
 * die of SIGBUS on the first touch; the registry reads the headers first
 * and says what is wrong. */
static void probe_truncated(const char *stand_in, long len, const char *reason)
{
    char dir[256], path[512], out[4096];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/libndm-cuda.so", dir);
    FILE *in = fopen(stand_in, "rb"), *copy = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(copy);
    char buf[4096];
    long left = len;
    while (left > 0) {
        size_t k = fread(buf, 1, left < (long)sizeof buf ? (size_t)left : sizeof buf, in);
        assert_true(k > 0);
        assert_int_equal(fwrite(buf, 1, k, copy), k);
        left -= (long)k;
    }
    fclose(in);
    assert_int_equal(fclose(copy), 0);
    int rc = run_child("--probe", dir, NULL, out, sizeof out);
    remove_dir(dir);
    if (rc != 0)
        fail_msg("cut at %ld bytes: the child exited with %d:\n%s", len, rc, out);
    assert_has(out, "count 0\n");
    assert_has(out, "new_on NDM_E_UNSUPPORTED");
    char want[700];
    snprintf(want, sizeof want, "%s: %s", path, reason);
    if (!strstr(out, want))
        fail_msg("cut at %ld bytes: \"%s\" lacks \"%s\"", len, out, want);
}

static void test_registry_truncated_module_is_a_message_not_a_crash(void **state)
{
    (void)state;
    char stand_in[512];
    snprintf(stand_in, sizeof stand_in, "%s/libndm-cuda.so", getenv("NDM_TEST_STAND_IN_DIR"));
    struct stat st;
    assert_int_equal(stat(stand_in, &st), 0);
    long size = (long)st.st_size;
    probe_truncated(stand_in, 10, "a damaged ELF file: 10 bytes, shorter than its 64-byte header");
    probe_truncated(stand_in, 64, "a damaged ELF file: its ");
    probe_truncated(stand_in, size / 2, "a damaged ELF file: its ");
    probe_truncated(stand_in, size - 1, "a damaged ELF file: its section headers end at byte");
    /* whole, the same copy loads */
    char dir[256], path[512], out[16384];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/libndm-cuda.so", dir);
    assert_int_equal(symlink(stand_in, path), 0);
    int rc = run_child("--probe", dir, NULL, out, sizeof out);
    remove_dir(dir);
    assert_int_equal(rc, 0);
    assert_has(out, "count 1\n");
    assert_has(out, "new_on ok");
}

/* ---- children ------------------------------------------------------------- */

/* What a program sees on first use of cuda:0. */
static int probe(void)
{
    printf("count %d\n", ndm_cuda_device_count());
    ndm_manager g = ndm_manager_new_on(ndm_system(), "gpu", NDM_CUDA(0));
    printf("new_on %s: %s\n", g.id ? "ok" : ndm_status_name(ndm_last_status()), ndm_last_error());
    if (g.id)
        (void)!ndm_manager_close(g);
    return 0;
}

#define RACERS 8

static void *count_devices(void *arg)
{
    *(int *)arg = ndm_cuda_device_count();
    return NULL;
}

/* First: threads race to load the module; one load, one answer for all. */
static void test_stand_in_loaded_once_by_racing_threads(void **state)
{
    (void)state;
    pthread_t t[RACERS];
    int got[RACERS];
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, count_devices, &got[i]), 0);
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(got[i], 1);
    }
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    assert_non_null(b);
    assert_string_equal(b->name, "stand-in");
    assert_string_equal(ndm__backend_unavailable(NDM_DEVICE_CUDA), "");
    ndm__device_props p;
    assert_ok(ndm__backend_device_props(NDM_CUDA(0), &p));
    assert_string_equal(p.name, "stand-in");
    assert_int_equal(p.cc_major, 9);
    assert_status(ndm__backend_device_props(NDM_CUDA(1), &p), NDM_E_DEVICE);
}

static void test_stand_in_arrays_round_trip(void **state)
{
    ndm_manager g = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(0));
    assert_live(g);
    ndm_array x = ndm_arange(g, NDM_F32, 0, 6, 1);
    assert_live(x);
    assert_true(ndm_device_eq(ndm_array_device(x), NDM_CUDA(0)));
    ndm_manager c = ndm_manager_new(ROOT(state), "cpu");
    ndm_array h = ndm_mul_scalar(ndm_to_to(c, x, NDM_CPU), 2.0);
    assert_live(h);
    ndm_array y = ndm_to_to(g, h, NDM_CUDA(0));
    assert_live(y);
    float v[6];
    assert_ok(ndm_array_copy_out(y, v, sizeof v));
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == 2.0f * (float)i);
    /* the allocator carved them from the module's segment source */
    ndm_memory_stats ms;
    assert_ok(ndm_memory_stats_get(NDM_CUDA(0), &ms));
    assert_true(ms.reserved_bytes[NDM_POOL_ALL].current > 0);
    ndm_stats st;
    assert_ok(ndm_manager_stats(g, NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 2);
    assert_ok(ndm_manager_close(g));
    assert_ok(ndm_manager_close(c));
    assert_manager_empty(ROOT(state));
}

static void test_stand_in_declined_case_names_op_dtype_device(void **state)
{
    ndm_manager g = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(0));
    assert_live(g);
    ndm_array x = ndm_ones(g, NDM_F32, NDM_SHAPE(2, 3));
    assert_live(x);
    assert_true(ndm_array_is_null(ndm_zeros(g, NDM_F16, NDM_SHAPE(4))));
    assert_int_equal(ndm_last_status(), NDM_E_UNSUPPORTED);
    assert_error_has("ndm_zeros: fill (f16) on cuda:0 is not supported by the stand-in backend");
    ndm_array t = ndm_transpose(x);
    assert_live(t);
    assert_true(ndm_array_is_null(ndm_astype(t, NDM_F16)));
    assert_error_has("copy (f16,f32 (strided)) on cuda:0 is not supported by the stand-in backend");
    /* nothing moved: the manager holds x and its view only, and x reads back */
    ndm_stats st;
    assert_ok(ndm_manager_stats(g, NDM_CUDA(0), NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.live_arrays, 2);
    float v[6];
    assert_ok(ndm_array_copy_out(x, v, sizeof v));
    assert_true(v[5] == 1.0f);
    assert_ok(ndm_manager_close(g));
    assert_manager_empty(ROOT(state));
}

static void test_stand_in_missing_index_does_not_exist(void **state)
{
    ndm_manager g = ndm_manager_new_on(ROOT(state), "gpu", NDM_CUDA(1));
    assert_true(ndm_manager_is_null(g));
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    assert_error_has("device cuda:1 does not exist (1 CUDA device found)");
    assert_manager_empty(ROOT(state));
}

int main(int argc, char **argv)
{
    self_path = argc > 0 ? argv[0] : "test_registry";
    if (argc > 1 && !strcmp(argv[1], "--probe"))
        return probe();
    if (argc > 1 && !strcmp(argv[1], "--stand-in")) {
        const struct CMUnitTest tests[] = {
            TEST(test_stand_in_loaded_once_by_racing_threads),
            TEST(test_stand_in_arrays_round_trip),
            TEST(test_stand_in_declined_case_names_op_dtype_device),
            TEST(test_stand_in_missing_index_does_not_exist),
        };
        return cmocka_run_group_tests_name("registry stand-in", tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        TEST(test_registry_cpu_is_built_in),
        TEST(test_registry_register_refuses_bad_tables),
        TEST(test_registry_missing_module_says_what_where_why),
        TEST(test_registry_broken_module_reports_the_loader_error),
        TEST(test_registry_module_without_entry_point_is_refused),
        TEST(test_registry_module_of_another_abi_is_refused),
        TEST(test_registry_stand_in_module_serves_cuda_devices),
        TEST(test_registry_truncated_module_is_a_message_not_a_crash),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}
