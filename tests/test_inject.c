/* Allocation-failure injection over whole workloads: one training step and one
 * predictor request fail at each of their allocations in turn (storage,
 * records, lists, graph nodes, objects, scratch), and every failure must leave
 * an error, exact counts and bytes in every manager, and a step that retries.
 * Also what AddressSanitizer sees inside the caching allocator. */
#include <inttypes.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "manager/alloc/alloc.h"
#include "manager/alloc/pool.h" /* NDM__ASAN */

extern char **environ;

/* Enough for the step below many times over; the sweep stops at the first N
 * that the step no longer reaches. */
#define MAX_SWEEP 20000

/* ---- the workloads ----------------------------------------------------------------- */

typedef struct trainer {
    ndm_manager model, trainer;
    ndm_module net;
    ndm_optimizer opt;
    float xs[16][4];
    int64_t ys[16];
} trainer;

static void trainer_make(trainer *t, ndm_manager root)
{
    t->model = ndm_manager_new(root, "model");
    assert_live(t->model);
    ndm_rng rng = ndm_rng_new(3);
    t->net = ndm_sequential(t->model,
                            NDM_MODULES(ndm_linear(t->model, 4, 8, true, &rng),
                                        ndm_relu_module(t->model),
                                        ndm_linear(t->model, 8, 3, true, &rng)));
    assert_true(t->net.id != 0);
    t->opt = ndm_adam(t->model, t->net, 0.01, 0.9, 0.999, 1e-8, 0);
    assert_true(t->opt.id != 0);
    assert_ok(ndm_manager_cap(t->model, NDM_CAP_ARRAYS));
    t->trainer = ndm_manager_new(t->model, "trainer");
    assert_live(t->trainer);
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 4; j++)
            t->xs[i][j] = (float)((i * 7 + j * 3) % 11) / 5.0f - 1.0f;
        t->ys[i] = i % 3;
    }
}

/* The first error of a workload, kept before cleanup calls run. */
typedef struct outcome {
    ndm_status st;
    char msg[512];
} outcome;

static void note(outcome *o, ndm_status st)
{
    if (st < 0 && o->st >= 0) {
        o->st = st;
        snprintf(o->msg, sizeof o->msg, "%s", ndm_last_error());
    }
}

/* One full step in a batch manager: forward, loss, backward, optimizer step. */
static outcome train_step(trainer *t)
{
    outcome o = {NDM_OK, ""};
    ndm_manager batch = ndm_manager_new(t->trainer, "batch");
    if (!batch.id) {
        note(&o, ndm_last_status());
        return o;
    }
    note(&o, ndm_optimizer_zero_grad(t->opt));
    ndm_array x = ndm_from_buffer(batch, NDM_F32, t->xs, NDM_SHAPE(16, 4));
    ndm_array y = ndm_from_buffer(batch, NDM_I64, t->ys, NDM_SHAPE(16));
    if (!x.id || !y.id)
        note(&o, ndm_last_status());
    bool recording = false;
    if (o.st == NDM_OK) {
        note(&o, ndm_grad_begin(batch));
        recording = o.st == NDM_OK;
    }
    if (o.st == NDM_OK) {
        ndm_array loss = ndm_cross_entropy(ndm_forward(t->net, x), y);
        note(&o, loss.id ? ndm_backward(loss) : ndm_last_status());
    }
    if (recording)
        note(&o, ndm_grad_end());
    if (o.st == NDM_OK)
        note(&o, ndm_optimizer_step(t->opt));
    note(&o, ndm_manager_close(batch));
    return o;
}

typedef struct server {
    ndm_manager model, callers;
    ndm_module net;
    ndm_predictor pred;
    float x[2][4];
} server;

static void server_make(server *s, ndm_manager root)
{
    s->model = ndm_manager_new(root, "served");
    assert_live(s->model);
    ndm_rng rng = ndm_rng_new(9);
    s->net = ndm_sequential(s->model,
                            NDM_MODULES(ndm_linear(s->model, 4, 8, true, &rng),
                                        ndm_gelu_module(s->model),
                                        ndm_linear(s->model, 8, 2, true, &rng)));
    assert_true(s->net.id != 0);
    s->pred = ndm_predictor_new(s->model, s->net);
    assert_true(s->pred.id != 0);
    s->callers = ndm_manager_new(root, "callers");
    assert_live(s->callers);
    for (int j = 0; j < 8; j++)
        s->x[j / 4][j % 4] = (float)j / 4.0f - 1.0f;
}

