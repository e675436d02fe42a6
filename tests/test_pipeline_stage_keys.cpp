// The pipeline's stage selection (sim/megatron/megatron_pipeline.h): stages are grouped by
// megatron_stage_key and only the first of each key is built, streamed into a PeakSink
// (sim/step/peak_sink.h). Checked against building and executing every stage stored:
//  - stages with equal keys build the same events (a stage dependence the key misses would
//    show here), and stages with different keys differ;
//  - the peaks per stage, the stage chosen and its Program equal the stored way's;
//  - PeakSink's statistics equal execute()'s, fitting and out of memory;
//  - streamed into a plain run's sink, the chosen stage gives the stored run's analysis.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "megatron_pipeline_test_support.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/stream_run.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/step/execute.h"
#include "sim/step/peak_sink.h"

using namespace memsim;

namespace {

struct Case {
  const char* what;
  Scenario s;
};

std::vector<Case> cases() {
  using memsim_test::tiny_pipeline;
  std::vector<Case> out;
  // 1F1B, p8 m4: stages 1-3 warm up with 4 forwards, stage 4 with 3 then one steady
  // forward: all four run FFFFBBBB and share a key.
  out.push_back({"1f1b p8 m4 (stages 1-4 share a key)", tiny_pipeline(8, 8, 4)});
  out.push_back({"1f1b p4 m8", tiny_pipeline(8, 4, 8)});
  out.push_back({"gpipe p6 m3", tiny_pipeline(6, 6, 3, PipelineSchedule::gpipe)});
  out.push_back({"interleaved p4 v2 m4", tiny_pipeline(8, 4, 4, PipelineSchedule::interleaved, 2)});
  Case fwd{"1f1b p4 m2 forward only", tiny_pipeline(8, 4, 2)};
  fwd.s.step.kind = StepKind::forward;
  out.push_back(fwd);
  return out;
}

bool same_events(const Program& a, const Program& b) {
  if (a.events.size() != b.events.size() || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.events.size(); ++i) {
    const MemoryEvent& x = a.events[i];
    const MemoryEvent& y = b.events[i];
    if (x.type != y.type || x.bytes != y.bytes || x.tensor != y.tensor || x.stream != y.stream ||
        x.kind != y.kind || x.phase != y.phase || x.layer != y.layer)
      return false;
    if (x.type == EventType::mark && a.str(static_cast<uint32_t>(x.bytes)) != b.str(static_cast<uint32_t>(y.bytes)))
      return false;
  }
  return true;
}

uint64_t stored_peak(const Program& program, const AllocatorConfig& config) {
  SimulatedDevice device(1ull << 60, 0);
  return static_cast<uint64_t>(execute(program, config, device).final_stats.reserved_bytes.all.peak);
}

}  // namespace

TEST_CASE("pipeline stages with equal keys build equal events, the peaks are every stage's",
          "[pipeline-stream]") {
  for (const Case& c : cases()) {
    INFO(c.what);
    const int64_t p = c.s.parallel.pipeline;
    std::vector<Program> stages(static_cast<size_t>(p));
    std::vector<uint64_t> peaks(static_cast<size_t>(p));
    std::map<std::vector<int32_t>, int64_t> first;
    size_t shared = 0;
    for (int64_t k = 0; k < p; ++k) {
      build_megatron_stage_program(c.s, {}, k, stages[static_cast<size_t>(k)]);
      peaks[static_cast<size_t>(k)] = stored_peak(stages[static_cast<size_t>(k)], c.s.allocator);
      const auto [it, added] = first.emplace(megatron_stage_key(c.s, k), k);
      if (!added) {
        ++shared;
        CHECK(same_events(stages[static_cast<size_t>(it->second)], stages[static_cast<size_t>(k)]));
      }
    }
    // Different keys: different events (the key is not coarser than needed either).
    for (const auto& [ka, a] : first)
      for (const auto& [kb, b] : first)
        if (a < b) CHECK_FALSE(same_events(stages[static_cast<size_t>(a)], stages[static_cast<size_t>(b)]));
    if (std::string(c.what).find("share") != std::string::npos) CHECK(shared == 3);

    Program chosen;
    const PipelineStagePeaks got = build_megatron_pipeline_program(c.s, {}, chosen);
    CHECK(got.peak_reserved == peaks);
    const int64_t worst = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
    CHECK(got.worst == worst);
    CHECK(chosen.rank.pipeline_stage == worst);
    CHECK(same_events(chosen, stages[static_cast<size_t>(worst)]));
    CHECK(chosen.rank.why.find("pipeline stage " + std::to_string(worst) + " of " + std::to_string(p)) == 0);
  }
}

