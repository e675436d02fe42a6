#!/usr/bin/env python3
"""Moves memsim's sources into the rooms of the design's "Top-level layout", in one step.

    python3 tools/relayout.py REPO_ROOT [--dry-run] [--accept-new-violations]

What it does, in this order (nothing is touched until every check has passed):

 1. Checks: REPO_ROOT is a git checkout with a clean working tree (no modified, staged or
    untracked files: commit or stash first), not relaid out already (refuses to run twice),
    and every file under allocator/, graph/ and sim/ has a place: the explicit TABLE first,
    then the first matching RULE (for files added since the table was written). Files it
    cannot place are listed and it stops (exit 2). So does a new path that already exists.
 2. Computes the moved tree in memory and checks it with tools/check_layering.py: a break
    of the layering rules that is not in check_layering's KNOWN list stops it (exit 2)
    unless --accept-new-violations, which appends those breaks to KNOWN.
 3. `git mv`s every file to its new folder (file names are kept).
 4. Rewrites every `#include "..."` naming a moved file (every source file, tests/ and
    tools/ included; includes relative to the file's folder are resolved too), and every
    mention of a moved file's path (`sim/fsdp.h`, `graph/numeric.{h,cpp}`,
    `sim/real_runs*.cpp`) in source comments, docs/*.md, README.md, scenarios' comments,
    tools' scripts and CMake files. tests/data/ is left alone (mentions there are listed).
 5. Replaces README.md's folder table with the rooms.
 6. Rewrites CMakeLists.txt: one static library per room (memsim_program,
    memsim_allocator with snapshot/, memsim_graph, memsim_scenario, memsim_replay,
    memsim_sim; recursive globs) linked by the allowed dependencies plus, marked, the
    edges KNOWN breaks need to link; memsim_real_runs (tests/support/: real measurements
    as C++ tables) for the tests and tools/bench/cs336_accuracy; the consumers also link
    memsim_replay; a ctest `layering` runs tools/check_layering.py. Every other target and
    option is kept as it is.
 7. Stages the result (`git add -u`; nothing is committed) and prints a report.

If a step of 3-7 fails, the checkout is put back (`git reset --hard`; it was clean).
--dry-run does 1-2 (on the working tree as it is, untracked files included, dirty or
not) and prints the plan and the report without changing anything.
"""

import fnmatch
import importlib.util
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys

# ---------------------------------------------------------------------------------------
# Where every file goes. TABLE: old path -> new folder (the file name is kept). A file
# that stays is listed too, so that the table is a decision for every file.

def _entries(folder, old_folder, *names):
    return {old_folder + n: folder for n in names}


TABLE = {}
# program/: the waist. Program, MemoryEvent, TensorKind, Phase, rank info.
TABLE.update(_entries("program/", "sim/", "program.h", "program.cpp", "rank_info.h"))
# allocator/ keeps the emulator; allocator/snapshot/ the pickle codec and snapshot I/O.
TABLE.update(_entries("allocator/", "allocator/",
                      "allocator_config.cpp", "allocator_config.h", "allocator_impl.h",
                      "allocator_names.cpp", "allocator_release.cpp", "allocator_state.cpp",
                      "block_pool.h", "caching_allocator.cpp", "caching_allocator.h",
                      "expandable_segments.cpp", "free_index.h", "memory_stats.cpp",
                      "memory_stats.h", "simulated_device.cpp", "units.cpp", "units.h"))
TABLE.update(_entries("allocator/snapshot/", "allocator/",
                      "pickle.h", "pickle_reader.cpp", "pickle_writer.cpp", "snapshot.h",
                      "snapshot_reader.cpp", "snapshot_writer.cpp"))
# graph/: the runtime stays at the top; ops/, models/, numeric/.
TABLE.update(_entries("graph/", "graph/",
                      "autocast.cpp", "autocast.h", "checkpoint.cpp", "checkpoint.h", "ir.h",
                      "runtime.cpp", "runtime.h"))
TABLE.update(_entries("graph/ops/", "graph/",
                      "ops.cpp", "ops.h", "ops_fused.cpp", "ops_fused.h", "ops_lora.cpp",
                      "ops_lora.h", "ops_nn.cpp", "ops_nn.h", "op_helpers.h",
                      "cuda_reduce.cpp", "cuda_reduce.h"))
TABLE.update(_entries("graph/models/", "graph/",
                      "cs336.cpp", "cs336.h", "megatron.cpp", "megatron.h", "lora.cpp",
                      "lora.h", "losses.cpp", "losses.h", "script_losses.cpp",
                      "script_losses.h", "hf_shape.h", "hf_gpt2.cpp", "hf_gpt2.h",
                      "hf_llama.cpp", "hf_llama.h", "decoder.cpp", "decoder.h",
                      "decoder_attention.cpp", "decoder_modules.cpp", "decoder_spec.h"))
TABLE.update(_entries("graph/numeric/", "graph/",
                      "numeric.cpp", "numeric.h", "numeric_detail.h", "numeric_ops.cpp",
                      "numeric_ops_fused.cpp", "numeric_ops_nn.cpp", "numeric_params.cpp"))
# scenario/: structs, YAML, presets, the keys and their checks, Scenario -> graph's spec
# structs (hf_family: fills graph::HfShape; fsdp_precision: the element size a model
# computes in, a pure function of the Scenario, which hf_family needs; arch_checks:
# validation that needs only the Scenario). Validation that needs sim/ stays in sim/
# (modelled_features: sim/step/; megatron_*checks: sim/megatron/).
TABLE.update(_entries("scenario/", "sim/",
                      "scenario.cpp", "scenario.h", "scenario_build.cpp", "scenario_doc.h",
                      "scenario_lora.cpp", "scenario_lora.h", "scenario_presets.cpp",
                      "yaml_fields.cpp", "yaml_fields.h", "fsdp_keys.cpp", "fsdp_keys.h",
                      "pipeline_keys.cpp", "pipeline_keys.h", "script_keys.cpp",
                      "script_keys.h", "fsdp_precision.h", "hf_family.cpp", "hf_family.h",
                      "arch_checks.cpp", "arch_checks.h"))
