#!/usr/bin/env python3
"""memsim's blind predictions for the runs of tools/gpu/measure_cp.py (context parallelism
under FSDP2; op-level SAC with SDPA), made before anything is measured. Run on the
development machine (no GPU needed):

    python3 tools/gpu/predict_cp.py [--memsim build/memsim] [--scenarios-only]

1. Writes memsim's scenario of every run, tests/data/gpu/cp/NAME.yaml: the hf-llama family
   at the run's shape (the stand-in tools/fixtures/torch_models.LlamaForCausalLM with
   v4.45's SDPA path: `model.attention: flash`), the loop measure_cp.py runs (AdamW
   foreach, one warm-up step) and the run's keys: for the cp runs parallel.data 8/N,
   parallel.context N, parallel.context_rotate, sharding fsdp2 with
   fsdp_mixed_precision bf16 / reduce_dtype fp32, fsdp_init gpu; for the sdpa runs
   precision.params bf16 and checkpoint.policy sac-op | none. Device preset h200.
2. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/cp_predictions.json: predict_fsdp2.py's fields (the measured step's peak
   allocated / reserved, the whole run's, the marks, the allocation count, where the peak
   falls, or memsim's refusal text) and the measured step's forward peak (the most
   allocated from the step's first event to the forward_end mark: measure_cp.py's
   forward_peak_allocated, max_memory_allocated() read at forward_end) and the most
   allocated / reserved during each SDPA call of the measured step (from the level before
   the call's first event through its events, forward and backward, as measure_cp.py's
   sdpa_call_peaks windows), with the memsim commit.

tests/test_gpu_cp_runs.cpp re-simulates every scenario and fails if a prediction in the
file no longer matches what memsim predicts: the blind record stays what memsim said.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_cp as mc  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = mc.REPO
# The timeline's op of the events of one SDPA call (the one-GPU kernel's and the ring's alike).
SDPA_OPS = {"_scaled_dot_product_flash_attention": "forward",
            "ScaledDotProductFlashAttentionBackward0": "backward"}
OUT = os.path.join(REPO, "tests", "data", "gpu", "cp_predictions.json")
DEVICE = "h200"


def scenario_yaml(sp):
    c = sp["cfg"]
    lines = [f"# {sp['name']}: tools/gpu/measure_cp.py's run as memsim simulates it",
             "# (written by tools/gpu/predict_cp.py; blind predictions in",
             "# tests/data/gpu/cp_predictions.json).",
             f"# {sp['why']}.",
             "# The stand-in: tools/fixtures/torch_models.LlamaForCausalLM (hf-llama, HF v4.45)",
             "# with LlamaSdpaAttention's path: no mask, SDPA is_causal (flash in bf16)."]
    if sp["kind"] == "cp":
        lines.append(f"# One GPU as rank 0 of a fake process group of {sp['world']} ranks: "
                     f"a (dp_shard {sp['data']}, cp {sp['context']}) mesh.")
    lines += [f"name: {sp['name']}", "model:", "  family: hf-llama"]
    for k in ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"):
        lines.append(f"  {k}: {c[k]}")
    lines.append(f"  context_length: {c['context']}")
    lines.append(f"  tied_embeddings: {pa.yaml_value(bool(c['tied']))}")
    lines.append("  attention: flash")
    lines.append(f"  dropout: {pa.yaml_value(float(c['dropout']))}")
    lines.append(f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}")
    lines.append(f"precision: {{params: {sp['dtype']}, autocast: none}}")
    lines.append(f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}")
    lines.append(f"step: {{kind: train, warmup_steps: {sp['warmup']}}}")
    lines.append(f"checkpoint: {{policy: {sp['policy']}}}")
    if sp["kind"] == "cp":
        lines.append("parallel:")
        lines.append(f"  data: {sp['data']}")
        if sp["context"] > 1:
            lines.append(f"  context: {sp['context']}")
            lines.append(f"  context_rotate: {sp['rotate']}")
        lines.append("  sharding: fsdp2")
        lines.append(f"  reshard_after_forward: {sp['reshard']}")
        lines.append(f"  fsdp_mixed_precision: {sp['param_dtype']}")
        lines.append(f"  reduce_dtype: {sp['reduce_dtype']}")
        lines.append("  fsdp_init: gpu")
    lines.append(f"device: {{preset: {DEVICE}}}")
    return "\n".join(lines) + "\n"


def run_memsim(memsim, yaml_path):
    """predict_common.prediction's fields and the forward's and each SDPA call's peaks."""
    fwd = [0, 0]  # the measured step's [allocated, reserved] most up to forward_end
    calls = {"forward": [], "backward": []}  # [allocated, reserved] peak per SDPA call
    state = {"prev": (0, 0), "last": None}  # the level before the event; the open call's (key, index)

    def on_row(row, j):
        first = j["measured_from_event"]
        fwd_end = j["marks"]["forward_end"]["index"]
        a, r, i = int(row["allocated"]), int(row["reserved"]), int(row["index"])
        if first <= i <= fwd_end:
            fwd[0], fwd[1] = max(fwd[0], a), max(fwd[1], r)
        kind = SDPA_OPS.get(row["op"])
        if i >= first and kind == row["phase"]:
            key, last = (kind, row["layer"]), state["last"]
            if last is None or last[0] != key or last[1] != i - 1:
                calls[kind].append(list(state["prev"]))  # measure_cp's window opens here
            c = calls[kind][-1]
            c[0], c[1] = max(c[0], a), max(c[1], r)
            state["last"] = (key, i)
        state["prev"] = (a, r)

    sim = pc.simulate(memsim, yaml_path, on_row=on_row)
    return pc.prediction(sim, after_peaks={"forward_peak_allocated_bytes": fwd[0],
                                           "forward_peak_reserved_bytes": fwd[1],
                                           "sdpa_call_peaks": calls})


def main():
    a = pc.arguments()
    out = pc.predict_runs(a, mc.RUNS, scenario_yaml, run_memsim, lambda sp: {
        "scenario": sp["scenario"], "kind": sp["kind"], "world": sp["world"],
        "data": sp["data"], "context": sp["context"], "rotate": sp["rotate"],
        "checkpoint": sp["policy"], "what": sp["why"]}, 20, middle=lambda pred: None if "refused" in pred else (
            f"forward peak {pred['forward_peak_allocated_bytes'] / 2**20:9.2f} MiB; whole run "
            f"{pred['whole_run_peak_allocated_bytes'] / 2**20:9.2f} MiB"))
    if out is None:
        return
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for tools/gpu/measure_cp.py's runs, committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes: "
        "the measured step's (compare measured_step_peak_allocated / _reserved in "
        "cp_runs.json); forward_peak_*: the measured step's most up to the forward_end "
        "mark (compare forward_peak_allocated / _reserved); sdpa_call_peaks: [allocated, reserved] "
        "most during each SDPA call, forward in layer order then backward (compare "
        "sdpa_call_peaks of the cp runs); whole_run_*: over setup, "
        "warm-up and measured step (compare whole_run_peak_*); marks: allocated / "
        "reserved after the measured step's forward, backward and optimizer step "
        "(compare marks.*.allocated_bytes.all.current / reserved_bytes.all.current); "
        "allocations_whole_run: memory_stats()['allocation.all.allocated'] at the end. "
        "Scenarios: tests/data/gpu/cp/NAME.yaml (tools/gpu/predict_cp.py). Device "
        "preset h200.",
        a, out)


if __name__ == "__main__":
    main()
