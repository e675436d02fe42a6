#!/usr/bin/env python3
"""Measures FSDP2 (`fully_shard`) training steps on ONE CUDA GPU standing in for rank 0 of a
job of N ranks, for memsim's FSDP2 model (sim/parallel/fsdp2.h, docs/fsdp2.md).

    python3 tools/gpu/measure_fsdp2.py OUT_DIR [--budget SECONDS] [--only NAME|GLOB...]
                                       [--per-run SECONDS] [--list] [--save-torch-sources]
                                       [--s10] [--self-test]

RUNS (measured, tests/data/gpu/fsdp2/fsdp2_runs.json) then RUNS_S10 (the compositions over
FSDP2 prepared in session 10, not yet measured: tools/gpu/fsdp2_compose.py; --s10 selects
them alone). --per-run, when given, is every run's timeout; else 45 s for RUNS and each
RUNS_S10 run's own (the compiled ones 120 s).

Each configuration (RUNS below) runs in its own Python process (a fresh caching allocator
and CUDA context) with a per-run timeout; a failing run is recorded with its stderr and
the next one runs; no run is started once --budget seconds are spent. The parent writes
OUT_DIR/fsdp2_runs.json (every result and failure) and OUT_DIR/fsdp2_snapshots.tar.xz
(torch.cuda.memory._snapshot() of each run, frames cut to model / FSDP / optimizer code).
--save-torch-sources also packs the installed torch's torch/distributed/fsdp/_fully_shard
and the fake process group into OUT_DIR/torch_fsdp2_sources.tar.xz, for reading the exact
code that ran (not for committing).

One process = rank 0 of a world of N: PyTorch's fake process group
(torch.testing._internal.distributed.fake_pg, backend "fake"; in torch 2.11 the C++
c10d::FakeProcessGroup) initialises a world of N with this process as rank 0; its
collectives launch no communication (all_gather_into_tensor / reduce_scatter_tensor copy
this rank's chunk into the output in place, all_reduce does nothing) and allocate nothing.
FSDP2 itself runs unchanged: it shards every parameter over the mesh (rank 0 keeps
chunk 0), allocates its all-gather and reduce-scatter buffers on its own streams, and
frees them at the points its Python code decides. docs/fsdp2.md ("Measuring FSDP2 on one
GPU") says why that is rank 0's memory and what differs from a real NCCL job.

The training loop is tools/gpu/measure_cuda.py's (memsim's default script,
sim/step/training_script.h): the model built on the GPU in module order (or on the meta
device and materialised by to_empty after sharding: the "meta" runs), fully_shard on each
decoder block and then on the root (torchtitan's apply_fsdp), AdamW(foreach=True) over the
sharded parameters, the batch (ids then labels), one warm-up step, then the measured step
    zero_grad(set_to_none=True); logits = model(ids); loss = loss(logits, labels);
    loss.backward(); opt.step()
with reset_peak_memory_stats() before it; memory history is recorded from before the model
is built (after the process group and mesh exist: their set-up is recorded as the mark
"after_mesh").

Model: tools/fixtures/torch_models.DecoderForCausalLM as memsim's llama row (HF
LlamaForCausalLM v4.45, eager attention; no q/k/v/o or MLP biases), at a size where the
sharded model state and the gathered blocks both matter next to the activations.
memsim's scenario of each run is tests/data/gpu/fsdp2/NAME.yaml and its blind prediction
tests/data/gpu/fsdp2_predictions.json (both written by tools/gpu/predict_fsdp2.py before
anything was measured); tests/test_gpu_fsdp2_runs.cpp compares them once the
measurement is committed as tests/data/gpu/fsdp2/fsdp2_runs.json.

Without CUDA (a dry run on a CPU machine: /usr/bin/python3 with torch 1.13 here) --list
works, and each run executes the same code on a tiny model on the CPU with the parts
this torch lacks refused by name: no fake process group / fully_shard (torch < 2.6) means
the model is trained unsharded and the result says "dry_run" with what was skipped; no
memory figures are recorded.
"""
import argparse
import contextlib
import os
import sys
import tarfile
import time
import traceback

