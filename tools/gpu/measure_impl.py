#!/usr/bin/env python3
"""Measures the other stacks' Llama model code (`model.implementation: torchtitan |
torchtune | litgpt`, docs/implementations.md, issue #16 item 7) on a CUDA GPU: the
committed stand-ins of tools/fixtures/impl_models.py (the code the torch 1.13 CPU
fixtures tests/data/torch_cpu_impl run) at a GPU shape, with each stack's own loop, and
the CUDA kernels the stacks call instead of the CPU emulations.

    python3 tools/gpu/measure_impl.py OUT_DIR [--budget SECONDS] [--per-run SECONDS]
                                      [--only NAME|GLOB...] [--list]

torchtitan, torchtune and LitGPT are not installed on the GPU machine; their code as
memsim models it is the stand-ins (written after torchtitan 5077be6e, torchtune v0.6.1,
LitGPT v0.5.13 + Lightning Fabric 2.6.5: the sources impl_models.py cites).

What the GPU run changes from the CPU fixtures ("native" mode, `go_native` below): the
pieces impl_models.py emulates because torch 1.13 on a CPU lacks them are replaced by
what torch 2.x runs on CUDA:
  * impl_models.flash_sdpa / LitFlashSdpa -> F.scaled_dot_product_attention(q, k, v,
    is_causal=True), called as the stack calls it: torchtune v0.6.1 and LitGPT v0.5.13
    with no backend context (torch's own choice: flash for bf16 on an H100/H200, mem-
    efficient for fp32, which flash does not take), torchtitan 5077be6e inside
    sdpa_kernel([CUDNN_ATTENTION, FLASH, EFFICIENT, MATH], set_priority=True)
    (torchtitan/models/attention.py ScaledDotProductAttentionWrapper: cuDNN first, which
    memsim does not model), and impl_torchtitan_bf16 forced to FLASH_ATTENTION (memsim's
    `model.attention: flash`). Each run records the kernel's autograd node
    ("sdpa_kernels": ScaledDotProduct{Flash,Efficient,Cudnn}AttentionBackward0);
  * impl_models.FusedRMSNorm (torchtitan's nn.RMSNorm) -> torch.nn.RMSNorm (at::
    _fused_rms_norm on CUDA since torch 2.9);
  * _Mean2x (2.x's MeanBackward1 written for 1.13) -> Tensor.mean(-1, keepdim=True);
  * ChunkedOutput (autograd's accumulation of the output weight's 8 grads, emulated) ->
    torchtune's own `[F.linear(chunk, output.weight) for chunk in h.chunk(8, dim=1)]`;
  * lit_repeat_interleave (2.x's unsqueeze/expand/clone written for 1.13) ->
    Tensor.repeat_interleave(n, dim);
  * torchtune's optimizer_in_bwd: Tensor.register_post_accumulate_grad_hook (torchtune
    training/memory.py register_optim_in_bwd_hooks) instead of the 1.13 AccumulateGrad
    post hook.
Everything else (RoPE, repeat_kv / expand, norms, heads, losses, the loops) is the
fixtures' code unchanged.

Loops (as tools/fixtures/gen_impl_fixtures.py, i.e. memsim's model of each stack's loop):
model built on the GPU in the run's dtype (torch.set_default_dtype for bf16, as
torchtune's set_default_dtype and Fabric's init_module do), torch.optim.AdamW(foreach=
True), ids then labels (int64 on the GPU), one warm-up step, then the measured step with
reset_peak_memory_stats() before it:
  torchtitan / torchtune: zero_grad(set_to_none=True); pred = model(ids);
      loss = loss_fn(pred, labels); del pred; loss.backward(); opt.step()
  torchtune optimizer_in_bwd: the same without zero_grad / step (one AdamW per parameter
      stepped and zeroed in its post-accumulate-grad hook)
  litgpt (finetune/full.py): logits = model(ids); loss = chunked_cross_entropy(...);
      (loss / 1).backward(); opt.step()   (logits and loss live until the next step)
torchtitan: after the build the freqs_cis buffer is recomputed (torchtitan's to_empty +
init_weights makes it after every parameter, as memsim emits it); torchtitan on one GPU
without FSDP would run bf16 autocast over fp32 weights (maybe_enable_amp), which memsim
refuses with these rows: the runs are pure fp32 and pure bf16 weights, which memsim
models. LitGPT bf16 runs are Fabric "bf16-true" (.to(bf16) then full.py's
max_seq_length: fp32 cos/sin rebuilt at the batch's length when it is below the block
size), fp32 runs "32-true".

Each configuration runs in its own Python process with a per-run timeout; a failing run is
recorded with its stderr and the next one runs; no run is started after --budget seconds
(each run's timeout is at most what is left). The parent writes OUT_DIR/impl_runs.json
(spec, versions, memory_stats() at the marks, measured-step and whole-run peaks, failures)
and OUT_DIR/impl_snapshots.tar.xz (torch.cuda.memory._snapshot() of each run, frames cut
to the model / loop code).

memsim's scenario of each run: tests/data/gpu/impl/NAME.yaml; its blind predictions:
tests/data/gpu/impl_predictions.json (tools/gpu/predict_impl.py, written before anything
was measured); tests/test_gpu_impl_runs.cpp compares them once the measurement is
committed as tests/data/gpu/impl/impl_runs.json.

Without CUDA (a dry run: /usr/bin/python3 with torch 1.13 on a CPU) each run executes the
same code, native mode included, on a tiny model on the CPU; what that torch lacks is
substituted and named in the result ("substituted": a math SDPA for
F.scaled_dot_product_attention, a composite RMSNorm for nn.RMSNorm, the AccumulateGrad
post hook for register_post_accumulate_grad_hook). No memory figures on the CPU.
"""
import argparse
import contextlib
import os
import sys
import time

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

