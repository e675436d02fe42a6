// Which experts implementation memsim models when model.moe.experts_implementation is absent
// (docs/moe.md "Which experts implementation runs"; scenario/moe_keys.cpp): transformers 5.x's
// own default, grouped_mm. PreTrainedModel.__init__ resolves config._experts_implementation
// through get_correct_experts_implementation(None) -> "grouped_mm" whenever the model's
// modeling file applies @use_experts_implementation (every MoE row memsim has), with no
// device, dtype or torch-version condition (huggingface/transformers 040ba146
// src/transformers/modeling_utils.py). Below compute capability 8.0 (the V100 presets) the
// grouped GEMM runs transformers' own grouped_mm_fallback op, which memsim does not model:
// refused by key. Checked by hand here:
//  - the resolved implementation per (model.transformers given or not, device preset, dtype,
//    autocast) and per row (Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE, DeepSeek-V2/V3);
//  - the key, in the file or by --set, wins; Megatron-Core's layers take no default;
//  - a defaulted run builds the same program as one that writes grouped_mm;
//  - the V100 refusal (defaulted and written), grouped_mm under torch.compile with non-bf16
//    weights refused (transformers' fallback op too), MoE rows under generate() refused by
//    step.kind (v4.45's loop never ran 5.x's MoE code), target_parameters' refusal naming the
//    default;
//  - `memsim run` reports it: the `moe experts` fact and --json moe.experts_implementation.
// The eager-run comparisons (CPU fixtures, the H100/H200 runs, which passed
// experts_implementation="eager") are the other MoE tests, whose inputs now say eager.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;
using graph::ExpertsImpl;

namespace {

// A small Qwen3-MoE-like model (hf-llama with an MoE block), no experts_implementation.
const std::string kModel =
    "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
    "  vocab: 256\n  context_length: 64\n  attention: eager\n"
    "  moe: {experts: 4, top_k: 2, expert_d_ff: 64}\n"
    "batch:\n  micro_batch: 2\n  seq_len: 32\n";

using Sets = std::vector<std::pair<std::string, std::string>>;

ExpertsImpl impl_of(const std::string& yaml, const Sets& sets = {}) {
  return load_scenario_text(yaml, "moe.yaml", sets).model.arch.moe.impl;
}

std::string error_of(const std::string& yaml, const Sets& sets = {}) {
  return memsim_test::scenario_error(yaml, "moe.yaml", sets);
}

std::string preset_yaml(const std::string& model_preset, const std::string& device) {
  return "model:\n  preset: " + model_preset + "\nbatch:\n  seq_len: 64\ndevice:\n  " + device + "\n";
}

uint64_t peak_of(const Scenario& s) {
  const Program p = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(p, s.allocator, device, ExecuteOptions{});
  return analyze(p, t).peak_allocated;
}

}  // namespace

TEST_CASE("MoE experts implementation: transformers 5.x's default grouped_mm when none is given",
          "[moe][moe-default]") {
  // Every device preset at or above compute capability 8.0, and a device described by hand.
  for (const char* device : {"preset: h100-80gb", "preset: h200", "preset: a100-80gb", "preset: a100-40gb",
                             "preset: b200", "preset: rtx-4090", "preset: mi300x", "capacity: 80GiB"}) {
    INFO(device);
    // Whatever the dtype and autocast: get_correct_experts_implementation has no dtype condition.
    for (const Sets& precision : {Sets{{"precision.params", "bf16"}},
                                  Sets{{"precision.params", "fp32"}},
                                  Sets{{"precision.params", "fp32"}, {"precision.autocast", "bf16"}},
                                  Sets{{"precision.params", "fp16"}}}) {
      Sets sets = precision;
      sets.emplace_back("device." + std::string(device).substr(0, std::string(device).find(':')),
                        std::string(device).substr(std::string(device).find(':') + 2));
      CHECK(impl_of(kModel, sets) == ExpertsImpl::grouped_mm);
      // model.transformers: 5 says what the MoE rows are anyway (5.x's code throughout).
      sets.emplace_back("model.transformers", "5");
      CHECK(impl_of(kModel, sets) == ExpertsImpl::grouped_mm);
    }
  }
  // The MoE rows from their config.json presets: Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V2/V3.
  for (const char* preset : {"qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b", "deepseek-v2-lite", "deepseek-v3"}) {
    INFO(preset);
    CHECK(impl_of(preset_yaml(preset, "preset: h100-80gb")) == ExpertsImpl::grouped_mm);
  }
  // A dense model keeps the struct's value (no experts: nothing runs it).
  CHECK(load_scenario_text("model:\n  preset: llama3.2-1b\nbatch:\n  seq_len: 64\n", "d.yaml").model.arch.moe.impl ==
        ExpertsImpl::eager);
}

