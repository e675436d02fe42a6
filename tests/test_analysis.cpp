// Analysis: peaks, distinct top peaks, live sets, breakdowns, marks and OOM reports, on
// hand-built Programs. Most cases use a hand-made Timeline (an idealised allocator that
// neither rounds nor frees cache) so the expected numbers are plain sums; the last cases
// run through the real allocator emulator.
#include <catch2/catch.hpp>

#include "allocator/units.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/live_set.h"
#include "sim/analysis/peaks.h"
#include "sim/step/execute.h"

using namespace memsim;

namespace {

// Allocated = sum of live requested bytes; reserved = its running maximum (a cache that
// never gives memory back); requested = allocated. By kind likewise.
Timeline ideal_timeline(const Program& p) {
  Timeline t;
  std::array<uint64_t, kTensorKindCount> by_kind{};
  uint64_t allocated = 0, reserved = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) {
      allocated += e.bytes;
      by_kind[static_cast<size_t>(e.kind)] += e.bytes;
    } else if (e.type == EventType::free) {
      allocated -= e.bytes;
      by_kind[static_cast<size_t>(e.kind)] -= e.bytes;
    }
    reserved = std::max(reserved, allocated);
    t.allocated.push_back(allocated);
    t.reserved.push_back(reserved);
    t.requested.push_back(allocated);
    t.by_kind.push_back(by_kind);
  }
  return t;
}

// A two-layer "training step": parameters, a warm-up step whose peak (activations of a
// long sequence) is higher than the measured step's, then the measured step with marks.
struct Step {
  Program p;
  size_t measured_begin = 0, peak_index = 0, forward_end = 0, backward_end = 0,
         optimizer_end = 0;
};

Step two_layer_step() {
  Step s;
  Program& p = s.p;
  const uint32_t init = p.intern("init"), linear = p.intern("linear"), relu = p.intern("relu"),
                 mm_bw = p.intern("linear_backward"), adam = p.intern("adamw");
  uint32_t w0 = p.alloc(1000, TensorKind::parameter, Phase::setup, init, 0, p.intern("layers.0.w"));
  uint32_t w1 = p.alloc(1000, TensorKind::parameter, Phase::setup, init, 1, p.intern("layers.1.w"));
  (void)w0;
  (void)w1;
  // Warm-up: a big transient the measured part must not report.
  uint32_t big = p.alloc(50000, TensorKind::activation, Phase::forward, linear, 0, p.intern("warmup.act"));
  p.free(big, Phase::forward, linear, 0);

  s.measured_begin = p.events.size();
  p.mark("measured_step_begin", Phase::other);
  uint32_t x = p.alloc(100, TensorKind::input, Phase::forward, p.intern("batch"), -1, p.intern("x"));
  uint32_t a0 = p.alloc(2000, TensorKind::activation, Phase::forward, linear, 0, p.intern("layers.0.out"));
  uint32_t t0 = p.alloc(300, TensorKind::temporary, Phase::forward, relu, 0, p.intern("layers.0.tmp"));
  p.free(t0, Phase::forward, relu, 0);
  uint32_t a1 = p.alloc(2000, TensorKind::activation, Phase::forward, linear, 1, p.intern("layers.1.out"));
  uint32_t loss = p.alloc(4, TensorKind::loss, Phase::loss, p.intern("cross_entropy"), -1, p.intern("loss"));
  s.forward_end = p.events.size();
  p.mark("forward_end", Phase::loss);
  // Backward, layer 1 then 0: gradient allocated while the activation is still live.
  uint32_t g1 = p.alloc(1000, TensorKind::gradient, Phase::backward, mm_bw, 1, p.intern("layers.1.w.grad"));
  s.peak_index = p.events.size() - 1;  // 2000 params + 100 + 2000 + 2000 + 4 + 1000 = 7104
  p.free(a1, Phase::backward, mm_bw, 1);
  p.free(loss, Phase::backward, mm_bw, -1);
  uint32_t g0 = p.alloc(1000, TensorKind::gradient, Phase::backward, mm_bw, 0, p.intern("layers.0.w.grad"));
  p.free(a0, Phase::backward, mm_bw, 0);
  p.free(x, Phase::backward, mm_bw, -1);
  s.backward_end = p.events.size();
  p.mark("backward_end", Phase::backward);
  uint32_t m0 = p.alloc(2000, TensorKind::optimizer_state, Phase::optimizer, adam, -1, p.intern("adam.state"));
  (void)m0;
  p.free(g0, Phase::optimizer, adam, 0);
  p.free(g1, Phase::optimizer, adam, 1);
  s.optimizer_end = p.events.size();
  p.mark("optimizer_end", Phase::optimizer);
  p.flops = Flops{1e9, 2e9, 0};
  return s;
}

}  // namespace

