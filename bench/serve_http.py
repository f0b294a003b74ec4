#!/usr/bin/env python3
"""The cost of HTTP: ndm-serve under wrk (keep-alive, one Fashion image per
request) at a fixed concurrency of 1, 8 and 64 connections, batching off
and on, beside the in-process predictor (`ndm-fashion serve`: the same
model, as many threads as connections) measured in the same run,
interleaved. Prints throughput and p50/p99 latency, medians of --runs.

    serve_http.py --serve build/tools/ndm-serve --fashion build/tools/ndm-fashion [--quick] [--json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from serve_util import Server, image_json, need_data, test_images, train  # noqa: E402

LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve",
                   "predict.lua")


def seconds(text):
    m = re.match(r"([\d.]+)(us|ms|s)$", text)
    v = float(m.group(1))
    return v * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def wrk(port, conns, duration, body):
    r = subprocess.run(["wrk", "-t%d" % min(conns, 2), "-c%d" % conns, "-d%ds" % duration,
                        "--timeout", "10s", "--latency", "-s", LUA,
                        "http://127.0.0.1:%d/v1/predict" % port],
                       capture_output=True, text=True, env=dict(os.environ, NDM_SERVE_BODY=body),
                       check=True)
    out = r.stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError("wrk saw errors:\n" + out)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = seconds(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = seconds(re.search(r"\s99%\s+(\S+)", out).group(1))
    return rps, p50, p99


def in_process(fashion, model, threads, requests):
    r = subprocess.run([fashion, "serve", "--model", model, "--threads", str(threads),
                        "--requests", str(requests)], capture_output=True, text=True, check=True)
    m = re.search(r"throughput (\d+) requests/s; latency p50 ([\d.]+) us, p99 ([\d.]+) us",
                  r.stdout)
    return float(m.group(1)), float(m.group(2)) * 1e-6, float(m.group(3)) * 1e-6


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--fashion", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3, help="wrk's duration per point")
    ap.add_argument("--http-threads", type=int, default=0, help="ndm-serve --http-threads")
    ap.add_argument("--batch", type=int, default=32, help="ndm-serve --batch when batching")
    ap.add_argument("--max-delay-us", type=int, default=100)
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--cnn", action="store_true", help="the CNN (a heavier forward pass)")
    ap.add_argument("--quick", action="store_true", help="one run of 1 s per point")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.seconds = 1, 1
    need_data()
    if not shutil.which("wrk"):
        print("wrk is not installed (Debian's wrk): skipped")
        sys.exit(77)
    tmp = tempfile.mkdtemp()
    try:
        run(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, tmp):
    model = train(a.fashion, os.path.join(tmp, "model.safetensors"), limit=6000, cnn=a.cnn)
    body = os.path.join(tmp, "body.json")
    with open(body, "w") as f:
        json.dump({"inputs": [image_json(test_images(1)[0])]}, f)
    conc = [int(c) for c in a.concurrency.split(",")]
    common = ["--http-threads", a.http_threads]
    off = Server(a.serve, model, *common, tmp=tmp)
    on = Server(a.serve, model, *common, "--batch", a.batch, "--max-delay-us", a.max_delay_us,
                tmp=tmp)
    results = {c: {"in-process": [], "http": [], "http+batch": []} for c in conc}
    before = uptime()
    try:
        for _ in range(a.runs):
            for c in conc:
                # in-process first: its request count sized to about the same time
                rps_guess = max(results[c]["in-process"][-1][0], 1000) if results[c]["in-process"] else 20000
                results[c]["in-process"].append(
                    in_process(a.fashion, model, c, int(rps_guess * a.seconds)))
                results[c]["http"].append(wrk(off.port, c, a.seconds, body))
                results[c]["http+batch"].append(wrk(on.port, c, a.seconds, body))
    finally:
        off.kill()
        on.kill()
    after = uptime()

    def med(c, k, i):
        return statistics.median(r[i] for r in results[c][k])

    if a.json:
        out = {}
        for c in conc:
            anchor = med(c, "in-process", 0)
            for k, name in (("http", "http"), ("http+batch", "http_batched")):
                v = med(c, k, 0)
                out["%s_requests_per_s_c%d_vs_in_process" % (name, c)] = {
                    "value": v, "unit": "requests/s",
                    "anchor": "the in-process predictor (ndm-fashion serve), %d threads" % c,
                    "anchor_value": anchor, "ratio": v / anchor}
                for i, p in ((1, "p50"), (2, "p99")):
                    v = med(c, k, i)
                    an = med(c, "in-process", i)
                    out["%s_%s_s_c%d_vs_in_process" % (name, p, c)] = {
                        "value": v, "unit": "s",
                        "anchor": "the in-process predictor's %s, %d threads" % (p, c),
                        "anchor_value": an, "ratio": v / an}
        print(json.dumps(out))
        return
    print("ndm-serve over HTTP (wrk, keep-alive, 1 image per request, %s) beside the in-process"
          % ("CNN" if a.cnn else "MLP"))
    print("predictor (ndm-fashion serve); medians of %d runs of %d s; --http-threads %d "
          "(%s); batching: --batch %d --max-delay-us %d"
          % (a.runs, a.seconds, a.http_threads,
             "a thread per connection" if a.http_threads == 0 else "a pool",
             a.batch, a.max_delay_us))
    print("uptime before: " + before)
    print("%-5s | %-28s | %-36s | %-36s" % ("conns", "in-process req/s  p50  p99",
                                            "HTTP req/s (ratio)  p50  p99",
                                            "HTTP+batch req/s (ratio)  p50  p99"))
    for c in conc:
        ip = med(c, "in-process", 0)
        row = "%-5d | %8.0f %7.0fus %7.0fus" % (c, ip, 1e6 * med(c, "in-process", 1),
                                                1e6 * med(c, "in-process", 2))
        for k in ("http", "http+batch"):
            v = med(c, k, 0)
            row += " | %8.0f (%.2f) %7.0fus %7.0fus" % (v, v / ip, 1e6 * med(c, k, 1),
                                                       1e6 * med(c, k, 2))
        print(row)
    print("uptime after:  " + after)


if __name__ == "__main__":
    main()