# replay/: real snapshots to Programs (program/ and allocator/ only).
TABLE.update(_entries("replay/", "sim/", "replay.cpp", "replay.h"))
# replay_analysis builds sim's Analysis from a replay: it needs sim/analysis and replay/,
# which neither room may include both of; its one user is `memsim replay`.
TABLE.update(_entries("tools/cli/", "sim/", "replay_analysis.cpp", "replay_analysis.h"))
# Real measurements written as C++ (tables of real runs): test data, used by tests/ and
# tools/bench/cs336_accuracy.cpp; CMake builds them as memsim_real_runs.
TABLE.update(_entries("tests/support/", "sim/",
                      "real_runs.cpp", "real_runs.h", "real_runs_bf16.cpp",
                      "real_runs_niu.cpp", "real_runs_niu.h", "real_runs_other.cpp",
                      "real_runs_other.h"))
# sim/, by concern.
TABLE.update(_entries("sim/step/", "sim/",
                      "schedule.cpp", "schedule.h", "execute.cpp", "execute.h",
                      "training_script.h", "script_loss.cpp", "script_loss.h",
                      "checkpoint_policy.cpp", "checkpoint_policy.h",
                      "modelled_features.cpp", "modelled_features.h",
                      "model_family.cpp", "model_family.h"))
TABLE.update(_entries("sim/optim/", "sim/",
                      "optimizer_step.cpp", "optimizer_step.h", "optimizer_8bit.cpp",
                      "optimizer_8bit.h", "optimizer_adafactor.cpp", "optimizer_adafactor.h",
                      "optimizer_out_of_place.cpp", "optimizer_out_of_place.h",
                      "master_weights.cpp", "master_weights.h", "numeric_optimizer.cpp",
                      "numeric_optimizer.h", "numeric_adam8bit.cpp", "numeric_adam8bit.h",
                      "numeric_adafactor.cpp", "numeric_adafactor.h"))
TABLE.update(_entries("sim/parallel/", "sim/",
                      "data_parallel.cpp", "data_parallel.h", "fsdp.cpp", "fsdp.h",
                      "zero_redundancy.cpp", "zero_redundancy.h", "zero_sharding.cpp",
                      "zero_sharding.h"))
TABLE.update(_entries("sim/megatron/", "sim/",
                      "megatron_checks.cpp", "megatron_checks.h", "megatron_optimizer.cpp",
                      "megatron_optimizer.h", "megatron_parallel.cpp", "megatron_parallel.h",
                      "megatron_pipeline.cpp", "megatron_pipeline.h",
                      "megatron_pipeline_checks.cpp", "megatron_pipeline_checks.h",
                      "megatron_recompute_flags.cpp", "megatron_recompute_flags.h",
                      "megatron_step.cpp", "megatron_step.h", "pipeline_schedule.cpp",
                      "pipeline_schedule.h"))
TABLE.update(_entries("sim/analysis/", "sim/",
                      "analysis.cpp", "analysis.h", "peaks.cpp", "peaks.h", "live_set.cpp",
                      "live_set.h", "layer_bytes.cpp", "layer_bytes.h"))
TABLE.update(_entries("sim/search/", "sim/",
                      "optimize.cpp", "optimize.h", "optimize_pipeline.cpp",
                      "optimize_pipeline.h", "pipeline_costs.cpp", "pipeline_search.cpp",
                      "pipeline_stage_sim.cpp", "pipeline_stage_sim.h", "sweep.cpp",
                      "sweep.h"))
# `memsim check`: the numeric proof of the schedules.
TABLE.update(_entries("sim/check/", "sim/", "numeric_check.cpp", "numeric_check.h"))

# Files the table does not list (added since): first matching glob (on the old path).
# A file no rule matches stops the script.
RULES = [
    # program/
    ("sim/program*", "program/"),
    ("sim/rank_info*", "program/"),
    # scenario/: reading, presets, keys, model configs and architectures as data
    ("sim/scenario*", "scenario/"),
    ("sim/*_keys.*", "scenario/"),
    ("sim/yaml_*", "scenario/"),
    ("sim/hf_config*", "scenario/"),
    ("sim/hf_family*", "scenario/"),
    ("sim/model_architecture*", "scenario/"),
    ("sim/model_presets*", "scenario/"),
    ("sim/embedded_models*", "scenario/"),
    ("sim/*_precision.h", "scenario/"),
    # replay
    ("sim/replay_analysis*", "tools/cli/"),
    ("sim/replay*", "replay/"),
    # test data written as C++
    ("sim/real_runs*", "tests/support/"),
    # sim/ by concern
    ("sim/numeric_check*", "sim/check/"),
    ("sim/optimizer_*", "sim/optim/"),
    ("sim/numeric_optim*", "sim/optim/"),
    ("sim/numeric_adam*", "sim/optim/"),
    ("sim/numeric_adafactor*", "sim/optim/"),
    ("sim/master_weights*", "sim/optim/"),
    ("sim/data_parallel*", "sim/parallel/"),
    ("sim/ddp*", "sim/parallel/"),
    ("sim/fsdp*", "sim/parallel/"),
    ("sim/zero_*", "sim/parallel/"),
    ("sim/megatron_*", "sim/megatron/"),
    ("sim/pipeline_schedule*", "sim/megatron/"),
    ("sim/*_checks.*", "scenario/"),  # validation; the layering check says if it needs sim/
    ("sim/optimize*", "sim/search/"),
    ("sim/sweep*", "sim/search/"),
    ("sim/pipeline_search*", "sim/search/"),
    ("sim/pipeline_costs*", "sim/search/"),
    ("sim/pipeline_stage*", "sim/search/"),
    ("sim/*search*", "sim/search/"),
    ("sim/analysis*", "sim/analysis/"),
    ("sim/peaks*", "sim/analysis/"),
    ("sim/live_set*", "sim/analysis/"),
    ("sim/layer_bytes*", "sim/analysis/"),
    ("sim/parameter_count*", "sim/analysis/"),
    ("sim/schedule*", "sim/step/"),
    ("sim/execute*", "sim/step/"),
    ("sim/training_script*", "sim/step/"),
    ("sim/script_loss*", "sim/step/"),
    ("sim/checkpoint_policy*", "sim/step/"),
    ("sim/modelled_features*", "sim/step/"),
    ("sim/master_weights*", "sim/optim/"),
    # graph/
    ("graph/runtime*", "graph/"),
    ("graph/ir*", "graph/"),
    ("graph/autocast*", "graph/"),
    ("graph/checkpoint*", "graph/"),
    ("graph/ops*", "graph/ops/"),
    ("graph/op_*", "graph/ops/"),
    ("graph/cuda_*", "graph/ops/"),
    ("graph/numeric*", "graph/numeric/"),
    ("graph/decoder*", "graph/models/"),
    ("graph/*_spec.h", "graph/models/"),
    ("graph/hf_*", "graph/models/"),
    ("graph/cs336*", "graph/models/"),
    ("graph/megatron*", "graph/models/"),
    ("graph/lora*", "graph/models/"),
    ("graph/losses*", "graph/models/"),
    ("graph/script_losses*", "graph/models/"),
    # allocator/
    ("allocator/pickle*", "allocator/snapshot/"),
    ("allocator/snapshot*", "allocator/snapshot/"),
    ("allocator/*", "allocator/"),
]

