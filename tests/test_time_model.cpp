// The time model (issue #18 item 1; program/step_cost.h, sim/analysis/step_time.h,
// docs/time-model.md): FLOP counts against the analytic rules (6ND, 8ND with full
// recompute, 4*b*s^2*d attention), the roofline and collective arithmetic on stated rates,
// the optimizer's kernel bytes, refusals, and the `run` / `compare` reports.
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "scenario/scenario.h"
#include "sim/analysis/step_time.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"

using namespace memsim;
using nlohmann::json;

namespace {

constexpr int64_t kL = 3, kD = 64, kH = 4, kF = 176, kV = 96, kB = 2, kS = 32;

// CS336's staff transformer, fp32 (eager attention: two bmms per layer).
Scenario cs336() {
  Scenario s;
  s.name = "time model test";
  s.model.family = ModelFamily::cs336;
  s.model.layers = kL;
  s.model.d_model = kD;
  s.model.heads = kH;
  s.model.kv_heads = kH;
  s.model.d_ff = kF;
  s.model.vocab = kV;
  s.model.context_length = kS;
  s.batch.micro_batch = kB;
  s.batch.seq_len = kS;
  s.optimizer.type = OptimizerType::adamw;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = 1;
  s.device = *find_device_preset("h100-80gb");
  return s;
}

// The analytic counts: N = matmul parameters (q, k, v, o, the SwiGLU's three, the LM
// head; embeddings do no matmul), D = tokens of the step.
constexpr double kTokens = static_cast<double>(kB * kS);
constexpr double kLayerMatmulParams = 4.0 * kD * kD + 3.0 * kD * kF;
constexpr double kHeadParams = static_cast<double>(kD) * kV;
constexpr double kAttention = 4.0 * kB * kS * kS * kD;  // per layer forward: QK^T and AV

}  // namespace

TEST_CASE("forward + backward GEMM FLOPs are 6ND plus attention, exactly", "[time]") {
  const Scenario s = cs336();
  const Program p = build_program(s);
  const double n = kL * kLayerMatmulParams + kHeadParams;
  const double forward = 2.0 * n * kTokens + kL * kAttention;
  CHECK(p.cost.gemm_flops(CostPart::forward) == forward);
  // Every matmul's inputs need grads (the embedding is trained): two GEMMs per forward one.
  CHECK(p.cost.gemm_flops(CostPart::backward) == 2.0 * forward);
  CHECK(p.cost.gemm_flops(CostPart::forward) + p.cost.gemm_flops(CostPart::backward) ==
        6.0 * n * kTokens + 3.0 * kL * kAttention);
  CHECK(p.cost.gemm_flops(CostPart::recompute) == 0);
  // Program::flops counts the whole run (one warm-up step and the measured one); the cost
  // is the measured step's.
  CHECK(p.flops.forward == 2.0 * forward);
}

TEST_CASE("full recompute without early stop adds each layer's forward: 8ND", "[time]") {
  Scenario s = cs336();
  s.checkpoint = parse_policy("full");
  s.checkpoint.early_stop = false;  // the whole region re-runs (torch < 2.1, reentrant)
  const Program p = build_program(s);
  const double layers = kL * (2.0 * kLayerMatmulParams * kTokens + kAttention);
  CHECK(p.cost.gemm_flops(CostPart::recompute) == layers);
  const double n = kL * kLayerMatmulParams + kHeadParams;
  // 8ND over the layers' parameters (the head is not recomputed).
  CHECK(p.cost.gemm_flops(CostPart::forward) + p.cost.gemm_flops(CostPart::backward) +
            p.cost.gemm_flops(CostPart::recompute) ==
        6.0 * n * kTokens + 2.0 * kL * kLayerMatmulParams * kTokens + 4.0 * kL * kAttention);
}