TEST_CASE("find_top_peaks reports distinct hills, not plateau neighbours", "[analysis]") {
  const std::vector<uint64_t> v = {0, 5, 5, 5, 2, 8, 8, 3, 7, 1};
  auto peaks = find_top_peaks(v, 0, v.size(), 10, 1);
  REQUIRE(peaks.size() == 3);
  CHECK(peaks[0].index == 5);  // the first event of the 8-plateau
  CHECK(peaks[0].value == 8);
  CHECK(peaks[1].index == 8);
  CHECK(peaks[1].value == 7);
  CHECK(peaks[1].prominence == 4);  // 7 - 3
  CHECK(peaks[2].index == 1);
  CHECK(peaks[2].prominence == 3);  // 5 - 2

  SECTION("n limits the answer to the highest") {
    auto two = find_top_peaks(v, 0, v.size(), 2, 1);
    REQUIRE(two.size() == 2);
    CHECK(two[0].index == 5);
    CHECK(two[1].index == 8);
  }
  SECTION("a sub-range is analysed on its own") {
    auto sub = find_top_peaks(v, 6, v.size(), 10, 1);
    REQUIRE(sub.size() == 2);
    CHECK(sub[0].index == 6);  // the range starts on the plateau's second event
    CHECK(sub[1].index == 8);
  }
}

TEST_CASE("find_top_peaks drops zig-zags below the prominence threshold", "[analysis]") {
  // A temporary allocated and freed three times while memory sits near its top.
  const std::vector<uint64_t> v = {0, 100, 99, 100, 99, 100, 0, 60, 0};
  auto coarse = find_top_peaks(v, 0, v.size(), 10, 5);
  REQUIRE(coarse.size() == 2);
  CHECK(coarse[0].index == 1);
  CHECK(coarse[1].index == 7);
  auto fine = find_top_peaks(v, 0, v.size(), 10, 1);
  CHECK(fine.size() == 4);
}

namespace {

// The definition of sim/analysis/peaks.h, computed the slow way: for each event, walk out to the
// nearest higher ground on each side (an equal value counts on the left only).
std::vector<CurvePeak> brute_force_peaks(const std::vector<uint64_t>& v, uint64_t min_prominence) {
  std::vector<CurvePeak> out;
  if (v.empty()) return out;
  size_t top = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] > v[top]) top = i;
  const uint64_t range_min = *std::min_element(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t left = v[i], right = v[i];
    for (size_t j = i; j-- > 0 && v[j] < v[i];) left = std::min(left, v[j]);
    for (size_t j = i + 1; j < v.size() && v[j] <= v[i]; ++j) right = std::min(right, v[j]);
    const uint64_t base = i == top ? range_min : std::max(left, right);
    const uint64_t prominence = v[i] - base;
    if (i == top || (prominence > 0 && prominence >= min_prominence)) {
      out.push_back(CurvePeak{i, v[i], prominence});
    }
  }
  std::sort(out.begin(), out.end(), [](const CurvePeak& a, const CurvePeak& b) {
    return a.value != b.value ? a.value > b.value : a.index < b.index;
  });
  return out;
}

}  // namespace

