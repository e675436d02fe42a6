// memsim's models of HF Trainer's and PEFT's defaults (issue #16 item 5; docs/hf-trainer.md,
// docs/autocast.md) against real runs on a GPU: tools/gpu/measure_hft.py runs transformers'
// own Qwen2ForCausalLM (from_config, 4 layers, hidden 1024, batch 4 x 1024) under HF
// Trainer's training_step, replicated: bf16 autocast over fp32 weights with SDPA, with
// gradient_checkpointing_enable() (transformers' default kwargs and use_reentrant=True),
// PEFT LoRA r 16 on q/v with checkpointing and PEFT's enable_input_require_grads hook, and
// LoRA under FSDP2 on the fake process group (world 8). Its scenarios are
// tests/data/gpu/hft/NAME.yaml and memsim's blind predictions
// tests/data/gpu/hft_predictions.json, both written by tools/gpu/predict_hft.py and
// committed before anything was measured.
//
// 1. Every scenario still loads and simulates, and every prediction in the file (and the
//    flipped-reentrancy alternative of the runs that take transformers' default kwargs)
//    equals what memsim predicts now. Always runs.
// 2. Against the measurement (tests/data/gpu/hft/hft_runs.json, the script's output,
//    committed by whoever ran it): SKIPPED (ctest: not run) while the file is absent. Once
//    it is there: a table of real vs memsim (measured step, whole run, marks); every run
//    measured or its failure on record; the run is the configuration the prediction
//    assumed (on a GPU, not a dry run; parameter and trainable counts; checkpointing as
//    the scenario says, the reentrancy the run recorded choosing between the scenario and
//    its flipped alternative; PEFT's hook where the scenario has lora.input_require_grads;
//    SDPA able to use the fused kernel memsim models); the measured step's peak allocated
//    and reserved within the tolerance below (FAILS beyond it). With the snapshots
//    committed too (hft_snapshots.tar.xz, unpacked by CMake) each replays through the
//    allocator emulator with no mismatch.
//
// Tolerances, stated before the measurement (2026-11-27, 22:10 UTC), from what each model
// leaves out:
//  - bf16 autocast + SDPA, with or without checkpointing (hft_bf16_sdpa*, MHA): 0.5%
//    allocated, 2% reserved. Autocast's casts, SDPA's casts and both checkpoint kinds are
//    exact on CPU fixtures (tests/test_trainer_autocast.cpp); Qwen2 under 5.17 with bf16
//    autocast and eager attention was exact in reserved and +0.017% allocated on an H200
//    (tests/test_h100_arch_runs.cpp); new here: the flash kernel's own buffers, fused
//    AdamW after autocast, Trainer's compute_loss (step.keep_output: loss).
//  - LoRA with checkpointing, fp32 (hft_lora_gc): 1% / 3%: PEFT's wrapping and hook are
//    exact on CPU fixtures with PEFT's Linear stand-in (tests/test_peft_reentrant.cpp),
//    not with PEFT itself; fp32 SDPA's mem-efficient kernel scratch is CUDA's.
//  - LoRA under FSDP2 (hft_lora_fsdp2_w8): 2% / 5%: FSDP2 is checked on the stand-in
//    (tests/test_gpu_fsdp2_runs.cpp), LoRA under it only on memsim's own rules.
//  - GQA (hft_bf16_sdpa_gqa): 2% / 4%: transformers 5.17 calls SDPA with enable_gqa=True
//    and memsim still makes repeat_kv's copies (about +1% on the earlier
//    tf_llama_l4_d1024_s1024_b4_sdpa_autocast_bf16 run): expected over, a WARN says if not.
// A gap beyond these is a rule to find, not a tolerance to widen without a named cause.
//
// Modelled after the measurement (not blind; the blind check above warns for these, the
// measurement test holds them to the bound they meet now, beside the tolerance above):
//  - hft_lora_fsdp2_w8 (wt/fsdp2loss): FSDP2's root pre-backward hook is on the loss when
//    the model computes it in forward (step.keep_output: loss; sim/step/loss_placement.h):
//    blind -1.72% allocated, now within 0.1% and reserved exact.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/hft_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/hft/hft_runs.json";
const std::string kSnapshotArchive = MEMSIM_SOURCE_DIR + "/tests/data/gpu/hft/hft_snapshots.tar.xz";
const std::string kSnapshots = MEMSIM_BINARY_DIR + "/gpu_hft_snapshots";  // unpacked by CMake

