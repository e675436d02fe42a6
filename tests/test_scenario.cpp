#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "allocator/units.h"
#include "scenario/scenario.h"
#include "scenario/yaml_fields.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using Overrides = std::vector<std::pair<std::string, std::string>>;

Scenario load(const std::string& text, const Overrides& overrides = {}) {
  return load_scenario_text(text, "t.yaml", overrides);
}

// The ScenarioError message for `text`, or "" when it loads.
std::string error_of(const std::string& text, const Overrides& overrides = {}) {
  try {
    load(text, overrides);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

const char* kXl = "model:\n  preset: cs336-xl\nbatch:\n  seq_len: 128\n";

}  // namespace

TEST_CASE("a model preset fills every model field", "[scenario]") {
  const Scenario s = load(kXl);
  CHECK(s.model.preset == "cs336-xl");
  CHECK(s.model.family == ModelFamily::cs336);
  CHECK(s.model.layers == 32);
  CHECK(s.model.d_model == 2560);
  CHECK(s.model.heads == 32);
  CHECK(s.model.kv_heads == 32);
  CHECK(s.model.d_ff == 10240);
  CHECK(s.model.vocab == 10000);
  CHECK_FALSE(s.model.tied_embeddings);
  // CS336 models are built with context_length = the benchmarked length.
  CHECK(s.model.context_length == 128);
  CHECK(s.batch.micro_batch == 1);
  CHECK(s.name == "t");
  CHECK(s.source == "t.yaml");
}

TEST_CASE("every listed preset expands", "[scenario]") {
  for (const auto& info : model_presets()) {
    INFO(info.name);
    const Scenario s = load("model: {preset: " + info.name + "}\nbatch: {seq_len: 64}\n");
    CHECK(s.model.preset == info.name);
    CHECK(s.model.d_model % s.model.heads == 0);
    CHECK_FALSE(info.summary.empty());
  }
  for (const auto& info : device_presets()) {
    INFO(info.name);
    const Scenario s = load(std::string(kXl) + "device: {preset: " + info.name + "}\n");
    CHECK(s.device.preset == info.name);
    CHECK(s.device.capacity > s.device.cuda_context);
  }
  CHECK(find_model_preset("no-such-model") == nullptr);
  REQUIRE(find_model_preset("llama3-8b") != nullptr);
  CHECK(find_model_preset("llama3-8b")->kv_heads == 8);
}

TEST_CASE("device presets carry capacity, context and cuBLAS workspace", "[scenario]") {
  const Scenario s = load(kXl);  // no device: the H100 80GB
  CHECK(s.device.preset == "h100-80gb");
  // Measured on an H100 80GB HBM3 (tests/data/h100/cuda_runs.json): cudaMemGetInfo's
  // total, and what lies outside the allocator after a training step.
  CHECK(s.device.capacity == 85017493504ull);
  CHECK(s.device.cuda_context == 787283968ull);
  CHECK(s.device.cublas_workspace == 33554432);  // sm_90
  CHECK(find_device_preset("a100-80gb")->cublas_workspace == 8519680);
  CHECK(find_device_preset("h200")->cublas_workspace == 33554432);
}

TEST_CASE("fixed-context presets default seq_len and context_length", "[scenario]") {
  const Scenario gpt2 = load("model:\n  preset: gpt2-small\n");
  CHECK(gpt2.batch.seq_len == 1024);
  CHECK(gpt2.model.context_length == 1024);
  CHECK(gpt2.model.tied_embeddings);
  // Longer than the preset: refused (GPT-2's position table has 1024 rows), unless
  // model.context_length extends the model on purpose (issue #19).
  CHECK(error_of("model: {preset: gpt2-small}\nbatch: {seq_len: 2048}\n") ==
        "t.yaml:2: batch.seq_len: 2048 is longer than the model's context length 1024 (that of "
        "model.preset 'gpt2-small'); set model.context_length: 2048 to extend the model (a larger "
        "position table or RoPE cache)");
  CHECK(load("model: {preset: gpt2-small, context_length: 2048}\nbatch: {seq_len: 2048}\n")
            .model.context_length == 2048);
  // An explicit context_length is kept and must hold the sequence.
  CHECK(load("model: {preset: cs336-small, context_length: 512}\nbatch: {seq_len: 128}\n")
            .model.context_length == 512);
  CHECK(error_of("model:\n  preset: cs336-small\n  context_length: 256\nbatch:\n  seq_len: 512\n") ==
        "t.yaml:5: batch.seq_len: 512 is longer than model.context_length 256");
}

TEST_CASE("explicit fields override the preset", "[scenario]") {
  const Scenario s = load(
      "model:\n  preset: cs336-xl\n  layers: 4\n  heads: 16\n  tied_embeddings: true\n"
      "batch:\n  seq_len: 256\n  micro_batch: 2\n"
      "device:\n  preset: a100-40gb\n  capacity: 20GiB\n  cuda_context: 300MiB\n");
  CHECK(s.model.layers == 4);
  CHECK(s.model.heads == 16);
  CHECK(s.model.kv_heads == 16);  // an MHA preset stays MHA
  CHECK(s.model.d_model == 2560);
  CHECK(s.model.tied_embeddings);
  CHECK(s.batch.micro_batch == 2);
  CHECK(s.device.capacity == 20 * GiB);
  CHECK(s.device.cuda_context == 300 * MiB);
  CHECK(s.device.cublas_workspace == 8519680);  // still the A100's
  // A GQA preset keeps its KV heads when only heads change.
  CHECK(load("model: {preset: llama3-8b, heads: 16}\n").model.kv_heads == 8);
}

TEST_CASE("a model without a preset needs its shape", "[scenario]") {
  const Scenario s = load(
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n"
      "  d_ff: 128\n  vocab: 100\n  attention: mem-efficient\n  dropout: 0.1\n"
      "batch:\n  seq_len: 16\n");
  CHECK(s.model.family == ModelFamily::hf_llama);
  CHECK(s.model.kv_heads == 2);
  CHECK(s.model.context_length == 16);
  CHECK(s.model.attention == AttentionImpl::mem_efficient);
  CHECK(s.model.dropout == Approx(0.1));
  CHECK(error_of("model:\n  layers: 2\n") ==
        "t.yaml:1: model.d_model: required when no model.preset or model.hf_config is given");
  CHECK(error_of("") == "t.yaml:1: model.layers: required when no model.preset or model.hf_config is given");
  CHECK(error_of("model:\n  preset: cs336-small\n") ==
        "t.yaml:1: batch.seq_len: required (the model has no context length to default to)");
}

TEST_CASE("every section's keys and enum spellings are read", "[scenario]") {
  const Scenario s = load(std::string(kXl) +
                          "precision:\n  params: bf16\n  autocast: fp16\n  master_weights: true\n"
                          "optimizer:\n  type: sgd\n  impl: for-loop\n  momentum: 0.9\n"
                          "step:\n  kind: forward-no-grad\n  warmup_steps: 0\n  zero_grad: zeros\n"
                          "checkpoint:\n  policy: custom\n  layers_per_segment: 2\n  custom: [0, 5, attn]\n"
                          "parallel:\n  data: 2\n  tensor: 4\n  pipeline: 8\n  zero: 1\n"
                          "device:\n  cublas_workspace: 0\n");
  CHECK(s.precision.params == DType::bf16);
  CHECK(s.precision.autocast == DType::fp16);
  CHECK(s.precision.master_weights);
  CHECK(s.optimizer.type == OptimizerType::sgd);
  CHECK(s.optimizer.impl == OptimizerImpl::for_loop);
  CHECK(s.optimizer.momentum == Approx(0.9));
  CHECK(s.step.kind == StepKind::forward_no_grad);
  CHECK(s.step.warmup_steps == 0);
  CHECK_FALSE(s.step.zero_grad_set_to_none);
  CHECK(s.checkpoint.policy == CheckpointPolicy::custom);
  CHECK(s.checkpoint.layers_per_segment == 2);
  CHECK(s.checkpoint.custom == std::vector<std::string>{"0", "5", "attn"});
  CHECK(s.parallel.data == 2);
  CHECK(s.parallel.tensor == 4);
  CHECK(s.parallel.pipeline == 8);
  CHECK(s.parallel.zero == 1);
  CHECK(s.device.cublas_workspace == 0);
  CHECK(std::string(to_string(s.step.kind)) == "forward-no-grad");
  CHECK(std::string(to_string(ModelFamily::hf_gpt2)) == "hf-gpt2");
  CHECK(std::string(to_string(OptimizerImpl::for_loop)) == "for-loop");
  CHECK(std::string(to_string(AttentionImpl::mem_efficient)) == "mem-efficient");
  CHECK(dtype_bytes(DType::bf16) == 2);
  // Defaults: no autocast, torch foreach AdamW, train.
  const Scenario d = load(kXl);
  CHECK_FALSE(d.precision.autocast.has_value());
  CHECK(d.optimizer.impl == OptimizerImpl::foreach);
  CHECK(d.step.kind == StepKind::train);
  CHECK_FALSE(load(std::string(kXl) + "precision:\n  autocast: null\n").precision.autocast.has_value());
}

TEST_CASE("sizes accept binary and decimal units and plain bytes", "[scenario]") {
  auto capacity = [](const std::string& v) {
    // cuda_context 0: 500MiB and 4096 B are below the default context of a device without
    // a preset (scenario/device_defaults.h).
    return load(std::string(kXl) + "device:\n  capacity: " + v + "\n  cuda_context: 0\n").device.capacity;
  };
  CHECK(capacity("80GiB") == 80 * GiB);
  CHECK(capacity("500MiB") == 500 * MiB);
  CHECK(capacity("80GB") == 80'000'000'000ull);
  CHECK(capacity("4096") == 4096u);
  CHECK(error_of(std::string(kXl) + "device:\n  capacity: 80 parsecs\n") ==
        "t.yaml:6: device.capacity: expected a size such as 80GiB, 500MiB, 80GB or a byte "
        "count, got '80 parsecs': unknown unit 'parsecs' (B, KiB, MiB, GiB, TiB, PiB, EiB, KB, "
        "MB, GB, TB, PB, EB)");
  CHECK(error_of(std::string(kXl) + "device:\n  capacity: -1GiB\n").rfind("t.yaml:6: device.capacity: expected a size", 0) == 0);
  CHECK(error_of(std::string(kXl) + "device:\n  capacity: 0\n") ==
        "t.yaml:6: device.capacity: must be more than 0 bytes");
  CHECK(error_of(std::string(kXl) + "device:\n  capacity: 1GiB\n  cuda_context: 2GiB\n") ==
        "t.yaml:7: device.cuda_context: 2.00 GiB leaves nothing of the 1.00 GiB capacity");
}

TEST_CASE("shipped scenarios load", "[scenario]") {
  const std::filesystem::path dir = std::filesystem::path(MEMSIM_SOURCE_DIR) / "scenarios";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    INFO(entry.path().string());
    CHECK_NOTHROW(load_scenario(entry.path().string()));
    ++count;
  }
  CHECK(count >= 4);

  const Scenario xl = load_scenario((dir / "cs336-xl-train-ctx128.yaml").string());
  CHECK(xl.model.preset == "cs336-xl");
  CHECK(xl.batch.micro_batch == 4);
  CHECK(xl.batch.seq_len == 128);
  CHECK(xl.model.context_length == 128);
  CHECK(xl.precision.params == DType::fp32);
  CHECK(xl.optimizer.impl == OptimizerImpl::cs336);
  CHECK(xl.step.warmup_steps == 5);
  CHECK(xl.device.preset == "h100-80gb");

  const Scenario medium = load_scenario((dir / "cs336-medium-train-ctx512.yaml").string());
  CHECK(medium.model.layers == 24);
  CHECK(medium.batch.seq_len == 512);

  const Scenario gpt3 = load_scenario((dir / "gpt3-175b.yaml").string());
  CHECK(gpt3.model.family == ModelFamily::megatron);
  CHECK(gpt3.batch.seq_len == 2048);
  CHECK(gpt3.precision.params == DType::bf16);

  const Scenario llama = load_scenario((dir / "llama2-7b-finetune-a100.yaml").string());
  CHECK(llama.model.family == ModelFamily::hf_llama);
  CHECK(llama.device.preset == "a100-80gb");
  CHECK(llama.precision.params == DType::bf16);
}

TEST_CASE("unknown keys, sections and presets get a located did-you-mean", "[scenario]") {
  CHECK(error_of("model:\n  preset: cs336-xl\nbatch:\n  micro_btach: 4\n") ==
        "t.yaml:4: batch.micro_btach: unknown key; did you mean 'micro_batch'?");
  CHECK(error_of("modle:\n  preset: cs336-xl\n") ==
        "t.yaml:1: modle: unknown section; did you mean 'model'?");
  CHECK(error_of("model:\n  preset: cs336-xl\n  seq_len: 128\n") ==
        "t.yaml:3: model.seq_len: unknown key; did you mean 'batch.seq_len'?");
  CHECK(error_of("model:\n  preset: cs336-xl\n  colour: blue\n") ==
        "t.yaml:3: model.colour: unknown key");
  CHECK(error_of("model:\n  preset: cs336-xxl\n") ==
        "t.yaml:2: model.preset: unknown model preset 'cs336-xxl'; did you mean 'cs336-xl'? "
        "(`memsim presets` lists them)");
  CHECK(error_of(std::string(kXl) + "device:\n  preset: h100\n") ==
        "t.yaml:6: device.preset: unknown device preset 'h100'; did you mean 'h100-80gb'? "
        "(`memsim presets` lists them)");
  CHECK(error_of("model:\n  preset: cs336-xl\n  attention: flsh\n") ==
        "t.yaml:3: model.attention: expected one of eager, flash, mem-efficient, cudnn, got 'flsh'; "
        "did you mean 'flash'?");
  CHECK(error_of(std::string(kXl) + "step:\n  kind: forward_no_grad\n") ==
        "t.yaml:6: step.kind: expected one of train, forward, forward-no-grad, forward-backward, generate, "
        "got 'forward_no_grad'; did you mean 'forward-no-grad'?");
}

TEST_CASE("wrong types are located errors", "[scenario]") {
  CHECK(error_of("model:\n  preset: cs336-xl\nbatch:\n  micro_batch: four\n") ==
        "t.yaml:4: batch.micro_batch: expected a positive integer, got 'four'");
  CHECK(error_of("model:\n  preset: cs336-xl\nbatch:\n  micro_batch: 2.5\n") ==
        "t.yaml:4: batch.micro_batch: expected a positive integer, got '2.5'");
  CHECK(error_of("model:\n  preset: cs336-xl\n  tied_embeddings: maybe\n") ==
        "t.yaml:3: model.tied_embeddings: expected true or false, got 'maybe'");
  CHECK(error_of("model:\n  preset: [cs336-xl]\n") ==
        "t.yaml:2: model.preset: expected a string, got a list");
  CHECK(error_of("model: cs336-xl\n") == "t.yaml:1: model: expected a mapping of keys, got 'cs336-xl'");
  CHECK(error_of("- model\n- batch\n") ==
        "t.yaml:1: (document): expected a mapping of sections (name, model, batch, ...), got a list");
  CHECK(error_of("model:\n  preset: cs336-xl\n  dropout: lots\n") ==
        "t.yaml:3: model.dropout: expected a number, got 'lots'");
  CHECK(error_of("model:\n  preset: cs336-xl\n  preset: cs336-small\n") ==
        "t.yaml:3: model.preset: duplicate key (first given at t.yaml:2)");
}

TEST_CASE("impossible values are located errors", "[scenario]") {
  CHECK(error_of("model:\n  preset: cs336-small\n  heads: 7\nbatch:\n  seq_len: 8\n") ==
        "t.yaml:3: model.heads: 7 heads do not divide d_model 768");
  CHECK(error_of("model:\n  preset: llama2-7b\n  kv_heads: 5\n") ==
        "t.yaml:3: model.kv_heads: 5 KV heads do not divide 32 heads");
  CHECK(error_of("model:\n  preset: cs336-small\n  layers: 0\n") ==
        "t.yaml:3: model.layers: expected a positive integer, got '0'");
  CHECK(error_of("model:\n  preset: cs336-small\n  d_model: -768\n") ==
        "t.yaml:3: model.d_model: expected a positive integer, got '-768'");
  CHECK(error_of(std::string(kXl) + "step:\n  warmup_steps: -1\n") ==
        "t.yaml:6: step.warmup_steps: expected a non-negative integer, got '-1'");
  CHECK(error_of("model:\n  preset: cs336-xl\n  dropout: 1.0\n") ==
        "t.yaml:3: model.dropout: expected a probability in [0, 1), got '1.0'");
  CHECK(error_of(std::string(kXl) + "parallel:\n  tensor: 3\n") ==
        "t.yaml:6: parallel.tensor: 3 ranks do not divide 32 heads / 32 KV heads");
  CHECK(error_of(std::string(kXl) + "parallel:\n  pipeline: 5\n") ==
        "t.yaml:6: parallel.pipeline: 5 stages do not divide 32 layers");
  CHECK(error_of(std::string(kXl) + "precision:\n  master_weights: true\n") ==
        "t.yaml:6: precision.master_weights: an fp32 master copy needs bf16 or fp16 params, but "
        "precision.params is fp32");
  CHECK(error_of(std::string(kXl) + "optimizer:\n  type: sgd\n  impl: cs336\n") ==
        "t.yaml:7: optimizer.impl: cs336 is the CS336 staff AdamW, but optimizer.type is sgd");
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: custom\n") ==
        "t.yaml:6: checkpoint.policy: policy custom needs checkpoint.custom (layer indices or module names)");
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: full\n  custom: [attn]\n") ==
        "t.yaml:7: checkpoint.custom: only used with checkpoint.policy custom or modules, but the policy is full");
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: custom\n  custom: [32]\n") ==
        "t.yaml:7: checkpoint.custom: layer 32 does not exist (the model has 32 layers, 0-based)");
}

