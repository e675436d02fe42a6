// Numeric mode for the Hugging Face families (graph/numeric/numeric_ops_nn.cpp) and megatron
// (graph/numeric/numeric_ops_fused.cpp): the hf-llama (GQA, MQA, tied, SDPA), hf-gpt2 (tied,
// untied) and megatron schedules executed with real numbers prove their gradients (finite
// differences), their checkpointing policies (bit-identical), their optimizer steps,
// catch a premature free, and agree with torch 1.13 in float64.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "graph/numeric/numeric.h"
#include "sim/check/numeric_check.h"
#include "sim/step/schedule.h"
#include "numeric_test_support.h"
#include "tests/cli_test_support.h"

using namespace memsim;

namespace {

using memsim_test::Sets;
using memsim_test::numeric_scenario_path;

Scenario load(const char* file, const Sets& sets = {}) {
  return memsim_test::load_numeric_scenario(file, sets);
}

void check_full(const char* file, const Sets& sets, int params, double loss_lo = 2.0,
                double loss_hi = 6.0) {
  NumericCheckOptions o;
  o.fd_samples = 2;
  const NumericCheckReport r = run_numeric_check(load(file, sets), o);
  INFO(file << ": " << r.failures.size() << " failures; first: "
            << (r.failures.empty() ? "" : r.failures[0]));
  CHECK(r.passed());
  CHECK(r.fd_points == params * 3);
  CHECK(r.fd_max_rel_error < 1e-6);
  CHECK(r.optimizer_steps == 3);
  CHECK(r.optimizer_max_rel_error < 1e-10);
  REQUIRE(r.policies.size() == 10);
  for (const PolicyCheck& p : r.policies) {
    INFO(p.policy << " " << p.error);
    CHECK(p.identical);
  }
  CHECK(std::isfinite(r.loss));
  CHECK(r.loss > loss_lo);
  CHECK(r.loss < loss_hi);
}

void check_variants(const char* file, const std::vector<Sets>& variants) {
  for (const Sets& v : variants) {
    NumericCheckOptions o;
    o.fd_samples = 1;
    o.policies = {"none", "full", "selective", "modules"};
    const NumericCheckReport r = run_numeric_check(load(file, v), o);
    std::string what;
    for (const auto& [k, val] : v) what += k + "=" + val + " ";
    INFO(file << " " << what << r.optimizer << ": " << (r.failures.empty() ? "" : r.failures[0]));
    CHECK(r.passed());
    CHECK(r.fd_max_rel_error < 1e-6);
    CHECK(r.optimizer_steps == 3);
  }
}

void check_sabotage(const char* file) {
  // One save takes no reference: the schedule frees the tensor before backward reads it.
  for (int64_t k : {2, 5, 17, 40, 80}) {
    NumericCheckOptions o;
    o.fd_samples = 0;
    o.policies = {"none", "full"};
    o.test_drop_save = k;
    const NumericCheckReport r = run_numeric_check(load(file), o);
    INFO(file << ": dropped save #" << k);
    CHECK_FALSE(r.passed());
    REQUIRE_FALSE(r.failures.empty());
    CHECK(r.failures[0].find("after the schedule freed it") != std::string::npos);
  }
}

// tests/data/numeric/*_torch.json (tools/fixtures/numeric_hf_tiny.py) against the numeric
// run of the scenario's first step.
void check_fixture(const char* file, const char* json, size_t params, const Sets& sets = {}) {
  CHECK(memsim_test::check_numeric_against_torch(load(file, sets), json) == params);
}

const std::vector<Sets> kOptimizers = {
    {{"optimizer.type", "adamw"}, {"optimizer.impl", "fused"}},
    {{"optimizer.type", "adamw"}, {"optimizer.impl", "for-loop"}},
    {{"optimizer.type", "adam"}, {"optimizer.impl", "foreach"}},
    {{"optimizer.type", "sgd"}, {"optimizer.impl", "foreach"}, {"optimizer.momentum", "0.9"}},
    {{"optimizer.type", "sgd"}, {"optimizer.impl", "for-loop"}},
};

}  // namespace

TEST_CASE("numeric hf-llama-tiny (GQA): FD gradients, every policy bit-identical, optimizer",
          "[numeric][hf-llama]") {
  check_full("hf-llama-tiny.yaml", {}, 2 * 9 + 3);
}

TEST_CASE("numeric hf-llama: MQA (expand view), MHA with tied head, each optimizer variant",
          "[numeric][hf-llama]") {
  check_variants("hf-llama-tiny.yaml",
                 {{{"model.kv_heads", "1"}},
                  {{"model.kv_heads", "4"}, {"model.tied_embeddings", "true"}},
                  {{"batch.grad_accum", "2"}}});
  check_variants("hf-llama-tiny.yaml", kOptimizers);
}

