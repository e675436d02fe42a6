// Reserved much larger than allocated under FSDP / FSDP2 (docs/moe.md "Reserved much larger
// than allocated"): where the reserved bytes come from, checked against the H200, and the
// FITS warning "setup_cache" and the advice that say so (tools/cli/setup_cache_report.h).
//
//  1. The H200 FSDP2 runs (tests/data/gpu/fsdp2, torch 2.11): memsim's side-stream pools
//     (all-gather copy-in, reduce-scatter, HSDP all-reduce) reserve exactly the real runs'
//     bytes in as many segments, and the reserved bytes at the end of setup (after
//     fully_shard) are the real ones to the byte: 1.33 GB kept for a model built on the GPU,
//     0.18 GB for the meta-device build. So the mechanism that gives Qwen3-30B-A3B its
//     60 GiB reserved (the setup's cached segments) is the measured one.
//  2. `memsim run` warns (kind setup_cache) for the attention-LoRA Qwen3-30B-A3B FSDP2 run,
//     with the peaks of the same run built on the CPU / meta device, and of that with
//     expandable segments, each equal to a separate `memsim run --set` of it; no warning
//     for the CPU-built run or a run without the cache; --advise lists fsdp_init: cpu.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "allocator/snapshot/snapshot.h"
#include "allocator/units.h"
#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/search/advice_candidates.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"
#include "tests/cli_test_support.h"

using namespace memsim;
using nlohmann::json;

namespace {

const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/fsdp2/fsdp2_runs.json";
const std::string kSnapshots = MEMSIM_FSDP2_SNAPSHOTS;  // unpacked by CMake
const std::string kQwen = MEMSIM_SOURCE_DIR + "/tests/data/reserved/qwen3-30b-a3b-attn-lora-fsdp2-s1024.yaml";

// Reserved bytes and segment count per stream, streams numbered in order of their first
// cudaMalloc (the real snapshot's stream ids are pointers; memsim's are 0, 1, 2, ...).
struct Pools {
  std::map<int, uint64_t> bytes;
  std::map<int, int> segments;
};

Pools pools_of(const std::vector<SegmentInfo>& segments, const std::map<StreamId, int>& order) {
  Pools p;
  for (const SegmentInfo& s : segments) {
    const int k = order.at(s.stream);
    p.bytes[k] += s.total_size;
    p.segments[k] += 1;
  }
  return p;
}

std::map<StreamId, int> first_use_order(const std::vector<SnapshotTraceEntry>& trace) {
  std::map<StreamId, int> order;
  for (const SnapshotTraceEntry& e : trace)
    if (e.action == TraceAction::segment_alloc && !order.count(e.stream)) {
      const int next = static_cast<int>(order.size());
      order[e.stream] = next;
    }
  return order;
}

json run_json(const std::string& args, const memsim_test::TempDir& dir) {
  const memsim_test::CliResult r = memsim_test::run_memsim("run " + args + " --json -", dir);
  INFO("memsim run " << args << "\n" << r.err);
  REQUIRE(r.status == 0);
  return json::parse(r.out);
}

const json* warning_of(const json& run, const std::string& kind) {
  for (const json& w : run["warnings"])
    if (w["kind"] == kind) return &w;
  return nullptr;
}

}  // namespace

TEST_CASE("FSDP2's stream pools and the cached setup match the H200 byte for byte",
          "[reserved][fsdp2][gpu]") {
  if (!std::filesystem::exists(kRuns) || !std::filesystem::is_directory(kSnapshots)) {
    WARN("MEASUREMENT MISSING: " << kRuns << " or its unpacked snapshots (" << kSnapshots
         << "): the FSDP2 stream pools are unchecked against a GPU");
    return;
  }
  const json runs = memsim_test::load_json(kRuns);
  REQUIRE(runs["results"].size() >= 9);
  int gpu_built = 0, meta_built = 0;
  for (const json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const Snapshot real = read_snapshot_file(kSnapshots + "/" + name + ".pickle");
    REQUIRE(!real.device_traces.empty());
    std::vector<SegmentInfo> real_segments;
    for (const SnapshotSegment& s : real.segments) real_segments.push_back(s.info);
    const Pools want = pools_of(real_segments, first_use_order(real.device_traces[0]));

    const Scenario scenario = load_scenario(MEMSIM_SOURCE_DIR + "/" + r["spec"]["scenario"].get<std::string>());
    const Program program = build_program(scenario);
    SimulatedDevice device(scenario.device.capacity, scenario.device.cuda_context);
    std::vector<SegmentInfo> segments;
    ExecuteOptions options;
    options.final_segments = &segments;
    const Timeline timeline = execute(program, scenario.allocator, device, options);
    REQUIRE(!timeline.oom);
    std::map<StreamId, int> order;
    for (const SegmentInfo& s : segments) order[s.stream] = static_cast<int>(s.stream);
    const Pools got = pools_of(segments, order);

    // Every side stream's pool (stream 0 is the default stream in both): same bytes, same
    // segments. The default stream's pool differs in four runs (activation placement; the
    // run-level tolerances are tests/test_gpu_fsdp2_runs.cpp's).
    REQUIRE(want.bytes.size() == got.bytes.size());
    REQUIRE(want.bytes.size() >= 3);
    for (const auto& [stream, bytes] : want.bytes) {
      if (stream == 0) continue;
      INFO("stream " << stream);
      CHECK(got.bytes.at(stream) == bytes);
      CHECK(got.segments.at(stream) == want.segments.at(stream));
    }

    // The setup: reserved after fully_shard, to the byte (the GPU-built model's freed
    // segments stay cached), allocated within 32 KiB.
    size_t last_setup = 0;
    for (size_t i = 0; i < program.events.size() && program.events[i].phase == Phase::setup; ++i)
      last_setup = i;
    const json& after = r["marks"]["after_fully_shard"];
    CHECK(timeline.reserved[last_setup] == after["reserved_bytes.all.current"].get<uint64_t>());
    const int64_t allocated_error = static_cast<int64_t>(timeline.allocated[last_setup]) -
                                    after["allocated_bytes.all.current"].get<int64_t>();
    CHECK(allocated_error >= 0);
    CHECK(allocated_error <= 32768);
    if (scenario.parallel.fsdp_init_on_cpu) {
      ++meta_built;
    } else {
      ++gpu_built;
      // The built model's segments are kept: sharding freed most of it (allocated falls
      // below a third of the built model's) and reserved did not fall.
      const json& built = r["marks"]["after_model"];
      CHECK(3 * after["allocated_bytes.all.current"].get<uint64_t>() <
            built["allocated_bytes.all.current"].get<uint64_t>());
      CHECK(after["reserved_bytes.all.current"].get<uint64_t>() >=
            built["reserved_bytes.all.current"].get<uint64_t>());
    }
  }
  CHECK(gpu_built >= 8);
  CHECK(meta_built >= 1);
}

