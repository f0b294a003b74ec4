#!/usr/bin/env bash
# ndm-text's command line: help on stdout with every option and its default,
# errors that name the option, the value and the accepted range (exit 2),
# checks made before any work, --version, --device, and the prompts a model
# cannot take: empty, not UTF-8, outside the vocabulary, longer than the
# context (exit 2, a message on stderr, nothing on stdout).
set -uo pipefail
bin=$1
version=$2
source "$(dirname "$0")/cli_expect.sh"

for args in "--help" "-h" "help"; do
    expect 0 "usage: ndm-text COMMAND" "" -- $args
done
"$bin" --help > "$tmp/help"
for opt in --epochs --steps --batch --lr --seed --limit --val-windows --layers --width --heads \
           --ctx --data --out --no-save --quiet --device --model --prompt --requests --threads \
           --tokens --temperature --greedy --top-k --dump; do
    grep -q -- "  $opt" "$tmp/help" || fail "--help does not list $opt"
done
for opt in --epochs --steps --batch --lr --seed --limit --layers --width --heads --ctx --data \
           --out --device --model --prompt --requests --threads --tokens --temperature --top-k; do
    grep -A1 -- "  $opt " "$tmp/help" | grep -q "default: " || fail "--help gives no default for $opt"
done
for c in train generate; do
    "$bin" help "$c" > "$tmp/h1"
    for args in "--help" "-h" "help"; do
        expect 0 "usage: ndm-text $c" "" -- "$c" $args
        cmp -s "$tmp/h1" "$tmp/out" || fail "ndm-text $c $args differs from ndm-text help $c"
    done
done
expect 0 "ndm-text $version (libndm $version)" "" -- --version

expect 2 "" "--epochs 'abc' is not a whole number; it takes a whole number from 1 to 1000" -- train --epochs abc
expect 2 "" "--lr '-1' is out of range; it takes a number above 0 and at most 10" -- train --lr -1
expect 2 "" "--width '4' is out of range; it takes a whole number from 8 to 4096" -- train --width 4
expect 2 "" "--width 100 is not a multiple of --heads 8" -- train --width 100 --heads 8 --no-save
expect 2 "" "--temperature '0' is out of range; it takes a number above 0 and at most 100" -- generate --temperature 0
expect 2 "" "--top-k '97' is out of range; it takes a whole number from 1 to 96" -- generate --top-k 97
expect 2 "" "--threads '0' is out of range" -- generate --threads 0
expect 2 "" "--prompt needs a value (TEXT)" -- generate --prompt
expect 2 "" "unknown option '--frob'" -- generate --frob
expect 2 "" "unknown command 'serve'" -- serve
expect 2 "" "which command?" --

# checked before training: the output folder, the corpus
expect 1 "" "cannot save the model to /nonexistent/dir/m.safetensors: the folder /nonexistent/dir does not exist" \
    -- train --out /nonexistent/dir/m.safetensors
mkdir "$tmp/empty"
expect 1 "" "no fortune files in $tmp/empty; install the Debian package fortunes" -- train --data "$tmp/empty" --no-save
expect 1 "" "no model at $tmp/none.safetensors (run \`ndm-text train --out $tmp/none.safetensors\` first" \
    -- generate --model "$tmp/none.safetensors"
: > "$tmp/bad.safetensors"
expect 1 "" "$tmp/bad.safetensors is not a model that \`ndm-text train\` saved" -- generate --model "$tmp/bad.safetensors"

# --device: the name first (exit 2), then a CUDA device this machine or
# build lacks (exit 1), before the corpus or the model is read
expect 2 "" "--device 'gpu' is not a device; it takes cpu, cuda or cuda:N" -- train --device gpu
pre=(env -u NDM_BACKEND_PATH CUDA_VISIBLE_DEVICES=)
expect 1 "" "ndm-text train: cannot use --device cuda:0: " -- train --data "$tmp/empty" --no-save --device cuda
grep -qF "fortune files" "$tmp/err" && fail "train --device cuda read the corpus before the device check"
pre=()

# the prompts: empty and non-UTF-8 ones are refused before the model is read
expect 2 "" "the prompt is empty; give at least one character" -- generate --prompt "" --model "$tmp/none.safetensors"
expect 2 "" "the prompt is not UTF-8: byte 0xff at offset 3 begins no valid character" \
    -- generate --prompt "$(printf 'abc\377def')" --model "$tmp/none.safetensors"
expect 2 "" "the prompt is not UTF-8: byte 0xc3 at offset 1" -- generate --prompt "$(printf 'a\303')" --model "$tmp/none.safetensors"
expect 2 "" "the prompt is not UTF-8: byte 0xc0 at offset 0" -- generate --prompt "$(printf '\300\257')" --model "$tmp/none.safetensors"
expect 2 "" "the prompt's character at offset 2 (byte 0xc3) is not in the model's vocabulary" \
    -- generate --prompt "$(printf 'ca\303\251')" --model "$tmp/none.safetensors"
# longer than the context of the model: a tiny model of context 16, trained one step
if [ -f /usr/share/games/fortunes/fortunes ]; then
    "$bin" train --layers 1 --width 16 --heads 2 --ctx 16 --batch 2 --steps 1 --epochs 1 \
        --limit 20000 --val-windows 2 --quiet --out "$tmp/tiny.safetensors" > "$tmp/train.log" 2>&1 ||
        fail "the tiny model did not train: $(cat "$tmp/train.log")"
    expect 2 "" "the prompt has 17 characters, more than the model's context of 16; give at most 16" \
        -- generate --model "$tmp/tiny.safetensors" --prompt "01234567890123456"
    expect 0 "generated " "" -- generate --model "$tmp/tiny.safetensors" --prompt "0123456789012345" --requests 1 --quiet
    grep -qF "generated 1 character in" "$tmp/out" || fail "a prompt of the whole context does not get its one character: $(cat "$tmp/out")"
fi

finish
