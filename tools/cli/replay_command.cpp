// memsim replay: a real PyTorch snapshot's trace through the allocator emulator, checked
// against the trace's own addresses and cudaMalloc calls, reported with the same keys as
// `memsim run` (tools/cli/replay_analysis.h says what a trace can and cannot tell).
#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "allocator/snapshot/snapshot.h"
#include "allocator/units.h"
#include "replay/replay.h"
#include "scenario/scenario.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/html_report.h"
#include "tools/cli/json_report.h"
#include "tools/cli/output.h"
#include "tools/cli/overrides.h"
#include "tools/cli/replay_analysis.h"
#include "tools/cli/summary.h"
#include "tools/cli/timeline_csv.h"

namespace memsim::cli {

namespace {

constexpr int kDevice = 0;  // snapshots of one process usually trace device 0 only

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The keys `replay` adds to the shared summary keys.
Json replay_json(const ReplayReport& r, const AllocatorConfig& config) {
  Json list = Json::array();
  for (const ReplayMismatch& m : r.first_mismatches) {
    list.push_back({{"event_index", m.event_index},
                    {"what", m.what},
                    {"expected", m.expected},
                    {"got", m.got},
                    {"description", m.describe()}});
  }
  return {{"events_replayed", r.events},
          {"allocs", r.allocs},
          {"frees", r.frees},
          {"segment_allocs", r.segment_allocs},
          {"segment_frees", r.segment_frees},
          {"unsupported_events", r.unsupported_events},
          // `list` holds the first few only (ReplayOptions::keep_mismatches).
          {"mismatches", {{"count", r.mismatches}, {"list", std::move(list)}}},
          {"final_segments_match", r.final_segments_match},
          {"final_layout_match", r.final_layout_match},
          {"first_segment_difference", r.first_segment_difference},
          {"baseline",
           {{"allocated_bytes", r.baseline_allocated_bytes},
            {"reserved_bytes", r.baseline_reserved_bytes},
            {"requested_bytes", r.baseline_requested_bytes},
            {"seeded_segments", r.seeded_segments},
            {"seeded_live_blocks", r.seeded_live_blocks}}},
          {"trace_estimate_peak_allocated_bytes", r.trace_estimate_peak_allocated_bytes},
          {"allocator_settings", config.to_string()}};
}

SummaryHeader replay_header(const std::string& path, const ReplayReport& r,
                            const AllocatorConfig& config, const Style& style) {
  SummaryHeader h;
  h.title = path;
  h.capacity_text = "a GPU of unrecorded capacity";
  h.facts.emplace_back("trace", std::to_string(r.events) + " events: " + std::to_string(r.allocs) +
                                    " allocs, " + std::to_string(r.frees) + " frees, " +
                                    std::to_string(r.segment_allocs) + " cudaMallocs, " +
                                    std::to_string(r.segment_frees) + " cudaFrees");
  const std::string settings = config.to_string();
  h.facts.emplace_back("allocator", settings.empty() ? "default settings" : settings);
  h.facts.emplace_back("start state",
                       std::to_string(r.seeded_segments) + " segments, " +
                           std::to_string(r.seeded_live_blocks) + " live blocks (" +
                           human_bytes(r.baseline_allocated_bytes) + " allocated, " +
                           human_bytes(r.baseline_reserved_bytes) + " reserved)");
  std::string fidelity = std::to_string(r.mismatches) + " mismatches";
  fidelity = r.mismatches == 0 ? style.good(fidelity) : style.bad(fidelity);
  fidelity += r.final_segments_match ? ", final segments match"
              : r.final_layout_match ? ", final layout matches (requested sizes differ)"
                                     : ", final segments differ: " + r.first_segment_difference;
  if (r.unsupported_events > 0) {
    fidelity += ", " + std::to_string(r.unsupported_events) + " unsupported events skipped";
  }
  h.facts.emplace_back("fidelity", fidelity);
  return h;
}

}  // namespace

CLI::App* add_replay_command(CLI::App& app, ReplayArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a PyTorch memory snapshot's trace through the allocator emulator");
  cmd->add_option("SNAPSHOT", args.snapshot, "Snapshot pickle (torch.cuda.memory._dump_snapshot)")
      ->required();
  cmd->add_option("--set", args.sets,
                  "Override an allocator setting, e.g. --set allocator.expandable_segments=true")
      ->type_name("allocator.KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write the JSON report to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("--timeline", args.timeline,
                  "Write one CSV row per trace entry to FILE ('-' for stdout)")
      ->type_name("FILE.csv");
  cmd->add_option("--html", args.html, "Write a self-contained HTML report to FILE")
      ->type_name("FILE.html");
  cmd->footer("Exit status: 0 the trace fits its device, 3 it runs out of memory, 1 bad input, 2 bad usage.");
  return cmd;
}

int run_replay(const ReplayArgs& args) {
  const Overrides overrides = parse_overrides(args.sets);
  check_stdout_reports(args.json, args.timeline);
  check_input_file(args.snapshot);
  auto t0 = std::chrono::steady_clock::now();
  const Snapshot snapshot = read_snapshot_file(args.snapshot);
  spdlog::info("snapshot {}: {} segments, {} device trace(s) ({:.3f} s)", args.snapshot,
               snapshot.segments.size(), snapshot.device_traces.size(), seconds_since(t0));

  ReplayOptions options;
  options.device = kDevice;
  options.record_timeline = true;
  if (!overrides.empty()) options.config = apply_allocator_overrides(snapshot.config, overrides);
  const AllocatorConfig config = options.config ? *options.config : snapshot.config;

  static const std::vector<SnapshotTraceEntry> kNoTrace;
  const std::vector<SnapshotTraceEntry>& trace =
      snapshot.device_traces.size() > static_cast<size_t>(kDevice) ? snapshot.device_traces[kDevice]
                                                                    : kNoTrace;
  auto t1 = std::chrono::steady_clock::now();
  const PreparedReplay prepared = prepare_replay(snapshot, options);
  const ReplayReport report = run_replay(prepared, options);
  spdlog::info("replayed {} events, {} mismatches ({:.3f} s)", report.events, report.mismatches,
               seconds_since(t1));
  if (report.mismatches > 0) {
    spdlog::warn("{} mismatches against the trace; first: {}", report.mismatches,
                 report.first_mismatches.empty() ? std::string("?")
                                                 : report.first_mismatches.front().describe());
  }

  const Analysis analysis = analyze_replay(trace, prepared, report);

  if (!args.timeline.empty()) {
    Output out(args.timeline);
    write_trace_timeline_csv(out.file(), trace, report.timeline);
    out.finish();
  }
  if (!args.html.empty()) {
    if (args.html == "-") throw UsageError("--html needs a file name");
    // A trace carries no phases and no tensor kinds: the page shows allocated and
    // reserved over the trace's entries, without phase bands or stacked kinds.
    Timeline timeline;
    timeline.allocated.reserve(report.timeline.size());
    timeline.reserved.reserve(report.timeline.size());
    timeline.requested.reserve(report.timeline.size());
    for (const ReplayTimelinePoint& p : report.timeline) {
      timeline.allocated.push_back(p.allocated);
      timeline.reserved.push_back(p.reserved);
      timeline.requested.push_back(p.requested);
    }
    HtmlReport page;
    page.title = args.snapshot;
    page.facts = replay_header(args.snapshot, report, config, Style{}).facts;
    page.curves.push_back(downsample_timeline(timeline, analysis, args.snapshot));
    Output out(args.html);
    write_html_report(out.file(), page, &analysis);
    out.finish();
    spdlog::info("HTML report written to {}", args.html);
  }
  if (!args.json.empty()) {
    Json j = Json::object();
    j["snapshot"] = args.snapshot;
    Json summary = analysis_json(analysis);
    for (auto& [key, value] : summary.items()) j[key] = std::move(value);
    Json extra = replay_json(report, config);
    for (auto& [key, value] : extra.items()) j[key] = std::move(value);
    j["memory_stats"] = memory_stats_json(report.final_stats);
    Output out(args.json);
    out.write(dump_json(j));
    out.finish();
  }
  if (args.json != "-" && args.timeline != "-") {  // stdout carries a report instead
    const Style style = Style::for_stream(stdout);
    print_summary(stdout, replay_header(args.snapshot, report, config, style), analysis, style);
    std::fflush(stdout);
  }
  return analysis.fits() ? kExitFits : kExitOom;
}

}  // namespace memsim::cli
