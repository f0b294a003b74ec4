/* Datasets and the batch loader: seeded order (checked against the
 * documented algorithm), every example once per epoch, drop_last, batch
 * managers closed on fetch or kept, loader state freed with its trainer. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h"

/* A dataset whose example i has inputs (i, -i, 3i) and label i % 10, so a
 * batch says which examples it holds. */
static ndm_dataset numbered(ndm_manager m, int64_t n)
{
    int32_t *x = malloc((size_t)(n ? n : 1) * 3 * sizeof *x);
    int64_t *y = malloc((size_t)(n ? n : 1) * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++) {
        x[3 * i] = (int32_t)i;
        x[3 * i + 1] = (int32_t)-i;
        x[3 * i + 2] = (int32_t)(3 * i);
        y[i] = i % 10;
    }
    ndm_dataset d = {ndm_from_buffer(m, NDM_I32, x, NDM_SHAPE(n, 3)),
                     ndm_from_buffer(m, NDM_I64, y, NDM_SHAPE(n))};
    free(x);
    free(y);
    assert_live(d.inputs);
    assert_live(d.labels);
    return d;
}

/* Check a batch of `numbered` data; append its example ids to ids[*k]. */
static void check_batch(const ndm_batch *b, int64_t *ids, int64_t *k)
{
    int64_t s = b->size;
    int32_t *x = malloc((size_t)s * 3 * sizeof *x + 1);
    int64_t *y = malloc((size_t)s * sizeof *y + 1);
    assert_ok(ndm_array_copy_out(b->inputs, x, (size_t)s * 3 * sizeof *x));
    assert_ok(ndm_array_copy_out(b->labels, y, (size_t)s * sizeof *y));
    assert_true(ndm_array_is_contiguous(b->inputs));
    assert_true(ndm_array_manager(b->inputs).id == b->manager.id);
    assert_true(ndm_array_manager(b->labels).id == b->manager.id);
    for (int64_t i = 0; i < s; i++) {
        int64_t id = x[3 * i];
        assert_int_equal(x[3 * i + 1], -id);
        assert_int_equal(x[3 * i + 2], 3 * id);
        assert_int_equal(y[i], id % 10);
        ids[(*k)++] = id;
    }
    free(x);
    free(y);
}

/* One epoch's example ids in the order the loader dealt them. */
static int64_t epoch_ids(ndm_loader ld, int64_t *ids)
{
    ndm_batch b;
    int rc;
    int64_t k = 0, index = 0;
    while ((rc = ndm_loader_next(ld, &b)) > 0) {
        assert_int_equal(b.index, index++);
        check_batch(&b, ids, &k);
    }
    if (rc < 0)
        fail_msg("ndm_loader_next: %s", ndm_last_error());
    assert_false(b.manager.id); /* zeroed at the end of the epoch */
    return k;
}

typedef struct tree {
    ndm_manager model, trainer;
} tree;

static tree make_tree(void **state)
{
    tree t;
    t.model = ndm_manager_new(ROOT(state), "model");
    t.trainer = ndm_manager_new(t.model, "trainer");
    assert_live(t.model);
    assert_live(t.trainer);
    return t;
}

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    return st;
}

/* The order data.h documents, written again from its text. */
static uint64_t ref_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void ref_order(int64_t *o, int64_t n, uint64_t seed, int64_t epoch)
{
    for (int64_t i = 0; i < n; i++)
        o[i] = i;
    uint64_t state = seed ^ ref_mix((uint64_t)epoch + 1);
    for (int64_t i = n - 1; i >= 1; i--) {
        uint64_t b = (uint64_t)i + 1, limit = (uint64_t)(-b) % b, r;
        do {
            state += 0x9E3779B97F4A7C15ull;
            r = ref_mix(state);
        } while (r < limit);
        int64_t j = (int64_t)(r % b), t = o[i];
        o[i] = o[j];
        o[j] = t;
    }
}

