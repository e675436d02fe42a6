#!/usr/bin/env python3
"""Measures transformers 5.17's own Qwen3-MoE under FSDP2 (`fully_shard`) on ONE CUDA GPU
standing in for rank 0 of a world of 8 (PyTorch's fake process group), with a forced
balanced routing: memsim's MoE-under-FSDP2 model (sim/parallel/fsdp2.h, docs/moe.md "With
DDP and FSDP2") was never measured. A composition of two measured families, whose code it
imports rather than copies:

  * tools/gpu/measure_moe_s10.py: the model from config.json by
    AutoModelForCausalLM.from_config(dtype=, attn_implementation="eager",
    experts_implementation=), PEFT get_peft_model (target_parameters LoRA),
    gradient_checkpointing_enable, the default experts implementation recorded;
    tools/gpu/measure_moe.py: the shape, the routings, moe_models.forced_indices;
  * tools/gpu/measure_fsdp2.py: fsdp2_api (refuses by name what this torch lacks), the fake
    world and its mesh (make_mesh), fully_shard on every decoder layer then on the root
    (apply_fsdp: torchtitan's apply_fsdp; the root keeps its default reshard), shard_shapes.

    python3 tools/gpu/measure_moe_fsdp2.py OUTDIR [--budget SECONDS] [--per-run SECONDS]
                                           [--only NAME|GLOB...] [--list]

Model: tests/data/gpu/moe/configs/qwen3_moe.json (2 layers, d 1024, 16 heads / 4 KV heads,
vocab 4096, 8 experts of 768, top 2), batch 16 x 256, eager attention, routing forced
balanced (1024 tokens per expert). The order a trainer uses: from_config on the GPU,
get_peft_model, gradient_checkpointing_enable (HF Trainer calls it after PEFT), then
fully_shard(layer) for every model.model.layers[i] and fully_shard(root) (the PeftModel
where there is one: Accelerate's fsdp2_prepare_model shards the model it is given),
AdamW(foreach) over the parameters that require grad (DTensor shards), one warm-up step,
then the measured step (memsim's `step.keep_output: true` loop):

    opt.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, use_cache=False); loss = out.loss
    loss.backward(); opt.step()

RUNS (value order; a budget cut drops the last):
 1. moefsdp2_qwen3_moe_fp32_mp_bf16: full fine-tuning, fp32 parameters,
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), eager experts;
 2. moefsdp2_qwen3_moe_bf16_tplora_hfckpt: bf16 weights, PEFT target_parameters LoRA r 16 on
    mlp.experts.gate_up_proj / down_proj with PEFT's fp32 adapters, HF gradient
    checkpointing (non-reentrant), FSDP2 without a MixedPrecisionPolicy (memsim models the
    policy for fp32 parameters only and refuses it over bf16 ones). The bf16 frozen weights
    and the fp32 adapters share a layer's group: torch >= 2.8 accepts that (pytorch/pytorch
    PR #154103 "[FSDP2] allow different dtypes for no grad model params": _init_mp_dtypes
    checks the trainable parameters' dtype only, as in pytorch/pytorch c40048472cc4
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py); an older torch fails the run with
    "FSDP expects uniform original parameter dtype" and the next runs;
 3. moefsdp2_qwen3_moe_fp32_mp_bf16_grouped_mm: run 1 with experts_implementation
    "grouped_mm" (transformers 5.x's default on CUDA, get_correct_experts_implementation).

Routing is forced as in measure_moe_s10.py: torch.topk (and torch.Tensor.topk) wrapped so
that a (T, K) top-k over the E experts has its indices overwritten in place with
moe_models.forced_indices (Qwen3-MoE's router calls torch.topk(router_probs, top_k) on
(T, E); a checkpointed layer's re-run routes the same way): measure_moe_s10.install_forced_topk
itself, with the forced table and the batch of measure_moe (forced_table, batch_forward) and
the model building, LoRA and HF checkpointing of measure_moe_s10 (build_model, adapt).

Writes OUTDIR/moe_fsdp2_runs.json (each run's spec, versions, rank 0's shard shapes,
memory_stats at the marks after_mesh, after_model, after_fully_shard, measured_step_begin,
forward_end, backward_end, optimizer_end, the measured step's and the whole run's peaks,
the experts implementation that ran and the default, PEFT's version / adapters / trainable
count, the checkpoint keywords; failures with their stderr) and
OUTDIR/moe_fsdp2_snapshots.tar.xz (torch.cuda.memory._snapshot() per run, frames trimmed).

--self-test runs every run through its GPU path on the CPU (install_fakes: transformers and
peft as tools/gpu/moe_s10_fakes.py, fully_shard recording its calls) and checks the calls.

Without CUDA (the dry run here: Debian's torch 1.13, no transformers, no peft) each run
refuses by name what this machine lacks (fully_shard / fake process group, transformers,
peft, HF checkpointing) and runs the rest: the loop on moe_models' stand-in at a tiny size
with the forced routing, the optimizer over the trainable parameters and the recording
("dry_runs" in the JSON, never "results").

memsim's scenarios: tests/data/gpu/moe_fsdp2/NAME.yaml; blind predictions:
tests/data/gpu/moe_fsdp2_predictions.json (tools/gpu/predict_moe_fsdp2.py), committed
before any measurement.
"""
import argparse
import importlib.util
import os
import sys
import time

