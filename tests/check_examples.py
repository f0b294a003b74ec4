#!/usr/bin/env python3
"""The README's C blocks and the programs under examples/: the README shows
each example file verbatim and what it prints; an example's run must print
exactly that (or examples/NAME.out for those the README does not show).

  check_examples.py readme README.md EXAMPLES_DIR
      every ```c block is preceded by <!-- example: examples/NAME.c --> and
      equals that file; every example named has its program in EXAMPLES_DIR;
      every relative link of the README and of the pages it links to names
      a file that exists (and, with #anchor, one of its headings)
  check_examples.py run NAME EXAMPLE_BIN README.md EXAMPLES_DIR [options]
      runs the program in a fresh folder ({tmp} in --args is that folder)
      and compares its stdout with the README's <!-- output: examples/NAME -->
      block, else with EXAMPLES_DIR/NAME.out; options (see --help) set its
      environment, the exit status and stderr text it must give, and a
      command to run after it

  check_examples.py demo README.md FASHION_EXE [DATA_DIR]
      the block after <!-- demo: ndm-fashion --> shows lines of what the
      quick start's `bash tools/run.sh demo` prints; a short run of the same
      commands (train on 1200 examples for 3 epochs, serve 400 requests,
      leak-demo) must print each of them: the same words, names and
      file:line sites, any number where the block shows a number other than
      0 (a 0 is a promise: no errors, no live arrays). A line "..." stands
      for lines left out. Without DATA_DIR's files, only leak-demo runs and
      only the lines naming a source line are checked.

With NDM_EXAMPLES_UPDATE=1 in the environment, a run whose output differs
rewrites the README block or NAME.out with what the program printed (for a
change that alters dumps or messages on purpose; review the diff).

Exit status: 0 ok, 1 a difference (printed as a diff), 77 skipped.
"""
import difflib
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(example|output|demo):\s*(\S+)\s*-->\s*$")


