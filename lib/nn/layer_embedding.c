/* Embedding: rows of a (num, dim) table picked by integer indices, as
 * PyTorch's nn.Embedding (the table drawn from N(0, 1)). */
#include "module.h"

typedef struct embedding {
    int64_t num, dim;
    ndm_array weight;
} embedding;

static ndm_array embedding_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    (void)api;
    const embedding *e = m->data;
    return ndm_take_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, e->weight, 0, x);
}

static size_t embedding_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const embedding *e = m->data;
    return ndm__module_put(buf, n, len, "Embedding(%lld, %lld)", (long long)e->num,
                           (long long)e->dim);
}

static void embedding_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    embedding *l = m->data;
    ndm__rebind(&l->weight, old, now);
}

static const ndm__module_type embedding_type = {
    .name = "Embedding",
    .size = sizeof(embedding),
    .forward = embedding_forward,
    .describe = embedding_describe,
    .rebind = embedding_rebind,
};

NDM_API ndm_module ndm_embedding_at(NDM_SITE_PARAMS, ndm_manager model, int64_t num, int64_t dim,
                                    ndm_rng *rng)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_embedding";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if (num < 1 || dim < 1 || !rng) {
        ndm__fail(NDM_E_INVALID, api, site, "sizes must be >= 1 and rng given");
        return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(&embedding_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    embedding *e = m->data;
    *e = (embedding){.num = num, .dim = dim};
    e->weight = ndm_empty_at(NDM__SITE_ARGS(site), model, NDM_F32, 2, (int64_t[]){num, dim});
    if (!e->weight.id || ndm_normal_inplace_at(NDM__SITE_ARGS(site), e->weight, rng, 0, 1) < 0 ||
        (ndm__nn_grads_wanted() && ndm_requires_grad_at(NDM__SITE_ARGS(site), e->weight) < 0) ||
        !ndm__module_add_param(m, "weight", e->weight))
        return ndm__module_abandon(m, api, site);
    return ndm__module_finish(m, model, api, site);
}
