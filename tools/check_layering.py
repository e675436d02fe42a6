#!/usr/bin/env python3
"""Checks the layering rules of the design's "Top-level layout" on every C++ source file.

    python3 tools/check_layering.py [REPO_ROOT] [--verbose]

Reads every .h/.hpp/.cpp/.cc file (git's tracked and untracked-not-ignored files when
REPO_ROOT is a git checkout, else a walk that skips build*/ and hidden folders), resolves
each `#include "..."` (the including file's folder first, then the repository root, the
only include directory) and fails (exit 1) listing file:line for every include that
breaks a rule below and is not in KNOWN. Exit 0 when every break is a known one.

The rooms and what each may include (design.md, "Top-level layout"):

    program/     program                               (the waist)
    allocator/   allocator                             (snapshot/ included: the allocator
                                                        knows no tensors)
    graph/       program, graph                        (never sim/ or tools/)
    scenario/    program, scenario, graph's spec headers (SPEC_HEADERS: plain model-spec
                                                        structs, no behaviour)
    replay/      program, allocator, replay
    sim/         program, allocator, graph, scenario, sim   (never tools/ or replay/)
    tools/, tests/   everything

Also:
  - a spec header (SPEC_HEADERS) includes only program/ and other spec headers, so that
    scenario/'s permission to include them does not leak the rest of graph/;
  - "a file format is read outside scenario/, allocator/snapshot/ and tools/" never
    happens: the format libraries (FORMAT_LIBRARIES) and the pickle codec headers are
    included only there (and in tests/);
  - a source file outside every room is an error (a new top-level folder needs a rule);
  - `#include "..."` that resolves to no file is a warning (generated headers).

KNOWN lists the breaks that exist today (the code has to change to remove them), each with
its reason; a new break fails, a KNOWN entry that no longer occurs is reported (delete it).
tools/relayout.py imports this module to check the tree it is about to produce.
"""

import fnmatch
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc")

# Longest prefix first: the room of a path is the first whose prefix it starts with.
ROOMS = [
    ("program/", "program"),
    ("allocator/", "allocator"),
    ("graph/", "graph"),
    ("scenario/", "scenario"),
    ("replay/", "replay"),
    ("sim/", "sim"),
    ("tools/", "tools"),
    ("tests/", "tests"),
]

# What each room may include ("*": anything).
ALLOWED = {
    "program": {"program"},
    "allocator": {"allocator"},
    "graph": {"program", "graph"},
    "scenario": {"program", "scenario", "spec"},
    "replay": {"program", "allocator", "replay"},
    "sim": {"program", "allocator", "graph", "scenario", "sim"},
    "tools": {"*"},
    "tests": {"*"},
}

# graph's plain model-spec structs, the only graph headers scenario/ may include.
SPEC_HEADERS = ["graph/models/hf_shape.h", "graph/models/*_spec.h"]

# Libraries that read a file format, and where they may be included.
FORMAT_LIBRARIES = ("yaml-cpp/", "nlohmann/")
FORMAT_HEADERS = ["allocator/snapshot/pickle*.h"]  # the pickle codec
FORMAT_READERS = ("scenario/", "allocator/snapshot/", "tools/", "tests/")

# Breaks that exist today: (including file, included file) -> reason. The code has to
# change to remove one; then delete its line. tools/relayout.py --accept-new-violations
# appends to this block (between the markers).
KNOWN = {
    # BEGIN KNOWN
    ("scenario/scenario.h", "allocator/allocator_config.h"):
        "Scenario holds an AllocatorConfig (the allocator: section and "
        "PYTORCH_CUDA_ALLOC_CONF); fix: a plain config struct in program/ or scenario/, "
        "or allow scenario -> allocator's config headers in design.md",
    ("scenario/yaml_fields.cpp", "allocator/units.h"):
        "byte sizes (\"70GiB\") are parsed with allocator's units; fix: units to program/",
    ("scenario/scenario_build.cpp", "allocator/units.h"):
        "byte sizes parsed with allocator's units; fix: units to program/",
    ("scenario/scenario_presets.cpp", "allocator/units.h"):
        "byte sizes in the GPU presets; fix: units to program/",
    ("scenario/scenario_presets.cpp", "sim/analysis/parameter_count.h"):
        "the preset list prints parameter_count(m), the closed-form count from the "
        "architecture row; parameter_count.cpp also has the per-rank counts, which need "
        "graph/models and sim/ (placed in sim/analysis/); fix: parameter_count(m) to "
        "scenario/",
    # END KNOWN
}


def room_of(path):
    for prefix, room in ROOMS:
        if path.startswith(prefix):
            return room
    return None


