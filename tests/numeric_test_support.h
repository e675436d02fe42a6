// Shared by the numeric-mode tests: loading the tiny scenarios of scenarios/numeric/ and
// comparing a numeric run's first step with a float64 torch 1.13 fixture of
// tests/data/numeric/ (written by tools/fixtures/numeric_*.py with the same weights).
#pragma once

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "graph/numeric/numeric.h"
#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/check/numeric_check.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

namespace memsim_test {

using Sets = std::vector<std::pair<std::string, std::string>>;

inline std::string numeric_scenario_path(const char* file) {
  return (std::filesystem::path(MEMSIM_SOURCE_DIR) / "scenarios/numeric" / file).string();
}
inline memsim::Scenario load_numeric_scenario(const char* file, const Sets& sets = {}) {
  return memsim::load_scenario(numeric_scenario_path(file), sets);
}

// Runs `s`'s first step numerically (no warm-up) and checks the loss (1e-12) and every
// parameter's gradient norm (1e-9) and leading entries (1e-8) against the fixture
// `json`. Returns how many parameters the fixture lists.
inline size_t check_numeric_against_torch(memsim::Scenario s, const char* json) {
  const nlohmann::json fx =
      load_json(std::filesystem::path(MEMSIM_SOURCE_DIR) / "tests/data/numeric" / json);
  s.step.warmup_steps = 0;
  memsim::graph::NumericContext ctx(memsim::numeric_model(s));
  memsim::build_program(s, memsim::default_script(s), &ctx);
  REQUIRE(ctx.violations().empty());
  CHECK(ctx.first_loss() == Approx(fx["loss"].get<double>()).epsilon(1e-12));
  size_t compared = 0;
  for (const auto& [name, g] : fx["grads"].items()) {
    const size_t i = g["index"].get<size_t>();
    REQUIRE(ctx.param_names().at(i) == name);
    const Eigen::ArrayXd& ours = ctx.first_grads().at(i);
    INFO(name);
    CHECK(std::sqrt(ours.square().sum()) == Approx(g["norm"].get<double>()).epsilon(1e-9));
    const auto first = g["first"].get<std::vector<double>>();
    for (size_t j = 0; j < first.size(); ++j)
      CHECK(ours[static_cast<Eigen::Index>(j)] == Approx(first[j]).epsilon(1e-8).margin(1e-13));
    ++compared;
  }
  CHECK(ctx.param_names().size() == compared);
  return compared;
}

}  // namespace memsim_test
