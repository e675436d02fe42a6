"""Where a run's reserved memory is: the segments of a PyTorch memory snapshot grouped by the
stream (pool) they belong to and by the request that cudaMalloc'd them, with how much of each
group is in use at the allocated peak of a window (docs/moe.md "Reserved much larger than
allocated").

  /usr/bin/python3 tools/reserved_report.py SNAPSHOT [--from T] [--top N]

SNAPSHOT: `memsim run SCENARIO --snapshot FILE.pickle`, or a torch.cuda.memory._dump_snapshot()
pickle, or ARCHIVE.tar.xz:MEMBER (the GPU fixtures' *_snapshots.tar.xz, read in memory).
--from T: the window starts at trace time T. In a memsim snapshot time_us is the Program event
index, so T is the summary's "measured step: events T-..." (the window then is the measured
step); in a real snapshot it is microseconds. Default: the whole trace.

Why: PyTorch's caching allocator keeps every segment it cudaMalloc'd until empty_cache() or an
out-of-memory retry (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks), and a freed
block serves later requests only on the stream it was allocated on (BlockPool is ordered by
stream first) and only when it is large enough (blocks of different segments never merge).
So reserved − allocated at the peak is free space in segments that (a) an earlier phase
reserved (setup: a model built on the GPU before sharding) or (b) another stream's pool owns
or (c) a split segment whose free pieces are too small for what is asked. This tool says which.

A segment's group is what caused its cudaMalloc: in a memsim snapshot the first frame is the
tensor's name (layer numbers collapsed to N) and the second the op and phase (setup, forward,
loss, backward, recompute, optimizer); in a real snapshot the innermost frame outside torch/
(file:line function) and "setup" when it precedes the first external annotation (the
profiler's record_function ranges: the step's first op), else "step". Streams are numbered
in order of first appearance, the default stream as s0 when it is stream 0.

Prints, per stream then per group: segments, reserved bytes, bytes in use at the window's
allocated peak, and the largest in use anywhere in the window ("max used"; 0 = never reused
in the window). Plain Python (pickle, tarfile): no torch needed.
"""
import argparse
import bisect
import collections
import io
import pickle
import re
import sys
import tarfile

GIB = float(1 << 30)
MIB = float(1 << 20)


def load(source):
    if ".tar.xz:" in source:
        archive, member = source.split(".tar.xz:", 1)
        with tarfile.open(archive + ".tar.xz", "r:xz") as t:
            return pickle.load(io.BytesIO(t.extractfile(member).read()))
    with open(source, "rb") as f:
        return pickle.load(f)


def is_memsim(snap):
    # memsim's frames: [{tensor name, module, layer}, {op, phase, 0}] (tools/cli/snapshot_report.h)
    for e in snap["device_traces"][0]:
        frames = e.get("frames") or []
        if len(frames) == 2 and frames[1].get("filename") in (
                "setup", "forward", "loss", "backward", "recompute", "optimizer", "other"):
            return True
        if frames:
            return False
    return False


LAYER = re.compile(r"(?<=[.\s])\d+(?=[.\s]|$)")


def memsim_group(frames):
    if len(frames) < 2:
        return "(no frames)"
    name = LAYER.sub("N", frames[0]["name"])
    return "%s: %s (%s)" % (frames[1]["filename"], name, frames[1]["name"])


def real_group(frames, setup):
    # the innermost frame of the user's code; else of FSDP's own (all-gather, reduce-scatter
    # buffers have only torch frames); else the innermost frame
    def user(fn):
        return "/torch/" not in fn and not fn.startswith("<")
    chosen = ([f for f in frames if user(f.get("filename", ""))]
              or [f for f in frames if "/distributed/" in f.get("filename", "")] or frames)
    where = "?"
    if chosen:
        f = chosen[0]
        where = "%s:%d %s" % (f.get("filename", "").split("/")[-1], f.get("line", 0), f.get("name", ""))
    return "%s: %s" % ("setup" if setup else "step", where)


