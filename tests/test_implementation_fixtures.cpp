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
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kImplFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_impl";

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
  if (c.value("in_backward", false)) y += "  in_backward: true\n";  // optimizer_in_bwd
  if (c.contains("lora_rank")) {  // lora_llama3 (memsim's module names; no dropout)
    y += "lora:\n  rank: " + std::to_string(c["lora_rank"].get<int>()) + "\n  targets: [";
    for (const auto& t : c["lora_targets"]) y += t.get<std::string>() + ",";
    y.back() = ']';
    y += "\n";
    if (c.contains("lora_dropout"))  // LitGPT's lora_dropout (native_dropout, as on CUDA)
      y += "  dropout: " + std::to_string(c["lora_dropout"].get<double>()) + "\n";
  }
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

// LitGPT's LoRA (litgpt/lora.py LoRALinear on attn.proj and the MLP, the frozen rest)
// under finetune/lora.py: lm_head_chunk_size=128's list of logits (fp32 copies of each
// bf16 chunk), the sliced last chunk and chunked_cross_entropy's list branch.
TEST_CASE("litgpt's LoRA matches its CPU stand-in", "[implementation][litgpt]") {
  run_fixtures("litlora_");
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
      {"torchtune", "lora.base_dtype", "nf4", "lora.base_dtype: torchtune's QLoRA (quantize_base: torchao's NF4Tensor"},
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
      {"litgpt", "lora.rank", "8", "lora.targets: litgpt's lora_query / lora_key / lora_value"},
      {"litgpt", "precision.autocast", "bf16", "precision.autocast: litgpt's Fabric precision \"bf16-mixed\""},
      {"litgpt", "parallel.sharding", "fsdp", "parallel.sharding: litgpt shards through Fabric's FSDPStrategy"},
      {"litgpt", "parallel.data", "2", "parallel.data: litgpt's multi-device recipes"},
      {"litgpt", "checkpoint.policy", "full", "checkpoint.policy: litgpt checkpoints Blocks only through Fabric's FSDPStrategy"},
      // step.compile runs pretrain.py, which builds fused AdamW (docs/compile.md "LitGPT's code").
      {"litgpt", "step.compile", "true", "optimizer.impl: litgpt pretrain.py (the script that compiles) builds its optimizer with fused=True"},
      {"litgpt", "model.attention", "eager", "model.attention: litgpt calls F.scaled_dot_product_attention"},
      {"litgpt", "model.tied_embeddings", "true", "model.tied_embeddings:"},
  };
  for (const Case& c : refused) {
    INFO(c.impl << " " << c.key << "=" << c.value);
    std::vector<std::pair<std::string, std::string>> over = {{c.key, c.value}};
    if (c.key == "parallel.sharding") over.insert(over.begin(), {"parallel.data", "2"});
    if (c.key == "precision.autocast") over.push_back({"precision.params", "fp32"});
    if (c.key == "lora.rank" || c.key == "lora.base_dtype") {
      over.push_back({"lora.rank", "8"});
      over.push_back({"lora.targets", "[q_proj, v_proj]"});
    }
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

// --- issue #16 item 7: torchtune's LoRA and optimizer_in_bwd ------------------------------

TEST_CASE("torchtune's LoRALinear (lora_llama3) matches its CPU stand-in", "[torchtune]") {
  run_fixtures("tunelora_");
}

TEST_CASE("torchtune's optimizer_in_bwd matches its CPU stand-in", "[torchtune]") {
  run_fixtures("tuneinbwd_");
  // The stand-in's real run: no .grad is alive once backward is done.
  for (const auto& path : fixtures("tuneinbwd_")) {
    const nlohmann::json fx = memsim_test::load_json(path);
    CHECK(fx["marks"]["backward_end"]["gradients"].get<uint64_t>() == 0);
    CHECK(fx["marks"]["backward_end"]["optimizer_state"].get<uint64_t>() ==
          fx["marks"]["forward_end"]["optimizer_state"].get<uint64_t>());
  }
}

namespace {

// The most bytes of parameters' .grad alive at once in the measured step, and their sum at
// the end of the program's events (program/tensor_names.h NameRole::grad).
struct GradLive {
  uint64_t max = 0;
};
GradLive grad_live(const Program& p) {
  GradLive g;
  uint64_t cur = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type != EventType::alloc && e.type != EventType::free) continue;
    if (p.tensors[e.tensor].role != NameRole::grad) continue;
    cur = e.type == EventType::alloc ? cur + e.bytes : cur - e.bytes;
    g.max = std::max(g.max, cur);
  }
  return g;
}

}  // namespace

