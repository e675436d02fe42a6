#!/usr/bin/env python3
"""Measures real training steps on a CUDA GPU, for memsim's accuracy tests.

Run on a machine with a GPU and PyTorch 2.x (memsim's developers ran it on a lent H100):

    python3 tools/gpu/measure_cuda.py OUT_DIR [--budget SECONDS] [--only NAME|GLOB...]
                                      [--group GROUP...] [--list]

--group picks named sets (GROUPS; "arch" is the core of the decoder-architecture runs,
about four minutes of an H100 plus the machine's start-up: docs/gpu-next-session.md),
--only names or fnmatch patterns (either picks), --list prints the selection with a
timing estimate and exits. Without either, every configuration runs.

Each configuration runs in its own Python process (a fresh caching allocator and CUDA
context), with torch.cuda.memory._record_memory_history on from before the model is
built, and the training loop memsim assumes by default (sim/step/training_script.h): the
model built on the GPU in module order, the optimizer, the batch (inputs then targets,
int64 on the GPU); warm-up steps, then the measured step
    zero_grad(set_to_none=True); logits = model(ids); loss = loss(logits, labels);
    loss.backward(); opt.step()
with logits/loss bound at loop level. Per configuration it writes OUT_DIR/NAME.json
(memory_stats at the measured step's marks, the measured step's peaks, the whole run's
peaks, the CUDA context as mem_get_info sees it) and OUT_DIR/NAME.pickle (the
memory snapshot, each trace entry's Python frames cut to those in model code, so that
the files stay small). The parent writes OUT_DIR/cuda_runs.json (every result) and packs
the snapshots into OUT_DIR/snapshots.tar.xz.

Models: "standin" = the plain-torch Hugging Face stand-ins of tools/fixtures/
torch_models.py (HF GPT-2 / LLaMA eager of the v4.44 era, which memsim's hf-gpt2 and
hf-llama families follow op by op); "transformers" = the installed transformers
library's own GPT2LMHeadModel / LlamaForCausalLM built from a config, called as users do
(model(input_ids=ids, labels=labels)), to see where today's release differs.

Kind "arch" (spec["kind"]; the decoder architectures of memsim's module library, rows of
scenario/model_architecture.cpp): "standin" = torch_models.DecoderForCausalLM configured as
each row (the knobs and transformers placement of tools/fixtures/gen_arch_fixtures.py's
ARCH, whose op order memsim follows; the torch 1.13 CPU fixtures tests/data/torch_cpu_arch
came from it), at a GPU size; "transformers" = the installed transformers library's own
model built with AutoModelForCausalLM.from_config(config, attn_implementation="eager")
from the config.json a spec names (tests/data/h100/arch/configs/, or a shipped
scenarios/models/*.json), trained as the transformers runs above. memsim's scenario for
each is tests/data/h100/arch/NAME.yaml; its blind predictions
tests/data/h100/blind3_arch_predictions.json (tools/gpu/predict_arch.py).

Kind "arch", tier "cudnn-shapes" (--group cudnn-shapes; docs/sdpa-gqa.md "Other shapes"):
transformers' Qwen2 in bf16 with attn_implementation="sdpa" and SDPA forced to cuDNN
(spec["sdpa_backend"]: torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION) around
forward, loss and backward), at shapes the two cuDNN runs of tier "extra" did not cover: S =
1000 (not a multiple of 128), one KV head (MQA), 32 heads at d_model 2048. With only cuDNN
enabled SDPA raises when cuDNN refuses the shape (no silent fallback), and the warm-up step
checks the autograd graph: every SDPA node must be ScaledDotProductCudnnAttentionBackward0,
one per layer, else the run fails (result["sdpa_nodes"] records them). Scenarios
tests/data/gpu/cudnn_shapes/NAME.yaml, blind predictions
tests/data/gpu/cudnn_shapes_predictions.json (tools/gpu/predict_cudnn_shapes.py).
--self-test checks on a CPU what torch 1.13 allows of that path (the node check, the
refusal of a torch without sdpa_kernel, the specs' configs).

Without CUDA (a dry run of the script on a CPU machine) it runs the same code on the
CPU and records no memory figures; the "transformers" runs are skipped with a message
when transformers cannot be imported.
"""
import argparse
import contextlib
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

# --------------------------------------------------------------------------- configs
TINY_GPT2 = dict(layers=2, d_model=64, heads=4, kv_heads=4, d_ff=256, vocab=512, context=64,
                 seq=32, batch=2, dropout=0.0)
TINY_LLAMA = dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512, context=64,
                  seq=32, batch=2, dropout=0.0)
# GPU-sized: large-pool segments, 20 MiB rounding, oversize blocks, the S x S scores
# (4 x 16 x 1024 x 1024 fp32 = 256 MiB each) and the logits (4 x 1024 x V) both matter.
LLAMA = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000, context=1024,
             seq=1024, batch=4, dropout=0.0)
GPT2 = dict(layers=4, d_model=1024, heads=16, kv_heads=16, d_ff=4096, vocab=50257, context=1024,
            seq=1024, batch=4, dropout=0.1)
# Blind checks: memsim's predictions for these were committed before they were measured
# (tests/data/h100/blind_predictions.json).
LLAMA_BIG = dict(layers=8, d_model=2048, heads=16, kv_heads=8, d_ff=5632, vocab=32000,
                 context=2048, seq=2048, batch=2, dropout=0.0)
