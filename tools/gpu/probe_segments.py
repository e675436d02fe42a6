#!/usr/bin/env python3
"""Probes where the CUDA driver places device allocations (cudaMalloc), for memsim's open
question of segment placement (docs/segment-placement.md "What a model would need").

    python3 tools/gpu/probe_segments.py OUTDIR [--only NAME...] [--budget SECONDS] [--list]

memsim's SimulatedDevice hands out rising addresses; the committed H100/H200 traces show
the driver placing most new large segments *below* earlier ones, in 32 MiB-aligned slots,
with a "start region" above the first segment that later segments sometimes fill. Which
segment PyTorch's best-fit reuses among equal sizes depends on those addresses (the
lowest address wins the tie), so reserved memory can depend on them. The traces cannot
show the driver's own allocations, what a cudaFree gives back, or where the start region
ends; this probe asks the driver directly.

Each PATTERN below runs in its own Python process (a fresh CUDA context, so no history
from another pattern), with PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is then its
own cudaMalloc / cudaFree (c10's CUDACachingAllocator passes straight through), so a
tensor's data_ptr is the driver's address. For each allocation the probe records the
address, the requested bytes, and cuMemGetAddressRange's (base, size) of the
allocation (libcuda via ctypes: the driver's rounding of the request), relative to the
first allocation of the pattern. Frees are recorded as events too. OUTDIR/segments.json
holds every pattern's events, the driver version and the device name.

No memsim prediction is attached: this is an exploration of the driver, not a
comparison. Without CUDA (here: torch 1.13 on a CPU) it refuses by name.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20

# name -> list of steps: ("a", key, bytes) allocates and names it; ("f", key) frees it.
def _seq(prefix, sizes):
    return [("a", f"{prefix}{i}", s) for i, s in enumerate(sizes)]


PATTERNS = {
    # The sizes PyTorch's allocator asks for: 2 MiB small-pool segments, 20 MiB
    # (kLargeBuffer) and rounded large ones; in the order a training step meets them.
    "ascending_sizes": _seq("s", [2 * MiB, 20 * MiB, 32 * MiB, 64 * MiB, 128 * MiB,
                                  256 * MiB, 500 * MiB, 1024 * MiB, 2048 * MiB]),
    "descending_sizes": _seq("s", [2048 * MiB, 1024 * MiB, 500 * MiB, 256 * MiB, 128 * MiB,
                                   64 * MiB, 32 * MiB, 20 * MiB, 2 * MiB]),
    # Many equal segments: the 32 MiB slot rule (finding 2) and where the start region ends.
    "many_2mib": _seq("t", [2 * MiB] * 48),
    "many_20mib": _seq("m", [20 * MiB] * 24),
    "many_16mib": _seq("h", [16 * MiB] * 24),
    "many_64mib": _seq("g", [64 * MiB] * 16),
    # Interleaved small and large, as a forward meets them.
    "interleaved": [x for i in range(12) for x in (("a", f"s{i}", 2 * MiB),
                                                    ("a", f"l{i}", (64 + 32 * (i % 3)) * MiB))],
    # cudaFree (torch.cuda.empty_cache()'s path): is a released range reused, and which?
    "free_reuse": _seq("g", [64 * MiB] * 6) + [("f", "g1"), ("f", "g3"), ("f", "g4")]
                  + [("a", "r0", 64 * MiB), ("a", "r1", 32 * MiB), ("a", "r2", 128 * MiB),
                     ("a", "r3", 64 * MiB), ("a", "r4", 64 * MiB)],
    "free_all_realloc": _seq("g", [256 * MiB] * 4) + [("f", "g0"), ("f", "g1"), ("f", "g2"),
                                                      ("f", "g3")]
                        + _seq("n", [256 * MiB, 128 * MiB, 512 * MiB]),
    # A large model-state block first (weights), then activations.
    "weights_then_acts": [("a", "w", 3 * 1024 * MiB)] + _seq("x", [20 * MiB] * 8 + [500 * MiB] * 4
                                                             + [2 * MiB] * 8),
}


# By value: what the traces cannot show first (a budget cut drops the last).
ORDER = ["free_reuse", "many_20mib", "interleaved", "weights_then_acts", "many_2mib",
         "many_16mib", "many_64mib", "ascending_sizes", "descending_sizes", "free_all_realloc"]
assert sorted(ORDER) == sorted(PATTERNS)


def child(name, out_path):
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("probe_segments: no CUDA device (this probe asks the CUDA driver)")
    torch.cuda.init()
    libcuda = ctypes.CDLL("libcuda.so.1")
    get_range = libcuda.cuMemGetAddressRange_v2
    get_range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                          ctypes.c_uint64]
    free0, total = torch.cuda.mem_get_info()
    live, events, origin = {}, [], None
    for step in PATTERNS[name]:
        if step[0] == "a":
            _, key, nbytes = step
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            ptr = t.data_ptr()
            base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
            rc = get_range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
            if origin is None:
                origin = ptr
            live[key] = t
            events.append(dict(op="alloc", key=key, bytes=nbytes, addr=ptr, rel=ptr - origin,
                               rel_mib=(ptr - origin) / MiB, range_rc=rc,
                               range_base=base.value, range_size=size.value))
        else:
            _, key = step
            del live[key]  # PYTORCH_NO_CUDA_MEMORY_CACHING: cudaFree now
            torch.cuda.synchronize()
            events.append(dict(op="free", key=key))
    free1, _ = torch.cuda.mem_get_info()
    with open(out_path, "w") as f:
        json.dump(dict(pattern=name, events=events, mem_free_before=free0,
                       mem_free_after=free1, mem_total=total,
                       caching_disabled=os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")), f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=1e9, help="no pattern starts after this")
    a = ap.parse_args()
    if a.list:
        for n, steps in PATTERNS.items():
            print(n, len(steps), "steps")
        return 0
    if a.child:
        child(a.child, a.out)
        return 0
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    result = dict(patterns={}, failures={})
    try:
        import torch
        result["torch"] = torch.__version__
        if torch.cuda.is_available():
            result["device"] = torch.cuda.get_device_name(0)
            result["cuda_driver"] = torch.cuda.driver_version() if hasattr(
                torch.cuda, "driver_version") else None
    except Exception as e:  # noqa: BLE001 (recorded)
        result["torch_error"] = repr(e)
    try:
        result["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
            capture_output=True, text=True, timeout=20).stdout
    except Exception as e:  # noqa: BLE001
        result["nvidia_smi"] = repr(e)
    start = time.time()
    for name in ORDER:
        if a.only and name not in a.only:
            continue
        if time.time() - start > a.budget:
            result["failures"][name] = "not started: --budget spent"
            continue
        path = os.path.join(a.out, f"seg_{name}.json")
        t0 = time.time()
        p = subprocess.run([sys.executable, os.path.abspath(__file__), path, "--child", name],
                           env=env, capture_output=True, text=True, timeout=120)
        if p.returncode == 0 and os.path.exists(path):
            with open(path) as f:
                result["patterns"][name] = json.load(f)
            os.remove(path)
            print(f"{name}: {len(result['patterns'][name]['events'])} events, "
                  f"{time.time() - t0:.1f} s", flush=True)
        else:
            result["failures"][name] = (p.stderr or p.stdout)[-2000:]
            print(f"{name}: FAILED rc={p.returncode}: {(p.stderr or '').strip()[-300:]}",
                  flush=True)
    with open(os.path.join(a.out, "segments.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
