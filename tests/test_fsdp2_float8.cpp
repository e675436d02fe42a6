// FSDP2's float8 all-gather (precision.float8_all_gather, precision.float8_precompute_scale;
// sim/parallel/fsdp2.h, graph/ops/ops_float8.h float8_linear_gathered, docs/float8.md).
// torch 1.13 has no float8 dtypes and no FSDP2, so no CPU fixture exists: the expected
// bytes below are hand arithmetic from the source (torchao/float8/fsdp_utils.py @36027d8,
// torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py and _fsdp_param.py @010ae4a8),
// applied to a small model, so a change that breaks one of the rules fails here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "event_span_test_support.h"
#include "graph/ops/ops_float8.h"
#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// A 2-layer Llama, fp32 parameters under FSDP2 over 4 ranks with a bf16 param_dtype
// (torchtitan's setup), tensorwise float8 with the float8 all-gather.
// Shapes: q, o 64 x 64; k, v 32 x 64 (2 kv heads of 16); gate, up 128 x 64; down 64 x 128;
// norms 64; embed_tokens and lm_head 1000 x 64. Every row count divides by 4.
const char* const kYaml =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, "
    "vocab: 1000, attention: flash}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "precision: {params: fp32, float8: tensorwise, float8_all_gather: true}\n"
    "optimizer: {type: adamw, impl: foreach}\n"
    "parallel: {data: 4, sharding: fsdp2, fsdp_mixed_precision: bf16}\n"
    "device: {capacity: 1TiB, cublas_workspace: 0, kernel_scratch: false}\n"
    "step: {warmup_steps: 1}\n";

Scenario scenario(const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  return load_scenario_text(kYaml, "f8ag.yaml", sets);
}

std::string error_of(const std::vector<std::pair<std::string, std::string>>& sets) {
  try {
    scenario(sets);
    Program p = build_program(scenario(sets));
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// Shard numels (ws = 4) of a block's Float8Linear weights, in registration order:
// q 16 x 64, k 8 x 64, v 8 x 64, o 16 x 64, gate 32 x 64, up 32 x 64, down 16 x 128.
const std::vector<uint64_t> kF8Shards = {1024, 512, 512, 1024, 2048, 2048, 2048};
constexpr uint64_t kF8ShardSum = 9216;  // 1 byte each
constexpr uint64_t kNormShards = 2 * 16;  // two norms of 64: 16 elements each (bf16 copy)
constexpr uint64_t kWs = 4;
// Shards in fp32: 2 blocks of (9216 + 32) elements, the root (250 x 64) x 2 + 16.
constexpr uint64_t kShardBytes = (2 * (kF8ShardSum + kNormShards) + 2 * 16000 + 16) * 4;

// fsdp_pre_all_gather of an fp32 shard of n elements, dynamic scale: abs, 0-d amax, its
// all-reduced clone, amax.to(f64), clamp, reciprocal, product, the 0-d fp32 scale; then
// the cast without a to(float32) copy: product, clamp, e4m3 data.
void dynamic_cast_of(std::vector<uint64_t>& seq, uint64_t n) {
  for (uint64_t b : {4 * n, uint64_t{4}, uint64_t{4}, uint64_t{8}, uint64_t{8}, uint64_t{8},
                     uint64_t{8}, uint64_t{4}, 4 * n, 4 * n, n})
    seq.push_back(b);
}
// With a precomputed scale (a view of the vector): the cast only.
void precomputed_cast_of(std::vector<uint64_t>& seq, uint64_t n) {
  for (uint64_t b : {4 * n, 4 * n, n}) seq.push_back(b);
}

size_t mark_index(const Program& p, const char* mark) {
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark &&
        p.str(static_cast<uint32_t>(p.events[i].bytes)) == mark) return i;
  FAIL("no mark " << mark);
  return 0;
}

// The byte sizes of the all-gather-stream allocations of block `layer`'s first unshard in
// forward at or after event `from` (its pre-forward: layer's own, stream 1).
std::vector<uint64_t> block_unshard(const Program& p, size_t from, int32_t layer) {
  std::vector<uint64_t> out;
  bool started = false;
  for (size_t i = from; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc) continue;
    const bool ours = e.stream == 1 && e.layer == layer && e.phase == Phase::forward;
    if (!ours && started) break;
    if (!ours) continue;
    started = true;
    out.push_back(e.bytes);
  }
  return out;
}

