#!/usr/bin/env python3
"""Writes memsim's scenario of every tools/gpu/measure_moe.py run (tests/data/gpu/moe/NAME.yaml)
and memsim's blind predictions for them (tests/data/gpu/moe_predictions.json), by running
`memsim run NAME.yaml --json -` on each. Run before any measurement:

    python3 tools/gpu/predict_moe.py BUILD/memsim [NAME...]

With NAMEs, only those runs are written and predicted, and their entries are merged into the
existing predictions file (the blind record of the other runs stays as it was).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "fixtures"))
import measure_moe as mm  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "gpu", "moe")

# Where transformers 5.x is expected to differ from what memsim models (docs/moe.md).
DIFFERENCES = {
    "standin": "none expected beyond what memsim does not model: CUDA nonzero's and "
               "index_put_'s cub scratch (small-pool blocks of a few KiB; index_put_'s sort "
               "temporaries are modelled as the core IndexBackward0's), and the forced-routing "
               "table (16 KiB on the device since setup)",
    "transformers": "the dense parts are their lineage's modules (Qwen3, Mistral, Qwen2, Llama + "
                    "OLMo q/k norms) in 5.x's placements (model.transformers 5's list: loss "
                    "without the shifted copy, masks, rotary once per forward); the MoE block follows v5's fused-expert "
                    "code as read (transformers main): a 5.17 router/experts that differ show "
                    "in the recorded source (moe_runs.json code). Known candidate: later v5 "
                    "Qwen2/Qwen3/OLMoE routers keep `router_probs` apart, return the raw logits "
                    "(alive as the block's `_`, T x E bf16) and cast the top-k weights to the "
                    "logits' dtype (`.to(router_logits.dtype)` = bf16): then the routing product "
                    "is bf16 (no per-expert fp32 n x D x 4 transient, no .to copy; the same n x D "
                    "x 2 saved) and its backward grads are bf16; memsim models the earlier v5 "
                    "code (router_logits rebound to the fp32 probabilities, fp32 weights)",
    "deepseek_v3": "DeepseekV3 of transformers 5.17.0 (installed on the GPU machine) against memsim's "
                   "DeepSeek model as merged (read from transformers main second-hand). Known "
                   "5.17 differences memsim does not model yet (expected to move transients, not "
                   "the peak at the loss's backward, where the saved activations decide it): "
                   "(1) the router rebinds scores_for_choice to its masked_fill (the scores + bias "
                   "(T, E) fp32 dies there, not at return); (2) apply_rotary_pos_emb_interleave "
                   "computes the rotation on q[..., 0::2] / q[..., 1::2] slices and cats (no "
                   "view/transpose/reshape copy; strided-slice grads in backward); (3) expand_kv "
                   "builds key_states with new_empty + two slice copy_ (CopySlices: in backward a "
                   "full (B, H, S, qk) grad copy and a slice clone per copy_) instead of torch.cat. "
                   "Not modelled either: CUDA nonzero's / where's cub scratch (small-pool KiB "
                   "blocks) and the forced-routing table (16 KiB)",
}


def yaml_for(sp):
    c = sp["cfg"]
    counts = ", ".join(str(x) for x in sp["counts"])
    lines = [f"# {sp['name']}: tools/gpu/measure_moe.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_moe.py; predictions in tests/data/gpu/moe_predictions.json).",
             f"name: {sp['name']}", "model:"]
    if sp["impl"] == "standin":
        arch = "qwen3" if sp["model_type"] == "qwen3_moe" else "mixtral"
        lines += [f"  architecture: {arch}", f"  layers: {c['layers']}", f"  d_model: {c['d_model']}",
                  f"  heads: {c['heads']}", f"  kv_heads: {c['kv_heads']}", f"  d_ff: {c['d_ff']}",
                  f"  vocab: {c['vocab']}", f"  context_length: {c['context']}",
                  # gen_arch_fixtures' qwen3 row ties the embeddings (tied=True); the blind
                  # YAMLs of 2026-11-27 said false here (tests/test_gpu_moe_runs.cpp corrects them)
                  f"  tied_embeddings: {'true' if arch == 'qwen3' else 'false'}"]
        if arch == "qwen3":
            lines.append("  head_dim: 32")  # gen_arch_fixtures' qwen3 row
        # experts_implementation written out: memsim's default is transformers 5.x's (grouped_mm)
        lines.append(f"  moe: {{experts_implementation: eager, experts: {sp['experts']}, top_k: {sp['top_k']}, expert_d_ff: "
                     f"{sp['expert_d_ff']}, norm_topk: true, routing: {{counts: [{counts}]}}}}")
    else:
        lines += [f"  hf_config: configs/{sp['model_type']}.json",
                  # eager written out: memsim's default is transformers 5.x's (grouped_mm)
                  ("  moe: {experts_implementation: eager, " if sp["experts_impl"] == "eager" else "  moe: {") +
                  f"routing: {{counts: [{counts}]}}" +
                  (f", experts_implementation: {sp['experts_impl']}" if sp["experts_impl"] != "eager" else "") + "}"]
    lines += ["  attention: eager", "  dropout: 0.0",
              f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}",
              "precision: {params: bf16, autocast: none}",
              "optimizer: {type: adamw, impl: foreach}",
              "step: {kind: train, warmup_steps: 1}",
              "checkpoint: {policy: none}",
              "device: {preset: h100-80gb}", ""]
    return "\n".join(lines)


def main():
    memsim = os.path.abspath(sys.argv[1])
    only = sys.argv[2:]
    os.makedirs(OUT, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    preds = {"memsim_commit": commit, "generator": "tools/gpu/predict_moe.py",
             "measure": "tools/gpu/measure_moe.py", "runs": {}}
    pred_path = os.path.join(ROOT, "tests", "data", "gpu", "moe_predictions.json")
    if only:
        with open(pred_path) as f:
            preds = json.load(f)
    for sp in mm.SPECS:
        if only and sp["name"] not in only:
            continue
        path = os.path.join(OUT, sp["name"] + ".yaml")
        with open(path, "w") as f:
            f.write(yaml_for(sp))
        p = subprocess.run([memsim, "run", path, "--json", "-"], capture_output=True, text=True)
        entry = {"scenario": os.path.relpath(path, ROOT), "impl": sp["impl"], "routing": sp["routing"],
                 "tokens_per_expert": sp["counts"],
                 "expected_differences": DIFFERENCES.get(sp["model_type"], DIFFERENCES[sp["impl"]])}
        if only:
            entry["memsim_commit"] = commit
        if p.returncode not in (0, 2) or not p.stdout.strip():
            entry["refused"] = p.stderr.strip()
        else:
            j = json.loads(p.stdout)
            entry["peak_allocated_bytes"] = j["peak_allocated_bytes"]
            entry["peak_reserved_bytes"] = j["peak_reserved_bytes"]
            entry["peak_event"] = j.get("peak_event")
            entry["parameters"] = j["model"].get("parameter_count")
            entry["marks"] = j.get("marks")
            entry["breakdown_at_peak"] = j.get("breakdown_at_peak")
            entry["moe"] = j.get("moe")
            entry["fits"] = p.returncode == 0
        preds["runs"][sp["name"]] = entry
        print(sp["name"], {k: entry.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "refused")})
    with open(pred_path, "w") as f:
        json.dump(preds, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
