#!/usr/bin/env python3
"""Writes memsim's scenario of every tools/gpu/measure_moe_fsdp2.py run
(tests/data/gpu/moe_fsdp2/NAME.yaml) and memsim's blind predictions for them
(tests/data/gpu/moe_fsdp2_predictions.json), by simulating each scenario
(predict_common.simulate). Run before any measurement, from a clean tree of the commit the
predictions name:

    python3 tools/gpu/predict_moe_fsdp2.py [--memsim build/memsim] [--scenarios-only]

How each run maps to memsim's keys: predict_moe_s10.yaml_for's (the config.json as
`model.hf_config`, the forced routing as `model.moe.routing.counts`, eager attention,
`precision.params`, PEFT target_parameters LoRA with fp32 adapters, HF gradient
checkpointing as `checkpoint: {policy: full, reentrant: false}` with
`lora.input_require_grads: true`, AdamW foreach, one warm-up step), plus
`model.moe.experts_implementation` where the run asks grouped_mm, and FSDP2 as
predict_fsdp2's (`parallel: {data: 8, sharding: fsdp2, reshard_after_forward: true,
fsdp_init: gpu}`, with `fsdp_mixed_precision: bf16, reduce_dtype: fp32` for the
MixedPrecisionPolicy runs): one GPU as rank 0 of a fake world of 8.
A run memsim refuses is recorded with memsim's message as its prediction.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "fixtures"))
import measure_moe_fsdp2 as mf  # noqa: E402
import predict_common as pc  # noqa: E402
import predict_moe_s10 as ps  # noqa: E402

OUT = os.path.join(pc.REPO, "tests", "data", "gpu", "moe_fsdp2")
PRED = os.path.join(pc.REPO, "tests", "data", "gpu", "moe_fsdp2_predictions.json")

NOTE = ("Blind predictions of tools/gpu/measure_moe_fsdp2.py's runs (transformers 5.17 Qwen3-MoE, "
        "8 experts top 2, forced balanced routing, fully_shard per decoder layer then the root on "
        "a fake process group of 8: full fine-tuning with MixedPrecisionPolicy bf16/fp32, eager "
        "and grouped_mm experts; PEFT target_parameters LoRA on the experts with HF gradient "
        "checkpointing), made before any measurement. peak_allocated_bytes / "
        "peak_reserved_bytes: the measured step's (max_memory_allocated / max_memory_reserved "
        "after reset_peak_memory_stats at the step's start); whole_run_*: the whole run's; "
        "marks: memory_stats at forward_end, backward_end, optimizer_end of the measured step. "
        "Known not modelled: CUDA nonzero's / where's cub scratch and other small-pool blocks "
        "below 1 MiB, the forced-routing table (16 KiB on the device).")

WHY = {
    "fsdp2": ("memsim's FSDP2 was measured on a dense stand-in (tests/data/gpu/fsdp2); the 3-D "
              "experts' dim-0 shards and the MoE layer under gathered parameters never were"),
    "tp_lora": ps.WHY["tp_lora"] + "; under FSDP2 modelled from the source only (docs/moe.md "
               "'With DDP and FSDP2'); bf16 frozen weights and fp32 adapters in one group "
               "(torch >= 2.8 accepts it: pytorch/pytorch #154103)",
    "ckpt": ps.WHY["ckpt"] + "; the recompute runs after the layer's backward all-gather",
    "grouped_mm": "grouped_mm checked on the H200 without FSDP2 (docs/moe.md, 2026-11-27)",
}


def yaml_for(sp):
    lines = ps.yaml_for(sp).rstrip("\n").split("\n")
    lines[0] = f"# {sp['name']}: tools/gpu/measure_moe_fsdp2.py's run as memsim simulates it"
    lines[1] = ("# (written by tools/gpu/predict_moe_fsdp2.py; predictions in "
                "tests/data/gpu/moe_fsdp2_predictions.json). " + sp["why"] + ".")
    if sp["experts_impl"] != "eager":
        lines = [l.replace("moe: {experts_implementation: eager,", f"moe: {{experts_implementation: {sp['experts_impl']},")
                 for l in lines]
    par = ["parallel:", f"  data: {sp['world']}", "  sharding: fsdp2",
           f"  reshard_after_forward: {sp['reshard']}"]
    if sp["param_dtype"]:
        par += [f"  fsdp_mixed_precision: {sp['param_dtype']}", f"  reduce_dtype: {sp['reduce_dtype']}"]
    par.append("  fsdp_init: gpu")
    dev = lines.index("device: {preset: h100-80gb}")
    lines[dev:dev] = par
    return "\n".join(lines) + "\n"


def why_of(sp):
    return [WHY["fsdp2"]] + ([WHY["tp_lora"]] if sp["lora"] else []) + \
           ([WHY["ckpt"]] if sp["hf_gradient_checkpointing"] else []) + \
           ([WHY["grouped_mm"]] if sp["experts_impl"] == "grouped_mm" else [])


def main():
    ps.predict_specs(mf.SPECS, OUT, PRED, NOTE, yaml_for, why_of, 46, fields=("world",))


if __name__ == "__main__":
    main()