import gpu_common
import measure_moe as mm  # shape, routings, stats, code_of, strip_frames
import measure_moe_s10 as ms  # spec, lora, build_model, adapt, install_forced_topk, routing_facts
import measure_fsdp2 as mf  # fsdp2_api, make_mesh, apply_fsdp, shard_shapes

TOPIC = "moe_fsdp2"
FAKES_ENV = "MEMSIM_MOE_FSDP2_FAKES"  # set by --self-test for its children
FAKE_CALLS = None  # the stand-in fully_shard's record (--self-test's children only)
DATA = "tests/data/gpu/moe_fsdp2"
EXPERT_PARAMS = ms.EXPERT_PARAMS


def spec(name, params, param_dtype=None, reduce_dtype=None, lora=None, hf_ckpt=None,
         experts_impl="eager", seconds=12.0, why=""):
    """A run: the s10 Qwen3-MoE spec (measure_moe_s10.spec) plus FSDP2's keys
    (measure_fsdp2.spec's: world, replicate, reshard, param_dtype, reduce_dtype)."""
    sp = ms.spec(name, "qwen3_moe", ms.QWEN3, params=params, lora=lora, hf_ckpt=hf_ckpt,
                 expert_d_ff=768, seconds=seconds)
    sp.update(experts_impl=experts_impl, world=8, replicate=1, reshard="true",
              param_dtype=param_dtype, reduce_dtype=reduce_dtype, init="gpu",
              timeout=45.0, why=why, scenario=f"{DATA}/{name}.yaml")
    return sp


SPECS = [
    spec("moefsdp2_qwen3_moe_fp32_mp_bf16", "fp32", "bf16", "fp32",
         why="full fine-tuning under FSDP2 with torchtitan's MixedPrecisionPolicy: the 3-D "
         "experts sharded by whole experts, gathered per layer in bf16, fp32 reduce-scatter"),
    spec("moefsdp2_qwen3_moe_bf16_tplora_hfckpt", "bf16",
         lora=ms.lora(target_parameters=EXPERT_PARAMS), hf_ckpt="nonreentrant", seconds=13.0,
         why="PEFT target_parameters LoRA on the gathered experts (the merged W + delta "
         "whole on every rank), adapters in the layer's group, HF checkpointing"),
    spec("moefsdp2_qwen3_moe_fp32_mp_bf16_grouped_mm", "fp32", "bf16", "fp32",
         experts_impl="grouped_mm",
         why="run 1 with transformers 5.x's default experts implementation on CUDA"),
]


def trim_frames(snapshot):
    return gpu_common.trim_frames(
        snapshot, ("modeling_qwen3_moe", "integrations/moe", "peft", "measure_moe_fsdp2",
                   "_fully_shard", "optim", "checkpoint", "modeling_utils"), 6)


def decoder_layers(tf_model):
    """The transformers model's decoder layers (Qwen3MoeForCausalLM.model.layers)."""
    return list(tf_model.model.layers)


