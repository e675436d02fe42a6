// Optimizer state and LoRA/QLoRA storage by construction: fp32 master weights (16 bytes per
// parameter with Adam), bitsandbytes 8-bit Adam's block-wise state, NF4 base weights and
// their per-call dequantisation, frozen base weights, and the scenario keys' errors.
// (Step-by-step comparisons with real PyTorch: tests/test_optim_lora_fixtures.cpp.)
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "sim/step/schedule.h"

using namespace memsim;

namespace {

const char* kLlama =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 172, "
    "vocab: 512, context_length: 64, attention: eager}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "step: {kind: train, warmup_steps: 1}\n"
    "device: {capacity: 1TiB, cublas_workspace: 0, kernel_scratch: false}\n";

// Live bytes by kind at a mark of the measured step.
std::map<TensorKind, uint64_t> live_at(const Program& p, const std::string& mark) {
  std::vector<uint8_t> live(p.tensors.size(), 0);
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) live[e.tensor] = 1;
    if (e.type == EventType::free) live[e.tensor] = 0;
    if (e.type != EventType::mark) continue;
    const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
    measuring = measuring || name == "measured_step_begin";
    if (!measuring || name != mark) continue;
    std::map<TensorKind, uint64_t> out;
    for (size_t t = 0; t < live.size(); ++t)
      if (live[t]) out[p.tensors[t].kind] += p.tensors[t].bytes;
    return out;
  }
  FAIL("no mark " << mark);
  return {};
}

// Sum of the model's parameter storages (named "...weight"), in elements.
uint64_t param_elems(const Program& p, uint64_t elem) {
  uint64_t n = 0;
  for (const TensorInfo& t : p.tensors) {
    const std::string& name = p.str(t.name);
    if (t.kind == TensorKind::parameter && name.size() > 6 &&
        name.compare(name.size() - 6, 6, "weight") == 0)
      n += t.bytes / elem;
  }
  return n;
}

