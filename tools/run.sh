#!/usr/bin/env bash
# The two quick-start commands:
#   bash tools/run.sh demo   installs what is missing, builds, runs the main job
#   bash tools/run.sh test   installs what is missing, builds, runs every test suite
#                            in a plain build and in an address+undefined sanitizer build,
#                            and the threaded suites (threads, allocator) under ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(meson ninja-build gcc pkg-config libcmocka-dev libopenblas-dev zlib1g-dev
          libtalloc-dev libapr1-dev dataset-fashion-mnist chromium doxygen cmake)

install_missing() {
    local missing=()
    for p in "${packages[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

build() { # build DIR [meson options...]
    local dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@"
    fi
    ninja -C "$dir"
}

case "${1:-}" in
demo)
    install_missing
    build build-release --buildtype=release -Dtests=disabled
    # train on all of Fashion-MNIST, serve the model, then show a leak caught
    # by its line; NDM_LEAK_REPORT lists anything still alive at exit
    export NDM_LEAK_REPORT=1
    ./build-release/tools/ndm-fashion train --out build-release/fashion-model.safetensors
    ./build-release/tools/ndm-fashion serve --model build-release/fashion-model.safetensors
    ./build-release/tools/ndm-fashion leak-demo
    ;;
test)
    install_missing
    build build
    meson test -C build --print-errorlogs --num-processes 2
    build build-san -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-san --print-errorlogs --num-processes 2
    build build-tsan -Db_sanitize=thread -Db_lundef=false -Dbench=false -Dtools=false
    TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan --suite tsan --print-errorlogs
    ;;
*)
    echo "usage: bash tools/run.sh demo|test" >&2
    exit 2
    ;;
esac
