"""The network of ndm-text in PyTorch, for a file `ndm-text train` saved:
loads it with load_state_dict (strict) and continues a prompt greedily, which
`ndm-text generate --greedy` does too.

    python3 tools/text_model_torch.py text-model.safetensors "Love is" 60
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file


class Attention(nn.Module):
    def __init__(self, w, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(w, 3 * w)
        self.proj = nn.Linear(w, w)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    def __init__(self, w, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(w)
        self.attn = Attention(w, heads)
        self.norm2 = nn.LayerNorm(w)
        self.mlp = nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, w, heads, layers):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, w)
        self.pos_emb = nn.Embedding(ctx, w)
        self.blocks = nn.ModuleList(Block(w, heads) for _ in range(layers))
        self.norm_f = nn.LayerNorm(w)
        self.head = nn.Linear(w, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm_f(h))


def char_id(c):
    return 0 if c == "\n" else ord(c) - ord(" ") + 1


def id_char(i):
    return "\n" if i == 0 else chr(ord(" ") + i - 1)


def main():
    path, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    sizes = [int(meta[k]) for k in ("vocab", "ctx", "width", "heads", "layers")]
    net = GPT(*sizes)
    net.load_state_dict(load_file(path))
    net.eval()
    ids = [char_id(c) for c in prompt]
    out = ""
    with torch.no_grad():
        for _ in range(n):
            if len(ids) > sizes[1]:
                break
            nxt = int(net(torch.tensor([ids]))[0, -1].argmax())
            if out.endswith("\n") or (not out and prompt.endswith("\n")):
                if id_char(nxt) == "%":
                    break
            out += id_char(nxt)
            ids.append(nxt)
    sys.stdout.write(prompt + out + "\n")


if __name__ == "__main__":
    main()
