#!/usr/bin/env bash
# Misuses of the public headers that must fail to compile: an ignored
# NDM_NODISCARD status (C11, C++17) and NDM_AUTO on a handle that is neither
# a manager nor an array (GCC; Clang refuses it at run time). Each snippet
# is also compiled in its correct form, so a failure for another reason
# (a missing header, a bad flag) is not taken for the refusal.
set -uo pipefail
cc_id=$1 cc=$2 cxx=$3 inc=$4 build_inc=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# check LANG-COMPILER FLAGS GOOD_BODY BAD_BODY WHAT
check() {
    local compiler=$1 flags=$2 good=$3 bad=$4 what=$5 ext=c
    case "$flags" in *c++*) ext=cpp ;; esac
    for form in good bad; do
        local body=$good
        [ "$form" = bad ] && body=$bad
        printf '#include "ndm/ndm.h"\nint f(ndm_manager m);\nint f(ndm_manager m)\n{\n%s\n    return 0;\n}\n' \
            "$body" > "$tmp/$form.$ext"
        # shellcheck disable=SC2086
        $compiler $flags -Wall -Wextra -Werror -I"$inc" -I"$build_inc" -c "$tmp/$form.$ext" \
            -o "$tmp/$form.o" 2> "$tmp/$form.err"
        local rc=$?
        if [ "$form" = good ] && [ $rc -ne 0 ]; then
            echo "FAIL ($what): the correct form does not compile:"; cat "$tmp/good.err"
            fails=$((fails + 1)); return
        fi
        if [ "$form" = bad ] && [ $rc -eq 0 ]; then
            echo "FAIL ($what): compiles, and should not"; fails=$((fails + 1)); return
        fi
    done
    echo "ok: $what is refused at compile time"
}

check "$cc" "-std=c11 -pedantic" "    (void)ndm_manager_close(m);" "    ndm_manager_close(m);" \
    "an ignored ndm_manager_close status (C11)"
check "$cc" "-std=c11 -pedantic" "    (void)ndm_manager_cap(m, NDM_CAP_ARRAYS);" \
    "    ndm_manager_cap(m, NDM_CAP_ARRAYS);" "an ignored ndm_manager_cap status (C11)"
if [ "$cc_id" = gcc ]; then
    check "$cc" "-std=c11 -pedantic" \
        "    NDM_AUTO ndm_manager x = ndm_manager_new(m, \"x\"); (void)x;" \
        "    NDM_AUTO ndm_module x = ndm_relu_module(m); (void)x;" "NDM_AUTO on a module (C11)"
fi
if [ -n "$cxx" ]; then
    check "$cxx" "-x c++ -std=c++17 -pedantic-errors" "    (void)ndm_manager_close(m);" \
        "    ndm_manager_close(m);" "an ignored ndm_manager_close status (C++17)"
    if [ "$cc_id" = gcc ]; then
        check "$cxx" "-x c++ -std=c++17 -pedantic-errors" \
            "    NDM_AUTO ndm_array x = ndm_zeros(m, NDM_F32, NDM_SHAPE(2)); (void)x;" \
            "    NDM_AUTO ndm_loader x = {0}; (void)x;" "NDM_AUTO on a loader (C++17)"
    fi
fi
[ "$fails" -eq 0 ] || exit 1
