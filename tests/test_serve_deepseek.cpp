// memsim serve for DeepSeek-V2 / V2-Lite / V3 (issue #17; docs/serve.md "DeepSeek-V2 / V3"):
// vLLM's MLA weight layout against parameter counts computed here from the configs (the
// model cards' 15.7B and 671B), the per-rank split under TP, the KV page of one latent, the
// block arithmetic, the profile run's MLA and grouped top-k buffers by hand, the refusals,
// and the shipped scenario end to end. No published vLLM start-up log with a full
// configuration was found for these models (docs/serve.md "Evidence").
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "graph/runtime.h"
#include "scenario/scenario.h"
#include "sim/serve/deepseek_mla.h"
#include "sim/serve/kv_layout.h"
#include "sim/serve/serve_plan.h"
#include "sim/serve/served_model.h"
#include "sim/serve/vllm_profile_run.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim::serve;

namespace {

Scenario ds_scenario(const std::string& model_lines, const std::string& serve_body,
                     const std::string& device = "h100-80gb") {
  // model.attention only matters to `memsim run` (its MLA is eager-only); serve ignores it.
  const std::string text = "name: t\nmodel:\n" + model_lines + "  attention: eager\nprecision:\n  params: bf16\ndevice:\n  preset: " +
                           device + "\nserve:\n" + serve_body;
  return load_scenario_text(text, "t.yaml", {});
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const std::string kLite = "  preset: deepseek-v2-lite\n";
const std::string kV2 = "  preset: deepseek-v2\n";
const std::string kV3 = "  hf_config: " + MEMSIM_SOURCE_DIR + "/tests/data/moe_configs/deepseek-v3-bf16.json\n";

// The parameters of a DeepSeek-V2/V3 config as the model card counts them (embeddings,
// lm_head, MLA, dense and MoE MLPs, norms; no MTP layer), from the config's numbers.
struct DsConfig {
  uint64_t D, V, L, H, ql, kl, nope, rope, v, dff, E, I, S, first;
};
uint64_t card_parameters(const DsConfig& c) {
  const uint64_t q = c.ql > 0 ? c.ql * c.D + c.ql + c.H * (c.nope + c.rope) * c.ql : c.H * (c.nope + c.rope) * c.D;
  const uint64_t attn = q + (c.kl + c.rope) * c.D + c.kl + c.H * (c.nope + c.v) * c.kl + c.D * c.H * c.v;
  const uint64_t dense = 3 * c.D * c.dff;
  const uint64_t moe = c.E * c.D + c.E * 3 * c.I * c.D + 3 * c.S * c.I * c.D;
  return 2 * c.V * c.D + c.D + c.L * (attn + 2 * c.D) + c.first * dense + (c.L - c.first) * moe;
}
const DsConfig kLiteCfg{2048, 102400, 27, 16, 0, 512, 128, 64, 128, 10944, 64, 1408, 2, 1};
const DsConfig kV3Cfg{7168, 129280, 61, 128, 1536, 512, 128, 64, 128, 18432, 256, 2048, 1, 3};

}  // namespace

TEST_CASE("DeepSeek weights through vLLM's layout match the cards' parameter counts", "[serve][serve-deepseek]") {
  // DeepSeek-V2-Lite: 15,706,484,224 parameters (the card's 15.7B). Every tensor is a
  // multiple of 512 B in bf16, so "Model loading took" is 2 B per parameter plus the one
  // deepseek_yarn RoPE cache: 4096 x 40 = 163,840 rows of 64 (bf16).
  CHECK(card_parameters(kLiteCfg) == 15706484224ull);
  const ServedModel lite = served_model(ds_scenario(kLite, "  engine: vllm\n"));
  CHECK(lite.mla.enabled());
  CHECK(lite.mla.q_lora_rank == 0);
  CHECK(lite.rope_rows == 163840);
  const std::vector<WeightTensor> lt = vllm_weight_tensors(lite);
  CHECK(weights_bytes(lt) == 2 * 15706484224ull + 163840ull * 64 * 2);  // 29.2751 GiB
  bool has_q_proj = false, has_kv_a = false, has_bias = false;
  for (const WeightTensor& w : lt) {
    has_q_proj = has_q_proj || w.name == "model.layers.0.self_attn.q_proj.weight";
    has_kv_a = has_kv_a || w.name == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
    has_bias = has_bias || w.name.find("e_score_correction_bias") != std::string::npos;
  }
  CHECK(has_q_proj);
  CHECK(has_kv_a);
  CHECK_FALSE(has_bias);  // V2's router has no correction bias

  // DeepSeek-V3 in bf16: 671,026,404,352 parameters (the card's 671B, without the 14B MTP
  // module, which vLLM's main model does not load), plus V3's fp32 e_score_correction_bias
  // [256] in each of the 58 MoE layers and the RoPE cache.
  CHECK(card_parameters(kV3Cfg) == 671026404352ull);
  const ServedModel v3 = served_model(ds_scenario(kV3, "  engine: vllm\n"));
  CHECK(v3.moe.correction_bias);
  CHECK(v3.moe.sigmoid);
  CHECK(weights_bytes(vllm_weight_tensors(v3)) == 2 * 671026404352ull + 58ull * 256 * 4 + 163840ull * 64 * 2);

  // TP 8: fused_qkv_a_proj, the q_a / kv_a layernorms, the layer norms, the router gate and
  // its bias are replicated; q_b_proj, kv_b_proj, o_proj, the dense MLPs, the experts'
  // intermediate dim, the shared experts and the (64-padded) vocabulary are split by 8.
  const ServedModel v3tp8 = served_model(ds_scenario(kV3, "  tensor_parallel: 8\n"));
  const uint64_t D = 7168, H = 128 / 8;
  const uint64_t attn = (1536 + 576) * D * 2 + 1536 * 2 + 512 * 2 + H * 192 * 1536 * 2 + H * 256 * 512 * 2 +
                        D * H * 128 * 2;
  const uint64_t dense = 3 * D * (18432 / 8) * 2;
  const uint64_t moe = 256 * D * 2 + 256 * 4 + 256 * 3 * (2048 / 8) * D * 2 + 3 * (2048 / 8) * D * 2;
  const uint64_t expected = 2 * (129280 / 8) * D * 2 + D * 2 + 61 * (attn + 2 * D * 2) + 3 * dense + 58 * moe +
                            163840ull * 64 * 2;
  CHECK(weights_bytes(vllm_weight_tensors(v3tp8)) == expected);  // 157.9 GiB per rank
  // V2 (q_lora_rank 1536, 160 experts): the fused a-projection is one replicated tensor.
  const ServedModel v2 = served_model(ds_scenario(kV2, "  tensor_parallel: 8\n"));
  CHECK(v2.mla.q_lora_rank == 1536);
  CHECK(v2.mla.heads_rank == 16);
  CHECK(v2.moe.grouped);
  CHECK_FALSE(v2.moe.correction_bias);
}

TEST_CASE("DeepSeek KV page: one 576-wide latent per token and layer, not split by TP", "[serve][serve-deepseek]") {
  for (int tp : {1, 2, 4, 8}) {
    const ServedModel m = served_model(ds_scenario(kLite, "  tensor_parallel: " + std::to_string(tp) + "\n"));
    REQUIRE(m.kv.size() == 27);
    CHECK(m.kv[0].mla);
    CHECK(token_bytes(m.kv[0]) == 576 * 2);
    CHECK(page_bytes(m.kv[0], 16) == 18432);  // 16 x 576 x 2
  }
  // fp8 KV: one byte per element.
  const ServedModel f = served_model(ds_scenario(kLite, "  kv_cache_dtype: fp8\n"));
  CHECK(page_bytes(f.kv[0], 16) == 9216);
}

TEST_CASE("DeepSeek-V2-Lite plan: blocks, tokens and concurrency from the budget", "[serve][serve-deepseek]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/deepseek-v2-lite-vllm-h100.yaml");
  const ServePlan p = plan_serve(s);
  REQUIRE(p.fits);
  CHECK(p.kv.page_bytes == 18432);
  // num_gpu_blocks = available // page // layers; tokens = blocks x 16; concurrency at
  // 32768 tokens = blocks / 2048.
  CHECK(p.kv.num_gpu_blocks == p.available_kv_bytes / 18432 / 27);
  CHECK(p.kv.kv_cache_tokens == p.kv.num_gpu_blocks * 16);
  CHECK(p.kv.max_concurrency == Approx(static_cast<double>(p.kv.num_gpu_blocks) / 2048.0));
  // The budget: 0.9 x capacity - weights - activation peak - non-torch.
  const double requested = static_cast<double>(s.device.capacity) * 0.9;
  CHECK(p.available_kv_bytes ==
        static_cast<int64_t>(requested - static_cast<double>(p.weights_bytes) -
                             static_cast<double>(p.activation_peak_bytes.value()) -
                             static_cast<double>(p.non_torch_bytes)));
  // Inverse question: the largest max_model_len one request of which fits (capped at the
  // model's 163840): the latent is small, so the whole context fits.
  CHECK(p.kv.max_model_len_that_fits == 163840);
  CHECK(sequences_that_fit(p, 4096) == p.kv.num_gpu_blocks / 256);
}