# The folders whose files get a place (everything under them must be placed).
SPLIT_FOLDERS = ("allocator/", "graph/", "sim/")
# Folders that exist only after the move: a tracked file in one means it ran already.
NEW_FOLDERS = ("program/", "scenario/", "replay/", "allocator/snapshot/", "graph/ops/",
               "graph/models/", "graph/numeric/", "sim/step/", "sim/optim/",
               "sim/parallel/", "sim/megatron/", "sim/analysis/", "sim/search/",
               "sim/check/")
CMAKE_MARKER = "tools/relayout.py"

# The libraries, in dependency order, with the rooms each may link (design.md's table;
# scenario reaches graph only through header-only spec structs, so it links no graph).
LIBRARIES = [
    ("program", "memsim_program", []),
    ("allocator", "memsim_allocator", []),
    ("graph", "memsim_graph", ["program"]),
    ("scenario", "memsim_scenario", ["program"]),
    ("replay", "memsim_replay", ["program", "allocator"]),
    ("sim", "memsim_sim", ["program", "allocator", "graph", "scenario"]),
]
# Third-party libraries per room (the old memsim_sim's go to sim; scenario reads YAML
# and JSON; Eigen: numeric mode).
THIRD_PARTY = {
    "program": [],
    "allocator": None,  # None: the old memsim_allocator's, as they were
    "graph": ["Eigen3::Eigen"],
    "scenario": ["yaml-cpp", "nlohmann_json::nlohmann_json"],
    "replay": [],
    "sim": None,  # the old memsim_sim's
}

TEXT_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".md", ".py", ".sh", ".yaml", ".yml",
                   ".txt", ".cmake")
SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc")
NOT_REWRITTEN = ("tests/data/",)
SELF = ("tools/relayout.py", "tools/check_layering.py")

README_ROWS = {
    "program/": "the waist: `Program` (the ordered alloc/free/mark events), `TensorKind`, "
                "`Phase`, rank info; includes nothing else",
    "allocator/": "the caching-allocator emulator (rounding, pools, best fit, split/merge, "
                  "oversize blocks, GC, release-and-retry, OOM text, expandable segments, "
                  "streams, `memory_stats`); `allocator/snapshot/`: the snapshot pickle "
                  "reader and writer",
    "graph/": "a *symbolic eager PyTorch*: refcounted storages, an emulation of the "
              "autograd engine (saved tensors, grad accumulation), autocast and "
              "checkpointing; `ops/` the aten op library, `models/` the model families "
              "(`cs336`, `hf-gpt2`, `hf-llama`, `megatron`), LoRA, losses and the plain "
              "model-spec structs, `numeric/` the real-number mode",
    "scenario/": "scenario structs, YAML reading, presets, the keys and their checks, "
                 "Scenario to graph's model-spec structs",
    "sim/": "`step/` (the step scheduler, execution, checkpointing policies), `optim/` "
            "(optimizers), `parallel/` (DDP, FSDP, ZeRO), `megatron/` (tensor and pipeline "
            "parallel, formula checks), `analysis/` (peaks, live set), `search/` (optimize, "
            "sweep), `check/` (`memsim check`)",
    "replay/": "real snapshots to Programs",
}
README_ORDER = ["program/", "allocator/", "graph/", "scenario/", "sim/", "replay/"]
README_TOOLS_ADD = ("; `tools/cli/replay_analysis.*`: a replayed trace's analysis for "
                    "`memsim replay`")
README_TESTS_ADD = ("; `tests/support/`: the real runs' measurements as C++ tables "
                    "(also used by `tools/bench/cs336_accuracy.cpp`)")


class Stop(Exception):
    """A check failed: nothing has been changed."""


# ---------------------------------------------------------------------------------------
# git and files

def git(root, *args, check=True):
    r = subprocess.run(["git", "-C", root] + list(args), capture_output=True)
    if check and r.returncode != 0:
        raise RuntimeError("git %s failed: %s" % (" ".join(args), r.stderr.decode().strip()))
    return r.stdout.decode()


