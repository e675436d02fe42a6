// Hardening (issue #20 items 4-5): each bug found by fuzzing or by hand-made inputs,
// reproduced first, then fixed. The snapshots are tiny pickles committed under
// tests/data/fuzz/ (tools/fuzz/corpus_driver.cpp replays the same files as a ctest);
// scenarios are strings here. docs/fuzzing.md lists them.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "allocator/caching_allocator.h"
#include "allocator/snapshot/snapshot.h"
#include "allocator/units.h"
#include "replay/replay.h"
#include "scenario/scenario.h"
#include "sim/search/max_keys.h"
#include "sim/step/event_budget.h"
#include "sim/step/schedule.h"
#include "tests/cli_test_support.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;
using memsim_test::CliResult;
using memsim_test::TempDir;

namespace {

const std::string kFuzzData = MEMSIM_SOURCE_DIR + "/tests/data/fuzz/";

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string snapshot_error(const std::string& name) {
  try {
    read_snapshot_bytes(file_bytes(kFuzzData + name), name);
  } catch (const SnapshotError& e) {
    return e.what();
  }
  return "";
}

// A two-layer cs336 model (tests/test_reports.cpp's tiny scenario).
std::string tiny(const std::string& extra = "") {
  return "name: tiny hardening test\n"
         "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n"
         "  vocab: 512\n"
         "batch:\n  micro_batch: 2\n  seq_len: 32\n"
         "device:\n  capacity: 1GiB\n  cuda_context: 0\n" +
         extra;
}

std::string load_error(const std::string& text,
                       const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  try {
    load_scenario_text(text, "t.yaml", sets);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

SegmentInfo one_block_segment(uint64_t address, uint64_t size) {
  SegmentInfo s;
  s.address = address;
  s.total_size = s.allocated_size = s.active_size = s.requested_size = size;
  s.blocks.push_back({address, size, size, BlockState::active_allocated});
  return s;
}

}  // namespace

TEST_CASE("a 110-byte pickle allocating 2^63 bytes is refused, not replayed as 0 B",
          "[hardening]") {
  // Before: prepare_replay summed the rounded size into an int64 (UBSan: signed overflow)
  // and a Release build printed "FITS peak allocated 0 B".
  CHECK(file_bytes(kFuzzData + "hand_alloc_2pow63.pickle").size() == 110);
  const std::string e = snapshot_error("hand_alloc_2pow63.pickle");
  CHECK(contains(e, "device_traces[0][0].size: 9223372036854775808 bytes at 0 end past 2^57"));

  TempDir dir("memsim_hardening");
  const CliResult r = memsim_test::run_memsim("replay '" + kFuzzData + "hand_alloc_2pow63.pickle'", dir);
  CHECK(r.status == 1);
  CHECK(contains(r.err, "beyond any device's address space"));
  CHECK_FALSE(contains(r.out, "FITS"));
}

TEST_CASE("a 2^63-byte segment is refused, seeded anyway, the statistics throw, never go negative",
          "[hardening]") {
  CHECK(contains(snapshot_error("hand_segment_2pow63.pickle"),
                 "segments[0].total_size: the segment at 0 of 9223372036854775808 bytes ends past 2^57"));
  // The allocator itself (a caller that skips the reader): c10's int64 statistics would
  // read allocated_bytes.all.current = -2^63.
  SimulatedDevice device(0, 0);
  CachingAllocator alloc(AllocatorConfig{}, device);
  CHECK_THROWS_AS(alloc.seed_segment(one_block_segment(0, uint64_t{1} << 63)), std::overflow_error);
}

TEST_CASE("the allocator statistics are checked sums", "[hardening]") {
  // Two 2^62-byte segments: reserved_bytes would wrap to -2^63.
  SimulatedDevice device(0, 0);
  CachingAllocator alloc(AllocatorConfig{}, device);
  alloc.seed_segment(one_block_segment(0, uint64_t{1} << 62));
  CHECK(alloc.stats().allocated_bytes.all.current == int64_t{1} << 62);
  CHECK_THROWS_WITH(alloc.seed_segment(one_block_segment(uint64_t{1} << 62, uint64_t{1} << 62)),
                    Catch::Matchers::Contains("leaves the int64 range"));
  CHECK(alloc.stats().reserved_bytes.all.current > 0);
}

TEST_CASE("overlapping segments are not a start state", "[hardening]") {
  // Two segments of device 0 share 2 MiB: the reader refuses the file.
  CHECK(contains(snapshot_error("hand_overlapping_segments.pickle"),
                 "segments[1].address: the segment at 8592031744 overlaps segments[0] (8589934592 + "
                 "4194304 bytes) on device 0"));
  // The snapshot's segments are disjoint, but the trace frees a segment it never created
  // that overlaps one of them: the reconstructed start state is refused.
  const Snapshot snap = read_snapshot_bytes(file_bytes(kFuzzData + "hand_start_overlap.ok.pickle"), "x");
  CHECK_THROWS_WITH(prepare_replay(snap), Catch::Matchers::Contains("start state: the segment at") &&
                                              Catch::Matchers::Contains("overlaps"));
}

TEST_CASE("loop-count keys have limits that the error names", "[hardening]") {
  // Before: 9223372036854775807 + 1 steps overflowed the event estimate and the loop ran
  // for ever, growing memory.
  CHECK(load_error(tiny("step:\n  warmup_steps: 9223372036854775807\n")) ==
        "t.yaml:16: step.warmup_steps: 9223372036854775807 is more than the limit of 1000 "
        "warm-up steps (the allocator reaches its steady state within two steps; more only "
        "repeat the same events)");
  // Before: 90 s and 10 GB on this two-layer model.
  CHECK(load_error(tiny(), {{"batch.grad_accum", "50257"}}) ==
        "--set batch.grad_accum: 50257 is more than the limit of 16384 micro-batches per step "
        "(accumulation repeats the same micro-step: the peak is reached by the second one; more "
        "only repeat the same events)");
  CHECK(load_error(tiny("step:\n  warmup_steps: 1000\n")).empty());
  CHECK(load_error(tiny(), {{"batch.grad_accum", "16384"}}).empty());
}

TEST_CASE("the event budget is checked before anything is reserved", "[hardening]") {
  const Scenario ok = load_scenario_text(tiny(), "t.yaml", {{"batch.grad_accum", "8"}});
  CHECK(estimated_events(ok) == 2 * 8 * (2 * 340 + 1200) + 2 * 12);
  CHECK_NOTHROW(check_event_budget(ok));
  // Within both key limits, but 1001 x 16384 micro-steps: refused at once.
  const Scenario big = load_scenario_text(
      tiny("step:\n  warmup_steps: 1000\n"), "t.yaml", {{"batch.grad_accum", "16384"}});
  CHECK(estimated_events(big) > kEventBudget);
  CHECK_THROWS_WITH(build_program(big),
                    "--set batch.grad_accum: the run would emit about 30832721944 allocator events "
                    "(1001 step(s) x 16384 micro-batch(es) x 2 layer(s) per program), more than the "
                    "event budget of 33554432; the peak is reached within two steps and two "
                    "micro-batches, so fewer give the same answer");
  // A hundred million layers: the key named is the one that drives the count.
  const Scenario deep = load_scenario_text(tiny(), "t.yaml", {{"model.layers", "100000000"}});
  CHECK_THROWS_WITH(build_program(deep),
                    Catch::Matchers::StartsWith("--set model.layers: the run would emit about 69200002400") &&
                        Catch::Matchers::Contains("beyond one simulated program"));
  // A key set in the file is named by its line, as the reader's own errors do.
  const Scenario deep_file = load_scenario_text(tiny("step:\n  warmup_steps: 1000\n"), "t.yaml",
                                                {{"batch.grad_accum", "16384"}});
  CHECK_THROWS_WITH(build_program(deep_file), Catch::Matchers::StartsWith("--set batch.grad_accum: "));
  const Scenario many_steps = load_scenario_text(
      tiny("step:\n  warmup_steps: 1000\n"), "t.yaml", {{"batch.grad_accum", "1000"}, {"model.layers", "40"}});
  CHECK_THROWS_WITH(build_program(many_steps), Catch::Matchers::StartsWith("t.yaml:16: step.warmup_steps: "));
  // Saturates instead of overflowing.
  Scenario absurd = ok;
  absurd.step.warmup_steps = INT64_MAX;
  absurd.batch.grad_accum = INT64_MAX;
  absurd.model.layers = INT64_MAX;
  CHECK(estimated_events(absurd) == UINT64_MAX);
}

TEST_CASE("sweep --max refuses keys that cannot change memory", "[hardening]") {
  CHECK(max_key_refusal("batch.micro_batch").empty());
  CHECK(contains(max_key_refusal("batch.grad_accum"), "memory does not grow with batch.grad_accum"));
  TempDir dir("memsim_hardening");
  const auto scenario = dir.write("tiny.yaml", tiny());
  for (const char* key : {"batch.grad_accum", "step.warmup_steps"}) {
    const CliResult r = memsim_test::run_memsim("sweep '" + scenario.string() + "' --max " + key, dir);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, std::string("--max ") + key + ": memory does not grow with " + key));
  }
}

