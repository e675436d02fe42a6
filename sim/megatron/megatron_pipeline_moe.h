// Pipeline parallelism of a Megatron-Core MoE GPT (issue #15, Megatron part 3;
// docs/moe-megatron.md "Pipeline stages"): which of a stage's layers are MoE layers, and
// what of that a stage's Program depends on.
//
// Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
//  - megatron/core/transformer/transformer_layer.py get_transformer_layer_offset: with
//    parallel.pipeline p, v model chunks per rank (interleaved) and L layers split evenly,
//    chunk c (vp_stage) of pipeline rank k starts at global layer
//    c * (L / v) + k * (L / (p v)) = (c p + k) * L / (p v); with an uneven split
//    (parallel.pipeline_first_layers, ...) where scenario/pipeline_split.h says.
//  - megatron/core/models/gpt/gpt_layer_specs.py get_gpt_decoder_block_spec: the whole
//    model's moe_layer_pattern (moe_layer_freq; memsim's model.moe.first_dense_layers is the
//    list form [0] * k + [1] * (L - k)) is built over all L layers and sliced at
//    [offset, offset + num_layers_to_build): a chunk's layer is MoE when its GLOBAL index is.
//  - transformer_block.py build_layer: global_layer_number = local + offset (1-based), which
//    the per-layer routing counts follow (model.moe.routing counts are per MoE layer of the
//    whole model).
//
// Contract: megatron_chunk_layer_offset is the global index of the chunk's first layer;
// megatron_moe_stage_key_part lists, per chunk and local layer, 0 for a dense layer and a
// positive code for a MoE layer (1, or 1 + its global MoE index when the routing counts
// differ per MoE layer), so that two stages with equal codes build equal MoE layers. Empty
// without MoE.
#pragma once

#include <cstdint>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

int64_t megatron_chunk_layer_offset(const Scenario& s, int64_t stage, int64_t chunk);
std::vector<int32_t> megatron_moe_stage_key_part(const Scenario& s, int64_t stage);

}  // namespace memsim
