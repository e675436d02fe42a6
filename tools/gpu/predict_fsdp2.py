#!/usr/bin/env python3
"""memsim's blind predictions for the FSDP2 runs of tools/gpu/measure_fsdp2.py, made before
anything is measured. Run on the development machine (no GPU needed):

    python3 tools/gpu/predict_fsdp2.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/fsdp2/NAME.yaml: the stand-in
   (torch_models.DecoderForCausalLM as the llama row, every knob written out as
   tools/gpu/predict_arch.py writes them), the training loop measure_fsdp2.py runs (AdamW
   foreach, one warm-up step, the run's checkpointing) and the FSDP2 keys of the run
   (parallel.data = the fake world, sharding fsdp2, reshard_after_forward, replicate,
   fsdp_mixed_precision / reduce_dtype, fsdp_init: cpu for the meta-device runs).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/fsdp2_predictions.json: the measured step's peak allocated / reserved
   (to compare with measure_fsdp2.py's measured_step_peak_allocated / _reserved), the
   whole run's (the maximum over every event of setup, warm-up and measured step: its
   whole_run_peak_*), allocated / reserved at the forward_end, backward_end and
   optimizer_end marks, the number of allocations of the whole run
   (memory_stats()["allocation.all.allocated"] at the end), where the peak falls, or
   memsim's refusal text; with the memsim commit.

tests/test_gpu_fsdp2_runs.cpp re-simulates every scenario and fails if a prediction in the
file no longer matches what memsim predicts: the blind record stays what memsim said.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_fsdp2 as mf  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = mf.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "fsdp2_predictions.json")


def scenario_yaml(sp):
    c = mf.standin_cfg(sp)
    a = c["arch"]
    lines = [f"# {sp['name']}: tools/gpu/measure_fsdp2.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_fsdp2.py; blind predictions in",
             "# tests/data/gpu/fsdp2_predictions.json). One GPU as rank 0 of a fake process",
             f"# group of {sp['world']} ranks: {sp['why']}.",
             "# The stand-in: tools/fixtures/torch_models.DecoderForCausalLM as the llama row",
             f"# ({c['transformers']}), without biases.",
             f"name: {sp['name']}", "model:", "  architecture: llama"]
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines.append(f"  context_length: {c['context']}")
    lines.append(f"  tied_embeddings: {pa.yaml_value(bool(c.get('tied', False)))}")
    for k in pa.KNOBS:
        v = a[k]
        if k == "sliding_layers":
            if not a["sliding_window"]:
                continue
            v = list(v) if v else "all"
        lines.append(f"  {k}: {pa.yaml_value(v)}")
    lines.append(f"  attention: {sp['attention']}")
    lines.append(f"  dropout: {pa.yaml_value(float(c['dropout']))}")
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}")
    lines.append(f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}")
    lines.append(f"step: {{kind: train, warmup_steps: {sp['warmup']}}}")
    lines.append(f"checkpoint: {{policy: {sp['policy']}}}")
    lines.append("parallel:")
    lines.append(f"  data: {sp['world']}")
    lines.append("  sharding: fsdp2")
    lines.append(f"  reshard_after_forward: {sp['reshard']}")
    if sp["replicate"] > 1:
        lines.append(f"  replicate: {sp['replicate']}")
    if sp["param_dtype"]:
        lines.append(f"  fsdp_mixed_precision: {sp['param_dtype']}")
    if sp["reduce_dtype"]:
        lines.append(f"  reduce_dtype: {sp['reduce_dtype']}")
    lines.append(f"  fsdp_init: {'cpu' if sp['init'] == 'meta' else 'gpu'}")
    lines.append("device: {preset: h100-80gb}")
    return "\n".join(lines) + "\n"


def run_memsim(memsim, yaml_path):
    """predict_common.prediction's fields for one scenario (predict_stacks.py's too)."""
    return pc.prediction(pc.simulate(memsim, yaml_path))


def main():
    a = pc.arguments()
    out = pc.predict_runs(a, mf.RUNS, scenario_yaml, run_memsim, lambda sp: {
        "scenario": sp["scenario"], "world": sp["world"], "replicate": sp["replicate"],
        "reshard_after_forward": sp["reshard"], "param_dtype": sp["param_dtype"],
        "reduce_dtype": sp["reduce_dtype"], "checkpoint": sp["policy"],
        "init": sp["init"], "what": sp["why"]}, 36)
    if out is None:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_fsdp2.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "fsdp2_runs.json); whole_run_*: over setup, warm-up and measured step "
        "(compare whole_run_peak_*); marks: allocated / reserved after the measured "
        "step's forward, backward and optimizer step (compare marks.*."
        "allocated_bytes.all.current / reserved_bytes.all.current); "
        "allocations_whole_run: memory_stats()['allocation.all.allocated'] at the "
        "end. Scenarios: tests/data/gpu/fsdp2/NAME.yaml (tools/gpu/predict_fsdp2.py).",
        a, out)


if __name__ == "__main__":
    main()
