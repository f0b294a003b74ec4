#!/usr/bin/env bash
# The API reference builds: Doxygen over the headers and docs/overview.md
# into a scratch folder, with the overview as the main page and a page per
# header. Fails when doxygen fails or warns about the overview, and with
# --strict (what the test command passes, as strict as `ninja -C build
# docs`) on any warning about the headers' comments: a public symbol without
# its comment, or broken markup. Without --strict it only counts them.
# Skipped (77) without doxygen.
set -euo pipefail
doxygen=$1 doxyfile=$2 strict=${3:-}
[ -x "$doxygen" ] || { echo "doxygen is not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $tmp"; echo "WARN_LOGFILE = $tmp/warnings.log"; } |
    "$doxygen" - > "$tmp/out.log" 2>&1 || { cat "$tmp/out.log"; exit 1; }
html=$tmp/html
[ -f "$html/index.html" ] || { echo "no html/index.html"; exit 1; }
grep -q "The output rule" "$html/index.html" || { echo "the overview is not the main page"; exit 1; }
# a documented file gets its own page listing its functions
grep -q "ndm_manager_close_at" "$html/manager_8h.html" ||
    { echo "manager.h has no page with its functions"; exit 1; }
touch "$tmp/warnings.log"
total=$(grep -c ': warning: ' "$tmp/warnings.log" || true)
undocumented=$(grep -c ' is not documented\.$' "$tmp/warnings.log" || true)
echo "doxygen: $total warnings about the headers, $undocumented of them undocumented symbols"
if grep -v '/include/ndm/' "$tmp/warnings.log" | grep -q .; then
    echo "warnings outside the headers:"; grep -v '/include/ndm/' "$tmp/warnings.log"; exit 1
fi
if [ "$strict" = --strict ] && [ "$total" -gt 0 ]; then
    cat "$tmp/warnings.log"; exit 1
fi
echo ok
