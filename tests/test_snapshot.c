/* Memory snapshots as PyTorch's tools read them: the pickle checked by Python's
 * own pickle module against the fields torch.cuda._memory_viz reads, the call
 * frames each event carries, and segments and trace captured at one moment
 * while other threads allocate.
 * Arguments: python3, tests/check_snapshot.py. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "manager/alloc/alloc.h"

static const char *python, *checker;
static char tmp_dir[64];

/* Run the checker on a snapshot; fails the test with its report. */
static void check(const char *snapshot, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s 2>&1", python, checker, snapshot, extra);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s does not hold as a PyTorch snapshot:\n%s", snapshot, out);
}

static void tmp_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmp_dir, name);
}

/* A small training step: a model, a batch with a forward, a loss and its
 * backward, so events come from the user's line, from inside a layer's
 * forward and from inside backward. */
static void train_step(ndm_manager model, ndm_module net, int step)
{
    char name[32];
    snprintf(name, sizeof name, "batch-%d", step);
    ndm_manager batch = ndm_manager_new(model, name);
    assert_live(batch);
    assert_ok(ndm_grad_begin(batch));
    ndm_array x = ndm_ones(batch, NDM_F32, NDM_SHAPE(32, 64));
    int64_t lab[32] = {0};
    ndm_array labels = ndm_from_buffer(batch, NDM_I64, lab, NDM_SHAPE(32));
    ndm_array loss = ndm_cross_entropy(ndm_forward(net, x), labels);
    assert_live(loss);
    assert_ok(ndm_backward(loss));
    assert_ok(ndm_grad_end());
    assert_ok(ndm_manager_close(batch));
}

static void test_snapshot_pickle_has_pytorch_fields(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(7);
    ndm_module net = ndm_sequential(model, 2, ((ndm_module[]){
        ndm_linear(model, 64, 128, true, &rng), ndm_linear(model, 128, 10, true, &rng)}));
    assert_true(net.id != 0);
    assert_ok(ndm_memory_record_history(true, 0));
    for (int step = 0; step < 3; step++)
        train_step(model, net, step);
    /* an allocation the limit refuses: PyTorch's oom entry */
    assert_ok(ndm_alloc_configure(NDM_CPU, "memory_limit_mb:64"));
    ndm_array big = ndm_empty(model, NDM_F32, NDM_SHAPE(64, 1024, 1024));
    assert_true(big.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    assert_ok(ndm_alloc_configure(NDM_CPU, ""));
    ndm_array keep = ndm_zeros(model, NDM_F32, NDM_SHAPE(1000)); /* alive in the snapshot */
    assert_live(keep);
    char pk[256], js[256];
    tmp_path(pk, sizeof pk, "step.pickle");
    tmp_path(js, sizeof js, "step.json");
    assert_ok(ndm_memory_dump_snapshot(pk));
    assert_ok(ndm_memory_dump_snapshot(js));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_manager_close(model));
    char extra[1024];
    snprintf(extra, sizeof extra,
             "--user-file tests/test_snapshot.c --expect-oom --expect-category test "
             "--expect-category unknown --expect-frame ndm_forward@lib/nn/module.c "
             "--expect-frame ndm_backward@lib/ops/autograd.c --expect-frame train_step@"
             "tests/test_snapshot.c --same-as '%s'",
             js);
    check(pk, extra);
    check(js, "");
}

/* The frames: the allocating function first, then the layer's forward at its
 * place in the library, then the user's function at the user's line. */
static void test_snapshot_frames_lead_to_the_users_line(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module lin = ndm_linear(model, 8, 4, false, &rng);
    ndm_array x = ndm_ones(model, NDM_F32, NDM_SHAPE(2, 8));
    assert_ok(ndm_memory_record_history(true, 0));
    ndm_array y = ndm_forward(lin, x); int line = __LINE__;
    assert_live(y);
    const ndm__call_frame *f;
    assert_int_equal(ndm__frames_current(&f), 0); /* popped on return */
    char pk[256];
    tmp_path(pk, sizeof pk, "frames.pickle");
    assert_ok(ndm_memory_dump_snapshot(pk));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_manager_close(model));
    char cmd[4096];
    /* The matmul's output inside forward: three frames, innermost first. */
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import pickle,sys; d=pickle.load(open('%s','rb'));"
             "ev=[e for e in d['device_traces'][0] if e['action']=='alloc' and "
             "len(e['frames'])==3 and e['frames'][1]['name']=='ndm_forward'];"
             "f=ev[0]['frames'] if ev else sys.exit('no alloc inside ndm_forward');"
             "ok=f[0]['filename']=='?\?' and f[0]['name'].startswith('ndm_') and "
             "f[1]['filename']=='lib/nn/module.c' and f[1]['line']>0 and "
             "f[2]=={'filename':'tests/test_snapshot.c','line':%d,'name':'%s'};"
             "sys.exit(0 if ok else 'frames: %%r' %% (f,))\" 2>&1",
             python, pk, line, __func__);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s", out);
}

