"""Helpers for the ndm-serve tests and benchmarks: checkpoints trained on a
subset of Fashion-MNIST, a server on a free loopback port, a keep-alive
client, the Prometheus text parsed."""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"
SKIP = 77


def need_data():
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("dataset-fashion-mnist is not installed: skipped")
        sys.exit(SKIP)


def train(fashion, out, seed=1, cnn=False, limit=600):
    """A quick checkpoint: one epoch on `limit` examples."""
    cmd = [fashion, "train", "--epochs", "1", "--limit", str(limit), "--seed", str(seed),
           "--out", out, "--quiet"] + (["--cnn"] if cnn else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def test_images(n):
    """The first n test images of Fashion-MNIST as bytes of 784 pixels."""
    import gzip
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"), "rb") as f:
        f.read(16)
        raw = f.read(784 * n)
    return [raw[784 * i:784 * (i + 1)] for i in range(n)]


def image_json(img, nested=True):
    px = [round(b / 255.0, 6) for b in img]
    if nested:
        return [px[28 * r:28 * (r + 1)] for r in range(28)]
    return px


class Server:
    """ndm-serve on a free loopback port (--port 0, read from --port-file)."""

    def __init__(self, exe, model, *args, env=None, tmp=None):
        self.tmp = tmp or tempfile.mkdtemp()
        self.port_file = os.path.join(self.tmp, "port-%d" % time.monotonic_ns())
        e = dict(os.environ)
        e["NDM_LEAK_REPORT"] = "1"
        if env:
            e.update(env)
        self.out = open(os.path.join(self.tmp, "serve.out"), "w+")
        self.err = open(os.path.join(self.tmp, "serve.err"), "w+")
        self.p = subprocess.Popen([exe, "--model", model, "--port", "0", "--port-file",
                                   self.port_file] + [str(a) for a in args],
                                  stdout=self.out, stderr=self.err, env=e)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.port_file):
            if self.p.poll() is not None:
                raise RuntimeError("ndm-serve exited with %d: %s" % (self.p.returncode,
                                                                     self.stderr()))
            if time.monotonic() > deadline:
                raise RuntimeError("ndm-serve did not start")
            time.sleep(0.01)
        with open(self.port_file) as f:
            self.port = int(f.read())

    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, ctype=None, conn=None):
        """(status, body bytes); a connection of its own unless given."""
        c = conn or self.conn()
        headers = {"Content-Type": ctype} if ctype else {}
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, data

    def predict(self, body, ctype="application/json", conn=None):
        if isinstance(body, (list, dict)):
            body = json.dumps(body)
        return self.request("POST", "/v1/predict", body, ctype, conn)

    def metrics(self):
        status, text = self.request("GET", "/metrics")
        assert status == 200, status
        return parse_metrics(text.decode())

    def rss_kib(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signal, wait; (exit status, stdout, stderr)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        rc = self.p.wait(timeout)
        return rc, self.stdout(), self.stderr()

    def stdout(self):
        self.out.flush()
        self.out.seek(0)
        return self.out.read()

    def stderr(self):
        self.err.flush()
        self.err.seek(0)
        return self.err.read()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def parse_metrics(text):
    """{'name{labels}': value} from the Prometheus text format."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^(\S+) (\S+)$", line)
        assert m, "not a Prometheus sample line: %r" % line
        out[m.group(1)] = float(m.group(2))
    return out


def predicted(metrics, status):
    return int(metrics.get('ndm_serve_requests_total{endpoint="/v1/predict",status="%s"}'
                           % status, 0))


def expect_clean_exit(srv, what="ndm-serve"):
    rc, out, err = srv.stop()
    if rc != 0 or "ndm leak report: nothing alive" not in err:
        print(out)
        print(err)
        raise AssertionError("%s: exit %d, or a leak report that is not empty" % (what, rc))
    return out, err


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)
