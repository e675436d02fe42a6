#!/usr/bin/env python3
"""Measures torch's context parallelism (ring attention under FSDP2) and torchtitan's
op-level selective checkpointing with SDPA on ONE CUDA GPU, for memsim's models of
`parallel.context: N` (graph/ops/ops_ring.h, sim/step/context_parallel_buffers.h,
docs/torchtitan-recipes.md "Context parallelism") and `checkpoint.policy: sac-op` with the
flash kernel (its SDPA rule: the kernel's output and logsumexp saved).

    python3 tools/gpu/measure_cp.py OUT_DIR [--budget SECONDS] [--per-run SECONDS]
                                    [--only NAME|GLOB...] [--list] [--self-test]

Each configuration (RUNS below) runs in its own Python process (a fresh caching allocator
and CUDA context) with a per-run timeout; a failing run is recorded with its stderr and the
next one runs; no run is started once --budget seconds are spent (each run's timeout is at
most what is left). The parent writes OUT_DIR/cp_runs.json (every result and failure, with
the torch / transformers versions) and OUT_DIR/cp_snapshots.tar.xz
(torch.cuda.memory._snapshot() of each run, frames cut to model / loop / ring / FSDP /
checkpoint code), plus OUT_DIR/torch_cp_sources.tar.xz: the installed torch's
torch/distributed/tensor/experimental/_context_parallel/ (and _attention.py), for reading
what ran (not for committing).

The context-parallel runs ("cp_*"): one process is rank 0 of a fake world of 8
(torch.testing._internal.distributed.fake_pg, as tools/gpu/measure_fsdp2.py: collectives
launch no communication and allocate nothing; the values are garbage, the allocations
real). torchtitan's layout (torchtitan/models/llama3/infra/parallelize.py,
torchtitan/distributed/utils.py create_context_parallel_ctx, train.py
forward_backward_step): a (dp_shard, cp) = (8/N, N) device mesh; fully_shard on each block
and then the root over the flattened dp_shard x cp mesh (8 ranks) with
MixedPrecisionPolicy(bf16, fp32); `set_rotate_method(ROTATE)` (memsim's
parallel.context_rotate); per step
    with context_parallel(mesh["cp"], buffers=[ids, labels], buffer_seq_dims=[1, 1],
                          no_restore_buffers={ids, labels}):
        logits = model(ids); loss = loss_fn(logits, labels); loss.backward()
then opt.step() outside. N = 1 is the same job without context parallelism (torchtitan
skips the context at degree 1): a 1-D mesh of 8.
The batch tensors stay the dataloader's full (B, S) storage: with no_restore_buffers the
context leaves them resized to the shard (resize_ keeps the storage), so each step begins
with ids.resize_(B, S) (no allocation: the storage still holds B*S int64; every value is
one of the original ids) as memsim's default loop re-shards the same batch every step
(sim/step/schedule.cpp). The storage pointer is recorded before and after to show it.

The SDPA runs ("sdpa_*"): tools/gpu/measure_stacks.py's stacks_sac_op (torchtitan
cfb93265's _apply_op_sac, its save list and mm policy; measure_stacks.apply_sac) on the
same stand-in shape in bf16 with SDPA instead of eager attention, and its pair without
checkpointing; one GPU, no process group.

Model: tools/fixtures/torch_models.LlamaForCausalLM (memsim's hf-llama family: HF
LlamaForCausalLM v4.45) with v4.45's LlamaSdpaAttention path instead of eager attention:
no 4-D mask is built (`_update_causal_mask` returns None for SDPA without padding in
training), and the core is `F.scaled_dot_product_attention(q, k, v, attn_mask=None,
dropout_p=0.0, is_causal=True)` on q (after RoPE) and k / v (after repeat_kv), looked up on
torch.nn.functional at call time so that context_parallel's monkey patch replaces it. In
bf16 on CUDA that is the flash kernel; the steps run under
sdpa_kernel(SDPBackend.FLASH_ATTENTION) to make it explicit (recorded, with the first SDPA
output's autograd node names).

Without CUDA (a dry run on a CPU machine: /usr/bin/python3 with torch 1.13 here) --list
works and each run executes the same code on a tiny model on the CPU, with what this torch
lacks skipped and named in the result ("skipped"): F.scaled_dot_product_attention (< 2.0:
the eager core instead), fully_shard / the fake process group (the model is trained
unsharded), context_parallel (no sharding), create_selective_checkpoint_contexts (the
sac-op run stops). No memory figures are recorded. --self-test checks the mesh layout, the
context_parallel arguments and the op-SAC save list against stand-ins of torch's API.
"""
import argparse
import contextlib
import json
import os
import sys
import tarfile
import time
import traceback

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

