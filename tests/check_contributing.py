#!/usr/bin/env python3
"""CONTRIBUTING.md's walkthroughs, made in a scratch copy of the tree, built
and run: each walkthrough's edits apply where the text says, the library
builds with all of them made, and each walkthrough's check program (a user of
the new operation, layer, policy or member) runs and exits 0.

    check_contributing.py SOURCE_ROOT [--list]
    check_contributing.py --self-test      a missing anchor, a fifth file and a
                                           failing check program are caught

A walkthrough is the fenced blocks of CONTRIBUTING.md preceded by a marker:

    <!-- walkthrough NAME: PATH after "TEXT" -->   the block goes after the
                                                   first line holding TEXT
    <!-- walkthrough NAME: PATH before "TEXT" -->  ... before that line
    <!-- walkthrough NAME: PATH new -->            the block is a new file
    <!-- walkthrough NAME: check -->               the program that uses it

The files a walkthrough touches are the PATHs of its markers; the target is
at most four, and the count printed here is the one the guide states.
--list prints the walkthroughs and their files without building.

Exit status: 0 ok, 1 a failure (an anchor not found, a build or a check
that failed, a walkthrough over four files), 77 skipped (no meson/ninja).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

MARK = re.compile(r'^<!--\s*walkthrough\s+([\w-]+):\s*(\S+)(?:\s+(after|before|new)(?:\s+"([^"]*)")?)?\s*-->\s*$')
FENCE = re.compile(r"^```(\w*)\s*$")
MAX_FILES = 4
SKIP_DIRS = {".git", "subprojects"}


def walkthroughs(path):
    """{name: [(path or 'check', how, anchor, text, line)]} in file order."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = {}, 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        name, target, how, anchor = m.group(1), m.group(2), m.group(3), m.group(4)
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or not FENCE.match(lines[j]):
            raise SystemExit(f"{path}:{i + 1}: a walkthrough marker without a fenced block after it")
        k = j + 1
        while k < len(lines) and not FENCE.match(lines[k]):
            k += 1
        text = "\n".join(lines[j + 1:k]) + "\n"
        if target != "check" and how is None:
            raise SystemExit(f"{path}:{i + 1}: say after \"...\", before \"...\" or new")
        if how in ("after", "before") and not anchor:
            raise SystemExit(f"{path}:{i + 1}: {how} needs the text of a line")
        out.setdefault(name, []).append((target, how, anchor, text, i + 1))
        i = k + 1
    return out


def files_of(steps):
    return sorted({t for t, _, _, _, _ in steps if t != "check"})


def apply(root, name, target, how, anchor, text, line):
    path = os.path.join(root, target)
    if how == "new":
        if os.path.exists(path):
            raise RuntimeError(f"walkthrough {name} (line {line}): {target} exists already")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    if not os.path.isfile(path):
        raise RuntimeError(f"walkthrough {name} (line {line}): no file {target}")
    src = open(path, encoding="utf-8").read().split("\n")
    at = next((n for n, s in enumerate(src) if anchor in s), None)
    if at is None:
        raise RuntimeError(f"walkthrough {name} (line {line}): no line of {target} holds \"{anchor}\"")
    block = text.rstrip("\n").split("\n")
    src[at + 1 if how == "after" else at:at + 1 if how == "after" else at] = block
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(src))


def copy_tree(src, dst):
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or (folder == src and n.startswith("build"))]
    shutil.copytree(src, dst, ignore=ignore, symlinks=True)


