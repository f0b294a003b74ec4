#!/usr/bin/env python3
"""Writes the PyTorch references that test_torch_transformer.c loads: a tiny
decoder-only transformer, its state_dict saved with the safetensors package,
what PyTorch computes with it, and a short AdamW training run.

The model (vocabulary 17, width 16, 2 heads, context 8, MLP width 32):

    tok_emb   Embedding(17, 16)          pos_emb  Embedding(8, 16)
    blocks    ModuleList of 2 Block:      x = x + attn(norm1(x))   (causal)
                                          x = x + mlp(norm2(x))
              norm1, norm2  LayerNorm(16)
              attn          MultiheadAttention(16, 2, batch_first=True),
                            attn_mask the causal -inf triangle, no dropout
              mlp           Sequential(Linear(16, 32), GELU(), Linear(32, 16))
    norm      RMSNorm(16, eps=1e-6)      head     Linear(16, 17, bias=False)

    torch_transformer.safetensors      the state_dict after 40 AdamW steps on
                                       the task below (float32)
    torch_transformer_bf16.safetensors the same state_dict in bfloat16
    torch_transformer_ref.safetensors  x (4, 8) int64 tokens and the eval
                                       logits (4, 8, 17) of the saved state,
                                       logits_bf16 those of the float32 model
                                       holding the bfloat16 file's values;
                                       a training trace from a fresh seeded
                                       initialisation: init.<name> (the
                                       initial state_dict), batch.<i>.x and
                                       batch.<i>.y (4, 8) int64 for i in
                                       0..19, losses (20) float64 (the mean
                                       cross-entropy over the 32 positions of
                                       batch i, before step i), final.<name>
                                       (the state after the 20 steps);
                                       rms.x (3, 16) of magnitude 1e-4 and
                                       rms.y, RMSNorm(16) (its default eps)
                                       of it;
                                       AdamW's settings in the metadata

Block is what PyTorch's TransformerEncoderLayer(norm_first=True,
activation="gelu", dropout=0) computes; the script checks that the same
weights under that layer's names give the same logits.

The task: each sequence counts up from a random start by a random stride
(mod 17), so the next token follows from the two before it.

Deterministic: seeded, float32, one thread. Run with PyTorch and safetensors
installed (pip install torch safetensors):
    python3 tests/data/make_torch_transformer.py tests/data
"""
import os
import sys

import torch
from safetensors.torch import save_file

VOCAB, WIDTH, HEADS, CONTEXT, HIDDEN, BATCH = 17, 16, 2, 8, 32, 4
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
STEPS = 20

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)
torch.use_deterministic_algorithms(True)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, dropout=0.0, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(),
                                       torch.nn.Linear(HIDDEN, WIDTH))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.pos_emb = torch.nn.Embedding(CONTEXT, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.RMSNorm(WIDTH, eps=1e-6)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def batch(gen):
    """(BATCH, CONTEXT) inputs and their next tokens."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def loss_of(model, x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def state_of(model, prefix=""):
    return {prefix + k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                             weight_decay=WEIGHT_DECAY, foreach=False, fused=False)


# the checkpoint: a seeded model trained a little
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
model = Model()
opt = adamw(model)
model.train()
for _ in range(40):
    x, y = batch(gen)
    loss = loss_of(model, x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
save_file(state_of(model), os.path.join(out, "torch_transformer.safetensors"),
          metadata={"torch": torch.__version__})
# the same state as a half-precision checkpoint, as users often keep one
half = {k: v.to(torch.bfloat16) for k, v in state_of(model).items()}
save_file(half, os.path.join(out, "torch_transformer_bf16.safetensors"),
          metadata={"torch": torch.__version__})
rounded = Model()
rounded.load_state_dict({k: v.float() for k, v in half.items()})
rounded.eval()

ref = {}
x, _ = batch(gen)
model.eval()
with torch.no_grad():
    ref["x"] = x
    ref["logits"] = model(x)
    ref["logits_bf16"] = rounded(x)


def stock_name(name):
    """The name in a model built of PyTorch's own TransformerEncoderLayer."""
    for mine, theirs in (("blocks.", "encoder.layers."), (".attn.", ".self_attn."),
                         (".mlp.0.", ".linear1."), (".mlp.2.", ".linear2.")):
        name = name.replace(mine, theirs)
    return name


# Block is PyTorch's TransformerEncoderLayer(norm_first=True, activation="gelu"):
# the same weights under the stock names give the same logits (the test maps
# those names back)
stock = Model()
stock.encoder = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(WIDTH, HEADS, HIDDEN, dropout=0.0, activation="gelu",
                                     batch_first=True, norm_first=True),
    2, enable_nested_tensor=False)
del stock.blocks
stock.forward = lambda t: stock.head(stock.norm(stock.encoder(
    stock.tok_emb(t) + stock.pos_emb(torch.arange(t.shape[1])),
    mask=torch.nn.Transformer.generate_square_subsequent_mask(t.shape[1]), is_causal=True)))
stock.load_state_dict({stock_name(k): v for k, v in model.state_dict().items()})
stock.eval()
with torch.no_grad():
    assert torch.allclose(stock(x), ref["logits"], rtol=1e-5, atol=1e-6)

# the trace: a fresh seeded model, 20 AdamW steps on given batches
torch.manual_seed(2)
model = Model()
ref.update(state_of(model, "init."))
opt = adamw(model)
model.train()
losses = []
for i in range(STEPS):
    x, y = batch(gen)
    ref["batch.%d.x" % i], ref["batch.%d.y" % i] = x, y
    loss = loss_of(model, x, y)
    losses.append(loss.item())
    opt.zero_grad()
    loss.backward()
    opt.step()
ref["losses"] = torch.tensor(losses, dtype=torch.float64)
# RMSNorm's default eps (None) is the dtype's machine epsilon, which shows on
# inputs of small magnitude
torch.manual_seed(3)
small = 1e-4 * torch.randn(3, WIDTH)
with torch.no_grad():
    ref["rms.x"], ref["rms.y"] = small, torch.nn.RMSNorm(WIDTH)(small)
ref.update(state_of(model, "final."))
save_file(ref, os.path.join(out, "torch_transformer_ref.safetensors"),
          metadata={"torch": torch.__version__, "optimizer": "adamw", "lr": repr(LR),
                    "betas": "%r,%r" % BETAS, "eps": repr(EPS),
                    "weight_decay": repr(WEIGHT_DECAY)})
print("losses", " ".join("%.4f" % v for v in losses))