GPT2_BIG = dict(layers=8, d_model=1280, heads=20, kv_heads=20, d_ff=5120, vocab=50257,
                context=1024, seq=1024, batch=4, dropout=0.1)
# Second blind round, after the GPT-2 corrections (tests/data/h100/blind2_predictions.json).
GPT2_SMALL = dict(layers=12, d_model=768, heads=12, kv_heads=12, d_ff=3072, vocab=50257,
                  context=1024, seq=1024, batch=8, dropout=0.1)
LLAMA_MID = dict(layers=6, d_model=1536, heads=12, kv_heads=4, d_ff=4096, vocab=32000,
                 context=1536, seq=1536, batch=2, dropout=0.0)


def spec(name, family, cfg, impl="standin", optimizer="adamw", opt_impl="foreach",
         dtype="fp32", autocast="none", policy="none", attention="eager", warmup=1, **extra):
    cfg = dict(cfg, **extra)
    return dict(name=name, family=family, impl=impl, cfg=cfg, optimizer=optimizer,
                opt_impl=opt_impl, dtype=dtype, autocast=autocast, policy=policy,
                attention=attention, warmup=warmup)


def all_specs():
    s = []
    # 1. GPU-sized stand-ins: checkpointing policies, precisions, optimizer variants.
    for policy in ("none", "full", "uniform:2", "modules", "selective"):
        s.append(spec(f"llama_l4_d1024_s1024_b4_{policy.replace(':', '')}", "hf-llama", LLAMA,
                      policy=policy))
    s.append(spec("llama_l4_d1024_s1024_b4_autocast_bf16", "hf-llama", LLAMA, autocast="bf16"))
    s.append(spec("llama_l4_d1024_s1024_b4_autocast_bf16_full", "hf-llama", LLAMA,
                  autocast="bf16", policy="full"))
    s.append(spec("llama_l4_d1024_s1024_b4_bf16", "hf-llama", LLAMA, dtype="bf16"))
    s.append(spec("llama_l4_d1024_s1024_b4_fused", "hf-llama", LLAMA, opt_impl="fused"))
    s.append(spec("llama_l4_d1024_s1024_b4_forloop", "hf-llama", LLAMA, opt_impl="for-loop"))
    s.append(spec("llama_l4_d1024_s1024_b4_sgd", "hf-llama", LLAMA, optimizer="sgd"))
    s.append(spec("gpt2_l4_d1024_s1024_b4_drop0.1", "hf-gpt2", GPT2))
    s.append(spec("gpt2_l4_d1024_s1024_b4_drop0.1_full", "hf-gpt2", GPT2, policy="full"))
    s.append(spec("gpt2_l4_d1024_s1024_b4_autocast_bf16", "hf-gpt2", GPT2, dropout=0.0,
                  autocast="bf16"))
    # 2. The installed transformers release, eager and SDPA.
    for fam, cfg in (("hf-llama", LLAMA), ("hf-gpt2", GPT2)):
        short = fam.split("-")[1]
        for attn in ("eager", "sdpa"):
            s.append(spec(f"tf_{short}_l4_d1024_s1024_b4_{attn}", fam, cfg, impl="transformers",
                          attention=attn))
    s.append(spec("tf_llama_l4_d1024_s1024_b4_sdpa_autocast_bf16", "hf-llama", LLAMA,
                  impl="transformers", attention="sdpa", autocast="bf16"))
    s.append(spec("tf_llama_l4_d1024_s1024_b4_eager_full", "hf-llama", LLAMA,
                  impl="transformers", policy="full"))
    # 3. Blind checks (predicted before they were run).
    s.append(spec("blind_llama_l8_d2048_s2048_b2", "hf-llama", LLAMA_BIG))
    s.append(spec("blind_llama_l8_d2048_s2048_b2_full", "hf-llama", LLAMA_BIG, policy="full"))
    s.append(spec("blind_llama_l8_d2048_s2048_b2_autocast_bf16", "hf-llama", LLAMA_BIG,
                  autocast="bf16"))
    s.append(spec("blind_llama_l8_d2048_s2048_b2_selective_fused", "hf-llama", LLAMA_BIG,
                  policy="selective", opt_impl="fused"))
    s.append(spec("blind_gpt2_l8_d1280_s1024_b4_drop0.1", "hf-gpt2", GPT2_BIG))
    s.append(spec("blind_gpt2_l8_d1280_s1024_b4_autocast_bf16", "hf-gpt2", GPT2_BIG,
                  dropout=0.0, autocast="bf16"))
    s.append(spec("blind2_gpt2_l12_d768_s1024_b8_drop0.1", "hf-gpt2", GPT2_SMALL))
    s.append(spec("blind2_gpt2_l12_d768_s1024_b8_autocast_bf16", "hf-gpt2", GPT2_SMALL,
                  dropout=0.0, autocast="bf16"))
    s.append(spec("blind2_llama_l6_d1536_s1536_b2_uniform2", "hf-llama", LLAMA_MID,
                  policy="uniform:2"))
    # 4. The CPU fixtures' tiny configurations (tests/data/torch_cpu), now on CUDA.
    try:
        import gen_torch_cpu_fixtures as cpu
        for name, family, cfg, optimizer in cpu.CONFIGS:
            cfg = dict(cfg)
            dtype = cfg.pop("dtype", "fp32")
            autocast = cfg.pop("autocast", "none")
            s.append(spec("tiny_" + name, family, cfg, optimizer=optimizer, opt_impl="for-loop",
                          dtype=dtype, autocast=autocast))
    except Exception:  # the dry run without torch's dispatch-mode helpers: skip them
        traceback.print_exc()
    # 5. The decoder architectures (kind "arch", below).
    try:
        s += arch_specs()
    except Exception:
        traceback.print_exc()
        print("the arch configurations could not be built (see above): none selected",
              file=sys.stderr, flush=True)
    # 6. cuDNN attention at other shapes (tier "cudnn-shapes", below).
    try:
        s += cudnn_shape_specs()
    except Exception:
        traceback.print_exc()
        print("the cudnn-shapes configurations could not be built (see above): none selected",
              file=sys.stderr, flush=True)
    return s


