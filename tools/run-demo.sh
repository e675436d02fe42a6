#!/usr/bin/env bash
# The main job on shipped inputs: installs what is missing, builds, simulates one training
# step of the CS336-xl scenario, then replays a real PyTorch snapshot through the
# allocator emulator. Extra arguments go to `memsim run` (e.g. --json -).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
echo "== memsim run scenarios/cs336-xl-train-ctx128.yaml"
status=0
build/memsim run scenarios/cs336-xl-train-ctx128.yaml "$@" || status=$?
echo
echo "== memsim replay tests/data/silmont2000_mem_snapshot.pickle"
build/memsim replay tests/data/silmont2000_mem_snapshot.pickle
exit $status
