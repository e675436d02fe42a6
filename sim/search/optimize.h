// memsim optimize: the checkpointing plan with the least recomputation whose simulated
// peak reserved memory fits a budget.
//
// Pipeline-parallel megatron scenarios: sim/search/optimize_pipeline.h (one plan for every
// stage's local layers, the budget held on every stage).
//
// Method (a chain of layers, in the manner of Rotor / Revolve, but over the plans
// torch.utils.checkpoint can express: one choice per layer among keep, selective, the
// attention half, the MLP half, both halves, the whole layer):
//  1. Calibrate: one Program per choice with every layer making that choice. From each
//     (requested bytes rounded to the allocator's 512-byte blocks, measured step only):
//       stored_l(c)  bytes layer l's forward leaves alive at forward_end,
//       window_l(c)  the highest live bytes in layer l's forward or backward (the
//                    backward includes its recomputation), minus the stored bytes of
//                    layers 0..l-1 under c,
//       gap_k        the highest live bytes between layers (embedding, head, loss,
//                    optimizer) while layers 0..k-1 hold their stored bytes, minus those,
//       flops(c)     recompute FLOPs per layer.
//     Layers interact only through what earlier layers store (the backward runs layer
//     by layer, last first), so for any plan the live bytes at a moment of layer l are
//     window_l(c_l) + sum_{j<l} stored_j(c_j): the model is exact for requested bytes.
//  2. Search: dynamic programming over layers 0..L-1 with states (stored prefix bytes,
//     recompute FLOPs), keeping only the Pareto front (less stored and less recompute
//     dominates: every later constraint is monotone in the stored prefix). It returns the
//     least-recompute plan whose modelled peak is <= a bound (ties: the lower peak).
//  3. Verify: simulate that plan through the allocator emulator on a device whose
//     allocator may use exactly the budget. The modelled peak is a lower bound of the
//     reserved peak, so a plan over the budget in the model never fits. If the plan does
//     not fit (fragmentation, rounding), tighten the bound below its modelled peak and
//     search again: the first `exact_steps` retries walk the (peak, recompute) front one
//     plan at a time (exact), later ones jump by the observed overshoot.
//  4. Named policies (sim/search/named_policies.h): the model cannot see fragmentation, so
//     the policies `compare` names that fall in the plan space are simulated too, where
//     they could beat step 3's answer: per-layer ones whose modelled peak is within the
//     budget and whose modelled recompute is below the answer's, segment ones (uniform:K,
//     sqrt: they recompute at least what full does) when the answer recomputes at least
//     as much as full. A named policy that fits with less recompute replaces the answer.
//  5. Nothing fits: the plan with the smallest modelled peak and the uniform named
//     policies are simulated without a limit; the smallest reserved peak is reported.
//  Small models (at most exact_max_layers layers, few distinct recompute totals) first
//  get an exact phase instead of the front walk: every plan the model admits, recompute
//  level by level (ascending), each level by modelled peak, is simulated until one fits.
//  Allocator effects (a plan with a higher requested peak but a lower reserved one) then
//  cannot hide the optimum.
//  Every plan is built with the scenario's checkpoint.reentrant. One call reuses its
//  build and execution storage from plan to plan (BuildBuffers, ExecuteBuffers) and
//  analyses only the runs it reports.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "allocator/memory_stats.h"
#include "graph/checkpoint.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/training_script.h"

