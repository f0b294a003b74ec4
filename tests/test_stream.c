/* Streams and events through the public API on the CPU, where they exist and
 * are always complete: ownership by managers, the per-thread current stream,
 * events, record_stream, and every bad handle. */
#include <pthread.h>

#include "helpers.h"

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