TEST_CASE("PeakSink: execute()'s statistics without storing the events", "[pipeline-stream]") {
  const Scenario s = memsim_test::tiny_pipeline(8, 4, 4);
  Program stored;
  build_megatron_stage_program(s, {}, 1, stored);
  SimulatedDevice big(1ull << 60, 0);
  const Timeline t = execute(stored, s.allocator, big);
  for (const uint64_t capacity : {uint64_t{1} << 60, static_cast<uint64_t>(t.final_stats.reserved_bytes.all.peak) * 7 / 10}) {
    INFO("capacity " << capacity);
    SimulatedDevice d1(capacity, 0), d2(capacity, 0);
    const Timeline expected = execute(stored, s.allocator, d1);
    PeakSink sink(s.allocator, d2);
    Program streamed;
    streamed.set_sink(SinkAttachment{&sink, 1});  // every event handed on as soon as allowed
    build_megatron_stage_program(s, {}, 1, streamed);
    streamed.finish();
    streamed.take_sink();
    CHECK(sink.out_of_memory() == expected.oom.has_value());
    CHECK(sink.stats().reserved_bytes.all.peak == expected.final_stats.reserved_bytes.all.peak);
    CHECK(sink.stats().allocated_bytes.all.peak == expected.final_stats.allocated_bytes.all.peak);
    CHECK(sink.stats().allocated_bytes.all.current == expected.final_stats.allocated_bytes.all.current);
    CHECK(sink.stats().num_alloc_retries == expected.final_stats.num_alloc_retries);
    CHECK(streamed.events.size() < stored.events.size() / 4);  // only a tail was kept
  }
}

TEST_CASE("pipeline: the chosen stage streamed into a run's sink gives the stored analysis",
          "[pipeline-stream]") {
  const Scenario s = memsim_test::tiny_pipeline(8, 8, 4);
  Program stored;
  build_megatron_pipeline_program(s, {}, stored);
  SimulatedDevice d1(1ull << 60, 0), d2(1ull << 60, 0);
  const Analysis expected = analyze(stored, execute(stored, s.allocator, d1));
  Program program;
  const StreamResult r = stream_run(
      program, [&](Program& p) { build_megatron_pipeline_program(s, {}, p); }, s.allocator, d2);
  CHECK(r.complete);
  CHECK(program.rank.why == stored.rank.why);
  CHECK(program.events.size() < stored.events.size());  // nothing but a tail stored
  CHECK(r.analysis.events == expected.events);
  CHECK(r.analysis.peak_allocated == expected.peak_allocated);
  CHECK(r.analysis.peak_reserved == expected.peak_reserved);
  REQUIRE(r.analysis.peak.has_value());
  REQUIRE(expected.peak.has_value());
  CHECK(r.analysis.peak->index == expected.peak->index);
}

TEST_CASE("pipeline: a search's stop_at_oom still counts the whole chosen stage",
          "[pipeline-stream]") {
  // As before streaming: the chosen stage is built whole, so an out-of-memory point's
  // event count and FLOPs are the stage's (sweep --json prints them).
  const Scenario s = memsim_test::tiny_pipeline(8, 4, 4);
  Program stored;
  build_megatron_pipeline_program(s, {}, stored);
  SimulatedDevice big(1ull << 60, 0);
  const Timeline full = execute(stored, s.allocator, big);
  const uint64_t capacity = static_cast<uint64_t>(full.final_stats.reserved_bytes.all.peak) * 7 / 10;
  SimulatedDevice d1(capacity, 0), d2(capacity, 0);
  const Analysis expected = analyze(stored, execute(stored, s.allocator, d1));
  REQUIRE(expected.oom.has_value());
  StreamOptions options;
  options.stop_at_oom = true;
  Program program;
  const StreamResult r = stream_run(
      program, [&](Program& p) { build_megatron_pipeline_program(s, {}, p); }, s.allocator, d2, options);
  CHECK(r.complete);
  REQUIRE(r.analysis.oom.has_value());
  CHECK(r.analysis.oom->index == expected.oom->index);
  CHECK(r.analysis.events == stored.events.size());
  CHECK(r.analysis.flops.forward == expected.flops.forward);
  CHECK(program.rank.why == stored.rank.why);
}
