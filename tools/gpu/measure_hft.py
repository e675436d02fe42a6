#!/usr/bin/env python3
"""Measures HF Trainer's and PEFT's defaults (issue #16 item 5) on transformers' own model:
fp32 weights with bf16 autocast and SDPA, gradient_checkpointing_enable() with 5.x's
default kwargs, PEFT LoRA with checkpointing (and PEFT's enable_input_require_grads hook),
and LoRA under FSDP2 on the fake process group. memsim models each (docs/hf-trainer.md,
docs/autocast.md); this checks them against torch 2.11 + transformers 5.17 + peft.

    python3 tools/gpu/measure_hft.py OUT_DIR [--budget SECONDS] [--per-run SECONDS]
                                     [--only NAME|GLOB...] [--list]

Each configuration (RUNS below) runs in its own Python process (a fresh caching allocator
and CUDA context) with a per-run timeout; a failing run is recorded with its stderr and
the next one runs; no run is started once --budget seconds are spent (each run's timeout
is at most what is left). The parent writes OUT_DIR/hft_runs.json (every result and
failure, torch / transformers / peft versions) and OUT_DIR/hft_snapshots.tar.xz
(torch.cuda.memory._snapshot() of each run, frames cut to model / PEFT / loop / optimizer).

The step is HF Trainer's, replicated rather than run through Trainer itself (Trainer's
dataloader, accelerate wrapper, scheduler and callbacks are not what is being checked;
transformers 5.x trainer.py `training_step` / `compute_loss`, accelerate's prepare_model):
    with torch.autocast("cuda", torch.bfloat16):      # Trainer(bf16=True) via accelerate
        outputs = model(input_ids=ids, labels=labels)  # compute_loss: the model's own loss
        loss = outputs.loss
    del outputs                                        # compute_loss returns the loss only
    loss.backward()                                    # accelerator.backward(loss)
    optimizer.step(); model.zero_grad(set_to_none=True)  # after each update step
with the optimizer as Trainer's create_optimizer builds it: two parameter groups (weight
decay / no decay on biases and norms, weight_decay 0.0: Trainer's default) over the
parameters that require grad, torch AdamW with fused=True ("adamw_torch_fused", 5.x's
default optim with torch >= 2.8; recorded from TrainingArguments when it can be made).
Not replicated: accelerate's convert_outputs_to_fp32 (the returned logits are cast to
fp32 when the forward returns, a copy that dies with `outputs` before backward),
clip_grad_norm_ (0-d norms), the per-step batch copies and the LR scheduler.
memsim's scenario of each run is tests/data/gpu/hft/NAME.yaml (step.keep_output: loss
is this step) and its blind prediction tests/data/gpu/hft_predictions.json
(tools/gpu/predict_hft.py); tests/test_gpu_hft_runs.cpp compares them once the
measurement is committed as tests/data/gpu/hft/hft_runs.json.

Model: transformers' Qwen2ForCausalLM from AutoModelForCausalLM.from_config, built on
the GPU (`with torch.device("cuda")`) in fp32, 4 layers, hidden 1024, 16 heads,
intermediate 2816, vocab 32000, batch 4 x 1024: tests/data/gpu/hft/configs/. The main
runs use 16 KV heads (MHA): transformers 5.17's sdpa_attention_forward then passes
k/v as they are (no repeat_kv, no enable_gqa) and PyTorch picks its fused kernel (flash
for bf16, mem-efficient for fp32), which is what memsim models. The last run keeps the
arch config's 4 KV heads (GQA), where 5.17 calls SDPA with enable_gqa=True and memsim
still materialises repeat_kv (a known +1% over on tf_llama_..._sdpa_autocast_bf16).

What is recorded per run: memory_stats() at after_model, after_setup (PEFT / FSDP2 /
optimizer made), measured_step_begin, after_compute_loss (the loss computed, the outputs
dropped), backward_end, optimizer_end; the measured step's max allocated / reserved (peaks reset at
its start); the whole run's; what checkpointing the model really used (the layers'
_gradient_checkpointing_func keywords: use_reentrant), whether the input embeddings carry
PEFT's make_inputs_require_grad hook, the SDPA kernel PyTorch can pick for the run's
q/k/v (torch.backends.cuda.can_use_flash_attention / can_use_efficient_attention), the
trainable / total parameter counts.

Without CUDA (a dry run on a CPU machine: /usr/bin/python3 here has torch 1.13 and no
transformers or peft) each run records why it cannot run (the missing package or API) and
what the CPU could check: the optimizer's parameter groups on a stand-in, the fake process
group's availability. No memory figures are recorded on the CPU.
"""
import argparse
import contextlib
import json
import os
import sys
import time
import traceback

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DATA = "tests/data/gpu/hft"  # memsim's scenario of each run (NAME.yaml) and the configs

