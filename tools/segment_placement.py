"""Where the CUDA driver placed the caching allocator's segments, and whether a placement
rule predicts it (docs/segment-placement.md).

  /usr/bin/python3 tools/segment_placement.py [--memsim BUILD/memsim] [--list] [--rules a,b]
                                              [--scenarios DIR ...] SOURCE [SOURCE ...]

SOURCE: a torch.cuda.memory._dump_snapshot() pickle, a folder of them (searched
recursively), or a .tar.xz of them (the fixtures' *_snapshots.tar.xz; read in memory).

Why it matters: PyTorch's best fit takes, among free blocks of equal size on a stream, the
one at the LOWEST address (c10/cuda/CUDACachingAllocator.cpp, BlockComparatorSize: stream,
size, then ptr; shared/docs/pytorch-allocator.md). So the relative address order of
segments -- chosen by the driver's cudaMalloc, not by PyTorch -- decides which segment a
request reuses, and through later splits the reserved peak. memsim's SimulatedDevice hands
out rising addresses.

For each run this prints
  * with --list: every cudaMalloc'd segment in creation order (size, address relative to
    the first, stream) and every cudaFree (empty_cache / OOM-retry release);
  * the order of each new segment among the live segments of its size and stream:
    D (below all of them), A (above all), M (between), N (none live);
  * for each candidate rule, how many of those positions it predicts ("rank": the number of
    same-size live segments below the new one, equal to the trace's) and, with --memsim,
    whether replaying the run's own trace with the rule's addresses (offsets inside each
    segment kept) makes the emulator take exactly the trace's blocks (mismatches 0) and
    what peak reserved it reaches against the real addresses' replay.

With --memsim and --scenarios DIR (a folder holding RUN.yaml beside the runs, as
tests/data/gpu/<group>/ and tests/data/h100/arch/): memsim's own Program of each run that
has a scenario (`memsim run RUN.yaml --snapshot`), replayed with its segments placed by each
rule, against the real trace's peak reserved ("prog" columns: memsim's peak reserved under
the rule relative to the measured one; "asc" is memsim today).

Rules (each sees only the sequence of segment sizes, frees and streams, as memsim would):
  asc    each new segment above all earlier ones (memsim's SimulatedDevice today)
  desc   each new segment below all earlier ones
  chunk  the driver reserves a power-of-two-sized chunk (2 MiB for a 2 MiB segment, else at
         least 32 MiB) for a segment that no hole fits, below every earlier chunk, aligned
         to min(chunk, 32 MiB); the segment takes the chunk's bottom and the rest is a
         hole; a later segment that fits a hole takes the lowest-addressed such hole (its
         bottom); a freed segment becomes a hole
The peak reserved compared is the whole trace's: no committed trace frees a segment, so
reserved only grows and the measured step's peak is the same number.
Plain Python (pickle, tarfile, subprocess): no torch needed. Prints only.
"""
import argparse
import bisect
import collections
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile

MIB = 1 << 20
PAGE = 2 * MIB


def round_page(n):
    return (n + PAGE - 1) // PAGE * PAGE


# ---------------------------------------------------------------- loading

def load_sources(sources):
    """[(name, snapshot dict)] from pickles, folders and .tar.xz archives."""
    out = []
    for src in sources:
        if os.path.isdir(src):
            for root, _, files in sorted(os.walk(src)):
                for f in sorted(files):
                    if f.endswith(".pickle"):
                        with open(os.path.join(root, f), "rb") as fh:
                            out.append((os.path.join(root, f), pickle.load(fh)))
        elif src.endswith(".tar.xz"):
            with tarfile.open(src, "r:xz") as t:
                for m in t.getmembers():
                    if m.isfile() and m.name.endswith(".pickle"):
                        out.append((src + ":" + m.name, pickle.load(io.BytesIO(t.extractfile(m).read()))))
        else:
            with open(src, "rb") as fh:
                out.append((src, pickle.load(fh)))
    return out


def trace_of(snap):
    traces = snap.get("device_traces") or [[]]
    return traces[0] if traces else []


def segment_events(snap):
    """(initial segments [(addr, size, stream)], events [(kind, addr, size, stream, index)]):
    the segments that existed before the trace began (in the final list, never allocated by
    the trace), then the trace's segment_alloc ('S') / segment_free ('F') in order. None
    when the run used expandable segments (segment_map: no cudaMalloc placement)."""
    tr = trace_of(snap)
    if any(e["action"] in ("segment_map", "segment_unmap") for e in tr):
        return None
    allocated = set(e["addr"] for e in tr if e["action"] == "segment_alloc")
    freed_first = []
    seen = set()
    for e in tr:  # segments the trace frees without having allocated them existed before it
        if e["action"] == "segment_alloc":
            seen.add(e["addr"])
        elif e["action"] == "segment_free" and e["addr"] not in seen:
            freed_first.append((e["addr"], e["size"], e["stream"]))
            seen.add(e["addr"])
    initial = [(s["address"], s["total_size"], s["stream"]) for s in snap.get("segments", [])
               if s["address"] not in allocated and s.get("device", 0) == 0] + freed_first
    events = [("S" if e["action"] == "segment_alloc" else "F", e["addr"], e["size"], e["stream"], i)
              for i, e in enumerate(tr) if e["action"] in ("segment_alloc", "segment_free")]
    return sorted(initial), events


