#!/usr/bin/env bash
# Install ndm into a scratch folder and build a CMake project against it
# with find_package(ndm): the CMake package a user's project relies on.
# Skipped (77) without cmake, or in a sanitizer build (its library needs
# the sanitizer runtime, which a plain consumer does not link).
set -euo pipefail
build=$1 src=$2 version=$3 sanitize=$4 cuda=${5:-nocuda}
command -v cmake > /dev/null || { echo "cmake is not installed: skipped"; exit 77; }
[ "$sanitize" = none ] || { echo "sanitizer build: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet > "$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; exit 1; }
prefix=$(meson introspect "$build" --buildoptions |
         python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
root=$tmp/root$prefix
config=$(find "$root" -name ndmConfig.cmake)
[ -n "$config" ] || { echo "no ndmConfig.cmake installed"; exit 1; }
echo "installed: ${config#"$tmp/root"}"
cmake -S "$src" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$root" -DCMAKE_BUILD_TYPE=Release \
    > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
cmake --build "$tmp/b" > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
libdir=$(dirname "$(find "$root" -name "libndm.so.$version")")
for p in consumer_c consumer_cxx; do
    LD_LIBRARY_PATH=$libdir "$tmp/b/$p" | tee "$tmp/$p.out"
    grep -q "headers $version, library $version, sum 6" "$tmp/$p.out"
done
grep -q "through ndm.hpp 12" "$tmp/consumer_cxx.out" # (the installed C++ header)
# The CUDA module is installed beside libndm.so, which finds it there (its
# own directory, from dladdr) with no search path set: the consumer finds
# libndm through its RUNPATH here, so the loader's path holds no module.
if [ "$cuda" = cuda ]; then
    [ -f "$libdir/libndm-cuda.so" ] || { echo "libndm-cuda.so is not installed in $libdir"; exit 1; }
    echo "installed: ${libdir#"$tmp/root"}/libndm-cuda.so"
    if readelf -d "$libdir/libndm.so.$version" | grep NEEDED | grep -Eq 'libcudart|libcublas'; then
        echo "the installed libndm.so links the CUDA runtime"; exit 1
    fi
    readelf -d "$tmp/b/consumer_c" | grep -Eq 'RUNPATH|RPATH' ||
        { echo "the consumer has no RUNPATH: cannot run it without LD_LIBRARY_PATH"; exit 1; }
    env -u NDM_BACKEND_PATH -u LD_LIBRARY_PATH "$tmp/b/consumer_c" | tee "$tmp/module.out"
    grep -q "cuda: backend loaded" "$tmp/module.out"
    # moved away, the module is missed, and the message says where it was looked for
    mv "$libdir/libndm-cuda.so" "$tmp/"
    env -u NDM_BACKEND_PATH -u LD_LIBRARY_PATH "$tmp/b/consumer_c" | tee "$tmp/nomodule.out"
    grep -q "cuda: no backend (.*libndm-cuda.so could not be loaded" "$tmp/nomodule.out"
    grep -qF "$libdir/libndm-cuda.so: cannot open shared object file" "$tmp/nomodule.out"
fi
# a version this package does not offer is refused
mkdir "$tmp/v2"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(v C)\nfind_package(ndm 9.0 REQUIRED)\n' \
    > "$tmp/v2/CMakeLists.txt"
if cmake -S "$tmp/v2" -B "$tmp/v2/b" -DCMAKE_PREFIX_PATH="$root" > "$tmp/v2.log" 2>&1; then
    echo "find_package(ndm 9.0) succeeded against $version"; exit 1
fi
echo ok
