// memsim against real training steps of the decoder-architecture rows on a GPU, predicted
// blind: tests/data/h100/blind3_arch_predictions.json was committed (memsim at eca7686c)
// before tools/gpu/measure_cuda.py --group arch arch-extra arch-more ran on a lent NVIDIA
// H200 (PyTorch 2.11.0+cu130, transformers 5.17.0, 2026-11-27). The measurements are
// tests/data/h100/arch/cuda_runs.json, their memory snapshots (frames stripped)
// tests/data/h100/arch/snapshots.tar.xz (extracted into the build tree by CMake).
//
// 1. Every snapshot replays through the allocator emulator with no mismatch.
// 2. Each run is simulated from its committed scenario (tests/data/h100/arch/NAME.yaml,
//    loaded as `memsim run` loads it) and the measured step's max_memory_allocated /
//    max_memory_reserved compared: exact unless kKnownGaps names the run, with the gap
//    measured and its cause (found from the trace, or "not found") beside it.
// 3. The blind record stays honest: where memsim's prediction today differs from the blind
//    file, the table prints both, and the test fails if a prediction got worse.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
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

const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/h100/arch/cuda_runs.json";
const std::string kBlind = MEMSIM_SOURCE_DIR + "/tests/data/h100/blind3_arch_predictions.json";
const std::string kSnapshots = MEMSIM_H100_ARCH_SNAPSHOTS;

