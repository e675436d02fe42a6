"""What the GPU measuring scripts (tools/gpu/measure_*.py) share: the harness of a measuring
run (memory_stats at marks, the measured step's peaks, the device memory at the end, the
trimmed memory snapshot), the parent's loop over its runs (a child process per run under a
timeout and a time budget, the failures recorded, never raised), and its output files (the
runs JSON, the snapshots packed into one .tar.xz, the per-run files removed).

Each script keeps what is its own: its runs, its model and loop, its frame filter, the line
it prints per run and its --list. The settings in which the scripts' parents differ (how a
run the budget cannot hold is recorded, how much of a failed child's stderr is kept, ...)
are fields of ChildLoop, each script's row of them spelled out where it builds one
(docs/gpu-harness.md has the table; tools/gpu/check_dry_runs.py shows a change to this
module leaves every script's CPU dry run as it was).

Plain Python, no torch at import: the scripts import it from their own folder (Python puts
a script's folder first on sys.path, and each child process is the same script); the
functions that need torch take it as an argument."""
import argparse
import dataclasses
import fnmatch
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from typing import Callable, Optional

# --------------------------------------------------------------------------- in the child
# The allocator counters read at each mark by most scripts (measure_cp, _fsdp2, _hft, _impl,
# _stacks); the others name their own set.
STEP_STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                   "reserved_bytes.all.current", "reserved_bytes.all.peak",
                   "requested_bytes.all.current", "requested_bytes.all.peak",
                   "allocation.all.allocated", "allocation.all.current",
                   "segment.all.current", "segment.all.allocated", "num_alloc_retries",
                   "num_ooms")


def memory_stats(torch, cuda, keys=STEP_STATS_KEYS):
    """{key: torch.cuda.memory_stats()[key] or None} for `keys`, read after a synchronize (the
    kernels queued so far have run); {} without CUDA (a dry run records no figures)."""
    if not cuda:
        return {}
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    return {k: st.get(k) for k in keys}


def record_history(torch, stacks="python"):
    """Starts torch.cuda.memory._record_memory_history: every alloc/free with its frames
    (`stacks` "python" or "all" with C++ frames), up to 2,000,000 entries."""
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks,
                                             max_entries=2_000_000)


def init_cuda(torch, result):
    """torch.cuda.init(), then result["gpu"] (the device's name) and
    result["mem_get_info_at_init"] ([free, total] bytes as the driver saw them before the
    name was asked)."""
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    result["gpu"] = torch.cuda.get_device_name()
    result["mem_get_info_at_init"] = [free0, total]


