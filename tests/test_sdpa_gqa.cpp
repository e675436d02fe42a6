// transformers 5.x's grouped-query SDPA call (enable_gqa=True instead of repeat_kv) and SDPA's
// cuDNN backend (model.attention: cudnn), against the two SDPA runs of the arch lease
// (tests/data/h100/arch/tf_arch_qwen2/qwen3_l4_d1024_s1024_b4_bf16_sdpa: transformers 5.17.0,
// PyTorch 2.11.0+cu130, an H200, unforced SDPA, which ran cuDNN attention), and the
// refusals around them (scenario/sdpa_kernel_keys.h, docs/sdpa-gqa.md).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/h100/arch/cuda_runs.json";
const std::string kSnapshots = MEMSIM_H100_ARCH_SNAPSHOTS;

// Allocations (count, bytes) whose op or autograd node is `op`.
std::pair<size_t, uint64_t> allocs_of(const Program& p, const std::string& op) {
  size_t n = 0;
  uint64_t bytes = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(e.op) == op) {
      ++n;
      bytes += e.bytes;
    }
  return {n, bytes};
}

const std::string kSmall =
    "model: {family: hf-llama, architecture: qwen2, layers: 2, d_model: 256, heads: 8, kv_heads: 2, "
    "d_ff: 512, vocab: 512, context_length: 128, transformers: 5, attention: flash}\n"
    "batch: {micro_batch: 2, seq_len: 128}\nprecision: {params: bf16}\n";

}  // namespace

TEST_CASE("transformers 5.x SDPA with grouped KV heads: enable_gqa, no repeat_kv copies", "[gqa]") {
  // B 2, S 128, H 8, KV 2, hd 32, bf16: q 128 KiB, k/v 32 KiB, repeat_kv's copies 128 KiB.
  const uint64_t q_bytes = 2 * 128 * 8 * 32 * 2, kv_bytes = q_bytes / 4;
  const Program v5 = build_program(load_scenario_text(kSmall, "t.yaml"));
  const Program v4 = build_program(load_scenario_text(kSmall, "t.yaml", {{"model.transformers", "4"}}));
  // v4's sdpa_attention_forward repeats k and v (two clones per layer and forward, and
  // ExpandBackward0's sums in backward); 5.x hands SDPA the KV-headed k/v.
  CHECK(allocs_of(v4, "ExpandBackward0").first > 0);
  CHECK(allocs_of(v5, "ExpandBackward0").first == 0);
  // Flash's backward with grouped heads: dq, dk, dv in q/k/v's shapes, softmax_d, dq_accum,
  // then FA2's dk_expanded / dv_expanded (q-sized each). Per layer and backward:
  const uint64_t sr = 128, softmax_d = 2 * 8 * sr * 4, dq_accum = 2 * sr * 8 * 32 * 4;
  const auto [n5, b5] = allocs_of(v5, "ScaledDotProductFlashAttentionBackward0");
  const auto [n4, b4] = allocs_of(v4, "ScaledDotProductFlashAttentionBackward0");
  CHECK(n5 % 7 == 0);
  CHECK(n4 % 5 == 0);
  CHECK(n5 / 7 == n4 / 5);  // the same number of backward calls
  const uint64_t calls = n5 / 7;
  CHECK(b5 == calls * (q_bytes + 2 * kv_bytes + softmax_d + dq_accum + 2 * q_bytes));
  CHECK(b4 == calls * (3 * q_bytes + softmax_d + dq_accum));
}

