/* Streams and events through the public API on the CPU, where they exist and
 * are always complete: ownership by managers, the per-thread current stream,
 * events, record_stream, and every bad handle. */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "manager/alloc/alloc.h"
#include "ops/dispatch.h"
#include "ops/stream_hook.h"

static void test_stream_default_is_complete_and_current(void **state)
{
    (void)state;
    ndm_stream d = ndm_stream_default(NDM_CPU);
    assert_true(d.id != 0);
    assert_int_equal(ndm_stream_current(NDM_CPU).id, d.id);
    assert_true(ndm_device_eq(ndm_stream_device(d), NDM_CPU));
    bool done = false;
    assert_ok(ndm_stream_query(d, &done));
    assert_true(done);
    assert_ok(ndm_stream_synchronize(d));
    assert_ok(ndm_stream_set_current(d));
    assert_int_equal(ndm_stream_current(NDM_CPU).id, d.id);
    /* never released */
    assert_int_equal(ndm_stream_release(d), NDM_E_INVALID);
    assert_error_has("default stream is never released");
    assert_int_equal(ndm_stream_current(NDM_CPU).id, d.id);
}

static void test_stream_new_belongs_to_its_manager(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "streams");
    ndm_stream s, t;
    assert_ok(ndm_stream_new(m, &s));
    assert_ok(ndm_stream_new(m, &t));
    assert_true(s.id != t.id && s.id != ndm_stream_default(NDM_CPU).id);
    assert_true(ndm_device_eq(ndm_stream_device(s), NDM_CPU));
    assert_ok(ndm_stream_set_current(s));
    assert_int_equal(ndm_stream_current(NDM_CPU).id, s.id);
    bool done = false;
    assert_ok(ndm_stream_query(s, &done));
    assert_true(done);
    /* released explicitly: stale, and no longer current */
    assert_ok(ndm_stream_release(t));
    assert_int_equal(ndm_stream_release(t), NDM_ALREADY);
    ndm_clear_error();
    assert_int_equal(ndm_stream_synchronize(t), NDM_E_CLOSED);
    assert_error_has("the stream was released");
    /* the manager's close releases the rest */
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    ndm_clear_error();
    assert_int_equal(ndm_stream_query(s, &done), NDM_E_CLOSED);
    assert_int_equal(ndm_stream_release(s), NDM_ALREADY);
    assert_int_equal(ndm_stream_current(NDM_CPU).id, ndm_stream_default(NDM_CPU).id);
}

static void test_stream_release_of_current_restores_default(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "streams");
    ndm_stream s;
    assert_ok(ndm_stream_new(m, &s));
    assert_ok(ndm_stream_set_current(s));
    assert_ok(ndm_stream_release(s));
    assert_int_equal(ndm_stream_current(NDM_CPU).id, ndm_stream_default(NDM_CPU).id);
    assert_ok(ndm_manager_close(m));
}

static void test_stream_events_record_wait_and_sync(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "events");
    ndm_stream s;
    ndm_event e;
    assert_ok(ndm_stream_new(m, &s));
    assert_ok(ndm_event_new(m, &e));
    bool done = false;
    /* never recorded: complete */
    assert_ok(ndm_event_query(e, &done));
    assert_true(done);
    assert_ok(ndm_event_record(e, s));
    done = false;
    assert_ok(ndm_event_query(e, &done));
    assert_true(done);
    assert_ok(ndm_event_synchronize(e));
    assert_ok(ndm_stream_wait_event(ndm_stream_default(NDM_CPU), e));
    assert_ok(ndm_event_record(e, ndm_stream_default(NDM_CPU)));
    assert_ok(ndm_event_release(e));
    assert_int_equal(ndm_event_release(e), NDM_ALREADY);
    ndm_clear_error();
    assert_int_equal(ndm_event_record(e, s), NDM_E_CLOSED);
    assert_int_equal(ndm_stream_wait_event(s, e), NDM_E_CLOSED);
    assert_ok(ndm_manager_close(m));
}