/* One request: its input and answer live in a request manager closed after. */
static outcome serve_request(server *s, float answer[4])
{
    outcome o = {NDM_OK, ""};
    ndm_manager req = ndm_manager_new(s->callers, "request");
    if (!req.id) {
        note(&o, ndm_last_status());
        return o;
    }
    ndm_array x = ndm_from_buffer(req, NDM_F32, s->x, NDM_SHAPE(2, 4));
    ndm_array y = x.id ? ndm_predict(s->pred, x) : x;
    if (!y.id)
        note(&o, ndm_last_status());
    else if (ndm_array_manager(y).id != req.id)
        fail_msg("the answer is not in the request manager");
    else
        note(&o, ndm_array_copy_out(y, answer, 4 * sizeof *answer));
    note(&o, ndm_manager_close(req));
    return o;
}

/* ---- what must not change ---------------------------------------------------------- */

typedef struct figures {
    ndm_stats own[4], sub[4];
    int64_t allocated, allocations;
} figures;

static void take(figures *f, const ndm_manager *ms, int n)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < n; i++) {
        assert_ok(ndm_manager_stats(ms[i], NDM_CPU, 0, &f->own[i]));
        assert_ok(ndm_manager_stats(ms[i], NDM_CPU, NDM_STATS_SUBTREE, &f->sub[i]));
    }
    ndm_memory_stats ms_;
    assert_ok(ndm_memory_stats_get(NDM_CPU, &ms_));
    f->allocated = ms_.allocated_bytes[NDM_POOL_ALL].current;
    f->allocations = ms_.allocation[NDM_POOL_ALL].current;
}

static void same(const figures *a, const figures *b, const ndm_manager *ms, int n,
                 const char *when, int64_t at)
{
    for (int i = 0; i < n; i++) {
        const ndm_stats *x[2] = {&a->own[i], &a->sub[i]}, *y[2] = {&b->own[i], &b->sub[i]};
        for (int k = 0; k < 2; k++) {
            if (x[k]->live_arrays != y[k]->live_arrays || x[k]->live_bytes != y[k]->live_bytes ||
                x[k]->children != y[k]->children || x[k]->resources != y[k]->resources) {
                (void)!ndm_debug_dump(ms[0], stderr);
                fail_msg("%s (failure %" PRId64 "): manager %d%s holds %llu arrays, %llu bytes, "
                         "%llu children, %llu resources; before: %llu, %llu, %llu, %llu",
                         when, at, i, k ? " (subtree)" : "",
                         (unsigned long long)y[k]->live_arrays,
                         (unsigned long long)y[k]->live_bytes,
                         (unsigned long long)y[k]->children,
                         (unsigned long long)y[k]->resources,
                         (unsigned long long)x[k]->live_arrays,
                         (unsigned long long)x[k]->live_bytes,
                         (unsigned long long)x[k]->children,
                         (unsigned long long)x[k]->resources);
            }
        }
    }
    if (a->allocated != b->allocated || a->allocations != b->allocations)
        fail_msg("%s (failure %" PRId64 "): the allocator holds %" PRId64 " bytes in %" PRId64
                 " blocks, before %" PRId64 " in %" PRId64,
                 when, at, b->allocated, b->allocations, a->allocated, a->allocations);
}

/* ---- the sweeps --------------------------------------------------------------------- */

typedef struct sweep {
    int64_t failed;    /* attempts that returned an error */
    int64_t absorbed;  /* attempts whose injected failure the library worked around */
    int64_t reached;   /* the N at which the workload no longer met its failure */
    unsigned kinds;    /* the kinds of the sites that failed */
} sweep;

/* One piece of work swept: every allocation it makes fails in turn. */
typedef struct swept {
    const char *what;            /* "step", "request": for messages */
    outcome (*run)(void *ctx);   /* the work, once */
    void (*check)(void *ctx);    /* asserts the result of a run that succeeded (or NULL) */
    void *ctx;
    ndm_manager *ms;             /* managers whose figures must not change */
    int nms;
    bool same_after_retry;       /* a retry too leaves the figures as they were */
} swept;

