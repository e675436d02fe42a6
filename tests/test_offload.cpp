// Activation offload (checkpoint.offload: torch.autograd.graph.save_on_cpu(pin_memory=True)
// around chosen layers; graph/offload.h, docs/offload.md) against real PyTorch:
// tests/data/offload/*.json are the CPU training steps of gen_torch_cpu_fixtures.py with
// save_on_cpu's pack/unpack done around the offloaded layers
// (tools/fixtures/gen_offload_fixtures.py; host copies outside the device count, the
// unpack's `.to(device)` as a new tensor in backward). Compared: the forward-end bytes by
// kind and by layer exactly, the step's peak within 2%, layer 0's allocation sizes
// (tools: torch_fixture_test_support.h), and the host side: the pinned peak, the number
// of packed tensors and the PCIe bytes of the measured step exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "torch_fixture_test_support.h"
#include "graph/offload.h"
#include "scenario/offload_keys.h"
#include "sim/analysis/step_time.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/offload";

// The fixture's training run as a scenario (as tests/test_hf_fixtures.cpp builds it) plus
// checkpoint.offload.
std::string fixture_yaml(const nlohmann::json& c, const std::string& offload) {
  const std::string family = c["family"];
  std::string y = "model:\n  family: " + family + "\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (family == "hf-gpt2" ? "true" : "false") + "\n";
  y += "  attention: eager\n  dropout: 0.0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: fp32\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "checkpoint:\n  offload: " + offload + "\n";
  y += "device:\n  preset: h100-80gb\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

std::string offload_value(const nlohmann::json& layers) {
  if (layers.is_string()) return layers.get<std::string>();
  std::string s = "[";
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? ", " : "") + std::to_string(layers[i].get<int>());
  return s + "]";
}

// The measured step's unpacks: allocations named _to_copy in backward.
struct Unpacks {
  uint64_t count = 0, bytes = 0;
};
Unpacks measured_unpacks(const Program& p) {
  Unpacks u;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.type == EventType::alloc && e.phase == Phase::backward &&
        p.str(e.op) == "_to_copy") {
      ++u.count;
      u.bytes += e.bytes;
    }
  }
  return u;
}

Scenario scenario_text(const std::string& yaml) { return load_scenario_text(yaml, "offload.yaml"); }

std::string load_error(const std::string& yaml) {
  try {
    const Scenario s = scenario_text(yaml);
    (void)build_program(s);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint.offload matches save_on_cpu on real PyTorch (CPU fixtures)", "[offload]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 4);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_text(fixture_yaml(fx["config"], offload_value(fx["offload_layers"])));
    REQUIRE(offloads(scenario.checkpoint));
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
    // Host side: every saved tensor of the offloaded layers is one pinned copy, alive from
    // its pack to its node's backward; the measured step moves each across PCIe twice.
    CHECK(program.host_offload_bytes == fx["host_peak_bytes"].get<uint64_t>());
    const Unpacks u = measured_unpacks(program);
    CHECK(u.count == fx["measured_packs"].get<uint64_t>());
    CHECK(u.bytes == fx["measured_packed_bytes"].get<uint64_t>());
    CHECK(program.cost.host_bytes == 2.0 * fx["measured_packed_bytes"].get<double>());
    // The time model's transfer part: those bytes at 0.8 of the preset's PCIe rate.
    const StepTime t = estimate_step_time(program.cost, scenario.device);
    REQUIRE(t.estimated);
    CHECK(t.part[static_cast<int>(CostPart::transfer)] ==
          Approx(program.cost.host_bytes / (scenario.device.pcie_bandwidth * kLinkEfficiency)));
  }
}