DATA = "tests/data/gpu/cp"  # memsim's scenario of each run (NAME.yaml)

# --------------------------------------------------------------------------- configs
# The context-parallel runs: measure_stacks.py's hf-llama stand-in shape with a vocabulary
# of 8192 (so that the loss's logits do not dwarf the ring's buffers) and 2 x 8192 tokens:
# at N = 4 each rank holds L = 2048 tokens; the all-gathered K/V of one SDPA call is
# 2 x B x H x S x hd x 2 B = 64 MiB (H = 16 after repeat_kv, hd = 64). B = 2 also runs
# _split_tensor's contiguous chunk copies of the batch (a reading in memsim's model).
CP_SHAPE = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=8192,
                context=8192, seq=8192, batch=2, dropout=0.0, tied=False)
# The SDPA + sac-op runs: measure_stacks.LLAMA (stacks_sac_op's shape), bf16 parameters.
SAC_SHAPE = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000,
                 context=1024, seq=1024, batch=4, dropout=0.0, tied=False)
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512, context=64,
            seq=32, batch=2, dropout=0.0, tied=False)  # the CPU dry run
WORLD = 8


def cp_spec(name, context, rotate="allgather", est=11.0, why=""):
    return dict(name=name, kind="cp", family="hf-llama", impl="standin", cfg=dict(CP_SHAPE),
                world=WORLD, context=context, data=WORLD // context, rotate=rotate,
                dtype="fp32", param_dtype="bf16", reduce_dtype="fp32", reshard="true",
                policy="none", attention="sdpa", optimizer="adamw", opt_impl="foreach",
                warmup=1, est=est, timeout=60.0, why=why, scenario=f"{DATA}/{name}.yaml")


def sdpa_spec(name, policy, est=9.0, why=""):
    return dict(name=name, kind="sdpa", family="hf-llama", impl="standin", cfg=dict(SAC_SHAPE),
                world=1, context=1, data=1, rotate=None, dtype="bf16", param_dtype=None,
                reduce_dtype=None, reshard=None, policy=policy, attention="sdpa",
                optimizer="adamw", opt_impl="foreach", warmup=1, est=est, timeout=60.0,
                why=why, scenario=f"{DATA}/{name}.yaml")


# In the order of their value to memsim (a budget cut drops the last).
RUNS = [
    cp_spec("cp_w8_c4", 4, why="context parallel 4 x data 2 (all-gather rotation): the batch "
            "sharded in place, the ring's K/V copies, send cat, all-gathered K/V, fp32 "
            "merges, the backward's fp32 accumulators and all-to-all dK/dV"),
    cp_spec("cp_w8_c2", 2, why="context parallel 2 x data 4 (all-gather rotation)"),
    sdpa_spec("sdpa_bf16_sac_op", "sac-op", why="torchtitan's op-level SAC with the flash "
              "kernel: per layer q_proj, v_proj, gate_proj, down_proj outputs and the SDPA "
              "output and logsumexp cached, the rest recomputed"),
    cp_spec("cp_w8_c1", 1, why="the same job without context parallelism (data 8): FSDP2 "
            "with the one-GPU flash kernel, the pair of the cp runs"),
    sdpa_spec("sdpa_bf16_none", "none", why="the pair of the sac-op run without "
              "checkpointing (the flash kernel's saved tensors alone)"),
    cp_spec("cp_w8_c4_alltoall", 4, rotate="alltoall", why="context parallel 4 with the "
            "all-to-all rotation: a received K/V chunk per step instead of the whole "
            "group's K/V"),
]


def estimate(sp):
    return sp["est"]


# --------------------------------------------------------------------------- helpers
stats = gpu_common.memory_stats  # the common keys (gpu_common.STEP_STATS_KEYS)


def trim_frames(snapshot):
    return gpu_common.trim_frames(
        snapshot, ("torch_models", "measure_cp", "_context_parallel", "_attention",
                   "_fully_shard", "optim", "checkpoint", "_functional_collectives"), 6)


