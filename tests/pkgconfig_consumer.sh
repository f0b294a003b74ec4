#!/usr/bin/env bash
# Install ndm into a scratch folder and build a C program with what
# `pkg-config --cflags --libs ndm` says, with nothing but ndm's .pc on the
# pkg-config path: the .pc needs no other package's .pc, and its Cflags name
# ndm's include folder alone. Skipped (77) without pkg-config, or in a
# sanitizer build (its library needs the sanitizer runtime).
set -euo pipefail
build=$1 src=$2 sanitize=$3
command -v pkg-config > /dev/null || { echo "pkg-config is not installed: skipped"; exit 77; }
[ "$sanitize" = none ] || { echo "sanitizer build: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet > "$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/root" -name ndm.pc)
[ -n "$pc" ] || { echo "no ndm.pc installed"; exit 1; }
echo "installed: ${pc#"$tmp/root"}"
prefix=$(sed -n 's/^prefix=//p' "$pc")
if grep -q '^Requires' "$pc"; then
    echo "ndm.pc requires other packages:"; grep '^Requires' "$pc"; exit 1
fi
# nothing but ndm's folder on the path, the prefix moved to the scratch root
export PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=$(dirname "$pc")
pcargs=(--define-variable=prefix="$tmp/root$prefix")
cflags=$(pkg-config "${pcargs[@]}" --cflags ndm)
libs=$(pkg-config "${pcargs[@]}" --libs ndm)
pkg-config "${pcargs[@]}" --static --libs ndm > /dev/null
echo "cflags: ${cflags//$tmp\/root/}"
echo "libs: ${libs//$tmp\/root/}"
for f in $cflags; do
    [ "$f" = "-I$tmp/root$prefix/include" ] || { echo "unexpected cflag: $f"; exit 1; }
done
cat > "$tmp/app.c" <<'C'
#include <ndm/ndm.h>
#include <stdio.h>
int main(void)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "app");
    double s = 0;
    if (ndm_item(ndm_sum(ndm_ones(m, NDM_F32, NDM_SHAPE(2, 3)), false, NDM_ALL_AXES_LIST), &s) !=
            NDM_OK ||
        ndm_manager_close(m) != NDM_OK)
        return 1;
    printf("sum %.0f\n", s);
    return 0;
}
C
cc -std=c11 $cflags "$tmp/app.c" $libs -o "$tmp/app"
libdir=$(pkg-config "${pcargs[@]}" --variable=libdir ndm)
out=$(LD_LIBRARY_PATH=$libdir "$tmp/app")
echo "app: $out"
[ "$out" = "sum 6" ]
