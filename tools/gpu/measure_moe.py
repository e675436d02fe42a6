#!/usr/bin/env python3
"""Measures mixture-of-experts training steps on a CUDA GPU with a forced routing, for
memsim's MoE model (graph/models/decoder_moe.cpp, docs/moe.md; issue #15).

    python3 tools/gpu/measure_moe.py OUTDIR [--budget SECONDS] [--per-run SECONDS]
                                     [--only NAME|GLOB...] [--list]

Each configuration runs in its own Python process (a fresh caching allocator), with
torch.cuda.memory._record_memory_history on from before the model is built, and memsim's
default loop: the model built on the GPU, AdamW (foreach), the batch (ids, labels int64);
one warm-up step, then the measured step
    zero_grad(set_to_none=True); out = model(ids); loss = loss(out, labels);
    loss.backward(); opt.step()
Writes OUTDIR/moe_runs.json (the spec of each run, torch and transformers versions,
memory_stats at the marks, the measured step's max_memory_allocated / reserved, the parameter
count, which experts implementation and router code actually ran (inspect.getsource), the
tokens per expert the forced routing gave, and failures with their stderr) and
OUTDIR/moe_snapshots.tar.xz (torch.cuda.memory._snapshot() per run, frames stripped). A
failing run is recorded and the next one runs; no run starts after --budget seconds.

Routing is forced, so the sizes are known: torch.topk is wrapped (for the transformers
models it is the module-level torch.topk their routers call) so that, after the real topk
ran (its allocations and autograd node as usual), its (T, K) indices are overwritten in
place through `.data` with the assignment of tools/fixtures/moe_models.forced_indices for the
run's tokens per expert (balanced, skewed, worst-case). The forced (T, K) int64 table is
put on the GPU before the measured step (16 KiB, a small-pool block memsim does not model).

Models: "standin" = tools/fixtures/moe_models.MoeForCausalLM (transformers v5's eager experts
and router written out, on torch_models' decoder rows; the CPU fixtures
tests/data/torch_cpu_moe came from it) at a GPU size; "transformers" = the installed
transformers' own Qwen3MoeForCausalLM / MixtralForCausalLM / OlmoeForCausalLM /
Qwen2MoeForCausalLM built with AutoModelForCausalLM.from_config from the small config.json
in tests/data/gpu/moe/configs/ (attention eager; the experts implementation set to eager
where the release has the switch, and recorded), called as users call it.

memsim's scenario of each run is tests/data/gpu/moe/NAME.yaml; its blind predictions are
tests/data/gpu/moe_predictions.json (committed before any measurement).

Without CUDA (a dry run on a CPU machine, e.g. Debian's torch 1.13) the stand-ins run the
same code on the CPU at a tiny size and record no memory figures; the transformers runs are
skipped with a message when transformers cannot be imported.
"""
import argparse
import importlib.util
import inspect
import json
import os
import sys
import time

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "fixtures"))
CONFIGS = os.path.join(ROOT, "tests", "data", "gpu", "moe", "configs")

# GPU size: 2 layers, d 1024, 8 experts of 768, top 2, b 16 x s 256 = 4096 tokens, a 4096
# vocabulary: the MoE blocks, not the logits or the S x S scores, decide the peaks.
SHAPE = dict(layers=2, d_model=1024, heads=16, kv_heads=4, d_ff=2048, vocab=4096, context=1024,
             seq=256, batch=16, dropout=0.0)
