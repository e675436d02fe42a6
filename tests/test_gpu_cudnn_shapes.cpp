// SDPA's cuDNN backend (`model.attention: cudnn`, graph/ops/ops_sdpa_cudnn.h) at the shapes of
// tools/gpu/measure_cuda.py's "cudnn-shapes" runs (transformers 5.x Qwen2, bf16, SDPA forced to
// cuDNN: S = 1000, one KV head, 32 heads at d_model 2048; docs/sdpa-gqa.md "Other shapes").
// Their scenarios are tests/data/gpu/cudnn_shapes/NAME.yaml and memsim's blind predictions
// tests/data/gpu/cudnn_shapes_predictions.json, both written by
// tools/gpu/predict_cudnn_shapes.py and committed before anything was measured.
//
// Until the measurement is committed this checks the blind record only: every scenario loads
// and simulates, every prediction equals what memsim predicts now, and the cuDNN op's blocks
// at these shapes are the ones the file records (the backward workspace formula applied
// unpadded at S = 1000 and with one KV head: what the runs decide). The comparison with the
// measurement is written once it exists (docs/gpu-next-session.md).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "json_test_support.h"
#include "real_run_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/cudnn_shapes_predictions.json";

// The sizes of every allocation whose op (or autograd node) is `op`, in event order.
std::vector<uint64_t> alloc_sizes(const Program& p, const std::string& op) {
  std::vector<uint64_t> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(e.op) == op) out.push_back(e.bytes);
  return out;
}

// Every call's allocations (groups of `per_call`) equal `want`'s values, in `names`' order.
void check_calls(const std::vector<uint64_t>& sizes, size_t per_call, const nlohmann::json& want,
                 const std::vector<const char*>& names) {
  REQUIRE(names.size() == per_call);
  REQUIRE(!sizes.empty());
  REQUIRE(sizes.size() % per_call == 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("allocation " << i << " (" << names[i % per_call] << ")");
    CHECK(sizes[i] == want[names[i % per_call]].get<uint64_t>());
  }
}

}  // namespace

TEST_CASE("the cudnn-shapes GPU runs' blind predictions are what memsim predicts "
          "(tests/data/gpu/cudnn_shapes_predictions.json)", "[cudnn][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  REQUIRE(preds.size() == 3);
  for (const auto& [name, entry] : preds.items()) {
    INFO(name << " (" << entry["scenario"].get<std::string>() << ")");
    REQUIRE_FALSE(entry.contains("refused"));  // memsim models every run's configuration
    memsim_test::check_run_prediction(memsim_test::simulate_run(memsim_test::scenario_path_of(entry)), entry);

    const Program p = build_program(load_scenario(memsim_test::scenario_path_of(entry)));
    const nlohmann::json& fwd = entry["cudnn_forward_allocations_bytes"];
    const nlohmann::json& bwd = entry["cudnn_backward_allocations_bytes"];
    check_calls(alloc_sizes(p, "_scaled_dot_product_cudnn_attention"), 5, fwd,
                {"seed", "offset", "output", "logsumexp", "workspace"});
    check_calls(alloc_sizes(p, "ScaledDotProductCudnnAttentionBackward0"), 4, bwd,
                {"dq", "dk", "dv", "workspace"});

    // What was predicted, from the run's shape (bf16: 2 B an element): the output and dq
    // q-sized, dk/dv KV-headed, the statistics B*H*S fp32 unpadded, the backward workspace
    // an fp32 dQ + two bf16 dK/dV for every query head (grouped) + the statistics + 256 B.
    const nlohmann::json& sh = entry["shape"];
    const uint64_t B = sh["batch"], S = sh["seq"], H = sh["heads"], KV = sh["kv_heads"];
    const uint64_t hd = sh["d_model"].get<uint64_t>() / H, bhsd = B * H * S * hd;
    REQUIRE(KV < H);  // every run here has grouped (or one) KV heads
    CHECK(fwd["output"].get<uint64_t>() == bhsd * 2);
    CHECK(fwd["logsumexp"].get<uint64_t>() == B * H * S * 4);
    CHECK(fwd["workspace"].get<uint64_t>() == 256);
    CHECK(bwd["dq"].get<uint64_t>() == bhsd * 2);
    CHECK(bwd["dk"].get<uint64_t>() == B * KV * S * hd * 2);
    CHECK(bwd["dv"].get<uint64_t>() == B * KV * S * hd * 2);
    CHECK(bwd["workspace"].get<uint64_t>() == bhsd * 4 + 2 * bhsd * 2 + B * H * S * 4 + 256);
  }
  // The three shapes are the ones the runs are for.
  CHECK(preds["cudnn_qwen2_l4_d1024_s1000_b4_bf16"]["shape"]["seq"].get<uint64_t>() % 128 != 0);
  CHECK(preds["cudnn_qwen2_mqa_l4_d1024_s1024_b4_bf16"]["shape"]["kv_heads"].get<uint64_t>() == 1);
  CHECK(preds["cudnn_qwen2_h32_l4_d2048_s1024_b4_bf16"]["shape"]["heads"].get<uint64_t>() == 32);
}
