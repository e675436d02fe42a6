// memsim compare: one scenario simulated under several checkpointing (and offload) policies;
// the table is tools/cli/compare_rows.h, the HTML page tools/cli/compare_html.h.
#include <cstdio>
#include <string>
#include <vector>

#include "allocator/units.h"
#include "sim/analysis/analysis.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tools/cli/api.h"
#include "tools/cli/commands.h"
#include "tools/cli/compare_html.h"
#include "tools/cli/compare_rows.h"
#include "tools/cli/device.h"
#include "tools/cli/errors.h"
#include "tools/cli/html_report.h"
#include "tools/cli/json_report.h"
#include "tools/cli/output.h"
#include "tools/cli/overrides.h"
#include "tools/cli/scenario_facts.h"
#include "tools/cli/scenario_input.h"
#include "tools/cli/step_time_report.h"
#include "tools/cli/style.h"
#include "tools/cli/summary.h"
#include "tools/cli/terminal_text.h"

namespace memsim::cli {

namespace {

void print_table(std::FILE* out, const Scenario& scenario, const std::vector<CompareRow>& rows,
                 const std::vector<PolicyRun>& runs, const Style& style) {
  std::fprintf(out, "%s\n",
               style.bold(printable(scenario.name.empty() ? scenario.source : scenario.name)).c_str());
  for (const auto& [label, text] : scenario_facts(scenario))
    std::fprintf(out, "  %-9s %s\n", label.c_str(), text.c_str());
  const auto cap = usable_capacity(scenario.device);
  std::fprintf(out, "  capacity  %s\n\n", cap ? (human_bytes(*cap) + " usable").c_str() : "unlimited");
  // One row per policy (tools/cli/compare_rows.h): text columns left-aligned, numbers right.
  const std::vector<std::vector<std::string>> cells = compare_table_cells(rows);
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string line = "  ";
    for (size_t c = 0; c < cells[r].size(); ++c) {
      const std::string pad(width[c] - cells[r][c].size(), ' ');
      const bool left = c <= 1 || c + 1 == cells[r].size();
      line += left ? cells[r][c] + (c + 1 < cells[r].size() ? pad : "") : pad + cells[r][c];
      if (c + 1 < cells[r].size()) line += "  ";
    }
    std::fprintf(out, "%s\n", r == 0 ? style.bold(line).c_str() : line.c_str());
  }
  // A refused estimate names its reason once (it is the same for every policy).
  for (const PolicyRun& r : runs)
    if (!r.time.estimated) {
      std::fprintf(out, "  step time not estimated: %s\n", r.time.refused.c_str());
      break;
    }
}

}  // namespace

CLI::App* add_compare_command(CLI::App& app, CompareArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "compare", "Simulate a scenario under several activation-checkpointing policies");
  cmd->add_option("SCENARIO", args.scenario, "Scenario file (YAML), or - for standard input")
      ->required();
  cmd->add_option("--policies", args.policies,
                  "Comma-separated policies: none, full, uniform:K, block:N, "
                  "modules[:attention,mlp], selective, sqrt, custom:ITEMS, offload[:N] "
                  "(save_on_cpu around every layer, or the first N)")
      ->required();
  cmd->add_option("--set", args.sets, "Override a scenario key, e.g. --set batch.micro_batch=8")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write one JSON summary per policy to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("--html", args.html,
                  "Write a self-contained HTML page with one memory curve per policy to FILE")
      ->type_name("FILE.html");
  cmd->footer("Exit status: 0 when at least one policy fits, 3 when every policy runs out of memory, 1 bad input, 2 bad usage.");
  return cmd;
}

