#!/usr/bin/env python3
"""Measures transformers 5.17's own DeepSeek-V3 / DeepSeek-V2 models and PEFT LoRA on MoE
models on a CUDA GPU with a forced routing (issue #15): the compositions memsim modelled
from torch 1.13 CPU stand-ins only (docs/deepseek.md "Under autocast", "PEFT LoRA on the
latent attention"; docs/moe.md "LoRA on the routed experts"), none of which ran on a GPU
with the real code before. The sibling of tools/gpu/measure_moe.py (pure bf16) and
measure_moe_autocast.py (autocast), at their shapes and with their routing forcing; a file
of its own so that runs added to those two do not collide with these.

    python3 tools/gpu/measure_moe_s10.py OUTDIR [--budget SECONDS] [--per-run SECONDS]
                                         [--only NAME|GLOB...] [--list]

Each run is its own Python process (a fresh caching allocator) with a per-run timeout,
torch.cuda.memory._record_memory_history on from before the model is built, and memsim's
default loop (sim/step/training_script.h): the model built on the GPU by
AutoModelForCausalLM.from_config(config, dtype=fp32|bf16, attn_implementation="eager",
experts_implementation="eager"), optionally PEFT's get_peft_model (LoraConfig with
target_modules and / or target_parameters), optionally HF gradient checkpointing
(`gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": R})` on
the transformers model, after get_peft_model, as HF Trainer calls it), AdamW (foreach) over
the parameters that require grad, the batch (ids, labels int64); one warm-up step, then
the measured step

    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16) (autocast runs only):
        out = model(input_ids=ids, labels=labels, use_cache=False); loss = out.loss
    loss.backward(); opt.step()

with `out` and `loss` bound at loop level (memsim's `step.keep_output: true`).

What the runs check that no GPU run did (SPECS, in value order; a budget cut drops the last):
 1. DeepSeek-V3 (tests/data/gpu/moe/configs/deepseek_v3.json, the config of the measured
    pure-bf16 runs) under bf16 autocast over fp32 weights;
 2. DeepSeek-V2 (V2-Lite's shape: no q_lora, kv_lora, greedy top-k, a dense first layer,
    two shared experts; tests/data/gpu/moe_s10/configs/deepseek_v2_lite_small.json) under
    bf16 autocast;
 3. the same V2 in pure bf16 (V3 in pure bf16 was measured on 2026-11-27:
    tests/data/gpu/moe/moe_runs.json, within 0.004% allocated);
 4. PEFT LoRA r 16 on V2's latent attention (q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj),
    bf16 weights, PEFT's fp32 adapters;
 5. Qwen3-MoE (tests/data/gpu/moe/configs/qwen3_moe.json) with PEFT target_parameters LoRA
    r 16 on mlp.experts.gate_up_proj and mlp.experts.down_proj, bf16 weights, HF gradient
    checkpointing non-reentrant, then reentrant;
 6. the same under bf16 autocast over fp32 weights (non-reentrant).
 7. DeepSeek-V3 under autocast with worst-case routing (last: the budget may drop it).

Routing is forced as in measure_moe.py: the module-level torch.topk (and, in case a router
calls the method, torch.Tensor.topk: counted apart, `router_method_calls_forced`) is wrapped
so that its (T, K) indices are overwritten in place through `.data` with
tools/fixtures/moe_models.forced_indices. Only a top-k over the experts is overwritten: the
output must be (T, K) and the input's last dimension the number of routed experts (so a
group choice with topk_group = top_k is left alone).
transformers 5.17's routers (the source of the 2026-11-27 H200 run, recorded in
tests/data/gpu/moe/moe_runs.json "code"): DeepSeek-V3's DeepseekV3TopkRouter.forward runs
`scores_for_choice.view(-1, n_group, E // n_group).topk(2, dim=-1)` (over E // n_group: not
overwritten), `torch.topk(group_scores, k=topk_group)` (input (T, n_group): not overwritten),
then `torch.topk(scores_for_choice, k=top_k)` (input (T, E): overwritten); the weights are
`scores.gather(1, topk_indices)` of the forced indices. DeepSeek-V2's router in 5.17
(docs/deepseek.md "Router") runs greedy `torch.topk(scores, K, sorted=False)` on (T, E).
Qwen3-MoE's router `torch.topk(router_probs, top_k)` on (T, E). A checkpointed layer's
re-run routes the same way.

The experts implementation: transformers 5.x's PreTrainedModel.get_correct_experts_implementation
(huggingface/transformers 040ba146 src/transformers/modeling_utils.py) picks "grouped_mm"
when none is requested and `_grouped_mm_can_dispatch()` passes, "eager" otherwise; these runs
request "eager" (memsim refuses grouped_mm under autocast and with target_parameters) and
record what the default would have been (`default_experts_implementation`).

PEFT: its version is recorded at run time (peft 0.21.0 was on the image on 2026-11-27,
tests/data/gpu/moe_autocast/moe_autocast_runs.json); `target_parameters` needs peft >= 0.17
(huggingface/peft f3b97c37): a LoraConfig without the field is refused by name (the run
fails with that message, the next runs). The adapters' dtypes, the trainable count and the
source of ParamWrapper.forward / get_delta_weight that ran are recorded.

HF gradient checkpointing in 5.17 (the source recorded by the 2026-11-27 run,
tests/data/gpu/moe_autocast/moe_autocast_runs.json): `gradient_checkpointing_kwargs` None
gives `{"use_reentrant": False}`, and a model whose main input is input_ids always gets
`enable_input_require_grads()` (the embeddings' forward hook): memsim's
`lora.input_require_grads: true` in both modes. The checkpoint keywords that ran and the
number of hooks are recorded.

Writes OUTDIR/moe_s10_runs.json (each run's spec, versions, memory_stats at the marks, the
measured step's max_memory_allocated / reserved, the whole run's peaks, the parameter and
trainable counts, the code that ran, the checkpoint keywords, the tokens per expert;
failures with their stderr) and OUTDIR/moe_s10_snapshots.tar.xz (torch.cuda.memory._snapshot()
per run, frames stripped, under 8 MiB). A failing run is recorded and the next one runs; no
run starts after --budget seconds; the script never raises out.

Without CUDA (a dry run here: Debian's torch 1.13, no transformers, no peft) each run's loop
executes on tools/fixtures/moe_models' stand-in at a tiny size (under CPU autocast where the
run has autocast), so the loop, the routing hook, the trainable-parameter optimizer and the
recording are exercised; transformers, PEFT and HF checkpointing are recorded as skipped by
name ("dry_runs" in the JSON, never "results").

memsim's scenario of each run is tests/data/gpu/moe_s10/NAME.yaml and its blind predictions
tests/data/gpu/moe_s10_predictions.json (tools/gpu/predict_moe_s10.py), committed before
any measurement.
"""
import argparse
import contextlib
import importlib.util
import inspect
import os
import sys
import time

