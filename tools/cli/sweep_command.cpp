// memsim sweep: one scenario over the cartesian product of --vary overrides, in
// parallel (sim/search/sweep.h), or with --max KEY the largest value of KEY that fits for each
// combination of the other --vary keys.
#include <chrono>
#include <limits>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "allocator/units.h"
#include "sim/search/max_keys.h"
#include "sim/search/sweep.h"
#include "sim/search/sweep_grid.h"
#include "tools/cli/api.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/json_report.h"
#include "tools/cli/output.h"
#include "tools/cli/overrides.h"
#include "tools/cli/progress.h"
#include "tools/cli/scenario_input.h"
#include "tools/cli/style.h"

namespace memsim::cli {

namespace {

void print_rows(std::FILE* out, const std::vector<std::vector<std::string>>& rows,
                size_t right_from, size_t right_to, const Style& style) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line = "  ";
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const bool last = c + 1 == rows[r].size();
      const std::string pad(last ? 0 : width[c] - rows[r][c].size(), ' ');
      const bool right = c >= right_from && c < right_to;
      line += right ? pad + rows[r][c] : rows[r][c] + pad;
      if (!last) line += "  ";
    }
    std::fprintf(out, "%s\n", r == 0 ? style.bold(line).c_str() : line.c_str());
  }
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

Json values_json(const SweepOverrides& point) {
  Json v = Json::object();
  for (const auto& [key, value] : point) v[key] = value;
  return v;
}

void write_to(const std::string& path, const std::string& text) {
  Output out(path);
  out.write(text);
  out.finish();
}

// One CSV row per point: the axes' values, then `row_tail(i)` (which ends the line).
template <typename RowTail>
std::string points_csv(const std::vector<SweepAxis>& axes,
                       const std::vector<SweepOverrides>& points, const char* header_tail,
                       RowTail row_tail) {
  std::string text;
  for (const SweepAxis& a : axes) text += csv_field(a.key) + ",";
  text += header_tail;
  for (size_t i = 0; i < points.size(); ++i) {
    for (const auto& kv : points[i]) text += csv_field(kv.second) + ",";
    text += row_tail(i);
  }
  return text;
}

// The human table on stdout: the axes' values, then `row_tail(i)`'s cells; the two
// columns after the axes are right-aligned (numbers).
template <typename RowTail>
void print_points(const std::vector<SweepAxis>& axes, const std::vector<SweepOverrides>& points,
                  const std::vector<std::string>& tail_headers, RowTail row_tail) {
  std::vector<std::vector<std::string>> rows(1);
  for (const SweepAxis& a : axes) rows[0].push_back(a.key);
  for (const std::string& h : tail_headers) rows[0].push_back(h);
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<std::string> row;
    for (const auto& kv : points[i]) row.push_back(kv.second);
    for (std::string& cell : row_tail(i)) row.push_back(std::move(cell));
    rows.push_back(std::move(row));
  }
  print_rows(stdout, rows, axes.size(), axes.size() + 2, Style::for_stream(stdout));
  std::fflush(stdout);
}