class Skip(Exception):
    """This torch cannot run the feature (the dry run records why and stops)."""


def sdpa_available(torch):
    return hasattr(torch.nn.functional, "scaled_dot_product_attention")


class PeakWindows:
    """The most allocated / reserved during each SDPA call of the measured step, next to the
    step's own peaks. A window folds the peak so far into `carry` and resets the allocator's
    peak counters (reset_peak_memory_stats; host-side counters, no synchronisation needed);
    its close reads the peak since then and leaves the counters running, so the step's peak
    is max(carry, the counter). Forward window: around F.scaled_dot_product_attention in
    sdpa_core. Backward window: from the hook on the SDPA output (its gradient is ready, the
    SDPA backward node (under context parallelism the to_local backward, then the ring's)
    is next) to the first hook of q, k, v passed to SDPA (the engine runs repeat_kv's
    reshape of v first after the SDPA backward and DTensor's from_local backwards, by the
    highest sequence number)."""

    def __init__(self, cuda):
        self.cuda = cuda  # torch.cuda (the self-test passes a stand-in)
        self.carry_alloc = self.carry_reserved = 0
        self.calls = {"forward": [], "backward": []}

    def open(self):
        self.carry_alloc = max(self.carry_alloc, self.cuda.max_memory_allocated())
        self.carry_reserved = max(self.carry_reserved, self.cuda.max_memory_reserved())
        self.cuda.reset_peak_memory_stats()

    def close(self, kind):
        self.calls[kind].append([self.cuda.max_memory_allocated(),
                                 self.cuda.max_memory_reserved()])

    def peaks(self):
        return (max(self.carry_alloc, self.cuda.max_memory_allocated()),
                max(self.carry_reserved, self.cuda.max_memory_reserved()))


WINDOWS = None  # a PeakWindows during the measured step of a cp run on CUDA
SDPA_GRAD_FNS = []  # the first SDPA call's autograd node and the nodes under it (names)


def grad_fn_names(t):
    fn = getattr(t, "grad_fn", None)
    if fn is None:
        return []
    return [type(fn).__name__] + [type(n).__name__ for n, _ in fn.next_functions if n is not None]


def flash_only(torch, result):
    """torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) around the steps (memsim
    models the flash kernel: the default choice for bf16 on an H100 / H200, made explicit;
    global flags, so the backward's threads see them too), or a null context where this
    torch has no sdpa_kernel (recorded)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        result["sdpa_forced"] = "sdpa_kernel(SDPBackend.FLASH_ATTENTION)"
        return ctx
    except Exception as e:
        result["sdpa_forced"] = f"not forced: {e!r}"[:200]
        return contextlib.nullcontext()


def sdpa_core(self, query_states, key_states, value_states, attention_mask):
    """transformers v4.45 LlamaSdpaAttention's call without a mask (training, no padding):
    is_causal = causal_mask is None and q_len > 1. F is looked up at call time (the
    context_parallel monkey patch replaces torch.nn.functional.scaled_dot_product_attention)."""
    import torch.nn.functional as F
    w = WINDOWS
    if w is not None:
        w.open()
    out = F.scaled_dot_product_attention(query_states, key_states, value_states,
                                         attn_mask=None, dropout_p=0.0,
                                         is_causal=query_states.shape[2] > 1)
    if not SDPA_GRAD_FNS:
        SDPA_GRAD_FNS.append(grad_fn_names(out))
    if w is not None:
        w.close("forward")
        if out.requires_grad:
            state = {"open": False}

            def opened(g):
                w.open()
                state["open"] = True

            def closed(g):  # the first of q, k, v whose gradient is ready
                if state["open"]:
                    w.close("backward")
                    state["open"] = False

            out.register_hook(opened)
            for t in (query_states, key_states, value_states):
                if t.requires_grad:
                    t.register_hook(closed)
    return out


def make_model_class(torch, tm, use_sdpa):
    """The stand-in with the SDPA path: model() builds no 4-D mask, each attention's core is
    sdpa_core. Without SDPA (torch < 2.0, the dry run) the eager stand-in."""
    if not use_sdpa:
        return tm.LlamaForCausalLM

    class SdpaLlamaForCausalLM(tm.LlamaForCausalLM):
        def model(self, input_ids):
            inputs_embeds = self.embed_tokens(input_ids)
            cache_position = torch.arange(0, inputs_embeds.shape[1], device=inputs_embeds.device)
            position_ids = cache_position.unsqueeze(0)
            hidden_states = inputs_embeds
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
            hidden_states = tm.run_layers(self, self.layers, hidden_states, None, position_ids,
                                          cache_position, position_embeddings)
            self.t.layer(-1, hidden_states)
            return self.norm(hidden_states)

    tm.LlamaAttention.core = sdpa_core  # this process only (each run is its own process)
    return SdpaLlamaForCausalLM


def sdpa_backends(torch):
    out = {}
    for k in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
              "cudnn_sdp_enabled"):
        f = getattr(torch.backends.cuda, k, None)
        if f is not None:
            try:
                out[k] = bool(f())
            except Exception as e:
                out[k] = repr(e)[:100]
    return out


def cp_module(torch):
    """torch's context-parallel module (torch 2.9+: _context_parallel/_attention.py; older:
    experimental/_attention.py) and context_parallel, or the reason it is missing."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except Exception as e:
        return None, None, f"torch {torch.__version__} has no context_parallel: {e!r}"[:300]
    mod = None
    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):
        try:
            import importlib
            mod = importlib.import_module(name)
            if hasattr(mod, "_cp_options"):
                break
        except Exception:
            mod = None
    if mod is None or not hasattr(mod, "_cp_options"):
        return None, None, f"torch {torch.__version__}: no _cp_options in the CP module"
    return mod, context_parallel, None