uint64_t live_kind(const Program& p, const char* mark, TensorKind k) {
  const LiveBytes l = live_bytes_at_mark(p, mark);
  REQUIRE(l.found_mark);
  return l.by_kind[static_cast<int>(k)];
}

bool named(const Program& p, uint32_t tensor, const std::string& prefix) {
  return p.str(p.tensors[tensor].name).rfind(prefix, 0) == 0;
}

}  // namespace

TEST_CASE("float8_linear_gathered: no weight cast, the scale saved until backward",
          "[float8][fsdp2]") {
  const uint64_t R = 64, I = 64, O = 128;
  const uint64_t nx = R * I, ng = R * O;
  Program program;
  graph::Runtime rt(program);
  rt.ctx.phase = Phase::forward;
  const int32_t w = rt.add_parameter(O * I * 2, "w");
  // FSDP2's scale of the gathered weight (its 0-d fp32).
  const uint32_t scale = rt.alloc_raw(4, TensorKind::parameter, graph::OpKind::other);
  rt.parameters()[static_cast<size_t>(w)].float8_scale = scale;
  int32_t leaf = -1;
  graph::Tensor x = rt.alloc_leaf(nx * 2, TensorKind::activation, graph::OpKind::other, &leaf);
  rt.begin_graph();
  const size_t f0 = program.events.size();
  graph::Tensor y = graph::float8_linear_gathered(rt, x, rt.param(w), scale, R, I, O, 2.0 * R * I * O);
  const size_t f1 = program.events.size();
  // Only the input's cast (bf16: abs, 0-d amax, four f64, the scale, fp32 copy, product,
  // clamp, e4m3), the two reciprocals and the bf16 output: no weight cast.
  std::vector<uint64_t> forward = {2 * nx, 2, 8, 8, 8, 8, 4, 4 * nx, 4 * nx, 4 * nx, nx,
                                   4, 4, 2 * ng};
  CHECK(memsim_test::allocs_between(program, f0, f1) == forward);
  // Kept: the output only (no e4m3 weight of the op's own).
  CHECK(memsim_test::live_and_peak(program, f0, f1).first == static_cast<int64_t>(2 * ng));
  // FSDP2 moves on to the next all-gather's scale: the saved reference keeps this one.
  rt.release(scale);
  for (size_t i = f1; i < program.events.size(); ++i)
    CHECK_FALSE((program.events[i].type == EventType::free && program.events[i].tensor == scale));
  rt.ctx.phase = Phase::backward;
  const size_t b0 = program.events.size();
  rt.backward(y);
  bool freed = false;
  for (size_t i = b0; i < program.events.size(); ++i)
    freed |= program.events[i].type == EventType::free && program.events[i].tensor == scale;
  CHECK(freed);
}

TEST_CASE("FSDP2 float8 all-gather: the copy-in casts each weight shard to e4m3 on stream 1",
          "[float8][fsdp2]") {
  const Program p = build_program(scenario());
  // The warm-up step's block 0 pre-forward, in _get_param_all_gather_inputs order: the
  // seven Float8Linear shards' fsdp_pre_all_gather (dynamic: amax all-reduced), then the
  // flat bf16 copy of the two norms' shards, then the flat output (uint8: the inputs'
  // bytes x 4 ranks).
  std::vector<uint64_t> expected;
  for (uint64_t n : kF8Shards) dynamic_cast_of(expected, n);
  expected.push_back(kNormShards * 2);
  expected.push_back((kF8ShardSum + kNormShards * 2) * kWs);  // 37,120 B
  CHECK(block_unshard(p, 0, 0) == expected);
  // The measured step without precompute does the same.
  CHECK(block_unshard(p, mark_index(p, "measured_step_begin"), 1) == expected);
  // The casts are FSDP2's, not the Float8Linear's.
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.stream == 1 && named(p, e.tensor, "FSDP2 float8 all-gather input"))
      CHECK(p.str(e.op) == "fsdp_pre_all_gather");
}

