/* The CPU's multinomial draw, in both random tables: every row checked,
 * then each row's running sums bisected (with replacement) or its
 * categories sorted by exponential keys (without), as ndm/random.h says. */
#include "../random.h"
#include "sort_cpu.h"

static double entry(const ndm__tensor *p, int64_t r, int64_t j)
{
    size_t es = ndm_dtype_size(p->dtype);
    return ndm__mn_load((const char *)p->data +
                            (r * p->strides[0] + j * p->strides[1]) * (int64_t)es,
                        p->dtype);
}

/* The first refused row's position and reason into bad; false if none. */
static bool refused(const ndm__tensor *probs, int64_t samples, bool replacement, int64_t bad[2])
{
    int64_t rows = probs->shape[0], n = probs->shape[1];
    for (int64_t r = 0; r < rows; r++) {
        double total = 0;
        int64_t nonzero = 0;
        for (int64_t j = 0; j < n; j++) {
            double p = entry(probs, r, j);
            int why = ndm__mn_check(p);
            if (why) {
                bad[0] = r * n + j, bad[1] = why;
                return true;
            }
            total += p;
            nonzero += p > 0;
        }
        int why = total == 0                              ? NDM__MN_ZERO_SUM
                  : !(total - total == 0)                 ? NDM__MN_OVERFLOW
                  : !replacement && nonzero < samples ? NDM__MN_FEW
                                                          : NDM__MN_OK;
        if (why) {
            bad[0] = r * n, bad[1] = why;
            return true;
        }
    }
    return false;
}

ndm_status ndm__cpu_multinomial(int device, const ndm__tensor *dst, const ndm__tensor *probs,
                                ndm_rng rng, bool replacement, int64_t bad[2])
{
    (void)device;
    bad[0] = 0, bad[1] = NDM__MN_OK;
    int64_t rows = dst->shape[0], samples = dst->shape[1], n = probs->shape[1];
    if (refused(probs, samples, replacement, bad) || rows == 0 || samples == 0)
        return NDM_OK;
    size_t room = replacement ? (size_t)n * sizeof(double) : 2 * (size_t)n * sizeof(ndm__sort_pair);
    void *ws = NULL;
    ndm_status st = ndm__scratch_alloc(NDM_DEVICE_CPU, 0, room, &ws);
    if (st < 0)
        return st;
    int64_t *out = dst->data;
    for (int64_t r = 0; r < rows; r++) {
        int64_t *o = out + r * dst->strides[0];
        if (replacement) {
            double *c = ws, sum = 0;
            int64_t last = 0;
            for (int64_t j = 0; j < n; j++) {
                double p = entry(probs, r, j);
                sum += p;
                c[j] = sum;
                if (p > 0)
                    last = j;
            }
            for (int64_t s = 0; s < samples; s++) {
                uint32_t w[2];
                ndm__mn_words(rng, (uint64_t)(r * samples + s), w);
                o[s * dst->strides[1]] = ndm__mn_pick(w, c, n, last);
            }
        } else {
            ndm__sort_pair *p = ws, *tmp = p + n;
            for (int64_t j = 0; j < n; j++) {
                uint32_t w[2];
                ndm__mn_words(rng, (uint64_t)(r * n + j), w);
                p[j] = (ndm__sort_pair){ndm__mn_key(w, entry(probs, r, j)), j};
            }
            ndm__cpu_sort_pairs(p, tmp, n);
            for (int64_t s = 0; s < samples; s++)
                o[s * dst->strides[1]] = p[s].pos;
        }
    }
    ndm__scratch_free(NDM_DEVICE_CPU, 0, ws);
    return NDM_OK;
}
