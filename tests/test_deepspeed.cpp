// DeepSpeed ZeRO 1/2/3 (sim/parallel/deepspeed_zero.h, scenario/deepspeed_keys.h): the
// buffers' sizes against hand arithmetic for a small Llama, the order of events, the ZeRO-3
// fetch / prefetch / release rules, LoRA with ZeRO-3, offload (GPU and host bytes), the
// ds.json reader and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "deepspeed_test_support.h"
#include "program/tensor_names.h"
#include "sim/parallel/deepspeed_zero.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim_test::deepspeed;

TEST_CASE("DeepSpeed ZeRO-2: flat buffer, fp32 partition, bucket and grads_in_partition by hand",
          "[deepspeed]") {
  // d = 4: alignment 2d = 8 divides 115008, so P = 28752. Rank 0's partition [0, 28752)
  // covers the embedding (16384) and layer 0's q, k, v (12288) and starts into o_proj
  // (28672 < 28752): grads_in_partition holds 16384 + 4 * 4096 = 32768 elements.
  const Scenario s = load(small_llama(4, "  zero: 2\n", "deepspeed:\n  reduce_bucket_size: 20000\n"));
  const Program p = build_program(s);
  CHECK(allocs(p, "* flat parameters of group 0 (ZeRO-* bit16_groups_flat)") == std::vector<uint64_t>{kTotal * 2});
  CHECK(allocs(p, "* alignment padding of flat group 0 (ZeRO-*)").empty());  // 115008 % 8 == 0
  CHECK(allocs(p, "* clone of group 0's partition (ZeRO-*)") == std::vector<uint64_t>{28752 * 2});
  CHECK(allocs(p, "fp32 partition of group 0 (ZeRO-*)") ==
        std::vector<uint64_t>{28752 * 4});
  // FusedAdam: two fp32 moments of the partition, created once.
  CHECK(allocs(p, "exp_avg of fp32 partition of *") == std::vector<uint64_t>{28752 * 4});
  CHECK(allocs(p, "exp_avg_sq of fp32 partition of *") == std::vector<uint64_t>{28752 * 4});
  // One bucket per backward (2 steps), bit16, reduce_bucket_size elements.
  CHECK(allocs(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)") == std::vector<uint64_t>{40000, 40000});
  CHECK(allocs(p, "* gradients in group 0's partition (ZeRO-* grads_in_partition)") == std::vector<uint64_t>{32768 * 2, 32768 * 2});
  // The step: bit16 flat grad partition, its fp32 cast.
  CHECK(allocs(p, "* flat grad of group 0's partition (ZeRO-*)") == std::vector<uint64_t>{28752 * 2, 28752 * 2});
  CHECK(allocs(p, "grad of fp32 partition of *") == std::vector<uint64_t>{28752 * 4, 28752 * 4});
  // No model parameter has a gradient after backward: the bucket and the partition buffer
  // are all that hold gradients; after the step only the states remain.
  CHECK(live_at_end(p, "* gradients in group 0's partition (ZeRO-* grads_in_partition)") == 0);
  CHECK(live_at_end(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)") == 0);
  CHECK(live_at_end(p, "* flat parameters of group 0 (ZeRO-* bit16_groups_flat)") == kTotal * 2);
  CHECK(p.rank.world_size == 4);
  CHECK(p.rank.why.find("DeepSpeed ZeRO stage 2") != std::string::npos);
  CHECK_FALSE(p.host.any());
}

TEST_CASE("DeepSpeed ZeRO-1 keeps whole gradients until reduce_gradients", "[deepspeed]") {
  const Scenario s = load(small_llama(4, "  zero: 1\n"));
  const Program p = build_program(s);
  // Default reduce_bucket_size 5e8 elements: the bucket is allocated at the first hook.
  CHECK(allocs(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)") == std::vector<uint64_t>{1000000000, 1000000000});
  // The hooks reduce nothing at stage 1: when the backward's last gradient is made, every
  // parameter's bf16 gradient is alive (the whole model: 2 B x 115008).
  const size_t be = mark_index(p, "backward_end");
  REQUIRE(be != SIZE_MAX);
  const TensorNames names(p);
  size_t last_grad = 0;
  for (size_t i = 0; i < be; ++i)
    if (p.events[i].type == EventType::alloc && named_as(names, p.events[i].tensor, "grad of *.weight")) last_grad = i;
  auto model_grads_before = [&](size_t at) {
    return live_named_before(p, "grad of *.weight", at, "(ZeRO-");
  };
  CHECK(model_grads_before(last_grad + 1) == kTotal * 2);
  // Then engine.allreduce_gradients -> reduce_gradients sends each through the bucket
  // (its own storage dies), reduce_ipg_grads copies the partition's (embedding, q, k, v, o
  // of layer 0 = 32768 elements) into grads_in_partition, and the epilogue keeps that
  // (all_grad_tensors) and drops the rest: no model gradient at backward_end.
  CHECK(allocs(p, "* gradients in group 0's partition (ZeRO-* grads_in_partition)") ==
        std::vector<uint64_t>{32768 * 2, 32768 * 2});
  CHECK(model_grads_before(be) == 0);
  CHECK(live_at_end(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)") == 0);
}

TEST_CASE("DeepSpeed ZeRO-3: partitions, persistence, buffers and prefetch", "[deepspeed]") {
  const std::string ds =
      "deepspeed:\n  reduce_bucket_size: 20000\n  stage3_param_persistence_threshold: 100\n"
      "  stage3_prefetch_bucket_size: 10000\n";
  const Scenario s = load(small_llama(4, "  zero: 3\n", ds));
  const Program p = build_program(s);
  // Every parameter divisible by 4: the partitions sum to 115008 / 4.
  CHECK(allocs(p, "* partitions of the trainable parameters (ZeRO-3 lp_param_buffer)") == std::vector<uint64_t>{28752 * 2});
  CHECK(allocs(p, "fp32 partition of sub group * (ZeRO-3)") == std::vector<uint64_t>{28752 * 4});
  CHECK(allocs(p, "* gradient partitions of the trainable parameters (ZeRO-3 grad_partitions_flat_buffer)") == std::vector<uint64_t>{28752 * 2});
  CHECK(allocs(p, "* IPG gradient bucket (ZeRO-3 __ipg_bucket_flat_buffer)") == std::vector<uint64_t>{40000});
  CHECK(allocs(p, "fp32 gradient buffer of the largest sub group (ZeRO-3 initialize_optimizer_states)") == std::vector<uint64_t>{28752 * 4});
  // Five norms of 64 elements persist (<= 100): a GPU partition of 16 elements each, and
  // their whole data stays.
  CHECK(allocs(p, "ZeRO-3 partition of * (ds_tensor of a persistent parameter)").size() == 5);
  // zero.Init: each non-persistent parameter's partition follows its creation at once.
  const auto parts = allocs(p, "ZeRO-3 partition of * (ds_tensor)");
  CHECK(parts.size() == 2 + 2 * 7);
  CHECK(parts.front() == 16384 / 4 * 2);
  // Module fetches: the first iteration gathers layer 0's attention (4 x 4096 elements,
  // one coalesced buffer) when it first runs; no prefetch before the trace is complete.
  const auto gathers = allocs(p, "ZeRO-3 all-gather of *");
  REQUIRE(gathers.size() > 2);
  CHECK(gathers[0] == 16384 * 2);  // the embedding
  CHECK(gathers[1] == 16384 * 2);  // layer 0 q, k, v, o
  const size_t measured = mark_index(p, "measured_step_begin");
  REQUIRE(measured != SIZE_MAX);
  size_t warm_prefetch = 0;
  const TensorNames names(p);
  for (size_t i = 0; i < measured; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc && named_as(names, e.tensor, "ZeRO-3 prefetch all-gather of *"))
      ++warm_prefetch;
  }
  CHECK(warm_prefetch == 0);
  CHECK(count_after(p, "ZeRO-3 prefetch all-gather of *", measured) > 0);
  // The reduce-scatter's padded concatenation runs on the reduce stream.
  bool on_stream = false;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc &&
        named_as(names, e.tensor, "* reduce-scatter input of the IPG bucket (ZeRO-3 reduce_scatter_coalesced)"))
      on_stream = on_stream || e.stream == 1;
  CHECK(on_stream);
  // After the step nothing gathered is left.
  CHECK(live_at_end(p, "ZeRO-3 all-gather of *") == 0);
  CHECK(live_at_end(p, "ZeRO-3 prefetch all-gather of *") == 0);
}

TEST_CASE("DeepSpeed ZeRO-3: max_live_parameters bounds the prefetch", "[deepspeed]") {
  const std::string ds =
      "deepspeed:\n  stage3_param_persistence_threshold: 100\n  stage3_max_live_parameters: 1\n";
  const Program p = build_program(load(small_llama(4, "  zero: 3\n", ds)));
  CHECK(allocs(p, "ZeRO-3 prefetch all-gather of *").empty());
  // max_reuse_distance 0: every module's parameters are released after it runs, so the
  // measured step gathers each module again in backward.
  const std::string ds0 = ds + "  stage3_max_reuse_distance: 0\n";
  const Program q = build_program(load(small_llama(4, "  zero: 3\n", ds0)));
  CHECK(allocs(q, "ZeRO-3 all-gather of *").size() >=
        allocs(p, "ZeRO-3 all-gather of *").size());
}

TEST_CASE("DeepSpeed ZeRO-3 with LoRA: frozen base partitioned, adapters trained", "[deepspeed]") {
  const std::string lora =
      "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n  adapter_dtype: bf16\n"
      "deepspeed:\n  stage3_param_persistence_threshold: 100\n";
  const Program p = build_program(load(small_llama(4, "  zero: 3\n", lora)));
  // Adapters per targeted module: A 8 x 64 and B 64 x 8 = 1024 elements; 2 modules x 2
  // layers = 4096 trainable elements, partitioned by 4: 1024.
  CHECK(allocs(p, "* gradient partitions of the trainable parameters (ZeRO-3 grad_partitions_flat_buffer)") == std::vector<uint64_t>{1024 * 2});
  CHECK(allocs(p, "fp32 partition of sub group * (ZeRO-3)") == std::vector<uint64_t>{1024 * 4});
  CHECK(allocs(p, "exp_avg of fp32 partition of *") == std::vector<uint64_t>{1024 * 4});
  // The frozen base (every non-persistent model weight) has a partition too.
  CHECK(allocs(p, "ZeRO-3 partition of * (ds_tensor)").size() == 2 + 2 * 7 + 8);
}

TEST_CASE("DeepSpeed offload: GPU buffers move to the host and are reported", "[deepspeed]") {
  SECTION("ZeRO-2 offload_optimizer cpu") {
    const Program p = build_program(load(small_llama(4, "  zero: 2\n", "deepspeed:\n  offload_optimizer: cpu\n")));
    CHECK(allocs(p, "exp_avg of fp32 partition of *").empty());
    CHECK(allocs(p, "fp32 partition of group 0 (ZeRO-*)").empty());
    CHECK(allocs(p, "* gradient staging buffer for the host (ZeRO-* temp_grad_buffer_for_gpu_offload)") == std::vector<uint64_t>{16384 * 2});
    // Host: fp32 master 4P + fp32 grad 4P + bit16 staging 2P + largest param 2 x 16384
    // (pinned) and Adam 8P (pageable), P = 28752.
    CHECK(p.host.pinned == 28752 * 4 * 2 + 28752 * 2 + 16384 * 2);
    CHECK(p.host.pageable == 28752 * 8);
    CHECK(p.host.ranks_per_node == 4);
  }
  SECTION("ZeRO-3 offload_optimizer and offload_param cpu") {
    const Program p = build_program(load(small_llama(
        4, "  zero: 3\n",
        "deepspeed:\n  stage3_param_persistence_threshold: 100\n  offload_optimizer: cpu\n"
        "  offload_param: cpu\n  ranks_per_node: 8\n")));
    CHECK(allocs(p, "* partitions of the trainable parameters (ZeRO-3 lp_param_buffer)").empty());
    CHECK(allocs(p, "* gradient partitions of the trainable parameters (ZeRO-3 grad_partitions_flat_buffer)").empty());
    CHECK(allocs(p, "exp_avg of fp32 partition of *").empty());
    CHECK_FALSE(allocs(p, "ZeRO-3 partition of * copied to the GPU (offload_param)").empty());
    // Host: grad partitions 2P + fp32 grads 4P + bit16 partitions 2 x (115008 - 5 x 64) / 4
    // (pinned); fp32 master 4P + Adam 8P (pageable); P = 28752 (trainable partitions).
    const uint64_t P = 28752, params = (kTotal - 5 * 64) / 4;
    CHECK(p.host.pinned == 2 * P + 4 * P + 2 * params);
    CHECK(p.host.pageable == 12 * P);
    CHECK(p.host.ranks_per_node == 8);
  }
}

TEST_CASE("DeepSpeed JSON config: auto values, precision and optimizer", "[deepspeed]") {
  const std::string y = small_llama(4, "", "deepspeed:\n  config: " + data("zero3_hf_auto.json") + "\n");
  const Scenario s = load(y);
  CHECK(s.parallel.zero == 3);
  CHECK(s.deepspeed.reduce_bucket_size == 64 * 64);                   // auto: hidden^2
  CHECK(s.deepspeed.stage3_prefetch_bucket_size == 3686);             // auto: int(0.9 hidden^2)
  CHECK(s.deepspeed.stage3_param_persistence_threshold == 640);       // auto: 10 hidden
  CHECK(s.deepspeed.overlap());
  CHECK(s.optimizer.impl == OptimizerImpl::fused);
  CHECK(s.optimizer.type == OptimizerType::adamw);
  const Program p = build_program(s);
  CHECK(allocs(p, "* IPG gradient bucket (ZeRO-3 __ipg_bucket_flat_buffer)") == std::vector<uint64_t>{64 * 64 * 2});
  // The scenario's keys override the file's.
  const Scenario o = load(y + "  reduce_bucket_size: 1000\n");
  CHECK(o.deepspeed.reduce_bucket_size == 1000);
  // ZeRO-2 offload file.
  const Scenario z2 = load(small_llama(4, "", "deepspeed:\n  config: " + data("zero2_offload.json") + "\n"));
  CHECK(z2.parallel.zero == 2);
  CHECK(z2.deepspeed.offload_optimizer == DsOffload::cpu);
  CHECK(z2.deepspeed.reduce_bucket_size == 200000000);
}

TEST_CASE("DeepSpeed bad input names the key", "[deepspeed]") {
  using Catch::Contains;
  auto fails = [](const std::string& text, const std::string& what) {
    CHECK_THROWS_WITH(build_program(load_scenario_text(text, "ds.yaml")), Contains(what));
  };
  fails(small_llama(4, "  zero: 4\n"), "parallel.zero");
  fails(small_llama(4, "  zero: 0\n"), "parallel.zero: DeepSpeed ZeRO stages are 1, 2 and 3");
  fails(small_llama(4, ""), "parallel.zero: required with parallel.sharding: deepspeed");
  fails(small_llama(4, "  zero: 2\n", "deepspeed:\n  offload_param: cpu\n  offload_optimizer: cpu\n"),
        "deepspeed.offload_param: parameter offload needs ZeRO stage 3");
  fails(small_llama(4, "  zero: 3\n", "deepspeed:\n  offload_param: cpu\n"),
        "offload_optimizer device cpu or nvme");
  fails(small_llama(4, "  zero: 2\n", "deepspeed:\n  stage3_max_live_parameters: 5\n"),
        "deepspeed.stage3_max_live_parameters: a ZeRO stage 3 knob");
  fails(small_llama(4, "  zero: 3\n  cpu_offload: true\n"), "parallel.cpu_offload: only applies with parallel.sharding: fsdp");
  fails(small_llama(4, "  zero: 3\n  reshard_after_forward: true\n"), "parallel.reshard_after_forward");
  fails(small_llama(1, "  zero: 3\n"), "parallel.data");
  fails(small_llama(4, "  zero: 3\n", "deepspeed:\n  config: " + data("broken.json") + "\n"),
        "broken.json: does not parse as JSON");
  fails(small_llama(4, "  zero: 3\n", "deepspeed:\n  config: " + data("unmodelled_key.json") + "\n"),
        "unmodelled_key.json: zero_optimization.zero_quantized_weights: not modelled");
  fails(small_llama(4, "  zero: 2\n", "deepspeed:\n  config: " + data("zero3_hf_auto.json") + "\n"),
        "parallel.zero: 2 disagrees with zero_optimization.stage 3");
  fails(small_llama(4, "  zero: 2\n", "deepspeed:\n  config: missing.json\n"), "deepspeed.config: cannot read");
  // Batch sizes must agree with the file's numbers.
  std::string mb = small_llama(4, "  zero: 2\n", "deepspeed:\n  config: " + data("zero2_offload.json") + "\n");
  mb.replace(mb.find("micro_batch: 2"), 14, "micro_batch: 3");
  fails(mb, "zero2_offload.json: train_micro_batch_size_per_gpu: 2 disagrees with batch.micro_batch 3");
  // Precision must agree with bf16.enabled.
  std::string fp32 = small_llama(4, "  zero: 2\n", "deepspeed:\n  config: " + data("zero2_offload.json") + "\n");
  fp32.replace(fp32.find("params: bf16"), 12, "params: fp32");
  fails(fp32, "bf16.enabled: DeepSpeed runs the model in bf16 but precision.params is fp32");
  {
    Scenario m = load(small_llama(4, "  zero: 3\n"));
    m.precision.master_weights = true;
    CHECK_THROWS_WITH(build_program(m), Contains("precision.master_weights"));
  }
  fails(small_llama(4, "  zero: 1\n", "deepspeed:\n  offload_optimizer: cpu\n"), "deepspeed.offload_optimizer");
  fails(small_llama(4, "  zero: 3\n", "lora:\n  rank: 8\n  targets: [q_proj]\n"), "lora.adapter_dtype");
  // deepspeed keys without DeepSpeed; DeepSpeed for megatron.
  std::string none = small_llama(4, "  zero: 3\n", "deepspeed:\n  reduce_bucket_size: 10\n");
  none.replace(none.find("sharding: deepspeed"), 19, "sharding: fsdp");
  fails(none, "deepspeed.reduce_bucket_size: only applies with parallel.sharding: deepspeed");
  std::string megatron = small_llama(4, "  zero: 1\n");
  megatron.replace(megatron.find("family: hf-llama"), 16, "family: megatron");
  fails(megatron, "parallel.sharding");
}

TEST_CASE("memsim run: DeepSpeed scenario reports host memory", "[deepspeed][cli]") {
  memsim_test::TempDir dir("ds_cli");
  const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama2-7b-zero3-8xa100.yaml";
  const memsim_test::CliResult r = memsim_test::run_memsim(
      "run '" + scenario + "' --set deepspeed.offload_optimizer=cpu --json -", dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("\"host_memory\"") != std::string::npos);
  CHECK(r.out.find("\"per_node_bytes\"") != std::string::npos);
  const memsim_test::CliResult bad = memsim_test::run_memsim("run '" + scenario + "' --set parallel.zero=5", dir);
  CHECK(bad.status == 1);
  CHECK(bad.err.find("parallel.zero") != std::string::npos);
}

TEST_CASE("DeepSpeed ZeRO-3 on hf-gpt2 (tied head) and cs336: modules fetched by name", "[deepspeed]") {
  // hf-gpt2: the tied LM head runs with wte, so the head's fetch gathers the embedding's
  // 256 x 64 weight again after it was released (max_reuse_distance 0): a 16384 x 2 B
  // buffer in layer -1.
  const std::string gpt2 =
      "model:\n  family: hf-gpt2\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n  vocab: 256\n"
      "  context_length: 32\n  attention: eager\n"
      "batch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: bf16\n"
      "parallel:\n  data: 4\n  sharding: deepspeed\n  zero: 3\n"
      "deepspeed:\n  stage3_param_persistence_threshold: 100\n  stage3_max_reuse_distance: 0\n"
      "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  const Program p = build_program(load(gpt2));
  size_t head_gathers = 0;
  const TensorNames names(p);
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.layer == -1 && e.phase == Phase::forward &&
        named_as(names, e.tensor, "ZeRO-3 all-gather of *") && e.bytes == 256 * 64 * 2)
      ++head_gathers;
  // The embedding module gathers wte with wpe (another size); the head's own gather of wte
  // happens at least in the warm-up forward (the measured one may have prefetched it).
  CHECK(head_gathers >= 1);
  CHECK(live_at_end(p, "ZeRO-3 all-gather of *") == 0);
  // cs336: attention (attn.*), ffn and ln* names map to the modules its ops run in.
  const std::string cs336 =
      "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n  vocab: 256\n"
      "  context_length: 32\nbatch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: bf16\n"
      "parallel:\n  data: 4\n  sharding: deepspeed\n  zero: 3\n"
      "deepspeed:\n  stage3_param_persistence_threshold: 100\n"
      "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  const Program q = build_program(load(cs336));
  const auto g = allocs(q, "ZeRO-3 all-gather of *");
  // Layer 0's attention: q, k, v, output_proj, 4 x 64 x 64 elements, one buffer.
  CHECK(std::find(g.begin(), g.end(), uint64_t{4 * 4096 * 2}) != g.end());
  // Its SwiGLU: w1, w2, w3, 3 x 64 x 128.
  CHECK(std::find(g.begin(), g.end(), uint64_t{3 * 8192 * 2}) != g.end());
}

TEST_CASE("DeepSpeed ZeRO-3 zero_init: partition at creation, or after the whole model", "[deepspeed]") {
  // Index of the first partition alloc and of the last model-parameter alloc (the
  // construction's "empty" allocations).
  auto order = [](const Program& p) {
    const TensorNames names(p);
    size_t first_part = SIZE_MAX, last_param = 0;
    for (size_t i = 0; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type != EventType::alloc) continue;
      const std::string& n = names.name(e.tensor);
      if (named_as(names, e.tensor, "ZeRO-3 partition of * (ds_tensor)") && first_part == SIZE_MAX) first_part = i;
      if (e.kind == TensorKind::parameter && n.rfind("model.", 0) == 0) last_param = i;
    }
    return std::make_pair(first_part, last_param);
  };
  const std::string ds = "deepspeed:\n  stage3_param_persistence_threshold: 100\n";
  const auto [init_part, init_last] = order(build_program(load(small_llama(4, "  zero: 3\n", ds))));
  CHECK(init_part < init_last);  // zero.Init: the embedding is partitioned before the rest exists
  const auto [late_part, late_last] =
      order(build_program(load(small_llama(4, "  zero: 3\n", ds + "  zero_init: false\n"))));
  CHECK(late_part > late_last);  // deepspeed.initialize on a model built on the GPU
  // zero_init with stage 2 is refused by key.
  CHECK_THROWS_WITH(load(small_llama(4, "  zero: 2\n", "deepspeed:\n  zero_init: true\n")),
                    Catch::Contains("deepspeed.zero_init"));
}
