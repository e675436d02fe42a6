#!/usr/bin/env python3
"""Measures transformers' own mixture-of-experts models under bf16 autocast over fp32
weights (HF Trainer's `bf16=True`) on a CUDA GPU, with a forced routing, for memsim's MoE
autocast model (docs/moe.md "Under autocast"; graph/models/decoder_moe.cpp
`expert_linear_autocast`; issue #15). The sibling of tools/gpu/measure_moe.py (the pure-bf16
runs), at its shapes and with its routing forcing.

    python3 tools/gpu/measure_moe_autocast.py OUTDIR [--budget SECONDS] [--per-run SECONDS]
                                              [--only NAME|GLOB...] [--list]

Each configuration runs in its own Python process (a fresh caching allocator) with a
per-run timeout, torch.cuda.memory._record_memory_history on from before the model is
built, and memsim's default loop (sim/step/training_script.h): the model built on the GPU
in fp32 (AutoModelForCausalLM.from_config(config, dtype=float32,
attn_implementation=eager|sdpa, experts_implementation=eager)), AdamW (foreach), the batch
(ids, labels int64); one warm-up step, then the measured step

    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=labels, use_cache=False)   # the loss is inside
        loss = out.loss
    loss.backward(); opt.step()

with `out` and `loss` bound at loop level (memsim's `step.keep_output: true`). The runs
(SPECS): Qwen3-MoE balanced and worst-case, OLMoE skewed, Mixtral balanced (eager attention,
the configs of the bf16 runs), and OLMoE with 16 KV heads (configs/olmoe_mha.json, see
SPECS) under SDPA, without and with HF gradient checkpointing; and (added 2026-11-28, run
them alone with --only 'moe_ac_tf_*_mm') Qwen3-MoE and Mixtral with
`experts_implementation` grouped_mm and batched_mm (batched_mm at micro batch 2). Those four
also record, after the measured step, transformers' integrations/moe.py as installed, whether
autocast has a kernel for aten::_grouped_mm / bmm (and what _grouped_mm does with fp32
operands in a bf16 region), and what autograd saved in one more forward
(`autocast_facts`, `moe_module_source`, `saved_after_step`).

Where HF Trainer (transformers 5.x, accelerate) puts autocast: Trainer's
`autocast_smart_context_manager` is a null context on CUDA; `accelerator.prepare(model)`
replaces `model.forward` by `torch.autocast(device_type, dtype=bfloat16)(forward)` wrapped in
`convert_outputs_to_fp32` (accelerate's Accelerator.prepare_model, `native_amp`), and
`Trainer.compute_loss` calls `model(**inputs)` with the labels, so the model's own
`loss_function` runs inside the region; `loss.backward()` runs outside it. The runs here
put the same region around the same call. Not reproduced: accelerate's
`convert_outputs_to_fp32` (an fp32 copy of the bf16 logits after the forward), which memsim
does not model, and Trainer's dropping of `outputs` before backward (memsim's
`step.keep_output: false`); the measured step is memsim's default loop, as every other
blind run.

Gradient checkpointing (the `_hfckpt` runs): `model.gradient_checkpointing_enable()` with no
arguments, as `TrainingArguments(gradient_checkpointing=True)` calls it; which
`use_reentrant` that gives is recorded from the layers' `_gradient_checkpointing_func`
(a functools.partial of torch.utils.checkpoint.checkpoint): transformers v4.46 passed
True, a third-party reading of 5.18's modeling_utils.py says False. memsim's predictions
give both; tests/test_gpu_moe_autocast_runs.cpp compares the one the run recorded.

Routing is forced as in measure_moe.py: the module-level torch.topk the routers call is
wrapped so that its (T, K) indices are overwritten in place through `.data` with
tools/fixtures/moe_models.forced_indices for the run's tokens per expert (a checkpointed
layer's re-run routes the same way).

Writes OUTDIR/moe_autocast_runs.json (each run's spec, torch/transformers versions,
memory_stats at the marks, the measured step's max_memory_allocated / reserved, the whole
run's peaks, the parameter count, the experts / router source that ran, the attention
implementation, the checkpoint keywords, the tokens per expert; failures with their stderr)
and OUTDIR/moe_autocast_snapshots.tar.xz (torch.cuda.memory._snapshot() per run, frames
stripped, under 8 MiB). A failing run is recorded and the next one runs; no run starts after
--budget seconds; the script never raises out.

Without CUDA (a dry run on a CPU machine: Debian's torch 1.13, no transformers) each run's
loop executes on tools/fixtures/moe_models' stand-in at a tiny size under CPU autocast, so
the loop, the routing hook and the recording are exercised; the transformers parts are
recorded as skipped with the reason ("dry_runs" in the JSON, never "results").

memsim's scenario of each run is tests/data/gpu/moe_autocast/NAME.yaml and its blind
predictions tests/data/gpu/moe_autocast_predictions.json (tools/gpu/predict_moe_autocast.py),
committed before any measurement.
"""
import argparse
import contextlib
import importlib.util
import inspect
import json
import os
import sys
import time

