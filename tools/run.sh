#!/usr/bin/env bash
# The two quick-start commands:
#   bash tools/run.sh demo   installs what is missing, builds, runs the main jobs
#   bash tools/run.sh test   installs what is missing, builds, runs every test suite
#                            in a plain build and in an address+undefined sanitizer build
#                            (configured outside the source folder, in a temporary folder),
#                            the threaded suites (threads, allocator) under ThreadSanitizer
#                            built with clang, and every fuzz target for a few seconds
#                            (NDM_FUZZ_SMOKE_S, default 3)
# and for the parsers:
#   bash tools/run.sh fuzz [seconds per target (default 60)] [targets...]
#                            builds the libFuzzer targets of tests/fuzz with clang under
#                            address+undefined sanitizers (build-fuzz/) and runs each from
#                            its seed corpus; prints per target the executions, libFuzzer's
#                            coverage (cov: edges, ft: features) and the inputs it found
#                            (kept under build-fuzz/findings/<target>/)
# and for a GPU machine (nvcc, meson, ninja, python3 with torch; no Debian
# packages, no network):
#   bash tools/run.sh gpu-deps DIR
#                            run where apt works: downloads into DIR the .deb files
#                            the GPU run needs (cmocka, OpenBLAS, pkgconf, OpenMPI,
#                            the Fashion-MNIST data; about 50 MB) and checks they unpack
#   bash tools/run.sh gpu    builds one release tree for sm_80 and sm_90 (NDM_GPU_ARCH
#                            names others, e.g. 90), runs the conformance suite and
#                            every CUDA test on the GPU, compute-sanitizer memcheck and
#                            racecheck on the conformance suite, with mpirun the NCCL
#                            check and bench/dist, ndm-fashion train and
#                            serve with --device cuda, bench/cuda --json, and last the
#                            whole test suite; each step ends after NDM_GPU_STEP_S
#                            seconds (default 300), NDM_GPU_SUITE=0 leaves out the
#                            whole suite; everything goes to
#                            $OUT (default build-gpu/out). NDM_GPU_DEPS=DIR names the
#                            folder gpu-deps filled, unpacked with dpkg -x into
#                            build-gpu/deps (never into /); without it only the two
#                            CUDA suites are built, against tests/cmocka_lite.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building ndm needs (the README's "Build and install": cmake and g++
# because Meson writes the CMake package with cmake's own templates, and
# cmake asks for a C++ compiler), and the main job's data; the tests need
# the second list too.
packages=(meson ninja-build gcc g++ cmake pkg-config zlib1g-dev libopenblas-dev
          dataset-fashion-mnist fortunes)
test_packages=(libcmocka-dev libdlpack-dev python3-numpy libtalloc-dev libapr1-dev chromium
               doxygen openmpi-bin libopenmpi-dev libmicrohttpd-dev wrk)

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

# Whether clang here links libFuzzer (-fsanitize=fuzzer): the fuzz targets need it.
have_libfuzzer() {
    command -v clang >/dev/null || return 1
    local tmp rc=0
    tmp=$(mktemp -d)
    printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
        'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
        >"$tmp/t.c"
    clang -fsanitize=fuzzer "$tmp/t.c" -o "$tmp/t" >/dev/null 2>&1 || rc=1
    rm -rf "$tmp"
    return $rc
}

# What the GPU run needs that a bare GPU machine lacks, as Debian packages.
gpu_packages=(libcmocka0 libcmocka-dev libopenblas0 libopenblas0-pthread libopenblas-dev
              libopenblas-pthread-dev libgfortran5 pkgconf pkgconf-bin libpkgconf3
              dataset-fashion-mnist
              # OpenMPI and what it loads, for the process group and NCCL's bootstrap
              openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libfabric1 libucx0
              libhwloc15 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
              libnl-route-3-200 libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2 libnuma1)

