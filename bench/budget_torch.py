"""PyTorch's anchor for bench/budget: the same transformer (ndm-text's
network at bench/budget's size: 4 pre-norm blocks, width 128, 4 heads,
16 x 64 tokens, vocabulary 96) trained one step at a time on the CPU, with
torch.utils.checkpoint placed by hand on every block against the plain step,
interleaved; medians of the pairs' ratios. Peak bytes are not measured (the
CPU allocator keeps no statistics): bench/budget's figures give ndm's.

usage: python budget_torch.py [--quick] [--json]
"""
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VOCAB, CTX, WIDTH, HEADS, LAYERS, ROWS = 96, 64, 128, 4, 4, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, w // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CTX, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, ckpt):
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for blk in self.blocks:
            h = checkpoint(blk, h, use_reentrant=False) if ckpt else blk(h)
        return self.head(self.norm(h))


def step(model, tokens, targets, ckpt):
    t0 = time.perf_counter()
    logits = model(tokens, ckpt)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets)
    loss.backward()
    model.zero_grad(set_to_none=False)
    return time.perf_counter() - t0, loss.item()


def main():
    quick = "--quick" in sys.argv
    torch.manual_seed(1)
    model = GPT()
    n = ROWS * CTX
    tokens = torch.tensor([(i * 37 + 11) % VOCAB for i in range(n)]).view(ROWS, CTX)
    targets = torch.tensor([(i * 53 + 5) % VOCAB for i in range(n)])
    for _ in range(2):
        step(model, tokens, targets, False)
        step(model, tokens, targets, True)
    ratios, ck, plain = [], [], []
    for _ in range(3 if quick else 9):
        tc, lc = step(model, tokens, targets, True)
        tp, lp = step(model, tokens, targets, False)
        ck.append(tc)
        plain.append(tp)
        ratios.append(tc / tp)
    out = {
        "torch_gpt_step_s_checkpoint_every_block_vs_plain": {
            "value": statistics.median(ck), "unit": "s",
            "anchor": "torch plain step, interleaved", "anchor_value": statistics.median(plain),
            "ratio": statistics.median(ratios), "ratio_lo": min(ratios), "ratio_hi": max(ratios)},
        "notes": [f"torch {torch.__version__}, {torch.get_num_threads()} threads"],
    }
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
    else:
        f = out["torch_gpt_step_s_checkpoint_every_block_vs_plain"]
        print(f"# {out['notes'][0]}")
        print(f"torch checkpoint on every block: {f['value']:.4g} s, plain {f['anchor_value']:.4g} s, "
              f"ratio {f['ratio']:.3f} ({f['ratio_lo']:.3f}-{f['ratio_hi']:.3f})")


if __name__ == "__main__":
    main()