TEST_CASE("MLA profile run: the simulated kv_b_proj output and the MLA tensors by hand", "[serve][serve-deepseek]") {
  // MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size.
  CHECK(mla_chunked_prefill_workspace_tokens(32768, 256, 16) == 65536);   // capped at 64K
  CHECK(mla_chunked_prefill_workspace_tokens(2048, 256, 16) == 16384);    // 8 x 2048
  CHECK(mla_chunked_prefill_workspace_tokens(1024, 1024, 16) == 65536);   // 4 x 1024 x 16
  CHECK(mla_chunked_prefill_workspace_tokens(512, 8192, 16) == 131072);   // 1 page per request

  // DeepSeek-V2-Lite, TP 1, compiled, 2048 batched tokens over 64 requests, max_model_len
  // 4096: workspace 32768 tokens. At the up-projection of a MoE layer's attention the live
  // tensors are the residual [T, 2048], kv_a_proj_with_mqa's output was freed after RoPE,
  // q [T, 16 x 192], kv_c_normed [T, 512], k_pe [T, 64], the output [T, 16 x 128] and the
  // simulated kv_b_proj output [32768, 16, 256], plus the cuBLAS workspace.
  const Scenario s = ds_scenario(kLite, "  max_num_batched_tokens: 2048\n  max_num_seqs: 64\n  max_model_len: 4096\n");
  const ServePlan p = plan_serve(s);
  const uint64_t T = 2048;
  const uint64_t upproj = 32768ull * 16 * 256 * 2;
  const uint64_t at_attention = T * 2048 * 2 + T * 16 * 192 * 2 + T * 512 * 2 + T * 64 * 2 + T * 16 * 128 * 2 +
                                upproj + s.device.cublas_workspace;
  CHECK(p.forward_peak_bytes == at_attention);  // 298 MiB, the up-projection dominating
  // The up-projection scales with the workspace: max_model_len 2048 halves it (16384
  // tokens), and the peak moves by exactly the difference.
  const ServePlan h = plan_serve(ds_scenario(kLite, "  max_num_batched_tokens: 2048\n  max_num_seqs: 64\n"
                                                     "  max_model_len: 2048\n"));
  CHECK(h.forward_peak_bytes == at_attention - upproj / 2);
  // --enforce-eager: vLLM's Python frames keep the layer input (the residual view is the
  // embedding / the fused add's output), kv_a_proj_with_mqa's output and the RoPE outputs
  // alive through the attention: more than compiled.
  const ServePlan e = plan_serve(ds_scenario(kLite, "  max_num_batched_tokens: 2048\n  max_num_seqs: 64\n"
                                                     "  max_model_len: 4096\n  cuda_graphs: false\n"));
  CHECK(e.forward_peak_bytes > p.forward_peak_bytes);
  CHECK(e.forward_peak_bytes >= at_attention + T * 576 * 2);
}