TEST_CASE("find_top_peaks matches the definition on random curves", "[analysis]") {
  uint64_t state = 12345;
  auto next = [&] {  // xorshift: deterministic, no <random> distribution differences
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int round = 0; round < 300; ++round) {
    const size_t n = 1 + next() % 60;
    const uint64_t levels = 1 + next() % 8;  // few levels: plenty of plateaus and ties
    std::vector<uint64_t> v(n);
    for (auto& x : v) x = next() % levels;
    const uint64_t min_prominence = 1 + next() % 3;
    const auto expected = brute_force_peaks(v, min_prominence);
    const auto got = find_top_peaks(v, 0, n, n, min_prominence);
    INFO("round " << round);
    REQUIRE(got.size() == expected.size());
    for (size_t k = 0; k < got.size(); ++k) {
      CHECK(got[k].index == expected[k].index);
      CHECK(got[k].prominence == expected[k].prominence);
    }
  }
}

TEST_CASE("find_top_peaks edge cases", "[analysis]") {
  const std::vector<uint64_t> rising = {1, 2, 3};
  auto r = find_top_peaks(rising, 0, 3, 5, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].index == 2);
  const std::vector<uint64_t> flat = {7, 7, 7};
  auto f = find_top_peaks(flat, 0, 3, 5, 1);
  REQUIRE(f.size() == 1);  // a flat curve still has its top, at the first event
  CHECK(f[0].index == 0);
  CHECK(find_top_peaks(flat, 2, 2, 5, 1).empty());
  CHECK(find_top_peaks(flat, 0, 99, 0, 1).empty());
  CHECK(find_top_peaks({}, 0, 10, 5, 1).empty());
}

TEST_CASE("analyze finds the measured peak and what is live there", "[analysis]") {
  Step s = two_layer_step();
  Timeline t = ideal_timeline(s.p);
  Analysis a = analyze(s.p, t);

  CHECK(a.measured_begin == s.measured_begin);
  CHECK(a.events == s.p.events.size());
  CHECK(a.events_executed == s.p.events.size());
  // The warm-up's 52,000 bytes are before the measured mark: not the peak.
  CHECK(a.peak_allocated == 7104);
  CHECK(a.peak_requested == 7104);
  CHECK(a.peak_reserved == 52000);  // the ideal cache keeps the warm-up's reservation
  REQUIRE(a.peak);
  CHECK(a.peak->index == s.peak_index);
  CHECK(a.peak->op == "linear_backward");
  CHECK(a.peak->phase == Phase::backward);
  CHECK(a.peak->layer == 1);
  CHECK(a.peak->allocated == 7104);

  const Breakdown& b = a.breakdown_at_peak;
  CHECK(b.parameters == 2000);
  CHECK(b.gradients == 1000);
  CHECK(b.optimizer_state == 0);
  CHECK(b.activations == 4000);
  CHECK(b.temporaries == 0);
  CHECK(b.other == 104);  // input 100 + loss 4
  CHECK(b.total() == a.peak_allocated);

  const LiveSet& live = a.live_at_peak;
  CHECK(live.event_index == s.peak_index);
  CHECK(live.tensors == 7);
  CHECK(live.bytes == 7104);
  CHECK(live.by_kind[static_cast<size_t>(TensorKind::input)] == 100);
  CHECK(live.by_kind[static_cast<size_t>(TensorKind::loss)] == 4);
  REQUIRE(live.by_layer.size() == 3);
  CHECK(live.by_layer[0].layer == -1);
  CHECK(live.by_layer[0].bytes == 104);
  CHECK(live.by_layer[1].layer == 0);
  CHECK(live.by_layer[1].bytes == 3000);
  CHECK(live.by_layer[2].layer == 1);
  CHECK(live.by_layer[2].bytes == 4000);
  REQUIRE(!live.by_op.empty());
  REQUIRE(live.by_op.size() >= 2);
  CHECK(live.by_op[0].name == "linear");
  CHECK(live.by_op[0].bytes == 4000);
  CHECK(live.by_op[0].tensors == 2);
  CHECK(live.by_op[1].name == "init");
  CHECK(live.by_op[1].bytes == 2000);
  // Largest first; equal sizes in allocation order.
  REQUIRE(live.largest.size() == 7);
  CHECK(live.largest[0].name == "layers.0.out");
  CHECK(live.largest[0].kind == TensorKind::activation);
  CHECK(live.largest[0].op == "linear");
  CHECK(live.largest[0].layer == 0);
  CHECK(live.largest[1].name == "layers.1.out");
  CHECK(live.largest[2].name == "layers.0.w");
  CHECK(live.largest[3].name == "layers.1.w");
  CHECK(live.largest[4].name == "layers.1.w.grad");
  CHECK(live.largest[4].kind == TensorKind::gradient);
  CHECK(live.largest[4].op == "linear_backward");
  CHECK(live.largest[4].phase == Phase::backward);
  CHECK(live.largest[4].layer == 1);
  CHECK(live.largest[4].alloc_event == s.peak_index);
  CHECK(live.largest[6].name == "loss");

  CHECK(a.flops.forward == 1e9);
  CHECK(a.flops.backward == 2e9);
  CHECK(a.fits());
  CHECK_FALSE(a.oom);
}