MHA_CONFIG = f"{DATA}/configs/qwen2_l4_d1024_mha.json"
GQA_CONFIG = f"{DATA}/configs/qwen2_l4_d1024_s1024_b4.json"
BATCH, SEQ = 4, 1024
LORA = dict(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def spec(name, config=MHA_CONFIG, autocast="bf16", gc=False, gc_kwargs=None, lora=False,
         fsdp2_world=0, opt_impl="fused", est=12.0, timeout=60.0, why=""):
    """One run. gc: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=
    gc_kwargs) (None: transformers' own default); lora: PEFT get_peft_model with LORA
    after checkpointing is enabled (PEFT then registers enable_input_require_grads);
    fsdp2_world: fully_shard over a fake world of that many ranks (0: none)."""
    return dict(name=name, hf_config=config, dtype="fp32", autocast=autocast,
                attention="sdpa", gc=gc, gc_kwargs=gc_kwargs, lora=dict(LORA) if lora else None,
                fsdp2_world=fsdp2_world, optimizer="adamw", opt_impl=opt_impl, warmup=1,
                batch=BATCH, seq=SEQ, est=est, timeout=timeout, why=why,
                scenario=f"{DATA}/{name}.yaml")


# In the order of their value to memsim (a budget cut drops the last).
RUNS = [
    spec("hft_bf16_sdpa", why="(a) Trainer(bf16=True): fp32 weights, bf16 autocast, SDPA "
         "(flash), fused AdamW, no checkpointing"),
    spec("hft_bf16_sdpa_gc", gc=True, why="(b) (a) + model.gradient_checkpointing_enable() "
         "with 5.17's default kwargs (use_reentrant False since transformers PR #43203; "
         "recorded)"),
    spec("hft_lora_gc", autocast="none", gc=True, lora=True,
         why="(c) PEFT LoRA r 16 on q_proj/v_proj after gradient_checkpointing_enable() "
         "(PEFT's enable_input_require_grads hook), fp32 without autocast (memsim refuses "
         "LoRA under autocast), SDPA (mem-efficient), fused AdamW on the adapters"),
    spec("hft_lora_fsdp2_w8", autocast="none", lora=True, fsdp2_world=8, opt_impl="foreach",
         est=14.0, why="(d) PEFT LoRA under FSDP2 (fully_shard per decoder layer, then the "
         "root) on a fake world of 8, fp32, foreach AdamW over the sharded adapters"),
    spec("hft_bf16_sdpa_gc_reentrant", gc=True, gc_kwargs={"use_reentrant": True},
         why="(b) with gradient_checkpointing_kwargs={'use_reentrant': True}: the default "
         "before transformers 5 (and what TRL / axolotl recipes pass)"),
    spec("hft_bf16_sdpa_gqa", config=GQA_CONFIG,
         why="(a) on the arch config's 4 KV heads: 5.17 calls SDPA with enable_gqa=True "
         "(no repeat_kv), which memsim does not model (expected over by the repeated K/V)"),
]


# Session 10 (docs/gpu-next-session.md item 3, docs/fsdp2.md "Accelerate's FSDP2 bf16
# path"): FSDP2 with the loss inside the model confirmed blind on another shape, and HF
# Trainer's full fine-tuning under FSDP2 with Accelerate >= 1.8's bf16 policy. Not in the
# default selection (the measured runs above keep their group): --s10 selects these, written
# to OUT_DIR/hft_s10_runs.json; blind predictions tests/data/gpu/hft_s10_predictions.json
# (tools/gpu/predict_hft_s10.py).
S10_CONFIG = f"{DATA}/configs/qwen2_l6_d1536_mha.json"
# Accelerate's MixedPrecisionPolicy for mixed_precision "bf16" with fsdp_version 2
# (huggingface/accelerate 16cb6eb8, src/accelerate/utils/dataclasses.py
# FullyShardedDataParallelPlugin.set_mixed_precision: param_dtype = reduce_dtype =
# output_dtype = the mixed-precision dtype, when the plugin has no policy yet).
ACCELERATE_BF16 = dict(param_dtype="bf16", reduce_dtype="bf16", output_dtype="bf16")


def spec_s10(name, mp=None, **kw):
    """A session-10 run: spec() plus its own batch / sequence (kw batch, seq) and
    Accelerate's MixedPrecisionPolicy (mp: dtype names, None: no policy)."""
    batch, seq = kw.pop("batch", BATCH), kw.pop("seq", SEQ)
    return dict(spec(name, **kw), batch=batch, seq=seq, fsdp_mp=mp, s10=True)


# In the order of their value to memsim (a budget cut drops the last).
RUNS_S10 = [
    spec_s10("hft_lora_fsdp2_l6_d1536_w4", config=S10_CONFIG, autocast="none", lora=True,
             fsdp2_world=4, opt_impl="foreach", batch=2, seq=2048, est=15.0,
             why="(d) at another shape, blind: PEFT LoRA under FSDP2 (each decoder layer, then "
             "the root) on a fake world of 4, 6 layers, hidden 1536, 12 heads (head dim 128), "
             "batch 2 x 2048, fp32, the loss in the model's forward (the root's pre-backward at "
             "the loss's backward: docs/fsdp2.md \"The root's hooks and where the loss is "
             "computed\")"),
    spec_s10("hft_full_fsdp2_bf16_w8", autocast="none", fsdp2_world=8, opt_impl="foreach",
             mp=ACCELERATE_BF16, est=14.0,
             why="full fine-tuning as HF Trainer(bf16=True) with fsdp_version 2 runs it on "
             "Accelerate >= 1.8: fp32 parameters sharded by fully_shard (each decoder layer, "
             "then the root, Accelerate <= 1.13's grouping) with MixedPrecisionPolicy("
             "param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16), no autocast "
             "(_prepare_fsdp2 never calls prepare_model), foreach AdamW on the fp32 shards"),
    spec_s10("hft_full_fsdp2_bf16_gc_w8", autocast="none", fsdp2_world=8, opt_impl="foreach",
             mp=ACCELERATE_BF16, gc=True, est=14.0,
             why="the previous run with gradient_checkpointing=True (model."
             "gradient_checkpointing_enable(), 5.17's default kwargs): the shipped "
             "qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.8 scenario's configuration"),
    spec_s10("hft_full_fsdp2_bf16_w8_accelerate", autocast="none", fsdp2_world=8,
             opt_impl="foreach", mp=ACCELERATE_BF16, est=16.0, timeout=45.0,
             why="hft_full_fsdp2_bf16_w8 through the installed Accelerate itself: "
             "Accelerator(mixed_precision='bf16', fsdp_plugin=FullyShardedDataParallelPlugin("
             "fsdp_version=2, transformer_based_wrap)).prepare(model, optimizer) on the fake "
             "process group (initialised first, so accelerate reuses it), accelerator.backward; "
             "records the policy and the FSDP2 modules it built (1.14+ also shards the "
             "embedding and [final norm, lm_head] as groups: PR #4015, memsim's "
             "parallel.accelerate_version since wt/accel114)"),
]
for _sp in RUNS_S10:
    _sp["accelerate_real"] = _sp["name"].endswith("_accelerate")
    # Accelerate 1.14+'s grouping: parallel.accelerate_version (its scenario and prediction
    # come from tools/gpu/predict_hft_s10_accelerate.py, made after the run was prepared).


def estimate(sp):
    return sp["est"]


# --------------------------------------------------------------------------- helpers
stats = gpu_common.memory_stats  # the common keys (gpu_common.STEP_STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from model, PEFT, loop, checkpoint, FSDP and optimizer code
    (at most 6)."""
    return gpu_common.trim_frames(
        snapshot, ("modeling_", "peft/", "measure_hft", "checkpoint", "_fully_shard", "optim",
                   "sdpa_attention", "loss_utils"), 6)


def read_config(path):
    with open(os.path.join(REPO, path)) as f:
        return json.load(f)


def versions():
    """The installed packages' versions, read from their metadata (no import: a child
    imports what its run needs, the parent nothing)."""
    import importlib.metadata as md
    out = {}
    for mod in ("torch", "transformers", "peft", "accelerate"):
        try:
            out[mod] = md.version(mod)
        except Exception as e:  # absent here (the CPU dry run)
            out[mod] = f"unavailable: {type(e).__name__}"
    return out


def trainer_default_optim():
    """The default of TrainingArguments.optim in the installed transformers (5.x:
    adamw_torch_fused with torch >= 2.8), read from the dataclass field: making a
    TrainingArguments would set up accelerate's state (and CUDA) inside the run."""
    try:
        from transformers import TrainingArguments
        d = TrainingArguments.__dataclass_fields__["optim"].default
        return str(getattr(d, "value", d))
    except Exception as e:
        return f"unknown: {type(e).__name__}: {e}"[:300]


