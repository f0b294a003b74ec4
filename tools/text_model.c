/* ndm-text's network: token and position embeddings, pre-norm blocks of
 * causal self-attention and a GELU MLP, a final norm and a linear head. */
#include "text_model.h"

#include <stdlib.h>

/* What each module keeps beside its registered state: its sizes and its
 * children, so that a forward pass looks nothing up by name. */
typedef struct attn_data {
    int64_t width, heads;
    ndm_module qkv, proj;
} attn_data;

typedef struct block_data {
    ndm_module norm1, attn, norm2, mlp;
} block_data;

typedef struct gpt_data {
    text_config c;
    ndm_module tok_emb, pos_emb, blocks, norm_f, head;
    ndm_module block[64];
} gpt_data;

/* The position of the first token: 0 without a cache. */
static int64_t first_position(int n, const ndm_array *in)
{
    int64_t p = 0;
    if (n > 2 && in[2].id && ndm_item_i64(in[2], &p) != NDM_OK)
        return -1;
    return p;
}

/* x (B, T, w) -> (B, T, w). With a cache (2, heads, S, w / heads) the new
 * keys and values go into rows [p, p + T) and the queries attend over
 * [0, p + T); the prompt (p 0) is causal as in training, a single token
 * sees every row before it and its own. */
static const int to_heads[5] = {2, 0, 3, 1, 4}, from_heads[4] = {0, 2, 1, 3};

static ndm_array attn_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self;
    const attn_data *a = ud;
    ndm_array x = in[0], kv = n > 1 ? in[1] : NDM_NULL_ARRAY;
    int64_t b = ndm_array_dim(x, 0), t = ndm_array_dim(x, 1), hd = a->width / a->heads;
    /* (B, T, 3w) -> (3, B, heads, T, hd): q, k and v are views of one product */
    ndm_array split = ndm_permute(ndm_reshape(ndm_forward(a->qkv, x), NDM_SHAPE(b, t, 3, a->heads, hd)),
                                  5, to_heads);
    ndm_array q = ndm_select(split, 0, 0), k = ndm_select(split, 0, 1), v = ndm_select(split, 0, 2);
    bool causal = true;
    if (kv.id) {
        int64_t p = first_position(n, in);
        if (p < 0 || b != 1 || (p > 0 && t != 1))
            return NDM_NULL_ARRAY;
        ndm_array kc = ndm_select(kv, 0, 0), vc = ndm_select(kv, 0, 1);
        if (ndm_copy_into(ndm_slice(kc, 1, p, p + t, 1), ndm_select(k, 0, 0)) != NDM_OK ||
            ndm_copy_into(ndm_slice(vc, 1, p, p + t, 1), ndm_select(v, 0, 0)) != NDM_OK)
            return NDM_NULL_ARRAY;
        k = ndm_unsqueeze(ndm_slice(kc, 1, 0, p + t, 1), 0);
        v = ndm_unsqueeze(ndm_slice(vc, 1, 0, p + t, 1), 0);
        causal = t > 1;
    }
    ndm_array y = ndm_sdpa(q, k, v, NDM_NULL_ARRAY, causal, 0);
    /* (B, heads, T, hd) -> (B, T, w) */
    ndm_array joined = ndm_reshape(ndm_contiguous(ndm_permute(y, 4, from_heads)),
                                   NDM_SHAPE(b, t, a->width));
    return ndm_forward(a->proj, joined);
}

/* x + attn(norm1(x)), then + mlp(norm2(x)); the cache and position pass on
 * to the attention. */
static ndm_array block_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self;
    const block_data *d = ud;
    ndm_array x = in[0];
    ndm_array h = ndm_forward(d->norm1, x);
    ndm_array att = n > 1 ? ndm_forward_n(d->attn, NDM_ARRAYS(h, in[1], n > 2 ? in[2] : NDM_NULL_ARRAY))
                          : ndm_forward(d->attn, h);
    x = ndm_add(x, att);
    return ndm_add(x, ndm_forward(d->mlp, ndm_forward(d->norm2, x)));
}

/* tokens (B, T) -> logits (B, T, vocab); with a cache, one block's slice
 * of it to each block. */
static ndm_array gpt_forward(ndm_module self, int n, const ndm_array *in, void *ud)
{
    (void)self;
    const gpt_data *g = ud;
    ndm_array tokens = in[0], cache = n > 1 ? in[1] : NDM_NULL_ARRAY;
    ndm_array first = n > 2 ? in[2] : NDM_NULL_ARRAY;
    int64_t t = ndm_array_dim(tokens, 1), p = first_position(n, in);
    /* a handle closed under the pass (its model's close): a call on it says
     * so, where reading its size only returned the status */
    if (t < 0)
        return ndm_alias(tokens);
    if (t < 1 || p < 0 || p + t > g->c.ctx)
        return NDM_NULL_ARRAY;
    ndm_array pos = ndm_arange(NDM_CURRENT_SCOPE, NDM_I64, (double)p, (double)(p + t), 1);
    ndm_array h = ndm_add(ndm_forward(g->tok_emb, tokens), ndm_forward(g->pos_emb, pos));
    for (int64_t l = 0; l < g->c.layers; l++)
        h = cache.id ? ndm_forward_n(g->block[l], NDM_ARRAYS(h, ndm_select(cache, 0, l), first))
                     : ndm_forward(g->block[l], h);
    return ndm_forward(g->head, ndm_forward(g->norm_f, h));
}

