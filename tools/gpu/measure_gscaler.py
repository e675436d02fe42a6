#!/usr/bin/env python3
"""Measures fp16 mixed precision with torch.amp.GradScaler on a CUDA GPU, for memsim's
`precision.grad_scaler` (docs/autocast.md "GradScaler"; issue #16 item 5).

    python3 tools/gpu/measure_gscaler.py OUTDIR [--budget SECONDS] [--per-run SECONDS]
                                         [--only NAME|GLOB...] [--list]

Each configuration runs in its own Python process (a fresh caching allocator and CUDA
context) with a per-run timeout and torch.cuda.memory._record_memory_history on from before
the model is built. The model is tools/fixtures/torch_models.py's HF LLaMA stand-in at
measure_cuda.py's GPU size (LLAMA: 4 layers, d 1024, 16 heads / 4 KV, d_ff 2816, vocab
32000, batch 4 x 1024 tokens), built on the GPU in fp32, with foreach AdamW, as
measure_cuda.py's `llama_l4_d1024_s1024_b4_autocast_bf16` (measured on an H100, 2.11) but
under fp16 autocast, and the loop of a plain AMP script (the PyTorch AMP recipe; HF
Trainer's `fp16=True` makes the same calls through accelerate):

    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        logits = model(ids); loss = llama_loss(logits, labels)
    scaler.scale(loss).backward()              # the scaled loss: a temporary of the statement
    [scaler.unscale_(opt); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)]   # clip run
    scaler.step(opt)
    scaler.update()

with `logits` and `loss` bound at loop level (memsim's `step.keep_output: true`), one
warm-up step (more, at most 3, while the scaler skipped the optimizer's step on inf/NaN
grads, so that the measured step always runs AdamW with its state: each step's found_inf,
scale and optimizer-state count are recorded), then the measured step. The runs (SPECS, in
order of value; a budget cut drops the last):

  gs_llama_..._fp16_scaler        fp16 autocast + GradScaler
  gs_llama_..._fp16_scaler_fused  the same with AdamW(fused=True) (HF Trainer's adamw_torch_fused:
                                  the scaler's _step_supports_amp_scaling path)
  gs_llama_..._fp16_scaler_full   the same, every layer checkpointed (non-reentrant)
  gs_llama_..._fp16               fp16 autocast without a scaler (control: the step unscaled)
  gs_llama_..._fp16_scaler_clip   + unscale_ and clip_grad_norm_(1.0) (HF Trainer's order;
                                  optimizer.max_grad_norm; predicted before measurement)

Marks (torch.cuda.memory_stats at each): measured_step_begin, forward_end (after the model,
before the loss, inside the region: memsim's forward_end), loss_end, backward_end (after
the scaled backward statement: the scaled loss is gone), unscale_end (clip run),
clip_end (clip run), step_end (after scaler.step / opt.step) and update_end.

Writes OUTDIR/gscaler_runs.json (each run's spec, versions, marks, the measured step's
max_memory_allocated / reserved, the whole run's peaks, the per-step scaler record, whether
the optimizer takes the scaler's fused path (`_step_supports_amp_scaling`), and once the
source of torch.amp.grad_scaler and clip_grad_norm_ that ran) and
OUTDIR/gscaler_snapshots.tar.xz (torch.cuda.memory._snapshot() per run, Python frames cut
to the model, loop, scaler, optimizer and clipping files). A failing run is recorded and
the next one runs; no run starts past --budget; the parent never raises out.

Without CUDA (the CPU dry run, Debian's torch 1.13): GradScaler is CUDA-only there
(torch.amp.GradScaler arrived in 2.3; torch.cuda.amp.GradScaler disables itself without
CUDA) and CPU autocast knows bf16 only, so each run executes the same loop on a tiny
stand-in under CPU bf16 autocast with a disabled torch.cuda.amp.GradScaler (its scale,
unscale_, step and update calls are made, as no-ops) and records no figures; results go to
"dry_runs", never "results".

memsim's scenario of each run is tests/data/gpu/gscaler/NAME.yaml and its blind predictions
tests/data/gpu/gscaler_predictions.json (tools/gpu/predict_gscaler.py), committed before the
measurement.
"""
import argparse
import contextlib
import hashlib
import importlib.util
import inspect
import os
import sys
import time

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

TOPIC = "gscaler"
# measure_cuda.LLAMA (the shape of the measured bf16 autocast run it compares with).
LLAMA = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000, context=1024,
             seq=1024, batch=4, dropout=0.0)
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512, context=64, seq=32,
            batch=2, dropout=0.0)
BASE = "gs_llama_l4_d1024_s1024_b4"


