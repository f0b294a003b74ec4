#!/bin/sh
# Host execution: a one-line C++ file that includes a .cu source by its
# absolute path, so g++ compiles it as C++ and its relative includes resolve.
set -eu
src=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
printf '#include "%s"\n' "$src" > "$2"