# ---------------------------------------------------------------- rules

class Ascending:
    def __init__(self, initial):
        self.next = max((a + s for a, s, _ in initial), default=1 << 44)

    def alloc(self, size):
        a = self.next
        self.next += round_page(size)
        return a

    def free(self, addr, size):
        pass


class Descending:
    def __init__(self, initial):
        self.low = min((a for a, _, _ in initial), default=1 << 44)

    def alloc(self, size):
        self.low -= round_page(size)
        return self.low

    def free(self, addr, size):
        pass


class Chunks:
    def __init__(self, initial):
        self.low = min((a for a, _, _ in initial), default=1 << 44)
        self.holes = []  # (address, size)

    def alloc(self, size):
        size = round_page(size)
        fits = [h for h in self.holes if h[1] >= size]
        if fits:
            h = min(fits)
            self.holes.remove(h)
            if h[1] > size:
                self.holes.append((h[0] + size, h[1] - size))
            return h[0]
        chunk = PAGE if size <= PAGE else 32 * MIB  # a small-pool segment: one page
        while chunk < size:
            chunk *= 2
        align = min(chunk, 32 * MIB)
        base = (self.low - chunk) // align * align
        self.low = base
        if chunk > size:
            self.holes.append((base + size, chunk - size))
        return base

    def free(self, addr, size):
        self.holes.append((addr, round_page(size)))


RULES = {"asc": Ascending, "desc": Descending, "chunk": Chunks}


def placed(initial, events, rule):
    """{trace address of each segment: the rule's address} (initial segments keep theirs)."""
    model = RULES[rule](initial)
    out = {a: a for a, _, _ in initial}
    live = {}
    for kind, addr, size, _, _ in events:
        if kind == "S":
            out[addr] = live[addr] = model.alloc(size)
        elif addr in live:
            model.free(live.pop(addr), size)
    return out


# ---------------------------------------------------------------- measures

def positions(initial, events, where=None):
    """For each segment_alloc with live same-size same-stream segments: the number of them
    below it, by the trace's addresses or by `where` (trace address -> rule address)."""
    where = where or {}
    live = {a: (s, st) for a, s, st in initial}
    out = []
    for kind, addr, size, stream, _ in events:
        if kind == "S":
            same = [x for x, (s, st) in live.items() if s == size and st == stream]
            if same:
                me = where.get(addr, addr)
                out.append(sum(1 for x in same if where.get(x, x) < me))
            else:
                out.append(None)
            live[addr] = (size, stream)
        else:
            live.pop(addr, None)
    return out


def classes(initial, events):
    c = collections.Counter()
    live = {a: (s, st) for a, s, st in initial}
    for kind, addr, size, stream, _ in events:
        if kind == "S":
            same = [x for x, (s, st) in live.items() if s == size and st == stream]
            if not same:
                c["N"] += 1
            elif all(addr < x for x in same):
                c["D"] += 1
            elif all(addr > x for x in same):
                c["A"] += 1
            else:
                c["M"] += 1
            live[addr] = (size, stream)
        else:
            live.pop(addr, None)
    return c


def moved_snapshot(snap, initial, events, where):
    """snap with every address inside a segment moved with its segment (offset kept)."""
    spans = sorted([(a, s) for a, s, _ in initial] + [(a, s) for k, a, s, _, _ in events if k == "S"])

    keys = [a for a, _ in spans]
    size = dict(spans)

    def move(addr):
        i = bisect.bisect_right(keys, addr) - 1
        if i < 0 or addr >= keys[i] + size[keys[i]]:
            return addr
        return where.get(keys[i], keys[i]) + (addr - keys[i])

    out = dict(snap)
    out["device_traces"] = [[dict(e, addr=move(e["addr"])) if "addr" in e else e for e in trace_of(snap)]]
    segs = []
    for s in snap.get("segments", []):
        s2 = dict(s, address=move(s["address"]))
        s2["blocks"] = [dict(b, address=move(b["address"])) if "address" in b else b for b in s.get("blocks", [])]
        segs.append(s2)
    out["segments"] = segs
    return out