static void test_loader_follows_the_documented_shuffle(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 257);
    ndm_loader ld = ndm_loader_new(t.trainer, d,
                                   &(ndm_loader_options){.batch_size = 16, .seed = 42,
                                                         .flags = NDM_LOADER_SHUFFLE});
    assert_true(ndm_loader_valid(ld));
    assert_int_equal(ndm_loader_batches(ld), 17);
    int64_t got[257], want[257];
    for (int64_t e = 0; e < 3; e++) {
        assert_int_equal(epoch_ids(ld, got), 257);
        ref_order(want, 257, 42, e);
        assert_memory_equal(got, want, sizeof got);
    }
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_same_seed_same_order_other_seed_other(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 100);
    ndm_loader_options o = {.batch_size = 7, .seed = 7, .flags = NDM_LOADER_SHUFFLE};
    ndm_loader a = ndm_loader_new(t.trainer, d, &o);
    ndm_loader b = ndm_loader_new(t.trainer, d, &o);
    o.seed = 8;
    ndm_loader c = ndm_loader_new(t.trainer, d, &o);
    int64_t ia[100], ib[100], ic[100], ia2[100];
    assert_int_equal(epoch_ids(a, ia), 100);
    assert_int_equal(epoch_ids(b, ib), 100);
    assert_int_equal(epoch_ids(c, ic), 100);
    assert_memory_equal(ia, ib, sizeof ia);
    assert_memory_not_equal(ia, ic, sizeof ia);
    /* The next epoch is reshuffled... */
    assert_int_equal(epoch_ids(a, ia2), 100);
    assert_memory_not_equal(ia, ia2, sizeof ia);
    /* ...and any epoch can be replayed. */
    assert_ok(ndm_loader_set_epoch(b, 1));
    assert_int_equal(epoch_ids(b, ib), 100);
    assert_memory_equal(ia2, ib, sizeof ia);
    /* Without shuffling the order is the dataset's. */
    ndm_loader s = ndm_loader_new(t.trainer, d, &(ndm_loader_options){.batch_size = 30});
    assert_int_equal(epoch_ids(s, ia), 100);
    for (int i = 0; i < 100; i++)
        assert_int_equal(ia[i], i);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

/* The epoch counter never wraps: the end of epoch INT64_MAX is refused,
 * leaving the loader and its current batch as they were. */