TEST_CASE("cuDNN attention: seed, offset, workspaces, grouped KV heads natively", "[gqa][cudnn]") {
  const std::string yaml = kSmall;
  const Program p = build_program(load_scenario_text(yaml, "t.yaml", {{"model.attention", "cudnn"}}));
  const uint64_t B = 2, H = 8, S = 128, hd = 32, q_bytes = B * H * S * hd * 2, kv_bytes = q_bytes / 4;
  // Forward: seed 8, offset 8, out (q-sized), logsumexp B*H*S*4, workspace 256 per call.
  const auto [nf, bf] = allocs_of(p, "_scaled_dot_product_cudnn_attention");
  REQUIRE(nf % 5 == 0);
  CHECK(bf == nf / 5 * (8 + 8 + q_bytes + B * H * S * 4 + 256));
  // Backward: dq, dk, dv (KV-sized), one workspace: fp32 dQ + two low-precision dK/dV for
  // every query head + the statistics.
  const auto [nb, bb] = allocs_of(p, "ScaledDotProductCudnnAttentionBackward0");
  REQUIRE(nb % 4 == 0);
  const uint64_t ws = B * H * S * hd * 4 + 2 * q_bytes + B * H * S * 4 + 256;
  CHECK(bb == nb / 4 * (q_bytes + 2 * kv_bytes + ws));
  // MHA: no grouped term in the workspace.
  const Program mha = build_program(load_scenario_text(yaml, "t.yaml", {{"model.attention", "cudnn"}, {"model.kv_heads", "8"}}));
  const auto [nm, bm] = allocs_of(mha, "ScaledDotProductCudnnAttentionBackward0");
  CHECK(bm == nm / 4 * (3 * q_bytes + B * H * S * hd * 4 + B * H * S * 4 + 256));
}

TEST_CASE("The arch lease's SDPA runs (cuDNN, enable_gqa) with model.transformers 5", "[gqa][h100][arch]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::printf("\n| SDPA run (H200, cuDNN ran) | real alloc | 5 + cudnn | error | 5 + flash | error | real reserved | 5 + cudnn | error | 5 + flash | error |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  size_t checked = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    if (r["spec"]["attention"] != "sdpa") continue;
    INFO(name);
    const std::string path = MEMSIM_SOURCE_DIR + "/" + r["spec"]["scenario"].get<std::string>();
    const Scenario cudnn = load_scenario(path, {{"model.transformers", "5"}, {"model.attention", "cudnn"}});
    const Scenario flash = load_scenario(path, {{"model.transformers", "5"}});
    const Program pc = build_program(cudnn);
    const std::vector<uint64_t> pred_large = memsim_test::large_allocs(pc);  // before executing it
    const memsim_test::SimulatedPeaks c = memsim_test::simulate_peaks(cudnn, pc);
    const memsim_test::SimulatedPeaks f = memsim_test::simulate_peaks(flash);
    const uint64_t ra = r["measured_step_peak_allocated"], rr = r["measured_step_peak_reserved"];
    std::printf("| %s | %llu | %llu | %+.4f%% | %llu | %+.4f%% | %llu | %llu | %+.4f%% | %llu | %+.4f%% |\n",
                name.c_str(), (unsigned long long)ra, (unsigned long long)c.allocated,
                100 * memsim_test::rel(c.allocated, ra), (unsigned long long)f.allocated,
                100 * memsim_test::rel(f.allocated, ra), (unsigned long long)rr,
                (unsigned long long)c.reserved, 100 * memsim_test::rel(c.reserved, rr),
                (unsigned long long)f.reserved, 100 * memsim_test::rel(f.reserved, rr));
    // cuDNN, the kernel that ran: reserved exact; allocated within one block's unsplit
    // remainder (qwen2: 1 MiB + 1 KiB under, the requested bytes at the peak 130 B apart;
    // qwen3: 1 KiB under), a placement difference whose cause is not found.
    CHECK(c.reserved == rr);
    const double gap = name.find("qwen2") != std::string::npos ? 0.00032 : 0.000002;
    CHECK(std::fabs(memsim_test::rel(c.allocated, ra)) <= gap);
    // The cuDNN backward workspaces, one per layer and backward, of the size the trace has.
    const Snapshot snap = read_snapshot_file(kSnapshots + "/" + name + ".pickle");
    // B 4, H 16, S 1024: hd 64 (qwen2) or 128 (qwen3), 4 or 8 KV heads.
    const uint64_t hd = name.find("qwen2") != std::string::npos ? 64 : 128;
    const uint64_t ws = 4 * 16 * 1024 * hd * 4 * 2 + 4 * 16 * 1024 * 4 + 256;
    // The trace lists requested sizes, large_allocs(Program) the allocator's 512 B rounding.
    const uint64_t ws_rounded = (ws + 511) / 512 * 512;
    const std::vector<uint64_t> real_large = memsim_test::large_allocs(snap);
    CHECK(std::count(real_large.begin(), real_large.end(), ws) == 8);  // 4 layers x 2 steps
    CHECK(std::count(pred_large.begin(), pred_large.end(), ws_rounded) == 8);
    // No repeat_kv: the trace has no k/v copy of q's size in the forward, and neither has
    // memsim's program (checked by op in the first test case); forced flash would hold the same
    // bytes at the peak within a few KiB (its four backward buffers sum to cuDNN's workspace).
    CHECK(std::fabs(memsim_test::rel(f.allocated, ra)) <= gap);
    CHECK(f.reserved == rr);
    ++checked;
  }
  CHECK(checked == 2);
}

