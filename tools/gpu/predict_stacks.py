#!/usr/bin/env python3
"""memsim's blind predictions for the runs of tools/gpu/measure_stacks.py (torch.compile,
torchtitan's SAC, chunked cross-entropy), made before anything is measured. Run on the
development machine (no GPU needed):

    python3 tools/gpu/predict_stacks.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/stacks/NAME.yaml: the hf-llama
   family at the run's shape (the stand-in tools/fixtures/torch_models.LlamaForCausalLM,
   as tests/test_h100_runs.cpp writes measure_cuda.py's runs), the loop measure_stacks.py
   runs (AdamW foreach, one warm-up step) and the run's feature keys (step.compile,
   step.compile_scope, step.compile_memory_budget; checkpoint.policy sac-op / sac-layer:N
   with torchtitan's early_stop false, memsim's default for them; loss.impl), on the h200
   device preset (the lease's GPU).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/stacks_predictions.json (predict_fsdp2.py's fields: the measured step's
   peak allocated / reserved, the whole run's, the marks, the allocation count, where the
   peak falls, or memsim's refusal text) with the memsim commit.

tests/test_gpu_stacks_runs.cpp re-simulates every scenario and fails if a prediction in the
file no longer matches what memsim predicts: the blind record stays what memsim said.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_stacks as ms  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402
import predict_fsdp2 as pf  # noqa: E402

REPO = ms.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "stacks_predictions.json")
DEVICE = "h200"


def scenario_yaml(sp):
    c = sp["cfg"]
    lines = [f"# {sp['name']}: tools/gpu/measure_stacks.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_stacks.py; blind predictions in",
             "# tests/data/gpu/stacks_predictions.json).",
             f"# {sp['why']}.",
             "# The stand-in: tools/fixtures/torch_models.LlamaForCausalLM (hf-llama, HF v4.45",
             "# eager attention).",
             f"name: {sp['name']}", "model:", "  family: hf-llama"]
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines.append(f"  context_length: {c['context']}")
    lines.append(f"  tied_embeddings: {pa.yaml_value(bool(c['tied']))}")
    lines.append(f"  attention: {sp['attention']}")
    lines.append(f"  dropout: {pa.yaml_value(float(c['dropout']))}")
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}")
    lines.append(f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}")
    step = ["kind: train", f"warmup_steps: {sp['warmup']}"]
    if sp["compile_scope"]:
        step += ["compile: true", f"compile_scope: {sp['compile_scope']}"]
        if sp["memory_budget"] is not None:
            step.append(f"compile_memory_budget: {sp['memory_budget']}")
    lines.append("step: {" + ", ".join(step) + "}")
    lines.append(f"checkpoint: {{policy: {sp['policy']}}}")
    if sp["loss"] != "hf":
        lines.append(f"loss: {{impl: '{sp['loss']}'}}")
    lines.append(f"device: {{preset: {DEVICE}}}")
    return "\n".join(lines) + "\n"


def main():
    a = pc.arguments()
    out = pc.predict_runs(a, ms.RUNS, scenario_yaml, pf.run_memsim, lambda sp: {
        "scenario": sp["scenario"], "feature": sp["feature"],
        "checkpoint": sp["policy"], "compile_scope": sp["compile_scope"],
        "compile_memory_budget": sp["memory_budget"], "loss": sp["loss"],
        "what": sp["why"]}, 26)
    if out is None:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_stacks.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "stacks_runs.json); whole_run_*: over setup, warm-up and measured step "
        "(compare whole_run_peak_*; for compile runs the real warm-up includes "
        "compilation); marks: allocated / reserved after the measured step's forward, "
        "backward and optimizer step (compare marks.*.allocated_bytes.all.current / "
        "reserved_bytes.all.current); allocations_whole_run: memory_stats()"
        "['allocation.all.allocated'] at the end. Scenarios: tests/data/gpu/stacks/"
        "NAME.yaml (tools/gpu/predict_stacks.py). Device preset h200.",
        a, out)


if __name__ == "__main__":
    main()
