// QLoRA's dtypes (issue #15 item 5): lora.compute_dtype (bitsandbytes' Linear4bit compute
// dtype) and lora.prepare_kbit over a 16-bit load (PEFT's fp32 upcast; docs/qlora-prepare.md):
//  - against real PyTorch: tests/data/torch_cpu_qlora_dtype/*.json, training steps of the dense
//    Llama stand-in with Linear4bit's casts and PEFT's lora.bnb.Linear4bit written out
//    (tools/fixtures/gen_qlora_dtype_fixtures.py, torch 1.13 CPU): forward-end bytes by kind
//    and by layer, every layer's forward allocations in order, the step's peak, and the
//    prepare loop's alloc/free sequence at setup;
//  - the default (no key) is the compute dtype memsim always used: the same program;
//  - refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario/lora_compute_dtype_key.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "test_paths.h"
#include "torch_fixture_test_support.h"

using namespace memsim;
using memsim_test::scenario_error;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_qlora_dtype";
const std::string kPrepareOp = "prepare_model_for_kbit_training (param.data.to(float32))";

std::string yaml_list(const nlohmann::json& names) {
  std::string y = "[";
  for (size_t i = 0; i < names.size(); ++i) y += (i ? ", " : "") + names[i].get<std::string>();
  return y + "]";
}

// The fixture's run: its shape and load dtype (precision.params), the 4-bit base with fp32
// adapters, the compute dtype and prepare_kbit as keys (prepare_kbit alone sets the
// reentrant checkpointing and the embedding hook the stand-in applies).
Scenario scenario_for(const nlohmann::json& c) {
  const nlohmann::json& l = c["lora"];
  std::string y = memsim_test::fixture_shape_yaml(c);
  y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
       std::to_string(l["alpha"].get<int>()) + "\n  base_dtype: nf4\n  adapter_dtype: fp32\n";
  y += "  targets: " + yaml_list(l["targets"]) + "\n";
  y += "  compute_dtype: " + c["compute_dtype"].get<std::string>() + "\n";
  if (c.value("prepare_kbit", false)) y += "  prepare_kbit: true\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "qlora-dtype-fixture.yaml");
}

// The setup's prepare loop as (kind, bytes): each cast's fp32 allocation, then the 16-bit
// storage's free (named by the loop's op).
std::vector<std::pair<std::string, uint64_t>> prepare_events(const Program& p) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::free || p.str(e.op) != kPrepareOp) continue;
    REQUIRE(i > 0);
    const MemoryEvent& a = p.events[i - 1];
    REQUIRE(a.type == EventType::alloc);
    out.emplace_back("alloc", a.bytes);
    out.emplace_back("free", p.tensors[e.tensor].bytes);
  }
  return out;
}

using memsim_test::measured_sum;

}  // namespace

TEST_CASE("QLoRA's compute dtype and prepare_kbit over a 16-bit load match real PyTorch (CPU fixtures)",
          "[qlora-dtype]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 6);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const nlohmann::json& c = fx["config"];
    const Scenario scenario = scenario_for(c);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
    memsim_test::check_forward_allocs_by_layer(fx, program);
    // The step's peak, exactly (in every row, torch 1.13's out-of-place grad adds,
    // tests/torch_fixture_test_support.h, do not reach it).
    CHECK(memsim_test::walk(program).step_peak == fx["peak_live_bytes"].get<uint64_t>());
    // Every 4-bit call dequantises: torch's two `empty`s (absmax, weight) per call, plus the
    // weight's `.to(compute dtype)` copy when the load dtype differs; memsim records them
    // all, and the output, under matmul_4bit.
    const bool weight_cast = c["dtype"] != c["compute_dtype"];
    uint64_t real_empty = 0, sim_fw = 0;
    for (const auto& ev : fx["events"])
      if (ev[0] == "alloc" && ev[3] == "forward" && ev[1] == "empty") ++real_empty;
    measured_sum(program, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && program.str(e.op) == "matmul_4bit";
    }, &sim_fw);
    CHECK(real_empty > 0);
    CHECK(sim_fw == real_empty / 2 * (weight_cast ? 4 : 3));
    // prepare_model_for_kbit_training's loop at setup: alloc fp32, free the 16-bit storage,
    // parameter by parameter (embedding, the norms, lm_head), then empty_cache.
    if (fx.contains("prepare_events")) {
      std::vector<std::pair<std::string, uint64_t>> real;
      for (const auto& ev : fx["prepare_events"]) real.emplace_back(ev[0].get<std::string>(), ev[1].get<uint64_t>());
      CHECK(prepare_events(program) == real);
      CHECK(real.size() == 2 * (2 + 2 * c["layers"].get<size_t>() + 1));
      size_t empties = 0;
      for (const MemoryEvent& e : program.events) empties += e.type == EventType::empty_cache;
      CHECK(empties == 1);
    } else {
      CHECK(prepare_events(program).empty());
    }
  }
}

namespace {
const std::string kModel =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 160, vocab: 128, "
    "attention: eager}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "optimizer: {type: adamw, impl: foreach}\n"
    "device: {capacity: 1GiB}\n";

std::string yaml(const std::string& params, const std::string& lora, const std::string& rest = "") {
  return kModel + "precision: {params: " + params + "}\n" +
         "lora: {rank: 4, alpha: 8, targets: all-linear, base_dtype: nf4" + lora + "}\n" + rest;
}

bool same_events(const Program& a, const Program& b) {
  if (a.events.size() != b.events.size()) return false;
  for (size_t i = 0; i < a.events.size(); ++i)
    if (a.events[i].type != b.events[i].type || a.events[i].bytes != b.events[i].bytes ||
        a.events[i].phase != b.events[i].phase)
      return false;
  return true;
}
}  // namespace

