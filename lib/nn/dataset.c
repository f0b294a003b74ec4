/* In-memory datasets: a pair of arrays with examples along the first axis,
 * and loading one from the IDX files of the MNIST family. */
#include <inttypes.h>
#include <string.h>

#include "ndm/data.h"
#include "ndm/io.h"
#include "../ops/inner.h"

NDM_API ndm_status ndm_dataset_load_idx_at(NDM_SITE_PARAMS, ndm_manager m,
                                           const char *images_path, const char *labels_path,
                                           ndm_dataset *out)
{
    ndm__site site = NDM__SITE;
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, site, "out is NULL");
    memset(out, 0, sizeof *out);
    ndm_array x = ndm_idx_load_at(NDM__SITE_ARGS(site), m, images_path);
    if (!x.id)
        return ndm_last_status();
    ndm_array y = ndm_idx_load_at(NDM__SITE_ARGS(site), m, labels_path);
    if (!y.id) {
        ndm__discard(x);
        return ndm_last_status();
    }
    ndm__view vx, vy;
    (void)!ndm__view_peek(x, &vx); /* both just made */
    (void)!ndm__view_peek(y, &vy);
    const ndm__tensor *rx = &vx.t, *ry = &vy.t;
    if (rx->ndim < 1 || ry->ndim < 1 || rx->shape[0] != ry->shape[0]) {
        char a[160], b[160];
        ndm_status st = ndm__fail(NDM_E_SHAPE, __func__, site,
                                  "'%s' holds %s and '%s' holds %s: the first axes differ",
                                  images_path, ndm__view_desc(&vx, a, sizeof a), labels_path,
                                  ndm__view_desc(&vy, b, sizeof b));
        ndm__discard(y);
        ndm__discard(x);
        return st;
    }
    out->inputs = x;
    out->labels = y;
    return NDM_OK;
}

NDM_API int64_t ndm_dataset_size(ndm_dataset d)
{
    ndm__view v;
    if (!ndm__view_of(d.inputs, &v, __func__, NDM__NO_SITE))
        return -1;
    if (v.t.ndim < 1) {
        ndm__fail(NDM_E_SHAPE, __func__, NDM__NO_SITE, "the inputs are a 0-d array");
        return -1;
    }
    return v.t.shape[0];
}

NDM_API ndm_status ndm_dataset_release_at(NDM_SITE_PARAMS, ndm_dataset *d)
{
    if (!d)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__SITE, "d is NULL");
    /* A null handle has nothing to release: it counts as released already. */
    ndm_status a = d->labels.id ? ndm_array_release_at(ndm_file_, ndm_line_, ndm_func_, d->labels)
                                : NDM_ALREADY;
    ndm_status b = d->inputs.id ? ndm_array_release_at(ndm_file_, ndm_line_, ndm_func_, d->inputs)
                                : NDM_ALREADY;
    ndm_status st = a < 0 ? a : b < 0 ? b : (a == NDM_ALREADY && b == NDM_ALREADY) ? NDM_ALREADY
                                                                                   : NDM_OK;
    memset(d, 0, sizeof *d);
    return st;
}