TEST_CASE("products that overflow 64 bits are errors", "[scenario]") {
  CHECK(error_of("model:\n  preset: cs336-xl\nbatch:\n  seq_len: 128\n  micro_batch: 100000000000000\n") ==
        "t.yaml:5: batch.micro_batch: micro_batch*seq_len*d_model*4 bytes overflows 64 bits");
  CHECK(error_of("model:\n  preset: cs336-xl\n  d_model: 4000000000000000\nbatch:\n  seq_len: 128\n") ==
        "t.yaml:3: model.d_model: vocab*d_model*16 bytes (embedding with grads and Adam state) "
        "overflows 64 bits");
  CHECK(error_of("model:\n  preset: cs336-xl\nbatch:\n  seq_len: 3000000000\n") ==
        "t.yaml:4: batch.seq_len: micro_batch*heads*seq_len^2*4 bytes (attention scores) overflows 64 bits");
  CHECK(error_of("model:\n  preset: cs336-xl\n  vocab: 99999999999999999999\n").rfind(
            "t.yaml:3: model.vocab: expected a positive integer, got '99999999999999999999' (does not fit in 64 bits)", 0) == 0);
}

TEST_CASE("YAML syntax errors and missing files are located", "[scenario]") {
  CHECK(error_of("model: [1, 2\nbatch: 3\n") == "t.yaml:2: (yaml): end of sequence flow not found");
  CHECK(error_of("model:\n  preset: cs336-xl\n bad indent: 1\n").rfind("t.yaml:3: (yaml): ", 0) == 0);
  CHECK(error_of("a: 1\n---\nb: 2\n") == "t.yaml:1: (yaml): expected one YAML document, found more");
  // The second document is looked for only where a line starts with "---", "..." or "%"
  // (scenario.cpp, may_have_second_document): each spelling of the separator still counts.
  CHECK(error_of("a: 1\n...\nb: 2\n") == "t.yaml:1: (yaml): expected one YAML document, found more");
  CHECK(error_of("a: 1\r\n---\r\nb: 2\r\n") == "t.yaml:1: (yaml): expected one YAML document, found more");
  CHECK(error_of("---\na: 1\n") == "t.yaml:2: a: unknown section");
  CHECK(error_of("a: 1 # --- not a marker\n") == "t.yaml:1: a: unknown section");
  // yaml-cpp 0.7 would loop forever on these (jbeder/yaml-cpp#1040).
  CHECK(error_of(",\n") == "t.yaml:1: (yaml): unexpected ','");
  CHECK(error_of("# c\n%YAML 1.2\n---\n  , a: 1\n") == "t.yaml:4: (yaml): unexpected ','");
  CHECK(error_of("model: {preset: cs336-xl}\n---\n,\n") == "t.yaml:3: (yaml): unexpected ','");
  try {
    load_scenario("/nonexistent/dir/x.yaml");
    FAIL("loaded a missing file");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()) ==
          "/nonexistent/dir/x.yaml:1: (file): cannot open the scenario file: No such file or directory");
  }
  try {
    load_scenario(MEMSIM_SOURCE_DIR + "/scenarios");
    FAIL("loaded a directory");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()) ==
          MEMSIM_SOURCE_DIR + "/scenarios:1: (file): is a directory, not a scenario file");
  }
}

