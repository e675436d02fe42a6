// Megatron-Core MoE keys (issue #15, Megatron part; docs/moe-megatron.md,
// docs/scenario-format.md): what family megatron reads besides the shared model.moe keys
// (scenario/moe_keys.h), into Scenario::megatron_moe.
//
//   parallel.expert         EP   (--expert-model-parallel-size), default 1
//   parallel.expert_tensor  ETP  (--expert-tensor-parallel-size), default parallel.tensor
//                           (Megatron's); > 1 needs no linear biases and ETP | expert_d_ff
//   model.moe.dispatcher    allgather | alltoall (--moe-token-dispatcher-type)
//   model.moe.capacity_factor  > 0 (--moe-expert-capacity-factor; absent = dropless)
//   model.moe.pad_to_capacity  bool (--moe-pad-expert-input-to-capacity; needs a factor)
//   model.moe.grouped_gemm     bool (--moe-grouped-gemm: TEGroupedMLP, SwiGLU experts only)
//   model.moe.recompute        [moe, shared_experts, moe_act] (--recompute-modules; moe_act
//                              needs grouped_gemm, not with moe)
//   model.moe.aux_loss_coeff   >= 0 (--moe-aux-loss-coeff; > 0: the aux_loss load-balancing loss)
//   model.moe.z_loss_coeff     >= 0 (--moe-z-loss-coeff; given: the z-loss runs)
//
// Contract: check_megatron_moe runs from check_moe once the whole scenario is built; it
// fills nothing for other families but refuses these keys there, and throws ScenarioError
// "FILE:LINE: KEY: why" for bad values and for combinations Megatron-LM rejects or memsim
// does not model (each refusal says which). Scenario::megatron_moe is filled by it (it is
// const elsewhere): build_scenario calls read_megatron_moe first.
#pragma once

#include <string>

#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// model.moe sub-keys only family megatron reads (read_moe skips them).
bool is_megatron_moe_sub_key(const std::string& sub);
// Reads the keys above into s.megatron_moe (values only; check_megatron_moe checks).
void read_megatron_moe(const Doc& d, Scenario& s);
void check_megatron_moe(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