E, K, FE = 8, 2, 768
TOKENS = SHAPE["batch"] * SHAPE["seq"]
ROUTINGS = {
    "balanced": [TOKENS * K // E] * E,                            # 1024 each
    "skew": [4096, 2048, 1024, 512, 256, 128, 64, 64],            # Zipf-like, capped at T
    "worst": [TOKENS] * K + [0] * (E - K),                        # experts 0, 1 take every token
}


def spec(name, impl, model_type, routing, dtype="bf16", experts_impl="eager", seconds=8.0, expert_d_ff=FE):
    return dict(name=name, impl=impl, model_type=model_type, routing=routing,
                counts=ROUTINGS[routing], dtype=dtype, experts_impl=experts_impl,
                cfg=dict(SHAPE), experts=E, top_k=K, expert_d_ff=expert_d_ff, warmup=1, estimate=seconds)


# In priority order (a budget cut drops the last).
SPECS = [
    spec("moe_standin_qwen3_bf16_balanced", "standin", "qwen3_moe", "balanced"),
    spec("moe_tf_qwen3_moe_bf16_balanced", "transformers", "qwen3_moe", "balanced", seconds=12.0),
    spec("moe_tf_qwen3_moe_bf16_worst", "transformers", "qwen3_moe", "worst", seconds=12.0),
    spec("moe_standin_qwen3_bf16_skew", "standin", "qwen3_moe", "skew"),
    spec("moe_tf_mixtral_bf16_balanced", "transformers", "mixtral", "balanced", seconds=12.0),
    spec("moe_tf_olmoe_bf16_skew", "transformers", "olmoe", "skew", seconds=12.0),
    spec("moe_tf_qwen2_moe_bf16_balanced", "transformers", "qwen2_moe", "balanced", seconds=12.0),
    spec("moe_standin_mixtral_bf16_worst", "standin", "mixtral", "worst"),
    # memsim refuses grouped_mm (not modelled yet): measured to see what it costs.
    spec("moe_tf_qwen3_moe_bf16_balanced_grouped_mm", "transformers", "qwen3_moe", "balanced",
         experts_impl="grouped_mm", seconds=12.0),
    # DeepSeek-V3 (configs/deepseek_v3.json: 3 layers, the first dense, MLA, 8 routed experts
    # of 512 in 2 groups, topk_group 1, top 2, 1 shared expert). Its router calls torch.topk
    # twice: the group choice gives (T, topk_group) = (T, 1), the expert choice (T, top_k) =
    # (T, 2); only the latter has the forced table's shape, so only it is overwritten (the
    # per-group top-2 is Tensor.topk on (T, n_group, E / n_group): not wrapped, not matched).
    spec("moe_tf_deepseek_v3_bf16_balanced", "transformers", "deepseek_v3", "balanced",
         seconds=15.0, expert_d_ff=512),
    spec("moe_tf_deepseek_v3_bf16_worst", "transformers", "deepseek_v3", "worst",
         seconds=15.0, expert_d_ff=512),
]


STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
              "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "requested_bytes.all.current", "requested_bytes.all.peak",
              "num_alloc_retries", "num_ooms", "segment.all.current", "allocation.all.current")


def stats(torch, cuda):
    return gpu_common.memory_stats(torch, cuda, STATS_KEYS)


def strip_frames(snapshot):
    return gpu_common.map_frames(snapshot, lambda frames: None)


# --------------------------------------------------------------------------- models
def standin_cfg(sp, dry):
    import gen_arch_fixtures as arch
    base = {"qwen3_moe": "qwen3", "mixtral": "mistral"}[sp["model_type"]]
    c = dict(sp["cfg"])
    if dry:
        c.update(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=96, vocab=512, context=64, seq=16, batch=2)
    from gen_moe_fixtures import V5_PLACEMENT  # the MoE rows' dense parts are 5.x's too
    cfg = arch.row(base, base=c, hf_over=V5_PLACEMENT)
    if base == "mistral":
        cfg["arch"]["sliding_window"] = 0  # the GPU run's Mixtral has no window
    tokens = c["batch"] * c["seq"]
    counts = sp["counts"] if not dry else forced_counts_for(sp["routing"], tokens)
    cfg["moe"] = dict(experts=sp["experts"], top_k=sp["top_k"],
                      expert_d_ff=sp["expert_d_ff"] if not dry else 24, norm_topk=True,
                      router_style="mixtral" if sp["model_type"] == "mixtral" else "qwen",
                      shared_d_ff=0, first_dense_layers=0, counts=counts)
    return cfg