def param_groups(model):
    """Trainer.create_optimizer's groups: decay = every parameter except biases and the
    norm layers' weights (get_decay_parameter_names: not in ALL_LAYERNORM_LAYERS, name
    without "bias"), weight_decay 0.0 (Trainer's default) on both; only parameters that
    require grad."""
    import torch
    norm_types = tuple(t for t in (torch.nn.LayerNorm, getattr(torch.nn, "RMSNorm", None))
                       if t is not None)
    no_decay = set()
    for mname, mod in model.named_modules():
        is_norm = isinstance(mod, norm_types) or type(mod).__name__.endswith("RMSNorm")
        for pname, _ in mod.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if is_norm or "bias" in pname:
                no_decay.add(full)
    decay, nodecay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (nodecay if n in no_decay else decay).append(p)
    return [dict(params=decay, weight_decay=0.0), dict(params=nodecay, weight_decay=0.0)], \
        (len(decay), len(nodecay))


def make_optimizer(torch, sp, model):
    groups, counts = param_groups(model)
    kw = {"fused": True} if sp["opt_impl"] == "fused" else {"foreach": True}
    if not torch.cuda.is_available():
        kw = {}  # torch 1.13 CPU: no fused AdamW; the groups are what the dry run checks
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=5e-5, **kw), counts


