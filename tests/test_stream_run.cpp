// Streaming execution (issue #20 item 1; sim/analysis/stream_run.h): the analysis computed
// while the Program is built, without per-event arrays, equals analyze(execute(program))
// of the stored Program, field for field, on every shipped scenario (fitting, and squeezed
// onto a smaller device so that it runs out of memory), with the Program handing on events
// one at a time (chunk 1: any builder that read or rewrote events already handed on would
// show here) and in the default chunks. OnlinePeaks equals find_top_peaks on random curves.
#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sim/analysis/analysis.h"
#include "sim/analysis/online_peaks.h"
#include "sim/analysis/peaks.h"
#include "sim/analysis/stream_run.h"
#include "sim/step/execute.h"
#include "sim/step/generate.h"
#include "sim/step/schedule.h"
#include "sim/step/modelled_features.h"
#include "sim/step/training_script.h"
#include "scenario/scenario.h"
#include "test_paths.h"

using namespace memsim;

namespace {

std::vector<CurvePeak> online_top(const std::vector<uint64_t>& v, size_t begin, size_t end,
                                  size_t n, double fraction) {
  OnlinePeaks<> peaks(fraction);
  for (size_t i = begin; i < end; ++i) peaks.push(i, v[i]);
  std::vector<CurvePeak> out;
  for (const auto& p : peaks.top(n)) out.push_back(p.peak);
  return out;
}

void same_peaks(const std::vector<CurvePeak>& a, const std::vector<CurvePeak>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].index == b[i].index);
    CHECK(a[i].value == b[i].value);
    CHECK(a[i].prominence == b[i].prominence);
  }
}

void same_point(const EventPoint& a, const EventPoint& b) {
  CHECK(a.index == b.index);
  CHECK(a.op == b.op);
  CHECK(a.phase == b.phase);
  CHECK(a.layer == b.layer);
  CHECK(a.allocated == b.allocated);
  CHECK(a.reserved == b.reserved);
  CHECK(a.requested == b.requested);
}

void same_breakdown(const Breakdown& a, const Breakdown& b) {
  CHECK(a.parameters == b.parameters);
  CHECK(a.gradients == b.gradients);
  CHECK(a.optimizer_state == b.optimizer_state);
  CHECK(a.activations == b.activations);
  CHECK(a.temporaries == b.temporaries);
  CHECK(a.other == b.other);
}