def cp_options(mod):
    o = mod._cp_options
    return {k: str(getattr(o, k, None)) for k in ("convert_to_f32", "enable_load_balance",
                                                  "rotate_method")}


def set_rotate(mod, rotate):
    """torchtitan's create_context_parallel_ctx: set_rotate_method(cp_rotate_method);
    _cp_options.enable_load_balance stays its default (torchtitan's cp_load_balance True)."""
    if hasattr(mod, "set_rotate_method"):
        mod.set_rotate_method(rotate)
        return "set_rotate_method"
    method = {"allgather": "ALL_GATHER", "alltoall": "ALL_TO_ALL"}[rotate]
    mod._cp_options.rotate_method = getattr(mod._RotateMethod, method)
    return "_cp_options.rotate_method"


def make_meshes(torch, dist, fsdp2_api, sp, device_type, result):
    """The fake world and torchtitan's meshes: (fsdp mesh over 8 ranks, cp mesh or None)."""
    _, _, init_device_mesh, FakeStore = fsdp2_api
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=sp["world"])
    if sp["context"] == 1:
        mesh = init_device_mesh(device_type, (sp["world"],), mesh_dim_names=("dp_shard",))
        result["mesh"] = dict(shape=list(mesh.shape), dim_names=["dp_shard"], fsdp="dp_shard")
        return mesh, None
    world = init_device_mesh(device_type, (sp["data"], sp["context"]),
                             mesh_dim_names=("dp_shard", "cp"))
    cp_mesh = world["cp"]
    try:  # torchtitan: world_mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
        fsdp_mesh = world[("dp_shard", "cp")]._flatten("dp_shard_cp")
        how = "world[('dp_shard','cp')]._flatten('dp_shard_cp')"
    except Exception as e:  # the same 8-rank group as a mesh of its own
        fsdp_mesh = init_device_mesh(device_type, (sp["world"],), mesh_dim_names=("dp_shard_cp",))
        how = f"a separate 1-D mesh of {sp['world']} ({e!r})"[:300]
    result["mesh"] = dict(shape=list(world.shape), dim_names=["dp_shard", "cp"], fsdp=how,
                          fsdp_size=fsdp_mesh.size(), cp_size=cp_mesh.size(),
                          cp_local_rank=cp_mesh.get_local_rank(), backend=dist.get_backend())
    return fsdp_mesh, cp_mesh


def apply_fsdp(fsdp2_api, torch, sp, model, mesh):
    """torchtitan's apply_fsdp (measure_fsdp2.apply_fsdp): every block, then the root with
    reshard_after_forward left at its default."""
    fully_shard, MixedPrecisionPolicy, _, _ = fsdp2_api
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, None: None}
    kw = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dt[sp["param_dtype"]],
                                                        reduce_dtype=dt[sp["reduce_dtype"]]))
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=True, **kw)
    fully_shard(model, **kw)