int run_grid(const SweepArgs& args, const SweepRunner& runner, const std::vector<SweepAxis>& axes,
             unsigned threads) {
  const std::vector<SweepOverrides> points = sweep_points(axes);
  Progress progress("sweep");
  const auto t0 = std::chrono::steady_clock::now();
  // The text table and the CSV show peaks and verdicts; only the JSON shows live sets.
  const std::vector<SweepResult> results = run_sweep_grid(
      runner, points, threads, [&](size_t done, size_t total) { progress(done, total); },
      !args.json.empty());
  spdlog::info("sweep: {} points in {:.2f} s", points.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  if (!args.json.empty()) write_to(args.json, dump_json(sweep_grid_json(runner, points, results)));
  if (!args.csv.empty()) {
    write_to(args.csv,
             points_csv(axes, points,
                        "peak_allocated_bytes,peak_reserved_bytes,peak_requested_bytes,fits,"
                        "verdict\n",
                        [&](size_t i) {
                          const SweepResult& r = results[i];
                          const std::string peaks =
                              r.ok ? std::to_string(r.analysis.peak_allocated) + "," +
                                         std::to_string(r.analysis.peak_reserved) + "," +
                                         std::to_string(r.analysis.peak_requested) + ","
                                   : std::string(",,,");
                          return peaks + (r.fits() ? "true" : "false") + "," +
                                 csv_field(sweep_verdict(r)) + "\n";
                        }));
  }
  if (args.json != "-" && args.csv != "-") {
    print_points(axes, points, {"peak allocated", "peak reserved", "verdict"}, [&](size_t i) {
      const SweepResult& r = results[i];
      return std::vector<std::string>{r.ok ? human_bytes(r.analysis.peak_allocated) : "-",
                                      r.ok ? human_bytes(r.analysis.peak_reserved) : "-",
                                      sweep_verdict(r)};
    });
  }
  // Exit 3 when no point fits, as compare and optimize do (errors.h).
  for (const SweepResult& r : results)
    if (r.fits()) return kExitFits;
  return kExitOom;
}

int run_max(const SweepArgs& args, const SweepRunner& runner, const std::vector<SweepAxis>& axes,
            unsigned threads) {
  const std::vector<SweepOverrides> points = sweep_points(axes);
  Progress progress("sweep --max " + args.max);
  const std::vector<MaxSearch> results = run_sweep_max(
      runner, points, args.max, threads, [&](size_t done, size_t total) { progress(done, total); });

  if (!args.json.empty()) write_to(args.json, dump_json(sweep_max_json(runner, args.max, points, results)));
  if (!args.csv.empty()) {
    write_to(args.csv, points_csv(axes, points, "largest_fit,first_failure,failure,evaluations\n",
                                  [&](size_t i) {
                                    const MaxSearch& m = results[i];
                                    return (m.largest_fit ? std::to_string(*m.largest_fit) : "") +
                                           "," +
                                           (m.first_failure ? std::to_string(*m.first_failure)
                                                            : "") +
                                           "," + csv_field(m.failure) + "," +
                                           std::to_string(m.evaluations) + "\n";
                                  }));
  }
  if (args.json != "-" && args.csv != "-") {
    print_points(axes, points, {"largest " + args.max, "first failing", "why"}, [&](size_t i) {
      const MaxSearch& m = results[i];
      return std::vector<std::string>{
          m.largest_fit ? std::to_string(*m.largest_fit) : "none",
          m.first_failure ? std::to_string(*m.first_failure) : "none found",
          m.first_failure ? m.failure : ""};
    });
  }
  // Exit 3 when not even the smallest value fits at any point.
  for (const MaxSearch& m : results)
    if (m.largest_fit) return kExitFits;
  return kExitOom;
}

}  // namespace

