#!/usr/bin/env python3
"""memsim's blind predictions for the "arch" runs of tools/gpu/measure_cuda.py, made
before anything is measured. Run on the development machine (no GPU needed):

    python3 tools/gpu/predict_arch.py [--memsim build/memsim] [--configs-only]

1. Writes the small transformers configs the "tf_arch_*" runs build
   (tests/data/h100/arch/configs/ROW_lL_dD_sS_bB.json: the shape of that row's stand-in).
2. Writes memsim's scenario of every arch run, tests/data/h100/arch/NAME.yaml:
   - a stand-in run (torch_models.DecoderForCausalLM as one row): model.architecture with
     every knob of the stand-in written out (the scenario spellings of its cfg["arch"]);
     the placement (docs/decoder-modules.md §4) comes with the row, and
     tests/test_model_architecture.cpp checks that it is the stand-in's;
   - a transformers run: model.hf_config, the same config.json the run builds from;
   both with the training loop measure_cuda.py runs (batch, precision, AdamW foreach, one
   warm-up step, no checkpointing, eager attention unless the spec says otherwise) and
   device.preset h100-80gb, as tests/test_h100_runs.cpp simulates the earlier H100 runs.
3. Runs `memsim run NAME.yaml --json -` for each and writes
   tests/data/h100/blind3_arch_predictions.json: peak_allocated_bytes and
   peak_reserved_bytes (the measured step's max_memory_allocated / max_memory_reserved,
   what measure_cuda.py records as measured_step_peak_allocated / _reserved), the
   parameter count, where the peak falls, or memsim's refusal text; with the memsim
   commit and, for the transformers runs, where the installed release is expected to
   differ from the code memsim models.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_cuda as mc  # noqa: E402
from predict_common import git, write_if_changed  # noqa: E402,F401  (other predict scripts call pa.*)

REPO = mc.REPO
ARCH_DIR = os.path.join(REPO, mc.ARCH_DATA)
OUT = os.path.join(REPO, "tests", "data", "h100", "blind3_arch_predictions.json")

# The knobs of tools/fixtures/torch_models.ARCH_KNOBS under their scenario spellings
# (docs/scenario-format.md), in the order written.
KNOBS = ("head_dim", "qkv_bias", "o_bias", "mlp_bias", "qk_norm", "norm", "norm_placement",
         "mlp", "activation", "fused_qkv", "fused_gate_up", "embedding_scale", "attn_softcap",
         "final_softcap", "sliding_window", "sliding_layers", "rotary_dim")


# ---------------------------------------------------------------- small configs
def small_config(row, cfg):
    """A transformers config.json with the stand-in's shape (cfg: its measure_cuda cfg)."""
    hd = cfg["arch"]["head_dim"]
    d = {
        "model_type": row,
        "hidden_size": cfg["d_model"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "intermediate_size": cfg["d_ff"],
        "vocab_size": cfg["vocab"],
        "max_position_embeddings": cfg["context"],
        "tie_word_embeddings": bool(cfg.get("tied", False)),
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "use_cache": False,
        # The stand-ins' embeddings have no padding_idx.
        "pad_token_id": None,
    }
    if hd != cfg["d_model"] // cfg["heads"] or row in ("qwen3", "gemma2"):
        d["head_dim"] = hd
    if row == "qwen2":
        d.update(hidden_act="silu", rope_theta=1000000.0, use_sliding_window=False,
                 sliding_window=None)
    elif row == "qwen3":
        d.update(hidden_act="silu", rope_theta=1000000.0, attention_bias=False,
                 use_sliding_window=False, sliding_window=None)
    elif row == "gemma2":
        d.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                 attn_logit_softcapping=cfg["arch"]["attn_softcap"],
                 final_logit_softcapping=cfg["arch"]["final_softcap"],
                 query_pre_attn_scalar=cfg["arch_hf"]["query_pre_attn_scalar"] or hd,
                 sliding_window=cfg["arch"]["sliding_window"], attention_bias=False,
                 rope_theta=10000.0)
    elif row == "phi3":
        d.update(hidden_act="silu", sliding_window=None, resid_pdrop=0.0, embd_pdrop=0.0,
                 original_max_position_embeddings=cfg["context"], rope_scaling=None,
                 rope_theta=10000.0)
    elif row == "mistral":
        d.update(hidden_act="silu", sliding_window=cfg["arch"]["sliding_window"],
                 rope_theta=10000.0)
    else:
        raise ValueError(row)
    d["architectures"] = [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "gemma2": "Gemma2ForCausalLM", "phi3": "Phi3ForCausalLM",
                           "mistral": "MistralForCausalLM"}[row]]
    return d


def write_configs():
    for row in mc.ARCH_TF_SMALL:
        r = next(x for x in mc.ARCH_ROWS if x[0] == row)
        cfg = mc.arch_standin_cfg(*r)
        tag = f"l{cfg['layers']}_d{cfg['d_model']}_s{cfg['seq']}_b{cfg['batch']}"
        path = os.path.join(ARCH_DIR, "configs", f"{row}_{tag}.json")
        write_if_changed(path, json.dumps(small_config(row, cfg), indent=2) + "\n")