static void test_stream_bad_handles_and_managers(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "bad");
    ndm_stream s;
    ndm_event e;
    bool done;
    assert_ok(ndm_stream_new(m, &s));
    assert_ok(ndm_event_new(m, &e));
    /* null handles */
    ndm_clear_error();
    assert_int_equal(ndm_stream_synchronize((ndm_stream){0}), NDM_E_NULL);
    ndm_clear_error();
    assert_int_equal(ndm_event_query((ndm_event){0}, &done), NDM_E_NULL);
    ndm_clear_error();
    assert_int_equal(ndm_stream_release((ndm_stream){0}), NDM_E_NULL);
    /* forged, and of the other kind */
    ndm_clear_error();
    assert_int_equal(ndm_stream_synchronize((ndm_stream){0x7777000000001234ull}), NDM_E_INVALID);
    assert_error_has("is not a stream handle");
    assert_int_equal(ndm_stream_set_current((ndm_stream){e.id}), NDM_E_INVALID);
    assert_int_equal(ndm_event_synchronize((ndm_event){s.id}), NDM_E_INVALID);
    assert_int_equal(ndm_event_release((ndm_event){s.id}), NDM_E_INVALID);
    assert_int_equal(ndm_event_synchronize((ndm_event){ndm_stream_default(NDM_CPU).id}),
                     NDM_E_INVALID);
    /* NULL outputs */
    assert_int_equal(ndm_stream_new(m, NULL), NDM_E_INVALID);
    assert_int_equal(ndm_event_new(m, NULL), NDM_E_INVALID);
    assert_int_equal(ndm_stream_query(s, NULL), NDM_E_INVALID);
    assert_int_equal(ndm_event_query(e, NULL), NDM_E_INVALID);
    /* managers that cannot own them */
    ndm_stream x = {1};
    assert_int_equal(ndm_stream_new(ndm_system(), &x), NDM_E_ROOT);
    assert_int_equal(x.id, 0);
    ndm_manager dead = ndm_manager_new(ROOT(state), "dead");
    assert_ok(ndm_manager_close(dead));
    assert_int_equal(ndm_event_new(dead, &e), NDM_E_CLOSED);
    assert_int_equal(e.id, 0);
    /* devices this build or machine lacks */
    ndm_clear_error();
    assert_int_equal(ndm_stream_default(NDM_CUDA(15)).id, 0);
    assert_true(ndm_last_status() == NDM_E_DEVICE || ndm_last_status() == NDM_E_UNSUPPORTED);
    ndm_clear_error();
    assert_int_equal(ndm_stream_current((ndm_device){NDM_DEVICE_CPU, 3}).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_DEVICE);
    /* the manager is intact through all of it */
    assert_ok(ndm_stream_synchronize(s));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

static void test_stream_record_stream_of_arrays(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "arrays");
    ndm_stream s;
    assert_ok(ndm_stream_new(m, &s));
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(256, 256));
    assert_live(a);
    ndm_array v = ndm_slice(a, 0, 0, 128, 1);
    assert_live(v);
    /* the CPU waits for nothing: accepted, a no-op */
    assert_ok(ndm_array_record_stream(a, s));
    assert_ok(ndm_array_record_stream(v, ndm_stream_default(NDM_CPU)));
    /* wrapped memory is its owner's */
    float buf[4] = {0};
    ndm_array w = ndm_wrap_buffer(m, NDM_F32, buf, NULL, NULL, NDM_SHAPE(4));
    assert_live(w);
    assert_ok(ndm_array_record_stream(w, s));
    assert_ok(ndm_array_release(w));
    assert_ok(ndm_array_release(v));
    assert_ok(ndm_array_release(a));
    ndm_clear_error();
    assert_int_equal(ndm_array_record_stream(a, s), NDM_E_CLOSED);
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
    assert_ok(ndm_stream_release(s));
    ndm_clear_error();
    assert_int_equal(ndm_array_record_stream(b, s), NDM_E_CLOSED);
    assert_ok(ndm_array_release(b));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

static void *other_thread(void *arg)
{
    ndm_stream *s = arg;
    /* a fresh thread starts on the default stream */
    bool ok = ndm_stream_current(NDM_CPU).id == ndm_stream_default(NDM_CPU).id;
    if (ok && ndm_stream_set_current(*s) == NDM_OK)
        ok = ndm_stream_current(NDM_CPU).id == s->id;
    else
        ok = false;
    return ok ? arg : NULL;
}