/* Fail the n-th allocation of the work for n = 1, 2, ... until a run makes
 * no more than n - 1: each failure must be NDM_E_OOM with a message, leave
 * every figure exact, and be followed by a retry that succeeds. */
static sweep sweep_work(const swept *w)
{
    outcome warm = w->run(w->ctx);
    if (warm.st < 0)
        fail_msg("the %s fails without injection: %s", w->what, warm.msg);
    sweep sw = {0, 0, 0, 0};
    for (int64_t n = 1; n <= MAX_SWEEP; n++) {
        figures before, after;
        take(&before, w->ms, w->nms);
        ndm__inject_fail_after(n, NDM__INJ_ALL);
        outcome o = w->run(w->ctx);
        bool pending = ndm__inject_pending();
        int64_t fired = ndm__inject_fired();
        sw.kinds |= ndm__inject_fired_kind();
        if (getenv("NDM_TEST_VERBOSE") && fired)
            fprintf(stderr, "failure %" PRId64 " (kind %#x): %s\n", n,
                    ndm__inject_fired_kind(), o.st < 0 ? o.msg : "(absorbed)");
        ndm__inject_fail_after(0, 0);
        take(&after, w->ms, w->nms);
        same(&before, &after, w->ms, w->nms, w->what, n);
        if (o.st < 0) {
            if (fired != 1)
                fail_msg("the %s failed with no injected failure: %s", w->what, o.msg);
            if (o.st != NDM_E_OOM || !o.msg[0])
                fail_msg("failure %" PRId64 " of the %s: %s, \"%s\"", n, w->what,
                         ndm_status_name(o.st), o.msg);
            sw.failed++;
            outcome r = w->run(w->ctx);
            if (r.st < 0)
                fail_msg("the retry after failure %" PRId64 " (%s) failed: %s", n, o.msg, r.msg);
            if (w->same_after_retry) {
                take(&after, w->ms, w->nms);
                same(&before, &after, w->ms, w->nms, "retried work", n);
            }
        } else if (pending) {
            sw.reached = n;
        } else {
            sw.absorbed++;
        }
        if (w->check)
            w->check(w->ctx);
        if (sw.reached)
            break;
    }
    if (!sw.reached)
        fail_msg("the %s still allocates after %d allocations", w->what, MAX_SWEEP);
    return sw;
}

static outcome train_once(void *ctx) { return train_step(ctx); }

static sweep sweep_train(ndm_manager root)
{
    trainer t;
    trainer_make(&t, root);
    ndm_manager ms[3] = {t.model, t.trainer, root};
    sweep sw = sweep_work(&(swept){"training step", train_once, NULL, &t, ms, 3, true});
    assert_ok(ndm_manager_close(t.model));
    return sw;
}

typedef struct serve_ctx {
    server *s;
    float want[4], got[4];
} serve_ctx;

static outcome serve_once(void *ctx)
{
    serve_ctx *c = ctx;
    memset(c->got, 0, sizeof c->got);
    return serve_request(c->s, c->got);
}

static void serve_check(void *ctx)
{
    serve_ctx *c = ctx;
    assert_memory_equal(c->got, c->want, sizeof c->want);
}

static sweep sweep_serve(ndm_manager root)
{
    server s;
    server_make(&s, root);
    ndm_manager ms[4] = {s.model, s.callers, ndm_predictor_manager(s.pred), root};
    serve_ctx c = {&s, {0}, {0}};
    outcome warm = serve_request(&s, c.want);
    if (warm.st < 0)
        fail_msg("a request fails without injection: %s", warm.msg);
    sweep sw = sweep_work(&(swept){"request", serve_once, serve_check, &c, ms, 4, false});
    assert_ok(ndm_manager_close(s.callers));
    assert_ok(ndm_manager_close(s.model));
    return sw;
}

/* ---- AddressSanitizer inside the caching allocator ---------------------------------- */

enum touch { TOUCH_LAST_BYTE, TOUCH_PAST_END, TOUCH_AFTER_RELEASE };

/* In a child process: make a small array (12 bytes in a 512-byte block of a
 * cached small segment) and touch it as `how` says. Returns the child's wait
 * status and its stderr. */