# --------------------------------------------------------------------------- arch kind
# The decoder architectures of memsim's module library (scenario/model_architecture.cpp), at a
# GPU size: every row that tools/fixtures/torch_models.DecoderForCausalLM stands in for
# (granite has no stand-in: its multipliers are not in it; gpt2 is GPT2LMHeadModel above).
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
ARCH_DATA = "tests/data/h100/arch"  # memsim's scenarios and the transformers configs
ARCH_BASE = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000,
                 context=1024, seq=1024, batch=4, dropout=0.0)
# (memsim row, gen_arch_fixtures.ARCH row, shape over ARCH_BASE, knobs, placement): the
# shapes echo each family's small checkpoints (Qwen3-0.6B's head_dim 128 and 8 KV heads,
# Gemma's MQA and head_dim 256, Gemma-2/3's 8 heads / 4 KV, Phi-3's and OLMo-2's MHA,
# Phi-3's vocab 32064), with windows (512) shorter than the sequence.
ARCH_ROWS = [
    # Llama with attention_bias and mlp_bias (the fixture row); memsim's llama row keeps
    # hf-llama's layout, without v4.45's unused per-attention rotary buffer.
    ("llama", "llama", {}, {}, dict(attn_rope_buffer=False)),
    ("qwen2", "qwen2", {}, {}, {}),
    ("qwen3", "qwen3", dict(kv_heads=8, d_ff=3072, tied=True), dict(head_dim=128), {}),
    ("gemma", "gemma", dict(heads=8, kv_heads=1, d_ff=4096, tied=True), dict(head_dim=256), {}),
    ("gemma2", "gemma2", dict(heads=8, kv_heads=4, d_ff=4096, tied=True),
     dict(head_dim=256, sliding_window=512, sliding_layers=[1, 0, 1, 0]),
     dict(query_pre_attn_scalar=256)),
    ("gemma3_text", "gemma3", dict(layers=6, heads=8, kv_heads=4, d_ff=4096, tied=True),
     dict(head_dim=256, sliding_window=512, sliding_layers=[1, 1, 1, 1, 1, 0]),
     dict(query_pre_attn_scalar=256)),
    ("phi3", "phi3", dict(heads=16, kv_heads=16, vocab=32064), {}, {}),
    ("olmo2", "olmo2", dict(heads=16, kv_heads=16), {}, {}),
    ("mistral", "mistral", {}, dict(sliding_window=512), {}),
]
# The transformers runs: a small config.json per model_type (the shapes of the stand-in
# of the same row, so that stand-in vs library isolates the library's code), and two
# whole small checkpoints' shipped configs (real vocabulary and depth), all blind.
ARCH_TF_SMALL = ("qwen2", "qwen3", "gemma2", "phi3", "mistral")
ARCH_TF_LARGE = [  # (short name, config file, batch, seq, dtype)
    ("qwen2.5-0.5b", "scenarios/models/qwen2.5-0.5b.json", 2, 2048, "bf16"),
    ("qwen3-0.6b", "scenarios/models/qwen3-0.6b.json", 2, 2048, "bf16"),
]
# Rough seconds per run on an H100 (a fresh Python + torch import, CUDA context, build,
# two steps, snapshot); the transformers import adds a few seconds.
EST_SECONDS = {("standin", False): 6.0, ("standin", True): 9.0,
               ("transformers", False): 11.0, ("transformers", True): 15.0}


def arch_standin_cfg(row_name, fixture_row, shape, knobs, placement):
    """The stand-in's cfg (torch_models.DecoderForCausalLM) for one row at a GPU size."""
    saved = None
    try:
        import torch
        saved = torch.clear_autocast_cache
    except Exception:
        pass
    import gen_arch_fixtures as ga
    if saved is not None:  # importing gen_checkpoint_fixtures wraps it (for CPU autocast)
        torch.clear_autocast_cache = saved
    base = dict(ARCH_BASE)
    cfg = ga.row(fixture_row, base, arch_over=knobs, **shape)
    cfg["arch_hf"] = dict(cfg["arch_hf"], **placement)
    return cfg


def read_hf_config(path):
    with open(os.path.join(REPO, path)) as f:
        return json.load(f)


def hf_shape(d, batch, seq):
    """A config.json's shape in the spec's cfg keys (for the record and the dry run)."""
    heads = d["num_attention_heads"]
    return dict(layers=d["num_hidden_layers"], d_model=d["hidden_size"], heads=heads,
                kv_heads=d.get("num_key_value_heads") or heads, d_ff=d["intermediate_size"],
                vocab=d["vocab_size"], context=d["max_position_embeddings"], seq=seq,
                batch=batch, dropout=float(d.get("attention_dropout", 0.0) or 0.0),
                tied=bool(d.get("tie_word_embeddings", False)))


