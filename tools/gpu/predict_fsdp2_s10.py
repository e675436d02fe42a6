#!/usr/bin/env python3
"""memsim's blind predictions for the session-10 FSDP2 compositions of
tools/gpu/measure_fsdp2.py (RUNS_S10, tools/gpu/fsdp2_compose.py), made before anything is
measured. Run on the development machine (no GPU needed):

    python3 tools/gpu/predict_fsdp2_s10.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every RUNS_S10 run, tests/data/gpu/fsdp2/NAME.yaml:
   - the llama-row stand-in (torch_models.DecoderForCausalLM): predict_fsdp2.scenario_yaml's
     file, plus the run's keys;
   - torch_models.LlamaForCausalLM: `model.family: hf-llama` (memsim's autocast rules are
     modelled for that family; the llama row with its knobs is refused with autocast);
   - impl_models.TitanTransformer: `model.family: hf-llama`, `implementation: torchtitan`,
     `attention: flash` (measure_fsdp2 enables only the flash SDPA backend);
   and the composition's keys: `precision.autocast: bf16`; `parallel.fsdp_output_dtype: bf16`
   with `step.keep_output: loss` (HF Trainer's step: the loss in the root's forward);
   `step.compile: true` + `step.compile_scope: block`; `checkpoint.policy`; `fsdp_init: cpu`
   for the meta-device builds. Device preset h200 (the machine that measures).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/fsdp2_s10_predictions.json (predict_common.prediction's fields: the
   measured step's peak allocated / reserved, the whole run's, the marks forward_end /
   backward_end / optimizer_end, the allocation count, where the peak falls; or memsim's
   refusal), with the memsim commit. The committed predictions of the measured RUNS
   (tests/data/gpu/fsdp2_predictions.json, predict_fsdp2.py) are left as they are.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_fsdp2 as mf  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402
import predict_fsdp2 as pf  # noqa: E402

REPO = mf.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "fsdp2_s10_predictions.json")

WHAT = {
    "hf-llama": "tools/fixtures/torch_models.LlamaForCausalLM (memsim's hf-llama family: HF "
                "LlamaForCausalLM v4.45, eager attention)",
    "torchtitan": "tools/fixtures/impl_models.TitanTransformer (torchtitan 5077be6e's llama3 "
                  "code) with the CUDA kernels of measure_impl.go_native, SDPA flash only",
}


def model_lines(sp):
    """The model: block of a LlamaForCausalLM or TitanTransformer run."""
    c = sp["cfg"]
    lines = ["model:", "  family: hf-llama"]
    if sp["model"] == "torchtitan":
        lines.append("  implementation: torchtitan")
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines.append(f"  context_length: {c['context']}")
    lines.append(f"  attention: {sp['attention']}")
    lines.append(f"  dropout: {pa.yaml_value(float(c['dropout']))}")
    return lines


def scenario_yaml(sp):
    if sp["model"] == "standin":
        base = pf.scenario_yaml(sp).rstrip("\n").split("\n")
        body = [ln for ln in base if not ln.startswith("#") and not ln.startswith("name:")]
        stand_in = [ln for ln in base if ln.startswith("# The stand-in") or ln.startswith("# (v4")]
        cut = body.index("batch: {micro_batch: %d, seq_len: %d}" % (sp["cfg"]["batch"],
                                                                    sp["cfg"]["seq"]))
        model = body[:cut]
        stand_in = "\n".join(stand_in)
    else:
        model = model_lines(sp)
        stand_in = f"# The stand-in: {WHAT[sp['model']]}."
    c = sp["cfg"]
    lines = [f"# {sp['name']}: tools/gpu/measure_fsdp2.py's RUNS_S10 run as memsim simulates it",
             "# (written by tools/gpu/predict_fsdp2_s10.py; blind predictions in",
             "# tests/data/gpu/fsdp2_s10_predictions.json). One GPU as rank 0 of a fake process",
             f"# group of {sp['world']} ranks: {sp['why']}.",
             stand_in, f"name: {sp['name']}"]
    lines += model
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}")
    lines.append(f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}")
    step = ["kind: train", f"warmup_steps: {sp['warmup']}"]
    if sp["loop"] == "hf-trainer":
        step.append("keep_output: loss")
    if sp["compile"]:
        step += ["compile: true", f"compile_scope: {sp['compile']}"]
    lines.append("step: {" + ", ".join(step) + "}")
    lines.append(f"checkpoint: {{policy: {sp['policy']}}}")
    lines.append("parallel:")
    lines.append(f"  data: {sp['world']}")
    lines.append("  sharding: fsdp2")
    lines.append(f"  reshard_after_forward: {sp['reshard']}")
    if sp["param_dtype"]:
        lines.append(f"  fsdp_mixed_precision: {sp['param_dtype']}")
    if sp["reduce_dtype"]:
        lines.append(f"  reduce_dtype: {sp['reduce_dtype']}")
    if sp["output_dtype"]:
        lines.append(f"  fsdp_output_dtype: {sp['output_dtype']}")
    lines.append(f"  fsdp_init: {'cpu' if sp['init'] == 'meta' else 'gpu'}")
    lines.append(f"device: {{preset: {sp['device']}}}")
    return "\n".join(lines) + "\n"


def main():
    a = pc.arguments()
    out = pc.predict_runs(a, mf.RUNS_S10, scenario_yaml,
                          lambda memsim, path: pc.prediction(pc.simulate(memsim, path)), lambda sp: {
        "scenario": sp["scenario"], "model": sp["model"], "loop": sp["loop"],
        "world": sp["world"], "reshard_after_forward": sp["reshard"],
        "param_dtype": sp["param_dtype"], "reduce_dtype": sp["reduce_dtype"],
        "output_dtype": sp["output_dtype"], "autocast": sp["autocast"],
        "compile": sp["compile"], "checkpoint": sp["policy"], "ac": sp["ac"],
        "init": sp["init"], "what": sp["why"]}, 46)
    if out is None:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_fsdp2.py's RUNS_S10 (the "
        "session-10 FSDP2 compositions: autocast, output_dtype, per-block compile, "
        "torchtitan's code), committed before any of them was measured. "
        "peak_allocated_bytes / peak_reserved_bytes: the measured step's (compare "
        "measured_step_peak_allocated / _reserved in the runs JSON); whole_run_*: over "
        "setup, warm-up and measured step (compare whole_run_peak_*); marks: allocated / "
        "reserved after the measured step's forward, backward and optimizer step (compare "
        "marks.*.allocated_bytes.all.current / reserved_bytes.all.current); "
        "allocations_whole_run: memory_stats()['allocation.all.allocated'] at the end. "
        "Scenarios: tests/data/gpu/fsdp2/NAME.yaml (tools/gpu/predict_fsdp2_s10.py). "
        "Compiled runs: memsim does not model Inductor's compile-time allocations of the "
        "warm-up step (reserved) nor its fused backward kernels (docs/compile.md Limits).",
        a, out)


if __name__ == "__main__":
    main()
