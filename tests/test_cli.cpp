// The memsim command line, end to end: runs the built binary (MEMSIM_BINARY_DIR/memsim)
// on a tiny scenario written to a temporary file and checks exit statuses, the JSON
// keys of shared/docs/design.md, the timeline CSV and the error messages.
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using memsim_test::slurp;
using Result = memsim_test::CliResult;

// A fresh temporary folder per test case, removed at the end.
struct TempDir : memsim_test::TempDir {
  TempDir() : memsim_test::TempDir("memsim_cli") {}
};

Result memsim(const std::string& args, const TempDir& dir) {
  return memsim_test::run_memsim(args, dir);
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// Two layers of d_model 64: simulates in milliseconds.
const char* kTiny =
    "name: tiny cli test\n"
    "model:\n"
    "  family: cs336\n"
    "  layers: 2\n"
    "  d_model: 64\n"
    "  heads: 4\n"
    "  d_ff: 256\n"
    "  vocab: 128\n"
    "batch:\n"
    "  micro_batch: 2\n"
    "  seq_len: 16\n"
    "step:\n"
    "  warmup_steps: 1\n"
    "device:\n"
    "  capacity: 1GiB\n"
    "  cuda_context: 0\n";

void check_summary_keys(const json& j) {
  for (const char* key : {"fits", "peak_allocated_bytes", "peak_reserved_bytes",
                          "peak_requested_bytes", "peak_event", "breakdown_at_peak", "marks",
                          "oom", "flops", "top_peaks", "top_tensors"}) {
    INFO(key);
    CHECK(j.contains(key));
  }
  CHECK(j["peak_allocated_bytes"].is_number_unsigned());
  CHECK(j["peak_reserved_bytes"].is_number_unsigned());
  CHECK(j["peak_requested_bytes"].is_number_unsigned());
  for (const char* key : {"parameters", "gradients", "optimizer_state", "activations",
                          "temporaries", "other"}) {
    INFO(key);
    CHECK(j["breakdown_at_peak"][key].is_number_unsigned());
  }
  for (const char* key : {"forward", "backward", "recompute"}) {
    INFO(key);
    CHECK(j["flops"][key].is_number());
  }
  for (const char* key : {"forward_end", "backward_end", "optimizer_end"}) {
    INFO(key);
    CHECK(j["marks"].contains(key));
  }
  if (!j["peak_event"].is_null()) {
    for (const char* key : {"index", "op", "phase", "layer"}) {
      INFO(key);
      CHECK(j["peak_event"].contains(key));
    }
  }
}

}  // namespace

TEST_CASE("memsim run: a scenario that fits exits 0 with the design's JSON", "[cli]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", kTiny);
  const fs::path out = dir.path / "out.json";
  const fs::path csv = dir.path / "timeline.csv";
  Result r = memsim("run " + quoted(scenario) + " --json " + quoted(out) + " --timeline " +
                        quoted(csv),
                    dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());  // quiet by default

  const json j = json::parse(slurp(out));
  check_summary_keys(j);
  CHECK(j["scenario"] == "tiny cli test");
  CHECK(j["fits"] == true);
  CHECK(j["oom"].is_null());
  CHECK(j["peak_allocated_bytes"].get<uint64_t>() > 0);
  CHECK(j["peak_reserved_bytes"].get<uint64_t>() >= j["peak_allocated_bytes"].get<uint64_t>());
  uint64_t sum = 0;
  for (const auto& [key, value] : j["breakdown_at_peak"].items()) sum += value.get<uint64_t>();
  CHECK(sum == j["peak_event"]["allocated_bytes"].get<uint64_t>());
  for (const char* key : {"forward_end", "backward_end", "optimizer_end"}) {
    INFO(key);
    REQUIRE(j["marks"][key].is_object());
    CHECK(j["marks"][key]["allocated"].is_number_unsigned());
    CHECK(j["marks"][key]["reserved"].is_number_unsigned());
  }
  CHECK(j["flops"]["forward"].get<double>() > 0);
  // One GPU: the rank object says so (distributed runs name the worst rank and why).
  REQUIRE(j["rank"].is_object());
  CHECK(j["rank"]["index"] == 0);
  CHECK(j["rank"]["world_size"] == 1);
  CHECK(j["rank"]["pipeline_stage"] == 0);
  CHECK_FALSE(j["top_peaks"].empty());
  CHECK(j["top_peaks"][0]["index"] == j["peak_event"]["index"]);
  REQUIRE_FALSE(j["top_tensors"].empty());
  for (const char* key : {"name", "kind", "bytes", "op", "layer"}) {
    INFO(key);
    CHECK(j["top_tensors"][0].contains(key));
  }

  // The timeline: a header and one row per event, every row with the same columns.
  std::istringstream lines(slurp(csv));
  std::string header, line;
  std::getline(lines, header);
  CHECK(header.rfind("index,type,op,phase,layer,kind,bytes,allocated,reserved,requested,", 0) == 0);
  const auto columns = std::count(header.begin(), header.end(), ',');
  size_t rows = 0;
  bool same_columns = true;
  while (std::getline(lines, line)) {
    ++rows;
    same_columns = same_columns && std::count(line.begin(), line.end(), ',') == columns;
  }
  CHECK(rows == j["events"].get<size_t>());
  CHECK(same_columns);

  // The terminal summary (stdout is a pipe: no colour).
  CHECK(r.out.find("tiny cli test") != std::string::npos);
  CHECK(r.out.find("FITS") != std::string::npos);
  CHECK(r.out.find("Breakdown at the peak") != std::string::npos);
  CHECK(r.out.find('\033') == std::string::npos);
}

