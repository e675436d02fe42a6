// memsim optimize: the least-recompute checkpointing plan that fits a memory budget
// (sim/search/optimize.h); with --objective, the configuration search over micro-batch,
// optimizer, loss chunking, expandable segments and activation offload
// (sim/search/config_search.h), with its Pareto front.
#include <algorithm>
#include <cstdio>
#include <string>

#include "allocator/units.h"
#include "scenario/loss_impl.h"
#include "scenario/offload_keys.h"
#include "sim/megatron/megatron_recompute_flags.h"
#include "sim/search/config_search.h"
#include "sim/search/optimize.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/errors.h"
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

double share(const Flops& f) {
  const double total = f.forward + f.backward + f.recompute;
  return total > 0 ? f.recompute / total : 0.0;
}

// A named policy that won (sim/search/named_policies.h) is named before its layers.
std::string plan_summary(const OptimizeResult& r) {
  return r.named_policy.empty() ? describe_plan(r.plan)
                                : "policy " + r.named_policy + " (" + describe_plan(r.plan) + ")";
}

Json plan_json(const OptimizeResult& r) {
  Json layers = Json::array();
  for (graph::LayerCheckpoint c : r.plan.layers) layers.push_back(graph::to_string(c));
  const CheckpointConfig& config = r.checkpoint;
  Json checkpoint = {{"policy", to_string(config.policy)}, {"custom", config.custom}};
  if (!r.named_policy.empty()) checkpoint["spec"] = policy_label(config);
  Json j = {{"layers", std::move(layers)},
            {"summary", plan_summary(r)},
            {"checkpoint", std::move(checkpoint)}};
  if (!r.named_policy.empty()) j["named_policy"] = r.named_policy;
  return j;
}

// Pipeline scenarios: every stage's peaks with the plan (sim/search/optimize_pipeline.h).
Json stages_json(const OptimizeResult& r) {
  Json stages = Json::array();
  for (const StagePeak& s : r.stages)
    stages.push_back({{"stage", s.stage},
                      {"peak_allocated_bytes", s.peak_allocated},
                      {"peak_reserved_bytes", s.peak_reserved},
                      {"fits", s.fits},
                      {"recompute_flops", s.flops.recompute}});
  return {{"worst_stage", r.worst_stage},
          {"recompute_flops", r.flops.recompute},
          {"plan_applies_to", "every stage's local layers (checkpoint.custom numbers each "
                              "stage's chunk from 0, as Megatron's recompute settings do)"},
          {"stages", std::move(stages)}};
}

}  // namespace

CLI::App* add_optimize_command(CLI::App& app, OptimizeArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "optimize", "Find the checkpointing plan with the least recompute that fits a budget");
  cmd->add_option("SCENARIO", args.scenario, "Scenario file (YAML), or - for standard input")
      ->required();
  cmd->add_option("--budget", args.budget,
                  "Memory the caching allocator may reserve at most, e.g. 40GiB")
      ->required();
  cmd->add_option("--set", args.sets, "Override a scenario key, e.g. --set batch.micro_batch=8")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write the result as JSON to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("--objective", args.objective,
                  "Search micro-batch x gradient accumulation and the optimizer implementation "
                  "too, choosing the least step time or the least peak reserved")
      ->check(CLI::IsMember({"time", "memory"}));
  cmd->add_option("--global-batch", args.global_batch,
                  "Sequences per optimizer step for --objective (default: batch.micro_batch x "
                  "batch.grad_accum)")
      ->check(kPositiveInteger);
  cmd->add_option("--micro-batches", args.micro_batches,
                  "Micro-batches --objective tries (default: every divisor of the global batch)")
      ->delimiter(',')
      ->check(kPositiveInteger);
  cmd->footer("Exit status: 0 a plan fits the budget, 3 nothing fits, 1 bad input, 2 bad usage.");
  return cmd;
}