// Everything the reports print, except (with_totals false) the totals a stopped build
// cannot know: Analysis::events and the FLOPs.
void same_analysis(const Analysis& a, const Analysis& b, bool with_totals = true) {
  if (with_totals) {
    CHECK(a.events == b.events);
    CHECK(a.flops.forward == b.flops.forward);
    CHECK(a.flops.backward == b.flops.backward);
    CHECK(a.flops.recompute == b.flops.recompute);
  }
  CHECK(a.events_executed == b.events_executed);
  CHECK(a.measured_begin == b.measured_begin);
  CHECK(a.peak_allocated == b.peak_allocated);
  CHECK(a.peak_reserved == b.peak_reserved);
  CHECK(a.peak_requested == b.peak_requested);
  REQUIRE(a.peak.has_value() == b.peak.has_value());
  if (a.peak) same_point(*a.peak, *b.peak);
  same_breakdown(a.breakdown_at_peak, b.breakdown_at_peak);
  const LiveSet& la = a.live_at_peak;
  const LiveSet& lb = b.live_at_peak;
  CHECK(la.event_index == lb.event_index);
  CHECK(la.tensors == lb.tensors);
  CHECK(la.bytes == lb.bytes);
  CHECK(la.by_kind == lb.by_kind);
  REQUIRE(la.by_layer.size() == lb.by_layer.size());
  for (size_t i = 0; i < la.by_layer.size(); ++i) {
    CHECK(la.by_layer[i].layer == lb.by_layer[i].layer);
    CHECK(la.by_layer[i].bytes == lb.by_layer[i].bytes);
    CHECK(la.by_layer[i].tensors == lb.by_layer[i].tensors);
  }
  REQUIRE(la.by_op.size() == lb.by_op.size());
  for (size_t i = 0; i < la.by_op.size(); ++i) {
    CHECK(la.by_op[i].name == lb.by_op[i].name);
    CHECK(la.by_op[i].bytes == lb.by_op[i].bytes);
    CHECK(la.by_op[i].tensors == lb.by_op[i].tensors);
  }
  REQUIRE(la.largest.size() == lb.largest.size());
  for (size_t i = 0; i < la.largest.size(); ++i) {
    CHECK(la.largest[i].tensor == lb.largest[i].tensor);
    CHECK(la.largest[i].name == lb.largest[i].name);
    CHECK(la.largest[i].kind == lb.largest[i].kind);
    CHECK(la.largest[i].bytes == lb.largest[i].bytes);
    CHECK(la.largest[i].op == lb.largest[i].op);
    CHECK(la.largest[i].phase == lb.largest[i].phase);
    CHECK(la.largest[i].layer == lb.largest[i].layer);
    CHECK(la.largest[i].alloc_event == lb.largest[i].alloc_event);
  }
  REQUIRE(a.top_peaks.size() == b.top_peaks.size());
  for (size_t i = 0; i < a.top_peaks.size(); ++i) same_point(a.top_peaks[i], b.top_peaks[i]);
  REQUIRE(a.marks.size() == b.marks.size());
  for (size_t i = 0; i < a.marks.size(); ++i) {
    CHECK(a.marks[i].first == b.marks[i].first);
    REQUIRE(a.marks[i].second.has_value() == b.marks[i].second.has_value());
    if (!a.marks[i].second) continue;
    CHECK(a.marks[i].second->name == b.marks[i].second->name);
    CHECK(a.marks[i].second->index == b.marks[i].second->index);
    CHECK(a.marks[i].second->allocated == b.marks[i].second->allocated);
    CHECK(a.marks[i].second->reserved == b.marks[i].second->reserved);
  }
  REQUIRE(a.oom.has_value() == b.oom.has_value());
  if (a.oom) {
    const OomReport& x = *a.oom;
    const OomReport& y = *b.oom;
    CHECK(x.index == y.index);
    CHECK(x.op == y.op);
    CHECK(x.phase == y.phase);
    CHECK(x.layer == y.layer);
    CHECK(x.kind == y.kind);
    // A tensor's name can be given after its allocation (a later op saves it: "saved input
    // of ..."; tools: program/tensor_names.h): a build stopped at the OOM never gets there.
    if (with_totals) CHECK(x.tensor == y.tensor);
    CHECK(x.requested_bytes == y.requested_bytes);
    CHECK(x.allocated_bytes == y.allocated_bytes);
    CHECK(x.reserved_bytes == y.reserved_bytes);
    CHECK(x.capacity_bytes == y.capacity_bytes);
    CHECK(x.free_bytes == y.free_bytes);
    CHECK(x.message == y.message);
    same_breakdown(x.breakdown, y.breakdown);
  }
}

SimulatedDevice device_for(const DeviceConfig& d) {
  if (d.capacity == 0) return SimulatedDevice(uint64_t{1} << 60, d.cuda_context);
  return SimulatedDevice(d.capacity, std::min(d.cuda_context, d.capacity));
}

AnalysisOptions options_for(const Scenario& s) {  // as `memsim run` (tools/cli/run_command.cpp)
  AnalysisOptions o;
  if (s.step.kind == StepKind::generate) o.marks = {"prefill_end", "generate_end"};
  return o;
}

// The Program `memsim run` builds, into `program` (a sink may be attached).
void build_into(const Scenario& s, Program& program, BuildBuffers& buffers) {
  if (s.step.kind == StepKind::generate) {
    require_modelled(s);
    build_generate_program(s, program, nullptr, nullptr);
    return;
  }
  build_program(s, default_script(s), buffers);
}

struct Stored {
  Analysis analysis;
  MemoryStats stats;
  size_t measured_mark = 0;
};

Stored stored_run(const Scenario& s, bool live_set = true) {
  BuildBuffers buffers;
  build_into(s, buffers.program, buffers);
  const Program& p = buffers.program;
  SimulatedDevice device = device_for(s.device);
  const Timeline t = execute(p, s.allocator, device);
  AnalysisOptions options = options_for(s);
  options.live_set = live_set;
  Stored out{analyze(p, t, options), t.final_stats, 0};
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark &&
        p.str(static_cast<uint32_t>(p.events[i].bytes)) == "measured_step_begin") {
      out.measured_mark = i;
      break;
    }
  return out;
}

