/* Moves of composites: a list of arrays attached all or none, and (below)
 * a child manager re-parented with its subtree; races with closes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "helpers.h"

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, 0, &st) != NDM_OK)
        fail_msg("stats: %s", ndm_last_error());
    return st;
}

/* Every manager of a test, before and after a refused call. */
#define NSNAP 6
typedef struct snap {
    ndm_stats st[NSNAP];
} snap;
static snap snap_of(const ndm_manager *ms, int n)
{
    snap s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < n; i++)
        s.st[i] = stats_of(ms[i]);
    return s;
}
static void owners_are(const ndm_array *as, const ndm_manager *owners, int n)
{
    for (int i = 0; i < n; i++)
        if (ndm_array_manager(as[i]).id != owners[i].id)
            fail_msg("arrays[%d] changed owners", i);
}

static void test_attach_all_moves_every_array(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_manager t = ndm_manager_new(ROOT(state), "t");
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(10));
    ndm_array y = ndm_zeros(b, NDM_F32, NDM_SHAPE(4));
    ndm_array z = ndm_zeros(t, NDM_F32, NDM_SHAPE(2)); /* already there */
    ndm_array list[] = {x, y, x, z};                   /* a duplicate */
    assert_ok(ndm_attach_all(t, 4, list));
    for (int i = 0; i < 4; i++)
        assert_true(ndm_array_manager(list[i]).id == t.id);
    ndm_stats sa = stats_of(a), sb = stats_of(b), st = stats_of(t);
    assert_int_equal(sa.live_arrays, 0);
    assert_int_equal(sa.moved_out, 1);
    assert_int_equal(sa.live_bytes, 0);
    assert_int_equal(sa.peak_bytes, 40);
    assert_int_equal(sb.moved_out, 1);
    assert_int_equal(sb.live_bytes, 0);
    assert_int_equal(st.live_arrays, 3);
    assert_int_equal(st.moved_in, 2);
    assert_int_equal(st.created, 1);
    assert_int_equal(st.live_bytes, 40 + 16 + 8);
    assert_int_equal(st.peak_bytes, 64);
    /* the dump shows the moves */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(ndm_debug_dump_json(t, f));
    fclose(f);
    assert_non_null(strstr(buf, "\"moved_in\":2"));
    free(buf);
    /* a literal list, as the list macros make it */
    ndm_manager u = ndm_manager_new(ROOT(state), "u");
    assert_ok(ndm_attach_all(u, NDM_ARRAYS(x, y)));
    assert_int_equal(stats_of(u).live_arrays, 2);
    assert_ok(ndm_attach_all(t, NDM_ARRAYS(y, x)));
    assert_ok(ndm_manager_close(u));
    /* an empty list moves nothing */
    assert_ok(ndm_attach_all(a, 0, NULL));
    /* the arrays die with their new manager, in the list's order reversed */
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
    assert_true(ndm_array_valid(x) && ndm_array_valid(y));
    assert_ok(ndm_manager_close(t));
    assert_false(ndm_array_valid(x) || ndm_array_valid(y) || ndm_array_valid(z));
    assert_manager_empty(ROOT(state));
}

static void test_attach_all_bad_entry_moves_nothing(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_manager t = ndm_manager_new(ROOT(state), "t");
    ndm_manager ms[] = {a, b, t};
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(10));
    ndm_array y = ndm_zeros(b, NDM_F32, NDM_SHAPE(4));
    ndm_array dead = ndm_zeros(a, NDM_F32, NDM_SHAPE(1));
    int dead_line = __LINE__ - 1;
    assert_ok(ndm_array_release(dead));
    ndm_array owners_l[] = {x, y};
    ndm_manager owners[] = {a, b};
    snap before = snap_of(ms, 3);

    ndm_array stale[] = {x, y, dead};
    assert_status(ndm_attach_all(t, 3, stale), NDM_E_CLOSED);
    assert_error_has("arrays[2]");
    char want[64];
    snprintf(want, sizeof want, "test_composite.c:%d", dead_line);
    assert_error_has(want); /* the stale array's creation */
    assert_error_has("nothing moved");

    ndm_array forged[] = {x, {0x000000070fffffffull}, y};
    assert_status(ndm_attach_all(t, 3, forged), NDM_E_INVALID);
    assert_error_has("arrays[1]");

    ndm_array nul[] = {x, y, NDM_NULL_ARRAY};
    assert_status(ndm_attach_all(t, 3, nul), NDM_E_NULL);
    assert_error_has("arrays[2]");
    assert_status(ndm_attach_all(t, 2, NULL), NDM_E_INVALID);

    snap after = snap_of(ms, 3);
    assert_memory_equal(&before, &after, sizeof before);
    owners_are(owners_l, owners, 2);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
    assert_ok(ndm_manager_close(t));
    assert_manager_empty(ROOT(state));
}