# ---------------------------------------------------------------- scenarios
def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    return str(v)


def scenario_yaml(sp):
    c = sp["cfg"]
    if sp["impl"] == "standin":
        what = (f"# The stand-in: tools/fixtures/torch_models.DecoderForCausalLM as the "
                f"{sp['arch']} row\n# ({c['transformers']}).")
    else:
        what = (f"# The installed transformers' {sp['arch']} model: "
                f"AutoModelForCausalLM.from_config of\n# this config.json, attn_implementation "
                f"{sp['attention']}.")
    lines = [f"# {sp['name']}: tools/gpu/measure_cuda.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_arch.py; predictions in",
             "# tests/data/h100/blind3_arch_predictions.json).", what,
             f"name: {sp['name']}", "model:"]
    if sp["impl"] == "standin":
        a = c["arch"]
        lines += [f"  architecture: {sp['arch']}"]
        for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
            lines.append(f"  {k}: {c[k]}")
        lines.append(f"  context_length: {c['context']}")
        lines.append(f"  tied_embeddings: {yaml_value(bool(c.get('tied', False)))}")
        for k in KNOBS:
            v = a[k]
            if k == "sliding_layers":
                if not a["sliding_window"]:
                    continue
                v = list(v) if v else "all"
            lines.append(f"  {k}: {yaml_value(v)}")
    else:
        rel = os.path.relpath(os.path.join(REPO, sp["hf_config"]), ARCH_DIR)
        lines.append(f"  hf_config: {rel}")
    lines.append(f"  attention: {attention_key(sp)}")
    lines.append(f"  dropout: {yaml_value(float(c['dropout']))}")
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}")
    lines.append(f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}")
    lines.append(f"step: {{kind: train, warmup_steps: {sp['warmup']}}}")
    lines.append(f"checkpoint: {{policy: {sp['policy']}}}")
    lines.append("device: {preset: h100-80gb}")
    return "\n".join(lines) + "\n"


def attention_key(sp):
    """As tests/test_h100_runs.cpp: SDPA is flash for 16-bit inputs on an H100,
    mem-efficient in fp32."""
    if sp["attention"] != "sdpa":
        return sp["attention"]
    return "flash" if "bf16" in (sp["dtype"], sp["autocast"]) else "mem-efficient"


# ---------------------------------------------------------------- expected differences
# Where the installed transformers (5.x; 5.17 ran on the last lease) is expected to differ
# from the code memsim's rows follow (docs/decoder-modules.md §1: v4.45 for qwen2,
# mistral, gemma2, phi3; v4.51 for qwen3). Read from docs/h100-runs.md (what 5.17 did for
# LLaMA) and from a recent transformers main's modeling_qwen2.py (masking_utils'
# create_causal_mask, eager_attention_forward, loss_function); 5.x's own files for the
# other models were not read here, so these are expectations to check on the traces.
COMMON_V5 = [
    "the loss is self.loss_function (ForCausalLMLoss: logits.float() in the loss, labels "
    "padded, no shifted (B, S-1, V) copy of the logits and no slice_backward in backward)",
    "the causal mask comes from masking_utils.create_causal_mask: for eager attention a "
    "materialised (B, 1, S, S) mask in the model dtype (from a bool mask built by index "
    "arithmetic), alive for the whole forward, instead of v4.45's (S, S+1) mask expanded "
    "as a view",
    "eager attention is the function eager_attention_forward: k after rotary and the "
    "v_proj output stay referenced until the attention returns, and the probabilities are "
    "returned to the layer",
]
TIED_V5 = ("the tied lm_head is built as its own nn.Linear weight and then tied at post_init: "
           "one V x D weight is allocated and freed at setup, which can leave a cached block "
           "(reserved) that memsim's setup does not have")
EXPECTED = {
    "qwen2": [
        "v4.45's unused per-attention rotary buffer (attn_rope_buffer, modelled) is gone, or "
        "the attention computes its own cos/sin (recent main: Qwen2Attention.rotary_emb "
        "called with position_ids), which would make the rotary tables per layer",
    ] + COMMON_V5,
    "mistral": [
        "v4.45 computed cos/sin in every attention (rope per layer, modelled); 5.x has one "
        "model-level rotary table (or per-attention again, as recent main's Qwen2)",
        "the window is a sliding mask from create_sliding_window_causal_mask instead of "
        "v4.45's exclude mask with the window ORed in",
    ] + COMMON_V5,
    "gemma2": [
        "v4.45 built each sliding layer's (B, 1, S, S) bool and float masks inside the "
        "layer (modelled, per sliding layer); 5.x builds one full and one sliding mask at "
        "model level (create_causal_mask / create_sliding_window_causal_mask), alive for "
        "the whole forward",
        "rotary per layer in v4.45 (modelled) against a model-level table in 5.x",
    ] + COMMON_V5,
    "phi3": [
        "v4.45 adds the mask in place (attn_weights += causal_mask, modelled: one (B, H, S, "
        "S) fewer); 5.x's eager_attention_forward adds it out of place",
        "rotary per layer in v4.45 (modelled) against a model-level table in 5.x",
    ] + COMMON_V5,
    "qwen3": [
        "memsim's qwen3 row follows v4.51, which already has eager_attention_forward and "
        "the padded-label loss: the differences left are the mask (create_causal_mask's "
        "(B, 1, S, S) against v4.51's exclude mask (S, S+1)) and the rotary placement",
    ],
}