import gpu_common
import measure_moe as mm  # shapes, routings, forcing, stats, frames, packing
import measure_moe_autocast as mac  # build_standin, checkpoint_keywords

TOPIC = "moe_s10"
FAKES_ENV = "MEMSIM_MOE_S10_FAKES"  # set by --self-test for its children
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
S10_CONFIGS = os.path.join(ROOT, "tests", "data", "gpu", "moe_s10", "configs")
DS3 = os.path.join(mm.CONFIGS, "deepseek_v3.json")
DS2 = os.path.join(S10_CONFIGS, "deepseek_v2_lite_small.json")
QWEN3 = os.path.join(mm.CONFIGS, "qwen3_moe.json")

MLA_TARGETS = ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def spec(name, model_type, config, routing="balanced", params="fp32", autocast=None,
         lora=None, hf_ckpt=None, expert_d_ff=512, seconds=14.0):
    """hf_ckpt: None, "nonreentrant" or "reentrant"; lora: None or dict(r, alpha,
    target_modules, target_parameters)."""
    return dict(name=name, impl="transformers", model_type=model_type, routing=routing,
                counts=mm.ROUTINGS[routing], dtype=params, autocast=autocast, attention="eager",
                experts_impl="eager", lora=lora, hf_gradient_checkpointing=hf_ckpt,
                config=os.path.relpath(config, ROOT), cfg=dict(mm.SHAPE), experts=mm.E,
                top_k=mm.K, expert_d_ff=expert_d_ff, warmup=1, estimate=seconds)


