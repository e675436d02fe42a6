// _memsim: the compiled part of `import memsim` (tools/python/memsim/__init__.py is the
// Python face; docs/python.md the guide).
//
// Contract:
//  - run / compare / sweep / serve take the scenario as a file path or as YAML text (the package
//    turns a dict into JSON text, which YAML reads), the --set overrides as (key, value)
//    pairs, and return the JSON documents of `memsim run --json`, `compare --json` and
//    `sweep --json` and `serve --json`, built by the same writers (tools/cli/api.h) and converted to Python
//    objects (dict, list, int, float, str, None) key by key, in order.
//  - Nothing escapes as a C++ exception or ends the interpreter: every call catches
//    everything at this boundary and raises _memsim.Failure(kind, message), kind one of
//    "scenario" (ScenarioError: "FILE:LINE: KEY: why"), "config" (allocator settings),
//    "usage" (a malformed policy list or --vary axis), "input", "memory" (host memory
//    exhausted) or "error"; the package maps them to its exception classes. memsim's
//    library code reports bad input by throwing (scenario_detail::fail, ScenarioError);
//    it has no exit() or abort() path.
//  - The simulation runs with the GIL released (a sweep's threads, a notebook's other
//    threads); Python objects are made only after it holds the GIL again.
//  - The timeline (run(..., timeline=True)) is the --timeline CSV's columns: numbers as
//    raw little-endian 8-byte buffers (the package makes numpy arrays of them when numpy
//    is installed, lists otherwise), names as lists of str.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/snapshot/snapshot.h"
#include "scenario/scenario.h"
#include "scenario/scenario_text_model.h"
#include "sim/analysis/analysis.h"
#include "sim/search/advice_candidates.h"
#include "sim/search/sweep.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tools/cli/advice_report.h"
#include "tools/cli/api.h"
#include "tools/cli/device.h"
#include "tools/cli/errors.h"
#include "tools/cli/logging.h"
#include "tools/cli/version.h"

namespace py = pybind11;

namespace memsim::python {
namespace {

using cli::Json;
using Overrides = std::vector<std::pair<std::string, std::string>>;

PyObject* g_failure = nullptr;  // _memsim.Failure, created at import

struct Caught {
  std::string kind;  // "" = nothing thrown
  std::string message;
};

// Call inside a catch block: classifies the exception being handled.
Caught classify_current() {
  try {
    throw;
  } catch (const ScenarioError& e) {
    return {"scenario", e.what()};
  } catch (const ConfigError& e) {
    return {"config", e.what()};
  } catch (const SnapshotError& e) {
    return {"input", e.what()};
  } catch (const cli::UsageError& e) {
    return {"usage", e.what()};
  } catch (const cli::InputError& e) {
    return {"input", e.what()};
  } catch (const std::bad_alloc&) {
    return {"memory", "out of host memory"};
  } catch (const std::exception& e) {
    return {"error", e.what()};
  } catch (...) {
    return {"error", "unknown failure"};
  }
}

[[noreturn]] void raise_failure(const Caught& c) {
  PyErr_SetObject(g_failure, py::make_tuple(c.kind, c.message).ptr());
  throw py::error_already_set();
}

// Runs `work` without the GIL and with every exception caught; raises Failure after.
template <typename Work>
void guarded(Work&& work) {
  Caught caught;
  {
    py::gil_scoped_release release;
    try {
      work();
    } catch (...) {
      caught = classify_current();
    }
  }
  if (!caught.kind.empty()) raise_failure(caught);
}

py::object to_python(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return py::none();
    case Json::value_t::boolean: return py::bool_(j.get<bool>());
    case Json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case Json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case Json::value_t::number_float: return py::float_(j.get<double>());
    case Json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      py::list list;
      for (const Json& item : j) list.append(to_python(item));
      return std::move(list);
    }
    case Json::value_t::object: {
      py::dict dict;
      for (const auto& [key, value] : j.items()) dict[py::str(key)] = to_python(value);
      return std::move(dict);
    }
    default: return py::none();  // binary / discarded: never produced by the writers
  }
}