TEST_CASE("analyze reports the marks after forward, backward and the optimizer", "[analysis]") {
  Step s = two_layer_step();
  Timeline t = ideal_timeline(s.p);
  Analysis a = analyze(s.p, t);
  REQUIRE(a.marks.size() == 3);
  CHECK(a.marks[0].first == "forward_end");
  REQUIRE(a.marks[0].second);
  CHECK(a.marks[0].second->index == s.forward_end);
  CHECK(a.marks[0].second->allocated == 6104);
  CHECK(a.marks[0].second->reserved == 52000);
  CHECK(a.marks[1].first == "backward_end");
  REQUIRE(a.marks[1].second);
  CHECK(a.marks[1].second->allocated == 4000);  // params + both gradients
  CHECK(a.marks[2].first == "optimizer_end");
  REQUIRE(a.marks[2].second);
  CHECK(a.marks[2].second->allocated == 4000);  // params + optimizer state

  SECTION("a mark that never happened is absent, not zero") {
    AnalysisOptions o;
    o.marks = {"forward_end", "no_such_mark"};
    Analysis b = analyze(s.p, t, o);
    REQUIRE(b.marks.size() == 2);
    CHECK(b.marks[0].second);
    CHECK_FALSE(b.marks[1].second);
  }
}

TEST_CASE("analyze without a measured mark uses the whole program", "[analysis]") {
  Step s = two_layer_step();
  Timeline t = ideal_timeline(s.p);
  AnalysisOptions o;
  o.measured_from_mark = "not_there";
  Analysis a = analyze(s.p, t, o);
  CHECK(a.measured_begin == 0);
  CHECK(a.peak_allocated == 52000);
  REQUIRE(a.peak);
  CHECK(a.peak->index == 2);
  CHECK(a.peak->op == "linear");
}