TEST_CASE("a GPU-built FSDP2 Qwen3-30B-A3B run warns that the setup's cache holds its reserved",
          "[reserved][fsdp2][moe]") {
  memsim_test::TempDir dir("memsim_setup_cache");
  const std::string q = "'" + kQwen + "'";
  const json gpu = run_json(q, dir);
  const json cpu = run_json(q + " --set parallel.fsdp_init=cpu", dir);
  const json both = run_json(q + " --set parallel.fsdp_init=cpu --set allocator.expandable_segments=true", dir);

  // The figures docs/moe.md gives (transformers 5.x's default grouped_mm experts).
  CHECK(gpu["peak_allocated_bytes"].get<uint64_t>() == cpu["peak_allocated_bytes"].get<uint64_t>());
  CHECK(gpu["peak_reserved_bytes"].get<uint64_t>() > 4 * cpu["peak_reserved_bytes"].get<uint64_t>() - 1);
  CHECK(human_bytes(gpu["peak_reserved_bytes"].get<uint64_t>()) == "60.58 GiB");
  CHECK(human_bytes(cpu["peak_reserved_bytes"].get<uint64_t>()) == "15.06 GiB");

  const json* w = warning_of(gpu, "setup_cache");
  REQUIRE(w != nullptr);
  const std::string m = (*w)["message"];
  INFO(m);
  CHECK(m.find("is 5.3x the peak allocated 11.42 GiB") != std::string::npos);
  CHECK(m.find("parallel.fsdp_init: cpu) the run reserves " +
               human_bytes(cpu["peak_reserved_bytes"].get<uint64_t>())) != std::string::npos);
  CHECK(m.find("with allocator.expandable_segments: true as well " +
               human_bytes(both["peak_reserved_bytes"].get<uint64_t>())) != std::string::npos);
  CHECK(gpu["fits"].get<bool>());

  // Built on the CPU / meta device there is no cache to warn about.
  CHECK(warning_of(cpu, "setup_cache") == nullptr);
  CHECK(warning_of(both, "setup_cache") == nullptr);

  // The text summary's verdict names it.
  const memsim_test::CliResult text = memsim_test::run_memsim("run " + q, dir);
  CHECK(text.status == 0);
  CHECK(text.out.find("FITS (warning: reserved held by the setup's cache)") != std::string::npos);
}

TEST_CASE("no setup_cache warning where the GPU-built cache is reused", "[reserved][fsdp2]") {
  // Llama 3 8B FSDP2 built on the GPU: its dense weights' segments serve the step (peak
  // reserved 1.33x the allocated): below kSetupCacheRatio, nothing simulated, no warning.
  memsim_test::TempDir dir("memsim_setup_cache");
  const json j = run_json("'" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml'", dir);
  CHECK(warning_of(j, "setup_cache") == nullptr);
}

TEST_CASE("run --advise tries building the model on the meta device / CPU for FSDP built on the GPU",
          "[reserved][advise]") {
  auto has_cpu_init = [](const Scenario& s) {
    for (const AdviceCandidate& c : advice_candidates(s))
      if (c.sets.size() == 1 && c.sets[0].first == "parallel.fsdp_init" && c.sets[0].second == "cpu")
        return true;
    return false;
  };
  CHECK(has_cpu_init(load_scenario(kQwen)));
  CHECK(has_cpu_init(load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/qwen3-30b-a3b-fsdp-8xh100.yaml")));
  CHECK_FALSE(has_cpu_init(load_scenario(kQwen, {{"parallel.fsdp_init", "cpu"}})));
  CHECK_FALSE(has_cpu_init(load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-fsdp2-8xh100.yaml")));

  memsim_test::TempDir dir("memsim_setup_cache");
  const json j = run_json("'" + kQwen + "' --advise", dir);
  const json cpu = run_json("'" + kQwen + "' --set parallel.fsdp_init=cpu", dir);
  bool found = false;
  for (const json& a : j["advice"])
    if (a["set"].contains("parallel.fsdp_init")) {
      found = true;
      CHECK(a["peak_reserved_bytes"] == cpu["peak_reserved_bytes"]);
      CHECK(a["fits"].get<bool>());
    }
  CHECK(found);
}
