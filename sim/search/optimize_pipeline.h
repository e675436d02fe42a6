// memsim optimize on pipeline-parallel megatron scenarios (parallel.pipeline > 1): the
// checkpointing plan with the least recomputation whose simulated peak reserved memory fits
// the budget on EVERY pipeline stage.
//
// What a plan is. One choice per layer of a stage's model chunk (L/(p*v) layers, numbered
// from 0 as Megatron's TransformerBlock numbers them), applied identically to every stage
// and every chunk: checkpoint.custom numbers layers that way (sim/megatron/megatron_pipeline.h).
// This is what Megatron can express: recompute_granularity (full / selective),
// recompute_method (uniform / block) and recompute_num_layers are one set of arguments for
// all pipeline ranks, read by each rank's TransformerBlock over its own local layers
// (block with N checkpoints the first N local layers of every stage). Per-stage plans
// would need per-rank arguments Megatron does not have, so the search does not offer them,
// although stage 0 (holding the most micro-batches under 1F1B) is usually the only stage
// that needs that much recomputation. The choices per layer are memsim's (custom, see
// sim/step/checkpoint_policy.h): stock Megatron flags express "the first N local layers whole"
// (full, block, N), "every layer's core attention" (selective) and none; a mix (some
// layers whole, the rest selective) needs the checkpoint calls placed per layer. Since
// every stage runs the same plan on the same number of layers, the recompute of a plan
// summed over stages is p times one stage's: minimising one minimises the other.
//
// Cost model (calibrate_pipeline). Under a pipeline schedule a stage holds several
// micro-batches of activations at once, so at any moment of stage s its live bytes are
//     a * S(plan) + P_k(plan) + residual
// where a = micro-batches (chunk passes) whose forward is done and backward not begun,
// other than the one running; S = what one micro-batch stores (sum over layers of
// stored_l(c_l)); P_k = what the running micro-batch stores in its layers 0..k-1; the
// residual depends only on the running layer's choice (inside layer l: window) or on
// nothing (between layers: gap). One Program per (choice, stage) with every layer making
// that choice gives, per (a, layer), the highest live bytes (requested bytes rounded to the
// allocator's 512-byte blocks, measured step only); the window is that minus a*S - P_l,
// the maximum over stages. The passes are found in each Program's event stream (a forward
// runs its layers up, a backward down) and checked against sim/megatron/pipeline_schedule.h's order.
// stored_l(c) is measured on stage 0: the bytes its first micro-batch's layer-l tensors
// still hold when the next pass starts. Differences between stages that do not depend on
// the choice (the last stage's final LayerNorm keeps the last layer's output, which other
// stages send and deallocate) fall into the residuals. Gaps come from the keep Program.
// Exactness: the model equals the simulated requested peak (rounded) except for tensors
// that are not a layer's but that a checkpointed region keeps while its micro-batch is in
// flight: on the first and last stages the attention mask (b*s^2 bytes per micro-batch)
// is an input of core-attention, attention-half and whole-layer regions, held once
// however many layers keep it. A window measured under choice c charges it only inside
// layers making such a choice, gaps never, so the model stays a lower bound of the
// simulated peak (off by at most that tensor per micro-batch in flight), which is what the
// verification needs: no plan the model rejects could fit.
//
// Search (search_pipeline_plan). A dynamic program over layers 0..L-1 as for one GPU
// (sim/search/optimize.h), but the constraints with a >= 1 involve the final S, which the prefix
// does not know: each one, a*S + P_l + w <= bound, is kept as an upper limit on S,
// U = min floor((bound - P_l - w) / a), checked when S is known (and used to prune with
// the least bytes the remaining layers can store). States are (stored prefix P, recompute
// R, U); one dominates another with P and R no larger and U no smaller, so only that
// Pareto front is kept (a Fenwick tree over R answers "does a kept state with less R have a
// larger U" in log time).
//
// Verification (optimize_pipeline_checkpointing), as for one GPU: the candidate is built and
// run through the allocator on every stage with the budget as capacity (the stage that
// failed last first, so a plan that does not fit usually costs one stage's simulation); a
// failure tightens the bound below the plan's modelled peak. Small plan spaces (at most
// OptimizeOptions::exact_max_plans plans) are enumerated instead: all plans the model
// admits, by recompute then modelled peak, simulated until one fits, so allocator effects
// cannot hide the optimum. The result carries every stage's peaks with the chosen plan; its `run` is the
// stage with the largest peak reserved.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/checkpoint.h"
#include "scenario/scenario.h"
#include "sim/search/optimize.h"

namespace memsim {

struct PipelineCosts {
  int32_t layers = 0;  // per model chunk: the plan's length
  int32_t stages = 0;
  int32_t depth = 0;   // values of a: 0 .. depth-1
  std::vector<graph::LayerCheckpoint> choices;
  std::vector<std::vector<int64_t>> stored;               // [choice][layer], one micro-batch
  std::vector<std::vector<std::vector<int64_t>>> window;  // [a][choice][layer]; INT64_MIN: none
  std::vector<std::vector<int64_t>> gap;                  // [a][k], k = 0..layers
  std::vector<int64_t> flops;  // [choice]: recompute FLOPs per plan layer, all stages together
};

// Step 1 for a pipeline scenario (megatron family, parallel.pipeline > 1).
PipelineCosts calibrate_pipeline(const Scenario& scenario,
                                 const std::vector<graph::LayerCheckpoint>& choices);

// The modelled peak over all stages of a plan that uses only calibrated choices.
int64_t pipeline_model_peak(const PipelineCosts& costs, const graph::CheckpointPlan& plan);
// Same for a plan given as indices into costs.choices, one per layer (allocates nothing).
int64_t pipeline_model_peak(const PipelineCosts& costs, const uint8_t* choice_index);

// The least-recompute plan whose modelled peak is <= bound (ties: the lower peak).
SearchResult search_pipeline_plan(const PipelineCosts& costs, int64_t bound);
// The plan with the smallest modelled peak.
SearchResult smallest_pipeline_peak_plan(const PipelineCosts& costs);

// optimize_checkpointing for parallel.pipeline > 1 (it dispatches here).
OptimizeResult optimize_pipeline_checkpointing(const Scenario& scenario, uint64_t budget,
                                               const OptimizeOptions& options);

}  // namespace memsim
