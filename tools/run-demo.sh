#!/usr/bin/env bash
# The main job on a shipped input: installs what is missing, builds, then replays a real
# PyTorch snapshot through the allocator emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
build/memsim replay tests/data/silmont2000_mem_snapshot.pickle "$@"