def replay(memsim, snap, tmp):
    path = os.path.join(tmp, "r.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    done = subprocess.run([memsim, "replay", path, "--json", "-"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    j = json.loads(done.stdout)
    return j.get("mismatches", {}).get("count"), j.get("peak_reserved_bytes")


def find_scenario(folders, short):
    name = short.split(":")[-1].split("/")[-1]
    if not name.endswith(".pickle"):
        return None
    for d in folders:
        path = os.path.join(d, name[:-len(".pickle")] + ".yaml")
        if os.path.exists(path):
            return path
    return None


def program_check(memsim, scenario, rules, measured_reserved, tmp):
    """[(rule, memsim's peak reserved under it relative to the measured, in %)]."""
    path = os.path.join(tmp, "program.pickle")
    done = subprocess.run([memsim, "run", scenario, "--snapshot", path], capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        snap = pickle.load(f)
    seg = segment_events(snap)
    if seg is None:
        return []
    initial, events = seg
    snap = dict(snap, segments=[])  # the final layout would pin the original addresses
    out = []
    for rule in rules:
        r = replay(memsim, moved_snapshot(snap, initial, events, placed(initial, events, rule)), tmp)
        if r is not None:
            out.append((rule, 100.0 * (r[1] - measured_reserved) / measured_reserved))
    return out


# ---------------------------------------------------------------- main

def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--memsim", help="a built memsim binary: replay each run under each rule")
    ap.add_argument("--list", action="store_true", help="print every segment event")
    ap.add_argument("--rules", default="asc,desc,chunk")
    ap.add_argument("--scenarios", action="append", default=[],
                    help="a folder of RUN.yaml: also replay memsim's Program under each rule")
    args = ap.parse_args(argv[1:])
    rules = args.rules.split(",")
    total = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory() as tmp:
        for name, snap in load_sources(args.sources):
            seg = segment_events(snap)
            short = name.split("/")[-1]
            if seg is None:
                print("%-52s expandable segments: no cudaMalloc placement" % short[:52])
                continue
            initial, events = seg
            if args.list:
                base = events[0][1] if events else (initial[0][0] if initial else 0)
                print("== %s (%d segments before the trace)" % (name, len(initial)))
                for a, s, st in initial:
                    print("   initial  %9.1f MiB at %+10.1f MiB  stream %d" % (s / MIB, (a - base) / MIB, st))
                for k, a, s, st, i in events:
                    print("   %-7s  %9.1f MiB at %+10.1f MiB  stream %d  (trace entry %d)"
                          % ("cudaMalloc" if k == "S" else "cudaFree", s / MIB, (a - base) / MIB, st, i))
            truth = positions(initial, events)
            c = classes(initial, events)
            row = ["D%d A%d M%d N%d F%d" % (c["D"], c["A"], c["M"], c["N"], sum(1 for e in events if e[0] == "F"))]
            base_replay = replay(args.memsim, snap, tmp) if args.memsim else None
            total["_runs"]["runs"] += 1
            for rule in rules:
                where = placed(initial, events, rule)
                pred = positions(initial, events, where)
                n = sum(1 for t in truth if t is not None)
                ok = sum(1 for t, p in zip(truth, pred) if t is not None and t == p)
                cell = "%s %d/%d" % (rule, ok, n)
                t = total[rule]
                t["pos_ok"] += ok
                t["pos_n"] += n
                t["runs_all_pos"] += ok == n
                if base_replay and base_replay[0] == 0:
                    r = replay(args.memsim, moved_snapshot(snap, initial, events, where), tmp)
                    if r is not None:
                        mism, peak = r
                        same_peak = peak == base_replay[1]
                        cell += " mm%d %s" % (mism, "=" if same_peak else "%+.2f%%" % (100.0 * (peak - base_replay[1]) / base_replay[1]))
                        t["replayed"] += 1
                        t["replay_exact_decisions"] += mism == 0
                        t["replay_same_peak_reserved"] += same_peak
                row.append(cell)
            scenario = find_scenario(args.scenarios, short)
            if args.memsim and scenario and base_replay:
                cells = program_check(args.memsim, scenario, rules, base_replay[1], tmp)
                for rule, rel in cells:
                    total[rule]["prog_n"] += 1
                    total[rule]["prog_exact"] += rel == 0
                row.append("prog " + " ".join("%s %s" % (r, "=" if v == 0 else "%+.2f%%" % v) for r, v in cells))
            if args.memsim and (base_replay is None or base_replay[0] != 0):
                row.append("(the real trace does not replay cleanly: %s)" % (base_replay,))
            print("%-52s %s" % (short[:52], " | ".join(row)))
    print("totals over %d runs:" % total["_runs"]["runs"])
    for rule in rules:
        t = total[rule]
        line = "  %-6s same-size positions %d/%d; runs with every position right %d" % (
            rule, t["pos_ok"], t["pos_n"], t["runs_all_pos"])
        if t["prog_n"]:
            line += "; memsim's Program exact %d/%d" % (t["prog_exact"], t["prog_n"])
        if args.memsim:
            line += "; replayed %d: the trace's own blocks %d, the same peak reserved %d" % (
                t["replayed"], t["replay_exact_decisions"], t["replay_same_peak_reserved"])
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
