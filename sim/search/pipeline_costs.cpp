// The pipeline cost model of memsim optimize (sim/search/optimize_pipeline.h, "Cost model").
#include <algorithm>
#include <climits>
#include <exception>
#include <iterator>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <string>

#include "sim/megatron/megatron_step.h"
#include "sim/megatron/pipeline_schedule.h"
#include "sim/search/optimize_pipeline.h"
#include "sim/search/pipeline_stage_sim.h"
#include "sim/search/workers.h"

namespace memsim {

using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

constexpr int64_t kNone = INT64_MIN;

// As sim/search/optimize.cpp: the allocator never hands out less than the request rounded up to
// 512 bytes, so sums of these are a lower bound of allocated (and reserved) bytes.
int64_t rounded(uint64_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int64_t>(bytes < 512 ? 512 : (bytes + 511) / 512 * 512);
}

// What one stage's Program says under a uniform plan: the highest live bytes per
// (a, layer) and per (a, k) between layers, and (measured once) what one micro-batch's
// layers store.
struct StageScan {
  std::vector<int64_t> stored;      // [layer]
  bool stored_measured = false;
  std::vector<int64_t> layer_live;  // [a * L + l]
  std::vector<int64_t> gap_live;    // [a * (L + 1) + k]
  double recompute = 0;
};

StageScan scan_stage(const Program& p, int32_t L, int32_t depth,
                     const std::vector<PipelineAction>& actions, bool holds, int64_t stage) {
  StageScan scan;
  scan.stored.assign(static_cast<size_t>(L), 0);
  scan.layer_live.assign(static_cast<size_t>(depth) * L, kNone);
  scan.gap_live.assign(static_cast<size_t>(depth) * (L + 1), kNone);
  scan.recompute = p.flops.recompute;
  std::vector<int32_t> alloc_layer(p.tensors.size(), -1);
  std::vector<uint8_t> alive(p.tensors.size(), 0);
  int64_t live = 0;
  bool measured = false;
  enum { none, fwd, bwd } mode = none;
  int32_t cur = -1;
  int64_t forwards = 0, backwards = 0;  // passes begun in the measured step
  size_t next_tensor = 0;               // one past the highest tensor id allocated so far
  size_t first_tensor = 0;              // the first forward's first tensor
  bool outside_since_layer = false;     // allocations outside the layers since the last inside
  auto measure_stored = [&] {
    for (size_t t = first_tensor; t < next_tensor; ++t)
      if (alive[t] && alloc_layer[t] >= 0) scan.stored[alloc_layer[t]] += rounded(p.tensors[t].bytes);
    scan.stored_measured = true;
  };
  auto fail = [&](const std::string& what) {
    throw std::logic_error("memsim optimize: pipeline stage " + std::to_string(stage) + ": " + what);
  };
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark) {
      if (p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measured = true;
      continue;
    }
    if (e.type == EventType::empty_cache) continue;
    const bool layered = e.layer >= 0 && e.layer < L &&
                         (e.phase == Phase::forward || e.phase == Phase::backward);
    if (measured && layered) {
      // A forward runs its layers up, a backward down: a step the other way, or a change of
      // direction, begins the next pass.
      // With one layer per chunk the layer index cannot step back: there, a pass begins
      // after allocations outside the layer (the receive, the batch, the send's stand-in;
      // a layer's re-run frees some of its tensors outside it, and what a layer allocates
      // outside itself on first use, the mpu buffer or a cuBLAS workspace, is `other`).
      const bool forward = e.phase == Phase::forward;
      const bool again = L == 1 && outside_since_layer;
      const bool begins = forward ? (mode != fwd || e.layer < cur || again)
                                  : (mode != bwd || e.layer > cur || again);
      if (begins) {
        // What the first micro-batch's layers still hold once its forward is over (taken
        // before this event changes anything).
        if (!scan.stored_measured && mode == fwd && forwards == 1 && backwards == 0) measure_stored();
        if (forward) {
          if (++forwards == 1) first_tensor = next_tensor;
          mode = fwd;
        } else {
          ++backwards;
          mode = bwd;
        }
      }
      cur = e.layer;
      outside_since_layer = false;
    } else if (measured && e.type == EventType::alloc && e.kind != TensorKind::other) {
      outside_since_layer = true;
    }
    if (e.type == EventType::alloc) {
      live += rounded(e.bytes);
      alive[e.tensor] = 1;
      alloc_layer[e.tensor] = (measured && layered && e.phase == Phase::forward) ? e.layer : -1;
      next_tensor = std::max<size_t>(next_tensor, static_cast<size_t>(e.tensor) + 1);
    } else {
      live -= rounded(p.tensors[e.tensor].bytes);
      alive[e.tensor] = 0;
    }
    if (!measured) continue;
    // In-flight passes other than the running one (none are held without a backward).
    int64_t a = mode == fwd ? forwards - 1 - backwards : forwards - backwards;
    if (!holds) a = 0;
    if (a < 0 || a >= depth) fail("more micro-batches in flight than its schedule holds");
    if (layered) {
      int64_t& slot = scan.layer_live[static_cast<size_t>(a) * L + cur];
      slot = std::max(slot, live);
    } else {
      const int32_t k = mode == fwd ? cur + 1 : mode == bwd ? cur : 0;
      int64_t& slot = scan.gap_live[static_cast<size_t>(a) * (L + 1) + k];
      slot = std::max(slot, live);
    }
  }
  if (!scan.stored_measured && forwards >= 1) measure_stored();  // one forward, nothing after
  int64_t want_f = 0, want_b = 0;
  for (const PipelineAction& a : actions) (a.forward ? want_f : want_b) += 1;
  if (forwards != want_f || backwards != want_b)
    fail("found " + std::to_string(forwards) + " forward and " + std::to_string(backwards) +
         " backward passes in its Program, its schedule has " + std::to_string(want_f) + " and " +
         std::to_string(want_b));
  return scan;
}

}  // namespace