// Runs whose prediction is not exact: the largest relative error allowed (the measured one,
// rounded up) and why.
struct KnownGap {
  double allocated, reserved;
  const char* why;
};
const std::map<std::string, KnownGap> kKnownGaps = {
    // Stand-ins (tools/fixtures/torch_models.DecoderForCausalLM, the code memsim follows).
    // In the trace, embedding backward allocates CUB's radix-sort scratch (83456 B) and two
    // 1536 B blocks that memsim does not emit (as in test_h100_runs.cpp's autocast run):
    // the small pool's blocks are then placed differently; requested bytes are the same.
    {"arch_phi3_l4_d1024_s1024_b4_fp32", {0.00018, 0.0, "CUB scratch in embedding backward"}},
    {"arch_phi3_l4_d1024_s1024_b4_bf16", {0.00018, 0.0, "CUB scratch in embedding backward"}},
    // bf16 llama / qwen2 / mistral: reserved exact, allocated 1.5-3 MiB low with requested
    // bytes at the peak exact. Blind, the biased rows also lacked the out-of-place sums of
    // their biased projections' input grads (8 MiB each; docs/input-buffer.md), modelled
    // since: each run's large-pool allocations and frees are now the trace's one for one and
    // in order but for one pair of frees at the end of each forward: the stand-in's model()
    // drops the last layer's output when `hidden_states = self.norm(hidden_states)` rebinds
    // it, before the mask dies at return; memsim follows transformers 4.45's LlamaModel,
    // whose `layer_outputs` tuple keeps that output until return (after the mask). The
    // swapped frees place later blocks differently (replaying the trace itself gives the
    // measured peak exactly). qwen2: -0.010% blind, -0.060% since the q/k/v sums.
    {"arch_llama_l4_d1024_s1024_b4_bf16", {0.0004, 0.0, "stand-in frees the last layer output before the mask"}},
    {"arch_qwen2_l4_d1024_s1024_b4_bf16", {0.0006, 0.0, "stand-in frees the last layer output before the mask (-0.010% blind)"}},
    {"arch_mistral_l4_d1024_s1024_b4_bf16", {0.0007, 0.0, "stand-in frees the last layer output before the mask"}},
    {"arch_qwen3_l4_d1024_s1024_b4_bf16", {0.0003, 0.0, "bf16 backward, cause not found"}},
    {"arch_olmo2_l4_d1024_s1024_b4_bf16", {0.0003, 0.0, "bf16 backward, cause not found"}},
    {"arch_qwen2.5-0.5b_s2048_b2_bf16", {0.00003, 0.0, "bf16 backward, cause not found"}},
    // Allocated exact; the cache holds the same bytes in a different layout of segments.
    {"arch_gemma_l4_d1024_s1024_b4_bf16", {0.0, 0.0025, "segment layout, cause not found"}},
    {"arch_gemma3_text_l6_d1024_s1024_b4_bf16", {0.0, 0.003, "segment layout, cause not found"}},
    // Since Qwen3's q/k-norm grad copies were modelled (eager attention: the first view's
    // backward copies the grad, graph/models/decoder_attention.cpp; this run's trace has all
    // 112 of them, 8 and 16 MiB, which memsim lacked): allocated 768 KiB low at the peak
    // (one live block's unsplit remainder, a placement difference; not found), reserved as
    // before. Before the copies it was exact in allocated.
    {"arch_qwen3-0.6b_s2048_b2_bf16", {0.00002, 0.00005, "768 KiB block remainder since the q/k grad copies; segment layout"}},
    // Blind: allocated exact, reserved -4.2%: memsim held the raw logits until tanh had
    // allocated (a third 250 MiB segment); the trace frees them when `logits = logits / cap`
    // rebinds the name. Fixed (DecoderModel::softcap takes its input by move): -0.19%, the
    // rest not found.
    {"arch_gemma2_l4_d1024_s1024_b4_bf16", {0.0, 0.002, "segment layout, cause not found"}},
    // transformers 5.17 is not the v4.45-era code memsim models (each run's
    // expected_differences in the blind file): its loss has no shifted bf16 copy of the
    // logits (265 MB = b x s x V x 2 B less in bf16), its masks and eager attention
    // function keep other tensors alive.
    {"tf_arch_qwen2_l4_d1024_s1024_b4_fp32", {0.0004, 0.08, "transformers 5.17"}},
    {"tf_arch_qwen3_l4_d1024_s1024_b4_fp32", {0.000001, 0.002, "transformers 5.17"}},
    {"tf_arch_gemma2_l4_d1024_s1024_b4_fp32", {0.0009, 0.003, "transformers 5.17"}},
    {"tf_arch_phi3_l4_d1024_s1024_b4_fp32", {0.0004, 0.009, "transformers 5.17"}},
    {"tf_arch_mistral_l4_d1024_s1024_b4_fp32", {0.0007, 0.08, "transformers 5.17"}},
    {"tf_arch_qwen2.5-0.5b_s2048_b2_bf16", {0.036, 0.003, "transformers 5.17"}},
    {"tf_arch_qwen3-0.6b_s2048_b2_bf16", {0.00002, 0.0011, "transformers 5.17; 768 KiB block remainder since the q/k grad copies"}},
    {"tf_arch_qwen2_l4_d1024_s1024_b4_bf16", {0.054, 0.049, "transformers 5.17"}},
    {"tf_arch_qwen3_l4_d1024_s1024_b4_bf16", {0.000001, 0.0027, "transformers 5.17"}},
    // +4.0% reserved blind; +8.3% since the soft-capping fix above, which brought the stand-in
    // of the same row from -4.2% to -0.19%: with 5.x's loss (no shifted copy) the freed
    // logits' block is reused differently.
    {"tf_arch_gemma2_l4_d1024_s1024_b4_bf16", {0.050, 0.084, "transformers 5.17"}},
    {"tf_arch_phi3_l4_d1024_s1024_b4_bf16", {0.052, 0.048, "transformers 5.17"}},
    {"tf_arch_mistral_l4_d1024_s1024_b4_bf16", {0.053, 0.049, "transformers 5.17"}},
    // HF Trainer's bf16=True (fp32 weights + bf16 autocast) through transformers 5.17: refused
    // when the blind file was written; the Qwen2 row was predicted (6269316608 / 6392119296 B,
    // commit 35a6cb4) before this measurement. The allocated gap is the bf16-logits copy
    // transformers 5.x no longer makes (as in the bf16 row above).
    {"tf_arch_qwen2_l4_d1024_s1024_b4_fp32_autocast_bf16", {0.044, 0.004, "transformers 5.17"}},
    // The two SDPA runs (the next lease; unforced SDPA ran cuDNN attention): blind +9.21% /
    // +1.82% allocated, +2.06% / +1.91% reserved. v4.45's sdpa path repeats K/V (repeat_kv's
    // copies, 16/8 MiB per layer) and keeps the shifted bf16 logits copy; 5.17 passes
    // enable_gqa=True and has neither (the model.transformers: 5 case below and
    // tests/test_sdpa_gqa.cpp).
    {"tf_arch_qwen2_l4_d1024_s1024_b4_bf16_sdpa", {0.093, 0.021, "transformers 5.17: enable_gqa, loss"}},
    {"tf_arch_qwen3_l4_d1024_s1024_b4_bf16_sdpa", {0.019, 0.020, "transformers 5.17: enable_gqa, mask"}},
};

