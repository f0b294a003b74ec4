#!/usr/bin/env python3
"""The shape of lib/: its layers with their lines, the arrows between layers
(file A includes B, or calls a function that B alone defines), the arrows
that run back up the layer order (DESIGN.md, "Layers, one way down"), and the
circles: rooms that reach each other through such arrows (a room is a source
with its header: lib/io/json.c and lib/io/json.h are one).

    python3 tools/house.py [SOURCE_ROOT]

The layer order is the one tests/check_layers.py checks. Calls are found by
name (a word followed by "(" outside comments and strings that names a
function defined, not static, in exactly one other file), so a macro that
makes a call is seen where it is used.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import check_layers  # noqa: E402  (the layer table lives there)

# Lowest first: a layer may use those before it (check_layers.LAYERS).
ORDER = ["base", "manager/alloc", "backends", "manager", "ops", "io", "nn", "interop", "dist"]
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
# A definition: a name and its parameter list at the start of a line (after
# its return type), then the body's brace; `static` ones stay in their file.
DEFINE = re.compile(r"^([A-Za-z_][\w \t\*]*?)\b([A-Za-z_]\w*)\s*\(([^;{}]*?)\)\s*\{", re.M)
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
CALLERS = {"return", "else", "case", "do"}  # words a call may follow
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "_Alignof",
            "_Static_assert", "__attribute__", "__typeof__", "typeof"}


def sources(root):
    lib = os.path.join(root, "lib")
    for dirpath, _, files in os.walk(lib):
        for name in sorted(files):
            if name.endswith(SOURCES):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, lib), path


def read(root):
    files = {}
    for rel, path in sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        files[rel] = (text, COMMENT.sub(" ", text))
    return files


def arrows(files):
    """{(a, b)} of file arrows: a includes b, or a calls what b alone defines."""
    defined = {}
    for rel, (_, code) in files.items():
        for m in DEFINE.finditer(code):
            head, name = m.group(1), m.group(2)
            if name in KEYWORDS or "static" in head.split():
                continue
            defined.setdefault(name, set()).add(rel)
    out = set()
    for rel, (text, code) in files.items():
        for m in INCLUDE.finditer(text):
            target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
            if target in files and target != rel:
                out.add((rel, target))
        for m in CALL.finditer(code):
            before = code[code.rfind("\n", 0, m.start()) + 1:m.start()].rstrip()
            word = re.search(r"(\w+)$", before)
            if before.endswith("*") or (word and word.group(1) not in CALLERS):
                continue  # `type name(`: a declaration or a definition, not a call
            where = defined.get(m.group(1))
            if where and len(where) == 1:
                (target,) = where
                if target != rel:
                    out.add((rel, target))
    return out


def circles(nodes, edges):
    """The strongly connected sets of two files or more (Tarjan, iterative)."""
    succ = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(succ[nxt])))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return sorted(out, key=len, reverse=True)


def main():
    root = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    files = read(root)
    layer = {rel: check_layers.layer_of(rel) for rel in files}
    edges = arrows(files)
    rank = {name: i for i, name in enumerate(ORDER)}
    print("layers, top first (lines):")
    for name in reversed(ORDER):
        mine = [r for r in files if layer[r] == name]
        lines = sum(files[r][0].count("\n") for r in mine)
        print(f"  {name:14} {len(mine):3} files {lines:6} lines")
    between = {}
    for a, b in edges:
        la, lb = layer[a], layer[b]
        if la and lb and la != lb:
            between.setdefault((la, lb), []).append((a, b))
    print("arrows between layers (files):")
    for (la, lb), pairs in sorted(between.items(), key=lambda kv: (rank[kv[0][0]], rank[kv[0][1]])):
        up = " BACK UP" if rank[lb] > rank[la] else ""
        print(f"  {la:14} -> {lb:14} {len(pairs):4}{up}")
    ups = sorted(p for (la, lb), pairs in between.items() if rank[lb] > rank[la] for p in pairs)
    print(f"arrows that run back up: {len(ups)}")
    for a, b in ups:
        print(f"  lib/{a} -> lib/{b}")
    room = {rel: os.path.splitext(rel)[0] for rel in files}
    room_edges = {(room[a], room[b]) for a, b in edges if room[a] != room[b]}
    found = circles(sorted(set(room.values())), room_edges)
    layer.update({room[r]: layer[r] for r in files})
    print(f"circles: {len(found)}")
    for comp in found:
        layers = sorted({layer[r] for r in comp}, key=lambda n: rank.get(n, -1))
        print(f"  {len(comp)} files over {', '.join(layers)}: {', '.join(comp[:8])}"
              + (" ..." if len(comp) > 8 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
