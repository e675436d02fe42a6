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
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_impl as mi  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = mi.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "impl_predictions.json")
DEVICE = "h200"


def run_memsim(memsim, yaml_path):
    """predict_common.prediction's fields; a mark memsim does not place (optimizer_end with
    optimizer.in_backward: the loop calls no step) is null."""
    return pc.prediction(pc.simulate(memsim, yaml_path), null_marks=True)


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
    a = pc.arguments()
    out = pc.predict_runs(a, mi.RUNS, scenario_yaml, run_memsim, lambda sp: {
        "scenario": sp["scenario"], "implementation": sp["impl"],
        "params": sp["dtype"], "attention": sp["attention"],
        "context_length": sp["cfg"]["context"], "in_backward": sp["in_backward"],
        "lora": sp["lora"], "sdpa_call": sp["sdpa"], "what": sp["why"]}, 28)
    if out is None:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_impl.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "impl_runs.json); whole_run_*: over setup, warm-up and measured step "
        "(compare whole_run_peak_*); marks: allocated / reserved after the measured "
        "step's forward, backward and optimizer step (compare marks.*."
        "allocated_bytes.all.current / reserved_bytes.all.current); "
        "allocations_whole_run: memory_stats()['allocation.all.allocated'] at the end. "
        "Scenarios: tests/data/gpu/impl/NAME.yaml (tools/gpu/predict_impl.py). "
        "Device preset h200.",
        a, out)


if __name__ == "__main__":
    main()