TEST_CASE("lora.compute_dtype defaults to precision.params: the same program", "[qlora-dtype]") {
  for (const char* p : {"bf16", "fp32"}) {
    INFO(p);
    const Program plain = build_program(load_scenario_text(yaml(p, ""), "k.yaml"));
    const Program keyed = build_program(load_scenario_text(yaml(p, std::string(", compute_dtype: ") + p), "k.yaml"));
    CHECK(same_events(plain, keyed));
  }
  // A different compute dtype changes it.
  const Program fp32 = build_program(load_scenario_text(yaml("fp32", ""), "k.yaml"));
  const Program bf16c = build_program(load_scenario_text(yaml("fp32", ", compute_dtype: bf16"), "k.yaml"));
  CHECK_FALSE(same_events(fp32, bf16c));
  // The key, read.
  const Scenario s = load_scenario_text(yaml("bf16", ", compute_dtype: fp32, prepare_kbit: true"), "k.yaml");
  CHECK(s.lora.compute_dtype == std::optional<DType>(DType::fp32));
  CHECK(s.lora.prepare_kbit);
  CHECK(kbit_model_dtype(s) == DType::fp32);
  CHECK(kbit_compute_dtype(s) == DType::fp32);
}

TEST_CASE("prepare_kbit over a bf16 load: fp32 parameters but the Params4bit, upcast at setup", "[qlora-dtype]") {
  const Scenario s = load_scenario_text(yaml("bf16", ", compute_dtype: bf16, prepare_kbit: true"), "k.yaml");
  const Program p = build_program(s);
  const Program f = build_program(load_scenario_text(yaml("fp32", ", compute_dtype: bf16, prepare_kbit: true"), "k.yaml"));
  // After the upcast the parameters are those of the fp32 load; the quantised weights
  // dequantise in bf16 (the load dtype) instead of fp32 and then bf16.
  const memsim_test::Walk wp = memsim_test::walk(p), wf = memsim_test::walk(f);
  CHECK(wp.forward_end_by_kind.at(TensorKind::parameter) == wf.forward_end_by_kind.at(TensorKind::parameter));
  // Embedding 128 x 64, 5 norms of 64, lm_head 64 x 128: cast one by one.
  const auto ev = prepare_events(p);
  REQUIRE(ev.size() == 2 * 7);
  CHECK(ev.front() == std::make_pair(std::string("alloc"), uint64_t{128 * 64 * 4}));
  CHECK(ev[1] == std::make_pair(std::string("free"), uint64_t{128 * 64 * 2}));
  CHECK(ev.back() == std::make_pair(std::string("free"), uint64_t{128 * 64 * 2}));
  CHECK(prepare_events(f).empty());  // an fp32 load casts nothing
}

TEST_CASE("lora.compute_dtype refuses what it does not model, by key", "[qlora-dtype]") {
  const std::string no_nf4 = scenario_error(
      kModel + "precision: {params: bf16}\nlora: {rank: 4, targets: all-linear, compute_dtype: bf16}\n", "k.yaml");
  CHECK_THAT(no_nf4, Catch::Contains("k.yaml:"));
  CHECK_THAT(no_nf4, Catch::Contains("lora.compute_dtype"));
  CHECK_THAT(no_nf4, Catch::Contains("nf4"));
  CHECK_THAT(scenario_error(yaml("bf16", ", compute_dtype: int8"), "k.yaml"), Catch::Contains("lora.compute_dtype"));
  // Qwen2's q/k/v biases: Linear4bit would cast them at the first call.
  const std::string qwen2 =
      "model: {family: hf-llama, architecture: qwen2, layers: 2, d_model: 64, heads: 4, d_ff: 160, "
      "vocab: 128, attention: eager}\nbatch: {micro_batch: 2, seq_len: 32}\ndevice: {capacity: 1GiB}\n"
      "precision: {params: bf16}\n";
  const std::string biased = scenario_error(
      qwen2 + "lora: {rank: 4, targets: all-linear, base_dtype: nf4, compute_dtype: fp32}\n", "q.yaml");
  CHECK_THAT(biased, Catch::Contains("lora.compute_dtype"));
  CHECK_THAT(biased, Catch::Contains("bias"));
  const std::string prepared = scenario_error(
      qwen2 + "lora: {rank: 4, targets: all-linear, base_dtype: nf4, prepare_kbit: true}\n", "q.yaml");
  CHECK_THAT(prepared, Catch::Contains("lora.prepare_kbit"));
  // fp32 q/k/v after the upcast: no flash / cuDNN kernel.
  const std::string flash = scenario_error(
      yaml("bf16", ", prepare_kbit: true").replace(kModel.find("eager"), 5, "flash"), "k.yaml");
  CHECK_THAT(flash, Catch::Contains("model.attention"));
  CHECK_THAT(flash, Catch::Contains("fp32"));
  CHECK_NOTHROW(load_scenario_text(yaml("fp32", ", prepare_kbit: true").replace(kModel.find("eager"), 5, "flash"), "k.yaml"));
  // Same dtypes: nothing to cast, modelled.
  CHECK_NOTHROW(load_scenario_text(qwen2 + "lora: {rank: 4, targets: all-linear, base_dtype: nf4, compute_dtype: bf16}\n", "q.yaml"));
}