CLI::App* add_sweep_command(CLI::App& app, SweepArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Simulate a scenario over a grid of overrides, or find the largest value that fits");
  cmd->add_option("SCENARIO", args.scenario, "Scenario file (YAML), or - for standard input")
      ->required();
  cmd->add_option("--vary", args.vary,
                  "Vary a scenario key over values (A..B: an integer range, A..B..STEP: every STEP-th), e.g. "
                  "--vary batch.micro_batch=1,2,4,8; repeat for a grid")
      ->type_name("KEY=V1,V2,...")
      ->allow_extra_args(false);
  cmd->add_option("--max", args.max,
                  "Find the largest integer KEY that fits, for each combination of the --vary keys")
      ->type_name("KEY");
  cmd->add_option("--set", args.sets, "Override a scenario key for every point")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--json", args.json, "Write one JSON summary per point to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("--csv", args.csv, "Write one CSV row per point to FILE ('-' for stdout)")
      ->type_name("FILE|-");
  cmd->add_option("-j,--threads", args.threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->footer("Exit status: 0 when at least one point fits (with --max: has a largest fit), 3 when none does, 1 bad input, 2 bad usage. Progress goes to stderr once a sweep runs longer than a second.");
  return cmd;
}

std::vector<SweepAxis> parse_sweep_axes(const std::vector<std::string>& vary, const std::string& max) {
  if (!max.empty())  // loop counts cannot change memory (sim/search/max_keys.h)
    if (const std::string why = max_key_refusal(max); !why.empty()) throw UsageError("--max " + max + ": " + why);
  std::vector<SweepAxis> axes;
  for (const std::string& v : vary) {
    try {
      axes.push_back(parse_sweep_axis(v));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (axes.back().key == max)
      throw UsageError("--max " + max + " is searched: it cannot also be given to --vary");
    for (size_t i = 0; i + 1 < axes.size(); ++i)
      if (axes[i].key == axes.back().key)
        throw UsageError("--vary " + axes.back().key + " is given twice");
  }
  // Every point's result is kept for the table: bound the grid before building it.
  constexpr size_t kMaxPoints = 1'000'000;
  size_t points = 1;
  for (const SweepAxis& a : axes) {
    points *= a.values.size();
    if (points > kMaxPoints)
      throw UsageError("--vary: the grid has more than " + std::to_string(kMaxPoints) +
                       " points; sweep fewer values");
  }
  return axes;
}

std::vector<SweepResult> run_sweep_grid(const SweepRunner& runner,
                                        const std::vector<SweepOverrides>& points, unsigned threads,
                                        const SweepProgress& progress, bool live_sets) {
  SweepEvaluateOptions options;
  options.analysis.live_set = live_sets;
  return evaluate_grid(runner, points, threads, progress, options);  // sim/search/sweep_grid.h
}

Json sweep_grid_json(const SweepRunner& runner, const std::vector<SweepOverrides>& points,
                     const std::vector<SweepResult>& results) {
  Json j = Json::object();
  j["scenario_file"] = runner.source();
  Json list = Json::array();
  for (size_t i = 0; i < points.size(); ++i) {
    Json p = Json::object();
    p["values"] = values_json(points[i]);
    p["error"] = results[i].ok ? Json(nullptr) : Json(results[i].error);
    if (results[i].ok) {
      Json summary = analysis_json(results[i].analysis);
      for (auto& [key, value] : summary.items()) p[key] = std::move(value);
    }
    list.push_back(std::move(p));
  }
  j["points"] = std::move(list);
  return j;
}

std::vector<MaxSearch> run_sweep_max(const SweepRunner& runner,
                                     const std::vector<SweepOverrides>& points,
                                     const std::string& max_key, unsigned threads,
                                     const SweepProgress& progress) {
  std::vector<MaxSearch> results(points.size());
  // One search per worker when there are enough of them; otherwise one search at a time,
  // each probing ahead on every worker (find_max's speculation). Same results either way.
  const unsigned workers = worker_count(threads, std::numeric_limits<size_t>::max());
  std::vector<SweepWorkspace> spaces(workers);  // one per worker
  if (points.size() >= workers) {
    run_parallel_workers(
        points.size(),
        [&](size_t i, unsigned worker) {
          results[i] = find_max(runner, points[i], max_key, spaces[worker]);
        },
        threads, progress);
  } else {
    for (size_t i = 0; i < points.size(); ++i) {
      results[i] = find_max(runner, points[i], max_key, spaces.data(), spaces.size());
      if (progress) progress(i + 1, points.size());
    }
  }
  return results;
}

Json sweep_max_json(const SweepRunner& runner, const std::string& max_key,
                    const std::vector<SweepOverrides>& points, const std::vector<MaxSearch>& results) {
  auto opt = [](const std::optional<int64_t>& v) { return v ? Json(*v) : Json(nullptr); };
  Json j = Json::object();
  j["scenario_file"] = runner.source();
  j["max_key"] = max_key;
  Json list = Json::array();
  for (size_t i = 0; i < points.size(); ++i) {
    const MaxSearch& m = results[i];
    list.push_back({{"values", values_json(points[i])},
                    {"largest_fit", opt(m.largest_fit)},
                    {"first_failure", opt(m.first_failure)},
                    {"failure", m.first_failure ? Json(m.failure) : Json(nullptr)},
                    {"evaluations", m.evaluations}});
  }
  j["points"] = std::move(list);
  return j;
}

int run_sweep(const SweepArgs& args) {
  if (args.json == "-" && args.csv == "-")
    throw UsageError("--json - and --csv - cannot both write to stdout");
  if (args.vary.empty() && args.max.empty())
    throw UsageError("sweep needs --vary KEY=V1,V2,... or --max KEY");
  const std::vector<SweepAxis> axes = parse_sweep_axes(args.vary, args.max);
  const SweepRunner runner = sweep_runner_arg(args.scenario, parse_overrides(args.sets));
  const unsigned threads = static_cast<unsigned>(args.threads);
  return args.max.empty() ? run_grid(args, runner, axes, threads)
                          : run_max(args, runner, axes, threads);
}

}  // namespace memsim::cli