def checkpoint_facts(model):
    """What gradient_checkpointing_enable() really set on the decoder layers."""
    facts = set()
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False):
            f = getattr(m, "_gradient_checkpointing_func", None)
            kw = dict(getattr(f, "keywords", {}) or {})
            facts.add(json.dumps({k: (v if isinstance(v, (bool, int, float, str, type(None)))
                                      else repr(v)) for k, v in kw.items()}, sort_keys=True))
    return [json.loads(x) for x in sorted(facts)]


def autograd_node_counts(loss):
    """Node type -> count of the graph behind the loss, for the nodes that tell how the
    step was checkpointed: a reentrant checkpoint is one CheckpointFunctionBackward per
    checkpointed call (non-reentrant leaves ordinary nodes)."""
    # The Python objects are kept while walking: an id is then never reused for another
    # node (the wrappers of one node are one object while it is referenced).
    seen, stack, counts = {}, [loss.grad_fn], {}
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        name = type(fn).__name__
        if "Checkpoint" in name or "ToCopy" in name or "Sdpa" in name or "Attention" in name:
            counts[name] = counts.get(name, 0) + 1
        stack.extend(f for f, _ in fn.next_functions)
    counts["nodes"] = len(seen)
    seen.clear()
    return counts


def count_checkpointed(model):
    return sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))


def sdpa_kernels(torch, sp, cfg, device):
    """Which fused SDPA kernels accept the run's q/k/v (the bf16 casts under autocast)."""
    out = {}
    try:
        from torch.backends.cuda import (SDPAParams, can_use_efficient_attention,
                                         can_use_flash_attention)
        dt = torch.bfloat16 if sp["autocast"] == "bf16" else torch.float32
        H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg["hidden_size"] // H
        q = torch.empty(sp["batch"], H, sp["seq"], hd, device=device, dtype=dt)
        k = torch.empty(sp["batch"], KV, sp["seq"], hd, device=device, dtype=dt)
        gqa = KV != H
        try:
            params = SDPAParams(q, k, k, None, 0.0, True, gqa)
        except TypeError:  # before enable_gqa was a parameter
            params = SDPAParams(q, k, k, None, 0.0, True)
        out["flash"] = bool(can_use_flash_attention(params, False))
        out["efficient"] = bool(can_use_efficient_attention(params, False))
        del q, k
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


class Skip(Exception):
    """What this machine cannot run (the dry run records it)."""