TEST_CASE("DeepSeek MoE block: grouped top-k buffers and the shared experts by hand", "[serve][serve-deepseek]") {
  // DeepSeek-V2-Lite, TP 2, compiled, 8192 tokens, max_model_len 512 and 64 sequences so the
  // MLA workspace (max(min(4096, 64K), 1024) = 4096 tokens: 16 MiB) stays below the MoE
  // layer's buffers. Inside fused_experts: the residual and the normed input (written in
  // place), the shared experts' output [T, 2048] (computed first, added in place after),
  // the router logits [T, 64], the grouped top-k's fp32 weights and int32 ids [T, 6],
  // cache13 (T x 6 x max(2 x 704, 2048)) and cache2 (T x 6 x 704), the alignment buffers
  // (BLOCK_SIZE_M 64: T x 6 + 64 x 63 ids), the cuBLAS workspace.
  const Scenario s = ds_scenario(kLite, "  tensor_parallel: 2\n  max_num_batched_tokens: 8192\n"
                                        "  max_num_seqs: 64\n  max_model_len: 512\n");
  const ServePlan p = plan_serve(s);
  const uint64_t T = 8192, row = T * 2048 * 2;
  auto r512 = [](uint64_t b) { return (b + 511) / 512 * 512; };
  const uint64_t padded = T * 6 + 64 * 63;
  const uint64_t expected = 3 * row + r512(T * 64 * 2) + 2 * r512(T * 6 * 4) + T * 6 * 2048 * 2 + T * 6 * 704 * 2 +
                            r512(padded * 4) + r512((padded + 63) / 64 * 4) + 512 + s.device.cublas_workspace;
  CHECK(p.forward_peak_bytes == expected);
}