TEST_CASE("optimizer.in_backward: one .grad at a time, the same state, a lower peak", "[torchtune]") {
  // llama3-8b on torchtune's code at seq 2048, full checkpointing, bf16 AdamW (foreach).
  const std::string yaml = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama3-8b-torchtune-seq8192-h200.yaml";
  const std::vector<std::pair<std::string, std::string>> base = {{"batch.seq_len", "2048"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return load_scenario(yaml, more);
  };
  const Scenario plain = with({});
  const Scenario in_bwd = with({{"optimizer.in_backward", "true"}});
  REQUIRE(in_bwd.recipe.optimizer_in_backward);
  const Program a = build_program(plain), b = build_program(in_bwd);
  // Parameters: 8,030,261,248 bf16 values; the largest is output.weight (128256 x 4096).
  const uint64_t params = 8030261248ull * 2, largest = 128256ull * 4096 * 2;
  CHECK(grad_live(a).max == params);   // every .grad alive before the step
  CHECK(grad_live(b).max == largest);  // never more than one parameter's
  // AdamW's exp_avg and exp_avg_sq exist for every parameter either way.
  const memsim_test::Walk wa = memsim_test::walk(a), wb = memsim_test::walk(b);
  CHECK(wa.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * params);
  CHECK(wb.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * params);
  // The step's peak loses the full set of grads (and foreach's sqrt list), not more.
  CHECK(wb.step_peak < wa.step_peak);
  CHECK(wa.step_peak - wb.step_peak >= params - largest);
}

TEST_CASE("optimizer.in_backward and checkpoint.offload_activations: what is refused", "[torchtune]") {
  const std::string offload =
      load_error(impl_yaml("hf"), {{"checkpoint.offload_activations", "true"}});
  // Modelled with torchtune's model code only (tests/test_offload_activations.cpp).
  CHECK(offload.find("model.implementation: with checkpoint.offload_activations: true") !=
        std::string::npos);
  CHECK(load_error(impl_yaml("torchtune"),
                   {{"optimizer.in_backward", "false"}, {"checkpoint.offload_activations", "false"}})
            .empty());
  CHECK(load_error(impl_yaml("torchtune"), {{"optimizer.in_backward", "yes please"}})
            .find("optimizer.in_backward") != std::string::npos);
  // Valid on any single-GPU row with torch.optim.
  CHECK(load_error(impl_yaml("torchtune"), {{"optimizer.in_backward", "true"}}).empty());
  CHECK(load_error(impl_yaml("hf"), {{"optimizer.in_backward", "true"}}).empty());
  struct Case {
    std::string impl;
    std::vector<std::pair<std::string, std::string>> over;
    std::string message;
  };
  const std::vector<Case> refused = {
      {"torchtune", {{"batch.grad_accum", "4"}}, "--set batch.grad_accum: with optimizer.in_backward: true, each gradient is freed"},
      // (torchtune with parallel.data > 1 is refused before: its distributed recipes shard with FSDP2.)
      {"hf", {{"parallel.data", "2"}}, "--set parallel.data: with optimizer.in_backward: true, only one GPU"},
      {"hf", {{"optimizer.type", "adamw8bit"}}, "--set optimizer.type: with optimizer.in_backward: true, only torch.optim's"},
      {"hf", {{"optimizer.impl", "out-of-place"}}, "--set optimizer.impl: with optimizer.in_backward: true, only torch.optim's"},
      {"torchtune", {{"step.kind", "forward-backward"}}, "--set step.kind: with optimizer.in_backward: true"},
      {"hf", {{"precision.master_weights", "true"}}, "--set precision.master_weights: with optimizer.in_backward: true"},
      {"hf", {{"step.compile", "true"}}, "--set step.compile: with optimizer.in_backward: true"},
      {"torchtune", {{"lora.rank", "8"}, {"lora.targets", "[q_proj]"}},
       "--set lora.rank: with optimizer.in_backward: true, torchtune's lora_finetune_single_device has no optimizer_in_bwd"},
  };
  for (const Case& c : refused) {
    INFO(c.message);
    auto over = c.over;
    over.insert(over.begin(), {"optimizer.in_backward", "true"});
    const std::string err = load_error(impl_yaml(c.impl), over);
    CHECK(err.find(c.message) != std::string::npos);
  }
  // The key's own line when the file sets it.
  const std::string in_file = load_error(impl_yaml("torchtune") + "optimizer:\n  in_backward: true\n",
                                         {{"batch.grad_accum", "2"}});
  CHECK(in_file.find("--set batch.grad_accum: with optimizer.in_backward: true") != std::string::npos);
  // Also available on the hf rows with LoRA (a hand-written loop with the same hooks).
  CHECK(load_error(impl_yaml("hf"), {{"optimizer.in_backward", "true"}, {"lora.rank", "8"},
                                     {"lora.targets", "[q_proj]"}}).empty());
}

TEST_CASE("torchtune LoRA: the lora.* keys lora_llama3 can express", "[torchtune]") {
  auto lora = [](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), {{"lora.rank", "8"}});
    return more;
  };
  // Adapters in the model dtype by default (set_default_dtype), fp32 for PEFT.
  const Scenario tune = load_scenario_text(impl_yaml("torchtune"), "impl.yaml",
                                           lora({{"lora.targets", "[q_proj, v_proj]"}}));
  CHECK(tune.lora.adapter_dtype == DType::bf16);
  const Scenario hf = load_scenario_text(impl_yaml("hf"), "impl.yaml",
                                         lora({{"lora.targets", "[q_proj, v_proj]"}}));
  CHECK(hf.lora.adapter_dtype == DType::fp32);
  CHECK(load_error(impl_yaml("torchtune"), lora({{"lora.targets", "all-linear"}})).empty());
  CHECK(load_error(impl_yaml("torchtune"),
                   lora({{"lora.targets", "[o_proj, gate_proj, up_proj, down_proj]"}})).empty());
  const std::string partial = load_error(impl_yaml("torchtune"), lora({{"lora.targets", "[q_proj, up_proj]"}}));
  CHECK(partial.find("lora.targets: torchtune's apply_lora_to_mlp adapts w1, w2 and w3 together") !=
        std::string::npos);
  const std::string dtype = load_error(
      impl_yaml("torchtune"), lora({{"lora.targets", "[q_proj]"}, {"lora.adapter_dtype", "fp32"}}));
  CHECK(dtype.find("lora.adapter_dtype: torchtune builds the adapters in the model's dtype") != std::string::npos);
  const std::string hook = load_error(
      impl_yaml("torchtune"), lora({{"lora.targets", "[q_proj]"}, {"lora.input_require_grads", "true"}}));
  CHECK(hook.find("lora.input_require_grads: PEFT's enable_input_require_grads") != std::string::npos);
  const std::string output = load_error(impl_yaml("torchtune"), lora({{"lora.targets", "[output]"}}));
  CHECK(output.find("lora.targets") != std::string::npos);
}

