#!/usr/bin/env python3
"""Measures HF Trainer itself (transformers' `Trainer.train()`, not a replica of its step):
what tools/gpu/measure_hft.py's replicated step leaves out (accelerate's
convert_outputs_to_fp32 on the returned logits, clip_grad_norm_ at Trainer's default
max_grad_norm 1.0, the dataloader's batch copies, the LR scheduler), and LoRA under
Trainer(bf16=True), which memsim refuses (`lora` with `precision.autocast`).

    python3 tools/gpu/measure_trainer.py OUT_DIR [--budget SECONDS] [--only NAME...] [--list]

Each run is its own Python process (a fresh caching allocator) with a timeout; a failing
run is recorded with its stderr and the next one runs; the parent writes
OUT_DIR/trainer_runs.json and OUT_DIR/trainer_snapshots.tar.xz.

Model and batch as measure_hft.py's runs (Qwen2ForCausalLM from
tests/data/gpu/hft/configs/qwen2_l4_d1024_mha.json, built on the GPU in fp32, SDPA,
batch 4 x 1024): Trainer(bf16=True, gradient_checkpointing=True, max_steps=2,
per_device_train_batch_size=4, the default optim and max_grad_norm, no saving, no
reporting, no eval). The second step is the measured one: a TrainerCallback resets the
peak statistics in on_step_begin of step 2 and records memory_stats() there, at
on_pre_optimizer_step (after backward and clipping), on_optimizer_step and on_step_end.
The nearest memsim scenario is tests/data/gpu/hft/hft_bf16_sdpa_gc.yaml (the replicated
step): its prediction is the reference each run is compared with, and the difference is
what Trainer adds. Nothing here is a blind prediction of Trainer's extras: memsim does not
model them (docs/hf-trainer.md).
"""
import argparse
import json
import os
import time

import gpu_common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIG = "tests/data/gpu/hft/configs/qwen2_l4_d1024_mha.json"

RUNS = [
    dict(name="trainer_bf16_sdpa_gc", lora=False, max_grad_norm=None,
         what="Trainer(bf16=True, gradient_checkpointing=True), full fine-tune, defaults"),
    dict(name="trainer_bf16_sdpa_gc_noclip", lora=False, max_grad_norm=0.0,
         what="the same with max_grad_norm=0 (no clip_grad_norm_): isolates clipping"),
    dict(name="trainer_lora_bf16_sdpa_gc", lora=True, max_grad_norm=None,
         what="PEFT LoRA r16 alpha 32 on q_proj/v_proj under Trainer(bf16=True, "
              "gradient_checkpointing=True): memsim refuses LoRA under autocast"),
]
KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
        "reserved_bytes.all.peak", "allocation.all.allocated", "segment.all.current")


def stats(torch):
    return gpu_common.memory_stats(torch, True, KEYS)


def trim(snapshot):
    return gpu_common.trim_frames(
        snapshot, ("modeling_", "peft/", "trainer", "accelerate/", "checkpoint", "optim",
                   "clip_grad", "sdpa_attention", "loss_utils", "measure_trainer"), 6)