def fsdp2_api(torch):
    try:
        from torch.distributed.fsdp import fully_shard
    except Exception:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except Exception as e:
            return None, f"torch {torch.__version__} has no fully_shard (FSDP2): {e!r}"[:300]
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: F401 (the s10 runs)
    except Exception:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy  # noqa: F401
        except Exception as e:
            return None, f"torch {torch.__version__} has no MixedPrecisionPolicy: {e!r}"[:300]
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except Exception as e:
        return None, f"torch {torch.__version__} has no fake process group / device mesh ({e})"
    return (fully_shard, init_device_mesh, FakeStore), None


def mp_policy(torch, mp):
    """fully_shard's keywords for the run's policy (mp: dtype names, or None: none)."""
    if not mp:
        return {}
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except Exception:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    return {"mp_policy": MixedPrecisionPolicy(**{k: dt[v] for k, v in mp.items()})}


def accelerate_facts():
    """What the installed Accelerate would build for HF Trainer's bf16=True with
    fsdp_version 2, read from its source (no Accelerator is made: it would set up its own
    state and process group): the policy set_mixed_precision makes, whether prepare sends
    an FSDP2 model to _prepare_fsdp2 (no autocast wrapper), and whether fsdp2_prepare_model
    also shards the embedding and [final norm, lm_head] as groups of their own
    (huggingface/accelerate PR #4015, 60b5c258: a grouping memsim does not model; this run
    uses each decoder layer, then the root)."""
    import inspect
    out = {}
    try:
        import accelerate
        out["version"] = accelerate.__version__
        from accelerate.utils import dataclasses as adc
        from accelerate.utils import fsdp_utils
        from accelerate import accelerator as acc
        src = inspect.getsource(adc.FullyShardedDataParallelPlugin.set_mixed_precision)
        out["set_mixed_precision_output_dtype"] = "output_dtype" in src
        src = inspect.getsource(fsdp_utils.fsdp2_prepare_model)
        out["fsdp2_shards_embedding_and_tail"] = ("get_input_embeddings" in src
                                                  and "_find_final_norm" in src)
        out["fsdp2_upcasts_params_to_fp32"] = "torch.float32" in src
        out["prepare_has__prepare_fsdp2"] = hasattr(acc.Accelerator, "_prepare_fsdp2")
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def fsdp_groups(model):
    """Every FSDPModule of the model: its module path and class, its parameter group's
    parameters (FSDPParam._param_fqn once the root's lazy init has run, else the owning
    module's class and parameter name), whether it reshards after forward
    (FSDPParamGroup.post_forward_mesh_info is None when it does not) and its policy; an
    error is recorded per module, never raised."""
    groups = []
    for name, mod in model.named_modules():
        st = getattr(mod, "_get_fsdp_state", None)
        if st is None:
            continue
        try:
            pg = st()._fsdp_param_group
            params = []
            for fp in (pg.fsdp_params if pg is not None else []):
                fqn = getattr(fp, "_param_fqn", None)
                if fqn is None:
                    mi = getattr(fp, "_module_info", None)
                    fqn = (f"{type(mi.module).__name__}.{mi.param_name}" if mi is not None
                           else "?")
                params.append(fqn)
            groups.append(dict(
                module=name or "<root>", cls=type(mod).__name__, params=params,
                reshard_after_forward=(getattr(pg, "post_forward_mesh_info", None) is not None)
                if pg is not None else None,
                mp_policy=repr(getattr(pg, "mp_policy", None))))
        except Exception as e:
            groups.append(dict(module=name or "<root>", error=f"{type(e).__name__}: {e}"[:200]))
    return groups


def accelerate_prepare(torch, sp, model, opt, result):
    """HF Trainer's FSDP2 preparation through the installed Accelerate: the fake process
    group is already initialised, so PartialState does not make one (huggingface/accelerate
    16cb6eb8 src/accelerate/state.py: init_process_group only `if not
    torch.distributed.is_initialized()`) and takes the world size from it; no
    parallelism_config, so fully_shard gets mesh=None (its default mesh over the default
    group). Records the policy and which modules became FSDPModules, with their
    reshard_after_forward."""
    world = str(sp["fsdp2_world"])
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=world, LOCAL_WORLD_SIZE=world,
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            auto_wrap_policy="transformer_based_wrap")
    accel = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
    model, opt = accel.prepare(model, opt)
    built = result["accelerate_built"] = {}
    built["distributed_type"] = str(accel.distributed_type)
    built["num_processes"] = accel.num_processes
    built["mixed_precision"] = accel.mixed_precision
    built["mixed_precision_policy"] = repr(accel.state.fsdp_plugin.mixed_precision_policy)
    built["fsdp_modules"] = fsdp_groups(model)  # again after the run (the FQNs set then)
    built["forward_is_wrapped"] = getattr(model.forward, "__wrapped__", None) is not None
    result["shards"] = {n: list((p.to_local() if hasattr(p, "to_local") else p).shape)
                        for n, p in model.named_parameters() if p.requires_grad}
    return accel, model, opt