TEST_CASE("numeric hf-llama catches a saved tensor freed early", "[numeric][hf-llama]") {
  check_sabotage("hf-llama-tiny.yaml");
}

TEST_CASE("numeric hf-llama-tiny matches torch 1.13 (float64, same weights)",
          "[numeric][hf-llama][fixture]") {
  check_fixture("hf-llama-tiny.yaml", "hf_llama_tiny_torch.json", 2 * 9 + 3);
  // The SDPA kernels compute the same attention (torch 1.13 has no SDPA to measure).
  check_fixture("hf-llama-tiny.yaml", "hf_llama_tiny_torch.json", 2 * 9 + 3,
                {{"model.attention", "flash"}});
  check_fixture("hf-llama-tiny.yaml", "hf_llama_tiny_torch.json", 2 * 9 + 3,
                {{"model.attention", "mem-efficient"}});
}

TEST_CASE("numeric hf-llama with SDPA (flash, mem-efficient): FD, every policy, sabotage",
          "[numeric][hf-llama][sdpa]") {
  check_full("hf-llama-tiny.yaml", {{"model.attention", "flash"}}, 2 * 9 + 3);
  check_full("hf-llama-tiny.yaml", {{"model.attention", "mem-efficient"}}, 2 * 9 + 3);
  check_variants("hf-llama-tiny.yaml", {{{"model.attention", "flash"}, {"model.kv_heads", "1"}}});
  for (int64_t k : {20, 30}) {  // #20: the flash node's saved output
    NumericCheckOptions o;
    o.fd_samples = 0;
    o.policies = {"none"};
    o.test_drop_save = k;
    const NumericCheckReport r =
        run_numeric_check(load("hf-llama-tiny.yaml", {{"model.attention", "flash"}}), o);
    INFO("dropped save #" << k);
    CHECK_FALSE(r.passed());
    REQUIRE_FALSE(r.failures.empty());
    CHECK(r.failures[0].find("after the schedule freed it") != std::string::npos);
  }
}

TEST_CASE("numeric hf-gpt2-tiny (tied): FD gradients, every policy bit-identical, optimizer",
          "[numeric][hf-gpt2]") {
  check_full("hf-gpt2-tiny.yaml", {}, 2 + 2 * 12 + 2);
}

TEST_CASE("numeric hf-gpt2: untied head, grad accumulation, each optimizer variant",
          "[numeric][hf-gpt2]") {
  check_variants("hf-gpt2-tiny.yaml",
                 {{{"model.tied_embeddings", "false"}}, {{"batch.grad_accum", "2"}}});
  check_variants("hf-gpt2-tiny.yaml", kOptimizers);
}

TEST_CASE("numeric hf-gpt2 catches a saved tensor freed early", "[numeric][hf-gpt2]") {
  check_sabotage("hf-gpt2-tiny.yaml");
}

TEST_CASE("numeric hf-gpt2-tiny matches torch 1.13 (float64, same weights)",
          "[numeric][hf-gpt2][fixture]") {
  check_fixture("hf-gpt2-tiny.yaml", "hf_gpt2_tiny_torch.json", 2 + 2 * 12 + 2);
}

TEST_CASE("numeric megatron-tiny: FD gradients, every policy bit-identical, optimizer",
          "[numeric][megatron]") {
  // The loss is a sum over the 16 tokens (about 16 log 32 = 55 untrained).
  check_full("megatron-tiny.yaml", {}, 2 + 2 * 12 + 2, 30.0, 120.0);
}

TEST_CASE("numeric megatron: grad accumulation into main_grad, each optimizer variant",
          "[numeric][megatron]") {
  check_variants("megatron-tiny.yaml",
                 {{{"batch.grad_accum", "2"}},
                  {{"optimizer.type", "adam"}},
                  {{"optimizer.type", "sgd"}, {"optimizer.momentum", "0.9"}},
                  {{"optimizer.type", "sgd"}}});
}

TEST_CASE("numeric megatron catches a saved tensor freed early", "[numeric][megatron]") {
  check_sabotage("megatron-tiny.yaml");
}

TEST_CASE("numeric megatron-tiny matches torch 1.13 (float64, same weights)",
          "[numeric][megatron][fixture]") {
  check_fixture("megatron-tiny.yaml", "megatron_tiny_torch.json", 2 + 2 * 12 + 2);
  // TE fused attention computes the same attention on the packed QKV.
  check_fixture("megatron-tiny.yaml", "megatron_tiny_torch.json", 2 + 2 * 12 + 2,
                {{"model.attention", "flash"}});
}

