"""Prints what the lent machine has (Python, torch, CUDA, the GPU, and the versions of the
packages the measuring scripts use or would need) at the start of a lease (tools/gpu/lease.sh)."""
import importlib
import sys

print(sys.version)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
except Exception as e:  # the dry run here has torch 1.13 CPU; never raise out
    print("torch: not importable:", e)
for m in ("transformers", "peft", "accelerate", "deepspeed", "torchao", "liger_kernel",
          "optimum.quanto", "hqq", "vllm", "torchtune", "litgpt", "torchtitan"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