namespace {

std::string impl_name(OptimizerImpl impl) { return to_string(impl); }

// The optimizer a candidate runs: torch's implementation, or bitsandbytes' 8-bit type.
std::string optimizer_name(const ConfigCandidate& c) {
  return c.optimizer_type == OptimizerType::adam8bit || c.optimizer_type == OptimizerType::adamw8bit
             ? std::string(to_string(c.optimizer_type))
             : impl_name(c.optimizer);
}

// --objective: the configuration search (sim/search/config_search.h).
int run_config_search(const OptimizeArgs& args, const Scenario& scenario, uint64_t budget) {
  const int64_t global = args.global_batch > 0 ? args.global_batch
                                               : scenario.batch.micro_batch * std::max<int64_t>(1, scenario.batch.grad_accum);
  for (int64_t m : args.micro_batches)
    if (global % m != 0)
      throw UsageError("--micro-batches: " + std::to_string(m) + " does not divide the global batch " +
                       std::to_string(global) + " (--global-batch, or batch.micro_batch x batch.grad_accum)");
  const Objective objective = args.objective == "time" ? Objective::time : Objective::memory;
  const ConfigSearch r = search_configurations(scenario, budget, objective, global, args.micro_batches);
  if (!args.json.empty()) {
    Json j = Json::object();
    j["scenario"] = scenario.name;
    j["scenario_file"] = scenario.source;
    j["budget_bytes"] = budget;
    j["objective"] = args.objective;
    j["global_batch"] = r.global_batch;
    j["found"] = r.chosen >= 0;
    j["chosen"] = r.chosen >= 0 ? Json(r.chosen) : Json(nullptr);
    j["why"] = r.why;
    Json list = Json::array();
    for (const ConfigCandidate& c : r.candidates) {
      Json e = Json::object();
      e["micro_batch"] = c.micro_batch;
      e["grad_accum"] = c.grad_accum;
      e["optimizer_impl"] = impl_name(c.optimizer);
      e["optimizer_type"] = to_string(c.optimizer_type);
      e["loss_impl"] = loss_impl_label(c.loss);
      e["expandable_segments"] = c.expandable_segments;
      e["axis"] = c.axis.empty() ? Json(nullptr) : Json(c.axis);
      e["host_offload_bytes"] = c.host_offload_bytes;
      e["fits"] = c.result.fits;
      e["plan"] = plan_json(c.result);
      e["peak_reserved_bytes"] = c.result.run.analysis.peak_reserved;
      e["peak_allocated_bytes"] = c.result.run.analysis.peak_allocated;
      e["estimated_step_seconds"] = c.result.fits ? step_time_json(c.time) : Json(nullptr);
      e["pareto"] = c.pareto;
      list.push_back(std::move(e));
    }
    j["configurations"] = std::move(list);
    // The Pareto front (peak reserved vs step seconds), by peak ascending: indices.
    std::vector<size_t> front;
    for (size_t i = 0; i < r.candidates.size(); ++i)
      if (r.candidates[i].pareto) front.push_back(i);
    std::sort(front.begin(), front.end(), [&](size_t a, size_t b) {
      return r.candidates[a].result.run.analysis.peak_reserved < r.candidates[b].result.run.analysis.peak_reserved;
    });
    j["pareto"] = front;
    Output out(args.json);
    out.write(dump_json(j));
    out.finish();
  }
  if (args.json != "-") {
    const Style style = Style::for_stream(stdout);
    std::printf("%s\n", style.bold(scenario.name.empty() ? scenario.source : scenario.name).c_str());
    for (const auto& [label, text] : scenario_facts(scenario))
      std::printf("  %-9s %s\n", label.c_str(), text.c_str());
    std::printf("  budget    %s (what the caching allocator may reserve); global batch %lld; "
                "objective %s\n\n",
                human_bytes(budget).c_str(), static_cast<long long>(r.global_batch), args.objective.c_str());
    std::printf("  %-5s %-6s %-9s %-20s %-8s %14s %12s  %s\n", "micro", "accum", "optim", "axis",
                "verdict", "peak reserved", "step time", "plan");
    for (size_t i = 0; i < r.candidates.size(); ++i) {
      const ConfigCandidate& c = r.candidates[i];
      const char* mark = static_cast<int>(i) == r.chosen ? " <- chosen" : c.pareto ? " (Pareto)" : "";
      std::printf("  %-5lld %-6lld %-9s %-20s %-8s %14s %12s  %s%s\n", static_cast<long long>(c.micro_batch),
                  static_cast<long long>(c.grad_accum), optimizer_name(c).c_str(),
                  c.axis.empty() ? "-" : c.axis.c_str(),
                  c.result.fits ? "fits" : "OOM", human_bytes(c.result.run.analysis.peak_reserved).c_str(),
                  c.result.fits && c.time.estimated ? human_seconds(c.time.seconds).c_str() : "-",
                  plan_summary(c.result).c_str(), mark);
    }
    // The Pareto front, by peak reserved: what each step of memory buys in time.
    std::vector<size_t> front;
    for (size_t i = 0; i < r.candidates.size(); ++i)
      if (r.candidates[i].pareto) front.push_back(i);
    std::sort(front.begin(), front.end(), [&](size_t a, size_t b) {
      return r.candidates[a].result.run.analysis.peak_reserved < r.candidates[b].result.run.analysis.peak_reserved;
    });
    if (!front.empty()) {
      std::printf("\n  Pareto front (peak reserved vs step time):\n");
      for (size_t i : front) {
        const ConfigCandidate& c = r.candidates[i];
        std::printf("    %14s %12s  micro %lld x %lld, %s%s%s\n",
                    human_bytes(c.result.run.analysis.peak_reserved).c_str(),
                    human_seconds(c.time.seconds).c_str(), static_cast<long long>(c.micro_batch),
                    static_cast<long long>(c.grad_accum), optimizer_name(c).c_str(),
                    c.axis.empty() ? "" : (", " + c.axis).c_str(),
                    static_cast<int>(i) == r.chosen ? "  <- chosen" : "");
      }
    }
    if (r.chosen >= 0) {
      const ConfigCandidate& c = r.candidates[static_cast<size_t>(r.chosen)];
      std::printf("\n%s  micro-batch %lld x %lld accumulation, optimizer %s%s, %s\n", style.good("CHOSEN").c_str(),
                  static_cast<long long>(c.micro_batch), static_cast<long long>(c.grad_accum),
                  optimizer_name(c).c_str(), c.axis.empty() ? "" : (", " + c.axis).c_str(),
                  plan_summary(c.result).c_str());
      if (c.host_offload_bytes > 0)
        std::printf("  host: %s pinned for the offloaded activations\n", human_bytes(c.host_offload_bytes).c_str());
      std::printf("  why: %s\n  step %s; peak reserved %s\n", r.why.c_str(), step_time_text(c.time).c_str(),
                  human_bytes(c.result.run.analysis.peak_reserved).c_str());
    } else {
      std::printf("\n%s  %s\n", style.bad("NO PLAN").c_str(), r.why.c_str());
    }
    std::fflush(stdout);
  }
  return r.chosen >= 0 ? kExitFits : kExitOom;
}

}  // namespace