def analyse(snap, start):
    trace = snap["device_traces"][0]
    memsim = is_memsim(snap)
    notes = snap.get("external_annotations") or []
    first_note = min((a["time_us"] for a in notes), default=None)
    streams = {}

    def stream_name(s):
        if s not in streams:
            streams[s] = "s%d" % (0 if s == 0 else len([k for k in streams if k != 0]) + 1)
        return streams[s]

    starts, segs = [], []  # sorted segment starts; segs[i] = [start, size, group, stream]
    used = collections.Counter()  # group -> bytes in use now
    max_used = collections.Counter()  # group -> most in use within the window
    reserved = collections.Counter()  # group -> bytes reserved now
    count = collections.Counter()  # group -> segments now
    sgroup = {}  # group -> stream name
    allocated, peak, at_peak, peak_time = 0, -1, {}, None
    block_group = {}  # address -> (group, size) of live blocks
    in_window = False
    for e in trace:
        a = e["action"]
        t = e.get("time_us", 0)
        if not in_window and t >= start:
            # what is in use when the window opens counts as used in it (shards, state)
            in_window = True
            max_used = collections.Counter(used)
        if a in ("segment_alloc", "segment_map"):
            frames = e.get("frames") or []
            setup = first_note is not None and t < first_note
            g = memsim_group(frames) if memsim else real_group(frames, setup)
            s = stream_name(e["stream"])
            g = "%s %s" % (s, g)
            sgroup[g] = s
            i = bisect.bisect(starts, e["addr"])
            starts.insert(i, e["addr"])
            segs.insert(i, [e["addr"], e["size"], g])
            reserved[g] += e["size"]
            count[g] += 1
        elif a in ("segment_free", "segment_unmap"):
            i = bisect.bisect(starts, e["addr"]) - 1
            if i >= 0 and starts[i] == e["addr"]:
                g = segs[i][2]
                reserved[g] -= segs[i][1]
                count[g] -= 1
                del starts[i], segs[i]
        elif a == "alloc":
            i = bisect.bisect(starts, e["addr"]) - 1
            g = segs[i][2] if i >= 0 and e["addr"] < segs[i][0] + segs[i][1] else "(outside)"
            block_group[e["addr"]] = (g, e["size"])
            used[g] += e["size"]
            allocated += e["size"]
            if in_window:
                if used[g] > max_used[g]:
                    max_used[g] = used[g]
                if allocated > peak:
                    peak, at_peak, peak_time = allocated, dict(used), t
        elif a == "free_completed":
            g, size = block_group.pop(e["addr"], (None, 0))
            if g is not None:
                used[g] -= size
                allocated -= size
    return {
        "memsim": memsim, "streams": streams, "reserved": reserved, "count": count,
        "sgroup": sgroup, "max_used": max_used, "at_peak": at_peak, "peak": peak,
        "peak_time": peak_time, "first_note": first_note,
    }


def report(r, top, out):
    reserved, at_peak, max_used = r["reserved"], r["at_peak"], r["max_used"]
    total = sum(reserved.values())
    print("snapshot: %s; allocated peak of the window %.2f GiB at t=%s; reserved %.2f GiB in %d segments"
          % ("memsim" if r["memsim"] else "PyTorch", r["peak"] / GIB, r["peak_time"],
             total / GIB, sum(r["count"].values())), file=out)
    print("\nby stream (pool)          reserved   in use at peak   free at peak   max used", file=out)
    for s in sorted(set(r["sgroup"].values())):
        gs = [g for g in reserved if r["sgroup"][g] == s]
        res = sum(reserved[g] for g in gs)
        use = sum(at_peak.get(g, 0) for g in gs)
        mu = sum(max_used[g] for g in gs)
        print("  %-20s %10.2f GiB %12.2f GiB %10.2f GiB %8.2f GiB" % (
            s, res / GIB, use / GIB, (res - use) / GIB, mu / GIB), file=out)
    phases = collections.Counter()
    phase_use = collections.Counter()
    for g, res in reserved.items():
        ph = g.split(" ", 1)[1].split(":", 1)[0]
        phases[ph] += res
        phase_use[ph] += at_peak.get(g, 0)
    print("\nby the phase that cudaMalloc'd  reserved   in use at peak   free at peak", file=out)
    for ph, res in phases.most_common():
        print("  %-28s %10.2f GiB %12.2f GiB %10.2f GiB" % (
            ph, res / GIB, phase_use[ph] / GIB, (res - phase_use[ph]) / GIB), file=out)
    print("\nlargest free at peak, by the request that cudaMalloc'd the segments (top %d)" % top, file=out)
    print("  segs     reserved   in use at peak   max used  group", file=out)
    rows = sorted(reserved, key=lambda g: -(reserved[g] - at_peak.get(g, 0)))
    for g in rows[:top]:
        print("  %4d %8.2f GiB %12.2f GiB %8.2f GiB  %s" % (
            r["count"][g], reserved[g] / GIB, at_peak.get(g, 0) / GIB, max_used[g] / GIB, g),
            file=out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("--from", dest="start", type=int, default=0)
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args(argv)
    report(analyse(load(a.snapshot), a.start), a.top, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