static void test_loader_last_epoch_never_wraps(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 30);
    ndm_loader ld = ndm_loader_new(t.trainer, d,
                                   &(ndm_loader_options){.batch_size = 10, .seed = 5,
                                                         .flags = NDM_LOADER_SHUFFLE});
    assert_live(ld);
    /* from the epoch before the last, through the last */
    assert_ok(ndm_loader_set_epoch(ld, INT64_MAX - 1));
    for (int64_t e = INT64_MAX - 1;; e++) {
        ndm_batch b;
        int64_t ids[30], k = 0;
        for (int i = 0; i < 3; i++) {
            assert_int_equal(ndm_loader_next(ld, &b), 1);
            assert_true(b.epoch == e);
            check_batch(&b, ids, &k);
        }
        int seen[30] = {0};
        for (int64_t i = 0; i < k; i++)
            seen[ids[i]]++;
        for (int i = 0; i < 30; i++)
            assert_int_equal(seen[i], 1);
        if (e == INT64_MAX) {
            ndm_manager last = b.manager;
            for (int again = 0; again < 2; again++) {
                assert_int_equal(ndm_loader_next(ld, &b), NDM_E_OVERFLOW);
                assert_error_has("epoch 9223372036854775807 is over and is the last");
                assert_int_equal(b.manager.id, 0);
                assert_true(ndm_manager_valid(last)); /* the refusal closed nothing */
            }
            break;
        }
        assert_int_equal(ndm_loader_next(ld, &b), 0);
    }
    /* the loader goes on from any other epoch */
    assert_ok(ndm_loader_set_epoch(ld, INT64_MAX));
    assert_ok(ndm_loader_set_epoch(ld, 0));
    ndm_batch b;
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_int_equal(b.epoch, 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_deals_every_example_once_per_epoch(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 103);
    ndm_loader ld = ndm_loader_new(t.trainer, d,
                                   &(ndm_loader_options){.batch_size = 10, .seed = 3,
                                                         .flags = NDM_LOADER_SHUFFLE});
    assert_int_equal(ndm_loader_batches(ld), 11);
    for (int e = 0; e < 3; e++) {
        ndm_batch b;
        int64_t ids[103], k = 0, sizes = 0;
        int rc, nb = 0;
        while ((rc = ndm_loader_next(ld, &b)) > 0) {
            assert_int_equal(b.size, nb < 10 ? 10 : 3);
            assert_int_equal(b.epoch, e);
            assert_int_equal(b.step, e * 11 + nb);
            assert_int_equal(ndm_array_dim(b.inputs, 0), b.size);
            check_batch(&b, ids, &k);
            sizes += b.size;
            nb++;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(nb, 11);
        assert_int_equal(sizes, 103);
        int seen[103] = {0};
        for (int64_t i = 0; i < k; i++)
            seen[ids[i]]++;
        for (int i = 0; i < 103; i++)
            assert_int_equal(seen[i], 1);
    }
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_drop_last_drops_the_short_batch(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 103);
    ndm_loader ld = ndm_loader_new(
        t.trainer, d,
        &(ndm_loader_options){.batch_size = 10, .seed = 5,
                              .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_DROP_LAST});
    assert_int_equal(ndm_loader_batches(ld), 10);
    int64_t ids[2][103], order[103];
    for (int e = 0; e < 2; e++) {
        ndm_batch b;
        int64_t k = 0;
        int rc;
        while ((rc = ndm_loader_next(ld, &b)) > 0) {
            assert_int_equal(b.size, 10);
            check_batch(&b, ids[e], &k);
        }
        assert_int_equal(rc, 0);
        assert_int_equal(k, 100);
        int seen[103] = {0};
        for (int i = 0; i < 100; i++)
            seen[ids[e][i]]++;
        for (int i = 0; i < 103; i++)
            assert_true(seen[i] <= 1);
        /* The dropped three are the tail of the epoch's order. */
        ref_order(order, 103, 5, e);
        assert_memory_equal(ids[e], order, 100 * sizeof(int64_t));
    }
    ndm_loader exact = ndm_loader_new(
        t.trainer, d, &(ndm_loader_options){.batch_size = 103, .flags = NDM_LOADER_DROP_LAST});
    assert_int_equal(ndm_loader_batches(exact), 1);
    ndm_loader none = ndm_loader_new(
        t.trainer, d, &(ndm_loader_options){.batch_size = 104, .flags = NDM_LOADER_DROP_LAST});
    assert_int_equal(ndm_loader_batches(none), 0);
    ndm_batch b;
    assert_int_equal(ndm_loader_next(none, &b), 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_closes_each_batch_on_the_next_fetch(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 25);
    ndm_stats base = stats_of(t.trainer);
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){.batch_size = 10});
    ndm_batch b0, b1;
    assert_int_equal(ndm_loader_next(ld, &b0), 1);
    char path[256];
    assert_true(ndm_manager_path(b0.manager, path, sizeof path) > 0);
    assert_string_equal(path, "system/test/model/trainer/batch-0");
    assert_true(ndm_manager_parent(b0.manager).id == t.trainer.id);
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.live_arrays, 2);
    assert_int_equal(s.children, 1);
    assert_int_equal(s.live_bytes, 10 * 3 * 4 + 10 * 8);

    assert_int_equal(ndm_loader_next(ld, &b1), 1);
    assert_false(ndm_manager_valid(b0.manager));
    assert_int_equal(ndm_array_ndim(b0.inputs), -1);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    assert_error_has("was released when its manager");
    s = stats_of(t.trainer);
    assert_int_equal(s.live_arrays, 2);
    assert_int_equal(s.children, 1);
    assert_true(ndm_manager_path(b1.manager, path, sizeof path) > 0);
    assert_string_equal(path, "system/test/model/trainer/batch-1");

    ndm_batch b2;
    assert_int_equal(ndm_loader_next(ld, &b2), 1);
    assert_int_equal(b2.size, 5);
    assert_int_equal(ndm_loader_next(ld, &b2), 0); /* the end of the epoch closes the last one */
    s = stats_of(t.trainer);
    assert_int_equal(s.live_arrays, base.live_arrays);
    assert_int_equal(s.live_bytes, base.live_bytes);
    assert_int_equal(s.children, base.children);
    /* A batch the caller closed itself is fine too. */
    assert_int_equal(ndm_loader_next(ld, &b0), 1);
    assert_ok(ndm_manager_close(b0.manager));
    assert_int_equal(ndm_loader_next(ld, &b1), 1);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_kept_batch_survives_the_next_fetch(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 30);
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){.batch_size = 10});
    ndm_batch kept, b;
    assert_int_equal(ndm_loader_keep(ld), NDM_E_INVALID); /* nothing fetched yet */
    assert_int_equal(ndm_loader_next(ld, &kept), 1);
    assert_ok(ndm_loader_keep(ld));
    assert_int_equal(ndm_loader_keep(ld), NDM_E_INVALID);
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_true(ndm_manager_valid(kept.manager));
    int64_t ids[10], k = 0;
    check_batch(&kept, ids, &k);
    for (int i = 0; i < 10; i++)
        assert_int_equal(ids[i], i);
    ndm_stats s = stats_of(t.trainer);
    assert_int_equal(s.children, 2);
    assert_int_equal(s.live_arrays, 4);
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_true(ndm_manager_valid(kept.manager));
    assert_true(ndm_manager_parent(kept.manager).id == t.trainer.id);
    assert_ok(ndm_manager_close(kept.manager)); /* freed by its close */
    assert_false(ndm_array_valid(kept.inputs));
    s = stats_of(t.trainer);
    assert_int_equal(s.children, 1);
    assert_int_equal(s.live_arrays, 2);

    /* Keeping every batch: they pile up until closed, and the trainer's
     * close takes the rest. */
    ndm_loader all = ndm_loader_new(
        t.trainer, d, &(ndm_loader_options){.batch_size = 10, .flags = NDM_LOADER_KEEP_BATCHES});
    ndm_batch kb[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(ndm_loader_next(all, &kb[i]), 1);
    assert_int_equal(ndm_loader_next(all, &b), 0);
    for (int i = 0; i < 3; i++)
        assert_true(ndm_manager_valid(kb[i].manager));
    assert_ok(ndm_manager_close(kb[1].manager));
    assert_int_equal(stats_of(t.trainer).children, 3); /* kb[0], kb[2], ld's current */
    assert_ok(ndm_manager_close(t.trainer));
    assert_false(ndm_manager_valid(kb[0].manager));
    assert_false(ndm_manager_valid(kb[2].manager));
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_state_is_freed_with_the_trainer(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 20);
    ndm_stats before = stats_of(t.trainer);
    ndm_loader ld = ndm_loader_new(
        t.trainer, d,
        &(ndm_loader_options){.batch_size = 4, .seed = 1, .flags = NDM_LOADER_SHUFFLE});
    ndm_stats s;
    assert_ok(ndm_manager_stats(t.trainer, NDM_CPU, 0, &s));
    assert_int_equal(s.resources, before.resources + 1);
    ndm_batch b;
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_ok(ndm_manager_close(t.trainer));
    assert_false(ndm_loader_valid(ld));
    assert_false(ndm_manager_valid(b.manager));
    assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CLOSED);
    assert_error_has("was freed when its manager 'system/test/model/trainer' was closed");
    assert_error_has("test_data.c");
    assert_int_equal(ndm_loader_batches(ld), -1);
    assert_int_equal(ndm_loader_close(ld), NDM_ALREADY);
    ndm_clear_error(); /* a null handle keeps an earlier error */
    assert_int_equal(ndm_loader_next((ndm_loader){0}, &b), NDM_E_NULL);
    assert_int_equal(ndm_loader_next((ndm_loader){0xdead00000000beefull}, &b), NDM_E_INVALID);
    /* Loader and array handles never pass for each other. */
    ndm_array some = ndm_zeros(t.model, NDM_U8, NDM_SHAPE(1));
    assert_int_equal(ndm_loader_next((ndm_loader){some.id}, &b), NDM_E_INVALID);
    assert_false(ndm_array_valid((ndm_array){ld.id}));
    assert_int_equal(ndm_array_release((ndm_array){ld.id}), NDM_E_INVALID);
    assert_true(ndm_array_valid(some));

    /* Closed early: the current batch goes, the handle is stale. */
    ndm_manager tr = ndm_manager_new(t.model, "trainer-2");
    ndm_loader l2 = ndm_loader_new(tr, d, &(ndm_loader_options){.batch_size = 4});
    assert_int_equal(ndm_loader_next(l2, &b), 1);
    assert_ok(ndm_loader_close(l2));
    assert_false(ndm_manager_valid(b.manager));
    assert_int_equal(ndm_loader_close(l2), NDM_ALREADY);
    assert_int_equal(ndm_loader_next(l2, &b), NDM_E_CLOSED);
    assert_error_has("was closed at");
    assert_int_equal(stats_of(tr).live_arrays, 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

static void test_loader_scales_images_and_widens_labels(void **state)
{
    tree t = make_tree(state);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    uint8_t px[50 * 2 * 3], lab[50];
    for (int i = 0; i < 50 * 6; i++)
        px[i] = (uint8_t)(i * 37 + 11);
    px[0] = 0;
    px[1] = 255;
    for (int i = 0; i < 50; i++)
        lab[i] = (uint8_t)(i % 10);
    ndm_dataset d = {ndm_from_buffer(data, NDM_U8, px, NDM_SHAPE(50, 2, 3)),
                     ndm_from_buffer(data, NDM_U8, lab, NDM_SHAPE(50))};
    ndm_loader ld = ndm_loader_new(
        t.trainer, d,
        &(ndm_loader_options){.batch_size = 8, .seed = 9,
                              .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS |
                                       NDM_LOADER_LABELS_I64});
    int64_t order[50];
    ref_order(order, 50, 9, 0);
    ndm_batch b;
    int64_t seen = 0;
    while (ndm_loader_next(ld, &b) > 0) {
        assert_int_equal(ndm_array_dtype(b.inputs), NDM_F32);
        assert_int_equal(ndm_array_dtype(b.labels), NDM_I64);
        assert_int_equal(ndm_array_ndim(b.inputs), 3);
        float f[8 * 6];
        int64_t y[8];
        assert_ok(ndm_array_copy_out(b.inputs, f, (size_t)b.size * 6 * sizeof(float)));
        assert_ok(ndm_array_copy_out(b.labels, y, (size_t)b.size * sizeof(int64_t)));
        for (int64_t i = 0; i < b.size; i++) {
            int64_t id = order[seen + i];
            assert_int_equal(y[i], lab[id]);
            for (int j = 0; j < 6; j++) {
                double want = px[id * 6 + j] / 255.0;
                assert_true(f[i * 6 + j] >= 0.0f && f[i * 6 + j] <= 1.0f);
                assert_true(fabs(f[i * 6 + j] - want) <= 6e-8 * (want > 1e-3 ? want : 1e-3));
            }
        }
        seen += b.size;
    }
    assert_int_equal(seen, 50);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_manager_close(data));
}