PipelineCosts calibrate_pipeline(const Scenario& scenario,
                                 const std::vector<LayerCheckpoint>& choices) {
  check_megatron_supported(scenario);
  const ParallelConfig& pc = scenario.parallel;
  const int64_t v = pc.pipeline_schedule == PipelineSchedule::interleaved ? pc.virtual_stages : 1;
  const int64_t m = std::max<int64_t>(1, scenario.batch.grad_accum);
  const bool holds =
      scenario.step.kind == StepKind::train || scenario.step.kind == StepKind::forward_backward;
  PipelineCosts c;
  c.layers = static_cast<int32_t>(scenario.model.layers / (pc.pipeline * v));
  c.stages = static_cast<int32_t>(pc.pipeline);
  c.choices = choices;
  std::vector<std::vector<PipelineAction>> actions;
  int64_t depth = 1;
  for (int64_t k = 0; k < pc.pipeline; ++k) {
    actions.push_back(pipeline_actions(pc.pipeline_schedule, pc.pipeline, v, m, k, !holds));
    if (holds) depth = std::max(depth, max_in_flight(actions.back()));
  }
  c.depth = static_cast<int32_t>(depth);
  const int32_t L = c.layers;
  const size_t found = static_cast<size_t>(
      std::find(choices.begin(), choices.end(), LayerCheckpoint::keep) - choices.begin());
  const size_t ref = found < choices.size() ? found : 0;  // gaps: from keep (as one GPU)
  c.window.assign(static_cast<size_t>(depth),
                  std::vector<std::vector<int64_t>>(choices.size(), std::vector<int64_t>(L, kNone)));
  c.gap.assign(static_cast<size_t>(depth), std::vector<int64_t>(L + 1, kNone));
  // The choices x stages calibration Programs are independent: scanned on the -j workers
  // (sim/search/workers.h), each with its own StageSimulator; the sums below run in order.
  const size_t P = static_cast<size_t>(pc.pipeline);
  std::vector<StageScan> all(choices.size() * P);
  std::vector<std::unique_ptr<StageSimulator>> sims(worker_count(0, all.size()));
  std::vector<std::exception_ptr> failures(all.size());
  run_parallel_workers(
      all.size(),
      [&](size_t t, unsigned w) {
        try {
          if (!sims[w]) sims[w] = std::make_unique<StageSimulator>(scenario);
          CheckpointPlan one;
          one.layers.assign(static_cast<size_t>(L), choices[t / P]);
          const auto k = static_cast<int64_t>(t % P);
          all[t] = scan_stage(sims[w]->build(one, k), L, c.depth, actions[k], holds, k);
        } catch (...) {
          failures[t] = std::current_exception();
        }
      },
      static_cast<unsigned>(sims.size()));
  for (const std::exception_ptr& f : failures)  // the first in order, as a loop would raise
    if (f) std::rethrow_exception(f);
  for (size_t ci = 0; ci < choices.size(); ++ci) {
    std::vector<StageScan> scans(std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(ci * P)),
                                 std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>((ci + 1) * P)));
    double recompute = 0;
    for (const StageScan& s : scans) recompute += s.recompute;
    c.stored.push_back(scans[0].stored);
    c.flops.push_back(L > 0 ? std::llround(recompute / L) : 0);
    std::vector<int64_t> prefix(L + 1, 0);
    for (int32_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + scans[0].stored[l];
    const int64_t S = prefix[L];
    for (const StageScan& s : scans) {
      for (int64_t a = 0; a < depth; ++a) {
        for (int32_t l = 0; l < L; ++l) {
          const int64_t x = s.layer_live[a * L + l];
          if (x == kNone) continue;
          int64_t& w = c.window[a][ci][l];
          w = std::max(w, x - a * S - prefix[l]);
        }
        if (ci != ref) continue;
        for (int32_t k = 0; k <= L; ++k) {
          const int64_t x = s.gap_live[a * (L + 1) + k];
          if (x == kNone) continue;
          int64_t& g = c.gap[a][k];
          g = std::max(g, x - a * S - prefix[k]);
        }
      }
    }
  }
  return c;
}

int64_t pipeline_model_peak(const PipelineCosts& c, const uint8_t* idx) {
  int64_t S = 0;
  for (int32_t l = 0; l < c.layers; ++l) S += c.stored[idx[l]][l];
  int64_t peak = kNone, prefix = 0;
  for (int32_t l = 0; l <= c.layers; ++l) {
    for (int32_t a = 0; a < c.depth; ++a)
      if (c.gap[a][l] != kNone) peak = std::max(peak, a * S + prefix + c.gap[a][l]);
    if (l == c.layers) break;
    for (int32_t a = 0; a < c.depth; ++a) {
      const int64_t w = c.window[a][idx[l]][l];
      if (w != kNone) peak = std::max(peak, a * S + prefix + w);
    }
    prefix += c.stored[idx[l]][l];
  }
  return peak;
}

int64_t pipeline_model_peak(const PipelineCosts& c, const CheckpointPlan& plan) {
  std::vector<uint8_t> idx(static_cast<size_t>(c.layers));
  for (int32_t l = 0; l < c.layers; ++l) {
    const size_t i = static_cast<size_t>(
        std::find(c.choices.begin(), c.choices.end(), plan.at(l)) - c.choices.begin());
    if (i >= c.choices.size())
      throw std::invalid_argument("pipeline_model_peak: a choice that was not calibrated");
    idx[l] = static_cast<uint8_t>(i);
  }
  return pipeline_model_peak(c, idx.data());
}

}  // namespace memsim
