// memsim's other stacks' model code (`model.implementation: torchtitan | torchtune |
// litgpt`, docs/implementations.md, issue #16 item 7) against real runs on a GPU:
// tools/gpu/measure_impl.py runs the committed stand-ins of each stack's Llama
// (tools/fixtures/impl_models.py, the code of the torch 1.13 CPU fixtures) with the CUDA
// kernels the stacks call (SDPA, nn.RMSNorm, the chunked head, repeat_interleave,
// post-accumulate-grad hooks) at 4 layers, d_model 1024, 16 heads / 4 KV, d_ff 2816,
// vocab 32000, batch 4 x 1024, each with its stack's loop. Its scenarios are
// tests/data/gpu/impl/NAME.yaml and memsim's blind predictions
// tests/data/gpu/impl_predictions.json, both written by tools/gpu/predict_impl.py and
// committed before anything was measured.
//
// 1. Every scenario still loads and simulates, and every prediction in the file equals
//    what memsim predicts now (the blind record stays what memsim said). Always runs.
// 2. Against the measurement (tests/data/gpu/impl/impl_runs.json, the script's output,
//    committed by whoever ran it): SKIPPED (ctest: not run) while the file is absent. Once
//    it is there: a table of real vs memsim (measured step, whole run, marks); every run
//    measured or its failure on record; the run is the configuration the prediction
//    assumed (stack, dtype, LoRA, optimizer in backward, parameter count, on a GPU); the
//    SDPA kernel that ran is the one the scenario names (`model.attention` flash:
//    ScaledDotProductFlashAttentionBackward0, mem-efficient: ...Efficient...); the
//    measured step's peak allocated and reserved and the forward-end allocated within the
//    tolerance below (FAILS beyond it). With the snapshots committed too
//    (impl_snapshots.tar.xz, unpacked by CMake) each replays through the allocator
//    emulator with no mismatch, and the allocations of 1 MiB or more that differ from
//    memsim's Program are printed (a WARN, not a check: see the tolerance).
//
// Tolerances, stated before the measurement (2026-11-27, ~21:50 UTC), from what is new on
// the GPU: everything around the kernels is exact on the CPU fixtures (forward-end bytes,
// every layer's saved bytes, layer 0's allocations; peaks within 2% for torchtune only
// because the CPU stand-in emulates the chunked head's backward in one Function, which the
// GPU run does not: it runs torchtune's own per-chunk F.linear, whose InputBuffer rule was
// measured on an H200 in tests/data/gpu/stacks); the flash and mem-efficient SDPA kernels
// were measured exact on the hf rows (tests/data/h100). What no measurement has checked:
// nn.RMSNorm's fused CUDA kernel (`_fused_rms_norm`, modelled from source: output and fp32
// rstd; its backward's own scratch is not emitted), the complex (`view_as_complex`) RoPE
// products' CUDA backward, `repeat_interleave`'s 2.x path, the hooks' timing on CUDA.
//  - runs whose kernel is the scenario's: 1% allocated (the peak and forward end), 3%
//    reserved (the caching allocator's segments follow the allocation order, which a
//    missing kernel scratch shifts).
//    (impl_torchtitan_bf16 forces the flash kernel; the fp32 runs call SDPA bare and get
//    mem-efficient, the only fused kernel taking fp32.)
//  - impl_torchtitan_bf16_titan_sdpa (torchtitan's own SDPA priority, cuDNN attention
//    first): when the run records the flash kernel (cuDNN not picked), the 1% / 3% above;
//    when it records cuDNN, 5% allocated / 10% reserved and a WARN naming the difference
//    to the forced-flash run.
// A gap beyond these is a rule to find (docs/implementations.md, "Limits"), not a
// tolerance to widen without a named cause.
//
// What the H200 run (2026-11-27, torch 2.11.0+cu130) showed, and what changed after it:
//  - The SDPA kernel: the bf16 runs that call SDPA unforced (torchtune's and LitGPT's,
//    measure_impl.py as committed and run) and torchtitan's priority all ran cuDNN
//    attention (ScaledDotProductCudnnAttentionBackward0): it is PyTorch 2.11's default
//    for bf16 on sm90. Their scenarios say `model.attention: flash`, which stands for it:
//    from the traces and cudnn/MHA.cpp, cuDNN allocates the same output (q's layout, as
//    flash), the same fp32 (B,H,S) stats and the same q/k/v-layout grads; it differs only
//    in blocks under 1 MiB forward (8 B seed and offset, a 256 B workspace) and in
//    backward taking flash's dq_accum + softmax_d as one workspace block (17,039,616 B
//    here instead of 16,777,216 + 262,144), which moves none of these eight predictions
//    (docs/implementations.md "cuDNN attention"). The expected kernel is therefore
//    kExpectedKernel below, and the 1% / 3% tolerance holds for every run.
//  - impl_litgpt_bf16 was -1.03% allocated: LitGPT's q is torch.cat's contiguous
//    (B,h,T,hs), the flash and cuDNN kernels allocate their output in q's layout, so
//    `y.transpose(1, 2).reshape(B, T, C)` copies (8 MiB per layer, saved by attn.proj).
//    memsim took the output as (B,T,h,hs) (a view). Fixed (graph/models/decoder_litgpt.cpp
//    and the CPU stand-in, tools/fixtures/impl_models.py LitFlashSdpa): +0.03% now.
//  - impl_torchtune_lora_bf16: matmul's should_fold does not copy the head's
//    non-contiguous chunks when the output weight is frozen (graph/models/decoder_impl.cpp);
//    memsim copied them. Its peaks are unchanged (the copies were transient); reserved
//    stays +0.81% (16 MiB: memsim opens a segment at the warm-up step's final RMSNorm that
//    the real run did not need; the allocations of 1 MiB and more are the same in size and
//    order there. Cause: best-fit ties between equal free blocks go to the lower address,
//    and the simulated device's segment addresses ascend where the H200's mostly descended;
//    with descending ones this run's reserved is exact. docs/implementations.md, Limits).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "real_run_test_support.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/impl_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/impl/impl_runs.json";
const std::string kSnapshotArchive = MEMSIM_SOURCE_DIR + "/tests/data/gpu/impl/impl_snapshots.tar.xz";
const std::string kSnapshots = MEMSIM_BINARY_DIR + "/gpu_impl_snapshots";  // unpacked by CMake