import gpu_common
import measure_moe as mm  # the shapes, routings, forcing and recording of the bf16 runs

TOPIC = "moe_autocast"


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MHA_CONFIGS = os.path.join(ROOT, "tests", "data", "gpu", "moe_autocast", "configs")


def spec(name, model_type, routing, attention="eager", hf_ckpt=False, config=None, seconds=12.0,
         experts_impl="eager", batch=None):
    """config: the config.json (default measure_moe's tests/data/gpu/moe/configs/MODEL.json);
    batch: a micro batch other than measure_moe.SHAPE's (the routing's counts follow it)."""
    path = config or os.path.join(mm.CONFIGS, model_type + ".json")
    cfg = dict(mm.SHAPE)
    counts = mm.ROUTINGS[routing]
    if batch is not None:
        cfg["batch"] = batch
        counts = mm.forced_counts_for(routing, batch * cfg["seq"])
    d = dict(name=name, impl="transformers", model_type=model_type, routing=routing,
             counts=counts, dtype="fp32", autocast="bf16", attention=attention,
             hf_gradient_checkpointing=hf_ckpt, experts_impl=experts_impl, cfg=cfg,
             config=os.path.relpath(path, ROOT), experts=mm.E, top_k=mm.K, expert_d_ff=mm.FE,
             warmup=1, estimate=seconds)
    if experts_impl != "eager":
        d["probe_saved"] = True  # after the measured step: what autograd saved (see run_one)
    return d


# In priority order (a budget cut drops the last). Shapes: measure_moe.SHAPE (2 layers,
# d 1024, 16 heads / 4 KV, 8 experts of 768, top 2, vocab 4096, b 16 x s 256).
# The SDPA runs use OLMoE with 16 KV heads (configs/olmoe_mha.json; OLMoE-1B-7B's own
# attention is multi-head): with grouped KV heads transformers 5.17 hands SDPA
# `enable_gqa=True` (integrations/sdpa_attention.py use_gqa_in_sdpa: no mask, head_dim <=
# 256), while memsim's 5.x rows still materialise repeat_kv before the kernel (LLaMA's 5.17
# SDPA autocast run, tests/data/h100/cuda_runs.json: memsim +1.0%; docs/h100-runs.md), a
# gap of its own that these runs are not meant to measure.
OLMOE_MHA = os.path.join(MHA_CONFIGS, "olmoe_mha.json")
SPECS = [
    # experts_implementation grouped_mm / batched_mm under autocast (issue #15; docs/moe.md
    # "batched_mm and grouped_mm under autocast"), added 2026-11-28 after the six eager runs
    # below were measured: first, so that a budget cut drops those six (already measured);
    # --only 'moe_ac_tf_*_mm' runs these alone. grouped_mm at the shape of the bf16 grouped_mm
    # run (measure_moe.py) and of the eager runs below; batched_mm gathers every sample's own
    # copy of its expert's weights ((S, 2F, D) in fp32, then autocast's bf16 copy for bmm:
    # 72 GiB at S = 8192 for the gate_up alone), so its runs take a micro batch of 2
    # (S = 1024). Qwen3-MoE (bf16 top-k weights after .to(router_logits.dtype)) and Mixtral
    # (fp32 top-k weights, no cast).
    spec("moe_ac_tf_qwen3_moe_balanced_grouped_mm", "qwen3_moe", "balanced", experts_impl="grouped_mm"),
    spec("moe_ac_tf_qwen3_moe_balanced_batched_mm", "qwen3_moe", "balanced", experts_impl="batched_mm",
         batch=2, seconds=10.0),
    spec("moe_ac_tf_mixtral_balanced_grouped_mm", "mixtral", "balanced", experts_impl="grouped_mm"),
    spec("moe_ac_tf_mixtral_balanced_batched_mm", "mixtral", "balanced", experts_impl="batched_mm",
         batch=2, seconds=10.0),
    spec("moe_ac_tf_qwen3_moe_balanced", "qwen3_moe", "balanced"),
    spec("moe_ac_tf_olmoe_skew", "olmoe", "skew"),
    spec("moe_ac_tf_olmoe_mha_balanced_sdpa", "olmoe", "balanced", attention="sdpa", config=OLMOE_MHA),
    spec("moe_ac_tf_olmoe_mha_balanced_sdpa_hfckpt", "olmoe", "balanced", attention="sdpa",
         hf_ckpt=True, config=OLMOE_MHA, seconds=13.0),
    spec("moe_ac_tf_qwen3_moe_worst", "qwen3_moe", "worst"),
    spec("moe_ac_tf_mixtral_balanced", "mixtral", "balanced"),
]