DATA = "tests/data/gpu/impl"  # memsim's scenario of each run (NAME.yaml)

# --------------------------------------------------------------------------- configs
# measure_cuda.py's LLAMA shape (issue #16's GPU runs).
LLAMA = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000,
             context=1024, seq=1024, batch=4, dropout=0.0)
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512, context=64,
            seq=32, batch=2, dropout=0.0)  # the CPU dry run

LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def spec(name, impl, dtype, why, context=1024, in_backward=False, lora=None, sdpa="default",
         est=10.0, timeout=60.0):
    """One run. impl: torchtitan | torchtune | litgpt; dtype: bf16 | fp32 (the parameters';
    memsim's attention flash for bf16, mem-efficient for fp32); lora: None or dict(rank,
    alpha, targets) (torchtune's lora_llama3, memsim's target names); sdpa: how
    F.scaled_dot_product_attention is called: "default" (no backend context: torchtune's
    and LitGPT's call), "torchtitan" (torchtitan 5077be6e ScaledDotProductAttentionWrapper:
    sdpa_kernel([CUDNN, FLASH, EFFICIENT, MATH], set_priority=True)), "flash" (sdpa_kernel
    (FLASH_ATTENTION): the kernel memsim's scenario names)."""
    cfg = dict(LLAMA, context=context)
    return dict(name=name, impl=impl, dtype=dtype, cfg=cfg, in_backward=in_backward,
                lora=lora, attention="flash" if dtype == "bf16" else "mem-efficient", sdpa=sdpa,
                optimizer="adamw", opt_impl="foreach", warmup=1, est=est, timeout=timeout,
                why=why, scenario=f"{DATA}/{name}.yaml")


# In the order of their value to memsim (a budget cut drops the last).
RUNS = [
    spec("impl_torchtitan_bf16", "torchtitan", "bf16", sdpa="flash",
         why="torchtitan's llama3 code, bf16 weights: nn.RMSNorm's fused kernel, complex "
         "RoPE, SDPA forced to flash (memsim's kernel), cross_entropy(pred.float()), del pred"),
    spec("impl_torchtune_bf16", "torchtune", "bf16", context=8192,
         why="torchtune's llama3 builder (max_seq_len 8192 RoPE cache), bf16: fp32 RMSNorm, "
         "8 output chunks with CEWithChunkedOutputLoss, flash SDPA, del logits"),
    spec("impl_litgpt_bf16", "litgpt", "bf16", context=8192,
         why="LitGPT GPT under Fabric bf16-true, block size 8192: fp32 cos/sin rebuilt at "
         "1024, fused qkv, fp32 RMSNorm saves, chunked_cross_entropy, flash SDPA"),
    spec("impl_torchtune_inbwd_bf16", "torchtune", "bf16", context=8192, in_backward=True,
         why="torchtune's optimizer_in_bwd: one AdamW per parameter stepped in its "
         "post-accumulate-grad hook"),
    spec("impl_torchtune_lora_bf16", "torchtune", "bf16", context=8192,
         lora=dict(rank=8, alpha=16.0, targets=LORA_TARGETS),
         why="torchtune's lora_llama3 (8B_lora_single_device's q, v, output_proj + MLP, "
         "rank 8, alpha 16), adapters bf16, the rest frozen"),
    spec("impl_torchtitan_bf16_titan_sdpa", "torchtitan", "bf16", sdpa="torchtitan",
         why="impl_torchtitan_bf16 with torchtitan's own SDPA backend priority (cuDNN "
         "attention first): which kernel an H200 runs and what it costs; memsim models flash"),
    spec("impl_torchtitan_fp32", "torchtitan", "fp32", sdpa="torchtitan",
         why="torchtitan's llama3 code, fp32 weights, torchtitan's SDPA priority (cuDNN and "
         "flash take no fp32: mem-efficient)"),
    spec("impl_litgpt_fp32", "litgpt", "fp32",
         "LitGPT under Fabric 32-true, block size 1024 = the batch's: fp32 buffers kept, "
         "mem-efficient SDPA (without GQA SDPA would keep the whole qkv; here GQA)"),
]


