"""The PyTorch side of bench/cuda: the same measurements on the same GPU, run
as a co-process so that the C program can interleave them with its own.

One request per line on stdin, one answer per line on stdout:
  hello                       -> "ok <torch version> <device name>" (or "error <why>")
  alloc BYTES REPS            -> median ns of torch.empty + del (the caching allocator)
  step ARCH BATCH SEED REPS   -> median seconds of one Adam training step of the
                                 Fashion-MNIST network ARCH (mlp|cnn) on one fixed
                                 batch, after warm-up
  peak ARCH BATCH SEED STEPS  -> torch.cuda.max_memory_reserved() over STEPS steps,
                                 from a fresh allocator
  quit
The networks match tools/fashion_net.c: MLP 784-256-128-10 with ReLU; CNN two
3x3 convolutions (32, 64 channels, padding 1) with ReLU and 2x2 max pooling,
then 3136-128-10. Adam lr 1e-3, cross-entropy, float32.
"""
import statistics
import sys
import time


def main():
    try:
        import torch
        from torch import nn
        from fashion_torch import net
    except Exception as e:  # no PyTorch: the C side reports it and goes on
        print("error no torch:", e, flush=True)
        return
    if not torch.cuda.is_available():
        print("error torch sees no CUDA device", flush=True)
        return
    dev = torch.device("cuda", 0)
    # the float32 matrix products run in float32, as ndm's do
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def setup(arch, batch, seed):
        torch.manual_seed(seed)
        m = net(arch).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        shape = (batch, 1, 28, 28) if arch == "cnn" else (batch, 28, 28)
        x = torch.rand(shape, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(m(x), y)
            loss.backward()
            opt.step()
            return loss

        return m, opt, step

    print("ok", torch.__version__, torch.cuda.get_device_name(dev).replace(" ", "_"), flush=True)
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        try:
            if w[0] == "quit":
                break
            if w[0] == "alloc":
                n, reps = int(w[1]), int(w[2])
                for _ in range(16):
                    t = torch.empty(n, dtype=torch.uint8, device=dev)
                    del t
                torch.cuda.synchronize()
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter_ns()
                    for _ in range(100):
                        t = torch.empty(n, dtype=torch.uint8, device=dev)
                        del t
                    ts.append((time.perf_counter_ns() - t0) / 100)
                print(statistics.median(ts), flush=True)
            elif w[0] == "step":
                arch, batch, seed, reps = w[1], int(w[2]), int(w[3]), int(w[4])
                m, opt, step = setup(arch, batch, seed)
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t0)
                del m, opt, step
                print(statistics.median(ts), flush=True)
            elif w[0] == "peak":
                arch, batch, seed, steps = w[1], int(w[2]), int(w[3]), int(w[4])
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
                m, opt, step = setup(arch, batch, seed)
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_reserved(dev)
                del m, opt, step
                torch.cuda.empty_cache()
                print(peak, flush=True)
            else:
                print("error unknown request", w[0], flush=True)
        except Exception as e:
            print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