static void test_attach_all_refusing_target_moves_nothing(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_manager capped = ndm_manager_new(ROOT(state), "capped");
    ndm_manager closed = ndm_manager_new(ROOT(state), "closed");
    ndm_manager lim = ndm_manager_new(ROOT(state), "lim");
    ndm_manager inner = ndm_manager_new(lim, "inner");
    assert_ok(ndm_manager_close(closed));
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    /* each array fits the limit alone, the two do not */
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 48));
    ndm_array x = ndm_zeros(a, NDM_F32, NDM_SHAPE(8)); /* 32 bytes */
    int x_line = __LINE__ - 1;
    ndm_array y = ndm_zeros(b, NDM_F32, NDM_SHAPE(8));
    ndm_array list[] = {x, y};
    ndm_manager owners[] = {a, b};
    ndm_manager ms[] = {a, b, capped, lim, inner};
    snap before = snap_of(ms, 5);

    assert_status(ndm_attach_all(capped, 2, list), NDM_E_CAPPED);
    char want[64];
    snprintf(want, sizeof want, "test_composite.c:%d", x_line);
    assert_error_has(want);
    assert_error_has("arrays[0]");
    assert_status(ndm_attach_all(closed, 2, list), NDM_E_CLOSED);
    assert_status(ndm_attach_all(inner, 2, list), NDM_E_QUOTA);
    assert_error_has("64 bytes");
    assert_error_has("'system/test/lim'");
    assert_int_equal(ndm_manager_limit(lim, NDM_CPU), 48);

    snap after = snap_of(ms, 5);
    assert_memory_equal(&before, &after, sizeof before);
    owners_are(list, owners, 2);
    /* the limit's count is as before: one of them still fits */
    assert_ok(ndm_attach(x, inner));
    assert_int_equal(stats_of(inner).live_bytes, 32);
    assert_status(ndm_attach(y, inner), NDM_E_QUOTA);
    /* a list leaving the limit gives its bytes back to it */
    assert_ok(ndm_attach_all(a, NDM_ARRAYS(x)));
    assert_int_equal(stats_of(inner).live_bytes, 0);
    assert_ok(ndm_attach(y, inner));
    /* the innermost scope as the target */
    ndm_manager sc = ndm_scope_begin(a, "sc");
    assert_ok(ndm_attach_all(NDM_CURRENT_SCOPE, NDM_ARRAYS(x, y)));
    assert_int_equal(stats_of(sc).live_arrays, 2);
    assert_int_equal(stats_of(inner).live_bytes, 0);
    assert_ok(ndm_scope_end(sc, 0, NULL));
    assert_false(ndm_array_valid(x) || ndm_array_valid(y));
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
    assert_ok(ndm_manager_close(capped));
    assert_ok(ndm_manager_close(lim));
    assert_manager_empty(ROOT(state));
}