# --------------------------------------------------------------------------- one run
def run_one(sp, out_dir):
    if os.environ.get(FAKES_ENV) == "1":  # --self-test: transformers, peft and FSDP2 stand-ins
        install_fakes()
    import torch
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dry = not cuda
    have_tf = importlib.util.find_spec("transformers") is not None
    have_peft = importlib.util.find_spec("peft") is not None
    result = dict(spec=sp, torch_version=torch.__version__, device=str(device), dry_run=dry)
    skipped = []
    api, missing = mf.fsdp2_api(torch)
    if cuda:
        if api is None:
            raise RuntimeError(f"cannot measure FSDP2: {missing}")
        if not have_tf:
            raise RuntimeError("transformers is not importable by " + sys.executable)
        if sp["lora"] and not have_peft:
            raise RuntimeError("peft is not importable by " + sys.executable + ": run refused")
        torch.cuda.set_device(0)
        gpu_common.init_cuda(torch, result)
    marks = result["marks"] = {}
    mesh = None
    if api is not None:
        mesh = mf.make_mesh(torch, dist, api, sp, device.type)
        result["mesh"] = dict(shape=list(mesh.shape), dim_names=list(mesh.mesh_dim_names or ()),
                              backend=dist.get_backend() if dist.is_initialized() else None)
    else:
        skipped.append(f"{missing}: trained unsharded on the CPU (no process group, no fully_shard)")
    if cuda:
        gpu_common.fresh_history(torch, marks)
    torch.manual_seed(0)
    standin = not have_tf
    model, cfg = ms.build_model(torch, sp, device, standin, skipped)
    tf_model = model
    if not standin:
        import transformers
        result["transformers_version"] = transformers.__version__
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        result["default_experts_implementation"] = ms.default_experts_implementation(model)
        result["code"] = mm.code_of(model)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["parameter_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    marks["after_model"] = mm.stats(torch, cuda)
    model = ms.adapt(model, tf_model, sp, result, skipped, have_peft, standin)
    if api is not None:
        layers = decoder_layers(tf_model) if not standin else list(tf_model.layers)
        mf.apply_fsdp(torch, api, sp, model, mesh, blocks=layers)
        result["shards"] = mf.shard_shapes(model)
        result["fully_shard_calls"] = len(layers) + 1
    marks["after_fully_shard"] = mm.stats(torch, cuda)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    result["optimizer_parameters"] = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in trainable)
    forced = mm.forced_table(torch, sp, dry, device, model, standin)
    routed, routed_method, passed = [], [], []
    opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True if cuda else False)
    forward = mm.batch_forward(torch, sp, cfg, dry, device, standin)
    restore = None if standin else ms.install_forced_topk(torch, forced, sp["experts"], routed,
                                                         routed_method, passed)
    out = loss = begin = None
    t0 = time.time()
    try:
        out, loss, begin = mm.step_loop(torch, cuda, sp, model, opt, forward, result, marks)
    finally:
        if restore is not None:
            restore()
    if skipped:
        result["skipped"] = "; ".join(skipped)
    ms.routing_facts(torch, result, forced, sp["experts"], routed, routed_method, passed)
    result["loss"] = float(loss)
    result["seconds"] = time.time() - t0
    if cuda:
        gpu_common.measured_step_peaks(torch, result)
        gpu_common.whole_run_peaks(result, begin)
        gpu_common.save_snapshot(torch, result, out_dir, sp["name"], trim_frames)
    if api is not None and dist.is_initialized():
        dist.destroy_process_group()
    if FAKE_CALLS is not None:
        result["self_test_fully_shard"] = FAKE_CALLS
    gpu_common.write_json(os.path.join(out_dir, sp["name"] + ".json"), result, default=str)
    return result


# --------------------------------------------------------------------------- self-test
def install_fakes():
    """The --self-test child's stand-ins: transformers and peft as tools/gpu/moe_s10_fakes.py
    (its model's decoder layers reachable as `.model.layers`, as Qwen3MoeForCausalLM's), and
    FSDP2's API (fully_shard recording each call's module and keywords, a mesh object, no
    process group), so that the GPU path of run_one (PEFT, HF checkpointing, fully_shard per
    layer then the root, the policy) runs on this CPU."""
    global FAKE_CALLS
    import moe_s10_fakes
    moe_s10_fakes.install()
    moe_s10_fakes._CausalLM.model = property(lambda self: self.inner)
    FAKE_CALLS = []

    class Policy:
        def __init__(self, param_dtype=None, reduce_dtype=None, output_dtype=None):
            self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype

    class Mesh:
        shape, mesh_dim_names = (8,), ("dp_shard",)

    def fully_shard(module, **kw):
        mp = kw.get("mp_policy")
        FAKE_CALLS.append(dict(module=type(module).__name__,
                               reshard=kw.get("reshard_after_forward", "default"),
                               param_dtype=None if mp is None else str(mp.param_dtype),
                               reduce_dtype=None if mp is None else str(mp.reduce_dtype)))

    api = (fully_shard, Policy, None, None)
    mf.fsdp2_api = lambda torch: (api, None)
    mf.make_mesh = lambda torch, dist, api, sp, device_type: Mesh()