def forced_counts_for(routing, tokens):
    if routing == "balanced":
        return [tokens * K // E] * E
    if routing == "worst":
        return [tokens] * K + [0] * (E - K)
    left, out = tokens * K, []
    for e in range(E):  # halving shares, capped at the tokens (the dry run's skew)
        c = min(tokens, left if e == E - 1 else max(1, left // 2))
        out.append(c)
        left -= c
    return out


def forced_table(torch, sp, dry, device, model, standin):
    """The run's forced (T, K) expert table (moe_models.forced_indices for the run's tokens
    per expert; the dry run's tiny batch of 2 x 16 tokens routed by forced_counts_for) on the
    device; a stand-in model is handed it, for it forces its own routing. The per-run loops of
    measure_moe_autocast, _s10 and _fsdp2 (this script's own loop builds it with its model)."""
    import moe_models
    c = sp["cfg"]
    tokens = (2 * 16) if dry else c["batch"] * c["seq"]
    counts = forced_counts_for(sp["routing"], tokens) if dry else sp["counts"]
    forced = moe_models.forced_indices(tokens, sp["top_k"], counts).to(device)
    if standin:
        for m in model.modules():
            if hasattr(m, "forced") and hasattr(m, "topk"):
                m.forced = forced
        model.forced = forced
    return forced


def batch_forward(torch, sp, cfg, dry, device, standin):
    """The run's batch (ids and labels, int64, drawn in that order from the seeded generator;
    2 x 16 over a vocabulary of 512 in a dry run) and forward(model) -> (output, loss): the
    transformers model called as users call it (labels in, out.loss), the stand-in with
    torch_models.decoder_loss(cfg) over its logits."""
    c = sp["cfg"]
    vocab = 512 if dry else c["vocab"]
    batch, seq = (2, 16) if dry else (c["batch"], c["seq"])
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)
    if standin:
        import torch_models
        loss_of = torch_models.decoder_loss(cfg)

        def forward(m):
            logits = m(ids)
            return logits, loss_of(logits, labels)
    else:
        def forward(m):
            o = m(input_ids=ids, labels=labels, use_cache=False)
            return o, o.loss
    return forward


def step_loop(torch, cuda, sp, model, opt, forward, result, marks, region=None, logits_of=None):
    """memsim's default loop with the output kept (`step.keep_output: true`): sp["warmup"]
    warm-up steps then the measured one, each zero_grad(set_to_none), forward (under
    region(), a context manager, where given), backward, optimizer step. The measured step's
    marks go to `marks` (measured_step_begin with the peaks reset, forward_end, backward_end,
    optimizer_end), the loss's dtype and, with logits_of(output), the logits' dtype to
    `result`. Returns (output, loss, the begin mark) of the measured step, the output and loss
    still alive. The loop of measure_moe_autocast, _s10 and _fsdp2."""
    out = loss = begin = None
    for step in range(sp["warmup"] + 1):
        measured = step == sp["warmup"]
        if measured:
            begin = stats(torch, cuda)
            marks["measured_step_begin"] = begin
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        if region is not None:
            with region():
                out, loss = forward(model)
        else:
            out, loss = forward(model)
        if measured:
            marks["forward_end"] = stats(torch, cuda)
            result["loss_dtype"] = str(loss.dtype)
            if logits_of is not None:
                lg = logits_of(out)
                result["logits_dtype"] = None if lg is None else str(lg.dtype)
        loss.backward()
        if measured:
            marks["backward_end"] = stats(torch, cuda)
        opt.step()
        if measured:
            marks["optimizer_end"] = stats(torch, cuda)
    return out, loss, begin


def tokens_per_expert(torch, forced, experts):
    """How many tokens the forced table sends to each expert (the record's tokens_per_expert)."""
    return torch.bincount(forced.reshape(-1).cpu(), minlength=experts).tolist()


def build_standin(torch, sp, device, dry):
    import moe_models as mm
    import torch_models as tm
    cfg = standin_cfg(sp, dry)
    model = mm.MoeForCausalLM(cfg)
    loss = tm.decoder_loss(cfg)
    forced = model.forced
    return model, (lambda m, ids, labels: m(ids)), loss, forced, cfg


def config_from_dict(d):
    """A transformers config from a config.json's dict: its dtype keys dropped (the run
    chooses), no KV cache; the model type's own config class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    for k in ("torch_dtype", "dtype"):
        d.pop(k, None)
    d["use_cache"] = False
    return CONFIG_MAPPING[d["model_type"]].from_dict(d)


def from_config(transformers, config, attention, experts_impl, **kw):
    """AutoModelForCausalLM.from_config with the attention and experts implementations (a
    release without the experts keyword gets it through the attribute alone), then every
    module's config._experts_implementation set: the switch use_experts_implementation reads
    at every call. measure_moe_autocast and measure_moe_s10 build theirs with it too."""
    try:
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attention, experts_implementation=experts_impl, **kw)
    except (TypeError, ValueError):  # a release without the keyword: the attribute below
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, **kw)
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_experts_implementation"):
            try:
                c._experts_implementation = experts_impl
            except Exception:  # noqa: BLE001
                pass
    return model


def build_transformers(torch, sp, device, dry):
    import transformers
    with open(os.path.join(CONFIGS, sp["model_type"] + ".json")) as f:
        d = json.load(f)
    if dry:
        d.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, vocab_size=512, max_position_embeddings=64)
        if d["model_type"] == "deepseek_v3":  # MLA: a key/value head per query head
            d.update(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=8)
        for k in ("moe_intermediate_size", "shared_expert_intermediate_size", "head_dim"):
            if k in d:
                d[k] = 16 if k == "head_dim" else 24
    config = config_from_dict(d)
    dtype = torch.bfloat16 if sp["dtype"] == "bf16" else torch.float32
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": dtype}
    model = from_config(transformers, config, "eager", sp["experts_impl"], **kw)
    import moe_models as mm
    c = sp["cfg"]
    tokens = (2 * 16) if dry else c["batch"] * c["seq"]
    counts = forced_counts_for(sp["routing"], tokens) if dry else sp["counts"]
    forced = mm.forced_indices(tokens, sp["top_k"], counts)

    def forward(m, ids, labels):
        return m(input_ids=ids, labels=labels, use_cache=False)

    def loss_fn(out, labels):
        return out.loss

    return model, forward, loss_fn, forced, None


def code_of(model):
    """The source of the experts forward and the router forward that actually run."""
    out = {}
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls.endswith("Experts") and "experts" not in out:
            out["experts_class"] = cls
            try:
                out["experts"] = inspect.getsource(type(m).forward)
            except (OSError, TypeError):
                out["experts"] = "?"
            c = getattr(m, "config", None)
            out["experts_implementation"] = getattr(c, "_experts_implementation", None)
        if (cls.endswith("TopKRouter") or cls.endswith("Router")) and "router" not in out:
            out["router_class"] = cls
            try:
                out["router"] = inspect.getsource(type(m).forward)
            except (OSError, TypeError):
                out["router"] = "?"
        if (cls.endswith("SparseMoeBlock") or cls.endswith("MoE")) and "block" not in out:
            try:
                out["block"] = inspect.getsource(type(m).forward)
            except (OSError, TypeError):
                out["block"] = "?"
    return out


def run_one(sp, out_dir):
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dry = not cuda
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=dry)
    if cuda:
        gpu_common.init_cuda(torch, result)
        gpu_common.record_history(torch)
    torch.manual_seed(0)
    build = build_standin if sp["impl"] == "standin" else build_transformers
    default_dtype = torch.get_default_dtype()
    if sp["dtype"] == "bf16":
        torch.set_default_dtype(torch.bfloat16)
    try:
        ctx = device if hasattr(torch.device, "__enter__") else None
        if ctx is not None:
            with ctx:
                model, forward, loss_fn, forced, cfg = build(torch, sp, device, dry)
        else:
            model, forward, loss_fn, forced, cfg = build(torch, sp, device, dry)
    finally:
        torch.set_default_dtype(default_dtype)
    model = model.to(device)
    model.train()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["code"] = code_of(model)
    if sp["impl"] == "transformers":
        import transformers
        result["transformers_version"] = transformers.__version__
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    # The forced routing on the device (before the measured step).
    forced = forced.to(device)
    routed = []
    if sp["impl"] == "standin":
        for m in model.modules():
            if hasattr(m, "forced") and hasattr(m, "topk"):
                m.forced = forced
    orig_topk = torch.topk

    def forced_topk(*args, **kwargs):
        v, i = orig_topk(*args, **kwargs)
        if tuple(i.shape) == tuple(forced.shape):
            i.data.copy_(forced)
            routed.append(1)
        return v, i

    if sp["impl"] == "transformers":
        torch.topk = forced_topk
    result["marks"] = {"after_model": stats(torch, cuda)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True if cuda else False)
    c = cfg if cfg is not None else sp["cfg"]
    vocab = 512 if dry else c["vocab"]
    batch, seq = (2, 16) if dry else (c["batch"], c["seq"])
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)
    out = loss = None
    t0 = time.time()
    try:
        for step in range(sp["warmup"] + 1):
            measured = step == sp["warmup"]
            if measured:
                result["marks"]["measured_step_begin"] = stats(torch, cuda)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
            opt.zero_grad(set_to_none=True)
            out = forward(model, ids, labels)
            if measured:
                result["marks"]["forward_end"] = stats(torch, cuda)
            loss = loss_fn(out, labels)
            loss.backward()
            if measured:
                result["marks"]["backward_end"] = stats(torch, cuda)
            opt.step()
            if measured:
                result["marks"]["optimizer_end"] = stats(torch, cuda)
    finally:
        torch.topk = orig_topk
    result["router_calls_forced"] = len(routed)
    counts = torch.bincount(forced.reshape(-1).cpu(), minlength=sp["experts"]).tolist()
    result["tokens_per_expert"] = counts
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.device_memory_at_end(torch, result, keep_info=False)
        gpu_common.dump_snapshot(torch, out_dir, sp["name"], strip_frames)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


# --------------------------------------------------------------------------- driver
SNAPSHOTS_LIMIT = 8 << 20  # the archive's most bytes: snapshots are dropped from the end past it


def pack_snapshots(out_dir, results, archive):
    """OUTDIR/archive of the runs' snapshots within SNAPSHOTS_LIMIT (says how many it kept);
    the pickles are removed (measure_moe_autocast's too)."""
    pickles = gpu_common.result_pickles(out_dir, results)
    kept = gpu_common.pack_snapshots(out_dir, pickles, archive, limit=SNAPSHOTS_LIMIT,
                                     keep_on_error=False)
    if kept is not None and len(kept) < len(pickles):
        print(f"snapshots kept: {len(kept)} of {len(pickles)} (8 MiB limit)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=90.0, per_run=40.0)
    a = ap.parse_args()
    if gpu_common.run_one_if_child(a, SPECS, run_one):
        return
    chosen = gpu_common.select_by_name(SPECS, a.only)
    if a.list:
        for s in chosen:
            print(f"{s['name']:48s} {s['impl']:12s} {s['routing']:9s} {s['estimate']:5.1f} s")
        print(f"{len(chosen)} runs, about {sum(s['estimate'] for s in chosen):.0f} s (estimate)")
        return
    os.makedirs(a.out_dir, exist_ok=True)
    t_start = time.time()
    have_tf = importlib.util.find_spec("transformers") is not None
    try:
        import torch
        versions = dict(torch=torch.__version__)
    except Exception:  # noqa: BLE001
        versions = {}
    if have_tf:
        try:
            import transformers
            versions["transformers"] = transformers.__version__
        except Exception as e:  # noqa: BLE001
            versions["transformers_error"] = repr(e)

    def skip(sp):
        if sp["impl"] == "transformers" and not have_tf:
            return ("skipped: transformers is not importable by " + sys.executable,
                    f"SKIPPED {sp['name']}: no transformers here")
        return None

    def report(sp, r):
        pa, pr = r.get("measured_step_peak_allocated"), r.get("measured_step_peak_reserved")
        print(f"{sp['name']:48s} peak allocated {pa} reserved {pr} ({time.time() - t_start:5.1f} s)",
              flush=True)

    loop = gpu_common.ChildLoop(__file__, a.out_dir, a.budget, t_start, per_run=a.per_run,
                                min_left=lambda sp: 5.0, not_run="quiet", failed_show=400,
                                timeout_note="plain", error_show=0, process_facts=False,
                                skip=skip)
    results, failures = gpu_common.run_children(chosen, loop, report)
    gpu_common.write_json(os.path.join(a.out_dir, "moe_runs.json"),
                          {"versions": versions, "results": results, "failures": failures})
    pack_snapshots(a.out_dir, results, "moe_snapshots.tar.xz")
    gpu_common.remove_run_files(a.out_dir, results)
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
