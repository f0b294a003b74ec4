"""ndm-serve's tests: `check.py MODE NDM_SERVE NDM_FASHION [WRK]`.
smoke: every endpoint and status; wrk: a short load with wrk, 0 errors and
the metrics' counts; reload: models swapped under load, every answer the old
model's or the new one's; drain: SIGTERM answers the requests in flight."""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (Server, expect_clean_exit, fail, image_json, need_data, predicted,
                        test_images, train)


def npy_bytes(dtype, shape, payload):
    """A version 1.0 .npy of C-ordered data."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        dtype, "".join("%d, " % d for d in shape))
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def logits_of(body):
    return [p["logits"] for p in json.loads(body)["predictions"]]


def smoke(serve, fashion, tmp):
    model = train(fashion, os.path.join(tmp, "mlp.safetensors"))
    srv = Server(serve, model, "--request-limit", 262144, "--max-body", 1 << 20, tmp=tmp)
    try:
        counts = {}

        def expect(status, got, what):
            counts[status] = counts.get(status, 0) + 1
            if got[0] != status:
                fail("%s: status %d, not %d: %s" % (what, got[0], status, got[1][:300]))
            if status >= 400:
                err = json.loads(got[1])
                if not err.get("error") or err.get("status") != status:
                    fail("%s: no error message in %s" % (what, got[1]))
            return got[1]

        imgs = test_images(3)
        st, body = srv.request("GET", "/healthz")
        if st != 200 or not body.startswith(b"ok generation 1"):
            fail("healthz: %d %s" % (st, body))
        # one image, as 28 x 28 lists, as 784 values, as raw float32, as .npy
        nested = expect(200, srv.predict({"inputs": [image_json(imgs[0])]}), "JSON (1, 28, 28)")
        ans = json.loads(nested)
        p = ans["predictions"]
        if ans["generation"] != 1 or len(p) != 1 or len(p[0]["logits"]) != 10:
            fail("JSON answer: %s" % nested)
        if p[0]["class"] != max(range(10), key=lambda i: p[0]["logits"][i]):
            fail("the class is not the largest logit: %s" % nested)
        flat = expect(200, srv.predict({"inputs": image_json(imgs[0], nested=False)}), "JSON (784)")
        bare = expect(200, srv.predict([image_json(imgs[0], nested=False)]), "a bare list")
        if logits_of(flat) != logits_of(nested) or logits_of(bare) != logits_of(nested):
            fail("the same image in other JSON shapes gave other logits")
        px = [v for row in image_json(imgs[0]) for v in row]
        raw = expect(200, srv.predict(struct.pack("<784f", *px), "application/octet-stream"),
                     "raw float32")
        if logits_of(raw) != logits_of(nested):
            fail("raw float32 gave other logits than JSON: %s / %s" % (raw, nested))
        npy = expect(200, srv.predict(npy_bytes("|u1", (3, 28, 28), b"".join(imgs)),
                                      "application/x-npy"), "npy uint8 (3, 28, 28)")
        ln = logits_of(npy)
        if len(ln) != 3 or max(abs(a - b) for a, b in zip(ln[0], logits_of(nested)[0])) > 1e-4:
            fail("npy pixels gave other logits than JSON: %s / %s" % (ln[0], logits_of(nested)[0]))
        npyf = expect(200, srv.predict(npy_bytes("<f4", (1, 784), struct.pack("<784f", *px)),
                                       "application/x-npy"), "npy float32 (1, 784)")
        if logits_of(npyf) != logits_of(nested):
            fail("npy float32 gave other logits than JSON")
        # malformed bodies and wrong shapes: 400 with a message
        for body, ctype, what in [
                ("[1, 2", "application/json", "JSON cut short"),
                ('{"inputs": [[1, 2, 3]]}', "application/json", "a wrong shape"),
                ('{"inputs": [[0.5] * 784]}', "application/json", "not JSON"),
                ("[[" + ",".join(["0"] * 784) + "],[0]]", "application/json", "ragged rows"),
                ('{"nothing": 1}', "application/json", "no inputs"),
                ("[]", "application/json", "no numbers"),
                (b"\x00" * 100, "application/octet-stream", "raw of 100 bytes"),
                (b"not npy", "application/x-npy", "npy without its magic"),
                (npy_bytes("<f4", (2, 10), b"\x00" * 80), "application/x-npy", "npy (2, 10)"),
                (npy_bytes("<f4", (2, 784), b"\x00" * 80), "application/x-npy", "npy cut short"),
                (npy_bytes("<f4", (), b"\x00" * 4), "application/x-npy", "npy of rank 0")]:
            expect(400, srv.predict(body, ctype), what)
        expect(415, srv.predict("x", "text/plain"), "text/plain")
        expect(404, srv.request("GET", "/nope"), "an unknown path")
        expect(404, srv.request("POST", "/v1/predict/x", "[]", "application/json"), "a deeper path")
        expect(405, srv.request("GET", "/v1/predict"), "GET /v1/predict")
        expect(405, srv.request("POST", "/metrics", "x", "text/plain"), "POST /metrics")
        expect(405, srv.request("DELETE", "/healthz"), "DELETE /healthz")
        # over --max-body: 413 before the body is read (its length says
        # so; the client waits for "100 Continue" as curl does) ...
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 2000000\r\nExpect: 100-continue\r\n\r\n")
        head = s.recv(65536).decode(errors="replace")
        s.close()
        counts[413] = counts.get(413, 0) + 1
        if not head.startswith("HTTP/1.1 413") or "max-body" not in head:
            fail("a body announced above --max-body: %r" % head[:300])
        # ... or, for a chunked body of no stated length, once it passes the limit
        c = srv.conn()
        chunks = (b"[" + b"0.5," * 50000 for _ in range(10))
        c.request("POST", "/v1/predict", body=chunks, encode_chunked=True,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        expect(413, (r.status, r.read()), "a chunked body above --max-body")
        c.close()
        # 60 images: the input (188 KB) fits the request's 256 KiB, its
        # forward pass (two 60 x 256 activations more) does not: 507
        sixty = {"inputs": [image_json(imgs[i % 3], nested=False) for i in range(60)]}
        msg = expect(507, srv.predict(sixty), "a request over --request-limit")
        if b"limit" not in msg:
            fail("507 without the limit in its message: %s" % msg)
        # and 128 images, whose input alone is over the limit: 507 too
        expect(507, srv.predict({"inputs": [image_json(imgs[0], nested=False)] * 128}),
               "an input over --request-limit")
        # the server goes on: keep-alive requests on one connection, the
        # connection kept after answers of every kind
        c = srv.conn()
        for i in range(20):
            expect(200, srv.predict({"inputs": [image_json(imgs[1])]}, conn=c), "keep-alive")
            if i == 0:
                sock = c.sock
        expect(200, srv.request("GET", "/healthz", conn=c), "healthz, kept alive")
        expect(400, srv.predict("[1, 2", conn=c), "a 400, kept alive")
        expect(404, srv.request("GET", "/nope", conn=c), "a 404, kept alive")
        expect(405, srv.request("GET", "/v1/predict", conn=c), "a 405, kept alive")
        st, _ = srv.request("GET", "/metrics", conn=c)
        counts[200] += 1
        if c.sock is None or c.sock is not sock:
            fail("the connection was closed after an answer")
        c.close()
        # the dump: the tree as JSON, the requests' manager empty
        st, dump = srv.request("GET", "/debug/dump")
        tree = json.loads(dump)
        kids = {k["name"]: k for k in tree["children"]}
        if st != 200 or "model" not in kids or "http" not in kids:
            fail("the dump has no model or http manager: %s" % dump[:400])
        if kids["http"]["live_arrays"] or kids["http"]["children"]:
            fail("the requests' manager holds something between requests: %s" % kids["http"])
        m = srv.metrics()
        got = {s: sum(v for k, v in m.items()
                      if k.startswith("ndm_serve_requests_total") and 'status="%d"' % s in k)
               for s in counts}
        # the first healthz and the dump are 200s too
        want = dict(counts)
        want[200] += 2
        if got != want:
            fail("the metrics count %s, the client saw %s" % (got, want))
        npred = sum(v for k, v in m.items() if k.startswith('ndm_serve_requests_total{endpoint="/v1/predict"'))
        if m["ndm_serve_request_duration_seconds_count"] != npred:
            fail("the latency histogram counts %d predictions, not %d"
                 % (m["ndm_serve_request_duration_seconds_count"], npred))
        if m['ndm_serve_request_rows_bucket{le="+Inf"}'] != predicted(m, 200):
            fail("the rows histogram does not count every answered prediction")
        # rows: 1 per answer, but 3 for the npy one
        want_rows = (predicted(m, 200) - 1) + 3
        if m["ndm_serve_request_rows_sum"] != want_rows:
            fail("rows sum %d, not %d" % (m["ndm_serve_request_rows_sum"], want_rows))
        for k in ['ndm_manager_live_arrays{manager="http"}', 'ndm_manager_live_arrays{manager="model"}',
                  'ndm_allocator_allocated_bytes{device="cpu"}',
                  'ndm_allocator_reserved_bytes{device="cpu"}',
                  'ndm_allocator_peak_allocated_bytes{device="cpu"}', "ndm_serve_queue_depth",
                  "ndm_serve_in_flight"]:
            if k not in m:
                fail("no %s in /metrics" % k)
        if m['ndm_manager_live_arrays{manager="http"}'] != 0 or m["ndm_serve_in_flight"] != 0:
            fail("requests left arrays or in-flight counts behind")
        if m['ndm_manager_live_arrays{manager="model"}'] != 6:
            fail("the MLP's model holds %d arrays, not its 6 parameters"
                 % m['ndm_manager_live_arrays{manager="model"}'])
        print("smoke: %d answers checked, metrics agree: %s" % (sum(counts.values()), got))
        expect_clean_exit(srv)
    finally:
        srv.kill()


def wrk_run(serve, fashion, wrk, tmp):
    if not wrk or not shutil.which(wrk):
        print("wrk is not installed: skipped")
        sys.exit(77)
    model = train(fashion, os.path.join(tmp, "mlp.safetensors"))
    body = os.path.join(tmp, "body.json")
    with open(body, "w") as f:
        json.dump({"inputs": [image_json(test_images(1)[0])]}, f)
    lua = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predict.lua")
    for args in [(), ("--batch", 8, "--max-delay-us", 100)]:
        srv = Server(serve, model, *args, tmp=tmp)
        try:
            before = srv.metrics()
            conns = 16
            r = subprocess.run([wrk, "-t2", "-c%d" % conns, "-d2s", "--timeout", "10s", "-s", lua,
                                "http://127.0.0.1:%d/v1/predict" % srv.port],
                               capture_output=True, text=True, env=dict(os.environ, NDM_SERVE_BODY=body),
                               timeout=60)
            print(r.stdout)
            if r.returncode != 0:
                fail("wrk failed: %s" % r.stderr)
            import re
            n = int(re.search(r"(\d+) requests in", r.stdout).group(1))
            if "Non-2xx" in r.stdout or "Socket errors" in r.stdout:
                fail("wrk saw errors")
            after = srv.metrics()
            got = predicted(after, 200) - predicted(before, 200)
            errors = sum(v for k, v in after.items() if k.startswith("ndm_serve_errors_total"))
            # wrk counts the answers it read; the server may have answered
            # one more per connection that wrk stopped reading
            if not (n <= got <= n + conns) or errors:
                fail("wrk read %d answers, the server counts %d and %d errors" % (n, got, errors))
            if args and after["ndm_serve_batches_total"] == 0:
                fail("batching on but no batch counted")
            print("wrk %s: %d answers, the server counts %d, 0 errors" % (args or "unbatched", n, got))
            expect_clean_exit(srv)
        finally:
            srv.kill()


def reload_check(serve, fashion, tmp):
    a = train(fashion, os.path.join(tmp, "a.safetensors"), seed=1)
    c = train(fashion, os.path.join(tmp, "c.safetensors"), seed=2, cnn=True)
    live = os.path.join(tmp, "live.safetensors")
    shutil.copy(a, live)
    srv = Server(serve, live, "--batch", 8, "--max-delay-us", 100, tmp=tmp)
    try:
        img = {"inputs": [image_json(test_images(1)[0])]}
        st, body = srv.predict(img)
        if st != 200:
            fail("before the reloads: %d %s" % (st, body))
        want_a = logits_of(body)
        # a bad reload changes nothing
        st, body = srv.request("POST", "/admin/reload?model=%s" % os.path.join(tmp, "none"))
        if st != 400 or b"cannot read" not in body:
            fail("a reload from a missing file: %d %s" % (st, body))
        stop = threading.Event()
        seen, bad = {}, []
        lock = threading.Lock()

        def client():
            conn = srv.conn()
            while not stop.is_set():
                try:
                    st, body = srv.predict(img, conn=conn)
                except Exception as e:  # noqa: BLE001
                    with lock:
                        bad.append(repr(e))
                    return
                with lock:
                    if st != 200:
                        bad.append("%d %s" % (st, body[:200]))
                        continue
                    ans = json.loads(body)
                    seen.setdefault(ans["model"], []).append(logits_of(body)[0])
            conn.close()

        ths = [threading.Thread(target=client) for _ in range(8)]
        for t in ths:
            t.start()
        reloads = 0
        for i in range(8):
            time.sleep(0.25)
            if i % 2 == 0:
                st, body = srv.request("POST", "/admin/reload?model=%s" % c)
                if st != 200:
                    fail("reload to the CNN: %d %s" % (st, body))
            else:
                # a new file in place, then SIGHUP: --model read again
                shutil.copy(a, live + ".new")
                os.replace(live + ".new", live)
                srv.p.send_signal(signal.SIGHUP)
            reloads += 1
        time.sleep(0.25)
        stop.set()
        for t in ths:
            t.join()
        if bad:
            fail("%d requests not answered 200 under reloads, the first: %s" % (len(bad), bad[0]))
        if set(seen) - {live, c}:
            fail("answers from models never loaded: %s" % set(seen))
        # a row's logits in a batch of 8 and alone differ in the last bits
        # (another GEMM blocking); two models' differ in the first digit
        def near(x, y):
            return max(abs(p - q) for p, q in zip(x, y)) <= 1e-4

        for path, ls in seen.items():
            off = [l for l in ls if not near(l, ls[0])]
            if off:
                fail("%d of %d answers from %s differ from its first: a request saw a model "
                     "half swapped: %s / %s" % (len(off), len(ls), path, off[0], ls[0]))
        if not near(seen[live][0], want_a[0]):
            fail("the MLP's answers changed across reloads")
        # quiet now: the last reload (SIGHUP) was the MLP again; the CNN's
        # answer once more, alone, is the one seen under load
        deadline = time.time() + 30
        m = srv.metrics()
        while m["ndm_serve_model_generation"] != 1 + reloads and time.time() < deadline:
            time.sleep(0.05)
            m = srv.metrics()
        st, body = srv.request("POST", "/admin/reload?model=%s" % c)
        st, body = srv.predict(img)
        if c in seen and not near(logits_of(body)[0], seen[c][0]):
            fail("the CNN answers otherwise alone than under load")
        m = srv.metrics()
        if m['ndm_serve_reloads_total{result="ok"}'] != reloads + 1 or \
                m['ndm_serve_reloads_total{result="failed"}'] != 1:
            fail("reload counts: %s" % {k: v for k, v in m.items() if "reload" in k})
        if m['ndm_manager_live_arrays{manager="model"}'] != 8:
            fail("the model managers hold %d arrays, not the CNN's 8 parameters alone"
                 % m['ndm_manager_live_arrays{manager="model"}'])
        if m["ndm_serve_models_retired"] != 0:
            fail("%d replaced models still open with no request in flight" % m["ndm_serve_models_retired"])
        print("reload: %d reloads under load, %d answers, each the old model's or the new one's (%s)"
              % (reloads, sum(len(v) for v in seen.values()),
                 {os.path.basename(k): len(v) for k, v in seen.items()}))
        expect_clean_exit(srv)
    finally:
        srv.kill()


def drain(serve, fashion, tmp):
    model = train(fashion, os.path.join(tmp, "mlp.safetensors"))
    # a batch waits 2 s for company: the requests are in flight at SIGTERM
    srv = Server(serve, model, "--batch", 64, "--max-delay-us", 2000000, tmp=tmp)
    try:
        img = {"inputs": [image_json(test_images(1)[0])]}
        results = []
        lock = threading.Lock()

        def one():
            try:
                st, body = srv.predict(img)
            except Exception as e:  # noqa: BLE001
                st, body = -1, repr(e).encode()
            with lock:
                results.append((st, body))

        ths = [threading.Thread(target=one) for _ in range(8)]
        for t in ths:
            t.start()
        while srv.metrics()["ndm_serve_in_flight"] < 8:
            time.sleep(0.005)
        kept = srv.conn()
        st, _ = srv.request("GET", "/healthz", conn=kept)
        if st != 200:
            fail("healthz before SIGTERM: %d" % st)
        srv.p.send_signal(signal.SIGTERM)
        # no new connection is taken while the eight are answered
        refused = False
        while not refused and any(t.is_alive() for t in ths):
            try:
                socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()
                time.sleep(0.01)
            except OSError:
                refused = True
        # a kept-alive connection's next request is refused, and closed
        late = None
        if refused and any(t.is_alive() for t in ths):
            kept.request("GET", "/healthz")
            r = kept.getresponse()
            late = (r.status, r.getheader("Connection"), r.read())
        kept.close()
        for t in ths:
            t.join()
        if late and (late[0] != 503 or late[1] != "close" or b"shutting down" not in late[2]):
            fail("a request on a kept-alive connection during the drain: %s" % (late,))
        bad = [r for r in results if r[0] != 200]
        if bad or len(results) != 8:
            fail("requests in flight at SIGTERM not answered: %s" % bad[:2])
        if not refused:
            fail("a new connection was accepted after SIGTERM")
        out, err = expect_clean_exit(srv)
        if "stopped: 8 predictions in flight at the signal were answered" not in out:
            fail("the drain did not say so: %s" % out)
        print("drain: 8 requests in flight at SIGTERM answered, new connections refused, "
              "a kept-alive one's next request %s, exit 0, nothing alive"
              % ("503 and closed" if late else "not tried (the eight were out first)"))
    finally:
        srv.kill()


def cli(serve, fashion, tmp):
    def run(*args):
        r = subprocess.run([serve] + list(args), capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr

    rc, out = run("--help")
    if rc != 0 or "POST /v1/predict" not in out or "--request-limit" not in out:
        fail("--help: %d %s" % (rc, out))
    for args, want in [((), "which model? --model FILE"),
                       (("--model", "m", "--port", "70000"), "--port wants an integer from 0 to 65535"),
                       (("--model", "m", "--batch", "x"), "--batch wants an integer"),
                       (("--model", "m", "--bogus"), "unknown or incomplete option '--bogus'"),
                       (("--model", "m", "extra"), "unexpected argument 'extra'"),
                       (("--model", "m", "--device", "tpu"), "--device wants cpu, cuda or cuda:N")]:
        rc, out = run(*args)
        if rc != 2 or want not in out:
            fail("%s: exit %d, %r (wanted 2 and %r)" % (args, rc, out, want))
    missing = os.path.join(tmp, "none.safetensors")
    rc, out = run("--model", missing, "--port", "0")
    if rc != 1 or "cannot read " + missing not in out:
        fail("a missing model: %d %s" % (rc, out))
    notmodel = os.path.join(tmp, "junk.safetensors")
    with open(notmodel, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{}              ")
    rc, out = run("--model", notmodel, "--port", "0")
    if rc != 1 or "is not a mlp checkpoint of ndm-fashion train" not in out:
        fail("a file without the weights: %d %s" % (rc, out))
    rc, out = run("--model", missing, "--host", "localhost")
    if rc != 2 or "--host wants an IPv4 address" not in out:
        fail("--host localhost: %d %s" % (rc, out))
    print("cli: --help, bad options (exit 2) and bad models (exit 1) said so")


def main():
    mode, serve, fashion = sys.argv[1:4]
    wrk = sys.argv[4] if len(sys.argv) > 4 else None
    if mode != "cli":
        need_data()
    tmp = tempfile.mkdtemp()
    try:
        {"cli": lambda: cli(serve, fashion, tmp),
         "smoke": lambda: smoke(serve, fashion, tmp),
         "wrk": lambda: wrk_run(serve, fashion, wrk, tmp),
         "reload": lambda: reload_check(serve, fashion, tmp),
         "drain": lambda: drain(serve, fashion, tmp)}[mode]()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
