/* The handle sweep: every public function that takes a handle, called with
 * the null handle, a stale one (issued, since released), a forged one (a
 * generation never issued) and one of another kind. null is NDM_E_NULL,
 * stale NDM_E_CLOSED (NDM_ALREADY for a release or close), forged and
 * wrong-kind NDM_E_INVALID, each with a message; a function that returns a
 * handle and returns the null handle has a negative status and a message.
 * A new function is one line of its kind's table. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h"

typedef enum { H_ARRAY, H_MANAGER, H_MODULE, H_OPTIMIZER, H_PREDICTOR, H_LOADER, H_STREAM,
               H_EVENT, H_DDP, H_KINDS } hkind;

static const char *const kind_names[H_KINDS] = {"array",  "manager", "module", "optimizer",
                                               "predictor", "loader", "stream", "event",
                                               "ddp"};

/* Live objects the calls need beside the handle under test. */
typedef struct fixture {
    ndm_manager m;
    ndm_array x;
    ndm_module net;
    ndm_optimizer opt;
    ndm_predictor pred;
    ndm_loader ld;
    ndm_stream s;
    ndm_event e;
    char path[64];
} fixture;

static fixture fx;

/* What a call returned: a status (the return value, or, for a function
 * that returns something else, its failure as ndm_last_status()) and
 * whether it returned a null handle. */
typedef struct result {
    ndm_status st;
    bool null_handle;
} result;

static result by_status(ndm_status st) { return (result){st, false}; }
static result by_flag(bool failed) { return (result){failed ? ndm_last_status() : NDM_OK, false}; }
static result by_handle(uint64_t id)
{
    return (result){id ? NDM_OK : ndm_last_status(), id == 0};
}

typedef struct call {
    const char *name;
    hkind kind;
    bool releases; /* a release or close: a stale handle is NDM_ALREADY */
    result (*fn)(uint64_t h);
} call;

#define A ((ndm_array){h})
#define M ((ndm_manager){h})
#define MOD ((ndm_module){h})
#define OPT ((ndm_optimizer){h})
#define PRED ((ndm_predictor){h})
#define LD ((ndm_loader){h})
#define S ((ndm_stream){h})
#define E ((ndm_event){h})
#define D ((ndm_ddp){h})

static int sweep_hook(void *ud)
{
    (void)ud;
    return 0;
}

/* Where the printing calls write (nothing, for a refused handle). */
static FILE *sweep_sink(void)
{
    static FILE *f;
    if (!f)
        f = fopen("/dev/null", "w");
    return f;
}

#define ROW(kind, rel, fname, expr)                                                        \
    static result call_##fname(uint64_t h) { return expr; }
#include "test_handles_calls.h"
#undef ROW

static const call calls[] = {
#define ROW(kind, rel, fname, expr) {#fname, kind, rel, call_##fname},
#include "test_handles_calls.h"
#undef ROW
};

/* ---- handles of every kind, in every state ------------------------------------------ */

static uint64_t live_of(hkind k)
{
    switch (k) {
    case H_ARRAY: return fx.x.id;
    case H_MANAGER: return fx.m.id;
    case H_MODULE: return fx.net.id;
    case H_OPTIMIZER: return fx.opt.id;
    case H_PREDICTOR: return fx.pred.id;
    case H_LOADER: return fx.ld.id;
    case H_STREAM: return fx.s.id;
    case H_EVENT: return fx.e.id;
    default: return 0;
    }
}

/* A handle of kind k whose object was released (its manager closed). */
static uint64_t stale_of(hkind k, ndm_manager parent)
{
    ndm_manager g = ndm_manager_new(parent, "gone");
    ndm_rng rng = ndm_rng_new(1);
    uint64_t id = 0;
    ndm_module net = ndm_linear(g, 2, 2, true, &rng);
    switch (k) {
    case H_ARRAY: id = ndm_zeros(g, NDM_F32, NDM_SHAPE(2)).id; break;
    case H_MANAGER: id = ndm_manager_new(g, "child").id; break;
    case H_MODULE: id = net.id; break;
    case H_OPTIMIZER: id = ndm_sgd(g, net, 0.1, 0, 0).id; break;
    case H_PREDICTOR: id = ndm_predictor_new(g, net).id; break;
    case H_LOADER: {
        ndm_dataset d = {ndm_zeros(g, NDM_F32, NDM_SHAPE(4, 2)), NDM_NULL_ARRAY};
        id = ndm_loader_new(g, d, &(ndm_loader_options){.batch_size = 2}).id;
        break;
    }
    case H_STREAM: {
        ndm_stream s;
        id = ndm_stream_new(g, &s) == NDM_OK ? s.id : 0;
        break;
    }
    case H_EVENT: {
        ndm_event e;
        id = ndm_event_new(g, &e) == NDM_OK ? e.id : 0;
        break;
    }
    default: break;
    }
    assert_ok(ndm_manager_close(g));
    return id;
}