// The scenario argument: a path, or text named `source` in errors.
struct ScenarioArg {
  std::string path_or_text;
  std::string source;  // "" = path_or_text is a path
  bool is_path() const { return source.empty(); }
};

Scenario load(const ScenarioArg& arg, const Overrides& overrides, const std::string& model) {
  if (!model.empty()) {
    return arg.is_path() ? load_scenario_with_model(arg.path_or_text, model, overrides)
                         : load_scenario_text_with_model(arg.path_or_text, arg.source, model, overrides);
  }
  return arg.is_path() ? load_scenario(arg.path_or_text, overrides)
                       : load_scenario_text(arg.path_or_text, arg.source, overrides);
}

SweepRunner runner_for(const ScenarioArg& arg, const Overrides& overrides) {
  if (arg.is_path()) return SweepRunner::from_file(arg.path_or_text, overrides);
  load_scenario_text(arg.path_or_text, arg.source, overrides);  // its errors first
  return SweepRunner(arg.path_or_text, arg.source, overrides);
}

py::bytes u64_bytes(const std::vector<uint64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(uint64_t));
}

const char* type_name(EventType type) {
  switch (type) {
    case EventType::alloc: return "alloc";
    case EventType::free: return "free";
    case EventType::mark: return "mark";
    case EventType::empty_cache: return "empty_cache";
  }
  return "other";
}

// The --timeline CSV's columns (tools/cli/timeline_csv.h), one entry per executed event.
py::dict timeline_columns(const Program& program, const Timeline& timeline) {
  const size_t n = std::min(timeline.size(), program.events.size());
  std::vector<uint64_t> bytes(n), layer(n);
  std::array<std::vector<uint64_t>, kTensorKindCount> kinds;
  const bool by_kind = timeline.by_kind.size() >= n;
  for (auto& k : kinds) k.resize(by_kind ? n : 0);
  py::list type, op, phase, kind;
  std::unordered_map<uint32_t, py::object> strings;  // one str object per distinct name
  auto name = [&](uint32_t id) -> py::object {
    auto it = strings.find(id);
    if (it == strings.end()) it = strings.emplace(id, py::str(program.str(id))).first;
    return it->second;
  };
  py::str kind_names[kTensorKindCount];
  for (int k = 0; k < kTensorKindCount; ++k) kind_names[k] = py::str(to_string(static_cast<TensorKind>(k)));
  const py::str empty("");
  for (size_t i = 0; i < n; ++i) {
    const MemoryEvent& e = program.events[i];
    const bool is_tensor = e.type == EventType::alloc || e.type == EventType::free;
    type.append(py::str(type_name(e.type)));
    op.append(e.type == EventType::mark ? name(static_cast<uint32_t>(e.bytes)) : name(e.op));
    phase.append(py::str(to_string(e.phase)));
    kind.append(is_tensor ? kind_names[static_cast<int>(e.kind)] : empty);
    bytes[i] = is_tensor ? e.bytes : 0;
    layer[i] = static_cast<uint64_t>(static_cast<int64_t>(e.layer));  // two's complement: -1 kept
    if (by_kind)
      for (int k = 0; k < kTensorKindCount; ++k) kinds[static_cast<size_t>(k)][i] = timeline.by_kind[i][static_cast<size_t>(k)];
  }
  auto head = [n](const std::vector<uint64_t>& v) {
    return std::vector<uint64_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(n, v.size())));
  };
  py::dict unsigned_columns;
  unsigned_columns["bytes"] = u64_bytes(bytes);
  unsigned_columns["allocated"] = u64_bytes(head(timeline.allocated));
  unsigned_columns["reserved"] = u64_bytes(head(timeline.reserved));
  unsigned_columns["requested"] = u64_bytes(head(timeline.requested));
  for (int k = 0; k < kTensorKindCount; ++k)
    if (by_kind) unsigned_columns[kind_names[k]] = u64_bytes(kinds[static_cast<size_t>(k)]);
  py::dict out;
  out["type"] = type;
  out["op"] = op;
  out["phase"] = phase;
  out["kind"] = kind;
  out["layer"] = u64_bytes(layer);  // signed
  out["unsigned"] = unsigned_columns;
  return out;
}