def spec(suffix, scaler=True, policy="none", clip=None, opt_impl="foreach", estimate=8.0):
    return dict(name=f"{BASE}_{suffix}", family="hf-llama", impl="standin", cfg=dict(LLAMA),
                optimizer="adamw", opt_impl=opt_impl, dtype="fp32", autocast="fp16",
                grad_scaler=scaler, policy=policy, clip_grad_norm=clip, attention="eager",
                warmup=1, max_warmup=3, estimate=estimate)


SPECS = [
    spec("fp16_scaler"),
    spec("fp16_scaler_fused", opt_impl="fused"),
    spec("fp16_scaler_full", policy="full", estimate=9.0),
    spec("fp16", scaler=False),
    spec("fp16_scaler_clip", clip=1.0),
]

STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
              "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "requested_bytes.all.current", "requested_bytes.all.peak",
              "allocation.all.allocated", "allocation.all.current",
              "segment.all.current", "num_alloc_retries", "num_ooms")


def stats(torch, cuda):
    return gpu_common.memory_stats(torch, cuda, STATS_KEYS)


def trim(snapshot):
    """Each entry's frames from the model, this loop, the scaler, the optimizer, clipping and
    checkpointing (at most 5, innermost first)."""
    return gpu_common.trim_frames(snapshot, ("torch_models", "measure_gscaler", "grad_scaler",
                                             "optim", "clip_grad", "checkpoint"), 5)


def make_scaler(torch, cuda):
    """(scaler, what it is). On CUDA torch.amp.GradScaler("cuda") (2.3+; accelerate's
    get_grad_scaler builds the same); without CUDA torch.cuda.amp.GradScaler(enabled=False),
    whose methods are no-ops (the dry run)."""
    if cuda:
        cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if cls is None:
            raise RuntimeError("torch.amp.GradScaler is missing in torch " + torch.__version__)
        return cls("cuda"), "torch.amp.GradScaler('cuda')"
    return (torch.cuda.amp.GradScaler(enabled=False),
            "torch.cuda.amp.GradScaler(enabled=False) (dry run: CUDA-only in torch 1.13)")


