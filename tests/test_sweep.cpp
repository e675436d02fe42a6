// Sweeps (sim/search/sweep.h) and `memsim sweep`: axis parsing, the cartesian product, parallel
// results equal to sequential ones, impossible points as error rows, and the --max search
// (largest fitting value, found in O(log v) evaluations).
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/search/sweep.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace memsim;

namespace {

std::string tiny(const std::string& capacity = "1GiB") {
  return "name: tiny sweep test\n"
         "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n"
         "  vocab: 512\n"
         "batch:\n  micro_batch: 2\n  seq_len: 32\n"
         "step:\n  warmup_steps: 1\n"
         "device:\n  capacity: " + capacity + "\n  cuda_context: 0\n";
}

struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& text) {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("memsim_sweep_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".yaml");
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

using Result = memsim_test::CommandResult;

Result memsim_cli(const std::string& args) {
  return memsim_test::run_shell(memsim_test::memsim_command() + args + " 2>/dev/null");
}

}  // namespace

TEST_CASE("sweep axes: lists and integer ranges", "[sweep]") {
  const SweepAxis a = parse_sweep_axis("batch.micro_batch=1,4..6,16");
  CHECK(a.key == "batch.micro_batch");
  CHECK(a.values == std::vector<std::string>{"1", "4", "5", "6", "16"});
  CHECK(parse_sweep_axis("model.attention=eager,flash").values.size() == 2);
  CHECK_THROWS_AS(parse_sweep_axis("no_equals"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("=1,2"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=1,,2"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=5..2"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=a..b"), std::invalid_argument);
}

TEST_CASE("sweep points: cartesian product, first axis slowest", "[sweep]") {
  const auto points = sweep_points({{"a", {"1", "2"}}, {"b", {"x", "y", "z"}}});
  REQUIRE(points.size() == 6);
  CHECK(points[0] == SweepOverrides{{"a", "1"}, {"b", "x"}});
  CHECK(points[5] == SweepOverrides{{"a", "2"}, {"b", "z"}});
  CHECK(sweep_points({}).size() == 1);
}

TEST_CASE("sweep runner: parallel equals sequential, and impossible points are errors", "[sweep]") {
  const SweepRunner runner(tiny(), "tiny.yaml");
  const auto points =
      sweep_points({{"batch.micro_batch", {"1", "2", "3"}}, {"model.heads", {"4", "3"}}});
  std::vector<SweepResult> parallel(points.size());
  size_t calls = 0, last_done = 0;
  run_parallel(
      points.size(), [&](size_t i) { parallel[i] = runner.evaluate(points[i]); }, 2,
      [&](size_t done, size_t total) {
        ++calls;
        CHECK(total == points.size());
        CHECK(done == last_done + 1);
        last_done = done;
      });
  CHECK(calls == points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    const SweepResult seq = runner.evaluate(points[i]);
    const bool heads3 = points[i][1].second == "3";  // 3 does not divide d_model 64
    INFO(i);
    CHECK(parallel[i].ok == !heads3);
    CHECK(seq.ok == parallel[i].ok);
    if (heads3) {
      CHECK(parallel[i].error.find("heads") != std::string::npos);
      CHECK(sweep_verdict(parallel[i]).rfind("error: ", 0) == 0);
    } else {
      CHECK(parallel[i].analysis.peak_allocated == seq.analysis.peak_allocated);
      CHECK(parallel[i].analysis.peak_reserved == seq.analysis.peak_reserved);
      CHECK(parallel[i].fits());
    }
  }
  // More batch, more memory.
  CHECK(parallel[0].analysis.peak_allocated < parallel[4].analysis.peak_allocated);
}

TEST_CASE("find_max: the largest fitting value, in logarithmically many runs", "[sweep]") {
  // Capacity a little above the micro_batch 2 run's reserved peak.
  const SweepRunner probe(tiny(), "tiny.yaml");
  const SweepResult at8 = probe.evaluate({{"batch.micro_batch", "8"}});
  REQUIRE(at8.ok);
  const std::string capacity = std::to_string(at8.analysis.peak_reserved + (2 << 20));
  const SweepRunner runner(tiny(capacity), "tiny.yaml");

  const MaxSearch m = find_max(runner, {}, "batch.micro_batch");
  REQUIRE(m.largest_fit);
  REQUIRE(m.first_failure);
  CHECK(*m.largest_fit >= 8);
  CHECK(*m.first_failure == *m.largest_fit + 1);
  CHECK(runner.evaluate({{"batch.micro_batch", std::to_string(*m.largest_fit)}}).fits());
  CHECK_FALSE(runner.evaluate({{"batch.micro_batch", std::to_string(*m.first_failure)}}).fits());
  CHECK(m.failure.rfind("OOM at", 0) == 0);
  CHECK(m.evaluations <= 2 * static_cast<size_t>(std::log2(*m.first_failure)) + 2);

  // Nothing fits: no largest value.
  const SweepRunner tight(tiny("1MiB"), "tiny.yaml");
  const MaxSearch none = find_max(tight, {}, "batch.micro_batch");
  CHECK_FALSE(none.largest_fit);
  REQUIRE(none.first_failure);
  CHECK(*none.first_failure == 1);
}

TEST_CASE("memsim sweep: table, JSON with error rows, --max", "[sweep]") {
  const TempFile scenario(tiny());
  const std::string file = "'" + scenario.path.string() + "'";

  const Result table = memsim_cli("sweep " + file +
                                  " --vary batch.micro_batch=1,2 --vary model.heads=4,3 -j 2");
  CHECK(table.status == 0);
  CHECK(table.out.find("batch.micro_batch") != std::string::npos);
  CHECK(table.out.find("peak allocated") != std::string::npos);
  CHECK(table.out.find("fits") != std::string::npos);
  CHECK(table.out.find("error:") != std::string::npos);

  const Result j = memsim_cli("sweep " + file +
                              " --vary batch.micro_batch=1,2 --vary model.heads=4,3 --json -");
  REQUIRE(j.status == 0);
  const json doc = json::parse(j.out);
  REQUIRE(doc["points"].size() == 4);
  size_t errors = 0;
  for (const json& p : doc["points"]) {
    if (!p["error"].is_null()) {
      ++errors;
      CHECK(p["values"]["model.heads"] == "3");
    } else {
      CHECK(p["peak_allocated_bytes"].is_number_unsigned());
      CHECK(p["fits"] == true);
    }
  }
  CHECK(errors == 2);

  const Result mx = memsim_cli("sweep " + file + " --max batch.micro_batch --vary batch.seq_len=16,32 "
                               "--set device.capacity=64MiB --json -");
  REQUIRE(mx.status == 0);
  const json m = json::parse(mx.out);
  REQUIRE(m["points"].size() == 2);
  // A longer sequence fits no more micro-batches.
  CHECK(m["points"][0]["largest_fit"].get<int64_t>() >= m["points"][1]["largest_fit"].get<int64_t>());

  CHECK(memsim_cli("sweep " + file).status == 2);  // nothing to vary
  CHECK(memsim_cli("sweep " + file + " --vary nokey").status == 2);
  CHECK(memsim_cli("sweep " + file + " --vary batch.micro_batch=1 --max batch.micro_batch").status == 2);
  CHECK(memsim_cli("sweep " + file + " --vary no.such_key=1").status == 3);  // error rows only: nothing fits
}

TEST_CASE("memsim sweep -v off a terminal logs progress per 10%", "[sweep]") {
  const TempFile scenario(tiny());
  // stderr into the captured pipe, stdout discarded.
  const auto ran = memsim_test::run_shell(
      memsim_test::memsim_command() + "sweep '" + scenario.path.string() +
      "' --vary batch.micro_batch=1..10 -v --csv /dev/null 2>&1 >/dev/null");
  REQUIRE(ran.status == 0);
  const std::string& err = ran.out;
  CHECK(err.find("sweep: 50% (5/10)") != std::string::npos);
  CHECK(err.find("sweep: 100% (10/10)") != std::string::npos);
  CHECK(err.find('\r') == std::string::npos);  // no redrawn bar when stderr is a pipe
}
