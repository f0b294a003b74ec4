#!/usr/bin/env bash
# tests/cxx/hpp.cpp built with every C++ compiler found (g++, clang++), with
# exceptions and with -fno-exceptions, under AddressSanitizer and UBSan,
# against the library of this build tree, and run; then the C++ example
# (examples/cxx_service.cpp) the same way, its output compared with its .out.
# Skipped (77) when neither compiler is found, or in a sanitizer build (the
# library there is linked against the build compiler's sanitizer runtime,
# which a program built by the other compiler cannot share).
set -euo pipefail
build=$1 src=$2 sanitize=$3
[ "$sanitize" = none ] || { echo "sanitizer build: skipped (the plain tree runs it under ASan)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
flags=(-std=c++17 -Wall -Wextra -Wpedantic -Werror -g -fsanitize=address,undefined
       -fno-sanitize-recover=all -I"$src/include" -I"$build/include")
libs=(-L"$build/lib" -lndm -Wl,-rpath,"$build/lib")
ran=0
for cxx in g++ clang++; do
    command -v "$cxx" > /dev/null || { echo "$cxx: not installed"; continue; }
    for mode in exceptions no-exceptions; do
        extra=()
        [ "$mode" = exceptions ] || extra=(-fno-exceptions)
        exe="$tmp/hpp_${cxx}_$mode"
        "$cxx" "${flags[@]}" "${extra[@]}" "$src/tests/cxx/hpp.cpp" "${libs[@]}" -o "$exe"
        echo "$cxx $mode: $("$exe")"
    done
    exe="$tmp/example_$cxx"
    "$cxx" "${flags[@]}" "$src/examples/cxx_service.cpp" "${libs[@]}" -o "$exe"
    "$exe" > "$tmp/example.txt"
    diff -u "$src/examples/cxx_service.out" "$tmp/example.txt"
    echo "$cxx example: output as examples/cxx_service.out"
    ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "no C++ compiler: skipped"; exit 77; }