TEST_CASE("MoE experts implementation: the key wins, in the file or by --set", "[moe][moe-default]") {
  const std::string eager = "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 64}\n";
  std::string with_eager = kModel;
  with_eager.replace(with_eager.find("  moe:"), with_eager.find("batch:") - with_eager.find("  moe:"), eager);
  CHECK(impl_of(with_eager) == ExpertsImpl::eager);
  CHECK(impl_of(kModel, {{"model.moe.experts_implementation", "eager"}}) == ExpertsImpl::eager);
  CHECK(impl_of(kModel, {{"model.moe.experts_implementation", "batched_mm"}}) == ExpertsImpl::batched_mm);
  CHECK(impl_of(kModel, {{"model.moe.experts_implementation", "grouped_mm"}}) == ExpertsImpl::grouped_mm);
  // Over a preset's config.json (the model.moe mapping merged with the config's).
  CHECK(impl_of("model:\n  preset: qwen3-30b-a3b\n  moe: {experts_implementation: eager}\nbatch:\n  seq_len: 64\n") ==
        ExpertsImpl::eager);
  // Still one of the three names.
  CHECK(error_of(kModel, {{"model.moe.experts_implementation", "loop"}}).find("model.moe.experts_implementation") !=
        std::string::npos);
}

TEST_CASE("MoE experts implementation: a defaulted run is the grouped_mm run", "[moe][moe-default]") {
  const Scenario defaulted = load_scenario_text(kModel + "precision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n", "m.yaml");
  const Scenario grouped = load_scenario_text(kModel + "precision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n", "m.yaml",
                                              {{"model.moe.experts_implementation", "grouped_mm"}});
  const Scenario eager = load_scenario_text(kModel + "precision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n", "m.yaml",
                                            {{"model.moe.experts_implementation", "eager"}});
  const Program a = build_program(defaulted), b = build_program(grouped), c = build_program(eager);
  REQUIRE(a.events.size() == b.events.size());
  bool same = true;
  for (size_t i = 0; i < a.events.size(); ++i)
    same = same && a.events[i].type == b.events[i].type && a.events[i].bytes == b.events[i].bytes;
  CHECK(same);
  CHECK(peak_of(defaulted) == peak_of(grouped));
  // The eager loop is another program (its per-expert gathers, SelectBackward0's zeros).
  CHECK(c.events.size() != a.events.size());
}

TEST_CASE("MoE experts implementation: Megatron-Core's layers take no transformers default", "[moe][moe-default]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/mixtral-8x7b-megatron-moe-ep8.yaml");
  REQUIRE(s.model.arch.moe.experts > 0);
  CHECK(s.model.arch.moe.impl == ExpertsImpl::eager);  // the struct's value, unused by megatron_moe
}

TEST_CASE("MoE experts implementation: grouped_mm on a V100 is refused by key", "[moe][moe-default]") {
  const std::string v100 = kModel + "precision:\n  params: fp16\ndevice:\n  preset: v100-32gb\n";
  // Defaulted: blamed on device.preset's line (the file has no experts_implementation), naming
  // the key and its modelled choices.
  const std::string e = error_of(v100);
  INFO(e);
  CHECK(e.find("moe.yaml:18: model.moe.experts_implementation: not given, so transformers 5.x's default "
               "grouped_mm") == 0);
  CHECK(e.find("v100-32gb (compute capability 7.0)") != std::string::npos);
  CHECK(e.find("grouped_mm_fallback") != std::string::npos);
  CHECK(e.find("set model.moe.experts_implementation: eager or batched_mm") != std::string::npos);
  // Written: blamed on the key (--set here).
  const std::string g = error_of(v100, {{"model.moe.experts_implementation", "grouped_mm"}});
  INFO(g);
  CHECK(g.find("--set model.moe.experts_implementation: grouped_mm: on device.preset v100-32gb") == 0);
  // The loop and batched_mm run on it.
  CHECK(error_of(v100, {{"model.moe.experts_implementation", "eager"}}).empty());
  CHECK(error_of(v100, {{"model.moe.experts_implementation", "batched_mm"}}).empty());
  CHECK(error_of(kModel + "device:\n  preset: v100-16gb\n", {{"model.moe.experts_implementation", "eager"}}).empty());
  // Every other preset takes the default.
  CHECK(error_of(kModel + "device:\n  preset: a100-40gb\n").empty());
}