def found_inf_of(scaler, opt):
    """The found_inf values the scaler recorded for opt this step (before update() clears
    them); [] when disabled."""
    st = getattr(scaler, "_per_optimizer_states", {}).get(id(opt), {})
    return [float(v.item()) for v in st.get("found_inf_per_device", {}).values()]


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    import torch_models as tm
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=not cuda)
    cfg = dict(sp["cfg"]) if cuda else dict(TINY)
    if cuda:
        gpu_common.init_cuda(torch, result)
        gpu_common.record_history(torch)
    torch.manual_seed(0)
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model = tm.LlamaForCausalLM(cfg)
    tm.set_policy(model, sp["policy"])
    model = model.to(device)
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["marks"] = {"after_model": stats(torch, cuda)}
    # fused=True (HF Trainer's adamw_torch_fused) sets _step_supports_amp_scaling: the scaler
    # hands it grad_scale / found_inf instead of unscaling. torch 1.13 has no CPU fused AdamW:
    # the dry run steps foreach.
    if sp["opt_impl"] == "fused" and cuda:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        if sp["opt_impl"] == "fused":
            result["skipped_fused"] = "fused AdamW is CUDA-only in torch " + torch.__version__
    result["optimizer_step_supports_amp_scaling"] = bool(getattr(opt, "_step_supports_amp_scaling", False))
    scaler, kind = (make_scaler(torch, cuda) if sp["grad_scaler"] else (None, None))
    result["scaler"] = kind
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    labels = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    # CPU autocast in torch 1.13 knows bf16 only (the dry run); CUDA runs fp16.
    low = torch.float16 if cuda else torch.bfloat16
    steps = []
    logits = loss = None
    warmups = 0
    t0 = time.time()
    while True:
        measured = warmups >= sp["warmup"] and (
            scaler is None or not cuda or len(opt.state) > 0 or warmups >= sp["max_warmup"])
        marks = {}
        if measured:
            result["marks"]["measured_step_begin"] = begin = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=low):
            logits = model(ids)
            if measured:
                marks["forward_end"] = stats(torch, cuda)
            loss = tm.llama_loss(logits, labels)
        if measured:
            marks["loss_end"] = stats(torch, cuda)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if measured:
            marks["backward_end"] = stats(torch, cuda)
        if sp["clip_grad_norm"] is not None:
            if scaler is not None:
                scaler.unscale_(opt)
                if measured:
                    marks["unscale_end"] = stats(torch, cuda)
            total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), sp["clip_grad_norm"])
            if measured:
                marks["clip_end"] = stats(torch, cuda)
                result["total_norm"] = float(total_norm)
            del total_norm
        record = {"step": len(steps), "measured": measured}
        if scaler is not None:
            scaler.step(opt)
            record["found_inf"] = found_inf_of(scaler, opt)
            if measured:
                marks["step_end"] = stats(torch, cuda)
            scaler.update()
            record["scale_after_update"] = float(scaler.get_scale())
        else:
            opt.step()
            if measured:
                marks["step_end"] = stats(torch, cuda)
        if measured:
            marks["update_end"] = stats(torch, cuda)
        record["optimizer_states"] = len(opt.state)
        record["loss"] = float(loss)
        steps.append(record)
        if measured:
            result["marks"].update(marks)
            break
        warmups += 1
    result["warmup_steps_run"] = warmups
    result["steps"] = steps
    result["loss_dtype"] = str(loss.dtype)
    result["logits_dtype"] = str(logits.dtype)
    result["grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, begin)
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


# --------------------------------------------------------------------------- parent
def sources(torch):
    """The GradScaler and clip_grad_norm_ code this torch runs (the docs cite it): the text of
    torch/amp/grad_scaler.py (and its sha256), clip_grad_norm_'s source, Adam's __init__
    lines that set _step_supports_amp_scaling."""
    out = {}
    mod = importlib.util.find_spec("torch.amp.grad_scaler")
    if mod is not None and mod.origin:
        with open(mod.origin, "rb") as f:
            text = f.read()
        out["torch/amp/grad_scaler.py"] = text.decode(errors="replace")
        out["torch/amp/grad_scaler.py.sha256"] = hashlib.sha256(text).hexdigest()
    else:
        out["torch/amp/grad_scaler.py"] = None
    for label, get in (("clip_grad_norm_", lambda: torch.nn.utils.clip_grad_norm_),
                       ("Adam.__init__", lambda: torch.optim.Adam.__init__),
                       ("AdamW.__init__", lambda: torch.optim.AdamW.__init__)):
        try:
            out[label] = inspect.getsource(get())
        except Exception as e:  # noqa: BLE001 - a record, never a failure
            out[label] = "unavailable: " + repr(e)[:200]
    return out


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=50.0, per_run=25.0)
    a = ap.parse_args()
    if gpu_common.run_one_if_child(a, SPECS, run_one):
        return
    chosen = gpu_common.select_by_name(SPECS, a.only)
    if a.list:
        for s in chosen:
            print(f"{s['name']:40s} scaler {str(s['grad_scaler']):5s} {s['opt_impl']:7s} "
                  f"{s['policy']:5s} clip {s['clip_grad_norm']}  {s['estimate']:4.1f} s")
        print(f"{len(chosen)} runs, about {sum(s['estimate'] for s in chosen):.0f} s (estimate)")
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, sum(s["estimate"] for s in chosen), a.budget)
    import torch
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    src = sources(torch)
    dry_runs = []

    def accept(sp, r, t_run, failures):
        """A dry run's result goes to dry_runs (its run to failures as skipped)."""
        r["process_seconds"] = round(time.time() - t_run, 2)
        if not r.get("dry_run"):
            return True
        dry_runs.append(r)
        failures[sp["name"]] = ("skipped: no CUDA (dry run: the loop ran on a tiny stand-in under "
                                "CPU bf16 autocast, " + str(r.get("scaler")) + ")")
        print(f"DRY {sp['name']:40s} loss {r.get('loss_dtype')} steps {len(r['steps'])} "
              f"({time.time() - t_start:5.1f} s)", flush=True)
        return False

    def report(sp, r):
        print(f"{sp['name']:40s} peak allocated {r.get('measured_step_peak_allocated')} reserved "
              f"{r.get('measured_step_peak_reserved')} warm-ups {r.get('warmup_steps_run')} "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, min_left=lambda sp: 0.75 * sp["estimate"],
                                not_run="plain", failed_show=600, timeout_note="stderr",
                                error_show=400, process_facts=False)
    results, failures = gpu_common.run_children(chosen, loop, report, accept)
    doc = {"versions": versions, "script": "tools/gpu/measure_gscaler.py", "sources": src,
           "results": results, "failures": failures}
    if dry_runs:
        doc["dry_runs"] = dry_runs
    gpu_common.write_json(os.path.join(a.out_dir, TOPIC + "_runs.json"), doc, default=str)
    gpu_common.pack_snapshots(a.out_dir, gpu_common.result_pickles(a.out_dir, results),
                              TOPIC + "_snapshots.tar.xz")
    gpu_common.remove_run_files(a.out_dir, results + dry_runs)
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s",
          flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