def self_test(out_dir):
    """Every run on the CPU through its GPU path with the stand-ins of install_fakes, then
    checks what each recorded: fully_shard on each decoder layer (reshard True, the run's
    policy) then once on the root (default reshard), the forced routing reached the router's
    torch.topk, PEFT's fp32 adapters are the optimizer's parameters, HF checkpointing's
    use_reentrant False. Returns the exit status."""
    import json
    import subprocess
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, **{FAKES_ENV: "1"})
    p = subprocess.run([sys.executable, os.path.abspath(__file__), out_dir, "--budget", "100000",
                        "--per-run", "3000"], env=env, capture_output=True, text=True)
    print(p.stdout, end="")
    with open(os.path.join(out_dir, TOPIC + "_runs.json")) as f:
        doc = json.load(f)
    runs = {r["spec"]["name"]: r for r in doc.get("dry_runs", [])}
    bad = []
    for sp in SPECS:
        r = runs.get(sp["name"])
        if r is None:
            bad.append(f"{sp['name']}: no run ({doc['failures'].get(sp['name'], '?')[-300:]})")
            continue
        calls = r.get("self_test_fully_shard") or []
        pd = None if sp["param_dtype"] is None else "torch.bfloat16"
        rd = None if sp["reduce_dtype"] is None else "torch.float32"
        layers_ok = len(calls) == 3 and all(c["reshard"] is True and c["param_dtype"] == pd and
                                            c["reduce_dtype"] == rd for c in calls[:2])
        root = calls[-1] if calls else {}
        want = {"fully_shard layers": layers_ok,
                "fully_shard root": root.get("reshard") == "default" and
                root.get("module") == ("_PeftModel" if sp["lora"] else "_CausalLM"),
                "router_calls_forced>0": r.get("router_calls_forced", 0) > 0,
                "experts_implementation": r.get("experts_implementation") == sp["experts_impl"]}
        if sp["lora"]:
            want.update({"trainable": r.get("trainable_parameters", 0) > 0 and
                         r.get("trainable_parameters") == r.get("optimizer_parameters"),
                         "adapter_dtypes": r.get("adapter_dtypes") == ["torch.float32"]})
        if sp["hf_gradient_checkpointing"]:
            kw = r.get("gradient_checkpointing_kwargs") or {}
            want.update({"use_reentrant": kw.get("use_reentrant") is False,
                         "checkpointed_modules": r.get("checkpointed_modules") == 2})
        bad += [f"{sp['name']}: {k}" for k, ok in want.items() if not ok]
    print("self-test:", "FAILED " + "; ".join(bad) if bad else f"every run as intended ({len(runs)} runs)")
    return 1 if bad or p.returncode != 0 else 0


# --------------------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser()
    gpu_common.add_run_args(ap, budget=45.0, per_run=None)
    ap.add_argument("--self-test", action="store_true",
                    help="every run's GPU path on the CPU with transformers / peft / FSDP2 stand-ins")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test(a.out_dir))
    if gpu_common.run_one_if_child(a, SPECS, run_one):
        return
    chosen = gpu_common.select_by_name(SPECS, a.only)
    total = sum(s["estimate"] for s in chosen)
    if a.list:
        for s in chosen:
            print(f"{s['name']:46s} params {s['dtype']:5s} mp {s['param_dtype'] or '-'}/"
                  f"{s['reduce_dtype'] or '-'} experts {s['experts_impl']:10s} "
                  f"lora {'tp' if s['lora'] else '-':2s} ckpt {s['hf_gradient_checkpointing'] or '-':12s} "
                  f"{s['estimate']:5.1f} s")
        print(f"{len(chosen)} runs, about {total:.0f} s on an H200 (estimate)")
        return
    t_start = gpu_common.start_parent(a.out_dir, chosen, total, a.budget)
    versions = gpu_common.imported_versions()
    print(f"versions {versions}", flush=True)
    dry_runs = []

    accept = gpu_common.dry_run_accept(a.out_dir, dry_runs, t_start, 46)

    def report(sp, r):
        print(f"{sp['name']:46s} peak allocated {r.get('measured_step_peak_allocated')} reserved "
              f"{r.get('measured_step_peak_reserved')} forced {r.get('router_calls_forced')} "
              f"experts {r.get('experts_implementation')} peft {r.get('peft_version')} "
              f"({time.time() - t_start:5.1f} s)", flush=True)

    loop = gpu_common.ChildLoop(os.path.abspath(__file__), a.out_dir, a.budget, t_start,
                                per_run=a.per_run, min_left=lambda sp: 0.75 * sp["estimate"],
                                not_run="plain", failed_show=600, timeout_note="stderr",
                                error_show=400, process_facts=True)
    results, failures = gpu_common.run_children(chosen, loop, report, accept)
    out = {"versions": versions, "script": "tools/gpu/measure_moe_fsdp2.py",
           "results": results, "failures": failures}
    if dry_runs:
        out["dry_runs"] = dry_runs
    gpu_common.write_json(os.path.join(a.out_dir, TOPIC + "_runs.json"), out, default=str)
    gpu_common.pack_snapshots(a.out_dir, gpu_common.result_pickles(a.out_dir, results),
                              TOPIC + "_snapshots.tar.xz")
    print(f"{len(results)} runs, {len(failures)} failed or skipped, {time.time() - t_start:.0f} s",
          flush=True)


if __name__ == "__main__":
    gpu_common.run_main(main)