static void test_loader_gathers_strided_datasets(void **state)
{
    tree t = make_tree(state);
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    /* Example i is column i of a [3, 40] array: rows are strided views, and
     * the dtype is widened on the way (u8 labels to i64). */
    int32_t x[3 * 40];
    uint8_t y[40];
    for (int i = 0; i < 40; i++) {
        x[0 * 40 + i] = i;
        x[1 * 40 + i] = -i;
        x[2 * 40 + i] = 3 * i;
        y[i] = (uint8_t)(i % 10);
    }
    ndm_array base = ndm_from_buffer(data, NDM_I32, x, NDM_SHAPE(3, 40));
    ndm_array labels = ndm_from_buffer(data, NDM_U8, y, NDM_SHAPE(40));
    ndm_dataset d = {ndm_transpose(base), labels};
    assert_false(ndm_array_is_contiguous(d.inputs));
    ndm_loader ld = ndm_loader_new(
        t.trainer, d,
        &(ndm_loader_options){.batch_size = 6, .seed = 2,
                              .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_LABELS_I64});
    int64_t ids[40], want[40];
    assert_int_equal(epoch_ids(ld, ids), 40);
    ref_order(want, 40, 2, 0);
    assert_memory_equal(ids, want, sizeof ids);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_manager_close(data));
}