# --------------------------------------------------------------------------- models
def build_transformers(torch, sp, dry):
    import transformers
    with open(os.path.join(ROOT, sp["config"])) as f:
        d = json.load(f)
    if dry:  # never reached without CUDA unless transformers is installed on the CPU machine
        d.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, vocab_size=512, max_position_embeddings=64)
        for k in ("moe_intermediate_size", "head_dim"):
            if k in d:
                d[k] = 16 if k == "head_dim" else 24
    config = mm.config_from_dict(d)
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    return mm.from_config(transformers, config, sp["attention"], sp["experts_impl"], **kw)


def build_standin(torch, sp):
    """The dry run's model: moe_models' stand-in at measure_moe's dry size (OLMoE as the
    qwen row: the stand-in has no whole-projection q/k norms)."""
    import moe_models
    s = dict(sp, model_type="mixtral" if sp["model_type"] == "mixtral" else "qwen3_moe")
    cfg = mm.standin_cfg(s, True)
    return moe_models.MoeForCausalLM(cfg), cfg


def checkpoint_keywords(model):
    """The keywords of the first checkpointed layer's _gradient_checkpointing_func (a
    functools.partial of torch.utils.checkpoint.checkpoint), and how many layers have
    gradient checkpointing on."""
    kw, on = None, 0
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True and hasattr(m, "_gradient_checkpointing_func"):
            on += 1
            if kw is None:
                f = m._gradient_checkpointing_func
                kw = {k: repr(v) if not isinstance(v, (bool, int, float, str, type(None))) else v
                      for k, v in (getattr(f, "keywords", None) or {}).items()}
                kw["_func"] = getattr(getattr(f, "func", f), "__qualname__", repr(f))
    return kw, on


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dry = not cuda
    have_tf = importlib.util.find_spec("transformers") is not None
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=dry)
    if cuda:
        gpu_common.init_cuda(torch, result)
        gpu_common.record_history(torch)
    torch.manual_seed(0)
    standin = not have_tf
    if standin and cuda:
        raise RuntimeError("transformers is not importable by " + sys.executable)
    cfg = None
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        if standin:
            model, cfg = build_standin(torch, sp)
            result["skipped"] = ("transformers is not importable by " + sys.executable +
                                 ": the loop ran on moe_models' stand-in (dry run)")
        else:
            model = build_transformers(torch, sp, dry)
    model = model.to(device)
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["parameter_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    result["code"] = mm.code_of(model)
    if not standin:
        import transformers
        result["transformers_version"] = transformers.__version__
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if sp["hf_gradient_checkpointing"]:
        if standin:
            result["skipped_checkpointing"] = "gradient_checkpointing_enable is transformers' (dry run)"
        else:
            try:
                result["gradient_checkpointing_enable_source"] = inspect.getsource(
                    type(model).gradient_checkpointing_enable)
            except (OSError, TypeError):
                result["gradient_checkpointing_enable_source"] = "?"
            model.gradient_checkpointing_enable()
            kw, on = checkpoint_keywords(model)
            result["gradient_checkpointing_kwargs"] = kw
            result["checkpointed_modules"] = on
            emb = model.get_input_embeddings()
            result["input_embedding_forward_hooks"] = len(getattr(emb, "_forward_hooks", {}))
    # The forced routing, on the device before the measured step.
    forced = mm.forced_table(torch, sp, dry, device, model, standin)
    routed = []
    orig_topk = torch.topk

    def forced_topk(*args, **kwargs):
        v, i = orig_topk(*args, **kwargs)
        if tuple(i.shape) == tuple(forced.shape):
            i.data.copy_(forced)
            routed.append(1)
        return v, i

    if not standin:
        torch.topk = forced_topk
    result["marks"] = {"after_model": mm.stats(torch, cuda)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True if cuda else False)
    forward = mm.batch_forward(torch, sp, cfg, dry, device, standin)
    out = loss = None
    t0 = time.time()
    try:
        out, loss, begin = mm.step_loop(
            torch, cuda, sp, model, opt, forward, result, result["marks"],
            region=lambda: torch.autocast(device.type, dtype=torch.bfloat16),
            logits_of=lambda o: o if standin else getattr(o, "logits", None))
    finally:
        torch.topk = orig_topk
    result["router_calls_forced"] = len(routed)
    result["tokens_per_expert"] = mm.tokens_per_expert(torch, forced, sp["experts"])
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, begin)
        gpu_common.device_memory_at_end(torch, result, keep_info=False)
        gpu_common.dump_snapshot(torch, out_dir, sp["name"], mm.strip_frames)
    if sp.get("probe_saved"):
        # After every figure above is taken: the facts the grouped_mm / batched_mm autocast
        # model is written from (recorded, never part of the measured step).
        out = loss = None
        result["autocast_facts"] = autocast_facts(torch, device)
        result["moe_module_source"] = moe_module_source(standin)
        torch.topk = forced_topk if not standin else orig_topk
        try:
            result["saved_after_step"] = saved_probe(torch, model, forward, opt, device)
        except Exception as e:  # noqa: BLE001 (a probe never costs the run its figures)
            result["saved_after_step"] = {"error": repr(e)[:600]}
        finally:
            torch.topk = orig_topk
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