gpu_deps() { # gpu-deps DIR
    local dir=${1:?usage: bash tools/run.sh gpu-deps DIR}
    mkdir -p "$dir"
    (cd "$dir" && apt-get download "${gpu_packages[@]}")
    # check here that they unpack; the GPU run unpacks them again where it builds
    local f tmp
    tmp=$(mktemp -d)
    for f in "$dir"/*.deb; do
        dpkg -x "$f" "$tmp"
    done
    rm -rf "$tmp"
    echo "$(ls "$dir"/*.deb | wc -l) packages ($(du -sh "$dir" | cut -f1)) in $dir; on the GPU" \
         "machine: NDM_GPU_DEPS=$dir bash tools/run.sh gpu"
}

gpu() {
    local out=${OUT:-build-gpu/out}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local log=$out/gpu.log
    : > "$log"
    rm -f "$out/fashion.txt"
    local failed=()
    step() { # step NAME COMMAND...: run, log, remember a failure, go on
        local name=$1
        shift
        echo "== $name" | tee -a "$log"
        local t0=$SECONDS limit=()
        # a step that hangs on the device ends at NDM_GPU_STEP_S; builds run whole
        [ "$(type -t "$1")" = function ] || limit=(timeout "${NDM_GPU_STEP_S:-300}")
        if "${limit[@]}" "$@" >>"$log" 2>&1; then
            echo "   ok ($((SECONDS - t0)) s)" | tee -a "$log"
        else
            echo "   FAILED (exit $?, $((SECONDS - t0)) s; see $log)" | tee -a "$log"
            failed+=("$name")
        fi
    }
    export PATH=/usr/local/cuda/bin:$PATH
    {
        nvidia-smi || true
        nvcc --version || true
        python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || true
    } >>"$log" 2>&1
    local tests=disabled deps=${NDM_GPU_DEPS:-}
    local root=""
    if [ -n "$deps" ]; then
        # the .deb files unpacked into a folder of the build, never into /
        root=$PWD/build-gpu/deps
        rm -rf "$root"
        mkdir -p "$root"
        local f
        for f in "$deps"/*.deb; do
            dpkg -x "$f" "$root"
        done
        local lib=$root/usr/lib/x86_64-linux-gnu
        # the unpacked packages' .pc files name /usr: the sysroot prefixes their paths
        export PKG_CONFIG_SYSROOT_DIR=$root
        export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$root/usr/share/pkgconfig
        export PATH=$root/usr/bin:$PATH
        export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LIBRARY_PATH=$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
        if [ -x "$root/usr/bin/mpirun.openmpi" ]; then
            # OpenMPI outside /usr finds its plugins and orted through OPAL_PREFIX
            export OPAL_PREFIX=$root/usr
            ln -sf mpirun.openmpi "$root/usr/bin/mpirun"
        fi
        tests=enabled
    else
        echo "NDM_GPU_DEPS is not set: of the test suites only the CUDA ones are built" \
             "(without cmocka); 'bash tools/run.sh gpu-deps DIR' where apt works fetches" \
             "the rest" | tee -a "$log"
    fi
    if [ ! -f /usr/local/cuda/include/nccl.h ]; then
        # NCCL from Python's nvidia-nccl package, where the toolkit has none: the
        # build looks for libnccl.so and nccl.h on the compiler's paths
        local nccl
        nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' \
               2>/dev/null || true)
        if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
            mkdir -p build-gpu/nccl
            ln -sf "$nccl"/lib/libnccl.so.* build-gpu/nccl/
            ln -sf "$(ls "$nccl"/lib/libnccl.so.* | head -1)" build-gpu/nccl/libnccl.so
            export CPATH=$nccl/include${CPATH:+:$CPATH}
            export LIBRARY_PATH=$PWD/build-gpu/nccl${LIBRARY_PATH:+:$LIBRARY_PATH}
            export LD_LIBRARY_PATH=$PWD/build-gpu/nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        fi
    fi
    local arch="-Dgpu_arch=${NDM_GPU_ARCH:-80;90}"
    # one release tree: its suites (with cmocka), the main job and the benchmark
    step "configure and build the release tree ($arch)" \
        build build-gpu/release --buildtype=release -Dcuda=enabled "$arch" -Dtests=$tests
    local suites=build-gpu/release
    if [ "$tests" = disabled ]; then
        # only the two CUDA suites, built against tests/cmocka_lite
        step "the CUDA suites without cmocka" ninja -C build-gpu/release tests/test_cuda \
            tests/test_backend_ops
    fi
    export NDM_BACKEND_PATH=$PWD/$suites/lib
    step "conformance suite on the GPU" sh -c "$suites/tests/test_backend_ops > $out/conformance.txt 2>&1"
    step "CUDA tests on the GPU" sh -c "$suites/tests/test_cuda > $out/test_cuda.txt 2>&1"
    # user modules on a model on the GPU (built with cmocka only)
    if [ -x "$suites/tests/test_user_module" ]; then
        step "user modules on the GPU" sh -c "NDM_LOG_ERRORS=0 $suites/tests/test_user_module \
            > $out/test_user_module.txt 2>&1"
    fi
    # (no grep -q after a pipe here: under pipefail, grep leaving at the first
    # match can end the writer with SIGPIPE and fail the test at random)
    # NCCL on the GPU, one rank: the bootstrap and every collective on CUDA
    # arrays of every dtype (tests/dist_gpu.c); needs MPI in the build (and
    # so NCCL, from the toolkit or Python's package above) and mpirun here
    if command -v mpirun >/dev/null &&
        ninja -C "$suites" -t targets all 2>/dev/null | grep '^tests/dist_gpu:' >/dev/null; then
        step "NCCL collectives on the GPU (mpirun -np 1)" sh -c "ninja -C $suites tests/dist_gpu \
            && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 \
            --oversubscribe $suites/tests/dist_gpu > $out/dist_gpu.txt 2>&1"
        # bench/dist on the host's cores: a core per rank (the documented
        # command), then two ranks of 4 threads each with cores to spare
        local dist=build-gpu/release/bench/bench_dist
        if [ -x "$dist" ]; then
            export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            step "bench/dist, 2 ranks, a core each" sh -c "mpirun -np 2 $dist \
                > $out/bench_dist.txt 2>&1"
            step "bench/dist, 2 ranks of 4 threads" sh -c "mpirun -np 2 --bind-to none \
                -x NDM_NUM_THREADS=4 $dist > $out/bench_dist_4t.txt 2>&1"
        fi
    else
        echo "no mpirun, or no MPI in the build: the NCCL check is not run" | tee -a "$log"
    fi
    local tool
    for tool in memcheck racecheck; do
        step "compute-sanitizer $tool, conformance suite" sh -c "compute-sanitizer --tool $tool \
            --error-exitcode 1 $suites/tests/test_backend_ops > $out/sanitizer_$tool.txt 2>&1"
    done
    export NDM_BACKEND_PATH=$PWD/build-gpu/release/lib
    local data=""
    if [ -n "$root" ] && [ -d "$root/usr/share/datasets/fashion-mnist" ]; then
        data=$root/usr/share/datasets/fashion-mnist
    elif [ -d /usr/share/datasets/fashion-mnist ]; then
        data=/usr/share/datasets/fashion-mnist
    fi
    if [ -n "$data" ]; then
        local fashion=build-gpu/release/tools/ndm-fashion model=build-gpu/fashion-model.safetensors
        step "ndm-fashion train --device cuda (MLP)" sh -c "$fashion train --device cuda \
            --data $data --epochs 3 --quiet --out $model >> $out/fashion.txt 2>&1"
        step "ndm-fashion serve --device cuda" sh -c "$fashion serve --device cuda --data $data \
            --model $model --requests 20000 >> $out/fashion.txt 2>&1"
        step "ndm-fashion train --device cuda --cnn" sh -c "$fashion train --device cuda --cnn \
            --data $data --epochs 2 --quiet --no-save >> $out/fashion.txt 2>&1"
        # data-parallel on the GPU: one rank, its buckets over NCCL
        if command -v mpirun >/dev/null && "$fashion" --help 2>&1 | grep -- --dist >/dev/null; then
            step "ndm-fashion train --dist --device cuda (mpirun -np 1)" sh -c "\
                OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 \
                --oversubscribe $fashion train --dist --device cuda --data $data --epochs 2 \
                --no-save >> $out/fashion_dist.txt 2>&1"
        fi
    else
        echo "no Fashion-MNIST data (NDM_GPU_DEPS from gpu-deps carries it): the main job" \
             "is not run" | tee -a "$log"
    fi
    step "bench/cuda --json" sh -c "build-gpu/release/bench/cuda --json --python python3 \
        > $out/bench_cuda.json"
    # last, so that a slow suite cannot cost the GPU-only steps above
    if [ "$tests" = enabled ] && [ "${NDM_GPU_SUITE:-1}" = 1 ]; then
        step "every test in the release tree" meson test -C build-gpu/release --print-errorlogs \
            --num-processes "$(nproc)"
        cp build-gpu/release/meson-logs/testlog.txt "$out/testlog.txt" 2>/dev/null || true
    fi
    echo "results in $out: $(cd "$out" && ls | tr '\n' ' ')"
    if [ ${#failed[@]} -gt 0 ]; then
        printf 'failed: %s\n' "${failed[@]}" >&2
        return 1
    fi
}

case "${1:-}" in
gpu-deps)
    shift
    gpu_deps "$@"
    ;;
gpu)
    gpu
    ;;
demo)
    install_missing
    build build-release --buildtype=release -Dtests=disabled
    # train on all of Fashion-MNIST, serve the model, then show a leak caught
    # by its line; NDM_LEAK_REPORT lists anything still alive at exit
    export NDM_LEAK_REPORT=1
    ./build-release/tools/ndm-fashion train --out build-release/fashion-model.safetensors
    ./build-release/tools/ndm-fashion serve --model build-release/fashion-model.safetensors
    ./build-release/tools/ndm-fashion leak-demo
    # the second main job: a short run of the character-level transformer on
    # the fortune files (without --epochs and --steps: the full run, some
    # minutes), then prompts from two threads, the dump showing a request's
    # key/value cache under its manager
    ./build-release/tools/ndm-text train --epochs 3 --steps 50 --out build-release/text-model.safetensors
    ./build-release/tools/ndm-text generate --model build-release/text-model.safetensors \
        --requests 4 --threads 2 --tokens 120 --dump
    ;;
test)
    # clang builds the ThreadSanitizer tree and the fuzz targets
    packages+=("${test_packages[@]}" clang)
    install_missing
    build build
    meson test -C build --print-errorlogs --num-processes 2
    # The sanitizer trees run the CUDA path on the host stand-in (built from the
    # same sources in every tree); nvcc's GPU module is built and checked once,
    # in the plain tree, since no sanitizer sees inside it.
    # The address+undefined tree is configured outside the source folder, as
    # packagers' and CI systems' builds are, so that nothing comes to depend on
    # a build folder inside the tree: a fresh folder, removed after (its test
    # log is kept as build/meson-logs/testlog-san.txt on a failure), named
    # after this checkout's path so that ccache finds its objects again.
    san="${TMPDIR:-/tmp}/ndm-san-$(printf '%s' "$PWD" | cksum | cut -d' ' -f1)"
    rm -rf "$san"
    trap 'rm -rf "$san"' EXIT
    build "$san" -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false -Dcuda=disabled
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C "$san" --print-errorlogs --num-processes 2 ||
        { cp "$san/meson-logs/testlog.txt" build/meson-logs/testlog-san.txt; exit 1; }
    # ThreadSanitizer with clang, so that a clang build is checked too
    CC=clang CXX=clang++ build build-tsan-clang -Db_sanitize=thread -Db_lundef=false \
        -Dbench=false -Dtools=false -Dcuda=disabled
    TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan-clang --suite tsan --print-errorlogs
    # Every fuzz target a few seconds from its seeds, so that the fuzz build and
    # the targets cannot break unseen (bash tools/run.sh fuzz runs them longer)
    if have_libfuzzer; then
        fuzz "${NDM_FUZZ_SMOKE_S:-3}"
    else
        echo "fuzz smoke skipped: no clang with libFuzzer (clang -fsanitize=fuzzer) here"
    fi
    ;;
fuzz)
    shift
    packages=(clang)
    install_missing
    fuzz "$@"
    ;;
*)
    echo "usage: bash tools/run.sh demo|test|fuzz [seconds per target] [targets...]|gpu|gpu-deps DIR" >&2
    exit 2
    ;;
esac