TEST_CASE("allocator settings", "[scenario]") {
  const Scenario d = load(kXl);
  CHECK(d.allocator.max_split_size == AllocatorConfig::kUnlimited);
  CHECK_FALSE(d.allocator.expandable_segments);

  const Scenario s = load(std::string(kXl) +
                          "allocator:\n  expandable_segments: true\n  max_split_size_mb: 128\n"
                          "  garbage_collection_threshold: 0.6\n  roundup_power2_divisions: 4\n"
                          "  memory_fraction: 0.5\n  max_non_split_rounding_mb: 64\n");
  CHECK(s.allocator.expandable_segments);
  CHECK(s.allocator.max_split_size == 128 * MiB);
  CHECK(s.allocator.garbage_collection_threshold == Approx(0.6));
  CHECK(s.allocator.roundup_power2_divisions[0] == 4);
  CHECK(s.allocator.roundup_power2_divisions[15] == 4);
  CHECK(s.allocator.memory_fraction == Approx(0.5));
  CHECK(s.allocator.max_non_split_rounding == 64 * MiB);

  CHECK(error_of(std::string(kXl) + "allocator:\n  max_split_size_mb: 20\n") ==
        "t.yaml:6: allocator.max_split_size_mb: must be more than 20 (PyTorch's minimum), got '20'");
  CHECK(error_of(std::string(kXl) + "allocator:\n  garbage_collection_threshold: 1.0\n") ==
        "t.yaml:6: allocator.garbage_collection_threshold: expected a number in (0, 1), got '1.0'");
  CHECK(error_of(std::string(kXl) + "allocator:\n  roundup_power2_divisions: 3\n") ==
        "t.yaml:6: allocator.roundup_power2_divisions: expected a power of 2, a {MiB: divisions} "
        "mapping or PyTorch's \"[256:1,>:8]\", got '3'");
  CHECK(error_of(std::string(kXl) + "allocator:\n  roundup_power2_divisions: {3: 1}\n") ==
        "t.yaml:6: allocator.roundup_power2_divisions: interval 3 MiB is not a power of 2");
}