# --------------------------------------------------------------------------- probes
def autocast_facts(torch, device):
    """Whether autocast has a kernel for the experts' matmuls (bmm is on CUDA's
    AT_FORALL_LOWER_PRECISION_FP list; _grouped_mm's registration is pytorch/pytorch#174763),
    and, on CUDA, what torch._grouped_mm does with fp32 operands inside a bf16 autocast region
    (the output dtype, or the error)."""
    out = {"has_F_grouped_mm": hasattr(torch.nn.functional, "grouped_mm"),
           "has__grouped_mm": hasattr(torch, "_grouped_mm")}
    for op in ("aten::bmm", "aten::_grouped_mm", "aten::mm", "aten::linear"):
        for key in ("AutocastCUDA", "AutocastCPU"):
            try:
                out[op + "|" + key] = bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))
            except Exception as e:  # noqa: BLE001 (an op or key this torch lacks)
                out[op + "|" + key] = "error: " + repr(e)[:200]
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        a = torch.randn(32, 64, device=device)
        b = torch.randn(2, 64, 32, device=device)
        offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
        for name, fn in (("_grouped_mm", torch._grouped_mm),
                         ("F.grouped_mm", getattr(torch.nn.functional, "grouped_mm", None))):
            if fn is None:
                continue
            try:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out["probe_fp32_" + name] = str(fn(a, b, offs=offs).dtype)
            except Exception as e:  # noqa: BLE001
                out["probe_fp32_" + name] = "error: " + repr(e)[:300]
    return out


def moe_module_source(standin):
    """transformers' integrations/moe.py as installed (the experts functions and the
    _grouped_mm / _batched_linear helpers that ran)."""
    if standin:
        return "skipped: transformers is not importable (dry run)"
    try:
        import transformers.integrations.moe as moe
        return inspect.getsource(moe)
    except Exception as e:  # noqa: BLE001
        return "error: " + repr(e)[:300]


def saved_probe(torch, model, forward, opt, device):
    """One more forward under the same autocast region, then every tensor its autograd graph
    saved (tools/gpu/probe_saved.py's walk: node, attribute, shape, dtype, storage)."""
    import probe_saved
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out, loss = forward(model)
    rows, saved = probe_saved.walk(loss.grad_fn, torch)
    del out, loss
    return {"saved_bytes": saved, "saved": rows}


# --------------------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=90.0, per_run=30.0)
    a = ap.parse_args()
    if gpu_common.run_one_if_child(a, SPECS, run_one):
        return
    chosen = gpu_common.select_by_name(SPECS, a.only)
    if a.list:
        for s in chosen:
            print(f"{s['name']:44s} {s['model_type']:10s} {s['routing']:9s} {s['attention']:6s} "
                  f"{'hf-ckpt' if s['hf_gradient_checkpointing'] else '-':8s} {s['experts_impl']:10s} "
                  f"b{s['cfg']['batch']:<3d} {s['estimate']:5.1f} s")
        print(f"{len(chosen)} runs, about {sum(s['estimate'] for s in chosen):.0f} s (estimate)")
        return
    os.makedirs(a.out_dir, exist_ok=True)
    t_start = time.time()
    versions = gpu_common.imported_versions()
    dry_runs = []

    accept = gpu_common.dry_run_accept(a.out_dir, dry_runs, t_start, 40)

    def report(sp, r):
        print(f"{sp['name']:44s} peak allocated {r.get('measured_step_peak_allocated')} reserved "
              f"{r.get('measured_step_peak_reserved')} ckpt {r.get('gradient_checkpointing_kwargs')} "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, min_left=lambda sp: 0.75 * sp["estimate"],
                                not_run="plain", failed_show=600, timeout_note="stderr",
                                error_show=400, process_facts=False)
    results, failures = gpu_common.run_children(chosen, loop, report, accept)
    out = {"versions": versions, "script": "tools/gpu/measure_moe_autocast.py",
           "results": results, "failures": failures}
    if dry_runs:
        out["dry_runs"] = dry_runs
    gpu_common.write_json(os.path.join(a.out_dir, TOPIC + "_runs.json"), out)
    mm.pack_snapshots(a.out_dir, results, TOPIC + "_snapshots.tar.xz")
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
