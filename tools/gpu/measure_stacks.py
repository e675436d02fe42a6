#!/usr/bin/env python3
"""Measures the training-stack features of issue #16 that memsim models but no GPU had
checked: torch.compile (`step.compile`, docs/compile.md), torchtitan's selective
activation checkpointing (`checkpoint.policy: sac-op | sac-layer:N`,
docs/torchtitan-recipes.md) and torchtune's chunked cross-entropy (`loss.impl:
chunked:N`, docs/losses.md), each next to the eager run of the same model.

    python3 tools/gpu/measure_stacks.py OUT_DIR [--budget SECONDS] [--per-run SECONDS]
                                        [--only NAME|GLOB...] [--list] [--self-test]

Each configuration (RUNS below) runs in its own Python process (a fresh caching allocator,
CUDA context and Dynamo state) with a per-run timeout (a compile run's own, longer); a
failing run is recorded with its stderr and the next one runs; the runs together never
take more than --budget seconds (each run's timeout is at most what is left, and a run is
not started with less than 3/4 of its estimate left).
The parent writes OUT_DIR/stacks_runs.json (every result and failure) and
OUT_DIR/stacks_snapshots.tar.xz (torch.cuda.memory._snapshot() of each run, frames cut to
model / loop / checkpoint / optimizer / Inductor-generated code).

The loop is tools/gpu/measure_cuda.py's (memsim's default script,
sim/step/training_script.h): the model built on the GPU in module order, AdamW(foreach),
the batch (ids then labels, int64 on the GPU), one warm-up step (where torch.compile
compiles), then the measured step
    zero_grad(set_to_none=True); logits = model(ids); loss = loss(logits, labels);
    loss.backward(); opt.step()
with reset_peak_memory_stats() before it and logits/loss bound at loop level. Memory
history is recorded from before the model is built.

Model: tools/fixtures/torch_models.LlamaForCausalLM (memsim's hf-llama family: HF
LlamaForCausalLM v4.45 eager attention, op for op) at measure_cuda.py's LLAMA shape (4
layers, d_model 1024, 16 heads, 4 KV heads, d_ff 2816, vocab 32000, batch 4 x 1024, fp32):
its eager run was measured on an H100 before (tests/data/h100/cuda_runs.json,
llama_l4_d1024_s1024_b4_none) and memsim matched it, so every difference here is the
stack feature's.

What each feature runs (the code memsim's docs say they model):
  * compile: `torch.compile(model)` (default mode, loss outside the compiled model:
    memsim's `step.compile_scope: model`); `torch.compile(block)` for every decoder layer
    (torchtitan's apply_compile, torchtitan/models/llama3/parallelize.py; torchtitan
    passes fullgraph=True, here fullgraph=False so that a graph break is counted in the
    result, `dynamo_counters`, instead of failing the run); and model scope with
    `torch._functorch.config.activation_memory_budget = 0.5` (`step.compile_memory_budget`).
  * sac-op / sac-layer:N: torchtitan cfb93265's torchtitan/distributed/
    activation_checkpoint.py (`_apply_op_sac`, `_apply_layer_sac`) with its
    ActivationCheckpointConfig defaults (preserve_rng_state False, determinism_check
    "default", early_stop False, debug False): every decoder layer wrapped by
    torch.distributed's checkpoint_wrapper (non-reentrant); sac-op with
    create_selective_checkpoint_contexts and the policy "ops in the save list MUST_SAVE,
    except every second aten.mm of the block (counted per forward / per recompute);
    everything else PREFER_RECOMPUTE"; the save list of torchtitan/models/llama3/
    parallelize.py at that commit (OP_SAC_SAVE_NAMES below); sac-layer:N wraps the layers
    whose 1-based index is a multiple of N.
  * chunked:N: torchtune 10ff7cd2's TransformerDecoder.chunked_output (the head on each
    of hidden.tensor_split(N, dim=1)) and CEWithChunkedOutputLoss (each chunk .float(),
    F.cross_entropy(reduction="sum") accumulated, divided by the label count), as
    tools/fixtures/gen_loss_fixtures.py (memsim's CPU fixture of the same loss); the
    labels are not shifted (memsim's hf-* loss.impl semantics). Its pair is the run with
    loss.impl torch (F.cross_entropy(logits.view(-1, V), labels.view(-1))).

memsim's scenario of each run is tests/data/gpu/stacks/NAME.yaml and its blind prediction
tests/data/gpu/stacks_predictions.json (tools/gpu/predict_stacks.py, written before
anything was measured); tests/test_gpu_stacks_runs.cpp compares them once the
measurement is committed as tests/data/gpu/stacks/stacks_runs.json.

Without CUDA (a dry run on a CPU machine: /usr/bin/python3 with torch 1.13 here) each run
executes the same code on a tiny model on the CPU, and what that torch lacks is skipped
with the reason recorded in the result ("skipped"): torch.compile (torch < 2.0) and
create_selective_checkpoint_contexts (torch < 2.4) skip those runs; checkpoint keywords the
installed torch.utils.checkpoint does not take are dropped and named. No memory figures are
recorded on the CPU. --self-test checks the SAC policy and the wrapping against stand-ins
of torch's API (what torch 1.13 cannot run).
"""
import argparse
import contextlib
import inspect
import json
import os
import sys
import time
from collections import defaultdict

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