constexpr const char* kCudnnRun = "impl_torchtitan_bf16_titan_sdpa";

struct Tolerance {
  double allocated, reserved;
  const char* why;
};

// The autograd node each `model.attention` value's kernel leaves on SDPA's output.
std::string kernel_node_of(const std::string& attention) {
  if (attention == "flash") return "ScaledDotProductFlashAttentionBackward0";
  if (attention == "mem-efficient") return "ScaledDotProductEfficientAttentionBackward0";
  return "(memsim models no other SDPA kernel)";
}

// The kernel each run recorded on the H200 with torch 2.11.0+cu130: a bf16 SDPA call not
// forced to flash (sdpa_call "default", or torchtitan's cuDNN-first priority) ran cuDNN
// attention, PyTorch 2.11's default on sm90; `model.attention: flash` models it (see top).
std::string expected_kernel(const std::string& attention, const std::string& sdpa_call) {
  if (attention == "flash" && sdpa_call != "flash") return "ScaledDotProductCudnnAttentionBackward0";
  return kernel_node_of(attention);
}

// Runs whose prediction changed after the measurement because a rule was found in its
// trace (the blind record stays as memsim said it; the first test checks how it differs).
struct Changed {
  bool peak_moves;  // the measured step's peak allocated differs from the blind one
  const char* why;
};
const std::map<std::string, Changed> kChangedAfterMeasurement = {
    {"impl_litgpt_bf16", {true, "flash/cuDNN output in q's (B,h,T,hs) layout: LitGPT's "
                                "y.transpose(1, 2).reshape copies"}},
    {"impl_torchtune_lora_bf16", {false, "should_fold: no copy of the head's chunks when "
                                         "the output weight is frozen (transient copies)"}},
};

// The tolerance of a run (see the top), given the kernel it recorded.
Tolerance tolerance_of(const std::string& name, const std::string& kernel, const std::string& attention) {
  if (name == kCudnnRun && kernel != kernel_node_of(attention) &&
      kernel != "ScaledDotProductCudnnAttentionBackward0")
    return {0.05, 0.10, "torchtitan's SDPA priority picked another kernel than flash (cuDNN "
                        "attention, not modelled): output, stats and workspace differ"};
  return {0.01, 0.03, "the stack's code exact on CPU fixtures; SDPA measured on the hf rows; "
                      "nn.RMSNorm's fused kernel, complex RoPE's CUDA backward and "
                      "repeat_interleave's 2.x path checked here first"};
}

}  // namespace

