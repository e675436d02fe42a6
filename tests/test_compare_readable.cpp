// `memsim compare` people can read (issue #18 item 3): the row per policy shared by the
// text table, the JSON "rows" and the HTML table (tools/cli/compare_rows.h), and the HTML
// page's phase-aligned axis, staggered OOM labels, reserved curves and table
// (tools/cli/compare_html.h).
#include <catch2/catch.hpp>

#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "scenario/scenario_checkpoint.h"
#include "sim/step/schedule.h"
#include "tools/cli/api.h"
#include "tools/cli/compare_html.h"
#include "tools/cli/compare_rows.h"
#include "tools/cli/device.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "tools/cli/html_report.h"

using namespace memsim;
using namespace memsim::cli;

namespace {

std::string yaml(uint64_t capacity) {
  return "model:\n  family: hf-llama\n  layers: 4\n  d_model: 128\n  heads: 4\n  d_ff: 256\n"
         "  vocab: 512\n  context_length: 256\nbatch:\n  micro_batch: 4\n  seq_len: 256\n"
         "optimizer:\n  type: adamw\ndevice:\n  preset: h100-80gb\n  capacity: " +
         std::to_string(capacity) + "\n  cuda_context: 0\n";
}

struct Compared {
  std::vector<PolicyRun> runs;
  std::vector<HtmlCurve> curves;
};

Compared compare(uint64_t capacity, const std::string& policies) {
  const Scenario base = load_scenario_text(yaml(capacity), "compare.yaml");
  Compared c;
  c.runs = run_policies(base, parse_policy_list(policies, base),
                        [&](const Program& p, const Timeline& t, const PolicyRun& r) {
                          c.curves.push_back(downsample_timeline(p, t, r.analysis, r.label));
                        });
  return c;
}

std::string html_of(const Compared& c) {
  HtmlReport report;
  report.title = "compare";
  report.curves = c.curves;
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  write_compare_html(f, report, compare_rows(c.runs));
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t k = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++k;
  return k;
}

}  // namespace

TEST_CASE("compare rows: fits, peaks, recompute, step time, where the peak is", "[compare-readable]") {
  // Unlimited first, to place a capacity between the policies' peaks.
  const Compared free = compare(uint64_t{1} << 40, "none,full,offload");
  const uint64_t none_peak = free.runs[0].analysis.peak_reserved;
  const uint64_t full_peak = free.runs[1].analysis.peak_reserved;
  const uint64_t offload_peak = free.runs[2].analysis.peak_reserved;
  REQUIRE(full_peak < none_peak);
  REQUIRE(offload_peak < none_peak);
  const uint64_t cap = std::max(full_peak, offload_peak) + (none_peak - std::max(full_peak, offload_peak)) / 2;
  const Compared c = compare(cap, "none,full,offload");
  const Scenario base = load_scenario_text(yaml(cap), "compare.yaml");
  const Json j = compare_json(base, c.runs);
  REQUIRE(j["rows"].size() == 3);
  const Json& none = j["rows"][0];
  const Json& full = j["rows"][1];
  const Json& off = j["rows"][2];
  CHECK(none["policy"] == "none");
  CHECK(none["fits"] == false);
  CHECK(none["verdict"].get<std::string>().rfind("OOM at ", 0) == 0);
  CHECK(full["fits"] == true);
  CHECK(full["verdict"] == "fits");
  CHECK(off["policy"] == "offload");
  CHECK(off["fits"] == true);
  // Full recomputes the layers' forward, priced by the time model; none and offload do not.
  CHECK(full["recompute_flops"].get<double>() > 0);
  CHECK(full["recompute_seconds"].get<double>() > 0);
  CHECK(off["recompute_flops"].get<double>() == 0);
  CHECK(full["step_seconds"].get<double>() > j["rows"][1]["recompute_seconds"].get<double>());
  // Offload pays PCIe instead: its host copies are counted and its step is the slower.
  CHECK(off["host_offload_bytes"].get<uint64_t>() > 0);
  CHECK(full["host_offload_bytes"].get<uint64_t>() == 0);
  CHECK(off["step_seconds"].get<double>() > full["step_seconds"].get<double>());
  for (const Json& row : {full, off}) {
    CHECK(row["peak_allocated_bytes"].get<uint64_t>() <= row["peak_reserved_bytes"].get<uint64_t>());
    REQUIRE(row["peak_at"].is_object());
    CHECK(!row["peak_at"]["phase"].get<std::string>().empty());
    CHECK(!row["peak_at"]["op"].get<std::string>().empty());
  }
  // The same rows as the policies' full entries.
  CHECK(j["policies"][2]["host_offload_bytes"] == off["host_offload_bytes"]);
  CHECK(j["rows"][1]["peak_reserved_bytes"] == j["policies"][1]["peak_reserved_bytes"]);
  // The text table: a header and one line per policy, the verdict and the peak's place.
  const auto cells = compare_table_cells(compare_rows(c.runs));
  REQUIRE(cells.size() == 4);
  CHECK(cells[0].back() == "peak at");
  CHECK(std::find(cells[0].begin(), cells[0].end(), "host offload") != cells[0].end());
  CHECK(cells[1][1] == none["verdict"].get<std::string>());
  CHECK(cells[2].back() == where_text(c.runs[1].analysis.peak));
}