TEST_CASE("MoE experts implementation: grouped_mm under torch.compile needs bf16 weights", "[moe][moe-default]") {
  // _can_use_grouped_mm: compiling with non-bf16 weights sends the grouped GEMM to
  // transformers::grouped_mm_fallback (not modelled); bf16 weights keep torch's.
  const std::string compiled = kModel + "step:\n  kind: train\n  compile: true\ndevice:\n  capacity: 80GiB\n";
  for (const Sets& precision : {Sets{{"precision.params", "fp32"}},
                                Sets{{"precision.params", "fp32"}, {"precision.autocast", "bf16"}},
                                Sets{{"precision.params", "fp16"}}}) {
    const std::string e = error_of(compiled, precision);
    INFO(e);
    CHECK(e.find("moe.yaml:17: model.moe.experts_implementation: not given, so transformers 5.x's default "
                 "grouped_mm") == 0);  // blamed on step.compile's line
    CHECK(e.find("under torch.compile (step.compile)") != std::string::npos);
    Sets written = precision;
    written.emplace_back("model.moe.experts_implementation", "grouped_mm");
    CHECK(error_of(compiled, written).find("--set model.moe.experts_implementation: grouped_mm: under torch.compile") == 0);
    written.back().second = "eager";
    CHECK(error_of(compiled, written).empty());
  }
  CHECK(error_of(compiled, {{"precision.params", "bf16"}}).empty());
}

TEST_CASE("MoE rows under generate() are refused by step.kind, whatever the experts implementation", "[moe][moe-default]") {
  // memsim's generate() loop is v4.45's; the MoE rows are 5.x's code (and newer releases switch
  // grouped_mm to batched_mm for the decode stage): scenario/generate_keys.cpp refuses the pairing.
  const std::string gen =
      "model:\n  preset: qwen3-30b-a3b\nbatch:\n  micro_batch: 1\nprecision:\n  params: bf16\n"
      "step:\n  kind: generate\ngenerate:\n  prompt_len: 32\n  new_tokens: 4\ndevice:\n  preset: h200\n";
  for (const char* impl : {"", "grouped_mm", "eager", "batched_mm"}) {
    const std::string e = *impl ? error_of(gen, {{"model.moe.experts_implementation", impl}}) : error_of(gen);
    INFO(impl << ": " << e);
    CHECK(e.find("moe.yaml:8: step.kind: step.kind generate models transformers v4.45's generate() loop; "
                 "memsim's MoE rows are transformers 5.x's code") == 0);
  }
}

TEST_CASE("MoE experts implementation: target_parameters takes the default, grouped_mm", "[moe][moe-default]") {
  // PEFT's ParamWrapper wraps whichever experts forward transformers dispatches to (docs/moe.md
  // "Under batched_mm and grouped_mm"): no refusal, the default is modelled.
  const std::string lora = "lora:\n  rank: 4\n  target_parameters: [gate_up_proj]\n";
  CHECK(error_of(kModel + lora).empty());
  CHECK(impl_of(kModel + lora) == ExpertsImpl::grouped_mm);
  for (const char* impl : {"eager", "batched_mm", "grouped_mm"})
    CHECK(error_of(kModel + lora, {{"model.moe.experts_implementation", impl}}).empty());
}

TEST_CASE("memsim run reports the experts implementation it modelled", "[moe][moe-default][cli]") {
  memsim_test::TempDir dir("memsim_moe_default");
  const auto path = dir.write("m.yaml", kModel + "precision:\n  params: bf16\ndevice:\n  preset: h100-80gb\n");
  const std::string q = "run '" + path.string() + "'";
  const memsim_test::CliResult text = memsim_test::run_memsim(q, dir);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("moe experts  grouped_mm (model.moe.experts_implementation; transformers 5.x's default "
                      "when a run passes none: grouped_mm)") != std::string::npos);
  const memsim_test::CliResult j1 = memsim_test::run_memsim(q + " --json -", dir);
  REQUIRE(j1.status == 0);
  CHECK(nlohmann::json::parse(j1.out)["moe"]["experts_implementation"] == "grouped_mm");
  const memsim_test::CliResult j2 = memsim_test::run_memsim(q + " --set model.moe.experts_implementation=eager --json -", dir);
  REQUIRE(j2.status == 0);
  CHECK(nlohmann::json::parse(j2.out)["moe"]["experts_implementation"] == "eager");
  // The V100 refusal from the CLI: exit 1, the key named.
  const memsim_test::CliResult v = memsim_test::run_memsim(q + " --set device.preset=v100-32gb", dir);
  CHECK(v.status == 1);
  CHECK(v.err.find("model.moe.experts_implementation") != std::string::npos);
}
