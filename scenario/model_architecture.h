// The architecture rows: transformers' model_types that memsim describes with a
// graph::DecoderArch (graph/models/decoder_spec.h), one row each, as data.
//
// A row gives what `model.architecture: NAME` sets (the family and every knob's default)
// and what the config.json reader (scenario/hf_config.h) needs to know about that model_type
// beyond the keys every config shares: which key names the activation, whether
// attention_bias / mlp_bias are read, how the sliding-window layers are chosen, and the
// config class's defaults for keys a config.json may leave out.
//
// Contract: rows are static; DecoderArch::architecture points at the row's name, so it
// stays valid for the program's lifetime. Knob keys given in a scenario override a row.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/models/decoder_spec.h"
#include "scenario/scenario.h"

namespace memsim {

// Which layers slide when a sliding window is set (model.sliding_layers, or a row's or a
// config's default). Resolved to DecoderArch::sliding_layers once the layer count is known.
struct SlidingRule {
  enum class Kind : uint8_t {
    all,          // every layer (Mistral, Phi-3): sliding_layers stays empty
    every_other,  // layers 0, 2, 4, ... slide (Gemma-2)
    pattern,      // `n` sliding layers, then `m` full ones, repeated (Gemma-3: 5:1)
    from_layer,   // layers >= n slide (Qwen2/Qwen3: max_window_layers)
    list,         // `layers`, one 0/1 per layer (model.sliding_layers, config layer_types)
  };
  Kind kind = Kind::all;
  int64_t n = 0, m = 0;
  std::vector<uint8_t> layers;
};
// One 0/1 per layer; empty for Kind::all.
std::vector<uint8_t> resolve_sliding(const SlidingRule& rule, int64_t layers);
// "every-other", "5:1", "from 28", "[1,0,...]" (for messages and summaries).
std::string describe_sliding(const SlidingRule& rule);

// How a model_type's config chooses its sliding layers (scenario/hf_config.cpp).
enum class SlidingSource : uint8_t {
  none,         // no sliding window (the config's sliding_window, if any, is not read)
  every_layer,  // sliding_window (null = none) on every layer (Mistral, Phi-3)
  qwen,         // use_sliding_window + sliding_window + max_window_layers, or layer_types
  alternate,    // sliding_window, layer_types or every other layer (Gemma-2)
  pattern,      // sliding_window, layer_types or sliding_window_pattern (Gemma-3)
};

struct ArchitectureRow {
  const char* name;               // transformers' model_type, the model.architecture spelling
  ModelFamily family;             // hf-gpt2 for gpt2, hf-llama for the others
  graph::DecoderArch arch;        // the knobs' defaults (head_dim 0 = d_model / heads)
  SlidingRule sliding;            // which layers slide when a window is set
  bool tied;                      // the config class's tie_word_embeddings default
  // config.json only: head_dim when the key is absent (0 = hidden_size / heads), the key
  // that names the activation, and which optional keys the model_type reads.
  int64_t config_head_dim;
  int64_t config_sliding_window;  // sliding_window when the key is absent (0 = None)
  const char* activation_key;     // hidden_act, hidden_activation or activation_function
  bool reads_attention_bias;      // attention_bias -> q/k/v/o biases
  bool reads_mlp_bias;            // mlp_bias -> gate/up/down biases
  bool reads_softcap;             // attn_logit_softcapping / final_logit_softcapping
  bool reads_partial_rotary;      // partial_rotary_factor
  SlidingSource sliding_source;
  const char* transformers;       // the transformers classes the row stands for
};

const std::vector<ArchitectureRow>& architecture_rows();
const ArchitectureRow* find_architecture(std::string_view name);
// The row a family stands for when no architecture is named: gpt2 for hf-gpt2, llama
// otherwise (cs336 and megatron ignore the knobs; their parameter counts use these rows).
const ArchitectureRow& default_architecture(ModelFamily family);
// "llama, mistral, ..." (for messages).
std::string architecture_list();

// The knobs' scenario spellings (model.qk_norm none|head|full, ...).
const std::vector<std::pair<std::string, graph::QkNorm>>& qk_norm_names();
const std::vector<std::pair<std::string, graph::NormKind>>& norm_names();
const std::vector<std::pair<std::string, graph::NormPlacement>>& norm_placement_names();
const std::vector<std::pair<std::string, graph::MlpKind>>& mlp_names();
const std::vector<std::pair<std::string, graph::Activation>>& activation_names();
template <typename E>
const char* spelling(const std::vector<std::pair<std::string, E>>& names, E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name.c_str();
  return "?";
}

// The attention head size: model.head_dim, else d_model / heads.
int64_t head_dim(const ModelConfig& m);

}  // namespace memsim
