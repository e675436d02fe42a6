// When FSDP2's post-backward runs (sim/parallel/fsdp2.h "When a block's post-backward runs";
// docs/fsdp2.md): against the measured GPU runs, event by event at each reduce-scatter.
//
// tools/gpu/extract_fsdp2_post_backward.py reads the committed snapshots' Python frames
// (which memsim's C++ reader drops) and writes tests/data/gpu/fsdp2_post_backward.json:
// for each measured FSDP2 run (the nine stand-in runs of tests/data/gpu/fsdp2, full
// fine-tuning, and hft_lora_fsdp2_w8, PEFT LoRA on transformers' Qwen2), the trace index
// of every reduce-scatter input FSDP2 allocated in the measured step, which hook ran that
// post_backward (RegisterPostBackwardFunction.backward or the final callback), and every
// pre-backward copy-out's first allocation, with the bytes the trace held just before.
//
// 1. The fixture is the snapshots': each index is an allocation of the recorded size, and
//    the trace's running requested bytes there (recomputed here from the unpacked
//    snapshot) are the recorded ones.
// 2. memsim's Program for the same scenario holds, before each of its reduce-scatter inputs
//    and pre-backward copy-outs of the measured step, the trace's bytes plus one constant:
//    the run's offset at its first such event (0 B for the stand-in runs; -132 B for the
//    Qwen2 run, small tensors memsim lacks since before backward, not FSDP2's), and within
//    1 KiB of the trace. The one exception is the final callback's reduce-scatter, 4 B
//    lower: torch.autograd.backward's grad_tensors (ones_like(loss), 0-d fp32) is still
//    referenced while the engine runs its final callbacks; memsim frees it before
//    (graph/runtime.cpp Runtime::backward), outside this rule.
// The last-AccumulateGrad rule memsim had before put every block's reduce-scatter before
// the input norm's backward: 25-36 MB more live at each (the stand-in runs), 50 MB more
// under LoRA (the frozen projections' and norm's backward), and block 0's LoRA
// reduce-scatter before the root's reshard (262 MB more).
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "allocator/snapshot/snapshot.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kFixture = MEMSIM_SOURCE_DIR + "/tests/data/gpu/fsdp2_post_backward.json";

struct SimEvent {
  bool reduce_scatter = false;  // else a pre-backward copy-out's first allocation
  uint64_t bytes = 0;
  uint64_t live = 0;            // requested bytes before it
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// memsim's reduce-scatter inputs and backward copy-out starts, in Program order.
std::vector<SimEvent> simulated(const std::string& scenario) {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/" + scenario);
  const Program program = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(program, s.allocator, device, ExecuteOptions{});
  std::vector<SimEvent> out;
  bool in_copy_out = false;
  for (size_t i = 0; i < program.events.size(); ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type != EventType::alloc) {
      in_copy_out = false;
      continue;
    }
    const std::string& name = program.str(program.tensors[e.tensor].name);
    const uint64_t before = i == 0 ? 0 : t.requested[i - 1];
    const bool copy_out = e.phase == Phase::backward && starts_with(name, "FSDP2 unsharded ");
    if (starts_with(name, "FSDP2 reduce-scatter input (chunk_cat)"))
      out.push_back({true, e.bytes, before});
    else if (copy_out && !in_copy_out)
      out.push_back({false, e.bytes, before});
    in_copy_out = copy_out;
  }
  return out;
}

}  // namespace