TEST_CASE("roundup_power2_divisions lists follow PyTorch's parser", "[scenario][allocator]") {
  // pytorch-allocator.md §3.2: [256:1,512:2,1024:4,>:8] gives entries 0-8 = 1, 9 = 2,
  // 10-15 = 8 (">" overwrites the last K's own entry).
  const std::array<uint32_t, 16> expected = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8};
  const Scenario map = load(std::string(kXl) +
                            "allocator:\n  roundup_power2_divisions: {256: 1, 512: 2, 1024: 4, \">\": 8}\n");
  CHECK(map.allocator.roundup_power2_divisions == expected);
  const Scenario text = load(std::string(kXl) +
                             "allocator:\n  roundup_power2_divisions: \"[256:1,512:2,1024:4,>:8]\"\n");
  CHECK(text.allocator.roundup_power2_divisions == expected);
  const Scenario set = load(kXl, {{"allocator.roundup_power2_divisions", "[256:1,512:2,1024:4,>:8]"}});
  CHECK(set.allocator.roundup_power2_divisions == expected);
  const Scenario set_map = load(kXl, {{"allocator.roundup_power2_divisions", "{256: 1, 512: 2, 1024: 4, '>': 8}"}});
  CHECK(set_map.allocator.roundup_power2_divisions == expected);
}