TEST_CASE("FSDP2 float8 all-gather: unsharded weights are 1 byte per element, norms bf16",
          "[float8][fsdp2]") {
  const Program p = build_program(scenario());
  const size_t begin = mark_index(p, "measured_step_begin");
  // Block 0's copy-out in the measured forward: per parameter all_gather_outputs[0] of
  // padded full numel x its all-gather dtype's bytes (e4m3: 1; the norms' bf16: 2).
  std::vector<uint64_t> got;
  for (size_t i = begin; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc && e.layer == 0 && e.phase == Phase::forward &&
        named(p, e.tensor, "FSDP2 unsharded "))
      got.push_back(e.bytes);
    if (got.size() == 9) break;
  }
  std::vector<uint64_t> expected;
  for (uint64_t n : kF8Shards) expected.push_back(n * kWs);  // 4096, 2048, 2048, 4096, 8192 x 3
  expected.push_back(64 * 2);  // input_layernorm, bf16
  expected.push_back(64 * 2);  // post_attention_layernorm
  CHECK(got == expected);
  // Without the float8 all-gather the same weights would gather in bf16 (twice the bytes).
  const Program bf16 = build_program(load_scenario_text(
      "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, "
      "vocab: 1000, attention: flash}\nbatch: {micro_batch: 2, seq_len: 32}\n"
      "precision: {params: fp32}\noptimizer: {type: adamw, impl: foreach}\n"
      "parallel: {data: 4, sharding: fsdp2, fsdp_mixed_precision: bf16}\n"
      "device: {capacity: 1TiB, cublas_workspace: 0, kernel_scratch: false}\n"
      "step: {warmup_steps: 1}\n", "bf16.yaml"));
  uint64_t bf16_block = 0;
  for (const MemoryEvent& e : bf16.events)
    if (e.type == EventType::alloc && e.stream == 1 && e.layer == 0 && e.phase == Phase::forward &&
        named(bf16, e.tensor, "FSDP2 all-gather output (flat)")) {
      bf16_block = e.bytes;
      break;
    }
  CHECK(bf16_block == (kF8ShardSum + kNormShards) * 2 * kWs);  // 74,240 B against 37,120 B
}

TEST_CASE("FSDP2 float8 all-gather: one 0-d scale per weight between steps, saved scales",
          "[float8][fsdp2]") {
  const Program p = build_program(scenario());
  // After the step: the fp32 shards and the 14 weights' 0-d fp32 scales (the unsharded
  // parameters' _scale, from the backward's all-gather).
  CHECK(live_kind(p, "optimizer_end", TensorKind::parameter) == kShardBytes + 14 * 4);
  CHECK(live_kind(p, "optimizer_end", TensorKind::optimizer_state) == 2 * kShardBytes);
  // In backward a block's forward scales outlive its backward all-gather (the saved
  // Float8TrainingTensor holds them until the linear's backward): at most the 14 forward
  // scales, the last block's 7 backward ones and the prefetched block 0's 7.
  const size_t begin = mark_index(p, "measured_step_begin");
  int live = 0, most = 0;
  std::vector<char> is_scale(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t)
    is_scale[t] = named(p, static_cast<uint32_t>(t), "FSDP2 float8 weight scale");
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc && is_scale[e.tensor]) ++live;
    if (e.type == EventType::free && is_scale[e.tensor]) --live;
    if (i > begin && e.phase == Phase::backward) most = std::max(most, live);
  }
  CHECK(most == 28);
}

TEST_CASE("FSDP2 float8 all-gather with precompute_float8_dynamic_scale_for_fsdp",
          "[float8][fsdp2]") {
  const Program p = build_program(scenario({{"precision.float8_precompute_scale", "true"}}));
  // The warm-up step has no precomputed scale yet (dynamic, as above); the measured step's
  // all-gathers cast with a view of the vector: no amax, no 0-d scale.
  std::vector<uint64_t> dynamic, precomputed;
  for (uint64_t n : kF8Shards) {
    dynamic_cast_of(dynamic, n);
    precomputed_cast_of(precomputed, n);
  }
  for (std::vector<uint64_t>* v : {&dynamic, &precomputed}) {
    v->push_back(kNormShards * 2);
    v->push_back((kF8ShardSum + kNormShards * 2) * kWs);
  }
  const size_t begin = mark_index(p, "measured_step_begin");
  CHECK(block_unshard(p, 0, 0) == dynamic);
  CHECK(block_unshard(p, begin, 0) == precomputed);
  CHECK(block_unshard(p, begin, 1) == precomputed);
  // After the measured step: no 0-d scales (the copy-outs dropped them); two fp32 vectors of
  // 14 scales: this step's, and the previous one the unsharded parameters still view.
  CHECK(live_kind(p, "optimizer_end", TensorKind::parameter) == kShardBytes + 2 * 14 * 4);
  CHECK(live_kind(p, "optimizer_end", TensorKind::optimizer_state) == 2 * kShardBytes);
  // The precompute after the measured step's optimizer.step(): _foreach_norm's workspaces
  // (14 x 1 chunk fp32, zeros(320) fp32), 14 0-d norms, the global norm; stack, the
  // all-reduce's clone, clamp (14 fp32 each), f64 copy, reciprocal and product (14 x 8),
  // the fp32 vector.
  std::vector<uint64_t> expected = {14 * 4, 320 * 4};
  for (int k = 0; k < 14; ++k) expected.push_back(4);
  for (uint64_t b : {uint64_t{4}, uint64_t{14 * 4}, uint64_t{14 * 4}, uint64_t{14 * 4},
                     uint64_t{14 * 8}, uint64_t{14 * 8}, uint64_t{14 * 8}, uint64_t{14 * 4}})
    expected.push_back(b);
  size_t last_opt = 0;
  for (size_t i = begin; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::alloc && p.events[i].phase == Phase::optimizer &&
        named(p, p.events[i].tensor, "FSDP2 float8 precomputed scales"))
      last_opt = i;
  REQUIRE(last_opt != 0);
  std::vector<uint64_t> tail;
  for (size_t i = last_opt + 1; i-- > begin && tail.size() < expected.size();)
    if (p.events[i].type == EventType::alloc) tail.insert(tail.begin(), p.events[i].bytes);
  CHECK(tail == expected);
}

