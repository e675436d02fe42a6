// memsim run's report files, end to end through the built binary (MEMSIM_BINARY_DIR/memsim)
// on a tiny scenario: --snapshot (read back and replayed with zero mismatches), --trace
// (Chrome trace JSON with counters and phase slices), --html (self-contained page).
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"
#include "tests/shared_dir_test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "scenario/scenario.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using memsim_test::slurp;
using Result = memsim_test::CliResult;

struct TempDir : memsim_test::TempDir {
  TempDir() : memsim_test::TempDir("memsim_reports") {}
};

Result run_cli(const std::string& args, const TempDir& dir) {
  return memsim_test::run_memsim(args, dir);
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// Two layers of d_model 64: simulates in milliseconds.
std::string tiny(const std::string& capacity = "1GiB") {
  return "name: tiny reports test\n"
         "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n"
         "  vocab: 512\n"
         "batch:\n  micro_batch: 2\n  seq_len: 32\n"
         "step:\n  warmup_steps: 1\n"
         "device:\n  capacity: " + capacity + "\n  cuda_context: 0\n";
}

// Counts the allocator's trace entries when the same scenario runs in-process.
struct Counter : memsim::ExecuteTraceObserver {
  size_t entries = 0;
  void on_trace(size_t, const memsim::TraceEntry&) override { ++entries; }
};

size_t in_process_trace_entries(const fs::path& scenario_path) {
  const memsim::Scenario s = memsim::load_scenario(scenario_path.string());
  const memsim::Program program = memsim::build_program(s);
  memsim::SimulatedDevice device(s.device.capacity, 0);
  Counter counter;
  memsim::ExecuteOptions options;
  options.trace_observer = &counter;
  memsim::execute(program, s.allocator, device, options);
  return counter.entries;
}

}  // namespace

TEST_CASE("run --snapshot writes a snapshot that replays with zero mismatches", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const fs::path pickle = dir.path / "run.pickle";
  const Result r = run_cli("run " + q(scenario) + " --snapshot " + q(pickle), dir);
  INFO(r.err);
  REQUIRE(r.status == 0);

  const memsim::Snapshot snap = memsim::read_snapshot_file(pickle.string());
  REQUIRE(snap.device_traces.size() == 1);
  const auto& trace = snap.device_traces[0];
  CHECK(trace.size() == in_process_trace_entries(scenario));
  CHECK_FALSE(snap.segments.empty());
  std::set<memsim::TraceAction> actions;
  int64_t last_time = 0;
  bool ordered = true;
  for (const auto& e : trace) {
    actions.insert(e.action);
    ordered = ordered && e.time_us >= last_time;
    last_time = e.time_us;
  }
  CHECK(ordered);  // time_us is the Program event index: never decreases
  for (auto a : {memsim::TraceAction::alloc, memsim::TraceAction::free_requested,
                 memsim::TraceAction::free_completed, memsim::TraceAction::segment_alloc})
    CHECK(actions.count(a) == 1);

  const memsim::ReplayReport report = memsim::replay_snapshot(snap);
  CHECK(report.events == trace.size());
  CHECK(report.mismatches == 0);
  CHECK(report.final_segments_match);
  CHECK(report.seeded_segments == 0);  // the trace starts from an empty allocator
}

TEST_CASE("run --snapshot of an OOM run records the oom entry", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny("3MiB"));
  const fs::path pickle = dir.path / "oom.pickle";
  const Result r = run_cli("run " + q(scenario) + " --snapshot " + q(pickle), dir);
  INFO(r.err);
  REQUIRE(r.status == 3);
  const memsim::Snapshot snap = memsim::read_snapshot_file(pickle.string());
  REQUIRE(snap.device_traces.size() == 1);
  REQUIRE_FALSE(snap.device_traces[0].empty());
  CHECK(snap.device_traces[0].back().action == memsim::TraceAction::oom);
  CHECK(memsim::replay_snapshot(snap).mismatches == 0);
}

TEST_CASE("run --trace writes Chrome trace JSON with counters and phase slices", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const fs::path trace = dir.path / "trace.json";
  const Result r = run_cli("run " + q(scenario) + " --trace " + q(trace), dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(slurp(trace));
  REQUIRE(j["traceEvents"].is_array());
  std::set<std::string> counters, phase_slices, marks;
  size_t op_slices = 0, layer_slices = 0;
  for (const json& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "C") {
      counters.insert(e["name"].get<std::string>());
      CHECK(e["ts"].is_number_unsigned());
    } else if (ph == "X") {
      CHECK(e["dur"].get<uint64_t>() >= 1);
      if (e["tid"] == 1) phase_slices.insert(e["name"].get<std::string>());
      if (e["tid"] == 2) ++layer_slices;
      if (e["tid"] == 3) ++op_slices;
    } else if (ph == "i") {
      marks.insert(e["name"].get<std::string>());
    }
  }
  CHECK(counters.count("memory") == 1);
  CHECK(counters.count("allocated by kind") == 1);
  for (const char* p : {"forward", "backward", "optimizer"}) {
    INFO(p);
    CHECK(phase_slices.count(p) == 1);
  }
  CHECK(layer_slices > 0);
  CHECK(op_slices > 0);
  CHECK(marks.count("forward_end") == 1);
}