TEST_CASE("the roofline, the ring and the refusals on stated rates", "[time]") {
  DeviceConfig d;
  d.preset = "test";
  d.flops_bf16 = 1000e12;
  d.hbm_bandwidth = 2000e9;
  d.nvlink_bandwidth = 400e9;
  d.pcie_bandwidth = 50e9;
  d.network_bandwidth = 25e9;
  d.gpus_per_node = 8;
  StepCost c;
  // Compute-bound: 8e12 FLOPs at 800 TFLOP/s = 10 ms (bytes would take 1e9/1.8e12).
  c.add_gemm(CostPart::forward, MathDtype::bf16, 8e12, 1e9);
  c.add_gemm(CostPart::forward, MathDtype::bf16, 8e12, 1e9);  // the same shape: counted
  REQUIRE(c.gemms.size() == 1);
  // Memory-bound: 1 GFLOP over 18 GB = 10 ms at 1.8 TB/s.
  c.add_gemm(CostPart::backward, MathDtype::bf16, 1e9, 18e9);
  c.traffic[static_cast<int>(CostPart::optimizer)] = 3.6e9;  // 2 ms
  c.add_collective(Collective::all_reduce, 4, 32e9);  // 2*3/4*32e9 / 320e9 = 150 ms
  c.add_collective(Collective::all_gather, 16, 8e9);  // 15/16*8e9 / 20e9 = 375 ms (network)
  c.host_bytes = 4e9;                                  // 4e9 / 40e9 = 100 ms
  const StepTime t = estimate_step_time(c, d);
  REQUIRE(t.estimated);
  CHECK(t.part[static_cast<int>(CostPart::forward)] == Approx(0.020));
  CHECK(t.part[static_cast<int>(CostPart::backward)] == Approx(0.010));
  CHECK(t.part[static_cast<int>(CostPart::optimizer)] == Approx(0.002));
  CHECK(t.part[static_cast<int>(CostPart::communication)] == Approx(0.150 + 0.375));
  CHECK(t.part[static_cast<int>(CostPart::transfer)] == Approx(0.100));
  CHECK(t.seconds == Approx(0.020 + 0.010 + 0.002 + 0.525 + 0.100));
  CHECK(t.model_flops == 16e12 + 1e9);
  CHECK(t.mfu == Approx((16e12 + 1e9) / (t.seconds * 1000e12)));
  CHECK(t.mfu_dtype == MathDtype::bf16);

  StepCost fp8 = c;
  fp8.add_gemm(CostPart::forward, MathDtype::fp8, 1e9, 1e6);
  const StepTime no_fp8 = estimate_step_time(fp8, d);
  CHECK_FALSE(no_fp8.estimated);
  CHECK(no_fp8.refused.rfind("device.tflops_fp8:", 0) == 0);
  DeviceConfig no_network = d;
  no_network.network_bandwidth = 0;
  CHECK(estimate_step_time(c, no_network).refused.rfind("device.network_gbps:", 0) == 0);
  StepCost unmodelled = c;
  unmodelled.refuse("parallel.tensor: why");
  CHECK(estimate_step_time(unmodelled, d).refused == "parallel.tensor: why");
}

TEST_CASE("optimizer bytes follow each implementation's kernels", "[time]") {
  Scenario s = cs336();
  const Program foreach_p = build_program(s);
  const double params = kL * (kLayerMatmulParams + 2.0 * kD) + kD + 2.0 * kHeadParams;  // norms, embedding
  const double opt = foreach_p.cost.traffic[static_cast<int>(CostPart::optimizer)];
  // AdamW foreach on fp32: 6 parameter passes + 14 state passes of 4 bytes per element.
  CHECK(opt == params * (6 + 14) * 4);
  s.optimizer.impl = OptimizerImpl::fused;
  const Program fused = build_program(s);
  CHECK(fused.cost.traffic[static_cast<int>(CostPart::optimizer)] == params * (3 + 4) * 4);
  s.optimizer.type = OptimizerType::adamw8bit;  // bitsandbytes: no kernel table
  s.optimizer.impl = OptimizerImpl::foreach;
  const Program bnb = build_program(s);
  const StepTime t = estimate_step_time(bnb.cost, s.device);
  CHECK_FALSE(t.estimated);
  CHECK(t.refused.rfind("optimizer.type:", 0) == 0);
}

TEST_CASE("DDP all-reduces its buckets every backward over NVLink", "[time]") {
  Scenario s = cs336();
  s.parallel.data = 4;
  s.batch.grad_accum = 2;
  const Program p = build_program(s);
  double bytes = 0;
  uint64_t calls = 0;
  for (const CollectiveCost& c : p.cost.collectives) {
    CHECK(c.kind == Collective::all_reduce);
    CHECK(c.ranks == 4);
    bytes += c.bytes * static_cast<double>(c.count);
    calls += c.count;
  }
  const double grads = 4.0 * (kL * (kLayerMatmulParams + 2.0 * kD) + kD + 2.0 * kHeadParams);
  CHECK(bytes == 2 * grads);  // two micro-batches, no no_sync()
  const StepTime t = estimate_step_time(p.cost, s.device);
  REQUIRE(t.estimated);
  CHECK(t.part[static_cast<int>(CostPart::communication)] ==
        Approx(2.0 * 3.0 / 4.0 * 2 * grads / (450e9 * kLinkEfficiency)));
  (void)calls;
}

