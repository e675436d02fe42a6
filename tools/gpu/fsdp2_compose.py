"""The session-10 FSDP2 compositions of tools/gpu/measure_fsdp2.py (RUNS_S10, issue #16):
what memsim models over FSDP2 that no GPU has measured yet. measure_fsdp2.run_one calls the
functions here for a spec with "s10": True; everything else (the fake process group, the
mesh, MixedPrecisionPolicy, the marks, peaks and snapshot) is measure_fsdp2's.

The compositions (each one memsim's scenario keys, tests/data/gpu/fsdp2/NAME.yaml):
  * autocast over FSDP2 (`precision.autocast: bf16`, fp32 unsharded parameters, no
    MixedPrecisionPolicy; docs/fsdp2.md "Autocast over FSDP2"): the forward and the loss
    inside torch.autocast("cuda", dtype=torch.bfloat16), backward outside; the model is
    torch_models.LlamaForCausalLM (memsim's hf-llama family, whose autocast rules are the
    modelled ones; the llama row with knobs is refused with autocast by memsim).
  * `parallel.fsdp_output_dtype: bf16` (Accelerate >= 1.8's FSDP2 bf16 path,
    docs/fsdp2.md "Accelerate >= 1.8"): MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=bf16, output_dtype=bf16), no autocast, HF Trainer's step (memsim's
    `step.keep_output: loss`): the root is LossInForward, which computes the loss inside
    its forward as transformers v4.45's LlamaForCausalLM(labels=...) does (the stand-in's
    fp32 logits, then the shifted cross-entropy) and returns {loss, logits}; the loop keeps
    only the loss (Trainer's compute_loss returns outputs["loss"]).
  * per-block torch.compile under FSDP2 (`step.compile: true`, `step.compile_scope: block`;
    docs/compile.md "With FSDP2 and activation checkpointing"): torchtitan's order
    (pytorch/torchtitan 5077be6e torchtitan/models/llama3/infra/parallelize.py
    parallelize_llama: apply_ac, then apply_compile, then apply_fsdp): each block wrapped by
    checkpoint_wrapper (full or op-level SAC), then replaced by torch.compile(block), then
    fully_shard. fullgraph=False (torchtitan passes True) so that a graph break is counted
    in the result (dynamo_counters) instead of failing the run.
  * torchtitan's own Llama (`model.implementation: torchtitan`, docs/implementations.md
    "torchtitan under FSDP2"): tools/fixtures/impl_models.TitanTransformer with
    measure_impl.go_native's CUDA kernels (nn.RMSNorm, F.scaled_dot_product_attention with
    only the flash backend enabled: memsim's `model.attention: flash`), built on the meta
    device, torchtitan's apply_fsdp layout (fully_shard(tok_embeddings), each block,
    fully_shard([norm, output], reshard_after_forward=False), fully_shard(model)), then
    to_empty(device="cuda") and freqs_cis recomputed (init_weights' first statement; the
    weights' own init is skipped: values do not change an allocation here), op-level SAC
    (torchtitan's _custom_policy, measure_stacks.op_sac_policy), torchtitan's loop
    (`pred = model(ids); loss = cross_entropy(pred.flatten(0, 1).float(), ...); del pred`).

Inductor's cache: the parent sets TORCHINDUCTOR_CACHE_DIR (unless set) to one folder outside
OUT_DIR for every child, so that a compiled run reuses what an earlier one compiled (FX
graph and Triton kernel caches) and the cache is not packed with the outputs.
"""
import contextlib
import os
from collections import defaultdict

INDUCTOR_CACHE = "/tmp/memsim-fsdp2-inductor-cache"


def s10_spec(base, model, ac="model", compile_scope=None, output_dtype=None,
             loop="plain", est=10.0, timeout=60.0, attention="eager", device="h200",
             autocast="none"):
    """A RUNS_S10 run from measure_fsdp2.spec(...) (`base`): model standin |
    hf-llama | torchtitan; ac: model (torch_models.set_policy: the checkpoint wraps the
    block's call, inside FSDP2's hooks) | wrapper (torchtitan's apply_ac: checkpoint_wrapper
    on each block, fully_shard on the wrapper); compile_scope None | block; loop plain
    (logits = model(ids); loss = loss(logits, labels)) | hf-trainer (loss in the root's
    forward, memsim's step.keep_output: loss) | torchtitan (del pred before backward)."""
    return dict(base, s10=True, model=model, ac=ac, compile=compile_scope, autocast=autocast,
                output_dtype=output_dtype, loop=loop, est=est, timeout=timeout,
                attention=attention, device=device,
                impl="torchtitan" if model == "torchtitan" else base["impl"],
                family="hf-llama" if model != "standin" else base["family"])