/* A handle of kind k with a generation its slot never reached. */
static uint64_t forged_of(hkind k)
{
    uint64_t live = k == H_DDP ? fx.net.id : live_of(k);
    uint64_t gen = (live >> 32 & 0x7fffffffu) + 1000;
    return (live & (UINT64_C(1) << 63 | 0xffffffffu)) | gen << 32;
}

/* A live handle of another kind. */
static uint64_t wrong_kind_of(hkind k)
{
    switch (k) {
    case H_ARRAY: return fx.net.id;
    case H_MANAGER: return fx.x.id;
    case H_MODULE: return fx.x.id;
    case H_OPTIMIZER: return fx.net.id;
    case H_PREDICTOR: return fx.opt.id;
    case H_LOADER: return fx.pred.id;
    case H_STREAM: return fx.x.id;
    case H_EVENT: return fx.s.id;
    case H_DDP: return fx.net.id;
    default: return 0;
    }
}

static void expect(const call *c, const char *what, uint64_t h, ndm_status want)
{
    ndm_clear_error();
    result r = c->fn(h);
    bool ok = r.st == want;
    if (want < 0)
        ok = ok && ndm_last_status() == want && ndm_last_error()[0];
    if (r.null_handle && (ndm_last_status() >= 0 || !ndm_last_error()[0]))
        ok = false; /* a null result without its why */
    if (!ok)
        fail_msg("%s(%s %s handle 0x%016llx): got %s (last %s: \"%s\"), want %s", c->name, what,
                 kind_names[c->kind], (unsigned long long)h, ndm_status_name(r.st),
                 ndm_status_name(ndm_last_status()), ndm_last_error(), ndm_status_name(want));
}

static void make_fixture(ndm_manager root)
{
    memset(&fx, 0, sizeof fx);
    fx.m = ndm_manager_new(root, "sweep");
    ndm_rng rng = ndm_rng_new(7);
    fx.x = ndm_ones(fx.m, NDM_F32, NDM_SHAPE(1, 2));
    fx.net = ndm_linear(fx.m, 2, 2, true, &rng);
    fx.opt = ndm_sgd(fx.m, fx.net, 0.1, 0, 0);
    ndm_dataset d = {ndm_zeros(fx.m, NDM_F32, NDM_SHAPE(4, 2)), NDM_NULL_ARRAY};
    fx.ld = ndm_loader_new(fx.m, d, &(ndm_loader_options){.batch_size = 2});
    assert_ok(ndm_stream_new(fx.m, &fx.s));
    assert_ok(ndm_event_new(fx.m, &fx.e));
    /* a predictor caps its model: its own, so that fx.m takes outputs */
    ndm_manager served = ndm_manager_new(fx.m, "served");
    fx.pred = ndm_predictor_new(served, ndm_linear(served, 2, 2, true, &rng));
    assert_live(fx.x);
    assert_true(fx.net.id && fx.opt.id && fx.pred.id && fx.ld.id);
    const char *tmp = getenv("TMPDIR");
    snprintf(fx.path, sizeof fx.path, "%s/ndm_handles_%d.safetensors", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
}

static void test_handles_sweep_every_kind(void **state)
{
    ndm_manager root = ROOT(state);
    make_fixture(root);
    uint64_t stale[H_KINDS];
    for (int k = 0; k < H_KINDS; k++)
        stale[k] = k == H_DDP ? 0 : stale_of((hkind)k, root);
    int covered[H_KINDS] = {0};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        const call *c = &calls[i];
        covered[c->kind]++;
        expect(c, "null", 0, NDM_E_NULL);
        if (stale[c->kind])
            expect(c, "stale", stale[c->kind], c->releases ? NDM_ALREADY : NDM_E_CLOSED);
        expect(c, "forged", forged_of(c->kind), NDM_E_INVALID);
        expect(c, "wrong-kind", wrong_kind_of(c->kind), NDM_E_INVALID);
    }
    for (int k = 0; k < H_KINDS; k++)
        if (!covered[k])
            fail_msg("no call takes a %s handle", kind_names[k]);
    /* every live handle survived the sweep */
    assert_true(ndm_array_valid(fx.x) && ndm_manager_valid(fx.m) && ndm_loader_valid(fx.ld));
    assert_true(ndm_module_describe(fx.net, NULL, 0) > 0);
    assert_true(ndm_optimizer_lr(fx.opt) == 0.1);
    bool done = false;
    assert_ok(ndm_stream_query(fx.s, &done));
    assert_ok(ndm_event_query(fx.e, &done));
    unlink(fx.path);
    assert_ok(ndm_manager_close(fx.m));
    assert_manager_empty(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_handles_sweep_every_kind),
    };
    return cmocka_run_group_tests_name("handles", tests, NULL, NULL);
}
