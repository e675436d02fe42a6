#!/usr/bin/env bash
# Runs both fuzz targets (docs/fuzzing.md) for N minutes each, side by side:
#
#   tools/fuzz/run.sh [MINUTES] [BUILD_DIR]      (defaults: 5, build-fuzz)
#
# Needs clang with libFuzzer (Debian: apt-get install clang). Configures and builds
# BUILD_DIR (-O0, line tables, -DMEMSIM_FUZZ=ON -DMEMSIM_SANITIZE=ON) when it has no
# build files yet, then
# runs fuzz_snapshot and fuzz_scenario in parallel, each for MINUTES. The growing corpora
# live in fuzz-artifacts/corpus-{snapshot,scenario}/ (ignored by git), seeded from the
# kept ones (tests/data/fuzz/, tests/data/fuzz-scenario/, the shipped scenarios); crashes,
# timeouts and out-of-memory inputs land in fuzz-artifacts/ as snapshot-crash-* etc.
# Exit 0 when neither target found anything, 1 otherwise (the reproducers are listed).
#
# A finding is fixed like any bug: reproduce it as a test, fix it, and keep the input in
# tests/data/fuzz/ (snapshot) or tests/data/fuzz-scenario/ (scenario), where ctest
# replays it through the plain driver (tools/fuzz/corpus_driver.cpp).
set -u
minutes=${1:-5}
build=${2:-build-fuzz}
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: MINUTES must be a positive integer" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

if [[ ! -f "$build/build.ninja" ]]; then
  command -v clang++ >/dev/null || { echo "run.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
  # -O0 with line tables: a sanitized -O2 build of the whole simulator was on course for
  # over an hour on a loaded 2-core machine, this one took about 20 minutes; the fuzzers
  # then run slower.
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -gline-tables-only" -DMEMSIM_FUZZ=ON -DMEMSIM_SANITIZE=ON \
    -DMEMSIM_BUILD_TESTS=OFF || exit 2
fi
cmake --build "$build" --target fuzz_snapshot fuzz_scenario || exit 2

out=fuzz-artifacts
mkdir -p "$out/corpus-snapshot" "$out/corpus-scenario"
stamp="$out/.run-start"
touch "$stamp"
seconds=$((minutes * 60))
# Findings abort; halt_on_error keeps ASan's, -fno-sanitize-recover=all UBSan's.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

"$build/fuzz_snapshot" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -max_len=8192 -dict=tools/fuzz/snapshot.dict -artifact_prefix="$out/snapshot-" -print_final_stats=1 \
  "$out/corpus-snapshot" tests/data/fuzz >"$out/fuzz_snapshot.log" 2>&1 &
snapshot_pid=$!
"$build/fuzz_scenario" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
  -max_len=4096 -dict=tools/fuzz/scenario.dict -artifact_prefix="$out/scenario-" \
  -print_final_stats=1 "$out/corpus-scenario" tests/data/fuzz-scenario scenarios \
  >"$out/fuzz_scenario.log" 2>&1 &
scenario_pid=$!
wait "$snapshot_pid"; snapshot_rc=$?
wait "$scenario_pid"; scenario_rc=$?

for t in snapshot scenario; do
  echo "== fuzz_$t ($out/fuzz_$t.log)"
  grep -E "^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|peak_rss_mb)|SUMMARY|ERROR:|runtime error" \
    "$out/fuzz_$t.log" | head -20
done
# Findings of this run: crashes, timeouts, out-of-memory and leaks (slow units are noted
# by libFuzzer as slow-unit-*; they are not failures).
found=$(find "$out" -maxdepth 1 -newer "$stamp" -type f \
          \( -name '*-crash-*' -o -name '*-timeout-*' -o -name '*-oom-*' -o -name '*-leak-*' \) | sort)
slow=$(find "$out" -maxdepth 1 -newer "$stamp" -type f -name '*-slow-unit-*' | sort)
[[ -n "$slow" ]] && echo "slow inputs (not failures): $slow"
if [[ $snapshot_rc -ne 0 || $scenario_rc -ne 0 || -n "$found" ]]; then
  echo "findings (reproduce with $build/fuzz_<target> FILE):"
  echo "${found:-  (none saved; see the logs)}"
  exit 1
fi
echo "no findings in $minutes minute(s) per target"
