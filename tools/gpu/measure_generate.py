#!/usr/bin/env python3
"""Measures Hugging Face generate() on a CUDA GPU (issue #17 item 1), for memsim's
step.kind generate (sim/step/generate.h, docs/generate.md).

    python3 tools/gpu/measure_generate.py OUTDIR [--budget SECONDS] [--only NAME...] [--list]

Each configuration runs in its own Python process (a fresh caching allocator and CUDA
context) with a per-run timeout: transformers' own model built from a small config
(AutoModelForCausalLM.from_config, bf16 weights, eager attention unless the run says sdpa),
moved to the GPU, the prompts (input_ids and an all-ones attention_mask, int64) on the GPU,
torch.cuda.reset_peak_memory_stats(), then

    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N,
                         do_sample=False[, cache_implementation="static", disable_compile=True])

with torch.cuda.memory._record_memory_history on from before the model is built. Per run
it records torch.cuda.memory_stats() at the marks (after_model, after_inputs,
after_generate), the peaks of the generate() call (max_memory_allocated/reserved after the
reset), the output length (an early EOS stop would shorten the loop), the versions, and the
memory snapshot (frames cut to transformers' generation/cache/model files). The parent
writes OUTDIR/generate_runs.json (every result, failures with their stderr) and
OUTDIR/generate_snapshots.tar.xz. A failing run is recorded and the next one runs; no run
starts after --budget seconds.

memsim's blind predictions for these runs: tests/data/gpu/generate_predictions.json (the
scenarios: tests/data/gpu/generate/NAME.yaml). memsim models transformers v4.45's generate
and cache classes; the machine has a 5.x release, whose differences the predictions file
lists.

Without CUDA (a dry run on a CPU machine) the same code runs on the CPU at a tiny size when
transformers is importable, and is skipped with a message otherwise; --list always works.
"""
import argparse
import importlib.util
import os
import sys
import time
import traceback

import gpu_common

# A Llama-like 4-layer model of d_model 1024 (GQA 16/4), the other rows at the same size.
BASE = dict(layers=4, d_model=1024, heads=16, kv_heads=4, d_ff=2816, vocab=32000)
BATCH, PROMPT, NEW = 4, 512, 64


def spec(name, model_type, cache="dynamic", attention="eager", **extra):
    cfg = dict(BASE, **extra)
    return dict(name=name, model_type=model_type, cfg=cfg, cache=cache, attention=attention,
                batch=BATCH, prompt=PROMPT, new_tokens=NEW, dtype="bf16")


SPECS = [
    spec("gen_llama_l4_d1024_b4_p512_n64_dynamic", "llama"),
    spec("gen_llama_l4_d1024_b4_p512_n64_static", "llama", cache="static"),
    spec("gen_qwen3_l4_d1024_b4_p512_n64_dynamic", "qwen3", head_dim=64),
    spec("gen_qwen3_l4_d1024_b4_p512_n64_static", "qwen3", cache="static", head_dim=64),
    # Sliding window 256 < prompt: transformers 5.x bounds the sliding layers' cache, v4.45's
    # DynamicCache did not (memsim models v4.45; see the predictions file).
    spec("gen_mistral_l4_d1024_b4_p512_n64_w256_dynamic", "mistral", sliding_window=256),
    spec("gen_llama_l4_d1024_b4_p512_n64_dynamic_sdpa", "llama", attention="sdpa"),
    # 5.x's offloaded cache (DynamicCache(config, offloading=True)): layers to the host after
    # their update, the next one prefetched on a side stream; memsim with
    # generate.cache_classes: v5 (added 2026-11-27, predicted before this run).
    spec("gen_llama_l4_d1024_b4_p512_n64_offloaded", "llama", cache="offloaded"),
]
EST_SECONDS = 9.0