TEST_CASE("the implementation GPU runs' blind predictions are what memsim predicts "
          "(tests/data/gpu/impl_predictions.json)", "[implementation][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  REQUIRE(preds.size() == 8);
  for (const auto& [name, entry] : preds.items()) {
    INFO(name << " (" << entry["scenario"].get<std::string>() << ")");
    REQUIRE_FALSE(entry.contains("refused"));  // memsim models every run measured
    const memsim_test::RunPrediction p = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
    if (const auto changed = kChangedAfterMeasurement.find(name);
        changed != kChangedAfterMeasurement.end()) {
      INFO("changed after the measurement: " << changed->second.why);
      if (changed->second.peak_moves) {
        CHECK(p.allocated != entry["peak_allocated_bytes"].get<uint64_t>());
      } else {
        CHECK(p.allocated == entry["peak_allocated_bytes"].get<uint64_t>());
        CHECK(p.allocations != entry["allocations_whole_run"].get<int64_t>());
      }
      CHECK(p.parameters == entry["parameter_count"].get<uint64_t>());
      continue;
    }
    memsim_test::check_run_prediction(p, entry);  // optimizer_end is null with optimizer.in_backward
  }
  // The scenarios really select what they name (an ignored key would predict the same bytes
  // as its neighbour): each stack differs from the others at the same dtype, LoRA and the
  // optimizer in backward lower torchtune's numbers, and fp32 costs more than bf16.
  auto peak = [&](const char* n) { return preds[n]["peak_allocated_bytes"].get<uint64_t>(); };
  auto fwd = [&](const char* n) { return preds[n]["marks"]["forward_end"]["allocated"].get<uint64_t>(); };
  CHECK(fwd("impl_torchtitan_bf16") != fwd("impl_torchtune_bf16"));
  CHECK(fwd("impl_torchtune_bf16") != fwd("impl_litgpt_bf16"));
  CHECK(fwd("impl_torchtitan_bf16") != fwd("impl_litgpt_bf16"));
  CHECK(peak("impl_torchtune_lora_bf16") < peak("impl_torchtune_bf16"));
  CHECK(preds["impl_torchtune_inbwd_bf16"]["marks"]["backward_end"]["allocated"].get<uint64_t>() <
        preds["impl_torchtune_bf16"]["marks"]["backward_end"]["allocated"].get<uint64_t>());
  CHECK(peak("impl_torchtitan_fp32") > peak("impl_torchtitan_bf16"));
  CHECK(peak("impl_litgpt_fp32") > peak("impl_litgpt_bf16"));
  // The cuDNN-priority run has memsim's flash scenario: the same prediction as the forced one.
  CHECK(peak(kCudnnRun) == peak("impl_torchtitan_bf16"));
}

