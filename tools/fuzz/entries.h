// The fuzz targets' entry points (docs/fuzzing.md), shared by the libFuzzer harnesses
// (tools/fuzz/fuzz_*.cpp, built with -DMEMSIM_FUZZ=ON and clang) and the plain corpus
// driver (tools/fuzz/corpus_driver.cpp, built always; ctest runs the kept corpora and
// crash reproducers through it, so CI needs neither clang nor libFuzzer).
//
// Contract: each entry takes any bytes and returns normally when the input is handled:
// accepted and run, or refused with the error its input deserves (SnapshotError for a
// snapshot; ScenarioError or ConfigError for a scenario). Anything else escapes as an
// exception or stops the process (a failed check, a sanitizer report): a bug.
//  - snapshot_entry: read the pickle; write it back and read that again (must succeed);
//    prepare and run the replay of every device with a trace or a segment (at most 4),
//    with a timeline and the final-state comparison, and program_from_trace. A replay may
//    also end in std::overflow_error (the allocator's checked statistics) on traces that
//    ask for exabytes: refused, not wrapped.
//  - scenario_entry: the text up to a line "#--set" is the scenario's YAML; each later
//    line is one --set KEY=VALUE (split as the command line does). Load it; when the
//    event estimate (sim/step/event_budget.h) is at most kFuzzEvents, build the Program,
//    run it through the allocator on the scenario's device and analyse it, as `memsim
//    run` does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memsim::fuzz {

inline constexpr uint64_t kFuzzEvents = uint64_t{1} << 20;

void snapshot_entry(const uint8_t* data, size_t size);
void scenario_entry(const uint8_t* data, size_t size);

}  // namespace memsim::fuzz