# --------------------------------------------------------------------------- helpers
stats = gpu_common.memory_stats  # the common keys (gpu_common.STEP_STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from the model code, the loop and the optimizer (at most 6)."""
    return gpu_common.trim_frames(
        snapshot, ("impl_models", "torch_models", "measure_impl", "optim", "functional.py",
                   "normalization.py"), 6)


def math_sdpa(torch, q, k, v):
    """The dry run's stand-in for F.scaled_dot_product_attention(is_causal=True) (torch
    1.13 has none): softmax(q k^T / sqrt(hd) + causal mask) v."""
    S = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def go_native(torch, im, sp, result):
    """Replaces impl_models' CPU emulations by the CUDA kernels torch 2.x runs (see the
    module docstring), the SDPA call in the run's backend context. Records what was
    replaced, on a torch without an API what stood in for it, and the SDPA kernel's
    autograd node of the first call ("sdpa_kernels")."""
    import torch.nn as nn
    import torch.nn.functional as F
    subst = result.setdefault("substituted", [])
    native = result.setdefault("native", [])
    kernels = result.setdefault("sdpa_kernels", [])  # the SDPA backward nodes seen
    backend_ctx = sdpa_backend_context(torch, sp, result)

    if hasattr(F, "scaled_dot_product_attention"):
        def sdpa(q, k, v):
            with backend_ctx():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if out.grad_fn is not None and len(kernels) < 1:
                kernels.append(kernel_node_name(out.grad_fn))
            return out
        native.append("F.scaled_dot_product_attention(is_causal=True)")
    else:
        def sdpa(q, k, v):
            out = math_sdpa(torch, q, k, v)
            if out.grad_fn is not None and len(kernels) < 1:
                kernels.append(kernel_node_name(out.grad_fn))
            return out
        subst.append(f"math SDPA for F.scaled_dot_product_attention (torch {torch.__version__})")

    class NativeLitSdpa:
        @staticmethod
        def apply(q, k, v):
            return sdpa(q, k, v), None

    im.flash_sdpa = sdpa
    im.LitFlashSdpa = NativeLitSdpa

    if hasattr(nn, "RMSNorm"):
        im.FusedRMSNorm = lambda dim, eps=1e-5: nn.RMSNorm(dim, eps=eps)
        native.append("nn.RMSNorm")
    else:
        class CompositeRMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-5):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(dim))
                self.eps = eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        im.FusedRMSNorm = CompositeRMSNorm
        subst.append(f"composite RMSNorm for nn.RMSNorm (torch {torch.__version__})")

    class NativeMean:
        @staticmethod
        def apply(x):
            return x.mean(-1, keepdim=True)

    im._Mean2x = NativeMean

    class NativeChunkedOutput:
        @staticmethod
        def apply(h, w, n):  # torchtune: [self.output(chunk) for chunk in h.chunk(n, dim=1)]
            return tuple(F.linear(chunk, w) for chunk in h.chunk(n, dim=1))

    im.ChunkedOutput = NativeChunkedOutput
    im.lit_repeat_interleave = lambda x, n, dim=1: x.repeat_interleave(n, dim=dim)
    native += ["Tensor.mean", "torchtune chunked F.linear", "Tensor.repeat_interleave"]


def kernel_node_name(node):
    """The autograd node of the SDPA kernel that ran (ScaledDotProductFlashAttention
    Backward0, ...Efficient..., ...Cudnn..., or the math ops' nodes), looking through up to
    three view nodes."""
    first = type(node).__name__
    for _ in range(4):
        if node is None:
            break
        name = type(node).__name__
        if "Attention" in name:
            return name
        nxt = getattr(node, "next_functions", ())
        node = nxt[0][0] if nxt else None
    return first