def self_test():
    """The checks catch what they are for, on a planted guide (no build)."""
    with tempfile.TemporaryDirectory(prefix="ndm-walk-self-") as tmp:
        os.makedirs(os.path.join(tmp, "lib"))
        with open(os.path.join(tmp, "lib", "a.h"), "w") as f:
            f.write("one\ntwo\n")
        guide = os.path.join(tmp, "CONTRIBUTING.md")
        marks = "".join(f'<!-- walkthrough big: lib/f{i}.h new -->\n```c\nx\n```\n' for i in range(5))
        with open(guide, "w") as f:
            f.write('<!-- walkthrough w: lib/a.h after "three" -->\n```c\nx\n```\n' + marks +
                    '<!-- walkthrough big: check -->\n```c\nint main(void) { return 0; }\n```\n')
        walks = walkthroughs(guide)
        try:
            apply(tmp, "w", *walks["w"][0])
            print("self-test FAIL: a missing anchor was applied")
            return 1
        except RuntimeError as e:
            print(f"caught: {e}")
        apply(tmp, "w", "lib/a.h", "after", "one", "between\n", 1)
        if open(os.path.join(tmp, "lib", "a.h")).read() != "one\nbetween\ntwo\n":
            print("self-test FAIL: an edit after a line went elsewhere")
            return 1
        if main(["check_contributing.py", tmp, "--list"]) != 1:
            print("self-test FAIL: a walkthrough of five files and one without a check passed")
            return 1
    print("self-test ok")
    return 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    if len(argv) < 2:
        print(__doc__)
        return 1
    root = os.path.abspath(argv[1])
    walks = walkthroughs(os.path.join(root, "CONTRIBUTING.md"))
    if not walks:
        print("CONTRIBUTING.md has no walkthrough")
        return 1
    bad = 0
    for name, steps in walks.items():
        files = files_of(steps)
        checks = sum(1 for t, *_ in steps if t == "check")
        print(f"{name}: {len(files)} files: {', '.join(files)}")
        if len(files) > MAX_FILES:
            print(f"  FAIL: {name} touches {len(files)} files (at most {MAX_FILES})")
            bad = 1
        if checks != 1:
            print(f"  FAIL: {name} has {checks} check programs (one wanted)")
            bad = 1
    if "--list" in argv or bad:
        return bad
    if not shutil.which("meson") or not shutil.which("ninja"):
        print("SKIP: meson and ninja are needed to build the scratch copy")
        return 77
    with tempfile.TemporaryDirectory(prefix="ndm-walk-") as tmp:
        tmp = os.environ.get("NDM_WALKTHROUGH_DIR") or tmp  # kept there, to look into
        tree = os.path.join(tmp, "src")
        copy_tree(root, tree)
        checks = []
        try:
            for name, steps in walks.items():
                for target, how, anchor, text, line in steps:
                    if target == "check":
                        rel = f"walkthrough/{name}.c"
                        apply(tree, name, rel, "new", None, text, line)
                        checks.append(name)
                    else:
                        apply(tree, name, target, how, anchor, text, line)
        except RuntimeError as e:
            print(f"FAIL: {e}")
            return 1
        with open(os.path.join(tree, "walkthrough", "meson.build"), "w") as f:
            for name in checks:
                f.write(f"executable('walk_{name}', '{name}.c', dependencies: [ndm_core_dep])\n")
        with open(os.path.join(tree, "meson.build"), "a") as f:
            f.write("\nsubdir('walkthrough')\n")
        build = os.path.join(tmp, "build")
        setup = ["meson", "setup", build, tree, "-Dcuda=disabled", "-Dtests=disabled",
                 "-Dtools=false", "-Dbench=false", "-Dmpi=disabled", "-Dnccl=disabled",
                 "-Dbuildtype=debug", "-Doptimization=0"]
        for cmd in (setup, ["ninja", "-C", build]):
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                print(r.stdout[-6000:])
                print(f"FAIL: {' '.join(cmd[:2])} of the scratch copy with every walkthrough made")
                return 1
        for name in checks:
            exe = os.path.join(build, "walkthrough", f"walk_{name}")
            r = subprocess.run([exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=120)
            print(f"{name}: check exits {r.returncode}")
            if r.returncode != 0:
                print(r.stdout[-4000:])
                bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv))