DATA = "tests/data/gpu/stacks"  # memsim's scenario of each run (NAME.yaml)

# --------------------------------------------------------------------------- configs
# measure_cuda.py's LLAMA (the H100-measured hf-llama stand-in shape).
LLAMA = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000,
             context=1024, seq=1024, batch=4, dropout=0.0, tied=False)
TINY = dict(layers=4, d_model=64, heads=4, kv_heads=2, d_ff=172, vocab=512, context=64,
            seq=32, batch=2, dropout=0.0, tied=False)  # the CPU dry run

# torchtitan cfb93265, torchtitan/models/llama3/parallelize.py `_op_sac_save_list`:
# (namespace, op, overload); ops this torch lacks are left out (recorded in the result).
OP_SAC_SAVE_NAMES = [
    ("aten", "mm", "default"),
    ("aten", "_scaled_dot_product_efficient_attention", "default"),
    ("aten", "_scaled_dot_product_flash_attention", "default"),
    ("aten", "_scaled_dot_product_cudnn_attention", "default"),
    ("aten", "_scaled_dot_product_attention_math", "default"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable", "default"),
    ("_c10d_functional", "reduce_scatter_tensor", "default"),
    ("aten", "max", "default"),
    ("torch_attn", "_varlen_attn", "default"),
]
# ... and three higher-order ops of torch._higher_order_ops (none runs in this model).
OP_SAC_SAVE_HOPS = ["flex_attention", "inductor_compiled_code"]


def spec(name, feature, policy="none", compile_scope=None, memory_budget=None,
         loss="hf", est=8.0, timeout=60.0, why=""):
    """One run. feature: eager | compile | sac | loss; policy: none | sac-op | sac-layer:N;
    compile_scope: None | model | block; loss: hf (the model's HF shift loss, memsim's
    default) | torch | chunked:N."""
    return dict(name=name, feature=feature, family="hf-llama", impl="standin",
                cfg=dict(LLAMA), dtype="fp32", autocast="none", attention="eager",
                optimizer="adamw", opt_impl="foreach", warmup=1, policy=policy,
                compile_scope=compile_scope, memory_budget=memory_budget, loss=loss,
                est=est, timeout=timeout, why=why, scenario=f"{DATA}/{name}.yaml")


# In the order of their value to memsim (a budget cut drops the last).
RUNS = [
    spec("stacks_eager", "eager", why="the eager baseline of every run below "
         "(measure_cuda's llama_l4_d1024_s1024_b4_none)"),
    spec("stacks_compile_model", "compile", compile_scope="model", est=40.0, timeout=150.0,
         why="torch.compile(model), default mode: the min-cut partition's saved set, "
         "Inductor's fused forward buffers"),
    spec("stacks_sac_op", "sac", policy="sac-op",
         why="torchtitan's op-level SAC: per layer q_proj, v_proj, gate_proj, down_proj "
         "outputs cached, the rest recomputed"),
    spec("stacks_sac_layer2", "sac", policy="sac-layer:2",
         why="torchtitan's layer SAC with selective_ac_option 2: layers 1 and 3 "
         "(0-based) checkpointed whole, early_stop False"),
    spec("stacks_loss_chunked8", "loss", loss="chunked:8",
         why="torchtune's chunked output + CEWithChunkedOutputLoss, 8 chunks"),
    spec("stacks_loss_torch", "loss", loss="torch",
         why="F.cross_entropy on the whole (B*S, V) logits: the pair of the chunked run"),
    spec("stacks_compile_budget05", "compile", compile_scope="model", memory_budget=0.5,
         est=30.0, timeout=120.0,
         why="torch.compile(model) with activation_memory_budget 0.5: the partitioner "
         "recomputes more"),
    spec("stacks_compile_block", "compile", compile_scope="block", est=30.0, timeout=120.0,
         why="torchtitan's per-block torch.compile: embeddings, final norm, head and loss "
         "eager, each block its own partition"),
]


def estimate(sp):
    return sp["est"]


# --------------------------------------------------------------------------- helpers
stats = gpu_common.memory_stats  # the common keys (gpu_common.STEP_STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from model, loop, checkpoint, optimizer and Inductor's
    generated code (at most 6)."""
    return gpu_common.trim_frames(
        snapshot, ("torch_models", "measure_stacks", "checkpoint", "optim", "torchinductor",
                   "_inductor/", "_functorch/"), 6)


class Skip(Exception):
    """This torch cannot run the feature (the dry run records why and stops)."""


def checkpoint_kwargs(torch):
    """torchtitan's ActivationCheckpointConfig defaults as checkpoint() keywords, those
    this torch.utils.checkpoint takes; and the ones dropped."""
    import torch.utils.checkpoint as tuc
    want = dict(preserve_rng_state=False, determinism_check="default", early_stop=False,
                debug=False)
    params = inspect.signature(tuc.checkpoint).parameters
    kw, dropped = {}, []
    for k, v in want.items():
        if k in params or k == "preserve_rng_state":  # popped from **kwargs in every torch
            kw[k] = v
        else:
            dropped.append(k)
    return kw, dropped


def early_stop_context(torch, dropped):
    """early_stop=False where checkpoint() does not take it as a keyword (torch 2.1-2.x
    before the keyword): torch.utils.checkpoint.set_checkpoint_early_stop(False)."""
    import torch.utils.checkpoint as tuc
    if "early_stop" in dropped and hasattr(tuc, "set_checkpoint_early_stop"):
        return tuc.set_checkpoint_early_stop(False), "set_checkpoint_early_stop(False)"
    return contextlib.nullcontext(), None


def wrap_checkpoint(torch, module, kw, context_fn=None):
    """torch.distributed's checkpoint_wrapper(module, NO_REENTRANT, **kw) (torchtitan's
    ptd_checkpoint_wrapper); where torch.distributed cannot be imported, an equivalent
    module calling torch.utils.checkpoint.checkpoint(use_reentrant=False) itself."""
    kw = dict(kw)
    if context_fn is not None:
        kw["context_fn"] = context_fn
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, checkpoint_wrapper)
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kw), \
            "checkpoint_wrapper"
    except ImportError:
        import torch.utils.checkpoint as tuc

        class Checkpointed(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return tuc.checkpoint(self.inner, *args, use_reentrant=False, **kw)

        return Checkpointed(module), "own wrapper (no torch.distributed)"


def op_sac_save_list(torch):
    """The save list as OpOverloads of this torch, and the names it lacks."""
    ops, missing = set(), []
    for ns, name, overload in OP_SAC_SAVE_NAMES:
        try:
            ops.add(getattr(getattr(getattr(torch.ops, ns), name), overload))
        except Exception:  # an op (or its library) this torch does not register
            missing.append(f"{ns}.{name}.{overload}")
    hops = getattr(torch, "_higher_order_ops", None)
    for name in OP_SAC_SAVE_HOPS:
        h = getattr(hops, name, None) if hops is not None else None
        if h is None:
            missing.append(f"_higher_order_ops.{name}")
        else:
            ops.add(h)
    return ops, missing


def op_sac_policy(torch, CheckpointPolicy, save_list, meta, mm_recompute_shapes=()):
    """torchtitan cfb93265 _apply_op_sac's _custom_policy (meta: one defaultdict(int) per
    context_fn call, i.e. per checkpointed block forward)."""
    mm = torch.ops.aten.mm.default

    def policy(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                and "device" in kwargs and str(kwargs["device"]) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        key = f"{mode}_mm_count"
        if func == mm:
            if args[1].shape in mm_recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[key] += 1
        to_save = func in save_list and not (func == mm and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_sac(torch, model, policy, result):
    """Wraps model.layers as torchtitan's apply_ac does (selective mode). Raises Skip when
    this torch has no selective checkpointing (sac-op)."""
    kw, dropped = checkpoint_kwargs(torch)
    result["checkpoint_kwargs"] = {k: v for k, v in kw.items()}
    if dropped:
        result["checkpoint_kwargs_dropped"] = dropped
    if policy == "sac-op":
        try:
            from torch.utils.checkpoint import (CheckpointPolicy,
                                                create_selective_checkpoint_contexts)
        except ImportError as e:
            raise Skip(f"torch {torch.__version__} has no selective activation "
                       f"checkpointing (create_selective_checkpoint_contexts): {e}")
        save_list, missing = op_sac_save_list(torch)
        result["op_sac_save_list_missing"] = missing
        result["mm_counts"] = []

        def context_fn():
            meta = defaultdict(int)
            result["mm_counts"].append(meta)  # recorded: the per-block counts seen
            return create_selective_checkpoint_contexts(
                op_sac_policy(torch, CheckpointPolicy, save_list, meta))

        wrap = lambda layer: wrap_checkpoint(torch, layer, kw, context_fn)  # noqa: E731
        chosen = list(range(len(model.layers)))
    else:
        n = int(policy.split(":")[1])
        wrap = lambda layer: wrap_checkpoint(torch, layer, kw)  # noqa: E731
        # _apply_layer_sac: a global counter from 1; wrapped when counter % N == 0.
        chosen = [i for i in range(len(model.layers)) if (i + 1) % n == 0]
    how = None
    for i in chosen:
        model.layers[i], how = wrap(model.layers[i])
    result["checkpointed_layers"] = chosen
    result["checkpoint_wrapper"] = how
    return dropped


def compile_model(torch, model, sp, result):
    """torch.compile as the run says; returns the module the loop calls."""
    if not hasattr(torch, "compile"):
        raise Skip(f"torch {torch.__version__} has no torch.compile")
    import torch._functorch.config as fconfig
    if sp["memory_budget"] is not None:
        if not hasattr(fconfig, "activation_memory_budget"):
            raise Skip(f"torch {torch.__version__} has no activation_memory_budget")
        fconfig.activation_memory_budget = sp["memory_budget"]
    result["activation_memory_budget"] = getattr(fconfig, "activation_memory_budget", None)
    try:
        import torch._inductor.config as iconfig
        result["inductor_config"] = {k: getattr(iconfig, k, None) for k in (
            "reorder_for_peak_memory", "allow_buffer_reuse", "inplace_buffers",
            "memory_planning", "triton.cudagraphs", "fx_graph_cache")
            if "." not in k}
        result["inductor_config"]["triton.cudagraphs"] = getattr(
            getattr(iconfig, "triton", None), "cudagraphs", None)
        result["partitioner_solver"] = getattr(fconfig, "activation_memory_budget_solver",
                                               None)
    except Exception as e:
        result["inductor_config"] = repr(e)[:200]
    if sp["compile_scope"] == "block":
        for i in range(len(model.layers)):  # torchtitan's apply_compile (fullgraph: see top)
            model.layers[i] = torch.compile(model.layers[i], fullgraph=False)
        return model
    return torch.compile(model)


def dynamo_counters(torch):
    try:
        from torch._dynamo.utils import counters
        # Keys as text: a counter's keys need not be strings, and json.dump would raise on
        # them after the run was measured.
        return {k: {str(k2): (v2 if isinstance(v2, (int, float)) else str(v2))
                    for k2, v2 in v.items()}
                for k, v in counters.items()
                if k in ("graph_break", "stats", "frames", "aot_autograd", "inductor")}
    except Exception as e:
        return {"error": repr(e)[:200]}


# torchtune 10ff7cd2: TransformerDecoder.chunked_output / CEWithChunkedOutputLoss (as
# tools/fixtures/gen_loss_fixtures.py, memsim's CPU fixture of the same loss).
IGNORE = -100


def chunked_output(model, hidden, n):
    head = model.embed_tokens.weight if model.tied else model.lm_head.weight
    import torch.nn.functional as F
    return [F.linear(chunk, head) for chunk in hidden.tensor_split(n, dim=1)]


def ce_with_chunked_output(logits, labels, n):
    import torch.nn.functional as F
    total_elements = (labels != IGNORE).sum()
    labels = [c.reshape(-1) for c in labels.tensor_split(n, dim=1)]
    logits = [c.reshape(-1, c.size(-1)) for c in logits]
    total_loss = 0.0
    for lc, tc in zip(logits, labels):
        total_loss += F.cross_entropy(lc.float(), tc, ignore_index=IGNORE, reduction="sum")
    return total_loss / total_elements


def forward_and_loss(torch, sp, model, call):
    """(forward(ids) -> output, loss(output, labels)) of the run."""
    import torch.nn.functional as F
    import torch_models as tm
    if sp["loss"].startswith("chunked:"):
        n = int(sp["loss"].split(":")[1])
        return (lambda ids: chunked_output(model, model.model(ids), n),
                lambda out, labels: ce_with_chunked_output(out, labels, n))
    if sp["loss"] == "torch":
        return (call, lambda out, labels: F.cross_entropy(out.view(-1, out.size(-1)),
                                                          labels.view(-1)))
    return call, tm.llama_loss


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    import torch
    import torch_models as tm
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device))
    if not cuda:  # dry run: the same code on a model small enough for a CPU
        sp = dict(sp, cfg=dict(TINY))
    cfg = sp["cfg"]
    if cuda:
        torch.cuda.init()
        result["gpu"] = torch.cuda.get_device_name()
        result["mem_get_info_at_init"] = list(torch.cuda.mem_get_info())
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=2_000_000)
    marks = result["marks"] = {}
    torch.manual_seed(0)
    dev_ctx = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with dev_ctx:
        model = tm.LlamaForCausalLM(dict(cfg))
    model = model.to(device)  # no-op when built on the device
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    marks["after_model"] = stats(torch, cuda)
    step_ctx = contextlib.nullcontext()
    try:
        if sp["policy"] != "none":
            dropped = apply_sac(torch, model, sp["policy"], result)
            step_ctx, how = early_stop_context(torch, dropped)
            if how:
                result["early_stop_by"] = how
        call = model
        if sp["compile_scope"]:
            call = compile_model(torch, model, sp, result)
    except Skip as e:
        if cuda:
            raise
        result["skipped"] = f"dry run: {e}"
        print(result["skipped"], file=sys.stderr, flush=True)
        with open(os.path.join(out_dir, sp["name"] + ".json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return result
    forward, loss_fn = forward_and_loss(torch, sp, model, call)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    labels = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    logits = loss = None
    step_seconds = []
    with step_ctx:
        for step in range(sp["warmup"] + 1):
            measured = step == sp["warmup"]
            t_step = time.time()
            if measured:
                marks["measured_step_begin"] = stats(torch, cuda)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
            opt.zero_grad(set_to_none=True)
            logits = forward(ids)
            if measured:
                marks["forward_end"] = stats(torch, cuda)
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
    result["loss"] = float(loss)
    result["step_seconds"] = step_seconds  # the warm-up's includes compilation
    if "mm_counts" in result:  # per block forward / re-run: {forward_mm_count, recompute_mm_count}
        result["mm_counts"] = [dict(m) for m in result["mm_counts"]]
    if sp["compile_scope"]:
        result["dynamo_counters"] = dynamo_counters(torch)
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, marks["measured_step_begin"])
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result, default=str)
    return result


# --------------------------------------------------------------------------- self-test
def self_test():
    """Checks what torch 1.13 cannot run: torchtitan's op-SAC policy (with stand-ins of
    CheckpointPolicy and the SAC context) on the mm sequence of a Llama block, the
    layers sac-layer:N wraps, and that every run has its scenario. Exits 1 on a mismatch."""
    import enum
    import torch
    bad = []

    class Policy(enum.Enum):
        MUST_SAVE = 0
        PREFER_SAVE = 1
        MUST_RECOMPUTE = 2
        PREFER_RECOMPUTE = 3

    class Ctx:
        def __init__(self, rec):
            self.is_recompute = rec

    save_list, missing = op_sac_save_list(torch)
    if torch.ops.aten.mm.default not in save_list:
        bad.append("aten.mm not in the save list")
    meta = defaultdict(int)
    pol = op_sac_policy(torch, Policy, save_list, meta)
    w = torch.empty(4, 4)
    x = torch.empty(2, 4)
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for rec in (False, True):
        got = []
        for n in names:
            got.append(pol(Ctx(rec), torch.ops.aten.mm.default, x, w) is Policy.MUST_SAVE)
            # pointwise ops between the mms are recomputed and do not count
            if pol(Ctx(rec), torch.ops.aten.mul.Tensor, x, x) is not Policy.PREFER_RECOMPUTE:
                bad.append("mul saved")
        saved = [n for n, s in zip(names, got) if s]
        print(f"sac-op ({'re-run' if rec else 'forward'}): saved mm outputs {saved}")
        if saved != ["q_proj", "v_proj", "gate_proj", "down_proj"]:
            bad.append(f"sac-op saved {saved}")
    if dict(meta) != {"forward_mm_count": 7, "recompute_mm_count": 7}:
        bad.append(f"mm counts {dict(meta)}")
    print(f"save list: {len(save_list)} ops here; missing in torch {torch.__version__}: {missing}")
    for n, want in ((2, [1, 3]), (3, [2]), (1, [0, 1, 2, 3])):
        chosen = [i for i in range(4) if (i + 1) % n == 0]
        if chosen != want:
            bad.append(f"sac-layer:{n} wraps {chosen}")
    kw, dropped = checkpoint_kwargs(torch)
    print(f"checkpoint keywords here: {kw}; dropped: {dropped}")
    for sp in RUNS:
        if not os.path.exists(os.path.join(REPO, sp["scenario"])):
            bad.append(f"no scenario {sp['scenario']} (tools/gpu/predict_stacks.py)")
    print("self-test:", "FAILED " + "; ".join(bad) if bad else "all runs as intended")
    return 1 if bad else 0


# --------------------------------------------------------------------------- driver
gib = gpu_common.gib


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=150.0)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test())
    if gpu_common.run_one_if_child(a, RUNS, run_one):
        return
    chosen = gpu_common.select_by_name(RUNS, a.only)
    total = sum(estimate(sp) for sp in chosen)
    if a.list:
        for sp in chosen:
            extra = []
            if sp["compile_scope"]:
                extra.append(f"compile {sp['compile_scope']}")
            if sp["memory_budget"] is not None:
                extra.append(f"budget {sp['memory_budget']}")
            if sp["policy"] != "none":
                extra.append(sp["policy"])
            if sp["loss"] != "hf":
                extra.append(f"loss {sp['loss']}")
            print(f"{sp['name']:26s} {estimate(sp):5.1f} s (timeout {sp['timeout']:.0f} s)  "
                  f"{', '.join(extra) or 'eager'}")
        print(f"{len(chosen)} configurations: about {total:.0f} s of runs on an H200 "
              f"(estimate; compile runs include compilation)", flush=True)
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)

    def report(sp, r):
        if "skipped" in r:
            print(f"{sp['name']:26s} {r['skipped']} ({r['process_seconds']:.1f} s)", flush=True)
            return
        print(f"{sp['name']:26s} measured step: alloc {gib(r.get('measured_step_peak_allocated'))} "
              f"reserved {gib(r.get('measured_step_peak_reserved'))} GiB; whole run: "
              f"alloc {gib(r.get('whole_run_peak_allocated'))} reserved "
              f"{gib(r.get('whole_run_peak_reserved'))} GiB; steps {r.get('step_seconds')} s "
              f"({r['process_seconds']:.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(  # the budget bounds the runs' total: no run outlives it
        os.path.abspath(__file__), a.out_dir, a.budget, t_start, per_run=a.per_run,
        min_left=lambda sp: max(min(estimate(sp), 8.0), estimate(sp) * 0.75))
    results, failures = gpu_common.run_children(chosen, loop, report)
    versions = {}
    try:
        import torch
        versions = dict(torch=torch.__version__, cuda=torch.version.cuda)
        import triton  # noqa: F401
        versions["triton"] = triton.__version__
    except Exception:
        pass
    gpu_common.finish_parent(
        a.out_dir, "stacks", "tools/gpu/measure_stacks.py: compile, torchtitan SAC and chunked "
        "loss on the hf-llama stand-in", versions, t_start, results, failures)


if __name__ == "__main__":
    main()
