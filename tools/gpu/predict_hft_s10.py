#!/usr/bin/env python3
"""memsim's blind predictions for tools/gpu/measure_hft.py --s10 (RUNS_S10: FSDP2 with the
loss in the model at another shape; HF Trainer's full fine-tuning under FSDP2 with
Accelerate >= 1.8's bf16 MixedPrecisionPolicy), made before anything is measured. Run on
the development machine (no GPU needed):

    python3 tools/gpu/predict_hft_s10.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/hft/NAME.yaml, as
   tools/gpu/predict_hft.py writes those of the first runs (same model, step, optimizer,
   checkpointing, LoRA and device keys), plus the policy Accelerate builds for
   mixed_precision bf16 with fsdp_version 2 (huggingface/accelerate 16cb6eb8
   utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision):
   parallel.fsdp_mixed_precision / reduce_dtype / fsdp_output_dtype: bf16, no autocast
   (Accelerator._prepare_fsdp2 never reaches prepare_model's autocast wrapper: docs/fsdp2.md
   "Accelerate >= 1.8: the policy alone"), and SDPA as flash (the q/k/v are the policy's
   bf16).
2. Runs `memsim run NAME.yaml --json -` for each (the runs with checkpointing also with
   checkpoint.reentrant flipped) and writes tests/data/gpu/hft_s10_predictions.json with
   the memsim commit. tests/data/gpu/hft_predictions.json (the first runs', measured) is
   not touched.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_hft as mh  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402
import predict_hft as ph  # noqa: E402

REPO = mh.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "hft_s10_predictions.json")
MP_KEYS = {"param_dtype": "fsdp_mixed_precision", "reduce_dtype": "reduce_dtype",
           "output_dtype": "fsdp_output_dtype"}


# The real-Accelerate run as first recorded, when memsim had no key for the grouping
# Accelerate 1.14+ builds (kept as history; the later prediction with
# parallel.accelerate_version is tools/gpu/predict_hft_s10_accelerate.py's "RUN@accelerate_version").
NOT_MODELLED = (
    "not modelled: Accelerate >= 1.14's fsdp2_prepare_model (huggingface/accelerate PR #4015, "
    "60b5c258; 16cb6eb8 src/accelerate/utils/fsdp_utils.py) also calls fully_shard on the "
    "input embedding and on [final norm, lm_head] (reshard_after_forward=False) before the "
    "root; memsim's fsdp2 groups are each decoder layer plus the root (no key for other "
    "groupings), so it makes no prediction of this run. The run records the groups "
    "Accelerate built (accelerate_built.fsdp_modules); hft_full_fsdp2_bf16_w8 is the same "
    "job with each decoder layer then the root, which memsim predicts.")


def scenario_yaml(sp):
    text = ph.scenario_yaml(sp).replace("tests/data/gpu/hft_predictions.json",
                                        "tests/data/gpu/hft_s10_predictions.json")
    text = text.replace("tools/gpu/measure_hft.py's run", "tools/gpu/measure_hft.py --s10's run")
    text = text.replace("(written by tools/gpu/predict_hft.py;",
                        "(written by tools/gpu/predict_hft_s10.py;")
    mp = sp.get("fsdp_mp")
    if not mp:
        return text
    # The policy's bf16 q/k/v: flash (predict_hft picks it from autocast alone).
    text = text.replace("  attention: mem-efficient\n", "  attention: flash\n")
    old = f"parallel: {{data: {sp['fsdp2_world']}, sharding: fsdp2}}\n"
    assert old in text, sp["name"]
    keys = ", ".join(f"{MP_KEYS[k]}: {v}" for k, v in mp.items())
    new = ("# Accelerate >= 1.8's MixedPrecisionPolicy for mixed_precision bf16 (no autocast)\n"
           f"parallel: {{data: {sp['fsdp2_world']}, sharding: fsdp2, {keys}}}\n")
    return text.replace(old, new)


def main():
    a = pc.arguments()
    out = {}
    for sp in mh.RUNS_S10:
        if sp.get("accelerate_real"):
            out[sp["name"]] = {"scenario": None, "fsdp_mp": sp["fsdp_mp"],
                               "fsdp2_world": sp["fsdp2_world"], "what": sp["why"],
                               "refused": NOT_MODELLED}
            print(f"{sp['name']:40s} not modelled (recorded as the prediction)")
            continue
        pa.write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
        if a.scenarios_only:
            continue
        memsim = os.path.abspath(a.memsim)
        try:
            pred = ph.run_memsim(memsim, sp["scenario"])
        except Exception as e:  # memsim refuses: the refusal is the prediction
            pred = {"refused": str(e)[-600:]}
        entry = {"scenario": sp["scenario"], "batch": sp["batch"], "seq": sp["seq"],
                 "autocast": sp["autocast"], "fsdp_mp": sp.get("fsdp_mp"),
                 "gradient_checkpointing": sp["gc"], "gc_kwargs": sp["gc_kwargs"],
                 "checkpoint_reentrant": ph.reentrant_of(sp), "lora": sp["lora"],
                 "fsdp2_world": sp["fsdp2_world"], "what": sp["why"]}
        entry.update(pred)
        if "refused" not in pred:
            ph.show(sp["name"], pred)
        else:
            print(f"{sp['name']:40s} refused: {pred['refused'][:200]}")
        if sp["gc"] and sp["gc_kwargs"] is None and "refused" not in pred:
            flip = not ph.reentrant_of(sp)
            alt = ph.run_memsim(memsim, sp["scenario"],
                                [f"checkpoint.reentrant={pa.yaml_value(flip)}"])
            entry["if_reentrant_" + pa.yaml_value(flip)] = alt
            ph.show(f"  {sp['name']} (reentrant {pa.yaml_value(flip)})", alt)
        out[sp["name"]] = entry
    if a.scenarios_only:
        return
    # Later entries ("RUN@what", tools/gpu/predict_hft_s10_accelerate.py) are kept.
    if os.path.exists(OUT):
        with open(OUT) as f:
            later = {k: v for k, v in json.load(f)["predictions"].items() if "@" in k}
        out.update(later)
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_hft.py --s10's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "hft_s10_runs.json); whole_run_*: over setup, warm-up and measured step (compare "
        "whole_run_peak_*); marks: allocated / reserved at backward_end and "
        "optimizer_end (compare marks.*.allocated_bytes.all.current / "
        "reserved_bytes.all.current). if_reentrant_true: the same scenario with "
        "checkpoint.reentrant flipped (the run records the keywords it got in "
        "checkpointing.kwargs). Scenarios: tests/data/gpu/hft/NAME.yaml "
        "(tools/gpu/predict_hft_s10.py). Device preset h200.",
        a, out)


if __name__ == "__main__":
    main()
