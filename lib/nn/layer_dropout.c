/* Dropout: in training, each element zeroed with probability p and the rest
 * scaled by 1 / (1 - p), from the module's own generator (PyTorch's
 * nn.Dropout); in evaluation the input itself. */
#include <stdlib.h>

#include "module.h"

typedef struct dropout {
    double p;
    ndm_rng rng;
} dropout;

#define AT NDM__SITE_ARGS(site), NDM_OUTPUT_RULE

static ndm_array dropout_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    dropout *d = m->data;
    if (!m->training || d->p == 0)
        return ndm_alias_to_at(AT, x);
    int64_t small[16];
    int nd;
    int64_t *shape = ndm__nn_shape(x, small, &nd, api, site);
    if (!shape)
        return NDM_NULL_ARRAY;
    ndm_array keep = ndm_bernoulli_at(NDM__SITE_ARGS(site), NDM_CURRENT_SCOPE, &d->rng,
                                      ndm_array_dtype(x), 1.0 - d->p, nd, shape);
    if (shape != small)
        free(shape);
    return ndm_mul_to_at(AT, x, ndm_mul_scalar_to_at(AT, keep, 1.0 / (1.0 - d->p)));
}

static size_t dropout_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const dropout *d = m->data;
    return ndm__module_put(buf, n, len, "Dropout(%g)", d->p);
}

static const ndm__module_type dropout_type = {
    .name = "Dropout",
    .size = sizeof(dropout),
    .forward = dropout_forward,
    .describe = dropout_describe,
};

NDM_API ndm_module ndm_dropout_module_at(NDM_SITE_PARAMS, ndm_manager model, double p,
                                         uint64_t seed)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_dropout_module";
    if (!(p >= 0 && p < 1)) {
        ndm__fail(NDM_E_INVALID, api, site, "p must be in [0, 1) (got %g)", p);
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&dropout_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    *(dropout *)m->data = (dropout){.p = p, .rng = ndm_rng_new(seed)};
    return ndm__module_finish(m, model, api, site);
}