static void test_attach_all_ends_loans(void **state)
{
    ndm_manager lender = ndm_manager_new(ROOT(state), "lender");
    ndm_manager borrower = ndm_manager_new(ROOT(state), "borrower");
    ndm_manager t = ndm_manager_new(ROOT(state), "t");
    ndm_manager capped = ndm_manager_new(ROOT(state), "capped");
    assert_ok(ndm_manager_cap(capped, NDM_CAP_ARRAYS));
    ndm_array x = ndm_zeros(lender, NDM_F32, NDM_SHAPE(3));
    ndm_array y = ndm_zeros(borrower, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_temp_attach(x, borrower));
    ndm_array list[] = {x, y};
    /* refused: the loan is intact, x still goes back when borrower closes */
    assert_status(ndm_attach_all(capped, 2, list), NDM_E_CAPPED);
    ndm_manager other = ndm_manager_new(ROOT(state), "other");
    ndm_array w = ndm_zeros(other, NDM_F32, NDM_SHAPE(1));
    ndm_array list2[] = {w, y};
    assert_ok(ndm_attach_all(borrower, 2, list2)); /* x is not in it */
    ndm_manager b2 = ndm_manager_new(ROOT(state), "b2");
    ndm_array z = ndm_zeros(b2, NDM_F32, NDM_SHAPE(3));
    ndm_array list3[] = {z};
    assert_ok(ndm_attach_all(borrower, 1, list3));
    assert_ok(ndm_manager_close(b2));
    assert_ok(ndm_manager_close(other));
    /* accepted: the loan ends, x stays in t when borrower closes */
    ndm_array list4[] = {x};
    assert_ok(ndm_attach_all(t, 1, list4));
    assert_ok(ndm_manager_close(borrower));
    assert_true(ndm_array_manager(x).id == t.id);
    assert_int_equal(stats_of(lender).live_arrays, 0);
    assert_ok(ndm_manager_close(lender));
    assert_true(ndm_array_valid(x));
    assert_ok(ndm_manager_close(t));
    assert_ok(ndm_manager_close(capped));
    assert_manager_empty(ROOT(state));
}

static void test_attach_all_shared_storage(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager t = ndm_manager_new(ROOT(state), "t");
    ndm_array base = ndm_zeros(a, NDM_F32, NDM_SHAPE(100)); /* 400 bytes */
    ndm_array v = ndm_slice(base, 0, 0, 10, 1);
    /* the view alone: the base keeps the charge in a */
    ndm_array l1[] = {v};
    assert_ok(ndm_attach_all(t, 1, l1));
    assert_int_equal(stats_of(a).live_bytes, 400);
    assert_int_equal(stats_of(t).live_bytes, 0);
    assert_ok(ndm_attach(v, a));
    /* the view and its base: the charge moves once */
    ndm_array l2[] = {v, base};
    assert_ok(ndm_attach_all(t, 2, l2));
    assert_int_equal(stats_of(a).live_bytes, 0);
    assert_int_equal(stats_of(t).live_bytes, 400);
    assert_int_equal(stats_of(t).live_arrays, 2);
    /* under a limit the set's storage counts once: 400 fits in 400 */
    ndm_manager lim = ndm_manager_new(ROOT(state), "lim");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 400));
    ndm_array l3[] = {base, v, base};
    assert_ok(ndm_attach_all(lim, 3, l3));
    assert_int_equal(stats_of(lim).live_bytes, 400);
    assert_int_equal(stats_of(t).live_bytes, 0);
    /* one more view outside the list keeps the charge where it is; a view
     * into a limit with room for the storage then is accepted */
    ndm_array w = ndm_alias_to(t, base);
    ndm_array l4[] = {w};
    ndm_manager lim2 = ndm_manager_new(ROOT(state), "lim2");
    assert_ok(ndm_manager_set_limit(lim2, NDM_CPU, 10));
    ndm_array l5[] = {base, v};
    ndm_stats s1 = stats_of(lim), s2 = stats_of(lim2), s3 = stats_of(t);
    assert_status(ndm_attach_all(lim2, 2, l5), NDM_E_QUOTA);
    ndm_stats r1 = stats_of(lim), r2 = stats_of(lim2), r3 = stats_of(t);
    assert_memory_equal(&s1, &r1, sizeof s1);
    assert_memory_equal(&s2, &r2, sizeof s2);
    assert_memory_equal(&s3, &r3, sizeof s3);
    assert_ok(ndm_attach_all(a, 1, l4));
    assert_int_equal(stats_of(a).live_bytes, 0);
    assert_int_equal(stats_of(lim).live_bytes, 400);
    assert_ok(ndm_manager_close(lim));
    /* the base's last views are in a now: the charge followed them */
    assert_int_equal(stats_of(a).live_bytes, 400);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(t));
    assert_ok(ndm_manager_close(lim2));
    assert_manager_empty(ROOT(state));
}

/* A list attach racing with the close of a source or of the target: it
 * moves every array or none, and nothing is left behind. */
typedef struct race {
    ndm_manager victim;
    atomic_int go;
} race;

static void *closer(void *p)
{
    race *r = p;
    while (!atomic_load(&r->go))
        ;
    (void)!ndm_manager_close(r->victim);
    return NULL;
}