TEST_CASE("SDPA kernels: refused where not modelled, exit 1 naming the key", "[gqa][cudnn]") {
  using Set = std::vector<std::pair<std::string, std::string>>;
  auto fails = [](const std::string& yaml, const Set& set, const std::string& needle) {
    try {
      (void)build_program(load_scenario_text(yaml, "t.yaml", set));
    } catch (const std::exception& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("accepted: " << yaml);
  };
  // torch 2.11's mem-efficient kernel rejects enable_gqa: SDPA runs math.
  fails(kSmall, {{"model.attention", "mem-efficient"}}, "model.attention: mem-efficient with grouped KV heads");
  fails(kSmall, {{"model.attention", "cudnn"}, {"precision.params", "fp32"}}, "model.attention: cudnn with fp32");
  fails(kSmall, {{"model.attention", "cudnn"}, {"precision.params", "fp32"}, {"parallel.sharding", "fsdp2"}, {"parallel.data", "2"}}, "model.attention: cudnn with fp32");
  fails(kSmall, {{"model.attention", "cudnn"}, {"checkpoint.policy", "selective"}}, "checkpoint.policy:");
  fails(kSmall, {{"model.attention", "cudnn"}, {"model.dropout", "0.1"}}, "model.dropout:");
  fails("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 100, attention: cudnn}\n"
        "precision: {params: bf16}\nbatch: {seq_len: 16}\n", {}, "cuDNN attention is modelled for hf-llama");
  fails("model: {family: hf-llama, layers: 2, d_model: 256, heads: 8, d_ff: 512, vocab: 512, "
        "implementation: torchtitan, attention: cudnn}\nprecision: {params: bf16}\nbatch: {seq_len: 64}\n",
        {}, "cuDNN attention is modelled on transformers' code");
  // Accepted: 5.x with MHA on mem-efficient, GQA on eager, flash and cudnn; 4 with GQA on
  // mem-efficient (repeat_kv's copies, then an MHA call).
  (void)build_program(load_scenario_text(kSmall, "t.yaml", {{"model.attention", "mem-efficient"}, {"model.kv_heads", "8"}}));
  (void)build_program(load_scenario_text(kSmall, "t.yaml", {{"model.attention", "eager"}}));
  (void)build_program(load_scenario_text(kSmall, "t.yaml", {{"model.attention", "cudnn"}, {"checkpoint.policy", "full"}}));
  (void)build_program(load_scenario_text(kSmall, "t.yaml", {{"model.attention", "mem-efficient"}, {"model.transformers", "4"}}));
  // cudnn over fp32 parameters with 16-bit compute: FSDP2's MixedPrecisionPolicy(param_dtype bf16).
  (void)build_program(load_scenario_text(kSmall, "t.yaml", {{"model.attention", "cudnn"}, {"precision.params", "fp32"}, {"parallel.sharding", "fsdp2"}, {"parallel.data", "2"}, {"parallel.fsdp_mixed_precision", "bf16"}}));
}