def runs_s10(spec):
    """RUNS_S10, in the order of their value (a budget cut drops the last): the eager runs
    first (about 10 s each), then the compiled ones (compile time on top)."""
    return [
        s10_spec(spec("fsdp2_w8_fp32_autocast_bf16_fullac", policy="full", why=(
            "bf16 autocast over fp32 FSDP2 parameters (no MixedPrecisionPolicy), full AC: "
            "each block's cached bf16 weight casts outlive its reshard until the autocast "
            "region exits")), "hf-llama", autocast="bf16", est=11.0),
        s10_spec(spec("fsdp2_w8_bf16_output_bf16", param_dtype="bf16", reduce_dtype="bf16",
                      why="Accelerate >= 1.8's bf16 policy: MixedPrecisionPolicy(bf16, bf16, "
                      "output_dtype=bf16), no autocast, HF Trainer's step (loss in forward): "
                      "the root casts the loss and the fp32 logits to bf16"),
                 "standin", output_dtype="bf16", loop="hf-trainer"),
        s10_spec(spec("titan_fsdp2_w8_bf16_reduce_fp32_sac_op", param_dtype="bf16",
                      reduce_dtype="fp32", policy="sac-op", init="meta",
                      why="torchtitan's Llama code under its apply_fsdp layout "
                      "(tok_embeddings, each block, [norm, output] kept gathered), meta "
                      "init, op-level SAC, flash"),
                 "torchtitan", ac="wrapper", loop="torchtitan", attention="flash", est=11.0),
        s10_spec(spec("fsdp2_w8_bf16_reduce_fp32_compile", param_dtype="bf16",
                      reduce_dtype="fp32", why="per-block torch.compile under FSDP2: the "
                      "hooks outside each block's graph, the block's partition as on one GPU"),
                 "hf-llama", compile_scope="block", est=28.0, timeout=120.0),
        s10_spec(spec("fsdp2_w8_bf16_reduce_fp32_compile_fullac", param_dtype="bf16",
                      reduce_dtype="fp32", policy="full", why="checkpoint_wrapper, then "
                      "torch.compile per block, then fully_shard (torchtitan): the compiled "
                      "block saves its input, its backward graph recomputes it"),
                 "hf-llama", ac="wrapper", compile_scope="block", est=28.0, timeout=120.0),
        s10_spec(spec("titan_fsdp2_w8_bf16_reduce_fp32_sac_op_compile", param_dtype="bf16",
                      reduce_dtype="fp32", policy="sac-op", init="meta",
                      why="torchtitan's code and layout, op-level SAC, compiled per block "
                      "(nn.RMSNorm decomposed, the complex RoPE a fallback kernel)"),
                 "torchtitan", ac="wrapper", compile_scope="block", loop="torchtitan",
                 attention="flash", est=30.0, timeout=120.0),
        s10_spec(spec("fsdp2_w8_fp32_autocast_bf16", why=(
            "bf16 autocast over fp32 FSDP2 parameters, no checkpointing: every cast saved "
            "by its mm")), "hf-llama", autocast="bf16", est=10.0),
    ]


# --------------------------------------------------------------------------- models
class Skip(Exception):
    """This torch cannot run the composition (the dry run records why and goes on)."""


def native_titan(torch, sp, result):
    """measure_impl.go_native's CUDA kernels in impl_models, with SDPA the plain
    F.scaled_dot_product_attention(is_causal=True) and, on CUDA, only the flash backend
    enabled (global flags, which dynamo and Inductor read as eager does: no context manager
    in the compiled graph). Returns impl_models."""
    import impl_models as im
    import measure_impl as mi
    mi.go_native(torch, im, dict(sp, sdpa="default"), result)
    F = torch.nn.functional
    if torch.cuda.is_available():
        b = torch.backends.cuda
        b.enable_flash_sdp(True)
        b.enable_mem_efficient_sdp(False)
        b.enable_math_sdp(False)
        if hasattr(b, "enable_cudnn_sdp"):
            b.enable_cudnn_sdp(False)
        result["sdpa_call"] = "flash only (torch.backends.cuda flags)"
    if hasattr(F, "scaled_dot_product_attention"):
        kernels = result["sdpa_kernels"]

        def sdpa(q, k, v):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if sp["compile"] is None and out.grad_fn is not None and not kernels:
                kernels.append(mi.kernel_node_name(out.grad_fn))
            return out
        im.flash_sdpa = sdpa
    return im