def sdpa_backend_context(torch, sp, result):
    """A factory of the context the SDPA call runs in (spec "sdpa"); nothing on a CPU."""
    result["sdpa_call"] = sp["sdpa"]
    if sp["sdpa"] == "default" or not torch.cuda.is_available():
        return contextlib.nullcontext
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: the flag context (no priority order)
        flash = sp["sdpa"] == "flash"
        result["sdpa_call"] += " (torch.backends.cuda.sdp_kernel: no priority)"
        return lambda: torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=not flash,
                                                      enable_mem_efficient=not flash)
    if sp["sdpa"] == "flash":
        return lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    order = [getattr(SDPBackend, n) for n in ("CUDNN_ATTENTION", "FLASH_ATTENTION",
                                              "EFFICIENT_ATTENTION", "MATH")
             if hasattr(SDPBackend, n)]
    try:
        sdpa_kernel(order, set_priority=True)  # a context manager: nothing runs until entered
        return lambda: sdpa_kernel(order, set_priority=True)
    except TypeError:  # a torch without set_priority
        result["sdpa_call"] += " (no set_priority in this torch)"
        return lambda: sdpa_kernel(order)


def build_model(torch, im, sp, cfg, device, result):
    """The stack's model on the device, in the run's dtype."""
    dtype = torch.bfloat16 if sp["dtype"] == "bf16" else torch.float32
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    old = torch.get_default_dtype()
    # torchtune: set_default_dtype(dtype) around the builder; Fabric bf16-true:
    # init_module makes the parameters in bf16; torchtitan: parameters in their dtype.
    torch.set_default_dtype(dtype)
    try:
        with dev_ctx:
            if sp["impl"] == "torchtitan":
                model = im.TitanTransformer(dict(cfg))
            elif sp["impl"] == "litgpt":
                model = im.LitGPT(dict(cfg))
            elif sp["lora"]:
                model = im.TuneLoraDecoder(dict(cfg, lora_rank=sp["lora"]["rank"],
                                                lora_alpha=sp["lora"]["alpha"],
                                                lora_targets=sp["lora"]["targets"]))
            else:
                model = im.TuneDecoder(dict(cfg))
    finally:
        torch.set_default_dtype(old)
    # Built on the device (torch >= 2.0's device context; the dry run's device is the CPU):
    # no .to(device), which would also run LitGPT's max_seq_length before the cast.
    if sp["impl"] == "litgpt":  # fabric.setup's convert_module, then full.py's max_seq_length
        with (device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()):
            model = model.to(dtype)
        if model.cos.device.type != device.type:  # torch 1.13: lit_rope_cache builds on the CPU
            model.cos, model.sin = model.cos.to(device), model.sin.to(device)
    if sp["impl"] == "torchtitan":  # init_weights: freqs_cis recomputed after every parameter
        with (device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()):
            fc = im.titan_freqs_cis(cfg["d_model"] // cfg["heads"], cfg["seq"])
        model.register_buffer("freqs_cis", fc.to(device), persistent=False)
    result["buffers"] = {n: [str(b.dtype), list(b.shape)] for n, b in model.named_buffers()}
    result["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    return model


def optimizer_in_backward(torch, params, make, result):
    """torchtune training/memory.py register_optim_in_bwd_hooks: one optimizer per
    parameter, `optim.step(); optim.zero_grad()` in the parameter's post-accumulate-grad
    hook. Returns the optimizers and what keeps the hooks alive."""
    optims = {p: make([p]) for p in params if p.requires_grad}
    keep = []
    for p, o in optims.items():
        if hasattr(p, "register_post_accumulate_grad_hook"):
            def hook(_param, o=o):
                o.step()
                o.zero_grad(set_to_none=True)
            keep.append(p.register_post_accumulate_grad_hook(hook))
        else:  # torch < 2.1: the AccumulateGrad node's post hook (gen_impl_fixtures.py)
            def hook(*_args, o=o):
                o.step()
                o.zero_grad(set_to_none=True)
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(hook)
            keep.append(acc)
    if optims and not hasattr(next(iter(optims)), "register_post_accumulate_grad_hook"):
        result.setdefault("substituted", []).append(
            "AccumulateGrad post hook for register_post_accumulate_grad_hook")
    return optims, keep


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    import impl_models as im
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device))
    if not cuda:  # dry run: the same code on a model small enough for a CPU
        sp = dict(sp, cfg=dict(TINY, context=64 if sp["cfg"]["context"] > 1024 else 32))
    cfg = sp["cfg"]
    if cuda:
        torch.cuda.init()
        result["gpu"] = torch.cuda.get_device_name()
        result["cuda_version"] = torch.version.cuda
        result["mem_get_info_at_init"] = list(torch.cuda.mem_get_info())
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=2_000_000)
    marks = result["marks"] = {}
    go_native(torch, im, sp, result)
    torch.manual_seed(0)
    model = build_model(torch, im, sp, cfg, device, result)
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    marks["after_model"] = stats(torch, cuda)

    def make(ps):
        return torch.optim.AdamW(ps, lr=1e-5, foreach=True)

    in_bwd = sp["in_backward"]
    if in_bwd:
        optims, _keep = optimizer_in_backward(torch, list(model.parameters()), make, result)
        opt = None
    else:
        opt = make([p for p in model.parameters() if p.requires_grad])
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    labels = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    if sp["impl"] == "torchtitan":
        loss_fn = im.titan_loss
    elif sp["impl"] == "litgpt":
        loss_fn = im.lit_loss
    else:  # the recipe's ignore_labels_cache, on the device
        dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
        with dev_ctx:
            loss_fn = im.TuneLoss(dict(cfg))
    marks["after_setup"] = stats(torch, cuda)
    logits = loss = None  # litgpt's loop: both live until the next step rebinds them
    step_seconds = []
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        t_step = time.time()
        if measured:
            marks["measured_step_begin"] = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        if not in_bwd:  # the recipe never zeroes (its hooks did)
            opt.zero_grad(set_to_none=True)
        if sp["impl"] == "litgpt":
            logits = model(ids)
        else:
            pred = model(ids)
        if measured:
            marks["forward_end"] = stats(torch, cuda)
        if sp["impl"] == "litgpt":
            loss, scaled = loss_fn(logits, labels)
        else:
            loss = scaled = loss_fn(pred, labels)
            del pred  # torchtitan's train.py, torchtune's recipe: before backward
        if measured:
            marks["loss_end"] = stats(torch, cuda)
        scaled.backward()
        del scaled
        if measured:
            marks["backward_end"] = stats(torch, cuda)
        if not in_bwd:
            opt.step()
        if measured:
            marks["optimizer_end"] = stats(torch, cuda)
        if cuda:
            torch.cuda.synchronize()
        step_seconds.append(round(time.time() - t_step, 3))
    result["loss"] = float(loss)
    result["step_seconds"] = step_seconds
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, marks["measured_step_begin"])
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result, default=str)
    return result


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=90.0)
    a = ap.parse_args()
    if gpu_common.run_one_if_child(a, RUNS, run_one):
        return
    chosen = gpu_common.select_by_name(RUNS, a.only)
    total = sum(sp["est"] for sp in chosen)
    if a.list:
        for sp in chosen:
            extra = [sp["dtype"], sp["attention"], f"context {sp['cfg']['context']}"]
            if sp["in_backward"]:
                extra.append("optimizer in backward")
            if sp["lora"]:
                extra.append(f"LoRA r{sp['lora']['rank']} {'/'.join(sp['lora']['targets'])}")
            print(f"{sp['name']:28s} {sp['est']:5.1f} s (timeout {sp['timeout']:.0f} s)  "
                  f"{sp['impl']}: {', '.join(extra)}")
        print(f"{len(chosen)} configurations: about {total:.0f} s of runs on an H200 "
              f"(estimate, each a fresh Python process)", flush=True)
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)

    def report(sp, r):
        print(f"{sp['name']:28s} measured step: alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB; whole run: "
              f"alloc {gib(r.get('whole_run_peak_allocated'))} reserved "
              f"{gib(r.get('whole_run_peak_reserved'))} GiB; loss {r.get('loss'):.3f}; "
              f"steps {r.get('step_seconds')} s ({r['process_seconds']:.1f} s)"
              + (f"; substituted: {r['substituted']}" if r.get("substituted") else ""),
              flush=True)

    loop = gpu_common.ChildLoop(  # no run outlives the budget
        os.path.abspath(__file__), a.out_dir, a.budget, t_start, per_run=a.per_run,
        min_left=lambda sp: min(sp["est"], 6.0))
    results, failures = gpu_common.run_children(chosen, loop, report)
    versions = {}
    try:
        import torch
        versions = dict(torch=torch.__version__, cuda=torch.version.cuda)
    except Exception:
        pass
    versions["transformers"] = "not used (stand-ins only)"
    versions["peft"] = "not used (stand-ins only)"
    gpu_common.finish_parent(
        a.out_dir, "impl", "tools/gpu/measure_impl.py: torchtitan / torchtune / LitGPT Llama "
        "stand-ins (tools/fixtures/impl_models.py) with CUDA kernels", versions, t_start,
        results, failures)


if __name__ == "__main__":
    gpu_common.run_main(main)
