// torchtune's recipe features (issue #16 item 7; docs/implementations.md "torchtune
// LoRA, optimizer in backward, activation offloading"), read and checked once the whole
// scenario is read:
//  - optimizer.in_backward (bool, default false): torchtune's optimizer_in_bwd
//    (sim/optim/optimizer_in_backward.h). Any single-GPU training step with a torch.optim
//    Adam, AdamW or SGD (torchtune's full_finetune_single_device; the hf rows as a hand-
//    written loop); refused with batch.grad_accum > 1 (the recipe raises), with data
//    parallelism or sharding, master weights, torch.compile, other optimizers, and with
//    torchtune's LoRA (lora_finetune_single_device has no optimizer_in_bwd).
//  - checkpoint.offload_activations (torchtune's OffloadActivations):
//    scenario/offload_activations_key.h, graph/offload_streams.h.
//  - lora.* with model.implementation torchtune: lora_llama3's LoRALinear
//    (graph/models/lora_tune.cpp). Errors name the key and FILE:LINE (exit 1).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// Reads optimizer.in_backward into s.recipe, then refuses the combinations it is not
// modelled in.
void read_recipe_features(const Doc& d, Scenario& s);

// parallel.custom_sharded_layers (a list of tok_embeddings / output, or none; default
// both, the llama3 full configs' value, and none with lora.*, the LoRA configs' value) and
// what torchtune's full_finetune_distributed and lora_finetune_distributed (lora.rank > 0)
// can express with parallel.sharding fsdp2 (sim/parallel/fsdp2_layout.h): refuses by key
// what their shard_model does not do (MixedPrecisionPolicy, HSDP, an integer
// reshard_after_forward, a GPU build) and what is not modelled with it yet (context
// parallelism, uneven shards); parallel.cpu_offload is fsdp_cpu_offload (CPUOffloadPolicy),
// checkpoint.offload_activations enable_activation_offloading (both recipes).
// Sets parallel.fsdp_init to the meta-device build. After read_recipe_features.
void read_torchtune_sharding(const Doc& d, Scenario& s);

// lora.* on the torchtune row: what lora_llama3 and the LoRA recipe can express
// (called by check_implementation for model.implementation torchtune).
void check_torchtune_lora(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