def expected_differences(sp):
    if sp["impl"] != "transformers":
        return None
    notes = list(EXPECTED.get(sp["arch"], COMMON_V5))
    if sp["cfg"].get("tied"):
        notes.append(TIED_V5)
    if sp["dtype"] == "bf16":
        notes.append("bf16: 5.x leaves the logits bf16 in the forward and makes the fp32 copy "
                     "in the loss (logits.float()); the v4.45 rows upcast at the end of the "
                     "forward (qwen3's v4.51 row already in the loss)")
    if sp["autocast"] != "none":
        notes.append("bf16 autocast: memsim refuses it for this row (see refused)")
    if sp["attention"] == "sdpa":
        notes.append("SDPA: predicted as the flash kernel (bf16, no mask passed when "
                     "masking_utils can skip the causal mask); transformers 5.x passes "
                     "enable_gqa for grouped-query attention, and if PyTorch picks another "
                     "kernel (mem-efficient with an explicit mask, or math) the S x S terms "
                     "come back (docs/h100-runs.md)")
    notes.append("measured last time: transformers 5.17's LLaMA eager (fp32) was +0.035% "
                 "allocated / -7.9% reserved against memsim's v4.45 hf-llama")
    return notes


# ---------------------------------------------------------------- memsim
def run_memsim(memsim, yaml_path):
    p = subprocess.run([memsim, "run", yaml_path, "--json", "-"], capture_output=True,
                       text=True, cwd=REPO)
    if p.returncode != 0:
        return {"refused": (p.stderr or p.stdout).strip()}
    j = json.loads(p.stdout)
    peak = j.get("peak_event") or {}
    return {
        "peak_allocated_bytes": j["peak_allocated_bytes"],
        "peak_reserved_bytes": j["peak_reserved_bytes"],
        "parameter_count": j["model"]["parameter_count"],
        "fits": j["fits"],
        "peak_at": f"{peak.get('phase')} {peak.get('op')} (layer {peak.get('layer')})",
        "forward_end_allocated_bytes": j["marks"]["forward_end"]["allocated"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memsim", default=os.path.join(REPO, "build", "memsim"))
    ap.add_argument("--memsim-repo", default=None,
                    help="the checkout the memsim binary was built from (for its commit)")
    ap.add_argument("--configs-only", action="store_true")
    a = ap.parse_args()
    write_configs()
    if a.configs_only:
        return
    specs = [sp for sp in mc.arch_specs()]
    out = {}
    for sp in specs:
        write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
        pred = run_memsim(os.path.abspath(a.memsim), sp["scenario"])  # relative to REPO
        entry = {"impl": sp["impl"], "architecture": sp["arch"], "dtype": sp["dtype"],
                 "autocast": sp["autocast"], "attention": sp["attention"],
                 "scenario": sp["scenario"]}
        if sp["impl"] == "transformers":
            entry["hf_config"] = sp["hf_config"]
        if sp.get("large"):
            entry["large"] = True
        entry["group"] = {"core": "arch", "more": "arch-more", "extra": "arch-extra"}[sp["tier"]]
        entry.update(pred)
        notes = expected_differences(sp)
        if notes:
            entry["expected_differences"] = notes
        out[sp["name"]] = entry
        if "refused" in pred:
            print(f"{sp['name']:52s} REFUSED: {pred['refused']}")
        else:
            print(f"{sp['name']:52s} {pred['peak_allocated_bytes'] / 2**20:10.2f} MiB alloc "
                  f"{pred['peak_reserved_bytes'] / 2**20:10.2f} MiB reserved  {pred['peak_at']}")
    memsim_repo = a.memsim_repo or os.path.dirname(os.path.dirname(os.path.abspath(a.memsim)))
    doc = {
        "note": "memsim's predictions for the arch runs of tools/gpu/measure_cuda.py "
                "(--group arch-all; each entry's group says which --group runs it), committed "
                "before any of them was "
                "measured. Each value is what memsim run SCENARIO --json - printed: "
                "peak_allocated_bytes / peak_reserved_bytes are to be compared with the "
                "measured step's max_memory_allocated / max_memory_reserved "
                "(measured_step_peak_allocated / _reserved in cuda_runs.json). Scenarios: "
                "tests/data/h100/arch/NAME.yaml (tools/gpu/predict_arch.py).",
        "memsim_commit": git("rev-parse", "HEAD", cwd=memsim_repo),
        "memsim_binary": os.path.relpath(os.path.abspath(a.memsim), memsim_repo),
        "predictions": out,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(out)} predictions ({sum('refused' in e for e in out.values())} refused) -> "
          f"{os.path.relpath(OUT, REPO)}")


if __name__ == "__main__":
    main()
