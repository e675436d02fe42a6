// The no-grad pass of Megatron-Core's MoE experts (issue #15: the first pass of
// `model.moe.recompute: [moe]`, tensor_parallel.checkpoint's forward under no_grad, and
// `step.kind: forward_no_grad`; docs/moe-megatron.md "Lifetimes without grad"). Without
// grad no autograd node keeps a tensor, so lifetimes are those of the Python names:
//  - TEGroupedMLP.forward keeps fc1's [M, 2F] (`fc1_output`) until it returns, through fc2
//    (graph/models/megatron_swiglu_experts.h `te_grouped`): memsim's chain against the torch
//    CPU stand-in (tools/fixtures/gen_megatron_moe_nograd_fixtures.py -> tests/data/
//    megatron_moe_nograd/chain.json) event by event, TEGroupedMLP with and without moe_act
//    and SequentialMLP's MLP.forward (which frees it before fc2);
//  - the whole model: fc1's output live at fc2's allocation (TEGroupedMLP only); the
//    allgather dispatcher's permuted rows live through the unpermute (routed_experts_compute's
//    `dispatched_input`); a GeLU expert's scaled activation live through the bias product
//    (MLP.forward's `intermediate_parallel`).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/models/megatron_swiglu_experts.h"
#include "graph/runtime.h"
#include "json_test_support.h"
#include "megatron_moe_test_support.h"
#include "sim/megatron/megatron_step.h"
#include "test_paths.h"

using namespace memsim;
using memsim_test::normalise;

namespace {

// memsim's chain without grad on the fixture's shapes (fp32): its allocations and frees.
std::vector<std::pair<bool, uint64_t>> run_chain(uint64_t M, uint64_t h, uint64_t F, bool grouped, bool moe_act) {
  Program p;
  std::vector<std::pair<bool, uint64_t>> ev;
  {
    graph::Runtime rt(p);
    rt.ctx.phase = Phase::setup;
    graph::Tensor x = rt.alloc(M * h * 4, TensorKind::activation, graph::OpKind::other);
    graph::Tensor probs = rt.alloc(M * 4, TensorKind::activation, graph::OpKind::other);
    const size_t from = p.events.size();
    rt.ctx.phase = Phase::forward;
    rt.grad_enabled = false;
    graph::Tensor out = graph::swiglu_experts(rt, x, probs, {M, h, F, 4, 2 * F * h * 4, h * F * 4, moe_act, grouped});
    CHECK(out.grad_fn < 0);
    for (size_t i = from; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type == EventType::alloc || e.type == EventType::free)
        ev.push_back({e.type == EventType::alloc, p.tensors[e.tensor].bytes});
    }
    out.reset();
    rt.freeze();
  }
  return ev;
}

const char* kTiny = R"(
model:
  family: megatron
  layers: 2
  d_model: 64
  heads: 4
  kv_heads: 2
  d_ff: 256
  vocab: 512
  context_length: 16
  attention: flash
  dropout: 0.0
  tied_embeddings: true
  mlp: glu
  activation: silu
  qkv_bias: false
  o_bias: false
  mlp_bias: false
  moe: {experts: 4, top_k: 2, expert_d_ff: 128, grouped_gemm: true, dispatcher: allgather}
batch: {micro_batch: 1, seq_len: 16}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 0}
parallel: {data: 2}
device: {preset: h100-80gb}
)";

using Overrides = std::vector<std::pair<std::string, std::string>>;

// An allocation of `bytes` bytes by op `op` (its forward name in the Program).
struct Alloc {
  const char* op;
  uint64_t bytes;
};

// For each forward-phase allocation `at` that directly follows the forward-phase allocation
// `after` (the chain's context), how many forward-phase allocations `live` are alive then.
std::vector<int> live_at(const Program& p, Alloc after, Alloc at, Alloc live) {
  auto is = [&](const MemoryEvent& e, Alloc a) { return e.bytes == a.bytes && p.str(e.op) == a.op; };
  std::vector<int> r;
  std::map<uint32_t, bool> alive;  // forward-phase tensors -> is `live`
  bool prev = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::free) {
      alive.erase(e.tensor);
      continue;
    }
    if (e.type != EventType::alloc || e.phase != Phase::forward) continue;
    if (prev && is(e, at)) {
      int n = 0;
      for (const auto& [t, l] : alive) n += l ? 1 : 0;
      r.push_back(n);
    }
    alive[e.tensor] = is(e, live);
    prev = is(e, after);
  }
  return r;
}

Program program(const Overrides& o) { return build_megatron_program(load_scenario_text(kTiny, "tiny.yaml", o)); }

}  // namespace

