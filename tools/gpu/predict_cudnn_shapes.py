#!/usr/bin/env python3
"""memsim's blind predictions for the "cudnn-shapes" runs of tools/gpu/measure_cuda.py
(transformers 5.x Qwen2 in bf16, SDPA forced to cuDNN, at shapes the first two cuDNN runs
did not cover: docs/sdpa-gqa.md "Other shapes"), made before anything is measured. Run on
the development machine (no GPU needed):

    python3 tools/gpu/predict_cudnn_shapes.py [--memsim build/memsim] [--scenarios-only]

1. Writes the two new config.json the runs build from (tests/data/gpu/cudnn_shapes/configs/:
   the tf_small Qwen2 config of tests/data/h100/arch/configs/qwen2_l4_d1024_s1024_b4.json
   with one KV head, and with 32 heads / 8 KV heads at d_model 2048); the S = 1000 run uses
   that Qwen2 config itself.
2. Writes memsim's scenario of every run, tests/data/gpu/cudnn_shapes/NAME.yaml: the same
   config.json as model.hf_config, `model.transformers: 5` (the installed release's code:
   enable_gqa, no repeat_kv), `model.attention: cudnn`, bf16 weights, AdamW foreach, one
   warm-up step, no checkpointing, device h200 (the lease's GPU).
3. Runs `memsim run NAME.yaml --json - --timeline FILE` for each and writes
   tests/data/gpu/cudnn_shapes_predictions.json: predict_common.prediction's fields (the
   measured step's peak allocated / reserved, the whole run's, the marks, the allocation
   count, where the peak falls), plus what the comparison is for: the byte sizes memsim's
   cuDNN op allocates in one layer's forward (seed, offset, output, logsumexp, workspace)
   and backward (dq, dk, dv, workspace), to be compared with the traces' blocks of
   _scaled_dot_product_cudnn_attention / ScaledDotProductCudnnAttentionBackward0; or memsim's
   refusal text. With the memsim commit.

The predictions file is the blind record: written before the runs, then left alone.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure_cuda as mc  # noqa: E402
import predict_arch as pa  # noqa: E402
import predict_common as pc  # noqa: E402

REPO = mc.REPO
OUT = os.path.join(REPO, "tests", "data", "gpu", "cudnn_shapes_predictions.json")
BASE_CONFIG = f"{mc.ARCH_DATA}/configs/qwen2_l4_d1024_s1024_b4.json"
FORWARD_OP = "_scaled_dot_product_cudnn_attention"
BACKWARD_OP = "ScaledDotProductCudnnAttentionBackward0"
DEVICE = "h200"

# The two new configs: the base Qwen2 config with these keys changed.
NEW_CONFIGS = {
    f"{mc.CUDNN_DATA}/configs/qwen2_mqa_l4_d1024_s1024_b4.json": {"num_key_value_heads": 1},
    f"{mc.CUDNN_DATA}/configs/qwen2_h32_l4_d2048_s1024_b4.json": {
        "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 5632},
}


def write_configs():
    base = mc.read_hf_config(BASE_CONFIG)
    for path, over in NEW_CONFIGS.items():
        pa.write_if_changed(os.path.join(REPO, path), json.dumps(dict(base, **over), indent=2) + "\n")


def scenario_yaml(sp):
    c = sp["cfg"]
    rel = os.path.relpath(os.path.join(REPO, sp["hf_config"]),
                          os.path.dirname(os.path.join(REPO, sp["scenario"])))
    lines = [f"# {sp['name']}: tools/gpu/measure_cuda.py's run (--group cudnn-shapes) as",
             "# memsim simulates it (written by tools/gpu/predict_cudnn_shapes.py; blind",
             "# predictions in tests/data/gpu/cudnn_shapes_predictions.json).",
             "# The installed transformers' qwen2 model: AutoModelForCausalLM.from_config of this",
             "# config.json, attn_implementation sdpa, SDPA forced to cuDNN",
             "# (torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)).",
             f"# Checks: {sp['why']}.",
             f"name: {sp['name']}", "model:",
             f"  hf_config: {rel}",
             "  transformers: 5",
             "  attention: cudnn",
             f"  dropout: {pa.yaml_value(float(c['dropout']))}",
             f"batch: {{micro_batch: {c['batch']}, seq_len: {c['seq']}}}",
             f"precision: {{params: {sp['dtype']}, autocast: {sp['autocast']}}}",
             f"optimizer: {{type: {sp['optimizer']}, impl: {sp['opt_impl']}}}",
             f"step: {{kind: train, warmup_steps: {sp['warmup']}}}",
             f"checkpoint: {{policy: {sp['policy']}}}",
             f"device: {{preset: {DEVICE}}}"]
    return "\n".join(lines) + "\n"


class CudnnBlocks:
    """Reads, from memsim's timeline rows, the sizes its cuDNN op allocates in layer 0 of
    the last step (the measured one): the forward's allocations in order, the backward's
    in order. A later step's rows replace an earlier one's."""

    def __init__(self):
        self.forward, self.backward = [], []
        self._fwd_open = self._bwd_open = False

    def __call__(self, row, _report):
        op, layer = row["op"], row["layer"]
        if layer != "0" or row["type"] != "alloc":
            if op not in (FORWARD_OP, BACKWARD_OP):
                self._fwd_open = self._bwd_open = False
            return
        if op == FORWARD_OP and row["phase"] == "forward":
            if not self._fwd_open:
                self.forward, self._fwd_open = [], True
            self.forward.append(int(row["bytes"]))
        elif op == BACKWARD_OP and row["phase"] == "backward":
            if not self._bwd_open:
                self.backward, self._bwd_open = [], True
            self.backward.append(int(row["bytes"]))
        else:
            self._fwd_open = self._bwd_open = False


def predict(memsim, sp):
    blocks = CudnnBlocks()
    sim = pc.simulate(memsim, sp["scenario"], on_row=blocks)
    pred = pc.prediction(sim)
    if "refused" in pred:
        return pred
    # Forward: seed, offset, output, logsumexp, the 256 B workspace; backward: dq, dk, dv,
    # the workspace (graph/ops/ops_sdpa_cudnn.h).
    if len(blocks.forward) != 5 or len(blocks.backward) != 4:
        raise SystemExit(f"{sp['name']}: unexpected cuDNN blocks in memsim's timeline: "
                         f"forward {blocks.forward}, backward {blocks.backward}")
    pred["cudnn_forward_allocations_bytes"] = dict(zip(
        ("seed", "offset", "output", "logsumexp", "workspace"), blocks.forward))
    pred["cudnn_backward_allocations_bytes"] = dict(zip(
        ("dq", "dk", "dv", "workspace"), blocks.backward))
    return pred


def main():
    a = pc.arguments()
    write_configs()
    specs = mc.cudnn_shape_specs()
    for sp in specs:
        pa.write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
    if a.scenarios_only:
        return
    memsim = os.path.abspath(a.memsim)
    out = {}
    for sp in specs:
        c = sp["cfg"]
        entry = {"scenario": sp["scenario"], "hf_config": sp["hf_config"],
                 "shape": {k: c[k] for k in ("batch", "seq", "heads", "kv_heads", "d_model")},
                 "checks": sp["why"]}
        pred = predict(memsim, sp)
        entry.update(pred)
        out[sp["name"]] = entry
        ws = pred.get("cudnn_backward_allocations_bytes", {}).get("workspace")
        pc.show(sp["name"], 44, pred, None if ws is None else f"bwd workspace {ws:,} B")
    pc.write_predictions(
        OUT,
        "memsim's blind predictions for the cudnn-shapes runs of tools/gpu/measure_cuda.py "
        "(--group cudnn-shapes: transformers 5.x Qwen2, bf16, SDPA forced to cuDNN), committed "
        "before any of them was measured. peak_allocated_bytes / peak_reserved_bytes compare "
        "with the measured step's max_memory_allocated / max_memory_reserved "
        "(measured_step_peak_allocated / _reserved in cuda_runs.json); the marks with "
        "result['marks']; cudnn_forward_allocations_bytes / cudnn_backward_allocations_bytes "
        "with the sizes of the blocks the trace allocates in _scaled_dot_product_cudnn_attention "
        "and ScaledDotProductCudnnAttentionBackward0 (one layer, measured step). The backward "
        "workspace is graph/ops/ops_sdpa_cudnn.h's formula, read off S = 1024 runs with 4 and "
        "8 KV heads: B*H*S*hd*4 + 2*B*H*S*hd*elem (grouped) + B*H*S*4 + 256. Scenarios: "
        "tests/data/gpu/cudnn_shapes/NAME.yaml (tools/gpu/predict_cudnn_shapes.py).",
        a, out)


if __name__ == "__main__":
    main()