struct Predicted {
  bool refused = false;
  uint64_t allocated = 0, reserved = 0;
};

// The committed scenario simulated, or refused by key (printed as such, checked against
// the blind file).
Predicted simulate(const std::string& scenario_path) {
  Predicted p;
  Scenario s;
  Program program;
  try {
    s = load_scenario(MEMSIM_SOURCE_DIR + "/" + scenario_path);
    program = build_program(s);
  } catch (const std::exception&) {
    p.refused = true;
    return p;
  }
  const memsim_test::SimulatedPeaks peaks = memsim_test::simulate_peaks(s, program);
  REQUIRE(peaks.fits);
  p.allocated = peaks.allocated;
  p.reserved = peaks.reserved;
  return p;
}

using memsim_test::rel;

}  // namespace

TEST_CASE("H100/H200 arch snapshots replay through the emulator with no mismatch", "[h100][arch][replay]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  REQUIRE(runs["results"].size() == 36);
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const Snapshot snap = read_snapshot_file(kSnapshots + "/" + name + ".pickle");
    const ReplayReport rep = replay_snapshot(snap);
    CHECK(rep.mismatches == 0);
    CHECK(rep.final_layout_match);
    CHECK(rep.seeded_segments == 0);  // recorded from before the model was built
    const auto& begin = r["marks"]["measured_step_begin"];
    const uint64_t alloc_peak = std::max(begin["allocated_bytes.all.peak"].get<uint64_t>(),
                                         r["measured_step_peak_allocated"].get<uint64_t>());
    const uint64_t reserved_peak = std::max(begin["reserved_bytes.all.peak"].get<uint64_t>(),
                                            r["measured_step_peak_reserved"].get<uint64_t>());
    CHECK(rep.peak_allocated_bytes == alloc_peak);
    CHECK(rep.peak_reserved_bytes == reserved_peak);
  }
}

TEST_CASE("Arch runs (blind): stand-ins exact or within a diagnosed gap, transformers 5.17 within its gap",
          "[h100][arch]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  const nlohmann::json blind = memsim_test::load_json(kBlind)["predictions"];
  std::printf("\n| arch run (H200) | peak allocated real | blind | now | error | peak reserved real | blind | now | error |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  size_t compared = 0, exact = 0, standins = 0, refused = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const nlohmann::json& sp = r["spec"];
    const std::string name = sp["name"];
    INFO(name);
    const nlohmann::json& b = blind.at(name);
    const Predicted p = simulate(sp["scenario"]);
    const bool was_refused = b.contains("refused");
    if (p.refused) {
      // Measured, not modelled (refused by key then and now): the measurement is kept for
      // the day memsim models it.
      CHECK(was_refused);
      std::printf("| %s | %.2f MiB | refused | refused | | %.2f MiB | refused | refused | |\n", name.c_str(),
                  r["measured_step_peak_allocated"].get<uint64_t>() / 1048576.0,
                  r["measured_step_peak_reserved"].get<uint64_t>() / 1048576.0);
      ++refused;
      continue;
    }
    // The shape is the one memsim simulates: the parameter counts are equal.
    if (b.contains("parameter_count")) CHECK(r["parameters"].get<int64_t>() == b["parameter_count"].get<int64_t>());
    const uint64_t real_a = r["measured_step_peak_allocated"], real_r = r["measured_step_peak_reserved"];
    const double ea = rel(p.allocated, real_a), er = rel(p.reserved, real_r);
    const uint64_t blind_a = was_refused ? 0 : b["peak_allocated_bytes"].get<uint64_t>();
    const uint64_t blind_r = was_refused ? 0 : b["peak_reserved_bytes"].get<uint64_t>();
    std::printf("| %s | %.2f MiB | %s | %.2f MiB | %+.3f%% | %.2f MiB | %s | %.2f MiB | %+.3f%% |\n", name.c_str(),
                real_a / 1048576.0, was_refused ? "refused" : std::to_string(blind_a >> 20).c_str(),
                p.allocated / 1048576.0, 100 * ea, real_r / 1048576.0,
                was_refused ? "refused" : std::to_string(blind_r >> 20).c_str(), p.reserved / 1048576.0, 100 * er);
    ++compared;
    standins += sp["impl"] != "transformers";
    // A stand-in's prediction today is never further from the measurement than the blind
    // one was (transformers runs: a fix to the modelled v4.45 code may move them either way).
    // Except where a rule found later in the traces moved it (kKnownGaps says which):
    // Qwen3's q/k-norm grad copies, the biased q/k/v input grads' out-of-place sums (qwen2
    // bf16: its allocation sequence is the trace's since, its block placement is not).
    if (!was_refused && sp["impl"] != "transformers" && name != "arch_qwen3-0.6b_s2048_b2_bf16" &&
        name != "arch_qwen2_l4_d1024_s1024_b4_bf16") {
      CHECK(std::fabs(ea) <= std::fabs(rel(blind_a, real_a)) + 1e-12);
      CHECK(std::fabs(er) <= std::fabs(rel(blind_r, real_r)) + 1e-12);
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
      exact += p.allocated == real_a && p.reserved == real_r;
    }
  }
  std::printf("%zu arch runs compared (%zu stand-ins), %zu exact in both peaks\n", compared, standins, exact);
  CHECK(compared + refused == 36);
  CHECK(refused <= 1);  // Gemma-2 under autocast (model.norm_placement) at most
  CHECK(standins == 20);
}

