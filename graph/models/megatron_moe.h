// How many tokens each piece of a Megatron-Core MoE layer holds on this rank (family
// megatron, graph/models/megatron_moe.cpp; docs/moe-megatron.md): the routing assumption
// (graph/models/moe_routing.h) applied to this rank's tokens, then Megatron's capacity rule.
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
//  - get_capacity (moe_utils.py): capacity = ceil((tokens * top_k / experts) * factor),
//    computed from the router's own (sequence-parallel shard of) tokens;
//  - apply_router_token_dropping: an expert keeps min(routed, capacity) of this rank's
//    tokens; with pad_to_capacity every expert gets exactly `capacity` (all `tokens` when
//    capacity exceeds them: the capacity mask is then all ones);
//  - the dispatchers: every rank of the expert-parallel group is assumed to route its own
//    tokens the same way, so a local expert receives EP times what this rank sends it;
//    rank 0 (experts 0 .. E/EP - 1) is the one modelled, which for worst-case routing is the
//    rank that receives every token. With expert tensor parallelism (ETP > 1) the ETP ranks
//    of an expert all process every row any of them received (token_dispatcher.py: the
//    allgather dispatcher gathers over the ETP x EP group, alltoall all-gathers over ETP
//    after its EP all-to-all), so a local expert processes EP x ETP times this rank's rows.
// Contract: tokens > 0; fields as documented below; throws std::invalid_argument like
// routed_tokens for bad counts.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/models/megatron.h"

namespace memsim::graph {

int64_t megatron_moe_capacity(int64_t tokens, int64_t top_k, int64_t experts, double factor);

struct MegatronMoeTokens {
  int64_t tokens = 0;         // T: this rank's tokens entering the router (s*b/t with SP)
  int64_t capacity = 0;       // per expert (0: dropless)
  std::vector<int64_t> kept;  // per expert: this rank's tokens it gets after dropping/padding
  int64_t sent = 0;           // sum of kept: rows this rank permutes (alltoall num_out_tokens)
  int64_t gathered = 0;       // allgather: tokens after the all-gather over ETP x EP (T * EP * ETP)
  int64_t received = 0;       // alltoall: rows after the EP all-to-all, EP * sum_{j < E/EP} kept[j]
  int64_t local = 0;          // rows this rank's experts process: ETP * received
};
MegatronMoeTokens megatron_moe_tokens(const MegatronMoeShape& m, int64_t tokens, int64_t moe_layer);

}  // namespace memsim::graph
