#!/usr/bin/env python3
"""ndm-serve under a long load: 64 keep-alive connections, 1% malformed
requests, 1% clients that hang up in the middle of their body, a reload
after the warm-up and another near the end. Checks: every well-formed
request answered 200, every malformed one 400, the server's counts equal
the clients', no crash, resident memory flat after the warm-up (< 1%), and
after SIGTERM an exit of 0 with an empty leak report.

    serve_soak.py --serve build/tools/ndm-serve --fashion build/tools/ndm-fashion [--seconds 120]
"""
import argparse
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from serve_util import (Server, expect_clean_exit, fail, image_json, need_data, predicted,  # noqa: E402
                        test_images, train)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--fashion", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--batch", type=int, default=0, help="ndm-serve --batch (0: off)")
    ap.add_argument("--no-rss", action="store_true",
                    help="leave out the resident-memory check (a sanitizer's quarantine grows it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    need_data()
    tmp = tempfile.mkdtemp()
    try:
        run(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, tmp):
    m1 = train(a.fashion, os.path.join(tmp, "a.safetensors"), seed=1)
    m2 = train(a.fashion, os.path.join(tmp, "b.safetensors"), seed=2)
    args = ["--batch", a.batch, "--max-delay-us", 200] if a.batch else []
    srv = Server(a.serve, m1, *args, tmp=tmp)
    imgs = test_images(16)
    bodies = [json.dumps({"inputs": [image_json(i)]}).encode() for i in imgs]
    bad_bodies = [b'{"inputs": [[1, 2, 3]]}', b"[1, 2", b'{"inputs": [' + b"0," * 700 + b"]}"]
    stop = threading.Event()
    lock = threading.Lock()
    tally = {"good": 0, "answered": 0, "malformed": 0, "malformed_400": 0, "hangups": 0}
    problems = []

    def note(msg):
        with lock:
            if len(problems) < 20:
                problems.append(msg)

    def client(seed):
        rng = random.Random(seed)
        conn = srv.conn()
        good = answered = malformed = m400 = hangups = 0
        while not stop.is_set():
            r = rng.random()
            try:
                if r < 0.01:
                    malformed += 1
                    st, body = srv.predict(rng.choice(bad_bodies), conn=conn)
                    m400 += st == 400
                    if st != 400:
                        note("a malformed body got %d: %s" % (st, body[:200]))
                elif r < 0.02:
                    # a client that sends half its body and hangs up
                    hangups += 1
                    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                    body = rng.choice(bodies)
                    s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                              b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                              + body[:len(body) // 2])
                    s.close()
                else:
                    good += 1
                    st, body = srv.predict(rng.choice(bodies), conn=conn)
                    if st == 200 and len(json.loads(body)["predictions"]) == 1:
                        answered += 1
                    else:
                        note("a well-formed request got %d: %s" % (st, body[:200]))
            except Exception as e:  # noqa: BLE001
                note("a request failed: %r" % e)
                conn.close()
                conn = srv.conn()
        conn.close()
        with lock:
            for k, v in (("good", good), ("answered", answered), ("malformed", malformed),
                         ("malformed_400", m400), ("hangups", hangups)):
                tally[k] += v

    ths = [threading.Thread(target=client, args=(i,)) for i in range(a.connections)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
    warm = min(5.0, a.seconds / 4)

    def reload(path):
        st, body = srv.request("POST", "/admin/reload?model=%s" % path)
        if st != 200:
            note("reload: %d %s" % (st, body))

    # warm-up, with a reload in it (the allocator has then cached for two models)
    time.sleep(warm / 2)
    reload(m2)
    time.sleep(warm / 2)
    rss0 = srv.rss_kib()
    time.sleep(max(0.0, a.seconds * 0.8 - (time.monotonic() - t0)))
    reload(m1)
    time.sleep(max(0.0, a.seconds - (time.monotonic() - t0)))
    stop.set()
    for t in ths:
        t.join()
    elapsed = time.monotonic() - t0
    alive = srv.p.poll() is None
    rss1 = srv.rss_kib() if alive else 0
    m = srv.metrics() if alive else {}
    growth = (rss1 - rss0) / rss0 if rss0 else 1.0
    res = dict(tally, seconds=round(elapsed, 1), rss0_kib=rss0, rss1_kib=rss1,
               rss_growth_pct=round(100 * growth, 3),
               server_200=predicted(m, 200), server_400=predicted(m, 400),
               server_other_errors=sum(v for k, v in m.items()
                                       if k.startswith("ndm_serve_errors_total")
                                       and 'status="400"' not in k),
               reloads=int(m.get('ndm_serve_reloads_total{result="ok"}', 0)))
    if alive:
        out, err = expect_clean_exit(srv)
        res["leak_report"] = "nothing alive" if "ndm leak report: nothing alive" in err else err
        res["exit"] = 0
    if a.json:
        print(json.dumps(res))
    else:
        print("soak: %(seconds)ss, %(good)d well-formed requests (%(answered)d answered 200), "
              "%(malformed)d malformed (%(malformed_400)d answered 400), %(hangups)d hang-ups, "
              "%(reloads)d reloads; RSS %(rss0_kib)d -> %(rss1_kib)d KiB (%(rss_growth_pct)+.3f%%); "
              "the server counts %(server_200)d 200s, %(server_400)d 400s, "
              "%(server_other_errors)d other errors" % res)
    if not alive:
        fail("ndm-serve died: %s" % srv.stderr())
    if problems:
        fail("%d problems, the first: %s" % (len(problems), problems[0]))
    if tally["answered"] != tally["good"] or res["server_200"] != tally["good"]:
        fail("well-formed %d, answered %d, the server counts %d" %
             (tally["good"], tally["answered"], res["server_200"]))
    if tally["malformed_400"] != tally["malformed"] or res["server_400"] != tally["malformed"]:
        fail("malformed %d, answered 400 %d, the server counts %d" %
             (tally["malformed"], tally["malformed_400"], res["server_400"]))
    if res["server_other_errors"]:
        fail("the server answered %d other errors" % res["server_other_errors"])
    if a.no_rss:
        print("the resident-memory check is left out (--no-rss: a sanitizer build)")
    elif growth >= 0.01:
        fail("resident memory grew by %.2f%% after the warm-up" % (100 * growth))
    print("ok")


if __name__ == "__main__":
    main()
