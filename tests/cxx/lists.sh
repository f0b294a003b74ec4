#!/usr/bin/env bash
# tests/cxx/lists.cpp built with every C++ compiler found (g++, clang++) against
# the library of this build tree, and run: the list macros evaluate each
# argument once under both. Skipped (77) when neither compiler is found, or in
# a sanitizer build (a plain program does not link the sanitizer runtime).
set -euo pipefail
build=$1 src=$2 sanitize=$3
[ "$sanitize" = none ] || { echo "sanitizer build: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ran=0
for cxx in g++ clang++; do
    command -v "$cxx" > /dev/null || { echo "$cxx: not installed"; continue; }
    "$cxx" -std=c++17 -Wall -Wextra -Werror -I"$src/include" -I"$build/include" \
        "$src/tests/cxx/lists.cpp" -L"$build/lib" -lndm -Wl,-rpath,"$build/lib" -o "$tmp/lists_$cxx"
    out=$("$tmp/lists_$cxx")
    echo "$cxx: $out"
    ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "no C++ compiler: skipped"; exit 77; }
