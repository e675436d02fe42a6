// Which part of the model state one data-parallel rank owns under ZeRO-style sharding.
//
// Megatron-LM's distributed optimizer (megatron/core/optimizer/distrib_optimizer.py,
// `--use-distributed-optimizer`, parallel.zero 1 for the megatron family) keeps every
// parameter's 16-bit copy and the full grad buffer on every rank, and shards the fp32
// main parameters and Adam's state: the DDP grad buffer (parameters in REVERSE
// registration order, `for param in params[::-1]`) is padded to a multiple of the
// data-parallel size d and cut into d equal contiguous ranges; rank r's optimizer owns,
// for each parameter, the intersection of that parameter's buffer range with range r
// (`shard_main_param = shard_model_param.clone().float()`, Adam state per shard).
// This is Megatron's theoretical formula 6 + 12/d bytes per parameter for bf16
// (2 param + 4 fp32 main_grad + (4 main + 8 Adam)/d); the ZeRO paper's stage 1.
//
// Contract:
//  - padded_numel(n, d) is n rounded up to a multiple of d (d >= 1).
//  - megatron_shard_numel(numel, d, rank)[i] is the number of elements of parameter i
//    (registration order) owned by `rank`; the sum over ranks of each entry is numel[i]
//    and every rank's total is <= padded_numel(sum, d) / d.
//  - zero_stage_model_states(): the ZeRO paper's model-state accounting (Rajbhandari et
//    al. 2019, §5 / Fig. 1): stage 1 divides the optimizer state by d, stage 2 also the
//    gradients, stage 3 also the parameters. Given the unsharded per-rank bytes (stage 0,
//    e.g. measured from a simulated Program), returns one rank's bytes at `stage`.

#include <cstdint>
#include <vector>

namespace memsim {

uint64_t padded_numel(uint64_t numel, int64_t d);

std::vector<uint64_t> megatron_shard_numel(const std::vector<uint64_t>& numel, int64_t d,
                                           int64_t rank);

struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double total() const { return parameters + gradients + optimizer_state; }
};
ModelStateBytes zero_stage_model_states(const ModelStateBytes& unsharded, int stage, int64_t d);

}  // namespace memsim
