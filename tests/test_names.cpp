// Tensor names in the reports (issue #19 item 1; program/tensor_names.h, docs/tensor-names.md):
// what parameters, grads, optimizer state, saved inputs, autocast copies, logits and
// FSDP buffers are called in small llama / gpt2 / cs336 runs, the collapsing of repeats,
// and the names in the JSON, the CSV timeline and the memory_viz snapshot (frames and
// categories) written by `memsim run`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"
#include "program/tensor_names.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/cli_test_support.h"
#include "test_paths.h"

using namespace memsim;
namespace fs = std::filesystem;

namespace {

using Overrides = std::vector<std::pair<std::string, std::string>>;

const std::string kLlama = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-full-finetune-a100.yaml";
const std::string kGpt2 = MEMSIM_SOURCE_DIR + "/scenarios/gpt2-large-mi300x.yaml";
const std::string kCs336 = MEMSIM_SOURCE_DIR + "/scenarios/cs336-small-train-ctx512.yaml";

Overrides small(Overrides more = {}) {
  Overrides o = {{"model.layers", "2"}, {"batch.seq_len", "256"}, {"device.capacity", "1TiB"}};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Every tensor name of the run's Program.
std::set<std::string> names_of(const Program& p) {
  const TensorNames names(p);
  std::set<std::string> out;
  for (uint32_t t = 0; t < p.tensors.size(); ++t) out.insert(names.name(t));
  return out;
}

std::set<std::string> names_of(const std::string& path, const Overrides& o) {
  return names_of(build_program(load_scenario(path, o)));
}

bool any_starts_with(const std::set<std::string>& names, const std::string& prefix) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

}  // namespace

TEST_CASE("Names: name_pattern collapses layer and block numbers only", "[names]") {
  CHECK(name_pattern("model.layers.3.mlp.up_proj.weight") == "model.layers.N.mlp.up_proj.weight");
  CHECK(name_pattern("grad of model.layers.31.self_attn.o_proj.weight") ==
        "grad of model.layers.N.self_attn.o_proj.weight");
  CHECK(name_pattern("FSDP all-gather of block 7") == "FSDP all-gather of block N");
  CHECK(name_pattern("KV cache key of layer 12") == "KV cache key of layer N");
  // Digits inside an identifier are part of the name.
  CHECK(name_pattern("bf16 autocast copy of transformer.h.0.mlp.c_fc.weight") ==
        "bf16 autocast copy of transformer.h.N.mlp.c_fc.weight");
  CHECK(name_pattern("ffn.w1.weight") == "ffn.w1.weight");
  CHECK(name_pattern("lm_head.weight") == "lm_head.weight");
}

TEST_CASE("Names: a small llama's parameters, grads, Adam state, saved inputs, logits", "[names]") {
  const std::set<std::string> n = names_of(kLlama, small());
  CHECK(n.count("model.layers.1.mlp.up_proj.weight"));
  CHECK(n.count("grad of model.layers.1.mlp.up_proj.weight"));
  CHECK(n.count("grad of model.embed_tokens.weight"));
  CHECK(n.count("exp_avg of lm_head.weight"));
  CHECK(n.count("exp_avg_sq of lm_head.weight"));
  // adamw (foreach): _foreach_sqrt's per-parameter temporaries.
  CHECK(n.count("exp_avg_sq.sqrt() of lm_head.weight (foreach temporary)"));
  CHECK(n.count("saved input of model.layers.0.self_attn.o_proj"));
  CHECK(n.count("saved input of model.layers.0.mlp.down_proj"));
  CHECK(n.count("saved input of lm_head"));
  CHECK(n.count("logits"));
  CHECK(n.count("logits.float()"));  // bf16 params: LlamaForCausalLM upcasts the logits
  // Composed names say the op, the role and the module path; no bare op names remain.
  CHECK(any_starts_with(n, "MmBackward0 "));
  CHECK(n.count("optimizer") == 0);
  CHECK(n.count("MmBackward0") == 0);
  CHECK(n.count("_to_copy") == 0);
  // A composed name's module path is the parameters' (model.layers.0.mlp), not a label.
  CHECK(n.count("silu output in model.layers.0.mlp"));
  CHECK(n.count("mm output in model.layers.1.self_attn"));
  CHECK(n.count("rsqrt output in model.layers.0"));
}

TEST_CASE("Names: fp32 master weights and autocast copies", "[names]") {
  const std::set<std::string> masters =
      names_of(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-full-finetune-a100-master.yaml", small());
  CHECK(masters.count("master copy of model.layers.0.mlp.gate_proj.weight"));
  CHECK(masters.count("fp32 grad of model.layers.0.mlp.gate_proj.weight"));
  CHECK(masters.count("exp_avg of model.layers.0.mlp.gate_proj.weight"));

  const std::set<std::string> ac =
      names_of(kLlama, small({{"model.attention", "eager"}, {"precision.params", "fp32"},
                              {"precision.autocast", "bf16"}}));
  CHECK(ac.count("bf16 autocast copy of model.layers.1.self_attn.q_proj.weight"));
  CHECK(ac.count("bf16 autocast copy of lm_head.weight"));
  CHECK(ac.count("logits.float()"));
}

TEST_CASE("Names: a small gpt2's Conv1D weights and saved inputs", "[names]") {
  const std::set<std::string> n = names_of(kGpt2, small());
  CHECK(n.count("transformer.h.0.mlp.c_fc.weight"));
  CHECK(n.count("grad of transformer.h.0.mlp.c_fc.weight"));
  CHECK(n.count("exp_avg of transformer.h.1.attn.c_attn.weight"));
  CHECK(n.count("saved input of transformer.h.0.mlp.c_proj"));
  CHECK(n.count("logits"));
}

TEST_CASE("Names: FSDP buffers by block, recomputed tensors", "[names]") {
  const std::set<std::string> fsdp =
      names_of(kCs336, {{"parallel.data", "4"}, {"parallel.sharding", "fsdp"}, {"device.capacity", "1TiB"}});
  CHECK(fsdp.count("FSDP all-gather of block 0"));
  CHECK(fsdp.count("FSDP all-gather of the root"));
  CHECK(any_starts_with(fsdp, "FSDP sharded grad of block "));

  const std::set<std::string> full = names_of(kLlama, small({{"checkpoint.policy", "full"}}));
  CHECK(any_starts_with(full, "saved input of model.layers.0.mlp.down_proj (recomputed)"));
  CHECK(std::any_of(full.begin(), full.end(), [](const std::string& s) {
    return s.find(" in model.layers.1.") != std::string::npos &&
           s.find("(recomputed)") != std::string::npos;
  }));
}

TEST_CASE("Names: the live set at the peak collapses repeats", "[names]") {
  const Scenario s = load_scenario(kLlama, small());
  const Program p = build_program(s);
  SimulatedDevice device(s.device.capacity, 0);
  const Timeline t = execute(p, s.allocator, device);
  const Analysis a = analyze(p, t);
  const LiveSet& live = a.live_at_peak;
  REQUIRE(!live.by_name.empty());
  // Every live tensor is in exactly one group.
  size_t tensors = 0;
  uint64_t bytes = 0;
  for (const NameGroup& g : live.by_name) {
    tensors += g.tensors;
    bytes += g.bytes;
    CHECK(g.bytes == g.bytes_each * g.tensors);
  }
  CHECK(tensors == live.tensors);
  CHECK(bytes == live.bytes);
  // Largest total first.
  for (size_t i = 1; i < live.by_name.size(); ++i) CHECK(live.by_name[i - 1].bytes >= live.by_name[i].bytes);
  // The two layers' up_proj weights are one group of 2 (4096 x 11008 bf16 each).
  auto up = std::find_if(live.by_name.begin(), live.by_name.end(), [](const NameGroup& g) {
    return g.name == "model.layers.N.mlp.up_proj.weight";
  });
  REQUIRE(up != live.by_name.end());
  CHECK(up->tensors == 2);
  CHECK(up->bytes_each == 4096ull * 11008 * 2);
  CHECK(up->kind == TensorKind::parameter);
  CHECK(up->first_layer == 0);
  CHECK(up->last_layer == 1);
  // The largest tensors carry names, not op names.
  for (const LiveTensor& lt : live.largest) {
    CHECK(!lt.name.empty());
    CHECK(lt.name != lt.op);
  }
}

TEST_CASE("Names: the text summary collapses repeats", "[names]") {
  memsim_test::TempDir dir("memsim_names_text");
  // cs336-small: 12 layers of 9.00 MiB fp32 FFN weights outweigh every single tensor.
  const auto r = memsim_test::run_memsim("run '" + kCs336 + "' --set device.capacity=1TiB", dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("12 x layers.N.ffn.w1.weight, 9.00 MiB each") != std::string::npos);
  CHECK(r.out.find("12 x saved input of layers.N.ffn.w2, 24.00 MiB each") != std::string::npos);
  // A residual add (no parameter of its own) is named after its layer.
  CHECK(r.out.find("24 x add output in layers.N, 6.00 MiB each") != std::string::npos);
}

TEST_CASE("Names: memsim run writes them to the text, JSON, CSV and snapshot", "[names]") {
  memsim_test::TempDir dir("memsim_names");
  const fs::path json_path = dir.path / "run.json", csv = dir.path / "run.csv",
                 snap = dir.path / "run.pickle";
  const auto r = memsim_test::run_memsim(
      "run '" + kLlama + "' --set model.layers=2 --set batch.seq_len=256 --set device.capacity=1TiB"
      " --json '" + json_path.string() + "' --timeline '" + csv.string() + "' --snapshot '" +
          snap.string() + "'",
      dir);
  REQUIRE(r.status == 0);
  // Text: names, not op names, in the largest-tensors table.
  CHECK(r.out.find("exp_avg of lm_head.weight") != std::string::npos);
  CHECK(r.out.find("grad of lm_head.weight") != std::string::npos);

  // JSON: live_at_peak.tensors lists them (issue #19), tensor_count counts them.
  const nlohmann::json j = nlohmann::json::parse(memsim_test::slurp(json_path));
  CHECK(j["live_at_peak"]["tensor_count"].is_number());
  const auto& groups = j["live_at_peak"]["tensors"];
  REQUIRE(groups.is_array());
  bool found = false;
  uint64_t listed = 0;
  for (const auto& g : groups) {
    for (const char* key : {"name", "count", "bytes", "bytes_each", "kind", "layer", "op"})
      CHECK(g.contains(key));
    listed += g["count"].get<uint64_t>();
    if (g["name"] == "model.layers.N.mlp.up_proj.weight") {
      found = true;
      CHECK(g["count"] == 2);
      CHECK(g["kind"] == "parameters");
      CHECK(g["layer"].is_null());
      CHECK(g["first_layer"] == 0);
      CHECK(g["last_layer"] == 1);
    }
  }
  CHECK(found);
  CHECK(listed == j["live_at_peak"]["tensor_count"].get<uint64_t>());
  for (const auto& t : j["top_tensors"]) CHECK(t["name"] != t["op"]);

  // CSV: `name` is the last column; an alloc row of a grad names it.
  const std::string text = memsim_test::slurp(csv);
  const std::string header = text.substr(0, text.find('\n'));
  CHECK(header.rfind(",other,name") == header.size() - std::string(",other,name").size());
  CHECK(text.find(",grad of model.layers.1.mlp.up_proj.weight\n") != std::string::npos);

  // Snapshot: the strict reader still reads it; trace entries and blocks carry frames
  // {name, filename, line} and a category.
  const Snapshot s = read_snapshot_file(snap.string());
  REQUIRE(!s.device_traces.empty());
  const PickleDoc doc = parse_pickle(memsim_test::slurp(snap), "run.pickle");
  PickleValue traces = doc.root(), segments = doc.root();
  REQUIRE(doc.root().find("device_traces", &traces));
  REQUIRE(doc.root().find("segments", &segments));
  const PickleValue trace = traces.item(0);
  REQUIRE(trace.size() == s.device_traces[0].size());
  std::set<std::string> categories, frame_names, frame_files;
  size_t allocs_with_frames = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const PickleValue e = trace.item(i);
    PickleValue action = doc.root(), frames = doc.root(), category = doc.root();
    REQUIRE(e.find("action", &action));
    if (e.find("category", &category)) categories.insert(std::string(category.as_string()));
    if (!e.find("frames", &frames)) continue;
    if (action.as_string() == "alloc") ++allocs_with_frames;
    REQUIRE(frames.size() == 2);
    PickleValue name = doc.root(), file = doc.root(), line = doc.root();
    REQUIRE(frames.item(0).find("name", &name));
    REQUIRE(frames.item(0).find("filename", &file));
    REQUIRE(frames.item(0).find("line", &line));
    CHECK(line.is_int());
    frame_names.insert(std::string(name.as_string()));
    frame_files.insert(std::string(file.as_string()));
    REQUIRE(frames.item(1).find("filename", &file));
    frame_files.insert(std::string(file.as_string()));
  }
  size_t allocs = 0;
  for (const SnapshotTraceEntry& e : s.device_traces[0]) allocs += e.action == TraceAction::alloc;
  CHECK(allocs_with_frames == allocs);
  CHECK(frame_names.count("grad of model.layers.1.mlp.up_proj.weight"));
  CHECK(frame_names.count("saved input of model.layers.0.mlp.down_proj"));
  CHECK(frame_files.count("model.layers.0.mlp"));
  for (const char* phase : {"setup", "forward", "backward", "optimizer"}) CHECK(frame_files.count(phase));
  for (const char* c : {"parameter", "gradient", "optimizer_state", "activation", "temporary", "unknown"})
    CHECK(categories.count(c));
  // Active blocks at the end: the parameters, named.
  size_t named_blocks = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    PickleValue blocks = doc.root();
    REQUIRE(segments.item(i).find("blocks", &blocks));
    for (size_t k = 0; k < blocks.size(); ++k) {
      PickleValue state = doc.root(), frames = doc.root();
      REQUIRE(blocks.item(k).find("state", &state));
      REQUIRE(blocks.item(k).find("frames", &frames));
      if (state.as_string() == "active_allocated") named_blocks += frames.size() == 2;
    }
  }
  CHECK(named_blocks > 0);
}
