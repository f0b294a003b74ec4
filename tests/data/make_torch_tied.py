#!/usr/bin/env python3
"""Writes the PyTorch reference that tests/test_tie.c loads: a small
language model whose head is tied to its token embedding, as GPT-style
models tie them (head.weight = tok_emb.weight), and what PyTorch computes
with it.

    torch_tied.safetensors      the model saved by safetensors' save_model,
                                which writes one name of a tied pair
    torch_tied_ref.safetensors  tokens (5), targets (5, one of them -100,
                                ignored), logits (5, 6), the cross-entropy
                                loss (a 0-d tensor) and the gradient of the
                                shared weight, then the weight after one
                                SGD step (lr 0.5)

Run with PyTorch and safetensors installed (pip install torch safetensors):
    python3 tests/data/make_torch_tied.py tests/data
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file, save_model

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(6, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.tok_emb.weight
        self.register_buffer("scale", torch.ones(6))

    def forward(self, idx):
        return self.head(self.tok_emb(idx))


model = LM()
assert list(model.state_dict()) == ["scale", "tok_emb.weight", "head.weight"]
assert len(list(model.parameters())) == 1
save_model(model, os.path.join(out, "torch_tied.safetensors"))

tokens = torch.tensor([3, 0, 5, 3, 1])
targets = torch.tensor([0, 5, -100, 1, 3])
logits = model(tokens)
loss = F.cross_entropy(logits, targets)
loss.backward()
grad = model.tok_emb.weight.grad.clone()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
opt.step()
save_file({"tokens": tokens, "targets": targets, "logits": logits.detach().contiguous(),
           "loss": loss.detach().reshape(()), "grad": grad,
           "stepped": model.tok_emb.weight.detach().clone()},
          os.path.join(out, "torch_tied_ref.safetensors"))