TEST_CASE("top peaks are distinct local maxima of the measured part", "[analysis]") {
  Program p;
  const uint32_t op = p.intern("op");
  p.mark("measured_step_begin", Phase::other);
  // Three hills (600, 900, 300) with a plateau and a tiny zig-zag on the highest.
  uint32_t a = p.alloc(600, TensorKind::activation, Phase::forward, op, 0, 0);
  p.free(a, Phase::forward, op, 0);
  uint32_t b = p.alloc(800, TensorKind::activation, Phase::forward, op, 1, 0);
  p.mark("flat", Phase::forward);  // same allocated as the event before: a plateau
  uint32_t c = p.alloc(100, TensorKind::temporary, Phase::forward, op, 1, 0);  // 900
  p.free(c, Phase::forward, op, 1);                                             // 800
  uint32_t d = p.alloc(99, TensorKind::temporary, Phase::forward, op, 1, 0);   // 899
  p.free(d, Phase::forward, op, 1);
  p.free(b, Phase::forward, op, 1);
  uint32_t e = p.alloc(300, TensorKind::activation, Phase::backward, op, 2, 0);
  p.free(e, Phase::backward, op, 2);
  Timeline t = ideal_timeline(p);

  AnalysisOptions o;
  o.top_peaks = 5;
  o.min_peak_prominence = 0.01;  // 9 bytes: the 899 zig-zag (prominence 99) stays
  Analysis an = analyze(p, t, o);
  REQUIRE(an.top_peaks.size() == 4);
  CHECK(an.top_peaks[0].allocated == 900);
  CHECK(an.top_peaks[0].index == 5);
  CHECK(an.top_peaks[1].allocated == 899);
  CHECK(an.top_peaks[2].allocated == 600);
  CHECK(an.top_peaks[2].layer == 0);
  CHECK(an.top_peaks[3].allocated == 300);
  CHECK(an.top_peaks[3].phase == Phase::backward);

  o.min_peak_prominence = 0.4;  // 360 bytes: the zig-zag goes, and the 300 hill
  Analysis coarse = analyze(p, t, o);
  REQUIRE(coarse.top_peaks.size() == 2);
  CHECK(coarse.top_peaks[0].allocated == 900);
  CHECK(coarse.top_peaks[1].allocated == 600);
}

TEST_CASE("live_set_at walks the program to any event", "[analysis]") {
  Step s = two_layer_step();
  LiveSet before = live_set_at(s.p, 1);
  CHECK(before.tensors == 2);
  CHECK(before.by_kind[static_cast<size_t>(TensorKind::parameter)] == 2000);
  LiveSet end = live_set_at(s.p, SIZE_MAX, 2);
  CHECK(end.event_index == s.p.events.size() - 1);
  CHECK(end.tensors == 3);  // two parameters and the optimizer state
  REQUIRE(end.largest.size() == 2);
  CHECK(end.largest[0].kind == TensorKind::optimizer_state);
  CHECK(live_set_at(Program{}, 5).tensors == 0);
}

TEST_CASE("analyze an empty timeline", "[analysis]") {
  Step s = two_layer_step();
  Timeline t;  // e.g. OOM at the first event
  Analysis a = analyze(s.p, t);
  CHECK(a.peak_allocated == 0);
  CHECK_FALSE(a.peak);
  CHECK(a.top_peaks.empty());
  REQUIRE(a.marks.size() == 3);
  CHECK_FALSE(a.marks[0].second);
}

TEST_CASE("analyze reports an OOM from the timeline", "[analysis]") {
  Step s = two_layer_step();
  Timeline t = ideal_timeline(s.p);
  // Pretend the allocator failed at the first gradient.
  const size_t fail_at = s.peak_index;
  t.allocated.resize(fail_at);
  t.reserved.resize(fail_at);
  t.requested.resize(fail_at);
  t.by_kind.resize(fail_at);
  OomPoint oom;
  oom.event_index = fail_at;
  oom.details.requested_bytes = 1000;
  oom.details.allocated_bytes = 6104;
  oom.details.reserved_bytes = 52000;
  oom.details.device_total = 53000;
  oom.details.message = "CUDA out of memory. Tried to allocate 2.00 MiB.";
  t.oom = oom;

  Analysis a = analyze(s.p, t);
  CHECK_FALSE(a.fits());
  REQUIRE(a.oom);
  CHECK(a.oom->index == fail_at);
  CHECK(a.oom->op == "linear_backward");
  CHECK(a.oom->phase == Phase::backward);
  CHECK(a.oom->layer == 1);
  CHECK(a.oom->kind == TensorKind::gradient);
  CHECK(a.oom->tensor == "layers.1.w.grad");
  CHECK(a.oom->requested_bytes == 1000);
  CHECK(a.oom->allocated_bytes == 6104);
  CHECK(a.oom->reserved_bytes == 52000);
  CHECK(a.oom->capacity_bytes == 53000);
  CHECK(a.oom->message == oom.details.message);
  CHECK(a.oom->breakdown.activations == 4000);  // the state just before the failing alloc
  CHECK(a.oom->breakdown.total() == 6104);
  CHECK(a.events_executed == fail_at);
  CHECK(a.peak_allocated == 6104);  // the peak of what did run
  REQUIRE(a.marks[0].second);      // forward_end ran
  CHECK_FALSE(a.marks[1].second);  // backward_end did not
}

