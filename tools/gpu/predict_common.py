"""What the predict_*.py scripts share: simulating one run's scenario with memsim, the
prediction fields the GPU-run tests compare (tests/real_run_test_support.h reads them), the
one-line summary per run, the loop over the runs of the scripts whose runs name their
scenario (predict_runs), and the predictions file with the memsim commit.

A predictions file is the blind record: it is written before the runs are measured and then
left alone; the tests re-simulate its scenarios and say when memsim moved since.
"""
import argparse
import csv
import json
import os
import subprocess
import tempfile

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def simulate(memsim, yaml_path, sets=(), on_row=None):
    """`memsim run YAML --json - --timeline T` from the repository root. Returns the JSON
    report with the whole run's peaks read from the timeline ("whole_alloc",
    "whole_reserved"), or {"refused": memsim's message} when memsim exits non-zero. Every
    timeline row (a csv.DictReader dict) also goes to on_row, for fields of one script."""
    with tempfile.TemporaryDirectory() as tmp:
        tl = os.path.join(tmp, "timeline.csv")
        cmd = [memsim, "run", yaml_path, "--json", "-", "--timeline", tl]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if p.returncode != 0:
            return {"refused": (p.stderr or p.stdout).strip()}
        j = json.loads(p.stdout)
        whole_alloc = whole_reserved = 0
        with open(tl) as f:
            for row in csv.DictReader(f):
                whole_alloc = max(whole_alloc, int(row["allocated"]))
                whole_reserved = max(whole_reserved, int(row["reserved"]))
                if on_row is not None:
                    on_row(row, j)
    return {"report": j, "whole_alloc": whole_alloc, "whole_reserved": whole_reserved}


def prediction(sim, after_peaks=None, allocations=True, trainable=False, null_marks=False):
    """The fields of one prediction, in the files' order: the measured step's peaks, then
    after_peaks (a script's own fields), the whole run's peaks, the marks (None for a mark
    memsim leaves unplaced when null_marks), the allocation count, the parameter counts,
    the verdict and where the peak falls."""
    if "refused" in sim:
        return sim
    j = sim["report"]
    peak = j.get("peak_event") or {}
    marks = {k: ({"allocated": v["allocated"], "reserved": v["reserved"]}
                 if v or not null_marks else None)
             for k, v in j["marks"].items()}
    out = {"peak_allocated_bytes": j["peak_allocated_bytes"],
           "peak_reserved_bytes": j["peak_reserved_bytes"]}
    out.update(after_peaks or {})
    out["whole_run_peak_allocated_bytes"] = sim["whole_alloc"]
    out["whole_run_peak_reserved_bytes"] = sim["whole_reserved"]
    out["marks"] = marks
    if allocations:
        out["allocations_whole_run"] = j.get("memory_stats", {}).get("allocation.all.allocated")
    out["parameter_count"] = j["model"]["parameter_count"]
    if trainable:
        out["trainable_parameter_count"] = j["model"].get("trainable_parameter_count")
    out["fits"] = j["fits"]
    out["peak_at"] = f"{peak.get('phase')} {peak.get('op')} (layer {peak.get('layer')})"
    return out


def show(name, width, pred, middle=None):
    """One line per run: the step's peaks, middle (a script's own figure), the whole run's."""
    if "refused" in pred:
        print(f"{name:{width}s} REFUSED: {pred['refused']}")
        return
    mid = middle if middle is not None else (
        f"whole run {pred['whole_run_peak_allocated_bytes'] / 2**20:9.2f} / "
        f"{pred['whole_run_peak_reserved_bytes'] / 2**20:9.2f} MiB")
    print(f"{name:{width}s} step {pred['peak_allocated_bytes'] / 2**20:9.2f} MiB alloc "
          f"{pred['peak_reserved_bytes'] / 2**20:9.2f} MiB reserved; {mid}  {pred['peak_at']}")


def write_if_changed(path, text):
    """Writes text at path (its folder made) unless the file already holds it, so that an
    unchanged scenario keeps its timestamp."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path, "w") as f:
        f.write(text)


def predict_runs(args, runs, scenario_yaml, predict, entry_of, width, middle=None):
    """The loop of the scripts whose runs name their scenario (run["scenario"], relative to
    the repository root): each run's scenario written (write_if_changed), and unless
    --scenarios-only simulated, predict(memsim, scenario) -> the prediction; its entry is
    entry_of(run) then the prediction's fields, and its line is show()'s (middle(prediction)
    its middle figure where given). Returns the entries by run name; None with
    --scenarios-only (nothing was simulated)."""
    out = {}
    for sp in runs:
        write_if_changed(os.path.join(REPO, sp["scenario"]), scenario_yaml(sp))
        if args.scenarios_only:
            continue
        pred = predict(os.path.abspath(args.memsim), sp["scenario"])
        entry = entry_of(sp)
        entry.update(pred)
        out[sp["name"]] = entry
        show(sp["name"], width, pred, None if middle is None else middle(pred))
    return None if args.scenarios_only else out


def arguments():
    """The command line every predict script takes."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--memsim", default=os.path.join(REPO, "build", "memsim"))
    ap.add_argument("--memsim-repo", default=None,
                    help="the checkout the memsim binary was built from (for its commit)")
    ap.add_argument("--scenarios-only", action="store_true")
    return ap.parse_args()


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()


def write_predictions(path, note, args, predictions):
    """The predictions file: the note saying what each field compares with, the commit and
    path of the memsim binary that made them, the predictions by run name."""
    memsim_repo = args.memsim_repo or os.path.dirname(os.path.dirname(os.path.abspath(args.memsim)))
    doc = {"note": note,
           "memsim_commit": git("rev-parse", "HEAD", cwd=memsim_repo),
           "memsim_binary": os.path.relpath(os.path.abspath(args.memsim), memsim_repo),
           "predictions": predictions}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(predictions)} predictions "
          f"({sum('refused' in e for e in predictions.values())} refused) -> "
          f"{os.path.relpath(path, REPO)}")