TEST_CASE("torchtune LoRA on llama3-8b: adapters, frozen base, state on the adapters only", "[torchtune]") {
  const std::string yaml = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama3-8b-torchtune-lora-h100.yaml";
  const Scenario s = load_scenario(yaml);
  const Program p = build_program(s);
  const memsim_test::Walk w = memsim_test::walk(p);
  // 8B_lora_single_device: rank 8 on q_proj 8 x (4096 + 4096), v_proj 8 x (4096 + 1024),
  // output_proj 8 x (4096 + 4096) and w1, w2, w3 8 x (4096 + 14336) each: 614,400 values
  // per layer, 19,660,800 in all, bf16 like the base.
  const uint64_t base = 8030261248ull * 2, adapters = 32ull * 614400 * 2;
  CHECK(adapters == 19660800ull * 2);
  CHECK(w.forward_end_by_kind.at(TensorKind::parameter) == base + adapters);
  // Fused AdamW: exp_avg, exp_avg_sq and a 0-d fp32 device `step` per adapter (384).
  CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * adapters + 384 * 4);
  CHECK(grad_live(p).max == adapters);  // only the adapters get a .grad
}

// --- issue #16: LitGPT's LoRA (litgpt/lora.py, finetune/lora.py) -------------------------

TEST_CASE("litgpt LoRA: the lora.* keys litgpt's Config can express", "[implementation][litgpt]") {
  auto lora = [](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), {{"lora.rank", "8"}});
    return more;
  };
  // lora_projection, lora_mlp; the adapters in the model dtype (fabric.init_module).
  const Scenario s = load_scenario_text(impl_yaml("litgpt"), "impl.yaml",
                                        lora({{"lora.targets", "[o_proj, gate_proj, up_proj, down_proj]"}}));
  CHECK(s.lora.adapter_dtype == DType::bf16);
  CHECK(load_error(impl_yaml("litgpt"), lora({{"lora.targets", "[o_proj]"}})).empty());
  CHECK(load_error(impl_yaml("litgpt"), lora({{"lora.targets", "[gate_proj, up_proj, down_proj]"}})).empty());
  // A sequence that is not a multiple of 8 is fine (torchtune's h.chunk(8) is not litgpt's).
  CHECK(load_error(impl_yaml("litgpt"), lora({{"lora.targets", "[o_proj]"}, {"batch.seq_len", "300"}})).empty());
  // lora_dropout (nn.Dropout = native_dropout on CUDA), finetune/lora.py's default 0.05.
  CHECK(load_error(impl_yaml("litgpt"), lora({{"lora.targets", "[o_proj]"}, {"lora.dropout", "0.05"}})).empty());
  struct Case {
    std::vector<std::pair<std::string, std::string>> over;
    std::string message;
  };
  const std::vector<Case> refused = {
      {{{"lora.targets", "[q_proj, v_proj]"}}, "--set lora.targets: litgpt's lora_query / lora_key / lora_value adapt the fused qkv through LoRAQKVLinear"},
      {{{"lora.targets", "all-linear"}}, "lora.targets: litgpt's lora_query"},
      {{{"lora.targets", "[o_proj, up_proj]"}}, "--set lora.targets: litgpt's lora_mlp adapts fc_1, fc_2 and proj together"},
      {{{"lora.targets", "[o_proj]"}, {"lora.base_dtype", "nf4"}}, "--set lora.base_dtype: litgpt's --quantize bnb.*"},
      {{{"lora.targets", "[o_proj]"}, {"lora.adapter_dtype", "fp32"}}, "--set lora.adapter_dtype: litgpt builds the adapters under fabric.init_module"},
      {{{"lora.targets", "[o_proj]"}, {"lora.input_require_grads", "true"}}, "--set lora.input_require_grads:"},
      {{{"lora.targets", "[o_proj]"}, {"batch.seq_len", "129"}}, "--set batch.seq_len: with lm_head_chunk_size=128 the last logits chunk has one position"},
  };
  for (const Case& c : refused) {
    INFO(c.message);
    const std::string err = load_error(impl_yaml("litgpt"), lora(c.over));
    CHECK(err.find(c.message) != std::string::npos);
    CHECK(err.find("model.implementation litgpt") != std::string::npos);
  }
}