def hf_config(sp):
    """The transformers config of a spec (a dict for AutoConfig.for_model)."""
    c = sp["cfg"]
    d = dict(vocab_size=c["vocab"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
             num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
             num_key_value_heads=c["kv_heads"], max_position_embeddings=4096,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if "head_dim" in c:
        d["head_dim"] = c["head_dim"]
    if sp["model_type"] == "mistral":
        d["sliding_window"] = c["sliding_window"]
    if sp["model_type"] == "qwen3":
        d["use_sliding_window"] = False
    return d


STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
              "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "requested_bytes.all.current", "requested_bytes.all.peak",
              "active_bytes.all.peak", "num_alloc_retries", "num_ooms", "segment.all.current",
              "allocation.all.allocated")


def stats(torch, cuda):
    return gpu_common.memory_stats(torch, cuda, STATS_KEYS)


def trim_frames(snapshot):
    """Keeps each entry's frames from generation, cache and model code only (at most 4)."""
    keep = ("generation", "cache_utils", "modeling_", "masking_utils", "measure_generate")

    def cut(frames):
        return [{k: f.get(k) for k in ("filename", "line", "name")} for f in frames
                if any(k in f.get("filename", "") for k in keep)][:4]

    return gpu_common.map_frames(snapshot, cut)


def run_one(sp, out_dir):
    import torch
    import transformers
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device),
                  transformers_version=transformers.__version__)
    if not cuda:  # dry run: the same code at a CPU size
        sp = dict(sp, cfg=dict(sp["cfg"], layers=2, d_model=64, heads=4, kv_heads=2, d_ff=172,
                               vocab=512), batch=2, prompt=12, new_tokens=5)
        if "head_dim" in sp["cfg"]:
            sp["cfg"]["head_dim"] = 16
        if "sliding_window" in sp["cfg"]:
            sp["cfg"]["sliding_window"] = 8
    if cuda:
        gpu_common.init_cuda(torch, result)
        gpu_common.record_history(torch)
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(sp["model_type"], **hf_config(sp))
    dtype = torch.bfloat16
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": dtype}
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=sp["attention"], **kw)
    model = model.to(device)
    model.eval()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    result["marks"] = {"after_model": stats(torch, cuda)}
    ids = torch.randint(3, sp["cfg"]["vocab"], (sp["batch"], sp["prompt"]), device=device)
    mask = torch.ones(sp["batch"], sp["prompt"], dtype=torch.long, device=device)
    result["marks"]["after_inputs"] = stats(torch, cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    gen_kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=sp["new_tokens"],
                  do_sample=False)
    if sp["cache"] == "static":
        gen_kw.update(cache_implementation="static", disable_compile=True)
    if sp["cache"] == "offloaded":
        gen_kw.update(cache_implementation="offloaded")
    t0 = time.time()
    try:
        out = model.generate(**gen_kw)
    except (TypeError, ValueError) as e:  # a release without generation_config.disable_compile
        if "disable_compile" not in str(e):
            raise
        gen_kw.pop("disable_compile")
        result["retried_without_disable_compile"] = str(e)[-500:]
        out = model.generate(**gen_kw)
    result["generate_seconds"] = time.time() - t0
    result["marks"]["after_generate"] = stats(torch, cuda)
    result["output_shape"] = list(out.shape)
    result["generation_config"] = {k: str(v) for k, v in model.generation_config.to_dict().items()}
    if cuda:
        torch.cuda.synchronize()
        result["generate_peak_allocated"] = torch.cuda.max_memory_allocated()
        result["generate_peak_reserved"] = torch.cuda.max_memory_reserved()
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames, streams=False)
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result)
    return result


def pack(out_dir, pickles):
    target = os.path.join(out_dir, "generate_snapshots.tar.xz")
    gpu_common.write_tar_xz(target, out_dir, pickles)
    if os.path.getsize(target) > 8 * 2**20:  # keep under the size the lead can commit
        os.remove(target)
        return False
    return True


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=90.0, per_run=40.0)
    a = ap.parse_args()
    chosen = gpu_common.select_by_name(SPECS, a.only)
    if a.list:
        for sp in chosen:
            print(f"{sp['name']:52s} {sp['model_type']:8s} cache {sp['cache']:8s} "
                  f"{sp['attention']:6s} ~{EST_SECONDS:.0f} s")
        print(f"{len(chosen)} runs, about {EST_SECONDS * len(chosen):.0f} s on an H100 "
              f"(each a fresh process: CUDA and transformers start-up included)")
        return
    os.makedirs(a.out_dir, exist_ok=True)
    if a.one:
        run_one(next(s for s in SPECS if s["name"] == a.one), a.out_dir)
        return
    t_start = time.time()
    skipped = {}
    if importlib.util.find_spec("transformers") is None:
        for sp in chosen:
            skipped[sp["name"]] = "skipped: transformers is not importable by " + sys.executable
        print(f"transformers is not importable here ({sys.executable}): every run skipped", flush=True)
        chosen = []

    def report(sp, r):
        pa, pr = r.get("generate_peak_allocated"), r.get("generate_peak_reserved")
        print(f"{sp['name']:52s} peak allocated {pa} reserved {pr} out {r.get('output_shape')} "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, min_left=lambda sp: 5.0, not_run="quiet",
                                failed_show=600, timeout_note="plain", error_show=0,
                                process_facts=False)
    results, failures = gpu_common.run_children(chosen, loop, report)
    failures = dict(skipped, **failures)
    gpu_common.write_json(os.path.join(a.out_dir, "generate_runs.json"),
                          {"results": results, "failures": failures})
    pickles = gpu_common.result_pickles(a.out_dir, results)
    try:
        if pickles:
            pack(a.out_dir, pickles)
    except Exception:
        failures["pack"] = traceback.format_exc()[-2000:]
    for p in pickles:
        os.remove(os.path.join(a.out_dir, p))
    gpu_common.remove_run_files(a.out_dir, results)
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s",
          flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