TEST_CASE("memsim run --json - writes only JSON to stdout, logs to stderr", "[cli]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", kTiny);
  Result r = memsim("run " + quoted(scenario) + " --json - -v --set batch.micro_batch=1", dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);  // throws if the summary or logs leaked into stdout
  check_summary_keys(j);
  CHECK(r.err.find("info") != std::string::npos);  // -v logs, on stderr
}

TEST_CASE("memsim run: a scenario that cannot fit exits 3 with the OOM", "[cli]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", kTiny);
  const fs::path out = dir.path / "out.json";
  Result r = memsim("run " + quoted(scenario) + " --set device.capacity=4MiB --json " + quoted(out), dir);
  INFO(r.err);
  REQUIRE(r.status == 3);
  const json j = json::parse(slurp(out));
  check_summary_keys(j);
  CHECK(j["fits"] == false);
  REQUIRE(j["oom"].is_object());
  for (const char* key : {"op", "phase", "layer", "requested_bytes", "allocated_bytes",
                          "reserved_bytes", "capacity_bytes", "message"}) {
    INFO(key);
    CHECK(j["oom"].contains(key));
  }
  CHECK(j["oom"]["capacity_bytes"] == 4u << 20);
  CHECK(j["oom"]["message"].get<std::string>().rfind("CUDA out of memory.", 0) == 0);
  CHECK(r.out.find("OUT OF MEMORY") != std::string::npos);
}

TEST_CASE("memsim run: bad input exits 1 naming the file", "[cli]") {
  TempDir dir;
  SECTION("an unknown key") {
    const fs::path scenario = dir.write("broken.yaml", std::string(kTiny) + "bogus_section: 1\n");
    Result r = memsim("run " + quoted(scenario), dir);
    CHECK(r.status == 1);
    CHECK(r.err.rfind("memsim: error: ", 0) == 0);
    CHECK(r.err.find("broken.yaml") != std::string::npos);
    CHECK(r.out.empty());
  }
  SECTION("a missing file") {
    Result r = memsim("run " + quoted(dir.path / "missing.yaml"), dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("missing.yaml") != std::string::npos);
  }
  SECTION("a folder") {
    Result r = memsim("run " + quoted(dir.path), dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("is a directory") != std::string::npos);
  }
  SECTION("a bad --set value") {
    const fs::path scenario = dir.write("tiny.yaml", kTiny);
    Result r = memsim("run " + quoted(scenario) + " --set batch.micro_batch=-3", dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("batch.micro_batch") != std::string::npos);
  }
  SECTION("an unwritable report") {
    const fs::path scenario = dir.write("tiny.yaml", kTiny);
    Result r = memsim("run " + quoted(scenario) + " --json " + quoted(dir.path / "no" / "such.json"), dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("such.json") != std::string::npos);
  }
}

TEST_CASE("memsim: bad usage exits 2", "[cli]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", kTiny);
  CHECK(memsim("", dir).status == 2);
  CHECK(memsim("frobnicate", dir).status == 2);
  CHECK(memsim("run", dir).status == 2);
  CHECK(memsim("run " + quoted(scenario) + " --no-such-flag", dir).status == 2);
  CHECK(memsim("run " + quoted(scenario) + " --json", dir).status == 2);
  CHECK(memsim("run " + quoted(scenario) + " --json - --timeline -", dir).status == 2);
  Result r = memsim("run " + quoted(scenario) + " --set no_equals_sign", dir);
  CHECK(r.status == 2);
  CHECK(r.err.find("KEY=VALUE") != std::string::npos);
  CHECK(memsim("--help", dir).status == 0);
}

TEST_CASE("memsim presets lists model and device presets", "[cli]") {
  TempDir dir;
  Result r = memsim("presets", dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cs336-xl") != std::string::npos);
  CHECK(r.out.find("h100-80gb") != std::string::npos);
}

TEST_CASE("memsim replay reports the run keys plus the replay's fidelity", "[cli]") {
  TempDir dir;
  const std::string snapshot = std::string(MEMSIM_SOURCE_DIR) + "/tests/data/silmont2000_mem_snapshot.pickle";
  const fs::path out = dir.path / "replay.json";
  const fs::path csv = dir.path / "replay.csv";
  Result r = memsim("replay '" + snapshot + "' --json " + quoted(out) + " --timeline " + quoted(csv), dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(slurp(out));
  check_summary_keys(j);
  for (const char* key : {"events_replayed", "segment_allocs", "mismatches", "final_segments_match"}) {
    INFO(key);
    CHECK(j.contains(key));
  }
  CHECK(j["mismatches"]["count"] == 0);
  CHECK(j["mismatches"]["list"].is_array());
  CHECK(j["events_replayed"].get<size_t>() > 0);
  CHECK(j["peak_allocated_bytes"].get<uint64_t>() > 0);
  CHECK(j["breakdown_at_peak"]["other"] == j["peak_event"]["allocated_bytes"]);

  SECTION("allocator overrides apply; other keys are bad input") {
    Result ok = memsim("replay '" + snapshot + "' --set allocator.expandable_segments=true", dir);
    CHECK(ok.status == 0);
    CHECK(ok.out.find("expandable_segments:True") != std::string::npos);
    Result bad = memsim("replay '" + snapshot + "' --set batch.micro_batch=2", dir);
    CHECK(bad.status == 1);
  }
  SECTION("a file that is not a snapshot") {
    const fs::path junk = dir.write("junk.pickle", "not a pickle at all");
    Result bad = memsim("replay " + quoted(junk), dir);
    CHECK(bad.status == 1);
    CHECK(bad.err.find("junk.pickle") != std::string::npos);
  }
}