def decoder_layers(model):
    """The decoder layers of a (PEFT-wrapped) causal LM."""
    base = model
    if hasattr(base, "get_base_model"):
        base = base.get_base_model()
    return base.model.layers


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, versions=versions(), device=str(device), dry_run=not cuda)
    marks = result["marks"] = {}

    def finish():
        gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result, default=str)
        return result

    cfg = read_config(sp["hf_config"])
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except Exception as e:
        if cuda:
            raise
        # What the CPU can check without transformers: the optimizer's groups on a stand-in.
        tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        _, counts = make_optimizer(torch, sp, tiny)
        result["dry_run_param_groups"] = dict(decay=counts[0], no_decay=counts[1])
        if sp["fsdp2_world"]:
            result["dry_run_fsdp2"] = fsdp2_api(torch)[1] or "available"
        result["skipped"] = (f"dry run: transformers cannot be imported here "
                             f"({type(e).__name__}: {e}); the model, PEFT and the step need it")
        print(result["skipped"], file=sys.stderr, flush=True)
        return finish()
    peft = None
    if sp["lora"]:
        try:
            import peft
        except Exception as e:
            if cuda:
                raise
            result["skipped"] = f"dry run: peft cannot be imported ({e})"
            return finish()
    api = None
    if sp["fsdp2_world"]:
        api, missing = fsdp2_api(torch)
        if api is None:
            if cuda:
                raise RuntimeError(f"cannot measure FSDP2: {missing}")
            result["skipped"] = f"dry run: {missing}"
            return finish()
    result["trainer_default_optim"] = trainer_default_optim()
    if not cuda:  # dry run: the same code on a tiny model
        cfg.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=4 if cfg["num_key_value_heads"] == 16 else 2,
                   intermediate_size=172, vocab_size=512, max_position_embeddings=64)
        sp = dict(sp, batch=2, seq=32)
    for k in ("torch_dtype", "dtype"):
        cfg.pop(k, None)
    cfg["use_cache"] = False
    mesh = None
    if cuda:
        torch.cuda.set_device(0)
        torch.cuda.init()
        result["gpu"] = torch.cuda.get_device_name()
        result["mem_get_info_at_init"] = list(torch.cuda.mem_get_info())
    if api is not None:
        import torch.distributed as dist
        fully_shard, init_device_mesh, FakeStore = api
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=sp["fsdp2_world"])
        mesh = init_device_mesh(device.type, (sp["fsdp2_world"],), mesh_dim_names=("dp_shard",))
        result["mesh"] = dict(shape=list(mesh.shape), backend=dist.get_backend())
    if cuda:
        gpu_common.fresh_history(torch, marks)  # the whole run's peaks start here
    torch.manual_seed(0)
    config = CONFIG_MAPPING[cfg["model_type"]].from_dict(cfg)
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **kw)
    model = model.to(device)  # no-op when built on the device
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    marks["after_model"] = stats(torch, cuda)
    if sp["gc"]:
        if sp["gc_kwargs"] is None:
            model.gradient_checkpointing_enable()  # transformers' own default kwargs
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(sp["gc_kwargs"]))
    if sp["lora"]:
        lcfg = peft.LoraConfig(task_type="CAUSAL_LM", bias="none", **sp["lora"])
        model = peft.get_peft_model(model, lcfg)
        emb = model.get_input_embeddings()
        result["input_embedding_forward_hooks"] = [getattr(h, "__name__", repr(h))
                                                   for h in emb._forward_hooks.values()]
        result["adapter_dtypes"] = sorted({str(p.dtype) for n, p in model.named_parameters()
                                           if "lora_" in n})
    result["checkpointing"] = dict(layers=count_checkpointed(model), kwargs=checkpoint_facts(model))
    result["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    accel = None
    if api is not None and sp.get("accelerate_real"):
        model.train()
        opt, counts = make_optimizer(torch, sp, model)  # Trainer: create_optimizer, then prepare
        result["param_groups"] = dict(decay=counts[0], no_decay=counts[1])
        accel, model, opt = accelerate_prepare(torch, sp, model, opt, result)
    elif api is not None:
        # torchtitan's apply_fsdp order: each decoder layer, then the root. The root is the
        # transformers model under PEFT's wrappers (embeddings, final norm, LM head), so
        # that fully_shard never swaps the class of PeftModel (its __getattr__ forwarding).
        mp = mp_policy(torch, sp.get("fsdp_mp"))  # {} for the runs before session 10
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, **mp)
        fully_shard(model.get_base_model() if hasattr(model, "get_base_model") else model,
                    mesh=mesh, **mp)
        if mp:
            result["mp_policy"] = repr(mp["mp_policy"])
        result["shards"] = {n: list((p.to_local() if hasattr(p, "to_local") else p).shape)
                            for n, p in model.named_parameters() if p.requires_grad}
    if accel is None:
        model.train()
        opt, counts = make_optimizer(torch, sp, model)
        result["param_groups"] = dict(decay=counts[0], no_decay=counts[1])
    marks["after_setup"] = stats(torch, cuda)
    ids = torch.randint(0, cfg["vocab_size"], (sp["batch"], sp["seq"]), device=device)
    labels = torch.randint(0, cfg["vocab_size"], (sp["batch"], sp["seq"]), device=device)
    if sp["autocast"] == "bf16":
        region = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        region = contextlib.nullcontext

    def compute_loss():
        """Trainer.compute_loss: the outputs are its locals; it returns the loss."""
        with region():
            outputs = model(input_ids=ids, labels=labels, use_cache=False)
            loss = outputs.loss
        return loss

    def training_step(measured):
        loss = compute_loss()  # the outputs (logits) are gone here
        if measured:  # (memsim's forward_end mark is before the loss: no counterpart)
            marks["after_compute_loss"] = stats(torch, cuda)
        else:  # the warm-up: which checkpoint ran (reentrant: CheckpointFunctionBackward)
            result["autograd_nodes"] = autograd_node_counts(loss)
        if accel is not None:
            accel.backward(loss)  # Trainer: self.accelerator.backward(loss)
        else:
            loss.backward()
        return loss.detach()

    step_seconds = []
    last = None
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        t = time.time()
        if measured:
            marks["measured_step_begin"] = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        last = training_step(measured)
        if measured:
            marks["backward_end"] = stats(torch, cuda)
        opt.step()
        model.zero_grad(set_to_none=True)
        if measured:
            marks["optimizer_end"] = stats(torch, cuda)
        if cuda:
            torch.cuda.synchronize()
        step_seconds.append(round(time.time() - t, 3))
    result["loss"] = float(last)
    result["step_seconds"] = step_seconds
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, marks["measured_step_begin"])
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
        # After everything is read: its probe tensors must not shape the measured cache.
        result["sdpa_kernels"] = sdpa_kernels(torch, sp, cfg, device)
    result["torch_version"] = torch.__version__
    result["transformers_version"] = transformers.__version__
    if peft is not None:
        result["peft_version"] = peft.__version__
    if sp.get("fsdp_mp"):  # after everything is measured (imports only, no CUDA)
        result["accelerate"] = accelerate_facts()
        try:
            result["fsdp_modules_after_run"] = fsdp_groups(model)
        except Exception as e:
            result["fsdp_modules_after_run"] = f"{type(e).__name__}: {e}"[:300]
    if api is not None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    return finish()


