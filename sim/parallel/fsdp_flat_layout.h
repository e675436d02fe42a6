// The layout of one FSDP1 FlatParameter: the order its original parameters are flattened
// in, the padding FSDP inserts, and which part of each parameter rank 0's shard holds.
//
// Modelled from pytorch/pytorch torch/distributed/fsdp/_flat_param.py as stored at commit
// 01caf79e047fd15e1f75ba3825f789130efa476a (torch 2.x):
//  - FlatParamHandle._init_flat_param_and_metadata walks module.named_modules() and each
//    module's own parameters: the flatten order is module order. For a PEFT LoRA Linear
//    (peft/tuners/lora/layer.py: base_layer registered before lora_A and lora_B) that is
//    base weight, base bias, lora_A, lora_B of one module, then the next module.
//  - use_orig_params=True (align_addresses): before each parameter, padding up to a
//    multiple of _get_aligned_numel = 16 bytes / element size (the forward/backward dtype:
//    MixedPrecision's param_dtype, else the parameters'), then the whole flat parameter is
//    padded to a multiple of the world size (padding tensors inside the FlatParameter).
//    use_orig_params=False: no alignment; shard() pads the last rank's chunk instead
//    (the padded total is the same multiple of the world size).
//  - shard(): rank r owns elements [r * S, (r + 1) * S), S = padded / world.
//    _use_sharded_views: a parameter's local part is its intersection with that range
//    (a 1-D view, size 0 when outside); _use_sharded_grad_views gives a .grad view only to
//    parameters that require grad and have a local part.
//
// Contract: flat_layout() takes the unit's parameters in flatten order (their element
// counts) and returns each parameter's offset, the padding segments in order (each
// alignment gap, then the world-size tail) and the padded total, a multiple of `world`.
// local_numel() is the number of a parameter's elements in rank `rank`'s shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim {

struct FlatSegment {
  uint64_t offset = 0;  // elements from the start of the flat parameter
  uint64_t numel = 0;
};

struct FlatLayout {
  std::vector<FlatSegment> params;   // one per input parameter, same order
  std::vector<FlatSegment> padding;  // alignment gaps, then the world-size padding
  uint64_t padded_numel = 0;         // a multiple of world
  uint64_t shard_numel(uint64_t world) const { return padded_numel / world; }
};

// aligned_numel 0: no alignment (use_orig_params=False).
FlatLayout flat_layout(const std::vector<uint64_t>& numel, uint64_t aligned_numel, uint64_t world);

uint64_t local_numel(const FlatSegment& param, uint64_t shard_numel, uint64_t rank);

// The flatten order of a unit's parameters under PEFT: `names[i]` is parameter i's name
// and `ids` its ids in registration order (memsim registers the adapters after every base
// parameter). Returns the ids reordered so that each "<module>.lora_A.default.weight" and
// "<module>.lora_B.default.weight" follows the last base parameter of "<module>."
// ("<module>.weight", "<module>.bias"), as named_modules() visits PEFT's LoRA Linear.
std::vector<int32_t> peft_flatten_order(const std::vector<int32_t>& ids,
                                        const std::vector<std::string>& names);

}  // namespace memsim