static void test_stream_current_is_per_thread(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "threads");
    ndm_stream s, t;
    assert_ok(ndm_stream_new(m, &s));
    assert_ok(ndm_stream_new(m, &t));
    assert_ok(ndm_stream_set_current(t));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &s), 0);
    void *ret = NULL;
    pthread_join(th, &ret);
    assert_non_null(ret);
    assert_int_equal(ndm_stream_current(NDM_CPU).id, t.id);
    assert_ok(ndm_manager_close(m));
    assert_int_equal(ndm_stream_current(NDM_CPU).id, ndm_stream_default(NDM_CPU).id);
}

/* Many streams made and released under one long-lived manager, across
 * several managers: slots are reused and every manager's close finds its
 * own. */
static void test_stream_churn_reuses_slots(void **state)
{
    ndm_manager keep = ndm_manager_new(ROOT(state), "keep");
    ndm_stream kept;
    assert_ok(ndm_stream_new(keep, &kept));
    for (int round = 0; round < 20; round++) {
        ndm_manager m = ndm_manager_new(ROOT(state), "churn");
        ndm_stream s[50];
        ndm_event e[50];
        for (int i = 0; i < 50; i++) {
            assert_ok(ndm_stream_new(i % 2 ? m : keep, &s[i]));
            assert_ok(ndm_event_new(m, &e[i]));
            assert_ok(ndm_event_record(e[i], s[i]));
        }
        for (int i = 0; i < 50; i += 2)
            assert_ok(ndm_stream_release(s[i]));
        assert_ok(ndm_manager_close(m));
        bool done;
        for (int i = 0; i < 50; i++) {
            ndm_clear_error();
            assert_int_equal(ndm_event_query(e[i], &done), NDM_E_CLOSED);
            assert_int_equal(ndm_stream_release(s[i]), NDM_ALREADY);
        }
    }
    assert_ok(ndm_stream_synchronize(kept));
    assert_ok(ndm_manager_close(keep));
    assert_int_equal(ndm_stream_release(kept), NDM_ALREADY);
}

/* Threads that make streams and events (growing the table, which moves it)
 * while others look up streams made before: every lookup answers, every
 * handle made stays its own, and each manager's close releases its own. */
enum { MAKERS = 3, READERS = 3, MADE = 120, ROUNDS = 4, KEPT = 8 };

typedef struct table_race {
    ndm_manager root;
    ndm_stream kept[KEPT];
    atomic_int makers_left;
    atomic_int failures;
} table_race;

static void *stream_maker(void *arg)
{
    table_race *t = arg;
    for (int round = 0; round < ROUNDS; round++) {
        ndm_manager m = ndm_manager_new(t->root, "request");
        ndm_stream s[MADE];
        ndm_event e[MADE];
        for (int i = 0; i < MADE; i++)
            if (ndm_stream_new(m, &s[i]) != NDM_OK || ndm_event_new(m, &e[i]) != NDM_OK)
                atomic_fetch_add(&t->failures, 1);
        bool done;
        for (int i = 0; i < MADE; i++)
            if (ndm_event_record(e[i], s[i]) != NDM_OK || ndm_event_query(e[i], &done) != NDM_OK ||
                !ndm_device_eq(ndm_stream_device(s[i]), NDM_CPU))
                atomic_fetch_add(&t->failures, 1);
        for (int i = 0; i < MADE; i += 3)
            if (ndm_stream_release(s[i]) != NDM_OK)
                atomic_fetch_add(&t->failures, 1);
        if (ndm_manager_close(m) != NDM_OK)
            atomic_fetch_add(&t->failures, 1);
        for (int i = 0; i < MADE; i++) {
            ndm_clear_error();
            if (ndm_stream_synchronize(s[i]) != NDM_E_CLOSED ||
                ndm_event_release(e[i]) != NDM_ALREADY)
                atomic_fetch_add(&t->failures, 1);
        }
    }
    atomic_fetch_sub(&t->makers_left, 1);
    return NULL;
}

static void *stream_reader(void *arg)
{
    table_race *t = arg;
    bool done;
    /* at least one pass after the makers are done, however they were scheduled */
    for (bool last = false; !last;) {
        last = atomic_load(&t->makers_left) == 0;
        for (int i = 0; i < KEPT; i++)
            if (ndm_stream_query(t->kept[i], &done) != NDM_OK || !done ||
                ndm_stream_synchronize(t->kept[i]) != NDM_OK)
                atomic_fetch_add(&t->failures, 1);
    }
    return NULL;
}

