#!/usr/bin/env python3
"""Lists what autograd saves for backward in transformers' MoE block, per experts
implementation, on the GPU machine's torch and transformers (the saved-tensor set is what
memsim's graph/models/decoder_moe.cpp must reproduce):

    python3 tools/gpu/probe_saved.py OUT.json

One Qwen3-MoE layer from tests/data/gpu/moe/configs/qwen3_moe.json (bf16, 2 x 64 tokens),
forward only; the autograd graph from the output is walked and every `_saved_*` tensor of
every node recorded (node name, attribute, shape, dtype, its storage), for experts
implementations eager, batched_mm and grouped_mm. Storages count once in `saved_bytes`.
"""
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "tests", "data", "gpu", "moe", "configs", "qwen3_moe.json")


def walk(root, torch):
    # `keep` holds every visited node's Python object: a node's wrapper can be collected
    # and its id() reused by another node's, which would skip that node.
    seen, keep, stack, rows, storages = set(), [], [root], [], {}
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        keep.append(fn)
        for attr in dir(fn):
            if not attr.startswith("_saved_"):
                continue
            try:
                v = getattr(fn, attr)
            except Exception as e:  # noqa: BLE001 (freed or not a tensor)
                v = None
            vs = v if isinstance(v, (tuple, list)) else [v]
            for t in vs:
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
                    key = st.data_ptr()
                    storages[key] = st.nbytes()
                    rows.append({"node": type(fn).__name__, "attr": attr, "shape": list(t.shape),
                                 "dtype": str(t.dtype), "storage": key, "storage_bytes": st.nbytes()})
        for nxt, _ in fn.next_functions:
            stack.append(nxt)
    return rows, sum(storages.values())


def main():
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "runs": {}}
    with open(CONFIG) as f:
        d = json.load(f)
    d.update(num_hidden_layers=1)
    for k in ("torch_dtype", "dtype"):
        d.pop(k, None)
    for impl in ("eager", "batched_mm", "grouped_mm"):
        try:
            cfg = CONFIG_MAPPING[d["model_type"]].from_dict(dict(d))
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation="eager", experts_implementation=impl, dtype=torch.bfloat16).cuda()
            block = model.model.layers[0].mlp
            x = torch.randn(2, 64, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            y = block(x)
            y = y[0] if isinstance(y, tuple) else y
            rows, total = walk(y.grad_fn, torch)
            out["runs"][impl] = {"saved": rows, "saved_bytes": total, "input_bytes": x.numel() * 2,
                                 "block": type(block).__name__}
            print(impl, "saved", total, "bytes in", len({r['storage'] for r in rows}), "storages", flush=True)
        except Exception:  # noqa: BLE001
            out["runs"][impl] = {"error": traceback.format_exc()[-2000:]}
            print(impl, "failed", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