static int touch_in_child(ndm_manager root, enum touch how, char **err)
{
    FILE *fe = tmpfile();
    assert_non_null(fe);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fileno(fe), 2);
        ndm_array a = ndm_empty(root, NDM_F32, NDM_SHAPE(3));
        volatile char *p = ndm_array_data(a);
        if (!p)
            _exit(3);
        if (how == TOUCH_LAST_BYTE)
            p[11] = 1;
        else if (how == TOUCH_PAST_END)
            p[12] = 1; /* inside the block, past the request */
        if (ndm_array_release(a) != NDM_OK)
            _exit(4);
        if (how == TOUCH_AFTER_RELEASE)
            p[0] = 1; /* the block waits in the thread cache */
        _exit(0);
    }
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    fseek(fe, 0, SEEK_END);
    long size = ftell(fe);
    rewind(fe);
    *err = calloc((size_t)size + 1, 1);
    assert_non_null(*err);
    assert_int_equal(fread(*err, 1, (size_t)size, fe), (size_t)size);
    fclose(fe);
    return wst;
}

static void test_asan_overrun_of_cached_array_caught(void **state)
{
    if (!NDM__ASAN) {
        print_message("skipped: this build has no AddressSanitizer (-Db_sanitize=address)\n");
        skip();
    }
    /* warm the cache: the child's array comes from a block freed before */
    ndm_array w = ndm_zeros(ROOT(state), NDM_F32, NDM_SHAPE(3));
    assert_live(w);
    assert_ok(ndm_array_release(w));
    char *err;
    int wst = touch_in_child(ROOT(state), TOUCH_LAST_BYTE, &err);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fail_msg("writing the last requested byte was refused (status %d):\n%s", wst, err);
    free(err);
    const enum touch bad[2] = {TOUCH_PAST_END, TOUCH_AFTER_RELEASE};
    for (int i = 0; i < 2; i++) {
        wst = touch_in_child(ROOT(state), bad[i], &err);
        if (WIFEXITED(wst) && WEXITSTATUS(wst) == 0)
            fail_msg("%s went unnoticed", i ? "a use after release" : "an overrun");
        if (!strstr(err, "ERROR: AddressSanitizer: use-after-poison"))
            fail_msg("%s: no ASan report in:\n%s", i ? "use after release" : "overrun", err);
        free(err);
    }
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_inject_counts_only_armed_kinds(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "m");
    /* armed for graph nodes only: storage goes on */
    ndm__inject_fail_after(1, NDM__INJ_NODE);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    assert_live(a);
    assert_true(ndm__inject_pending());
    /* armed for storage: the next array fails with a message, and counts once */
    ndm__inject_fail_after(1, NDM__INJ_STORAGE);
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    assert_true(b.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    assert_error_has("injected");
    assert_false(ndm__inject_pending());
    assert_int_equal(ndm__inject_fired(), 1);
    ndm_array c = ndm_zeros(m, NDM_F32, NDM_SHAPE(4)); /* only the n-th fails */
    assert_live(c);
    ndm__inject_fail_after(0, 0);
    assert_int_equal(test_live_arrays(m), 2);
    assert_ok(ndm_manager_close(m));
}

static void test_inject_train_step_every_allocation(void **state)
{
    sweep sw = sweep_train(ROOT(state));
    /* the sweep met real failures, one per allocation of the step */
    assert_true(sw.failed > 20);
    assert_int_equal(sw.failed + sw.absorbed + 1, sw.reached);
    /* storage, the graph and its nodes, the graph's resource record, and
     * backward's ordering buffers all failed somewhere */
    unsigned want = NDM__INJ_STORAGE | NDM__INJ_NODE | NDM__INJ_OBJECT | NDM__INJ_SCRATCH;
    if ((sw.kinds & want) != want)
        fail_msg("the sweep failed kinds %#x, not all of %#x", sw.kinds, want);
    print_message("training step: %" PRId64 " allocations failed in turn, %" PRId64
                  " absorbed\n", sw.failed, sw.absorbed);
}

static void test_inject_predict_every_allocation(void **state)
{
    sweep sw = sweep_serve(ROOT(state));
    assert_true(sw.failed > 3);
    assert_int_equal(sw.failed + sw.absorbed + 1, sw.reached);
    assert_true(sw.kinds & NDM__INJ_STORAGE);
    print_message("request: %" PRId64 " allocations failed in turn, %" PRId64 " absorbed\n",
                  sw.failed, sw.absorbed);
}

/* Building a model, its optimizer and a predictor fails cleanly at each of
 * its allocations: the error is NDM_E_OOM, and once the model closes nothing
 * is left, in the tree or the allocator (leaked objects: LeakSanitizer). */
static void test_inject_model_setup_every_allocation(void **state)
{
    ndm_manager root = ROOT(state);
    figures before, after;
    take(&before, &root, 1);
    int64_t failed = 0;
    for (int64_t n = 1; n <= MAX_SWEEP; n++) {
        ndm_manager model = ndm_manager_new(root, "model");
        assert_live(model);
        ndm__inject_fail_after(n, NDM__INJ_ALL);
        ndm_rng rng = ndm_rng_new(1);
        ndm_module net = ndm_sequential(model,
                                        NDM_MODULES(ndm_linear(model, 4, 8, true, &rng),
                                                    ndm_relu_module(model),
                                                    ndm_linear(model, 8, 3, true, &rng)));
        ndm_optimizer opt = net.id ? ndm_adam(model, net, 0.01, 0.9, 0.999, 1e-8, 0)
                                   : (ndm_optimizer){0};
        ndm_predictor pred = opt.id ? ndm_predictor_new(model, net) : (ndm_predictor){0};
        ndm_status st = pred.id ? NDM_OK : ndm_last_status();
        bool pending = ndm__inject_pending();
        ndm__inject_fail_after(0, 0);
        if (!pred.id && st != NDM_E_OOM)
            fail_msg("failure %" PRId64 " of the setup: %s, \"%s\"", n, ndm_status_name(st),
                     ndm_last_error());
        failed += !pred.id;
        assert_ok(ndm_manager_close(model));
        take(&after, &root, 1);
        same(&before, &after, &root, 1, "model setup", n);
        if (pred.id && pending)
            break;
        if (n == MAX_SWEEP)
            fail_msg("the setup still allocates after %d allocations", MAX_SWEEP);
    }
    assert_true(failed > 10);
    print_message("model setup: %" PRId64 " allocations failed in turn\n", failed);
}

/* This program again, as a child that runs both sweeps with NDM_LEAK_REPORT=1:
 * its exit report must say that nothing is alive. */
static void test_inject_sweeps_leave_nothing_at_exit(void **state)
{
    (void)state;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(len > 0);
    self[len] = '\0';
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "NDM_LEAK_REPORT=", 16) != 0)
            envp[k++] = environ[i];
    envp[k++] = "NDM_LEAK_REPORT=1";
    envp[k] = NULL;
    FILE *fe = tmpfile();
    assert_non_null(fe);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(fe), 2);
    char *argv[] = {self, "--sweep-child", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, self, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    if (rc != 0)
        fail_msg("cannot run %s: %s", self, strerror(rc));
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    fseek(fe, 0, SEEK_END);
    long size = ftell(fe);
    rewind(fe);
    char *err = calloc((size_t)size + 1, 1);
    assert_non_null(err);
    assert_int_equal(fread(err, 1, (size_t)size, fe), (size_t)size);
    fclose(fe);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fail_msg("the sweep child ended with status %d:\n%s", wst, err);
    if (!strstr(err, "ndm leak report: nothing alive\n"))
        fail_msg("the sweep child's exit report is not empty:\n%s", err);
    free(err);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--sweep-child")) {
        /* no test runner here: a failed assertion exits non-zero */
        ndm_manager root = ndm_manager_new(ndm_system(), "child");
        (void)sweep_train(root);
        (void)sweep_serve(root);
        return ndm_manager_close(root) == NDM_OK ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {
        TEST(test_inject_counts_only_armed_kinds),
        TEST(test_inject_train_step_every_allocation),
        TEST(test_inject_predict_every_allocation),
        TEST(test_inject_model_setup_every_allocation),
        TEST(test_inject_sweeps_leave_nothing_at_exit),
        TEST(test_asan_overrun_of_cached_array_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