def list_files(root, with_untracked):
    args = ["ls-files", "-z", "--cached"]
    if with_untracked:
        args += ["--others", "--exclude-standard"]
    paths = [p for p in git(root, *args).split("\0") if p]
    return sorted(p for p in set(paths) if os.path.isfile(os.path.join(root, p)))


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def is_text(path):
    base = posixpath.basename(path)
    if base == "CMakeLists.txt":
        return True
    if path.endswith(TEXT_EXTENSIONS):
        return True
    # extensionless scripts (.ci/run)
    return "." not in base and path.startswith((".ci/", "tools/"))


def load_check_layering(root):
    here = os.path.join(root, "tools", "check_layering.py")
    if not os.path.isfile(here):
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layering.py")
    spec = importlib.util.spec_from_file_location("check_layering", here)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, here


# ---------------------------------------------------------------------------------------
# 1. the plan

def place(path):
    """(new folder, 'table' | 'rule <glob>') or None."""
    if path in TABLE:
        return TABLE[path], "table"
    if posixpath.dirname(path) + "/" not in SPLIT_FOLDERS:
        return None  # a file in a sub-folder: no rule places it
    for pattern, folder in RULES:
        if fnmatch.fnmatchcase(path, pattern):
            return folder, "rule " + pattern
    return None


def make_plan(files):
    """{old: new} for every file under SPLIT_FOLDERS (unmoved ones map to themselves),
    how each was placed, the files that cannot be placed, and the table's absent files."""
    moves, how, unplaced = {}, {}, []
    for path in files:
        if not path.startswith(SPLIT_FOLDERS):
            continue
        placed = place(path)
        if placed is None:
            unplaced.append(path)
            continue
        folder, why = placed
        moves[path] = folder + posixpath.basename(path)
        how[path] = why
    absent = sorted(p for p in TABLE if p not in files)
    return moves, how, unplaced, absent


def check_preconditions(root, files, dry_run):
    problems = []
    if not dry_run:
        status = git(root, "status", "--porcelain", "--untracked-files=all")
        if status.strip():
            lines = status.rstrip("\n").split("\n")
            problems.append("the working tree is not clean (commit or stash first; "
                            "--dry-run works on a dirty tree):\n    " +
                            "\n    ".join(lines[:40]) +
                            ("\n    ... %d more" % (len(lines) - 40) if len(lines) > 40 else ""))
    done = [p for p in files if p.startswith(NEW_FOLDERS)]
    cmake = read(root, "CMakeLists.txt") if "CMakeLists.txt" in files else ""
    if done or CMAKE_MARKER in cmake:
        problems.append("this checkout is relaid out already (%s); relayout.py runs once" %
                        ("files in " + ", ".join(sorted({d for d in NEW_FOLDERS for p in done
                                                         if p.startswith(d)}))
                         if done else "CMakeLists.txt names " + CMAKE_MARKER))
    if "CMakeLists.txt" not in files:
        problems.append("no CMakeLists.txt at %s: not a memsim checkout?" % root)
    return problems


# ---------------------------------------------------------------------------------------
# 2-4. rewriting paths

INCLUDE_LINE_RE = re.compile(r'^(\s*#\s*include\s*")([^"]+)(".*)$')
OLD_DIRS_RE = "(?:allocator|graph|sim)"


def rewrite_include(path, new_path, name, moves, old_files):
    """The new text of `#include "name"` in `path` (which becomes new_path), or None when
    the include resolves to no file. Relative includes stay relative when they still can."""
    folder = posixpath.dirname(path)
    target, relative = None, False
    if folder:
        candidate = posixpath.normpath(posixpath.join(folder, name))
        if candidate in old_files:
            target, relative = candidate, True
    if target is None:
        candidate = posixpath.normpath(name)
        if candidate in old_files:
            target = candidate
    if target is None:
        return None
    new_target = moves.get(target, target)
    if not relative:
        return new_target
    if new_target == target and new_path == path:
        return name
    rel = posixpath.relpath(new_target, posixpath.dirname(new_path) or ".")
    return rel if not rel.startswith("..") else new_target


class MentionRewriter:
    """Rewrites mentions of moved files' old paths in free text."""

    def __init__(self, moves, old_files):
        self.moved = {o: n for o, n in moves.items() if o != n}
        self.old_files = old_files
        self.moves = moves
        alternatives = "|".join(re.escape(p) for p in sorted(self.moved, key=len, reverse=True))
        self.exact = re.compile(r"(?<![\w/.-])(?:%s)(?!\w)" % alternatives) if alternatives \
            else None
        self.brace = re.compile(r"(?<![\w/.-])(%s/\w+)\.\{([\w,]+)\}" % OLD_DIRS_RE)
        self.glob = re.compile(r"(?<![\w/.-])(%s/[\w.]*\*[\w.*]*)" % OLD_DIRS_RE)

    def _one_folder(self, olds):
        """The common new folder of these old paths if all moved to one (else None)."""
        olds = [o for o in olds if o in self.moves]
        if not olds or not any(o in self.moved for o in olds):
            return None
        folders = {posixpath.dirname(self.moves[o]) for o in olds}
        return folders.pop() if len(folders) == 1 else None

    def rewrite(self, text):
        count = 0

        def exact(m):
            nonlocal count
            count += 1
            return self.moved[m.group(0)]

        def brace(m):
            nonlocal count
            stem = m.group(1)
            olds = ["%s.%s" % (stem, e) for e in m.group(2).split(",")]
            folder = self._one_folder(olds)
            if folder is None:
                return m.group(0)
            count += 1
            return "%s/%s.{%s}" % (folder, posixpath.basename(stem), m.group(2))

        def glob(m):
            nonlocal count
            token = m.group(1)
            pattern = token.rstrip(".")
            tail = token[len(pattern):]
            d = pattern.split("/", 1)[0]
            olds = [o for o in self.old_files
                    if posixpath.dirname(o) == d and fnmatch.fnmatchcase(o, pattern)]
            folder = self._one_folder(olds)
            if folder is None:
                return token
            count += 1
            return folder + "/" + pattern.split("/", 1)[1] + tail

        if self.exact:
            text = self.exact.sub(exact, text)
        text = self.brace.sub(brace, text)
        text = self.glob.sub(glob, text)
        return text, count

    def stale(self, text):
        """Lines that still name a moved file's old path."""
        out = []
        if not self.moved:
            return out
        loose = re.compile(r"(?<![\w])(?:%s)(?!\w)" %
                           "|".join(re.escape(p) for p in sorted(self.moved, key=len,
                                                                 reverse=True)))
        for number, line in enumerate(text.splitlines(), 1):
            m = loose.search(line)
            if m:
                out.append((number, m.group(0)))
        return out


