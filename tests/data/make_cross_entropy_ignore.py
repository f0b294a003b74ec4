"""Write cross_entropy_ignore.h: PyTorch's cross_entropy and nll_loss with
ignored labels (ignore_index -100, the default, and another), their values
and gradients, for tests/test_nn.c and tests/test_cuda.c. Run from the
repository root: python3 tests/data/make_cross_entropy_ignore.py."""
import torch
import torch.nn.functional as F

torch.manual_seed(27)
N, C = 5, 4
logits = torch.randn(N, C, dtype=torch.float32)
cases = [
    ("default", [1, -100, 3, -100, 0], -100, False),
    ("other_index", [2, 1, 2, 0, 3], 2, False),
    ("all_ignored", [-100, -100, -100, -100, -100], -100, False),
    ("nll_default", [3, 0, -100, 2, -100], -100, True),
]


def f9(v):
    """v as a C literal that reads back to the same float32 (%.9g)."""
    if v != v:
        return "NAN"
    t = "%.9g" % v
    return t if any(ch in t for ch in ".en") else t + ".0"


def wrap(items, indent):
    """items joined by ", ", six to a line."""
    rows = [", ".join(items[i:i + 6]) for i in range(0, len(items), 6)]
    return ("\n" + indent).join(r + "," for r in rows)[:-1]


out = ["/* Written by tests/data/make_cross_entropy_ignore.py (PyTorch %s): do not edit. */"
       % torch.__version__.split("+")[0],
       "#define CE_IGNORE_N %d" % N, "#define CE_IGNORE_C %d" % C,
       "static const float ce_ignore_logits[%d] = {\n    %s};"
       % (N * C, wrap([f9(v) + "f" for v in logits.flatten().tolist()], "    ")),
       "static const struct {",
       "    const char *name;",
       "    int64_t labels[%d];" % N,
       "    int64_t ignore_index;",
       "    int nll; /* nll_loss of the logits taken as log-probabilities */",
       "    double loss;",
       "    float grad[%d];" % (N * C),
       "} ce_ignore_cases[] = {"]
for name, labels, ignore, nll in cases:
    x = logits.clone().requires_grad_(True)
    y = torch.tensor(labels, dtype=torch.int64)
    loss = (F.nll_loss if nll else F.cross_entropy)(x, y, ignore_index=ignore)
    loss.backward()
    out.append('    {"%s", {%s}, %d, %d, %s,\n     {%s}},'
               % (name, ", ".join(map(str, labels)), ignore, int(nll), f9(loss.item()),
                  wrap([f9(v) + ("f" if v == v else "") for v in x.grad.flatten().tolist()],
                       "      ")))
out.append("};")
with open("tests/data/cross_entropy_ignore.h", "w") as f:
    f.write("\n".join(out) + "\n")
