#!/usr/bin/env python3
"""Check a memory snapshot against the fields PyTorch's tools read.

Loads the file with Python's own pickle module (or json for .json) and checks
the schema that torch.cuda._memory_viz (stats, trace, segments, compare) and
its web viewer read, plus the invariants they rely on: blocks tile their
segment, the last 'snapshot' entry carries the active bytes, and the trace
replayed backwards from the segments never frees a block that is not
allocated nor allocates one that is (what the viewer's segment replay does).

usage: check_snapshot.py SNAPSHOT [--user-file F] [--expect-frame NAME@FILE]...
       [--expect-category C]... [--expect-oom] [--same-as OTHER]
Exit 0 when it holds; 1 with one line per problem otherwise.
"""
import json
import pickle
import sys

PROBLEMS = []
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF": str, "max_split_size": int,
            "garbage_collection_threshold": float, "expandable_segments": bool,
            "pinned_num_register_threads": int, "release_lock_on_cudamalloc": bool,
            "pinned_use_cuda_host_register": bool, "roundup_power2_divisions": dict}
EPOCH_2020_US = 1577836800 * 1000000


def problem(msg):
    PROBLEMS.append(msg)


def need(obj, key, typ, where):
    if not isinstance(obj, dict) or key not in obj:
        problem(f"{where}: no '{key}'")
        return None
    v = obj[key]
    # bool is an int in Python; PyTorch's readers want real ints for sizes
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        problem(f"{where}.{key}: {type(v).__name__}, expected {typ.__name__}")
        return None
    return v


def check_frames(frames, where):
    if not isinstance(frames, list):
        problem(f"{where}.frames is not a list")
        return
    for i, f in enumerate(frames):
        w = f"{where}.frames[{i}]"
        name = need(f, "name", str, w)
        fn = need(f, "filename", str, w)
        need(f, "line", int, w)
        if fn and (fn.startswith("../") or fn.startswith("./")):
            problem(f"{w}: file name not relative to the source root: {fn}")
        if name is not None and name == "":
            problem(f"{w}: empty name")


# The opcodes the unpickler of PyTorch's web viewer (MemoryViz.js) decodes
# that a snapshot needs; a pickle with any other is one it may not open.
VIEWER_OPCODES = {"PROTO", "EMPTY_DICT", "EMPTY_LIST", "MARK", "SETITEMS", "APPENDS",
                  "BININT1", "BININT", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE",
                  "BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE", "BINPUT", "BINGET", "STOP"}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".pickle"):
        import pickletools
        used = {op.name for op, _, _ in pickletools.genops(data)}
        for name in sorted(used - VIEWER_OPCODES):
            problem(f"opcode {name} is outside the set the writer keeps to")
        if data[:2] != b"\x80\x02":
            problem("not a protocol 2 pickle")
        return pickle.loads(data)
    return json.loads(data)