def storage_ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return t.storage().data_ptr()


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    global WINDOWS
    import torch
    import torch.distributed as dist
    import torch_models as tm
    import measure_fsdp2 as mf
    import measure_stacks as ms
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device),
                  dry_run=not cuda, skipped_parts=[])
    if not cuda:
        sp = dict(sp, cfg=dict(TINY))
    cfg = sp["cfg"]
    use_sdpa = sdpa_available(torch)
    if not use_sdpa:
        if cuda:
            raise RuntimeError(f"torch {torch.__version__} has no scaled_dot_product_attention")
        result["skipped_parts"].append(f"torch {torch.__version__} has no "
                                       "F.scaled_dot_product_attention: eager core")
    Model = make_model_class(torch, tm, use_sdpa)
    if cuda:
        torch.cuda.set_device(0)
        torch.cuda.init()
        result["gpu"] = torch.cuda.get_device_name()
        result["mem_get_info_at_init"] = list(torch.cuda.mem_get_info())
        result["sdpa_backends"] = sdpa_backends(torch)
    marks = result["marks"] = {}
    fsdp_api, cp_mod, cp_ctx_fn, cp_mesh, fsdp_mesh = None, None, None, None, None
    if sp["kind"] == "cp":
        fsdp_api, missing = mf.fsdp2_api(torch)
        if fsdp_api is None:
            if cuda:
                raise RuntimeError(f"cannot measure FSDP2: {missing}")
            result["skipped_parts"].append(f"{missing}: trained unsharded")
        if sp["context"] > 1:
            cp_mod, cp_ctx_fn, why = cp_module(torch)
            if cp_mod is None:
                if cuda:
                    raise RuntimeError(f"cannot measure context parallelism: {why}")
                result["skipped_parts"].append(f"{why}: no sharding, no ring")
            else:
                result["cp_options_default"] = cp_options(cp_mod)
                result["cp_module"] = cp_mod.__name__
                result["set_rotate_by"] = set_rotate(cp_mod, sp["rotate"])
                result["cp_options"] = cp_options(cp_mod)
        if fsdp_api is not None:
            fsdp_mesh, cp_mesh = make_meshes(torch, dist, fsdp_api, sp, device.type, result)
        if cp_mod is not None and cp_mesh is None and cuda:
            raise RuntimeError("no cp mesh")
    if cuda:
        gpu_common.fresh_history(torch, marks)
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    if sp["dtype"] == "bf16":
        torch.set_default_dtype(torch.bfloat16)
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model = Model(dict(cfg))
    torch.set_default_dtype(default_dtype)
    model = model.to(device)
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    marks["after_model"] = stats(torch, cuda)
    step_ctx = contextlib.nullcontext()
    try:
        if sp["policy"] != "none":
            dropped = ms.apply_sac(torch, model, sp["policy"], result)
            step_ctx, how = ms.early_stop_context(torch, dropped)
            if how:
                result["early_stop_by"] = how
    except ms.Skip as e:
        if cuda:
            raise
        result["skipped"] = f"dry run: {e}"
        print(result["skipped"], file=sys.stderr, flush=True)
        with open(os.path.join(out_dir, sp["name"] + ".json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return result
    if fsdp_api is not None:
        apply_fsdp(fsdp_api, torch, sp, model, fsdp_mesh)
        marks["after_fully_shard"] = stats(torch, cuda)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    B, S = cfg["batch"], cfg["seq"]
    ids = torch.randint(0, cfg["vocab"], (B, S), device=device)
    labels = torch.randint(0, cfg["vocab"], (B, S), device=device)
    batch_ptrs = [storage_ptr(ids), storage_ptr(labels)]
    loss_fn = tm.llama_loss

    def cp_block():
        if cp_ctx_fn is None or cp_mesh is None:
            return contextlib.nullcontext()
        # The dataloader's full batch (see the docstring): no allocation.
        ids.resize_(B, S)
        labels.resize_(B, S)
        return cp_ctx_fn(cp_mesh, buffers=[ids, labels], buffer_seq_dims=[1, 1],
                         no_restore_buffers={ids, labels})

    logits = loss = None
    windows = None
    step_seconds = []
    kernel_ctx = flash_only(torch, result) if cuda else contextlib.nullcontext()
    with step_ctx, kernel_ctx:
        for step in range(sp["warmup"] + 1):
            measured = step == sp["warmup"]
            t_step = time.time()
            if measured:
                marks["measured_step_begin"] = stats(torch, cuda)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                    if sp["kind"] == "cp":
                        WINDOWS = windows = PeakWindows(torch.cuda)
            opt.zero_grad(set_to_none=True)
            with cp_block():
                logits = model(ids)
                if measured:
                    marks["forward_end"] = stats(torch, cuda)
                    if cuda:
                        result["forward_peak_allocated"], result["forward_peak_reserved"] = \
                            windows.peaks() if windows else (torch.cuda.max_memory_allocated(),
                                                             torch.cuda.max_memory_reserved())
                    result["local_shapes"] = dict(ids=list(ids.shape), logits=list(logits.shape))
                loss = loss_fn(logits, labels)
                loss.backward()
            if measured:
                marks["backward_end"] = stats(torch, cuda)
            opt.step()
            if measured:
                marks["optimizer_end"] = stats(torch, cuda)
            if cuda:
                torch.cuda.synchronize()
            step_seconds.append(round(time.time() - t_step, 3))
    result["batch_storage_unchanged"] = batch_ptrs == [storage_ptr(ids), storage_ptr(labels)]
    result["loss"] = float(loss)  # garbage with the fake process group; not checked
    result["step_seconds"] = step_seconds
    result["sdpa_grad_fn"] = SDPA_GRAD_FNS[0] if SDPA_GRAD_FNS else None
    if "mm_counts" in result:
        result["mm_counts"] = [dict(m) for m in result["mm_counts"]]
    if cp_mod is not None:
        result["cp_options_after"] = cp_options(cp_mod)
    if cuda:
        torch.cuda.synchronize()
        if windows is not None:
            result["measured_step_peak_allocated"], result["measured_step_peak_reserved"] = \
                windows.peaks()
            # [allocated, reserved] peak of each SDPA call in order (layer 0 first in forward,
            # layer 3 first in backward)
            result["sdpa_call_peaks"] = windows.calls
        else:
            gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, marks["measured_step_begin"])
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result, default=str)
    return result