TEST_CASE("litgpt LoRA on llama3-8b: LitGPT's trainable count, frozen base, state on the adapters", "[implementation][litgpt]") {
  // config_hub/finetune/llama-3-8b/lora.yaml's shape (bf16-true, micro-batch 1, s 512) with
  // lora_projection and lora_mlp at r 32 (its q/v targets and dropout are refused).
  const std::string yaml = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama3-8b-litgpt-b4-seq512-h200.yaml";
  const Scenario s = load_scenario(yaml, {{"batch.micro_batch", "1"}, {"lora.rank", "32"},
                                          {"lora.targets", "[o_proj, gate_proj, up_proj, down_proj]"}});
  const Program p = build_program(s);
  const memsim_test::Walk w = memsim_test::walk(p);
  // litgpt/lora.py: LoRALinear(in, out) adds lora_A (r, in) and lora_B (out, r).
  // Llama-3-8B (litgpt/config.py): n_embd 4096, n_head 32, head_size 128, n_layer 32,
  // intermediate_size 14336. `num_parameters(model, requires_grad=True)`:
  const uint64_t r = 32, n_embd = 4096, q = 32 * 128, inter = 14336, layers = 32;
  const uint64_t proj = r * q + n_embd * r;                                 // attn.proj
  const uint64_t mlp = 2 * (r * n_embd + inter * r) + (r * inter + n_embd * r);  // fc_1, fc_2, proj
  const uint64_t trainable = layers * (proj + mlp);
  CHECK(trainable == 65011712);
  const uint64_t base = 8030261248ull * 2, adapters = trainable * 2;  // bf16
  CHECK(w.forward_end_by_kind.at(TensorKind::parameter) == base + adapters);
  CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * adapters);  // exp_avg, exp_avg_sq
  CHECK(grad_live(p).max == adapters);  // only the adapters get a .grad
}
