#!/usr/bin/env bash
# The main job on a subset of Fashion-MNIST: training learns, memory stays
# flat, serving leaves no request arrays, nothing is alive at exit.
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
NDM_LEAK_REPORT=1 "$bin" train --limit 6000 --epochs 3 --out "$tmp/m.safetensors" \
    > "$tmp/train.log" 2> "$tmp/progress.log" || { cat "$tmp/train.log" "$tmp/progress.log"; exit 1; }
cat "$tmp/train.log"
# stderr is a file: plain progress lines, one per epoch, no redrawing
cat "$tmp/progress.log"
! grep -q $'\r' "$tmp/progress.log" || { echo "progress redrawn in a file"; exit 1; }
[ "$(grep -c '^epoch [123]/3: 47/47 batches, loss ' "$tmp/progress.log")" -eq 3 ] ||
    { echo "not one progress line per epoch"; exit 1; }
acc=$(sed -n 's/^final test accuracy: \([0-9.]*\)% on 1000 test examples$/\1/p' "$tmp/train.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 70) }' || { echo "accuracy $acc% is below 70%"; exit 1; }
grep -q "^memory after epoch 1 and after epoch 3: live arrays and bytes of model, trainer and data identical" \
    "$tmp/train.log" || { echo "counts changed"; exit 1; }
grep -q "ndm leak report: nothing alive" "$tmp/progress.log" || { echo "leaks at exit"; exit 1; }
# more requests than test images: they are served in turn, none dropped
NDM_LEAK_REPORT=1 "$bin" serve --model "$tmp/m.safetensors" --requests 10100 --threads 4 \
    > "$tmp/serve.log" 2>&1 || { cat "$tmp/serve.log"; exit 1; }
cat "$tmp/serve.log"
grep -q "10100 requests from 4 threads (the 10000 test images in turn)" "$tmp/serve.log"
grep -q "live request managers: 0, live request arrays: 0" "$tmp/serve.log"
grep -q " 0 errors" "$tmp/serve.log"
grep -q "ndm leak report: nothing alive" "$tmp/serve.log"
"$bin" leak-demo > "$tmp/leak.log" 2>&1 || { cat "$tmp/leak.log"; exit 1; }
grep -q "20 arrays, 80 bytes, created at fashion.c:" "$tmp/leak.log"
echo "ok"
