// FSDP1 with LoRA and use_orig_params (sim/parallel/fsdp.h, sim/parallel/fsdp_flat_layout.h,
// docs/fsdp-lora.md): the flat-parameter layout, the gradients of frozen weights that share
// a FlatParameter with adapters (fsdp_wrap block), PEFT's wrap policy (fsdp_wrap peft), the
// optimizer's views of rank 0's shard, and what is refused.
#include <catch2/catch.hpp>

#include <string>

#include "live_at_mark_test_support.h"
#include "cli_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/parallel/fsdp_flat_layout.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

// hf-llama, 2 layers, d_model 256, 4 heads (kv 4), d_ff 1024, vocab 1000, fp32; LoRA r 8
// on q_proj and v_proj. A decoder layer in PEFT's flatten order: q (65536), q.lora_A (2048),
// q.lora_B (2048), k (65536), v (65536), v.lora_A, v.lora_B, o (65536), gate, up, down
// (262144 each), two norms (256 each): 1,057,280 elements.
std::string lora_yaml(int64_t d, const std::string& parallel, const std::string& extra = "") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1024\n  vocab: 1000\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "optimizer:\n  type: adamw\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, v_proj]\n  dropout: 0.0\n";
  y += "parallel:\n  data: " + std::to_string(d) + "\n" + parallel;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n" + extra;
  return y;
}

Scenario lora_scenario(int64_t d, const std::string& parallel, const std::string& extra = "") {
  return load_scenario_text(lora_yaml(d, parallel, extra), "fsdp_lora.yaml");
}

const char* kBlock = "  sharding: fsdp\n  fsdp_wrap: block\n  use_orig_params: true\n";
const char* kPeft = "  sharding: fsdp\n  fsdp_wrap: peft\n";

using memsim_test::live;

// Allocations whose name is exactly `name`.
size_t count_named(const Program& p, const std::string& name) {
  size_t n = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) ++n;
  return n;
}

}  // namespace

TEST_CASE("FSDP1 flat-parameter layout: 16-byte alignment, world padding, rank 0's part",
          "[fsdp-lora]") {
  // bf16 (8 elements per 16 bytes): 260 -> pad 4; 780 -> 264 + 780 = 1044 -> pad 4;
  // 8 -> no pad (1056 is aligned); total 1056, padded to a multiple of 3: 1056 (no tail).
  const FlatLayout a = flat_layout({260, 780, 8}, 8, 3);
  REQUIRE(a.params.size() == 3);
  CHECK(a.params[0].offset == 0);
  CHECK(a.params[1].offset == 264);
  CHECK(a.params[2].offset == 1048);
  REQUIRE(a.padding.size() == 2);
  CHECK(a.padding[0].offset == 260);
  CHECK(a.padding[0].numel == 4);
  CHECK(a.padding[1].offset == 1044);
  CHECK(a.padding[1].numel == 4);
  CHECK(a.padded_numel == 1056);
  // World 5: 1056 -> 1060, the tail a padding segment of its own.
  const FlatLayout b = flat_layout({260, 780, 8}, 8, 5);
  CHECK(b.padded_numel == 1060);
  REQUIRE(b.padding.size() == 3);
  CHECK(b.padding[2].offset == 1056);
  CHECK(b.padding[2].numel == 4);
  // use_orig_params=False: no alignment and no padding tensor (shard() pads instead).
  const FlatLayout c = flat_layout({260, 780, 8}, 0, 5);
  CHECK(c.params[1].offset == 260);
  CHECK(c.padded_numel == 1050);
  CHECK(c.padding.empty());
  // Rank r owns [r * 212, (r + 1) * 212) of b: parameter 1 (264..1044) overlaps rank 1 by
  // 424 - 264 = 160 and rank 4 (848..1060) by 1044 - 848 = 196; rank 0 not at all.
  CHECK(local_numel(b.params[1], 212, 0) == 0);
  CHECK(local_numel(b.params[1], 212, 1) == 160);
  CHECK(local_numel(b.params[1], 212, 4) == 196);
  CHECK(local_numel(b.params[0], 212, 0) == 212);
}

TEST_CASE("PEFT's flatten order puts each adapter after its base layer", "[fsdp-lora]") {
  const std::vector<std::string> names = {
      "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight", "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.lora_A.default.weight",
      "model.layers.0.self_attn.q_proj.lora_B.default.weight",
      "model.layers.0.self_attn.v_proj.lora_A.default.weight",
      "model.layers.0.self_attn.v_proj.lora_B.default.weight"};
  const std::vector<int32_t> order = peft_flatten_order({0, 1, 2, 3, 4, 5, 6, 7}, names);
  CHECK(order == std::vector<int32_t>{0, 4, 5, 1, 2, 6, 7, 3});
}