def rewrite_text(path, new_path, text, moves, old_files, mentions, warnings):
    """(new text, include rewrites, mention rewrites)."""
    includes = 0
    mention_count = 0
    source = path.endswith(SOURCE_EXTENSIONS)
    out = []
    for line in text.split("\n"):
        m = INCLUDE_LINE_RE.match(line) if source else None
        if m:
            name = m.group(2)
            new_name = rewrite_include(path, new_path, name, moves, old_files)
            if new_name is None:
                warnings.append('%s: #include "%s" resolves to no file (left as it is)' %
                                (path, name))
            elif new_name != name:
                line = m.group(1) + new_name + m.group(3)
                includes += 1
            # a comment after the include is free text
            head, sep, comment = line.partition("//")
            if sep:
                comment, n = mentions.rewrite(comment)
                mention_count += n
                line = head + sep + comment
        else:
            line, n = mentions.rewrite(line)
            mention_count += n
        out.append(line)
    if source:
        _sort_include_blocks(text.split("\n"), out)
    return "\n".join(out), includes, mention_count


def _sort_include_blocks(old_lines, new_lines):
    """Keeps sorted blocks of consecutive `#include "..."` lines sorted (in place)."""
    i = 0
    while i < len(old_lines):
        if not INCLUDE_LINE_RE.match(old_lines[i]):
            i += 1
            continue
        j = i
        while j < len(old_lines) and INCLUDE_LINE_RE.match(old_lines[j]):
            j += 1
        old_names = [INCLUDE_LINE_RE.match(l).group(2) for l in old_lines[i:j]]
        if j - i > 1 and old_names == sorted(old_names):
            new_lines[i:j] = sorted(new_lines[i:j],
                                    key=lambda l: INCLUDE_LINE_RE.match(l).group(2))
        i = j


# ---------------------------------------------------------------------------------------
# 5. README.md's folder table

def rewrite_readme_table(text):
    lines = text.split("\n")
    try:
        head = next(i for i, l in enumerate(lines)
                    if re.match(r"^\|\s*folder\s*\|\s*what it holds\s*\|", l))
    except StopIteration:
        return text, "README.md: no `| folder | what it holds |` table found; update it by hand"
    start = head + 2
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rows = lines[start:end]
    keyed = {}
    order = []
    for row in rows:
        m = re.match(r"^\|\s*`([^`]+)`", row)
        key = m.group(1) if m else row
        keyed[key] = row
        order.append(key)
    new_rows = ["| `%s` | %s |" % (k, README_ROWS[k]) for k in README_ORDER]
    for key in order:
        if key in README_ROWS:
            continue
        row = keyed[key]
        add = {"tests/": README_TESTS_ADD, "tools/": README_TOOLS_ADD}.get(key)
        if add and add not in row and row.rstrip().endswith("|"):
            row = row.rstrip()[:-1].rstrip() + add + " |"
        new_rows.append(row)
    lines[start:end] = new_rows
    return "\n".join(lines), None


# ---------------------------------------------------------------------------------------
# 6. CMakeLists.txt

def _balanced_call(text, start):
    """End index (after ')') of the CMake command whose '(' is at or after start."""
    i = text.index("(", start)
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == "#":  # comment to end of line
            i = text.index("\n", i) - 1 if "\n" in text[i:] else len(text)
        elif c == '"':
            i = text.index('"', i + 1)
        i += 1
    raise Stop("CMakeLists.txt: unbalanced parentheses after offset %d" % start)


