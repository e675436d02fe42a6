"""Where memsim's Program and the H200 traces of tools/gpu/measure_moe_autocast.py part ways
(docs/moe.md "Measured on a GPU under autocast", "What the traces show").

  /usr/bin/python3 tools/gpu/compare_moe_autocast_traces.py MEMSIM SNAPSHOT_DIR [RUN ...]

MEMSIM is a built memsim binary; SNAPSHOT_DIR holds the runs' pickles (CMake unpacks
tests/data/gpu/moe_autocast/moe_autocast_snapshots.tar.xz to BUILD/gpu_moe_autocast_snapshots).
For each run (default: all six) it
  1. simulates tests/data/gpu/moe_autocast/RUN.yaml with `memsim run --snapshot` (memsim's
     Program as a trace whose entries name their tensors),
  2. aligns the allocations and frees above 1 MiB of both traces by size and order
     (difflib) and prints where they differ, with memsim's tensor names beside them
     (the real snapshots were written without frames: sizes and addresses only),
  3. replays both through `memsim replay` (the allocator emulator), then memsim's trace
     edited: (a) every segment given a lower virtual address than the ones before it
     (offsets kept), as the driver placed most of them in these runs -- PyTorch takes the
     lowest-addressed of equal-size free blocks, so the order decides which segment is
     reused; memsim's SimulatedDevice hands out ascending addresses. Prints each replay's
     peak allocated and reserved. (Until 2026-11-28 it also put transformers 5.17's eager
     mask into memsim's trace, one B*S*S*4 allocation from the embedding to the final norm;
     memsim now builds that mask itself: graph/models/decoder_mask_v5.cpp,
     docs/transformers5-mask.md.)
Plain Python (pickle, difflib, subprocess): no torch needed. Prints only; writes its
scratch files under a temporary folder.
"""
import bisect
import difflib
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS_DIR = os.path.join(HERE, "..", "..", "tests", "data", "gpu", "moe_autocast")
RUNS = ["moe_ac_tf_qwen3_moe_balanced", "moe_ac_tf_olmoe_skew", "moe_ac_tf_olmoe_mha_balanced_sdpa",
        "moe_ac_tf_olmoe_mha_balanced_sdpa_hfckpt", "moe_ac_tf_qwen3_moe_worst",
        "moe_ac_tf_mixtral_balanced"]


def trace_of(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def name_of(e):
    frames = e.get("frames") or []
    return frames[0]["name"] if frames else ""


def phase_of(e):
    frames = e.get("frames") or []
    return frames[1]["filename"] if len(frames) > 1 else ""


def large_events(trace, min_bytes=(1 << 20) + 1):
    """(kind, size, index, name): allocations, completed frees and new segments."""
    out = []
    for i, e in enumerate(trace):
        kind = {"alloc": "A", "free_completed": "F", "segment_alloc": "S"}.get(e["action"])
        if kind and e["size"] >= min_bytes:
            out.append((kind, e["size"], i, name_of(e)))
    return out


def print_differences(real, sim, limit):
    a, b = large_events(real), large_events(sim)
    sm = difflib.SequenceMatcher(None, [x[:2] for x in a], [x[:2] for x in b], autojunk=False)
    shown = 0
    for op, a1, a2, b1, b2 in sm.get_opcodes():
        if op == "equal":
            continue
        shown += 1
        if shown > limit:
            print("    ... (more)")
            return
        print("    %s" % op)
        for k, s, i, _ in a[a1:a2][:8]:
            print("      real   %s %11d @%d" % (k, s, i))
        for k, s, i, n in b[b1:b2][:8]:
            print("      memsim %s %11d @%d %s" % (k, s, i, n[:70]))


def edited(snapshot, trace):
    """snapshot with `trace` as device 0's and no final segment list (the replay would
    otherwise check the trace against the original addresses)."""
    out = dict(snapshot)
    out["device_traces"] = [trace] + snapshot["device_traces"][1:]
    out["segments"] = []
    return out


def descending_segments(trace):
    """The trace with each new segment at a lower address than all before it."""
    bases = sorted((e["addr"], e["size"]) for e in trace if e["action"] == "segment_alloc")
    order = [e["addr"] for e in trace if e["action"] == "segment_alloc"]
    size = dict(bases)
    new_base, top = {}, 1 << 45
    for b in order:
        top -= (size[b] + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        new_base[b] = top
    keys = [b for b, _ in bases]

    def moved(addr):
        i = bisect.bisect_right(keys, addr) - 1
        if i < 0 or addr >= keys[i] + size[keys[i]]:
            return addr
        return new_base[keys[i]] + (addr - keys[i])

    return [dict(e, addr=moved(e["addr"])) if "addr" in e else e for e in trace]


def replay(memsim, path):
    done = subprocess.run([memsim, "replay", path, "--json", "-"], capture_output=True, text=True)
    j = json.loads(done.stdout)
    return j["peak_allocated_bytes"], j["peak_reserved_bytes"]


def pct(pred, real):
    return "%+.2f%%" % (100.0 * (pred - real) / real)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    memsim, snaps = argv[1], argv[2]
    runs = argv[3:] or RUNS
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            real_path = os.path.join(snaps, run + ".pickle")
            sim_path = os.path.join(tmp, run + ".pickle")
            subprocess.run([memsim, "run", os.path.join(RUNS_DIR, run + ".yaml"), "--snapshot", sim_path],
                           capture_output=True, check=False)
            real, sim = trace_of(real_path), trace_of(sim_path)
            print(run)
            print("  allocations/frees above 1 MiB that differ (real trace vs memsim's Program):")
            print_differences(real["device_traces"][0], sim["device_traces"][0], limit=12)
            ra, rr = replay(memsim, real_path)
            sa, sr = replay(memsim, sim_path)
            print("  replayed: real %d / %d; memsim %d / %d (%s / %s)" % (ra, rr, sa, sr, pct(sa, ra), pct(sr, rr)))
            trace = sim["device_traces"][0]
            variants = [("descending segment addresses", descending_segments(trace))]
            for label, t in variants:
                path = os.path.join(tmp, run + "_edited.pickle")
                with open(path, "wb") as f:
                    pickle.dump(edited(sim, t), f, protocol=4)
                ea, er = replay(memsim, path)
                print("  memsim, %s: %d / %d (%s / %s)" % (label, ea, er, pct(ea, ra), pct(er, rr)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
