#include "scenario/hf_family.h"

#include "scenario/accelerate_tied_head.h"
#include "scenario/fsdp_precision.h"
#include "scenario/lora_compute_dtype_key.h"
#include "scenario/scenario_lora.h"
#include "scenario/peft_input_grads_key.h"

namespace memsim {

graph::HfShape hf_shape(const Scenario& s) {
  graph::HfShape shape;
  shape.layers = s.model.layers;
  shape.d_model = s.model.d_model;
  shape.heads = s.model.heads;
  shape.kv_heads = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  shape.d_ff = s.model.d_ff;
  shape.vocab = s.model.vocab;
  shape.context_length = s.model.context_length > 0 ? s.model.context_length : s.batch.seq_len;
  shape.batch = s.batch.micro_batch;
  shape.seq = s.batch.seq_len;
  if (s.parallel.context > 1) {  // scenario/context_parallel_keys.h: rank 0's S/N tokens
    shape.cp = s.parallel.context;
    shape.seq = s.batch.seq_len / s.parallel.context;
    shape.cp_alltoall = s.parallel.context_rotate == ContextRotate::alltoall;
  }
  shape.elem = model_compute_elem(s);  // precision.params or FSDP MixedPrecision
  shape.dropout = s.model.dropout;
  // Accelerate >= 1.14's FSDP2 unties the uses of a tied weight (two unsharded leaves, two
  // AccumulateGrads: scenario/accelerate_tied_head.h); the shard stays one.
  shape.tied = s.model.tied_embeddings && !accelerate_fsdp2_tied_head(s);
  if (s.lora.rank > 0) {  // graph/models/lora.h
    shape.lora.rank = s.lora.rank;
    shape.lora.targets = lora_target_mask(s.lora, s.model.family);
    shape.lora.adapter_elem = static_cast<uint64_t>(dtype_bytes(s.lora.adapter_dtype));
    shape.lora.dropout = s.lora.dropout;
    shape.lora.nf4 = s.lora.base_nf4;
    if (s.lora.base_nf4) {  // bitsandbytes' dtypes (scenario/lora_compute_dtype_key.h)
      const auto load = static_cast<uint64_t>(dtype_bytes(s.precision.params));
      shape.lora.quant_elem = load;  // QuantState.dtype: the weights were loaded in it
      shape.lora.compute_elem = static_cast<uint64_t>(dtype_bytes(kbit_compute_dtype(s)));
      const auto model = static_cast<uint64_t>(dtype_bytes(kbit_model_dtype(s)));
      if (model != load) {  // prepare_model_for_kbit_training's fp32 upcast
        shape.elem = model;
        shape.lora.upcast_from_elem = load;
      }
    }
    shape.lora.input_require_grads = lora_input_require_grads(s);  // scenario/peft_input_grads_key.h
  }
  switch (s.precision.float8) {  // scenario/torchtitan_keys.h
    case Float8Recipe::none: shape.float8 = graph::Float8Kind::none; break;
    case Float8Recipe::tensorwise: shape.float8 = graph::Float8Kind::tensorwise; break;
    case Float8Recipe::rowwise: shape.float8 = graph::Float8Kind::rowwise; break;
    case Float8Recipe::rowwise_with_gw_hp:
      shape.float8 = graph::Float8Kind::rowwise_with_gw_hp;
      break;
  }
  shape.arch = s.model.arch;
  if (s.model.family == ModelFamily::hf_gpt2 && shape.arch.code != graph::ModelCode::gpt2)
    shape.arch = graph::gpt2_arch();
  switch (s.model.attention) {
    case AttentionImpl::eager: shape.attention = graph::HfAttention::eager; break;
    case AttentionImpl::flash: shape.attention = graph::HfAttention::flash; break;
    case AttentionImpl::mem_efficient: shape.attention = graph::HfAttention::mem_efficient; break;
    case AttentionImpl::cudnn: shape.attention = graph::HfAttention::cudnn; break;
  }
  return shape;
}

}  // namespace memsim
