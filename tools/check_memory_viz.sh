#!/usr/bin/env bash
# check_memory_viz.sh MEMORYVIZ_JS D3_JS [SCENARIO [memsim run options...]]
#
# Does PyTorch's memory_viz show where each block of a memsim snapshot came from (issue #19)?
# Writes `memsim run SCENARIO --snapshot X.pickle` and loads X.pickle into MemoryViz.js's own
# loader in headless Chromium (tools/check_memory_viz.py): prints the category legend and
# the frames text shown for the largest blocks in the "Active Memory Timeline" and the
# "Allocator State History", and fails when a view throws, draws nothing, shows no
# categories, or shows any block as "allocated before _record_history was enabled".
#
# It fetches nothing. The user supplies:
#   MEMORYVIZ_JS  pytorch/pytorch torch/utils/viz/MemoryViz.js (the file pytorch.org/memory_viz
#                 serves); docs/tensor-names.md names the commit last checked.
#   D3_JS         a d3 v5 UMD bundle (MemoryViz.js imports d3@5 and d3 v5's own modules),
#                 e.g. package/dist/d3.min.js of `npm pack d3@5`.
# Defaults: a 2-layer Llama-2-7B full fine-tune at seq_len 256 (a few hundred KiB of pickle);
# MEMSIM (env) defaults to build/memsim. Not a ctest: the suite cannot fetch MemoryViz.js.
# Exit: 0 ok, 1 failed, 2 usage, 77 chromium not installed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 2 ]; then sed -n '2,20p' "$0"; exit 2; fi
js=$1; d3=$2; shift 2
for f in "$js" "$d3"; do [ -f "$f" ] || { echo "check_memory_viz: no such file: $f" >&2; exit 2; }; done
memsim=${MEMSIM:-$here/build/memsim}
[ -x "$memsim" ] || { echo "check_memory_viz: no memsim binary at $memsim (set MEMSIM)" >&2; exit 2; }
if [ $# -eq 0 ]; then
  set -- "$here/scenarios/llama2-7b-full-finetune-a100.yaml" --set model.layers=2 \
    --set batch.seq_len=256 --set device.capacity=1TiB
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "memsim run $* --snapshot snapshot.pickle"
rc=0
"$memsim" run "$@" --snapshot "$tmp/snapshot.pickle" >"$tmp/out.txt" 2>&1 || rc=$?
if [ ! -s "$tmp/snapshot.pickle" ]; then
  cat "$tmp/out.txt" >&2
  echo "check_memory_viz: memsim (exit $rc) wrote no snapshot" >&2
  exit 1
fi
rc=0
python3 "$here/tools/check_memory_viz.py" "$js" "$d3" "$tmp/snapshot.pickle" --expect-frames || rc=$?
exit $rc
