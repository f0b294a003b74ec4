/* MultiheadAttention, PyTorch's nn.MultiheadAttention (batch_first, self
 * attention): one fused projection to queries, keys and values
 * (in_proj_weight, in_proj_bias), ndm_sdpa per head, and out_proj, a
 * Linear child, so the state names are PyTorch's. */
#include "../ops/inner.h"
#include "module.h"

typedef struct mha {
    int64_t embed, heads;
    bool causal;
    ndm_array in_w, in_b;
    ndm__module *out_proj;
} mha;

static ndm_array mha_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    const mha *l = m->data;
    int nd = ndm_array_ndim(x);
    if (nd < 0)
        return NDM_NULL_ARRAY;
    if (nd != 3 || ndm_array_dim(x, 2) != l->embed) {
        ndm__fail(NDM_E_SHAPE, api, site,
                  "MultiheadAttention(%lld, %lld) takes (batch, seq, %lld), got a rank-%d input",
                  (long long)l->embed, (long long)l->heads, (long long)l->embed, nd);
        return NDM_NULL_ARRAY;
    }
    int64_t b = ndm_array_dim(x, 0), t = ndm_array_dim(x, 1), d = l->embed / l->heads;
    /* (b, t, 3E) -> (3, b, heads, t, d): q, k and v are views of one product */
    ndm_array qkv = ndm__linear(site, api, x, l->in_w, l->in_b, false);
    ndm_array split = ndm_permute_to_at(
        NDM__SITE_ARGS(site), NDM_OUTPUT_RULE,
        ndm_reshape_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, qkv, 5,
                          (int64_t[]){b, t, 3, l->heads, d}),
        5, (int[]){2, 0, 3, 1, 4});
    ndm_array q = ndm_select_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, split, 0, 0);
    ndm_array k = ndm_select_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, split, 0, 1);
    ndm_array v = ndm_select_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, split, 0, 2);
    ndm_array y = ndm_sdpa_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, q, k, v, NDM_NULL_ARRAY,
                                 l->causal, 0);
    /* (b, heads, t, d) -> (b, t, E) */
    ndm_array joined = ndm_reshape_to_at(
        NDM__SITE_ARGS(site), NDM_OUTPUT_RULE,
        ndm_contiguous_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE,
                             ndm_permute_to_at(NDM__SITE_ARGS(site), NDM_OUTPUT_RULE, y, 4,
                                               (int[]){0, 2, 1, 3})),
        3, (int64_t[]){b, t, l->embed});
    if (!joined.id)
        return NDM_NULL_ARRAY;
    return ndm__module_forward(l->out_proj, joined, api, site);
}

static size_t mha_describe(const ndm__module *m, char *buf, size_t n, size_t len)
{
    const mha *l = m->data;
    return ndm__module_put(buf, n, len, "MultiheadAttention(%lld, %lld%s%s)", (long long)l->embed,
                           (long long)l->heads, l->in_b.id ? "" : ", bias=false",
                           l->causal ? ", causal" : "");
}

static void mha_rebind(ndm__module *m, ndm_array old, ndm_array now)
{
    mha *l = m->data;
    ndm__rebind(&l->in_w, old, now);
    ndm__rebind(&l->in_b, old, now);
}

static const ndm__module_type mha_type = {
    .name = "MultiheadAttention",
    .size = sizeof(mha),
    .forward = mha_forward,
    .describe = mha_describe,
    .rebind = mha_rebind,
};

NDM_API ndm_module ndm_multihead_attention_at(NDM_SITE_PARAMS, ndm_manager model, int64_t embed,
                                              int64_t heads, bool bias, bool causal, ndm_rng *rng)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_multihead_attention";
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if (embed < 1 || heads < 1 || embed % heads != 0 || !rng) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "embed must be a positive multiple of heads >= 1, and rng given (embed %lld, "
                  "heads %lld)",
                  (long long)embed, (long long)heads);
        return (ndm_module){0};
    }
    /* out_proj first: a Linear of its own (its bias starts at zero) */
    ndm_module out = ndm_linear_at(NDM__SITE_ARGS(site), model, embed, embed, bias, rng);
    if (!out.id)
        return (ndm_module){0};
    ndm__module *m = ndm__module_new(&mha_type, model, api, site);
    if (!m)
        return (ndm_module){0};
    mha *l = m->data;
    l->embed = embed, l->heads = heads, l->causal = causal;
    l->out_proj = ndm__module_of(out, api, site);
    l->in_w = ndm__nn_param(site, model, 2, (int64_t[]){3 * embed, embed}, rng, true);
    if (!l->in_w.id || ndm_init_xavier_uniform_inplace_at(NDM__SITE_ARGS(site), l->in_w, rng) < 0 ||
        !ndm__module_add_param(m, "in_proj_weight", l->in_w))
        return ndm__module_abandon(m, api, site);
    if (bias) {
        l->in_b = ndm__nn_param(site, model, 1, (int64_t[]){3 * embed}, rng, false);
        if (!l->in_b.id || !ndm__module_add_param(m, "in_proj_bias", l->in_b))
            return ndm__module_abandon(m, api, site);
    }
    if (!l->out_proj || !ndm__module_add_child(m, "out_proj", out))
        return ndm__module_abandon(m, api, site);
    return ndm__module_finish(m, model, api, site);
}