def fresh_history(torch, marks):
    """Where a run sets up a process group and a mesh first (cp, fsdp2, hft): marks
    ["after_mesh"] (what they left on the device, expected nothing), then the cache emptied
    and the peaks reset, so that the recorded history and the whole run's peaks start from an
    empty allocator; then record_history."""
    marks["after_mesh"] = memory_stats(torch, True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    record_history(torch)


def measured_step_peaks(torch, result):
    """result["measured_step_peak_allocated" / "_reserved"]: the allocator's peaks since the
    last reset_peak_memory_stats (the scripts reset them when the measured step begins)."""
    torch.cuda.synchronize()
    result["measured_step_peak_allocated"] = torch.cuda.max_memory_allocated()
    result["measured_step_peak_reserved"] = torch.cuda.max_memory_reserved()


def whole_run_peaks(result, begin):
    """result["whole_run_peak_allocated" / "_reserved"]: the set-up's and warm-up's peaks
    (`begin`, the memory_stats of the measured step's begin mark, read before the reset) or
    the measured step's, whichever is higher."""
    result["whole_run_peak_allocated"] = max(begin["allocated_bytes.all.peak"],
                                             result["measured_step_peak_allocated"])
    result["whole_run_peak_reserved"] = max(begin["reserved_bytes.all.peak"],
                                            result["measured_step_peak_reserved"])


def device_memory_at_end(torch, result, keep_info=True):
    """result["outside_allocator_at_end"]: the device memory in use that the caching allocator
    did not reserve (the CUDA context, its lazily loaded kernels, library handles); with
    keep_info also result["mem_get_info_at_end"] ([free, total])."""
    free2, total = torch.cuda.mem_get_info()
    if keep_info:
        result["mem_get_info_at_end"] = [free2, total]
    result["outside_allocator_at_end"] = (total - free2) - torch.cuda.memory_reserved()


def dump_snapshot(torch, out_dir, name, trim, protocol=4):
    """Takes torch.cuda.memory._snapshot(), passes it through trim (map_frames with the
    script's filter), stops the history and writes it to OUT_DIR/NAME.pickle (pickle
    `protocol`; None: the Python's default). Returns the first device's trace entries."""
    snap = trim(torch.cuda.memory._snapshot())
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(os.path.join(out_dir, name + ".pickle"), "wb") as f:
        pickle.dump(snap, f, protocol=protocol)
    return snap["device_traces"][0] if snap.get("device_traces") else []


def save_snapshot(torch, result, out_dir, name, trim, streams=True):
    """The end of a measured run on CUDA: device_memory_at_end, dump_snapshot, then
    result["trace_entries"] and, with `streams`, result["streams"] (the sorted stream ids
    the trace's entries name)."""
    device_memory_at_end(torch, result)
    tr = dump_snapshot(torch, out_dir, name, trim)
    result["trace_entries"] = len(tr)
    if streams:
        result["streams"] = sorted({e.get("stream", 0) for e in tr})


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


def frames_from(keep, most):
    """A cut for map_frames: the frames whose filename holds one of the strings `keep`, the
    first `most` of them (innermost first, as the snapshot lists them)."""
    def cut(frames):
        return [f for f in frames if any(k in f.get("filename", "") for k in keep)][:most]
    return cut


def trim_frames(snapshot, keep, most):
    """map_frames(snapshot, frames_from(keep, most))."""
    return map_frames(snapshot, frames_from(keep, most))


def write_json(path, doc, default=None):
    """doc as JSON (indent 1) at path; `default` as json.dump's (str: numbers and names
    of anything else)."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=default)


# --------------------------------------------------------------------------- in the parent
def gib(x):
    """Bytes as GiB in 8 characters ("-" for None), for the parent's lines."""
    return "-" if x is None else f"{x / 2**30:8.3f}"


def select_by_name(specs, only):
    """The specs whose name matches one of `only` (names or fnmatch patterns), in their
    order; all of them without `only`."""
    if not only:
        return list(specs)
    return [sp for sp in specs if any(fnmatch.fnmatchcase(sp["name"], p) for p in only)]


def add_run_args(ap, budget, per_run=None):
    """The arguments every measuring script takes: OUT_DIR, --budget (seconds for all runs),
    --per-run (a run's timeout), --only, --list and the hidden --one NAME (child mode)."""
    ap.add_argument("out_dir")
    ap.add_argument("--budget", type=float, default=budget, help="seconds for all runs")
    ap.add_argument("--per-run", type=float, default=per_run,
                    help="timeout of one run, seconds" +
                    (" (default: each run's own)" if per_run is None else ""))
    ap.add_argument("--only", nargs="*", help="names or fnmatch patterns")
    ap.add_argument("--list", action="store_true", help="print the selection and exit")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode


def run_one_if_child(a, specs, run_one):
    """In a child (--one NAME): makes OUT_DIR and runs run_one(the spec named NAME, OUT_DIR).
    Returns whether this process is a child."""
    if not a.one:
        return False
    sp = next(s for s in specs if s["name"] == a.one)
    os.makedirs(a.out_dir, exist_ok=True)
    run_one(sp, a.out_dir)
    return True


def imported_versions(mods=("torch", "transformers", "accelerate", "peft")):
    """Python's version and each module's __version__ as importing it in the parent says
    (None: not installed; MOD_error: importing it raised, the message cut to 300
    characters). measure_hft.versions reads the packages' metadata instead, importing nothing."""
    import importlib.util
    versions = {"python": sys.version.split()[0]}
    for mod in mods:
        if importlib.util.find_spec(mod) is None:
            versions[mod] = None
            continue
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            versions[mod + "_error"] = repr(e)[:300]
    return versions


def dry_run_accept(out_dir, dry_runs, t_start, width):
    """run_children's `accept` for a script whose child, without CUDA, still returns a result
    marked dry_run: each run's OUT_DIR/NAME.json is removed as soon as it is read; a dry
    run's result goes to dry_runs and its run to failures as skipped (the child's
    "skipped" text), printed with its loss and the name padded to `width`; a real run is
    accepted."""
    def accept(sp, r, t_run, failures):
        os.remove(os.path.join(out_dir, sp["name"] + ".json"))
        if not r.get("dry_run"):
            return True
        dry_runs.append(r)
        failures[sp["name"]] = "skipped: " + r.get("skipped", "no CUDA (dry run)")
        print(f"DRY {sp['name']:{width}s} loss {r.get('loss'):.4f} ({time.time() - t_start:5.1f} s): "
              f"{failures[sp['name']]}", flush=True)
        return False
    return accept


def start_parent(out_dir, chosen, total, budget):
    """Makes OUT_DIR, prints how many runs and their estimated seconds against the budget;
    returns the start time the budget is counted from."""
    os.makedirs(out_dir, exist_ok=True)
    print(f"{len(chosen)} configurations: about {total:.0f} s (budget {budget:.0f} s)", flush=True)
    return time.time()


@dataclasses.dataclass
class ChildLoop:
    """How a parent runs its children, one run after another: `python SCRIPT OUT_DIR --one
    NAME`, whose run_one writes OUT_DIR/NAME.json. A row of settings per script (its
    measure_*.py builds it); the defaults are those most of them share."""
    script: str                  # the script's path as the child is given it
    out_dir: str
    budget: float                # seconds for all runs, counted from t_start
    t_start: float
    per_run: Optional[float] = None  # a run's timeout: min(per_run or spec["timeout"], left)
    # A run starts only with at least min_left(spec) seconds of the budget left; else it is
    # recorded as not run: "left" (with the seconds left, printed), "plain" (printed),
    # "quiet" (recorded only).
    min_left: Callable = lambda sp: 8.0
    not_run: str = "left"
    failed_keep: int = 4000      # the characters of a failed child's stderr in failures
    failed_show: int = 800       # ... and in the printed line
    # A child past its timeout: "tail" ("timeout after N s: " + its stderr's last 2000
    # characters), "plain" ("timeout"), "stderr" ("timeout\n" + its last 3000),
    # "timed out" ("timed out after N s").
    timeout_note: str = "tail"
    error_keep: int = 4000       # the parent's own exception about a run, in failures
    error_show: int = 800        # ... and printed (0: not printed)
    process_facts: bool = True   # each result gets process_seconds (and stderr_tail)
    # skip(spec): None, or (failure, printed line) of a run this machine cannot run at all
    skip: Optional[Callable] = None


def _timeout_text(loop, e, timeout):
    if loop.timeout_note == "plain":
        return "timeout"
    if loop.timeout_note == "timed out":
        return f"timed out after {timeout:.0f} s"
    err = e.stderr
    if loop.timeout_note == "stderr":
        err = err.decode() if isinstance(err, bytes) else (err or "")
        return "timeout\n" + err[-3000:]
    tail = err[-2000:] if isinstance(err, str) else (err or b"")[-2000:].decode(errors="replace")
    return f"timeout after {timeout:.0f} s: {tail}"


def run_children(chosen, loop, report, accept=None):
    """Runs each spec of `chosen` in its child (ChildLoop says how) and returns (results,
    failures): the children's JSON dicts in order, and {name: why} of every run that was
    skipped, not run (budget), failed (non-zero exit, or no JSON), timed out or raised in
    the parent. accept(spec, result, t_run, failures), when given, sees each result first
    and returns False to keep it out of results; report(spec, result) prints its line.
    Never raises for a run: the next run goes on."""
    results, failures = [], {}
    for sp in chosen:
        name = sp["name"]
        if loop.skip is not None:
            why = loop.skip(sp)
            if why is not None:
                failures[name] = why[0]
                print(why[1], flush=True)
                continue
        left = loop.budget - (time.time() - loop.t_start)
        if left < loop.min_left(sp):
            failures[name] = "not run: budget spent" + (
                f" ({left:.0f} s left)" if loop.not_run == "left" else "")
            if loop.not_run != "quiet":
                print(f"NOT RUN {name}: budget spent" +
                      (f" ({left:.0f} s left)" if loop.not_run == "left" else ""), flush=True)
            continue
        t_run = time.time()
        timeout = min(loop.per_run or sp.get("timeout") or left, left)
        try:
            p = subprocess.run([sys.executable, loop.script, loop.out_dir, "--one", name],
                               capture_output=True, text=True, timeout=timeout)
            path = os.path.join(loop.out_dir, name + ".json")
            if p.returncode != 0 or not os.path.exists(path):
                failures[name] = (p.stderr or "")[-loop.failed_keep:]
                print(f"FAILED {name}: {(p.stderr or '')[-loop.failed_show:]}", flush=True)
                continue
            with open(path) as f:
                r = json.load(f)
            if loop.process_facts:
                r["process_seconds"] = round(time.time() - t_run, 2)
                if p.stderr.strip():
                    r["stderr_tail"] = p.stderr[-1500:]
            if accept is not None and not accept(sp, r, t_run, failures):
                continue
            results.append(r)
            report(sp, r)
        except subprocess.TimeoutExpired as e:
            failures[name] = _timeout_text(loop, e, timeout)
            if loop.timeout_note in ("plain", "stderr"):
                print(f"TIMEOUT {name}", flush=True)
            elif loop.timeout_note == "tail":
                print(f"TIMEOUT {name} ({timeout:.0f} s)", flush=True)
        except Exception:  # never raise out: record it and go on
            failures[name] = traceback.format_exc()[-loop.error_keep:]
            if loop.error_show:
                print(f"ERROR {name}: {failures[name][-loop.error_show:]}", flush=True)
    return results, failures


def result_pickles(out_dir, results):
    """The NAME.pickle files (relative to out_dir) the results' runs left."""
    return [r["spec"]["name"] + ".pickle" for r in results
            if os.path.exists(os.path.join(out_dir, r["spec"]["name"] + ".pickle"))]


def pack_snapshots(out_dir, pickles, archive, limit=None, keep_on_error=True):
    """OUT_DIR/archive (.tar.xz) of the pickles (none: no archive), which are removed
    afterwards. With `limit` (bytes), snapshots are dropped from the end until the archive
    fits (write_tar_xz_within). When packing raises, its traceback is printed and the
    pickles stay (keep_on_error: the lease still brings them back) or go. Returns the
    pickles packed, None when packing raised."""
    if not pickles:
        return []
    try:
        target = os.path.join(out_dir, archive)
        if limit is None:
            write_tar_xz(target, out_dir, pickles)
            kept = list(pickles)
        else:
            kept = write_tar_xz_within(target, out_dir, pickles, limit)
    except Exception:
        traceback.print_exc()
        if keep_on_error:
            return None
        kept = None
    for p in pickles:
        try:
            os.remove(os.path.join(out_dir, p))
        except OSError:
            pass
    return kept


def remove_run_files(out_dir, results):
    """Removes each result's OUT_DIR/NAME.json (the runs JSON holds them all)."""
    for r in results:
        path = os.path.join(out_dir, r["spec"]["name"] + ".json")
        try:
            if os.path.exists(path):
                os.remove(path)
        except OSError:
            pass


def finish_parent(out_dir, topic, note, versions, t_start, results, failures):
    """The end of cp's, fsdp2's, hft's, impl's and stacks' parent: OUT_DIR/TOPIC_runs.json
    (note, versions, python, seconds, results, failures; anything JSON cannot hold as str;
    a failure to write it is printed, and the snapshots are packed all the same), the
    snapshots packed into OUT_DIR/TOPIC_snapshots.tar.xz, the per-run files removed, and the
    summary line."""
    path = os.path.join(out_dir, topic + "_runs.json")
    try:
        doc = dict(note=note, versions=versions, python=sys.version.split()[0],
                   seconds=round(time.time() - t_start, 1), results=results, failures=failures)
        write_json(path, doc, default=str)
    except Exception:
        traceback.print_exc()
    pack_snapshots(out_dir, result_pickles(out_dir, results), topic + "_snapshots.tar.xz")
    remove_run_files(out_dir, results)
    print(f"{len(results)} runs, {len(failures)} failed or not run, "
          f"{time.time() - t_start:.0f} s -> {path}", flush=True)


def run_main(main):
    """Runs a script's main(): in a child (--one) as it is, so that an exception exits 1 with
    its traceback on stderr, which the parent records; in the parent never raising out (the
    traceback printed, exit status 0), so that a lease's next group still runs."""
    if "--one" in sys.argv:
        main()
        return
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(0)


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


def write_tar_xz_within(target, out_dir, members, limit):
    """write_tar_xz of the members, dropping them from the end until the archive is at most
    `limit` bytes; none left: no archive. Returns the members packed."""
    keep = list(members)
    while keep:
        write_tar_xz(target, out_dir, keep)
        if os.path.getsize(target) <= limit:
            return keep
        keep.pop()
    if os.path.exists(target):
        os.remove(target)
    return []
