// Numeric mode's Adafactor and bitsandbytes 8-bit Adam / AdamW kernels
// (sim/optim/numeric_adafactor.h, sim/optim/numeric_adam8bit.h): each runs on the state buffers the
// schedule allocates and matches an independent reference on the hf-llama and hf-gpt2
// (8-bit: also cs336) tiny scenarios; a freed state buffer or a wrong step count fails the check; the
// quantisation maps equal torch's bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "sim/optim/numeric_adafactor.h"
#include "sim/optim/numeric_adam8bit.h"
#include "sim/check/numeric_check.h"
#include "sim/step/schedule.h"
#include "numeric_test_support.h"
#include "tests/cli_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using memsim_test::Sets;
using memsim_test::numeric_scenario_path;

Scenario load(const char* file, const Sets& sets = {}) {
  return memsim_test::load_numeric_scenario(file, sets);
}

NumericCheckReport check(const char* file, const Sets& sets, NumericCheckOptions o = {}) {
  if (o.policies.empty()) o.policies = {"none", "full", "selective"};
  o.fd_samples = 1;
  return run_numeric_check(load(file, sets), o);
}

std::string first_failure(const NumericCheckReport& r) {
  return r.failures.empty() ? "" : r.failures.front();
}

}  // namespace

TEST_CASE("Adafactor in numeric mode: hf-llama and hf-gpt2 match the reference",
          "[numeric][optimizer][adafactor]") {
  for (const char* file : {"hf-llama-tiny.yaml", "hf-gpt2-tiny.yaml"}) {
    for (const Sets& extra : {Sets{}, Sets{{"batch.grad_accum", "2"}}}) {
      Sets sets = {{"optimizer.type", "adafactor"}};
      sets.insert(sets.end(), extra.begin(), extra.end());
      const NumericCheckReport r = check(file, sets);
      INFO(file << " " << extra.size() << ": " << first_failure(r));
      CHECK(r.passed());
      CHECK(r.optimizer_steps == 3);
      CHECK(r.optimizer.find("Adafactor") != std::string::npos);
      CHECK(r.optimizer_max_rel_error < 1e-12);
      CHECK(r.optimizer_8bit_params == 0);
    }
  }
}

TEST_CASE("8-bit Adam / AdamW in numeric mode: block-wise state matches the reference",
          "[numeric][optimizer][adam8bit]") {
  struct Case {
    const char* file;
    Sets sets;
    int quantised;  // parameters of >= 4096 elements
  };
  const std::vector<Case> cases = {
      {"hf-llama-tiny-adamw8bit.yaml", {}, 2},                    // 4160: a partial block
      {"cs336-tiny-adamw8bit.yaml", {}, 2},                       // 4096: 16 full blocks
      {"hf-llama-tiny.yaml", {{"optimizer.type", "adamw8bit"}}, 0},  // fp32 state only
      {"hf-gpt2-tiny.yaml", {{"optimizer.type", "adamw8bit"}, {"model.vocab", "256"}}, 1},
      {"hf-gpt2-tiny.yaml",
       {{"optimizer.type", "adamw8bit"}, {"model.vocab", "300"}, {"model.tied_embeddings", "false"}},
       2},
  };
  for (const Case& c : cases) {
    for (const char* type : {"adamw8bit", "adam8bit"}) {
      Sets sets = c.sets;
      sets.push_back({"optimizer.type", type});
      const NumericCheckReport r = check(c.file, sets);
      INFO(c.file << " " << type << ": " << first_failure(r));
      CHECK(r.passed());
      CHECK(r.optimizer_steps == 3);
      CHECK(r.optimizer_max_rel_error < 1e-12);
      CHECK(r.optimizer_8bit_params == c.quantised);
      CHECK((r.quantisations > 20000) == (c.quantised > 0));
      if (c.quantised > 0) CHECK(r.quantisation_margin > 0);
    }
  }
}

TEST_CASE("Adafactor / 8-bit numeric kernels: a dropped state buffer or a wrong step fails",
          "[numeric][optimizer][sabotage]") {
  const std::vector<std::pair<const char*, Sets>> runs = {
      {"hf-llama-tiny.yaml", {{"optimizer.type", "adafactor"}}},
      {"hf-gpt2-tiny.yaml", {{"optimizer.type", "adafactor"}}},
      {"hf-llama-tiny-adamw8bit.yaml", {}},
      {"cs336-tiny-adamw8bit.yaml", {}},
      {"hf-gpt2-tiny.yaml", {{"optimizer.type", "adam8bit"}, {"model.vocab", "256"}}},
  };
  for (const auto& [file, sets] : runs) {
    // The k-th state tensor the schedule creates (Adafactor: row, col, RMS of the first
    // parameter, ...; 8-bit: the embedding's qmap1, qmap2, state1, state2, ...).
    for (int64_t k : {0, 2, 3, 5}) {
      NumericCheckOptions o;
      o.policies = {"none"};
      o.test_drop_optimizer_state = k;
      const NumericCheckReport r = check(file, sets, o);
      INFO(file << " drop state #" << k);
      CHECK_FALSE(r.passed());
      // A freed buffer read, or (8-bit: the optimizer re-creates a state it lost) a state
      // the kernel finds never written.
      const std::string f = first_failure(r);
      CHECK((f.find("freed") != std::string::npos || f.find("never computed") != std::string::npos));
    }
    NumericCheckOptions o;
    o.policies = {"none"};
    o.test_optimizer_step_offset = 1;
    const NumericCheckReport r = check(file, sets, o);
    INFO(file << " step + 1: " << first_failure(r));
    CHECK_FALSE(r.passed());
    CHECK(r.optimizer_max_rel_error > 1e-4);
    CHECK(first_failure(r).find("optimizer") != std::string::npos);
  }
}

