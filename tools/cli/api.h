// The documents of `memsim run`, `compare` and `sweep` as functions, shared by those verbs
// (tools/cli/*_command.cpp) and the Python module (tools/python/memsim_module.cpp), so
// that both give the same JSON from one writer. Errors: UsageError for a malformed list
// (--policies, --vary), ScenarioError for a bad scenario, as the verbs raise them.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "allocator/memory_stats.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/step_time.h"
#include "sim/analysis/stream_run.h"
#include "sim/search/sweep.h"
#include "sim/step/execute.h"
#include "sim/step/generate.h"
#include "tools/cli/headroom_report.h"
#include "tools/cli/json_report.h"
#include "tools/cli/moe_report.h"
#include "tools/cli/serve_report.h"

namespace memsim::cli {

// run (tools/cli/run_command.cpp): the Program `memsim run` simulates (step.kind generate:
// the generate() Program, filling `generate_facts`), the AnalysisOptions it analyzes with,
// and the --json object (`moe`: tools/cli/moe_report.h's moe_routing_report(scenario)).
Program build_run_program(const Scenario& scenario, GenerateFacts& generate_facts);
// The same Program built into `program` with a streaming run attached (issue #20,
// sim/analysis/stream_run.h): no per-event array, the analysis computed as it is built.
StreamResult stream_run_program(const Scenario& scenario, GenerateFacts& generate_facts,
                                Program& program, const StreamOptions& options);
// The same on `device` instead of the scenario's (an unlimited one: tools/cli/plain_run.h).
StreamResult stream_run_program(const Scenario& scenario, GenerateFacts& generate_facts,
                                Program& program, const StreamOptions& options,
                                DeviceMemory& device);
AnalysisOptions run_analysis_options(const Scenario& scenario);
// `final_stats`: the allocator's memory_stats() at the end (Timeline::final_stats).
// `headroom` (tools/cli/headroom_report.h): oom.needed_bytes and warnings; null = computed
// here (an OOM costs one more simulation).
Json run_json(const Scenario& scenario, const Program& program, const MemoryStats& final_stats,
              const Analysis& analysis, const GenerateFacts& generate_facts,
              const std::optional<MoeRoutingReport>& moe, const RunHeadroom* headroom = nullptr);

// compare (tools/cli/compare_command.cpp).
struct PolicyRun {
  std::string label;
  Analysis analysis;
  MemoryStats stats;
  StepTime time;  // the time model's estimate of the measured step (sim/analysis/step_time.h)
  uint64_t host_offload_bytes = 0;  // checkpoint.offload's pinned host peak (graph/offload.h)
};
// "none,full,uniform:2": each policy parsed and checked against the model's layers.
std::vector<CheckpointConfig> parse_policy_list(const std::string& list, const Scenario& base);
// `base` simulated under each policy in order; `each` (optional) sees every run's Program
// and Timeline before they are dropped.
using PolicyObserver = std::function<void(const Program&, const Timeline&, const PolicyRun&)>;
std::vector<PolicyRun> run_policies(const Scenario& base, const std::vector<CheckpointConfig>& configs,
                                    const PolicyObserver& each = {});
Json compare_json(const Scenario& base, const std::vector<PolicyRun>& runs);

// sweep (tools/cli/sweep_command.cpp): the --vary axes checked against --max ("" = grid).
std::vector<SweepAxis> parse_sweep_axes(const std::vector<std::string>& vary, const std::string& max);
// live_sets: false when the caller reports no point's live set (only the JSON does):
// each point then skips summarising it (AnalysisOptions::live_set); nothing else changes.
std::vector<SweepResult> run_sweep_grid(const SweepRunner& runner,
                                        const std::vector<SweepOverrides>& points, unsigned threads,
                                        const SweepProgress& progress = {}, bool live_sets = true);
Json sweep_grid_json(const SweepRunner& runner, const std::vector<SweepOverrides>& points,
                     const std::vector<SweepResult>& results);
std::vector<MaxSearch> run_sweep_max(const SweepRunner& runner,
                                     const std::vector<SweepOverrides>& points,
                                     const std::string& max_key, unsigned threads,
                                     const SweepProgress& progress = {});
Json sweep_max_json(const SweepRunner& runner, const std::string& max_key,
                    const std::vector<SweepOverrides>& points, const std::vector<MaxSearch>& results);

// serve (tools/cli/serve_command.cpp): the plan of `memsim serve` (a scenario without a
// serve: section gets every key at the engine's default, which `s` then records), and the
// answers to its inverse flags (--max-seqs LEN: 0 = not asked; --min-tp: nullopt = not
// asked, 0 = up to 8), for serve_json (tools/cli/serve_report.h).
serve::ServePlan plan_serve_scenario(Scenario& s);
ServeInverse serve_inverse(const Scenario& s, const serve::ServePlan& plan, int64_t max_seqs_len,
                           std::optional<int64_t> min_tp);

}  // namespace memsim::cli
