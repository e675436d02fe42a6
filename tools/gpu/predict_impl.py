#!/usr/bin/env python3
"""memsim's blind predictions for the runs of tools/gpu/measure_impl.py (the torchtitan,
torchtune and LitGPT Llama stand-ins on a GPU), made before anything is measured. Run on
the development machine (no GPU needed):

    python3 tools/gpu/predict_impl.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/impl/NAME.yaml: family hf-llama
   with `model.implementation` the run's stack, at the run's shape, `model.attention`
   flash (bf16) or mem-efficient (fp32), the run's parameter dtype, AdamW foreach with one
   warm-up step (`optimizer.in_backward` / `lora.*` where the run has them), on the h200
   device preset (the lease's GPU). The loop is each implementation's own (memsim models
   the `del pred` / `del logits` of torchtitan and torchtune and LitGPT's full.py loop).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/impl_predictions.json (predict_fsdp2.py's fields, null marks allowed: the measured step's
   peak allocated / reserved, the whole run's, the marks, the allocation count, where the
   peak falls, or memsim's refusal text) with the memsim commit.

tests/test_gpu_impl_runs.cpp re-simulates every scenario and fails if a prediction in the
file no longer matches what memsim predicts: the blind record stays what memsim said.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_impl as mi  # noqa: E402
import predict_arch as pa  # noqa: E402

REPO = mi.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "impl_predictions.json")
DEVICE = "h200"


def run_memsim(memsim, yaml_path):
    """predict_fsdp2.run_memsim's fields; a mark memsim does not place (optimizer_end with
    optimizer.in_backward: the loop calls no step) is null."""
    with tempfile.TemporaryDirectory() as tmp:
        tl = os.path.join(tmp, "timeline.csv")
        p = subprocess.run([memsim, "run", yaml_path, "--json", "-", "--timeline", tl],
                           capture_output=True, text=True, cwd=REPO)
        if p.returncode != 0:
            return {"refused": (p.stderr or p.stdout).strip()}
        j = json.loads(p.stdout)
        whole_alloc = whole_reserved = 0
        with open(tl) as f:
            for row in csv.DictReader(f):
                whole_alloc = max(whole_alloc, int(row["allocated"]))
                whole_reserved = max(whole_reserved, int(row["reserved"]))
    peak = j.get("peak_event") or {}
    marks = {k: ({"allocated": v["allocated"], "reserved": v["reserved"]} if v else None)
             for k, v in j["marks"].items()}
    stats = j.get("memory_stats", {})
    return {
        "peak_allocated_bytes": j["peak_allocated_bytes"],
        "peak_reserved_bytes": j["peak_reserved_bytes"],
        "whole_run_peak_allocated_bytes": whole_alloc,
        "whole_run_peak_reserved_bytes": whole_reserved,
        "marks": marks,
        "allocations_whole_run": stats.get("allocation.all.allocated"),
        "parameter_count": j["model"]["parameter_count"],
        "fits": j["fits"],
        "peak_at": f"{peak.get('phase')} {peak.get('op')} (layer {peak.get('layer')})",
    }


def scenario_yaml(sp):
    c = sp["cfg"]
    lines = [f"# {sp['name']}: tools/gpu/measure_impl.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_impl.py; blind predictions in",
             "# tests/data/gpu/impl_predictions.json).",
             f"# {sp['why']}.",
             f"# SDPA called: {sp['sdpa']} (measure_impl.py spec 'sdpa'; memsim's kernel: "
             f"{sp['attention']}).",
             "# The stand-in: tools/fixtures/impl_models.py with the CUDA kernels (measure_impl.py).",
             f"name: {sp['name']}", "model:", "  family: hf-llama",
             f"  implementation: {sp['impl']}"]
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines.append(f"  context_length: {c['context']}")
    lines.append(f"  attention: {sp['attention']}")
    lines.append(f"  dropout: {pa.yaml_value(float(c['dropout']))}")
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}}}")
    opt = [f"type: {sp['optimizer']}", f"impl: {sp['opt_impl']}"]
    if sp["in_backward"]:
        opt.append("in_backward: true")
    lines.append("optimizer: {" + ", ".join(opt) + "}")
    if sp["lora"]:
        lo = sp["lora"]
        lines.append(f"lora: {{rank: {lo['rank']}, alpha: {pa.yaml_value(float(lo['alpha']))}, "
                     f"targets: {pa.yaml_value(lo['targets'])}}}")
    lines.append(f"step: {{kind: train, warmup_steps: {sp['warmup']}}}")
    lines.append(f"device: {{preset: {DEVICE}}}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memsim", default=os.path.join(REPO, "build", "memsim"))
    ap.add_argument("--memsim-repo", default=None,
                    help="the checkout the memsim binary was built from (for its commit)")
    ap.add_argument("--memsim-commit", default=None,
                    help="the commit of memsim's sources the binary was built from "
                         "(default: the checkout's HEAD)")
    ap.add_argument("--scenarios-only", action="store_true")
    a = ap.parse_args()
    out = {}
    for sp in mi.RUNS:
        pa.write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
        if a.scenarios_only:
            continue
        pred = run_memsim(os.path.abspath(a.memsim), sp["scenario"])
        entry = {"scenario": sp["scenario"], "implementation": sp["impl"],
                 "params": sp["dtype"], "attention": sp["attention"],
                 "context_length": sp["cfg"]["context"], "in_backward": sp["in_backward"],
                 "lora": sp["lora"], "sdpa_call": sp["sdpa"], "what": sp["why"]}
        entry.update(pred)
        out[sp["name"]] = entry
        if "refused" in pred:
            print(f"{sp['name']:28s} REFUSED: {pred['refused']}")
        else:
            print(f"{sp['name']:28s} step {pred['peak_allocated_bytes'] / 2**20:9.2f} MiB alloc "
                  f"{pred['peak_reserved_bytes'] / 2**20:9.2f} MiB reserved; whole run "
                  f"{pred['whole_run_peak_allocated_bytes'] / 2**20:9.2f} / "
                  f"{pred['whole_run_peak_reserved_bytes'] / 2**20:9.2f} MiB  {pred['peak_at']}")
    if a.scenarios_only:
        return
    memsim_repo = a.memsim_repo or os.path.dirname(os.path.dirname(os.path.abspath(a.memsim)))
    doc = {
        "note": "memsim's blind predictions for tools/gpu/measure_impl.py's runs, committed "
                "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
                "the measured step's (compare measured_step_peak_allocated / _reserved in "
                "impl_runs.json); whole_run_*: over setup, warm-up and measured step "
                "(compare whole_run_peak_*); marks: allocated / reserved after the measured "
                "step's forward, backward and optimizer step (compare marks.*."
                "allocated_bytes.all.current / reserved_bytes.all.current); "
                "allocations_whole_run: memory_stats()['allocation.all.allocated'] at the end. "
                "Scenarios: tests/data/gpu/impl/NAME.yaml (tools/gpu/predict_impl.py). "
                "Device preset h200.",
        "memsim_commit": a.memsim_commit or pa.git("rev-parse", "HEAD", cwd=memsim_repo),
        "memsim_binary": os.path.relpath(os.path.abspath(a.memsim), memsim_repo),
        "predictions": out,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(out)} predictions ({sum('refused' in e for e in out.values())} refused) -> "
          f"{os.path.relpath(OUT, REPO)}")


if __name__ == "__main__":
    main()
