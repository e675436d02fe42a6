// checkpoint.offload_activations: torchtune's OffloadActivations (graph/offload_streams.h,
// scenario/offload_activations_key.h, docs/offload.md "torchtune's OffloadActivations").
//
// Which saves are offloaded is measured on CPU torch 1.13 (tests/data/offload_activations,
// tools/fixtures/gen_offload_activations_fixtures.py: real autograd saves under a stand-in of
// the pack rule, the NoOpManager and torch 2.x's _NoopSaveInputs). No GPU and no fixture
// back the rest (torch 1.13's CPU build has neither the streams nor
// _current_autograd_node, which the rules depend on): each expectation below is derived by
// hand from pytorch/torchtune
// v0.6.1 (a6290a5b) torchtune/training/_activation_offloading.py and torch 2.11's
// torch/utils/checkpoint.py, for a 4-layer Llama-2-7B-shaped torchtune model at B=1, S=256
// in bf16 (D=4096): the layer input h is 2 MiB, the final RMSNorm's fp32 input 4 MiB, its
// rsqrt 1024 bytes (exactly min_offload_size: offloaded), the token ids 2048 bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "torch_fixture_test_support.h"
#include "graph/offload_streams.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t kH = 2 * MiB;    // B*S*D*2: a layer's input
constexpr uint64_t kXf = 4 * MiB;   // B*S*D*4: the final norm's x.float()
constexpr uint64_t kR = 1024;       // B*S*4: its rsqrt(mean + eps)
constexpr uint64_t kTok = 2048;     // B*S*8: the embedding's saved indices

std::string tune_yaml(const std::string& extra = "") {
  return "model:\n  preset: llama2-7b\n  layers: 4\n  implementation: torchtune\n"
         "  attention: flash\nbatch:\n  micro_batch: 1\n  seq_len: 256\n"
         "precision:\n  params: bf16\noptimizer:\n  type: adamw\n  impl: foreach\n"
         "step:\n  kind: train\n  warmup_steps: 1\n"
         "checkpoint:\n  policy: full\n" + extra +
         "device:\n  preset: h100-80gb\n  capacity: 1TiB\n";
}

Scenario load(const std::string& yaml,
              const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return load_scenario_text(yaml, "tune.yaml", overrides);
}

std::string load_error(const std::vector<std::pair<std::string, std::string>>& overrides,
                       const std::string& extra = "") {
  try {
    (void)build_program(load(tune_yaml(extra), overrides));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The measured step's events on the offload stream: +bytes for an alloc, -bytes for the
// free of such a tensor.
std::vector<int64_t> stream_events(const Program& p) {
  std::vector<int64_t> out;
  std::vector<uint8_t> on_stream(p.tensors.size(), 0);
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (e.type == EventType::alloc && e.stream == graph::kOffloadStream) {
      if (e.tensor >= on_stream.size()) on_stream.resize(e.tensor + 1, 0);
      on_stream[e.tensor] = 1;
      if (measuring) out.push_back(static_cast<int64_t>(e.bytes));
    } else if (e.type == EventType::free && e.tensor < on_stream.size() && on_stream[e.tensor]) {
      on_stream[e.tensor] = 0;
      if (measuring) out.push_back(-static_cast<int64_t>(p.tensors[e.tensor].bytes));
    }
  }
  return out;
}

// The fixture's torchtune stand-in as a scenario (tests/test_implementation_fixtures.cpp's
// scenario_for) with checkpointing and offloading on.
Scenario fixture_scenario(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "  implementation: torchtune\n  attention: flash\n  dropout: 0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c["dtype"].get<std::string>() + "\n";
  y += "optimizer:\n  type: adamw\n  impl: for-loop\n";
  if (c.contains("lora_rank")) {
    y += "lora:\n  rank: " + std::to_string(c["lora_rank"].get<int>()) + "\n  targets: [";
    for (const auto& t : c["lora_targets"]) y += t.get<std::string>() + ",";
    y.back() = ']';
    y += "\n";
  }
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "checkpoint:\n  policy: full\n  offload_activations: true\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "offload-fixture.yaml");
}

}  // namespace

