/* Random factories and in-place fills, and multinomial draws from arrays of
 * probabilities: check the generator and the distribution's parameters,
 * allocate, run the device's random kernels, and advance the caller's
 * generator past what they consumed. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "../backends/random.h"
#include "autograd.h"
#include "dispatch.h"
#include "supports.h"

typedef enum kind { UNIFORM, NORMAL, RANDINT, BERNOULLI } kind;

/* One draw request: the distribution and its parameters. */
typedef struct draw {
    kind k;
    double a, b;             /* lo, hi | mean, std | p */
    int64_t lo, hi;          /* randint */
} draw;

static const char *kind_name(kind k)
{
    static const char *const names[] = {"uniform", "normal", "randint", "bernoulli"};
    return names[k];
}

/* Parameters and dtype are valid for the distribution; errors say which. */
static ndm_status check(const draw *d, ndm_dtype t, const char *api, ndm__site site)
{
    if (!ndm_dtype_valid(t))
        return ndm__fail(NDM_E_DTYPE, api, site, "invalid dtype %d", (int)t);
    switch (d->k) {
    case UNIFORM:
    case NORMAL:
        if (!ndm_dtype_is_float(t))
            return ndm__fail(NDM_E_DTYPE, api, site, "%s makes float dtypes, not %s",
                             kind_name(d->k), ndm_dtype_name(t));
        if (!isfinite(d->a) || !isfinite(d->b))
            return ndm__fail(NDM_E_INVALID, api, site, "%s parameters must be finite (got %g, %g)",
                             kind_name(d->k), d->a, d->b);
        if (d->k == UNIFORM && !(d->a < d->b && isfinite(d->b - d->a)))
            return ndm__fail(NDM_E_INVALID, api, site,
                             "uniform needs lo < hi with a finite span (got lo %g, hi %g)", d->a,
                             d->b);
        if (d->k == NORMAL && d->b < 0)
            return ndm__fail(NDM_E_INVALID, api, site, "normal needs std >= 0 (got %g)", d->b);
        return NDM_OK;
    case RANDINT: {
        int64_t min = t == NDM_U8 ? 0 : t == NDM_I32 ? INT32_MIN : INT64_MIN;
        int64_t max = t == NDM_U8 ? UINT8_MAX : t == NDM_I32 ? INT32_MAX : INT64_MAX;
        if (t != NDM_U8 && t != NDM_I32 && t != NDM_I64)
            return ndm__fail(NDM_E_DTYPE, api, site, "randint makes u8, i32 or i64, not %s",
                             ndm_dtype_name(t));
        if (d->lo >= d->hi)
            return ndm__fail(NDM_E_INVALID, api, site,
                             "randint needs lo < hi (got lo %" PRId64 ", hi %" PRId64 ")", d->lo,
                             d->hi);
        if (d->lo < min || d->hi - 1 > max)
            return ndm__fail(NDM_E_INVALID, api, site,
                             "randint range [%" PRId64 ", %" PRId64 ") does not fit %s", d->lo,
                             d->hi, ndm_dtype_name(t));
        return NDM_OK;
    }
    case BERNOULLI:
        if (!(d->a >= 0 && d->a <= 1))
            return ndm__fail(NDM_E_INVALID, api, site, "bernoulli needs p in [0, 1] (got %g)",
                             d->a);
        return NDM_OK;
    }
    return NDM_E_INTERNAL;
}

static unsigned words(const draw *d, ndm_dtype t)
{
    switch (d->k) {
    case RANDINT:
        return ndm__rng_words_randint(d->lo, d->hi);
    case BERNOULLI:
        return NDM__RNG_WORDS_BERNOULLI;
    default:
        return ndm__rng_words_float(t);
    }
}

/* The random family of a device, or NULL with NDM_E_UNSUPPORTED recorded. */
static const struct ndm__backend_random *family(ndm_device dev, const char *api, ndm__site site)
{
    const ndm__backend *b = ndm__backend_of(dev, api, site);
    if (!b)
        return NULL;
    if (!b->random)
        ndm__fail(NDM_E_UNSUPPORTED, api, site, "the %s backend has no random kernels", b->name);
    return b->random;
}