TEST_CASE("sizes up to 2^64 - 1 bytes parse, the error says what the limit is", "[hardening]") {
  // Before: "1PiB" was refused as "at most 64 bits".
  CHECK(parse_size("1PiB") == uint64_t{1} << 50);
  CHECK(parse_size("2EiB") == uint64_t{1} << 61);
  CHECK(parse_size("1PB") == 1000'000'000'000'000ull);
  CHECK(parse_size("18446744073709551615") == UINT64_MAX);
  CHECK(parse_size("15.5 EiB") == uint64_t{31} << 59);
  CHECK_FALSE(parse_size("16EiB").has_value());
  CHECK_FALSE(parse_size("18446744073709551616").has_value());
  CHECK(size_parse_problem("16EiB") == "more than 2^64 - 1 bytes (the limit, just under 16 EiB)");
  CHECK(size_parse_problem("1PiB").empty());
  CHECK(load_scenario_text(tiny("") + "", "t.yaml", {{"device.capacity", "1PiB"}}).device.capacity ==
        uint64_t{1} << 50);
  CHECK(load_error(tiny(), {{"device.capacity", "16EiB"}}) ==
        "--set device.capacity: expected a size such as 80GiB, 500MiB, 80GB or a byte count, got "
        "'16EiB': more than 2^64 - 1 bytes (the limit, just under 16 EiB)");
}