py::tuple run(const std::string& scenario, const std::string& source, const Overrides& overrides,
              const std::string& model, bool want_timeline) {
  std::optional<Scenario> s;
  std::optional<Program> program;
  std::optional<Timeline> timeline;
  Json j;
  guarded([&] {
    s = load({scenario, source}, overrides, model);
    GenerateFacts generate_facts;
    program = cli::build_run_program(*s, generate_facts);
    auto device = cli::make_device(s->device);
    timeline = execute(*program, s->allocator, *device);
    const Analysis analysis = analyze(*program, *timeline, cli::run_analysis_options(*s));
    j = cli::run_json(*s, *program, timeline->final_stats, analysis, generate_facts, cli::moe_routing_report(*s));
    // As `memsim run --json` for an OOM (issue #19 item 2): the changes memsim simulated.
    if (!analysis.fits())
      cli::add_advice_json(j, cli::run_advice(advice_candidates(*s), [&](const Overrides& extra) {
        Overrides all = overrides;
        all.insert(all.end(), extra.begin(), extra.end());
        return load({scenario, source}, all, model);
      }));
  });
  py::object columns = want_timeline ? py::object(timeline_columns(*program, *timeline)) : py::none();
  return py::make_tuple(to_python(j), columns);
}

py::object compare(const std::string& scenario, const std::string& source, const Overrides& overrides,
                   const std::string& policies) {
  Json j;
  guarded([&] {
    const Scenario base = load({scenario, source}, overrides, "");
    const auto configs = cli::parse_policy_list(policies, base);
    j = cli::compare_json(base, cli::run_policies(base, configs));
  });
  return to_python(j);
}

py::object sweep(const std::string& scenario, const std::string& source, const Overrides& overrides,
                 const std::vector<std::string>& vary, const std::string& max, unsigned threads) {
  Json j;
  guarded([&] {
    if (vary.empty() && max.empty()) throw cli::UsageError("sweep needs vary or max");
    const auto axes = cli::parse_sweep_axes(vary, max);
    const SweepRunner runner = runner_for({scenario, source}, overrides);
    const auto points = sweep_points(axes);
    if (max.empty()) {
      j = cli::sweep_grid_json(runner, points, cli::run_sweep_grid(runner, points, threads));
    } else {
      j = cli::sweep_max_json(runner, max, points, cli::run_sweep_max(runner, points, max, threads));
    }
  });
  return to_python(j);
}

py::object serve(const std::string& scenario, const std::string& source, const Overrides& overrides,
                 const std::string& model, int64_t max_seqs_len, std::optional<int64_t> min_tp) {
  Json j;
  guarded([&] {
    Scenario s = load({scenario, source}, overrides, model);
    const serve::ServePlan plan = cli::plan_serve_scenario(s);
    j = cli::serve_json(s, plan, cli::serve_inverse(s, plan, max_seqs_len, min_tp));
  });
  return to_python(j);
}

}  // namespace
}  // namespace memsim::python

PYBIND11_MODULE(_memsim, m) {
  using namespace memsim::python;
  m.doc() = "memsim's compiled core; use the memsim package (docs/python.md)";
  // Log lines (quiet by default: warnings only) go to stderr, never into stdout.
  memsim::cli::setup_logging(0);
  static py::exception<std::exception> failure(m, "Failure");
  g_failure = failure.ptr();
  m.def("version", [] { return std::string(memsim::cli::version_text()); });
  m.def("run", &run, py::arg("scenario"), py::arg("source"), py::arg("overrides"), py::arg("model"),
        py::arg("timeline"));
  m.def("compare", &compare, py::arg("scenario"), py::arg("source"), py::arg("overrides"),
        py::arg("policies"));
  m.def("serve", &serve, py::arg("scenario"), py::arg("source"), py::arg("overrides"), py::arg("model"),
        py::arg("max_seqs_len"), py::arg("min_tp"));
  m.def("sweep", &sweep, py::arg("scenario"), py::arg("source"), py::arg("overrides"),
        py::arg("vary"), py::arg("max"), py::arg("threads"));
}
