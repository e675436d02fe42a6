#include "sim/megatron/megatron_moe_parallel.h"

#include "sim/parallel/zero_sharding.h"

namespace memsim {

graph::MegatronMoeShape megatron_moe_shape(const Scenario& s) {
  graph::MegatronMoeShape m;
  m.spec = s.model.arch.moe;
  if (m.spec.experts == 0) return m;
  const MegatronMoeConfig& c = s.megatron_moe;
  m.expert_parallel = c.expert;
  m.expert_tensor = c.expert_tensor;
  m.dispatcher = c.dispatcher == MoeDispatcher::alltoall ? graph::MegatronDispatcher::alltoall
                                                         : graph::MegatronDispatcher::allgather;
  m.capacity_factor = c.capacity_factor.value_or(0.0);
  m.pad_to_capacity = c.pad_to_capacity;
  m.recompute_moe = c.recompute_moe;
  m.recompute_shared = c.recompute_shared_experts;
  m.recompute_moe_act = c.recompute_moe_act;
  m.aux_loss = c.aux_loss_coeff > 0;        // router.py is_aux_loss_enabled: coeff > 0
  m.z_loss = c.z_loss_coeff.has_value();    // apply_z_loss: moe_z_loss_coeff is not None
  // TEGroupedMLP: TE's grouped-GEMM workspace per stream, 32 MiB + 1024 on sm_90+ (whose
  // presets carry PyTorch's 32 MiB cuBLAS workspace), else 4 MiB.
  m.grouped_gemm = c.grouped_gemm;
  m.te_workspace = s.device.cublas_workspace >= 32ull * 1024 * 1024 ? 32ull * 1024 * 1024 + 1024 : 4194304;
  return m;
}

int64_t expert_data_parallel(const Scenario& s) {
  return s.parallel.data * s.parallel.tensor / (s.megatron_moe.expert * s.megatron_moe.expert_tensor);
}

MegatronMoeNumel megatron_moe_numel(const graph::Runtime& rt, uint64_t elem,
                                    const std::vector<int32_t>& ids, const std::vector<bool>& expert) {
  MegatronMoeNumel n;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t k = rt.parameters()[static_cast<size_t>(ids[i])].bytes / elem;
    (i < expert.size() && expert[i] ? n.expert : n.dense) += k;
  }
  return n;
}

std::vector<uint64_t> megatron_moe_owned_numel(const graph::Runtime& rt, uint64_t elem,
                                               const std::vector<int32_t>& ids,
                                               const std::vector<bool>& expert, int64_t data,
                                               int64_t edp) {
  std::vector<uint64_t> owned(rt.parameters().size(), 0);
  for (int pass = 0; pass < 2; ++pass) {  // dense, then expert
    std::vector<int32_t> group;
    std::vector<uint64_t> numel;
    for (size_t i = 0; i < ids.size(); ++i) {
      if ((i < expert.size() && expert[i]) != (pass == 1)) continue;
      group.push_back(ids[i]);
      numel.push_back(rt.parameters()[static_cast<size_t>(ids[i])].bytes / elem);
    }
    if (group.empty()) continue;
    const std::vector<uint64_t> shard = megatron_shard_numel(numel, pass == 0 ? data : edp, 0);
    for (size_t k = 0; k < group.size(); ++k) owned[static_cast<size_t>(group[k])] = shard[k];
  }
  return owned;
}

}  // namespace memsim