def arch_specs():
    """The arch runs, each with its tier (spec["tier"]):
      "core"  (--group arch, about four minutes of an H100), in the order of their value
              to memsim, so that a budget cut drops the last: stand-ins fp32,
              transformers fp32, the two whole checkpoints (transformers, bf16),
              transformers bf16, stand-ins bf16 of the rows whose bf16 path is new
              (GemmaRMSNorm's fp32 round trip, softcaps, q/k norms, fp32 logits in the
              loss, fused projections);
      "more"  (--group arch-more): the other bf16 runs (Llama-like rows, whose bf16 path
              the hf-llama H100 runs measured) and the stand-ins of the two checkpoints;
      "extra" (--group arch-extra): what users also run and memsim refuses or has not
              checked (bf16 autocast over fp32 weights; SDPA in bf16)."""
    rows = {r[0]: r for r in ARCH_ROWS}
    standin = {name: arch_standin_cfg(*r) for name, r in rows.items()}

    def tag(cfg):
        return f"l{cfg['layers']}_d{cfg['d_model']}_s{cfg['seq']}_b{cfg['batch']}"

    def standin_spec(row, cfg, dtype, name=None, large=False):
        sp = spec(name or f"arch_{row}_{tag(cfg)}_{dtype}", "hf-decoder", cfg, dtype=dtype)
        sp.update(kind="arch", arch=row, large=large,
                  scenario=f"{ARCH_DATA}/{name or f'arch_{row}_{tag(cfg)}_{dtype}'}.yaml")
        return sp

    def tf_spec(row, config, batch, seq, dtype, name, large=False, autocast="none",
                attention="eager"):
        d = read_hf_config(config)
        sp = spec(name, "hf-decoder", hf_shape(d, batch, seq), impl="transformers",
                  dtype=dtype, autocast=autocast, attention=attention)
        sp.update(kind="arch", arch=row, large=large, hf_config=config,
                  scenario=f"{ARCH_DATA}/{name}.yaml")
        return sp

    def tf_small(row, dtype, autocast="none", attention="eager"):
        cfg = standin[row]
        suffix = dtype + (f"_autocast_{autocast}" if autocast != "none" else "") + \
            (f"_{attention}" if attention != "eager" else "")
        return tf_spec(row, f"{ARCH_DATA}/configs/{row}_{tag(cfg)}.json", cfg["batch"],
                       cfg["seq"], dtype, f"tf_arch_{row}_{tag(cfg)}_{suffix}",
                       autocast=autocast, attention=attention)

    # Stand-ins of the two whole checkpoints: the same shapes through the stand-in.
    large_standin = []
    for short, config, batch, seq, dtype in ARCH_TF_LARGE:
        d = read_hf_config(config)
        row = d["model_type"]
        r = rows[row]
        shape = dict(hf_shape(d, batch, seq), dropout=0.0)
        knobs = dict(r[3])
        if "head_dim" in d:
            knobs["head_dim"] = d["head_dim"]
        large_standin.append((row, short, dtype, arch_standin_cfg(row, r[1], shape, knobs, r[4])))

    new_bf16 = ("qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2")
    core = [standin_spec(row, standin[row], "fp32") for row in rows]
    core += [tf_small(row, "fp32") for row in ARCH_TF_SMALL]
    core += [tf_spec(read_hf_config(config)["model_type"], config, batch, seq, dtype,
                     f"tf_arch_{short}_s{seq}_b{batch}_{dtype}", large=True)
             for short, config, batch, seq, dtype in ARCH_TF_LARGE]
    core += [tf_small(row, "bf16") for row in ARCH_TF_SMALL if row != "mistral"]
    core += [standin_spec(row, standin[row], "bf16") for row in rows if row in new_bf16]
    more = [standin_spec(row, standin[row], "bf16") for row in rows if row not in new_bf16]
    more += [tf_small("mistral", "bf16")]
    more += [standin_spec(row, cfg, dtype, f"arch_{short}_s{cfg['seq']}_b{cfg['batch']}_{dtype}",
                          large=True) for row, short, dtype, cfg in large_standin]
    # bf16 autocast over fp32 weights (HF Trainer's bf16=True) is refused by memsim for
    # every row but llama; SDPA in bf16 (transformers' default attention) is not checked
    # against a trace for these rows yet.
    extra = [tf_small("qwen2", "fp32", autocast="bf16"), tf_small("gemma2", "fp32", autocast="bf16"),
             tf_small("qwen2", "bf16", attention="sdpa"), tf_small("qwen3", "bf16", attention="sdpa")]
    for tier, specs in (("core", core), ("more", more), ("extra", extra)):
        for sp in specs:
            sp["tier"] = tier
    return core + more + extra


# --------------------------------------------------------------------------- cudnn-shapes
# SDPA's cuDNN backend (graph/ops/ops_sdpa_cudnn.h) was read off two bf16 runs at B 4, S 1024
# with 4 and 8 KV heads (tier "extra"). These runs check its backward workspace formula and
# its saved statistics at shapes that could break it, in the order of their value:
#   (name, config.json, batch, seq, what it checks)
CUDNN_DATA = "tests/data/gpu/cudnn_shapes"  # memsim's scenarios and the two new configs
CUDNN_SHAPES = [
    ("cudnn_qwen2_l4_d1024_s1000_b4_bf16", f"{ARCH_DATA}/configs/qwen2_l4_d1024_s1024_b4.json",
     4, 1000, "S = 1000, not a multiple of 128 (cuDNN tiles of 64/128 rows: padded statistics "
     "or dQ accumulator?)"),
    ("cudnn_qwen2_mqa_l4_d1024_s1024_b4_bf16",
     f"{CUDNN_DATA}/configs/qwen2_mqa_l4_d1024_s1024_b4.json", 4, 1024,
     "one KV head (MQA: 16 query heads per KV head)"),
    ("cudnn_qwen2_h32_l4_d2048_s1024_b4_bf16",
     f"{CUDNN_DATA}/configs/qwen2_h32_l4_d2048_s1024_b4.json", 4, 1024,
     "32 heads / 8 KV heads at d_model 2048 (twice the B*H*S*hd of the Qwen2 run)"),
]


