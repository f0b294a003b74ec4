#!/usr/bin/env bash
# ndm-fashion's command line: help on stdout with every option and its
# default, errors that name the option, the value and the accepted range
# (exit 2), checks made before any training, --version, and --device: a
# bad name (exit 2), a CUDA device on a machine or build without one (exit 1,
# with the reason, before the data is read).
set -uo pipefail
bin=$1
version=$2
source "$(dirname "$0")/cli_expect.sh"

# help: stdout, exit 0, every option with its default
for args in "--help" "-h" "help"; do
    expect 0 "usage: ndm-fashion COMMAND" "" -- $args
done
"$bin" --help > "$tmp/help"
for opt in --cnn --epochs --batch --lr --seed --limit --data --out --no-save --quiet \
           --model --requests --threads --device; do
    grep -q -- "  $opt" "$tmp/help" || fail "--help does not list $opt"
done
for opt in --epochs --batch --lr --seed --limit --data --out --model --requests --threads \
           --device; do
    # the line after the option's carries its default
    grep -A1 -- "  $opt " "$tmp/help" | grep -q "default: " || fail "--help gives no default for $opt"
done
for c in train serve leak-demo; do
    "$bin" help "$c" > "$tmp/h1"
    for args in "--help" "-h" "help"; do
        expect 0 "usage: ndm-fashion $c" "" -- "$c" $args
        cmp -s "$tmp/h1" "$tmp/out" || fail "ndm-fashion $c $args differs from ndm-fashion help $c"
    done
done
expect 0 "ndm-fashion $version (libndm $version)" "" -- --version

# bad values: the option, the value and what it accepts; exit 2
expect 2 "" "--epochs 'abc' is not a whole number; it takes a whole number from 1 to 1000" -- train --epochs abc
expect 2 "" "--epochs '2x' is not a whole number" -- train --epochs 2x
expect 2 "" "--epochs ' 2' is not a whole number" -- train --epochs " 2"
expect 2 "" "--lr '-1' is out of range; it takes a number above 0 and at most 10" -- train --lr -1
expect 2 "" "--lr 'nan' is not a number" -- train --lr nan
expect 2 "" "--batch '0' is out of range; it takes a whole number from 1 to 60000" -- train --batch 0
expect 2 "" "--seed 'abc' is not a whole number" -- train --seed abc
expect 2 "" "--limit '-5' is out of range; it takes a whole number from 0 to 60000" -- train --limit -5
expect 2 "" "--threads '1000' is out of range; it takes a whole number from 1 to 256" -- serve --threads 1000
expect 2 "" "--requests '99999999999999999999' is not a whole number" -- serve --requests 99999999999999999999
expect 2 "" "--epochs needs a value: a whole number from 1 to 1000" -- train --epochs
expect 2 "" "unknown option '--frob'" -- train --frob
expect 2 "" "--cnn takes no value" -- train --cnn=1
expect 2 "" "unknown option '--epochs'" -- leak-demo --epochs 3
expect 2 "" "unknown command 'trian'" -- trian
expect 2 "" "which command?" --
expect 2 "" "--epochs '0' is out of range" -- train --epochs=0

# checked before training: the output folder, the data
# (the data files only need to exist for the output check to come next)
mkdir "$tmp/data"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
    : > "$tmp/data/$f"
done
expect 1 "" "cannot save the model to /nonexistent/dir/m.safetensors: the folder /nonexistent/dir does not exist" \
    -- train --out /nonexistent/dir/m.safetensors --data "$tmp/data"
expect 1 "ndm-fashion train: MLP" "ndm-fashion: loading the dataset failed: ndm_idx_load: " -- train --data "$tmp/data" --no-save
# what is not a regular file: refused before training, never replaced, and
# a FIFO among the data files does not block the load
mkfifo "$tmp/out.fifo"
expect 1 "" "cannot save the model to $tmp/out.fifo: $tmp/out.fifo exists and is not a regular file" \
    -- train --out "$tmp/out.fifo" --data "$tmp/data"
[ -p "$tmp/out.fifo" ] || fail "train --out FIFO: the FIFO was replaced"
mkdir "$tmp/fifodata"
for f in train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    : > "$tmp/fifodata/$f"
done
mkfifo "$tmp/fifodata/train-images-idx3-ubyte.gz"
expect 1 "ndm-fashion train: MLP" "train-images-idx3-ubyte.gz' is a FIFO, not a regular file" \
    -- train --data "$tmp/fifodata" --no-save
expect 1 "" "the training images are not at $tmp/train-images-idx3-ubyte.gz" -- train --data "$tmp" --no-save
expect 1 "" "the test images are not at /nonexistent/t10k-images-idx3-ubyte.gz" -- serve --data /nonexistent

# --device: the name is checked first (exit 2); a CUDA device that this
# machine or build lacks is refused with the registry's reason before the
# data files are read (they are empty here). CUDA_VISIBLE_DEVICES hides any
# GPU, and the host stand-in of the tests is not on the module path.
expect 2 "" "--device 'gpu' is not a device; it takes cpu, cuda or cuda:N" -- train --device gpu
expect 2 "" "--device 'cuda:x' is not a device" -- serve --device cuda:x
expect 2 "" "--device 'cuda:' is not a device" -- train --device=cuda:
pre=(env -u NDM_BACKEND_PATH CUDA_VISIBLE_DEVICES=)
expect 1 "" "ndm-fashion train: cannot use --device cuda:0: " -- train --data "$tmp/data" --no-save --device cuda
grep -qF "0 CUDA devices usable here; run with --device cpu" "$tmp/err" ||
    fail "train --device cuda without a GPU does not say what to do: $(cat "$tmp/err")"
grep -qF "loading the dataset" "$tmp/err" && fail "train --device cuda read the data before the device check"
expect 1 "" "ndm-fashion train: cannot use --device cuda:3: " -- train --data "$tmp/data" --no-save --device cuda:3
: > "$tmp/model.safetensors"
expect 1 "" "ndm-fashion serve: cannot use --device cuda:0: " -- serve --data "$tmp/data" --model "$tmp/model.safetensors" --device cuda
pre=()
expect 1 "device cpu" "loading the dataset failed" -- train --data "$tmp/data" --no-save --device cpu

finish