/* With history off nothing is pushed: the frame stack stays empty even
 * inside calls that push when recording. */
static void test_snapshot_frames_cost_nothing_when_off(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    assert_int_equal(atomic_load(&ndm__instrumented) & 1, 0);
    assert_int_equal(ndm__frame_push("ndm_x", "f.c", "fn", 1, "lib.c", 2), 0);
    ndm_rng rng = ndm_rng_new(3);
    ndm_module lin = ndm_linear(model, 8, 4, false, &rng);
    ndm_array y = ndm_forward(lin, ndm_ones(model, NDM_F32, NDM_SHAPE(2, 8)));
    assert_live(y);
    const ndm__call_frame *f;
    assert_int_equal(ndm__frames_current(&f), 0);
    assert_ok(ndm_manager_close(model));
}

typedef struct churn {
    ndm_manager parent;
    atomic_bool stop;
    atomic_long rounds;
} churn;

/* Allocates and frees arrays of mixed sizes (some large enough to map and
 * unmap segments) until told to stop. */
static void *churn_main(void *arg)
{
    churn *c = arg;
    long k = 0;
    while (!atomic_load(&c->stop)) {
        ndm_manager m = ndm_manager_new(c->parent, "worker");
        if (!m.id)
            break;
        int64_t n = (k % 7 == 0) ? 3 << 20 : 256 + 64 * (k % 13);
        ndm_array a = ndm_empty(m, NDM_U8, NDM_SHAPE(n));
        ndm_array b = ndm_empty(m, NDM_F32, NDM_SHAPE(100 + k % 50));
        (void)a;
        (void)b;
        (void)!ndm_manager_close(m);
        k++;
        atomic_store(&c->rounds, k);
    }
    return NULL;
}

/* Every dump taken while another thread allocates replays exactly: no free
 * in the trace of a block the segments still show allocated. */
static void test_snapshot_segments_and_trace_agree_under_threads(void **state)
{
    churn c = {.parent = ROOT(state)};
    atomic_init(&c.stop, false);
    atomic_init(&c.rounds, 0);
    assert_ok(ndm_memory_record_history(true, 2000));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, churn_main, &c), 0);
    char paths[5][256];
    for (int i = 0; i < 5; i++) {
        while (atomic_load(&c.rounds) < 20L * (i + 1))
            usleep(1000);
        char name[32];
        snprintf(name, sizeof name, "churn-%d.pickle", i);
        tmp_path(paths[i], sizeof paths[i], name);
        assert_ok(ndm_memory_dump_snapshot(paths[i]));
    }
    atomic_store(&c.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_ok(ndm_memory_record_history(false, 0));
    for (int i = 0; i < 5; i++)
        check(paths[i], "");
}

static void test_snapshot_unwritable_path_is_io_error(void **state)
{
    (void)state;
    assert_status(ndm_memory_dump_snapshot("/nonexistent-dir/x.pickle"), NDM_E_IO);
    assert_error_has("/nonexistent-dir/x.pickle");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s python3 check_snapshot.py\n", argv[0]);
        return 2;
    }
    python = argv[1];
    checker = argv[2];
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ndm-snapshot-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        TEST(test_snapshot_pickle_has_pytorch_fields),
        TEST(test_snapshot_frames_lead_to_the_users_line),
        TEST(test_snapshot_frames_cost_nothing_when_off),
        TEST(test_snapshot_segments_and_trace_agree_under_threads),
        TEST(test_snapshot_unwritable_path_is_io_error),
    };
    int rc = cmocka_run_group_tests_name("snapshot", tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
    return rc;
}