TEST_CASE("offload_activations: the offloaded saves match real autograd (CPU fixtures)", "[offload-tune]") {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(MEMSIM_SOURCE_DIR + "/tests/data/offload_activations"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 3);
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Program p = build_program(fixture_scenario(fx["config"]));
    // The pinned bytes at the forward's end: every pack of >= 1024 bytes that is not a
    // Parameter (the token ids, each layer input, the final norm's x.float() and rsqrt
    // twice, its normed output) — with B*S = 64 the rsqrt (256 B) and the ids (512 B) stay
    // on the device; with LoRA the frozen embedding and scale save neither ids nor output.
    CHECK(p.host_offload_bytes == fx["offloaded_bytes"].get<uint64_t>());
    // The fixture's packs include the embedding weight (torch 1.13's EmbeddingBackward0
    // keeps it; 2.x keeps only its size): a Parameter, never offloaded.
    CHECK(fx["packs"].front()[1].get<bool>() == !fx["config"].contains("lora_rank"));
  }
}

TEST_CASE("offload_activations: which saves go to the host, and the host peak", "[offload-tune]") {
  const Program plain = build_program(load(tune_yaml()));
  const Program off = build_program(load(tune_yaml("  offload_activations: true\n")));
  CHECK(plain.host_offload_bytes == 0);
  // The tracker at the forward's end: the token ids (EmbeddingBackward's indices), each
  // checkpointed layer's input (_NoopSaveInputs; its 0-byte dummy stays), the final norm's
  // pow and mul saves of x.float() and of rsqrt (two each: each save is its own pack) and
  // the normed output its scale multiply saves; not the scale (a Parameter), not the
  // head's saves (NoOpManager), not the loss's (outside the `with`).
  CHECK(off.host_offload_bytes == kTok + 4 * kH + 2 * kXf + 2 * kR + kH);
  // PCIe: every offloaded byte goes down once; back up are all but the normed output,
  // which is still in the forward stash when its node (the first to unpack) runs.
  CHECK(off.cost.host_bytes == static_cast<double>(2 * off.host_offload_bytes - kH));
  // Forward end: no layer input is left on the device (the stash's last five ids are the
  // final norm's), where plain checkpointing keeps all four.
  const memsim_test::Walk wp = memsim_test::walk(plain), wo = memsim_test::walk(off);
  CHECK(wp.forward_end_total - wo.forward_end_total == 4 * kH);
  // (This small model's step peak is in the loss and the optimizer, the same with and
  // without; the shipped scenario's end-to-end case below shows the peak going down.)
}

TEST_CASE("offload_activations: copies on the second stream, freed one unpacking node later",
          "[offload-tune]") {
  const Program off = build_program(load(tune_yaml("  offload_activations: true\n")));
  // Backward, in the order of torchtune's hooks:
  //  MulBackward0(x_fp32, rsqrt): two copies, rsqrt's first (memsim's mul keeps `other`
  //    in its first slot; torch 1.13 packs `self` first, the fixture shows: the ids are the
  //    same set, the generated apply's unpack order was not read); normed's node ran first
  //    and emptied the forward stash in its post hook, so nothing else is a stash hit;
  //  RsqrtBackward0: rsqrt's other copy; its hook frees the previous node's two;
  //  PowBackward0: x_fp32's other copy; frees the rsqrt copy;
  //  layer 3's first node: the re-run's input h3 (a copy); frees x_fp32's;
  //  layers 2, 1, 0 the same, each freeing the layer above's input;
  //  EmbeddingBackward0: the token ids; frees h0; the end-of-backward callback frees them.
  const std::vector<int64_t> expected = {
      +int64_t(kR), +int64_t(kXf), +int64_t(kR), -int64_t(kR), -int64_t(kXf),
      +int64_t(kXf), -int64_t(kR),
      +int64_t(kH),  -int64_t(kXf),
      +int64_t(kH),  -int64_t(kH),
      +int64_t(kH),  -int64_t(kH),
      +int64_t(kH),  -int64_t(kH),
      +int64_t(kTok), -int64_t(kH), -int64_t(kTok)};
  CHECK(stream_events(off) == expected);
  // Nothing in the step without the key goes on that stream.
  CHECK(stream_events(build_program(load(tune_yaml()))).empty());
}

TEST_CASE("offload_activations: the forward stash keeps the last five ids", "[offload-tune]") {
  // Ids: tokens 1, then per layer l the dummy 2+2l and the input 3+2l. The input of layer
  // l-3 (id 2l-3 <= (3+2l) - 5) leaves the stash when layer l packs its own: with 8 layers
  // the forward's device peak carries three layer inputs at most, not eight.
  const Program p4 = build_program(load(tune_yaml("  offload_activations: true\n")));
  const Program p8 = build_program(load(tune_yaml("  offload_activations: true\n"), {{"model.layers", "8"}}));
  const Program q8 = build_program(load(tune_yaml(), {{"model.layers", "8"}}));
  const memsim_test::Walk w8 = memsim_test::walk(p8), v8 = memsim_test::walk(q8);
  CHECK(v8.forward_end_total - w8.forward_end_total == 8 * kH);
  CHECK(p8.host_offload_bytes == p4.host_offload_bytes + 4 * kH);
}