import gpu_common
import fsdp2_compose as fc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

DATA = "tests/data/gpu/fsdp2"  # memsim's scenario of each run (NAME.yaml)

# --------------------------------------------------------------------------- configs
# Llama shape (d_model 2048, 16 heads, 8 KV heads, d_ff 5632: LLaMA-1B-like blocks), 4
# blocks, vocab 32000, batch 2 x 1024 tokens. Per block 46.1 M parameters (184.5 MB fp32,
# 23.1 MB per rank of 8), embeddings and LM head 65.5 M each: the root's gathered
# parameters (524 MB fp32) and a gathered block (184.5 MB, plus its flat all-gather
# buffer) stand next to the activations (eager attention: 2 x 16 x 1024 x 1024 scores).
SHAPE = dict(layers=4, d_model=2048, heads=16, kv_heads=8, d_ff=5632, vocab=32000,
             context=1024, seq=1024, batch=2, dropout=0.0)
# The stand-in's llama row without the fixture row's biases (HF Llama's defaults).
LLAMA_KNOBS = dict(qkv_bias=False, o_bias=False, mlp_bias=False)
LLAMA_PLACEMENT = dict(attn_rope_buffer=False)  # measure_cuda.ARCH_ROWS' llama placement


def spec(name, world=8, replicate=1, dtype="fp32", param_dtype=None, reduce_dtype=None,
         reshard="true", policy="none", init="gpu", why=""):
    """One run. reshard: "true" | "false" | an integer N (reshard_after_forward=N);
    param_dtype / reduce_dtype: MixedPrecisionPolicy's (None: no policy); init: "gpu"
    (built on the GPU, then fully_shard) | "meta" (built on the meta device, fully_shard,
    then model.to_empty(device="cuda"): memsim's parallel.fsdp_init: cpu)."""
    return dict(name=name, kind="fsdp2", family="hf-decoder", arch="llama", impl="standin",
                world=world, replicate=replicate, dtype=dtype, param_dtype=param_dtype,
                reduce_dtype=reduce_dtype, reshard=str(reshard).lower(), policy=policy,
                init=init, optimizer="adamw", opt_impl="foreach", autocast="none",
                attention="eager", warmup=1, cfg=dict(SHAPE), why=why,
                scenario=f"{DATA}/{name}.yaml")


# In the order of their value to memsim (a budget cut drops the last).
RUNS = [
    spec("fsdp2_w8_fp32", why="plain FSDP2: shards, per-block all-gather on the copy-in "
         "stream, copy-out, implicit forward prefetch, backward prefetch, reduce-scatter "
         "output on its stream"),
    spec("fsdp2_w8_bf16_reduce_fp32", param_dtype="bf16", reduce_dtype="fp32",
         why="torchtitan's MixedPrecisionPolicy: flat bf16 copy-in buffer, bf16 "
         "unsharded parameters and activations, fp32 reduce-scatter input"),
    spec("fsdp2_w8_fp32_noreshard", reshard="false",
         why="reshard_after_forward=False: every block stays gathered from its forward "
         "to its backward"),
    spec("hsdp_r2_s4_fp32", replicate=2,
         why="HSDP on a (2, 4) mesh: shards over 4, the reduce-scatter output kept in "
         "_all_reduce_state until the end of backward"),
    spec("hsdp_r2_s4_bf16", replicate=2, param_dtype="bf16",
         why="HSDP with MixedPrecisionPolicy(param_dtype=bf16): the bf16 reduce-scatter "
         "output kept for the all-reduce, the fp32 gradient cast on the all-reduce stream"),
    spec("fsdp2_w8_fp32_reshard2", reshard=2,
         why="reshard_after_forward=2: a clone of 1/2 of each gathered parameter kept "
         "from forward to backward"),
    spec("fsdp2_w8_bf16_reduce_fp32_fullac", param_dtype="bf16", reduce_dtype="fp32",
         policy="full", why="full activation checkpointing of every block under FSDP2 "
         "(the recompute runs after the block's pre-backward unshard)"),
    spec("fsdp2_w8_bf16_reduce_fp32_meta", param_dtype="bf16", reduce_dtype="fp32",
         init="meta", why="torchtitan's initialisation: built on the meta device, "
         "fully_shard, to_empty: only the shards ever reach the GPU"),
    spec("fsdp2_w4_fp32", world=4, why="the first run over 4 ranks: shards and the "
         "reduce-scatter output twice as large"),
]

