#!/usr/bin/env python3
"""Where FSDP2's post-backward ran in the measured GPU runs, for
tests/test_gpu_fsdp2_post_backward.cpp (docs/fsdp2.md "When a block's post-backward runs").

Reads the committed snapshots (tests/data/gpu/fsdp2/fsdp2_snapshots.tar.xz: the
tools/fixtures/torch_models stand-in under fully_shard, full fine-tuning; and
tests/data/gpu/hft/hft_snapshots.tar.xz's hft_lora_fsdp2_w8: transformers' Qwen2 with PEFT
LoRA under fully_shard), whose trace entries carry Python frames (memsim's C++ snapshot
reader drops them), and writes tests/data/gpu/fsdp2_post_backward.json: per run, in its
measured step (the second of the trace's two steps), the trace index of

  - each group's reduce-scatter input (FSDP2's `allocate` under `foreach_reduce`, default
    stream), and whether `RegisterPostBackwardFunction.backward` or
    `_root_post_backward_final_callback` ran that post_backward;
  - the first unsharded parameter of each pre-backward copy-out (`alloc_storage` under
    `pre_backward`),

with the bytes the trace holds just before it (requested bytes: the sum of the trace's
allocations minus its completed frees since the empty allocator it started from). The test
recomputes those sums from the unpacked snapshot (the indices are what this script adds).

Only the standard library: python3 tools/gpu/extract_fsdp2_post_backward.py [--check]
(--check: exit 1 when the committed file differs from what the snapshots give).
"""
import io
import json
import os
import pickle
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "gpu", "fsdp2_post_backward.json")
# (archive, run name, scenario) for every measured FSDP2 run with a snapshot.
FSDP2 = ["fsdp2_w8_fp32", "fsdp2_w8_bf16_reduce_fp32", "fsdp2_w8_fp32_noreshard",
         "hsdp_r2_s4_fp32", "hsdp_r2_s4_bf16", "fsdp2_w8_fp32_reshard2",
         "fsdp2_w8_bf16_reduce_fp32_fullac", "fsdp2_w8_bf16_reduce_fp32_meta", "fsdp2_w4_fp32"]
RUNS = [("tests/data/gpu/fsdp2/fsdp2_snapshots.tar.xz", n, f"tests/data/gpu/fsdp2/{n}.yaml")
        for n in FSDP2]
RUNS.append(("tests/data/gpu/hft/hft_snapshots.tar.xz", "hft_lora_fsdp2_w8",
             "tests/data/gpu/hft/hft_lora_fsdp2_w8.yaml"))


def load(archive, name):
    with tarfile.open(os.path.join(ROOT, archive)) as tar:
        data = tar.extractfile(name + ".pickle").read()
    return pickle.load(io.BytesIO(data))


def events(trace):
    """(index, what, by, size, live) for every reduce-scatter input and pre-backward
    copy-out start, over the whole trace."""
    live, out, in_copy_out = 0, [], False
    for i, e in enumerate(trace):
        names = [f["name"] for f in e.get("frames", [])]
        act = e["action"]
        if act == "alloc":
            if ("foreach_reduce" in names and "post_backward" in names and "allocate" in names
                    and e["stream"] == 0):
                by = ("final_callback" if "_root_post_backward_final_callback" in names
                      else "RegisterPostBackwardFunction")
                out.append({"index": i, "what": "reduce_scatter", "by": by,
                            "size": e["size"], "live": live})
            copy_out = "pre_backward" in names and "alloc_storage" in names
            if copy_out and not in_copy_out:
                out.append({"index": i, "what": "pre_backward", "by": "",
                            "size": e["size"], "live": live})
            in_copy_out = copy_out
            live += e["size"]
        elif act == "free_completed":
            live -= e["size"]
    return out


def measured_step(evs):
    """The second half of each kind: the trace holds the warm-up step and the measured one."""
    keep = []
    for what in ("pre_backward", "reduce_scatter"):
        of = [e for e in evs if e["what"] == what]
        if len(of) % 2:
            raise SystemExit(f"an odd number of {what} events: not two equal steps")
        keep += of[len(of) // 2:]
    return sorted(keep, key=lambda e: e["index"])


def main():
    result = {"note": "written by tools/gpu/extract_fsdp2_post_backward.py from the committed "
                      "snapshots; live = requested bytes in the trace before the event",
              "runs": []}
    for archive, name, scenario in RUNS:
        snap = load(archive, name)
        trace = snap["device_traces"][0]
        result["runs"].append({"name": name, "archive": archive, "scenario": scenario,
                               "trace_entries": len(trace),
                               "events": measured_step(events(trace))})
    text = json.dumps(result, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(OUT) as f:
            if f.read() != text:
                print(f"{OUT} differs from the snapshots", file=sys.stderr)
                return 1
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
