#!/usr/bin/env python3
"""The layering of lib/: every quoted #include must point at the same layer or
one below it (DESIGN.md, "Layers, one way down").

    python3 tests/check_layers.py [SOURCE_ROOT]    check the tree; exit 1 on a violation
    python3 tests/check_layers.py --self-test      show that a violation is caught

Layers, lowest first. A file belongs to the layer of the longest folder in
LAYERS that holds it; it may include files of the layers its entry lists, and
of the public headers (include/ndm/) that PUBLIC allows for its layer.
"""
import os
import re
import shutil
import sys
import tempfile

# What the ops layer and those above it stand on.
OPS_BELOW = {"base", "manager/alloc", "manager", "backends"}

# folder under lib/ -> the folders under lib/ its files may include
LAYERS = {
    "base": {"base"},
    "manager/alloc": {"base", "manager/alloc"},
    "backends": {"base", "backends"},
    "manager": {"base", "manager/alloc", "manager"},
    "ops": OPS_BELOW | {"ops"},
    "io": OPS_BELOW | {"ops", "io"},
    "nn": OPS_BELOW | {"ops", "io", "nn"},
    "interop": OPS_BELOW | {"ops", "io", "nn", "interop"},
    "dist": OPS_BELOW | {"ops", "io", "nn", "dist"},
}

# The public headers a layer may include: the leaf ones that only declare
# types and the status list, for the layers under the manager; the umbrella
# ndm.h only for the layers on top (the others name what they use).
LEAF_PUBLIC = {"ndm/base.h", "ndm/status.h", "ndm/dtype.h", "ndm/device.h", "ndm/config.h",
               "ndm/version.h"}
PUBLIC = {
    "base": LEAF_PUBLIC,
    "manager/alloc": LEAF_PUBLIC | {"ndm/memory.h"},
    "backends": None,  # any but ndm.h: kernels take the enums of their family's header
    "manager": None,
    "ops": None,
}
UMBRELLA = "ndm/ndm.h"
TOP = {"io", "nn", "interop", "dist"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".c", ".h", ".cu", ".cuh")


def layer_of(rel):
    """The layer of a path relative to lib/ (None: not in a known layer)."""
    best = None
    for folder in LAYERS:
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def check(root):
    lib = os.path.join(root, "lib")
    problems = []
    unplaced = []
    for dirpath, _, files in os.walk(lib):
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, lib)
            mine = layer_of(rel)
            if mine is None:
                unplaced.append(rel)
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                if inc.startswith("ndm/"):
                    allowed = PUBLIC.get(mine)
                    if inc == UMBRELLA and mine not in TOP:
                        problems.append(f"lib/{rel}:{line}: {mine} includes the umbrella {inc}; "
                                        "name the public headers it uses")
                    elif allowed is not None and inc not in allowed:
                        problems.append(f"lib/{rel}:{line}: {mine} includes the public {inc}, "
                                        f"which its layer may not use")
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                if target.startswith(".."):
                    problems.append(f"lib/{rel}:{line}: includes {inc}, outside lib/")
                    continue
                theirs = layer_of(target)
                if theirs is None:
                    problems.append(f"lib/{rel}:{line}: includes {inc} (lib/{target}), "
                                    "which is in no layer")
                elif theirs not in LAYERS[mine]:
                    problems.append(f"lib/{rel}:{line}: {mine} includes {inc}, of the {theirs} "
                                    "layer, which is not below it")
    for rel in unplaced:
        problems.append(f"lib/{rel}: in no layer (add its folder to LAYERS in {__file__})")
    return problems


def self_test(root):
    """An upward include planted in a copy of the tree must be reported (the
    tree's own state is the other test's business)."""
    tmp = tempfile.mkdtemp()
    try:
        shutil.copytree(os.path.join(root, "lib"), os.path.join(tmp, "lib"))
        before = set(check(tmp))
        victim = os.path.join(tmp, "lib", "base", "dtype.c")
        with open(victim, "a") as f:
            f.write('\n#include "../manager/core.h"\n')
        found = [p for p in check(tmp) if p not in before]
        if not any("base/dtype.c" in p and "manager" in p for p in found):
            print("self-test: an include of the manager layer from base was not caught")
            return 1
        print("self-test: an upward include is caught:", found[0])
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    args = sys.argv[1:]
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    if args and args[0] == "--self-test":
        return self_test(args[1] if len(args) > 1 else root)
    if args:
        root = args[0]
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break the layering")
        return 1
    print("layering holds: every include of lib/ points at its own layer or one below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
