#!/usr/bin/env python3
"""docs/leak-hunting.md quotes what the leak corpus prints: every line of its
output blocks (fenced blocks without a language, "..." aside) must be a line
that the corpus prints with NDM_CORPUS_PRINT=1, and every site it names in
its prose ("test_leak_corpus.c:N (func)") one that the corpus prints, so the
guide's outputs stay real when the corpus or the tools change.

  check_leak_guide.py CORPUS_BIN GUIDE
"""
import os
import re
import subprocess
import sys


def quoted_lines(guide):
    """(line number, text) of each line of the guide's output blocks."""
    out, block = [], None
    with open(guide, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("```"):
                block = None if block is not None else line[3:].strip()
                continue
            if block == "" and line.strip() not in ("", "..."):
                out.append((no, line.rstrip()))
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    corpus, guide = sys.argv[1:]
    env = dict(os.environ, NDM_CORPUS_PRINT="1", NDM_LOG_ERRORS="0")
    run = subprocess.run([corpus], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout + run.stderr)
        print(f"{corpus} failed ({run.returncode})")
        return 1
    printed = set(l.rstrip() for l in run.stdout.splitlines())
    quoted = quoted_lines(guide)
    if "test_dlpack_export_never_deleted" not in run.stdout:
        # (a library built without DLPack has no DLPack case)
        quoted = [(no, l) for no, l in quoted if "dlpack" not in l.lower()]
    missing = [(no, l) for no, l in quoted if l not in printed]
    with open(guide, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            for site in re.findall(r"test_leak_corpus\.c:\d+ \(\w+\)", line):
                if site not in run.stdout:
                    missing.append((no, site))
    for no, l in missing:
        print(f"{guide}:{no}: not printed by the corpus: {l}")
    quoted = len(quoted)
    if quoted == 0:
        print(f"{guide}: no output blocks")
        return 1
    print(f"{quoted - len(missing)} of {quoted} quoted lines printed by the corpus")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
