"""The PyTorch side of bench/train --vs-pytorch: the same Fashion-MNIST training
steps and batch-1 inference on the CPU, run as a co-process so that the C
program can interleave its own measurements with these.

One request per line on stdin, one answer per line on stdout:
  hello                      -> "ok <torch version> <BLAS/oneDNN summary>" or "error <why>"
  data DIR                   -> load DIR/train-{images,labels}-*.gz; "ok <examples>"
  threads T                  -> torch.set_num_threads(T); "ok <T>"
  setup ARCH WEIGHTS LR MOM  -> the network ARCH (mlp|cnn) with the state in the
                                safetensors file WEIGHTS (written by ndm's
                                ndm_module_save), SGD(lr, momentum), batch
                                cursor at the first batch; "ok"
  losses N                   -> N training steps; their losses, space-separated
  steps N                    -> N training steps; "<median s per step> <total s>"
  infer_setup WEIGHTS        -> the MLP with WEIGHTS, eval mode, for batch-1 requests
  infer CALLS                -> p50 seconds of one no-grad forward of one image
  quit
Batches are taken in file order, 128 examples each (the last of an epoch holds
the remaining 96), scaled to [0, 1] per step from the bytes as ndm's loader
does, labels int64. The networks match tools/fashion_net.c; the loss is the
mean cross-entropy. Only the standard library and torch are needed.
"""
import gzip
import json
import statistics
import struct
import sys
import time
import warnings

BATCH = 128


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 8:
        raise ValueError(path + ": not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return dims, bytearray(raw[4 + 4 * ndim:])


def read_safetensors(torch, path):
    """A safetensors file as {name: tensor}, without the safetensors package."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = bytearray(data[8 + hlen:])
    kinds = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        t = torch.frombuffer(body[begin:end], dtype=kinds[meta["dtype"]]) if end > begin else \
            torch.empty(0, dtype=kinds[meta["dtype"]])
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def main():
    warnings.filterwarnings("ignore")
    try:
        import torch
        from fashion_torch import net
    except Exception as e:  # no PyTorch: the C side says so and goes on alone
        print("error no torch:", str(e).replace("\n", " "), flush=True)
        return
    F = torch.nn.functional

    st = {"cursor": 0}

    def step():
        n = st["images"].shape[0]
        b = st["cursor"]
        e = min(b + BATCH, n)
        st["cursor"] = 0 if e >= n else e
        x = st["images"][b:e].to(torch.float32).div_(255.0)
        if st["arch"] == "cnn":
            x = x.unsqueeze(1)
        loss = F.cross_entropy(st["model"](x), st["labels"][b:e])
        st["opt"].zero_grad()
        loss.backward()
        st["opt"].step()
        return loss

    cfg = torch.__config__.show()
    blas = "MKL" if "USE_MKL=ON" in cfg or "Intel(R) oneAPI Math Kernel" in cfg else "BLAS"
    dnn = "+oneDNN" if "USE_MKLDNN=ON" in cfg or "oneDNN" in cfg else ""
    print("ok", torch.__version__, blas + dnn, flush=True)
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        try:
            if w[0] == "quit":
                break
            if w[0] == "data":
                d = " ".join(w[1:])
                dims, px = read_idx(d + "/train-images-idx3-ubyte.gz")
                ldims, lab = read_idx(d + "/train-labels-idx1-ubyte.gz")
                st["images"] = torch.frombuffer(px, dtype=torch.uint8).reshape(dims)
                st["labels"] = torch.frombuffer(lab, dtype=torch.uint8).to(torch.int64)
                print("ok", dims[0], flush=True)
            elif w[0] == "threads":
                torch.set_num_threads(int(w[1]))
                print("ok", torch.get_num_threads(), flush=True)
            elif w[0] == "setup":
                arch, path, lr, mom = w[1], w[2], float(w[3]), float(w[4])
                m = net(arch)
                m.load_state_dict(read_safetensors(torch, path), strict=True)
                m.train()
                st.update(arch=arch, model=m, cursor=0,
                          opt=torch.optim.SGD(m.parameters(), lr=lr, momentum=mom))
                print("ok", flush=True)
            elif w[0] == "losses":
                print(" ".join("%.9g" % step().item() for _ in range(int(w[1]))), flush=True)
            elif w[0] == "steps":
                ts = []
                t0 = time.perf_counter()
                for _ in range(int(w[1])):
                    t = time.perf_counter()
                    step()
                    ts.append(time.perf_counter() - t)
                total = time.perf_counter() - t0
                print("%.9g %.9g" % (statistics.median(ts), total), flush=True)
            elif w[0] == "infer_setup":
                m = net("mlp")
                m.load_state_dict(read_safetensors(torch, w[1]), strict=True)
                m.eval()
                st["serve"] = m
                st["one"] = st["images"][0:1].to(torch.float32).div_(255.0)
                print("ok", flush=True)
            elif w[0] == "infer":
                m, x = st["serve"], st["one"]
                ts = []
                with torch.no_grad():
                    for _ in range(100):
                        m(x)
                    for _ in range(int(w[1])):
                        t = time.perf_counter()
                        m(x)
                        ts.append(time.perf_counter() - t)
                print("%.9g" % statistics.median(ts), flush=True)
            else:
                print("error unknown request", w[0], flush=True)
        except Exception as e:
            print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
