#!/usr/bin/env bash
# bench/train --vs-pytorch without PyTorch: one note says so, ndm's figures
# come alone (no anchor), in both OpenBLAS settings, and the program exits 0.
# Exits 77 (skipped) when the dataset is not installed.
set -euo pipefail
bin=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "dataset-fashion-mnist is not installed: skipped"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
NDM_TORCH_PYTHON= "$bin" --vs-pytorch --python "$tmp/no-such-python" --json --quick \
    --mlp-steps 2 --cnn-steps 1 --loss-steps 0 --pairs 1 > "$tmp/out.json"
python3 - "$tmp/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
notes = d.pop("notes")
assert sum("no PyTorch" in n for n in notes) == 1, notes
want = ["mlp_step_ms_1t_vs_torch", "mlp_step_ms_2t_vs_torch", "mlp_2_steps_s_1t_vs_torch",
        "cnn_step_ms_1t_vs_torch", "cnn_step_ms_2t_vs_torch", "cnn_1_steps_s_2t_vs_torch",
        "cnn_speedup_1_to_2t_vs_torch", "mlp_batch1_infer_p50_us_1t_vs_torch",
        "mlp_batch1_infer_p50_us_2t_vs_torch"]
for name in want + [w + "_noenv" for w in want]:
    f = d.pop(name)
    assert f["value"] > 0 and f["anchor_value"] == 0 and f["ratio"] == 0, (name, f)
# the batch-1 latency at one thread beside the time one thread takes to
# read the model's weights, measured turn about in the same run
for name in ["mlp_batch1_infer_p50_us_1t_vs_weights_read"]:
    for n in (name, name + "_noenv"):
        f = d.pop(n)
        assert f["value"] > 0 and f["anchor_value"] > 0 and f["ratio"] > 0, (n, f)
assert not any("loss" in k for k in d), sorted(d)
print("ok:", len(want) * 2, "figures checked without an anchor, 2 beside the weights' read")
PY