# --------------------------------------------------------------------------- self-test
def self_test(out_dir):
    """Runs every configuration's code on the CPU with stand-ins of transformers and peft
    (tools/gpu/hft_fakes.py) and checks what the script records: the checkpointing it reads
    back, PEFT's hook, the optimizer's groups, the adapters' gradients, the scenario file.
    FSDP2 runs stop where this torch has no fully_shard (recorded). Exits 1 on a mismatch."""
    import torch
    import hft_fakes
    hft_fakes.install()
    os.makedirs(out_dir, exist_ok=True)
    bad = []
    for sp in RUNS + RUNS_S10:
        try:
            r = run_one(sp, out_dir)
        except Exception:
            bad.append(f"{sp['name']}: {traceback.format_exc()[-600:]}")
            continue
        if sp["scenario"] and not os.path.exists(os.path.join(REPO, sp["scenario"])):
            bad.append(f"{sp['name']}: no scenario {sp['scenario']} (tools/gpu/predict_hft.py)")
        if sp["fsdp2_world"] and "skipped" in r:
            print(f"{sp['name']:28s} {r['skipped']}")
            continue
        ck = r.get("checkpointing", {})
        want_re = (sp["gc_kwargs"] or {}).get("use_reentrant", False)
        nodes = r.get("autograd_nodes", {})
        reentrant_nodes = sum(v for k, v in nodes.items() if "CheckpointFunction" in k)
        if sp["gc"]:
            if ck.get("layers") != 2 or ck.get("kwargs") != [{"use_reentrant": want_re}]:
                bad.append(f"{sp['name']}: checkpointing read back as {ck}")
            if (reentrant_nodes > 0) != want_re:
                bad.append(f"{sp['name']}: {reentrant_nodes} reentrant nodes, wanted reentrant {want_re}")
        elif ck.get("layers") != 0:
            bad.append(f"{sp['name']}: checkpointing on: {ck}")
        hooks = r.get("input_embedding_forward_hooks")
        if sp["lora"] and sp["gc"] and hooks != ["make_inputs_require_grads"]:
            bad.append(f"{sp['name']}: embedding hooks {hooks}")
        groups = r.get("param_groups", {})
        want_groups = (r.get("trainable_parameters"), None)
        if sp["lora"] and (groups.get("no_decay") != 0 or groups.get("decay") != 8):
            bad.append(f"{sp['name']}: LoRA param groups {groups} (want 8 adapters, no biases)")
        if not sp["lora"] and groups.get("no_decay", 0) == 0:
            bad.append(f"{sp['name']}: no no-decay group {groups}")
        if not (r.get("loss") or 0) > 0:
            bad.append(f"{sp['name']}: loss {r.get('loss')}")
        print(f"{sp['name']:28s} checkpointing {ck}, reentrant nodes {reentrant_nodes}, groups "
              f"{groups}, hooks {hooks}, trainable {r.get('trainable_parameters')}, optim default "
              f"{r.get('trainer_default_optim')}, loss {r.get('loss'):.3f}")
        del want_groups
    print("self-test:", "FAILED " + "; ".join(bad) if bad else "every run as intended")
    return 1 if bad else 0


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=90.0)
    ap.add_argument("--self-test", action="store_true",
                    help="run every configuration on the CPU with stand-ins of transformers / peft")
    ap.add_argument("--s10", action="store_true",
                    help="the session-10 runs (RUNS_S10) only, into OUT_DIR/hft_s10_runs.json")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test(a.out_dir))
    if gpu_common.run_one_if_child(a, RUNS + RUNS_S10, run_one):
        return
    chosen = gpu_common.select_by_name(RUNS_S10 if a.s10 else RUNS, a.only)
    total = sum(estimate(sp) for sp in chosen)
    if a.list:
        for sp in chosen:
            print(f"{sp['name']:28s} {estimate(sp):5.1f} s (timeout {sp['timeout']:.0f} s)  {sp['why']}")
        print(f"{len(chosen)} configurations: about {total:.0f} s of runs on an H200 "
              f"(estimate, each a fresh Python with torch + transformers imported)", flush=True)
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)

    def report(sp, r):
        if "skipped" in r:
            print(f"{sp['name']:28s} {r['skipped']} ({r['process_seconds']:.1f} s)", flush=True)
            return
        print(f"{sp['name']:28s} measured step: alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB; checkpointing "
              f"{r.get('checkpointing')}; steps {r.get('step_seconds')} s "
              f"({r['process_seconds']:.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(  # no run outlives the budget
        os.path.abspath(__file__), a.out_dir, a.budget, t_start, per_run=a.per_run,
        min_left=lambda sp: max(min(estimate(sp), 8.0), estimate(sp) * 0.75))
    results, failures = gpu_common.run_children(chosen, loop, report)
    try:
        vers = versions()
    except Exception:
        vers = {}
    if a.s10:
        gpu_common.finish_parent(
            a.out_dir, "hft_s10", "tools/gpu/measure_hft.py --s10: FSDP2 with the loss in the "
            "model at another shape (LoRA), HF Trainer's full fine-tuning under FSDP2 with "
            "Accelerate >= 1.8's bf16 MixedPrecisionPolicy, on transformers' Qwen2",
            vers, t_start, results, failures)
        return
    gpu_common.finish_parent(
        a.out_dir, "hft", "tools/gpu/measure_hft.py: HF Trainer / PEFT defaults on "
        "transformers' Qwen2 (issue #16 item 5)", vers, t_start, results, failures)


if __name__ == "__main__":
    gpu_common.run_main(main)
