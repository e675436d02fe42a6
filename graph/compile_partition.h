// The AOTAutograd min-cut partitioner (torch.compile's default partition_fn) as a pure
// function over a small graph of tensors: which forward values the compiled forward
// returns for the backward (saved) and which the backward recomputes.
//
// Modelled from torch/_functorch/partitioners.py, min_cut_rematerialization_partition,
// solve_min_cut and choose_saved_values_set, at pytorch/pytorch commit c28ba8e5 (2.5 era),
// with config.py's defaults of that era (max_dist_from_bw 1000, every ban_recompute_*
// True, activation_memory_budget 1.0); and, for the CPU fixtures, the same function in
// torch 1.13 (functorch/_src/partitioners.py, compiler="inductor"). docs/compile.md.
//
// The graph: one vertex per tensor value (a storage: views are the same vertex, as
// `recompute_views` makes views free), in forward order, each with the vertices its
// producing op read. A vertex is needed by the backward when a backward formula reads it
// (what eager autograd saves). The max-flow graph is torch's: source -> every primal and
// every banned vertex's `_in`; `_in` -> `_out` with the vertex's weight; `_out` -> each
// user's `_in` (inf); `_out` -> sink for a value the backward reads. The cut vertices
// are the saved values. Weights: bytes * 1.1^clamp(dist_from_bw, 1, 100), doubled when
// every user (forward and backward) is fusible with it (the value is not materialised).
// Bans (source edge): primals; ops outside the recomputable allowlist (matmuls, SDPA,
// dropout, the rest); values that some non-fusible backward op reads (materialised in
// the backward anyway); reductions whose output is under a quarter of their inputs.
//
// Not modelled (stated in docs/compile.md): the "used far apart" and "long fusible
// chain" bans (both need forward order distances of fusible chains across > 100 ops),
// CSE, symbolic sizes, user checkpoint tags (MUST_SAVE / MUST_RECOMPUTE), collectives.
// The memory budget (choose_saved_values_set; read again in the installed torch 2.11.0
// partitioners.py, issue #16): the fraction of (saved bytes of the runtime-optimal cut -
// bytes of all primals) that the saved set may keep above the primals; tried in turn: the
// "more aggressive" cut, the "aggressive" cut, then a 0-1 knapsack over the aggressive
// cut's banned values that the backward needs (dist_from_bw < 1e9: a value that reaches
// only the forward's outputs, such as the logits, is no item) and that are not primals,
// solved by torch's default solver, dp_knapsack (torch/_functorch/_activation_checkpointing/
// knapsack.py at pytorch/pytorch 02d92aac: memories quantised to 1/10000, float32 table);
// runtimes are the ops' FLOPs (the "flops" estimator; non-matmuls count 1). The items it does not keep may be recomputed in the last cut.
#pragma once

#include <cstdint>
#include <vector>

namespace memsim::graph {

// What produced a vertex, as the partitioner's op lists classify it.
enum class PartClass : uint8_t {
  primal,        // a graph input (activation, parameter, ids): never recomputed
  compute,       // compute_intensive_ops: mm, bmm, addmm, SDPA flash/efficient
  random,        // random_ops: native_dropout (its mask is not regenerated)
  recomputable,  // the allowlist: pointwise, views, reductions, index, _to_copy, factories
  other,         // anything else: banned when the allowlist ban is on, not fusible
};
inline bool part_fusible(PartClass c) {
  return c == PartClass::recomputable || c == PartClass::random;
}

struct PartVertex {
  uint64_t bytes = 0;
  PartClass cls = PartClass::other;
  std::vector<uint32_t> inputs;  // earlier vertices the producing op read
  bool needed_by_backward = false;
  bool backward_fusible = true;  // every backward reader is a fusible (pointwise) op
  bool output = false;           // a forward output (alive after the compiled forward)
  double runtime = 1;            // the knapsack's runtime estimate (FLOPs, at least 1)
  // torch 1.13 only: a forward reader takes it through a view missing from 1.13's
  // allowlist (nn.Linear's _reshape_alias, attention's transpose; Conv1D's x.view is
  // listed), so that view is banned there.
  bool read_through_unlisted_view_113 = false;
};

enum class PartitionerVersion : uint8_t {
  torch25,        // choose_saved_values_set at c28ba8e5 (the model's default)
  // functorch 1.13, compiler="inductor" (the CPU fixtures): its allowlist, dist > 4
  // banned, no materialised-backward rule, PartVertex::read_through_unlisted_view_113.
  torch113_inductor,
};

struct PartitionResult {
  std::vector<uint8_t> saved;   // per vertex: 1 = a saved value (cut vertex)
  std::vector<uint8_t> banned;  // per vertex: banned from recomputation by the last solve
  std::vector<uint32_t> dist_from_bw;
};

// The saved set for `budget` in [0, 1] (activation_memory_budget; torch25 only).
PartitionResult partition(const std::vector<PartVertex>& g, double budget,
                          PartitionerVersion version = PartitionerVersion::torch25);

}  // namespace memsim::graph