TEST_CASE("Overrides (--set) are applied after loading, with the same checks", "[scenario]") {
  const Scenario s = load(kXl, {{"batch.micro_batch", "8"},
                                {"model.preset", "cs336-large"},
                                {"device.capacity", "40GiB"},
                                {"checkpoint.policy", "custom"},
                                {"checkpoint.custom", "[0,2]"},
                                {"allocator.max_split_size_mb", "null"},
                                {"name", "swept"}});
  CHECK(s.batch.micro_batch == 8);
  CHECK(s.model.layers == 36);
  CHECK(s.device.capacity == 40 * GiB);
  CHECK(s.checkpoint.custom == std::vector<std::string>{"0", "2"});
  CHECK(s.allocator.max_split_size == AllocatorConfig::kUnlimited);
  CHECK(s.name == "swept");
  // Later overrides win over earlier ones; explicit file fields still beat a --set preset.
  CHECK(load(kXl, {{"batch.micro_batch", "2"}, {"batch.micro_batch", "3"}}).batch.micro_batch == 3);
  CHECK(load("model: {preset: cs336-xl, layers: 2}\nbatch: {seq_len: 8}\n", {{"model.preset", "cs336-small"}})
            .model.layers == 2);

  CHECK(error_of(kXl, {{"batch.micro_batch", "x"}}) ==
        "--set batch.micro_batch: expected a positive integer, got 'x'");
  CHECK(error_of(kXl, {{"batch.micro_btach", "8"}}) ==
        "--set batch.micro_btach: unknown key; did you mean 'batch.micro_batch'?");
  CHECK(error_of(kXl, {{"micro_batch", "8"}}) ==
        "--set micro_batch: unknown key; did you mean 'batch.micro_batch'?");
  CHECK(error_of(kXl, {{"model.heads", "7"}}) ==
        "--set model.heads: 7 heads do not divide d_model 2560");
  CHECK(error_of(kXl, {{"model.preset", "gpt5"}}).rfind("--set model.preset: unknown model preset 'gpt5'", 0) == 0);
}