static void test_stream_table_grows_while_others_look_up(void **state)
{
    table_race t = {.root = ndm_manager_new(ROOT(state), "race")};
    ndm_manager keep = ndm_manager_new(t.root, "keep");
    for (int i = 0; i < KEPT; i++)
        assert_ok(ndm_stream_new(keep, &t.kept[i]));
    atomic_init(&t.makers_left, MAKERS);
    atomic_init(&t.failures, 0);
    pthread_t th[MAKERS + READERS];
    for (int i = 0; i < MAKERS + READERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, i < MAKERS ? stream_maker : stream_reader,
                                        &t), 0);
    for (int i = 0; i < MAKERS + READERS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&t.failures), 0);
    assert_ok(ndm_manager_close(keep));
    for (int i = 0; i < KEPT; i++)
        assert_int_equal(ndm_stream_release(t.kept[i]), NDM_ALREADY);
    assert_manager_empty(t.root);
    assert_ok(ndm_manager_close(t.root));
}

/* A stream made while another thread closes its manager: made and then
 * released by the close, or refused; never left behind by a close whose
 * hook it missed (the hook record leaked, and the stream lived on). */
enum { RACED = 2000 };

typedef struct close_race {
    ndm_manager root;
    _Atomic uint64_t published;
    atomic_int done;
    ndm_stream made[RACED];
} close_race;

static void *close_racer(void *arg)
{
    close_race *t = arg;
    while (!atomic_load(&t->done)) {
        uint64_t id = atomic_exchange(&t->published, 0);
        if (id)
            (void)ndm_manager_close((ndm_manager){id});
    }
    return NULL;
}

static void test_stream_made_while_its_manager_closes(void **state)
{
    close_race *t = calloc(1, sizeof *t);
    t->root = ndm_manager_new(ROOT(state), "race");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, close_racer, t), 0);
    int refused = 0;
    for (int i = 0; i < RACED; i++) {
        ndm_manager m = ndm_manager_new(t->root, "request");
        atomic_store(&t->published, m.id);
        ndm_status st = ndm_stream_new(m, &t->made[i]);
        if (st != NDM_OK) {
            assert_int_equal(st, NDM_E_CLOSED);
            assert_int_equal(t->made[i].id, 0);
            refused++;
        }
        ndm_status cs = ndm_manager_close(m);
        assert_true(cs == NDM_OK || cs == NDM_ALREADY);
    }
    atomic_store(&t->done, 1);
    pthread_join(th, NULL);
    /* every manager is closed: every stream made went with it */
    bool done;
    for (int i = 0; i < RACED; i++) {
        if (!t->made[i].id)
            continue;
        ndm_clear_error();
        assert_int_equal(ndm_stream_query(t->made[i], &done), NDM_E_CLOSED);
    }
    print_message("%d of %d makes refused by the close\n", refused, RACED);
    assert_manager_empty(t->root);
    assert_ok(ndm_manager_close(t->root));
    free(t);
}

/* ---- on CUDA: a device whose streams a test can hold (the host stand-in) ---------- */