std::string error_of(const std::string& yaml, const std::vector<std::pair<std::string, std::string>>& set = {}) {
  try {
    build_program(load_scenario_text(yaml, "t.yaml", set));
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("master weights: 16 bytes per parameter with AdamW between steps, 8 without", "[optim]") {
  for (const char* impl : {"for-loop", "foreach", "fused"}) {
    INFO(impl);
    const Scenario with = load_scenario_text(kLlama, "t.yaml",
        {{"precision.params", "bf16"}, {"precision.master_weights", "true"}, {"optimizer.impl", impl}});
    const Program p = build_program(with);
    const uint64_t n = param_elems(p, 2);
    // fused=True keeps each parameter's `step` as a 0-d fp32 tensor on the device.
    uint64_t steps = 0;
    if (std::string(impl) == "fused")
      for (const MemoryEvent& e : p.events)
        steps += 4 * (e.type == EventType::alloc && e.kind == TensorKind::parameter);
    const auto at = live_at(p, "backward_end");
    CHECK(at.at(TensorKind::parameter) == 2 * n);
    CHECK(at.at(TensorKind::gradient) == 2 * n);
    CHECK(at.at(TensorKind::optimizer_state) == 12 * n + steps);  // fp32 master + m + v
    const Scenario without = load_scenario_text(kLlama, "t.yaml",
        {{"precision.params", "bf16"}, {"optimizer.impl", impl}});
    const auto plain = live_at(build_program(without), "backward_end");
    CHECK(plain.at(TensorKind::optimizer_state) == 4 * n + steps);  // bf16 m + v (zeros_like(p))
  }
  // The fp32 grads exist only during the step.
  const Program p = build_program(load_scenario_text(kLlama, "t.yaml",
      {{"precision.params", "bf16"}, {"precision.master_weights", "true"}}));
  CHECK(live_at(p, "optimizer_end").at(TensorKind::gradient) == 2 * param_elems(p, 2));
}

TEST_CASE("bitsandbytes 8-bit AdamW: uint8 m and v, fp32 absmax per 256, small tensors fp32", "[optim]") {
  for (const char* type : {"adamw8bit", "adam8bit"}) {
    const Program p = build_program(load_scenario_text(kLlama, "t.yaml", {{"optimizer.type", type}}));
    uint64_t expected = 2 * 256 * 4;  // the two shared quantisation maps
    for (const TensorInfo& t : p.tensors) {
      if (t.kind != TensorKind::parameter) continue;
      const uint64_t n = t.bytes / 4;
      expected += n < 4096 ? 8 * n : 2 * n + 2 * 4 * ((n + 255) / 256);
    }
    CHECK(live_at(p, "optimizer_end").at(TensorKind::optimizer_state) == expected);
  }
  // At 7B scale the state is 2.03 bytes per parameter (against 8 for AdamW in fp32).
  const Program big = build_program(load_scenario_text(
      "model: {preset: llama2-7b, attention: flash}\nbatch: {micro_batch: 1, seq_len: 128}\n"
      "precision: {params: bf16}\noptimizer: {type: adamw8bit}\ndevice: {capacity: 1TiB}\n", "t.yaml"));
  const double n = static_cast<double>(param_elems(big, 2));
  CHECK(static_cast<double>(live_at(big, "optimizer_end").at(TensorKind::optimizer_state)) / n ==
        Approx(2.0 + 8.0 / 256).epsilon(0.001));
}

TEST_CASE("LoRA: frozen base weights get no grad and no state, adapters get both", "[lora]") {
  const Program p = build_program(load_scenario_text(std::string(kLlama) +
      "lora: {rank: 8, alpha: 16, targets: [q_proj, v_proj, down_proj]}\n", "t.yaml"));
  // q: A 8x64 + B 64x8; v: A 8x64 + B 32x8; down: A 8x172 + B 64x8, per layer, fp32.
  const uint64_t adapters = 2 * 4 * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8 + 8 * 172 + 64 * 8);
  const auto bw = live_at(p, "backward_end");
  CHECK(bw.at(TensorKind::gradient) == adapters);
  CHECK(bw.at(TensorKind::optimizer_state) == 2 * adapters);
}

TEST_CASE("QLoRA: NF4 base weights at 0.516 bytes per parameter, dequantised per call", "[lora]") {
  const std::string y = "model: {preset: llama2-7b, attention: flash}\n"
                        "batch: {micro_batch: 1, seq_len: 256}\nprecision: {params: bf16}\n"
                        "lora: {rank: 64, targets: all-linear, base_dtype: nf4}\n"
                        "device: {capacity: 1TiB}\n";
  const Scenario s = load_scenario_text(y, "t.yaml");
  const Program p = build_program(s);
  // The seven decoder linears per layer: packed codes + uint8 absmax per 64 + fp32 absmax
  // per 256 blocks + offset + 16-entry code (named after their weight).
  const uint64_t D = 4096, F = 11008;
  const uint64_t sizes[7] = {D * D, D * D, D * D, D * D, F * D, F * D, D * F};
  uint64_t expected = 256 * 4, n_total = 0;
  for (uint64_t n : sizes) {
    expected += n / 2 + n / 64 + (n / 64 + 255) / 256 * 4 + 4 + 64;
    n_total += n;
  }
  expected = (expected - 256 * 4) * 32 + 256 * 4;
  n_total *= 32;
  uint64_t got = 0;
  for (const TensorInfo& t : p.tensors) {
    const std::string& name = p.str(t.name);
    if (t.kind == TensorKind::parameter && name.find("proj.weight") != std::string::npos &&
        name.find("lora_") == std::string::npos)
      got += t.bytes;
    if (name == "bnb dynamic map") got += t.bytes;
  }
  CHECK(got == expected);
  CHECK(static_cast<double>(got) / static_cast<double>(n_total) == Approx(0.5159).epsilon(0.001));
  // Dequantised bf16 weights: one per linear in forward; in backward one per linear whose
  // input needs a grad (layer 0's q/k/v read the frozen embedding's output: none).
  uint64_t fw = 0, bw = 0;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
    if (!measuring || e.type != EventType::alloc || e.kind != TensorKind::temporary) continue;
    const std::string& op = p.str(e.op);
    const bool weight_sized = e.bytes == D * D * 2 || e.bytes == F * D * 2;
    if (op == "matmul_4bit" && weight_sized) ++fw;
    if (op == "MatMul4BitBackward" && weight_sized) ++bw;
  }
  CHECK(fw == 7 * 32);
  CHECK(bw == 7 * 32 - 3);
}

TEST_CASE("LoRA with non-reentrant checkpointing lowers the forward end, and reentrant needs PEFT's input-grads hook", "[lora]") {
  const std::string y = std::string(kLlama) + "lora: {rank: 4, targets: all-linear, dropout: 0.1}\n";
  const Program none = build_program(load_scenario_text(y, "t.yaml"));
  const Program full = build_program(load_scenario_text(y, "t.yaml", {{"checkpoint.policy", "full"}}));
  const auto a = live_at(none, "forward_end"), b = live_at(full, "forward_end");
  CHECK(b.at(TensorKind::activation) < a.at(TensorKind::activation));
  CHECK(live_at(full, "backward_end").at(TensorKind::gradient) ==
        live_at(none, "backward_end").at(TensorKind::gradient));
  // Reentrant checkpointing is modelled with PEFT's enable_input_require_grads hook (on by
  // default there, scenario/peft_input_grads_key.h); without it the adapters of the
  // checkpointed layers would get no gradient, which is refused by key.
  const Program reentrant = build_program(load_scenario_text(
      y, "t.yaml", {{"checkpoint.policy", "full"}, {"checkpoint.reentrant", "true"}}));
  CHECK(live_at(reentrant, "backward_end").at(TensorKind::gradient) ==
        live_at(none, "backward_end").at(TensorKind::gradient));
  CHECK(error_of(y, {{"checkpoint.policy", "full"}, {"checkpoint.reentrant", "true"},
                     {"lora.input_require_grads", "false"}})
            .find("lora.input_require_grads: false with reentrant checkpointing") !=
        std::string::npos);
}