StreamResult streamed_run(const Scenario& s, size_t chunk, bool stop_at_oom, bool live_set = true,
                          bool verdict_only = false, bool pipelined = false) {
  BuildBuffers buffers;
  SimulatedDevice device = device_for(s.device);
  StreamOptions o;
  o.analysis = options_for(s);
  o.analysis.live_set = live_set;
  o.chunk = chunk;
  o.stop_at_oom = stop_at_oom;
  o.verdict_only = verdict_only;
  o.pipelined = pipelined;
  StreamResult r = stream_run(
      buffers.program, [&](Program& p) { build_into(s, p, buffers); }, s.allocator, device, o);
  // Only a tail of the events was ever stored.
  CHECK(buffers.program.events.size() + buffers.program.flushed() == buffers.program.event_count());
  return r;
}

void same_stats(const MemoryStats& a, const MemoryStats& b) {
  CHECK(a.to_flat_map() == b.to_flat_map());
}

std::vector<std::string> shipped_scenarios() {
  std::vector<std::string> out;
  for (const char* dir : {"/scenarios", "/scenarios/groundtruth"})
    for (const auto& e : std::filesystem::directory_iterator(std::string(MEMSIM_SOURCE_DIR) + dir))
      if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("OnlinePeaks gives find_top_peaks' peaks on random curves", "[stream]") {
  std::mt19937_64 rng(20);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t len = 1 + rng() % 300;
    std::vector<uint64_t> v(len);
    const uint64_t levels = 2 + rng() % 40;  // few levels: plateaus and ties
    uint64_t x = rng() % levels;
    for (auto& y : v) {
      if (rng() % 3 != 0) x = (x + levels + rng() % 7 - 3) % levels;  // a walk, or stay
      y = x * 1000 + (rng() % 4 == 0 ? rng() % 5 : 0);
    }
    const size_t begin = rng() % 3 == 0 ? rng() % len : 0;
    const size_t n = 1 + rng() % 8;
    const double fraction = (rng() % 4) * 0.02;
    const uint64_t top = *std::max_element(v.begin() + static_cast<std::ptrdiff_t>(begin), v.end());
    const auto min_prominence =
        static_cast<uint64_t>(std::floor(static_cast<double>(top) * fraction));
    INFO("trial " << trial);
    same_peaks(online_top(v, begin, len, n, fraction),
               find_top_peaks(v, begin, len, n, min_prominence));
  }
}

// Each peak carries the Extra pushed with its point, also when most stack entries keep none
// (online_peaks.h: only entries whose rise reaches the running threshold keep theirs).
TEST_CASE("OnlinePeaks returns each peak with the Extra pushed at its point", "[stream]") {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t len = 1 + rng() % 400;
    std::vector<uint64_t> v(len);
    uint64_t x = 1000;
    for (auto& y : v) {
      x = rng() % 8 == 0 ? rng() % 100000 : (x + 50000 + rng() % 2001 - 1000) % 100000;
      y = x;
    }
    const size_t n = 1 + rng() % 8;
    const double fraction = (rng() % 5) * 0.05;
    OnlinePeaks<uint64_t> peaks(fraction);
    for (size_t i = 0; i < len; ++i) peaks.push(i, v[i], i * 3 + 1);
    const auto got = peaks.top(n);
    const auto want = find_top_peaks(
        v, 0, len, n,
        static_cast<uint64_t>(std::floor(static_cast<double>(*std::max_element(v.begin(), v.end())) * fraction)));
    INFO("trial " << trial);
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      CHECK(got[k].peak.index == want[k].index);
      CHECK(got[k].peak.prominence == want[k].prominence);
      CHECK(got[k].extra == want[k].index * 3 + 1);
    }
  }
}

