// Parameter counts in closed form from the architecture (scenario/model_architecture.h).
//
// parameter_count(m): every parameter of the model, as its model card counts them: token
// embedding; learned positions (GPT-2, Megatron); per layer q/k/v/o (heads x head_dim,
// kv_heads x head_dim; biases per qkv_bias / o_bias), the q/k norms (head: head_dim each;
// full: heads*head_dim and kv_heads*head_dim), the MLP (glu: gate, up, down; plain: fc,
// proj; biases per mlp_bias) and the layer's norms (2, or 4 for sandwich; LayerNorm has a
// bias); the final norm; an untied lm_head (no bias). Fused projections (Phi-3's
// qkv_proj / gate_up_proj, GPT-2's c_attn) hold the same numbers. cs336 counts as Llama
// (RMSNorm, SwiGLU, no biases), megatron as GPT-2 (LayerNorms, biases, learned positions;
// the vocabulary unpadded). context_length 0 (a preset built with seq_len) counts no
// learned positions.
//
// trainable_parameter_count(s): the parameters that get gradients and optimizer state:
// every parameter, or with lora: the adapters only, r x (in + out) per targeted linear
// per layer (graph/models/lora.h); a targeted name the architecture lacks (q_proj with Phi-3's
// fused qkv_proj, ...) gets none, as graph/models/decoder.cpp builds them; in a MoE layer
// gate/up/down_proj are its shared expert's (shared_d_ff wide) or absent, and
// lora.target_parameters adds r x E x (in + out) per MoE layer and targeted 3-D expert weight
// (moe_param_lora.h).
//
// parameter_count_per_rank(s, stage): what one GPU holds for the way the run shards it:
//  - parallel.sharding fsdp: its shard of every FSDP unit (one unit per layer, the root
//    holding the rest), each unit's flat parameter padded to a multiple of parallel.data
//    (sim/parallel/fsdp.h), whether the shards live on the GPU or, with cpu_offload, on the CPU;
//  - megatron: the tensor-parallel shard of pipeline stage `stage`'s layers (vocabulary
//    padded to a multiple of 128 x tensor; graph/models/megatron.h megatron_parameter_count);
//    with the interleaved schedule the rank's virtual_stages chunks; the stage's layers as
//    scenario/pipeline_split.h assigns them (uneven splits too, MoE by the global index);
//  - otherwise (one GPU, DDP, ZeRO-1) the whole model: every rank holds every parameter.
#pragma once

#include <cstdint>

#include "scenario/scenario.h"

namespace memsim {

int64_t parameter_count(const ModelConfig& m);
int64_t trainable_parameter_count(const Scenario& s);
int64_t parameter_count_per_rank(const Scenario& s, int pipeline_stage = 0);

// Parameters of one decoder layer, of the embeddings side (token embedding and learned
// positions) and of the head side (final norm and untied lm_head).
int64_t layer_parameter_count(const ModelConfig& m);  // layer 0's
// Layer `layer`'s: a mixture-of-experts layer (DecoderArch::moe) counts its router, its
// experts' 3-D weights and its shared expert instead of the dense MLP.
int64_t layer_parameter_count(const ModelConfig& m, int64_t layer);
int64_t embedding_parameter_count(const ModelConfig& m);
int64_t head_parameter_count(const ModelConfig& m);

}  // namespace memsim
