#!/usr/bin/env python3
"""memsim's blind prediction for tools/gpu/measure_hft.py --s10's real-Accelerate run
(hft_full_fsdp2_bf16_w8_accelerate), made once memsim had a key for Accelerate >= 1.14's
grouping (parallel.accelerate_version, docs/fsdp2.md "Accelerate's FSDP2 grouping"), after
session 10's refused lease and before any measurement. Run on the development machine:

    python3 tools/gpu/predict_hft_s10_accelerate.py [--memsim build/memsim] [--scenarios-only]

1. Writes tests/data/gpu/hft/hft_full_fsdp2_bf16_w8_accelerate.yaml: hft_full_fsdp2_bf16_w8's
   scenario (tools/gpu/predict_hft_s10.py) with parallel.accelerate_version "1.15" (the
   image's Accelerate; its grouping is v1.14.0's, huggingface/accelerate 60b5c258, the same
   at 16cb6eb8 = 1.15.0.dev0).
2. Adds a second entry, "hft_full_fsdp2_bf16_w8_accelerate@accelerate_version", to
   tests/data/gpu/hft_s10_predictions.json with the memsim commit that made it. The first
   entry (the run's name: "not modelled" at the file's memsim_commit) and every other
   entry are left as they were: that record is history.
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
import predict_hft_s10 as ps  # noqa: E402

REPO = mh.REPO
RUN = "hft_full_fsdp2_bf16_w8_accelerate"
KEY = RUN + "@accelerate_version"
SCENARIO = "tests/data/gpu/hft/" + RUN + ".yaml"
VERSION = "1.15"

# What memsim leaves out of this run (both outside the measured step's peak, or under 1 KiB).
NOT_IN_MEMSIM = (
    "accelerator.backward(loss) computes loss / gradient_accumulation_steps first "
    "(huggingface/accelerate 16cb6eb8 accelerator.py line 2840: a 0-d bf16 tensor, a 512 B "
    "block, and its DivBackward0 gradient), which memsim's step does not make; "
    "fsdp2_prepare_model's original_sd = model.state_dict() (16cb6eb8 utils/fsdp_utils.py "
    "line 818) holds the unsharded fp32 originals until it returns, where memsim frees each "
    "group's at its fully_shard (setup only: about 0.47 GB of originals, far under the step)")


def scenario_yaml():
    base = next(sp for sp in mh.RUNS_S10 if sp["name"] == "hft_full_fsdp2_bf16_w8")
    text = ps.scenario_yaml(base)
    text = text.replace("# hft_full_fsdp2_bf16_w8:", "# " + RUN + ":", 1)
    text = text.replace("name: hft_full_fsdp2_bf16_w8\n", "name: " + RUN + "\n")
    text = text.replace("(written by tools/gpu/predict_hft_s10.py;",
                        "(written by tools/gpu/predict_hft_s10_accelerate.py;")
    run = next(sp for sp in mh.RUNS_S10 if sp["name"] == RUN)
    assert "# " + base["why"] + ".\n" in text
    text = text.replace("# " + base["why"] + ".\n", "# " + run["why"] + ".\n")
    old = "fsdp_output_dtype: bf16}\n"
    assert old in text
    text = text.replace(old, f"fsdp_output_dtype: bf16, accelerate_version: \"{VERSION}\"}}\n")
    text = text.replace(
        "# Accelerate >= 1.8's MixedPrecisionPolicy for mixed_precision bf16 (no autocast)\n",
        "# Accelerate >= 1.8's MixedPrecisionPolicy for mixed_precision bf16 (no autocast), and\n"
        "# Accelerate 1.14+'s grouping (each decoder layer, model.embed_tokens, [model.norm,\n"
        "# lm_head] kept gathered, an empty root): the installed Accelerate prepares the model.\n")
    return text


def main():
    a = pc.arguments()
    pa.write_if_changed(os.path.join(REPO, SCENARIO), scenario_yaml())
    if a.scenarios_only:
        return
    memsim = os.path.abspath(a.memsim)
    pred = ph.run_memsim(memsim, SCENARIO)
    ph.show(KEY, pred)
    base = next(sp for sp in mh.RUNS_S10 if sp["name"] == RUN)
    memsim_repo = a.memsim_repo or os.path.dirname(os.path.dirname(memsim))
    entry = {"run": RUN, "scenario": SCENARIO, "batch": base["batch"], "seq": base["seq"],
             "autocast": base["autocast"], "fsdp_mp": base.get("fsdp_mp"),
             "gradient_checkpointing": base["gc"], "gc_kwargs": base["gc_kwargs"],
             "checkpoint_reentrant": None, "lora": base["lora"],
             "fsdp2_world": base["fsdp2_world"],
             "memsim_commit": pc.git("rev-parse", "HEAD", cwd=memsim_repo),
             "made": "the second prediction of " + RUN + ": made after session 10's refused "
                     "device lease and before any measurement, once memsim had "
                     "parallel.accelerate_version (the first entry, under the run's own name, "
                     "is the earlier 'not modelled' record, kept as it was)",
             "what": base["why"], "not_in_memsim": NOT_IN_MEMSIM}
    entry.update(pred)
    path = ps.OUT
    with open(path) as f:
        doc = json.load(f)
    doc["predictions"][KEY] = entry
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{KEY} -> {os.path.relpath(path, REPO)}")


if __name__ == "__main__":
    main()