TEST_CASE("FSDP2's post-backward runs at the block input's gradient, as on the GPU",
          "[fsdp2][gpu]") {
  std::ifstream in(kFixture);
  REQUIRE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  REQUIRE(fixture["runs"].size() == 10);
  for (const nlohmann::json& run : fixture["runs"]) {
    const std::string name = run["name"];
    INFO(name);
    const std::vector<nlohmann::json> real = run["events"].get<std::vector<nlohmann::json>>();
    REQUIRE(real.size() >= 5);

    // 1. The fixture is the snapshot's.
    const std::string archive = run["archive"];  // tests/data/gpu/GROUP/GROUP_snapshots.tar.xz
    const std::string group = archive.substr(15, archive.find('/', 15) - 15);
    const std::string pickle = MEMSIM_BINARY_DIR + "/gpu_" + group + "_snapshots/" + name + ".pickle";
    INFO(pickle << " (unpacked by CMake from " << archive << ": re-run cmake)");
    REQUIRE(std::filesystem::exists(pickle));
    const Snapshot snap = read_snapshot_file(pickle);
    const std::vector<SnapshotTraceEntry>& trace = snap.device_traces.at(0);
    REQUIRE(trace.size() == run["trace_entries"].get<size_t>());
    int64_t live = 0;
    size_t next = 0;
    for (size_t i = 0; i < trace.size() && next < real.size(); ++i) {
      if (i == real[next]["index"].get<size_t>()) {
        CHECK(trace[i].action == TraceAction::alloc);
        CHECK(trace[i].size == real[next]["size"].get<uint64_t>());
        CHECK(live == real[next]["live"].get<int64_t>());
        ++next;
      }
      if (trace[i].action == TraceAction::alloc) live += static_cast<int64_t>(trace[i].size);
      if (trace[i].action == TraceAction::free_completed) live -= static_cast<int64_t>(trace[i].size);
    }
    CHECK(next == real.size());

    // 2. memsim's measured step (the Program's last events of each kind) against it.
    const std::vector<SimEvent> sim_all = simulated(run["scenario"]);
    std::vector<SimEvent> sim_rs, sim_pre;
    for (const SimEvent& e : sim_all) (e.reduce_scatter ? sim_rs : sim_pre).push_back(e);
    size_t n_rs = 0, n_pre = 0;
    for (const nlohmann::json& r : real) (r["what"] == "reduce_scatter" ? n_rs : n_pre)++;
    REQUIRE(sim_rs.size() >= n_rs);
    REQUIRE(sim_pre.size() >= n_pre);
    size_t i_rs = sim_rs.size() - n_rs, i_pre = sim_pre.size() - n_pre;
    bool first = true;
    int64_t offset = 0;
    for (const nlohmann::json& r : real) {
      const bool rs = r["what"] == "reduce_scatter";
      const SimEvent& s = rs ? sim_rs[i_rs++] : sim_pre[i_pre++];
      const int64_t diff = static_cast<int64_t>(s.live) - r["live"].get<int64_t>();
      INFO("trace index " << r["index"] << " (" << r["what"].get<std::string>() << " "
           << r["by"].get<std::string>() << "): memsim " << s.live << " B, the trace "
           << r["live"].get<int64_t>() << " B");
      if (rs) CHECK(s.bytes == r["size"].get<uint64_t>());
      if (first) {
        offset = diff;
        first = false;
        CHECK(std::llabs(offset) <= 1024);
        continue;
      }
      // The final callback: grad_tensors' 4 B still live on the GPU (see the header).
      const int64_t expected = r["by"] == "final_callback" ? offset - 4 : offset;
      CHECK(diff == expected);
    }
  }
}

TEST_CASE("FSDP2 + LoRA: block 0's post-backward follows the root's unless PEFT's hook makes "
          "its input require grad", "[fsdp2]") {
  // A frozen embedding: block 0 registers no RegisterPostBackwardFunction, and the final
  // callback resharding the root (its embedding) comes before block 0's reduce-scatter.
  // With lora.input_require_grads (PEFT's enable_input_require_grads) block 0's input
  // requires grad: its post-backward runs before the final callback's.
  auto order = [](bool hook) {
    std::vector<std::pair<std::string, std::string>> sets = {
        {"lora.input_require_grads", hook ? "true" : "false"}};
    const Program p = build_program(load_scenario(
        MEMSIM_SOURCE_DIR + "/tests/data/gpu/hft/hft_lora_fsdp2_w8.yaml", sets));
    size_t root_free = 0, block0_rs = 0;
    for (size_t i = 0; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      const std::string& name = p.str(p.tensors[e.tensor].name);
      if (e.type == EventType::free && e.phase == Phase::backward &&
          name == "FSDP2 unsharded model.embed_tokens.weight (all_gather_outputs)")
        root_free = i;
      if (e.type == EventType::alloc && name == "FSDP2 reduce-scatter input (chunk_cat) of block 0")
        block0_rs = i;
    }
    REQUIRE(root_free != 0);
    REQUIRE(block0_rs != 0);
    return block0_rs < root_free;
  };
  CHECK_FALSE(order(false));
  CHECK(order(true));
}