TEST_CASE("torchtitan, torchtune and LitGPT model code on a GPU against memsim",
          "[implementation][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  if (!std::filesystem::exists(kRuns)) {
    MEMSIM_SKIP("MEASUREMENT MISSING: " << kRuns << " does not exist: memsim's torchtitan, "
                "torchtune and LitGPT rows have not been checked on a GPU. Run `python3 "
                "tools/gpu/measure_impl.py OUT --budget 82` on one and commit "
                "OUT/impl_runs.json (and impl_snapshots.tar.xz) there. The blind predictions "
                "(memsim commit " << fx["memsim_commit"].get<std::string>()
                << ") are checked by the other test case.");
    return;
  }
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::map<std::string, const nlohmann::json*> measured;
  for (const nlohmann::json& r : runs["results"]) measured[r["spec"]["name"]] = &r;
  // The real traces through the allocator emulator (streams as recorded).
  memsim_test::check_snapshot_replays(runs, kSnapshotArchive, kSnapshots, "implementation");
  std::printf("\nOther stacks' model code on %s (torch %s): measured step peaks, real vs memsim "
              "now (blind = memsim's committed prediction)\n",
              runs["results"].empty() ? "?"
                                      : runs["results"][0].value("gpu", std::string("?")).c_str(),
              runs["versions"].value("torch", std::string("?")).c_str());
  memsim_test::print_comparison_header();
  for (const auto& [name, entry] : preds.items()) {
    INFO(name);
    const auto it = measured.find(name);
    if (it == measured.end()) {
      // Not measured: the failure (or "not run: budget spent") must be on record.
      REQUIRE(runs["failures"].contains(name));
      WARN(name << " was not measured: "
                << runs["failures"][name].get<std::string>().substr(0, 600));
      continue;
    }
    const nlohmann::json& r = *it->second;
    const nlohmann::json& sp = r["spec"];
    // The run is the configuration the prediction assumed, measured on a GPU with the
    // CUDA kernels (no substitution).
    REQUIRE(r.contains("measured_step_peak_allocated"));
    REQUIRE(r.value("device", std::string()) != "cpu");
    CHECK((!r.contains("substituted") || r["substituted"].empty()));
    CHECK(sp["impl"].get<std::string>() == entry["implementation"].get<std::string>());
    CHECK(sp["dtype"].get<std::string>() == entry["params"].get<std::string>());
    CHECK(sp["in_backward"].get<bool>() == entry["in_backward"].get<bool>());
    CHECK(sp["lora"].dump() == entry["lora"].dump());
    CHECK(sp["sdpa"].get<std::string>() == entry["sdpa_call"].get<std::string>());
    const memsim_test::RunPrediction now = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
    // memsim counts the base model (a LoRA run's adapters are its trainable parameters).
    const uint64_t params = r["parameters"].get<uint64_t>();
    const uint64_t trainable = r["trainable_parameters"].get<uint64_t>();
    CHECK((entry["lora"].is_null() ? params : params - trainable) == now.parameters);
    // The SDPA kernel that ran.
    const std::string attention = entry["attention"].get<std::string>();
    REQUIRE(r.contains("sdpa_kernels"));
    REQUIRE(r["sdpa_kernels"].size() == 1);
    const std::string kernel = r["sdpa_kernels"][0].get<std::string>();
    CHECK(kernel == expected_kernel(attention, sp["sdpa"].get<std::string>()));
    const uint64_t real_alloc = r["measured_step_peak_allocated"].get<uint64_t>();
    const uint64_t real_reserved = r["measured_step_peak_reserved"].get<uint64_t>();
    const std::string blind = "blind " +
                              std::to_string(entry["peak_allocated_bytes"].get<uint64_t>()) +
                              " / " + std::to_string(entry["peak_reserved_bytes"].get<uint64_t>()) +
                              "; " + kernel;
    memsim_test::print_comparison_row(name, now.allocated, real_alloc, now.reserved,
                                      real_reserved, blind);
    memsim_test::print_comparison_row(name + " (whole run)", now.whole_allocated,
                                      r["whole_run_peak_allocated"].get<uint64_t>(),
                                      now.whole_reserved,
                                      r["whole_run_peak_reserved"].get<uint64_t>());
    for (const auto& [mark, v] : now.marks) {
      if (!r["marks"].contains(mark)) continue;
      const nlohmann::json& m = r["marks"][mark];
      memsim_test::print_comparison_row(name + " @" + mark, v.first,
                                        m["allocated_bytes.all.current"].get<uint64_t>(),
                                        v.second, m["reserved_bytes.all.current"].get<uint64_t>());
    }
    // Allocation by allocation (1 MiB and up): printed, so a peak within tolerance still
    // shows a transient memsim lacks (e.g. the fused RMSNorm backward's scratch).
    const std::string pickle = kSnapshots + "/" + name + ".pickle";
    if (std::filesystem::exists(pickle)) {
      const std::string diff = memsim_test::describe_difference(memsim_test::alloc_count_difference(
          memsim_test::large_allocs(read_snapshot_file(pickle)),
          memsim_test::large_allocs(build_program(load_scenario(memsim_test::scenario_path_of(entry)))),
          uint64_t{1} << 20));
      if (!diff.empty()) WARN(name << ": allocations of 1 MiB or more that differ: " << diff);
    }
    const Tolerance tol = tolerance_of(name, kernel, attention);
    const uint64_t real_fwd = r["marks"]["forward_end"]["allocated_bytes.all.current"].get<uint64_t>();
    INFO(tol.why << ": allocated " << 100 * memsim_test::rel(now.allocated, real_alloc)
                 << "%, reserved " << 100 * memsim_test::rel(now.reserved, real_reserved)
                 << "%, forward end " << 100 * memsim_test::rel(now.marks.at("forward_end").first, real_fwd)
                 << "%");
    CHECK(std::abs(memsim_test::rel(now.allocated, real_alloc)) <= tol.allocated);
    CHECK(std::abs(memsim_test::rel(now.reserved, real_reserved)) <= tol.reserved);
    CHECK(std::abs(memsim_test::rel(now.marks.at("forward_end").first, real_fwd)) <= tol.allocated);
    if (name == kCudnnRun && kernel == "ScaledDotProductCudnnAttentionBackward0") {
      // The same model and loop with flash forced: cuDNN attention's peaks are flash's to
      // the byte at these shapes (measured), which is why `flash` stands for it.
      const auto flash = measured.find("impl_torchtitan_bf16");
      REQUIRE(flash != measured.end());
      CHECK(real_alloc == (*flash->second)["measured_step_peak_allocated"].get<uint64_t>());
      CHECK(real_reserved == (*flash->second)["measured_step_peak_reserved"].get<uint64_t>());
    }
  }
}