def cudnn_shape_specs():
    """The tier "cudnn-shapes" runs: transformers' model from each config (bf16, SDPA),
    with SDPA forced to cuDNN."""
    out = []
    for name, config, batch, seq, why in CUDNN_SHAPES:
        d = read_hf_config(config)
        sp = spec(name, "hf-decoder", hf_shape(d, batch, seq), impl="transformers",
                  dtype="bf16", attention="sdpa")
        sp.update(kind="arch", arch=d["model_type"], large=False, hf_config=config,
                  scenario=f"{CUDNN_DATA}/{name}.yaml", tier="cudnn-shapes",
                  sdpa_backend="cudnn", why=why,
                  est=15.0)  # the H200 process seconds of the arch lease's transformers runs
        out.append(sp)
    return out


def sdpa_force_context(sp, result):
    """A factory of the context the step runs in: nothing for a run without
    spec["sdpa_backend"]; for "cudnn", torch.nn.attention.sdpa_kernel(SDPBackend.
    CUDNN_ATTENTION): the only backend SDPA may pick, so that a shape cuDNN refuses raises
    ("No available kernel") instead of running flash or math. Raises, naming what is
    missing, on a torch without it (1.13 here)."""
    if not sp.get("sdpa_backend"):
        return contextlib.nullcontext
    if sp["sdpa_backend"] != "cudnn":
        raise ValueError(f"sdpa_backend {sp['sdpa_backend']!r}: only 'cudnn' is prepared")
    import torch
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = SDPBackend.CUDNN_ATTENTION
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            f"{sp['name']}: torch {torch.__version__} has no torch.nn.attention.sdpa_kernel "
            f"with SDPBackend.CUDNN_ATTENTION (torch >= 2.3), needed to force cuDNN "
            f"attention: {e}") from None
    if result is not None:  # None: the parent's check of this torch
        result["sdpa_forced"] = "torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)"
        try:
            result["cudnn_version"] = torch.backends.cudnn.version()
        except Exception as e:  # recorded, not needed
            result["cudnn_version"] = f"{type(e).__name__}: {e}"
    return lambda: sdpa_kernel(backend)


def sdpa_nodes(root):
    """{autograd node class name: count} of every fused-SDPA node ("Attention" in the class
    name: ScaledDotProduct{Cudnn,Flash,Efficient}AttentionBackward0, ...) reachable from root
    (a grad_fn), each node visited once. The math kernel leaves no such node (its matmul and
    softmax nodes), so a math fallback shows as none. Makes no tensors. The visited nodes'
    Python objects are kept until the walk ends: an id() is only unique among live objects
    (a C++ node keeps one Python wrapper while that wrapper lives)."""
    counts, seen, todo = {}, {}, [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        name = type(node).__name__
        if "Attention" in name:
            counts[name] = counts.get(name, 0) + 1
        todo.extend(nf[0] for nf in getattr(node, "next_functions", ()))
    return counts


def check_sdpa_backend(sp, counts, layers):
    """Raises unless the graph holds exactly one cuDNN attention node per layer (and no
    other SDPA kernel's node) for a run that forces cuDNN."""
    want = "ScaledDotProductCudnnAttentionBackward0"
    if sp.get("sdpa_backend") == "cudnn" and counts != {want: layers}:
        raise RuntimeError(f"{sp['name']}: cuDNN attention did not run as forced: the step's "
                           f"attention nodes are {counts or 'none'}, expected {want} x {layers}")


def _arch(sp, *tiers):
    return sp.get("kind") == "arch" and sp["tier"] in tiers


GROUPS = {
    "legacy": lambda sp: sp.get("kind") != "arch",
    "arch": lambda sp: _arch(sp, "core"),
    "arch-more": lambda sp: _arch(sp, "more"),
    "arch-extra": lambda sp: _arch(sp, "extra"),
    "arch-all": lambda sp: _arch(sp, "core", "more", "extra"),
    # Slices of core + more:
    "arch-standin": lambda sp: _arch(sp, "core", "more") and sp["impl"] == "standin",
    "arch-tf": lambda sp: _arch(sp, "core", "more") and sp["impl"] == "transformers",
    "arch-fp32": lambda sp: _arch(sp, "core", "more") and sp["dtype"] == "fp32",
    "arch-bf16": lambda sp: _arch(sp, "core", "more") and sp["dtype"] == "bf16",
    "arch-large": lambda sp: _arch(sp, "core", "more") and sp.get("large", False),
    "cudnn-shapes": lambda sp: _arch(sp, "cudnn-shapes"),
}


def estimate(sp):
    if sp.get("kind") != "arch":
        return 6.0 if sp["impl"] == "standin" else 11.0
    return sp.get("est") or EST_SECONDS[(sp["impl"], bool(sp.get("large")))]


# --------------------------------------------------------------------------- one run
STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
              "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "requested_bytes.all.current", "requested_bytes.all.peak",
              "num_alloc_retries", "num_ooms", "segment.all.current")


