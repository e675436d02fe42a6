#!/usr/bin/env python3
"""Writes memsim's scenario of every tools/gpu/measure_moe_s10.py run
(tests/data/gpu/moe_s10/NAME.yaml) and memsim's blind predictions for them
(tests/data/gpu/moe_s10_predictions.json), by simulating each scenario
(predict_common.simulate: `memsim run NAME.yaml --json - --timeline`). Run before any
measurement, from a clean tree of the commit the predictions name:

    python3 tools/gpu/predict_moe_s10.py [--memsim build/memsim] [--scenarios-only]

How each run maps to memsim's keys (docs/deepseek.md, docs/moe.md):
  * the config.json as `model.hf_config` (a path relative to the scenario), the forced
    routing's tokens per expert as `model.moe.routing.counts`, eager attention, dropout 0;
  * `precision.params` the weights' dtype, `precision.autocast: bf16` for the autocast runs;
  * PEFT LoRA: `lora.rank` / `lora.alpha`, `lora.targets` (target_modules) or
    `lora.target_parameters`, adapters fp32 (PEFT's `autocast_adapter_dtype`, memsim's
    default);
  * HF gradient checkpointing (transformers 5.17's gradient_checkpointing_enable on every
    decoder layer, a GradientCheckpointingLayer): `checkpoint.policy: full` with
    `checkpoint.reentrant` as the run passes it (non-reentrant: torch 2.11's default
    early_stop, memsim's default `checkpoint.early_stop: true`), and
    `lora.input_require_grads: true` in both modes (5.17 registers the embeddings' hook for
    every input_ids model, whatever use_reentrant: the source recorded by the 2026-11-27 run);
  * AdamW foreach over the trainable parameters; one warm-up step; `device.preset:
    h100-80gb` (the allocator's rules are the same on the H200; capacity is not reached).
A run memsim refuses is recorded with memsim's message as its prediction.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "fixtures"))
import measure_moe_s10 as ms  # noqa: E402
import predict_common as pc  # noqa: E402

OUT = os.path.join(pc.REPO, "tests", "data", "gpu", "moe_s10")
PRED = os.path.join(pc.REPO, "tests", "data", "gpu", "moe_s10_predictions.json")

NOTE = ("Blind predictions of tools/gpu/measure_moe_s10.py's runs (transformers 5.17 DeepSeek-V3 / "
        "V2 under bf16 autocast and in bf16, PEFT LoRA on MLA, PEFT target_parameters LoRA on "
        "Qwen3-MoE's experts with HF gradient checkpointing), made before any measurement. "
        "peak_allocated_bytes / peak_reserved_bytes: the measured step's (max_memory_allocated / "
        "max_memory_reserved after reset_peak_memory_stats at the step's start); whole_run_*: "
        "the whole run's (setup, warm-up, measured step); marks: memory_stats at forward_end, "
        "backward_end, optimizer_end of the measured step. Known not modelled: CUDA nonzero's "
        "/ where's cub scratch and other small-pool blocks below 1 MiB, the forced-routing "
        "table (16 KiB on the device).")

WHY = {
    "autocast": ("memsim's DeepSeek / MoE autocast rules were checked on torch 1.13 CPU autocast with "
                 "CUDA's cat and sum rules applied from the source (docs/deepseek.md 'Under autocast'); "
                 "not on CUDA"),
    "mla_lora": ("PEFT LoRA on the latent attention checked on CPU stand-ins of PEFT's Linear "
                 "(docs/deepseek.md); PEFT's fp32 adapters on a bf16 base cast the input and output "
                 "per adapter"),
    "tp_lora": ("PEFT target_parameters (ParamWrapper) modelled from huggingface/peft 5d602fdb and "
                "checked on CPU stand-ins (docs/moe.md 'LoRA on the routed experts'); the CUDA-only "
                "bmm copy of the einsum's left operand is from the source; peft on the image may "
                "be newer (its version is recorded by the run)"),
    "ckpt": ("HF gradient checkpointing: every decoder layer checkpointed, the embeddings' "
             "input-require-grads hook on"),
}


def yaml_for(sp):
    c = sp["cfg"]
    counts = ", ".join(str(x) for x in sp["counts"])
    cfg = os.path.relpath(os.path.join(pc.REPO, sp["config"]), OUT)
    lines = [f"# {sp['name']}: tools/gpu/measure_moe_s10.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_moe_s10.py; predictions in "
             "tests/data/gpu/moe_s10_predictions.json).",
             f"name: {sp['name']}", "model:",
             f"  hf_config: {cfg}",
             # the runs request eager; memsim's default is transformers 5.x's (grouped_mm)
             f"  moe: {{experts_implementation: eager, routing: {{counts: [{counts}]}}}}",
             f"  attention: {sp['attention']}", "  dropout: 0.0",
             f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}",
             f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast'] or 'none'}}}",
             "optimizer: {type: adamw, impl: foreach}",
             "step: {kind: train, warmup_steps: 1}"]
    ck = sp["hf_gradient_checkpointing"]
    if ck:
        lines.append(f"checkpoint: {{policy: full, reentrant: {'true' if ck == 'reentrant' else 'false'}}}")
    else:
        lines.append("checkpoint: {policy: none}")
    lo = sp["lora"]
    if lo:
        parts = [f"rank: {lo['r']}", f"alpha: {lo['alpha']}"]
        if lo["target_modules"]:
            parts.append("targets: [" + ", ".join(lo["target_modules"]) + "]")
        if lo["target_parameters"]:
            parts.append("target_parameters: [" + ", ".join(lo["target_parameters"]) + "]")
        if ck:
            parts.append("input_require_grads: true")
        lines.append("lora: {" + ", ".join(parts) + "}")
    lines += ["device: {preset: h100-80gb}", ""]
    return "\n".join(lines)


def why_of(sp):
    return ([WHY["autocast"]] if sp["autocast"] else []) + \
           ([WHY["tp_lora"] if sp["lora"]["target_parameters"] else WHY["mla_lora"]] if sp["lora"] else []) + \
           ([WHY["ckpt"]] if sp["hf_gradient_checkpointing"] else [])


def predict_specs(specs, out_dir, pred_path, note, yaml_for, why_of, width, fields=()):
    """The loop this script and predict_moe_fsdp2.py share: each spec's scenario written to
    OUT_DIR/NAME.yaml (yaml_for), and unless --scenarios-only simulated, its prediction
    (with the trainable count where the run has LoRA) followed by the scenario, the model,
    the routing, the spec's `fields` and the expected differences (why_of(spec), joined);
    then the predictions file."""
    args = pc.arguments()
    os.makedirs(out_dir, exist_ok=True)
    preds = {}
    for sp in specs:
        path = os.path.join(out_dir, sp["name"] + ".yaml")
        with open(path, "w") as f:
            f.write(yaml_for(sp))
        if args.scenarios_only:
            continue
        p = pc.prediction(pc.simulate(os.path.abspath(args.memsim), path), trainable=bool(sp["lora"]))
        p = dict(p, scenario=os.path.relpath(path, pc.REPO), model_type=sp["model_type"],
                 routing=sp["routing"], tokens_per_expert=sp["counts"])
        p.update((k, sp[k]) for k in fields)
        p["expected_differences"] = "; ".join(why_of(sp))
        preds[sp["name"]] = p
        pc.show(sp["name"], width, p)
    if not args.scenarios_only:
        pc.write_predictions(pred_path, note, args, preds)


def main():
    predict_specs(ms.SPECS, OUT, PRED, NOTE, yaml_for, why_of, 44)


if __name__ == "__main__":
    main()