# --------------------------------------------------------------------------- self-test
def self_test():
    """Checks, against stand-ins of torch's API, what torch 1.13 cannot run: the meshes and
    FSDP calls of each cp run, the context_parallel arguments, set_rotate's effect, and
    that every run has its scenario; and the op-SAC save list holds the flash SDPA op
    (measure_stacks' check of the mm rule runs too). Exits 1 on a mismatch."""
    import enum
    import torch
    import measure_stacks as ms
    bad = []

    class Mesh:
        def __init__(self, shape, names):
            self.shape, self.mesh_dim_names = tuple(shape), tuple(names)

        def __getitem__(self, key):
            keys = key if isinstance(key, tuple) else (key,)
            idx = [self.mesh_dim_names.index(k) for k in keys]
            return Mesh([self.shape[i] for i in idx], keys)

        def _flatten(self, name):
            n = 1
            for s in self.shape:
                n *= s
            return Mesh([n], (name,))

        def size(self):
            n = 1
            for s in self.shape:
                n *= s
            return n

        def get_local_rank(self):
            return 0

    calls = []

    class FakeDist:
        def init_process_group(self, backend, store, rank, world_size):
            calls.append(("init", backend, rank, world_size))

        def get_backend(self):
            return "fake"

    def init_device_mesh(device_type, shape, mesh_dim_names):
        calls.append(("mesh", tuple(shape), tuple(mesh_dim_names)))
        return Mesh(shape, mesh_dim_names)

    def fully_shard(module, **kw):
        calls.append(("fully_shard", module, kw))

    class Policy:
        def __init__(self, param_dtype=None, reduce_dtype=None):
            self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype

    api = (fully_shard, Policy, init_device_mesh, object)

    class Model:
        layers = ["b0", "b1", "b2", "b3"]

    class RotateMethod(enum.Enum):
        ALL_TO_ALL = 1
        ALL_GATHER = 2

    class Opts:
        convert_to_f32, enable_load_balance, rotate_method = True, True, RotateMethod.ALL_GATHER

    class Mod:
        _RotateMethod = RotateMethod
        _cp_options = Opts()

    for sp in RUNS:
        ok = True
        if sp["kind"] == "cp":
            calls.clear()
            result = {}
            fsdp_mesh, cp_mesh = make_meshes(torch, FakeDist(), api, sp, "cuda", result)
            apply_fsdp(api, torch, sp, Model(), fsdp_mesh)
            ok &= calls[0] == ("init", "fake", 0, WORLD)
            ok &= fsdp_mesh.size() == WORLD and sp["data"] * sp["context"] == WORLD
            ok &= (cp_mesh is None) == (sp["context"] == 1)
            if cp_mesh is not None:
                ok &= cp_mesh.size() == sp["context"] and calls[1] == (
                    "mesh", (sp["data"], sp["context"]), ("dp_shard", "cp"))
            shards = [c for c in calls if c[0] == "fully_shard"]
            ok &= [c[1] for c in shards[:-1]] == Model.layers and len(shards) == 5
            ok &= all(c[2]["mp_policy"].param_dtype == torch.bfloat16 and
                      c[2]["mp_policy"].reduce_dtype == torch.float32 for c in shards)
            ok &= "reshard_after_forward" not in shards[-1][2]
            if sp["context"] > 1:
                Mod._cp_options = Opts()
                set_rotate(Mod, sp["rotate"])
                want = {"allgather": RotateMethod.ALL_GATHER,
                        "alltoall": RotateMethod.ALL_TO_ALL}[sp["rotate"]]
                ok &= Mod._cp_options.rotate_method is want
            ok &= sp["cfg"]["seq"] % (2 * sp["context"]) == 0
        else:
            ok &= sp["dtype"] == "bf16" and sp["policy"] in ("none", "sac-op")
        if not os.path.exists(os.path.join(REPO, sp["scenario"])):
            print(f"{sp['name']}: no scenario {sp['scenario']} (tools/gpu/predict_cp.py)")
            ok = False
        print(f"{'ok ' if ok else 'BAD'} {sp['name']}")
        if not ok:
            bad.append(sp["name"])
    bad += check_windows(torch)
    save_list, missing = ms.op_sac_save_list(torch)
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
    if flash is not None and flash.default not in save_list:
        bad.append("flash SDPA not in the op-SAC save list")
    print(f"op-SAC save list here: {len(save_list)} ops (missing in torch {torch.__version__}: "
          f"{missing})")
    print("self-test:", "FAILED " + ", ".join(bad) if bad else "all runs as intended")
    return 1 if bad else 0


