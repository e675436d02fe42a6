// memsim against real training steps on an NVIDIA H100 80GB (PyTorch 2.11, CUDA 13),
// measured by tools/gpu/measure_cuda.py: tests/data/h100/cuda_runs.json holds each run's
// configuration and memory_stats, tests/data/h100/snapshots.tar.xz its memory snapshot
// (extracted into the build tree by CMake).
//
// 1. Every snapshot replays through the allocator emulator with no mismatch (each alloc
//    at the traced address, each cudaMalloc when and as traced, the final segments equal)
//    and the run's peaks.
// 2. Every run of the Hugging Face stand-ins (tools/fixtures/torch_models.py, which
//    memsim's hf-llama and hf-gpt2 follow op by op) is simulated from its configuration
//    and the measured step's max_memory_allocated / max_memory_reserved compared: exact
//    unless kKnownGaps below names the run and says why.
// 3. The installed transformers release (5.17) is compared the same way, as a report of
//    how far today's library is from the v4.44-era code memsim models (kKnownGaps).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/h100/cuda_runs.json";
const std::string kSnapshots = MEMSIM_H100_SNAPSHOTS;

// Runs whose prediction is not exact: the largest relative error allowed and why.
struct KnownGap {
  double allocated, reserved;
  const char* why;
};
const std::map<std::string, KnownGap> kKnownGaps = {
    // Checkpointing each half of the layer: the re-runs' transients differ from the
    // trace's (see docs/h100-runs.md).
    {"llama_l4_d1024_s1024_b4_modules", {0.0003, 0.06, "modules re-run transients"}},
    {"llama_l4_d1024_s1024_b4_autocast_bf16_full", {0.00015, 0.0, "full + autocast re-run"}},
    // Requested bytes at the peak are equal; allocated differs by block rounding (small
    // pool: CUB's radix-sort scratch in embedding backward is not modelled).
    {"llama_l4_d1024_s1024_b4_autocast_bf16", {0.000001, 0.0, "CUB scratch (small pool)"}},
    {"llama_l4_d1024_s1024_b4_bf16", {0.0006, 0.0, "block rounding, requested equal"}},
    // The stand-in initialises each Conv1D weight out of place (randn(...) * 0.02: a
    // temporary per weight at setup) where HF's Conv1D fills it in place, which memsim
    // models: the setup leaves other cached blocks behind.
    {"gpt2_l4_d1024_s1024_b4_drop0.1", {0.0, 0.001, "stand-in's Conv1D init"}},
    {"gpt2_l4_d1024_s1024_b4_autocast_bf16", {0.0, 0.002, "stand-in's Conv1D init"}},
    // Blind checks (predicted before they ran, tests/data/h100/blind_predictions.json):
    // the re-runs of full checkpointing leave 16 MiB more cached in memsim; GPT-2's
    // allocated differs by block rounding (reserved exact).
    {"blind_llama_l8_d2048_s2048_b2_full", {0.0, 0.0013, "full re-run transients"}},
    {"blind_gpt2_l8_d1280_s1024_b4_drop0.1", {0.00012, 0.0, "attention backward order"}},
    {"blind_gpt2_l8_d1280_s1024_b4_autocast_bf16", {0.00002, 0.0, "block rounding"}},
    // Second blind round (tests/data/h100/blind2_predictions.json): reserved exact,
    // allocated within 0.031%.
    {"blind2_gpt2_l12_d768_s1024_b8_drop0.1", {0.00002, 0.0, "block rounding"}},
    {"blind2_gpt2_l12_d768_s1024_b8_autocast_bf16", {0.00032, 0.0, "under autocast"}},
    {"blind2_llama_l6_d1536_s1536_b2_uniform2", {0.0002, 0.0, "uniform:2 re-runs"}},
    // transformers 5.17 is not the v4.44-era code memsim models (docs/h100-runs.md).
    {"tf_llama_l4_d1024_s1024_b4_eager", {0.0004, 0.08, "transformers 5.17"}},
    // fp32 GQA through transformers 5.17's SDPA ran PyTorch's math kernel (S x S kept):
    // as mem-efficient memsim is far under; as eager it is close (checked below).
    {"tf_llama_l4_d1024_s1024_b4_sdpa", {0.18, 0.11, "SDPA ran the math kernel"}},
    {"tf_gpt2_l4_d1024_s1024_b4_eager", {0.0001, 0.003, "transformers 5.17"}},
    {"tf_llama_l4_d1024_s1024_b4_eager_full", {0.0032, 0.003, "transformers 5.17"}},
};

