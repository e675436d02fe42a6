#include "tools/cli/advice_report.h"

#include <algorithm>
#include <new>

#include "allocator/units.h"
#include "sim/analysis/headroom.h"
#include "sim/search/sweep.h"
#include "sim/step/execute.h"
#include "tools/cli/api.h"
#include "tools/cli/device.h"
#include "tools/cli/plain_run.h"
#include "tools/cli/step_time_report.h"

namespace memsim::cli {

namespace {

AdviceResult simulate(const AdviceCandidate& candidate, const AdviceLoader& load) {
  AdviceResult r;
  r.candidate = candidate;
  try {
    const Scenario s = load(candidate.sets);
    // A plain run (tools/cli/plain_run.h): streamed, stopped at its first OOM, the needed
    // bytes and the step's time from one complete streamed build; no live set is read.
    GenerateFacts facts;
    const PlainRun run = run_plain(s, facts, /*live_set=*/false);
    const Analysis& a = run.analysis;
    r.fits = a.fits();
    r.peak_allocated = a.peak_allocated;
    r.peak_reserved = a.peak_reserved;
    r.time = estimate_step_time(run.program.cost, s.device);
    if (!r.fits) r.needed = run.needed;
    r.ok = true;
  } catch (const std::bad_alloc&) {
    // One candidate's simulation exhausted host memory: skip it, the others stand.
    r.ok = false;
    r.refused = "simulating it ran out of host memory";
  } catch (const std::exception& e) {
    r.ok = false;
    r.refused = e.what();
  }
  return r;
}

// The order of run_advice's result: fitting first by peak reserved, then by needed bytes.
bool better(const AdviceResult& a, const AdviceResult& b) {
  if (a.ok != b.ok) return a.ok;
  if (!a.ok) return false;
  if (a.fits != b.fits) return a.fits;
  if (a.fits) return a.peak_reserved < b.peak_reserved;
  return a.needed.value_or(UINT64_MAX) < b.needed.value_or(UINT64_MAX);
}

std::string sets_text(const AdviceCandidate& c) {
  std::string s;
  for (const auto& [key, value] : c.sets) s += (s.empty() ? "" : " ") + ("--set " + key + "=" + value);
  return s;
}

Json sets_json(const AdviceCandidate& c) {
  Json j = Json::object();
  for (const auto& [key, value] : c.sets) j[key] = value;
  return j;
}

}  // namespace

std::vector<AdviceResult> run_advice(const std::vector<AdviceCandidate>& candidates,
                                     const AdviceLoader& load, unsigned threads) {
  std::vector<AdviceResult> results(candidates.size());
  run_parallel(
      candidates.size(), [&](size_t i) { results[i] = simulate(candidates[i], load); }, threads);
  std::stable_sort(results.begin(), results.end(), better);
  return results;
}

void add_advice_json(Json& run, const std::vector<AdviceResult>& results) {
  Json advice = Json::array(), skipped = Json::array();
  for (const AdviceResult& r : results) {
    if (!r.ok) {
      skipped.push_back({{"change", r.candidate.change}, {"set", sets_json(r.candidate)}, {"reason", r.refused}});
      continue;
    }
    advice.push_back({{"change", r.candidate.change},
                      {"set", sets_json(r.candidate)},
                      {"peak_reserved_bytes", r.peak_reserved},
                      {"peak_allocated_bytes", r.peak_allocated},
                      {"fits", r.fits},
                      {"needed_bytes", r.needed ? Json(*r.needed) : Json(nullptr)},
                      {"estimated_step_seconds", r.time.estimated ? Json(r.time.seconds) : Json(nullptr)}});
  }
  run["advice"] = std::move(advice);
  run["advice_skipped"] = std::move(skipped);
}

namespace {
// The simulated entries a report shows: all of them (full) or the first kShortAdvice.
std::vector<const AdviceResult*> shown_entries(const std::vector<AdviceResult>& results, bool full) {
  std::vector<const AdviceResult*> shown;
  for (const AdviceResult& r : results)
    if (r.ok && (full || shown.size() < kShortAdvice)) shown.push_back(&r);
  return shown;
}
}  // namespace

std::vector<std::string> advice_lines(const std::vector<AdviceResult>& results, bool full) {
  std::vector<std::string> lines;
  for (const AdviceResult* r : shown_entries(results, full)) {
    std::string s = r->candidate.change + ": ";
    s += r->fits ? "fits, peak reserved " + human_bytes(r->peak_reserved)
                 : "out of memory, needs " + (r->needed ? human_bytes(*r->needed) : std::string("?"));
    if (r->time.estimated) s += ", step " + human_seconds(r->time.seconds);
    lines.push_back(s + " (" + sets_text(r->candidate) + ")");
  }
  return lines;
}

void print_advice(std::FILE* out, const std::vector<AdviceResult>& results, bool full,
                  const Style& style) {
  const std::vector<const AdviceResult*> shown = shown_entries(results, full);
  size_t refused = 0;
  for (const AdviceResult& r : results) refused += !r.ok;
  std::fprintf(out, "\n%s  %s\n", style.bold("ADVICE").c_str(),
               shown.empty() ? "no change memsim can simulate applies to this scenario"
                             : "each change simulated (memsim run ... --set KEY=VALUE), best first");
  if (!shown.empty()) {
    // One memory column: the peak reserved of a change that fits, the needed bytes (peak
    // reserved with unlimited memory) of one that does not.
    std::vector<std::vector<std::string>> rows = {{"peak reserved", "verdict", "step time", "change"}};
    for (const AdviceResult* r : shown) {
      rows.push_back({r->fits ? human_bytes(r->peak_reserved) : r->needed ? human_bytes(*r->needed) : "?",
                      r->fits ? "fits" : "OOM",
                      r->time.estimated ? human_seconds(r->time.seconds) : "-",
                      r->candidate.change + ": " + sets_text(r->candidate)});
    }
    std::vector<size_t> width(4, 0);
    for (const auto& row : rows)
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& row = rows[i];
      std::string line = "  " + std::string(width[0] - row[0].size(), ' ') + row[0] + "  " + row[1] +
                         std::string(width[1] - row[1].size(), ' ') + "  " +
                         std::string(width[2] - row[2].size(), ' ') + row[2] + "  " + row[3];
      if (i == 0) line = style.bold(line);
      else if (shown[i - 1]->fits) line = style.good(line);
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
  bool any_oom = false;
  for (const AdviceResult* r : shown) any_oom = any_oom || !r->fits;
  if (any_oom)
    std::fprintf(out, "  %s\n", style.dim("(OOM: the change's peak reserved with unlimited memory)").c_str());
  size_t ok = 0;
  for (const AdviceResult& r : results) ok += r.ok;
  if (!full && ok > shown.size())
    std::fprintf(out, "  (%zu more; memsim run --advise lists every change)\n", ok - shown.size());
  if (full && refused > 0) {
    std::fprintf(out, "  %s\n", style.dim("not simulated, memsim refuses them for this scenario:").c_str());
    for (const AdviceResult& r : results)
      if (!r.ok) {
        std::string why = r.refused;
        if (why.size() > 160) why = why.substr(0, 157) + "...";
        std::fprintf(out, "    %s (%s): %s\n", r.candidate.change.c_str(), sets_text(r.candidate).c_str(),
                     why.c_str());
      }
  }
}

}  // namespace memsim::cli