std::vector<CheckpointConfig> parse_policy_list(const std::string& list, const Scenario& base) {
  std::vector<CheckpointConfig> configs;
  try {
    for (const std::string& spec : split_policies(list)) {
      configs.push_back(parse_policy(spec));
      make_plan(configs.back(), base.model.layers);  // validates layer indices and modules
      if (configs.back().offload.size() > static_cast<size_t>(std::max<int64_t>(0, base.model.layers)))
        throw PolicyError("policy '" + spec + "': the model has " +
                          std::to_string(base.model.layers) + " layers");
    }
  } catch (const PolicyError& e) {
    throw UsageError(std::string("--policies: ") + e.what());
  }
  if (configs.empty()) throw UsageError("--policies: no policy given");
  return configs;
}

std::vector<PolicyRun> run_policies(const Scenario& base, const std::vector<CheckpointConfig>& configs,
                                    const PolicyObserver& each) {
  std::vector<PolicyRun> runs;
  for (const CheckpointConfig& config : configs) {
    Scenario s = base;
    s.checkpoint = with_call_of(config, base.checkpoint);  // the script's reentrant / early_stop
    const Program program = build_program(s);
    auto device = make_device(s.device);
    const Timeline timeline = execute(program, s.allocator, *device);
    runs.push_back({policy_label(config), analyze(program, timeline), timeline.final_stats,
                    estimate_step_time(program.cost, s.device), program.host_offload_bytes});
    if (each) each(program, timeline, runs.back());
  }
  return runs;
}

Json compare_json(const Scenario& base, const std::vector<PolicyRun>& runs) {
  Json j = Json::object();
  j["scenario"] = base.name;
  j["scenario_file"] = base.source;
  Json list = Json::array();
  for (const PolicyRun& r : runs) {
    Json p = Json::object();
    p["policy"] = r.label;
    p["recompute_share"] = compare_row(r).recompute_share;
    Json summary = analysis_json(r.analysis);
    for (auto& [key, value] : summary.items()) p[key] = std::move(value);
    p["memory_stats"] = memory_stats_json(r.stats);
    // The time model (issue #18 item 1): the measured step's seconds, and the recompute
    // part next to the step's recompute FLOPs.
    p["estimated_step_seconds"] = step_time_json(r.time);
    p["recompute_seconds"] = r.time.estimated ? Json(r.time.part[static_cast<int>(CostPart::recompute)]) : Json(nullptr);
    p["host_offload_bytes"] = r.host_offload_bytes;
    list.push_back(std::move(p));
  }
  j["policies"] = std::move(list);
  // Issue #18 item 3: the table people read, one row per policy (tools/cli/compare_rows.h).
  Json rows = Json::array();
  for (const CompareRow& row : compare_rows(runs)) rows.push_back(compare_row_json(row));
  j["rows"] = std::move(rows);
  return j;
}

int run_compare(const CompareArgs& args) {
  const Overrides overrides = parse_overrides(args.sets);
  const Scenario base = load_scenario_arg(args.scenario, overrides);
  const std::vector<CheckpointConfig> configs = parse_policy_list(args.policies, base);

  HtmlReport html;  // downsampled curves only: the timelines are not kept
  const std::vector<PolicyRun> runs = run_policies(
      base, configs, [&](const Program& program, const Timeline& timeline, const PolicyRun& run) {
        if (!args.html.empty())
          html.curves.push_back(downsample_timeline(program, timeline, run.analysis, run.label));
      });
  const std::vector<CompareRow> rows = compare_rows(runs);
  if (!args.html.empty()) {  // phase-aligned curves and the table (tools/cli/compare_html.h)
    html.title = base.name.empty() ? base.source : base.name;
    html.facts = scenario_facts(base);
    html.capacity = usable_capacity(base.device);
    Output out(args.html);
    write_compare_html(out.file(), html, rows);
    out.finish();
  }

  if (!args.json.empty()) {
    Output out(args.json);
    out.write(dump_json(compare_json(base, runs)));
    out.finish();
  }
  if (args.json != "-") {
    print_table(stdout, base, rows, runs, Style::for_stream(stdout));
    std::fflush(stdout);
  }
  for (const PolicyRun& r : runs)
    if (r.analysis.fits()) return kExitFits;
  return kExitOom;  // no policy fits
}

}  // namespace memsim::cli
