/* Caps and limits: a capped model refuses a stray array at the line that
 * made it, and a byte limit per request stops a runaway request with
 * NDM_E_QUOTA while the other requests go on. */
#include <stdio.h>

#include <ndm/ndm.h>

/* A request: n rows of 1024 floats (4 KiB a row), summed. */
static ndm_status handle(ndm_manager requests, int64_t rows, double *out)
{
    NDM_AUTO ndm_manager req = ndm_manager_new(requests, "request");
    /* at most 64 KiB per request, whatever the caller asks for */
    if (ndm_manager_set_limit(req, NDM_CPU, 64 * 1024) != NDM_OK)
        return ndm_last_status();
    ndm_array x = ndm_ones(req, NDM_F32, NDM_SHAPE(rows, 1024));
    if (!x.id)
        return ndm_last_status(); /* req and what it holds close on the way out */
    return ndm_item(ndm_sum(x, false, NDM_ALL_AXES_LIST), out);
}

int main(void)
{
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(8, 8));
    NDM_CHECK(w.id);
    NDM_CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS) == NDM_OK);

    /* 1. a stray: the output of an op on w goes to w's manager, the model,
     *    which is capped. It fails here, naming this line. */
    ndm_array stray = ndm_mul_scalar(w, 2.0);
    printf("stray into the model: %s\n", stray.id ? "accepted" : ndm_last_error());
    /* the fix: name the manager the result belongs to */
    ndm_manager step = ndm_manager_new(ndm_system(), "step");
    ndm_array ok = ndm_mul_scalar_to(step, w, 2.0);
    NDM_CHECK(ok.id);
    printf("the same into a step manager: accepted\n");

    /* 2. a runaway request among normal ones */
    ndm_manager requests = ndm_manager_new(ndm_system(), "requests");
    const int64_t rows[4] = {2, 8, 1000, 4};
    for (int r = 0; r < 4; r++) {
        double sum = 0;
        ndm_status st = handle(requests, rows[r], &sum);
        if (st == NDM_OK)
            printf("request %d (%lld rows): sum %.0f\n", r, (long long)rows[r], sum);
        else
            printf("request %d (%lld rows): refused, %s\n  %s\n", r, (long long)rows[r],
                   ndm_status_name(st), ndm_last_error());
    }
    ndm_stats st;
    NDM_CHECK(ndm_manager_stats(requests, NDM_CPU, NDM_STATS_SUBTREE, &st) == NDM_OK);
    printf("live request arrays after: %llu\n", (unsigned long long)st.live_arrays);

    NDM_CHECK(ndm_manager_close(requests) == NDM_OK);
    NDM_CHECK(ndm_manager_close(step) == NDM_OK);
    NDM_CHECK(ndm_manager_close(model) == NDM_OK);
    return 0;
}