static void test_loader_rejects_bad_options_and_data(void **state)
{
    tree t = make_tree(state);
    ndm_manager m = ROOT(state);
    ndm_dataset d = numbered(m, 10);
    ndm_array f = ndm_zeros(m, NDM_F32, NDM_SHAPE(10));
    ndm_array s = ndm_scalar(m, NDM_F32, 1.0);
    ndm_array short_labels = ndm_zeros(m, NDM_I64, NDM_SHAPE(9));
    struct {
        ndm_dataset d;
        ndm_loader_options o;
        ndm_status want;
        const char *msg;
    } cases[] = {
        {d, {.batch_size = 0}, NDM_E_INVALID, "the batch size must be at least 1"},
        {d, {.batch_size = 2, .flags = 1u << 9}, NDM_E_INVALID, "unknown loader flags"},
        {{d.inputs, short_labels}, {.batch_size = 2}, NDM_E_SHAPE, "i32[10,3] and labels i64[9]"},
        {{s, NDM_NULL_ARRAY}, {.batch_size = 2}, NDM_E_SHAPE, "both need a first axis"},
        {d, {.batch_size = 2, .flags = NDM_LOADER_SCALE_INPUTS}, NDM_E_DTYPE, "scales u8 images"},
        {{d.labels, f}, {.batch_size = 2, .flags = NDM_LOADER_LABELS_I64}, NDM_E_DTYPE,
         "the labels are f32[10]"},
        {{d.inputs, NDM_NULL_ARRAY}, {.batch_size = 2, .flags = NDM_LOADER_LABELS_I64},
         NDM_E_INVALID, "without labels"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ndm_clear_error();
        ndm_loader ld = ndm_loader_new(t.trainer, cases[i].d, &cases[i].o);
        if (ld.id || ndm_last_status() != cases[i].want || !strstr(ndm_last_error(), cases[i].msg))
            fail_msg("case %zu: got %s \"%s\", want %s \"%s\"", i,
                     ndm_status_name(ndm_last_status()), ndm_last_error(),
                     ndm_status_name(cases[i].want), cases[i].msg);
    }
    assert_false(ndm_loader_new(t.trainer, d, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    ndm_manager gone = ndm_manager_new(m, "gone");
    assert_ok(ndm_manager_close(gone));
    assert_false(ndm_loader_new(gone, d, &(ndm_loader_options){.batch_size = 1}).id);
    assert_int_equal(ndm_last_status(), NDM_E_CLOSED);
    /* Nothing was attached to the trainer by the refusals. */
    ndm_stats st;
    assert_ok(ndm_manager_stats(t.trainer, NDM_CPU, 0, &st));
    assert_int_equal(st.resources, 0);

    /* A dataset released under a live loader is reported, never read. */
    ndm_loader ld = ndm_loader_new(t.trainer, d, &(ndm_loader_options){.batch_size = 4});
    ndm_batch b;
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_ok(ndm_array_release(d.inputs));
    assert_int_equal(ndm_loader_next(ld, &b), NDM_E_CLOSED);
    assert_error_has("released at");
    assert_false(ndm_manager_valid(b.manager));
    assert_int_equal(stats_of(t.trainer).children, 0);
    assert_int_equal(ndm_loader_set_epoch(ld, -1), NDM_E_INVALID);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_array_release(d.labels));
    assert_ok(ndm_array_release(f));
    assert_ok(ndm_array_release(s));
    assert_ok(ndm_array_release(short_labels));
}

static void test_loader_handles_unlabelled_and_empty_data(void **state)
{
    tree t = make_tree(state);
    ndm_manager m = ROOT(state);
    ndm_array x = ndm_arange(m, NDM_F64, 0, 5, 1); /* rows are 0-d */
    ndm_loader ld = ndm_loader_new(t.trainer, ((ndm_dataset){x, NDM_NULL_ARRAY}),
                                   &(ndm_loader_options){.batch_size = 2});
    ndm_batch b;
    double v[2];
    assert_int_equal(ndm_loader_next(ld, &b), 1);
    assert_false(b.labels.id);
    assert_int_equal(ndm_array_ndim(b.inputs), 1);
    assert_ok(ndm_array_copy_out(b.inputs, v, sizeof v));
    assert_true(v[0] == 0.0 && v[1] == 1.0);
    ndm_array e = ndm_zeros(m, NDM_F32, NDM_SHAPE(0, 4));
    ndm_loader le = ndm_loader_new(t.trainer, ((ndm_dataset){e, NDM_NULL_ARRAY}),
                                   &(ndm_loader_options){.batch_size = 3});
    assert_int_equal(ndm_loader_batches(le), 0);
    assert_int_equal(ndm_loader_next(le, &b), 0);
    assert_int_equal(ndm_loader_next(le, &b), 0);
    assert_int_equal(ndm_dataset_size((ndm_dataset){e, NDM_NULL_ARRAY}), 0);
    assert_int_equal(ndm_dataset_size((ndm_dataset){x, NDM_NULL_ARRAY}), 5);
    assert_ok(ndm_manager_close(t.model));
    ndm_dataset both = {x, e};
    assert_ok(ndm_dataset_release(&both));
    assert_int_equal(ndm_dataset_release(&both), NDM_ALREADY);
    assert_int_equal(ndm_dataset_size(both), -1);
}

static void test_loader_runs_an_epoch_of_fashion_mnist(void **state)
{
    const char *dir = getenv("NDM_FASHION_MNIST_DIR");
    char img[512], lab[512];
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte.gz",
             dir ? dir : "/usr/share/datasets/fashion-mnist");
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte.gz",
             dir ? dir : "/usr/share/datasets/fashion-mnist");
    if (access(img, R_OK) != 0) {
        print_message("skipped: %s is absent (install dataset-fashion-mnist)\n", img);
        skip();
    }
    ndm_manager data = ndm_manager_new(ROOT(state), "data");
    tree t = make_tree(state);
    ndm_dataset ds;
    assert_ok(ndm_dataset_load_idx(data, img, lab, &ds));
    ndm_loader ld = ndm_loader_new(
        t.trainer, ds,
        &(ndm_loader_options){.batch_size = 256, .seed = 2024,
                              .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS |
                                       NDM_LOADER_LABELS_I64});
    assert_int_equal(ndm_loader_batches(ld), 40);
    int64_t count[10] = {0}, total = 0, batches = 0;
    ndm_batch b;
    while (ndm_loader_next(ld, &b) > 0) {
        const float *x = ndm_array_data(b.inputs);
        const int64_t *y = ndm_array_data(b.labels);
        for (int64_t i = 0; i < b.size * 784; i++)
            assert_true(x[i] >= 0.0f && x[i] <= 1.0f);
        for (int64_t i = 0; i < b.size; i++) {
            assert_true(y[i] >= 0 && y[i] <= 9);
            count[y[i]]++;
        }
        total += b.size;
        batches++;
    }
    assert_int_equal(total, 10000);
    assert_int_equal(batches, 40);
    for (int c = 0; c < 10; c++)
        assert_int_equal(count[c], 1000);
    assert_int_equal(stats_of(t.trainer).live_arrays, 0);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_manager_close(data));
}

