#!/usr/bin/env bash
# Run doxygen, then print its warnings (it writes them to a file) and their
# count; exit 1 when there is any.
set -euo pipefail
doxygen=$1 doxyfile=$2 out=$3
rm -f "$out/warnings.log"
"$doxygen" "$doxyfile"
n=0
if [ -s "$out/warnings.log" ]; then
    cat "$out/warnings.log" >&2
    n=$(grep -c ': warning: ' "$out/warnings.log" || true)
fi
echo "API reference: $out/html/index.html; $n warnings"
[ "$n" -eq 0 ]