TEST_CASE("moe no-grad: the experts' chain matches the torch CPU stand-in event by event", "[megatron-moe-nograd]") {
  const nlohmann::json fx = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/megatron_moe_nograd/chain.json");
  REQUIRE(fx.at("cases").size() == 6);
  int grouped_cases = 0;
  for (const auto& c : fx.at("cases")) {
    const uint64_t M = c.at("rows"), h = c.at("hidden"), F = c.at("ffn");
    const bool grouped = c.at("impl") == "grouped", moe_act = c.at("moe_act");
    REQUIRE(c.at("elem").get<uint64_t>() == 4);
    std::vector<std::pair<bool, uint64_t>> expected;
    for (const auto& e : c.at("events")) expected.push_back({e.at("kind") == "alloc", e.at("bytes").get<uint64_t>()});
    REQUIRE(expected.size() == 5);
    INFO("M " << M << " h " << h << " F " << F << " " << c.at("impl").get<std::string>() << " moe_act " << moe_act);
    CHECK(normalise(run_chain(M, h, F, grouped, moe_act)) == normalise(expected));
    // What the fixture shows: fc1's [M, 2F] is freed after fc2's [M, h] is allocated in
    // TEGroupedMLP, before it in SequentialMLP's MLP.forward.
    const std::vector<std::string> n = normalise(expected);
    const std::string fc2 = "alloc " + std::to_string(M * h * 4);
    const std::string fc1 = std::to_string(M * 2 * F * 4);
    const size_t at = static_cast<size_t>(std::find(n.begin(), n.end(), fc2) - n.begin());
    REQUIRE(at < n.size());
    bool freed_before = false;
    for (size_t i = 0; i < at; ++i) freed_before |= n[i].rfind("free", 0) == 0 && n[i].find(fc1) != std::string::npos;
    CHECK(freed_before == !grouped);
    grouped_cases += grouped ? 1 : 0;
  }
  CHECK(grouped_cases == 4);
  // The stand-ins' live bytes when fc2 allocates its output differ by exactly that [M, 2F]
  // (moe_act changes nothing there: its resize_(0) comes after fc2).
  auto live_at_fc2 = [](const nlohmann::json& c) {
    const uint64_t fc2 = c.at("rows").get<uint64_t>() * c.at("hidden").get<uint64_t>() * 4;
    int64_t live = 0;
    for (const auto& e : c.at("events")) {
      const int64_t b = e.at("bytes").get<int64_t>();
      live += e.at("kind") == "alloc" ? b : -b;
      if (e.at("kind") == "alloc" && static_cast<uint64_t>(b) == fc2) break;
    }
    return live;
  };
  const auto& cs = fx.at("cases");
  for (size_t i = 0; i + 2 < cs.size(); i += 3) {
    const int64_t M = cs[i].at("rows"), F = cs[i].at("ffn");
    CHECK(live_at_fc2(cs[i]) - live_at_fc2(cs[i + 2]) == M * 2 * F * 4);
    CHECK(live_at_fc2(cs[i + 1]) == live_at_fc2(cs[i]));
  }
}

TEST_CASE("moe no-grad: the model keeps the Python locals of the experts and the dispatcher", "[megatron-moe-nograd]") {
  // Both layers MoE, allgather, EP 1: M = T x K = 32 rows, h 64, F 128, bf16; the gathered
  // rows N = T = 16.
  const uint64_t M = 32, h = 64, F = 128, N = 16, e = 2;
  for (const char* kind : {"recompute", "forward-no-grad"}) {
    Overrides o;
    if (std::string(kind) == "recompute") o.push_back({"model.moe.recompute", "[moe]"});
    else o.push_back({"step.kind", "forward-no-grad"});
    INFO(kind);
    // TEGroupedMLP: at fc2's [M, h] (right after the SwiGLU's [M, F]) fc1's [M, 2F] is alive.
    const Alloc swiglu{"weighted_swiglu", M * F * e}, fc2{"megatron_linear", M * h * e},
        fc1{"megatron_linear", M * 2 * F * e};
    CHECK(live_at(program(o), swiglu, fc2, fc1) == std::vector<int>{1, 1});
    // SequentialMLP (one chain over 4 local experts): it is not.
    Overrides seq = o;
    seq.push_back({"model.moe.grouped_gemm", "false"});
    CHECK(live_at(program(seq), swiglu, fc2, fc1) == std::vector<int>{0, 0});
    // allgather: at the unpermute's zeros [N, h] (right after fc2's [M, h]) the permuted
    // [M, h] rows (index_select) are alive.
    const Alloc zeros{"ones_like", N * h * e}, permuted{"index_select", M * h * e};
    CHECK(live_at(program(o), fc2, zeros, permuted) == std::vector<int>{1, 1});
    CHECK(live_at(program(seq), Alloc{"clone", M * h * e}, zeros, permuted) == std::vector<int>{1, 1});
    // GeLU experts with biases (SequentialMLP): at the bias product [M, h] (right after
    // fc2's [M, h]) the scaled activation [M, F] (probs product) is alive.
    Overrides gelu = seq;
    for (const auto& kv : Overrides{{"model.mlp", "plain"}, {"model.activation", "gelu"}, {"model.qkv_bias", "true"},
                                    {"model.o_bias", "true"}, {"model.mlp_bias", "true"}})
      gelu.push_back(kv);
    CHECK(live_at(program(gelu), fc2, Alloc{"mul", M * h * e}, Alloc{"mul", M * F * e}) == std::vector<int>{1, 1});
  }
  // With grad every one of these is saved by an autograd node anyway: the training forward
  // is unchanged (the golden guard checks the shipped scenarios byte for byte).
}