using memsim_test::large_allocs;

// Is `sub` a subsequence of `all` (in order, not necessarily adjacent)?
bool is_subsequence(const std::vector<uint64_t>& sub, const std::vector<uint64_t>& all) {
  size_t j = 0;
  for (uint64_t x : all)
    if (j < sub.size() && sub[j] == x) ++j;
  return j == sub.size();
}

TEST_CASE("Arch fp32 stand-ins: every large allocation of the program appears in the trace, in order",
          "[h100][arch]") {
  // Setup, warm-up and measured step of each fp32 stand-in whose peaks came out exact: the
  // parameters, each activation, gradient, optimizer state and workspace above 1 MiB. Blind,
  // the biased rows' traces had more: the out-of-place sums of the biased projections' input
  // grads (llama 16, qwen2 8; InputBuffer::add in the C++-frame runs, docs/input-buffer.md),
  // modelled since: the sequences are now identical, in order. Gemma-3's two q/k-sized
  // allocations per layer in each backward (32 and 16 MiB, freed after the projection's
  // MmBackward0) were the q/k views' reshape copies: the norms on the transposed views hand
  // back contiguous (B,H,S,hd) grads (tools/fixtures/probe_qk_norm_grad_layout.py), modelled
  // since 2026-11-28 (24 in the trace were not in memsim before).
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  size_t checked = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const nlohmann::json& sp = r["spec"];
    const std::string name = sp["name"];
    if (sp["impl"] == "transformers" || sp["dtype"] != "fp32" || kKnownGaps.count(name)) continue;
    INFO(name);
    const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/" + sp["scenario"].get<std::string>());
    const std::vector<uint64_t> predicted = large_allocs(build_program(s));
    const std::vector<uint64_t> real = large_allocs(read_snapshot_file(kSnapshots + "/" + name + ".pickle"));
    CHECK(is_subsequence(predicted, real));
    const size_t extra = real.size() - predicted.size();
    std::printf("%s: %zu large allocations, %zu more in the trace\n", name.c_str(), predicted.size(), extra);
    CHECK(extra == 0);
    CHECK(predicted == real);
    ++checked;
  }
  CHECK(checked == 8);
  // Gemma-3 in bf16 (a known reserved gap, so not in the loop): its large allocations are
  // the trace's too, the q/k reshape copies included (2351 of 2375 before them).
  const Scenario g3 = load_scenario(MEMSIM_SOURCE_DIR + "/tests/data/h100/arch/arch_gemma3_text_l6_d1024_s1024_b4_bf16.yaml");
  const std::vector<uint64_t> g3_predicted = large_allocs(build_program(g3));
  CHECK(g3_predicted == large_allocs(read_snapshot_file(kSnapshots + "/arch_gemma3_text_l6_d1024_s1024_b4_bf16.pickle")));
  CHECK(g3_predicted.size() == 2375);
}

