// Numeric mode (graph/numeric/numeric.h, sim/check/numeric_check.h): the cs336 schedule executed with
// real numbers proves its gradients (finite differences), its checkpointing policies
// (bit-identical), its optimizer steps (textbook reference) and catches a premature free.
#include <catch2/catch.hpp>

#include <filesystem>

#include "numeric_test_support.h"
#include "sim/check/numeric_check.h"

using namespace memsim;

namespace {
Scenario tiny(const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  const auto path = std::filesystem::path(MEMSIM_SOURCE_DIR) / "scenarios/numeric/cs336-tiny.yaml";
  return load_scenario(path.string(), sets);
}
}  // namespace

TEST_CASE("numeric cs336-tiny: FD gradients, every policy bit-identical, optimizer", "[numeric]") {
  NumericCheckOptions o;
  o.fd_samples = 2;
  const NumericCheckReport r = run_numeric_check(tiny(), o);
  INFO(r.failures.size() << " failures; first: " << (r.failures.empty() ? "" : r.failures[0]));
  CHECK(r.passed());
  CHECK(r.fd_points >= 21 * 3);
  CHECK(r.fd_max_rel_error < 1e-6);
  CHECK(r.optimizer_steps == 3);
  CHECK(r.optimizer_max_rel_error < 1e-10);
  REQUIRE(r.policies.size() == 10);  // none, full, uniform, block, modules, selective,
                                     // sqrt, custom, full reentrant, full w/o early stop
  for (const PolicyCheck& p : r.policies) {
    INFO(p.policy << " " << p.error);
    CHECK(p.identical);
  }
  CHECK(std::isfinite(r.loss));
  CHECK(r.loss > 2.0);  // about log(32) = 3.47 for an untrained model
  CHECK(r.loss < 5.0);
}

TEST_CASE("numeric cs336-tiny: each optimizer variant matches its reference", "[numeric]") {
  const std::vector<std::vector<std::pair<std::string, std::string>>> variants = {
      {{"optimizer.type", "adamw"}, {"optimizer.impl", "foreach"}},
      {{"optimizer.type", "adamw"}, {"optimizer.impl", "fused"}},
      {{"optimizer.type", "adam"}, {"optimizer.impl", "for-loop"}},
      {{"optimizer.type", "sgd"}, {"optimizer.impl", "foreach"}, {"optimizer.momentum", "0.9"}},
      {{"optimizer.type", "sgd"}, {"optimizer.impl", "foreach"}},
  };
  for (const auto& v : variants) {
    NumericCheckOptions o;
    o.fd_samples = 0;
    o.policies = {"none", "full"};
    const NumericCheckReport r = run_numeric_check(tiny(v), o);
    INFO(r.optimizer << ": " << (r.failures.empty() ? "" : r.failures[0]));
    CHECK(r.passed());
    CHECK(r.optimizer_steps == 3);
  }
}

TEST_CASE("numeric mode catches a saved tensor freed early", "[numeric]") {
  // Fault injection: one save in the forward takes no reference, so the schedule frees
  // the tensor before backward reads it. The poisoned buffer must fail the check.
  // (#0, #1 are the token ids and the embedding output, which stay bound anyway.)
  for (int64_t k : {2, 5, 40}) {
    NumericCheckOptions o;
    o.fd_samples = 0;
    o.policies = {"none", "full"};
    o.test_drop_save = k;
    const NumericCheckReport r = run_numeric_check(tiny(), o);
    INFO("dropped save #" << k);
    CHECK_FALSE(r.passed());
    REQUIRE_FALSE(r.failures.empty());
    CHECK(r.failures[0].find("after the schedule freed it") != std::string::npos);
  }
}

TEST_CASE("numeric mode refuses what it has no kernels for and large configurations", "[numeric]") {
  CHECK_THROWS_WITH(run_numeric_check(tiny({{"model.family", "hf-gpt2"},
                                            {"model.attention", "flash"}}),
                                      {}),
                    Catch::Contains("model.attention"));
  CHECK_THROWS_WITH(run_numeric_check(tiny({{"parallel.data", "2"}}), {}),
                    Catch::Contains("single process"));
  CHECK_THROWS_WITH(run_numeric_check(tiny({{"model.d_model", "1024"}, {"model.heads", "8"}}), {}),
                    Catch::Contains("tiny configurations"));
  CHECK_THROWS_WITH(run_numeric_check(tiny({{"precision.params", "bf16"}}), {}),
                    Catch::Contains("fp32"));
}

#include "tests/cli_test_support.h"

using namespace memsim_test;

TEST_CASE("memsim check: exit 0 on pass, 4 on a failed check, 1 when refused", "[numeric][cli]") {
  const std::string tiny_path =
      (std::filesystem::path(MEMSIM_SOURCE_DIR) / "scenarios/numeric/cs336-tiny.yaml").string();
  const std::string base = memsim_command() + " check " + tiny_path + " --fd-samples 0";
  const auto ok = run_shell(base + " --policies none,full 2>&1");
  CHECK(ok.status == 0);
  CHECK(ok.out.find("all numeric checks passed") != std::string::npos);
  CHECK(ok.out.find("bit-identical") != std::string::npos);
  const auto bad = run_shell(base + " --policies none --test-drop-save 5 2>&1");
  CHECK(bad.status == 4);
  CHECK(bad.out.find("check failed") != std::string::npos);
  const auto refused = run_shell(base + " --set precision.params=bf16 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("numeric mode needs fp32") != std::string::npos);
}

#include <fstream>

#include <nlohmann/json.hpp>

#include "graph/numeric/numeric.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

TEST_CASE("numeric cs336-tiny matches torch 1.13 (float64, same weights)", "[numeric][fixture]") {
  // tests/data/numeric/cs336_tiny_torch.json: tools/fixtures/numeric_cs336_tiny.py
  CHECK(memsim_test::check_numeric_against_torch(tiny(), "cs336_tiny_torch.json") == 21);
}