TEST_CASE("allocator overrides without a scenario (replay)", "[scenario]") {
  const AllocatorConfig c = apply_allocator_overrides(
      AllocatorConfig{}, {{"allocator.expandable_segments", "True"}, {"allocator.max_split_size_mb", "256"}});
  CHECK(c.expandable_segments);
  CHECK(c.max_split_size == 256 * MiB);
  try {
    apply_allocator_overrides(AllocatorConfig{}, {{"batch.micro_batch", "2"}});
    FAIL("accepted a non-allocator key");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).rfind("--set batch.micro_batch: only allocator.* settings apply here", 0) == 0);
  }
}

TEST_CASE("did-you-mean uses a case-insensitive edit distance with swaps", "[scenario]") {
  using scenario_detail::did_you_mean;
  using scenario_detail::edit_distance;
  CHECK(edit_distance("micro_btach", "micro_batch") == 1);  // one adjacent swap
  CHECK(edit_distance("FP32", "fp32") == 0);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(did_you_mean("cs336-xxl", {"cs336-xl", "cs336-small"}) == "; did you mean 'cs336-xl'?");
  CHECK(did_you_mean("banana", {"cs336-xl", "gpt2-small"}).empty());
}

TEST_CASE("checkpoint.policy takes the short form that compare --policies takes",
          "[scenario]") {
  const Scenario u = load(kXl, {{"checkpoint.policy", "uniform:2"}});
  CHECK(u.checkpoint.policy == CheckpointPolicy::uniform);
  CHECK(u.checkpoint.layers_per_segment == 2);
  const Scenario c = load(std::string(kXl) + "checkpoint:\n  policy: custom:0,3.mlp\n");
  CHECK(c.checkpoint.policy == CheckpointPolicy::custom);
  CHECK(c.checkpoint.custom == std::vector<std::string>{"0", "3.mlp"});
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: uniform:x\n") ==
        "t.yaml:6: checkpoint.policy: policy 'uniform:x': expected uniform:N with N >= 1");
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: block:40\n") ==
        "t.yaml:6: checkpoint.policy: 40 is more than the model's 32 layers");
  CHECK(error_of(std::string(kXl) + "checkpoint:\n  policy: custom:32\n") ==
        "t.yaml:6: checkpoint.policy: layer 32 does not exist (the model has 32 layers, 0-based)");
  CHECK(error_of(std::string(kXl) +
                 "checkpoint:\n  policy: uniform:2\n  layers_per_segment: 4\n") ==
        "t.yaml:6: checkpoint.policy: 'uniform:2' already gives its argument; leave "
        "checkpoint.layers_per_segment out");
}