static void attach_all_race(ndm_manager root, bool close_target)
{
    for (int round = 0; round < 200; round++) {
        ndm_manager s1 = ndm_manager_new(root, "s1");
        ndm_manager s2 = ndm_manager_new(root, "s2");
        ndm_manager t = ndm_manager_new(root, "t");
        ndm_array list[6];
        for (int i = 0; i < 6; i++)
            list[i] = ndm_zeros(i % 2 ? s2 : s1, NDM_F32, NDM_SHAPE(4));
        race r = {close_target ? t : s2, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, closer, &r), 0);
        atomic_store(&r.go, 1);
        ndm_status st = ndm_attach_all(t, 6, list);
        pthread_join(th, NULL);
        int alive = 0, in_t = 0;
        for (int i = 0; i < 6; i++) {
            alive += ndm_array_valid(list[i]);
            in_t += ndm_array_valid(list[i]) && ndm_array_manager(list[i]).id == t.id;
        }
        if (st == NDM_OK) {
            /* all moved before the close: the close took them (target) or
             * none of them (source) */
            assert_int_equal(alive, close_target ? 0 : 6);
            assert_int_equal(in_t, close_target ? 0 : 6);
        } else {
            assert_int_equal(st, NDM_E_CLOSED);
            assert_int_equal(in_t, 0);
            assert_int_equal(alive, close_target ? 6 : 3); /* s2's went with it */
        }
        (void)!ndm_manager_close(s1);
        (void)!ndm_manager_close(s2);
        (void)!ndm_manager_close(t);
        assert_manager_empty(root);
    }
}

static void test_attach_all_races_source_close(void **state)
{
    attach_all_race(ROOT(state), false);
}

static void test_attach_all_races_target_close(void **state)
{
    attach_all_race(ROOT(state), true);
}

/* ---- re-parenting ---- */

static void path_is(ndm_manager m, const char *want)
{
    char buf[256];
    assert_true(ndm_manager_path(m, buf, sizeof buf) > 0);
    assert_string_equal(buf, want);
}

