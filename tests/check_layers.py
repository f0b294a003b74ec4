#!/usr/bin/env python3
"""The layering of lib/: every quoted #include must point at the same layer or
one below it (DESIGN.md, "Layers, one way down"), and the narrow interface
above ops holds:

- the layers above ops (io, nn, dist, interop) reach neither the manager's
  core.h, the backend registry nor ops' dispatch.h, not even through another
  header, and include no backend header but through lib/ops/inner.h;
- outside lib/manager and lib/ops (and tools/), no code reads an array,
  storage or manager record (their types, their record lookups, ->storage);
- the manager calls no function that ops defines.

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

# What the layers above ops may not reach, directly or through other headers.
HIDDEN = {"manager/core.h": "the manager's records", "backends/registry.h": "the backend registry",
          "ops/dispatch.h": "the dispatchers' helpers"}
# The one header above ops through which backend types (ndm__tensor) come.
NARROW = "ops/inner.h"
# The manager's headers that name no record, which the layers above ops may
# include: owned objects, deferred reclamation, the allocator (host
# temporaries charged to a manager).
MANAGER_OPEN = {"manager/object.h", "manager/reclaim.h",
                "manager/alloc/alloc.h"}
# Reads of the manager's records: their types, their lookups, their fields.
RECORD = re.compile(r"\b(ndm__array|ndm__storage|ndm__manager)\b(?!_)|"
                    r"\bndm__(array|storage|manager)_(get|peek|ptr|slot|lookup)\w*\s*\(|"
                    r"->storage\b")
# Files above ops not yet held to the two rules above, each with its reason
# (none today: keep it so).
PENDING = {}
# Where record reads are the layer's business.
RECORD_HOMES = ("manager", "manager/alloc", "ops", "backends", "base")
DEFINITION = re.compile(r"^(?:NDM_API\s+)?(?!static\b)[A-Za-z_][\w \t\*]*?\b(ndm_{1,2}\w+)\s*\(",
                        re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
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
    problems += check_narrow(root)
    return problems


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def sources(top):
    for dirpath, _, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(SOURCES):
                yield os.path.join(dirpath, name)


def includes_of(lib, rel):
    """The lib/-relative targets of rel's quoted includes that exist."""
    out = []
    text = read(os.path.join(lib, rel))
    for m in INCLUDE.finditer(text):
        target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
        if os.path.isfile(os.path.join(lib, target)):
            out.append((target, text.count("\n", 0, m.start()) + 1))
    return out


def reach(lib, rel, seen=None):
    """Every lib/ header that rel reaches, each with the first header on the way."""
    found = {}
    todo = [(t, t) for t, _ in includes_of(lib, rel)]
    while todo:
        target, via = todo.pop()
        if target in found:
            continue
        found[target] = via
        todo += [(t, via) for t, _ in includes_of(lib, target)]
    return found


def code_of(text):
    """text without comments and string literals (lines kept)."""
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def check_narrow(root):
    lib = os.path.join(root, "lib")
    problems = []
    # the layers above ops: no hidden header reached, no record read
    for path in sources(lib):
        rel = os.path.relpath(path, lib)
        mine = layer_of(rel)
        if mine not in TOP or rel in PENDING:
            continue
        for target, line in includes_of(lib, rel):
            if target.startswith("backends/") or target.startswith("manager/") and \
                    target not in MANAGER_OPEN:
                problems.append(f"lib/{rel}:{line}: {mine} includes lib/{target}; above ops only "
                                f"lib/{NARROW} gives what lies below")
        for target, via in reach(lib, rel).items():
            if target in HIDDEN:
                how = "" if via == target else f" (through lib/{via})"
                problems.append(f"lib/{rel}: {mine} reaches lib/{target}, {HIDDEN[target]}{how}")
    for top in (lib, os.path.join(root, "tools")):
        if not os.path.isdir(top):
            continue
        for path in sources(top):
            rel = os.path.relpath(path, lib)
            if layer_of(rel) in RECORD_HOMES or rel in PENDING:
                continue
            shown = os.path.relpath(path, root)
            code = code_of(read(path)).split("\n")
            for i, text in enumerate(code, 1):
                m = RECORD.search(text)
                if m:
                    problems.append(f"{shown}:{i}: reads a manager record ({m.group(0).strip()}); "
                                    f"use lib/{NARROW}")
    # the manager calls nothing that ops defines
    ops = set()
    for path in sources(os.path.join(lib, "ops")):
        if path.endswith(".c"):
            ops |= set(DEFINITION.findall(code_of(read(path))))
    if ops:
        call = re.compile(r"\b(" + "|".join(sorted(ops)) + r")\s*\(")
        for path in sources(os.path.join(lib, "manager")):
            rel = os.path.relpath(path, lib)
            for i, text in enumerate(code_of(read(path)).split("\n"), 1):
                m = call.search(text)
                if m:
                    problems.append(f"lib/{rel}:{i}: the manager calls {m.group(1)}, which ops "
                                    "defines")
    return problems


# Planted violations: (what, file under the copy, text appended, words the
# report must hold).
PLANTS = [
    ("an upward include", "lib/base/dtype.c", '\n#include "../manager/core.h"\n',
     ("base/dtype.c", "manager")),
    ("io including the manager's core.h", "lib/io/json.c", '\n#include "../manager/core.h"\n',
     ("io/json.c", "core.h")),
    ("io reaching the registry through a header", "lib/io/json.h",
     '\n#include "../ops/dispatch.h"\n', ("io/json.c", "dispatch.h")),
    ("nn including a backend header", "lib/nn/dataset.c", '\n#include "../backends/backend.h"\n',
     ("nn/dataset.c", "backends/backend.h")),
    ("a record read in io", "lib/io/json.c",
     "\nstatic int planted(struct ndm__array *r) { return r != 0; }\n", ("io/json.c", "record")),
    ("a storage read in dist", "lib/dist/report.c",
     "\nstatic int planted(const void *p) { return ((const struct s *)p)->storage != 0; }\n",
     ("dist/report.c", "->storage")),
    ("the manager calling ops", "lib/manager/tree.c",
     "\nvoid planted(void); void planted(void) { (void)ndm_alias_to_at(0, 0, 0, "
     "(ndm_manager){0}, (ndm_array){0}); }\n", ("manager/tree.c", "ndm_alias_to_at")),
]


def self_test(root):
    """Each violation planted in a copy of the tree must be reported (the
    tree's own state is the other test's business)."""
    failed = 0
    for what, victim, text, words in PLANTS:
        tmp = tempfile.mkdtemp()
        try:
            shutil.copytree(os.path.join(root, "lib"), os.path.join(tmp, "lib"))
            before = set(check(tmp))
            with open(os.path.join(tmp, victim), "a") as f:
                f.write(text)
            found = [p for p in check(tmp) if p not in before]
            hit = [p for p in found if all(w in p for w in words)]
            if hit:
                print(f"self-test: {what} is caught: {hit[0]}")
            else:
                print(f"self-test: {what} was not caught")
                failed = 1
        finally:
            shutil.rmtree(tmp)
    return failed


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
        print(f"{len(problems)} problem(s) break the layering")
        return 1
    print("layering holds: every include of lib/ points at its own layer or one below; "
          "above ops, no record read and no path around lib/ops/inner.h; the manager calls "
          "nothing in ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