def run_one(sp, out_dir):
    import torch
    result = dict(spec=sp, torch_version=torch.__version__)
    path = os.path.join(out_dir, sp["name"] + ".json")
    if not torch.cuda.is_available():
        result["skipped"] = "dry run: no CUDA"
        gpu_common.write_json(path, result)
        return
    import transformers
    from transformers import (AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback,
                              TrainingArguments)
    result["transformers_version"] = transformers.__version__
    import accelerate
    result["accelerate_version"] = accelerate.__version__
    torch.cuda.init()
    result["gpu"] = torch.cuda.get_device_name()
    marks = result["marks"] = {}
    gpu_common.record_history(torch)
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(REPO, CONFIG)))
    for k in ("torch_dtype", "dtype"):
        cfg.pop(k, None)
    cfg["use_cache"] = False
    config = AutoConfig.for_model(**cfg)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 dtype=torch.float32)
    marks["after_model"] = stats(torch)
    if sp["lora"]:
        import peft
        result["peft_version"] = peft.__version__
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
            task_type="CAUSAL_LM"))
    B, S, V = 4, 1024, cfg["vocab_size"]
    g = torch.Generator().manual_seed(0)
    data = [dict(input_ids=torch.randint(0, V, (S,), generator=g)) for _ in range(2 * B)]
    for d in data:
        d["labels"] = d["input_ids"].clone()

    class Marks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 1:  # the second step starts: the measured one
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                marks["measured_step_begin"] = stats(torch)

        def on_pre_optimizer_step(self, args, state, control, **kw):
            marks[f"pre_optimizer_step_{state.global_step}"] = stats(torch)

        def on_optimizer_step(self, args, state, control, **kw):
            marks[f"optimizer_step_{state.global_step}"] = stats(torch)

        def on_step_end(self, args, state, control, **kw):
            marks[f"step_end_{state.global_step}"] = stats(torch)
            if state.global_step == 2:
                result["measured_step_peak_allocated"] = torch.cuda.max_memory_allocated()
                result["measured_step_peak_reserved"] = torch.cuda.max_memory_reserved()

    kw = dict(output_dir=os.path.join(out_dir, "trainer_" + sp["name"]), max_steps=2,
              per_device_train_batch_size=B, bf16=True, gradient_checkpointing=True,
              report_to="none", save_strategy="no", logging_strategy="no",
              dataloader_num_workers=0, seed=0)
    if sp["max_grad_norm"] is not None:
        kw["max_grad_norm"] = sp["max_grad_norm"]
    args = TrainingArguments(**kw)
    result["training_args"] = {k: str(getattr(args, k, None)) for k in (
        "optim", "max_grad_norm", "gradient_checkpointing_kwargs", "bf16", "lr_scheduler_type",
        "weight_decay", "adam_beta1", "learning_rate", "remove_unused_columns")}
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Marks()])
    t0 = time.time()
    out = trainer.train()
    result["train_seconds"] = time.time() - t0
    result["train_loss"] = float(out.training_loss)
    layers = [m for m in model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    result["checkpointing"] = [repr(getattr(m._gradient_checkpointing_func, "keywords", None))
                               for m in layers[:1]]
    result["whole_run_peak_allocated"] = torch.cuda.max_memory_allocated()
    gpu_common.dump_snapshot(torch, out_dir, sp["name"], trim, protocol=None)
    gpu_common.write_json(path, result, default=str)


def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=60.0)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    if a.one:
        run_one(next(r for r in RUNS if r["name"] == a.one), a.out_dir)
        return
    runs = gpu_common.select_by_name(RUNS, a.only)
    if a.list:
        for r in runs:
            print(f"{r['name']:32s} {r['what']}")
        return
    t0 = time.time()

    def report(r, res):
        print(f"{r['name']:32s} peak alloc {res.get('measured_step_peak_allocated')} "
              f"reserved {res.get('measured_step_peak_reserved')} "
              f"{res.get('skipped', '')}", flush=True)

    # A run's timeout is the budget left (no --per-run given); the runs' JSON files stay.
    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t0,
                                per_run=a.per_run, min_left=lambda r: 10.0, not_run="quiet",
                                failed_show=600, timeout_note="timed out", error_keep=2000,
                                error_show=0, process_facts=False)
    results, failures = gpu_common.run_children(runs, loop, report)
    gpu_common.write_json(os.path.join(a.out_dir, "trainer_runs.json"),
                          dict(results=results, failures=failures))
    pickles = gpu_common.result_pickles(a.out_dir, results)
    if pickles:
        gpu_common.write_tar_xz(os.path.join(a.out_dir, "trainer_snapshots.tar.xz"), a.out_dir,
                                pickles)
    print(f"{len(results)} runs, {len(failures)} failed, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