/* Shards of one epoch: together, batch k of the S shards is batch k of one
 * loader with batch size S * B (the same examples, in the same order when
 * the shards' runs are laid end to end), every shard has the same number
 * of batches, and the short last global batch is split evenly. */
static void test_loader_shards_split_each_global_batch(void **state)
{
    tree t = make_tree(state);
    ndm_dataset d = numbered(ROOT(state), 103);
    for (int drop = 0; drop < 2; drop++)
        for (int64_t S = 1; S <= 4; S++) {
            unsigned flags = NDM_LOADER_SHUFFLE | (drop ? NDM_LOADER_DROP_LAST : 0);
            ndm_loader whole = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
                .batch_size = 8 * S, .seed = 9, .flags = flags});
            ndm_loader sh[4];
            for (int64_t s = 0; s < S; s++) {
                sh[s] = ndm_loader_new(t.trainer, d, &(ndm_loader_options){
                    .batch_size = 8, .seed = 9, .flags = flags, .num_shards = S, .shard = s});
                assert_true(ndm_loader_valid(sh[s]));
                assert_int_equal(ndm_loader_batches(sh[s]), ndm_loader_batches(whole));
            }
            for (int e = 0; e < 2; e++) {
                int64_t want[103], got[103], nw = 0, ng = 0;
                ndm_batch b;
                while (ndm_loader_next(whole, &b) > 0) {
                    int64_t k0 = nw;
                    check_batch(&b, want, &nw);
                    int64_t from = ng;
                    for (int64_t s = 0; s < S; s++) {
                        ndm_batch p;
                        assert_int_equal(ndm_loader_next(sh[s], &p), 1);
                        assert_int_equal(p.index, b.index);
                        /* even: shards differ by one example at most */
                        int64_t even = (nw - k0) / S;
                        assert_true(p.size == even || p.size == even + 1);
                        check_batch(&p, got, &ng);
                    }
                    assert_int_equal(ng - from, nw - k0);
                }
                for (int64_t s = 0; s < S; s++) {
                    ndm_batch p;
                    assert_int_equal(ndm_loader_next(sh[s], &p), 0);
                }
                assert_int_equal(ng, nw);
                assert_int_equal(nw, drop ? 103 / (8 * S) * 8 * S : 103);
                assert_memory_equal(got, want, (size_t)nw * sizeof *got);
            }
            for (int64_t s = 0; s < S; s++)
                assert_ok(ndm_loader_close(sh[s]));
            assert_ok(ndm_loader_close(whole));
        }
    /* a shard outside the range */
    ndm_clear_error();
    assert_false(ndm_loader_new(t.trainer, d, &(ndm_loader_options){
        .batch_size = 8, .num_shards = 2, .shard = 2}).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_error_has("shard 2 of 2");
    assert_false(ndm_loader_new(t.trainer, d, &(ndm_loader_options){
        .batch_size = 8, .num_shards = -1}).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    assert_ok(ndm_manager_close(t.model));
    assert_ok(ndm_dataset_release(&d));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_loader_follows_the_documented_shuffle),
        TEST(test_loader_same_seed_same_order_other_seed_other),
        TEST(test_loader_deals_every_example_once_per_epoch),
        TEST(test_loader_last_epoch_never_wraps),
        TEST(test_loader_drop_last_drops_the_short_batch),
        TEST(test_loader_shards_split_each_global_batch),
        TEST(test_loader_closes_each_batch_on_the_next_fetch),
        TEST(test_loader_kept_batch_survives_the_next_fetch),
        TEST(test_loader_state_is_freed_with_the_trainer),
        TEST(test_loader_scales_images_and_widens_labels),
        TEST(test_loader_gathers_strided_datasets),
        TEST(test_loader_rejects_bad_options_and_data),
        TEST(test_loader_handles_unlabelled_and_empty_data),
        TEST(test_loader_runs_an_epoch_of_fashion_mnist),
    };
    return cmocka_run_group_tests_name("data", tests, NULL, NULL);
}
