// transformers.Trainer itself on a GPU (tools/gpu/measure_trainer.py; docs/hf-trainer.md,
// "Trainer itself") against memsim: transformers 5.17 Qwen2ForCausalLM from config (4 x d1024
// MHA, vocab 32000), Trainer(bf16=True, gradient_checkpointing=True) with 5.17's defaults
// (SDPA, use_reentrant=False, adamw_torch_fused, max_grad_norm 1.0), batch 4 x 1024, on an
// H200 with torch 2.11.0+cu130 (tests/data/gpu/trainer/trainer_runs.json and
// trainer_snapshots.tar.xz, unpacked by CMake).
//
//  - trainer_bf16_sdpa_gc (full fine-tune) and trainer_bf16_sdpa_gc_noclip (max_grad_norm 0)
//    against tests/data/gpu/hft/hft_bf16_sdpa_gc.yaml, the scenario of the replicated
//    training_step (tests/test_gpu_hft_runs.cpp), predicted blind before this run:
//    Trainer.train() around the same step adds nothing memsim would have to model.
//  - trainer_lora_bf16_sdpa_gc (PEFT 0.21.0 LoRA r16 q/v, dropout 0) against
//    tests/data/gpu/trainer/trainer_lora_bf16_sdpa_gc.yaml. NOT BLIND: memsim refused LoRA
//    under autocast when the run was made; the model (graph/models/lora_autocast.cpp and the
//    frozen weights' uncached casts, graph/autocast.cpp) was written after the measurement,
//    from PEFT's and torch's sources, and this compares it with the run.
//
// Tolerances: 0.1% allocated, 0.5% reserved. The full fine-tune is 1,051,648 B (0.03%) under
// the run (a Trainer-side allocation memsim does not make; cause not found), which 0.1%
// covers; reserved is exact for all three runs today, 0.5% leaves one 2 MiB segment of
// slack on 3.2-3.8 GB. Allocation by allocation Trainer.train() differs from the replicated
// step (accelerate's fp32 logits copy and other, off-peak, allocations: pinned below).
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/trainer/trainer_runs.json";
const std::string kSnapshots = MEMSIM_BINARY_DIR + "/gpu_trainer_snapshots";  // unpacked by CMake

// Each run's scenario (a path from the source folder).
std::string scenario_of(const std::string& run) {
  if (run == "trainer_lora_bf16_sdpa_gc") return "tests/data/gpu/trainer/trainer_lora_bf16_sdpa_gc.yaml";
  return "tests/data/gpu/hft/hft_bf16_sdpa_gc.yaml";
}

}  // namespace

