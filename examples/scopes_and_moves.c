/* Scopes and moves: temporaries caught by a scope and released together,
 * a result moved out to the caller (TorchSharp's MoveToOuterDisposeScope,
 * Lamp's scope returning its value), and arrays moved between managers. */
#include <stdio.h>

#include <ndm/ndm.h>

static void show_error(ndm_log_level level, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "ndm %s: %s\n", level == NDM_LOG_ERROR ? "error" : "warning", msg);
}

/* Arrays that m itself holds (its children's not counted). */
static int64_t live(ndm_manager m)
{
    ndm_stats st;
    NDM_CHECK(ndm_manager_stats(m, NDM_CPU, 0, &st) == NDM_OK);
    return (int64_t)st.live_arrays;
}

/* A layer written as a function: every temporary lands in the scope (it is
 * the innermost one on this thread), and only the result leaves it, moved
 * to the caller's manager. */
static ndm_array dense_relu(ndm_manager caller, ndm_array x, ndm_array w, ndm_array b)
{
    ndm_manager s = ndm_scope_begin(caller, "dense_relu");
    ndm_array y = ndm_relu(ndm_add(ndm_matmul(x, w), b)); /* 3 arrays, all in s */
    if (ndm_scope_end(s, 1, &y) != NDM_OK)                /* y moves to caller */
        return NDM_NULL_ARRAY;
    return y;
}

/* The same for ndm_scoped: fn runs in a fresh scope and its result moves out. */
typedef struct args {
    ndm_array x, w;
} args;
static ndm_array scaled_matmul(void *ud)
{
    args *a = ud;
    return ndm_mul_scalar(ndm_matmul(a->x, a->w), 0.5);
}

int main(void)
{
    ndm_set_log_fn(show_error, NULL);
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_manager batch = ndm_manager_new(model, "batch");
    ndm_array w = ndm_full(model, NDM_F32, 0.1, NDM_SHAPE(4, 3));
    ndm_array b = ndm_zeros(model, NDM_F32, NDM_SHAPE(3));
    ndm_array x = ndm_ones(batch, NDM_F32, NDM_SHAPE(2, 4));
    NDM_CHECK(w.id && b.id && x.id);

    /* 1. a scope keeps one result: batch gains 1 array, not 4 */
    ndm_array y = dense_relu(batch, x, w, b);
    NDM_CHECK(y.id);
    printf("after dense_relu: batch holds %lld arrays (x and y)\n", (long long)live(batch));

    /* 2. the callback form */
    args a = {x, w};
    ndm_array z = ndm_scoped(batch, scaled_matmul, &a);
    NDM_CHECK(z.id);
    printf("after ndm_scoped: batch holds %lld arrays (x, y, z)\n", (long long)live(batch));

    /* 3. moves: keep z beyond the batch by giving it to the model's
     * manager; ndm_ret(a) does the same for "one level up" */
    NDM_CHECK(ndm_attach(z, model) == NDM_OK);
    printf("after ndm_attach(z, model): batch holds %lld, model %lld (w, b, z)\n",
           (long long)live(batch), (long long)live(model));

    /* 4. a scope cannot keep what it does not own: nothing changes */
    ndm_manager s = ndm_scope_begin(batch, "strict");
    ndm_status st = ndm_scope_end(s, 1, &w); /* w belongs to model */
    printf("keeping a foreign array: %s; the scope is still open: %s\n", ndm_status_name(st),
           ndm_manager_valid(s) ? "yes" : "no");
    NDM_CHECK(ndm_scope_end(s, 0, NULL) == NDM_OK);

    /* 5. closing the batch frees x and y; z lives on in the model */
    NDM_CHECK(ndm_manager_close(batch) == NDM_OK);
    printf("after closing batch: model holds %lld arrays\n", (long long)live(model));
    double first; /* 1 * 0.1 summed over 4 inputs, halved */
    NDM_CHECK(ndm_item(ndm_slice(ndm_reshape(z, NDM_SHAPE(-1)), 0, 0, 1, 1), &first) == NDM_OK);
    printf("z[0][0] = %.2f\n", first);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    return 0;
}
