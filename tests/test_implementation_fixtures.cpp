// model.implementation against real PyTorch: tests/data/torch_cpu_impl/*.json hold training
// steps of CPU stand-ins of other stacks' Llama code (tools/fixtures/impl_models.py, written
// after the sources docs/implementations.md cites), measured with torch 1.13 by
// tools/fixtures/gen_impl_fixtures.py with each stack's own loop (`del pred` before
// backward). Each fixture's scenario is built from its config and compared as the hf
// fixtures are (tests/torch_fixture_test_support.h): forward-end bytes by kind and by
// layer exactly, layer 0's forward allocations in order exactly, the step peak within 2%.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "sim/step/schedule.h"
#include "torch_fixture_test_support.h"

using namespace memsim;

namespace {

const char* kImplFixtureDir = MEMSIM_SOURCE_DIR "/tests/data/torch_cpu_impl";

// The fixture's run: the stack's model code, its SDPA call emulated as the flash kernel,
// torch.optim for-loop, an unlimited device without cuBLAS workspaces or CUDA kernel
// scratch (a CPU run has none).
Scenario scenario_for(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "  implementation: " + c["implementation"].get<std::string>() + "\n";
  y += "  attention: flash\n  dropout: 0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "impl-fixture.yaml");
}

std::vector<std::filesystem::path> fixtures(const std::string& prefix) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kImplFixtureDir))
    if (entry.path().extension() == ".json" && entry.path().filename().string().rfind(prefix, 0) == 0)
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

void run_fixtures(const std::string& prefix) {
  const auto files = fixtures(prefix);
  REQUIRE(files.size() >= 3);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
  }
}

}  // namespace

TEST_CASE("torchtitan's llama3 model code matches its CPU stand-in", "[implementation]") {
  run_fixtures("torchtitan_");
}

TEST_CASE("torchtune's llama3 model code matches its CPU stand-in", "[implementation]") {
  run_fixtures("torchtune_");
}

// LitGPT's GPT with finetune/full.py's loop under Fabric (bf16-true / 32-true): the fused
// qkv and its split, apply_rope with fp32 or bf16 cos/sin buffers, litgpt's RMSNorm,
// LLaMAMLP, the fp32 logits of convert_output and chunked_cross_entropy's 128-row chunks.
TEST_CASE("litgpt's GPT model code matches its CPU stand-in", "[implementation][litgpt]") {
  run_fixtures("litgpt_");
}

