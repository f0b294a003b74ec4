# What the command-line tests of the main jobs share, sourced after `bin` is
# set: a scratch folder, fail() counting failures, and expect().
tool=$(basename "$bin")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect RC STDOUT_PATTERN STDERR_PATTERN -- ARGS...: exit status and what
# each stream must contain ('' : must be empty); the command pre[] comes first
pre=()
expect() {
    local rc=$1 out=$2 err=$3
    shift 4
    ${pre[@]+"${pre[@]}"} "$bin" "$@" > "$tmp/out" 2> "$tmp/err"
    local got=$?
    [ "$got" -eq "$rc" ] || fail "$tool $*: exit $got, not $rc ($(head -c 300 "$tmp/err"))"
    if [ -z "$out" ]; then
        [ ! -s "$tmp/out" ] || fail "$tool $*: stdout should be empty: $(head -c 300 "$tmp/out")"
    else
        grep -qF -- "$out" "$tmp/out" || fail "$tool $*: stdout lacks '$out': $(head -c 300 "$tmp/out")"
    fi
    if [ -z "$err" ]; then
        [ ! -s "$tmp/err" ] || fail "$tool $*: stderr should be empty: $(head -c 300 "$tmp/err")"
    else
        grep -qF -- "$err" "$tmp/err" || fail "$tool $*: stderr lacks '$err': $(cat "$tmp/err")"
    fi
}

# The end of every such test: the count of failures, or ok.
finish() {
    [ "$fails" -eq 0 ] || { echo "$fails checks failed"; exit 1; }
    echo ok
}