def stats(torch, cuda):
    return gpu_common.memory_stats(torch, cuda, STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from model, loop and optimizer code only (at most 4)."""
    py_cut = gpu_common.frames_from(
        ("torch_models", "measure_cuda", "transformers", "optim", "checkpoint"), 4)
    # With C++ stacks: the autograd nodes and ATen ops by name (at most 8 of them).
    keep_cpp = ("torch::autograd::", "at::native::", "at::_ops::", "InputBuffer", "Backward")

    def cut(frames):
        cpp = [f for f in frames if any(k in f.get("name", "") for k in keep_cpp)][:8]
        return py_cut(frames) + cpp

    return gpu_common.map_frames(snapshot, cut)


def build_standin(torch, sp, device):
    import torch_models as tm
    cfg = dict(sp["cfg"])
    build = tm.GPT2LMHeadModel if sp["family"] == "hf-gpt2" else tm.LlamaForCausalLM
    loss_fn = tm.gpt2_loss if sp["family"] == "hf-gpt2" else tm.llama_loss
    model = build(cfg)
    tm.set_policy(model, sp["policy"])
    return model, (lambda m, ids, labels: m(ids)), loss_fn


def build_transformers(torch, sp, device):
    import transformers
    c = sp["cfg"]
    if sp["family"] == "hf-llama":
        config = transformers.LlamaConfig(
            vocab_size=c["vocab"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
            num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
            num_key_value_heads=c["kv_heads"], max_position_embeddings=c["context"],
            tie_word_embeddings=False, use_cache=False)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.GPT2Config(
            vocab_size=c["vocab"], n_embd=c["d_model"], n_layer=c["layers"], n_head=c["heads"],
            n_positions=c["context"], n_inner=c["d_ff"], resid_pdrop=c["dropout"],
            embd_pdrop=c["dropout"], attn_pdrop=c["dropout"], use_cache=False)
        cls = transformers.GPT2LMHeadModel
    try:
        config._attn_implementation = sp["attention"]
    except Exception:  # a release without the setter
        config = cls.config_class(**dict(config.to_dict(), attn_implementation=sp["attention"]))
    model = cls(config)
    if sp["policy"] == "full":
        model.gradient_checkpointing_enable()

    def forward(m, ids, labels):
        return m(input_ids=ids, labels=labels, use_cache=False)

    def loss_fn(out, labels):
        return out.loss

    return model, forward, loss_fn


def build_arch_standin(torch, sp, device):
    """torch_models.DecoderForCausalLM configured as one architecture row."""
    import torch_models as tm
    cfg = dict(sp["cfg"])
    model = tm.DecoderForCausalLM(cfg)
    tm.set_policy(model, sp["policy"])
    return model, (lambda m, ids, labels: m(ids)), tm.decoder_loss(cfg)


def build_arch_transformers(torch, sp, device):
    """AutoModelForCausalLM.from_config from the spec's config.json, as users build a
    model without weights; called as users call it (model(input_ids=ids, labels=labels))."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    d = read_hf_config(sp["hf_config"])
    c = sp["cfg"]
    if c.get("dry_run"):  # the CPU dry run: the same code on a tiny model
        d.update(num_hidden_layers=c["layers"], hidden_size=c["d_model"],
                 num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                 intermediate_size=c["d_ff"], vocab_size=c["vocab"],
                 max_position_embeddings=c["context"])
        for k, v in (("head_dim", 16), ("query_pre_attn_scalar", 16), ("sliding_window", 8)):
            if d.get(k):
                d[k] = v
        for k in ("layer_types", "max_window_layers", "pad_token_id"):
            d.pop(k, None)
    for k in ("torch_dtype", "dtype"):  # the spec's dtype decides, not the file's
        d.pop(k, None)
    d["use_cache"] = False
    config = CONFIG_MAPPING[d["model_type"]].from_dict(d)
    dtype = torch.bfloat16 if sp["dtype"] == "bf16" else torch.float32
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": dtype}
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=sp["attention"], **kw)
    got = sorted({str(p.dtype) for p in model.parameters()})
    if got != [str(dtype)]:
        raise RuntimeError(f"transformers built the model in {got}, expected {dtype}")

    def forward(m, ids, labels):
        return m(input_ids=ids, labels=labels, use_cache=False)

    def loss_fn(out, labels):
        return out.loss

    return model, forward, loss_fn