TEST_CASE("Arch runs of transformers 5.17 with model.transformers: 5", "[h100][arch][transformers5]") {
  // The same runs simulated with 5.x's placements (scenario/transformers_version.h). The
  // allowed error is the measured one, rounded up. Since 2026-11-28 (modelled after the
  // measurement) the rows build 5.17's masking_utils masks (graph/models/decoder_mask_v5.h,
  // docs/transformers5-mask.md): the fp32 reserved gaps of qwen2 and mistral (-7.9%, then
  // "not found") closed with the 16 MiB (B,1,S,S) mask; Phi-3's reserved went from +0.8% /
  // exact to +9.2% / +9.6%. Its cause in the graph was 5.17's rotary cat (modelled since:
  // the test below); what is left of it is segment placement. Earlier bounds in the
  // comments where they moved. The runs' loop (measure_cuda.py run_one: `logits =
  // model(input_ids=ids, labels=labels)`) is step.keep_output: model-loss, the previous
  // output dying after the in-forward loss (tests/test_keep_output_model_loss.cpp); with
  // keep_output true every peak of this table is the same byte for byte (2026-11-28).
  const std::map<std::string, KnownGap> v5 = {
      {"tf_arch_qwen2_l4_d1024_s1024_b4_fp32", {0.00035, 0.0, ""}},  // reserved 0.08 before
      {"tf_arch_qwen3_l4_d1024_s1024_b4_fp32", {0.000001, 0.0022, "segment layout (0.0016 before the mask), not found"}},
      {"tf_arch_gemma2_l4_d1024_s1024_b4_fp32", {0.000001, 0.0003, ""}},  // reserved 0.0037 before
      // Phi-3: since 5.17's rotary cat is modelled (rope_pass_cat) every large allocation is
      // the trace's, in order, and the requested peak within 132 B; what is left is where the
      // driver put the segments (docs/segment-placement.md): memsim's Program with its
      // segments placed below the older ones (the driver's usual choice) reaches the real
      // reserved exactly and the allocated within 1 KiB (fp32) / 129 KiB (bf16); with
      // memsim's rising addresses the block remainders differ. Before: 0.000001 / 0.093 and
      // 0.00006 / 0.097 (+9.2% / +9.6% reserved; exact even under the driver's placement).
      {"tf_arch_phi3_l4_d1024_s1024_b4_fp32", {0.00018, 0.085, "segment addresses (docs/transformers5-mask.md)"}},
      {"tf_arch_mistral_l4_d1024_s1024_b4_fp32", {0.00035, 0.0, ""}},  // reserved 0.08 before
      {"tf_arch_qwen2.5-0.5b_s2048_b2_bf16", {0.00004, 0.0027, "segment layout (0.0024 before the mask), not found"}},
      {"tf_arch_qwen3-0.6b_s2048_b2_bf16", {0.00002, 0.0012, "768 KiB block remainder since the q/k grad copies (arch_qwen3-0.6b's gap)"}},
      // -1,024 B since the q/k/v input grads' out-of-place sums (docs/input-buffer.md); -1.5 MiB
      // before them, since the mask (+0.021% before the mask).
      {"tf_arch_qwen2_l4_d1024_s1024_b4_bf16", {0.000001, 0.0, "1 KiB under"}},
      {"tf_arch_qwen3_l4_d1024_s1024_b4_bf16", {0.000001, 0.0007, ""}},  // reserved 0.0027 before
      {"tf_arch_gemma2_l4_d1024_s1024_b4_bf16", {0.000001, 0.0007, ""}},
      {"tf_arch_phi3_l4_d1024_s1024_b4_bf16", {0.00076, 0.097, "segment addresses (docs/transformers5-mask.md)"}},
      {"tf_arch_mistral_l4_d1024_s1024_b4_bf16", {0.000001, 0.0, ""}},  // allocated 0.00022 before
      // HF Trainer's bf16=True: fp32 weights, bf16 autocast. Not used to derive the layout.
      // -5 KiB allocated when first simulated; +1 MiB (+0.017%) since eager_attention_forward
      // keeps its repeated K/V until it returns (Python locals; the generate fixtures'
      // correction): under autocast those fp32 copies are not saved, so they now live
      // through the output's .contiguous(). Reserved exact either way.
      {"tf_arch_qwen2_l4_d1024_s1024_b4_fp32_autocast_bf16", {0.00018, 0.0, "repeated K/V lifetime"}},
      // The SDPA runs (their committed scenarios say flash; cuDNN ran: 5 + cudnn in
      // tests/test_sdpa_gqa.cpp): 5.x's enable_gqa call, no repeat_kv. Reserved exact;
      // allocated 1 MiB + 5 KiB / 5 KiB under (a block's unsplit remainder: placement).
      {"tf_arch_qwen2_l4_d1024_s1024_b4_bf16_sdpa", {0.00032, 0.0, "enable_gqa; block remainder"}},
      {"tf_arch_qwen3_l4_d1024_s1024_b4_bf16_sdpa", {0.000002, 0.0, "enable_gqa"}},
  };
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::printf("\n| transformers 5.17 run, model.transformers: 5 | allocated error | reserved error |\n|---|---:|---:|\n");
  size_t checked = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    const auto gap = v5.find(name);
    if (gap == v5.end()) continue;
    INFO(name);
    const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/" + r["spec"]["scenario"].get<std::string>(),
                                     {{"model.transformers", "5"}, {"step.keep_output", "model-loss"}});
    const memsim_test::SimulatedPeaks a = memsim_test::simulate_peaks(s);
    const double ea = rel(a.allocated, r["measured_step_peak_allocated"].get<uint64_t>());
    const double er = rel(a.reserved, r["measured_step_peak_reserved"].get<uint64_t>());
    std::printf("| %s | %+.3f%% | %+.3f%% |\n", name.c_str(), 100 * ea, 100 * er);
    CHECK(std::fabs(ea) <= gap->second.allocated);
    CHECK(std::fabs(er) <= gap->second.reserved);
    ++checked;
  }
  CHECK(checked == v5.size());
}

