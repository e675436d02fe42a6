#!/usr/bin/env python3
"""memsim's blind predictions for tools/gpu/measure_generate.py's runs (issue #17 item 1).

    python3 tools/gpu/predict_generate.py [MEMSIM]        (default: build/memsim)

Writes, for each run of measure_generate.SPECS, the config.json transformers builds
(tests/data/gpu/generate/configs/NAME.json: the same values as measure_generate.hf_config)
and memsim's scenario (tests/data/gpu/generate/NAME.yaml), runs `memsim run --json` on it
and writes tests/data/gpu/generate_predictions.json: memsim's commit, the predicted peak
allocated / reserved bytes of the generate() call, the weights, the KV cache's bytes at the
end, and the expected differences between transformers v4.45 (what memsim models) and the
release measured. Must run before any measurement is seen.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import measure_generate as mg  # noqa: E402

DATA = os.path.join(REPO, "tests", "data", "gpu", "generate")

# What transformers 5.x does differently from the v4.45 code memsim models, per topic; the
# measured peaks are expected to differ by these (docs/generate.md, "Versions").
EXPECTED_DIFFERENCES = [
    "masks: v4.53+ build the 4-D mask with masking_utils.create_causal_mask (sdpa_mask / "
    "eager_mask: an arange-based boolean (B,1,S,T) mask turned into a float one for eager) "
    "instead of _prepare_4d_causal_attention_mask_with_cache_position's full/triu/clone/"
    "padding sequence; the mask tensors' sizes and count differ (small at S=1, at the prefill "
    "one or two (B,1,P,P) tensors in bf16: 4 x 512 x 512 x 2 = 2 MiB each)",
    "DynamicCache: v4.54+ hold DynamicLayer objects (lazy_initialization on the first update, "
    "then torch.cat as v4.45) -- the same growth by concatenation; the first update stores "
    "the key/value states themselves as v4.45 does",
    "sliding windows: 5.x's DynamicCache with a config whose layers slide creates "
    "DynamicSlidingWindowLayer for them: K/V beyond sliding_window - 1 tokens are dropped "
    "(the mistral run: its cache holds 255 tokens per layer instead of up to 575); v4.45's "
    "DynamicCache kept every token, which is what memsim predicts",
    "logits: 5.x ForCausalLM never upcasts the logits in forward (logits_to_keep=1: a (B,1,V) "
    "bf16 tensor), and _sample takes next_token_logits = outputs.logits[:, -1, :].to(copy=True, "
    "dtype=torch.float32): one fp32 (B,V) copy without the bf16 clone; v4.45's Llama upcast in "
    "forward and cloned the fp32 logits (memsim: the (B,1,V) fp32 upcast + its clone)",
    "StaticCache: 5.x StaticLayer buffers are allocated lazily on the first update (inside "
    "the prefill forward, layer by layer) rather than before the prefill; same bytes",
    "special tokens / stopping criteria: 5.x's _prepare_special_tokens and "
    "StoppingCriteriaList allocate a few more or fewer 0-d / (B,) tensors (512-byte blocks)",
    "position_ids: 5.x computes them inside the model from cache_position (no "
    "attention_mask.cumsum in prepare_inputs_for_generation for these models): small int64 "
    "tensors",
    "rope: v4.45's LlamaRotaryEmbedding on (B,S) position_ids makes (B,S,hd) cos/sin; 5.x "
    "the same per batch row",
    "SDPA: 5.x's sdpa_attention_forward passes enable_gqa=True when torch supports it (no "
    "repeat_kv copies of K/V, which memsim's v4.45 LlamaSdpaAttention makes: 2 x (B,H,T,hd) "
    "bf16 per layer call), and 5.x's masking may still pass is_causal without a mask",
    "kernels: the eager attention's scores (B,H,S,T) bf16 at the prefill are the largest "
    "activation (4 x 16 x 512 x 512 x 2 = 32 MiB, its fp32 softmax copy 64 MiB); SDPA picks "
    "its kernel itself (memsim: the scenario's flash kernel)",
]


def config_json(sp):
    d = dict(model_type=sp["model_type"], **mg.hf_config(sp))
    d.update(torch_dtype="bfloat16", attention_dropout=0.0, hidden_act="silu",
             architectures=[{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                             "mistral": "MistralForCausalLM"}[sp["model_type"]]])
    if sp["model_type"] == "llama":
        d.update(attention_bias=False, mlp_bias=False, rope_theta=10000.0)
    if sp["model_type"] == "qwen3":
        d.update(attention_bias=False, rope_theta=1000000.0, max_window_layers=28)
    return d


def scenario_yaml(sp):
    attention = "flash" if sp["attention"] == "sdpa" else "eager"
    return "\n".join([
        f"# {sp['name']}: tools/gpu/measure_generate.py's run as memsim simulates it",
        "# (written by tools/gpu/predict_generate.py; predictions in",
        "# tests/data/gpu/generate_predictions.json). transformers' own model from this",
        f"# config.json (AutoModelForCausalLM.from_config, bf16, attn_implementation {sp['attention']}),",
        f"# model.generate(max_new_tokens={sp['new_tokens']}, do_sample=False"
        + (f", cache_implementation='{sp['cache']}'" if sp["cache"] != "dynamic" else "") + ").",
        f"name: {sp['name']}",
        "model:",
        f"  hf_config: configs/{sp['name']}.json",
        f"  attention: {attention}",
        f"batch: {{micro_batch: {sp['batch']}}}",
        "precision: {params: bf16}",
        "step: {kind: generate}",
        f"generate: {{prompt_len: {sp['prompt']}, new_tokens: {sp['new_tokens']}, cache: {sp['cache']}"
        + (", cache_classes: v5" if sp["cache"] == "offloaded" else "") + "}",
        "device: {preset: h100-80gb}",
        ""])


def main():
    memsim = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build", "memsim")
    os.makedirs(os.path.join(DATA, "configs"), exist_ok=True)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    runs = []
    for sp in mg.SPECS:
        with open(os.path.join(DATA, "configs", sp["name"] + ".json"), "w") as f:
            json.dump(config_json(sp), f, indent=2)
            f.write("\n")
        yaml = os.path.join(DATA, sp["name"] + ".yaml")
        with open(yaml, "w") as f:
            f.write(scenario_yaml(sp))
        p = subprocess.run([memsim, "run", yaml, "--json", "-"], capture_output=True, text=True)
        row = dict(name=sp["name"], scenario=os.path.relpath(yaml, REPO), exit_code=p.returncode)
        if p.returncode in (0, 3):
            j = json.loads(p.stdout)
            g = j.get("generate", {})
            row.update(predicted_peak_allocated_bytes=j["peak_allocated_bytes"],
                       predicted_peak_reserved_bytes=j["peak_reserved_bytes"],
                       predicted_weights_bytes=g.get("weights_bytes"),
                       predicted_kv_cache_bytes_end=g.get("kv_cache_bytes_end"),
                       predicted_kv_cache_tokens_end=g.get("kv_cache_tokens_end"),
                       predicted_peak_event=j.get("peak_event"))
        else:
            row["refused"] = p.stderr.strip()
        runs.append(row)
        print(row["name"], row.get("predicted_peak_allocated_bytes"), row.get("predicted_peak_reserved_bytes"),
              row.get("refused", ""))
    out = dict(memsim_commit=commit, models="transformers v4.45 generate()/cache classes "
               "(a55adee890b0757461e1588d8847fd385ce5c214)",
               measured_with="tools/gpu/measure_generate.py (transformers 5.x, torch 2.11)",
               peaks_from="the generate() call: torch.cuda.reset_peak_memory_stats() after the model "
                          "and the prompts are on the GPU; absolute bytes (weights included)",
               expected_differences=EXPECTED_DIFFERENCES, runs=runs)
    with open(os.path.join(REPO, "tests", "data", "gpu", "generate_predictions.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