TEST_CASE("OnlinePeaks: flat, rising and falling curves", "[stream]") {
  for (const std::vector<uint64_t>& v :
       {std::vector<uint64_t>{5, 5, 5, 5}, {1, 2, 3, 4, 5}, {5, 4, 3, 2, 1}, {3},
        {1, 9, 1, 9, 1}, {9, 1, 9}, {1, 5, 2, 5, 1, 7, 0, 7}}) {
    for (double fraction : {0.0, 0.01, 0.5}) {
      const uint64_t top = *std::max_element(v.begin(), v.end());
      same_peaks(online_top(v, 0, v.size(), 5, fraction),
                 find_top_peaks(v, 0, v.size(), 5,
                                static_cast<uint64_t>(std::floor(static_cast<double>(top) * fraction))));
    }
  }
}

TEST_CASE("a streamed run equals the stored run on every shipped scenario", "[stream]") {
  for (const std::string& path : shipped_scenarios()) {
    INFO(path);
    Scenario s;
    try {
      s = load_scenario(path);
      stored_run(s);
    } catch (const ScenarioError&) {
      // Refused: the streamed build refuses it the same way.
      CHECK_THROWS_AS(streamed_run(s, 1, false), ScenarioError);
      continue;
    }
    const Stored ref = stored_run(s);
    for (size_t chunk : {size_t{1}, size_t{4096}}) {
      INFO("chunk " << chunk);
      const StreamResult r = streamed_run(s, chunk, false);
      CHECK(r.complete);
      same_analysis(r.analysis, ref.analysis);
      same_stats(r.final_stats, ref.stats);
      CHECK(r.measured_mark.value_or(0) == ref.measured_mark);
    }
    // Pipelined (the allocator on a second thread, chunks copied): chunks of 64 make the
    // builder wait for the consumer often.
    for (size_t chunk : {size_t{64}, size_t{4096}}) {
      INFO("pipelined, chunk " << chunk);
      const StreamResult r = streamed_run(s, chunk, false, true, false, /*pipelined=*/true);
      CHECK(r.complete);
      same_analysis(r.analysis, ref.analysis);
      same_stats(r.final_stats, ref.stats);
      CHECK(r.measured_mark.value_or(0) == ref.measured_mark);
    }
  }
}

TEST_CASE("a streamed run that runs out of memory equals the stored run, and can stop there",
          "[stream]") {
  int stopped_early = 0;
  for (const std::string& path : shipped_scenarios()) {
    INFO(path);
    Scenario s;
    Stored fit;
    try {
      s = load_scenario(path);
      s.device.capacity = 0;  // unlimited: the peak it needs
      fit = stored_run(s);
    } catch (const ScenarioError&) {
      continue;
    }
    // Out of memory in the setup, in the middle of the run and near its peak.
    for (double f : {0.3, 0.7, 0.97}) {
      INFO("capacity fraction " << f);
      s.device.capacity = s.device.cuda_context +
                          static_cast<uint64_t>(static_cast<double>(fit.analysis.peak_reserved) * f);
      const Stored ref = stored_run(s);
      const StreamResult r = streamed_run(s, 1, false);
      same_analysis(r.analysis, ref.analysis);
      same_stats(r.final_stats, ref.stats);
      CHECK(r.measured_mark.value_or(0) == ref.measured_mark);
      if (!ref.analysis.oom) continue;
      // stop_at_oom: the same moment and state, fewer events built (unless the OOM was
      // among the last events, or the Program was handed on whole: a pipeline's stage).
      const StreamResult stopped = streamed_run(s, 1, true);
      same_analysis(stopped.analysis, ref.analysis, /*with_totals=*/false);
      same_stats(stopped.final_stats, ref.stats);
      CHECK(stopped.analysis.events >= ref.analysis.oom->index + 1);
      if (stopped.complete) {
        CHECK(stopped.analysis.events == ref.analysis.events);
      } else {
        CHECK(stopped.analysis.events < ref.analysis.events);
        ++stopped_early;
      }
      // Pipelined (tools/cli/plain_run.h's runs), whole and stopped: the same, the stopped
      // build up to two chunks further.
      const StreamResult piped = streamed_run(s, 64, false, true, false, true);
      same_analysis(piped.analysis, ref.analysis);
      same_stats(piped.final_stats, ref.stats);
      CHECK(piped.measured_mark.value_or(0) == ref.measured_mark);
      const StreamResult piped_stop = streamed_run(s, 64, true, true, false, true);
      same_analysis(piped_stop.analysis, ref.analysis, /*with_totals=*/false);
      same_stats(piped_stop.final_stats, ref.stats);
      CHECK(piped_stop.analysis.events >= ref.analysis.oom->index + 1);
      CHECK(piped_stop.analysis.events <= ref.analysis.events);
    }
  }
  // Most squeezed runs fail early in their Program: the build stopped there.
  CHECK(stopped_early >= 40);
}