def lora(target_modules=None, target_parameters=None, r=16, alpha=32):
    return dict(r=r, alpha=alpha, target_modules=target_modules, target_parameters=target_parameters)


# In value order (a budget cut drops the last). Shapes: measure_moe.SHAPE (b 16 x s 256,
# d 1024, 16 heads, vocab 4096, 8 experts, top 2); DeepSeek's layer count and expert size
# from its config.json (3 layers, the first dense, experts of 512), Qwen3-MoE's (2 layers,
# experts of 768).
SPECS = [
    spec("s10_ds3_autocast_balanced", "deepseek_v3", DS3, autocast="bf16", seconds=15.0),
    spec("s10_ds2lite_autocast_balanced", "deepseek_v2", DS2, autocast="bf16", seconds=15.0),
    spec("s10_ds2lite_bf16_balanced", "deepseek_v2", DS2, params="bf16", seconds=13.0),
    spec("s10_ds2lite_bf16_lora_mla", "deepseek_v2", DS2, params="bf16",
         lora=lora(target_modules=MLA_TARGETS), seconds=14.0),
    spec("s10_qwen3_moe_bf16_tplora_hfckpt", "qwen3_moe", QWEN3, params="bf16",
         lora=lora(target_parameters=EXPERT_PARAMS), hf_ckpt="nonreentrant", expert_d_ff=768,
         seconds=14.0),
    spec("s10_qwen3_moe_bf16_tplora_hfckpt_reentrant", "qwen3_moe", QWEN3, params="bf16",
         lora=lora(target_parameters=EXPERT_PARAMS), hf_ckpt="reentrant", expert_d_ff=768,
         seconds=14.0),
    spec("s10_qwen3_moe_autocast_tplora_hfckpt", "qwen3_moe", QWEN3, autocast="bf16",
         lora=lora(target_parameters=EXPERT_PARAMS), hf_ckpt="nonreentrant", expert_d_ff=768,
         seconds=14.0),
    spec("s10_ds3_autocast_worst", "deepseek_v3", DS3, routing="worst", autocast="bf16",
         seconds=15.0),
]


# --------------------------------------------------------------------------- models
def build_transformers(torch, sp):
    import json
    import transformers
    with open(os.path.join(ROOT, sp["config"])) as f:
        d = json.load(f)
    dtype = torch.bfloat16 if sp["dtype"] == "bf16" else torch.float32
    return mm.from_config(transformers, mm.config_from_dict(d), sp["attention"], sp["experts_impl"],
                          dtype=dtype)


def default_experts_implementation(model):
    """What transformers would pick without the keyword (get_correct_experts_implementation(None))."""
    f = getattr(model, "get_correct_experts_implementation", None)
    if f is None:
        return "no get_correct_experts_implementation"
    try:
        return f(None)
    except Exception as e:  # noqa: BLE001
        return "error: " + repr(e)[:300]


def apply_peft(model, sp, result):
    """get_peft_model with the run's LoraConfig; refuses by name what this peft lacks."""
    import peft
    result["peft_version"] = peft.__version__
    lo = sp["lora"]
    fields = set(getattr(peft.LoraConfig, "__dataclass_fields__", {}))
    if lo["target_parameters"] and "target_parameters" not in fields:
        raise RuntimeError(f"peft {peft.__version__}: LoraConfig has no target_parameters "
                           "(needs peft >= 0.17): run refused")
    kw = dict(r=lo["r"], lora_alpha=lo["alpha"], lora_dropout=0.0, bias="none",
              task_type="CAUSAL_LM")
    if lo["target_modules"]:
        kw["target_modules"] = list(lo["target_modules"])
    elif "target_modules" in fields:
        kw["target_modules"] = []  # none: only the 3-D parameters (PEFT allows an empty list)
    if lo["target_parameters"]:
        kw["target_parameters"] = list(lo["target_parameters"])
    cfg = peft.LoraConfig(**kw)
    pm = peft.get_peft_model(model, cfg)
    result["lora_config"] = {k: (v if isinstance(v, (bool, int, float, str, type(None))) else repr(v))
                             for k, v in kw.items()}
    result["trainable_parameters"] = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    result["adapter_dtypes"] = sorted({str(p.dtype) for n, p in pm.named_parameters()
                                       if p.requires_grad})
    result["adapter_names"] = [n for n, p in pm.named_parameters() if p.requires_grad][:12]
    code = {}
    try:
        from peft.tuners.lora import layer as lora_layer
        pw = getattr(lora_layer, "ParamWrapper", None)
        if pw is not None:
            for fn in ("forward", "get_delta_weight", "_activate_lora"):
                if hasattr(pw, fn):
                    try:
                        code["ParamWrapper." + fn] = inspect.getsource(getattr(pw, fn))
                    except (OSError, TypeError):
                        code["ParamWrapper." + fn] = "?"
    except Exception as e:  # noqa: BLE001
        code["error"] = repr(e)[:300]
    result["peft_code"] = code
    wrappers = sorted({type(m).__name__ for m in pm.modules() if type(m).__module__.startswith("peft.")})
    result["peft_module_classes"] = wrappers
    return pm