TEST_CASE("numeric megatron with TE fused attention: FD, every policy, its saves",
          "[numeric][megatron][sdpa]") {
  check_full("megatron-tiny.yaml", {{"model.attention", "flash"}}, 2 + 2 * 12 + 2, 30.0, 120.0);
  for (int64_t k : {9, 10}) {  // the fused attention node's saved output and log-sum-exp
    NumericCheckOptions o;
    o.fd_samples = 0;
    o.policies = {"none"};
    o.test_drop_save = k;
    const NumericCheckReport r =
        run_numeric_check(load("megatron-tiny.yaml", {{"model.attention", "flash"}}), o);
    INFO("dropped save #" << k);
    REQUIRE_FALSE(r.passed());
    CHECK(r.failures[0].find("FusedAttnFuncBackward reads") != std::string::npos);
  }
}

TEST_CASE("numeric dropout: deterministic masks that checkpoint re-runs reproduce",
          "[numeric][dropout]") {
  // GPT-2: embedding, attention-probability and residual dropouts; every policy.
  check_full("hf-gpt2-tiny.yaml", {{"model.dropout", "0.1"}}, 2 + 2 * 12 + 2);
  check_variants("hf-llama-tiny.yaml", {{{"model.dropout", "0.1"}}});
  check_variants("megatron-tiny.yaml", {{{"model.dropout", "0.1"}}});
  // The masks are used: the loss differs from the run without dropout.
  NumericCheckOptions o;
  o.fd_samples = 0;
  o.policies = {"none"};
  const double plain = run_numeric_check(load("hf-gpt2-tiny.yaml"), o).loss;
  const double dropped = run_numeric_check(load("hf-gpt2-tiny.yaml", {{"model.dropout", "0.1"}}), o).loss;
  CHECK(std::abs(plain - dropped) > 1e-3);
  // A freed mask is caught like any saved tensor (saves #2, 15, 20, 34 are masks).
  o.policies = {"none"};
  for (int64_t k : {2, 15, 20, 34}) {
    o.test_drop_save = k;
    const NumericCheckReport r = run_numeric_check(load("hf-gpt2-tiny.yaml", {{"model.dropout", "0.1"}}), o);
    INFO("dropped save #" << k);
    REQUIRE_FALSE(r.passed());
    CHECK(r.failures[0].find("NativeDropoutBackward0 reads mask") != std::string::npos);
  }
}

TEST_CASE("numeric mode refuses what the HF kernels do not cover, by key", "[numeric]") {
  CHECK_THROWS_WITH(run_numeric_check(load("megatron-tiny.yaml", {{"parallel.tensor", "2"}}), {}),
                    Catch::Contains("parallel"));
  CHECK_THROWS_WITH(run_numeric_check(load("megatron-tiny.yaml", {{"model.attention", "flash"},
                                                                  {"model.dropout", "0.1"}}),
                                      {}),
                    Catch::Contains("model.dropout"));
  CHECK_THROWS_WITH(run_numeric_check(load("hf-llama-tiny.yaml", {{"model.dropout", "0.1"},
                                                                   {"model.attention", "flash"}}),
                                      {}),
                    Catch::Contains("model.dropout"));
  CHECK_THROWS_WITH(
      run_numeric_check(load("hf-gpt2-tiny.yaml", {{"model.attention", "flash"}}), {}),
      Catch::Contains("model.attention"));
  CHECK_THROWS_WITH(run_numeric_check(load("hf-llama-tiny.yaml", {{"lora.rank", "4"},
                                                                   {"lora.targets", "q_proj"}}),
                                      {}),
                    Catch::Contains("lora.rank"));
  // Adafactor has kernels for the hf families, 8-bit Adam(W) also for cs336.
  Scenario cs336_adafactor = load("cs336-tiny.yaml");
  cs336_adafactor.optimizer.type = OptimizerType::adafactor;
  CHECK_THROWS_WITH(run_numeric_check(cs336_adafactor, {}), Catch::Contains("optimizer.type"));
  Scenario megatron_8bit = load("megatron-tiny.yaml");
  megatron_8bit.optimizer.type = OptimizerType::adamw8bit;
  CHECK_THROWS_WITH(run_numeric_check(megatron_8bit, {}), Catch::Contains("optimizer.type"));
}

TEST_CASE("memsim check on the HF and megatron tiny scenarios: exit 0, 4 with a schedule bug",
          "[numeric][cli]") {
  using namespace memsim_test;
  for (const char* file : {"hf-llama-tiny.yaml", "hf-gpt2-tiny.yaml", "megatron-tiny.yaml"}) {
    const std::string base =
        memsim_command() + " check " + numeric_scenario_path(file) + " --fd-samples 0";
    const auto ok = run_shell(base + " --policies none,selective 2>&1");
    INFO(ok.out);
    CHECK(ok.status == 0);
    CHECK(ok.out.find("all numeric checks passed") != std::string::npos);
    const auto bad = run_shell(base + " --policies none --test-drop-save 5 2>&1");
    CHECK(bad.status == 4);
    CHECK(bad.out.find("check failed") != std::string::npos);
  }
}