def check_windows(torch):
    """Runs the SDPA stand-in's forward and backward on the CPU (with an eager stand-in of
    F.scaled_dot_product_attention where this torch has none) under PeakWindows with a
    stand-in of torch.cuda that logs the calls: one forward window per layer in layer
    order, then one backward window per layer, each opened before it is closed and closed
    before the next opens. Returns the problems found."""
    global WINDOWS
    import math
    import torch.nn.functional as F
    import torch_models as tm
    log = []

    class Cuda:
        def max_memory_allocated(self):
            log.append("peak")
            return 0

        def max_memory_reserved(self):
            return 0

        def reset_peak_memory_stats(self):
            log.append("reset")

    had = hasattr(F, "scaled_dot_product_attention")
    saved = getattr(F, "scaled_dot_product_attention", None)
    if not had:
        def eager_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
            w = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if is_causal:
                S = q.shape[-2]
                w = w.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(w, dim=-1) @ v
        F.scaled_dot_product_attention = eager_sdpa
    try:
        Model = make_model_class(torch, tm, True)
        torch.manual_seed(0)
        model = Model(dict(TINY))
        ids = torch.randint(0, TINY["vocab"], (TINY["batch"], TINY["seq"]))
        w = WINDOWS = PeakWindows(Cuda())
        orig_open, orig_close = w.open, w.close
        w.open = lambda: (log.append("open"), orig_open())[1]
        w.close = lambda kind: (log.append("close " + kind), orig_close(kind))[1]
        loss = tm.llama_loss(model(ids), ids)
        loss.backward()
    finally:
        WINDOWS = None
        if not had:
            del F.scaled_dot_product_attention
        elif saved is not None:
            F.scaled_dot_product_attention = saved
    seq = [e for e in log if e.startswith(("open", "close"))]
    n = TINY["layers"]
    want = ["open", "close forward"] * n + ["open", "close backward"] * n
    problems = []
    if seq != want:
        problems.append(f"SDPA windows {seq}")
    if len(w.calls["forward"]) != n or len(w.calls["backward"]) != n:
        problems.append(f"window calls {w.calls}")
    print(f"{'ok ' if not problems else 'BAD'} SDPA peak windows: {n} forward, "
          f"{len(w.calls['backward'])} backward, in order"
          f"{'' if had else ' (eager stand-in of F.scaled_dot_product_attention)'}")
    return problems


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def save_torch_sources(out_dir):
    """The installed torch's context-parallel sources (for reading only)."""
    try:
        import torch
        root = os.path.dirname(torch.__file__)
        target = os.path.join(out_dir, "torch_cp_sources.tar.xz")
        with tarfile.open(target, "w:xz") as t:
            for rel in ("distributed/tensor/experimental/_context_parallel",
                        "distributed/tensor/experimental/_attention.py",
                        "distributed/_functional_collectives.py",
                        "testing/_internal/distributed/fake_pg.py"):
                p = os.path.join(root, rel)
                if os.path.exists(p):
                    t.add(p, arcname=f"torch-{torch.__version__}/{rel}",
                          filter=lambda ti: None if "__pycache__" in ti.name else ti)
        print(f"torch {torch.__version__} CP sources -> {target}", flush=True)
    except Exception:
        traceback.print_exc()


