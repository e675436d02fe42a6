#!/usr/bin/env python3
"""Probes what LitGPT's LoRAQKVLinear allocates on CUDA in its lora_B step, the one piece
memsim cannot size from the source (docs/implementations.md, scenario/litgpt_lora_keys.cpp:
`lora.targets` with q/k/v on `model.implementation: litgpt` is refused for it).

    python3 tools/gpu/probe_litgpt_qkv_conv.py OUTDIR [--budget SECONDS] [--list]

LitGPT v0.5.13 (Lightning-AI/litgpt 26857050) litgpt/lora.py LoRAQKVLinear.forward:
after_A = F.linear(x, lora_A) -> (B, T, r*N); after_B = conv1d(after_A.transpose(-2, -1),
lora_B.unsqueeze(-1)).transpose(-2, -1); conv1d is F.conv1d(input, weight,
groups=N) when n_head == n_query_groups, else one F.conv1d per enabled q/k/v over
input.chunk(N, dim=1) and weight.split(qkv_shapes), then torch.cat(dim=1). On CUDA F.conv1d
runs cuDNN, whose workspace (forward, and the data / weight gradients in backward) is what
the library's heuristics choose for the shape and dtype: only a device can tell. This probe
runs exactly those calls (the rest of the layer is plain matmuls memsim already models) at
the shapes of the configurations users run, under torch.cuda.memory._record_memory_history,
and writes for each case and phase (forward, backward) every allocation and free with its
size and top frames, so memsim can model the conv's copies and workspace exactly.

No memsim prediction is attached: this is an exploration of cuDNN's choice, not a
comparison (memsim refuses the combination today). Without CUDA (torch 1.13 on a CPU, the
lease's dry run) it runs the same calls on the CPU to check the script and records no events.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

# name -> (batch, seq, d_model, heads, kv_heads, head_dim, rank, enabled q/k/v)
CASES = {
    # Llama-2-7B (MHA: one grouped conv), LitGPT's finetune/lora.py defaults (r 8; q and v).
    "llama2_7b_mha_qv_r8": (1, 512, 4096, 32, 32, 128, 8, (True, False, True)),
    "llama2_7b_mha_qkv_r8": (1, 512, 4096, 32, 32, 128, 8, (True, True, True)),
    # Llama-3-8B (GQA 32/8: one conv per enabled projection, then cat).
    "llama3_8b_gqa_qv_r8": (1, 512, 4096, 32, 8, 128, 8, (True, False, True)),
    "llama3_8b_gqa_qkv_r16": (2, 1024, 4096, 32, 8, 128, 16, (True, True, True)),
    # A small shape, as the CPU stand-ins use.
    "small_mha_qkv_r8": (2, 64, 256, 4, 4, 64, 8, (True, True, True)),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def qkv_shapes(d_model, heads, kv_heads, head_dim, enabled):
    q, kv = heads * head_dim, kv_heads * head_dim
    return [s for s, on in zip((q, kv, kv), enabled) if on]


def lora_conv(after_a, lora_b, shapes, grouped):
    """LoRAQKVLinear.conv1d on after_A.transpose(-2, -1), then the transpose back."""
    inp = after_a.transpose(-2, -1)
    w = lora_b.unsqueeze(-1)
    n = len(shapes)
    if grouped:
        out = F.conv1d(inp, w, groups=n)
    else:
        parts = inp.chunk(n, dim=1)
        ws = w.split(shapes)
        out = torch.cat([F.conv1d(a, b) for a, b in zip(parts, ws)], dim=1)
    return out.transpose(-2, -1)


def trace_len():
    snap = torch.cuda.memory._snapshot()
    return [len(t) for t in snap["device_traces"]]


def events_since(start):
    snap = torch.cuda.memory._snapshot()
    out = []
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace[start[dev]:]:
            frames = [f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"
                      for f in e.get("frames", [])[:6]]
            out.append({"action": e["action"], "size": e["size"], "stream": e.get("stream", 0),
                        "frames": frames})
    return out


def run_case(name, dtype_name, cuda):
    b, t, d, heads, kv_heads, hd, r, enabled = CASES[name]
    dtype = DTYPES[dtype_name]
    dev = "cuda" if cuda else "cpu"
    if not cuda and dtype is torch.bfloat16:
        dtype = torch.float32  # torch 1.13's CPU conv1d: checks the script, not the bytes
    shapes = qkv_shapes(d, heads, kv_heads, hd, enabled)
    n = len(shapes)
    after_a = torch.randn(b, t, r * n, device=dev, dtype=dtype, requires_grad=True)
    lora_b = torch.randn(sum(shapes), r, device=dev, dtype=dtype, requires_grad=True)
    grouped = heads == kv_heads
    result = {"case": name, "dtype": dtype_name, "shape": {"batch": b, "seq": t, "d_model": d,
              "heads": heads, "kv_heads": kv_heads, "head_dim": hd, "rank": r,
              "enabled": list(enabled), "qkv_shapes": shapes, "grouped_conv": grouped}}
    if cuda:
        torch.cuda.synchronize()
        start = trace_len()
    out = lora_conv(after_a, lora_b, shapes, grouped)
    if cuda:
        torch.cuda.synchronize()
        result["forward"] = events_since(start)
        start = trace_len()
    out.backward(torch.ones_like(out))
    if cuda:
        torch.cuda.synchronize()
        result["backward"] = events_since(start)
    result["out_bytes"] = out.numel() * out.element_size()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for name in CASES:
            print(name)
        return 0
    os.makedirs(a.outdir, exist_ok=True)
    cuda = torch.cuda.is_available()
    env = {"torch": torch.__version__, "cuda": cuda}
    if cuda:
        env.update(device=torch.cuda.get_device_name(0), cudnn=torch.backends.cudnn.version(),
                   cudnn_enabled=torch.backends.cudnn.enabled,
                   cudnn_benchmark=torch.backends.cudnn.benchmark)
        torch.cuda.memory._record_memory_history(max_entries=200000)
    t0 = time.time()
    results = []
    for name in CASES:
        for dtype_name in DTYPES:
            if time.time() - t0 > a.budget:
                print(f"budget spent before {name} {dtype_name}", flush=True)
                break
            results.append(run_case(name, dtype_name, cuda))
            r = results[-1]
            sizes = [e["size"] for e in r.get("forward", []) + r.get("backward", [])
                     if e["action"] == "alloc"]
            print(f"{name} {dtype_name}: {len(sizes)} allocations {sizes[:12]}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
    with open(os.path.join(a.outdir, "litgpt_qkv_conv.json"), "w") as f:
        json.dump({"env": env, "cases": results}, f, indent=1)
    print(f"wrote {len(results)} cases in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