namespace memsim {

struct OptimizeOptions {
  std::vector<graph::LayerCheckpoint> choices = {
      graph::LayerCheckpoint::keep,      graph::LayerCheckpoint::core_attention,
      graph::LayerCheckpoint::attention, graph::LayerCheckpoint::mlp,
      graph::LayerCheckpoint::modules,   graph::LayerCheckpoint::layer};
  int exact_steps = 6;         // verifications that step to the next plan of the front
  int max_verifications = 24;  // then give up and report the smallest peak
  // The exact phase (see the note after step 4) runs only for models of at most this
  // many layers: beyond, its enumeration nearly always overflows its node cap (plans of
  // one recompute total grow combinatorially with the layers), time spent for nothing.
  int exact_max_layers = 20;
  // Pipeline scenarios (sim/search/optimize_pipeline.h): the plan space (choices^local layers) is
  // enumerated instead when it has at most this many plans.
  int64_t exact_max_plans = int64_t{1} << 16;
};

// The per-layer cost model of step 1 (bytes are signed: window terms are differences).
struct LayerCosts {
  int32_t layers = 0;
  std::vector<graph::LayerCheckpoint> choices;
  std::vector<std::vector<int64_t>> stored;  // [choice][layer]
  std::vector<std::vector<int64_t>> window;  // [choice][layer]
  std::vector<int64_t> gap;                  // [k], k = 0..layers; INT64_MIN: no such moment
  std::vector<int64_t> flops;                // [choice]: recompute FLOPs per layer
};

LayerCosts calibrate(const Scenario& scenario, const TrainingScript& script,
                     const std::vector<graph::LayerCheckpoint>& choices);

// The modelled peak (rounded requested bytes) of a plan that uses only calibrated choices.
int64_t model_peak(const LayerCosts& costs, const graph::CheckpointPlan& plan);

struct SearchResult {
  bool feasible = false;
  graph::CheckpointPlan plan;
  int64_t recompute = 0;   // modelled recompute FLOPs
  int64_t peak = 0;        // modelled peak
};
// Step 2: the least-recompute plan with modelled peak <= bound.
SearchResult search_plan(const LayerCosts& costs, int64_t bound);
// The plan with the smallest modelled peak (binary search on the bound).
SearchResult smallest_peak_plan(const LayerCosts& costs);

// The smallest-peak plan of a bounded search `search(bound) -> SearchResult`: a binary
// search on the bound, each feasible answer lowering the upper end to its own peak.
template <typename BoundedSearch>
SearchResult smallest_peak_by_bisection(BoundedSearch search) {
  int64_t lo = 0, hi = INT64_MAX / 4;
  SearchResult best = search(hi);
  if (!best.feasible) return best;
  hi = best.peak;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    SearchResult r = search(mid);
    if (r.feasible) {
      best = std::move(r);
      hi = best.peak;
    } else {
      lo = mid + 1;
    }
  }
  return best;
}

// Simulates `plan` on a device whose allocator may use `capacity` bytes (0 = unlimited).
struct PlanRun {
  Analysis analysis;
  MemoryStats stats;
};
PlanRun simulate_plan(const Scenario& scenario, const TrainingScript& script,
                      const graph::CheckpointPlan& plan, uint64_t capacity);
// The device size of a run "without a limit": sim/analysis/headroom.h's
// unlimited_device_bytes (2^60 bytes; 64 TiB with expandable segments).
uint64_t unlimited_capacity(const AllocatorConfig& allocator);

// One pipeline stage run with the chosen plan (memsim optimize on parallel.pipeline > 1).
struct StagePeak {
  int64_t stage = 0;
  uint64_t peak_allocated = 0, peak_reserved = 0;  // measured step
  bool fits = true;
  Flops flops;
};

struct OptimizeResult {
  bool fits = false;
  graph::CheckpointPlan plan;  // the chosen plan; when nothing fits, the smallest-peak one
  // The scenario's checkpoint section for `plan` (config_for_plan, or the named policy's
  // own config when one won: segments of several layers have no custom spelling), and
  // that policy's spec ("sqrt"; empty when the search's plan won).
  CheckpointConfig checkpoint;
  std::string named_policy;
  PlanRun run;                 // its simulation (capacity = budget; unlimited if !fits)
  int64_t model_peak = 0;
  int verifications = 0;       // plans simulated while searching
  double calibrate_ms = 0, search_ms = 0, verify_ms = 0;
  // The step's FLOPs: the simulated GPU's, or with pipeline stages the sum over stages.
  Flops flops;
  // Pipeline-parallel scenarios (sim/search/optimize_pipeline.h): every stage with the plan, run
  // with the budget as capacity (unlimited when nothing fits); `run` is the stage with the
  // largest peak reserved, `worst_stage`. Empty / -1 otherwise.
  std::vector<StagePeak> stages;
  int64_t worst_stage = -1;
};
OptimizeResult optimize_checkpointing(const Scenario& scenario, const TrainingScript& script,
                                      uint64_t budget, const OptimizeOptions& options = {});

// "layers 0-3: layer, 4: attention, 5-31: keep".
std::string describe_plan(const graph::CheckpointPlan& plan);

}  // namespace memsim