# The session-10 compositions (issue #16), NOT YET MEASURED: autocast over FSDP2, the
# output_dtype policy, per-block torch.compile (with full AC), torchtitan's code and layout
# (eager and compiled, op-level SAC). tools/gpu/fsdp2_compose.py says what each runs; their
# scenarios are tests/data/gpu/fsdp2/NAME.yaml and their blind predictions
# tests/data/gpu/fsdp2_s10_predictions.json (tools/gpu/predict_fsdp2_s10.py). --s10 selects
# them alone; by default they run after RUNS.
RUNS_S10 = fc.runs_s10(spec)

# Rough seconds per run on an H100 (a fresh Python + torch import, CUDA context, fake
# process group and mesh, build, fully_shard, two steps, snapshot).
EST_SECONDS = 9.0


def estimate(sp):
    if sp.get("s10"):
        return sp["est"]
    return EST_SECONDS + (2.0 if sp["policy"] == "full" else 0.0)


# --------------------------------------------------------------------------- helpers
def standin_cfg(sp):
    """The stand-in's cfg (torch_models.DecoderForCausalLM) for the run's shape."""
    saved = None
    try:
        import torch
        saved = torch.clear_autocast_cache
    except Exception:
        pass
    import gen_arch_fixtures as ga
    if saved is not None:  # importing gen_checkpoint_fixtures wraps it (for CPU autocast)
        torch.clear_autocast_cache = saved
    cfg = ga.row("llama", dict(sp["cfg"]), arch_over=dict(LLAMA_KNOBS))
    cfg["arch_hf"] = dict(cfg["arch_hf"], **LLAMA_PLACEMENT)
    return cfg


stats = gpu_common.memory_stats  # the common keys (gpu_common.STEP_STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from model, loop, FSDP and optimizer code (at most 6); for
    RUNS_S10 also torchtitan's stand-in, the compositions' loop and Inductor's code."""
    return gpu_common.trim_frames(
        snapshot, ("torch_models", "measure_fsdp2", "_fully_shard", "optim", "checkpoint",
                   "impl_models", "fsdp2_compose", "torchinductor", "_inductor/"), 6)


