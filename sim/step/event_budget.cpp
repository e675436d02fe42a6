// See sim/step/event_budget.h.
#include "sim/step/event_budget.h"

#include <algorithm>
#include <string>

#include "scenario/pipeline_split.h"

namespace memsim {

namespace {

// Layers in one Program: a pipeline stage's share (rounded up) when there are stages, the
// largest stage's with an uneven split (scenario/pipeline_split.h).
uint64_t program_layers(const Scenario& s) {
  const uint64_t layers = static_cast<uint64_t>(std::max<int64_t>(0, s.model.layers));
  const uint64_t stages = static_cast<uint64_t>(std::max<int64_t>(1, s.parallel.pipeline));
  const PipelineSplit split = pipeline_split(s);
  if (stages > 1 && split.uneven()) return static_cast<uint64_t>(max_stage_layers(split));
  return (layers + stages - 1) / stages;
}

}  // namespace

// step.kind generate (sim/step/generate.cpp): one forward per new token, about 95 events
// per layer and 90 outside the layers per token (3,048 per token measured on the shipped
// 32-layer Llama-2 scenario), plus the weights' construction. Saturating.
uint64_t generate_events(const Scenario& s) {
  using u128 = unsigned __int128;
  const u128 tokens = static_cast<u128>(std::max<int64_t>(1, s.generate.new_tokens));
  const u128 layers = static_cast<u128>(std::max<int64_t>(0, s.model.layers));
  // generate.cache quantized:* (graph/models/quanto_kv.h): each layer's update also
  // dequantizes K and V, concatenates and grows the residual, and re-quantizes every
  // max(residual_length - 1, 1) + 1 steps (every second step at residual_length <= 2): up to 40 per
  // layer and token more (12.4 measured on the shipped int4 scenario, 36.3 at residual_length 0).
  const bool quantized =
      s.generate.cache == GenerateCache::quantized_int4 || s.generate.cache == GenerateCache::quantized_int2;
  // quantized:int8 (HQQ, graph/models/hqq_kv.h): a quantize is about 110 events (two optimizer
  // iterations, three empty_cache), a dequantize 5.
  const bool hqq = s.generate.cache == GenerateCache::quantized_int8;
  const u128 per_layer = hqq ? 300 : quantized ? 136 : 96;
  const u128 events = tokens * (layers * per_layer + 120) + 64 + layers * 16;  // < 2^64 * 2^72
  return events > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(events);
}

uint64_t estimated_events(const Scenario& s) {
  if (s.step.kind == StepKind::generate) return generate_events(s);
  using u128 = unsigned __int128;
  const u128 steps = static_cast<u128>(std::max<int64_t>(0, s.step.warmup_steps)) + 1;
  const u128 micro = static_cast<u128>(std::max<int64_t>(1, s.batch.grad_accum));
  const u128 layers = program_layers(s);
  // Each factor is below 2^64, so steps * micro < 2^128 needs a saturating product.
  const u128 limit = UINT64_MAX;
  u128 events = steps * micro;  // both < 2^63 + 1: fits
  if (events > limit) return UINT64_MAX;
  const u128 per_micro = layers * 340 + 1200;  // layers < 2^63: fits
  if (per_micro > limit) return UINT64_MAX;
  events = events * per_micro + layers * 12;  // both factors < 2^64
  return events > limit ? UINT64_MAX : static_cast<uint64_t>(events);
}

void check_event_budget(const Scenario& s) {
  const uint64_t events = estimated_events(s);
  if (events <= kEventBudget) return;
  if (s.step.kind == StepKind::generate) {
    const uint64_t layers = static_cast<uint64_t>(std::max<int64_t>(0, s.model.layers));
    const bool tokens_drive = static_cast<uint64_t>(std::max<int64_t>(1, s.generate.new_tokens)) >= layers;
    throw ScenarioError(s.key_prefix(tokens_drive ? "generate.new_tokens" : "model.layers") +
                        ": the run would emit about " + std::to_string(events) + " allocator events (" +
                        std::to_string(s.generate.new_tokens) + " forward(s) x " + std::to_string(layers) +
                        " layer(s)), more than the event budget of " + std::to_string(kEventBudget) +
                        "; generate fewer new tokens (the cache grows by the same bytes per token)");
  }
  // Name the key that does most to the count.
  const int64_t steps = s.step.warmup_steps + 1;
  const int64_t micro = std::max<int64_t>(1, s.batch.grad_accum);
  const uint64_t layers = program_layers(s);
  std::string key = "model.layers";
  if (micro >= steps && static_cast<uint64_t>(micro) * 340 >= layers) key = "batch.grad_accum";
  else if (steps > micro && static_cast<uint64_t>(steps) * 340 >= layers) key = "step.warmup_steps";
  throw ScenarioError(
      s.key_prefix(key) + ": the run would emit about " + std::to_string(events) +
      " allocator events (" + std::to_string(steps) + " step(s) x " + std::to_string(micro) +
      " micro-batch(es) x " + std::to_string(layers) + " layer(s) per program), more than the " +
      "event budget of " + std::to_string(kEventBudget) +
      (key == "model.layers"
           ? std::string("; a model this deep is beyond one simulated program (megatron's parallel.pipeline "
                         "splits the layers over stages)")
           : std::string("; the peak is reached within two steps and two micro-batches, so "
                         "fewer give the same answer")));
}

}  // namespace memsim
