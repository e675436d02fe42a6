#!/usr/bin/env python3
"""Measures real training steps on a CUDA GPU, for memsim's accuracy tests.

Run on a machine with a GPU and PyTorch 2.x (memsim's developers ran it on a lent H100):

    python3 tools/gpu/measure_cuda.py OUT_DIR [--budget SECONDS] [--only NAME...]

Each configuration runs in its own Python process (a fresh caching allocator and CUDA
context), with torch.cuda.memory._record_memory_history on from before the model is
built, and the training loop memsim assumes by default (sim/training_script.h): the
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

Without CUDA (a dry run of the script on a CPU machine) it runs the same code on the
CPU and records no memory figures.
"""
import argparse
import contextlib
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
import traceback

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
    return s


# --------------------------------------------------------------------------- one run
def stats(torch, cuda):
    if not cuda:
        return {}
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
            "reserved_bytes.all.current", "reserved_bytes.all.peak",
            "requested_bytes.all.current", "requested_bytes.all.peak",
            "num_alloc_retries", "num_ooms", "segment.all.current")
    return {k: st.get(k) for k in keys}


def trim_frames(snapshot):
    """Keeps each entry's frames from model, loop and optimizer code only (at most 4)."""
    keep = ("torch_models", "measure_cuda", "transformers", "optim", "checkpoint")

    def cut(frames):
        return [f for f in frames if any(k in f.get("filename", "") for k in keep)][:4]

    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = cut(e["frames"])
    for seg in snapshot.get("segments", []):
        for b in seg.get("blocks", []):
            if "frames" in b:
                b["frames"] = cut(b["frames"])
    return snapshot


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
    if cuda:
        torch.cuda.init()
        free0, total = torch.cuda.mem_get_info()
        result["gpu"] = torch.cuda.get_device_name()
        result["mem_get_info_at_init"] = [free0, total]
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=2_000_000)
        free1, _ = torch.cuda.mem_get_info()
        result["mem_get_info_after_history"] = [free1, total]
    torch.manual_seed(0)
    build = build_standin if sp["impl"] == "standin" else build_transformers
    default_dtype = torch.get_default_dtype()
    if sp["dtype"] == "bf16":  # as from_pretrained(torch_dtype=bfloat16): built in bf16
        torch.set_default_dtype(torch.bfloat16)
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model, forward, loss_fn = build(torch, sp, device)
    torch.set_default_dtype(default_dtype)
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
    logits = loss = None
    t0 = time.time()
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        if measured:
            result["marks"]["measured_step_begin"] = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        with region():
            logits = forward(model, ids, labels)
            if measured:
                result["marks"]["forward_end"] = stats(torch, cuda)
            loss = loss_fn(logits, labels)
        loss.backward()
        if measured:
            result["marks"]["backward_end"] = stats(torch, cuda)
        opt.step()
        if measured:
            result["marks"]["optimizer_end"] = stats(torch, cuda)
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        torch.cuda.synchronize()
        result["measured_step_peak_allocated"] = torch.cuda.max_memory_allocated()
        result["measured_step_peak_reserved"] = torch.cuda.max_memory_reserved()
        free2, total = torch.cuda.mem_get_info()
        result["mem_get_info_at_end"] = [free2, total]
        # Device memory in use that the caching allocator did not reserve: the CUDA
        # context, its lazily loaded kernels and library handles.
        result["outside_allocator_at_end"] = (total - free2) - torch.cuda.memory_reserved()
        snap = trim_frames(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(os.path.join(out_dir, sp["name"] + ".pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=4)
        tr = snap["device_traces"][0] if snap.get("device_traces") else []
        result["trace_entries"] = len(tr)
    with open(os.path.join(out_dir, sp["name"] + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


# --------------------------------------------------------------------------- driver
def gib(x):
    return "-" if x is None else f"{x / 2**30:8.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for all runs")
    ap.add_argument("--per-run", type=float, default=90.0)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    specs = all_specs()
    if a.one:
        sp = next(s for s in specs if s["name"] == a.one)
        run_one(sp, a.out_dir)
        return
    t_start = time.time()
    try:
        subprocess.run(["nvidia-smi"], check=False)
    except OSError:
        print("no nvidia-smi: a dry run on the CPU", flush=True)
    results, failures = [], {}
    for sp in specs:
        if a.only and sp["name"] not in a.only:
            continue
        left = a.budget - (time.time() - t_start)
        if left < 15:
            failures[sp["name"]] = "not run: budget spent"
            continue
        try:
            p = subprocess.run([sys.executable, __file__, a.out_dir, "--one", sp["name"]],
                               capture_output=True, text=True, timeout=min(a.per_run, left))
            if p.returncode != 0:
                failures[sp["name"]] = p.stderr[-3000:]
                print(f"FAILED {sp['name']}: {p.stderr[-600:]}", flush=True)
                continue
            with open(os.path.join(a.out_dir, sp["name"] + ".json")) as f:
                r = json.load(f)
            results.append(r)
            print(f"{sp['name']:58s} peak alloc {gib(r.get('measured_step_peak_allocated'))} "
                  f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB "
                  f"({time.time() - t_start:5.1f} s)", flush=True)
        except subprocess.TimeoutExpired:
            failures[sp["name"]] = "timeout"
            print(f"TIMEOUT {sp['name']}", flush=True)
    with open(os.path.join(a.out_dir, "cuda_runs.json"), "w") as f:
        json.dump({"results": results, "failures": failures}, f, indent=1)
    pickles = [r["spec"]["name"] + ".pickle" for r in results
               if os.path.exists(os.path.join(a.out_dir, r["spec"]["name"] + ".pickle"))]
    if pickles:
        with tarfile.open(os.path.join(a.out_dir, "snapshots.tar.xz"), "w:xz") as t:
            for p in pickles:
                t.add(os.path.join(a.out_dir, p), arcname=p)
        for p in pickles:
            os.remove(os.path.join(a.out_dir, p))
    for r in results:
        os.remove(os.path.join(a.out_dir, r["spec"]["name"] + ".json"))
    print(f"{len(results)} runs, {len(failures)} failed or skipped, "
          f"{time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
