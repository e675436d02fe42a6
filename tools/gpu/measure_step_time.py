#!/usr/bin/env python3
"""Measures real training-step times on a CUDA GPU, for memsim's time model (issue #18
item 1; docs/time-model.md, "Blind predictions").

    python3 tools/gpu/measure_step_time.py OUT.json [--steps N] [--only NAME...]

Each configuration: the plain-torch LLaMA stand-in of tools/fixtures/torch_models.py (HF
LLaMA eager, which memsim's hf-llama family follows op by op) at a GPU size, bf16
parameters, AdamW with the named implementation, the checkpointing policy applied with
torch_models.set_policy (torch.utils.checkpoint(use_reentrant=False) per layer, as memsim's
policies), the loop memsim assumes by default:
    zero_grad(set_to_none=True); logits = model(ids); loss = llama_loss(logits, labels);
    loss.backward(); opt.step()
Three warm-up steps, then N timed steps (CUDA events around each step, synchronised);
the median is reported, with the forward+backward and optimizer parts timed the same way
in separate events. One process runs every configuration in turn (step time does not
depend on the allocator's history the way peaks do); torch.cuda.empty_cache() between.

Writes OUT.json: {"gpu", "torch", "configs": [{"name", "policy", "optimizer_impl",
"batch", "seq", "step_ms_median", "fwd_bwd_ms_median", "optimizer_ms_median", "steps_ms"}]}.
About 1-2 minutes on an H100.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

# A ~1.1B LLaMA (16 layers, d 2048, GQA 16/8, SwiGLU 5632, vocab 32000) at batch 4 x 1024:
# small enough for every policy on an 80 GB GPU, large enough that GEMMs dominate.
BASE = {"layers": 16, "d_model": 2048, "heads": 16, "kv_heads": 8, "d_ff": 5632,
        "vocab": 32000, "context": 1024, "dropout": 0.0, "tied": False}
CONFIGS = [
    # name, policy, optimizer impl (torch.optim.AdamW: foreach / fused / for-loop)
    ("none_foreach", "none", "foreach"),
    ("full_foreach", "full", "foreach"),
    ("selective_foreach", "selective", "foreach"),
    ("modules_foreach", "modules", "foreach"),
    ("none_fused", "none", "fused"),
    ("none_forloop", "none", "for-loop"),
]
BATCH, SEQ = 4, 1024


def profile_step(torch, model, opt, ids, labels, tm, shapes=False):
    """One more step under torch.profiler: CUDA time per op (self), the step's wall time and
    the summed kernel time, so launch-bound gaps (GPU idle while Python runs) show."""
    import time
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=shapes) as prof:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = tm.llama_loss(model(ids), labels)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    def dev(e, attr):
        for a in (attr.replace("cuda", "device"), attr):
            if hasattr(e, a):
                return getattr(e, a)
        return 0
    rows = []
    for e in prof.key_averages(group_by_input_shape=shapes):
        row = {"op": e.key, "count": e.count, "self_device_us": dev(e, "self_cuda_time_total"),
               "self_cpu_us": e.self_cpu_time_total}
        if shapes:
            row["input_shapes"] = str(getattr(e, "input_shapes", ""))
        rows.append(row)
    rows.sort(key=lambda r: -r["self_device_us"])
    kernels = sum(r["self_device_us"] for r in rows)
    # Both an aten op and the kernels it launched carry self device time: the total counts
    # each kernel twice (halve it for the GPU's busy time).
    return {"wall_ms_profiled": wall * 1e3, "self_device_ms_total": kernels / 1e3,
            "ops": rows[:300 if shapes else 60]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--profile", nargs="*", default=[],
                    help="configs to profile for one extra step (torch.profiler, CUDA time per op)")
    ap.add_argument("--shapes", action="store_true",
                    help="profile rows per (op, input shapes) instead of per op")
    args = ap.parse_args()
    import torch
    import torch_models as tm

    dev = torch.device("cuda")
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "configs": []}
    for name, policy, impl in CONFIGS:
        if args.only and name not in args.only:
            continue
        torch.manual_seed(0)
        model = tm.LlamaForCausalLM(dict(BASE)).to(device=dev, dtype=torch.bfloat16)
        tm.set_policy(model, policy)
        kw = {"foreach": dict(foreach=True), "fused": dict(fused=True),
              "for-loop": dict(foreach=False)}[impl]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
        ids = torch.randint(0, BASE["vocab"], (BATCH, SEQ), device=dev)
        labels = torch.randint(0, BASE["vocab"], (BATCH, SEQ), device=dev)
        steps, fb, op = [], [], []
        fw = []
        for i in range(3 + args.steps):
            e0, e1, e2, ef = (torch.cuda.Event(enable_timing=True) for _ in range(4))
            opt.zero_grad(set_to_none=True)
            e0.record()
            logits = model(ids)
            loss = tm.llama_loss(logits, labels)
            ef.record()
            loss.backward()
            e1.record()
            opt.step()
            e2.record()
            torch.cuda.synchronize()
            if i >= 3:
                steps.append(e0.elapsed_time(e2))
                fb.append(e0.elapsed_time(e1))
                op.append(e1.elapsed_time(e2))
                fw.append(e0.elapsed_time(ef))
            del logits, loss
        prof_rows = None
        if name in args.profile:
            prof_rows = profile_step(torch, model, opt, ids, labels, tm, args.shapes)
        results["configs"].append({
            "name": name, "policy": policy, "optimizer_impl": impl, "batch": BATCH, "seq": SEQ,
            "step_ms_median": statistics.median(steps), "fwd_bwd_ms_median": statistics.median(fb),
            "optimizer_ms_median": statistics.median(op), "steps_ms": steps,
            "forward_ms_median": statistics.median(fw),
            "backward_ms_median": statistics.median(fb) - statistics.median(fw),
            "profile": prof_rows,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()})
        print(name, round(statistics.median(steps), 2), "ms", flush=True)
        del model, opt, ids, labels
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