def main(argv):
    path = argv[1]
    user_file, expect_frames, expect_cats, expect_oom, same_as = None, [], [], False, None
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "--user-file":
            user_file = argv[i + 1]; i += 2
        elif a == "--expect-frame":
            expect_frames.append(tuple(argv[i + 1].split("@", 1))); i += 2
        elif a == "--expect-category":
            expect_cats.append(argv[i + 1]); i += 2
        elif a == "--expect-oom":
            expect_oom = True; i += 1
        elif a == "--same-as":
            same_as = argv[i + 1]; i += 2
        else:
            print(f"unknown argument {a}")
            return 2
    snap = load(path)
    if not isinstance(snap, dict):
        print(f"{path}: not a dict")
        return 1
    segs = need(snap, "segments", list, "snapshot") or []
    traces = need(snap, "device_traces", list, "snapshot") or []
    settings = need(snap, "allocator_settings", dict, "snapshot") or {}
    for k, t in SETTINGS.items():
        need(settings, k, t, "allocator_settings")

    active = {}
    state = {}  # device -> (set of block addrs, set of segment addrs)
    for si, seg in enumerate(segs):
        w = f"segments[{si}]"
        dev = need(seg, "device", int, w)
        addr = need(seg, "address", int, w)
        total = need(seg, "total_size", int, w)
        for k in ("allocated_size", "active_size", "requested_size", "stream"):
            need(seg, k, int, w)
        need(seg, "segment_type", str, w)
        check_frames(seg.get("frames", []), w)
        blocks = need(seg, "blocks", list, w) or []
        if dev is not None and not 0 <= dev < len(traces):
            problem(f"{w}.device {dev} is no index into device_traces ({len(traces)})")
        at, alloc_sum = addr, 0
        blocks_here, segs_here = state.setdefault(dev, (set(), set()))
        segs_here.add(addr)
        for bi, b in enumerate(blocks):
            wb = f"{w}.blocks[{bi}]"
            size = need(b, "size", int, wb)
            req = need(b, "requested_size", int, wb)
            st = need(b, "state", str, wb)
            check_frames(b.get("frames"), wb)
            if "address" in b and b["address"] != at:
                problem(f"{wb}: address {b['address']} where the blocks before end at {at}")
            if st is not None and st not in STATES:
                problem(f"{wb}: state {st!r}")
            if size is not None and req is not None and req > size:
                problem(f"{wb}: requested_size {req} > size {size}")
            if st == "active_allocated" and size is not None:
                alloc_sum += size
                active[dev] = active.get(dev, 0) + size
                blocks_here.add(at)
            at += size or 0
        if total is not None and addr is not None and at - addr != total:
            problem(f"{w}: blocks cover {at - addr} bytes of {total}")
        if seg.get("allocated_size") != alloc_sum:
            problem(f"{w}: allocated_size {seg.get('allocated_size')} != blocks' {alloc_sum}")

    categories = set()
    saw_oom = False
    found = {ef: False for ef in expect_frames}
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            problem(f"device_traces[{d}] is not a list")
            continue
        last_t = 0
        for k, e in enumerate(trace):
            w = f"device_traces[{d}][{k}]"
            act = need(e, "action", str, w)
            if act not in ACTIONS:
                problem(f"{w}: action {act!r}")
            need(e, "size", int, w)
            need(e, "stream", int, w)
            t = need(e, "time_us", int, w)
            if t is not None:
                if t < EPOCH_2020_US:
                    problem(f"{w}: time_us {t} is not Unix-epoch microseconds")
                if t < last_t:
                    problem(f"{w}: time goes back")
                last_t = t
            need(e, "device_free" if act == "oom" else "addr", int, w)
            need(e, "user_metadata", str, w)
            cat = need(e, "category", str, w)
            if cat is not None:
                categories.add(cat)
            frames = e.get("frames")
            check_frames(frames, w)
            if act == "oom":
                saw_oom = True
            if act == "alloc" and frames and user_file and frames[-1]["filename"] != user_file:
                problem(f"{w}: the stack ends at {frames[-1]['filename']}, not {user_file}")
            for ef in expect_frames:
                if frames and any(f["name"] == ef[0] and f["filename"] == ef[1] for f in frames):
                    found[ef] = True
        # The dump's own entry comes last and carries the active bytes.
        if trace:
            last = trace[-1]
            if last.get("action") != "snapshot":
                problem(f"device_traces[{d}]: last entry is {last.get('action')}, not snapshot")
            elif last.get("size") != active.get(d, 0):
                problem(f"device_traces[{d}]: snapshot size {last.get('size')} != active "
                        f"bytes {active.get(d, 0)}")
        # Replay backwards from the segments, as the viewer's segment view does.
        blocks_now, segs_now = state.get(d, (set(), set()))
        blocks_now, segs_now = set(blocks_now), set(segs_now)
        for k in range(len(trace) - 1, -1, -1):
            e = trace[k]
            act, a = e.get("action"), e.get("addr")
            if act == "free_completed":
                if a in blocks_now:
                    problem(f"device_traces[{d}][{k}]: freed block {a} is allocated in the segments")
                blocks_now.add(a)
            elif act == "free_requested":
                if a not in blocks_now:
                    problem(f"device_traces[{d}][{k}]: free_requested of {a} without its completion")
            elif act == "alloc":
                if a not in blocks_now:
                    problem(f"device_traces[{d}][{k}]: block {a} allocated here is not live after")
                blocks_now.discard(a)
            elif act == "segment_free":
                if a in segs_now:
                    problem(f"device_traces[{d}][{k}]: unmapped segment {a} is in the segments")
                segs_now.add(a)
            elif act == "segment_alloc":
                if a not in segs_now:
                    problem(f"device_traces[{d}][{k}]: segment {a} mapped here is gone after")
                segs_now.discard(a)
    if categories and "unknown" not in categories:
        problem("categories without 'unknown' (PyTorch's viewer needs it)")
    for c in expect_cats:
        if c not in categories:
            problem(f"no event of category {c!r} (found {sorted(categories)})")
    if expect_oom and not saw_oom:
        problem("no oom entry")
    for ef, ok in found.items():
        if not ok:
            problem(f"no event with the frame {ef[0]} at {ef[1]}")
    if same_as:
        other = load(same_as)

        # OTHER was dumped right after this one: its trace is this one's plus
        # its own snapshot entry.
        def strip(s, n):
            tr = [[{k: v for k, v in e.items() if k != "time_us"} for e in t[:n]]
                  for t in s["device_traces"]]
            return s["segments"], tr, s["allocator_settings"]
        n = len(traces[0]) if traces else 0
        if strip(snap, n) != strip(other, n):
            problem(f"{path} and {same_as} do not hold the same snapshot")
    for p in PROBLEMS[:40]:
        print(p)
    if len(PROBLEMS) > 40:
        print(f"... and {len(PROBLEMS) - 40} more")
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
