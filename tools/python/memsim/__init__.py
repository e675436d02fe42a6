"""memsim from Python: predicts the GPU memory of transformer training without a GPU.

    import memsim
    r = memsim.run("scenarios/llama2-7b-lora-a100.yaml", set={"batch.micro_batch": 8})
    r["fits"], r["peak_reserved_bytes"]

The results are the JSON documents of the command line (`memsim run --json`, `compare
--json`, `sweep --json`), made by the same writers, as dicts. docs/python.md is the guide.

A scenario is a path (str or os.PathLike) to a YAML file, or a dict with the file's
sections ({"model": {"preset": "gpt2-small"}, "batch": {...}}). `set` is a dict of
overrides, the command line's --set KEY=VALUE: {"batch.micro_batch": 8}.

Errors are exceptions, never a crash of the interpreter:
    ScenarioError  a bad scenario or override; .file, .line, .key and .reason say where
                   (file "--set KEY=VALUE" for an override, "<dict>" for a dict)
    UsageError     a malformed argument (a policy list, a sweep axis)
    InputError     a file that cannot be read
    MemsimError    the base class of all three (and of anything else memsim reports)
"""

import json as _json
import os as _os
import re as _re
import sys as _sys

from . import _memsim

__all__ = ["run", "compare", "sweep", "serve", "version", "MemsimError", "ScenarioError", "UsageError",
           "InputError"]


class MemsimError(Exception):
    """Anything memsim refuses or fails at; str(e) is the command line's message."""


class ScenarioError(MemsimError, ValueError):
    """A scenario or override memsim refuses: "FILE:LINE: KEY: why" on the command line.

    Attributes: file (the scenario file, "<dict>", or "--set KEY=VALUE" / "--model"),
    line (int, or None for an override), key (the scenario key, e.g. "batch.seq_len"),
    reason (the why)."""

    def __init__(self, message):
        super().__init__(message)
        self.file, self.line, self.key, self.reason = _split_location(message)


class UsageError(MemsimError, ValueError):
    """A malformed argument (a policy list, a sweep axis)."""


class InputError(MemsimError, OSError):
    """A file that cannot be read."""


# "FILE:LINE: KEY: why" (scenario/scenario.h's contract), "--set KEY: why" (the override's
# own value) or "--set K=V: KEY: why" (another key of a section only overrides bring).
_LOCATED = _re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<key>[^:\s]+): (?P<reason>.*)$", _re.S)
_OPTION = _re.compile(r"^(?P<file>--set|--model) (?P<key>[^:\s=]+): (?P<reason>.*)$", _re.S)
_OVERRIDE = _re.compile(r"^(?P<file>--set [^:\s]+): (?P<key>[^:\s]+): (?P<reason>.*)$", _re.S)


def _split_location(message):
    m = _LOCATED.match(message)
    if m:
        return m["file"], int(m["line"]), m["key"], m["reason"]
    for pattern in (_OPTION, _OVERRIDE):
        m = pattern.match(message)
        if m:
            return m["file"], None, m["key"], m["reason"]
    return None, None, None, message


_KINDS = {"scenario": ScenarioError, "config": ScenarioError, "usage": UsageError,
          "input": InputError}


def _call(function, *args):
    try:
        return function(*args)
    except _memsim.Failure as failure:
        kind, message = failure.args
        if kind == "memory":
            raise MemoryError(message) from None
        raise _KINDS.get(kind, MemsimError)(message) from None


def _scenario_arg(scenario):
    """(path or text, source): source "" means a path."""
    if isinstance(scenario, dict):
        # JSON is YAML: the loader reads it with its own checks and messages.
        return _json.dumps(scenario, indent=1), "<dict>"
    if isinstance(scenario, (str, _os.PathLike)):
        path = _os.fspath(scenario)
        if _os.path.isdir(path):
            raise InputError(path + ": is a directory, not a scenario file")
        return path, ""
    raise TypeError("scenario: expected a path or a dict, got " + type(scenario).__name__)


def _value_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, dict)):
        return _json.dumps(value)  # a YAML flow collection, as --set 'checkpoint.custom=[0,4]'
    return str(value)