def make_loss_in_forward(torch, inner, loss_fn):
    """The root of the hf-trainer loop: transformers v4.45 LlamaForCausalLM(ids,
    labels=labels): the stand-in's fp32 logits, the shifted loss inside the forward, the
    output {loss, logits} (CausalLMOutputWithPast's order, which FSDP2's output cast
    follows: _apply_to_tensors rebuilds a mapping key by key)."""

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = inner

        def forward(self, ids, labels):
            logits = self.m(ids)
            loss = loss_fn(logits, labels)
            return {"loss": loss, "logits": logits}

    return Root()


def build(torch, sp, cfg, device, build_ctx, result):
    """(model, blocks, loss_fn) for the run: the model built in build_ctx, the blocks
    (what fully_shard wraps one by one, after apply_ac_compile) and the loop's loss."""
    import torch_models as tm
    if sp["model"] == "torchtitan":
        im = native_titan(torch, sp, result)
        with build_ctx:
            model = im.TitanTransformer(dict(cfg))
        return model, model.layers, im.titan_loss
    with build_ctx:
        if sp["model"] == "hf-llama":
            model = tm.LlamaForCausalLM(dict(cfg))
        else:
            model = tm.DecoderForCausalLM(cfg)
    loss_fn = tm.llama_loss if sp["model"] == "hf-llama" else tm.decoder_loss(cfg)
    return model, model.layers, loss_fn


def block_items(blocks):
    """(key, block) of an nn.ModuleList or nn.ModuleDict (torchtitan's layers)."""
    if hasattr(blocks, "items"):
        return list(blocks.items())
    return [(str(i), b) for i, b in enumerate(blocks)]


