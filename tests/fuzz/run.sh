#!/usr/bin/env bash
# Build the libFuzzer targets with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer, then run each one from its seed corpus.
# Inputs that crash are written to build-fuzz/findings/<format>/.
#   bash tests/fuzz/run.sh [seconds per target (default 180)] [formats...]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-180}
shift || true
formats=("$@")
[ ${#formats[@]} -gt 0 ] || formats=(safetensors npy idx csv)

if ! command -v clang >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang >/dev/null
fi
if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled -Dtools=false -Dbench=false \
        -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-fuzz

failed=()
for f in "${formats[@]}"; do
    corpus=build-fuzz/corpus/$f
    findings=build-fuzz/findings/$f
    mkdir -p "$corpus" "$findings"
    build-fuzz/tests/fuzz/fuzz_seeds "$f" "$corpus"
    echo "== fuzz_$f for ${secs}s"
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        build-fuzz/tests/fuzz/fuzz_"$f" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$findings/" "$corpus" || failed+=("$f")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "findings for: ${failed[*]} (inputs under build-fuzz/findings/)" >&2
    exit 1
fi