std::string attention_key(const nlohmann::json& sp) {
  const std::string a = sp["attention"];
  if (a != "sdpa") return a;
  // PyTorch's SDPA picks flash for 16-bit inputs on an H100, mem-efficient for fp32.
  return (sp["autocast"] == "bf16" || sp["dtype"] == "bf16") ? "flash" : "mem-efficient";
}

// The run's configuration as a scenario (the script memsim assumes by default is the one
// measure_cuda.py runs).
std::string scenario_yaml(const nlohmann::json& sp) {
  const nlohmann::json& c = sp["cfg"];
  const std::string family = sp["family"];
  const bool tied = c.value("tied", family == "hf-gpt2");
  auto num = [&](const char* k) { return std::to_string(c[k].get<int64_t>()); };
  std::string y = "name: " + sp["name"].get<std::string>() + "\nmodel:\n  family: " + family + "\n";
  y += "  layers: " + num("layers") + "\n  d_model: " + num("d_model") + "\n";
  y += "  heads: " + num("heads") + "\n  kv_heads: " + num("kv_heads") + "\n";
  y += "  d_ff: " + num("d_ff") + "\n  vocab: " + num("vocab") + "\n";
  y += "  context_length: " + num("context") + "\n";
  y += std::string("  tied_embeddings: ") + (tied ? "true" : "false") + "\n";
  y += "  attention: " + attention_key(sp) + "\n";
  y += "  dropout: " + std::to_string(c["dropout"].get<double>()) + "\n";
  y += "batch: {micro_batch: " + num("batch") + ", seq_len: " + num("seq") + "}\n";
  y += "precision: {params: " + sp["dtype"].get<std::string>() +
       ", autocast: " + sp["autocast"].get<std::string>() + "}\n";
  y += "optimizer: {type: " + sp["optimizer"].get<std::string>() +
       ", impl: " + sp["opt_impl"].get<std::string>() + "}\n";
  y += "step: {kind: train, warmup_steps: " + std::to_string(sp["warmup"].get<int>()) + "}\n";
  y += "checkpoint: {policy: " + sp["policy"].get<std::string>() + "}\n";
  y += "device: {preset: h100-80gb}\n";
  return y;
}

// The run's configuration simulated (exact peaks of `memsim run`).
memsim_test::SimulatedPeaks simulate(const nlohmann::json& sp) {
  const Scenario s = load_scenario_text(scenario_yaml(sp), sp["name"].get<std::string>() + ".yaml");
  const memsim_test::SimulatedPeaks p = memsim_test::simulate_peaks(s);
  REQUIRE(p.fits);
  return p;
}

using memsim_test::large_allocs;
using memsim_test::rel;

}  // namespace

TEST_CASE("H100 snapshots (PyTorch 2.11) replay through the emulator with no mismatch", "[h100][replay]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  REQUIRE(runs["results"].size() == 44);
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const Snapshot snap = read_snapshot_file(kSnapshots + "/" + name + ".pickle");
    const ReplayReport rep = replay_snapshot(snap);
    CHECK(rep.mismatches == 0);
    CHECK(rep.final_layout_match);
    CHECK(rep.seeded_segments == 0);  // recorded from before the model was built
    // The whole run's peaks: the warm-up's (memory_stats before the reset) or the
    // measured step's.
    const auto& begin = r["marks"]["measured_step_begin"];
    const uint64_t alloc_peak = std::max(begin["allocated_bytes.all.peak"].get<uint64_t>(),
                                         r["measured_step_peak_allocated"].get<uint64_t>());
    const uint64_t reserved_peak = std::max(begin["reserved_bytes.all.peak"].get<uint64_t>(),
                                            r["measured_step_peak_reserved"].get<uint64_t>());
    CHECK(rep.peak_allocated_bytes == alloc_peak);
    CHECK(rep.peak_reserved_bytes == reserved_peak);
  }
}

