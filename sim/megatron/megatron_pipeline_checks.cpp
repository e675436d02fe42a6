#include "sim/megatron/megatron_pipeline_checks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "allocator/caching_allocator.h"
#include "graph/models/megatron.h"
#include "scenario/pipeline_split.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"

namespace memsim {

namespace {

constexpr int kAct = static_cast<int>(TensorKind::activation);
constexpr int kInput = static_cast<int>(TensorKind::input);

FormulaCheck row(const std::string& name, const std::string& formula, const std::string& unit,
                 double expected, double simulated, const std::string& note) {
  FormulaCheck c;
  c.name = name;
  c.formula = formula;
  c.unit = unit;
  c.expected = expected;
  c.simulated = simulated;
  c.extra = simulated - expected;
  c.note = note;
  return c;
}

}  // namespace

std::vector<FormulaCheck> megatron_theoretical_first_stage_checks(const Scenario& s) {
  const ParallelConfig& pc = s.parallel;
  if (s.model.family != ModelFamily::megatron || pc.pipeline < 2 ||
      pc.pipeline_schedule == PipelineSchedule::gpipe || !pc.sequence ||
      s.checkpoint.policy != CheckpointPolicy::selective)
    throw std::invalid_argument(
        "Megatron's theoretical first-stage memory is checked for megatron pipelines (1f1b or "
        "interleaved) with sequence parallelism and selective recomputation");
  if (pipeline_split(s).uneven())  // the formula's stage holds L/p layers
    throw std::invalid_argument(
        "Megatron's theoretical first-stage memory assumes an even pipeline split (L/p layers "
        "per stage); parallel.pipeline_first_layers and the other split keys are not in it");
  if (s.model.arch.moe.experts > 0)  // the formula's MoE terms: tools/megatron/theoretical_moe_memory.py
    throw std::invalid_argument(
        "Megatron's theoretical first-stage memory is checked here for dense models only "
        "(MoE: tools/megatron/theoretical_moe_memory.py, docs/moe-megatron.md)");
  const graph::MegatronShape shape = megatron_shape(s);
  const double sd = static_cast<double>(shape.seq), b = static_cast<double>(shape.batch);
  const double h = static_cast<double>(shape.hidden), ffn = static_cast<double>(shape.ffn);
  const double L = static_cast<double>(shape.layers), t = static_cast<double>(shape.tensor);
  const double p = static_cast<double>(pc.pipeline);
  const double m = static_cast<double>(std::max<int64_t>(1, s.batch.grad_accum));
  const bool interleaved = pc.pipeline_schedule == PipelineSchedule::interleaved;
  const double v = static_cast<double>(pc.virtual_stages);

  // --- the formula ---------------------------------------------------------------------
  const double factor = interleaved ? 1 + (p - 1) / (p * v) : std::min(1.0, m / p);
  const double f_layers = sd * b * h * (18 + 4 * ffn / h) * L * factor / t;
  const double f_input = 8 * sd * b * p * factor / t;
  const double f_dropout = sd * b * h * p * factor / t;
  const double f_act = f_layers + f_input + f_dropout;
  // Weights: the layers (QKV, proj, fc1, fc2 and two LayerNorms; the formula's 2/h terms)
  // plus the final LayerNorm make the transformer block.
  const double block = 2 * L * h * h * (2 + ffn / h + 2 / h + 1 / (L * h));
  const double shard = (block / p + h * static_cast<double>(shape.padded_vocab())) / t;
  const double bytes_per_param =
      pc.zero >= 1 ? 6 + 12 / static_cast<double>(pc.data) : 18;
  const double f_weights = bytes_per_param * shard;

  // --- memsim's stage 0 --------------------------------------------------------------
  Scenario sc = s;
  sc.step.warmup_steps = std::max<int64_t>(1, s.step.warmup_steps);  // Adam state exists
  Program program;
  build_megatron_stage_program(sc, {}, 0, program);
  const LiveBytes fwd = live_bytes_at_mark(program, "forward_end");
  const LiveBytes opt = live_bytes_at_mark(program, "optimizer_end");
  if (!fwd.found_mark || !opt.found_mark)
    throw std::runtime_error("stage 0 has no forward_end / optimizer_end mark");
  double layers = 0;
  for (const auto& l : fwd.by_layer) layers += static_cast<double>(l[kAct]);
  const double embedding = static_cast<double>(fwd.outside[kAct]);
  const double inputs = static_cast<double>(fwd.by_kind[kInput]);
  const double states = static_cast<double>(opt.by_kind[int(TensorKind::parameter)] +
                                            opt.by_kind[int(TensorKind::gradient)] +
                                            opt.by_kind[int(TensorKind::optimizer_state)]);
  SimulatedDevice device(1ull << 60, 0);
  ExecuteOptions exec;
  exec.record_by_kind = false;
  const Timeline timeline = execute(program, s.allocator, device, exec);
  const double peak = static_cast<double>(timeline.final_stats.allocated_bytes.all.peak);

  const std::string where = "stage 0 of " + std::to_string(pc.pipeline) + ", " + s.name;
  const std::string in_flight =
      interleaved ? " x (1 + (p-1)/(p*v))" : " x min(1, m/p)";
  return {
      row("activations of the transformer layers, " + where,
          "s*b*h*(18 + 4*ffn/h) * L / t" + in_flight, "bytes", f_layers, layers,
          "+ LayerNorm mean+invvar fp32 (16sb/t per layer and micro-batch) - the last layer's "
          "output (2sbh/t per micro-batch: sent, then deallocated)"),
      row("activations of the embedding, " + where, "s*b*h*p / t" + in_flight, "bytes",
          f_dropout, embedding,
          "+ the embedding output (2sbh/t per micro-batch, the first layer's input) + the "
          "deallocated outputs' 1-element stand-ins"),
      row("batch tensors kept for backward, " + where, "8*s*b*p / t" + in_flight, "bytes",
          f_input, inputs,
          "token and position ids (8sb each, int64, not split by t) + the b*s^2 attention "
          "mask that selective recompute keeps, per micro-batch"),
      row("activation memory, " + where, "compute_activation_memory (SP + selective)",
          "bytes", f_act, layers + embedding + inputs, "sum of the three rows above"),
      row("weights + grads + optimizer, " + where,
          std::to_string(static_cast<int>(bytes_per_param)) +
              " * (P_block/p + V_pad*h) / t (compute_weight_and_optimizer_memory)",
          "bytes", f_weights, states,
          "+ biases, the position embedding (not split by t) and replicated LayerNorms; - "
          "the final LayerNorm (on the last stage)"),
      row("total vs memsim's peak allocated, " + where, "weights+optimizer + activations",
          "bytes", f_weights + f_act, peak,
          "+ backward temporaries at the peak, cuBLAS workspaces, the received output grad, "
          "the mpu all-gather buffer"),
  };
}

}  // namespace memsim