/* Fill r from *rng and advance it; nothing changes on failure. */
static ndm_status run(const struct ndm__backend_random *f, ndm__array *r, ndm_rng *rng,
                      const draw *d, const char *api, ndm__site site)
{
    ndm_device dev = r->storage->device;
    if (NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_RANDOM, (int)d->k, kind_name(d->k),
                             ndm__layout_of(r), 1, {r->dtype}))
        return NDM_E_UNSUPPORTED;
    ndm__tensor t = ndm__tensor_of(r);
    /* under a byte budget a recomputation draws what the first pass drew */
    ndm_rng local;
    if (NDM__UNLIKELY(ndm__ag_tls.budget))
        rng = ndm__ag_budget_rng(rng, &local);
    ndm_status st;
    switch (d->k) {
    case UNIFORM:
        st = f->uniform(dev.index, &t, *rng, d->a, d->b);
        break;
    case NORMAL:
        st = f->normal(dev.index, &t, *rng, d->a, d->b);
        break;
    case RANDINT:
        st = f->randint(dev.index, &t, *rng, d->lo, d->hi);
        break;
    default:
        st = f->bernoulli(dev.index, &t, *rng, d->a);
        break;
    }
    if (st < 0)
        return ndm__fail(st, api, site, "%s kernel failed: %s", kind_name(d->k),
                         ndm_status_str(st));
    rng->offset += ndm_rng_blocks((uint64_t)ndm__numel(r->ndim, r->shape), words(d, r->dtype));
    return NDM_OK;
}

static bool rng_given(const ndm_rng *rng, const char *api, ndm__site site)
{
    if (rng)
        return true;
    ndm__fail(NDM_E_INVALID, api, site, "the generator is NULL");
    return false;
}

/* The family for manager m's device (m resolved by the factory rule). */
static const struct ndm__backend_random *factory_family(ndm_manager *m, const char *api,
                                                        ndm__site site)
{
    *m = ndm__factory_manager(*m, api, site);
    if (!m->id)
        return NULL;
    ndm__manager *mr = ndm__manager_get(*m, api, site);
    return mr ? family(mr->device, api, site) : NULL;
}

static ndm_array factory(ndm__site site, const char *api, ndm_manager m, ndm_rng *rng,
                         ndm_dtype dtype, const draw *d, int ndim, const int64_t *shape)
{
    if (!rng_given(rng, api, site) || check(d, dtype, api, site) < 0)
        return NDM_NULL_ARRAY;
    const struct ndm__backend_random *f = factory_family(&m, api, site);
    if (!f)
        return NDM_NULL_ARRAY;
    ndm__array *r;
    ndm_array a = ndm__array_new(site, api, m, dtype, ndim, shape, &r);
    if (a.id && run(f, r, rng, d, api, site) < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

/* An array the kernels may write: no axis of size > 1 with stride 0, where
 * several elements would share one place. */
static bool writable(const ndm__array *r, const char *api, ndm__site site)
{
    for (int d = 0; d < r->ndim; d++)
        if (r->strides[d] == 0 && r->shape[d] > 1) {
            char desc[160];
            ndm__fail(NDM_E_INVALID, api, site,
                      "%s is a broadcast view (stride 0 on axis %d); write into a copy",
                      ndm__array_desc(r, desc, sizeof desc), d);
            return false;
        }
    return true;
}

static ndm_status inplace(ndm__site site, const char *api, ndm_array a, ndm_rng *rng,
                          const draw *d)
{
    ndm__array *r = ndm__array_get_prop(a, api, site);
    if (!r)
        return ndm_last_status();
    if (!rng_given(rng, api, site) || check(d, r->dtype, api, site) < 0 ||
        !writable(r, api, site))
        return ndm_last_status();
    const struct ndm__backend_random *f = family(r->storage->device, api, site);
    return f ? run(f, r, rng, d, api, site) : ndm_last_status();
}

NDM_API ndm_array ndm_uniform_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                 double lo, double hi, int ndim, const int64_t *shape)
{
    NDM__OP_GUARD();
    draw d = {UNIFORM, lo, hi, 0, 0};
    return factory(NDM__SITE, __func__, m, rng, dtype, &d, ndim, shape);
}

NDM_API ndm_status ndm_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng, double lo,
                                          double hi)
{
    NDM__OP_GUARD();
    draw d = {UNIFORM, lo, hi, 0, 0};
    return inplace(NDM__SITE, __func__, a, rng, &d);
}