def dtype_of(torch, name):
    return {None: None, "fp32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[name]


def fsdp2_api(torch):
    """(fully_shard, MixedPrecisionPolicy, init_device_mesh, FakeStore) or the reason
    this torch cannot run FSDP2 on a fake process group."""
    # (Not only ImportError: torch 1.13's torch.distributed.fsdp fails to import on Python
    # 3.11 with a dataclass ValueError.)
    try:
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    except Exception:
        try:  # torch 2.4 / 2.5 kept it under _composable
            from torch.distributed._composable.fsdp import fully_shard, MixedPrecisionPolicy
        except Exception as e:
            return None, f"torch {torch.__version__} has no fully_shard (FSDP2): {e!r}"[:300]
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except Exception as e:
        return None, f"torch {torch.__version__} has no fake process group / device mesh ({e})"
    return (fully_shard, MixedPrecisionPolicy, init_device_mesh, FakeStore), None


def make_mesh(torch, dist, api, sp, device_type):
    """The fake world of sp["world"] ranks (this process is rank 0) and the FSDP mesh:
    (world,) or, for HSDP, (replicate, world / replicate)."""
    _, _, init_device_mesh, FakeStore = api
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=sp["world"])
    if sp["replicate"] > 1:
        shape = (sp["replicate"], sp["world"] // sp["replicate"])
        return init_device_mesh(device_type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    return init_device_mesh(device_type, (sp["world"],), mesh_dim_names=("dp_shard",))


def fsdp_kwargs(torch, api, sp, mesh):
    _, MixedPrecisionPolicy, _, _ = api
    kw = dict(mesh=mesh)
    r = sp["reshard"]
    kw["reshard_after_forward"] = True if r == "true" else False if r == "false" else int(r)
    if sp["param_dtype"] or sp["reduce_dtype"]:
        mp = dict(param_dtype=dtype_of(torch, sp["param_dtype"]),
                  reduce_dtype=dtype_of(torch, sp["reduce_dtype"]))
        if sp.get("output_dtype"):  # RUNS_S10: Accelerate >= 1.8's policy
            mp["output_dtype"] = dtype_of(torch, sp["output_dtype"])
        kw["mp_policy"] = MixedPrecisionPolicy(**mp)
    return kw


def apply_fsdp(torch, api, sp, model, mesh, blocks=None):
    """torchtitan's apply_fsdp: fully_shard(block, reshard_after_forward=...) for every
    block, then fully_shard(model) with reshard_after_forward left at its default. The
    default (None in recent torch: "auto") keeps the root gathered after forward; an
    explicit True on the root would reshard it in the newer _fsdp_state._lazy_init
    (`if self._auto_reshard_after_forward`), which memsim does not model."""
    fully_shard = api[0]
    kw = fsdp_kwargs(torch, api, sp, mesh)
    for layer in (model.layers if blocks is None else blocks):
        fully_shard(layer, **kw)
    root_kw = {k: v for k, v in kw.items() if k != "reshard_after_forward"}
    fully_shard(model, **root_kw)


def shard_shapes(model):
    """Rank 0's local shard of each parameter (to check memsim's chunk-0 sizes)."""
    out = {}
    for n, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out[n] = [list(local.shape), str(local.dtype).replace("torch.", ""), str(local.device)]
    return out


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    import torch.distributed as dist
    import torch_models as tm
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=not cuda)
    s10 = sp.get("s10", False)  # RUNS_S10 (tools/gpu/fsdp2_compose.py)
    # The llama row's cfg for the stand-in; the plain shape for torch_models.LlamaForCausalLM
    # and impl_models.TitanTransformer.
    row = not s10 or sp["model"] == "standin"
    cfg = standin_cfg(sp) if row else dict(sp["cfg"], tied=False)
    if not cuda:  # dry run: the same code on a model small enough for a CPU
        tiny = dict(sp["cfg"], layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512,
                    context=64, seq=32, batch=2)
        cfg = standin_cfg(dict(sp, cfg=tiny)) if row else dict(tiny, tied=False)
    result["cfg"] = {k: v for k, v in cfg.items() if k != "transformers"}
    api, missing = fsdp2_api(torch)
    if api is None and cuda:
        raise RuntimeError(f"cannot measure FSDP2: {missing}")
    if cuda:
        torch.cuda.set_device(0)
        torch.cuda.init()
        result["gpu"] = torch.cuda.get_device_name()
        result["mem_get_info_at_init"] = list(torch.cuda.mem_get_info())
    mesh = None
    marks = result["marks"] = {}
    if api is not None:
        mesh = make_mesh(torch, dist, api, sp, device.type)
        result["mesh"] = dict(shape=list(mesh.shape), dim_names=list(mesh.mesh_dim_names or ()),
                              backend=dist.get_backend())
    else:
        result["skipped"] = (f"dry run: {missing}; the model is trained unsharded on the CPU "
                             f"(no process group, no fully_shard)")
        print(result["skipped"], file=sys.stderr, flush=True)
    if cuda:
        # What the process group and mesh left on the device (expected: nothing), then the
        # cache emptied so that the recorded history starts from an empty allocator.
        gpu_common.fresh_history(torch, marks)  # the whole run's peaks start here
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    if sp["dtype"] == "bf16":
        torch.set_default_dtype(torch.bfloat16)
    can_ctx = hasattr(torch.device, "__enter__")  # torch >= 2.0
    if sp["init"] == "meta" and can_ctx:
        build_ctx = torch.device("meta")
    elif sp["init"] == "meta":  # the dry run on torch 1.x: built on the CPU instead
        result["skipped_meta"] = f"torch {torch.__version__} has no device context: built on the CPU"
        build_ctx = contextlib.nullcontext()
    else:
        build_ctx = device if can_ctx else contextlib.nullcontext()
    blocks = loss_fn = None
    if s10:
        model, blocks, loss_fn = fc.build(torch, sp, cfg, device, build_ctx, result)
    else:
        with build_ctx:
            model = tm.DecoderForCausalLM(cfg)
    torch.set_default_dtype(default_dtype)
    if not s10 or sp["ac"] == "model":
        tm.set_policy(model, sp["policy"])
    if s10:  # torchtitan's apply_ac and apply_compile, before fully_shard
        try:
            fc.apply_ac_compile(torch, sp, blocks, result)
        except fc.Skip as e:
            if cuda:
                raise
            result.setdefault("skipped_parts", []).append(f"dry run: {e}")
            print(f"dry run: {e}", file=sys.stderr, flush=True)
        if sp["loop"] == "hf-trainer":  # the root computes the loss in its forward
            model = fc.make_loss_in_forward(torch, model, loss_fn)
    result["built_on"] = sorted({str(p.device) for p in model.parameters()})
    if sp["init"] != "meta" or not can_ctx:
        model = model.to(device)  # no-op when built on the device
    result["parameters"] = sum(p.numel() for p in model.parameters())
    marks["after_model"] = stats(torch, cuda)
    titan = s10 and sp["model"] == "torchtitan"
    if api is not None:
        if titan:
            fc.apply_titan_fsdp(api, fsdp_kwargs(torch, api, sp, mesh), model)
        else:
            apply_fsdp(torch, api, sp, model, mesh, blocks=blocks)
        if sp["init"] == "meta":
            model.to_empty(device=device)
        result["shards"] = shard_shapes(model)
    if titan:  # init_weights: freqs_cis recomputed on the device
        import impl_models as im
        fc.init_titan_buffers(torch, im, model, cfg, device)
    model.train()
    marks["after_fully_shard"] = stats(torch, cuda)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    c = cfg
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=device)
    labels = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=device)
    if loss_fn is None:
        loss_fn = tm.decoder_loss(cfg)
    logits = loss = None
    t0 = time.time()
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        if measured:
            marks["measured_step_begin"] = stats(torch, cuda)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        if s10:  # the run's loop: autocast region, loss in forward, del pred
            loss, logits = fc.step_forward_loss(torch, sp, model, loss_fn, ids, labels, device,
                                                marks, measured, stats, cuda)
        else:
            logits = model(ids)
            if measured:
                marks["forward_end"] = stats(torch, cuda)
            loss = loss_fn(logits, labels)
        loss.backward()
        if measured:
            marks["backward_end"] = stats(torch, cuda)
        opt.step()
        if measured:
            marks["optimizer_end"] = stats(torch, cuda)
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if s10 and sp["compile"]:
        result["dynamo_counters"] = fc.dynamo_counters(torch)
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, marks["measured_step_begin"])
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
    if api is not None and dist.is_initialized():
        dist.destroy_process_group()
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