def make_optimizer(torch, sp, params):
    kw = {}
    if sp["opt_impl"] == "foreach":
        kw["foreach"] = True
    elif sp["opt_impl"] == "for-loop":
        kw["foreach"] = False
    elif sp["opt_impl"] == "fused":
        kw["fused"] = True
    if sp["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **kw)
    return torch.optim.SGD(params, lr=1e-4, **kw)


def run_one(sp, out_dir):
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device))
    if not cuda:  # dry run: the same code on a model small enough for a CPU
        sp = dict(sp, cfg=dict(sp["cfg"], layers=2, d_model=64, heads=4,
                               kv_heads=min(sp["cfg"]["kv_heads"], 4), d_ff=172, vocab=512,
                               context=64, seq=32, batch=2))
        if sp.get("kind") == "arch":
            sp["cfg"]["dry_run"] = True
    if cuda:
        gpu_common.init_cuda(torch, result)
        # MEMSIM_CPP_STACKS=1: C++ frames too (the autograd node and ATen op of each backward
        # allocation, which Python frames cannot show), trimmed by trim_frames.
        stacks = "all" if os.environ.get("MEMSIM_CPP_STACKS") == "1" else "python"
        result["stacks"] = stacks
        gpu_common.record_history(torch, stacks)
        free1, total = torch.cuda.mem_get_info()
        result["mem_get_info_after_history"] = [free1, total]
    torch.manual_seed(0)
    if sp.get("kind") == "arch":
        build = build_arch_standin if sp["impl"] == "standin" else build_arch_transformers
    else:
        build = build_standin if sp["impl"] == "standin" else build_transformers
    default_dtype = torch.get_default_dtype()
    if sp["dtype"] == "bf16":  # as from_pretrained(torch_dtype=bfloat16): built in bf16
        torch.set_default_dtype(torch.bfloat16)
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model, forward, loss_fn = build(torch, sp, device)
    torch.set_default_dtype(default_dtype)
    if sp.get("kind") == "arch":  # where the parameters were made (before any move)
        result["built_on"] = sorted({str(p.device) for p in model.parameters()})
    model = model.to(device)  # no-op when built on the device
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    cfg_obj = getattr(model, "config", None)
    if cfg_obj is not None:  # transformers: what it really runs
        import transformers
        result["transformers_version"] = transformers.__version__
        result["attn_implementation"] = getattr(cfg_obj, "_attn_implementation", None)
    result["marks"] = {"after_model": stats(torch, cuda)}
    opt = make_optimizer(torch, sp, model.parameters())
    c = sp["cfg"]
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=device)
    labels = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=device)
    region = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) \
        if sp["autocast"] == "bf16" else contextlib.nullcontext
    force = sdpa_force_context(sp, result)  # nullcontext unless the spec forces a backend
    logits = loss = None
    t0 = time.time()
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        if measured:
            result["marks"]["measured_step_begin"] = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        with force():
            with region():
                logits = forward(model, ids, labels)
                if measured:
                    result["marks"]["forward_end"] = stats(torch, cuda)
                loss = loss_fn(logits, labels)
            if step == 0 and sp.get("sdpa_backend"):  # the warm-up step: which kernel ran
                result["sdpa_nodes"] = sdpa_nodes(loss.grad_fn)
                check_sdpa_backend(sp, result["sdpa_nodes"], c["layers"])
            loss.backward()
        if measured:
            result["marks"]["backward_end"] = stats(torch, cuda)
        opt.step()
        if measured:
            result["marks"]["optimizer_end"] = stats(torch, cuda)
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames, streams=False)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


def self_test(out_dir):
    """What a CPU with torch 1.13 and no transformers can check of the cudnn-shapes path:
    the specs and their configs (the shapes each run is for), the node check on a real
    autograd graph (math attention here: it must refuse it, as it would a fallback on the
    GPU) and on a graph with one cuDNN-named node per layer, and the forcing context (its
    refusal by name where torch lacks sdpa_kernel). Prints each check; raises on a failure."""
    import torch
    specs = cudnn_shape_specs()
    assert [sp["name"] for sp in specs] == [r[0] for r in CUDNN_SHAPES]
    for sp in specs:
        c = sp["cfg"]
        hd = c["d_model"] // c["heads"]
        assert sp["dtype"] == "bf16" and sp["attention"] == "sdpa" and sp["tier"] == "cudnn-shapes"
        assert c["seq"] <= c["context"] and c["heads"] % c["kv_heads"] == 0 and hd % 8 == 0
        assert GROUPS["cudnn-shapes"](sp) and not GROUPS["arch-all"](sp)
        print(f"spec {sp['name']}: B {c['batch']} S {c['seq']} H {c['heads']} KV {c['kv_heads']} "
              f"hd {hd} ({sp['why']})")
    assert specs[0]["cfg"]["seq"] % 128 != 0 and specs[1]["cfg"]["kv_heads"] == 1
    # The node check on a real graph: the math attention of torch 1.13 (or SDPA on a CPU).
    layers = 2
    x = torch.randn(1, 2, 8, 16, requires_grad=True)
    h = x
    for _ in range(layers):
        if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            h = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
        else:
            w = (h @ h.transpose(-2, -1) / 4.0).softmax(-1)
            h = w @ h
    loss = h.sum()
    counts = sdpa_nodes(loss.grad_fn)
    try:
        check_sdpa_backend(specs[0], counts, layers)
        raise AssertionError(f"the node check accepted a graph without cuDNN nodes: {counts}")
    except RuntimeError as e:
        print(f"node check refuses a non-cuDNN graph: {e}")
    check_sdpa_backend(dict(specs[0], sdpa_backend=None), counts, layers)  # unforced: no check

    class ScaledDotProductCudnnAttentionBackward0:  # stands for the CUDA node: same name
        def __init__(self, nxt):
            self.next_functions = ((nxt, 0),)

    node = None
    for _ in range(layers):
        node = ScaledDotProductCudnnAttentionBackward0(node)
    counts = sdpa_nodes(node)
    check_sdpa_backend(specs[0], counts, layers)
    print(f"node check accepts {counts}")
    try:
        check_sdpa_backend(specs[0], counts, layers + 1)
        raise AssertionError("the node check accepted too few cuDNN nodes")
    except RuntimeError:
        print("node check refuses fewer cuDNN nodes than layers")
    try:
        ctx = sdpa_force_context(specs[0], None)
        with ctx():
            pass
        print(f"forcing context entered (torch {torch.__version__})")
    except RuntimeError as e:
        print(f"forcing context refused: {e}")
    assert sdpa_force_context(dict(specs[0], sdpa_backend=None), None) is contextlib.nullcontext
    # run_one's loop with a forced backend, on the qwen2 stand-in (no transformers here):
    # the forcing context and the node check replaced by recorders, the rest as on the GPU.
    sp = next(x for x in arch_specs() if x["name"] == "arch_qwen2_l4_d1024_s1024_b4_fp32")
    sp = dict(sp, name="self_test_forced_qwen2", sdpa_backend="cudnn")
    calls, g = [], globals()
    saved = g["sdpa_force_context"], g["check_sdpa_backend"]
    g["sdpa_force_context"] = lambda sp, result: (calls.append("force"), contextlib.nullcontext)[1]
    g["check_sdpa_backend"] = lambda sp, counts, layers: calls.append((counts, layers))
    try:
        r = run_one(sp, out_dir)
    finally:
        g["sdpa_force_context"], g["check_sdpa_backend"] = saved
    assert calls == ["force", ({}, 2)] and r["sdpa_nodes"] == {}, calls
    print(f"run_one with a forced backend: context entered, node check called once with "
          f"{calls[1]} (math attention on this CPU), loss {r['loss']:.3f}")
    print("self-test passed")


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def selected(specs, only, groups):
    """The specs --only (names or fnmatch patterns) and --group pick (both: either);
    neither: all of them."""
    if not only and not groups:
        return list(specs)
    for g in groups or ():
        if g not in GROUPS:
            raise SystemExit(f"unknown group {g!r}; groups: {', '.join(GROUPS)}")
    out = []
    for sp in specs:
        by_name = any(fnmatch.fnmatchcase(sp["name"], pat) for pat in (only or ()))
        by_group = any(GROUPS[g](sp) for g in (groups or ()))
        if by_name or by_group:
            out.append(sp)
    return out