TEST_CASE("compare --html: phases aligned, OOM labels apart, reserved beside allocated, table under", "[compare-readable]") {
  const Compared free = compare(uint64_t{1} << 40, "none,selective,full,offload");
  const uint64_t full_peak = free.runs[2].analysis.peak_reserved;
  const uint64_t none_peak = free.runs[0].analysis.peak_reserved;
  const uint64_t sel_peak = free.runs[1].analysis.peak_reserved;
  REQUIRE(full_peak < sel_peak);
  // Room for full only: none and selective run out of memory.
  const uint64_t cap = full_peak + (std::min(sel_peak, none_peak) - full_peak) / 4;
  const Compared c = compare(cap, "none,selective,full,offload");
  REQUIRE_FALSE(c.runs[0].analysis.fits());
  REQUIRE_FALSE(c.runs[1].analysis.fits());
  REQUIRE(c.runs[2].analysis.fits());

  // The axis: every policy's forward, backward and optimizer begin at the same x.
  const PhaseAxis axis = phase_axis(free.curves);
  REQUIRE(axis.aligned == std::vector<bool>(4, true));
  double width = 0;
  for (const auto& s : axis.segments) width += s.width;
  CHECK(width == Approx(1.0));
  const auto& ref = free.curves[0].bands;
  for (size_t k = 0; k < ref.size(); ++k) {
    const double x0 = axis.x(free.curves, 0, ref[k].begin);
    for (size_t ci = 1; ci < free.curves.size(); ++ci) {
      INFO("band " << k << " curve " << ci);
      REQUIRE(free.curves[ci].bands.size() == ref.size());
      CHECK(free.curves[ci].bands[k].phase == ref[k].phase);
      CHECK(axis.x(free.curves, ci, free.curves[ci].bands[k].begin) == Approx(x0));
    }
  }
  // Full's backward (it recomputes) is longer in events than none's, and its segment is as
  // wide as the longest: the segments follow the widest policy.
  size_t bwd = ref.size();
  for (size_t k = 0; k < ref.size(); ++k)
    if (ref[k].phase == Phase::backward) bwd = k;  // the measured step's
  REQUIRE(bwd < ref.size());
  const auto& fb = free.curves[2].bands[bwd];
  const auto& nb = free.curves[0].bands[bwd];
  CHECK(fb.end - fb.begin > nb.end - nb.begin);

  const std::string html = html_of(c);
  // Two curves per policy: allocated and reserved.
  CHECK(count(html, "class=\"allocated\"") == 4);
  CHECK(count(html, "class=\"reserved\"") == 4);
  // OOM labels on distinct lines.
  std::regex oom("<text class=\"oom\" x=\"[0-9.]+\" y=\"([0-9.]+)\"");
  std::set<std::string> ys;
  size_t labels = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), oom); it != std::sregex_iterator(); ++it) {
    ys.insert((*it)[1].str());
    ++labels;
  }
  CHECK(labels == 2);
  CHECK(ys.size() == labels);
  // The table comes after the plot, a header and one row per policy.
  const size_t svg_end = html.find("</svg>");
  const size_t table = html.find("<table class=\"compare\">");
  REQUIRE(svg_end != std::string::npos);
  REQUIRE(table != std::string::npos);
  CHECK(table > svg_end);
  const std::string rows = html.substr(table, html.find("</table>", table) - table);
  CHECK(count(rows, "<tr>") == 5);
  CHECK(count(rows, "class=\"oom\"") == 2);
  CHECK(count(html, "data-phase=\"backward\"") >= 1);
}

// compare tries other regions with the script's own torch.utils.checkpoint call: the
// scenario's checkpoint.reentrant (and early_stop) carry over to every policy row
// (scenario/scenario_checkpoint.h with_call_of).
TEST_CASE("compare: the policies keep the scenario's checkpoint.reentrant", "[compare]") {
  const std::string text = yaml(80ull << 30) + "checkpoint:\n  policy: full\n  reentrant: true\n";
  const Scenario reentrant = load_scenario_text(text, "compare.yaml");
  const std::vector<PolicyRun> rows =
      run_policies(reentrant, parse_policy_list("none,full", reentrant),
                   [](const Program&, const Timeline&, const PolicyRun&) {});
  REQUIRE(rows.size() == 2);
  auto peak_of = [](const Scenario& s) {
    const Program p = build_program(s);
    auto device = make_device(s.device);
    return analyze(p, execute(p, s.allocator, *device)).peak_allocated;
  };
  const uint64_t full_reentrant = peak_of(reentrant);
  const uint64_t full_plain = peak_of(load_scenario_text(yaml(80ull << 30) + "checkpoint:\n  policy: full\n", "c.yaml"));
  REQUIRE(full_reentrant != full_plain);  // the call matters for this model
  CHECK(rows[1].label == "full");
  CHECK(rows[1].analysis.peak_allocated == full_reentrant);
}