TEST_CASE("bitsandbytes' dynamic maps equal torch's create_dynamic_map bit for bit",
          "[numeric][optimizer][adam8bit][fixture]") {
  std::ifstream in(std::filesystem::path(MEMSIM_SOURCE_DIR) / "tests/data/numeric/bnb_dynamic_map.json");
  REQUIRE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const bool is_signed : {true, false}) {
    const auto& want = j.at(is_signed ? "signed" : "unsigned");
    const std::array<float, 256> got = bnb_dynamic_map(is_signed);
    REQUIRE(want.size() == 256);
    int differ = 0;
    for (size_t i = 0; i < 256; ++i)
      if (static_cast<double>(got[i]) != want[i].get<double>()) ++differ;
    INFO((is_signed ? "signed" : "unsigned"));
    CHECK(differ == 0);
  }
  const std::array<float, 256> s = bnb_dynamic_map(true), u = bnb_dynamic_map(false);
  CHECK(s[127] == 0.0f);  // 127 negative codes, 0, 127 positive codes and 1
  CHECK(s[255] == 1.0f);
  CHECK(u[0] == 0.0f);
  CHECK(u[255] == 1.0f);
}

TEST_CASE("Adafactor reference equals transformers' step run by torch",
          "[numeric][optimizer][adafactor][fixture]") {
  std::ifstream in(std::filesystem::path(MEMSIM_SOURCE_DIR) / "tests/data/numeric/adafactor_torch.json");
  REQUIRE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::vector<int64_t>> shapes;
  std::vector<Eigen::ArrayXd> p, before;
  for (const auto& e : j.at("params")) {
    shapes.push_back(e.at("shape").get<std::vector<int64_t>>());
    const auto init = e.at("init").get<std::vector<double>>();
    p.push_back(Eigen::Map<const Eigen::ArrayXd>(init.data(), static_cast<Eigen::Index>(init.size())));
  }
  AdafactorReference ref;
  double worst = 0;
  for (int t = 0; t < 3; ++t) {
    std::vector<Eigen::ArrayXd> g(p.size());
    std::vector<Eigen::ArrayXd*> pp;
    std::vector<const Eigen::ArrayXd*> gp;
    before = p;
    for (size_t k = 0; k < p.size(); ++k) {
      const auto gv = j["params"][k]["grads"][t].get<std::vector<double>>();
      g[k] = Eigen::Map<const Eigen::ArrayXd>(gv.data(), static_cast<Eigen::Index>(gv.size()));
      pp.push_back(&p[k]);
      gp.push_back(&g[k]);
    }
    ref.step(shapes, pp, gp);
    for (size_t k = 0; k < p.size(); ++k) {
      const auto want = j["params"][k]["after"][t].get<std::vector<double>>();
      const Eigen::Map<const Eigen::ArrayXd> w(want.data(), static_cast<Eigen::Index>(want.size()));
      const double scale = (w - before[k]).abs().maxCoeff();
      REQUIRE(scale > 0);
      worst = std::max(worst, (p[k] - w).abs().maxCoeff() / scale);
    }
  }
  INFO("worst normwise relative difference of an update " << worst);
  CHECK(p[0][0] == Approx(j["params"][0]["after"][2][0].get<double>()).epsilon(1e-12));
  CHECK(p[0][0] != Approx(j["params"][0]["init"][0].get<double>()).epsilon(1e-3));  // it moved
  CHECK(worst < 1e-12);
}

TEST_CASE("bitsandbytes' quantize_2D picks the nearest code", "[numeric][optimizer][adam8bit]") {
  for (const bool is_signed : {true, false}) {
    const std::array<float, 256> m = bnb_dynamic_map(is_signed);
    Eigen::ArrayXd code(256);
    for (int i = 0; i < 256; ++i) code[i] = m[static_cast<size_t>(i)];
    int wrong = 0;
    for (int k = 0; k <= 20000; ++k) {
      // Log-spaced magnitudes down to 1e-9 and both signs.
      const double mag = std::pow(10.0, -9.0 * (k % 1000) / 1000.0) * (1.0 - (k / 1000) * 0.01);
      const double x = is_signed && k % 2 ? -mag : mag;
      const int q = bnb_quantize_2d(code, is_signed, x);
      int best = 0;
      for (int i = 1; i < 256; ++i)
        if (std::abs(code[i] - x) < std::abs(code[best] - x)) best = i;
      if (std::abs(code[q] - x) != std::abs(code[best] - x)) ++wrong;
    }
    INFO((is_signed ? "signed" : "unsigned"));
    CHECK(wrong == 0);
  }
}

TEST_CASE("memsim check runs Adafactor and 8-bit AdamW, a dropped state exits 4",
          "[numeric][optimizer][cli]") {
  using namespace memsim_test;
  const std::string a = memsim_command() + " check " +
                        numeric_scenario_path("hf-gpt2-tiny.yaml") +
                        " --set optimizer.type=adafactor --fd-samples 0 --policies none";
  const auto ok = run_shell(a + " 2>&1");
  INFO(ok.out);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("Adafactor") != std::string::npos);
  const std::string b = memsim_command() + " check " +
                        numeric_scenario_path("hf-llama-tiny-adamw8bit.yaml") +
                        " --fd-samples 0 --policies none";
  const auto ok8 = run_shell(b + " 2>&1");
  INFO(ok8.out);
  CHECK(ok8.status == 0);
  CHECK(ok8.out.find("2 parameters with 8-bit block-wise state") != std::string::npos);
  const auto bad = run_shell(b + " --test-drop-optimizer-state 3 2>&1");
  CHECK(bad.status == 4);
  CHECK(bad.out.find("check failed") != std::string::npos);
}