def rewrite_cmake(text, link_extra, have_real_runs, header_rooms):
    """The new CMakeLists.txt; raises Stop when it is not the shape this script knows."""
    notes = []
    fstart = text.find("function(memsim_library")
    if fstart < 0:
        raise Stop("CMakeLists.txt: no function(memsim_library ...): the library block is "
                   "not the one relayout.py knows; rewrite by hand")
    # the comment lines right above the function belong to it
    block_start = fstart
    while True:
        prev_end = text.rfind("\n", 0, block_start - 1)
        prev_line = text[prev_end + 1:block_start - 1] if block_start > 0 else ""
        if block_start > 0 and prev_line.lstrip().startswith("#"):
            block_start = prev_end + 1
        else:
            break
    fend = text.index("endfunction()", fstart) + len("endfunction()")
    # the memsim_library(...) calls after it
    old_deps = {}
    pos = fend
    call_re = re.compile(r"\s*(#[^\n]*\n\s*)*memsim_library\(")
    while True:
        m = call_re.match(text, pos)
        if not m:
            break
        call_start = text.index("memsim_library(", pos)
        call_end = _balanced_call(text, call_start)
        body = text[call_start + len("memsim_library("):call_end - 1]
        body = re.sub(r"#[^\n]*", "", body)
        words = body.split()
        if len(words) < 2:
            raise Stop("CMakeLists.txt: memsim_library call without a folder: %r" % body)
        old_deps[words[0]] = words[2:]
        pos = call_end
        # a trailing comment on the same line
        eol = text.find("\n", pos)
        if eol >= 0 and text[pos:eol].strip().startswith("#"):
            pos = eol
    expected = {"memsim_allocator", "memsim_graph", "memsim_sim"}
    if set(old_deps) != expected:
        raise Stop("CMakeLists.txt: memsim_library calls for %s, expected exactly %s: "
                   "rewrite by hand" % (sorted(old_deps), sorted(expected)))

    def third_party(deps):
        return [d for d in deps if not d.startswith("memsim_")]

    lines = [
        "# One library per room of the layout (design.md, \"Top-level layout\"; written by",
        "# %s). Sources are globbed, sub-folders included, so that each folder" % CMAKE_MARKER,
        "# owns its files; a library links the rooms its room may include (tools/",
        "# check_layering.py checks the includes).",
        "function(memsim_library name dir)",
        "  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*.cpp)",
        "  if(NOT srcs)",
        "    # A room with no sources yet still links (header-only for now).",
        "    set(srcs ${CMAKE_CURRENT_SOURCE_DIR}/tools/empty.cpp)",
        "  endif()",
        "  add_library(${name} STATIC ${srcs})",
        "  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})",
        "  target_link_libraries(${name} PUBLIC ${ARGN})",
        "endfunction()",
        "",
    ]
    names = {room: lib for room, lib, _ in LIBRARIES}
    for room, lib, rooms in LIBRARIES:
        deps = [names[r] for r in rooms]
        order = [x[0] for x in LIBRARIES]
        extra = sorted(link_extra.get(room, ()), key=order.index)
        tp = THIRD_PARTY[room]
        if tp is None:
            tp = third_party(old_deps[lib])
        line = "memsim_library(%s %s)" % (lib, " ".join([room] + deps + tp))
        if room == "graph":
            line += "  # Eigen: numeric mode"
        lines.append(line)
        if extra:
            lines.append("# known layering breaks (tools/check_layering.py KNOWN) need these "
                         "to link:")
            lines.append("target_link_libraries(%s PUBLIC %s)" %
                         (lib, " ".join(names[r] for r in extra)))
            notes.append("CMakeLists.txt: %s also links %s for known layering breaks" %
                         (lib, ", ".join(names[r] for r in extra)))
    if have_real_runs:
        lines += [
            "",
            "# Real measurements written as C++ tables (tests/support/): test data, for the",
            "# tests and tools/bench/cs336_accuracy.cpp.",
            "file(GLOB real_runs_srcs CONFIGURE_DEPENDS "
            "${CMAKE_CURRENT_SOURCE_DIR}/tests/support/*.cpp)",
            "add_library(memsim_real_runs STATIC ${real_runs_srcs})",
            "target_link_libraries(memsim_real_runs PUBLIC memsim_sim)",
        ]
    text = text[:block_start] + "\n".join(lines) + text[pos:]

    # consumers of memsim_sim also get memsim_replay
    consumer_re = re.compile(r"(target_link_libraries\(\s*(\$\{\w+\}|\w+)\s+PRIVATE\s+)memsim_sim\b")
    consumers = consumer_re.findall(text)
    if not consumers:
        raise Stop("CMakeLists.txt: no target links memsim_sim PRIVATE: rewrite by hand")
    text = consumer_re.sub(lambda m: m.group(1) + "memsim_sim memsim_replay", text)
    notes.append("CMakeLists.txt: %s link memsim_replay too" %
                 ", ".join(c[1] for c in consumers))

    if have_real_runs:
        m = re.search(r"target_link_libraries\(memsim_tests PRIVATE memsim_sim memsim_replay", text)
        if not m:
            raise Stop("CMakeLists.txt: no `target_link_libraries(memsim_tests PRIVATE "
                       "memsim_sim`: rewrite by hand")
        text = text[:m.end()] + " memsim_real_runs" + text[m.end():]
        m = re.search(r"foreach\(src \$\{bench_srcs\}\).*?endforeach\(\)", text, re.S)
        if not m:
            raise Stop("CMakeLists.txt: no foreach over ${bench_srcs}: rewrite by hand")
        text = (text[:m.end()] + "\nif(TARGET cs336_accuracy)\n"
                "  target_link_libraries(cs336_accuracy PRIVATE memsim_real_runs)\nendif()" +
                text[m.end():])

    m = re.search(r"\n(\s*)catch_discover_tests\(memsim_tests\)[^\n]*", text)
    if not m:
        raise Stop("CMakeLists.txt: no catch_discover_tests(memsim_tests): rewrite by hand")
    indent = m.group(1).lstrip("\n")
    add = ("\n%s# The layering rules of design.md's \"Top-level layout\" on every include.\n"
           "%sadd_test(NAME layering COMMAND python3 "
           "${CMAKE_CURRENT_SOURCE_DIR}/tools/check_layering.py ${CMAKE_CURRENT_SOURCE_DIR})"
           % (indent, indent))
    text = text[:m.end()] + add + text[m.end():]

    # Sources added to a library elsewhere (generated ones: target_sources(memsim_sim
    # PRIVATE ${embedded_models})) go with the header they define, when it moved rooms.
    lib_of = {room: lib for room, lib, _ in LIBRARIES}
    out_lines = []
    for number, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^(\s*target_sources\(\s*)(memsim_\w+)(\s+(?:PRIVATE|PUBLIC|INTERFACE)\s+)"
                     r"([^)]*)\)(.*)$", line)
        if m:
            rooms = set()
            for arg in m.group(4).split():
                var = re.fullmatch(r"\$\{(\w+)\}", arg)
                values = re.findall(r"set\(\s*%s\s+([^)\s]+)" % var.group(1), text) if var \
                    else [arg]
                for value in values:
                    stem = posixpath.splitext(posixpath.basename(value))[0]
                    rooms.add(header_rooms.get(stem))
            rooms.discard(None)
            target = lib_of.get(rooms.pop()) if len(rooms) == 1 else None
            if target and target != m.group(2):
                notes.append("CMakeLists.txt:%d: %s -> %s (the sources define a header now in "
                             "that room)" % (number, m.group(2), target))
                line = m.group(1) + target + m.group(3) + m.group(4) + ")" + m.group(5)
            elif rooms and not target:
                notes.append("CMakeLists.txt:%d: check by hand (which room these sources "
                             "belong to): %s" % (number, line.strip()))
        elif re.search(r"\b(target_compile_definitions|target_include_directories|"
                       r"set_target_properties|add_dependencies)\(\s*memsim_(sim|graph|allocator)\b",
                       line):
            notes.append("CMakeLists.txt:%d: check by hand (the library's files may have "
                         "moved to another room): %s" % (number, line.strip()))
        out_lines.append(line)
    text = "\n".join(out_lines)
    return text, notes