TEST_CASE("Phi-3 on transformers 5.17: every large allocation of the trace, in order",
          "[h100][arch][transformers5]") {
  // 5.17's Phi-3 apply_rotary_pos_emb cats each rotated projection with its (empty) pass
  // slice: a contiguous copy right after the sum, which then dies, so the scores' matmul
  // copies neither q nor k; in backward each empty slice's SliceBackward0 allocates
  // zeros(q) and zeros(k) (graph/models/decoder_attention.cpp, rope_pass_cat;
  // docs/transformers5-mask.md). Modelled as memsim's v4.45 rotation (the matmul's q/k
  // copies), the sequences differed from layer 0 on and memsim had 16 fewer large
  // allocations per run (832 and 940 of 848 and 956). Setup, warm-up and measured step.
  const std::pair<const char*, size_t> runs[] = {{"tf_arch_phi3_l4_d1024_s1024_b4_fp32", 848},
                                                 {"tf_arch_phi3_l4_d1024_s1024_b4_bf16", 956}};
  for (const auto& [name, count] : runs) {
    INFO(name);
    const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/tests/data/h100/arch/" + name + ".yaml",
                                     {{"model.transformers", "5"}, {"step.keep_output", "model-loss"}});
    const std::vector<uint64_t> predicted = large_allocs(build_program(s));
    const std::vector<uint64_t> real = large_allocs(read_snapshot_file(kSnapshots + "/" + name + ".pickle"));
    CHECK(real.size() == count);
    CHECK(predicted == real);
  }
}

TEST_CASE("model.transformers: refused where 5.x is not measured", "[transformers5]") {
  auto fails = [](const std::string& yaml, const std::string& needle) {
    try {
      (void)build_program(load_scenario_text(yaml, "t.yaml"));  // the settings checks run in the build
    } catch (const std::exception& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("accepted: " << yaml);
  };
  const std::string base =
      "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, vocab: 128, "
      "context_length: 64, architecture: ";
  fails(base + "qwen2, transformers: 6}\n", "model.transformers: '6' is not a modelled");
  fails(base + "gemma, transformers: 5}\n", "not measured for the gemma row");
  fails("model: {preset: gpt2-medium, transformers: 5}\n", "Llama-lineage rows of hf-llama");
  // Under autocast: the 5.x layout is checked for qwen2 and llama only.
  fails(base + "mistral, transformers: 5}\nprecision: {params: fp32, autocast: bf16}\n", "model.architecture");
  (void)build_program(load_scenario_text(base + "qwen2, transformers: 5}\nprecision: {params: fp32, autocast: bf16}\n", "t.yaml"));
  // 4 is each row's v4 code: the same scenario as without the key.
  const Scenario four = load_scenario_text(base + "qwen2, transformers: 4}\n", "t.yaml");
  const Scenario none = load_scenario_text(base + "qwen2}\n", "t.yaml");
  CHECK(four.model.arch.attn_rope_buffer == none.model.arch.attn_rope_buffer);
  CHECK(four.model.arch.loss == none.model.arch.loss);
  const Scenario five = load_scenario_text(base + "qwen2, transformers: 5}\n", "t.yaml");
  CHECK(five.model.arch.loss == graph::CausalLoss::pad);
  CHECK_FALSE(five.model.arch.attn_rope_buffer);
}