def hf_checkpointing(tf_model, sp, result):
    """gradient_checkpointing_enable on the transformers model with the run's use_reentrant."""
    reentrant = sp["hf_gradient_checkpointing"] == "reentrant"
    tf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    kw, on = mac.checkpoint_keywords(tf_model)
    result["gradient_checkpointing_kwargs"] = kw
    result["checkpointed_modules"] = on
    emb = tf_model.get_input_embeddings()
    result["input_embedding_forward_hooks"] = len(getattr(emb, "_forward_hooks", {}))


# --------------------------------------------------------------------------- shared by measure_moe_fsdp2
def build_model(torch, sp, device, standin, skipped):
    """(model on the device, the stand-in's cfg or None): build_transformers, or without
    transformers (the dry run) measure_moe_autocast's stand-in as Qwen3-MoE, built under the
    run's parameter dtype as the default dtype (restored after) and on the device where this
    torch has the device context manager."""
    cfg = None
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    default_dtype = torch.get_default_dtype()
    if standin and sp["dtype"] == "bf16":
        torch.set_default_dtype(torch.bfloat16)
    try:
        with dev_ctx:
            if standin:
                model, cfg = mac.build_standin(torch, dict(sp, model_type="qwen3_moe"))
                skipped.append("transformers is not importable by " + sys.executable +
                               ": the loop ran on moe_models' stand-in (dry run)")
            else:
                model = build_transformers(torch, sp)
    finally:
        torch.set_default_dtype(default_dtype)
    return model.to(device), cfg


def adapt(model, tf_model, sp, result, skipped, have_peft, standin):
    """The run's PEFT LoRA (apply_peft) then HF gradient checkpointing (hf_checkpointing on
    the transformers model, after get_peft_model as HF Trainer calls it); what the dry run
    cannot do is added to `skipped` by name. Returns the model to train."""
    if sp["lora"]:
        if have_peft and not standin:
            model = apply_peft(model, sp, result)
        else:
            skipped.append("peft is not importable by " + sys.executable +
                           ": no adapters (dry run); every parameter trains")
    if sp["hf_gradient_checkpointing"]:
        if standin:
            skipped.append("gradient_checkpointing_enable is transformers' (dry run)")
        else:
            hf_checkpointing(tf_model, sp, result)
    return model


def install_forced_topk(torch, forced, experts, routed, routed_method, passed):
    """Wraps torch.topk / torch.Tensor.topk so that a (T, K) top-k over the experts (input's
    last dimension `experts`) gets `forced` as its indices, overwritten in place; each forced
    call is counted in `routed` (the function) or `routed_method` (the method), each other
    call's index shape goes to `passed`. Returns the function restoring both."""
    orig_topk, orig_tensor_topk = torch.topk, torch.Tensor.topk

    def force(x, i, calls):
        if tuple(i.shape) == tuple(forced.shape) and x is not None and x.shape[-1] == experts:
            i.data.copy_(forced)
            calls.append(1)
        else:
            passed.append(tuple(i.shape))

    def forced_topk(*args, **kwargs):
        v, i = orig_topk(*args, **kwargs)
        force(args[0] if args else kwargs.get("input"), i, routed)
        return v, i

    def forced_tensor_topk(self, *args, **kwargs):
        # A router that calls the method (none of the 5.17 routers read: see the docstring)
        # is forced the same way; DeepSeek-V3's per-group top-2 is not over the experts.
        v, i = orig_tensor_topk(self, *args, **kwargs)
        force(self, i, routed_method)
        return v, i

    torch.topk = forced_topk
    torch.Tensor.topk = forced_tensor_topk

    def restore():
        torch.topk = orig_topk
        torch.Tensor.topk = orig_tensor_topk
    return restore