def apply_ac_compile(torch, sp, blocks, result):
    """torchtitan's apply_ac (ac == "wrapper": checkpoint_wrapper with its
    ActivationCheckpointConfig defaults; sac-op with _custom_policy's context_fn) and
    apply_compile (torch.compile(block) registered in the block's place). Raises Skip when
    this torch lacks selective checkpointing or torch.compile."""
    import measure_stacks as ms
    if sp["ac"] == "wrapper" and sp["policy"] != "none":
        kw, dropped = ms.checkpoint_kwargs(torch)
        result["checkpoint_kwargs"] = dict(kw)
        if dropped:
            result["checkpoint_kwargs_dropped"] = dropped
        context_fn = None
        if sp["policy"] == "sac-op":
            try:
                from torch.utils.checkpoint import (CheckpointPolicy,
                                                    create_selective_checkpoint_contexts)
            except ImportError as e:
                why = (f"torch {torch.__version__} has no selective activation checkpointing "
                       f"(create_selective_checkpoint_contexts): {e}")
                if torch.cuda.is_available():
                    raise Skip(why)
                # The dry run: the blocks wrapped without the policy (full AC), so that the
                # wrapping, and compile's check below, still run here.
                result.setdefault("skipped_parts", []).append(
                    f"dry run: {why}; blocks checkpointed whole instead")
            else:
                save_list, missing = ms.op_sac_save_list(torch)
                result["op_sac_save_list_missing"] = missing
                counts = result.setdefault("mm_counts", [])

                def context_fn():
                    meta = defaultdict(int)
                    counts.append(meta)
                    return create_selective_checkpoint_contexts(
                        ms.op_sac_policy(torch, CheckpointPolicy, save_list, meta))
        elif sp["policy"] != "full":
            raise ValueError(f"{sp['name']}: ac wrapper with policy {sp['policy']}")
        for key, block in block_items(blocks):
            wrapped, how = ms.wrap_checkpoint(torch, block, kw, context_fn)
            blocks.register_module(key, wrapped)
            result["checkpoint_wrapper"] = how
    if sp["compile"] == "block":
        if not hasattr(torch, "compile"):
            raise Skip(f"torch {torch.__version__} has no torch.compile")
        result["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        for key, block in block_items(blocks):
            blocks.register_module(key, torch.compile(block, fullgraph=False))


def apply_titan_fsdp(api, kw, model):
    """torchtitan 5077be6e apply_fsdp: tok_embeddings and each block with the run's
    reshard_after_forward, [norm, output] with reshard_after_forward=False (the "default"
    policy without pipeline parallelism), then the root with the policy and mesh only."""
    fully_shard = api[0]
    fully_shard(model.tok_embeddings, **kw)
    for _, block in block_items(model.layers):
        fully_shard(block, **kw)
    fully_shard([model.norm, model.output], **dict(kw, reshard_after_forward=False))
    fully_shard(model, **{k: v for k, v in kw.items() if k != "reshard_after_forward"})


def init_titan_buffers(torch, im, model, cfg, device):
    """torchtitan's init_weights' first statement: freqs_cis recomputed on the device after
    to_empty (the empty one freed)."""
    with (device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()):
        fc = im.titan_freqs_cis(cfg["d_model"] // cfg["heads"], cfg["seq"])
    model.register_buffer("freqs_cis", fc.to(device), persistent=False)


def region(torch, sp, device):
    """The context of the forward and the loss: autocast bf16 for the autocast runs."""
    if sp["autocast"] == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def step_forward_loss(torch, sp, model, loss_fn, ids, labels, device, marks, measured, stats,
                      cuda):
    """One step's forward and loss as the run's loop does them; returns (loss, logits): the
    plain loop keeps its logits at loop level until the next step rebinds them (memsim's
    default script, as measure_fsdp2's RUNS); hf-trainer and torchtitan keep none (None)."""
    with region(torch, sp, device):
        if sp["loop"] == "hf-trainer":
            out = model(ids, labels)
            if measured:
                marks["forward_end"] = stats(torch, cuda)
            loss = out["loss"]  # Trainer's compute_loss; the outputs die with it
            del out
            return loss, None
        pred = model(ids)
        if measured:
            marks["forward_end"] = stats(torch, cuda)
        loss = loss_fn(pred, labels)
    if sp["loop"] == "torchtitan":
        del pred  # torchtitan's train.py, before backward
        return loss, None
    return loss, pred


def dynamo_counters(torch):
    import measure_stacks as ms
    return ms.dynamo_counters(torch)


# --------------------------------------------------------------------------- self-test
def self_test(torch, mf, runs):
    """The calls the compositions make that torch 1.13 cannot run, against stand-ins of
    torch's API: torchtitan's fully_shard layout and the scenario keys of every run. Returns
    the names that failed."""
    bad = []
    calls = []

    def fully_shard(module, **kw):
        calls.append((module, kw))

    class M:
        tok_embeddings, norm, output = "emb", "norm", "output"
        layers = {"0": "b0", "1": "b1"}

    apply_titan_fsdp((fully_shard,), dict(mesh="m", reshard_after_forward=True), M())
    want = [("emb", True), ("b0", True), ("b1", True), (["norm", "output"], False)]
    got = [(c[0], c[1].get("reshard_after_forward")) for c in calls[:-1]]
    if got != want or isinstance(calls[-1][0], str) or "reshard_after_forward" in calls[-1][1]:
        bad.append("titan apply_fsdp layout")
    print(f"{'ok ' if 'titan apply_fsdp layout' not in bad else 'BAD'} torchtitan apply_fsdp: "
          f"{len(calls)} fully_shard calls ([norm, output] reshard_after_forward=False, root "
          f"default)")
    for sp in runs:
        path = os.path.join(mf.REPO, sp["scenario"])
        text = open(path).read() if os.path.exists(path) else ""
        need = {"autocast: bf16": sp["autocast"] == "bf16",
                "fsdp_output_dtype: bf16": sp["output_dtype"] == "bf16",
                "keep_output: loss": sp["loop"] == "hf-trainer",
                "compile_scope: block": sp["compile"] == "block",
                "implementation: torchtitan": sp["model"] == "torchtitan",
                f"policy: {sp['policy']}": True,
                "fsdp_init: cpu": sp["init"] == "meta"}
        wrong = [k for k, v in need.items() if (k in text) != v]
        ok = bool(text) and not wrong
        print(f"{'ok ' if ok else 'BAD'} {sp['name']}: scenario keys"
              f"{'' if ok else ' ' + (', '.join(wrong) or 'missing ' + sp['scenario'])}")
        if not ok:
            bad.append(sp["name"])
    return bad