TEST_CASE("without a live set (AnalysisOptions::live_set false) only live_at_peak is left out",
          "[stream]") {
  // What a sweep without --json and sweep --max ask for: everything else, the breakdown at
  // the peak included, is the full analysis', stored (whose breakdown comes from the live
  // set when no per-kind arrays are kept) and streamed (which then keeps no lifetimes).
  int checked = 0;
  for (const std::string& path : shipped_scenarios()) {
    INFO(path);
    Scenario s;
    Stored fit;
    try {
      s = load_scenario(path);
      fit = stored_run(s);
    } catch (const ScenarioError&) {
      continue;
    }
    for (double f : {0.0, 0.7}) {  // as shipped, and out of memory mid-run
      INFO("capacity fraction " << f);
      if (f > 0)
        s.device.capacity = s.device.cuda_context +
                            static_cast<uint64_t>(static_cast<double>(fit.analysis.peak_reserved) * f);
      Analysis expected = stored_run(s).analysis;
      expected.live_at_peak = LiveSet{};
      const Stored stored = stored_run(s, /*live_set=*/false);
      same_analysis(stored.analysis, expected);
      same_analysis(streamed_run(s, 4096, false, /*live_set=*/false).analysis, expected);
      const StreamResult stopped = streamed_run(s, 4096, true, /*live_set=*/false);
      same_analysis(stopped.analysis, expected, /*with_totals=*/false);
      ++checked;
    }
  }
  CHECK(checked >= 80);
}

TEST_CASE("a verdict-only run (sweep --max's probes) has the stored run's verdict, OOM report "
          "and final stats", "[stream]") {
  // StreamOptions::verdict_only observes nothing per event: fits(), the OOM report (moment,
  // op, sizes, message, breakdown before it) and memory_stats() must still be the stored
  // run's; the peak points, top peaks and marks are left empty.
  int fitting = 0, oom = 0;
  for (const std::string& path : shipped_scenarios()) {
    INFO(path);
    Scenario s;
    Stored fit;
    try {
      s = load_scenario(path);
      s.device.capacity = 0;
      fit = stored_run(s);
    } catch (const ScenarioError&) {
      continue;
    }
    for (double f : {0.0, 0.3, 0.7, 0.97}) {  // unlimited, then out of memory early to late
      INFO("capacity fraction " << f);
      if (f > 0)
        s.device.capacity = s.device.cuda_context +
                            static_cast<uint64_t>(static_cast<double>(fit.analysis.peak_reserved) * f);
      const Stored ref = stored_run(s, /*live_set=*/false);
      for (bool stop : {false, true}) {
        const StreamResult r = streamed_run(s, 4096, stop, /*live_set=*/false, /*verdict_only=*/true);
        Analysis expected = ref.analysis;  // what a verdict-only run keeps of it
        expected.peak.reset();
        expected.breakdown_at_peak = Breakdown{};
        expected.top_peaks.clear();
        for (auto& m : expected.marks) m.second.reset();
        expected.measured_begin = 0;
        const auto peak_of = [](const Stat& st) { return st.peak > 0 ? static_cast<uint64_t>(st.peak) : 0; };
        expected.peak_allocated = peak_of(ref.stats.allocated_bytes.all);
        expected.peak_reserved = peak_of(ref.stats.reserved_bytes.all);
        expected.peak_requested = peak_of(ref.stats.requested_bytes.all);
        same_analysis(r.analysis, expected, /*with_totals=*/!stop);
        CHECK_FALSE(r.analysis.peak.has_value());
        same_stats(r.final_stats, ref.stats);
        (ref.analysis.fits() ? fitting : oom) += 1;
      }
    }
  }
  CHECK(fitting >= 80);
  CHECK(oom >= 80);
}
