#!/usr/bin/env python3
"""Writes the PyTorch references that test_checkpoint.c loads: two small
models trained briefly by PyTorch, their state_dicts saved with the
safetensors package, and what PyTorch computes with them.

    torch_mlp.safetensors      Sequential(Linear(4, 16), BatchNorm1d(16), ReLU,
                               Linear(16, 8), LayerNorm(8), ReLU, Linear(8, 3))
    torch_mlp_ref.safetensors  x (64, 4), labels (64), eval logits (64, 3),
                               accuracy (metadata); one training-mode forward
                               of x[:16] from the saved state: its output, the
                               running statistics after it, and the gradients
                               of sum(out * r) for every parameter
    torch_cnn.safetensors      Sequential(Conv2d(2, 3, 3), BatchNorm2d(3), ReLU,
                               Flatten, Linear(3 * 4 * 4, 2))
    torch_cnn_ref.safetensors  x (8, 2, 6, 6), eval output, training-mode
                               output and running statistics after it

Run with PyTorch and safetensors installed (pip install torch safetensors):
    python3 tests/data/make_torch_checkpoint.py tests/data
"""
import os
import sys

import torch
from safetensors.torch import save_file

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)


def blobs(n):
    """Three Gaussian blobs in 4-d."""
    centers = torch.tensor([[2.0, 0, 0, 1], [-2.0, 1, 0, 0], [0, -2.0, 1, -1]])
    y = torch.randint(0, 3, (n,))
    return centers[y] + 0.9 * torch.randn(n, 4), y


def train(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    for i in range(steps):
        idx = torch.randint(0, x.shape[0], (32,))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


def training_pass(model, x, prefix, ref):
    """One training-mode forward from the saved state, as ndm will run it."""
    model.train()
    for p in model.parameters():
        p.grad = None
    out = model(x)
    r = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * r).sum().backward()
    ref[prefix + "out"] = out.detach().clone()
    for name, t in model.state_dict().items():
        if "running" in name:
            ref[prefix + name] = t.clone()
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad.clone()


mlp = torch.nn.Sequential(
    torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
    torch.nn.Linear(16, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
xtr, ytr = blobs(512)
train(mlp, xtr, ytr, 60)
state = {k: v.clone().contiguous() for k, v in mlp.state_dict().items()}
save_file(state, os.path.join(out, "torch_mlp.safetensors"))
x, y = blobs(64)
mlp.eval()
with torch.no_grad():
    logits = mlp(x)
acc = (logits.argmax(1) == y).float().mean().item()
ref = {"x": x, "labels": y.to(torch.int64), "logits": logits}
training_pass(mlp, x[:16], "train.", ref)
save_file(ref, os.path.join(out, "torch_mlp_ref.safetensors"),
          metadata={"accuracy": "%.6f" % acc, "torch": torch.__version__})
print("mlp accuracy %.4f" % acc)

cnn = torch.nn.Sequential(
    torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(), torch.nn.Flatten(),
    torch.nn.Linear(3 * 4 * 4, 2))
xc = torch.randn(64, 2, 6, 6)
yc = (xc[:, 0].mean((1, 2)) > xc[:, 1].mean((1, 2))).long()
train(cnn, xc, yc, 30)
save_file({k: v.clone().contiguous() for k, v in cnn.state_dict().items()},
          os.path.join(out, "torch_cnn.safetensors"))
x = torch.randn(8, 2, 6, 6)
cnn.eval()
with torch.no_grad():
    ev = cnn(x)
ref = {"x": x, "eval": ev}
cnn.train()
with torch.no_grad():
    ref["train.out"] = cnn(x)
for name, t in cnn.state_dict().items():
    if "running" in name:
        ref["train." + name] = t.clone()
save_file(ref, os.path.join(out, "torch_cnn_ref.safetensors"), metadata={"torch": torch.__version__})