static const ndm_module_type attn_type = {.name = "Attention", .forward = attn_forward,
                                          .destroy = free};
static const ndm_module_type block_type = {.name = "Block", .forward = block_forward,
                                           .destroy = free};
static const ndm_module_type gpt_type = {.name = "GPT", .forward = gpt_forward, .destroy = free};

/* A module of `type` with its children registered under their names; NULL
 * on the first failure (its error kept). */
static ndm_module with_children(ndm_manager model, const ndm_module_type *type, void *ud, int n,
                                const char *const *names, const ndm_module *kids)
{
    ndm_module m = ndm_module_new(model, type, ud);
    for (int i = 0; i < n && m.id; i++)
        if (ndm_module_register_child(m, names[i], kids[i]) != NDM_OK)
            m = (ndm_module){0};
    return m;
}

static ndm_module attention(ndm_manager model, const text_config *c, ndm_rng *rng)
{
    attn_data *a = calloc(1, sizeof *a);
    if (!a)
        return (ndm_module){0};
    *a = (attn_data){c->width, c->heads, ndm_linear(model, c->width, 3 * c->width, true, rng),
                     ndm_linear(model, c->width, c->width, true, rng)};
    ndm_module kids[2] = {a->qkv, a->proj};
    return with_children(model, &attn_type, a, 2, (const char *[]){"qkv", "proj"}, kids);
}

static ndm_module block(ndm_manager model, const text_config *c, ndm_rng *rng)
{
    block_data *d = calloc(1, sizeof *d);
    if (!d)
        return (ndm_module){0};
    d->norm1 = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(c->width));
    d->attn = attention(model, c, rng);
    d->norm2 = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(c->width));
    d->mlp = ndm_sequential(model, NDM_MODULES(ndm_linear(model, c->width, 4 * c->width, true, rng),
                                               ndm_gelu_module(model),
                                               ndm_linear(model, 4 * c->width, c->width, true, rng)));
    ndm_module kids[4] = {d->norm1, d->attn, d->norm2, d->mlp};
    return with_children(model, &block_type, d, 4,
                         (const char *[]){"norm1", "attn", "norm2", "mlp"}, kids);
}

ndm_module text_model_new(ndm_manager model, const text_config *c, ndm_rng *rng)
{
    if (c->layers < 1 || c->layers > 64 || c->width % c->heads)
        return (ndm_module){0};
    gpt_data *g = calloc(1, sizeof *g);
    if (!g)
        return (ndm_module){0};
    g->c = *c;
    g->tok_emb = ndm_embedding(model, c->vocab, c->width, rng);
    g->pos_emb = ndm_embedding(model, c->ctx, c->width, rng);
    /* GPT-2's initial scale for the embeddings (N(0, 0.02), not N(0, 1)) */
    ndm_array te = ndm_module_get_array(g->tok_emb, "weight");
    ndm_array pe = ndm_module_get_array(g->pos_emb, "weight");
    if (!te.id || !pe.id || ndm_normal_(te, rng, 0.0, 0.02) != NDM_OK ||
        ndm_normal_(pe, rng, 0.0, 0.02) != NDM_OK) {
        free(g);
        return (ndm_module){0};
    }
    for (int64_t l = 0; l < c->layers; l++)
        g->block[l] = block(model, c, rng);
    g->blocks = ndm_module_list(model, (int)c->layers, g->block);
    g->norm_f = ndm_layer_norm(model, 1e-5, true, NDM_SHAPE(c->width));
    g->head = ndm_linear(model, c->width, c->vocab, false, rng);
    ndm_module kids[5] = {g->tok_emb, g->pos_emb, g->blocks, g->norm_f, g->head};
    return with_children(model, &gpt_type, g, 5,
                         (const char *[]){"tok_emb", "pos_emb", "blocks", "norm_f", "head"}, kids);
}

uint64_t text_kv_bytes(const text_config *c, int64_t tokens, ndm_dtype dtype)
{
    return 2 * (uint64_t)c->layers * (uint64_t)tokens * (uint64_t)c->width * ndm_dtype_size(dtype);
}

ndm_array text_kv_cache(ndm_manager m, const text_config *c, int64_t tokens, ndm_dtype dtype)
{
    return ndm_zeros(m, dtype, NDM_SHAPE(c->layers, 2, c->heads, tokens, c->width / c->heads));
}
