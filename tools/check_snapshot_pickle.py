#!/usr/bin/env python3
"""Checks that snapshot pickles written by memsim load in Python and look like PyTorch's.

Usage: tools/check_snapshot_pickle.py FILE.pickle [ORIGINAL.pickle]

For FILE it checks, with the standard library only (no torch):
  - pickle.load succeeds;
  - only the opcodes pytorch.org/memory_viz's JavaScript unpickler accepts are used
    (shared/docs/pytorch-allocator.md §10.1), protocol 2-4;
  - the top-level keys, segment/block/trace-entry keys and their order are PyTorch's (§9);
    trace entries may end with 'frames' then 'category', frames being {name, filename, line};
  - pickle.dumps(data, protocol=4) reproduces the file byte for byte (memsim's writer
    mirrors CPython's pickler; a mismatch is reported as a warning, not an error).
With ORIGINAL (a real _dump_snapshot file), it also compares segments, blocks, trace
entries and allocator settings, ignoring stacks ('frames') and keys memsim does not model.
Exit status 0 when everything required holds, 1 otherwise.
"""
import pickle
import pickletools
import sys

ACCEPTED = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT",
    "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "APPEND", "APPENDS", "SETITEM",
    "SETITEMS", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE",
    "BINUNICODE", "NEWTRUE", "NEWFALSE", "NONE", "MEMOIZE", "BINPUT", "LONG_BINPUT",
    "BINGET", "LONG_BINGET",
}
TOP_KEYS = ["segments", "device_traces", "allocator_settings", "external_annotations"]
SEGMENT_KEYS = ["device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id",
                "is_expandable"]
BLOCK_KEYS = ["address", "size", "requested_size", "state", "frames"]
TRACE_KEYS = ["action", "addr", "size", "stream", "time_us"]
IGNORED = {"frames", "category", "compile_context", "user_metadata",
           "graph_capture_record_stream_reuse"}
# Optional trailing trace-entry keys, in this order: 'frames' (present only when a stack was
# recorded; memsim run writes what each tensor is) and 'category' (the key profile_plot
# writes and MemoryViz.js colours by).
TRACE_OPTIONAL = ["frames", "category"]
FRAME_KEYS = ["name", "filename", "line"]


def fail(errors, msg):
    errors.append(msg)


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in IGNORED}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    raw = open(argv[1], "rb").read()
    errors = []
    data = pickle.loads(raw)

    ops = set()
    for op, arg, _ in pickletools.genops(raw):
        ops.add(op.name)
        if op.name == "PROTO" and not 2 <= arg <= 4:
            fail(errors, f"protocol {arg}: memory_viz accepts 2-4")
    for name in sorted(ops - ACCEPTED):
        fail(errors, f"opcode {name} is not accepted by memory_viz")

    if list(data) != TOP_KEYS:
        fail(errors, f"top-level keys {list(data)} != {TOP_KEYS}")
    for i, seg in enumerate(data.get("segments", [])):
        keys = [k for k in seg if k not in ("frames", "blocks")]
        if keys != SEGMENT_KEYS:
            fail(errors, f"segments[{i}] keys {list(seg)}")
        for j, block in enumerate(seg.get("blocks", [])):
            if list(block) != BLOCK_KEYS:
                fail(errors, f"segments[{i}].blocks[{j}] keys {list(block)}")
    for d, trace in enumerate(data.get("device_traces", [])):
        for e, entry in enumerate(trace):
            want = [("device_free" if k == "addr" and entry.get("action") == "oom" else k)
                    for k in TRACE_KEYS]
            keys = list(entry)
            extra = keys[len(want):]
            if keys[: len(want)] != want or extra != [k for k in TRACE_OPTIONAL if k in extra]:
                fail(errors, f"device_traces[{d}][{e}] keys {keys}")
            for f in entry.get("frames", []):
                if not isinstance(f, dict) or list(f) != FRAME_KEYS:
                    fail(errors, f"device_traces[{d}][{e}] frame {f!r}: keys must be {FRAME_KEYS}")
            if "category" in entry and not isinstance(entry["category"], str):
                fail(errors, f"device_traces[{d}][{e}] category is not a str")

    if pickle.dumps(data, protocol=4) != raw:
        print("warning: not byte-identical to pickle.dumps(protocol=4)")

    if len(argv) == 3:
        with open(argv[2], "rb") as f:
            orig = pickle.load(f)
        if isinstance(orig, list):
            orig = {"segments": orig}
        for key in ("segments", "allocator_settings"):
            if key in orig and strip(orig[key]) != strip(data[key]):
                fail(errors, f"{key} differ from {argv[2]}")
        orig_traces = strip(orig.get("device_traces", []))
        traces = strip(data["device_traces"])[: len(orig_traces)]
        if orig_traces != traces:
            fail(errors, f"device_traces differ from {argv[2]}")

    for msg in errors[:50]:
        print("error:", msg)
    print(f"{argv[1]}: {'OK' if not errors else f'{len(errors)} problem(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