def print_estimate(chosen):
    total = sum(estimate(sp) for sp in chosen) + 1.0 * len(chosen)  # + packing
    by_impl = {}
    for sp in chosen:
        by_impl[sp["impl"]] = by_impl.get(sp["impl"], 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in sorted(by_impl.items()))
    print(f"{len(chosen)} configurations ({parts}): about {total:.0f} s of runs on an H100 "
          f"(estimate; the machine's start-up comes on top)", flush=True)
    return total


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=400.0, per_run=90.0)
    ap.add_argument("--group", nargs="*", help="named sets: " + ", ".join(GROUPS))
    ap.add_argument("--self-test", action="store_true",
                    help="check the cudnn-shapes path on this machine (CPU) and exit")
    a = ap.parse_args()
    if a.self_test:
        os.makedirs(a.out_dir, exist_ok=True)
        self_test(a.out_dir)
        return
    specs = all_specs()
    if not a.list:
        os.makedirs(a.out_dir, exist_ok=True)
    if a.one:
        sp = next(s for s in specs if s["name"] == a.one)
        run_one(sp, a.out_dir)
        return
    chosen = selected(specs, a.only, a.group)
    if a.list:
        for sp in chosen:
            tags = [g for g, f in GROUPS.items() if f(sp)]
            print(f"{sp['name']:58s} {estimate(sp):5.1f} s  {' '.join(tags)}")
        print_estimate(chosen)
        return
    print_estimate(chosen)
    t_start = time.time()
    try:
        subprocess.run(["nvidia-smi"], check=False)
    except OSError:
        print("no nvidia-smi: a dry run on the CPU", flush=True)
    have_transformers = importlib.util.find_spec("transformers") is not None
    no_force = None  # why this torch cannot force an SDPA backend (only asked when needed)
    if any(sp.get("sdpa_backend") for sp in chosen):
        try:
            sdpa_force_context(dict(name="check", sdpa_backend="cudnn"), None)
        except RuntimeError as e:
            no_force = str(e).split(": ", 1)[1]

    def skip(sp):
        if sp.get("sdpa_backend") and (no_force or not have_transformers):
            why = [no_force] if no_force else []
            if not have_transformers:
                why.append("transformers is not importable by " + sys.executable)
            return ("skipped: " + "; ".join(why),
                    f"SKIPPED {sp['name']}: " + "; ".join(why) + " (python3 "
                    f"tools/gpu/measure_cuda.py OUT --self-test checks the rest here)")
        if sp["impl"] == "transformers" and not have_transformers:
            return ("skipped: transformers is not importable by " + sys.executable,
                    f"SKIPPED {sp['name']}: transformers is not importable here "
                    f"({sys.executable}); the stand-in runs do not need it")
        return None

    def accept(sp, r, t_run, failures):
        if sp.get("kind") == "arch":  # the whole child process, for the next estimates
            r["process_seconds"] = round(time.time() - t_run, 2)
        return True

    def report(sp, r):
        print(f"{sp['name']:58s} peak alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(__file__, a.out_dir, a.budget, t_start, per_run=a.per_run,
                                min_left=lambda sp: 15.0, not_run="quiet", failed_keep=3000,
                                failed_show=600, timeout_note="plain", process_facts=False,
                                skip=skip)
    results, failures = gpu_common.run_children(chosen, loop, report, accept)
    gpu_common.write_json(os.path.join(a.out_dir, "cuda_runs.json"),
                          {"results": results, "failures": failures})
    gpu_common.pack_snapshots(a.out_dir, gpu_common.result_pickles(a.out_dir, results),
                              "snapshots.tar.xz")
    gpu_common.remove_run_files(a.out_dir, results)
    print(f"{len(results)} runs, {len(failures)} failed or skipped, "
          f"{time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