TEST_CASE("lora, master weights and 8-bit optimizer keys are checked", "[lora][optim]") {
  const std::string l = kLlama;
  CHECK(error_of(l + "lora: {targets: [q_proj]}\n").find("lora.rank: required") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8}\n").find("lora.targets: required") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_porj]}\n")
            .find("lora.targets: 'q_porj' is not a linear module of hf-llama") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_porj]}\n").find("did you mean 'q_proj'") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 0, targets: [q_proj]}\n").find("lora.rank") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_proj], dropout: 1.5}\n").find("lora.dropout") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_proj], base_dtype: bf16}\n")
            .find("lora.base_dtype: expected nf4") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_proj], adapter_dtype: int8}\n")
            .find("lora.adapter_dtype") != std::string::npos);
  CHECK(error_of(l + "lora: {rank: 8, targets: [q_proj], rnak: 3}\n").find("rank") != std::string::npos);
  CHECK(error_of("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 512}\n"
                 "batch: {micro_batch: 2, seq_len: 32}\nlora: {rank: 8, targets: [q_proj]}\n")
            .find("LoRA is modelled for the hf-llama and hf-gpt2 families") != std::string::npos);
  const Scenario comma = load_scenario_text(l, "t.yaml", {{"lora.rank", "8"}, {"lora.targets", "q_proj, v_proj"}});
  CHECK(comma.lora.targets == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(error_of(l + "optimizer: {type: adamw8bit, impl: fused}\n").find("optimizer.impl: adamw8bit") != std::string::npos);
  CHECK(error_of("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 512}\n"
                 "batch: {micro_batch: 2, seq_len: 32}\nprecision: {params: bf16, master_weights: true}\n"
                 "optimizer: {type: adamw, impl: cs336}\n")
            .find("precision.master_weights: the CS336 staff AdamW") != std::string::npos);
  CHECK(error_of(l + "precision: {params: bf16, master_weights: true}\noptimizer: {type: sgd}\n").empty());
}

TEST_CASE("Adafactor: factored second moment, rows + cols per matrix, full for vectors", "[optim]") {
  // Llama 2 7B: per layer q, k, v, o (4096 x 4096), gate, up (11008 x 4096), down
  // (4096 x 11008), two norms (4096); embed and lm_head (32000 x 4096); final norm.
  const Program p = build_program(load_scenario_text(
      "model: {preset: llama2-7b, attention: flash}\nbatch: {micro_batch: 1, seq_len: 128}\n"
      "precision: {params: bf16}\noptimizer: {type: adafactor}\ndevice: {capacity: 1TiB}\n", "t.yaml"));
  const uint64_t D = 4096, F = 11008, V = 32000;
  const uint64_t per_layer = 4 * (D + D) + 2 * (F + D) + (D + F) + 2 * D + 9;  // + 9 RMS
  const uint64_t expected = 4 * (32 * per_layer + 2 * (V + D) + D + 3);
  CHECK(live_at(p, "optimizer_end").at(TensorKind::optimizer_state) == expected);
  CHECK(error_of(std::string(kLlama) + "optimizer: {type: adafactor, impl: for-loop}\n")
            .find("optimizer.impl: adafactor") != std::string::npos);
  CHECK(error_of("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 512}\n"
                 "batch: {micro_batch: 2, seq_len: 32}\noptimizer: {type: adafactor}\n")
            .find("optimizer.type: Adafactor's factored state needs") != std::string::npos);
}

TEST_CASE("optimizers size fp32 adapters of a bf16 model by their own dtype", "[optim][lora]") {
  const std::string y = std::string(kLlama) + "precision: {params: bf16}\n"
                        "lora: {rank: 8, targets: [q_proj], adapter_dtype: fp32}\n";
  // q adapters: A 8x64 + B 64x8 per layer = 2048 fp32 elements (8 KiB) over 2 layers.
  const uint64_t n = 2 * (8 * 64 + 64 * 8);
  // AdamW: state like the fp32 adapters.
  CHECK(live_at(build_program(load_scenario_text(y, "t.yaml")), "optimizer_end")
            .at(TensorKind::optimizer_state) == 2 * 4 * n);
  // Master weights: an fp32 adapter is its own master (.float() returns it).
  const auto m = live_at(build_program(load_scenario_text(y, "t.yaml", {{"precision.master_weights", "true"}})),
                         "optimizer_end");
  CHECK(m.at(TensorKind::optimizer_state) == 2 * 4 * n);
  // bitsandbytes: each adapter matrix (512 elements) is under 4096: fp32 state.
  CHECK(live_at(build_program(load_scenario_text(y, "t.yaml", {{"optimizer.type", "adamw8bit"}})),
                "optimizer_end")
            .at(TensorKind::optimizer_state) == 2 * 4 * n);
  // Adafactor: A (8 x 64) rows 8 + cols 64; B (64 x 8) rows 64 + cols 8; + RMS each.
  CHECK(live_at(build_program(load_scenario_text(y, "t.yaml", {{"optimizer.type", "adafactor"}})),
                "optimizer_end")
            .at(TensorKind::optimizer_state) == 2 * 4 * (8 + 64 + 1 + 64 + 8 + 1));
}