TEST_CASE("H100 LLaMA runs: every large allocation of the program in the trace's order and size", "[h100]") {
  // Setup, warm-up and measured step: the parameters, each activation, gradient, optimizer
  // state, workspace and kernel scratch above 1 MiB.
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  size_t checked = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const nlohmann::json& sp = r["spec"];
    const std::string name = sp["name"];
    const bool same = name == "llama_l4_d1024_s1024_b4_none" || name == "llama_l4_d1024_s1024_b4_selective" ||
                      name == "llama_l4_d1024_s1024_b4_fused" || name == "llama_l4_d1024_s1024_b4_bf16" ||
                      name == "llama_l4_d1024_s1024_b4_autocast_bf16" || name == "blind_llama_l8_d2048_s2048_b2";
    if (!same) continue;
    INFO(name);
    const Scenario s = load_scenario_text(scenario_yaml(sp), name + ".yaml");
    const std::vector<uint64_t> predicted = large_allocs(build_program(s));
    const std::vector<uint64_t> real =
        large_allocs(read_snapshot_file(kSnapshots + "/" + name + ".pickle"));
    CHECK(predicted.size() == real.size());
    CHECK(predicted == real);
    ++checked;
  }
  CHECK(checked == 6);
}

TEST_CASE("Measured steps on an H100 (PyTorch 2.11): hf stand-ins and transformers 5.17", "[h100]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::printf("\n| H100 run | peak allocated real | predicted | error | peak reserved real | predicted | error |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  size_t exact = 0, compared = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const nlohmann::json& sp = r["spec"];
    const std::string name = sp["name"];
    INFO(name);
    if (sp["impl"] == "transformers" && sp["family"] == "hf-gpt2" && sp["attention"] == "sdpa")
      continue;  // memsim's hf-gpt2 models eager attention only (refused by key)
    if (sp["impl"] == "transformers" && sp["autocast"] != "none") continue;  // same: eager only
    const memsim_test::SimulatedPeaks p = simulate(sp);
    const uint64_t real_a = r["measured_step_peak_allocated"], real_r = r["measured_step_peak_reserved"];
    const double ea = rel(p.allocated, real_a), er = rel(p.reserved, real_r);
    std::printf("| %s | %.2f MiB | %.2f MiB | %+.3f%% | %.2f MiB | %.2f MiB | %+.3f%% |\n", name.c_str(),
                real_a / 1048576.0, p.allocated / 1048576.0, 100 * ea, real_r / 1048576.0,
                p.reserved / 1048576.0, 100 * er);
    ++compared;
    if (name == "tf_llama_l4_d1024_s1024_b4_sdpa") {
      nlohmann::json as_eager = sp;
      as_eager["attention"] = "eager";
      const memsim_test::SimulatedPeaks e = simulate(as_eager);
      CHECK(std::fabs(rel(e.allocated, real_a)) < 0.0004);
      CHECK(std::fabs(rel(e.reserved, real_r)) < 0.02);
    }
    const auto gap = kKnownGaps.find(name);
    if (gap == kKnownGaps.end()) {
      CHECK(p.allocated == real_a);
      CHECK(p.reserved == real_r);
      exact += p.allocated == real_a && p.reserved == real_r;
    } else {
      INFO(gap->second.why);
      CHECK(std::fabs(ea) <= gap->second.allocated);
      CHECK(std::fabs(er) <= gap->second.reserved);
    }
  }
  std::printf("%zu runs compared, %zu exact in both peaks\n", compared, exact);
  CHECK(compared == 42);
}