#define NEED_HELD_STREAMS()                                                     \
    do {                                                                        \
        if (ndm_cuda_device_count() == 0) {                                     \
            print_message("no CUDA device: skipped\n");                        \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* Where an array's elements are on its device (ndm_array_data is for the CPU). */
static void *device_ptr(ndm_array a)
{
    ndm__array *r = ndm__array_peek(a);
    assert_non_null(r);
    return ndm__array_ptr(r);
}

static int64_t stat_of(ndm_device d, const char *key)
{
    int64_t v = -1;
    assert_ok(ndm_memory_stat_get(d, key, &v));
    return v;
}

/* PyTorch's record_stream test: a block used on a second stream is not
 * handed out again while that stream's work is pending, and is after. */
static void test_stream_cuda_record_stream_holds_memory(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    assert_live(m);
    assert_ok(ndm_memory_empty_cache(dev));
    ndm_stream side;
    ndm_event e;
    assert_ok(ndm_stream_new(m, &side));
    assert_ok(ndm_event_new(m, &e));
    if (ndm__stream_hold(side, true) == NDM_E_UNSUPPORTED) {
        assert_ok(ndm_manager_close(m));
        print_message("the device cannot hold a stream (a real GPU): skipped\n");
        skip();
    }
    /* 12 MiB: a segment of its own, so addresses tell blocks apart */
    ndm_array a = ndm_zeros(m, NDM_U8, NDM_SHAPE(12 << 20));
    assert_live(a);
    void *at = device_ptr(a);
    assert_ok(ndm_array_record_stream(a, side));
    assert_ok(ndm_event_record(e, side));
    bool done = true;
    assert_ok(ndm_event_query(e, &done));
    assert_false(done);
    assert_ok(ndm_stream_query(side, &done));
    assert_false(done);
    int64_t active = stat_of(dev, "active_bytes.all.current");
    assert_ok(ndm_array_release(a));
    /* freed, but the side stream may still read it */
    assert_int_equal(stat_of(dev, "active_bytes.all.current"), active);
    assert_int_equal(stat_of(dev, "allocated_bytes.all.current"), active - (12 << 20));
    ndm_array b = ndm_zeros(m, NDM_U8, NDM_SHAPE(12 << 20));
    assert_live(b);
    assert_ptr_not_equal(device_ptr(b), at);
    assert_ok(ndm_array_release(b));
    /* the side stream's work runs: the memory comes back */
    assert_ok(ndm__stream_hold(side, false));
    assert_ok(ndm_event_synchronize(e));
    assert_ok(ndm_event_query(e, &done));
    assert_true(done);
    ndm_array c = ndm_zeros(m, NDM_U8, NDM_SHAPE(12 << 20));
    ndm_array d = ndm_zeros(m, NDM_U8, NDM_SHAPE(12 << 20));
    assert_live(c);
    assert_live(d);
    assert_true(device_ptr(c) == at || device_ptr(d) == at);
    assert_int_equal(stat_of(dev, "active_bytes.all.current"),
                     stat_of(dev, "allocated_bytes.all.current"));
    assert_ok(ndm_array_release(c));
    assert_ok(ndm_array_release(d));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    assert_ok(ndm_memory_empty_cache(dev));
    assert_int_equal(stat_of(dev, "active_bytes.all.current"), 0);
}

/* ndm_why_alive names the streams an array was recorded on: its memory
 * waits for their work when it dies. */
static void test_stream_cuda_why_alive_names_stream_uses(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    assert_live(m);
    ndm_stream s1, s2;
    assert_ok(ndm_stream_new(m, &s1));
    assert_ok(ndm_stream_new(m, &s2));
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(256));
    assert_live(a);
    for (int json = 0; json <= 1; json++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_ok(json ? ndm_why_alive_json(a, f) : ndm_why_alive(a, f));
        fclose(f);
        assert_non_null(strstr(buf, json ? "\"stream_uses\":0" : "no other view"));
        assert_null(strstr(buf, "pending stream uses"));
        free(buf);
    }
    assert_ok(ndm_array_record_stream(a, s1));
    assert_ok(ndm_array_record_stream(a, s2));
    assert_ok(ndm_array_record_stream(a, s1)); /* (once is enough) */
    for (int json = 0; json <= 1; json++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_ok(json ? ndm_why_alive_json(a, f) : ndm_why_alive(a, f));
        fclose(f);
        if (!strstr(buf, json ? "\"stream_uses\":2"
                              : "pending stream uses: recorded on 2 other streams"))
            fail_msg("why alive lacks the stream uses:\n%s", buf);
        free(buf);
    }
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_stream_synchronize(s1));
    assert_ok(ndm_stream_synchronize(s2));
    assert_ok(ndm_manager_close(m));
}

/* Work of the thread's current stream: arrays allocated while a side stream
 * is current belong to it, and its memory is not given to the default
 * stream's work. An event lets the default stream wait for it. */
