#!/usr/bin/env python3
"""Packs the installed sources memsim's models are written from, as the GPU machine has
them (transformers and torch versions of the measurements), for reading here:

    python3 tools/gpu/dump_sources.py OUT.tar.xz

The files go into the archive under <package>-<version>/<path in the package>; a module that
does not exist in the installed version is listed in MISSING.txt inside the archive. Nothing
of them is copied into memsim: they are read to check what memsim models (docs/*.md cite the
file and version).
"""
import importlib
import importlib.util
import io
import os
import sys
import tarfile

MODULES = [
    "transformers.integrations.moe", "transformers.cache_utils", "transformers.masking_utils",
    "transformers.generation.utils", "transformers.loss.loss_utils",
    "transformers.integrations.sdpa_attention", "transformers.modeling_rope_utils",
] + [f"transformers.models.{m}.modeling_{m}" for m in (
    "qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2", "gemma2", "gemma3",
    "mistral", "llama", "qwen3", "qwen2", "phi3", "olmo2", "gpt_oss", "granitemoe", "qwen3_next")] + [
    "torch.utils.checkpoint", "torch._functorch.partitioners", "torch._functorch.config",
    "torch.optim.adamw", "torch.optim.adam", "torch.distributed.fsdp._fully_shard._fsdp_param_group",
    "torch.distributed.fsdp._fully_shard._fsdp_collectives", "torch.distributed.fsdp._fully_shard._fsdp_param",
    "torch.distributed.fsdp._fully_shard._fsdp_state", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
]


def main():
    out = sys.argv[1]
    missing = []
    with tarfile.open(out, "w:xz") as tar:
        for name in MODULES:
            try:
                spec = importlib.util.find_spec(name)
            except Exception as e:  # a parent package fails to import
                spec = None
                missing.append(f"{name}: {type(e).__name__}: {e}")
            if spec is None or not spec.origin or not os.path.exists(spec.origin):
                if not missing or not missing[-1].startswith(name):
                    missing.append(f"{name}: not found")
                continue
            top = name.split(".")[0]
            try:
                version = importlib.import_module(top).__version__
            except Exception:
                version = "unknown"
            arc = f"{top}-{version}/" + name.replace(".", "/") + ".py"
            tar.add(spec.origin, arcname=arc)
        data = ("\n".join(missing) + "\n").encode()
        ti = tarfile.TarInfo("MISSING.txt")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    print(f"{out}: {len(MODULES) - len(missing)} files, {len(missing)} missing", flush=True)


if __name__ == "__main__":
    main()