# --------------------------------------------------------------------------- self-test
def self_test():
    """Checks the FSDP2 calls each run makes (mesh, fully_shard order and arguments)
    against stand-ins of torch's API, so that the parts a torch without FSDP2 cannot run
    are still executed here. Exits 1 on a mismatch."""
    import torch
    calls = []

    class Policy:
        def __init__(self, param_dtype=None, reduce_dtype=None, output_dtype=None):
            self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
            self.output_dtype = output_dtype

    class FakeDist:
        def init_process_group(self, backend, store, rank, world_size):
            calls.append(("init_process_group", backend, rank, world_size))

    def init_device_mesh(device_type, shape, mesh_dim_names):
        calls.append(("mesh", device_type, tuple(shape), tuple(mesh_dim_names)))
        return ("mesh", tuple(shape))

    def fully_shard(module, **kw):
        calls.append(("fully_shard", module, kw))

    class Store:
        pass

    api = (fully_shard, Policy, init_device_mesh, Store)

    class Model:
        layers = ["block0", "block1", "block2", "block3"]

    bad = []
    # torchtitan's layout is fsdp2_compose.self_test's (below).
    for sp in RUNS + [s for s in RUNS_S10 if s["model"] != "torchtitan"]:
        calls.clear()
        mesh = make_mesh(torch, FakeDist(), api, sp, "cuda")
        apply_fsdp(torch, api, sp, Model(), mesh)
        shape = (sp["replicate"], sp["world"] // sp["replicate"]) if sp["replicate"] > 1 \
            else (sp["world"],)
        want_reshard = {"true": True, "false": False}.get(sp["reshard"])
        if want_reshard is None:
            want_reshard = int(sp["reshard"])
        ok = calls[0] == ("init_process_group", "fake", 0, sp["world"])
        ok &= calls[1][:3] == ("mesh", "cuda", shape)
        shards = [c for c in calls if c[0] == "fully_shard"]
        ok &= [c[1] for c in shards[:-1]] == Model.layers and isinstance(shards[-1][1], Model)
        for c in shards:
            kw = c[2]
            ok &= kw["mesh"] == ("mesh", shape)
            if c is shards[-1]:  # the root: the default (auto: not resharded)
                ok &= "reshard_after_forward" not in kw
            else:
                ok &= kw["reshard_after_forward"] == want_reshard and \
                    type(kw["reshard_after_forward"]) is type(want_reshard)
            mp = kw.get("mp_policy")
            if sp["param_dtype"]:
                ok &= mp is not None and mp.param_dtype == dtype_of(torch, sp["param_dtype"]) \
                    and mp.reduce_dtype == dtype_of(torch, sp["reduce_dtype"]) \
                    and mp.output_dtype == dtype_of(torch, sp.get("output_dtype"))
            else:
                ok &= mp is None
        if not os.path.exists(os.path.join(REPO, sp["scenario"])):
            print(f"{sp['name']}: no scenario {sp['scenario']} (tools/gpu/predict_fsdp2.py)")
            ok = False
        print(f"{'ok ' if ok else 'BAD'} {sp['name']}: {len(shards)} fully_shard calls, mesh {shape}, "
              f"reshard_after_forward={want_reshard!r}")
        if not ok:
            bad.append(sp["name"])
    bad += fc.self_test(torch, sys.modules[__name__], RUNS_S10)
    cfg = standin_cfg(RUNS[0])
    a = cfg["arch"]
    if a["qkv_bias"] or a["o_bias"] or a["mlp_bias"] or a["head_dim"] != 128:
        bad.append("standin cfg")
    print("self-test:", "FAILED " + ", ".join(bad) if bad else "all runs as intended")
    return 1 if bad else 0


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def save_torch_sources(out_dir):
    """The installed torch's FSDP2 and fake process group sources (for reading only)."""
    try:
        import torch
        root = os.path.dirname(torch.__file__)
        target = os.path.join(out_dir, "torch_fsdp2_sources.tar.xz")
        with tarfile.open(target, "w:xz") as t:
            for rel in ("distributed/fsdp/_fully_shard", "testing/_internal/distributed/fake_pg.py",
                        "distributed/device_mesh.py", "distributed/_tools/fsdp2_mem_tracker.py"):
                p = os.path.join(root, rel)
                if os.path.exists(p):
                    t.add(p, arcname=f"torch-{torch.__version__}/{rel}",
                          filter=lambda ti: None if "__pycache__" in ti.name else ti)
        print(f"torch {torch.__version__} sources -> {target}", flush=True)
    except Exception:
        traceback.print_exc()


def main():
    ap = argparse.ArgumentParser()
    # --per-run: every run's timeout when given; else 45 s for RUNS, each RUNS_S10 run's own.
    gpu_common.add_run_args(ap, budget=100.0, per_run=None)
    ap.add_argument("--save-torch-sources", action="store_true")
    ap.add_argument("--self-test", action="store_true",
                    help="check the FSDP2 calls of every run against stand-ins of the API")
    ap.add_argument("--s10", action="store_true",
                    help="only the RUNS_S10 (not yet measured; --only picks among them)")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test())
    if gpu_common.run_one_if_child(a, RUNS + RUNS_S10, run_one):
        return
    chosen = gpu_common.select_by_name(RUNS_S10 if a.s10 else RUNS + RUNS_S10, a.only)
    # The parent's copies only: a child reads its spec from RUNS / RUNS_S10 by name.
    chosen = [dict(sp, timeout=sp.get("timeout", 45.0)) for sp in chosen]
    total = sum(estimate(sp) for sp in chosen) + 2.0
    if a.list:
        for sp in chosen:
            print(f"{sp['name']:36s} {estimate(sp):5.1f} s  world {sp['world']}"
                  f"{' (replicate %d)' % sp['replicate'] if sp['replicate'] > 1 else ''}"
                  f", reshard {sp['reshard']}, params {sp['dtype']}"
                  f"{', mp %s/%s' % (sp['param_dtype'], sp['reduce_dtype']) if sp['param_dtype'] else ''}"
                  f", AC {sp['policy']}, init {sp['init']}"
                  + (f"; {sp['model']}, loop {sp['loop']}, autocast {sp['autocast']}, compile "
                     f"{sp['compile']}, output_dtype {sp['output_dtype']}" if sp.get("s10") else ""))
        print(f"{len(chosen)} configurations: about {total:.0f} s of runs on an H100 "
              f"(estimate; the machine's start-up comes on top)", flush=True)
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)
    if any(sp.get("compile") for sp in chosen):  # one Inductor cache for every child
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", fc.INDUCTOR_CACHE)
        print(f"TORCHINDUCTOR_CACHE_DIR={os.environ['TORCHINDUCTOR_CACHE_DIR']}", flush=True)
    if a.save_torch_sources:
        save_torch_sources(a.out_dir)

    def report(sp, r):
        print(f"{sp['name']:36s} measured step: alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB; whole run: "
              f"alloc {gib(r.get('whole_run_peak_allocated'))} reserved "
              f"{gib(r.get('whole_run_peak_reserved'))} GiB ({r['process_seconds']:.1f} s)",
              flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, not_run="plain",
                                min_left=lambda sp: max(8.0, 0.6 * estimate(sp)),
                                timeout_note="plain")
    results, failures = gpu_common.run_children(chosen, loop, report)
    try:
        import torch
        versions = dict(torch=torch.__version__, cuda=torch.version.cuda)
    except Exception:
        versions = {}
    try:
        import transformers
        versions["transformers"] = transformers.__version__
    except Exception:
        pass
    gpu_common.finish_parent(
        a.out_dir, "fsdp2", "tools/gpu/measure_fsdp2.py: one GPU as rank 0 of a fake process "
        "group", versions, t_start, results, failures)


if __name__ == "__main__":
    main()