static void test_stream_cuda_current_stream_owns_its_allocations(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    ndm_stream side;
    ndm_event e;
    assert_ok(ndm_stream_new(m, &side));
    assert_ok(ndm_event_new(m, &e));
    assert_ok(ndm_stream_set_current(side));
    assert_int_equal(ndm_stream_current(dev).id, side.id);
    ndm_array a = ndm_full(m, NDM_F32, 7.0, NDM_SHAPE(1 << 20));
    assert_live(a);
    void *at = device_ptr(a);
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_event_record(e, side));
    assert_ok(ndm_stream_set_current(ndm_stream_default(dev)));
    assert_ok(ndm_stream_wait_event(ndm_stream_default(dev), e));
    /* the default stream does not take the side stream's free block */
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(1 << 20));
    assert_live(b);
    assert_ptr_not_equal(device_ptr(b), at);
    /* back on the side stream, the block is its own again */
    assert_ok(ndm_stream_set_current(side));
    ndm_array c = ndm_zeros(m, NDM_F32, NDM_SHAPE(1 << 20));
    assert_ptr_equal(device_ptr(c), at);
    assert_ok(ndm_stream_synchronize(side));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_array_release(c));
    /* a stream of another device: refused */
    if (ndm_cuda_device_count() > 1) {
        ndm_manager m1 = ndm_manager_new_on(ROOT(state), "gpu1", NDM_CUDA(1));
        ndm_stream s1;
        assert_ok(ndm_stream_new(m1, &s1));
        ndm_clear_error();
        assert_int_equal(ndm_event_record(e, s1), NDM_E_DEVICE);
        assert_error_has("the event is on cuda:0, the stream on cuda:1");
        assert_int_equal(ndm_stream_wait_event(s1, e), NDM_E_DEVICE);
        ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(4));
        assert_int_equal(ndm_array_record_stream(x, s1), NDM_E_DEVICE);
        assert_ok(ndm_array_release(x));
        assert_ok(ndm_manager_close(m1));
    }
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    /* the manager took its stream along: the thread is on the default again */
    assert_int_equal(ndm_stream_current(dev).id, ndm_stream_default(dev).id);
}

/* Expandable segments on the device: the driver's virtual memory, committed
 * in place; the data survives a growth and the free end is decommitted. */