TEST_CASE("run --trace - writes the trace to stdout and no summary", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const Result r = run_cli("run " + q(scenario) + " --trace -", dir);
  REQUIRE(r.status == 0);
  CHECK_NOTHROW(json::parse(r.out));
  CHECK(run_cli("run " + q(scenario) + " --trace - --json -", dir).status == 2);
}

TEST_CASE("run --html writes a self-contained page with the peak", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const fs::path html = dir.path / "report.html";
  const Result r = run_cli("run " + q(scenario) + " --html " + q(html) + " --json -", dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  const std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("http") == std::string::npos);  // no external resource, no CDN
  // Inline scripts only (the zoom and the per-layer data, issue #19 item 5): nothing loaded.
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find(std::to_string(j["peak_allocated_bytes"].get<uint64_t>()) + " bytes") !=
        std::string::npos);
  CHECK(page.find("Breakdown at the peak") != std::string::npos);
  CHECK(page.find("Largest live tensors") != std::string::npos);
  CHECK(page.find("capacity") != std::string::npos);
  CHECK(page.size() < 1000000);
}

TEST_CASE("run --html of an OOM run marks the OOM point", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny("3MiB"));
  const fs::path html = dir.path / "oom.html";
  const Result r = run_cli("run " + q(scenario) + " --html " + q(html), dir);
  REQUIRE(r.status == 3);
  const std::string page = slurp(html);
  CHECK(page.find("OUT OF MEMORY") != std::string::npos);
  CHECK(page.find(">OOM") != std::string::npos);
  // PyTorch's OOM message quotes a documentation URL as text; nothing is loaded from it.
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("href=") == std::string::npos);
}

TEST_CASE("run report flags name an unwritable file", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  for (const char* flag : {"--html", "--trace", "--snapshot"}) {
    INFO(flag);
    const fs::path bad = dir.path / "no-such-folder" / "out";
    const Result r = run_cli("run " + q(scenario) + " " + flag + " " + q(bad), dir);
    CHECK(r.status == 1);
    CHECK(r.err.find(bad.string()) != std::string::npos);
  }
}

TEST_CASE("run --html renders in headless Chromium", "[reports][chromium]") {
  // The CI image has no browser; the check runs where Debian's chromium is installed.
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    MEMSIM_SKIP("chromium is not installed (apt-get install chromium to run this check)");
    return;
  }
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const fs::path html = dir.path / "report.html";
  REQUIRE(run_cli("run " + q(scenario) + " --html " + q(html), dir).status == 0);
  const fs::path png = dir.path / "shot.png";
  const std::string cmd = "chromium --headless --no-sandbox --disable-gpu --window-size=1200,900 "
                          "--screenshot=" + q(png) + " 'file://" + html.string() +
                          "' >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::string shot = slurp(png);
  REQUIRE(shot.size() > 1000);
  CHECK(shot.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

TEST_CASE("compare --html draws one curve per policy", "[reports]") {
  TempDir dir;
  const fs::path scenario = dir.write("tiny.yaml", tiny());
  const fs::path html = dir.path / "compare.html";
  const Result r = run_cli("compare " + q(scenario) + " --policies none,full --html " + q(html) +
                               " --json -",
                           dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  const std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("http") == std::string::npos);
  size_t curves = 0;
  for (size_t at = page.find("<polyline"); at != std::string::npos;
       at = page.find("<polyline", at + 1))
    ++curves;
  // allocated and reserved per policy (issue #18 item 3: the reserved line beside the
  // allocated one; tools/cli/compare_html.h)
  CHECK(curves == 4);
  for (const json& p : j["policies"]) CHECK(page.find(p["policy"].get<std::string>()) != std::string::npos);
}

TEST_CASE("replay --html draws a real snapshot's trace", "[reports]") {
  TempDir dir;
  const fs::path html = dir.path / "replay.html";
  const Result r = run_cli(std::string("replay '") + MEMSIM_SOURCE_DIR +
                               "/tests/data/silmont2000_mem_snapshot.pickle' --html " + q(html),
                           dir);
  REQUIRE(r.status == 0);
  const std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("http") == std::string::npos);
  // The trace's peak allocated, 3.03 GiB, is printed in exact bytes on the page.
  const json report = json::parse(
      run_cli(std::string("replay '") + MEMSIM_SOURCE_DIR +
                  "/tests/data/silmont2000_mem_snapshot.pickle' --json -",
              dir)
          .out);
  CHECK(page.find(std::to_string(report["peak_allocated_bytes"].get<uint64_t>())) !=
        std::string::npos);
  CHECK(run_cli(std::string("replay '") + MEMSIM_SOURCE_DIR +
                    "/tests/data/silmont2000_mem_snapshot.pickle' --html -",
                dir)
            .status == 2);
}
