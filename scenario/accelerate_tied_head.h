// Accelerate >= 1.14's FSDP2 grouping of a model whose lm_head shares the input embedding's
// weight (model.tied_embeddings with parallel.accelerate_version >= 1.14; docs/fsdp2.md
// "Tied embeddings under 1.14"). huggingface/accelerate v1.14.0 (beb0672a)
// src/accelerate/utils/fsdp_utils.py lines 753-774: with tied weights the embedding is not
// sharded alone; fully_shard([model.norm, model.embed_tokens], reshard_after_forward=False)
// replaces embed_tokens.weight by the group's sharded parameter but leaves lm_head.weight the
// original one (torch 2.11 _fsdp_param_group.py _get_param_module_infos only looks inside the
// modules of that call), so fully_shard(model) makes lm_head.weight the root's parameter. From
// then on the embedding and the LM head compute with two different unsharded tensors (the
// group's and the root's), each a leaf with its own AccumulateGrad: the graph is built untied
// (scenario/hf_family.cpp), and sim/parallel/fsdp2.cpp makes the root's lm_head shard the
// embedding's (Accelerate re-ties after loading the state dict; FSDPParam.reset_sharded_param
// at lazy_init) and its reduce-scattered gradient the embedding shard's .grad.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

inline bool accelerate_fsdp2_tied_head(const Scenario& s) {
  return s.parallel.sharding == Sharding::fsdp2 && s.parallel.accelerate_version >= 114 &&
         s.model.tied_embeddings;
}

}  // namespace memsim
