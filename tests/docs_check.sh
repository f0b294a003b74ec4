#!/usr/bin/env bash
# The API reference builds: Doxygen over the headers and docs/overview.md
# into a scratch folder. Fails on any warning about the overview page and on
# any warning other than an undocumented public symbol, whose count it
# prints (those go once every public symbol has its comment; then this
# check fails on every warning, as `ninja -C build docs` does).
# Skipped (77) without doxygen.
set -euo pipefail
doxygen=$1 doxyfile=$2
[ -x "$doxygen" ] || { echo "doxygen is not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $tmp"; echo "WARN_LOGFILE = $tmp/warnings.log"; } |
    "$doxygen" - > "$tmp/out.log" 2>&1 || { cat "$tmp/out.log"; exit 1; }
[ -f "$tmp/html/index.html" ] || { echo "no html/index.html"; exit 1; }
grep -q "The output rule" "$tmp/html/index.html" || { echo "the overview is not the main page"; exit 1; }
touch "$tmp/warnings.log"
undocumented=$(grep -c ' is not documented\.$' "$tmp/warnings.log" || true)
grep -v ' is not documented\.$' "$tmp/warnings.log" | grep . > "$tmp/other.log" || true
echo "doxygen: $undocumented undocumented public symbols"
if [ -s "$tmp/other.log" ] || grep -q 'overview\.md' "$tmp/warnings.log"; then
    echo "doxygen warnings:"; cat "$tmp/other.log"; grep 'overview\.md' "$tmp/warnings.log" || true
    exit 1
fi
echo ok
