// memsim serve for the MoE rows (mixtral, qwen2_moe, qwen3_moe, olmoe) and Gemma-2 / Gemma-3
// text (issue #17; docs/serve.md "Mixture of experts" and "Gemma-2 / Gemma-3"). No published
// vLLM start-up log with a full configuration was found for these models, so every number
// here is hand-computed from vLLM's tensor layout (sim/serve/fused_moe.h, served_model.h):
// the FusedMoE workspace sizes, the weights vLLM's loader holds ("Model loading took"), the
// profile run's forward peak as the sum of the tensors alive inside the experts, Gemma-3's
// two RoPE caches, and the hybrid KV grouping's blocks and tokens.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "graph/runtime.h"
#include "sim/serve/fused_moe.h"
#include "sim/serve/kv_layout.h"
#include "sim/serve/serve_plan.h"
#include "sim/serve/served_model.h"
#include "sim/serve/vllm_profile_run.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim::serve;

namespace {

Scenario family_scenario(const std::string& model_lines, const std::string& serve_body,
                         const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  const std::string text = "name: t\nmodel:\n" + model_lines +
                           "precision:\n  params: bf16\ndevice:\n  preset: h100-80gb\nserve:\n" + serve_body;
  return load_scenario_text(text, "t.yaml", sets);
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const std::string kMixtral = "  preset: mixtral-8x7b\n";
const std::string kQwen15Moe =
    "  hf_config: " + MEMSIM_SOURCE_DIR + "/tests/data/serve/qwen1.5-moe-a2.7b.json\n";

}  // namespace

TEST_CASE("FusedMoE workspace: fused_topk, cache13 / cache2 and moe_align_block_size by hand", "[serve][serve-families]") {
  // Mixtral-8x7B, TP 1, bf16, 8192 tokens: E 8, k 2, I 14336, H 4096.
  MoeDims moe;
  moe.experts = 8;
  moe.top_k = 2;
  moe.d_ff = moe.d_ff_rank = 14336;
  moe.renormalize = true;
  const FusedMoeBuffers b = fused_moe_buffers(moe, 8192, 4096, 2);
  CHECK(b.router_logits == 8192ull * 8 * 2);        // [T, E] bf16
  CHECK(b.topk_weights == 8192ull * 2 * 4);         // fp32
  CHECK(b.topk_ids == 8192ull * 2 * 4);             // int32
  CHECK(b.token_expert_indices == 8192ull * 2 * 4);
  CHECK(b.gating_float == 8192ull * 8 * 4);         // gating_output.float()
  CHECK(b.renorm_sum == 8192ull * 4);
  CHECK(b.chunks == 1);
  CHECK(b.chunk_tokens == 8192);
  CHECK(b.block_m == 64);                            // M 8192 > E 8
  // cache13: M x k x max(N = 2 x 14336, K = 4096) bf16; cache2: M x k x N / 2.
  CHECK(b.cache13 == 939524096ull);
  CHECK(b.cache2 == 469762048ull);
  // sorted_ids: T x k + E x (64 - 1) int32; expert_ids: cdiv(16888, 64) = 264 int32.
  CHECK(b.sorted_ids == 16888ull * 4);
  CHECK(b.expert_ids == 264ull * 4);

  // Chunking: 70,000 tokens at VLLM_FUSED_MOE_CHUNK_SIZE 32768 run 3 chunks, the last of
  // 4,464 tokens; the caches are sized for one chunk.
  const FusedMoeBuffers c = fused_moe_buffers(moe, 70000, 4096, 2);
  CHECK(c.chunks == 3);
  CHECK(c.last_chunk_tokens == 4464);
  CHECK(c.cache13 == 32768ull * 2 * 28672 * 2);
  CHECK(c.sorted_ids == (65536ull + 504) * 4);
  CHECK(c.last_sorted_ids == (8928ull + 504) * 4);
  // TP 2 halves the expert intermediate dim, so N; few tokens pick BLOCK_SIZE_M 16; an fp32
  // model's .float() is free; OLMoE (norm_topk_prob false) has no renormalisation.
  moe.d_ff_rank = 7168;
  moe.renormalize = false;
  const FusedMoeBuffers d = fused_moe_buffers(moe, 8, 4096, 4);
  CHECK(d.block_m == 16);
  CHECK(d.cache13 == 8ull * 2 * 14336 * 4);
  CHECK(d.gating_float == 0);
  CHECK(d.renorm_sum == 0);
}

TEST_CASE("vLLM loader weights of MoE models: w13 / w2 stacked experts, replicated gate, shared expert", "[serve][serve-families]") {
  // Mixtral-8x7B bf16 (scenarios/models/mixtral-8x7b.json): per layer qkv 6144 x 4096,
  // o 4096 x 4096, gate 8 x 4096, w13 8 x 28672 x 4096, w2 8 x 4096 x 14336, two norms;
  // embed and lm_head 32000 x 4096; RoPE cache 32768 x 128.
  const ServedModel m1 = served_model(family_scenario(kMixtral, "  engine: vllm\n"));
  CHECK(m1.moe.experts == 8);
  CHECK(m1.layer_is_moe(0));
  CHECK(weights_bytes(vllm_weight_tensors(m1)) == 93413974016ull);  // 86.9985 GiB
  // TP 2: the experts' intermediate dim and the attention split, the router gate replicated.
  const ServedModel m2 = served_model(family_scenario(kMixtral, "  tensor_parallel: 2\n"));
  CHECK(m2.moe.d_ff_rank == 7168);
  CHECK(weights_bytes(vllm_weight_tensors(m2)) == 46712496128ull);  // 43.5044 GiB
  const ServedModel m4 = served_model(family_scenario(kMixtral, "  tensor_parallel: 4\n"));
  CHECK(weights_bytes(vllm_weight_tensors(m4)) == 23361757184ull);

  // Qwen1.5-MoE-A2.7B: 60 experts of 1408, a 5632-wide shared expert with its 1 x 2048
  // sigmoid gate, qkv bias.
  const ServedModel q = served_model(family_scenario(kQwen15Moe, "  engine: vllm\n"));
  CHECK(q.moe.shared_d_ff == 5632);
  CHECK(!q.moe.renormalize);
  CHECK(weights_bytes(vllm_weight_tensors(q)) == 28633665536ull);
  const ServedModel q2 = served_model(family_scenario(kQwen15Moe, "  tensor_parallel: 2\n"));
  CHECK(weights_bytes(vllm_weight_tensors(q2)) == 14320979968ull);

  // Qwen3-30B-A3B: 128 experts of 768, per-head q/k norms, 48 layers.
  const ServedModel q3 = served_model(family_scenario("  preset: qwen3-30b-a3b\n", "  engine: vllm\n"));
  CHECK(weights_bytes(vllm_weight_tensors(q3)) == 61074755584ull);  // 56.8803 GiB
  // OLMoE-1B-7B: q_norm over 2048 and k_norm over 16 x 128, replicated.
  const ServedModel o = served_model(family_scenario("  preset: olmoe-1b-7b\n", "  engine: vllm\n"));
  CHECK(o.qk_norm_full);
  CHECK(weights_bytes(vllm_weight_tensors(o)) == 13839372288ull);
}

TEST_CASE("MoE profile run: the forward peak is the tensors alive inside fused_experts", "[serve][serve-families]") {
  // Mixtral-8x7B at TP 2 (its weights do not fit one H100), 8192 batched tokens, compiled
  // (Inductor frees at last use): inside a MoE layer's experts the live tensors are the
  // residual and the normed input (the experts write into it), the router logits, the
  // renormalised fp32 top-k weights and int32 ids, cache13, cache2 and one chunk's
  // moe_align_block_size outputs, plus the cuBLAS workspace allocated at the first GEMM.
  const Scenario s = family_scenario(kMixtral, "  tensor_parallel: 2\n  max_num_batched_tokens: 8192\n"
                                                "  max_num_seqs: 256\n  max_model_len: 8192\n");
  const ServePlan p = plan_serve(s);
  const uint64_t T = 8192, H = 4096, row = T * H * 2;
  const uint64_t cache13 = T * 2 * (2 * 7168) * 2, cache2 = T * 2 * 7168 * 2;
  const uint64_t topk = 2 * (T * 2 * 4);  // weights + ids
  // sorted_ids, expert_ids, num_tokens_post_pad, each in 512-B blocks.
  const uint64_t full_align = ((T * 2 + 8 * 63) * 4 + 511) / 512 * 512 + (264 * 4 + 511) / 512 * 512 + 512;
  const uint64_t ws = s.device.cublas_workspace;
  const uint64_t expected = 2 * row + T * 8 * 2 + topk + cache13 + cache2 + full_align + ws;
  CHECK(p.forward_peak_bytes == expected);
  // --enforce-eager keeps the layer's input alive through the layer (LlamaModel-style
  // frames): one more [T, H] row at the same point.
  const ServePlan e = plan_serve(family_scenario(kMixtral, "  tensor_parallel: 2\n  max_num_batched_tokens: 8192\n"
                                                            "  max_num_seqs: 256\n  max_model_len: 8192\n"
                                                            "  cuda_graphs: false\n"));
  CHECK(e.forward_peak_bytes == expected + row);
  // VLLM_FUSED_MOE_CHUNK_SIZE 4096: the caches are sized for 4096 tokens (half), two chunks
  // run, and at the second chunk's moe_align_block_size both chunks' index buffers exist.
  const ServePlan h = plan_serve(family_scenario(kMixtral, "  tensor_parallel: 2\n  max_num_batched_tokens: 8192\n"
                                                            "  max_num_seqs: 256\n  max_model_len: 8192\n"
                                                            "  fused_moe_chunk_size: 4096\n"));
  const uint64_t half_align = ((4096 * 2 + 8 * 63) * 4 + 511) / 512 * 512 + ((136 * 4) + 511) / 512 * 512 + 512;
  CHECK(h.forward_peak_bytes == expected - (cache13 + cache2) / 2 - full_align + 2 * half_align);
  CHECK(p.fits);
  CHECK(p.activation_peak_bytes.value() >= p.forward_peak_bytes);
}

TEST_CASE("Qwen2-MoE's shared expert lives through the routed experts", "[serve][serve-families]") {
  // Qwen1.5-MoE-A2.7B, TP 1, 2048 tokens, compiled. At the experts: residual, the normed
  // input, the gated shared output [T, H], the router logits [T, 60], fp32 top-k weights
  // (no renormalisation: norm_topk_prob false) and int32 ids, cache13 (M x 4 x max(2816,
  // 2048)), cache2 (M x 4 x 1408), the index buffers (BLOCK_SIZE_M 64), the workspaces (the
  // qkv bias takes the cuBLASLt path too).
  const Scenario s = family_scenario(kQwen15Moe, "  max_num_batched_tokens: 2048\n  max_num_seqs: 64\n"
                                                  "  max_model_len: 4096\n");
  const ServePlan p = plan_serve(s);
  const uint64_t T = 2048, H = 2048, row = T * H * 2;
  auto r512 = [](uint64_t b) { return (b + 511) / 512 * 512; };
  const uint64_t padded = T * 4 + 60 * 63;
  const uint64_t expected = 3 * row + r512(T * 60 * 2) + r512(T * 4 * 4) * 2 + T * 4 * 2816 * 2 +
                            T * 4 * 1408 * 2 + r512(padded * 4) + r512((padded + 63) / 64 * 4) + 512;
  // Both workspaces exist by then: the first GEMM (qkv_proj, with its bias) allocates the
  // cuBLAS and the cuBLASLt ones.
  CHECK(p.forward_peak_bytes == expected + s.device.cublas_workspace + graph::Runtime::kCublasLtWorkspace);
}

TEST_CASE("Gemma-2 / Gemma-3 served: sandwich norms, tied embeddings, two RoPE caches, hybrid KV", "[serve][serve-families]") {
  // Gemma-2-9B bf16: 42 layers of qkv (16 + 2 x 8) x 256 x 3584, o 3584 x 4096,
  // gate_up 2 x 14336 x 3584, down 3584 x 14336, four norms; tied 256000 x 3584 embedding;
  // one RoPE cache 8192 x 256; the 0-d normalizer.
  const ServedModel g2 = served_model(family_scenario("  preset: gemma2-9b\n", "  engine: vllm\n"));
  CHECK(g2.gemma);
  CHECK(g2.tied);
  CHECK(g2.final_softcap == 30.0);
  auto r512 = [](uint64_t b) { return (b + 511) / 512 * 512; };
  const uint64_t g2_layer = 32ull * 256 * 3584 * 2 + 3584ull * 4096 * 2 + 2ull * 14336 * 3584 * 2 +
                            3584ull * 14336 * 2 + 4 * 3584ull * 2;
  const uint64_t g2_total = 42 * g2_layer + 256000ull * 3584 * 2 + 3584 * 2 + 8192ull * 256 * 2 + r512(2);
  CHECK(weights_bytes(vllm_weight_tensors(g2)) == g2_total);

  // Gemma-3-4B: q/k norms, the global layers' linear-scaled (x 8) cache and the local
  // layers' unscaled one: 131072 x 8 x 256 and 131072 x 256 bf16.
  const ServedModel g3 = served_model(family_scenario("  preset: gemma3-4b\n", "  engine: vllm\n"));
  CHECK(g3.gemma3);
  CHECK(g3.rope_rows == 131072 * 8);
  CHECK(g3.local_rope_rows == 131072);
  const auto tensors = vllm_weight_tensors(g3);
  uint64_t rope = 0;
  for (const WeightTensor& t : tensors)
    if (t.name.find("cos_sin_cache") != std::string::npos) rope += t.bytes;
  CHECK(rope == 536870912ull + 67108864ull);
  const uint64_t g3_layer = (8ull + 2 * 4) * 256 * 2560 * 2 + 2560ull * 2048 * 2 + 2ull * 10240 * 2560 * 2 +
                            2560ull * 10240 * 2 + 4 * 2560ull * 2 + 2 * r512(256 * 2);
  const uint64_t g3_total = 34 * g3_layer + 262208ull * 2560 * 2 + 2560 * 2 + rope + r512(2);
  CHECK(weights_bytes(tensors) == g3_total);

  // The plan: 29 sliding (1024) + 5 full layers share one pool in groups of 5 (7 groups,
  // one padding layer); page 2 x 16 x 4 x 256 x 2 = 65,536 B; blocks = available // page //
  // 5; tokens = blocks // 7 x 16.
  const ServePlan p = plan_serve(family_scenario("  preset: gemma3-4b\n", "  max_model_len: 32768\n"));
  CHECK(p.kv.page_bytes == 65536);
  CHECK(p.kv.group_size == 5);
  CHECK(p.kv.groups == 7);
  CHECK(p.kv.padding_layers == 1);
  CHECK(p.kv.num_gpu_blocks == p.available_kv_bytes / 65536 / 5);
  CHECK(p.kv.kv_cache_tokens == p.kv.num_gpu_blocks / 7 * 16);
  // One 32768-token request: the full group 2048 blocks, each sliding group
  // cdiv(min(1023 + 8192, 32768), 16) + 1 = 577 blocks.
  CHECK(p.kv.blocks_per_request == 2048 + 6 * 577);
  CHECK(p.kv.max_concurrency == Approx(static_cast<double>(p.kv.num_gpu_blocks) / (2048 + 6 * 577)));
}

TEST_CASE("Gemma-2's final soft-cap adds three out-of-place [R, vocab] logits ops to the sampler", "[serve][serve-families]") {
  // LogitsProcessor: logits / cap, tanh, * cap, each a new [R, vocab] bf16 tensor, the
  // previous one freed at rebinding: three allocations and three frees more than without
  // the cap; the sort that follows (fp32 values, int64 indices) stays the sampler's peak.
  const std::string serve = "  max_num_batched_tokens: 2048\n  max_num_seqs: 8\n  max_model_len: 4096\n";
  const Scenario capped_s = family_scenario("  preset: gemma2-2b\n", serve);
  const Scenario plain_s = family_scenario("  preset: gemma2-2b\n", serve, {{"model.final_softcap", "0"}});
  const ServedModel capped_m = served_model(capped_s), plain_m = served_model(plain_s);
  CHECK(capped_m.final_softcap == 30.0);
  CHECK(plain_m.final_softcap == 0.0);
  ProfileRunShape shape;
  shape.tokens = 2048;
  shape.requests = 8;
  const ProfileRun a = vllm_profile_run(capped_m, vllm_weight_tensors(capped_m), shape, capped_s.device, capped_s.allocator);
  const ProfileRun b = vllm_profile_run(plain_m, vllm_weight_tensors(plain_m), shape, plain_s.device, plain_s.allocator);
  CHECK(a.program.events.size() == b.program.events.size() + 6);
  CHECK(a.forward_peak_increase == b.forward_peak_increase);
  CHECK(a.sampler_peak_increase == b.sampler_peak_increase);
}

TEST_CASE("serve refusals for the new rows name the key", "[serve][serve-families]") {
  CHECK(refusal([] { served_model(family_scenario(kMixtral, "  quantization: fp8\n")); })
            .find("serve.quantization: quantized experts") != std::string::npos);
  CHECK(refusal([] { served_model(family_scenario("  preset: olmoe-1b-7b\n", "  tensor_parallel: 2\n")); })
            .find("serve.tensor_parallel: OLMoE's q_norm / k_norm") != std::string::npos);
  // Mixtral's 14336 does not split over 3 ranks (32 heads do not either: vLLM's head check first).
  CHECK(refusal([] { served_model(family_scenario(kMixtral, "  tensor_parallel: 3\n")); })
            .find("serve.tensor_parallel") != std::string::npos);
  CHECK(refusal([] { served_model(family_scenario(kMixtral, "  fused_moe_chunk_size: 0\n")); })
            .find("serve.fused_moe_chunk_size") != std::string::npos);
  CHECK(refusal([] { served_model(family_scenario(kMixtral, "  engine: sglang\n  fused_moe_chunk_size: 64\n")); })
            .find("serve.fused_moe_chunk_size: is vLLM's") != std::string::npos);
  CHECK(refusal([] { plan_serve(family_scenario("  preset: gemma3-4b\n", "  engine: sglang\n")); })
            .find("serve.engine: sglang with Gemma-2/3") != std::string::npos);
  CHECK(refusal([] { plan_serve(family_scenario(kMixtral, "  engine: sglang\n  tensor_parallel: 2\n")); })
            .find("serve.engine: sglang with MoE models") != std::string::npos);
}

TEST_CASE("memsim serve on the shipped MoE and Gemma scenarios", "[serve][serve-families]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  for (const char* name : {"qwen3-30b-a3b-vllm-h100.yaml", "gemma3-4b-vllm-h100.yaml"}) {
    const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/" + name;
    auto r = run_shell(memsim_command() + "serve '" + scenario + "' --json -");
    REQUIRE(r.status == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const ServePlan p = plan_serve(load_scenario(scenario));
    CHECK(j["weights_bytes"].get<uint64_t>() == p.weights_bytes);
    CHECK(j["num_gpu_blocks"].get<int64_t>() == p.kv.num_gpu_blocks);
    CHECK(j["kv_cache_tokens"].get<int64_t>() == p.kv.kv_cache_tokens);
    CHECK(j["fits"].get<bool>());
  }
}
