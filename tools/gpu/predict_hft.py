#!/usr/bin/env python3
"""memsim's blind predictions for the runs of tools/gpu/measure_hft.py (HF Trainer and PEFT
defaults on transformers 5.17's Qwen2), made before anything is measured. Run on the
development machine (no GPU needed):

    python3 tools/gpu/predict_hft.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/hft/NAME.yaml: the run's
   config.json (model.hf_config), transformers 5.x's code (model.transformers: 5), SDPA as
   the fused kernel PyTorch picks (flash for the bf16 autocast casts, mem-efficient in
   fp32), Trainer's step (step.keep_output: loss: compute_loss drops the outputs before
   backward, training_step returns loss.detach()), fused AdamW (foreach under FSDP2),
   checkpointing as gradient_checkpointing_enable() sets it (checkpoint.policy full;
   checkpoint.reentrant: false, transformers 5.x's default since PR #43203, or the run's
   explicit kwargs), LoRA as PEFT builds it (lora.input_require_grads: true: PEFT
   registers enable_input_require_grads when the model has checkpointing on), FSDP2 over 8
   ranks, on the h200 device preset (the lease's GPU).
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each (and, for the runs whose
   reentrancy is transformers' default, the same with checkpoint.reentrant flipped: the
   measurement records which one ran) and writes tests/data/gpu/hft_predictions.json with
   the memsim commit.

tests/test_gpu_hft_runs.cpp re-simulates every scenario and fails if a prediction in the
file no longer matches what memsim predicts: the blind record stays what memsim said.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_hft as mh  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = mh.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "hft_predictions.json")
DEVICE = "h200"


def reentrant_of(sp):
    """The scenario's checkpoint.reentrant: the run's explicit kwargs, else transformers
    5.x's default (use_reentrant False, huggingface/transformers PR #43203)."""
    if not sp["gc"]:
        return None
    return bool((sp["gc_kwargs"] or {}).get("use_reentrant", False))


def scenario_yaml(sp):
    attention = "flash" if sp["autocast"] == "bf16" else "mem-efficient"
    cfg_rel = os.path.relpath(os.path.join(REPO, sp["hf_config"]),
                              os.path.dirname(os.path.join(REPO, sp["scenario"])))
    lines = [f"# {sp['name']}: tools/gpu/measure_hft.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_hft.py; blind predictions in",
             "# tests/data/gpu/hft_predictions.json).",
             f"# {sp['why']}.",
             "# transformers' Qwen2ForCausalLM (AutoModelForCausalLM.from_config of the",
             "# config.json, attn_implementation sdpa), HF Trainer's training_step replicated.",
             f"name: {sp['name']}", "model:", f"  hf_config: {cfg_rel}",
             "  transformers: 5", f"  attention: {attention}", "  dropout: 0.0",
             f"batch: {{micro_batch: {sp['batch']}, seq_len: {sp['seq']}}}",
             f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}",
             f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}",
             f"step: {{kind: train, warmup_steps: {sp['warmup']}, keep_output: loss}}"]
    if sp["gc"]:
        lines.append(f"checkpoint: {{policy: full, reentrant: {pa.yaml_value(reentrant_of(sp))}}}")
    else:
        lines.append("checkpoint: {policy: none}")
    if sp["lora"]:
        lo = sp["lora"]
        lines.append("lora:")
        lines.append(f"  rank: {lo['r']}")
        lines.append(f"  alpha: {lo['lora_alpha']}")
        lines.append(f"  targets: {pa.yaml_value(lo['target_modules'])}")
        lines.append(f"  dropout: {pa.yaml_value(float(lo['lora_dropout']))}")
        if sp["gc"]:
            lines.append("  input_require_grads: true  # PEFT's hook (checkpointing was on)")
    if sp["fsdp2_world"]:
        lines.append(f"parallel: {{data: {sp['fsdp2_world']}, sharding: fsdp2}}")
    lines.append(f"device: {{preset: {DEVICE}}}")
    return "\n".join(lines) + "\n"


def run_memsim(memsim, yaml_path, sets=()):
    return pc.prediction(pc.simulate(memsim, yaml_path, sets), allocations=False,
                         trainable=True)


def show(name, pred):
    pc.show(name, 40, pred)


def main():
    a = pc.arguments()
    out = {}
    for sp in mh.RUNS:
        pa.write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
        if a.scenarios_only:
            continue
        memsim = os.path.abspath(a.memsim)
        pred = run_memsim(memsim, sp["scenario"])
        entry = {"scenario": sp["scenario"], "autocast": sp["autocast"],
                 "gradient_checkpointing": sp["gc"], "gc_kwargs": sp["gc_kwargs"],
                 "checkpoint_reentrant": reentrant_of(sp), "lora": sp["lora"],
                 "fsdp2_world": sp["fsdp2_world"], "what": sp["why"]}
        entry.update(pred)
        show(sp["name"], pred)
        if sp["gc"] and sp["gc_kwargs"] is None:
            # transformers' default decides; the run records which (checkpointing.kwargs).
            flip = not reentrant_of(sp)
            alt = run_memsim(memsim, sp["scenario"],
                             [f"checkpoint.reentrant={pa.yaml_value(flip)}"])
            entry["if_reentrant_" + pa.yaml_value(flip)] = alt
            show(f"  {sp['name']} (reentrant {pa.yaml_value(flip)})", alt)
        out[sp["name"]] = entry
    if a.scenarios_only:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_hft.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "hft_runs.json); whole_run_*: over setup, warm-up and measured step (compare "
        "whole_run_peak_*); marks: allocated / reserved at backward_end and "
        "optimizer_end (compare marks.*.allocated_bytes.all.current / "
        "reserved_bytes.all.current; memsim's forward_end is before the loss, the "
        "run's after_compute_loss after it: not comparable). "
        "if_reentrant_true / _false: the same scenario with checkpoint.reentrant "
        "flipped, for the runs that take transformers' default gradient checkpointing "
        "kwargs (the scenario assumes 5.x's use_reentrant False; the run records the "
        "keywords it got in checkpointing.kwargs). Scenarios: tests/data/gpu/hft/"
        "NAME.yaml (tools/gpu/predict_hft.py). Device preset h200.",
        a, out)


if __name__ == "__main__":
    main()