def routing_facts(torch, result, forced, experts, routed, routed_method, passed):
    """What the forced routing did, into the run's record."""
    result["router_calls_forced"] = len(routed)
    result["router_method_calls_forced"] = len(routed_method)
    result["topk_calls_not_forced"] = sorted({str(s) for s in passed})
    result["tokens_per_expert"] = mm.tokens_per_expert(torch, forced, experts)


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    if os.environ.get(FAKES_ENV) == "1":  # --self-test: transformers and peft stand-ins
        import moe_s10_fakes
        moe_s10_fakes.install()
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dry = not cuda
    have_tf = importlib.util.find_spec("transformers") is not None
    have_peft = importlib.util.find_spec("peft") is not None
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=dry)
    if cuda:
        gpu_common.init_cuda(torch, result)
        gpu_common.record_history(torch)
    torch.manual_seed(0)
    standin = not have_tf
    if standin and cuda:
        raise RuntimeError("transformers is not importable by " + sys.executable)
    if sp["lora"] and cuda and not have_peft:
        raise RuntimeError("peft is not importable by " + sys.executable + ": run refused")
    skipped = []
    model, cfg = build_model(torch, sp, device, standin, skipped)
    tf_model = model
    if not standin:
        import transformers
        result["transformers_version"] = transformers.__version__
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["default_experts_implementation"] = default_experts_implementation(model)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["parameter_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    result["code"] = mm.code_of(model)
    for m in model.modules():  # DeepSeek-V2's block is DeepseekV2Moe (code_of looks for *MoE)
        if "block" not in result["code"] and type(m).__name__.endswith("Moe"):
            try:
                result["code"]["block"] = inspect.getsource(type(m).forward)
            except (OSError, TypeError):
                result["code"]["block"] = "?"
    model = adapt(model, tf_model, sp, result, skipped, have_peft, standin)
    if not standin:
        emb = tf_model.get_input_embeddings()
        result["input_embedding_forward_hooks"] = len(getattr(emb, "_forward_hooks", {}))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    result["optimizer_parameters"] = sum(p.numel() for p in trainable)
    # The forced routing, on the device before the measured step.
    forced = mm.forced_table(torch, sp, dry, device, model, standin)
    routed, routed_method, passed = [], [], []
    restore = None if standin else install_forced_topk(torch, forced, sp["experts"], routed,
                                                         routed_method, passed)
    result["marks"] = {"after_model": mm.stats(torch, cuda)}
    opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True if cuda else False)
    forward = mm.batch_forward(torch, sp, cfg, dry, device, standin)

    def region():
        if sp["autocast"]:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    t0 = time.time()
    try:
        out, loss, begin = mm.step_loop(torch, cuda, sp, model, opt, forward, result, result["marks"],
                                        region=region,
                                        logits_of=lambda o: o if standin else getattr(o, "logits", None))
    finally:
        if restore is not None:
            restore()
    if skipped:
        result["skipped"] = "; ".join(skipped)
    routing_facts(torch, result, forced, sp["experts"], routed, routed_method, passed)
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, begin)
        gpu_common.device_memory_at_end(torch, result, keep_info=False)
        gpu_common.dump_snapshot(torch, out_dir, sp["name"], mm.strip_frames)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