TEST_CASE("FSDP1 block wrap with LoRA: frozen weights get gradients, the optimizer steps views",
          "[fsdp-lora]") {
  const Program single = build_program(lora_scenario(1, ""));
  const Program block = build_program(lora_scenario(8, kBlock));
  // Gradients: each block's flat gradient is full size (equivalent to not freezing), the
  // root (embedding, norm, head: all frozen) has none. 2 x 1,057,280 / 8 x 4 bytes.
  CHECK(live(block, "optimizer_end", TensorKind::gradient) == 2 * 1057280 / 8 * 4);
  // Rank 0 owns [0, 132160) of each block: q, q.lora_A, q.lora_B, part of k; v's adapters
  // (200704..204800) lie on rank 1. AdamW keeps state for q's adapters only: half of the
  // single-GPU state (which has all four adapters of each layer).
  const uint64_t state1 = live(single, "optimizer_end", TensorKind::optimizer_state);
  CHECK(state1 == 2 * 4 * 2048 * 4 * 2);
  CHECK(live(block, "optimizer_end", TensorKind::optimizer_state) == state1 / 2);
  // The frozen weights' gradients are computed in backward: a down_proj weight gradient
  // (1024 x 256 fp32) exists in the block-wrapped program and not on one GPU.
  const auto weight_grads = [](const Program& p) {
    size_t n = 0;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::gradient && e.phase == Phase::backward &&
          e.bytes == 1024 * 256 * 4)
        ++n;
    return n;
  };
  CHECK(weight_grads(single) == 0);
  CHECK(weight_grads(block) >= 2 * 3 * 2);  // gate, up, down of 2 layers, 2 iterations
  // With 4 ranks the shard is 264320 elements: v's adapters are on rank 0 too.
  const Program block4 = build_program(lora_scenario(4, kBlock));
  CHECK(live(block4, "optimizer_end", TensorKind::optimizer_state) == state1);
  CHECK(live(block4, "optimizer_end", TensorKind::gradient) == 2 * 1057280 / 4 * 4);
}

