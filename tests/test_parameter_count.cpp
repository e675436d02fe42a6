// Parameter counts (sim/analysis/parameter_count.h) against the model cards, the presets shipped as
// config.json files, and what the simulated programs allocate per rank.
#include <catch2/catch.hpp>

#include <string>

#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

Scenario preset(const std::string& name, const std::string& rest = "") {
  return load_scenario_text("model: {preset: " + name + "}\nbatch: {seq_len: 64}\n" + rest, "t.yaml");
}

// Bytes of the parameter tensors still allocated when the program ends (what the rank
// keeps between steps).
uint64_t resident_parameter_bytes(const Program& program) {
  std::vector<bool> live(program.tensors.size(), false);
  for (const MemoryEvent& e : program.events) {
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter) live[e.tensor] = true;
    if (e.type == EventType::free) live[e.tensor] = false;
  }
  uint64_t bytes = 0;
  for (size_t t = 0; t < live.size(); ++t)
    if (live[t]) bytes += program.tensors[t].bytes;
  return bytes;
}

}  // namespace

TEST_CASE("parameter counts equal the model cards", "[parameters]") {
  const std::vector<std::pair<const char*, int64_t>> cards = {
      {"llama2-7b", 6'738'415'616},      {"llama2-13b", 13'015'864'320},
      {"llama2-70b", 68'976'648'192},    {"llama3-8b", 8'030'261'248},
      {"llama3.1-8b", 8'030'261'248},    {"llama3.1-70b", 70'553'706'496},
      {"llama3.1-405b", 405'853'388'800}, {"llama3.2-1b", 1'235'814'400},
      {"llama3.2-3b", 3'212'749'824},    {"mistral-7b", 7'241'732'096},
      {"qwen2.5-0.5b", 494'032'768},     {"qwen2.5-7b", 7'615'616'512},
      {"qwen2.5-14b", 14'770'033'664},   {"qwen2.5-32b", 32'763'876'352},
      {"qwen2.5-72b", 72'706'203'648},   {"qwen3-0.6b", 596'049'920},
      {"qwen3-8b", 8'190'735'360},       {"gemma2-2b", 2'614'341'888},
      {"gemma2-9b", 9'241'705'984},      {"gemma2-27b", 27'227'128'320},
      {"gemma3-1b", 999'885'952},        {"phi3-mini", 3'821'079'552},
      {"phi3-medium", 13'960'238'080},   {"olmo2-7b", 7'298'617'344},
      {"gpt2-small", 124'439'808},       {"gpt2-medium", 354'823'168},
      {"gpt2-large", 774'030'080},       {"gpt2-xl", 1'557'611'200},
      // mixture of experts (docs/moe.md): router, 3-D expert weights, q/k norms
      {"mixtral-8x7b", 46'702'792'704},  {"qwen3-30b-a3b", 30'532'122'624},
      {"olmoe-1b-7b", 6'919'161'856},
      // DeepSeek-V3 (docs/deepseek.md): latent attention, 256 routed + 1 shared expert; the
      // card's "671B total" (its 14B multi-token-prediction module is not built by transformers)
      {"deepseek-v3", 671'026'404'352},
      // DeepSeek-V2 / V2-Lite (docs/deepseek.md): the cards' "236B" and "15.7B" total
      {"deepseek-v2", 235'741'434'880},  {"deepseek-v2-lite", 15'706'484'224},
  };
  for (const auto& [name, count] : cards) {
    INFO(name);
    const ModelConfig* m = find_model_preset(name);
    REQUIRE(m != nullptr);
    CHECK(parameter_count(*m) == count);
  }
  // The layer / embedding / head split adds up.
  const ModelConfig& q = *find_model_preset("qwen2.5-7b");
  CHECK(embedding_parameter_count(q) + q.layers * layer_parameter_count(q) + head_parameter_count(q) ==
        7'615'616'512);
  // Megatron's GPT-3 175B: LayerNorms and biases, learned positions, tied head.
  CHECK(parameter_count(*find_model_preset("gpt3-175b")) == 174'604'259'328);
  // cs336 counts as Llama: untied head, RMSNorm, SwiGLU.
  CHECK(parameter_count(*find_model_preset("cs336-small")) ==
        2 * 10000 * 768 + 12 * (4 * 768 * 768 + 3 * 768 * 3072 + 2 * 768) + 768);
}

TEST_CASE("parameter counts follow the knobs", "[parameters]") {
  const std::string base = "model: {family: hf-llama, layers: 1, d_model: 8, heads: 2, d_ff: 16, vocab: 10";
  auto count = [&](const std::string& knobs) {
    return parameter_count(load_scenario_text(base + knobs + "}\nbatch: {seq_len: 4}\n", "t.yaml").model);
  };
  const int64_t llama = 2 * 80 + (4 * 64 + 3 * 8 * 16 + 2 * 8) + 8;
  CHECK(count("") == llama);
  CHECK(count(", qkv_bias: true") == llama + 24);
  CHECK(count(", o_bias: true") == llama + 8);
  CHECK(count(", mlp_bias: true") == llama + 2 * 16 + 8);
  CHECK(count(", qk_norm: head") == llama + 2 * 4);
  CHECK(count(", qk_norm: full") == llama + 8 + 8);
  CHECK(count(", norm_placement: sandwich") == llama + 2 * 8);
  CHECK(count(", norm: layer") == llama + 3 * 8);  // two layer norms and the final one get biases
  CHECK(count(", mlp: plain") == llama - 8 * 16);
  CHECK(count(", head_dim: 2") == llama - 4 * 64 + 4 * 32);
  CHECK(count(", tied_embeddings: true") == llama - 80);
  CHECK(count(", fused_qkv: true, fused_gate_up: true") == llama);
}

TEST_CASE("trainable parameters: the LoRA adapters when lora is on", "[parameters]") {
  const Scenario full = preset("llama2-7b");
  CHECK(trainable_parameter_count(full) == 6'738'415'616);
  // PEFT's print_trainable_parameters for Llama-2-7B: r 8 on q/v 4,194,304; r 64
  // all-linear 159,907,840.
  CHECK(trainable_parameter_count(preset("llama2-7b", "lora: {rank: 8, targets: [q_proj, v_proj]}\n")) ==
        4'194'304);
  CHECK(trainable_parameter_count(preset("llama2-7b", "lora: {rank: 64, targets: all-linear}\n")) ==
        159'907'840);
  // GPT-2 small, r 8 on c_attn: 12 x 8 x (768 + 2304).
  CHECK(trainable_parameter_count(preset("gpt2-small", "lora: {rank: 8, targets: c_attn}\n")) ==
        12 * 8 * (768 + 2304));
}

TEST_CASE("parameters per rank: FSDP shards and Megatron shards, as the programs hold them",
          "[parameters]") {
  // FSDP over 3 ranks: each unit padded to a multiple of 3; the rank keeps its shards.
  const Scenario fsdp = load_scenario_text(
      "model: {family: hf-llama, layers: 2, d_model: 16, heads: 2, d_ff: 40, vocab: 37}\n"
      "batch: {seq_len: 8}\nparallel: {data: 3, sharding: fsdp}\ndevice: {capacity: 1TiB}\n",
      "t.yaml");
  const int64_t layer = layer_parameter_count(fsdp.model);
  const int64_t root = embedding_parameter_count(fsdp.model) + head_parameter_count(fsdp.model);
  const int64_t expected = 2 * ((layer + 2) / 3) + (root + 2) / 3;
  CHECK(parameter_count_per_rank(fsdp) == expected);
  CHECK(parameter_count_per_rank(fsdp) * 3 >= parameter_count(fsdp.model));
  CHECK(resident_parameter_bytes(build_program(fsdp)) == static_cast<uint64_t>(expected) * 4);

  // Unsharded runs hold the whole model.
  const Scenario one = load_scenario_text(
      "model: {family: hf-llama, layers: 2, d_model: 16, heads: 2, d_ff: 40, vocab: 37}\n"
      "batch: {seq_len: 8}\ndevice: {capacity: 1TiB}\n",
      "t.yaml");
  CHECK(parameter_count_per_rank(one) == parameter_count(one.model));
  CHECK(resident_parameter_bytes(build_program(one)) == static_cast<uint64_t>(parameter_count(one.model)) * 4);

  // Megatron, tensor 2 x pipeline 2: the reported stage's shard (stage 0: the embeddings).
  const Scenario mega = load_scenario_text(
      "model: {family: megatron, layers: 4, d_model: 32, heads: 4, d_ff: 64, vocab: 300, context_length: 16}\n"
      "batch: {seq_len: 16, grad_accum: 2}\nprecision: {params: bf16}\n"
      "parallel: {tensor: 2, pipeline: 2}\ndevice: {capacity: 1TiB}\n",
      "t.yaml");
  const Program program = build_program(mega);
  const int stage = program.rank.pipeline_stage;
  CHECK(resident_parameter_bytes(program) == static_cast<uint64_t>(parameter_count_per_rank(mega, stage)) * 2);
  CHECK(parameter_count_per_rank(mega, 0) != parameter_count_per_rank(mega, 1));
}

TEST_CASE("LoRA on an architecture with fused projections is refused by key", "[parameters]") {
  // Phi-3 fuses q/k/v and gate/up: PEFT's all-linear would adapt qkv_proj and gate_up_proj,
  // which memsim does not model, so the scenario is refused rather than simulated without them.
  CHECK_THROWS_WITH(build_program(load_scenario_text(
                        "model: {preset: phi3-mini, layers: 2}\nbatch: {seq_len: 16}\n"
                        "lora: {rank: 8, targets: all-linear}\ndevice: {capacity: 1TiB}\n", "t.yaml")),
                    Catch::Contains("model.fused_qkv"));
}
