#!/usr/bin/env python3
"""memsim's blind predictions for the runs of tools/gpu/measure_gscaler.py (fp16 autocast
with torch.amp.GradScaler on the HF LLaMA stand-in), made before anything is measured. Run on
the development machine (no GPU needed):

    python3 tools/gpu/predict_gscaler.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/gscaler/NAME.yaml: family hf-llama
   at the run's shape (measure_cuda.py's LLAMA), eager attention, fp32 parameters,
   `precision.autocast: fp16` with `precision.grad_scaler` the run's, AdamW foreach, one
   warm-up step, `checkpoint.policy` the run's (non-reentrant), on the h200 device preset
   (the lease's GPU).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/gscaler_predictions.json (predict_common's fields: the measured step's
   peaks, the whole run's, the marks, the allocation count, where the peak falls, or
   memsim's refusal) with the memsim commit.

The clip run (unscale_ + clip_grad_norm_) was first committed as a refusal (memsim had no
key for the clipping). Since optimizer.max_grad_norm (sim/step/clip_grad.h) its scenario sets
`max_grad_norm` and its entry is a prediction, marked "predicted" as made after session 10's
refused GPU lease and before any measurement, with the same step unclipped
("without_clipping", `--set optimizer.max_grad_norm=0`) beside it.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_gscaler as mg  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = pc.REPO
DATA = "tests/data/gpu/gscaler"
OUT = os.path.join(REPO, "tests", "data", "gpu", "gscaler_predictions.json")
DEVICE = "h200"
# The control's nearest measured run: measure_cuda.py's llama_l4_d1024_s1024_b4_autocast_bf16
# (the same stand-in, shape and loop under bf16 autocast; bf16 and fp16 give memsim the same
# events for hf-llama), H100, torch 2.11 (tests/data/h100/cuda_runs.json).
REFERENCE = {"run": "llama_l4_d1024_s1024_b4_autocast_bf16 (tests/data/h100/cuda_runs.json, H100, torch 2.11)",
             "measured_step_peak_allocated": 6268196352, "measured_step_peak_reserved": 6392119296,
             "forward_end_allocated": 4695331840, "backward_end_allocated": 2388345856,
             "note": "memsim's known gap there: CUB scratch in the small pool (tests/test_h100_runs.cpp)"}


def scenario_path(sp):
    return f"{DATA}/{sp['name']}.yaml"


def scenario_yaml(sp):
    c = sp["cfg"]
    what = ("fp16 autocast + torch.amp.GradScaler: scaler.scale(loss).backward(); "
            "scaler.step(opt); scaler.update()" if sp["grad_scaler"]
            else "fp16 autocast without a scaler (the step unscaled: loss.backward(); opt.step())")
    lines = [f"# {sp['name']}: tools/gpu/measure_gscaler.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_gscaler.py; blind predictions in",
             "# tests/data/gpu/gscaler_predictions.json).",
             f"# {what}.",
             "# The model: tools/fixtures/torch_models.py's LlamaForCausalLM stand-in, fp32 weights."]
    if sp["clip_grad_norm"] is not None:
        lines.append("# The run also calls scaler.unscale_(opt) and torch.nn.utils.clip_grad_norm_("
                     f"params, {sp['clip_grad_norm']}) before scaler.step")
        lines.append("# (optimizer.max_grad_norm; its returned norm is dropped by the statement).")
    lines += [f"name: {sp['name']}", "model:", "  family: hf-llama"]
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines += [f"  context_length: {c['context']}", "  tied_embeddings: false",
              f"  attention: {sp['attention']}",
              f"  dropout: {pa.yaml_value(float(c['dropout']))}",
              f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}",
              f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}, "
              f"grad_scaler: {'true' if sp['grad_scaler'] else 'false'}}}",
              f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}"
              + (f", max_grad_norm: {pa.yaml_value(float(sp['clip_grad_norm']))}}}"
                 if sp["clip_grad_norm"] is not None else "}"),
              f"step: {{kind: train, warmup_steps: {sp['warmup']}}}",
              f"checkpoint: {{policy: {sp['policy']}}}",
              f"device: {{preset: {DEVICE}}}"]
    return "\n".join(lines) + "\n"


def main():
    a = pc.arguments()
    out = {}
    for sp in mg.SPECS:
        path = scenario_path(sp)
        pa.write_if_changed(os.path.join(REPO, path), scenario_yaml(sp))
        if a.scenarios_only:
            continue
        pred = pc.prediction(pc.simulate(os.path.abspath(a.memsim), path))
        entry = {"scenario": path, "grad_scaler": sp["grad_scaler"], "policy": sp["policy"],
                 "clip_grad_norm": sp["clip_grad_norm"]}
        entry.update(pred)
        pc.show(sp["name"], 44, pred)
        if sp["clip_grad_norm"] is not None:
            entry["predicted"] = ("after session 10's refused GPU lease, before any measurement "
                                  "(first committed as a refusal: memsim had no clipping key)")
            entry["without_clipping"] = pc.prediction(pc.simulate(
                os.path.abspath(a.memsim), path, sets=("optimizer.max_grad_norm=0",)))
        out[sp["name"]] = entry
    if a.scenarios_only:
        return
    # The scaler's own share, free of what memsim misses in the step it shares with the
    # control (CUB scratch etc.): each scaler run minus the control, to compare with the
    # measured runs' same differences.
    base = out[mg.BASE + "_fp16"]
    for name in (mg.BASE + "_fp16_scaler",):
        e = out[name]
        e["minus_control"] = {
            "peak_allocated_bytes": e["peak_allocated_bytes"] - base["peak_allocated_bytes"],
            "allocations_whole_run": e["allocations_whole_run"] - base["allocations_whole_run"],
            "marks_allocated": {k: e["marks"][k]["allocated"] - base["marks"][k]["allocated"]
                                for k in e["marks"] if e["marks"][k] and base["marks"].get(k)}}
    base["reference"] = REFERENCE
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_gscaler.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: the "
        "measured step's (compare measured_step_peak_allocated / _reserved in "
        "gscaler_runs.json); whole_run_*: over setup, warm-up and measured step (compare "
        "whole_run_peak_*); marks: allocated / reserved after the measured step's forward "
        "(compare marks.forward_end), backward (marks.backward_end: after the scaled "
        "backward statement) and optimizer step (memsim's optimizer_end is after "
        "scaler.update(): compare marks.update_end); allocations_whole_run: "
        "memory_stats()['allocation.all.allocated'] at the end. Scenarios: "
        "tests/data/gpu/gscaler/NAME.yaml (tools/gpu/predict_gscaler.py). Device preset h200.",
        a, out)


if __name__ == "__main__":
    main()