def versions():
    """The installed versions (package metadata: importing transformers / peft would cost
    seconds, and the runs use neither), and the CUDA of torch's build."""
    v = {}
    try:
        from importlib import metadata
        for name in ("torch", "transformers", "peft"):
            try:
                v[name] = metadata.version(name)
            except Exception:
                pass
    except Exception:
        pass
    try:
        import torch
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
    except Exception:
        pass
    return v


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=85.0)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--no-sources", action="store_true", help="do not pack torch's CP sources")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test())
    if gpu_common.run_one_if_child(a, RUNS, run_one):
        return
    chosen = gpu_common.select_by_name(RUNS, a.only)
    total = sum(estimate(sp) for sp in chosen)
    if a.list:
        for sp in chosen:
            what = (f"world {sp['world']} = data {sp['data']} x context {sp['context']}"
                    f"{', rotate ' + sp['rotate'] if sp['context'] > 1 else ''}, fsdp2 bf16/fp32"
                    if sp["kind"] == "cp" else f"one GPU, bf16, AC {sp['policy']}")
            c = sp["cfg"]
            print(f"{sp['name']:20s} {estimate(sp):5.1f} s  {what}; SDPA; "
                  f"B {c['batch']} x S {c['seq']}, vocab {c['vocab']}")
        print(f"{len(chosen)} configurations: about {total:.0f} s of runs on an H200 "
              f"(estimate; the machine's start-up comes on top)", flush=True)
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)

    def report(sp, r):
        if "skipped" in r or r.get("dry_run"):
            print(f"{sp['name']:20s} dry run: {r.get('skipped') or r.get('skipped_parts')} "
                  f"({r['process_seconds']:.1f} s)", flush=True)
            return
        print(f"{sp['name']:20s} measured step: alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB; forward peak "
              f"{gib(r.get('forward_peak_allocated'))}; whole run: alloc "
              f"{gib(r.get('whole_run_peak_allocated'))} GiB ({r['process_seconds']:.1f} s)",
              flush=True)

    loop = gpu_common.ChildLoop(
        os.path.abspath(__file__), a.out_dir, a.budget, t_start, per_run=a.per_run,
        min_left=lambda sp: max(min(estimate(sp), 8.0), estimate(sp) * 0.75))
    results, failures = gpu_common.run_children(chosen, loop, report)
    if not a.no_sources:
        save_torch_sources(a.out_dir)
    gpu_common.finish_parent(
        a.out_dir, "cp", "tools/gpu/measure_cp.py: context parallelism under FSDP2 on a fake "
        "world of 8, and op-level SAC with SDPA, on the hf-llama stand-in", versions(),
        t_start, results, failures)


if __name__ == "__main__":
    gpu_common.run_main(main)
