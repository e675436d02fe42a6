// Acceptance: memsim's predictions for the real CS336 fp32 runs against their recorded
// snapshots (peak allocated within 1%, peak reserved within 3%, peak at the same op).
// The measured numbers come from tests/data/cs336_measured.json, a copy of
// shared/groundtruth/snapshots/manifest.json's peaks (cross-checked against the
// manifest when shared/ is present).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "real_run_test_support.h"
#include "sim/step/schedule.h"
#include "tests/support/real_runs.h"
#include "test_paths.h"

using namespace memsim;

namespace {

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  nlohmann::json j;
  in >> j;
  return j;
}

// FNV-1a 64 over the measured step's alloc/free events: 'A'/'F' then the requested size
// as 8 little-endian bytes (the fixture hashes the real trace the same way).
std::pair<uint64_t, size_t> sequence_hash(const Program& p) {
  size_t begin = 0;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark &&
        p.str(static_cast<uint32_t>(p.events[i].bytes)) == "measured_step_begin") {
      begin = i;
      break;
    }
  uint64_t h = 0xcbf29ce484222325ULL;
  size_t n = 0;
  auto mix = [&h](uint8_t b) { h = (h ^ b) * 0x100000001b3ULL; };
  for (size_t i = begin; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc && e.type != EventType::free) continue;
    mix(e.type == EventType::alloc ? 'A' : 'F');
    for (int k = 0; k < 8; ++k) mix(static_cast<uint8_t>(e.bytes >> (8 * k)));
    ++n;
  }
  return {h, n};
}

using memsim_test::rel;

}  // namespace

TEST_CASE("cs336 real runs: fixture agrees with the shared manifest", "[cs336][accuracy]") {
  const nlohmann::json fixture = load_json(MEMSIM_SOURCE_DIR + "/tests/data/cs336_measured.json");
  REQUIRE(!fixture.is_null());
  if (!memsim_test::shared_snapshots_present("tests/data/cs336_measured.json against manifest.json"))
    return;
  const nlohmann::json manifest = load_json(memsim_test::shared_snapshots_dir() + "manifest.json");
  REQUIRE(!manifest.is_null());
  for (const auto& entry : manifest) {
    const std::string file = entry["file"];
    if (!fixture["runs"].contains(file)) continue;
    const auto& f = fixture["runs"][file];
    CHECK(f["peak_allocated_in_trace"] == entry["peak_allocated_in_trace"]);
    CHECK(f["peak_reserved_in_trace"] == entry["peak_reserved_in_trace"]);
    CHECK(f["peak_requested_in_trace"] == entry["peak_requested_in_trace"]);
  }
}

TEST_CASE("cs336 real runs: predicted peaks match the snapshots", "[cs336][accuracy]") {
  const nlohmann::json fixture = load_json(MEMSIM_SOURCE_DIR + "/tests/data/cs336_measured.json");
  REQUIRE(!fixture.is_null());
  const std::vector<RealRun> runs = cs336_real_runs();
  REQUIRE(runs.size() == fixture["runs"].size());
  std::printf("\n| case | predicted allocated | real allocated | error | predicted reserved | real reserved | error | peak op (predicted) | same op |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|---|\n");
  for (const RealRun& run : runs) {
    INFO(run.id << " (" << run.snapshot << ")");
    REQUIRE(fixture["runs"].contains(run.snapshot));
    const auto& real = fixture["runs"][run.snapshot];
    const MeasuredStep p = predict_measured_step(run.scenario, run.script);
    const uint64_t ra = real["peak_allocated_in_trace"], rr = real["peak_reserved_in_trace"];
    const uint32_t ordinal = real["peak_alloc_ordinal"], n_allocs = real["n_allocs"];
    const double ea = rel(p.peak_allocated, ra), er = rel(p.peak_reserved, rr);
    const bool same_op = p.peak_alloc_ordinal == ordinal;
    std::printf("| %s | %llu | %llu | %+.4f%% | %llu | %llu | %+.4f%% | %s (%s, layer %d) | %s |\n",
                run.id.c_str(), static_cast<unsigned long long>(p.peak_allocated),
                static_cast<unsigned long long>(ra), 100 * ea,
                static_cast<unsigned long long>(p.peak_reserved),
                static_cast<unsigned long long>(rr), 100 * er, p.peak_op.c_str(),
                to_string(p.peak_phase), p.peak_layer, same_op ? "yes" : "NO");
    CHECK(std::fabs(ea) < 0.01);
    CHECK(std::fabs(er) < 0.03);
    // Same op: the peak is reached at the same allocation of the measured step, and
    // the step makes as many allocations as the recording holds.
    CHECK(p.peak_alloc_ordinal == ordinal);
    CHECK(p.n_allocs == n_allocs);
  }
}

TEST_CASE("cs336 real runs: the measured step's allocations and frees equal the trace's",
          "[cs336][accuracy]") {
  // Every alloc and free of the recorded step, in order, with the same requested size.
  const nlohmann::json fixture = load_json(MEMSIM_SOURCE_DIR + "/tests/data/cs336_measured.json");
  REQUIRE(!fixture.is_null());
  for (const RealRun& run : cs336_real_runs()) {
    INFO(run.id);
    const auto& real = fixture["runs"][run.snapshot];
    const auto [hash, events] = sequence_hash(build_program(run.scenario, run.script));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    CHECK(events == real["sequence_events"].get<size_t>());
    CHECK(std::string(hex) == real["sequence_fnv1a64"].get<std::string>());
  }
}
