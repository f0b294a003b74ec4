#!/usr/bin/env bash
# The two quick-start commands:
#   bash tools/run.sh demo   installs what is missing, builds, runs the main job
#   bash tools/run.sh test   installs what is missing, builds, runs every test suite
#                            in a plain build and in an address+undefined sanitizer build,
#                            and the threaded suites (threads, allocator) under ThreadSanitizer
# and for the parsers:
#   bash tools/run.sh fuzz [seconds per target (default 60)] [targets...]
#                            builds the libFuzzer targets of tests/fuzz with clang under
#                            address+undefined sanitizers (build-fuzz/) and runs each from
#                            its seed corpus; prints per target the executions, libFuzzer's
#                            coverage (cov: edges, ft: features) and the inputs it found
#                            (kept under build-fuzz/findings/<target>/)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(meson ninja-build gcc g++ pkg-config libcmocka-dev libopenblas-dev zlib1g-dev libdlpack-dev python3-numpy
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

fuzz() { # fuzz [seconds per target] [targets...]
    local secs=${1:-60}
    shift || true
    local targets=("$@") f
    if [ ${#targets[@]} -eq 0 ]; then
        for f in tests/fuzz/fuzz_*.c; do
            f=${f##*/fuzz_}
            f=${f%.c}
            [ "$f" = seeds ] || targets+=("$f")
        done
    fi
    if ! command -v clang >/dev/null; then
        echo "installing: clang"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang >/dev/null
    fi
    if [ ! -f build-fuzz/build.ninja ]; then
        CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled -Dtools=false -Dbench=false \
            -Db_sanitize=address,undefined -Db_lundef=false
    fi
    # Only the targets and the seed writer, not the suites the tree also has.
    ninja -C build-fuzz tests/fuzz/fuzz_seeds "${targets[@]/#/tests/fuzz/fuzz_}"
    mkdir -p build-fuzz/logs
    local t found=() lines=()
    for t in "${targets[@]}"; do
        local corpus=build-fuzz/corpus/$t findings=build-fuzz/findings/$t
        local log=build-fuzz/logs/$t.log
        mkdir -p "$corpus" "$findings"
        build-fuzz/tests/fuzz/fuzz_seeds "$t" "$corpus"
        local before
        before=$(find "$findings" -type f | wc -l)
        echo "== fuzz_$t for ${secs}s (log: $log)"
        local rc=0
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            build-fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$secs" -timeout=10 \
            -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
            -artifact_prefix="$findings/" "$corpus" >"$log" 2>&1 || rc=$?
        # The last status line carries the coverage; the final stats the executions.
        local execs cov ft corp after
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        cov=$(grep -E '^#[0-9]+' "$log" | grep ' cov: ' | tail -n 1 || true)
        ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$cov")
        corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$cov")
        cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$cov")
        after=$(find "$findings" -type f | wc -l)
        lines+=("$(printf '%-16s executions %10s  cov %6s  ft %6s  corpus %-12s findings %d new (%d kept)%s' \
            "fuzz_$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" $((after - before)) "$after" \
            "$([ "$rc" -eq 0 ] || echo ", exit $rc")")")
        [ "$rc" -eq 0 ] && [ "$after" -eq "$before" ] || found+=("$t")
    done
    echo
    printf '%s\n' "${lines[@]}"
    if [ ${#found[@]} -gt 0 ]; then
        echo "findings for: ${found[*]} (inputs under build-fuzz/findings/, logs under build-fuzz/logs/)" >&2
        return 1
    fi
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
fuzz)
    shift
    fuzz "$@"
    ;;
*)
    echo "usage: bash tools/run.sh demo|test|fuzz [seconds per target] [targets...]" >&2
    exit 2
    ;;
esac
