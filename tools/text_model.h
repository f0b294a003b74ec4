/* ndm-text's network: a GPT-style decoder-only transformer over characters,
 * built of user modules, with an optional key/value cache for generation. */
#ifndef NDM_TOOLS_TEXT_MODEL_H
#define NDM_TOOLS_TEXT_MODEL_H

#include <stdint.h>

#include "ndm/ndm.h"

/* The sizes of a model. */
typedef struct text_config {
    int64_t vocab;  /* characters */
    int64_t ctx;    /* the most positions (the longest context) */
    int64_t width;  /* the residual stream's features */
    int64_t heads;  /* attention heads (width is a multiple of them) */
    int64_t layers; /* blocks */
} text_config;

/* The network in `model`, with its parameters drawn from rng; a null module
 * with the library's error when a constructor fails. The state is named as
 * PyTorch names the same structure:
 *
 *     class Attention(nn.Module):       # qkv = Linear(w, 3w), proj = Linear(w, w)
 *     class Block(nn.Module):           # norm1, attn, norm2 = LayerNorm(w),
 *                                       # mlp = Sequential(Linear(w, 4w), GELU(), Linear(4w, w))
 *     class GPT(nn.Module):             # tok_emb = Embedding(vocab, w),
 *                                       # pos_emb = Embedding(ctx, w),
 *                                       # blocks = ModuleList(Block() * layers),
 *                                       # norm_f = LayerNorm(w), head = Linear(w, vocab, bias=False)
 *
 * so "tok_emb.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.2.bias",
 * "norm_f.weight", "head.weight".
 *
 * Forward passes: ndm_forward(net, tokens) on i64 tokens (batch, T), T <=
 * ctx, gives the logits (batch, T, vocab), each position seeing the ones
 * before it (training, evaluation). ndm_forward_n(net, NDM_ARRAYS(tokens,
 * cache, pos)) on tokens (1, T), a cache from text_kv_cache() and pos a 0-d
 * i64 array (the position of the first token) writes the tokens' keys and
 * values into rows [pos, pos + T) of the cache, in place, and attends over
 * rows [0, pos + T): the prompt first (pos 0, any T), then one token at a
 * time. Either form returns a fresh array by the output rule. */
ndm_module text_model_new(ndm_manager model, const text_config *c, ndm_rng *rng);

/* The key/value cache of one sequence of `tokens` positions (at most ctx),
 * zeros in manager m: shape (layers, 2, heads, tokens, width / heads), so
 * exactly 2 * layers * tokens * width * sizeof(dtype) bytes. */
ndm_array text_kv_cache(ndm_manager m, const text_config *c, int64_t tokens, ndm_dtype dtype);

/* The bytes text_kv_cache() takes for `tokens` positions of `dtype`. */
uint64_t text_kv_bytes(const text_config *c, int64_t tokens, ndm_dtype dtype);

#endif
