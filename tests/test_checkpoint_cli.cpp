// memsim compare / memsim optimize through the built binary (MEMSIM_BINARY_DIR/memsim).
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Ran = memsim_test::CommandResult;

// `memsim ARGS` with stderr discarded; stdout captured.
Ran memsim(const std::string& args) {
  return memsim_test::run_shell(memsim_test::memsim_command() + args + " 2>/dev/null");
}

// Four layers, sequence 128: the activations decide whether it fits in 64 MiB.
fs::path scenario_file() {
  const fs::path p =
      fs::temp_directory_path() / ("memsim_ckpt_cli_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(p) << "name: checkpoint cli test\n"
                      "model:\n  family: cs336\n  layers: 4\n  d_model: 64\n  heads: 4\n"
                      "  d_ff: 172\n  vocab: 96\n"
                      "batch:\n  micro_batch: 4\n  seq_len: 128\n"
                      "step:\n  warmup_steps: 1\n"
                      "device:\n  capacity: 64MiB\n  cuda_context: 0\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return p;
}

}  // namespace

TEST_CASE("memsim compare: one summary per policy", "[checkpoint]") {
  const fs::path s = scenario_file();
  const Ran r = memsim("compare '" + s.string() + "' --policies none,full,uniform:2,modules:attention,mlp,selective --json -");
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  REQUIRE(j["policies"].size() == 5);
  CHECK(j["policies"][3]["policy"] == "modules:attention,mlp");
  for (const json& p : j["policies"]) {
    for (const char* key : {"fits", "peak_allocated_bytes", "peak_reserved_bytes", "peak_event",
                            "breakdown_at_peak", "marks", "oom", "flops", "recompute_share"})
      CHECK(p.contains(key));
  }
  CHECK(j["policies"][0]["flops"]["recompute"] == 0);
  CHECK(j["policies"][1]["peak_allocated_bytes"] < j["policies"][0]["peak_allocated_bytes"]);
  CHECK(j["policies"][1]["recompute_share"].get<double>() > 0.1);

  const Ran table = memsim("compare '" + s.string() + "' --policies none,full");
  CHECK(table.out.find("peak reserved") != std::string::npos);
  CHECK(table.out.find("full") != std::string::npos);
  CHECK(memsim("compare '" + s.string() + "' --policies none,bogus").status == 2);
  fs::remove(s);
}

TEST_CASE("memsim optimize: a plan within the budget, or the smallest peak", "[optimize]") {
  const fs::path s = scenario_file();
  const Ran none = memsim("run '" + s.string() + "' --json -");
  const json n = json::parse(none.out);
  const uint64_t peak = n["peak_reserved_bytes"];
  const Ran ok = memsim("optimize '" + s.string() + "' --budget " + std::to_string(peak * 9 / 10) + " --json -");
  REQUIRE(ok.status == 0);
  const json j = json::parse(ok.out);
  CHECK(j["found"] == true);
  CHECK(j["peak_reserved_bytes"].get<uint64_t>() <= peak * 9 / 10);
  CHECK(j["plan"]["layers"].size() == 4);
  CHECK(j["flops"]["recompute"].get<double>() > 0);

  const Ran none_fits = memsim("optimize '" + s.string() + "' --budget 1MiB");
  CHECK(none_fits.status == 3);
  CHECK(none_fits.out.find("nothing fits") != std::string::npos);
  CHECK(memsim("optimize '" + s.string() + "' --budget lots").status == 2);
  fs::remove(s);
}
