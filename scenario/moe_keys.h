// model.moe (issue #15; docs/moe.md, docs/scenario-format.md): a mixture-of-experts model's
// experts, router and routing assumption, as graph::MoeSpec (graph/models/decoder_spec.h).
//
//   model.moe: { experts, top_k, shared_experts, expert_d_ff, first_dense_layers,
//                router: softmax|sigmoid, norm_topk, routing, experts_implementation,
//                capacity_factor (refused: Megatron-Core's; > 0 checked first) }
//   model.moe.routing: balanced | worst-case | skew:ALPHA | counts:[...]   (also as --set)
//
// Over a MoE config.json (mixtral, qwen2_moe, qwen3_moe, olmoe) the keys given replace the
// config's values. Contract: read_moe runs after the architecture is read (scenario_arch.h);
// check_moe once the batch and the other sections are known (the routing counts are
// per token); both throw ScenarioError "FILE:LINE: KEY: message".
#pragma once

#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_moe(const Doc& d, ModelConfig& m);
// model.moe's sub-keys ("experts", "top_k", ...), for did-you-mean and shell completion.
const std::vector<std::string>& moe_sub_keys();
// --set model.moe.SUB=V for a sub-key other than routing (which has its own dotted key):
// merged into model.moe's mapping (created when the file has none), the value blamed on
// "--set". Returns false, changing nothing, for any other key.
bool merge_moe_override(Doc& d, const std::string& key, const YAML::Node& value);
void check_moe(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
