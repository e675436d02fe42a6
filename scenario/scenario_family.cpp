#include "scenario/scenario_family.h"

#include <iterator>
#include <stdexcept>

namespace memsim {
namespace {

// Every field is set in every row, so that a row reads as the whole truth about its family.
constexpr FamilyRow cs336_row() {
  FamilyRow r;
  r.family = ModelFamily::cs336;
  r.name = "cs336";
  r.hf = false;
  r.rope = true;
  r.staff_model = true;
  r.script_loss = true;
  r.autocast = true;
  r.autocast_tied_embeddings = true;
  r.dropout = false;  // the staff model has no dropout layers
  r.lora = false;
  r.adafactor = false;
  r.adam8bit = true;
  r.tensor_parallel = false;
  r.torch_data_parallel = true;
  r.whole_run_measure = true;
  r.reentrant_checkpoint_only = false;
  r.numeric_fused_attention = false;
  r.numeric_adafactor = false;
  r.numeric_adam8bit = true;
  r.numeric_no_decay_1d = false;
  return r;
}

constexpr FamilyRow hf_llama_row() {
  FamilyRow r;
  r.family = ModelFamily::hf_llama;
  r.name = "hf-llama";
  r.hf = true;
  r.rope = true;
  r.staff_model = false;
  r.script_loss = false;
  r.autocast = true;  // eager attention, no dropout (sim/step/modelled_features.cpp)
  r.autocast_tied_embeddings = false;
  r.dropout = true;
  r.lora = true;
  r.adafactor = true;
  r.adam8bit = true;
  r.tensor_parallel = false;
  r.torch_data_parallel = true;
  r.whole_run_measure = true;
  r.reentrant_checkpoint_only = false;
  r.numeric_fused_attention = true;
  r.numeric_adafactor = true;
  r.numeric_adam8bit = true;
  r.numeric_no_decay_1d = false;
  return r;
}

constexpr FamilyRow hf_gpt2_row() {
  FamilyRow r;
  r.family = ModelFamily::hf_gpt2;
  r.name = "hf-gpt2";
  r.hf = true;
  r.rope = false;  // learned positions
  r.staff_model = false;
  r.script_loss = false;
  r.autocast = true;  // eager attention, no dropout (sim/step/modelled_features.cpp)
  r.autocast_tied_embeddings = true;
  r.dropout = true;
  r.lora = true;
  r.adafactor = true;
  r.adam8bit = true;
  r.tensor_parallel = false;
  r.torch_data_parallel = true;
  r.whole_run_measure = true;
  r.reentrant_checkpoint_only = false;
  r.numeric_fused_attention = false;  // eager attention only
  r.numeric_adafactor = true;
  r.numeric_adam8bit = true;
  r.numeric_no_decay_1d = false;
  return r;
}

constexpr FamilyRow megatron_row() {
  FamilyRow r;
  r.family = ModelFamily::megatron;
  r.name = "megatron";
  r.hf = false;
  r.rope = false;  // learned positions (GPT-3)
  r.staff_model = false;
  r.script_loss = false;
  r.autocast = false;
  r.autocast_tied_embeddings = false;
  r.dropout = true;
  r.lora = false;
  r.adafactor = false;
  r.adam8bit = false;  // Megatron-LM's optimizer is a fused fp32 Adam
  r.tensor_parallel = true;
  r.torch_data_parallel = false;  // its grad buffer and distributed optimizer
  r.whole_run_measure = false;    // its step marks its own measured step
  r.reentrant_checkpoint_only = true;
  r.numeric_fused_attention = true;  // TE fused attention
  r.numeric_adafactor = false;
  r.numeric_adam8bit = false;
  r.numeric_no_decay_1d = true;
  return r;
}

// Indexed by ModelFamily.
constexpr FamilyRow kRows[] = {cs336_row(), hf_llama_row(), hf_gpt2_row(), megatron_row()};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kRows); ++i)
    if (static_cast<size_t>(kRows[i].family) != i) return false;
  return std::size(kRows) == static_cast<size_t>(ModelFamily::megatron) + 1;
}
static_assert(rows_in_enum_order(), "one row per ModelFamily, in enum order");

}  // namespace

const FamilyRow& family_row(ModelFamily family) {
  const auto i = static_cast<size_t>(family);
  if (i >= std::size(kRows)) throw std::logic_error("family_row: not a ModelFamily");
  return kRows[i];
}

const std::vector<std::pair<std::string, ModelFamily>>& family_spellings() {
  static const std::vector<std::pair<std::string, ModelFamily>> spellings = [] {
    std::vector<std::pair<std::string, ModelFamily>> v;
    for (const FamilyRow& r : kRows) v.emplace_back(r.name, r.family);
    return v;
  }();
  return spellings;
}

const char* to_string(ModelFamily family) {
  const auto i = static_cast<size_t>(family);
  return i < std::size(kRows) ? kRows[i].name : "?";
}

}  // namespace memsim