# --------------------------------------------------------------------------- self-test
def self_test(out_dir):
    """Every run on the CPU with transformers and peft replaced by tools/gpu/moe_s10_fakes.py,
    then checks what each run recorded: the forced routing reached the router's torch.topk,
    the default experts implementation, PEFT's adapters (fp32, the optimizer's parameters),
    HF checkpointing's use_reentrant, layers and input hook. Returns the exit status."""
    import json
    import subprocess
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, **{FAKES_ENV: "1"})
    p = subprocess.run([sys.executable, os.path.abspath(__file__), out_dir, "--budget", "100000",
                        "--per-run", "3000"], env=env, capture_output=True, text=True)
    print(p.stdout, end="")
    with open(os.path.join(out_dir, TOPIC + "_runs.json")) as f:
        doc = json.load(f)
    runs = {r["spec"]["name"]: r for r in doc.get("dry_runs", [])}
    bad = []
    for sp in SPECS:
        r = runs.get(sp["name"])
        if r is None:
            bad.append(f"{sp['name']}: no run ({doc['failures'].get(sp['name'], '?')[-300:]})")
            continue
        want = {"router_calls_forced>0": r.get("router_calls_forced", 0) > 0,
                "default_experts_implementation": r.get("default_experts_implementation") == "eager",
                "parameter_dtypes": r.get("parameter_dtypes") ==
                ["torch.bfloat16" if sp["dtype"] == "bf16" else "torch.float32"]
                or bool(sp["lora"]),
                "loss": r.get("loss") == r.get("loss")}
        if sp["lora"]:
            want.update({"peft_version": bool(r.get("peft_version")),
                         "trainable": r.get("trainable_parameters", 0) > 0 and
                         r.get("trainable_parameters") == r.get("optimizer_parameters"),
                         "adapter_dtypes": r.get("adapter_dtypes") == ["torch.float32"]})
        if sp["hf_gradient_checkpointing"]:
            kw = r.get("gradient_checkpointing_kwargs") or {}
            want.update({"use_reentrant": kw.get("use_reentrant") ==
                         (sp["hf_gradient_checkpointing"] == "reentrant"),
                         "checkpointed_modules": r.get("checkpointed_modules") == 2,
                         "input_hook": r.get("input_embedding_forward_hooks", 0) >= 1})
        bad += [f"{sp['name']}: {k}" for k, ok in want.items() if not ok]
    print("self-test:", "FAILED " + "; ".join(bad) if bad else f"every run as intended ({len(runs)} runs)")
    return 1 if bad or p.returncode != 0 else 0


# --------------------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=120.0, per_run=40.0)
    ap.add_argument("--self-test", action="store_true",
                    help="run every run on the CPU with transformers / peft stand-ins and check the records")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test(a.out_dir))
    if gpu_common.run_one_if_child(a, SPECS, run_one):
        return
    chosen = gpu_common.select_by_name(SPECS, a.only)
    if a.list:
        for s in chosen:
            lo = "-" if not s["lora"] else ("tp" if s["lora"]["target_parameters"] else "mla")
            print(f"{s['name']:44s} {s['model_type']:12s} {s['routing']:9s} {s['dtype']:5s} "
                  f"{s['autocast'] or '-':5s} lora {lo:4s} {s['hf_gradient_checkpointing'] or '-':12s} "
                  f"{s['estimate']:5.1f} s")
        print(f"{len(chosen)} runs, about {sum(s['estimate'] for s in chosen):.0f} s (estimate)")
        return
    os.makedirs(a.out_dir, exist_ok=True)
    t_start = time.time()
    versions = gpu_common.imported_versions()
    print(f"versions {versions}", flush=True)
    dry_runs = []

    accept = gpu_common.dry_run_accept(a.out_dir, dry_runs, t_start, 44)

    def report(sp, r):
        print(f"{sp['name']:44s} peak allocated {r.get('measured_step_peak_allocated')} reserved "
              f"{r.get('measured_step_peak_reserved')} forced {r.get('router_calls_forced')} "
              f"ckpt {r.get('gradient_checkpointing_kwargs')} peft {r.get('peft_version')} "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, min_left=lambda sp: 0.75 * sp["estimate"],
                                not_run="plain", failed_show=600, timeout_note="stderr",
                                error_show=400, process_facts=True)
    results, failures = gpu_common.run_children(chosen, loop, report, accept)
    out = {"versions": versions, "script": "tools/gpu/measure_moe_s10.py",
           "results": results, "failures": failures}
    if dry_runs:
        out["dry_runs"] = dry_runs
    gpu_common.write_json(os.path.join(a.out_dir, TOPIC + "_runs.json"), out, default=str)
    mm.pack_snapshots(a.out_dir, results, TOPIC + "_snapshots.tar.xz")
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s",
          flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