TEST_CASE("memsim run and compare report estimated_step_seconds", "[time]") {
  namespace fs = std::filesystem;
  memsim_test::TempDir dir("memsim_time");
  const fs::path yaml = dir.path / "s.yaml";
  std::ofstream(yaml) << "name: time cli test\n"
                         "model:\n  family: cs336\n  layers: 4\n  d_model: 64\n  heads: 4\n"
                         "  d_ff: 172\n  vocab: 96\n"
                         "batch:\n  micro_batch: 4\n  seq_len: 128\n"
                         "step:\n  warmup_steps: 1\n"
                         "device:\n  preset: a100-80gb\n  capacity: 64GiB\n";
  const std::string cmd = memsim_test::memsim_command();
  const auto run = memsim_test::run_shell(cmd + "run '" + yaml.string() + "' --json - 2>/dev/null");
  REQUIRE(run.status == 0);
  const json j = json::parse(run.out);
  const json& t = j["estimated_step_seconds"];
  REQUIRE(t["total"].is_number());
  double sum = 0;
  for (const char* part : {"forward", "backward", "recompute", "optimizer", "communication", "transfer"}) {
    REQUIRE(t.contains(part));
    sum += t[part].get<double>();
  }
  CHECK(t["total"].get<double>() == Approx(sum));
  CHECK(t["forward"].get<double>() > 0);
  CHECK(t["backward"].get<double>() > t["forward"].get<double>());
  CHECK(t["mfu"].get<double>() > 0);
  CHECK(t["mfu"].get<double>() < kGemmEfficiency);
  CHECK(t["mfu_dtype"] == "fp32");

  const auto text = memsim_test::run_shell(cmd + "run '" + yaml.string() + "' 2>/dev/null");
  CHECK(text.out.find("TIME  estimated step") != std::string::npos);

  // A faster device (a rate override) gives a shorter step.
  const auto fast = memsim_test::run_shell(cmd + "run '" + yaml.string() +
                                           "' --set device.tflops_fp32=1000 --set device.hbm_gbps=20000 --json - 2>/dev/null");
  REQUIRE(fast.status == 0);
  CHECK(json::parse(fast.out)["estimated_step_seconds"]["total"].get<double>() < t["total"].get<double>());
  const auto bad = memsim_test::run_shell(cmd + "run '" + yaml.string() + "' --set device.hbm_gbps=-1 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("device.hbm_gbps") != std::string::npos);

  const auto cmp = memsim_test::run_shell(cmd + "compare '" + yaml.string() + "' --policies none,full --json - 2>/dev/null");
  REQUIRE(cmp.status == 0);
  const json c = json::parse(cmp.out);
  const json& none = c["policies"][0];
  const json& full = c["policies"][1];
  CHECK(none["recompute_seconds"].get<double>() == 0);
  CHECK(full["recompute_seconds"].get<double>() > 0);
  CHECK(full["recompute_seconds"] == full["estimated_step_seconds"]["recompute"]);
  CHECK(full["estimated_step_seconds"]["total"].get<double>() > none["estimated_step_seconds"]["total"].get<double>());
  // Recompute costs about one more forward: the step grows by less than half.
  CHECK(full["estimated_step_seconds"]["total"].get<double>() < 1.5 * none["estimated_step_seconds"]["total"].get<double>());

  // A device without rates: refused by key, the memory report unchanged.
  const auto bare = memsim_test::run_shell(cmd + "run '" + yaml.string() +
                                           "' --set device.preset=rtx-4070 --set device.capacity=64GiB --json - 2>/dev/null");
  REQUIRE(bare.status == 0);
  const json b = json::parse(bare.out);
  CHECK(b["estimated_step_seconds"]["total"].is_null());
  CHECK(b["estimated_step_seconds"]["refused"].get<std::string>().rfind("device.hbm_gbps:", 0) == 0);
}
