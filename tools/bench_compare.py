#!/usr/bin/env python3
"""Before/after figures of the benchmarks under bench/, measured in one run.

    python3 tools/bench_compare.py BASE_REV [--pairs N] [--quick] [BENCH ...]

Builds release trees of BASE_REV (from `git archive`, under
build-compare/) and of the working tree, then runs each benchmark (default:
manager) with --json alternately, base then current, N times (default 7).
For every figure it prints the median before, the median after, and the
median, min and max of the pairs' after/before ratios: pairing keeps the
ratio meaningful while a shared machine's speed drifts. Lower is better
for times and higher for rates; the unit column says which.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OPTIONS = ["--buildtype=release", "-Dtests=disabled", "-Dtools=false", "-Dcuda=disabled"]


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def build(src, build_dir, benches):
    if not os.path.exists(os.path.join(build_dir, "build.ninja")):
        sh("meson", "setup", build_dir, src, *OPTIONS, stdout=subprocess.DEVNULL)
    sh("ninja", "-C", build_dir, *["bench/" + b for b in benches], stdout=subprocess.DEVNULL)


def base_tree(rev):
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    src = os.path.join(ROOT, "build-compare", "src-" + sha)
    if not os.path.isdir(src):
        os.makedirs(src)
        archive = subprocess.Popen(["git", "-C", ROOT, "archive", sha], stdout=subprocess.PIPE)
        sh("tar", "-x", "-C", src, stdin=archive.stdout)
        if archive.wait() != 0:
            sys.exit(f"git archive {rev} failed")
    return sha, src


def figures(exe, quick):
    cmd = [exe, "--json"] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    return {k: (v["value"], v.get("unit", "")) for k, v in doc.items()
            if isinstance(v, dict) and "value" in v}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("benches", nargs="*", default=["manager"])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="pass --quick to each benchmark")
    a = ap.parse_intermixed_args()
    sha, src = base_tree(a.base)
    trees = {"before": os.path.join(src, "build-rel"),
             "after": os.path.join(ROOT, "build-compare", "head")}
    build(src, trees["before"], a.benches)
    build(ROOT, trees["after"], a.benches)
    for bench in a.benches:
        runs = {"before": [], "after": []}
        for _ in range(a.pairs):
            for side in ("before", "after"):
                runs[side].append(figures(os.path.join(trees[side], "bench", bench), a.quick))
        print(f"bench/{bench}: before = {sha}, after = working tree; {a.pairs} pairs, "
              "each before then after")
        print(f"  {'figure':52s} {'unit':>6s} {'before':>10s} {'after':>10s}"
              f" {'after/before median (min..max)':>32s}")
        for key, (_, unit) in runs["before"][0].items():
            pairs = [(b[key][0], x[key][0]) for b, x in zip(runs["before"], runs["after"])
                     if key in x and b[key][0]]
            if not pairs:
                continue
            ratios = [x / b for b, x in pairs]
            print(f"  {key:52s} {unit:>6s} {statistics.median(p[0] for p in pairs):10.4g}"
                  f" {statistics.median(p[1] for p in pairs):10.4g}"
                  f"   {statistics.median(ratios):7.3f} ({min(ratios):.3f}..{max(ratios):.3f})")


if __name__ == "__main__":
    main()
