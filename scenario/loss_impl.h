// loss.impl: its spellings and which model families take which value (issue #16 item 6;
// the model of each loss is docs/losses.md; the Program side is sim/step/script_loss.h).
//
//   torch        F.cross_entropy(logits.view(-1, V), labels.view(-1))
//   torch-float  the same on logits.float() (a copy unless the logits are fp32)
//   cs336        cs336_basics' cross_entropy (cs336 only)
//   one-hot      a hand-written one-hot cross entropy (cs336 only)
//   chunked:N    torchtune's chunked output + CEWithChunkedOutputLoss with N chunks
//                (num_output_chunks; torchtune's recipes use 8): the head runs per chunk of
//                the hidden state, each chunk upcast and cross-entropied alone (hf-*)
//   liger        Liger-Kernel's fused linear cross entropy (apply_liger_kernel_to_*'s
//                patched ForCausalLM.forward): no logits (hf-*)
// Absent (automatic): the family's own loss: cs336's loop default, the hf-* model's HF loss
// (labels passed to the model), Megatron's vocab-parallel cross entropy.
//
// On hf-* torch, torch-float and chunked:N describe a script that computes its loss outside
// the model (the model gets no labels: no HF shift, padded labels or in-model upcast; the
// labels are already shifted by the data pipeline, as torchtune's and LitGPT's are).
//
// Contract: parse_loss_impl accepts exactly the spellings above (N a positive integer);
// loss_impl_refusal says why a family does not take a value ("" when it does).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "scenario/scenario.h"

namespace memsim {

// The LossConfig `text` names (positions left at all), or nullopt.
std::optional<LossConfig> parse_loss_impl(std::string_view text);
// The spelling of l.impl ("chunked:8", "liger", ...; "automatic" when absent).
std::string loss_impl_label(const LossConfig& l);
// The spellings, for error messages ("torch, torch-float, cs336, one-hot, chunked:N, liger").
const char* loss_impl_spellings();
// Why `family` does not take `impl` ("" when it does).
std::string loss_impl_refusal(ModelFamily family, LossFunction impl);

// The losses an implementation row (model.implementation) names as its default, for the
// lead to wire: torchtune's recipes build CEWithChunkedOutputLoss() (num_output_chunks 8).
LossConfig torchtune_default_loss();

}  // namespace memsim