def blocks(path):
    """(language, text, marker or None, first line) for each fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i, mark = [], 0, None
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            mark = (m.group(1), m.group(2))
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            lang, start = f.group(1), i + 1
            j = start
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            out.append((lang, "\n".join(lines[start:j]) + "\n", mark, start))
            mark = None
            i = j + 1
            continue
        if lines[i].strip():
            mark = None  # a marker applies to the block right after it
        i += 1
    return out


def diff(want, got, wname, gname):
    sys.stdout.writelines(difflib.unified_diff(
        want.splitlines(True), got.splitlines(True), wname, gname))


def check_readme(readme, src_dir):
    root = os.path.dirname(os.path.abspath(readme))
    bad = 0
    seen = 0
    for lang, text, mark, line in blocks(readme):
        if lang != "c":
            continue
        seen += 1
        if not mark or mark[0] != "example":
            print(f"{readme}:{line}: a C block without <!-- example: examples/NAME.c --> "
                  "before it; every C block must be an example the tests run")
            bad += 1
            continue
        path = os.path.join(root, mark[1])
        if not os.path.isfile(path):
            print(f"{readme}:{line}: {mark[1]} does not exist")
            bad += 1
            continue
        have = open(path, encoding="utf-8").read()
        if have != text:
            print(f"{readme}:{line}: the block differs from {mark[1]}:")
            diff(have, text, mark[1], "README.md")
            bad += 1
    if seen == 0:
        print(f"{readme}: no C block found")
        bad += 1
    bad += check_links(readme)
    print(f"{seen} C blocks checked against examples/")
    return 1 if bad else 0


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^#+\s+(.*?)\s*(\{#[^}]*\})?\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def check_links(readme):
    """Every relative link of the README, and of the Markdown pages it links
    to, names a file that exists (and a heading there, for #anchor)."""
    bad, seen, todo = 0, set(), [os.path.abspath(readme)]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        in_code = False
        for n, line in enumerate(open(page, encoding="utf-8"), 1):
            if FENCE.match(line):
                in_code = not in_code
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # a URL
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                where = f"{os.path.relpath(page)}:{n}"
                if not os.path.exists(dest):
                    print(f"{where}: the link {target} names no file")
                    bad += 1
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    print(f"{where}: the link {target} names no heading of {os.path.basename(dest)}")
                    bad += 1
                if dest.endswith(".md"):
                    todo.append(dest)
    print(f"links of {len(seen)} Markdown pages checked")
    return bad


def expected_output(name, readme, src_dir):
    for lang, text, mark, line in blocks(readme):
        if mark and mark[0] == "output" and mark[1] == f"examples/{name}":
            return text, f"README.md:{line}"
    path = os.path.join(src_dir, name + ".out")
    if os.path.isfile(path):
        return open(path, encoding="utf-8").read(), path
    return None, None


def update(where, readme, want, got):
    """Write `got` where `want` was shown: README.md:LINE (a block's first
    line) or an .out file."""
    path, _, line = where.rpartition(":")
    if path.endswith("README.md") and line.isdigit():
        path = readme
        lines = open(path, encoding="utf-8").read().split("\n")
        start, n = int(line), len(want.split("\n")) - 1
        lines[start:start + n] = got.rstrip("\n").split("\n")
        open(path, "w", encoding="utf-8").write("\n".join(lines))
    else:
        open(where, "w", encoding="utf-8").write(got)
    print(f"updated {where}")


def run(o):
    for path in o.needs:
        if not os.path.exists(path):
            print(f"{path} is not there (dataset-fashion-mnist is not installed): skipped")
            return 77
    want, where = None, None
    if o.stdout:
        want, where = expected_output(o.name, o.readme, o.examples)
        if want is None:
            print(f"no expected output for {o.name}: neither the README nor {o.name}.out")
            return 1
    env = dict(os.environ)
    env.pop("NDM_LOG_ERRORS", None)
    for kv in o.env:
        k, _, v = kv.partition("=")
        env[k] = v
    with tempfile.TemporaryDirectory() as tmp:
        # meson gives the programs' paths relative to the build folder
        argv = [os.path.abspath(o.exe)] + [a.replace("{tmp}", tmp) for a in o.args]
        if o.then and os.path.exists(o.then[0]):
            o.then[0] = os.path.abspath(o.then[0])
        p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != o.rc:
            print(f"{o.name} exited with {p.returncode}, not {o.rc}; stdout:\n{p.stdout}"
                  f"stderr:\n{p.stderr}")
            return 1
        for text in o.stderr_has:
            if text not in p.stderr:
                print(f"{o.name}: stderr lacks {text!r}; it was:\n{p.stderr}")
                return 1
        if o.stderr_empty and p.stderr:
            print(f"{o.name}: stderr should be empty; it was:\n{p.stderr}")
            return 1
        if want is not None and p.stdout != want:
            sys.stdout.write(p.stderr)
            print(f"{o.name} printed something else than {where} shows:")
            diff(want, p.stdout, where, o.name)
            if os.environ.get("NDM_EXAMPLES_UPDATE") == "1":
                update(where, o.readme, want, p.stdout)
            return 1
        if o.then:
            q = subprocess.run(o.then, cwd=tmp, capture_output=True, text=True, timeout=300)
            if q.returncode != 0:
                print(f"{' '.join(o.then)} exited with {q.returncode}:\n{q.stdout}{q.stderr}")
                return 1
            for f in o.then_makes:
                path = os.path.join(tmp, f)
                if not os.path.isfile(path) or os.path.getsize(path) == 0:
                    print(f"{' '.join(o.then)} did not write {f}")
                    return 1
    print(f"{o.name}: exit status {o.rc}" + (f", output as {where} shows" if where else ""))
    return 0


# A source site (fashion.c:923) is compared as written; any other number
# matches any number, except 0, which must stay 0.
SITE = re.compile(r"[A-Za-z_][\w.-]*\.(?:c|h|cpp):\d+")
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def line_pattern(line):
    out, pos = [], 0
    text = line.strip()
    while pos < len(text):
        m = SITE.match(text, pos)
        if m:
            out.append(re.escape(m.group(0)))
            pos = m.end()
            continue
        m = NUMBER.match(text, pos)
        if m and (pos == 0 or not (text[pos - 1].isalnum() or text[pos - 1] == "_")):
            out.append(r"0" if m.group(0) == "0" else r"[+-]?\d+(?:\.\d+)?")
            pos = m.end()
            continue
        if text[pos].isspace():
            while pos < len(text) and text[pos].isspace():
                pos += 1
            out.append(r"\s+")
            continue
        out.append(re.escape(text[pos]))
        pos += 1
    return re.compile("".join(out) + "$")


def check_demo(readme, exe, data):
    exe = os.path.abspath(exe)
    have_data = bool(data) and os.path.isfile(os.path.join(data, "train-images-idx3-ubyte.gz"))
    model = os.path.join("build-release", "fashion-model.safetensors")  # as run.sh names it
    runs = [[exe, "leak-demo"]]
    if have_data:
        runs = [[exe, "train", "--data", data, "--limit", "1200", "--epochs", "3", "--quiet",
                 "--out", model],
                [exe, "serve", "--data", data, "--model", model, "--requests", "400",
                 "--threads", "2"]] + runs
    return check_demo_block(readme, "ndm-fashion", runs, have_data, f"no Fashion-MNIST in {data}")


def check_text_demo(readme, exe, data):
    """ndm-text's block: a small model trained briefly on part of the corpus,
    then served from two threads."""
    exe = os.path.abspath(exe)
    have_data = os.path.isfile(os.path.join(data, "computers"))
    model = os.path.join("build-release", "text-model.safetensors")  # as run.sh names it
    runs = [[exe, "train", "--data", data, "--layers", "2", "--width", "64", "--ctx", "64",
             "--steps", "12", "--epochs", "3", "--limit", "200000", "--val-windows", "32",
             "--quiet", "--out", model],
            [exe, "generate", "--model", model, "--requests", "4", "--threads", "2",
             "--tokens", "30", "--dump", "--quiet"]]
    if not have_data:
        print(f"no fortune files in {data}: skipped")
        return 77
    return check_demo_block(readme, "ndm-text", runs, True, "")


def check_demo_block(readme, name, runs, have_data, why):
    shown = [(text, line) for lang, text, mark, line in blocks(readme)
             if mark and mark[0] == "demo" and mark[1] == name]
    if len(shown) != 1:
        print(f"{readme}: {len(shown)} blocks after <!-- demo: {name} -->, not 1")
        return 1
    text, first = shown[0]
    env = dict(os.environ, NDM_LEAK_REPORT="1")
    env.pop("NDM_LOG_ERRORS", None)
    printed = []
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "build-release"))
        for argv in runs:
            p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True,
                               timeout=300)
            if p.returncode != 0:
                print(f"{' '.join(argv[1:])} exited with {p.returncode}:\n{p.stdout}{p.stderr}")
                return 1
            printed += (p.stdout + p.stderr).splitlines()
    printed = [l.strip() for l in printed]
    bad = checked = skipped = 0
    for i, want in enumerate(text.split("\n")):
        if not want.strip() or want.strip() == "...":
            continue
        if not have_data and not SITE.search(want):
            skipped += 1
            continue
        checked += 1
        pat = line_pattern(want)
        if not any(pat.match(got) for got in printed):
            near = difflib.get_close_matches(want.strip(), printed, n=1, cutoff=0.3)
            print(f"{readme}:{first + i}: the demo prints no line like\n    {want.strip()}\n"
                  f"  nearest: {near[0] if near else '(none)'}")
            bad += 1
    print(f"{checked} lines of the {name} demo block checked against a short run"
          + (f"; {skipped} left out ({why})" if skipped else ""))
    return 1 if bad else 0


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "demo":
        return check_demo(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    if len(sys.argv) >= 5 and sys.argv[1] == "demo-text":
        return check_text_demo(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) >= 4 and sys.argv[1] == "readme":
        return check_readme(sys.argv[2], sys.argv[3])
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        import argparse
        ap = argparse.ArgumentParser()
        ap.add_argument("name")
        ap.add_argument("exe")
        ap.add_argument("readme")
        ap.add_argument("examples")
        ap.add_argument("--needs", action="append", default=[],
                        help="a file without which the test is skipped")
        ap.add_argument("--env", action="append", default=[], help="K=V for the program")
        ap.add_argument("--rc", type=int, default=0, help="the exit status it must give")
        ap.add_argument("--no-stdout", dest="stdout", action="store_false",
                        help="do not compare stdout")
        ap.add_argument("--stderr-has", action="append", default=[])
        ap.add_argument("--stderr-empty", action="store_true")
        ap.add_argument("--then", nargs="+", default=[],
                        help="a command run after it in the same folder (last option)")
        ap.add_argument("--then-makes", action="append", default=[],
                        help="a file the --then command must write")
        ap.add_argument("--args", nargs="*", default=[], help="the program's arguments")
        return run(ap.parse_args(sys.argv[2:]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