TEST_CASE("FSDP2 float8 all-gather: refusals by key", "[float8][fsdp2]") {
  using Sets = std::vector<std::pair<std::string, std::string>>;
  auto refused = [](const Sets& sets, const std::string& key) {
    const std::string e = error_of(sets);
    INFO(e);
    CHECK(e.find(key) != std::string::npos);
  };
  CHECK(error_of({}).empty());
  refused({{"precision.float8", "rowwise"}}, "precision.float8_all_gather");
  refused({{"precision.float8", "none"}}, "precision.float8_all_gather");
  refused({{"parallel.sharding", "none"}, {"parallel.fsdp_mixed_precision", "none"}},
          "precision.float8_all_gather");
  refused({{"precision.float8_all_gather", "false"}}, "precision.float8");
  refused({{"precision.float8_all_gather", "false"}, {"precision.float8_precompute_scale", "true"}},
          "precision.float8_precompute_scale");
  refused({{"parallel.reshard_after_forward", "2"}}, "parallel.reshard_after_forward");
  refused({{"parallel.cpu_offload", "true"}}, "parallel.cpu_offload");
  refused({{"parallel.data", "3"}}, "parallel.data");  // 64 rows over 3 ranks: uneven
  refused({{"parallel.fsdp_mixed_precision", "none"}}, "precision.float8");  // fp32 compute
}

TEST_CASE("memsim run: Llama-3-8B FSDP2 with the float8 all-gather", "[float8][fsdp2][cli]") {
  auto run = [](const std::string& sets) {
    const memsim_test::CommandResult r = memsim_test::run_shell(
        memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml' " + sets + " --json - 2>/dev/null");
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json bf16 = run("");
  const nlohmann::json f8 =
      run("--set precision.float8=tensorwise --set precision.float8_all_gather=true");
  const nlohmann::json pre = run("--set precision.float8=tensorwise --set "
                                 "precision.float8_all_gather=true --set "
                                 "precision.float8_precompute_scale=true");
  // The allocated peak is the loss's (no block gathered there): float8 adds the forward's
  // 1 MiB cuBLASLt workspace (_scaled_mm) and the kept scales: 224 0-d fp32 (512 B blocks),
  // or with precompute the step's vector of 224 fp32 (a 1 KiB block; the next one comes
  // after optimizer.step()).
  const uint64_t base = bf16["peak_allocated_bytes"].get<uint64_t>();
  CHECK(f8["peak_allocated_bytes"].get<uint64_t>() == base + (1u << 20) + 224 * 512);
  CHECK(pre["peak_allocated_bytes"].get<uint64_t>() == base + (1u << 20) + 1024);
  // The gathered blocks are half the bytes: reserved drops (41.43 -> 37.88 GiB).
  CHECK(f8["peak_reserved_bytes"].get<uint64_t>() < bf16["peak_reserved_bytes"].get<uint64_t>());
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml' --set precision.float8=rowwise "
      "--set precision.float8_all_gather=true 2>&1");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("precision.float8_all_gather") && Catch::Contains("tensorwise"));
}