int run_optimize(const OptimizeArgs& args) {
  const auto budget = parse_size(args.budget);
  if (!budget || *budget == 0)
    throw UsageError("--budget: expected a size such as 40GiB, 500MiB or bytes, got '" +
                     args.budget + "'");
  const Overrides overrides = parse_overrides(args.sets);
  const Scenario scenario = load_scenario_arg(args.scenario, overrides);
  // A budget the device cannot give is a mistake, not a search (issue #18: bad input).
  if (const auto usable = usable_capacity(scenario.device); usable && *budget > *usable)
    throw UsageError("--budget: " + human_bytes(*budget) + " is more than the device leaves the "
                     "allocator (" + human_bytes(*usable) + ": device.capacity less device.cuda_context)");
  // The plan search rebuilds the checkpoint section per plan: a scenario's own offload would
  // be dropped silently, so it is refused (--objective searches offload as an axis).
  if (offloads(scenario.checkpoint))
    throw ScenarioError((scenario.checkpoint.offload_where.empty() ? scenario.source : scenario.checkpoint.offload_where) +
                        ": checkpoint.offload: memsim optimize searches "
                        "checkpoint plans without offload and tries offload itself with "
                        "--objective; remove checkpoint.offload");
  if (!args.objective.empty()) return run_config_search(args, scenario, *budget);
  const OptimizeResult r = optimize_checkpointing(scenario, default_script(scenario), *budget);
  const Analysis& a = r.run.analysis;

  if (!args.json.empty()) {
    Json j = Json::object();
    j["scenario"] = scenario.name;
    j["scenario_file"] = scenario.source;
    j["budget_bytes"] = *budget;
    j["found"] = r.fits;
    j["plan"] = plan_json(r);
    j["recompute_share"] = share(r.flops);
    j["model_peak_bytes"] = r.model_peak;
    j["verifications"] = r.verifications;
    j["timing_ms"] = {{"calibrate", r.calibrate_ms}, {"search", r.search_ms},
                      {"verify", r.verify_ms}};
    if (!r.stages.empty()) j["pipeline"] = stages_json(r);
    if (scenario.model.family == ModelFamily::megatron) {
      const auto flags = megatron_recompute_flags(r.plan);
      j["megatron_flags"] = flags ? Json(*flags) : Json(nullptr);
    }
    Json summary = analysis_json(a);
    for (auto& [key, value] : summary.items()) j[key] = std::move(value);
    j["memory_stats"] = memory_stats_json(r.run.stats);
    Output out(args.json);
    out.write(dump_json(j));
    out.finish();
  }
  if (args.json != "-") {
    const Style style = Style::for_stream(stdout);
    std::printf("%s\n",
                style.bold(printable(scenario.name.empty() ? scenario.source : scenario.name)).c_str());
    for (const auto& [label, text] : scenario_facts(scenario))
      std::printf("  %-9s %s\n", label.c_str(), text.c_str());
    std::printf("  budget    %s (what the caching allocator may reserve)\n\n",
                human_bytes(*budget).c_str());
    if (r.fits) {
      std::printf("%s  %s\n", style.good("PLAN").c_str(), plan_summary(r).c_str());
      std::printf("  peak reserved %s, peak allocated %s%s (simulated through the allocator)\n",
                  human_bytes(a.peak_reserved).c_str(), human_bytes(a.peak_allocated).c_str(),
                  r.stages.empty() ? ""
                                   : (" on stage " + std::to_string(r.worst_stage) + ", the worst")
                                         .c_str());
    } else {
      std::printf("%s  nothing fits in %s: the smallest peak is %s reserved with plan %s\n",
                  style.bad("NO PLAN").c_str(), human_bytes(*budget).c_str(),
                  human_bytes(a.peak_reserved).c_str(), plan_summary(r).c_str());
    }
    if (!r.stages.empty()) {
      // Every stage runs the plan on its own layers; the budget holds on each.
      std::printf("  plan applies to each stage's %zu local layers; peak reserved by stage "
                  "(the worst is stage %lld):\n",
                  r.plan.layers.size(), static_cast<long long>(r.worst_stage));
      for (const StagePeak& s : r.stages)
        std::printf("    stage %-3lld %s reserved, %s allocated%s\n",
                    static_cast<long long>(s.stage), human_bytes(s.peak_reserved).c_str(),
                    human_bytes(s.peak_allocated).c_str(), s.fits ? "" : "  (out of memory)");
    }
    std::printf("  recompute %s = %.1f%% of the step's FLOPs%s\n",
                human_flops(r.flops.recompute).c_str(), 100.0 * share(r.flops),
                r.stages.empty() ? "" : " (all stages)");
    const CheckpointConfig& config = r.checkpoint;
    if (!r.named_policy.empty())
      std::printf("  scenario: checkpoint.policy=%s", policy_label(config).c_str());
    else
      std::printf("  scenario: checkpoint.policy=%s", to_string(config.policy));
    if (r.named_policy.empty() && !config.custom.empty()) {
      std::printf(" checkpoint.custom=[");
      for (size_t i = 0; i < config.custom.size(); ++i)
        std::printf("%s%s", i ? "," : "", config.custom[i].c_str());
      std::printf("]");
    }
    if (scenario.model.family == ModelFamily::megatron) {
      const auto flags = megatron_recompute_flags(r.plan);
      if (!flags)
        std::printf("\n  megatron: no stock recompute flags give this per-layer mix (selective "
                    "and full/block apply one granularity to every local layer)");
      else
        std::printf("\n  megatron: %s", flags->empty() ? "no recompute flags" : flags->c_str());
    }
    std::printf("\n  search: %d plan(s) simulated; calibrate %.0f ms, search %.1f ms, verify %.0f ms\n",
                r.verifications, r.calibrate_ms, r.search_ms, r.verify_ms);
    std::fflush(stdout);
  }
  return r.fits ? kExitFits : kExitOom;
}

}  // namespace memsim::cli