struct Tolerance {
  double allocated, reserved;
  const char* why;
};
Tolerance tolerance_of(const std::string& name, const nlohmann::json& entry) {
  if (name == "hft_bf16_sdpa_gqa")
    return {0.02, 0.04, "GQA: 5.17's enable_gqa SDPA call (modelled after the measurement)"};
  if (entry["fsdp2_world"].get<int>() > 0)
    return {0.02, 0.05, "LoRA under FSDP2: FSDP2 checked on the stand-in, LoRA under it not"};
  if (!entry["lora"].is_null())
    return {0.01, 0.03, "LoRA + checkpointing: PEFT checked through a stand-in; fp32 SDPA "
                        "mem-efficient scratch"};
  return {0.005, 0.02, "bf16 autocast + SDPA (+ checkpointing): exact on CPU fixtures, Qwen2 "
                       "5.17 autocast exact on an H200"};
}

// Runs whose model changed after the measurement, and the bound memsim meets since.
struct ModelledAfter {
  const char* name;
  double allocated, reserved;
  const char* why;
};
const ModelledAfter kModelledAfter[] = {
    {"hft_lora_fsdp2_w8", 0.001, 0.0,
     "FSDP2's root pre-backward at the loss's first backward op (the loss computed in the "
     "model's forward; wt/fsdp2loss): blind -1.72% allocated"},
};
const ModelledAfter* modelled_after(const std::string& name) {
  for (const ModelledAfter& m : kModelledAfter)
    if (name == m.name) return &m;
  return nullptr;
}

// memsim's prediction for a scenario with --set style overrides (the flipped reentrancy).
memsim_test::RunPrediction simulate_with(const std::string& path,
                                         const std::vector<std::pair<std::string, std::string>>& sets) {
  const Scenario s = load_scenario(path, sets);
  const Program program = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(program, s.allocator, device, ExecuteOptions{});
  const Analysis a = analyze(program, t);
  REQUIRE(a.fits());
  memsim_test::RunPrediction p;
  p.allocated = a.peak_allocated;
  p.reserved = a.peak_reserved;
  p.whole_allocated = *std::max_element(t.allocated.begin(), t.allocated.end());
  p.whole_reserved = *std::max_element(t.reserved.begin(), t.reserved.end());
  for (const auto& [name, mark] : a.marks)
    if (mark) p.marks[name] = {mark->allocated, mark->reserved};
  p.allocations = t.final_stats.allocation.all.allocated;
  p.parameters = static_cast<uint64_t>(parameter_count(s.model));
  return p;
}

// hft_predictions.json records no allocation count.
void check_same(const memsim_test::RunPrediction& p, const nlohmann::json& entry) {
  memsim_test::check_run_prediction(p, entry, /*with_allocations=*/false);
}

// The reentrancy the run really used: the layers' checkpoint keywords, else its autograd
// graph (a reentrant checkpoint leaves CheckpointFunctionBackward nodes). -1: unknown.
int recorded_reentrant(const nlohmann::json& r) {
  if (r.contains("checkpointing")) {
    for (const nlohmann::json& kw : r["checkpointing"]["kwargs"])
      if (kw.contains("use_reentrant") && kw["use_reentrant"].is_boolean())
        return kw["use_reentrant"].get<bool>() ? 1 : 0;
  }
  if (r.contains("autograd_nodes")) {
    for (const auto& [k, v] : r["autograd_nodes"].items())
      if (k.find("CheckpointFunction") != std::string::npos && v.get<int>() > 0) return 1;
    return 0;
  }
  return -1;
}

}  // namespace