TEST_CASE("FSDP1 PEFT wrap: each adapter is its own unit, the blocks hold no gradient",
          "[fsdp-lora]") {
  const Program single = build_program(lora_scenario(1, ""));
  const Program peft = build_program(lora_scenario(8, kPeft));
  // Eight adapter units of 2048 elements: 256 per rank, fp32.
  CHECK(live(peft, "optimizer_end", TensorKind::gradient) == 8 * 256 * 4);
  CHECK(live(peft, "optimizer_end", TensorKind::optimizer_state) ==
        live(single, "optimizer_end", TensorKind::optimizer_state) / 8);
  // An adapter unit is gathered by its pre-forward and freed by its post-forward, right
  // after its output: one allocation (the matmul's output) lies in between.
  const std::string gathered = "FSDP all-gather of model.layers.1.self_attn.q_proj.lora_A.default.weight";
  size_t checked = 0;
  for (size_t i = 0; i < peft.events.size(); ++i) {
    const MemoryEvent& e = peft.events[i];
    if (e.type != EventType::alloc || e.phase != Phase::forward ||
        peft.str(peft.tensors[e.tensor].name) != gathered)
      continue;
    CHECK(e.bytes == 2048 * 4);
    size_t allocs = 0, j = i + 1;
    for (; j < peft.events.size(); ++j) {
      const MemoryEvent& f = peft.events[j];
      if (f.type == EventType::free && f.tensor == e.tensor) break;
      if (f.type == EventType::alloc) ++allocs;
    }
    REQUIRE(j < peft.events.size());
    CHECK(allocs == 1);
    ++checked;
  }
  CHECK(checked == 2);  // one forward per iteration (warm-up and measured)
  // In backward each adapter unit is gathered once (its pre-backward or the prefetch).
  size_t backward_gathers = 0;
  for (const MemoryEvent& e : peft.events)
    if (e.type == EventType::alloc && e.phase == Phase::backward &&
        peft.str(peft.tensors[e.tensor].name) == gathered)
      ++backward_gathers;
  CHECK(backward_gathers == 2);
  // Backward prefetch (BACKWARD_PRE) follows post-forward order: layer 1 prefetches its
  // last adapter, ..., its first adapter (q_proj.lora_A) prefetches layer 0, before its own
  // post-backward; layer 1's unit (frozen) is resharded before layer 0's adapters reduce.
  const auto index_of = [&](const std::string& name, EventType type, size_t from) {
    for (size_t i = from; i < peft.events.size(); ++i) {
      const MemoryEvent& e = peft.events[i];
      if (e.type == type && e.phase == Phase::backward && peft.str(peft.tensors[e.tensor].name) == name)
        return i;
    }
    return peft.events.size();
  };
  const std::string qa1 = "model.layers.1.self_attn.q_proj.lora_A.default.weight";
  const size_t measured = index_of("FSDP all-gather of block 1", EventType::alloc,
                                   index_of("FSDP all-gather of block 1", EventType::alloc, 0) + 1);
  REQUIRE(measured < peft.events.size());
  const size_t qa1_gather = index_of("FSDP all-gather of " + qa1, EventType::alloc, measured);
  const size_t block0_gather = index_of("FSDP all-gather of block 0", EventType::alloc, measured);
  const size_t qa1_reduce = index_of("FlatParameter.grad (unsharded) of " + qa1, EventType::alloc, measured);
  CHECK(qa1_gather < block0_gather);
  CHECK(block0_gather < qa1_reduce);
  CHECK(qa1_reduce < peft.events.size());
  size_t block1_free = peft.events.size();
  for (size_t i = measured; i < peft.events.size(); ++i)
    if (peft.events[i].type == EventType::free && peft.events[i].tensor == peft.events[measured].tensor) {
      block1_free = i;
      break;
    }
  const size_t vb0_reduce = index_of(
      "FlatParameter.grad (unsharded) of model.layers.0.self_attn.v_proj.lora_B.default.weight",
      EventType::alloc, measured);
  CHECK(qa1_reduce < block1_free);
  CHECK(block1_free < vb0_reduce);
  CHECK(vb0_reduce < peft.events.size());
  // No frozen weight gets a gradient (one GPU's LoRA graph).
  CHECK(count_named(peft, "FlatParameter.grad (unsharded) of block 0") == 0);
  CHECK(count_named(peft, "FlatParameter.grad (unsharded) of model.layers.0.self_attn.v_proj.lora_B.default.weight") == 2);
  // Block wrap saves more for backward (the frozen Linears' inputs, for their weight
  // gradients) than PEFT's wrap, whose graph is one GPU's.
  const Program block = build_program(lora_scenario(8, kBlock));
  CHECK(live(block, "forward_end", TensorKind::activation) >
        live(peft, "forward_end", TensorKind::activation));
  CHECK(live(peft, "forward_end", TensorKind::activation) ==
        live(single, "forward_end", TensorKind::activation));
}

TEST_CASE("FSDP1 use_orig_params: padding segments get zero gradients in the split's backward",
          "[fsdp-lora]") {
  // GPT-2 with d_model 260 in bf16: ln_1 (260 + 260), c_attn bias (780), ... are not
  // multiples of 8 elements, so use_orig_params pads between them.
  const std::string y =
      "model:\n  family: hf-gpt2\n  layers: 2\n  d_model: 260\n  heads: 4\n  d_ff: 1040\n"
      "  vocab: 1000\n  context_length: 64\nbatch:\n  micro_batch: 2\n  seq_len: 64\n"
      "precision:\n  params: bf16\noptimizer:\n  type: adamw\n  impl: for-loop\n"
      "step:\n  kind: train\n  warmup_steps: 1\nparallel:\n  data: 4\n  sharding: fsdp\n"
      "  use_orig_params: true\ndevice:\n  capacity: 1TiB\n  cublas_workspace: 0\n"
      "  kernel_scratch: false\n";
  const Program p = build_program(load_scenario_text(y, "gpt2.yaml"));
  // GPT2Block's parameters in order: ln_1 w, b (260 each), c_attn w (260 x 780), b (780),
  // attn c_proj w (260 x 260), b (260), ln_2 w, b, c_fc w (260 x 1040), b (1040), mlp
  // c_proj w (1040 x 260), b (260).
  const FlatLayout l = flat_layout({260, 260, 202800, 780, 67600, 260, 260, 260, 270400, 1040,
                                    270400, 260},
                                   8, 4);
  CHECK(!l.padding.empty());
  CHECK(count_named(p, "FSDP padding grad (zeros) of block 0") == 2 * l.padding.size());
  // Without use_orig_params: no padding tensors.
  std::string plain = y;
  plain.replace(plain.find("  use_orig_params: true\n"), 24, "");
  CHECK(count_named(build_program(load_scenario_text(plain, "gpt2.yaml")),
                    "FSDP padding grad (zeros) of block 0") == 0);
}

