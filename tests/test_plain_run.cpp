// Issue #20: a plain `memsim run` (no per-event output) stops building at its first
// out-of-memory (tools/cli/plain_run.h), and a streamed Program recycles tensor ids
// (program/program.h), so that a run's memory does not grow with its events.
//  - The report of an OOM run is the complete build's, field for field: run_json and the
//    terminal summary of the stopped run equal those of the stored path (`--timeline`,
//    which builds and keeps every event), on every shipped scenario squeezed to run out of
//    memory early and late, and on the shipped scenarios that run out of memory as they are.
//  - The stopped build hands on fewer events than the Program has.
//  - Recycled ids: the tensor table of a streamed build stays the size of the live set
//    while the run's tensor count (serials) grows with warm-up steps.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "cli_test_support.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/stream_run.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "sim/step/training_script.h"
#include "tools/cli/api.h"
#include "tools/cli/device.h"
#include "tools/cli/headroom_report.h"
#include "tools/cli/plain_run.h"
#include "test_paths.h"

using namespace memsim;

namespace {

std::vector<std::string> shipped_scenarios() {
  std::vector<std::string> out;
  for (const char* dir : {"/scenarios", "/scenarios/groundtruth"})
    for (const auto& e : std::filesystem::directory_iterator(std::string(MEMSIM_SOURCE_DIR) + dir))
      if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The --json document of the stored path (what `run --timeline` does), as text.
struct StoredReport {
  std::string json;
  Analysis analysis;
  size_t measured_from = 0;
};

StoredReport stored_report(const Scenario& s) {
  GenerateFacts facts;
  const Program program = cli::build_run_program(s, facts);
  auto device = cli::make_device(s.device);
  const Timeline t = execute(program, s.allocator, *device);
  StoredReport r;
  r.analysis = analyze(program, t, cli::run_analysis_options(s));
  const cli::RunHeadroom h = cli::run_headroom(s, program, t.final_stats, r.analysis);
  r.json = cli::dump_json(cli::run_json(s, program, t.final_stats, r.analysis, facts, std::nullopt, &h));
  for (size_t i = 0; i < program.events.size(); ++i)
    if (program.events[i].type == EventType::mark &&
        program.str(static_cast<uint32_t>(program.events[i].bytes)) == "measured_step_begin") {
      r.measured_from = i;
      break;
    }
  return r;
}

}  // namespace

TEST_CASE("an OOM plain run stops its build and reports what the complete build reports",
          "[plain-run]") {
  int ooms = 0, stopped = 0;
  for (const std::string& path : shipped_scenarios()) {
    INFO(path);
    Scenario s;
    StoredReport fit;
    try {
      s = load_scenario(path);
      s.device.capacity = 0;  // unlimited: the peak it needs
      fit = stored_report(s);
    } catch (const ScenarioError&) {
      continue;
    }
    if (!fit.analysis.fits()) continue;  // beyond even the unlimited device
    for (double f : {0.3, 0.9}) {
      INFO("capacity fraction " << f);
      s.device.capacity = s.device.cuda_context +
                          static_cast<uint64_t>(static_cast<double>(fit.analysis.peak_reserved) * f);
      const StoredReport ref = stored_report(s);
      GenerateFacts facts;
      const cli::PlainRun r = cli::run_plain(s, facts);
      REQUIRE(r.analysis.oom.has_value() == ref.analysis.oom.has_value());
      const cli::RunHeadroom h = cli::run_headroom_known(s, r.final_stats, r.analysis, r.needed);
      CHECK(cli::dump_json(cli::run_json(s, r.program, r.final_stats, r.analysis, facts,
                                         std::nullopt, &h)) == ref.json);
      CHECK(r.measured_from == ref.measured_from);
      if (!r.analysis.oom) continue;
      ++ooms;
      CHECK(r.stopped_events >= ref.analysis.oom->index + 1);
      if (r.stopped) {
        CHECK(r.stopped_events < ref.analysis.events);
        ++stopped;
      }
    }
  }
  CHECK(ooms >= 60);
  CHECK(stopped >= 40);  // most squeezed runs fail early: their builds stopped there
}

TEST_CASE("memsim run prints the same OOM report streamed (stopped) and stored", "[plain-run]") {
  memsim_test::TempDir dir("plain_run");
  for (const char* name : {"scenarios/llama2-13b-seq4096-rtx4070.yaml",
                           "scenarios/llama2-7b-full-finetune-a100-master.yaml"}) {
    INFO(name);
    const std::string path = std::string(MEMSIM_SOURCE_DIR) + "/" + name;
    const auto plain = memsim_test::run_memsim("run '" + path + "'", dir);
    const auto stored = memsim_test::run_memsim(
        "run '" + path + "' --timeline '" + (dir.path / "t.csv").string() + "'", dir);
    CHECK(plain.status == 3);
    CHECK(stored.status == 3);
    CHECK(plain.out == stored.out);
    const auto plain_json = memsim_test::run_memsim("run '" + path + "' --json -", dir);
    const auto stored_json = memsim_test::run_memsim(
        "run '" + path + "' --json - --timeline '" + (dir.path / "t.csv").string() + "'", dir);
    CHECK(plain_json.out == stored_json.out);
    CHECK(plain_json.out.find("\"needed_bytes\"") != std::string::npos);
  }
}

TEST_CASE("a streamed build recycles tensor ids: its tensor table does not grow with events",
          "[plain-run]") {
  Scenario s = load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/cs336-small-train-ctx512.yaml");
  s.device.capacity = 0;
  std::vector<size_t> table, serials, events;
  for (int64_t warmup : {0, 4, 16}) {
    s.step.warmup_steps = warmup;
    BuildBuffers buffers;
    auto device = cli::make_device(s.device);
    const TrainingScript script = default_script(s);
    const StreamResult r = stream_run(
        buffers.program, [&](Program&) { build_program(s, script, buffers); }, s.allocator,
        *device, StreamOptions{});
    REQUIRE(r.complete);
    table.push_back(buffers.program.tensors.size());
    serials.push_back(buffers.program.tensor_serial());
    events.push_back(r.analysis.events);
    // A stored build of the same scenario has one id per tensor.
    BuildBuffers stored;
    build_program(s, script, stored);
    CHECK(stored.program.tensors.size() == buffers.program.tensor_serial());
    CHECK(stored.program.events.size() == r.analysis.events);
  }
  CHECK(events[2] > 4 * events[0]);
  CHECK(serials[2] > 4 * serials[0]);
  // The live set is the same in every step: so is the table (a chunk of ids is handed back
  // at each hand-over, so it varies by less than a chunk's worth).
  CHECK(table[2] <= table[0] + 4096);
  CHECK(table[2] < serials[2] / 4);
}
