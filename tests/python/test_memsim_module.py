#!/usr/bin/env python3
"""`import memsim` against the command line, run by ctest (CMakeLists.txt: python_module).

Needs PYTHONPATH=<build>/python and MEMSIM_BINARY (the memsim binary of the same build);
every check compares the module with what the binary prints, or checks an error's fields.
No pytest: each test_* function runs in order, a failure prints and exits 1.
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback

import memsim

BINARY = os.environ["MEMSIM_BINARY"]

TINY = {
    "name": "tiny python test",
    "model": {"family": "cs336", "layers": 2, "d_model": 64, "heads": 4, "d_ff": 256,
              "vocab": 128},
    "batch": {"micro_batch": 2, "seq_len": 16},
    "step": {"warmup_steps": 1},
    "device": {"capacity": "1GiB", "cuda_context": 0},
}

TINY_YAML = """name: tiny python test
model:
  family: cs336
  layers: 2
  d_model: 64
  heads: 4
  d_ff: 256
  vocab: 128
batch:
  micro_batch: 2
  seq_len: 16
step:
  warmup_steps: 1
device:
  capacity: 1GiB
  cuda_context: 0
"""


def cli_json(*args):
    """`memsim ARGS --json -` parsed, and its exit status."""
    p = subprocess.run([BINARY, *args, "--json", "-"], capture_output=True, text=True)
    return json.loads(p.stdout), p.returncode


def without_source(report):
    return {k: v for k, v in report.items() if k not in ("scenario_file",)}


def test_run_matches_cli(path):
    r = memsim.run(path)
    expected, status = cli_json("run", path)
    assert status == 0
    assert r == expected, "run() differs from memsim run --json"
    assert r["fits"] is True and r["peak_allocated_bytes"] > 0


def test_run_set_matches_cli(path):
    r = memsim.run(path, set={"batch.micro_batch": 4, "checkpoint.policy": "full"})
    expected, _ = cli_json("run", path, "--set", "batch.micro_batch=4", "--set",
                           "checkpoint.policy=full")
    assert r == expected
    assert r["peak_allocated_bytes"] != memsim.run(path)["peak_allocated_bytes"]


def test_run_dict_equals_file(path):
    from_dict = memsim.run(TINY)
    from_file = memsim.run(path)
    assert from_dict["scenario_file"] == "<dict>"
    assert without_source(from_dict) == without_source(from_file)


def test_run_model_config(path):
    source = os.environ["MEMSIM_SOURCE_DIR"]
    config = os.path.join(source, "scenarios", "models", "gpt2-small.json")
    if not os.path.exists(config):
        print("  (no scenarios/models/gpt2-small.json: skipped)")
        return
    overrides = {"batch.seq_len": 64, "device.capacity": "1TiB"}
    r = memsim.run(path, set=overrides, model=config)
    expected, _ = cli_json("run", path, "--model", config, "--set", "batch.seq_len=64",
                           "--set", "device.capacity=1TiB")
    assert r == expected
    assert r["model"]["parameter_count"] > 100_000_000


def test_timeline(path):
    r = memsim.run(path, timeline=True)
    t = r["timeline"]
    n = r["events_executed"]
    for column in ("type", "op", "phase", "kind", "layer", "bytes", "allocated", "reserved",
                   "requested", "parameters", "activations"):
        assert len(t[column]) == n, column
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        assert isinstance(t["allocated"], numpy.ndarray) and t["allocated"].dtype == numpy.uint64
        assert t["layer"].dtype == numpy.int64
    measured = r["measured_from_event"]
    assert max(list(t["allocated"])[measured:]) == r["peak_allocated_bytes"]
    assert set(t["type"]) <= {"alloc", "free", "mark", "empty_cache"}
    assert min(t["layer"]) == -1 and max(t["layer"]) == 1
    # Same rows as the CSV.
    with tempfile.TemporaryDirectory() as d:
        csv = os.path.join(d, "t.csv")
        subprocess.run([BINARY, "run", path, "--timeline", csv], check=True,
                       capture_output=True)
        rows = open(csv).read().splitlines()[1:]
    assert len(rows) == n
    fields = rows[-1].split(",")
    assert int(fields[8]) == int(t["reserved"][-1]) and fields[2] == t["op"][-1]


def test_timeline_without_numpy(path):
    saved = sys.modules.get("numpy")
    sys.modules["numpy"] = None  # import numpy now raises ImportError
    try:
        t = memsim.run(path, timeline=True)["timeline"]
    finally:
        if saved is None:
            del sys.modules["numpy"]
        else:
            sys.modules["numpy"] = saved
    assert isinstance(t["allocated"], list) and isinstance(t["layer"], list)
    assert -1 in t["layer"]


def test_compare_matches_cli(path):
    r = memsim.compare(path, ["none", "full", "uniform:2"])
    expected, status = cli_json("compare", path, "--policies", "none,full,uniform:2")
    assert r == expected
    assert [p["policy"] for p in r["policies"]][0] == "none"
    assert len(r["policies"]) == 3


def test_sweep_matches_cli(path):
    rows = memsim.sweep(path, vary={"batch.micro_batch": [1, 2, 4], "checkpoint.policy": ["none", "full"]})
    expected, status = cli_json("sweep", path, "--vary", "batch.micro_batch=1,2,4", "--vary",
                                "checkpoint.policy=none,full")
    assert len(rows) == 6 == len(expected["points"])
    for row, point in zip(rows, expected["points"]):
        assert row["batch.micro_batch"] == point["values"]["batch.micro_batch"]
        assert {k: v for k, v in row.items() if "." not in k} == \
            {k: v for k, v in point.items() if k != "values"}


def test_sweep_max(path):
    rows = memsim.sweep(path, {"checkpoint.policy": ["none"]}, set={"device.capacity": "64MiB"},
                        max="batch.micro_batch")
    expected, status = cli_json("sweep", path, "--vary", "checkpoint.policy=none", "--set",
                                "device.capacity=64MiB", "--max", "batch.micro_batch")
    assert rows[0]["largest_fit"] == expected["points"][0]["largest_fit"] > 1


def test_scenario_error_from_file():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bad.yaml")
        with open(path, "w") as f:
            f.write(TINY_YAML.replace("  seq_len: 16", "  seq_lenn: 16"))
        try:
            memsim.run(path)
        except memsim.ScenarioError as e:
            assert e.file == path and e.line == 11 and e.key == "batch.seq_lenn", vars(e)
            assert "seq_len" in e.reason
            assert isinstance(e, ValueError) and isinstance(e, memsim.MemsimError)
        else:
            raise AssertionError("no ScenarioError")


def test_scenario_error_from_set(path):
    try:
        memsim.run(path, set={"batch.micro_batch": 0})
    except memsim.ScenarioError as e:
        assert e.file.startswith("--set") and e.line is None, vars(e)
        assert e.key == "batch.micro_batch"
    else:
        raise AssertionError("no ScenarioError")


def test_scenario_error_from_dict():
    bad = dict(TINY, model=dict(TINY["model"], heads=5))
    try:
        memsim.run(bad)
    except memsim.ScenarioError as e:
        assert e.file == "<dict>" and e.key == "model.heads", vars(e)
    else:
        raise AssertionError("no ScenarioError")


def test_other_errors(path):
    for call, kind in [
        (lambda: memsim.compare(path, "none,bogus"), memsim.UsageError),
        (lambda: memsim.sweep(path, {"batch.micro_batch": ["1..x"]}), memsim.UsageError),
        (lambda: memsim.run("/nonexistent/scenario.yaml"), memsim.ScenarioError),
        (lambda: memsim.run(os.path.dirname(path)), memsim.InputError),
        (lambda: memsim.run(42), TypeError),
        (lambda: memsim.run(path, set=["batch.micro_batch=2"]), TypeError),
        (lambda: memsim.run("".join([TINY_YAML, "\x00"])), memsim.MemsimError),
    ]:
        try:
            call()
        except kind:
            pass
        else:
            raise AssertionError("expected " + kind.__name__)


def test_serve_matches_cli(path):
    source = os.environ["MEMSIM_SOURCE_DIR"]
    scenarios = [os.path.join(source, "scenarios", name) for name in sorted(os.listdir(
        os.path.join(source, "scenarios"))) if "vllm" in name and name.endswith(".yaml")]
    if not scenarios:
        print("  (no vllm scenario shipped: skipped)")
        return
    r = memsim.serve(scenarios[0], max_seqs=4096, min_tp=0)
    expected, status = cli_json("serve", scenarios[0], "--max-seqs", "4096", "--min-tp")
    assert r == expected, "serve() differs from memsim serve --json"


def test_version():
    expected = subprocess.run([BINARY, "--version"], capture_output=True, text=True).stdout
    assert memsim.version() == expected.strip()
    assert memsim.version().startswith("memsim ")


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tiny.yaml")
        with open(path, "w") as f:
            f.write(TINY_YAML)
        tests = [(name, fn) for name, fn in globals().items() if name.startswith("test_")]
        for name, fn in tests:
            args = [path] if fn.__code__.co_argcount == 1 else []
            try:
                fn(*args)
                print("ok  ", name)
            except Exception:
                failures += 1
                print("FAIL", name)
                traceback.print_exc()
    print(f"{len(tests) - failures}/{len(tests)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
