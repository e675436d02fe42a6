// memsim serve: a serving engine's start-up memory plan (issue #17 items 2-4; docs/serve.md).
// Scenario -> sim/serve/serve_plan.h -> the text / JSON / HTML reports of
// tools/cli/serve_report.h. Exit 0 when the engine starts, 3 when it leaves no room for
// the KV cache (or one max_model_len request), 1 on bad input.
#include <cstdio>

#include <spdlog/spdlog.h>

#include <stdexcept>

#include "sim/search/sweep.h"
#include "sim/serve/serve_plan.h"
#include "scenario/scenario.h"
#include "tools/cli/api.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/output.h"
#include "tools/cli/scenario_input.h"
#include "tools/cli/overrides.h"
#include "tools/cli/serve_report.h"

namespace memsim::cli {

CLI::App* add_serve_command(CLI::App& app, ServeArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "serve", "Plan a vLLM / SGLang server's memory: weights, profile run, KV cache blocks");
  cmd->add_option("SCENARIO", args.scenario, "Scenario file (YAML) with a serve: section, or - for standard input; optional with --model");
  cmd->add_option("--model", args.model, "A Hugging Face config.json (or its folder) to serve")
      ->type_name("CONFIG.json");
  cmd->add_option("--set", args.sets, "Override a scenario key, e.g. --set serve.max_model_len=4096")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write the JSON report to FILE ('-' for stdout)")->type_name("FILE|-");
  cmd->add_option("--html", args.html, "Write an HTML page with the KV budget to FILE")->type_name("FILE.html");
  cmd->add_flag("--max-model-len-that-fits", args.len_that_fits,
                "Print only the largest max_model_len whose one request fits the KV budget");
  cmd->add_option("--max-seqs", args.max_seqs_len,
                  "How many sequences of LEN tokens fit in the KV cache at once")
      ->type_name("LEN")
      ->check(kPositiveInteger);
  cmd->add_option("--min-tp", args.min_tp,
                  "The smallest tensor_parallel (1, 2, 4, ... up to MAX) that serves the model")
      ->type_name("MAX")
      ->expected(0, 1)
      ->default_str("8");
  cmd->add_option("--vary", args.vary,
                  "Plan once per value: KEY=V1,V2,... or KEY=A..B (e.g. serve.max_model_len, "
                  "serve.max_num_seqs, serve.tensor_parallel); repeat for a grid")
      ->type_name("KEY=VALUES")
      ->allow_extra_args(false);
  return cmd;
}