TEST_CASE("transformers.Trainer itself (bf16, checkpointing, PEFT LoRA) on a GPU against memsim",
          "[trainer][gpu]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  REQUIRE(runs["results"].size() == 3);
  std::printf("\ntransformers.Trainer on an H200 (torch 2.11, transformers 5.17, peft 0.21.0): "
              "measured step peaks, real vs memsim\n");
  memsim_test::print_comparison_header();
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    // The run is what the scenario says: checkpointing non-reentrant, fused AdamW, bf16.
    REQUIRE(r["checkpointing"].size() >= 1);  // the distinct keyword sets of the checkpointed layers
    CHECK(r["checkpointing"][0].get<std::string>().find("'use_reentrant': False") != std::string::npos);
    CHECK(r["training_args"]["optim"].get<std::string>() == "OptimizerNames.ADAMW_TORCH_FUSED");
    CHECK(r["training_args"]["bf16"].get<std::string>() == "True");
    CHECK(r["spec"]["lora"].get<bool>() == (name == "trainer_lora_bf16_sdpa_gc"));
    const std::string path = std::string(MEMSIM_SOURCE_DIR + "/") + scenario_of(name);
    const memsim_test::RunPrediction now = memsim_test::simulate_run(path);
    const uint64_t real_alloc = r["measured_step_peak_allocated"].get<uint64_t>();
    const uint64_t real_reserved = r["measured_step_peak_reserved"].get<uint64_t>();
    memsim_test::print_comparison_row(name, now.allocated, real_alloc, now.reserved, real_reserved,
                                      name == "trainer_lora_bf16_sdpa_gc" ? "(modelled after the run)" : "");
    // The mark the script took right after the measured optimizer.step() (before Trainer's
    // zero_grad): memsim's optimizer_end (weights, grads, AdamW state).
    const nlohmann::json& end = r["marks"]["optimizer_step_1"];
    REQUIRE(now.marks.count("optimizer_end") == 1);
    memsim_test::print_comparison_row(name + " @optimizer step", now.marks.at("optimizer_end").first,
                                      end["allocated_bytes.all.current"].get<uint64_t>(),
                                      now.marks.at("optimizer_end").second,
                                      end["reserved_bytes.all.current"].get<uint64_t>());
    const double ea = memsim_test::rel(now.allocated, real_alloc);
    const double er = memsim_test::rel(now.reserved, real_reserved);
    INFO("allocated " << 100 * ea << "%, reserved " << 100 * er << "%");
    CHECK(std::abs(ea) <= 0.001);
    CHECK(std::abs(er) <= 0.005);
  }
  // The full fine-tune's two runs are the same memory (clipping's 0-d norms are below the
  // allocator's rounding); LoRA's frozen base lowers the peak by its grads and AdamW state.
  const auto peak = [&](size_t i) { return runs["results"][i]["measured_step_peak_allocated"].get<uint64_t>(); };
  CHECK(peak(0) == peak(1));
  CHECK(peak(2) < peak(0));
  // The snapshots: each replays through the allocator emulator, and every allocation of at
  // least 1 MiB memsim makes is one the run made (by size, ignoring order).
  REQUIRE(std::filesystem::is_directory(kSnapshots));
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const Snapshot snap = read_snapshot_file(kSnapshots + "/" + name + ".pickle");
    const ReplayReport rep = replay_snapshot(snap);
    CHECK(rep.mismatches == 0);
    CHECK(rep.final_layout_match);
    CHECK(rep.peak_allocated_bytes == r["whole_run_peak_allocated"].get<uint64_t>());
  }
  // Allocation by allocation (>= 1 MiB) Trainer.train() is NOT the replicated step: it makes
  // two more 524,288,000 B tensors (one per step: accelerate's convert_outputs_to_fp32, the
  // fp32 copy of the bf16 logits, dead before backward, so off the peak) and eight 17,039,616 B
  // backward-thread allocations, and the 8/16 MiB counts differ (causes not found). Pinned
  // here, so that a change in either shows.
  for (const char* name : {"trainer_bf16_sdpa_gc", "trainer_lora_bf16_sdpa_gc"}) {
    INFO(name);
    const Program program = build_program(load_scenario(std::string(MEMSIM_SOURCE_DIR + "/") + scenario_of(name)));
    const auto diff = memsim_test::alloc_count_difference(
        memsim_test::large_allocs(read_snapshot_file(kSnapshots + "/" + name + ".pickle")),
        memsim_test::large_allocs(program), 1 << 20);
    INFO(memsim_test::describe_difference(diff));
    REQUIRE(diff.count(524288000) == 1);
    CHECK(diff.at(524288000) == 2);
    REQUIRE(diff.count(17039616) == 1);
    CHECK(diff.at(17039616) == 8);
  }
}

TEST_CASE("PEFT LoRA under autocast: frozen base weights are cast at every use, adapters cached",
          "[trainer][lora-autocast]") {
  // The rule the LoRA run rests on (torch's cached_cast: only a leaf that requires grad is
  // cached): without it the frozen weights' bf16 copies would sit in the cache through the
  // forward. A scenario that breaks the rule or the adapter path changes these numbers.
  const std::string path = MEMSIM_SOURCE_DIR + "/tests/data/gpu/trainer/trainer_lora_bf16_sdpa_gc.yaml";
  const Scenario s = load_scenario(path);
  const memsim_test::RunPrediction lora = memsim_test::simulate_run(path);
  CHECK(lora.allocated == 2277692928ull);
  CHECK(lora.reserved == 3166699520ull);
  // The adapters are trainable (r16 x (1024 + 1024) x 2 modules x 4 layers), the rest frozen.
  CHECK(s.lora.rank == 16);
  // Refused by key: what the adapter path under autocast does not model.
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"lora.dropout", "0.1"},
                                   {"lora.adapter_dtype", "bf16"},
                                   {"lora.base_dtype", "nf4"}}) {
    INFO(key);
    try {
      (void)build_program(load_scenario(path, {{key, value}}));
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
    }
  }
}
