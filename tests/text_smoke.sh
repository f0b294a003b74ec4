#!/usr/bin/env bash
# The second main job, small: a 2-layer model trained a few seconds on part of
# the fortune files learns (held-out bits/char below the unigram baseline),
# memory stays flat, nothing is alive at exit; generation from several
# threads streams text, keeps each request's key/value cache in its request
# manager (its bytes as computed, in the dump while it runs, gone after),
# and the same seed gives the same text whatever the threads.
# Exits 77 (skipped) when the fortune files are not installed (the packages
# fortunes-min and fortunes: the first alone holds too little text).
set -euo pipefail
bin=$1
if [ ! -f /usr/share/games/fortunes/fortunes ] || [ ! -f /usr/share/games/fortunes/computers ]; then
    echo "the Debian packages fortunes and fortunes-min are not installed: skipped"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
NDM_LEAK_REPORT=1 "$bin" train --layers 2 --width 64 --heads 4 --ctx 64 --batch 16 --steps 40 \
    --epochs 3 --lr 3e-3 --limit 400000 --val-windows 64 --out "$tmp/m.safetensors" \
    > "$tmp/train.log" 2> "$tmp/progress.log" || { cat "$tmp/train.log" "$tmp/progress.log"; exit 1; }
cat "$tmp/train.log" "$tmp/progress.log"
[ "$(grep -c '^epoch [123]/3: 40/40 batches, loss .* characters/s$' "$tmp/progress.log")" -eq 3 ] ||
    fail "not one progress line per epoch"
grep -q "^memory after epoch 1 and after epoch 3: live arrays and bytes of model, trainer and data identical" \
    "$tmp/train.log" || fail "counts changed"
grep -q "ndm leak report: nothing alive" "$tmp/progress.log" || fail "leaks at exit"
# the held-out loss is below the unigram baseline: the model learnt more than
# the characters' frequencies
read -r val uni < <(sed -n 's/^final held-out loss: \([0-9.]*\) bits\/char on 64 windows of 64 characters; the unigram baseline \([0-9.]*\) bits\/char.*/\1 \2/p' "$tmp/train.log")
awk -v v="$val" -v u="$uni" 'BEGIN { exit !(v > 0 && u > 4 && v < u - 0.3) }' ||
    fail "held-out $val bits/char is not clearly below the unigram baseline $uni"

gen() { NDM_LEAK_REPORT=1 "$bin" generate --model "$tmp/m.safetensors" --tokens 30 "$@"; }
# several threads: whole lines after their request's number; --dump shows
# request 0's cache: 2 x 2 layers x (5 + 30) tokens x 64 x 4 bytes = 35840
gen --prompt "Hello" --requests 4 --threads 2 --seed 7 --dump > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; exit 1; }
cat "$tmp/a.log"
grep -q "its key/value cache: 35840 bytes = 2 x 2 layers x 35 tokens x 64 width x 4 bytes" "$tmp/a.log" ||
    fail "the dump's header does not give the cache's size"
grep -Eq "^    request-0 +cpu +arrays 1 \[new\]  bytes 35840 \[new\]" "$tmp/a.log" ||
    fail "the dump does not show request-0 holding its cache alone (35840 bytes)"
grep -q "after the requests: live request managers: 0, live request arrays: 0" "$tmp/a.log" ||
    fail "request managers left behind"
grep -q "; 0 errors" "$tmp/a.log" || fail "errors"
grep -q "ndm leak report: nothing alive" "$tmp/a.log" || fail "leaks at exit"
for r in 0 1 2 3; do
    grep -q "^\[$r\] Hello" "$tmp/a.log" || fail "request $r's text does not start with its prompt"
done
# the same seed: the same text from 2 threads and from 1 (streamed: a header
# then the characters), another seed: other text
texts() { grep '^\[' "$1" | sort -s -t']' -k1,1; }
gen --prompt "Hello" --requests 4 --threads 2 --seed 7 > "$tmp/b.log" 2>&1
cmp -s <(texts "$tmp/a.log") <(texts "$tmp/b.log") || fail "seed 7 twice gave different texts"
gen --prompt "Hello" --requests 4 --threads 1 --seed 7 > "$tmp/c.log" 2> "$tmp/c.err"
awk '/^--- request [0-9]+ ---$/ { r = $3; next } /^generated / { r = "" } r != "" { print "[" r "] " $0 }' \
    "$tmp/c.log" > "$tmp/c.lines"
cmp -s <(texts "$tmp/a.log") <(sort -s -t']' -k1,1 "$tmp/c.lines") ||
    { diff <(texts "$tmp/a.log") <(sort -s -t']' -k1,1 "$tmp/c.lines"); fail "1 thread and 2 gave different texts"; }
gen --prompt "Hello" --requests 4 --threads 2 --seed 8 > "$tmp/d.log" 2>&1
! cmp -s <(texts "$tmp/a.log") <(texts "$tmp/d.log") || fail "seeds 7 and 8 gave the same texts"
echo "ok"