TEST_CASE("DeepSeek serve refusals", "[serve][serve-deepseek]") {
  // Quantized experts (fp8 block quantization of DeepSeek-V3's checkpoint included).
  CHECK(refusal([] { served_model(ds_scenario(kLite, "  quantization: fp8\n")); })
            .find("serve.quantization: quantized experts") != std::string::npos);
  // The published V3 config carries its fp8 quantization_config: refused where it is read.
  CHECK(refusal([] {
          served_model(ds_scenario("  hf_config: " + MEMSIM_SOURCE_DIR + "/tests/data/moe_configs/deepseek-v3.json\n",
                                   "  engine: vllm\n"));
        }).find("quantization_config") != std::string::npos);
  // 16 heads do not split over 32 ranks; 64 experts cannot be split over 128.
  CHECK(refusal([] { served_model(ds_scenario(kLite, "  tensor_parallel: 32\n")); })
            .find("Total number of attention heads (16) must be divisible by tensor parallel size (32).") !=
        std::string::npos);
  // SGLang's DeepSeek path (its own MLA backends and MoE) is not the one-cell formula.
  CHECK(refusal([] { plan_serve(ds_scenario(kLite, "  engine: sglang\n")); })
            .find("serve.engine: sglang with MoE models") != std::string::npos);
}

TEST_CASE("memsim serve on the shipped DeepSeek-V2-Lite scenario and the inverse questions", "[serve][serve-deepseek]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/deepseek-v2-lite-vllm-h100.yaml";
  auto r = run_shell(memsim_command() + "serve '" + scenario + "' --json -");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const ServePlan p = plan_serve(load_scenario(scenario));
  CHECK(j["weights_bytes"].get<uint64_t>() == p.weights_bytes);
  CHECK(j["weights_bytes"].get<uint64_t>() == 2 * 15706484224ull + 163840ull * 64 * 2);
  CHECK(j["page_size_bytes"].get<int64_t>() == 18432);
  CHECK(j["num_gpu_blocks"].get<int64_t>() == p.kv.num_gpu_blocks);
  CHECK(j["fits"].get<bool>());
  auto t = run_shell(memsim_command() + "serve '" + scenario + "'");
  REQUIRE(t.status == 0);
  CHECK(t.out.find("27 MLA") != std::string::npos);
  CHECK(t.out.find("page size (block x latent x B)") != std::string::npos);
  CHECK(t.out.find("16 x 576 x 2") != std::string::npos);
  // --min-tp: V3 in bf16 (1.22 TiB of weights) needs 16 H200s; 8 hold 157.9 GiB per rank.
  auto m = run_shell(memsim_command() + "serve --model " + MEMSIM_SOURCE_DIR + "/tests/data/moe_configs/deepseek-v3-bf16.json --set device.preset=h200 "
                     "--set model.attention=eager --set serve.max_model_len=8192 --min-tp 16 --json -");
  REQUIRE(m.status == 3);  // the plan as given (TP 1) does not start; the answer is in the JSON
  const nlohmann::json mj = nlohmann::json::parse(m.out);
  CHECK(mj["min_tensor_parallel"].get<int64_t>() == 16);
  CHECK_FALSE(mj["fits"].get<bool>());
}