TEST_CASE("FSDP1 use_orig_params without LoRA: the same memory as flat shards, per-parameter Adam",
          "[fsdp-lora]") {
  // Every parameter requires grad: the views cover rank 0's whole shard except padding.
  const std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1024\n  vocab: 1000\n  context_length: 64\nbatch:\n  micro_batch: 2\n  seq_len: 64\n"
      "optimizer:\n  type: adamw\n  impl: for-loop\nstep:\n  kind: train\n  warmup_steps: 1\n"
      "parallel:\n  data: 8\n  sharding: fsdp\n";
  const std::string dev = "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  const Program flat = build_program(load_scenario_text(y + dev, "a.yaml"));
  const Program orig = build_program(load_scenario_text(y + "  use_orig_params: true\n" + dev, "b.yaml"));
  CHECK(live(orig, "optimizer_end", TensorKind::gradient) ==
        live(flat, "optimizer_end", TensorKind::gradient));
  // Root: 512,256 elements (padded to 512,256: divisible by 8); blocks: 1,048,576 + 512.
  // No padding: the views hold everything, as the flat shards do.
  CHECK(live(orig, "optimizer_end", TensorKind::optimizer_state) ==
        live(flat, "optimizer_end", TensorKind::optimizer_state));
}

TEST_CASE("FSDP1 with LoRA: keys and refusals", "[fsdp-lora][scenario]") {
  CHECK(lora_scenario(8, kPeft).parallel.fsdp_wrap == FsdpWrap::peft);
  CHECK(lora_scenario(8, kBlock).parallel.use_orig_params);
  CHECK_THROWS_WITH(lora_scenario(8, "  fsdp_wrap: peft\n"),
                    Catch::Contains("parallel.fsdp_wrap: only applies with parallel.sharding: fsdp"));
  CHECK_THROWS_WITH(lora_scenario(8, "  sharding: fsdp2\n  use_orig_params: true\n"),
                    Catch::Contains("parallel.use_orig_params: only applies"));
  CHECK_THROWS_WITH(lora_scenario(8, "  sharding: fsdp\n  fsdp_wrap: layer\n"),
                    Catch::Contains("parallel.fsdp_wrap: expected one of block, peft"));
  // torch refuses mixed requires_grad in a FlatParameter without use_orig_params.
  CHECK_THROWS_WITH(build_program(lora_scenario(8, "  sharding: fsdp\n")),
                    Catch::StartsWith("fsdp_lora.yaml: parallel.use_orig_params: false with lora"));
  CHECK_THROWS_WITH(
      build_program(lora_scenario(8, kPeft, "precision:\n  params: bf16\n")),
      Catch::StartsWith("fsdp_lora.yaml: lora.adapter_dtype: adapters in fp32 next to bf16"));
  CHECK_THROWS_WITH(build_program(lora_scenario(8, std::string(kPeft) + "  fsdp_mixed_precision: bf16\n")),
                    Catch::StartsWith("fsdp_lora.yaml:28: parallel.fsdp_mixed_precision"));
  CHECK_THROWS_WITH(build_program(lora_scenario(8, kPeft, "precision:\n  autocast: bf16\n")),
                    Catch::StartsWith("fsdp_lora.yaml:33: precision.autocast"));
  Scenario master = lora_scenario(8, kBlock, "precision:\n  params: bf16\n  master_weights: true\n");
  master.lora.adapter_dtype = DType::bf16;
  CHECK_THROWS_WITH(build_program(master), Catch::StartsWith("fsdp_lora.yaml: precision.master_weights"));
  CHECK_THROWS_WITH(
      build_program(lora_scenario(8, std::string(kBlock) + "  cpu_offload: true\n")),
      Catch::StartsWith("fsdp_lora.yaml:29: parallel.cpu_offload: CPUOffload with use_orig_params"));
  Scenario no_lora = lora_scenario(8, kPeft);
  no_lora.lora = LoraConfig{};
  CHECK_THROWS_WITH(build_program(no_lora), Catch::StartsWith("fsdp_lora.yaml:27: parallel.fsdp_wrap: peft"));
}