namespace {

std::string impl_yaml(const std::string& impl, const std::string& extra_model = "") {
  return "model:\n  preset: llama2-7b\n  layers: 2\n  implementation: " + impl +
         "\n  attention: flash\n" + extra_model +
         "batch:\n  micro_batch: 1\n  seq_len: 256\nprecision:\n  params: bf16\n"
         "device:\n  capacity: 1TiB\n";
}

// The error load_scenario_text raises for `text` with `overrides`, or "" when it loads.
std::string load_error(const std::string& text,
                       const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  try {
    load_scenario_text(text, "impl.yaml", overrides);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("model.implementation: spellings, defaults and the refused combinations", "[implementation]") {
  // Default: transformers' code, the row unchanged.
  const Scenario hf = load_scenario_text(impl_yaml("hf"), "impl.yaml");
  CHECK(hf.model.arch.impl == graph::ModelImpl::hf);
  CHECK(load_scenario_text(impl_yaml("torchtitan"), "impl.yaml").model.arch.impl ==
        graph::ModelImpl::torchtitan);
  CHECK(load_scenario_text(impl_yaml("torchtune"), "impl.yaml").model.arch.impl ==
        graph::ModelImpl::torchtune);

  const std::string bad = load_error(impl_yaml("torchtitn"));
  CHECK(bad.find("impl.yaml:4: model.implementation") != std::string::npos);
  CHECK(bad.find("did you mean 'torchtitan'") != std::string::npos);
  CHECK(load_scenario_text(impl_yaml("litgpt"), "impl.yaml").model.arch.impl == graph::ModelImpl::litgpt);

  struct Case {
    std::string impl, key, value, message;
  };
  const std::vector<Case> refused = {
      {"torchtitan", "model.attention", "eager", "model.attention: torchtitan calls F.scaled_dot_product_attention"},
      {"torchtune", "model.attention", "eager", "model.attention: torchtune calls F.scaled_dot_product_attention"},
      {"torchtitan", "lora.rank", "8", "lora.rank: torchtitan has no LoRA"},
      {"torchtune", "lora.rank", "8", "lora.rank: torchtune's LoRA modules (LoRALinear) are not modelled yet"},
      {"torchtitan", "model.architecture", "qwen2", "model.architecture: torchtitan's Llama model code is modelled for the Llama architecture only"},
      {"torchtitan", "model.qkv_bias", "true", "model.qkv_bias: torchtitan's Llama model code has no such knob"},
      {"torchtitan", "model.tied_embeddings", "true", "model.tied_embeddings:"},
      {"torchtitan", "model.dropout", "0.1", "model.dropout:"},
      {"torchtitan", "precision.autocast", "bf16", "precision.autocast:"},
      {"torchtitan", "parallel.sharding", "fsdp", "parallel.sharding:"},
      {"torchtitan", "checkpoint.policy", "selective", "checkpoint.policy:"},
      {"torchtune", "batch.seq_len", "100", "batch.seq_len: torchtune's output is h.chunk(8, dim=1)"},
      {"torchtune", "loss.impl", "chunked:8", "loss.impl: the stack's own loss is modelled (CEWithChunkedOutputLoss)"},
      {"torchtitan", "loss.impl", "liger", "loss.impl: the stack's own loss is modelled (cross_entropy_loss)"},
      {"litgpt", "loss.impl", "chunked:8", "loss.impl: the stack's own loss is modelled (chunked_cross_entropy, chunk_size 128)"},
      {"litgpt", "lora.rank", "8", "lora.rank: litgpt's LoRA (litgpt/lora.py LoRAQKVLinear"},
      {"litgpt", "precision.autocast", "bf16", "precision.autocast: litgpt's Fabric precision \"bf16-mixed\""},
      {"litgpt", "parallel.sharding", "fsdp", "parallel.sharding: litgpt shards through Fabric's FSDPStrategy"},
      {"litgpt", "parallel.data", "2", "parallel.data: litgpt's multi-device recipes"},
      {"litgpt", "checkpoint.policy", "full", "checkpoint.policy: litgpt checkpoints Blocks only through Fabric's FSDPStrategy"},
      {"litgpt", "step.compile", "true", "step.compile: torch.compile is not modelled with litgpt's model code yet"},
      {"litgpt", "model.attention", "eager", "model.attention: litgpt calls F.scaled_dot_product_attention"},
      {"litgpt", "model.tied_embeddings", "true", "model.tied_embeddings:"},
  };
  for (const Case& c : refused) {
    INFO(c.impl << " " << c.key << "=" << c.value);
    std::vector<std::pair<std::string, std::string>> over = {{c.key, c.value}};
    if (c.key == "parallel.sharding") over.insert(over.begin(), {"parallel.data", "2"});
    if (c.key == "precision.autocast") over.push_back({"precision.params", "fp32"});
    if (c.key == "lora.rank") over.push_back({"lora.targets", "[q_proj, v_proj]"});
    const std::string err = load_error(impl_yaml(c.impl), over);
    CHECK(err.find(c.message) != std::string::npos);
    CHECK(err.find("model.implementation " + c.impl) != std::string::npos);
  }
  // A family without transformers' code.
  const std::string cs336 = load_error(
      "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n  vocab: 100\n"
      "  implementation: torchtitan\nbatch:\n  seq_len: 16\n");
  CHECK(cs336.find("model.implementation: selects a Llama model code, but the family is cs336") !=
        std::string::npos);
}

TEST_CASE("model.implementation: hf keeps transformers' program, the others change it", "[implementation]") {
  // hf given explicitly is the default, event for event.
  const std::string base = impl_yaml("hf");
  std::string without = base;
  without.replace(without.find("  implementation: hf\n"), std::string("  implementation: hf\n").size(), "");
  const Program a = build_program(load_scenario_text(base, "impl.yaml"));
  const Program b = build_program(load_scenario_text(without, "impl.yaml"));
  REQUIRE(a.events.size() == b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    CHECK(a.events[i].bytes == b.events[i].bytes);
    if (a.events[i].bytes != b.events[i].bytes) break;
  }
  // torchtitan keeps no fp32 RMSNorm input copies: fewer bytes live at forward end.
  auto forward_end = [](const Program& p) { return memsim_test::walk(p).forward_end_total; };
  const Program titan = build_program(load_scenario_text(impl_yaml("torchtitan"), "impl.yaml"));
  const Program tune = build_program(load_scenario_text(impl_yaml("torchtune"), "impl.yaml"));
  CHECK(forward_end(titan) < forward_end(a));
  CHECK(forward_end(tune) < forward_end(a));
  CHECK(forward_end(titan) < forward_end(tune));
  // LitGPT's RMSNorm also saves its fp32 x_normed (transformers' saves the 16-bit one),
  // and with MHA (llama2-7b) SDPA's v is a view of the fused qkv output: more is saved.
  const Program lit = build_program(load_scenario_text(impl_yaml("litgpt"), "impl.yaml"));
  CHECK(forward_end(lit) > forward_end(a));
}

TEST_CASE("optimizer.in_backward and checkpoint.offload_activations are refused when true", "[implementation]") {
  const std::string in_bwd = load_error(impl_yaml("torchtune"), {{"optimizer.in_backward", "true"}});
  CHECK(in_bwd.find("--set optimizer.in_backward: an optimizer step per parameter inside backward") !=
        std::string::npos);
  const std::string offload =
      load_error(impl_yaml("hf"), {{"checkpoint.offload_activations", "true"}});
  CHECK(offload.find("checkpoint.offload_activations: saved activations moved to host memory") !=
        std::string::npos);
  CHECK(load_error(impl_yaml("torchtune"),
                   {{"optimizer.in_backward", "false"}, {"checkpoint.offload_activations", "false"}})
            .empty());
  CHECK(load_error(impl_yaml("torchtune"), {{"optimizer.in_backward", "yes please"}})
            .find("optimizer.in_backward") != std::string::npos);
}

TEST_CASE("model.implementation in the report and through memsim run --model", "[implementation]") {
  // --model replaces the model keys but keeps model.implementation (how the model is run).
  const std::string dir = MEMSIM_SOURCE_DIR "/scenarios/";
  const Scenario s = load_scenario_with_model(dir + "llama3-8b-torchtitan-seq8192-h200.yaml",
                                              dir + "models/llama3-8b.json",
                                              {{"batch.seq_len", "256"}});
  CHECK(s.model.arch.impl == graph::ModelImpl::torchtitan);
  CHECK(std::string(to_string(s.model.arch.impl)) == "torchtitan");
  CHECK(std::string(to_string(graph::ModelImpl::hf)) == "hf");
}
