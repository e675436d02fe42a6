#!/bin/sh
# README material for activation checkpointing: prints `memsim compare` over the shipped
# policies and what `memsim optimize` picks under two budgets, for the CS336 xl scenario
# at its shipped sequence length (128) and at 1024 (where activations dominate the peak).
# Usage: tools/checkpoint_report.sh [BUILD_DIR]   (default: build)
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
memsim="${1:-$here/build}/memsim"
scenario="$here/scenarios/cs336-xl-train-ctx128.yaml"
policies=none,full,uniform:2,uniform:4,block:16,modules,modules:attention,modules:mlp,selective,sqrt

run() {
  echo "\$ memsim $*"
  NO_COLOR=1 "$memsim" "$@" || true  # exit 3 (out of memory / nothing fits) is a result
  echo
}

run compare "$scenario" --policies "$policies"
long="--set batch.seq_len=1024 --set model.context_length=1024"
# shellcheck disable=SC2086
run compare "$scenario" $long --policies "$policies"
# shellcheck disable=SC2086
run optimize "$scenario" $long --budget 70GiB
# shellcheck disable=SC2086
run optimize "$scenario" $long --budget 60GiB