static void test_stream_cuda_expandable_segments_grow_in_place(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    assert_ok(ndm_memory_empty_cache(dev));
    assert_ok(ndm_alloc_configure(dev, "expandable_segments:True"));
    ndm_array a = ndm_full(m, NDM_U8, 7, NDM_SHAPE(3 << 20));
    ndm_array b = ndm_full(m, NDM_U8, 9, NDM_SHAPE(5 << 20));
    assert_live(a);
    assert_live(b);
    if (stat_of(dev, "segment.large_pool.current") != 1) {
        /* a device without virtual memory management maps as usual */
        print_message("no expandable segments on this device\n");
    } else {
        assert_ptr_equal(device_ptr(b), (char *)device_ptr(a) + (3 << 20));
        assert_int_equal(stat_of(dev, "reserved_bytes.large_pool.current"), 8 << 20);
    }
    ndm_array ha = ndm_to(a, NDM_CPU), hb = ndm_to(b, NDM_CPU);
    const uint8_t *pa = ndm_array_data(ha), *pb = ndm_array_data(hb);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_int_equal(pa[0], 7);
    assert_int_equal(pa[(3 << 20) - 1], 7);
    assert_int_equal(pb[0], 9);
    assert_int_equal(pb[(5 << 20) - 1], 9);
    assert_ok(ndm_array_release(ha));
    assert_ok(ndm_array_release(hb));
    assert_ok(ndm_array_release(b));
    assert_ok(ndm_memory_empty_cache(dev));
    assert_int_equal(stat_of(dev, "reserved_bytes.large_pool.current"), 4 << 20);
    assert_ok(ndm_array_release(a));
    assert_ok(ndm_memory_empty_cache(dev));
    assert_int_equal(stat_of(dev, "reserved_bytes.all.current"), 0);
    assert_ok(ndm_alloc_configure(dev, NULL));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

/* A pinned transfer buffer handed to a copy on a held stream is not given
 * out again until that copy has passed. */
static void test_stream_cuda_pinned_buffer_waits_for_its_copy(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    ndm_stream copy;
    assert_ok(ndm_stream_new(m, &copy));
    ndm_device sd;
    uintptr_t sv = 0;
    assert_ok(ndm__stream_value(copy, &sd, &sv));
    assert_true(ndm_device_eq(sd, dev));
    if (ndm__stream_hold(copy, true) == NDM_E_UNSUPPORTED) {
        assert_ok(ndm_manager_close(m));
        skip();
    }
    ndm__block a, b, c;
    assert_ok(ndm__alloc_pinned(dev, 12 << 20, NULL, &a));
    void *at = a.ptr;
    memset(a.ptr, 1, 12 << 20); /* host memory: the host writes it */
    assert_ok(ndm__pinned_record_stream(dev, a.cookie, sv));
    ndm__free_pinned(dev, &a);
    assert_ok(ndm__alloc_pinned(dev, 12 << 20, NULL, &b));
    assert_ptr_not_equal(b.ptr, at);
    ndm__free_pinned(dev, &b);
    assert_ok(ndm__stream_hold(copy, false));
    assert_ok(ndm__alloc_pinned(dev, 12 << 20, NULL, &b));
    assert_ok(ndm__alloc_pinned(dev, 12 << 20, NULL, &c));
    assert_true(b.ptr == at || c.ptr == at);
    ndm_memory_stats st;
    assert_ok(ndm__pinned_stats(dev, &st));
    assert_int_equal(st.allocated_bytes[NDM_POOL_ALL].current, 2 * (12 << 20));
    ndm__free_pinned(dev, &b);
    ndm__free_pinned(dev, &c);
    assert_ok(ndm__pinned_stats(dev, &st));
    assert_int_equal(st.active_bytes[NDM_POOL_ALL].current, 0);
    /* the CPU has no pinned pool */
    assert_int_equal(ndm__alloc_pinned(NDM_CPU, 16, NULL, &a), NDM_E_DEVICE);
    assert_null(a.cookie);
    assert_ok(ndm_manager_close(m));
}

/* Host<->device copies take one path, staged through the device's pinned
 * pool: copy_in, copy_out (contiguous and strided) and ndm_to each take a
 * pinned buffer and give it back, and the values arrive. */
static void test_stream_cuda_transfers_stage_through_the_pinned_pool(void **state)
{
    NEED_HELD_STREAMS();
    ndm_device dev = NDM_CUDA(0);
    ndm_manager m = ndm_manager_new_on(ROOT(state), "gpu", dev);
    assert_live(m);
    ndm_memory_stats st;
    assert_ok(ndm__pinned_stats(dev, &st));
    int64_t before = st.allocation[NDM_POOL_ALL].allocated;
    float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
    ndm_array a = ndm_empty(m, NDM_F32, NDM_SHAPE(2, 3));
    assert_live(a);
    assert_ok(ndm_array_copy_in(a, in, sizeof in));
    assert_ok(ndm__pinned_stats(dev, &st));
    int64_t after_in = st.allocation[NDM_POOL_ALL].allocated;
    assert_true(after_in > before);
    assert_ok(ndm_array_copy_out(a, out, sizeof out));
    assert_memory_equal(in, out, sizeof in);
    ndm_array t = ndm_transpose(a);
    assert_live(t);
    float tout[6] = {0}, want[6] = {1, 4, 2, 5, 3, 6};
    assert_ok(ndm_array_copy_out(t, tout, sizeof tout));
    assert_memory_equal(want, tout, sizeof want);
    ndm_array h = ndm_to(a, NDM_CPU);
    assert_live(h);
    assert_memory_equal(in, ndm_array_data(h), sizeof in);
    assert_ok(ndm__pinned_stats(dev, &st));
    assert_true(st.allocation[NDM_POOL_ALL].allocated >= after_in + 3);
    assert_int_equal(st.active_bytes[NDM_POOL_ALL].current, 0);
    assert_ok(ndm_array_release(h));
    assert_ok(ndm_array_release(t));
    assert_ok(ndm_array_release(a));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_stream_default_is_complete_and_current),
        TEST(test_stream_new_belongs_to_its_manager),
        TEST(test_stream_release_of_current_restores_default),
        TEST(test_stream_events_record_wait_and_sync),
        TEST(test_stream_bad_handles_and_managers),
        TEST(test_stream_record_stream_of_arrays),
        TEST(test_stream_current_is_per_thread),
        TEST(test_stream_churn_reuses_slots),
        TEST(test_stream_table_grows_while_others_look_up),
        TEST(test_stream_made_while_its_manager_closes),
        TEST(test_stream_cuda_record_stream_holds_memory),
        TEST(test_stream_cuda_why_alive_names_stream_uses),
        TEST(test_stream_cuda_current_stream_owns_its_allocations),
        TEST(test_stream_cuda_pinned_buffer_waits_for_its_copy),
        TEST(test_stream_cuda_transfers_stage_through_the_pinned_pool),
        TEST(test_stream_cuda_expandable_segments_grow_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