NDM_API ndm_array ndm_normal_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                double mean, double std, int ndim, const int64_t *shape)
{
    NDM__OP_GUARD();
    draw d = {NORMAL, mean, std, 0, 0};
    return factory(NDM__SITE, __func__, m, rng, dtype, &d, ndim, shape);
}

NDM_API ndm_status ndm_normal_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng, double mean,
                                         double std)
{
    NDM__OP_GUARD();
    draw d = {NORMAL, mean, std, 0, 0};
    return inplace(NDM__SITE, __func__, a, rng, &d);
}

NDM_API ndm_array ndm_randint_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                 int64_t lo, int64_t hi, int ndim, const int64_t *shape)
{
    NDM__OP_GUARD();
    draw d = {RANDINT, 0, 0, lo, hi};
    return factory(NDM__SITE, __func__, m, rng, dtype, &d, ndim, shape);
}

NDM_API ndm_status ndm_randint_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng, int64_t lo,
                                          int64_t hi)
{
    NDM__OP_GUARD();
    draw d = {RANDINT, 0, 0, lo, hi};
    return inplace(NDM__SITE, __func__, a, rng, &d);
}

NDM_API ndm_array ndm_bernoulli_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                   double p, int ndim, const int64_t *shape)
{
    NDM__OP_GUARD();
    draw d = {BERNOULLI, p, 0, 0, 0};
    return factory(NDM__SITE, __func__, m, rng, dtype, &d, ndim, shape);
}

NDM_API ndm_status ndm_bernoulli_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng, double p)
{
    NDM__OP_GUARD();
    draw d = {BERNOULLI, p, 0, 0, 0};
    return inplace(NDM__SITE, __func__, a, rng, &d);
}

NDM_API ndm_array ndm_permutation_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, int64_t n)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    if (!rng_given(rng, __func__, site))
        return NDM_NULL_ARRAY;
    if (n < 0) {
        ndm__fail(NDM_E_INVALID, __func__, site, "n must be >= 0 (got %" PRId64 ")", n);
        return NDM_NULL_ARRAY;
    }
    const struct ndm__backend_random *f = factory_family(&m, __func__, site);
    if (!f)
        return NDM_NULL_ARRAY;
    ndm__array *r;
    ndm_array a = ndm__array_new(site, __func__, m, NDM_I64, 1, &n, &r);
    if (!a.id)
        return a;
    if (NDM__DEVICE_DECLINES(r->storage->device, __func__, site, NDM__OPS_RANDOM, 0,
                             "permutation", 0, 1, {NDM_I64})) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    ndm__tensor t = ndm__tensor_of(r);
    ndm_status st = f->permutation(r->storage->device.index, &t, *rng);
    if (st < 0) {
        ndm__fail(st, __func__, site, "permutation kernel failed: %s", ndm_status_str(st));
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    rng->offset += ndm_rng_blocks((uint64_t)n, NDM__RNG_WORDS_PERMUTATION);
    return a;
}

/* ---- multinomial ------------------------------------------------------------- */

