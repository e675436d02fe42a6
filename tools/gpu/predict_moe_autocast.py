#!/usr/bin/env python3
"""Writes memsim's scenario of every tools/gpu/measure_moe_autocast.py run
(tests/data/gpu/moe_autocast/NAME.yaml) and memsim's blind predictions for them
(tests/data/gpu/moe_autocast_predictions.json), by running `memsim run NAME.yaml --json -`
on each. Run before any measurement:

    python3 tools/gpu/predict_moe_autocast.py BUILD/memsim

A run with HF gradient checkpointing (`gradient_checkpointing_enable()` with no arguments)
gets two scenarios, because which `use_reentrant` transformers 5.17 passes is read from the
run, not known here: NAME.yaml with `checkpoint.reentrant: false` (5.x's default as a
third-party reading of 5.18's modeling_utils.py gives it) and NAME_reentrant.yaml with
`true` (transformers v4.46's default, the one memsim's shipped Trainer scenarios assume);
both predictions are blind, and tests/test_gpu_moe_autocast_runs.cpp compares the one whose
`use_reentrant` the run recorded.

Runs already in the predictions file keep their entry byte for byte (a blind prediction is
never rewritten after its run was measured); only runs without one are predicted, each new
entry with the memsim commit it came from (`memsim_commit`, `memsim_tree_dirty`): the six
eager runs carry the file's top-level commit, the grouped_mm / batched_mm runs of 2026-11-28
their own. `--all` predicts every run again (a new file).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "fixtures"))
import measure_moe_autocast as mac  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "gpu", "moe_autocast")
PRED = os.path.join(ROOT, "tests", "data", "gpu", "moe_autocast_predictions.json")

# What memsim is known not to model in these runs (docs/moe.md "Under autocast",
# "Measured on a GPU under autocast").
DIFFERENCES = (
    "memsim's MoE autocast rules were checked on torch 1.13 CPU autocast only (CPU and CUDA "
    "agree on the ops the eager block runs; the aux loss is off here). Not modelled: CUDA "
    "nonzero's / where's cub scratch (small-pool KiB blocks) and the forced-routing table "
    "(16 KiB on the device since setup). The bf16 runs of the same models (measure_moe.py) "
    "came within 0.2% allocated; the autocast-specific parts are the fp32 gathers and "
    "index_add_, each hit expert's uncached bf16 weight-slice casts saved by its matmuls, the "
    "bf16 router logits and (Qwen/OLMoE) bf16 top-k weights, the q/k RMSNorms' fp32 and bf16 "
    "copies (Qwen3-MoE, OLMoE), the fp32 logits copy of the loss")
SDPA = ("SDPA under autocast is memsim's `flash` (bf16 q/k/v casts saved by the kernel; "
        "transformers 5.17's sdpa_attention_forward without a mask, is_causal); OLMoE with 16 KV "
        "heads (configs/olmoe_mha.json) so that 5.17's enable_gqa (no repeat_kv), which memsim's "
        "5.x rows do not model yet, plays no part")
CKPT = ("gradient_checkpointing_enable() on every decoder layer (GradientCheckpointingLayer); "
        "the re-run under the autocast state the checkpoint recorded")


def yaml_for(sp, reentrant=None):
    c = sp["cfg"]
    counts = ", ".join(str(x) for x in sp["counts"])
    attention = "flash" if sp["attention"] == "sdpa" else sp["attention"]
    impl = "" if sp["experts_impl"] == "eager" else f", experts_implementation: {sp['experts_impl']}"
    lines = [f"# {sp['name']}: tools/gpu/measure_moe_autocast.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_moe_autocast.py; predictions in "
             "tests/data/gpu/moe_autocast_predictions.json).",
             "# transformers 5.17 from_config in fp32, bf16 autocast around forward and loss "
             "(HF Trainer's bf16=True).",
             f"name: {sp['name']}" + ("_reentrant" if reentrant else ""), "model:",
             f"  hf_config: {os.path.relpath(os.path.join(ROOT, sp['config']), OUT)}",
             # eager written out: memsim's default is transformers 5.x's (grouped_mm)
             ("  moe: {experts_implementation: eager, " if sp["experts_impl"] == "eager" else "  moe: {") +
             f"routing: {{counts: [{counts}]}}{impl}}}",
             f"  attention: {attention}", "  dropout: 0.0",
             f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}",
             "precision: {params: fp32, autocast: bf16}",
             "optimizer: {type: adamw, impl: foreach}",
             "step: {kind: train, warmup_steps: 1}"]
    if sp["hf_gradient_checkpointing"]:
        lines.append(f"checkpoint: {{policy: full, reentrant: {'true' if reentrant else 'false'}}}")
    else:
        lines.append("checkpoint: {policy: none}")
    lines += ["device: {preset: h100-80gb}", ""]
    return "\n".join(lines)


def predict(memsim, path):
    p = subprocess.run([memsim, "run", path, "--json", "-"], capture_output=True, text=True)
    e = {"scenario": os.path.relpath(path, ROOT)}
    if p.returncode not in (0, 2) or not p.stdout.strip():
        e["refused"] = p.stderr.strip()
        return e
    j = json.loads(p.stdout)
    e["peak_allocated_bytes"] = j["peak_allocated_bytes"]
    e["peak_reserved_bytes"] = j["peak_reserved_bytes"]
    e["peak_event"] = j.get("peak_event")
    e["parameters"] = j["model"].get("parameter_count")
    e["marks"] = j.get("marks")
    e["breakdown_at_peak"] = j.get("breakdown_at_peak")
    e["fits"] = p.returncode == 0
    return e


GROUPED_BATCHED = (
    "grouped_mm / batched_mm under autocast (docs/moe.md \"batched_mm and grouped_mm under "
    "autocast\"), modelled from the sources, no CPU fixture of the real kernels: batched_mm's bmm "
    "is on CUDA's lower-precision list (bf16 casts of the repeated states and of every sample's "
    "fp32 gathered weight copy, saved), its sum is CUDA's fp32_set_opt_dtype; grouped_mm assumed "
    "wholly fp32 (torch._grouped_mm on no autocast list, pytorch/pytorch#174763, and transformers' "
    "input.to(weight.dtype)): if the installed moe.py or torch differ (the run records both), "
    "grouped_mm's prediction is the one expected to miss")


def main():
    memsim = os.path.abspath(sys.argv[1])
    everything = "--all" in sys.argv[2:]
    os.makedirs(OUT, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    # Whether memsim's own sources differ from that commit (this script's outputs and the GPU
    # scripts beside it do not count).
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--",
                            ".", ":!tools/gpu", ":!tests/data/gpu"],
                           capture_output=True, text=True).stdout.strip()
    preds = {"memsim_commit": commit, "memsim_tree_dirty": bool(dirty),
             "generator": "tools/gpu/predict_moe_autocast.py",
             "measure": "tools/gpu/measure_moe_autocast.py", "runs": {}}
    if not everything and os.path.exists(PRED):
        with open(PRED) as f:
            preds = json.load(f)  # kept as it is: entries already predicted are not rewritten
    for sp in mac.SPECS:
        if sp["name"] in preds["runs"]:
            continue
        path = os.path.join(OUT, sp["name"] + ".yaml")
        with open(path, "w") as f:
            f.write(yaml_for(sp))
        entry = predict(memsim, path)
        why = [DIFFERENCES] + ([SDPA] if sp["attention"] == "sdpa" else []) + \
              ([CKPT] if sp["hf_gradient_checkpointing"] else []) + \
              ([GROUPED_BATCHED] if sp["experts_impl"] != "eager" else [])
        entry.update({"model_type": sp["model_type"], "routing": sp["routing"],
                      "tokens_per_expert": sp["counts"], "attention": sp["attention"],
                      "expected_differences": "; ".join(why)})
        if sp["experts_impl"] != "eager":
            entry.update({"experts_implementation": sp["experts_impl"], "micro_batch": sp["cfg"]["batch"],
                          "memsim_commit": commit, "memsim_tree_dirty": bool(dirty)})
        if sp["hf_gradient_checkpointing"]:
            entry["use_reentrant"] = False
            alt = os.path.join(OUT, sp["name"] + "_reentrant.yaml")
            with open(alt, "w") as f:
                f.write(yaml_for(sp, reentrant=True))
            entry["if_use_reentrant_true"] = predict(memsim, alt)
        preds["runs"][sp["name"]] = entry
        print(sp["name"], {k: entry.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "refused")})
    with open(PRED, "w") as f:
        json.dump(preds, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