namespace {

// --vary: the grid of sim/search/sweep.h's axes, one plan per point, as a table (text) or
// an array (JSON). A point the engine refuses is a row with its error.
int run_serve_grid(const ServeArgs& args, const Overrides& base) {
  std::vector<SweepAxis> axes;
  for (const std::string& v : args.vary) {
    try {
      axes.push_back(parse_sweep_axis(v));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  // The single-plan outputs have no per-point form: refuse them rather than drop them.
  if (args.len_that_fits || args.max_seqs_len > 0 || args.min_tp.has_value() || !args.html.empty())
    throw UsageError("--vary plans a grid; --max-model-len-that-fits, --max-seqs, --min-tp and "
                     "--html answer for one plan (drop --vary, or read the rows' keys)");
  Json rows = Json::array();
  bool any_fits = false;
  std::string table = "memsim serve --vary: one plan per point\n";
  for (const SweepOverrides& point : sweep_points(axes)) {
    Overrides o = base;
    o.insert(o.end(), point.begin(), point.end());
    std::string label;
    for (const auto& [k, v] : point) label += (label.empty() ? "" : " ") + k + "=" + v;
    Json row = Json::object();
    row["point"] = label;
    try {
      Scenario s = args.model.empty() ? load_scenario_arg(args.scenario, o)
                                      : load_scenario_arg_with_model(args.scenario, args.model, o);
      s.serve.present = true;
      const serve::ServePlan plan = serve::plan_serve(s);
      row["fits"] = plan.fits;
      any_fits = any_fits || plan.fits;
      row["weights_bytes"] = plan.weights_bytes;
      row["activation_peak_bytes"] = plan.activation_peak_bytes ? Json(*plan.activation_peak_bytes) : Json(nullptr);
      row["kv_cache_bytes"] = plan.kv.kv_cache_bytes;
      row["num_gpu_blocks"] = plan.kv.num_gpu_blocks;
      row["kv_cache_tokens"] = plan.kv.kv_cache_tokens;
      row["max_concurrency"] = plan.kv.max_concurrency;
      row["max_model_len_that_fits"] = plan.kv.max_model_len_that_fits;
      char buf[256];
      std::snprintf(buf, sizeof buf, "  %-48s %12lld tokens  %8.2fx  %s\n", label.c_str(),
                    static_cast<long long>(plan.kv.kv_cache_tokens), plan.kv.max_concurrency,
                    plan.fits ? "fits" : "does not start");
      table += buf;
    } catch (const std::exception& e) {
      row["error"] = e.what();
      table += "  " + label + "  refused: " + e.what() + "\n";
    }
    rows.push_back(std::move(row));
  }
  if (!args.json.empty()) {
    Output out(args.json);
    out.write(dump_json(Json{{"points", rows}}));
    out.finish();
  }
  if (args.json != "-") std::fputs(table.c_str(), stdout);
  // As memsim sweep: 0 when at least one point's engine starts, 3 when none does.
  return any_fits ? kExitFits : kExitOom;
}

}  // namespace

serve::ServePlan plan_serve_scenario(Scenario& s) {
  if (!s.serve.present) {  // no serve: section: every key at the engine's default
    s.serve.present = true;
    s.serve.where = s.source;
  }
  return serve::plan_serve(s);
}

ServeInverse serve_inverse(const Scenario& s, const serve::ServePlan& plan, int64_t max_seqs_len,
                           std::optional<int64_t> min_tp) {
  ServeInverse inv;
  // A request longer than max_model_len never reaches the KV cache: the engine refuses it
  // ("This model's maximum context length is N tokens"), so 0 would be a wrong answer.
  if (max_seqs_len > plan.settings.max_model_len)
    throw UsageError("--max-seqs " + std::to_string(max_seqs_len) + ": longer than serve.max_model_len " +
                     std::to_string(plan.settings.max_model_len) + " (the engine refuses such requests: " +
                     "\"This model's maximum context length is " +
                     std::to_string(plan.settings.max_model_len) +
                     " tokens\"); raise serve.max_model_len with --set");
  if (max_seqs_len > 0) {
    inv.seqs_len = max_seqs_len;
    inv.seqs_that_fit = plan.available_kv_bytes > 0 ? serve::sequences_that_fit(plan, max_seqs_len) : 0;
  }
  if (min_tp.has_value()) {
    inv.min_tp_asked = true;
    // A bare --min-tp reads as 0: the default bound of 8. Sizes tried are powers of two.
    inv.min_tp_max = *min_tp > 0 ? *min_tp : 8;
    if (*min_tp < 0 || (inv.min_tp_max & (inv.min_tp_max - 1)) != 0)
      throw UsageError("--min-tp " + std::to_string(*min_tp) +
                       ": MAX must be a power of two (the sizes tried are 1, 2, 4, ... up to MAX)");
    inv.min_tp = serve::smallest_tp(s, inv.min_tp_max);
  }
  return inv;
}

int run_serve(const ServeArgs& args) {
  const Overrides overrides = parse_overrides(args.sets);
  if (args.scenario.empty() && args.model.empty())
    throw UsageError("serve needs a SCENARIO file, a --model CONFIG.json, or both");
  if (!args.json.empty() && args.json == "-" && !args.html.empty() && args.html == "-")
    throw UsageError("at most one report can be written to stdout ('-')");
  if (!args.scenario.empty() && args.scenario != "-") check_input_file(args.scenario);
  if (!args.vary.empty()) return run_serve_grid(args, overrides);
  // SCENARIO "-": standard input (tools/cli/scenario_input.h), as for every verb.
  Scenario s = args.model.empty() ? load_scenario_arg(args.scenario, overrides)
                                  : load_scenario_arg_with_model(args.scenario, args.model, overrides);
  const serve::ServePlan plan = plan_serve_scenario(s);
  spdlog::info("serve plan for '{}': {} KV tokens", s.name, plan.kv.kv_cache_tokens);
  const ServeInverse inv = serve_inverse(s, plan, args.max_seqs_len, args.min_tp);
  if (!args.json.empty()) {
    Output out(args.json);
    out.write(dump_json(serve_json(s, plan, inv)));
    out.finish();
  }
  if (!args.html.empty()) {
    Output out(args.html);
    write_serve_html(out.file(), s, plan);
    out.finish();
  }
  if (args.json != "-" && args.html != "-") {
    if (args.len_that_fits) std::printf("%lld\n", static_cast<long long>(plan.kv.max_model_len_that_fits));
    else write_serve_text(stdout, s, plan, inv);
    std::fflush(stdout);
  }
  return plan.fits ? kExitFits : kExitOom;
}

}  // namespace memsim::cli