// ---- Through the real allocator emulator --------------------------------------------

TEST_CASE("analyze a Program executed through the caching allocator", "[analysis]") {
  Step s = two_layer_step();
  SimulatedDevice device(80 * GiB, 0);
  Timeline t = execute(s.p, AllocatorConfig{}, device);
  REQUIRE_FALSE(t.oom);
  Analysis a = analyze(s.p, t);

  // Every request here is small: 512-byte rounding, so allocated >= requested.
  REQUIRE(a.peak);
  CHECK(a.peak->index == s.peak_index);
  CHECK(a.peak_requested == 7104);
  CHECK(a.peak_allocated >= a.peak_requested);
  CHECK(a.peak_allocated == t.allocated[s.peak_index]);
  // execute() reset the allocator's peaks at measured_step_begin: the final stats agree
  // with the measured maxima, and the warm-up's 50 KB block is not the peak.
  CHECK(static_cast<uint64_t>(t.final_stats.allocated_bytes.all.peak) == a.peak_allocated);
  CHECK(a.peak_allocated < 50000);
  // The breakdown uses the allocator's rounded sizes, so it sums to allocated.
  CHECK(a.breakdown_at_peak.total() == a.peak_allocated);
  CHECK(a.breakdown_at_peak.parameters == 2 * 1024);  // 1000 B rounds to 1024
  CHECK(a.live_at_peak.bytes == 7104);                // the live set keeps requested sizes
  // Small blocks come from 2 MiB segments; the warm-up's segment stays cached.
  CHECK(a.peak_reserved % (2 * MiB) == 0);
  REQUIRE(a.marks[1].second);
  CHECK(a.marks[1].second->reserved >= a.marks[1].second->allocated);
}

TEST_CASE("analyze an out-of-memory from a small simulated device", "[analysis]") {
  Program p;
  const uint32_t op = p.intern("matmul");
  p.alloc(30 * MiB, TensorKind::parameter, Phase::setup, p.intern("init"), -1, p.intern("w"));
  p.mark("measured_step_begin", Phase::other);
  p.alloc(20 * MiB, TensorKind::activation, Phase::forward, op, 0, p.intern("h0"));
  p.alloc(40 * MiB, TensorKind::activation, Phase::forward, op, 1, p.intern("h1"));
  p.mark("forward_end", Phase::forward);

  SimulatedDevice device(64 * MiB, 0);
  Timeline t = execute(p, AllocatorConfig{}, device);
  REQUIRE(t.oom);
  Analysis a = analyze(p, t);
  CHECK_FALSE(a.fits());
  REQUIRE(a.oom);
  CHECK(a.oom->index == 3);
  CHECK(a.oom->op == "matmul");
  CHECK(a.oom->phase == Phase::forward);
  CHECK(a.oom->layer == 1);
  CHECK(a.oom->tensor == "h1");
  CHECK(a.oom->requested_bytes == 40 * MiB);
  CHECK(a.oom->allocated_bytes == 50 * MiB);
  CHECK(a.oom->capacity_bytes == 64 * MiB);
  CHECK(a.oom->message.find("CUDA out of memory. Tried to allocate 40.00 MiB") == 0);
  CHECK(a.oom->breakdown.parameters == 30 * MiB);
  CHECK(a.oom->breakdown.activations == 20 * MiB);
  CHECK(a.events_executed == 3);
  CHECK(a.peak_allocated == 50 * MiB);
  REQUIRE(a.peak);
  CHECK(a.peak->index == 2);
  CHECK_FALSE(a.marks[0].second);  // forward never ended
}