TEST_CASE("the HF Trainer / PEFT GPU runs' blind predictions are what memsim predicts "
          "(tests/data/gpu/hft_predictions.json)", "[hft][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  REQUIRE(preds.size() == 6);
  for (const auto& [name, entry] : preds.items()) {
    INFO(name << " (" << entry["scenario"].get<std::string>() << ")");
    REQUIRE_FALSE(entry.contains("refused"));  // memsim models every run measured
    const std::string path = memsim_test::scenario_path_of(entry);
    if (name == "hft_bf16_sdpa_gqa") {
      // Changed after the measurement (blind +1.11% allocated, +1.47% reserved): transformers
      // 5.x's grouped SDPA call (enable_gqa, no repeat_kv copies) is modelled since
      // (docs/sdpa-gqa.md); the other test case compares memsim now with the run.
      const memsim_test::RunPrediction now = memsim_test::simulate_run(path);
      WARN(name << ": prediction changed after the measurement (enable_gqa modelled); blind "
                << entry["peak_allocated_bytes"].get<uint64_t>() << " B, now " << now.allocated
                << " B");
      continue;
    }
    if (const ModelledAfter* m = modelled_after(name)) {
      const memsim_test::RunPrediction now = memsim_test::simulate_run(path);
      WARN(name << ": prediction changed after the measurement (" << m->why << "); blind "
                << entry["peak_allocated_bytes"].get<uint64_t>() << " B, now " << now.allocated
                << " B");
      // The change is in the root's hooks: the shards and model state stay as predicted.
      CHECK(now.parameters == entry["parameter_count"].get<uint64_t>());
      CHECK(now.allocated > entry["peak_allocated_bytes"].get<uint64_t>());  // the prefetch
      continue;
    }
    check_same(memsim_test::simulate_run(path), entry);
    for (const char* flip : {"if_reentrant_true", "if_reentrant_false"}) {
      if (!entry.contains(flip)) continue;
      INFO(flip);
      const std::string value = std::string(flip) == "if_reentrant_true" ? "true" : "false";
      check_same(simulate_with(path, {{"checkpoint.reentrant", value}}), entry[flip]);
    }
  }
  // The settings do what their models say (an ignored key would predict the base bytes):
  // checkpointing lowers the autocast step's peak; LoRA's frozen base has no AdamW state;
  // FSDP2 over 8 ranks holds less than the whole LoRA model.
  const auto peak = [&](const char* n) { return preds[n]["peak_allocated_bytes"].get<uint64_t>(); };
  CHECK(peak("hft_bf16_sdpa_gc") < peak("hft_bf16_sdpa"));
  CHECK(peak("hft_bf16_sdpa_gc_reentrant") < peak("hft_bf16_sdpa"));
  CHECK(peak("hft_lora_fsdp2_w8") != peak("hft_lora_gc"));
  CHECK(preds["hft_lora_gc"]["trainable_parameter_count"].get<uint64_t>() <
        preds["hft_lora_gc"]["parameter_count"].get<uint64_t>() / 50);
  // GQA: memsim's repeat_kv copies (the known gap) make it predict more than MHA's run
  // minus the 3/4 of K/V projections GQA saves: only that it simulates differently.
  CHECK(peak("hft_bf16_sdpa_gqa") != peak("hft_bf16_sdpa"));
}