TEST_CASE("a report that cannot be written to stdout is an error", "[hardening]") {
  if (!std::filesystem::exists("/dev/full")) {
    MEMSIM_SKIP("/dev/full does not exist on this system");
    return;
  }
  TempDir dir("memsim_hardening");
  const auto scenario = dir.write("tiny.yaml", tiny());
  // Before: exit 0 with nothing written.
  for (const std::string& args : {std::string("run '") + scenario.string() + "'",
                                  std::string("run '") + scenario.string() + "' --json -",
                                  std::string("presets")}) {
    const CliResult r = memsim_test::run_memsim(args + " >/dev/full", dir);
    INFO(args);
    CHECK(r.status == 1);
    // With the reason when the last flush failed ("No space left on device"); an earlier
    // automatic flush leaves only the stream's error flag.
    CHECK(contains(r.err, "memsim: error: cannot write to stdout"));
  }
}

TEST_CASE("control characters in a scenario name are escaped in text output", "[hardening]") {
  TempDir dir("memsim_hardening");
  // ESC [ 2 J clears the screen; a C1 CSI (U+009B) does the same on some terminals.
  std::string text = tiny();
  text.replace(0, text.find('\n'), "name: \"evil\\e[2J\\u009bname\\ttab\"");
  const auto scenario = dir.write("evil.yaml", text);
  const CliResult r = memsim_test::run_memsim("run '" + scenario.string() + "'", dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find("\xc2\x9b") == std::string::npos);
  CHECK(contains(r.out, "evil\\x1b[2J\\u009bname\\x09tab"));
  // The JSON report keeps the name as it is (JSON escapes it itself).
  const CliResult j = memsim_test::run_memsim("run '" + scenario.string() + "' --json -", dir);
  CHECK(contains(j.out, "\"scenario\": \"evil\\u001b[2J\xc2\x9bname\\ttab\""));
}

TEST_CASE("petabyte activations do not divide by zero in the addmm backward", "[hardening]") {
  // Found by fuzzing (tests/data/fuzz-scenario/repro_gpt2_micro_batch_2pow32.yaml):
  // micro_batch 2^32 passes the int64 product checks, and the bias-grad staging of GPT-2's
  // Conv1D addmm multiplied two byte counts (bias x input), which wrapped to a divisor of 0
  // (SIGFPE). The element size is now found by exact divisions.
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/gpt2-large-zero1-4xv100.yaml",
                                   {{"batch.micro_batch", "4294967296"}});
  const Program program = build_program(s);
  CHECK(program.events.size() > 1000);
}