def _overrides(overrides):
    if overrides is None:
        return []
    if not isinstance(overrides, dict):
        raise TypeError("set: expected a dict {key: value}, got " + type(overrides).__name__)
    return [(str(k), _value_text(v)) for k, v in overrides.items()]


def _numbers(buffer, signed=False):
    """A column of 8-byte integers: a numpy array when numpy is installed, else a list."""
    try:
        import numpy
    except ImportError:
        return memoryview(buffer).cast("q" if signed else "Q").tolist()
    return numpy.frombuffer(buffer, dtype="<i8" if signed else "<u8").copy()


def _timeline(columns):
    out = {"type": columns["type"], "op": columns["op"], "phase": columns["phase"],
           "kind": columns["kind"], "layer": _numbers(columns["layer"], signed=True)}
    for name, buffer in columns["unsigned"].items():
        out[name] = _numbers(buffer)
    return out


def run(scenario, set=None, *, model=None, timeline=False):
    """Simulates a scenario; returns the dict of `memsim run --json`.

    scenario: a YAML file's path, or a dict of its sections. set: overrides {key: value}.
    model: a Hugging Face config.json (or its folder) replacing the scenario's model, as
    `memsim run --model`. timeline=True adds "timeline": the --timeline CSV's columns, one
    entry per executed event (type, op, phase, kind, layer (-1 outside a layer), bytes,
    allocated, reserved, requested, and the allocated bytes of each tensor kind), numbers
    as numpy arrays when numpy is installed."""
    text, source = _scenario_arg(scenario)
    report, columns = _call(_memsim.run, text, source, _overrides(set),
                            "" if model is None else _os.fspath(model), bool(timeline))
    if timeline:
        report["timeline"] = _timeline(columns)
    return report


def compare(scenario, policies, set=None):
    """The scenario under several checkpointing policies: `memsim compare --json`'s dict.

    policies: "none,full,uniform:2" or a list ["none", "full", "uniform:2"]."""
    if not isinstance(policies, str):
        policies = ",".join(str(p) for p in policies)
    text, source = _scenario_arg(scenario)
    return _call(_memsim.compare, text, source, _overrides(set), policies)


def sweep(scenario, vary=None, set=None, *, max=None, threads=0):
    """A grid of overrides, or the largest value of `max` that fits: one row per point.

    vary: {key: [values]} (an integer range may be "1..8"); the grid is their product.
    max: a key whose largest fitting integer is searched at each point of the grid.
    Returns a list of dicts, one per point: the varied keys and their values, then the
    fields of that point in `memsim sweep --json` (grid: error, fits, peak_*_bytes, ...;
    max: largest_fit, first_failure, failure, evaluations). pandas.DataFrame(rows) makes
    a table of it."""
    axes = []
    for key, values in (vary or {}).items():
        if isinstance(values, (str, int)):
            values = [values]
        axes.append(str(key) + "=" + ",".join(_value_text(v) for v in values))
    text, source = _scenario_arg(scenario)
    document = _call(_memsim.sweep, text, source, _overrides(set), axes,
                     "" if max is None else str(max), int(threads))
    rows = []
    for point in document["points"]:
        row = dict(point["values"])
        row.update((k, v) for k, v in point.items() if k != "values")
        rows.append(row)
    return rows


def serve(scenario, set=None, *, model=None, max_seqs=None, min_tp=None):
    """An inference server's memory plan (vLLM / SGLang): `memsim serve --json`'s dict.

    scenario: a path or a dict (its serve: section; none = the engine's defaults); model: a
    Hugging Face config.json replacing the scenario's model, as `memsim serve --model`;
    max_seqs: --max-seqs LEN (how many sequences of LEN tokens fit in the KV cache at once);
    min_tp: --min-tp MAX (the smallest tensor-parallel size that serves the model, searched
    up to MAX; 0 = up to 8)."""
    text, source = _scenario_arg(scenario)
    return _call(_memsim.serve, text, source, _overrides(set),
                 "" if model is None else _os.fspath(model),
                 0 if max_seqs is None else int(max_seqs),
                 None if min_tp is None else int(min_tp))


def version():
    """memsim's version and git commit, as `memsim --version` prints them."""
    return _memsim.version()