def is_spec_header(path):
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in SPEC_HEADERS)


def is_source(path):
    return path.endswith(SOURCE_EXTENSIONS)


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def includes_of(text):
    """(line number, '"' or '<', path) of every #include of `text`."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        m = INCLUDE_RE.match(line)
        if m:
            out.append((number, m.group(1), m.group(2)))
    return out


def resolve(including, name, files):
    """The repository path a quoted include names (the including file's folder first,
    then the root), or None."""
    folder = os.path.dirname(including)
    if folder:
        candidate = os.path.normpath(os.path.join(folder, name))
        if candidate in files:
            return candidate
    candidate = os.path.normpath(name)
    if candidate in files:
        return candidate
    return None


def allowed(from_path, to_path):
    """None when from_path may include to_path, else the broken rule in words."""
    from_room = room_of(from_path)
    to_room = room_of(to_path)
    if from_room is None:
        return None  # reported once per file, not per include
    if is_spec_header(from_path):
        if to_room == "program" or is_spec_header(to_path):
            return None
        return "a spec header includes only program/ and spec headers"
    rights = ALLOWED[from_room]
    if "*" in rights or to_room in rights:
        if any(fnmatch.fnmatchcase(to_path, p) for p in FORMAT_HEADERS) and \
                not from_path.startswith(FORMAT_READERS):
            return "a file format is read only in scenario/, allocator/snapshot/, tools/"
        return None
    if "spec" in rights and is_spec_header(to_path):
        return None
    may = sorted(r for r in rights if r != "spec")
    if "spec" in rights:
        may.append("graph's spec headers")
    return "%s/ may include only %s" % (from_room, ", ".join(may))


def check(files):
    """files: {repo path: text}. Returns (violations, warnings); a violation is
    (path, line, included path or library, rule)."""
    violations = []
    warnings = []
    names = set(files)
    for path in sorted(files):
        if not is_source(path):
            continue
        room = room_of(path)
        if room is None:
            violations.append((path, 0, "", "not in any room (%s)" %
                               ", ".join(p for p, _ in ROOMS)))
            continue
        for line, kind, name in includes_of(files[path]):
            if kind == "<":
                if name.startswith(FORMAT_LIBRARIES) and not path.startswith(FORMAT_READERS):
                    violations.append((path, line, "<%s>" % name,
                                       "a file format is read only in scenario/, "
                                       "allocator/snapshot/, tools/"))
                continue
            target = resolve(path, name, names)
            if target is None:
                warnings.append("%s:%d: #include \"%s\" resolves to no file" %
                                (path, line, name))
                continue
            rule = allowed(path, target)
            if rule:
                violations.append((path, line, target, rule))
    return violations, warnings


def list_files(root):
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True).stdout.decode()
        paths = [p for p in out.split("\0") if p]
        # deleted-but-tracked files are listed by --cached; keep those that exist
        return [p for p in paths if os.path.isfile(os.path.join(root, p))]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            for n in names:
                paths.append(os.path.relpath(os.path.join(folder, n), root))
        return paths


def read_sources(root):
    files = {}
    for path in list_files(root):
        if is_source(path):
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                files[path] = f.read()
    return files


def split_known(violations):
    new = [v for v in violations if (v[0], v[2]) not in KNOWN]
    known = [v for v in violations if (v[0], v[2]) in KNOWN]
    seen = {(v[0], v[2]) for v in violations}
    stale = [k for k in KNOWN if k not in seen]
    return new, known, stale


def main(argv):
    args = [a for a in argv if not a.startswith("-")]
    verbose = "--verbose" in argv or "-v" in argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    files = read_sources(root)
    if not files:
        print("check_layering: no source files under %s" % root, file=sys.stderr)
        return 2
    violations, warnings = check(files)
    new, known, stale = split_known(violations)
    for w in warnings:
        print("warning: " + w)
    if verbose:
        for path, line, target, rule in known:
            print("known: %s:%d: includes %s: %s (%s)" %
                  (path, line, target, rule, KNOWN[(path, target)]))
    for path, target in stale:
        print("note: KNOWN entry no longer occurs, delete it: %s -> %s" % (path, target))
    print("check_layering: %d source files, %d known breaks (KNOWN), %d new" %
          (len(files), len(known), len(new)))
    if new:
        for path, line, target, rule in new:
            what = "includes %s" % target if target else "is"
            print("%s:%d: %s: %s" % (path, line, what, rule))
        print("check_layering: FAILED: %d include(s) break the layering rules "
              "(tools/check_layering.py says which rule; fix the include or, when the code "
              "must change first, add it to KNOWN with the reason)" % len(new))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
