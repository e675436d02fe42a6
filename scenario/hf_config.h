// Hugging Face config.json -> the model section of a scenario (model.hf_config,
// `memsim run --model`, and the presets shipped as scenarios/models/*.json).
//
// Reads the keys transformers' config classes define for the dense decoders memsim
// describes (scenario/model_architecture.h: llama, mistral, qwen2, qwen3, gemma, gemma2,
// gemma3_text, phi3, olmo2, granite, gpt2), with each class's defaults for keys a file
// leaves out. Keys that only change numbers a kernel computes (rope_theta, rms_norm_eps,
// Granite's multipliers, token ids, rope_scaling's frequency factors) are ignored; a key
// whose effect on memory memsim does not model (quantization_config, experts,
// multi-head latent attention, an activation memsim has no op for, ...) is refused by name.
//
// Contract: parse_hf_config returns a ModelConfig that is complete for the architecture
// (family, shape, arch, tied, context_length, dropout) or throws ScenarioError
// "SOURCE:LINE: KEY: message" (the line where KEY is written; line 1 for a missing key;
// for invalid JSON the byte offset, line and column). The sliding-window layers are given
// as a rule (`sliding`), resolved once the scenario's layer count is final.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "scenario/model_architecture.h"
#include "scenario/scenario.h"

namespace memsim {

struct HfConfig {
  ModelConfig model;             // preset "", hf_config "" (the caller knows the path)
  SlidingRule sliding;           // which layers slide when model.arch.sliding_window > 0
  std::optional<DType> params;   // torch_dtype / dtype: precision.params' default
  std::string model_type;
  std::string name_or_path;      // "_name_or_path" when the file has it, else ""
};

HfConfig parse_hf_config(const std::string& text, const std::string& source);

// Reads the file at `path` (a directory: its config.json, and `path` is set to that file).
// False with `error` ("cannot open '...': No such file or directory") when it cannot.
bool read_config_file(std::string& path, std::string& text, std::string& error);


}  // namespace memsim