TEST_CASE("offload_activations: LoRA and gradient accumulation run the same hooks", "[offload-tune]") {
  const std::string lora =
      "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, v_proj]\n  adapter_dtype: bf16\n";
  const Program l = build_program(load(tune_yaml("  offload_activations: true\n" + lora)));
  // The frozen embedding saves no indices, and the frozen norm scale's multiply saves only
  // the scale (MulBackward0 keeps `self` only for `other`'s grad): the layer inputs and the
  // norm's fp32 input and rsqrt.
  CHECK(l.host_offload_bytes == 4 * kH + 2 * kXf + 2 * kR);
  const Program ga = build_program(load(tune_yaml("  offload_activations: true\n"), {{"batch.grad_accum", "2"}}));
  // Each micro-batch packs and unpacks the same set; the tracker is empty between them.
  CHECK(ga.host_offload_bytes == kTok + 4 * kH + 2 * kXf + 2 * kR + kH);
  CHECK(stream_events(ga).size() == 2 * 18);
}

TEST_CASE("offload_activations: refused combinations name the key", "[offload-tune][torchtune]") {
  const std::pair<std::string, std::string> on{"checkpoint.offload_activations", "true"};
  CHECK(load_error({on}).empty());
  CHECK_THAT(load_error({on, {"model.implementation", "hf"}}),
             Catch::Contains("model.implementation: with checkpoint.offload_activations: true"));
  CHECK_THAT(load_error({on, {"checkpoint.policy", "none"}}),
             Catch::Contains("checkpoint.policy: with checkpoint.offload_activations: true, the "
                             "recipes raise"));
  CHECK_THAT(load_error({on, {"checkpoint.reentrant", "true"}}), Catch::Contains("checkpoint.reentrant"));
  CHECK_THAT(load_error({on, {"checkpoint.offload", "all"}}), Catch::Contains("checkpoint.offload:"));
  CHECK_THAT(load_error({on, {"precision.params", "fp32"}}),
             Catch::Contains("precision.params: with checkpoint.offload_activations"));
  CHECK_THAT(load_error({on, {"step.compile", "true"}}), Catch::Contains("step.compile"));
  CHECK_THAT(load_error({on, {"step.kind", "forward"}}), Catch::Contains("step.kind"));
  CHECK_THAT(load_error({on, {"parallel.data", "2"}}), Catch::Contains("parallel.data"));
  CHECK_THAT(load_error({{"checkpoint.offload_activations", "maybe"}}),
             Catch::Contains("checkpoint.offload_activations"));
  CHECK(load_error({{"checkpoint.offload_activations", "false"}}).empty());
}

TEST_CASE("memsim run with checkpoint.offload_activations, end to end", "[offload-tune]") {
  const std::string scenario =
      std::string("'") + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtune-offload-h100.yaml'";
  const auto on = memsim_test::run_shell(memsim_test::memsim_command() + "run " + scenario + " --json - 2>/dev/null");
  REQUIRE(on.status == 0);
  const auto off = memsim_test::run_shell(memsim_test::memsim_command() + "run " + scenario +
                                          " --set checkpoint.offload_activations=false --json - 2>/dev/null");
  REQUIRE(off.status == 0);
  const nlohmann::json j = nlohmann::json::parse(on.out), p = nlohmann::json::parse(off.out);
  // Llama 3 8B, B=2, S=8192: 32 layer inputs of 2*8192*4096*2 bytes, the final norm's saves
  // (2 x 256 MiB fp32, 2 x 64 KiB rsqrt, the 128 MiB normed output), the 128 KiB token ids.
  const uint64_t h = 2ull * 8192 * 4096 * 2;
  CHECK(j["host_offload_bytes"].get<uint64_t>() == 32 * h + 2 * (2 * h) + 2 * (2ull * 8192 * 4) + h +
                                                       2ull * 8192 * 8);
  CHECK_FALSE(p.contains("host_offload_bytes"));
  CHECK(j["peak_allocated_bytes"].get<uint64_t>() < p["peak_allocated_bytes"].get<uint64_t>());
  // The plan search rebuilds the checkpoint section (policies other than full): refused by
  // the key, exit 1.
  const auto opt = memsim_test::run_shell(memsim_test::memsim_command() + "optimize " + scenario +
                                          " --budget 70GiB 2>&1");
  CHECK(opt.status == 1);
  CHECK(opt.out.find("checkpoint.offload_activations") != std::string::npos);
}