/* The refusal of a row the kernel reported (bad: position, reason). */
static void mn_refuse(const int64_t bad[2], int64_t n, int64_t samples, bool rows, const char *api,
                      ndm__site site)
{
    int64_t r = n ? bad[0] / n : 0, j = n ? bad[0] % n : 0;
    char row[48] = "probs";
    if (rows)
        snprintf(row, sizeof row, "row %" PRId64 " of probs", r);
    switch (bad[1]) {
    case NDM__MN_NEGATIVE:
        ndm__fail(NDM_E_INVALID, api, site, "entry %" PRId64 " of %s is negative", j, row);
        break;
    case NDM__MN_NONFINITE:
        ndm__fail(NDM_E_INVALID, api, site, "entry %" PRId64 " of %s is NaN or infinite", j, row);
        break;
    case NDM__MN_ZERO_SUM:
        ndm__fail(NDM_E_INVALID, api, site, "%s sums to zero: nothing to draw", row);
        break;
    case NDM__MN_OVERFLOW:
        ndm__fail(NDM_E_INVALID, api, site, "the sum of %s overflows", row);
        break;
    default:
        ndm__fail(NDM_E_INVALID, api, site,
                  "%s has fewer than %" PRId64 " nonzero entries to draw without replacement",
                  row, samples);
        break;
    }
}

NDM_API ndm_array ndm_multinomial_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array probs,
                                        int64_t num_samples, bool replacement, ndm_rng *rng)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    ndm__array *p = ndm__input(probs, &out, api, site);
    if (!p || !rng_given(rng, api, site))
        return NDM_NULL_ARRAY;
    char desc[160];
    if (p->ndim != 1 && p->ndim != 2) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "probs %s must be 1-d (categories) or 2-d (rows, categories)",
                  ndm__array_desc(p, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    if (!ndm_dtype_is_float(p->dtype)) {
        ndm__fail(NDM_E_DTYPE, api, site, "probs %s must have a float dtype",
                  ndm__array_desc(p, desc, sizeof desc));
        return NDM_NULL_ARRAY;
    }
    bool two = p->ndim == 2;
    int64_t rows = two ? p->shape[0] : 1, n = p->shape[p->ndim - 1];
    if (num_samples < 1) {
        ndm__fail(NDM_E_INVALID, api, site, "num_samples must be >= 1 (got %" PRId64 ")",
                  num_samples);
        return NDM_NULL_ARRAY;
    }
    if (!replacement && num_samples > n) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "cannot draw %" PRId64 " samples without replacement from %" PRId64
                  " categories",
                  num_samples, n);
        return NDM_NULL_ARRAY;
    }
    ndm_device dev = p->storage->device;
    const struct ndm__backend_random *f = family(dev, api, site);
    if (!f || NDM__DEVICE_DECLINES(dev, api, site, NDM__OPS_RANDOM, 0, "multinomial",
                                   ndm__layout_of(p), 2, {p->dtype, NDM_I64}))
        return NDM_NULL_ARRAY;
    int64_t shape[2] = {rows, num_samples};
    ndm__array *o;
    ndm_array res = ndm__array_new_on(site, api, out, dev, NDM_I64, p->ndim,
                                      two ? shape : shape + 1, &o);
    if (!res.id)
        return res;
    /* both seen as 2-d: a 1-d probs is one row */
    int64_t dstr[2] = {num_samples, 1}, pstr[2] = {two ? p->strides[0] : 0,
                                                  p->strides[p->ndim - 1]};
    int64_t psh[2] = {rows, n};
    ndm__tensor dst = {ndm__array_ptr(o), NDM_I64, 2, shape, dstr};
    ndm__tensor src = {ndm__array_ptr(p), p->dtype, 2, psh, pstr};
    int64_t bad[2] = {0, 0};
    ndm_status st;
    NDM__WITH_OP_CONTEXT(out, api, site,
                         st = f->multinomial(dev.index, &dst, &src, *rng, replacement, bad));
    if (st < 0 || bad[1] != NDM__MN_OK) {
        if (st < 0)
            ndm__fail(st, api, site, "multinomial kernel failed: %s", ndm_status_str(st));
        else
            mn_refuse(bad, n, num_samples, two, api, site);
        ndm__discard(res);
        return NDM_NULL_ARRAY;
    }
    rng->offset += ndm_rng_blocks((uint64_t)rows * (uint64_t)(replacement ? num_samples : n),
                                  NDM__RNG_WORDS_MULTINOMIAL);
    return res;
}
