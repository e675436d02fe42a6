"""What the GPU measuring scripts (tools/gpu/measure_*.py) share: walking a memory
snapshot's frames, and packing the snapshots they write into one .tar.xz.

Plain Python, no torch: the scripts import it from their own folder (Python puts a
script's folder first on sys.path, and each child process is the same script)."""
import os
import shutil
import subprocess
import tarfile


def map_frames(snapshot, cut):
    """Replaces the frames of every trace entry and every segment block of
    torch.cuda.memory._snapshot()'s dict by cut(frames); cut returning None removes them.
    Returns the snapshot."""
    def apply(entry):
        if "frames" not in entry:
            return
        frames = cut(entry["frames"])
        if frames is None:
            del entry["frames"]
        else:
            entry["frames"] = frames

    for trace in snapshot.get("device_traces", []):
        for e in trace:
            apply(e)
    for seg in snapshot.get("segments", []):
        for b in seg.get("blocks", []):
            apply(b)
    return snapshot


def write_tar_xz(target, out_dir, members):
    """target (a .tar.xz path) holding `members` (paths relative to out_dir): by the xz
    program on every core when it is installed (a multi-block .xz, which tarfile and CMake's
    file(ARCHIVE_EXTRACT) read as any other), else by Python's lzma on one core."""
    if shutil.which("xz"):
        plain = target[:-3]
        with tarfile.open(plain, "w") as t:
            for p in members:
                t.add(os.path.join(out_dir, p), arcname=p)
        if subprocess.run(["xz", "-T0", "-6", "-f", plain]).returncode == 0:
            return
        if os.path.exists(plain):
            os.remove(plain)
    with tarfile.open(target, "w:xz") as t:
        for p in members:
            t.add(os.path.join(out_dir, p), arcname=p)
