// memsim in the browser: the C entry points of the WebAssembly module that web/index.html
// calls (web/build.sh builds it; docs/web.md).
//
// Contract:
//  - memsim_web_run(request) runs `memsim run scenario.yaml [--model config.json]
//    [--set KEY=VALUE]...` through the command line's own run_run (tools/cli/commands.h),
//    so the page shows the numbers, the verdict wording and the error text of the CLI by
//    construction. The request is JSON: {"scenario": YAML text, "config": config.json text
//    or null, "sets": ["KEY=VALUE", ...]}. The texts are written to scenario.yaml and
//    config.json in the module's in-memory working folder, the names the CLI would be given,
//    so an error reads "scenario.yaml:3: batch.seq_len: ..." or "config.json: ..." exactly
//    as `memsim run` prints it in a folder holding those two files.
//  - What run_run prints goes where the CLI prints it: the text summary to stdout, errors
//    ("memsim: error: ...", the same ladder as tools/memsim.cpp's main) and warnings to
//    stderr; the page captures both (Module.print / Module.printErr).
//  - It returns JSON (valid until the next call): {"status": the CLI's exit status (0 fits,
//    3 out of memory, 1 bad input, 2 bad usage), "report": the --json document or null,
//    "timeline": {"events": n, "points": [[first_event, min_allocated, max_allocated,
//    max_reserved], ...] (at most kTimelinePoints buckets of consecutive events: the
//    envelope keeps every peak), "marks": [[event, name], ...]} or null}. The timeline is
//    read back from the --timeline CSV run_run wrote.
//  - memsim_web_presets() returns {"version", "models": [{name, summary, source}],
//    "devices": [...]}: what `memsim presets` lists.
//  - Nothing escapes as a C++ exception: a failure is a status and a message, never an abort.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "allocator/allocator_config.h"
#include "allocator/snapshot/snapshot.h"
#include "scenario/scenario.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/logging.h"
#include "tools/cli/terminal_text.h"
#include "tools/cli/version.h"

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kScenarioFile = "scenario.yaml";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kReportFile = "/memsim-out/report.json";
constexpr const char* kTimelineFile = "/memsim-out/timeline.csv";
constexpr size_t kTimelinePoints = 1500;  // an SVG path a browser redraws at once

// tools/memsim.cpp's fail(): the message of a bad-input error, status 1.
int fail(const char* what) {
  std::fflush(stdout);
  std::fprintf(stderr, "memsim: error: %s\n", memsim::cli::printable(what, true).c_str());
  std::fflush(stderr);
  return memsim::cli::kExitBadInput;
}

// run_run with tools/memsim.cpp's error ladder (same messages, same statuses).
int run_like_cli(const memsim::cli::RunArgs& args) {
  using namespace memsim::cli;
  try {
    return run_run(args);
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memsim: error: %s\nRun with --help for more information.\n",
                 printable(e.what(), true).c_str());
    std::fflush(stderr);
    return kExitUsage;
  } catch (const memsim::ScenarioError& e) {
    return fail(e.what());
  } catch (const memsim::SnapshotError& e) {
    return fail(e.what());
  } catch (const memsim::ConfigError& e) {
    return fail(e.what());
  } catch (const InputError& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of host memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

bool write_file(const char* path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

bool read_file(const char* path, std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  text = s.str();
  return true;
}

// One CSV line's fields (RFC 4180 quoting, as tools/cli/timeline_csv.cpp writes them).
void split_csv(const std::string& line, std::vector<std::string>& fields) {
  fields.clear();
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  fields.push_back(field);
}

// The --timeline CSV as the page draws it: per bucket of consecutive events the least and
// most allocated and the most reserved bytes, and the phase marks.
Json timeline_json(const std::string& csv) {
  std::vector<uint64_t> allocated, reserved;
  Json marks = Json::array();
  std::istringstream in(csv);
  std::string line;
  std::vector<std::string> f;
  std::getline(in, line);  // header: index,type,op,phase,layer,kind,bytes,allocated,reserved,...
  while (std::getline(in, line)) {
    split_csv(line, f);
    if (f.size() < 9) continue;
    if (f[1] == "mark") marks.push_back({allocated.size(), f[2]});
    allocated.push_back(std::strtoull(f[7].c_str(), nullptr, 10));
    reserved.push_back(std::strtoull(f[8].c_str(), nullptr, 10));
  }
  const size_t n = allocated.size();
  const size_t buckets = std::min(n, kTimelinePoints);
  Json points = Json::array();
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    uint64_t amin = allocated[lo], amax = allocated[lo], rmax = reserved[lo];
    for (size_t i = lo; i < hi; ++i) {
      amin = std::min(amin, allocated[i]);
      amax = std::max(amax, allocated[i]);
      rmax = std::max(rmax, reserved[i]);
    }
    points.push_back({lo, amin, amax, rmax});
  }
  return {{"events", n}, {"points", std::move(points)}, {"marks", std::move(marks)}};
}

Json preset_list(const std::vector<memsim::PresetInfo>& presets) {
  Json list = Json::array();
  for (const auto& p : presets) list.push_back({{"name", p.name}, {"summary", p.summary}, {"source", p.source}});
  return list;
}

std::string g_result;  // the last answer, valid until the next call

void setup_once() {
  static bool done = false;
  if (done) return;
  done = true;
  // The CLI colours only a terminal; emscripten's stdout says it is one.
  setenv("NO_COLOR", "1", 1);
  memsim::cli::setup_logging(0);  // warnings to stderr, as the CLI
  // The in-memory folders (emscripten's MEMFS): the working folder holding scenario.yaml
  // and config.json, and the reports' folder.
  mkdir("/memsim", 0755);
  mkdir("/memsim-out", 0755);
  chdir("/memsim");
}

}  // namespace

extern "C" {

const char* memsim_web_run(const char* request_text) {
  setup_once();
  Json answer = {{"status", memsim::cli::kExitBadInput}, {"report", nullptr}, {"timeline", nullptr}};
  try {
    const Json request = Json::parse(request_text ? request_text : "{}");
    memsim::cli::RunArgs args;
    args.scenario = kScenarioFile;
    if (!write_file(kScenarioFile, request.value("scenario", std::string()))) {
      answer["status"] = fail("cannot write the page's scenario.yaml");
      return (g_result = answer.dump()).c_str();
    }
    std::remove(kConfigFile);
    const auto config = request.find("config");
    if (config != request.end() && config->is_string()) {
      write_file(kConfigFile, config->get<std::string>());
      args.model = kConfigFile;
    }
    if (request.contains("sets"))
      for (const auto& s : request.at("sets")) args.sets.push_back(s.get<std::string>());
    std::remove(kReportFile);
    std::remove(kTimelineFile);
    args.json = kReportFile;
    args.timeline = kTimelineFile;
    const int status = run_like_cli(args);
    std::fflush(stdout);
    answer["status"] = status;
    std::string text;
    if (read_file(kReportFile, text)) answer["report"] = Json::parse(text);
    if (read_file(kTimelineFile, text)) answer["timeline"] = timeline_json(text);
  } catch (const std::exception& e) {  // a malformed request from the page itself
    answer["status"] = fail(e.what());
  }
  return (g_result = answer.dump()).c_str();
}

const char* memsim_web_presets() {
  setup_once();
  const Json answer = {{"version", memsim::cli::version_text()},
                       {"models", preset_list(memsim::model_presets())},
                       {"devices", preset_list(memsim::device_presets())}};
  return (g_result = answer.dump()).c_str();
}

}  // extern "C"