TEST_CASE("checkpoint.offload: the layers left on the device keep their saved tensors", "[offload]") {
  // cs336 (the staff model) too: offloading layer 0 only removes exactly what layer 0 left
  // alive at the forward's end, and nothing of layer 1's.
  const std::string base =
      "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n  vocab: 256\n"
      "  context_length: 64\nbatch:\n  micro_batch: 2\n  seq_len: 32\n"
      "optimizer:\n  type: adamw\n  impl: foreach\ndevice:\n  capacity: 1TiB\n";
  const Program none = build_program(scenario_text(base));
  const Program first = build_program(scenario_text(base + "checkpoint:\n  offload: [0]\n"));
  memsim_test::Walk wn = memsim_test::walk(none), wf = memsim_test::walk(first);
  CHECK(wf.forward_end_activations_by_layer[1] == wn.forward_end_activations_by_layer[1]);
  CHECK(wf.forward_end_activations_by_layer[0] < wn.forward_end_activations_by_layer[0]);
  CHECK(wf.forward_end_total < wn.forward_end_total);
  CHECK(first.host_offload_bytes > 0);
  CHECK(none.host_offload_bytes == 0);
  CHECK(none.cost.host_bytes == 0);
  // `all` is every layer; --set's "0,1" spelling is the same list.
  const Scenario all = scenario_text(base + "checkpoint:\n  offload: all\n");
  const Scenario list = scenario_text(base + "checkpoint:\n  offload: \"0,1\"\n");
  CHECK(offload_layers(all.checkpoint, 2) == std::vector<bool>{true, true});
  CHECK(offload_layers(list.checkpoint, 2) == std::vector<bool>{true, true});
  CHECK(build_program(all).host_offload_bytes == build_program(list).host_offload_bytes);
  CHECK_FALSE(offloads(scenario_text(base + "checkpoint:\n  offload: none\n").checkpoint));
}

TEST_CASE("checkpoint.offload refuses what it does not model, by key", "[offload]") {
  const std::string base =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n"
      "  vocab: 256\n  context_length: 64\nbatch:\n  micro_batch: 2\n  seq_len: 32\n"
      "optimizer:\n  type: adamw\ndevice:\n  capacity: 1TiB\n";
  auto error = [&](const std::string& extra) { return load_error(base + extra); };
  CHECK_THAT(error("checkpoint:\n  offload: [2]\n"),
             Catch::Contains("checkpoint.offload: layer 2 does not exist"));
  CHECK_THAT(error("checkpoint:\n  offload: [0, 0]\n"), Catch::Contains("listed twice"));
  CHECK_THAT(error("checkpoint:\n  offload: [first]\n"),
             Catch::Contains("checkpoint.offload: expected a list of layer indices"));
  CHECK_THAT(error("checkpoint:\n  policy: full\n  offload: [1]\n"),
             Catch::Contains("checkpoint.offload: layer 1 is also checkpointed by checkpoint.policy full"));
  CHECK_THAT(error("checkpoint:\n  offload: all\nparallel:\n  data: 2\n  sharding: fsdp\n"),
             Catch::Contains("parallel.sharding"));
  CHECK_THAT(error("checkpoint:\n  offload: all\nstep:\n  kind: forward\n"),
             Catch::Contains("step.kind"));
  CHECK_THAT(error("checkpoint:\n  offload: all\nstep:\n  compile: true\n"),
             Catch::Contains("step.compile"));
  // Checkpointing other layers than the offloaded ones is a real combination.
  CHECK(error("checkpoint:\n  policy: block:1\n  offload: [1]\n").empty());
}

TEST_CASE("memsim run and optimize with checkpoint.offload, end to end", "[offload]") {
  // The shipped cs336 scenario through the binary: the key from --set, the host bytes and
  // the PCIe seconds in the JSON; without the key neither field appears.
  const std::string scenario = std::string("'") + MEMSIM_SOURCE_DIR + "/scenarios/cs336-small-train-ctx512.yaml'";
  const auto off = memsim_test::run_shell(memsim_test::memsim_command() + "run " + scenario +
                                          " --set checkpoint.offload=0,1 --json - 2>/dev/null");
  REQUIRE(off.status == 0);
  const nlohmann::json j = nlohmann::json::parse(off.out);
  CHECK(j["host_offload_bytes"].get<uint64_t>() > 0);
  CHECK(j["estimated_step_seconds"]["transfer"].get<double>() > 0);
  const auto plain = memsim_test::run_shell(memsim_test::memsim_command() + "run " + scenario +
                                            " --json - 2>/dev/null");
  REQUIRE(plain.status == 0);
  const nlohmann::json p = nlohmann::json::parse(plain.out);
  CHECK_FALSE(p.contains("host_offload_bytes"));
  CHECK(p["estimated_step_seconds"]["transfer"].get<double>() == 0);
  CHECK(j["peak_allocated_bytes"].get<uint64_t>() <= p["peak_allocated_bytes"].get<uint64_t>());
  // optimize searches offload itself: a scenario's own list is refused by key (exit 1).
  const auto opt = memsim_test::run_shell(memsim_test::memsim_command() + "optimize " + scenario +
                                          " --budget 4GiB --set checkpoint.offload=all 2>&1");
  CHECK(opt.status == 1);
  CHECK(opt.out.find("checkpoint.offload") != std::string::npos);
}
