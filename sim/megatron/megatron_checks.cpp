#include "sim/megatron/megatron_checks.h"

#include <stdexcept>

#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_step.h"

namespace memsim {

namespace {

constexpr int kAct = static_cast<int>(TensorKind::activation);

// Per-layer activations at forward_end; throws if the layers disagree (they must: every
// layer runs the same emitter).
double bytes_per_layer(const Program& program, int64_t layers) {
  const LiveBytes live = live_bytes_at_mark(program, "forward_end");
  if (!live.found_mark) throw std::runtime_error("no forward_end mark");
  if (static_cast<int64_t>(live.by_layer.size()) != layers)
    throw std::runtime_error("live activations in an unexpected number of layers");
  const uint64_t first = live.by_layer[0][kAct];
  for (const auto& l : live.by_layer)
    if (l[kAct] != first) throw std::runtime_error("layers keep different activation bytes");
  return static_cast<double>(first);
}

FormulaCheck korthikanti(const Scenario& s, bool flash, int64_t tensor = 1,
                         bool sequence = false) {
  Scenario sc = s;
  sc.model.attention = flash ? AttentionImpl::flash : AttentionImpl::eager;
  sc.parallel.tensor = tensor;
  sc.parallel.sequence = sequence;
  sc.step.warmup_steps = 0;
  sc.step.kind = StepKind::forward;  // only forward_end matters
  const graph::MegatronShape shape = megatron_shape(sc);
  const graph::MegatronLayerBytes expect = graph::megatron_layer_saved_bytes(shape);
  const Program program = build_megatron_program(sc);
  FormulaCheck c;
  c.name = std::string("activations per layer, ") + sc.name + (flash ? ", flash" : ", eager");
  const double sbh = static_cast<double>(shape.seq * shape.batch * shape.hidden);
  const double t = static_cast<double>(tensor);
  const double s2 = 5.0 * static_cast<double>(shape.heads * shape.seq) /
                    (static_cast<double>(shape.hidden) * t);
  if (tensor == 1) {
    c.formula = flash ? "s*b*h*34" : "s*b*h*(34 + 5*a*s/h)";
    c.expected = flash ? sbh * 34 : sbh * (34.0 + s2);
  } else if (sequence) {  // Korthikanti Table 2, "tensor + sequence parallel"
    c.name += ", tensor + sequence parallel " + std::to_string(tensor);
    c.formula = flash ? "s*b*h*34/t" : "s*b*h*(34/t + 5*a*s/(h*t))";
    c.expected = sbh * (34.0 / t + (flash ? 0.0 : s2));
  } else {  // Korthikanti Table 2, "tensor parallel (baseline)"
    c.name += ", tensor parallel " + std::to_string(tensor);
    c.formula = flash ? "s*b*h*(10 + 24/t)" : "s*b*h*(10 + 24/t + 5*a*s/(h*t))";
    c.expected = sbh * (10.0 + 24.0 / t + (flash ? 0.0 : s2));
  }
  c.unit = "bytes/layer";
  c.simulated = bytes_per_layer(program, shape.layers);
  c.extra = static_cast<double>(expect.norm_stats + expect.flash_extras);
  c.note = flash ? "LayerNorm mean+invvar fp32 (16sb, /t with SP) + softmax lse fp32 (4asb/t) + RNG state (16 B)"
                 : "LayerNorm mean+invvar fp32 (16sb, /t with SP)";
  return c;
}

Scenario small_megatron(DType params, bool master) {
  Scenario s;
  s.name = "megatron-small";
  s.model.family = ModelFamily::megatron;
  s.model.layers = 2;
  s.model.d_model = 256;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.d_ff = 1024;
  s.model.vocab = 1000;
  s.model.context_length = 128;
  s.model.tied_embeddings = true;
  s.model.dropout = 0.1;
  s.batch.micro_batch = 2;
  s.batch.seq_len = 128;
  s.precision.params = params;
  s.precision.master_weights = master;
  s.optimizer.type = OptimizerType::adam;
  s.optimizer.impl = OptimizerImpl::fused;
  s.step.warmup_steps = 1;
  return s;
}

FormulaCheck model_state(DType params, bool master, bool zero, double formula,
                         const std::string& formula_text, const std::string& note) {
  const Scenario s = small_megatron(params, master);
  MegatronOptions o;
  o.zero_paper_accounting = zero;
  const Program program = build_megatron_program(s, o);
  const LiveBytes live = live_bytes_at_mark(program, "optimizer_end");
  if (!live.found_mark) throw std::runtime_error("no optimizer_end mark");
  const double P = static_cast<double>(graph::megatron_parameter_count(megatron_shape(s)));
  const double states = static_cast<double>(live.by_kind[int(TensorKind::parameter)] +
                                            live.by_kind[int(TensorKind::gradient)] +
                                            live.by_kind[int(TensorKind::optimizer_state)]);
  FormulaCheck c;
  c.name = std::string("model states, ") + to_string(params) +
           (master ? " + fp32 master" : ", no master") +
           (zero ? " (ZeRO accounting)" : " (Megatron)");
  c.formula = formula_text;
  c.unit = "bytes/param";
  c.expected = formula;
  c.simulated = states / P;
  c.note = note;
  return c;
}

}  // namespace

std::vector<FormulaCheck> korthikanti_checks(const Scenario& gpt3) {
  return {korthikanti(gpt3, false), korthikanti(gpt3, true)};
}

std::vector<FormulaCheck> korthikanti_tensor_parallel_checks(const Scenario& gpt3,
                                                             int64_t tensor, bool sequence) {
  return {korthikanti(gpt3, false, tensor, sequence), korthikanti(gpt3, true, tensor, sequence)};
}

FormulaCheck megatron_theoretical_weight_optimizer_check(const Scenario& s) {
  const graph::MegatronShape shape = megatron_shape(s);
  const double L = static_cast<double>(shape.layers), h = static_cast<double>(shape.hidden);
  const double ffn = static_cast<double>(shape.ffn), t = static_cast<double>(shape.tensor);
  // megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory
  // (MHA, no MoE, no swiglu, pipeline 1).
  const double layers_params = 2 * L * h * h * (2 + ffn / h + 2 / h + 1 / (L * h));
  // Untied, the output layer's weight is a second embedding-sized matrix (pipeline 1).
  const double embedding = h * static_cast<double>(shape.padded_vocab()) * (shape.tied ? 1 : 2);
  const double shard = (layers_params + embedding) / t;
  Scenario sc = s;
  sc.step.warmup_steps = 0;
  const Program program = build_megatron_program(sc);
  const LiveBytes live = live_bytes_at_mark(program, "optimizer_end");
  if (!live.found_mark) throw std::runtime_error("no optimizer_end mark");
  FormulaCheck c;
  c.name = "weights + grads + optimizer of tensor-parallel rank 0, " + s.name;
  // 18 bytes per parameter, 6 + 12/d with the distributed optimizer over d ranks.
  const double per_param =
      s.parallel.zero >= 1 ? 6 + 12 / static_cast<double>(s.parallel.data) : 18;
  c.formula = s.parallel.zero >= 1 ? "(6 + 12/d) * ((P_layers + V_pad*h) / t) (Megatron theoretical)"
                                   : "18 * ((P_layers + V_pad*h) / t) (Megatron theoretical)";
  c.unit = "bytes";
  c.expected = per_param * shard;
  c.simulated = static_cast<double>(live.by_kind[int(TensorKind::parameter)] +
                                    live.by_kind[int(TensorKind::gradient)] +
                                    live.by_kind[int(TensorKind::optimizer_state)]);
  c.extra = c.simulated - c.expected;
  c.note = "formula leaves out biases and position embeddings and splits the replicated "
           "LayerNorms / row-parallel biases by t";
  return c;
}

std::vector<FormulaCheck> model_state_checks() {
  return {
      model_state(DType::fp16, true, true, 16, "2 + 2 + 12 (ZeRO)", ""),
      model_state(DType::fp16, false, true, 12, "2 + 2 + 8", "Adam m, v fp32"),
      model_state(DType::bf16, true, true, 16, "2 + 2 + 12 (ZeRO)", ""),
      model_state(DType::bf16, true, false, 18, "2 + 4 + 12",
                  "bf16: main_grad buffer fp32 (accumulate_allreduce_grads_in_fp32)"),
      model_state(DType::fp16, true, false, 20, "2 + 2 + 4 + 12",
                  "fp16: main_param.grad = main_grad.float() copies live until zero_grad"),
      model_state(DType::bf16, false, false, 14, "2 + 4 + 8", "bf16 main_grad fp32"),
  };
}

}  // namespace memsim