static void test_manager_move_takes_the_subtree(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    ndm_manager trainer = ndm_manager_new(a, "trainer");
    ndm_manager batch = ndm_manager_new(trainer, "batch");
    ndm_array x = ndm_zeros(trainer, NDM_F32, NDM_SHAPE(5));
    ndm_array y = ndm_zeros(batch, NDM_F32, NDM_SHAPE(3));
    ndm_stats before;
    assert_ok(ndm_manager_stats(trainer, NDM_CPU, NDM_STATS_SUBTREE, &before));
    assert_ok(ndm_manager_move(trainer, b));
    assert_true(ndm_manager_parent(trainer).id == b.id);
    path_is(batch, "system/test/b/trainer/batch");
    ndm_stats sa, sb, after;
    assert_ok(ndm_manager_stats(a, NDM_CPU, NDM_STATS_SUBTREE, &sa));
    assert_ok(ndm_manager_stats(b, NDM_CPU, NDM_STATS_SUBTREE, &sb));
    assert_ok(ndm_manager_stats(trainer, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(sa.children, 0);
    assert_int_equal(sa.live_arrays, 0);
    assert_int_equal(sb.children, 2);
    assert_int_equal(sb.live_arrays, 2);
    assert_int_equal(sb.live_bytes, 32);
    /* the dump shows it in its new place */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(ndm_debug_dump(b, f));
    fclose(f);
    assert_non_null(strstr(buf, "trainer"));
    assert_non_null(strstr(buf, "batch"));
    free(buf);
    /* already there: nothing to do */
    assert_ok(ndm_manager_move(trainer, b));
    /* the old parent's close leaves it; the new one's takes it */
    assert_ok(ndm_manager_close(a));
    assert_true(ndm_manager_valid(trainer) && ndm_array_valid(x) && ndm_array_valid(y));
    assert_ok(ndm_manager_close(b));
    assert_false(ndm_manager_valid(trainer) || ndm_manager_valid(batch));
    assert_false(ndm_array_valid(x) || ndm_array_valid(y));
    assert_manager_empty(ROOT(state));
}

static void test_manager_move_refusals_change_nothing(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager m = ndm_manager_new(a, "m");
    ndm_manager kid = ndm_manager_new(m, "kid");
    ndm_manager capped = ndm_manager_new(ROOT(state), "capped");
    ndm_manager gone = ndm_manager_new(ROOT(state), "gone");
    assert_ok(ndm_manager_close(gone));
    assert_ok(ndm_manager_cap(capped, NDM_CAP_CHILDREN));
    assert_status(ndm_manager_move(m, m), NDM_E_INVALID);
    assert_error_has("cycle");
    assert_status(ndm_manager_move(m, kid), NDM_E_INVALID);
    assert_error_has("descendant");
    assert_status(ndm_manager_move(ndm_system(), a), NDM_E_ROOT);
    assert_status(ndm_manager_move(ndm_detached(), a), NDM_E_ROOT);
    assert_status(ndm_manager_move(m, ndm_detached()), NDM_E_ROOT);
    assert_status(ndm_manager_move(m, capped), NDM_E_CAPPED);
    assert_status(ndm_manager_move(m, gone), NDM_E_CLOSED);
    assert_status(ndm_manager_move(gone, a), NDM_E_CLOSED);
    ndm_clear_error();
    assert_status(ndm_manager_move(m, NDM_NULL_MANAGER), NDM_E_NULL);
    ndm_manager s = ndm_scope_begin(a, "s");
    assert_status(ndm_manager_move(s, capped), NDM_E_INVALID);
    assert_error_has("scope");
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_true(ndm_manager_parent(m).id == a.id);
    assert_true(ndm_manager_parent(kid).id == m.id);
    path_is(kid, "system/test/a/m/kid");
    ndm_stats st;
    assert_ok(ndm_manager_stats(capped, NDM_CPU, NDM_STATS_SUBTREE, &st));
    assert_int_equal(st.children, 0);
    /* a scope may receive a child, and a child may leave a scope */
    assert_ok(ndm_manager_close(capped));
    assert_ok(ndm_manager_close(a));
    assert_false(ndm_manager_valid(kid));
    assert_manager_empty(ROOT(state));
}

static void test_manager_move_charges_limits(void **state)
{
    ndm_manager lim = ndm_manager_new(ROOT(state), "lim");
    ndm_manager inner = ndm_manager_new(lim, "inner");
    ndm_manager free_ = ndm_manager_new(ROOT(state), "free");
    assert_ok(ndm_manager_set_limit(lim, NDM_CPU, 100));
    ndm_manager big = ndm_manager_new(free_, "big");
    ndm_manager below = ndm_manager_new(big, "below");
    ndm_array x = ndm_zeros(big, NDM_F32, NDM_SHAPE(15));  /* 60 */
    ndm_array y = ndm_zeros(below, NDM_F32, NDM_SHAPE(5)); /* 20 */
    /* 80 fits under 100 */
    assert_ok(ndm_manager_move(big, inner));
    ndm_array z = ndm_zeros(inner, NDM_F32, NDM_SHAPE(5)); /* 100 now */
    assert_live(z);
    ndm_clear_error();
    ndm_array over = ndm_zeros(below, NDM_F32, NDM_SHAPE(1));
    assert_true(over.id == 0);
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    /* out again: the limit gives the bytes up */
    assert_ok(ndm_manager_move(big, free_));
    ndm_array w = ndm_zeros(inner, NDM_F32, NDM_SHAPE(20)); /* 20 + 80 */
    assert_live(w);
    /* now the subtree does not fit: refused, nothing changed */
    ndm_stats before, after;
    assert_ok(ndm_manager_stats(lim, NDM_CPU, NDM_STATS_SUBTREE, &before));
    assert_status(ndm_manager_move(big, lim), NDM_E_QUOTA);
    assert_error_has("80 bytes");
    assert_error_has("'system/test/lim'");
    assert_ok(ndm_manager_stats(lim, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(ndm_manager_parent(big).id == free_.id);
    assert_ok(ndm_array_release(w));
    /* a limited child keeps its limit, and brings its bytes to the new one */
    assert_ok(ndm_manager_set_limit(big, NDM_CPU, 90));
    assert_ok(ndm_manager_move(big, inner));
    assert_ok(ndm_manager_stats(lim, NDM_CPU, NDM_STATS_SUBTREE, &after));
    assert_int_equal(after.live_bytes, 100);
    ndm_clear_error();
    assert_true(ndm_zeros(inner, NDM_F32, NDM_SHAPE(1)).id == 0);
    assert_ok(ndm_array_release(z));
    ndm_array v = ndm_zeros(below, NDM_F32, NDM_SHAPE(2)); /* 88 under big's 90 */
    assert_live(v);
    assert_ok(ndm_manager_close(big));
    (void)x;
    (void)y;
    ndm_array all = ndm_zeros(inner, NDM_F32, NDM_SHAPE(25)); /* the whole 100 */
    assert_live(all);
    assert_ok(ndm_manager_close(lim));
    assert_ok(ndm_manager_close(free_));
    assert_manager_empty(ROOT(state));
}

/* A move racing with the close of the old or the new parent. */
typedef struct move_race {
    ndm_manager victim;
    atomic_int go;
} move_race;

static void *move_closer(void *p)
{
    move_race *r = p;
    while (!atomic_load(&r->go))
        ;
    (void)!ndm_manager_close(r->victim);
    return NULL;
}

static void manager_move_race(ndm_manager root, bool close_new)
{
    for (int round = 0; round < 200; round++) {
        ndm_manager op = ndm_manager_new(root, "old");
        ndm_manager np = ndm_manager_new(root, "new");
        ndm_manager c = ndm_manager_new(op, "child");
        ndm_manager g = ndm_manager_new(c, "grandchild");
        ndm_array x = ndm_zeros(g, NDM_F32, NDM_SHAPE(4));
        move_race r = {close_new ? np : op, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, move_closer, &r), 0);
        atomic_store(&r.go, 1);
        ndm_status st = ndm_manager_move(c, np);
        pthread_join(th, NULL);
        if (close_new) {
            /* moved first: gone with the new parent; refused: still in old */
            assert_int_equal(ndm_manager_valid(c), st != NDM_OK);
            if (st != NDM_OK)
                assert_true(ndm_manager_parent(c).id == op.id);
        } else {
            /* moved first: it survives the old parent's close */
            assert_int_equal(ndm_manager_valid(c), st == NDM_OK);
            if (st == NDM_OK)
                assert_true(ndm_manager_parent(c).id == np.id);
        }
        assert_int_equal(ndm_array_valid(x), ndm_manager_valid(c));
        assert_true(st == NDM_OK || st == NDM_E_CLOSED);
        (void)!ndm_manager_close(op);
        (void)!ndm_manager_close(np);
        assert_false(ndm_manager_valid(c) || ndm_manager_valid(g));
        assert_manager_empty(root);
    }
}

static void test_manager_move_races_old_parent_close(void **state)
{
    manager_move_race(ROOT(state), false);
}

static void test_manager_move_races_new_parent_close(void **state)
{
    manager_move_race(ROOT(state), true);
}

/* The leak report says where a borrowed array came from. */
static void test_leak_report_marks_borrowed(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_manager step = ndm_manager_new(ROOT(state), "step");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(3));
    int w_line = __LINE__ - 1;
    ndm_array own = ndm_zeros(step, NDM_F32, NDM_SHAPE(3));
    assert_ok(ndm_temp_attach(w, step));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    (void)ndm_leak_report(f);
    fclose(f);
    char want[160];
    snprintf(want, sizeof want,
             "1 array created at test_composite.c:%d (test_leak_report_marks_borrowed) in "
             "system/test/step borrowed from 'system/test/model'",
             w_line);
    if (!strstr(buf, want))
        fail_msg("leak report lacks \"%s\":\n%s", want, buf);
    assert_null(strstr(strstr(buf, want) + strlen(want), "borrowed from")); /* own is not */
    free(buf);
    /* a lender closed since: said so */
    assert_ok(ndm_manager_close(model));
    buf = NULL;
    f = open_memstream(&buf, &len);
    (void)ndm_leak_report(f);
    fclose(f);
    assert_non_null(strstr(buf, "borrowed from a manager since closed"));
    free(buf);
    (void)own;
    assert_ok(ndm_manager_close(step));
    assert_manager_empty(ROOT(state));
}

/* Two lists crossing between the same managers, and an ndm_ret racing with
 * moves of its manager: no deadlock, no array lost, the counts exact. */
typedef struct cross {
    ndm_array list[8];
    ndm_manager to;
    int rounds;
    int ok;
} cross;

static void *cross_worker(void *p)
{
    cross *c = p;
    for (int i = 0; i < c->rounds; i++)
        c->ok += ndm_attach_all(c->to, 8, c->list) == NDM_OK;
    return NULL;
}

static void test_attach_all_crossing_lists(void **state)
{
    ndm_manager a = ndm_manager_new(ROOT(state), "a");
    ndm_manager b = ndm_manager_new(ROOT(state), "b");
    cross ca = {.to = b, .rounds = 300}, cb = {.to = a, .rounds = 300};
    for (int i = 0; i < 8; i++) {
        ca.list[i] = ndm_zeros(i % 2 ? a : b, NDM_F32, NDM_SHAPE(2));
        cb.list[i] = ndm_zeros(i % 2 ? b : a, NDM_F32, NDM_SHAPE(2));
    }
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, cross_worker, &ca), 0);
    assert_int_equal(pthread_create(&t2, NULL, cross_worker, &cb), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(ca.ok, 300);
    assert_int_equal(cb.ok, 300);
    for (int i = 0; i < 8; i++) {
        assert_true(ndm_array_manager(ca.list[i]).id == b.id);
        assert_true(ndm_array_manager(cb.list[i]).id == a.id);
    }
    ndm_stats sa = stats_of(a), sb = stats_of(b);
    assert_int_equal(sa.live_arrays, 8);
    assert_int_equal(sb.live_arrays, 8);
    assert_int_equal(sa.live_bytes, 64);
    assert_int_equal(sb.live_bytes, 64);
    assert_ok(ndm_manager_close(a));
    assert_ok(ndm_manager_close(b));
    assert_manager_empty(ROOT(state));
}

typedef struct shuttle {
    ndm_manager child, p1, p2;
    atomic_int stop;
} shuttle;

static void *shuttle_worker(void *p)
{
    shuttle *s = p;
    for (int i = 0; !atomic_load(&s->stop); i++)
        if (ndm_manager_move(s->child, i % 2 ? s->p1 : s->p2) != NDM_OK)
            fail_msg("move: %s", ndm_last_error());
    return NULL;
}

static void test_manager_move_races_ret(void **state)
{
    ndm_manager p1 = ndm_manager_new(ROOT(state), "p1");
    ndm_manager p2 = ndm_manager_new(ROOT(state), "p2");
    ndm_manager child = ndm_manager_new(p1, "child");
    assert_ok(ndm_manager_set_limit(p2, NDM_CPU, 1 << 20));
    shuttle sh = {child, p1, p2, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, shuttle_worker, &sh), 0);
    for (int i = 0; i < 500; i++) {
        ndm_array x = ndm_zeros(child, NDM_F32, NDM_SHAPE(4));
        assert_live(x);
        assert_ok(ndm_ret(x));
        ndm_manager m = ndm_array_manager(x);
        assert_true(m.id == p1.id || m.id == p2.id);
        assert_ok(ndm_array_release(x));
    }
    atomic_store(&sh.stop, 1);
    pthread_join(th, NULL);
    /* every byte given back where it was charged */
    ndm_stats s1, s2;
    assert_ok(ndm_manager_stats(p1, NDM_CPU, NDM_STATS_SUBTREE, &s1));
    assert_ok(ndm_manager_stats(p2, NDM_CPU, NDM_STATS_SUBTREE, &s2));
    assert_int_equal(s1.live_bytes + s2.live_bytes, 0);
    assert_ok(ndm_manager_move(child, p2));
    ndm_array full = ndm_zeros(child, NDM_U8, NDM_SHAPE(1 << 20)); /* the whole limit */
    assert_live(full);
    assert_ok(ndm_manager_close(p1));
    assert_ok(ndm_manager_close(p2));
    assert_manager_empty(ROOT(state));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_attach_all_moves_every_array),
        TEST(test_attach_all_bad_entry_moves_nothing),
        TEST(test_attach_all_refusing_target_moves_nothing),
        TEST(test_attach_all_ends_loans),
        TEST(test_attach_all_shared_storage),
        TEST(test_attach_all_races_source_close),
        TEST(test_attach_all_races_target_close),
        TEST(test_manager_move_takes_the_subtree),
        TEST(test_manager_move_refusals_change_nothing),
        TEST(test_manager_move_charges_limits),
        TEST(test_manager_move_races_old_parent_close),
        TEST(test_manager_move_races_new_parent_close),
        TEST(test_leak_report_marks_borrowed),
        TEST(test_attach_all_crossing_lists),
        TEST(test_manager_move_races_ret),
    };
    return cmocka_run_group_tests_name("composite", tests, NULL, NULL);
}