# ---------------------------------------------------------------------------------------
# the run

def room_edges(check_layering, violations):
    """Rooms a library must link beyond its allowed ones, for the given breaks."""
    libs = {room for room, _, _ in LIBRARIES}
    allowed = {room: set(rooms) for room, _, rooms in LIBRARIES}
    extra = {}
    for path, _, target, _ in violations:
        if not target or target.startswith("<"):
            continue
        a, b = check_layering.room_of(path), check_layering.room_of(target)
        if a in libs and b in libs and a != b and b not in allowed[a]:
            if b == "graph" and check_layering.is_spec_header(target):
                continue  # header-only
            extra.setdefault(a, set()).add(b)
    return extra


def add_known(path, entries):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    marker = "    # END KNOWN"
    if marker not in text:
        raise Stop("%s: no '# END KNOWN' marker to add the accepted breaks to" % path)
    add = "".join("    (%s, %s):\n        %s,\n" % (
        json.dumps(p), json.dumps(t),
        json.dumps("accepted by relayout.py --accept-new-violations (%s); fix: TODO" % rule))
        for p, t, rule in entries)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(marker, add + marker))


def run(root, dry_run, accept):
    report = []
    warnings = []
    files = list_files(root, with_untracked=dry_run)
    problems = check_preconditions(root, files, dry_run)
    if any("relaid out already" in p for p in problems):
        raise Stop("\n".join("relayout: " + p for p in problems if "relaid out already" in p))
    moves, how, unplaced, absent = make_plan(files)
    if unplaced:
        problems.append("files no TABLE entry or RULE places (add them to tools/relayout.py):"
                        "\n    " + "\n    ".join(unplaced))
    new_paths = {}
    for old, new in moves.items():
        new_paths.setdefault(new, []).append(old)
    file_set = set(files)
    for new, olds in sorted(new_paths.items()):
        if len(olds) > 1:
            problems.append("%s would receive %s" % (new, ", ".join(olds)))
        elif new != olds[0] and new in file_set and new not in moves:
            problems.append("%s (for %s) exists already" % (new, olds[0]))
    if problems and not dry_run:
        raise Stop("\n".join("relayout: " + p for p in problems))

    check_layering, check_layering_path = load_check_layering(root)
    old_files = set(files)
    mentions = MentionRewriter(moves, old_files)

    # every text file's new content, in memory
    contents = {}  # new path -> (old path, old text, new text)
    n_includes = n_mentions = 0
    for path in files:
        data_file = path.endswith(".json")  # scanned for old paths, never rewritten
        if not is_text(path) and not data_file:
            continue
        new_path = moves.get(path, path)
        try:
            text = read(root, path)
        except UnicodeDecodeError:
            continue
        if path in SELF or path.startswith(NOT_REWRITTEN) or data_file:
            contents[new_path] = (path, text, text)
            continue
        new_text, inc, men = rewrite_text(path, new_path, text, moves, old_files, mentions,
                                          warnings)
        n_includes += inc
        n_mentions += men
        contents[new_path] = (path, text, new_text)

    readme_note = None
    if "README.md" in contents:
        old, text, new_text = contents["README.md"]
        new_text, readme_note = rewrite_readme_table(new_text)
        contents["README.md"] = (old, text, new_text)

    # the layering of the moved tree
    sources = {p: c[2] for p, c in contents.items() if p.endswith(SOURCE_EXTENSIONS)}
    violations, layer_warnings = check_layering.check(sources)
    new_v, known_v, stale_known = check_layering.split_known(violations)
    accepted = []
    if new_v:
        listing = "\n    ".join("%s:%d: includes %s: %s" % v for v in new_v)
        if dry_run and not accept:
            problems.append("the moved tree would break the layering rules with includes "
                            "check_layering's KNOWN does not list (see above); fix them, "
                            "place the files elsewhere, or use --accept-new-violations")
        elif not accept:
            raise Stop("relayout: the moved tree would break the layering rules with includes "
                       "check_layering's KNOWN does not list:\n    %s\nfix them first, move "
                       "the files elsewhere (TABLE / RULES), or rerun with "
                       "--accept-new-violations to record them in KNOWN" % listing)
        if accept:
            accepted = sorted({(v[0], v[2], v[3]) for v in new_v})

    _, old_cmake, cmake_text = contents["CMakeLists.txt"]
    header_rooms = {}  # header stem -> room, for the headers that moved rooms
    for old, new in moves.items():
        if new.endswith((".h", ".hpp")) and \
                check_layering.room_of(old) != check_layering.room_of(new):
            stem = posixpath.splitext(posixpath.basename(new))[0]
            header_rooms[stem] = check_layering.room_of(new)
    cmake_text, cmake_notes = rewrite_cmake(
        cmake_text, room_edges(check_layering, violations),
        any(n.startswith("tests/support/") and n.endswith((".cpp", ".cc"))
            for n in moves.values()), header_rooms)
    contents["CMakeLists.txt"] = ("CMakeLists.txt", old_cmake, cmake_text)

    # ---- the report (the same for a dry run)
    moved = {o: n for o, n in moves.items() if o != n}
    by_folder = {}
    for old, new in sorted(moves.items()):
        by_folder.setdefault(posixpath.dirname(new) + "/", []).append(old)
    report.append("relayout: %d files placed, %d moved, %d stay; %d by rule" %
                  (len(moves), len(moved), len(moves) - len(moved),
                   sum(1 for o in moves if how[o] != "table")))
    for folder in sorted(by_folder):
        olds = by_folder[folder]
        for source in sorted({posixpath.dirname(o) + "/" for o in olds}):
            names = [posixpath.basename(o) for o in olds if posixpath.dirname(o) + "/" == source]
            verb = "stay" if source == folder else "<- " + source
            report.append("  %-20s %s %s" % (folder, verb, " ".join(names)))
        for o in olds:
            if how[o] != "table":
                report.append("      %s placed by %s" % (o, how[o]))
    if absent:
        report.append("  table entries with no file (skipped): " + ", ".join(absent))
    changed = [p for p, (o, a, b) in contents.items() if a != b]
    report.append("rewrites: %d includes, %d path mentions, %d files changed" %
                  (n_includes, n_mentions, len(changed)))
    if readme_note:
        warnings.append(readme_note)
    else:
        report.append("README.md: folder table replaced by the rooms")
    report.extend(cmake_notes)
    report.append("layering of the moved tree: %d known breaks (check_layering KNOWN), "
                  "%d new%s" % (len(known_v), len(new_v), " (accepted)" if accepted else ""))
    for v in known_v:
        report.append("  %s:%d: includes %s: %s" % v)
    for v in new_v:
        report.append("  NEW %s:%d: includes %s: %s" % v)
    for p, t in stale_known:
        report.append("  KNOWN entry no longer occurs (delete it): %s -> %s" % (p, t))
    warnings.extend(layer_warnings)
    stale = []
    for new_path, (_, _, text) in sorted(contents.items()):
        if new_path in SELF:
            continue
        for number, what in mentions.stale(text):
            stale.append("%s:%d: still names %s" % (new_path, number, what))
    if stale:
        warnings.append("mentions of old paths left (data files, or forms relayout.py does "
                        "not rewrite):\n    " + "\n    ".join(stale))

    if dry_run:
        report.append("dry run: nothing changed")
        if problems:
            report.append("a real run would stop here:")
            report.extend("relayout: " + p for p in problems)
            raise Stop("\n".join(report))
        return report, warnings

    # ---- apply
    try:
        groups = {}
        for old, new in moved.items():
            groups.setdefault(posixpath.dirname(new), []).append(old)
        for folder, olds in sorted(groups.items()):
            os.makedirs(os.path.join(root, folder), exist_ok=True)
            for i in range(0, len(olds), 100):
                git(root, "mv", "--", *sorted(olds[i:i + 100]), folder + "/")
        for new_path, (_, old_text, new_text) in contents.items():
            if old_text != new_text:
                with open(os.path.join(root, new_path), "w", encoding="utf-8") as f:
                    f.write(new_text)
        mine = os.path.join(root, "tools", "check_layering.py")
        if not os.path.isfile(mine):  # the ctest runs it from the checkout
            shutil.copyfile(check_layering_path, mine)
            git(root, "add", "tools/check_layering.py")
            report.append("tools/check_layering.py: copied into the checkout (the ctest "
                          "`layering` runs it)")
        if accepted:
            add_known(os.path.join(root, "tools", "check_layering.py"), accepted)
            report.append("check_layering KNOWN: %d accepted breaks added" % len(accepted))
        git(root, "add", "-u")
        # remove folders the move emptied
        for folder in SPLIT_FOLDERS:
            for d, dirs, names in sorted(os.walk(os.path.join(root, folder)), reverse=True):
                if not dirs and not names:
                    os.rmdir(d)
    except Exception as e:  # put the clean checkout back
        git(root, "reset", "--hard", "HEAD", check=False)
        for folder in NEW_FOLDERS:
            p = os.path.join(root, folder)
            if os.path.isdir(p) and not git(root, "ls-files", folder, check=False).strip():
                shutil.rmtree(p, ignore_errors=True)
        raise Stop("relayout: failed while applying (%s); the checkout is back as it was" % e)

    # the tree on disk, checked again
    check_layering2, _ = load_check_layering(root)
    on_disk = check_layering2.read_sources(root)
    v2, w2 = check_layering2.check(on_disk)
    new2, known2, _ = check_layering2.split_known(v2)
    report.append("check_layering on the result: %d files, %d known breaks, %d new" %
                  (len(on_disk), len(known2), len(new2)))
    report.append("done: staged, not committed. Review with `git -C %s diff --cached -M "
                  "--stat`, then build: cmake -S . -B build -G Ninja && cmake --build build && "
                  "(cd build && ctest)" % root)
    return report, warnings


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    unknown = flags - {"--dry-run", "--accept-new-violations"}
    if unknown or len(args) != 1:
        print("usage: relayout.py REPO_ROOT [--dry-run] [--accept-new-violations]",
              file=sys.stderr)
        return 2
    root = os.path.abspath(args[0])
    try:
        top = git(root, "rev-parse", "--show-toplevel").strip()
    except RuntimeError as e:
        print("relayout: %s is not a git checkout (%s)" % (root, e), file=sys.stderr)
        return 2
    if os.path.realpath(top) != os.path.realpath(root):
        print("relayout: %s is not the root of its checkout (%s is)" % (root, top),
              file=sys.stderr)
        return 2
    try:
        report, warnings = run(root, "--dry-run" in flags, "--accept-new-violations" in flags)
    except Stop as e:
        print(str(e), file=sys.stderr)
        return 2
    print("\n".join(report))
    for w in warnings:
        print("warning: " + w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
