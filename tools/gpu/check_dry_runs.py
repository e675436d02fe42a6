#!/usr/bin/env python3
"""Records what the GPU measuring scripts (tools/gpu/measure_*.py) do on a CPU, so that a change
to their shared harness (tools/gpu/gpu_common.py) can be shown to leave them as they were:

    /usr/bin/python3 tools/gpu/check_dry_runs.py DEST      # before the change
    /usr/bin/python3 tools/gpu/check_dry_runs.py DEST2     # after it
    diff -r DEST DEST2                                     # must print nothing

For every script it records, in DEST/<case>/: the --list output (run names, estimates), the
--self-test output where a script has one, and a whole CPU dry run (torch 1.13 here: each run
in its child process, as on the GPU) with large budgets so that no run is cut by this
machine's speed: the parent's stdout and exit status, the command line of every child it
started (argv.txt, recorded by a usercustomize hook in each Python process), the files the
run left in its output folder (tar archives by their member names) and its runs JSON.
Wall-clock figures (seconds, "(12.3 s)") are replaced by <t> outside the --list cases: they
are the only part that differs from one run to the next. The work folder is fixed (/tmp/gpu-dry-check), so that
the recorded paths are the same in both records.

Plain Python; needs /usr/bin/python3 with torch (the project's CPU fixture interpreter)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
WORK = "/tmp/gpu-dry-check"
PY = "/usr/bin/python3"
BIG = ["--budget", "100000", "--per-run", "3000"]
G = "tools/gpu/"

# (case, arguments after the interpreter; OUT is the case's work folder)
CASES = [
    ("cuda_list", [G + "measure_cuda.py", "OUT", "--list"]),
    ("cuda_list_arch", [G + "measure_cuda.py", "OUT", "--list", "--group", "arch"]),
    ("cuda_dry", [G + "measure_cuda.py", "OUT", *BIG, "--only", "llama_l4_d1024_s1024_b4_none",
                  "gpt2_l4_d1024_s1024_b4_drop0.1", "tf_llama_l4_d1024_s1024_b4_eager",
                  "arch_llama_l4_d1024_s1024_b4_fp32", "arch_qwen3_l4_d1024_s1024_b4_fp32",
                  "tf_arch_qwen2_l4_d1024_s1024_b4_fp32"]),
    ("cuda_list_cudnn_shapes", [G + "measure_cuda.py", "OUT", "--list", "--group", "cudnn-shapes"]),
    ("cuda_self_test", [G + "measure_cuda.py", "OUT", "--self-test"]),
    ("cuda_dry_cudnn_shapes", [G + "measure_cuda.py", "OUT", *BIG, "--group", "cudnn-shapes"]),
    ("fsdp2_list", [G + "measure_fsdp2.py", "OUT", "--list"]),
    ("fsdp2_self_test", [G + "measure_fsdp2.py", "OUT", "--self-test"]),
    ("fsdp2_dry", [G + "measure_fsdp2.py", "OUT", *BIG]),
    ("stacks_list", [G + "measure_stacks.py", "OUT", "--list"]),
    ("stacks_self_test", [G + "measure_stacks.py", "OUT", "--self-test"]),
    ("stacks_dry", [G + "measure_stacks.py", "OUT", *BIG]),
    ("moe_list", [G + "measure_moe.py", "OUT", "--list"]),
    ("moe_dry", [G + "measure_moe.py", "OUT", *BIG]),
    ("moe_autocast_list", [G + "measure_moe_autocast.py", "OUT", "--list"]),
    ("moe_autocast_dry", [G + "measure_moe_autocast.py", "OUT", *BIG]),
    ("moe_s10_list", [G + "measure_moe_s10.py", "OUT", "--list"]),
    ("moe_s10_self_test", [G + "measure_moe_s10.py", "OUT", "--self-test"]),
    ("moe_s10_dry", [G + "measure_moe_s10.py", "OUT", *BIG]),
    ("moe_fsdp2_list", [G + "measure_moe_fsdp2.py", "OUT", "--list"]),
    ("moe_fsdp2_self_test", [G + "measure_moe_fsdp2.py", "OUT", "--self-test"]),
    ("moe_fsdp2_dry", [G + "measure_moe_fsdp2.py", "OUT", *BIG]),
    ("cp_list", [G + "measure_cp.py", "OUT", "--list"]),
    ("cp_self_test", [G + "measure_cp.py", "OUT", "--self-test"]),
    ("cp_dry", [G + "measure_cp.py", "OUT", *BIG]),
    ("hft_list", [G + "measure_hft.py", "OUT", "--list"]),
    ("hft_self_test", [G + "measure_hft.py", "OUT", "--self-test"]),
    ("hft_dry", [G + "measure_hft.py", "OUT", *BIG]),
    ("impl_list", [G + "measure_impl.py", "OUT", "--list"]),
    ("impl_dry", [G + "measure_impl.py", "OUT", *BIG]),
    ("generate_list", [G + "measure_generate.py", "OUT", "--list"]),
    ("generate_dry", [G + "measure_generate.py", "OUT", *BIG]),
    ("trainer_list", [G + "measure_trainer.py", "OUT", "--list"]),
    ("trainer_dry", [G + "measure_trainer.py", "OUT", "--budget", "100000"]),
    ("gscaler_list", [G + "measure_gscaler.py", "OUT", "--list"]),
    ("gscaler_dry", [G + "measure_gscaler.py", "OUT", *BIG]),
]
TIME_KEYS = {"seconds", "process_seconds", "step_seconds", "generate_seconds", "train_seconds"}
# "(12.3 s)", "(  4.0 s)", ", 12 s -> ": a wall-clock reading in a printed line, with the
# padding before it (its width varies with the number); "<t> s" again is left as it is.
TIME_RE = re.compile(r"(?<![\w.])\s*(\d+(\.\d+)?|<t>) s\b")
STEPS_RE = re.compile(r"\[[0-9., ]*\] s\b")  # "steps [0.139, 0.117] s": each step's seconds

HOOK = '''import json, os, sys
p = os.environ.get("DRY_CHECK_ARGV")
if p:
    with open(p, "a") as f:
        f.write(json.dumps(sys.argv) + "\\n")
'''


def scrub(x):
    """x with every wall-clock value replaced by "<t>"."""
    if isinstance(x, dict):
        return {k: "<t>" if k in TIME_KEYS else scrub(v) for k, v in x.items()}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    if isinstance(x, str):
        return TIME_RE.sub(" <t> s", STEPS_RE.sub("[<t>] s", x))
    return x


def record_folder(out, dest):
    """Each file the run left: JSON scrubbed, tar archives as member lists, others by name."""
    lines = []
    for root, _, files in sorted(os.walk(out)):
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, out)
            lines.append(rel)
            if name.endswith(".json"):
                with open(path) as f:
                    text = f.read().replace("NaN", "null")
                with open(os.path.join(dest, rel.replace("/", "__")), "w") as f:
                    json.dump(scrub(json.loads(text)), f, indent=1)
            elif ".tar" in name:
                with tarfile.open(path) as t:
                    lines += ["  " + m for m in sorted(t.getnames())]
    with open(os.path.join(dest, "files.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: check_dry_runs.py DEST [CASE...]")
    dest_root = os.path.abspath(sys.argv[1])
    only = sys.argv[2:]
    hook_dir = os.path.join(WORK, "hook")
    os.makedirs(hook_dir, exist_ok=True)
    with open(os.path.join(hook_dir, "usercustomize.py"), "w") as f:
        f.write(HOOK)
    for case, args in CASES:
        if only and case not in only:
            continue
        out = os.path.join(WORK, case)
        shutil.rmtree(out, ignore_errors=True)
        dest = os.path.join(dest_root, case)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        argv_log = os.path.join(WORK, case + ".argv")
        if os.path.exists(argv_log):
            os.remove(argv_log)
        env = dict(os.environ, PYTHONPATH=hook_dir, DRY_CHECK_ARGV=argv_log,
                   PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
        cmd = [PY] + [out if a == "OUT" else a for a in args]
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        text = p.stdout if case.endswith("_list") else scrub(p.stdout)  # --list: estimates only
        with open(os.path.join(dest, "stdout.txt"), "w") as f:
            f.write(text + f"\nexit status {p.returncode}\n")
        if os.path.exists(argv_log):
            shutil.copy(argv_log, os.path.join(dest, "argv.txt"))
        if os.path.isdir(out):
            record_folder(out, dest)
        print(f"{case:20s} exit {p.returncode}", flush=True)


if __name__ == "__main__":
    main()
