// memsim run: scenario -> Program -> allocator emulator -> Timeline -> analysis -> reports.
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "allocator/units.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/generate.h"
#include "sim/step/modelled_features.h"
#include "sim/step/schedule.h"
#include "sim/step/training_script.h"
#include "scenario/offload_keys.h"
#include "scenario/offload_activations_key.h"
#include "scenario/scenario.h"
#include "sim/search/advice_candidates.h"
#include "tools/cli/advice_report.h"
#include "tools/cli/api.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/errors.h"
#include "tools/cli/generate_report.h"
#include "tools/cli/html_report.h"
#include "tools/cli/json_report.h"
#include "tools/cli/moe_report.h"
#include "tools/cli/output.h"
#include "tools/cli/overrides.h"
#include "tools/cli/plain_run.h"
#include "tools/cli/scenario_facts.h"
#include "tools/cli/scenario_input.h"
#include "tools/cli/snapshot_report.h"
#include "tools/cli/step_time_report.h"
#include "tools/cli/summary.h"
#include "tools/cli/timeline_csv.h"
#include "tools/cli/trace_report.h"

namespace memsim::cli {

namespace {

// build_program's checks (require_modelled) for a generate scenario, then its Program.
Program generate_program(const Scenario& scenario, GenerateFacts& facts) {
  require_modelled(scenario);  // sim/step/modelled_features.h
  Program program;
  build_generate_program(scenario, program, nullptr, &facts);
  return program;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// capacity_bytes: the device total (null = unlimited); usable_bytes: what the allocator
// may reserve, capacity - CUDA context (tools/cli/device.h).
Json device_json(const DeviceConfig& d) {
  const auto usable = usable_capacity(d);
  return {{"preset", d.preset.empty() ? Json(nullptr) : Json(d.preset)},
          {"capacity_bytes", d.capacity == 0 ? Json(nullptr) : Json(d.capacity)},
          {"cuda_context_bytes", d.cuda_context},
          {"usable_bytes", usable ? Json(*usable) : Json(nullptr)}};
}

}  // namespace

Program build_run_program(const Scenario& scenario, GenerateFacts& generate_facts) {
  // step.kind generate (issue #17): the generate() Program, with its cache's sizes.
  return scenario.step.kind == StepKind::generate ? generate_program(scenario, generate_facts)
                                                  : build_program(scenario);
}

StreamResult stream_run_program(const Scenario& scenario, GenerateFacts& generate_facts,
                                Program& program, const StreamOptions& options) {
  auto device = make_device(scenario.device);
  return stream_run_program(scenario, generate_facts, program, options, *device);
}

StreamResult stream_run_program(const Scenario& scenario, GenerateFacts& generate_facts,
                                Program& program, const StreamOptions& options,
                                DeviceMemory& device) {
  if (scenario.step.kind == StepKind::generate) {
    require_modelled(scenario);  // sim/step/modelled_features.h
    return stream_run(
        program, [&](Program& p) { build_generate_program(scenario, p, nullptr, &generate_facts); },
        scenario.allocator, device, options);
  }
  // build_program(scenario) into a Program the sink is attached to (clear() keeps it).
  BuildBuffers buffers;
  const TrainingScript script = default_script(scenario);
  StreamResult r = stream_run(
      buffers.program, [&](Program&) { build_program(scenario, script, buffers); },
      scenario.allocator, device, options);
  program = std::move(buffers.program);
  return r;
}

AnalysisOptions run_analysis_options(const Scenario& scenario) {
  AnalysisOptions analysis_options;
  if (scenario.step.kind == StepKind::generate) analysis_options.marks = {"prefill_end", "generate_end"};
  return analysis_options;
}

Json run_json(const Scenario& scenario, const Program& program, const MemoryStats& final_stats,
              const Analysis& analysis, const GenerateFacts& generate_facts,
              const std::optional<MoeRoutingReport>& moe, const RunHeadroom* headroom) {
  const bool generate = scenario.step.kind == StepKind::generate;
  Json j = Json::object();
  j["scenario"] = scenario.name;
  j["scenario_file"] = scenario.source;
  j["device"] = device_json(scenario.device);
  j["rank"] = rank_json(program.rank);
  j["model"] = model_json(scenario, program.rank);
  if (scenario.parallel.sharding == Sharding::deepspeed) j["host_memory"] = host_memory_json(program.host);
  // checkpoint.offload (graph/offload.h): save_on_cpu's pinned host copies at their peak.
  // checkpoint.offload_activations (graph/offload_streams.h): OffloadActivations' tracker.
  if (offloads(scenario.checkpoint) || offloads_activations(scenario) ||
      (generate && scenario.generate.cache == GenerateCache::offloaded))
    j["host_offload_bytes"] = program.host_offload_bytes;  // generate: the offloaded KV cache's
  if (generate) j["generate"] = generate_json(scenario, generate_facts);
  Json summary = analysis_json(analysis);
  for (auto& [key, value] : summary.items()) j[key] = std::move(value);
  j["memory_stats"] = memory_stats_json(final_stats);
  // The time model (issue #18 item 1): the measured step's seconds.
  j["estimated_step_seconds"] = step_time_json(estimate_step_time(program.cost, scenario.device));
  // Issue #19 item 2: oom.needed_bytes / over_bytes, and the FITS warnings.
  add_headroom_json(j, headroom ? *headroom : run_headroom(scenario, program, final_stats, analysis));
  if (moe) {
    Json m = {{"routing", moe->routing}};
    if (!moe->experts_implementation.empty()) m["experts_implementation"] = moe->experts_implementation;
    if (moe->worst_case_run)
      m["worst_case"] = {{"peak_allocated_bytes", moe->worst_peak_allocated},
                         {"peak_reserved_bytes", moe->worst_peak_reserved},
                         {"fits", moe->worst_fits}};
    j["moe"] = std::move(m);
  }
  return j;
}

CLI::App* add_run_command(CLI::App& app, RunArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "run", "Simulate a training job described by a scenario file, a Hugging Face config.json, or both");
  cmd->add_option("SCENARIO", args.scenario,
                  "Scenario file (YAML), or - to read it from standard input; optional with --model");
  cmd->add_option("--model", args.model,
                  "A Hugging Face config.json (or its checkpoint folder): the model to simulate, "
                  "replacing the scenario's model (the other sections default without SCENARIO)")
      ->type_name("CONFIG.json");
  // Each --set takes exactly one KEY=VALUE (so it never swallows the positional
  // SCENARIO) and may repeat; the overrides apply in command-line order.
  cmd->add_option("--set", args.sets, "Override a scenario key, e.g. --set batch.micro_batch=8")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write the JSON report to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("--timeline", args.timeline,
                  "Write one CSV row per memory event to FILE ('-' for stdout)")
      ->type_name("FILE.csv");
  cmd->add_option("--trace", args.trace,
                  "Write a Chrome/Perfetto trace (ui.perfetto.dev) to FILE ('-' for stdout)")
      ->type_name("FILE.json");
  cmd->add_option("--snapshot", args.snapshot,
                  "Write a PyTorch memory snapshot (pytorch.org/memory_viz) to FILE")
      ->type_name("FILE.pickle");
  cmd->add_option("--html", args.html, "Write a self-contained HTML report to FILE")
      ->type_name("FILE.html");
  cmd->add_flag("--advise", args.advise,
                "Simulate every change memsim can (fused/8-bit optimizer, checkpointing, smaller "
                "micro-batch, chunked loss, expandable segments, offload, more GPUs with sharding) "
                "and list each one's peak reserved, verdict and step time; an OOM lists the best "
                "few without it");
  cmd->footer("Exit status: 0 it fits (also with a FITS warning), 3 out of memory, 1 bad input (the message names FILE:LINE: KEY, or --set KEY), 2 bad usage.");
  return cmd;
}

int run_run(const RunArgs& args) {
  const Overrides overrides = parse_overrides(args.sets);
  check_stdout_reports(args.json, args.timeline);
  const int to_stdout = (args.json == "-") + (args.timeline == "-") + (args.trace == "-") +
                        (args.snapshot == "-") + (args.html == "-");
  if (to_stdout > 1) throw UsageError("at most one report can be written to stdout ('-')");
  if (args.scenario.empty() && args.model.empty())
    throw UsageError("run needs a SCENARIO file, a --model CONFIG.json, or both");
  if (!args.scenario.empty() && args.scenario != "-") check_input_file(args.scenario);
  auto t0 = std::chrono::steady_clock::now();
  const Scenario scenario = args.model.empty()
                                ? load_scenario_arg(args.scenario, overrides)
                                : load_scenario_arg_with_model(args.scenario, args.model, overrides);
  spdlog::info("scenario '{}' from {} ({} override(s))", scenario.name, scenario.source,
               overrides.size());

  auto t1 = std::chrono::steady_clock::now();
  // step.kind generate (issue #17): the generate() Program, with its cache's sizes.
  const bool generate = scenario.step.kind == StepKind::generate;
  GenerateFacts generate_facts;
  // Per-event outputs read the stored Program and Timeline; without them the run streams
  // (issue #20, sim/analysis/stream_run.h): the allocator and the analysis consume the
  // events as they are built, and no per-event array is kept.
  const bool per_event_outputs = !args.timeline.empty() || !args.trace.empty() ||
                                 !args.snapshot.empty() || !args.html.empty();
  Program program;
  Timeline timeline;
  Analysis analysis;
  MemoryStats final_stats;
  size_t measured_from = 0;  // the measured step's first mark, over all events
  SnapshotRecorder recorder;  // only attached for --snapshot: the trace costs memory
  std::vector<SegmentInfo> final_segments;
  std::optional<RunHeadroom> known_headroom;  // a plain run's (its OOM rebuild gave it)
  if (!per_event_outputs) {
    // Stopped at the first OOM (tools/cli/plain_run.h); an OOM's whole-step facts and
    // needed bytes come from one streamed rebuild on an unlimited device.
    PlainRun r = run_plain(scenario, generate_facts);
    program = std::move(r.program);
    analysis = std::move(r.analysis);
    final_stats = r.final_stats;
    measured_from = r.measured_from;
    known_headroom = run_headroom_known(scenario, final_stats, analysis, r.needed);
    spdlog::info("streamed {} events, {} tensors; executed {} through the allocator ({:.3f} s){}",
                 analysis.events, program.tensor_serial(), analysis.events_executed,
                 seconds_since(t1),
                 !analysis.oom ? ""
                 : r.stopped ? ", out of memory: built " + std::to_string(r.stopped_events) +
                                   " events, then again whole on an unlimited device"
                             : ", out of memory");
  } else {
    program = build_run_program(scenario, generate_facts);
    spdlog::info("program: {} events, {} tensors ({:.3f} s)", program.events.size(),
                 program.tensors.size(), seconds_since(t1));

    auto t2 = std::chrono::steady_clock::now();
    auto device = make_device(scenario.device);
    ExecuteOptions exec_options;
    if (!args.snapshot.empty()) {
      exec_options.trace_observer = &recorder;
      exec_options.final_segments = &final_segments;
    }
    timeline = execute(program, scenario.allocator, *device, exec_options);
    spdlog::info("executed {} of {} events through the allocator ({:.3f} s){}", timeline.size(),
                 program.events.size(), seconds_since(t2), timeline.oom ? ", out of memory" : "");
    analysis = analyze(program, timeline, run_analysis_options(scenario));
    final_stats = timeline.final_stats;
    for (size_t i = 0; i < program.events.size(); ++i) {
      const MemoryEvent& e = program.events[i];
      if (e.type == EventType::mark &&
          program.str(static_cast<uint32_t>(e.bytes)) == AnalysisOptions().measured_from_mark) {
        measured_from = i;
        break;
      }
    }
  }
  // A mixture-of-experts run: the routing assumption, and worst-case peaks beside balanced.
  const std::optional<MoeRoutingReport> moe = moe_routing_report(scenario);
  // Issue #19 item 2: what an OOM needs, what a FITS run should be warned about, and the
  // changes that help (simulated; with --advise, or a short list for an OOM).
  const RunHeadroom headroom =
      known_headroom ? *known_headroom : run_headroom(scenario, program, final_stats, analysis);
  std::vector<AdviceResult> advice;
  const bool advise = args.advise || !analysis.fits();
  if (advise) {
    auto t3 = std::chrono::steady_clock::now();
    advice = run_advice(advice_candidates(scenario), [&](const Overrides& extra) {
      Overrides all = overrides;
      all.insert(all.end(), extra.begin(), extra.end());
      return args.model.empty() ? load_scenario_arg(args.scenario, all)
                                : load_scenario_arg_with_model(args.scenario, args.model, all);
    });
    spdlog::info("advice: {} change(s) simulated ({:.3f} s)", advice.size(), seconds_since(t3));
  }
  spdlog::debug("total {:.3f} s", seconds_since(t0));

  if (!args.timeline.empty()) {
    Output out(args.timeline);
    write_timeline_csv(out.file(), program, timeline);
    out.finish();
    spdlog::info("timeline written to {}", args.timeline);
  }
  if (!args.trace.empty()) {
    Output out(args.trace);
    write_trace_json(out.file(), program, timeline);
    out.finish();
    spdlog::info("trace written to {}", args.trace);
  }
  if (!args.snapshot.empty()) {
    write_run_snapshot(args.snapshot, program, std::move(recorder.trace), std::move(final_segments),
                       scenario.allocator);
    spdlog::info("snapshot written to {}", args.snapshot);
  }
  if (!args.html.empty()) {
    HtmlReport report;
    report.title = scenario.name.empty() ? scenario.source : scenario.name;
    report.facts = scenario_facts(scenario);
    report.capacity = usable_capacity(scenario.device);
    report.curves.push_back(downsample_timeline(program, timeline, analysis, report.title));
    report.layers = layer_view(program, analysis);  // issue #19 item 5: bytes per layer at the peak
    for (const FitsWarning& w : headroom.warnings) report.notes.push_back("FITS warning: " + w.message);
    if (headroom.needed) report.notes.push_back("Out of memory: " + needed_text(headroom) + ".");
    if (advise) {
      const std::vector<std::string> lines = advice_lines(advice, args.advise);
      for (const std::string& line : lines) report.notes.push_back("Advice: " + line);
    }
    Output out(args.html);
    write_html_report(out.file(), report, &analysis);
    out.finish();
    spdlog::info("HTML report written to {}", args.html);
  }
  if (!args.json.empty()) {
    Output out(args.json);
    Json j = run_json(scenario, program, final_stats, analysis, generate_facts, moe, &headroom);
    if (advise) add_advice_json(j, advice);
    out.write(dump_json(j));
    out.finish();
  }
  if (to_stdout == 0) {  // stdout carries a report instead
    SummaryHeader header;
    header.title = scenario.name.empty() ? scenario.source : scenario.name;
    header.facts = scenario_facts(scenario, &program.rank);
    if (program.rank.distributed()) {
      header.facts.emplace_back("rank", "global rank " + std::to_string(program.rank.index) + " of " +
                                            std::to_string(program.rank.world_size) +
                                            (program.rank.why.empty() ? "" : ": " + program.rank.why));
    }
    if (scenario.parallel.sharding == Sharding::deepspeed) {  // DeepSpeed offload's CPU memory
      const HostMemory& h = program.host;
      header.facts.emplace_back(
          "host memory",
          !h.any() ? std::string("none (nothing offloaded)")
                   : human_bytes(h.pinned + h.pageable) + " per rank (" + human_bytes(h.pinned) +
                         " pinned), " + human_bytes((h.pinned + h.pageable) * static_cast<uint64_t>(h.ranks_per_node)) +
                         " per node of " + std::to_string(h.ranks_per_node) + " ranks" +
                         (h.nvme ? ", " + human_bytes(h.nvme) + " on NVMe" : "") + ": " + h.what);
    }
    if (offloads(scenario.checkpoint))  // checkpoint.offload: save_on_cpu's host copies
      header.facts.emplace_back("host memory",
                                human_bytes(program.host_offload_bytes) +
                                    " pinned at peak: saved tensors of layers " +
                                    offload_label(scenario.checkpoint) +
                                    " copied to host (save_on_cpu)");
    if (offloads_activations(scenario))  // torchtune's OffloadActivations
      header.facts.emplace_back("host memory",
                                human_bytes(program.host_offload_bytes) +
                                    " pinned at peak: checkpointed layers' inputs and the "
                                    "saves outside them copied to host (torchtune's "
                                    "OffloadActivations)");
    if (moe && !moe->experts_implementation.empty())
      header.facts.emplace_back("moe experts", moe->experts_implementation +
                                                   " (model.moe.experts_implementation; transformers "
                                                   "5.x's default when a run passes none: grouped_mm)");
    if (moe) {
      header.facts.emplace_back(
          "moe routing",
          moe->routing + " (an assumption: model.moe.routing)" +
              (moe->worst_case_run
                   ? "; worst-case routing peaks at " + human_bytes(moe->worst_peak_allocated) +
                         " allocated, " + human_bytes(moe->worst_peak_reserved) + " reserved" +
                         (moe->worst_fits ? "" : " (out of memory)")
                   : std::string()));
    }
    if (generate) header.facts.emplace_back("generate", generate_fact(scenario, generate_facts));
    header.capacity = usable_capacity(scenario.device);
    header.warmup_steps = scenario.step.warmup_steps;
    header.measured_from = measured_from;
    for (const FitsWarning& w : headroom.warnings) header.warnings.emplace_back(w.short_text, w.message);
    header.needed = needed_text(headroom);
    const Style style = Style::for_stream(stdout);
    print_summary(stdout, header, analysis, style);
    // The time model does not depend on memory: for an OOM it is the step's time as if it
    // fit (the unlimited run's), which the line says.
    print_step_time(stdout, estimate_step_time(program.cost, scenario.device), style,
                    analysis.fits() ? "" : "with unlimited memory: ");
    if (advise) print_advice(stdout, advice, args.advise, style);
    std::fflush(stdout);
  }
  return analysis.fits() ? kExitFits : kExitOom;
}

}  // namespace memsim::cli