TEST_CASE("HF Trainer and PEFT defaults on a GPU against memsim", "[hft][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  if (!std::filesystem::exists(kRuns)) {
    MEMSIM_SKIP("MEASUREMENT MISSING: " << kRuns << " does not exist: memsim's HF Trainer "
                "(bf16 autocast + SDPA, gradient_checkpointing_enable) and PEFT (LoRA with "
                "checkpointing, LoRA under FSDP2) models have not been checked on a GPU. Run "
                "`python3 tools/gpu/measure_hft.py OUT --budget 90` on one (torch 2.11, "
                "transformers 5.17, peft) and commit OUT/hft_runs.json (and "
                "hft_snapshots.tar.xz) there. The blind predictions (memsim commit "
                << fx["memsim_commit"].get<std::string>() << ") are checked by the other test case.");
    return;
  }
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::map<std::string, const nlohmann::json*> measured;
  for (const nlohmann::json& r : runs["results"]) measured[r["spec"]["name"]] = &r;
  memsim_test::check_snapshot_replays(runs, kSnapshotArchive, kSnapshots, "hft");
  std::printf("\nHF Trainer / PEFT on %s (torch %s, transformers %s, peft %s): measured step "
              "peaks, real vs memsim now (blind = memsim's committed prediction)\n",
              runs["results"].empty() ? "?" : runs["results"][0].value("gpu", std::string("?")).c_str(),
              runs["versions"].value("torch", std::string("?")).c_str(),
              runs["versions"].value("transformers", std::string("?")).c_str(),
              runs["versions"].value("peft", std::string("?")).c_str());
  memsim_test::print_comparison_header();
  size_t compared = 0;
  for (const auto& [name, entry] : preds.items()) {
    INFO(name);
    const auto it = measured.find(name);
    if (it == measured.end()) {
      REQUIRE(runs["failures"].contains(name));  // not measured: the reason is on record
      WARN(name << " was not measured: " << runs["failures"][name].get<std::string>().substr(0, 600));
      continue;
    }
    const nlohmann::json& r = *it->second;
    REQUIRE_FALSE(r.contains("skipped"));
    REQUIRE_FALSE(r.value("dry_run", false));
    REQUIRE(r.contains("measured_step_peak_allocated"));
    // The run is the configuration the scenario describes.
    std::vector<std::pair<std::string, std::string>> sets;
    const nlohmann::json* blind = &entry;
    if (entry["gradient_checkpointing"].get<bool>()) {
      CHECK(r["checkpointing"]["layers"].get<int>() >= 4);
      const int re = recorded_reentrant(r);
      REQUIRE(re >= 0);
      const bool assumed = entry["checkpoint_reentrant"].get<bool>();
      if ((re == 1) != assumed) {
        // transformers' default was the other one: its flipped prediction, made blind too.
        REQUIRE(entry["gc_kwargs"].is_null());
        const std::string v = re == 1 ? "true" : "false";
        sets.push_back({"checkpoint.reentrant", v});
        blind = &entry["if_reentrant_" + v];
        WARN(name << ": gradient_checkpointing_enable() ran with use_reentrant " << v
                  << ", not the scenario's; compared with if_reentrant_" << v);
      }
    } else {
      CHECK(r["checkpointing"]["layers"].get<int>() == 0);
    }
    if (!entry["lora"].is_null() && entry["gradient_checkpointing"].get<bool>()) {
      // PEFT registered enable_input_require_grads (lora.input_require_grads: true).
      const nlohmann::json& hooks = r["input_embedding_forward_hooks"];
      CHECK(std::any_of(hooks.begin(), hooks.end(), [](const nlohmann::json& h) {
        return h.get<std::string>().find("require_grad") != std::string::npos;
      }));
    }
    if (r.contains("sdpa_kernels") && !r["sdpa_kernels"].contains("error")) {
      // memsim's fused kernel (flash for bf16, mem-efficient for fp32) could run.
      const bool bf16 = entry["autocast"].get<std::string>() == "bf16";
      CHECK(r["sdpa_kernels"][bf16 ? "flash" : "efficient"].get<bool>());
    }
    const std::string path = memsim_test::scenario_path_of(entry);
    const memsim_test::RunPrediction now = sets.empty() ? memsim_test::simulate_run(path) : simulate_with(path, sets);
    CHECK(r["parameters"].get<uint64_t>() == now.parameters);
    if (entry["fsdp2_world"].get<int>() == 0 && (*blind).contains("trainable_parameter_count") &&
        !(*blind)["trainable_parameter_count"].is_null())
      CHECK(r["trainable_parameters"].get<uint64_t>() == (*blind)["trainable_parameter_count"].get<uint64_t>());
    const uint64_t real_alloc = r["measured_step_peak_allocated"].get<uint64_t>();
    const uint64_t real_reserved = r["measured_step_peak_reserved"].get<uint64_t>();
    const std::string note = "blind " + std::to_string((*blind)["peak_allocated_bytes"].get<uint64_t>()) +
                             " / " + std::to_string((*blind)["peak_reserved_bytes"].get<uint64_t>());
    memsim_test::print_comparison_row(name, now.allocated, real_alloc, now.reserved, real_reserved, note);
    memsim_test::print_comparison_row(name + " (whole run)", now.whole_allocated,
                                      r["whole_run_peak_allocated"].get<uint64_t>(), now.whole_reserved,
                                      r["whole_run_peak_reserved"].get<uint64_t>());
    for (const auto& [mark, v] : now.marks) {
      if (!r["marks"].contains(mark) || !r["marks"][mark].contains("allocated_bytes.all.current")) continue;
      const nlohmann::json& m = r["marks"][mark];
      memsim_test::print_comparison_row(name + " @" + mark, v.first,
                                        m["allocated_bytes.all.current"].get<uint64_t>(), v.second,
                                        m["reserved_bytes.all.current"].get<uint64_t>());
    }
    const Tolerance tol = tolerance_of(name, entry);
    const double ea = memsim_test::rel(now.allocated, real_alloc);
    const double er = memsim_test::rel(now.reserved, real_reserved);
    INFO(tol.why << ": allocated " << 100 * ea << "%, reserved " << 100 * er << "%");
    CHECK(std::abs(ea) <= tol.allocated);
    CHECK(std::abs(er) <= tol.reserved);
    if (const ModelledAfter* m = modelled_after(name)) {
      INFO("modelled after the measurement: " << m->why);
      CHECK(std::abs(ea) <= m->allocated);
      CHECK(std::abs(er) <= m->reserved);
    }
    ++compared;
  }
  CHECK(compared + runs["failures"].size() >= preds.size());
}
